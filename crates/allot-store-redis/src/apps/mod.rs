//! The applications part on Redis: [`AppStore`], every call served by the scheduler of the
//! daemon that holds the lease; on another daemon the HTTP edge forwards it there
//! ([`AppStore::apps_home`]), and a call that reaches a daemon that does not schedule answers
//! `Unavailable` (retry).
//!
//! - `lease`: the scheduler's lease, which elects the one daemon that schedules (public: tests
//!   and tools take it by hand);
//! - `records`: the records of queues, applications and tasks, written only in the lease's
//!   current term (public, likewise);
//! - `leader`: who schedules, as this daemon sees it, and the scheduler's state while it does;
//! - `steps`: the allocs and grants an outcome makes and ends, as data;
//! - `scheduler`: the election and the rounds, and how an outcome is carried out across slots.

pub(crate) mod leader;
pub mod lease;
pub mod records;
mod scheduler;
mod steps;

use allot_core::apps::queues::QueueUsage;
use allot_core::apps::queues::{QueueLimits, QueuePath, Queues};
use allot_core::apps::{
    AppId, AppOrder, AppPlace, AppSpec, QueueView, SchedError, SchedStats, Scheduler, Task, TaskEnd, TaskId, TaskSpec,
    World,
};
use allot_core::NamespaceName;
use allot_store::{AppInfo, AppStore, AppsHome, Page, PageRequest, StoreError, Submitted, TaskInfo};
use async_trait::async_trait;

use crate::apps::scheduler::Fresh;
use crate::store::RedisStore;

#[async_trait]
impl AppStore for RedisStore {
    async fn put_queue(&self, path: QueuePath, limits: QueueLimits) -> Result<(bool, QueueView), StoreError> {
        self.commit_sched(Fresh::No, |sched, _, _| {
            let (created, outcome) = sched.put_queue(path.clone(), limits)?;
            Ok(((created, sched.queue(&path)?), outcome))
        })
        .await
    }

    /// Registered by this daemon when it schedules (now, if it does), unless it exists by then.
    async fn seed_queue(&self, path: QueuePath, limits: QueueLimits) -> Result<(bool, QueueView), StoreError> {
        let seeded = self
            .commit_sched(Fresh::No, |sched, _, _| {
                if let Ok(view) = sched.queue(&path) {
                    return Ok(((false, view), Default::default()));
                }
                let (created, outcome) = sched.put_queue(path.clone(), limits.clone())?;
                Ok(((created, sched.queue(&path)?), outcome))
            })
            .await;
        match seeded {
            Err(StoreError::Unavailable(_)) => {
                self.seed_queue_later(path.clone(), limits.clone()).await;
                let view = QueueView {
                    path,
                    limits,
                    usage: QueueUsage::default(),
                    leaf: true,
                    apps: 0,
                    pending_tasks: 0,
                    waiting: Default::default(),
                };
                Ok((false, view))
            }
            other => other,
        }
    }

    async fn remove_queue(&self, path: QueuePath) -> Result<(), StoreError> {
        self.commit_sched(Fresh::No, |sched, _, _| Ok(((), sched.remove_queue(&path)?))).await
    }

    async fn queues(&self) -> Result<Vec<QueueView>, StoreError> {
        self.read_sched(|sched| Ok(sched.queues())).await
    }

    async fn queue(&self, path: QueuePath) -> Result<QueueView, StoreError> {
        self.read_sched(|sched| sched.queue(&path)).await
    }

    async fn queue_tree(&self) -> Result<Queues, StoreError> {
        self.read_sched(|sched| Ok(sched.queue_tree())).await
    }

    async fn add_app(&self, spec: AppSpec) -> Result<(AppInfo, bool), StoreError> {
        let named: Vec<NamespaceName> =
            spec.groups.iter().flat_map(|g| g.tokens.iter().map(|n| n.namespace.clone())).collect();
        self.commit_sched(Fresh::All(&named, &[]), |sched, world, now| {
            let (app, created, outcome) = sched.add_app(spec, now, &world)?;
            Ok(((AppInfo::of(sched, &app.spec.id)?, created), outcome))
        })
        .await
    }

    async fn submit_app(&self, spec: AppSpec, tasks: Vec<TaskSpec>) -> Result<Submitted, StoreError> {
        let groups = spec.groups.iter().flat_map(|g| g.tokens.iter());
        let named: Vec<NamespaceName> =
            groups.chain(tasks.iter().flat_map(|t| t.tokens.iter())).map(|n| n.namespace.clone()).collect();
        let types: Vec<String> = tasks.iter().filter_map(TaskSpec::task_type).collect();
        self.commit_sched(Fresh::All(&named, &types), |sched, world, now| {
            let (app, created, tasks, outcome) = sched.submit(spec, tasks, now, &world)?;
            let tasks = TaskInfo::of_added(sched, &app.spec.id, tasks);
            Ok(((AppInfo::of(sched, &app.spec.id)?, created, tasks), outcome))
        })
        .await
    }

    async fn app(&self, id: AppId) -> Result<AppInfo, StoreError> {
        self.read_sched(|sched| AppInfo::of(sched, &id)).await
    }

    async fn apps(&self, page: PageRequest<AppId>) -> Result<Page<AppInfo, AppId>, StoreError> {
        self.read_sched(|sched| {
            let apps = sched.apps_after(page.after(), page.limit() + 1);
            let infos = apps.into_iter().map(|app| AppInfo::of(sched, &app.spec.id)).collect::<Result<Vec<_>, _>>()?;
            Ok(Page::from_read(infos, page.limit(), |info| info.app.spec.id.clone()))
        })
        .await
    }

    async fn apps_in_order(
        &self,
        order: AppOrder,
        page: PageRequest<AppPlace>,
    ) -> Result<Page<AppInfo, AppPlace>, StoreError> {
        self.read_sched(|sched| AppInfo::page_in_order(sched, order, &page)).await
    }

    async fn remove_app(&self, id: AppId) -> Result<AppInfo, StoreError> {
        self.commit_sched(Fresh::No, |sched, mut world, now| {
            let (removed, outcome) = sched.remove_app(&id, now, &mut world)?;
            Ok((AppInfo::removed(removed), outcome))
        })
        .await
    }

    async fn complete_app(&self, id: AppId) -> Result<AppInfo, StoreError> {
        self.commit_sched(Fresh::No, |sched, mut world, now| {
            let (_, outcome) = sched.complete_app(&id, now, &mut world)?;
            Ok((AppInfo::of(sched, &id)?, outcome))
        })
        .await
    }

    async fn fail_app(&self, id: AppId, reason: String) -> Result<AppInfo, StoreError> {
        self.commit_sched(Fresh::No, |sched, mut world, now| {
            let (_, outcome) = sched.fail_app(&id, &reason, now, &mut world)?;
            Ok((AppInfo::of(sched, &id)?, outcome))
        })
        .await
    }

    async fn add_task(&self, app: AppId, spec: TaskSpec) -> Result<(TaskInfo, bool), StoreError> {
        let named: Vec<NamespaceName> = spec.tokens.iter().map(|n| n.namespace.clone()).collect();
        let add = |spec: TaskSpec| {
            let app = app.clone();
            move |sched: &mut Scheduler, world: World<'_>, now| {
                let (task, created, outcome) = sched.add_task(&app, spec, now, &world)?;
                Ok(((TaskInfo::of(sched, &app, &task.spec.id)?, created), outcome))
            }
        };
        // Against the pools as the scheduler last read them (reading them all at every add
        // costs a round trip per pool); what seems never to fit is asked again on the pools, the
        // quotas and the executors' leases as they are now before it is refused.
        match self.commit_sched(Fresh::Namespaces(&named), add(spec.clone())).await {
            Err(StoreError::Apps(SchedError::NeverFits { .. })) => {
                let types: Vec<String> = spec.task_type().into_iter().collect();
                self.commit_sched(Fresh::All(&named, &types), add(spec)).await
            }
            answer => answer,
        }
    }

    async fn task(&self, app: AppId, task: TaskId) -> Result<TaskInfo, StoreError> {
        self.read_sched(|sched| TaskInfo::of(sched, &app, &task)).await
    }

    async fn stored_task(&self, app: AppId, task: TaskId) -> Result<Option<Task>, StoreError> {
        if self.inner.apps.home() == AppsHome::Here {
            // `Scheduler::task` fails only when the task or its application is gone.
            let found = self.read_sched(|sched| Ok(sched.task(&app, &task).ok().cloned()));
            // Deposed meanwhile: the record is read as on any other daemon.
            if let Ok(found) = found.await {
                return Ok(found);
            }
        }
        self.task_record(&app, &task).await
    }

    async fn placed_on(
        &self,
        pools: &std::collections::HashSet<allot_core::pools::PoolName>,
    ) -> Result<Vec<(AppId, TaskId)>, StoreError> {
        self.read_sched(|sched| Ok(sched.placed_on(pools))).await
    }

    async fn tasks(&self, app: AppId, page: PageRequest<TaskId>) -> Result<Page<TaskInfo, TaskId>, StoreError> {
        self.read_sched(|sched| {
            let tasks = sched.tasks_after(&app, page.after(), page.limit() + 1)?;
            let infos =
                tasks.into_iter().map(|t| TaskInfo::of(sched, &app, &t.spec.id)).collect::<Result<Vec<_>, _>>()?;
            Ok(Page::from_read(infos, page.limit(), |info| info.task.spec.id.clone()))
        })
        .await
    }

    async fn start_task(&self, app: AppId, task: TaskId) -> Result<TaskInfo, StoreError> {
        self.commit_sched(Fresh::No, |sched, _, _| {
            let (record, outcome) = sched.start_task(&app, &task)?;
            Ok((TaskInfo { task: record, why: None }, outcome))
        })
        .await
    }

    async fn finish_tasks(&self, ends: Vec<TaskEnd>) -> Result<Vec<Result<TaskInfo, SchedError>>, StoreError> {
        self.commit_sched(Fresh::No, |sched, mut world, now| {
            let (answers, outcome) = sched.finish_tasks(ends, now, &mut world);
            let answers = answers.into_iter().map(|a| a.map(|task| TaskInfo { task, why: None })).collect();
            Ok((answers, outcome))
        })
        .await
    }

    async fn remove_task(&self, app: AppId, task: TaskId) -> Result<TaskInfo, StoreError> {
        self.commit_sched(Fresh::No, |sched, mut world, now| {
            let (record, outcome) = sched.remove_task(&app, &task, now, &mut world)?;
            Ok((TaskInfo { task: record, why: None }, outcome))
        })
        .await
    }

    fn sched_stats(&self) -> SchedStats {
        self.inner.apps.stats()
    }

    fn set_tenancy(&self, tenancy: allot_core::access::Tenancy) {
        // Kept with the settings: a scheduler loaded when this daemon takes the lease has it,
        // and the one in office takes it at its next cycle.
        self.inner.apps.config.lock().unwrap_or_else(|p| p.into_inner()).tenancy = tenancy;
        self.inner.apps.wake.notify_one();
    }

    fn apps_home(&self) -> AppsHome {
        self.inner.apps.home()
    }
}
