//! TLS on a server's ports, with certificates that change while it serves.
//!
//! A port's [`ServerTls`] is off (plain text), waiting (TLS asked for, nothing valid loaded yet:
//! every connection is closed, never served in the clear), or serving one [`Loaded`] set. A new
//! set is checked whole before it is put in force (the chain parses, the key is the
//! certificate's, the certificate is valid now, the client CA bundle parses); a set that fails
//! leaves the one before in force and says why. Each handshake takes the set in force when it
//! starts, so a rotation reaches new connections at once and open ones keep theirs.
//!
//! The same set makes the client side of calls between servers ([`ServerTls::client`]): it trusts
//! the set's CA bundle (the Secret's `ca.crt`; the system's roots without one) and presents the
//! set's own certificate, for peers that ask for one.
//!
//! A port that stands in for several servers (the activator, for every pool of its namespace)
//! picks the set by the name its client asked for ([`ServerTls::by_server_name`], SNI), and
//! serves a client that opens in plain text (its first byte is no TLS handshake record) in plain
//! text on the same port.

mod io;
mod material;

use std::sync::{Arc, PoisonError, RwLock};
use std::time::SystemTime;

pub use io::{ClientIdentity, MaybeTls, PeekFirst, accept, certificate_name};
pub use material::{CertificateInfo, Loaded, Material, TlsError, openssl_serial, serial_of};
use rustls::ClientConfig;

/// Why a connection was closed before its first request: the `reason` label of the refusal
/// counters, beside `http_server`'s.
pub const REFUSED_TLS_NOT_LOADED: &str = "tls_not_loaded";
/// The TLS handshake failed (a client without the CA, a plain-text client, a client certificate
/// not from the client CA, none where one is required) or did not finish within the deadline.
pub const REFUSED_TLS_HANDSHAKE: &str = "tls_handshake";

/// Why a connection opened in TLS was closed before its handshake: it asked for a server name
/// the port serves no certificate for (or for none at all), on a port that picks by name.
pub const REFUSED_TLS_UNKNOWN_NAME: &str = "tls_unknown_name";

/// The sets of a port that stands in for several servers, by the server name (SNI) a client asks
/// for.
pub trait ServerNames: Send + Sync + std::fmt::Debug {
    /// The set a handshake asking for `server_name` gets; none: the connection is closed.
    fn pick(&self, server_name: Option<&str>) -> Option<Arc<Loaded>>;
}

#[derive(Clone, Debug, Default)]
enum Mode {
    #[default]
    Off,
    Waiting,
    Serving(Arc<Loaded>),
    /// Plain text, or TLS with the set picked by the name the client asks for.
    ByName(Arc<dyn ServerNames>),
}

/// A port's TLS, changed live by whatever source follows its certificates.
#[derive(Debug, Default)]
pub struct ServerTls {
    mode: RwLock<Mode>,
    /// Why the last set offered was not put in force; cleared when one is.
    rejected: RwLock<Option<String>>,
}

/// What a port's TLS is doing, for status and logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The certificate new handshakes get; none while waiting.
    pub serving: Option<CertificateInfo>,
    pub client_auth: bool,
    /// Why the last set offered was refused.
    pub error: Option<String>,
    /// The certificate served has passed its `notAfter` since it was put in force: clients
    /// refuse it, so every handshake fails until a renewed set is offered.
    pub expired: bool,
}

impl ServerTls {
    /// Plain text until a source turns TLS on.
    pub fn off() -> Self {
        Self::default()
    }

    /// TLS asked for, nothing loaded: connections are closed until a valid set is offered.
    pub fn waiting() -> Self {
        let tls = Self::default();
        tls.wait();
        tls
    }

    fn set_mode(&self, mode: Mode) {
        *self.mode.write().unwrap_or_else(PoisonError::into_inner) = mode;
    }

    fn mode(&self) -> Mode {
        self.mode.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn set_rejected(&self, error: Option<String>) {
        *self.rejected.write().unwrap_or_else(PoisonError::into_inner) = error;
    }

    /// A port that stands in for several servers: a connection that opens with a TLS handshake
    /// gets the set `names` picks by the server name the client asks for (closed when it picks
    /// none); one that opens otherwise is served in plain text.
    pub fn by_server_name(names: Arc<dyn ServerNames>) -> Self {
        let tls = Self::default();
        tls.set_mode(Mode::ByName(names));
        tls
    }

    /// Back to plain text for new connections.
    pub fn turn_off(&self) {
        self.set_mode(Mode::Off);
        self.set_rejected(None);
    }

    /// TLS on, and nothing in force (its Secret is gone, or another one is named now): new
    /// connections are closed until a valid set is offered.
    pub fn wait(&self) {
        self.set_mode(Mode::Waiting);
    }

    /// Puts `material` in force for new handshakes if it is valid; otherwise keeps what is in
    /// force (waiting, if nothing is) and remembers why.
    pub fn offer(&self, material: &Material) -> Result<CertificateInfo, TlsError> {
        match Loaded::check(material) {
            Ok(loaded) => {
                let info = loaded.info().clone();
                self.set_mode(Mode::Serving(Arc::new(loaded)));
                self.set_rejected(None);
                Ok(info)
            }
            Err(error) => {
                if matches!(self.mode(), Mode::Off) {
                    self.wait();
                }
                self.set_rejected(Some(error.to_string()));
                Err(error)
            }
        }
    }

    /// Records why a set could not even be read (its Secret is missing, a file cannot be
    /// opened), as a refused one is.
    pub fn note_error(&self, why: String) {
        self.set_rejected(Some(why));
    }

    /// The set new handshakes use: `Ok(None)` in plain text, `Err` while waiting.
    pub fn in_force(&self) -> Result<Option<Arc<Loaded>>, &'static str> {
        match self.mode() {
            // By name: no one set; `accept` picks each connection's.
            Mode::Off | Mode::ByName(_) => Ok(None),
            Mode::Waiting => Err(REFUSED_TLS_NOT_LOADED),
            Mode::Serving(loaded) => Ok(Some(loaded)),
        }
    }

    /// The client side of calls to peers that serve TLS; none while nothing is in force.
    pub fn client(&self) -> Option<Arc<ClientConfig>> {
        match self.mode() {
            Mode::Serving(loaded) => Some(loaded.client_config()),
            Mode::Off | Mode::Waiting | Mode::ByName(_) => None,
        }
    }

    /// What is served and what went wrong; none in plain text. The certificate served is checked
    /// against the clock at each report.
    pub fn report(&self) -> Option<Report> {
        self.report_at(SystemTime::now())
    }

    /// [`Self::report`] as of `now`.
    pub fn report_at(&self, now: SystemTime) -> Option<Report> {
        let error = self.rejected.read().unwrap_or_else(PoisonError::into_inner).clone();
        match self.mode() {
            Mode::Off | Mode::ByName(_) => None,
            Mode::Waiting => Some(Report { serving: None, client_auth: false, error, expired: false }),
            Mode::Serving(loaded) => Some(Report {
                serving: Some(loaded.info().clone()),
                client_auth: loaded.client_auth(),
                error,
                expired: loaded.info().expired_at(now),
            }),
        }
    }
}

#[cfg(test)]
mod tests;
