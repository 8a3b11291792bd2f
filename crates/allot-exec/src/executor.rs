//! The executor: drives every task placed on the pools this daemon serves, round by round, with
//! its plugin, until the task ends; keeps each run in the store after every step, so a restart
//! resumes every task where it was.
//!
//! At length, as one thing: the life of a run, from its placement to its end, in one place.
//!
//! A run's steps (decided by `allot_core::runs::Run`):
//! - `handle` rounds: a Barrier transition is stored before it is acted on, and a round run again
//!   after a crash takes the stored one instead of calling the plugin; the state a round writes
//!   is stored whatever the phase (a round that ends its attempt is stored with the ending);
//!   between rounds the run waits to be woken (a token granted, a
//!   plugin's own timer or callback), or [`ExecutorConfig::pause`] at most;
//! - an attempt that ends is aborted (if it failed or was stopped), then finalized, then the
//!   tokens it took are released: on every path;
//! - the scheduler is told how the task ended (`finish_task`), which frees its alloc and grants.
//!
//! A task is stopped from outside when it is removed or ended through the API: its attempt is
//! aborted and finalized.
//!
//! Which tasks to run: the tasks placed on this daemon's pools are listed at start, then the
//! store's change feed (`crate::feed`) is followed from the revision read before the list; a
//! task placed here is driven as soon as its change comes, and a list is taken again whenever
//! the feed is cut, and every [`ExecutorConfig::scan`] as a safety net. A store without a feed
//! is listed every [`ExecutorConfig::scan_without_feed`].

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use allot_core::apps::states::TaskState;
use allot_core::apps::{AppId, TaskId};
use allot_core::clock::{SystemTime, TimeSource};
use allot_core::pools::PoolName;
use allot_core::runs::{
    Ending, ExecError, Next, Phase, PhaseInfo, RetryPolicy, Run, StateWrite, Transition, TransitionKind,
};
use allot_store::{Event, Store, StoreError, WatchError, Watcher};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::apps::{AppMeta, AppsAccess, PlacedTask, Reported};
use crate::catalog::Catalog;
use crate::context::{attempt_token, release, Metadata, RunKey, Secrets, TaskContext, TokenWaits, Tokens, Waker};
use crate::feed::{Metas, Step};
use crate::plugin::Plugin;
use crate::registry::Registry;
use crate::spec::RunSpec;
use allot_core::catalog::CatalogScope;

/// How an executor runs.
#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    /// The pools whose tasks this daemon runs.
    pub pools: HashSet<PoolName>,
    /// The retries of a task whose spec names none, and the system budget of every task.
    pub retry: RetryPolicy,
    /// Where each task gets its directory (`<dir>/<app>/<task>`).
    pub data_dir: PathBuf,
    pub max_output_bytes: usize,
    /// The longest a run waits between rounds when nothing wakes it.
    pub pause: Duration,
    /// How often the executor lists the tasks placed on its pools while it follows the store's
    /// change feed, which brings them as they are placed: a safety net.
    pub scan: Duration,
    /// How often it lists them on a store without a change feed (and while it cannot follow it).
    pub scan_without_feed: Duration,
    /// How often the directories of removed tasks are removed, and outputs kept for reuse past
    /// their retention forgotten.
    pub sweep: Duration,
    /// How long outputs kept for reuse stay, from when they were kept.
    pub cache_retention: Duration,
    pub secrets: Secrets,
    /// This daemon, by the URL others reach it at: the name of its executor's lease.
    pub node: String,
    /// The plugins' counters (give the same to their `SetupContext`s).
    pub counters: crate::context::PluginCounters,
    /// The API token of the executor's calls to the daemon that schedules (with access
    /// configured there).
    pub token: Option<String>,
    /// Certificates (PEM) those calls trust besides the system's CAs: the daemons' HTTPS CA.
    pub peer_roots: Option<Vec<u8>>,
    /// Where runs read the time (their events' times, placements' expiry, the `sleep` plugin's
    /// end): the machine's clock, or a test's.
    pub clock: Arc<dyn TimeSource>,
    /// How long the executor's lease lasts unless renewed (every second): how soon whoever
    /// schedules takes this daemon's pools as lost once it stops. [`EXECUTOR_LEASE`] by default.
    pub lease: Duration,
}

impl ExecutorConfig {
    /// The default [`ExecutorConfig::scan`].
    pub const SCAN: Duration = Duration::from_secs(10);
    /// The default [`ExecutorConfig::scan_without_feed`].
    pub const SCAN_WITHOUT_FEED: Duration = Duration::from_millis(200);
    /// The default [`ExecutorConfig::cache_retention`]: 30 days.
    pub const CACHE_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

    /// `data_dir` is made absolute: tasks' commands run elsewhere and are given paths into it.
    pub fn new(pools: HashSet<PoolName>, data_dir: PathBuf) -> ExecutorConfig {
        ExecutorConfig {
            pools,
            retry: RetryPolicy::default(),
            data_dir: std::path::absolute(&data_dir).unwrap_or(data_dir),
            max_output_bytes: 1 << 20,
            pause: Duration::from_secs(1),
            scan: ExecutorConfig::SCAN,
            scan_without_feed: ExecutorConfig::SCAN_WITHOUT_FEED,
            sweep: Duration::from_secs(60),
            cache_retention: ExecutorConfig::CACHE_RETENTION,
            secrets: Secrets::default(),
            node: "local".to_owned(),
            counters: crate::context::PluginCounters::default(),
            token: None,
            peer_roots: None,
            clock: Arc::new(SystemTime),
            lease: EXECUTOR_LEASE,
        }
    }
}

/// A run being driven.
#[derive(Default)]
struct Driven {
    /// Wakes it for its next round (or to read its task again) at once.
    notify: Notify,
    /// Set when its task is found placed here (by a list or the feed) while it is driven: the
    /// run may have read its task before and be on its way out, so its end looks again.
    found_again: AtomicBool,
    /// The change that placed it here, with the task as it left it: the run's first reading,
    /// instead of asking the scheduling daemon (a later change wakes it to read again).
    placed: Mutex<Option<Arc<Event>>>,
    /// Whose catalog entries its plugin reaches (its plugin, its queue), set as it is driven.
    scope: Mutex<Option<CatalogScope>>,
}

type Active = Arc<Mutex<HashMap<RunKey, Arc<Driven>>>>;

/// What a task's spec says of how to run it, and the plugin that runs it ([`Executor::plugin_for`]).
type Resolved = Result<(RunSpec, Arc<dyn Plugin>), ExecError>;

/// A driver's task's spec, resolved once (its spec does not change under its number, `seq`),
/// not at each round, ending and retry decision. Boxed: thousands of drivers wait at once.
#[derive(Default)]
struct Parsed(Option<Box<(u64, Resolved)>>);

impl Parsed {
    fn of(&mut self, executor: &Executor, task: &PlacedTask) -> &Resolved {
        if self.0.as_ref().is_none_or(|parsed| parsed.0 != task.seq) {
            self.0 = Some(Box::new((task.seq, executor.plugin_for(task))));
        }
        &self.0.as_ref().expect("resolved above").1
    }
}

/// Where a driver starts ([`Executor::begin`]).
struct Begun {
    run: Run,
    /// The task as last read (`None`: gone).
    last: Option<PlacedTask>,
    /// The plugin of the run's task (none for a task gone, or one no plugin here runs).
    plugin: Option<Arc<dyn Plugin>>,
    /// Resumed from what the store kept (after a crash, or an error): a round whose run could
    /// not be stored may have taken tokens the kept run does not list.
    resumed: bool,
}

/// How following the change feed ended.
enum Followed {
    /// The daemon shuts down.
    Shutdown,
    /// The watcher fell behind: it may resume after `resume` from the events the feed keeps.
    Behind { resume: u64 },
    /// The feed was cut otherwise (or closed): the placed tasks are listed again.
    Cut,
}

/// The parallelism of the applications whose tasks this executor runs: a semaphore per
/// application with a `max_parallelism`, whose permits the runs past waiting to begin hold
/// (first come, first served).
#[derive(Default)]
struct Parallelism {
    apps: Mutex<HashMap<AppId, Arc<Semaphore>>>,
}

impl Parallelism {
    fn of(&self, app: &AppId, max: u32) -> Arc<Semaphore> {
        let mut apps = self.apps.lock().unwrap_or_else(|p| p.into_inner());
        apps.entry(app.clone()).or_insert_with(|| Arc::new(Semaphore::new(max as usize))).clone()
    }

    /// Forgets an application's semaphore once no run uses it.
    fn forget_unused(&self, app: &AppId) {
        let mut apps = self.apps.lock().unwrap_or_else(|p| p.into_inner());
        if apps.get(app).is_some_and(|s| Arc::strong_count(s) == 1) {
            apps.remove(app);
        }
    }
}

/// What the executor did since it started, for the metrics.
#[derive(Debug, Default)]
pub struct ExecStats {
    rounds: AtomicU64,
    succeeded: AtomicU64,
    failed: AtomicU64,
    aborted: AtomicU64,
    preempted: AtomicU64,
    retried: AtomicU64,
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
    held_back: AtomicU64,
    lists: AtomicU64,
    feed_cuts: AtomicU64,
    following_feed: AtomicBool,
}

/// [`ExecStats`] as read at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExecCounts {
    pub rounds: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub aborted: u64,
    /// Attempts ended because the scheduler preempted their task.
    pub preempted: u64,
    /// Attempts that failed and were followed by another.
    pub retried: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Times a run was held back by its application's parallelism.
    pub held_back: u64,
    /// Lists taken of the tasks placed on this daemon's pools.
    pub lists: u64,
    /// Times the change feed was cut under the executor: it fell behind (then it resumes from
    /// the events the feed keeps, or lists if they are gone), or the changes after its list's
    /// revision were no longer kept (then it lists).
    pub feed_cuts: u64,
    /// Whether it follows the store's change feed now (else it lists every
    /// [`ExecutorConfig::scan_without_feed`]).
    pub following_feed: bool,
}

impl ExecStats {
    pub fn counts(&self) -> ExecCounts {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ExecCounts {
            rounds: read(&self.rounds),
            succeeded: read(&self.succeeded),
            failed: read(&self.failed),
            aborted: read(&self.aborted),
            preempted: read(&self.preempted),
            retried: read(&self.retried),
            cache_hits: read(&self.cache_hits),
            cache_misses: read(&self.cache_misses),
            held_back: read(&self.held_back),
            lists: read(&self.lists),
            feed_cuts: read(&self.feed_cuts),
            following_feed: self.following_feed.load(Ordering::Relaxed),
        }
    }
}

/// How long an executor's lease runs: the pools of an executor that has not renewed it for this
/// long are taken as lost, and their tasks placed elsewhere.
pub const EXECUTOR_LEASE: Duration = Duration::from_secs(5);
/// How often an executor renews its lease.
const RENEW_EVERY: Duration = Duration::from_secs(1);

/// The version of the NotReady phase of a cacheable task whose outputs were not in the catalog.
const CACHE_MISS: u32 = 2;

/// The version of the NotReady phase of a run held back by its application's parallelism.
const HELD_BACK: u32 = 1;

/// How many rounds in a row a run gets at once while its phase keeps changing (then it waits to
/// be woken, like a run whose phase stays).
const STREAK: u32 = 8;

/// What a step of a run writes to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keep {
    /// The run, as usual.
    Run,
    /// The run, or, when the attempt ends the task, nothing yet: the run goes with the report of
    /// the task's end, in the same commit.
    WithReport,
    /// Nothing: the kept run is another task's now (removed and added again under the same id).
    Nothing,
}

/// Why an attempt ended, when a preemption took its placement back and the task's reason no
/// longer says it.
const PREEMPTED_WITHOUT_ITS_EXECUTOR: &str = "preempted: its placement was taken back before its attempt ended";

/// The first characters of a cache key, enough to tell keys apart in a timeline.
fn short_key(key: &str) -> &str {
    key.get(..12).unwrap_or(key)
}

/// The executor of one daemon.
pub struct Executor {
    store: Arc<dyn Store>,
    registry: Arc<Registry>,
    config: ExecutorConfig,
    waits: TokenWaits,
    apps: Arc<AppsAccess>,
    /// The runs being driven, each with what wakes it.
    active: Active,
    /// Wakes the scan for new tasks: a list at once.
    scan: Notify,
    /// Asks for a list soon ([`ExecutorConfig::scan_without_feed`]): a run stopped by an error
    /// is driven again by it, as it is placed here.
    list_soon: Notify,
    /// The applications' meta, kept while the feed is followed.
    metas: Metas,
    /// The runs of removed tasks were looked for (once per start).
    orphans_looked_for: AtomicBool,
    /// Runs stopped by an error: driven again at the next list, whatever their task's state (a
    /// task ended from outside meanwhile is no longer listed as placed here, and its run still
    /// has its attempt to end and its tokens to give back).
    stopped: Mutex<std::collections::BTreeSet<RunKey>>,
    parallelism: Parallelism,
    stats: ExecStats,
}

impl Executor {
    pub fn new(store: Arc<dyn Store>, registry: Arc<Registry>, config: ExecutorConfig) -> Arc<Executor> {
        Arc::new(Executor {
            apps: Arc::new(AppsAccess::new(store.clone(), config.token.clone(), config.peer_roots.clone())),
            store,
            registry,
            config,
            waits: TokenWaits::default(),
            active: Arc::default(),
            scan: Notify::new(),
            list_soon: Notify::new(),
            metas: Metas::default(),
            orphans_looked_for: AtomicBool::new(false),
            stopped: Mutex::default(),
            parallelism: Parallelism::default(),
            stats: ExecStats::default(),
        })
    }

    /// Wakes a run (its next round comes at once), or the scan for new tasks if it is not driven.
    pub fn wake(&self, run: &RunKey) {
        if !self.wake_driven(run) {
            self.scan.notify_one();
        }
    }

    /// Wakes a run if this executor drives it now; false if it does not.
    pub fn wake_driven(&self, run: &RunKey) -> bool {
        match self.active.lock().unwrap_or_else(|p| p.into_inner()).get(run) {
            Some(driven) => {
                driven.notify.notify_one();
                true
            }
            None => false,
        }
    }

    /// Whose catalog entries the plugin of a run this executor drives now reaches, for its
    /// calls from outside (an external plugin's); `None` if it does not drive it (or its task
    /// names no plugin this daemon has).
    pub fn catalog_scope(&self, run: &RunKey) -> Option<CatalogScope> {
        let driven = self.active.lock().unwrap_or_else(|p| p.into_inner()).get(run).cloned()?;
        let scope = driven.scope.lock().unwrap_or_else(|p| p.into_inner()).clone();
        scope
    }

    /// What it did since it started.
    pub fn stats(&self) -> &ExecStats {
        &self.stats
    }

    /// This daemon's name in the executors' leases (its URL).
    pub fn node(&self) -> &str {
        &self.config.node
    }

    /// The plugins' counters.
    pub fn plugin_counters(&self) -> &crate::context::PluginCounters {
        &self.config.counters
    }

    /// How many runs are being driven now.
    pub fn active(&self) -> usize {
        self.active.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Looks for tasks to run until `shutdown` is true; each found task is driven by a task of
    /// its own until it ends. Lists them, then follows the store's change feed from the revision
    /// read before the list; lists again whenever the feed is cut. On a store without a feed, or
    /// when a list fails, lists every [`ExecutorConfig::scan_without_feed`].
    pub async fn run(self: Arc<Executor>, mut shutdown: watch::Receiver<bool>) {
        tokio::spawn(self.clone().renew_lease(shutdown.clone()));
        tokio::spawn(self.clone().sweep_directories(shutdown.clone()));
        let mut said_no_feed = false;
        loop {
            // Read before the list: a watch from it is given every change the list may miss.
            let revision = self.store.revision();
            let watcher = match self.list(&shutdown).await {
                false => None,
                true => match self.store.watch_inside(crate::feed::filter(), Some(revision)) {
                    Ok(watcher) => Some(watcher),
                    Err(err @ WatchError::Unsupported { .. }) => {
                        if !std::mem::replace(&mut said_no_feed, true) {
                            tracing::info!(reason = %err, every = ?self.config.scan_without_feed, "no change feed: the executor lists the tasks placed here periodically");
                        }
                        None
                    }
                    Err(err @ WatchError::Compacted { .. }) => {
                        // The list took so long that the changes since its revision are gone.
                        self.stats.feed_cuts.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(reason = %err, "the change feed was cut: the executor lists the tasks placed here again");
                        None
                    }
                    Err(err) => {
                        tracing::debug!(error = %err, "cannot follow the change feed now; listing again soon");
                        None
                    }
                },
            };
            match watcher {
                Some(mut watcher) => {
                    said_no_feed = false;
                    loop {
                        match self.follow(watcher, &mut shutdown).await {
                            Followed::Shutdown => return,
                            // Behind a burst (one commit placing thousands of tasks gives more
                            // events than a watcher's buffer): resumed from the events the feed
                            // keeps, with nothing missed and no list of every placed task.
                            Followed::Behind { resume } => {
                                match self.store.watch_inside(crate::feed::filter(), Some(resume)) {
                                    Ok(resumed) => watcher = resumed,
                                    Err(err) => {
                                        tracing::info!(reason = %err, "cannot resume the change feed: the executor lists the tasks placed here again");
                                        break;
                                    }
                                }
                            }
                            // Cut: listed again at once.
                            Followed::Cut => break,
                        }
                    }
                }
                None => {
                    tokio::select! {
                        _ = self.scan.notified() => {}
                        _ = tokio::time::sleep(self.config.scan_without_feed) => {}
                        _ = shutdown.wait_for(|stop| *stop) => return,
                    }
                }
            }
        }
    }

    /// Follows the change feed: drives each task placed here as its change comes, wakes the runs
    /// whose task changed otherwise or went; lists every [`ExecutorConfig::scan`] all the same (or
    /// sooner, when asked, or after a list that failed). Returns when the watcher fell behind,
    /// when the feed is cut otherwise (list, then follow it again), or at shutdown.
    async fn follow(self: &Arc<Executor>, mut watcher: Watcher, shutdown: &mut watch::Receiver<bool>) -> Followed {
        let stop = shutdown.clone();
        self.metas.follow();
        self.stats.following_feed.store(true, Ordering::Relaxed);
        tracing::debug!(revision = watcher.revision(), "the executor follows the change feed");
        let mut next_list = Instant::now() + self.config.scan;
        let followed = loop {
            tokio::select! {
                event = watcher.next() => match event {
                    Ok(event) => self.on_event(&event, &stop),
                    Err(WatchError::Closed) => break Followed::Cut,
                    Err(err) => {
                        self.stats.feed_cuts.fetch_add(1, Ordering::Relaxed);
                        if let WatchError::Behind { resume, .. } = err {
                            tracing::debug!(reason = %err, "the executor fell behind the change feed: it resumes from the events kept");
                            break Followed::Behind { resume };
                        }
                        tracing::info!(reason = %err, "the change feed was cut: the executor lists the tasks placed here again");
                        break Followed::Cut;
                    }
                },
                _ = self.scan.notified() => next_list = Instant::now(),
                _ = self.list_soon.notified() => {
                    next_list = next_list.min(Instant::now() + self.config.scan_without_feed);
                }
                _ = tokio::time::sleep_until(next_list) => {
                    let pause = if self.list(&stop).await { self.config.scan } else { self.config.scan_without_feed };
                    next_list = Instant::now() + pause;
                }
                // Its answer borrows the channel: dropped here, as other branches await.
                () = async { drop(shutdown.wait_for(|stop| *stop).await) } => break Followed::Shutdown,
            }
        };
        self.stats.following_feed.store(false, Ordering::Relaxed);
        self.metas.unfollow();
        followed
    }

    /// What one change asks of the executor.
    fn on_event(self: &Arc<Executor>, event: &Arc<Event>, shutdown: &watch::Receiver<bool>) {
        match crate::feed::step(event, &self.config.pools) {
            Step::Drive(key, placed) => self.start_driving_placed(key, Some(placed), shutdown),
            Step::Wake(key) => {
                self.wake_driven(&key);
            }
            Step::AppChanged(app) => self.metas.changed(app),
            Step::AppRemoved(app) => {
                self.metas.removed(&app);
                for (key, driven) in self.active.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                    if key.app == app {
                        driven.notify.notify_one();
                    }
                }
            }
            Step::Nothing => {}
        }
    }

    /// Lists the tasks placed on this daemon's pools and drives each one not driven yet (and,
    /// once per start, the runs of removed tasks). False if the list could not be read.
    async fn list(self: &Arc<Executor>, shutdown: &watch::Receiver<bool>) -> bool {
        self.stats.lists.fetch_add(1, Ordering::Relaxed);
        // Runs of this daemon's pools whose task went while no executor drove them (a crash
        // between a removal and the end of its run): stopped here, then removed. Looked for once
        // per start, until it can be read.
        if !self.orphans_looked_for.load(Ordering::Relaxed) {
            match self.orphans().await {
                Ok(orphans) => {
                    self.orphans_looked_for.store(true, Ordering::Relaxed);
                    for key in orphans {
                        self.start_driving(key, shutdown);
                    }
                }
                Err(err) => tracing::debug!(error = %err, "cannot look for the runs of removed tasks yet"),
            }
        }
        let stopped = std::mem::take(&mut *self.stopped.lock().unwrap_or_else(|p| p.into_inner()));
        for key in stopped {
            self.start_driving(key, shutdown);
        }
        match self.placed_here().await {
            Ok(found) => {
                for key in found {
                    self.start_driving(key, shutdown);
                }
                true
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot list the tasks to run");
                false
            }
        }
    }

    /// Drives a run by a task of its own, unless it is driven already (then it is marked found
    /// again: see [`Driven::found_again`]).
    fn start_driving(self: &Arc<Executor>, key: RunKey, shutdown: &watch::Receiver<bool>) {
        self.start_driving_placed(key, None, shutdown)
    }

    /// [`Executor::start_driving`], with the change that placed it here.
    fn start_driving_placed(
        self: &Arc<Executor>,
        key: RunKey,
        placed: Option<Arc<Event>>,
        shutdown: &watch::Receiver<bool>,
    ) {
        let driven = Arc::new(Driven { placed: Mutex::new(placed), ..Driven::default() });
        {
            let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(already) = active.get(&key) {
                already.found_again.store(true, Ordering::SeqCst);
                return;
            }
            active.insert(key.clone(), driven.clone());
        }
        let (executor, shutdown) = (self.clone(), shutdown.clone());
        tokio::spawn(async move { executor.drive(key, driven, shutdown).await });
    }

    /// The kept runs of this daemon's pools whose task is gone (an ended one is removed here), or
    /// ended from outside while the run was not driven (a crash, or an error, between the end and
    /// the run's next reading): each has its attempt to end and its tokens to give back.
    async fn orphans(&self) -> Result<Vec<RunKey>, StoreError> {
        let mut orphans = Vec::new();
        for (app, task, run) in self.store.runs().await? {
            let pool = run.alloc.as_deref().and_then(|alloc| alloc.split_once('/')).map(|(pool, _)| pool);
            let ours = |pool: &str| self.config.pools.iter().any(|p| p.as_str() == pool);
            // A run that has not noted its placement yet (it does with its first round's write) is
            // this daemon's if its task is (or was, a task ended keeps where it ran) placed here.
            if pool.is_some_and(|pool| !ours(pool)) {
                continue;
            }
            let key = RunKey { app, task };
            let found = self.apps.task(&key.app, &key.task).await?;
            if pool.is_none()
                && !found.as_ref().and_then(|t| t.placement.as_ref()).is_some_and(|p| ours(p.pool.as_str()))
            {
                continue;
            }
            match found {
                Some(task) if task.state.is_terminal() && !run.ended() => {
                    orphans.push(key);
                    continue;
                }
                Some(_) => continue,
                None => {}
            }
            if run.ended() {
                self.forget_run(&key).await?;
            } else {
                orphans.push(key);
            }
        }
        Ok(orphans)
    }

    /// Removes, every [`ExecutorConfig::sweep`], the task directories of this daemon whose run
    /// is gone (their task was removed): nothing reads them any more.
    async fn sweep_directories(self: Arc<Executor>, mut shutdown: watch::Receiver<bool>) {
        loop {
            if let Err(err) = self.sweep_once().await {
                tracing::debug!(error = %err, "cannot sweep the task directories now");
            }
            match self.forget_old_outputs().await {
                Ok(0) => {}
                Ok(forgotten) => tracing::debug!(forgotten, "outputs kept for reuse forgotten after their retention"),
                Err(err) => tracing::debug!(error = %err, "cannot forget old outputs kept for reuse now"),
            }
            tokio::select! {
                _ = tokio::time::sleep(self.config.sweep) => {}
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
        }
    }

    /// Forgets the outputs kept for reuse longer than [`ExecutorConfig::cache_retention`] ago, a
    /// batch at a time. Every daemon that runs tasks does it; a second one finds nothing to do.
    async fn forget_old_outputs(&self) -> Result<usize, StoreError> {
        const BATCH: usize = 1000;
        let retention = u64::try_from(self.config.cache_retention.as_millis()).unwrap_or(u64::MAX);
        let kept_before = self.now_ms().saturating_sub(retention);
        let mut forgotten = 0;
        loop {
            let batch = self.store.forget_cached_outputs(kept_before, BATCH).await?;
            forgotten += batch;
            if batch < BATCH {
                return Ok(forgotten);
            }
        }
    }

    async fn sweep_once(&self) -> Result<(), StoreError> {
        let Ok(apps) = std::fs::read_dir(&self.config.data_dir) else { return Ok(()) };
        for app_dir in apps.flatten() {
            let Some(app) = app_dir.file_name().to_str().and_then(|name| AppId::new(name).ok()) else { continue };
            let Ok(tasks) = std::fs::read_dir(app_dir.path()) else { continue };
            for task_dir in tasks.flatten() {
                let Some(task) = task_dir.file_name().to_str().and_then(|name| TaskId::new(name).ok()) else {
                    continue;
                };
                let key = RunKey { app: app.clone(), task };
                // A run being driven may not be stored yet (its directory is emptied first).
                if self.active.lock().unwrap_or_else(|p| p.into_inner()).contains_key(&key) {
                    continue;
                }
                if self.store.run(key.app.clone(), key.task.clone()).await?.is_none() {
                    if let Err(err) = std::fs::remove_dir_all(task_dir.path()) {
                        tracing::warn!(run = %key, error = %err, "cannot remove the directory of a removed task");
                    }
                }
            }
            // Only an empty one goes.
            let _ = std::fs::remove_dir(app_dir.path());
        }
        Ok(())
    }

    /// Takes (or renews) this executor's lease: its pools and task types. A daemon takes it before
    /// it serves, so that what it runs is known to whoever schedules from its first request.
    pub async fn take_lease(&self) -> Result<(), StoreError> {
        let pools: Vec<PoolName> = self.config.pools.iter().cloned().collect();
        self.store.renew_executor(&self.config.node, &pools, &self.registry.task_types(), self.config.lease).await
    }

    /// Keeps this executor's lease while it runs: whoever schedules takes its pools as lost if
    /// the lease lapses (the daemon died, or lost the store).
    async fn renew_lease(self: Arc<Executor>, mut shutdown: watch::Receiver<bool>) {
        let mut failing = false;
        loop {
            match self.take_lease().await {
                Ok(()) if failing => {
                    failing = false;
                    tracing::info!("the executor's lease is renewed again");
                }
                Ok(()) => {}
                Err(err) if !failing => {
                    failing = true;
                    tracing::warn!(error = %err, "cannot renew the executor's lease");
                }
                Err(_) => {}
            }
            tokio::select! {
                _ = tokio::time::sleep(RENEW_EVERY) => {}
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
        }
    }

    /// What a run needs of its application: kept while the feed is followed, else read.
    async fn app_meta(&self, app: &AppId) -> Result<AppMeta, StoreError> {
        let reading = match self.metas.get(app) {
            Ok(meta) => return Ok(meta),
            Err(reading) => reading,
        };
        let meta = self.apps.app_meta(app).await?;
        self.metas.keep(app, meta.clone(), reading);
        Ok(meta)
    }

    /// The placed tasks on this daemon's pools (Allocated or Running).
    async fn placed_here(&self) -> Result<Vec<RunKey>, StoreError> {
        let found = self.apps.placed_on(&self.config.pools).await?;
        Ok(found.into_iter().map(|(app, task)| RunKey { app, task }).collect())
    }

    /// Drives one run until its task ends (or the daemon stops: the run resumes at the next
    /// start from what is stored).
    async fn drive(self: Arc<Executor>, key: RunKey, driven: Arc<Driven>, mut shutdown: watch::Receiver<bool>) {
        let result = self.drive_until_done(&key, &driven, &mut shutdown).await;
        self.parallelism.forget_unused(&key.app);
        let failed = result.is_err();
        if let Err(err) = result {
            tracing::warn!(run = %key, error = %err, "a run stopped; it resumes at the next list");
        }
        self.active.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
        if *shutdown.borrow() {
            return;
        }
        if failed {
            // The next list drives it again: soon, not at once.
            self.stopped.lock().unwrap_or_else(|p| p.into_inner()).insert(key);
            self.list_soon.notify_one();
        } else if driven.found_again.load(Ordering::SeqCst) {
            // Found placed here after the run last read its task (it left this daemon's pools
            // and came back, say): looked at once more, as a list would.
            match self.apps.task(&key.app, &key.task).await {
                Ok(Some(task)) if task.placed_on(&self.config.pools) => self.start_driving(key, &shutdown),
                Ok(_) => {}
                Err(_) => self.list_soon.notify_one(),
            }
        }
    }

    /// The run a driver starts from, with the task as last read and its plugin; `None` if there
    /// is nothing to drive (the task is gone, or not placed here, and no run is kept).
    async fn begin(&self, key: &RunKey, driven: &Driven, parsed: &mut Parsed) -> Result<Option<Begun>, StoreError> {
        let stored = self.store.run(key.app.clone(), key.task.clone()).await?;
        // Every time it was found placed here before is in what it reads now.
        driven.found_again.store(false, Ordering::SeqCst);
        // The task as last read: a task removed from outside is still aborted and finalized by
        // its plugin, which needs its spec. Only a reading of the task this run belongs to.
        let placed = driven.placed.lock().unwrap_or_else(|p| p.into_inner()).take();
        let last: Option<PlacedTask> = match placed.as_deref().and_then(crate::feed::placed_task) {
            Some(task) if stored.as_ref().is_some_and(|run| run.belongs_to(task.seq)) => Some(PlacedTask::from(task)),
            // A change from the feed may be old (the feed runs behind the store under load):
            // the task may have run, ended and gone since. A run starts from the task as it is.
            _ => self.apps.task(&key.app, &key.task).await?,
        };
        // Resumed from what the store kept (after a crash, or an error): a round whose run could
        // not be stored may have taken tokens the kept run does not list.
        let resumed = stored.is_some();
        // The plugin of the run's task (none for a task gone, or one no plugin here runs).
        let plugin = last.as_ref().and_then(|task| parsed.of(self, task).as_ref().ok().map(|(_, p)| p.clone()));
        let run = match (stored, &last) {
            // Gone before it was run: nothing to do.
            (None, None) => return Ok(None),
            // Not (or no longer) placed here: nothing to start.
            (None, Some(task)) if !task.placed_on(&self.config.pools) => return Ok(None),
            (Some(mut run), Some(task)) if run.belongs_to(task.seq) => {
                // A run kept before runs were numbered is its task's from now on.
                run.task_seq = Some(task.seq);
                run
            }
            // A run whose task is gone: stopped below, then removed.
            (Some(run), None) => run,
            (stale, Some(task)) => {
                let store_first = plugin.as_ref().is_none_or(|plugin| plugin.properties().acts_outside);
                Box::pin(self.fresh_run(key, task, stale, store_first)).await?
            }
        };
        Ok(Some(Begun { run, last, plugin, resumed }))
    }

    async fn drive_until_done(
        &self,
        key: &RunKey,
        driven: &Driven,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<(), StoreError> {
        let store = &*self.store;
        // A driver is spawned for every placed run and thousands wait at once (for their reports'
        // commit, say): its future's size is their memory. So its first readings and its larger
        // steps (a round, an attempt's end) are boxed, each allocated only while it runs, and a
        // report's wait holds nothing of the report.
        let mut parsed = Parsed::default();
        let Some(Begun { mut run, mut last, plugin, resumed }) = Box::pin(self.begin(key, driven, &mut parsed)).await?
        else {
            return Ok(());
        };
        // A run found already ended (a list or a late change found its task after the driver
        // that ended it let go): it is reported again, but its ending was counted then.
        let ended_before = matches!(run.next(), Next::Report(_));
        let mut streak = 0;
        // The application's parallelism: a run holds a slot while it is past waiting to begin.
        let meta = self.app_meta(&key.app).await?;
        // Its plugin's catalog, for the plugin's calls from outside (once: neither the plugin nor
        // the queue of a run's task changes).
        if let Some(plugin) = &plugin {
            *driven.scope.lock().unwrap_or_else(|p| p.into_inner()) = Some(self.scope_of(plugin.id(), &meta));
        }
        let max_parallelism = meta.max_parallelism;
        let parallelism = max_parallelism.map(|max| self.parallelism.of(&key.app, max));
        let mut slot: Option<OwnedSemaphorePermit> = None;
        let mut reread = false;
        // The task was removed: once its attempt is stopped, the run goes too.
        let mut gone = false;
        // The task was removed and another added under its id: the attempt is stopped without
        // writing anything (the kept run is the new task's to write), and the run is left to it.
        let mut replaced = false;
        // The scheduler preempts the task: once the attempt has ended, it is told so.
        let mut preempted = false;
        // The attempt ended the task and its run is not stored yet: it goes with the report.
        let mut unsaved = false;
        loop {
            if *shutdown.borrow() {
                return Ok(());
            }
            // The task as the scheduler has it now: removed or ended from outside stops the run.
            // It is read again after every wait; steps that follow each other at once use the
            // last reading (what happened meanwhile is seen at the next wait).
            let (task, read) = match (&last, reread) {
                (Some(task), false) => (Some(task.clone()), false),
                _ => {
                    driven.found_again.store(false, Ordering::SeqCst);
                    (self.apps.task(&key.app, &key.task).await?, true)
                }
            };
            reread = false;
            match &task {
                // (A task not read again is the last reading already.)
                Some(t) if run.belongs_to(t.seq) => {
                    if read {
                        last = Some(t.clone());
                    }
                }
                Some(t) => {
                    replaced = true;
                    // The task now under its id is driven afresh once this run has stopped.
                    if t.placed_on(&self.config.pools) {
                        driven.found_again.store(true, Ordering::SeqCst);
                    }
                }
                None => gone = true,
            }
            let stopped = if replaced {
                Some("the task was removed and another added under its id".to_owned())
            } else if gone {
                Some("the task was removed".to_owned())
            } else {
                task.as_ref()
                    .filter(|t| t.state.is_terminal())
                    .map(|t| format!("the task was ended from outside ({:?})", t.state))
            };
            if let (Some(t), None) = (&task, &stopped) {
                // A preemption took the placement back before this attempt ended (its grace ran
                // out first, or no executor ran meanwhile): the attempt ends now as preempted
                // (aborted, finalized, its tokens released), counted once; the scheduler needs
                // no report, and whatever placement the task has now starts a new attempt.
                if run.alloc.is_some() && t.preempting.is_none() && t.preemptions > run.preemptions() {
                    let reason = t.preempted_for.as_deref().unwrap_or(PREEMPTED_WITHOUT_ITS_EXECUTOR);
                    let policy = self.policy(parsed.of(self, t));
                    if let Next::EndAttempt { abort } = run.preempted(reason, policy, self.now_ms()) {
                        let resolved = last.as_ref().map(|last| parsed.of(self, last));
                        let ending =
                            self.end_attempt(key, &meta, last.as_ref(), resolved, &mut run, abort, Keep::Run, resumed);
                        Box::pin(ending).await?;
                        self.stats.preempted.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(run = %key, "preempted before its attempt ended: ended here now");
                    }
                }
                let here = t.placement.as_ref().filter(|_| t.placed_on(&self.config.pools));
                let Some(placement) = here else {
                    // Waiting to be placed again, or placed elsewhere (its pool was taken as
                    // lost): whoever runs it now takes the run over.
                    tracing::info!(run = %key, "the task is not placed on this daemon's pools now: not run here");
                    return Ok(());
                };
                // Noted in the run, stored with its next write: a crash before leaves the run as it
                // was, and the same is decided again.
                if !run.alloc.as_deref().is_some_and(|alloc| placement.is_uri(alloc))
                    && run.placement_lost(&placement.uri(), self.policy(parsed.of(self, t)), self.now_ms())
                {
                    tracing::warn!(run = %key, "placed again after its placement was lost: a new attempt");
                }
            }
            if let Some(reason) = &stopped {
                if !matches!(run.next(), Next::Report(_)) {
                    run.abort(reason, self.now_ms());
                }
            }
            // Preempted: this attempt ends (aborted, finalized, its tokens released), and the
            // scheduler is told, which takes the placement back.
            if let (Some(t), None) = (&task, &stopped) {
                if let Some(reason) = &t.preempting {
                    if run.preempted_before_this_attempt(reason) {
                        // Ended for it already, and the scheduler not told (it died first, say):
                        // told now, nothing counted again.
                        return self.report(key, allot_core::apps::TaskEnding::Preempted, None).await;
                    }
                    if run.next() == Next::Handle {
                        run.preempted(reason, self.policy(parsed.of(self, t)), self.now_ms());
                        preempted = true;
                    }
                }
            }
            let next = run.next();
            match next {
                Next::Handle => {
                    let task = task.expect("a task that stands");
                    if let (Some(semaphore), None) = (&parallelism, &slot) {
                        match semaphore.clone().try_acquire_owned() {
                            Ok(permit) => slot = Some(permit),
                            Err(_) => {
                                let max = max_parallelism.unwrap_or_default();
                                let reason = format!("its application runs {max} tasks at once (max_parallelism)");
                                self.stats.held_back.fetch_add(1, Ordering::Relaxed);
                                if run.phase != Phase::NotReady || run.version != HELD_BACK {
                                    run.hold(&PhaseInfo::new(Phase::NotReady, HELD_BACK, reason), self.now_ms());
                                    store.put_run(key.app.clone(), key.task.clone(), run.clone()).await?;
                                }
                                // Woken by a permit, or to see if the task still stands: by a
                                // change of it, or after the pause.
                                tokio::select! {
                                    permit = semaphore.clone().acquire_owned() => slot = permit.ok(),
                                    _ = driven.notify.notified() => {}
                                    _ = tokio::time::sleep(self.config.pause) => {}
                                    _ = shutdown.wait_for(|stop| *stop) => return Ok(()),
                                }
                                reread = true;
                                continue;
                            }
                        }
                    }
                    let before = (run.phase, run.version);
                    let resolved = parsed.of(self, &task);
                    Box::pin(self.round(key, &meta, &task, resolved, &mut run)).await?;
                    // Reported running once a round leaves it running: a task whose first round
                    // ends it goes from Allocated to its end in one report.
                    if task.state == TaskState::Allocated && run.next() == Next::Handle {
                        if self.apps.start(&key.app, &key.task).await? == Reported::Gone {
                            // Stopped at the next reading of the task.
                            reread = true;
                        }
                        if let Some(last) = &mut last {
                            last.state = TaskState::Running;
                        }
                    }
                    if run.phase.waits() || run.next() != Next::Handle {
                        // Waiting to begin (for a token) does not count against the parallelism.
                        slot = None;
                    }
                    let moved = (run.phase, run.version) != before;
                    if moved && streak < STREAK {
                        streak += 1;
                    } else if run.next() == Next::Handle {
                        streak = 0;
                        tokio::select! {
                            _ = driven.notify.notified() => {}
                            _ = tokio::time::sleep(self.config.pause) => {}
                            _ = shutdown.wait_for(|stop| *stop) => return Ok(()),
                        }
                        reread = true;
                    }
                }
                Next::EndAttempt { abort } => {
                    let keep = match (replaced, gone || preempted || stopped.is_some()) {
                        (true, _) => Keep::Nothing,
                        (false, true) => Keep::Run,
                        (false, false) => Keep::WithReport,
                    };
                    let resolved = last.as_ref().map(|last| parsed.of(self, last));
                    let ending = self.end_attempt(key, &meta, last.as_ref(), resolved, &mut run, abort, keep, resumed);
                    unsaved = Box::pin(ending).await?;
                    if preempted && run.next() == Next::Handle {
                        self.stats.preempted.fetch_add(1, Ordering::Relaxed);
                        return self.report(key, allot_core::apps::TaskEnding::Preempted, None).await;
                    }
                }
                Next::Report(ending) => {
                    let counter = match &ending {
                        Ending::Succeeded => &self.stats.succeeded,
                        Ending::Failed(_) => &self.stats.failed,
                        Ending::Aborted(_) => &self.stats.aborted,
                    };
                    if !ended_before {
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                    if replaced {
                        return Ok(());
                    }
                    if gone {
                        // Stopped, finalized, its tokens released: the run goes with its task.
                        return self.forget_run(key).await;
                    }
                    if ending == Ending::Succeeded {
                        self.keep_outputs(key, &run).await?;
                    }
                    if stopped.is_none() {
                        let failed = match &ending {
                            Ending::Succeeded => None,
                            Ending::Failed(error) => Some(error.to_string()),
                            Ending::Aborted(reason) => Some(format!("aborted: {reason}")),
                        };
                        let ending = allot_core::apps::TaskEnding::of(failed);
                        return self.report(key, ending, unsaved.then_some(run)).await;
                    }
                    if unsaved {
                        self.store.put_run(key.app.clone(), key.task.clone(), run).await?;
                    }
                    return Ok(());
                }
            }
        }
    }

    /// The first run of `task`. If `store_first` (its plugin acts outside the run, the task's
    /// directory among it): its directory emptied (a task removed and added again under the same
    /// id starts from nothing: a shell command's marker there would be taken for its own), then
    /// the run stored before any round (a restart resumes it, and does not empty its directory
    /// again). A plugin that does not act outside never reads the directory: it is left alone (a
    /// system call per task saved; `forget_run` and the sweep remove it with the task). A `stale`
    /// run of an earlier task of the same id, whose executor stopped before it could remove it,
    /// has its tokens released.
    async fn fresh_run(
        &self,
        key: &RunKey,
        task: &PlacedTask,
        stale: Option<Run>,
        store_first: bool,
    ) -> Result<Run, StoreError> {
        if let Some(stale) = stale {
            tracing::info!(run = %key, "the kept run is of an earlier task of the same id: the task runs afresh");
            for token in &stale.tokens {
                if let Err(err) = release(&self.store, &self.waits, &token.namespace, &token.token).await {
                    return Err(StoreError::Unavailable(format!(
                        "a token of the earlier run could not be released: {err}"
                    )));
                }
            }
        }
        let mut run = Run::new(self.now_ms());
        run.task_seq = Some(task.seq);
        if store_first {
            let dir = self.task_dir(key);
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {}
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => {
                    return Err(StoreError::Unavailable(format!(
                        "cannot empty the task's directory {}: {err}",
                        dir.display()
                    )))
                }
            }
            self.store.put_run(key.app.clone(), key.task.clone(), run.clone()).await?;
        }
        Ok(run)
    }

    /// Tells the scheduler how the task's attempt ended. A task gone meanwhile (its application
    /// removed) takes its run with it: nothing else would remove it. The report is queued when
    /// this is called (the future keeps no copy of the run while it waits).
    fn report<'a>(
        &'a self,
        key: &'a RunKey,
        ending: allot_core::apps::TaskEnding,
        run: Option<Run>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        let answered = self.apps.finish(&key.app, &key.task, ending, run);
        async move {
            match answered.await? {
                Reported::Heard => Ok(()),
                Reported::Gone => self.forget_run(key).await,
            }
        }
    }

    /// Removes a run whose task is gone, and the task's directory.
    async fn forget_run(&self, key: &RunKey) -> Result<(), StoreError> {
        self.store.remove_run(key.app.clone(), key.task.clone()).await?;
        if let Err(err) = std::fs::remove_dir_all(self.task_dir(key)) {
            if err.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(run = %key, error = %err, "cannot remove the directory of a removed task");
            }
        }
        Ok(())
    }

    /// The task's own directory (logs, scratch, outputs), kept across attempts.
    /// The directory of the run's attempts on this machine (its plugins' files, its logs).
    pub fn task_dir(&self, key: &RunKey) -> std::path::PathBuf {
        // One allocation (a round's context names it, every round of every run).
        let (app, task) = (key.app.as_str(), key.task.as_str());
        let mut dir =
            std::path::PathBuf::with_capacity(self.config.data_dir.as_os_str().len() + app.len() + task.len() + 2);
        dir.push(&self.config.data_dir);
        dir.push(app);
        dir.push(task);
        dir
    }

    /// The retry policy of a task whose spec resolved to `resolved`: its spec's `retries`, else
    /// the daemon's (also for a spec that cannot be read).
    fn policy(&self, resolved: &Resolved) -> RetryPolicy {
        resolved.as_ref().map_or(self.config.retry, |(spec, _)| spec.policy(self.config.retry))
    }

    /// Whose catalog entries the plugin `plugin` reaches for a task of the application `meta`.
    fn scope_of(&self, plugin: &str, meta: &AppMeta) -> CatalogScope {
        CatalogScope {
            plugin: plugin.to_owned(),
            queue: meta.queue.clone(),
            max_output_bytes: self.config.max_output_bytes,
        }
    }

    /// A round's context for `task`'s current attempt.
    fn context(
        &self,
        key: &RunKey,
        meta: &AppMeta,
        task: Option<&PlacedTask>,
        run: &Run,
        plugin: &str,
        spec: &RunSpec,
    ) -> TaskContext {
        let waker = self.waker_for();
        let tokens = Tokens::new(
            self.store.clone(),
            plugin,
            key.clone(),
            run.attempt,
            self.waits.clone(),
            waker.clone(),
            run.tokens.clone(),
        )
        .with_scope(crate::context::scope_of(&meta.labels));
        let mut ctx = TaskContext::new(key.clone(), run.attempt, &spec.task_type, tokens, run.state.clone(), waker);
        ctx.spec = spec.spec.clone();
        ctx.inputs = spec.inputs.clone();
        ctx.dir = self.task_dir(key);
        ctx.max_output_bytes = self.config.max_output_bytes;
        ctx.secrets = self.config.secrets.clone();
        ctx.clock = self.config.clock.clone();
        let scope = self.scope_of(plugin, meta);
        ctx.catalog =
            Catalog::new(self.store.clone(), scope, (key.app.clone(), key.task.clone()), self.config.clock.clone());
        let placement = task.and_then(|t| t.placement.as_ref());
        let text = |value: &serde_json::Value| value.as_str().map_or_else(|| value.to_string(), str::to_owned);
        ctx.metadata = Metadata {
            queue: meta.queue.clone(),
            user: meta.user.clone(),
            labels: meta.labels.clone(),
            annotations: spec
                .spec
                .get("annotations")
                .and_then(|a| a.as_object())
                .map(|a| a.iter().map(|(k, v)| (k.clone(), text(v))).collect())
                .unwrap_or_default(),
            overrides: spec.spec.get("overrides").cloned().unwrap_or_default(),
            alloc: placement.map(|p| p.uri()).unwrap_or_default(),
            resources: placement.map(|p| p.resources.clone()).unwrap_or_default(),
            interruptible: spec.spec.get("interruptible").and_then(|i| i.as_bool()).unwrap_or(false),
            node: self.config.node.clone(),
        };
        ctx
    }

    /// The time now, from the configured clock (ms since the epoch).
    fn now_ms(&self) -> u64 {
        self.config.clock.wall_ms()
    }

    /// Wakes the runs this executor drives (given to plugins and token waits).
    fn waker_for(&self) -> Waker {
        let active = self.active.clone();
        Waker::new(move |run| {
            if let Some(driven) = active.lock().unwrap_or_else(|p| p.into_inner()).get(run) {
                driven.notify.notify_one();
            }
        })
    }

    /// What the task's spec says of how to run it, and the plugin that runs it.
    fn plugin_for(&self, task: &PlacedTask) -> Resolved {
        let spec = crate::spec::parse(&task.spec)?;
        let plugin = self
            .registry
            .resolve(&spec.task_type, spec.plugin.as_deref())
            .map_err(|err| ExecError::user("no_plugin", err.to_string()))?;
        Ok((spec, plugin))
    }

    /// One `handle` round, stored.
    async fn round(
        &self,
        key: &RunKey,
        meta: &AppMeta,
        task: &PlacedTask,
        resolved: &Resolved,
        run: &mut Run,
    ) -> Result<(), StoreError> {
        let now = self.now_ms();
        let (spec, plugin) = match resolved {
            Ok((spec, plugin)) => (spec, plugin.clone()),
            Err(error) => {
                let error = error.clone();
                // A task no plugin can run fails for good.
                let failed = Transition::ephemeral(PhaseInfo::permanent(error));
                run.after_round(Ok((failed, StateWrite::Unchanged)), self.config.retry, now);
                return self.store_round(key, run).await;
            }
        };
        self.stats.rounds.fetch_add(1, Ordering::Relaxed);
        let policy = spec.policy(self.config.retry);
        // The first round of a cacheable task looks in the catalog first.
        let lookup = (run.round == 0 && run.attempt == 1).then(|| spec.cache_lookup(&*plugin)).flatten();
        if let Some(mut lookup) = lookup {
            match self.store.cached_outputs(&lookup.key).await? {
                Some(cached) => {
                    self.stats.cache_hits.fetch_add(1, Ordering::Relaxed);
                    let from = format!("{}/{}", cached.app, cached.task);
                    let reason = format!("cache hit: the outputs of {from} (key {})", short_key(&lookup.key));
                    lookup.hit = Some(from);
                    run.cache = Some(lookup);
                    run.outputs = Some(cached.outputs);
                    let hit = Transition::ephemeral(PhaseInfo::success(reason));
                    run.after_round(Ok((hit, StateWrite::Unchanged)), policy, now);
                    return self.store_round(key, run).await;
                }
                None => {
                    self.stats.cache_misses.fetch_add(1, Ordering::Relaxed);
                    let reason = format!("cache miss (key {}): runs, and keeps its outputs", short_key(&lookup.key));
                    run.cache = Some(lookup);
                    run.hold(&PhaseInfo::new(Phase::NotReady, CACHE_MISS, reason), now);
                }
            }
        }
        let result = match run.recorded().cloned() {
            Some(recorded) => Ok((recorded, StateWrite::Unchanged)),
            None => {
                let mut ctx = self.context(key, meta, Some(task), run, plugin.id(), spec);
                let answer = plugin.handle(&mut ctx).await;
                let out = ctx.finish();
                for reason in &out.events {
                    run.note(reason, now);
                }
                // What the attempt holds now: taken before, taken in the round, less released.
                run.tokens = out.taken;
                match answer {
                    Ok(transition) => {
                        if transition.info.phase == allot_core::runs::Phase::Success {
                            if let Some(outputs) = &out.outputs {
                                run.outputs = Some(outputs.to_string());
                            }
                        }
                        if transition.kind == TransitionKind::Barrier {
                            // Stored before it is acted on: a crash from here on replays it.
                            run.record_barrier(&transition);
                            if let StateWrite::Put(state) = &out.write {
                                run.state = Some(state.clone());
                            }
                            self.store.put_run(key.app.clone(), key.task.clone(), run.clone()).await?;
                        }
                        Ok((transition, out.write))
                    }
                    Err(error) => Err(error),
                }
            }
        };
        run.after_round(result, policy, self.now_ms());
        self.store_round(key, run).await
    }

    /// Stores a run after a round; a round that ends its attempt is stored with the ending (one
    /// write less: a crash before it replays the round, which `handle` allows).
    async fn store_round(&self, key: &RunKey, run: &Run) -> Result<(), StoreError> {
        if run.next() == Next::Handle {
            self.store.put_run(key.app.clone(), key.task.clone(), run.clone()).await
        } else {
            Ok(())
        }
    }

    /// Releases the token of attempt `attempt` in every namespace of `plugin` (`<plugin>:*`):
    /// what a round took and its run could not record (the store failed before the run was
    /// stored, or the daemon died) is held by no lease, and would be held for good.
    async fn release_unlisted(&self, key: &RunKey, attempt: u32, plugin: &str) -> Result<(), StoreError> {
        let unavailable = |err: ExecError| StoreError::Unavailable(format!("a token could not be released: {err}"));
        let token = attempt_token(key, attempt).map_err(unavailable)?;
        let prefix = format!("{plugin}:");
        // Namespaces are listed by name: the plugin's follow its id.
        let mut after = allot_core::NamespaceName::new(plugin).ok();
        loop {
            let page = self.store.namespaces(allot_store::PageRequest::new(after, 100)).await?;
            for namespace in &page.items {
                if !namespace.name.as_str().starts_with(&prefix) {
                    return Ok(());
                }
                release(&self.store, &self.waits, &namespace.name, &token).await.map_err(unavailable)?;
            }
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(()),
            }
        }
    }

    /// Keeps a succeeded cacheable task's outputs in the catalog under the key its lookup missed
    /// (the first kept stays, so a report repeated after a crash changes nothing).
    async fn keep_outputs(&self, key: &RunKey, run: &Run) -> Result<(), StoreError> {
        let Some(cache_key) = run.cache.as_ref().filter(|lookup| lookup.hit.is_none()).map(|l| l.key.clone()) else {
            return Ok(());
        };
        let entry = allot_store::CachedOutputs {
            outputs: run.outputs.clone().unwrap_or_else(|| "null".to_owned()),
            app: key.app.clone(),
            task: key.task.clone(),
            at: self.now_ms(),
        };
        self.store.put_cached_outputs(cache_key, entry).await
    }

    /// Aborts (if asked) and finalizes the attempt, releases its tokens, stores the run (unless
    /// `keep` says it is another's to write, or that an attempt that ends the task goes with the
    /// report: then `true`, not stored yet). A `resumed` run also gives back the attempt's token
    /// in every namespace of its plugin, listed or not. Until the run is stored, a crash replays
    /// the attempt's last round (as between a round and its store), which `handle` allows.
    /// `resolved` is `task`'s spec and plugin.
    #[allow(clippy::too_many_arguments)]
    async fn end_attempt(
        &self,
        key: &RunKey,
        meta: &AppMeta,
        task: Option<&PlacedTask>,
        resolved: Option<&Resolved>,
        run: &mut Run,
        abort: bool,
        keep: Keep,
        resumed: bool,
    ) -> Result<bool, StoreError> {
        // An attempt lost with its placement ran elsewhere: its plugin is not called here.
        let task = task.filter(|_| !run.attempt_lost());
        if let (Some(_), Some(Ok((spec, plugin)))) = (task, resolved) {
            // Not for a run whose task was replaced: the new task's attempts hold tokens of the
            // same names.
            if resumed && keep != Keep::Nothing {
                self.release_unlisted(key, run.attempt, plugin.id()).await?;
            }
            let mut ctx = self.context(key, meta, task, run, plugin.id(), spec);
            if abort {
                if let Err(err) = plugin.abort(&mut ctx).await {
                    tracing::warn!(run = %key, error = %err, "abort failed; finalizing anyway");
                }
            }
            if let Err(err) = plugin.finalize(&mut ctx).await {
                tracing::warn!(run = %key, error = %err, "finalize failed");
            }
            for token in ctx.finish().taken {
                run.took(token);
            }
        }
        for token in std::mem::take(&mut run.tokens) {
            if let Err(err) = release(&self.store, &self.waits, &token.namespace, &token.token).await {
                run.tokens.push(token);
                if keep != Keep::Nothing {
                    self.store.put_run(key.app.clone(), key.task.clone(), run.clone()).await?;
                }
                return Err(StoreError::Unavailable(format!("a token could not be released: {err}")));
            }
        }
        let retried = run.attempt_finalized(self.now_ms()) == Next::Handle;
        if retried {
            self.stats.retried.fetch_add(1, Ordering::Relaxed);
        }
        match keep {
            Keep::WithReport if !retried => Ok(true),
            Keep::Run | Keep::WithReport => {
                self.store.put_run(key.app.clone(), key.task.clone(), run.clone()).await?;
                Ok(false)
            }
            Keep::Nothing => Ok(false),
        }
    }
}

#[cfg(test)]
#[path = "executor_tests.rs"]
mod tests;
