//! teifleet-batch against the real API server (the local control plane): a batch created over
//! HTTP is an EmbeddingJob with the contract's spec, labels and annotations; it lists for its
//! tenant and is not found for another; cancel suspends it and records when; a duplicate
//! custom_id and a model no pool serves are refused before any job exists. The server runs in
//! this process on 127.0.0.1:0 with a store in target/e2e-logs; no operator is needed.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};
use teifleet_batch::auth::{Keys, RELOAD_EVERY};
use teifleet_batch::cluster::KubeCluster;
use teifleet_batch::server::{self, AppState, JobDefaults, JobStore, Limits};
use teifleet_batch::store::FileStore;
use teifleet_crds::{EmbeddingJob, InputFormat};
use teifleet_e2e::pools::create_pool;
use teifleet_e2e::{admin_client, install_crd, log_dir, repo_root, test_namespace};
use teifleet_job::store::{S3Settings, Store, StoreRole};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const MODEL: &str = "BAAI/bge-small-en-v1.5";
const KEY_A: &str = "e2e-batch-key-tenant-a";
const KEY_B: &str = "e2e-batch-key-tenant-b";

/// One HTTP/1.1 exchange on a fresh connection, read to its end: (status, JSON body).
async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    key: &str,
    content_type: &str,
    body: &[u8],
) -> (u16, Value) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("the server listens");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {key}\r\ncontent-type: {content_type}\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let text = String::from_utf8(answer).expect("a UTF-8 answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("a status line");
    assert!(!head.to_ascii_lowercase().contains("transfer-encoding: chunked"), "JSON answers carry their length");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

async fn upload(addr: std::net::SocketAddr, key: &str, lines: &[Value]) -> String {
    let content: String = lines.iter().map(|line| format!("{line}\n")).collect();
    let boundary = "e2e-boundary-41c9";
    let form = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{boundary}\r\n\
         Content-Disposition: form-data; name=\"file\"; filename=\"requests.jsonl\"\r\n\r\n{content}\r\n--{boundary}--\r\n"
    );
    let (status, file) =
        http(addr, "POST", "/v1/files", key, &format!("multipart/form-data; boundary={boundary}"), form.as_bytes())
            .await;
    assert_eq!(status, 200, "{file}");
    file["id"].as_str().unwrap().to_owned()
}

fn line(custom_id: &str, model: &str) -> Value {
    json!({ "custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": { "model": model, "input": ["a", "b"] } })
}

fn create(file: &str) -> Vec<u8> {
    json!({ "input_file_id": file, "endpoint": "/v1/embeddings", "completion_window": "24h", "metadata": { "team": "search" } })
        .to_string()
        .into_bytes()
}

#[tokio::test]
async fn batches_are_embedding_jobs_of_their_tenant() {
    let client = admin_client().await;
    install_crd(&client).await;
    let crd = repo_root().join("crds/teifleet.dev_embeddingjobs.yaml");
    teifleet_testkit::kube::install_crd(&client, &crd, "teifleet-e2e").await.expect("the job CRD installs");
    let ns = test_namespace("batch-api").await;
    create_pool(&client, &ns.name, "bge", json!({ "model": { "id": MODEL } })).await;

    let store_dir = log_dir().join(format!("batch-store-{}", ns.name));
    let keys_dir = log_dir().join(format!("batch-keys-{}", ns.name));
    for dir in [&store_dir, &keys_dir] {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(keys_dir.join("team-a"), format!("{KEY_A}\n")).unwrap();
    std::fs::write(keys_dir.join("team-b"), format!("{KEY_B}\n")).unwrap();
    let store =
        Store::open(StoreRole::Input, &format!("file://{}/", store_dir.display()), &S3Settings::default()).unwrap();
    let jobs = JobDefaults {
        store: JobStore::Pvc { claim: "batch".into(), path: "api".into() },
        workers: 2,
        api_key_secret: None,
        template: None,
    };
    let state = AppState::new(
        FileStore::new(store),
        Keys::watch(keys_dir, RELOAD_EVERY).unwrap(),
        Arc::new(KubeCluster::new(client.clone(), &ns.name)),
        Limits::default(),
        jobs,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(server::serve(listener, server::router(state), std::future::pending()));

    let file = upload(addr, KEY_A, &[line("r1", MODEL), line("r2", MODEL), json!("not a request")]).await;
    let (status, batch) = http(addr, "POST", "/v1/batches", KEY_A, "application/json", &create(&file)).await;
    assert_eq!(status, 200, "{batch}");
    let id = batch["id"].as_str().unwrap().to_owned();
    assert_eq!((batch["status"].as_str(), batch["request_counts"]["total"].as_i64()), (Some("in_progress"), Some(3)));

    let api: Api<EmbeddingJob> = Api::namespaced(client.clone(), &ns.name);
    let job_name = format!("batch-{}", &id["batch_".len()..]);
    let job = api.get(&job_name).await.expect("the batch is an EmbeddingJob");
    assert_eq!(job.spec.pool_ref.name, "bge");
    assert_eq!(job.spec.input.format, InputFormat::OpenaiBatch);
    assert_eq!(job.spec.input.path.as_deref(), Some(format!("files/{file}/content").as_str()));
    let input = job.spec.input.store.pvc.as_ref().unwrap();
    assert_eq!((input.claim_name.as_str(), input.path.as_str()), ("batch", "api"));
    assert_eq!(job.spec.output.store.pvc.as_ref().unwrap().path, format!("api/batches/{id}/"));
    assert_eq!((job.spec.deadline.as_deref(), job.spec.workers, job.spec.suspend), (Some("24h"), 2, false));
    let labels = job.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("teifleet.dev/batch"), Some(&id));
    assert_eq!(labels.get("teifleet.dev/tenant").map(String::as_str), Some("team-a"));
    let annotations: BTreeMap<String, String> = job.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(annotations["teifleet.dev/batch-input-file"], file);
    assert_eq!(annotations["teifleet.dev/batch-endpoint"], "/v1/embeddings");
    assert_eq!(annotations["teifleet.dev/batch-completion-window"], "24h");
    assert_eq!(
        serde_json::from_str::<Value>(&annotations["teifleet.dev/batch-metadata"]).unwrap(),
        json!({ "team": "search" })
    );
    assert_eq!(annotations["teifleet.dev/batch-requests"], "3");
    let selected = api.list(&ListParams::default().labels("teifleet.dev/tenant=team-a")).await.unwrap();
    assert_eq!(selected.items.len(), 1, "kubectl get ejob -l teifleet.dev/tenant=team-a finds it");

    let (status, listed) = http(addr, "GET", "/v1/batches", KEY_A, "application/json", b"").await;
    assert_eq!((status, listed["data"][0]["id"].as_str()), (200, Some(id.as_str())));
    let (status, got) = http(addr, "GET", &format!("/v1/batches/{id}"), KEY_A, "application/json", b"").await;
    assert_eq!((status, got["id"].as_str()), (200, Some(id.as_str())));

    // Tenant b: nothing of a's, exactly as if it did not exist.
    let (status, theirs) = http(addr, "GET", &format!("/v1/batches/{id}"), KEY_B, "application/json", b"").await;
    assert_eq!(
        (status, theirs["error"]["message"].as_str()),
        (404, Some(format!("No batch found with id '{id}'.").as_str()))
    );
    assert_eq!(http(addr, "GET", &format!("/v1/files/{file}"), KEY_B, "application/json", b"").await.0, 404);
    assert_eq!(http(addr, "GET", "/v1/batches", KEY_B, "application/json", b"").await.1["data"], json!([]));
    assert_eq!(http(addr, "POST", &format!("/v1/batches/{id}/cancel"), KEY_B, "application/json", b"{}").await.0, 404);

    let (status, cancelling) =
        http(addr, "POST", &format!("/v1/batches/{id}/cancel"), KEY_A, "application/json", b"{}").await;
    assert_eq!((status, cancelling["status"].as_str()), (200, Some("cancelling")), "{cancelling}");
    let job = api.get(&job_name).await.unwrap();
    assert!(job.spec.suspend, "cancel suspends the job");
    let at = job.metadata.annotations.unwrap_or_default()["teifleet.dev/batch-cancelling-at"].clone();
    assert_eq!(at, cancelling["cancelling_at"].as_i64().unwrap().to_string());
    let (_, again) = http(addr, "POST", &format!("/v1/batches/{id}/cancel"), KEY_A, "application/json", b"{}").await;
    assert_eq!(again["cancelling_at"], cancelling["cancelling_at"], "cancel is idempotent");

    let duplicate = upload(addr, KEY_A, &[line("same", MODEL), line("same", MODEL)]).await;
    let (status, refused) = http(addr, "POST", "/v1/batches", KEY_A, "application/json", &create(&duplicate)).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (400, Some("duplicate_custom_id")), "{refused}");
    let unknown = upload(addr, KEY_A, &[line("x", "no/such-model")]).await;
    let (status, refused) = http(addr, "POST", "/v1/batches", KEY_A, "application/json", &create(&unknown)).await;
    assert_eq!(status, 400, "{refused}");
    assert_eq!(
        refused["error"]["message"],
        "The model `no/such-model` does not exist or you do not have access to it."
    );
    assert_eq!(api.list(&ListParams::default()).await.unwrap().items.len(), 1, "refused batches made no job");
}
