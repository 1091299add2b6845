//! A streaming call's request body, drained from h2 as its frames arrive, by a task of its own.
//!
//! Why: h2 bounds the framing overhead of the small DATA frames it buffers for a stream its
//! reader is not reading (its data frame budget, about a hundred 20-byte frames), and closes the
//! whole connection with GOAWAY `ENHANCE_YOUR_CALM` "too_many_data_frames" when a client sends
//! more. A stream's messages are read one at a time, as each is admitted, so a client streaming
//! small messages as fast as it can (grpcio does, and TEI's maintainers tell batch users to)
//! runs into it while its next message waits for a permit. Here every frame is taken from h2 at
//! once and its bytes appended to one buffer, so h2 holds none; the window is given back only
//! when the call takes the bytes, so the client can still send at most a window ahead of the
//! call (HTTP/2 flow control keeps its word), and the buffer holds bytes, not frames.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures::task::AtomicWaker;
use h2::{FlowControl, RecvStream};
use http::HeaderMap;
use http_body::{Body, Frame};
use tokio_util::task::AbortOnDropHandle;

use crate::admission::memory::Charge;
use crate::error::Error;
use crate::report::status;

type BodyError = tonic::codegen::StdError;

/// The body as the call reads it.
pub struct Drained {
    shared: Arc<Shared>,
    flow: FlowControl,
    done: bool,
    /// Drains the stream while the call lives; dropping the body stops it (and resets the
    /// stream, as dropping h2's stream does).
    _drain: AbortOnDropHandle<()>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// The call waiting for bytes.
    reader: AtomicWaker,
}

#[derive(Default)]
struct State {
    /// Bytes taken from h2 and not yet by the call; their window not given back yet.
    bytes: BytesMut,
    /// How the body ended: its trailers, or why it failed.
    end: Option<Result<Option<HeaderMap>, BodyError>>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn end(&self, end: Result<Option<HeaderMap>, BodyError>) {
        self.lock().end = Some(end);
        self.reader.wake();
    }
}

impl Drained {
    /// Starts draining `recv`, charging each frame's bytes (`per_byte` a byte) to `charge`.
    pub fn start(mut recv: RecvStream, charge: Option<Arc<Charge>>, per_byte: u64) -> Self {
        let flow = recv.flow_control().clone();
        let shared = Arc::new(Shared::default());
        let draining = shared.clone();
        let drain = tokio::spawn(async move {
            while let Some(data) = recv.data().await {
                let data = match data {
                    Ok(data) => data,
                    Err(error) => return draining.end(Err(error.into())),
                };
                if let Some(charge) = &charge
                    && let Err(over) = charge.grow(per_byte * data.len() as u64)
                {
                    return draining.end(Err(Box::new(status::into_status(Error::Memory(over)))));
                }
                draining.lock().bytes.extend_from_slice(&data);
                draining.reader.wake();
            }
            let trailers = recv.trailers().await.map_err(Into::into);
            draining.end(trailers);
        });
        Self { shared, flow, done: false, _drain: AbortOnDropHandle::new(drain) }
    }
}

impl Body for Drained {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        let mut state = this.shared.lock();
        // Registered under the lock the drain appends under, so no wake-up falls between.
        this.shared.reader.register(cx.waker());
        if !state.bytes.is_empty() {
            let bytes = state.bytes.split().freeze();
            drop(state);
            // Fails only once the stream is gone, which the drain reports.
            let _ = this.flow.release_capacity(bytes.len());
            return Poll::Ready(Some(Ok(Frame::data(bytes))));
        }
        match state.end.take() {
            None => Poll::Pending,
            Some(Ok(trailers)) => {
                this.done = true;
                Poll::Ready(trailers.map(|trailers| Ok(Frame::trailers(trailers))))
            }
            Some(Err(error)) => {
                this.done = true;
                Poll::Ready(Some(Err(error)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}
