//! The conformance of the runs part: a run is kept whole (state, events, barrier, stage, tokens,
//! outputs, cache lookup, task number), replaced, listed in order and removed; the runs that
//! ended go with their task or application, those that have not stay for their executor.

use std::sync::Arc;

use allot_core::apps::queues::{QueueLimits, QueuePath};
use allot_core::apps::{AppId, AppSpec, SchedulingPolicy, TaskId, TaskSpec};
use allot_core::runs::{
    CacheLookup, ExecError, PhaseInfo, PluginState, RetryPolicy, Run, StateWrite, TakenToken, Transition,
};
use allot_core::{Millis, NamespaceName, Token};

use super::Time;
use crate::Store;

/// A run with something in every field.
pub fn sample_run() -> Run {
    let mut run = Run::new(1_000);
    let put = StateWrite::Put(PluginState { version: 3, bytes: vec![0, 1, 2, 255] });
    let queued = PhaseInfo::queued("created")
        .occurred_at(1_000)
        .with_custom_info(serde_json::json!({"job": "j-1", "link": "https://jobs.example/j-1"}));
    run.after_round(Ok((Transition::ephemeral(queued), put)), RetryPolicy::default(), 1_001);
    let launched = PhaseInfo::running(2, "launched").occurred_at(1_001).with_custom_info(serde_json::json!({"n": 1}));
    run.record_barrier(&Transition::barrier(launched));
    run.took(TakenToken { namespace: NamespaceName::new("web:api").unwrap(), token: Token::new("a:t:1").unwrap() });
    let error = ExecError::user("exit_2", "exit status 2");
    let failure = Transition::ephemeral(PhaseInfo::retryable(error));
    run.after_round(Ok((failure, StateWrite::Unchanged)), RetryPolicy { user_attempts: 3, system_retries: 0 }, 1_002);
    run.outputs = Some(r#"{"rows":3}"#.to_owned());
    run.alloc = Some("worker-1/00000000000000a1".to_owned());
    run.task_seq = Some(42);
    run.cache = Some(CacheLookup {
        key: "k".repeat(64),
        task_type: "shell".to_owned(),
        plugin: "shell".to_owned(),
        cache_version: "1".to_owned(),
        spec_digest: "s".repeat(64),
        inputs_digest: "i".repeat(64),
        hit: Some("other/task".to_owned()),
    });
    run
}

/// `run` as a version before events had details keeps it: without when they occurred and their
/// custom information.
pub fn without_details(mut run: Run) -> Run {
    for event in &mut run.events {
        (event.occurred_at, event.custom_info) = (None, None);
    }
    if let Some((_, transition)) = run.barrier.as_mut() {
        (transition.info.occurred_at, transition.info.custom_info) = (None, None);
    }
    run
}

/// A run that ended (succeeded after one round).
fn ended_run() -> Run {
    let mut run = Run::new(1);
    let policy = RetryPolicy::default();
    run.after_round(Ok((Transition::ephemeral(PhaseInfo::success("done")), StateWrite::Unchanged)), policy, 2);
    run.attempt_finalized(3);
    assert!(run.ended());
    run
}

/// The runs that ended go with their task, and with their application (removed, or dropped after
/// its retention: the same change); one that has not ended stays for its executor, which stops
/// it and then removes it.
async fn runs_go_with_their_task(store: &dyn Store) {
    let queue = QueuePath::new("root.conformance-runs").unwrap();
    store.put_queue(queue.clone(), QueueLimits::default()).await.unwrap();
    let app = AppId::new("conformance-runs-go").unwrap();
    let spec = AppSpec {
        id: app.clone(),
        queue,
        user: "conformance".into(),
        user_groups: Vec::new(),
        tags: Default::default(),
        groups: Vec::new(),
        policy: SchedulingPolicy::default(),
        queue_rule: None,
        priority: Default::default(),
    };
    store.add_app(spec).await.unwrap();
    let tasks = ["ended", "ended-too", "running"].map(|t| TaskId::new(t).unwrap());
    for task in &tasks {
        let spec = TaskSpec {
            preemptable: true,
            id: task.clone(),
            resources: "cpu=1".parse().unwrap(),
            tokens: Vec::new(),
            group: None,
            priority: Default::default(),
            // Placed nowhere: no pool has this label.
            selector: [("conformance".to_owned(), "nowhere".to_owned())].into(),
            spec: String::new(),
        };
        store.add_task(app.clone(), spec).await.unwrap();
    }
    let [ended, ended_too, running] = tasks;
    store.put_run(app.clone(), ended.clone(), ended_run()).await.unwrap();
    store.put_run(app.clone(), ended_too.clone(), ended_run()).await.unwrap();
    store.put_run(app.clone(), running.clone(), Run::new(1)).await.unwrap();
    store.remove_task(app.clone(), ended.clone()).await.unwrap();
    assert_eq!(store.run(app.clone(), ended).await.unwrap(), None, "an ended run goes with its task");
    assert!(store.run(app.clone(), ended_too.clone()).await.unwrap().is_some(), "the others stay");
    store.remove_app(app.clone()).await.unwrap();
    assert_eq!(store.run(app.clone(), ended_too).await.unwrap(), None, "and with its application");
    let kept = store.run(app.clone(), running.clone()).await.unwrap();
    assert_eq!(kept, Some(Run::new(1)), "a run that has not ended stays for its executor");
    store.remove_run(app.clone(), running.clone()).await.unwrap();
    assert_eq!(store.run(app, running).await.unwrap(), None);
}

pub async fn run_runs(store: Arc<dyn Store>, time: &dyn Time) {
    let store = &*store;
    runs_go_with_their_task(store).await;
    let (app, other) = (AppId::new("conformance-runs").unwrap(), AppId::new("conformance-runs-2").unwrap());
    let (t1, t2) = (TaskId::new("t1").unwrap(), TaskId::new("t2").unwrap());
    assert_eq!(store.run(app.clone(), t1.clone()).await.unwrap(), None);
    let run = sample_run();
    store.put_run(app.clone(), t1.clone(), run.clone()).await.unwrap();
    assert_eq!(store.run(app.clone(), t1.clone()).await.unwrap(), Some(run.clone()), "kept whole");
    let mut next = run.clone();
    next.attempt_finalized(1_003);
    store.put_run(app.clone(), t1.clone(), next.clone()).await.unwrap();
    assert_eq!(store.run(app.clone(), t1.clone()).await.unwrap(), Some(next.clone()), "replaced");
    store.put_run(other.clone(), t1.clone(), Run::new(5)).await.unwrap();
    store.put_run(app.clone(), t2.clone(), Run::new(6)).await.unwrap();
    let listed: Vec<(AppId, TaskId)> = store
        .runs()
        .await
        .unwrap()
        .into_iter()
        .filter(|(a, ..)| a.as_str().starts_with("conformance-runs"))
        .map(|(a, t, _)| (a, t))
        .collect();
    assert_eq!(listed, [(app.clone(), t1.clone()), (app.clone(), t2.clone()), (other.clone(), t1.clone())]);
    store.remove_run(app.clone(), t1.clone()).await.unwrap();
    store.remove_run(app.clone(), t1.clone()).await.unwrap();
    assert_eq!(store.run(app.clone(), t1).await.unwrap(), None);
    store.remove_run(app.clone(), t2.clone()).await.unwrap();
    store.remove_run(other, TaskId::new("t1").unwrap()).await.unwrap();
    // The catalog: outputs kept under a key, the first kept stays.
    let key = format!("conformance-{}", std::process::id());
    assert_eq!(store.cached_outputs(&key).await.unwrap(), None);
    let first = crate::CachedOutputs { outputs: r#"{"n":1}"#.into(), app: app.clone(), task: t2.clone(), at: 7 };
    store.put_cached_outputs(key.clone(), first.clone()).await.unwrap();
    let later = crate::CachedOutputs {
        outputs: r#"{"n":2}"#.into(),
        app: app.clone(),
        task: TaskId::new("t1").unwrap(),
        at: 9,
    };
    store.put_cached_outputs(key.clone(), later.clone()).await.unwrap();
    assert_eq!(store.cached_outputs(&key).await.unwrap(), Some(first.clone()), "the first kept stays");
    // A plugin's put answers what is kept, and whether it is its own.
    assert_eq!(crate::keep_first(store, &key, later).await.unwrap(), (first.clone(), false));
    let own = format!("{key}-own");
    assert_eq!(crate::keep_first(store, &own, first.clone()).await.unwrap(), (first.clone(), true));
    assert_eq!(store.forget_cached_outputs(8, 10).await.unwrap(), 2, "both kept at 7");
    store.put_cached_outputs(key.clone(), first.clone()).await.unwrap();
    // Retention: the outputs kept before a time go, the oldest first, at most as many as asked.
    let kept_at = |at: Millis| crate::CachedOutputs { outputs: "{}".into(), app: app.clone(), task: t2.clone(), at };
    let keys: Vec<String> = (1..=3).map(|i| format!("{key}-{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        store.put_cached_outputs(key.clone(), kept_at(10 + 10 * i as Millis)).await.unwrap();
    }
    // Kept at 7 (`first`), 10, 20 and 30: before 25, three; one by one.
    assert_eq!(store.forget_cached_outputs(25, 1).await.unwrap(), 1);
    assert_eq!(store.cached_outputs(&key).await.unwrap(), None, "the oldest went first");
    assert!(store.cached_outputs(&keys[0]).await.unwrap().is_some());
    assert_eq!(store.forget_cached_outputs(25, 10).await.unwrap(), 2);
    assert_eq!(store.forget_cached_outputs(25, 10).await.unwrap(), 0, "nothing more is due");
    assert_eq!(store.cached_outputs(&keys[1]).await.unwrap(), None);
    assert_eq!(store.cached_outputs(&keys[2]).await.unwrap(), Some(kept_at(30)), "not due yet");
    // A key forgotten may be kept again.
    store.put_cached_outputs(keys[0].clone(), kept_at(40)).await.unwrap();
    assert_eq!(store.cached_outputs(&keys[0]).await.unwrap(), Some(kept_at(40)));
    assert_eq!(store.forget_cached_outputs(41, 10).await.unwrap(), 2);
    // Executors' leases: live while renewed, kept (not live) after, with their pools and the
    // task types they run.
    let pools = [allot_core::pools::PoolName::new("conformance-w1").unwrap()];
    let types = ["shell".to_owned(), "*".to_owned()];
    let node = "http://conformance-node";
    store.renew_executor(node, &pools, &types, std::time::Duration::from_millis(300)).await.unwrap();
    let lease = |leases: Vec<crate::ExecutorLease>| leases.into_iter().find(|l| l.node == node).unwrap();
    let live = lease(store.executors().await.unwrap());
    assert_eq!(
        (live.live, live.pools.as_slice(), live.task_types.as_slice()),
        (true, pools.as_slice(), types.as_slice())
    );
    time.advance(std::time::Duration::from_millis(450)).await;
    assert!(!lease(store.executors().await.unwrap()).live, "lapsed");
    store.renew_executor(node, &pools, &types[..1], std::time::Duration::from_secs(5)).await.unwrap();
    let renewed = lease(store.executors().await.unwrap());
    assert!(renewed.live, "renewed");
    assert_eq!(renewed.task_types, ["shell"]);
}
