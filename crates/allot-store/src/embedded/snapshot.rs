//! Snapshots of the embedded store (the archive's layout is `crate::snapshot`'s).
//!
//! Taken from the database: a checkpoint writes the log into it, then one read transaction reads
//! every table while operations go on (redb keeps the pages that transaction sees). What it holds
//! is the state after one commit of the log, `meta.seq`: the archive's revision is the last one
//! that commit's window could give.
//!
//! Restored into a new data directory, built beside it and renamed into place once the archive's
//! checksum matched and its records loaded as a start would load them: a refused archive leaves
//! nothing behind. The restored store's commits, and so its revisions, go on above the archive's
//! (bumped by the caller's margin), and it keeps no events: a watcher resuming from any revision
//! before its first is told to list again (410).

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use redb::{ReadTransaction, ReadableTable, TableDefinition, WriteTransaction};
use serde::{Deserialize, Serialize};

use super::feed::{window_of, WINDOW_BITS};
use super::open::{load_records, prepare, Tail};
use super::*;
use crate::records::access::ACCESS;
use crate::records::apps::{APPS, QUEUES, TASKS};
use crate::records::runs::{CATALOG, RUNS};
use crate::records::{
    ALLOCS, FORMAT_VERSION, GRANTS, META, META_CLOCK, META_EVENTS_SEQ, META_SEQ, META_WALL_OFFSET, NAMESPACES, POOLS,
    POOL_LABELS, RETIRED_FENCING, SESSIONS,
};
use crate::snapshot::{
    decode_key, encode_key, SnapshotError, SnapshotHeader, SnapshotReader, SnapshotSummary, SnapshotWriter, Table,
    SNAPSHOT_FORMAT,
};

/// How a restored store counts the time between the snapshot and the restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LeaseTime {
    /// Not at all: every lease, session and alloc goes on with the time it had left when the
    /// snapshot was taken (and applications' timers with theirs).
    #[default]
    Resume,
    /// As time passed: what would have expired since the snapshot expires at the first start.
    Expire,
}

/// What a restore is told.
#[derive(Debug, Clone, Copy)]
pub struct RestoreOptions {
    pub leases: LeaseTime,
    /// The restored store's first revision is above the archive's by at least this much, so
    /// that a watcher of the daemon the snapshot was taken from, which may have gone on after
    /// it, resumes into a 410 rather than into revisions given twice.
    pub bump_revision: u64,
    /// The wall clock now (Unix ms).
    pub now_ms: Millis,
}

/// The default of [`RestoreOptions::bump_revision`]: a billion commits' revisions (etcd's advice
/// for `--bump-revision`), hours of the busiest daemon going on after its snapshot. A watcher
/// whose revision is above the restored store's newest is refused too ([`crate::WatchError::Ahead`]).
pub const DEFAULT_BUMP_REVISION: u64 = 1_000_000_000 << WINDOW_BITS;

/// What a restore made.
#[derive(Debug, Clone)]
pub struct Restored {
    pub header: SnapshotHeader,
    pub summary: SnapshotSummary,
    /// The first revision the restored store can give: a resume from before it is refused.
    pub first_revision: u64,
    /// The restored store's clock at its first start.
    pub clock_ms: Millis,
}

/// Why a restore made nothing.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error("{path} already holds files: a restore makes a new data directory (remove it, or name another)")]
    NotEmpty { path: PathBuf },
    #[error("cannot write the data directory {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("cannot write the restored database: {0}")]
    Database(String),
    #[error("record {key} of table `{table}` does not read: {reason}")]
    Record { table: &'static str, key: String, reason: String },
    #[error("the snapshot's records do not load as a store: {0}")]
    Load(#[from] OpenError),
}

impl EmbeddedStore {
    /// Writes a point-in-time archive of everything the store holds to `out`, and answers what
    /// it wrote. Operations go on meanwhile; only checkpoints wait for the database's read to
    /// start. Blocking: call it off the async runtime's threads.
    pub fn snapshot(&self, out: impl Write) -> Result<(SnapshotHeader, SnapshotSummary), StoreError> {
        let shared = &self.shared;
        let unavailable = |what: &str, err: String| StoreError::Unavailable(format!("{what}: {err}"));
        let txn = {
            checkpoint(shared).map_err(|err| unavailable("cannot write the log into the database", err))?;
            let mut db = lock_plain(&shared.db);
            if db.is_none() {
                *db = Some((shared.opener)().map_err(|err| unavailable("cannot open the database", err.to_string()))?);
            }
            db.as_ref()
                .expect("opened above")
                .begin_read()
                .map_err(|err| unavailable("cannot read the database", redb_error(err)))?
        };
        let read_err = |err: redb::Error| unavailable("cannot read the database", err.to_string());
        // The database holds the state after commit `seq`, as it is now: its leases have the
        // time they have left now.
        let (clock, wall) = (shared.clock.now(), shared.clock.source.wall_ms());
        let seq = {
            let meta = txn.open_table(META).map_err(|e| read_err(e.into()))?;
            meta.get(META_SEQ).map(|v| v.map(|v| v.value()).unwrap_or(0)).map_err(|e| read_err(e.into()))?
        };
        let header = SnapshotHeader {
            format: SNAPSHOT_FORMAT,
            records_format: FORMAT_VERSION,
            revision: window_of(seq + 1) - 1,
            clock_ms: clock,
            taken_at_ms: wall,
            backend: "embedded".into(),
        };
        let write_err = |err: std::io::Error| StoreError::Unavailable(format!("cannot write the snapshot: {err}"));
        let mut writer =
            SnapshotWriter::new(std::io::BufWriter::with_capacity(1 << 20, out), &header).map_err(write_err)?;
        dump_tables(&txn, &mut writer).map_err(|err| match err {
            Dumped::Read(err) => unavailable("cannot read the database", err),
            Dumped::Write(err) => write_err(err),
        })?;
        let summary = writer.finish().map_err(write_err)?;
        tracing::info!(revision = header.revision, bytes = summary.bytes, sha256 = %summary.sha256, "snapshot taken");
        Ok((header, summary))
    }
}

enum Dumped {
    Read(String),
    Write(std::io::Error),
}

impl From<redb::Error> for Dumped {
    fn from(err: redb::Error) -> Dumped {
        Dumped::Read(err.to_string())
    }
}

impl From<std::io::Error> for Dumped {
    fn from(err: std::io::Error) -> Dumped {
        Dumped::Write(err)
    }
}

fn dump_tables<W: Write>(txn: &ReadTransaction, out: &mut SnapshotWriter<W>) -> Result<(), Dumped> {
    let mut key = Vec::new();
    for table in Table::ALL {
        match table {
            Table::Namespaces => dump(txn, NAMESPACES, table, out, &mut key)?,
            Table::RetiredFencing => {
                let records = txn.open_table(RETIRED_FENCING).map_err(redb::Error::from)?;
                let mut value = Vec::new();
                for entry in records.iter().map_err(redb::Error::from)? {
                    let (name, next) = entry.map_err(redb::Error::from)?;
                    encode_key(&name.value(), &mut key);
                    encode_key(&next.value(), &mut value);
                    out.record(table, &key, &value)?;
                }
            }
            Table::Grants => dump(txn, GRANTS, table, out, &mut key)?,
            Table::Sessions => dump(txn, SESSIONS, table, out, &mut key)?,
            Table::Pools => dump(txn, POOLS, table, out, &mut key)?,
            Table::PoolLabels => dump(txn, POOL_LABELS, table, out, &mut key)?,
            Table::Allocs => dump(txn, ALLOCS, table, out, &mut key)?,
            Table::Queues => dump(txn, QUEUES, table, out, &mut key)?,
            Table::Apps => dump(txn, APPS, table, out, &mut key)?,
            Table::Tasks => dump(txn, TASKS, table, out, &mut key)?,
            Table::Runs => dump(txn, RUNS, table, out, &mut key)?,
            Table::Catalog => dump(txn, CATALOG, table, out, &mut key)?,
            Table::Access => dump(txn, ACCESS, table, out, &mut key)?,
        }
    }
    Ok(())
}

/// Writes every record of a table whose values are records, in the database's key order.
fn dump<K, W>(
    txn: &ReadTransaction,
    definition: TableDefinition<K, &[u8]>,
    table: Table,
    out: &mut SnapshotWriter<W>,
    key: &mut Vec<u8>,
) -> Result<(), Dumped>
where
    K: redb::Key + 'static,
    for<'a> K::SelfType<'a>: Serialize,
    W: Write,
{
    let records = txn.open_table(definition).map_err(redb::Error::from)?;
    for entry in records.iter().map_err(redb::Error::from)? {
        let (k, value) = entry.map_err(redb::Error::from)?;
        encode_key(&k.value(), key);
        out.record(table, key, value.value())?;
    }
    Ok(())
}

/// Makes the data directory `data_dir` from the archive `input`. Nothing is left behind if the
/// archive is refused.
pub fn restore(input: impl Read, data_dir: &Path, options: &RestoreOptions) -> Result<Restored, RestoreError> {
    let written = |source| RestoreError::Write { path: data_dir.to_owned(), source };
    if fs::read_dir(data_dir).is_ok_and(|mut entries| entries.next().is_some()) {
        return Err(RestoreError::NotEmpty { path: data_dir.to_owned() });
    }
    if data_dir.is_dir() {
        return restore_into(input, data_dir, options);
    }
    let name = data_dir.file_name().map_or_else(|| "data".into(), |name| name.to_string_lossy().into_owned());
    let parent = match data_dir.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&parent).map_err(written)?;
    let building =
        tempfile::Builder::new().prefix(&format!(".{name}.restoring-")).tempdir_in(&parent).map_err(written)?;
    let restored = build(input, building.path(), options)?;
    // The directory (empty, or absent) is replaced whole.
    if data_dir.exists() {
        fs::remove_dir(data_dir).map_err(written)?;
    }
    let building = building.keep();
    fs::rename(&building, data_dir).map_err(|source| {
        let _ = fs::remove_dir_all(&building);
        written(source)
    })?;
    fs::File::open(&parent).and_then(|dir| dir.sync_all()).map_err(written)?;
    Ok(restored_at(data_dir, restored))
}

/// `restored`, logged.
fn restored_at(data_dir: &Path, restored: Restored) -> Restored {
    tracing::info!(
        path = %data_dir.display(),
        revision = restored.header.revision,
        first_revision = restored.first_revision,
        "snapshot restored"
    );
    restored
}

/// [`restore`] into `data_dir`, an empty directory that stays (a mount point, say, which cannot
/// be replaced, with its owner and mode): built in a directory inside it, whose files are moved
/// up once every record loaded, the database last (a directory with the database holds the
/// rest). A refused archive leaves it empty.
fn restore_into(input: impl Read, data_dir: &Path, options: &RestoreOptions) -> Result<Restored, RestoreError> {
    let written = |source| RestoreError::Write { path: data_dir.to_owned(), source };
    let building = tempfile::Builder::new().prefix(".restoring-").tempdir_in(data_dir).map_err(written)?;
    let restored = build(input, building.path(), options)?;
    let mut entries: Vec<std::ffi::OsString> = fs::read_dir(building.path())
        .map_err(written)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(written)?;
    entries.sort_by_key(|name| name.as_os_str() == DB_FILE);
    for name in entries {
        fs::rename(building.path().join(&name), data_dir.join(&name)).map_err(written)?;
    }
    drop(building);
    fs::File::open(data_dir).and_then(|dir| dir.sync_all()).map_err(written)?;
    Ok(restored_at(data_dir, restored))
}

/// Writes the archive's records into a new database in `dir`, and loads them as a start would.
fn build(input: impl Read, dir: &Path, options: &RestoreOptions) -> Result<Restored, RestoreError> {
    let db_err = |err: redb::Error| RestoreError::Database(err.to_string());
    let db = open_file(&dir.join(DB_FILE))?;
    prepare(&db)?;
    let mut reader = SnapshotReader::new(std::io::BufReader::with_capacity(1 << 20, input))?;
    let header = reader.header().clone();
    let txn = open::begin_write(&db).map_err(RestoreError::Database)?;
    {
        let mut tables = Tables::open(&txn).map_err(|e| db_err(e.into()))?;
        while let Some((table, key, value)) = reader.next()? {
            tables.insert(table, key, value)?;
        }
    }
    let seq = (header.revision.saturating_add(options.bump_revision) >> WINDOW_BITS) + 1;
    let since = options.now_ms.saturating_sub(header.taken_at_ms);
    // The daemon clock goes on from the snapshot's (a lease keeps what it had left), or from
    // as much later as the wall clock went on. Applications' timers count the time a daemon
    // was down from the wall clock's offset (`count_downtime`): the same here.
    let clock = match options.leases {
        LeaseTime::Resume => header.clock_ms,
        LeaseTime::Expire => header.clock_ms.saturating_add(since),
    };
    {
        let mut meta = txn.open_table(META).map_err(|e| db_err(e.into()))?;
        for (key, value) in [
            (META_SEQ, seq),
            (META_EVENTS_SEQ, seq),
            (META_CLOCK, clock),
            (META_WALL_OFFSET, options.now_ms.saturating_sub(clock)),
        ] {
            meta.insert(key, value).map_err(|e| db_err(e.into()))?;
        }
    }
    txn.commit().map_err(|e| db_err(e.into()))?;
    // Every record decodes, and they fit together, as at a start.
    load_records(&db, &Tail::none(&db)?)?;
    let summary = reader.summary();
    Ok(Restored { header, summary, first_revision: window_of(seq + 1), clock_ms: clock })
}

/// The restored database's tables, open in one write transaction.
struct Tables<'t> {
    namespaces: redb::Table<'t, &'static str, &'static [u8]>,
    retired: redb::Table<'t, &'static str, u64>,
    grants: redb::Table<'t, (&'static str, &'static str), &'static [u8]>,
    sessions: redb::Table<'t, u128, &'static [u8]>,
    pools: redb::Table<'t, &'static str, &'static [u8]>,
    pool_labels: redb::Table<'t, &'static str, &'static [u8]>,
    allocs: redb::Table<'t, (&'static str, u64), &'static [u8]>,
    queues: redb::Table<'t, &'static str, &'static [u8]>,
    apps: redb::Table<'t, &'static str, &'static [u8]>,
    tasks: redb::Table<'t, (&'static str, &'static str), &'static [u8]>,
    runs: redb::Table<'t, (&'static str, &'static str), &'static [u8]>,
    catalog: redb::Table<'t, &'static str, &'static [u8]>,
    access: redb::Table<'t, &'static str, &'static [u8]>,
}

impl<'t> Tables<'t> {
    fn open(txn: &'t WriteTransaction) -> Result<Tables<'t>, redb::TableError> {
        Ok(Tables {
            namespaces: txn.open_table(NAMESPACES)?,
            retired: txn.open_table(RETIRED_FENCING)?,
            grants: txn.open_table(GRANTS)?,
            sessions: txn.open_table(SESSIONS)?,
            pools: txn.open_table(POOLS)?,
            pool_labels: txn.open_table(POOL_LABELS)?,
            allocs: txn.open_table(ALLOCS)?,
            queues: txn.open_table(QUEUES)?,
            apps: txn.open_table(APPS)?,
            tasks: txn.open_table(TASKS)?,
            runs: txn.open_table(RUNS)?,
            catalog: txn.open_table(CATALOG)?,
            access: txn.open_table(ACCESS)?,
        })
    }

    fn insert(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<(), RestoreError> {
        match table {
            Table::Namespaces => put(&mut self.namespaces, table, key, value),
            Table::RetiredFencing => {
                let name = typed::<&str>(table, key)?;
                let next = decode_key::<u64>(value).ok_or_else(|| RestoreError::Record {
                    table: table.name(),
                    key: name.to_owned(),
                    reason: "not a fencing number".into(),
                })?;
                self.retired.insert(name, next).map(drop).map_err(|e| RestoreError::Database(e.to_string()))
            }
            Table::Grants => put(&mut self.grants, table, key, value),
            Table::Sessions => put(&mut self.sessions, table, key, value),
            Table::Pools => put(&mut self.pools, table, key, value),
            Table::PoolLabels => put(&mut self.pool_labels, table, key, value),
            Table::Allocs => put(&mut self.allocs, table, key, value),
            Table::Queues => put(&mut self.queues, table, key, value),
            Table::Apps => put(&mut self.apps, table, key, value),
            Table::Tasks => put(&mut self.tasks, table, key, value),
            Table::Runs => put(&mut self.runs, table, key, value),
            Table::Catalog => put(&mut self.catalog, table, key, value),
            Table::Access => put(&mut self.access, table, key, value),
        }
    }
}

fn typed<'a, K: Deserialize<'a>>(table: Table, key: &'a [u8]) -> Result<K, RestoreError> {
    decode_key(key).ok_or_else(|| RestoreError::Record {
        table: table.name(),
        key: crate::snapshot::hex(key),
        reason: "its key is not one of this table's".into(),
    })
}

fn put<K>(
    records: &mut redb::Table<'_, K, &'static [u8]>,
    table: Table,
    key: &[u8],
    value: &[u8],
) -> Result<(), RestoreError>
where
    K: redb::Key + 'static,
    for<'a> K::SelfType<'a>: Deserialize<'a>,
{
    let typed_key = typed::<K::SelfType<'_>>(table, key)?;
    let replaced = records.insert(typed_key, value).map_err(|e| RestoreError::Database(e.to_string()))?;
    if replaced.is_some() {
        let key = crate::snapshot::hex(key);
        return Err(RestoreError::Record { table: table.name(), key, reason: "it comes twice".into() });
    }
    Ok(())
}
