//! A pool that sizes itself, as shipped, on the local cluster's real node: `spec.autoscaling` with
//! `minReplicas: 0`.
//!
//! - From zero: the pool starts at zero replicas with the namespace's activator behind its
//!   Service; the first calls (gRPC unary, a gRPC stream, HTTP through curl) are held, the pool
//!   scales to one, and they are all answered once its pod is ready; a call whose deadline is
//!   shorter than the cold start gets DEADLINE_EXCEEDED first.
//! - A step from 0.2× to 3× one replica's capacity: the pool reaches the replicas the load needs
//!   at the 70% target, and goodput recovers to at least 0.9× of what is offered.
//! - Steady load: at most one change of direction.
//! - Load gone: back to zero after the stabilization window.
//! - GPUs exhausted: a GPU pool asked for more replicas than the node has GPUs stops at what fits,
//!   says `InsufficientGPU`, and does not keep asking.
//! - By address (a test of its own): calls to a pool's ClusterIP at zero, gRPC and curl, naming
//!   no pool (`:authority` and `Host` are the address), are held for that pool (not the other
//!   pool at zero beside it) and answered once its replica is ready.
//! - An activator pod killed (a test of its own): of the two activator pods behind a pool at zero,
//!   the one holding calls is deleted; a client that retries UNAVAILABLE after its hint gets every
//!   call answered, whether the stopping pod passed it on or the other pod held it again.
//!
//! Each replica is tei-sim with 200 ms per batch and a share of 4, so it serves about 10 calls a
//! second: the devices, not the host's two cores, bound the pool. The timings are printed for the
//! note and docs/operating.md; the assertions are on states, with generous timeouts.
//!
//! Needs the real node and the images (see `real_pods.rs`); without them it says it was skipped
//! and passes.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;
use kube::{Api, Client};
use serde_json::json;
use teifleet_crds::{EmbeddingPool, labels};
use teifleet_e2e::pools::create_pool;
use teifleet_e2e::real::{NODE, install_chart, pool_template, prerequisites, restricted_namespace, service_addr};
use teifleet_e2e::{admin_client, eventually, helm, http_get, import_into_real_node, install_crd};
use teifleet_proto::v1::EmbedRequest;
use teifleet_proto::v1::embed_client::EmbedClient;
use tonic::Code;
use tonic::transport::Channel;

const RELEASE: &str = "tfscale";
/// What one replica lets in at once, and how long a batch takes on its (simulated) device.
const SHARE: i32 = 4;
const BATCH: Duration = Duration::from_millis(200);
/// Calls a second one replica serves: a batch of up to 4 takes 200 ms, and a call admitted while
/// one runs waits for the next (as in TEI), so about half of 4 / 200 ms (measured: 5 replicas
/// saturated served 50 a second).
const CAPACITY: f64 = 10.0;
const MAX_REPLICAS: i32 = 5;
/// The autoscaler's default target.
const TARGET: f64 = 0.70;

/// A channel to `pool`'s Service that dialled it by name, as a client in the cluster does (the
/// activator tells pools apart by that name), connecting to its ClusterIP.
fn by_name(service: SocketAddr, pool: &str, namespace: &str) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{service}"))
        .unwrap()
        .origin(format!("http://{pool}.{namespace}.svc:50051").parse().unwrap())
        .connect_timeout(Duration::from_secs(5))
        .connect_lazy()
}

fn request(text: String, deadline: Duration) -> tonic::Request<EmbedRequest> {
    let mut request = tonic::Request::new(EmbedRequest { inputs: text, ..Default::default() });
    request.set_timeout(deadline);
    request
}

/// What the autoscaler and the Deployment show at a moment.
#[derive(Clone, Copy, Debug)]
struct Sample {
    at: Duration,
    desired: i32,
    ready: i32,
}

/// Polls the pool every second, from `started`, until `stop`.
fn follow(
    client: Client,
    namespace: String,
    pool: String,
    started: Instant,
    stop: Arc<AtomicBool>,
) -> Arc<Mutex<Vec<Sample>>> {
    let samples = Arc::new(Mutex::new(Vec::new()));
    let into = samples.clone();
    tokio::spawn(async move {
        let api = Api::<EmbeddingPool>::namespaced(client, &namespace);
        while !stop.load(Ordering::Relaxed) {
            if let Ok(pool) = api.get(&pool).await
                && let Some(status) = pool.status
            {
                let desired = status.autoscaling.map_or(-1, |a| a.desired_replicas);
                into.lock().unwrap().push(Sample { at: started.elapsed(), desired, ready: status.ready_replicas });
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    samples
}

/// The moments the desired or ready count changed, for the note.
fn timeline(samples: &[Sample]) -> String {
    let mut changes = Vec::new();
    for pair in samples.windows(2) {
        if (pair[1].desired, pair[1].ready) != (pair[0].desired, pair[0].ready) {
            changes.push(format!(
                "{:.0}s: desired {} ready {}",
                pair[1].at.as_secs_f64(),
                pair[1].desired,
                pair[1].ready
            ));
        }
    }
    changes.join("; ")
}

/// Times the desired count turned around (up after down, or down after up).
fn changes_of_direction(samples: &[Sample]) -> usize {
    let mut last_step = 0;
    let mut turns = 0;
    for pair in samples.windows(2) {
        let step = (pair[1].desired - pair[0].desired).signum();
        if step != 0 {
            if last_step != 0 && step != last_step {
                turns += 1;
            }
            last_step = step;
        }
    }
    turns
}

/// Calls per outcome in one second of load.
#[derive(Clone, Debug, Default)]
struct Second {
    ok: u32,
    refused: u32,
    failed: u32,
}

/// Sends Embed calls at `rate` a second, open loop, spread over `channels`, until `stop`; each
/// call's outcome is counted in the second it was sent.
fn open_loop(channels: Vec<Channel>, rate: Arc<Mutex<f64>>, stop: Arc<AtomicBool>) -> Arc<Mutex<Vec<Second>>> {
    let seconds = Arc::new(Mutex::new(Vec::<Second>::new()));
    let counts = seconds.clone();
    tokio::spawn(async move {
        let started = Instant::now();
        let mut sent = 0u64;
        let mut next = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let per_second = *rate.lock().unwrap();
            next += Duration::from_secs_f64(1.0 / per_second.max(0.1));
            tokio::time::sleep_until(next.into()).await;
            let second = started.elapsed().as_secs() as usize;
            let channel = channels[(sent as usize) % channels.len()].clone();
            sent += 1;
            let counts = counts.clone();
            tokio::spawn(async move {
                let outcome =
                    EmbedClient::new(channel).embed(request(format!("load {sent}"), Duration::from_secs(10))).await;
                let mut counts = counts.lock().unwrap();
                if counts.len() <= second {
                    counts.resize(second + 1, Second::default());
                }
                match outcome {
                    Ok(_) => counts[second].ok += 1,
                    Err(status) if status.code() == Code::ResourceExhausted => counts[second].refused += 1,
                    Err(status) => {
                        eprintln!("load call failed: {status:?}");
                        counts[second].failed += 1
                    }
                }
            });
        }
    });
    seconds
}

fn per_second(window: &[Second]) -> String {
    window.iter().map(|s| format!("{}/{}/{}", s.ok, s.refused, s.failed)).collect::<Vec<_>>().join(" ")
}

fn ok_per_second(seconds: &[Second], from: usize, to: usize) -> f64 {
    let window = &seconds[from.min(seconds.len())..to.min(seconds.len())];
    window.iter().map(|s| f64::from(s.ok)).sum::<f64>() / window.len().max(1) as f64
}

async fn wait_for(
    client: &Client,
    namespace: &str,
    pool: &str,
    what: &str,
    timeout: Duration,
    check: impl Fn(&EmbeddingPool) -> bool,
) {
    let api = Api::<EmbeddingPool>::namespaced(client.clone(), namespace);
    eventually(what, timeout, || async { api.get(pool).await.ok().filter(|p| check(p)).map(drop) }).await;
}

fn desired(pool: &EmbeddingPool) -> Option<i32> {
    pool.status.as_ref()?.autoscaling.as_ref().map(|a| a.desired_replicas)
}

fn ready(pool: &EmbeddingPool) -> i32 {
    pool.status.as_ref().map_or(0, |s| s.ready_replicas)
}

/// The pool at zero with the activator behind its Service: an EndpointSlice of the activator's
/// with a ready address.
async fn wait_at_zero_behind_the_activator(client: &Client, namespace: &str, pool: &str) {
    wait_for(client, namespace, pool, "the pool at zero", Duration::from_secs(120), |p| {
        desired(p) == Some(0) && ready(p) == 0
    })
    .await;
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), namespace);
    let name = format!("{pool}-{}", labels::ACTIVATOR_COMPONENT);
    eventually("the activator behind the pool's Service", Duration::from_secs(120), || async {
        let slice = slices.get_opt(&name).await.ok()??;
        (!slice.endpoints.is_empty()).then_some(())
    })
    .await;
    // kube-proxy's rules follow the slice a moment later.
    let service = service_addr(client, namespace, pool).await;
    eventually("the pool's Service taking connections (at the activator)", Duration::from_secs(60), || async {
        tokio::net::TcpStream::connect(service).await.ok().map(drop)
    })
    .await;
}

/// The first calls at zero: unary, a stream and HTTP, all held and answered once a replica is
/// ready; a call with a 2 s deadline ends at it. Returns how long the unary call waited.
async fn from_zero(client: &Client, namespace: &str, pool: &str) -> Duration {
    let service = service_addr(client, namespace, pool).await;
    let channel = by_name(service, pool, namespace);
    let started = Instant::now();
    let unary = tokio::spawn({
        let channel = channel.clone();
        async move {
            let answer =
                EmbedClient::new(channel).embed(request("first call at zero".into(), Duration::from_secs(180))).await;
            (answer.map(drop), started.elapsed())
        }
    });
    let stream = tokio::spawn({
        let channel = channel.clone();
        async move {
            let messages = futures::stream::iter(
                ["stream 1", "stream 2"].map(|text| EmbedRequest { inputs: text.into(), ..Default::default() }),
            );
            let mut call = tonic::Request::new(messages);
            call.set_timeout(Duration::from_secs(180));
            let mut answers = EmbedClient::new(channel).embed_stream(call).await?.into_inner();
            let mut count = 0;
            while answers.message().await?.is_some() {
                count += 1;
            }
            Ok::<_, tonic::Status>(count)
        }
    });
    let http = tokio::task::spawn_blocking({
        let (pool, namespace) = (pool.to_owned(), namespace.to_owned());
        move || {
            let name = format!("{pool}.{namespace}.svc");
            let resolve = format!("{name}:{}:{}", teifleet_wire::ports::MULTIPLEXER_HTTP, service.ip());
            std::process::Command::new("curl")
                .args(["-sS", "--fail", "--max-time", "180", "--resolve", &resolve])
                .args(["-H", "content-type: application/json", "-d", r#"{"inputs":"HTTP at zero"}"#])
                .arg(format!("http://{name}:{}/embed", teifleet_wire::ports::MULTIPLEXER_HTTP))
                .output()
                .expect("curl runs")
        }
    });
    let hurried = EmbedClient::new(channel.clone()).embed(request("in a hurry".into(), Duration::from_secs(2))).await;
    let hurried_after = started.elapsed();
    let hurried = hurried.unwrap_err();
    assert_eq!(hurried.code(), Code::DeadlineExceeded, "a deadline shorter than the cold start: {hurried:?}");

    let (unary, waited) = unary.await.unwrap();
    unary.expect("the first unary call is answered");
    assert_eq!(stream.await.unwrap().expect("the stream is answered"), 2);
    let http = http.await.unwrap();
    assert!(http.status.success(), "HTTP at zero: {}", String::from_utf8_lossy(&http.stderr));
    assert!(
        hurried_after < waited,
        "the hurried call ended at its deadline ({hurried_after:?}), before the cold start ({waited:?})"
    );
    println!("from zero: the first calls waited {waited:?} (unary); the 2 s call ended after {hurried_after:?}");
    waited
}

/// How many GPUs the real node offers (2 unless the cluster was started otherwise).
async fn node_gpus(client: &Client) -> i32 {
    let node = Api::<Node>::all(client.clone()).get(NODE).await.expect("the real node");
    let allocatable = node.status.and_then(|s| s.allocatable).unwrap_or_default();
    allocatable.get("nvidia.com/gpu").and_then(|q| q.0.parse().ok()).unwrap_or(0)
}

fn autoscaled(images_tei_sim: &str, gpu: &str, min: i32, max: i32) -> serde_json::Value {
    json!({
        // The autoscaler owns the replicas: none are given (create_pool's default is dropped).
        "replicas": null,
        "gpu": { "type": gpu },
        "tei": { "image": images_tei_sim, "extraArgs": [format!("--fixed-latency={}ms", BATCH.as_millis())] },
        "concurrency": { "maxInFlight": SHARE * max, "maxInFlightPerReplica": SHARE, "maxQueued": 64 },
        "autoscaling": {
            "minReplicas": min, "maxReplicas": max,
            "scaleDownStabilization": "30s", "scaleToZeroAfter": "30s", "coldStartHold": "180s",
        },
        "template": pool_template(),
    })
}

#[tokio::test]
async fn a_pool_scales_from_zero_with_load_and_back_and_stops_at_the_gpus_it_has_on_real_pods() {
    let client = admin_client().await;
    let Some(images) = prerequisites(&client).await else { return };
    for (tar, _) in images.values() {
        import_into_real_node(tar);
    }
    install_crd(&client).await;
    let ns = restricted_namespace("real-scale").await;
    let namespace = ns.name.clone();
    install_chart(&client, &namespace, RELEASE).await;
    let tei_sim = &images["tei-sim"].1;

    // From zero.
    let pool = "elastic";
    create_pool(&client, &namespace, pool, autoscaled(tei_sim, "cpu", 0, MAX_REPLICAS)).await;
    wait_at_zero_behind_the_activator(&client, &namespace, pool).await;
    let cold_start = from_zero(&client, &namespace, pool).await;

    // A step from 0.2x to 3x one replica's capacity.
    let started = Instant::now();
    let stop_following = Arc::new(AtomicBool::new(false));
    let samples = follow(client.clone(), namespace.clone(), pool.into(), started, stop_following.clone());
    let service = service_addr(&client, &namespace, pool).await;
    let channels: Vec<Channel> = (0..8).map(|_| by_name(service, pool, &namespace)).collect();
    let rate = Arc::new(Mutex::new(0.2 * CAPACITY));
    let stop_load = Arc::new(AtomicBool::new(false));
    let seconds = open_loop(channels, rate.clone(), stop_load.clone());
    // The calls held at zero may have asked for more than one; a fifth of a replica's capacity
    // needs one, once the scale-down window has passed.
    wait_for(&client, &namespace, pool, "one replica for 0.2x load", Duration::from_secs(180), |p| {
        desired(p) == Some(1) && ready(p) == 1
    })
    .await;
    let settled = started.elapsed().as_secs() as usize;
    tokio::time::sleep(Duration::from_secs(15)).await;
    let low = ok_per_second(&seconds.lock().unwrap(), settled, settled + 15);
    println!("0.2x load ({:.0} calls/s offered): {low:.1} OK/s on one replica after {settled} s", 0.2 * CAPACITY);

    let offered = 3.0 * CAPACITY;
    *rate.lock().unwrap() = offered;
    let step = started.elapsed();
    let needed = ((offered / (CAPACITY * TARGET)).ceil() as i32).min(MAX_REPLICAS);
    wait_for(&client, &namespace, pool, &format!("{needed} replicas ready"), Duration::from_secs(240), |p| {
        ready(p) >= needed
    })
    .await;
    let scaled_in = started.elapsed() - step;
    let recovered_at = started.elapsed().as_secs() as usize;
    // Counted by the second each call was sent: the last seconds' calls are given time to end.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let goodput = ok_per_second(&seconds.lock().unwrap(), recovered_at + 5, recovered_at + 25);
    let window: Vec<Second> = seconds.lock().unwrap()[recovered_at + 5..recovered_at + 25].to_vec();
    println!("after recovery, per second (ok/refused/failed): {}", per_second(&window));
    let ramp = ok_per_second(&seconds.lock().unwrap(), step.as_secs() as usize, recovered_at);
    println!(
        "3x load ({offered:.0} calls/s offered): {needed} replicas ready {scaled_in:?} after the step; \
         goodput during the ramp {ramp:.1} OK/s, after {goodput:.1} OK/s ({:.2}x offered)",
        goodput / offered
    );

    // Steady load: the count holds.
    let steady_from = samples.lock().unwrap().len();
    tokio::time::sleep(Duration::from_secs(90)).await;
    let steady: Vec<Sample> = samples.lock().unwrap()[steady_from..].to_vec();
    let turns = changes_of_direction(&steady);
    let counts: Vec<i32> = steady.iter().map(|s| s.desired).collect();
    println!(
        "steady 3x for 90 s: desired {:?}..{:?}, {turns} change(s) of direction",
        counts.iter().min(),
        counts.iter().max()
    );

    // Load gone: back to zero.
    stop_load.store(true, Ordering::Relaxed);
    let stopped = started.elapsed();
    wait_for(&client, &namespace, pool, "back to zero replicas", Duration::from_secs(300), |p| {
        desired(p) == Some(0) && ready(p) == 0
    })
    .await;
    let to_zero = started.elapsed() - stopped;
    println!("load gone: at zero {to_zero:?} later (scaleDownStabilization 30s, scaleToZeroAfter 30s)");
    stop_following.store(true, Ordering::Relaxed);
    println!("timeline (from the 0.2x load): {}", timeline(&samples.lock().unwrap()));
    let failed: u32 = seconds.lock().unwrap().iter().map(|s| s.failed).sum();

    // GPUs exhausted.
    let gpus = node_gpus(&client).await;
    let gpu_pool = "scarce";
    let asked = gpus + 2;
    create_pool(&client, &namespace, gpu_pool, autoscaled(tei_sim, "nvidia-l4", 1, asked)).await;
    wait_for(&client, &namespace, gpu_pool, "a ready replica", Duration::from_secs(120), |p| ready(p) >= 1).await;
    let gpu_service = service_addr(&client, &namespace, gpu_pool).await;
    let gpu_channels: Vec<Channel> = (0..8).map(|_| by_name(gpu_service, gpu_pool, &namespace)).collect();
    let gpu_rate = Arc::new(Mutex::new(f64::from(asked) * CAPACITY));
    let stop_gpu_load = Arc::new(AtomicBool::new(false));
    let _gpu_seconds = open_loop(gpu_channels, gpu_rate, stop_gpu_load.clone());
    let api = Api::<EmbeddingPool>::namespaced(client.clone(), &namespace);
    let message = eventually("the autoscaler stopping at the GPUs there are", Duration::from_secs(240), || async {
        let pool = api.get(gpu_pool).await.ok()?;
        let autoscaling = pool.status.as_ref()?.autoscaling.clone()?;
        autoscaling.message.contains("InsufficientGPU").then_some(autoscaling)
    })
    .await;
    println!("GPUs exhausted ({gpus} on the node): {message:?}");
    tokio::time::sleep(Duration::from_secs(30)).await;
    let held = api.get(gpu_pool).await.unwrap();
    let held_desired = desired(&held).unwrap_or(-1);
    stop_gpu_load.store(true, Ordering::Relaxed);
    let events = Api::<Event>::namespaced(client.clone(), &namespace)
        .list(&ListParams::default().fields(&format!("involvedObject.name={gpu_pool}")))
        .await
        .unwrap();
    let gpu_warnings = events.items.iter().filter(|e| e.reason.as_deref() == Some("InsufficientGPU")).count();
    let pending = Api::<Pod>::namespaced(client.clone(), &namespace)
        .list(&ListParams::default().labels(&labels::pool_selector(gpu_pool)))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending"))
        .count();
    println!(
        "GPUs exhausted after 30 s more: desired {held_desired}, {pending} pod(s) pending, {gpu_warnings} InsufficientGPU event(s)"
    );

    let (ok, output) = helm(&["uninstall", RELEASE, "-n", &namespace, "--wait", "--timeout", "60s"]);
    assert!(ok, "{output}");

    // Checked last, so one run shows every figure.
    assert!(cold_start < Duration::from_secs(180));
    assert!(goodput >= 0.9 * offered, "goodput {goodput:.1} OK/s < 0.9 x {offered:.0} offered");
    assert!(turns <= 1, "steady load changed direction {turns} times: {counts:?}");
    assert_eq!(failed, 0, "no load call failed other than refusals");
    assert!(held_desired <= gpus, "the autoscaler stopped at the {gpus} GPUs there are: desired {held_desired}");
    assert!(pending <= 1, "at most one pod waits for a GPU, not a pile of them: {pending}");
    assert!(gpu_warnings <= 2, "the GPU shortage is told once, not every reconcile: {gpu_warnings} events");
}

/// A release of its own, so the test runs alone as well as after the one above.
const BY_ADDRESS_RELEASE: &str = "tfscaleip";

#[tokio::test]
async fn calls_to_a_pools_cluster_ip_at_zero_naming_no_pool_are_held_for_it_and_answered_on_real_pods() {
    let client = admin_client().await;
    let Some(images) = prerequisites(&client).await else { return };
    for (tar, _) in images.values() {
        import_into_real_node(tar);
    }
    install_crd(&client).await;
    let ns = restricted_namespace("real-scale-ip").await;
    let namespace = ns.name.clone();
    install_chart(&client, &namespace, BY_ADDRESS_RELEASE).await;
    let tei_sim = &images["tei-sim"].1;

    // Two pools at zero behind the one activator: the address must tell them apart.
    let (pool, other) = ("addressed", "beside");
    create_pool(&client, &namespace, pool, autoscaled(tei_sim, "cpu", 0, 1)).await;
    create_pool(&client, &namespace, other, autoscaled(tei_sim, "cpu", 0, 1)).await;
    wait_at_zero_behind_the_activator(&client, &namespace, pool).await;
    wait_at_zero_behind_the_activator(&client, &namespace, other).await;

    // Dialled as an address: `:authority` is `<ClusterIP>:50051`, and no pool metadata.
    let service = service_addr(&client, &namespace, pool).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{service}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect_lazy();
    let started = Instant::now();
    let unary = tokio::spawn(async move {
        let answer =
            EmbedClient::new(channel).embed(request("to the ClusterIP".into(), Duration::from_secs(180))).await;
        (answer.map(drop), started.elapsed())
    });
    // curl to the address: `Host: <ClusterIP>:8000`.
    let http = tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl")
            .args(["-sS", "--fail", "--max-time", "180"])
            .args(["-H", "content-type: application/json", "-d", r#"{"inputs":"curl to the ClusterIP"}"#])
            .arg(format!("http://{}:{}/embed", service.ip(), teifleet_wire::ports::MULTIPLEXER_HTTP))
            .output()
            .expect("curl runs")
    });

    let (unary, waited) = unary.await.unwrap();
    let http = http.await.unwrap();
    let api = Api::<EmbeddingPool>::namespaced(client.clone(), &namespace);
    let beside = api.get(other).await.unwrap();
    println!(
        "by address: the gRPC call to {service} was answered after {waited:?}; the pool beside it desired {:?}",
        desired(&beside)
    );
    let (ok, output) = helm(&["uninstall", BY_ADDRESS_RELEASE, "-n", &namespace, "--wait", "--timeout", "60s"]);
    assert!(ok, "{output}");

    unary.expect("the gRPC call to the pool's ClusterIP is held and answered");
    assert!(http.status.success(), "curl to the ClusterIP: {}", String::from_utf8_lossy(&http.stderr));
    assert!(String::from_utf8_lossy(&http.stdout).starts_with("[["), "embeddings: {:?}", http.stdout);
    assert_eq!(
        (desired(&beside), ready(&beside)),
        (Some(0), 0),
        "the calls woke the pool whose address they dialled, not the other"
    );
}

/// A release of its own, so the test runs alone as well as after the others.
const SURVIVES_RELEASE: &str = "tfscaleha";
/// A node label the held-for pool's pods require, put on the real node only once the killed
/// activator pod has answered its calls: until then the pool cannot start a replica.
const LATE_NODE_LABEL: &str = "teifleet.dev/e2e-activator-late";

/// One Embed call through `channel` that, like a gRPC client with a retry policy for UNAVAILABLE,
/// tries again after the server's pushback (1 s without one) until its deadline: how many tries
/// it took, or the last failure.
async fn retrying_embed(channel: Channel, text: String, deadline: Duration) -> Result<u32, tonic::Status> {
    let until = Instant::now() + deadline;
    let mut tries = 0;
    loop {
        tries += 1;
        let left = until.saturating_duration_since(Instant::now());
        match EmbedClient::new(channel.clone()).embed(request(text.clone(), left)).await {
            Ok(_) => return Ok(tries),
            Err(status) if status.code() == Code::Unavailable && Instant::now() < until => {
                let pushback = status.metadata().get("grpc-retry-pushback-ms").and_then(|v| v.to_str().ok());
                let wait =
                    pushback.and_then(|ms| ms.parse().ok()).map_or(Duration::from_secs(1), Duration::from_millis);
                tokio::time::sleep(wait).await;
            }
            Err(status) => return Err(status),
        }
    }
}

/// The calls each activator pod of `namespace` holds, by its own report (`/activations` on its
/// admin port, by pod IP); `None` until every pod listed answers.
async fn held_per_pod(pods: &Api<Pod>) -> Option<Vec<(String, u64)>> {
    let mut holding = Vec::new();
    for pod in pods.list(&ListParams::default().labels(&labels::activator_selector())).await.ok()?.items {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let ip: std::net::IpAddr = pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()?;
        let admin = SocketAddr::new(ip, teifleet_wire::ports::MULTIPLEXER_ADMIN);
        let report: serde_json::Value = serde_json::from_str(&http_get(admin, "/activations").await?).ok()?;
        let held: u64 = report["pools"].as_array()?.iter().filter_map(|p| p["held"].as_u64()).sum();
        holding.push((pod.metadata.name.clone()?, held));
    }
    Some(holding)
}

async fn label_real_node(client: &Client, value: Option<&str>) {
    let patch = json!({ "metadata": { "labels": { LATE_NODE_LABEL: value } } });
    Api::<Node>::all(client.clone())
        .patch(NODE, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
        .await
        .expect("the real node's labels");
}

#[tokio::test]
async fn a_client_that_retries_loses_no_call_when_an_activator_pod_holding_them_is_killed_on_real_pods() {
    let client = admin_client().await;
    let Some(images) = prerequisites(&client).await else { return };
    for (tar, _) in images.values() {
        import_into_real_node(tar);
    }
    install_crd(&client).await;
    label_real_node(&client, None).await;
    let ns = restricted_namespace("real-scale-ha").await;
    let namespace = ns.name.clone();
    install_chart(&client, &namespace, SURVIVES_RELEASE).await;
    let tei_sim = &images["tei-sim"].1;

    // "anchor" comes first by name, so the activator is placed as it is (on the real node); the
    // pool called cannot start a replica until the node gets LATE_NODE_LABEL.
    create_pool(&client, &namespace, "anchor", autoscaled(tei_sim, "cpu", 0, 1)).await;
    let pool = "survives";
    let mut late = autoscaled(tei_sim, "cpu", 0, 1);
    late["template"]["nodeSelector"][LATE_NODE_LABEL] = json!("true");
    create_pool(&client, &namespace, pool, late).await;
    wait_at_zero_behind_the_activator(&client, &namespace, pool).await;
    // Both activator pods (the default two) ready and behind the pool's Service.
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), &namespace);
    let slice = format!("{pool}-{}", labels::ACTIVATOR_COMPONENT);
    eventually("both activator pods behind the pool's Service", Duration::from_secs(120), || async {
        let slice = slices.get_opt(&slice).await.ok()??;
        (slice.endpoints.len() == 2).then_some(())
    })
    .await;
    let budget = Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(client.clone(), &namespace)
        .get("teifleet-activator")
        .await
        .expect("the activator's PodDisruptionBudget");
    assert_eq!(
        budget.spec.and_then(|spec| spec.max_unavailable),
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1))
    );

    // Calls at zero, each on a connection of its own, so the Service spreads them over both pods.
    let service = service_addr(&client, &namespace, pool).await;
    let started = Instant::now();
    let calls: Vec<_> = (0..20)
        .map(|call| {
            let channel = by_name(service, pool, &namespace);
            tokio::spawn(retrying_embed(channel, format!("held call {call}"), Duration::from_secs(180)))
        })
        .collect();
    let pods = Api::<Pod>::namespaced(client.clone(), &namespace);
    let (victim, held_there) =
        eventually("the activator pods holding the 20 calls", Duration::from_secs(60), || async {
            let holding = held_per_pod(&pods).await?;
            let total: u64 = holding.iter().map(|(_, held)| held).sum();
            (total == 20).then(|| holding.into_iter().max_by_key(|(_, held)| *held))?
        })
        .await;
    pods.delete(&victim, &Default::default()).await.expect("the activator pod is deleted");
    let deleted = Instant::now();
    // The pod stopping answers its calls UNAVAILABLE after its drain delay; retried, they are
    // held again at the other pod (or the one replacing it).
    eventually("every call held again by the pods staying", Duration::from_secs(90), || async {
        let holding = held_per_pod(&pods).await?;
        (holding.iter().all(|(name, _)| *name != victim) && holding.iter().map(|(_, held)| held).sum::<u64>() == 20)
            .then_some(())
    })
    .await;
    let held_again_after = deleted.elapsed();
    // Now the pool may start its replica.
    label_real_node(&client, Some("true")).await;

    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap());
    }
    label_real_node(&client, None).await;
    let answered_after = started.elapsed();
    let retried = answers.iter().filter(|answer| answer.as_ref().is_ok_and(|tries| *tries > 1)).count();
    println!(
        "an activator pod killed: {victim} held {held_there} of 20 calls; {held_again_after:?} after its deletion the \
         other pod held all 20; all answered {answered_after:?} after they were sent, {retried} after a retry"
    );
    let (ok, output) = helm(&["uninstall", SURVIVES_RELEASE, "-n", &namespace, "--wait", "--timeout", "60s"]);
    assert!(ok, "{output}");
    for answer in &answers {
        answer.as_ref().expect("every call is answered after its retries");
    }
    assert!(held_there > 0, "the pod killed held calls");
    assert_eq!(retried as u64, held_there, "the calls of the pod killed, each retried, and no other");
}
