use std::time::Duration;

use teifleet_proto::v1::InfoRequest;
use teifleet_proto::v1::info_client::InfoClient;
use teifleet_tei_sim::{Device, SimConfig, embedding_for};
use tokio::time::Instant;

use crate::common::{bounded, channel, embed_client, embed_request, start};

const DEVICE_TIME: Duration = Duration::from_millis(400);

// One runtime thread: if the spinning ran on it, nothing else could answer until the batch ended.
#[tokio::test(flavor = "current_thread")]
async fn spin_burns_the_device_time_as_cpu_off_the_runtime_and_answers() {
    bounded(async {
        let config = SimConfig {
            device: Device::Spin,
            fixed_latency: DEVICE_TIME,
            per_token_latency: Duration::ZERO,
            ..SimConfig::default()
        };
        let sim = start(config).await;
        let client = embed_client(&sim).await;
        let mut info = InfoClient::new(channel(&sim).await);

        let cpu_before = cpu_time::ProcessTime::now();
        let embed = tokio::spawn({
            let mut client = client.clone();
            async move { client.embed(embed_request("burnt on a CPU")).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let asked = Instant::now();
        info.info(InfoRequest {}).await.expect("Info answers while the device spins");
        // Held up, it would answer only after the rest of the batch (350 ms); the margin is for a busy CI machine.
        assert!(asked.elapsed() < DEVICE_TIME / 2, "the runtime was held up for {:?}", asked.elapsed());
        assert!(!embed.is_finished(), "the batch ended before its device time");

        let answer = embed.await.unwrap().expect("embed answers").into_inner();
        let cpu_used = cpu_before.elapsed();
        // Other tests share the process, so this is a lower bound only.
        assert!(cpu_used >= DEVICE_TIME.mul_f64(0.9), "only {cpu_used:?} of CPU for {DEVICE_TIME:?} of device time");
        assert_eq!(answer.embeddings, embedding_for("burnt on a CPU", 384));
        let meta = answer.metadata.expect("metadata");
        assert!(u128::from(meta.inference_time_ns) >= DEVICE_TIME.as_nanos(), "{meta:?}");
        assert_eq!(sim.stats().batches_run, 1);
        sim.shutdown().await;
    })
    .await;
}

// Dropping a runtime waits for its blocking threads, so a burner that ignored shutdown would hold
// this test for its whole minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_a_spinning_batch() {
    bounded(async {
        let config = SimConfig {
            device: Device::Spin,
            fixed_latency: Duration::from_secs(60),
            per_token_latency: Duration::ZERO,
            ..SimConfig::default()
        };
        let sim = start(config).await;
        let mut client = embed_client(&sim).await;
        let embed = tokio::spawn(async move { client.embed(embed_request("never finishes")).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let stopping = Instant::now();
        sim.shutdown().await;
        assert!(stopping.elapsed() < Duration::from_secs(5), "shutdown took {:?}", stopping.elapsed());
        assert!(embed.await.unwrap().is_err());
    })
    .await;
}

#[test]
fn device_modes_parse_from_flags() {
    assert_eq!("sleep".parse::<Device>().unwrap(), Device::Sleep);
    assert_eq!("SPIN".parse::<Device>().unwrap(), Device::Spin);
    assert_eq!(Device::default(), Device::Sleep);
    assert!("gpu".parse::<Device>().is_err());
}

/// A slowed-down device (a throttled or shared GPU) takes that many times its device time per
/// batch, from the next batch on, set through the library or the admin port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowed_device_takes_longer_per_batch() {
    crate::common::bounded(async {
        let config = teifleet_tei_sim::SimConfig {
            fixed_latency: std::time::Duration::from_millis(20),
            per_token_latency: std::time::Duration::ZERO,
            admin_listen: Some("127.0.0.1:0".parse().unwrap()),
            ..Default::default()
        };
        let sim = crate::common::start(config).await;
        let mut client = crate::common::embed_client(&sim).await;
        let inference = |response: tonic::Response<teifleet_proto::v1::EmbedResponse>| {
            response.into_inner().metadata.expect("metadata").inference_time_ns
        };
        let normal = inference(client.embed(crate::common::embed_request("x")).await.unwrap());
        assert!(normal >= 20_000_000, "{normal}");
        sim.set_slowdown(3.0);
        let slow = inference(client.embed(crate::common::embed_request("x")).await.unwrap());
        assert!(slow >= 60_000_000, "three times the device time: {slow}");
        let admin = sim.admin_addr().expect("admin port");
        let (status, _) = crate::common::http(admin, "POST", "/device/slowdown/1").await;
        assert_eq!(status, 200);
        let (status, body) = crate::common::http(admin, "POST", "/device/slowdown/-1").await;
        assert_eq!(status, 400, "{body}");
        sim.shutdown().await;
    })
    .await;
}

/// Simulators given one lock file share one device: a batch of each, asked for at once, run one
/// after the other, so the batch that ran second reports (as TEI would) an inference time that
/// covers both batches' device time, while each device counts only its own batch as busy time.
/// Without the shared file the same two batches run side by side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulators_sharing_a_device_run_their_batches_one_at_a_time() {
    bounded(async {
        let dir = std::env::temp_dir().join(format!("tei-sim-shared-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lock = dir.join("device.lock");
        let config = |shared: Option<std::path::PathBuf>| SimConfig {
            fixed_latency: Duration::from_millis(150),
            per_token_latency: Duration::ZERO,
            shared_device: shared,
            ..SimConfig::default()
        };
        // Inference times reported by two simulators' one batch each, asked for at once, and the
        // two devices' busy times.
        async fn side_by_side(a: SimConfig, b: SimConfig) -> ([u64; 2], u64) {
            let (a, b) = (start(a).await, start(b).await);
            let (mut ca, mut cb) = (embed_client(&a).await, embed_client(&b).await);
            let (ra, rb) = tokio::join!(ca.embed(embed_request("a")), cb.embed(embed_request("b")));
            let inference = |r: tonic::Response<teifleet_proto::v1::EmbedResponse>| {
                r.into_inner().metadata.expect("metadata").inference_time_ns
            };
            let times = [inference(ra.unwrap()), inference(rb.unwrap())];
            let busy_ns = (a.stats().device_busy_us + b.stats().device_busy_us) * 1000;
            a.shutdown().await;
            b.shutdown().await;
            (times, busy_ns)
        }

        let (shared, busy) = side_by_side(config(Some(lock.clone())), config(Some(lock.clone()))).await;
        let (second, first) = (shared.iter().max().unwrap(), shared.iter().min().unwrap());
        assert!(*second >= busy - busy / 20, "the second batch waited for the first: {shared:?}, busy {busy} ns");
        assert!(*first < busy - busy / 4, "the first did not wait: {shared:?}, busy {busy} ns");

        let (apart, busy) = side_by_side(config(None), config(None)).await;
        assert!(apart.iter().all(|t| *t < busy - busy / 4), "devices of their own overlap: {apart:?}, busy {busy} ns");
        std::fs::remove_dir_all(&dir).ok();
    })
    .await;
}

/// A simulator kept busy does not keep a shared device from a neighbour that waits: the
/// neighbour's batch runs next, after the one running when it asked, not after however many
/// batches the busy one could grab back first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_simulator_lets_a_waiting_neighbour_have_the_next_turn() {
    bounded(async {
        let dir = std::env::temp_dir().join(format!("tei-sim-turns-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lock = dir.join("device.lock");
        let config = SimConfig {
            fixed_latency: Duration::from_millis(40),
            per_token_latency: Duration::ZERO,
            max_batch_requests: Some(1),
            shared_device: Some(lock),
            ..SimConfig::default()
        };
        let (busy, quiet) = (start(config.clone()).await, start(config).await);
        // Eight calls queued on the busy one: a batch after another, for 320 ms.
        let mut flood = Vec::new();
        for n in 0..8 {
            let mut client = embed_client(&busy).await;
            flood.push(tokio::spawn(async move { client.embed(embed_request(&format!("flood {n}"))).await }));
        }
        tokio::time::sleep(Duration::from_millis(60)).await;
        let before = busy.stats().batches_run;
        embed_client(&quiet).await.embed(embed_request("quiet")).await.expect("the quiet call is answered");
        let during = busy.stats().batches_run - before;
        assert!(during <= 2, "the busy simulator ran {during} batches while its neighbour waited for one");
        for call in flood {
            call.await.unwrap().expect("the flood is answered");
        }
        busy.shutdown().await;
        quiet.shutdown().await;
        std::fs::remove_dir_all(&dir).ok();
    })
    .await;
}
