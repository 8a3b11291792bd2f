//! The applications part of a backend: queues, applications and tasks (YuniKorn's
//! application-management protocol), placed on the pools and the token quotas by the scheduler
//! of `allot_core::apps`.

use std::collections::BTreeMap;

use allot_core::apps::queues::{QueueLimits, QueuePath, Queues};
use allot_core::apps::states::TaskState;
use allot_core::apps::{
    App, AppId, AppOrder, AppPlace, AppSpec, QueueView, Released, Removed, SchedError, SchedStats, Scheduler, Task,
    TaskEnd, TaskEnding, TaskId, TaskSpec, Why,
};
use async_trait::async_trait;

use crate::{Page, PageRequest, StoreError};

/// An application as the store answers it: its record, its tasks by state, and why it waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppInfo {
    pub app: App,
    pub tasks: BTreeMap<TaskState, u64>,
    pub why: Option<Why>,
    /// Set in the answer to its removal: what the removal ended.
    pub released: Option<Released>,
}

impl AppInfo {
    /// A page of the applications in `order`, as `AppStore::apps_in_order` answers it (every
    /// backend reads it from its scheduler's state).
    pub fn page_in_order(
        sched: &Scheduler,
        order: AppOrder,
        page: &PageRequest<AppPlace>,
    ) -> Result<Page<AppInfo, AppPlace>, SchedError> {
        let apps = sched.apps_in_order(order, page.after(), page.limit() + 1)?;
        let infos = apps.into_iter().map(|app| AppInfo::of(sched, &app.spec.id)).collect::<Result<Vec<_>, _>>()?;
        Ok(Page::from_read(infos, page.limit(), |info| info.app.place(order)))
    }

    /// Application `id` as the scheduler holds it now.
    pub fn of(sched: &Scheduler, id: &AppId) -> Result<AppInfo, SchedError> {
        Ok(AppInfo {
            app: sched.app(id)?.clone(),
            tasks: sched.task_counts(id),
            why: sched.app_why(id),
            released: None,
        })
    }

    /// The answer to a removal: what the application became, and what was released.
    pub fn removed(removed: Removed) -> AppInfo {
        AppInfo { app: removed.app, tasks: removed.tasks, why: None, released: Some(removed.released) }
    }
}

/// A task as the store answers it, and why it waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskInfo {
    pub task: Task,
    pub why: Option<Why>,
}

impl TaskInfo {
    /// Task `task` of `app` as the scheduler holds it now.
    pub fn of(sched: &Scheduler, app: &AppId, task: &TaskId) -> Result<TaskInfo, SchedError> {
        Ok(TaskInfo { task: sched.task(app, task)?.clone(), why: sched.task_why(app, task) })
    }

    /// The tasks `Scheduler::submit` answered for `app` (with whether each is new), as answered:
    /// each as the scheduler holds it, under the same lock hold (not read and copied again).
    pub fn of_added(sched: &Scheduler, app: &AppId, added: Vec<(Task, bool)>) -> Vec<(TaskInfo, bool)> {
        let why = |task: &Task| sched.task_why(app, &task.spec.id);
        added.into_iter().map(|(task, created)| (TaskInfo { why: why(&task), task }, created)).collect()
    }
}

/// What a submission answers: the application, whether it is new, and its tasks, each with
/// whether it is new.
pub type Submitted = (AppInfo, bool, Vec<(TaskInfo, bool)>);

/// The applications of a backend. Every change is made durable with the pool and quota changes
/// it brings (the allocs and grants of placements) in one commit.
#[async_trait]
pub trait AppStore: Send + Sync {
    /// Creates or changes a queue (its parents are made); true if created.
    async fn put_queue(&self, path: QueuePath, limits: QueueLimits) -> Result<(bool, QueueView), StoreError>;
    /// Creates a queue only if it does not exist (the configuration seeds queues; the store is
    /// authoritative); true if created.
    async fn seed_queue(&self, path: QueuePath, limits: QueueLimits) -> Result<(bool, QueueView), StoreError>;
    /// Removes a leaf queue that has no live application.
    async fn remove_queue(&self, path: QueuePath) -> Result<(), StoreError>;
    /// Every queue, in path order (a tree of queues is small: it is not paged).
    async fn queues(&self) -> Result<Vec<QueueView>, StoreError>;
    /// The queue tree alone (paths, limits): what ACL and placement checks read, without each
    /// queue's usage.
    async fn queue_tree(&self) -> Result<Queues, StoreError>;
    async fn queue(&self, path: QueuePath) -> Result<QueueView, StoreError>;

    /// Adds an application; true if it is new (the same content again answers it).
    async fn add_app(&self, spec: AppSpec) -> Result<(AppInfo, bool), StoreError>;
    /// Submits an application with its tasks in one commit, all or nothing
    /// (`Scheduler::submit`): a refusal leaves nothing behind. Answers the application, whether
    /// it is new, and each task with whether it is new.
    async fn submit_app(&self, spec: AppSpec, tasks: Vec<TaskSpec>) -> Result<Submitted, StoreError>;
    async fn app(&self, id: AppId) -> Result<AppInfo, StoreError>;
    /// A page of the applications, ordered by id.
    async fn apps(&self, page: PageRequest<AppId>) -> Result<Page<AppInfo, AppId>, StoreError>;
    /// A page of the applications in `order` (`Scheduler::apps_in_order`).
    async fn apps_in_order(
        &self,
        order: AppOrder,
        page: PageRequest<AppPlace>,
    ) -> Result<Page<AppInfo, AppPlace>, StoreError>;
    /// Removes an application and everything it holds; answers what it became (its end state)
    /// and what was released.
    async fn remove_app(&self, id: AppId) -> Result<AppInfo, StoreError>;
    async fn complete_app(&self, id: AppId) -> Result<AppInfo, StoreError>;
    async fn fail_app(&self, id: AppId, reason: String) -> Result<AppInfo, StoreError>;

    /// Adds a task to an application; true if it is new.
    async fn add_task(&self, app: AppId, spec: TaskSpec) -> Result<(TaskInfo, bool), StoreError>;
    async fn task(&self, app: AppId, task: TaskId) -> Result<TaskInfo, StoreError>;
    /// The task as last committed, read on this daemon whoever schedules (`None`: it, or its
    /// application, is gone): what an executor reads of the tasks it runs. On a Redis store a
    /// daemon that does not schedule reads the task's record, instead of asking the one that does.
    async fn stored_task(&self, app: AppId, task: TaskId) -> Result<Option<Task>, StoreError> {
        unless_gone(self.task(app, task).await.map(|info| info.task))
    }
    /// The tasks placed (Allocated or Running) on one of `pools`: what their executors run.
    async fn placed_on(
        &self,
        pools: &std::collections::HashSet<allot_core::pools::PoolName>,
    ) -> Result<Vec<(AppId, TaskId)>, StoreError>;
    /// A page of an application's tasks, ordered by id.
    async fn tasks(&self, app: AppId, page: PageRequest<TaskId>) -> Result<Page<TaskInfo, TaskId>, StoreError>;
    /// Reports an Allocated task running.
    async fn start_task(&self, app: AppId, task: TaskId) -> Result<TaskInfo, StoreError>;
    /// Reports a task completed (`failed` is `None`) or failed: what it holds is released.
    async fn finish_task(&self, app: AppId, task: TaskId, failed: Option<String>) -> Result<TaskInfo, StoreError> {
        let mut answers = self.finish_tasks(vec![TaskEnd { app, task, ending: TaskEnding::of(failed) }]).await?;
        Ok(answers.pop().expect("one answer per report")?)
    }
    /// Reports several tasks completed or failed in one commit (`Scheduler::finish_tasks`): one
    /// answer per report, in order; a refused report (its task gone, or ended) changes nothing.
    async fn finish_tasks(&self, ends: Vec<TaskEnd>) -> Result<Vec<Result<TaskInfo, SchedError>>, StoreError>;
    /// Removes a task; what it holds is released.
    async fn remove_task(&self, app: AppId, task: TaskId) -> Result<TaskInfo, StoreError>;

    /// The scheduler's counters (on this daemon).
    fn sched_stats(&self) -> SchedStats;

    /// What applications may be given from the next scheduling cycle on (the access policy in
    /// force: roles, and bindings as they change). On a store several daemons share, used while
    /// this daemon schedules.
    fn set_tenancy(&self, tenancy: allot_core::access::Tenancy);

    /// Which daemon serves the applications part: this one (the default), or, on a store that
    /// several daemons share, the one that holds the scheduler's lease.
    fn apps_home(&self) -> AppsHome {
        AppsHome::Here
    }
}

/// Where the calls of the applications part are served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppsHome {
    /// On this daemon.
    Here,
    /// On the daemon at this base URL (`http://HOST:PORT`), which schedules.
    At(String),
    /// No daemon schedules right now (one is taking over): retry shortly.
    Unknown,
}

/// A task read, or `None` where it (or its application) is not there; other errors as they are.
pub(crate) fn unless_gone(found: Result<Task, StoreError>) -> Result<Option<Task>, StoreError> {
    match found {
        Ok(task) => Ok(Some(task)),
        Err(StoreError::Apps(SchedError::TaskNotFound { .. } | SchedError::AppNotFound(_))) => Ok(None),
        Err(err) => Err(err),
    }
}
