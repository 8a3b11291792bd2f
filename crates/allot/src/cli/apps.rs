//! The CLI commands of applications: `allot queue ...`, `allot app ...` and `allot task ...`.
//! An application is submitted from a file, YAML or TOML, that holds the fields of the API's
//! `SubmitApp` (docs/examples/etl.yaml); a task is added with flags. Resources are shown rounded
//! for people; `--json` shows the daemon's exact text form.
//!
//! At length, as one thing: the commands of the applications part and how each prints.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::ExitCode;

use allot_client::{
    AddTask, AddTaskResponse, App, AppList, ClientError, Placeholder, PutQueue, PutQueueResponse, Queue, QueueList,
    RemovedQueue, SortPolicy, SubmitAppResponse, Task, TaskList, TaskRun, TokenNeed, Waiting,
};
use serde::Serialize;

use crate::appfile::read_app;
use crate::cli::{
    client, count, emit, finish, format_ms, human, key_value, key_values, or_dash, show, usage_error, Align, Common,
    Ids, Table, EXIT_CODES, EXIT_ERROR, EXIT_USAGE,
};

/// `allot app submit`'s help after the options: the file's fields and the exit codes.
const SUBMIT_AFTER_HELP: &str = "\
The file holds one application, with the fields of the API's SubmitApp:
  id           the application's id: 1 to 100 of A-Z, a-z, 0-9, `.`, `_`, `-`
  queue        a leaf queue, e.g. root.analytics.etl
  user         who submits it (default: default)
  tags         names to text, for people and tools
  task_groups  gangs, started all or nothing: name, min_members, min_resources, selector, tokens
  policy       placeholder_timeout_ms, gang (Soft or Hard), reserve_timeout_ms, max_parallelism
  tasks        id, resources, tokens (namespace, units), group, priority, selector, spec
A field it does not know is refused. Examples: docs/examples/etl.yaml and docs/examples/etl.toml.

Exit codes (the same with --json and --quiet):
  0  submitted (also when the same application was submitted before)
  1  error: the file cannot be read or does not hold an application (`error: FILE:LINE:COLUMN: FIELD: message`
     on stderr), or the daemon refused it (`error: <code>: <message>`) or cannot be reached
  2  usage error (also a FILE whose name ends in neither .yaml, .yml nor .toml)";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Sort {
    /// Submission order: each application places all it can before the next.
    Fifo,
    /// Round robin, least used first.
    Fair,
    /// The application with the highest-priority pending task first.
    Priority,
}

impl From<Sort> for SortPolicy {
    fn from(sort: Sort) -> SortPolicy {
        match sort {
            Sort::Fifo => SortPolicy::Fifo,
            Sort::Fair => SortPolicy::Fair,
            Sort::Priority => SortPolicy::Priority,
        }
    }
}

#[derive(Debug, clap::Subcommand)]
pub(crate) enum QueueCommand {
    /// List the queues with their limits and use (quantities rounded; --json is exact).
    #[command(after_help = EXIT_CODES)]
    List {
        #[command(flatten)]
        common: Common,
    },
    /// Show one queue: its limits and what its applications use.
    #[command(visible_alias = "get", after_help = EXIT_CODES)]
    Show {
        /// The queue's path, e.g. `root.analytics.etl`.
        path: String,
        #[command(flatten)]
        common: Common,
    },
    /// Create a queue (and its parents), or set its limits. The queue gets exactly the limits
    /// given: a limit left out is no limit.
    #[command(after_help = EXIT_CODES)]
    Set {
        /// The queue's path, e.g. `root.analytics.etl`.
        path: String,
        /// What the queue is guaranteed, for fair share between sibling queues, e.g.
        /// `cpu=8,mem=32GiB`.
        #[arg(long, value_name = "RESOURCES")]
        guaranteed: Option<String>,
        /// The most its applications may hold together, e.g. `cpu=16,mem=64GiB`.
        #[arg(long, value_name = "RESOURCES")]
        max: Option<String>,
        /// The most applications running in it at once.
        #[arg(long, value_name = "N")]
        max_apps: Option<u64>,
        /// The most applications one user runs in it at once.
        #[arg(long, value_name = "N")]
        user_max_apps: Option<u64>,
        /// The most one user's applications may hold in it together.
        #[arg(long, value_name = "RESOURCES")]
        user_max: Option<String>,
        /// How it orders its applications [default: fifo].
        #[arg(long, value_enum)]
        sort: Option<Sort>,
        #[command(flatten)]
        common: Common,
    },
    /// Remove a leaf queue with no live application.
    #[command(visible_alias = "rm", after_help = EXIT_CODES)]
    Remove {
        /// The queue's path.
        path: String,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Debug, clap::Subcommand)]
pub(crate) enum AppCommand {
    /// Submit an application from a file: YAML (`.yaml`, `.yml`), TOML (`.toml`), or `-` for YAML
    /// on stdin. The same file again is answered as it is; other content under its id is refused.
    #[command(after_help = SUBMIT_AFTER_HELP)]
    Submit {
        /// The file, or `-` to read YAML from stdin.
        file: String,
        #[command(flatten)]
        common: Common,
    },
    /// List the applications: queue, user, state and tasks by state.
    #[command(after_help = EXIT_CODES)]
    List {
        #[command(flatten)]
        common: Common,
    },
    /// Show an application and every task: where each runs, and why each waiting one waits
    /// (--json prints `{"app": ..., "tasks": [...]}`, the daemon's two answers).
    #[command(visible_alias = "get", after_help = EXIT_CODES)]
    Show {
        /// The application's id.
        id: String,
        #[command(flatten)]
        common: Common,
    },
    /// Report an application complete: tasks that have not ended are killed, and everything it
    /// holds is released.
    #[command(after_help = EXIT_CODES)]
    Complete {
        /// The application's id.
        id: String,
        #[command(flatten)]
        common: Common,
    },
    /// Report an application failed: tasks not placed fail, placed ones are killed, and
    /// everything it holds is released.
    #[command(after_help = EXIT_CODES)]
    Fail {
        /// The application's id.
        id: String,
        /// Why it failed, for people reading `app show`.
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Remove an application: its tasks end, and every alloc and grant it holds is released.
    #[command(visible_alias = "rm", after_help = EXIT_CODES)]
    Remove {
        /// The application's id.
        id: String,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Debug, clap::Subcommand)]
pub(crate) enum TaskCommand {
    /// Add a task to an application (the same task again is answered as it is).
    #[command(after_help = EXIT_CODES)]
    Add {
        /// The application's id.
        app: String,
        /// The task's id, unique in its application.
        #[arg(long, value_name = "ID")]
        id: String,
        /// What it needs, e.g. `cpu=2,mem=4GiB`.
        #[arg(long, value_name = "RESOURCES")]
        resources: String,
        /// Its task group, if it is a member of the application's gang.
        #[arg(long, value_name = "GROUP")]
        group: Option<String>,
        /// Higher first, inside its application (and in a queue sorted by priority).
        #[arg(long, value_name = "N", default_value_t = 0, allow_negative_numbers = true)]
        priority: i32,
        /// Units of a token namespace's quota it holds while placed, `NAMESPACE=UNITS`;
        /// repeatable.
        #[arg(long = "token", value_name = "NS=UNITS", value_parser = token_need)]
        tokens: Vec<TokenNeed>,
        /// It goes only to pools with this label, `KEY=VALUE`; repeatable.
        #[arg(long = "selector", value_name = "KEY=VALUE", value_parser = key_value)]
        selector: Vec<(String, String)>,
        /// Whatever runs the task needs, as JSON (opaque to allot).
        #[arg(long, value_name = "JSON", value_parser = json_value)]
        spec: Option<serde_json::Value>,
        /// New attempts after user failures (kept in its spec, where the executor reads them).
        #[arg(long, value_name = "N")]
        retries: Option<u64>,
        #[command(flatten)]
        common: Common,
    },
    /// List an application's tasks: state, where each runs, and why each waiting one waits.
    #[command(after_help = EXIT_CODES)]
    List {
        /// The application's id.
        app: String,
        #[command(flatten)]
        common: Common,
    },
    /// Show a task: its state, where it runs (pool/alloc and tokens), or why it waits.
    #[command(visible_alias = "get", after_help = EXIT_CODES)]
    Show {
        /// The application's id.
        app: String,
        /// The task's id.
        task: String,
        #[command(flatten)]
        common: Common,
    },
    /// Show how a task is being run by its plugin: attempt, phase, and the phase timeline (one
    /// event per attempt, phase and version).
    #[command(after_help = EXIT_CODES)]
    Events {
        /// The application's id.
        app: String,
        /// The task's id.
        task: String,
        #[command(flatten)]
        common: Common,
    },
    /// Print a task's log (stdout by default), read on the daemon that runs it; `--follow`
    /// goes on printing what is written until the attempt ends.
    #[command(after_help = EXIT_CODES)]
    Logs {
        /// The application's id.
        app: String,
        /// The task's id.
        task: String,
        /// The log: `stdout` or `stderr` for shell tasks; a plugin may name others.
        #[arg(long, default_value = "stdout")]
        stream: String,
        /// The attempt (1 for the first); the current one when absent.
        #[arg(long)]
        attempt: Option<u32>,
        /// Keep printing what is written until the attempt ends.
        #[arg(long, short = 'f')]
        follow: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Report an Allocated task running.
    #[command(after_help = EXIT_CODES)]
    Start {
        /// The application's id.
        app: String,
        /// The task's id.
        task: String,
        #[command(flatten)]
        common: Common,
    },
    /// Report a task completed; what it holds is released.
    #[command(after_help = EXIT_CODES)]
    Complete {
        /// The application's id.
        app: String,
        /// The task's id.
        task: String,
        #[command(flatten)]
        common: Common,
    },
    /// Report a task failed; what it holds is released.
    #[command(after_help = EXIT_CODES)]
    Fail {
        /// The application's id.
        app: String,
        /// The task's id.
        task: String,
        /// Why it failed, for people reading `task show`.
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Remove a task; what it holds is released.
    #[command(visible_alias = "rm", after_help = EXIT_CODES)]
    Remove {
        /// The application's id.
        app: String,
        /// The task's id.
        task: String,
        #[command(flatten)]
        common: Common,
    },
}

/// `NAMESPACE=UNITS`: the units follow the last `=`.
fn token_need(text: &str) -> Result<TokenNeed, String> {
    let (namespace, units) = text.rsplit_once('=').ok_or("use NAMESPACE=UNITS, e.g. hive:cluster-a=1")?;
    let units = units.parse().map_err(|_| format!("`{units}` is not a number of units"))?;
    Ok(TokenNeed { namespace: namespace.to_owned(), units })
}

fn json_value(text: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(text).map_err(|err| format!("not JSON: {err}"))
}

/// Runs an `allot queue` command; `before` holds the options given before the command.
pub(crate) async fn queue(mut command: QueueCommand, before: &Common) -> anyhow::Result<ExitCode> {
    let common = match &mut command {
        QueueCommand::List { common }
        | QueueCommand::Show { common, .. }
        | QueueCommand::Set { common, .. }
        | QueueCommand::Remove { common, .. } => common,
    };
    if let Err(usage) = common.merge(before) {
        return Ok(usage_error(&usage));
    }
    let common = common.clone();
    Ok(finish(&common, run_queue(&command).await))
}

/// Runs an `allot app` command; `before` holds the options given before the command.
pub(crate) async fn app(mut command: AppCommand, before: &Common) -> anyhow::Result<ExitCode> {
    let common = match &mut command {
        AppCommand::Submit { common, .. }
        | AppCommand::List { common }
        | AppCommand::Show { common, .. }
        | AppCommand::Complete { common, .. }
        | AppCommand::Fail { common, .. }
        | AppCommand::Remove { common, .. } => common,
    };
    if let Err(usage) = common.merge(before) {
        return Ok(usage_error(&usage));
    }
    let common = common.clone();
    Ok(finish(&common, run_app(&command).await))
}

/// Runs an `allot task` command; `before` holds the options given before the command.
pub(crate) async fn task(mut command: TaskCommand, before: &Common) -> anyhow::Result<ExitCode> {
    let common = match &mut command {
        TaskCommand::Add { common, .. }
        | TaskCommand::List { common, .. }
        | TaskCommand::Show { common, .. }
        | TaskCommand::Events { common, .. }
        | TaskCommand::Logs { common, .. }
        | TaskCommand::Start { common, .. }
        | TaskCommand::Complete { common, .. }
        | TaskCommand::Fail { common, .. }
        | TaskCommand::Remove { common, .. } => common,
    };
    if let Err(usage) = common.merge(before) {
        return Ok(usage_error(&usage));
    }
    let common = common.clone();
    Ok(finish(&common, run_task(&command).await))
}

async fn run_queue(command: &QueueCommand) -> Result<u8, ClientError> {
    match command {
        QueueCommand::List { common } => {
            let answer = client(common)?.queues().await?;
            emit(common, &answer, |list| queue_table(&list.queues))
        }
        QueueCommand::Show { path, common } => {
            let answer = client(common)?.queue(path).await?;
            emit(common, &answer, queue_details)
        }
        QueueCommand::Set { path, guaranteed, max, max_apps, user_max_apps, user_max, sort, common } => {
            let limits = PutQueue {
                guaranteed: guaranteed.clone(),
                max: max.clone(),
                max_apps: *max_apps,
                user_max_apps: *user_max_apps,
                user_max: user_max.clone(),
                sort: sort.map(SortPolicy::from),
            };
            let answer = client(common)?.put_queue(path, &limits).await?;
            emit(common, &answer, |answer| {
                let verb = if answer.created { "created" } else { "set" };
                format!("{verb} queue {} ({})\n", answer.queue.path, limits_line(&answer.queue))
            })
        }
        QueueCommand::Remove { path, common } => {
            let answer = client(common)?.remove_queue(path).await?;
            emit(common, &answer, |answer| format!("removed queue {}\n", answer.path))
        }
    }
}

async fn run_app(command: &AppCommand) -> Result<u8, ClientError> {
    match command {
        AppCommand::Submit { file, common } => {
            let submit = match read_app(file) {
                Ok(submit) => submit,
                Err(err) => {
                    eprintln!("error: {}", err.message);
                    return Ok(if err.usage { EXIT_USAGE } else { EXIT_ERROR });
                }
            };
            let answer = client(common)?.submit_app(&submit).await?;
            emit(common, &answer, |answer| {
                let app = &answer.app;
                let tasks = tasks_line(&app.tasks);
                if answer.created {
                    format!("submitted app {} to queue {} ({tasks})\n", show(&app.id), app.queue)
                } else {
                    format!("app {} was already submitted with this content: {} ({tasks})\n", show(&app.id), app.state)
                }
            })
        }
        AppCommand::List { common } => {
            let answer = client(common)?.apps().await?;
            emit(common, &answer, |list| app_table(&list.apps))
        }
        AppCommand::Show { id, common } => {
            let client = client(common)?;
            let app = client.app(id).await?;
            let tasks = client.tasks(id).await?.tasks;
            emit(common, &AppDetails { app, tasks }, app_details)
        }
        AppCommand::Complete { id, common } => {
            let answer = client(common)?.complete_app(id).await?;
            emit(common, &answer, |app| app_line("completed", app))
        }
        AppCommand::Fail { id, reason, common } => {
            let answer = client(common)?.fail_app(id, reason.as_deref()).await?;
            emit(common, &answer, |app| app_line("failed", app))
        }
        AppCommand::Remove { id, common } => {
            let answer = client(common)?.remove_app(id).await?;
            emit(common, &answer, |app| app_line("removed", app))
        }
    }
}

async fn run_task(command: &TaskCommand) -> Result<u8, ClientError> {
    match command {
        TaskCommand::Add { app, id, resources, group, priority, tokens, selector, spec, retries, common } => {
            let request = AddTask {
                id: id.clone(),
                resources: resources.clone(),
                tokens: tokens.clone(),
                group: group.clone(),
                priority: *priority,
                selector: selector.iter().cloned().collect(),
                spec: spec.clone(),
                retries: *retries,
            };
            let answer = client(common)?.add_task(app, &request).await?;
            emit(common, &answer, |answer| {
                let task = &answer.task;
                let verb = if answer.created { "added" } else { "already added:" };
                format!("{verb} task {}/{} ({})\n", show(&task.app), show(&task.id), task_state(task))
            })
        }
        TaskCommand::List { app, common } => {
            let answer = client(common)?.tasks(app).await?;
            emit(common, &answer, |list| task_table(&list.tasks))
        }
        TaskCommand::Show { app, task, common } => {
            let client = client(common)?;
            let answer = client.task(app, task).await?;
            // Its run too, for the text (a task not run yet has none).
            let run = if common.json || common.quiet { None } else { client.task_run(app, task).await.ok() };
            emit(common, &answer, |answer| task_details(answer, run.as_ref()))
        }
        TaskCommand::Events { app, task, common } => {
            let answer = client(common)?.task_run(app, task).await?;
            emit(common, &answer, run_timeline)
        }
        TaskCommand::Logs { app, task, stream, attempt, follow, common } => {
            follow_logs(&client(common)?, app, task, stream, *attempt, *follow).await?;
            Ok(0)
        }
        TaskCommand::Start { app, task, common } => {
            let answer = client(common)?.start_task(app, task).await?;
            emit(common, &answer, |task| task_line("started", task))
        }
        TaskCommand::Complete { app, task, common } => {
            let answer = client(common)?.complete_task(app, task).await?;
            emit(common, &answer, |task| task_line("completed", task))
        }
        TaskCommand::Fail { app, task, reason, common } => {
            let answer = client(common)?.fail_task(app, task, reason.as_deref()).await?;
            emit(common, &answer, |task| task_line("failed", task))
        }
        TaskCommand::Remove { app, task, common } => {
            let answer = client(common)?.remove_task(app, task).await?;
            emit(common, &answer, |task| task_line("removed", task))
        }
    }
}

/// How often `task logs --follow` reads again when nothing new was written.
const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// Prints a task's log as it is read; with `follow`, until its attempt ends (the attempt is
/// fixed at the first read, so a retry's log is not mixed in).
async fn follow_logs(
    client: &allot_client::Client,
    app: &str,
    task: &str,
    stream: &str,
    mut attempt: Option<u32>,
    follow: bool,
) -> Result<(), allot_client::ClientError> {
    use std::io::Write;
    let mut offset = 0;
    loop {
        let piece = client.task_logs(app, task, Some(stream), attempt, offset).await?;
        attempt = Some(piece.attempt);
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(piece.text.as_bytes());
        let _ = out.flush();
        let more = piece.next_offset > offset;
        offset = piece.next_offset;
        if more {
            continue;
        }
        if !follow || piece.ended {
            return Ok(());
        }
        tokio::time::sleep(FOLLOW_EVERY).await;
    }
}

/// `app show --json`: the application and its tasks, as the daemon answered them.
#[derive(Debug, Serialize)]
struct AppDetails {
    app: App,
    tasks: Vec<Task>,
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
fn tasks_line(tasks: &BTreeMap<String, u64>) -> String {
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
fn limits_line(queue: &Queue) -> String {
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
    parts.push(format!("sort {}", sort_name(queue.sort)));
    parts.join(", ")
}

fn optional(resources: Option<&String>) -> String {
    resources.map_or_else(|| "-".to_owned(), |r| human(r))
}

fn queue_table(queues: &[Queue]) -> String {
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

fn queue_details(queue: &Queue) -> String {
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
        ("apps", queue.apps.to_string()),
        ("pending tasks", queue.pending_tasks.to_string()),
        ("sort", sort_name(queue.sort).to_owned()),
    ])
}

fn waiting_text(waiting: Option<&Waiting>) -> String {
    waiting.map_or_else(|| "-".to_owned(), |w| format!("{} ({})", w.message, w.code))
}

fn app_table(apps: &[App]) -> String {
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
    ]);
    for app in apps {
        table.row(vec![
            show(&app.id),
            app.queue.clone(),
            show(&app.user),
            app.state.clone(),
            tasks_by_state(&app.tasks),
            app.waiting.as_ref().map_or_else(|| "-".to_owned(), |w| w.code.clone()),
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

fn app_details(details: &AppDetails) -> String {
    let app = &details.app;
    let policy = &app.policy;
    let mut pairs = vec![
        ("app", show(&app.id)),
        ("queue", app.queue.clone()),
        ("user", show(&app.user)),
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

/// A run's summary, then its timeline.
fn run_timeline(run: &TaskRun) -> String {
    let failures = format!("{} user, {} system", run.user_failures, run.system_failures);
    let mut pairs = vec![
        ("app", show(&run.app)),
        ("task", show(&run.task)),
        ("attempt", run.attempt.to_string()),
        ("phase", run.phase.clone()),
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
        ("REASON", Align::Left),
    ]);
    for event in &run.events {
        let at =
            humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_millis(event.at_ms));
        let reason = match &event.error {
            Some(error) => format!("{} ({} error {})", event.reason, error.kind, error.code),
            None => event.reason.clone(),
        };
        table.row(vec![
            event.attempt.to_string(),
            event.phase.clone(),
            event.version.to_string(),
            at.to_string(),
            reason,
        ]);
    }
    out.push_str(&table.render());
    out
}

fn task_table(tasks: &[Task]) -> String {
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

fn task_details(task: &Task, run: Option<&TaskRun>) -> String {
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
        ("priority", task.priority.to_string()),
        ("selector", map_text(&task.selector)),
        (if ended(task) { "ran on" } else { "runs on" }, runs_on(task)),
        ("holds", placement.map_or_else(|| "-".to_owned(), |p| human(&p.resources))),
        ("held tokens", held),
        ("waiting", waiting_text(task.waiting.as_ref())),
        ("reason", task.reason.clone().unwrap_or_else(|| "-".to_owned())),
        ("spec", task.spec.as_ref().map_or_else(|| "-".to_owned(), serde_json::Value::to_string)),
    ];
    if let Some(run) = run {
        pairs.push(("attempt", format!("{} ({})", run.attempt, run.phase)));
        pairs.extend(cache_pairs(run));
    }
    key_values(&pairs)
}

/// `completed app etl-nightly: Completed`.
fn app_line(verb: &str, app: &App) -> String {
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
fn task_line(verb: &str, task: &Task) -> String {
    let mut line = format!("{verb} task {}/{}: {}", show(&task.app), show(&task.id), task_state(task));
    if let Some(reason) = &task.reason {
        let _ = write!(line, " ({reason})");
    }
    line + "\n"
}

/// What `-q` prints for each answer: the ids it names.
macro_rules! ids {
    ($($answer:ty => |$it:ident| $ids:expr),* $(,)?) => {$(
        impl Ids for $answer {
            fn ids(&self) -> Vec<String> {
                let $it = self;
                $ids
            }
        }
    )*};
}

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
    use crate::appfile::{check_app, parse_app, Format};

    const ETL_YAML: &str = include_str!("../../../../docs/examples/etl.yaml");
    const ETL_TOML: &str = include_str!("../../../../docs/examples/etl.toml");

    #[test]
    fn the_examples_are_one_application() {
        let yaml = parse_app(ETL_YAML, Format::Yaml).unwrap();
        let toml = parse_app(ETL_TOML, Format::Toml).unwrap();
        assert_eq!(yaml, toml);
        check_app(&yaml).unwrap();
        assert!(yaml.tasks.len() >= 3 && yaml.tasks.iter().any(|t| !t.tokens.is_empty()));
    }

    #[test]
    fn parse_errors_name_the_place_and_the_field() {
        let yaml = "id: a\nqueue: root.q\ntasks:\n  - id: t1\n    resources: cpu=1\n  - id: t2\n    resources: [1]\n";
        let err = parse_app(yaml, Format::Yaml).unwrap_err();
        assert!(err.starts_with("7:16: tasks[1].resources: invalid type: sequence"), "{err}");
        let yaml = "id: a\nqueue: root.q\ntasks:\n  - id: t1\n    resorces: cpu=1\n";
        let err = parse_app(yaml, Format::Yaml).unwrap_err();
        assert!(err.starts_with("5:5: tasks[0]: unknown field `resorces`"), "{err}");
        let yaml = "id: a\nqueue: root.q\ntasks:\n  - id: t1\n";
        let err = parse_app(yaml, Format::Yaml).unwrap_err();
        assert!(err.contains("tasks[0]: missing field `resources`"), "{err}");

        let toml = "id = \"a\"\nqueue = \"root.q\"\n\n[[tasks]]\nid = \"t1\"\nresources = \"cpu=1\"\n\n[[tasks]]\n\
                    id = \"t2\"\nresources = 4\n";
        let err = parse_app(toml, Format::Toml).unwrap_err();
        assert_eq!(err, "10:13: tasks[1].resources: invalid type: integer `4`, expected a string");
        let toml = "id = \"a\"\nqueue = \"root.q\"\npolicy = { gang = \"Medium\" }\n";
        let err = parse_app(toml, Format::Toml).unwrap_err();
        assert!(err.starts_with("3:19: policy.gang: unknown variant `Medium`"), "{err}");
        let err = parse_app("id = \"a\"\n[[tasks]\n", Format::Toml).unwrap_err();
        assert_eq!(err, "2:8: invalid table header; expected `.`, `]]`");
    }

    #[test]
    fn local_checks_name_the_field() {
        let mut app = parse_app(ETL_YAML, Format::Yaml).unwrap();
        app.tasks[1].resources = "cpu=lots".to_owned();
        assert!(check_app(&app).unwrap_err().starts_with("tasks[1].resources: "));
        app.tasks[1].resources = "cpu=1".to_owned();
        app.tasks[2].id = app.tasks[0].id.clone();
        assert!(check_app(&app).unwrap_err().starts_with("tasks[2].id: "));
        app.tasks[2].id = "fine".to_owned();
        app.tasks[1].spec = Some(serde_json::json!({ "type": "shell", "command": "make", "retries": 101 }));
        let err = check_app(&app).unwrap_err();
        assert_eq!(err, "tasks[1].spec.retries must be a whole number from 0 to 100, got 101");
        app.tasks[1].spec = Some(serde_json::json!({ "type": "shell", "command": "make", "retries": 2 }));
        check_app(&app).unwrap();
        app.queue = "analytics".to_owned();
        assert!(check_app(&app).unwrap_err().starts_with("queue: queue `analytics` is not a queue path"));
    }

    #[test]
    fn tasks_by_state_live_first() {
        let tasks: BTreeMap<String, u64> =
            [("Completed", 1), ("Pending", 2), ("Running", 3), ("New", 0)].map(|(s, n)| (s.to_owned(), n)).into();
        assert_eq!(tasks_by_state(&tasks), "3 Running, 2 Pending, 1 Completed");
        assert_eq!(tasks_line(&tasks), "6 tasks: 3 Running, 2 Pending, 1 Completed");
        assert_eq!(tasks_line(&BTreeMap::new()), "no tasks");
    }

    #[test]
    fn flag_values() {
        assert_eq!(token_need("hive:a=b=2").unwrap(), TokenNeed { namespace: "hive:a=b".to_owned(), units: 2 });
        assert!(token_need("hive").is_err() && token_need("hive=x").is_err());
        assert_eq!(key_value("zone=eu=1").unwrap(), ("zone".to_owned(), "eu=1".to_owned()));
        assert!(json_value("{").is_err());
    }
}
