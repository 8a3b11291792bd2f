//! Pools that change under the scheduler, end to end on real daemons: a drained pool's tasks are
//! preempted (their executor aborts them, their run says `preempted`) and placed on another pool;
//! a pool whose room is occupied by others preempts what no longer fits, lowest priority first.
//! Checkers read the pools while it happens: never more held than a pool may hold, once the
//! victims are gone. On Redis the orders go to a daemon that neither schedules nor runs the pools.

use std::time::Duration;

use allot_client::{AddTask, Client, PutQueue, SubmitApp, WatchEvent, WatchFilter, WatchObject};
use allot_core::Resources;
use allot_store_redis::testing::RedisServer;
use futures_util::StreamExt;

use crate::preemption::{never_overcommitted, scheduler_and_runner};
use crate::support::{data_dir, eventually, Daemon};

fn sleeper(id: &str, priority: i32) -> AddTask {
    let task = crate::exec::task(id, serde_json::json!({ "type": "sleep", "seconds": 3600.0 }));
    AddTask { priority: Some(priority), ..task }
}

fn app(id: &str, tasks: Vec<AddTask>) -> SubmitApp {
    let app = serde_json::json!({ "id": id, "queue": "root.q", "user": "me" });
    SubmitApp { tasks, ..serde_json::from_value(app).unwrap() }
}

/// Where each task of `app` runs (`None`: not running).
async fn running_on(client: &Client, app: &str, task: &str) -> Option<String> {
    let run = client.task_run(app, task).await.ok()?;
    let task = client.task(app, task).await.ok()?;
    (run.phase == "Running").then_some(task.placement?.pool)
}

/// The task was preempted once, by its pool (no preemptor), and its run says so.
async fn preempted_by_its_pool(client: &Client, app: &str, task: &str, why: &str) {
    let info = client.task(app, task).await.unwrap();
    assert_eq!(info.preemptions, 1, "{info:?}");
    assert!(info.reason.as_deref().is_some_and(|r| r.contains(why)), "{info:?}");
    let run = client.task_run(app, task).await.unwrap();
    let preempted = run.events.iter().any(|e| e.error.as_ref().is_some_and(|err| err.code == "preempted"));
    assert!(preempted && run.system_failures == 1 && run.user_failures == 0, "{run:?}");
}

async fn drain_moves_the_tasks(ordered_at: &Daemon, runs: &Client) {
    let orders = &ordered_at.client();
    orders.put_queue("root.q", &PutQueue::default()).await.unwrap();
    let cordoned = orders.cordon_pool("w2").await.unwrap();
    assert!(cordoned.cordon.is_some_and(|c| c.drain_in_ms.is_none()), "{cordoned:?}");
    orders.submit_app(&app("batch", vec![sleeper("a", 0), sleeper("b", 0)])).await.unwrap();
    let on_w1 = eventually(Duration::from_secs(30), async || {
        running_on(runs, "batch", "a").await.as_deref() == Some("w1")
            && running_on(runs, "batch", "b").await.as_deref() == Some("w1")
    })
    .await;
    assert!(on_w1, "both run on w1: {:?}", runs.tasks("batch").await.unwrap().tasks);
    // A new alloc on a cordoned pool is refused with a clear code.
    let refused = orders.accept("w2", "1", &allot_client::Accept { min: "cpu=1".into(), ..Default::default() }).await;
    assert_eq!(refused.unwrap_err().code(), Some("pool_cordoned"));
    let from: u64 = crate::watch::revision(ordered_at).await.parse().unwrap();
    let since = orders.watch(WatchFilter { kinds: Vec::new(), prefixes: vec!["pools/w1".into()] }, Some(from));
    orders.uncordon_pool("w2").await.unwrap();
    let drained = orders.drain_pool("w1", Some(Duration::ZERO)).await.unwrap();
    assert_eq!(drained.cordon.and_then(|c| c.drain_in_ms), Some(0), "{drained:?}");
    let moved = eventually(Duration::from_secs(60), async || {
        running_on(runs, "batch", "a").await.as_deref() == Some("w2")
            && running_on(runs, "batch", "b").await.as_deref() == Some("w2")
    })
    .await;
    assert!(moved, "both run on w2: {:?}", runs.tasks("batch").await.unwrap().tasks);
    for task in ["a", "b"] {
        preempted_by_its_pool(runs, "batch", task, "pool `w1` is drained").await;
    }
    // The change feed said the pool was drained.
    let mut since = since;
    let drained_event = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(event) = since.next().await {
            let event: WatchEvent = event.unwrap();
            if let WatchObject::Pool(pool) = &event.object {
                if pool.cordon.is_some_and(|c| c.drain_in_ms.is_some()) {
                    return true;
                }
            }
        }
        false
    })
    .await;
    assert_eq!(drained_event, Ok(true), "a pool event with the drain");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_pools_tasks_move_to_another_pool_on_the_embedded_store() {
    let (_dir, data) = data_dir();
    let args = ["--pool", "w1=cpu=2", "--pool", "w2=cpu=2", "--run-pool", "w1", "--run-pool", "w2"];
    let daemon = Daemon::start(&data, &args);
    let client = daemon.client();
    never_overcommitted(daemon.client(), drain_moves_the_tasks(&daemon, &client)).await;
    let metrics = client.metrics().await.unwrap();
    for line in ["allot_pools_cordoned 1", "allot_apps_preemptions_total 2", "allot_apps_preemption_decisions_total 1"]
    {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_drain_and_occupied_room_ordered_at_one_daemon_are_carried_out_by_the_others() {
    let redis = RedisServer::start();
    let pools = ["--pool", "w1=cpu=2", "--pool", "w2=cpu=2", "--run-pool", "w1", "--run-pool", "w2"];
    let on = scheduler_and_runner(&redis, &pools).await;
    let (_third_dir, third_data) = data_dir();
    let third = Daemon::start(&third_data, &["--config", &on.config]);
    let (orders, runs) = (third.client(), on.second.client());
    never_overcommitted(on.second.client(), async {
        drain_moves_the_tasks(&third, &runs).await;
        // w2 holds both tasks; something else takes one cpu of it: the younger one goes, and waits
        // (w1 is drained) until the room is back.
        let occupied = allot_client::PutPool {
            capacity: "cpu=2".into(),
            occupied: Some("cpu=1".into()),
            labels: None,
            plugins: None,
        };
        let put = orders.put_pool_with("w2", &occupied).await.unwrap();
        assert_eq!(put.pool.occupied, "cpu=1");
        let one_left = eventually(Duration::from_secs(60), async || {
            let a = running_on(&runs, "batch", "a").await;
            let b = running_on(&runs, "batch", "b").await;
            a.is_some() != b.is_some()
        })
        .await;
        assert!(one_left, "one of the two is preempted: {:?}", runs.tasks("batch").await.unwrap().tasks);
        // The preempted task's alloc is freed once its run stops, just after the task's state says
        // so (CI saw both allocs still held at the first reading).
        let usable: Resources = "cpu=1".parse().unwrap();
        let fits = eventually(Duration::from_secs(60), async || {
            let allocated: Resources = runs.pool("w2").await.unwrap().allocated.parse().unwrap();
            usable.fits(&allocated)
        })
        .await;
        assert!(fits, "w2 holds what it may: {:?}", runs.pool("w2").await.unwrap());
        // The room comes back: the task preempted runs again.
        orders.put_pool_with("w2", &allot_client::PutPool { occupied: Some(String::new()), ..occupied }).await.unwrap();
        let both = eventually(Duration::from_secs(60), async || {
            running_on(&runs, "batch", "a").await.is_some() && running_on(&runs, "batch", "b").await.is_some()
        })
        .await;
        assert!(both, "both run again: {:?}", runs.tasks("batch").await.unwrap().tasks);
    })
    .await;
}
