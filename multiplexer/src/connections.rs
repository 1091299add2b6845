//! The gRPC port's accepted connections under the same bounds as every HTTP port
//! (`teifleet_runtime::http_server`): one past the cap is closed as soon as it is accepted, and
//! counted, so a flood of idle connections costs a bounded amount of memory and the callers
//! already connected keep being served; and one that has not sent HTTP/2's preface within the
//! header timeout is closed, so silent connections cannot fill the cap for good.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures::{Stream, StreamExt as _};
use teifleet_runtime::http_server::{Accepted, ConnectionCap};

/// Accepted connections, within `cap`.
pub struct Capped<S> {
    accepted: S,
    cap: ConnectionCap,
}

impl<S> Capped<S> {
    pub fn new(accepted: S, cap: ConnectionCap) -> Self {
        Self { accepted, cap }
    }
}

impl<S, Io, E> Stream for Capped<S>
where
    S: Stream<Item = Result<Io, E>> + Unpin,
{
    type Item = Result<Accepted<Io>, E>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            let io = match ready!(self.accepted.poll_next_unpin(cx)) {
                Some(Ok(io)) => io,
                Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                None => return Poll::Ready(None),
            };
            if let Some(accepted) = self.cap.admit(io) {
                return Poll::Ready(Some(Ok(accepted)));
            }
        }
    }
}
