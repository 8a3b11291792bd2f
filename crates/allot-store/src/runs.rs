//! The runs part of a backend: each placed task's run by its plugin (`allot_core::exec::Run`),
//! kept so that an executor that restarts resumes every task where it was.

use allot_core::exec::Run;
use allot_core::sched::{AppId, TaskId};
use async_trait::async_trait;

use crate::StoreError;

/// A change of the kept runs, in the order it was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunChange {
    Put { app: AppId, task: TaskId, run: Box<Run> },
    Removed { app: AppId, task: TaskId },
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
}
