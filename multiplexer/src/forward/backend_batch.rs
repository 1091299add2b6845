//! Learns what TEI's `Info` says: its batch (`max_batch_requests`) for a pool's admission, which
//! keeps TEI's next batch ready beside a tight static limit (`crate::admission` `next_batch`), and
//! its model for the pool's cache, whose keys name it (`crate::cache`). Asked once when the pool
//! (or its cache) appears, again while TEI is unreachable or still loading its model (bounded
//! attempts, backing off): the pool serves meanwhile as if TEI reported no batch, and calls pass
//! by the cache.

use std::time::Duration;

use std::sync::Arc;

use teifleet_proto::v1::info_client::InfoClient;
use teifleet_proto::v1::{InfoRequest, InfoResponse};
use tonic::transport::Channel;

use crate::admission::Admission;
use crate::cache::Cache;

/// Attempts before giving up: with the backoff, about ten minutes (a large model's load).
const ATTEMPTS: u32 = 64;
const FIRST_WAIT: Duration = Duration::from_millis(250);
const LONGEST_WAIT: Duration = Duration::from_secs(10);
/// One Info call's bound: TEI answers it from memory.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Asks TEI behind `channel` for its batch and gives it to `admission`, in the background
/// (nothing happens outside a runtime: a table built in a plain test).
pub fn learn(admission: Admission, channel: Channel, pool: String) {
    ask(channel, pool, "batch", move |pool, info| {
        let batch = info.max_batch_requests.map(|n| n as usize);
        tracing::info!(%pool, ?batch, "TEI's batch learned from its Info");
        admission.set_backend_batch(batch);
    });
}

/// Asks TEI behind `channel` which model it serves and gives it to `cache`, in the background.
pub fn learn_model(cache: Arc<Cache>, channel: Channel, pool: String) {
    ask(channel, pool, "model", move |_, info| cache.learn_model(&info));
}

fn ask(channel: Channel, pool: String, what: &'static str, learned: impl FnOnce(&str, InfoResponse) + Send + 'static) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    runtime.spawn(async move {
        let mut wait = FIRST_WAIT;
        for _ in 0..ATTEMPTS {
            let mut client = InfoClient::new(channel.clone());
            if let Ok(Ok(info)) = tokio::time::timeout(CALL_TIMEOUT, client.info(InfoRequest {})).await {
                learned(&pool, info.into_inner());
                return;
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(LONGEST_WAIT);
        }
        tracing::warn!(%pool, what, "TEI's Info never answered: not learned");
    });
}
