//! The load generator against an in-process TEI simulator: counts, codes, lateness, deadlines,
//! stream mode and the end-of-run grace, on real gRPC over 127.0.0.1.

use std::time::Duration;

use teifleet_load::arrivals::Arrivals;
use teifleet_load::codes::UNFINISHED;
use teifleet_load::inputs::{Inputs, QueryMix, Tokens};
use teifleet_load::{Call, LoadConfig, Mode, Protocol};
use teifleet_tei_sim::{Fault, SimConfig};

async fn sim(configure: impl FnOnce(&mut SimConfig)) -> teifleet_tei_sim::SimHandle {
    let mut config = SimConfig::default();
    configure(&mut config);
    teifleet_tei_sim::start(config).await.expect("simulator starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_sends_on_schedule_and_reports_the_server_split() {
    let sim = sim(|_| {}).await;
    let config = LoadConfig {
        mode: Mode::Open { rate: 200.0, arrivals: Arrivals::Constant },
        requests: 100,
        connections: 2,
        inputs: Inputs::Words(Tokens::Mix(vec![2, 16])),
        ..LoadConfig::open(format!("http://{}", sim.addr()), 200.0, Duration::from_secs(10))
    };
    let report = teifleet_load::run(&config).await.unwrap();
    assert_eq!(report.sent, 100);
    assert_eq!(report.count("OK"), 100, "{:?}", report.codes);
    assert_eq!(sim.stats().completed, 100);
    // 100 requests at 200/s: about half a second, and the offered rate is what was asked.
    assert!((0.45..2.0).contains(&report.elapsed_s), "{}", report.elapsed_s);
    let offered = report.offered_rps.unwrap();
    assert!((offered - 200.0).abs() < 1.0, "{offered}");
    let lateness = report.lateness.unwrap();
    assert_eq!(lateness.count, 100);
    // The dispatcher thread sleeps precisely; allow a loaded CI machine its hiccups.
    assert!(lateness.p50_ms < 5.0, "{lateness:?}");
    assert!(report.tei_inference.unwrap().p50_ms > 0.0);
    assert!(report.tei_queue.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_streams_count_whole_calls() {
    let sim = sim(|_| {}).await;
    let config = LoadConfig {
        call: Call::EmbedStream { batch: 5 },
        priority: Some("critical".into()),
        ..LoadConfig::closed(format!("http://{}", sim.addr()), 3, 12)
    };
    let report = teifleet_load::run(&config).await.unwrap();
    assert_eq!((report.sent, report.ok), (12, 12));
    assert!(report.lateness.is_none());
    // One TEI timing per streamed message.
    assert_eq!(report.tei_queue.unwrap().count, 60);
    assert_eq!(sim.stats().completed, 60);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_data_deadlines_and_unfinished_calls_are_counted() {
    let sim = sim(|c| c.max_concurrent_requests = 2).await;
    sim.set_fault(Fault::Stall);
    let target = format!("http://{}", sim.addr());
    // Two calls take both slots and stall; the rest are refused at once by TEI's admission.
    let config = LoadConfig { deadline: Some(Duration::from_millis(200)), ..LoadConfig::closed(target.clone(), 4, 6) };
    let report = teifleet_load::run(&config).await.unwrap();
    assert_eq!(report.sent, 6);
    assert_eq!(report.ok, 0);
    assert!(report.count("RESOURCE_EXHAUSTED") >= 1, "{:?}", report.codes);
    let timed_out = report.answered - report.count("RESOURCE_EXHAUSTED");
    assert!(timed_out >= 2, "{:?}", report.codes);
    assert_eq!(report.goodput_rps, 0.0);

    // Without a deadline, stalled calls are cut at the end of the grace period.
    let config = LoadConfig { grace: Duration::from_millis(300), ..LoadConfig::closed(target, 2, 2) };
    let report = teifleet_load::run(&config).await.unwrap();
    assert_eq!(report.count(UNFINISHED), 2, "{:?}", report.codes);
    sim.set_fault(Fault::None);
}

#[tokio::test]
async fn unreachable_and_non_loopback_targets_are_errors() {
    let closed = teifleet_testkit::net::ClosedPort::new().unwrap();
    let config = LoadConfig::closed(format!("http://{}", closed.addr()), 1, 1);
    assert!(matches!(teifleet_load::run(&config).await, Err(teifleet_load::Error::Connect { .. })));
    let config = LoadConfig::closed("http://192.0.2.1:80", 1, 1);
    assert!(matches!(teifleet_load::run(&config).await, Err(teifleet_load::Error::InvalidArgument(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_calls_and_query_mixes() {
    let sim = sim(|_| {}).await;
    let target = format!("http://{}", sim.addr());
    let report = teifleet_load::run(&LoadConfig { call: Call::Info, ..LoadConfig::closed(target.clone(), 2, 20) })
        .await
        .unwrap();
    assert_eq!(report.ok, 20, "{:?}", report.codes);
    assert!(report.tei_inference.is_none(), "Info has no device time");
    assert_eq!(report.info.call, "Info");

    let mix = QueryMix { exponent: 1.1, distinct: 100, tokens: 8 };
    let report = teifleet_load::run(&LoadConfig { inputs: Inputs::Queries(mix), ..LoadConfig::closed(target, 4, 50) })
        .await
        .unwrap();
    assert_eq!(report.ok, 50, "{:?}", report.codes);
    assert!(report.info.inputs.starts_with("Zipf"), "{}", report.info.inputs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_spread_over_several_targets_in_turn() {
    let (a, b) = (sim(|_| {}).await, sim(|_| {}).await);
    let (ta, tb) = (format!("http://{}", a.addr()), format!("http://{}", b.addr()));
    // Request i goes out on connection i mod 4, and connection k to target k mod 2: half each.
    let config = LoadConfig {
        mode: Mode::Open { rate: 400.0, arrivals: Arrivals::Constant },
        requests: 40,
        connections: 4,
        more_targets: vec![tb.clone()],
        ..LoadConfig::open(ta.clone(), 400.0, Duration::from_secs(10))
    };
    let report = teifleet_load::run(&config).await.unwrap();
    assert_eq!(report.ok, 40, "{:?}", report.codes);
    assert_eq!((a.stats().completed, b.stats().completed), (20, 20));
    assert_eq!(report.info.target, format!("{ta}, {tb}"));

    // Each target needs a connection; HTTP has one client, not per-target connections.
    let config = LoadConfig { more_targets: vec![tb.clone()], ..LoadConfig::closed(ta.clone(), 1, 1) };
    assert!(matches!(teifleet_load::run(&config).await, Err(teifleet_load::Error::InvalidArgument(_))));
    let config =
        LoadConfig { protocol: Protocol::Http, connections: 2, more_targets: vec![tb], ..LoadConfig::closed(ta, 1, 1) };
    assert!(matches!(teifleet_load::run(&config).await, Err(teifleet_load::Error::InvalidArgument(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_calls_are_retried_up_to_the_policy_within_the_deadline() {
    use teifleet_load::retry::{RetryMode, RetryPolicy};
    let sim = sim(|c| c.max_concurrent_requests = 1).await;
    sim.set_fault(Fault::Stall);
    let target = format!("http://{}", sim.addr());
    // One call takes TEI's only slot and stalls; the others are refused at once, without a hint
    // (TEI sends none), so both modes back off with jitter, 5 attempts at most.
    let policy = RetryPolicy {
        initial_backoff: Duration::from_millis(2),
        max_backoff: Duration::from_millis(10),
        ..RetryPolicy::new(RetryMode::Pushback, 5)
    };
    let config = LoadConfig {
        deadline: Some(Duration::from_secs(2)),
        tenant: Some("search".into()),
        retry: Some(policy),
        ..LoadConfig::closed(target.clone(), 4, 4)
    };
    let report = teifleet_load::run(&config).await.unwrap();
    assert_eq!(report.count("RESOURCE_EXHAUSTED"), 3, "{:?}", report.codes);
    let retries = report.retries.as_ref().expect("a retrying run reports its attempts");
    // Three refused calls made 5 attempts each; the stalled one made 1.
    assert_eq!(retries.attempts, 16, "{retries:?}");
    assert_eq!(retries.hint.count, 0);
    assert_eq!(report.info.tenant.as_deref(), Some("search"));
    assert!(report.info.retry.as_deref().unwrap().starts_with("pushback retry, 5 attempts"));
    sim.set_fault(Fault::None);

    // A bad tenant name is a usage error.
    let config = LoadConfig { tenant: Some("two words".into()), ..LoadConfig::closed(target, 1, 1) };
    assert!(matches!(teifleet_load::run(&config).await, Err(teifleet_load::Error::InvalidArgument(_))));
}

/// A stand-in for TEI's HTTP API: `/embed` answers a vector, or 429 with a pushback hint when the
/// caller says it is sheddable; it remembers the last time budget it was given.
async fn http_api() -> (String, std::sync::Arc<std::sync::Mutex<Option<String>>>) {
    use axum::http::{HeaderMap, StatusCode};
    let budget = std::sync::Arc::new(std::sync::Mutex::new(None));
    let seen = budget.clone();
    let embed = move |headers: HeaderMap| {
        let seen = seen.clone();
        async move {
            let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
            *seen.lock().unwrap() = header("x-teifleet-timeout-ms");
            if header("x-teifleet-priority").as_deref() == Some("sheddable") {
                (StatusCode::TOO_MANY_REQUESTS, [("grpc-retry-pushback-ms", "7")], "{}")
            } else {
                (StatusCode::OK, [("content-type", "application/json")], "[[0.5, 0.5]]")
            }
        }
    };
    let app = axum::Router::new()
        .route("/health", axum::routing::get(|| async { "" }))
        .route("/info", axum::routing::get(|| async { "{}" }))
        .route("/embed", axum::routing::post(embed));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (target, budget)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_requests_are_counted_by_the_codes_their_statuses_stand_for() {
    let (target, budget) = http_api().await;
    let http = |config: LoadConfig| LoadConfig { protocol: Protocol::Http, ..config };
    let report = teifleet_load::run(&http(LoadConfig::closed(target.clone(), 4, 40))).await.unwrap();
    assert_eq!((report.sent, report.ok), (40, 40), "{:?}", report.codes);
    assert_eq!(report.info.protocol, "http");
    assert!(budget.lock().unwrap().is_none(), "no deadline, no budget header");

    let shed = LoadConfig {
        priority: Some("sheddable".into()),
        deadline: Some(Duration::from_millis(1500)),
        ..LoadConfig::closed(target.clone(), 2, 10)
    };
    let report = teifleet_load::run(&http(shed)).await.unwrap();
    assert_eq!(report.count("RESOURCE_EXHAUSTED"), 10, "{:?}", report.codes);
    let millis: u64 = budget.lock().unwrap().as_deref().expect("the deadline as a budget").parse().unwrap();
    assert!((1..=1500).contains(&millis), "{millis}");

    let info = LoadConfig { call: Call::Info, ..LoadConfig::closed(target.clone(), 1, 5) };
    assert_eq!(teifleet_load::run(&http(info)).await.unwrap().ok, 5);
    let stream = LoadConfig { call: Call::EmbedStream { batch: 2 }, ..LoadConfig::closed(target, 1, 1) };
    assert!(matches!(teifleet_load::run(&http(stream)).await, Err(teifleet_load::Error::InvalidArgument(_))));
    let closed = teifleet_testkit::net::ClosedPort::new().unwrap();
    let nobody = http(LoadConfig::closed(format!("http://{}", closed.addr()), 1, 1));
    assert!(matches!(teifleet_load::run(&nobody).await, Err(teifleet_load::Error::HttpConnect { .. })));
}
