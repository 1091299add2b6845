//! Headers are claims: what a caller says of itself is believed only where an identity backs it.
//! A client's spill or hop mark gets no skipped door and no hidden count; a tenant asks for no
//! more than its ceiling; a key-less caller never shares a keyed pool's answer; a client
//! certificate named like the pool is no sibling.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rustls::pki_types::pem::PemObject as _;
use teifleet_multiplexer::admission::Priority;
use teifleet_multiplexer::forward::pools::PoolSpec;
use teifleet_multiplexer::gate::auth::{Gate, Grant, KeyRing, Policy};
use teifleet_multiplexer::run::server::Settings;
use teifleet_runtime::tls::{Material, ServerTls};
use teifleet_testkit::certs::Authority;
use teifleet_wire::headers::{
    FORWARDED_BY, PEER_KEY, POOL as POOL_HEADER, PRIORITY, SPILLED_FROM, TENANT as TENANT_HEADER,
};
use tonic::Code;

use crate::support::*;

const SEARCH_KEY: &str = "search-key-0123456789abcdef";
const BATCH_KEY: &str = "batch-key-0123456789abcdef";

fn keyed_gate(pool: &str) -> Arc<Gate> {
    let (ring, problems) = KeyRing::parse([("search", SEARCH_KEY.as_bytes()), ("batch", BATCH_KEY.as_bytes())]);
    assert!(problems.is_empty(), "{problems:?}");
    Arc::new(Gate::new(pool, &prometheus::Registry::new(), Policy::Keys(ring)).unwrap())
}

/// Patient calls claiming `claim` on a pool that is full (one in flight, one queued): a claim
/// believed would skip the door and be refused at once when no room is left; a client's claim
/// waits its turn at the door and is served, and is counted like any other call.
async fn claimed_calls_wait_and_are_counted(claim: &[(&'static str, &str)]) {
    let sim = sim(|config| config.fixed_latency = Duration::from_millis(60)).await;
    let (mux, table) = mux(sim.addr(), limits(1, 1)).await;
    table.siblings().peer_key().set(Some(crate::spill::PEER_KEY.as_bytes())).unwrap();
    let client = embed_client(mux.grpc_addr).await;
    let calls: Vec<_> =
        (0..6).map(|i| spawn_embed(&client, with_meta(embed_request(&format!("c{i}")), claim))).collect();
    for call in calls {
        call.await.unwrap().expect("held at the door, then served");
    }
    let text = metrics_text(&mux);
    assert_eq!(metric_sum(&text, "teifleet_requests_total", &[("outcome", "ok")]), 6.0, "{text}");
    assert_eq!(metric_sum(&text, "teifleet_spilled_in_total", &[]), 0.0, "{text}");
    assert_eq!(sim.stats().requests_received, 6);
}

#[tokio::test]
async fn a_clients_spill_claim_is_a_call_like_any_other() {
    claimed_calls_wait_and_are_counted(&[(SPILLED_FROM, "pool-a-0")]).await;
}

#[tokio::test]
async fn a_spill_claim_with_a_wrong_peer_key_is_a_call_like_any_other() {
    claimed_calls_wait_and_are_counted(&[
        (SPILLED_FROM, "pool-a-0"),
        (PEER_KEY, "not-the-peer-key-0123456789-0123456789"),
    ])
    .await;
}

#[tokio::test]
async fn a_clients_hop_mark_is_a_call_like_any_other() {
    claimed_calls_wait_and_are_counted(&[(FORWARDED_BY, "mux-b-0")]).await;
}

#[tokio::test]
async fn a_key_less_caller_never_shares_a_keyed_pools_answer_through_routing() {
    // Pool b has keys; the sidecar of pool a (no keys) routes to it and would coalesce for it.
    let tei_b = sim(|config| config.fixed_latency = Duration::from_millis(300)).await;
    let keyed = Settings { auth: keyed_gate("b"), ..Settings::default() };
    let b = PoolSpec { coalesce: true, ..spec("b", tei_b.addr(), limits(4, 8)) };
    let (mux_b, _) = mux_with(vec![b], keyed).await;
    let tei_a = sim(|_| {}).await;
    let remote_b = PoolSpec { remote: true, coalesce: true, ..spec("b", mux_b.grpc_addr, limits(4, 8)) };
    let (mux_a, _) = mux_with(vec![spec("a", tei_a.addr(), limits(4, 8)), remote_b], Settings::default()).await;
    let client = embed_client(mux_a.grpc_addr).await;

    let authorization = format!("Bearer {SEARCH_KEY}");
    let holder = spawn_embed(
        &client,
        with_meta(embed_request("the same text"), &[(POOL_HEADER, "b"), ("authorization", &authorization)]),
    );
    until("the key holder's call reached pool b's TEI", Duration::from_secs(5), || {
        tei_b.stats().requests_received >= 1
    })
    .await;
    let stranger = spawn_embed(&client, with_meta(embed_request("the same text"), &[(POOL_HEADER, "b")]));
    let refused = stranger.await.unwrap().expect_err("no key, no answer");
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    holder.await.unwrap().expect("the key holder is served");
}

#[tokio::test]
async fn a_tenant_marking_its_calls_critical_gets_no_more_than_its_weight() {
    let sim = sim(|config| config.fixed_latency = Duration::from_millis(10)).await;
    let tenants: BTreeMap<String, u32> = [("search".to_owned(), 3), ("batch".to_owned(), 1)].into();
    let spec = PoolSpec { tenants, ..spec("pool-a", sim.addr(), limits(1, 64)) };
    let (mux, _) = mux_with(vec![spec], Settings { auth: keyed_gate("pool-a"), ..Settings::default() }).await;
    // Closed loops of 8 callers per tenant, each tenant on its own connection, until 80 answers.
    let served = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let total = Arc::new(AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for (tenant, key, priority) in [(0, SEARCH_KEY, "standard"), (1, BATCH_KEY, "critical")] {
        let client = embed_client(mux.grpc_addr).await;
        for worker in 0..8 {
            let (mut client, served, total) = (client.clone(), served.clone(), total.clone());
            let authorization = format!("Bearer {key}");
            workers.spawn(async move {
                let mut i = 0;
                while total.load(Ordering::SeqCst) < 80 {
                    i += 1;
                    let text = format!("{tenant}/{worker}/{i}");
                    let call = with_meta(
                        embed_request(&text),
                        &[("authorization", &authorization), (PRIORITY, priority), (TENANT_HEADER, "search")],
                    );
                    if client.embed(call).await.is_ok() {
                        served[tenant].fetch_add(1, Ordering::SeqCst);
                        total.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
        }
    }
    while workers.join_next().await.is_some() {}
    let (search, batch) = (served[0].load(Ordering::SeqCst), served[1].load(Ordering::SeqCst));
    eprintln!("weight 3 (standard): {search} served; weight 1 (asking critical): {batch} served");
    // batch weighs 1 of 4: about a quarter. Strict priority (its `critical` believed) gave it
    // nearly every call.
    assert!(batch * 10 <= (search + batch) * 4, "search {search}, batch {batch}");
    let text = metrics_text(&mux);
    assert_eq!(metric_sum(&text, "teifleet_requests_total", &[("priority", "critical")]), 0.0, "{text}");
    let standard = metric_sum(&text, "teifleet_requests_total", &[("priority", "standard"), ("outcome", "ok")]);
    assert_eq!(standard as usize, search + batch, "every call counted, each as standard: {text}");
}

#[tokio::test]
async fn a_granted_ceiling_lets_critical_through() {
    let sim = sim(|_| {}).await;
    let gate = keyed_gate("pool-a");
    gate.set_grants([("search".to_owned(), Grant { max_priority: Some(Priority::Critical), lane: None })].into());
    let (mux, _) =
        mux_with(vec![spec("pool-a", sim.addr(), limits(2, 8))], Settings { auth: gate, ..Settings::default() }).await;
    let client = embed_client(mux.grpc_addr).await;
    for key in [SEARCH_KEY, BATCH_KEY] {
        let call =
            with_meta(embed_request(key), &[("authorization", &format!("Bearer {key}")), (PRIORITY, "critical")]);
        client.clone().embed(call).await.unwrap();
    }
    let text = metrics_text(&mux);
    assert_eq!(metric_sum(&text, "teifleet_requests_total", &[("priority", "critical")]), 1.0, "{text}");
    assert_eq!(metric_sum(&text, "teifleet_requests_total", &[("priority", "standard")]), 1.0, "{text}");
}

#[tokio::test]
async fn a_client_certificate_named_like_the_pool_is_no_sibling() {
    let sim = sim(|_| {}).await;
    let (ca, clients) = (Authority::new("pool CA"), Authority::new("client CA"));
    let pool_certificate = ca.peer(&["127.0.0.1"]);
    let tls = Arc::new(ServerTls::off());
    let set = Material {
        chain: pool_certificate.chain_pem.clone().into(),
        key: pool_certificate.key_pem.clone().into(),
        ca: Some(ca.pem.clone().into()),
        client_ca: Some(clients.pem.clone().into()),
    };
    tls.offer(&set).unwrap();
    let tenants: BTreeMap<String, u32> = [("search".to_owned(), 3)].into();
    let spec = PoolSpec { tenants, ..spec("pool-a", sim.addr(), limits(4, 8)) };
    let (mux, _) = mux_with(vec![spec], Settings { tls, ..Settings::default() }).await;

    // A client CA may issue any name: one named as the pool's certificate names its holder.
    let pool_name = teifleet_runtime::tls::certificate_name(
        &rustls::pki_types::CertificateDer::from_pem_slice(pool_certificate.chain_pem.as_bytes()).unwrap(),
    )
    .unwrap();
    let impostor = crate::tls::tls_client(mux.grpc_addr, &ca, &clients.client(&pool_name));
    let call = with_meta(embed_request("as a sibling"), &[(TENANT_HEADER, "search"), (PRIORITY, "critical")]);
    impostor.clone().embed(call).await.expect("served, as the client it is");
    let text = metrics_text(&mux);
    assert_eq!(
        metric_sum(&text, "teifleet_tenant_requests_total", &[("tenant", "search")]),
        0.0,
        "the tenant it named is not believed: {text}"
    );
    assert_eq!(metric_sum(&text, "teifleet_requests_total", &[("priority", "critical")]), 0.0, "{text}");
    assert_eq!(
        metric_sum(&text, "teifleet_requests_total", &[("priority", "standard"), ("outcome", "ok")]),
        1.0,
        "counted, as standard: {text}"
    );
}
