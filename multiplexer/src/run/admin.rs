//! The admin HTTP port: `/metrics`, `/healthz`, `/readyz`, and TEI's health on TEI's behalf
//! ([`tei_health::PATH`]): TEI listens on the pod's loopback only, where the kubelet's probes
//! cannot reach it.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::response::Response;
use axum::routing::get;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use teifleet_crds::SidecarAdmission;
use teifleet_runtime::http_server::ServerBounds;
use teifleet_runtime::tls::ServerTls;
use teifleet_wire::sidecar_admin::{ACTIVATIONS_PATH, ADMISSION_PATH};
use teifleet_wire::tei_health;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use crate::forward::pools::PoolTable;
use crate::front::Readiness;
use crate::report::call::Activity;
use crate::report::metrics::Metrics;

/// Asks the own pool's TEI, over the standard gRPC health service, whether it serves; the error
/// says why not. Unlike readiness this is TEI's health alone: it does not need the pool's limits
/// and stays true while the sidecar drains, so the kubelet never restarts TEI for the sidecar's
/// state. Only the pool's upstream address is needed, which the sidecar knows once it has seen
/// its pool.
pub async fn check_tei(pools: &PoolTable) -> Result<(), String> {
    let pool = pools.get(pools.own_name()).ok_or("the sidecar does not know its pool yet, so TEI was not asked")?;
    let wait = Duration::from_secs(tei_health::CHECK_TIMEOUT_SECONDS);
    let mut client = HealthClient::new(pool.upstream.channel());
    let check = client.check(HealthCheckRequest { service: String::new() });
    match tokio::time::timeout(wait, check).await {
        Err(_) => Err(format!("TEI did not answer its health check within {wait:?}")),
        Ok(Err(status)) => Err(format!("TEI's health check failed: {:?}: {}", status.code(), with_causes(&status))),
        Ok(Ok(answer)) => match ServingStatus::try_from(answer.get_ref().status) {
            Ok(ServingStatus::Serving) => Ok(()),
            Ok(other) => Err(format!("TEI reports {}", other.as_str_name())),
            Err(_) => Err(format!("TEI reports an unknown health status {}", answer.get_ref().status)),
        },
    }
}

/// A failed call's message and the errors under it: tonic says only "tcp connect error", the
/// operating system's reason ("Connection refused") sits further down.
fn with_causes(status: &tonic::Status) -> String {
    let mut text = status.message().to_owned();
    let mut cause = std::error::Error::source(status);
    while let Some(error) = cause {
        let line = error.to_string();
        if !text.contains(&line) {
            text = format!("{text}: {line}");
        }
        cause = error.source();
    }
    text
}

/// The own pool's admission state and last minute's refusals and spills, for the operator's
/// status summary; `None` until the pool and its limits are known.
pub fn own_admission(
    pools: &PoolTable,
    metrics: &Metrics,
    tls: &ServerTls,
    activity: &Activity,
) -> Option<SidecarAdmission> {
    let pool = pools.get(pools.own_name())?;
    pool.spec.limits?;
    let snapshot = pool.admission.snapshot();
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    let (refused_per_second, spilled_per_second) = metrics.recent_rates(&pool.spec.name);
    Some(SidecarAdmission {
        pool: pool.spec.name.clone(),
        effective_in_flight: count(snapshot.effective_limit),
        max_in_flight: count(snapshot.limits.max_in_flight),
        adaptive: snapshot.limits.adaptive,
        in_flight: count(snapshot.in_flight),
        queued: count(snapshot.queued_total()),
        standing_queue: snapshot.standing_queue,
        refused_per_second,
        spilled_per_second,
        idle_seconds: Some(activity.idle_for().as_secs_f64()),
        tls: crate::transport::tls::report(tls),
    })
}

/// How long TEI may take to hand over its metrics.
const TEI_METRICS_WITHIN: Duration = Duration::from_secs(5);

/// TEI's own metrics, fetched from `url` (TEI's loopback-only Prometheus port) and passed on
/// unchanged; 502 with the reason when TEI does not answer.
async fn relay_tei_metrics(client: Client<HttpConnector, Empty<Bytes>>, url: http::Uri) -> Response {
    let fetch = async {
        let answer = client.get(url).await.map_err(|error| format!("TEI's metrics port: {error}"))?;
        let (parts, body) = answer.into_parts();
        let body = body.collect().await.map_err(|error| format!("TEI's metrics: {error}"))?.to_bytes();
        Ok::<_, String>((parts.status, parts.headers.get(header::CONTENT_TYPE).cloned(), body))
    };
    match tokio::time::timeout(TEI_METRICS_WITHIN, fetch).await {
        Ok(Ok((status, content_type, body))) => {
            let mut response = (status, body).into_response();
            if let Some(content_type) = content_type {
                response.headers_mut().insert(header::CONTENT_TYPE, content_type);
            }
            response
        }
        Ok(Err(reason)) => (StatusCode::BAD_GATEWAY, format!("{reason}\n")).into_response(),
        Err(_) => {
            (StatusCode::BAD_GATEWAY, format!("TEI did not hand over its metrics within {TEI_METRICS_WITHIN:?}\n"))
                .into_response()
        }
    }
}

/// `/metrics`, `/healthz`, `/readyz`, [`tei_health::PATH`], [`ADMISSION_PATH`], and, with
/// `tei_metrics`, TEI's own metrics on [`tei_health::METRICS_PATH`].
pub fn router(
    metrics: &Metrics,
    readiness: Arc<Readiness>,
    tls: Arc<ServerTls>,
    activity: Arc<Activity>,
    tei_metrics: Option<http::Uri>,
) -> Router {
    let (admission_pools, admission_metrics) = (readiness.pools.clone(), metrics.clone());
    let admission = get(move || {
        let (pools, metrics, tls, activity) =
            (admission_pools.clone(), admission_metrics.clone(), tls.clone(), activity.clone());
        async move {
            match own_admission(&pools, &metrics, &tls, &activity) {
                Some(report) => crate::front::http::json(&report),
                None => (StatusCode::SERVICE_UNAVAILABLE, "pool configuration not known yet\n").into_response(),
            }
        }
    });
    let pools = readiness.pools.clone();
    let tei = get(move || {
        let pools = pools.clone();
        async move {
            match check_tei(&pools).await {
                Ok(()) => (StatusCode::OK, "TEI serving\n".to_owned()),
                Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
            }
        }
    });
    let activations = readiness.pools.activations().cloned();
    let mut router = teifleet_runtime::admin::routes(metrics.registry.clone())
        .readyz(move || readiness.ready())
        .into_router()
        .route(tei_health::PATH, tei)
        .route(ADMISSION_PATH, admission);
    if let Some(activations) = activations {
        let report = get(move || {
            let activations = activations.clone();
            async move { crate::front::http::json(&activations.report()) }
        });
        router = router.route(ACTIVATIONS_PATH, report);
    }
    match tei_metrics {
        Some(url) => {
            let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
            router.route(tei_health::METRICS_PATH, get(move || relay_tei_metrics(client.clone(), url.clone())))
        }
        None => router,
    }
}

/// The paths the kubelet's probes call on the admin port: the sidecar's own, and TEI's on its
/// behalf. Served on places no other client can hold (`ServerBounds::probe_slots`).
pub const PROBE_PATHS: &[&str] = &["/healthz", "/readyz", tei_health::PATH];

/// Serves the admin `router` on `listener` until `stop`.
pub async fn serve(listener: TcpListener, router: Router, metrics: &Metrics, stop: CancellationToken) {
    let refused = metrics.refusal_counter("admin");
    let bounds = ServerBounds { probe_paths: PROBE_PATHS, ..ServerBounds::ADMIN };
    let serving = teifleet_runtime::admin::serve_within(listener, router, &bounds, refused, stop.cancelled_owned());
    if let Err(error) = serving.await {
        tracing::error!(%error, "admin server failed");
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::net::SocketAddr;

    use teifleet_tei_sim::{Fault, SimConfig};
    use teifleet_testkit::http::{Response, request};

    use super::*;
    use crate::admission::Priority;
    use crate::forward::pools::PoolSpec;
    use crate::vocab::Outcome;
    use crate::vocab::Protocol;

    /// An admin port whose own pool `own` has its TEI at `upstream`, or no pool at all.
    async fn admin(upstream: Option<String>) -> (SocketAddr, CancellationToken) {
        admin_relaying(upstream, None).await
    }

    /// The same, relaying TEI's metrics from `tei_metrics`.
    async fn admin_relaying(
        upstream: Option<String>,
        tei_metrics: Option<http::Uri>,
    ) -> (SocketAddr, CancellationToken) {
        let metrics = Metrics::new();
        let pools = Arc::new(PoolTable::new("own", metrics.clone()));
        if let Some(upstream) = upstream {
            let own = PoolSpec {
                name: "own".into(),
                model: None,
                upstream,
                // Limits unknown: TEI's health must not wait for them.
                limits: None,
                remote: false,
                coalesce: false,
                cache: None,
                tenants: BTreeMap::new(),
            };
            pools.sync(vec![own]).unwrap();
        }
        // Draining: TEI's health must not depend on the sidecar's own state either.
        let readiness = Arc::new(Readiness { pools, upstream_serving: false.into(), accepting: false.into() });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let router = router(&metrics, readiness, Arc::new(ServerTls::off()), Arc::default(), tei_metrics);
        let serving = stop.clone();
        tokio::spawn(async move { serve(listener, router, &metrics, serving).await });
        (addr, stop)
    }

    async fn tei_health(addr: SocketAddr) -> Response {
        request(addr, "GET", tei_health::PATH).await.expect("the admin port answers")
    }

    #[tokio::test]
    async fn answers_for_tei_whatever_the_sidecar_knows_or_does() {
        let sim = teifleet_tei_sim::start(SimConfig::default()).await.unwrap();
        let (addr, stop) = admin(Some(format!("http://{}", sim.addr()))).await;
        assert_eq!(tei_health(addr).await, Response { status: 200, body: "TEI serving\n".into() });
        // The sidecar's own readiness says otherwise, and stays its own.
        assert_eq!(request(addr, "GET", "/readyz").await.unwrap().status, 503);

        sim.set_fault(Fault::Fail);
        assert_eq!(tei_health(addr).await, Response { status: 503, body: "TEI reports NOT_SERVING\n".into() });
        sim.set_fault(Fault::None);
        assert_eq!(tei_health(addr).await.status, 200);

        sim.shutdown().await;
        let down = tei_health(addr).await;
        assert_eq!(down.status, 503);
        assert!(down.body.starts_with("TEI's health check failed: Unavailable"), "{down:?}");
        assert!(down.body.contains("Connection refused"), "the operating system's reason: {down:?}");
        stop.cancel();
    }

    #[tokio::test]
    async fn a_tei_that_never_answers_gets_a_reason_within_the_check_timeout() {
        // Accepts connections and says nothing: not even the HTTP/2 handshake completes.
        let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent_addr = silent.local_addr().unwrap();
        let held = tokio::spawn(async move {
            let mut connections = Vec::new();
            while let Ok((connection, _)) = silent.accept().await {
                connections.push(connection);
            }
        });
        let (addr, stop) = admin(Some(format!("http://{silent_addr}"))).await;
        let started = tokio::time::Instant::now();
        let answer = tei_health(addr).await;
        let waited = started.elapsed();
        let limit = Duration::from_secs(tei_health::CHECK_TIMEOUT_SECONDS);
        assert_eq!(answer.status, 503);
        assert_eq!(answer.body, format!("TEI did not answer its health check within {limit:?}\n"));
        assert!(waited < limit + Duration::from_millis(500), "answered after {waited:?}");
        held.abort();
        stop.cancel();
    }

    #[tokio::test]
    async fn without_its_pool_the_sidecar_says_it_did_not_ask() {
        let (addr, stop) = admin(None).await;
        let answer = tei_health(addr).await;
        assert_eq!(
            answer,
            Response { status: 503, body: "the sidecar does not know its pool yet, so TEI was not asked\n".into() }
        );
        stop.cancel();
    }
    #[tokio::test]
    async fn reports_the_own_pools_limit_in_force_once_known() {
        let metrics = Metrics::new();
        let pools = PoolTable::new("own", metrics.clone());
        let spec = |limits| PoolSpec {
            name: "own".into(),
            model: None,
            upstream: "http://127.0.0.1:1".into(),
            limits,
            remote: false,
            coalesce: false,
            cache: None,
            tenants: BTreeMap::new(),
        };
        pools.sync(vec![spec(None)]).unwrap();
        assert_eq!(own_admission(&pools, &metrics, &ServerTls::off(), &Activity::default()), None, "no limits yet");
        let adaptive = crate::admission::Limits {
            adaptive: true,
            ..crate::admission::Limits::new(64, 128, Duration::from_secs(2))
        };
        pools.sync(vec![spec(Some(adaptive))]).unwrap();
        let report = own_admission(&pools, &metrics, &ServerTls::off(), &Activity::default()).unwrap();
        assert_eq!((report.pool.as_str(), report.max_in_flight, report.adaptive), ("own", 64, true));
        assert_eq!(report.effective_in_flight, 16, "an adaptive limit starts at a quarter of its ceiling");
        assert_eq!((report.refused_per_second, report.spilled_per_second), (0.0, 0.0));

        // Refusals counted where every call's outcome is, and spills, each pool its own.
        for outcome in [Outcome::ShedQueueFull, Outcome::ExpiredInQueue, Outcome::Ok, Outcome::Rejected] {
            metrics.request_done("own", Priority::Standard, Protocol::Grpc, "Embed", tonic::Code::Ok, outcome);
        }
        metrics.request_done(
            "other",
            Priority::Standard,
            Protocol::Grpc,
            "Embed",
            tonic::Code::Ok,
            Outcome::ShedDeadline,
        );
        metrics.spilled("own", "served");
        let report = own_admission(&pools, &metrics, &ServerTls::off(), &Activity::default()).unwrap();
        assert_eq!((report.refused_per_second, report.spilled_per_second), (2.0 / 60.0, 1.0 / 60.0));
    }
    #[tokio::test]
    async fn relays_teis_own_metrics_unchanged_and_says_why_when_it_cannot() {
        let exposition = "# TYPE te_queue_size gauge\nte_queue_size 3\n";
        let tei = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tei_addr = tei.local_addr().unwrap();
        let tei_router = Router::new().route(
            "/metrics",
            get(move || async move { ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], exposition) }),
        );
        tokio::spawn(async move { axum::serve(tei, tei_router).await });
        let url: http::Uri = format!("http://{tei_addr}/metrics").parse().unwrap();
        let (addr, stop) = admin_relaying(None, Some(url)).await;
        let relayed = request(addr, "GET", tei_health::METRICS_PATH).await.unwrap();
        assert_eq!((relayed.status, relayed.body.as_str()), (200, exposition));

        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        let (down, stop_down) = admin_relaying(None, Some(format!("http://{closed}/metrics").parse().unwrap())).await;
        let refused = request(down, "GET", tei_health::METRICS_PATH).await.unwrap();
        assert_eq!(refused.status, 502);
        assert!(refused.body.contains("TEI's metrics port"), "{}", refused.body);

        let (plain, stop_plain) = admin(None).await;
        assert_eq!(
            request(plain, "GET", tei_health::METRICS_PATH).await.unwrap().status,
            404,
            "not relayed unless asked"
        );
        for stop in [stop, stop_down, stop_plain] {
            stop.cancel();
        }
    }
}
