//! The run of a task by its plugin: every phase path, the retry budgets, abort then finalize, the
//! plugin state kept when a round repeats its phase (flyte#5195), a Barrier replayed after a
//! crash, and random rounds that always end.

use allot_core::runs::{
    Ending, ExecError, LogLink, Next, Phase, PhaseInfo, PluginState, RetryPolicy, Run, StateWrite, TakenToken,
    Transition, MAX_CUSTOM_INFO_BYTES, MAX_EVENTS,
};
use allot_core::{NamespaceName, Token};
use proptest::prelude::*;

fn round(run: &mut Run, info: PhaseInfo, write: StateWrite, policy: RetryPolicy) -> Next {
    run.after_round(Ok((Transition::ephemeral(info), write)), policy, 1_000 + run.round)
}

fn state(bytes: &[u8]) -> PluginState {
    PluginState { version: 1, bytes: bytes.to_vec() }
}

fn phases(run: &Run) -> Vec<(u32, Phase, u32)> {
    run.events.iter().map(|e| (e.attempt, e.phase, e.version)).collect()
}

#[test]
fn a_run_that_succeeds_is_finalized_then_reported() {
    let policy = RetryPolicy::default();
    let mut run = Run::new(0);
    assert_eq!(round(&mut run, PhaseInfo::queued("created"), StateWrite::Unchanged, policy), Next::Handle);
    assert_eq!(round(&mut run, PhaseInfo::running(0, "started"), StateWrite::Unchanged, policy), Next::Handle);
    assert_eq!(round(&mut run, PhaseInfo::running(0, "still"), StateWrite::Unchanged, policy), Next::Handle);
    assert_eq!(round(&mut run, PhaseInfo::running(1, "50 %"), StateWrite::Unchanged, policy), Next::Handle);
    let next = round(&mut run, PhaseInfo::success("done"), StateWrite::Unchanged, policy);
    assert_eq!(next, Next::EndAttempt { abort: false }, "success is finalized, not aborted");
    assert_eq!(run.attempt_finalized(2_000), Next::Report(Ending::Succeeded));
    assert_eq!(
        phases(&run),
        [
            (1, Phase::NotReady, 0),
            (1, Phase::Queued, 0),
            (1, Phase::Running, 0),
            (1, Phase::Running, 1),
            (1, Phase::Success, 0)
        ],
        "one event per (phase, version)"
    );
}

#[test]
fn the_state_a_round_writes_is_kept_when_the_phase_repeats() {
    // flyte#5195: the round that took a token repeated its phase; Flyte dropped its state, and the
    // task waited forever holding the token.
    let policy = RetryPolicy::default();
    let mut run = Run::new(0);
    round(&mut run, PhaseInfo::waiting_for_resources("no token"), StateWrite::Put(state(b"not-started")), policy);
    round(&mut run, PhaseInfo::waiting_for_resources("no token"), StateWrite::Put(state(b"token-taken")), policy);
    assert_eq!(run.state, Some(state(b"token-taken")));
    round(&mut run, PhaseInfo::waiting_for_resources("no token"), StateWrite::Unchanged, policy);
    assert_eq!(run.state, Some(state(b"token-taken")), "a round that writes nothing keeps the state");
    round(&mut run, PhaseInfo::waiting_for_resources("no token"), StateWrite::Reset, policy);
    assert_eq!(run.state, None, "reset clears it");
    assert_eq!(run.events.iter().filter(|e| e.phase == Phase::WaitingForResources).count(), 1);
}

#[test]
fn user_and_system_failures_have_budgets_of_their_own() {
    let policy = RetryPolicy { user_attempts: 2, system_retries: 1 };
    let mut run = Run::new(0);
    run.took(TakenToken { namespace: NamespaceName::new("api").unwrap(), token: Token::new("a:t").unwrap() });
    // A user failure: one more attempt allowed.
    let next =
        round(&mut run, PhaseInfo::retryable(ExecError::user("exit_1", "exit 1")), StateWrite::Unchanged, policy);
    assert_eq!(next, Next::EndAttempt { abort: true }, "a failed attempt is aborted, then finalized");
    assert_eq!(run.attempt_finalized(10), Next::Handle);
    assert_eq!((run.attempt, run.state.clone(), run.tokens.len()), (2, None, 0), "new attempt, clean slate");
    // A failing round is a system failure: its own budget.
    let next = run.after_round(Err(ExecError::system("plugin_error", "boom")), policy, 20);
    assert_eq!(next, Next::EndAttempt { abort: true });
    assert_eq!(run.attempt_finalized(30), Next::Handle);
    assert_eq!((run.attempt, run.user_failures, run.system_failures), (3, 1, 1));
    // The second user failure exhausts the user budget.
    let error = ExecError::user("exit_1", "exit 1 again");
    round(&mut run, PhaseInfo::retryable(error.clone()), StateWrite::Unchanged, policy);
    assert_eq!(run.attempt_finalized(40), Next::Report(Ending::Failed(error)));
    assert_eq!(run.events.iter().filter(|e| e.phase == Phase::RetryableFailure).count(), 3);
}

#[test]
fn a_permanent_failure_is_not_retried() {
    let policy = RetryPolicy { user_attempts: 5, system_retries: 5 };
    let mut run = Run::new(0);
    let error = ExecError::system("bad_spec", "no such image");
    round(&mut run, PhaseInfo::permanent(error.clone()), StateWrite::Unchanged, policy);
    assert_eq!(run.attempt_finalized(1), Next::Report(Ending::Failed(error)));
    assert_eq!(run.attempt, 1);
}

#[test]
fn abort_is_always_followed_by_finalize_and_the_tokens_go() {
    let policy = RetryPolicy::default();
    let mut run = Run::new(0);
    round(&mut run, PhaseInfo::running(0, "up"), StateWrite::Unchanged, policy);
    run.took(TakenToken { namespace: NamespaceName::new("api").unwrap(), token: Token::new("a:t").unwrap() });
    assert_eq!(run.abort("application removed", 5), Next::EndAttempt { abort: true });
    assert_eq!(run.next(), Next::EndAttempt { abort: true }, "until finalized, the executor is told again");
    assert_eq!(run.attempt_finalized(6), Next::Report(Ending::Aborted("application removed".into())));
    assert!(run.tokens.is_empty());
    // An abort while a retry is pending ends the run instead.
    let mut run = Run::new(0);
    round(&mut run, PhaseInfo::retryable(ExecError::system("lost", "alloc lost")), StateWrite::Unchanged, policy);
    run.abort("removed", 7);
    assert_eq!(run.attempt_finalized(8), Next::Report(Ending::Aborted("removed".into())));
}

#[test]
fn a_barrier_is_replayed_after_a_crash_instead_of_calling_the_plugin() {
    let policy = RetryPolicy::default();
    let mut run = Run::new(0);
    let launched = Transition::barrier(PhaseInfo::queued("job 17 created"));
    run.record_barrier(&launched);
    // The daemon dies here; the stored run has the barrier for this round.
    let stored = run.clone();
    assert_eq!(stored.recorded(), Some(&launched), "the round runs again with the recorded result");
    let mut run = stored;
    let replay = run.recorded().cloned().unwrap();
    run.after_round(Ok((replay, StateWrite::Unchanged)), policy, 1);
    assert_eq!(run.phase, Phase::Queued);
    assert_eq!(run.recorded(), None, "the next round calls the plugin");
}

#[derive(Debug, Clone)]
enum Step {
    Round(u8, u32),
    Fail(bool, bool),
    Crash,
    Abort,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0u8..5, 0u32..3).prop_map(|(p, v)| Step::Round(p, v)),
        (any::<bool>(), any::<bool>()).prop_map(|(user, retryable)| Step::Fail(user, retryable)),
        Just(Step::Crash),
        Just(Step::Abort),
    ]
}

proptest! {
    /// Whatever the rounds answer: one event per (attempt, phase, version), attempts within the
    /// budgets, every ended attempt finalized with its tokens released, and a run that keeps
    /// failing ends.
    #[test]
    fn random_rounds_keep_the_invariants_and_failing_runs_end(steps in proptest::collection::vec(step(), 1..60)) {
        let policy = RetryPolicy { user_attempts: 2, system_retries: 2 };
        let mut run = Run::new(0);
        let mut now = 0;
        let mut ended = None;
        for step in steps {
            now += 1;
            if ended.is_some() { break; }
            let next = match step {
                Step::Round(p, v) => {
                    let phase = [Phase::NotReady, Phase::WaitingForResources, Phase::Queued, Phase::Initializing, Phase::Running][p as usize];
                    run.took(TakenToken { namespace: NamespaceName::new("n").unwrap(), token: Token::new("a:t").unwrap() });
                    run.after_round(Ok((Transition::ephemeral(PhaseInfo::new(phase, v, "")), StateWrite::Unchanged)), policy, now)
                }
                Step::Fail(user, retryable) => {
                    let error = if user { ExecError::user("u", "u") } else { ExecError::system("s", "s") };
                    let info = if retryable { PhaseInfo::retryable(error) } else { PhaseInfo::permanent(error) };
                    run.after_round(Ok((Transition::ephemeral(info), StateWrite::Unchanged)), policy, now)
                }
                Step::Crash => run.after_round(Err(ExecError::system("crash", "daemon died")), policy, now),
                Step::Abort => run.abort("stop", now),
            };
            match next {
                Next::Handle => {}
                Next::EndAttempt { .. } => {
                    if let Next::Report(ending) = run.attempt_finalized(now) {
                        prop_assert!(run.tokens.is_empty(), "tokens released when the run ends");
                        ended = Some(ending);
                    } else {
                        prop_assert!(run.tokens.is_empty(), "tokens released before a new attempt");
                    }
                }
                Next::Report(ending) => ended = Some(ending),
            }
            prop_assert!(run.attempt <= 1 + (policy.user_attempts - 1) + policy.system_retries);
            prop_assert!(run.user_failures <= policy.user_attempts && run.system_failures <= policy.system_retries + 1);
        }
        let mut seen = std::collections::HashSet::new();
        for e in &run.events {
            prop_assert!(seen.insert((e.attempt, e.phase, e.version)), "duplicate event {:?}", e);
        }
        // Failing rounds only: the run ends within the budgets.
        let mut failing = run.clone();
        for i in 0..20 {
            match failing.after_round(Err(ExecError::system("s", "s")), policy, 1_000 + i) {
                Next::EndAttempt { .. } => { if let Next::Report(_) = failing.attempt_finalized(1_000 + i) { break; } }
                Next::Report(_) => break,
                Next::Handle => {}
            }
        }
        prop_assert!(matches!(failing.next(), Next::Report(_)), "a run that keeps failing ends: {:?}", failing.stage);
    }
}

#[test]
fn an_attempt_whose_placement_was_lost_counts_a_system_failure_and_a_new_one_follows() {
    let policy = RetryPolicy { user_attempts: 1, system_retries: 1 };
    let mut run = Run::new(0);
    assert!(!run.placement_lost("a/1", policy, 1), "the first placement is noted, nothing is lost");
    assert!(!run.placement_lost("a/1", policy, 2), "the same placement again: nothing is lost");
    run.after_round(Ok((Transition::ephemeral(PhaseInfo::running(0, "working")), StateWrite::Unchanged)), policy, 3);
    assert!(run.placement_lost("b/7", policy, 4), "placed again elsewhere: the attempt is lost");
    assert_eq!(run.next(), Next::EndAttempt { abort: false }, "not aborted: it cannot be reached");
    assert!(run.attempt_lost());
    assert_eq!(run.system_failures, 1);
    assert_eq!(run.events.last().unwrap().error.as_ref().unwrap().code, "placement_lost");
    assert_eq!(run.attempt_finalized(5), Next::Handle);
    assert_eq!((run.attempt, run.alloc.as_deref()), (2, Some("b/7")));
    // Lost again: the system budget (1 retry) is spent, the run fails.
    assert!(run.placement_lost("c/9", policy, 6));
    run.attempt_finalized(7);
    assert!(matches!(run.next(), Next::Report(Ending::Failed(e)) if e.code == "placement_lost"));
    // A run that had ended keeps its end: it is reported again, nothing runs twice.
    let mut done = Run::new(0);
    done.placement_lost("a/1", policy, 1);
    done.after_round(Ok((Transition::ephemeral(PhaseInfo::success("done")), StateWrite::Unchanged)), policy, 2);
    done.attempt_finalized(3);
    assert!(!done.placement_lost("b/2", policy, 4));
    assert_eq!(done.next(), Next::Report(Ending::Succeeded));
}

#[test]
fn a_preemption_seen_again_before_the_next_attempt_began_is_the_same_one() {
    let policy = RetryPolicy { user_attempts: 1, system_retries: 3 };
    let reason = "preempted for gold/g: its queue is below its guarantee";
    let mut run = Run::new(0);
    run.placement_lost("w/1", policy, 1);
    run.after_round(Ok((Transition::ephemeral(PhaseInfo::running(0, "working")), StateWrite::Unchanged)), policy, 2);
    assert!(!run.preempted_before_this_attempt(reason), "running, not preempted yet");
    assert_eq!(run.preempted(reason, policy, 3), Next::EndAttempt { abort: true });
    assert!(!run.preempted_before_this_attempt(reason), "its attempt is still ending");
    assert_eq!(run.attempt_finalized(4), Next::Handle);
    assert_eq!((run.attempt, run.system_failures), (2, 1));
    // The scheduler died before it took the placement back: the task is seen on it, still marked.
    assert!(!run.placement_lost("w/1", policy, 5), "its placement noted again, nothing lost");
    assert!(run.preempted_before_this_attempt(reason), "the same preemption, seen again");
    assert!(!run.preempted_before_this_attempt("preempted for other/t: it has a higher priority (9)"));
    // Once the new attempt has begun, a preemption is another one.
    run.after_round(Ok((Transition::ephemeral(PhaseInfo::queued("again")), StateWrite::Unchanged)), policy, 6);
    assert!(!run.preempted_before_this_attempt(reason), "the attempt began: a preemption now is a new one");
    assert_eq!(run.preempted(reason, policy, 7), Next::EndAttempt { abort: true });
    assert_eq!(run.system_failures, 2);
}

/// Flyte's `TaskInfo`: an event keeps when its phase really began (never after it was recorded)
/// and the plugin's custom information (left out, and said so, past its bound).
#[test]
fn an_event_keeps_when_its_phase_began_and_the_plugins_custom_info() {
    let mut run = Run::new(1_000);
    let policy = RetryPolicy::default();
    let info = PhaseInfo::running(0, "job started")
        .occurred_at(2_000)
        .with_custom_info(serde_json::json!({"job": "j-1"}))
        .with_logs(vec![LogLink { name: "console".into(), uri: "https://jobs.example/j-1".into() }]);
    run.after_round(Ok((Transition::ephemeral(info), StateWrite::Unchanged)), policy, 5_000);
    let event = run.events.last().unwrap();
    assert_eq!((event.at, event.occurred_at), (5_000, Some(2_000)));
    assert_eq!(event.custom_info.as_deref(), Some(r#"{"job":"j-1"}"#));
    assert_eq!(event.logs.len(), 1);

    // A service whose clock is ahead: the phase did not begin after the round saw it.
    let ahead = PhaseInfo::running(1, "on").occurred_at(9_000);
    run.after_round(Ok((Transition::ephemeral(ahead), StateWrite::Unchanged)), policy, 6_000);
    assert_eq!(run.events.last().unwrap().occurred_at, Some(6_000));

    // Custom information past its bound is left out; the event says so.
    let big = serde_json::json!({"blob": "x".repeat(MAX_CUSTOM_INFO_BYTES)});
    let info = PhaseInfo::running(2, "big").with_custom_info(big);
    run.after_round(Ok((Transition::ephemeral(info), StateWrite::Unchanged)), policy, 7_000);
    let event = run.events.last().unwrap();
    assert_eq!(event.custom_info, None);
    assert!(event.reason.starts_with("big (custom info of") && event.reason.contains("left out"), "{}", event.reason);

    // Anything but an object is kept under "value".
    let info = PhaseInfo::running(3, "n").with_custom_info(serde_json::json!(7));
    run.after_round(Ok((Transition::ephemeral(info), StateWrite::Unchanged)), policy, 8_000);
    assert_eq!(run.events.last().unwrap().custom_info.as_deref(), Some(r#"{"value":7}"#));
}

/// New versions of one phase are kept up to [`MAX_EVENTS`] events; a new phase always is.
#[test]
fn versions_of_a_phase_are_bounded_and_phase_changes_are_kept() {
    let mut run = Run::new(0);
    let policy = RetryPolicy::default();
    for version in 0..(MAX_EVENTS as u32 + 10) {
        let info = PhaseInfo::running(version, format!("progress {version}"));
        run.after_round(Ok((Transition::ephemeral(info), StateWrite::Unchanged)), policy, u64::from(version));
    }
    assert_eq!(run.events.len(), MAX_EVENTS);
    assert_eq!(run.version, MAX_EVENTS as u32 + 9, "the run is at the version reported");
    run.after_round(Ok((Transition::ephemeral(PhaseInfo::success("done")), StateWrite::Unchanged)), policy, 9_999);
    assert_eq!(run.events.last().unwrap().phase, Phase::Success);
}
