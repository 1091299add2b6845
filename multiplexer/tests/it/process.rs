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
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--max-in-flight", "4"])
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
