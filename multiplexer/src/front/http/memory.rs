//! The HTTP front's share of the process's memory budget: a request's body is charged before it
//! is read (its declared `Content-Length`, or its bytes as they arrive when it declares none), a
//! request that finds no room is answered 429 in TEI's shape with `Retry-After` at once, and
//! what is charged for it (its body, the answer the route assembled) is given back only once the
//! answer has been sent.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http_body::{Body, Frame, SizeHint};

use super::error::{Flavor, HttpError};
use crate::admission::memory::{Charge, MemoryBudget, OverBudget, Use};
use crate::error::Error;
use crate::report::metrics::Metrics;

/// What a request costs before its body: its head, its task, its connection's share.
pub const REQUEST_BYTES: u64 = 16 * 1024;
/// What a byte of body costs while its request runs: the body itself, the texts parsed from it
/// and the messages encoded from those live together until the calls go upstream.
pub const BODY_COPIES: u64 = 3;

/// The state of [`charge_body`].
#[derive(Clone)]
pub struct Bodies {
    pub memory: Arc<MemoryBudget>,
    pub payload_limit: usize,
    pub metrics: Metrics,
    /// The shape a path's refusals take (`super::table::flavor`).
    pub flavor: fn(&str) -> Flavor,
}

/// A charge a route took for its answer, handed to [`charge_body`] in the response's extensions
/// so it lasts until the answer is sent.
#[derive(Clone)]
pub struct AnswerCharge(pub Arc<Charge>);

/// Charges the request's body before it is read, refusing it at once when the budget has no room;
/// holds the charges until the answer is sent.
pub async fn charge_body(State(bodies): State<Bodies>, request: Request, next: Next) -> Response {
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok())
        // Over the payload limit: refused by the body limit, after this charge of nothing more.
        .map(|length| length.min(bodies.payload_limit as u64));
    let upfront = REQUEST_BYTES + BODY_COPIES * declared.unwrap_or(0);
    let charge = match bodies.memory.charge(Use::RequestBodies, upfront) {
        Ok(charge) => Arc::new(charge),
        Err(over) => {
            bodies.metrics.refused_input("http", crate::front::grpc::server::REFUSED_MEMORY);
            let flavor = (bodies.flavor)(request.uri().path());
            return HttpError::Call(Error::Memory(over)).into_response(flavor);
        }
    };
    // A body of no declared length is charged as it comes, up to the payload limit.
    let request = match declared {
        Some(_) => request,
        None => request.map(|body| {
            axum::body::Body::new(Charged { body, charge: charge.clone(), left: bodies.payload_limit as u64 })
        }),
    };
    let mut response = next.run(request).await;
    let answer = response.extensions_mut().remove::<AnswerCharge>();
    response.map(|body| axum::body::Body::new(HeldUntilSent::new(body, (charge, answer))))
}

/// Whether a body stopped because it outgrew the budget: what it was refused with.
pub fn over_budget(error: &(dyn std::error::Error + 'static)) -> Option<OverBudget> {
    std::iter::successors(Some(error), |error| error.source()).find_map(|e| e.downcast_ref::<OverBudget>().copied())
}

/// A body charged as its bytes arrive.
struct Charged {
    body: axum::body::Body,
    charge: Arc<Charge>,
    /// Bytes still charged per byte; past the payload limit the body limit refuses the body.
    left: u64,
}

impl Body for Charged {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let frame = ready!(Pin::new(&mut self.body).poll_frame(cx));
        if let Some(Ok(frame)) = &frame
            && let Some(data) = frame.data_ref()
        {
            let counted = (data.len() as u64).min(self.left);
            self.left -= counted;
            if let Err(over) = self.charge.grow(BODY_COPIES * counted) {
                return Poll::Ready(Some(Err(axum::Error::new(over))));
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Bytes of an answer handed to hyper at a time. hyper takes the next frame only while it has
/// room (16 queued buffers, or about 400 KB flattened, on HTTP/1.1; the window on HTTP/2), and it
/// drops a body once it has taken its last frame, written or not: an answer handed over whole
/// would be dropped, and its charge given back, while all of it still waited for a client that
/// never reads (issue 43: 32 unread `/embed_all` answers, 294 MB and nothing charged). In slices,
/// the charge lasts until no more than a few slices are left to send.
pub const SLICE: usize = 16 * 1024;

/// An answer's body, holding what its request was charged until its last slice has been taken.
struct HeldUntilSent {
    body: axum::body::Body,
    /// What is left of a frame larger than [`SLICE`].
    rest: Bytes,
    _charges: (Arc<Charge>, Option<AnswerCharge>),
}

impl HeldUntilSent {
    fn new(body: axum::body::Body, charges: (Arc<Charge>, Option<AnswerCharge>)) -> Self {
        Self { body, rest: Bytes::new(), _charges: charges }
    }

    fn slice(&mut self) -> Frame<Bytes> {
        Frame::data(self.rest.split_to(SLICE.min(self.rest.len())))
    }
}

impl Body for HeldUntilSent {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if !self.rest.is_empty() {
            return Poll::Ready(Some(Ok(self.slice())));
        }
        match ready!(Pin::new(&mut self.body).poll_frame(cx)) {
            Some(Ok(frame)) if frame.data_ref().is_some_and(|data| data.len() > SLICE) => {
                self.rest = frame.into_data().unwrap_or_default();
                Poll::Ready(Some(Ok(self.slice())))
            }
            other => Poll::Ready(other),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let (hint, rest) = (self.body.size_hint(), self.rest.len() as u64);
        let mut sum = SizeHint::new();
        sum.set_lower(hint.lower().saturating_add(rest));
        if let Some(upper) = hint.upper() {
            sum.set_upper(upper.saturating_add(rest));
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt as _;

    use super::*;
    use crate::admission::memory::MemoryBudget;

    #[tokio::test]
    async fn an_answer_goes_in_slices_and_its_charge_lasts_until_the_last_one_is_taken() {
        let memory = MemoryBudget::new(1 << 30, None);
        let request = Arc::new(memory.charge(Use::RequestBodies, 100).unwrap());
        let answer = AnswerCharge(Arc::new(memory.charge(Use::Answers, 1000).unwrap()));
        let whole: Vec<u8> = (0..SLICE * 3 + 5).map(|i| i as u8).collect();
        let mut body = HeldUntilSent::new(axum::body::Body::from(whole.clone()), (request, Some(answer)));
        assert_eq!(body.size_hint().exact(), Some(whole.len() as u64));
        let mut sent = Vec::new();
        while let Some(frame) = body.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            assert!(data.len() <= SLICE);
            sent.extend_from_slice(&data);
            assert_eq!(memory.charged(), 1100, "held while any of it is left");
            assert_eq!(body.size_hint().exact(), Some((whole.len() - sent.len()) as u64));
        }
        assert_eq!(sent, whole);
        assert!(body.is_end_stream());
        drop(body);
        assert_eq!(memory.charged(), 0, "given back once the body is dropped");
    }
}
