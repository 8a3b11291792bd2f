//! The scheduler of applications (YuniKorn's part): applications of tasks in hierarchical
//! queues, placed as allocs on the pools and grants of the token quotas, gangs reserved all or
//! nothing by placeholders.
//!
//! [`Scheduler`] holds every queue, application and task, with the one state of each (the
//! machines of [`crate::apps::states`]). Every operation takes `now` and the pools and ledger it places
//! on, and returns an [`Outcome`]: the changes of all three for the store to make durable in one
//! commit. Nothing here does I/O or reads a clock; alloc ids come from the caller.
//!
//! At length, as one thing: the operations that change the scheduler's state and keep its
//! counts, pending sets and usage true together; the cycle, the checks of what is submitted and
//! why something waits are modules of their own.
//!
//! Invariants (checked by [`Scheduler::check_invariants`] in tests):
//! - a task holds a placement (an alloc and its grants) iff it is Allocated or Running; a slot
//!   (a gang's placeholder) holds one until a task takes it over or it is released;
//! - nothing is held in part: a placement's alloc and all its grants are taken in one step, and
//!   a gang's slots all together, after checking that everything can be had;
//! - the usage of every queue equals the sum of what the placements of its applications hold.

pub mod admission;
mod cycle;
pub mod order;
pub mod placement;
pub mod priority;
pub mod queues;
pub mod runners;
pub mod spec;
pub mod states;
pub mod why;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use foldhash::{HashMap, HashMapExt};

pub use cycle::CycleReport;
pub use order::{AppOrder, AppPlace};
pub use runners::{Runner, Runners, TaskTypes, EVERY_TYPE};
pub use spec::{
    AppId, AppSpec, GangStyle, GroupName, QueueRule, SchedulingPolicy, TaskGroup, TaskId, TaskSpec, TokenNeed,
};
pub use why::{NeverFits, Why};

use crate::access::Tenancy;
use crate::apps::priority::PriorityClasses;
use crate::apps::queues::{limit_at, QueueError, QueueLimits, QueuePath, QueueUsage, Queues};
use crate::apps::states::{AppEvent, AppState, IllegalTransition, TaskEvent, TaskState};
use crate::names::{NamespaceName, Token};
use crate::pools::{AllocId, Labels, PoolChange, PoolName, Pools};
use crate::quotas::{Effects, Ledger, Millis};
use crate::resources::{Resources, SizeWeights};

/// The reason a Hard gang fails with when its placeholders or its reservation time out.
pub const RESERVATION_TIMEOUT: &str = "ResourceReservationTimeout";
/// YuniKorn's completing timeout: an application whose tasks have all ended waits this long for
/// new ones before it is Completed.
pub const DEFAULT_COMPLETING_GRACE_MS: u64 = 30_000;
/// How long an ended application stays readable by default: an hour.
pub const DEFAULT_RETENTION_MS: u64 = 3_600_000;
/// How long an application with a task that can never fit waits (for pools or quotas to grow
/// back) before it fails, by default: five minutes.
pub const DEFAULT_NEVER_FITS_GRACE_MS: u64 = 300_000;

/// How long a preempted task's executor has to end it, by default (Kubernetes' termination
/// grace).
pub const DEFAULT_PREEMPTION_GRACE_MS: u64 = 30_000;
/// How the reason a task waits again after its preemption begins (`preempted for app/task: ...`,
/// or `preempted: ...` when its pool preempted it).
pub const PREEMPTED_REASON_PREFIX: &str = "preempted";
/// How long a task waits before it may preempt, by default [YuniKorn `preemption.delay`].
pub const DEFAULT_PREEMPTION_DELAY_MS: u64 = 30_000;
/// How many times a task may be preempted before it is protected, by default.
pub const DEFAULT_MAX_PREEMPTIONS: u32 = 3;

/// Why the scheduler refuses a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedError {
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error("application `{0}` does not exist")]
    AppNotFound(AppId),
    #[error("task `{task}` of application `{app}` does not exist")]
    TaskNotFound { app: AppId, task: TaskId },
    #[error("application `{id}` already exists with a different {field}; remove it first or use another id")]
    AppConflict { id: AppId, field: &'static str },
    #[error("task `{task}` of application `{app}` already exists with a different {field}; remove it first or use another id")]
    TaskConflict { app: AppId, task: TaskId, field: &'static str },
    #[error("application `{id}` has ended ({state}); it takes no more tasks")]
    AppEnded { id: AppId, state: AppState },
    #[error("task `{task}` of application `{app}` is not being preempted: report how it ended instead")]
    NotPreempting { app: AppId, task: TaskId },
    #[error("priority class `{class}` does not exist; {known}")]
    UnknownPriorityClass { class: String, known: String },
    #[error("task group `{group}` is given twice, with different content")]
    GroupConflict { group: GroupName },
    #[error("task `{task}` names task group `{group}`, which application `{app}` does not have")]
    UnknownGroup { app: AppId, task: TaskId, group: GroupName },
    #[error("task `{task}` is larger than a member of task group `{group}`: {what}")]
    LargerThanGroup { task: TaskId, group: GroupName, what: String },
    #[error("task group `{group}` can never be placed: no pool {pools} can hold a member ({wanted})")]
    GroupNeverFits { group: GroupName, wanted: Resources, pools: String },
    #[error("the gang can never be placed: {0}")]
    GangExceedsQueue(String),
    #[error("the gang can never be placed: its placeholders need {units} units of token namespace `{namespace}`, whose quota is {quota}")]
    GangExceedsQuota { namespace: NamespaceName, units: u64, quota: u64 },
    #[error("token namespace `{0}` does not exist")]
    NamespaceNotFound(NamespaceName),
    /// What a task asks for can never be had as things are: it is refused, not left waiting.
    #[error("task `{task}` can never be placed: {why}")]
    NeverFits { task: TaskId, why: NeverFits },
    #[error("queue `{queue}` still has {apps} applications that have not ended; remove them first")]
    QueueInUse { queue: QueuePath, apps: usize },
    #[error(transparent)]
    Illegal(#[from] IllegalTransition),
}

/// Tokens a placement holds in one namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldTokens {
    pub namespace: NamespaceName,
    pub token: Token,
    pub units: u64,
}

/// Where a task or placeholder is placed: one alloc and its grants, taken together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub pool: PoolName,
    pub alloc: AllocId,
    pub resources: Resources,
    pub grants: Vec<HeldTokens>,
    pub at: Millis,
}

/// One placeholder of a reserved gang: a member's placement, until a task of its group takes it
/// over (in place: same alloc, same grants).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub group: GroupName,
    pub member: u32,
    pub placement: Placement,
    pub task: Option<TaskId>,
}

/// An application and its one state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct App {
    pub spec: AppSpec,
    pub state: AppState,
    /// Submission order, for FIFO.
    pub seq: u64,
    pub submitted: Millis,
    /// When its gang was reserved: the placeholder timeout runs from here.
    pub reserved_at: Option<Millis>,
    /// The placeholders not yet released (taken over or not).
    pub slots: Vec<Slot>,
    /// A Soft gang that timed out before reserving runs as an ordinary application.
    pub gang_given_up: bool,
    /// Counted in its queues' running applications (from its first placement until it ends).
    pub counted: bool,
    /// Since when every task has ended (Completing).
    pub completing_since: Option<Millis>,
    /// Why it failed or completed, when not by its tasks.
    pub reason: Option<String>,
    /// When it ended: it is forgotten [`SchedConfig::retention_ms`] later.
    pub ended_at: Option<Millis>,
    /// While its gang waits for the tasks it preempted to end: for each member of its gang (in
    /// [`App::gang_members`]' order), the pool whose room is held for it. Empty when nothing is
    /// held; meaningless once its gang no longer waits (the scheduler then ignores it).
    pub held: Vec<PoolName>,
    /// When its gang was last taken back whole by preemption: it is reserved again, its reserve
    /// timeout and its own preemption delay counted from then.
    pub gang_preempted_at: Option<Millis>,
}

/// A member of a gang as it is reserved: its group, its number, what it holds, its group's
/// selector and token needs.
pub type GangMember = (GroupName, u32, Resources, Labels, Vec<TokenNeed>);

impl App {
    /// Every placeholder its gang reserves, group by group.
    pub fn gang_members(&self) -> Vec<GangMember> {
        self.spec
            .groups
            .iter()
            .flat_map(|g| {
                (0..g.min_members)
                    .map(|m| (g.name.clone(), m, g.min_resources.clone(), g.selector.clone(), g.tokens.clone()))
            })
            .collect()
    }

    /// True while it waits for its gang to be reserved (Reserving): nothing of it is placed
    /// before.
    pub fn awaits_gang(&self) -> bool {
        self.state == AppState::Reserving && !self.spec.groups.is_empty() && !self.gang_given_up
    }

    /// Placeholders no task has taken over.
    pub fn free_slots(&self) -> usize {
        self.slots.iter().filter(|s| s.task.is_none()).count()
    }

    /// True while its gang is reserved and some placeholder waits for a task to take it over:
    /// the placeholder timeout runs.
    pub fn holds_free_slots(&self) -> bool {
        self.reserved_at.is_some() && !self.state.is_terminal() && self.free_slots() > 0
    }

    fn reserve_deadline(&self) -> Option<Millis> {
        let timeout = self.spec.policy.reserve_timeout_ms?;
        self.awaits_gang().then(|| spec::after(self.reserving_since(), timeout))
    }

    /// Since when it waits for its gang to be reserved: its submission, or the last time its
    /// gang was taken back by preemption.
    pub fn reserving_since(&self) -> Millis {
        self.submitted.max(self.gang_preempted_at.unwrap_or(0))
    }

    fn placeholder_deadline(&self) -> Option<Millis> {
        let reserved = self.reserved_at?;
        self.holds_free_slots().then(|| spec::after(reserved, self.spec.policy.placeholder_timeout_ms))
    }
}

/// A task and its one state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    pub app: AppId,
    pub spec: TaskSpec,
    pub state: TaskState,
    /// Order of adding, after priority.
    pub seq: u64,
    pub added: Millis,
    /// Where it is placed (kept after it ends, to say where it ran).
    pub placement: Option<Placement>,
    /// The member slot of its group it took over, if it did.
    pub slot: Option<u32>,
    pub reason: Option<String>,
    /// How many times it was preempted; at `max_preemptions` it is not taken again.
    pub preemptions: u32,
    /// When it was last preempted: it may not preempt before its queue's delay has passed since.
    pub preempted_at: Option<Millis>,
    /// Placed, and being preempted for another task: its executor ends its attempt, else the
    /// scheduler takes it back once the grace is over.
    pub preempting: Option<Preempting>,
    /// Pending, with room on this pool held for it while the tasks it preempted end: no other
    /// task is placed into that room.
    pub held: Option<PoolName>,
}

/// A placed task being preempted: for whom (none when its pool is drained or shrank), since
/// when, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preempting {
    pub by: Option<(AppId, TaskId)>,
    pub at: Millis,
    pub reason: String,
}

/// What a submission answers: the application, whether it is new, each task with whether it is
/// new, and the changes to commit.
pub type Submission = (App, bool, Vec<(Task, bool)>, Outcome);

/// The reason an application or task ended by its removal carries.
pub const REMOVED: &str = "removed";

/// What a removed application became: its last record, its tasks by end state, and what its
/// removal ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removed {
    pub app: App,
    pub tasks: BTreeMap<TaskState, u64>,
    pub released: Released,
}

/// What removing an application ended: the tasks it killed, and the placements (allocs with
/// their grants) it released.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Released {
    pub tasks_killed: Vec<TaskId>,
    pub placements: Vec<Placement>,
}

/// A record the store must make durable, in order, with the pool and ledger changes of the same
/// operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppChange {
    Queue {
        path: QueuePath,
        limits: QueueLimits,
    },
    QueueRemoved {
        path: QueuePath,
    },
    App(App),
    /// The application and all its tasks are gone.
    AppRemoved {
        id: AppId,
    },
    Task(Task),
    TaskRemoved {
        app: AppId,
        task: TaskId,
    },
}

/// How a task ended, as its executor reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskEnd {
    pub app: AppId,
    pub task: TaskId,
    pub ending: TaskEnding,
}

/// How a task's attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskEnding {
    Completed,
    Failed(String),
    /// Its executor ended it because it is being preempted: it waits to be placed again.
    Preempted,
}

impl TaskEnding {
    /// Completed, or failed for `reason`.
    pub fn of(failed: Option<String>) -> TaskEnding {
        failed.map_or(TaskEnding::Completed, TaskEnding::Failed)
    }
}

/// Everything an operation changed, for one commit.
#[derive(Debug, Default)]
pub struct Outcome {
    pub apps: Vec<AppChange>,
    pub pools: Vec<PoolChange>,
    pub ledger: Effects,
    /// Invariants found broken while deciding (an application that should exist does not, a
    /// state that should take an event does not). Never expected; when not empty the state in
    /// memory may be half-changed, and a store must commit none of it and refuse every change
    /// until it is restarted from its log.
    pub broken: Vec<String>,
}

impl Outcome {
    /// Takes `other`'s changes after its own (two operations committed as one).
    pub fn absorb(&mut self, other: Outcome) {
        self.apps.extend(other.apps);
        self.pools.extend(other.pools);
        self.broken.extend(other.broken);
        self.ledger(other.ledger);
    }

    fn ledger(&mut self, effects: Effects) {
        self.ledger.changes.extend(effects.changes);
        self.ledger.woken.extend(effects.woken);
        self.ledger.cancelled.extend(effects.cancelled);
        self.ledger.expired += effects.expired;
    }

    pub fn is_empty(&self) -> bool {
        self.apps.is_empty() && self.pools.is_empty() && self.ledger.is_empty()
    }
}

/// What the pools and the ledger are, for an operation that places or releases.
/// Where an application's use is counted: its queue and every queue above, its user, and its
/// user's primary group (see [`queues::Owner`]).
pub(crate) struct Account {
    queue: QueuePath,
    user: String,
    group: Option<String>,
}

impl Account {
    pub(crate) fn of(spec: &AppSpec) -> Account {
        let owner = spec.owner();
        Account { queue: spec.queue.clone(), user: owner.user.to_owned(), group: owner.group.map(str::to_owned) }
    }
}

pub struct World<'a> {
    pub pools: &'a mut Pools,
    pub ledger: &'a mut Ledger,
}

/// Counters since the daemon started, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedStats {
    pub cycles: u64,
    pub placements: u64,
    pub reservations: u64,
    pub takeovers: u64,
    pub placeholder_timeouts: u64,
    pub reserve_timeouts: u64,
    /// Preemptions decided (a preemptor and its victims), and victims taken back.
    pub preemption_decisions: u64,
    pub preemptions: u64,
}

/// Settings of the scheduler.
#[derive(Debug, Clone)]
pub struct SchedConfig {
    pub completing_grace_ms: u64,
    /// How long an ended application (and its tasks) stays readable before it is forgotten.
    pub retention_ms: u64,
    /// Best fit orders pools by the weighted size of what is free.
    pub weights: SizeWeights,
    /// What an application's user may be given: checked at every placement (roles and bindings
    /// change after a submission). Not recorded: the daemon that schedules sets it.
    pub tenancy: Tenancy,
    /// How long an application waits once a task of it can never fit before it fails.
    pub never_fits_grace_ms: u64,
    /// The named priorities applications and tasks may ask for, resolved when they are added.
    pub priority_classes: PriorityClasses,
    /// Whether the scheduler preempts at all (queues may turn it off for themselves).
    pub preemption: bool,
    /// How long a preempted task's executor has to end its attempt before the scheduler takes
    /// its placement back itself.
    pub preemption_grace_ms: u64,
    /// A task preempted this many times is not taken again [issue 42: no loops].
    pub max_preemptions: u32,
}

impl Default for SchedConfig {
    fn default() -> SchedConfig {
        SchedConfig {
            completing_grace_ms: DEFAULT_COMPLETING_GRACE_MS,
            retention_ms: DEFAULT_RETENTION_MS,
            weights: SizeWeights::default(),
            tenancy: Tenancy::Open,
            never_fits_grace_ms: DEFAULT_NEVER_FITS_GRACE_MS,
            priority_classes: PriorityClasses::default(),
            preemption: true,
            preemption_grace_ms: DEFAULT_PREEMPTION_GRACE_MS,
            max_preemptions: DEFAULT_MAX_PREEMPTIONS,
        }
    }
}

/// A pending task's place in its application: higher priority first, then order of adding.
type PendingKey = (Reverse<i32>, u64, TaskId);

/// A queue with its limits, what it uses and what waits in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueView {
    pub path: QueuePath,
    pub limits: QueueLimits,
    pub usage: QueueUsage,
    pub leaf: bool,
    /// Live applications in it (or under it) that have not ended.
    pub apps: u64,
    pub pending_tasks: u64,
    /// Waiting applications and tasks by what holds them (`Why::code`; a task's own reason, or
    /// its application's).
    pub waiting: BTreeMap<&'static str, u64>,
}

/// Every queue, application and task, and the decisions over them.
#[derive(Debug, Default, Clone)]
pub struct Scheduler {
    config: SchedConfig,
    queues: Queues,
    apps: BTreeMap<AppId, App>,
    tasks: HashMap<AppId, BTreeMap<TaskId, Task>>,
    /// The Pending tasks of each application, in the order they are placed.
    pending: HashMap<AppId, BTreeSet<PendingKey>>,
    /// Each application's tasks by state, kept with every change (reads do not walk the tasks).
    counts: HashMap<AppId, BTreeMap<TaskState, u64>>,
    usage: HashMap<QueuePath, QueueUsage>,
    next_seq: u64,
    why_app: HashMap<AppId, Why>,
    why_task: HashMap<(AppId, TaskId), Why>,
    /// The shapes of each application that found no place in the last cycle: its other pending
    /// tasks of those shapes were passed over (`cycle::alike`). Not recorded.
    failed_shapes: cycle::FailedShapes,
    /// The shapes of each application's pending tasks, worked out when a cycle needs them and
    /// dropped whenever they may change (a pending task added, placed, ended or given held
    /// room): with them a cycle passes over an application whose every shape failed without
    /// looking at its tasks. Not recorded.
    pending_shapes: cycle::PendingShapesOf,
    stats: SchedStats,
    /// Pools whose executors stopped: nothing is placed on them until they are back. Not
    /// recorded: whoever schedules learns it again from the executors' leases.
    down: BTreeSet<PoolName>,
    /// Which pools live executors run, with which task types. Not recorded, as `down`.
    runners: Runners,
    /// The last cycle's room, for the next: dropped whenever `config`, `down` or `runners`
    /// change. Not recorded.
    kept_room: cycle::KeptRoom,
    /// Each task's type, read from its spec once (at insert or restore), not at every placement.
    task_types: HashMap<AppId, HashMap<TaskId, Option<String>>>,
    /// Applications with a task that can never fit, since when (the last cycle that looked at
    /// them said so). Not recorded: after a restart their grace starts again.
    never_fits: HashMap<AppId, (Millis, String)>,
    /// The tasks being preempted, for whom and since when: an index of `Task::preempting`,
    /// rebuilt at restore. An entry whose task no longer says so is stale and dropped when met.
    victims: BTreeMap<TaskKey, (Option<TaskKey>, Millis)>,
    /// The pending tasks with room held for them: an index of `Task::held`, kept as `victims`.
    holders: BTreeMap<(AppId, TaskId), PoolName>,
    /// The applications whose gangs have room held for them: an index of `App::held`, kept as
    /// `victims`.
    gang_holders: BTreeSet<AppId>,
    /// The earliest time a task that found no room may preempt (its queue's delay), as the last
    /// cycle saw it: the scheduler runs a cycle then.
    next_preemption: Option<Millis>,
    /// The earliest drain of a pool not due yet, as the last timers saw it.
    next_drain: Option<Millis>,
}

/// A task by its application and id.
type TaskKey = (AppId, TaskId);

fn pending_key(task: &Task) -> PendingKey {
    (Reverse(task.spec.priority.value()), task.seq, task.spec.id.clone())
}

fn transition(app: &mut App, events: &[AppEvent]) -> Result<(), IllegalTransition> {
    for event in events {
        app.state = app.state.on(*event)?;
    }
    Ok(())
}

/// The state a task's `state` takes with `events`, which it takes by the caller's logic; when it
/// does not, `state` unchanged and `out` says the scheduler is inconsistent.
fn task_known(state: TaskState, events: &[TaskEvent], out: &mut Outcome) -> TaskState {
    let mut next = state;
    for event in events {
        match next.on(*event) {
            Ok(to) => next = to,
            Err(err) => {
                out.broken.push(err.to_string());
                return state;
            }
        }
    }
    next
}

/// Takes `events` that the application's state takes by the caller's logic; when it does not,
/// the scheduler is inconsistent and `out` says so (see [`Outcome::broken`]).
fn transition_known(app: &mut App, events: &[AppEvent], out: &mut Outcome) -> bool {
    match transition(app, events) {
        Ok(()) => true,
        Err(err) => {
            out.broken.push(format!("application `{}`: {err}", app.spec.id));
            false
        }
    }
}

impl Scheduler {
    pub fn new(config: SchedConfig) -> Scheduler {
        Scheduler { config, ..Scheduler::default() }
    }

    /// Rebuilds the scheduler from durable records: usage from the placements, the pending sets
    /// from the tasks' states. Timers go on from the deadlines in the records (the store's clock
    /// continues across restarts).
    pub fn restore(
        config: SchedConfig,
        queues: Vec<(QueuePath, QueueLimits)>,
        apps: Vec<App>,
        tasks: impl IntoIterator<Item = Task>,
    ) -> Scheduler {
        let mut restored = Scheduler::new(config);
        for (path, limits) in queues {
            restored.queues.put(path, limits);
        }
        for mut app in apps {
            app.state = current_state(&app);
            restored.next_seq = restored.next_seq.max(app.seq + 1);
            if app.counted {
                restored.count_app(&Account::of(&app.spec), true);
            }
            for slot in app.slots.iter().filter(|s| s.task.is_none()) {
                restored.charge(&Account::of(&app.spec), &slot.placement.resources, true);
            }
            if !app.held.is_empty() {
                restored.gang_holders.insert(app.spec.id.clone());
            }
            restored.apps.insert(app.spec.id.clone(), app);
        }
        // Taken in runs of one application's tasks (the stores read them in that order), each
        // run's maps built at once rather than task by task.
        let mut run: Vec<Task> = Vec::new();
        for task in tasks {
            if run.last().is_some_and(|last| last.app != task.app) {
                restored.restore_run(std::mem::take(&mut run));
            }
            run.push(task);
        }
        restored.restore_run(run);
        restored
    }

    /// Restores tasks of one application (see `restore`); those of an application not restored
    /// are dropped.
    fn restore_run(&mut self, run: Vec<Task>) {
        let Some(app_id) = run.first().map(|task| task.app.clone()) else { return };
        let Some(app) = self.apps.get(&app_id) else { return };
        let account = Account::of(&app.spec);
        let mut pending = Vec::new();
        let mut types = Vec::with_capacity(run.len());
        for task in &run {
            self.next_seq = self.next_seq.max(task.seq + 1);
            if matches!(task.state, TaskState::Allocated | TaskState::Running) {
                if let Some(placement) = &task.placement {
                    self.charge(&account, &placement.resources, true);
                }
            }
            if task.state == TaskState::Pending {
                pending.push(pending_key(task));
            }
            self.count(&app_id, None, Some(task.state));
            types.push((task.spec.id.clone(), task.spec.task_type()));
            self.index_preemption(task);
        }
        self.pending.entry(app_id.clone()).or_default().extend(pending);
        self.task_types.entry(app_id.clone()).or_default().extend(types);
        let tasks: BTreeMap<TaskId, Task> = run.into_iter().map(|task| (task.spec.id.clone(), task)).collect();
        match self.tasks.get_mut(&app_id) {
            Some(known) => known.extend(tasks),
            None => {
                self.tasks.insert(app_id, tasks);
            }
        }
    }

    /// The daemon was down for `down` ms that its clock did not count (the embedded store's
    /// clock resumes where it stopped): the timers of applications (reserve and placeholder
    /// timeouts, the completing grace, the retention) count wall-clock time, so they count that
    /// time too, as YuniKorn's do. Moves their starting points back by `down`; answers the
    /// records that changed.
    pub fn count_downtime(&mut self, down: Millis) -> Outcome {
        let mut out = Outcome::default();
        if down == 0 {
            return out;
        }
        let back = |at: &mut Millis| *at = at.saturating_sub(down);
        for app in self.apps.values_mut() {
            back(&mut app.submitted);
            app.reserved_at.as_mut().map(back);
            app.completing_since.as_mut().map(back);
            app.ended_at.as_mut().map(back);
            out.apps.push(AppChange::App(app.clone()));
        }
        out
    }

    pub fn config(&self) -> &SchedConfig {
        &self.config
    }

    pub fn set_config(&mut self, config: SchedConfig) {
        self.config = config;
        self.kept_room.drop_kept();
    }

    /// What applications may be given from now on (the next cycle places by it).
    pub fn set_tenancy(&mut self, tenancy: Tenancy) {
        self.config.tenancy = tenancy;
        self.kept_room.drop_kept();
    }

    pub fn runners(&self) -> &Runners {
        &self.runners
    }

    /// What the executors' leases say now. True if it changed (what waits may fit now).
    pub fn set_runners(&mut self, runners: Runners) -> bool {
        let changed = self.runners != runners;
        if changed {
            self.runners = runners;
            self.kept_room.drop_kept();
        }
        changed
    }

    /// True if some application or task waits to be placed (a cycle may place it once room or
    /// tokens are freed).
    pub fn has_waiting(&self) -> bool {
        self.pending.values().any(|p| !p.is_empty()) || self.apps.values().any(|a| a.awaits_gang())
    }

    pub fn stats(&self) -> SchedStats {
        self.stats
    }

    /// Takes over the counters of a scheduler this one was rebuilt from (they count since the
    /// daemon started; the records do not keep them).
    pub fn carry_stats(&mut self, stats: SchedStats) {
        self.stats = stats;
    }

    /// Every token namespace that an application's groups or a task not ended names: the ones
    /// whose room a cycle may ask about.
    pub fn namespaces_named(&self) -> BTreeSet<NamespaceName> {
        let groups = self.apps.values().filter(|a| !a.state.is_terminal()).flat_map(|a| a.spec.groups.iter());
        let tasks = self.tasks.values().flat_map(|t| t.values()).filter(|t| !t.state.is_terminal());
        groups
            .flat_map(|g| g.tokens.iter())
            .chain(tasks.flat_map(|t| t.spec.tokens.iter()))
            .map(|need| need.namespace.clone())
            .collect()
    }

    /// Every live placement: of the placed (Allocated or Running) tasks and of the unused
    /// placeholders, one per alloc. This is all the scheduler holds in the pools and the token
    /// namespaces; a store that carries them out elsewhere (Redis) rebuilds its view from it.
    pub fn live_placements(&self) -> Vec<&Placement> {
        let slots = self.apps.values().flat_map(|app| app.slots.iter().filter(|s| s.task.is_none()));
        let tasks = self
            .tasks
            .values()
            .flat_map(|tasks| tasks.values())
            .filter(|t| matches!(t.state, TaskState::Allocated | TaskState::Running));
        slots.map(|s| &s.placement).chain(tasks.filter_map(|t| t.placement.as_ref())).collect()
    }

    // ---- queues ----

    /// Creates or changes a queue (its parents are made with no limits). A changed limit counts
    /// from the next placement; lowering one ends nothing. Refused when a queue above it holds
    /// applications (it would stop being a leaf), or when its limits contradict themselves or
    /// the queues around it ([`Queues::check_limits`]).
    pub fn put_queue(&mut self, path: QueuePath, limits: QueueLimits) -> Result<(bool, Outcome), SchedError> {
        if self.queues.get(&path).is_none() {
            self.check_creatable(&path)?;
        }
        self.queues.check_limits(&path, &limits)?;
        Ok(self.put_queue_unchecked(path, limits))
    }

    fn put_queue_unchecked(&mut self, path: QueuePath, limits: QueueLimits) -> (bool, Outcome) {
        let mut out = Outcome::default();
        for ancestor in path.up_to_root().skip(1) {
            if self.queues.get(&ancestor).is_none() {
                out.apps.push(AppChange::Queue { path: ancestor, limits: QueueLimits::default() });
            }
        }
        let created = self.queues.put(path.clone(), limits.clone());
        out.apps.push(AppChange::Queue { path, limits });
        (created, out)
    }

    /// Removes a leaf queue in which no application lives.
    pub fn remove_queue(&mut self, path: &QueuePath) -> Result<Outcome, SchedError> {
        let apps = self.apps.values().filter(|a| &a.spec.queue == path && !a.state.is_terminal()).count();
        if apps > 0 {
            return Err(SchedError::QueueInUse { queue: path.clone(), apps });
        }
        self.queues.remove(path)?;
        Ok(Outcome { apps: vec![AppChange::QueueRemoved { path: path.clone() }], ..Outcome::default() })
    }

    pub fn queue(&self, path: &QueuePath) -> Result<QueueView, SchedError> {
        let limits = self.queues.get(path).ok_or_else(|| QueueError::NotFound(path.clone()))?;
        Ok(self.queue_view(path, limits))
    }

    /// The queue tree itself: paths and limits, without what each queue holds (a cheap read
    /// for checks that need only those, such as ACLs and placement rules).
    pub fn queue_tree(&self) -> Queues {
        self.queues.clone()
    }

    /// Every queue, in path order.
    pub fn queues(&self) -> Vec<QueueView> {
        self.queues.iter().map(|(path, limits)| self.queue_view(path, limits)).collect()
    }

    fn queue_view(&self, path: &QueuePath, limits: &QueueLimits) -> QueueView {
        let under = |app: &App| app.spec.queue == *path || app.spec.queue.up_to_root().any(|q| q == *path);
        let live: Vec<&App> = self.apps.values().filter(|a| !a.state.is_terminal() && under(a)).collect();
        let pending_tasks = live.iter().map(|a| self.pending.get(&a.spec.id).map_or(0, |p| p.len() as u64)).sum();
        let mut waiting = BTreeMap::new();
        for app in &live {
            let id = &app.spec.id;
            if let Some(why) = self.app_why(id) {
                *waiting.entry(why.code()).or_default() += 1;
            }
            for key in self.pending.get(id).into_iter().flatten() {
                if let Some(why) = self.task_why(id, &key.2) {
                    *waiting.entry(why.code()).or_default() += 1;
                }
            }
        }
        QueueView {
            path: path.clone(),
            limits: limits.clone(),
            usage: self.usage.get(path).cloned().unwrap_or_default(),
            leaf: self.queues.children(path).next().is_none(),
            apps: live.len() as u64,
            pending_tasks,
            waiting,
        }
    }

    // ---- applications ----

    /// Adds an application [YuniKorn `AddApplication`]. The same content again answers the
    /// application (`false`); other content under the same id is a conflict. A gang that can
    /// never be placed (a group larger than every matching pool, or larger than its queue's
    /// maximum) is refused here, not left waiting.
    pub fn add_app(
        &mut self,
        spec: AppSpec,
        now: Millis,
        world: &World<'_>,
    ) -> Result<(App, bool, Outcome), SchedError> {
        Ok(match self.admit_app(spec, now, world)? {
            (app, false) => (app, false, Outcome::default()),
            (app, true) => {
                let out = self.insert_app(app.clone());
                (app, true, out)
            }
        })
    }

    /// Submits an application with its tasks, all or nothing: everything is checked before
    /// anything changes, so a refused submission (of the application or of any of its tasks)
    /// leaves nothing behind. The same submission again answers what exists (`false`); new
    /// tasks of an existing application are added.
    pub fn submit(
        &mut self,
        spec: AppSpec,
        tasks: Vec<TaskSpec>,
        now: Millis,
        world: &World<'_>,
    ) -> Result<Submission, SchedError> {
        let (app, created) = self.admit_app(spec, now, world)?;
        let mut checked: Vec<(TaskSpec, Option<Task>)> = Vec::with_capacity(tasks.len());
        let mut in_batch: HashMap<TaskId, usize> = HashMap::new();
        for spec in tasks {
            let spec = self.resolve_priority(&app, spec)?;
            // A task given twice in one submission: the second is the first again, or a conflict.
            if let Some(&first) = in_batch.get(&spec.id) {
                let field = task_conflict(&checked[first].0, &spec);
                if let Some(field) = field {
                    return Err(SchedError::TaskConflict { app: app.spec.id.clone(), task: spec.id, field });
                }
                continue;
            }
            let existing = if created { None } else { self.tasks.get(&app.spec.id).and_then(|t| t.get(&spec.id)) };
            let admitted = match existing {
                Some(existing) => match task_conflict(&existing.spec, &spec) {
                    Some(field) => {
                        return Err(SchedError::TaskConflict { app: app.spec.id.clone(), task: spec.id, field })
                    }
                    None => (existing.spec.clone(), Some(existing.clone())),
                },
                None => (self.check_new_task(&app, spec, world)?, None),
            };
            in_batch.insert(admitted.0.id.clone(), checked.len());
            checked.push(admitted);
        }
        let app_id = app.spec.id.clone();
        let mut out = if created { self.insert_app(app) } else { Outcome::default() };
        out.apps.reserve(checked.len());
        let mut added = Vec::with_capacity(checked.len());
        for (spec, existing) in checked {
            match existing {
                Some(task) => added.push((task, false)),
                None => {
                    let (task, changes) = self.insert_task(&app_id, spec, now);
                    out.absorb(changes);
                    added.push((task, true));
                }
            }
        }
        Ok((self.apps[&app_id].clone(), created, added, out))
    }

    /// Checks an application as [`Scheduler::add_app`] does and makes its record (Accepted, or
    /// Reserving with a gang) without adding it; or answers the existing one (`false`).
    fn admit_app(&self, spec: AppSpec, now: Millis, world: &World<'_>) -> Result<(App, bool), SchedError> {
        let mut spec = spec.check()?;
        spec.priority = self.config.priority_classes.resolve(&spec.priority, None)?;
        if let Some(existing) = self.apps.get(&spec.id) {
            let field = [
                ("queue", existing.spec.queue != spec.queue),
                ("user", existing.spec.user != spec.user),
                ("tags", existing.spec.tags != spec.tags),
                ("task groups", existing.spec.groups != spec.groups),
                ("scheduling policy", existing.spec.policy != spec.policy),
                ("priority", existing.spec.priority != spec.priority),
            ]
            .into_iter()
            .find(|(_, differs)| *differs);
            return match field {
                Some((field, _)) => Err(SchedError::AppConflict { id: spec.id, field }),
                None => Ok((existing.clone(), false)),
            };
        }
        match &spec.queue_rule {
            Some(QueueRule { create: true, .. }) if self.queues.get(&spec.queue).is_none() => {
                self.check_creatable(&spec.queue)?
            }
            _ => {
                self.queues.leaf(&spec.queue)?;
            }
        }
        self.check_gang(&spec, world)?;
        let mut app = App {
            spec,
            state: AppState::New,
            seq: self.next_seq,
            submitted: now,
            reserved_at: None,
            slots: Vec::new(),
            gang_given_up: false,
            counted: false,
            completing_since: None,
            reason: None,
            ended_at: None,
            held: Vec::new(),
            gang_preempted_at: None,
        };
        transition(&mut app, &[AppEvent::Accept])?;
        if !app.spec.groups.is_empty() {
            transition(&mut app, &[AppEvent::Reserve])?;
        }
        Ok((app, true))
    }

    /// Adds an application [`Scheduler::admit_app`] made, first making its queue if a placement
    /// rule may create it and it is missing.
    fn insert_app(&mut self, app: App) -> Outcome {
        let mut out = Outcome::default();
        if self.queues.get(&app.spec.queue).is_none() {
            out = self.put_queue_unchecked(app.spec.queue.clone(), QueueLimits::default()).1;
        }
        self.next_seq = self.next_seq.max(app.seq + 1);
        self.apps.insert(app.spec.id.clone(), app.clone());
        out.apps.push(AppChange::App(app));
        out
    }

    /// Checks that a placement rule may make `queue` (with any missing parent): the nearest
    /// queue above it that exists holds no live application, as it becomes a parent.
    fn check_creatable(&self, queue: &QueuePath) -> Result<(), QueueError> {
        let existing = queue.up_to_root().skip(1).find(|q| self.queues.get(q).is_some());
        let leaf = existing.unwrap_or_else(QueuePath::root);
        let busy = self.apps.values().any(|a| a.spec.queue == leaf && !a.state.is_terminal());
        match busy {
            true => Err(QueueError::UnderBusyLeaf { queue: queue.clone(), leaf }),
            false => Ok(()),
        }
    }

    fn check_gang(&self, spec: &AppSpec, world: &World<'_>) -> Result<(), SchedError> {
        let mut total = Resources::new();
        let mut units: BTreeMap<&NamespaceName, u64> = BTreeMap::new();
        for group in &spec.groups {
            if !world.pools.could_ever_fit(&group.min_resources, &group.selector) {
                return Err(SchedError::GroupNeverFits {
                    group: group.name.clone(),
                    wanted: group.min_resources.clone(),
                    pools: pools_described(&group.selector),
                });
            }
            for need in &group.tokens {
                if world.ledger.room_for(&need.namespace, 0).is_err_and(|s| !s.exists) {
                    return Err(SchedError::NamespaceNotFound(need.namespace.clone()));
                }
                let sum = units.entry(&need.namespace).or_default();
                // Saturating: a sum past any quota never fits, and never wraps to one that does.
                *sum = sum.saturating_add(need.units.saturating_mul(u64::from(group.min_members)));
            }
            for _ in 0..group.min_members {
                total = total.checked_add(&group.min_resources).unwrap_or(total);
            }
        }
        if spec.groups.is_empty() {
            return Ok(());
        }
        for (namespace, units) in units {
            if let Some(NeverFits::Tokens { namespace, units, quota }) =
                world.ledger.room_for(namespace, units).err().and_then(|s| tokens_never_fit(&s))
            {
                return Err(SchedError::GangExceedsQuota { namespace, units, quota });
            }
        }
        let nothing = QueueUsage::default();
        for queue in spec.queue.up_to_root() {
            let Some(limits) = self.queues.get(&queue) else { continue };
            if let Some(limit) = limit_at(limits, &nothing, spec.owner(), &total, false) {
                let hit = crate::apps::queues::LimitHit { queue, limit };
                return Err(SchedError::GangExceedsQueue(format!("its placeholders hold {total}, and {hit}")));
            }
        }
        Ok(())
    }

    pub fn app(&self, id: &AppId) -> Result<&App, SchedError> {
        self.apps.get(id).ok_or_else(|| SchedError::AppNotFound(id.clone()))
    }

    /// At most `limit` applications whose ids come after `after`, in id order.
    pub fn apps_after(&self, after: Option<&AppId>, limit: usize) -> Vec<&App> {
        let from = after.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
        self.apps.range((from, std::ops::Bound::Unbounded)).take(limit).map(|(_, app)| app).collect()
    }

    /// How many of the application's tasks are in each state.
    pub fn task_counts(&self, id: &AppId) -> BTreeMap<TaskState, u64> {
        self.counts.get(id).cloned().unwrap_or_default()
    }

    /// Moves one of the application's tasks from one state (or none: added) to another (or none:
    /// removed) in the counts.
    fn count(&mut self, app: &AppId, from: Option<TaskState>, to: Option<TaskState>) {
        let counts = self.counts.entry(app.clone()).or_default();
        if let Some(from) = from {
            if let Some(n) = counts.get_mut(&from) {
                *n -= 1;
                if *n == 0 {
                    counts.remove(&from);
                }
            }
        }
        if let Some(to) = to {
            *counts.entry(to).or_default() += 1;
        }
    }

    /// Why a live application waits, from the last cycle that looked at it.
    pub fn app_why(&self, id: &AppId) -> Option<Why> {
        let app = self.apps.get(id)?;
        if app.holds_free_slots() {
            return Some(Why::GangMissing { missing: app.free_slots() as u32 });
        }
        self.why_app.get(id).cloned()
    }

    /// Removes an application [YuniKorn `RemoveApplication`]: every task that has not ended is
    /// Killed, every alloc and grant it holds is released, and its records are gone. The answer
    /// is what it became: an application that had not ended ends (Completed if it was completing,
    /// else Failed with the reason `removed`), with its tasks' end states and what was released.
    pub fn remove_app(
        &mut self,
        id: &AppId,
        now: Millis,
        world: &mut World<'_>,
    ) -> Result<(Removed, Outcome), SchedError> {
        let app = self.app(id)?;
        let released = self.held_by(id);
        let event = match app.state {
            state if state.is_terminal() => None,
            AppState::Completing => Some(AppEvent::Complete),
            _ => Some(AppEvent::Fail),
        };
        let mut out = Outcome::default();
        let live = self.live_tasks(id);
        for task in &live {
            let _ = self.end_task(id, task, TaskEvent::Kill, Some(REMOVED.to_owned()), now, world, &mut out, false);
        }
        if event == Some(AppEvent::Fail) {
            if let Some(app) = self.apps.get_mut(id) {
                app.reason.get_or_insert_with(|| REMOVED.to_owned());
            }
        }
        self.end_app(id, event, now, world, &mut out);
        let released = Released { tasks_killed: live, placements: released };
        let removed = Removed { app: self.apps[id].clone(), tasks: self.task_counts(id), released };
        self.forget(id, &mut out);
        Ok((removed, out))
    }

    /// The application's tasks that have not ended.
    fn live_tasks(&self, id: &AppId) -> Vec<TaskId> {
        let tasks = self.tasks.get(id).into_iter().flat_map(|t| t.values());
        tasks.filter(|t| !t.state.is_terminal()).map(|t| t.spec.id.clone()).collect()
    }

    /// Everything an application holds: its unused placeholders and its placed tasks'
    /// placements.
    fn held_by(&self, id: &AppId) -> Vec<Placement> {
        self.placements_of(id).cloned().collect()
    }

    /// The placements an application holds: its unused placeholders, then its placed (Allocated
    /// or Running) tasks'.
    fn placements_of<'a>(&'a self, id: &AppId) -> impl Iterator<Item = &'a Placement> + 'a {
        let slots = self.apps.get(id).into_iter().flat_map(|a| a.slots.iter().filter(|s| s.task.is_none()));
        let tasks = self.tasks.get(id).into_iter().flat_map(|t| t.values());
        let placed = tasks.filter(|t| matches!(t.state, TaskState::Allocated | TaskState::Running));
        slots.map(|s| &s.placement).chain(placed.filter_map(|t| t.placement.as_ref()))
    }

    /// Reports the application complete [YuniKorn `NotifyApplicationComplete`]: tasks that have
    /// not ended are Killed, everything is released, and it is Completed.
    pub fn complete_app(
        &mut self,
        id: &AppId,
        now: Millis,
        world: &mut World<'_>,
    ) -> Result<(App, Outcome), SchedError> {
        let app = self.app(id)?;
        if app.state.is_terminal() {
            return Err(SchedError::AppEnded { id: id.clone(), state: app.state });
        }
        let mut out = Outcome::default();
        self.end_app(id, Some(AppEvent::Complete), now, world, &mut out);
        Ok((self.apps[id].clone(), out))
    }

    /// Reports the application failed [YuniKorn `NotifyApplicationFail`]: tasks not placed are
    /// Failed, placed ones Killed, everything is released, and it is Failed with `reason`.
    pub fn fail_app(
        &mut self,
        id: &AppId,
        reason: &str,
        now: Millis,
        world: &mut World<'_>,
    ) -> Result<(App, Outcome), SchedError> {
        let app = self.app(id)?;
        if app.state.is_terminal() {
            return Err(SchedError::AppEnded { id: id.clone(), state: app.state });
        }
        let mut out = Outcome::default();
        self.fail_with(id, reason, now, world, &mut out);
        Ok((self.apps[id].clone(), out))
    }

    /// Fails a live application with `reason`: see [`Scheduler::fail_app`].
    fn fail_with(&mut self, id: &AppId, reason: &str, now: Millis, world: &mut World<'_>, out: &mut Outcome) {
        let Some(app) = self.apps.get_mut(id) else { return };
        app.reason = Some(reason.to_owned());
        self.end_app(id, Some(AppEvent::Fail), now, world, out);
    }

    /// A reserved gang loses its reservation (its placeholder timeout ran out, or a pool that
    /// held placeholders went): Soft releases the unused placeholders and goes on as an ordinary
    /// application (with `soft_note` as its reason, if any); Hard fails with `hard_reason`.
    fn lose_reservation(
        &mut self,
        id: &AppId,
        soft_note: Option<String>,
        hard_reason: &str,
        now: Millis,
        world: &mut World<'_>,
        out: &mut Outcome,
    ) {
        let Some(app) = self.apps.get(id) else { return };
        match app.spec.policy.gang {
            GangStyle::Soft => {
                self.release_slots(id, true, now, world, out);
                let Some(app) = self.apps.get_mut(id) else { return };
                transition_known(app, &[AppEvent::Resume, AppEvent::Run], out);
                if soft_note.is_some() {
                    app.reason = soft_note;
                }
                out.apps.push(AppChange::App(app.clone()));
            }
            GangStyle::Hard => self.fail_with(id, hard_reason, now, world, out),
        }
    }

    /// Ends every live task and releases every slot; then takes `event` (Complete or Fail) and
    /// releases, or (for a removal, `None`) just stops counting the application.
    fn end_app(&mut self, id: &AppId, event: Option<AppEvent>, now: Millis, world: &mut World<'_>, out: &mut Outcome) {
        let failing = event == Some(AppEvent::Fail);
        let task_ids = self.live_tasks(id);
        let Some(reason) = self.apps.get(id).map(|app| app.reason.clone()) else { return };
        for task in task_ids {
            let state = self.tasks[id][&task].state;
            let placed = matches!(state, TaskState::Allocated | TaskState::Running);
            let task_event = if failing && !placed { TaskEvent::Fail } else { TaskEvent::Kill };
            let _ = self.end_task(id, &task, task_event, reason.clone(), now, world, out, false);
        }
        self.release_slots(id, false, now, world, out);
        let Some(app) = self.apps.get_mut(id) else { return };
        if let Some(event) = event {
            let mut events = Vec::new();
            if app.state != AppState::Completing || event == AppEvent::Fail {
                events.push(event);
            }
            events.push(AppEvent::Release);
            // Every live state takes Complete or Fail, and then Release.
            transition_known(app, &events, out);
            app.ended_at = Some(now);
        }
        let (account, counted) = (Account::of(&app.spec), app.counted);
        app.counted = false;
        let app = app.clone();
        if counted {
            self.count_app(&account, false);
        }
        self.why_app.remove(id);
        out.apps.push(AppChange::App(app));
    }

    /// At the placeholder timeout of an application that runs tasks: the placeholders no task
    /// took over are released, and it goes on (its later members are placed as ordinary tasks).
    fn release_unused_placeholders(&mut self, id: &AppId, now: Millis, world: &mut World<'_>, out: &mut Outcome) {
        self.release_slots(id, true, now, world, out);
        let Some(app) = self.apps.get_mut(id) else { return };
        app.reason = Some("its placeholders no task took over were released at the placeholder timeout".to_owned());
        out.apps.push(AppChange::App(app.clone()));
    }

    /// Releases the application's slots (all, or only those no task took over when `unused`).
    fn release_slots(&mut self, id: &AppId, unused_only: bool, now: Millis, world: &mut World<'_>, out: &mut Outcome) {
        let Some(app) = self.apps.get_mut(id) else { return };
        let account = Account::of(&app.spec);
        let mut released = Vec::new();
        app.slots.retain(|slot| {
            let keep = unused_only && slot.task.is_some();
            if !keep && slot.task.is_none() {
                released.push(slot.placement.clone());
            }
            keep
        });
        for placement in released {
            self.charge(&account, &placement.resources, false);
            release(&placement, now, world, out);
        }
    }

    // ---- tasks ----

    /// Adds a task [YuniKorn `AddTask`]: checked against its group (a member may not ask for
    /// more than its placeholder holds), then Pending. The same content again answers the task.
    pub fn add_task(
        &mut self,
        app_id: &AppId,
        spec: TaskSpec,
        now: Millis,
        world: &World<'_>,
    ) -> Result<(Task, bool, Outcome), SchedError> {
        let app = self.app(app_id)?;
        let spec = self.resolve_priority(app, spec)?;
        if let Some(existing) = self.tasks.get(app_id).and_then(|t| t.get(&spec.id)) {
            return match task_conflict(&existing.spec, &spec) {
                Some(field) => Err(SchedError::TaskConflict { app: app_id.clone(), task: spec.id, field }),
                None => Ok((existing.clone(), false, Outcome::default())),
            };
        }
        let spec = self.check_new_task(app, spec, world)?;
        let (task, out) = self.insert_task(app_id, spec, now);
        Ok((task, true, out))
    }

    /// The task with its priority resolved: its own, its class's, else its application's.
    fn resolve_priority(&self, app: &App, mut spec: TaskSpec) -> Result<TaskSpec, SchedError> {
        spec.priority = self.config.priority_classes.resolve(&spec.priority, Some(&app.spec.priority))?;
        Ok(spec)
    }

    /// Checks a task that `app` does not have yet, as [`Scheduler::add_task`] does; answers its
    /// checked spec. What can never be placed as things are is refused: a type no daemon runs,
    /// more than every matching pool holds, more units than a quota (a quota of 0 is a pause).
    fn check_new_task(&self, app: &App, spec: TaskSpec, world: &World<'_>) -> Result<TaskSpec, SchedError> {
        if app.state.is_terminal() {
            return Err(SchedError::AppEnded { id: app.spec.id.clone(), state: app.state });
        }
        let spec = spec.check(&app.spec)?;
        for need in &spec.tokens {
            if world.ledger.room_for(&need.namespace, 0).is_err_and(|s| !s.exists) {
                return Err(SchedError::NamespaceNotFound(need.namespace.clone()));
            }
        }
        let never = |why: NeverFits| SchedError::NeverFits { task: spec.id.clone(), why };
        if let Some(why) = spec.task_type().and_then(|t| self.type_never_runs(&t)) {
            return Err(never(why));
        }
        // A member of a group fits its placeholder, which the group's check made sure of.
        if spec.group.is_none() {
            if let Some(why) = resources_never_fit(world.pools, &spec.resources, &spec.selector) {
                return Err(never(why));
            }
        }
        for need in &spec.tokens {
            if let Some(why) =
                world.ledger.room_for(&need.namespace, need.units).err().and_then(|s| tokens_never_fit(&s))
            {
                return Err(never(why));
            }
        }
        Ok(spec)
    }

    /// Reads a task's type once; a task added again under its id is read again.
    fn keep_type(&mut self, task: &Task) {
        let types = self.task_types.entry(task.app.clone()).or_default();
        types.insert(task.spec.id.clone(), task.spec.task_type());
    }

    /// A task's type, as read when it was added.
    pub(crate) fn type_of(&self, app: &AppId, task: &TaskId) -> Option<String> {
        self.task_types.get(app).and_then(|types| types.get(task)).cloned().flatten()
    }

    /// Why tasks of `task_type` can never run: no executor's registry (live or not) has it.
    fn type_never_runs(&self, task_type: &str) -> Option<NeverFits> {
        (!self.runners.knows(task_type)).then(|| NeverFits::TaskType { task_type: task_type.to_owned() })
    }

    /// Adds a checked task to an application that has it not: Pending.
    fn insert_task(&mut self, app_id: &AppId, spec: TaskSpec, now: Millis) -> (Task, Outcome) {
        let mut out = Outcome::default();
        let state = task_known(TaskState::New, &[TaskEvent::Admit], &mut out);
        let task = Task {
            app: app_id.clone(),
            spec,
            state,
            seq: self.next_seq,
            added: now,
            placement: None,
            slot: None,
            reason: None,
            preemptions: 0,
            preempted_at: None,
            preempting: None,
            held: None,
        };
        self.next_seq += 1;
        let Some(app) = self.apps.get_mut(app_id) else {
            out.broken.push(format!("a task added to application `{app_id}`, which does not exist"));
            return (task, out);
        };
        if app.state == AppState::Completing && transition_known(app, &[AppEvent::Run], &mut out) {
            app.completing_since = None;
            out.apps.push(AppChange::App(app.clone()));
        }
        self.pending.entry(app_id.clone()).or_default().insert(pending_key(&task));
        self.pending_shapes.remove(app_id);
        self.keep_type(&task);
        self.tasks.entry(app_id.clone()).or_default().insert(task.spec.id.clone(), task.clone());
        self.count(app_id, None, Some(task.state));
        out.apps.push(AppChange::Task(task.clone()));
        (task, out)
    }

    pub fn task(&self, app: &AppId, task: &TaskId) -> Result<&Task, SchedError> {
        self.app(app)?;
        self.tasks
            .get(app)
            .and_then(|t| t.get(task))
            .ok_or_else(|| SchedError::TaskNotFound { app: app.clone(), task: task.clone() })
    }

    /// At most `limit` tasks of an application whose ids come after `after`, in id order.
    pub fn tasks_after(&self, app: &AppId, after: Option<&TaskId>, limit: usize) -> Result<Vec<&Task>, SchedError> {
        self.app(app)?;
        let from = after.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
        Ok(self
            .tasks
            .get(app)
            .map(|t| t.range((from, std::ops::Bound::Unbounded)).take(limit).map(|(_, t)| t).collect())
            .unwrap_or_default())
    }

    /// Why a Pending task waits: what the last cycle found, or what its application waits for.
    pub fn task_why(&self, app_id: &AppId, task_id: &TaskId) -> Option<Why> {
        let task = self.tasks.get(app_id)?.get(task_id)?;
        if task.state != TaskState::Pending {
            return None;
        }
        if let Some(why) = self.why_task.get(&(app_id.clone(), task_id.clone())) {
            return Some(why.clone());
        }
        if let Some(why) = self.why_like(app_id, task) {
            return Some(why);
        }
        let app = self.apps.get(app_id)?;
        if app.awaits_gang() {
            return Some(match self.why_app.get(app_id) {
                Some(
                    why @ (Why::GangNotReserved { .. }
                    | Why::QueueLimit(_)
                    | Why::NoRoomYet { .. }
                    | Why::Preempting { .. }),
                ) => why.clone(),
                _ => Why::AfterGang,
            });
        }
        self.why_app.get(app_id).cloned()
    }

    /// Reports a task running (it must be Allocated).
    pub fn start_task(&mut self, app: &AppId, task: &TaskId) -> Result<(Task, Outcome), SchedError> {
        let record = self.task_mut(app, task)?;
        let before = record.state;
        record.state = record.state.on(TaskEvent::Start)?;
        let record = record.clone();
        self.count(app, Some(before), Some(record.state));
        Ok((record.clone(), Outcome { apps: vec![AppChange::Task(record)], ..Outcome::default() }))
    }

    /// A task being preempted ended its attempt (its executor aborted it): it goes back to
    /// waiting at once, its placement released, instead of at the end of its grace. As
    /// `finish_tasks` with [`TaskEnding::Preempted`].
    pub fn preempted(
        &mut self,
        app: &AppId,
        task: &TaskId,
        now: Millis,
        world: &mut World<'_>,
    ) -> Result<(Task, Outcome), SchedError> {
        self.finish_one(TaskEnd { app: app.clone(), task: task.clone(), ending: TaskEnding::Preempted }, now, world)
    }

    fn preempted_into(
        &mut self,
        app: &AppId,
        task: &TaskId,
        now: Millis,
        world: &mut World<'_>,
        out: &mut Outcome,
    ) -> Result<Task, SchedError> {
        if self.task(app, task)?.preempting.is_none() {
            return Err(SchedError::NotPreempting { app: app.clone(), task: task.clone() });
        }
        self.take_back(app, task, now, world, out)?;
        // Its last change is what it is now: answered without a second look-up.
        match out.apps.last() {
            Some(AppChange::Task(last)) if last.app == *app && last.spec.id == *task => Ok(last.clone()),
            _ => Ok(self.task(app, task)?.clone()),
        }
    }

    /// Reports a task completed or failed: its alloc and grants are released, and its application
    /// completes once every task has ended.
    pub fn finish_task(
        &mut self,
        app: &AppId,
        task: &TaskId,
        failed: Option<String>,
        now: Millis,
        world: &mut World<'_>,
    ) -> Result<(Task, Outcome), SchedError> {
        self.finish_one(TaskEnd { app: app.clone(), task: task.clone(), ending: TaskEnding::of(failed) }, now, world)
    }

    /// One report, as [`Scheduler::finish_tasks`] takes it.
    fn finish_one(&mut self, end: TaskEnd, now: Millis, world: &mut World<'_>) -> Result<(Task, Outcome), SchedError> {
        let missing = SchedError::TaskNotFound { app: end.app.clone(), task: end.task.clone() };
        let (mut answers, out) = self.finish_tasks(vec![end], now, world);
        Ok((answers.pop().unwrap_or(Err(missing))?, out))
    }

    /// Reports several tasks completed or failed at once, as `finish_task` each in turn: one
    /// answer per report, in order (a refused one changes nothing), and the outcome of them all.
    pub fn finish_tasks(
        &mut self,
        ends: Vec<TaskEnd>,
        now: Millis,
        world: &mut World<'_>,
    ) -> (Vec<Result<Task, SchedError>>, Outcome) {
        let mut out = Outcome::default();
        let answers = ends
            .into_iter()
            .map(|end| match end.ending {
                TaskEnding::Completed => {
                    self.end_task(&end.app, &end.task, TaskEvent::Complete, None, now, world, &mut out, true)
                }
                TaskEnding::Failed(reason) => {
                    self.end_task(&end.app, &end.task, TaskEvent::Fail, Some(reason), now, world, &mut out, true)
                }
                TaskEnding::Preempted => self.preempted_into(&end.app, &end.task, now, world, &mut out),
            })
            .collect();
        (answers, out)
    }

    /// Removes a task [YuniKorn `RemoveTask`]: if it has not ended it is Killed and what it holds
    /// is released; its record is gone.
    pub fn remove_task(
        &mut self,
        app: &AppId,
        task: &TaskId,
        now: Millis,
        world: &mut World<'_>,
    ) -> Result<(Task, Outcome), SchedError> {
        let mut out = Outcome::default();
        let state = self.task(app, task)?.state;
        let record = if state.is_terminal() {
            self.task(app, task)?.clone()
        } else {
            self.end_task(app, task, TaskEvent::Kill, None, now, world, &mut out, false)?
        };
        if let Some(tasks) = self.tasks.get_mut(app) {
            tasks.remove(task);
        }
        self.count(app, Some(record.state), None);
        self.why_task.remove(&(app.clone(), task.clone()));
        out.apps.retain(|c| !matches!(c, AppChange::Task(t) if t.app == *app && t.spec.id == *task));
        out.apps.push(AppChange::TaskRemoved { app: app.clone(), task: task.clone() });
        self.settle(app, now, world, &mut out);
        Ok((record, out))
    }

    fn task_mut(&mut self, app: &AppId, task: &TaskId) -> Result<&mut Task, SchedError> {
        self.app(app)?;
        self.tasks
            .get_mut(app)
            .and_then(|t| t.get_mut(task))
            .ok_or_else(|| SchedError::TaskNotFound { app: app.clone(), task: task.clone() })
    }

    /// Takes a terminal `event`, releases what the task holds, and (if `settle`) lets its
    /// application complete once every task has ended.
    // Each argument is a part of the decision (which task, how it ends, why, when, on what, into
    // which outcome, and whether its application settles): a struct would only rename them.
    #[allow(clippy::too_many_arguments)]
    fn end_task(
        &mut self,
        app_id: &AppId,
        task_id: &TaskId,
        event: TaskEvent,
        reason: Option<String>,
        now: Millis,
        world: &mut World<'_>,
        out: &mut Outcome,
        settle: bool,
    ) -> Result<Task, SchedError> {
        let account = Account::of(&self.app(app_id)?.spec);
        let task = self.task_mut(app_id, task_id)?;
        let before = task.state;
        task.state = before.on(event)?;
        task.reason = reason.or(task.reason.take());
        // Ended: it neither waits for held room nor is preempted any more.
        task.preempting = None;
        task.held = None;
        let task = task.clone();
        self.count(app_id, Some(before), Some(task.state));
        if before == TaskState::Pending {
            if let Some(pending) = self.pending.get_mut(app_id) {
                pending.remove(&pending_key(&task));
            }
            self.pending_shapes.remove(app_id);
        }
        self.why_task.remove(&(app_id.clone(), task_id.clone()));
        if matches!(before, TaskState::Allocated | TaskState::Running) {
            if let Some(placement) = &task.placement {
                self.charge(&account, &placement.resources, false);
                release(placement, now, world, out);
            }
        }
        out.apps.push(AppChange::Task(task.clone()));
        // The last member placed of a gang being taken back by preemption ended otherwise.
        if task.slot.is_some() && matches!(before, TaskState::Allocated | TaskState::Running) {
            self.regang(app_id, now, world, out);
        }
        if settle {
            self.settle(app_id, now, world, out);
        }
        Ok(task)
    }

    /// An application whose tasks have all ended starts Completing: its unused placeholders are
    /// released, and it is Completed after the grace (unless a task is added meanwhile).
    fn settle(&mut self, app_id: &AppId, now: Millis, world: &mut World<'_>, out: &mut Outcome) {
        let Some(app) = self.apps.get(app_id) else { return };
        // From the counts by state, kept with every change: not a walk over the tasks.
        let counts = self.counts.get(app_id);
        let has_tasks = counts.is_some_and(|c| c.values().any(|n| *n > 0));
        let all_ended = counts.is_none_or(|c| c.iter().all(|(state, n)| *n == 0 || state.is_terminal()));
        let live =
            matches!(app.state, AppState::Accepted | AppState::Reserving | AppState::Running | AppState::Resuming);
        if !(has_tasks && all_ended && live) {
            return;
        }
        self.release_slots(app_id, false, now, world, out);
        let Some(app) = self.apps.get_mut(app_id) else { return };
        if !transition_known(app, &[AppEvent::Complete], out) {
            return;
        }
        app.completing_since = Some(now);
        out.apps.push(AppChange::App(app.clone()));
        if self.config.completing_grace_ms == 0 {
            self.finish_completing(app_id, now, out);
        }
    }

    fn finish_completing(&mut self, app_id: &AppId, now: Millis, out: &mut Outcome) {
        let Some(app) = self.apps.get_mut(app_id) else { return };
        if !transition_known(app, &[AppEvent::Release], out) {
            return;
        }
        app.ended_at = Some(now);
        let (account, counted) = (Account::of(&app.spec), app.counted);
        app.counted = false;
        out.apps.push(AppChange::App(app.clone()));
        if counted {
            self.count_app(&account, false);
        }
    }

    /// Forgets an ended application and its tasks (its retention is over): it holds nothing.
    fn forget(&mut self, id: &AppId, out: &mut Outcome) {
        self.apps.remove(id);
        self.tasks.remove(id);
        self.counts.remove(id);
        self.pending.remove(id);
        self.pending_shapes.remove(id);
        self.why_app.remove(id);
        self.why_task.retain(|(app, _), _| app != id);
        self.failed_shapes.remove(id);
        self.never_fits.remove(id);
        self.task_types.remove(id);
        out.apps.push(AppChange::AppRemoved { id: id.clone() });
    }

    /// The tasks placed (Allocated or Running) on one of `pools`, by application and task: what
    /// the executors of those pools run.
    pub fn placed_on<S: std::hash::BuildHasher>(
        &self,
        pools: &std::collections::HashSet<PoolName, S>,
    ) -> Vec<(AppId, TaskId)> {
        let mut found = Vec::new();
        for (app, counts) in &self.counts {
            let placed = [TaskState::Allocated, TaskState::Running].iter().filter_map(|s| counts.get(s)).sum::<u64>();
            if placed == 0 {
                continue;
            }
            for task in self.tasks.get(app).into_iter().flat_map(|tasks| tasks.values()) {
                let here = matches!(task.state, TaskState::Allocated | TaskState::Running)
                    && task.placement.as_ref().is_some_and(|p| pools.contains(&p.pool));
                if here {
                    found.push((app.clone(), task.spec.id.clone()));
                }
            }
        }
        found.sort();
        found
    }

    /// The pools nothing is placed on, their executors stopped.
    pub fn down_pools(&self) -> &BTreeSet<PoolName> {
        &self.down
    }

    /// The executors that run `pool`'s tasks stopped (their leases lapsed): nothing is placed on
    /// it until [`Scheduler::pool_back`], and what was placed there is lost. A task placed there
    /// goes back to waiting, its alloc and tokens released, to be placed elsewhere (whoever runs
    /// it counts the lost attempt); a gang member fails (a gang starts all or nothing, not one
    /// member again); a gang reserving there loses its reservation, as when a pool is removed.
    pub fn pool_lost(&mut self, pool: &PoolName, reason: &str, now: Millis, world: &mut World<'_>) -> Outcome {
        let mut out = Outcome::default();
        self.down.insert(pool.clone());
        self.kept_room.drop_kept();
        let placed: Vec<(AppId, TaskId, bool)> = self
            .tasks
            .values()
            .flat_map(|tasks| tasks.values())
            .filter(|t| matches!(t.state, TaskState::Allocated | TaskState::Running))
            .filter(|t| t.placement.as_ref().is_some_and(|p| &p.pool == pool))
            .map(|t| (t.app.clone(), t.spec.id.clone(), t.slot.is_some() || t.spec.group.is_some()))
            .collect();
        for (app, task, gang) in placed {
            if gang {
                let _ =
                    self.end_task(&app, &task, TaskEvent::Fail, Some(reason.to_owned()), now, world, &mut out, true);
            } else {
                let _ = self.requeue(&app, &task, &format!("placed again: {reason}"), now, world, &mut out);
            }
        }
        self.lose_gangs_on(pool, reason, now, world, &mut out);
        out
    }

    /// An executor runs `pool`'s tasks again: it takes placements again.
    pub fn pool_back(&mut self, pool: &PoolName) -> bool {
        let back = self.down.remove(pool);
        if back {
            self.kept_room.drop_kept();
        }
        back
    }

    /// A placed task goes back to waiting (its placement lost, or taken back), holding nothing,
    /// with `reason`.
    fn requeue(
        &mut self,
        app_id: &AppId,
        task_id: &TaskId,
        reason: &str,
        now: Millis,
        world: &mut World<'_>,
        out: &mut Outcome,
    ) -> Result<(), SchedError> {
        let account = Account::of(&self.app(app_id)?.spec);
        let task = self.task_mut(app_id, task_id)?;
        let before = task.state;
        task.state = before.on(TaskEvent::Lose)?;
        task.reason = Some(reason.to_owned());
        task.preempting = None;
        let placement = task.placement.take();
        let task = task.clone();
        self.count(app_id, Some(before), Some(task.state));
        if let Some(placement) = &placement {
            self.charge(&account, &placement.resources, false);
            release(placement, now, world, out);
        }
        self.pending.entry(app_id.clone()).or_default().insert(pending_key(&task));
        self.pending_shapes.remove(app_id);
        out.apps.push(AppChange::Task(task));
        Ok(())
    }

    /// A pool was removed (with force): its allocs are gone. Tasks placed on it fail; a gang
    /// with placeholders on it loses its reservation, as if its placeholder timeout ran out
    /// (Soft: the other placeholders are released and it goes on; Hard: it fails).
    pub fn pool_removed(&mut self, pool: &PoolName, now: Millis, world: &mut World<'_>) -> Outcome {
        let mut out = Outcome::default();
        let reason = format!("its pool `{pool}` was removed");
        let placed: Vec<(AppId, TaskId)> = self
            .tasks
            .values()
            .flat_map(|tasks| tasks.values())
            .filter(|t| matches!(t.state, TaskState::Allocated | TaskState::Running))
            .filter(|t| t.placement.as_ref().is_some_and(|p| &p.pool == pool))
            .map(|t| (t.app.clone(), t.spec.id.clone()))
            .collect();
        for (app, task) in placed {
            let _ = self.end_task(&app, &task, TaskEvent::Fail, Some(reason.clone()), now, world, &mut out, true);
        }
        self.lose_gangs_on(pool, &reason, now, world, &mut out);
        out
    }

    /// Gangs reserving with a free placeholder on `pool` lose their reservation, as if their
    /// placeholder timeout ran out (Soft: they go on without; Hard: they fail).
    fn lose_gangs_on(&mut self, pool: &PoolName, reason: &str, now: Millis, world: &mut World<'_>, out: &mut Outcome) {
        let gangs: Vec<AppId> = self
            .apps
            .values()
            .filter(|a| a.holds_free_slots())
            .filter(|a| a.slots.iter().any(|s| s.task.is_none() && &s.placement.pool == pool))
            .map(|a| a.spec.id.clone())
            .collect();
        let lost = format!("placeholders lost: {reason}");
        for id in gangs {
            self.lose_reservation(&id, Some(lost.clone()), &lost, now, world, out);
        }
    }

    // ---- usage ----

    fn charge(&mut self, account: &Account, resources: &Resources, add: bool) {
        for path in account.queue.up_to_root() {
            let usage = self.usage.entry(path).or_default();
            apply(&mut usage.allocated, resources, add);
            apply(&mut usage.users.entry(account.user.clone()).or_default().1, resources, add);
            if let Some(group) = &account.group {
                apply(&mut usage.groups.entry(group.clone()).or_default().1, resources, add);
            }
        }
    }

    fn count_app(&mut self, account: &Account, add: bool) {
        let count = |n: &mut u64| *n = if add { *n + 1 } else { n.saturating_sub(1) };
        for path in account.queue.up_to_root() {
            let usage = self.usage.entry(path).or_default();
            count(&mut usage.running_apps);
            count(&mut usage.users.entry(account.user.clone()).or_default().0);
            if let Some(group) = &account.group {
                count(&mut usage.groups.entry(group.clone()).or_default().0);
            }
        }
    }

    /// Checks the invariants in the module docs; for tests.
    pub fn check_invariants(&self, pools: &Pools) -> Result<(), String> {
        let mut expected: HashMap<QueuePath, Resources> = HashMap::new();
        let mut add = |queue: &QueuePath, resources: &Resources| {
            for path in queue.up_to_root() {
                let sum = expected.entry(path).or_default();
                *sum = sum.checked_add(resources).unwrap_or_else(|| sum.clone());
            }
        };
        for app in self.apps.values() {
            if app.state.is_terminal() && !app.slots.is_empty() {
                return Err(format!("{}: ended ({}) with {} slots", app.spec.id, app.state, app.slots.len()));
            }
            for slot in app.slots.iter().filter(|s| s.task.is_none()) {
                add(&app.spec.queue, &slot.placement.resources);
                live_alloc(pools, &slot.placement)?;
            }
            let mut counted: BTreeMap<TaskState, u64> = BTreeMap::new();
            for task in self.tasks.get(&app.spec.id).into_iter().flat_map(|t| t.values()) {
                if self.type_of(&app.spec.id, &task.spec.id) != task.spec.task_type() {
                    return Err(format!("{}/{}: its type read once is not its spec's", app.spec.id, task.spec.id));
                }
                let holds = matches!(task.state, TaskState::Allocated | TaskState::Running);
                if task.preempting.is_some() && !holds {
                    return Err(format!("{}/{}: {} yet being preempted", app.spec.id, task.spec.id, task.state));
                }
                if task.held.is_some() && task.state != TaskState::Pending {
                    return Err(format!("{}/{}: {} yet room is held for it", app.spec.id, task.spec.id, task.state));
                }
                if holds != task.placement.is_some() && holds {
                    return Err(format!("{}/{}: {} without a placement", app.spec.id, task.spec.id, task.state));
                }
                if let (true, Some(placement)) = (holds, &task.placement) {
                    add(&app.spec.queue, &placement.resources);
                    live_alloc(pools, placement)?;
                }
                *counted.entry(task.state).or_default() += 1;
                let pending = self.pending.get(&app.spec.id).is_some_and(|p| p.contains(&pending_key(task)));
                if pending != (task.state == TaskState::Pending) {
                    return Err(format!("{}/{}: {} but pending={pending}", app.spec.id, task.spec.id, task.state));
                }
            }
            if counted != self.task_counts(&app.spec.id) {
                return Err(format!(
                    "{}: counts {:?} but tasks {counted:?}",
                    app.spec.id,
                    self.task_counts(&app.spec.id)
                ));
            }
        }
        for (path, usage) in &self.usage {
            let want = expected.remove(path).unwrap_or_default();
            if !usage.allocated.fits(&want) || !want.fits(&usage.allocated) {
                return Err(format!("queue {path}: usage {} but placements hold {want}", usage.allocated));
            }
        }
        if let Some((path, want)) = expected.into_iter().find(|(_, r)| !r.is_empty()) {
            return Err(format!("queue {path}: no usage but placements hold {want}"));
        }
        Ok(())
    }
}

/// The first field in which `new` differs from an existing task's spec, if any: the same task
/// again is answered as it is, another under its id is a conflict.
fn task_conflict(existing: &TaskSpec, new: &TaskSpec) -> Option<&'static str> {
    [
        ("resources", existing.resources != new.resources),
        ("tokens", existing.tokens != spec::merge_needs(&new.tokens).unwrap_or_default()),
        ("group", existing.group != new.group),
        ("priority", existing.priority != new.priority),
        ("selector", existing.selector != new.selector),
        ("spec", existing.spec != new.spec),
    ]
    .into_iter()
    .find_map(|(field, differs)| differs.then_some(field))
}

/// The state of an application record in today's meaning: a record of a version before gangs
/// were shown as YuniKorn shows them says `Accepted` for a gang waiting to be reserved (now
/// `Reserving`) and `Reserving` for a reserved one (now `Running`).
fn current_state(app: &App) -> AppState {
    match app.state {
        AppState::Accepted if !app.spec.groups.is_empty() && !app.gang_given_up && app.reserved_at.is_none() => {
            AppState::Reserving
        }
        AppState::Reserving if app.reserved_at.is_some() => AppState::Running,
        state => state,
    }
}

fn live_alloc(pools: &Pools, placement: &Placement) -> Result<(), String> {
    match pools.inspect(&placement.pool, placement.alloc) {
        Ok(crate::pools::AllocState::Live(_)) => Ok(()),
        other => Err(format!("{}/{}: held but {other:?}", placement.pool, placement.alloc)),
    }
}

fn apply(sum: &mut Resources, resources: &Resources, add: bool) {
    *sum = if add { sum.checked_add(resources).unwrap_or_else(|| sum.clone()) } else { sum.saturating_sub(resources) };
}

/// Releases a placement's alloc and grants (whatever is still there).
fn release(placement: &Placement, now: Millis, world: &mut World<'_>, out: &mut Outcome) {
    out.pools.extend(world.pools.end_held(&placement.pool, placement.alloc, now));
    for held in &placement.grants {
        if let Ok((_, effects)) = world.ledger.release_held(&held.namespace, &held.token, now) {
            out.ledger(effects);
        }
    }
}

/// "with the labels a=b,c=d", or "that takes allocs" for an empty selector: which pools it means.
fn pools_described(selector: &Labels) -> String {
    if selector.is_empty() {
        return "that takes allocs".to_owned();
    }
    let labels: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("with the labels {}", labels.join(","))
}

/// Why `wanted` can never fit as the pools are: some pool matches `selector`, and none could
/// ever hold it. With no pool matching, it waits for one to be made.
fn resources_never_fit(pools: &Pools, wanted: &Resources, selector: &Labels) -> Option<NeverFits> {
    let never = pools.any_matches(selector) && !pools.could_ever_fit(wanted, selector);
    never.then(|| NeverFits::Resources { wanted: wanted.clone(), pools: pools_described(selector) })
}

/// Whether a shortage is for good: more units than the quota. A quota of 0 pauses the
/// namespace: that is waited out.
fn tokens_never_fit(shortage: &crate::quotas::TokenShortage) -> Option<NeverFits> {
    let never = shortage.exists && shortage.quota > 0 && shortage.wanted > shortage.quota;
    never.then(|| NeverFits::Tokens {
        namespace: shortage.namespace.clone(),
        units: shortage.wanted,
        quota: shortage.quota,
    })
}
