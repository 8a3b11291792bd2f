//! `allot run FILE`: submits an application and follows it to its end. Progress is shown a line
//! per task group (ungrouped tasks on a line of their own) while tasks move, then a summary of
//! every task (its state, attempts, time and why it failed). When every task has ended the
//! application is ended too: completed if every task completed, failed otherwise. The exit
//! status says which.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use allot_client::{Client, ClientError, Task, TaskRun};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::appfile::read_app;
use crate::cli::{client, finish, usage_error, Align, Common, Table, EXIT_ERROR, EXIT_OK, EXIT_USAGE};
use crate::cli_apps::{ended, tasks_by_state};

#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    /// The application file, YAML or TOML (`-` reads YAML from standard input).
    file: String,
    /// How often to read the application's progress.
    #[arg(long, value_name = "DURATION", default_value = "250ms", value_parser = crate::duration::parse)]
    poll: Duration,
    /// Show no progress bars (they are never shown when stderr is not a terminal).
    #[arg(long)]
    no_progress: bool,
    #[command(flatten)]
    common: Common,
}

/// `3 Completed, 1 Running` (live states first, as `allot app list` shows them).
fn states_line<'a>(tasks: impl Iterator<Item = &'a Task>) -> String {
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for task in tasks {
        *counts.entry(task.state.clone()).or_default() += 1;
    }
    tasks_by_state(&counts)
}

/// Runs `allot run`; `before` holds the options given before the command.
pub(crate) async fn run(mut args: RunArgs, before: &Common) -> anyhow::Result<ExitCode> {
    if let Err(usage) = args.common.merge(before) {
        return Ok(usage_error(&usage));
    }
    let submit = match read_app(&args.file) {
        Ok(submit) => submit,
        Err(err) => {
            eprintln!("error: {}", err.message);
            return Ok(ExitCode::from(if err.usage { EXIT_USAGE } else { EXIT_ERROR }));
        }
    };
    let common = args.common.clone();
    let outcome = async {
        let client = client(&common)?;
        let submitted = client.submit_app(&submit).await?;
        let app = submitted.app.id.clone();
        eprintln!("submitted app {app} to queue {} ({} tasks)", submitted.app.queue, submit.tasks.len());
        let started = Instant::now();
        let tasks = follow(&client, &app, &args).await?;
        let failed: Vec<&Task> = tasks.iter().filter(|t| t.state != "Completed").collect();
        let end = if failed.is_empty() {
            client.complete_app(&app).await
        } else {
            let names: Vec<&str> = failed.iter().map(|t| t.id.as_str()).collect();
            client.fail_app(&app, Some(&format!("tasks that did not complete: {}", names.join(", ")))).await
        };
        // An application ended meanwhile (by hand, or by its timeout) is answered as it is.
        let state = match end {
            Ok(app) => app.state,
            Err(_) => client.app(&app).await?.state,
        };
        let mut runs = BTreeMap::new();
        for task in &tasks {
            if let Ok(run) = client.task_run(&app, &task.id).await {
                runs.insert(task.id.clone(), run);
            }
        }
        if common.json {
            let summary = serde_json::json!({ "app": app, "state": state, "tasks": tasks, "runs": runs });
            println!("{}", serde_json::to_string_pretty(&summary).expect("JSON encodes"));
        } else if !common.quiet {
            print!("{}", summary(&tasks, &runs));
            println!(
                "app {app}: {state} after {:.1} s ({})",
                started.elapsed().as_secs_f64(),
                states_line(tasks.iter())
            );
        }
        Ok::<u8, ClientError>(if failed.is_empty() { EXIT_OK } else { EXIT_ERROR })
    }
    .await;
    Ok(finish(&common, outcome))
}

/// Reads the application's tasks until every one has ended, showing a bar per task group.
async fn follow(client: &Client, app: &str, args: &RunArgs) -> Result<Vec<Task>, ClientError> {
    let progress = MultiProgress::new();
    if args.no_progress || args.common.json || args.common.quiet {
        progress.set_draw_target(ProgressDrawTarget::hidden());
    }
    let style = ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} {msg}")
        .expect("a valid template")
        .progress_chars("=> ");
    let mut bars: BTreeMap<String, ProgressBar> = BTreeMap::new();
    loop {
        let tasks = client.tasks(app).await?.tasks;
        let mut groups: BTreeMap<String, Vec<&Task>> = BTreeMap::new();
        for task in &tasks {
            groups.entry(task.group.clone().unwrap_or_else(|| "tasks".to_owned())).or_default().push(task);
        }
        for (group, members) in &groups {
            let bar = bars.entry(group.clone()).or_insert_with(|| {
                let bar = progress.add(ProgressBar::new(members.len() as u64));
                bar.set_style(style.clone());
                bar.set_prefix(group.clone());
                bar
            });
            bar.set_length(members.len() as u64);
            bar.set_position(members.iter().filter(|t| ended(t)).count() as u64);
            bar.set_message(states_line(members.iter().copied()));
        }
        if !tasks.is_empty() && tasks.iter().all(ended) {
            for bar in bars.values() {
                bar.finish();
            }
            return Ok(tasks);
        }
        tokio::time::sleep(args.poll).await;
    }
}

/// Every task: state, attempts, time from its first event to its last, whether its outputs came
/// from the cache, and why it failed; then how each attempt ended, for tasks run more than once.
fn summary(tasks: &[Task], runs: &BTreeMap<String, TaskRun>) -> String {
    let mut table = Table::new(&[
        ("TASK", Align::Left),
        ("STATE", Align::Left),
        ("ATTEMPTS", Align::Right),
        ("TIME", Align::Right),
        ("CACHE", Align::Left),
        ("REASON", Align::Left),
    ]);
    for task in tasks {
        let run = runs.get(&task.id);
        let attempts = run.map_or_else(|| "-".to_owned(), |r| r.attempt.to_string());
        let time = run
            .and_then(|r| Some(r.events.last()?.at_ms.saturating_sub(r.events.first()?.at_ms)))
            .map_or_else(|| "-".to_owned(), |ms| format!("{:.2} s", ms as f64 / 1000.0));
        let reason = task.reason.clone().unwrap_or_else(|| "-".to_owned());
        let cache = run
            .and_then(|r| {
                let said = |what: &str| r.events.iter().any(|e| e.reason.starts_with(what));
                if said("cache hit") {
                    Some("hit")
                } else {
                    said("cache miss").then_some("miss")
                }
            })
            .unwrap_or("-");
        table.row(vec![task.id.clone(), task.state.clone(), attempts, time, cache.to_owned(), reason]);
    }
    let mut text = table.render();
    for (task, run) in runs.iter().filter(|(_, run)| run.attempt > 1) {
        text.push_str(&format!("{task}: {}\n", attempts_line(run)));
    }
    text
}

/// How each attempt of a run ended (or where it is): `attempt 1: RetryableFailure (user error
/// exit_3), attempt 2: Success`.
fn attempts_line(run: &TaskRun) -> String {
    let attempts = (1..=run.attempt).filter_map(|attempt| {
        let last = run.events.iter().rev().find(|e| e.attempt == attempt)?;
        let how = match &last.error {
            Some(error) => format!("{} ({} error {})", last.phase, error.kind, error.code),
            None => last.phase.clone(),
        };
        Some(format!("attempt {attempt}: {how}"))
    });
    attempts.collect::<Vec<_>>().join(", ")
}
