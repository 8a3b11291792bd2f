//! The embedded backend: the ledger in memory, its changes group-committed to a redb file.
//!
//! How an operation runs:
//! 1. Under the state lock, the ledger decides, and the resulting changes are queued to the
//!    committer thread. Queueing under the lock keeps the queue in decision order.
//! 2. The committer takes everything queued so far, writes it in one redb write transaction with
//!    immediate durability (one fsync for the whole batch: group commit), then answers every
//!    operation of the batch and hands woken waiters their grants.
//! 3. If a commit fails (disk full, I/O error), the database is reopened and the ledger rebuilt
//!    from it before anyone is answered, so memory again equals the file. The batch's operations
//!    are answered `Unavailable` if the file does not hold the batch, `OutcomeUnknown` if it does
//!    (the fsync failed after the header was written) or cannot be reopened. Operations decided
//!    on the discarded state (an older epoch) fail too.
//!
//! The daemon clock starts, at open, from the clock value of the last commit, so time the daemon
//! was down does not count against leases. A sweeper task ends expired leases every
//! [`SWEEP_INTERVAL`] and checkpoints the clock at least once a second.

mod apps;
mod pools;
mod quotas;
mod runs;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use allot_core::pool::{AllocId, EndedAlloc, Labels, LeaseRules, PoolChange, PoolError, PoolName, Pools};
use allot_core::sched::{AppChange, Outcome, Scheduler, World};
use allot_core::{Change, Effects, Grant, Ledger, LedgerError, Millis, NamespaceName, Session, SessionId, WaiterId};
use async_trait::async_trait;
use redb::{Database, Durability, ReadableTable, StorageBackend};
use tokio::sync::{oneshot, watch};

use crate::records::apps::{APPS, QUEUES, TASKS};
use crate::records::runs::{CATALOG, RUNS};
use crate::records::{
    decode, encode, resources_from, resources_record, AllocRecord, CorruptRecord, GrantRecord, NamespaceRecord,
    PoolRecord, SessionRecord, ALLOCS, FORMAT_VERSION, GRANTS, META, META_CLOCK, META_FORMAT, META_SEQ, NAMESPACES,
    POOLS, POOL_LABELS, RETIRED_FENCING, SESSIONS,
};
use crate::runs::RunChange;
use crate::{expires_in, Allocation, CommitStats, GrantInfo, SessionInfo, Store, StoreError};

/// How often the sweeper looks for expired leases.
pub const SWEEP_INTERVAL: Duration = Duration::from_millis(50);
/// The longest the daemon clock goes without being made durable.
const CLOCK_CHECKPOINT_MS: u64 = 1000;
/// The most operations in one commit.
const MAX_BATCH: usize = 8192;
/// The name of the database file in the data directory.
pub const DB_FILE: &str = "allot.redb";

/// Where the embedded store keeps its data.
#[derive(Debug, Clone)]
pub struct EmbeddedConfig {
    pub data_dir: PathBuf,
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
    #[error(transparent)]
    Corrupt(#[from] CorruptRecord),
    #[error("the database's records do not fit together: {0}")]
    Restore(#[from] allot_core::RestoreError),
    #[error("the database's pool records do not fit together: {0}")]
    RestorePools(#[from] PoolError),
    #[error("the database was written in format {found}; this allot reads format {FORMAT_VERSION}")]
    Format { found: u64 },
}

/// Opens the database again, after a failed commit left it unusable.
type Opener = Box<dyn Fn() -> Result<Database, OpenError> + Send>;

/// The token quotas, in memory, made durable in a redb file.
pub struct EmbeddedStore {
    shared: Arc<Shared>,
    committer: Mutex<Option<std::thread::JoinHandle<()>>>,
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
    /// Wakes the scheduler for a cycle: something it places, or places on, changed.
    wake_scheduler: tokio::sync::Notify,
    /// Set by the scheduler when something waits: then a change that frees room or tokens wakes it.
    sched_waiting: AtomicBool,
    clock: Clock,
    /// Bumped when a failed commit discards the in-memory state; queued work of older epochs fails.
    epoch: AtomicU64,
    /// The daemon clock value of the last commit.
    clock_written: AtomicU64,
    shutting_down: AtomicBool,
    shutdown: watch::Sender<bool>,
    commits: AtomicU64,
    operations: AtomicU64,
    commit_micros: AtomicU64,
    failures: AtomicU64,
}

/// What a waiting allocate call is told.
enum WaiterAnswer {
    Granted(Grant),
    Cancelled(LedgerError),
    Failed(StoreError),
}

type Ack = oneshot::Sender<Result<(), StoreError>>;

/// One operation's changes on their way to disk, with whom to tell once they are there.
struct Pending {
    epoch: u64,
    changes: Vec<Change>,
    pool_changes: Vec<PoolChange>,
    app_changes: Vec<AppChange>,
    run_changes: Vec<RunChange>,
    ack: Option<Ack>,
    woken: Vec<(oneshot::Sender<WaiterAnswer>, Grant)>,
    cancelled: Vec<(oneshot::Sender<WaiterAnswer>, LedgerError)>,
}

struct State {
    ledger: Ledger,
    pools: Pools,
    sched: Scheduler,
    runs: runs::Runs,
    waiters: HashMap<WaiterId, oneshot::Sender<WaiterAnswer>>,
    /// `None` once shut down.
    queue: Option<mpsc::Sender<Pending>>,
    /// Set while the database cannot be reopened after a failed commit.
    broken: Option<String>,
}

impl State {
    fn usable(&self, shared: &Shared) -> Result<(), StoreError> {
        if shared.shutting_down.load(Ordering::SeqCst) || self.queue.is_none() {
            return Err(StoreError::ShuttingDown);
        }
        if let Some(reason) = &self.broken {
            return Err(StoreError::Unavailable(reason.clone()));
        }
        Ok(())
    }

    /// Queues a commit of nothing: every commit makes the daemon clock durable.
    fn checkpoint(&mut self, shared: &Shared) -> oneshot::Receiver<Result<(), StoreError>> {
        self.submit(shared, Effects::default())
    }

    /// Queues `effects` for commit; the receiver answers once they are durable.
    fn submit(&mut self, shared: &Shared, effects: Effects) -> oneshot::Receiver<Result<(), StoreError>> {
        self.submit_all(shared, effects, Vec::new(), Vec::new())
    }

    /// Queues everything an operation of the scheduler changed for one commit.
    fn submit_outcome(&mut self, shared: &Shared, outcome: Outcome) -> oneshot::Receiver<Result<(), StoreError>> {
        self.submit_all(shared, outcome.ledger, outcome.pools, outcome.apps)
    }

    /// Queues a change of the kept runs for commit.
    fn submit_runs(&mut self, shared: &Shared, change: RunChange) -> oneshot::Receiver<Result<(), StoreError>> {
        let (ack, rx) = oneshot::channel();
        let pending = Pending {
            epoch: shared.epoch.load(Ordering::SeqCst),
            changes: Vec::new(),
            pool_changes: Vec::new(),
            app_changes: Vec::new(),
            run_changes: vec![change],
            ack: Some(ack),
            woken: Vec::new(),
            cancelled: Vec::new(),
        };
        self.send(pending);
        rx
    }

    /// Queues ledger effects and pool changes for one commit.
    fn submit_all(
        &mut self,
        shared: &Shared,
        effects: Effects,
        pool_changes: Vec<PoolChange>,
        app_changes: Vec<AppChange>,
    ) -> oneshot::Receiver<Result<(), StoreError>> {
        let (ack, rx) = oneshot::channel();
        let waiters = &mut self.waiters;
        let woken: Vec<_> =
            effects.woken.into_iter().filter_map(|w| waiters.remove(&w.waiter).map(|tx| (tx, w.grant))).collect();
        let cancelled: Vec<_> =
            effects.cancelled.into_iter().filter_map(|(id, err)| waiters.remove(&id).map(|tx| (tx, err))).collect();
        let pending = Pending {
            epoch: shared.epoch.load(Ordering::SeqCst),
            changes: effects.changes,
            pool_changes,
            app_changes,
            run_changes: Vec::new(),
            ack: Some(ack),
            woken,
            cancelled,
        };
        self.send(pending);
        rx
    }

    fn send(&self, pending: Pending) {
        match &self.queue {
            Some(queue) => {
                if let Err(unsent) = queue.send(pending) {
                    fail(vec![unsent.0], &StoreError::ShuttingDown);
                }
            }
            None => fail(vec![pending], &StoreError::ShuttingDown),
        }
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

impl EmbeddedStore {
    /// Opens (or creates) the store in `config.data_dir`. Must be called inside a tokio runtime:
    /// it spawns the sweeper.
    pub fn open(config: &EmbeddedConfig) -> Result<EmbeddedStore, OpenError> {
        let dir = config.data_dir.clone();
        std::fs::create_dir_all(&dir).map_err(|source| OpenError::DataDir { path: dir.clone(), source })?;
        let path = dir.join(DB_FILE);
        let opener: Opener = Box::new(move || open_file(&path));
        EmbeddedStore::open_with(opener)
    }

    /// Opens the store on a redb storage backend; `make_backend` is called again to reopen it
    /// after a failed commit. For fault-injection tests.
    pub fn open_with_backend<B: StorageBackend>(
        make_backend: impl Fn() -> B + Send + 'static,
    ) -> Result<EmbeddedStore, OpenError> {
        let opener: Opener = Box::new(move || {
            redb::Builder::new()
                .create_with_backend(make_backend())
                .map_err(|err| OpenError::Database { path: PathBuf::from("<backend>"), reason: redb_error(err) })
        });
        EmbeddedStore::open_with(opener)
    }

    fn open_with(opener: Opener) -> Result<EmbeddedStore, OpenError> {
        let db = opener()?;
        let Loaded { ledger, pools, sched, runs, clock, seq } = load(&db)?;
        let (queue, receiver) = mpsc::channel();
        let (shutdown, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                ledger,
                pools,
                sched,
                runs,
                waiters: HashMap::new(),
                queue: Some(queue),
                broken: None,
            }),
            wake_scheduler: tokio::sync::Notify::new(),
            sched_waiting: AtomicBool::new(true),
            clock: Clock { base: clock, started: Instant::now() },
            epoch: AtomicU64::new(0),
            clock_written: AtomicU64::new(clock),
            shutting_down: AtomicBool::new(false),
            shutdown,
            commits: AtomicU64::new(0),
            operations: AtomicU64::new(0),
            commit_micros: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        });
        let committer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("allot-committer".into())
                .spawn(move || run_committer(&shared, Some(db), seq, &opener, &receiver))
                .expect("spawning a thread")
        };
        let sweeper = tokio::spawn(run_sweeper(shared.clone()));
        // Everything, placements included, is loaded before the scheduler's first cycle.
        let scheduler = tokio::spawn(apps::run_scheduler(shared.clone()));
        tracing::info!(clock_ms = clock, "embedded store opened");
        Ok(EmbeddedStore {
            shared,
            committer: Mutex::new(Some(committer)),
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

/// Reads every record and rebuilds the ledger.
fn load(db: &Database) -> Result<Loaded, OpenError> {
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
    drop(txn);
    load_records(db)
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

/// Writes every change of `batch` in one durable transaction.
// redb's error is large, but it is returned once per batch, not per operation.
#[allow(clippy::result_large_err)]
fn write_batch(db: &Database, batch: &[Pending], seq: u64, now: Millis) -> Result<(), redb::Error> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate);
    {
        let mut namespaces = txn.open_table(NAMESPACES)?;
        let mut retired = txn.open_table(RETIRED_FENCING)?;
        let mut grants = txn.open_table(GRANTS)?;
        let mut sessions = txn.open_table(SESSIONS)?;
        let mut meta = txn.open_table(META)?;
        let changes: Vec<&Change> = batch.iter().flat_map(|p| &p.changes).collect();
        let superseded = superseded_upserts(&changes);
        for (index, change) in changes.into_iter().enumerate() {
            if superseded[index] {
                continue;
            }
            match change {
                Change::Namespace { name, quota, next_fencing } => {
                    let record = NamespaceRecord { quota: *quota, next_fencing: *next_fencing };
                    namespaces.insert(name.as_str(), encode(&record).as_slice())?;
                    retired.remove(name.as_str())?;
                }
                Change::NamespaceRemoved { name, next_fencing } => {
                    namespaces.remove(name.as_str())?;
                    retired.insert(name.as_str(), next_fencing)?;
                    // Every grant of the namespace sorts at or after (name, ""), before any other
                    // namespace's; tokens may be any text, so there is no fixed upper bound.
                    let name = name.as_str();
                    let mut doomed = Vec::new();
                    for entry in grants.range((name, "")..)? {
                        let (key, _) = entry?;
                        let (namespace, token) = key.value();
                        if namespace != name {
                            break;
                        }
                        doomed.push(token.to_owned());
                    }
                    for token in &doomed {
                        grants.remove((name, token.as_str()))?;
                    }
                }
                Change::Grant(grant) => {
                    let record = GrantRecord::from_grant(grant);
                    grants.insert((grant.namespace.as_str(), grant.token.as_str()), encode(&record).as_slice())?;
                }
                Change::GrantRemoved { namespace, token } => {
                    grants.remove((namespace.as_str(), token.as_str()))?;
                }
                Change::Session { id, ttl_ms, deadline } => {
                    let record = SessionRecord { ttl_ms: *ttl_ms, deadline: *deadline };
                    sessions.insert(id.0, encode(&record).as_slice())?;
                }
                Change::SessionRemoved { id } => {
                    sessions.remove(id.0)?;
                }
            }
        }
        let mut pools = txn.open_table(POOLS)?;
        let mut allocs = txn.open_table(ALLOCS)?;
        let mut pool_labels = txn.open_table(POOL_LABELS)?;
        for change in batch.iter().flat_map(|p| &p.pool_changes) {
            match change {
                PoolChange::Pool { name, capacity, stopped, labels } => {
                    let record = PoolRecord { capacity: resources_record(capacity), stopped: *stopped };
                    pools.insert(name.as_str(), encode(&record).as_slice())?;
                    if labels.is_empty() {
                        pool_labels.remove(name.as_str())?;
                    } else {
                        pool_labels.insert(name.as_str(), encode(labels).as_slice())?;
                    }
                }
                PoolChange::PoolRemoved { name } => {
                    pools.remove(name.as_str())?;
                    pool_labels.remove(name.as_str())?;
                    let name = name.as_str();
                    allocs.retain_in((name, 0)..=(name, u64::MAX), |_, _| false)?;
                }
                PoolChange::Alloc(alloc) => {
                    let record = AllocRecord::live(alloc);
                    allocs.insert((alloc.pool.as_str(), alloc.id.0), encode(&record).as_slice())?;
                }
                // Ended allocs are kept in memory only (readable until the daemon restarts):
                // writing them would grow the table with every freed alloc.
                PoolChange::AllocEnded(ended) => {
                    allocs.remove((ended.alloc.pool.as_str(), ended.alloc.id.0))?;
                }
                PoolChange::EndedDropped { .. } => {}
            }
        }
        apps::write(&txn, batch.iter().flat_map(|p| &p.app_changes))?;
        runs::write(&txn, batch.iter().flat_map(|p| &p.run_changes))?;
        meta.insert(META_CLOCK, now)?;
        meta.insert(META_SEQ, seq)?;
    }
    txn.commit()?;
    Ok(())
}

/// Marks the upserts that a later change of the same record in the batch makes pointless (every
/// grant rewrites its namespace's fencing number, so a batch of grants writes it once).
/// Removals always run: a namespace removal also deletes that namespace's grants.
fn superseded_upserts(changes: &[&Change]) -> Vec<bool> {
    #[derive(PartialEq, Eq, Hash)]
    enum Key<'a> {
        Namespace(&'a str),
        Grant(&'a str, &'a str),
        Session(u128),
    }
    // The record a change touches, and whether the change is an upsert.
    fn key(change: &Change) -> (Key<'_>, bool) {
        match change {
            Change::Namespace { name, .. } => (Key::Namespace(name.as_str()), true),
            Change::NamespaceRemoved { name, .. } => (Key::Namespace(name.as_str()), false),
            Change::Grant(grant) => (Key::Grant(grant.namespace.as_str(), grant.token.as_str()), true),
            Change::GrantRemoved { namespace, token } => (Key::Grant(namespace.as_str(), token.as_str()), false),
            Change::Session { id, .. } => (Key::Session(id.0), true),
            Change::SessionRemoved { id } => (Key::Session(id.0), false),
        }
    }
    let mut seen = std::collections::HashSet::new();
    let mut superseded = vec![false; changes.len()];
    for (index, change) in changes.iter().enumerate().rev() {
        let (key, upsert) = key(change);
        let later_exists = !seen.insert(key);
        superseded[index] = upsert && later_exists;
    }
    superseded
}

fn run_committer(
    shared: &Shared,
    mut db: Option<Database>,
    mut seq: u64,
    opener: &Opener,
    queue: &mpsc::Receiver<Pending>,
) {
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(pending) => batch.push(pending),
                Err(_) => break,
            }
        }
        let epoch = shared.epoch.load(Ordering::SeqCst);
        let (batch, stale): (Vec<Pending>, Vec<Pending>) = batch.into_iter().partition(|p| p.epoch == epoch);
        fail(stale, &StoreError::Unavailable("an earlier change could not be written".into()));
        let Some(database) = &db else {
            // A previous failure left the database closed: try to reopen before anything else.
            fail(batch, &StoreError::Unavailable("the database is being reopened after a failed write".into()));
            if let Some((reopened, on_disk)) = recover(shared, None, opener) {
                db = Some(reopened);
                seq = on_disk;
            }
            continue;
        };
        let now = shared.clock.now();
        let started = Instant::now();
        match write_batch(database, &batch, seq + 1, now) {
            Ok(()) => {
                seq += 1;
                shared.commits.fetch_add(1, Ordering::Relaxed);
                shared.operations.fetch_add(batch.len() as u64, Ordering::Relaxed);
                shared.commit_micros.fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
                shared.clock_written.store(now, Ordering::Relaxed);
                deliver(batch);
            }
            Err(err) => {
                let reason = err.to_string();
                tracing::error!(error = %reason, operations = batch.len(), "commit failed; rebuilding from the database");
                shared.failures.fetch_add(1, Ordering::Relaxed);
                // Rebuild before answering: a caller that acts on this answer must find the
                // rebuilt state, not the discarded one.
                let attempted = seq + 1;
                let answer = match recover(shared, db.take(), opener) {
                    Some((reopened, on_disk)) => {
                        db = Some(reopened);
                        seq = on_disk;
                        if on_disk >= attempted {
                            // The commit failed after its header was written (a failed fsync):
                            // the batch is in the file and the rebuilt state, maybe not on disk.
                            StoreError::OutcomeUnknown(reason)
                        } else {
                            StoreError::Unavailable(reason)
                        }
                    }
                    None => StoreError::OutcomeUnknown(reason),
                };
                fail(batch, &answer);
            }
        }
    }
    tracing::debug!("committer stopped");
}

fn deliver(batch: Vec<Pending>) {
    for pending in batch {
        if let Some(ack) = pending.ack {
            let _ = ack.send(Ok(()));
        }
        for (tx, grant) in pending.woken {
            let _ = tx.send(WaiterAnswer::Granted(grant));
        }
        for (tx, err) in pending.cancelled {
            let _ = tx.send(WaiterAnswer::Cancelled(err));
        }
    }
}

fn fail(batch: Vec<Pending>, err: &StoreError) {
    for pending in batch {
        if let Some(ack) = pending.ack {
            let _ = ack.send(Err(err.clone()));
        }
        for (tx, _) in pending.woken {
            let _ = tx.send(WaiterAnswer::Failed(err.clone()));
        }
        for (tx, _) in pending.cancelled {
            let _ = tx.send(WaiterAnswer::Failed(err.clone()));
        }
    }
}

/// After a failed commit: discard the in-memory state and rebuild it from the database. Returns
/// the reopened database and the number of its last commit, or `None` if it cannot be reopened.
fn recover(shared: &Shared, old: Option<Database>, opener: &Opener) -> Option<(Database, u64)> {
    let mut state = lock(shared);
    shared.epoch.fetch_add(1, Ordering::SeqCst);
    drop(old);
    for (_, tx) in state.waiters.drain() {
        let err = StoreError::Unavailable("the store could not be written; the wait was ended".into());
        let _ = tx.send(WaiterAnswer::Failed(err));
    }
    let reopened = opener().and_then(|db| load(&db).map(|loaded| (db, loaded)));
    match reopened {
        Ok((db, Loaded { mut ledger, mut pools, sched, runs, seq, .. })) => {
            ledger.carry_over_from(&state.ledger);
            state.ledger = ledger;
            pools.set_rules(state.pools.rules());
            state.pools = pools;
            state.sched = sched;
            state.runs = runs;
            state.broken = None;
            tracing::info!(seq, "store rebuilt from the database");
            Some((db, seq))
        }
        Err(err) => {
            tracing::error!(error = %err, "cannot reopen the database; retrying");
            state.broken = Some(format!("the database cannot be reopened: {err}"));
            None
        }
    }
}

async fn run_sweeper(shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(SWEEP_INTERVAL) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        let mut state = lock(&shared);
        if state.queue.is_none() {
            return;
        }
        let now = shared.clock.now();
        if state.broken.is_some() {
            // Wake the committer so it retries reopening the database.
            drop(state.checkpoint(&shared));
            continue;
        }
        let effects = state.ledger.expire(now);
        if effects.expired > 0 {
            tracing::debug!(expired = effects.expired, "leases expired");
        }
        let pool_changes = state.pools.sweep(now);
        let checkpoint_due = now.saturating_sub(shared.clock_written.load(Ordering::Relaxed)) >= CLOCK_CHECKPOINT_MS;
        if !effects.changes.is_empty() || !effects.cancelled.is_empty() || !pool_changes.is_empty() {
            drop(state.submit_all(&shared, effects, pool_changes, Vec::new()));
        }
        if checkpoint_due {
            drop(state.checkpoint(&shared));
        }
    }
}

#[async_trait]
impl Store for EmbeddedStore {
    fn backend(&self) -> &'static str {
        "embedded"
    }

    fn now(&self) -> Millis {
        self.shared.clock.now()
    }

    fn commit_stats(&self) -> CommitStats {
        CommitStats {
            commits: self.shared.commits.load(Ordering::Relaxed),
            operations: self.shared.operations.load(Ordering::Relaxed),
            commit_micros: self.shared.commit_micros.load(Ordering::Relaxed),
            failures: self.shared.failures.load(Ordering::Relaxed),
        }
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
        // A last commit makes the clock durable, so leases resume with the TTL they had left,
        // and the exact next fencing numbers, so numbering resumes without a jump. No grant can
        // follow it: `usable` refuses every operation once `shutting_down` is set.
        let flushed = {
            let mut state = self.lock();
            let changes = state.ledger.fencing_checkpoint();
            state.submit(&self.shared, Effects { changes, ..Effects::default() })
        };
        if let Err(err) = durable(flushed).await {
            tracing::warn!(error = %err, "the final flush failed");
        }
        // Closing the queue lets the committer write what is left and stop.
        self.lock().queue = None;
        let committer = self.committer.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(committer) = committer {
            let _ = tokio::task::spawn_blocking(move || committer.join()).await;
        }
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

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        // Without a shutdown, still stop the background work so the database file is released.
        self.shared.shutting_down.store(true, Ordering::SeqCst);
        self.shared.shutdown.send_replace(true);
        lock(&self.shared).queue = None;
        if let Some(committer) = self.committer.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = committer.join();
        }
    }
}
