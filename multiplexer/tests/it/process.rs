//! The multiplexer binary as a process: what it logs and how it stops.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use teifleet_testkit::process::ChildGuard;

/// An idle multiplexer stops soon after SIGTERM instead of waiting out its whole drain delay
/// (which exists to keep serving calls while endpoints stop routing here), and its JSON logs
/// carry plain values.
#[test]
fn an_idle_multiplexer_stops_promptly_and_logs_values() {
    let mut command = Command::new(env!("CARGO_BIN_EXE_teifleet-multiplexer"));
    command
        .args(["static", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--max-in-flight", "4"])
        .args(["--upstream", "http://127.0.0.1:9", "--drain-delay", "10m", "--log-format", "json"])
        .stderr(Stdio::piped());
    let mut guard = ChildGuard::spawn("teifleet-multiplexer", command).expect("the binary starts");
    let mut logs = BufReader::new(guard.child_mut().stderr.take().unwrap()).lines();
    let serving =
        logs.by_ref().map_while(Result::ok).find(|line| line.contains("multiplexer serving")).expect("a start-up line");
    let line: serde_json::Value = serde_json::from_str(&serving).expect("JSON logs");
    let admin = line["admin_addr"].as_str().expect("admin_addr is a string");
    assert!(admin.starts_with("127.0.0.1:"), "a plain address, not a Debug string: {serving}");

    let asked = Instant::now();
    let pid = guard.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let status = loop {
        if let Some(status) = guard.child_mut().try_wait().unwrap() {
            break status;
        }
        // Far below the 10-minute drain delay: the process noticed it was idle.
        assert!(asked.elapsed() < Duration::from_secs(60), "still running a minute after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
}

/// What one request at the input cap costs the sidecar: its peak resident memory (VmHWM) stays
/// far under the 256Mi the operator gives the container, while a request past the cap is refused
/// without growing it. (Before the cap, 60,000 one-character inputs took a sidecar to 355 MB.)
#[tokio::test]
async fn a_request_at_the_input_cap_stays_within_a_stated_memory_bound() {
    const PEAK_BOUND_KIB: u64 = 96 * 1024;
    let sim = crate::support::sim(|_| {}).await;
    let mut command = Command::new(env!("CARGO_BIN_EXE_teifleet-multiplexer"));
    command
        .args(["static", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--max-in-flight", "64"])
        .args(["--http-listen", "127.0.0.1:0", "--log-format", "json"])
        .args(["--upstream", &format!("http://{}", sim.addr())])
        .stderr(Stdio::piped());
    let mut guard = ChildGuard::spawn("teifleet-multiplexer", command).expect("the binary starts");
    let mut logs = BufReader::new(guard.child_mut().stderr.take().unwrap()).lines();
    let serving =
        logs.by_ref().map_while(Result::ok).find(|line| line.contains("multiplexer serving")).expect("a start-up line");
    let serving: serde_json::Value = serde_json::from_str(&serving).expect("JSON logs");
    let http: std::net::SocketAddr = serving["http_addr"].as_str().and_then(|a| a.parse().ok()).expect("an address");
    let peak = || -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", guard.id())).expect("the process's status");
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
        line.split_whitespace().nth(1).and_then(|kib| kib.parse().ok()).expect("VmHWM in kB")
    };

    let over = serde_json::json!({"inputs": vec!["a"; 60_000]});
    let answer = crate::http_front::post(http, "/embed", over).await;
    assert_eq!(answer.status, 413, "{}", answer.body);
    let inputs = teifleet_multiplexer::front::http::DEFAULT_MAX_REQUEST_INPUTS;
    let texts: Vec<String> = (0..inputs).map(|i| format!("text number {i} of the largest request allowed")).collect();
    let answer = crate::http_front::post(http, "/embed", serde_json::json!({ "inputs": texts })).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body.as_array().map(Vec::len), Some(inputs));
    let peak_kib = peak();
    eprintln!("peak RSS after a {inputs}-input request: {} MiB", peak_kib / 1024);
    assert!(peak_kib < PEAK_BOUND_KIB, "peak RSS {peak_kib} KiB, bound {PEAK_BOUND_KIB} KiB");
    drop(guard);
    sim.shutdown().await;
}
