//! The runs part of a backend: each placed task's run by its plugin (`allot_core::runs::Run`),
//! kept so that an executor that restarts resumes every task where it was.

use std::time::Duration;

use allot_core::apps::{AppId, TaskEnd, TaskId};
use allot_core::pools::PoolName;
use allot_core::runs::Run;
use allot_core::Millis;
use async_trait::async_trait;

use crate::StoreError;

/// The outputs of a task that succeeded, kept for a task of the same type, cache version and
/// inputs to reuse instead of running [Flyte's catalog]. Keyed by
/// `allot_core::runs::cache_key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedOutputs {
    /// JSON text.
    pub outputs: String,
    /// The task whose run recorded them.
    pub app: AppId,
    pub task: TaskId,
    pub at: Millis,
}

/// Keeps `entry` under `key` unless outputs are kept there already (they stay): answers what is
/// kept now, and whether it is `entry` (a plugin's catalog, `allot_core::catalog`).
pub async fn keep_first(
    store: &(impl RunStore + ?Sized),
    key: &str,
    entry: CachedOutputs,
) -> Result<(CachedOutputs, bool), StoreError> {
    store.put_cached_outputs(key.to_owned(), entry.clone()).await?;
    let kept = store
        .cached_outputs(key)
        .await?
        .ok_or_else(|| StoreError::Unavailable(format!("catalog entry {key} was not found right after it was kept")))?;
    let created = kept == entry;
    Ok((kept, created))
}

/// A daemon's executor, the pools whose tasks it runs and the task types its plugins run, as
/// its lease says: `live` while it renews the lease. Whoever schedules places a task with a type
/// only where a live executor runs it (`Scheduler::set_runners`), and takes the pools of
/// executors that stopped as lost (`Scheduler::pool_lost`), unless a live executor runs them too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutorLease {
    /// The daemon, by the URL others reach it at.
    pub node: String,
    pub pools: Vec<PoolName>,
    /// `*` (`allot_core::apps::EVERY_TYPE`): every type (it has a default plugin).
    pub task_types: Vec<String>,
    pub live: bool,
}

/// Stores each run given with a task's end ([`RunStore::put_run`]), in order, and answers the
/// ends: what reporting ends with their runs does where the runs and the reports are not one
/// commit (the runs first: a crash between leaves ended runs, which their executor reports again).
pub async fn put_runs_of_ends<S: RunStore + ?Sized>(
    store: &S,
    ends: Vec<(TaskEnd, Option<Run>)>,
) -> Result<Vec<TaskEnd>, StoreError> {
    let mut reports = Vec::with_capacity(ends.len());
    for (end, run) in ends {
        if let Some(run) = run {
            store.put_run(end.app.clone(), end.task.clone(), run).await?;
        }
        reports.push(end);
    }
    Ok(reports)
}

/// What the scheduler makes of every lease.
pub fn runners_of(leases: &[ExecutorLease]) -> allot_core::apps::Runners {
    let runners: Vec<allot_core::apps::Runner> = leases
        .iter()
        .map(|l| allot_core::apps::Runner { pools: l.pools.clone(), task_types: l.task_types.clone(), live: l.live })
        .collect();
    allot_core::apps::Runners::from_leases(&runners)
}

/// A change of the kept runs, in the order it was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunChange {
    Put {
        app: AppId,
        task: TaskId,
        run: Box<Run>,
    },
    Removed {
        app: AppId,
        task: TaskId,
    },
    Cached {
        key: String,
        entry: CachedOutputs,
    },
    /// Outputs forgotten after their retention.
    Uncached {
        keys: Vec<String>,
    },
}

/// The runs of a backend. A write is durable when it answers.
#[async_trait]
pub trait RunStore {
    /// Keeps a task's run, replacing what was kept.
    async fn put_run(&self, app: AppId, task: TaskId, run: Run) -> Result<(), StoreError>;
    async fn run(&self, app: AppId, task: TaskId) -> Result<Option<Run>, StoreError>;
    /// Every run kept, ordered by application and task: what an executor resumes when it starts.
    async fn runs(&self) -> Result<Vec<(AppId, TaskId, Run)>, StoreError>;
    /// Forgets a task's run (idempotent).
    async fn remove_run(&self, app: AppId, task: TaskId) -> Result<(), StoreError>;
    /// The outputs kept under a cache key, if any.
    async fn cached_outputs(&self, key: &str) -> Result<Option<CachedOutputs>, StoreError>;
    /// Keeps outputs under a cache key; the first kept stays (a later put is a no-op).
    async fn put_cached_outputs(&self, key: String, entry: CachedOutputs) -> Result<(), StoreError>;
    /// Forgets at most `limit` of the outputs kept before `kept_before` (their `at`; their
    /// retention is over), the oldest first; answers how many it forgot.
    async fn forget_cached_outputs(&self, kept_before: Millis, limit: usize) -> Result<usize, StoreError>;
    /// Renews (or takes) the lease of `node`'s executor, running `pools` with plugins of
    /// `task_types`, for `ttl`.
    async fn renew_executor(
        &self,
        node: &str,
        pools: &[PoolName],
        task_types: &[String],
        ttl: Duration,
    ) -> Result<(), StoreError>;
    /// Every executor that ever took a lease, live or not, by node.
    async fn executors(&self) -> Result<Vec<ExecutorLease>, StoreError>;
}
