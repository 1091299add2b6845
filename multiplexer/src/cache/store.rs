//! The shared tier: a Redis-protocol store (Redis, Valkey) every replica of the pool reads and
//! writes, so a text embedded at one replica is a hit at the others.
//!
//! A cache, never a dependency. Every read waits at most the store's timeout, then the call goes
//! on to TEI as a miss; writes go in the background and are never waited for. A store that
//! failed, or timed out [`TIMEOUTS_BEFORE_REST`] times in a row, is skipped for [`BACKOFF`], so
//! while it is down each call pays nothing, not a timeout each: at most the calls that meet the
//! first failures pay one. The connection is made
//! lazily and remade by the client after a failure.

use std::sync::Mutex;
use std::time::Duration;

use prometheus::IntCounter;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::time::Instant;

use crate::cache::key::Key;
use crate::cache::seal;
use crate::gate::peer::PeerKey;
use crate::report::cache::StoreSeries;
use crate::vocab::SetupError;
use crate::vocab::framing::Framed;

/// How long a store that failed is left alone.
pub const BACKOFF: Duration = Duration::from_secs(1);
/// Reads in a row that may time out before the store is left alone: one slow read on a busy
/// machine is not a store that is down (it cost a replica most of its hits for a second in the
/// bench). A store that answers with an error, or cannot be reached, is left alone at once.
const TIMEOUTS_BEFORE_REST: u32 = 3;
/// Keys one read asks for at most: a sub-batch's inputs, in one round trip.
pub const MOST_KEYS_PER_READ: usize = 512;
/// Writes in the background at once at most; more are dropped (a cache may forget).
const MOST_WRITES_AT_ONCE: usize = 256;
/// The largest answer the store is asked to keep or trusted to give: a dense answer of 8,192
/// dimensions in f32 is 32 KiB; sparse answers of long texts are larger.
pub const MOST_ANSWER_BYTES: usize = 1 << 20;

/// Where the shared tier is and how long a call waits for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreSettings {
    /// `redis://host:port/db` or `rediss://` (TLS, the system's roots).
    pub url: String,
    pub username: Option<String>,
    pub password: Option<String>,
    pub timeout: Duration,
}

pub struct StoreTier {
    connection: ConnectionManager,
    /// Seals what is written, and checks what is read (`crate::cache::seal`).
    peer_key: std::sync::Arc<PeerKey>,
    timeout: Duration,
    ttl_seconds: u64,
    /// Until when the store is left alone after a failure.
    resting_until: Mutex<Option<Instant>>,
    /// Round trips in a row that timed out.
    timeouts: std::sync::atomic::AtomicU32,
    writes: std::sync::Arc<tokio::sync::Semaphore>,
    series: StoreSeries,
}

impl StoreTier {
    pub fn new(
        settings: &StoreSettings,
        ttl: Duration,
        peer_key: std::sync::Arc<PeerKey>,
        series: StoreSeries,
    ) -> Result<Self, SetupError> {
        let invalid = |e: redis::RedisError| SetupError::Config(format!("cache store {}: {e}", settings.url));
        let mut info = redis::IntoConnectionInfo::into_connection_info(settings.url.as_str()).map_err(invalid)?;
        let mut redis_settings = info.redis_settings().clone();
        if let Some(username) = &settings.username {
            redis_settings = redis_settings.set_username(username);
        }
        if let Some(password) = &settings.password {
            redis_settings = redis_settings.set_password(password);
        }
        info = info.set_redis_settings(redis_settings);
        let client = redis::Client::open(info).map_err(invalid)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(settings.timeout.max(Duration::from_millis(250))))
            .set_response_timeout(Some(settings.timeout.max(Duration::from_millis(250))))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(1));
        let connection = client.get_connection_manager_lazy(config).map_err(invalid)?;
        series.up.set(1);
        Ok(Self {
            connection,
            peer_key,
            timeout: settings.timeout,
            ttl_seconds: ttl.as_secs().max(1),
            resting_until: Mutex::new(None),
            timeouts: std::sync::atomic::AtomicU32::new(0),
            writes: std::sync::Arc::new(tokio::sync::Semaphore::new(MOST_WRITES_AT_ONCE)),
            series,
        })
    }

    /// The answers the store has for `keys`, in their order; all `None` when it does not answer
    /// within the timeout, fails, or is resting.
    pub async fn get(&self, keys: &[Key]) -> Vec<Option<Framed>> {
        let mut found = vec![None; keys.len()];
        if keys.is_empty() {
            return found;
        }
        if self.resting() {
            self.series.get_skipped.inc_by(keys.len() as u64);
            return found;
        }
        let started = Instant::now();
        for (start, part) in keys.chunks(MOST_KEYS_PER_READ).enumerate().map(|(i, part)| (i * MOST_KEYS_PER_READ, part))
        {
            let names: Vec<String> = part.iter().map(Key::store_name).collect();
            let mut connection = self.connection.clone();
            let mut command = redis::cmd("MGET");
            command.arg(&names);
            let read = command.query_async::<Vec<Option<Vec<u8>>>>(&mut connection);
            match tokio::time::timeout(self.timeout, read).await {
                Ok(Ok(values)) => {
                    self.timeouts.store(0, std::sync::atomic::Ordering::Relaxed);
                    for ((slot, key), value) in found[start..].iter_mut().zip(part).zip(values) {
                        let Some(stored) = value.filter(|v| v.len() <= MOST_ANSWER_BYTES + 64) else { continue };
                        match seal::open(&self.peer_key, key, &stored) {
                            Ok(answer) => *slot = Some(Framed::new(answer)),
                            Err(seal::Unsealed::Forged) => self.series.get_forged.inc(),
                        }
                    }
                }
                Ok(Err(error)) => {
                    self.failed(&self.series.get_errors, "read", &error.to_string());
                    break;
                }
                Err(_) => {
                    self.timed_out(&self.series.get_timeouts, "read");
                    break;
                }
            }
        }
        self.series.get_seconds.observe(started.elapsed().as_secs_f64());
        found
    }

    /// Keeps `answer` under `key` in the background, with the cache's time to live.
    pub fn keep(self: &std::sync::Arc<Self>, key: Key, answer: Framed) {
        if answer.len() > MOST_ANSWER_BYTES {
            return;
        }
        if self.resting() {
            self.series.set_skipped.inc();
            return;
        }
        let Ok(turn) = self.writes.clone().try_acquire_owned() else {
            self.series.set_skipped.inc();
            return;
        };
        let tier = self.clone();
        tokio::spawn(async move {
            let _turn = turn;
            let started = Instant::now();
            let mut connection = tier.connection.clone();
            let mut command = redis::cmd("SET");
            let sealed = seal::seal(&tier.peer_key, &key, answer.as_ref());
            command.arg(key.store_name()).arg(sealed).arg("EX").arg(tier.ttl_seconds);
            let write = command.query_async::<()>(&mut connection);
            // Writes wait longer than reads: nobody waits for them, and a write cut short is lost.
            match tokio::time::timeout(tier.timeout * 20, write).await {
                Ok(Ok(())) => {
                    tier.series.stored.inc();
                    tier.series.set_seconds.observe(started.elapsed().as_secs_f64());
                }
                Ok(Err(error)) => tier.failed(&tier.series.set_errors, "write", &error.to_string()),
                Err(_) => tier.timed_out(&tier.series.set_timeouts, "write"),
            }
        });
    }

    fn resting(&self) -> bool {
        let mut until = self.resting_until.lock().unwrap_or_else(|p| p.into_inner());
        match *until {
            Some(at) if Instant::now() < at => true,
            Some(_) => {
                *until = None;
                self.series.up.set(1);
                false
            }
            None => false,
        }
    }

    /// A round trip timed out: counted, and the store left alone once enough did in a row.
    fn timed_out(&self, counter: &IntCounter, what: &str) {
        let in_a_row = self.timeouts.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if in_a_row >= TIMEOUTS_BEFORE_REST {
            self.timeouts.store(0, std::sync::atomic::Ordering::Relaxed);
            self.failed(counter, what, "timed out");
        } else {
            counter.inc();
        }
    }

    fn failed(&self, counter: &IntCounter, what: &str, why: &str) {
        counter.inc();
        let mut until = self.resting_until.lock().unwrap_or_else(|p| p.into_inner());
        if until.is_none() {
            tracing::warn!(what, why, rest = ?BACKOFF, "the cache's store failed: calls go on without it");
        }
        *until = Some(Instant::now() + BACKOFF);
        self.series.up.set(0);
    }
}
