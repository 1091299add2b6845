//! Limits change live from the static configuration file, without dropping a request.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use teifleet_multiplexer::forward::pools::PoolTable;
use teifleet_multiplexer::report::metrics::Metrics;
use teifleet_multiplexer::run::server::{self, Settings};
use teifleet_multiplexer::sources::file;
use teifleet_tei_sim::Fault;
use tokio_util::sync::CancellationToken;

use crate::support::*;

fn config(upstream: std::net::SocketAddr, in_flight: usize) -> String {
    format!(
        "pools:\n- name: pool-a\n  upstream: http://{upstream}\n  maxInFlight: {in_flight}\n  maxQueued: 50\n  queueTimeout: 10s\n"
    )
}

/// A multiplexer serving the pools of the file at `path` and following its edits until `stop`.
async fn serve_file(path: &std::path::Path) -> (Arc<PoolTable>, server::Running, CancellationToken) {
    let loaded = file::load(path).unwrap();
    let metrics = Metrics::new();
    let table = Arc::new(PoolTable::new(&loaded.default, metrics.clone()));
    table.sync(loaded.pools).unwrap();
    let stop = CancellationToken::new();
    let gate = Arc::new(teifleet_multiplexer::gate::auth::Gate::off());
    tokio::spawn(file::watch(path.to_owned(), table.clone(), gate, Duration::from_millis(50), stop.clone()));
    let mux = server::start(Settings::default(), table.clone(), metrics).await.unwrap();
    (table, mux, stop)
}

/// The file of [`config`], with a `deviceTimeCap`.
fn capped_config(upstream: std::net::SocketAddr, in_flight: usize, cap: u8) -> String {
    format!("{}  deviceTimeCap: {cap}\n", config(upstream, in_flight))
}

#[tokio::test]
async fn editing_the_file_raises_the_limit_without_dropping_requests() {
    let sim = sim(|_| {}).await;
    sim.set_fault(Fault::Stall);
    let dir = std::env::temp_dir().join(format!("teifleet-live-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("pools.yaml");
    std::fs::write(&path, config(sim.addr(), 1)).unwrap();

    let (table, mux, stop) = serve_file(&path).await;
    let client = embed_client(mux.grpc_addr).await;
    let admission = table.get("pool-a").unwrap().admission.clone();

    let calls: Vec<_> = (0..6)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(async move { client.embed(embed_request(&format!("call {i}"))).await })
        })
        .collect();
    until("1 in flight, 5 queued", Duration::from_secs(5), || {
        let s = admission.snapshot();
        (s.in_flight, s.queued_total()) == (1, 5)
    })
    .await;

    std::fs::write(&path, config(sim.addr(), 4)).unwrap();
    until("the raise to admit waiters at once", Duration::from_secs(5), || admission.snapshot().in_flight == 4).await;
    // Admission counts a call in flight before the call reaches TEI: wait for TEI to see them.
    until("TEI now sees four", Duration::from_secs(5), || sim.stats().in_flight == 4).await;

    // A broken edit is ignored: the last good limits stay.
    std::fs::write(&path, "pools: [").unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(admission.snapshot().limits.max_in_flight, 4);

    sim.set_fault(Fault::None);
    let results = join_all(calls).await;
    assert!(results.into_iter().all(|r| r.unwrap().is_ok()), "no request dropped");
    stop.cancel();
    std::fs::remove_dir_all(&dir).ok();
}

/// A pool whose calls took more than its cap of TEI's time lets no call in until its credit is
/// back, however much room its in-flight limit has; lifting the cap in the file lets the held
/// calls in at once, and every one is answered.
#[tokio::test]
async fn a_device_time_cap_holds_calls_back_and_lifting_it_in_the_file_lets_them_in() {
    // One call keeps TEI busy 200 ms: four times the burst, at a cap of 1 % (20 s to earn back).
    let sim = sim(|c| c.fixed_latency = Duration::from_millis(200)).await;
    let dir = std::env::temp_dir().join(format!("teifleet-device-time-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("pools.yaml");
    std::fs::write(&path, capped_config(sim.addr(), 4, 1)).unwrap();

    let (table, mux, stop) = serve_file(&path).await;
    let mut client = embed_client(mux.grpc_addr).await;
    let admission = table.get("pool-a").unwrap().admission.clone();
    assert_eq!(admission.snapshot().limits.device_time_cap, Some(1));

    client.embed(embed_request("the call that spends the credit")).await.unwrap();
    let calls: Vec<_> = (0..3)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(async move { client.embed(embed_request(&format!("held {i}"))).await })
        })
        .collect();
    until("three calls queued", Duration::from_secs(5), || admission.snapshot().queued_total() == 3).await;
    // Room for four, none let in: the cap holds them, not the in-flight limit.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = admission.snapshot();
    assert_eq!((held.in_flight, held.queued_total()), (0, 3), "held by the cap");
    assert_eq!(sim.stats().in_flight, 0, "TEI left idle for the neighbours");

    std::fs::write(&path, config(sim.addr(), 4)).unwrap();
    let results = join_all(calls).await;
    assert!(results.into_iter().all(|r| r.unwrap().is_ok()), "every held call answered once the cap is lifted");
    assert_eq!(admission.snapshot().limits.device_time_cap, None);
    stop.cancel();
    std::fs::remove_dir_all(&dir).ok();
}
