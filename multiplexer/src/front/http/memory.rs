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

use super::error::HttpError;
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
            let flavor = super::table::flavor(request.uri().path());
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
    response.map(|body| axum::body::Body::new(HeldUntilSent { body, _charges: (charge, answer) }))
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

/// An answer's body, holding what its request was charged until it has been sent.
struct HeldUntilSent {
    body: axum::body::Body,
    _charges: (Arc<Charge>, Option<AnswerCharge>),
}

impl Body for HeldUntilSent {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
