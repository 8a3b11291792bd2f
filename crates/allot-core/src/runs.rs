//! The run of a placed task by its plugin, round by round [Flyte's plugin machinery]: the phases a
//! plugin reports, the record of a run that the store keeps, and the decisions over it. The
//! executor calls the plugin and stores what these functions decide; they do no I/O.
//!
//! Where allot differs from Flyte, on purpose:
//! - the plugin state a round writes is kept whether or not the phase changed, and `reset`
//!   clears it (Flyte dropped the state of a round that repeated its phase and version,
//!   flyte#5195, and its `Reset` did nothing);
//! - a Barrier transition is recorded before it is acted on, and a round run again after a crash
//!   gets the recorded transition instead of calling the plugin again;
//! - user and system failures have budgets of their own;
//! - every attempt that ends is finalized (after success, after failure, after abort), and the
//!   tokens the task took are released then, whatever the path.

use std::fmt;

use crate::names::{NamespaceName, Token};
use crate::quotas::Millis;

/// Where a plugin says a task is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// Not started: something it needs is not ready yet.
    NotReady,
    /// Waiting for tokens of a quota; it does not count against the application's parallelism.
    WaitingForResources,
    /// Accepted by whatever runs it, not started yet.
    Queued,
    Initializing,
    Running,
    Success,
    /// Failed, and may run again (a new attempt), within its retry budget.
    RetryableFailure,
    /// Failed for good.
    PermanentFailure,
}

impl Phase {
    pub const ALL: [Phase; 8] = [
        Phase::NotReady,
        Phase::WaitingForResources,
        Phase::Queued,
        Phase::Initializing,
        Phase::Running,
        Phase::Success,
        Phase::RetryableFailure,
        Phase::PermanentFailure,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::NotReady => "NotReady",
            Phase::WaitingForResources => "WaitingForResources",
            Phase::Queued => "Queued",
            Phase::Initializing => "Initializing",
            Phase::Running => "Running",
            Phase::Success => "Success",
            Phase::RetryableFailure => "RetryableFailure",
            Phase::PermanentFailure => "PermanentFailure",
        }
    }

    pub fn parse(name: &str) -> Option<Phase> {
        Phase::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The attempt is over (it succeeded or failed).
    pub fn ends_attempt(self) -> bool {
        matches!(self, Phase::Success | Phase::RetryableFailure | Phase::PermanentFailure)
    }

    /// Whether a task in this phase waits to begin (not ready yet, or waiting for a token): it
    /// does not count against its application's parallelism.
    pub fn waits(self) -> bool {
        matches!(self, Phase::NotReady | Phase::WaitingForResources)
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whose fault a failure is: each has its own retry budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The task's own: its command failed, its input was wrong.
    User,
    /// The system's: a daemon died, a service was unreachable, a plugin failed.
    System,
}

impl ErrorKind {
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::User => "user",
            ErrorKind::System => "system",
        }
    }
}

/// Why an attempt failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecError {
    pub kind: ErrorKind,
    /// Stable and machine-readable (`exit_code_1`, `plugin_error`, `alloc_lost`...).
    pub code: String,
    pub message: String,
}

impl ExecError {
    pub fn user(code: &str, message: impl Into<String>) -> ExecError {
        ExecError { kind: ErrorKind::User, code: code.to_owned(), message: message.into() }
    }

    pub fn system(code: &str, message: impl Into<String>) -> ExecError {
        ExecError { kind: ErrorKind::System, code: code.to_owned(), message: message.into() }
    }
}

impl fmt::Display for ExecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} error {}: {}", self.kind.name(), self.code, self.message)
    }
}

/// A link to where a task's logs or progress can be seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLink {
    pub name: String,
    pub uri: String,
}

/// What a plugin reports of a task in a round [Flyte's `PhaseInfo` and `TaskInfo`]: its phase,
/// and a version the plugin raises when something new is worth an event within the same phase
/// (progress, a new log link, new custom information).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhaseInfo {
    pub phase: Phase,
    pub version: u32,
    pub reason: String,
    pub logs: Vec<LogLink>,
    /// Set for the failure phases.
    pub error: Option<ExecError>,
    /// When the phase really began, as the plugin knows it (an outside service saying its job
    /// started 3 s ago); the event keeps it beside the time it was recorded, and never after
    /// that time (a service whose clock is ahead).
    pub occurred_at: Option<Millis>,
    /// What the plugin tells the front end of it (an outside job's id and link): a JSON
    /// object's text, at most [`MAX_CUSTOM_INFO_BYTES`] (more is left out of the event, which
    /// says so).
    pub custom_info: Option<String>,
}

/// The most custom information an event keeps (its JSON text, in bytes).
pub const MAX_CUSTOM_INFO_BYTES: usize = 16 * 1024;

impl PhaseInfo {
    pub fn new(phase: Phase, version: u32, reason: impl Into<String>) -> PhaseInfo {
        PhaseInfo {
            phase,
            version,
            reason: reason.into(),
            logs: Vec::new(),
            error: None,
            occurred_at: None,
            custom_info: None,
        }
    }

    pub fn not_ready(reason: impl Into<String>) -> PhaseInfo {
        PhaseInfo::new(Phase::NotReady, 0, reason)
    }

    pub fn waiting_for_resources(reason: impl Into<String>) -> PhaseInfo {
        PhaseInfo::new(Phase::WaitingForResources, 0, reason)
    }

    pub fn queued(reason: impl Into<String>) -> PhaseInfo {
        PhaseInfo::new(Phase::Queued, 0, reason)
    }

    pub fn running(version: u32, reason: impl Into<String>) -> PhaseInfo {
        PhaseInfo::new(Phase::Running, version, reason)
    }

    pub fn success(reason: impl Into<String>) -> PhaseInfo {
        PhaseInfo::new(Phase::Success, 0, reason)
    }

    /// A failure that a new attempt may cure (within the budget of its kind).
    pub fn retryable(error: ExecError) -> PhaseInfo {
        PhaseInfo { error: Some(error.clone()), ..PhaseInfo::new(Phase::RetryableFailure, 0, error.message) }
    }

    /// A failure no new attempt can cure.
    pub fn permanent(error: ExecError) -> PhaseInfo {
        PhaseInfo { error: Some(error.clone()), ..PhaseInfo::new(Phase::PermanentFailure, 0, error.message) }
    }

    #[must_use]
    pub fn with_logs(self, logs: Vec<LogLink>) -> PhaseInfo {
        PhaseInfo { logs, ..self }
    }

    /// The phase began at `at` (ms since the epoch), not when the round saw it.
    #[must_use]
    pub fn occurred_at(self, at: Millis) -> PhaseInfo {
        PhaseInfo { occurred_at: Some(at), ..self }
    }

    /// Custom information for the front end: a JSON object (anything else is kept under
    /// `"value"`).
    #[must_use]
    pub fn with_custom_info(self, info: serde_json::Value) -> PhaseInfo {
        let object = match info {
            serde_json::Value::Object(map) => map,
            other => serde_json::Map::from_iter([("value".to_owned(), other)]),
        };
        PhaseInfo { custom_info: Some(serde_json::Value::Object(object).to_string()), ..self }
    }
}

/// How a round's result is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransitionKind {
    /// Stored with the round, like every result.
    Ephemeral,
    /// Recorded before anything is done with it: if the daemon dies before the round is over,
    /// the round is run again with the recorded result, without calling the plugin (for rounds
    /// whose side effect must not happen twice).
    Barrier,
}

/// What a round of a plugin answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub kind: TransitionKind,
    pub info: PhaseInfo,
}

impl Transition {
    pub fn ephemeral(info: PhaseInfo) -> Transition {
        Transition { kind: TransitionKind::Ephemeral, info }
    }

    pub fn barrier(info: PhaseInfo) -> Transition {
        Transition { kind: TransitionKind::Barrier, info }
    }
}

/// The plugin's own state for a task, kept between rounds. Its version is the plugin's schema
/// version, so a plugin can tell a state written by an older release of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginState {
    pub version: u8,
    pub bytes: Vec<u8>,
}

/// What a round did to the plugin's state.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum StateWrite {
    #[default]
    Unchanged,
    Put(PluginState),
    Reset,
}

/// A change of a task's run, for its timeline: one per (attempt, phase, version).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub attempt: u32,
    pub phase: Phase,
    pub version: u32,
    pub reason: String,
    pub logs: Vec<LogLink>,
    pub error: Option<ExecError>,
    /// When it was recorded.
    pub at: Millis,
    /// When it happened, as the plugin reported it (see [`PhaseInfo::occurred_at`]): never after
    /// `at`.
    pub occurred_at: Option<Millis>,
    /// The plugin's custom information (a JSON object's text).
    pub custom_info: Option<String>,
}

/// How many times a task may run again [Flyte's `RetryStrategy` and
/// `max-node-retries-system-failures`]. A permanent failure is never retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts that may end in a user failure, the first included (at least 1).
    pub user_attempts: u32,
    /// New attempts after system failures, beyond the user attempts.
    pub system_retries: u32,
}

/// The most retries a task, or the daemon's default, may ask for (of each kind).
pub const MAX_RETRIES: u32 = 100;

impl RetryPolicy {
    /// `retries` new attempts after user failures (retryable ones), `system_retries` after
    /// system failures, as Flyte counts them: `retries: 2` is three attempts in all.
    pub fn new(retries: u32, system_retries: u32) -> RetryPolicy {
        RetryPolicy { user_attempts: retries.saturating_add(1), system_retries }
    }

    /// The new attempts after user failures.
    pub fn retries(&self) -> u32 {
        self.user_attempts.saturating_sub(1)
    }
}

impl Default for RetryPolicy {
    /// Flyte's defaults: a user failure ends the task, three system failures are retried.
    fn default() -> RetryPolicy {
        RetryPolicy::new(0, 3)
    }
}

/// What the output cache looked up for a run's task [Flyte's catalog key], kept with the run so
/// that a user can see why a hit happened: the key is a digest of every part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheLookup {
    /// The key in the catalog (hex SHA-256 of the parts).
    pub key: String,
    pub task_type: String,
    /// The plugin that runs it (resolved).
    pub plugin: String,
    pub cache_version: String,
    /// Hex SHA-256 of the task's spec as its plugin receives it (JSON with sorted keys), its
    /// `inputs` and the executor's own settings (`retries`, `cache`) left out.
    pub spec_digest: String,
    /// Hex SHA-256 of its `inputs` (JSON with sorted keys).
    pub inputs_digest: String,
    /// A hit: the task whose outputs it took (`app/task`); `None` for a miss.
    pub hit: Option<String>,
}

/// A grant a task took through the resource manager: released when its attempt ends.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct TakenToken {
    pub namespace: NamespaceName,
    pub token: Token,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    Succeeded,
    Failed(ExecError),
    /// Stopped from outside (the task or its application removed, failed or completed).
    Aborted(String),
}

/// Where a run is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stage {
    /// Rounds of `handle` go on.
    Handling,
    /// The attempt is over: the plugin is asked to abort it (unless it ended by itself), then to
    /// finalize it, then the tokens it took are released; then `then` follows.
    Ending { abort: bool, then: AfterAttempt },
    /// The run is over; the scheduler is told.
    Ended(Ending),
}

/// What follows an attempt once it is finalized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterAttempt {
    /// A new attempt, its state reset.
    Retry,
    End(Ending),
}

/// What the executor does next for a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Another round of `handle` (at once when woken, or after a pause the executor picks by
    /// phase).
    Handle,
    /// Abort the attempt if `abort`, then finalize it, release its tokens, then call
    /// [`Run::attempt_finalized`].
    EndAttempt { abort: bool },
    /// The run is over: tell the scheduler how.
    Report(Ending),
}

/// The most events a run keeps of those its plugin reports ([`Run::note`]); phase changes are
/// always kept.
pub const MAX_EVENTS: usize = 1_000;

/// The error code of an attempt lost with its placement.
pub const PLACEMENT_LOST: &str = "placement_lost";
/// The error code of an attempt ended because the scheduler preempted its task.
pub const PREEMPTED: &str = "preempted";

/// One task's run, as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// 1 for the first attempt.
    pub attempt: u32,
    pub user_failures: u32,
    pub system_failures: u32,
    pub phase: Phase,
    pub version: u32,
    pub state: Option<PluginState>,
    /// Rounds handled so far (a Barrier's record names its round).
    pub round: u64,
    pub barrier: Option<(u64, Transition)>,
    pub events: Vec<Event>,
    pub stage: Stage,
    /// Taken (or asked for, and waiting) in this attempt, not released yet.
    pub tokens: Vec<TakenToken>,
    pub started: Millis,
    /// The task's outputs (JSON text), recorded once, by the round that succeeded.
    pub outputs: Option<String>,
    /// The placement (`pool/alloc`) the current attempt runs on: a task placed again elsewhere
    /// (its pool lost) finds another here, and its attempt is counted lost.
    pub alloc: Option<String>,
    /// The task it runs, by the number the scheduler gave it when it was added (`Task::seq`): a
    /// task removed and added again under the same id has another, and its run starts afresh.
    /// `None` in a run kept before the number was (it is taken as the task's).
    pub task_seq: Option<u64>,
    /// What the output cache looked up, for a cacheable task.
    pub cache: Option<CacheLookup>,
}

impl Run {
    /// A run's first attempt, not ready yet.
    pub fn new(now: Millis) -> Run {
        let mut run = Run {
            attempt: 1,
            user_failures: 0,
            system_failures: 0,
            phase: Phase::NotReady,
            version: 0,
            state: None,
            round: 0,
            barrier: None,
            events: Vec::new(),
            stage: Stage::Handling,
            tokens: Vec::new(),
            started: now,
            outputs: None,
            alloc: None,
            task_seq: None,
            cache: None,
        };
        run.record(&PhaseInfo::not_ready("placed; starting"), now);
        run
    }

    /// Whether the run is over (nothing of it runs or holds anything).
    pub fn ended(&self) -> bool {
        matches!(self.stage, Stage::Ended(_))
    }

    /// Whether it is the run of the task numbered `seq` (a run kept without a number is taken as
    /// the task's).
    pub fn belongs_to(&self, seq: u64) -> bool {
        self.task_seq.is_none_or(|own| own == seq)
    }

    /// What to do next.
    pub fn next(&self) -> Next {
        match &self.stage {
            Stage::Handling => Next::Handle,
            Stage::Ending { abort, .. } => Next::EndAttempt { abort: *abort },
            Stage::Ended(ending) => Next::Report(ending.clone()),
        }
    }

    /// The transition a Barrier recorded for the round about to run, if this round ran before
    /// (the daemon died after recording it): use it instead of calling the plugin.
    pub fn recorded(&self) -> Option<&Transition> {
        self.barrier.as_ref().filter(|(round, _)| *round == self.round).map(|(_, t)| t)
    }

    /// Records a Barrier transition for the current round, before it is acted on (the store
    /// keeps the run with it before [`Run::after_round`]).
    pub fn record_barrier(&mut self, transition: &Transition) {
        self.barrier = Some((self.round, transition.clone()));
    }

    /// Takes a round's result: the plugin's transition and what it wrote of its state, or the
    /// error the round failed with (a system failure). The state write is kept whatever the
    /// phase; a new (phase, version) is an event.
    pub fn after_round(
        &mut self,
        result: Result<(Transition, StateWrite), ExecError>,
        policy: RetryPolicy,
        now: Millis,
    ) -> Next {
        if self.stage != Stage::Handling {
            return self.next();
        }
        self.round += 1;
        let info = match result {
            Ok((transition, write)) => {
                match write {
                    StateWrite::Unchanged => {}
                    StateWrite::Put(state) => self.state = Some(state),
                    StateWrite::Reset => self.state = None,
                }
                transition.info
            }
            Err(error) => PhaseInfo::retryable(error),
        };
        self.record(&info, now);
        match info.phase {
            Phase::Success => self.end_attempt(false, AfterAttempt::End(Ending::Succeeded)),
            Phase::RetryableFailure | Phase::PermanentFailure => {
                let error = info.error.unwrap_or_else(|| ExecError::user("failed", info.reason.clone()));
                let retry = info.phase == Phase::RetryableFailure && self.count_failure(&error, policy);
                let then = if retry { AfterAttempt::Retry } else { AfterAttempt::End(Ending::Failed(error)) };
                // A failed attempt may have left something running: it is aborted first.
                self.end_attempt(true, then)
            }
            _ => {}
        }
        self.next()
    }

    /// The executor holds the run back before its next round (its application's parallelism is
    /// used up): the phase is recorded, no round is counted.
    pub fn hold(&mut self, info: &PhaseInfo, now: Millis) {
        if self.stage == Stage::Handling {
            self.record(info, now);
        }
    }

    /// The task was placed again (`alloc`) after the placement of this attempt was lost: the
    /// attempt failed with a system error where it ran, and cannot be aborted or finalized from
    /// here. Answers whether a lost attempt ends now (its tokens to release, then
    /// [`Run::attempt_finalized`]); a run that had ended already keeps its end (it is reported
    /// again, its outputs not recorded twice).
    pub fn placement_lost(&mut self, alloc: &str, policy: RetryPolicy, now: Millis) -> bool {
        let lost = self.alloc.as_deref().is_some_and(|was| was != alloc);
        self.alloc = Some(alloc.to_owned());
        if !lost {
            return false;
        }
        let error = ExecError::system(PLACEMENT_LOST, "the daemon that ran it stopped; placed again");
        let then = match &self.stage {
            Stage::Ended(_) => return false,
            // Already ending: it ends as it was going to.
            Stage::Handling => {
                self.record(&PhaseInfo::retryable(error.clone()), now);
                if self.count_failure(&error, policy) {
                    AfterAttempt::Retry
                } else {
                    AfterAttempt::End(Ending::Failed(error))
                }
            }
            Stage::Ending { then, .. } => then.clone(),
        };
        self.end_attempt(false, then);
        true
    }

    /// Records an event the plugin reported in a round (progress, something it saw) in the
    /// timeline, under the current phase and version; at most [`MAX_EVENTS`] events are kept.
    pub fn note(&mut self, reason: &str, now: Millis) {
        if self.events.len() < MAX_EVENTS {
            self.events.push(Event {
                attempt: self.attempt,
                phase: self.phase,
                version: self.version,
                reason: reason.to_owned(),
                logs: Vec::new(),
                error: None,
                at: now,
                occurred_at: None,
                custom_info: None,
            });
        }
    }

    /// Whether the current attempt was lost with its placement (see [`Run::placement_lost`]):
    /// it is ended without calling its plugin, which ran elsewhere.
    pub fn attempt_lost(&self) -> bool {
        self.events.last().is_some_and(|e| {
            e.attempt == self.attempt && e.error.as_ref().is_some_and(|err| err.code == PLACEMENT_LOST)
        })
    }

    /// The scheduler preempts the task: the attempt is aborted and finalized, counted as a
    /// system failure `preempted` (the system's budget, not the user's), and a new attempt
    /// follows once the task is placed again (its placement is forgotten: being placed elsewhere
    /// is not a lost placement). With the system budget spent, the run fails. Nothing happens to
    /// a run that is ending already.
    pub fn preempted(&mut self, reason: &str, policy: RetryPolicy, now: Millis) -> Next {
        if self.stage != Stage::Handling {
            return self.next();
        }
        let error = ExecError::system(PREEMPTED, reason);
        self.record(&PhaseInfo::retryable(error.clone()), now);
        let then = match self.count_failure(&error, policy) {
            true => AfterAttempt::Retry,
            false => AfterAttempt::End(Ending::Failed(error)),
        };
        self.alloc = None;
        self.end_attempt(true, then);
        self.next()
    }

    /// How many attempts a preemption ended.
    pub fn preemptions(&self) -> u32 {
        let preempted = |e: &&Event| e.error.as_ref().is_some_and(|error| error.code == PREEMPTED);
        self.events.iter().filter(preempted).count() as u32
    }

    /// Whether the preemption `reason` ended the previous attempt and the current one has not
    /// begun (it holds only its opening record): the same preemption seen again, as when the
    /// scheduler died before it took the placement back, and not a second one to count.
    pub fn preempted_before_this_attempt(&self, reason: &str) -> bool {
        let mut this_attempt = self.events.iter().rev().take_while(|e| e.attempt == self.attempt);
        let untouched = this_attempt.all(|e| e.phase == Phase::NotReady && e.version == 0);
        let ended_by_it =
            self.events.iter().rev().find(|e| e.attempt + 1 == self.attempt).is_some_and(|e| {
                e.error.as_ref().is_some_and(|error| error.code == PREEMPTED && error.message == reason)
            });
        matches!(self.stage, Stage::Handling) && self.phase == Phase::NotReady && untouched && ended_by_it
    }

    /// Stops the run from outside (its task removed or its application ended): the attempt is
    /// aborted and finalized, then the run ends as aborted. Nothing happens to a run that is
    /// ending already, unless it was about to retry.
    pub fn abort(&mut self, reason: &str, now: Millis) -> Next {
        let ending = Ending::Aborted(reason.to_owned());
        match &mut self.stage {
            Stage::Handling => {
                self.record(&PhaseInfo::permanent(ExecError::system("aborted", reason)), now);
                self.end_attempt(true, AfterAttempt::End(ending));
            }
            Stage::Ending { then, .. } if *then == AfterAttempt::Retry => *then = AfterAttempt::End(ending),
            Stage::Ending { .. } | Stage::Ended(_) => {}
        }
        self.next()
    }

    /// The attempt was aborted (if asked) and finalized, and its tokens released: a new attempt
    /// starts (state, phase and tokens reset), or the run ends.
    pub fn attempt_finalized(&mut self, now: Millis) -> Next {
        let Stage::Ending { then, .. } = &self.stage else { return self.next() };
        self.tokens.clear();
        match then.clone() {
            AfterAttempt::Retry => {
                self.attempt += 1;
                self.state = None;
                self.barrier = None;
                self.stage = Stage::Handling;
                self.phase = Phase::NotReady;
                self.version = 0;
                self.record(&PhaseInfo::not_ready(format!("attempt {}", self.attempt)), now);
            }
            AfterAttempt::End(ending) => self.stage = Stage::Ended(ending),
        }
        self.next()
    }

    /// Notes a token taken through the resource manager (released when the attempt ends).
    pub fn took(&mut self, token: TakenToken) {
        if !self.tokens.contains(&token) {
            self.tokens.push(token);
        }
    }

    /// Notes a token released by the plugin itself.
    pub fn released(&mut self, token: &TakenToken) {
        self.tokens.retain(|t| t != token);
    }

    /// Counts a failure against its budget; true if a new attempt may follow.
    fn count_failure(&mut self, error: &ExecError, policy: RetryPolicy) -> bool {
        match error.kind {
            ErrorKind::User => {
                self.user_failures += 1;
                self.user_failures < policy.user_attempts.max(1)
            }
            ErrorKind::System => {
                self.system_failures += 1;
                self.system_failures <= policy.system_retries
            }
        }
    }

    fn end_attempt(&mut self, abort: bool, then: AfterAttempt) {
        self.stage = Stage::Ending { abort, then };
    }

    /// Takes the phase; a new (phase, version) in this attempt is an event. A new version of the
    /// same phase is kept while the run holds fewer than [`MAX_EVENTS`] events; a new phase
    /// always is.
    fn record(&mut self, info: &PhaseInfo, now: Millis) {
        let seen =
            self.events.iter().any(|e| e.attempt == self.attempt && e.phase == info.phase && e.version == info.version);
        let new_phase = self.phase != info.phase || self.events.last().is_none_or(|e| e.attempt != self.attempt);
        self.phase = info.phase;
        self.version = info.version;
        if seen || (!new_phase && self.events.len() >= MAX_EVENTS) {
            return;
        }
        let mut reason = info.reason.clone();
        let custom_info = match &info.custom_info {
            Some(text) if text.len() > MAX_CUSTOM_INFO_BYTES => {
                reason.push_str(&format!(
                    " (custom info of {} bytes left out: at most {MAX_CUSTOM_INFO_BYTES})",
                    text.len()
                ));
                None
            }
            other => other.clone(),
        };
        self.events.push(Event {
            attempt: self.attempt,
            phase: info.phase,
            version: info.version,
            reason,
            logs: info.logs.clone(),
            error: info.error.clone(),
            at: now,
            occurred_at: info.occurred_at.map(|at| at.min(now)),
            custom_info,
        });
    }
}
