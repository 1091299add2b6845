//! SeaweedFS on loopback: `weed server` with its filer and S3 gateway, the real S3-compatible store
//! the embedding-job tests write to and read from (`tools/seaweedfs.sh` builds `weed` once per
//! version; `make` passes its path in `TEIFLEET_WEED_BIN`).
//!
//! Each of weed's four servers (master, volume, filer, S3) also listens for gRPC on its port +
//! 10000, so every port is picked with that one free too. Buckets are made through the filer
//! (`/buckets/<name>/`), which is what SeaweedFS's S3 gateway lists as buckets.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::net::loopback;
use crate::process::ChildGuard;
use crate::{Error, Result};

/// The environment variable naming the `weed` binary.
pub const WEED_BIN_ENV: &str = "TEIFLEET_WEED_BIN";
/// The S3 credentials the store accepts (an identity with every action).
pub const ACCESS_KEY: &str = "teifleet-test-access";
pub const SECRET_KEY: &str = "teifleet-test-secret-key";
/// How far above each server's port weed puts its gRPC port.
const GRPC_OFFSET: u16 = 10_000;
/// How many times weed is started on freshly picked ports when one was taken before it bound it.
const START_ATTEMPTS: u32 = 3;
/// How long weed gets to come up (its servers find each other in a few seconds).
const READY_WITHIN: Duration = Duration::from_secs(60);

/// A running SeaweedFS, stopped (and its data left in `dir`) when dropped.
#[derive(Debug)]
pub struct SeaweedFs {
    _weed: ChildGuard,
    /// The S3 gateway.
    pub s3: SocketAddr,
    /// The filer's HTTP API.
    pub filer: SocketAddr,
}

impl SeaweedFs {
    /// `weed`'s path from [`WEED_BIN_ENV`], if set.
    pub fn bin() -> Option<PathBuf> {
        std::env::var_os(WEED_BIN_ENV).map(PathBuf::from).filter(|path| path.is_file())
    }

    /// Starts `weed` with its data under `dir` and waits until its S3 gateway answers.
    pub async fn start(bin: &Path, dir: &Path) -> Result<Self> {
        let file_error = |source| Error::File { path: dir.to_owned(), source };
        std::fs::create_dir_all(dir.join("data")).map_err(file_error)?;
        let config = dir.join("s3.json");
        let identities = format!(
            r#"{{"identities":[{{"name":"teifleet","credentials":[{{"accessKey":"{ACCESS_KEY}","secretKey":"{SECRET_KEY}"}}],"actions":["Admin","Read","Write","List","Tagging"]}}]}}"#
        );
        std::fs::write(&config, identities).map_err(|source| Error::File { path: config.clone(), source })?;
        // weed cannot bind port 0 and say which it got: its ports are picked here, and one can be
        // taken before weed binds it (it then exits, "address already in use"); it starts again
        // on others, its data afresh (the master keeps its peers' addresses there).
        let mut attempt = 1;
        loop {
            match Self::start_on(bin, dir, &config, ports_with_grpc()?).await {
                Err(Error::Exited { log: Some(log), .. })
                    if attempt < START_ATTEMPTS
                        && std::fs::read_to_string(&log).is_ok_and(|text| text.contains("address already in use")) =>
                {
                    attempt += 1;
                    let data = dir.join("data");
                    std::fs::remove_dir_all(&data).map_err(file_error)?;
                    std::fs::create_dir_all(&data).map_err(file_error)?;
                }
                started => return started,
            }
        }
    }

    async fn start_on(bin: &Path, dir: &Path, config: &Path, [master, volume, filer, s3]: [u16; 4]) -> Result<Self> {
        let mut command = Command::new(bin);
        command
            .current_dir(dir)
            .args(["server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-volume.max=8", "-filer", "-s3"])
            .arg(format!("-dir={}", dir.join("data").display()))
            .arg(format!("-master.port={master}"))
            .arg(format!("-volume.port={volume}"))
            .arg(format!("-filer.port={filer}"))
            .arg(format!("-s3.port={s3}"))
            .arg(format!("-s3.config={}", config.display()))
            // Its Iceberg and Lance servers listen on fixed ports (8181, 9101) by default: two
            // servers at once (two tests, or the tests beside tests/clients/run.sh's) would clash.
            .args(["-s3.port.iceberg=0", "-s3.port.lance=0"]);
        let mut weed = ChildGuard::spawn_logged("weed", command, dir.join("weed.log"))?;
        let (s3, filer, master) = (loopback(s3), loopback(filer), loopback(master));
        // Unsigned, the gateway answers 403: it is up. The filer must be up too, for buckets, and
        // a volume server must have joined the master: the gateway and the filer answer seconds
        // before it does, and a write in between waits for a volume until the client times out.
        weed.wait_ready(READY_WITHIN, || async move {
            let gateway = crate::http::request(s3, "GET", "/").await.is_some();
            gateway && crate::http::request(filer, "GET", "/").await.is_some() && has_volume_server(master).await
        })
        .await?;
        Ok(Self { _weed: weed, s3, filer })
    }

    /// The S3 endpoint, as clients configure it.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.s3)
    }

    /// Makes the bucket `name` (through the filer).
    pub async fn create_bucket(&self, name: &str) -> Result<()> {
        let answer = crate::http::request(self.filer, "POST", &format!("/buckets/{name}/?op=mkdir")).await;
        match answer {
            Some(response) if (200..300).contains(&response.status) => Ok(()),
            other => Err(Error::Refused { what: format!("making bucket {name}"), answer: format!("{other:?}") }),
        }
    }
}

/// Whether the master's topology lists a volume server (`/dir/status`: `"DataNodes":[{...}]`).
async fn has_volume_server(master: SocketAddr) -> bool {
    crate::http::request(master, "GET", "/dir/status")
        .await
        .is_some_and(|answer| answer.body.contains(r#""DataNodes":[{"#))
}

/// Four loopback ports, each free with its port + [`GRPC_OFFSET`] free too.
fn ports_with_grpc() -> Result<[u16; 4]> {
    let mut ports = Vec::with_capacity(4);
    while ports.len() < 4 {
        let port = crate::net::free_port()?;
        let Some(grpc) = port.checked_add(GRPC_OFFSET) else { continue };
        if ports.contains(&port) || ports.iter().any(|p| p + GRPC_OFFSET == port || *p == grpc) {
            continue;
        }
        if std::net::TcpListener::bind(loopback(grpc)).is_ok() {
            ports.push(port);
        }
    }
    Ok([ports[0], ports[1], ports[2], ports[3]])
}
