use std::future::poll_fn;
use std::sync::Mutex as StdMutex;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, DuplexStream};

use super::*;

/// A socket that keeps each write it was given, so a test sees how h2's bytes were cut.
struct Recorded {
    io: DuplexStream,
    writes: Arc<StdMutex<Vec<Vec<u8>>>>,
}

impl Recorded {
    fn new(io: DuplexStream) -> (Self, Arc<StdMutex<Vec<Vec<u8>>>>) {
        let writes = Arc::default();
        (Self { io, writes: Arc::clone(&writes) }, writes)
    }
}

impl AsyncRead for Recorded {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Recorded {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let written = ready!(Pin::new(&mut self.io).poll_write(cx, buf))?;
        self.writes.lock().unwrap().push(buf[..written].to_vec());
        Poll::Ready(Ok(written))
    }

    /// One write of all the slices, as `writev` is one system call.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let all: Vec<u8> = bufs.iter().flat_map(|buf| buf.iter().copied()).collect();
        self.poll_write(cx, &all)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[tokio::test]
async fn writes_are_held_until_uncorked_then_leave_in_one_write() {
    let (near, mut far) = tokio::io::duplex(1 << 20);
    let (recorded, writes) = Recorded::new(near);
    let (mut corked, uncork) = cork(recorded);
    corked.write_all(b"headers,").await.unwrap();
    let written = corked.write_vectored(&[IoSlice::new(b"message,"), IoSlice::new(b"trailers")]).await.unwrap();
    assert_eq!(written, 16, "every slice taken at once");
    corked.flush().await.unwrap();
    assert!(writes.lock().unwrap().is_empty(), "nothing reaches the socket before the uncork");
    poll_fn(|cx| {
        uncork.poll_send(cx);
        Poll::Ready(())
    })
    .await;
    assert_eq!(*writes.lock().unwrap(), [b"headers,message,trailers".to_vec()]);
    let mut read = [0; 24];
    far.read_exact(&mut read).await.unwrap();
    assert_eq!(&read, b"headers,message,trailers");
}

#[tokio::test]
async fn a_peer_that_stops_reading_holds_the_writer_back_near_the_limit() {
    let (near, mut far) = tokio::io::duplex(1024);
    let (mut corked, _uncork) = cork(near);
    let chunk = vec![1u8; 16 * 1024];
    let mut accepted = 0;
    // At the limit a write sends first; the peer takes only what its buffer holds, and the
    // writer waits.
    while tokio::time::timeout(Duration::from_millis(50), corked.write_all(&chunk)).await.is_ok() {
        accepted += chunk.len();
        assert!(accepted <= HELD_LIMIT + 2 * chunk.len(), "{accepted} bytes taken from a writer nobody reads");
    }
    let held = lock(&corked.shared).held.len();
    assert!(held <= HELD_LIMIT + chunk.len(), "at most one write past the limit is held: {held}");
    let reading = tokio::spawn(async move {
        let mut all = Vec::new();
        far.read_to_end(&mut all).await.unwrap();
        all
    });
    corked.write_all(&chunk).await.unwrap();
    corked.shutdown().await.unwrap();
    let all = reading.await.unwrap();
    assert_eq!(all.len(), accepted + chunk.len(), "every byte, then the end");
    assert!(all.iter().all(|byte| *byte == 1));
}

#[tokio::test]
async fn shutting_down_sends_what_is_held_first() {
    let (near, mut far) = tokio::io::duplex(1 << 20);
    let (mut corked, _uncork) = cork(near);
    corked.write_all(b"GOAWAY").await.unwrap();
    corked.shutdown().await.unwrap();
    let mut all = Vec::new();
    far.read_to_end(&mut all).await.unwrap();
    assert_eq!(all, b"GOAWAY");
}

#[tokio::test]
async fn a_socket_that_failed_fails_h2s_next_write() {
    let (near, far) = tokio::io::duplex(1024);
    drop(far);
    let (mut corked, uncork) = cork(near);
    corked.write_all(b"answer").await.unwrap();
    poll_fn(|cx| {
        uncork.poll_send(cx);
        Poll::Ready(())
    })
    .await;
    assert_eq!(corked.write_all(b"more").await.unwrap_err().kind(), io::ErrorKind::BrokenPipe);
    assert!(corked.flush().await.is_err(), "and every write after it");
}

trait Transport: AsyncRead + AsyncWrite + Send {}

impl<T: AsyncRead + AsyncWrite + Send> Transport for T {}

/// A TLS stream in miniature: what it is given waits in its own buffer until a flush, and its
/// first flush finds the socket full.
struct FlushesLate {
    records: Vec<u8>,
    sent: Vec<u8>,
    flushes: usize,
}

impl AsyncWrite for FlushesLate {
    fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.records.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.flushes += 1;
        if self.flushes == 1 {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let records = std::mem::take(&mut self.records);
        self.sent.extend(records);
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[tokio::test]
async fn a_flush_the_socket_put_off_is_tried_again_at_the_next_uncork() {
    let (mut corked, uncork) = cork(FlushesLate { records: Vec::new(), sent: Vec::new(), flushes: 0 });
    corked.write_all(b"answer").await.unwrap();
    let uncorked = || {
        poll_fn(|cx| {
            uncork.poll_send(cx);
            Poll::Ready(())
        })
    };
    uncorked().await;
    assert!(lock(&uncork.shared).io.sent.is_empty(), "the socket was full");
    // Nothing new was written, and the records still wait: the task, woken, sends them.
    uncorked().await;
    assert_eq!(lock(&uncork.shared).io.sent, b"answer");
}

/// h2's server answering one call with headers, a 4 KB message and trailers; which of the
/// socket's writes carried the message's DATA frame and which the trailers.
async fn writes_of_an_answer(corked: bool) -> (usize, usize) {
    let (client_io, server_io) = tokio::io::duplex(1 << 20);
    let (recorded, writes) = Recorded::new(server_io);
    let server = tokio::spawn(async move {
        let (io, uncork): (Pin<Box<dyn Transport>>, _) = if corked {
            let (io, uncork) = cork(recorded);
            (Box::pin(io), Some(uncork))
        } else {
            (Box::pin(recorded), None)
        };
        let mut connection = h2::server::handshake(io).await.unwrap();
        let mut accept = |cx: &mut Context<'_>| {
            let accepted = connection.poll_accept(cx);
            if let Some(uncork) = &uncork {
                uncork.poll_send(cx);
            }
            accepted
        };
        let (_, mut respond) = poll_fn(&mut accept).await.unwrap().unwrap();
        let mut answer = respond.send_response(Response::new(()), false).unwrap();
        answer.reserve_capacity(4096);
        answer.send_data(Bytes::from(vec![7u8; 4096]), false).unwrap();
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        answer.send_trailers(trailers).unwrap();
        while poll_fn(&mut accept).await.is_some() {}
    });
    let (client, connection) = h2::client::handshake(client_io).await.unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let (answer, _) =
        client.send_request(Request::post("http://sidecar/tei.v1.Embed/Embed").body(()).unwrap(), true).unwrap();
    let mut body = answer.await.unwrap().into_body();
    let mut received = 0;
    while let Some(data) = body.data().await {
        let data = data.unwrap();
        body.flow_control().release_capacity(data.len()).unwrap();
        received += data.len();
    }
    assert_eq!(received, 4096);
    assert_eq!(body.trailers().await.unwrap().unwrap()["grpc-status"], "0");
    drop((client, body));
    server.await.unwrap();
    let writes = writes.lock().unwrap().clone();
    (
        write_holding(&writes, |kind, flags| kind == DATA && flags == 0),
        write_holding(&writes, |kind, flags| kind == HEADERS && flags & END_STREAM != 0),
    )
}

const DATA: u8 = 0;
const HEADERS: u8 = 1;
const END_STREAM: u8 = 1;

/// The index of the write in which stream 1's first frame that `is` begins.
fn write_holding(writes: &[Vec<u8>], is: impl Fn(u8, u8) -> bool) -> usize {
    let mut frames = Vec::new();
    let all: Vec<u8> = writes
        .iter()
        .enumerate()
        .flat_map(|(index, write)| {
            frames.extend(std::iter::repeat_n(index, write.len()));
            write.iter().copied()
        })
        .collect();
    let mut at = 0;
    while at + 9 <= all.len() {
        let length = usize::from(all[at]) << 16 | usize::from(all[at + 1]) << 8 | usize::from(all[at + 2]);
        let stream = u32::from_be_bytes([all[at + 5], all[at + 6], all[at + 7], all[at + 8]]) & 0x7fff_ffff;
        if stream == 1 && is(all[at + 3], all[at + 4]) {
            return frames[at];
        }
        at += 9 + length;
    }
    panic!("no such frame in {} writes", writes.len());
}

#[tokio::test]
async fn an_answers_message_and_trailers_leave_in_one_write() {
    let (message, trailers) = writes_of_an_answer(true).await;
    assert_eq!(message, trailers, "corked: the message and its trailers in one write");
    // Why this module exists: h2 alone flushes its message before it writes the trailers.
    let (message, trailers) = writes_of_an_answer(false).await;
    assert!(message < trailers, "h2 alone: the trailers in a later write than the message");
}
