//! A kubelet device plugin that advertises fake GPUs: it registers a resource (`nvidia.com/gpu` by
//! default) with the kubelet over the device-plugin API v1beta1 and serves `ListAndWatch`,
//! `Allocate` and the rest on a Unix socket in the kubelet's device-plugin directory, as NVIDIA's
//! plugin does on a GPU node. The kubelet then counts, admits and allocates those devices itself,
//! so the local cluster's real node schedules GPU pods with Kubernetes' own accounting.
//!
//! [`run`] serves until its shutdown future completes, and serves and registers again when the
//! kubelet restarts (a restarted kubelet removes every plugin socket and forgets its plugins).
#![forbid(unsafe_code)]

use std::future::Future;
use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;

mod connect;
mod service;

pub use connect::unix_channel;
pub use service::FakeGpus;

/// Generated code for the kubelet's device-plugin API (package `v1beta1`).
#[allow(clippy::all, clippy::pedantic, rust_2018_idioms, missing_docs)]
pub mod api {
    tonic::include_proto!("v1beta1");
}

/// The API version this plugin speaks, sent in its registration.
pub const API_VERSION: &str = "v1beta1";
/// The kubelet's registration socket, in the device-plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// Where the kubelet looks for device plugins (whatever its `--root-dir`).
pub const DEFAULT_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";
/// The resource NVIDIA's device plugin advertises.
pub const DEFAULT_RESOURCE: &str = "nvidia.com/gpu";
/// A device's health as the kubelet spells it.
pub const HEALTHY: &str = "Healthy";
/// The variable NVIDIA's runtime reads to expose GPUs to a container; set by `Allocate`.
pub const VISIBLE_DEVICES_ENV: &str = "NVIDIA_VISIBLE_DEVICES";
/// Separates a GPU's ID from its replica number in the IDs of a shared GPU's replicas
/// (`fake-gpu-0::3`), as NVIDIA's plugin writes them under time-slicing and MPS.
pub const REPLICA_SEPARATOR: &str = "::";

/// What can stop the plugin.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration cannot work (no devices, a bad resource or socket name).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A file operation on a socket failed.
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The gRPC server on the plugin's socket stopped with an error.
    #[error("the device plugin server on {path} failed: {source}")]
    Serve {
        path: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    /// The kubelet answered the registration with an error (an API version it does not support,
    /// a resource name another plugin holds): the API says a plugin then stops.
    #[error("the kubelet refused to register {resource}: {status}")]
    Refused { resource: String, status: tonic::Status },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the plugin advertises, and where.
#[derive(Clone, Debug)]
pub struct Config {
    /// The extended resource, e.g. `nvidia.com/gpu`.
    pub resource_name: String,
    /// The devices' IDs, all healthy.
    pub device_ids: Vec<String>,
    /// The kubelet's device-plugin directory, holding `kubelet.sock` and the plugin's socket.
    pub plugin_dir: PathBuf,
    /// The plugin's socket file name in `plugin_dir`.
    pub socket_name: String,
    /// How often the plugin checks that the kubelet still has it (its socket and the kubelet's are
    /// the ones it registered with), and retries a registration the kubelet was not there for.
    pub check_interval: Duration,
}

impl Config {
    /// `count` devices named `<id_prefix>-0`, `<id_prefix>-1`, ...
    pub fn new(resource_name: &str, count: usize, id_prefix: &str, plugin_dir: &Path, socket_name: &str) -> Self {
        Self::shared(resource_name, count, 1, id_prefix, plugin_dir, socket_name)
    }

    /// `count` GPUs each advertised as `replicas` devices, as NVIDIA's plugin shares a GPU by
    /// time-slicing or MPS: `<id_prefix>-0::0` ... `<id_prefix>-0::<replicas-1>`, then the next
    /// GPU's. `Allocate` tells a container the GPUs behind its replicas, so pods given replicas
    /// of one GPU see the same device. One replica each is the plain `<id_prefix>-<n>`.
    pub fn shared(
        resource_name: &str,
        count: usize,
        replicas: usize,
        id_prefix: &str,
        plugin_dir: &Path,
        socket_name: &str,
    ) -> Self {
        let gpus = (0..count).map(|gpu| format!("{id_prefix}-{gpu}"));
        let device_ids = match replicas {
            0 => Vec::new(),
            1 => gpus.collect(),
            _ => gpus.flat_map(|gpu| (0..replicas).map(move |r| format!("{gpu}{REPLICA_SEPARATOR}{r}"))).collect(),
        };
        Self {
            resource_name: resource_name.to_owned(),
            device_ids,
            plugin_dir: plugin_dir.to_owned(),
            socket_name: socket_name.to_owned(),
            check_interval: Duration::from_secs(1),
        }
    }

    /// The plugin's socket.
    pub fn socket_path(&self) -> PathBuf {
        self.plugin_dir.join(&self.socket_name)
    }

    /// The kubelet's registration socket.
    pub fn kubelet_socket_path(&self) -> PathBuf {
        self.plugin_dir.join(KUBELET_SOCKET)
    }

    fn validate(&self) -> Result<()> {
        let (domain, name) = self
            .resource_name
            .split_once('/')
            .ok_or_else(|| Error::Config(format!("resource {:?} is not <domain>/<name>", self.resource_name)))?;
        if domain.is_empty() || name.is_empty() || domain.ends_with("kubernetes.io") {
            return Err(Error::Config(format!("resource {:?} is not an extended resource name", self.resource_name)));
        }
        if self.device_ids.is_empty() {
            return Err(Error::Config("no devices to advertise".into()));
        }
        if let Some(id) = self.device_ids.iter().find(|id| id.is_empty() || id.len() > 63) {
            return Err(Error::Config(format!("device ID {id:?} must be 1 to 63 characters")));
        }
        if self.socket_name.is_empty() || self.socket_name.contains('/') || self.socket_name == KUBELET_SOCKET {
            return Err(Error::Config(format!(
                "socket name {:?} must be a file name other than {KUBELET_SOCKET}",
                self.socket_name
            )));
        }
        Ok(())
    }
}

/// Serves the plugin and keeps it registered with the kubelet until `shutdown` completes; then
/// ends every `ListAndWatch` stream, stops the server and removes the socket.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<()> {
    config.validate()?;
    tokio::pin!(shutdown);
    loop {
        let session = Session::start(&config)?;
        let registered = tokio::select! {
            () = &mut shutdown => None,
            result = register_when_ready(&config) => Some(result),
        };
        let outcome = match registered {
            None => Outcome::Shutdown,
            Some(Err(error)) => Outcome::Failed(error),
            Some(Ok(kubelet)) => {
                tracing::info!(
                    resource = %config.resource_name,
                    devices = config.device_ids.len(),
                    socket = %session.socket.display(),
                    "registered with the kubelet"
                );
                tokio::select! {
                    () = &mut shutdown => Outcome::Shutdown,
                    why = session.lost(&config, kubelet) => Outcome::Lost(why),
                }
            }
        };
        let served = session.stop().await;
        match outcome {
            Outcome::Shutdown => {
                tracing::info!("stopped");
                return served;
            }
            Outcome::Failed(error) => return Err(error),
            Outcome::Lost(why) => {
                served?;
                tracing::warn!(%why, "the kubelet no longer has this plugin; serving and registering again");
            }
        }
    }
}

enum Outcome {
    Shutdown,
    Failed(Error),
    Lost(&'static str),
}

/// How long a stopping server waits for clients to close their connections.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// One server on a fresh socket, for one registration.
struct Session {
    socket: PathBuf,
    identity: Identity,
    stop: CancellationToken,
    server: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Session {
    fn start(config: &Config) -> Result<Self> {
        let socket = config.socket_path();
        remove_socket(&socket)?;
        let listener = UnixListener::bind(&socket).map_err(|source| Error::Io {
            action: "listen on",
            path: socket.clone(),
            source,
        })?;
        let identity =
            identity(&socket).map_err(|source| Error::Io { action: "stat", path: socket.clone(), source })?;
        let stop = CancellationToken::new();
        let service = FakeGpus::new(&config.resource_name, config.device_ids.clone(), stop.clone());
        let router = tonic::transport::Server::builder()
            .add_service(api::device_plugin_server::DevicePluginServer::new(service));
        let server = tokio::spawn(
            router.serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop.clone().cancelled_owned()),
        );
        Ok(Self { socket, identity, stop, server })
    }

    /// Completes when the kubelet has dropped this registration: the plugin's socket was removed
    /// or replaced (a restarting kubelet clears the directory), or the kubelet's socket was.
    async fn lost(&self, config: &Config, registered_through: Identity) -> &'static str {
        let kubelet = config.kubelet_socket_path();
        loop {
            tokio::time::sleep(config.check_interval).await;
            if identity(&self.socket).ok() != Some(self.identity) {
                return "its socket was removed";
            }
            if identity(&kubelet).ok() != Some(registered_through) {
                return "the kubelet's socket changed (the kubelet restarted)";
            }
            if self.server.is_finished() {
                return "its server stopped";
            }
        }
    }

    /// Ends the streams, stops the server (abandoning connections a client keeps open past
    /// [`STOP_GRACE`]) and removes the socket if it is still this session's.
    async fn stop(mut self) -> Result<()> {
        self.stop.cancel();
        let served = match tokio::time::timeout(STOP_GRACE, &mut self.server).await {
            Ok(Ok(result)) => result.map_err(|source| Error::Serve { path: self.socket.clone(), source }),
            Ok(Err(join)) => {
                Err(Error::Io { action: "serve on", path: self.socket.clone(), source: io::Error::other(join) })
            }
            Err(_) => {
                self.server.abort();
                tracing::warn!("a client kept its connection open past the stop grace; closed it");
                Ok(())
            }
        };
        if identity(&self.socket).ok() == Some(self.identity) {
            remove_socket(&self.socket)?;
        }
        served
    }
}

/// Registers with the kubelet, waiting for its socket to appear and retrying while it does not
/// answer; returns which kubelet socket it registered through.
async fn register_when_ready(config: &Config) -> Result<Identity> {
    let kubelet = config.kubelet_socket_path();
    let mut waiting_logged = false;
    loop {
        match register_once(config, &kubelet).await {
            Ok(kubelet) => return Ok(kubelet),
            Err(Attempt::Refused(status)) => {
                return Err(Error::Refused { resource: config.resource_name.clone(), status });
            }
            Err(Attempt::NotThere(why)) => {
                if !waiting_logged {
                    tracing::info!(socket = %kubelet.display(), %why, "waiting for the kubelet");
                    waiting_logged = true;
                }
                tokio::time::sleep(config.check_interval).await;
            }
        }
    }
}

enum Attempt {
    /// The kubelet is not listening (yet): try again.
    NotThere(String),
    /// The kubelet answered with an error.
    Refused(tonic::Status),
}

async fn register_once(config: &Config, kubelet: &Path) -> Result<Identity, Attempt> {
    let kubelet_identity = identity(kubelet).map_err(|error| Attempt::NotThere(error.to_string()))?;
    let channel = unix_channel(kubelet).await.map_err(|error| Attempt::NotThere(error.to_string()))?;
    let mut client = api::registration_client::RegistrationClient::new(channel);
    let request = api::RegisterRequest {
        version: API_VERSION.to_owned(),
        endpoint: config.socket_name.clone(),
        resource_name: config.resource_name.clone(),
        options: Some(service::OPTIONS),
    };
    match client.register(request).await {
        Ok(_) => Ok(kubelet_identity),
        // The socket was there but nobody answered: a kubelet starting or stopping.
        Err(status) if status.code() == tonic::Code::Unavailable => Err(Attempt::NotThere(status.to_string())),
        Err(status) => Err(Attempt::Refused(status)),
    }
}

/// Which file a socket path names right now. The inode number alone is not enough: a
/// filesystem such as ext4 gives a file created right after another is removed the freed inode
/// number, so a kubelet that restarts and binds `kubelet.sock` again would look unchanged (and
/// the plugin would never register with it). The change time tells the new file apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Identity {
    inode: u64,
    changed: (i64, i64),
}

fn identity(path: &Path) -> io::Result<Identity> {
    std::fs::metadata(path).map(|m| Identity { inode: m.ino(), changed: (m.ctime(), m.ctime_nsec()) })
}

fn remove_socket(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(Error::Io { action: "remove", path: path.to_owned(), source }),
    }
}
