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

#[tokio::test]
async fn editing_the_file_raises_the_limit_without_dropping_requests() {
    let sim = sim(|_| {}).await;
    sim.set_fault(Fault::Stall);
    let dir = std::env::temp_dir().join(format!("teifleet-live-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("pools.yaml");
    std::fs::write(&path, config(sim.addr(), 1)).unwrap();

    let loaded = file::load(&path).unwrap();
    let metrics = Metrics::new();
    let table = Arc::new(PoolTable::new(&loaded.default, metrics.clone()));
    table.sync(loaded.pools).unwrap();
    let stop = CancellationToken::new();
    let gate = Arc::new(teifleet_multiplexer::gate::auth::Gate::off());
    tokio::spawn(file::watch(path.clone(), table.clone(), gate, Duration::from_millis(50), stop.clone()));
    let mux = server::start(Settings::default(), table.clone(), metrics).await.unwrap();
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
