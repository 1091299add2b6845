//! A unary call's one request message in and one answer out, in gRPC's framing, with the
//! statuses tonic's server gives for the same faults (a test holds the two side by side).
//!
//! Why not tonic's `Grpc::unary`: its streaming decoder and encoder are built for any number of
//! messages (a buffer of their own, boxed codecs, a stream wrapped around the one answer), and on
//! a unary call they cost more than the sidecar's own work, on every call. The message bytes are
//! never decoded here either way: this only takes gRPC's 5-byte prefix off and puts it back.

use std::borrow::Cow;
use std::pin::{Pin, pin};
use std::task::{Context, Poll};

use bytes::{Buf as _, Bytes};
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt as _;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Request, Response, Status};

use crate::report::status;
use crate::vocab::framing::{self, Framed, Messages, Side};
use crate::vocab::framing::{GRPC_STATUS, RESERVED_IN_ANSWERS};

const GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");
const GRPC_ACCEPT_ENCODING: &str = "grpc-accept-encoding";
/// The request's message, kept framed, with its headers (and any trailers) as metadata. The body
/// is read to its end: messages after the first are checked and dropped, as tonic does.
pub async fn read_request<B>(request: http::Request<B>, max_message: usize) -> Result<Request<Framed>, Status>
where
    B: Body,
    B::Error: Into<tonic::codegen::StdError>,
{
    refuse_compressed(request.headers())?;
    let (parts, body) = request.into_parts();
    let mut body = pin!(body);
    let mut messages = Messages::new(max_message, Side::Request);
    let mut message = None;
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(error) => match Status::from_error(error.into()) {
                // The caller went away: read as the end of its body, as tonic does.
                status if status.code() == Code::Cancelled => break,
                status => return Err(status),
            },
        };
        match frame.into_data() {
            Ok(mut data) => {
                messages.push(data.copy_to_bytes(data.remaining()));
                while let Some(next) = messages.take_framed()? {
                    message.get_or_insert(next);
                }
            }
            Err(frame) => trailers = frame.into_trailers().ok().or(trailers),
        }
    }
    if messages.is_cut_short() {
        return Err(framing::cut_short());
    }
    let message = message.ok_or_else(|| framing::missing(Side::Request))?;
    let mut headers = parts.headers;
    if let Some(trailers) = trailers {
        headers.extend(trailers);
    }
    Ok(Request::from_parts(MetadataMap::from_headers(headers), parts.extensions, message))
}

/// The HTTP answer to a unary call: the message framed, then `grpc-status: 0` in the trailers;
/// or the status alone (a trailers-only answer).
pub fn answer(result: Result<Response<Framed>, Status>, max_message: usize) -> http::Response<tonic::body::Body> {
    let (metadata, message, extensions) = match result {
        Ok(response) => response.into_parts(),
        Err(status) => return status::into_http(status),
    };
    if message.len() > max_message {
        return status::into_http(Status::out_of_range(format!(
            "Error, encoded message length too large: found {} bytes, the limit is: {max_message} bytes",
            message.len()
        )));
    }
    let mut headers = metadata.into_headers();
    crate::gate::request_meta::remove_all(&mut headers, &RESERVED_IN_ANSWERS);
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    let mut response = http::Response::new(tonic::body::Body::new(Answer::new(message.into_framed())));
    *response.headers_mut() = headers;
    *response.extensions_mut() = extensions;
    response
}

/// Nothing is decompressed here: a compressed request is UNIMPLEMENTED, with the encodings taken.
pub(crate) fn refuse_compressed(headers: &HeaderMap) -> Result<(), Status> {
    let Some(encoding) = headers.get(&GRPC_ENCODING) else { return Ok(()) };
    if encoding == "identity" {
        return Ok(());
    }
    let encoding = match std::str::from_utf8(encoding.as_bytes()) {
        Ok(text) => Cow::Borrowed(text),
        Err(_) => Cow::Owned(format!("{:?}", encoding.as_bytes())),
    };
    let mut status = Status::unimplemented(format!("Content is compressed with `{encoding}` which isn't supported"));
    status.metadata_mut().insert(GRPC_ACCEPT_ENCODING, MetadataValue::from_static("identity"));
    Err(status)
}

/// A unary answer's body: its one framed message, then `grpc-status: 0`.
pub struct Answer {
    message: Option<Bytes>,
    ended: bool,
}

impl Answer {
    /// The body of `message`, framed already (its 5-byte prefix in front).
    pub fn new(message: Bytes) -> Self {
        Self { message: Some(message), ended: false }
    }
}

impl Body for Answer {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if let Some(message) = this.message.take() {
            return Poll::Ready(Some(Ok(Frame::data(message))));
        }
        if std::mem::replace(&mut this.ended, true) {
            return Poll::Ready(None);
        }
        // Room for the load report the trailers usually gain (`crate::report::orca`).
        let mut trailers = HeaderMap::with_capacity(2);
        trailers.insert(GRPC_STATUS, HeaderValue::from_static("0"));
        Poll::Ready(Some(Ok(Frame::trailers(trailers))))
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.message.as_ref().map_or(0, |message| message.len() as u64))
    }
}

#[cfg(test)]
mod tests;
