//! `static` and `file` modes: the certificate set from PEM files (`--tls-cert`, `--tls-key`,
//! `--tls-ca`, `--tls-client-ca`), re-read every second, so replacing the files (as a mounted
//! Secret's are replaced) rotates the certificate with no restart.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use teifleet_runtime::tls::Material;
use tokio_util::sync::CancellationToken;

use crate::transport::tls::{Certificates, Offered as _};
use crate::vocab::SetupError;

/// Where the certificate set's files are; TLS is off without `--tls-cert`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct TlsFiles {
    /// PEM certificate chain, leaf first: the gRPC and HTTP ports serve TLS with it (ALPN h2 and
    /// http/1.1). Re-read every second.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA bundle trusted when calling `https://` siblings and pools (default: the system's
    /// roots).
    #[arg(long, requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
    /// PEM CA bundle of client certificates: mutual TLS, and the certificate names the tenant.
    #[arg(long, requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// Calls that came in TLS may be routed to pools whose upstream is `http://` (another
    /// multiplexer in plain text); without it they are refused with FAILED_PRECONDITION.
    #[arg(long, requires = "tls_cert")]
    pub allow_plaintext_routes: bool,
}

impl TlsFiles {
    pub fn enabled(&self) -> bool {
        self.tls_cert.is_some()
    }

    fn read(&self) -> Result<Material, String> {
        let read = |path: &PathBuf| std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()));
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else {
            return Err("--tls-cert and --tls-key go together".into());
        };
        Ok(Material {
            chain: read(cert)?,
            key: read(key)?,
            ca: self.tls_ca.as_ref().map(read).transpose()?,
            client_ca: self.tls_client_ca.as_ref().map(read).transpose()?,
        })
    }

    fn describe(&self) -> String {
        self.tls_cert.as_ref().map(|path| path.display().to_string()).unwrap_or_default()
    }

    /// Puts the files' set in force now: a start with TLS asked for and no valid set fails.
    pub fn load(&self, certificates: &Certificates) -> Result<Material, SetupError> {
        let material = self.read().map_err(SetupError::Config)?;
        certificates.offer(&material, &self.describe());
        match certificates.tls().report().and_then(|report| report.error) {
            Some(error) => Err(SetupError::Config(format!("TLS: {error}"))),
            None => Ok(material),
        }
    }

    /// Re-reads the files every `interval` until `stop`, offering the set whenever it changed.
    pub async fn watch(
        self,
        mut last: Material,
        certificates: Arc<Certificates>,
        interval: Duration,
        stop: CancellationToken,
    ) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(interval) => {}
            }
            match self.read() {
                Ok(material) if material == last => {}
                Ok(material) => {
                    certificates.offer(&material, &self.describe());
                    last = material;
                }
                // Mid-replacement, or gone: what is in force stays.
                Err(error) => tracing::debug!(%error, "TLS files not readable; keeping the set in force"),
            }
        }
    }
}
