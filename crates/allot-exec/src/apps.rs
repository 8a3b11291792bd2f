//! The applications part as the executor uses it: in the store when this daemon schedules (the
//! embedded store, or the Redis lease holder), else over HTTP from the daemon that schedules (on
//! Redis, one daemon serves the applications part; see `allot_store::AppsHome`).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};

use allot_api::ErrorCode;
use allot_core::apps::states::TaskState;
use allot_core::apps::{AppId, AppSpec, SchedError, Task, TaskEnd, TaskEnding, TaskId};
use allot_core::pools::PoolName;
use allot_core::runs::Run;
use allot_store::{AppsHome, Store, StoreError};
use tokio::sync::oneshot;

/// A task as the executor needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacedTask {
    /// The number the scheduler gave the task when it was added: a task removed and added again
    /// under the same id has another.
    pub seq: u64,
    pub state: TaskState,
    pub placement: Option<TaskPlacement>,
    /// The task's spec, JSON text (empty if it has none).
    pub spec: String,
    /// While the scheduler preempts it: why (its attempt is to be ended).
    pub preempting: Option<String>,
    /// How many times it was preempted.
    pub preemptions: u32,
    /// Why it waited last, when a preemption took its placement back (`preempted for ...`).
    pub preempted_for: Option<String>,
}

/// `reason`, when it is a preemption's.
fn preempted_for(reason: Option<&str>) -> Option<String> {
    reason.filter(|r| r.starts_with(allot_core::apps::PREEMPTED_REASON_PREFIX)).map(str::to_owned)
}

/// What a run needs of its application.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppMeta {
    pub queue: String,
    pub user: String,
    pub labels: std::collections::BTreeMap<String, String>,
    pub max_parallelism: Option<u32>,
}

impl AppMeta {
    /// What a run needs of an application, from its spec.
    pub fn of(spec: &AppSpec) -> AppMeta {
        AppMeta {
            queue: spec.queue.to_string(),
            user: spec.user.clone(),
            labels: spec.tags.clone(),
            max_parallelism: spec.policy.max_parallelism,
        }
    }
}

/// Whether a task in `state`, placed on `pool`, is one for the executor of `pools` to run:
/// placed (Allocated or Running) on one of them.
pub(crate) fn placed_on(state: TaskState, pool: Option<&PoolName>, pools: &HashSet<PoolName>) -> bool {
    matches!(state, TaskState::Allocated | TaskState::Running) && pool.is_some_and(|pool| pools.contains(pool))
}

impl PlacedTask {
    /// Whether it is placed (Allocated or Running) on one of `pools`.
    pub(crate) fn placed_on(&self, pools: &HashSet<PoolName>) -> bool {
        placed_on(self.state, self.placement.as_ref().map(|p| &p.pool), pools)
    }
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
        [self.pool.as_str(), "/", &self.alloc].concat()
    }

    /// Whether `uri` is its [`TaskPlacement::uri`] (without writing that out).
    pub fn is_uri(&self, uri: &str) -> bool {
        uri.strip_prefix(self.pool.as_str()).and_then(|rest| rest.strip_prefix('/')) == Some(self.alloc.as_str())
    }
}

impl From<&Task> for PlacedTask {
    fn from(task: &Task) -> PlacedTask {
        PlacedTask {
            seq: task.seq,
            state: task.state,
            placement: task.placement.as_ref().map(|p| TaskPlacement {
                pool: p.pool.clone(),
                alloc: p.alloc.to_string(),
                resources: p.resources.to_string(),
            }),
            spec: task.spec.spec.clone(),
            preempting: task.preempting.as_ref().map(|p| match &p.by {
                Some((app, task)) => format!("preempted for {app}/{task}: {}", p.reason),
                None => format!("preempted: {}", p.reason),
            }),
            preemptions: task.preemptions,
            preempted_for: preempted_for(task.reason.as_deref()),
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
    let spec = task.spec.as_ref().map(|s| s.to_string()).unwrap_or_default();
    let preempting = task.preempting.as_ref().map(|p| match &p.by {
        Some(by) => format!("preempted for {by}: {}", p.reason),
        None => format!("preempted: {}", p.reason),
    });
    let (preemptions, preempted_for) = (task.preemptions, preempted_for(task.reason.as_deref()));
    Ok(PlacedTask { seq: task.seq, state, placement, spec, preempting, preemptions, preempted_for })
}

/// The most task ends reported in one call (the route takes 1,000).
const MAX_ENDS_AT_ONCE: usize = 500;
/// The batches of reports sent at once (each its own commit, or over HTTP its own request).
const BATCHES_IN_FLIGHT: usize = 4;

/// Where the executor reads and reports tasks.
pub(crate) struct AppsAccess {
    store: Arc<dyn Store>,
    /// The API token of calls to the daemon that schedules.
    token: Option<String>,
    /// Certificates (PEM) those calls trust besides the system's CAs.
    peer_roots: Option<Vec<u8>>,
    /// One client per scheduling daemon's URL.
    clients: Mutex<HashMap<String, allot_client::Client>>,
    /// The task ends to report, and whether a call is sending them.
    ends: Mutex<Ends>,
}

/// A task's end, with its run as it ended when that is not stored yet.
type EndWithRun = (TaskEnd, Option<Run>);

/// Task ends waiting for the call that sends them, each with its reporter's answer.
#[derive(Default)]
struct Ends {
    /// In the order they came; sent from the front, a batch at a time (a queue: thousands may
    /// wait while a batch is sent, and taking a batch moves none of them).
    pending: std::collections::VecDeque<(EndWithRun, oneshot::Sender<Result<(), Refusal>>)>,
    /// A task is sending: it takes what is pending whenever fewer than [`BATCHES_IN_FLIGHT`]
    /// batches are in flight.
    sending: bool,
}

/// How a call went to the daemon that schedules.
enum Home {
    Here,
    At(allot_client::Client),
}

/// How a call to the applications part failed, the same from the store and over HTTP.
enum Refusal {
    /// The task or its application is gone.
    Gone,
    /// The report is illegal in the task's state (it ended meanwhile).
    Illegal,
    Failed(StoreError),
}

impl From<StoreError> for Refusal {
    fn from(err: StoreError) -> Refusal {
        match err {
            StoreError::Apps(SchedError::TaskNotFound { .. } | SchedError::AppNotFound(_)) => Refusal::Gone,
            StoreError::Apps(SchedError::Illegal(_) | SchedError::NotPreempting { .. }) => Refusal::Illegal,
            err => Refusal::Failed(err),
        }
    }
}

impl From<allot_client::ClientError> for Refusal {
    fn from(err: allot_client::ClientError) -> Refusal {
        match err.code() {
            Some(code) => Refusal::of_code(err.error_code(), code, &err.to_string()),
            None => {
                Refusal::Failed(StoreError::Unavailable(format!("the daemon that schedules did not answer: {err}")))
            }
        }
    }
}

impl Refusal {
    /// The refusal an error answer of the daemon that schedules stands for (`known`: its code,
    /// if this build knows it; `code` as the answer wrote it).
    fn of_code(known: Option<ErrorCode>, code: &str, message: &str) -> Refusal {
        match known {
            Some(ErrorCode::TaskNotFound | ErrorCode::AppNotFound) => Refusal::Gone,
            Some(ErrorCode::IllegalTransition) => Refusal::Illegal,
            _ => Refusal::Failed(StoreError::Unavailable(format!(
                "the daemon that schedules answered {code}: {message}"
            ))),
        }
    }

    /// The error of a call for which nothing but success is an answer.
    fn into_error(self) -> StoreError {
        match self {
            Refusal::Gone => StoreError::Unavailable("the task or its application went meanwhile".into()),
            Refusal::Illegal => StoreError::Unavailable("the call was refused in the task's state".into()),
            Refusal::Failed(err) => err,
        }
    }
}

/// What became of a report the task may have moved on from: that is not an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reported {
    /// Taken, or refused in the task's state (it ended meanwhile).
    Heard,
    /// The task, or its application, is gone: its run goes too.
    Gone,
}

fn reported(done: Result<(), Refusal>) -> Result<Reported, StoreError> {
    match done {
        Ok(()) | Err(Refusal::Illegal) => Ok(Reported::Heard),
        Err(Refusal::Gone) => Ok(Reported::Gone),
        Err(Refusal::Failed(err)) => Err(err),
    }
}

impl AppsAccess {
    pub(crate) fn new(store: Arc<dyn Store>, token: Option<String>, peer_roots: Option<Vec<u8>>) -> AppsAccess {
        AppsAccess { store, token, peer_roots, clients: Mutex::default(), ends: Mutex::default() }
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
                let made = match &self.peer_roots {
                    Some(pem) => {
                        let tls = allot_client::TlsOptions { ca_cert_pem: Some(pem.clone()), identity_pem: None };
                        allot_client::Client::with_tls(&url, &tls)
                    }
                    None => allot_client::Client::new(&url),
                };
                let mut client = made.map_err(|e| Refusal::from(e).into_error())?;
                if let Some(token) = &self.token {
                    client = client.with_token(token);
                }
                clients.insert(url, client.clone());
                Ok(Home::At(client))
            }
        }
    }

    /// The task, or `None` if it (or its application) is gone: as last committed, read where
    /// this daemon is (on Redis, from the task's record: not asked of the daemon that schedules).
    pub(crate) async fn task(&self, app: &AppId, task: &TaskId) -> Result<Option<PlacedTask>, StoreError> {
        Ok(self.store.stored_task(app.clone(), task.clone()).await?.as_ref().map(PlacedTask::from))
    }

    /// What a run needs of its application (default if it is gone).
    ///
    /// Here and below, a call to another daemon is boxed: its HTTP future is kilobytes, and
    /// unboxed it would be part of every run's driver, thousands of which wait at once.
    pub(crate) async fn app_meta(&self, app: &AppId) -> Result<AppMeta, StoreError> {
        let found: Result<AppMeta, Refusal> = match self.home()? {
            Home::Here => {
                self.store.app(app.clone()).await.map_err(Refusal::from).map(|info| AppMeta::of(&info.app.spec))
            }
            Home::At(client) => match Box::pin(client.app(app.as_str())).await {
                Ok(wire) => Ok(AppMeta {
                    queue: wire.queue,
                    user: wire.user,
                    labels: wire.tags,
                    max_parallelism: wire.policy.max_parallelism.map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
                }),
                Err(err) => Err(err.into()),
            },
        };
        match found {
            Ok(meta) => Ok(meta),
            Err(Refusal::Gone) => Ok(AppMeta::default()),
            Err(refusal) => Err(refusal.into_error()),
        }
    }

    /// Reports the task running (an illegal report, the task having moved on, is ignored).
    pub(crate) async fn start(&self, app: &AppId, task: &TaskId) -> Result<Reported, StoreError> {
        let done: Result<(), Refusal> = match self.home()? {
            Home::Here => self.store.start_task(app.clone(), task.clone()).await.map(|_| ()).map_err(Refusal::from),
            Home::At(client) => {
                Box::pin(client.start_task(app.as_str(), task.as_str())).await.map(|_| ()).map_err(Refusal::from)
            }
        };
        reported(done)
    }

    /// Reports how the task ended: completed, or failed with a reason (ignored if it ended or
    /// went meanwhile), with its `run` as it ended stored first (in the same commit where the
    /// store keeps both). Reports made while others are being sent go together in a next call
    /// (one commit for them all, and over HTTP one request), so a busy executor reports in
    /// batches without waiting for a batch to fill. The report is queued when this is called;
    /// what it returns holds only the wait for its answer (thousands of runs wait at once).
    pub(crate) fn finish(
        self: &Arc<Self>,
        app: &AppId,
        task: &TaskId,
        ending: TaskEnding,
        run: Option<Run>,
    ) -> impl Future<Output = Result<Reported, StoreError>> + Send + 'static {
        let (answer, answered) = oneshot::channel();
        let send = {
            let mut ends = self.ends.lock().unwrap_or_else(|p| p.into_inner());
            ends.pending.push_back(((TaskEnd { app: app.clone(), task: task.clone(), ending }, run), answer));
            !std::mem::replace(&mut ends.sending, true)
        };
        if send {
            // Its own task: the reports of others do not depend on this caller staying.
            tokio::spawn(self.clone().send_ends());
        }
        async move {
            let done = answered
                .await
                .unwrap_or_else(|_| Err(Refusal::Failed(StoreError::Unavailable("the report was not sent".into()))));
            reported(done)
        }
    }

    /// Sends the pending reports, a batch at a time, until none is left. Up to
    /// [`BATCHES_IN_FLIGHT`] batches are sent at once: the next is taken (and committed) while
    /// those before it wait to be made durable, so a burst of reports pays for a sync per few
    /// batches, not one per batch.
    async fn send_ends(self: Arc<Self>) {
        let mut in_flight = tokio::task::JoinSet::new();
        loop {
            let batch: Option<Vec<_>> = {
                let mut ends = self.ends.lock().unwrap_or_else(|p| p.into_inner());
                if ends.pending.is_empty() {
                    if in_flight.is_empty() {
                        ends.sending = false;
                        return;
                    }
                    None
                } else {
                    let count = ends.pending.len().min(MAX_ENDS_AT_ONCE);
                    Some(ends.pending.drain(..count).collect())
                }
            };
            match batch {
                Some(batch) => {
                    in_flight.spawn(self.clone().send_batch(batch));
                    if in_flight.len() >= BATCHES_IN_FLIGHT {
                        in_flight.join_next().await;
                    }
                }
                // What came meanwhile is taken once a batch in flight is answered.
                None => drop(in_flight.join_next().await),
            }
        }
    }

    /// Sends one batch of reports and hands each reporter its answer.
    async fn send_batch(self: Arc<Self>, batch: Vec<(EndWithRun, oneshot::Sender<Result<(), Refusal>>)>) {
        let (reports, answers): (Vec<EndWithRun>, Vec<_>) = batch.into_iter().unzip();
        let count = reports.len();
        let mut results = match self.finish_all(reports).await {
            Ok(results) => results,
            Err(err) => (0..count).map(|_| Err(Refusal::Failed(err.clone()))).collect(),
        };
        results.resize_with(count, || Err(Refusal::Failed(StoreError::Unavailable("no answer".into()))));
        for (answer, result) in answers.into_iter().zip(results) {
            let _ = answer.send(result);
        }
    }

    /// Reports the ends of several tasks in one call, each with its run stored first: one result
    /// per report, in order.
    async fn finish_all(&self, reports: Vec<EndWithRun>) -> Result<Vec<Result<(), Refusal>>, StoreError> {
        match self.home()? {
            Home::Here => Ok(self
                .store
                .finish_runs(reports)
                .await?
                .into_iter()
                .map(|r| r.map(|_| ()).map_err(|e| Refusal::from(StoreError::Apps(e))))
                .collect()),
            Home::At(client) => {
                // The runs are this daemon's to write, then the reports the other's.
                let wire = allot_store::put_runs_of_ends(&*self.store, reports)
                    .await?
                    .into_iter()
                    .map(|end| allot_client::TaskEnd {
                        app: end.app.to_string(),
                        task: end.task.to_string(),
                        outcome: match &end.ending {
                            TaskEnding::Completed => allot_client::TaskOutcome::Completed,
                            TaskEnding::Failed(_) => allot_client::TaskOutcome::Failed,
                            TaskEnding::Preempted => allot_client::TaskOutcome::Preempted,
                        },
                        reason: match end.ending {
                            TaskEnding::Failed(reason) => Some(reason),
                            _ => None,
                        },
                    })
                    .collect();
                let answers = Box::pin(client.finish_tasks(wire)).await.map_err(|e| Refusal::from(e).into_error())?;
                Ok(answers
                    .into_iter()
                    .map(|answer| match answer.error {
                        None => Ok(()),
                        Some(error) => {
                            Err(Refusal::of_code(ErrorCode::parse(&error.code), &error.code, &error.message))
                        }
                    })
                    .collect())
            }
        }
    }

    /// The tasks placed (Allocated or Running) on `pools`, in applications that have not ended.
    pub(crate) async fn placed_on(&self, pools: &HashSet<PoolName>) -> Result<Vec<(AppId, TaskId)>, StoreError> {
        let mut found = Vec::new();
        match self.home()? {
            Home::Here => found = self.store.placed_on(pools).await?,
            Home::At(client) => {
                let refused = |e: allot_client::ClientError| Refusal::from(e).into_error();
                for app in Box::pin(client.apps()).await.map_err(refused)?.apps {
                    let placed = ["Allocated", "Running"].iter().map(|s| app.tasks.get(*s).copied().unwrap_or(0));
                    if placed.sum::<u64>() == 0 {
                        continue;
                    }
                    let Ok(id) = AppId::new(&app.id) else { continue };
                    for task in Box::pin(client.tasks(&app.id)).await.map_err(refused)?.tasks {
                        if from_wire(&task)?.placed_on(pools) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A placement knows its own uri, and no other (another pool that starts with its pool's
    /// name, another alloc, or either without the slash).
    #[test]
    fn a_placement_tells_its_uri_from_others() {
        let placement =
            TaskPlacement { pool: PoolName::new("p").unwrap(), alloc: "00ab".into(), resources: "cpu=1".into() };
        assert!(placement.is_uri(&placement.uri()));
        for other in ["p/00ac", "p2/00ab", "p00ab", "p/", "/00ab", "", "p/00ab/", "q/00ab"] {
            assert!(!placement.is_uri(other), "{other}");
        }
    }
}
