//! Admission in TEI's units and between tenants, through real gRPC.

use std::collections::BTreeSet;
use std::time::Duration;

use teifleet_multiplexer::run::server::Settings;
use teifleet_proto::v1::{self, rerank_client::RerankClient};
use teifleet_tei_sim::Fault;
use teifleet_wire::headers::{PRIORITY, RETRY_PUSHBACK_MS, TENANT};
use tonic::Code;

use crate::support::*;

/// A Rerank of three texts takes three of the budget's inputs, as it takes three of TEI's slots.
#[tokio::test]
async fn a_rerank_takes_one_input_per_text() {
    let sim = sim(|_| {}).await;
    sim.set_fault(Fault::Stall);
    let (mux, table) = mux(sim.addr(), limits(3, 10)).await;
    let texts = vec!["a".to_owned(), "b".to_owned(), "c".to_owned()];
    let mut rerank = RerankClient::new(channel(mux.grpc_addr).await);
    let ranking = tokio::spawn(async move {
        rerank.rerank(v1::RerankRequest { query: "q".into(), texts, ..Default::default() }).await
    });
    let admission = table.get("pool-a").unwrap().admission.clone();
    until("the rerank in flight", Duration::from_secs(5), || admission.snapshot().in_flight == 3).await;
    let embed = spawn_embed(&embed_client(mux.grpc_addr).await, embed_request("waits"));
    until("the embed queued", Duration::from_secs(5), || admission.snapshot().queued_total() == 1).await;

    sim.set_fault(Fault::None);
    assert_eq!(ranking.await.unwrap().unwrap().get_ref().ranks.len(), 3);
    embed.await.unwrap().expect("served once the rerank's inputs are back");
    let end = admission.snapshot();
    assert_eq!((end.in_flight, end.queued_total()), (0, 0));
}

/// Tenant A's ten calls queue first; tenant B's one call, arriving last at the same priority, is
/// served second, not eleventh.
#[tokio::test]
async fn tenants_share_the_queue_fairly() {
    let sim = sim(|config| config.fixed_latency = Duration::from_millis(40)).await;
    let (mux, table) = mux(sim.addr(), limits(1, 100)).await;
    let client = embed_client(mux.grpc_addr).await;
    let admission = table.get("pool-a").unwrap().admission.clone();
    let mut flood = Vec::new();
    for i in 0..10 {
        flood.push(spawn_embed(&client, with_meta(embed_request(&format!("a{i}")), &[(TENANT, "a")])));
    }
    until("A's flood queued", Duration::from_secs(5), || admission.snapshot().queued_total() == 9).await;
    let light = spawn_embed(&client, with_meta(embed_request("b"), &[(TENANT, "b")]));
    light.await.unwrap().expect("B served");
    let finished_before_b = flood.iter().filter(|call| call.is_finished()).count();
    assert!(finished_before_b <= 3, "B waited for {finished_before_b} of A's calls, not all ten");
    for call in flood {
        call.await.unwrap().expect("A served too");
    }
    let text = metrics_text(&mux);
    let series = "teifleet_tenant_requests_total{outcome=\"ok\",pool=\"pool-a\",tenant=\"other\"}";
    assert_eq!(metric(&text, series), Some(11.0), "unlisted tenants are counted together: {text}");
}

/// Calls naming no tenant count as the default tenant's, answered or failed: the answered ones in
/// a series the metrics keep at hand, the others by label.
#[tokio::test]
async fn calls_naming_no_tenant_count_as_the_default_tenants() {
    let sim = sim(|_| {}).await;
    let (mux, _) = mux(sim.addr(), limits(4, 4)).await;
    let client = embed_client(mux.grpc_addr).await;
    for i in 0..3 {
        client.clone().embed(embed_request(&format!("served {i}"))).await.expect("served");
    }
    client.clone().embed(with_meta(embed_request("named"), &[(TENANT, "a")])).await.expect("served");
    sim.set_fault(Fault::Fail);
    client.clone().embed(embed_request("failed")).await.unwrap_err();
    let text = metrics_text(&mux);
    let series = |tenant: &str, outcome: &str| {
        let series =
            format!("teifleet_tenant_requests_total{{outcome=\"{outcome}\",pool=\"pool-a\",tenant=\"{tenant}\"}}");
        metric(&text, &series)
    };
    assert_eq!(series("default", "ok"), Some(3.0), "{text}");
    assert_eq!(series("other", "ok"), Some(1.0), "{text}");
    assert_eq!(series("default", "upstream_error"), Some(1.0), "{text}");
}

/// A deadline that passes while TEI works on the call is DEADLINE_EXCEEDED, counted as a
/// deadline, not as TEI's error or a cancellation.
#[tokio::test]
async fn a_deadline_passing_at_tei_is_deadline_exceeded() {
    let sim = sim(|config| config.fixed_latency = Duration::from_secs(2)).await;
    let (mux, _) = mux(sim.addr(), limits(4, 4)).await;
    let mut request = tonic::Request::new(embed_request("slow"));
    // The multiplexer answers 20 ms before the caller's own timer would.
    request.set_timeout(Duration::from_millis(500));
    let status = embed_client(mux.grpc_addr).await.embed(request).await.unwrap_err();
    let text = metrics_text(&mux);
    let series = "teifleet_requests_total{code=\"DeadlineExceeded\",outcome=\"expired_at_upstream\",pool=\"pool-a\",priority=\"standard\",protocol=\"grpc\",rpc=\"Embed\"}";
    if status.code() == Code::Cancelled && status.message() == "Timeout expired" {
        // A machine too busy for the 20 ms: the client's own timer fired first and it reset the
        // call, which the multiplexer may have answered or counted as the caller going away.
        let ended = || {
            let text = metrics_text(&mux);
            metric(&text, series).unwrap_or(0.0)
                + metric_sum(&text, "teifleet_requests_total", &[("outcome", "cancelled")])
        };
        until("the call counted once", Duration::from_secs(5), || ended() == 1.0).await;
        return;
    }
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(metric(&text, series), Some(1.0), "{text}");
}

/// Refusals in one burst get spread retry hints, so retrying clients do not come back in waves.
#[tokio::test]
async fn pushback_hints_are_spread() {
    let sim = sim(|_| {}).await;
    sim.set_fault(Fault::Stall);
    let (mux, _) = mux_with(vec![spec("pool-a", sim.addr(), limits(1, 0))], Settings::default()).await;
    let client = embed_client(mux.grpc_addr).await;
    let _held = spawn_embed(&client, embed_request("held"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut hints = BTreeSet::new();
    for i in 0..30 {
        // Critical: refused at once by the full pool rather than waiting at its door.
        let call = with_meta(embed_request(&format!("refused {i}")), &[(PRIORITY, "critical")]);
        let status = client.clone().embed(call).await.unwrap_err();
        assert_eq!(status.code(), Code::ResourceExhausted);
        let hint: u64 = status.metadata().get(RETRY_PUSHBACK_MS).unwrap().to_str().unwrap().parse().unwrap();
        hints.insert(hint);
    }
    assert!(hints.len() >= 10, "30 refusals, {} distinct hints: {hints:?}", hints.len());
    sim.set_fault(Fault::None);
}
