//! A certificate that expires while in force: the sidecar binary (static mode, the set from
//! files it re-reads every second) keeps serving it, as nothing better was given, and says so:
//! its report to the operator marks it expired, it logs one warning at the expiry, and
//! `teifleet_tls_certificate_expiry_timestamp_seconds` held its end all along. A renewed set in
//! the files clears the state.

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use teifleet_crds::{SidecarAdmission, SidecarTls};
use teifleet_testkit::certs::{Authority, Issued};
use teifleet_testkit::poll::eventually;
use teifleet_testkit::process::ChildGuard;
use teifleet_wire::sidecar_admin::ADMISSION_PATH;

/// The warning the sidecar logs when the certificate in force expires.
const EXPIRED_WARNING: &str = "the TLS certificate in force has expired";

/// Generous: the debug binary on a busy two-core machine.
const WITHIN: Duration = Duration::from_secs(60);

fn write_set(dir: &Path, issued: &Issued) {
    // The key first, then the certificate: the sidecar compares the whole set with the last one
    // read, and a half-written pair is refused and retried a second later.
    std::fs::write(dir.join("tls.key"), &issued.key_pem).unwrap();
    std::fs::write(dir.join("tls.crt"), &issued.chain_pem).unwrap();
}

/// The sidecar's TLS report, as the operator reads it.
async fn tls_report(admin: SocketAddr) -> Option<SidecarTls> {
    let body = teifleet_testkit::http::get(admin, ADMISSION_PATH).await?;
    serde_json::from_str::<SidecarAdmission>(&body).ok()?.tls
}

async fn expiry_gauge(admin: SocketAddr) -> Option<f64> {
    let text = teifleet_testkit::http::get(admin, "/metrics").await?;
    teifleet_testkit::prom::value(&text, "teifleet_tls_certificate_expiry_timestamp_seconds")
}

/// Now, in whole seconds, as a certificate holds its end.
fn whole_seconds_from_now(seconds: u64) -> SystemTime {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    UNIX_EPOCH + Duration::from_secs(now + seconds)
}

fn unix(moment: SystemTime) -> f64 {
    moment.duration_since(UNIX_EPOCH).unwrap().as_secs() as f64
}

#[tokio::test]
async fn a_certificate_that_expires_in_force_is_reported_expired_once_and_a_renewal_clears_it() {
    let dir: PathBuf = std::env::temp_dir().join(format!("teifleet-tls-expiry-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = Authority::new("expiry CA");
    let first = ca.server(&["127.0.0.1"]);
    write_set(&dir, &first);

    let mut command = Command::new(env!("CARGO_BIN_EXE_teifleet-multiplexer"));
    command
        .args(["static", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--max-in-flight", "4"])
        .args(["--upstream", "http://127.0.0.1:9", "--drain-delay", "0s", "--log-format", "json"])
        .arg("--tls-cert")
        .arg(dir.join("tls.crt"))
        .arg("--tls-key")
        .arg(dir.join("tls.key"))
        .stderr(Stdio::piped());
    let mut guard = ChildGuard::spawn("teifleet-multiplexer", command).expect("the binary starts");
    // Every log line, read on a thread of its own so the pipe never fills.
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut logs = BufReader::new(guard.child_mut().stderr.take().unwrap()).lines();
    let serving =
        logs.by_ref().map_while(Result::ok).find(|line| line.contains("multiplexer serving")).expect("a start-up line");
    let line: serde_json::Value = serde_json::from_str(&serving).expect("JSON logs");
    let admin: SocketAddr = line["admin_addr"].as_str().expect("admin_addr").parse().expect("an address");
    let reader = {
        let lines = lines.clone();
        std::thread::spawn(move || {
            for line in logs.map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        })
    };
    let warnings = || lines.lock().unwrap().iter().filter(|line| line.contains(EXPIRED_WARNING)).count();

    let report = eventually("the first certificate reported", WITHIN, || async {
        tls_report(admin).await.filter(|tls| tls.serving.as_ref().is_some_and(|s| s.serial == first.serial))
    })
    .await;
    assert_eq!((report.expired, report.error), (false, None));

    // A set that ends a few seconds from now, valid when it is read. Should the machine be so
    // busy that the sidecar reads it only after its end (refused: not valid now), a longer one.
    let mut validity = 4;
    let (ending, end) = loop {
        let end = whole_seconds_from_now(validity);
        let ending = ca.server_valid_until(&["127.0.0.1"], end);
        write_set(&dir, &ending);
        let report = eventually("the short-lived set read", WITHIN, || async {
            let tls = tls_report(admin).await?;
            let served = tls.serving.as_ref().is_some_and(|s| s.serial == ending.serial);
            // Not a key read before its certificate (refused once, then read whole): this one's
            // end passed before it was read.
            let too_late = tls.error.as_deref().is_some_and(|e| e.contains(&ending.serial) && e.contains("not now"));
            (served || too_late).then_some(tls)
        })
        .await;
        if report.serving.as_ref().is_some_and(|s| s.serial == ending.serial) {
            break (ending, end);
        }
        assert!(validity < 60, "the sidecar never read a set before its end: {:?}", report.error);
        validity *= 2;
    };
    // The gauge holds the end of the set in force (set just after the set is).
    eventually("the gauge at the short-lived set's end", WITHIN, || async {
        expiry_gauge(admin).await.filter(|at| *at == unix(end))
    })
    .await;
    assert_eq!(warnings(), 0, "no warning before the end");

    // Past its end: still served (nothing better was given), reported expired, warned about once.
    let expired =
        eventually("the report to say expired", WITHIN, || async { tls_report(admin).await.filter(|tls| tls.expired) })
            .await;
    assert!(SystemTime::now() > end, "not reported expired before its end");
    assert_eq!(expired.serving.map(|s| s.serial), Some(ending.serial.clone()), "still the one served");
    assert_eq!(expired.error, None, "nothing was refused");
    eventually("the expiry warning", WITHIN, || std::future::ready((warnings() > 0).then_some(()))).await;
    assert_eq!(expiry_gauge(admin).await, Some(unix(end)));

    // A renewal in the files: in force, and the state cleared.
    let renewed = ca.server(&["127.0.0.1"]);
    write_set(&dir, &renewed);
    let report = eventually("the renewed certificate reported", WITHIN, || async {
        tls_report(admin).await.filter(|tls| tls.serving.as_ref().is_some_and(|s| s.serial == renewed.serial))
    })
    .await;
    assert_eq!((report.expired, report.error), (false, None));
    eventually("the gauge at the renewed end, ahead", WITHIN, || async {
        expiry_gauge(admin).await.filter(|at| *at > unix(SystemTime::now()))
    })
    .await;
    assert_eq!(warnings(), 1, "one warning for the expired certificate, none for the renewal");

    guard.kill();
    reader.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
