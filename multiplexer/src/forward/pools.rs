//! The pools this multiplexer can route to, each with its own admission state and upstream.
//!
//! Sources (a config file, or EmbeddingPools watched in Kubernetes) push complete descriptions
//! with [`PoolTable::sync`]; requests look pools up with [`PoolTable::resolve`]. A pool that stays
//! keeps its admission state across updates, so limit changes never drop queued or in-flight work.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use crate::activator::Activations;
use crate::admission::memory::MemoryBudget;
use crate::admission::{Admission, Limits};
use crate::cache::{Cache, CacheSettings, CallCache};
use crate::error::{Error, Result};
use crate::forward::backend_batch;
use crate::forward::coalesce::Coalescer;
use crate::forward::siblings::Siblings;
use crate::forward::upstream::{Dialer, Upstream};
use crate::gate::auth::Gate;
use crate::gate::door::Door;
use crate::gate::request_meta::Target;
use crate::report::metrics::Metrics;
use crate::vocab::SetupError;
use crate::vocab::rpc::Rpc;

/// What a source knows about one pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolSpec {
    pub name: String,
    /// The model the pool serves, for `x-teifleet-model` routing.
    pub model: Option<String>,
    pub upstream: String,
    /// `None` until the pool's budget is known: requests get UNAVAILABLE meanwhile.
    pub limits: Option<Limits>,
    /// The upstream is another pool's multiplexer: requests carry the hop marker.
    pub remote: bool,
    /// Identical unary inference calls in flight share one upstream call.
    pub coalesce: bool,
    /// Tenant weights; tenants not listed weigh 1.
    pub tenants: BTreeMap<String, u32>,
    /// The embedding cache (`crate::cache`); `None`: none.
    pub cache: Option<CacheSettings>,
}

pub struct Pool {
    pub spec: PoolSpec,
    pub admission: Admission,
    pub upstream: Upstream,
    /// Present when the spec asks for coalescing; kept across updates so calls in flight stay
    /// joinable.
    pub coalescer: Option<Arc<Coalescer>>,
    /// The other replicas of the own pool, where its calls spill when its budget here is full;
    /// `None` for every other pool.
    pub siblings: Option<Arc<Siblings>>,
    /// Where its gRPC calls wait beyond what it can serve or queue; kept across updates.
    pub door: Arc<Door>,
    /// Its embedding cache, kept across updates that do not change it.
    pub cache: Option<Arc<Cache>>,
}

impl Pool {
    /// The cache as one call of `rpc` by `tenant` uses it, if the pool has one that keeps its
    /// answers. The tenant is named in the metrics only when the pool configures it.
    pub fn cache_for(&self, rpc: &Rpc, tenant: Option<&str>) -> Option<CallCache> {
        // Every unary call asks: a pool without a cache answers before any tenant lookup.
        let cache = self.cache.as_ref()?;
        let label = tenant.filter(|t| self.spec.tenants.contains_key(*t)).unwrap_or("");
        cache.for_call(rpc, tenant, label)
    }
}

pub struct PoolTable {
    own: String,
    metrics: Metrics,
    pools: RwLock<BTreeMap<String, Arc<Pool>>>,
    siblings: Arc<Siblings>,
    dialer: Dialer,
    /// In the activator role, the pools whose calls are held until a replica is ready (their
    /// upstreams balance over those replicas); `None` in a sidecar.
    activations: Option<Arc<Activations>>,
    /// In the activator role, the key gates of the pools with `spec.auth`: a call is checked
    /// before it is held, so a caller without a key neither waits here nor wakes a pool up.
    keys: RwLock<BTreeMap<String, Arc<Gate>>>,
    /// A source has described the pools at least once.
    synced: std::sync::atomic::AtomicBool,
    /// Calls that came in TLS may be routed to pools served in plain text (`spec.tls.allowPlaintextRoutes`).
    plaintext_routes: std::sync::atomic::AtomicBool,
    /// New pools served by a TEI of their own learn its batch, so a tight static limit keeps
    /// TEI's next batch ready (`--next-batch`; `crate::admission` `next_batch`).
    next_batch: bool,
    /// What pools' caches are charged to: the process's memory budget.
    memory: RwLock<Arc<MemoryBudget>>,
}

/// Pool names an error message names at most.
pub const NAMED_IN_ERRORS: usize = 8;
/// Bytes of one name an error message repeats: a pool's name is a DNS label (63 at most); a name
/// a caller asked for may be as long as its headers.
const NAME_IN_ERRORS: usize = 63;

/// `name`, cut to [`NAME_IN_ERRORS`] bytes at a character boundary.
fn clipped(name: &str) -> &str {
    let mut end = name.len().min(NAME_IN_ERRORS);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

impl PoolTable {
    pub fn new(own: &str, metrics: Metrics) -> Self {
        Self::with_dialer(own, metrics, Dialer::default())
    }

    /// A table whose `https://` upstreams (and siblings) are reached through `dialer`.
    pub fn with_dialer(own: &str, metrics: Metrics, dialer: Dialer) -> Self {
        let siblings = Arc::new(Siblings::new(dialer.clone()));
        let synced = false.into();
        let (pools, keys, plaintext_routes) = (RwLock::default(), RwLock::default(), false.into());
        let own = own.to_owned();
        let (next_batch, memory) = (false, RwLock::new(MemoryBudget::unbounded()));
        Self {
            own,
            metrics,
            pools,
            siblings,
            dialer,
            activations: None,
            keys,
            synced,
            plaintext_routes,
            next_batch,
            memory,
        }
    }

    /// Charges pools' caches to the process's memory budget (a table built here has an
    /// unbounded one until the server starts with its own). Caches made before are made again
    /// against it: this happens as the server starts, before any call.
    pub fn set_memory(&self, memory: Arc<MemoryBudget>) -> Result<(), SetupError> {
        *self.memory.write().unwrap_or_else(|p| p.into_inner()) = memory;
        let mut pools = self.pools.write().unwrap_or_else(|p| p.into_inner());
        for pool in pools.values_mut() {
            if pool.cache.is_some() {
                let cache = self.cache_for(&pool.spec, None, &pool.upstream)?;
                let Pool { spec, admission, upstream, coalescer, siblings, door, .. } = &**pool;
                let (spec, admission, upstream, coalescer) =
                    (spec.clone(), admission.clone(), upstream.clone(), coalescer.clone());
                let (siblings, door) = (siblings.clone(), door.clone());
                *pool = Arc::new(Pool { spec, admission, upstream, coalescer, siblings, door, cache });
            }
        }
        Ok(())
    }

    /// Whether new pools learn TEI's batch and keep its next one ready, before the first
    /// [`Self::sync`]. Off in a table built here (tests count every call TEI gets); the binary
    /// turns it on unless `--next-batch-ready false`.
    pub fn with_next_batch(self, keep_ready: bool) -> Self {
        Self { next_batch: keep_ready, ..self }
    }

    /// The activator's table: no own pool; every pool's upstream is the balancer `activations`
    /// keeps over its ready replicas.
    pub fn activator(metrics: Metrics, activations: Arc<Activations>) -> Self {
        Self { activations: Some(activations), ..Self::with_dialer("", metrics, Dialer::default()) }
    }

    /// The pools whose calls wait for a ready replica (the activator role).
    pub fn activations(&self) -> Option<&Arc<Activations>> {
        self.activations.as_ref()
    }

    /// Whether a source has described the pools yet.
    pub fn synced(&self) -> bool {
        self.synced.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn own_name(&self) -> &str {
        &self.own
    }

    /// The own pool's other replicas; their source (EndpointSlices, or flags) keeps them current.
    pub fn siblings(&self) -> &Arc<Siblings> {
        &self.siblings
    }

    fn siblings_of(&self, spec: &PoolSpec) -> Option<Arc<Siblings>> {
        (spec.name == self.own && !spec.remote).then(|| self.siblings.clone())
    }

    /// Makes the table match `specs`: new pools appear, changed ones update in place, missing
    /// ones go (requests already holding them finish normally).
    pub fn sync(&self, specs: Vec<PoolSpec>) -> Result<(), SetupError> {
        let mut pools = self.pools.write().unwrap_or_else(|p| p.into_inner());
        let mut next = BTreeMap::new();
        for spec in specs {
            let pool = match pools.remove(&spec.name) {
                Some(existing) if existing.spec == spec => existing,
                Some(existing) if existing.upstream.url() == spec.upstream => {
                    if let Some(limits) = spec.limits {
                        existing.admission.set_limits(limits);
                    }
                    existing.admission.set_tenant_weights(spec.tenants.clone());
                    let coalescer = coalescer_for(&spec, Some(&existing));
                    let (admission, upstream) = (existing.admission.clone(), existing.upstream.clone());
                    let siblings = self.siblings_of(&spec);
                    let door = existing.door.clone();
                    let cache = self.cache_for(&spec, Some(&existing), &upstream)?;
                    Arc::new(Pool { admission, upstream, coalescer, siblings, door, spec, cache })
                }
                existing => {
                    let upstream = match self.activations.as_ref().and_then(|a| a.channel(&spec.name)) {
                        Some(balanced) => Upstream::from_channel(&spec.upstream, balanced),
                        None => Upstream::lazy(&spec.upstream, &self.dialer)?,
                    };
                    let admission = match &existing {
                        Some(existing) => existing.admission.clone(),
                        None => self.metrics.admission_for(&spec.name, spec.limits.unwrap_or(NOT_READY)),
                    };
                    if let Some(limits) = spec.limits {
                        admission.set_limits(limits);
                    }
                    admission.set_tenant_weights(spec.tenants.clone());
                    // A TEI of its own: not a sibling's or another pool's multiplexer, nor the
                    // activator's balancer over replicas that learn their own.
                    if self.next_batch && self.tei_of_its_own(&spec) {
                        backend_batch::learn(admission.clone(), upstream.channel(), spec.name.clone());
                    }
                    let cache = self.cache_for(&spec, existing.as_deref(), &upstream)?;
                    let coalescer = coalescer_for(&spec, existing.as_deref());
                    let siblings = self.siblings_of(&spec);
                    let door = match &existing {
                        Some(existing) => existing.door.clone(),
                        None => Door::new(self.metrics.held_at_door()),
                    };
                    Arc::new(Pool { spec, admission, upstream, coalescer, siblings, door, cache })
                }
            };
            next.insert(pool.spec.name.clone(), pool);
        }
        for gone in pools.keys() {
            tracing::info!(pool = %gone, "pool removed");
        }
        *pools = next;
        self.synced.store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// A pool served by a TEI of its own: not a sibling's or another pool's multiplexer, nor the
    /// activator's balancer over replicas that learn their own.
    fn tei_of_its_own(&self, spec: &PoolSpec) -> bool {
        !spec.remote && self.activations.is_none()
    }

    /// The pool's cache: the one it had while its settings stay, a new one (which learns TEI's
    /// model) when they change. Only a pool served by a TEI of its own keeps one: a call routed on
    /// is cached, if at all, by the pool that serves it.
    fn cache_for(
        &self,
        spec: &PoolSpec,
        existing: Option<&Pool>,
        upstream: &Upstream,
    ) -> Result<Option<Arc<Cache>>, SetupError> {
        let Some(settings) = spec.cache.clone().filter(|_| self.tei_of_its_own(spec)) else { return Ok(None) };
        if let Some(cache) = existing.and_then(|pool| pool.cache.clone())
            && *cache.settings() == settings
        {
            return Ok(Some(cache));
        }
        let memory = self.memory.read().unwrap_or_else(|p| p.into_inner()).clone();
        let cache = Cache::new(&spec.name, settings, &memory, self.siblings.peer_key().clone(), &self.metrics)?;
        backend_batch::learn_model(cache.clone(), upstream.channel(), spec.name.clone());
        Ok(Some(cache))
    }

    /// The pools' names for an error message, the first [`NAMED_IN_ERRORS`] of them and how many
    /// more: a refusal costs the same however many pools the namespace has, and does not hand
    /// any caller the whole list.
    pub fn known(&self) -> String {
        let pools = self.pools.read().unwrap_or_else(|p| p.into_inner());
        let names: Vec<&str> = pools.keys().take(NAMED_IN_ERRORS).map(|name| clipped(name)).collect();
        match pools.len().saturating_sub(names.len()) {
            _ if names.is_empty() => "none".to_owned(),
            0 => names.join(", "),
            more => format!("{} and {more} more", names.join(", ")),
        }
    }

    /// Lets calls that came in TLS be routed to pools served in plain text (`true`), or refuses
    /// them ([`Error::PlaintextRoute`], the default).
    pub fn allow_plaintext_routes(&self, allowed: bool) {
        let was = self.plaintext_routes.swap(allowed, std::sync::atomic::Ordering::Relaxed);
        if was != allowed {
            tracing::info!(allowed, "routes from TLS to pools in plain text");
        }
    }

    /// Puts `gate` (or, with `None`, no key check) in force for `pool`'s calls held here.
    pub fn set_keys(&self, pool: &str, gate: Option<Arc<Gate>>) {
        let mut keys = self.keys.write().unwrap_or_else(|p| p.into_inner());
        match gate {
            Some(gate) => keys.insert(pool.to_owned(), gate),
            None => keys.remove(pool),
        };
    }

    /// The key gate `pool`'s calls pass before they are held here, if it has keys.
    pub fn keys_of(&self, pool: &str) -> Option<Arc<Gate>> {
        self.activations.as_ref()?;
        self.keys.read().unwrap_or_else(|p| p.into_inner()).get(pool).cloned()
    }

    /// Whether a call this sidecar took would leave it in clear text for `upstream` when it had
    /// come encrypted. The activator's upstreams are its balancers (their pools' own TLS).
    fn refuses_in_plain_text(&self, upstream: &str) -> bool {
        self.activations.is_none()
            && upstream.starts_with("http://")
            && self.dialer.serves_tls()
            && !self.plaintext_routes.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn get(&self, name: &str) -> Option<Arc<Pool>> {
        self.pools.read().unwrap_or_else(|p| p.into_inner()).get(name).cloned()
    }

    /// Picks the pool for a request. A request some multiplexer already forwarded may only be
    /// served by a pool whose upstream is its own TEI, never forwarded again. A request that came
    /// in TLS (this sidecar's ports serve it) is not routed to another pool's sidecar in plain
    /// text unless the table allows it. At the activator (no own pool) a request that names none
    /// is not found: no pool's status will make it one. By model, the own pool comes first, then
    /// the others serving the model by name; the first that may take the call is picked, and when
    /// none may, the first one's reason is the answer.
    pub fn resolve(&self, target: &Target, forwarded_by: Option<&str>) -> Result<Arc<Pool>> {
        let pool = match target {
            Target::Own if self.activations.is_some() => return Err(Error::NoPoolNamed),
            Target::Own => self.get(&self.own).ok_or_else(|| Error::PoolNotReady(self.own.clone()))?,
            Target::Pool(name) => {
                let unknown = || Error::UnknownPool { requested: clipped(name).to_owned(), known: self.known() };
                self.get(name).ok_or_else(unknown)?
            }
            Target::Model(model) => return self.resolve_model(model, forwarded_by),
        };
        self.may_take(pool, forwarded_by)
    }

    fn resolve_model(&self, model: &str, forwarded_by: Option<&str>) -> Result<Arc<Pool>> {
        let serving = |p: &&Arc<Pool>| p.spec.model.as_deref() == Some(model);
        let candidates: Vec<Arc<Pool>> = {
            let pools = self.pools.read().unwrap_or_else(|p| p.into_inner());
            // Our own pool first when it serves the model: no extra hop.
            let own = pools.get(&self.own).filter(serving).cloned();
            let others = pools.values().filter(serving).filter(|p| p.spec.name != self.own).cloned();
            own.into_iter().chain(others).collect()
        };
        let mut refused = None;
        for pool in candidates {
            match self.may_take(pool, forwarded_by) {
                Ok(pool) => return Ok(pool),
                Err(error) => {
                    refused.get_or_insert(error);
                }
            }
        }
        Err(refused.unwrap_or_else(|| Error::UnknownModel { model: clipped(model).to_owned(), known: self.known() }))
    }

    /// `pool` if it may take a call that `forwarded_by` forwarded (or none did) here.
    fn may_take(&self, pool: Arc<Pool>, forwarded_by: Option<&str>) -> Result<Arc<Pool>> {
        if pool.spec.limits.is_none() {
            return Err(Error::PoolNotReady(pool.spec.name.clone()));
        }
        if let Some(by) = forwarded_by
            && pool.spec.remote
        {
            return Err(Error::ForwardingLoop { by: by.to_owned() });
        }
        if pool.spec.remote && self.refuses_in_plain_text(&pool.spec.upstream) {
            tracing::debug!(pool = %pool.spec.name, upstream = %pool.spec.upstream, "a call that came in TLS refused a route in plain text");
            return Err(Error::PlaintextRoute { pool: pool.spec.name.clone() });
        }
        Ok(pool)
    }
}

fn coalescer_for(spec: &PoolSpec, existing: Option<&Pool>) -> Option<Arc<Coalescer>> {
    // Only after the pool's own gate: a remote pool's sidecar checks the caller's key there.
    (spec.coalesce && !spec.remote).then(|| existing.and_then(|pool| pool.coalescer.clone()).unwrap_or_default())
}

/// Limits of a pool whose budget is not known yet; [`PoolTable::resolve`] refuses such pools.
const NOT_READY: Limits = Limits {
    max_in_flight: 0,
    max_queued: 0,
    queue_timeout: std::time::Duration::ZERO,
    max_in_flight_tokens: None,
    adaptive: false,
    ingest_share: 0,
    query_reserve: None,
    device_time_cap: None,
    gpu_share: None,
};

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn spec(name: &str, model: &str, remote: bool, in_flight: usize) -> PoolSpec {
        PoolSpec {
            name: name.into(),
            model: Some(model.into()),
            upstream: format!("http://{name}.ml.svc:50051"),
            limits: Some(Limits::new(in_flight, 4, Duration::from_secs(1))),
            remote,
            coalesce: false,
            cache: None,
            tenants: BTreeMap::new(),
        }
    }

    fn table() -> PoolTable {
        let table = PoolTable::new("bge", Metrics::new());
        table.sync(vec![spec("bge", "BAAI/bge", false, 2), spec("gte", "thenlper/gte", true, 3)]).unwrap();
        table
    }

    #[tokio::test]
    async fn routes_by_pool_model_or_default() {
        let table = table();
        assert_eq!(table.resolve(&Target::Own, None).unwrap().spec.name, "bge");
        assert_eq!(table.resolve(&Target::Pool("gte".into()), None).unwrap().spec.name, "gte");
        assert_eq!(table.resolve(&Target::Model("thenlper/gte".into()), None).unwrap().spec.name, "gte");
        let error = table.resolve(&Target::Pool("nope".into()), None).err().unwrap();
        assert!(error.to_string().contains("known pools: bge, gte"), "{error}");
        assert!(matches!(table.resolve(&Target::Model("x".into()), None), Err(Error::UnknownModel { .. })));
    }

    #[tokio::test]
    async fn a_refusal_names_a_few_pools_however_many_there_are() {
        let table = PoolTable::new("pool-0000", Metrics::new());
        let name = |i: usize| format!("pool-{i:04}-{}", "x".repeat(40));
        table.sync((0..1000).map(|i| spec(&name(i), "BAAI/bge", false, 1)).collect()).unwrap();
        let asked = "é".repeat(10_000);
        let error = table.resolve(&Target::Pool(asked), None).err().unwrap().to_string();
        assert!(error.ends_with(&format!("and {} more", 1000 - NAMED_IN_ERRORS)), "{error}");
        assert!(error.contains(&name(0)) && !error.contains(&name(NAMED_IN_ERRORS)), "{error}");
        assert!(error.len() < 1024, "{} bytes: {error}", error.len());
    }

    #[tokio::test]
    async fn a_forwarded_request_is_never_forwarded_again() {
        let table = table();
        assert!(table.resolve(&Target::Own, Some("bge-0")).is_ok(), "served locally");
        let error = table.resolve(&Target::Pool("gte".into()), Some("bge-0")).err().unwrap();
        assert!(matches!(error, Error::ForwardingLoop { .. }));
    }

    #[tokio::test]
    async fn a_tls_sidecar_routes_to_a_pool_in_plain_text_only_when_allowed() {
        let tls = Arc::new(teifleet_runtime::tls::ServerTls::waiting());
        let table = PoolTable::with_dialer("bge", Metrics::new(), Dialer::new(tls.clone()));
        let secure = PoolSpec { upstream: "https://e5.ml.svc:50051".into(), ..spec("e5", "intfloat/e5", true, 1) };
        table.sync(vec![spec("bge", "BAAI/bge", false, 2), spec("gte", "thenlper/gte", true, 3), secure]).unwrap();
        let refused = table.resolve(&Target::Model("thenlper/gte".into()), None).err().unwrap();
        assert!(matches!(&refused, Error::PlaintextRoute { pool } if pool == "gte"), "{refused}");
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
        let told = refused.for_client().to_string();
        assert!(told.contains("pool gte") && !told.contains("svc") && !told.contains("http"), "{told}");
        assert!(table.resolve(&Target::Own, None).is_ok(), "the own TEI, over loopback");
        assert!(table.resolve(&Target::Pool("e5".into()), None).is_ok(), "TLS to TLS");
        table.allow_plaintext_routes(true);
        assert!(table.resolve(&Target::Pool("gte".into()), None).is_ok(), "allowed");
        table.allow_plaintext_routes(false);
        tls.turn_off();
        assert!(table.resolve(&Target::Pool("gte".into()), None).is_ok(), "plain text to plain text");
    }

    #[tokio::test]
    async fn by_model_the_first_pool_that_may_take_the_call_is_picked() {
        let tls = Arc::new(teifleet_runtime::tls::ServerTls::waiting());
        let table = PoolTable::with_dialer("bge", Metrics::new(), Dialer::new(tls.clone()));
        // Two pools serve gte: "a-gte" in plain text (first by name), "b-gte" in TLS.
        let plain = spec("a-gte", "thenlper/gte", true, 3);
        let secure =
            PoolSpec { upstream: "https://b-gte.ml.svc:50051".into(), ..spec("b-gte", "thenlper/gte", true, 1) };
        let not_ready = PoolSpec { limits: None, ..spec("a-e5", "intfloat/e5", true, 1) };
        let ready = PoolSpec { upstream: "https://b-e5.ml.svc:50051".into(), ..spec("b-e5", "intfloat/e5", true, 1) };
        table.sync(vec![spec("bge", "BAAI/bge", false, 2), plain, secure, not_ready, ready]).unwrap();
        let picked = table.resolve(&Target::Model("thenlper/gte".into()), None).unwrap();
        assert_eq!(picked.spec.name, "b-gte", "the TLS pool, not the plain-text one first by name");
        let picked = table.resolve(&Target::Model("intfloat/e5".into()), None).unwrap();
        assert_eq!(picked.spec.name, "b-e5", "the ready pool, not the one without limits");
        tls.turn_off();
        let picked = table.resolve(&Target::Model("thenlper/gte".into()), None).unwrap();
        assert_eq!(picked.spec.name, "a-gte", "without TLS the first by name");
        let refused = table.resolve(&Target::Model("thenlper/gte".into()), Some("bge-0")).err().unwrap();
        assert!(matches!(&refused, Error::ForwardingLoop { .. }), "none may: the first one's reason: {refused}");
    }

    #[tokio::test]
    async fn updates_keep_admission_state_and_apply_new_limits() {
        let table = table();
        let before = table.get("bge").unwrap();
        let permit = before.admission.acquire(crate::admission::Ask::new(Default::default())).await.unwrap();
        table.sync(vec![spec("bge", "BAAI/bge", false, 7)]).unwrap();
        let after = table.get("bge").unwrap();
        assert_eq!(after.admission.snapshot().in_flight, 1, "in-flight work carried over");
        assert_eq!(after.admission.snapshot().limits.max_in_flight, 7);
        assert!(table.get("gte").is_none(), "removed pools are gone");
        drop(permit);
        assert_eq!(after.admission.snapshot().in_flight, 0);
    }

    #[tokio::test]
    async fn a_pool_without_limits_is_not_ready() {
        let table = PoolTable::new("bge", Metrics::new());
        table.sync(vec![PoolSpec { limits: None, ..spec("bge", "m", false, 1) }]).unwrap();
        assert!(matches!(table.resolve(&Target::Own, None), Err(Error::PoolNotReady(_))));
    }

    #[tokio::test]
    async fn at_the_activator_a_call_naming_no_pool_is_not_found_and_a_named_pool_not_ready_is_unavailable() {
        let activations = Arc::new(Activations::default());
        activations.sync(&[("bge".into(), Duration::from_secs(10))]);
        let table = PoolTable::activator(Metrics::new(), activations);
        let bge = PoolSpec { upstream: "activated://bge".into(), limits: None, ..spec("bge", "m", true, 1) };
        table.sync(vec![bge]).unwrap();
        let unnamed = table.resolve(&Target::Own, None).err().unwrap();
        assert!(matches!(unnamed, Error::NoPoolNamed), "{unnamed}");
        assert_eq!(unnamed.code(), tonic::Code::NotFound, "no retry makes it a pool's");
        let waiting = table.resolve(&Target::Pool("bge".into()), None).err().unwrap();
        assert!(matches!(waiting, Error::PoolNotReady(_)), "{waiting}");
        assert_eq!(waiting.code(), tonic::Code::Unavailable, "its status is on its way");
    }
}
