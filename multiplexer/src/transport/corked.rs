//! A connection's writes held back while its task runs, and sent in one socket write when the
//! task has done what it can in that wake-up (as TCP_CORK does in the kernel, without its two
//! extra system calls per answer).
//!
//! Why: h2 hands a DATA frame's payload to the socket as it is instead of copying it into its
//! own buffer, and flushes before it writes any frame after one. A unary answer (headers and the
//! message, then `grpc-status` in the trailers) therefore went out in two writes: two system
//! calls, two wake-ups of the client, and between them, on a busy machine, the time the client
//! took to run once it was woken (in a system-call trace of the bench's h2 floor, the trailers
//! left a median 141 µs after the message). Held here, h2's frames of one wake-up (every
//! stream's, and its own control frames) leave together, the answer in one TCP segment.
//! Kestrel's HTTP/2 server made the same change for gRPC (data and trailers in one write).
//!
//! h2 is the only writer, [`Uncork`] the only sender, and both run on the connection's task: the
//! lock is never contended; it is only how two owners share the one socket without `unsafe`.
//!
//! Both of a proxied call's connections run h2 over a corked [`Socket`], the gRPC port's server
//! side and the upstream's client side alike: a request to TEI leaves in one plain write as an
//! answer does, and h2's codec is compiled once for the two (a binary 54 KB smaller). Corking the
//! client side too lowered the CPU time of a proxied call by about 3% (13 alternating runs of
//! each build, on-CPU time from `/proc`), with the same number of system calls and, in callgrind,
//! the same instructions (and 4% more instruction-cache misses): the difference is in the
//! kernel's share, and which part of it was not found.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, ready};

use bytes::{Buf as _, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes held before a write waits for the socket to take some: h2's writes come in pieces of at
/// most one 16 KB frame, so this is a few frames, and a client that stops reading holds h2 back
/// rather than growing the buffer (by more than one write past this).
const HELD_LIMIT: usize = 64 * 1024;
/// A buffer left this large by a burst is let go once sent, so an idle connection holds little.
const KEPT_CAPACITY: usize = 16 * 1024;

/// A connection's socket, whatever it is underneath (TCP or TLS, accepted or dialled).
pub type Socket = Pin<Box<dyn SocketIo>>;

/// What a [`Socket`] can be.
pub trait SocketIo: AsyncRead + AsyncWrite + Send {}

impl<T: AsyncRead + AsyncWrite + Send> SocketIo for T {}

/// `io` as h2's transport, and the handle that sends what h2 wrote to it.
pub fn cork<Io>(io: Io) -> (Corked<Io>, Uncork<Io>) {
    let shared = Arc::new(Mutex::new(Shared { io, held: BytesMut::new(), unflushed: false, failed: None }));
    (Corked { shared: shared.clone() }, Uncork { shared })
}

/// The transport h2 reads from and writes to: reads pass through, writes are held.
pub struct Corked<Io> {
    shared: Arc<Mutex<Shared<Io>>>,
}

/// Sends what h2 has written since the last time: polled by the connection's task after it
/// polls h2's connection.
pub struct Uncork<Io> {
    shared: Arc<Mutex<Shared<Io>>>,
}

struct Shared<Io> {
    io: Io,
    held: BytesMut,
    /// Written since the socket was last flushed: a TLS stream keeps records its socket would not
    /// take yet until it is flushed again, after `held` is empty.
    unflushed: bool,
    /// Why the socket took no more: the first error goes to h2 as it was, later ones as a
    /// broken pipe.
    failed: Option<Option<io::Error>>,
}

fn lock<Io>(shared: &Mutex<Shared<Io>>) -> MutexGuard<'_, Shared<Io>> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<Io: AsyncWrite + Unpin> Shared<Io> {
    /// Writes everything held, then flushes the socket (a TLS stream sends its records then).
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(error) = self.failure() {
            return Poll::Ready(Err(error));
        }
        while !self.held.is_empty() {
            match ready!(Pin::new(&mut self.io).poll_write(cx, &self.held)) {
                Ok(0) => return Poll::Ready(Err(self.fail(io::ErrorKind::WriteZero.into()))),
                Ok(written) => self.held.advance(written),
                Err(error) => return Poll::Ready(Err(self.fail(error))),
            }
        }
        if self.held.capacity() > KEPT_CAPACITY {
            self.held = BytesMut::new();
        }
        ready!(Pin::new(&mut self.io).poll_flush(cx)).map_err(|error| self.fail(error))?;
        self.unflushed = false;
        Poll::Ready(Ok(()))
    }

    /// Room for more: sends first when the held bytes are at their limit.
    fn poll_room(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(error) = self.failure() {
            return Poll::Ready(Err(error));
        }
        if self.held.len() >= HELD_LIMIT {
            ready!(self.poll_send(cx))?;
        }
        Poll::Ready(Ok(()))
    }

    fn fail(&mut self, error: io::Error) -> io::Error {
        self.failed = Some(None);
        error
    }

    fn failure(&mut self) -> Option<io::Error> {
        let failed = self.failed.as_mut()?;
        Some(failed.take().unwrap_or_else(|| io::ErrorKind::BrokenPipe.into()))
    }
}

impl<Io: AsyncWrite + Unpin> Uncork<Io> {
    /// Sends what is held. A socket that takes nothing now wakes the task when it can; one that
    /// failed keeps the error for h2, which meets it at its next write and closes the connection.
    pub fn poll_send(&self, cx: &mut Context<'_>) {
        let mut shared = lock(&self.shared);
        if !shared.unflushed {
            return;
        }
        if let Poll::Ready(Err(error)) = shared.poll_send(cx) {
            shared.failed = Some(Some(error));
            cx.waker().wake_by_ref();
        }
    }
}

impl<Io: AsyncRead + Unpin> AsyncRead for Corked<Io> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut lock(&self.shared).io).poll_read(cx, buf)
    }
}

impl<Io: AsyncWrite + Unpin> AsyncWrite for Corked<Io> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let mut shared = lock(&self.shared);
        ready!(shared.poll_room(cx))?;
        let mut written = 0;
        for buf in bufs {
            shared.held.extend_from_slice(buf);
            written += buf.len();
        }
        shared.unflushed = true;
        Poll::Ready(Ok(written))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Held: [`Uncork`] sends once h2 is done for this wake-up.
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        match lock(&self.shared).failure() {
            Some(error) => Poll::Ready(Err(error)),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut shared = lock(&self.shared);
        ready!(shared.poll_send(cx))?;
        Pin::new(&mut shared.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
