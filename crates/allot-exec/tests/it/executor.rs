//! The executor on a real embedded store: placed tasks run with their plugins and end; a failed
//! attempt is aborted, finalized and retried within its budget; a task removed from outside is
//! aborted and finalized and its tokens released; a restarted executor resumes a run where it was.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use allot_core::apps::queues::QueuePath;
use allot_core::apps::states::TaskState;
use allot_core::apps::{AppId, AppSpec, NeverFits, SchedError, SchedulingPolicy, TaskId};
use allot_core::clock::ManualClock;
use allot_core::pools::PoolName;
use allot_core::runs::{Phase, PhaseInfo, RetryPolicy, Transition};
use allot_exec::{ExecutorConfig, PluginCounters};
use allot_store::StoreError;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placed_tasks_run_with_their_plugins_and_end() {
    let s = setup().await;
    let store = &*s.store;
    let app = submit(
        store,
        "a",
        &[
            ("quick", serde_json::json!({ "type": "noop", "inputs": { "rows": 3 } })),
            ("nap", serde_json::json!({ "type": "sleep", "seconds": 0.3 })),
            ("broken", serde_json::json!({ "kind": "noop" })),
        ],
    )
    .await;
    // A type no executor runs is refused when added, not left to fail.
    let refused = store.add_task(app.clone(), task_spec("unknown", &serde_json::json!({ "type": "teleport" }))).await;
    assert!(
        matches!(&refused, Err(StoreError::Apps(SchedError::NeverFits { why: NeverFits::TaskType { .. }, .. }))),
        "{refused:?}"
    );
    for task in ["quick", "nap"] {
        until(task, async || state(store, &app, task).await == TaskState::Completed).await;
    }
    until("broken", async || state(store, &app, "broken").await == TaskState::Failed).await;
    let reason = store.task(app.clone(), TaskId::new("broken").unwrap()).await.unwrap().task.reason.unwrap();
    assert!(reason.contains("bad_spec") && reason.contains("`type`"), "{reason}");
    let quick = store.run(app.clone(), TaskId::new("quick").unwrap()).await.unwrap().unwrap();
    assert_eq!(quick.outputs.as_deref(), Some(r#"{"rows":3}"#), "the outputs are recorded");
    let nap = store.run(app.clone(), TaskId::new("nap").unwrap()).await.unwrap().unwrap();
    let timeline: Vec<Phase> = nap.events.iter().map(|e| e.phase).collect();
    assert_eq!(timeline, [Phase::NotReady, Phase::Running, Phase::Success]);
    assert_eq!(store.pool(PoolName::new("local").unwrap()).await.unwrap().allocs, 0, "allocs freed as tasks end");
    s.stop.send_replace(true);
}

/// A run is in the store before its plugin's first round when the plugin acts outside the run (a
/// restart finds what the round began); a `noop` run, whose round only computes, is first
/// written with its end, in the commit that reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_stored_before_its_first_round_only_when_its_plugin_acts_outside() {
    let s = setup().await;
    let store = &*s.store;
    let mut feed = store.watch(allot_core::watch::Filter::default(), Some(store.revision())).unwrap();
    let app = submit(
        store,
        "first",
        &[
            ("computes", serde_json::json!({ "type": "noop" })),
            ("acts", serde_json::json!({ "type": "probe", "mode": "observe" })),
        ],
    )
    .await;
    // The runs' writes, in order, as (run key, phase) until both tasks have completed.
    let mut writes: Vec<(String, Phase)> = Vec::new();
    let mut completed = 0;
    while completed < 2 {
        let event = feed.next().await.unwrap();
        match &event.object {
            allot_store::EventObject::Run(run) => writes.push((event.key.clone(), run.phase)),
            allot_store::EventObject::Task(task) if task.state == TaskState::Completed => completed += 1,
            _ => {}
        }
    }
    let of = |task: &str| {
        let key = allot_core::watch::keys::run(&app, task);
        writes.iter().filter(|(k, _)| *k == key).map(|(_, phase)| *phase).collect::<Vec<_>>()
    };
    assert_eq!(of("computes"), [Phase::Success], "one write, with its end: {writes:?}");
    let acts = of("acts");
    assert_eq!(acts.len(), 2, "stored before its round, then with its end: {writes:?}");
    assert_ne!(acts[0], Phase::Success, "{writes:?}");
    assert_eq!(acts[1], Phase::Success, "{writes:?}");
    assert_eq!(s.probe.handled.load(Ordering::SeqCst), 1);
    let kept = store.run(app.clone(), TaskId::new("computes").unwrap()).await.unwrap().unwrap();
    assert_eq!(kept.phase, Phase::Success, "the run is kept");
    s.stop.send_replace(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempt_is_aborted_finalized_and_retried_within_its_budget() {
    let s = setup().await;
    let store = &*s.store;
    let app = submit(store, "b", &[("flaky", serde_json::json!({ "type": "probe", "mode": "fail_first" }))]).await;
    until("flaky completes", async || state(store, &app, "flaky").await == TaskState::Completed).await;
    let run = store.run(app.clone(), TaskId::new("flaky").unwrap()).await.unwrap().unwrap();
    assert_eq!((run.attempt, run.user_failures), (2, 1));
    assert_eq!(s.probe.aborted.load(Ordering::SeqCst), 1, "the failed attempt was aborted");
    assert_eq!(s.probe.finalized.load(Ordering::SeqCst), 2, "both attempts were finalized");
    s.stop.send_replace(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_removed_from_outside_is_aborted_finalized_and_its_tokens_released() {
    let s = setup().await;
    let store = &*s.store;
    let app = submit(
        store,
        "c",
        &[
            ("first", serde_json::json!({ "type": "probe", "mode": "hold" })),
            ("second", serde_json::json!({ "type": "probe", "mode": "hold" })),
        ],
    )
    .await;
    let seats = allot_core::NamespaceName::new("probe:seats").unwrap();
    // The seat is granted inside a round and the run stored after it: wait for both runs to
    // show it, then tell the holder from the waiter.
    let phase = async |task: &str| store.run(app.clone(), TaskId::new(task).unwrap()).await.unwrap().map(|r| r.phase);
    until("one holds the seat and the other waits for it", async || {
        let both = (phase("first").await, phase("second").await);
        matches!(
            both,
            (Some(Phase::Running), Some(Phase::WaitingForResources))
                | (Some(Phase::WaitingForResources), Some(Phase::Running))
        )
    })
    .await;
    assert_eq!(store.namespace(seats.clone()).await.unwrap().granted_units, 1);
    let (holder, waiter) =
        if phase("first").await == Some(Phase::Running) { ("first", "second") } else { ("second", "first") };
    // The plugin's quota is not removed under the run that holds a seat, with force or not.
    let refused = store.remove_namespace(seats.clone(), true).await;
    let Err(StoreError::Quotas(allot_core::LedgerError::NamespaceHeldByScheduler { token, .. })) = &refused else {
        panic!("the plugin's quota was removed under its run: {refused:?}");
    };
    assert_eq!(token.as_str(), format!("@{app}:{holder}:1"), "the run's attempt holds it");
    assert_eq!(store.namespace(seats.clone()).await.unwrap().granted_units, 1, "nothing was ended");
    store.remove_task(app.clone(), TaskId::new(holder).unwrap()).await.unwrap();
    // The holder's attempt is aborted and finalized and its seat released; the waiter is woken
    // by the release and takes it.
    until("the waiter holds the seat", async || {
        store.run(app.clone(), TaskId::new(waiter).unwrap()).await.unwrap().is_some_and(|r| r.phase == Phase::Running)
    })
    .await;
    assert_eq!(s.probe.aborted.load(Ordering::SeqCst), 1);
    assert_eq!(s.probe.finalized.load(Ordering::SeqCst), 1);
    store.remove_app(app.clone()).await.unwrap();
    until("no seat is held", async || store.namespace(seats.clone()).await.unwrap().granted_units == 0).await;
    until("both finalized", async || s.probe.finalized.load(Ordering::SeqCst) == 2).await;
    s.stop.send_replace(true);
}

/// A run waiting for a seat in its plugin's quota when that quota is removed (with force: a
/// client held the seat) is not left waiting for a namespace that is gone: its attempt fails,
/// and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_waiting_in_a_quota_that_is_removed_fails_and_says_why() {
    let s = setup().await;
    let store = &*s.store;
    let seats = allot_core::NamespaceName::new("probe:seats").unwrap();
    let request = allot_core::AllocateRequest {
        namespace: seats.clone(),
        token: allot_core::Token::new("a-client").unwrap(),
        units: 1,
        scope: None,
        constraints: Default::default(),
        lease: allot_core::LeaseRequest::None,
    };
    store.allocate(request, Duration::ZERO).await.unwrap();
    let app = submit(store, "w", &[("waiter", serde_json::json!({ "type": "probe", "mode": "hold" }))]).await;
    let waiter = TaskId::new("waiter").unwrap();
    until("the run waits for the seat", async || {
        store.run(app.clone(), waiter.clone()).await.unwrap().is_some_and(|r| r.phase == Phase::WaitingForResources)
    })
    .await;
    assert_eq!(store.remove_namespace(seats.clone(), true).await.unwrap(), 1, "the client's grant ends");
    until("the task fails", async || state(store, &app, "waiter").await.is_terminal()).await;
    let task = store.task(app.clone(), waiter.clone()).await.unwrap();
    assert_eq!(task.task.state, TaskState::Failed, "{task:?}");
    let reason = task.task.reason.unwrap_or_default();
    assert!(reason.contains("probe:seats"), "the reason names the quota: {reason}");
    store.remove_app(app).await.unwrap();
    s.stop.send_replace(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_executor_resumes_a_run_where_it_was() {
    let (dir, store) = new_store().await;
    // The runs read a clock that moves only when the test moves it.
    let clock = ManualClock::new();
    let on_clock = |config: &mut ExecutorConfig| config.clock = Arc::new(clock.clone());
    let probe = || Arc::new(Probe::default());
    let stop =
        start_with(store.clone(), dir.path(), probe(), PluginCounters::default(), &Default::default(), on_clock).await;
    let app = submit(&*store, "d", &[("nap", serde_json::json!({ "type": "sleep", "seconds": 1.0 }))]).await;
    until("the nap runs", async || {
        store.run(app.clone(), TaskId::new("nap").unwrap()).await.unwrap().is_some_and(|r| r.phase == Phase::Running)
    })
    .await;
    stopped(&stop).await;
    // The nap's second passes while the executor is down: a run that went on from where it was
    // ends at once; one that started over would wait for a second the clock never gives.
    clock.advance(Duration::from_secs(1));
    let stop =
        start_with(store.clone(), dir.path(), probe(), PluginCounters::default(), &Default::default(), on_clock).await;
    until("the nap completes, from where it was", async || state(&*store, &app, "nap").await == TaskState::Completed)
        .await;
    let run = store.run(app.clone(), TaskId::new("nap").unwrap()).await.unwrap().unwrap();
    assert_eq!(run.events.iter().filter(|e| e.phase == Phase::Running).count(), 1);
    stop.send_replace(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_tasks_run_their_command_and_map_its_exit_status() {
    assert!(
        std::env::var_os("CARGO_PKG_NAME").is_some(),
        "cargo sets it for the test: the check below means something"
    );
    let s = setup().await;
    let store = &*s.store;
    let app = submit(
        store,
        "e",
        &[
            ("ok", serde_json::json!({ "type": "shell", "command": "echo hello; echo '{\"n\": 7}' > \"$ALLOT_OUTPUTS\"" })),
            ("fails", serde_json::json!({ "type": "shell", "command": "echo oops >&2; exit 3" })),
            ("missing", serde_json::json!({ "type": "shell", "command": "no-such-command-here" })),
            // The daemon's own environment is not passed on (but for PATH and the like).
            ("env", serde_json::json!({ "type": "shell", "command": "test \"$ALLOT_RESOURCES\" = cpu=1 && test \"$GREETING\" = hi && test -z \"${CARGO_PKG_NAME-}\" && test -n \"$PATH\"", "env": { "GREETING": "hi" } })),
        ],
    )
    .await;
    for task in ["ok", "env"] {
        until(task, async || state(store, &app, task).await == TaskState::Completed).await;
    }
    for task in ["fails", "missing"] {
        until(task, async || state(store, &app, task).await == TaskState::Failed).await;
    }
    let dir = s._dir.path().join("tasks").join("e");
    assert_eq!(std::fs::read_to_string(dir.join("ok/attempt-1/stdout.log")).unwrap(), "hello\n");
    let ok = store.run(app.clone(), TaskId::new("ok").unwrap()).await.unwrap().unwrap();
    assert_eq!(ok.outputs.as_deref(), Some(r#"{"n":7}"#));
    // Exit status 3 is retryable: two attempts (the budget), each with its own logs.
    let fails = store.run(app.clone(), TaskId::new("fails").unwrap()).await.unwrap().unwrap();
    assert_eq!((fails.attempt, fails.user_failures), (2, 2));
    assert_eq!(std::fs::read_to_string(dir.join("fails/attempt-2/stderr.log")).unwrap(), "oops\n");
    let reason = store.task(app.clone(), TaskId::new("fails").unwrap()).await.unwrap().task.reason.unwrap();
    assert!(reason.contains("exit_3"), "{reason}");
    // 127 (not found) is permanent: one attempt.
    let missing = store.run(app.clone(), TaskId::new("missing").unwrap()).await.unwrap().unwrap();
    assert_eq!(missing.attempt, 1);
    s.stop.send_replace(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shell_task_outlives_its_executor_and_is_not_started_twice() {
    let s = setup().await;
    let store = s.store.clone();
    let count = s._dir.path().join("count");
    let command = format!("echo started >> {}; sleep 1", count.display());
    let app = submit(&*store, "f", &[("long", serde_json::json!({ "type": "shell", "command": command }))]).await;
    until("the command runs", async || count.exists()).await;
    // The executor stops (as a daemon that restarts); the command goes on.
    stopped(&s.stop).await;
    let stop = start(store.clone(), s._dir.path(), Arc::new(Probe::default())).await;
    until("the task completes", async || state(&*store, &app, "long").await == TaskState::Completed).await;
    assert_eq!(std::fs::read_to_string(&count).unwrap(), "started\n", "the command ran once");
    stop.send_replace(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shell_task_removed_from_outside_has_its_command_stopped() {
    let s = setup().await;
    let store = &*s.store;
    let app = submit(store, "g", &[("forever", serde_json::json!({ "type": "shell", "command": "sleep 60" }))]).await;
    let pid_file = s._dir.path().join("tasks/g/forever/attempt-1/pid");
    until("the command runs", async || pid_file.exists()).await;
    let pid: i64 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    let alive = |pid: i64| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|stat| stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
    };
    assert!(alive(pid));
    store.remove_task(app.clone(), TaskId::new("forever").unwrap()).await.unwrap();
    until("the command is stopped", async || !alive(pid)).await;
    s.stop.send_replace(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_waiting_for_a_token_does_not_use_up_its_applications_parallelism() {
    let s = setup().await;
    let store = &*s.store;
    // Two at once: one task holds the only seat for good, another waits for it; the three
    // sleeps still run, one at a time, in the second slot.
    let policy = SchedulingPolicy { max_parallelism: Some(2), ..SchedulingPolicy::default() };
    let hold = serde_json::json!({ "type": "probe", "mode": "hold" });
    let nap = serde_json::json!({ "type": "sleep", "seconds": 0.2 });
    let app = submit_with(store, "p", policy, &[("holder", hold.clone()), ("waiter", hold)]).await;
    let phase = async |task: &str| store.run(app.clone(), TaskId::new(task).unwrap()).await.unwrap().map(|r| r.phase);
    until("one holds the seat, the other waits for it", async || {
        let mut both = [phase("holder").await, phase("waiter").await];
        both.sort_by_key(|p| p.map(Phase::name));
        both == [Some(Phase::Running), Some(Phase::WaitingForResources)]
    })
    .await;
    // Then the sleeps (added together, they would race the seat's holder for the slots).
    for task in ["s1", "s2", "s3"] {
        store.add_task(app.clone(), task_spec(task, &nap)).await.unwrap();
    }
    for task in ["s1", "s2", "s3"] {
        until(task, async || state(store, &app, task).await == TaskState::Completed).await;
    }
    let phases = async |task: &str| store.run(app.clone(), TaskId::new(task).unwrap()).await.unwrap().unwrap();
    // The sleeps ran one after another: never two at once beside the seat's holder.
    let mut spans = Vec::new();
    let mut held_back = 0;
    for task in ["s1", "s2", "s3"] {
        let run = phases(task).await;
        let at = |phase: Phase| run.events.iter().find(|e| e.phase == phase).unwrap().at;
        spans.push((at(Phase::Running), at(Phase::Success)));
        held_back += usize::from(run.events.iter().any(|e| e.phase == Phase::NotReady && e.version == 1));
    }
    spans.sort();
    assert!(spans.windows(2).all(|w| w[1].0 >= w[0].1), "one sleep at a time: {spans:?}");
    assert!(held_back >= 1, "a sleep was held back, and its timeline says so");
    store.remove_app(app.clone()).await.unwrap();
    s.stop.send_replace(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_run_before_with_the_same_type_version_and_inputs_reuses_its_outputs() {
    let s = setup().await;
    let store = &*s.store;
    let count = s._dir.path().join("count");
    let command = format!(
        "echo ran >> {}; echo \"{{\\\"n\\\": $(wc -l < {})}}\" > \"$ALLOT_OUTPUTS\"",
        count.display(),
        count.display()
    );
    let task = |inputs: serde_json::Value, extra: serde_json::Value| {
        let mut spec =
            serde_json::json!({ "type": "shell", "command": command, "cache_version": "1", "inputs": inputs });
        spec.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        spec
    };
    let same = serde_json::json!({ "day": "2026-11-23", "rows": [1, 2] });
    // Keys in another order are the same inputs.
    let same_reordered = serde_json::json!({ "rows": [1, 2], "day": "2026-11-23" });
    let runs = [
        ("first", task(same.clone(), serde_json::json!({}))),
        ("again", task(same_reordered, serde_json::json!({}))),
        ("other", task(serde_json::json!({ "day": "2026-11-24" }), serde_json::json!({}))),
        ("nocache", task(same.clone(), serde_json::json!({ "cache": false }))),
        ("newer", task(same, serde_json::json!({ "cache_version": "2" }))),
    ];
    let mut outputs = BTreeMap::new();
    for (i, (name, spec)) in runs.iter().enumerate() {
        // One application each, one after the other.
        let app = submit(store, &format!("c{i}"), &[(name, spec.clone())]).await;
        until(name, async || state(store, &app, name).await == TaskState::Completed).await;
        let run = store.run(app.clone(), TaskId::new(name).unwrap()).await.unwrap().unwrap();
        let reasons: Vec<String> = run.events.iter().map(|e| e.reason.clone()).collect();
        outputs.insert(*name, (run.outputs.clone().unwrap(), reasons));
    }
    assert_eq!(std::fs::read_to_string(&count).unwrap().lines().count(), 4, "every task ran but `again`");
    assert_eq!(outputs["again"].0, outputs["first"].0, "the outputs are reused");
    assert_eq!(outputs["first"].0, r#"{"n":1}"#);
    let hit = outputs["again"].1.iter().any(|r| r.starts_with("cache hit: the outputs of c0/first (key "));
    assert!(hit, "{:?}", outputs["again"].1);
    assert!(outputs["first"].1.iter().any(|r| r.starts_with("cache miss")), "{:?}", outputs["first"].1);
    assert!(!outputs["nocache"].1.iter().any(|r| r.starts_with("cache")), "{:?}", outputs["nocache"].1);
    s.stop.send_replace(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_kept_for_reuse_are_forgotten_after_their_retention() {
    let (dir, store) = new_store().await;
    let clock = ManualClock::new();
    let config = |config: &mut ExecutorConfig| {
        config.clock = Arc::new(clock.clone());
        config.cache_retention = Duration::from_secs(3600);
        // Sweeps often: what the test waits for is the clock it moves.
        config.sweep = Duration::from_millis(10);
    };
    let stop = start_with(
        store.clone(),
        dir.path(),
        Arc::new(Probe::default()),
        PluginCounters::default(),
        &Default::default(),
        config,
    )
    .await;
    let spec = serde_json::json!({
        "type": "shell", "command": "echo '{\"n\": 1}' > \"$ALLOT_OUTPUTS\"", "cache_version": "1", "inputs": { "day": 1 },
    });
    let app = submit(&*store, "kept", &[("t", spec)]).await;
    until("the task completes", async || state(&*store, &app, "t").await == TaskState::Completed).await;
    let run = store.run(app.clone(), TaskId::new("t").unwrap()).await.unwrap().unwrap();
    let key = run.cache.expect("a cacheable task's run says what it looked up").key;
    assert!(store.cached_outputs(&key).await.unwrap().is_some(), "kept");
    clock.advance(Duration::from_secs(3601));
    until("the outputs are forgotten", async || store.cached_outputs(&key).await.unwrap().is_none()).await;
    stop.send_replace(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_sees_the_tasks_metadata_records_events_and_keeps_counters() {
    let (dir, store) = new_store().await;
    let counters = PluginCounters::default();
    let stop = start_counting(store.clone(), dir.path(), Arc::new(Probe::default()), counters.clone()).await;
    let id = AppId::new("m").unwrap();
    let spec = AppSpec {
        id: id.clone(),
        queue: QueuePath::new("root.q").unwrap(),
        user: "ana".into(),
        user_groups: Vec::new(),
        tags: BTreeMap::from([("team".to_owned(), "etl".to_owned())]),
        groups: Vec::new(),
        policy: SchedulingPolicy::default(),
        queue_rule: None,
        priority: Default::default(),
    };
    store.add_app(spec).await.unwrap();
    let task = serde_json::json!({
        "type": "probe", "mode": "observe", "annotations": {"owner": "ana", "tries": 2},
        "overrides": {"timeout": "1h"}, "interruptible": true,
    });
    let task = task_spec("look", &task);
    store.add_task(id.clone(), task).await.unwrap();
    until("observed", async || state(&*store, &id, "look").await == TaskState::Completed).await;
    let run = store.run(id.clone(), TaskId::new("look").unwrap()).await.unwrap().unwrap();
    let seen: serde_json::Value = serde_json::from_str(run.outputs.as_deref().unwrap()).unwrap();
    assert_eq!(
        seen,
        serde_json::json!({
            "queue": "root.q", "user": "ana", "labels": {"team": "etl"},
            "annotations": {"owner": "ana", "tries": "2"}, "overrides": {"timeout": "1h"},
            "interruptible": true, "alloc_set": true,
        })
    );
    assert!(run.events.iter().any(|e| e.reason == "looked around"), "the plugin's event is in the timeline");
    assert_eq!(counters.snapshot(), [(("probe".to_owned(), "loaded".to_owned()), 1)]);
    stop.send_replace(true);
}

/// A daemon that died after storing a Barrier transition, before acting on it: the executor that
/// comes back takes the recorded transition for that round instead of calling the plugin again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_barrier_round_is_replayed_from_the_store_after_a_crash_not_run_twice() {
    let (dir, store) = new_store().await;
    // The dead daemon's executor ran the pool (its lease has not lapsed yet).
    let local = [PoolName::new("local").unwrap()];
    store.renew_executor("http://dead-daemon", &local, &["probe".to_owned()], Duration::from_secs(60)).await.unwrap();
    let app = submit(&*store, "r", &[("launch", serde_json::json!({ "type": "probe" }))]).await;
    until("placed", async || state(&*store, &app, "launch").await == TaskState::Allocated).await;
    // What the dead daemon left: round 0's Barrier recorded, not acted on.
    let mut run = allot_core::runs::Run::new(0);
    run.record_barrier(&Transition::barrier(PhaseInfo::running(1, "launched the job")));
    store.put_run(app.clone(), TaskId::new("launch").unwrap(), run).await.unwrap();
    let probe = Arc::new(Probe::default());
    let stop = start(store.clone(), dir.path(), probe.clone()).await;
    until("completed", async || state(&*store, &app, "launch").await == TaskState::Completed).await;
    assert_eq!(probe.handled.load(Ordering::SeqCst), 1, "the replayed round did not call the plugin");
    let run = store.run(app.clone(), TaskId::new("launch").unwrap()).await.unwrap().unwrap();
    let timeline: Vec<(Phase, u32, &str)> =
        run.events.iter().map(|e| (e.phase, e.version, e.reason.as_str())).collect();
    assert_eq!(
        timeline,
        [
            (Phase::NotReady, 0, "placed; starting"),
            (Phase::Running, 1, "launched the job"),
            (Phase::Success, 0, "done")
        ]
    );
    stop.send_replace(true);
}

/// The application file's user story: an application removed, then submitted again under the
/// same id, runs its tasks afresh: the runs went with it, and nothing of the first is adopted,
/// not even the shell command's files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_removed_and_added_again_under_its_id_runs_afresh() {
    let s = setup().await;
    let store = &*s.store;
    let count = s._dir.path().join("count");
    let command = format!("echo ran >> {}", count.display());
    let spec = serde_json::json!({ "type": "shell", "command": command });
    let app = submit(store, "again", &[("greet", spec.clone())]).await;
    until("the first completes", async || state(store, &app, "greet").await == TaskState::Completed).await;
    let greet = TaskId::new("greet").unwrap();
    let first = store.run(app.clone(), greet.clone()).await.unwrap().unwrap();
    assert!(s._dir.path().join("tasks/again/greet/attempt-1/started").exists());
    store.remove_app(app.clone()).await.unwrap();
    assert_eq!(store.run(app.clone(), greet.clone()).await.unwrap(), None, "the run went with its application");
    let removed_at = now_ms();
    let app = submit(store, "again", &[("greet", spec)]).await;
    until("the second completes", async || state(store, &app, "greet").await == TaskState::Completed).await;
    assert_eq!(std::fs::read_to_string(&count).unwrap(), "ran\nran\n", "the command ran again");
    let second = store.run(app.clone(), greet).await.unwrap().unwrap();
    assert_eq!(second.attempt, 1);
    assert!(second.events.iter().all(|e| e.at >= removed_at), "every event is new: {:?}", second.events);
    assert_ne!(second.task_seq, first.task_seq, "the run of another task");
    s.stop.send_replace(true);
}

/// The directory of a task whose run went (its task removed) goes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_directories_of_removed_tasks_are_swept() {
    let (dir, store) = new_store().await;
    let fast_sweep = |config: &mut ExecutorConfig| config.sweep = Duration::from_millis(100);
    let probe = Arc::new(Probe::default());
    let stop =
        start_with(store.clone(), dir.path(), probe, PluginCounters::default(), &Default::default(), fast_sweep).await;
    let spec = serde_json::json!({ "type": "shell", "command": "true" });
    let app = submit(&*store, "swept", &[("t", spec.clone()), ("kept", spec)]).await;
    for task in ["t", "kept"] {
        until(task, async || state(&*store, &app, task).await == TaskState::Completed).await;
    }
    let tasks = dir.path().join("tasks/swept");
    store.remove_task(app.clone(), TaskId::new("t").unwrap()).await.unwrap();
    until("the removed task's directory goes", async || !tasks.join("t").exists()).await;
    // The sweeper counts no passes to wait on: three more of them (every 100 ms) pass by `kept`.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(tasks.join("kept/attempt-1/stdout.log").exists(), "a task still there keeps its directory");
    store.remove_app(app).await.unwrap();
    until("the application's directory goes", async || !tasks.exists()).await;
    stop.send_replace(true);
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// A run that has not ended when its task goes is stopped by its executor (abort, finalize, its
/// tokens released), then removed; a task added again meanwhile under the same id starts its own
/// run, and the first one's command is stopped, not adopted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_task_removed_and_added_again_is_stopped_and_runs_afresh() {
    let s = setup().await;
    let store = &*s.store;
    let spec = serde_json::json!({ "type": "shell", "command": "sleep 60" });
    let app = submit(store, "twice", &[("forever", spec.clone())]).await;
    let pid_file = s._dir.path().join("tasks/twice/forever/attempt-1/pid");
    // Written by the command's wrapper as it starts.
    let read_pid = || std::fs::read_to_string(&pid_file).ok().and_then(|text| text.trim().parse::<i64>().ok());
    until("the command runs", async || read_pid().is_some()).await;
    let first = read_pid().unwrap();
    let alive = |pid: i64| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|stat| stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
    };
    store.remove_app(app.clone()).await.unwrap();
    // Its executor stops it (the command first, the run ended, then removed): read at any point
    // of that, the run is there or gone (a busy machine lets the executor end it before a read
    // here, so its state says nothing); what shows the stop is that its command is stopped
    // (below), which a run removed with its task and no executor to stop it would not be.
    let app = submit(store, "twice", &[("forever", spec)]).await;
    until("the first command is stopped", async || !alive(first)).await;
    until("the new task's command runs", async || read_pid().is_some_and(|pid| pid != first)).await;
    // The command writes its pid as it starts, before its executor records the run as Running.
    let running = async || {
        store
            .run(app.clone(), TaskId::new("forever").unwrap())
            .await
            .unwrap()
            .is_some_and(|r| r.phase == Phase::Running)
    };
    until("the new run is Running", running).await;
    let run = store.run(app.clone(), TaskId::new("forever").unwrap()).await.unwrap().unwrap();
    assert_eq!((run.attempt, run.user_failures, run.system_failures), (1, 0, 0), "{:?}", run.events);
    // Removed for good: stopped, then the run goes.
    store.remove_app(app.clone()).await.unwrap();
    until("the run goes once stopped", async || {
        store.run(app.clone(), TaskId::new("forever").unwrap()).await.unwrap().is_none()
    })
    .await;
    s.stop.send_replace(true);
}

/// A run left by a daemon that stopped between its task's removal and the run's end: the
/// executor that starts on its pool releases what it held and removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_task_went_while_no_executor_ran_is_cleaned_up_at_start() {
    let (dir, store) = new_store().await;
    let seats = allot_core::NamespaceName::new("probe:seats").unwrap();
    store.put_namespace(seats.clone(), 1).await.unwrap();
    let token = allot_core::Token::new("gone:t:1").unwrap();
    let request = allot_core::AllocateRequest {
        namespace: seats.clone(),
        token: token.clone(),
        units: 1,
        scope: None,
        constraints: Default::default(),
        lease: allot_core::LeaseRequest::None,
    };
    store.allocate(request, Duration::ZERO).await.unwrap();
    let mut run = allot_core::runs::Run::new(0);
    run.alloc = Some("local/00000000000000a1".to_owned());
    run.took(allot_core::runs::TakenToken { namespace: seats.clone(), token });
    let (app, task) = (AppId::new("gone").unwrap(), TaskId::new("t").unwrap());
    store.put_run(app.clone(), task.clone(), run).await.unwrap();
    // And one of another daemon's pool: not this executor's to clean.
    let mut elsewhere = allot_core::runs::Run::new(0);
    elsewhere.alloc = Some("other/00000000000000a2".to_owned());
    store.put_run(app.clone(), TaskId::new("there").unwrap(), elsewhere).await.unwrap();
    let stop = start(store.clone(), dir.path(), Arc::new(Probe::default())).await;
    until("the run is removed", async || store.run(app.clone(), task.clone()).await.unwrap().is_none()).await;
    assert_eq!(store.namespace(seats).await.unwrap().granted_units, 0, "its token is released");
    assert!(store.run(app.clone(), TaskId::new("there").unwrap()).await.unwrap().is_some());
    stop.send_replace(true);
}

/// `retries` in a task's spec is its own budget of user failures [Flyte's `retries`]; without
/// it, the daemon's default; system failures have the daemon's budget; a permanent failure is
/// never retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_retries_are_its_own_and_a_permanent_failure_is_never_retried() {
    let (dir, store) = new_store().await;
    let probe = Arc::new(Probe::default());
    // No user retries by default, two after system failures.
    let budgets = |config: &mut ExecutorConfig| config.retry = RetryPolicy::new(0, 2);
    let stop =
        start_with(store.clone(), dir.path(), probe, PluginCounters::default(), &Default::default(), budgets).await;
    let shell = |command: &str, retries: Option<u32>| {
        let mut spec = serde_json::json!({ "type": "shell", "command": command });
        if let Some(retries) = retries {
            spec["retries"] = retries.into();
        }
        spec
    };
    let app = submit(
        &*store,
        "retries",
        &[
            ("three", shell("exit 3", Some(3))),
            ("default", shell("exit 3", None)),
            ("permanent", shell("exit 127", Some(3))),
            ("system", serde_json::json!({ "type": "probe", "mode": "system_fail", "retries": 5 })),
        ],
    )
    .await;
    for task in ["three", "default", "permanent", "system"] {
        until(task, async || state(&*store, &app, task).await == TaskState::Failed).await;
    }
    let run = async |task: &str| store.run(app.clone(), TaskId::new(task).unwrap()).await.unwrap().unwrap();
    let attempts = async |task: &str| {
        let run = run(task).await;
        (run.attempt, run.user_failures, run.system_failures)
    };
    assert_eq!(attempts("three").await, (4, 4, 0), "retries: 3 is four attempts");
    assert_eq!(attempts("default").await, (1, 1, 0), "the daemon's default: no retry");
    assert_eq!(attempts("permanent").await, (1, 0, 0), "a permanent failure is not retried");
    assert_eq!(attempts("system").await, (3, 0, 3), "the system budget is the daemon's, not `retries`");
    let three = run("three").await;
    let ends: Vec<(u32, Phase)> =
        three.events.iter().filter(|e| e.phase.ends_attempt()).map(|e| (e.attempt, e.phase)).collect();
    let each = (1..=4).map(|a| (a, Phase::RetryableFailure)).collect::<Vec<_>>();
    assert_eq!(ends, each, "the timeline shows each attempt");
    stop.send_replace(true);
}

/// The output cache never hands a task another task's outputs: its key covers the whole spec
/// (the command and its environment), not only the type, version and inputs; the executor's
/// own settings (`retries`) are not part of it. The run says what was looked up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_that_do_different_things_never_share_cached_outputs() {
    let s = setup().await;
    let store = &*s.store;
    let shell = |command: &str, extra: serde_json::Value| {
        let mut spec = serde_json::json!({ "type": "shell", "command": command, "cache_version": "1" });
        spec.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        spec
    };
    let write = |text: &str| format!("echo '{{\"said\": \"{text}\"}}' > \"$ALLOT_OUTPUTS\"");
    let env_write = "echo \"{\\\"said\\\": \\\"$WORD\\\"}\" > \"$ALLOT_OUTPUTS\"";
    let tasks = [
        ("hello", shell(&write("hello"), serde_json::json!({}))),
        ("bye", shell(&write("bye"), serde_json::json!({}))),
        ("env-a", shell(env_write, serde_json::json!({ "env": { "WORD": "a" } }))),
        ("env-b", shell(env_write, serde_json::json!({ "env": { "WORD": "b" } }))),
        ("hello-again", shell(&write("hello"), serde_json::json!({ "retries": 2 }))),
    ];
    let mut runs = BTreeMap::new();
    for (i, (name, spec)) in tasks.iter().enumerate() {
        let app = submit(store, &format!("k{i}"), &[(name, spec.clone())]).await;
        until(name, async || state(store, &app, name).await == TaskState::Completed).await;
        runs.insert(*name, store.run(app.clone(), TaskId::new(name).unwrap()).await.unwrap().unwrap());
    }
    let said = |name: &str| {
        let outputs: serde_json::Value = serde_json::from_str(runs[name].outputs.as_deref().unwrap()).unwrap();
        outputs["said"].as_str().unwrap().to_owned()
    };
    assert_eq!([said("hello"), said("bye"), said("env-a"), said("env-b")], ["hello", "bye", "a", "b"]);
    let cache = |name: &str| runs[name].cache.clone().expect("looked up");
    for name in ["hello", "bye", "env-a", "env-b"] {
        assert_eq!(cache(name).hit, None, "{name} ran");
    }
    assert_eq!(cache("hello-again").hit.as_deref(), Some("k0/hello"), "the same command: the outputs reused");
    assert_eq!(said("hello-again"), "hello");
    assert_eq!(cache("hello-again").key, cache("hello").key);
    assert_ne!(cache("bye").spec_digest, cache("hello").spec_digest);
    assert_eq!(cache("bye").inputs_digest, cache("hello").inputs_digest, "no inputs either way");
    assert_ne!(cache("env-a").key, cache("env-b").key);
    let parts = cache("hello");
    assert_eq!(
        (parts.task_type.as_str(), parts.plugin.as_str(), parts.cache_version.as_str()),
        ("shell", "shell", "1")
    );
    s.stop.send_replace(true);
}

/// The tokens a plugin takes are held by the task's scope, from its application's `project`
/// and `domain` tags, and a cap the plugin passes refuses a project over it
/// (`NamespaceQuotaExceeded`) while other projects, and tasks of no project, go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugins_tokens_carry_the_tasks_scope_and_its_caps() {
    let s = setup().await;
    let store = &*s.store;
    let tagged = async |app: &str, tags: &[(&str, &str)]| {
        let id = AppId::new(app).unwrap();
        let spec = AppSpec {
            id: id.clone(),
            queue: QueuePath::new("root.q").unwrap(),
            user: "u".into(),
            user_groups: Vec::new(),
            tags: tags.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            groups: Vec::new(),
            policy: SchedulingPolicy::default(),
            queue_rule: None,
            priority: Default::default(),
        };
        store.add_app(spec).await.unwrap();
        let task = task_spec("desk", &serde_json::json!({ "type": "probe", "mode": "capped" }));
        store.add_task(id.clone(), task).await.unwrap();
        id
    };
    let phase =
        async |app: &AppId| store.run(app.clone(), TaskId::new("desk").unwrap()).await.unwrap().map(|r| r.phase);
    let first = tagged("alpha-1", &[("project", "alpha"), ("domain", "dev")]).await;
    until("alpha's first holds a desk", async || phase(&first).await == Some(Phase::Running)).await;
    let second = tagged("alpha-2", &[("project", "alpha")]).await;
    let beta = tagged("beta-1", &[("project", "beta"), ("domain", "prod")]).await;
    let none = tagged("untagged", &[]).await;
    for app in [&beta, &none] {
        until("another project, or none, holds a desk", async || phase(app).await == Some(Phase::Running)).await;
    }
    until("alpha's second waits for its project's cap", async || {
        phase(&second).await == Some(Phase::WaitingForResources)
    })
    .await;
    let run = store.run(second.clone(), TaskId::new("desk").unwrap()).await.unwrap().unwrap();
    let why = &run.events.iter().find(|e| e.phase == Phase::WaitingForResources).unwrap().reason;
    assert_eq!(why, "waiting for a token of `probe:desks`: its project holds 1 of its cap of 1");
    let desks = allot_core::NamespaceName::new("probe:desks").unwrap();
    let grants = allot_store::read_all(|page| store.grants(desks.clone(), page)).await.unwrap();
    let mut scopes: Vec<Option<(String, String)>> = grants
        .iter()
        .map(|g| g.grant.scope.as_ref().map(|s| (s.project.to_string(), s.namespace.to_string())))
        .collect();
    scopes.sort();
    let scope = |p: &str, n: &str| Some((p.to_owned(), n.to_owned()));
    assert_eq!(scopes, [None, scope("alpha", "dev"), scope("beta", "prod")]);
    // They are allot's own: no client ends one while its run holds it.
    let held = grants.iter().find(|g| g.grant.token.as_str() == "@beta-1:desk:1").expect("beta's run's token");
    let released = store.release(desks.clone(), held.grant.token.clone(), None).await;
    assert!(
        matches!(released, Err(allot_store::StoreError::Quotas(allot_core::LedgerError::HeldByScheduler { .. }))),
        "{released:?}"
    );
    // The project's desk freed, its second task takes one, in the project's default domain.
    store.remove_app(first).await.unwrap();
    until("alpha's second holds a desk", async || phase(&second).await == Some(Phase::Running)).await;
    let grants = allot_store::read_all(|page| store.grants(desks.clone(), page)).await.unwrap();
    let alpha = grants.iter().find(|g| g.grant.scope.as_ref().is_some_and(|s| &*s.project == "alpha")).unwrap();
    assert_eq!(alpha.grant.scope.as_ref().map(|s| s.namespace.to_string()).as_deref(), Some("default"));
    s.stop.send_replace(true);
}

/// A victim whose attempt did not end within its preemption's grace (its round was busy) has its
/// placement taken back by the scheduler alone; its executor then ends the attempt as preempted
/// (aborted and finalized), and the run counts it once, as a system failure, not as a placement
/// lost. The task runs again once the room is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_victim_whose_grace_ran_out_ends_its_attempt_as_preempted() {
    use allot_core::apps::queues::QueueLimits;
    use allot_core::apps::SchedConfig;
    use allot_store::{AppStore as _, PoolStore as _};

    let dir = tempfile::tempdir().unwrap();
    let sched = SchedConfig { preemption_grace_ms: 0, ..SchedConfig::default() };
    let store = new_store_in(&dir, |config| config.with_sched(sched)).await;
    store.put_pool(PoolName::new("local").unwrap(), "cpu=1".parse().unwrap()).await.unwrap();
    let gold =
        QueueLimits { guaranteed: "cpu=1".parse().unwrap(), preemption_delay_ms: Some(0), ..QueueLimits::default() };
    store.put_queue(QueuePath::new("root.gold").unwrap(), gold).await.unwrap();
    let s = started(dir, store.clone()).await;
    let store = &*s.store;
    let batch = submit(store, "batch", &[("v", serde_json::json!({ "type": "probe", "mode": "stall" }))]).await;
    until("the victim's first round began", async || s.probe.handled.load(Ordering::SeqCst) >= 1).await;

    let probe = serde_json::json!({ "type": "probe" });
    let gold = submit_in(store, "gold", "root.gold", Default::default(), &[("g", probe)]).await;
    // The victim's round still runs: the grace (none) ends first, and the scheduler takes its
    // room back for gold's task, which runs and completes.
    until("gold's task completed", async || state(store, &gold, "g").await == TaskState::Completed).await;
    assert_eq!(s.probe.aborted.load(Ordering::SeqCst), 0, "the victim's attempt was not ended yet");

    s.probe.gate.notify_one();
    let victim = TaskId::new("v").unwrap();
    let run = async || store.run(batch.clone(), victim.clone()).await.unwrap().unwrap();
    until("the victim's attempt ended as preempted and it runs again", async || {
        let run = run().await;
        run.attempt == 2 && run.phase == Phase::Running
    })
    .await;
    let run = run().await;
    let codes: Vec<&str> = run.events.iter().filter_map(|e| e.error.as_ref().map(|err| err.code.as_str())).collect();
    assert_eq!(codes, ["preempted"], "{:?}", run.events);
    assert_eq!((run.system_failures, run.user_failures), (1, 0));
    assert_eq!(s.probe.aborted.load(Ordering::SeqCst), 1);
    until("the first attempt finalized", async || s.probe.finalized.load(Ordering::SeqCst) >= 1).await;
    let task = store.task(batch.clone(), victim.clone()).await.unwrap();
    assert_eq!(task.task.preemptions, 1, "{task:?}");
    s.stop.send_replace(true);
}
