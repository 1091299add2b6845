//! The worker's inputs as a hostile surface (issue 43): whatever a corpus holds, each bad row is
//! that row's clear error and each bad file the job's clear error, with no panic, and a line of
//! any length is read with bounded memory (a line over `MAX_LINE_BYTES` is never held whole; the
//! bound itself is checked in `input::lines`' unit tests). Run against the simulator behind a
//! multiplexer at 384 dimensions, with the worker's default flags.

#[allow(dead_code)] // the support the other test files use too
mod support;

use std::sync::Arc;

use arrow_array::cast::AsArray as _;
use arrow_array::{Array as _, ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use teifleet_job::input::lines::MAX_LINE_BYTES;
use teifleet_job::settings::InputFormat;
use teifleet_job::worker::JobSettings;

use support::{Pool, Scratch, parts, read_parquet, worker};

/// Every output row: id and error (`None`: it has a vector).
fn output(directory: &std::path::Path) -> Vec<(Option<String>, Option<String>)> {
    let mut rows = Vec::new();
    for part in parts(directory) {
        for batch in read_parquet(&part) {
            let ids = batch.column_by_name("id").unwrap().as_string::<i32>().clone();
            let vectors = batch.column_by_name("embedding").unwrap().clone();
            let errors = batch.column_by_name("error").unwrap().as_string::<i32>().clone();
            for row in 0..batch.num_rows() {
                assert_eq!(vectors.is_valid(row), errors.is_null(row), "a vector or an error, never both");
                let id = ids.is_valid(row).then(|| ids.value(row).to_owned());
                rows.push((id, errors.is_valid(row).then(|| errors.value(row).to_owned())));
            }
        }
    }
    rows
}

#[tokio::test]
async fn hostile_jsonl_rows_are_each_their_rows_error() {
    let pool = Pool::start(|_| {}).await;
    let scratch = Scratch::new("hostile-jsonl");
    std::fs::create_dir_all(scratch.path("in")).unwrap();
    let url = scratch.url("in/c.jsonl");
    let long_line = MAX_LINE_BYTES as usize + (3 << 20);
    let mut content = Vec::new();
    let mut line = |bytes: &[u8]| {
        content.extend_from_slice(bytes);
        content.push(b'\n');
    };
    line(br#"{"id": "good-1", "text": "a good row"}"#);
    // A line of 19 MiB, over the line bound: its own error, never held whole.
    let mut long = br#"{"id": "long", "text": ""#.to_vec();
    long.resize(long_line - 2, b'a');
    long.extend_from_slice(br#""}"#);
    line(&long);
    line(b"{\"id\": \"bad-utf8\", \"text\": \"\xff\xfe\xfd\"}");
    line("[".repeat(100_000).as_bytes());
    line(format!(r#"{{"id": "deep", "text": "x", "other": {}}}"#, "[".repeat(100_000)).as_bytes());
    line(
        format!(r#"{{"id": "deep-closed", "o": {}{}, "text": "fine"}}"#, "[".repeat(100_000), "]".repeat(100_000))
            .as_bytes(),
    );
    line(br#"{"id": "no-text"}"#);
    line(br#"{"id": "text-number", "text": 12}"#);
    line(br#"{"id": "text-object", "text": {"a": "b"}}"#);
    line(br#"{"id": {"nested": "id"}, "text": "x"}"#);
    line(b"\0\0\0 binary \x01\x02");
    line(br#"{"id": "good-2", "text": "another good row"}"#);
    std::fs::write(scratch.path("in/c.jsonl"), content).unwrap();

    let job = worker(JobSettings::default(), pool.settings(), &url, &scratch.url("out/"));
    let summary = job.run(&()).await.expect("bad rows never fail the job");
    let rows = output(&scratch.path("out"));
    assert_eq!(summary.rows, 12, "{summary}");
    assert_eq!(rows.len(), 12);
    let error_of = |index: usize| rows[index].1.clone().unwrap_or_default();
    assert_eq!(rows[0], (Some("good-1".into()), None));
    assert_eq!(
        error_of(1),
        format!("{url}:2: the line is {long_line} bytes, over the {MAX_LINE_BYTES} a line may have")
    );
    assert_eq!(error_of(2), format!("{url}:3: not valid UTF-8 (byte 29 of the line)"));
    assert!(error_of(3).starts_with(&format!("{url}:4: not JSON: EOF while parsing a list")), "{}", error_of(3));
    assert!(error_of(4).starts_with(&format!("{url}:5: not JSON: ")), "{}", error_of(4));
    assert_eq!(rows[5], (Some("deep-closed".into()), None), "deep nesting skipped, not recursed into");
    assert_eq!(error_of(6), format!("{url}:7: no `text` field"));
    assert_eq!(error_of(7), format!("{url}:8: `text` is a number, not a string"));
    assert_eq!(error_of(8), format!("{url}:9: `text` is an object, not a string"));
    assert_eq!(rows[9].0.as_deref(), Some(r#"{"nested": "id"}"#), "a non-scalar id is kept to find the row");
    assert_eq!(error_of(9), format!("{url}:10: `id` is an object, not a string or number"));
    assert!(error_of(10).starts_with(&format!("{url}:11: not JSON: ")), "{}", error_of(10));
    assert_eq!(rows[11], (Some("good-2".into()), None));
    assert_eq!(summary.failed, 9);
}

/// A Parquet file with an id column and a `text` column of `texts`' type.
fn parquet_with_text(texts: ArrayRef) -> Vec<u8> {
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..texts.len() as i64));
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("text", texts.data_type().clone(), true),
    ]));
    let batch = RecordBatch::try_new(schema.clone(), vec![ids, texts]).unwrap();
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, schema, None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    out
}

async fn parquet_job_error(name: &str, file: Vec<u8>) -> String {
    let pool = Pool::start(|_| {}).await;
    let scratch = Scratch::new(name);
    std::fs::create_dir_all(scratch.path("in")).unwrap();
    std::fs::write(scratch.path("in/p.parquet"), file).unwrap();
    let settings = JobSettings { format: InputFormat::Parquet, ..JobSettings::default() };
    let job = worker(settings, pool.settings(), &scratch.url("in/"), &scratch.url("out/"));
    let error = job.run(&()).await.expect_err("a bad file is the job's error").to_string();
    assert!(parts(&scratch.path("out")).is_empty(), "nothing written for a bad file");
    error.replace(&scratch.url("in/"), "in/")
}

#[tokio::test]
async fn a_parquet_text_column_of_the_wrong_type_is_a_clear_job_error() {
    let error = parquet_job_error("hostile-type", parquet_with_text(Arc::new(Int64Array::from(vec![1, 2, 3])))).await;
    assert_eq!(error, "in/p.parquet: column `text` is Int64, not a string column");
}

#[tokio::test]
async fn a_truncated_or_garbage_parquet_file_is_a_clear_job_error() {
    let whole = parquet_with_text(Arc::new(StringArray::from(vec!["a"; 1000])));
    for cut in [whole.len() / 2, whole.len() - 1, 8] {
        let error = parquet_job_error("hostile-truncated", whole[..cut].to_vec()).await;
        assert!(error.starts_with("in/p.parquet: "), "cut at {cut}: {error}");
    }
    // The footer intact, a data page overwritten: the row group fails to decode, not the process.
    let mut corrupt = whole.clone();
    for byte in &mut corrupt[4..whole.len() / 2] {
        *byte = 0xA5;
    }
    let error = parquet_job_error("hostile-corrupt", corrupt).await;
    assert!(error.starts_with("in/p.parquet: "), "{error}");
}
