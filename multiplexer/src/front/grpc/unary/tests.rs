//! Each fault and each well-formed call through this module and through tonic's own unary
//! server, side by side: the same answer, headers, message and trailers.

use futures::future::{Ready, ready};
use http_body_util::{BodyExt as _, StreamBody};
use teifleet_proto::BytesCodec;
use tonic::server::{Grpc, UnaryService};

use super::*;
use crate::vocab::framing::{Framed, PREFIX};

const MAX: usize = 64;

/// Answers with the request's message and the request metadata named `x-*`.
#[derive(Clone, Copy)]
struct Echo;

impl UnaryService<Bytes> for Echo {
    type Response = Bytes;
    type Future = Ready<Result<Response<Bytes>, Status>>;

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        let (metadata, _, message) = request.into_parts();
        let mut headers = HeaderMap::new();
        for (name, value) in metadata.into_headers() {
            if let Some(name) = name.filter(|name| name.as_str().starts_with("x-")) {
                headers.insert(name, value);
            }
        }
        // What an upstream's answer carries besides: reserved headers the server sets itself.
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc+proto"));
        headers.insert(GRPC_STATUS, HeaderValue::from_static("0"));
        ready(Ok(Response::from_parts(MetadataMap::from_headers(headers), message, http::Extensions::new())))
    }
}

type Frames = Vec<Result<Frame<Bytes>, Status>>;

fn request(
    headers: &[(&'static str, &'static str)],
    frames: Frames,
) -> http::Request<impl Body<Data = Bytes, Error = Status> + use<>> {
    let mut request = http::Request::new(StreamBody::new(futures::stream::iter(frames)));
    for (name, value) in headers {
        request.headers_mut().insert(*name, HeaderValue::from_static(value));
    }
    request
}

fn framed(flag: u8, len: u32, bytes: &[u8]) -> Result<Frame<Bytes>, Status> {
    let mut data = vec![flag];
    data.extend_from_slice(&len.to_be_bytes());
    data.extend_from_slice(bytes);
    Ok(Frame::data(Bytes::from(data)))
}

fn data(bytes: &'static [u8]) -> Result<Frame<Bytes>, Status> {
    Ok(Frame::data(Bytes::from_static(bytes)))
}

/// Headers, the body's bytes and its trailers.
async fn seen(response: http::Response<tonic::body::Body>) -> (HeaderMap, Vec<u8>, Option<HeaderMap>) {
    let (parts, body) = response.into_parts();
    let collected = body.collect().await.expect("the answer's body");
    let trailers = collected.trailers().cloned();
    (parts.headers, collected.to_bytes().to_vec(), trailers)
}

async fn both(
    headers: &[(&'static str, &'static str)],
    frames: fn() -> Frames,
) -> (HeaderMap, Vec<u8>, Option<HeaderMap>) {
    let mut grpc = Grpc::new(BytesCodec).apply_max_message_size_config(Some(MAX), Some(MAX));
    let tonics = seen(grpc.unary(Echo, request(headers, frames())).await).await;
    let echoed = match read_request(request(headers, frames()), MAX).await {
        Ok(request) => Echo.call(request.map(Framed::into_message)).await.map(|echo| echo.map(|m| Framed::new(&m))),
        Err(status) => Err(status),
    };
    let ours = seen(answer(echoed, MAX)).await;
    assert_eq!(ours, tonics, "headers {headers:?}");
    ours
}

fn code(seen: &(HeaderMap, Vec<u8>, Option<HeaderMap>)) -> String {
    let status = seen.2.as_ref().and_then(|trailers| trailers.get(&GRPC_STATUS)).or(seen.0.get(&GRPC_STATUS));
    status.map(|value| value.to_str().unwrap().to_owned()).unwrap_or_default()
}

#[tokio::test]
async fn well_formed_calls_are_answered_as_tonic_answers_them() {
    let one = both(&[("x-echo", "1")], || vec![framed(0, 3, b"abc")]).await;
    assert_eq!((code(&one), &one.1[PREFIX..]), ("0".to_owned(), &b"abc"[..]));
    assert_eq!(one.0.get("x-echo").unwrap(), "1");
    assert_eq!(one.0.get(CONTENT_TYPE).unwrap(), "application/grpc", "the server's own, not the upstream's");
    let split = both(&[], || vec![data(b"\0\0"), data(b"\0\0\x04ab"), data(b"cd")]).await;
    assert_eq!(&split.1[PREFIX..], b"abcd", "a message over several frames");
    let second = both(&[], || vec![data(b"\0\0\0\0\x01a\0\0\0\0\x01b")]).await;
    assert_eq!(&second.1[PREFIX..], b"a", "the first message; the second is dropped");
    let trailers = || {
        let mut trailers = HeaderMap::new();
        trailers.insert("x-trailer", HeaderValue::from_static("t"));
        vec![framed(0, 1, b"a"), Ok(Frame::trailers(trailers))]
    };
    let with_trailers = both(&[], trailers).await;
    assert_eq!(with_trailers.0.get("x-trailer").unwrap(), "t", "request trailers join the metadata");
    let empty_message = both(&[("grpc-encoding", "identity")], || vec![framed(0, 0, b"")]).await;
    assert_eq!((code(&empty_message), empty_message.1.len()), ("0".to_owned(), PREFIX));
}

/// A fault's request headers, its body's frames and the gRPC code both servers answer with.
type Fault = (&'static [(&'static str, &'static str)], fn() -> Frames, &'static str);

#[tokio::test]
async fn faults_get_tonics_status_and_words() {
    let cases: [Fault; 8] = [
        (&[], || vec![framed(0, MAX as u32 + 1, b"")], "11"),
        (&[], || vec![framed(1, 1, b"a")], "13"),
        (&[], || vec![framed(7, 1, b"a")], "13"),
        (&[], || vec![framed(0, 10, b"abcd")], "13"),
        (&[], || vec![data(b"\0\0\0")], "13"),
        (&[], Vec::new, "13"),
        (&[("grpc-encoding", "gzip")], || vec![framed(0, 1, b"a")], "12"),
        (&[], || vec![framed(0, 1, b"a"), Err(Status::invalid_argument("too slow"))], "3"),
    ];
    for (headers, frames, expected) in cases {
        let seen = both(headers, frames).await;
        assert_eq!(code(&seen), expected, "{:?}", seen.0);
    }
}

#[tokio::test]
async fn an_answer_over_the_limit_is_out_of_range() {
    let too_large = Response::new(Framed::new(&[0; MAX + 1]));
    let (headers, _, _) = seen(answer(Ok(too_large), MAX)).await;
    assert_eq!(headers.get(&GRPC_STATUS).unwrap(), "11");
}
