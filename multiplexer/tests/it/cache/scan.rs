//! The local tier's bound: a scan of ten times its size once does not push out what callers keep
//! asking for, and however many distinct inputs come, however large their answers, the tier
//! holds no more bytes than its size.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;
use teifleet_tei_sim::SimHandle;

use super::fleet::*;
use crate::support::sim;

/// Inputs per HTTP request of a scan: TEI's batch, which the HTTP front sends as it is.
const PER_REQUEST: usize = 32;

/// A quick simulator: the scans are thousands of inputs on a 2-core machine.
async fn quick_sim() -> SimHandle {
    sim(|config| {
        config.fixed_latency = Duration::from_micros(200);
        config.per_token_latency = Duration::ZERO;
    })
    .await
}

/// Polls the local tier's bytes every 20 ms until dropped, keeping the most seen.
struct BytesWatch {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(f64, usize)>,
}

impl BytesWatch {
    fn start(replica: &Replica) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let admin = replica.admin;
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let (mut most, mut looks) = (0.0f64, 0);
                while !stop.load(Ordering::Relaxed) {
                    if let Some(text) = teifleet_testkit::http::get(admin, "/metrics").await {
                        let bytes =
                            crate::support::metric_sum(&text, "teifleet_cache_local_bytes", &[("pool", POOL_NAME)]);
                        most = most.max(bytes);
                        looks += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                (most, looks)
            }
        });
        Self { stop, task }
    }

    /// The most bytes seen, and how many looks there were.
    async fn most(self) -> (f64, usize) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// Sends `texts` through `/embed`, [`PER_REQUEST`] a request, `callers` requests at a time.
async fn embed_all(replica: &Replica, path: &str, texts: &[String], callers: usize) {
    let chunks: Vec<Vec<String>> = texts.chunks(PER_REQUEST).map(<[String]>::to_vec).collect();
    let queue = Arc::new(std::sync::Mutex::new(chunks));
    let mut tasks = Vec::new();
    for _ in 0..callers {
        let (queue, http, path) = (queue.clone(), replica.http, path.to_owned());
        tasks.push(tokio::spawn(async move {
            loop {
                let Some(chunk) = queue.lock().unwrap().pop() else { return };
                let (status, _, body) = crate::cache::fleet::http(http, &path, &[], json!({ "inputs": chunk })).await;
                assert_eq!(status, 200, "{body}");
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// W-TinyLFU at work: a hot set asked for several times, then a scan of 10× the tier's size of
/// distinct texts asked once: at least 80% of the hot set still hits (TEI's counter says how many
/// it had to do again), and the tier's bytes never went over its size during the scan.
#[tokio::test]
async fn a_scan_does_not_push_out_the_hot_set_and_bytes_stay_within_the_size() {
    const SIZE: &str = "1Mi";
    const HOT: usize = 40;
    let sim = quick_sim().await;
    let replica = Replica::start(&[PoolConfig::cached(POOL_NAME, &sim, SIZE)], &[]).await;
    let size = bytes(SIZE);
    let hot = texts("hot", HOT, 10);
    // The doorkeeper's room, held from the start (`cache::local`): not entries.
    let reserved = replica.local_bytes().await;
    for _ in 0..4 {
        embed_all(&replica, "/embed", &hot, 1).await;
    }
    let entries = replica.metric("teifleet_cache_local_entries", &[("pool", POOL_NAME)]).await;
    let warm_bytes = replica.local_bytes().await;
    let per_entry = (warm_bytes - reserved) / entries;
    assert!(per_entry >= 1536.0, "an entry holds at least its 384 f32s: {per_entry} B");
    let scan_len = (10.0 * size / per_entry).ceil() as usize;
    let evictions_before = replica.metric("teifleet_cache_evictions_total", &[("pool", POOL_NAME)]).await;
    let skipped = [("pool", POOL_NAME), ("tier", "local_skipped")];
    let skipped_before = replica.metric("teifleet_cache_stored_total", &skipped).await;

    let watch = BytesWatch::start(&replica);
    let work_before = work(&sim);
    embed_all(&replica, "/embed", &texts("scan", scan_len, 10), 4).await;
    let (most, looks) = watch.most().await;
    assert_eq!(work(&sim) - work_before, scan_len as u64, "the scan was all misses");
    let evicted = replica.metric("teifleet_cache_evictions_total", &[("pool", POOL_NAME)]).await - evictions_before;
    let turned_away = replica.metric("teifleet_cache_stored_total", &skipped).await - skipped_before;
    eprintln!(
        "scan of {scan_len} texts ({per_entry:.0} B an entry, 10x {size} B): peak local bytes {most} over {looks} looks, \
         {evicted} evictions, {turned_away} answers not kept"
    );
    assert!(looks >= 3, "the bytes were watched during the scan");
    assert!(most <= size, "local bytes {most} over the size {size}");
    // The tier holds a tenth of the scan at most: the rest was evicted or never kept.
    assert!(evicted + turned_away >= (scan_len / 2) as f64, "a scan of 10x the size met a full tier");

    let work_before = work(&sim);
    embed_all(&replica, "/embed", &hot, 1).await;
    let redone = work(&sim) - work_before;
    eprintln!("hot set after the scan: {redone} of {HOT} missed");
    assert!(
        redone * 5 <= HOT as u64,
        "{redone} of the {HOT} hot texts were pushed out by the scan (warmed while the tier held {warm_bytes} B of {size} B)"
    );
}

/// A hostile caller sending many distinct inputs with large answers (sparse embeddings of long
/// texts of distinct words, tens of KB each) in parallel: the tier's bytes stay within its size
/// throughout, and the answers are still right.
#[tokio::test]
async fn many_distinct_large_answers_keep_local_bytes_within_the_size() {
    const SIZE: &str = "256Ki";
    let sim = quick_sim().await;
    let replica = Replica::start(&[PoolConfig::cached(POOL_NAME, &sim, SIZE)], &[]).await;
    let size = bytes(SIZE);
    // 1,500 distinct words a text: a sparse answer of about 1,500 values.
    let long: Vec<String> =
        (0..96).map(|t| (0..1500).map(|w| format!("w{t}x{w}")).collect::<Vec<_>>().join(" ")).collect();
    let watch = BytesWatch::start(&replica);
    embed_all(&replica, "/embed_sparse", &long, 4).await;
    embed_all(&replica, "/embed", &texts("many", 3000, 4), 4).await;
    let (most, looks) = watch.most().await;
    let now = replica.local_bytes().await;
    eprintln!("distinct inputs: peak local bytes {most} over {looks} looks, {now} at the end, size {size}");
    assert!(looks >= 3);
    assert!(most <= size && now <= size, "local bytes {most} over the size {size}");
    assert!(now > size / 4.0, "the tier was in use: {now} B");
}
