//! Opening: the database's tables and format, the records loaded into memory with the log's
//! records the database does not hold yet read over them, and the time the daemon was down
//! counted in the applications' timers.

use std::ops::ControlFlow;
use std::path::Path;

use allot_core::apps::Scheduler;
use allot_core::pools::{AllocId, Cordon, EndedAlloc, Labels, LeaseRules, PoolName, PoolSettings, Pools};
use allot_core::{Ledger, Millis, NamespaceName, SessionId};
use redb::{Database, ReadableTable};

use super::archive::Archive;
use super::ops::{Settled, Table};
use super::read::Records;
use super::wal::{self, LogFiles};
use crate::records::access::ACCESS;
use crate::records::apps::{APPS, QUEUES, TASKS};
use crate::records::runs::{CATALOG, RUNS};
use crate::records::{
    decode, decode_alloc, decode_grown, resources_from, CorruptRecord, GrantRecord, NamespaceRecord, PoolRecord,
    SessionRecord, ALLOCS, FORMAT_VERSION, GRANTS, META, META_CLOCK, META_EVENTS_SEQ, META_FORMAT, META_SEQ,
    META_WALL_OFFSET, NAMESPACES, POOLS, POOL_FIELDS_ADDED, POOL_LABELS, RETIRED_FENCING, SESSIONS,
};
use crate::watch::{Feed, WatchConfig};
use memmap2::Mmap;

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

/// Counts the time the daemon was down in the applications' timers, which are wall-clock
/// (`Scheduler::count_downtime`), and notes this daemon's wall-clock offset for the next open;
/// durable before anything is served. The applications changed are written over the records of
/// the database: `fold_first` is called before, to write into it the log's records read over it
/// at open (a checkpoint after would write their older versions over these). Answers the daemon
/// clock to start from: where the last record left it, or, for a new store, the wall clock (so
/// that timers are never moved back past the clock's start).
pub(super) fn count_downtime(
    db: &Database,
    sched: &mut Scheduler,
    clock: Millis,
    wall: Millis,
    fold_first: impl FnOnce() -> Result<(), OpenError>,
) -> Result<Millis, OpenError> {
    let write_err = |err: String| OpenError::Read(format!("cannot note the wall clock: {err}"));
    let (offset, fresh) = {
        let txn = db.begin_read().map_err(|e| write_err(redb_error(e)))?;
        let meta = txn.open_table(META).map_err(|e| write_err(redb_error(e)))?;
        let offset = meta.get(META_WALL_OFFSET).map_err(|e| write_err(redb_error(e)))?.map(|v| v.value());
        (offset, meta.get(META_CLOCK).map_err(|e| write_err(redb_error(e)))?.is_none() && clock == 0)
    };
    let clock = if fresh { wall } else { clock };
    let mut writes = Vec::new();
    if let Some(offset) = offset {
        let down = wall.saturating_sub(clock.saturating_add(offset));
        let outcome = sched.count_downtime(down);
        if !outcome.apps.is_empty() {
            tracing::info!(down_ms = down, "the daemon was down: the applications' timers count that time");
            apps::ops(outcome.apps.iter(), &mut writes);
            fold_first()?;
        }
    }
    let txn = begin_write(db).map_err(write_err)?;
    {
        let mut tables = ops::Tables::open(&txn).map_err(|e| write_err(e.to_string()))?;
        for op in &writes {
            tables.apply(op).map_err(|e| write_err(e.to_string()))?;
        }
        let mut meta = txn.open_table(META).map_err(|e| write_err(redb_error(e)))?;
        meta.insert(META_CLOCK, clock).map_err(|e| write_err(redb_error(e)))?;
        meta.insert(META_WALL_OFFSET, wall.saturating_sub(clock)).map_err(|e| write_err(redb_error(e)))?;
    }
    txn.commit().map_err(|e| write_err(redb_error(e)))?;
    Ok(clock)
}

/// Creates the tables of a new database, and checks the format of an existing one.
pub(super) fn prepare(db: &Database) -> Result<(), OpenError> {
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
fn read_grants(records: &Records<'_, '_>, mut take: impl FnMut(Vec<Grant>) -> bool) -> Result<(), OpenError> {
    let mut name: Option<NamespaceName> = None;
    let mut batch = Vec::with_capacity(GRANT_BATCH);
    let mut stopped = false;
    records.pairs(GRANTS, Table::Grants, |namespace, token, value| {
        if stopped {
            return Ok(());
        }
        let record: GrantRecord = decode("grants", format_args!("{namespace}/{token}"), value)?;
        let shared = match &name {
            Some(name) if name.as_str() == namespace => name.clone(),
            _ => name.insert(GrantRecord::namespace_of(namespace, token)?).clone(),
        };
        batch.push(record.into_grant_of(shared, token)?);
        if batch.len() == GRANT_BATCH && !take(std::mem::replace(&mut batch, Vec::with_capacity(GRANT_BATCH))) {
            stopped = true;
        }
        Ok(())
    })?;
    if !batch.is_empty() && !stopped {
        take(batch);
    }
    Ok(())
}

/// The log's records that the database does not hold yet, to read over it, and where they leave
/// the record numbers and the clock.
pub(super) struct Tail<'s> {
    settled: Settled<'s>,
    /// The number of the last record, and the daemon clock at it.
    seq: u64,
    clock: Millis,
}

impl Tail<'_> {
    /// No tail: the database holds the whole log.
    pub(super) fn none(db: &Database) -> Result<Tail<'static>, OpenError> {
        let (seq, clock, _) = recorded(db)?;
        Ok(Tail { settled: Settled::default(), seq, clock: clock.unwrap_or(0) })
    }
}

pub(super) fn load_records(db: &Database, tail: &Tail<'_>) -> Result<Loaded, OpenError> {
    let read_err = |err: redb::Error| OpenError::Read(err.to_string());
    let txn = db.begin_read().map_err(|e| read_err(e.into()))?;
    let records = Records::new(&txn, &tail.settled);
    let mut namespaces = Vec::new();
    records.names(NAMESPACES, Table::Namespaces, |name, value| {
        let record: NamespaceRecord = decode("namespaces", name, value)?;
        let name = NamespaceName::new(name).map_err(|e| CorruptRecord {
            table: "namespaces",
            key: name.to_owned(),
            reason: e.to_string(),
        })?;
        namespaces.push((name, record.quota, record.next_fencing));
        Ok(())
    })?;
    let mut retired = Vec::new();
    records.names(RETIRED_FENCING, Table::RetiredFencing, |name, value| {
        let corrupt = |reason: String| CorruptRecord { table: "retired_fencing", key: name.to_owned(), reason };
        let number = <[u8; 8]>::try_from(value).map_err(|_| corrupt("not a number".into()))?;
        retired.push((NamespaceName::new(name).map_err(|e| corrupt(e.to_string()))?, u64::from_le_bytes(number)));
        Ok(())
    })?;
    let mut sessions = Vec::new();
    records.ids(SESSIONS, Table::Sessions, |id, value| {
        let id = SessionId(id);
        let record: SessionRecord =
            decode_grown("sessions", &id.to_string(), value, crate::records::SESSION_FIELDS_ADDED)?;
        sessions.push((id, record.ttl_ms, record.deadline, record.owner));
        Ok(())
    })?;
    // The grants are read and decoded on a thread of their own while the ledger takes them in:
    // a million of them, in about half the time.
    let mut restoring = Ledger::restoring(namespaces, retired, sessions);
    std::thread::scope(|scope| {
        let (batches, read) = std::sync::mpsc::sync_channel(4);
        let records = &records;
        scope.spawn(move || {
            if let Err(err) = read_grants(records, |batch| batches.send(Ok(batch)).is_ok()) {
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
    records.names(POOLS, Table::Pools, |name, value| {
        let record: PoolRecord = decode_grown("pools", name, value, POOL_FIELDS_ADDED)?;
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
        Ok(())
    })?;
    records.names(POOL_LABELS, Table::PoolLabels, |name, value| {
        let labels: Labels = decode("pool_labels", name, value)?;
        if let Some(pool) = pools.iter_mut().find(|p| p.0.as_str() == name) {
            pool.1.labels = labels;
        }
        Ok(())
    })?;
    let (mut live, mut ended) = (Vec::new(), Vec::new());
    records.numbered(ALLOCS, Table::Allocs, |pool, id, value| {
        let record = decode_alloc(format_args!("{pool}/{}", AllocId(id)), value)?;
        match record.into_alloc(pool, id)? {
            (alloc, None) => live.push(alloc),
            (alloc, Some((ended_at, reason))) => ended.push(EndedAlloc { alloc, ended_at, reason }),
        }
        Ok(())
    })?;
    let pools = Pools::restore(LeaseRules::default(), pools, live, ended)?;
    let sched = apps::load(&records)?;
    let runs = runs::load(&records)?;
    let access = access::load(&records)?;
    Ok(Loaded { ledger, pools, sched, runs, access, clock: tail.clock, seq: tail.seq })
}

/// Where the database's records leave the record numbers and the clock: the last record it
/// holds, the daemon clock at it (none in a new store), and the last record whose events are
/// kept (none before the kept events' files).
fn recorded(db: &Database) -> Result<(u64, Option<Millis>, Option<u64>), OpenError> {
    let read_err = |err: redb::Error| OpenError::Read(err.to_string());
    let txn = db.begin_read().map_err(|e| read_err(e.into()))?;
    let meta = txn.open_table(META).map_err(|e| read_err(e.into()))?;
    let get = |key: &str| meta.get(key).map(|v| v.map(|v| v.value())).map_err(|e| read_err(e.into()));
    Ok((get(META_SEQ)?.unwrap_or(0), get(META_CLOCK)?, get(META_EVENTS_SEQ)?))
}

/// Reads the database, first writing into it what the log holds (and the records' events into
/// `archive`): the segments numbered up to `upto` (the current one, when rebuilding). Returns
/// what was read and the events of the records folded.
pub(super) fn load(
    db: &Database,
    files: &dyn LogFiles,
    upto: u64,
    archive: &mut Archive,
) -> Result<(Loaded, Vec<wal::Events>), OpenError> {
    prepare(db)?;
    let events = fold_log(db, files, Some(upto), archive)?;
    Ok((load_records(db, &Tail::none(db)?)?, events))
}

/// What [`open`] reads.
pub(super) struct Opened {
    pub(super) loaded: Loaded,
    /// The number of the last segment of the log (0 if none).
    pub(super) last_segment: u64,
    /// Whether the log holds records the database does not (read over it; the first checkpoint
    /// writes them into it).
    pub(super) tail_unfolded: bool,
    pub(super) feed: Feed,
    /// The first revision the feed publishes.
    pub(super) start: u64,
}

/// Opens a store's files: reads the database's records with the log's records it does not hold
/// yet laid over them and, on a thread of its own meanwhile, the change feed's kept events (the
/// log's events put into them first). `wall` is the time now, the clock of a new store.
///
/// The log is not written into the database first (a durable transaction, of 100-350 ms after
/// 50,000 grants): its segments stay, and the first checkpoint writes them in. Except when it
/// ends in a torn record or has a gap (a crash in the middle of an append, a power loss): then
/// it is written into the database and removed first, as before a rebuild, so that the records
/// after a gap, never acknowledged, are not read again once new ones take their numbers.
pub(super) fn open(
    db: &Database,
    files: &dyn LogFiles,
    archive: &mut Archive,
    watch: WatchConfig,
    wall: Millis,
) -> Result<Opened, OpenError> {
    let started = std::time::Instant::now();
    prepare(db)?;
    let numbers = files.list().map_err(|err| OpenError::Log(format!("cannot list the log's segments: {err}")))?;
    let last_segment = numbers.last().copied().unwrap_or(0);
    let (seq, clock, kept_through) = recorded(db)?;
    // A version before the kept events' files left records in the database without them: the
    // fold notes the loss (see `fold_into`).
    let older = kept_through.is_some_and(|kept| kept < seq);
    let segments = read_segments(files, &numbers).map_err(OpenError::Log)?;
    let replayed = match older {
        true => None,
        false => Some(replay(&segments, seq, clock.unwrap_or(0), archive, None).map_err(OpenError::Log)?),
    };
    let (tail, tail_unfolded) = match replayed {
        Some(replayed) if replayed.clean => {
            let unfolded = replayed.records > 0;
            if unfolded {
                // What is read is durable before anything is served from it: a crashed process
                // may have left records not synced yet (not acknowledged, or at the process level).
                for &(number, _) in &segments {
                    files
                        .sync(number)
                        .map_err(|err| OpenError::Log(format!("cannot sync log segment {number}: {err}")))?;
                }
            }
            (Tail { settled: replayed.net.settle(), seq: replayed.seq, clock: replayed.clock }, unfolded)
        }
        _ => {
            fold_log(db, files, None, archive)?;
            (Tail::none(db)?, false)
        }
    };
    let replayed_in = started.elapsed();
    let (loaded, reopened) = std::thread::scope(|scope| {
        let (seq, clock) = (tail.seq, tail.clock);
        let feed = scope.spawn(move || archive.reopen_feed(seq, watch, if clock == 0 { wall } else { clock }));
        let loaded = load_records(db, &tail);
        (loaded, feed.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
    });
    let (loaded, (feed, start)) = (loaded?, reopened?);
    tracing::info!(
        log_ms = replayed_in.as_millis() as u64,
        read_ms = (started.elapsed() - replayed_in).as_millis() as u64,
        records_unfolded = tail_unfolded,
        "the log read, the records and the kept events read"
    );
    Ok(Opened { loaded, last_segment, tail_unfolded, feed, start })
}

/// Writes into the database what the log holds (and the records' events into `archive`): every
/// segment, or those numbered up to `upto`; then removes the segments. Returns the events of the
/// records folded.
pub(super) fn fold_log(
    db: &Database,
    files: &dyn LogFiles,
    upto: Option<u64>,
    archive: &mut Archive,
) -> Result<Vec<wal::Events>, OpenError> {
    let listed = files.list().map_err(|err| OpenError::Log(format!("cannot list the log's segments: {err}")))?;
    let numbers: Vec<u64> = listed.into_iter().filter(|n| upto.is_none_or(|upto| *n <= upto)).collect();
    let mut events = Vec::new();
    fold_into(db, files, &numbers, archive, Some(&mut events)).map_err(OpenError::Log)?;
    for &number in &numbers {
        files.remove(number).map_err(|err| OpenError::Log(format!("cannot remove a folded segment: {err}")))?;
    }
    Ok(events)
}

/// Maps the segments `numbers` (those removed meanwhile, by a rebuild, skipped).
fn read_segments(files: &dyn LogFiles, numbers: &[u64]) -> Result<Vec<(u64, Mmap)>, String> {
    let mut segments = Vec::with_capacity(numbers.len());
    for &number in numbers {
        match files.read(number) {
            Ok(bytes) => segments.push((number, bytes)),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
            Err(err) => return Err(format!("cannot read log segment {number}: {err}")),
        }
    }
    Ok(segments)
}

/// The log's records after record `seq`, netted.
struct Replayed<'s> {
    net: ops::Net<'s>,
    /// How many there were.
    records: usize,
    /// The number of the last, and the daemon clock (at most `clock` given) at it.
    seq: u64,
    clock: Millis,
    /// The log read to its end: no torn record and no gap.
    clean: bool,
}

/// Reads the records of `segments` after record `seq`, in place (the net of their ops borrows
/// from the segments), with `clock` the daemon clock at `seq`. Their events are put into
/// `archive` a chunk at a time and synced, and added to `kept` if given.
fn replay<'s>(
    segments: &'s [(u64, Mmap)],
    seq: u64,
    clock: Millis,
    archive: &mut Archive,
    mut kept: Option<&mut Vec<wal::Events>>,
) -> Result<Replayed<'s>, String> {
    let mut replayed = Replayed { net: ops::Net::default(), records: 0, seq, clock, clean: true };
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
    for (number, bytes) in segments {
        let number = *number;
        let mut gap = false;
        let mut failed = Ok(());
        let end = wal::each_record(bytes, |record| {
            // After a gap, the rest of the segment is only read through: a record this version
            // cannot read refuses the fold as before one.
            if gap || record.seq <= replayed.seq {
                return ControlFlow::Continue(());
            }
            if record.seq != replayed.seq + 1 {
                // A record before this one was lost (torn by a power loss): nothing after it was
                // acknowledged at the disk level, and the process level promises no more.
                tracing::warn!(
                    segment = number,
                    seq = record.seq,
                    applied = replayed.seq,
                    "the log has a gap; what follows it is discarded"
                );
                gap = true;
                return ControlFlow::Continue(());
            }
            record.ops.into_iter().for_each(|op| replayed.net.add(op));
            if let Some(events) = record.events {
                chunk_bytes += events.bytes.len();
                chunk.push(events);
            }
            replayed.seq = record.seq;
            replayed.clock = replayed.clock.max(record.clock);
            replayed.records += 1;
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
            // Nothing is written into the database (events put into the archive meanwhile are
            // skipped by revision when these records are folded again): the database and the
            // log stay as they are for the version that wrote the record.
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
            replayed.clean = false;
        }
        if gap {
            replayed.clean = false;
            break;
        }
    }
    if replayed.records > 0 {
        put(&mut chunk, &mut kept)?;
        archive.sync().map_err(|err| format!("cannot keep the change feed's events: {err}"))?;
    }
    Ok(replayed)
}

/// Writes the records of segments `numbers` that the database does not hold yet into it, in one
/// durable transaction; the database's `meta.seq` is the last record it holds. Their events are
/// kept in `archive` (synced) before the transaction commits, and added to `kept` if given.
pub(super) fn fold_into(
    db: &Database,
    files: &dyn LogFiles,
    numbers: &[u64],
    archive: &mut Archive,
    kept: Option<&mut Vec<wal::Events>>,
) -> Result<(), String> {
    let started = std::time::Instant::now();
    let txn = begin_write(db)?;
    let mut meta = txn.open_table(META).map_err(redb_error)?;
    let applied = meta.get(META_SEQ).map_err(redb_error)?.map(|v| v.value()).unwrap_or(0);
    let clock = meta.get(META_CLOCK).map_err(redb_error)?.map(|v| v.value()).unwrap_or(0);
    let kept_through = meta.get(META_EVENTS_SEQ).map_err(redb_error)?.map(|v| v.value());
    if kept_through.is_some_and(|kept| kept < applied) {
        // A version before the kept events' files wrote records into the database without them:
        // the kept events start afresh after those records' revisions.
        tracing::warn!(applied, "the change feed's events of records written by an older version were not kept");
        archive
            .lost_before(feed::window_of(applied + 1))
            .map_err(|err| format!("cannot keep the change feed's events: {err}"))?;
    }
    let segments = read_segments(files, numbers)?;
    let replayed = replay(&segments, applied, clock, archive, kept)?;
    if replayed.records == 0 {
        return Ok(());
    }
    let read = started.elapsed();
    let mut ops = 0;
    {
        let mut tables = ops::Tables::open(&txn).map_err(|err| err.to_string())?;
        for op in replayed.net.settle().ops() {
            tables.apply(&op).map_err(|err| err.to_string())?;
            ops += 1;
        }
    }
    meta.insert(META_SEQ, replayed.seq).map_err(redb_error)?;
    meta.insert(META_EVENTS_SEQ, replayed.seq).map_err(redb_error)?;
    meta.insert(META_CLOCK, replayed.clock).map_err(redb_error)?;
    drop(meta);
    let applied_at = started.elapsed();
    txn.commit().map_err(redb_error)?;
    tracing::debug!(
        records = replayed.records,
        ops,
        read_ms = read.as_millis() as u64,
        apply_ms = (applied_at - read).as_millis() as u64,
        commit_ms = (started.elapsed() - applied_at).as_millis() as u64,
        "log records written into the database"
    );
    Ok(())
}
