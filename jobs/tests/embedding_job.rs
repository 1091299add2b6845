//! Embedding jobs end to end on loopback: workers read local JSONL or Parquet, call a real
//! multiplexer in front of the TEI simulator, and write Parquet parts. Every input row comes out
//! exactly once, with the vector tei.v1's Embed gives its text or the reason it has none; a
//! stopped worker resumes where it stopped; a pool that is down for a while is waited out.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray as _;
use arrow_array::types::{Float16Type, Float32Type, Int64Type};
use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use teifleet_job::progress::{FileSink, WorkerProgress};
use teifleet_job::settings::{Dtype, Fields, InputFormat};
use teifleet_job::worker::JobSettings;
use teifleet_tei_sim::Fault;

use support::{Pool, Scratch, parts, read_parquet, worker};

/// The simulator's longest input, in tokens: a longer text is TEI's to refuse.
const MAX_TOKENS: usize = 64;

async fn pool(fixed_latency: Duration) -> Pool {
    Pool::start(|config| {
        config.dimensions = 32;
        config.max_batch_tokens = MAX_TOKENS;
        config.fixed_latency = fixed_latency;
        config.per_token_latency = Duration::ZERO;
    })
    .await
}

/// One output row.
#[derive(Debug, Clone, PartialEq)]
struct OutputRow {
    id: Option<String>,
    vector: Option<Vec<f32>>,
    error: Option<String>,
}

/// Every row of every part in `directory` (ids read as text; Int64 ids as their decimal).
fn output_rows(directory: &std::path::Path) -> Vec<OutputRow> {
    let mut rows = Vec::new();
    for part in parts(directory) {
        for batch in read_parquet(&part) {
            rows.extend(rows_of(&batch));
        }
    }
    rows
}

fn rows_of(batch: &RecordBatch) -> Vec<OutputRow> {
    let ids = batch.column_by_name("id").unwrap();
    let embeddings = batch.column_by_name("embedding").unwrap().as_fixed_size_list();
    let errors = batch.column_by_name("error").unwrap().as_string::<i32>();
    (0..batch.num_rows())
        .map(|row| OutputRow {
            id: ids.is_valid(row).then(|| match ids.data_type() {
                DataType::Int64 => ids.as_primitive::<Int64Type>().value(row).to_string(),
                _ => ids.as_string::<i32>().value(row).to_owned(),
            }),
            vector: embeddings.is_valid(row).then(|| {
                let vector = embeddings.value(row);
                match vector.data_type() {
                    DataType::Float16 => {
                        vector.as_primitive::<Float16Type>().values().iter().map(|h| h.to_f32()).collect()
                    }
                    _ => vector.as_primitive::<Float32Type>().values().to_vec(),
                }
            }),
            error: errors.is_valid(row).then(|| errors.value(row).to_owned()),
        })
        .collect()
}

/// What a corpus line should become.
#[derive(Debug, Clone)]
enum Expected {
    Vector { text: String },
    Error { contains: String },
}

/// A JSONL corpus of `rows` rows for file `file`, with bad rows, blank lines, CRLF endings and
/// (with `final_newline` false) no newline after the last line; and what each row should become,
/// by id (rows without a usable id by their expected error, which names file and line).
fn corpus(
    file: usize,
    rows: usize,
    url: &str,
    final_newline: bool,
) -> (Vec<u8>, BTreeMap<String, Expected>, Vec<String>) {
    let mut content = Vec::new();
    let mut by_id = BTreeMap::new();
    let mut without_id = Vec::new();
    let mut line = 0usize;
    for i in 0..rows {
        if i % 500 == 250 {
            content.extend_from_slice(if i % 1000 == 250 { b"\n" } else { b"   \r\n" });
            line += 1;
        }
        line += 1;
        let id = format!("f{file}-{i}");
        let text = format!("document {file} {i} about topic {}", i % 17);
        let (json, expected): (Vec<u8>, Option<Expected>) = match i % 1000 {
            7 => {
                without_id.push(format!("{url}:{line}: not JSON"));
                (b"this line is not json".to_vec(), None)
            }
            11 => (
                format!(r#"{{"id": "{id}"}}"#).into_bytes(),
                Some(Expected::Error { contains: "no `text` field".into() }),
            ),
            13 => (
                format!(r#"{{"id": "{id}", "text": ""}}"#).into_bytes(),
                Some(Expected::Error { contains: "`text` is empty".into() }),
            ),
            17 => {
                without_id.push(format!("{url}:{line}: not valid UTF-8"));
                (
                    format!(r#"{{"id": "{id}", "text": "bad "#)
                        .into_bytes()
                        .into_iter()
                        .chain(*b"\xff\xfe\"}")
                        .collect(),
                    None,
                )
            }
            19 => {
                let long = vec!["word"; MAX_TOKENS * 2].join(" ");
                let json = format!(r#"{{"id": "{id}", "text": "{long}"}}"#).into_bytes();
                (json, Some(Expected::Error { contains: "tokens".into() }))
            }
            23 => {
                let number = 1_000_000 * (file + 1) + i;
                by_id.insert(number.to_string(), Expected::Vector { text: text.clone() });
                (format!(r#"{{"id": {number}, "text": "{text}", "extra": [1, 2]}}"#).into_bytes(), None)
            }
            _ => (format!(r#"{{"id": "{id}", "text": "{text}"}}"#).into_bytes(), Some(Expected::Vector { text })),
        };
        if let Some(expected) = expected {
            by_id.insert(id, expected);
        }
        content.extend_from_slice(&json);
        let last = i + 1 == rows;
        if !last || final_newline {
            content.extend_from_slice(if i % 3 == 0 { b"\r\n" } else { b"\n" });
        }
    }
    (content, by_id, without_id)
}

/// Checks the output against what the corpus says, vectors of a sample against tei.v1's Embed.
async fn check_output(pool: &Pool, rows: &[OutputRow], by_id: &BTreeMap<String, Expected>, without_id: &[String]) {
    assert_eq!(rows.len(), by_id.len() + without_id.len(), "one output row per input row");
    let mut seen = BTreeSet::new();
    for row in rows.iter().filter(|row| row.id.is_some()) {
        let id = row.id.as_deref().unwrap();
        assert!(seen.insert(id), "{id} written twice");
        match by_id.get(id).unwrap_or_else(|| panic!("{id} is no input row")) {
            Expected::Vector { .. } => {
                assert!(row.vector.is_some() && row.error.is_none(), "{row:?}");
            }
            Expected::Error { contains } => {
                assert!(row.vector.is_none(), "{row:?}");
                let error = row.error.as_deref().unwrap_or_default();
                assert!(error.contains(contains.as_str()), "{id}: {error:?} should say {contains:?}");
            }
        }
    }
    assert_eq!(seen.len(), by_id.len(), "every id came out");
    let mut unidentified: Vec<&str> =
        rows.iter().filter(|row| row.id.is_none()).map(|row| row.error.as_deref().unwrap()).collect();
    unidentified.sort_unstable();
    for expected in without_id {
        let found = unidentified.iter().any(|error| error.starts_with(expected.as_str()));
        assert!(found, "no row failed with {expected:?}; unidentified rows: {unidentified:?}");
    }
    let by_row: BTreeMap<&str, &OutputRow> = rows.iter().filter_map(|row| Some((row.id.as_deref()?, row))).collect();
    let vectors: Vec<(&String, &String)> = by_id
        .iter()
        .filter_map(|(id, expected)| match expected {
            Expected::Vector { text } => Some((id, text)),
            Expected::Error { .. } => None,
        })
        .collect();
    for (id, text) in vectors.iter().step_by(vectors.len() / 25) {
        let written = by_row[id.as_str()].vector.as_ref().unwrap();
        assert_eq!(written, &pool.tei_embed(text).await, "{id}: the vector is Embed's for its text");
    }
}

#[tokio::test]
async fn two_workers_embed_every_row_once_with_its_vector_or_its_error() {
    let pool = pool(Duration::ZERO).await;
    let scratch = Scratch::new("two-workers");
    std::fs::create_dir_all(scratch.path("in")).unwrap();
    let mut by_id = BTreeMap::new();
    let mut without_id = Vec::new();
    for (file, final_newline) in [(0, true), (1, false)] {
        let name = format!("in/corpus-{file}.jsonl");
        let (content, ids, unidentified) = corpus(file, 10_000, &scratch.url(&name), final_newline);
        std::fs::write(scratch.path(&name), content).unwrap();
        by_id.extend(ids);
        without_id.extend(unidentified);
    }
    std::fs::write(scratch.path("in/_SUCCESS"), b"not a corpus").unwrap();

    let started = Instant::now();
    let run = |index: u32| {
        let settings = JobSettings {
            workers: 2,
            worker: index,
            shard_bytes: 64 << 10,
            rows_per_call: 256,
            ..JobSettings::default()
        };
        let worker = worker(settings, pool.settings(), &scratch.url("in/"), &scratch.url("out/"));
        let sink = FileSink::new(scratch.path(&format!("progress-{index}.json")));
        async move { worker.run(&sink).await }
    };
    let (first, second) = tokio::join!(run(0), run(1));
    let (first, second) = (first.unwrap(), second.unwrap());
    eprintln!("{first}\n{second}\n{} rows in {:?}", first.rows + second.rows, started.elapsed());
    assert!(first.shards > 1 && second.shards > 1, "both workers had shards: {first}, {second}");
    assert_eq!(first.rows + second.rows, (by_id.len() + without_id.len()) as u64);

    let rows = output_rows(&scratch.path("out"));
    check_output(&pool, &rows, &by_id, &without_id).await;
    let failed = rows.iter().filter(|row| row.error.is_some()).count() as u64;
    assert_eq!(first.failed + second.failed, failed, "the summaries count the failed rows");

    for (index, summary) in [(0, first), (1, second)] {
        let progress: WorkerProgress =
            serde_json::from_slice(&std::fs::read(scratch.path(&format!("progress-{index}.json"))).unwrap()).unwrap();
        assert!(progress.finished, "{progress:?}");
        assert_eq!(
            (progress.shards_done, progress.rows, progress.failed),
            (summary.shards, summary.rows, summary.failed)
        );
        assert_eq!(progress.plan.shards, first.shards + second.shards);
    }
}

#[tokio::test]
async fn a_stopped_worker_resumes_after_the_parts_it_wrote() {
    let pool = pool(Duration::from_millis(20)).await;
    let scratch = Scratch::new("restart");
    std::fs::create_dir_all(scratch.path("in")).unwrap();
    let (content, by_id, without_id) = corpus(0, 6_000, &scratch.url("in/corpus.jsonl"), true);
    std::fs::write(scratch.path("in/corpus.jsonl"), content).unwrap();
    let settings = JobSettings { shard_bytes: 16 << 10, rows_per_call: 128, ..JobSettings::default() };
    let make = || worker(settings.clone(), pool.settings(), &scratch.url("in/corpus.jsonl"), &scratch.url("out/"));

    let first = make();
    let running = tokio::spawn(async move { first.run(&()).await });
    let deadline = Instant::now() + Duration::from_secs(60);
    while parts(&scratch.path("out")).len() < 4 {
        assert!(Instant::now() < deadline, "no parts written");
        assert!(!running.is_finished(), "the worker finished before it could be stopped");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    running.abort();
    assert!(running.await.unwrap_err().is_cancelled());
    // A part being put when the task stopped may still land (the local store writes it on a
    // blocking thread): let it, then count.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let written = parts(&scratch.path("out")).len() as u32;

    let summary = make().run(&()).await.unwrap();
    eprintln!("stopped after {written} parts; then {summary}");
    assert!(written < summary.shards, "stopped midway: {written} of {}", summary.shards);
    assert_eq!(summary.resumed, written, "every part written before the stop is kept, none redone");
    assert_eq!(parts(&scratch.path("out")).len() as u32, summary.shards);
    check_output(&pool, &output_rows(&scratch.path("out")), &by_id, &without_id).await;
}

/// A Parquet file of `ids` and `texts` (and a column the job ignores), in row groups of
/// `rows_per_group`.
fn parquet_input(ids: Vec<i64>, texts: Vec<Option<&str>>, rows_per_group: usize) -> Vec<u8> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("doc_id", DataType::Int64, false),
        Field::new("ignored", DataType::Int64, false),
        Field::new("body", DataType::Utf8, true),
    ]));
    let ignored: ArrayRef = Arc::new(Int64Array::from(vec![0; ids.len()]));
    let columns: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(ids)), ignored, Arc::new(StringArray::from(texts))];
    let batch = RecordBatch::try_new(schema.clone(), columns).unwrap();
    let properties = WriterProperties::builder().set_max_row_group_row_count(Some(rows_per_group)).build();
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, schema, Some(properties)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    out
}

#[tokio::test]
async fn parquet_in_parquet_out_one_part_per_row_group() {
    let pool = pool(Duration::ZERO).await;
    let scratch = Scratch::new("parquet");
    std::fs::create_dir_all(scratch.path("in/.staging")).unwrap();
    let texts: Vec<String> = (0..250).map(|i| format!("parquet row {i}")).collect();
    let mut first: Vec<Option<&str>> = texts[..150].iter().map(|t| Some(t.as_str())).collect();
    first[10] = None;
    first[20] = Some("");
    let second: Vec<Option<&str>> = texts[150..].iter().map(|t| Some(t.as_str())).collect();
    std::fs::write(scratch.path("in/a.parquet"), parquet_input((0..150).collect(), first, 50)).unwrap();
    std::fs::write(scratch.path("in/b.parquet"), parquet_input((150..250).collect(), second, 60)).unwrap();
    std::fs::write(scratch.path("in/.staging/c.parquet"), b"half written").unwrap();

    let settings = JobSettings {
        format: InputFormat::Parquet,
        fields: Fields { id: "doc_id".into(), text: "body".into() },
        rows_per_call: 32,
        ..JobSettings::default()
    };
    let mut pool_settings = pool.settings();
    pool_settings.options.dtype = Dtype::F16;
    let summary = worker(settings, pool_settings, &scratch.url("in/"), &scratch.url("out/")).run(&()).await.unwrap();
    assert_eq!((summary.shards, summary.rows, summary.failed), (3 + 2, 250, 2), "{summary}");

    let part_files = parts(&scratch.path("out"));
    assert_eq!(part_files.len(), 5, "one part per row group");
    let batches = read_parquet(&part_files[0]);
    assert_eq!(batches[0].schema().field_with_name("id").unwrap().data_type(), &DataType::Int64, "ids pass through");

    let rows = output_rows(&scratch.path("out"));
    let ids: Vec<i64> = rows.iter().map(|row| row.id.as_deref().unwrap().parse().unwrap()).collect();
    assert_eq!(ids, (0..250).collect::<Vec<i64>>(), "every row once, in order");
    assert_eq!(rows[10].error.as_deref(), Some("`body` is null"));
    assert_eq!(rows[20].error.as_deref(), Some("`body` is empty"));
    for i in [0, 49, 50, 149, 150, 249] {
        let expected = pool.tei_embed(&texts[i]).await;
        let written = rows[i].vector.as_ref().unwrap();
        assert_eq!(written.len(), expected.len());
        for (half, full) in written.iter().zip(&expected) {
            assert!((half - full).abs() < 1e-2, "row {i}: {half} vs {full}");
        }
    }
}

#[tokio::test]
async fn a_pool_that_is_down_for_a_while_is_waited_out() {
    let pool = pool(Duration::ZERO).await;
    let scratch = Scratch::new("down");
    std::fs::create_dir_all(scratch.path("in")).unwrap();
    let (content, by_id, without_id) = corpus(0, 300, &scratch.url("in/c.jsonl"), true);
    std::fs::write(scratch.path("in/c.jsonl"), content).unwrap();
    pool.sim.set_fault(Fault::Fail);
    let job = worker(JobSettings::default(), pool.settings(), &scratch.url("in/c.jsonl"), &scratch.url("out/"));
    let running = tokio::spawn(async move { job.run(&()).await });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!running.is_finished(), "the worker waits for the pool");
    assert!(parts(&scratch.path("out")).is_empty());
    pool.sim.set_fault(Fault::None);
    let summary = tokio::time::timeout(Duration::from_secs(60), running).await.unwrap().unwrap().unwrap();
    assert_eq!(summary.rows, (by_id.len() + without_id.len()) as u64);
    check_output(&pool, &output_rows(&scratch.path("out")), &by_id, &without_id).await;
}
