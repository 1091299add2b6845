//! The admin HTTP port every binary serves: `/metrics` from a Prometheus registry, `/healthz`
//! (liveness: restart me when failing) and `/readyz` (readiness: send me traffic), each probe
//! answering 200, or 503 with the reason as the body.

use std::fmt::Display;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus::Registry;
use tokio::net::TcpListener;

use crate::http_server::{self, ServerBounds};
use crate::{Error, metrics};

type Probe = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// The admin routes being put together; both probes answer OK unless given a check.
pub struct AdminRoutes {
    registry: Registry,
    healthz: Probe,
    readyz: Probe,
}

/// Starts the admin routes for `registry`.
pub fn routes(registry: Registry) -> AdminRoutes {
    AdminRoutes { registry, healthz: Arc::new(|| Ok(())), readyz: Arc::new(|| Ok(())) }
}

fn probe<E: Display>(check: impl Fn() -> Result<(), E> + Send + Sync + 'static) -> Probe {
    Arc::new(move || check().map_err(|reason| reason.to_string()))
}

impl AdminRoutes {
    /// `/healthz` answers 503 with the reason while `check` fails.
    pub fn healthz<E: Display>(mut self, check: impl Fn() -> Result<(), E> + Send + Sync + 'static) -> Self {
        self.healthz = probe(check);
        self
    }

    /// `/readyz` answers 503 with the reason while `check` fails.
    pub fn readyz<E: Display>(mut self, check: impl Fn() -> Result<(), E> + Send + Sync + 'static) -> Self {
        self.readyz = probe(check);
        self
    }

    /// A router to serve as is, or to `merge` a binary's own admin routes into.
    pub fn into_router(self) -> Router {
        let Self { registry, healthz, readyz } = self;
        Router::new()
            .route("/metrics", get(move || std::future::ready(exposition(&registry))))
            .route("/healthz", get(move || std::future::ready(answer(&healthz, "ok"))))
            .route("/readyz", get(move || std::future::ready(answer(&readyz, "ready"))))
    }
}

fn exposition(registry: &Registry) -> Response {
    match metrics::render(registry) {
        Ok(text) => ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n")).into_response(),
    }
}

fn answer(probe: &Probe, ok: &'static str) -> (StatusCode, String) {
    match probe() {
        Ok(()) => (StatusCode::OK, format!("{ok}\n")),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
    }
}

/// Binds the admin port; the error names the address.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, Error> {
    TcpListener::bind(addr).await.map_err(|source| Error::Bind { addr, source })
}

/// Serves `router` on `listener` within [`ServerBounds::ADMIN`] until `shutdown` resolves, then
/// lets open requests finish; `refused` is told each time a bound turns a client away.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    refused: impl Fn(&'static str) + Send + Sync + 'static,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    serve_within(listener, router, &ServerBounds::ADMIN, refused, shutdown).await
}

/// [`serve`] within `bounds`: a binary whose admin port has probes of its own names their paths.
pub async fn serve_within(
    listener: TcpListener,
    router: Router,
    bounds: &ServerBounds,
    refused: impl Fn(&'static str) + Send + Sync + 'static,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "admin server listening");
    }
    http_server::serve(listener, router, bounds, refused, shutdown).await.map_err(Error::Serve)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use axum::body::Body;
    use axum::http::Request;
    use prometheus::IntCounter;
    use tower::ServiceExt as _;

    use super::*;

    async fn get_path(router: &Router, path: &str) -> (StatusCode, Option<String>, String) {
        let request = Request::get(path).body(Body::empty()).unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let content_type = response.headers().get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap().to_owned());
        let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        (status, content_type, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn serves_metrics_and_probes_with_reasons() {
        let registry = Registry::new();
        let calls = IntCounter::new("calls_total", "Calls.").unwrap();
        metrics::register(&registry, &[&calls]).unwrap();
        calls.inc();
        let ready = Arc::new(AtomicBool::new(false));
        let router = routes(registry)
            .readyz({
                let ready = Arc::clone(&ready);
                move || if ready.load(Ordering::Relaxed) { Ok(()) } else { Err("pool limits not known yet") }
            })
            .into_router();

        let (status, content_type, body) = get_path(&router, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(content_type.as_deref(), Some(metrics::CONTENT_TYPE));
        assert!(body.contains("calls_total 1"), "{body}");

        assert_eq!(get_path(&router, "/healthz").await.0, StatusCode::OK);
        let (status, _, body) = get_path(&router, "/readyz").await;
        assert_eq!((status, body.as_str()), (StatusCode::SERVICE_UNAVAILABLE, "pool limits not known yet\n"));
        ready.store(true, Ordering::Relaxed);
        let (status, _, body) = get_path(&router, "/readyz").await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "ready\n"));
        assert_eq!(get_path(&router, "/nope").await.0, StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn failing_liveness_answers_503_with_its_reason() {
        let router = routes(Registry::new()).healthz(|| Err::<(), _>("watches failing for 3m")).into_router();
        let (status, _, body) = get_path(&router, "/healthz").await;
        assert_eq!((status, body.as_str()), (StatusCode::SERVICE_UNAVAILABLE, "watches failing for 3m\n"));
    }
}
