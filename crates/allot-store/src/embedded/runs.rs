//! The runs of the embedded store, and the catalog of outputs kept for reuse: in memory, and
//! written through the same group commit as everything else.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::read::Records;
use allot_core::apps::{AppChange, AppId, TaskId};
use allot_core::pools::PoolName;
use allot_core::runs::Run;
use allot_core::Millis;
use async_trait::async_trait;

use super::ops::{Op, Table};
use super::{durable, EmbeddedStore, OpenError};
use crate::records::runs::{CachedRecord, RunRow, CATALOG, RUNS, RUN_FIELDS_ADDED};
use crate::records::{decode, encode};
use crate::runs::{CachedOutputs, ExecutorLease, RunChange, RunStore};
use crate::StoreError;

#[derive(Debug, Default)]
pub(super) struct Runs {
    /// By application, then task: an application's runs are found without a walk over all.
    runs: BTreeMap<AppId, BTreeMap<TaskId, Run>>,
    catalog: BTreeMap<String, CachedOutputs>,
    /// The catalog's keys by when their outputs were kept: the oldest go first.
    kept: BTreeSet<(Millis, String)>,
    /// Executors' leases, by node: in memory only (one daemon uses an embedded store, and its
    /// executor lives and dies with it), each live until a daemon clock time.
    executors: BTreeMap<String, (Vec<PoolName>, Vec<String>, Millis)>,
}

impl Runs {
    /// The executors' leases are not records: they go on from the state `before` a rebuild.
    pub(super) fn carry_executors_from(&mut self, before: &mut Runs) {
        self.executors = std::mem::take(&mut before.executors);
    }

    pub(super) fn leases(&self, now: Millis) -> Vec<ExecutorLease> {
        let lease =
            |(node, (pools, task_types, until)): (&String, &(Vec<PoolName>, Vec<String>, Millis))| ExecutorLease {
                node: node.clone(),
                pools: pools.clone(),
                task_types: task_types.clone(),
                live: *until > now,
            };
        self.executors.iter().map(lease).collect()
    }
}

pub(super) fn load(records: &Records<'_, '_>) -> Result<Runs, OpenError> {
    let mut runs = Runs::default();
    records.pairs(RUNS, Table::Runs, |app, task, value| {
        let name = format!("{app}/{task}");
        let record: RunRow = crate::records::decode_grown("runs", &name, value, RUN_FIELDS_ADDED)?;
        let corrupt = |reason: String| crate::records::CorruptRecord { table: "runs", key: name.clone(), reason };
        let app = AppId::new(app).map_err(|e| corrupt(e.to_string()))?;
        let task = TaskId::new(task).map_err(|e| corrupt(e.to_string()))?;
        runs.runs.entry(app).or_default().insert(task, record.into_run(&name)?);
        Ok(())
    })?;
    records.names(CATALOG, Table::Catalog, |key, value| {
        let record: CachedRecord = decode("catalog", key, value)?;
        let entry = record.into_entry(key)?;
        runs.kept.insert((entry.at, key.to_owned()));
        runs.catalog.insert(key.to_owned(), entry);
        Ok(())
    })?;
    Ok(runs)
}

/// Forgets the runs that ended of the tasks `changes` remove (an application removed, or dropped
/// after its retention, removes its tasks), with their writes: they go with their task. A run
/// that has not ended stays for its executor, which stops it (abort, finalize, its tokens
/// released) and then removes it.
pub(super) fn forget_ended(runs: &mut Runs, changes: &[AppChange], out: &mut Vec<Op>) {
    for change in changes {
        let (app, only) = match change {
            AppChange::AppRemoved { id } => (id, None),
            AppChange::TaskRemoved { app, task } => (app, Some(task)),
            _ => continue,
        };
        let Some(tasks) = runs.runs.get_mut(app) else { continue };
        let gone: Vec<TaskId> = tasks
            .iter()
            .filter(|(task, run)| only.is_none_or(|only| only == *task) && run.ended())
            .map(|(task, _)| task.clone())
            .collect();
        for task in gone {
            out.push(Op::Remove(Table::Runs, Op::pair(app.as_str(), task.as_str())));
            tasks.remove(&task);
        }
        if tasks.is_empty() {
            runs.runs.remove(app);
        }
    }
}

/// The writes of run changes.
pub(super) fn ops<'a>(changes: impl Iterator<Item = &'a RunChange>, out: &mut Vec<Op>) {
    for change in changes {
        match change {
            RunChange::Put { app, task, run } => {
                out.push(Op::put(Table::Runs, Op::pair(app.as_str(), task.as_str()), encode(&RunRow::of(run))));
            }
            RunChange::Removed { app, task } => {
                out.push(Op::Remove(Table::Runs, Op::pair(app.as_str(), task.as_str())));
            }
            RunChange::Cached { key, entry } => {
                out.push(Op::put(Table::Catalog, Op::name(key), encode(&CachedRecord::of(entry))));
            }
            RunChange::Uncached { keys } => {
                out.extend(keys.iter().map(|key| Op::Remove(Table::Catalog, Op::name(key))));
            }
        }
    }
}

impl EmbeddedStore {
    async fn change_runs(&self, change: RunChange) -> Result<(), StoreError> {
        let rx = {
            let mut state = self.lock();
            state.usable(&self.shared)?;
            if let RunChange::Cached { key, .. } = &change {
                // The first kept stays.
                if state.runs.catalog.contains_key(key) {
                    return Ok(());
                }
            }
            state.submit_runs(&self.shared, change)
        };
        durable(rx).await
    }
}

/// Makes `change` to the runs in memory (its writes and events are drafted from it first).
pub(super) fn apply(runs: &mut Runs, change: RunChange) {
    match change {
        RunChange::Put { app, task, run } => {
            runs.runs.entry(app).or_default().insert(task, *run);
        }
        RunChange::Removed { app, task } => {
            if let Some(tasks) = runs.runs.get_mut(&app) {
                tasks.remove(&task);
                if tasks.is_empty() {
                    runs.runs.remove(&app);
                }
            }
        }
        RunChange::Cached { key, entry } => {
            if !runs.catalog.contains_key(&key) {
                runs.kept.insert((entry.at, key.clone()));
                runs.catalog.insert(key, entry);
            }
        }
        RunChange::Uncached { keys } => {
            for key in keys {
                if let Some(entry) = runs.catalog.remove(&key) {
                    runs.kept.remove(&(entry.at, key));
                }
            }
        }
    }
}

#[async_trait]
impl RunStore for EmbeddedStore {
    async fn put_run(&self, app: AppId, task: TaskId, run: Run) -> Result<(), StoreError> {
        self.change_runs(RunChange::Put { app, task, run: Box::new(run) }).await
    }

    async fn run(&self, app: AppId, task: TaskId) -> Result<Option<Run>, StoreError> {
        self.read_state(|state, _| Ok(state.runs.runs.get(&app).and_then(|tasks| tasks.get(&task)).cloned()))
    }

    async fn runs(&self) -> Result<Vec<(AppId, TaskId, Run)>, StoreError> {
        self.read_state(|state, _| {
            Ok(state
                .runs
                .runs
                .iter()
                .flat_map(|(app, tasks)| tasks.iter().map(|(task, run)| (app.clone(), task.clone(), run.clone())))
                .collect())
        })
    }

    async fn remove_run(&self, app: AppId, task: TaskId) -> Result<(), StoreError> {
        self.change_runs(RunChange::Removed { app, task }).await
    }

    async fn cached_outputs(&self, key: &str) -> Result<Option<CachedOutputs>, StoreError> {
        self.read_state(|state, _| Ok(state.runs.catalog.get(key).cloned()))
    }

    async fn put_cached_outputs(&self, key: String, entry: CachedOutputs) -> Result<(), StoreError> {
        self.change_runs(RunChange::Cached { key, entry }).await
    }

    async fn forget_cached_outputs(&self, kept_before: Millis, limit: usize) -> Result<usize, StoreError> {
        let keys: Vec<String> = self.read_state(|state, _| {
            let due = state.runs.kept.range(..(kept_before, String::new()));
            Ok(due.take(limit).map(|(_, key)| key.clone()).collect())
        })?;
        if keys.is_empty() {
            return Ok(0);
        }
        let forgotten = keys.len();
        self.change_runs(RunChange::Uncached { keys }).await?;
        Ok(forgotten)
    }

    async fn renew_executor(
        &self,
        node: &str,
        pools: &[PoolName],
        task_types: &[String],
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let mut state = self.lock();
        state.usable(&self.shared)?;
        let now = self.shared.clock.now();
        let until = now.saturating_add(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
        state.runs.executors.insert(node.to_owned(), (pools.to_vec(), task_types.to_vec(), until));
        // The scheduler places what has a type where the live executors run it.
        let runners = crate::runs::runners_of(&state.runs.leases(now));
        if state.sched.set_runners(runners) {
            self.shared.wake_scheduler.notify_one();
        }
        Ok(())
    }

    async fn executors(&self) -> Result<Vec<ExecutorLease>, StoreError> {
        self.read_state(|state, now| Ok(state.runs.leases(now)))
    }
}
