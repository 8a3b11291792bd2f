//! What the executor tests share: a probe plugin that counts what it is asked, an embedded
//! store with a pool and a queue, and the executor started on it.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use allot_core::apps::queues::{QueueLimits, QueuePath};
use allot_core::apps::states::TaskState;
use allot_core::apps::{AppId, AppSpec, SchedulingPolicy, TaskId, TaskSpec};
use allot_core::pools::PoolName;
use allot_core::runs::{ExecError, PhaseInfo, RetryPolicy, Transition};
use allot_exec::{
    builtin, Executor, ExecutorConfig, Plugin, PluginCounters, PluginEntry, Registry, Secrets, SetupContext,
    TaskContext, TokenStatus, Waker,
};
use allot_store::{AppStore, EmbeddedConfig, EmbeddedStore, PoolStore, Store};
use async_trait::async_trait;
use tokio::sync::watch;

/// Counts what the executor asks of it. `fail_first`: the first attempt fails (user error);
/// `hold`: takes a token of its quota `seats`, then runs until stopped.
#[derive(Default)]
pub(crate) struct Probe {
    pub(crate) handled: AtomicU32,
    pub(crate) aborted: AtomicU32,
    pub(crate) finalized: AtomicU32,
    /// What a `stall` task's first round waits for.
    pub(crate) gate: tokio::sync::Notify,
}

pub(crate) struct ProbePlugin(Arc<Probe>);

#[async_trait]
impl Plugin for ProbePlugin {
    fn id(&self) -> &str {
        "probe"
    }

    async fn handle(&self, ctx: &mut TaskContext) -> Result<Transition, ExecError> {
        self.0.handled.fetch_add(1, Ordering::SeqCst);
        match ctx.spec.get("mode").and_then(|m| m.as_str()) {
            Some("fail_first") if ctx.attempt == 1 => {
                Ok(Transition::ephemeral(PhaseInfo::retryable(ExecError::user("exit_1", "first attempt fails"))))
            }
            Some("observe") => {
                ctx.record_event("looked around");
                let m = &ctx.metadata;
                let seen = serde_json::json!({
                    "queue": m.queue, "user": m.user, "labels": m.labels, "annotations": m.annotations,
                    "overrides": m.overrides, "interruptible": m.interruptible, "alloc_set": !m.alloc.is_empty(),
                });
                ctx.set_outputs(seen)?;
                Ok(Transition::ephemeral(PhaseInfo::success("observed")))
            }
            Some("hold") => match ctx.tokens.take("seats", 1).await? {
                TokenStatus::Granted => Ok(Transition::ephemeral(PhaseInfo::running(0, "holding a seat"))),
                TokenStatus::Waiting(_) => Ok(Transition::ephemeral(PhaseInfo::waiting_for_resources("no seat"))),
            },
            // A desk, one per project at most.
            Some("capped") => {
                let caps = allot_core::Constraints { project: Some(1), namespace: None };
                match ctx.tokens.take_capped("desks", 1, caps).await? {
                    TokenStatus::Granted => Ok(Transition::ephemeral(PhaseInfo::running(0, "holding a desk"))),
                    waiting => Ok(Transition::ephemeral(PhaseInfo::waiting_for_resources(waiting.why("probe:desks")))),
                }
            }
            // Its own catalog: the entry `words` for its inputs, kept by the first task to look.
            Some("memo") => {
                let inputs = ctx.inputs.clone();
                let name = ctx.spec.get("entry").and_then(|e| e.as_str()).unwrap_or("words").to_owned();
                let outputs = match ctx.catalog.get(&name, "1", &inputs).await? {
                    Some(found) => {
                        serde_json::json!({ "from": format!("{}/{}", found.app, found.task), "kept": found.outputs })
                    }
                    None => {
                        let kept = ctx.catalog.put(&name, "1", &inputs, &serde_json::json!({ "n": 1 })).await?;
                        serde_json::json!({ "created": kept.created, "queue": ctx.catalog.scope().queue })
                    }
                };
                ctx.set_outputs(outputs)?;
                Ok(Transition::ephemeral(PhaseInfo::success("remembered")))
            }
            // The first round of all waits for the gate, then every round says it runs.
            Some("stall") => {
                if self.0.handled.load(Ordering::SeqCst) == 1 {
                    self.0.gate.notified().await;
                }
                Ok(Transition::ephemeral(PhaseInfo::running(0, "stalled")))
            }
            Some("system_fail") => {
                Ok(Transition::ephemeral(PhaseInfo::retryable(ExecError::system("lost", "the service went away"))))
            }
            _ => Ok(Transition::ephemeral(PhaseInfo::success("done"))),
        }
    }

    async fn abort(&self, _: &mut TaskContext) -> Result<(), ExecError> {
        self.0.aborted.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn finalize(&self, _: &mut TaskContext) -> Result<(), ExecError> {
        self.0.finalized.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

pub(crate) struct Setup {
    pub(crate) _dir: tempfile::TempDir,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) probe: Arc<Probe>,
    pub(crate) stop: watch::Sender<bool>,
}

pub(crate) async fn start(store: Arc<dyn Store>, dir: &std::path::Path, probe: Arc<Probe>) -> watch::Sender<bool> {
    start_counting(store, dir, probe, PluginCounters::default()).await
}

pub(crate) async fn start_counting(
    store: Arc<dyn Store>,
    dir: &std::path::Path,
    probe: Arc<Probe>,
    counters: PluginCounters,
) -> watch::Sender<bool> {
    start_with(store, dir, probe, counters, &builtin::BuiltinConfig::default(), |_| {}).await
}

/// The executor with the built-in plugins set by `builtin`, the probe, and `config` changed by
/// `change`.
pub(crate) async fn start_with(
    store: Arc<dyn Store>,
    dir: &std::path::Path,
    probe: Arc<Probe>,
    counters: PluginCounters,
    builtin: &builtin::BuiltinConfig,
    change: impl FnOnce(&mut ExecutorConfig),
) -> watch::Sender<bool> {
    launch(store, dir, probe, counters, builtin, change).await.0
}

/// [`start_with`], and the executor itself (its counters).
pub(crate) async fn launch(
    store: Arc<dyn Store>,
    dir: &std::path::Path,
    probe: Arc<Probe>,
    counters: PluginCounters,
    builtin: &builtin::BuiltinConfig,
    change: impl FnOnce(&mut ExecutorConfig),
) -> (watch::Sender<bool>, Arc<Executor>) {
    let entry = {
        let probe = probe.clone();
        PluginEntry::new("probe", &["probe"], false, move |setup: SetupContext| {
            let probe = probe.clone();
            async move {
                setup.register_quota("seats", 1).await.map_err(|e| e.to_string())?;
                setup.register_quota("desks", 5).await.map_err(|e| e.to_string())?;
                setup.metrics().inc("loaded");
                Ok(Arc::new(ProbePlugin(probe)) as Arc<dyn Plugin>)
            }
        })
    };
    let mut entries = builtin::configured(builtin);
    entries.push(entry);
    let registry = Registry::load(entries, &BTreeMap::new(), |id| {
        SetupContext::new(id, store.clone(), Secrets::default(), Waker::new(|_| {})).with_counters(counters.clone())
    })
    .await
    .unwrap();
    let mut config = ExecutorConfig::new(HashSet::from([PoolName::new("local").unwrap()]), dir.join("tasks"));
    config.counters = counters;
    config.retry = RetryPolicy { user_attempts: 2, system_retries: 1 };
    change(&mut config);
    let executor = Executor::new(store, Arc::new(registry), config);
    // As a daemon does before it serves: what it runs is known from the first submission.
    executor.take_lease().await.unwrap();
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(executor.clone().run(stopped));
    (stop, executor)
}

/// An embedded store with the pool `local` (cpu=8) and the queue `root.q`.
pub(crate) async fn new_store() -> (tempfile::TempDir, Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let store = new_store_in(&dir, |config| config).await;
    (dir, store)
}

/// The same in `dir`, opened as `config` says, given as it is.
pub(crate) async fn new_store_in(
    dir: &tempfile::TempDir,
    config: impl FnOnce(EmbeddedConfig) -> EmbeddedConfig,
) -> Arc<EmbeddedStore> {
    let store = Arc::new(EmbeddedStore::open(&config(EmbeddedConfig::new(dir.path().join("data")))).unwrap());
    store.put_pool(PoolName::new("local").unwrap(), "cpu=8".parse().unwrap()).await.unwrap();
    store.put_queue(QueuePath::new("root.q").unwrap(), QueueLimits::default()).await.unwrap();
    store
}

pub(crate) async fn setup() -> Setup {
    let (dir, store) = new_store().await;
    started(dir, store).await
}

/// The executor started on `store`.
pub(crate) async fn started(dir: tempfile::TempDir, store: Arc<dyn Store>) -> Setup {
    let probe = Arc::new(Probe::default());
    let stop = start(store.clone(), dir.path(), probe.clone()).await;
    Setup { _dir: dir, store, probe, stop }
}

pub(crate) async fn submit(store: &dyn Store, app: &str, tasks: &[(&str, serde_json::Value)]) -> AppId {
    submit_with(store, app, SchedulingPolicy::default(), tasks).await
}

pub(crate) async fn submit_with(
    store: &dyn Store,
    app: &str,
    policy: SchedulingPolicy,
    tasks: &[(&str, serde_json::Value)],
) -> AppId {
    submit_in(store, app, "root.q", policy, tasks).await
}

/// Application `app` in `queue`, with `tasks`.
pub(crate) async fn submit_in(
    store: &dyn Store,
    app: &str,
    queue: &str,
    policy: SchedulingPolicy,
    tasks: &[(&str, serde_json::Value)],
) -> AppId {
    let id = AppId::new(app).unwrap();
    let spec = AppSpec {
        id: id.clone(),
        queue: QueuePath::new(queue).unwrap(),
        user: "u".into(),
        user_groups: Vec::new(),
        tags: Default::default(),
        groups: Vec::new(),
        policy,
        queue_rule: None,
        priority: Default::default(),
    };
    store.add_app(spec).await.unwrap();
    for (task, spec) in tasks {
        store.add_task(id.clone(), task_spec(task, spec)).await.unwrap();
    }
    id
}

/// Task `id` (cpu=1) with `spec`.
pub(crate) fn task_spec(id: &str, spec: &serde_json::Value) -> TaskSpec {
    TaskSpec {
        preemptable: true,
        id: TaskId::new(id).unwrap(),
        resources: "cpu=1".parse().unwrap(),
        tokens: Vec::new(),
        group: None,
        priority: Default::default(),
        selector: Default::default(),
        spec: spec.to_string(),
    }
}

pub(crate) async fn state(store: &dyn Store, app: &AppId, task: &str) -> TaskState {
    store.task(app.clone(), TaskId::new(task).unwrap()).await.unwrap().task.state
}

/// How long a test waits for a condition before it fails: long enough for a loaded CI machine.
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

/// Waits until a condition holds; fails, naming what was awaited, after a minute.
pub(crate) use allot_host::wait::until;

/// Stops an executor started by [`launch`] and waits until it has stopped: every receiver of
/// its stop signal (the executor and its runs) is gone.
pub(crate) async fn stopped(stop: &watch::Sender<bool>) {
    stop.send_replace(true);
    tokio::time::timeout(PATIENCE, stop.closed()).await.expect("the executor stops");
}
