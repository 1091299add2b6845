//! The local tier: answers in this process, bounded in bytes, kept by W-TinyLFU (moka), so a scan
//! of texts seen once (a re-index) does not flush the texts asked for again and again.
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

pub struct LocalTier {
    entries: moka::sync::Cache<Key, Framed>,
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
}

impl LocalTier {
    pub fn new(size: u64, ttl: Duration, memory: &Arc<MemoryBudget>, gauges: Gauges) -> Option<Self> {
        let charge = Arc::new(memory.charge(Use::Cache, 0).ok()?);
        let held = Arc::new(AtomicU64::new(0));
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
            .max_capacity(size / 64 * SOFT_SHARE)
            .weigher(|_key: &Key, answer: &Framed| u32::try_from(weight(answer)).unwrap_or(u32::MAX))
            .time_to_live(ttl)
            .eviction_listener(on_removal)
            .build();
        Some(Self { entries, size, held, charge, gauges })
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
        for n in 0..5_000 {
            let _ = tier.keep(key(n), answer());
        }
        tier.entries.run_pending_tasks();
        let kept = hot.iter().filter(|k| tier.get(k).is_some()).count();
        assert!(kept >= 7, "only {kept} of 8 hot entries survived the scan");
    }

    #[test]
    fn the_budget_can_refuse() {
        let memory = MemoryBudget::new(4096, None);
        let tier = LocalTier::new(1 << 20, Duration::from_secs(60), &memory, gauges()).unwrap();
        let _bodies = memory.charge(Use::RequestBodies, 4000).unwrap();
        assert_eq!(tier.keep(key(1), answer()), Err(NotKept::Budget));
        assert_eq!(tier.held(), 0);
    }
}
