//! One budget across a pool's replicas, as shipped, on the local cluster's real node: a client on
//! the host holding ONE connection to the pool's ClusterIP Service (kube-proxy pins it to one
//! pod) gets the whole pool, its calls spilling from the pinned replica to siblings with room,
//! about as much as the same client spreading its calls over 8 connections; every replica's
//! device does its part of the work; the budget holds pool-wide, spills included; the pinned
//! sidecar counts the spills; and a sibling deleted under load loses no call.
//!
//! Pools of 2 and 3 replicas of tei-sim (each batch takes 50 ms of device time, so the devices,
//! not the host's CPU, bound the pool) with a share of 4 in flight per replica. Per replica, the
//! device busy time and the high-water mark of what TEI held at once are read from tei-sim's
//! `te_sim_device_busy_seconds_total` and `te_sim_max_in_flight`, which the sidecar relays on its
//! admin port (`/upstream/metrics`): TEI listens on its pod's loopback only.
//!
//! Needs the real node and the images (see `real_pods.rs`); without them it says it was skipped
//! and passes.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client};
use serde_json::json;
use teifleet_crds::{EmbeddingPool, labels};
use teifleet_e2e::pools::{create_pool, wait_until_ready};
use teifleet_e2e::real::{
    Images, NODE, START, Tally, answering_channel, connect, embed, install_chart, ip_of, limit_in_flight,
    pool_template, prerequisites, restricted_namespace, service_addr, sidecar_metrics, steady_load, tei_metrics,
    wait_ready_pods,
};
use teifleet_e2e::{admin_client, eventually, helm, import_into_real_node, install_crd};
use teifleet_testkit::prom;
use tonic::Code;
use tonic::transport::Channel;

const RELEASE: &str = "tfspill";
/// Each replica's share of the pool's in-flight budget: `maxInFlight` is this times the replicas.
const SHARE: usize = 4;
/// Concurrent calls of the load, as a multiple of the pool's budget: well above its capacity.
const OVERLOAD: usize = 4;
/// Connections of the client that spreads its calls.
const CONNECTIONS: usize = 8;
/// One measured round of load; rounds alternate between one connection and eight.
const ROUND: Duration = Duration::from_secs(5);
const ROUNDS: usize = 2;
/// Callers on one connection while a sibling is deleted, each calling one call after another
/// (20 ms apart): more than the pinned replica's share, so calls spill all along.
const UNDER_DELETION: usize = 2 * SHARE;

/// A pool pod: its name and IP.
#[derive(Clone, Debug)]
struct Replica {
    name: String,
    ip: IpAddr,
}

/// What one pod's sidecar and TEI say at a moment; a difference of two, over an interval (the
/// high-water mark stays the later reading's: it is since the pod started).
#[derive(Clone, Debug, Default)]
struct Reading {
    /// `teifleet_requests_total`: calls this replica took from its own clients.
    requests: f64,
    /// `teifleet_spills_total{result="served"}`: calls it spilled that a sibling served.
    spills_served: f64,
    /// `teifleet_spills_total{result="refused"|"unreachable"}`: spills served here after all.
    spills_back: f64,
    /// `teifleet_spilled_in_total`: calls siblings spilled here.
    spilled_in: f64,
    /// `te_sim_device_busy_seconds_total`.
    busy: f64,
    /// `te_sim_max_in_flight`: the most TEI held at once since the pod started.
    high_water: f64,
    /// `teifleet_requests_total` of other outcomes than `ok`, by outcome.
    not_ok: BTreeMap<String, f64>,
}

impl Reading {
    fn since(&self, before: &Reading) -> Reading {
        let mut not_ok = self.not_ok.clone();
        for (outcome, count) in &before.not_ok {
            *not_ok.entry(outcome.clone()).or_default() -= count;
        }
        not_ok.retain(|_, count| *count != 0.0);
        Reading {
            requests: self.requests - before.requests,
            spills_served: self.spills_served - before.spills_served,
            spills_back: self.spills_back - before.spills_back,
            spilled_in: self.spilled_in - before.spilled_in,
            busy: self.busy - before.busy,
            high_water: self.high_water,
            not_ok,
        }
    }

    fn add(&mut self, other: Reading) {
        self.requests += other.requests;
        self.spills_served += other.spills_served;
        self.spills_back += other.spills_back;
        self.spilled_in += other.spilled_in;
        self.busy += other.busy;
        self.high_water = self.high_water.max(other.high_water);
        for (outcome, count) in other.not_ok {
            *self.not_ok.entry(outcome).or_default() += count;
        }
    }
}

async fn read(replica: &Replica) -> Reading {
    let ip = replica.ip;
    let (sidecar, tei) = eventually(&format!("the metrics of {}", replica.name), Duration::from_secs(10), || async {
        Some((sidecar_metrics(ip).await?, tei_metrics(ip).await?))
    })
    .await;
    let tei_value = |name: &str| {
        prom::value(&tei, name).unwrap_or_else(|| panic!("{name} in {}'s TEI metrics:\n{tei}", replica.name))
    };
    let spills = |result: &str| prom::sum_matching(&sidecar, "teifleet_spills_total", &[("result", result)]);
    let mut not_ok = BTreeMap::new();
    for line in sidecar.lines().filter(|line| line.starts_with("teifleet_requests_total{")) {
        let outcome = line.split("outcome=\"").nth(1).and_then(|rest| rest.split('"').next());
        let count = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
        if let (Some(outcome), Some(count)) = (outcome, count)
            && outcome != "ok"
        {
            *not_ok.entry(outcome.to_owned()).or_default() += count;
        }
    }
    Reading {
        requests: prom::sum(&sidecar, "teifleet_requests_total"),
        spills_served: spills("served"),
        spills_back: spills("refused") + spills("unreachable"),
        spilled_in: prom::sum(&sidecar, "teifleet_spilled_in_total"),
        busy: tei_value("te_sim_device_busy_seconds_total"),
        high_water: tei_value("te_sim_max_in_flight"),
        not_ok,
    }
}

async fn read_all(replicas: &[Replica]) -> Vec<Reading> {
    let mut readings = Vec::new();
    for replica in replicas {
        readings.push(read(replica).await);
    }
    readings
}

/// What the client saw in one round of load.
#[derive(Debug, Default)]
struct Calls {
    ok: u64,
    /// RESOURCE_EXHAUSTED: the pool was full (the load is above its capacity).
    refused: u64,
    /// The waits the refusals asked for (`grpc-retry-pushback-ms`), together.
    pushed_back: Duration,
    /// Anything else, by code.
    failed: BTreeMap<String, u64>,
    took: Duration,
}

impl Calls {
    fn add(&mut self, other: Calls) {
        self.ok += other.ok;
        self.refused += other.refused;
        self.pushed_back += other.pushed_back;
        for (code, count) in other.failed {
            *self.failed.entry(code).or_default() += count;
        }
        self.took += other.took;
    }

    fn ok_per_s(&self) -> f64 {
        self.ok as f64 / self.took.as_secs_f64()
    }
}

impl std::fmt::Display for Calls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mean_pushback = self.pushed_back.checked_div(u32::try_from(self.refused).unwrap_or(u32::MAX));
        write!(
            f,
            "{} OK, {} RESOURCE_EXHAUSTED (pushback {:?} on average), failed {:?}, in {:?}",
            self.ok,
            self.refused,
            mean_pushback.unwrap_or_default(),
            self.failed,
            self.took
        )
    }
}

/// How long a refused caller waits before calling again: the `grpc-retry-pushback-ms` the
/// multiplexer answered with, as gRPC's retry policy would (at most 1 s), or 20 ms without one.
fn pushback(status: &tonic::Status) -> Duration {
    let hint = status.metadata().get("grpc-retry-pushback-ms").and_then(|v| v.to_str().ok()?.parse::<i64>().ok());
    match hint {
        Some(ms) if ms >= 0 => Duration::from_millis(ms.unsigned_abs()).min(Duration::from_secs(1)),
        _ => Duration::from_millis(20),
    }
}

/// `workers` callers, each calling Embed one call after another on `channels[i % len]` for
/// `length` (each finishes the call it has started).
async fn load(channels: &[Channel], workers: usize, length: Duration) -> Calls {
    let started = Instant::now();
    let until = started + length;
    let tasks: Vec<_> = (0..workers)
        .map(|i| {
            let channel = channels[i % channels.len()].clone();
            tokio::spawn(async move {
                let mut calls = Calls::default();
                let mut n = 0;
                while Instant::now() < until {
                    n += 1;
                    match embed(channel.clone(), format!("worker {i} call {n}")).await {
                        Ok(()) => calls.ok += 1,
                        Err(status) if status.code() == Code::ResourceExhausted => {
                            calls.refused += 1;
                            let wait = pushback(&status);
                            calls.pushed_back += wait;
                            tokio::time::sleep(wait).await;
                        }
                        Err(status) => {
                            *calls.failed.entry(format!("{:?}", status.code())).or_default() += 1;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
                calls
            })
        })
        .collect();
    let mut calls = Calls::default();
    for task in tasks {
        calls.add(task.await.expect("a load worker"));
    }
    calls.took = started.elapsed();
    calls
}

/// A round of load and what each replica did meanwhile.
async fn round(replicas: &[Replica], channels: &[Channel], workers: usize, length: Duration) -> (Calls, Vec<Reading>) {
    let before = read_all(replicas).await;
    let calls = load(channels, workers, length).await;
    let after = read_all(replicas).await;
    (calls, after.iter().zip(&before).map(|(after, before)| after.since(before)).collect())
}

/// Waits until kube-proxy spreads new connections to `service` over every replica (its rules
/// follow the pods' readiness with a lag): opens connections, one call on each, until each
/// replica has taken one.
async fn wait_service_reaches_all(service: SocketAddr, replicas: &[Replica]) {
    let mut reached = BTreeSet::new();
    for attempt in 1.. {
        let before = read_all(replicas).await;
        embed(connect(service).await, format!("probe {attempt}")).await.expect("a probe call");
        let after = read_all(replicas).await;
        reached.extend((0..replicas.len()).filter(|&i| after[i].since(&before[i]).requests > 0.0));
        if reached.len() == replicas.len() {
            return;
        }
        assert!(attempt < 60, "60 connections to the Service reached only replicas {reached:?} of {replicas:?}");
    }
}

/// `smallest / largest` of the replicas' device busy times: 1 when they did equal work.
fn balance(busy: &[f64]) -> f64 {
    let largest = busy.iter().copied().fold(0.0, f64::max);
    let smallest = busy.iter().copied().fold(f64::INFINITY, f64::min);
    if largest > 0.0 { smallest / largest } else { 0.0 }
}

fn seconds(values: &[f64]) -> String {
    values.iter().map(|v| format!("{v:.2}s")).collect::<Vec<_>>().join(", ")
}

/// What one pool showed, for the summary.
#[derive(Debug)]
struct Figures {
    replicas: usize,
    gpu: &'static str,
    pinned_ok_per_s: f64,
    spread_ok_per_s: f64,
    pinned_busy: Vec<f64>,
    spread_busy: Vec<f64>,
    high_water: Vec<f64>,
    spills_served: f64,
    under_deletion: (Tally, Tally),
}

/// The GPU type a pool of `replicas` runs on: the node's fake L4s while it has one per replica,
/// else `cpu` (the node has 2 GPUs unless `TEIFLEET_REAL_NODE_GPUS` says otherwise).
async fn gpu_for(client: &Client, replicas: usize) -> &'static str {
    let node = Api::<Node>::all(client.clone()).get(NODE).await.expect("the real node");
    let allocatable = node.status.and_then(|s| s.allocatable).unwrap_or_default();
    let gpus: usize = allocatable.get("nvidia.com/gpu").and_then(|q| q.0.parse().ok()).unwrap_or(0);
    if gpus >= replicas { "nvidia-l4" } else { "cpu" }
}

async fn spill_across(client: &Client, namespace: &str, images: &Images, replicas: usize) -> Figures {
    let pool = format!("spill-{replicas}");
    let gpu = gpu_for(client, replicas).await;
    let budget = SHARE * replicas;
    create_pool(
        client,
        namespace,
        &pool,
        json!({
            "gpu": { "type": gpu },
            "replicas": replicas,
            "tei": { "image": images["tei-sim"].1, "extraArgs": ["--fixed-latency=50ms"] },
            // Room in each replica's queue for the whole overload on one connection.
            "concurrency": { "maxInFlight": budget, "maxQueued": 64 * replicas },
            "template": pool_template(),
        }),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let selector = labels::pool_selector(&pool);
    let ready = wait_ready_pods(&pods, &selector, replicas).await;
    wait_until_ready(client, namespace, &pool).await;
    let pool_pods: Vec<Replica> =
        ready.iter().map(|pod| Replica { name: pod.metadata.name.clone().unwrap(), ip: ip_of(pod) }).collect();
    for replica in &pool_pods {
        let ip = replica.ip;
        eventually(&format!("{} applying its share {SHARE}", replica.name), Duration::from_secs(30), || async {
            (limit_in_flight(ip, &pool).await? == SHARE as f64).then_some(())
        })
        .await;
    }

    let service = service_addr(client, namespace, &pool).await;
    answering_channel(service).await;
    wait_service_reaches_all(service, &pool_pods).await;
    let pinned = [connect(service).await];
    let mut spread = Vec::new();
    for _ in 0..CONNECTIONS {
        spread.push(connect(service).await);
    }
    let workers = OVERLOAD * budget;

    // Warm-up on the one connection until every sibling has served spills: the pinned sidecar
    // then knows them all (from the EndpointSlices), and which replica is pinned is known.
    let mut pinned_at = None;
    for attempt in 1.. {
        let (calls, seen) = round(&pool_pods, &pinned, workers, Duration::from_secs(1)).await;
        let took: Vec<usize> = (0..replicas).filter(|&i| seen[i].requests > 0.0).collect();
        assert_eq!(took.len(), 1, "one connection reaches one replica: {seen:?}");
        let at = *pinned_at.get_or_insert(took[0]);
        assert_eq!(at, took[0], "the connection stays on its replica");
        let all_spilled_to = (0..replicas).all(|i| i == at || seen[i].spilled_in > 0.0);
        if all_spilled_to {
            break;
        }
        assert!(attempt < 30, "calls spill to every sibling within 30 s: {calls:?} {seen:?}");
    }
    let pinned_at = pinned_at.unwrap();
    load(&spread, workers, Duration::from_secs(1)).await;
    println!("{replicas} replicas ({gpu}): the one connection is pinned to {}", pool_pods[pinned_at].name);

    // Interleaved rounds: one connection, then eight, twice.
    let (mut pinned_calls, mut spread_calls) = (Calls::default(), Calls::default());
    let (mut pinned_seen, mut spread_seen) = (vec![Reading::default(); replicas], vec![Reading::default(); replicas]);
    for _ in 0..ROUNDS {
        for (channels, calls, seen) in
            [(&pinned[..], &mut pinned_calls, &mut pinned_seen), (&spread[..], &mut spread_calls, &mut spread_seen)]
        {
            let (round_calls, round_seen) = round(&pool_pods, channels, workers, ROUND).await;
            calls.add(round_calls);
            seen.iter_mut().zip(round_seen).for_each(|(total, one)| total.add(one));
        }
    }
    let (pinned_rate, spread_rate) = (pinned_calls.ok_per_s(), spread_calls.ok_per_s());
    let pinned_busy: Vec<f64> = pinned_seen.iter().map(|r| r.busy).collect();
    let spread_busy: Vec<f64> = spread_seen.iter().map(|r| r.busy).collect();
    let final_readings = read_all(&pool_pods).await;
    let high_water: Vec<f64> = final_readings.iter().map(|r| r.high_water).collect();
    println!(
        "{replicas} replicas, {workers} calls at once for {:?}: one connection {pinned_rate:.1} OK/s \
         ({pinned_calls}); {CONNECTIONS} connections {spread_rate:.1} OK/s ({spread_calls}); ratio {:.3}",
        ROUND * ROUNDS as u32,
        pinned_rate / spread_rate,
    );
    println!(
        "{replicas} replicas: device busy with one connection [{}] (balance {:.3}), with {CONNECTIONS} [{}] \
         (balance {:.3}); TEI's high-water marks {high_water:?} (share {SHARE}, budget {budget})",
        seconds(&pinned_busy),
        balance(&pinned_busy),
        seconds(&spread_busy),
        balance(&spread_busy),
    );
    println!("{replicas} replicas, per replica with one connection: {pinned_seen:?}");
    println!("{replicas} replicas, per replica with {CONNECTIONS} connections: {spread_seen:?}");

    assert!(pinned_calls.failed.is_empty() && spread_calls.failed.is_empty(), "{pinned_calls:?} {spread_calls:?}");
    // Counted once: only the replica the client called counts the calls as its own.
    for (i, seen) in pinned_seen.iter().enumerate().filter(|(i, _)| *i != pinned_at) {
        assert_eq!(seen.requests, 0.0, "{} counts no call of the pinned connection: {seen:?}", pool_pods[i].name);
    }
    // The budget holds pool-wide, spills included, over the pods' whole lives.
    for (replica, mark) in pool_pods.iter().zip(&high_water) {
        assert!(*mark <= SHARE as f64, "{}'s TEI held {mark} at once, over its share {SHARE}", replica.name);
    }
    let held: f64 = high_water.iter().sum();
    assert!(held <= budget as f64, "the replicas' TEIs held {held} at most, over the pool's {budget}");
    // The pinned replica's sidecar counts the spills its siblings served.
    let spills_served = pinned_seen[pinned_at].spills_served;
    assert!(spills_served > 0.0, "teifleet_spills_total{{result=\"served\"}} on the pinned replica: {pinned_seen:?}");

    // A sibling deleted under load: the one connection's calls spill to it until it goes.
    // Half of the callers retry UNAVAILABLE, half do not. The victim is a sibling the steady load
    // spills to: with fewer callers than the burst above, a sidecar's spills can all go to the
    // one sibling that wins ties on room, so which one is seen, not guessed.
    let pinned_replica = pool_pods[pinned_at].clone();
    let siblings: Vec<_> =
        pool_pods.iter().enumerate().filter(|(i, _)| *i != pinned_at).map(|(_, p)| p.clone()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let callers: Vec<_> =
        (0..UNDER_DELETION).map(|i| tokio::spawn(steady_load(pinned[0].clone(), stop.clone(), i % 2 == 0))).collect();
    let mut siblings_before = Vec::new();
    for sibling in &siblings {
        siblings_before.push(read(sibling).await);
    }
    let victim = eventually("calls spilling to a sibling under the steady load", Duration::from_secs(30), || {
        let (siblings, siblings_before) = (siblings.clone(), siblings_before.clone());
        async move {
            for (sibling, before) in siblings.iter().zip(&siblings_before) {
                if read(sibling).await.since(before).spilled_in > 0.0 {
                    return Some(sibling.clone());
                }
            }
            None
        }
    })
    .await;
    let pinned_before = read(&pinned_replica).await;
    pods.delete(&victim.name, &DeleteParams::default()).await.expect("sibling deleted");
    let deleted = Instant::now();
    eventually(&format!("{} gone", victim.name), START, || async {
        pods.get_opt(&victim.name).await.ok()?.is_none().then_some(())
    })
    .await;
    let gone = deleted.elapsed();
    wait_ready_pods(&pods, &selector, replicas).await;
    println!(
        "{replicas} replicas: deleted {} (a sibling the pinned connection spilled to): gone after {gone:?}, \
         replacement Ready after {:?}",
        victim.name,
        deleted.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut retrying, mut plain) = (Tally::default(), Tally::default());
    for (i, caller) in callers.into_iter().enumerate() {
        let tally = caller.await.expect("a caller");
        if i % 2 == 0 { retrying.add(tally) } else { plain.add(tally) }
    }
    let pinned_during = read(&pinned_replica).await.since(&pinned_before);
    println!(
        "{replicas} replicas, sibling deleted under load on one connection: retrying UNAVAILABLE {retrying:?}; \
         without retries {plain:?}; the pinned sidecar meanwhile: {} spills served, {} served back after all",
        pinned_during.spills_served, pinned_during.spills_back
    );
    assert!(retrying.ok > 0 && plain.ok > 0, "{retrying:?} {plain:?}");
    assert!(retrying.failed.is_empty(), "a client retrying UNAVAILABLE loses no call: {retrying:?}");

    // The pool goes, and with it its pods (and their GPUs).
    Api::<EmbeddingPool>::namespaced(client.clone(), namespace)
        .delete(&pool, &DeleteParams::default())
        .await
        .expect("pool deleted");
    eventually(&format!("{pool}'s pods gone"), START, || async {
        pods.list(&ListParams::default().labels(&selector)).await.ok()?.items.is_empty().then_some(())
    })
    .await;

    Figures {
        replicas,
        gpu,
        pinned_ok_per_s: pinned_rate,
        spread_ok_per_s: spread_rate,
        pinned_busy,
        spread_busy,
        high_water,
        spills_served,
        under_deletion: (retrying, plain),
    }
}

#[tokio::test]
async fn one_connection_gets_the_whole_pool_through_spillover_on_real_pods() {
    let client = admin_client().await;
    let Some(images) = prerequisites(&client).await else { return };
    let started = Instant::now();
    for (tar, _) in images.values() {
        import_into_real_node(tar);
    }
    install_crd(&client).await;
    let ns = restricted_namespace("real-spill").await;
    install_chart(&client, &ns.name, RELEASE).await;

    let mut figures = Vec::new();
    for replicas in [2, 3] {
        figures.push(spill_across(&client, &ns.name, &images, replicas).await);
    }

    let (ok, output) = helm(&["uninstall", RELEASE, "-n", &ns.name, "--wait", "--timeout", "60s"]);
    assert!(ok, "{output}");
    let mut missed = Vec::new();
    for f in &figures {
        println!(
            "summary, {} replicas ({}): one connection {:.1} OK/s, {CONNECTIONS} connections {:.1} OK/s, ratio {:.3}; \
             device busy [{}] / [{}]; high-water marks {:?}; spills served {}; sibling deleted: retrying {:?}, \
             plain {:?}",
            f.replicas,
            f.gpu,
            f.pinned_ok_per_s,
            f.spread_ok_per_s,
            f.pinned_ok_per_s / f.spread_ok_per_s,
            seconds(&f.pinned_busy),
            seconds(&f.spread_busy),
            f.high_water,
            f.spills_served,
            f.under_deletion.0,
            f.under_deletion.1,
        );
    }
    println!("whole test {:?}", started.elapsed());
    // Checked last, so that one run shows every pool's figures.
    for f in &figures {
        let ratio = f.pinned_ok_per_s / f.spread_ok_per_s;
        if ratio < 0.9 {
            missed.push(format!(
                "{} replicas: one connection gets {:.1} OK/s, {CONNECTIONS} connections {:.1} OK/s: {ratio:.3} < 0.9",
                f.replicas, f.pinned_ok_per_s, f.spread_ok_per_s
            ));
        }
        if balance(&f.pinned_busy) < 0.85 {
            missed.push(format!(
                "{} replicas, one connection: the devices' busy times [{}] are not within 15% of each other",
                f.replicas,
                seconds(&f.pinned_busy)
            ));
        }
    }
    assert!(missed.is_empty(), "{}", missed.join("\n"));
}
