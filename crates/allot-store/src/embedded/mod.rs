//! The embedded backend: the ledger, the pools, the applications and the runs in memory, their
//! changes in a write-ahead log, checkpointed into a redb file.
//!
//! At length, as one thing: the state behind one lock and the one path every operation takes
//! through it (decide, append, answer at the durability level); each part's operations, the
//! threads and recovery are modules of their own.
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
//!    [`SYNC_SPACING`], or as soon as a whole batch waits (as many as the largest of the last
//!    eight syncs carried). An operation that changed nothing, or was refused, waits the same
//!    way for what it saw (`State::barrier`).
//! 3. The checkpointer thread seals the log's segment every [`CHECKPOINT_INTERVAL`], writes the
//!    sealed records into the database in one durable transaction and deletes them (keeping a
//!    few as spares); another thread makes spares when the log's segment is half full. At open, the
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
//!
//! The change feed's events ride in the log record of their change, so they are durable with it;
//! a checkpoint keeps them in the events' own files (`archive`), from which a reopened store
//! restores what its feed kept.
//!
//! Opened stepped (`open_stepped`, for the simulator), nothing runs in the background: the caller
//! runs each sync, checkpoint, sweep and scheduling cycle (`step`).
//!
//! Modules: one per part (`quotas`, `pools`, `apps`, `runs`); `config` (opening options and
//! errors), `open` (loading and replay), `wal` (the log), `ops` (writes as data), `feed` (the
//! events of each commit and their revisions), `archive` (the kept events on disk), `syncer`,
//! `checkpoint`, `recover` and `sweeper` (the background work). This one holds the store, its
//! state and the commit path: one thing, at length, since every part's commit goes through the
//! same lock, log record and answer (split, the lock's invariants would span files).

mod access;
mod apps;
mod archive;
mod checkpoint;
mod config;
mod feed;
mod open;
mod ops;
mod pools;
mod quotas;
mod read;
mod recover;
mod runs;
pub mod snapshot;
mod sweeper;
mod syncer;
pub mod wal;

use self::archive::Archive;
pub use self::archive::EVENTS_DIR;
use self::checkpoint::{checkpoint, run_checkpointer, run_spare_maker};
use self::open::{count_downtime, open_file, Loaded, Opened};
use self::recover::recover;
use self::sweeper::run_sweeper;
use self::syncer::run_syncer;
pub use config::{Durability, EmbeddedConfig, OpenError};

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use allot_core::apps::{AppChange, Outcome, Scheduler, World};
use allot_core::pools::{LeaseRules, PoolChange, PoolError, Pools};
use allot_core::{Effects, Grant, Ledger, LedgerError, Millis, NamespaceName, Session, WaiterId};
use async_trait::async_trait;
use redb::{Database, StorageBackend};
use tokio::sync::{oneshot, watch};

use self::ops::Op;
use self::wal::{DirLog, LogFiles, Segment, WalRecord};
use crate::clock::TimeSource;
use crate::ids::IdSource;
use allot_core::watch::{EventKind, Filter};
use allot_core::Token;

use self::feed::Draft;
use crate::records::events::EncodedEvents;
use crate::runs::RunChange;
use crate::watch::{Event, Feed, WatchError, WatchStore, Watcher};
use crate::{expires_in, CommitStats, GrantInfo, SessionInfo, Store, StoreError, COMMIT_BUCKETS_MICROS};

/// How often the sweeper looks for expired leases.
pub const SWEEP_INTERVAL: Duration = Duration::from_millis(50);
/// The longest the daemon clock goes without being logged.
const CLOCK_CHECKPOINT_MS: u64 = 1000;
/// How often the log is written into the database.
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);
/// At the process level, how often the log is flushed to disk (at most a second, as promised).
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(500);
/// At the disk level, while fewer operations wait than a whole batch (the largest of the last
/// eight syncs), a sync starts at least this long after the one before. A sync costs about 60 µs
/// of CPU on a virtual machine, whatever it carries: spaced like this, batches grow with the load
/// instead of syncs, and an operation waits at most this much longer. A lone caller's operations
/// are synced at once, and a whole batch without waiting out the rest (its callers are all back).
/// (Measured in `docs/benchmarks.md`: without the spacing, syncs of a handful of operations each
/// took a quarter of a CPU at 64 clients; at 16 clients, 450 µs served 30 % more pairs than 600
/// µs, at 64 as many.)
pub const SYNC_SPACING: Duration = Duration::from_micros(450);
/// The log's frame buffer is kept for the next record up to this size.
const FRAME_KEPT_BYTES: usize = 64 << 10;
/// The name of the database file in the data directory.
pub const DB_FILE: &str = "allot.redb";

/// Who runs the store's background work (syncs, checkpoints, sweeps, scheduling cycles).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Background {
    /// Threads and tasks of the store's own.
    Spawned,
    /// The caller, step by step ([`EmbeddedStore::step`]).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    Stepped,
}

/// One step of the background work, run by the caller of a store opened stepped.
#[cfg(feature = "testing")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The syncer: every operation waiting for the disk made durable (one sync) and answered; with
    /// none waiting, the log flushed.
    Sync,
    /// The checkpointer: the log's segment sealed and written into the database.
    Checkpoint,
    /// The sweeper: expired leases ended (a batch of them).
    Sweep,
    /// The scheduler: one cycle.
    Schedule,
}

/// Opens the database again, after a failed checkpoint left it unusable.
type Opener = Box<dyn Fn() -> Result<Database, OpenError> + Send + Sync>;

/// Opens the database on a storage backend `make_backend` makes (each time it is called).
fn backend_opener<B: StorageBackend>(make_backend: impl Fn() -> B + Send + Sync + 'static) -> Opener {
    Box::new(move || {
        redb::Builder::new()
            .create_with_backend(make_backend())
            .map_err(|err| OpenError::Database { path: PathBuf::from("<backend>"), reason: redb_error(err) })
    })
}

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
    /// The source's monotonic reading at open.
    started: Millis,
    source: Arc<dyn TimeSource>,
    /// Where this clock stands against the wall clock, for timestamps.
    wall: allot_core::clock::WallOffset,
}

impl Clock {
    fn now(&self) -> Millis {
        self.base + self.source.monotonic_ms().saturating_sub(self.started)
    }

    /// [`Clock::now`] and the wall clock's time of it, kept steady ([`Store::now_and_wall`]).
    fn now_and_wall(&self) -> (Millis, Millis) {
        let before = self.now();
        let wall = self.source.wall_ms();
        let now = self.now();
        (now, self.wall.wall_of(now, wall, now - before <= 1))
    }
}

struct Shared {
    state: Mutex<State>,
    durability: Durability,
    /// The log's segment files.
    files: Box<dyn LogFiles>,
    /// The checkpoints' database; `None` after a failed checkpoint, until reopened.
    db: Mutex<Option<Database>>,
    /// Held through a checkpoint: the checkpointer's and a snapshot's take turns.
    checkpointing: Mutex<()>,
    /// The kept events' files, written with the database (locked after it).
    archive: Mutex<Archive>,
    opener: Opener,
    /// Operations waiting for the syncer (disk level), in log order.
    syncs: Mutex<Vec<Pending>>,
    sync_wanted: Condvar,
    /// While the syncer waits out [`SYNC_SPACING`]: a whole batch (the largest of its last
    /// ones), at which a commit wakes it early (0: no early wake). Read and written under `syncs`.
    sync_full: AtomicUsize,
    /// Set to stop the syncer and the checkpointer (after a last checkpoint).
    stop: Mutex<bool>,
    /// Set to stop them as a crash would: without the last checkpoint (tests).
    crashed: AtomicBool,
    /// The log asks for spare segments ([`State::ask_for_spare`]).
    spare_wanted: AtomicBool,
    stop_changed: Condvar,
    /// Wakes the scheduler for a cycle: something it places, or places on, changed.
    wake_scheduler: tokio::sync::Notify,
    /// Set by the scheduler when something waits: then a change that frees room or tokens wakes it.
    sched_waiting: AtomicBool,
    clock: Clock,
    /// Where random ids come from.
    ids: Arc<dyn IdSource>,
    /// The daemon clock value of the last record.
    clock_written: AtomicU64,
    shutting_down: AtomicBool,
    shutdown: watch::Sender<bool>,
    stats: Stats,
    /// Every committed change, for watchers.
    feed: Feed,
    /// Set by a test to play a store without a change feed: every watch is refused.
    refuses_watches: AtomicBool,
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
    /// Taken out of the queue (the store shuts down): where it stood.
    Refused(allot_core::Refusal, allot_core::QueuePlace),
}

type Ack = oneshot::Sender<Result<(), StoreError>>;
/// What an operation waits on until its changes are durable.
type Commit = oneshot::Receiver<Result<(), StoreError>>;

/// Whom to tell once an operation is durable.
struct Answer {
    ack: Ack,
    woken: Vec<(oneshot::Sender<WaiterAnswer>, Grant)>,
    cancelled: Vec<(oneshot::Sender<WaiterAnswer>, LedgerError)>,
    /// The operation's events, published when it is durable, and their records as its log
    /// record holds them (the feed keeps those).
    events: Vec<Event>,
    encoded: EncodedEvents,
    /// The daemon clock the operation decided at: the feed drops events older than its
    /// retention as of then.
    at: Millis,
}

/// A waiting allocate call: where its answer goes, and what it waits for.
struct Waiting {
    tx: oneshot::Sender<WaiterAnswer>,
    namespace: NamespaceName,
    token: Token,
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
    /// The frame of the record being appended: one buffer, reused.
    frame: Vec<u8>,
}

impl LogWriter {
    /// Appends to `segment`, numbered `number`, after record `seq`.
    fn new(segment: Arc<dyn Segment>, number: u64, seq: u64) -> LogWriter {
        LogWriter { segment, number, len: 0, seq, next_number: number + 1, frame: Vec::new() }
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
    access: access::Access,
    waiters: HashMap<WaiterId, Waiting>,
    log: LogWriter,
    /// The last revision given to an event (see `watch`).
    revision: u64,
    /// Events of this operation drafted before its changes' (a waiter that gave up, say).
    drafts: Vec<Draft>,
    /// Set once shut down.
    closed: bool,
    /// Set while the state cannot be rebuilt after a failed write.
    broken: Option<String>,
    /// Set for good after an internal error (see [`StoreError::Failed`]): nothing more is
    /// decided or logged from this state.
    failed: Option<String>,
}

impl State {
    /// Whether an operation may change the state: it may be read, and the store is not
    /// shutting down.
    fn usable(&self, shared: &Shared) -> Result<(), StoreError> {
        let shutting_down = shared.shutting_down.load(Ordering::SeqCst) || self.closed;
        if shutting_down && self.failed.is_none() {
            return Err(StoreError::ShuttingDown);
        }
        self.readable()
    }

    /// Whether the state may be read: it has not failed, and it is not being rebuilt.
    fn readable(&self) -> Result<(), StoreError> {
        if let Some(reason) = &self.failed {
            return Err(StoreError::Failed(reason.clone()));
        }
        if let Some(reason) = &self.broken {
            return Err(StoreError::Unavailable(reason.clone()));
        }
        Ok(())
    }

    /// Logs the daemon clock, so leases keep their remaining time across a restart.
    fn checkpoint_clock(&mut self, shared: &Shared) {
        if self.append(shared, Vec::new(), &mut EncodedEvents::default(), shared.clock.now()).is_err() {
            tracing::warn!("the daemon clock could not be logged");
        }
    }

    /// Answers once everything logged so far is durable: a refusal may rest on changes that are
    /// not yet (a lease the sweeper just ended, a grant in the way), and is answered only once
    /// they are, as a change would be (found by the simulator: a keepalive told "not granted"
    /// of a grant whose expiry a power loss then undid).
    fn barrier(&mut self, shared: &Shared, now: Millis) -> Commit {
        self.submit_all(shared, Effects::default(), Vec::new(), Vec::new(), now)
    }

    /// Logs `effects`; the receiver answers once they are durable.
    fn submit(&mut self, shared: &Shared, effects: Effects, now: Millis) -> Commit {
        self.submit_all(shared, effects, Vec::new(), Vec::new(), now)
    }

    /// Stops the store for good after an internal error: from now on every operation is
    /// refused with [`StoreError::Failed`].
    fn fail(&mut self, reason: String) -> StoreError {
        tracing::error!(%reason, "internal error: the store refuses every operation until the daemon is restarted");
        StoreError::Failed(self.failed.get_or_insert(reason).clone())
    }

    /// An outcome of the scheduler that found an invariant broken is not logged: the store fails.
    fn check_outcome(&mut self, outcome: &Outcome) -> Result<(), StoreError> {
        match outcome.broken.is_empty() {
            true => Ok(()),
            false => {
                Err(self.fail(format!("the scheduler found its state inconsistent: {}", outcome.broken.join("; "))))
            }
        }
    }

    /// Logs everything an operation of the scheduler changed, as one record.
    fn submit_outcome(&mut self, shared: &Shared, outcome: Outcome, now: Millis) -> Commit {
        self.submit_all(shared, outcome.ledger, outcome.pools, outcome.apps, now)
    }

    /// Logs writes that carry no event (the access part's).
    fn submit_ops(&mut self, shared: &Shared, ops: Vec<Op>) -> Commit {
        let drafts = std::mem::take(&mut self.drafts);
        self.log_and_answer(shared, ops, Vec::new(), Vec::new(), drafts, shared.clock.now())
    }

    /// Logs a change of the kept runs, and makes it.
    fn submit_runs(&mut self, shared: &Shared, change: RunChange) -> Commit {
        let mut ops = Vec::new();
        let mut drafts = std::mem::take(&mut self.drafts);
        let once = std::iter::once(&change);
        feed::change(&mut ops, &mut drafts, |ops| runs::ops(once, ops), |drafts| feed::runs(&change, drafts));
        runs::apply(&mut self.runs, change);
        self.log_and_answer(shared, ops, Vec::new(), Vec::new(), drafts, shared.clock.now())
    }

    /// Logs ledger effects, pool and application changes as one record; their events are as of
    /// `now`, the time the operation decided at (one reading of the clock per operation).
    fn submit_all(
        &mut self,
        shared: &Shared,
        effects: Effects,
        pool_changes: Vec<PoolChange>,
        app_changes: Vec<AppChange>,
        now: Millis,
    ) -> Commit {
        self.submit_all_and_runs(shared, effects, pool_changes, app_changes, Vec::new(), now)
    }

    /// [`State::submit_all`], with changes of the kept runs first in the same record (their
    /// events before the others'), made to the state here.
    fn submit_all_and_runs(
        &mut self,
        shared: &Shared,
        effects: Effects,
        pool_changes: Vec<PoolChange>,
        app_changes: Vec<AppChange>,
        run_changes: Vec<RunChange>,
        now: Millis,
    ) -> Commit {
        let mut drafts = std::mem::take(&mut self.drafts);
        // About one op and one event per change (a cycle placing 50,000 tasks makes two changes
        // per task): reserved at once, not doubled again and again.
        let changes = run_changes.len() + effects.changes.len() + pool_changes.len() + app_changes.len();
        let mut ops = Vec::with_capacity(changes);
        drafts.reserve(changes);
        // Change by change, the writes then the events, so that an event whose object's record
        // a write holds is written around it (`feed::change`). The writes in the order of the
        // parts: runs, ledger, pools, applications; the events likewise.
        for change in run_changes {
            let once = std::iter::once(&change);
            feed::change(&mut ops, &mut drafts, |ops| runs::ops(once, ops), |drafts| feed::runs(&change, drafts));
            runs::apply(&mut self.runs, change);
        }
        quotas::ops(effects.changes.iter(), &mut ops);
        feed::quotas(&self.ledger, &effects.changes, now, &mut drafts);
        for change in pool_changes.chunks(1) {
            let draft = |drafts: &mut Vec<_>| feed::pools(&self.pools, change, now, drafts);
            feed::change(&mut ops, &mut drafts, |ops| pools::ops(change.iter(), ops), draft);
        }
        for change in app_changes.chunks(1) {
            let draft = |drafts: &mut Vec<_>| feed::apps(&self.sched, change, drafts);
            feed::change(&mut ops, &mut drafts, |ops| apps::ops(change.iter(), ops), draft);
        }
        // The waiters an operation admitted or cancelled, after the changes that did it.
        let waiters = &mut self.waiters;
        let mut woken = Vec::new();
        for w in effects.woken {
            if let Some(waiting) = waiters.remove(&w.waiter) {
                drafts.push(feed::waiter(EventKind::WaiterAdmitted, &waiting.namespace, &waiting.token, None));
                woken.push((waiting.tx, w.grant));
            }
        }
        let mut cancelled = Vec::new();
        for (id, err) in effects.cancelled {
            if let Some(waiting) = waiters.remove(&id) {
                let cause = feed::cancel_cause(&err);
                drafts.push(feed::waiter(EventKind::WaiterGaveUp, &waiting.namespace, &waiting.token, Some(cause)));
                cancelled.push((waiting.tx, err));
            }
        }
        runs::forget_ended(&mut self.runs, &app_changes, &mut ops);
        self.log_and_answer(shared, ops, woken, cancelled, drafts, now)
    }

    /// Appends `ops` (if any) and answers the operation once they are durable; `now` is the
    /// daemon clock read under this lock hold (the record's clock, its events' time).
    fn log_and_answer(
        &mut self,
        shared: &Shared,
        ops: Vec<Op>,
        woken: Vec<(oneshot::Sender<WaiterAnswer>, Grant)>,
        cancelled: Vec<(oneshot::Sender<WaiterAnswer>, LedgerError)>,
        drafts: Vec<Draft>,
        now: Millis,
    ) -> Commit {
        let (ack, rx) = oneshot::channel();
        // Which writes hold an event's object (none, and nothing allocated, on the grants' path).
        let records: Vec<Option<usize>> = match drafts.iter().any(|draft| draft.record.is_some()) {
            true => drafts.iter().map(|draft| draft.record).collect(),
            false => Vec::new(),
        };
        let events = self.stamp(drafts, now);
        let object = |i: usize| records.get(i).copied().flatten().and_then(|op| ops[op].value());
        let mut encoded = EncodedEvents::encode_with(&events, object);
        // Byte for byte what encoding each event whole gives (checked in every test run).
        debug_assert_eq!(encoded.bytes, EncodedEvents::encode(&events).bytes, "events written around records");
        // Events ride in a record, so they are durable with it (one of their own, if need be).
        let appended =
            if ops.is_empty() && events.is_empty() { Ok(()) } else { self.append(shared, ops, &mut encoded, now) };
        let answer = Answer { ack, woken, cancelled, events, encoded, at: now };
        match appended {
            Err(err) => answer.fail(&err),
            Ok(()) => match shared.durability {
                Durability::Process => answer.deliver(shared),
                Durability::Disk => {
                    let mut syncs = lock_plain(&shared.syncs);
                    let idle = syncs.is_empty();
                    syncs.push(Pending { segment: self.log.segment.clone(), answer });
                    let full = syncs.len() == shared.sync_full.load(Ordering::Relaxed);
                    drop(syncs);
                    // The syncer is woken when the queue stops being empty and, while it waits
                    // out the spacing, when the queue holds a whole batch: at most
                    // two wake-ups (system calls) per batch, not one per operation.
                    if idle || full {
                        shared.sync_wanted.notify_one();
                    }
                }
            },
        }
        rx
    }

    /// Appends one record, with `events`. On failure the state is rebuilt from the store before
    /// this returns.
    fn append(
        &mut self,
        shared: &Shared,
        ops: Vec<Op>,
        events: &mut EncodedEvents,
        now: Millis,
    ) -> Result<(), StoreError> {
        let operations = usize::from(!ops.is_empty());
        let record_events =
            events.last_revision().map(|last| wal::Events { last, bytes: std::mem::take(&mut events.bytes) });
        let mut record = WalRecord { seq: self.log.seq + 1, clock: now, ops, events: record_events };
        let mut frame = std::mem::take(&mut self.log.frame);
        record.frame_into(&mut frame);
        // The events' bytes go back to the feed's copy.
        if let Some(written) = record.events.take() {
            events.bytes = written.bytes;
        }
        let started = Instant::now();
        let appended = match self.room_for(shared, frame.len() as u64) {
            Ok(()) => self.log.segment.append(self.log.len, &frame),
            Err(err) => Err(err),
        };
        let written = (frame.len() - wal::TRAILER) as u64;
        // Kept for the next record, unless a large one grew it.
        if frame.capacity() <= FRAME_KEPT_BYTES {
            self.log.frame = frame;
        }
        match appended {
            Ok(()) => {
                self.log.seq += 1;
                self.log.len += written;
                self.ask_for_spare(shared, written);
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
                // Operations appended before, waiting for a sync (the disk level): the rebuild
                // folds their records into the database and publishes their events, so they are
                // answered here, without publishing those events again (found by the simulator:
                // `allot-sim` seed 304, a watcher was sent them twice).
                let waiting = std::mem::take(&mut *lock_plain(&shared.syncs));
                recover(shared, self);
                let unknown = StoreError::OutcomeUnknown(reason.clone());
                for pending in waiting {
                    if self.broken.is_none() {
                        pending.answer.deliver_published(shared);
                    } else {
                        pending.answer.fail(&unknown);
                    }
                }
                Err(if cut { StoreError::Unavailable(reason) } else { StoreError::OutcomeUnknown(reason) })
            }
        }
    }

    /// Once the current segment is half full, asks for spares (`run_spare_maker`), so that moving
    /// to the next segment (here, under the lock, if the checkpointer's seal does not come
    /// first) renames a file and writes none: under a burst the log fills a segment in a
    /// fraction of a second, and making one (16 MB of zeros, synced) held every caller. Asked
    /// once a segment, by the append (of `written` bytes) that takes it past half.
    fn ask_for_spare(&self, shared: &Shared, written: u64) {
        let half = self.log.segment.capacity() / 2;
        let before = self.log.len - written;
        if before >= half || self.log.len < half {
            return;
        }
        // Under the lock the spare maker waits with, so the wake is not lost between its check
        // and its wait.
        let _stop = lock_plain(&shared.stop);
        shared.spare_wanted.store(true, Ordering::SeqCst);
        shared.stop_changed.notify_all();
    }

    /// Moves to a new segment when the current one has no room for `bytes` more: under a burst
    /// that fills one before the checkpointer seals it (every second); made from the spare asked
    /// for at half.
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

async fn durable(rx: Commit) -> Result<(), StoreError> {
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
        let events = dir.join(EVENTS_DIR);
        EmbeddedStore::open_with(opener, Box::new(files), events, config, Background::Spawned)
    }

    /// Opens the store on a redb storage backend and log files of the caller's, its kept events in
    /// `events_dir`; `make_backend` is called again to reopen the database after a failed
    /// checkpoint. For fault-injection tests.
    pub fn open_with_backend<B: StorageBackend>(
        make_backend: impl Fn() -> B + Send + Sync + 'static,
        files: Box<dyn LogFiles>,
        events_dir: PathBuf,
        durability: Durability,
        time: Arc<dyn TimeSource>,
    ) -> Result<EmbeddedStore, OpenError> {
        let opener = backend_opener(make_backend);
        let config = EmbeddedConfig { durability, time, ..EmbeddedConfig::new(PathBuf::new()) };
        EmbeddedStore::open_with(opener, files, events_dir, &config, Background::Spawned)
    }

    /// Opens the store as `config` says, on a redb storage backend and log files of the caller's
    /// (its kept events in `config.data_dir`), with nothing running in the background: no syncer,
    /// checkpointer, sweeper or scheduler. The caller runs each when it chooses with
    /// [`EmbeddedStore::step`] (at the disk level an operation is answered only once a
    /// [`Step::Sync`] made it durable): for a simulator that decides the order of everything.
    #[cfg(feature = "testing")]
    pub fn open_stepped<B: StorageBackend>(
        make_backend: impl Fn() -> B + Send + Sync + 'static,
        files: Box<dyn LogFiles>,
        config: &EmbeddedConfig,
    ) -> Result<EmbeddedStore, OpenError> {
        let opener = backend_opener(make_backend);
        let events = config.data_dir.join(EVENTS_DIR);
        EmbeddedStore::open_with(opener, files, events, config, Background::Stepped)
    }

    /// Runs one step of the background work of a store opened with [`EmbeddedStore::open_stepped`]
    /// (on another store it runs beside its own threads). Answers why the step failed, if it did:
    /// the store goes on as its threads would after the same failure.
    #[cfg(feature = "testing")]
    pub fn step(&self, step: Step) -> Result<(), String> {
        match step {
            Step::Sync => {
                let batch = std::mem::take(&mut *lock_plain(&self.shared.syncs));
                syncer::sync_batch(&self.shared, batch);
                Ok(())
            }
            Step::Checkpoint => checkpoint(&self.shared),
            Step::Sweep => {
                sweeper::sweep(&self.shared);
                Ok(())
            }
            Step::Schedule => {
                apps::cycle(&self.shared);
                Ok(())
            }
        }
    }

    fn open_with(
        opener: Opener,
        files: Box<dyn LogFiles>,
        events_dir: PathBuf,
        config: &EmbeddedConfig,
        background: Background,
    ) -> Result<EmbeddedStore, OpenError> {
        let (durability, time, watch_config) = (config.durability, config.time.clone(), config.watch);
        let db = opener()?;
        let mut archive = Archive::open(events_dir.clone())
            .map_err(|source| OpenError::DataDir { path: events_dir.clone(), source })?;
        let wall = time.wall_ms();
        let Opened { loaded, last_segment, tail_unfolded, feed, start } =
            open::open(&db, files.as_ref(), &mut archive, watch_config, wall)?;
        let Loaded { ledger, pools, mut sched, runs, access, clock, seq } = loaded;
        sched.set_config(config.sched.clone());
        let clock = count_downtime(&db, &mut sched, clock, wall, || match tail_unfolded {
            true => open::fold_log(&db, files.as_ref(), None, &mut archive).map(drop),
            false => Ok(()),
        })?;
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
                access,
                waiters: HashMap::new(),
                log: LogWriter::new(segment, number, seq),
                revision: start,
                drafts: Vec::new(),
                closed: false,
                broken: None,
                failed: None,
            }),
            durability,
            files,
            db: Mutex::new(Some(db)),
            checkpointing: Mutex::new(()),
            archive: Mutex::new(archive),
            opener,
            syncs: Mutex::new(Vec::new()),
            sync_wanted: Condvar::new(),
            sync_full: AtomicUsize::new(0),
            stop: Mutex::new(false),
            crashed: AtomicBool::new(false),
            spare_wanted: AtomicBool::new(false),
            stop_changed: Condvar::new(),
            wake_scheduler: tokio::sync::Notify::new(),
            sched_waiting: AtomicBool::new(true),
            clock: Clock { base: clock, started: time.monotonic_ms(), source: time, wall: Default::default() },
            ids: config.ids.clone(),
            clock_written: AtomicU64::new(clock),
            shutting_down: AtomicBool::new(false),
            shutdown,
            stats: Stats::default(),
            feed,
            refuses_watches: AtomicBool::new(false),
        });
        tracing::info!(clock_ms = clock, seq, %durability, events_kept = shared.feed.kept().0, "embedded store opened");
        if background == Background::Stepped {
            let none = || Mutex::new(None);
            return Ok(EmbeddedStore { shared, threads: Mutex::new(Vec::new()), sweeper: none(), scheduler: none() });
        }
        let spawn = |name: &str, run: fn(&Shared)| {
            let shared = shared.clone();
            std::thread::Builder::new().name(name.into()).spawn(move || run(&shared)).expect("spawning a thread")
        };
        let threads = vec![
            spawn("allot-syncer", run_syncer),
            spawn("allot-checkpointer", run_checkpointer),
            spawn("allot-log-spares", run_spare_maker),
        ];
        let sweeper = tokio::spawn(run_sweeper(shared.clone()));
        // Everything, placements included, is loaded before the scheduler's first cycle.
        let scheduler = tokio::spawn(apps::run_scheduler(shared.clone()));
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

    /// Does now what the sweeper and the scheduler do on their own: one sweep, then one
    /// scheduling cycle, each answered once durable. For tests that move a
    /// [`ManualClock`](crate::clock) on and want its effects without waiting for the next round.
    #[cfg(feature = "testing")]
    pub async fn tick(&self) -> Result<(), StoreError> {
        while let Some((swept, more)) = sweeper::sweep(&self.shared) {
            if let Some(swept) = swept {
                durable(swept).await?;
            }
            if !more {
                break;
            }
        }
        if let Some((_, Some(committed))) = apps::cycle(&self.shared) {
            durable(committed).await?;
        }
        Ok(())
    }

    /// From now on, refuses every watch as a store without a change feed does
    /// ([`WatchError::Unsupported`]); the feed's watchers already started go on. For tests of
    /// what falls back to reading lists.
    #[cfg(feature = "testing")]
    pub fn refuse_watches(&self) {
        self.shared.refuses_watches.store(true, Ordering::SeqCst);
    }

    /// Panics on another thread while holding the state's lock, as a bug would: the store
    /// fails (see [`StoreError::Failed`]). For tests of that path.
    #[cfg(feature = "testing")]
    pub fn panic_under_lock(&self) {
        let shared = self.shared.clone();
        let panicked = std::thread::spawn(move || {
            let _state = lock(&shared);
            panic!("a panic injected under the store's lock");
        })
        .join();
        assert!(panicked.is_err(), "the injected panic happened");
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
            match op(&mut state, now) {
                Ok((value, effects, pool_changes)) => {
                    (Ok(value), state.submit_all(&self.shared, effects, pool_changes, Vec::new(), now))
                }
                Err(err) => (Err(err), state.barrier(&self.shared, now)),
            }
        };
        durable(rx).await?;
        let value = value?;
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
        self.commit_sched_and_runs(Vec::new(), op).await
    }

    /// [`EmbeddedStore::commit_sched`], with `run_changes` made in the same record (before
    /// the scheduler's changes) when the operation succeeds.
    async fn commit_sched_and_runs<T>(
        &self,
        run_changes: Vec<RunChange>,
        op: impl FnOnce(&mut Scheduler, World<'_>, Millis) -> Result<(T, Outcome), StoreError>,
    ) -> Result<T, StoreError> {
        let (value, rx) = {
            let mut state = self.lock();
            state.usable(&self.shared)?;
            let now = self.shared.clock.now();
            let state = &mut *state;
            let world = World { pools: &mut state.pools, ledger: &mut state.ledger };
            match op(&mut state.sched, world, now) {
                Ok((value, outcome)) => {
                    state.check_outcome(&outcome)?;
                    let commit = state.submit_all_and_runs(
                        &self.shared,
                        outcome.ledger,
                        outcome.pools,
                        outcome.apps,
                        run_changes,
                        now,
                    );
                    (Ok(value), commit)
                }
                Err(err) => (Err(err), state.barrier(&self.shared, now)),
            }
        };
        durable(rx).await?;
        let value = value?;
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
        state.readable()?;
        query(&state, self.shared.clock.now())
    }
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    // A panic while the lock was held may have left the state half-changed: the store fails
    // (every operation refused until a restart rebuilds the state from the log).
    shared.state.lock().unwrap_or_else(|poisoned| {
        let mut state = poisoned.into_inner();
        if state.failed.is_none() {
            state.fail("a panic while the store's state was locked".to_owned());
        }
        state
    })
}

impl WatchStore for EmbeddedStore {
    fn watch(&self, filter: Filter, since: Option<u64>) -> Result<Watcher, WatchError> {
        self.may_watch(since)?;
        self.shared.feed.subscribe(filter, since)
    }

    fn watch_inside(&self, filter: Filter, since: Option<u64>) -> Result<Watcher, WatchError> {
        self.may_watch(since)?;
        self.shared.feed.subscribe_inside(filter, since)
    }

    fn revision(&self) -> u64 {
        self.shared.feed.revision()
    }

    fn feed_kept(&self) -> (usize, u64) {
        self.shared.feed.kept()
    }
}

impl EmbeddedStore {
    /// Whether a watch after `since` may start: the feed is served and open, and `since` is
    /// one of this store's revisions.
    fn may_watch(&self, since: Option<u64>) -> Result<(), WatchError> {
        if self.shared.refuses_watches.load(Ordering::SeqCst) {
            return Err(WatchError::Unsupported { backend: "embedded" });
        }
        if self.shared.shutting_down.load(Ordering::SeqCst) {
            return Err(WatchError::Closed);
        }
        // Every revision a caller can know was published before it asked: one above the newest
        // is another store's (one that went on after the snapshot restored here).
        let newest = self.shared.feed.revision();
        if let Some(since) = since.filter(|since| *since > newest) {
            return Err(WatchError::Ahead { since, newest });
        }
        Ok(())
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

    fn wall_ms(&self) -> Millis {
        self.shared.clock.source.wall_ms()
    }

    fn now_and_wall(&self) -> (Millis, Millis) {
        self.shared.clock.now_and_wall()
    }

    fn commit_stats(&self) -> CommitStats {
        self.shared.stats.read()
    }

    fn snapshot(
        &self,
        out: &mut dyn std::io::Write,
    ) -> Result<(crate::snapshot::SnapshotHeader, crate::snapshot::SnapshotSummary), StoreError> {
        EmbeddedStore::snapshot(self, out)
    }

    async fn check_ready(&self) -> Result<(), StoreError> {
        self.lock().usable(&self.shared)
    }

    async fn finish_runs(
        &self,
        ends: Vec<(allot_core::apps::TaskEnd, Option<allot_core::runs::Run>)>,
    ) -> Result<Vec<Result<crate::TaskInfo, allot_core::apps::SchedError>>, StoreError> {
        let mut reports = Vec::with_capacity(ends.len());
        let mut runs = Vec::new();
        for (end, run) in ends {
            if let Some(run) = run {
                runs.push(RunChange::Put { app: end.app.clone(), task: end.task.clone(), run: Box::new(run) });
            }
            reports.push(end);
        }
        // The runs and the reports in one record.
        self.commit_sched_and_runs(runs, |sched, mut world, now| {
            let (answers, outcome) = sched.finish_tasks(reports, now, &mut world);
            let answers = answers.into_iter().map(|a| a.map(|task| crate::TaskInfo { task, why: None })).collect();
            Ok((answers, outcome))
        })
        .await
    }

    async fn shutdown(&self) {
        self.shared.feed.close();
        if self.shared.shutting_down.swap(true, Ordering::SeqCst) {
            return;
        }
        self.shared.shutdown.send_replace(true);
        // Waiters are answered with their place in the queue.
        self.lock().refuse_every_waiter(&self.shared);
        // A last record holds the clock, so leases resume with the TTL they had left, and the
        // exact next fencing numbers, so numbering resumes without a jump. No grant can follow
        // it: `usable` refuses every operation once `shutting_down` is set.
        let flushed = {
            let mut state = self.lock();
            // Nothing more is logged from a state that may be half-changed.
            state.failed.is_none().then(|| {
                let changes = state.ledger.fencing_checkpoint();
                state.checkpoint_clock(&self.shared);
                let now = self.shared.clock.now();
                state.submit(&self.shared, Effects { changes, ..Effects::default() }, now)
            })
        };
        if let Some(Err(err)) = match flushed {
            Some(flushed) => Some(durable(flushed).await),
            None => None,
        } {
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
