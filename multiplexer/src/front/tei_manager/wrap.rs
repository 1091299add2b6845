//! tei-manager's wrapped RPCs (every one but the Arrow batches) served as the tei.v1 calls they
//! wrap: the first message's target becomes the call's routing headers, each message's field 2
//! (the tei.v1 request, untouched) becomes the message, and the call runs through the tei.v1 row's
//! own service (`crate::front::grpc::service`): the gate, the door, admission, spills, coalescing,
//! metrics and TEI's answers passed through as TEI sent them, which are what tei-manager answers.
//! A stream goes where its first message's target says; later messages' targets are ignored, as
//! tei-manager does; a message without a request is skipped, as tei-manager does.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::BodyExt as _;
use tonic::Status;

use super::error::ManagerError;
use super::target;
use crate::admission::memory::Charge;
use crate::front::grpc::server::BUFFERED_PER_BYTE;
use crate::vocab::framing::{self, Messages, Side};

/// The first message of a call, read before it is routed: its target decides where it goes.
pub struct Opened<B> {
    pub target: target::Target,
    /// The call's body from here on: field 2 of each message, framed.
    pub body: Unwrapped<B>,
}

/// Reads a wrapped call's first message; the rest of its body is read as the call goes.
pub async fn open<B>(
    mut body: B,
    max_message: usize,
    charge: Option<Arc<Charge>>,
    info: bool,
) -> Result<Opened<B>, Result<ManagerError, Status>>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<tonic::codegen::StdError>,
{
    let mut messages = Messages::new(max_message, Side::Request);
    let mut trailers = None;
    let first = loop {
        if let Some(message) = messages.take().map_err(Err)? {
            break message;
        }
        match body.frame().await {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => messages.push(data),
                Err(frame) => trailers = frame.into_trailers().ok(),
            },
            Some(Err(error)) => return Err(Err(status_of(error.into()))),
            None if messages.is_cut_short() => return Err(Err(framing::cut_short())),
            None => return Err(Ok(ManagerError::EmptyStream)),
        }
    };
    let wrapped = target::unwrap(&first).map_err(Ok)?;
    let target = target::target(wrapped.target.as_ref()).map_err(Ok)?;
    // Info's wrapper has no request: tei.v1's InfoRequest is empty.
    let first = match (info, wrapped.request) {
        (true, _) => Some(Bytes::new()),
        (false, request) => request,
    };
    Ok(Opened { target, body: Unwrapped { body, messages, first, trailers, charge, ended: false } })
}

/// A wrapped call's body as the tei.v1 call's: each message's field 2, framed again, charged to
/// the call's memory charge as it is handed on (the tei.v1 stream gives it back once the message
/// is passed upstream, as it does for its own).
pub struct Unwrapped<B> {
    body: B,
    messages: Messages,
    first: Option<Bytes>,
    trailers: Option<http::HeaderMap>,
    charge: Option<Arc<Charge>>,
    ended: bool,
}

impl<B> Unwrapped<B> {
    fn framed(&mut self, request: &[u8]) -> Result<Frame<Bytes>, tonic::codegen::StdError> {
        let framed = framing::framed(request);
        if let Some(charge) = &self.charge {
            charge.grow(BUFFERED_PER_BYTE * framed.len() as u64).map_err(|over| {
                Box::new(crate::report::status::into_status(crate::error::Error::Memory(over)))
                    as tonic::codegen::StdError
            })?;
        }
        Ok(Frame::data(framed))
    }
}

impl<B> Body for Unwrapped<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Data = Bytes;
    type Error = tonic::codegen::StdError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Some(first) = this.first.take() {
            return Poll::Ready(Some(this.framed(&first)));
        }
        loop {
            if this.ended {
                return Poll::Ready(this.trailers.take().map(|trailers| Ok(Frame::trailers(trailers))));
            }
            match this.messages.take() {
                Err(status) => {
                    this.ended = true;
                    return Poll::Ready(Some(Err(Box::new(status))));
                }
                Ok(Some(message)) => match target::unwrap(&message) {
                    Ok(wrapped) => match wrapped.request {
                        Some(request) => return Poll::Ready(Some(this.framed(&request))),
                        None => continue,
                    },
                    Err(error) => {
                        this.ended = true;
                        return Poll::Ready(Some(Err(Box::new(error.into_status()))));
                    }
                },
                Ok(None) => {}
            }
            match ready!(Pin::new(&mut this.body).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => this.messages.push(data),
                    Err(frame) => this.trailers = frame.into_trailers().ok(),
                },
                Some(Err(error)) => {
                    this.ended = true;
                    return Poll::Ready(Some(Err(error.into())));
                }
                None if this.messages.is_cut_short() => {
                    this.ended = true;
                    return Poll::Ready(Some(Err(Box::new(framing::cut_short()))));
                }
                None => this.ended = true,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.first.is_none() && self.trailers.is_none()
    }
}

/// A body's error as the status tonic would answer: its own when it carries one.
fn status_of(error: tonic::codegen::StdError) -> Status {
    match error.downcast::<Status>() {
        Ok(status) => *status,
        Err(error) => Status::from_error(error),
    }
}
