//! Each pool's `tei.v1.Info`, fetched once and kept. The routes that need the model's id or type
//! (`POST /` dispatching by model type, OpenAI's `model` when the request names none, `/rerank`
//! checking for a re-ranker first as TEI does) must not cost an upstream call, nor count as a
//! second request, per request.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use teifleet_proto::v1;
use tokio::time::Instant;

use crate::error::Result;
use crate::forward::pools::Pool;

/// How long a pool's Info is trusted. A pool's model changes with its spec (part of the cache
/// key); this bounds how long a TEI replaced behind the same spec (a new image) is described by
/// its predecessor.
const FRESH_FOR: Duration = Duration::from_secs(60);

#[derive(Default)]
pub struct InfoCache {
    pools: Mutex<HashMap<String, Entry>>,
}

struct Entry {
    serves: Serves,
    fetched: Instant,
    info: Arc<v1::InfoResponse>,
}

/// What a pool's Info depends on: where its TEI is and what its spec says it serves.
#[derive(Clone, PartialEq, Eq)]
struct Serves {
    upstream: String,
    model: Option<String>,
}

impl InfoCache {
    /// The pool's Info: kept when fresh for what the pool serves now, else `fetch`ed and kept.
    /// A failed fetch is not kept: the next request asks again.
    pub async fn get_or_fetch(
        &self,
        pool: &Pool,
        fetch: impl Future<Output = Result<v1::InfoResponse>>,
    ) -> Result<Arc<v1::InfoResponse>> {
        let serves = Serves { upstream: pool.spec.upstream.clone(), model: pool.spec.model.clone() };
        if let Some(entry) = self.lock().get(&pool.spec.name)
            && entry.serves == serves
            && entry.fetched.elapsed() < FRESH_FOR
        {
            return Ok(entry.info.clone());
        }
        let info = Arc::new(fetch.await?);
        let entry = Entry { serves, fetched: Instant::now(), info: info.clone() };
        self.lock().insert(pool.spec.name.clone(), entry);
        Ok(info)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.pools.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
