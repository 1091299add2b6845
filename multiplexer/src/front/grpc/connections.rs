//! The gRPC port's accepted connections under the same bounds as every HTTP port
//! (`teifleet_runtime::http_server`): one past the cap, or past its client address's share of
//! it, is closed as soon as it is accepted, and counted, so a flood of idle connections costs a bounded amount of memory and the callers
//! already connected keep being served; and one that has not sent HTTP/2's preface within the
//! header timeout is closed, so silent connections cannot fill the cap for good. With TLS on,
//! the handshake counts against the same timeout, and handshakes run side by side, so a slow
//! one holds up no other connection.

use std::future::ready;
use std::io;
use std::sync::Arc;

use futures::{Stream, StreamExt as _};
use teifleet_runtime::http_server::{Accepted, ConnectionCap, Refused};
use teifleet_runtime::tls::{self, ClientIdentity, MaybeTls, ServerTls};
use tokio::net::TcpStream;

/// What tonic puts in every request of a gRPC connection: its number (for the lines at pools'
/// doors, `crate::gate::door`) and, under mutual TLS, who the client proved to be.
pub type ConnectionInfo = teifleet_runtime::http_server::ConnectionInfo<Option<ClientIdentity>>;

/// Connections from `accepted`, within `cap`, in TLS while `tls` says so; each turned away is
/// told to `refused` with its reason.
pub fn bounded<S>(
    accepted: S,
    cap: ConnectionCap,
    max_connections: usize,
    tls: Arc<ServerTls>,
    refused: Refused,
) -> impl Stream<Item = Result<Accepted<MaybeTls<TcpStream>>, io::Error>>
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
        .filter_map(move |stream| {
            let peer = stream.peer_addr().ok().map(|address| address.ip());
            ready(cap.place(peer).map(|place| (place, stream)))
        })
        .map(move |(place, stream)| {
            let (tls, refused) = (tls.clone(), refused.clone());
            async move {
                match tls::accept(&tls, stream, place.deadline()).await {
                    Ok(stream) => Some(Ok(place.hold(stream))),
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
