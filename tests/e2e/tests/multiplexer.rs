//! The multiplexer in Kubernetes mode, as the sidecar: it reads its pool's shares from the
//! EmbeddingPool status the operator publishes, using only the sidecar ServiceAccount's token,
//! and applies a budget edit live without dropping a request.

use std::process::Command;
use std::time::Duration;

use futures::future::join_all;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use teifleet_crds::EmbeddingPool;
use teifleet_e2e::pools::{create_pool, wait_until_ready};
use teifleet_e2e::{
    Operator, admin_client, eventually, free_port, http_get, install_crd, log_dir, loopback, test_namespace,
};
use teifleet_proto::v1::{EmbedRequest, embed_client::EmbedClient};
use teifleet_tei_sim::{Fault, SimConfig};
use teifleet_testkit::process::ChildGuard;

async fn limit_in_flight(admin: u16, pool: &str) -> Option<f64> {
    let text = http_get(loopback(admin), "/metrics").await?;
    teifleet_testkit::prom::value(&text, &format!("teifleet_limit_in_flight{{pool=\"{pool}\"}}"))
}

/// Merges `concurrency` into pool `live`'s `spec.concurrency`.
async fn edit_concurrency(client: &kube::Client, namespace: &str, concurrency: serde_json::Value) {
    Api::<EmbeddingPool>::namespaced(client.clone(), namespace)
        .patch("live", &PatchParams::default(), &Patch::Merge(json!({ "spec": { "concurrency": concurrency } })))
        .await
        .unwrap();
}

#[tokio::test]
async fn sidecar_applies_budget_edits_live_with_its_own_serviceaccount() {
    let client = admin_client().await;
    install_crd(&client).await;
    let ns = test_namespace("mux").await;
    let _operator = Operator::start("mux");
    create_pool(
        &client,
        &ns.name,
        "live",
        json!({ "gpu": { "type": "cpu" }, "replicas": 2, "concurrency": { "maxInFlight": 4, "maxQueued": 16 } }),
    )
    .await;
    wait_until_ready(&client, &ns.name, "live").await;

    let sim = teifleet_tei_sim::start(SimConfig::default()).await.unwrap();
    let token = teifleet_e2e::service_account_token(&ns.name, "live-multiplexer");
    let kubeconfig = teifleet_e2e::token_kubeconfig("live-multiplexer", &token);
    let (grpc, admin) = (free_port().unwrap(), free_port().unwrap());
    let mut command = Command::new(
        std::env::var("TEIFLEET_MULTIPLEXER_BIN").expect("TEIFLEET_MULTIPLEXER_BIN (make test-cluster sets it)"),
    );
    command
        .env("KUBECONFIG", &kubeconfig)
        .env("TEIFLEET_POOL", "live")
        .env("TEIFLEET_NAMESPACE", &ns.name)
        .env("TEIFLEET_POD_NAME", "live-0")
        .args([
            "kubernetes".into(),
            format!("--listen=127.0.0.1:{grpc}"),
            format!("--admin-listen=127.0.0.1:{admin}"),
            format!("--upstream=http://{}", sim.addr()),
            "--log-format=pretty".into(),
        ]);
    let log = log_dir().join("multiplexer-live.log");
    let _ = std::fs::remove_file(&log);
    let mut sidecar = ChildGuard::spawn_logged("the sidecar", command, log).expect("multiplexer starts");

    // Ready once it has its pool's shares (4 over 2 ready replicas) and TEI answers.
    sidecar
        .wait_ready(Duration::from_secs(30), || async { http_get(loopback(admin), "/readyz").await.is_some() })
        .await
        .expect("the sidecar becomes ready");
    assert_eq!(limit_in_flight(admin, "live").await, Some(2.0));

    // Two in flight (held at TEI), four waiting.
    sim.set_fault(Fault::Stall);
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{grpc}")).unwrap().connect().await.unwrap();
    let calls: Vec<_> = (0..6)
        .map(|i| {
            let mut embed = EmbedClient::new(channel.clone());
            tokio::spawn(async move {
                embed.embed(EmbedRequest { inputs: format!("call {i}"), ..Default::default() }).await
            })
        })
        .collect();
    eventually("two calls at TEI", Duration::from_secs(10), || async { (sim.stats().in_flight == 2).then_some(()) })
        .await;

    edit_concurrency(&client, &ns.name, json!({ "maxInFlight": 12 })).await;
    let edited = std::time::Instant::now();
    eventually("the new share at the sidecar", Duration::from_secs(10), || async {
        (limit_in_flight(admin, "live").await? == 6.0).then_some(())
    })
    .await;
    eventually("waiters admitted at once", Duration::from_secs(5), || async {
        (sim.stats().in_flight == 6).then_some(())
    })
    .await;
    println!("budget edit reached the sidecar and TEI in {:?}", edited.elapsed());

    sim.set_fault(Fault::None);
    for call in join_all(calls).await {
        call.unwrap().expect("no request dropped by the live change");
    }

    // A cap on TEI time, as for a pool that floods a time-sliced GPU, reaches the sidecar live.
    let device_time = || async {
        let text = http_get(loopback(admin), "/metrics").await?;
        teifleet_testkit::prom::value(&text, "teifleet_limit_device_time_percent{pool=\"live\"}")
    };
    assert_eq!(device_time().await, Some(100.0), "no cap by default");
    edit_concurrency(&client, &ns.name, json!({ "deviceTimeCap": 25 })).await;
    eventually("the cap at the sidecar", Duration::from_secs(10), || async {
        (device_time().await? == 25.0).then_some(())
    })
    .await;
}
