//! One device shared by several simulators, as the TEI processes of pods given replicas of one
//! time-sliced GPU share it: each batch runs while its simulator holds an exclusive lock on a
//! file every co-located simulator opens (a path on a shared volume, or in /tmp for processes on
//! one machine), so batches of different simulators run one at a time, and a simulator flooded
//! with work slows down its neighbours' batches the way a busy GPU does. The time a batch waits
//! for the device counts in its inference time (TEI measures the batch end to end), not in the
//! device's busy time.
//!
//! A second file, `<path>.turn`, makes the simulators take turns as a GPU's time-slicing does: a
//! lock on a file goes to whichever waiter the kernel wakes first, and a busy simulator that lets
//! the device go and asks again at once could win it back before a neighbour that has waited is
//! even running. So a simulator first takes the turn, then waits for the device holding it, and
//! gives the turn up once the device is its own: the next in line is the only one waiting for the
//! device, and the one that just had it must line up behind it.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::SimError;

#[derive(Debug)]
pub(crate) struct SharedDevice {
    device: File,
    turn: File,
    path: PathBuf,
}

fn open_lock_file(path: &Path) -> Result<File, SimError> {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|source| SimError::SharedDevice { path: path.to_owned(), source })
}

impl SharedDevice {
    /// Opens (creating them if needed) the lock files co-located simulators share: `path` and
    /// `<path>.turn`.
    pub(crate) fn open(path: &Path) -> Result<Self, SimError> {
        let mut turn = path.as_os_str().to_owned();
        turn.push(".turn");
        Ok(Self { device: open_lock_file(path)?, turn: open_lock_file(Path::new(&turn))?, path: path.to_owned() })
    }

    /// Blocks until this simulator holds the device, in its turn, runs `work` on it, then lets it
    /// go; returns how long it waited. A lock that fails (a filesystem that cannot lock) runs the
    /// work unshared rather than never: the failure is logged.
    pub(crate) fn hold(&self, work: impl FnOnce()) -> Duration {
        let asked = Instant::now();
        let turn = self.turn.lock();
        let device = self.device.lock();
        if turn.is_ok() {
            let _ = self.turn.unlock();
        }
        let waited = asked.elapsed();
        if let Err(error) = turn.as_ref().and(device.as_ref()) {
            tracing::warn!(path = %self.path.display(), %error, "cannot lock the shared device; running this batch unshared");
        }
        work();
        if device.is_ok() {
            let _ = self.device.unlock();
        }
        waited
    }
}
