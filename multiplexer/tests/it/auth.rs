//! API keys on both fronts, over real gRPC and HTTP on loopback: a call without a key, or with a
//! wrong one, is refused before it is routed or queued, and counted; a right key names the
//! call's tenant whatever the call says; keys rotate by rewriting the keys file.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus::Registry;
use serde_json::{Value, json};
use teifleet_multiplexer::forward::pools::PoolTable;
use teifleet_multiplexer::gate::auth::{Gate, KeyRing, Policy};
use teifleet_multiplexer::report::metrics::Metrics;
use teifleet_multiplexer::run::server::{self, Running, Settings};
use teifleet_multiplexer::sources::file;
use teifleet_tei_sim::SimHandle;
use teifleet_testkit::http::send;
use teifleet_wire::headers::{POOL, TENANT};
use tokio_util::sync::CancellationToken;
use tonic::Code;

use crate::support::*;

const SEARCH_KEY: &str = "search-key-0123456789abcdef";
const BATCH_KEY: &str = "batch-key-0123456789abcdef";

fn keys(entries: &[(&str, &str)]) -> Policy {
    let (ring, problems) = KeyRing::parse(entries.iter().map(|(tenant, key)| (*tenant, key.as_bytes())));
    assert!(problems.is_empty(), "{problems:?}");
    Policy::Keys(ring)
}

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

/// A multiplexer with both fronts whose pool `pool-a` has keys, and the registry of its gate's
/// metrics. The spec lists the tenants, so they get metric series of their own.
async fn guarded(sim: &SimHandle, policy: Policy) -> (Running, Registry) {
    guarded_pool("pool-a", sim, policy).await
}

async fn guarded_pool(name: &str, sim: &SimHandle, policy: Policy) -> (Running, Registry) {
    let registry = Registry::new();
    let gate = Arc::new(Gate::new(name, &registry, policy).unwrap());
    let mut pool = spec(name, sim.addr(), limits(4, 16));
    pool.tenants = [("search".to_owned(), 1), ("batch".to_owned(), 1)].into();
    let settings = Settings { http_listen: Some(loopback_any()), auth: gate, ..Settings::default() };
    (mux_with(vec![pool], settings).await.0, registry)
}

fn loopback_any() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

fn failures(registry: &Registry, protocol: &str, reason: &str) -> f64 {
    let text = teifleet_runtime::metrics::render(registry).unwrap();
    let series = format!("teifleet_auth_failures_total{{pool=\"pool-a\",protocol=\"{protocol}\",reason=\"{reason}\"}}");
    metric(&text, &series).unwrap_or(0.0)
}

fn tenant_calls(running: &Running, tenant: &str) -> f64 {
    let series = format!("teifleet_tenant_requests_total{{outcome=\"ok\",pool=\"pool-a\",tenant=\"{tenant}\"}}");
    metric(&metrics_text(running), &series).unwrap_or(0.0)
}

#[tokio::test]
async fn grpc_calls_need_a_key_and_the_key_names_the_tenant() {
    let sim = sim(|_| {}).await;
    let (mux, registry) = guarded(&sim, keys(&[("search", SEARCH_KEY), ("batch", BATCH_KEY)])).await;
    let mut client = embed_client(mux.grpc_addr).await;

    let refused = client.embed(embed_request("no key")).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    assert!(refused.message().contains("authorization: Bearer <key>"), "{}", refused.message());
    let wrong = with_meta(embed_request("wrong"), &[("authorization", &bearer("search-key-0123456789abcdeX"))]);
    let refused = client.embed(wrong).await.unwrap_err();
    assert_eq!((refused.code(), refused.message()), (Code::Unauthenticated, "invalid API key"));
    let malformed = with_meta(embed_request("basic"), &[("authorization", "Basic dXNlcjpwYXNz")]);
    assert_eq!(client.embed(malformed).await.unwrap_err().code(), Code::Unauthenticated);
    assert_eq!(
        (failures(&registry, "grpc", "missing"), failures(&registry, "grpc", "invalid_key")),
        (1.0, 1.0),
        "each refusal counted by reason"
    );
    assert_eq!(failures(&registry, "grpc", "malformed"), 1.0);
    assert_eq!(sim.stats().requests_received, 0, "no refused call reached TEI");
    assert!(
        !metrics_text(&mux).contains("teifleet_requests_total{"),
        "refused before they became calls: routed, queued or counted as none"
    );

    // The key's tenant wins over the tenant the call names itself.
    let call = with_meta(embed_request("ok"), &[("authorization", &bearer(SEARCH_KEY)), (TENANT, "batch")]);
    let answer = client.embed(call).await.expect("a right key is served");
    assert!(!answer.get_ref().embeddings.is_empty());
    let call = with_meta(embed_request("ok too"), &[("authorization", &bearer(BATCH_KEY))]);
    client.embed(call).await.expect("the other tenant's key too");
    assert_eq!((tenant_calls(&mux, "search"), tenant_calls(&mux, "batch")), (1.0, 1.0));
    assert_eq!(sim.stats().requests_received, 2);
}

#[tokio::test]
async fn http_routes_need_a_key_in_each_routes_error_shape_but_health_does_not() {
    let sim = sim(|_| {}).await;
    let (mux, registry) = guarded(&sim, keys(&[("search", SEARCH_KEY)])).await;
    let http = mux.http_addr.expect("the HTTP front listens");
    let embed = json!({ "inputs": ["a", "b"] }).to_string();

    let refused = send(http, "POST", "/embed", &[], &embed).await.unwrap();
    assert_eq!(refused.status, 401);
    let body: Value = serde_json::from_str(&refused.body).unwrap();
    assert_eq!(body["error_type"], "Unauthorized", "TEI's shape: {body}");
    assert!(body["error"].as_str().unwrap().contains("Bearer"), "{body}");

    let openai = json!({ "input": "a", "model": "m" }).to_string();
    let wrong = [("authorization", "Bearer sk-not-one-of-the-pools-keys")];
    let refused = send(http, "POST", "/v1/embeddings", &wrong, &openai).await.unwrap();
    assert_eq!(refused.status, 401);
    let body: Value = serde_json::from_str(&refused.body).unwrap();
    assert_eq!((body["code"].as_u64(), body["message"].as_str()), (Some(401), Some("invalid API key")), "{body}");
    assert_eq!((failures(&registry, "http", "missing"), failures(&registry, "http", "invalid_key")), (1.0, 1.0));
    assert_eq!(sim.stats().requests_received, 0, "no refused request reached TEI");

    for path in ["/health", "/ping", "/"] {
        assert_eq!(send(http, "GET", path, &[], "").await.unwrap().status, 200, "{path} answers without a key");
    }
    assert_eq!(send(http, "GET", "/info", &[], "").await.unwrap().status, 401, "info needs a key like the rest");

    let right = bearer(SEARCH_KEY);
    let served = send(http, "POST", "/embed", &[("authorization", &right), (TENANT, "batch")], &embed).await.unwrap();
    assert_eq!(served.status, 200, "{}", served.body);
    let served = send(http, "POST", "/v1/embeddings", &[("Authorization", &right)], &openai).await.unwrap();
    assert_eq!(served.status, 200, "{}", served.body);
    assert_eq!(tenant_calls(&mux, "search"), 2.0, "both accounted to the key's tenant");
    assert_eq!(tenant_calls(&mux, "batch"), 0.0, "the tenant header did not override the key");
}

#[tokio::test]
async fn keys_not_read_yet_refuse_every_call_as_unavailable() {
    let sim = sim(|_| {}).await;
    let (mux, registry) = guarded(&sim, Policy::Waiting).await;
    let call = with_meta(embed_request("early"), &[("authorization", &bearer(SEARCH_KEY))]);
    let refused = embed_client(mux.grpc_addr).await.embed(call).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "the server's state, not the key: retry");
    let http = mux.http_addr.unwrap();
    let answer = send(http, "POST", "/embed", &[("authorization", &bearer(SEARCH_KEY))], r#"{"inputs":"a"}"#).await;
    assert_eq!(answer.unwrap().status, 503);
    assert_eq!(failures(&registry, "grpc", "keys_not_loaded"), 1.0);
}

#[tokio::test]
async fn rewriting_the_keys_file_rotates_keys_without_a_restart() {
    let sim = sim(|_| {}).await;
    let dir = std::env::temp_dir().join(format!("teifleet-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (config, keys_file) = (dir.join("pools.yaml"), dir.join("keys.yaml"));
    std::fs::write(
        &config,
        format!(
            "auth: {{keysFile: keys.yaml}}\npools:\n- {{name: pool-a, upstream: 'http://{}', maxInFlight: 4, maxQueued: 8, queueTimeout: 5s}}\n",
            sim.addr()
        ),
    )
    .unwrap();
    let old_key = "search-key-old-0123456789";
    let new_key = "search-key-new-0123456789";
    std::fs::write(&keys_file, format!("search: {old_key}\n")).unwrap();

    let loaded = file::load(&config).unwrap();
    let metrics = Metrics::new();
    let gate = Arc::new(
        Gate::new(&loaded.default, &metrics.registry, file::policy(loaded.keys_file.as_deref()).unwrap()).unwrap(),
    );
    let table = Arc::new(PoolTable::new(&loaded.default, metrics.clone()));
    table.sync(loaded.pools).unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(file::watch(config.clone(), table.clone(), gate.clone(), Duration::from_millis(50), stop.clone()));
    let settings = Settings { auth: gate, ..Settings::default() };
    let mux = server::start(settings, table, metrics).await.unwrap();
    let client = embed_client(mux.grpc_addr).await;
    let with_key = |key: &str| {
        let mut client = client.clone();
        let call = with_meta(embed_request("rotating"), &[("authorization", &bearer(key))]);
        async move { client.embed(call).await.map(|_| ()).map_err(|status| status.code()) }
    };
    assert_eq!(with_key(old_key).await, Ok(()));
    assert_eq!(with_key(new_key).await, Err(Code::Unauthenticated));

    // Step one of a rotation: both keys valid while clients move over.
    std::fs::write(&keys_file, format!("search: |\n  {old_key}\n  {new_key}\n")).unwrap();
    try_until_ok("the new key accepted", || with_key(new_key)).await;
    assert_eq!(with_key(old_key).await, Ok(()), "the old one still, meanwhile");
    // Step two: the old key goes.
    std::fs::write(&keys_file, format!("search: {new_key}\n")).unwrap();
    try_until_err("the old key refused", || with_key(old_key)).await;
    assert_eq!(with_key(new_key).await, Ok(()));
    // A broken edit keeps the keys in force.
    std::fs::write(&keys_file, "search: [").unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(with_key(new_key).await, Ok(()));

    stop.cancel();
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn a_keys_tenant_takes_its_lane_unless_the_call_names_one() {
    let sim = sim(|_| {}).await;
    let dir = std::env::temp_dir().join(format!("teifleet-auth-lane-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("pools.yaml");
    std::fs::write(
        &config,
        format!(
            "auth: {{keysFile: keys.yaml, lane: {{batch: ingest}}}}\npools:\n- {{name: pool-a, upstream: 'http://{}', maxInFlight: 4, maxQueued: 8, queueTimeout: 5s}}\n",
            sim.addr()
        ),
    )
    .unwrap();
    std::fs::write(dir.join("keys.yaml"), format!("search: {SEARCH_KEY}\nbatch: {BATCH_KEY}\n")).unwrap();
    let loaded = file::load(&config).unwrap();
    let metrics = Metrics::new();
    let gate = Arc::new(
        Gate::new(&loaded.default, &metrics.registry, file::policy(loaded.keys_file.as_deref()).unwrap()).unwrap(),
    );
    gate.set_grants(loaded.grants);
    let table = Arc::new(PoolTable::new(&loaded.default, metrics.clone()));
    table.sync(loaded.pools).unwrap();
    let mux = server::start(Settings { auth: gate, ..Settings::default() }, table, metrics).await.unwrap();
    let mut client = embed_client(mux.grpc_addr).await;
    let admitted = |lane: &str| {
        metric_sum(&metrics_text(&mux), "teifleet_lane_admissions_total", &[("lane", lane), ("outcome", "admitted")])
    };
    client.embed(with_meta(embed_request("indexing"), &[("authorization", &bearer(BATCH_KEY))])).await.unwrap();
    assert_eq!((admitted("ingest"), admitted("query")), (1.0, 0.0), "the batch key's calls are ingest");
    let named =
        with_meta(embed_request("a query"), &[("authorization", &bearer(BATCH_KEY)), ("x-teifleet-lane", "query")]);
    client.embed(named).await.unwrap();
    assert_eq!((admitted("ingest"), admitted("query")), (1.0, 1.0), "the call's own lane wins");
    client.embed(with_meta(embed_request("search"), &[("authorization", &bearer(SEARCH_KEY))])).await.unwrap();
    assert_eq!((admitted("ingest"), admitted("query")), (1.0, 2.0), "no lane granted: query");
    std::fs::remove_dir_all(&dir).ok();
}

async fn try_until_ok<F: std::future::Future<Output = Result<(), Code>>>(what: &str, call: impl Fn() -> F) {
    for _ in 0..100 {
        if call().await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

async fn try_until_err<F: std::future::Future<Output = Result<(), Code>>>(what: &str, call: impl Fn() -> F) {
    for _ in 0..100 {
        if call().await == Err(Code::Unauthenticated) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

/// A call routed on to another pool carries its key there, and that pool's sidecar checks it
/// against its own keys: the entry pool's key alone does not open another pool.
#[tokio::test]
async fn a_call_routed_to_another_pool_is_checked_by_that_pools_keys() {
    let sim = sim(|_| {}).await;
    let shared = "shared-key-0123456789abcdef";
    let (pool_b, _) = guarded_pool("pool-b", &sim, keys(&[("search", BATCH_KEY), ("both", shared)])).await;
    let registry = Registry::new();
    let gate = Arc::new(Gate::new("pool-a", &registry, keys(&[("search", SEARCH_KEY), ("both", shared)])).unwrap());
    let mut remote = spec("pool-b", pool_b.grpc_addr, limits(4, 16));
    remote.remote = true;
    let specs = vec![spec("pool-a", sim.addr(), limits(4, 16)), remote];
    let settings = Settings { http_listen: Some(loopback_any()), auth: gate, ..Settings::default() };
    let (entry, _) = mux_with(specs, settings).await;
    let mut client = embed_client(entry.grpc_addr).await;

    let only_a = with_meta(embed_request("to b"), &[("authorization", &bearer(SEARCH_KEY)), (POOL, "pool-b")]);
    let refused = client.embed(only_a).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "pool-b's sidecar refused a key it does not hold");
    let both = with_meta(embed_request("to b"), &[("authorization", &bearer(shared)), (POOL, "pool-b")]);
    client.embed(both).await.expect("a key both pools hold goes through");
    let refused = metric(
        &metrics_text(&entry),
        "teifleet_requests_total{code=\"Unauthenticated\",outcome=\"rejected\",pool=\"pool-b\",priority=\"standard\",protocol=\"grpc\",rpc=\"Embed\"}",
    );
    assert_eq!(refused, Some(1.0), "counted where it entered as rejected, not as an upstream error");

    // HTTP requests become gRPC calls to pool-b's sidecar, carrying the caller's key along.
    let http = entry.http_addr.expect("the HTTP front listens");
    let embed = json!({ "inputs": ["to b"] }).to_string();
    let only_a = bearer(SEARCH_KEY);
    let refused = send(http, "POST", "/embed", &[("authorization", &only_a), (POOL, "pool-b")], &embed).await.unwrap();
    assert_eq!(refused.status, 401, "pool-b's sidecar checks its own keys: {}", refused.body);
    let both = bearer(shared);
    let served = send(http, "POST", "/embed", &[("authorization", &both), (POOL, "pool-b")], &embed).await.unwrap();
    assert_eq!(served.status, 200, "the key reached pool-b: {}", served.body);
}
