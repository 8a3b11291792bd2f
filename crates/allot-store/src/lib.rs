//! The `Store` trait: every operation of allot, as a backend carries it out.
//!
//! - One trait per part, in a module of its own: `quotas` ([`QuotaStore`]), `pools`
//!   ([`PoolStore`]), `apps` ([`AppStore`]), `runs` ([`RunStore`]); [`Store`] is all four and
//!   what the backend as a whole does.
//! - `embedded`: the default backend. The decisions are the core's, in memory; every change is
//!   appended to a write-ahead log, checkpointed into a redb database, and an operation is
//!   answered only once its changes are durable at the chosen [`Durability`] (on disk, or handed
//!   to the operating system).
//! - `records`: the versioned on-disk format of the embedded backend.
//! - `clock`: where a backend reads the time ([`clock::TimeSource`]), `allot_core::clock` re-exported.
//! - `quiet`: repeated log lines kept to a few.
//! - With the `testing` feature (for tests, not shipped): `conformance`, the behaviour every
//!   backend must show, as a suite of checks over `&dyn Store`; `fault`, a storage backend that
//!   fails like a full disk; and `clock::ManualClock`.
//!
//! Architecture invariant: an answer that says something was granted, released, renewed or
//! changed is given only after that change is durable; a change that fails to become durable is
//! answered with [`StoreError::Unavailable`] and is not visible afterwards (or, when it may have
//! been applied, [`StoreError::OutcomeUnknown`] and is visible exactly if it was).

pub mod access;
pub mod apps;
pub use allot_core::clock;
#[cfg(feature = "testing")]
pub mod conformance;
pub mod embedded;
mod event;
#[cfg(feature = "testing")]
pub mod fault;
pub mod ids;
pub mod pools;
pub mod quiet;
pub mod quotas;
pub mod records;
pub mod runs;
pub mod snapshot;
pub mod snapshot_rebase;
pub mod watch;

/// The traits whose methods a caller of `dyn Store` uses: `use allot_store::prelude::*;`.
pub mod prelude {
    pub use crate::access::AccessStore;
    pub use crate::apps::AppStore;
    pub use crate::pools::PoolStore;
    pub use crate::quotas::QuotaStore;
    pub use crate::runs::RunStore;
    pub use crate::watch::WatchStore;
    pub use crate::Store;
}

use std::time::Duration;

use allot_core::pools::PoolError;
use allot_core::{LedgerError, Millis};
use async_trait::async_trait;

pub use access::{AccessRecords, AccessStore, ApiTokenRecord, BindingRecord};
pub use apps::{AppInfo, AppStore, AppsHome, Submitted, TaskInfo};
pub use embedded::{Durability, EmbeddedConfig, EmbeddedStore};
pub use pools::PoolStore;
pub use quotas::{expires_in, Allocation, GrantInfo, QuotaStore, SessionInfo};
pub use runs::{keep_first, put_runs_of_ends, runners_of, CachedOutputs, ExecutorLease, RunChange, RunStore};
pub use watch::{Event, EventObject, WatchConfig, WatchError, WatchStore, Watcher};

/// The longest an allocate call may wait for room.
pub const MAX_WAIT: Duration = Duration::from_secs(300);

/// Refuses a wait longer than [`MAX_WAIT`].
pub fn check_wait(wait: Duration) -> Result<(), StoreError> {
    if wait > MAX_WAIT {
        return Err(StoreError::Invalid(format!(
            "a wait of {} ms is too long; the limit is {} ms",
            wait.as_millis(),
            MAX_WAIT.as_millis()
        )));
    }
    Ok(())
}

/// The most items one page of a list holds.
pub const MAX_PAGE: usize = 1000;

/// Where a page of a list starts and how many items it may hold. Every list of a [`Store`] is
/// in a stable order of a key (a name, a token, an id, an arrival number); a page holds the items
/// whose keys come after `after`, so a page read after changes neither repeats nor skips an item
/// that stayed listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageRequest<K> {
    after: Option<K>,
    limit: usize,
}

impl<K> PageRequest<K> {
    /// The page after key `after` (`None`: the first page) of at most `limit` items; the limit is
    /// clamped into `1..=MAX_PAGE`.
    pub fn new(after: Option<K>, limit: usize) -> PageRequest<K> {
        PageRequest { after, limit: limit.clamp(1, MAX_PAGE) }
    }

    /// The first page of at most `limit` items.
    pub fn first(limit: usize) -> PageRequest<K> {
        PageRequest::new(None, limit)
    }

    /// The key the page starts after, if any.
    pub fn after(&self) -> Option<&K> {
        self.after.as_ref()
    }

    /// At most this many items, between 1 and [`MAX_PAGE`].
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The same page, its key converted.
    pub fn map<L>(self, convert: impl FnOnce(K) -> L) -> PageRequest<L> {
        PageRequest { after: self.after.map(convert), limit: self.limit }
    }
}

/// One page of a list, in the list's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T, K> {
    pub items: Vec<T>,
    /// Where the next page starts (its `after`); `None` on the last page. A page may hold fewer
    /// items than asked (even none) and still have a next one, when items went away while it
    /// was read.
    pub next: Option<K>,
}

impl<T, K> Page<T, K> {
    /// The page of `items`, read in order as up to `limit + 1` items: an item beyond `limit`
    /// only says that more follow.
    pub fn from_read(mut items: Vec<T>, limit: usize, key: impl Fn(&T) -> K) -> Page<T, K> {
        let next = if items.len() > limit {
            items.truncate(limit);
            items.last().map(key)
        } else {
            None
        };
        Page { items, next }
    }
}

/// Reads a whole list page by page, from the first: `read` is one list call of a [`Store`],
/// e.g. `read_all(|page| store.namespaces(page))`.
pub async fn read_all<T, K, F, Fut>(read: F) -> Result<Vec<T>, StoreError>
where
    F: FnMut(PageRequest<K>) -> Fut,
    Fut: std::future::Future<Output = Result<Page<T, K>, StoreError>>,
{
    let mut all = Vec::new();
    for_each_page(read, |item| all.push(item)).await?;
    Ok(all)
}

/// Reads a whole list page by page, as [`read_all`], handing each item to `each` without keeping
/// the list.
pub async fn for_each_page<T, K, F, Fut>(mut read: F, mut each: impl FnMut(T)) -> Result<(), StoreError>
where
    F: FnMut(PageRequest<K>) -> Fut,
    Fut: std::future::Future<Output = Result<Page<T, K>, StoreError>>,
{
    let mut after = None;
    loop {
        let page = read(PageRequest::new(after, MAX_PAGE)).await?;
        page.items.into_iter().for_each(&mut each);
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok(()),
        }
    }
}

/// A failed store operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The request was refused by the rules of the token quotas (unknown namespace, stale
    /// fencing...).
    #[error(transparent)]
    Quotas(#[from] LedgerError),
    /// The store could not be reached or written (a full disk, Redis down); nothing was changed.
    #[error("the store is unavailable ({0}); nothing was changed")]
    Unavailable(String),
    /// The change was written or sent, and then its answer was lost: the disk failed while making
    /// it durable, or Redis did not answer a call it was sent. It may or may not have been
    /// applied. Read it back, or retry (allocate and release are idempotent). The reason names
    /// what failed.
    #[error("{0}; the change may or may not have been applied: read it back or retry")]
    OutcomeUnknown(String),
    /// A change refused before it was applied: the Redis primary that holds it has fewer
    /// replicas attached than `--redis-min-replicas` requires (a failover left it none, or they
    /// fell behind). Nothing was changed; retry once a replica is attached.
    #[error("{0}; nothing was changed")]
    NotEnoughReplicas(String),
    /// The daemon is shutting down and takes no new work.
    #[error("the daemon is shutting down")]
    ShuttingDown,
    /// The store stopped after an internal error (a broken invariant, a panic while its state
    /// was locked): its state in memory may be half-changed, so it refuses every operation until
    /// the daemon is restarted and rebuilds it from the log, which holds nothing half-applied.
    #[error("the store stopped after an internal error ({0}); it refuses every operation until the daemon is restarted, and nothing half-applied was written")]
    Failed(String),
    /// A request the store refuses outright, such as a wait longer than [`MAX_WAIT`].
    #[error("{0}")]
    Invalid(String),
    /// The request was refused by the rules of the pools (unknown pool, offer expired...).
    #[error(transparent)]
    Pools(#[from] PoolError),
    /// The request was refused by the rules of the applications (unknown queue, illegal
    /// transition...).
    #[error(transparent)]
    Apps(#[from] allot_core::apps::SchedError),
    /// A change of the API tokens or bindings kept in the store was refused.
    #[error(transparent)]
    Access(allot_core::access::AccessError),
    /// Something this backend does not do (yet): the message says what, and what does.
    #[error("{0}")]
    Unsupported(String),
}

/// The upper bounds (µs) of the buckets of the commit-time histogram; a last bucket holds the rest.
pub const COMMIT_BUCKETS_MICROS: [u64; 15] =
    [25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000];

/// Counters of the durable-commit machinery, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Commits: syncs of the log at the disk level (each covering a group of operations), appends
    /// at the process level, calls on Redis.
    pub commits: u64,
    /// Operations made durable by those commits.
    pub operations: u64,
    /// Total time spent committing, in microseconds.
    pub commit_micros: u64,
    /// Commits that failed.
    pub failures: u64,
    /// Commits by time taken: `buckets[i]` counts those of at most `COMMIT_BUCKETS_MICROS[i]` µs
    /// (and more than the bound before); the last one counts the slower.
    pub buckets: [u64; COMMIT_BUCKETS_MICROS.len() + 1],
    /// The slowest commit (µs).
    pub max_micros: u64,
}

/// A backend: the token quotas, the pools and the applications, each a trait of its own
/// ([`QuotaStore`], [`PoolStore`], [`AppStore`]), and what the backend as a whole does.
///
/// Every mutating call returns only once its effect is durable.
#[async_trait]
pub trait Store:
    QuotaStore + PoolStore + AppStore + RunStore + WatchStore + AccessStore + Send + Sync + 'static
{
    /// A short name for logs and `/healthz`, e.g. `embedded`.
    fn backend(&self) -> &'static str;
    /// What an acknowledged change survives, for `/healthz` and metrics: `disk` or `process` on
    /// the embedded store, `redis` (what Redis's own persistence settings keep) on Redis.
    fn durability(&self) -> &'static str;
    /// The store's clock now (ms), the time base of allocs' `created`, `expires`...
    fn now(&self) -> Millis;
    /// The wall clock now (ms since the Unix epoch), read from the store's time source.
    fn wall_ms(&self) -> Millis;
    /// [`Store::now`] and the wall clock's time of that moment (ms since the Unix epoch): a time
    /// of the store's clock is shown as a timestamp by its distance from the first. Steady from
    /// call to call (`allot_core::clock::WallOffset`), so that times of one millisecond are
    /// shown in one order.
    fn now_and_wall(&self) -> (Millis, Millis) {
        let now = self.now();
        (now, self.wall_ms())
    }

    fn commit_stats(&self) -> CommitStats;

    /// Whether the store serves calls now, for `/readyz`: an error says why not (the store is
    /// shutting down or broken, Redis does not answer). Where the applications part is served is
    /// [`AppStore::apps_home`].
    async fn check_ready(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Stops taking work, answers every waiter with its place, makes everything durable and
    /// stops background tasks. Later calls fail with [`StoreError::ShuttingDown`].
    async fn shutdown(&self);

    /// Reports the ends of tasks, as [`AppStore::finish_tasks`] does (one answer per report, in
    /// order), each with the run it ended stored first ([`RunStore::put_run`]): on a store that
    /// keeps both, in one commit (a crash keeps the runs and the reports, or neither); here, the
    /// runs, then the reports (a crash between leaves ended runs, whose executor reports them
    /// again).
    async fn finish_runs(
        &self,
        ends: Vec<(allot_core::apps::TaskEnd, Option<allot_core::runs::Run>)>,
    ) -> Result<Vec<Result<TaskInfo, allot_core::apps::SchedError>>, StoreError> {
        let reports = runs::put_runs_of_ends(self, ends).await?;
        self.finish_tasks(reports).await
    }

    /// Writes a point-in-time archive of everything the store holds ([`snapshot`]) to `out`,
    /// while operations go on, and answers its header and what it wrote. Blocking: call it off
    /// the async runtime's threads.
    fn snapshot(
        &self,
        out: &mut dyn std::io::Write,
    ) -> Result<(snapshot::SnapshotHeader, snapshot::SnapshotSummary), StoreError> {
        let _ = out;
        Err(StoreError::Unsupported(format!(
            "snapshots of the {} store are not built yet: take one from a daemon on the embedded store",
            self.backend()
        )))
    }
}
