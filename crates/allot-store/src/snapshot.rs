//! Snapshots: one point-in-time archive of everything a store holds, in a form every backend
//! writes and reads (docs/design.md, "Snapshots").
//!
//! An archive is, in order:
//! - the magic line `allot-snapshot\n`;
//! - the header ([`SnapshotHeader`]), one line of JSON;
//! - the records, each a frame `[table: u8][key length: varint][key][value length: varint][value]`,
//!   tables in [`Table`]'s order, keys ascending within each (the order the embedded store keeps
//!   them in). A key is its fields postcard-encoded; a value is the embedded store's record
//!   (`records`, postcard) in the version the header names;
//! - the end: the byte `0xff`, then the SHA-256 of every byte before it.
//!
//! Invariants: an archive is whole only if its last 32 bytes are the SHA-256 of the rest, so a
//! truncated or altered one is refused before anything is restored from it; two stores holding
//! the same state write the same records, byte for byte (the header aside: when and from where).

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The first line of every archive.
pub const MAGIC: &[u8] = b"allot-snapshot\n";

/// The archive layout this version writes and reads.
pub const SNAPSHOT_FORMAT: u32 = 1;

/// The frame that ends the records.
const END: u8 = 0xff;

/// The longest header, key or value read (a record is a few KiB at most; a run's record with its
/// outputs may be larger).
const MAX_FIELD: u64 = 64 << 20;

/// What an archive says of itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotHeader {
    /// [`SNAPSHOT_FORMAT`].
    pub format: u32,
    /// The version of the records' encoding (`records::FORMAT_VERSION`).
    pub records_format: u64,
    /// Every change up to this revision of the change feed is in the archive, and none after.
    pub revision: u64,
    /// The store's clock (ms) at that point: the times in the records (leases' deadlines,
    /// sessions', allocs') are on it.
    pub clock_ms: u64,
    /// When it was taken (Unix ms).
    pub taken_at_ms: u64,
    /// The backend it was taken from (`embedded`, `redis`).
    pub backend: String,
}

/// The tables of an archive, in the order they are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Table {
    Namespaces = 1,
    RetiredFencing,
    Grants,
    Sessions,
    Pools,
    PoolLabels,
    Allocs,
    Queues,
    Apps,
    Tasks,
    Runs,
    Catalog,
    Access,
}

impl Table {
    pub const ALL: [Table; 13] = [
        Table::Namespaces,
        Table::RetiredFencing,
        Table::Grants,
        Table::Sessions,
        Table::Pools,
        Table::PoolLabels,
        Table::Allocs,
        Table::Queues,
        Table::Apps,
        Table::Tasks,
        Table::Runs,
        Table::Catalog,
        Table::Access,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Table::Namespaces => "namespaces",
            Table::RetiredFencing => "retired_fencing",
            Table::Grants => "grants",
            Table::Sessions => "sessions",
            Table::Pools => "pools",
            Table::PoolLabels => "pool_labels",
            Table::Allocs => "allocs",
            Table::Queues => "queues",
            Table::Apps => "apps",
            Table::Tasks => "tasks",
            Table::Runs => "runs",
            Table::Catalog => "catalog",
            Table::Access => "access",
        }
    }

    fn of(byte: u8) -> Option<Table> {
        Table::ALL.into_iter().find(|table| *table as u8 == byte)
    }
}

/// Why an archive cannot be read or restored.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("not an allot snapshot (it does not start with `allot-snapshot`)")]
    NotASnapshot,
    #[error("the snapshot's format is version {found}; this allot reads version {SNAPSHOT_FORMAT} (use the allot that took it)")]
    Format { found: u32 },
    #[error("the snapshot's records are version {found}; this allot reads version {supported} at most (use the allot that took it)")]
    RecordsFormat { found: u64, supported: u64 },
    #[error("the snapshot's header does not read: {0}")]
    Header(String),
    #[error("the snapshot is damaged: {0}")]
    Damaged(String),
    #[error("the snapshot is incomplete: it ends before its checksum (a copy cut short, or a save that failed)")]
    Truncated,
    #[error("the snapshot's checksum does not match its content: it was altered or damaged (SHA-256 recorded {recorded}, computed {computed})")]
    Checksum { recorded: String, computed: String },
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl SnapshotError {
    fn from_read(err: io::Error) -> SnapshotError {
        match err.kind() {
            io::ErrorKind::UnexpectedEof => SnapshotError::Truncated,
            _ => SnapshotError::Io(err),
        }
    }
}

/// Writes an archive: the header at once, then [`SnapshotWriter::record`] for each record in
/// order, then [`SnapshotWriter::finish`].
pub struct SnapshotWriter<W: Write> {
    out: Hashed<W>,
    last: Option<Table>,
    counts: Vec<(Table, u64)>,
}

impl<W: Write> SnapshotWriter<W> {
    pub fn new(out: W, header: &SnapshotHeader) -> io::Result<SnapshotWriter<W>> {
        let mut out = Hashed { inner: out, hasher: Sha256::new(), bytes: 0 };
        out.write_all(MAGIC)?;
        let mut line = serde_json::to_vec(header).expect("a header encodes");
        line.push(b'\n');
        out.write_all(&line)?;
        Ok(SnapshotWriter { out, last: None, counts: Vec::new() })
    }

    /// Appends a record of `table`; tables come in [`Table`]'s order.
    pub fn record(&mut self, table: Table, key: &[u8], value: &[u8]) -> io::Result<()> {
        debug_assert!(self.last.is_none_or(|last| last <= table), "tables in order");
        if self.last != Some(table) {
            self.counts.push((table, 0));
            self.last = Some(table);
        }
        self.counts.last_mut().expect("pushed above").1 += 1;
        let mut frame = [0u8; 1 + 2 * 10];
        frame[0] = table as u8;
        let mut at = 1 + varint(key.len() as u64, &mut frame[1..]);
        self.out.write_all(&frame[..at])?;
        self.out.write_all(key)?;
        at = varint(value.len() as u64, &mut frame);
        self.out.write_all(&frame[..at])?;
        self.out.write_all(value)
    }

    /// Ends the archive with its checksum; answers it, with the archive's size and its records
    /// counted by table.
    pub fn finish(mut self) -> io::Result<SnapshotSummary> {
        self.out.write_all(&[END])?;
        let digest = self.out.hasher.finalize_reset();
        self.out.inner.write_all(&digest)?;
        self.out.inner.flush()?;
        Ok(SnapshotSummary { sha256: hex(&digest), bytes: self.out.bytes + 32, records: self.counts })
    }
}

/// What was written or read: the checksum (hex), the size and the records of each table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotSummary {
    pub sha256: String,
    pub bytes: u64,
    pub records: Vec<(Table, u64)>,
}

impl SnapshotSummary {
    pub fn count(&self, table: Table) -> u64 {
        self.records.iter().find(|(t, _)| *t == table).map_or(0, |(_, n)| *n)
    }
}

/// A record read: its table, key and value.
pub type Record<'r> = (Table, &'r [u8], &'r [u8]);

/// Reads an archive record by record, checking its checksum at the end: what was read is to be
/// used only once [`SnapshotReader::next`] answered `Ok(None)`.
pub struct SnapshotReader<R: Read> {
    input: HashedRead<R>,
    header: SnapshotHeader,
    last: Option<Table>,
    counts: Vec<(Table, u64)>,
    key: Vec<u8>,
    value: Vec<u8>,
    /// The checksum, once the end was read and it matched.
    sha256: Option<String>,
}

impl<R: Read> SnapshotReader<R> {
    /// Reads the magic line and the header, refusing an archive of another format.
    pub fn new(input: R) -> Result<SnapshotReader<R>, SnapshotError> {
        let mut input = HashedRead { inner: input, hasher: Sha256::new(), bytes: 0 };
        let mut magic = [0u8; MAGIC.len()];
        match input.read_exact(&mut magic) {
            Ok(()) if magic == MAGIC => {}
            Ok(()) => return Err(SnapshotError::NotASnapshot),
            Err(err) if err.kind() == io::ErrorKind::UnexpectedEof => return Err(SnapshotError::NotASnapshot),
            Err(err) => return Err(SnapshotError::Io(err)),
        }
        let mut line = Vec::new();
        loop {
            let mut byte = [0u8];
            input.read_exact(&mut byte).map_err(SnapshotError::from_read)?;
            if byte[0] == b'\n' {
                break;
            }
            if line.len() as u64 >= MAX_FIELD {
                return Err(SnapshotError::Header("longer than any header".into()));
            }
            line.push(byte[0]);
        }
        #[derive(Deserialize)]
        struct Version {
            format: u32,
        }
        let version: Version = serde_json::from_slice(&line).map_err(|err| SnapshotError::Header(err.to_string()))?;
        if version.format != SNAPSHOT_FORMAT {
            return Err(SnapshotError::Format { found: version.format });
        }
        let header: SnapshotHeader =
            serde_json::from_slice(&line).map_err(|err| SnapshotError::Header(err.to_string()))?;
        if header.records_format > crate::records::FORMAT_VERSION {
            return Err(SnapshotError::RecordsFormat {
                found: header.records_format,
                supported: crate::records::FORMAT_VERSION,
            });
        }
        Ok(SnapshotReader {
            input,
            header,
            last: None,
            counts: Vec::new(),
            key: Vec::new(),
            value: Vec::new(),
            sha256: None,
        })
    }

    pub fn header(&self) -> &SnapshotHeader {
        &self.header
    }

    /// The next record, or `None` at the end once the checksum matched.
    #[allow(clippy::should_implement_trait)] // it lends its buffers: not an `Iterator`
    pub fn next(&mut self) -> Result<Option<Record<'_>>, SnapshotError> {
        let mut byte = [0u8];
        self.input.read_exact(&mut byte).map_err(SnapshotError::from_read)?;
        if byte[0] == END {
            let computed = self.input.hasher.finalize_reset();
            let mut recorded = [0u8; 32];
            self.input.inner.read_exact(&mut recorded).map_err(SnapshotError::from_read)?;
            if recorded[..] != computed[..] {
                return Err(SnapshotError::Checksum { recorded: hex(&recorded), computed: hex(&computed) });
            }
            let mut more = [0u8];
            if self.input.inner.read(&mut more)? != 0 {
                return Err(SnapshotError::Damaged("bytes after its checksum".into()));
            }
            self.sha256 = Some(hex(&computed));
            return Ok(None);
        }
        let table = Table::of(byte[0])
            .ok_or_else(|| SnapshotError::Damaged(format!("a record of unknown table {}", byte[0])))?;
        if self.last.is_some_and(|last| last > table) {
            return Err(SnapshotError::Damaged(format!("table `{}` after a later one", table.name())));
        }
        if self.last != Some(table) {
            self.counts.push((table, 0));
            self.last = Some(table);
        }
        self.counts.last_mut().expect("pushed above").1 += 1;
        read_field(&mut self.input, &mut self.key)?;
        read_field(&mut self.input, &mut self.value)?;
        Ok(Some((table, &self.key, &self.value)))
    }

    /// The records read so far, by table, and the bytes; with the checksum once the end was
    /// read (empty before).
    pub fn summary(&self) -> SnapshotSummary {
        let whole = self.sha256.is_some();
        SnapshotSummary {
            sha256: self.sha256.clone().unwrap_or_default(),
            bytes: self.input.bytes + if whole { 32 } else { 0 },
            records: self.counts.clone(),
        }
    }
}

/// Reads a whole archive, checking it, and answers its header and summary.
pub fn verify(input: impl Read) -> Result<(SnapshotHeader, SnapshotSummary), SnapshotError> {
    let mut reader = SnapshotReader::new(input)?;
    while reader.next()?.is_some() {}
    let summary = reader.summary();
    Ok((reader.header, summary))
}

fn read_field(input: &mut impl Read, into: &mut Vec<u8>) -> Result<(), SnapshotError> {
    let len = read_varint(input)?;
    if len > MAX_FIELD {
        return Err(SnapshotError::Damaged(format!("a field of {len} bytes")));
    }
    into.clear();
    into.resize(len as usize, 0);
    input.read_exact(into).map_err(SnapshotError::from_read)
}

fn varint(mut n: u64, out: &mut [u8]) -> usize {
    let mut at = 0;
    while n >= 0x80 {
        out[at] = (n as u8) | 0x80;
        n >>= 7;
        at += 1;
    }
    out[at] = n as u8;
    at + 1
}

fn read_varint(input: &mut impl Read) -> Result<u64, SnapshotError> {
    let mut n = 0u64;
    for shift in (0..64).step_by(7) {
        let mut byte = [0u8];
        input.read_exact(&mut byte).map_err(SnapshotError::from_read)?;
        n |= u64::from(byte[0] & 0x7f) << shift;
        if byte[0] & 0x80 == 0 {
            return Ok(n);
        }
    }
    Err(SnapshotError::Damaged("a length longer than ten bytes".into()))
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

struct Hashed<W> {
    inner: W,
    hasher: Sha256,
    bytes: u64,
}

impl<W: Write> Write for Hashed<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

struct HashedRead<R> {
    inner: R,
    hasher: Sha256,
    bytes: u64,
}

impl<R: Read> Read for HashedRead<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

/// A key of an archive's record: its fields, postcard-encoded.
pub fn encode_key<K: Serialize + ?Sized>(key: &K, out: &mut Vec<u8>) {
    out.clear();
    postcard::to_io(key, &mut *out).expect("keys always encode");
}

/// A key read back; `None` if the bytes are not exactly one key of this type.
pub fn decode_key<'a, K: Deserialize<'a>>(bytes: &'a [u8]) -> Option<K> {
    match postcard::take_from_bytes::<K>(bytes) {
        Ok((key, [])) => Some(key),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> SnapshotHeader {
        SnapshotHeader {
            format: SNAPSHOT_FORMAT,
            records_format: crate::records::FORMAT_VERSION,
            revision: 42 << 20,
            clock_ms: 1_000,
            taken_at_ms: 1_700_000_000_000,
            backend: "embedded".into(),
        }
    }

    fn archive() -> Vec<u8> {
        let mut out = Vec::new();
        let mut writer = SnapshotWriter::new(&mut out, &header()).unwrap();
        let mut key = Vec::new();
        encode_key(&("ns", "tok"), &mut key);
        writer.record(Table::Grants, &key, b"grant").unwrap();
        encode_key(&42u128, &mut key);
        writer.record(Table::Sessions, &key, &[7; 300]).unwrap();
        let summary = writer.finish().unwrap();
        assert_eq!(summary.bytes, out.len() as u64);
        assert_eq!(summary.count(Table::Grants), 1);
        out
    }

    #[test]
    fn an_archive_reads_back_as_written() {
        let bytes = archive();
        let mut reader = SnapshotReader::new(&bytes[..]).unwrap();
        assert_eq!(reader.header(), &header());
        let (table, key, value) = reader.next().unwrap().unwrap();
        assert_eq!(
            (table, decode_key::<(&str, &str)>(key), value),
            (Table::Grants, Some(("ns", "tok")), &b"grant"[..])
        );
        let (table, key, value) = reader.next().unwrap().unwrap();
        assert_eq!((table, decode_key::<u128>(key), value.len()), (Table::Sessions, Some(42), 300));
        assert!(reader.next().unwrap().is_none());
        let (_, summary) = verify(&bytes[..]).unwrap();
        assert_eq!(summary.records, vec![(Table::Grants, 1), (Table::Sessions, 1)]);
    }

    #[test]
    fn an_altered_or_cut_archive_is_refused() {
        let bytes = archive();
        for at in 0..bytes.len() {
            let mut altered = bytes.clone();
            altered[at] ^= 0x01;
            assert!(verify(&altered[..]).is_err(), "a flipped bit at {at} went unnoticed");
        }
        for len in 0..bytes.len() {
            let err = verify(&bytes[..len]).unwrap_err();
            assert!(matches!(err, SnapshotError::Truncated | SnapshotError::NotASnapshot), "cut at {len}: {err}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(verify(&longer[..]), Err(SnapshotError::Damaged(_))));
    }

    #[test]
    fn another_format_is_refused_with_its_version() {
        let bytes = archive();
        let text = String::from_utf8_lossy(&bytes).replace("\"format\":1,", "\"format\":9,");
        assert!(matches!(verify(text.as_bytes()), Err(SnapshotError::Format { found: 9 })));
        assert!(matches!(verify(&b"PK\x03\x04 a zip"[..]), Err(SnapshotError::NotASnapshot)));
    }
}
