//! A simulated disk under the real embedded store: its database (a redb storage backend) and its
//! write-ahead log's segments, in memory, outliving the store so that a store opened again finds
//! them as a crash left them.
//!
//! Every byte written is in the disk's "page cache" at once, and on the platter only once synced:
//! a crash of the process ([`SimDisk::crash`]) keeps everything written; a power loss
//! ([`SimDisk::power_loss`]) keeps what was synced plus a prefix of what was not, cut anywhere
//! (a torn write). Creating and removing a segment is durable at once (the real log syncs its
//! directory before using a segment). A write or a sync can be made to fail once
//! ([`SimDisk::fail_next`]), as a full or failing disk does. Nothing here reads a clock or a random
//! source of its own: the simulation decides everything.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use allot_store::embedded::wal::{LogFiles, Segment, SEGMENT_BYTES};
use memmap2::{Mmap, MmapMut};

/// Which operation fails next ([`SimDisk::fail_next`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The next write (an append, a database write or resize): no space left.
    Write,
    /// The next sync (of a segment or of the database): an I/O error, nothing made durable.
    Sync,
}

/// The disk: shared by every store opened on it in one simulation.
#[derive(Debug, Clone, Default)]
pub struct SimDisk(Arc<Mutex<Platters>>);

#[derive(Debug, Default)]
struct Platters {
    database: File,
    segments: BTreeMap<u64, File>,
    fail_next: Option<Fault>,
    /// How many faults happened (operations failed on demand).
    failed: u64,
    /// The process is dead: what it still does (a store's destructor) never reaches the disk.
    frozen: bool,
}

/// One file: what readers see, and what survives a power loss.
#[derive(Debug, Default, Clone)]
struct File {
    /// What the file holds now (the page cache).
    cached: Vec<u8>,
    /// What a sync made durable.
    durable: Vec<u8>,
    /// The writes since the last sync, in order: replayed in part over `durable` at a power loss.
    unsynced: Vec<Change>,
}

#[derive(Debug, Clone)]
enum Change {
    Write { offset: usize, bytes: Vec<u8> },
    SetLen(usize),
}

impl Change {
    fn apply(&self, to: &mut Vec<u8>) {
        match self {
            Change::Write { offset, bytes } => {
                let end = offset + bytes.len();
                if to.len() < end {
                    to.resize(end, 0);
                }
                to[*offset..end].copy_from_slice(bytes);
            }
            Change::SetLen(len) => to.resize(*len, 0),
        }
    }

    fn len(&self) -> usize {
        match self {
            Change::Write { bytes, .. } => bytes.len(),
            Change::SetLen(_) => 1,
        }
    }
}

impl File {
    fn change(&mut self, change: Change) {
        change.apply(&mut self.cached);
        self.unsynced.push(change);
    }

    fn sync(&mut self) {
        for change in self.unsynced.drain(..) {
            change.apply(&mut self.durable);
        }
    }

    /// A power loss: the durable bytes, then the first `kept` bytes of the unsynced writes (the
    /// last one of them torn where the count ends).
    fn lose_power(&mut self, kept: usize) {
        let mut left = kept;
        for change in self.unsynced.drain(..) {
            if left == 0 {
                break;
            }
            match change {
                Change::Write { offset, mut bytes } if bytes.len() > left => {
                    bytes.truncate(left);
                    Change::Write { offset, bytes }.apply(&mut self.durable);
                    left = 0;
                }
                change => {
                    left -= change.len().min(left);
                    change.apply(&mut self.durable);
                }
            }
        }
        self.cached = self.durable.clone();
    }

    fn unsynced_bytes(&self) -> usize {
        self.unsynced.iter().map(Change::len).sum()
    }
}

impl SimDisk {
    pub fn new() -> SimDisk {
        SimDisk::default()
    }

    fn platters(&self) -> MutexGuard<'_, Platters> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The next operation of `fault`'s kind fails (once).
    pub fn fail_next(&self, fault: Fault) {
        self.platters().fail_next = Some(fault);
    }

    /// How many operations failed on demand so far.
    pub fn faults(&self) -> u64 {
        self.platters().failed
    }

    /// The process is killed: from now until [`SimDisk::crash`] or [`SimDisk::power_loss`],
    /// writes and syncs are dropped (they succeed, as far as the dead process can tell).
    pub fn kill(&self) {
        self.platters().frozen = true;
    }

    /// The process crashed: the page cache survives, so nothing is lost; a pending fault is
    /// forgotten.
    pub fn crash(&self) {
        let mut platters = self.platters();
        platters.fail_next = None;
        platters.frozen = false;
    }

    /// The machine lost power: every file keeps what was synced, plus the share `torn` (in
    /// thousandths) of its unsynced bytes, the last write kept cut where that share ends.
    pub fn power_loss(&self, torn: u32) {
        let mut platters = self.platters();
        platters.fail_next = None;
        platters.frozen = false;
        let share = |file: &File| file.unsynced_bytes() * torn.min(1000) as usize / 1000;
        let kept = share(&platters.database);
        platters.database.lose_power(kept);
        for file in platters.segments.values_mut() {
            let kept = share(file);
            file.lose_power(kept);
        }
    }

    /// Bytes held (the page cache), for the record of a run.
    pub fn bytes(&self) -> usize {
        let platters = self.platters();
        platters.database.cached.len() + platters.segments.values().map(|f| f.cached.len()).sum::<usize>()
    }

    /// Whether an operation of `kind` happens: `Ok(false)` while frozen, an error when it is
    /// the fault asked for.
    fn check(&self, kind: Fault) -> io::Result<bool> {
        let mut platters = self.platters();
        if platters.frozen {
            return Ok(false);
        }
        if platters.fail_next == Some(kind) {
            platters.fail_next = None;
            platters.failed += 1;
            return Err(match kind {
                Fault::Write => io::Error::new(io::ErrorKind::StorageFull, "no space left on device (simulated)"),
                Fault::Sync => io::Error::other("fsync failed: input/output error (simulated)"),
            });
        }
        Ok(true)
    }

    /// The database's storage, for `redb`.
    pub fn database(&self) -> SimDatabase {
        SimDatabase(self.clone())
    }

    /// The log's segment files.
    pub fn log(&self) -> Box<dyn LogFiles> {
        Box::new(SimLog(self.clone()))
    }
}

/// The database file of a [`SimDisk`].
#[derive(Debug)]
pub struct SimDatabase(SimDisk);

impl redb::StorageBackend for SimDatabase {
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.platters().database.cached.len() as u64)
    }

    fn read(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let platters = self.0.platters();
        let offset = offset as usize;
        match platters.database.cached.get(offset..offset + len) {
            Some(bytes) => Ok(bytes.to_vec()),
            None => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "a read past the end of the database")),
        }
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        if self.0.check(Fault::Write)? {
            self.0.platters().database.change(Change::SetLen(len as usize));
        }
        Ok(())
    }

    fn sync_data(&self, _eventual: bool) -> io::Result<()> {
        if self.0.check(Fault::Sync)? {
            self.0.platters().database.sync();
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        if self.0.check(Fault::Write)? {
            let bytes = data.to_vec();
            self.0.platters().database.change(Change::Write { offset: offset as usize, bytes });
        }
        Ok(())
    }
}

struct SimLog(SimDisk);

struct SimSegment {
    disk: SimDisk,
    number: u64,
}

impl LogFiles for SimLog {
    fn create(&self, number: u64, _bytes: u64) -> io::Result<Arc<dyn Segment>> {
        if self.0.check(Fault::Write)? {
            self.0.platters().segments.insert(number, File::default());
        }
        Ok(Arc::new(SimSegment { disk: self.0.clone(), number }))
    }

    fn list(&self) -> io::Result<Vec<u64>> {
        Ok(self.0.platters().segments.keys().copied().collect())
    }

    fn read(&self, number: u64) -> io::Result<Mmap> {
        let platters = self.0.platters();
        let Some(file) = platters.segments.get(&number) else {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("no log segment {number}")));
        };
        // The bytes written, then zeros (a real segment is zero-filled to its size): the first
        // zero header ends the records.
        let mut map = MmapMut::map_anon(file.cached.len() + 64)?;
        map[..file.cached.len()].copy_from_slice(&file.cached);
        map.make_read_only()
    }

    fn sync(&self, number: u64) -> io::Result<()> {
        if !self.0.check(Fault::Sync)? {
            return Ok(());
        }
        if let Some(file) = self.0.platters().segments.get_mut(&number) {
            file.sync();
        }
        Ok(())
    }

    fn remove(&self, number: u64) -> io::Result<()> {
        let mut platters = self.0.platters();
        if !platters.frozen {
            platters.segments.remove(&number);
        }
        Ok(())
    }
}

impl SimSegment {
    fn with_file<T>(&self, change: impl FnOnce(&mut File) -> T) -> io::Result<T> {
        let mut platters = self.disk.platters();
        match platters.segments.get_mut(&self.number) {
            Some(file) => Ok(change(file)),
            None => Err(io::Error::new(io::ErrorKind::NotFound, format!("log segment {} was removed", self.number))),
        }
    }
}

impl Segment for SimSegment {
    fn append(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        if offset + bytes.len() as u64 > SEGMENT_BYTES {
            return Err(io::Error::other("a log record past the end of its segment"));
        }
        if !self.disk.check(Fault::Write)? {
            return Ok(());
        }
        self.with_file(|file| file.change(Change::Write { offset: offset as usize, bytes: bytes.to_vec() }))
    }

    fn sync(&self) -> io::Result<()> {
        if !self.disk.check(Fault::Sync)? {
            return Ok(());
        }
        let mut platters = self.disk.platters();
        // A removed segment's handle still syncs (a real file descriptor outlives its name):
        // a checkpoint removes a segment once sealed and folded, while a sync of it may be due.
        if let Some(file) = platters.segments.get_mut(&self.number) {
            file.sync();
        }
        Ok(())
    }

    fn capacity(&self) -> u64 {
        SEGMENT_BYTES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_power_loss_keeps_what_was_synced_and_a_torn_prefix_of_the_rest() {
        let mut file = File::default();
        file.change(Change::Write { offset: 0, bytes: vec![1; 4] });
        file.sync();
        file.change(Change::Write { offset: 4, bytes: vec![2; 4] });
        file.change(Change::Write { offset: 8, bytes: vec![3; 4] });
        file.lose_power(6);
        assert_eq!(file.cached, [1, 1, 1, 1, 2, 2, 2, 2, 3, 3]);
        assert!(file.unsynced.is_empty());
    }

    #[test]
    fn a_crash_keeps_everything_written_and_a_fault_fails_once() {
        let disk = SimDisk::new();
        let log = disk.log();
        let segment = log.create(1, SEGMENT_BYTES).unwrap();
        segment.append(0, b"abc").unwrap();
        disk.fail_next(Fault::Sync);
        assert!(segment.sync().is_err());
        segment.sync().unwrap();
        segment.append(3, b"def").unwrap();
        disk.crash();
        assert_eq!(&log.read(1).unwrap()[..6], b"abcdef");
        disk.power_loss(0);
        assert_eq!(&log.read(1).unwrap()[..6], b"abc\0\0\0");
    }
}
