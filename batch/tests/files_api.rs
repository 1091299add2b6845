//! The Files API over real HTTP on 127.0.0.1:0, against a store in a temporary directory: what an
//! SDK does, and what a hostile caller tries.

mod support;

use std::time::Duration;

use bytes::Bytes;
use hyper::{Method, StatusCode};
use serde_json::json;
use support::{Form, KEY_A, KEY_B, TestServer, full, request_line, streamed};
use teifleet_batch::server::Limits;

fn lines(n: usize) -> Vec<u8> {
    (0..n).map(|i| request_line(&format!("r{i}"), "bge", "hello") + "\n").collect::<String>().into_bytes()
}

#[tokio::test]
async fn upload_list_get_content_and_delete() {
    let server = TestServer::start(Limits::default(), &[]).await;
    let content = lines(3);
    let uploaded = server.upload(KEY_A, "batch", &content).await;
    assert_eq!(uploaded.status, StatusCode::OK, "{:?}", uploaded.body);
    let file = uploaded.json();
    let id = file["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("file-") && id.len() == 29, "{id}");
    assert_eq!(file["object"], "file");
    assert_eq!(file["bytes"], content.len());
    assert_eq!(
        (file["filename"].as_str(), file["purpose"].as_str(), file["status"].as_str()),
        (Some("requests.jsonl"), Some("batch"), Some("processed"))
    );
    assert!(file["created_at"].as_i64().unwrap() > 1_700_000_000);
    assert_eq!(server.stored(), [format!("files/{id}/content"), format!("files/{id}/meta.json")]);
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(server.dir.path().join(format!("files/{id}/meta.json"))).unwrap())
            .unwrap();
    assert_eq!((meta["tenant"].as_str(), meta["lines"].as_u64()), (Some("a"), Some(3)));

    // The file field first and the purpose after it: the same file.
    let reversed = Form::new().file("file", "second.jsonl", &lines(1)).text("purpose", "batch");
    let second = server.upload_form(KEY_A, reversed).await;
    assert_eq!(second.status, StatusCode::OK);
    let second_id = second.json()["id"].as_str().unwrap().to_owned();

    assert_eq!(server.get(&format!("/v1/files/{id}"), KEY_A).await.json(), file);
    let content_answer = server.get(&format!("/v1/files/{id}/content"), KEY_A).await;
    assert_eq!((content_answer.status, &content_answer.body[..]), (StatusCode::OK, &content[..]));

    let list = server.get("/v1/files", KEY_A).await.json();
    assert_eq!(list["object"], "list");
    assert_eq!(list["data"].as_array().unwrap().len(), 2);
    let ascending = server.get("/v1/files?order=asc&limit=1", KEY_A).await.json();
    assert_eq!(ascending["data"].as_array().unwrap().len(), 1);
    assert_eq!(ascending["has_more"], true);
    let after = ascending["last_id"].as_str().unwrap();
    let rest = server.get(&format!("/v1/files?order=asc&limit=1&after={after}"), KEY_A).await.json();
    assert_eq!(rest["has_more"], false);
    let mut ids =
        vec![ascending["first_id"].as_str().unwrap().to_owned(), rest["first_id"].as_str().unwrap().to_owned()];
    ids.sort();
    let mut expected = vec![id.clone(), second_id];
    expected.sort();
    assert_eq!(ids, expected, "paging walks every file once");
    assert_eq!(server.get("/v1/files?purpose=fine-tune", KEY_A).await.json()["data"], json!([]));
    assert_eq!(server.get("/v1/files?limit=0", KEY_A).await.status, StatusCode::BAD_REQUEST);
    assert_eq!(server.get("/v1/files?order=sideways", KEY_A).await.status, StatusCode::BAD_REQUEST);
    assert_eq!(server.get("/v1/files?limit=abc", KEY_A).await.status, StatusCode::BAD_REQUEST);

    let deleted = server.delete(&format!("/v1/files/{id}"), KEY_A).await;
    assert_eq!(deleted.json(), json!({ "id": id, "object": "file", "deleted": true }));
    let gone = server.get(&format!("/v1/files/{id}"), KEY_A).await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    assert_eq!(gone.error().0, format!("No such File object: {id}"));
    assert!(!server.stored().iter().any(|path| path.contains(&id)), "{:?}", server.stored());
}

#[tokio::test]
async fn another_tenants_file_is_not_found_exactly_as_a_missing_one() {
    let server = TestServer::start(Limits::default(), &[]).await;
    let id = server.upload(KEY_A, "batch", &lines(2)).await.json()["id"].as_str().unwrap().to_owned();
    let missing = "file-000000000000000000000000";
    for (path, missing_path) in [
        (format!("/v1/files/{id}"), format!("/v1/files/{missing}")),
        (format!("/v1/files/{id}/content"), format!("/v1/files/{missing}/content")),
    ] {
        let theirs = server.get(&path, KEY_B).await;
        let nobodys = server.get(&missing_path, KEY_B).await;
        assert_eq!((theirs.status, nobodys.status), (StatusCode::NOT_FOUND, StatusCode::NOT_FOUND));
        assert_eq!(theirs.json()["error"]["message"], format!("No such File object: {id}"));
        assert_eq!(theirs.body.len() - id.len(), nobodys.body.len() - missing.len(), "the same answer, but for the id");
    }
    assert_eq!(server.delete(&format!("/v1/files/{id}"), KEY_B).await.status, StatusCode::NOT_FOUND);
    assert_eq!(server.get("/v1/files", KEY_B).await.json()["data"], json!([]), "b lists none of a's files");
    assert_eq!(server.get(&format!("/v1/files/{id}"), KEY_A).await.status, StatusCode::OK, "a's file is still there");
}

#[tokio::test]
async fn ids_that_are_paths_touch_nothing() {
    let server = TestServer::start(Limits::default(), &[]).await;
    std::fs::create_dir_all(server.dir.path().join("files/x")).unwrap();
    std::fs::write(server.dir.path().join("files/x/meta.json"), r#"{"id":"x"}"#).unwrap();
    for id in [
        "file-..%2F..%2Fx",
        "file-..%2Fx",
        "..%2Ffiles%2Fx",
        "x",
        "file-0123456789ABCDEF01234567",
        "batch_0123456789abcdef01234567-output%2F..",
        "file-0123456789abcdef01234567%00",
    ] {
        for path in [format!("/v1/files/{id}"), format!("/v1/files/{id}/content")] {
            let answer = server.get(&path, KEY_A).await;
            assert_eq!(answer.status, StatusCode::NOT_FOUND, "{path}");
            assert!(answer.error().0.starts_with("No such File object: "), "{path}");
        }
        assert_eq!(server.delete(&format!("/v1/files/{id}"), KEY_A).await.status, StatusCode::NOT_FOUND, "{id}");
    }
    assert_eq!(server.get("/v1/batches/batch_..%2F..%2Fx", KEY_A).await.status, StatusCode::NOT_FOUND);
    assert!(server.dir.path().join("files/x/meta.json").exists(), "nothing was deleted");
}

/// `--max-file-bytes` is set to 64 KiB here so the test streams kilobytes, not 200 MB: the bound
/// is the same code counting the streamed bytes whatever its value.
#[tokio::test]
async fn a_file_over_the_size_limit_is_refused_and_leaves_nothing() {
    let limits = Limits { max_file_bytes: 64 << 10, ..Limits::default() };
    let server = TestServer::start(limits, &[]).await;
    let fits = vec![b'x'; 64 << 10];
    assert_eq!(server.upload(KEY_A, "batch", &fits).await.status, StatusCode::OK, "exactly the limit fits");
    let before = server.stored();
    let too_large = server.upload(KEY_A, "batch", &[fits.as_slice(), b"x"].concat()).await;
    assert_eq!(too_large.status, StatusCode::BAD_REQUEST);
    let (message, param, _) = too_large.error();
    assert!(message.starts_with("File is too large."), "{message}");
    assert_eq!(param, "file");
    // Far past it, with the body larger than the multipart allowance too.
    let huge = server.upload(KEY_A, "batch", &vec![b'y'; 4 << 20]).await;
    assert_eq!(huge.status, StatusCode::BAD_REQUEST);
    assert!(huge.error().0.starts_with("File is too large."));
    // A purpose field as large: the body's own bound, in the same words.
    let form = Form::new().text("purpose", &"p".repeat(2 << 20)).file("file", "a.jsonl", b"{}");
    let huge_purpose = server.upload_form(KEY_A, form).await;
    assert_eq!(huge_purpose.status, StatusCode::BAD_REQUEST);
    assert_eq!(server.stored(), before, "no content, no record and no staged part stays");
}

#[tokio::test]
async fn a_file_over_fifty_thousand_requests_is_refused() {
    let server = TestServer::start(Limits::default(), &[]).await;
    let short = |n: usize| (0..n).map(|i| format!("{{\"custom_id\":\"{i}\"}}\n")).collect::<String>().into_bytes();
    let exactly = server.upload(KEY_A, "batch", &short(50_000)).await;
    assert_eq!(exactly.status, StatusCode::OK, "50,000 requests are allowed");
    let before = server.stored();
    let over = server.upload(KEY_A, "batch", &short(50_001)).await;
    assert_eq!(over.status, StatusCode::BAD_REQUEST);
    let (message, param, _) = over.error();
    assert!(message.contains("more than 50000 requests"), "{message}");
    assert_eq!(param, "file");
    // Blank lines are no requests.
    let blanks = [short(50_000), b"\n\n  \r\n".to_vec()].concat();
    assert_eq!(server.upload(KEY_A, "batch", &blanks).await.status, StatusCode::OK);
    assert_eq!(server.stored().len(), before.len() + 2);
}

#[tokio::test]
async fn malformed_forms_are_refused() {
    let server = TestServer::start(Limits::default(), &[]).await;
    let not_multipart = server
        .send(Method::POST, "/v1/files", Some(KEY_A), Some("application/json"), full(Bytes::from_static(b"{}")))
        .await;
    assert_eq!(not_multipart.status, StatusCode::BAD_REQUEST);
    assert!(not_multipart.error().0.starts_with("Invalid multipart form"));
    let no_boundary = server
        .send(Method::POST, "/v1/files", Some(KEY_A), Some("multipart/form-data"), full(Bytes::from_static(b"--x\r\n")))
        .await;
    assert_eq!(no_boundary.status, StatusCode::BAD_REQUEST);

    let truncated = Form::new().text("purpose", "batch").file("file", "a.jsonl", &lines(2));
    let content_type = truncated.content_type();
    let mut body = truncated.unfinished();
    body.truncate(body.len() - 10);
    let answer = server.send(Method::POST, "/v1/files", Some(KEY_A), Some(&content_type), full(body.into())).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    let garbage = server
        .send(
            Method::POST,
            "/v1/files",
            Some(KEY_A),
            Some(&content_type),
            full(Bytes::from_static(b"\x00\xffnot a form")),
        )
        .await;
    assert_eq!(garbage.status, StatusCode::BAD_REQUEST);
    let two_files = Form::new().text("purpose", "batch").file("file", "a.jsonl", b"{}").file("file", "b.jsonl", b"{}");
    assert_eq!(server.upload_form(KEY_A, two_files).await.status, StatusCode::BAD_REQUEST);
    assert!(server.stored().is_empty(), "{:?}", server.stored());
}

#[tokio::test]
async fn purpose_and_file_are_required_and_only_batch_is_stored() {
    let server = TestServer::start(Limits::default(), &[]).await;
    for purpose in ["fine-tune", "assistants", "", &"b".repeat(1000)] {
        let answer = server.upload(KEY_A, purpose, &lines(1)).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{purpose}");
        let (message, param, code) = answer.error();
        assert!(message.contains("This deployment stores batch input files only"), "{message}");
        assert_eq!((param, code), (json!("purpose"), json!("invalid_value")));
    }
    let late_wrong = Form::new().file("file", "a.jsonl", &lines(1)).text("purpose", "fine-tune");
    assert_eq!(server.upload_form(KEY_A, late_wrong).await.status, StatusCode::BAD_REQUEST);

    let no_file = server.upload_form(KEY_A, Form::new().text("purpose", "batch")).await;
    assert_eq!(no_file.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        no_file.error(),
        ("Missing required parameter: 'file'.".to_owned(), json!("file"), json!("missing_required_parameter"))
    );
    let no_purpose = server.upload_form(KEY_A, Form::new().file("file", "a.jsonl", &lines(1))).await;
    assert_eq!(no_purpose.error().0, "Missing required parameter: 'purpose'.");
    let misnamed = Form::new().text("purpose", "batch").file("upload", "a.jsonl", &lines(1));
    assert_eq!(server.upload_form(KEY_A, misnamed).await.error().1, "file");
    assert!(server.stored().is_empty(), "refused uploads leave nothing: {:?}", server.stored());
}

#[tokio::test]
async fn callers_without_a_valid_key_are_refused() {
    let server = TestServer::start(Limits::default(), &[]).await;
    let none = server.send(Method::GET, "/v1/files", None, None, full(Bytes::new())).await;
    assert_eq!(none.status, StatusCode::UNAUTHORIZED);
    assert!(none.error().0.starts_with("You didn't provide an API key."));
    let wrong = server.get("/v1/files", "key-of-nobody-00000000").await;
    assert_eq!((wrong.status, wrong.error().2), (StatusCode::UNAUTHORIZED, json!("invalid_api_key")));
    assert_eq!(server.upload("key-of-nobody-00000000", "batch", b"{}").await.status, StatusCode::UNAUTHORIZED);
    assert!(server.stored().is_empty());
}

#[tokio::test]
async fn uploads_past_the_limit_at_once_are_told_to_retry() {
    let server = TestServer::start(Limits { max_uploads: 1, ..Limits::default() }, &[]).await;
    // One upload held open: its headers and the first of its bytes sent, the rest not yet.
    let form = Form::new().text("purpose", "batch");
    let content_type = form.content_type();
    let head = [form.unfinished(), Form::new().file_head("file", "slow.jsonl").into_bytes()].concat();
    let (sender, body) = streamed();
    sender.unbounded_send(Bytes::from(head)).unwrap();
    sender.unbounded_send(Bytes::from(lines(1))).unwrap();
    let slow = {
        let server = &server;
        let content_type = content_type.clone();
        async move { server.send(Method::POST, "/v1/files", Some(KEY_A), Some(&content_type), body).await }
    };
    let others = async {
        // Until the held upload has its place, another may still get it; from then on, 429.
        for _ in 0..1000 {
            let other = server.upload(KEY_B, "batch", &lines(1)).await;
            if other.status == StatusCode::TOO_MANY_REQUESTS {
                sender.unbounded_send(Bytes::from(format!("\r\n{}", Form::new().tail()))).unwrap();
                sender.close_channel();
                return other;
            }
            assert_eq!(other.status, StatusCode::OK);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("no upload was refused while one was held");
    };
    let (slow, refused) = tokio::join!(slow, others);
    assert_eq!(refused.headers["retry-after"], "1");
    let (message, _, code) = refused.error();
    assert!(message.starts_with("Too many uploads at once"), "{message}");
    assert_eq!(code, "rate_limit_exceeded");
    assert_eq!(slow.status, StatusCode::OK, "the held upload completes: {:?}", slow.body);
    assert_eq!(server.upload(KEY_B, "batch", &lines(1)).await.status, StatusCode::OK, "the place is free again");
}

/// `--upload-idle-timeout` is 200 ms here so the test waits that long, not a minute: the same
/// timer runs for every chunk whatever its value.
#[tokio::test]
async fn a_stalled_upload_is_dropped_and_frees_its_place() {
    let limits = Limits { max_uploads: 1, upload_idle: Duration::from_millis(200), ..Limits::default() };
    let server = TestServer::start(limits, &[]).await;
    let form = Form::new().text("purpose", "batch");
    let content_type = form.content_type();
    let head = [form.unfinished(), Form::new().file_head("file", "stalled.jsonl").into_bytes(), lines(1)].concat();
    let (sender, body) = streamed();
    sender.unbounded_send(Bytes::from(head)).unwrap();
    // The sender stays open and silent: nothing more comes.
    let stalled = server.send(Method::POST, "/v1/files", Some(KEY_A), Some(&content_type), body).await;
    assert_eq!(stalled.status, StatusCode::REQUEST_TIMEOUT);
    assert!(stalled.error().0.starts_with("The upload stalled"));
    assert!(server.stored().is_empty(), "{:?}", server.stored());
    assert_eq!(server.upload(KEY_A, "batch", &lines(1)).await.status, StatusCode::OK, "its place is free");
    drop(sender);
}
