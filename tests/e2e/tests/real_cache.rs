//! A pool with `spec.cache` as shipped, in a real pod on the local cluster's real node (`real-0`):
//! the operator grows the sidecar's memory for the local tier (its container's limit and its
//! `--memory-limit`, which the sidecar budgets from); a client on the host calling `/embed`
//! through the pool's ClusterIP Service is told `x-teifleet-cache: miss`, then `hit` with the
//! same vectors, then `partial`; the sidecar counts the hits, and TEI (tei-sim, whose counters the
//! sidecar relays at `/upstream/metrics`) was asked for the misses only.
//!
//! Needs the real node and the images, as `real_pods.rs` does; without either it says it was
//! skipped and passes.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::Api;
use serde_json::json;
use teifleet_crds::cache::{SIDECAR_BUDGET_PERCENT, sidecar_limit_growth};
use teifleet_crds::labels;
use teifleet_e2e::pools::{create_pool, wait_until_ready};
use teifleet_e2e::real::{
    ip_of, on_the_real_node, pool_template, service_addr, sidecar_metrics, tei_metrics, wait_ready_pods,
};
use teifleet_e2e::{admin_client, eventually, helm};
use teifleet_multiplexer::cache::HEADER;
use teifleet_testkit::prom;
use teifleet_wire::ports;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

const RELEASE: &str = "tfcache";
const POOL: &str = "cache";
const MI: u64 = 1 << 20;
/// The pool's local tier.
const SIZE_MI: u64 = 16;
/// The sidecar's memory limit and request when the pool names none and has no cache
/// (operator/src/render/deployment.rs).
const DEFAULT_LIMIT_MI: u64 = 256;
const DEFAULT_REQUEST_MI: u64 = 64;

/// What one `POST /embed` got back.
#[derive(Debug)]
struct Answer {
    status: u16,
    /// The `x-teifleet-cache` header, if the answer had one.
    cache: Option<String>,
    body: String,
}

impl Answer {
    fn vectors(&self) -> Vec<Vec<f32>> {
        serde_json::from_str(&self.body).unwrap_or_else(|error| panic!("TEI's /embed answer ({error}): {self:?}"))
    }
}

/// `POST /embed` of `inputs` over HTTP/1.0 (the server closes the connection after the answer),
/// within 10 s; what went wrong otherwise.
async fn try_embed_http(addr: SocketAddr, inputs: &[&str]) -> Result<Answer, String> {
    let body = json!({ "inputs": inputs }).to_string();
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
        let head = format!(
            "POST /embed HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.map_err(|e| format!("write: {e}"))?;
        stream.write_all(body.as_bytes()).await.map_err(|e| format!("write: {e}"))?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.map_err(|e| format!("read: {e}"))?;
        let (head, body) = response.split_once("\r\n\r\n").ok_or_else(|| format!("not HTTP: {response:?}"))?;
        let mut lines = head.lines();
        let status = lines.next().and_then(|line| line.split_whitespace().nth(1)?.parse().ok());
        let status = status.ok_or_else(|| format!("no status: {head:?}"))?;
        let cache = lines.find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.trim().eq_ignore_ascii_case(HEADER).then(|| value.trim().to_owned())
        });
        Ok(Answer { status, cache, body: body.to_owned() })
    };
    tokio::time::timeout(Duration::from_secs(10), exchange).await.map_err(|_| "no answer within 10 s".to_owned())?
}

async fn embed_http(addr: SocketAddr, inputs: &[&str]) -> Answer {
    try_embed_http(addr, inputs).await.unwrap_or_else(|error| panic!("POST /embed {inputs:?} to {addr}: {error}"))
}

/// A quantity of whole MiB, as the operator writes the grown ones.
fn mib(quantity: &str) -> u64 {
    quantity.strip_suffix("Mi").and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{quantity}: whole MiB"))
}

/// What the sidecar and its TEI have counted so far.
#[derive(Debug, Clone, Copy)]
struct Counts {
    hit_local: f64,
    miss: f64,
    bypass: f64,
    /// tei-sim's `te_request_count`: inference calls TEI received (one per input the sidecar sent).
    tei_requests: f64,
}

async fn counts(ip: IpAddr) -> Counts {
    let (sidecar, tei) = eventually("the sidecar's and TEI's metrics", Duration::from_secs(10), || async {
        Some((sidecar_metrics(ip).await?, tei_metrics(ip).await?))
    })
    .await;
    let inputs = |result: &str| prom::sum_matching(&sidecar, "teifleet_cache_inputs_total", &[("result", result)]);
    Counts {
        hit_local: inputs("hit_local"),
        miss: inputs("miss"),
        bypass: inputs("bypass"),
        tei_requests: prom::value(&tei, "te_request_count").unwrap_or_else(|| panic!("te_request_count in:\n{tei}")),
    }
}

fn sidecar_container(pod: &Pod) -> &Container {
    let spec = pod.spec.as_ref().expect("a pod spec");
    spec.containers.iter().find(|c| c.name == "multiplexer").expect("the multiplexer sidecar")
}

#[tokio::test]
async fn a_pool_with_a_cache_answers_repeated_inputs_without_asking_tei_on_a_real_pod() {
    let client = admin_client().await;
    let Some((ns, images)) = on_the_real_node(&client, "real-cache", RELEASE).await else { return };

    create_pool(
        &client,
        &ns.name,
        POOL,
        json!({
            "gpu": { "type": "cpu" },
            "replicas": 1,
            "tei": { "image": images["tei-sim"].1 },
            "concurrency": { "maxInFlight": 4 },
            "cache": { "size": format!("{SIZE_MI}Mi") },
            "template": pool_template(),
        }),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let pod = wait_ready_pods(&pods, &labels::pool_selector(POOL), 1).await.remove(0);
    wait_until_ready(&client, &ns.name, POOL).await;
    let ready = Instant::now();
    let ip = ip_of(&pod);

    // 1. The sidecar has the memory the operator adds for the tier: the request grows by the
    // tier, the limit by 8/3 of it (rounded up to a MiB), and the sidecar is told the same limit.
    let sidecar = sidecar_container(&pod);
    let resources = sidecar.resources.as_ref().expect("the sidecar's resources");
    let memory = |map: Option<&BTreeMap<String, Quantity>>| mib(&map.and_then(|m| m.get("memory")).expect("memory").0);
    let limit_mi = memory(resources.limits.as_ref());
    let request_mi = memory(resources.requests.as_ref());
    let expected_limit_mi = (DEFAULT_LIMIT_MI * MI + sidecar_limit_growth(SIZE_MI * MI)).div_ceil(MI);
    println!("sidecar memory with a {SIZE_MI}Mi tier: request {request_mi}Mi, limit {limit_mi}Mi");
    assert!(limit_mi > DEFAULT_LIMIT_MI, "the limit {limit_mi}Mi grows past the default {DEFAULT_LIMIT_MI}Mi");
    assert_eq!(limit_mi, expected_limit_mi, "256Mi + sidecar_limit_growth({SIZE_MI}Mi), in whole MiB");
    assert_eq!(request_mi, DEFAULT_REQUEST_MI + SIZE_MI, "the request grows by the tier");
    let args = sidecar.args.clone().unwrap_or_default();
    let flag = format!("--memory-limit={limit_mi}Mi");
    assert!(args.contains(&flag), "the sidecar is told its limit ({flag}): {args:?}");
    // And it budgets from it: its budget is its share of the grown limit, not of the default.
    let text = eventually("the sidecar's metrics", Duration::from_secs(10), || sidecar_metrics(ip)).await;
    let budget = prom::value(&text, "teifleet_memory_budget_bytes").expect("teifleet_memory_budget_bytes");
    let expected_budget = (limit_mi * MI * SIDECAR_BUDGET_PERCENT / 100) as f64;
    assert!((budget - expected_budget).abs() <= 1.0, "budget {budget} bytes, expected {expected_budget}");

    // 2. Through the Service's HTTP port from the host. Until the sidecar has read TEI's Info its
    // calls pass the cache (no header); kube-proxy's rules may also lag the pod. A text of its
    // own, asked until an answer says the cache looked it up, waits for both.
    let http = SocketAddr::new(service_addr(&client, &ns.name, POOL).await.ip(), ports::MULTIPLEXER_HTTP);
    let mut attempt = 0;
    eventually("the Service's /embed answered through the cache", Duration::from_secs(30), || {
        attempt += 1;
        let text = format!("warm-up {attempt}");
        async move {
            let answer = try_embed_http(http, &[&text]).await.ok()?;
            (answer.status == 200 && answer.cache.is_some()).then_some(())
        }
    })
    .await;

    let before = counts(ip).await;
    let first = embed_http(http, &["a", "b"]).await;
    let second = embed_http(http, &["a", "b"]).await;
    let third = embed_http(http, &["a", "c"]).await;
    let after = counts(ip).await;
    println!("answers: {:?}, {:?}, {:?}", first.cache, second.cache, third.cache);
    println!("counts before {before:?}, after {after:?}");
    for answer in [&first, &second, &third] {
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    assert_eq!(first.cache.as_deref(), Some("miss"), "{first:?}");
    assert_eq!(second.cache.as_deref(), Some("hit"), "{second:?}");
    assert_eq!(third.cache.as_deref(), Some("partial"), "{third:?}");
    let (first_vectors, third_vectors) = (first.vectors(), third.vectors());
    assert_eq!(first_vectors.len(), 2, "{first:?}");
    assert!(first_vectors.iter().all(|v| !v.is_empty()), "{first:?}");
    assert_eq!(second.vectors(), first_vectors, "a hit is TEI's answer, exactly");
    assert_eq!(third_vectors.len(), 2, "{third:?}");
    assert_eq!(third_vectors[0], first_vectors[0], "\"a\" from the cache is the vector TEI gave");

    // 3. The sidecar counted the hits (both of the second call, "a" of the third) and the misses
    // ("a" and "b" of the first, "c" of the third); TEI was asked for the misses only.
    let hits = after.hit_local - before.hit_local;
    let misses = after.miss - before.miss;
    let tei = after.tei_requests - before.tei_requests;
    assert!(after.hit_local >= 3.0, "teifleet_cache_inputs_total{{result=\"hit_local\"}}: {after:?}");
    assert_eq!(hits, 3.0, "hit_local rose by the 3 hits: {before:?} -> {after:?}");
    assert_eq!(misses, 3.0, "miss rose by the 3 misses: {before:?} -> {after:?}");
    assert_eq!(after.bypass, before.bypass, "no call passed by the cache: {before:?} -> {after:?}");
    assert_eq!(tei, 3.0, "TEI embedded the 3 misses, not the 6 inputs asked: {before:?} -> {after:?}");
    println!("checked in {:?} after the pool was Ready", ready.elapsed());

    let (ok, output) = helm(&["uninstall", RELEASE, "-n", &ns.name, "--wait", "--timeout", "60s"]);
    assert!(ok, "{output}");
}
