//! The local tier: answers in this process, bounded in bytes, kept by W-TinyLFU (moka), so a scan
//! of texts seen once (a re-index) does not flush the texts asked for again and again.
//!
//! moka counts how often keys are asked for only once the tier is half full, so a hot set asked
//! for while it filled looks as cold as texts seen once, and a scan pushed it all out (the cache
//! tests caught it). So once the tier is 7/8 full an answer is kept only the second time its key
//! is missed within the doorkeeper's memory (TinyLFU's doorkeeper: a bounded LRU set of keys seen
//! once), and moka's own frequencies decide among those: a scan's texts, seen once each, never
//! get in.
//!
//! The bound is hard: [`LocalTier::held`] counts every entry's bytes from its insertion to its
//! removal, and an insertion that would pass the size first lets moka evict, then is skipped if
//! there is still no room. moka evicts on its own at a little under the size, so that path is
//! rare. The bytes are charged to the process's memory budget as one holder, which is refused
//! (and the answer simply not kept) when calls need the room.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use moka::notification::RemovalCause;

use crate::admission::memory::{Charge, MemoryBudget, Use};
use crate::cache::key::Key;
use crate::report::cache::LocalSeries as Gauges;
use crate::vocab::framing::Framed;

/// What an entry costs beyond its answer's bytes: its key, moka's node and its bookkeeping.
pub const ENTRY_OVERHEAD: u64 = 128;

/// moka evicts at this share of the size (in 64ths), ahead of the hard bound.
const SOFT_SHARE: u64 = 62;
/// The doorkeeper turns away first sightings once the tier is this full (in eighths): late enough
/// that a corpus filling most of the tier is kept whole on its first pass (a re-index's second
/// pass then hits), early enough that a scan never reaches moka's eviction (at 62/64), where it
/// would push the hot set out.
const DOORKEEPER_FROM_EIGHTHS: u64 = 7;
/// What one key in the doorkeeper costs (the key, moka's node and its LRU links).
const DOORKEEPER_ENTRY: u64 = 128;
/// The doorkeeper remembers as many keys as the tier holds entries of this size.
const TYPICAL_ENTRY: u64 = 2048;

pub struct LocalTier {
    entries: moka::sync::Cache<Key, Framed>,
    /// Keys missed once while the tier was half full or more.
    doorkeeper: moka::sync::Cache<Key, ()>,
    size: u64,
    held: Arc<AtomicU64>,
    charge: Arc<Charge>,
    gauges: Gauges,
}

/// Why an answer was not kept here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotKept {
    /// Larger than the whole tier, or no room even after eviction.
    NoRoom,
    /// The memory budget is needed by calls.
    Budget,
    /// Missed once so far while the tier is half full: kept the next time.
    FirstSeen,
}

impl LocalTier {
    pub fn new(size: u64, ttl: Duration, memory: &Arc<MemoryBudget>, gauges: Gauges) -> Option<Self> {
        let remembered = (size / TYPICAL_ENTRY).max(1);
        // The doorkeeper's room is taken from the tier's and charged from the start.
        let doorkeeper_bytes = remembered * DOORKEEPER_ENTRY;
        let charge = Arc::new(memory.charge(Use::Cache, doorkeeper_bytes).ok()?);
        let held = Arc::new(AtomicU64::new(doorkeeper_bytes));
        gauges.bytes.add(i64::try_from(doorkeeper_bytes).unwrap_or(i64::MAX));
        let doorkeeper = moka::sync::Cache::builder()
            .max_capacity(remembered)
            .eviction_policy(moka::policy::EvictionPolicy::lru())
            .time_to_live(ttl)
            .build();
        let on_removal = {
            let (held, charge, gauges) = (held.clone(), charge.clone(), gauges.clone());
            move |_key: Arc<Key>, answer: Framed, cause: RemovalCause| {
                let weight = weight(&answer);
                held.fetch_sub(weight, Ordering::AcqRel);
                charge.shrink(weight);
                gauges.bytes.sub(i64::try_from(weight).unwrap_or(i64::MAX));
                gauges.entries.dec();
                if matches!(cause, RemovalCause::Size | RemovalCause::Expired) {
                    gauges.evictions.inc();
                }
            }
        };
        let entries = moka::sync::Cache::builder()
            .max_capacity(size.saturating_sub(doorkeeper_bytes) / 64 * SOFT_SHARE)
            .weigher(|_key: &Key, answer: &Framed| u32::try_from(weight(answer)).unwrap_or(u32::MAX))
            .time_to_live(ttl)
            .eviction_listener(on_removal)
            .build();
        Some(Self { entries, doorkeeper, size, held, charge, gauges })
    }

    pub fn get(&self, key: &Key) -> Option<Framed> {
        self.entries.get(key)
    }

    /// Whether `key` has an entry, without counting it as asked for (W-TinyLFU's frequencies).
    pub fn contains(&self, key: &Key) -> bool {
        self.entries.contains_key(key)
    }

    /// Keeps `answer` under `key`, within the size and the memory budget.
    pub fn keep(&self, key: Key, answer: Framed) -> Result<(), NotKept> {
        let kept = self.try_keep(key, answer);
        if kept.is_err() {
            self.gauges.not_kept.inc();
        }
        kept
    }

    fn try_keep(&self, key: Key, answer: Framed) -> Result<(), NotKept> {
        let weight = weight(&answer);
        if weight > self.size {
            return Err(NotKept::NoRoom);
        }
        if self.held() >= self.size / 8 * DOORKEEPER_FROM_EIGHTHS && self.doorkeeper.remove(&key).is_none() {
            self.doorkeeper.insert(key, ());
            return Err(NotKept::FirstSeen);
        }
        if !self.room_for(weight) {
            self.entries.run_pending_tasks();
            if !self.room_for(weight) {
                return Err(NotKept::NoRoom);
            }
        }
        self.charge.grow(weight).map_err(|_| NotKept::Budget)?;
        self.held.fetch_add(weight, Ordering::AcqRel);
        self.gauges.bytes.add(i64::try_from(weight).unwrap_or(i64::MAX));
        self.gauges.entries.inc();
        self.gauges.stored.inc();
        // A key already present is replaced: the listener gives the old entry's bytes back.
        self.entries.insert(key, answer);
        Ok(())
    }

    /// Bytes of the entries in the tier (inserted, not yet removed).
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Acquire)
    }

    fn room_for(&self, weight: u64) -> bool {
        self.held().saturating_add(weight) <= self.size
    }
}

fn weight(answer: &Framed) -> u64 {
    answer.len() as u64 + ENTRY_OVERHEAD
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gauges() -> Gauges {
        crate::report::cache::CacheFamilies::new().local("pool")
    }

    fn key(n: u32) -> Key {
        let mut bytes = [0; 32];
        bytes[..4].copy_from_slice(&n.to_le_bytes());
        Key(bytes)
    }

    fn answer() -> Framed {
        Framed::new(&[7; 1536])
    }

    #[test]
    fn never_holds_more_than_its_size() {
        let memory = MemoryBudget::new(1 << 30, None);
        let size = 64 * 1024;
        let tier = LocalTier::new(size, Duration::from_secs(60), &memory, gauges()).unwrap();
        for n in 0..10_000 {
            let _ = tier.keep(key(n), answer());
            assert!(tier.held() <= size, "held {} over {size}", tier.held());
            assert!(memory.charged_for(Use::Cache) <= size);
        }
        tier.entries.run_pending_tasks();
        assert!(tier.held() > size / 2, "the tier fills: {}", tier.held());
        assert_eq!(memory.charged_for(Use::Cache), tier.held());
    }

    #[test]
    fn a_hot_entry_survives_a_scan() {
        let memory = MemoryBudget::new(1 << 30, None);
        let tier = LocalTier::new(64 * 1024, Duration::from_secs(60), &memory, gauges()).unwrap();
        let hot: Vec<Key> = (0..8).map(|n| key(1_000_000 + n)).collect();
        for _ in 0..20 {
            for k in &hot {
                if tier.get(k).is_none() {
                    let _ = tier.keep(*k, answer());
                }
            }
        }
        // As the cache does: each text of the scan is asked for (a miss) before it is kept.
        for n in 0..5_000 {
            assert!(tier.get(&key(n)).is_none());
            let _ = tier.keep(key(n), answer());
        }
        tier.entries.run_pending_tasks();
        let kept = hot.iter().filter(|k| tier.get(k).is_some()).count();
        assert!(kept >= 7, "only {kept} of 8 hot entries survived the scan");
        // A text missed twice gets in, scan or not.
        for _ in 0..2 {
            if tier.get(&key(9_999_999)).is_none() {
                let _ = tier.keep(key(9_999_999), answer());
            }
        }
        tier.entries.run_pending_tasks();
        assert!(tier.get(&key(9_999_999)).is_some(), "a text asked for again is kept");
    }

    #[test]
    fn the_budget_can_refuse() {
        let memory = MemoryBudget::new(128 << 10, None);
        let tier = LocalTier::new(1 << 20, Duration::from_secs(60), &memory, gauges()).unwrap();
        let doorkeeper = tier.held();
        let _bodies = memory.charge(Use::RequestBodies, (128 << 10) - doorkeeper - 1000).unwrap();
        assert_eq!(tier.keep(key(1), answer()), Err(NotKept::Budget));
        assert_eq!(tier.held(), doorkeeper);
    }
}
