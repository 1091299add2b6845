//! An embedding job over documents of real length, with the worker's default flags (issue 44):
//! rows of 2 to 50 KB, 600 rows of about 12 KB in a row (where a call of 512 of them was 6 MB,
//! over the pool's 4 MiB message limit, and failed the job), one text of 5 MiB (larger than any
//! call can carry), and ids of every size and shape (above 2^64, negative, `-0`, exponents,
//! escaped strings). The multiplexer in front of the simulator runs its own defaults (4 MiB
//! messages) at 384 dimensions, a small real model's size. Every row comes out once, the huge
//! one as its row's error, each id byte for byte as the input has it; a rerun resumes everything.
//! A worker told the pool takes larger messages than it does gets its calls refused for their
//! size, and splits them in halves until they pass, the 5 MiB row becoming its own error.

#[allow(dead_code)] // the support the other test files use too
mod support;

use std::collections::BTreeMap;
use std::time::Instant;

use arrow_array::Array as _;
use arrow_array::cast::AsArray as _;
use arrow_array::types::Float32Type;
use teifleet_job::worker::{JobSettings, Summary};

use support::{Pool, Scratch, parts, read_parquet, worker};

/// The huge row's text: 5 MiB, as in the issue.
const HUGE_TEXT_BYTES: usize = 5 << 20;
/// The ids as the input writes them (JSON), and as the output must carry them.
const ODD_IDS: [(&str, &str); 14] = [
    ("18446744073709551615", "18446744073709551615"),
    ("18446744073709551616", "18446744073709551616"),
    ("18446744073709551617", "18446744073709551617"),
    ("-9223372036854775809", "-9223372036854775809"),
    ("123456789012345678901234567890123456789", "123456789012345678901234567890123456789"),
    ("-0", "-0"),
    ("0", "0"),
    ("1.5e3", "1.5e3"),
    ("1500.0", "1500.0"),
    ("1E400", "1E400"),
    ("0.30000000000000004", "0.30000000000000004"),
    (r#""a \"quoted\" id\u00e9""#, "a \"quoted\" idé"),
    (r#""18446744073709551616 as text""#, "18446744073709551616 as text"),
    (r#""""#, ""),
];

/// A small deterministic generator (xorshift), so a failure can be replayed.
struct Random(u64);

impl Random {
    fn below(&mut self, bound: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % bound as u64) as usize
    }
}

/// A text of about `bytes` bytes of words.
fn text_of(random: &mut Random, bytes: usize) -> String {
    const WORDS: [&str; 8] = ["embedding", "vector", "document", "corpus", "shard", "pool", "token", "model"];
    let mut text = String::with_capacity(bytes + 16);
    while text.len() < bytes {
        text.push_str(WORDS[random.below(WORDS.len())]);
        text.push(' ');
    }
    text
}

/// The corpus: its JSONL, and each row's id (as the output must carry it) with its text's length.
fn corpus() -> (Vec<u8>, Vec<(String, usize)>) {
    let mut random = Random(0x4404_4404_0000_0001);
    let mut content = Vec::new();
    let mut rows = Vec::new();
    let mut push = |id_json: &str, id: &str, text: &str| {
        content.extend_from_slice(format!("{{\"id\": {id_json}, \"text\": \"{text}\"}}\n").as_bytes());
        rows.push((id.to_owned(), text.len()));
    };
    for (index, (json, id)) in ODD_IDS.iter().enumerate() {
        push(json, id, &text_of(&mut random, 2_000 + 1_000 * index));
    }
    // 600 rows of about 12 KB in a row: 7 MB, where one call of 512 was 6 MB.
    for row in 0..600 {
        let id = format!("doc-12k-{row}");
        let length = 12_000 + random.below(500);
        push(&format!("\"{id}\""), &id, &text_of(&mut random, length));
    }
    let huge = "x".repeat(HUGE_TEXT_BYTES);
    push("\"the-huge-one\"", "the-huge-one", &huge);
    // Then rows of 2 to 50 KB, numeric ids among them.
    for row in 0..300 {
        let length = 2_000 + random.below(48_000);
        let id = if row % 3 == 0 {
            format!("{}", 18_446_744_073_709_551_616u128 + 1_000 + row as u128)
        } else {
            format!("r-{row}")
        };
        let json = if row % 3 == 0 { id.clone() } else { format!("\"{id}\"") };
        push(&json, &id, &text_of(&mut random, length));
    }
    (content, rows)
}

/// One output row: its id, its vector, its error.
type OutputRow = (String, Option<Vec<f32>>, Option<String>);

/// Every output row.
fn output(directory: &std::path::Path) -> Vec<OutputRow> {
    let mut rows = Vec::new();
    for part in parts(directory) {
        for batch in read_parquet(&part) {
            let ids = batch.column_by_name("id").unwrap().as_string::<i32>().clone();
            let vectors = batch.column_by_name("embedding").unwrap().as_fixed_size_list().clone();
            let errors = batch.column_by_name("error").unwrap().as_string::<i32>().clone();
            for row in 0..batch.num_rows() {
                let vector =
                    vectors.is_valid(row).then(|| vectors.value(row).as_primitive::<Float32Type>().values().to_vec());
                let error = errors.is_valid(row).then(|| errors.value(row).to_owned());
                rows.push((ids.value(row).to_owned(), vector, error));
            }
        }
    }
    rows
}

/// Checks every row came out once, under its exact id; returns the huge row's error.
fn check(rows: &[OutputRow], expected: &[(String, usize)]) -> String {
    assert_eq!(rows.len(), expected.len(), "one output row per input row");
    let mut by_id: BTreeMap<&str, &OutputRow> = BTreeMap::new();
    for row in rows {
        assert!(by_id.insert(row.0.as_str(), row).is_none(), "{:?} written twice", row.0);
    }
    for (id, _) in expected {
        assert!(by_id.contains_key(id.as_str()), "{id:?} missing: ids are not byte-exact");
    }
    let mut huge_error = None;
    for (id, length) in expected {
        let (_, vector, error) = by_id[id.as_str()];
        if *length == HUGE_TEXT_BYTES {
            assert!(vector.is_none(), "the huge row has no vector");
            huge_error = error.clone();
        } else {
            assert!(error.is_none(), "{id}: {error:?}");
            assert_eq!(vector.as_ref().map(Vec::len), Some(384), "{id}");
        }
    }
    huge_error.expect("the huge row's error")
}

async fn run(pool: &Pool, settings: JobSettings, scratch: &Scratch) -> (Summary, f64) {
    let mut pool_settings = pool.settings();
    // Real documents exceed a model's input: as the issue's job, texts are cut, not failed.
    pool_settings.options.truncate = true;
    let started = Instant::now();
    let job = worker(settings, pool_settings, &scratch.url("in/corpus.jsonl"), &scratch.url("out/"));
    let summary = job.run(&()).await.expect("the job completes");
    (summary, started.elapsed().as_secs_f64())
}

#[tokio::test]
async fn documents_of_real_length_complete_with_default_flags_and_exact_ids() {
    let pool = Pool::start(|config| config.per_token_latency = std::time::Duration::ZERO).await;
    let scratch = Scratch::new("real-documents");
    std::fs::create_dir_all(scratch.path("in")).unwrap();
    let (content, expected) = corpus();
    let bytes = content.len();
    std::fs::write(scratch.path("in/corpus.jsonl"), content).unwrap();

    let (summary, seconds) = run(&pool, JobSettings::default(), &scratch).await;
    eprintln!(
        "real documents: {} rows ({bytes} bytes) in {} shards, {} calls, {} failed, {seconds:.1}s: {summary}",
        summary.rows, summary.shards, summary.calls, summary.failed
    );
    assert_eq!((summary.rows, summary.failed), (expected.len() as u64, 1), "{summary}");
    let huge = check(&output(&scratch.path("out")), &expected);
    assert!(huge.starts_with(&format!("the text is {HUGE_TEXT_BYTES} bytes: over the ")), "{huge}");
    // Sized by bytes: the 600 rows of 12 KB need at least 2 calls; no call was refused, so
    // the calls are no more than the byte and row bounds make (and the dimension probe).
    let text_bytes: usize = expected.iter().map(|(_, length)| length).filter(|l| **l != HUGE_TEXT_BYTES).sum();
    assert!(summary.calls as usize >= text_bytes / (4 << 20), "{summary}");
    assert!((summary.calls as usize) < text_bytes / (2 << 20) + 2 * summary.shards as usize + 2, "{summary}");

    // A rerun finds every shard done.
    let (again, _) = run(&pool, JobSettings::default(), &scratch).await;
    assert_eq!((again.resumed, again.rows, again.calls), (again.shards, expected.len() as u64, 0), "{again}");
}

#[tokio::test]
async fn calls_the_pool_refuses_for_their_size_are_split_down_to_the_row() {
    let pool = Pool::start(|config| config.per_token_latency = std::time::Duration::ZERO).await;
    let scratch = Scratch::new("split-on-refusal");
    std::fs::create_dir_all(scratch.path("in")).unwrap();
    let (content, expected) = corpus();
    std::fs::write(scratch.path("in/corpus.jsonl"), content).unwrap();

    // The worker believes the pool takes 16 MiB messages; it takes 4 MiB (the multiplexer's
    // default), so calls are refused (OUT_OF_RANGE) and split until they pass.
    let settings = JobSettings { max_message_bytes: 16 << 20, ..JobSettings::default() };
    let (summary, seconds) = run(&pool, settings, &scratch).await;
    eprintln!("split on refusal: {} calls, {seconds:.1}s: {summary}", summary.calls);
    assert_eq!((summary.rows, summary.failed), (expected.len() as u64, 1), "{summary}");
    let huge = check(&output(&scratch.path("out")), &expected);
    assert!(huge.starts_with("the pool refused this row alone for its size (OutOfRange): "), "{huge}");
}
