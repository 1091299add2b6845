//! Child processes (the binaries under test, helpers) that cannot outlive their test: the guard
//! stops its process when dropped, also when the test panics half-way.

use std::fs::OpenOptions;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::poll::try_eventually;
use crate::{Error, Result};

/// How the guard stops a process that is still running when it is dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnDrop {
    /// SIGKILL: nothing of the process' own shutdown runs.
    Kill,
    /// SIGTERM, then SIGKILL after this grace: the process' own shutdown runs (a leader releases
    /// its lease, say).
    Terminate(Duration),
}

/// A running child process, stopped when dropped (by [`OnDrop::Kill`] unless told otherwise).
#[derive(Debug)]
pub struct ChildGuard {
    name: String,
    child: Child,
    log: Option<PathBuf>,
    on_drop: OnDrop,
}

impl ChildGuard {
    /// Starts `command` as configured (its standard streams as the caller set them).
    pub fn spawn(name: impl Into<String>, mut command: Command) -> Result<Self> {
        let name = name.into();
        let child = command.spawn().map_err(|source| Error::Spawn { name: name.clone(), source })?;
        Ok(Self { name, child, log: None, on_drop: OnDrop::Kill })
    }

    /// Starts `command` with no input and its output and errors in `log`, started afresh: what an
    /// earlier run (or an earlier process of the same name) left there would otherwise be read as
    /// this process's output.
    pub fn spawn_logged(name: impl Into<String>, mut command: Command, log: impl Into<PathBuf>) -> Result<Self> {
        let log = log.into();
        let file_error = |source| Error::File { path: log.clone(), source };
        let out = OpenOptions::new().create(true).write(true).truncate(true).open(&log).map_err(file_error)?;
        let err = out.try_clone().map_err(file_error)?;
        command.stdin(Stdio::null()).stdout(out).stderr(err);
        let mut guard = Self::spawn(name, command)?;
        guard.log = Some(log);
        Ok(guard)
    }

    /// Changes how the process is stopped when the guard is dropped.
    pub fn on_drop(mut self, on_drop: OnDrop) -> Self {
        self.on_drop = on_drop;
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The process itself, e.g. to take a piped stream.
    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    pub fn log_path(&self) -> Option<&Path> {
        self.log.as_deref()
    }

    /// What the process has logged so far (empty without a log file).
    pub fn log_text(&self) -> String {
        self.log.as_ref().and_then(|path| std::fs::read_to_string(path).ok()).unwrap_or_default()
    }

    /// How the process ended, if it has.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Polls `ready` until it holds; fails at once if the process exits meanwhile, or after
    /// `timeout`.
    pub async fn wait_ready<F, Fut>(&mut self, timeout: Duration, mut ready: F) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let what = format!("{} to be ready", self.name);
        let child = &mut self.child;
        let mut exited = None;
        let outcome = try_eventually(&what, timeout, || {
            exited = child.try_wait().ok().flatten();
            let probe = exited.is_none().then(&mut ready);
            async move {
                match probe {
                    Some(probe) => probe.await.then_some(()),
                    // Stop polling: nothing will become ready now.
                    None => Some(()),
                }
            }
        })
        .await;
        match exited {
            Some(status) => Err(Error::Exited { name: self.name.clone(), status, log: self.log.clone() }),
            None => outcome,
        }
    }

    /// SIGKILL, as a crashed node would: no shutdown code runs. Waits for the process to go.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then waits up to `grace` for the process to exit; kills it after that. The exit
    /// status when it went on its own, `None` when it had to be killed.
    pub fn terminate(&mut self, grace: Duration) -> Option<ExitStatus> {
        if let Some(status) = self.exit_status() {
            return Some(status);
        }
        // Through kill(1): sending a signal directly would need unsafe code or another dependency.
        let _ = Command::new("kill").args(["-TERM", &self.id().to_string()]).status();
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Some(status) = self.exit_status() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        None
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if self.exit_status().is_some() {
            return;
        }
        match self.on_drop {
            OnDrop::Kill => self.kill(),
            OnDrop::Terminate(grace) => {
                self.terminate(grace);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut command = Command::new("sh");
        command.args(["-c", script]);
        command
    }

    fn is_running(pid: u32) -> bool {
        Path::new(&format!("/proc/{pid}")).exists()
            && !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z ")
    }

    #[test]
    fn dropping_the_guard_kills_the_process() {
        let guard = ChildGuard::spawn("sleeper", sh("sleep 30")).unwrap();
        let pid = guard.id();
        assert!(is_running(pid));
        drop(guard);
        assert!(!is_running(pid));
    }

    #[test]
    fn terminate_lets_the_process_shut_down_itself() {
        let log = std::env::temp_dir().join(format!("teifleet-testkit-{}.log", std::process::id()));
        let _ = std::fs::remove_file(&log);
        let script = "trap 'echo bye; exit 0' TERM; echo hello; while true; do sleep 0.05; done";
        let mut guard = ChildGuard::spawn_logged("trapper", sh(script), &log).unwrap();
        // The shell says hello once its trap is set: a fixed sleep was too short on a busy machine
        // (the shell not started yet, SIGTERM killed it).
        let started = Instant::now();
        while guard.log_text() != "hello\n" {
            assert!(started.elapsed() < Duration::from_secs(30), "the shell never said hello");
            std::thread::sleep(Duration::from_millis(20));
        }
        let status = guard.terminate(Duration::from_secs(5)).expect("exits on its own");
        assert!(status.success(), "{status}");
        assert_eq!(guard.log_text(), "hello\nbye\n");
        let _ = std::fs::remove_file(&log);
    }

    #[tokio::test]
    async fn waiting_for_a_process_that_exits_fails_at_once() {
        let mut guard = ChildGuard::spawn("quitter", sh("exit 3")).unwrap();
        let started = Instant::now();
        let error = guard.wait_ready(Duration::from_secs(30), || async { false }).await.unwrap_err();
        assert!(matches!(error, Error::Exited { .. }), "{error}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn waiting_ends_when_ready() {
        let mut guard = ChildGuard::spawn("sleeper", sh("sleep 30")).unwrap();
        let mut looks = 0;
        guard
            .wait_ready(Duration::from_secs(5), || {
                looks += 1;
                std::future::ready(looks == 2)
            })
            .await
            .unwrap();
    }
}
