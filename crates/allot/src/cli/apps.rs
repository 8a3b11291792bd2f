//! The CLI commands of applications: `allot queue ...`, `allot app ...` and `allot task ...`.
//! An application is submitted from a file, YAML or TOML, that holds the fields of the API's
//! `SubmitApp` (docs/examples/etl.yaml); a task is added with flags. How each answer prints is
//! `apps_output`.

use std::process::ExitCode;

use allot_client::{AddTask, AppSort, ClientError, PutQueue, SortPolicy, TokenNeed};

use super::apps_output::{
    app_details, app_line, app_table, limits_line, queue_details, queue_table, run_timeline, task_details, task_line,
    task_state, task_table, tasks_line, AppDetails,
};
use super::submit_follow::FollowArgs;
use super::{client, dispatch, emit, key_value, show, Common, EXIT_CODES, EXIT_ERROR, EXIT_USAGE};
use crate::appfile::read_app;

/// `allot app submit`'s help after the options: the file's fields and the exit codes.
const SUBMIT_AFTER_HELP: &str = "\
The file holds one application, with the fields of the API's SubmitApp:
  id           the application's id: 1 to 100 of A-Z, a-z, 0-9, `.`, `_`, `-`
  queue        a leaf queue, e.g. root.analytics.etl, or one name (a queue under root); none: the
               daemon's placement rules choose
  user         who it runs as (with access configured: the caller, unless it may impersonate)
  user_groups  the user's groups, the primary one first (per-group limits count it)
  tags         names to text, for people and tools
  task_groups  gangs, started all or nothing: name, min_members, min_resources, selector, tokens
  policy       placeholder_timeout_ms, gang (Soft or Hard), reserve_timeout_ms, max_parallelism
  tasks        id, resources, tokens (namespace, units), group, priority, selector, spec
A field it does not know is refused. Examples: docs/examples/etl.yaml and docs/examples/etl.toml.

Exit codes (the same with --json and --quiet), without --follow:
  0  submitted (also when the same application was submitted before)
  1  error: the file cannot be read or does not hold an application (`error: FILE:LINE:COLUMN: FIELD: message`
     on stderr), or the daemon refused it (`error: <code>: <message>`) or cannot be reached
  2  usage error (also a FILE whose name ends in neither .yaml, .yml nor .toml)";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Preemption {
    Default,
    /// Its tasks preempt only inside it.
    Fence,
    /// Its tasks, and those below, are never preempted.
    Disabled,
}

/// The order of `allot app list`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ListOrder {
    /// By id.
    Id,
    /// By submission time.
    Submitted,
    /// By end time (those not ended last).
    Ended,
}

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

// Parsed once per run: the size of its largest variant (`set`, with every limit) costs nothing.
#[allow(clippy::large_enum_variant)]
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
        /// The most applications of one group running in it at once (an application counts for
        /// its user's primary group).
        #[arg(long, value_name = "N")]
        group_max_apps: Option<u64>,
        /// The most one group's applications may hold in it together.
        #[arg(long, value_name = "RESOURCES")]
        group_max: Option<String>,
        /// How it orders its applications [default: fifo].
        #[arg(long, value_enum)]
        sort: Option<Sort>,
        /// Who may submit here and below, YuniKorn's format: `*`, or `"user1,user2 group1"`.
        #[arg(long, value_name = "ACL")]
        submit_acl: Option<String>,
        /// Who may administer (and submit) here and below, in the same format.
        #[arg(long, value_name = "ACL")]
        admin_acl: Option<String>,
        /// The most it may hold beyond its guarantee, per resource named (others: no limit).
        #[arg(long, value_name = "RESOURCES")]
        borrow_limit: Option<String>,
        /// The most of its unused guarantee other queues may use, per resource named; the rest is
        /// kept free for it.
        #[arg(long, value_name = "RESOURCES")]
        lend_limit: Option<String>,
        /// Added to the priority it shows its parent queue [default: 0].
        #[arg(long, value_name = "N", allow_negative_numbers = true)]
        priority_offset: Option<i32>,
        /// Show its parent only its offset, not the priorities waiting in it.
        #[arg(long)]
        priority_fence: bool,
        /// `fence`: its tasks preempt only inside it; `disabled`: its tasks (and those below) are
        /// never preempted [default: default].
        #[arg(long, value_enum)]
        preemption: Option<Preemption>,
        /// How long a task of it waits before it may preempt, e.g. `30s` [default: its parent's,
        /// else 30s].
        #[arg(long, value_name = "DURATION", value_parser = allot_bench::duration::parse)]
        preemption_delay: Option<std::time::Duration>,
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
    /// With --follow, follow it to its end (`allot run FILE` is the same).
    #[command(
        after_help = format!("{SUBMIT_AFTER_HELP}\n\n{}", super::submit_follow::after_help()),
        group = clap::ArgGroup::new("follow_options")
            .args(["poll", "timeout", "no_progress", "note_after", "replace"])
            .multiple(true)
            .requires("follow")
    )]
    Submit {
        /// The file, or `-` to read YAML from stdin.
        file: String,
        /// Follow the application to its end: progress per task group, then a summary of every
        /// task; exits non-zero if a task did not complete, and ends the application (completed
        /// if every task completed, else failed).
        #[arg(long)]
        follow: bool,
        #[command(flatten)]
        follow_args: FollowArgs,
        #[command(flatten)]
        common: Common,
    },
    /// List the applications: queue, user, state, tasks by state and when each was submitted.
    #[command(after_help = EXIT_CODES)]
    List {
        /// The order: by id, submission time or end time.
        #[arg(long, value_enum, default_value = "id")]
        sort: ListOrder,
        /// With `--sort submitted` or `ended`: the newest first.
        #[arg(long)]
        newest_first: bool,
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
        /// Higher first, inside its application (and in a queue sorted by priority) [default:
        /// its application's].
        #[arg(long, value_name = "N", allow_negative_numbers = true, conflicts_with = "priority_class")]
        priority: Option<i32>,
        /// A priority class of the daemon's, instead of --priority.
        #[arg(long, value_name = "NAME")]
        priority_class: Option<String>,
        /// The scheduler may never preempt it.
        #[arg(long)]
        not_preemptable: bool,
        /// Units of a token namespace's quota it holds while placed, `NAMESPACE=UNITS`;
        /// repeatable.
        #[arg(long = "tokens", value_name = "NS=UNITS", value_parser = token_need)]
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
    /// goes on printing what is written until the attempt ends. With `--json`, each piece read is
    /// one line of JSON (attempt, stream, offset, next_offset, text, ended), the last always
    /// read after the rest; `--quiet` prints the log as without it (it names no ids).
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
pub(crate) async fn queue(command: QueueCommand, before: &Common) -> anyhow::Result<ExitCode> {
    dispatch(
        command,
        before,
        |command| match command {
            QueueCommand::List { common }
            | QueueCommand::Show { common, .. }
            | QueueCommand::Set { common, .. }
            | QueueCommand::Remove { common, .. } => common,
        },
        |command| async move { run_queue(&command).await },
    )
    .await
}

/// Runs an `allot app` command; `before` holds the options given before the command.
pub(crate) async fn app(command: AppCommand, before: &Common) -> anyhow::Result<ExitCode> {
    dispatch(
        command,
        before,
        |command| match command {
            AppCommand::Submit { common, .. }
            | AppCommand::List { common, .. }
            | AppCommand::Show { common, .. }
            | AppCommand::Complete { common, .. }
            | AppCommand::Fail { common, .. }
            | AppCommand::Remove { common, .. } => common,
        },
        |command| async move { run_app(&command).await },
    )
    .await
}

/// Runs an `allot task` command; `before` holds the options given before the command.
pub(crate) async fn task(command: TaskCommand, before: &Common) -> anyhow::Result<ExitCode> {
    dispatch(
        command,
        before,
        |command| match command {
            TaskCommand::Add { common, .. }
            | TaskCommand::List { common, .. }
            | TaskCommand::Show { common, .. }
            | TaskCommand::Events { common, .. }
            | TaskCommand::Logs { common, .. }
            | TaskCommand::Start { common, .. }
            | TaskCommand::Complete { common, .. }
            | TaskCommand::Fail { common, .. }
            | TaskCommand::Remove { common, .. } => common,
        },
        |command| async move { run_task(&command).await },
    )
    .await
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
        QueueCommand::Set {
            path,
            guaranteed,
            max,
            max_apps,
            user_max_apps,
            user_max,
            group_max_apps,
            group_max,
            sort,
            submit_acl,
            admin_acl,
            borrow_limit,
            lend_limit,
            priority_offset,
            priority_fence,
            preemption,
            preemption_delay,
            common,
        } => {
            let limits = PutQueue {
                preemption: preemption.map(|p| match p {
                    Preemption::Default => allot_client::PreemptionPolicy::Default,
                    Preemption::Fence => allot_client::PreemptionPolicy::Fence,
                    Preemption::Disabled => allot_client::PreemptionPolicy::Disabled,
                }),
                preemption_delay_ms: preemption_delay.map(|d| d.as_millis() as u64),
                borrow_limit: borrow_limit.clone(),
                lend_limit: lend_limit.clone(),
                priority_offset: *priority_offset,
                priority_policy: priority_fence.then_some(allot_client::PriorityPolicy::Fence),
                guaranteed: guaranteed.clone(),
                max: max.clone(),
                max_apps: *max_apps,
                user_max_apps: *user_max_apps,
                user_max: user_max.clone(),
                group_max_apps: *group_max_apps,
                group_max: group_max.clone(),
                sort: sort.map(SortPolicy::from),
                submit_acl: submit_acl.clone(),
                admin_acl: admin_acl.clone(),
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
        // With --follow, `main` runs `submit_follow` instead.
        AppCommand::Submit { file, common, .. } => {
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
        AppCommand::List { sort, newest_first, common } => {
            let sort = match (sort, newest_first) {
                (ListOrder::Id, false) => AppSort::Id,
                (ListOrder::Id, true) => {
                    eprintln!("error: --newest-first goes with --sort submitted or --sort ended");
                    return Ok(EXIT_USAGE);
                }
                (ListOrder::Submitted, false) => AppSort::Submitted,
                (ListOrder::Submitted, true) => AppSort::SubmittedNewestFirst,
                (ListOrder::Ended, false) => AppSort::Ended,
                (ListOrder::Ended, true) => AppSort::EndedNewestFirst,
            };
            let answer = client(common)?.apps_in_order(sort).await?;
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
        TaskCommand::Add {
            app,
            id,
            resources,
            group,
            priority,
            priority_class,
            not_preemptable,
            tokens,
            selector,
            spec,
            retries,
            common,
        } => {
            let request = AddTask {
                preemptable: not_preemptable.then_some(false),
                priority_class: priority_class.clone(),
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
            follow_logs(&client(common)?, app, task, stream, *attempt, *follow, common.json).await?;
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
/// fixed at the first read, so a retry's log is not mixed in). With `json`, each piece with text
/// is a line of JSON, and so is the last piece read, with or without text.
async fn follow_logs(
    client: &allot_client::Client,
    app: &str,
    task: &str,
    stream: &str,
    mut attempt: Option<u32>,
    follow: bool,
    json: bool,
) -> Result<(), allot_client::ClientError> {
    use std::io::Write;
    let mut offset = 0;
    loop {
        let piece = client.task_logs(app, task, Some(stream), attempt, offset).await?;
        attempt = Some(piece.attempt);
        let more = piece.next_offset > offset;
        let last = !more && (!follow || piece.ended);
        let mut out = std::io::stdout().lock();
        if !json {
            let _ = out.write_all(piece.text.as_bytes());
        } else if more || last {
            let line =
                serde_json::to_string(&piece).map_err(|err| allot_client::ClientError::Decode(err.to_string()))?;
            let _ = writeln!(out, "{line}");
        }
        let _ = out.flush();
        offset = piece.next_offset;
        if more {
            continue;
        }
        if last {
            return Ok(());
        }
        tokio::time::sleep(FOLLOW_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_values() {
        assert_eq!(token_need("hive:a=b=2").unwrap(), TokenNeed { namespace: "hive:a=b".to_owned(), units: 2 });
        assert!(token_need("hive").is_err() && token_need("hive=x").is_err());
        assert_eq!(key_value("zone=eu=1").unwrap(), ("zone".to_owned(), "eu=1".to_owned()));
        assert!(json_value("{").is_err());
    }
}
