//! The Arrow batches' answers on their way out, each charged to the memory budget until the
//! socket has taken its last byte: the answer's buffer and its [`Charge`] are one owner of the
//! `Bytes` handed to h2, so the charge is given back when h2 drops them (written out, or the
//! stream reset, or the connection gone), not when the body hands them over. A client that never
//! reads (a zero window) holds its answer charged, and the next call finds the budget spent.
//!
//! A stream's next answer is not made (its request not even read) until the previous one is
//! taken: at most one answer per stream is held, however slowly its client reads.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::Stream;
use futures::task::AtomicWaker;
use http::HeaderValue;
use http::header::CONTENT_TYPE;
use http_body::{Body, Frame};
use tonic::Status;

use crate::admission::memory::Charge;
use crate::front::grpc::stream_body::trailers;

/// A batch's answer: its gRPC message written after room for its framing (see
/// `super::arrow::frame_in_place`), and the memory charged for it, held until the socket has taken it.
pub struct Answer {
    pub written: Vec<u8>,
    /// Where the framed message starts in `written`.
    pub start: usize,
    pub charge: Charge,
    /// The call's `x-teifleet-cache` once this answer is made: a held answer's header.
    pub cache: Option<&'static str>,
}

/// Told when an answer's last byte was taken.
#[derive(Default)]
pub struct Taken {
    taken: AtomicBool,
    waker: AtomicWaker,
}

impl Taken {
    fn poll(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.taken.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        self.waker.register(cx.waker());
        match self.taken.load(Ordering::Acquire) {
            true => Poll::Ready(()),
            false => Poll::Pending,
        }
    }
}

/// An answer's buffer and its charge, dropped together with the last `Bytes` of it.
struct Held {
    buffer: Vec<u8>,
    _charge: Charge,
    taken: Option<Arc<Taken>>,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.buffer
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(taken) = &self.taken {
            taken.taken.store(true, Ordering::Release);
            taken.waker.wake();
        }
    }
}

/// The framed answer as the bytes h2 sends, charged until they are dropped; `taken` is told then.
pub fn charged(answer: Answer, taken: Option<Arc<Taken>>) -> Bytes {
    let start = answer.start;
    Bytes::from_owner(Held { buffer: answer.written, _charge: answer.charge, taken }).slice(start..)
}

/// A held answer of a unary call, charged until the socket has taken it, with the
/// `x-teifleet-cache` header when its pool's cache was asked.
pub fn held(answer: Answer) -> http::Response<tonic::body::Body> {
    let cache = answer.cache;
    let mut response = unary(charged(answer, None));
    if let Some(value) = cache {
        response.headers_mut().insert(crate::cache::HEADER, HeaderValue::from_static(value));
    }
    response
}

/// A unary call's answer: its one framed message, then `grpc-status: 0`.
pub fn unary(message: Bytes) -> http::Response<tonic::body::Body> {
    answer(crate::front::grpc::unary::Answer::new(message))
}

/// A streaming call's answers, each framed and charged, then the status that ended them.
pub fn stream<S>(answers: S) -> http::Response<tonic::body::Body>
where
    S: Stream<Item = Result<(Bytes, Arc<Taken>), Status>> + Send + 'static,
{
    answer(Many { answers: Box::pin(answers), last: None, trailers: None, done: false })
}

fn answer<B>(body: B) -> http::Response<tonic::body::Body>
where
    B: Body<Data = Bytes, Error = Status> + Send + 'static,
{
    let mut response = http::Response::new(tonic::body::Body::new(body));
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    response
}

type Answers = Pin<Box<dyn Stream<Item = Result<(Bytes, Arc<Taken>), Status>> + Send>>;

struct Many {
    answers: Answers,
    /// The answer handed out last, until the socket has taken it.
    last: Option<Arc<Taken>>,
    trailers: Option<Status>,
    done: bool,
}

impl Body for Many {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if this.trailers.is_none() {
            if let Some(last) = &this.last {
                std::task::ready!(last.poll(cx));
                this.last = None;
            }
            match std::task::ready!(this.answers.as_mut().poll_next(cx)) {
                Some(Ok((message, taken))) => {
                    this.last = Some(taken);
                    return Poll::Ready(Some(Ok(Frame::data(message))));
                }
                Some(Err(status)) => this.trailers = Some(status),
                None => this.trailers = Some(Status::ok("")),
            }
        }
        this.done = true;
        let status = this.trailers.take().unwrap_or_else(|| Status::ok(""));
        Poll::Ready(Some(trailers(&status).map(Frame::trailers)))
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}
