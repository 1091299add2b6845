//! A progress line on stderr for long runs: a bar redrawn in place on a terminal, a plain line
//! every few seconds otherwise (CI logs), nothing for runs that end quickly.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::sink::Sink;

pub struct Progress {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Progress {
    /// `total`: the request count when known up front (closed loop), else progress is by time.
    pub(crate) fn start(sink: Arc<Sink>, total: Option<u64>, duration: Duration) -> Self {
        let (stop, mut stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            let terminal = std::io::stderr().is_terminal();
            let every = if terminal { Duration::from_millis(250) } else { Duration::from_secs(5) };
            let start = Instant::now();
            let mut drew = false;
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    () = tokio::time::sleep(every) => {}
                }
                // Short runs print nothing at all.
                if start.elapsed() < Duration::from_secs(2) {
                    continue;
                }
                let sent = sink.sent.load(Ordering::Relaxed);
                let (answered, ok) = sink.counts();
                let elapsed = start.elapsed();
                let done = match total {
                    Some(total) if total > 0 => sent as f64 / total as f64,
                    _ => elapsed.as_secs_f64() / duration.as_secs_f64().max(1e-9),
                };
                let line = line(done, elapsed, sent, answered, ok);
                let mut err = std::io::stderr().lock();
                if terminal {
                    let _ = write!(err, "\r{line}");
                } else {
                    let _ = writeln!(err, "{line}");
                }
                drew = terminal;
            }
            if drew {
                let _ = writeln!(std::io::stderr());
            }
        });
        Self { stop, task }
    }

    pub(crate) async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// `[#########...........]  45% 12.3s sent 1200 answered 1100 ok 1000`
pub fn line(done: f64, elapsed: Duration, sent: u64, answered: u64, ok: u64) -> String {
    const WIDTH: usize = 24;
    let done = done.clamp(0.0, 1.0);
    let filled = (done * WIDTH as f64).round() as usize;
    format!(
        "[{}{}] {:>3.0}% {:>6.1}s sent {sent} answered {answered} ok {ok}",
        "#".repeat(filled),
        ".".repeat(WIDTH - filled),
        done * 100.0,
        elapsed.as_secs_f64()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bar_fills_with_progress_and_clamps() {
        let half = line(0.5, Duration::from_secs(3), 10, 9, 8);
        assert!(half.starts_with("[############............]  50%"), "{half}");
        assert!(half.ends_with("sent 10 answered 9 ok 8"));
        assert!(line(7.0, Duration::ZERO, 0, 0, 0).contains("100%"));
    }
}
