//! The write-ahead log of the embedded store: numbered segment files in `<data dir>/wal/`, each a
//! sequence of records `[length u32 LE][crc32 u32 LE][postcard WalRecord]`.
//!
//! Records are appended, in decision order, by the thread that decided (under the state lock).
//! A checkpoint seals the current segment (starting a new one), writes the sealed segments' ops
//! into the database in one durable transaction, then deletes them. At open, every segment is
//! replayed into the database the same way before anything is loaded: a record whose number the
//! database already holds is skipped, and replay stops at the first record that is torn or does
//! not check out (what a crash in the middle of an append leaves), discarding everything after it.

use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::path::PathBuf;
use std::sync::Arc;

use allot_core::Millis;
use serde::{Deserialize, Serialize};

use super::ops::Op;

/// The directory of the log, in the data directory.
pub const WAL_DIR: &str = "wal";
/// Record header: length and checksum.
const HEADER: usize = 8;
/// A record larger than this is not one (a corrupt length).
const MAX_RECORD: usize = 1 << 30;

/// One logged commit: the ops of one operation (or of a few, in a batch), in order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct WalRecord {
    /// Numbers increase by one per record; the database's `meta.seq` is the last one it holds.
    pub(crate) seq: u64,
    /// The daemon clock when the record was appended.
    pub(crate) clock: Millis,
    pub(crate) ops: Vec<Op>,
}

impl WalRecord {
    /// The record's bytes, header included.
    pub(crate) fn frame(&self) -> Vec<u8> {
        let mut bytes = postcard::to_extend(self, vec![0; HEADER]).expect("records always encode");
        let len = (bytes.len() - HEADER) as u32;
        let crc = crc32fast::hash(&bytes[HEADER..]);
        bytes[..4].copy_from_slice(&len.to_le_bytes());
        bytes[4..HEADER].copy_from_slice(&crc.to_le_bytes());
        bytes
    }
}

/// Reads the records of a segment's bytes, in order, up to the first that is torn or corrupt.
/// Returns them and whether the bytes ended cleanly.
pub(crate) fn records(bytes: &[u8]) -> (Vec<WalRecord>, bool) {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let Some(header) = bytes.get(at..at + HEADER) else { return (out, false) };
        let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
        if len > MAX_RECORD {
            return (out, false);
        }
        let Some(body) = bytes.get(at + HEADER..at + HEADER + len) else { return (out, false) };
        if crc32fast::hash(body) != crc {
            return (out, false);
        }
        match postcard::from_bytes::<WalRecord>(body) {
            Ok(record) => out.push(record),
            Err(_) => return (out, false),
        }
        at += HEADER + len;
    }
    (out, true)
}

/// A segment being appended to.
pub trait Segment: Send + Sync {
    /// Appends `bytes` at the end: when this returns, they have reached the operating system.
    fn append(&self, bytes: &[u8]) -> io::Result<()>;
    /// Makes everything appended durable (fdatasync).
    fn sync(&self) -> io::Result<()>;
    /// Cuts the segment back to `len` bytes (after a failed append).
    fn truncate(&self, len: u64) -> io::Result<()>;
}

/// The segment files of a log; the fault-injection tests wrap them.
pub trait LogFiles: Send + Sync {
    /// Creates segment `number`, empty, with its directory entry durable.
    fn create(&self, number: u64) -> io::Result<Arc<dyn Segment>>;
    /// The numbers of the segments there are, in increasing order.
    fn list(&self) -> io::Result<Vec<u64>>;
    /// Everything segment `number` holds.
    fn read(&self, number: u64) -> io::Result<Vec<u8>>;
    fn remove(&self, number: u64) -> io::Result<()>;
}

/// The log's files in a directory.
pub struct DirLog {
    dir: PathBuf,
}

impl DirLog {
    /// The log in `dir`, created if missing.
    pub fn open(dir: PathBuf) -> io::Result<DirLog> {
        std::fs::create_dir_all(&dir)?;
        Ok(DirLog { dir })
    }

    fn path(&self, number: u64) -> PathBuf {
        self.dir.join(format!("{number:016x}.wal"))
    }
}

impl LogFiles for DirLog {
    fn create(&self, number: u64) -> io::Result<Arc<dyn Segment>> {
        let file = OpenOptions::new().append(true).create(true).truncate(false).open(self.path(number))?;
        // The new file's directory entry must be durable before a record in it is acknowledged.
        File::open(&self.dir)?.sync_all()?;
        Ok(Arc::new(FileSegment { file }))
    }

    fn list(&self) -> io::Result<Vec<u64>> {
        let mut numbers = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let name = entry?.file_name();
            let name = name.to_string_lossy();
            if let Some(number) = name.strip_suffix(".wal").and_then(|hex| u64::from_str_radix(hex, 16).ok()) {
                numbers.push(number);
            }
        }
        numbers.sort_unstable();
        Ok(numbers)
    }

    fn read(&self, number: u64) -> io::Result<Vec<u8>> {
        std::fs::read(self.path(number))
    }

    fn remove(&self, number: u64) -> io::Result<()> {
        match std::fs::remove_file(self.path(number)) {
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }
}

struct FileSegment {
    file: File,
}

impl Segment for FileSegment {
    fn append(&self, bytes: &[u8]) -> io::Result<()> {
        (&self.file).write_all(bytes)
    }

    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn truncate(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedded::ops::{Key, Table};

    fn record(seq: u64) -> WalRecord {
        WalRecord { seq, clock: seq * 10, ops: vec![Op::Put(Table::Pools, Key::Name(format!("p{seq}")), vec![1, 2])] }
    }

    #[test]
    fn records_read_back_up_to_a_torn_tail() {
        let mut bytes = Vec::new();
        for seq in 1..=3 {
            bytes.extend(record(seq).frame());
        }
        let (read, clean) = records(&bytes);
        assert!(clean);
        assert_eq!(read.iter().map(|r| r.seq).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(read[2].ops, record(3).ops);
        // Every cut inside the last record loses that record only.
        let last = record(3).frame().len();
        for cut in 1..last {
            let (read, clean) = records(&bytes[..bytes.len() - cut]);
            assert!(!clean);
            assert_eq!(read.len(), 2, "cut {cut}");
        }
        // A flipped bit in a record stops the replay there.
        let mut flipped = bytes.clone();
        let second = record(1).frame().len() + HEADER + 1;
        flipped[second] ^= 1;
        let (read, clean) = records(&flipped);
        assert!(!clean);
        assert_eq!(read.len(), 1);
    }

    #[test]
    fn segments_are_listed_in_order_and_hold_what_was_appended() {
        let dir = tempfile::tempdir().unwrap();
        let log = DirLog::open(dir.path().join(WAL_DIR)).unwrap();
        for number in [3, 1, 17] {
            let segment = log.create(number).unwrap();
            segment.append(&record(number).frame()).unwrap();
            segment.sync().unwrap();
        }
        std::fs::write(dir.path().join(WAL_DIR).join("notes.txt"), b"not a segment").unwrap();
        assert_eq!(log.list().unwrap(), [1, 3, 17]);
        let (read, clean) = records(&log.read(17).unwrap());
        assert!(clean);
        assert_eq!(read[0].seq, 17);
        log.remove(3).unwrap();
        log.remove(3).unwrap();
        assert_eq!(log.list().unwrap(), [1, 17]);
    }
}
