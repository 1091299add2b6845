//! A cap on the connections the gRPC port keeps open: one past the cap is closed as soon as it
//! is accepted, and counted, so a flood of idle connections costs a bounded amount of memory and
//! the callers already connected keep being served; and one that has not sent HTTP/2's preface
//! within the header timeout is closed, so silent connections cannot fill the cap for good. (The
//! HTTP and admin ports get the same bounds from `teifleet_runtime::http_server`.)

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use teifleet_runtime::http_server::{ProtocolDeadline, REFUSED_CONNECTION_LIMIT};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::Connected;

type Refused = Box<dyn Fn(&'static str) + Send + Sync>;

/// Accepted connections, at most `max` open at once, each given `preface_within` to send HTTP/2's
/// preface.
pub struct Capped<S> {
    accepted: S,
    open: Arc<Semaphore>,
    preface_within: Duration,
    refused: Refused,
}

impl<S> Capped<S> {
    pub fn new(
        accepted: S,
        max: usize,
        preface_within: Duration,
        refused: impl Fn(&'static str) + Send + Sync + 'static,
    ) -> Self {
        Self { accepted, open: Arc::new(Semaphore::new(max)), preface_within, refused: Box::new(refused) }
    }
}

impl<S, Io, E> Stream for Capped<S>
where
    S: Stream<Item = Result<Io, E>> + Unpin,
{
    type Item = Result<Counted<Io>, E>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            let io = match ready!(self.accepted.poll_next_unpin(cx)) {
                Some(Ok(io)) => io,
                Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                None => return Poll::Ready(None),
            };
            match self.open.clone().try_acquire_owned() {
                Ok(permit) => {
                    let io = ProtocolDeadline::new(io, self.preface_within);
                    return Poll::Ready(Some(Ok(Counted { io, _open: permit })));
                }
                Err(_) => {
                    (self.refused)(REFUSED_CONNECTION_LIMIT);
                    drop(io);
                }
            }
        }
    }
}

/// A connection that holds its place under the cap until it closes.
pub struct Counted<Io> {
    io: ProtocolDeadline<Io>,
    _open: OwnedSemaphorePermit,
}

impl<Io: Connected> Connected for Counted<Io> {
    type ConnectInfo = Io::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.get_ref().connect_info()
    }
}

impl<Io: AsyncRead + Unpin> AsyncRead for Counted<Io> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<Io: AsyncWrite + Unpin> AsyncWrite for Counted<Io> {
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
