//! Its own test binary: it sends SIGTERM to the whole process.

use std::time::Duration;

use teifleet_runtime::shutdown::{self, Signal};

#[tokio::test]
async fn sigterm_sent_before_the_future_is_awaited_is_kept_for_it() {
    let stop = shutdown::signal().expect("handlers install");
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &std::process::id().to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success());
    let received = tokio::time::timeout(Duration::from_secs(5), stop).await.expect("the signal arrives");
    assert_eq!(received, Signal::Terminate);
}
