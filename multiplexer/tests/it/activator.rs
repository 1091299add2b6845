//! The activator role: calls for a pool with no ready replica (gRPC unary and streams, HTTP) are
//! held, counted for the operator, and served once a replica is ready; a call whose deadline is
//! shorter than the wait gets DEADLINE_EXCEEDED at its deadline; one whose hold runs out gets
//! UNAVAILABLE with a retry hint. The pool is the name the client dialled, or the pool whose
//! Service address it dialled.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use teifleet_multiplexer::activator::{Activations, PoolNaming};
use teifleet_multiplexer::forward::pools::{PoolSpec, PoolTable};
use teifleet_multiplexer::gate::auth::{Gate, KeyRing, Policy};
use teifleet_multiplexer::report::metrics::Metrics;
use teifleet_multiplexer::run::server::{self, Running, Settings};
use teifleet_proto::v1::embed_client::EmbedClient;
use teifleet_wire::headers::POOL as POOL_HEADER;
use tonic::transport::Channel;

use crate::http_front::request;
use crate::support::*;

/// An activator for pool `bge` of namespace `ml`, holding calls up to `hold`.
async fn activator(hold: Duration) -> (Running, Arc<Activations>) {
    activator_with(hold, |_| {}).await
}

/// The same, with `configure` run on its pool table before it starts.
async fn activator_with(hold: Duration, configure: impl FnOnce(&PoolTable)) -> (Running, Arc<Activations>) {
    activator_naming(Arc::new(PoolNaming::new("ml")), hold, configure).await
}

/// The same, naming calls' pools by `naming` (whose addresses a test sets as the Services' watch
/// would).
async fn activator_naming(
    naming: Arc<PoolNaming>,
    hold: Duration,
    configure: impl FnOnce(&PoolTable),
) -> (Running, Arc<Activations>) {
    let activations = Arc::new(Activations::default());
    activations.sync(&[("bge".into(), hold)]);
    let metrics = Metrics::new();
    let table = Arc::new(PoolTable::activator(metrics.clone(), activations.clone()));
    table
        .sync(vec![PoolSpec {
            name: "bge".into(),
            model: Some(MODEL.into()),
            upstream: "activated://bge".into(),
            limits: Some(limits(1 << 20, 1 << 20)),
            remote: true,
            coalesce: false,
            tenants: BTreeMap::new(),
        }])
        .unwrap();
    configure(&table);
    let settings = Settings {
        http_listen: Some("127.0.0.1:0".parse().unwrap()),
        pool_naming: Some(naming),
        ..Settings::default()
    };
    (server::start(settings, table, metrics).await.expect("the activator starts"), activations)
}

/// A client of the activator that dialled the pool Service by name, as clients of the pool do.
fn dialling_the_pool(activator: &Running) -> EmbedClient<Channel> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", activator.grpc_addr)).unwrap();
    EmbedClient::new(endpoint.origin("http://bge.ml.svc:50051".parse().unwrap()).connect_lazy())
}

fn held(activations: &Activations) -> u32 {
    activations.report().pools.iter().map(|pool| pool.held).sum()
}

#[tokio::test]
async fn calls_at_zero_are_held_until_a_replica_is_ready_then_served() {
    let (activator, activations) = activator(Duration::from_secs(30)).await;
    let client = dialling_the_pool(&activator);
    let unary = spawn_embed(&client, embed_request("first call at zero"));
    let stream = tokio::spawn({
        let mut client = client.clone();
        async move {
            let messages = tokio_stream::iter([embed_request("stream 1"), embed_request("stream 2")]);
            let mut answers = client.embed_stream(messages).await?.into_inner();
            let mut count = 0;
            while answers.message().await?.is_some() {
                count += 1;
            }
            Ok::<_, tonic::Status>(count)
        }
    });
    let http_addr = activator.http_addr.unwrap();
    let http = tokio::spawn(async move {
        request(http_addr, "POST", "/embed", &[(POOL_HEADER, "bge")], br#"{"inputs":"over HTTP"}"#).await
    });
    until("three calls held", Duration::from_secs(10), || held(&activations) == 3).await;

    // The pool's first replica becomes ready: a sidecar in front of TEI.
    let sim = sim(|_| {}).await;
    let (replica, _) = mux_with(vec![spec("bge", sim.addr(), limits(8, 64))], Settings::default()).await;
    activations.set_peers("bge", &[format!("http://{}", replica.grpc_addr)]).unwrap();

    unary.await.unwrap().expect("the held unary call is served");
    assert_eq!(stream.await.unwrap().expect("the held stream is served"), 2);
    assert_eq!(http.await.unwrap().status, 200);
    assert_eq!(held(&activations), 0);
    let served = metric_sum(&metrics_text(&replica), "teifleet_requests_total", &[("outcome", "ok")]);
    assert_eq!(served, 3.0, "the replica's sidecar admitted and counted them");
    let report = activations.report();
    assert!(report.pools[0].idle_seconds < 30.0, "{report:?}");
}

#[tokio::test]
async fn a_deadline_shorter_than_the_cold_start_ends_at_the_deadline_and_a_hold_that_runs_out_is_unavailable() {
    let (activator, activations) = activator(Duration::from_millis(300)).await;
    let client = dialling_the_pool(&activator);
    let mut short = tonic::Request::new(embed_request("in a hurry"));
    short.set_timeout(Duration::from_millis(100));
    let expired = client.clone().embed(short).await.unwrap_err();
    // The activator answers DEADLINE_EXCEEDED a little before the caller's clock runs out; on a
    // busy machine the client's own timer (tonic: CANCELLED, "Timeout expired") may still fire
    // first. Either way the call ended at its deadline, not served and not refused.
    let own_timer = expired.code() == tonic::Code::Cancelled && expired.message() == "Timeout expired";
    assert!(expired.code() == tonic::Code::DeadlineExceeded || own_timer, "{expired:?}");

    let refused = client.clone().embed(embed_request("patient")).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("no ready replica"), "{refused:?}");
    assert_eq!(refused.metadata().get("grpc-retry-pushback-ms").unwrap(), "1000");
    let http =
        request(activator.http_addr.unwrap(), "POST", "/embed", &[(POOL_HEADER, "bge")], br#"{"inputs":"x"}"#).await;
    assert_eq!(http.status, 503);
    assert_eq!(held(&activations), 0, "nothing stays counted");
}

#[tokio::test]
async fn a_call_for_another_namespace_or_an_unknown_pool_is_not_held() {
    let (activator, activations) = activator(Duration::from_secs(30)).await;
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", activator.grpc_addr)).unwrap();
    let elsewhere = EmbedClient::new(endpoint.origin("http://gte.ml.svc:50051".parse().unwrap()).connect_lazy());
    let status = elsewhere.clone().embed(embed_request("who")).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
    assert_eq!(held(&activations), 0);
}

#[tokio::test]
async fn a_keyed_pools_calls_without_one_of_its_keys_are_refused_not_held() {
    const KEY: &str = "search-key-0123456789abcdef";
    let (ring, _) = KeyRing::parse([("search", KEY.as_bytes())]);
    let gate = Arc::new(Gate::unmetered("bge", Policy::Keys(ring)));
    let (activator, activations) =
        activator_with(Duration::from_secs(30), move |table| table.set_keys("bge", Some(gate))).await;
    let client = dialling_the_pool(&activator);
    for authorization in [None, Some("Bearer not-a-key-of-this-pool-0123")] {
        let pairs: Vec<(&'static str, &str)> = authorization.iter().map(|value| ("authorization", *value)).collect();
        let refused = client.clone().embed(with_meta(embed_request("no key"), &pairs)).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    }
    assert_eq!(held(&activations), 0, "refused before being held: no demand that wakes the pool");
    let authorization = format!("Bearer {KEY}");
    let keyed = spawn_embed(&client, with_meta(embed_request("with the key"), &[("authorization", &authorization)]));
    until("the key holder's call held", Duration::from_secs(10), || held(&activations) == 1).await;
    keyed.abort();
}

#[tokio::test]
async fn a_call_to_a_pools_service_address_is_held_for_that_pool_without_naming_it() {
    let naming = Arc::new(PoolNaming::new("ml"));
    let (activator, activations) = activator_naming(naming.clone(), Duration::from_secs(30), |_| {}).await;
    // What the Services' watch keeps: here the activator's own loopback address stands for the
    // pool's IPv4 ClusterIP (the client dials it as it is), and fd00:10:96::c for an IPv6 one.
    let ipv6: IpAddr = "fd00:10:96::c".parse().unwrap();
    naming.set_addresses(BTreeMap::from([(Ipv4Addr::LOCALHOST.into(), "bge".into()), (ipv6, "bge".into())]));
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", activator.grpc_addr)).unwrap();
    let by_address = EmbedClient::new(endpoint.clone().connect_lazy());
    let by_ipv6 =
        EmbedClient::new(endpoint.clone().origin("http://[fd00:10:96::c]:50051".parse().unwrap()).connect_lazy());
    let elsewhere = EmbedClient::new(endpoint.origin("http://10.96.0.99:50051".parse().unwrap()).connect_lazy());

    let unknown = elsewhere.clone().embed(embed_request("no pool's address")).await.unwrap_err();
    assert_eq!(held(&activations), 0, "an address no pool's Service has is not held: {unknown:?}");
    // Not found, not UNAVAILABLE: a retry would not make the call any pool's.
    assert_eq!(unknown.code(), tonic::Code::NotFound, "{unknown:?}");
    assert!(unknown.message().contains("x-teifleet-pool"), "says how to name the pool: {unknown:?}");
    assert!(unknown.metadata().get("grpc-retry-pushback-ms").is_none(), "{unknown:?}");

    let unary = spawn_embed(&by_address, embed_request("to the ClusterIP"));
    let bracketed = spawn_embed(&by_ipv6, embed_request("to the IPv6 ClusterIP"));
    let http_addr = activator.http_addr.unwrap();
    // Host: 127.0.0.1:<port>, and no x-teifleet-pool.
    let http =
        tokio::spawn(async move { request(http_addr, "POST", "/embed", &[], br#"{"inputs":"curl to an IP"}"#).await });
    until("three calls held", Duration::from_secs(10), || held(&activations) == 3).await;

    let sim = sim(|_| {}).await;
    let (replica, _) = mux_with(vec![spec("bge", sim.addr(), limits(8, 64))], Settings::default()).await;
    activations.set_peers("bge", &[format!("http://{}", replica.grpc_addr)]).unwrap();
    unary.await.unwrap().expect("the call to the address is served");
    bracketed.await.unwrap().expect("the call to the IPv6 address is served");
    assert_eq!(http.await.unwrap().status, 200);
    let served = metric_sum(&metrics_text(&replica), "teifleet_requests_total", &[("outcome", "ok")]);
    assert_eq!(served, 3.0, "the pool's replica served them");
}

#[tokio::test]
async fn a_call_naming_no_pool_is_not_found_and_one_for_a_pool_not_described_yet_is_unavailable() {
    // No address is any pool's: a call to the activator's own address names nothing.
    let (activator, activations) = activator(Duration::from_secs(30)).await;
    let http_addr = activator.http_addr.unwrap();
    let unnamed = request(http_addr, "POST", "/embed", &[], br#"{"inputs":"to the pod IP"}"#).await;
    assert_eq!(unnamed.status, 404, "{}", unnamed.body);
    assert_eq!(unnamed.body["error_type"], "Validation", "TEI's error shape: {}", unnamed.body);
    let message = unnamed.body["error"].as_str().unwrap();
    assert!(message.contains("Service") && message.contains("x-teifleet-pool"), "{message}");
    assert_eq!(unnamed.header("retry-after"), None, "no retry makes it a pool's");
    assert_eq!(held(&activations), 0);

    // A pool named while its EmbeddingPool status (its limits) is not there yet: retry shortly.
    let (waiting, waiting_activations) = activator_with(Duration::from_secs(30), |table| {
        table
            .sync(vec![PoolSpec {
                name: "bge".into(),
                model: Some(MODEL.into()),
                upstream: "activated://bge".into(),
                limits: None,
                remote: true,
                coalesce: false,
                tenants: BTreeMap::new(),
            }])
            .unwrap();
    })
    .await;
    let status = dialling_the_pool(&waiting).embed(embed_request("too early")).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("no limits yet"), "{status:?}");
    assert_eq!(held(&waiting_activations), 0);
}
