//! The embedded backend: the ledger, the pools, the applications and the runs in memory, their
//! changes in a write-ahead log, checkpointed into a redb file.
//!
//! How an operation runs:
//! 1. Under the state lock, the core decides, and the resulting changes are appended to the log
//!    as one record (see [`wal`]). Appending under the lock keeps the log in decision order.
//! 2. At [`Durability::Process`] the record has reached the operating system when the append
//!    returns (a copy into the segment's memory map), and the operation is answered at once; the
//!    syncer flushes the log every [`FLUSH_INTERVAL`]. At [`Durability::Disk`] the operation is
//!    handed to the syncer thread, which makes everything appended so far durable with one direct
//!    synchronous write (group commit), then answers every operation it covered and hands woken
//!    waiters their grants. While more than one operation waits, syncs start at most every
//!    [`SYNC_SPACING`].
//! 3. The checkpointer thread seals the log's segment every [`CHECKPOINT_INTERVAL`], writes the
//!    sealed records into the database in one durable transaction and deletes them. At open, the
//!    log is replayed into the database the same way before anything is loaded.
//! 4. If an append or a sync fails (disk full, I/O error), the log is folded into the database
//!    and the state rebuilt from it before anyone is answered, so memory again equals what the
//!    store brings back. An operation whose record is not in the log is answered `Unavailable`;
//!    one whose record may be (a failed sync, a failed cut of a failed append), `OutcomeUnknown`.
//!    Until the rebuild succeeds, the store refuses work and the sweeper retries it.
//!
//! The daemon clock starts, at open, from the clock of the last record, so time the daemon was
//! down does not count against leases. A sweeper task ends expired leases every
//! [`SWEEP_INTERVAL`] and logs the clock at least once a second.

mod apps;
mod ops;
mod pools;
mod quotas;
mod runs;
pub mod wal;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use allot_core::apps::{AppChange, Outcome, Scheduler, World};
use allot_core::pools::{AllocId, EndedAlloc, Labels, LeaseRules, PoolChange, PoolError, PoolName, Pools};
use allot_core::{Effects, Grant, Ledger, LedgerError, Millis, NamespaceName, Session, SessionId, WaiterId};
use async_trait::async_trait;
use redb::{Database, ReadableTable, StorageBackend};
use tokio::sync::{oneshot, watch};

use self::ops::Op;
use self::wal::{DirLog, LogFiles, Segment, WalRecord};
use crate::records::apps::{APPS, QUEUES, TASKS};
use crate::records::runs::{CATALOG, RUNS};
use crate::records::{
    decode, resources_from, AllocRecord, CorruptRecord, GrantRecord, NamespaceRecord, PoolRecord, SessionRecord,
    ALLOCS, FORMAT_VERSION, GRANTS, META, META_CLOCK, META_FORMAT, META_SEQ, META_WALL_OFFSET, NAMESPACES, POOLS,
    POOL_LABELS, RETIRED_FENCING, SESSIONS,
};
use crate::runs::RunChange;
use crate::{expires_in, Allocation, CommitStats, GrantInfo, SessionInfo, Store, StoreError, COMMIT_BUCKETS_MICROS};

/// How often the sweeper looks for expired leases.
pub const SWEEP_INTERVAL: Duration = Duration::from_millis(50);
/// The longest the daemon clock goes without being logged.
const CLOCK_CHECKPOINT_MS: u64 = 1000;
/// How often the log is written into the database.
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);
/// At the process level, how often the log is flushed to disk (at most a second, as promised).
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(500);
/// At the disk level, under load (more than one operation waiting, or in the last sync), a sync
/// starts at least this long after the one before. A sync costs about 60 µs of CPU on a virtual
/// machine, whatever it carries: spaced like this, syncing takes at most ~13 % of one CPU however
/// many operations arrive, batches grow with the load, and an operation waits at most this much
/// longer. A lone caller's operations are synced at once. (Measured in `docs/benchmarks.md`:
/// without the spacing, syncs of a handful of operations each took a quarter of a CPU at 64
/// clients; at 16 clients, 450 µs served 30 % more pairs than 600 µs, at 64 as many.)
pub const SYNC_SPACING: Duration = Duration::from_micros(450);
/// The name of the database file in the data directory.
pub const DB_FILE: &str = "allot.redb";

/// What an acknowledged change survives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Durability {
    /// Flushed to disk (fdatasync) before the answer: survives a power loss.
    #[default]
    Disk,
    /// In the operating system's page cache before the answer: survives a crash or `kill -9`
    /// of the daemon; a power loss or kernel crash may lose what was acknowledged in the last
    /// second, as the log is flushed to disk at least once a second.
    Process,
}

impl Durability {
    pub const ALL: [Durability; 2] = [Durability::Disk, Durability::Process];

    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Disk => "disk",
            Durability::Process => "process",
        }
    }
}

impl std::fmt::Display for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Durability {
    type Err = String;

    fn from_str(text: &str) -> Result<Durability, String> {
        Durability::ALL
            .into_iter()
            .find(|level| level.as_str() == text)
            .ok_or_else(|| format!("unknown durability `{text}`: expected `disk` or `process`"))
    }
}

/// Where the embedded store keeps its data, and how durable an answer is.
#[derive(Debug, Clone)]
pub struct EmbeddedConfig {
    pub data_dir: PathBuf,
    pub durability: Durability,
}

impl EmbeddedConfig {
    /// The store in `data_dir`, at the default durability ([`Durability::Disk`]).
    pub fn new(data_dir: impl Into<PathBuf>) -> EmbeddedConfig {
        EmbeddedConfig { data_dir: data_dir.into(), durability: Durability::default() }
    }

    pub fn with_durability(mut self, durability: Durability) -> EmbeddedConfig {
        self.durability = durability;
        self
    }
}

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot create the data directory {path}: {source}")]
    DataDir { path: PathBuf, source: std::io::Error },
    #[error("cannot open the database {path}: {reason}")]
    Database { path: PathBuf, reason: String },
    #[error("cannot read the database: {0}")]
    Read(String),
    #[error("cannot replay the write-ahead log: {0}")]
    Log(String),
    #[error(transparent)]
    Corrupt(#[from] CorruptRecord),
    #[error("the database's records do not fit together: {0}")]
    Restore(#[from] allot_core::RestoreError),
    #[error("the database's pool records do not fit together: {0}")]
    RestorePools(#[from] PoolError),
    #[error("the database was written in format {found}; this allot reads format {FORMAT_VERSION}")]
    Format { found: u64 },
}

/// Opens the database again, after a failed checkpoint left it unusable.
type Opener = Box<dyn Fn() -> Result<Database, OpenError> + Send + Sync>;

/// Everything the embedded store holds, in memory, logged and checkpointed on disk.
pub struct EmbeddedStore {
    shared: Arc<Shared>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    sweeper: Mutex<Option<tokio::task::JoinHandle<()>>>,
    scheduler: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// The daemon clock: milliseconds, monotonic, continuing from the last durable value.
struct Clock {
    base: Millis,
    started: Instant,
}

impl Clock {
    fn now(&self) -> Millis {
        self.base + self.started.elapsed().as_millis() as u64
    }
}

struct Shared {
    state: Mutex<State>,
    durability: Durability,
    /// The log's segment files.
    files: Box<dyn LogFiles>,
    /// The checkpoints' database; `None` after a failed checkpoint, until reopened.
    db: Mutex<Option<Database>>,
    opener: Opener,
    /// Operations waiting for the syncer (disk level), in log order.
    syncs: Mutex<Vec<Pending>>,
    sync_wanted: Condvar,
    /// Set to stop the syncer and the checkpointer (after a last checkpoint).
    stop: Mutex<bool>,
    stop_changed: Condvar,
    /// Wakes the scheduler for a cycle: something it places, or places on, changed.
    wake_scheduler: tokio::sync::Notify,
    /// Set by the scheduler when something waits: then a change that frees room or tokens wakes it.
    sched_waiting: AtomicBool,
    clock: Clock,
    /// The daemon clock value of the last record.
    clock_written: AtomicU64,
    shutting_down: AtomicBool,
    shutdown: watch::Sender<bool>,
    stats: Stats,
}

/// Counters behind [`CommitStats`].
#[derive(Default)]
struct Stats {
    commits: AtomicU64,
    operations: AtomicU64,
    commit_micros: AtomicU64,
    failures: AtomicU64,
    buckets: [AtomicU64; COMMIT_BUCKETS_MICROS.len() + 1],
    max_micros: AtomicU64,
}

impl Stats {
    /// Counts one commit (a sync at the disk level, an append at the process level).
    fn commit(&self, operations: usize, took: Duration) {
        let micros = took.as_micros() as u64;
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.operations.fetch_add(operations as u64, Ordering::Relaxed);
        self.commit_micros.fetch_add(micros, Ordering::Relaxed);
        let bucket =
            COMMIT_BUCKETS_MICROS.iter().position(|&bound| micros <= bound).unwrap_or(COMMIT_BUCKETS_MICROS.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.max_micros.fetch_max(micros, Ordering::Relaxed);
    }

    fn read(&self) -> CommitStats {
        CommitStats {
            commits: self.commits.load(Ordering::Relaxed),
            operations: self.operations.load(Ordering::Relaxed),
            commit_micros: self.commit_micros.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            buckets: std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed)),
            max_micros: self.max_micros.load(Ordering::Relaxed),
        }
    }
}

/// What a waiting allocate call is told.
enum WaiterAnswer {
    Granted(Grant),
    Cancelled(LedgerError),
    Failed(StoreError),
}

type Ack = oneshot::Sender<Result<(), StoreError>>;

/// Whom to tell once an operation is durable.
struct Answer {
    ack: Ack,
    woken: Vec<(oneshot::Sender<WaiterAnswer>, Grant)>,
    cancelled: Vec<(oneshot::Sender<WaiterAnswer>, LedgerError)>,
}

/// An operation waiting for the syncer: the segment its record went to (or the current one, for
/// an operation that changed nothing: it must not be answered before what it saw is durable).
struct Pending {
    segment: Arc<dyn Segment>,
    answer: Answer,
}

/// The log as the deciding threads append to it (under the state lock).
struct LogWriter {
    segment: Arc<dyn Segment>,
    /// The segment's number and length.
    number: u64,
    len: u64,
    /// The number of the last record appended.
    seq: u64,
    /// The next segment's number.
    next_number: u64,
}

impl LogWriter {
    /// Appends to `segment`, numbered `number`, after record `seq`.
    fn new(segment: Arc<dyn Segment>, number: u64, seq: u64) -> LogWriter {
        LogWriter { segment, number, len: 0, seq, next_number: number + 1 }
    }

    /// Goes on in `segment`, numbered `number` (reserved from `next_number`); returns the one
    /// sealed.
    fn switch(&mut self, number: u64, segment: Arc<dyn Segment>) -> Arc<dyn Segment> {
        self.number = number;
        self.len = 0;
        std::mem::replace(&mut self.segment, segment)
    }
}

struct State {
    ledger: Ledger,
    pools: Pools,
    sched: Scheduler,
    runs: runs::Runs,
    waiters: HashMap<WaiterId, oneshot::Sender<WaiterAnswer>>,
    log: LogWriter,
    /// Set once shut down.
    closed: bool,
    /// Set while the state cannot be rebuilt after a failed write.
    broken: Option<String>,
}

impl State {
    fn usable(&self, shared: &Shared) -> Result<(), StoreError> {
        if shared.shutting_down.load(Ordering::SeqCst) || self.closed {
            return Err(StoreError::ShuttingDown);
        }
        if let Some(reason) = &self.broken {
            return Err(StoreError::Unavailable(reason.clone()));
        }
        Ok(())
    }

    /// Logs the daemon clock, so leases keep their remaining time across a restart.
    fn checkpoint_clock(&mut self, shared: &Shared) {
        if self.append(shared, Vec::new()).is_err() {
            tracing::warn!("the daemon clock could not be logged");
        }
    }

    /// Logs `effects`; the receiver answers once they are durable.
    fn submit(&mut self, shared: &Shared, effects: Effects) -> oneshot::Receiver<Result<(), StoreError>> {
        self.submit_all(shared, effects, Vec::new(), Vec::new())
    }

    /// Logs everything an operation of the scheduler changed, as one record.
    fn submit_outcome(&mut self, shared: &Shared, outcome: Outcome) -> oneshot::Receiver<Result<(), StoreError>> {
        self.submit_all(shared, outcome.ledger, outcome.pools, outcome.apps)
    }

    /// Logs a change of the kept runs.
    fn submit_runs(&mut self, shared: &Shared, change: RunChange) -> oneshot::Receiver<Result<(), StoreError>> {
        let mut ops = Vec::new();
        runs::ops(std::iter::once(&change), &mut ops);
        self.log_and_answer(shared, ops, Vec::new(), Vec::new())
    }

    /// Logs ledger effects, pool and application changes as one record.
    fn submit_all(
        &mut self,
        shared: &Shared,
        effects: Effects,
        pool_changes: Vec<PoolChange>,
        app_changes: Vec<AppChange>,
    ) -> oneshot::Receiver<Result<(), StoreError>> {
        let waiters = &mut self.waiters;
        let woken: Vec<_> =
            effects.woken.into_iter().filter_map(|w| waiters.remove(&w.waiter).map(|tx| (tx, w.grant))).collect();
        let cancelled: Vec<_> =
            effects.cancelled.into_iter().filter_map(|(id, err)| waiters.remove(&id).map(|tx| (tx, err))).collect();
        let mut ops = Vec::new();
        quotas::ops(effects.changes.iter(), &mut ops);
        pools::ops(pool_changes.iter(), &mut ops);
        apps::ops(app_changes.iter(), &mut ops);
        runs::forget_ended(&mut self.runs, &app_changes, &mut ops);
        self.log_and_answer(shared, ops, woken, cancelled)
    }

    /// Appends `ops` (if any) and answers the operation once they are durable.
    fn log_and_answer(
        &mut self,
        shared: &Shared,
        ops: Vec<Op>,
        woken: Vec<(oneshot::Sender<WaiterAnswer>, Grant)>,
        cancelled: Vec<(oneshot::Sender<WaiterAnswer>, LedgerError)>,
    ) -> oneshot::Receiver<Result<(), StoreError>> {
        let (ack, rx) = oneshot::channel();
        let appended = if ops.is_empty() { Ok(()) } else { self.append(shared, ops) };
        let answer = Answer { ack, woken, cancelled };
        match appended {
            Err(err) => answer.fail(&err),
            Ok(()) => match shared.durability {
                Durability::Process => answer.deliver(),
                Durability::Disk => {
                    let mut syncs = lock_plain(&shared.syncs);
                    let idle = syncs.is_empty();
                    syncs.push(Pending { segment: self.log.segment.clone(), answer });
                    drop(syncs);
                    // The syncer waits only while the queue is empty: one wake-up (a system
                    // call) per batch, not per operation.
                    if idle {
                        shared.sync_wanted.notify_one();
                    }
                }
            },
        }
        rx
    }

    /// Appends one record. On failure the state is rebuilt from the store before this returns.
    fn append(&mut self, shared: &Shared, ops: Vec<Op>) -> Result<(), StoreError> {
        let now = shared.clock.now();
        let operations = usize::from(!ops.is_empty());
        let record = WalRecord { seq: self.log.seq + 1, clock: now, ops };
        let frame = record.frame();
        let started = Instant::now();
        let appended = match self.room_for(shared, frame.len() as u64) {
            Ok(()) => self.log.segment.append(self.log.len, &frame),
            Err(err) => Err(err),
        };
        match appended {
            Ok(()) => {
                self.log.seq += 1;
                self.log.len += (frame.len() - wal::TRAILER) as u64;
                shared.clock_written.store(now, Ordering::Relaxed);
                if shared.durability == Durability::Process {
                    shared.stats.commit(operations, started.elapsed());
                }
                Ok(())
            }
            Err(err) => {
                let reason = format!("the disk failed while writing the log: {err}");
                tracing::error!(error = %reason, "append failed; rebuilding from the store");
                shared.stats.failures.fetch_add(1, Ordering::Relaxed);
                // End the records before the torn one, so later records follow good ones.
                let cut = self.log.segment.cut(self.log.len).is_ok();
                recover(shared, self);
                Err(if cut { StoreError::Unavailable(reason) } else { StoreError::OutcomeUnknown(reason) })
            }
        }
    }

    /// Moves to a new segment when the current one has no room for `bytes` more (rare: the
    /// checkpointer seals the segment every second, long before it fills up).
    fn room_for(&mut self, shared: &Shared, bytes: u64) -> std::io::Result<()> {
        if self.log.len + bytes <= self.log.segment.capacity() {
            return Ok(());
        }
        let number = self.log.next_number;
        let segment = shared.files.create(number, wal::SEGMENT_BYTES.max(bytes))?;
        self.log.segment.sync()?;
        self.log.next_number += 1;
        self.log.switch(number, segment);
        Ok(())
    }
}

fn grant_info(ledger: &Ledger, grant: Grant, now: Millis) -> GrantInfo {
    let expires_in_ms = expires_in(grant.lease, now, |id| ledger.session(id).ok().map(|s| s.deadline));
    GrantInfo { grant, expires_in_ms }
}

fn session_info(session: Session, now: Millis) -> SessionInfo {
    SessionInfo { expires_in_ms: session.deadline.saturating_sub(now), session }
}

async fn durable(rx: oneshot::Receiver<Result<(), StoreError>>) -> Result<(), StoreError> {
    match rx.await {
        Ok(result) => result,
        Err(_) => Err(StoreError::ShuttingDown),
    }
}

fn redb_error(err: impl Into<redb::Error>) -> String {
    err.into().to_string()
}

fn lock_plain<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl EmbeddedStore {
    /// Opens (or creates) the store in `config.data_dir`. Must be called inside a tokio runtime:
    /// it spawns the sweeper.
    pub fn open(config: &EmbeddedConfig) -> Result<EmbeddedStore, OpenError> {
        let dir = config.data_dir.clone();
        std::fs::create_dir_all(&dir).map_err(|source| OpenError::DataDir { path: dir.clone(), source })?;
        let path = dir.join(DB_FILE);
        let opener: Opener = Box::new(move || open_file(&path));
        let log_dir = dir.join(wal::WAL_DIR);
        let files = DirLog::open(log_dir.clone(), config.durability)
            .map_err(|source| OpenError::DataDir { path: log_dir, source })?;
        EmbeddedStore::open_with(opener, Box::new(files), config.durability)
    }

    /// Opens the store on a redb storage backend and log files of the caller's; `make_backend`
    /// is called again to reopen the database after a failed checkpoint. For fault-injection tests.
    pub fn open_with_backend<B: StorageBackend>(
        make_backend: impl Fn() -> B + Send + Sync + 'static,
        files: Box<dyn LogFiles>,
        durability: Durability,
    ) -> Result<EmbeddedStore, OpenError> {
        let opener: Opener = Box::new(move || {
            redb::Builder::new()
                .create_with_backend(make_backend())
                .map_err(|err| OpenError::Database { path: PathBuf::from("<backend>"), reason: redb_error(err) })
        });
        EmbeddedStore::open_with(opener, files, durability)
    }

    fn open_with(opener: Opener, files: Box<dyn LogFiles>, durability: Durability) -> Result<EmbeddedStore, OpenError> {
        let db = opener()?;
        let (Loaded { ledger, pools, mut sched, runs, clock, seq }, last_segment) = load(&db, files.as_ref(), None)?;
        let clock = count_downtime(&db, &mut sched, clock)?;
        let number = last_segment + 1;
        let segment = files
            .create(number, wal::SEGMENT_BYTES)
            .map_err(|err| OpenError::Log(format!("cannot start a segment: {err}")))?;
        let (shutdown, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                ledger,
                pools,
                sched,
                runs,
                waiters: HashMap::new(),
                log: LogWriter::new(segment, number, seq),
                closed: false,
                broken: None,
            }),
            durability,
            files,
            db: Mutex::new(Some(db)),
            opener,
            syncs: Mutex::new(Vec::new()),
            sync_wanted: Condvar::new(),
            stop: Mutex::new(false),
            stop_changed: Condvar::new(),
            wake_scheduler: tokio::sync::Notify::new(),
            sched_waiting: AtomicBool::new(true),
            clock: Clock { base: clock, started: Instant::now() },
            clock_written: AtomicU64::new(clock),
            shutting_down: AtomicBool::new(false),
            shutdown,
            stats: Stats::default(),
        });
        let spawn = |name: &str, run: fn(&Shared)| {
            let shared = shared.clone();
            std::thread::Builder::new().name(name.into()).spawn(move || run(&shared)).expect("spawning a thread")
        };
        let threads = vec![spawn("allot-syncer", run_syncer), spawn("allot-checkpointer", run_checkpointer)];
        let sweeper = tokio::spawn(run_sweeper(shared.clone()));
        // Everything, placements included, is loaded before the scheduler's first cycle.
        let scheduler = tokio::spawn(apps::run_scheduler(shared.clone()));
        tracing::info!(clock_ms = clock, seq, %durability, "embedded store opened");
        Ok(EmbeddedStore {
            shared,
            threads: Mutex::new(threads),
            sweeper: Mutex::new(Some(sweeper)),
            scheduler: Mutex::new(Some(scheduler)),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.shared)
    }

    /// Sets the lease rules of allocs (default: Reflow's 2 minutes, at most 5 per keepalive).
    pub fn set_pool_rules(&self, rules: LeaseRules) {
        self.lock().pools.set_rules(rules);
    }

    /// Checkpoints now, as the checkpointer does every [`CHECKPOINT_INTERVAL`]: seals the log's
    /// current segment and writes the sealed ones into the database. Blocks on disk I/O.
    pub fn checkpoint_now(&self) -> Result<(), StoreError> {
        checkpoint(&self.shared).map_err(StoreError::Unavailable)
    }

    /// Runs an operation on the state under the lock, queues its changes, and waits until they
    /// are durable. An operation that changed nothing still waits for a commit, so it is never
    /// answered before the changes it saw (an earlier release, say) are on disk.
    async fn commit<T>(
        &self,
        op: impl FnOnce(&mut State, Millis) -> Result<(T, Effects, Vec<PoolChange>), StoreError>,
    ) -> Result<T, StoreError> {
        let (value, rx) = {
            let mut state = self.lock();
            state.usable(&self.shared)?;
            let now = self.shared.clock.now();
            let (value, effects, pool_changes) = op(&mut state, now)?;
            (value, state.submit_all(&self.shared, effects, pool_changes, Vec::new()))
        };
        durable(rx).await?;
        if self.shared.sched_waiting.load(Ordering::Relaxed) {
            self.shared.wake_scheduler.notify_one();
        }
        Ok(value)
    }

    /// Runs an operation of the scheduler (on the scheduler, the pools and the ledger) and waits
    /// until everything it changed is durable; the scheduler is woken for a cycle.
    async fn commit_sched<T>(
        &self,
        op: impl FnOnce(&mut Scheduler, World<'_>, Millis) -> Result<(T, Outcome), StoreError>,
    ) -> Result<T, StoreError> {
        let (value, rx) = {
            let mut state = self.lock();
            state.usable(&self.shared)?;
            let now = self.shared.clock.now();
            let state = &mut *state;
            let world = World { pools: &mut state.pools, ledger: &mut state.ledger };
            let (value, outcome) = op(&mut state.sched, world, now)?;
            (value, state.submit_outcome(&self.shared, outcome))
        };
        durable(rx).await?;
        self.shared.wake_scheduler.notify_one();
        Ok(value)
    }

    /// Runs a ledger operation and waits until its changes are durable.
    async fn mutate<T>(
        &self,
        op: impl FnOnce(&mut Ledger, Millis) -> Result<(T, Effects), LedgerError>,
    ) -> Result<T, StoreError> {
        self.commit(|state, now| {
            let (value, effects) = op(&mut state.ledger, now)?;
            Ok((value, effects, Vec::new()))
        })
        .await
    }

    /// Runs a pool operation and waits until its changes are durable.
    async fn mutate_pools<T>(
        &self,
        op: impl FnOnce(&mut Pools, Millis) -> Result<(T, Vec<PoolChange>), PoolError>,
    ) -> Result<T, StoreError> {
        self.commit(|state, now| {
            let (value, changes) = op(&mut state.pools, now)?;
            Ok((value, Effects::default(), changes))
        })
        .await
    }

    /// Runs a read-only query over the pools.
    fn read_pools<T>(&self, query: impl FnOnce(&Pools, Millis) -> Result<T, PoolError>) -> Result<T, StoreError> {
        self.read_state(|state, now| Ok(query(&state.pools, now)?))
    }

    /// Runs a read-only query over the ledger.
    fn read<T>(&self, query: impl FnOnce(&Ledger, Millis) -> Result<T, LedgerError>) -> Result<T, StoreError> {
        self.read_state(|state, now| Ok(query(&state.ledger, now)?))
    }

    /// Runs a read-only query over the state, unless the database is being reopened.
    fn read_state<T>(&self, query: impl FnOnce(&State, Millis) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let state = self.lock();
        if let Some(reason) = &state.broken {
            return Err(StoreError::Unavailable(reason.clone()));
        }
        query(&state, self.shared.clock.now())
    }

    /// Waits for a queued allocate call's answer, until `wait` ends or the store shuts down.
    async fn wait_for(
        &self,
        namespace: NamespaceName,
        waiter: WaiterId,
        mut answer: oneshot::Receiver<WaiterAnswer>,
        wait: Duration,
    ) -> Result<Allocation, StoreError> {
        let mut guard = WaiterGuard { shared: &self.shared, namespace, waiter, armed: true };
        let mut shutdown = self.shared.shutdown.subscribe();
        tokio::select! {
            res = &mut answer => {
                guard.armed = false;
                return self.answer_of(res);
            }
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.wait_for(|stop| *stop) => {}
        }
        guard.armed = false;
        let cancelled = {
            let mut state = self.lock();
            let now = self.shared.clock.now();
            match state.ledger.cancel_waiter(&guard.namespace, waiter, now) {
                Some((refusal, place, effects)) => {
                    state.waiters.remove(&waiter);
                    Some((refusal, place, state.submit(&self.shared, effects)))
                }
                None => None,
            }
        };
        match cancelled {
            Some((refusal, place, rx)) => {
                // Those woken by this cancellation are answered by the committer; this caller
                // only needs its own answer.
                drop(rx);
                Ok(Allocation::Refused { refusal, place: Some(place) })
            }
            // Granted or cancelled meanwhile: the answer is on its way.
            None => self.answer_of(answer.await),
        }
    }

    fn answer_of(&self, answer: Result<WaiterAnswer, oneshot::error::RecvError>) -> Result<Allocation, StoreError> {
        match answer {
            Ok(WaiterAnswer::Granted(grant)) => {
                let state = self.lock();
                let info = grant_info(&state.ledger, grant, self.shared.clock.now());
                Ok(Allocation::Granted { grant: info, existing: false })
            }
            Ok(WaiterAnswer::Cancelled(err)) => Err(err.into()),
            Ok(WaiterAnswer::Failed(err)) => Err(err),
            // A newer call with the same token took this waiter's place.
            Err(_) => Err(StoreError::Invalid("a newer allocate call with the same token took over this wait".into())),
        }
    }
}

/// Takes a waiter out of the queue if its caller goes away before an answer.
struct WaiterGuard<'a> {
    shared: &'a Arc<Shared>,
    namespace: NamespaceName,
    waiter: WaiterId,
    armed: bool,
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut state = lock(self.shared);
        let now = self.shared.clock.now();
        if let Some((_, _, effects)) = state.ledger.cancel_waiter(&self.namespace, self.waiter, now) {
            state.waiters.remove(&self.waiter);
            drop(state.submit(self.shared, effects));
        }
    }
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    // A panic while holding the lock would leave the ledger half-changed; there is no panic
    // path inside it, and continuing is better than poisoning every later request.
    shared.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn open_file(path: &Path) -> Result<Database, OpenError> {
    Database::create(path).map_err(|err| OpenError::Database { path: path.to_owned(), reason: redb_error(err) })
}

/// What a database holds, rebuilt.
struct Loaded {
    ledger: Ledger,
    pools: Pools,
    sched: Scheduler,
    runs: runs::Runs,
    /// The daemon clock at the last commit.
    clock: Millis,
    /// The number of the last commit.
    seq: u64,
}

/// Creates the tables of a new database, and checks the format of an existing one.
/// Counts the time the daemon was down in the applications' timers, which are wall-clock
/// (`Scheduler::count_downtime`), and notes this daemon's wall-clock offset for the next open;
/// durable before anything is served. Answers the daemon clock to start from: where the last
/// record left it, or, for a new store, the wall clock (so that timers are never moved back
/// past the clock's start).
fn count_downtime(db: &Database, sched: &mut Scheduler, clock: Millis) -> Result<Millis, OpenError> {
    let write_err = |err: String| OpenError::Read(format!("cannot note the wall clock: {err}"));
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let txn = db.begin_write().map_err(|e| write_err(redb_error(e)))?;
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
    };
    if exists {
        return Ok(());
    }
    let txn = db.begin_write().map_err(|e| read_err(e.into()))?;
    for table in [POOLS, POOL_LABELS, QUEUES, APPS] {
        txn.open_table(table).map_err(|e| read_err(e.into()))?;
    }
    txn.open_table(ALLOCS).map_err(|e| read_err(e.into()))?;
    txn.open_table(TASKS).map_err(|e| read_err(e.into()))?;
    txn.open_table(RUNS).map_err(|e| read_err(e.into()))?;
    txn.open_table(CATALOG).map_err(|e| read_err(e.into()))?;
    txn.commit().map_err(|e| read_err(e.into()))?;
    Ok(())
}

/// Creates the tables and the format marker of a new database.
fn init_tables(db: &Database) -> Result<(), OpenError> {
    let read_err = |err: redb::Error| OpenError::Read(err.to_string());
    let txn = db.begin_write().map_err(|e| read_err(e.into()))?;
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
        let record: SessionRecord = decode("sessions", &id.to_string(), value.value())?;
        sessions.push((id, record.ttl_ms, record.deadline));
    }
    let mut grants = Vec::new();
    for entry in txn.open_table(GRANTS).map_err(|e| read_err(e.into()))?.iter().map_err(|e| read_err(e.into()))? {
        let (key, value) = entry.map_err(|e| read_err(e.into()))?;
        let (namespace, token) = key.value();
        let record: GrantRecord = decode("grants", &format!("{namespace}/{token}"), value.value())?;
        grants.push(record.into_grant(namespace, token)?);
    }
    let ledger = Ledger::restore(namespaces, retired, sessions, grants)?;
    let mut pools = Vec::new();
    for entry in txn.open_table(POOLS).map_err(|e| read_err(e.into()))?.iter().map_err(|e| read_err(e.into()))? {
        let (key, value) = entry.map_err(|e| read_err(e.into()))?;
        let name = key.value();
        let record: PoolRecord = decode("pools", name, value.value())?;
        let pool = PoolName::new(name).map_err(|e| CorruptRecord {
            table: "pools",
            key: name.to_owned(),
            reason: e.to_string(),
        })?;
        pools.push((pool, resources_from(record.capacity, "pools", name)?, record.stopped, Labels::new()));
    }
    for entry in txn.open_table(POOL_LABELS).map_err(|e| read_err(e.into()))?.iter().map_err(|e| read_err(e.into()))? {
        let (key, value) = entry.map_err(|e| read_err(e.into()))?;
        let labels: Labels = decode("pool_labels", key.value(), value.value())?;
        if let Some(pool) = pools.iter_mut().find(|p| p.0.as_str() == key.value()) {
            pool.3 = labels;
        }
    }
    let (mut live, mut ended) = (Vec::new(), Vec::new());
    for entry in txn.open_table(ALLOCS).map_err(|e| read_err(e.into()))?.iter().map_err(|e| read_err(e.into()))? {
        let (key, value) = entry.map_err(|e| read_err(e.into()))?;
        let (pool, id) = key.value();
        let record: AllocRecord = decode("allocs", &format!("{pool}/{}", AllocId(id)), value.value())?;
        match record.into_alloc(pool, id)? {
            (alloc, None) => live.push(alloc),
            (alloc, Some((ended_at, reason))) => ended.push(EndedAlloc { alloc, ended_at, reason }),
        }
    }
    let pools = Pools::restore(LeaseRules::default(), pools, live, ended)?;
    let sched = apps::load(&txn)?;
    let runs = runs::load(&txn)?;
    Ok(Loaded { ledger, pools, sched, runs, clock, seq })
}

/// Reads the database, first writing into it what the log holds: every segment at open, or those
/// numbered up to `upto` (the current one, when rebuilding). Returns what was read and the
/// number of the last segment folded (0 if none).
fn load(db: &Database, files: &dyn LogFiles, upto: Option<u64>) -> Result<(Loaded, u64), OpenError> {
    prepare(db)?;
    let listed = files.list().map_err(|err| OpenError::Log(format!("cannot list the log's segments: {err}")))?;
    let numbers: Vec<u64> = listed.into_iter().filter(|n| upto.is_none_or(|upto| *n <= upto)).collect();
    fold_into(db, files, &numbers).map_err(OpenError::Log)?;
    for &number in &numbers {
        files.remove(number).map_err(|err| OpenError::Log(format!("cannot remove a folded segment: {err}")))?;
    }
    Ok((load_records(db)?, numbers.last().copied().unwrap_or(0)))
}

/// Writes the records of segments `numbers` that the database does not hold yet into it, in one
/// durable transaction; the database's `meta.seq` is the last record it holds.
fn fold_into(db: &Database, files: &dyn LogFiles, numbers: &[u64]) -> Result<(), String> {
    let txn = db.begin_write().map_err(redb_error)?;
    let mut meta = txn.open_table(META).map_err(redb_error)?;
    let mut applied = meta.get(META_SEQ).map_err(redb_error)?.map(|v| v.value()).unwrap_or(0);
    let mut clock = meta.get(META_CLOCK).map_err(redb_error)?.map(|v| v.value()).unwrap_or(0);
    let mut net = ops::Net::default();
    let mut folded = 0;
    'segments: for &number in numbers {
        let bytes = match files.read(number) {
            Ok(bytes) => bytes,
            // Folded and removed meanwhile, by a rebuild.
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
            Err(err) => return Err(format!("cannot read log segment {number}: {err}")),
        };
        let (records, end) = wal::records(&bytes);
        if let wal::End::Unreadable { offset } = end {
            // Nothing is written: the database and the log stay as they are for the version
            // that wrote the record.
            return Err(format!(
                "log segment {number} holds a record at byte {offset} that this version of allot cannot read \
                 (written by a newer version?); refusing to start rather than drop it and what follows: \
                 start the version that wrote it"
            ));
        }
        for record in records {
            if record.seq <= applied {
                continue;
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
                break 'segments;
            }
            record.ops.into_iter().for_each(|op| net.add(op));
            applied = record.seq;
            clock = clock.max(record.clock);
            folded += 1;
        }
        if end == wal::End::Torn {
            tracing::warn!(
                segment = number,
                "a log segment ends in a torn record (a crash during an append); it is discarded"
            );
        }
    }
    if folded == 0 {
        return Ok(());
    }
    {
        let mut tables = ops::Tables::open(&txn).map_err(|err| err.to_string())?;
        for op in net.ops() {
            tables.apply(&op).map_err(|err| err.to_string())?;
        }
    }
    meta.insert(META_SEQ, applied).map_err(redb_error)?;
    meta.insert(META_CLOCK, clock).map_err(redb_error)?;
    drop(meta);
    txn.commit().map_err(redb_error)?;
    Ok(())
}

/// Makes operations durable at the disk level (group commit: one sync for every operation queued
/// meanwhile, spaced by [`SYNC_SPACING`] under load), and flushes the log every
/// [`FLUSH_INTERVAL`] at the process level.
fn run_syncer(shared: &Shared) {
    let mut last_sync: Option<Instant> = None;
    let mut last_batch = 0;
    loop {
        let batch = {
            let syncs = lock_plain(&shared.syncs);
            let (mut syncs, _) = shared
                .sync_wanted
                .wait_timeout_while(syncs, FLUSH_INTERVAL, |syncs| syncs.is_empty() && !*lock_plain(&shared.stop))
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let spacing = last_sync.map_or(Duration::ZERO, |last| SYNC_SPACING.saturating_sub(last.elapsed()));
            // Under load (several waiting now, or in the last batch) even one waiting operation
            // waits for the spacing: syncing it at once would start a run of small batches.
            if (syncs.len() > 1 || last_batch > 1) && !spacing.is_zero() {
                drop(syncs);
                std::thread::sleep(spacing);
                syncs = lock_plain(&shared.syncs);
            }
            std::mem::take(&mut *syncs)
        };
        if batch.is_empty() {
            let segment = lock(shared).log.segment.clone();
            if let Err(err) = segment.sync() {
                tracing::warn!(error = %err, "cannot flush the log to disk");
            }
            if *lock_plain(&shared.stop) {
                return;
            }
            continue;
        }
        let mut segments: Vec<&Arc<dyn Segment>> = Vec::new();
        for pending in &batch {
            if !segments.iter().any(|s| Arc::ptr_eq(s, &pending.segment)) {
                segments.push(&pending.segment);
            }
        }
        let started = Instant::now();
        last_sync = Some(started);
        last_batch = batch.len();
        let synced = segments.iter().try_for_each(|segment| segment.sync());
        match synced {
            Ok(()) => {
                shared.stats.commit(batch.len(), started.elapsed());
                batch.into_iter().for_each(|pending| pending.answer.deliver());
            }
            Err(err) => {
                let reason = format!("the disk failed while making the change durable: {err}");
                tracing::error!(error = %reason, operations = batch.len(), "sync failed; rebuilding from the store");
                fail_syncs(shared, lock(shared), &reason, batch);
            }
        }
    }
}

/// After a failed sync: the log is written into the database (from what the disk holds: after a
/// failed fdatasync the kernel may drop the pages it could not write) and the state rebuilt from
/// it; then `failed` and every other operation waiting for a sync are answered `OutcomeUnknown`,
/// before anything later is acknowledged.
fn fail_syncs(shared: &Shared, mut state: MutexGuard<'_, State>, reason: &str, failed: Vec<Pending>) {
    shared.stats.failures.fetch_add(1, Ordering::Relaxed);
    let later = std::mem::take(&mut *lock_plain(&shared.syncs));
    recover(shared, &mut state);
    drop(state);
    let err = StoreError::OutcomeUnknown(reason.to_owned());
    failed.into_iter().chain(later).for_each(|pending| pending.answer.fail(&err));
}

/// Writes the log into the database every [`CHECKPOINT_INTERVAL`], and once more when stopped.
fn run_checkpointer(shared: &Shared) {
    loop {
        let stop = {
            let stop = lock_plain(&shared.stop);
            let (stop, _) = shared
                .stop_changed
                .wait_timeout_while(stop, CHECKPOINT_INTERVAL, |stop| !*stop)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            *stop
        };
        if let Err(err) = checkpoint(shared) {
            tracing::warn!(error = %err, "checkpoint failed; the log keeps everything until the next one");
        }
        if stop {
            return;
        }
    }
}

/// Seals the current segment (if it holds anything) and writes every sealed one into the
/// database, then deletes them.
fn checkpoint(shared: &Shared) -> Result<(), String> {
    let reserved = {
        let mut state = lock(shared);
        (state.broken.is_none() && state.log.len > 0).then(|| {
            state.log.next_number += 1;
            state.log.next_number - 1
        })
    };
    if let Some(number) = reserved {
        // Created outside the lock: creating syncs the directory.
        let segment = shared
            .files
            .create(number, wal::SEGMENT_BYTES)
            .map_err(|err| format!("cannot start a log segment: {err}"))?;
        let mut state = lock(shared);
        if state.broken.is_some() || state.log.number >= number {
            // A rebuild meanwhile started a newer segment: keep it.
            drop(state);
            shared.files.remove(number).map_err(|err| err.to_string())?;
        } else {
            let sealed = state.log.switch(number, segment);
            if shared.durability == Durability::Disk {
                // The sealed segment is durable before anything is appended to the next one:
                // otherwise a record of it (the clock, which nobody waits for) could be lost
                // while later ones are synced, and replay ends at such a gap.
                if let Err(err) = sealed.sync() {
                    let reason = format!("the disk failed while sealing a log segment: {err}");
                    fail_syncs(shared, state, &reason, Vec::new());
                    return Err(reason);
                }
            } else {
                drop(state);
                sealed.sync().map_err(|err| format!("cannot flush the log to disk: {err}"))?;
            }
        }
    }
    let current = lock(shared).log.number;
    let listed = shared.files.list().map_err(|err| format!("cannot list the log's segments: {err}"))?;
    let sealed: Vec<u64> = listed.into_iter().filter(|n| *n < current).collect();
    if sealed.is_empty() {
        return Ok(());
    }
    {
        let mut db = lock_plain(&shared.db);
        if db.is_none() {
            *db = Some((shared.opener)().map_err(|err| err.to_string())?);
        }
        let database = db.as_ref().expect("opened above");
        if let Err(err) = fold_into(database, shared.files.as_ref(), &sealed) {
            // Reopened before the next use: a failed commit can leave redb unusable.
            *db = None;
            return Err(err);
        }
    }
    for number in sealed {
        shared.files.remove(number).map_err(|err| format!("cannot remove a folded segment: {err}"))?;
    }
    Ok(())
}

impl Answer {
    /// The operation is durable: tell its caller, and hand the waiters it woke their grants.
    fn deliver(self) {
        let _ = self.ack.send(Ok(()));
        for (tx, grant) in self.woken {
            let _ = tx.send(WaiterAnswer::Granted(grant));
        }
        for (tx, err) in self.cancelled {
            let _ = tx.send(WaiterAnswer::Cancelled(err));
        }
    }

    fn fail(self, err: &StoreError) {
        let _ = self.ack.send(Err(err.clone()));
        for (tx, _) in self.woken {
            let _ = tx.send(WaiterAnswer::Failed(err.clone()));
        }
        for (tx, _) in self.cancelled {
            let _ = tx.send(WaiterAnswer::Failed(err.clone()));
        }
    }
}

/// After a failed append or sync, under the state lock: writes the whole log into the database
/// and rebuilds the state from it, then starts a new segment. If that fails, the store is marked
/// broken (refusing work) and the sweeper tries again.
fn recover(shared: &Shared, state: &mut State) {
    for (_, tx) in state.waiters.drain() {
        let err = StoreError::Unavailable("the store could not be written; the wait was ended".into());
        let _ = tx.send(WaiterAnswer::Failed(err));
    }
    let current = state.log.number;
    let rebuilt = {
        let mut db = lock_plain(&shared.db);
        let reopened = match db.take() {
            Some(database) => Ok(database),
            None => (shared.opener)(),
        };
        reopened.and_then(|database| {
            let loaded = load(&database, shared.files.as_ref(), Some(current));
            if loaded.is_ok() {
                *db = Some(database);
            }
            loaded
        })
    };
    let loaded = match rebuilt {
        Ok((loaded, _)) => loaded,
        Err(err) => {
            tracing::error!(error = %err, "cannot rebuild the store; retrying");
            state.broken = Some(format!("the store cannot be rebuilt: {err}"));
            return;
        }
    };
    let number = state.log.next_number;
    let segment = match shared.files.create(number, wal::SEGMENT_BYTES) {
        Ok(segment) => segment,
        Err(err) => {
            state.broken = Some(format!("cannot start a log segment: {err}"));
            return;
        }
    };
    let Loaded { mut ledger, mut pools, sched, runs, seq, .. } = loaded;
    ledger.carry_over_from(&state.ledger);
    state.ledger = ledger;
    pools.set_rules(state.pools.rules());
    state.pools = pools;
    state.sched = sched;
    state.runs = runs;
    state.log = LogWriter::new(segment, number, seq);
    state.broken = None;
    tracing::info!(seq, "store rebuilt from the database");
}

async fn run_sweeper(shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(SWEEP_INTERVAL) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        let mut state = lock(&shared);
        if state.closed {
            return;
        }
        let now = shared.clock.now();
        if state.broken.is_some() {
            recover(&shared, &mut state);
            continue;
        }
        let effects = state.ledger.expire(now);
        if effects.expired > 0 {
            tracing::debug!(expired = effects.expired, "leases expired");
        }
        let pool_changes = state.pools.sweep(now);
        if !effects.changes.is_empty() || !effects.cancelled.is_empty() || !pool_changes.is_empty() {
            drop(state.submit_all(&shared, effects, pool_changes, Vec::new()));
        } else if now.saturating_sub(shared.clock_written.load(Ordering::Relaxed)) >= CLOCK_CHECKPOINT_MS {
            state.checkpoint_clock(&shared);
        }
    }
}

#[async_trait]
impl Store for EmbeddedStore {
    fn backend(&self) -> &'static str {
        "embedded"
    }

    fn durability(&self) -> &'static str {
        self.shared.durability.as_str()
    }

    fn now(&self) -> Millis {
        self.shared.clock.now()
    }

    fn commit_stats(&self) -> CommitStats {
        self.shared.stats.read()
    }

    async fn check_ready(&self) -> Result<(), StoreError> {
        self.lock().usable(&self.shared)
    }

    async fn shutdown(&self) {
        if self.shared.shutting_down.swap(true, Ordering::SeqCst) {
            return;
        }
        // Waiters answer themselves with their place in the queue.
        self.shared.shutdown.send_replace(true);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.lock().waiters.is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // A last record holds the clock, so leases resume with the TTL they had left, and the
        // exact next fencing numbers, so numbering resumes without a jump. No grant can follow
        // it: `usable` refuses every operation once `shutting_down` is set.
        let flushed = {
            let mut state = self.lock();
            let changes = state.ledger.fencing_checkpoint();
            state.checkpoint_clock(&self.shared);
            state.submit(&self.shared, Effects { changes, ..Effects::default() })
        };
        if let Err(err) = durable(flushed).await {
            tracing::warn!(error = %err, "the final flush failed");
        }
        self.lock().closed = true;
        // The checkpointer writes everything into the database before it stops.
        let threads = stop_threads(&self.shared, &self.threads);
        let _ = tokio::task::spawn_blocking(move || threads.into_iter().for_each(|t| drop(t.join()))).await;
        let sweeper = self.sweeper.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(sweeper) = sweeper {
            let _ = sweeper.await;
        }
        let scheduler = self.scheduler.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(scheduler) = scheduler {
            let _ = scheduler.await;
        }
        tracing::info!("embedded store closed");
    }
}

/// Tells the syncer and the checkpointer to finish and stop; returns them to join.
fn stop_threads(
    shared: &Shared,
    threads: &Mutex<Vec<std::thread::JoinHandle<()>>>,
) -> Vec<std::thread::JoinHandle<()>> {
    *lock_plain(&shared.stop) = true;
    shared.stop_changed.notify_all();
    {
        let _syncs = lock_plain(&shared.syncs);
        shared.sync_wanted.notify_all();
    }
    std::mem::take(&mut *lock_plain(threads))
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        // Without a shutdown, still stop the background work so the files are released.
        self.shared.shutting_down.store(true, Ordering::SeqCst);
        self.shared.shutdown.send_replace(true);
        lock(&self.shared).closed = true;
        for thread in stop_threads(&self.shared, &self.threads) {
            let _ = thread.join();
        }
    }
}
