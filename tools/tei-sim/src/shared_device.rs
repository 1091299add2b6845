//! One device shared by several simulators, as the TEI processes of pods given replicas of one
//! time-sliced GPU share it: each batch runs while its simulator holds an exclusive lock on a
//! file every co-located simulator opens (a path on a shared volume, or in /tmp for processes on
//! one machine), so batches of different simulators run one at a time, and a simulator flooded
//! with work slows down its neighbours' batches the way a busy GPU does. The time a batch waits
//! for the device counts in its inference time (TEI measures the batch end to end), not in the
//! device's busy time.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::SimError;

#[derive(Debug)]
pub(crate) struct SharedDevice {
    file: File,
    path: PathBuf,
}

impl SharedDevice {
    /// Opens (creating it if needed) the lock file co-located simulators share.
    pub(crate) fn open(path: &Path) -> Result<Self, SimError> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|source| SimError::SharedDevice { path: path.to_owned(), source })?;
        Ok(Self { file, path: path.to_owned() })
    }

    /// Blocks until this simulator holds the device, runs `work` on it, then lets it go; returns
    /// how long it waited. A lock that fails (the file's filesystem cannot lock) runs the work
    /// unshared rather than never: the failure is logged.
    pub(crate) fn hold(&self, work: impl FnOnce()) -> Duration {
        let asked = Instant::now();
        let locked = self.file.lock();
        let waited = asked.elapsed();
        if let Err(error) = &locked {
            tracing::warn!(path = %self.path.display(), %error, "cannot lock the shared device; running this batch unshared");
        }
        work();
        if locked.is_ok() {
            let _ = self.file.unlock();
        }
        waited
    }
}
