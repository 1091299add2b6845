//! The Arrow IPC reader fed valid streams mutated as an attacker would (bits flipped, cut short,
//! length fields set to huge, negative or off-by-a-little values), in process: every case is an
//! answer or a clean refusal, never a panic, and never more charged than the budget allows.
//! Proptest's default case count (256, or `PROPTEST_CASES`).

use bytes::Bytes;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::Config;
use teifleet_multiplexer::admission::memory::MemoryBudget;
use teifleet_multiplexer::front::tei_manager::decode_texts;

use super::ipc::{self, Slot};

/// The sidecar's own budget by default (half of 256Mi).
const BUDGET: u64 = 128 << 20;

fn config() -> Config {
    Config { failure_persistence: None, ..Config::default() }
}

/// The valid streams every case starts from: Utf8 and LargeUtf8, plain and LZ4, with nulls and
/// empty rows.
fn seeds() -> Vec<Vec<u8>> {
    let rows: Vec<String> = (0..40).map(|i| format!("row {i} {}", "words ".repeat(i % 7))).collect();
    let mut rows: Vec<Option<&str>> = rows.iter().map(|r| Some(r.as_str())).collect();
    rows[3] = None;
    rows[5] = Some("");
    let mut seeds = Vec::new();
    for large in [false, true] {
        for lz4 in [false, true] {
            seeds.push(ipc::stream(&rows, large, lz4));
        }
    }
    seeds
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip { at: Index, bit: u8 },
    Truncate(Index),
    Field { slot: Index, value: i64 },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let huge = prop_oneof![
        Just(1i64 << 62),
        Just(1i64 << 40),
        Just(i64::MAX),
        Just(i64::MIN),
        Just(-1i64),
        Just(-2i64),
        Just(i32::MAX as i64),
        Just(u32::MAX as i64),
        0i64..4096,
    ];
    prop_oneof![
        (any::<Index>(), 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        any::<Index>().prop_map(Mutation::Truncate),
        (any::<Index>(), huge).prop_map(|(slot, value)| Mutation::Field { slot, value }),
    ]
}

fn apply(seed: &[u8], slots: &[Slot], mutation: &Mutation) -> Vec<u8> {
    // An earlier truncation may have left nothing to mutate.
    if seed.is_empty() {
        return Vec::new();
    }
    match mutation {
        Mutation::Flip { at, bit } => {
            let mut out = seed.to_vec();
            out[at.index(seed.len())] ^= 1 << bit;
            out
        }
        Mutation::Truncate(at) => seed[..at.index(seed.len())].to_vec(),
        Mutation::Field { slot, value } => match slots[slot.index(slots.len())] {
            // Cut off by an earlier mutation.
            slot if slot.at + slot.width > seed.len() => seed.to_vec(),
            slot => ipc::set(seed, slot, *value),
        },
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn a_mutated_stream_is_read_or_refused_never_a_panic(
        seed in any::<Index>(),
        mutations in proptest::collection::vec(mutation(), 1..4),
    ) {
        let seeds = seeds();
        let seed = &seeds[seed.index(seeds.len())];
        let slots = ipc::slots(seed);
        let mut mutated = seed.clone();
        for mutation in &mutations {
            mutated = apply(&mutated, &slots, mutation);
        }
        let budget = MemoryBudget::new(BUDGET, None);
        let decoded = decode_texts(&Bytes::from(mutated), &budget);
        if let Ok(decoded) = &decoded {
            prop_assert!(decoded.texts.len() <= 1 << 20);
            prop_assert!(budget.charged() <= BUDGET);
        }
        drop(decoded);
        prop_assert_eq!(budget.charged(), 0, "every charge given back");
    }
}

#[test]
fn the_seeds_read_back_as_written() {
    let budget = MemoryBudget::new(BUDGET, None);
    for seed in seeds() {
        let decoded = decode_texts(&Bytes::from(seed), &budget).unwrap();
        assert_eq!(decoded.texts.len(), 40);
        assert_eq!(
            (decoded.texts.get(3), decoded.texts.get(5), decoded.texts.get(0)),
            (None, Some(""), Some("row 0 "))
        );
    }
}
