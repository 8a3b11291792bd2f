//! How the answers of `allot queue`, `allot app` and `allot task` print for people: tables, details
//! and one-line answers, resources rounded (`--json` prints the daemon's exact text form), and
//! the ids `--quiet` prints. `run` and `follow` show tasks with the same words (`ended`,
//! `task_state`, `tasks_by_state`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use allot_client::{
    AddTaskResponse, App, AppList, Placeholder, PreemptionPolicy, PriorityPolicy, PutQueueResponse, Queue, QueueList,
    RemovedQueue, SortPolicy, SubmitAppResponse, Task, TaskList, TaskRun, TokenNeed, Waiting,
};
use serde::Serialize;

use super::{count, format_ms, human, ids, key_values, or_dash, show, Align, Table};

/// `app show --json`: the application and its tasks, as the daemon answered them.
#[derive(Debug, Serialize)]
pub(crate) struct AppDetails {
    pub(crate) app: App,
    pub(crate) tasks: Vec<Task>,
}

/// The states of tasks in the order of their life.
const TASK_STATES: [&str; 9] =
    ["New", "Pending", "Scheduling", "Allocated", "Running", "Completed", "Failed", "Killed", "Rejected"];

/// Tasks by state, in the order of their life: `2 Running, 1 Pending`; `no tasks`.
pub(crate) fn tasks_by_state(tasks: &BTreeMap<String, u64>) -> String {
    let rank = |state: &str| TASK_STATES.iter().position(|s| *s == state).unwrap_or(TASK_STATES.len());
    let mut states: Vec<(&String, &u64)> = tasks.iter().filter(|(_, n)| **n > 0).collect();
    // Live states first (the ones a person looks for), ended ones after.
    states.sort_by_key(|(state, _)| {
        let rank = rank(state);
        (rank >= 5, std::cmp::Reverse(rank.min(4)), rank)
    });
    if states.is_empty() {
        return "no tasks".to_owned();
    }
    states.iter().map(|(state, n)| format!("{n} {state}")).collect::<Vec<_>>().join(", ")
}

/// `3 tasks: 2 Running, 1 Pending`.
pub(crate) fn tasks_line(tasks: &BTreeMap<String, u64>) -> String {
    let total: u64 = tasks.values().sum();
    if total == 0 {
        return "no tasks".to_owned();
    }
    format!("{}: {}", count(total, "task", "tasks"), tasks_by_state(tasks))
}

fn sort_name(sort: SortPolicy) -> &'static str {
    match sort {
        SortPolicy::Fifo => "fifo",
        SortPolicy::Fair => "fair",
        SortPolicy::Priority => "priority",
    }
}

/// The limits a queue has: `max cpu=8, max apps 2, sort fifo`.
pub(crate) fn limits_line(queue: &Queue) -> String {
    let mut parts = Vec::new();
    if !queue.guaranteed.is_empty() {
        parts.push(format!("guaranteed {}", human(&queue.guaranteed)));
    }
    if let Some(max) = &queue.max {
        parts.push(format!("max {}", human(max)));
    }
    if let Some(n) = queue.max_apps {
        parts.push(format!("max apps {n}"));
    }
    if let Some(n) = queue.user_max_apps {
        parts.push(format!("user max apps {n}"));
    }
    if let Some(max) = &queue.user_max {
        parts.push(format!("user max {}", human(max)));
    }
    if let Some(n) = queue.group_max_apps {
        parts.push(format!("group max apps {n}"));
    }
    if let Some(max) = &queue.group_max {
        parts.push(format!("group max {}", human(max)));
    }
    if let Some(limit) = &queue.borrow_limit {
        parts.push(format!("borrow limit {}", human(limit)));
    }
    if let Some(limit) = &queue.lend_limit {
        parts.push(format!("lend limit {}", human(limit)));
    }
    if queue.priority_offset != 0 {
        parts.push(format!("priority offset {}", queue.priority_offset));
    }
    if queue.priority_policy == PriorityPolicy::Fence {
        parts.push("priority fenced".to_owned());
    }
    match queue.preemption {
        PreemptionPolicy::Default => {}
        PreemptionPolicy::Fence => parts.push("preemption fenced".to_owned()),
        PreemptionPolicy::Disabled => parts.push("preemption disabled".to_owned()),
    }
    if let Some(ms) = queue.preemption_delay_ms {
        parts.push(format!("preemption delay {}", format_ms(ms)));
    }
    parts.push(format!("sort {}", sort_name(queue.sort)));
    parts.join(", ")
}

fn optional(resources: Option<&String>) -> String {
    resources.map_or_else(|| "-".to_owned(), |r| human(r))
}

pub(crate) fn queue_table(queues: &[Queue]) -> String {
    if queues.is_empty() {
        return "no queues\n".to_owned();
    }
    let mut table = Table::new(&[
        ("QUEUE", Align::Left),
        ("USED", Align::Left),
        ("MAX", Align::Left),
        ("GUARANTEED", Align::Left),
        ("RUNNING APPS", Align::Right),
        ("APPS", Align::Right),
        ("PENDING TASKS", Align::Right),
        ("SORT", Align::Left),
    ]);
    for queue in queues {
        table.row(vec![
            queue.path.clone(),
            or_dash(&queue.used),
            optional(queue.max.as_ref()),
            or_dash(&queue.guaranteed),
            match queue.max_apps {
                Some(max) => format!("{}/{max}", queue.running_apps),
                None => queue.running_apps.to_string(),
            },
            queue.apps.to_string(),
            queue.pending_tasks.to_string(),
            sort_name(queue.sort).to_owned(),
        ]);
    }
    table.render()
}

pub(crate) fn queue_details(queue: &Queue) -> String {
    let number = |n: Option<u64>| n.map_or_else(|| "-".to_owned(), |n| n.to_string());
    key_values(&[
        ("queue", queue.path.clone()),
        ("leaf", if queue.leaf { "yes: takes applications" } else { "no: has child queues" }.to_owned()),
        ("used", or_dash(&queue.used)),
        ("max", optional(queue.max.as_ref())),
        ("guaranteed", or_dash(&queue.guaranteed)),
        ("running apps", queue.running_apps.to_string()),
        ("max apps", number(queue.max_apps)),
        ("user max apps", number(queue.user_max_apps)),
        ("user max", optional(queue.user_max.as_ref())),
        ("group max apps", number(queue.group_max_apps)),
        ("group max", optional(queue.group_max.as_ref())),
        ("borrow limit", optional(queue.borrow_limit.as_ref())),
        ("lend limit", optional(queue.lend_limit.as_ref())),
        ("priority offset", queue.priority_offset.to_string()),
        (
            "priority policy",
            match queue.priority_policy {
                PriorityPolicy::Default => "default",
                PriorityPolicy::Fence => "fence",
            }
            .to_owned(),
        ),
        (
            "preemption",
            match queue.preemption {
                PreemptionPolicy::Default => "default",
                PreemptionPolicy::Fence => "fence",
                PreemptionPolicy::Disabled => "disabled",
            }
            .to_owned(),
        ),
        ("preemption delay", queue.preemption_delay_ms.map_or_else(|| "30s (default)".to_owned(), format_ms)),
        ("apps", queue.apps.to_string()),
        ("pending tasks", queue.pending_tasks.to_string()),
        ("sort", sort_name(queue.sort).to_owned()),
    ])
}

fn waiting_text(waiting: Option<&Waiting>) -> String {
    waiting.map_or_else(|| "-".to_owned(), |w| format!("{} ({})", w.message, w.code))
}

pub(crate) fn app_table(apps: &[App]) -> String {
    if apps.is_empty() {
        return "no apps\n".to_owned();
    }
    let mut table = Table::new(&[
        ("APP", Align::Left),
        ("QUEUE", Align::Left),
        ("USER", Align::Left),
        ("STATE", Align::Left),
        ("TASKS", Align::Left),
        ("WAITING", Align::Left),
        ("SUBMITTED", Align::Left),
    ]);
    for app in apps {
        table.row(vec![
            show(&app.id),
            app.queue.clone(),
            show(&app.user),
            app.state.clone(),
            tasks_by_state(&app.tasks),
            app.waiting.as_ref().map_or_else(|| "-".to_owned(), |w| w.code.clone()),
            app.submitted_at.clone(),
        ]);
    }
    table.render()
}

fn map_text(map: &BTreeMap<String, String>) -> String {
    if map.is_empty() {
        return "-".to_owned();
    }
    map.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

fn needs_text(needs: &[TokenNeed]) -> String {
    if needs.is_empty() {
        return "-".to_owned();
    }
    needs.iter().map(|n| format!("{}={}", show(&n.namespace), n.units)).collect::<Vec<_>>().join(",")
}

pub(crate) fn app_details(details: &AppDetails) -> String {
    let app = &details.app;
    let policy = &app.policy;
    let mut pairs = vec![
        ("app", show(&app.id)),
        ("queue", app.queue.clone()),
        (
            "placed by",
            app.queue_rule.as_ref().map_or_else(|| "the queue it named".to_owned(), |rule| format!("rule `{rule}`")),
        ),
        ("user", show(&app.user)),
        (
            "groups",
            if app.user_groups.is_empty() {
                "-".to_owned()
            } else {
                app.user_groups.iter().map(|g| show(g)).collect::<Vec<_>>().join(",")
            },
        ),
        ("state", app.state.clone()),
        ("tags", map_text(&app.tags)),
        ("tasks", tasks_line(&app.tasks)),
        ("waiting", waiting_text(app.waiting.as_ref())),
        ("reason", app.reason.clone().unwrap_or_else(|| "-".to_owned())),
    ];
    if !app.task_groups.is_empty() {
        let groups: Vec<String> = app
            .task_groups
            .iter()
            .map(|g| {
                let mut text = format!("{} ({} × {}", g.name, g.min_members, human(&g.min_resources));
                if !g.tokens.is_empty() {
                    let _ = write!(text, ", tokens {}", needs_text(&g.tokens));
                }
                if !g.selector.is_empty() {
                    let _ = write!(text, ", selector {}", map_text(&g.selector));
                }
                text + ")"
            })
            .collect();
        pairs.push(("task groups", groups.join("; ")));
        let gang = match policy.gang.unwrap_or_default() {
            allot_client::GangStyle::Soft => "Soft",
            allot_client::GangStyle::Hard => "Hard",
        };
        pairs.push(("gang", gang.to_owned()));
        let taken = app.placeholders.iter().filter(|p| p.task.is_some()).count();
        pairs.push(("placeholders", format!("{} held, {taken} taken over by tasks", app.placeholders.len())));
        pairs.push((
            "timeout left",
            app.placeholders_expire_in_ms
                .map_or_else(|| "-".to_owned(), |ms| format!("{} (placeholders)", format_ms(ms))),
        ));
        if let Some(ms) = policy.reserve_timeout_ms {
            pairs.push(("reserve timeout", format_ms(ms)));
        }
    }
    let mut text = key_values(&pairs);
    text.push('\n');
    text.push_str(&task_table(&details.tasks));
    if !app.placeholders.is_empty() {
        text.push('\n');
        text.push_str(&placeholder_table(&app.placeholders));
    }
    text
}

fn placeholder_table(placeholders: &[Placeholder]) -> String {
    let mut table = Table::new(&[
        ("PLACEHOLDER", Align::Left),
        ("RUNS ON", Align::Left),
        ("RESOURCES", Align::Left),
        ("TASK", Align::Left),
    ]);
    for p in placeholders {
        table.row(vec![
            format!("{}#{}", p.group, p.member + 1),
            p.placement.uri.clone(),
            human(&p.placement.resources),
            p.task.as_deref().map_or_else(|| "-".to_owned(), show),
        ]);
    }
    table.render()
}

/// True for the states a task ended in.
pub(crate) fn ended(task: &Task) -> bool {
    matches!(task.state.as_str(), "Completed" | "Failed" | "Killed" | "Rejected")
}

/// Where a task runs (or ran): `pool/alloc`, or `-`.
fn runs_on(task: &Task) -> String {
    task.placement.as_ref().map_or_else(|| "-".to_owned(), |p| p.uri.clone())
}

pub(crate) fn task_state(task: &Task) -> String {
    match (&task.placement, ended(task)) {
        (Some(p), false) => format!("{} on {}", task.state, p.uri),
        _ => task.state.clone(),
    }
}

/// A run's phase as its user reads it: a run that ended on a retryable failure with no retry
/// left has failed for good (see [`failed_for_good`]); any other phase is its plugin's own.
pub(crate) fn phase_shown(run: &TaskRun) -> String {
    failed_for_good(run).unwrap_or_else(|| run.phase.clone())
}

/// `Failed (retryable failure, no retries left: exit status 3)` for a run that ended on a
/// retryable failure because its retries were used up; `None` for any other run.
pub(crate) fn failed_for_good(run: &TaskRun) -> Option<String> {
    let cause = run.ending.as_deref()?.strip_prefix("failed: ")?;
    (run.stage == "ended" && run.phase == "RetryableFailure")
        .then(|| format!("Failed (retryable failure, no retries left: {cause})"))
}

/// A run's summary, then its timeline.
pub(crate) fn run_timeline(run: &TaskRun) -> String {
    let failures = format!("{} user, {} system", run.user_failures, run.system_failures);
    let mut pairs = vec![
        ("app", show(&run.app)),
        ("task", show(&run.task)),
        ("attempt", run.attempt.to_string()),
        ("phase", phase_shown(run)),
        ("stage", run.stage.clone()),
        ("ending", run.ending.clone().unwrap_or_else(|| "-".to_owned())),
        ("failures", failures),
        ("outputs", run.outputs.as_ref().map_or_else(|| "-".to_owned(), serde_json::Value::to_string)),
    ];
    pairs.extend(cache_pairs(run));
    let mut out = key_values(&pairs);
    out.push('\n');
    let mut table = Table::new(&[
        ("ATTEMPT", Align::Right),
        ("PHASE", Align::Left),
        ("VERSION", Align::Right),
        ("AT (UTC)", Align::Left),
        ("OCCURRED (UTC)", Align::Left),
        ("REASON", Align::Left),
    ]);
    // What plugins told of their events beyond the table: log links and custom information.
    let mut told = String::new();
    for event in &run.events {
        let reason = match &event.error {
            Some(error) => format!("{} ({} error {})", event.reason, error.kind, error.code),
            None => event.reason.clone(),
        };
        table.row(vec![
            event.attempt.to_string(),
            event.phase.clone(),
            event.version.to_string(),
            utc(event.at_ms),
            event.occurred_at_ms.map_or_else(|| "-".to_owned(), utc),
            reason,
        ]);
        if event.logs.is_empty() && event.custom_info.is_none() {
            continue;
        }
        told.push_str(&format!("attempt {} {} v{}:\n", event.attempt, event.phase, event.version));
        for log in &event.logs {
            told.push_str(&format!("  log {}: {}\n", show(&log.name), show(&log.uri)));
        }
        if let Some(info) = &event.custom_info {
            told.push_str(&format!("  custom info: {}\n", json_text(info)));
        }
    }
    out.push_str(&table.render());
    if !told.is_empty() {
        out.push('\n');
        out.push_str(&told);
    }
    out
}

/// A time in ms since the epoch, in UTC (RFC 3339).
fn utc(ms: u64) -> String {
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms)).to_string()
}

/// JSON as text, quoted again if a string in it holds what a terminal takes as a control.
fn json_text(value: &serde_json::Value) -> String {
    let text = value.to_string();
    if text.chars().any(char::is_control) {
        format!("{text:?}")
    } else {
        text
    }
}

/// What the plugin last told of the current attempt: since when its phase is (as the plugin
/// says it began), its log links and its custom information.
fn attempt_pairs(run: &TaskRun) -> Vec<(&'static str, String)> {
    let attempt: Vec<_> = run.events.iter().filter(|e| e.attempt == run.attempt).collect();
    let mut pairs = Vec::new();
    if let Some(first) = attempt.iter().find(|e| e.phase == run.phase) {
        pairs.push(("phase since", utc(first.occurred_at_ms.unwrap_or(first.at_ms))));
    }
    if let Some(event) = attempt.iter().rev().find(|e| !e.logs.is_empty()) {
        let links: Vec<String> = event.logs.iter().map(|l| format!("{}: {}", show(&l.name), show(&l.uri))).collect();
        pairs.push(("logs", links.join(", ")));
    }
    if let Some(info) = attempt.iter().rev().find_map(|e| e.custom_info.as_ref()) {
        pairs.push(("custom info", json_text(info)));
    }
    pairs
}

pub(crate) fn task_table(tasks: &[Task]) -> String {
    if tasks.is_empty() {
        return "no tasks\n".to_owned();
    }
    let mut table = Table::new(&[
        ("TASK", Align::Left),
        ("STATE", Align::Left),
        ("RESOURCES", Align::Left),
        ("RUNS ON", Align::Left),
        ("TOKENS", Align::Left),
        ("WAITING", Align::Left),
    ]);
    for task in tasks {
        table.row(vec![
            show(&task.id),
            task.state.clone(),
            human(&task.resources),
            runs_on(task),
            needs_text(&task.tokens),
            task.waiting.as_ref().map_or_else(|| "-".to_owned(), |w| w.message.clone()),
        ]);
    }
    table.render()
}

/// What the output cache looked up for a run: whether it hit, the key and its parts (two tasks
/// share outputs only when every part is the same).
fn cache_pairs(run: &TaskRun) -> Vec<(&'static str, String)> {
    let Some(cache) = &run.cache else { return Vec::new() };
    let outcome = match &cache.hit {
        Some(from) => format!("hit: the outputs of {}", show(from)),
        None => "miss: it runs, and its outputs are kept".to_owned(),
    };
    let parts = format!(
        "type {}, plugin {}, cache_version {}, spec sha256:{}, inputs sha256:{}",
        show(&cache.task_type),
        show(&cache.plugin),
        show(&cache.cache_version),
        cache.spec_digest,
        cache.inputs_digest
    );
    vec![("cache", outcome), ("cache key", cache.key.clone()), ("key parts", parts)]
}

pub(crate) fn task_details(task: &Task, run: Option<&TaskRun>) -> String {
    let placement = task.placement.as_ref();
    let held = placement
        .filter(|p| !p.tokens.is_empty())
        .map(|p| {
            p.tokens
                .iter()
                .map(|t| format!("{}={} (token {})", show(&t.namespace), t.units, show(&t.token)))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_else(|| "-".to_owned());
    let mut pairs = vec![
        ("app", show(&task.app)),
        ("task", show(&task.id)),
        ("state", task.state.clone()),
        ("resources", human(&task.resources)),
        ("tokens", needs_text(&task.tokens)),
        ("group", task.group.as_deref().map_or_else(|| "-".to_owned(), show)),
        (
            "priority",
            match &task.priority_class {
                Some(class) => format!("{} (class {})", task.priority, show(class)),
                None => task.priority.to_string(),
            },
        ),
        (
            "preemption",
            match (&task.preempting, task.preemptable) {
                (Some(p), _) => match &p.by {
                    Some(by) => format!("being preempted for {} ({})", show(by), show(&p.reason)),
                    None => format!("being preempted ({})", show(&p.reason)),
                },
                (None, false) => "never (preemptable: false)".to_owned(),
                (None, true) => format!("preempted {} times", task.preemptions),
            },
        ),
        ("selector", map_text(&task.selector)),
        (if ended(task) { "ran on" } else { "runs on" }, runs_on(task)),
        ("holds", placement.map_or_else(|| "-".to_owned(), |p| human(&p.resources))),
        ("held tokens", held),
        ("waiting", waiting_text(task.waiting.as_ref())),
        ("reason", task.reason.clone().unwrap_or_else(|| "-".to_owned())),
        ("spec", task.spec.as_ref().map_or_else(|| "-".to_owned(), serde_json::Value::to_string)),
    ];
    if let Some(run) = run {
        pairs.push(("attempt", format!("{}: {}", run.attempt, phase_shown(run))));
        pairs.extend(attempt_pairs(run));
        pairs.extend(cache_pairs(run));
    }
    key_values(&pairs)
}

/// `completed app etl-nightly: Completed`.
pub(crate) fn app_line(verb: &str, app: &App) -> String {
    let mut line = format!("{verb} app {}: {}", show(&app.id), app.state);
    if let Some(reason) = &app.reason {
        let _ = write!(line, " ({reason})");
    }
    if let Some(released) = &app.released {
        let killed = released.tasks_killed.len();
        let _ = match released.placements.len() {
            0 => write!(line, "; {killed} tasks killed, nothing was held"),
            n => write!(line, "; {killed} tasks killed, released {n} allocs ({})", released.resources),
        };
    }
    line + "\n"
}

/// `started task etl-nightly/extract: Running on worker-1/4f2a...`.
pub(crate) fn task_line(verb: &str, task: &Task) -> String {
    let mut line = format!("{verb} task {}/{}: {}", show(&task.app), show(&task.id), task_state(task));
    if let Some(reason) = &task.reason {
        let _ = write!(line, " ({reason})");
    }
    line + "\n"
}

// What `-q` prints for each answer: the ids it names.
ids!(
    Queue => |it| vec![it.path.clone()],
    QueueList => |it| it.queues.iter().map(|queue| queue.path.clone()).collect(),
    PutQueueResponse => |it| it.queue.ids(),
    RemovedQueue => |it| vec![it.path.clone()],
    App => |it| vec![it.id.clone()],
    AppList => |it| it.apps.iter().map(|app| app.id.clone()).collect(),
    SubmitAppResponse => |it| it.app.ids(),
    AppDetails => |it| it.app.ids(),
    Task => |it| vec![it.id.clone()],
    TaskList => |it| it.tasks.iter().map(|task| task.id.clone()).collect(),
    AddTaskResponse => |it| it.task.ids(),
    TaskRun => |it| vec![it.task.clone()],
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_by_state_live_first() {
        let tasks: BTreeMap<String, u64> =
            [("Completed", 1), ("Pending", 2), ("Running", 3), ("New", 0)].map(|(s, n)| (s.to_owned(), n)).into();
        assert_eq!(tasks_by_state(&tasks), "3 Running, 2 Pending, 1 Completed");
        assert_eq!(tasks_line(&tasks), "6 tasks: 3 Running, 2 Pending, 1 Completed");
        assert_eq!(tasks_line(&BTreeMap::new()), "no tasks");
    }
}
