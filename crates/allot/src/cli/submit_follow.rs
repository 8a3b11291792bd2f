//! `allot app submit --follow FILE` (alias `allot run FILE`): submits an application and follows
//! it to its end. Progress is shown a bar
//! per task group (ungrouped tasks on a bar of their own) on a terminal, else a line per task
//! state change (`follow`); a task that waits long says why; a daemon that restarts meanwhile is
//! waited for. Then a summary of every task (its state, attempts, time and why it failed), and
//! the end of each failed task's stderr with the command that shows all of it. When
//! every task has ended the application is ended too: completed if every task completed, failed
//! otherwise. The exit status says which.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use allot_client::{Client, ClientError, Task, TaskRun, WatchFilter};
use futures_util::{FutureExt, StreamExt};

use super::apps_output::{ended, failed_for_good};
use super::follow::{states_line, Outages, Progress, Style, STILL_LINE_AFTER, WAIT_NOTE_AFTER};
use super::{client, count, finish, show, usage_error, Align, Common, Table, EXIT_ERROR, EXIT_OK, EXIT_USAGE};
use crate::appfile::read_app;

/// `allot run --help`'s epilogue (and, after the plain submit's, `allot app submit --help`'s): what
/// following shows, and its exit codes.
pub(crate) fn after_help() -> String {
    format!(
        "\
Following (`allot app submit --follow FILE`, or its alias `allot run FILE`) shows progress: on
a terminal, a bar per task group. Otherwise (a CI log, a file, a pipe) or with --no-progress, a
line per task state change, and a line every {still} s while none changes.
A task that stays --note-after ({wait} by default) in one state says why it waits (its
`waiting` reason, e.g. a pool that no daemon runs) on stderr.

A daemon that restarts or goes away meanwhile (connection refused or cut, 503) is said so on
stderr (`note:`) and asked again until it is back or --timeout ends (submitting, reading and
ending the application are safe to repeat).

Exit codes when following (the same with --json and --quiet):
  0  every task completed; the application is Completed
  1  a task did not complete (the application is Failed; the summary says which and why), or
     an error: the daemon refused a request (`error: <code>: <message>` on stderr) or could not
     be reached (at the start, or for longer than --timeout)
  2  usage error, or a file whose name tells no format",
        still = STILL_LINE_AFTER.as_secs(),
        wait = WAIT_NOTE_AFTER
    )
}

/// `allot run FILE`: an alias of `allot app submit --follow FILE`, kept for those who know it.
#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    /// The application file, YAML or TOML (`-` reads YAML from standard input).
    file: String,
    #[command(flatten)]
    follow: FollowArgs,
    #[command(flatten)]
    common: Common,
}

impl RunArgs {
    /// `allot app submit --follow` with these arguments.
    pub(crate) fn into_submit(self) -> (String, FollowArgs, Common) {
        (self.file, self.follow, self.common)
    }
}

/// The options of `allot app submit --follow` (and of `allot run`) beside the file.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct FollowArgs {
    /// How often to read the application's progress when the daemon's change feed cannot wake
    /// the reads (a store without one, or the feed cut); with it, a read follows each change.
    #[arg(long, value_name = "DURATION", default_value = "250ms", value_parser = allot_bench::duration::parse)]
    poll: Duration,
    /// How long to keep asking a daemon that cannot serve (it restarts, its store or scheduler is
    /// unavailable: connection refused, 503) before giving up, per outage.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = allot_bench::duration::parse)]
    timeout: Duration,
    /// Show a line per task state change instead of progress bars (bars are never shown when
    /// stderr is not a terminal).
    #[arg(long)]
    no_progress: bool,
    /// How long a task stays in one state before following says why it waits.
    #[arg(long, value_name = "DURATION", default_value = WAIT_NOTE_AFTER, value_parser = allot_bench::duration::parse)]
    note_after: Duration,
    /// Remove the application first if it exists (its tasks end, what it holds is released), so
    /// that it runs again; without it, an application that exists is followed if it has not
    /// ended, and one that has ended is not run again.
    #[arg(long)]
    replace: bool,
}

/// Runs `allot app submit --follow FILE` (or `allot run FILE`); `before` holds the options given
/// before the command.
pub(crate) async fn submit_and_follow(
    file: &str,
    args: FollowArgs,
    mut common: Common,
    before: &Common,
) -> anyhow::Result<ExitCode> {
    if let Err(usage) = common.merge(before) {
        return Ok(usage_error(&usage));
    }
    let submit = match read_app(file) {
        Ok(submit) => submit,
        Err(err) => {
            eprintln!("error: {}", err.message);
            return Ok(ExitCode::from(if err.usage { EXIT_USAGE } else { EXIT_ERROR }));
        }
    };
    let mut progress = Progress::new(Style::pick(args.no_progress, common.json, common.quiet), args.note_after);
    let outcome = async {
        // Outages are ridden out here, with notes, rather than by the client's own few retries.
        let client = client(&common)?.with_unavailable_retry(0, Duration::ZERO);
        let mut outages = Outages::new(client.base_url(), args.timeout, progress.stderr());
        if args.replace {
            match outages.call(async || client.remove_app(&submit.id).await).await {
                Ok(removed) => eprintln!("removed app {} ({}) to run it again", removed.id, removed.state),
                Err(ClientError::Api { status: 404, .. }) => {}
                Err(err) => return Err(err),
            }
        }
        let submitted = outages.call(async || client.submit_app(&submit).await).await?;
        let app = submitted.app.id.clone();
        let tasks = count(submit.tasks.len() as u64, "task", "tasks");
        if submitted.created {
            eprintln!("submitted app {app} to queue {} ({tasks})", submitted.app.queue);
        } else if app_ended(&submitted.app.state) {
            eprintln!(
                "error: app {app} already exists and has ended ({}): nothing was run. `allot app submit --follow \
                 --replace {file}` removes it and runs it again",
                submitted.app.state
            );
            return Ok(EXIT_ERROR);
        } else {
            eprintln!("app {app} already exists ({}): following it", submitted.app.state);
        }
        let started = Instant::now();
        let tasks = follow(&client, &app, args.poll, &mut progress, &mut outages).await?;
        let failed: Vec<&Task> = tasks.iter().filter(|t| t.state != "Completed").collect();
        let end = outages
            .call(async || {
                if failed.is_empty() {
                    client.complete_app(&app).await
                } else {
                    let names: Vec<&str> = failed.iter().map(|t| t.id.as_str()).collect();
                    client.fail_app(&app, Some(&format!("tasks that did not complete: {}", names.join(", ")))).await
                }
            })
            .await;
        // An application ended meanwhile (by hand, by its timeout, or by the try before a
        // restart) is answered as it is.
        let state = match end {
            Ok(app) => app.state,
            Err(ClientError::Api { status, .. }) if status != 503 => {
                outages.call(async || client.app(&app).await).await?.state
            }
            Err(err) => return Err(err),
        };
        let mut runs = BTreeMap::new();
        for task in &tasks {
            if let Ok(run) = outages.call(async || client.task_run(&app, &task.id).await).await {
                runs.insert(task.id.clone(), run);
            }
        }
        let mut stderr = BTreeMap::new();
        for task in failed.iter().filter(|t| runs.contains_key(&t.id)) {
            if let Some(tail) = stderr_tail(&client, &app, &task.id).await {
                stderr.insert(task.id.clone(), tail);
            }
        }
        if common.json {
            let summary =
                serde_json::json!({ "app": app, "state": state, "tasks": tasks, "runs": runs, "stderr": stderr });
            println!("{}", serde_json::to_string_pretty(&summary).expect("JSON encodes"));
        } else if !common.quiet {
            print!("{}", summary(&tasks, &runs));
            for (task, tail) in &stderr {
                let all =
                    format!("allot task logs {} {} --stream stderr{}", show(&app), show(task), common.server_flag());
                println!("{task}: the end of its stderr (all of it: `{all}`):");
                for line in tail.lines() {
                    println!("    {line}");
                }
            }
            println!(
                "app {app}: {state} after {:.1} s ({})",
                started.elapsed().as_secs_f64(),
                states_line(tasks.iter())
            );
        }
        Ok::<u8, ClientError>(if failed.is_empty() && state == "Completed" { EXIT_OK } else { EXIT_ERROR })
    }
    .await;
    Ok(finish(&common, outcome))
}

/// Whether an application in `state` has ended (Completed, Failed, Rejected: it takes no more tasks).
fn app_ended(state: &str) -> bool {
    matches!(state, "Completed" | "Failed" | "Rejected")
}

/// With the change feed, the longest between two reads: a read also follows every change of the
/// application, so this only bounds how late a change the feed did not bring is seen.
const READ_AT_LEAST_EVERY: Duration = Duration::from_secs(2);

/// Reads the application's tasks until every one has ended, showing their progress. The
/// application's changes on the daemon's change feed wake a read at once; when the feed cannot
/// be had (a store without one answers 501) or is cut, reads come every `poll`.
async fn follow(
    client: &Client,
    app: &str,
    poll: Duration,
    progress: &mut Progress,
    outages: &mut Outages,
) -> Result<Vec<Task>, ClientError> {
    let filter = WatchFilter { kinds: Vec::new(), prefixes: vec![format!("apps/{app}")] };
    let mut feed = Some(client.watch(filter.clone(), None));
    loop {
        let tasks = outages.call(async || client.tasks(app).await).await?.tasks;
        progress.update(&tasks);
        if !tasks.is_empty() && tasks.iter().all(ended) {
            progress.finish();
            return Ok(tasks);
        }
        // With no task yet it waits for some to be added, unless the application itself ended
        // (failed or completed by hand): nothing more will run.
        if tasks.is_empty() && app_ended(&outages.call(async || client.app(app).await).await?.state) {
            progress.finish();
            return Ok(tasks);
        }
        let Some(changes) = feed.as_mut() else {
            tokio::time::sleep(poll).await;
            continue;
        };
        tokio::select! {
            next = changes.next() => match next {
                // Changes that came together make one read.
                Some(Ok(_)) => while let Some(Some(Ok(_))) = changes.next().now_or_never() {},
                // The feed is cut (or its events are no longer kept): a read every `poll` until
                // a new one, from now, brings changes again; a store without a feed is not asked
                // again.
                Some(Err(err)) => {
                    let again = err.code() != Some("watch_unsupported");
                    feed = again.then(|| client.watch(filter.clone(), None));
                    tokio::time::sleep(poll).await;
                }
                None => {
                    feed = Some(client.watch(filter.clone(), None));
                    tokio::time::sleep(poll).await;
                }
            },
            _ = tokio::time::sleep(READ_AT_LEAST_EVERY) => {}
        }
    }
}

/// How many lines of a failed task's stderr the summary shows: its end, where a command says
/// why it failed.
const STDERR_LINES: usize = 10;

/// The last [`STDERR_LINES`] lines of a task's stderr in its last attempt; `None` when it has
/// no such log (a plugin other than `shell`), or wrote nothing to it.
async fn stderr_tail(client: &Client, app: &str, task: &str) -> Option<String> {
    let mut tail = String::new();
    let mut offset = 0;
    loop {
        let piece = client.task_logs(app, task, Some("stderr"), None, offset).await.ok()?;
        if piece.next_offset == offset {
            break;
        }
        tail.push_str(&piece.text);
        tail = last_lines(&tail, STDERR_LINES).to_owned();
        offset = piece.next_offset;
    }
    (!tail.trim().is_empty()).then_some(tail)
}

/// The end of `text` that holds its last `n` lines (a line ends with its `\n`, or the text).
fn last_lines(text: &str, n: usize) -> &str {
    let body = text.strip_suffix('\n').unwrap_or(text);
    match body.rmatch_indices('\n').nth(n.saturating_sub(1)) {
        Some((at, _)) => &text[at + 1..],
        None => text,
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
/// exit_3), attempt 2: Success`; the last attempt of a run that ended reads as the run ended
/// (`Failed (retryable failure, no retries left: exit status 3)`).
fn attempts_line(run: &TaskRun) -> String {
    let attempts = (1..=run.attempt).filter_map(|attempt| {
        let last = run.events.iter().rev().find(|e| e.attempt == attempt)?;
        let how = match (&last.error, failed_for_good(run)) {
            (_, Some(failed)) if attempt == run.attempt => failed,
            (Some(error), _) => format!("{} ({} error {})", last.phase, error.kind, error.code),
            (None, _) => last.phase.clone(),
        };
        Some(format!("attempt {attempt}: {how}"))
    });
    attempts.collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_lines_keeps_the_end() {
        assert_eq!(last_lines("a\nb\nc\n", 2), "b\nc\n");
        assert_eq!(last_lines("a\nb\nc", 2), "b\nc");
        assert_eq!(last_lines("a\nb", 5), "a\nb");
        assert_eq!(last_lines("", 3), "");
    }
}
