//! A minimal HTTP/1.0 client for admin ports (metrics, probes, the simulator's counters and
//! faults) and small JSON requests, with no HTTP client dependency. HTTP/1.0 so the answer ends when the server closes the
//! connection, with no chunked encoding to undo.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// An exchange that takes longer than this counts as no answer.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// A status and a body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: String,
}

/// Sends `method path` with an empty body; `None` when nothing (or no HTTP) answers in [`TIMEOUT`].
pub async fn request(addr: SocketAddr, method: &str, path: &str) -> Option<Response> {
    send(addr, method, path, &[], "").await
}

/// Sends `method path` with extra `headers` and a JSON `body`; `None` when nothing (or no HTTP)
/// answers in [`TIMEOUT`].
pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Option<Response> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        let mut head = format!("{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: {}\r\n", body.len());
        if !body.is_empty() {
            head.push_str("Content-Type: application/json\r\n");
        }
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        head.push_str(body);
        stream.write_all(head.as_bytes()).await.ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        let status = head.split_whitespace().nth(1)?.parse().ok()?;
        Some(Response { status, body: body.to_owned() })
    };
    tokio::time::timeout(TIMEOUT, exchange).await.ok().flatten()
}

/// The body of a 200 answer to `GET path`; `None` for any other answer or none.
pub async fn get(addr: SocketAddr, path: &str) -> Option<String> {
    ok_body(request(addr, "GET", path).await)
}

/// The body of a 200 answer to `POST path`; `None` for any other answer or none.
pub async fn post(addr: SocketAddr, path: &str) -> Option<String> {
    ok_body(request(addr, "POST", path).await)
}

fn ok_body(response: Option<Response>) -> Option<String> {
    response.filter(|r| r.status == 200).map(|r| r.body)
}

#[cfg(test)]
mod tests {
    use tokio::net::TcpListener;

    use super::*;

    /// A server that answers one connection with `answer`, returning what it was sent.
    async fn answer_once(answer: &'static str) -> (SocketAddr, tokio::task::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let served = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut buffer = [0; 1024];
            let n = stream.read(&mut buffer).await.unwrap();
            stream.write_all(answer.as_bytes()).await.unwrap();
            String::from_utf8_lossy(&buffer[..n]).into_owned()
        });
        (addr, served)
    }

    #[tokio::test]
    async fn reads_status_and_body() {
        let (addr, served) = answer_once("HTTP/1.1 503 Service Unavailable\r\nX: y\r\n\r\ndraining\n").await;
        let response = request(addr, "GET", "/readyz").await.unwrap();
        assert_eq!(response, Response { status: 503, body: "draining\n".into() });
        assert!(served.await.unwrap().starts_with("GET /readyz HTTP/1.0\r\n"));
    }

    #[tokio::test]
    async fn sends_headers_and_a_json_body() {
        let (addr, served) = answer_once("HTTP/1.0 401 Unauthorized\r\n\r\n{}").await;
        let response = send(addr, "POST", "/embed", &[("authorization", "Bearer k")], "{\"inputs\":\"a\"}").await;
        assert_eq!(response.unwrap().status, 401);
        let sent = served.await.unwrap();
        assert!(sent.contains("Content-Length: 14\r\n"), "{sent}");
        assert!(sent.contains("authorization: Bearer k\r\n") && sent.ends_with("\r\n\r\n{\"inputs\":\"a\"}"), "{sent}");
    }

    #[tokio::test]
    async fn get_and_post_keep_only_ok_bodies() {
        let (addr, _) = answer_once("HTTP/1.0 200 OK\r\n\r\nok\n").await;
        assert_eq!(get(addr, "/healthz").await.as_deref(), Some("ok\n"));
        let (addr, served) = answer_once("HTTP/1.0 404 Not Found\r\n\r\n").await;
        assert_eq!(post(addr, "/nope").await, None);
        assert!(served.await.unwrap().starts_with("POST /nope"));
    }

    #[tokio::test]
    async fn nothing_listening_is_no_answer() {
        let closed = crate::net::ClosedPort::new().unwrap();
        assert_eq!(request(closed.addr(), "GET", "/").await, None);
    }
}
