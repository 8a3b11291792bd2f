//! The runs of the embedded store: in memory, and written through the same group commit as
//! everything else.

use std::collections::BTreeMap;

use allot_core::exec::Run;
use allot_core::sched::{AppId, TaskId};
use async_trait::async_trait;
use redb::{ReadTransaction, ReadableTable, WriteTransaction};

use super::{durable, EmbeddedStore, OpenError};
use crate::records::runs::{RunRecord, RUNS};
use crate::records::{decode, encode};
use crate::runs::{RunChange, RunStore};
use crate::StoreError;

pub(super) type Runs = BTreeMap<(AppId, TaskId), Run>;

pub(super) fn load(txn: &ReadTransaction) -> Result<Runs, OpenError> {
    let read_err = |err: redb::Error| OpenError::Read(err.to_string());
    let mut runs = Runs::new();
    for entry in txn.open_table(RUNS).map_err(|e| read_err(e.into()))?.iter().map_err(|e| read_err(e.into()))? {
        let (key, value) = entry.map_err(|e| read_err(e.into()))?;
        let (app, task) = key.value();
        let name = format!("{app}/{task}");
        let record: RunRecord = decode("runs", &name, value.value())?;
        let corrupt = |reason: String| crate::records::CorruptRecord { table: "runs", key: name.clone(), reason };
        let app = AppId::new(app).map_err(|e| corrupt(e.to_string()))?;
        let task = TaskId::new(task).map_err(|e| corrupt(e.to_string()))?;
        runs.insert((app, task), record.into_run(&name)?);
    }
    Ok(runs)
}

// redb's error is large, but it is returned once per batch, not per operation.
#[allow(clippy::result_large_err)]
pub(super) fn write<'a>(
    txn: &WriteTransaction,
    changes: impl Iterator<Item = &'a RunChange>,
) -> Result<(), redb::Error> {
    let mut table = txn.open_table(RUNS)?;
    for change in changes {
        match change {
            RunChange::Put { app, task, run } => {
                table.insert((app.as_str(), task.as_str()), encode(&RunRecord::of(run)).as_slice())?;
            }
            RunChange::Removed { app, task } => {
                table.remove((app.as_str(), task.as_str()))?;
            }
        }
    }
    Ok(())
}

impl EmbeddedStore {
    async fn change_runs(&self, change: RunChange) -> Result<(), StoreError> {
        let rx = {
            let mut state = self.lock();
            state.usable(&self.shared)?;
            match &change {
                RunChange::Put { app, task, run } => state.runs.insert((app.clone(), task.clone()), (**run).clone()),
                RunChange::Removed { app, task } => state.runs.remove(&(app.clone(), task.clone())),
            };
            state.submit_runs(&self.shared, change)
        };
        durable(rx).await
    }
}

#[async_trait]
impl RunStore for EmbeddedStore {
    async fn put_run(&self, app: AppId, task: TaskId, run: Run) -> Result<(), StoreError> {
        self.change_runs(RunChange::Put { app, task, run: Box::new(run) }).await
    }

    async fn run(&self, app: AppId, task: TaskId) -> Result<Option<Run>, StoreError> {
        self.read_state(|state, _| Ok(state.runs.get(&(app, task)).cloned()))
    }

    async fn runs(&self) -> Result<Vec<(AppId, TaskId, Run)>, StoreError> {
        self.read_state(|state, _| {
            Ok(state.runs.iter().map(|((app, task), run)| (app.clone(), task.clone(), run.clone())).collect())
        })
    }

    async fn remove_run(&self, app: AppId, task: TaskId) -> Result<(), StoreError> {
        self.change_runs(RunChange::Removed { app, task }).await
    }
}
