//! Queues, applications and tasks (YuniKorn's application-management protocol). Resources are
//! written in their text form (`cpu=4,mem=16GiB`), durations in milliseconds.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::integer;

/// How a leaf queue orders its applications.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SortPolicy {
    /// Submission order: each application places all it can before the next.
    #[default]
    Fifo,
    /// Round robin, least used first.
    Fair,
    /// The application with the highest-priority pending task first.
    Priority,
}

/// How a queue shows its priority to its parent [YuniKorn `priority.policy`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PriorityPolicy {
    /// The highest priority waiting in it, plus its `priority_offset`.
    #[default]
    Default,
    /// Its `priority_offset` alone: what waits inside does not compete outside by its own priority.
    Fence,
}

/// Whether and where a queue's tasks preempt, and are preempted [YuniKorn `preemption.policy`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PreemptionPolicy {
    #[default]
    Default,
    /// Its tasks preempt only tasks inside it.
    Fence,
    /// Its tasks, and those of the queues below it, are never preempted.
    Disabled,
}

/// `PUT /v1/queues/{queue}`: create a queue (and its parents) or change its limits. A limit not
/// given is no limit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutQueue {
    /// What the queue is guaranteed, for fair share between sibling queues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guaranteed: Option<String>,
    /// The most its applications may hold together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<String>,
    /// The most applications running in it at once.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "integer::optional")]
    pub max_apps: Option<u64>,
    /// The most applications one user runs in it at once.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "integer::optional")]
    pub user_max_apps: Option<u64>,
    /// The most one user's applications may hold in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_max: Option<String>,
    /// The most applications of one group run in it at once: an application counts for its
    /// user's primary group (the first of its `user_groups`).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "integer::optional")]
    pub group_max_apps: Option<u64>,
    /// The most one group's applications may hold in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_max: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sort: Option<SortPolicy>,
    /// Who may submit here and below, in YuniKorn's format: `*`, or `user1,user2 group1,group2`
    /// (none: the parent's say; with access configured, checked besides the caller's roles).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submit_acl: Option<String>,
    /// Who may administer (and submit) here and below, in the same format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_acl: Option<String>,
    /// The most it may hold beyond `guaranteed`, per resource named (a resource not named: no
    /// limit) [Kueue's `borrowingLimit`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrow_limit: Option<String>,
    /// The most of its unused guarantee other queues may use, per resource named; the rest of
    /// its unused guarantee is kept free for it (a resource not named: all of it is lent)
    /// [Kueue's `lendingLimit`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lend_limit: Option<String>,
    /// Added to the priority it shows its parent (default 0) [YuniKorn `priority.offset`].
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "integer::signed_optional")]
    pub priority_offset: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_policy: Option<PriorityPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemption: Option<PreemptionPolicy>,
    /// How long a task of it waits before it may preempt (default: its parent's, else 30 s)
    /// [YuniKorn `preemption.delay`].
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "integer::optional")]
    pub preemption_delay_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Queue {
    /// e.g. `root.analytics.etl`.
    pub path: String,
    /// Applications go to leaf queues only.
    pub leaf: bool,
    pub guaranteed: String,
    pub max: Option<String>,
    pub max_apps: Option<u64>,
    pub user_max_apps: Option<u64>,
    pub user_max: Option<String>,
    #[serde(default)]
    pub group_max_apps: Option<u64>,
    #[serde(default)]
    pub group_max: Option<String>,
    pub sort: SortPolicy,
    #[serde(default)]
    pub submit_acl: Option<String>,
    #[serde(default)]
    pub admin_acl: Option<String>,
    #[serde(default)]
    pub borrow_limit: Option<String>,
    #[serde(default)]
    pub lend_limit: Option<String>,
    #[serde(default)]
    pub priority_offset: i32,
    #[serde(default)]
    pub priority_policy: PriorityPolicy,
    #[serde(default)]
    pub preemption: PreemptionPolicy,
    #[serde(default)]
    pub preemption_delay_ms: Option<u64>,
    /// What the placements of its applications hold.
    pub used: String,
    pub running_apps: u64,
    /// Applications in it (or under it) that have not ended.
    pub apps: u64,
    pub pending_tasks: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PutQueueResponse {
    pub created: bool,
    pub queue: Queue,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct QueueList {
    pub queues: Vec<Queue>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RemovedQueue {
    pub path: String,
}

/// Units of a token namespace's quota held while placed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenNeed {
    pub namespace: String,
    #[serde(deserialize_with = "integer::required")]
    pub units: u64,
}

/// Tasks that start together or not at all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskGroup {
    pub name: String,
    #[serde(deserialize_with = "integer::required_u32")]
    pub min_members: u32,
    /// What each member's placeholder holds; a member may ask for less, never more.
    pub min_resources: String,
    /// Pools a member may go to: those with all of these labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub selector: BTreeMap<String, String>,
    /// Tokens each member's placeholder holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<TokenNeed>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum GangStyle {
    /// On timeout, release the unused placeholders and go on without the gang.
    #[default]
    Soft,
    /// On timeout, fail the application (`ResourceReservationTimeout`).
    Hard,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SchedulingPolicy {
    /// How long reserved placeholders wait for their tasks (default 15 minutes).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "integer::optional")]
    pub placeholder_timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang: Option<GangStyle>,
    /// How long to wait, from submission, before any placeholder is reserved (default: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "integer::optional")]
    pub reserve_timeout_ms: Option<u64>,
    /// The most of its tasks the executors run at once; a task waiting for a token does not
    /// count (default: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "integer::optional")]
    pub max_parallelism: Option<u64>,
}

/// A task as added.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddTask {
    pub id: String,
    pub resources: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<TokenNeed>,
    /// Its task group, if it is a gang member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Higher first: in its application, and for its application in a queue sorted by
    /// `priority`. Neither this nor `priority_class` given: its application's.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "integer::signed_optional")]
    pub priority: Option<i32>,
    /// A priority class of the daemon's (`[priority_classes]`), instead of `priority`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class: Option<String>,
    /// Whether the scheduler may preempt it for a task of higher priority or of a queue below
    /// its guarantee (default true; also read as Flyte's `interruptible`). A gang's members are taken
    /// whole or not at all: one that may not be keeps its whole gang.
    #[serde(default, skip_serializing_if = "Option::is_none", alias = "interruptible")]
    pub preemptable: Option<bool>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub selector: BTreeMap<String, String>,
    /// Opaque to allot: whatever runs the task needs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub spec: Option<serde_json::Value>,
    /// New attempts after user failures (retryable ones), as Flyte's task `retries`: written
    /// into `spec` as its `retries` (in the place of any it names), where the executor reads
    /// them.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "integer::optional")]
    pub retries: Option<u64>,
}

/// `POST /v1/apps`: submit an application, with its first tasks if any.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitApp {
    pub id: String,
    /// A leaf queue, e.g. `root.analytics.etl`, or one name, a queue under `root` (or under what
    /// the `provided` placement rule's parent gives). With placement rules configured, an
    /// application that names none, or one its user may not submit to, goes where the first
    /// rule that gives a usable queue says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// With access configured: the caller's user, unless the caller may impersonate.
    #[serde(default = "default_user")]
    pub user: String,
    /// The user's groups, the primary one first (per-group limits count the application
    /// against it). With access configured: the caller's groups, unless the caller may
    /// impersonate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_groups: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub task_groups: Vec<TaskGroup>,
    #[serde(default)]
    pub policy: SchedulingPolicy,
    /// Higher first, in a queue sorted by `priority` and between queues; its tasks' unless they
    /// name their own. Neither this nor `priority_class` given: the daemon's default class, else 0.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "integer::signed_optional")]
    pub priority: Option<i32>,
    /// A priority class of the daemon's (`[priority_classes]`), instead of `priority`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class: Option<String>,
    /// Tasks added right after the application, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<AddTask>,
}

/// The user of an application that names none (with access configured: the caller's).
pub const DEFAULT_USER: &str = "default";

fn default_user() -> String {
    DEFAULT_USER.to_owned()
}

/// Why an application or task waits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Waiting {
    /// queue_limit, no_pool_matches, no_room, tokens, gang_not_reserved, gang_missing_members,
    /// after_gang, forbidden (its user may not use a namespace or pool it needs), preempting (tasks
    /// are being preempted for it: the room is held for it); for a placed task, pool_not_run (no daemon runs its pool: start one with
    /// `--run-pool`).
    pub code: String,
    pub message: String,
}

/// A placeholder of a reserved gang.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Placeholder {
    pub group: String,
    pub member: u32,
    pub placement: Placement,
    /// The task that took it over.
    pub task: Option<String>,
}

/// Tokens a placement holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HeldTokens {
    pub namespace: String,
    pub token: String,
    pub units: u64,
}

/// Where a task runs: an alloc on a pool and the grants it holds, taken together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Placement {
    pub pool: String,
    pub alloc: String,
    /// `pool/alloc`.
    pub uri: String,
    pub resources: String,
    pub tokens: Vec<HeldTokens>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct App {
    pub id: String,
    pub queue: String,
    /// The placement rule that chose the queue (e.g. `user (create) under fixed root.users`);
    /// none when the application named it.
    #[serde(default)]
    pub queue_rule: Option<String>,
    pub user: String,
    #[serde(default)]
    pub user_groups: Vec<String>,
    pub tags: BTreeMap<String, String>,
    /// New, Accepted (nothing placed yet), Reserving (waiting for its gang to be reserved),
    /// Running (something placed, or its gang reserved), Resuming, Completing, Completed,
    /// Failing, Failed, Rejected.
    pub state: String,
    pub task_groups: Vec<TaskGroup>,
    pub policy: SchedulingPolicy,
    #[serde(default)]
    pub priority: i32,
    /// The priority class it came from, if any.
    #[serde(default)]
    pub priority_class: Option<String>,
    /// Its tasks by state.
    pub tasks: BTreeMap<String, u64>,
    pub placeholders: Vec<Placeholder>,
    /// While its gang waits for the tasks it preempted to end: for each member of its gang (group
    /// by group), the pool whose room is held for it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held_on: Vec<String>,
    /// While a placeholder waits for a task to take it over: the time left before the
    /// placeholder timeout.
    pub placeholders_expire_in_ms: Option<u64>,
    /// Why it waits, while it does.
    pub waiting: Option<Waiting>,
    /// Why it ended, when not by its tasks (e.g. `ResourceReservationTimeout`, `removed`).
    pub reason: Option<String>,
    /// How long ago it was submitted (the daemon's clock).
    #[serde(default)]
    pub submitted_ms_ago: u64,
    /// When it was submitted (RFC 3339, UTC, milliseconds), by the daemon's wall clock
    /// [YuniKorn's `submissionTime`]; in a watch event, by the store's clock as its `at_ms`.
    #[serde(default)]
    pub submitted_at: String,
    /// When it ended (Completed, Failed, Rejected), if it has.
    #[serde(default)]
    pub ended_at: Option<String>,
    /// Only in the answer to its removal: what the removal ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released: Option<Released>,
}

/// What removing an application ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Released {
    /// The tasks that had not ended, now Killed.
    pub tasks_killed: Vec<String>,
    /// The placements released: the allocs of its placed tasks and unused placeholders, with
    /// their tokens.
    pub placements: Vec<Placement>,
    /// The resources of those allocs, summed.
    pub resources: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SubmitAppResponse {
    pub created: bool,
    pub app: App,
    /// The tasks submitted with it.
    pub tasks: Vec<Task>,
}

/// The order of `GET /v1/apps`: by id (the default), by submission or by end (`-` first: the
/// newest first). By end, the applications that have not ended come last.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum AppSort {
    #[default]
    #[serde(rename = "id")]
    Id,
    #[serde(rename = "submitted")]
    Submitted,
    #[serde(rename = "-submitted")]
    SubmittedNewestFirst,
    #[serde(rename = "ended")]
    Ended,
    #[serde(rename = "-ended")]
    EndedNewestFirst,
}

impl AppSort {
    /// The query parameter's value.
    pub fn as_str(self) -> &'static str {
        match self {
            AppSort::Id => "id",
            AppSort::Submitted => "submitted",
            AppSort::SubmittedNewestFirst => "-submitted",
            AppSort::Ended => "ended",
            AppSort::EndedNewestFirst => "-ended",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AppList {
    pub apps: Vec<App>,
    #[serde(default)]
    pub next_cursor: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Task {
    pub app: String,
    pub id: String,
    /// The number the scheduler gave the task when it was added, in the order tasks are added:
    /// a task removed and added again under the same id has another (its run starts afresh).
    #[serde(default)]
    pub seq: u64,
    /// New, Pending, Scheduling, Allocated, Running, Completed, Failed, Killed, Rejected.
    pub state: String,
    pub resources: String,
    pub tokens: Vec<TokenNeed>,
    pub group: Option<String>,
    pub priority: i32,
    /// The priority class it came from (its own, or its application's), if any.
    #[serde(default)]
    pub priority_class: Option<String>,
    #[serde(default = "yes")]
    pub preemptable: bool,
    /// How many times it was preempted.
    #[serde(default)]
    pub preemptions: u32,
    /// While it is being preempted: for whom and why.
    #[serde(default)]
    pub preempting: Option<Preempting>,
    /// While room is held for it on a pool (the tasks it preempted are ending): the pool.
    #[serde(default)]
    pub held_on: Option<String>,
    pub selector: BTreeMap<String, String>,
    #[schema(value_type = Option<Object>)]
    pub spec: Option<serde_json::Value>,
    /// Where it is placed (kept after it ends: where it ran).
    pub placement: Option<Placement>,
    pub waiting: Option<Waiting>,
    pub reason: Option<String>,
}

fn yes() -> bool {
    true
}

/// A placed task being preempted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Preempting {
    /// The task it is preempted for, `app/task`; `null` when its pool preempts it (drained, or
    /// shrunk below what is placed there).
    #[serde(default)]
    pub by: Option<String>,
    pub reason: String,
    /// How long ago it was chosen (the daemon's clock).
    pub since_ms_ago: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AddTaskResponse {
    pub created: bool,
    pub task: Task,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TaskList {
    pub tasks: Vec<Task>,
    #[serde(default)]
    pub next_cursor: Option<String>,
}

/// `POST .../fail`: why it failed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Fail {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// How a reported task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TaskOutcome {
    Completed,
    Failed,
    /// Its executor ended a task being preempted (`preempting`): it waits to be placed again.
    Preempted,
}

/// One task's end in `POST /v1/tasks/finish`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskEnd {
    pub app: String,
    pub task: String,
    pub outcome: TaskOutcome,
    /// Why it failed (only with `failed`; default "reported failed").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `POST /v1/tasks/finish`: how several tasks ended, reported in one call (an executor's
/// reports of the tasks that ended since its last call), committed as one change.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FinishTasks {
    /// At most 1,000.
    pub tasks: Vec<TaskEnd>,
}

/// The answer to one report of `POST /v1/tasks/finish`: the task as it now is, or why the
/// report was refused (the error `POST .../complete` or `.../fail` would have answered).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TaskEndAnswer {
    pub app: String,
    pub task: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<Task>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<crate::ErrorDetail>,
}

/// The answer of `POST /v1/tasks/finish`: one per report, in the order reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FinishedTasks {
    pub tasks: Vec<TaskEndAnswer>,
}
