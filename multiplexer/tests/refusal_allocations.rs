//! What a refusal costs the heap: the allocations the sidecar makes to tell a call at a full pool
//! that there is no room (issue: storms from clients that set deadlines). A binary of its own,
//! since it counts every allocation of the process through dhat's global allocator: the service
//! is called in-process, without a client or a socket, so what is counted is the sidecar's own
//! work for one refusal, its answer included.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use teifleet_multiplexer::admission::{Ask, Limits, Priority};
use teifleet_multiplexer::forward::Forwarder;
use teifleet_multiplexer::forward::pools::{PoolSpec, PoolTable};
use teifleet_multiplexer::front::grpc::connections::ConnectionInfo;
use teifleet_multiplexer::front::grpc::service::RpcService;
use teifleet_multiplexer::gate::auth::Gate;
use teifleet_multiplexer::report::metrics::Metrics;
use teifleet_multiplexer::vocab::rpc;

#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

/// Allocations a refusal may make, measured at 10 (27 when tonic wrote the answer): the answer's
/// own (the status, its message and the message percent-encoded, the header map's two tables, the
/// retry hint's value), the call's boxed future (every call has one), and the pool's name copied
/// into the call and into its error. A new allocation on this path fails the test and has to be
/// placed on purpose.
const MOST_ALLOCATIONS_PER_REFUSAL: u64 = 10;

fn embed_request(timeout: &str) -> http::Request<Full<Bytes>> {
    // An EmbedRequest with `inputs: "x"`, framed: a refusal reads none of it.
    let message = [0u8, 0, 0, 0, 3, 0x0a, 1, b'x'];
    http::Request::builder()
        .method("POST")
        .uri("/tei.v1.Embed/Embed")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", timeout)
        .body(Full::new(Bytes::copy_from_slice(&message)))
        .unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn a_refusal_at_a_full_pool_allocates_little_beyond_its_answer() {
    let _profiler = if std::env::var_os("DHAT_PROFILE").is_some() {
        dhat::Profiler::builder().file_name("/tmp/dhat-refusal.json").build()
    } else {
        dhat::Profiler::builder().testing().build()
    };
    let metrics = Metrics::new();
    let pools = Arc::new(PoolTable::new("pool-a", metrics.clone()));
    pools
        .sync(vec![PoolSpec {
            name: "pool-a".into(),
            model: None,
            // Never dialled: a refused call does not go upstream.
            upstream: "http://127.0.0.1:9".into(),
            limits: Some(Limits::new(1, 0, Duration::from_secs(2))),
            remote: false,
            coalesce: false,
            cache: None,
            tenants: Default::default(),
        }])
        .unwrap();
    let pool = pools.get("pool-a").unwrap();
    let _full = pool.admission.try_acquire(&Ask::new(Priority::Standard)).expect("the pool's one permit");
    let forwarder = Arc::new(Forwarder::new(pools.clone(), metrics, "test", 4 << 20));
    let embed = rpc::find("/tei.v1.Embed/Embed").unwrap();
    let door = Arc::new(teifleet_multiplexer::gate::door::HoldBounds::default());
    let service = RpcService::new(embed, forwarder, Arc::new(Gate::off()), Duration::from_secs(10), door);
    let connection = ConnectionInfo { number: 1, transport: None };

    // 100 ms: a short deadline, so the call is told at once rather than held at the door.
    let refuse = |request| async {
        let answer = service.call(request, &connection).await;
        let status = answer.headers().get("grpc-status").expect("a trailers-only answer").clone();
        assert_eq!(status, "8", "RESOURCE_EXHAUSTED");
        drop(answer);
    };
    // The first refusals make what is made once: metric series, the rates' slots, the load
    // report's bytes.
    for _ in 0..100 {
        refuse(embed_request("100m")).await;
    }
    const REFUSALS: u64 = 1000;
    // Made before counting: the client's side of the call.
    let requests: Vec<_> = (0..REFUSALS).map(|_| embed_request("100m")).collect();
    let before = dhat::HeapStats::get();
    for request in requests {
        refuse(request).await;
    }
    let after = dhat::HeapStats::get();
    let per_refusal = (after.total_blocks - before.total_blocks) as f64 / REFUSALS as f64;
    let bytes_per_refusal = (after.total_bytes - before.total_bytes) as f64 / REFUSALS as f64;
    println!("a refusal: {per_refusal:.2} allocations, {bytes_per_refusal:.0} bytes");
    assert!(
        per_refusal <= MOST_ALLOCATIONS_PER_REFUSAL as f64,
        "{per_refusal:.2} allocations per refusal, over {MOST_ALLOCATIONS_PER_REFUSAL}"
    );
    assert!(after.curr_blocks <= before.curr_blocks, "nothing is left behind");
}
