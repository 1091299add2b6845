//! Learns TEI's batch (`Info.max_batch_requests`) for a pool's admission, which keeps TEI's next
//! batch ready beside a tight static limit (`crate::admission` `next_batch`). Asked once when the
//! pool appears, again while TEI is unreachable or still loading its model (bounded attempts,
//! backing off): the pool serves meanwhile as if TEI reported no batch.

use std::time::Duration;

use teifleet_proto::v1::InfoRequest;
use teifleet_proto::v1::info_client::InfoClient;
use tonic::transport::Channel;

use crate::admission::Admission;

/// Attempts before giving up: with the backoff, about ten minutes (a large model's load).
const ATTEMPTS: u32 = 64;
const FIRST_WAIT: Duration = Duration::from_millis(250);
const LONGEST_WAIT: Duration = Duration::from_secs(10);
/// One Info call's bound: TEI answers it from memory.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Asks TEI behind `channel` for its batch and gives it to `admission`, in the background
/// (nothing happens outside a runtime: a table built in a plain test).
pub fn learn(admission: Admission, channel: Channel, pool: String) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    runtime.spawn(async move {
        let mut wait = FIRST_WAIT;
        for _ in 0..ATTEMPTS {
            let mut client = InfoClient::new(channel.clone());
            if let Ok(Ok(info)) = tokio::time::timeout(CALL_TIMEOUT, client.info(InfoRequest {})).await {
                let batch = info.into_inner().max_batch_requests.map(|n| n as usize);
                tracing::info!(%pool, ?batch, "TEI's batch learned from its Info");
                admission.set_backend_batch(batch);
                return;
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(LONGEST_WAIT);
        }
        tracing::warn!(%pool, "TEI's Info never answered: no batch kept ready");
    });
}
