//! The applications part on Redis: not carried yet. Every call answers
//! [`StoreError::Unsupported`] (HTTP 501), so a daemon on Redis serves quotas and pools and says
//! plainly that applications need the embedded store for now.

use allot_core::queue::{QueueLimits, QueuePath};
use allot_core::sched::{AppId, AppSpec, QueueView, SchedStats, TaskId, TaskSpec};
use allot_store::{AppInfo, AppStore, Page, PageRequest, StoreError, TaskInfo};
use async_trait::async_trait;

use crate::RedisStore;

fn unsupported<T>() -> Result<T, StoreError> {
    Err(StoreError::Unsupported(
        "applications, queues and tasks are not carried by the Redis store yet; run the daemon on its embedded store \
         for them"
            .to_owned(),
    ))
}

#[async_trait]
impl AppStore for RedisStore {
    async fn put_queue(&self, _: QueuePath, _: QueueLimits) -> Result<(bool, QueueView), StoreError> {
        unsupported()
    }

    async fn seed_queue(&self, _: QueuePath, _: QueueLimits) -> Result<(bool, QueueView), StoreError> {
        unsupported()
    }

    async fn remove_queue(&self, _: QueuePath) -> Result<(), StoreError> {
        unsupported()
    }

    async fn queues(&self) -> Result<Vec<QueueView>, StoreError> {
        unsupported()
    }

    async fn queue(&self, _: QueuePath) -> Result<QueueView, StoreError> {
        unsupported()
    }

    async fn add_app(&self, _: AppSpec) -> Result<(AppInfo, bool), StoreError> {
        unsupported()
    }

    async fn app(&self, _: AppId) -> Result<AppInfo, StoreError> {
        unsupported()
    }

    async fn apps(&self, _: PageRequest<AppId>) -> Result<Page<AppInfo, AppId>, StoreError> {
        unsupported()
    }

    async fn remove_app(&self, _: AppId) -> Result<AppInfo, StoreError> {
        unsupported()
    }

    async fn complete_app(&self, _: AppId) -> Result<AppInfo, StoreError> {
        unsupported()
    }

    async fn fail_app(&self, _: AppId, _: String) -> Result<AppInfo, StoreError> {
        unsupported()
    }

    async fn add_task(&self, _: AppId, _: TaskSpec) -> Result<(TaskInfo, bool), StoreError> {
        unsupported()
    }

    async fn task(&self, _: AppId, _: TaskId) -> Result<TaskInfo, StoreError> {
        unsupported()
    }

    async fn tasks(&self, _: AppId, _: PageRequest<TaskId>) -> Result<Page<TaskInfo, TaskId>, StoreError> {
        unsupported()
    }

    async fn start_task(&self, _: AppId, _: TaskId) -> Result<TaskInfo, StoreError> {
        unsupported()
    }

    async fn finish_task(&self, _: AppId, _: TaskId, _: Option<String>) -> Result<TaskInfo, StoreError> {
        unsupported()
    }

    async fn remove_task(&self, _: AppId, _: TaskId) -> Result<TaskInfo, StoreError> {
        unsupported()
    }

    fn sched_stats(&self) -> SchedStats {
        SchedStats::default()
    }
}
