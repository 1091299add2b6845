//! A request body cut off at a deadline, whose timer is set only if the body has to be waited
//! for. A unary call's message has usually arrived by the time its call is admitted and reads it
//! (`crate::front::grpc` takes it from h2 as the stream is accepted): tower-http's
//! `DeadlineBody`, which polls its timer before the body, registered and removed a timer on every
//! call for a deadline that almost never mattered.

use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

pub struct BodyDeadline<B, F> {
    body: B,
    deadline: Instant,
    /// Made the first time the body is not ready.
    timer: Option<Pin<Box<Sleep>>>,
    /// The error the body ends with at the deadline.
    elapsed: F,
}

impl<B, F> BodyDeadline<B, F> {
    /// `body`, ended with `elapsed()`'s error at `deadline`.
    pub fn new(body: B, deadline: Instant, elapsed: F) -> Self {
        Self { body, deadline, timer: None, elapsed }
    }
}

impl<B, F> Body for BodyDeadline<B, F>
where
    B: Body + Unpin,
    B::Error: Into<tonic::codegen::StdError>,
    F: FnMut() -> tonic::codegen::StdError + Unpin,
{
    type Data = B::Data;
    type Error = tonic::codegen::StdError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, Self::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        let deadline = this.deadline;
        let timer = this.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err((this.elapsed)()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use http_body_util::{BodyExt as _, Full, StreamBody};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_body_at_hand_sets_no_timer_and_a_slow_one_is_cut_off() {
        let deadline = Instant::now() + Duration::from_secs(1);
        let elapsed = || -> tonic::codegen::StdError { "too slow".into() };
        let mut at_hand = BodyDeadline::new(Full::new(Bytes::from_static(b"message")), deadline, elapsed);
        let frame = at_hand.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "message");
        assert!(at_hand.timer.is_none(), "no timer for a body that never had to be waited for");

        let never = StreamBody::new(futures::stream::pending::<Result<Frame<Bytes>, std::convert::Infallible>>());
        let mut slow = BodyDeadline::new(never, deadline, elapsed);
        let error = slow.frame().await.unwrap().unwrap_err();
        assert_eq!(error.to_string(), "too slow");
        assert_eq!(Instant::now(), deadline, "cut off at the deadline, not before");
    }
}
