//! The floors: the least one gRPC hop costs on this machine, on the Rust stack the multiplexer is
//! built on. The overhead and cost scenarios run them beside the multiplexer and HAProxy, so each
//! run shows how much of a hop is the stack's and how much is the multiplexer's own work.
//!
//! - [`Stack::Tonic`]: tonic's server and client over hyper and h2, as the multiplexer.
//! - [`Stack::H2`]: the `h2` crate alone, no hyper, no tonic, no tower: frames relayed as they
//!   come. What a data path written straight on `h2` could cost at best.
//! - [`Stack::Memo`]: tonic's server answering a call it has seen before from memory, the rest
//!   forwarded: the least an answer from a cache costs (the cache scenario's floor).

use std::net::SocketAddr;

use crate::{Error, Result};

pub mod h2;
pub mod memo;
pub mod tonic;

/// Which stack a floor proxy is built on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stack {
    Tonic,
    H2,
    Memo,
}

impl Stack {
    /// The floors of one hop (the overhead scenario runs each).
    pub const PROXIES: [Self; 2] = [Self::Tonic, Self::H2];

    /// The flag value that picks it.
    pub fn flag(self) -> &'static str {
        match self {
            Self::Tonic => "tonic",
            Self::H2 => "h2",
            Self::Memo => "memo",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Tonic => "floor (bare tonic proxy)",
            Self::H2 => "floor (bare h2 proxy)",
            Self::Memo => "floor (bare tonic memo)",
        }
    }
}

/// Connects to `upstream` (one HTTP/2 connection, TCP_NODELAY as the multiplexer's) and serves
/// on `listener` until the process ends.
pub async fn serve(stack: Stack, listener: tokio::net::TcpListener, upstream: &str) -> Result<()> {
    match stack {
        Stack::Tonic => tonic::serve(listener, upstream).await,
        Stack::H2 => h2::serve(listener, upstream).await,
        Stack::Memo => memo::serve(listener, upstream).await,
    }
}

/// Binds `addr` (port 0 for any) and serves in the background; returns the bound address.
pub async fn spawn(stack: Stack, addr: SocketAddr, upstream: &str) -> Result<SocketAddr> {
    let listener =
        tokio::net::TcpListener::bind(addr).await.map_err(|e| Error::Process(format!("binding {addr}: {e}")))?;
    let bound = listener.local_addr().map_err(|e| Error::Process(format!("bound address: {e}")))?;
    let upstream = upstream.to_owned();
    tokio::spawn(async move {
        if let Err(e) = serve(stack, listener, &upstream).await {
            eprintln!("teifleet-floor-proxy: {e}");
        }
    });
    Ok(bound)
}
