//! A `teifleet-batch` server on 127.0.0.1:0 over a temporary directory store, with an in-memory
//! cluster, and a plain HTTP/1.1 client (hyper's) that sends what a test writes, byte for byte.

#![allow(dead_code)]

pub mod cluster;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt as _;
use futures::channel::mpsc;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::{HeaderMap, Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use serde_json::Value;
use teifleet_batch::auth::Keys;
use teifleet_batch::server::{self, AppState, JobDefaults, JobStore, Limits};
use teifleet_batch::store::FileStore;
use teifleet_job::store::Store;

pub use cluster::FakeCluster;

pub type Body = BoxBody<Bytes, Infallible>;

/// Tenant `a`'s key and tenant `b`'s.
pub const KEY_A: &str = "key-of-tenant-a-0001";
pub const KEY_B: &str = "key-of-tenant-b-0001";

pub struct TestServer {
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    pub cluster: Arc<FakeCluster>,
    client: Client<HttpConnector, Body>,
    _keys_dir: tempfile::TempDir,
}

/// An answer: status, headers and the whole body.
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(&self.body)))
    }

    /// The OpenAI error's message, asserting the error's shape.
    pub fn error(&self) -> (String, Value, Value) {
        let json = self.json();
        let error = &json["error"];
        assert_eq!(json.as_object().unwrap().len(), 1, "{json}");
        assert!(error["type"].is_string() && error.get("param").is_some() && error.get("code").is_some(), "{json}");
        (error["message"].as_str().unwrap().to_owned(), error["param"].clone(), error["code"].clone())
    }
}

impl TestServer {
    /// A server with tenants `a` and `b`, `limits`, and `pools` (name, model id).
    pub async fn start(limits: Limits, pools: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = Path::from_absolute_path(dir.path()).unwrap();
        let store = Store::new(Arc::new(LocalFileSystem::new()), root, true, "file:///");
        Self::start_on(store, dir, limits, pools).await
    }

    /// A server on `store` (`dir` is the test's scratch directory).
    pub async fn start_on(store: Store, dir: tempfile::TempDir, limits: Limits, pools: &[(&str, &str)]) -> Self {
        let keys_dir = tempfile::tempdir().unwrap();
        std::fs::write(keys_dir.path().join("a"), format!("{KEY_A}\n")).unwrap();
        std::fs::write(keys_dir.path().join("b"), format!("{KEY_B}\n")).unwrap();
        let keys = Keys::watch(keys_dir.path().to_owned(), teifleet_batch::auth::RELOAD_EVERY).unwrap();
        let cluster = Arc::new(FakeCluster::new(pools));
        let jobs = JobDefaults {
            store: JobStore::Pvc { claim: "batch".into(), path: "api".into() },
            workers: 2,
            api_key_secret: None,
            template: None,
        };
        let state = AppState::new(FileStore::new(store), keys, cluster.clone(), limits, jobs);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(server::serve(listener, server::router(state), std::future::pending()));
        let client = Client::builder(TokioExecutor::new()).build_http();
        Self { addr, dir, cluster, client, _keys_dir: keys_dir }
    }

    /// Sends a request with `body` and reads the whole answer.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        key: Option<&str>,
        content_type: Option<&str>,
        body: Body,
    ) -> Answer {
        let mut request = Request::builder().method(method).uri(format!("http://{}{path}", self.addr));
        if let Some(key) = key {
            request = request.header("authorization", format!("Bearer {key}"));
        }
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        let response = self.client.request(request.body(body).unwrap()).await.unwrap();
        let (parts, body) = response.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Answer { status: parts.status, headers: parts.headers, body }
    }

    pub async fn get(&self, path: &str, key: &str) -> Answer {
        self.send(Method::GET, path, Some(key), None, full(Bytes::new())).await
    }

    pub async fn delete(&self, path: &str, key: &str) -> Answer {
        self.send(Method::DELETE, path, Some(key), None, full(Bytes::new())).await
    }

    pub async fn post_json(&self, path: &str, key: &str, json: &Value) -> Answer {
        self.send(Method::POST, path, Some(key), Some("application/json"), full(json.to_string().into())).await
    }

    /// Uploads `content` as `purpose`, the fields in that order.
    pub async fn upload(&self, key: &str, purpose: &str, content: &[u8]) -> Answer {
        let form = Form::new().text("purpose", purpose).file("file", "requests.jsonl", content);
        self.upload_form(key, form).await
    }

    pub async fn upload_form(&self, key: &str, form: Form) -> Answer {
        let content_type = form.content_type();
        self.send(Method::POST, "/v1/files", Some(key), Some(&content_type), full(form.finish().into())).await
    }

    /// Files under the store's root, relative, sorted (staged uploads among them).
    pub fn stored(&self) -> Vec<String> {
        fn walk(dir: &std::path::Path, root: &std::path::Path, found: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    walk(&path, root, found);
                } else {
                    found.push(path.strip_prefix(root).unwrap().display().to_string());
                }
            }
        }
        let mut found = Vec::new();
        walk(self.dir.path(), self.dir.path(), &mut found);
        found.sort();
        found
    }
}

pub fn full(bytes: Bytes) -> Body {
    Full::new(bytes).boxed()
}

/// A body whose chunks the test sends when it wants: it stays open until the sender is dropped.
pub fn streamed() -> (mpsc::UnboundedSender<Bytes>, Body) {
    let (sender, receiver) = mpsc::unbounded::<Bytes>();
    let body = StreamBody::new(receiver.map(|chunk| Ok::<_, Infallible>(Frame::data(chunk))));
    (sender, BodyExt::boxed(body))
}

/// A multipart/form-data body, written by hand so a test can also write it wrong.
pub struct Form {
    boundary: String,
    body: Vec<u8>,
}

impl Form {
    pub fn new() -> Self {
        Self { boundary: "teifleet-test-boundary-7d1f".to_owned(), body: Vec::new() }
    }

    pub fn content_type(&self) -> String {
        format!("multipart/form-data; boundary={}", self.boundary)
    }

    pub fn text(mut self, name: &str, value: &str) -> Self {
        self.body.extend_from_slice(
            format!("--{}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n", self.boundary)
                .as_bytes(),
        );
        self
    }

    pub fn file(mut self, name: &str, filename: &str, content: &[u8]) -> Self {
        self.body.extend_from_slice(self.file_head(name, filename).as_bytes());
        self.body.extend_from_slice(content);
        self.body.extend_from_slice(b"\r\n");
        self
    }

    /// A file part's headers, for a test that streams the content itself.
    pub fn file_head(&self, name: &str, filename: &str) -> String {
        format!(
            "--{}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{filename}\"\r\nContent-Type: application/jsonl\r\n\r\n",
            self.boundary
        )
    }

    /// The closing boundary.
    pub fn tail(&self) -> String {
        format!("--{}--\r\n", self.boundary)
    }

    pub fn finish(mut self) -> Vec<u8> {
        let tail = self.tail();
        self.body.extend_from_slice(tail.as_bytes());
        self.body
    }

    /// The body so far, without its closing boundary (a truncated upload).
    pub fn unfinished(self) -> Vec<u8> {
        self.body
    }
}

/// One batch request line.
pub fn request_line(custom_id: &str, model: &str, input: &str) -> String {
    serde_json::json!({
        "custom_id": custom_id, "method": "POST", "url": "/v1/embeddings",
        "body": { "model": model, "input": input },
    })
    .to_string()
}
