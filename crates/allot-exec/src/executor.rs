//! The executor: drives every task placed on the pools this daemon serves, round by round, with
//! its plugin, until the task ends; keeps each run in the store after every step, so a restart
//! resumes every task where it was.
//!
//! A run's steps (decided by `allot_core::exec::Run`):
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

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use allot_core::app::TaskState;
use allot_core::exec::{
    Ending, ExecError, Next, Phase, PhaseInfo, RetryPolicy, Run, StateWrite, Transition, TransitionKind,
};
use allot_core::pool::PoolName;
use allot_core::sched::AppId;
use allot_store::{Store, StoreError};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};

use crate::apps::{AppMeta, AppsAccess, PlacedTask};
use crate::context::{release, Metadata, RunKey, Secrets, TaskContext, TokenWaits, Tokens, Waker};
use crate::plugin::Plugin;
use crate::registry::Registry;

/// How an executor runs.
#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    /// The pools whose tasks this daemon runs.
    pub pools: HashSet<PoolName>,
    pub retry: RetryPolicy,
    /// Where each task gets its directory (`<dir>/<app>/<task>`).
    pub data_dir: PathBuf,
    pub max_output_bytes: usize,
    /// The longest a run waits between rounds when nothing wakes it.
    pub pause: Duration,
    /// How often the executor looks for newly placed tasks when nothing wakes it.
    pub scan: Duration,
    pub secrets: Secrets,
    /// This daemon, by the URL others reach it at: the name of its executor's lease.
    pub node: String,
    /// The plugins' counters (give the same to their `SetupContext`s).
    pub counters: crate::context::PluginCounters,
}

impl ExecutorConfig {
    /// `data_dir` is made absolute: tasks' commands run elsewhere and are given paths into it.
    pub fn new(pools: HashSet<PoolName>, data_dir: PathBuf) -> ExecutorConfig {
        ExecutorConfig {
            pools,
            retry: RetryPolicy::default(),
            data_dir: std::path::absolute(&data_dir).unwrap_or(data_dir),
            max_output_bytes: 1 << 20,
            pause: Duration::from_secs(1),
            scan: Duration::from_millis(200),
            secrets: Secrets::default(),
            node: "local".to_owned(),
            counters: crate::context::PluginCounters::default(),
        }
    }
}

/// What a task's spec says of how to run it: `{"type": ..., "plugin": ..., "inputs": ...}`, the
/// rest for the plugin.
struct RunSpec {
    task_type: String,
    plugin: Option<String>,
    spec: serde_json::Value,
    inputs: serde_json::Value,
    /// `cache_version`: the task's outputs are kept for reuse, and reused, under its type, this
    /// version and its inputs (unless `"cache": false`).
    cache_version: Option<String>,
    cache: bool,
}

impl RunSpec {
    /// The key of its outputs in the catalog, if it may be cached by `plugin`: a digest of type,
    /// version and inputs (JSON with sorted keys, so equal inputs give equal keys).
    fn cache_key(&self, plugin: &dyn Plugin) -> Option<String> {
        use sha2::{Digest, Sha256};
        let version = self.cache_version.as_ref().filter(|_| self.cache && plugin.properties().caching)?;
        let mut digest = Sha256::new();
        for part in [self.task_type.as_bytes(), version.as_bytes(), self.inputs.to_string().as_bytes()] {
            digest.update((part.len() as u64).to_be_bytes());
            digest.update(part);
        }
        Some(digest.finalize().iter().map(|b| format!("{b:02x}")).collect())
    }
}

fn run_spec(task: &PlacedTask) -> Result<RunSpec, ExecError> {
    let bad = |why: &str| ExecError::user("bad_spec", format!("the task's spec {why}"));
    let spec: serde_json::Value = if task.spec.trim().is_empty() {
        return Err(bad("is empty: it names no task type (`{\"type\": \"shell\", ...}`)"));
    } else {
        serde_json::from_str(&task.spec).map_err(|e| bad(&format!("is not JSON: {e}")))?
    };
    let task_type = spec.get("type").and_then(|t| t.as_str()).ok_or_else(|| bad("has no string `type`"))?.to_owned();
    let plugin = match spec.get("plugin") {
        None => None,
        Some(p) => Some(p.as_str().ok_or_else(|| bad("has a `plugin` that is not a string"))?.to_owned()),
    };
    let inputs = spec.get("inputs").cloned().unwrap_or(serde_json::Value::Null);
    let cache_version = match spec.get("cache_version") {
        None => None,
        Some(serde_json::Value::String(v)) => Some(v.clone()),
        Some(_) => return Err(bad("has a `cache_version` that is not a string")),
    };
    let cache = match spec.get("cache") {
        None => true,
        Some(serde_json::Value::Bool(on)) => *on,
        Some(_) => return Err(bad("has a `cache` that is not true or false")),
    };
    Ok(RunSpec { task_type, plugin, spec, inputs, cache_version, cache })
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

type Active = Arc<Mutex<HashMap<RunKey, Arc<Notify>>>>;

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
    retried: AtomicU64,
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
    held_back: AtomicU64,
}

/// [`ExecStats`] as read at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExecCounts {
    pub rounds: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub aborted: u64,
    /// Attempts that failed and were followed by another.
    pub retried: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Times a run was held back by its application's parallelism.
    pub held_back: u64,
}

impl ExecStats {
    pub fn counts(&self) -> ExecCounts {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ExecCounts {
            rounds: read(&self.rounds),
            succeeded: read(&self.succeeded),
            failed: read(&self.failed),
            aborted: read(&self.aborted),
            retried: read(&self.retried),
            cache_hits: read(&self.cache_hits),
            cache_misses: read(&self.cache_misses),
            held_back: read(&self.held_back),
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

/// The executor of one daemon.
pub struct Executor {
    store: Arc<dyn Store>,
    registry: Arc<Registry>,
    config: ExecutorConfig,
    waits: TokenWaits,
    apps: AppsAccess,
    /// The runs being driven, each with what wakes it.
    active: Active,
    /// Wakes the scan for new tasks.
    scan: Notify,
    parallelism: Parallelism,
    stats: ExecStats,
}

impl Executor {
    pub fn new(store: Arc<dyn Store>, registry: Arc<Registry>, config: ExecutorConfig) -> Arc<Executor> {
        Arc::new(Executor {
            apps: AppsAccess::new(store.clone()),
            store,
            registry,
            config,
            waits: TokenWaits::default(),
            active: Arc::default(),
            scan: Notify::new(),
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
            Some(notify) => {
                notify.notify_one();
                true
            }
            None => false,
        }
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
    /// its own until it ends.
    pub async fn run(self: Arc<Executor>, mut shutdown: watch::Receiver<bool>) {
        tokio::spawn(self.clone().renew_lease(shutdown.clone()));
        loop {
            match self.placed_here().await {
                Ok(found) => {
                    for key in found {
                        let notify = Arc::new(Notify::new());
                        let fresh = {
                            let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
                            if active.contains_key(&key) {
                                false
                            } else {
                                active.insert(key.clone(), notify.clone());
                                true
                            }
                        };
                        if fresh {
                            let (executor, shutdown) = (self.clone(), shutdown.clone());
                            tokio::spawn(async move { executor.drive(key, notify, shutdown).await });
                        }
                    }
                }
                Err(err) => tracing::warn!(error = %err, "cannot list the tasks to run"),
            }
            tokio::select! {
                _ = self.scan.notified() => {}
                _ = tokio::time::sleep(self.config.scan) => {}
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
        }
    }

    /// Keeps this executor's lease while it runs: whoever schedules takes its pools as lost if
    /// the lease lapses (the daemon died, or lost the store).
    async fn renew_lease(self: Arc<Executor>, mut shutdown: watch::Receiver<bool>) {
        let pools: Vec<PoolName> = self.config.pools.iter().cloned().collect();
        let mut failing = false;
        loop {
            match self.store.renew_executor(&self.config.node, &pools, EXECUTOR_LEASE).await {
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

    /// The placed tasks on this daemon's pools (Allocated or Running).
    async fn placed_here(&self) -> Result<Vec<RunKey>, StoreError> {
        let found = self.apps.placed_on(&self.config.pools).await?;
        Ok(found.into_iter().map(|(app, task)| RunKey { app, task }).collect())
    }

    /// Drives one run until its task ends (or the daemon stops: the run resumes at the next
    /// start from what is stored).
    async fn drive(self: Arc<Executor>, key: RunKey, notify: Arc<Notify>, mut shutdown: watch::Receiver<bool>) {
        let result = self.drive_until_done(&key, &notify, &mut shutdown).await;
        self.parallelism.forget_unused(&key.app);
        if let Err(err) = result {
            tracing::warn!(run = %key, error = %err, "a run stopped; it resumes at the next scan");
        }
        self.active.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
    }

    async fn drive_until_done(
        &self,
        key: &RunKey,
        notify: &Notify,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<(), StoreError> {
        let store = &*self.store;
        // A new run is first stored with the placement it runs on (below).
        let mut run = match store.run(key.app.clone(), key.task.clone()).await? {
            Some(run) => run,
            None => Run::new(now_ms()),
        };
        let mut streak = 0;
        // The application's parallelism: a run holds a slot while it is past waiting to begin.
        let meta = self.apps.app_meta(&key.app).await?;
        let max_parallelism = meta.max_parallelism;
        let parallelism = max_parallelism.map(|max| self.parallelism.of(&key.app, max));
        let mut slot: Option<OwnedSemaphorePermit> = None;
        // The task as last read: a task removed from outside is still aborted and finalized by
        // its plugin, which needs its spec.
        let mut last: Option<PlacedTask> = None;
        let mut reread = true;
        loop {
            if *shutdown.borrow() {
                return Ok(());
            }
            // The task as the scheduler has it now: removed or ended from outside stops the run.
            // It is read again after every wait; steps that follow each other at once use the
            // last reading (what happened meanwhile is seen at the next wait).
            let task = match (&last, reread) {
                (Some(task), false) => Some(task.clone()),
                _ => self.apps.task(&key.app, &key.task).await?,
            };
            reread = false;
            if let Some(task) = &task {
                last = Some(task.clone());
            }
            let stopped = match &task {
                None => Some("the task was removed".to_owned()),
                Some(t) if t.state.is_terminal() => Some(format!("the task was ended from outside ({:?})", t.state)),
                Some(_) => None,
            };
            if let (Some(t), None) = (&task, &stopped) {
                let here = t
                    .placement
                    .as_ref()
                    .filter(|p| self.config.pools.contains(&p.pool))
                    .filter(|_| matches!(t.state, TaskState::Allocated | TaskState::Running));
                let Some(placement) = here else {
                    // Waiting to be placed again, or placed elsewhere (its pool was taken as
                    // lost): whoever runs it now takes the run over.
                    tracing::info!(run = %key, "the task is not placed on this daemon's pools now: not run here");
                    return Ok(());
                };
                let alloc = placement.uri();
                // Noted in the run, stored with its next write: a crash before leaves the run as it
                // was, and the same is decided again.
                if run.alloc.as_deref() != Some(alloc.as_str())
                    && run.placement_lost(&alloc, self.config.retry, now_ms())
                {
                    tracing::warn!(run = %key, "placed again after its placement was lost: a new attempt");
                }
            }
            if let Some(reason) = &stopped {
                if !matches!(run.next(), Next::Report(_)) {
                    run.abort(reason, now_ms());
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
                                    run.hold(&PhaseInfo::new(Phase::NotReady, HELD_BACK, reason), now_ms());
                                    store.put_run(key.app.clone(), key.task.clone(), run.clone()).await?;
                                }
                                // Woken by a permit, or after the pause to see if the task still stands.
                                tokio::select! {
                                    permit = semaphore.clone().acquire_owned() => slot = permit.ok(),
                                    _ = tokio::time::sleep(self.config.pause) => {}
                                    _ = shutdown.wait_for(|stop| *stop) => return Ok(()),
                                }
                                reread = true;
                                continue;
                            }
                        }
                    }
                    let before = (run.phase, run.version);
                    self.round(key, &meta, &task, &mut run).await?;
                    // Reported running once a round leaves it running: a task whose first round
                    // ends it goes from Allocated to its end in one report.
                    if task.state == TaskState::Allocated && run.next() == Next::Handle {
                        self.apps.start(&key.app, &key.task).await?;
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
                            _ = notify.notified() => {}
                            _ = tokio::time::sleep(self.config.pause) => {}
                            _ = shutdown.wait_for(|stop| *stop) => return Ok(()),
                        }
                        reread = true;
                    }
                }
                Next::EndAttempt { abort } => {
                    self.end_attempt(key, &meta, task.as_ref().or(last.as_ref()), &mut run, abort).await?;
                }
                Next::Report(ending) => {
                    let counter = match &ending {
                        Ending::Succeeded => &self.stats.succeeded,
                        Ending::Failed(_) => &self.stats.failed,
                        Ending::Aborted(_) => &self.stats.aborted,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    if ending == Ending::Succeeded {
                        self.keep_outputs(key, last.as_ref(), &run).await?;
                    }
                    if stopped.is_none() {
                        let failed = match &ending {
                            Ending::Succeeded => None,
                            Ending::Failed(error) => Some(error.to_string()),
                            Ending::Aborted(reason) => Some(format!("aborted: {reason}")),
                        };
                        self.apps.finish(&key.app, &key.task, failed).await?;
                    }
                    return Ok(());
                }
            }
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
        );
        let mut ctx = TaskContext::new(key.clone(), run.attempt, &spec.task_type, tokens, run.state.clone(), waker);
        ctx.spec = spec.spec.clone();
        ctx.inputs = spec.inputs.clone();
        ctx.dir = self.config.data_dir.join(key.app.as_str()).join(key.task.as_str());
        ctx.max_output_bytes = self.config.max_output_bytes;
        ctx.secrets = self.config.secrets.clone();
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
        };
        ctx
    }

    /// Wakes the runs this executor drives (given to plugins and token waits).
    fn waker_for(&self) -> Waker {
        let active = self.active.clone();
        Waker::new(move |run| {
            if let Some(notify) = active.lock().unwrap_or_else(|p| p.into_inner()).get(run) {
                notify.notify_one();
            }
        })
    }

    /// What the task's spec says of how to run it, and the plugin that runs it.
    fn plugin_for(&self, task: &PlacedTask) -> Result<(RunSpec, Arc<dyn Plugin>), ExecError> {
        let spec = run_spec(task)?;
        let plugin = self
            .registry
            .resolve(&spec.task_type, spec.plugin.as_deref())
            .map_err(|err| ExecError::user("no_plugin", err.to_string()))?;
        Ok((spec, plugin))
    }

    /// One `handle` round, stored.
    async fn round(&self, key: &RunKey, meta: &AppMeta, task: &PlacedTask, run: &mut Run) -> Result<(), StoreError> {
        let now = now_ms();
        let (spec, plugin) = match self.plugin_for(task) {
            Ok(found) => found,
            Err(error) => {
                // A task no plugin can run fails for good.
                let failed = Transition::ephemeral(PhaseInfo::permanent(error));
                run.after_round(Ok((failed, StateWrite::Unchanged)), self.config.retry, now);
                return self.store_round(key, run).await;
            }
        };
        self.stats.rounds.fetch_add(1, Ordering::Relaxed);
        // The first round of a cacheable task looks in the catalog first.
        let cache_key = (run.round == 0 && run.attempt == 1).then(|| spec.cache_key(&*plugin)).flatten();
        if let Some(cache_key) = cache_key {
            match self.store.cached_outputs(&cache_key).await? {
                Some(cached) => {
                    self.stats.cache_hits.fetch_add(1, Ordering::Relaxed);
                    let reason = format!("cache hit: the outputs of {}/{}", cached.app, cached.task);
                    run.outputs = Some(cached.outputs);
                    let hit = Transition::ephemeral(PhaseInfo::success(reason));
                    run.after_round(Ok((hit, StateWrite::Unchanged)), self.config.retry, now);
                    return self.store_round(key, run).await;
                }
                None => {
                    self.stats.cache_misses.fetch_add(1, Ordering::Relaxed);
                    let miss = PhaseInfo::new(Phase::NotReady, CACHE_MISS, "cache miss: runs, and keeps its outputs");
                    run.hold(&miss, now);
                }
            }
        }
        let result = match run.recorded().cloned() {
            Some(recorded) => Ok((recorded, StateWrite::Unchanged)),
            None => {
                let mut ctx = self.context(key, meta, Some(task), run, plugin.id(), &spec);
                let answer = plugin.handle(&mut ctx).await;
                let out = ctx.finish();
                for reason in &out.events {
                    run.note(reason, now);
                }
                // What the attempt holds now: taken before, taken in the round, less released.
                run.tokens = out.taken;
                match answer {
                    Ok(transition) => {
                        if transition.info.phase == allot_core::exec::Phase::Success {
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
        run.after_round(result, self.config.retry, now_ms());
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

    /// Keeps a succeeded cacheable task's outputs in the catalog (the first kept stays, so a
    /// task that reused them, or a report repeated after a crash, changes nothing).
    async fn keep_outputs(&self, key: &RunKey, task: Option<&PlacedTask>, run: &Run) -> Result<(), StoreError> {
        let Some((spec, plugin)) = task.and_then(|t| self.plugin_for(t).ok()) else { return Ok(()) };
        let Some(cache_key) = spec.cache_key(&*plugin) else { return Ok(()) };
        let entry = allot_store::CachedOutputs {
            outputs: run.outputs.clone().unwrap_or_else(|| "null".to_owned()),
            app: key.app.clone(),
            task: key.task.clone(),
            at: now_ms(),
        };
        self.store.put_cached_outputs(cache_key, entry).await
    }

    /// Aborts (if asked) and finalizes the attempt, releases its tokens, stores the run.
    async fn end_attempt(
        &self,
        key: &RunKey,
        meta: &AppMeta,
        task: Option<&PlacedTask>,
        run: &mut Run,
        abort: bool,
    ) -> Result<(), StoreError> {
        // An attempt lost with its placement ran elsewhere: its plugin is not called here.
        let task = task.filter(|_| !run.attempt_lost());
        if let Some((spec, plugin)) = task.and_then(|t| self.plugin_for(t).ok()) {
            let mut ctx = self.context(key, meta, task, run, plugin.id(), &spec);
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
                self.store.put_run(key.app.clone(), key.task.clone(), run.clone()).await?;
                return Err(StoreError::Unavailable(format!("a token could not be released: {err}")));
            }
        }
        if run.attempt_finalized(now_ms()) == Next::Handle {
            self.stats.retried.fetch_add(1, Ordering::Relaxed);
        }
        self.store.put_run(key.app.clone(), key.task.clone(), run.clone()).await
    }
}
