//! What `allot app submit --follow` shows while it follows an application, and how it rides out
//! a daemon that restarts: a bar per task group on a terminal, a line per task state change elsewhere (a CI
//! log), why a task waits once it has waited a while, and `note:` lines for outages.

use std::collections::{BTreeMap, HashMap};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use allot_client::{ClientError, Task};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use super::apps_output::{ended, task_state, tasks_by_state};
use super::{format_ms, show};

/// A task that stays this long in one state says why it waits (its `waiting` reason), unless
/// told otherwise (`allot app submit --follow --note-after`).
pub(crate) const WAIT_NOTE_AFTER: &str = "5s";
/// In lines, a line that says where the tasks are when nothing changed for this long.
pub(crate) const STILL_LINE_AFTER: Duration = Duration::from_secs(30);
/// More state changes than this in one read are summed up per task group, not a line each.
const MAX_CHANGE_LINES: usize = 20;

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Style {
    /// A bar per task group, redrawn in place: stderr is a terminal.
    Bars,
    /// A line per task state change: stderr is a file or a pipe (a CI log), or bars were declined.
    Lines,
    /// Nothing but notes (`--quiet`).
    Silent,
}

impl Style {
    pub(crate) fn pick(no_progress: bool, json: bool, quiet: bool) -> Style {
        if quiet {
            Style::Silent
        } else if no_progress || json || !std::io::stderr().is_terminal() {
            Style::Lines
        } else {
            Style::Bars
        }
    }
}

/// Writes lines to stderr, above the progress bars when they are drawn.
#[derive(Clone)]
pub(crate) struct Stderr(Option<MultiProgress>);

impl Stderr {
    pub(crate) fn line(&self, text: &str) {
        match &self.0 {
            Some(bars) => bars.suspend(|| eprintln!("{text}")),
            None => eprintln!("{text}"),
        }
    }
}

/// The progress of one application's tasks, shown as they are read again and again.
pub(crate) struct Progress {
    style: Style,
    started: Instant,
    out: Stderr,
    bars: BTreeMap<String, ProgressBar>,
    /// Each task's state when last read, and since when it has been in it.
    seen: HashMap<String, (String, Instant)>,
    /// The `waiting` message last said of each task.
    said: HashMap<String, String>,
    /// When the last progress line was written.
    last_line: Instant,
    /// How long a task stays in one state before it says why it waits.
    note_after: Duration,
}

impl Progress {
    pub(crate) fn new(style: Style, note_after: Duration) -> Progress {
        let bars = (style == Style::Bars).then(MultiProgress::new);
        let now = Instant::now();
        Progress {
            style,
            started: now,
            out: Stderr(bars),
            bars: BTreeMap::new(),
            seen: HashMap::new(),
            said: HashMap::new(),
            last_line: now,
            note_after,
        }
    }

    /// Where notes go, so that they do not tear the bars.
    pub(crate) fn stderr(&self) -> Stderr {
        self.out.clone()
    }

    /// Shows the tasks as just read: what changed, and why the ones that have waited a while wait.
    pub(crate) fn update(&mut self, tasks: &[Task]) {
        let now = Instant::now();
        let mut changed = Vec::new();
        for task in tasks {
            let moved = self.seen.get(&task.id).is_none_or(|(state, _)| *state != task.state);
            if moved {
                self.seen.insert(task.id.clone(), (task.state.clone(), now));
                changed.push(task);
            }
        }
        match self.style {
            Style::Bars => self.draw(tasks),
            Style::Lines => self.write_lines(tasks, &changed, now),
            Style::Silent => {}
        }
        self.say_why_they_wait(tasks, now);
    }

    /// Ends the bars where they are.
    pub(crate) fn finish(&self) {
        for bar in self.bars.values() {
            bar.finish();
        }
    }

    fn draw(&mut self, tasks: &[Task]) {
        let Some(multi) = &self.out.0 else { return };
        for (group, members) in groups(tasks) {
            let bar = self.bars.entry(group.clone()).or_insert_with(|| {
                let bar = multi.add(ProgressBar::new(members.len() as u64));
                let style = ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} {msg}")
                    .expect("a valid template")
                    .progress_chars("=> ");
                bar.set_style(style);
                bar.set_prefix(group);
                bar
            });
            bar.set_length(members.len() as u64);
            bar.set_position(members.iter().filter(|t| ended(t)).count() as u64);
            bar.set_message(states_line(members.iter().copied()));
        }
    }

    /// A line per task that changed state; past [`MAX_CHANGE_LINES`], a line per task group; and
    /// a line that says where the tasks are after [`STILL_LINE_AFTER`] without a change.
    fn write_lines(&mut self, tasks: &[Task], changed: &[&Task], now: Instant) {
        let at = format!("[{:.1}s]", now.duration_since(self.started).as_secs_f64());
        if changed.len() > MAX_CHANGE_LINES {
            for (group, members) in groups(tasks) {
                let done = members.iter().filter(|t| ended(t)).count();
                let line = format!("{group}: {done}/{} ended ({})", members.len(), states_line(members.into_iter()));
                self.out.line(&format!("{at} {line}"));
            }
        } else if !changed.is_empty() {
            for task in changed {
                self.out.line(&format!("{at} {}", change_line(task)));
            }
        } else if now.duration_since(self.last_line) >= STILL_LINE_AFTER && !tasks.is_empty() {
            self.out.line(&format!("{at} still {}", states_line(tasks.iter())));
        } else {
            return;
        }
        self.last_line = now;
    }

    /// Says once why each task that has stayed `note_after` in its state waits (again
    /// when the reason changes), the tasks that wait for one reason on one line.
    fn say_why_they_wait(&mut self, tasks: &[Task], now: Instant) {
        let mut by_reason: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for task in tasks.iter().filter(|t| !ended(t)) {
            let Some(waiting) = &task.waiting else { continue };
            let since = self.seen.get(&task.id).map_or(now, |(_, at)| *at);
            if now.duration_since(since) < self.note_after || self.said.get(&task.id) == Some(&waiting.message) {
                continue;
            }
            self.said.insert(task.id.clone(), waiting.message.clone());
            by_reason.entry(&waiting.message).or_default().push(&task.id);
        }
        for (message, ids) in by_reason {
            self.out.line(&format!(
                "note: {} (waiting {}): {message}",
                who_waits(&ids),
                waited(now, &self.seen, ids[0])
            ));
        }
    }
}

/// The tasks by task group (ungrouped tasks under `tasks`).
fn groups(tasks: &[Task]) -> BTreeMap<String, Vec<&Task>> {
    let mut groups: BTreeMap<String, Vec<&Task>> = BTreeMap::new();
    for task in tasks {
        groups.entry(task.group.clone().unwrap_or_else(|| "tasks".to_owned())).or_default().push(task);
    }
    groups
}

/// `3 Completed, 1 Running` (live states first, as `allot app list` shows them).
pub(crate) fn states_line<'a>(tasks: impl Iterator<Item = &'a Task>) -> String {
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for task in tasks {
        *counts.entry(task.state.clone()).or_default() += 1;
    }
    tasks_by_state(&counts)
}

/// `greet: Running on worker/a1`, `bad: Failed: exit status 4`.
fn change_line(task: &Task) -> String {
    let line = format!("{}: {}", show(&task.id), task_state(task));
    match &task.reason {
        Some(reason) if ended(task) && task.state != "Completed" => format!("{line}: {reason}"),
        _ => line,
    }
}

/// `task a waits`, `tasks a, b and c wait`, `tasks a, b, c and 4 more wait`.
fn who_waits(ids: &[&str]) -> String {
    let shown: Vec<String> = ids.iter().take(3).map(|id| show(id)).collect();
    match ids.len() {
        1 => format!("task {} waits", shown[0]),
        2 | 3 => format!("tasks {} and {} wait", shown[..shown.len() - 1].join(", "), shown[shown.len() - 1]),
        n => format!("tasks {} and {} more wait", shown.join(", "), n - 3),
    }
}

/// How long a task has been in its state: `5.2s`.
fn waited(now: Instant, seen: &HashMap<String, (String, Instant)>, id: &str) -> String {
    let since = seen.get(id).map_or(now, |(_, at)| *at);
    format_ms(u64::try_from(now.duration_since(since).as_millis()).unwrap_or(u64::MAX))
}

/// The first pause before asking a daemon that went away again; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(200);
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// Rides out a daemon that restarts or goes away: a call that cannot reach it (connection
/// refused or cut) or is answered 503 is sent again with backoff, said once per outage with a
/// `note:` on stderr, until it is answered or `timeout` has passed since the outage began. A
/// daemon that never answered is not waited for: its address may be wrong.
pub(crate) struct Outages {
    server: String,
    timeout: Duration,
    out: Stderr,
    reached: bool,
}

impl Outages {
    pub(crate) fn new(server: &str, timeout: Duration, out: Stderr) -> Outages {
        Outages { server: server.to_owned(), timeout, out, reached: false }
    }

    /// `call`'s answer, after as many tries as the outages it meets take. The calls given are
    /// safe to repeat: reads, and writes that are idempotent.
    pub(crate) async fn call<T>(
        &mut self,
        mut call: impl AsyncFnMut() -> Result<T, ClientError>,
    ) -> Result<T, ClientError> {
        let mut outage: Option<Instant> = None;
        let mut pause = FIRST_PAUSE;
        loop {
            let err = match call().await {
                Ok(answer) => {
                    if let Some(since) = outage {
                        let after = format_ms(u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX));
                        self.out.line(&format!("note: the daemon at {} answers again after {after}", self.server));
                    }
                    self.reached = true;
                    return Ok(answer);
                }
                Err(err) => err,
            };
            let passing = match &err {
                ClientError::Api { status, .. } => {
                    self.reached = true;
                    *status == 503
                }
                ClientError::Http(_) => self.reached,
                _ => false,
            };
            if !passing {
                return Err(err);
            }
            let since = *outage.get_or_insert_with(|| {
                self.out.line(&format!(
                    "note: the daemon at {} cannot serve now ({err}); asking again until it is back, for up to {} \
                     (--timeout)",
                    self.server,
                    format_ms(u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX))
                ));
                Instant::now()
            });
            let left = self.timeout.saturating_sub(since.elapsed());
            if left.is_zero() {
                self.out.line(&format!("note: the daemon at {} is still away after --timeout; giving up", self.server));
                return Err(err);
            }
            tokio::time::sleep(pause.min(left)).await;
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn who_waits_names_a_few() {
        assert_eq!(who_waits(&["a"]), "task a waits");
        assert_eq!(who_waits(&["a", "b"]), "tasks a and b wait");
        assert_eq!(who_waits(&["a", "b", "c"]), "tasks a, b and c wait");
        assert_eq!(who_waits(&["a", "b", "c", "d", "e"]), "tasks a, b, c and 2 more wait");
    }
}
