//! The applications of the embedded store: every operation is the scheduler's, under the same
//! lock as the ledger and the pools, and its changes (of all three) go into one group commit.
//! A scheduler task runs the cycles: when woken by a change, when a timer is due, and every
//! [`RETRY_INTERVAL`] while something waits (room and tokens are freed by others too).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::read::Records;
use allot_core::apps::queues::{QueueLimits, QueuePath, Queues};
use allot_core::apps::{
    AppChange, AppId, AppOrder, AppPlace, AppSpec, QueueView, SchedConfig, SchedError, SchedStats, Scheduler, Task,
    TaskEnd, TaskId, TaskSpec, World,
};
use async_trait::async_trait;

use super::ops::{Op, Table};
use super::{durable, lock, Commit, EmbeddedStore, OpenError, Shared};
use crate::apps::{AppInfo, AppStore, Submitted, TaskInfo};
use crate::records::apps::{decode_task, AppRecord, QueueRecord, TaskRecord, APPS, QUEUES, QUEUE_FIELDS_ADDED, TASKS};
use crate::records::{decode_grown, encode};
use crate::{Page, PageRequest, StoreError};

/// How often the scheduler tries again while something waits for room or tokens.
pub(super) const RETRY_INTERVAL: Duration = Duration::from_millis(100);
/// How long the scheduler sleeps when nothing waits and no timer is due.
const IDLE_INTERVAL: Duration = Duration::from_secs(1);

/// Runs scheduling cycles until the store shuts down. Each cycle's changes are durable before
/// the next cycle starts.
pub(super) async fn run_scheduler(shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        let Some((wait, committed)) = cycle(&shared) else { return };
        if let Some(committed) = committed {
            if let Err(err) = durable(committed).await {
                tracing::warn!(error = %err, "a scheduling cycle could not be made durable");
            }
        }
        tokio::select! {
            _ = shared.wake_scheduler.notified() => {}
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
    }
}

/// One scheduling cycle at the daemon clock's now. Answers how long until the next one is due
/// and its commit, or `None` once the store is closed.
pub(super) fn cycle(shared: &Shared) -> Option<(Duration, Option<Commit>)> {
    let mut state = lock(shared);
    if state.closed {
        return None;
    }
    if state.broken.is_some() || state.failed.is_some() {
        return Some((RETRY_INTERVAL, None));
    }
    let now = shared.clock.now();
    let state = &mut *state;
    let mut world = World { pools: &mut state.pools, ledger: &mut state.ledger };
    let (report, outcome) = state.sched.schedule(now, &mut world, &mut || shared.ids.next_u64());
    if report.placed + report.reserved + report.taken_over + report.timed_out > 0 {
        tracing::debug!(?report, "scheduling cycle");
    }
    let waiting = state.sched.has_waiting();
    shared.sched_waiting.store(waiting, Ordering::Relaxed);
    if state.check_outcome(&outcome).is_err() {
        return Some((RETRY_INTERVAL, None));
    }
    let committed = (!outcome.is_empty()).then(|| state.submit_outcome(shared, outcome, now));
    let mut wait = if waiting { RETRY_INTERVAL } else { IDLE_INTERVAL };
    if let Some(deadline) = state.sched.next_deadline() {
        wait = wait.min(Duration::from_millis(deadline.saturating_sub(now)));
    }
    Some((wait, committed))
}

/// Reads the applications part of the file into a scheduler.
pub(super) fn load(records: &Records<'_, '_>) -> Result<Scheduler, OpenError> {
    let mut queues = Vec::new();
    records.names(QUEUES, Table::Queues, |key, value| {
        let record: QueueRecord = decode_grown("queues", key, value, QUEUE_FIELDS_ADDED)?;
        queues.push(record.into_queue(key)?);
        Ok(())
    })?;
    let mut apps = Vec::new();
    records.names(APPS, Table::Apps, |key, value| {
        let record = crate::records::apps::decode_app(key, value)?;
        apps.push(record.into_app(key)?);
        Ok(())
    })?;
    // The tasks are read and decoded on a thread of their own while the scheduler takes them in
    // (a million of them are never gathered first); the first that cannot be read fails the open.
    std::thread::scope(|scope| {
        let (batches, read) = std::sync::mpsc::sync_channel(4);
        scope.spawn(move || {
            if let Err(err) = read_tasks(records, |batch| batches.send(Ok(batch)).is_ok()) {
                let _ = batches.send(Err(err));
            }
        });
        let mut unread = None;
        let tasks = read.into_iter().map_while(|batch| batch.map_err(|err| unread = Some(err)).ok()).flatten();
        let scheduler = Scheduler::restore(SchedConfig::default(), queues, apps, tasks);
        match unread {
            Some(err) => Err(err),
            None => Ok(scheduler),
        }
    })
}

/// Reads the tasks in key order (each application's together), in batches handed to `take`
/// until it answers false.
fn read_tasks(records: &Records<'_, '_>, mut take: impl FnMut(Vec<Task>) -> bool) -> Result<(), OpenError> {
    const BATCH: usize = 4096;
    let mut batch = Vec::with_capacity(BATCH);
    let mut stopped = false;
    records.pairs(TASKS, Table::Tasks, |app, task, value| {
        if stopped {
            return Ok(());
        }
        batch.push(decode_task(&format!("{app}/{task}"), value)?.into_task(app, task)?);
        if batch.len() == BATCH && !take(std::mem::replace(&mut batch, Vec::with_capacity(BATCH))) {
            stopped = true;
        }
        Ok(())
    })?;
    if !batch.is_empty() && !stopped {
        take(batch);
    }
    Ok(())
}

/// The writes of application changes.
pub(super) fn ops<'a>(changes: impl Iterator<Item = &'a AppChange>, out: &mut Vec<Op>) {
    for change in changes {
        match change {
            AppChange::Queue { path, limits } => {
                out.push(Op::put(Table::Queues, Op::name(path.as_str()), encode(&QueueRecord::of(limits))));
            }
            AppChange::QueueRemoved { path } => out.push(Op::Remove(Table::Queues, Op::name(path.as_str()))),
            AppChange::App(app) => {
                out.push(Op::put(Table::Apps, Op::name(app.spec.id.as_str()), encode(&AppRecord::of(app))));
            }
            AppChange::AppRemoved { id } => {
                out.push(Op::Remove(Table::Apps, Op::name(id.as_str())));
                out.push(Op::RemoveUnder(Table::Tasks, id.as_str().to_owned()));
            }
            AppChange::Task(task) => {
                let key = Op::pair(task.app.as_str(), task.spec.id.as_str());
                out.push(Op::put(Table::Tasks, key, encode(&TaskRecord::of(task))));
            }
            AppChange::TaskRemoved { app, task } => {
                out.push(Op::Remove(Table::Tasks, Op::pair(app.as_str(), task.as_str())));
            }
        }
    }
}

impl EmbeddedStore {
    /// Changes the scheduler's settings (the completing grace, best-fit weights).
    pub fn set_sched_config(&self, config: SchedConfig) {
        self.lock().sched.set_config(config);
    }

    fn read_sched<T>(&self, query: impl FnOnce(&Scheduler) -> Result<T, SchedError>) -> Result<T, StoreError> {
        self.read_state(|state, _| Ok(query(&state.sched)?))
    }
}

#[async_trait]
impl AppStore for EmbeddedStore {
    async fn put_queue(&self, path: QueuePath, limits: QueueLimits) -> Result<(bool, QueueView), StoreError> {
        self.commit_sched(|sched, _, _| {
            let (created, outcome) = sched.put_queue(path.clone(), limits)?;
            Ok(((created, sched.queue(&path)?), outcome))
        })
        .await
    }

    async fn seed_queue(&self, path: QueuePath, limits: QueueLimits) -> Result<(bool, QueueView), StoreError> {
        self.commit_sched(|sched, _, _| {
            if let Ok(view) = sched.queue(&path) {
                return Ok(((false, view), Default::default()));
            }
            let (created, outcome) = sched.put_queue(path.clone(), limits)?;
            Ok(((created, sched.queue(&path)?), outcome))
        })
        .await
    }

    async fn remove_queue(&self, path: QueuePath) -> Result<(), StoreError> {
        self.commit_sched(|sched, _, _| Ok(((), sched.remove_queue(&path)?))).await
    }

    async fn queues(&self) -> Result<Vec<QueueView>, StoreError> {
        self.read_sched(|sched| Ok(sched.queues()))
    }

    async fn queue(&self, path: QueuePath) -> Result<QueueView, StoreError> {
        self.read_sched(|sched| sched.queue(&path))
    }

    async fn queue_tree(&self) -> Result<Queues, StoreError> {
        self.read_sched(|sched| Ok(sched.queue_tree()))
    }

    async fn add_app(&self, spec: AppSpec) -> Result<(AppInfo, bool), StoreError> {
        self.commit_sched(|sched, world, now| {
            let (app, created, outcome) = sched.add_app(spec, now, &world)?;
            Ok(((AppInfo::of(sched, &app.spec.id)?, created), outcome))
        })
        .await
    }

    async fn submit_app(&self, spec: AppSpec, tasks: Vec<TaskSpec>) -> Result<Submitted, StoreError> {
        self.commit_sched(|sched, world, now| {
            let (app, created, tasks, outcome) = sched.submit(spec, tasks, now, &world)?;
            let tasks = TaskInfo::of_added(sched, &app.spec.id, tasks);
            Ok(((AppInfo::of(sched, &app.spec.id)?, created, tasks), outcome))
        })
        .await
    }

    async fn app(&self, id: AppId) -> Result<AppInfo, StoreError> {
        self.read_sched(|sched| AppInfo::of(sched, &id))
    }

    async fn apps(&self, page: PageRequest<AppId>) -> Result<Page<AppInfo, AppId>, StoreError> {
        self.read_sched(|sched| {
            let apps = sched.apps_after(page.after(), page.limit() + 1);
            let infos = apps.into_iter().map(|app| AppInfo::of(sched, &app.spec.id)).collect::<Result<Vec<_>, _>>()?;
            Ok(Page::from_read(infos, page.limit(), |info| info.app.spec.id.clone()))
        })
    }

    async fn apps_in_order(
        &self,
        order: AppOrder,
        page: PageRequest<AppPlace>,
    ) -> Result<Page<AppInfo, AppPlace>, StoreError> {
        self.read_sched(|sched| AppInfo::page_in_order(sched, order, &page))
    }

    async fn remove_app(&self, id: AppId) -> Result<AppInfo, StoreError> {
        self.commit_sched(|sched, mut world, now| {
            let (removed, outcome) = sched.remove_app(&id, now, &mut world)?;
            Ok((AppInfo::removed(removed), outcome))
        })
        .await
    }

    async fn complete_app(&self, id: AppId) -> Result<AppInfo, StoreError> {
        self.commit_sched(|sched, mut world, now| {
            let (_, outcome) = sched.complete_app(&id, now, &mut world)?;
            Ok((AppInfo::of(sched, &id)?, outcome))
        })
        .await
    }

    async fn fail_app(&self, id: AppId, reason: String) -> Result<AppInfo, StoreError> {
        self.commit_sched(|sched, mut world, now| {
            let (_, outcome) = sched.fail_app(&id, &reason, now, &mut world)?;
            Ok((AppInfo::of(sched, &id)?, outcome))
        })
        .await
    }

    async fn add_task(&self, app: AppId, spec: TaskSpec) -> Result<(TaskInfo, bool), StoreError> {
        self.commit_sched(|sched, world, now| {
            let (task, created, outcome) = sched.add_task(&app, spec, now, &world)?;
            Ok(((TaskInfo::of(sched, &app, &task.spec.id)?, created), outcome))
        })
        .await
    }

    async fn task(&self, app: AppId, task: TaskId) -> Result<TaskInfo, StoreError> {
        self.read_sched(|sched| TaskInfo::of(sched, &app, &task))
    }

    /// The task alone: what an executor reads of every task it runs, without why it waits (which
    /// [`AppStore::task`] works out, and a placed task does not).
    async fn stored_task(&self, app: AppId, task: TaskId) -> Result<Option<Task>, StoreError> {
        crate::apps::unless_gone(self.read_sched(|sched| Ok(sched.task(&app, &task)?.clone())))
    }

    async fn placed_on(
        &self,
        pools: &std::collections::HashSet<allot_core::pools::PoolName>,
    ) -> Result<Vec<(AppId, TaskId)>, StoreError> {
        self.read_sched(|sched| Ok(sched.placed_on(pools)))
    }

    async fn tasks(&self, app: AppId, page: PageRequest<TaskId>) -> Result<Page<TaskInfo, TaskId>, StoreError> {
        self.read_sched(|sched| {
            let tasks = sched.tasks_after(&app, page.after(), page.limit() + 1)?;
            let infos =
                tasks.into_iter().map(|t| TaskInfo::of(sched, &app, &t.spec.id)).collect::<Result<Vec<_>, _>>()?;
            Ok(Page::from_read(infos, page.limit(), |info| info.task.spec.id.clone()))
        })
    }

    async fn start_task(&self, app: AppId, task: TaskId) -> Result<TaskInfo, StoreError> {
        self.commit_sched(|sched, _, _| {
            let (record, outcome) = sched.start_task(&app, &task)?;
            Ok((TaskInfo { task: record, why: None }, outcome))
        })
        .await
    }

    async fn finish_tasks(&self, ends: Vec<TaskEnd>) -> Result<Vec<Result<TaskInfo, SchedError>>, StoreError> {
        crate::Store::finish_runs(self, ends.into_iter().map(|end| (end, None)).collect()).await
    }

    async fn remove_task(&self, app: AppId, task: TaskId) -> Result<TaskInfo, StoreError> {
        self.commit_sched(|sched, mut world, now| {
            let (record, outcome) = sched.remove_task(&app, &task, now, &mut world)?;
            Ok((TaskInfo { task: record, why: None }, outcome))
        })
        .await
    }

    fn set_tenancy(&self, tenancy: allot_core::access::Tenancy) {
        self.lock().sched.set_tenancy(tenancy);
        self.shared.wake_scheduler.notify_one();
    }

    fn sched_stats(&self) -> SchedStats {
        self.lock().sched.stats()
    }
}
