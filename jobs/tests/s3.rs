//! Embedding jobs against a real S3 server: SeaweedFS (`weed server` with its S3 gateway, on
//! loopback; `tools/seaweedfs.sh` builds it and `make unit` passes it in `TEIFLEET_WEED_BIN`).
//! Parquet in a bucket, two workers through a real multiplexer in front of the TEI simulator,
//! Parquet parts out to another prefix: every id once, each vector tei.v1's own; a second run
//! resumes every shard from the bucket; wrong credentials fail with a clear message.
//!
//! Without `weed` the test says it was skipped and passes, unless `TEIFLEET_REQUIRE_S3=1` (as
//! `make unit` sets), where a missing `weed` fails it.

#[allow(dead_code)] // the support the other test file uses too
mod support;

use std::sync::Arc;

use arrow_array::cast::AsArray as _;
use arrow_array::types::{Float32Type, Int64Type};
use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore as _, ObjectStoreExt as _};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::file::properties::WriterProperties;
use teifleet_job::embed::PoolClient;
use teifleet_job::settings::{Fields, InputFormat};
use teifleet_job::store::{S3Credentials, S3Settings, Store, StoreRole};
use teifleet_job::worker::{JobSettings, Worker};
use teifleet_testkit::seaweedfs::{ACCESS_KEY, SECRET_KEY, SeaweedFs};

use support::{Pool, Scratch};

const BUCKET: &str = "corpus";
const ROWS: i64 = 3_000;

fn settings(endpoint: &str, secret: &str) -> S3Settings {
    S3Settings {
        endpoint: Some(endpoint.to_owned()),
        region: "us-east-1".into(),
        allow_http: true,
        credentials: Some(S3Credentials { access_key_id: ACCESS_KEY.into(), secret_access_key: secret.into() }),
    }
}

/// `weed`, or `None` when the test is to be skipped.
fn weed() -> Option<std::path::PathBuf> {
    let bin = SeaweedFs::bin();
    if bin.is_none() {
        let required = std::env::var("TEIFLEET_REQUIRE_S3").is_ok_and(|v| v == "1");
        assert!(!required, "TEIFLEET_REQUIRE_S3=1 but TEIFLEET_WEED_BIN names no weed (tools/seaweedfs.sh builds it)");
        eprintln!("skipped: no TEIFLEET_WEED_BIN (tools/seaweedfs.sh builds weed)");
    }
    bin
}

/// A Parquet file of ids and texts in row groups of 500.
fn parquet_input(ids: std::ops::Range<i64>) -> Vec<u8> {
    let schema =
        Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("text", DataType::Utf8, true)]));
    let texts: Vec<String> = ids.clone().map(|i| format!("document {i} stored in S3")).collect();
    let columns: Vec<ArrayRef> = vec![Arc::new(Int64Array::from_iter_values(ids)), Arc::new(StringArray::from(texts))];
    let batch = RecordBatch::try_new(schema.clone(), columns).unwrap();
    let properties = WriterProperties::builder().set_max_row_group_row_count(Some(500)).build();
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, schema, Some(properties)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    out
}

fn worker(pool: &Pool, s3: &S3Settings, worker: u32) -> Worker {
    let input = Store::open(StoreRole::Input, &format!("s3://{BUCKET}/in/"), s3).expect("input opens");
    let output = Store::open(StoreRole::Output, &format!("s3://{BUCKET}/out/"), s3).expect("output opens");
    let settings = JobSettings {
        format: InputFormat::Parquet,
        fields: Fields::default(),
        worker,
        workers: 2,
        rows_per_call: 128,
        ..JobSettings::default()
    };
    Worker::new(settings, input, output, PoolClient::new(pool.settings()).unwrap()).unwrap()
}

#[tokio::test]
async fn parquet_in_a_bucket_comes_out_as_parquet_parts_with_every_id_once() {
    let Some(bin) = weed() else { return };
    let scratch = Scratch::new("s3");
    let seaweed = SeaweedFs::start(&bin, &scratch.path("weed")).await.expect("SeaweedFS starts");
    seaweed.create_bucket(BUCKET).await.unwrap();
    let s3 = settings(&seaweed.endpoint(), SECRET_KEY);
    let bucket = s3.open(BUCKET).unwrap();
    bucket.put(&ObjectPath::from("in/a.parquet"), parquet_input(0..ROWS / 2).into()).await.unwrap();
    bucket.put(&ObjectPath::from("in/b.parquet"), parquet_input(ROWS / 2..ROWS).into()).await.unwrap();

    let pool = Pool::start(|config| config.dimensions = 16).await;
    let (zero, one) = (worker(&pool, &s3, 0), worker(&pool, &s3, 1));
    let (first, second) = tokio::join!(zero.run(&()), one.run(&()));
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!(first.rows + second.rows, ROWS as u64, "{first} / {second}");
    assert_eq!(first.failed + second.failed, 0);

    // Read back from the bucket: every id once, each vector tei.v1's own for its text.
    let listed = bucket.list_with_delimiter(Some(&ObjectPath::from("out"))).await.unwrap();
    let mut parts: Vec<ObjectPath> = listed.objects.into_iter().map(|object| object.location).collect();
    parts.sort();
    assert_eq!(parts.len(), 6, "one part per row group: {parts:?}");
    let mut ids = Vec::new();
    let mut sample = Vec::new();
    for part in &parts {
        let bytes = bucket.get(part).await.unwrap().bytes().await.unwrap();
        for batch in ParquetRecordBatchReaderBuilder::try_new(bytes).unwrap().build().unwrap() {
            let batch = batch.unwrap();
            let id = batch.column_by_name("id").unwrap().as_primitive::<Int64Type>().clone();
            let vectors = batch.column_by_name("embedding").unwrap().as_fixed_size_list().clone();
            for row in 0..batch.num_rows() {
                ids.push(id.value(row));
                if id.value(row) % 997 == 0 {
                    let vector = vectors.value(row);
                    sample.push((id.value(row), vector.as_primitive::<Float32Type>().values().to_vec()));
                }
            }
        }
    }
    ids.sort_unstable();
    assert_eq!(ids, (0..ROWS).collect::<Vec<_>>(), "every id exactly once");
    assert!(!sample.is_empty());
    for (id, vector) in sample {
        assert_eq!(vector, pool.tei_embed(&format!("document {id} stored in S3")).await, "row {id}");
    }

    // A second run finds every shard done in the bucket and embeds nothing.
    let again = worker(&pool, &s3, 0);
    let again = again.run(&()).await.unwrap();
    assert_eq!((again.resumed, again.shards), (again.shards, 3), "{again}");

    // Wrong credentials: the run fails, saying which store refused it.
    let wrong = settings(&seaweed.endpoint(), "not-the-secret-key");
    let refused = worker(&pool, &wrong, 0);
    let refused = refused.run(&()).await.unwrap_err().to_string();
    assert!(refused.contains(&format!("s3://{BUCKET}/in")) && refused.contains("403 Forbidden"), "{refused}");
    // The S3 error code and the HTTP status, never the body: the server's error document quotes
    // the access key id (and what it signed), and this line becomes the job's status.
    assert!(refused.contains("<Code>SignatureDoesNotMatch</Code>"), "{refused}");
    assert!(!refused.contains(ACCESS_KEY) && !refused.contains("StringToSign"), "{refused}");
}
