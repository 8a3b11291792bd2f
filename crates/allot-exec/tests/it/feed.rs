//! The executor on the store's change feed: a task placed on its pool runs as soon as the change
//! comes, and a removed task or application stops as soon, with the periodic list and a run's
//! pause both a minute away; a feed cut under it (its watcher fell behind) is listed again and
//! no task is lost; on a store without a feed it lists the tasks placed here periodically.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use allot_core::apps::queues::QueuePath;
use allot_core::apps::states::TaskState;
use allot_core::apps::{AppId, AppSpec, TaskId};
use allot_core::pools::PoolName;
use allot_exec::{ExecutorConfig, PluginCounters};
use allot_store::{Store, WatchConfig};
use serde_json::json;

use crate::support::*;

/// Far longer than any wait of these tests (10 s at most): nothing they see comes from a
/// periodic list or from a run's pause.
const LONG: Duration = Duration::from_secs(60);

fn slow(config: &mut ExecutorConfig) {
    config.scan = LONG;
    config.scan_without_feed = LONG;
    config.pause = LONG;
}

fn app_spec(id: &str) -> AppSpec {
    AppSpec {
        id: AppId::new(id).unwrap(),
        queue: QueuePath::new("root.q").unwrap(),
        user: "u".into(),
        user_groups: Vec::new(),
        tags: Default::default(),
        groups: Vec::new(),
        policy: Default::default(),
        queue_rule: None,
        priority: Default::default(),
    }
}

async fn allocs(store: &dyn Store) -> u64 {
    store.pool(PoolName::new("local").unwrap()).await.unwrap().allocs as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_placed_here_run_and_removed_ones_stop_as_their_changes_come() {
    let (dir, store) = new_store().await;
    let probe = Arc::new(Probe::default());
    let (stop, executor) =
        launch(store.clone(), dir.path(), probe.clone(), PluginCounters::default(), &Default::default(), slow).await;
    until("the executor follows the feed", async || executor.stats().counts().following_feed).await;
    let store = &*store;
    let app = submit(
        store,
        "fed",
        &[
            ("quick", json!({ "type": "noop" })),
            ("nap", json!({ "type": "sleep", "seconds": 0.2 })),
            ("held", json!({ "type": "probe", "mode": "hold" })),
        ],
    )
    .await;
    for task in ["quick", "nap"] {
        until(task, async || state(store, &app, task).await == TaskState::Completed).await;
    }
    until("held runs", async || state(store, &app, "held").await == TaskState::Running).await;
    // Removed: its run, which waits for a minute, is woken by the change, aborted and finalized.
    let held = TaskId::new("held").unwrap();
    store.remove_task(app.clone(), held.clone()).await.unwrap();
    until("held is stopped", async || {
        probe.aborted.load(Ordering::SeqCst) == 1 && store.run(app.clone(), held.clone()).await.unwrap().is_none()
    })
    .await;
    assert_eq!(probe.finalized.load(Ordering::SeqCst), 1);
    // An application removed with a task that sleeps for ten minutes: its run stops as soon.
    let other = submit(store, "sleepy", &[("long", json!({ "type": "sleep", "seconds": 600 }))]).await;
    until("long runs", async || state(store, &other, "long").await == TaskState::Running).await;
    store.remove_app(other.clone()).await.unwrap();
    until("long is stopped", async || {
        executor.active() == 0 && store.run(other.clone(), TaskId::new("long").unwrap()).await.unwrap().is_none()
    })
    .await;
    assert_eq!(allocs(store).await, 0, "every alloc freed");
    let counts = executor.stats().counts();
    assert_eq!((counts.lists, counts.feed_cuts), (1, 0), "found by the feed, not by a list: {counts:?}");
    stop.send_replace(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_feed_cut_under_the_executor_is_listed_again_and_no_task_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    // A watcher (the executor's inside the daemon too) may lag by one event: the executor's is
    // cut whenever a commit brings it two. And the feed keeps one event: it cannot resume from
    // the events kept, so it lists (one that can resume does: `executor_tests`).
    let tiny = WatchConfig { buffer: 1, inside_buffer: 1, retain_events: 1, ..WatchConfig::default() };
    let store: Arc<dyn Store> = new_store_in(&dir, |config| config.with_watch(tiny)).await;
    let probe = Arc::new(Probe::default());
    let (stop, executor) =
        launch(store.clone(), dir.path(), probe, PluginCounters::default(), &Default::default(), slow).await;
    until("the executor follows the feed", async || executor.stats().counts().following_feed).await;
    // Applications of ten tasks (room for eight at a time), until the feed has been cut.
    let mut apps = Vec::new();
    for round in 0..20 {
        let id = format!("cut-{round}");
        let tasks = (0..10).map(|i| task_spec(&format!("t{i}"), &json!({ "type": "noop" }))).collect();
        store.submit_app(app_spec(&id), tasks).await.unwrap();
        apps.push(AppId::new(&id).unwrap());
        let app = apps.last().unwrap();
        until(&format!("{id} ran, or the feed was cut"), async || {
            let mut done = true;
            for i in 0..10 {
                done &= state(&*store, app, &format!("t{i}")).await == TaskState::Completed;
            }
            done || executor.stats().counts().feed_cuts > 0
        })
        .await;
        if executor.stats().counts().feed_cuts > 0 {
            break;
        }
    }
    assert!(executor.stats().counts().feed_cuts > 0, "the feed was cut: {:?}", executor.stats().counts());
    for app in &apps {
        for i in 0..10 {
            let task = format!("t{i}");
            until(&format!("{app}/{task}"), async || state(&*store, app, &task).await == TaskState::Completed).await;
        }
    }
    until("listed again after a cut", async || executor.stats().counts().lists > 1).await;
    until("following the feed again", async || executor.stats().counts().following_feed).await;
    assert_eq!(allocs(&*store).await, 0, "every alloc freed");
    stop.send_replace(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_store_without_a_feed_the_executor_lists_the_tasks_placed_here_periodically() {
    let dir = tempfile::tempdir().unwrap();
    let embedded = new_store_in(&dir, |config| config).await;
    embedded.refuse_watches();
    let store: Arc<dyn Store> = embedded;
    let probe = Arc::new(Probe::default());
    let (stop, executor) =
        launch(store.clone(), dir.path(), probe.clone(), PluginCounters::default(), &Default::default(), |_| {}).await;
    let store = &*store;
    let app = submit(
        store,
        "unfed",
        &[("quick", json!({ "type": "noop" })), ("held", json!({ "type": "probe", "mode": "hold" }))],
    )
    .await;
    until("quick completes", async || state(store, &app, "quick").await == TaskState::Completed).await;
    until("held runs", async || state(store, &app, "held").await == TaskState::Running).await;
    let held = TaskId::new("held").unwrap();
    store.remove_task(app.clone(), held.clone()).await.unwrap();
    until("held is stopped", async || {
        probe.aborted.load(Ordering::SeqCst) == 1 && store.run(app.clone(), held.clone()).await.unwrap().is_none()
    })
    .await;
    let counts = executor.stats().counts();
    assert!(!counts.following_feed && counts.feed_cuts == 0, "{counts:?}");
    until("it lists again and again", async || executor.stats().counts().lists > 2).await;
    stop.send_replace(true);
}
