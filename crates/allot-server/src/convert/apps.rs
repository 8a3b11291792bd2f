//! Conversions of queues, applications and tasks between wire types and domain types.

use allot_api as api;
use allot_core::apps::priority::{Priority, PriorityPolicy};
use allot_core::apps::queues::{PreemptionPolicy, QueueLimits, QueuePath, SortPolicy};
use allot_core::apps::spec::{DEFAULT_PLACEHOLDER_TIMEOUT_MS, MAX_TIMEOUT_MS};
use allot_core::apps::states::TaskState;
use allot_core::apps::{
    AppId, AppOrder, AppSpec, GangStyle, GroupName, HeldTokens, Placement, QueueRule, QueueView, SchedulingPolicy,
    TaskGroup, TaskId, TaskSpec, TokenNeed, Why,
};
use allot_core::{Millis, MAX_UNITS};
use allot_store::{AppInfo, TaskInfo};

use crate::convert::pools::resources;
use crate::convert::quotas::namespace_name;
use crate::error::ApiError;

pub(crate) fn queue_path(path: &str) -> Result<QueuePath, ApiError> {
    QueuePath::new(path).map_err(|e| ApiError::from(allot_core::apps::SchedError::from(e)))
}

pub(crate) fn app_id(id: &str) -> Result<AppId, ApiError> {
    Ok(AppId::new(id)?)
}

pub(crate) fn task_id(id: &str) -> Result<TaskId, ApiError> {
    Ok(TaskId::new(id)?)
}

fn sort_in(sort: api::SortPolicy) -> SortPolicy {
    match sort {
        api::SortPolicy::Fifo => SortPolicy::Fifo,
        api::SortPolicy::Fair => SortPolicy::Fair,
        api::SortPolicy::Priority => SortPolicy::Priority,
    }
}

fn sort_out(sort: SortPolicy) -> api::SortPolicy {
    match sort {
        SortPolicy::Fifo => api::SortPolicy::Fifo,
        SortPolicy::Fair => api::SortPolicy::Fair,
        SortPolicy::Priority => api::SortPolicy::Priority,
    }
}

pub(crate) fn queue_limits(body: api::PutQueue) -> Result<QueueLimits, ApiError> {
    let counts =
        [("max_apps", body.max_apps), ("user_max_apps", body.user_max_apps), ("group_max_apps", body.group_max_apps)];
    for (what, value) in counts {
        if value.is_some_and(|v| v > MAX_UNITS) {
            return Err(ApiError::invalid_argument(format!("{what} must be at most {MAX_UNITS}")));
        }
    }
    if let Some(delay) = body.preemption_delay_ms.filter(|d| *d > MAX_TIMEOUT_MS) {
        return Err(ApiError::invalid_argument(format!(
            "preemption_delay_ms must be at most {MAX_TIMEOUT_MS} (30 days), got {delay}"
        )));
    }
    Ok(QueueLimits {
        guaranteed: body.guaranteed.as_deref().map(resources).transpose()?.unwrap_or_default(),
        max: body.max.as_deref().map(resources).transpose()?,
        max_apps: body.max_apps,
        user_max_apps: body.user_max_apps,
        user_max: body.user_max.as_deref().map(resources).transpose()?,
        group_max_apps: body.group_max_apps,
        group_max: body.group_max.as_deref().map(resources).transpose()?,
        sort: body.sort.map(sort_in).unwrap_or_default(),
        submit_acl: body.submit_acl.as_deref().map(acl).transpose()?,
        admin_acl: body.admin_acl.as_deref().map(acl).transpose()?,
        borrow_limit: body.borrow_limit.as_deref().map(resources).transpose()?,
        lend_limit: body.lend_limit.as_deref().map(resources).transpose()?,
        priority_offset: body.priority_offset.unwrap_or(0),
        priority_policy: match body.priority_policy.unwrap_or_default() {
            api::PriorityPolicy::Default => PriorityPolicy::Default,
            api::PriorityPolicy::Fence => PriorityPolicy::Fence,
        },
        preemption: match body.preemption.unwrap_or_default() {
            api::PreemptionPolicy::Default => PreemptionPolicy::Default,
            api::PreemptionPolicy::Fence => PreemptionPolicy::Fence,
            api::PreemptionPolicy::Disabled => PreemptionPolicy::Disabled,
        },
        preemption_delay_ms: body.preemption_delay_ms,
    })
}

/// A priority as asked: a number or a class (the scheduler resolves and checks it).
fn priority(value: Option<i32>, class: Option<String>) -> Priority {
    Priority { value, class }
}

fn acl(text: &str) -> Result<allot_core::access::Acl, ApiError> {
    allot_core::access::Acl::parse(text).map_err(|e| ApiError::invalid_argument(e.to_string()))
}

pub(crate) fn queue(view: QueueView) -> api::Queue {
    let limits = view.limits;
    api::Queue {
        path: view.path.to_string(),
        leaf: view.leaf,
        guaranteed: limits.guaranteed.to_string(),
        max: limits.max.map(|m| m.to_string()),
        max_apps: limits.max_apps,
        user_max_apps: limits.user_max_apps,
        user_max: limits.user_max.map(|m| m.to_string()),
        group_max_apps: limits.group_max_apps,
        group_max: limits.group_max.map(|m| m.to_string()),
        sort: sort_out(limits.sort),
        submit_acl: limits.submit_acl.map(|acl| acl.text().to_owned()),
        admin_acl: limits.admin_acl.map(|acl| acl.text().to_owned()),
        borrow_limit: limits.borrow_limit.map(|m| m.to_string()),
        lend_limit: limits.lend_limit.map(|m| m.to_string()),
        priority_offset: limits.priority_offset,
        priority_policy: match limits.priority_policy {
            PriorityPolicy::Default => api::PriorityPolicy::Default,
            PriorityPolicy::Fence => api::PriorityPolicy::Fence,
        },
        preemption: match limits.preemption {
            PreemptionPolicy::Default => api::PreemptionPolicy::Default,
            PreemptionPolicy::Fence => api::PreemptionPolicy::Fence,
            PreemptionPolicy::Disabled => api::PreemptionPolicy::Disabled,
        },
        preemption_delay_ms: limits.preemption_delay_ms,
        used: view.usage.allocated.to_string(),
        running_apps: view.usage.running_apps,
        apps: view.apps,
        pending_tasks: view.pending_tasks,
    }
}

fn needs_in(needs: Vec<api::TokenNeed>) -> Result<Vec<TokenNeed>, ApiError> {
    needs.into_iter().map(|n| Ok(TokenNeed { namespace: namespace_name(&n.namespace)?, units: n.units })).collect()
}

fn needs_out(needs: &[TokenNeed]) -> Vec<api::TokenNeed> {
    needs.iter().map(|n| api::TokenNeed { namespace: n.namespace.to_string(), units: n.units }).collect()
}

pub(crate) fn app_spec(body: &api::SubmitApp, queue: QueuePath, rule: Option<QueueRule>) -> Result<AppSpec, ApiError> {
    let groups = body
        .task_groups
        .iter()
        .map(|g| {
            Ok(TaskGroup {
                name: GroupName::new(&g.name)?,
                min_members: g.min_members,
                min_resources: resources(&g.min_resources)?,
                selector: g.selector.clone(),
                tokens: needs_in(g.tokens.clone())?,
            })
        })
        .collect::<Result<_, ApiError>>()?;
    let policy = &body.policy;
    Ok(AppSpec {
        id: app_id(&body.id)?,
        queue,
        user: body.user.clone(),
        user_groups: body.user_groups.clone(),
        tags: body.tags.clone(),
        groups,
        policy: SchedulingPolicy {
            placeholder_timeout_ms: policy.placeholder_timeout_ms.unwrap_or(DEFAULT_PLACEHOLDER_TIMEOUT_MS),
            gang: match policy.gang.unwrap_or_default() {
                api::GangStyle::Soft => GangStyle::Soft,
                api::GangStyle::Hard => GangStyle::Hard,
            },
            reserve_timeout_ms: policy.reserve_timeout_ms,
            max_parallelism: policy
                .max_parallelism
                .map(|n| {
                    u32::try_from(n).map_err(|_| {
                        ApiError::invalid_argument(format!("policy.max_parallelism: {n} is more than {}", u32::MAX))
                    })
                })
                .transpose()?,
        },
        queue_rule: rule,
        priority: priority(body.priority, body.priority_class.clone()),
    })
}

pub(crate) fn task_spec(mut body: api::AddTask) -> Result<TaskSpec, ApiError> {
    // What the executor reads of the spec is checked now, not when the task runs; retries given
    // beside the spec are kept in it.
    let invalid = |why: String| ApiError::invalid_argument(format!("task `{}`: {why}", body.id));
    let spec = allot_api::spec::with_retries(body.spec.take(), body.retries).map_err(invalid)?;
    if let Some(spec) = &spec {
        allot_api::spec::retries(spec).map_err(|why| invalid(format!("spec: {why}")))?;
    }
    Ok(TaskSpec {
        preemptable: body.preemptable.unwrap_or(true),
        id: task_id(&body.id)?,
        resources: resources(&body.resources)?,
        tokens: needs_in(body.tokens)?,
        group: body.group.as_deref().map(GroupName::new).transpose()?,
        priority: priority(body.priority, body.priority_class),
        selector: body.selector,
        spec: spec.map(|v| v.to_string()).unwrap_or_default(),
    })
}

fn waiting(why: Option<Why>) -> Option<api::Waiting> {
    why.map(|why| api::Waiting { code: why.code().to_owned(), message: why.to_string() })
}

fn placement(p: &Placement) -> api::Placement {
    api::Placement {
        pool: p.pool.to_string(),
        alloc: p.alloc.to_string(),
        uri: format!("{}/{}", p.pool, p.alloc),
        resources: p.resources.to_string(),
        tokens: p.grants.iter().map(held).collect(),
    }
}

fn held(h: &HeldTokens) -> api::HeldTokens {
    api::HeldTokens { namespace: h.namespace.to_string(), token: h.token.to_string(), units: h.units }
}

/// The store's clock and the wall clock at one moment: the store's times (on its clock) are
/// given as timestamps by their distance from now.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Times {
    now: Millis,
    wall: Millis,
}

impl Times {
    pub(crate) fn of(store: &dyn allot_store::Store) -> Times {
        let (now, wall) = store.now_and_wall();
        Times { now, wall }
    }

    /// At `now` of the store's clock, read as milliseconds since the Unix epoch (as a watch
    /// event's `at_ms` is: its frame is encoded once, for every watcher, at any later time).
    pub(crate) fn on_store_clock(now: Millis) -> Times {
        Times { now, wall: now }
    }

    /// The store's time `at` as an RFC 3339 timestamp (UTC, milliseconds).
    pub(crate) fn timestamp(self, at: Millis) -> String {
        let wall = (self.wall + at).saturating_sub(self.now);
        humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_millis(wall)).to_string()
    }
}

/// The core's order of a list of applications.
pub(crate) fn app_order(sort: api::AppSort) -> AppOrder {
    match sort {
        api::AppSort::Id => AppOrder::Id,
        api::AppSort::Submitted => AppOrder::Submitted { descending: false },
        api::AppSort::SubmittedNewestFirst => AppOrder::Submitted { descending: true },
        api::AppSort::Ended => AppOrder::Ended { descending: false },
        api::AppSort::EndedNewestFirst => AppOrder::Ended { descending: true },
    }
}

pub(crate) fn app(info: AppInfo, times: Times) -> api::App {
    let now = times.now;
    let AppInfo { app, tasks, why, released } = info;
    let spec = &app.spec;
    let expires = app
        .reserved_at
        .filter(|_| app.holds_free_slots())
        .map(|at| at.saturating_add(spec.policy.placeholder_timeout_ms).saturating_sub(now));
    api::App {
        id: spec.id.to_string(),
        queue: spec.queue.to_string(),
        queue_rule: spec.queue_rule.as_ref().map(|rule| rule.rule.clone()),
        user: spec.user.clone(),
        user_groups: spec.user_groups.clone(),
        tags: spec.tags.clone(),
        state: app.state.name().to_owned(),
        task_groups: spec
            .groups
            .iter()
            .map(|g| api::TaskGroup {
                name: g.name.to_string(),
                min_members: g.min_members,
                min_resources: g.min_resources.to_string(),
                selector: g.selector.clone(),
                tokens: needs_out(&g.tokens),
            })
            .collect(),
        policy: api::SchedulingPolicy {
            placeholder_timeout_ms: Some(spec.policy.placeholder_timeout_ms),
            gang: Some(match spec.policy.gang {
                GangStyle::Soft => api::GangStyle::Soft,
                GangStyle::Hard => api::GangStyle::Hard,
            }),
            reserve_timeout_ms: spec.policy.reserve_timeout_ms,
            max_parallelism: spec.policy.max_parallelism.map(u64::from),
        },
        priority: spec.priority.value(),
        priority_class: spec.priority.class.clone(),
        tasks: tasks.into_iter().map(|(state, n): (TaskState, u64)| (state.name().to_owned(), n)).collect(),
        held_on: if app.awaits_gang() { app.held.iter().map(|pool| pool.to_string()).collect() } else { Vec::new() },
        placeholders: app
            .slots
            .iter()
            .map(|s| api::Placeholder {
                group: s.group.to_string(),
                member: s.member,
                placement: placement(&s.placement),
                task: s.task.as_ref().map(|t| t.to_string()),
            })
            .collect(),
        placeholders_expire_in_ms: expires,
        waiting: waiting(why),
        reason: app.reason.clone(),
        submitted_ms_ago: now.saturating_sub(app.submitted),
        submitted_at: times.timestamp(app.submitted),
        ended_at: app.ended_at.map(|at| times.timestamp(at)),
        released: released.map(|released| {
            let resources = released
                .placements
                .iter()
                .fold(allot_core::Resources::new(), |sum, p| sum.checked_add(&p.resources).unwrap_or(sum));
            api::Released {
                tasks_killed: released.tasks_killed.iter().map(|t| t.to_string()).collect(),
                placements: released.placements.iter().map(placement).collect(),
                resources: resources.to_string(),
            }
        }),
    }
}

pub(crate) fn task(info: TaskInfo, now: Millis) -> api::Task {
    let TaskInfo { task, why } = info;
    let spec = task.spec;
    api::Task {
        app: task.app.to_string(),
        id: spec.id.to_string(),
        seq: task.seq,
        state: task.state.name().to_owned(),
        resources: spec.resources.to_string(),
        tokens: needs_out(&spec.tokens),
        group: spec.group.map(|g| g.to_string()),
        priority: spec.priority.value(),
        priority_class: spec.priority.class,
        preemptable: spec.preemptable,
        preemptions: task.preemptions,
        preempting: task.preempting.as_ref().map(|p| api::Preempting {
            by: p.by.as_ref().map(|(app, task)| format!("{app}/{task}")),
            reason: p.reason.clone(),
            since_ms_ago: now.saturating_sub(p.at),
        }),
        held_on: task.held.as_ref().map(|pool| pool.to_string()),
        selector: spec.selector,
        spec: (!spec.spec.is_empty()).then(|| serde_json::from_str(&spec.spec).ok()).flatten(),
        placement: task.placement.as_ref().map(placement),
        waiting: waiting(why),
        reason: task.reason,
    }
}

#[cfg(test)]
mod tests {
    /// The bound the API checks a spec's `retries` against is the one the core's retry policy
    /// and the document state.
    #[test]
    fn the_retries_bound_is_one() {
        assert_eq!(allot_api::spec::MAX_RETRIES, allot_core::runs::MAX_RETRIES);
    }
}
