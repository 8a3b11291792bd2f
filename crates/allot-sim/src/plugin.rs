//! The simulation's task plugin (type `sim`), run by the real executor: each task goes through
//! the rounds its spec asks for (`rounds`), a seat of the plugin's own quota held through them
//! if it asks (`seat`), and ends as it says (`end`: `ok`, `retry`, a user failure retried as the
//! daemon's policy allows, or `fail`, a permanent one). Odd rounds are barriers: stored before
//! they are acted on, and replayed, not called again, after a crash.
//!
//! What it saw is kept in a [`Journal`] shared with the simulation, which checks it after every
//! step: within one life of the daemon, no round of an attempt comes after its `finalize` (unless
//! the disk failed since: a run whose ending could not be stored replays its last round, as after
//! a crash), and no two rounds of one task run at once (a task driven in two places).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use allot_core::runs::{ExecError, PhaseInfo, Transition};
use allot_exec::{Plugin, PluginEntry, TaskContext, TokenStatus};
use async_trait::async_trait;

use crate::check::Violation;
use crate::disk::SimDisk;

/// The plugin's quota (`sim:seats`), made by the simulation: small, so that seats are waited for.
pub const SEATS: &str = "seats";
pub const SEATS_NAMESPACE: &str = "sim:seats";
pub const SEATS_QUOTA: u64 = 2;

/// What the plugin saw in one life of the daemon, and what broke its rules.
pub struct Journal {
    /// Each (run, attempt) finalized in this life, and how many disk faults had happened then.
    finalized: BTreeMap<(String, u32), u64>,
    /// The runs in a round now.
    in_round: BTreeSet<String>,
    pub violations: Vec<String>,
    /// Rounds called, in all.
    pub rounds: u64,
    /// How many of the store's operations failed so far (the disk's, or the store calls').
    faults: Faults,
}

/// Counts the faults of what the daemon's store stands on: after one, a run whose ending could
/// not be stored replays its last round.
pub type Faults = Box<dyn Fn() -> u64 + Send>;

/// A journal the plugin writes and the simulation reads.
pub type SharedJournal = Arc<Mutex<Journal>>;

/// A new journal, for one life of the daemon whose store is on `disk`.
pub fn journal(disk: SimDisk) -> SharedJournal {
    journal_counting(Box::new(move || disk.faults()))
}

/// A new journal, for one life of the daemon whose store's faults `faults` counts.
pub fn journal_counting(faults: Faults) -> SharedJournal {
    let journal =
        Journal { finalized: BTreeMap::new(), in_round: BTreeSet::new(), violations: Vec::new(), rounds: 0, faults };
    Arc::new(Mutex::new(journal))
}

impl Journal {
    /// The store's faults so far.
    fn faults(&self) -> u64 {
        (self.faults)()
    }
}

pub(crate) fn lock(journal: &SharedJournal) -> std::sync::MutexGuard<'_, Journal> {
    journal.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The violations the journal holds, taken.
pub fn violations(journal: &SharedJournal) -> Result<(), Violation> {
    match std::mem::take(&mut lock(journal).violations).into_iter().next() {
        Some(first) => Err(Violation::new(first)),
        None => Ok(()),
    }
}

/// The plugin's entry, writing to `journal`.
pub fn entry(journal: SharedJournal) -> PluginEntry {
    PluginEntry::new("sim", &["sim"], false, move |_| {
        let journal = journal.clone();
        async move { Ok(Arc::new(SimPlugin { journal }) as Arc<dyn Plugin>) }
    })
}

struct SimPlugin {
    journal: SharedJournal,
}

/// The spec's numbers, with their defaults.
struct Asks {
    rounds: u64,
    seat: bool,
    end: String,
}

fn asks(ctx: &TaskContext) -> Asks {
    Asks {
        rounds: ctx.spec.get("rounds").and_then(|r| r.as_u64()).unwrap_or(1).max(1),
        seat: ctx.spec.get("seat").and_then(|s| s.as_bool()).unwrap_or(false),
        end: ctx.spec.get("end").and_then(|e| e.as_str()).unwrap_or("ok").to_owned(),
    }
}

impl SimPlugin {
    fn begin(&self, ctx: &TaskContext) {
        let run = ctx.run.to_string();
        let mut journal = lock(&self.journal);
        journal.rounds += 1;
        let faults = journal.faults();
        if journal.finalized.get(&(run.clone(), ctx.attempt)) == Some(&faults) {
            let broken = format!("{run}: a round of attempt {} after its finalize", ctx.attempt);
            journal.violations.push(broken);
        }
        if !journal.in_round.insert(run.clone()) {
            journal.violations.push(format!("{run}: two rounds at once (driven in two places)"));
        }
    }

    fn end(&self, ctx: &TaskContext) {
        lock(&self.journal).in_round.remove(&ctx.run.to_string());
    }

    async fn round(&self, ctx: &mut TaskContext) -> Result<Transition, ExecError> {
        let asks = asks(ctx);
        if asks.seat {
            if let TokenStatus::Waiting(refusal) = ctx.tokens.take(SEATS, 1).await? {
                let why = format!("waiting for a seat: {refusal:?}");
                return Ok(Transition::ephemeral(PhaseInfo::waiting_for_resources(why)));
            }
        }
        let done: u64 = ctx.state_json(1).unwrap_or(0) + 1;
        if done < asks.rounds {
            ctx.put_state_json(1, &done);
            let info = PhaseInfo::running(u32::try_from(done).unwrap_or(u32::MAX), format!("round {done}"));
            return Ok(if done % 2 == 1 { Transition::barrier(info) } else { Transition::ephemeral(info) });
        }
        Ok(Transition::ephemeral(match asks.end.as_str() {
            "retry" => PhaseInfo::retryable(ExecError::user("sim_retry", "the spec asks for a retryable failure")),
            "fail" => PhaseInfo::permanent(ExecError::user("sim_fail", "the spec asks to fail")),
            _ => PhaseInfo::success(format!("{done} rounds")),
        }))
    }
}

#[async_trait]
impl Plugin for SimPlugin {
    fn id(&self) -> &str {
        "sim"
    }

    async fn handle(&self, ctx: &mut TaskContext) -> Result<Transition, ExecError> {
        self.begin(ctx);
        let answer = self.round(ctx).await;
        self.end(ctx);
        answer
    }

    async fn abort(&self, _: &mut TaskContext) -> Result<(), ExecError> {
        Ok(())
    }

    async fn finalize(&self, ctx: &mut TaskContext) -> Result<(), ExecError> {
        let mut journal = lock(&self.journal);
        let faults = journal.faults();
        journal.finalized.insert((ctx.run.to_string(), ctx.attempt), faults);
        Ok(())
    }
}
