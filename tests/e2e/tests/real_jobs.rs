//! An embedding job as shipped, on the local cluster's real node: an `EmbeddingJob` reads a JSONL
//! corpus from a PersistentVolumeClaim, runs as an Indexed Job of `teifleet-job` workers through a
//! pool of 3 simulator replicas, and writes Parquet vectors to another claim.
//!
//! - Every input row comes out exactly once (checked by id), with a vector, or with its error
//!   (a line that is not JSON, a row without text, an empty text).
//! - A worker pod and a pool pod deleted mid-job lose nothing: the killed worker's replacement
//!   redoes at most the shard it was on, and the job still ends with one row per input row.
//! - The status counts rows and shards as they finish, and ends `Complete`.
//!
//! The claims are bound to hostPath volumes under a directory of this machine (the real node's
//! kubelet runs here), so the test writes the corpus and reads the vectors directly.
//!
//! Needs the real node and the images, the `job` image among them (see `real_pods.rs`); without
//! them it says it was skipped and passes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use arrow_array::{Array, FixedSizeListArray, StringArray};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;
use teifleet_crds::{EmbeddingJob, labels};
use teifleet_e2e::claims::{delete_host_volumes, host_claim, open_to_every_user, ready_for_jobs};
use teifleet_e2e::pools::create_pool;
use teifleet_e2e::real::{install_chart, operator_name, pool_template, wait_ready_pods};
use teifleet_e2e::{admin_client, eventually, helm, kubectl};

const RELEASE: &str = "tfjobs";
const POOL: &str = "corpus";
const JOB: &str = "reindex";
/// Rows of the corpus, in two files.
const ROWS: usize = 30_000;
/// Bytes per shard: about 1,000 rows of this corpus each, so the job has dozens of shards.
const SHARD_BYTES: &str = "64Ki";
/// Input rows that are bad on purpose, by id, and the words their error must contain.
const BAD: [(&str, &str); 2] = [("bad-empty", "empty"), ("bad-no-text", "text")];

#[tokio::test]
async fn a_job_embeds_a_corpus_once_per_row_through_a_worker_and_a_replica_lost() {
    let client = admin_client().await;
    let Some((ns, images)) = ready_for_jobs(&client, &["job"], "real-jobs").await else { return };
    let namespace = ns.name.clone();
    install_chart(&client, &namespace, RELEASE).await;

    let host = std::env::temp_dir().join(format!("teifleet-e2e-jobs-{}", std::process::id()));
    let (input, output) = (host.join("in"), host.join("out"));
    let ids = write_corpus(&input);
    std::fs::create_dir_all(&output).unwrap();
    open_to_every_user(&host);
    host_claim(&client, &namespace, "corpus-in", &input).await;
    host_claim(&client, &namespace, "vectors-out", &output).await;

    let tei_sim = &images["tei-sim"].1;
    create_pool(
        &client,
        &namespace,
        POOL,
        json!({
            "replicas": 3,
            "gpu": { "type": "cpu" },
            "tei": { "image": tei_sim, "extraArgs": ["--fixed-latency=20ms"] },
            "concurrency": { "maxInFlight": 48, "maxInFlightPerReplica": 16, "maxQueued": 256 },
            "template": pool_template(),
        }),
    )
    .await;
    // Three pods starting at once on the machine's two cores: the real tests' own allowance.
    let pods = Api::<Pod>::namespaced(client.clone(), &namespace);
    wait_ready_pods(&pods, &labels::pool_selector(POOL), 3).await;

    let jobs = Api::<EmbeddingJob>::namespaced(client.clone(), &namespace);
    let job: EmbeddingJob = serde_json::from_value(json!({
        "apiVersion": "teifleet.dev/v1alpha1",
        "kind": "EmbeddingJob",
        "metadata": { "name": JOB },
        "spec": {
            "poolRef": { "name": POOL },
            "input": { "store": { "pvc": { "claimName": "corpus-in" } }, "format": "jsonl" },
            "output": { "store": { "pvc": { "claimName": "vectors-out" } } },
            "workers": 2,
            "shardBytes": SHARD_BYTES,
            "rowsPerCall": 256,
            "template": pool_template(),
        },
    }))
    .unwrap();
    let started = Instant::now();
    jobs.create(&PostParams::default(), &job).await.expect("the job is accepted");

    // Mid-job: a worker and a pool replica deleted at once, once some shards are done.
    eventually("a few shards done", Duration::from_secs(240), || async {
        let done = jobs.get(JOB).await.ok()?.status?.shards_done;
        (done >= 3).then_some(())
    })
    .await;
    let worker = pods
        .list(&ListParams::default().labels(&format!("job-name={JOB}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .expect("a running worker");
    let replica = pods.list(&ListParams::default().labels(&labels::pool_selector(POOL))).await.unwrap().items.remove(0);
    let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
    let worker_name = worker.metadata.name.clone().unwrap();
    pods.delete(&worker_name, &now).await.unwrap();
    pods.delete(replica.metadata.name.as_deref().unwrap(), &now).await.unwrap();
    println!("deleted worker {worker_name} and pool pod {:?} mid-job", replica.metadata.name);

    let finished = eventually("the job complete", Duration::from_secs(600), || async {
        let job = jobs.get(JOB).await.ok()?;
        let status = job.status.clone()?;
        let condition = |kind: &str| status.conditions.iter().any(|c| c.type_ == kind && c.status == "True");
        assert!(!condition("Failed"), "the job failed: {status:?}");
        condition("Complete").then_some(status)
    })
    .await;
    let took = started.elapsed();
    println!(
        "{} rows ({} failed) in {} shards, {took:?}: {:.0} rows/s with a worker and a replica deleted mid-job",
        finished.rows_done,
        finished.rows_failed,
        finished.shards_done,
        finished.rows_done as f64 / took.as_secs_f64()
    );

    let rows = read_output(&output);
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for row in &rows {
        *seen.entry(row.id.clone()).or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(twice.is_empty(), "ids written more than once: {twice:?}");
    let missing: Vec<_> = ids.iter().filter(|id| !seen.contains_key(*id)).take(5).collect();
    assert!(missing.is_empty(), "ids never written: {missing:?}");
    assert_eq!(rows.len(), ids.len(), "one output row per input row");
    for (id, words) in BAD {
        let row = rows.iter().find(|r| r.id == id).unwrap();
        let error = row.error.as_deref().unwrap_or_default();
        assert!(row.dim.is_none() && error.contains(words), "{id}: {row:?}");
    }
    let good = rows.iter().filter(|r| r.error.is_none()).count();
    assert_eq!(good, ROWS, "every good row has its vector");
    assert!(rows.iter().filter_map(|r| r.dim).all(|dim| dim > 0));
    assert_eq!(
        finished.rows_done as usize,
        ids.len() + 1,
        "the status counts every row, the line that is not JSON too"
    );
    assert_eq!(finished.rows_failed as usize, BAD.len() + 1, "the bad rows, and the line that is not JSON");

    // The progress above was read with the chart's operator identity, which holds no read of
    // ConfigMaps: only the job's own Role lets it get that one ConfigMap.
    let operator = format!("--as=system:serviceaccount:{namespace}:{}", operator_name(RELEASE));
    for verb in ["get", "list", "watch", "patch"] {
        let (ok, said) = kubectl(&["auth", "can-i", verb, "configmaps", "-A", &operator]);
        assert!(!ok && said.trim() == "no", "the operator may {verb} ConfigMaps cluster-wide: {said}");
    }
    let progress = format!("configmaps/{JOB}-progress");
    let (ok, said) = kubectl(&["auth", "can-i", "get", &progress, "-n", &namespace, &operator]);
    assert!(ok, "the job's progress reader Role lets the operator read its progress: {said}");
    let (ok, said) = kubectl(&["auth", "can-i", "get", "configmaps/kube-root-ca.crt", "-n", &namespace, &operator]);
    assert!(!ok, "and no other ConfigMap: {said}");

    let (ok, out) = helm(&["uninstall", RELEASE, "-n", &namespace, "--wait", "--timeout", "60s"]);
    assert!(ok, "{out}");
    delete_host_volumes(&client, &namespace, &["corpus-in", "vectors-out"]).await;
    std::fs::remove_dir_all(&host).ok();
}

/// Two JSONL files of the corpus with the bad rows among them (and one line that is not JSON);
/// returns every id the output must hold (the line that is not JSON has none: its row's id is
/// null, and it is counted by the failed rows).
fn write_corpus(dir: &Path) -> Vec<String> {
    std::fs::create_dir_all(dir).unwrap();
    let mut ids = Vec::new();
    for (file, range) in [("part-a.jsonl", 0..ROWS / 2), ("part-b.jsonl", ROWS / 2..ROWS)] {
        let mut text = String::new();
        for i in range {
            let id = format!("doc-{i}");
            text.push_str(
                &json!({ "id": id, "text": format!("document {i} of the corpus, about topic {}", i % 97) }).to_string(),
            );
            text.push('\n');
            ids.push(id);
        }
        if file == "part-b.jsonl" {
            text.push_str(&json!({ "id": "bad-empty", "text": "" }).to_string());
            text.push('\n');
            text.push_str(&json!({ "id": "bad-no-text", "body": "no text field" }).to_string());
            text.push('\n');
            text.push_str("this line is not JSON\n");
            ids.extend(BAD.iter().map(|(id, _)| (*id).to_owned()));
        }
        std::fs::write(dir.join(file), text).unwrap();
    }
    ids
}

/// One output row: its id, its vector's length (none when it failed) and its error.
#[derive(Debug)]
struct OutputRow {
    id: String,
    dim: Option<usize>,
    error: Option<String>,
}

/// Every row of every `part-*.parquet` under `dir`.
fn read_output(dir: &Path) -> Vec<OutputRow> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "parquet"))
        .collect();
    files.sort();
    let mut rows = Vec::new();
    for path in files {
        let file = std::fs::File::open(&path).unwrap();
        let reader =
            parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file).unwrap().build().unwrap();
        for batch in reader {
            let batch = batch.unwrap();
            let id = batch.column_by_name("id").unwrap();
            let ids = id.as_any().downcast_ref::<StringArray>().expect("JSONL ids are strings");
            let vectors = batch.column_by_name("embedding").unwrap();
            let vectors = vectors.as_any().downcast_ref::<FixedSizeListArray>().unwrap();
            let errors = batch.column_by_name("error").unwrap();
            let errors = errors.as_any().downcast_ref::<StringArray>().unwrap();
            for i in 0..batch.num_rows() {
                rows.push(OutputRow {
                    id: if ids.is_null(i) { String::new() } else { ids.value(i).to_owned() },
                    dim: vectors.is_valid(i).then(|| vectors.value_length() as usize),
                    error: errors.is_valid(i).then(|| errors.value(i).to_owned()),
                });
            }
        }
    }
    // The line that is not JSON has no id: it is not one of the corpus' ids.
    rows.retain(|row| !row.id.is_empty());
    rows
}
