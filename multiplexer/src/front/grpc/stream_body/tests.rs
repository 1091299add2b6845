//! A stream's messages in and its answers out, as the gRPC port frames them: split frames, the
//! size limit, a body cut short, a compressed request; answers framed, then the status that ends
//! them in the trailers.

use futures::{StreamExt as _, TryStreamExt as _};
use http_body_util::{BodyExt as _, StreamBody};

use super::*;
use crate::report::metrics::Metrics;
use crate::vocab::framing::framed;

type Frames = Vec<Result<Frame<Bytes>, Status>>;

fn request(frames: Frames) -> http::Request<impl Body<Data = Bytes, Error = Status> + Send + Unpin + use<>> {
    http::Request::new(StreamBody::new(futures::stream::iter(frames)))
}

fn data(bytes: &'static [u8]) -> Result<Frame<Bytes>, Status> {
    Ok(Frame::data(Bytes::from_static(bytes)))
}

#[tokio::test]
async fn a_clients_messages_come_whole_whatever_its_frames() {
    let frames = vec![data(&[0, 0, 0, 0, 2, b'h']), data(&[b'i', 0, 0, 0]), data(&[0, 1, b'!'])];
    let messages: Vec<Bytes> =
        incoming(request(frames), 16, Metrics::new()).unwrap().into_inner().try_collect().await.unwrap();
    assert_eq!(messages, [&b"hi"[..], b"!"]);
}

#[tokio::test]
async fn a_message_that_cannot_be_read_ends_the_messages_with_tonics_status() {
    let statuses = [
        (vec![data(&[0, 0, 0, 0, 1, b'a', 0, 0, 0, 0, 99])], Code::OutOfRange),
        (vec![data(&[0, 0, 0, 0, 1, b'a', 0, 0, 0, 0, 9, b'x'])], Code::Internal),
        (vec![data(&[0, 0, 0, 0, 1, b'a']), Err(Status::data_loss("broken"))], Code::DataLoss),
    ];
    let metrics = Metrics::new();
    for (frames, code) in statuses {
        let mut messages = incoming(request(frames), 16, metrics.clone()).unwrap().into_inner();
        assert_eq!(messages.next().await.unwrap().unwrap(), Bytes::from_static(b"a"));
        assert_eq!(messages.next().await.unwrap().unwrap_err().code(), code);
        assert!(messages.next().await.is_none(), "nothing after its status");
    }
    // Counted as the gRPC port's unary refusals are.
    assert_eq!(refused(&metrics, "message_too_large"), 1);
    assert_eq!(refused(&metrics, "malformed_message"), 2, "cut short, and a body that broke");
    // A caller that went away ends its messages, and is no refusal.
    let gone = vec![data(&[0, 0, 0, 0, 1, b'a']), Err(Status::cancelled("gone"))];
    assert_eq!(incoming(request(gone), 16, metrics.clone()).unwrap().into_inner().count().await, 1);
    assert_eq!(refused(&metrics, "malformed_message"), 2);
}

/// `teifleet_refused_input_total{port="grpc", reason}`.
fn refused(metrics: &Metrics, reason: &str) -> u64 {
    let families = metrics.registry.gather();
    let Some(family) = families.iter().find(|f| f.name() == "teifleet_refused_input_total") else { return 0 };
    family
        .get_metric()
        .iter()
        .filter(|m| m.get_label().iter().any(|l| l.name() == "reason" && l.value() == reason))
        .map(|m| m.get_counter().get_value() as u64)
        .sum()
}

#[test]
fn a_compressed_request_is_refused_as_a_unary_one_is() {
    let mut compressed = request(Vec::new());
    compressed.headers_mut().insert("grpc-encoding", HeaderValue::from_static("gzip"));
    let status = incoming(compressed, 16, Metrics::new()).err().unwrap();
    assert_eq!(status.code(), Code::Unimplemented);
}

async fn frames(answer: http::Response<tonic::body::Body>) -> (Vec<Bytes>, http::HeaderMap) {
    let mut body = answer.into_body();
    let (mut data, mut trailers) = (Vec::new(), http::HeaderMap::new());
    while let Some(frame) = body.frame().await {
        match frame.unwrap().into_data() {
            Ok(bytes) => data.push(bytes),
            Err(frame) => trailers = frame.into_trailers().unwrap(),
        }
    }
    (data, trailers)
}

fn answers(items: Vec<Result<Bytes, Status>>) -> Result<Response<MessageStream>, Status> {
    Ok(Response::new(Box::pin(futures::stream::iter(items))))
}

#[tokio::test]
async fn answers_are_framed_then_the_status_that_ends_them_is_in_the_trailers() {
    let answered = answer(answers(vec![Ok(Bytes::from_static(b"one")), Ok(Bytes::from_static(b"two"))]));
    assert_eq!(answered.headers()[CONTENT_TYPE], "application/grpc");
    let (data, trailers) = frames(answered).await;
    let gathered: Vec<u8> = [framed(b"one"), framed(b"two")].concat();
    assert_eq!(data, [gathered], "answers ready together go out together");
    assert_eq!(trailers[&GRPC_STATUS], "0");

    let failed = answer(answers(vec![Ok(Bytes::from_static(b"one")), Err(Status::invalid_argument("bad text"))]));
    let (data, trailers) = frames(failed).await;
    assert_eq!(data, [framed(b"one")]);
    let status = Status::from_header_map(&trailers).unwrap();
    assert_eq!((status.code(), status.message()), (Code::InvalidArgument, "bad text"));

    let refused = answer(Err(Status::resource_exhausted("full")));
    let status = Status::from_header_map(refused.headers()).unwrap();
    assert_eq!(status.code(), Code::ResourceExhausted, "trailers-only");
    assert!(frames(refused).await.0.is_empty());
}
