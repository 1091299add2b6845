//! The embedding cache (docs/caching.md): each input of an embedding call looked up by its
//! content before it takes a permit; only the misses go to TEI, and what TEI answers them is
//! kept.
//!
//! Every front's embedding inputs meet here as what they become upstream: one `tei.v1.Embed` (or
//! `EmbedSparse`) message each, whether they came as a unary gRPC call, an HTTP or OpenAI batch,
//! an `EmbedStream` message or an Arrow row. The key is that message's bytes with what surrounds
//! it ([`key`]); a hit is the exact answer bytes TEI gave for the same key, so a hit is bit for
//! bit TEI's vector, and nothing a caller sends can be stored as an answer. Errors are never
//! kept. Until TEI's `Info` has said which model it serves, calls pass by the cache (`bypass`).
//!
//! Two tiers: this process's ([`local`], bounded in bytes, charged to the memory budget, W-TinyLFU)
//! and, when the pool names one, a Redis-protocol store its replicas share ([`store`], bounded in
//! time: never a dependency), whose entries are sealed with the pool's peer key ([`seal`]).
//! Imports `vocab`, `admission` (the memory budget), `gate` (the peer key) and `report`.

pub mod key;
pub mod local;
pub mod seal;
pub mod settings;
pub mod store;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use teifleet_proto::v1::InfoResponse;

use crate::admission::memory::MemoryBudget;
use crate::cache::key::{Key, Model, Scope};
use crate::cache::local::LocalTier;
pub use crate::cache::store::StoreSettings;
use crate::cache::store::StoreTier;
use crate::gate::peer::PeerKey;
use crate::report::cache::InputSeries;
use crate::report::metrics::Metrics;
use crate::vocab::SetupError;
use crate::vocab::framing::Framed;
use crate::vocab::rpc::Rpc;

/// The RPCs whose answers are kept: one input, one answer that depends on nothing but the
/// input, the options in its message and the model.
const CACHED: [&str; 2] = ["/tei.v1.Embed/Embed", "/tei.v1.Embed/EmbedSparse"];

/// What a pool's cache is, as its source describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheSettings {
    /// Bytes of the local tier; 0: none.
    pub size: u64,
    pub ttl: Duration,
    /// One set of entries for every tenant.
    pub shared_across_tenants: bool,
    /// What the pool's spec says of the model beyond what TEI's Info reports (the pooling asked
    /// for, the revision): part of every key.
    pub model_args: String,
    pub store: Option<StoreSettings>,
}

pub struct Cache {
    pool: String,
    settings: CacheSettings,
    model: OnceLock<Model>,
    local: Option<LocalTier>,
    store: Option<Arc<StoreTier>>,
    metrics: Metrics,
    /// The input series of calls of no configured tenant (most calls), resolved once.
    untenanted: InputSeries,
}

impl Cache {
    pub fn new(
        pool: &str,
        settings: CacheSettings,
        memory: &Arc<MemoryBudget>,
        peer_key: Arc<PeerKey>,
        metrics: &Metrics,
    ) -> Result<Arc<Self>, SetupError> {
        let families = metrics.cache();
        let local = match settings.size {
            0 => None,
            size => {
                let tier = LocalTier::new(size, settings.ttl, memory, families.local(pool));
                if tier.is_none() {
                    tracing::warn!(pool, size, "the memory budget has no room for the cache's local tier: none");
                }
                tier
            }
        };
        let store = match &settings.store {
            Some(store) => Some(Arc::new(StoreTier::new(store, settings.ttl, peer_key, families.store(pool))?)),
            None => None,
        };
        Ok(Arc::new(Self {
            pool: pool.to_owned(),
            settings,
            model: OnceLock::new(),
            local,
            store,
            metrics: metrics.clone(),
            untenanted: families.inputs(pool, ""),
        }))
    }

    pub fn settings(&self) -> &CacheSettings {
        &self.settings
    }

    /// Whether answers of `rpc` are kept.
    pub fn caches(rpc: &Rpc) -> bool {
        CACHED.contains(&rpc.path)
    }

    /// TEI said which model it serves: from now on calls use the cache.
    pub fn learn_model(&self, info: &InfoResponse) {
        let model = Model::of(info, &self.settings.model_args);
        if self.model.set(model).is_ok() {
            tracing::info!(pool = %self.pool, model = %info.model_id, "the cache knows TEI's model");
        }
    }

    /// The cache as one call of `rpc` uses it: `None` for an RPC whose answers are not kept. A
    /// call's `tenant` scopes its entries unless the pool shares them; `label` is the tenant as
    /// the metrics name it (a tenant the pool configures, or "").
    pub fn for_call(self: &Arc<Self>, rpc: &Rpc, tenant: Option<&str>, label: &str) -> Option<CallCache> {
        if !Self::caches(rpc) {
            return None;
        }
        let series = match label {
            "" => self.untenanted.clone(),
            label => self.metrics.cache().inputs(&self.pool, label),
        };
        let tenant = tenant.filter(|_| !self.settings.shared_across_tenants);
        let scope = self.model.get().map(|model| Scope::new(&self.pool, *model, rpc.path, tenant));
        Some(CallCache { cache: self.clone(), scope, series })
    }
}

/// The cache for one call: its scope, and the series its inputs are counted in.
pub struct CallCache {
    cache: Arc<Cache>,
    /// `None` while TEI's model is not known: every input passes by.
    scope: Option<Scope>,
    series: InputSeries,
}

/// What a call's inputs found: an answer for each hit, and the keys the misses' answers go under.
pub struct Looked {
    pub answers: Vec<Option<Framed>>,
    keys: Vec<Option<Key>>,
}

impl Looked {
    pub fn hits(&self) -> usize {
        self.answers.iter().filter(|a| a.is_some()).count()
    }
}

impl CallCache {
    /// Looks each of `messages` (the requests as sent upstream) up: the local tier first, then
    /// the shared store for what it did not have (at most its timeout).
    pub async fn look_up(&self, messages: &[&[u8]]) -> Looked {
        let Some(scope) = &self.scope else {
            self.series.bypass.inc_by(messages.len() as u64);
            return Looked { answers: vec![None; messages.len()], keys: vec![None; messages.len()] };
        };
        let keys: Vec<Key> = messages.iter().map(|message| scope.key(message)).collect();
        let mut answers: Vec<Option<Framed>> = match &self.cache.local {
            Some(local) => keys.iter().map(|key| local.get(key)).collect(),
            None => vec![None; keys.len()],
        };
        let local_hits = answers.iter().filter(|a| a.is_some()).count();
        self.series.hit_local.inc_by(local_hits as u64);
        if let Some(store) = &self.cache.store
            && local_hits < keys.len()
        {
            let missing: Vec<usize> = (0..keys.len()).filter(|&i| answers[i].is_none()).collect();
            let asked: Vec<Key> = missing.iter().map(|&i| keys[i]).collect();
            let found = store.get(&asked).await;
            for (i, answer) in missing.into_iter().zip(found) {
                if let Some(answer) = answer {
                    self.series.hit_store.inc();
                    // Kept here too: the next call for it needs no round trip.
                    if let Some(local) = &self.cache.local {
                        let _ = local.keep(keys[i], answer.clone());
                    }
                    answers[i] = Some(answer);
                }
            }
        }
        let hits = answers.iter().filter(|a| a.is_some()).count();
        self.series.miss.inc_by((keys.len() - hits) as u64);
        Looked { answers, keys: keys.into_iter().map(Some).collect() }
    }

    /// Whether this process's tier holds an answer for every one of `messages`, asked without
    /// counting (the counted lookup follows): a call whose answers are all here need not wait
    /// at its pool's door for the calls that need TEI.
    pub fn all_here(&self, messages: &[&[u8]]) -> bool {
        match (&self.scope, &self.cache.local) {
            (Some(scope), Some(local)) => messages.iter().all(|message| local.contains(&scope.key(message))),
            _ => false,
        }
    }

    /// Keeps what TEI answered for input `index` of `looked` (a miss), in both tiers.
    pub fn keep(&self, looked: &Looked, index: usize, answer: &Framed) {
        let Some(Some(key)) = looked.keys.get(index) else { return };
        if let Some(local) = &self.cache.local {
            let _ = local.keep(*key, answer.clone());
        }
        if let Some(store) = &self.cache.store {
            store.keep(*key, answer.clone());
        }
    }
}

/// What the `x-teifleet-cache` answer header says of a call whose `inputs` found `hits`.
pub fn header_value(hits: usize, inputs: usize) -> &'static str {
    match hits {
        0 => "miss",
        n if n == inputs => "hit",
        _ => "partial",
    }
}

/// The answer header naming how a call's inputs fared in the cache.
pub const HEADER: &str = "x-teifleet-cache";
