//! reconcile() against a mocked API server: which requests it makes, under which field manager,
//! and that a pool whose status is already right gets no status write. (The real-cluster tests in
//! tests/e2e cover the same ground against kube-apiserver; these run in milliseconds.)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::runtime::events::{Recorder, Reporter};
use kube::{Client, Resource};
use serde_json::{Value, json};
use teifleet_crds::EmbeddingPool;
use teifleet_operator::controller::{Context, reconcile};
use teifleet_operator::metrics::Metrics;
use teifleet_operator::render::RenderConfig;

#[derive(Clone, Debug)]
struct Seen {
    method: String,
    path: String,
    query: String,
    body: Value,
}

/// Answers like an API server that accepts every apply: a PATCH echoes the object back with a
/// Deployment status showing every replica ready; LISTs are empty; GETs and DELETEs of one object
/// find nothing; a POST creates its object.
fn mock_api() -> (Client, Arc<Mutex<Vec<Seen>>>) {
    mock_api_where_posts_find(false)
}

/// The same, where every POST finds its object already there (409 AlreadyExists) when `exists`.
fn mock_api_where_posts_find(exists: bool) -> (Client, Arc<Mutex<Vec<Seen>>>) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Some((request, send)) = handle.next_request().await {
            let (parts, body) = request.into_parts();
            let bytes = body.collect_bytes().await.unwrap();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let path = parts.uri.path().to_owned();
            let query = parts.uri.query().unwrap_or_default().to_owned();
            log.lock().unwrap().push(Seen {
                method: parts.method.to_string(),
                path: path.clone(),
                query,
                body: body.clone(),
            });
            let (status, reply) = match parts.method.as_str() {
                "PATCH" => {
                    let mut object = body;
                    if object.get("metadata").is_none() {
                        // A status apply carries no metadata; the server answers with the whole object.
                        object["metadata"] = json!({ "name": path.trim_end_matches("/status").rsplit('/').next() });
                        object["spec"] = json!({ "model": { "id": "echoed" } });
                    }
                    if path.contains("/deployments/") {
                        let replicas = object["spec"]["replicas"].clone();
                        object["status"] =
                            json!({ "replicas": replicas, "readyReplicas": replicas, "updatedReplicas": replicas });
                    }
                    (StatusCode::OK, object)
                }
                // One object (`.../namespaces/<ns>/<resource>/<name>`): not there.
                "GET" if path.split("/namespaces/").nth(1).is_some_and(|rest| rest.split('/').count() == 3) => (
                    StatusCode::NOT_FOUND,
                    json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "metadata": {} }),
                ),
                "GET" => (StatusCode::OK, json!({ "apiVersion": "v1", "kind": "List", "metadata": {}, "items": [] })),
                "POST" if exists => (
                    StatusCode::CONFLICT,
                    json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "AlreadyExists", "code": 409, "metadata": {} }),
                ),
                "POST" => (StatusCode::CREATED, body),
                "DELETE" => (
                    StatusCode::NOT_FOUND,
                    json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "metadata": {} }),
                ),
                _ => (StatusCode::OK, json!({})),
            };
            let response =
                Response::builder().status(status).body(Body::from(serde_json::to_vec(&reply).unwrap())).unwrap();
            send.send_response(response);
        }
    });
    (Client::new(service, "default"), seen)
}

fn context(client: Client) -> Arc<Context> {
    Arc::new(Context {
        client: client.clone(),
        render: RenderConfig::default(),
        recorder: Recorder::new(client, Reporter { controller: "teifleet-operator".into(), instance: None }),
        metrics: Metrics::new(),
        resync: Duration::from_secs(300),
        status_memo: Default::default(),
        reports: Default::default(),
        autoscaler: Default::default(),
        peer_secrets: Default::default(),
    })
}

fn pool() -> EmbeddingPool {
    serde_json::from_value(json!({
        "apiVersion": "teifleet.dev/v1alpha1", "kind": "EmbeddingPool",
        "metadata": { "name": "embed", "namespace": "ml", "uid": "5f0c7a7e-0000-4000-8000-000000000001", "generation": 2 },
        "spec": { "model": { "id": "BAAI/bge-small-en-v1.5" }, "replicas": 2 },
    }))
    .unwrap()
}

fn secret_posts(seen: &[Seen]) -> Vec<&Seen> {
    seen.iter().filter(|s| s.path.contains("/secrets")).collect()
}

#[tokio::test]
async fn the_peer_secret_is_created_once_owned_by_the_pool_and_never_read() {
    let (client, seen) = mock_api();
    let ctx = context(client);
    reconcile(Arc::new(pool()), ctx.clone()).await.unwrap();
    let requests = seen.lock().unwrap().clone();
    let secrets = secret_posts(&requests);
    assert_eq!(secrets.len(), 1, "one request touches Secrets: {secrets:?}");
    let post = secrets[0];
    assert_eq!((post.method.as_str(), post.path.as_str()), ("POST", "/api/v1/namespaces/ml/secrets"));
    assert_eq!(post.body["metadata"]["name"], json!("embed-teifleet-peer"));
    assert_eq!(post.body["type"], json!("Opaque"));
    let owner = &post.body["metadata"]["ownerReferences"][0];
    assert_eq!((owner["kind"].clone(), owner["name"].clone()), (json!("EmbeddingPool"), json!("embed")));
    assert_eq!(owner["controller"], json!(true), "the garbage collector deletes it with the pool");
    // 32 bytes as unpadded base64url text (43 characters), itself base64 in the API's `data`.
    let data = post.body["data"]["key"].as_str().unwrap();
    assert_eq!(data.len(), 60, "base64 of 43 bytes: {data}");
    let deployment = requests.iter().position(|s| s.path.contains("/deployments/")).unwrap();
    assert!(requests.iter().position(|s| s.path.contains("/secrets")).unwrap() < deployment, "before the pods");

    // The next reconciles post nothing: the operator remembers, and reads no Secret to find out.
    seen.lock().unwrap().clear();
    reconcile(Arc::new(pool()), ctx).await.unwrap();
    assert!(secret_posts(&seen.lock().unwrap()).is_empty());
}

#[tokio::test]
async fn a_peer_secret_that_already_exists_is_left_as_it_is() {
    let (client, seen) = mock_api_where_posts_find(true);
    reconcile(Arc::new(pool()), context(client)).await.expect("AlreadyExists is success");
    let requests = seen.lock().unwrap().clone();
    let secrets = secret_posts(&requests);
    assert_eq!(secrets.len(), 1);
    assert_eq!(secrets[0].method, "POST", "no GET, no update: {secrets:?}");
}

fn status_patches(seen: &[Seen]) -> Vec<&Seen> {
    seen.iter().filter(|s| s.method == "PATCH" && s.path.ends_with("/status")).collect()
}

#[tokio::test]
async fn first_reconcile_applies_every_child_and_writes_status() {
    let (client, seen) = mock_api();
    tokio::time::timeout(Duration::from_secs(5), reconcile(Arc::new(pool()), context(client))).await.unwrap().unwrap();
    let seen = seen.lock().unwrap().clone();

    let applied: Vec<&str> = seen
        .iter()
        .filter(|s| s.method == "PATCH" && !s.path.ends_with("/status"))
        .map(|s| s.path.rsplit('/').nth(1).unwrap())
        .collect();
    assert_eq!(
        applied,
        [
            "serviceaccounts",
            "roles",
            "rolebindings",
            "services",
            "services",
            "networkpolicies",
            "deployments",
            "poddisruptionbudgets"
        ]
    );
    for request in seen.iter().filter(|s| s.method == "PATCH") {
        assert!(request.query.contains("fieldManager=teifleet-operator"), "{request:?}");
        assert!(request.query.contains("force=true"), "{request:?}");
        assert!(request.body["apiVersion"].is_string() && request.body["kind"].is_string(), "{request:?}");
    }

    let status = status_patches(&seen);
    assert_eq!(status.len(), 1);
    assert_eq!(status[0].path, "/apis/teifleet.dev/v1alpha1/namespaces/ml/embeddingpools/embed/status");
    let body = &status[0].body["status"];
    assert_eq!(body["observedGeneration"], json!(2));
    assert_eq!(body["readyReplicas"], json!(2));
    assert_eq!(body["admission"]["inFlightPerReplica"], json!(16));
    assert_eq!(body["conditions"][0]["type"], json!("Ready"));
    assert_eq!(body["conditions"][0]["status"], json!("True"));
}

#[tokio::test]
async fn a_pool_whose_status_is_current_gets_no_status_write() {
    let (client, seen) = mock_api();
    let ctx = context(client);
    let mut pool = pool();
    reconcile(Arc::new(pool.clone()), ctx.clone()).await.unwrap();
    let written = status_patches(&seen.lock().unwrap())[0].body["status"].clone();

    // The next reconcile sees the status it wrote (as the watch would deliver it).
    pool.status = Some(serde_json::from_value(written).unwrap());
    seen.lock().unwrap().clear();
    reconcile(Arc::new(pool), ctx).await.unwrap();
    assert!(status_patches(&seen.lock().unwrap()).is_empty(), "a steady pool must not be written");
}

#[tokio::test]
async fn a_lagging_cache_does_not_cause_a_repeat_status_write() {
    let (client, seen) = mock_api();
    let ctx = context(client);
    let pool = Arc::new(pool());
    reconcile(pool.clone(), ctx.clone()).await.unwrap();
    seen.lock().unwrap().clear();
    // Same stale object again, before the watch delivered our own status write.
    reconcile(pool, ctx).await.unwrap();
    assert!(status_patches(&seen.lock().unwrap()).is_empty());
}

#[tokio::test]
async fn a_single_replica_pool_removes_its_disruption_budget() {
    let (client, seen) = mock_api();
    let mut pool = pool();
    pool.spec.replicas = Some(1);
    reconcile(Arc::new(pool.clone()), context(client)).await.unwrap();
    let seen = seen.lock().unwrap();
    let delete = seen.iter().find(|s| s.method == "DELETE").expect("the PodDisruptionBudget is deleted");
    assert_eq!(
        delete.path,
        format!("/apis/policy/v1/namespaces/ml/poddisruptionbudgets/{}", pool.meta().name.as_ref().unwrap())
    );
}

#[tokio::test]
async fn a_pool_without_a_network_policy_has_it_removed() {
    let (client, seen) = mock_api();
    let mut pool = pool();
    pool.spec.network_policy.enabled = false;
    reconcile(Arc::new(pool.clone()), context(client)).await.unwrap();
    let seen = seen.lock().unwrap();
    assert!(!seen.iter().any(|s| s.method == "PATCH" && s.path.contains("/networkpolicies/")), "not applied");
    let path =
        format!("/apis/networking.k8s.io/v1/namespaces/ml/networkpolicies/{}", pool.meta().name.as_ref().unwrap());
    assert!(seen.iter().any(|s| s.method == "DELETE" && s.path == path), "deleted: {seen:?}");
}

fn autoscaled_pool(min_replicas: i32) -> EmbeddingPool {
    serde_json::from_value(json!({
        "apiVersion": "teifleet.dev/v1alpha1", "kind": "EmbeddingPool",
        "metadata": { "name": "elastic", "namespace": "ml", "uid": "5f0c7a7e-0000-4000-8000-000000000002", "generation": 1 },
        "spec": {
            "model": { "id": "BAAI/bge-small-en-v1.5" },
            "concurrency": { "maxInFlight": 64, "maxInFlightPerReplica": 16 },
            "autoscaling": { "minReplicas": min_replicas, "maxReplicas": 5 },
        },
    }))
    .unwrap()
}

#[tokio::test]
async fn an_autoscaled_pool_gets_the_autoscalers_count_its_status_and_a_shorter_requeue() {
    let (client, seen) = mock_api();
    let ctx = context(client);
    let mut pool = autoscaled_pool(2);
    let action = reconcile(Arc::new(pool.clone()), ctx.clone()).await.unwrap();
    assert_eq!(action, Action::requeue(teifleet_operator::autoscale::INTERVAL), "autoscaled pools are looked at often");

    let requests = seen.lock().unwrap().clone();
    let deployment = requests.iter().find(|s| s.method == "PATCH" && s.path.contains("/deployments/")).unwrap();
    assert_eq!(deployment.body["spec"]["replicas"], json!(2), "a new pool starts at minReplicas");
    let status = status_patches(&requests)[0].body["status"].clone();
    assert_eq!(status["autoscaling"]["desiredReplicas"], json!(2));
    assert_eq!(status["autoscaling"]["recommendedReplicas"], json!(2));
    assert_eq!(status["autoscaling"]["message"], json!("no replica ready yet"));
    assert!(
        !requests.iter().any(|s| s.query.contains("activator")),
        "minReplicas 2 never reaches zero: the activator is not asked"
    );

    // The next look, with the status it wrote: nothing changed, nothing written.
    pool.status = Some(serde_json::from_value(status).unwrap());
    seen.lock().unwrap().clear();
    reconcile(Arc::new(pool.clone()), ctx.clone()).await.unwrap();
    assert!(status_patches(&seen.lock().unwrap()).is_empty(), "a steady autoscaled pool must not be written");

    // Sized by hand again: the Deployment gets spec.replicas, the autoscaler's status goes.
    pool.spec.autoscaling = None;
    pool.spec.replicas = Some(3);
    seen.lock().unwrap().clear();
    let action = reconcile(Arc::new(pool), ctx).await.unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(30)));
    let requests = seen.lock().unwrap().clone();
    let deployment = requests.iter().find(|s| s.method == "PATCH" && s.path.contains("/deployments/")).unwrap();
    assert_eq!(deployment.body["spec"]["replicas"], json!(3));
    assert_eq!(status_patches(&requests)[0].body["status"].get("autoscaling"), None);
}

#[tokio::test]
async fn a_pool_that_may_scale_to_zero_asks_the_namespaces_activator() {
    let (client, seen) = mock_api();
    reconcile(Arc::new(autoscaled_pool(0)), context(client)).await.unwrap();
    let requests = seen.lock().unwrap().clone();
    let selector = "labelSelector=app.kubernetes.io%2Fcomponent%3Dactivator%2Capp.kubernetes.io%2Fpart-of%3Dteifleet";
    assert!(
        requests
            .iter()
            .any(|s| s.method == "GET" && s.path == "/api/v1/namespaces/ml/pods" && s.query.contains(selector)),
        "{requests:?}"
    );
    let deployment = requests.iter().find(|s| s.method == "PATCH" && s.path.ends_with("/deployments/elastic")).unwrap();
    assert_eq!(deployment.body["spec"]["replicas"], json!(0), "a new pool that may scale to zero starts at zero");
}
