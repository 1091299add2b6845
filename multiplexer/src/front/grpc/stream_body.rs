//! A streaming call's messages on the gRPC port, framed here rather than by tonic's server codec
//! (as unary calls are by `crate::front::grpc::unary`): the client's messages as a stream of their bytes, and
//! the answers as a body of framed messages that ends with the call's status in its trailers.
//! Why: tonic's codec boxes both directions, keeps an encoding buffer that reallocates as answers
//! pass through it, and copies each message in and out of it; a stream's answers are TEI's
//! messages as they came, so only the 5-byte prefix needs writing.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf as _, Bytes, BytesMut};
use futures::Stream;
use http::HeaderValue;
use http::header::CONTENT_TYPE;
use http_body::{Body, Frame};
use tonic::metadata::MetadataMap;
use tonic::{Code, Request, Response, Status};

use crate::admission::memory::Charge;
use crate::error::refused_message;
use crate::front::grpc::server::BUFFERED_PER_BYTE;
use crate::report::metrics::Metrics;
use crate::report::status;
use crate::vocab::Protocol;
use crate::vocab::framing::GRPC_STATUS;
use crate::vocab::framing::{self, Messages, Side};

pub use crate::vocab::framing::MessageStream;

/// The request's messages, each at most `max_message` bytes, with its headers as metadata; a
/// compressed request is refused as a unary one is. A message refused later is counted in
/// `metrics` as the gRPC port's unary refusals are.
pub fn incoming<B>(
    request: http::Request<B>,
    max_message: usize,
    metrics: Metrics,
) -> Result<Request<MessageStream>, Status>
where
    B: Body + Send + Unpin + 'static,
    B::Error: Into<tonic::codegen::StdError>,
{
    crate::front::grpc::unary::refuse_compressed(request.headers())?;
    let (parts, body) = request.into_parts();
    // The stream's memory charge (`server::stream`): each message's bytes are given back once it
    // is passed on.
    let charge = parts.extensions.get::<Arc<Charge>>().cloned();
    let messages = Messages::new(max_message, Side::Request);
    let messages = Incoming { body, messages, metrics, ended: false, charge };
    Ok(Request::from_parts(MetadataMap::from_headers(parts.headers), parts.extensions, Box::pin(messages)))
}

struct Incoming<B> {
    body: B,
    messages: Messages,
    metrics: Metrics,
    ended: bool,
    charge: Option<Arc<Charge>>,
}

impl<B> Incoming<B> {
    /// Ends the messages with `status`, counted as a refused message when it is one.
    fn refuse(&mut self, status: Status) -> Poll<Option<Result<Bytes, Status>>> {
        self.ended = true;
        if let Some((_, Some(reason))) = refused_message(status.code()) {
            self.metrics.refused_input(Protocol::Grpc.as_str(), reason);
        }
        Poll::Ready(Some(Err(status)))
    }
}

impl<B> Stream for Incoming<B>
where
    B: Body + Unpin,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Item = Result<Bytes, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if this.ended {
                return Poll::Ready(None);
            }
            match this.messages.take() {
                Ok(Some(message)) => {
                    if let Some(charge) = &this.charge {
                        charge.shrink(BUFFERED_PER_BYTE * (message.len() + framing::PREFIX) as u64);
                    }
                    return Poll::Ready(Some(Ok(message)));
                }
                Ok(None) => {}
                Err(status) => return this.refuse(status),
            }
            match ready!(Pin::new(&mut this.body).poll_frame(cx)) {
                // Trailers a client sends are not passed on, as tonic's server did not.
                Some(Ok(frame)) => {
                    if let Ok(mut data) = frame.into_data() {
                        this.messages.push(data.copy_to_bytes(data.remaining()));
                    }
                }
                Some(Err(error)) => {
                    return match Status::from_error(error.into()) {
                        // The caller went away: the end of its messages, as tonic reads it.
                        status if status.code() == Code::Cancelled => {
                            this.ended = true;
                            Poll::Ready(None)
                        }
                        status => this.refuse(status),
                    };
                }
                None if this.messages.is_cut_short() => return this.refuse(framing::cut_short()),
                None => this.ended = true,
            }
        }
    }
}

/// The HTTP answer to a streaming call: its metadata as headers, each answer framed, then
/// `grpc-status: 0` or the status that ended it in the trailers; or the status alone (a
/// trailers-only answer) when the call failed before its first answer could be sent.
pub fn answer(result: Result<Response<MessageStream>, Status>) -> http::Response<tonic::body::Body> {
    let (metadata, answers, extensions) = match result {
        Ok(response) => response.into_parts(),
        Err(status) => return status::into_http(status),
    };
    let mut headers = metadata.into_headers();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    let mut response = http::Response::new(tonic::body::Body::new(Outgoing { answers, ended: None, done: false }));
    *response.headers_mut() = headers;
    *response.extensions_mut() = extensions;
    response
}

/// The trailers an answer stream ends with: its status, and its metadata (an `Ok` one's too:
/// what is known only once the answers are out, such as `x-teifleet-cache`).
pub fn trailers(status: &Status) -> Result<http::HeaderMap, Status> {
    // Room for the load report the trailers usually gain (`crate::report::orca`).
    let mut trailers = http::HeaderMap::with_capacity(3);
    if status.code() == Code::Ok && status.metadata().is_empty() {
        trailers.insert(GRPC_STATUS, HeaderValue::from_static("0"));
    } else if let Err(unwritable) = status.add_header(&mut trailers) {
        trailers.clear();
        unwritable.add_header(&mut trailers).map_err(|_| Status::internal("unwritable status"))?;
    }
    Ok(trailers)
}

struct Outgoing {
    answers: MessageStream,
    /// The status that ended the answers, once they have (trailers still to send).
    ended: Option<Status>,
    done: bool,
}

impl Body for Outgoing {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        let mut gathered = BytesMut::new();
        while this.ended.is_none() && gathered.len() < framing::GATHER_BYTES {
            match this.answers.as_mut().poll_next(cx) {
                Poll::Ready(Some(Ok(message))) => framing::frame_into(&mut gathered, &message),
                Poll::Ready(Some(Err(status))) => this.ended = Some(status),
                Poll::Ready(None) => this.ended = Some(Status::ok("")),
                Poll::Pending if gathered.is_empty() => return Poll::Pending,
                Poll::Pending => break,
            }
        }
        if !gathered.is_empty() {
            return Poll::Ready(Some(Ok(Frame::data(gathered.freeze()))));
        }
        let Some(ended) = this.ended.take() else { return Poll::Pending };
        this.done = true;
        Poll::Ready(Some(trailers(&ended).map(Frame::trailers)))
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests;
