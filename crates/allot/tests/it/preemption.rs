//! Preemption end to end, on real daemons: a queue below its guarantee takes room back from a
//! queue above its own; the victim's executor aborts its attempt (a system failure `preempted`
//! in its run), the room is held for the preemptor, and the victim runs again once room comes
//! back. A checker reads the pool while it happens: never more allocated than its capacity. On
//! Redis, the daemon that schedules is killed (SIGKILL) while the victim is being preempted, and
//! the other one carries it through.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use allot_client::{Accept, AddTask, Client, PutQueue, SubmitApp};
use allot_core::Resources;
use allot_store_redis::testing::RedisServer;

use crate::redis_apps::scheduler;
use crate::support::{data_dir, eventually, Daemon};

fn sleeper(id: &str, seconds: f64) -> AddTask {
    crate::exec::task(id, serde_json::json!({ "type": "sleep", "seconds": seconds }))
}

fn app(id: &str, queue: &str, tasks: Vec<AddTask>) -> SubmitApp {
    let app = serde_json::json!({ "id": id, "queue": queue, "user": "me" });
    SubmitApp { tasks, ..serde_json::from_value(app).unwrap() }
}

/// Application `gang` in `queue`: a gang of two members, `m0` and `m1`, of cpu=1 each, each
/// sleeping `seconds`.
fn pair_gang(queue: &str, seconds: f64) -> SubmitApp {
    let member = |id: &str| AddTask { group: Some("pair".into()), ..sleeper(id, seconds) };
    let gang = serde_json::json!({
        "id": "gang", "queue": queue, "user": "me",
        "task_groups": [{ "name": "pair", "min_members": 2, "min_resources": "cpu=1" }],
    });
    SubmitApp { tasks: vec![member("m0"), member("m1")], ..serde_json::from_value(gang).unwrap() }
}

/// Runs `work` while a checker reads every pool through `client`; fails if one ever held more
/// than its capacity (or was never read).
pub(crate) async fn never_overcommitted<T>(client: Client, work: impl std::future::Future<Output = T>) -> T {
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let checker = tokio::spawn(async move {
        let (mut over, mut reads) = (None, 0);
        while !stopped.load(Ordering::SeqCst) {
            if let Ok(list) = client.pools().await {
                for pool in list.pools {
                    let capacity: Resources = pool.capacity.parse().unwrap();
                    let allocated: Resources = pool.allocated.parse().unwrap();
                    if !capacity.fits(&allocated) {
                        over = Some(format!("{}: {allocated} of {capacity}", pool.name));
                    }
                }
                reads += 1;
            }
            tokio::task::yield_now().await;
        }
        (over, reads)
    });
    let answer = work.await;
    stop.store(true, Ordering::SeqCst);
    let (over, reads) = checker.await.unwrap();
    assert!(over.is_none() && reads > 0, "never overcommitted ({reads} reads): {over:?}");
    answer
}

/// Daemons on one Redis: the first schedules (it is alone when it starts), the second runs the
/// pools its `runs` arguments give (`--pool`, `--run-pool`); `config` starts more.
pub(crate) struct OnRedis {
    pub(crate) config: String,
    pub(crate) first: Daemon,
    pub(crate) second: Daemon,
    /// Kept while the daemons run.
    pub(crate) _dirs: Vec<tempfile::TempDir>,
}

pub(crate) async fn scheduler_and_runner(redis: &RedisServer, runs: &[&str]) -> OnRedis {
    let (dir, _) = data_dir();
    let config = dir.path().join("allot.toml");
    std::fs::write(&config, format!("store = \"{}\"\n", redis.url())).unwrap();
    let config = config.to_str().unwrap().to_owned();
    let (first_dir, first_data) = data_dir();
    let first = Daemon::start(&first_data, &["--config", &config]);
    let first_url = first.url.clone();
    assert!(eventually(Duration::from_secs(10), async || scheduler(redis) == first_url).await, "the first schedules");
    let (second_dir, second_data) = data_dir();
    let second = Daemon::start(&second_data, &[&["--config", config.as_str()][..], runs].concat());
    OnRedis { config, first, second, _dirs: vec![dir, first_dir, second_dir] }
}

/// The queues: `root.gold` guaranteed one cpu, preempting at once; `root.batch` guaranteed none.
async fn queues(client: &Client) {
    let gold = PutQueue { guaranteed: Some("cpu=1".into()), preemption_delay_ms: Some(0), ..PutQueue::default() };
    client.put_queue("root.gold", &gold).await.unwrap();
    client.put_queue("root.batch", &PutQueue::default()).await.unwrap();
}

async fn running(client: &Client, app: &str, task: &str) -> bool {
    client.task_run(app, task).await.is_ok_and(|r| r.phase == "Running")
}

/// The batch fills the pool; gold's task preempts one of them; answers the victim's id.
async fn preempt_one(client: &Client) -> String {
    let batch = app("batch", "root.batch", vec![sleeper("b0", 3600.0), sleeper("b1", 3600.0)]);
    client.submit_app(&batch).await.unwrap();
    let both = eventually(Duration::from_secs(20), async || {
        running(client, "batch", "b0").await && running(client, "batch", "b1").await
    })
    .await;
    assert!(both, "the batch runs: {:?}", client.tasks("batch").await.unwrap().tasks);
    client.submit_app(&app("gold", "root.gold", vec![sleeper("g", 0.2)])).await.unwrap();
    let mut victim = None;
    let chosen = eventually(Duration::from_secs(20), async || {
        let tasks = client.tasks("batch").await.unwrap().tasks;
        victim = tasks.iter().find(|t| t.preempting.is_some() || t.preemptions > 0).map(|t| t.id.clone());
        victim.is_some()
    })
    .await;
    assert!(chosen, "a victim is chosen: {:?}", client.tasks("batch").await.unwrap().tasks);
    victim.unwrap()
}

/// Gold's task runs and completes; the victim ran again with its preemption in its run.
async fn carried_through(client: &Client, victim: &str) {
    let done = eventually(Duration::from_secs(30), async || {
        client.task("gold", "g").await.is_ok_and(|t| t.state == "Completed")
    })
    .await;
    assert!(done, "gold's task ran: {:?}", client.task("gold", "g").await);
    let again = eventually(Duration::from_secs(30), async || running(client, "batch", victim).await).await;
    let task = client.task("batch", victim).await.unwrap();
    assert!(again, "the victim runs again once room is back: {task:?}");
    assert_eq!(task.preemptions, 1, "{task:?}");
    let run = client.task_run("batch", victim).await.unwrap();
    let preempted = run.events.iter().any(|e| e.error.as_ref().is_some_and(|err| err.code == "preempted"));
    assert!(preempted && run.system_failures == 1 && run.user_failures == 0, "{run:?}");
    assert_eq!(run.attempt, 2, "{run:?}");
    // The other batch task was never touched.
    let other = if victim == "b0" { "b1" } else { "b0" };
    let other = client.task("batch", other).await.unwrap();
    assert_eq!((other.preemptions, other.state.as_str()), (0, "Running"), "{other:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_below_its_guarantee_preempts_on_the_embedded_store_without_overcommit() {
    let (_dir, data) = data_dir();
    let daemon = Daemon::start(&data, &["--pool", "w=cpu=2", "--run-pool", "w"]);
    let client = daemon.client();
    queues(&client).await;
    never_overcommitted(daemon.client(), async {
        let victim = preempt_one(&client).await;
        carried_through(&client, &victim).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_the_scheduler_killed_mid_preemption_another_daemon_carries_it_through() {
    let redis = RedisServer::start();
    let on = scheduler_and_runner(&redis, &["--pool", "w=cpu=2", "--run-pool", "w"]).await;
    let (first, second) = (on.first, on.second);
    let _dirs = on._dirs;
    let client = second.client();
    queues(&client).await;
    never_overcommitted(second.client(), async {
        let victim = preempt_one(&client).await;
        // Mid-preemption: the victim chosen, maybe not yet taken back. The scheduler dies.
        first.kill9();
        let took_over = eventually(Duration::from_secs(30), async || scheduler(&redis) == second.url).await;
        assert!(took_over, "the second daemon schedules");
        carried_through(&client, &victim).await;
    })
    .await;
}

/// A gang of two and two tasks on their own fill the pool; a task of a queue below its guarantee
/// preempts: one task on its own goes rather than the whole gang (a gang is never left below its
/// minimum: it goes whole or not at all, and one victim is fewer than two). Answers the victim.
async fn gang_kept(client: &Client) -> String {
    client.submit_app(&pair_gang("root.batch", 3600.0)).await.unwrap();
    let solo = app("solo", "root.batch", vec![sleeper("s0", 3600.0), sleeper("s1", 3600.0)]);
    client.submit_app(&solo).await.unwrap();
    let all = eventually(Duration::from_secs(30), async || {
        running(client, "gang", "m0").await
            && running(client, "gang", "m1").await
            && running(client, "solo", "s0").await
            && running(client, "solo", "s1").await
    })
    .await;
    assert!(all, "everything runs: {:?} {:?}", client.tasks("gang").await, client.tasks("solo").await);
    client.submit_app(&app("gold", "root.gold", vec![sleeper("g", 0.2)])).await.unwrap();
    let done = eventually(Duration::from_secs(30), async || {
        client.task("gold", "g").await.is_ok_and(|t| t.state == "Completed")
    })
    .await;
    assert!(done, "gold's task ran: {:?}", client.task("gold", "g").await);
    for member in ["m0", "m1"] {
        let task = client.task("gang", member).await.unwrap();
        assert_eq!((task.preemptions, task.state.as_str()), (0, "Running"), "a gang member is never taken: {task:?}");
    }
    let solo = client.tasks("solo").await.unwrap().tasks;
    let victims: Vec<&str> = solo.iter().filter(|t| t.preemptions > 0).map(|t| t.id.as_str()).collect();
    assert_eq!(victims.len(), 1, "one task on its own is taken: {solo:?}");
    victims[0].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preemption_never_breaks_a_gang_on_either_store() {
    let (_dir, data) = data_dir();
    let daemon = Daemon::start(&data, &["--pool", "w=cpu=4", "--run-pool", "w"]);
    queues(&daemon.client()).await;
    never_overcommitted(daemon.client(), gang_kept(&daemon.client())).await;
    drop(daemon);

    let redis = RedisServer::start();
    let on = scheduler_and_runner(&redis, &["--pool", "w=cpu=4", "--run-pool", "w"]).await;
    queues(&on.second.client()).await;
    never_overcommitted(on.second.client(), gang_kept(&on.second.client())).await;
}

/// Two tasks fill the pool; a gang of two in a queue below its guarantee preempts both at once,
/// is reserved once they have ended, runs and completes; then they run again.
async fn gang_preempts(client: &Client) {
    let gold = PutQueue { guaranteed: Some("cpu=2".into()), preemption_delay_ms: Some(0), ..PutQueue::default() };
    client.put_queue("root.gold", &gold).await.unwrap();
    client.put_queue("root.batch", &PutQueue::default()).await.unwrap();
    let batch = app("batch", "root.batch", vec![sleeper("b0", 3600.0), sleeper("b1", 3600.0)]);
    client.submit_app(&batch).await.unwrap();
    let both = eventually(Duration::from_secs(20), async || {
        running(client, "batch", "b0").await && running(client, "batch", "b1").await
    })
    .await;
    assert!(both, "the batch runs: {:?}", client.tasks("batch").await.unwrap().tasks);
    client.submit_app(&pair_gang("root.gold", 0.2)).await.unwrap();
    let done = eventually(Duration::from_secs(30), async || {
        client.app("gang").await.is_ok_and(|app| app.tasks.get("Completed") == Some(&2))
    })
    .await;
    assert!(done, "the gang ran: {:?} {:?}", client.app("gang").await, client.tasks("batch").await);
    let again = eventually(Duration::from_secs(30), async || {
        running(client, "batch", "b0").await && running(client, "batch", "b1").await
    })
    .await;
    let tasks = client.tasks("batch").await.unwrap().tasks;
    assert!(again, "the batch runs again once room is back: {tasks:?}");
    for task in &tasks {
        assert_eq!(task.preemptions, 1, "both taken for the gang, once: {task:?}");
        let run = client.task_run("batch", &task.id).await.unwrap();
        assert_eq!((run.system_failures, run.user_failures), (1, 0), "{run:?}");
        let reason = run.events.iter().filter_map(|e| e.error.as_ref()).find(|err| err.code == "preempted");
        assert!(reason.is_some_and(|err| err.message.contains("gang/pair")), "{run:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_below_its_guarantee_preempts_for_all_its_members_on_either_store() {
    let (_dir, data) = data_dir();
    let daemon = Daemon::start(&data, &["--pool", "w=cpu=2", "--run-pool", "w"]);
    never_overcommitted(daemon.client(), gang_preempts(&daemon.client())).await;
    drop(daemon);

    let redis = RedisServer::start();
    let on = scheduler_and_runner(&redis, &["--pool", "w=cpu=2", "--run-pool", "w"]).await;
    never_overcommitted(on.second.client(), gang_preempts(&on.second.client())).await;
}

/// A gang of two fills the pool; a task of a queue below its guarantee needs one of its places:
/// the whole gang is taken (never one member alone), waits to be reserved again, and runs again
/// once the preemptor is done. A checker reads the gang's tasks meanwhile: while one member is
/// placed and the other not, the one placed is being taken back. With `failover` (the daemon
/// that schedules, the Redis, the URL of the one that takes over), that daemon is killed (SIGKILL)
/// once the gang is marked, and the other carries the preemption and the new reservation through.
async fn gang_taken_whole(client: &Client, failover: Option<(Daemon, &RedisServer, &str)>) {
    queues(client).await;
    client.submit_app(&pair_gang("root.batch", 3600.0)).await.unwrap();
    let both = eventually(Duration::from_secs(30), async || {
        running(client, "gang", "m0").await && running(client, "gang", "m1").await
    })
    .await;
    assert!(both, "the gang runs: {:?}", client.tasks("gang").await);
    let stop = Arc::new(AtomicBool::new(false));
    let (stopped, reader) = (stop.clone(), client.clone());
    let checker = tokio::spawn(async move {
        let (mut in_part, mut reads) = (None, 0);
        while !stopped.load(Ordering::SeqCst) {
            if let Ok(list) = reader.tasks("gang").await {
                let placed = |t: &&allot_client::Task| matches!(t.state.as_str(), "Allocated" | "Running");
                let on: Vec<&allot_client::Task> = list.tasks.iter().filter(placed).collect();
                if on.len() == 1 && on[0].preempting.is_none() {
                    in_part = Some(format!("{:?}", list.tasks));
                }
                reads += 1;
            }
            tokio::task::yield_now().await;
        }
        (in_part, reads)
    });
    client.submit_app(&app("gold", "root.gold", vec![sleeper("g", 0.2)])).await.unwrap();
    if let Some((scheduler_daemon, redis, next)) = failover {
        let marked = eventually(Duration::from_secs(30), async || {
            client
                .tasks("gang")
                .await
                .is_ok_and(|l| l.tasks.iter().any(|t| t.preempting.is_some() || t.preemptions > 0))
        })
        .await;
        assert!(marked, "the gang is taken: {:?}", client.tasks("gang").await);
        scheduler_daemon.kill9();
        let took_over = eventually(Duration::from_secs(30), async || scheduler(redis) == next).await;
        assert!(took_over, "the other daemon schedules");
    }
    let done = eventually(Duration::from_secs(30), async || {
        client.task("gold", "g").await.is_ok_and(|t| t.state == "Completed")
    })
    .await;
    assert!(done, "gold's task ran: {:?} {:?}", client.task("gold", "g").await, client.tasks("gang").await);
    let again = eventually(Duration::from_secs(30), async || {
        running(client, "gang", "m0").await && running(client, "gang", "m1").await
    })
    .await;
    assert!(again, "the gang runs again, whole: {:?} {:?}", client.app("gang").await, client.tasks("gang").await);
    stop.store(true, Ordering::SeqCst);
    let (in_part, reads) = checker.await.unwrap();
    assert!(in_part.is_none() && reads > 0, "the gang was never placed in part ({reads} reads): {in_part:?}");
    for member in ["m0", "m1"] {
        let task = client.task("gang", member).await.unwrap();
        assert_eq!(task.preemptions, 1, "every member taken, once: {task:?}");
        let run = client.task_run("gang", member).await.unwrap();
        assert_eq!((run.system_failures, run.user_failures, run.attempt), (1, 0, 2), "{run:?}");
        let reason = run.events.iter().filter_map(|e| e.error.as_ref()).find(|err| err.code == "preempted");
        assert!(reason.is_some_and(|err| err.message.contains("gold/g")), "{run:?}");
    }
    assert_eq!(client.app("gang").await.unwrap().state, "Running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_is_preempted_whole_and_runs_again_whole_on_either_store() {
    let (_dir, data) = data_dir();
    let daemon = Daemon::start(&data, &["--pool", "w=cpu=2", "--run-pool", "w"]);
    never_overcommitted(daemon.client(), gang_taken_whole(&daemon.client(), None)).await;
    drop(daemon);

    let redis = RedisServer::start();
    let on = scheduler_and_runner(&redis, &["--pool", "w=cpu=2", "--run-pool", "w"]).await;
    never_overcommitted(on.second.client(), gang_taken_whole(&on.second.client(), None)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_the_scheduler_killed_while_a_gang_is_taken_another_daemon_carries_it_through_whole() {
    let redis = RedisServer::start();
    let on = scheduler_and_runner(&redis, &["--pool", "w=cpu=2", "--run-pool", "w"]).await;
    let (first, second, _dirs) = (on.first, on.second, on._dirs);
    let client = second.client();
    let failover = Some((first, &redis, second.url.as_str()));
    never_overcommitted(second.client(), gang_taken_whole(&client, failover)).await;
}

/// The queue `root.team` may hold cpu=1 (its `max`) on a pool with room to spare; a batch task
/// of priority 0 holds it; an urgent task of priority 10 in the same queue takes its place, runs
/// and completes; then the batch task runs again. Nothing outside the queue is touched.
async fn ceiling_preempts(client: &Client) {
    let team = PutQueue { max: Some("cpu=1".into()), preemption_delay_ms: Some(0), ..PutQueue::default() };
    client.put_queue("root.team", &team).await.unwrap();
    client.put_queue("root.other", &PutQueue::default()).await.unwrap();
    client.submit_app(&app("batch", "root.team", vec![sleeper("b", 3600.0)])).await.unwrap();
    client.submit_app(&app("other", "root.other", vec![sleeper("o", 3600.0)])).await.unwrap();
    let both = eventually(Duration::from_secs(20), async || {
        running(client, "batch", "b").await && running(client, "other", "o").await
    })
    .await;
    assert!(both, "batch and other run: {:?} {:?}", client.tasks("batch").await, client.tasks("other").await);
    let urgent = AddTask { priority: Some(10), ..sleeper("u", 0.2) };
    client.submit_app(&app("urgent", "root.team", vec![urgent])).await.unwrap();
    let done = eventually(Duration::from_secs(30), async || {
        client.task("urgent", "u").await.is_ok_and(|t| t.state == "Completed")
    })
    .await;
    assert!(done, "the urgent task ran: {:?} {:?}", client.task("urgent", "u").await, client.tasks("batch").await);
    let again = eventually(Duration::from_secs(30), async || running(client, "batch", "b").await).await;
    let task = client.task("batch", "b").await.unwrap();
    assert!(again, "the batch task runs again once its queue has room: {task:?}");
    assert_eq!(task.preemptions, 1, "{task:?}");
    let run = client.task_run("batch", "b").await.unwrap();
    let reason = run.events.iter().filter_map(|e| e.error.as_ref()).find(|err| err.code == "preempted");
    assert!(reason.is_some_and(|err| err.message.contains("urgent/u")), "{run:?}");
    let other = client.task("other", "o").await.unwrap();
    assert_eq!((other.preemptions, other.state.as_str()), (0, "Running"), "{other:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_held_back_by_its_queues_max_preempts_a_lower_priority_one_of_that_queue_on_either_store() {
    let (_dir, data) = data_dir();
    let daemon = Daemon::start(&data, &["--pool", "w=cpu=4", "--run-pool", "w"]);
    ceiling_preempts(&daemon.client()).await;
    drop(daemon);

    let redis = RedisServer::start();
    let on = scheduler_and_runner(&redis, &["--pool", "w=cpu=4", "--run-pool", "w"]).await;
    ceiling_preempts(&on.second.client()).await;
}

/// A task on its own (no type: run by whoever reports it), placed where no executor runs.
fn untyped(id: &str, resources: &str) -> AddTask {
    serde_json::from_value(serde_json::json!({ "id": id, "resources": resources })).unwrap()
}

/// Two tasks hold two of the pool's three cpus; a task of a queue below its guarantee needs two:
/// it preempts one and the room held for it is the free cpu and the victim's. While the victim
/// runs on, an outside worker is offered none of it and may not take it (Reflow's client side);
/// once the victim ends, the preemptor takes it all.
async fn held_room_is_no_outsiders(client: &Client) {
    let gold = PutQueue { guaranteed: Some("cpu=2".into()), preemption_delay_ms: Some(0), ..PutQueue::default() };
    client.put_queue("root.gold", &gold).await.unwrap();
    client.put_queue("root.batch", &PutQueue::default()).await.unwrap();
    client.submit_app(&app("batch", "root.batch", vec![untyped("b0", "cpu=1"), untyped("b1", "cpu=1")])).await.unwrap();
    let placed = eventually(Duration::from_secs(20), async || {
        let tasks = client.tasks("batch").await.unwrap().tasks;
        tasks.iter().all(|t| t.state == "Allocated")
    })
    .await;
    assert!(placed, "the batch is placed: {:?}", client.tasks("batch").await);
    let free = client.offers("w").await.unwrap().offers;
    assert_eq!(free.iter().map(|o| o.available.as_str()).collect::<Vec<_>>(), ["cpu=1"], "one cpu free");
    client.submit_app(&app("gold", "root.gold", vec![untyped("g", "cpu=2")])).await.unwrap();
    let mut victim = None;
    let chosen = eventually(Duration::from_secs(20), async || {
        let tasks = client.tasks("batch").await.unwrap().tasks;
        victim = tasks.iter().find(|t| t.preempting.is_some()).map(|t| t.id.clone());
        victim.is_some()
    })
    .await;
    assert!(chosen, "a victim is chosen: {:?}", client.tasks("batch").await);
    let victim = victim.unwrap();
    assert_eq!(client.task("gold", "g").await.unwrap().held_on.as_deref(), Some("w"));
    // The free cpu is held for gold: not offered, not taken by an outside alloc.
    assert!(client.offers("w").await.unwrap().offers.is_empty(), "the room held is not offered");
    let outside = Accept { min: "cpu=1".into(), owner: Some("outside".into()), ..Accept::default() };
    let refused = client.accept("w", "1", &outside).await;
    assert_eq!(refused.as_ref().err().and_then(|e| e.code()), Some("offer_expired"), "{refused:?}");
    // The victim ends (its owner reports it done): gold takes the room, all of it.
    client.complete_task("batch", &victim).await.unwrap();
    let gold_placed = eventually(Duration::from_secs(20), async || {
        client.task("gold", "g").await.is_ok_and(|t| t.state == "Allocated")
    })
    .await;
    assert!(gold_placed, "gold is placed: {:?}", client.task("gold", "g").await);
    let refused = client.accept("w", "1", &outside).await;
    assert_eq!(refused.as_ref().err().and_then(|e| e.code()), Some("offer_expired"), "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn room_held_for_a_preemptor_is_neither_offered_nor_taken_by_an_outside_alloc_on_either_store() {
    let (_dir, data) = data_dir();
    let daemon = Daemon::start(&data, &["--pool", "w=cpu=3"]);
    never_overcommitted(daemon.client(), held_room_is_no_outsiders(&daemon.client())).await;
    drop(daemon);

    let redis = RedisServer::start();
    let on = scheduler_and_runner(&redis, &["--pool", "w=cpu=3"]).await;
    never_overcommitted(on.second.client(), held_room_is_no_outsiders(&on.second.client())).await;
}
