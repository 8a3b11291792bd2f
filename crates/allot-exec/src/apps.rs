//! The applications part as the executor uses it: in the store when this daemon schedules (the
//! embedded store, or the Redis lease holder), else over HTTP from the daemon that schedules (on
//! Redis, one daemon serves the applications part; see `allot_store::AppsHome`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use allot_core::app::TaskState;
use allot_core::pool::PoolName;
use allot_core::sched::{AppId, SchedError, Task, TaskId};
use allot_store::{AppsHome, Store, StoreError};

/// A task as the executor needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacedTask {
    pub state: TaskState,
    pub placement: Option<TaskPlacement>,
    /// The task's spec, JSON text (empty if it has none).
    pub spec: String,
}

/// What a run needs of its application.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppMeta {
    pub queue: String,
    pub user: String,
    pub labels: std::collections::BTreeMap<String, String>,
    pub max_parallelism: Option<u32>,
}

/// Where a task is placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskPlacement {
    pub pool: PoolName,
    pub alloc: String,
    pub resources: String,
}

impl TaskPlacement {
    /// `pool/alloc`: the placement a run's attempt belongs to.
    pub fn uri(&self) -> String {
        format!("{}/{}", self.pool, self.alloc)
    }
}

impl From<&Task> for PlacedTask {
    fn from(task: &Task) -> PlacedTask {
        PlacedTask {
            state: task.state,
            placement: task.placement.as_ref().map(|p| TaskPlacement {
                pool: p.pool.clone(),
                alloc: p.alloc.to_string(),
                resources: p.resources.to_string(),
            }),
            spec: task.spec.spec.clone(),
        }
    }
}

fn from_wire(task: &allot_client::Task) -> Result<PlacedTask, StoreError> {
    let bad = |what: String| StoreError::Unavailable(format!("the scheduling daemon answered {what}"));
    let state = TaskState::ALL
        .iter()
        .copied()
        .find(|s| s.name() == task.state)
        .ok_or_else(|| bad(format!("an unknown task state `{}`", task.state)))?;
    let placement = match &task.placement {
        None => None,
        Some(p) => Some(TaskPlacement {
            pool: PoolName::new(&p.pool).map_err(|e| bad(e.to_string()))?,
            alloc: p.alloc.clone(),
            resources: p.resources.clone(),
        }),
    };
    Ok(PlacedTask { state, placement, spec: task.spec.as_ref().map(|s| s.to_string()).unwrap_or_default() })
}

/// Where the executor reads and reports tasks.
pub(crate) struct AppsAccess {
    store: Arc<dyn Store>,
    /// One client per scheduling daemon's URL.
    clients: Mutex<HashMap<String, allot_client::Client>>,
}

/// How a call went to the daemon that schedules.
enum Home {
    Here,
    At(allot_client::Client),
}

fn client_error(err: allot_client::ClientError) -> StoreError {
    match &err {
        allot_client::ClientError::Api { code, message, .. } => match code.as_str() {
            "task_not_found" | "app_not_found" => StoreError::Sched(SchedError::TaskNotFound {
                app: AppId::new("unknown").expect("a valid id"),
                task: TaskId::new("unknown").expect("a valid id"),
            }),
            "illegal_transition" => StoreError::Unavailable(format!("illegal: {message}")),
            _ => StoreError::Unavailable(err.to_string()),
        },
        _ => StoreError::Unavailable(format!("the daemon that schedules did not answer: {err}")),
    }
}

/// Whether an error says the task or its application is gone.
pub(crate) fn is_gone(err: &StoreError) -> bool {
    matches!(err, StoreError::Sched(SchedError::TaskNotFound { .. } | SchedError::AppNotFound(_)))
}

/// Whether an error says the report was illegal in the task's state (it ended meanwhile).
fn is_illegal(err: &StoreError) -> bool {
    matches!(err, StoreError::Sched(SchedError::Illegal(_)))
        || matches!(err, StoreError::Unavailable(m) if m.starts_with("illegal: "))
}

impl AppsAccess {
    pub(crate) fn new(store: Arc<dyn Store>) -> AppsAccess {
        AppsAccess { store, clients: Mutex::default() }
    }

    fn home(&self) -> Result<Home, StoreError> {
        match self.store.apps_home() {
            AppsHome::Here => Ok(Home::Here),
            AppsHome::Unknown => Err(StoreError::Unavailable("no daemon schedules applications right now".into())),
            AppsHome::At(url) => {
                let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(client) = clients.get(&url) {
                    return Ok(Home::At(client.clone()));
                }
                let client = allot_client::Client::new(&url).map_err(client_error)?;
                clients.insert(url, client.clone());
                Ok(Home::At(client))
            }
        }
    }

    /// The task, or `None` if it (or its application) is gone.
    pub(crate) async fn task(&self, app: &AppId, task: &TaskId) -> Result<Option<PlacedTask>, StoreError> {
        let found = match self.home()? {
            Home::Here => self.store.task(app.clone(), task.clone()).await.map(|info| PlacedTask::from(&info.task)),
            Home::At(client) => match client.task(app.as_str(), task.as_str()).await {
                Ok(wire) => from_wire(&wire),
                Err(err) => Err(client_error(err)),
            },
        };
        match found {
            Ok(task) => Ok(Some(task)),
            Err(err) if is_gone(&err) => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// What a run needs of its application (default if it is gone).
    pub(crate) async fn app_meta(&self, app: &AppId) -> Result<AppMeta, StoreError> {
        let found = match self.home()? {
            Home::Here => self.store.app(app.clone()).await.map(|info| {
                let spec = info.app.spec;
                AppMeta {
                    queue: spec.queue.to_string(),
                    user: spec.user,
                    labels: spec.tags,
                    max_parallelism: spec.policy.max_parallelism,
                }
            }),
            Home::At(client) => match client.app(app.as_str()).await {
                Ok(wire) => Ok(AppMeta {
                    queue: wire.queue,
                    user: wire.user,
                    labels: wire.tags,
                    max_parallelism: wire.policy.max_parallelism.map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
                }),
                Err(err) => Err(client_error(err)),
            },
        };
        match found {
            Err(err) if is_gone(&err) => Ok(AppMeta::default()),
            other => other,
        }
    }

    /// Reports the task running (an illegal report, the task having moved on, is ignored).
    pub(crate) async fn start(&self, app: &AppId, task: &TaskId) -> Result<(), StoreError> {
        let done = match self.home()? {
            Home::Here => self.store.start_task(app.clone(), task.clone()).await.map(|_| ()),
            Home::At(client) => client.start_task(app.as_str(), task.as_str()).await.map(|_| ()).map_err(client_error),
        };
        match done {
            Err(err) if is_illegal(&err) || is_gone(&err) => Ok(()),
            other => other,
        }
    }

    /// Reports how the task ended: completed, or failed with a reason (ignored if it ended or
    /// went meanwhile).
    pub(crate) async fn finish(&self, app: &AppId, task: &TaskId, failed: Option<String>) -> Result<(), StoreError> {
        let done = match self.home()? {
            Home::Here => self.store.finish_task(app.clone(), task.clone(), failed).await.map(|_| ()),
            Home::At(client) => {
                let answer = match failed {
                    None => client.complete_task(app.as_str(), task.as_str()).await,
                    Some(reason) => client.fail_task(app.as_str(), task.as_str(), Some(&reason)).await,
                };
                answer.map(|_| ()).map_err(client_error)
            }
        };
        match done {
            Err(err) if is_illegal(&err) || is_gone(&err) => Ok(()),
            other => other,
        }
    }

    /// The tasks placed (Allocated or Running) on `pools`, in applications that have not ended.
    pub(crate) async fn placed_on(
        &self,
        pools: &std::collections::HashSet<PoolName>,
    ) -> Result<Vec<(AppId, TaskId)>, StoreError> {
        let placed_here = |task: &PlacedTask| {
            matches!(task.state, TaskState::Allocated | TaskState::Running)
                && task.placement.as_ref().is_some_and(|p| pools.contains(&p.pool))
        };
        let mut found = Vec::new();
        match self.home()? {
            Home::Here => found = self.store.placed_on(pools).await?,
            Home::At(client) => {
                for app in client.apps().await.map_err(client_error)?.apps {
                    let placed = ["Allocated", "Running"].iter().map(|s| app.tasks.get(*s).copied().unwrap_or(0));
                    if placed.sum::<u64>() == 0 {
                        continue;
                    }
                    let Ok(id) = AppId::new(&app.id) else { continue };
                    for task in client.tasks(&app.id).await.map_err(client_error)?.tasks {
                        if placed_here(&from_wire(&task)?) {
                            if let Ok(task_id) = TaskId::new(&task.id) {
                                found.push((id.clone(), task_id));
                            }
                        }
                    }
                }
            }
        }
        Ok(found)
    }
}
