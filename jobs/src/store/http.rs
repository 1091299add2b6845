//! object_store's HTTP transport for S3, over hyper with rustls on ring: the workspace's own client
//! stack. object_store's built-in transport is reqwest, whose TLS would bring a second crypto
//! provider (aws-lc-rs) into every crate's rustls.
//!
//! An error answer's body never reaches object_store: S3 servers put the access key id, the
//! string they signed and the request's names in it, and object_store quotes the body in its
//! errors, which become the worker's last line, the job's status and its Events. Only the S3
//! error code is kept (what object_store's retries look for), with the status in the head.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use http_body_util::BodyExt as _;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector as TcpConnector;
use hyper_util::rt::TokioExecutor;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpRequestBody, HttpResponse, HttpResponseBody,
    HttpService,
};
use object_store::{ClientConfigKey, ClientOptions};

/// How long connecting may take (object_store's own default).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a request may wait for the response's head, beyond sending its body. Response bodies
/// stream after the head: a large object may take longer to arrive, and object_store retries a
/// body cut off midway.
const RESPONSE_HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// The slowest upload allowed for: a part is put in one request, and its response comes only once
/// all of it is sent, so a large part gets a second more per MiB.
const SLOWEST_UPLOAD_BYTES_PER_SECOND: u64 = 1 << 20;
/// How much of an error answer's body is read to find its `<Code>`: S3's error documents are a
/// few hundred bytes, and a server sending more is not waited on or held.
const ERROR_BODY_LIMIT: usize = 16 << 10;
/// The longest S3 error code kept (AWS's longest are about 40 characters).
const ERROR_CODE_LIMIT: usize = 64;

/// Makes object_store's S3 client speak through hyper: `https://` endpoints with the system's
/// root certificates, `http://` ones when the store allows plain HTTP.
#[derive(Debug, Default, Clone, Copy)]
pub struct HyperConnector;

impl HttpConnector for HyperConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let allow_http = options.get_config_value(&ClientConfigKey::AllowHttp).is_some_and(|value| value == "true");
        let mut tcp = TcpConnector::new();
        tcp.set_connect_timeout(Some(CONNECT_TIMEOUT));
        // The TLS layer decides which schemes pass; the TCP layer below it sees both.
        tcp.enforce_http(false);
        let client = match HttpsConnectorBuilder::new().with_native_roots() {
            Ok(builder) => {
                let builder = if allow_http { builder.https_or_http() } else { builder.https_only() };
                Transport::Tls(Client::builder(TokioExecutor::new()).build(builder.enable_http1().wrap_connector(tcp)))
            }
            // A plain-HTTP endpoint (an in-cluster SeaweedFS or MinIO) needs no roots, and slim
            // images may have none: serve it without TLS rather than refuse to start.
            Err(error) if allow_http => {
                tracing::warn!(%error, "no CA certificates: only plain-HTTP S3 endpoints will work");
                Transport::PlainOnly(Client::builder(TokioExecutor::new()).build(tcp))
            }
            Err(error) => {
                return Err(object_store::Error::Generic {
                    store: "S3",
                    source: format!("loading the system's CA certificates for https: {error}").into(),
                });
            }
        };
        Ok(HttpClient::new(client))
    }
}

/// The hyper client, with or without TLS.
#[derive(Debug, Clone)]
enum Transport {
    Tls(Client<HttpsConnector<TcpConnector>, HttpRequestBody>),
    PlainOnly(Client<TcpConnector, HttpRequestBody>),
}

impl Transport {
    async fn send(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        let upload = request.body().content_length() as u64 / SLOWEST_UPLOAD_BYTES_PER_SECOND;
        let head_timeout = RESPONSE_HEAD_TIMEOUT + Duration::from_secs(upload);
        let pending = match self {
            Self::Tls(client) => client.request(request),
            Self::PlainOnly(client) => client.request(request),
        };
        let response = match tokio::time::timeout(head_timeout, pending).await {
            Ok(Ok(response)) => response,
            Ok(Err(error)) => {
                let kind = if error.is_connect() { HttpErrorKind::Connect } else { HttpErrorKind::Request };
                return Err(HttpError::new(kind, error));
            }
            Err(elapsed) => return Err(HttpError::new(HttpErrorKind::Timeout, elapsed)),
        };
        let (head, body) = response.into_parts();
        if head.status.is_client_error() || head.status.is_server_error() {
            let code = tokio::time::timeout(RESPONSE_HEAD_TIMEOUT, error_code(body)).await.ok().flatten();
            return Ok(HttpResponse::from_parts(head, HttpResponseBody::from(error_document(code.as_deref()))));
        }
        let body = body.map_err(|error| {
            // A body cut off midway is retried by object_store (for idempotent requests).
            let kind = if error.is_timeout() { HttpErrorKind::Timeout } else { HttpErrorKind::Interrupted };
            HttpError::new(kind, error)
        });
        Ok(HttpResponse::from_parts(head, HttpResponseBody::new(body)))
    }
}

/// The `<Code>` of an S3 error document, from at most [`ERROR_BODY_LIMIT`] bytes of the body;
/// `None` when there is none, or it is not a plain code.
async fn error_code(mut body: hyper::body::Incoming) -> Option<String> {
    let mut read = Vec::new();
    while read.len() < ERROR_BODY_LIMIT {
        let Some(Ok(frame)) = body.frame().await else { break };
        if let Ok(data) = frame.into_data() {
            read.extend_from_slice(&data[..data.len().min(ERROR_BODY_LIMIT - read.len())]);
        }
    }
    code_of(&read)
}

/// The text between the first `<Code>` and `</Code>`, if it is a plain code (letters, digits,
/// `.`, `-`, `_`): anything else could be the echo of something secret, and is dropped.
fn code_of(body: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(body);
    let start = text.find("<Code>")? + "<Code>".len();
    let code = &text[start..start + text[start..].find("</Code>")?];
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
    (!code.is_empty() && code.len() <= ERROR_CODE_LIMIT && code.chars().all(plain)).then(|| code.to_owned())
}

/// What object_store is handed in place of an error answer's body: S3's error document with the
/// code alone (one line, so the worker's one-line error stays readable).
fn error_document(code: Option<&str>) -> String {
    format!("<Error><Code>{}</Code></Error>", code.unwrap_or("Unknown"))
}

// Written out by hand: the trait is declared with `async_trait`, whose expansion is this signature.
impl HttpService for Transport {
    fn call<'this, 'future>(
        &'this self,
        request: HttpRequest,
    ) -> Pin<Box<dyn Future<Output = Result<HttpResponse, HttpError>> + Send + 'future>>
    where
        'this: 'future,
        Self: 'future,
    {
        Box::pin(self.send(request))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connects_with_and_without_plain_http() {
        let with_http = ClientOptions::new().with_allow_http(true);
        assert!(HyperConnector.connect(&with_http).is_ok());
        // Without plain HTTP it needs the system's roots; where the machine has some, it connects.
        let https_only = HyperConnector.connect(&ClientOptions::new());
        let has_roots = HttpsConnectorBuilder::new().with_native_roots().is_ok();
        assert_eq!(https_only.is_ok(), has_roots);
    }

    #[tokio::test]
    async fn a_response_comes_back_head_and_body() {
        let (addr, head) = answer_once(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello".to_vec()).await;
        let client = HyperConnector.connect(&ClientOptions::new().with_allow_http(true)).unwrap();
        let request = http::Request::get(format!("http://{addr}/bucket/key")).body(HttpRequestBody::empty()).unwrap();
        let response = client.execute(request).await.unwrap();
        assert_eq!(response.status(), http::StatusCode::OK);
        assert_eq!(response.into_body().bytes().await.unwrap(), "hello");
        assert!(head.await.unwrap().starts_with("GET /bucket/key HTTP/1.1\r\n"));
    }

    /// SeaweedFS's answer to a request signed with the wrong secret (as AWS's, it quotes the key
    /// id and what was signed).
    const SIGNATURE_MISMATCH: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SignatureDoesNotMatch</Code>\
        <Message>The request signature we calculated does not match the signature you provided.</Message>\
        <AWSAccessKeyId>AKIAEXAMPLEKEYID0001</AWSAccessKeyId><StringToSign>AWS4-HMAC-SHA256 secret-ish</StringToSign>\
        <Resource>/corpus/in/a.parquet</Resource><RequestId>1</RequestId></Error>";

    /// Serves one HTTP/1.1 answer to one request on a port of its own; the request's head comes
    /// back from the task.
    async fn answer_once(response: Vec<u8>) -> (std::net::SocketAddr, tokio::task::JoinHandle<String>) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let served = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buffer = [0u8; 1024];
            while !head.windows(4).any(|window| window == b"\r\n\r\n") {
                let read = socket.read(&mut buffer).await.unwrap();
                head.extend_from_slice(&buffer[..read]);
            }
            let _ = socket.write_all(&response).await;
            String::from_utf8_lossy(&head).into_owned()
        });
        (addr, served)
    }

    #[tokio::test]
    async fn an_error_answer_keeps_its_status_and_code_and_nothing_else() {
        let response = format!(
            "HTTP/1.1 403 Forbidden\r\ncontent-length: {}\r\n\r\n{SIGNATURE_MISMATCH}",
            SIGNATURE_MISMATCH.len()
        );
        let (addr, _) = answer_once(response.into_bytes()).await;
        let client = HyperConnector.connect(&ClientOptions::new().with_allow_http(true)).unwrap();
        let request = http::Request::get(format!("http://{addr}/corpus/in")).body(HttpRequestBody::empty()).unwrap();
        let response = client.execute(request).await.unwrap();
        assert_eq!(response.status(), http::StatusCode::FORBIDDEN);
        let body = response.into_body().bytes().await.unwrap();
        assert_eq!(body, "<Error><Code>SignatureDoesNotMatch</Code></Error>");
    }

    #[tokio::test]
    async fn a_huge_or_odd_error_body_is_not_held_or_echoed() {
        // A body of 100 MB is announced; the transport reads 16 KiB of it and answers.
        let mut response = b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 100000000\r\n\r\n".to_vec();
        response.extend(std::iter::repeat_n(b'x', 64 << 10));
        let (addr, _) = answer_once(response).await;
        let client = HyperConnector.connect(&ClientOptions::new().with_allow_http(true)).unwrap();
        let request = http::Request::get(format!("http://{addr}/b")).body(HttpRequestBody::empty()).unwrap();
        let response = client.execute(request).await.unwrap();
        assert_eq!(response.into_body().bytes().await.unwrap(), "<Error><Code>Unknown</Code></Error>");

        assert_eq!(code_of(b"<Error><Code>NoSuchKey</Code></Error>").as_deref(), Some("NoSuchKey"));
        assert_eq!(code_of(b"<Code>AKIA secret</Code>"), None, "not a plain code");
        assert_eq!(code_of(b"<Code></Code>"), None);
        assert_eq!(code_of(b"<Code>unterminated"), None);
        assert_eq!(code_of(format!("<Code>{}</Code>", "A".repeat(65)).as_bytes()), None);
    }

    #[tokio::test]
    async fn an_unreachable_endpoint_is_a_connect_error() {
        let client = HyperConnector.connect(&ClientOptions::new().with_allow_http(true)).unwrap();
        // Port 9 (discard) on loopback: nothing listens there, so the connection is refused.
        let request = http::Request::get("http://127.0.0.1:9/bucket").body(HttpRequestBody::empty()).unwrap();
        let error = client.execute(request).await.unwrap_err();
        assert_eq!(error.kind(), HttpErrorKind::Connect, "{error}");
    }
}
