//! The write-ahead log of the embedded store: numbered segment files in `<data dir>/wal/`, each a
//! sequence of records `[length u32 LE][crc32 u32 LE][postcard WalRecord]`.
//!
//! At length, as one thing: the record format, its framing and its reading in place, and the
//! segment files, which only make sense together; a third of the file is their tests.
//!
//! Segments are made at their full size ([`SEGMENT_BYTES`], zero-filled) and reused once
//! checkpointed, so an append overwrites blocks the file already has: syncing it flushes data
//! only, never the file system's journal (which would also wait for the database's writes). A
//! zero header ends a segment's records; a reused segment may hold older records after the new
//! ones, which replay skips by their numbers.
//!
//! Records are appended, in decision order, by the thread that decided (under the state lock).
//! A checkpoint seals the current segment (starting a new one), writes the sealed segments' ops
//! into the database in one durable transaction, then deletes them. At open, every segment is
//! replayed into the database the same way before anything is loaded: a record whose number the
//! database already holds is skipped, and replay stops at the first record that is torn or does
//! not check out (what a crash in the middle of an append leaves), discarding everything after it.
//! A whole record with a good checksum that does not decode is a newer version's: the open fails
//! and nothing is discarded.

use std::fs::{File, OpenOptions};
use std::io;
use std::ops::ControlFlow;
use std::os::unix::fs::FileExt as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use allot_core::Millis;
use memmap2::{Mmap, MmapMut};
use serde::{Deserialize, Serialize};

use super::ops::{Op, OpRef};
use super::Durability;

/// The directory of the log, in the data directory.
pub const WAL_DIR: &str = "wal";
/// The size a segment is made at (a larger record gets a segment of its own size).
pub const SEGMENT_BYTES: u64 = 16 << 20;
/// How many checkpointed segments are kept for reuse, and how many spares are made ahead.
const SPARES: usize = 2;
/// A spare being made ([`LogFiles::prepare_spare`]); what a crash left of one is made again.
const MAKING_SPARE: &str = "making.tmp";
/// Record header: length and checksum.
pub(crate) const HEADER: usize = 8;
/// The zero header after the last record of a frame.
pub(crate) const TRAILER: usize = HEADER;
/// A record larger than this is not one (a corrupt length).
const MAX_RECORD: usize = 1 << 30;

/// One logged commit: the ops of one operation (or of a few, in a batch), in order, and the
/// change feed's events of the operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WalRecord {
    /// Numbers increase by one per record; the database's `meta.seq` is the last one it holds.
    pub(crate) seq: u64,
    /// The daemon clock when the record was appended.
    pub(crate) clock: Millis,
    pub(crate) ops: Vec<Op>,
    /// Last, added after the format began: a record written before ends where it starts, and
    /// reads as one without events (see [`decode_record_ref`]).
    pub(crate) events: Option<Events>,
}

/// The events of one record, encoded (`records::events::encode_events`): they are durable with
/// the record, and copied as they are into the kept events' files at a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Events {
    /// The revision of the last of them (they increase).
    pub(crate) last: u64,
    #[serde(with = "blob")]
    pub(crate) bytes: Vec<u8>,
}

/// Bytes as postcard writes a `Vec<u8>` (their length, then each byte as it is), copied whole
/// rather than byte by byte.
mod blob {
    use serde::{de, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(bytes)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        struct Bytes;
        impl<'de> de::Visitor<'de> for Bytes {
            type Value = Vec<u8>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("bytes")
            }

            fn visit_bytes<E: de::Error>(self, bytes: &[u8]) -> Result<Vec<u8>, E> {
                Ok(bytes.to_vec())
            }

            fn visit_byte_buf<E: de::Error>(self, bytes: Vec<u8>) -> Result<Vec<u8>, E> {
                Ok(bytes)
            }
        }
        deserializer.deserialize_byte_buf(Bytes)
    }
}

/// Reads the frame `[length][crc][body]` at `at`: its body, or how the frames end there.
pub(crate) fn frame_at(bytes: &[u8], at: usize) -> Result<&[u8], End> {
    if at >= bytes.len() {
        return Err(End::Clean);
    }
    let Some(header) = bytes.get(at..at + HEADER) else { return Err(End::Torn) };
    let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
    if len == 0 && crc == 0 {
        // The zeros a segment is made with: the end of its records.
        return Err(End::Clean);
    }
    if len > MAX_RECORD {
        return Err(End::Torn);
    }
    let Some(body) = bytes.get(at + HEADER..at + HEADER + len) else { return Err(End::Torn) };
    if crc32fast::hash(body) != crc {
        return Err(End::Torn);
    }
    Ok(body)
}

impl WalRecord {
    /// The record's bytes, header included, followed by a zero header ([`TRAILER`] bytes): that
    /// ends the segment's records until the next append overwrites it.
    #[cfg(test)]
    pub(crate) fn frame(&self) -> Vec<u8> {
        let mut bytes = Vec::new();
        self.frame_into(&mut bytes);
        bytes
    }

    /// At least the length of its frame: its ops' and events' bytes, and room for the rest.
    fn framed_bytes(&self) -> usize {
        let events = self.events.as_ref().map_or(0, |events| events.bytes.len());
        HEADER + 64 + self.ops.iter().map(Op::framed_bytes).sum::<usize>() + events + TRAILER
    }

    /// [`WalRecord::frame`] into `bytes` (cleared first), to reuse a buffer.
    pub(crate) fn frame_into(&self, bytes: &mut Vec<u8>) {
        bytes.clear();
        // Reserved whole, so a record of thousands of changes is not copied as the buffer grows.
        bytes.reserve(self.framed_bytes());
        bytes.resize(HEADER, 0);
        *bytes = postcard::to_extend(self, std::mem::take(bytes)).expect("records always encode");
        let len = (bytes.len() - HEADER) as u32;
        let crc = crc32fast::hash(&bytes[HEADER..]);
        bytes[..4].copy_from_slice(&len.to_le_bytes());
        bytes[4..HEADER].copy_from_slice(&crc.to_le_bytes());
        bytes.extend_from_slice(&[0; TRAILER]);
    }
}

/// How a segment's records end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// At the zero header after the last record, or at the end of the bytes.
    Clean,
    /// At a record cut short or failing its checksum: what a crash in the middle of an append
    /// leaves. Nothing from there on was acknowledged at the disk level.
    Torn,
    /// At a record whose checksum holds but that this version cannot decode, at byte `offset`:
    /// written whole by a newer version of allot (a kind of operation this one does not know).
    /// Dropping it and what follows would lose acknowledged changes.
    Unreadable { offset: usize },
}

/// Reads the records of a segment's bytes, in order, up to the first that is torn or that this
/// version cannot read ([`each_record`], copied); returns them and how they end.
#[cfg(test)]
pub(crate) fn records(bytes: &[u8]) -> (Vec<WalRecord>, End) {
    let mut out = Vec::new();
    let end = each_record(bytes, |record| {
        out.push(record.into_record());
        ControlFlow::Continue(())
    });
    (out, end)
}

/// A record read in place: its ops and events borrowed from the segment's bytes (see
/// [`OpRef`]). Decodes exactly what [`WalRecord`] encodes.
#[derive(Debug, Deserialize)]
pub(crate) struct RecordRef<'a> {
    pub(crate) seq: u64,
    pub(crate) clock: Millis,
    #[serde(borrow)]
    pub(crate) ops: Vec<OpRef<'a>>,
    #[serde(borrow)]
    pub(crate) events: Option<EventsRef<'a>>,
}

/// [`Events`] read in place.
#[derive(Debug, Clone, Copy, Deserialize)]
pub(crate) struct EventsRef<'a> {
    pub(crate) last: u64,
    pub(crate) bytes: &'a [u8],
}

impl RecordRef<'_> {
    #[cfg(test)]
    fn into_record(self) -> WalRecord {
        let ops = self.ops.into_iter().map(OpRef::to_op).collect();
        WalRecord { seq: self.seq, clock: self.clock, ops, events: self.events.map(EventsRef::to_events) }
    }
}

impl Events {
    #[cfg(test)]
    pub(crate) fn borrowed(&self) -> EventsRef<'_> {
        EventsRef { last: self.last, bytes: &self.bytes }
    }
}

impl EventsRef<'_> {
    pub(crate) fn to_events(self) -> Events {
        Events { last: self.last, bytes: self.bytes.to_vec() }
    }
}

/// A record written before records carried events, read in place.
#[derive(Deserialize)]
struct OlderRecordRef<'a> {
    seq: u64,
    clock: Millis,
    #[serde(borrow)]
    ops: Vec<OpRef<'a>>,
}

/// Reads one record's body in place: one of the format before records carried events reads as
/// one without them.
fn decode_record_ref(body: &[u8]) -> Option<RecordRef<'_>> {
    postcard::from_bytes::<RecordRef<'_>>(body).ok().or_else(|| {
        let older = postcard::from_bytes::<OlderRecordRef<'_>>(body).ok()?;
        Some(RecordRef { seq: older.seq, clock: older.clock, ops: older.ops, events: None })
    })
}

/// Hands the records of a segment, read in place, to `each`, in order, one at a time, until it
/// breaks (then [`End::Clean`]) or the records end; returns how they end.
pub(crate) fn each_record<'a>(bytes: &'a [u8], mut each: impl FnMut(RecordRef<'a>) -> ControlFlow<()>) -> End {
    let mut at = 0;
    loop {
        let body = match frame_at(bytes, at) {
            Ok(body) => body,
            Err(end) => return end,
        };
        match decode_record_ref(body) {
            Some(record) => {
                if each(record).is_break() {
                    return End::Clean;
                }
            }
            None => return End::Unreadable { offset: at },
        }
        at += HEADER + body.len();
    }
}

/// A segment being appended to.
pub trait Segment: Send + Sync {
    /// Writes `bytes` at `offset` (the end of the records so far). A memory-mapped segment
    /// ([`FileSegment`], the process level) has them in the operating system when this returns;
    /// a direct one ([`DirectSegment`], the disk level) writes them at the next sync.
    fn append(&self, offset: u64, bytes: &[u8]) -> io::Result<()>;
    /// Makes everything appended durable.
    fn sync(&self) -> io::Result<()>;
    /// Ends the records at `offset` (after a failed append), with a zero header.
    fn cut(&self, offset: u64) -> io::Result<()> {
        if offset + HEADER as u64 <= self.capacity() {
            self.append(offset, &[0; HEADER])?;
        }
        Ok(())
    }
    /// How many bytes the segment holds.
    fn capacity(&self) -> u64;
}

/// The segment files of a log; the fault-injection tests wrap them.
pub trait LogFiles: Send + Sync {
    /// Makes segment `number` of at least `bytes` (a checkpointed one reused, or a new one
    /// zero-filled), with its blocks and its directory entry durable.
    fn create(&self, number: u64, bytes: u64) -> io::Result<Arc<dyn Segment>>;
    /// The numbers of the segments there are, in increasing order.
    fn list(&self) -> io::Result<Vec<u64>>;
    /// Everything segment `number` holds, mapped: reading its records touches only their pages,
    /// not the rest of the segment.
    fn read(&self, number: u64) -> io::Result<Mmap>;
    /// Removes a checkpointed segment (keeping it for reuse while there are few spares).
    fn remove(&self, number: u64) -> io::Result<()>;
    /// Makes durable what segment `number` holds (what a process that crashed wrote into it).
    fn sync(&self, number: u64) -> io::Result<()>;
    /// Makes sure spares of at least `bytes` are ready (as many as a checkpoint keeps), so that
    /// the next [`LogFiles::create`] (an append's, or a checkpoint's seal) only renames one:
    /// called off the state lock, ahead of a segment filling up.
    fn prepare_spare(&self, _bytes: u64) -> io::Result<()> {
        Ok(())
    }
}

/// The log's files in a directory.
pub struct DirLog {
    dir: PathBuf,
    /// Segments are written directly ([`DirectSegment`], the disk level), not through memory
    /// maps ([`FileSegment`], the process level).
    direct: bool,
}

impl DirLog {
    /// The log in `dir`, created if missing, written as `durability` needs.
    pub fn open(dir: PathBuf, durability: Durability) -> io::Result<DirLog> {
        std::fs::create_dir_all(&dir)?;
        Ok(DirLog { dir, direct: durability == Durability::Disk })
    }

    fn path(&self, number: u64) -> PathBuf {
        self.dir.join(format!("{number:016x}.wal"))
    }
}

/// Writes `bytes` of zeros into `file` and makes them durable: a segment's blocks, which
/// appends then overwrite.
fn zero_fill(file: &File, bytes: u64) -> io::Result<()> {
    let zeros = vec![0u8; 1 << 20];
    let mut written = 0;
    while written < bytes {
        let chunk = (bytes - written).min(zeros.len() as u64) as usize;
        file.write_all_at(&zeros[..chunk], written)?;
        written += chunk as u64;
    }
    file.sync_all()
}

/// Reserves `bytes` for `file` without writing them (they read as zeros), and makes its size
/// durable; writes zeros where the file system cannot reserve.
fn reserve(file: &File, bytes: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd as _;
    let len = libc::off_t::try_from(bytes).map_err(io::Error::other)?;
    // SAFETY: a plain system call on an open descriptor this function borrows.
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) } {
        0 => file.sync_all(),
        libc::EOPNOTSUPP | libc::EINVAL => zero_fill(file, bytes),
        errno => Err(io::Error::from_raw_os_error(errno)),
    }
}

impl DirLog {
    fn spares(&self) -> io::Result<Vec<PathBuf>> {
        let mut spares = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            if entry.file_name().to_string_lossy().ends_with(".spare") {
                spares.push(entry.path());
            }
        }
        Ok(spares)
    }

    /// The spares of at least `bytes` (whole blocks).
    fn spares_of(&self, bytes: u64) -> io::Result<Vec<PathBuf>> {
        let mut spares = self.spares()?;
        spares.retain(|spare| std::fs::metadata(spare).is_ok_and(|meta| meta.len() >= bytes));
        Ok(spares)
    }

    fn sync_dir(&self) -> io::Result<()> {
        File::open(&self.dir)?.sync_all()
    }
}

impl LogFiles for DirLog {
    fn create(&self, number: u64, bytes: u64) -> io::Result<Arc<dyn Segment>> {
        let path = self.path(number);
        // Whole blocks, for direct writes.
        let bytes = bytes.div_ceil(BLOCK as u64) * BLOCK as u64;
        let mut reused = false;
        for spare in self.spares_of(bytes)? {
            match std::fs::rename(&spare, &path) {
                Ok(()) => {
                    reused = true;
                    break;
                }
                // Taken meanwhile by another create (a checkpoint's, beside an append's).
                Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
                Err(err) => return Err(err),
            }
        }
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path)?;
        if !reused {
            if bytes > SEGMENT_BYTES {
                // For one record larger than a segment (a cycle placing tens of thousands of
                // tasks, a submission of as many), made while every caller waits: it fills the
                // segment at once, so there are no later syncs for zeros to spare the metadata of.
                reserve(&file, bytes)?;
            } else {
                zero_fill(&file, bytes)?;
            }
        }
        // The segment's directory entry must be durable before a record in it is acknowledged.
        self.sync_dir()?;
        let segment: Arc<dyn Segment> = if self.direct {
            drop(file);
            Arc::new(DirectSegment::open(&path)?)
        } else {
            Arc::new(FileSegment::new(file)?)
        };
        // A reused segment starts with older records: end them before anything is appended.
        segment.cut(0)?;
        segment.sync()?;
        Ok(segment)
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

    fn read(&self, number: u64) -> io::Result<Mmap> {
        let file = File::open(self.path(number))?;
        // SAFETY: as for `FileSegment::new`; a segment being read is sealed (nothing appends to
        // it) or read under the state lock (nothing can).
        unsafe { Mmap::map(&file) }
    }

    fn sync(&self, number: u64) -> io::Result<()> {
        File::open(self.path(number))?.sync_data()
    }

    fn prepare_spare(&self, bytes: u64) -> io::Result<()> {
        let bytes = bytes.div_ceil(BLOCK as u64) * BLOCK as u64;
        while self.spares_of(bytes)?.len() < SPARES {
            // Made whole under a name no reader takes, then named a spare.
            let making = self.dir.join(MAKING_SPARE);
            let file = OpenOptions::new().write(true).create(true).truncate(true).open(&making)?;
            zero_fill(&file, bytes)?;
            let name = (0..).map(|n| self.dir.join(format!("made-{n}.spare"))).find(|path| !path.exists());
            std::fs::rename(&making, name.expect("an unused name"))?;
        }
        Ok(())
    }

    fn remove(&self, number: u64) -> io::Result<()> {
        let path = self.path(number);
        let result = if self.spares()?.len() < SPARES {
            std::fs::rename(&path, self.dir.join(format!("{number:016x}.spare")))
        } else {
            std::fs::remove_file(&path)
        };
        match result {
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }
}

/// A segment file, written through a shared memory map: an append is a copy into the operating
/// system's page cache (no system call), which a crash of the process does not lose; `sync`
/// flushes it like any write. The blocks exist (the file is zero-filled when made), so a write
/// into the map never needs new room on a file system that overwrites in place.
struct FileSegment {
    file: File,
    map: Mutex<MmapMut>,
    capacity: u64,
}

impl FileSegment {
    fn new(file: File) -> io::Result<FileSegment> {
        let capacity = file.metadata()?.len();
        // SAFETY: the file is this store's own, in its data directory; it is never truncated
        // while mapped (segments keep their size for life, and are only renamed or removed).
        let map = unsafe { MmapMut::map_mut(&file)? };
        Ok(FileSegment { file, map: Mutex::new(map), capacity })
    }
}

impl Segment for FileSegment {
    fn append(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let mut map = self.map.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(target) = map.get_mut(start..start + bytes.len()) else {
            return Err(io::Error::other("a log record past the end of its segment"));
        };
        target.copy_from_slice(bytes);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        // Writes back the pages written through the map too.
        self.file.sync_data()
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }
}

/// The size and alignment of direct writes: a multiple of every device's logical block size.
const BLOCK: usize = 4096;

/// A segment written with synchronous direct writes (`O_DIRECT | O_DSYNC`) of the blocks that
/// changed since the last sync, from a copy of them kept in memory: an append is a copy into that
/// memory, and a sync is one write that returns once the blocks are on the device. Nothing goes
/// through the page cache, so a sync never write-protects mapped pages (a TLB shootdown across
/// every CPU) nor walks the page cache's large folios, which made most of a memory-mapped
/// segment's sync time. Appended bytes do not reach the operating system before the next sync,
/// so this segment serves the disk level only, where nothing is answered before it.
struct DirectSegment {
    file: File,
    capacity: u64,
    /// The bytes from the first block not known durable to the end of the records and trailer.
    tail: Mutex<Tail>,
    /// Serializes syncs; the aligned buffer they write from.
    writes: Mutex<MmapMut>,
}

struct Tail {
    /// The segment offset of `bytes[0]`, a multiple of [`BLOCK`].
    base: u64,
    bytes: Vec<u8>,
}

impl DirectSegment {
    fn open(path: &std::path::Path) -> io::Result<DirectSegment> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let open = |flags| OpenOptions::new().read(true).write(true).custom_flags(flags).open(path);
        // Direct writes where the file system has them (not tmpfs): synchronous writes otherwise.
        let file = match open(libc::O_DIRECT | libc::O_DSYNC) {
            Err(err) if err.raw_os_error() == Some(libc::EINVAL) => open(libc::O_DSYNC)?,
            other => other?,
        };
        let capacity = file.metadata()?.len();
        Ok(DirectSegment {
            file,
            capacity,
            tail: Mutex::new(Tail { base: 0, bytes: Vec::with_capacity(4 * BLOCK) }),
            writes: Mutex::new(MmapMut::map_anon(4 * BLOCK)?),
        })
    }
}

impl Segment for DirectSegment {
    fn append(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        if offset + bytes.len() as u64 > self.capacity {
            return Err(io::Error::other("a log record past the end of its segment"));
        }
        let mut tail = self.tail.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(at) = offset.checked_sub(tail.base).map(|at| at as usize) else {
            return Err(io::Error::other("a log append before the last synced block"));
        };
        tail.bytes.resize(at, 0);
        tail.bytes.extend_from_slice(bytes);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        let mut buffer = self.writes.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        // Syncs are serialized (by `writes`), so only this one moves `base`.
        let (base, len, blocks) = {
            let tail = self.tail.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let len = tail.bytes.len();
            let blocks = len.div_ceil(BLOCK) * BLOCK;
            if buffer.len() < blocks {
                *buffer = MmapMut::map_anon(blocks.next_power_of_two())?;
            }
            buffer[..len].copy_from_slice(&tail.bytes);
            buffer[len..blocks].fill(0);
            (tail.base, len, blocks)
        };
        self.file.write_all_at(&buffer[..blocks], base)?;
        // Appends go at or after the end of the records, so the blocks before the one that end
        // is in stay as written: the next sync starts at that block.
        let keep = len.saturating_sub(TRAILER) / BLOCK * BLOCK;
        let mut tail = self.tail.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        tail.bytes.drain(..keep);
        tail.base += keep as u64;
        Ok(())
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedded::ops::{Key, Table};

    fn record(seq: u64) -> WalRecord {
        WalRecord {
            seq,
            clock: seq * 10,
            ops: vec![Op::Put(Table::Pools, Key::Name(format!("p{seq}")), vec![1, 2])],
            events: seq.is_multiple_of(2).then(|| Events { last: seq << 20 | 1, bytes: vec![seq as u8; 3] }),
        }
    }

    /// The room a frame reserves holds the whole record, whatever the shape of its ops and the
    /// size of their numbers and lengths: framing never grows (copies) the buffer.
    #[test]
    fn a_frame_reserves_room_for_the_whole_record() {
        let long = "x".repeat(200_000);
        let ops = [
            Op::Put(Table::Tasks, Key::Pair(long.clone(), long.clone()), vec![7; 300_000]),
            Op::Create(Table::Grants, Key::Pair("ns".into(), "t".into()), Vec::new()),
            Op::Put(Table::Sessions, Key::Id(u128::MAX), vec![1; 200]),
            Op::Put(Table::Allocs, Key::Numbered(long.clone(), u64::MAX), vec![2; 70_000]),
            Op::Remove(Table::Runs, Key::Pair(String::new(), long.clone())),
            Op::Remove(Table::Sessions, Key::Id(u128::MAX)),
            Op::RemoveUnder(Table::Access, long),
        ];
        let events = Some(Events { last: u64::MAX, bytes: vec![3; 100_000] });
        for count in [0, 1, ops.len()] {
            let record =
                WalRecord { seq: u64::MAX, clock: u64::MAX, ops: ops[..count].to_vec(), events: events.clone() };
            let (framed, reserved) = (record.frame().len(), record.framed_bytes());
            assert!(framed <= reserved, "{count} ops: {framed} bytes framed, {reserved} reserved");
            // One op at a time, each within its own estimate.
            for op in &ops[..count] {
                let alone = WalRecord { seq: 0, clock: 0, ops: vec![op.clone()], events: None }.frame();
                let bare = WalRecord { seq: 0, clock: 0, ops: Vec::new(), events: None }.frame();
                assert!(alone.len() - bare.len() <= op.framed_bytes(), "{op:?}");
            }
        }
    }

    /// A record's bytes as a segment ends up holding them when another follows.
    fn bare(seq: u64) -> Vec<u8> {
        let mut bytes = record(seq).frame();
        bytes.truncate(bytes.len() - TRAILER);
        bytes
    }

    #[test]
    fn records_read_back_up_to_a_torn_tail() {
        let mut bytes = Vec::new();
        for seq in 1..=3 {
            bytes.extend(bare(seq));
        }
        let (read, end) = records(&bytes);
        assert_eq!(end, End::Clean);
        assert_eq!(read.iter().map(|r| r.seq).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(read[2].ops, record(3).ops);
        // The trailer of the last frame ends the records cleanly, whatever follows it.
        let mut trailed = bytes.clone();
        trailed.extend([0; TRAILER]);
        trailed.extend(bare(9));
        assert_eq!(records(&trailed), (read.clone(), End::Clean));
        // Every cut inside the last record loses that record only.
        let last = bare(3).len();
        for cut in 1..last {
            let (read, end) = records(&bytes[..bytes.len() - cut]);
            assert_eq!(end, End::Torn);
            assert_eq!(read.len(), 2, "cut {cut}");
        }
        // A flipped bit in a record stops the replay there.
        let mut flipped = bytes.clone();
        let second = bare(1).len() + HEADER + 1;
        flipped[second] ^= 1;
        let (read, end) = records(&flipped);
        assert_eq!(end, End::Torn);
        assert_eq!(read.len(), 1);
    }

    /// A record with a good checksum that does not decode, as a newer version's would.
    fn from_a_newer_version(seq: u64) -> Vec<u8> {
        // A record whose one op is of a kind past every kind this version knows.
        let mut body = postcard::to_stdvec(&(seq, 0u64, 1u8)).unwrap();
        body.push(100);
        let mut bytes = (body.len() as u32).to_le_bytes().to_vec();
        bytes.extend(crc32fast::hash(&body).to_le_bytes());
        bytes.extend(body);
        bytes
    }

    #[test]
    fn a_whole_record_this_version_cannot_decode_is_not_taken_for_a_torn_one() {
        let mut bytes = bare(1);
        let offset = bytes.len();
        bytes.extend(from_a_newer_version(2));
        bytes.extend(bare(3));
        let (read, end) = records(&bytes);
        assert_eq!(read.iter().map(|r| r.seq).collect::<Vec<_>>(), [1]);
        assert_eq!(end, End::Unreadable { offset });
        // Cut short, the same record is torn.
        let (_, end) = records(&bytes[..offset + 6]);
        assert_eq!(end, End::Torn);
    }

    /// `body` framed: `[length u32 LE][crc32 u32 LE][body]`, into `out`.
    fn put_frame(out: &mut Vec<u8>, body: &[u8]) {
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
        out.extend_from_slice(body);
    }

    /// Events' bytes are written as postcard writes any `Vec<u8>`, only faster.
    #[test]
    fn the_events_bytes_are_a_plain_byte_vector() {
        let events = Events { last: 300, bytes: (0..=255).collect() };
        let plain = postcard::to_stdvec(&(300u64, events.bytes.clone())).unwrap();
        assert_eq!(postcard::to_stdvec(&events).unwrap(), plain);
        assert_eq!(postcard::from_bytes::<Events>(&plain).unwrap(), events);
    }

    /// A record written before records carried events reads as one without them.
    #[test]
    fn a_record_of_the_format_before_events_reads_without_them() {
        let older = WalRecord { events: None, ..record(1) };
        let body = postcard::to_stdvec(&(older.seq, older.clock, older.ops.clone())).unwrap();
        let mut bytes = Vec::new();
        put_frame(&mut bytes, &body);
        put_frame(&mut bytes, &postcard::to_stdvec(&record(2)).unwrap());
        assert!(record(2).events.is_some());
        assert_eq!(records(&bytes), (vec![older.clone(), record(2)], End::Clean));
        // Read in place, the same.
        let mut read = Vec::new();
        let end = each_record(&bytes, |r| {
            let ops: Vec<OpRef<'_>> = r.ops.clone();
            read.push((r.seq, r.clock, ops.len(), r.events.map(|e| e.to_events())));
            ControlFlow::Continue(())
        });
        assert_eq!(end, End::Clean);
        let expected: Vec<_> =
            [&older, &record(2)].iter().map(|r| (r.seq, r.clock, r.ops.len(), r.events.clone())).collect();
        assert_eq!(read, expected);
        let bodies = [body, postcard::to_stdvec(&record(2)).unwrap()];
        for (body, record) in bodies.iter().zip([&older, &record(2)]) {
            let read = decode_record_ref(body).unwrap();
            let owned: Vec<OpRef<'_>> = record.ops.iter().map(OpRef::of).collect();
            assert_eq!(read.ops, owned);
        }
    }

    #[test]
    fn segments_are_listed_in_order_and_hold_what_was_appended() {
        for durability in Durability::ALL {
            let dir = tempfile::tempdir().unwrap();
            let log = DirLog::open(dir.path().join(WAL_DIR), durability).unwrap();
            for number in [3, 1, 17] {
                let segment = log.create(number, 4096).unwrap();
                segment.append(0, &record(number).frame()).unwrap();
                segment.sync().unwrap();
            }
            std::fs::write(dir.path().join(WAL_DIR).join("notes.txt"), b"not a segment").unwrap();
            assert_eq!(log.list().unwrap(), [1, 3, 17]);
            let (read, end) = records(&log.read(17).unwrap());
            assert_eq!(end, End::Clean);
            assert_eq!(read[0].seq, 17);
            log.remove(3).unwrap();
            log.remove(3).unwrap();
            assert_eq!(log.list().unwrap(), [1, 17]);
            // Segment 3 is reused as 20: what it held before is cut off.
            let reused = log.create(20, 4096).unwrap();
            assert_eq!(log.list().unwrap(), [1, 17, 20]);
            assert_eq!(records(&log.read(20).unwrap()), (Vec::new(), End::Clean));
            reused.append(0, &record(21).frame()).unwrap();
            reused.sync().unwrap();
            let (read, end) = records(&log.read(20).unwrap());
            assert_eq!(end, End::Clean, "{durability}");
            assert_eq!(read.iter().map(|r| r.seq).collect::<Vec<_>>(), [21]);
        }
    }

    /// Spares made ahead are what the next segments are made from: the same files, renamed,
    /// their old bytes cut off; they are made only until [`SPARES`] are ready, and a spare half
    /// made when the process stopped is made again.
    #[test]
    fn spares_made_ahead_become_the_next_segments() {
        use std::os::unix::fs::MetadataExt as _;
        for durability in Durability::ALL {
            let dir = tempfile::tempdir().unwrap();
            let wal = dir.path().join(WAL_DIR);
            let log = DirLog::open(wal.clone(), durability).unwrap();
            std::fs::write(wal.join(MAKING_SPARE), b"cut short").unwrap();
            log.prepare_spare(4096).unwrap();
            log.prepare_spare(4096).unwrap();
            let spares = log.spares().unwrap();
            assert_eq!(spares.len(), SPARES, "made until {SPARES} are ready, once: {spares:?}");
            assert!(!wal.join(MAKING_SPARE).exists());
            let inodes: Vec<u64> = spares.iter().map(|spare| std::fs::metadata(spare).unwrap().ino()).collect();
            for spare in &spares {
                std::fs::write(spare, vec![7u8; 4096]).unwrap();
            }
            let segment = log.create(5, 4096).unwrap();
            assert_eq!(log.spares().unwrap().len(), SPARES - 1);
            assert!(inodes.contains(&std::fs::metadata(wal.join(format!("{:016x}.wal", 5))).unwrap().ino()));
            assert_eq!(records(&log.read(5).unwrap()), (Vec::new(), End::Clean), "{durability}");
            segment.append(0, &record(6).frame()).unwrap();
            segment.sync().unwrap();
            let (read, end) = records(&log.read(5).unwrap());
            assert_eq!((read.iter().map(|r| r.seq).collect::<Vec<_>>(), end), (vec![6], End::Clean));
            // Spares smaller than asked are not taken as ready.
            log.prepare_spare(8192).unwrap();
            assert_eq!(log.spares().unwrap().len(), SPARES - 1 + SPARES);
        }
    }

    /// A segment for a record larger than a segment (none of the spares fits it) is reserved, not
    /// written with zeros first: it reads as empty, then holds the one large record, at every
    /// level.
    #[test]
    fn a_segment_larger_than_the_spares_is_reserved_and_holds_its_record() {
        for durability in Durability::ALL {
            let dir = tempfile::tempdir().unwrap();
            let wal = dir.path().join(WAL_DIR);
            let log = DirLog::open(wal.clone(), durability).unwrap();
            let large = WalRecord {
                seq: 1,
                clock: 1,
                ops: vec![Op::Put(Table::Pools, Key::Name("p".into()), vec![7; SEGMENT_BYTES as usize + 5000])],
                events: None,
            };
            let frame = large.frame();
            let segment = log.create(1, frame.len() as u64).unwrap();
            let path = wal.join(format!("{:016x}.wal", 1));
            assert!(std::fs::metadata(&path).unwrap().len() >= frame.len() as u64, "{durability}");
            assert_eq!(records(&log.read(1).unwrap()), (Vec::new(), End::Clean), "{durability}");
            segment.append(0, &frame).unwrap();
            segment.sync().unwrap();
            let (read, end) = records(&log.read(1).unwrap());
            assert_eq!(end, End::Clean, "{durability}");
            assert_eq!(read, vec![large.clone()], "{durability}");
        }
    }

    /// Records of every size, synced after every few appends, read back whole and in order from
    /// the file, whichever blocks they cross; unsynced ones are not in the file yet.
    #[test]
    fn a_direct_segment_writes_every_record_across_block_boundaries() {
        let dir = tempfile::tempdir().unwrap();
        let log = DirLog::open(dir.path().join(WAL_DIR), Durability::Disk).unwrap();
        let segment = log.create(1, 2 << 20).unwrap();
        let mut len = 0u64;
        let mut seq = 0;
        for round in 0..150u64 {
            for _ in 0..(round % 4) + 1 {
                seq += 1;
                let size = ((round * 7919 + seq * 104_729) % 3000) as usize;
                let record = WalRecord {
                    seq,
                    clock: seq,
                    ops: vec![Op::Put(Table::Pools, Key::Name(format!("p{seq}")), vec![7; size])],
                    events: None,
                };
                let frame = record.frame();
                segment.append(len, &frame).unwrap();
                len += (frame.len() - TRAILER) as u64;
            }
            segment.sync().unwrap();
            let (read, end) = records(&log.read(1).unwrap());
            assert_eq!(end, End::Clean, "round {round}");
            assert_eq!(read.len() as u64, seq, "round {round}");
            assert!(read.iter().zip(1..).all(|(record, n)| record.seq == n && record.clock == n));
        }
        seq += 1;
        segment.append(len, &record(seq).frame()).unwrap();
        assert_eq!(records(&log.read(1).unwrap()).0.len() as u64, seq - 1, "not synced yet");
        segment.sync().unwrap();
        assert_eq!(records(&log.read(1).unwrap()).0.len() as u64, seq);
    }
}
