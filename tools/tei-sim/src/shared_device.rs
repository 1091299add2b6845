//! One device shared by several simulators, as the TEI processes of pods given replicas of one
//! time-sliced GPU share it: batches of different simulators run one at a time, and a simulator
//! flooded with work slows down its neighbours' batches the way a busy GPU does. The time a batch
//! waits for the device counts in its inference time (TEI measures the batch end to end), not in
//! the device's busy time.
//!
//! Turns are handed out in the order they were asked for, as a GPU's time-slicing serves the
//! contexts that have work round-robin. A plain lock on a file cannot do that: on unlock the
//! kernel wakes every waiter and whichever runs first wins, so a busy simulator that asks again at
//! once can win the device back before a neighbour that has waited longer, once per competitor.
//! So this is a queue lock built from byte-range locks on one file (every co-located simulator
//! opens it: a path on a shared volume, or in /tmp for processes on one machine):
//!
//! - `<path>.turn` holds the next ticket number; a simulator takes a ticket under an exclusive
//!   lock of that file, and while still holding it locks byte `ticket` of `<path>`: its place in
//!   the line, held until its batch is done;
//! - it then waits for byte `ticket - 1`, its predecessor's place, which frees when that batch is
//!   done (or when its process dies: the kernel drops a dead process's locks, so a crash never
//!   blocks the line).
//!
//! The locks are open file description locks (Linux), so two simulators in one process (the
//! tests) exclude each other as two processes do.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::{FcntlArg, fcntl};
use nix::libc;

use crate::SimError;

#[derive(Debug)]
pub(crate) struct SharedDevice {
    /// Byte `n` locked: ticket `n` is in line or on the device.
    line: File,
    /// The next ticket, as 8 little-endian bytes; locked whole while a ticket is taken.
    counter: File,
    path: PathBuf,
}

fn open_lock_file(path: &Path) -> Result<File, SimError> {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .map_err(|source| SimError::SharedDevice { path: path.to_owned(), source })
}

/// Locks (or with `unlock`, releases) byte `at` of `file`; `wait` blocks until it is free.
fn byte_lock(file: &File, at: u64, lock: bool, wait: bool) -> nix::Result<()> {
    let kind = if lock { libc::F_WRLCK } else { libc::F_UNLCK };
    let range = libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        // Tickets stay far below i64::MAX: one a millisecond for 292 million years.
        l_start: at as libc::off_t,
        l_len: 1,
        // Open file description locks name no process.
        l_pid: 0,
    };
    let arg = if wait { FcntlArg::F_OFD_SETLKW(&range) } else { FcntlArg::F_OFD_SETLK(&range) };
    fcntl(file, arg).map(drop)
}

impl SharedDevice {
    /// Opens (creating them if needed) the files co-located simulators share: `path` and
    /// `<path>.turn`.
    pub(crate) fn open(path: &Path) -> Result<Self, SimError> {
        let mut counter = path.as_os_str().to_owned();
        counter.push(".turn");
        Ok(Self { line: open_lock_file(path)?, counter: open_lock_file(Path::new(&counter))?, path: path.to_owned() })
    }

    /// Takes the next ticket and holds its place in the line (byte `ticket` locked).
    fn take_ticket(&self) -> std::io::Result<u64> {
        self.counter.lock()?;
        let taken = (|| {
            let mut bytes = [0u8; 8];
            let read = self.counter.read_at(&mut bytes, 0)?;
            let ticket = if read == 8 { u64::from_le_bytes(bytes) } else { 0 };
            self.counter.write_all_at(&(ticket + 1).to_le_bytes(), 0)?;
            // Nobody else can hold this byte: tickets are taken one at a time.
            byte_lock(&self.line, ticket, true, false)?;
            Ok(ticket)
        })();
        let _ = self.counter.unlock();
        taken
    }

    /// Blocks until this simulator's turn on the device comes, runs `work` on it, then lets it
    /// go; returns how long it waited. A lock that fails (a filesystem that cannot lock) runs the
    /// work unshared rather than never: the failure is logged.
    pub(crate) fn hold(&self, work: impl FnOnce()) -> Duration {
        let asked = Instant::now();
        let ticket = self.take_ticket().and_then(|ticket| {
            if ticket > 0 {
                // The predecessor's place frees when its batch is done; ours is all we keep.
                byte_lock(&self.line, ticket - 1, true, true)?;
                byte_lock(&self.line, ticket - 1, false, false)?;
            }
            Ok(ticket)
        });
        let waited = asked.elapsed();
        if let Err(error) = &ticket {
            tracing::warn!(path = %self.path.display(), %error, "cannot lock the shared device; running this batch unshared");
        }
        work();
        if let Ok(ticket) = ticket {
            let _ = byte_lock(&self.line, ticket, false, false);
        }
        waited
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Three simulators that ask for the device while a fourth holds it get it in the order
    /// they asked, whatever order the kernel wakes them in.
    #[test]
    fn turns_go_in_the_order_they_were_asked_for() {
        let dir = std::env::temp_dir().join(format!("tei-sim-line-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("device.lock");
        for round in 0..5 {
            let order = Arc::new(Mutex::new(Vec::new()));
            let holder = SharedDevice::open(&path).unwrap();
            let waiting: Vec<SharedDevice> = (0..3).map(|_| SharedDevice::open(&path).unwrap()).collect();
            std::thread::scope(|scope| {
                let (started_tx, started_rx) = std::sync::mpsc::channel();
                let holder = &holder;
                scope.spawn(move || {
                    holder.hold(|| {
                        started_tx.send(()).unwrap();
                        std::thread::sleep(Duration::from_millis(150));
                    })
                });
                started_rx.recv().unwrap();
                for (n, device) in waiting.iter().enumerate() {
                    let order = Arc::clone(&order);
                    scope.spawn(move || device.hold(|| order.lock().unwrap().push(n)));
                    // Each asks after the one before it has its ticket.
                    std::thread::sleep(Duration::from_millis(30));
                }
            });
            assert_eq!(*order.lock().unwrap(), vec![0, 1, 2], "round {round}");
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
