//! What the pool's sidecars say about their admission, asked on their admin ports: what is in
//! flight and queued and what they refused or spilled (`status.demand`), and, for an adaptive
//! pool, the in-flight limit each found for itself (`status.admission.effective`). Best effort: a
//! sidecar that does not answer within a second is left out of the count, and a reconcile never
//! waits longer than that.
//!
//! Only pods the pool's own Deployment runs are asked (a pod's controller is one of its
//! ReplicaSets, whose controller is the Deployment, matched by uid): anyone who may create pods in
//! the namespace can give one a pool's labels, but not make the pool's ReplicaSet own it. And what
//! even a trusted pod says is bounded before it is summed into status or fed to the autoscaler
//! ([`Bounded`]): a sidecar's admin port is reachable by every pod of its namespace.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde::de::DeserializeOwned;
use teifleet_crds::{ActivatorReport, CertificateSummary, HeldCalls, SidecarAdmission, SidecarTls};
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

/// The most any count in a report may say (inputs in flight, queued, a limit, held calls): far
/// above what one replica can do, low enough that summing a thousand replicas stays in an `i32`.
pub const MAX_REPORTED_COUNT: u32 = 1_000_000;
/// The most a reported rate (calls per second) may say.
pub const MAX_REPORTED_RATE: f64 = 1_000_000.0;
/// The most a reported idle time may say: a year, in seconds.
pub const MAX_REPORTED_IDLE_SECONDS: f64 = 365.0 * 24.0 * 3600.0;
/// The most characters a reported string keeps (a pool name, a certificate's subject, an error).
pub const MAX_REPORTED_CHARS: usize = 256;
/// The most pools one activator report may list.
pub const MAX_REPORTED_POOLS: usize = 1024;

/// A report as the operator uses it: every number within its sane range, every string cut short.
pub trait Bounded {
    fn bounded(self) -> Self;
}

fn count(value: u32) -> u32 {
    value.min(MAX_REPORTED_COUNT)
}

/// `value` within `0..=max`; NaN (which JSON cannot carry, but a future format might) is 0.
fn within(value: f64, max: f64) -> f64 {
    if value.is_nan() { 0.0 } else { value.clamp(0.0, max) }
}

fn text(mut value: String) -> String {
    if let Some((cut, _)) = value.char_indices().nth(MAX_REPORTED_CHARS) {
        value.truncate(cut);
    }
    value
}

impl Bounded for SidecarAdmission {
    fn bounded(self) -> Self {
        let tls = self.tls.map(|tls| SidecarTls {
            serving: tls.serving.map(|cert| CertificateSummary {
                serial: text(cert.serial),
                subject: text(cert.subject),
                not_after: text(cert.not_after),
            }),
            client_auth: tls.client_auth,
            error: tls.error.map(text),
            expired: tls.expired,
        });
        Self {
            pool: text(self.pool),
            effective_in_flight: count(self.effective_in_flight),
            max_in_flight: count(self.max_in_flight),
            adaptive: self.adaptive,
            in_flight: count(self.in_flight),
            queued: count(self.queued),
            standing_queue: self.standing_queue,
            refused_per_second: within(self.refused_per_second, MAX_REPORTED_RATE),
            spilled_per_second: within(self.spilled_per_second, MAX_REPORTED_RATE),
            idle_seconds: self.idle_seconds.map(|idle| within(idle, MAX_REPORTED_IDLE_SECONDS)),
            tls,
        }
    }
}

impl Bounded for ActivatorReport {
    fn bounded(self) -> Self {
        let pools = self.pools.into_iter().take(MAX_REPORTED_POOLS);
        Self {
            pools: pools
                .map(|held| HeldCalls {
                    pool: text(held.pool),
                    held: count(held.held),
                    idle_seconds: within(held.idle_seconds, MAX_REPORTED_IDLE_SECONDS),
                })
                .collect(),
        }
    }
}

fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references.as_ref()?.iter().find(|owner| owner.controller == Some(true))
}

/// The pods among `pods` that the Deployment of uid `deployment` runs: each one's controller is a
/// ReplicaSet among `replica_sets` (by uid) whose controller is that Deployment (by uid). Names and
/// labels are not enough: anyone who may create pods in the namespace can copy them.
pub fn run_by(pods: &[Pod], replica_sets: &[ReplicaSet], deployment: &str) -> Vec<Pod> {
    let ours: HashSet<&str> = replica_sets
        .iter()
        .filter(|set| {
            controller_of(&set.metadata).is_some_and(|owner| owner.kind == "Deployment" && owner.uid == deployment)
        })
        .filter_map(|set| set.metadata.uid.as_deref())
        .collect();
    pods.iter()
        .filter(|pod| {
            controller_of(&pod.metadata)
                .is_some_and(|owner| owner.kind == "ReplicaSet" && ours.contains(owner.uid.as_str()))
        })
        .cloned()
        .collect()
}

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
    /// Per namespace, how many activator pods were last asked, and what those that answered said.
    activators: Mutex<HashMap<String, (usize, Vec<ActivatorReport>)>>,
}

impl Reports {
    /// What `pool`'s sidecars last said (see [`Reports::ask`]).
    pub fn latest(&self, pool: &str) -> Vec<SidecarAdmission> {
        lock(&self.latest).get(pool).cloned().unwrap_or_default()
    }

    /// Starts a new ask of `pods`, the pool's own (see [`run_by`]), unless one is under way.
    pub fn ask(self: &Arc<Self>, pool: &str, pods: &[Pod]) {
        if lock(&self.asking).insert(pool.to_owned()) {
            let (reports, pool, addresses) = (self.clone(), pool.to_owned(), addresses(pods));
            tokio::spawn(async move {
                let answers = ask_all(&addresses, ADMISSION_PATH).await;
                lock(&reports.latest).insert(pool.clone(), answers);
                lock(&reports.asking).remove(&pool);
            });
        }
    }

    /// What the activator pods of `namespace` last said about `pool`'s calls, all pods together
    /// (see [`Reports::ask_activators`] and [`held_over`]).
    pub fn held_calls(&self, namespace: &str, pool: &str) -> Option<HeldCalls> {
        let (asked, answers) = lock(&self.activators).get(namespace).cloned().unwrap_or_default();
        held_over(&answers, asked, pool)
    }

    /// Starts a new ask of the activator pods of `namespace` (`pods`: those the activator's own
    /// Deployment runs, see [`run_by`]), unless one is under way.
    pub fn ask_activators(self: &Arc<Self>, namespace: &str, pods: &[Pod]) {
        // Beside the pools' "namespace/pool" keys; no pool name holds a space.
        let key = format!("{namespace}/ activators");
        if lock(&self.asking).insert(key.clone()) {
            let (reports, namespace, addresses) = (self.clone(), namespace.to_owned(), addresses(pods));
            tokio::spawn(async move {
                let answers = ask_all(&addresses, ACTIVATIONS_PATH).await;
                lock(&reports.activators).insert(namespace, (addresses.len(), answers));
                lock(&reports.asking).remove(&key);
            });
        }
    }

    /// Forgets a deleted pool's reports.
    pub fn forget(&self, pool: &str) {
        lock(&self.latest).remove(pool);
    }
}

/// `pool`'s calls at the activator from the `answers` of the `asked` activator pods: the calls
/// held at each, summed (a call is held at one pod), and the shortest time any has been without
/// one. When fewer pods than were asked report the pool (one did not answer, or does not know the
/// pool yet), the idle time is unknown, NaN: a pod's last call is never taken for long ago, so the
/// pool does not go to zero on the others' word (`autoscale`), and `lastCallTime` stays. `None`
/// when no pod reports the pool.
pub fn held_over(answers: &[ActivatorReport], asked: usize, pool: &str) -> Option<HeldCalls> {
    let mine: Vec<&HeldCalls> =
        answers.iter().flat_map(|report| report.pools.iter().filter(|held| held.pool == pool).take(1)).collect();
    let first = mine.first()?;
    let mut sum = HeldCalls { pool: first.pool.clone(), held: 0, idle_seconds: f64::INFINITY };
    for held in &mine {
        sum.held = sum.held.saturating_add(held.held);
        sum.idle_seconds = sum.idle_seconds.min(held.idle_seconds);
    }
    if mine.len() < asked {
        sum.idle_seconds = f64::NAN;
    }
    Some(sum)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Asks every admin address at once for its report on `path`; returns the answers that came, in
/// no particular order.
pub async fn ask_all<T: DeserializeOwned + Bounded>(addresses: &[SocketAddr], path: &str) -> Vec<T> {
    if addresses.is_empty() {
        return Vec::new();
    }
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let asks = addresses.iter().map(|address| ask(&client, *address, path));
    futures::future::join_all(asks).await.into_iter().flatten().map(Bounded::bounded).collect()
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

    fn owned(kind: &str, name: &str, uid: &str, controller: bool) -> serde_json::Value {
        serde_json::json!({ "apiVersion": "apps/v1", "kind": kind, "name": name, "uid": uid, "controller": controller })
    }

    fn pod(name: &str, owners: Vec<serde_json::Value>) -> Pod {
        serde_json::from_value(serde_json::json!({ "metadata": { "name": name, "ownerReferences": owners } })).unwrap()
    }

    fn replica_set(uid: &str, owners: Vec<serde_json::Value>) -> ReplicaSet {
        serde_json::from_value(
            serde_json::json!({ "metadata": { "name": uid, "uid": uid, "ownerReferences": owners } }),
        )
        .unwrap()
    }

    #[test]
    fn only_pods_of_the_pools_own_replica_sets_are_trusted() {
        let sets = [
            replica_set("rs-ours", vec![owned("Deployment", "bge", "dep-uid", true)]),
            replica_set("rs-old", vec![owned("Deployment", "bge", "dep-uid", true)]),
            // Same name, another Deployment (the pool's was deleted and made again, or an impostor).
            replica_set("rs-other", vec![owned("Deployment", "bge", "other-uid", true)]),
            // Owned by the Deployment, but not as its controller.
            replica_set("rs-adopted", vec![owned("Deployment", "bge", "dep-uid", false)]),
        ];
        let pods = [
            pod("ours", vec![owned("ReplicaSet", "bge-1", "rs-ours", true)]),
            pod("old", vec![owned("ReplicaSet", "bge-0", "rs-old", true)]),
            pod("bare", vec![]),
            pod("impostor", vec![owned("ReplicaSet", "bge-1", "rs-other", true)]),
            pod("not-controller", vec![owned("ReplicaSet", "bge-1", "rs-ours", false)]),
            pod("adopted", vec![owned("ReplicaSet", "bge-2", "rs-adopted", true)]),
            pod("named-like-ours", vec![owned("ReplicaSet", "bge-1", "made-up", true)]),
            pod("wrong-kind", vec![owned("StatefulSet", "bge", "rs-ours", true)]),
        ];
        let trusted: Vec<_> = run_by(&pods, &sets, "dep-uid").into_iter().filter_map(|p| p.metadata.name).collect();
        assert_eq!(trusted, ["ours", "old"]);
        assert!(run_by(&pods, &[], "dep-uid").is_empty(), "no ReplicaSet listed: nobody");
    }

    #[test]
    fn reported_numbers_are_clamped_and_strings_cut_short() {
        let long = "x".repeat(10_000);
        let report = SidecarAdmission {
            pool: long.clone(),
            effective_in_flight: u32::MAX,
            max_in_flight: u32::MAX,
            adaptive: true,
            in_flight: u32::MAX,
            queued: 7,
            standing_queue: false,
            refused_per_second: 1e300,
            spilled_per_second: -5.0,
            idle_seconds: Some(f64::NAN),
            tls: Some(SidecarTls {
                serving: Some(CertificateSummary {
                    serial: long.clone(),
                    subject: "é".repeat(1000),
                    not_after: "2030".into(),
                }),
                client_auth: true,
                error: Some(long.clone()),
                expired: true,
            }),
        }
        .bounded();
        assert_eq!(report.pool.len(), MAX_REPORTED_CHARS);
        assert_eq!(
            (report.effective_in_flight, report.max_in_flight, report.in_flight),
            (1_000_000, 1_000_000, 1_000_000)
        );
        assert_eq!(report.queued, 7, "sane numbers pass unchanged");
        assert_eq!((report.refused_per_second, report.spilled_per_second), (MAX_REPORTED_RATE, 0.0));
        assert_eq!(report.idle_seconds, Some(0.0));
        let tls = report.tls.unwrap();
        let serving = tls.serving.unwrap();
        assert_eq!(serving.serial.len(), MAX_REPORTED_CHARS);
        assert_eq!(serving.subject.chars().count(), MAX_REPORTED_CHARS, "cut on a character boundary");
        assert_eq!(serving.not_after, "2030");
        assert_eq!(tls.error.unwrap().len(), MAX_REPORTED_CHARS);

        let held = |pool: &str, held: u32, idle_seconds: f64| HeldCalls { pool: pool.into(), held, idle_seconds };
        let activator =
            ActivatorReport { pools: (0..5000).map(|_| held(&long, u32::MAX, f64::INFINITY)).collect() }.bounded();
        assert_eq!(activator.pools.len(), MAX_REPORTED_POOLS);
        assert_eq!(activator.pools[0], held(&long[..MAX_REPORTED_CHARS], 1_000_000, MAX_REPORTED_IDLE_SECONDS));
        let sane = ActivatorReport { pools: vec![held("bge", 3, 12.5)] };
        assert_eq!(sane.clone().bounded(), sane);
    }

    #[test]
    fn the_calls_held_are_summed_over_every_activator_pod_and_an_unheard_pods_idle_time_is_unknown() {
        let held = |pool: &str, held: u32, idle_seconds: f64| HeldCalls { pool: pool.into(), held, idle_seconds };
        let a = ActivatorReport { pools: vec![held("bge", 3, 40.0), held("gte", 0, 900.0)] };
        let b = ActivatorReport { pools: vec![held("bge", 4, 700.0), held("gte", 0, 5.0)] };
        let both = [a.clone(), b];
        assert_eq!(held_over(&both, 2, "bge"), Some(held("bge", 7, 40.0)), "summed; the latest call of any pod");
        assert_eq!(held_over(&both, 2, "gte"), Some(held("gte", 0, 5.0)));
        assert_eq!(held_over(&both, 2, "e5"), None, "no pod reports it");
        assert_eq!(held_over(&[], 0, "bge"), None, "no activator pod to ask");
        // Two pods asked, one answered: its calls count, but nobody knows the other's last call.
        let one = held_over(std::slice::from_ref(&a), 2, "bge").unwrap();
        assert_eq!(one.held, 3);
        assert!(one.idle_seconds.is_nan(), "{one:?}");
        // One pod that does not list the pool yet (it started a moment ago) is as unheard.
        let new_pod = ActivatorReport { pools: vec![] };
        assert!(held_over(&[a, new_pod], 2, "bge").unwrap().idle_seconds.is_nan());
    }

    #[tokio::test]
    async fn what_a_sidecar_answers_is_bounded_before_it_is_used() {
        let body = r#"{"pool":"bge","effectiveInFlight":4294967295,"maxInFlight":8,"adaptive":false,"inFlight":2,
                       "queued":0,"standingQueue":false,"refusedPerSecond":1e308}"#;
        let reports = ask_all::<SidecarAdmission>(&[server(http("200 OK", body)).await], ADMISSION_PATH).await;
        assert_eq!(reports[0].effective_in_flight, MAX_REPORTED_COUNT);
        assert_eq!(reports[0].refused_per_second, MAX_REPORTED_RATE);
    }
}
