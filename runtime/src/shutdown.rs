//! The signal that asks a binary to stop: SIGTERM (what Kubernetes sends) or Ctrl-C.

use std::fmt;
use std::future::Future;

use crate::Error;

/// Which signal asked the process to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM: the kubelet, `kill`, a service manager.
    Terminate,
    /// SIGINT: Ctrl-C in a terminal.
    Interrupt,
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Terminate => "SIGTERM",
            Self::Interrupt => "SIGINT",
        })
    }
}

/// A future that resolves when SIGTERM or SIGINT arrives, saying which.
///
/// The handlers are installed by this call, not when the future is first polled: a signal that
/// arrives in between is kept for the future instead of killing the process, so call it early in
/// `main` and await it when ready to stop. Fails only if the handlers cannot be installed. Must be
/// called inside a Tokio runtime.
pub fn signal() -> Result<impl Future<Output = Signal> + Send + 'static, Error> {
    let handlers = Handlers::install()?;
    Ok(handlers.recv())
}

#[cfg(unix)]
struct Handlers {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

#[cfg(unix)]
impl Handlers {
    fn install() -> Result<Self, Error> {
        use tokio::signal::unix::{SignalKind, signal};
        let listen =
            |kind: SignalKind, which: Signal| signal(kind).map_err(|source| Error::Signal { signal: which, source });
        Ok(Self {
            terminate: listen(SignalKind::terminate(), Signal::Terminate)?,
            interrupt: listen(SignalKind::interrupt(), Signal::Interrupt)?,
        })
    }

    async fn recv(mut self) -> Signal {
        tokio::select! {
            Some(()) = self.terminate.recv() => Signal::Terminate,
            Some(()) = self.interrupt.recv() => Signal::Interrupt,
            // Both streams end only when the runtime shuts down, and then no signal can come.
            else => std::future::pending().await,
        }
    }
}

#[cfg(not(unix))]
struct Handlers;

#[cfg(not(unix))]
impl Handlers {
    fn install() -> Result<Self, Error> {
        Ok(Self)
    }

    async fn recv(self) -> Signal {
        match tokio::signal::ctrl_c().await {
            Ok(()) => Signal::Interrupt,
            Err(_) => std::future::pending().await,
        }
    }
}
