//! The server on a real S3 store: SeaweedFS (`weed server` with its S3 gateway, on loopback;
//! `tools/seaweedfs.sh` builds it and `make unit` passes it in `TEIFLEET_WEED_BIN`). An upload of
//! several multipart parts streams in and reads back byte for byte; one over the limit is aborted
//! and leaves no object; a batch's output is its parts in the bucket, concatenated.
//!
//! Without `weed` the test says it was skipped and passes, unless `TEIFLEET_REQUIRE_S3=1` (as
//! `make unit` sets), where a missing `weed` fails it.

mod support;

use futures::TryStreamExt as _;
use hyper::StatusCode;
use object_store::path::Path;
use object_store::{ObjectStore as _, ObjectStoreExt as _};
use serde_json::json;
use support::{KEY_A, TestServer, request_line};
use teifleet_batch::server::Limits;
use teifleet_job::store::{S3Credentials, S3Settings, Store, StoreRole};
use teifleet_testkit::seaweedfs::{ACCESS_KEY, SECRET_KEY, SeaweedFs};

#[tokio::test]
async fn uploads_stream_into_s3_and_batches_read_their_parts_from_it() {
    let Some(bin) = SeaweedFs::bin() else {
        let required = std::env::var("TEIFLEET_REQUIRE_S3").is_ok_and(|v| v == "1");
        assert!(!required, "TEIFLEET_REQUIRE_S3=1 but TEIFLEET_WEED_BIN names no weed (tools/seaweedfs.sh builds it)");
        eprintln!("skipped: no TEIFLEET_WEED_BIN (tools/seaweedfs.sh builds weed)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let seaweed = SeaweedFs::start(&bin, &dir.path().join("weed")).await.expect("SeaweedFS starts");
    seaweed.create_bucket("batches").await.unwrap();
    let settings = S3Settings {
        endpoint: Some(seaweed.endpoint()),
        region: "us-east-1".into(),
        allow_http: true,
        credentials: Some(S3Credentials { access_key_id: ACCESS_KEY.into(), secret_access_key: SECRET_KEY.into() }),
    };
    let store = Store::open(StoreRole::Input, "s3://batches/api/", &settings).unwrap();
    let objects = store.objects().clone();
    // 12 MB: a 20 MB upload is refused; an 11 MB one is two 8 MiB-or-less parts.
    let limits = Limits { max_file_bytes: 12_000_000, ..Limits::default() };
    let server = TestServer::start_on(store, dir, limits, &[("bge", "bge")]).await;

    let padding = "x".repeat(1_000);
    let line = |i: usize| request_line(&format!("r{i}"), "bge", &padding) + "\n";
    let content: String = (0..10_500).map(line).collect();
    assert!(content.len() > 10_000_000 && content.len() < 12_000_000);
    let uploaded = server.upload(KEY_A, "batch", content.as_bytes()).await;
    assert_eq!(uploaded.status, StatusCode::OK, "{:?}", uploaded.body);
    let id = uploaded.json()["id"].as_str().unwrap().to_owned();
    let back = server.get(&format!("/v1/files/{id}/content"), KEY_A).await;
    assert!(back.body == content.as_bytes(), "the content reads back byte for byte");
    assert_eq!(server.get("/v1/files", KEY_A).await.json()["data"][0]["id"], id);

    let too_large: String = (0..20_000).map(line).collect();
    let refused = server.upload(KEY_A, "batch", too_large.as_bytes()).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    let keys: Vec<String> =
        objects.list(Some(&Path::from("api"))).map_ok(|o| o.location.to_string()).try_collect().await.unwrap();
    assert_eq!(
        keys,
        [format!("api/files/{id}/content"), format!("api/files/{id}/meta.json")],
        "no trace of the refused upload"
    );

    let batch = server
        .post_json(
            "/v1/batches",
            KEY_A,
            &json!({ "input_file_id": id, "endpoint": "/v1/embeddings", "completion_window": "24h" }),
        )
        .await;
    assert_eq!(batch.status, StatusCode::OK, "{:?}", batch.body);
    let batch_id = batch.json()["id"].as_str().unwrap().to_owned();
    let part = |name: &str| Path::from(format!("api/batches/{batch_id}/{name}"));
    objects.put(&part("part-000001.jsonl"), "second\n".into()).await.unwrap();
    objects.put(&part("part-000000.jsonl"), "first\n".into()).await.unwrap();
    let output = server.get(&format!("/v1/files/{batch_id}-output/content"), KEY_A).await;
    assert_eq!(&output.body[..], b"first\nsecond\n");

    assert_eq!(server.delete(&format!("/v1/files/{id}"), KEY_A).await.status, StatusCode::OK);
    let left: Vec<String> =
        objects.list(Some(&Path::from("api/files"))).map_ok(|o| o.location.to_string()).try_collect().await.unwrap();
    assert!(left.is_empty(), "{left:?}");
}
