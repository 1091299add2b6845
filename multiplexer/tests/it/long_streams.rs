//! A long stream of small messages, each in a DATA frame of its own, sent in bursts as fast as the
//! client can while the pool admits them a few at a time: every message is answered, in order, on
//! a connection that stays open. h2 closes a connection whose readers leave too many small frames
//! unread (GOAWAY `ENHANCE_YOUR_CALM` "too_many_data_frames"): here, unread, they would cost
//! several times the sidecar's budget for them; the sidecar drains a stream's frames as they come
//! (`front::grpc::server::drained`).

use std::time::Duration;

use bytes::Bytes;
use prost::Message as _;
use teifleet_proto::v1;

use crate::support::*;

const MESSAGES: usize = 48_000;
/// Messages a burst: what a fast client writes before the network paces it.
const BURST: usize = 4_000;

#[tokio::test]
async fn thousands_of_small_messages_in_frames_of_their_own_are_all_answered() {
    let sim = sim(|config| config.fixed_latency = Duration::from_millis(1)).await;
    // 48,000 frames of 13 to 16 bytes left unread would cost h2 about 11 MB of its 8 MiB budget.
    // A few in flight: most messages wait for a permit while the client keeps sending.
    let (mux, _) = mux(sim.addr(), limits(16, 64)).await;
    let tcp = tokio::net::TcpStream::connect(mux.grpc_addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    let connection = tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let request = http::Request::post(format!("http://{}/tei.v1.Embed/EmbedStream", mux.grpc_addr))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (answer, mut send) = client.send_request(request, false).unwrap();
    let sending = tokio::spawn(async move {
        for i in 0..MESSAGES {
            let message = v1::EmbedRequest { inputs: format!("m{i}"), ..Default::default() }.encode_to_vec();
            let framed: Bytes = teifleet_multiplexer::vocab::framing::framed(&message);
            send.reserve_capacity(framed.len());
            while send.capacity() < framed.len() {
                match std::future::poll_fn(|cx| send.poll_capacity(cx)).await {
                    Some(Ok(_)) => {}
                    other => panic!("no window to send message {i}: {other:?}"),
                }
            }
            send.send_data(framed, false).unwrap();
            if i % BURST == BURST - 1 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        send.send_data(Bytes::new(), true).unwrap();
    });
    let answer = match answer.await {
        Ok(answer) => answer,
        Err(error) => panic!("the stream is not answered: {error:?}; the connection: {:?}", connection.await),
    };
    assert_eq!(answer.status(), 200);
    let mut body = answer.into_body();
    let mut messages = teifleet_multiplexer::vocab::framing::Messages::new(
        1 << 20,
        teifleet_multiplexer::vocab::framing::Side::Answer,
    );
    let mut answered = 0;
    while let Some(data) = body.data().await {
        let data = data.expect("the connection stays open");
        let _ = body.flow_control().release_capacity(data.len());
        messages.push(data);
        while let Some(message) = messages.take().unwrap() {
            v1::EmbedResponse::decode(message).expect("an EmbedResponse");
            answered += 1;
        }
    }
    let trailers = body.trailers().await.expect("trailers").expect("a status");
    assert_eq!(trailers["grpc-status"], "0", "{trailers:?}");
    assert_eq!(answered, MESSAGES);
    sending.await.unwrap();
    assert_eq!(sim.stats().requests_received, MESSAGES as u64);
    assert!(!connection.is_finished(), "the connection is still open");
}
