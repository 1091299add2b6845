//! The gRPC port's accepted connections under the same bounds as every HTTP port
//! (`teifleet_runtime::http_server`): one past the cap is closed as soon as it is accepted, and
//! counted, so a flood of idle connections costs a bounded amount of memory and the callers
//! already connected keep being served; and one that has not sent HTTP/2's preface within the
//! header timeout is closed, so silent connections cannot fill the cap for good. With TLS on,
//! the handshake counts against the same timeout, and handshakes run side by side, so a slow
//! one holds up no other connection.

use std::future::ready;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use futures::{Stream, StreamExt as _};
use teifleet_runtime::http_server::{Accepted, ConnectionCap, Refused};
use teifleet_runtime::tls::{self, ClientIdentity, MaybeTls, ServerTls};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::server::Connected;

use crate::door::ConnectionId;

/// Numbers accepted connections, for the lines at pools' doors (`crate::door`).
static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(0);

/// Connections from `accepted`, within `cap`, in TLS while `tls` says so, each numbered; each
/// turned away is told to `refused` with its reason.
pub fn bounded<S>(
    accepted: S,
    cap: ConnectionCap,
    max_connections: usize,
    tls: Arc<ServerTls>,
    refused: Refused,
) -> impl Stream<Item = Result<Connection, io::Error>>
where
    S: Stream<Item = Result<TcpStream, io::Error>>,
{
    accepted
        .filter_map(|accepted| {
            ready(match accepted {
                Ok(stream) => Some(stream),
                // Out of file descriptors and the like: the next accept may succeed.
                Err(error) => {
                    tracing::warn!(%error, "accepting a connection failed");
                    None
                }
            })
        })
        .filter_map(move |stream| ready(cap.place().map(|place| (place, stream))))
        .map(move |(place, stream)| {
            let (tls, refused) = (tls.clone(), refused.clone());
            async move {
                match tls::accept(&tls, stream, place.deadline()).await {
                    Ok(stream) => {
                        let id = ConnectionId(NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed));
                        Some(Ok(Connection { io: place.hold(stream), id }))
                    }
                    Err(reason) => {
                        refused(reason);
                        None
                    }
                }
            }
        })
        // Never full: the cap holds fewer connections than this.
        .buffer_unordered(max_connections.max(1))
        .filter_map(ready)
}

/// An accepted gRPC connection and its number.
pub struct Connection {
    io: Accepted<MaybeTls<TcpStream>>,
    id: ConnectionId,
}

/// What tonic puts in every request of a connection: who the client proved to be (mutual TLS)
/// and which connection it is.
#[derive(Clone)]
pub struct ConnectionInfo {
    pub client: Option<ClientIdentity>,
    pub id: ConnectionId,
}

impl ConnectionInfo {
    pub fn of(extensions: &http::Extensions) -> Option<&Self> {
        extensions.get::<Self>()
    }
}

impl Connected for Connection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        ConnectionInfo { client: self.io.connect_info(), id: self.id }
    }
}

impl AsyncRead for Connection {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
