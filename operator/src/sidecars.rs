//! What the pool's sidecars say about their admission, asked on their admin ports: what is in
//! flight and queued and what they refused or spilled (`status.demand`), and, for an adaptive
//! pool, the in-flight limit each found for itself (`status.admission.effective`). Best effort: a
//! sidecar that does not answer within a second is left out of the count, and a reconcile never
//! waits longer than that.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::Pod;
use serde::de::DeserializeOwned;
use teifleet_crds::{ActivatorReport, HeldCalls, SidecarAdmission};
use teifleet_wire::ports::MULTIPLEXER_ADMIN;
use teifleet_wire::sidecar_admin::{ACTIVATIONS_PATH, ADMISSION_PATH};

/// How long one sidecar may take to answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(1);

/// The largest report read from a sidecar: a real one is a few hundred bytes, and a pod that
/// answers with more cannot make the operator buffer it.
const MAX_REPORT_BYTES: usize = 64 * 1024;

/// How often a pool's demand (and an adaptive pool's limits) is refreshed when nothing else
/// triggers a reconcile.
pub const REFRESH: Duration = Duration::from_secs(30);

/// The admin addresses of the ready, running pods among `pods`.
fn addresses(pods: &[Pod]) -> Vec<SocketAddr> {
    pods.iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none() && is_ready(pod))
        .filter_map(|pod| pod.status.as_ref()?.pod_ip.as_deref()?.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, MULTIPLEXER_ADMIN))
        .collect()
}

/// The last reports each pool's sidecars gave, asked in the background: a reconcile never waits
/// for sidecars (a spec edit reaches the shares in status at once, whatever the pods answer),
/// and reads what the previous ask brought, at most one refresh old.
#[derive(Default)]
pub struct Reports {
    latest: Mutex<HashMap<String, Vec<SidecarAdmission>>>,
    asking: Mutex<HashSet<String>>,
    /// Per namespace, what its activator pods last said.
    activators: Mutex<HashMap<String, Vec<ActivatorReport>>>,
}

impl Reports {
    /// What `pool`'s sidecars last said; starts a new ask of `pods` unless one is under way.
    pub fn latest(self: &Arc<Self>, pool: &str, pods: &[Pod]) -> Vec<SidecarAdmission> {
        let latest = lock(&self.latest).get(pool).cloned().unwrap_or_default();
        if lock(&self.asking).insert(pool.to_owned()) {
            let (reports, pool, addresses) = (self.clone(), pool.to_owned(), addresses(pods));
            tokio::spawn(async move {
                let answers = ask_all(&addresses, ADMISSION_PATH).await;
                lock(&reports.latest).insert(pool.clone(), answers);
                lock(&reports.asking).remove(&pool);
            });
        }
        latest
    }

    /// What the activator pods of `namespace` (`pods`) last said about `pool`'s calls, all pods
    /// together; starts a new ask unless one is under way.
    pub fn held_calls(self: &Arc<Self>, namespace: &str, pool: &str, pods: &[Pod]) -> Option<HeldCalls> {
        let latest = lock(&self.activators).get(namespace).cloned().unwrap_or_default();
        // Beside the pools' "namespace/pool" keys; no pool name holds a space.
        let key = format!("{namespace}/ activators");
        if lock(&self.asking).insert(key.clone()) {
            let (reports, namespace, addresses) = (self.clone(), namespace.to_owned(), addresses(pods));
            tokio::spawn(async move {
                let answers = ask_all(&addresses, ACTIVATIONS_PATH).await;
                lock(&reports.activators).insert(namespace, answers);
                lock(&reports.asking).remove(&key);
            });
        }
        let mine = latest.iter().flat_map(|report| report.pools.iter()).filter(|held| held.pool == pool);
        mine.fold(None, |sum: Option<HeldCalls>, held| {
            Some(match sum {
                None => held.clone(),
                Some(sum) => HeldCalls {
                    pool: sum.pool,
                    held: sum.held.saturating_add(held.held),
                    idle_seconds: sum.idle_seconds.min(held.idle_seconds),
                },
            })
        })
    }

    /// Forgets a deleted pool's reports.
    pub fn forget(&self, pool: &str) {
        lock(&self.latest).remove(pool);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Asks every admin address at once for its report on `path`; returns the answers that came, in
/// no particular order.
pub async fn ask_all<T: DeserializeOwned>(addresses: &[SocketAddr], path: &str) -> Vec<T> {
    if addresses.is_empty() {
        return Vec::new();
    }
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let asks = addresses.iter().map(|address| ask(&client, *address, path));
    futures::future::join_all(asks).await.into_iter().flatten().collect()
}

async fn ask<T: DeserializeOwned>(
    client: &Client<HttpConnector, Empty<Bytes>>,
    address: SocketAddr,
    path: &str,
) -> Option<T> {
    let uri = format!("http://{address}{path}").parse().ok()?;
    let exchange = async {
        let response = client.get(uri).await.map_err(|error| error.to_string())?;
        if !response.status().is_success() {
            return Err(format!("answered {}", response.status()));
        }
        let body = Limited::new(response.into_body(), MAX_REPORT_BYTES);
        let body = body.collect().await.map_err(|error| error.to_string())?.to_bytes();
        serde_json::from_slice::<T>(&body).map_err(|error| error.to_string())
    };
    let outcome = tokio::time::timeout(ANSWER_WITHIN, exchange)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {ANSWER_WITHIN:?}")));
    outcome.map_err(|reason| tracing::debug!(%address, path, %reason, "no report")).ok()
}

pub(crate) fn is_ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|status| status.conditions.as_ref());
    conditions.is_some_and(|conditions| conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A server answering every connection with `answer` (`None`: reads and never answers).
    async fn server(answer: Option<String>) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let answer = answer.clone();
                tokio::spawn(async move {
                    let mut request = [0u8; 1024];
                    let _ = stream.read(&mut request).await;
                    match answer {
                        Some(answer) => drop(stream.write_all(answer.as_bytes()).await),
                        None => tokio::time::sleep(Duration::from_secs(30)).await,
                    }
                });
            }
        });
        address
    }

    fn http(status: &str, body: &str) -> Option<String> {
        Some(format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        ))
    }

    #[tokio::test]
    async fn answers_are_collected_and_silence_or_errors_left_out_within_a_second() {
        let report = SidecarAdmission {
            pool: "bge".into(),
            effective_in_flight: 12,
            max_in_flight: 32,
            adaptive: true,
            in_flight: 3,
            queued: 0,
            standing_queue: false,
            refused_per_second: 0.5,
            spilled_per_second: 0.0,
            idle_seconds: None,
            tls: None,
        };
        let good = server(http("200 OK", &serde_json::to_string(&report).unwrap())).await;
        let unknown = server(http("503 Service Unavailable", "pool configuration not known yet")).await;
        let garbled = server(http("200 OK", "{\"effectiveInFlight\": \"many\"}")).await;
        let padded = format!("{}{}", serde_json::to_string(&report).unwrap(), " ".repeat(MAX_REPORT_BYTES));
        let oversized = server(http("200 OK", &padded)).await;
        let silent = server(None).await;
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        let started = tokio::time::Instant::now();
        let reports =
            ask_all::<SidecarAdmission>(&[good, unknown, garbled, oversized, silent, closed], ADMISSION_PATH).await;
        assert_eq!(reports, vec![report]);
        assert!(started.elapsed() < Duration::from_secs(3), "asked at once, each within a second");
        assert!(ask_all::<SidecarAdmission>(&[], ADMISSION_PATH).await.is_empty());
    }
}
