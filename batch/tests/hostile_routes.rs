//! Every route of the batch API attacked the same way, generated from the server's own table
//! (`teifleet_batch::server::routes`): a route added without a row here fails
//! [`every_route_has_its_attacks`], so a new surface cannot arrive unattacked.
//!
//! Each row says how its route answers a caller with no key and one with a wrong key, and each
//! route with an `{id}` is called with ids shaped to reach a path, overflow one or pass for
//! another kind of id; each POST gets bodies that are not what it takes. Every refusal must be
//! OpenAI's error shape with a 4xx, and the server answers its probe afterwards.

mod support;

use bytes::Bytes;
use hyper::{Method, StatusCode};
use support::{KEY_A, TestServer, full};
use teifleet_batch::server::{Limits, routes};

/// How a route treats callers without a valid key.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Guard {
    /// Refused with 401 before anything is read.
    Key,
    /// Open: the kubelet's probe.
    Open,
}

/// The attacks every (path, method) gets, by row.
const ROWS: &[(&str, Method, Guard)] = &[
    ("/v1/files", Method::POST, Guard::Key),
    ("/v1/files", Method::GET, Guard::Key),
    ("/v1/files/{id}", Method::GET, Guard::Key),
    ("/v1/files/{id}", Method::DELETE, Guard::Key),
    ("/v1/files/{id}/content", Method::GET, Guard::Key),
    ("/v1/batches", Method::POST, Guard::Key),
    ("/v1/batches", Method::GET, Guard::Key),
    ("/v1/batches/{id}", Method::GET, Guard::Key),
    ("/v1/batches/{id}/cancel", Method::POST, Guard::Key),
    ("/healthz", Method::GET, Guard::Open),
];

/// Ids that must never name anything: path segments, encodings of them, the right prefix with
/// the wrong digits, another kind's prefix, and one far longer than any id.
fn hostile_ids() -> Vec<String> {
    vec![
        "file-..".into(),
        "..%2F..%2Fetc%2Fpasswd".into(),
        "file-%2E%2E%2Ffiles".into(),
        "file-0123456789abcdef0123456g".into(),
        "file-0123456789ABCDEF01234567".into(),
        "batch_0123456789abcdef0123456".into(),
        "batch_0123456789abcdef01234567%00".into(),
        "file-0123456789abcdef01234567-output".into(),
        format!("file-{}", "a".repeat(4096)),
        "%E2%80%AEfile".into(),
    ]
}

/// Bodies a POST route does not take.
fn hostile_bodies() -> Vec<(Option<&'static str>, Bytes)> {
    vec![
        (Some("application/json"), Bytes::from_static(b"{not json")),
        (Some("application/json"), Bytes::from_static(b"[1,2,3]")),
        (Some("application/json"), Bytes::from(format!("{{\"input_file_id\": \"{}\"}}", "x".repeat(70_000)))),
        (Some("multipart/form-data; boundary=x"), Bytes::from_static(b"--x\r\nContent-Disposition: form-data\r\n")),
        (Some("text/plain"), Bytes::from_static(b"purpose=batch")),
        (None, Bytes::new()),
    ]
}

fn path_with(template: &str, id: &str) -> String {
    template.replace("{id}", id)
}

/// An answer is a refusal in OpenAI's shape with a 4xx status.
fn assert_refused(what: &str, answer: &support::Answer) {
    assert!(answer.status.is_client_error(), "{what}: {} {:?}", answer.status, String::from_utf8_lossy(&answer.body));
    let json: serde_json::Value = serde_json::from_slice(&answer.body)
        .unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {:?}", String::from_utf8_lossy(&answer.body)));
    let error = &json["error"];
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}: {json}");
    assert!(error["type"].is_string(), "{what}: {json}");
}

#[test]
fn every_route_has_its_attacks() {
    let mut served: Vec<(String, Method)> = routes(&Limits::default())
        .iter()
        .flat_map(|route| route.methods.iter().map(|m| (route.path.to_owned(), m.clone())))
        .collect();
    let mut attacked: Vec<(String, Method)> = ROWS.iter().map(|(p, m, _)| ((*p).to_owned(), m.clone())).collect();
    let key = |(path, method): &(String, Method)| format!("{method} {path}");
    served.sort_by_key(key);
    attacked.sort_by_key(key);
    assert_eq!(served, attacked, "every route the server answers has a row of attacks here, and no row is stale");
}

#[tokio::test]
async fn callers_without_a_valid_key_are_refused_on_every_guarded_route() {
    let server = TestServer::start(Limits::default(), &[("bge", "BAAI/bge-small-en-v1.5")]).await;
    for (template, method, guard) in ROWS {
        let path = path_with(template, "file-0123456789abcdef01234567");
        for key in [None, Some("not-a-key-of-anyone-at-all"), Some("")] {
            let answer = server.send(method.clone(), &path, key, None, full(Bytes::new())).await;
            match guard {
                Guard::Key => {
                    assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{method} {path} with {key:?}");
                    assert_refused(&format!("{method} {path} with {key:?}"), &answer);
                }
                Guard::Open => assert_eq!(answer.status, StatusCode::OK, "{method} {path}"),
            }
        }
    }
}

#[tokio::test]
async fn ids_shaped_to_reach_a_path_name_nothing() {
    let server = TestServer::start(Limits::default(), &[("bge", "BAAI/bge-small-en-v1.5")]).await;
    // A real file of tenant a's, so a hostile id that reached a path could find something.
    let line = support::request_line("r1", "BAAI/bge-small-en-v1.5", "x");
    assert_eq!(server.upload(KEY_A, "batch", line.as_bytes()).await.status, StatusCode::OK);
    for (template, method, _) in ROWS.iter().filter(|(p, _, _)| p.contains("{id}")) {
        for id in hostile_ids() {
            let path = path_with(template, &id);
            let answer = server.send(method.clone(), &path, Some(KEY_A), None, full(Bytes::new())).await;
            assert_eq!(answer.status, StatusCode::NOT_FOUND, "{method} {path}");
            assert_refused(&format!("{method} {path}"), &answer);
        }
    }
    let before = server.stored();
    assert!(before.iter().all(|f| f.starts_with("files/")), "{before:?}");
}

#[tokio::test]
async fn bodies_a_post_does_not_take_are_refused_in_openais_shape() {
    let server = TestServer::start(Limits::default(), &[("bge", "BAAI/bge-small-en-v1.5")]).await;
    for (template, method, _) in ROWS.iter().filter(|(_, m, g)| *m == Method::POST && *g == Guard::Key) {
        let path = path_with(template, "batch_0123456789abcdef01234567");
        for (content_type, body) in hostile_bodies() {
            let answer = server.send(method.clone(), &path, Some(KEY_A), content_type, full(body.clone())).await;
            let what = format!(
                "{method} {path} with {content_type:?} {:?}",
                String::from_utf8_lossy(&body[..body.len().min(40)])
            );
            assert_refused(&what, &answer);
        }
    }
    assert_eq!(server.get("/healthz", KEY_A).await.status, StatusCode::OK, "the server still answers");
    assert!(server.stored().is_empty(), "nothing refused was kept: {:?}", server.stored());
}
