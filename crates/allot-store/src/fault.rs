//! A redb storage backend that fails on demand, like a full disk: for fault-injection tests of
//! the embedded store and of everything above it. Not used by the daemon.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use redb::backends::FileBackend;

/// A file backend whose writes, resizes and syncs fail with "no space left on device" while
/// `failing` is set. Reads always work.
#[derive(Debug)]
pub struct FlakyDisk {
    inner: FileBackend,
    failing: Arc<AtomicBool>,
}

impl FlakyDisk {
    /// Opens (or creates) `path`; `failing` switches the failures on and off.
    pub fn open(path: &Path, failing: Arc<AtomicBool>) -> std::io::Result<FlakyDisk> {
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        let inner = FileBackend::new(file).map_err(|err| std::io::Error::other(err.to_string()))?;
        Ok(FlakyDisk { inner, failing })
    }

    fn check(&self) -> std::io::Result<()> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(std::io::Error::new(std::io::ErrorKind::StorageFull, "no space left on device"));
        }
        Ok(())
    }
}

impl redb::StorageBackend for FlakyDisk {
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }

    fn read(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        self.inner.read(offset, len)
    }

    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.check()?;
        self.inner.set_len(len)
    }

    fn sync_data(&self, eventual: bool) -> std::io::Result<()> {
        self.check()?;
        self.inner.sync_data(eventual)
    }

    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.check()?;
        self.inner.write(offset, data)
    }
}
