//! Opening: the database's tables and format, the records loaded into memory, the log replayed
//! into the database, and the time the daemon was down counted in the applications' timers.

use std::ops::ControlFlow;
use std::path::Path;

use allot_core::apps::Scheduler;
use allot_core::pools::{AllocId, Cordon, EndedAlloc, Labels, LeaseRules, PoolName, PoolSettings, Pools};
use allot_core::{Ledger, Millis, NamespaceName, SessionId};
use redb::{Database, ReadableTable};

use super::archive::Archive;
use super::wal::{self, LogFiles};
use crate::records::access::ACCESS;
use crate::records::apps::{APPS, QUEUES, TASKS};
use crate::records::runs::{CATALOG, RUNS};
use crate::records::{
    decode, decode_grown, resources_from, AllocRecord, CorruptRecord, GrantRecord, NamespaceRecord, PoolRecord,
    SessionRecord, ALLOCS, FORMAT_VERSION, GRANTS, META, META_CLOCK, META_EVENTS_SEQ, META_FORMAT, META_SEQ,
    META_WALL_OFFSET, NAMESPACES, POOLS, POOL_FIELDS_ADDED, POOL_LABELS, RETIRED_FENCING, SESSIONS,
};

use super::*;

/// The database's page cache. The state is read once at start and kept in memory; the cache
/// serves the checkpoints' writes, which touch few pages. redb's default (1 GiB) kept every page
/// read at start: 150 bytes more per grant after a restart (at 1M grants, 16 MiB is 17 bytes each).
const CACHE_BYTES: usize = 16 << 20;

pub(super) fn open_file(path: &Path) -> Result<Database, OpenError> {
    redb::Builder::new()
        .set_cache_size(CACHE_BYTES)
        .create(path)
        .map_err(|err| OpenError::Database { path: path.to_owned(), reason: redb_error(err) })
}

/// A write transaction that saves the allocator's state with its commit (redb's quick repair):
/// a start after a crash does not walk the whole database to rebuild it. Every commit of the
/// daemon is one, since the last before a crash decides.
pub(super) fn begin_write(db: &Database) -> Result<redb::WriteTransaction, String> {
    let mut txn = db.begin_write().map_err(redb_error)?;
    txn.set_quick_repair(true);
    Ok(txn)
}

/// What a database holds, rebuilt.
pub(super) struct Loaded {
    pub(super) ledger: Ledger,
    pub(super) pools: Pools,
    pub(super) sched: Scheduler,
    pub(super) runs: runs::Runs,
    pub(super) access: access::Access,
    /// The daemon clock at the last commit.
    pub(super) clock: Millis,
    /// The number of the last commit.
    pub(super) seq: u64,
}

/// Creates the tables of a new database, and checks the format of an existing one.
/// Counts the time the daemon was down in the applications' timers, which are wall-clock
/// (`Scheduler::count_downtime`), and notes this daemon's wall-clock offset for the next open;
/// durable before anything is served. Answers the daemon clock to start from: where the last
/// record left it, or, for a new store, the wall clock (so that timers are never moved back
/// past the clock's start).
pub(super) fn count_downtime(
    db: &Database,
    sched: &mut Scheduler,
    clock: Millis,
    wall: Millis,
) -> Result<Millis, OpenError> {
    let write_err = |err: String| OpenError::Read(format!("cannot note the wall clock: {err}"));
    let txn = begin_write(db).map_err(write_err)?;
    let clock = {
        let mut meta = txn.open_table(META).map_err(|e| write_err(redb_error(e)))?;
        let offset = meta.get(META_WALL_OFFSET).map_err(|e| write_err(redb_error(e)))?.map(|v| v.value());
        let fresh = meta.get(META_CLOCK).map_err(|e| write_err(redb_error(e)))?.is_none() && clock == 0;
        let clock = if fresh { wall } else { clock };
        if let Some(offset) = offset {
            let down = wall.saturating_sub(clock.saturating_add(offset));
            let outcome = sched.count_downtime(down);
            if !outcome.apps.is_empty() {
                tracing::info!(down_ms = down, "the daemon was down: the applications' timers count that time");
                let mut writes = Vec::new();
                apps::ops(outcome.apps.iter(), &mut writes);
                let mut tables = ops::Tables::open(&txn).map_err(|e| write_err(e.to_string()))?;
                for op in &writes {
                    tables.apply(op).map_err(|e| write_err(e.to_string()))?;
                }
            }
        }
        meta.insert(META_CLOCK, clock).map_err(|e| write_err(redb_error(e)))?;
        meta.insert(META_WALL_OFFSET, wall.saturating_sub(clock)).map_err(|e| write_err(redb_error(e)))?;
        clock
    };
    txn.commit().map_err(|e| write_err(redb_error(e)))?;
    Ok(clock)
}

fn prepare(db: &Database) -> Result<(), OpenError> {
    let read_err = |err: redb::Error| OpenError::Read(err.to_string());
    let initialized = match db.begin_read().map_err(|e| read_err(e.into()))?.open_table(META) {
        Ok(_) => true,
        Err(redb::TableError::TableDoesNotExist(_)) => false,
        Err(err) => return Err(read_err(err.into())),
    };
    if !initialized {
        init_tables(db)?;
    }
    ensure_part_tables(db)?;
    let txn = db.begin_read().map_err(|e| read_err(e.into()))?;
    let format = txn
        .open_table(META)
        .and_then(|t| Ok(t.get(META_FORMAT)?.map(|v| v.value())))
        .map_err(|e| read_err(e.into()))?;
    if format != Some(FORMAT_VERSION) {
        return Err(OpenError::Format { found: format.unwrap_or(0) });
    }
    Ok(())
}

/// Creates the tables of the parts added since format 1 (pools, applications, runs) in a database
/// written before them: they are only added, so the format keeps its version.
fn ensure_part_tables(db: &Database) -> Result<(), OpenError> {
    let read_err = |err: redb::Error| OpenError::Read(err.to_string());
    let exists = {
        let txn = db.begin_read().map_err(|e| read_err(e.into()))?;
        [POOLS, POOL_LABELS, QUEUES, APPS].iter().all(|table| txn.open_table(*table).is_ok())
            && txn.open_table(ALLOCS).is_ok()
            && txn.open_table(TASKS).is_ok()
            && txn.open_table(RUNS).is_ok()
            && txn.open_table(CATALOG).is_ok()
            && txn.open_table(ACCESS).is_ok()
    };
    if exists {
        return Ok(());
    }
    let txn = begin_write(db).map_err(OpenError::Read)?;
    for table in [POOLS, POOL_LABELS, QUEUES, APPS] {
        txn.open_table(table).map_err(|e| read_err(e.into()))?;
    }
    txn.open_table(ALLOCS).map_err(|e| read_err(e.into()))?;
    txn.open_table(TASKS).map_err(|e| read_err(e.into()))?;
    txn.open_table(RUNS).map_err(|e| read_err(e.into()))?;
    txn.open_table(CATALOG).map_err(|e| read_err(e.into()))?;
    txn.open_table(ACCESS).map_err(|e| read_err(e.into()))?;
    txn.commit().map_err(|e| read_err(e.into()))?;
    Ok(())
}

/// Creates the tables and the format marker of a new database.
fn init_tables(db: &Database) -> Result<(), OpenError> {
    let read_err = |err: redb::Error| OpenError::Read(err.to_string());
    let txn = begin_write(db).map_err(OpenError::Read)?;
    {
        let mut meta = txn.open_table(META).map_err(|e| read_err(e.into()))?;
        let format = meta.get(META_FORMAT).map_err(|e| read_err(e.into()))?.map(|v| v.value());
        match format {
            None => {
                meta.insert(META_FORMAT, FORMAT_VERSION).map_err(|e| read_err(e.into()))?;
            }
            Some(FORMAT_VERSION) => {}
            Some(found) => return Err(OpenError::Format { found }),
        }
        txn.open_table(NAMESPACES).map_err(|e| read_err(e.into()))?;
        txn.open_table(RETIRED_FENCING).map_err(|e| read_err(e.into()))?;
        txn.open_table(GRANTS).map_err(|e| read_err(e.into()))?;
        txn.open_table(SESSIONS).map_err(|e| read_err(e.into()))?;
    }
    txn.commit().map_err(|e| read_err(e.into()))?;
    Ok(())
}

/// How many grants [`read_grants`] hands over at a time.
const GRANT_BATCH: usize = 8192;

/// Reads every grant, in batches of [`GRANT_BATCH`] handed to `take` until it answers false. A
/// namespace's grants come in a row, each with one shared name.
fn read_grants(txn: &redb::ReadTransaction, mut take: impl FnMut(Vec<Grant>) -> bool) -> Result<(), OpenError> {
    let read_err = |err: redb::Error| OpenError::Read(err.to_string());
    let mut name: Option<NamespaceName> = None;
    let mut batch = Vec::with_capacity(GRANT_BATCH);
    for entry in txn.open_table(GRANTS).map_err(|e| read_err(e.into()))?.iter().map_err(|e| read_err(e.into()))? {
        let (key, value) = entry.map_err(|e| read_err(e.into()))?;
        let (namespace, token) = key.value();
        let record: GrantRecord = decode("grants", format_args!("{namespace}/{token}"), value.value())?;
        let shared = match &name {
            Some(name) if name.as_str() == namespace => name.clone(),
            _ => name.insert(GrantRecord::namespace_of(namespace, token)?).clone(),
        };
        batch.push(record.into_grant_of(shared, token)?);
        if batch.len() == GRANT_BATCH && !take(std::mem::replace(&mut batch, Vec::with_capacity(GRANT_BATCH))) {
            return Ok(());
        }
    }
    if !batch.is_empty() {
        take(batch);
    }
    Ok(())
}

fn load_records(db: &Database) -> Result<Loaded, OpenError> {
    let read_err = |err: redb::Error| OpenError::Read(err.to_string());
    let txn = db.begin_read().map_err(|e| read_err(e.into()))?;
    let meta = |key: &str| {
        txn.open_table(META).and_then(|t| Ok(t.get(key)?.map(|v| v.value()))).map_err(|e| read_err(e.into()))
    };
    let clock = meta(META_CLOCK)?.unwrap_or(0);
    let seq = meta(META_SEQ)?.unwrap_or(0);
    let mut namespaces = Vec::new();
    for entry in txn.open_table(NAMESPACES).map_err(|e| read_err(e.into()))?.iter().map_err(|e| read_err(e.into()))? {
        let (key, value) = entry.map_err(|e| read_err(e.into()))?;
        let name = key.value();
        let record: NamespaceRecord = decode("namespaces", name, value.value())?;
        let name = NamespaceName::new(name).map_err(|e| CorruptRecord {
            table: "namespaces",
            key: name.to_owned(),
            reason: e.to_string(),
        })?;
        namespaces.push((name, record.quota, record.next_fencing));
    }
    let mut retired = Vec::new();
    for entry in
        txn.open_table(RETIRED_FENCING).map_err(|e| read_err(e.into()))?.iter().map_err(|e| read_err(e.into()))?
    {
        let (key, value) = entry.map_err(|e| read_err(e.into()))?;
        let name = NamespaceName::new(key.value()).map_err(|e| CorruptRecord {
            table: "retired_fencing",
            key: key.value().to_owned(),
            reason: e.to_string(),
        })?;
        retired.push((name, value.value()));
    }
    let mut sessions = Vec::new();
    for entry in txn.open_table(SESSIONS).map_err(|e| read_err(e.into()))?.iter().map_err(|e| read_err(e.into()))? {
        let (key, value) = entry.map_err(|e| read_err(e.into()))?;
        let id = SessionId(key.value());
        let record: SessionRecord =
            decode_grown("sessions", &id.to_string(), value.value(), crate::records::SESSION_FIELDS_ADDED)?;
        sessions.push((id, record.ttl_ms, record.deadline, record.owner));
    }
    // The grants are read and decoded on a thread of their own while the ledger takes them in:
    // a million of them, in about half the time.
    let mut restoring = Ledger::restoring(namespaces, retired, sessions);
    std::thread::scope(|scope| {
        let (batches, read) = std::sync::mpsc::sync_channel(4);
        let txn = &txn;
        scope.spawn(move || {
            if let Err(err) = read_grants(txn, |batch| batches.send(Ok(batch)).is_ok()) {
                let _ = batches.send(Err(err));
            }
        });
        for batch in read {
            restoring.add_grants(batch?)?;
        }
        Ok::<_, OpenError>(())
    })?;
    let ledger = restoring.finish();
    let mut pools = Vec::new();
    for entry in txn.open_table(POOLS).map_err(|e| read_err(e.into()))?.iter().map_err(|e| read_err(e.into()))? {
        let (key, value) = entry.map_err(|e| read_err(e.into()))?;
        let name = key.value();
        let record: PoolRecord = decode_grown("pools", name, value.value(), POOL_FIELDS_ADDED)?;
        let pool = PoolName::new(name).map_err(|e| CorruptRecord {
            table: "pools",
            key: name.to_owned(),
            reason: e.to_string(),
        })?;
        let settings = PoolSettings {
            capacity: resources_from(record.capacity, "pools", name)?,
            occupied: record.occupied.map(|r| resources_from(r, "pools", name)).transpose()?.unwrap_or_default(),
            stopped: record.stopped,
            labels: Labels::new(),
            cordon: record.cordon.map(|(since, drain_at)| Cordon { since, drain_at }),
        };
        pools.push((pool, settings));
    }
    for entry in txn.open_table(POOL_LABELS).map_err(|e| read_err(e.into()))?.iter().map_err(|e| read_err(e.into()))? {
        let (key, value) = entry.map_err(|e| read_err(e.into()))?;
        let labels: Labels = decode("pool_labels", key.value(), value.value())?;
        if let Some(pool) = pools.iter_mut().find(|p| p.0.as_str() == key.value()) {
            pool.1.labels = labels;
        }
    }
    let (mut live, mut ended) = (Vec::new(), Vec::new());
    for entry in txn.open_table(ALLOCS).map_err(|e| read_err(e.into()))?.iter().map_err(|e| read_err(e.into()))? {
        let (key, value) = entry.map_err(|e| read_err(e.into()))?;
        let (pool, id) = key.value();
        let record: AllocRecord = decode("allocs", format_args!("{pool}/{}", AllocId(id)), value.value())?;
        match record.into_alloc(pool, id)? {
            (alloc, None) => live.push(alloc),
            (alloc, Some((ended_at, reason))) => ended.push(EndedAlloc { alloc, ended_at, reason }),
        }
    }
    let pools = Pools::restore(LeaseRules::default(), pools, live, ended)?;
    let sched = apps::load(&txn)?;
    let runs = runs::load(&txn)?;
    let access = access::load(&txn)?;
    Ok(Loaded { ledger, pools, sched, runs, access, clock, seq })
}

/// Reads the database, first writing into it what the log holds (and the records' events into
/// `archive`): every segment at open, or those numbered up to `upto` (the current one, when
/// rebuilding). Returns what was read, the number of the last segment folded (0 if none), and
/// the events of the records folded.
pub(super) fn load(
    db: &Database,
    files: &dyn LogFiles,
    upto: Option<u64>,
    archive: &mut Archive,
) -> Result<(Loaded, u64, Vec<wal::Events>), OpenError> {
    prepare(db)?;
    let listed = files.list().map_err(|err| OpenError::Log(format!("cannot list the log's segments: {err}")))?;
    let numbers: Vec<u64> = listed.into_iter().filter(|n| upto.is_none_or(|upto| *n <= upto)).collect();
    let mut events = Vec::new();
    fold_into(db, files, &numbers, archive, Some(&mut events)).map_err(OpenError::Log)?;
    for &number in &numbers {
        files.remove(number).map_err(|err| OpenError::Log(format!("cannot remove a folded segment: {err}")))?;
    }
    Ok((load_records(db)?, numbers.last().copied().unwrap_or(0), events))
}

/// Writes the records of segments `numbers` that the database does not hold yet into it, in one
/// durable transaction; the database's `meta.seq` is the last record it holds. Their events are
/// kept in `archive` (synced) before the transaction commits, and added to `kept` if given.
pub(super) fn fold_into(
    db: &Database,
    files: &dyn LogFiles,
    numbers: &[u64],
    archive: &mut Archive,
    mut kept: Option<&mut Vec<wal::Events>>,
) -> Result<(), String> {
    let txn = begin_write(db)?;
    let mut meta = txn.open_table(META).map_err(redb_error)?;
    let mut applied = meta.get(META_SEQ).map_err(redb_error)?.map(|v| v.value()).unwrap_or(0);
    let mut clock = meta.get(META_CLOCK).map_err(redb_error)?.map(|v| v.value()).unwrap_or(0);
    let kept_through = meta.get(META_EVENTS_SEQ).map_err(redb_error)?.map(|v| v.value());
    if kept_through.is_some_and(|kept| kept < applied) {
        // A version before the kept events' files wrote records into the database without them:
        // the kept events start afresh after those records' revisions.
        tracing::warn!(applied, "the change feed's events of records written by an older version were not kept");
        archive
            .lost_before(feed::window_of(applied + 1))
            .map_err(|err| format!("cannot keep the change feed's events: {err}"))?;
    }
    // The records are read in place: the net of their ops borrows from the segments, mapped
    // until the end.
    let mut segments = Vec::with_capacity(numbers.len());
    for &number in numbers {
        match files.read(number) {
            Ok(bytes) => segments.push((number, bytes)),
            // Folded and removed meanwhile, by a rebuild.
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
            Err(err) => return Err(format!("cannot read log segment {number}: {err}")),
        }
    }
    let mut net = ops::Net::default();
    // The events are put into the archive a chunk at a time as the records are read, and synced
    // once before the database commits.
    let mut chunk: Vec<wal::EventsRef<'_>> = Vec::new();
    let mut chunk_bytes = 0;
    let mut put = |chunk: &mut Vec<wal::EventsRef<'_>>, kept: &mut Option<&mut Vec<wal::Events>>| {
        let put = archive.put(chunk).map_err(|err| format!("cannot keep the change feed's events: {err}"));
        if let Some(kept) = kept {
            kept.extend(chunk.iter().map(|events| events.to_events()));
        }
        chunk.clear();
        put
    };
    let mut folded = 0;
    for (number, bytes) in &segments {
        let number = *number;
        let mut gap = false;
        let mut failed = Ok(());
        let end = wal::each_record(bytes, |record| {
            // After a gap, the rest of the segment is only read through: a record this version
            // cannot read refuses the fold as before one.
            if gap || record.seq <= applied {
                return ControlFlow::Continue(());
            }
            if record.seq != applied + 1 {
                // A record before this one was lost (torn by a power loss): nothing after it was
                // acknowledged at the disk level, and the process level promises no more.
                tracing::warn!(
                    segment = number,
                    seq = record.seq,
                    applied,
                    "the log has a gap; what follows it is discarded"
                );
                gap = true;
                return ControlFlow::Continue(());
            }
            record.ops.into_iter().for_each(|op| net.add(op));
            if let Some(events) = record.events {
                chunk_bytes += events.bytes.len();
                chunk.push(events);
            }
            applied = record.seq;
            clock = clock.max(record.clock);
            folded += 1;
            if chunk_bytes >= archive::CHUNK_BYTES {
                chunk_bytes = 0;
                failed = put(&mut chunk, &mut kept);
                if failed.is_err() {
                    return ControlFlow::Break(());
                }
            }
            ControlFlow::Continue(())
        });
        failed?;
        if let wal::End::Unreadable { offset } = end {
            // The database is not written (events put into the archive meanwhile are skipped
            // by revision when these records are folded again): the database and the log stay
            // as they are for the version that wrote the record.
            return Err(format!(
                "log segment {number} holds a record at byte {offset} that this version of allot cannot read \
                 (written by a newer version?); refusing to start rather than drop it and what follows: \
                 start the version that wrote it"
            ));
        }
        if end == wal::End::Torn {
            tracing::warn!(
                segment = number,
                "a log segment ends in a torn record (a crash during an append); it is discarded"
            );
        }
        if gap {
            break;
        }
    }
    if folded == 0 {
        return Ok(());
    }
    put(&mut chunk, &mut kept)?;
    archive.sync().map_err(|err| format!("cannot keep the change feed's events: {err}"))?;
    {
        let mut tables = ops::Tables::open(&txn).map_err(|err| err.to_string())?;
        for op in net.ops() {
            tables.apply(&op).map_err(|err| err.to_string())?;
        }
    }
    meta.insert(META_SEQ, applied).map_err(redb_error)?;
    meta.insert(META_EVENTS_SEQ, applied).map_err(redb_error)?;
    meta.insert(META_CLOCK, clock).map_err(redb_error)?;
    drop(meta);
    txn.commit().map_err(redb_error)?;
    Ok(())
}
