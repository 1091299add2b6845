//! The multiplexer binary in front of a TEI simulator on loopback, as it runs in a pod (static
//! mode, the sidecar's 256Mi memory limit), with what the attacks measure: its peak resident
//! memory (VmHWM, reset between rows through `/proc/PID/clear_refs`), whether it is alive, and
//! every line it logged (a panic's message and backtrace are not JSON, and say "panicked").

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use teifleet_testkit::process::ChildGuard;

/// The bound on the sidecar's peak resident memory under any attack.
pub const PEAK_BOUND_KIB: u64 = 200 * 1000;

/// Resident memory past which a sidecar is replaced before the next row.
const RETAINED_KIB: u64 = 80 * 1000;

/// The flags every sidecar of the suite runs with: a pool of 32 in flight and 64 queued, the pod's
/// memory limit, everything else at its default (the bounds under test are the defaults).
const FLAGS: &[&str] = &["--max-in-flight", "32", "--max-queued", "64", "--memory-limit", "256Mi", "--pool", "default"];

/// The pool's name, which tei-manager's `Target.instance_name` names.
pub const POOL: &str = "default";

pub struct Sidecar {
    guard: ChildGuard,
    upstream: SocketAddr,
    pub grpc: SocketAddr,
    pub admin: SocketAddr,
    pub http: SocketAddr,
    logs: Arc<Mutex<Vec<String>>>,
    /// How many log lines an earlier check already looked at.
    checked: usize,
}

impl Sidecar {
    /// Starts the binary and waits until it is ready (its upstream seen healthy).
    pub async fn start(upstream: SocketAddr) -> Self {
        let sidecar = Self::spawn(upstream);
        let admin = sidecar.admin;
        let ready = || async move { teifleet_testkit::http::get(admin, "/readyz").await };
        teifleet_testkit::poll::eventually("the sidecar ready", std::time::Duration::from_secs(20), ready).await;
        sidecar
    }

    fn spawn(upstream: SocketAddr) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_teifleet-multiplexer"));
        command
            .args(["static", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .args(["--http-listen", "127.0.0.1:0", "--log-format", "json"])
            .args(["--upstream", &format!("http://{upstream}")])
            .args(FLAGS)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut guard = ChildGuard::spawn("teifleet-multiplexer", command).expect("the binary starts");
        let mut lines = BufReader::new(guard.child_mut().stderr.take().expect("stderr piped")).lines();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let mut http = None;
        let serving = loop {
            let line = lines.next().and_then(Result::ok).expect("the sidecar logs that it serves");
            logs.lock().unwrap().push(line.clone());
            let json: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            if let Some(addr) = json["http_addr"].as_str() {
                http = addr.parse().ok();
            }
            if line.contains("multiplexer serving") {
                break json;
            }
        };
        // Kept for the panic check, and drained so the process never blocks on a full pipe.
        let kept = logs.clone();
        std::thread::spawn(move || lines.map_while(Result::ok).for_each(|line| kept.lock().unwrap().push(line)));
        let addr = |key: &str| serving[key].as_str().and_then(|a| a.parse().ok()).expect("an address");
        Self {
            grpc: addr("grpc_addr"),
            admin: addr("admin_addr"),
            http: http.expect("the HTTP front's address"),
            upstream,
            guard,
            logs,
            checked: 0,
        }
    }

    fn status_kib(&self, field: &str) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.guard.id())).ok()?;
        let line = status.lines().find(|l| l.starts_with(field))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// The peak resident memory since the last [`reset_peak`](Self::reset_peak), in KiB.
    pub fn peak_kib(&self) -> u64 {
        self.status_kib("VmHWM:").unwrap_or(0)
    }

    /// Resets the peak to what is resident now (Linux: `5` into `clear_refs`) and returns it.
    pub fn reset_peak(&self) -> u64 {
        std::fs::write(format!("/proc/{}/clear_refs", self.guard.id()), "5").expect("VmHWM can be reset");
        self.status_kib("VmRSS:").unwrap_or(0)
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.guard.child_mut().try_wait(), Ok(None))
    }

    /// A dead sidecar, or one still holding much of what an earlier row made it allocate (the
    /// allocator keeps freed memory), is replaced by a new one on the same simulator: the next row
    /// is attacked, and measured from a fresh start.
    pub async fn refresh(&mut self) {
        if !self.alive() || self.status_kib("VmRSS:").unwrap_or(0) > RETAINED_KIB {
            *self = Self::start(self.upstream).await;
        }
    }

    /// Lines logged since the last call that tell of a panic: the panic hook's own line, or any
    /// line that is not JSON (a backtrace).
    pub fn new_panics(&mut self) -> Vec<String> {
        let logs = self.logs.lock().unwrap();
        let fresh = &logs[self.checked.min(logs.len())..];
        let panics = fresh
            .iter()
            .filter(|l| l.contains("panicked") || serde_json::from_str::<serde_json::Value>(l).is_err())
            .take(5)
            .cloned()
            .collect();
        self.checked = logs.len();
        panics
    }
}
