//! The activator role: calls for a pool with no ready replica (gRPC unary and streams, HTTP) are
//! held, counted for the operator, and served once a replica is ready; a call whose deadline is
//! shorter than the wait gets DEADLINE_EXCEEDED at its deadline; one whose hold runs out gets
//! UNAVAILABLE with a retry hint. The pool is the name the client dialled, or the pool whose
//! Service address it dialled. An activator that shuts down answers every call it holds, OK once
//! the pool is ready or UNAVAILABLE with a retry hint, and a client that retries loses none.

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
    activator_of(&["bge"], naming, hold, configure, Settings::default()).await
}

/// An activator for `pools` of namespace `ml`, with `settings` (its ports and naming set here).
async fn activator_of(
    pools: &[&str],
    naming: Arc<PoolNaming>,
    hold: Duration,
    configure: impl FnOnce(&PoolTable),
    settings: Settings,
) -> (Running, Arc<Activations>) {
    let activations = Arc::new(Activations::default());
    activations.sync(&pools.iter().map(|pool| ((*pool).to_owned(), hold)).collect::<Vec<_>>());
    let metrics = Metrics::new();
    let table = Arc::new(PoolTable::activator(metrics.clone(), activations.clone()));
    let spec = |pool: &str| PoolSpec {
        name: pool.into(),
        model: Some(MODEL.into()),
        upstream: format!("activated://{pool}"),
        limits: Some(limits(1 << 20, 1 << 20)),
        remote: true,
        coalesce: false,
        cache: None,
        tenants: BTreeMap::new(),
    };
    table.sync(pools.iter().map(|pool| spec(pool)).collect()).unwrap();
    configure(&table);
    let settings =
        Settings { http_listen: Some("127.0.0.1:0".parse().unwrap()), pool_naming: Some(naming), ..settings };
    (server::start(settings, table, metrics).await.expect("the activator starts"), activations)
}

/// A client of the activator that dialled the pool Service by name, as clients of the pool do.
fn dialling_the_pool(activator: &Running) -> EmbedClient<Channel> {
    dialling(activator, "bge")
}

/// A client of the activator that dialled `pool`'s Service by name.
fn dialling(activator: &Running, pool: &str) -> EmbedClient<Channel> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", activator.grpc_addr)).unwrap();
    EmbedClient::new(endpoint.origin(format!("http://{pool}.ml.svc:50051").parse().unwrap()).connect_lazy())
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
                cache: None,
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

/// An activator shut down while it holds 50 calls (gRPC and HTTP) for two pools at zero, one of
/// which becomes ready during its drain delay: that pool's calls are served, the other's are
/// answered UNAVAILABLE with the retry hint as soon as the drain delay ends, none near its
/// deadline, and the activator stops.
#[tokio::test]
async fn an_activator_shut_down_holding_50_calls_answers_each_ok_or_unavailable_before_its_deadline() {
    const DEADLINE: Duration = Duration::from_secs(20);
    let drain_delay = Duration::from_millis(600);
    let settings = Settings { drain_delay, ..Settings::default() };
    let naming = Arc::new(PoolNaming::new("ml"));
    // Held far longer than the test: only the shutdown can end these holds.
    let (activator, activations) =
        activator_of(&["bge", "gte"], naming, Duration::from_secs(120), |_| {}, settings).await;
    let mut grpc = Vec::new();
    for (pool, calls) in [("bge", 20), ("gte", 20)] {
        let client = dialling(&activator, pool);
        for call in 0..calls {
            let mut request = tonic::Request::new(embed_request(&format!("{pool} call {call} at zero")));
            request.set_timeout(DEADLINE);
            grpc.push((pool, spawn_embed(&client, request)));
        }
    }
    let http_addr = activator.http_addr.unwrap();
    let http: Vec<_> = ["bge", "gte"]
        .into_iter()
        .flat_map(|pool| std::iter::repeat_n(pool, 5))
        .map(|pool| {
            (
                pool,
                tokio::spawn(async move {
                    request(http_addr, "POST", "/embed", &[(POOL_HEADER, pool)], b"{\"inputs\":\"x\"}").await
                }),
            )
        })
        .collect();
    until("50 calls held", Duration::from_secs(10), || held(&activations) == 50).await;

    let stopping = std::time::Instant::now();
    let shutdown = tokio::spawn(activator.shutdown());
    // Within the drain delay, bge's first replica becomes ready; gte stays at zero.
    tokio::time::sleep(drain_delay / 3).await;
    let sim = sim(|_| {}).await;
    let (replica, _) = mux_with(vec![spec("bge", sim.addr(), limits(64, 64))], Settings::default()).await;
    activations.set_peers("bge", &[format!("http://{}", replica.grpc_addr)]).unwrap();

    let (mut served, mut unavailable) = (0, 0);
    for (pool, call) in grpc {
        let answer = tokio::time::timeout(DEADLINE, call).await.expect("no call hangs").unwrap();
        match (pool, answer) {
            ("bge", Ok(_)) => served += 1,
            ("gte", Err(status)) if status.code() == tonic::Code::Unavailable => {
                assert_eq!(status.metadata().get("grpc-retry-pushback-ms").unwrap(), "1000", "{status:?}");
                unavailable += 1;
            }
            (pool, answer) => panic!("{pool}: neither served nor UNAVAILABLE: {answer:?}"),
        }
    }
    for (pool, call) in http {
        let answer = call.await.unwrap();
        match pool {
            "bge" => assert_eq!(answer.status, 200, "{}", answer.body),
            _ => {
                assert_eq!(answer.status, 503, "{}", answer.body);
                assert_eq!(answer.header("retry-after"), Some("1"));
            }
        }
    }
    let answered_within = stopping.elapsed();
    assert_eq!((served, unavailable), (20, 20));
    assert!(answered_within < DEADLINE / 2, "answered {answered_within:?} after the shutdown began");
    assert_eq!(held(&activations), 0);
    tokio::time::timeout(Duration::from_secs(10), shutdown).await.expect("the activator stops").unwrap().unwrap();
    let served = metric_sum(&metrics_text(&replica), "teifleet_requests_total", &[("outcome", "ok")]);
    assert_eq!(served, 25.0, "bge's replica served its 25 held calls");
}

/// Two activator replicas behind a pool's Service: one shuts down holding 50 calls. A client that
/// retries UNAVAILABLE (after the hint, reaching the other replica as the Service now routes) gets
/// every call held there and served once the pool is ready: none is lost.
#[tokio::test]
async fn a_client_retrying_unavailable_loses_no_call_when_one_of_two_activators_shuts_down() {
    let settings = || Settings { drain_delay: Duration::from_millis(200), ..Settings::default() };
    let hold = Duration::from_secs(120);
    let (going, going_held) = activator_of(&["bge"], Arc::new(PoolNaming::new("ml")), hold, |_| {}, settings()).await;
    let (staying, staying_held) =
        activator_of(&["bge"], Arc::new(PoolNaming::new("ml")), hold, |_| {}, settings()).await;
    // The Service's endpoints, as each retry finds them: the replica going, then the one staying.
    let (first, then) = (dialling_the_pool(&going), dialling_the_pool(&staying));
    let calls: Vec<_> = (0..50)
        .map(|call| {
            let (mut first, mut then) = (first.clone(), then.clone());
            tokio::spawn(async move {
                let mut request = tonic::Request::new(embed_request(&format!("call {call}")));
                request.set_timeout(Duration::from_secs(30));
                match first.embed(request).await {
                    Err(status) if status.code() == tonic::Code::Unavailable => {
                        let pushback = status.metadata().get("grpc-retry-pushback-ms").expect("a retry hint");
                        let pushback: u64 = pushback.to_str().unwrap().parse().unwrap();
                        tokio::time::sleep(Duration::from_millis(pushback)).await;
                        then.embed(embed_request(&format!("call {call}, again"))).await.map(|_| "retried")
                    }
                    answer => answer.map(|_| "first"),
                }
            })
        })
        .collect();
    until("50 calls held at the replica going", Duration::from_secs(10), || held(&going_held) == 50).await;
    let shutdown = tokio::spawn(going.shutdown());
    until("every call held again at the replica staying", Duration::from_secs(10), || held(&staying_held) == 50).await;
    tokio::time::timeout(Duration::from_secs(10), shutdown).await.expect("the activator stops").unwrap().unwrap();

    let sim = sim(|_| {}).await;
    let (replica, _) = mux_with(vec![spec("bge", sim.addr(), limits(64, 64))], Settings::default()).await;
    staying_held.set_peers("bge", &[format!("http://{}", replica.grpc_addr)]).unwrap();
    for call in calls {
        let answer = tokio::time::timeout(Duration::from_secs(20), call).await.expect("no call hangs").unwrap();
        assert_eq!(answer.expect("served after one retry"), "retried");
    }
    assert_eq!(held(&staying_held), 0);
}

/// A replica the activator believes ready that refuses connections: the held call fails
/// UNAVAILABLE in the sidecar's words (tonic's balancer gives its own transport's), without the
/// replica's pod address, port or URL in what the client is told.
#[tokio::test]
async fn a_replica_that_refuses_connections_is_not_named_by_its_address() {
    let (activator, activations) = activator(Duration::from_secs(2)).await;
    let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    activations.set_peers("bge", &[format!("http://{gone}")]).unwrap();
    let client = dialling_the_pool(&activator);
    let mut call = tonic::Request::new(embed_request("to a replica that is gone"));
    call.set_timeout(Duration::from_secs(5));
    let failed = client.clone().embed(call).await.unwrap_err();
    assert_eq!(failed.code(), tonic::Code::Unavailable, "{failed:?}");
    assert_eq!(failed.message(), "upstream bge is unreachable", "the sidecar's words, not the transport's");
    let port = gone.port().to_string();
    for inside in ["127.0.0.1", port.as_str(), "http://"] {
        assert!(!failed.message().contains(inside), "{inside:?} told: {failed:?}");
    }
    let http =
        request(activator.http_addr.unwrap(), "POST", "/embed", &[(POOL_HEADER, "bge")], br#"{"inputs":"x"}"#).await;
    assert_eq!(http.status, 503, "{}", http.body);
    assert_eq!(http.body["error"], "upstream bge is unreachable", "{}", http.body);
    for inside in ["127.0.0.1", port.as_str(), "http://"] {
        assert!(!http.body.to_string().contains(inside), "{inside:?} told: {}", http.body);
    }
}
