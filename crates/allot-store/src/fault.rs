//! A redb storage backend and write-ahead log files that fail on demand, like a full or failing
//! disk: for fault-injection tests of the embedded store and of everything above it. Not used by
//! the daemon.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redb::backends::FileBackend;

use crate::embedded::wal::{DirLog, LogFiles, Segment};
use crate::embedded::Durability;

/// Which operations fail, switched on and off while the store runs.
#[derive(Debug, Default)]
pub struct Faults {
    /// Writes, resizes and syncs fail: a full disk ("no space left on device").
    pub fail_writes: AtomicBool,
    /// Only syncs fail: the data reached the OS but could not be made durable.
    pub fail_syncs: AtomicBool,
    /// The log's syncs write, then fail: the data reached the disk, but the sync said it did not.
    pub fail_after_syncs: AtomicBool,
    /// Every sync of the log waits this long before it starts: a slow disk.
    pub sync_delay: Mutex<Duration>,
    /// What the log's segments were asked to do, in order.
    pub log_events: Mutex<Vec<LogEvent>>,
}

/// One thing a log segment was asked to do (see [`Faults::log_events`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogEvent {
    /// Segment `segment`'s `n`th append (from 1) is written.
    Append { segment: u64, n: u64 },
    /// A sync of `segment` starts.
    SyncStart { segment: u64 },
    /// Segment `segment` is created (a checkpoint starts the next one).
    Created { segment: u64 },
    /// A spare segment is ready, made ahead ([`LogFiles::prepare_spare`]).
    SpareMade,
    /// A sync of `segment` ended: the segment's first `covers` appends, written before it started,
    /// are durable.
    SyncEnd { segment: u64, covers: u64 },
}

impl Faults {
    fn record(&self, event: LogEvent) {
        self.log_events.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(event);
    }
}

/// A file backend that fails as its [`Faults`] say. Reads always work.
#[derive(Debug)]
pub struct FlakyDisk {
    inner: FileBackend,
    faults: Arc<Faults>,
}

impl FlakyDisk {
    /// Opens (or creates) `path`.
    pub fn open(path: &Path, faults: Arc<Faults>) -> std::io::Result<FlakyDisk> {
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        let inner = FileBackend::new(file).map_err(|err| std::io::Error::other(err.to_string()))?;
        Ok(FlakyDisk { inner, faults })
    }

    fn check_write(&self) -> std::io::Result<()> {
        if self.faults.fail_writes.load(Ordering::SeqCst) {
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
        self.check_write()?;
        self.inner.set_len(len)
    }

    fn sync_data(&self, eventual: bool) -> std::io::Result<()> {
        self.check_write()?;
        if self.faults.fail_syncs.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("fsync failed: input/output error"));
        }
        self.inner.sync_data(eventual)
    }

    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.check_write()?;
        self.inner.write(offset, data)
    }
}

/// The write-ahead log's files in a directory, failing as their [`Faults`] say. Reads always work.
pub struct FlakyLog {
    inner: DirLog,
    faults: Arc<Faults>,
}

struct FlakySegment {
    number: u64,
    inner: Arc<dyn Segment>,
    faults: Arc<Faults>,
    appends: AtomicU64,
}

fn full_disk(faults: &Faults) -> std::io::Result<()> {
    if faults.fail_writes.load(Ordering::SeqCst) {
        return Err(std::io::Error::new(std::io::ErrorKind::StorageFull, "no space left on device"));
    }
    Ok(())
}

impl LogFiles for FlakyLog {
    fn create(&self, number: u64, bytes: u64) -> std::io::Result<Arc<dyn Segment>> {
        full_disk(&self.faults)?;
        let inner = self.inner.create(number, bytes)?;
        self.faults.record(LogEvent::Created { segment: number });
        Ok(Arc::new(FlakySegment { number, inner, faults: self.faults.clone(), appends: AtomicU64::new(0) }))
    }

    fn list(&self) -> std::io::Result<Vec<u64>> {
        self.inner.list()
    }

    fn read(&self, number: u64) -> std::io::Result<memmap2::Mmap> {
        self.inner.read(number)
    }

    fn prepare_spare(&self, bytes: u64) -> std::io::Result<()> {
        full_disk(&self.faults)?;
        self.inner.prepare_spare(bytes)?;
        self.faults.record(LogEvent::SpareMade);
        Ok(())
    }

    fn remove(&self, number: u64) -> std::io::Result<()> {
        self.inner.remove(number)
    }

    fn sync(&self, number: u64) -> std::io::Result<()> {
        full_disk(&self.faults)?;
        if self.faults.fail_syncs.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("fsync failed: input/output error"));
        }
        self.inner.sync(number)
    }
}

impl Segment for FlakySegment {
    fn append(&self, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
        full_disk(&self.faults)?;
        self.inner.append(offset, bytes)?;
        let n = self.appends.fetch_add(1, Ordering::SeqCst) + 1;
        self.faults.record(LogEvent::Append { segment: self.number, n });
        Ok(())
    }

    fn sync(&self) -> std::io::Result<()> {
        full_disk(&self.faults)?;
        if self.faults.fail_syncs.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("fsync failed: input/output error"));
        }
        self.faults.record(LogEvent::SyncStart { segment: self.number });
        let covers = self.appends.load(Ordering::SeqCst);
        let delay = *self.faults.sync_delay.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if !delay.is_zero() {
            // A slow disk is the fault asked for: the sync takes this long.
            std::thread::sleep(delay);
        }
        self.inner.sync()?;
        if self.faults.fail_after_syncs.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("fsync failed after writing: input/output error"));
        }
        self.faults.record(LogEvent::SyncEnd { segment: self.number, covers });
        Ok(())
    }

    fn cut(&self, offset: u64) -> std::io::Result<()> {
        full_disk(&self.faults)?;
        self.inner.cut(offset)
    }

    fn capacity(&self) -> u64 {
        self.inner.capacity()
    }
}

/// Opens an embedded store in `dir` on a [`FlakyDisk`] and a [`FlakyLog`], at the disk level of
/// durability; the returned [`Faults`] switch failures on and off.
pub fn open_flaky_store(dir: &Path) -> Result<(crate::EmbeddedStore, Arc<Faults>), crate::embedded::OpenError> {
    open_flaky_store_with(dir, Durability::Disk, Arc::new(crate::clock::SystemTime))
}

/// [`open_flaky_store`] at any level of durability, reading the time from `time`.
pub fn open_flaky_store_with(
    dir: &Path,
    durability: Durability,
    time: Arc<dyn crate::clock::TimeSource>,
) -> Result<(crate::EmbeddedStore, Arc<Faults>), crate::embedded::OpenError> {
    let faults = Arc::new(Faults::default());
    let path = dir.join(crate::embedded::DB_FILE);
    let make = {
        let faults = faults.clone();
        move || FlakyDisk::open(&path, faults.clone()).expect("the test database file opens")
    };
    let log_dir = dir.join(crate::embedded::wal::WAL_DIR);
    let inner = DirLog::open(log_dir.clone(), durability)
        .map_err(|source| crate::embedded::OpenError::DataDir { path: log_dir, source })?;
    let log = Box::new(FlakyLog { inner, faults: faults.clone() });
    let events = dir.join(crate::embedded::EVENTS_DIR);
    Ok((crate::EmbeddedStore::open_with_backend(make, log, events, durability, time)?, faults))
}
