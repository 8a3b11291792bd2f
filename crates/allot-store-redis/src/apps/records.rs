//! The records of queues, applications and tasks on Redis (`lua/apps.lua`), in the
//! `{allot-apps}` hash slot: written only by the scheduler that holds the lease, in the term its
//! fencing number names (a deposed scheduler's write is refused), and loaded by a scheduler that
//! takes the lease over, with the intents its predecessor left (see `scheduler.rs`). The records
//! are the embedded store's record types, JSON-encoded.

use allot_core::apps::{AppChange, AppId, SchedConfig, Scheduler, Task, TaskId};
use allot_store::records::apps::{AppRecord, QueueRecord, TaskRecord};
use allot_store::StoreError;
use redis::Value;

use crate::errors::redis_error;
use crate::reply::corrupt;
use crate::store::RedisStore;

/// The applications' key prefix: one hash slot.
pub const APPS_PREFIX: &str = "allot:{allot-apps}";

/// Why a write was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    /// The writer does not hold the lease in the term it named: a deposed scheduler.
    #[error("the scheduler's lease is in term {current}: a write of another term is refused")]
    Deposed { current: u64 },
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn json<T: serde::Serialize>(record: &T) -> String {
    serde_json::to_string(record).expect("records always encode")
}

/// The `(kind, k1, k2, value)` quadruples of `lua/apps.lua`'s write.
fn encode(changes: &[AppChange]) -> Vec<String> {
    let mut args = Vec::with_capacity(changes.len() * 4);
    for change in changes {
        let (kind, k1, k2, value) = match change {
            AppChange::Queue { path, limits } => {
                ("queue", path.to_string(), String::new(), json(&QueueRecord::of(limits)))
            }
            AppChange::QueueRemoved { path } => ("queue-", path.to_string(), String::new(), String::new()),
            AppChange::App(app) => ("app", app.spec.id.to_string(), String::new(), json(&AppRecord::of(app))),
            AppChange::AppRemoved { id } => ("app-", id.to_string(), String::new(), String::new()),
            AppChange::Task(task) => {
                ("task", task.app.to_string(), task.spec.id.to_string(), json(&TaskRecord::of(task)))
            }
            AppChange::TaskRemoved { app, task } => ("task-", app.to_string(), task.to_string(), String::new()),
        };
        args.extend([kind.to_owned(), k1, k2, value]);
    }
    args
}

impl RedisStore {
    /// Writes the scheduler's changes, in order, in one atomic call, if `holder` holds the
    /// scheduler's lease in term `fencing`. `intents` replaces what the scheduler is carrying out
    /// in the pools and namespaces (`None` keeps it, `Some("")` clears it).
    pub async fn write_app_records(
        &self,
        holder: &str,
        fencing: u64,
        intents: Option<&str>,
        changes: &[AppChange],
    ) -> Result<usize, WriteError> {
        let fencing_text = fencing.to_string();
        let encoded = encode(changes);
        let mut args: Vec<&str> = vec!["write", holder, &fencing_text, intents.unwrap_or("=")];
        args.extend(encoded.iter().map(String::as_str));
        let mut reply = self.inner.eval(&self.inner.scripts.apps, APPS_PREFIX, &args, true).await?;
        match reply.text()?.as_str() {
            "written" => Ok(reply.uint()? as usize),
            "err" => {
                let _ = reply.text()?;
                Err(WriteError::Deposed { current: reply.uint()? })
            }
            other => Err(corrupt(format!("apps write answer `{other}`")).into()),
        }
    }

    /// A task as its record has it (`None`: it, or its application, is gone): what the scheduler
    /// last committed, read on any daemon.
    pub(crate) async fn task_record(&self, app: &AppId, task: &TaskId) -> Result<Option<Task>, StoreError> {
        self.live()?;
        let key = format!("{APPS_PREFIX}:tasks:{app}");
        let cmd = redis::cmd("HGET").arg(&key).arg(task.as_str()).clone();
        let name = format!("{app}/{task}");
        match self.inner.conn.query(&cmd).await.map_err(|e| redis_error(e, false))? {
            Value::Nil => Ok(None),
            Value::BulkString(json) => {
                let record: TaskRecord =
                    serde_json::from_slice(&json).map_err(|e| corrupt(format!("tasks `{name}`: {e}")))?;
                Ok(Some(record.into_task(app.as_str(), task.as_str()).map_err(corrupt)?))
            }
            other => Err(corrupt(format!("tasks `{name}`: {other:?}"))),
        }
    }

    /// Every record, as a scheduler that takes the lease loads them.
    pub async fn load_app_records(&self, config: SchedConfig) -> Result<Scheduler, StoreError> {
        Ok(self.load_app_records_and_intents(config).await?.0)
    }

    /// Every record, and the intents the last scheduler left (see `scheduler.rs`).
    pub(crate) async fn load_app_records_and_intents(
        &self,
        config: SchedConfig,
    ) -> Result<(Scheduler, String), StoreError> {
        let mut reply = self.inner.eval(&self.inner.scripts.apps, APPS_PREFIX, &["load"], false).await?;
        let intents = reply.text()?;
        let decode = |table: &'static str, key: &str, text: &str| -> Result<_, StoreError> {
            serde_json::from_str::<serde_json::Value>(text).map_err(|e| corrupt(format!("{table} `{key}`: {e}")))
        };
        let mut queues = Vec::new();
        loop {
            let path = reply.text()?;
            if path.is_empty() {
                break;
            }
            let record: QueueRecord =
                serde_json::from_value(decode("queues", &path, &reply.text()?)?).map_err(corrupt)?;
            queues.push(record.into_queue(&path).map_err(corrupt)?);
        }
        let mut apps = Vec::new();
        loop {
            let id = reply.text()?;
            if id.is_empty() {
                break;
            }
            let record: AppRecord = serde_json::from_value(decode("apps", &id, &reply.text()?)?).map_err(corrupt)?;
            apps.push(record.into_app(&id).map_err(corrupt)?);
        }
        let mut tasks = Vec::new();
        while !reply.is_empty() {
            let (app, task) = (reply.text()?, reply.text()?);
            let record: TaskRecord =
                serde_json::from_value(decode("tasks", &task, &reply.text()?)?).map_err(corrupt)?;
            tasks.push(record.into_task(&app, &task).map_err(corrupt)?);
        }
        Ok((Scheduler::restore(config, queues, apps, tasks), intents))
    }
}
