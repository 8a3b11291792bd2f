//! The executor given a change the feed brought late: what the daemon's own feed does under load
//! (on Redis it runs seconds behind the store when tokens and allocs churn at full speed).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use allot_core::apps::queues::{QueueLimits, QueuePath};
use allot_core::apps::states::TaskState;
use allot_core::apps::{AppId, AppSpec, TaskId, TaskSpec};
use allot_core::pools::PoolName;
use allot_core::watch::EventKind;
use allot_store::{EmbeddedConfig, EmbeddedStore, EventObject, Store};
use tokio::sync::watch;

use super::{Executor, ExecutorConfig};
use crate::{builtin, Registry, Secrets, SetupContext, Waker};

/// Longer than any wait here: nothing comes from a periodic list or a run's pause.
const LONG: Duration = Duration::from_secs(600);

async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    allot_host::wait::until(what, async || check().await).await
}

/// A store (its feed as `watch` says) with a pool `local` of `capacity` and a queue `root.q`,
/// and an executor of that pool following its feed.
async fn launch(
    dir: &std::path::Path,
    watch: allot_store::WatchConfig,
    capacity: &str,
) -> (Arc<dyn Store>, Arc<Executor>, watch::Sender<bool>, watch::Receiver<bool>) {
    let embedded = EmbeddedStore::open(&EmbeddedConfig::new(dir.join("data")).with_watch(watch)).unwrap();
    let store: Arc<dyn Store> = Arc::new(embedded);
    let pool = PoolName::new("local").unwrap();
    store.put_pool(pool.clone(), capacity.parse().unwrap()).await.unwrap();
    store.put_queue(QueuePath::new("root.q").unwrap(), QueueLimits::default()).await.unwrap();
    let registry = Registry::load(builtin::configured(&Default::default()), &BTreeMap::new(), |id| {
        SetupContext::new(id, store.clone(), Secrets::default(), Waker::new(|_| {}))
    })
    .await
    .unwrap();
    let mut config = ExecutorConfig::new(HashSet::from([pool]), dir.join("tasks"));
    (config.scan, config.pause) = (LONG, LONG);
    let executor = Executor::new(store.clone(), Arc::new(registry), config);
    executor.take_lease().await.unwrap();
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(executor.clone().run(stopped.clone()));
    (store, executor, stop, stopped)
}

/// An application of queue `root.q`.
fn app_spec(app: &AppId) -> AppSpec {
    AppSpec {
        id: app.clone(),
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

/// A `noop` task of one CPU.
fn noop_task(task: &TaskId) -> TaskSpec {
    TaskSpec {
        preemptable: true,
        id: task.clone(),
        resources: "cpu=1".parse().unwrap(),
        tokens: Vec::new(),
        group: None,
        priority: Default::default(),
        selector: Default::default(),
        spec: r#"{"type":"noop"}"#.into(),
    }
}

/// A task that ran, ended and went with its application, and then its placement brought by the
/// feed: nothing runs again, and no run is left behind (before, the task ran a second time and
/// its run stayed in the store for good, its application forgotten).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placement_the_feed_brings_after_its_task_went_runs_nothing_again() {
    let dir = tempfile::tempdir().unwrap();
    let (store, executor, stop, stopped) = launch(dir.path(), Default::default(), "cpu=8").await;
    // The test's own watcher keeps the changes as they came.
    let mut late = store.watch(crate::feed::filter(), Some(store.revision())).unwrap();

    let app = AppId::new("once").unwrap();
    let task = TaskId::new("t").unwrap();
    store.add_app(app_spec(&app)).await.unwrap();
    store.add_task(app.clone(), noop_task(&task)).await.unwrap();
    until("the task ran and completed", async || {
        store.task(app.clone(), task.clone()).await.unwrap().task.state == TaskState::Completed
    })
    .await;
    assert_eq!(executor.stats().counts().succeeded, 1);
    store.remove_app(app.clone()).await.unwrap();
    until("its run went with it", async || store.run(app.clone(), task.clone()).await.unwrap().is_none()).await;

    // The change that placed it, as a feed running behind would bring it now.
    let placement = loop {
        let event = late.next().await.unwrap();
        if let (EventKind::TaskChanged, EventObject::Task(t)) = (event.kind, &event.object) {
            if t.state == TaskState::Allocated {
                break event;
            }
        }
    };
    executor.on_event(&placement, &stopped);
    until("the executor is done with it", async || executor.active.lock().unwrap().is_empty()).await;
    assert_eq!(store.run(app.clone(), task.clone()).await.unwrap(), None, "no run left behind");
    assert_eq!(executor.stats().counts().succeeded, 1, "the task did not run again");
    stop.send_replace(true);
}

/// A burst of placements in one commit, more events than the executor's watcher may have
/// waiting: it falls behind, resumes from the events the feed keeps and runs every task, with no
/// list of the placed tasks besides the one it starts with (before, each burst cut it and it
/// listed every task placed here, and drove those it already drove again once they ended).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_placements_past_the_watchers_buffer_is_resumed_from_the_feed_not_listed() {
    const TASKS: usize = 60;
    let dir = tempfile::tempdir().unwrap();
    let watch = allot_store::WatchConfig { buffer: 4, inside_buffer: 4, ..Default::default() };
    let (store, executor, stop, _stopped) = launch(dir.path(), watch, "cpu=100").await;
    until("the executor follows the feed", async || executor.stats().counts().following_feed).await;

    let app = AppId::new("burst").unwrap();
    let tasks = (0..TASKS).map(|i| noop_task(&TaskId::new(&format!("t{i}")).unwrap())).collect();
    // One submission: one scheduling cycle places them all, in one commit.
    store.submit_app(app_spec(&app), tasks).await.unwrap();
    until("every task ran and completed", async || {
        let page = store.tasks(app.clone(), allot_store::PageRequest::new(None, TASKS)).await.unwrap();
        page.items.iter().filter(|t| t.task.state == TaskState::Completed).count() == TASKS
    })
    .await;
    let counts = executor.stats().counts();
    assert_eq!(counts.succeeded, TASKS as u64, "each task ran once: {counts:?}");
    assert!(counts.feed_cuts >= 1, "the burst put the executor behind its buffer: {counts:?}");
    assert_eq!(counts.lists, 1, "resumed from the feed, not listed again: {counts:?}");
    assert!(counts.following_feed, "{counts:?}");
    stop.send_replace(true);
}
