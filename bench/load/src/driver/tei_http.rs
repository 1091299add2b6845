//! The HTTP driver: TEI's HTTP API (`POST /embed`, `GET /info`) over HTTP/1.1 keep-alive
//! connections, as TEI's HTTP clients (requests, the OpenAI SDK's httpx) call it: a connection
//! per request in flight, opened when needed and reused after. The run's headers go as HTTP
//! headers, its deadline as `x-teifleet-timeout-ms`. An answer is counted under the gRPC code its
//! status stands for (the inverse of the multiplexer's mapping in docs/multiplexer.md), so the
//! reports of both protocols read alike.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use teifleet_wire::headers;
use tonic::Code;

use super::attempt::Attempt;
use crate::retry::Hint;
use crate::{Error, Result};

/// One client for the whole run: its pool holds the keep-alive connections.
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// How long opening a connection may take, as the gRPC driver's `connect_timeout`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The routes a run calls, parsed once.
#[derive(Clone, Debug)]
pub struct Routes {
    embed: Uri,
    info: Uri,
    health: Uri,
}

impl Routes {
    pub fn new(target: &str) -> Result<Self> {
        let uri = |path: &str| {
            format!("{}{path}", target.trim_end_matches('/'))
                .parse::<Uri>()
                .map_err(|e| Error::InvalidArgument(format!("--target {target:?} is not a URL: {e}")))
        };
        Ok(Self { embed: uri("/embed")?, info: uri("/info")?, health: uri("/health")? })
    }
}

pub fn client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
    Client::builder(TokioExecutor::new()).build(connector)
}

/// Fails unless the target answers HTTP at all (any status: a draining server is reachable),
/// as the gRPC driver fails when it cannot connect.
pub async fn check(client: &HttpClient, routes: &Routes) -> Result<()> {
    let request = Request::get(routes.health.clone()).body(Full::default()).map_err(|e| unreachable(routes, e))?;
    let answer = tokio::time::timeout(CONNECT_TIMEOUT, client.request(request))
        .await
        .map_err(|_| unreachable(routes, "no answer in 5 s"))?;
    answer.map(drop).map_err(|e| unreachable(routes, e))
}

fn unreachable(routes: &Routes, reason: impl std::fmt::Display) -> Error {
    let target = routes.health.authority().map_or_else(String::new, ToString::to_string);
    Error::HttpConnect { target, reason: reason.to_string() }
}

/// What one HTTP request carries besides its body.
pub struct Headers<'a> {
    pub priority: Option<&'a str>,
    pub tenant: Option<&'a str>,
    pub pool: Option<&'a str>,
    pub lane: Option<&'a str>,
    /// What is left of the call's deadline.
    pub timeout: Option<Duration>,
}

/// `POST /embed` of one text, truncated as the gRPC driver asks (`truncate: true`).
pub async fn embed(client: &HttpClient, routes: &Routes, text: &str, headers: Headers<'_>) -> Attempt {
    let body = serde_json::json!({ "inputs": text, "truncate": true }).to_string();
    send(client, Method::POST, &routes.embed, Full::new(Bytes::from(body)), headers).await
}

/// `GET /info`: the path alone, as `tei.v1.Info` is for gRPC.
pub async fn info(client: &HttpClient, routes: &Routes, headers: Headers<'_>) -> Attempt {
    send(client, Method::GET, &routes.info, Full::default(), headers).await
}

async fn send(client: &HttpClient, method: Method, uri: &Uri, body: Full<Bytes>, headers: Headers<'_>) -> Attempt {
    let mut request = Request::builder().method(method).uri(uri.clone());
    if let Some(p) = headers.priority {
        request = request.header(headers::PRIORITY, p);
    }
    if let Some(t) = headers.tenant {
        request = request.header(headers::TENANT, t);
    }
    if let Some(p) = headers.pool {
        request = request.header(headers::POOL, p);
    }
    if let Some(l) = headers.lane {
        request = request.header(headers::LANE, l);
    }
    if let Some(left) = headers.timeout {
        // Whole milliseconds, rounded up so the server never gets less than the client waits.
        let millis = left.as_micros().div_ceil(1000).max(1);
        request = request.header(headers::TIMEOUT_MS, millis.to_string());
    }
    let request = match request.header(http::header::CONTENT_TYPE, "application/json").body(body) {
        Ok(request) => request,
        Err(_) => return Attempt::refused(Code::Internal, Hint::Absent),
    };
    let response = match client.request(request).await {
        Ok(response) => response,
        // A connection that could not be made or broke: what gRPC calls UNAVAILABLE.
        Err(_) => return Attempt::refused(Code::Unavailable, Hint::Absent),
    };
    let (parts, body) = response.into_parts();
    // The whole answer is read, as a client must before it can use it (not parsed: that is the
    // client's own CPU, not the path being measured).
    if body.collect().await.is_err() {
        return Attempt::refused(Code::Unavailable, Hint::Absent).committed();
    }
    let code = code_of(parts.status);
    if code == Code::Ok {
        return Attempt::ok(vec![]);
    }
    let hint = parts.headers.get(headers::RETRY_PUSHBACK_MS).map(HeaderValue::to_str);
    Attempt::refused(code, Hint::parse(hint.and_then(std::result::Result::ok)))
}

/// The gRPC code an HTTP status stands for, as the multiplexer maps its errors to statuses.
pub fn code_of(status: StatusCode) -> Code {
    match status.as_u16() {
        200..=299 => Code::Ok,
        400 | 413 | 422 => Code::InvalidArgument,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::NotFound,
        424 => Code::FailedPrecondition,
        429 => Code::ResourceExhausted,
        503 => Code::Unavailable,
        504 => Code::DeadlineExceeded,
        _ => Code::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_count_under_the_codes_the_multiplexer_maps_them_from() {
        assert_eq!(code_of(StatusCode::OK), Code::Ok);
        assert_eq!(code_of(StatusCode::TOO_MANY_REQUESTS), Code::ResourceExhausted);
        assert_eq!(code_of(StatusCode::GATEWAY_TIMEOUT), Code::DeadlineExceeded);
        assert_eq!(code_of(StatusCode::SERVICE_UNAVAILABLE), Code::Unavailable);
        assert_eq!(code_of(StatusCode::PAYLOAD_TOO_LARGE), Code::InvalidArgument);
        assert_eq!(code_of(StatusCode::FAILED_DEPENDENCY), Code::FailedPrecondition);
        assert_eq!(code_of(StatusCode::INTERNAL_SERVER_ERROR), Code::Unknown);
    }

    #[test]
    fn routes_are_under_the_target() {
        let routes = Routes::new("http://127.0.0.1:8000/").unwrap();
        assert_eq!(routes.embed, "http://127.0.0.1:8000/embed");
        assert_eq!(routes.info, "http://127.0.0.1:8000/info");
    }
}
