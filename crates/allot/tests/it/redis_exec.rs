//! Many machines: three daemons share one real `redis-server`, each serving a pool of its own and
//! running the tasks placed there; one of them schedules. One application's tasks spread over
//! the three; a daemon that runs some of them is killed with SIGKILL: its executor's lease
//! lapses, its pool is taken as lost (its allocs ended), its tasks count a system failure and
//! run again on the other daemons, and the application completes with every task's outputs
//! recorded once.

use std::collections::BTreeMap;
use std::time::Duration;

use allot_client::{AddTask, SubmitApp};
use allot_store_redis::testing::RedisServer;

use crate::redis_apps::scheduler;
use crate::support::{data_dir, eventually, Daemon};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_killed_mid_run_has_its_tasks_run_again_on_the_others_and_the_application_completes() {
    let redis = RedisServer::start();
    let (dir, _) = data_dir();
    let config = dir.path().join("allot.toml");
    let text =
        format!("store = \"{}\"\n[scheduler]\ncompleting_grace = \"1s\"\n[queues.\"root.spread\"]\n", redis.url());
    std::fs::write(&config, text).unwrap();
    let daemons: Vec<(tempfile::TempDir, Daemon)> = (0..3)
        .map(|i| {
            let (dir, data) = data_dir();
            let pool = format!("w{i}=cpu=2");
            let run = format!("w{i}");
            let args = ["--config", config.to_str().unwrap(), "--pool", &pool, "--run-pool", &run];
            (dir, Daemon::start(&data, &args))
        })
        .collect();
    let urls: Vec<String> = daemons.iter().map(|d| d.1.url.clone()).collect();
    assert!(eventually(Duration::from_secs(10), async || urls.contains(&scheduler(&redis))).await, "one schedules");
    // Six tasks, room for two on each pool: they spread over the three.
    let command =
        "echo hello-from-$ALLOT_TASK; sleep 2; echo \"{\\\"attempt\\\": $ALLOT_ATTEMPT, \\\"alloc\\\": \\\"$ALLOT_ALLOC\\\"}\" > \"$ALLOT_OUTPUTS\"";
    let tasks = (0..6)
        .map(|i| AddTask {
            preemptable: None,
            priority_class: None,
            id: format!("t{i}"),
            resources: "cpu=1".to_owned(),
            tokens: Vec::new(),
            group: None,
            priority: Default::default(),
            selector: BTreeMap::new(),
            spec: Some(serde_json::json!({ "type": "shell", "command": command })),
            retries: None,
        })
        .collect();
    let app = SubmitApp {
        priority: None,
        priority_class: None,
        id: "spread".to_owned(),
        queue: Some("root.spread".to_owned()),
        user: "me".to_owned(),
        user_groups: Vec::new(),
        tags: BTreeMap::new(),
        task_groups: Vec::new(),
        policy: Default::default(),
        tasks,
    };
    let client = daemons[0].1.client();
    client.submit_app(&app).await.unwrap();
    let running = eventually(Duration::from_secs(15), async || {
        let mut running = 0;
        for i in 0..6 {
            running +=
                usize::from(client.task_run("spread", &format!("t{i}")).await.is_ok_and(|r| r.phase == "Running"));
        }
        running == 6
    })
    .await;
    let runs: Vec<String> = {
        let mut runs = Vec::new();
        for i in 0..6 {
            runs.push(format!("{:?}", client.task_run("spread", &format!("t{i}")).await.map(|r| (r.phase, r.events))));
        }
        runs
    };
    assert!(running, "all six run: {:?}\n{runs:#?}", client.tasks("spread").await);
    let placements = client.tasks("spread").await.unwrap().tasks;
    let pool_of = |task: &allot_client::Task| task.placement.as_ref().unwrap().pool.clone();
    let mut by_pool: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for task in &placements {
        by_pool.entry(pool_of(task)).or_default().push(task.id.clone());
    }
    assert_eq!(by_pool.len(), 3, "spread over the three pools: {by_pool:?}");
    // Kill a daemon that does not schedule (the scheduler's takeover is tested on its own).
    let victim = (0..3).find(|i| urls[*i] != scheduler(&redis)).unwrap();
    let lost_pool = format!("w{victim}");
    let lost_tasks = by_pool[&lost_pool].clone();
    let mut daemons = daemons;
    let (_victim_dir, victim_daemon) = daemons.remove(victim);
    victim_daemon.kill9();
    let client = daemons[0].1.client();
    let completed =
        eventually(Duration::from_secs(40), async || client.app("spread").await.is_ok_and(|a| a.state == "Completed"))
            .await;
    let tasks = client.tasks("spread").await.unwrap().tasks;
    assert!(completed, "the application completes: {tasks:?}");
    for task in &tasks {
        let run = client.task_run("spread", &task.id).await.unwrap();
        let successes = run.events.iter().filter(|e| e.phase == "Success").count();
        assert_eq!((task.state.as_str(), successes), ("Completed", 1), "{}: {run:?}", task.id);
        let outputs = run.outputs.clone().expect("outputs recorded");
        let placement = task.placement.as_ref().unwrap();
        let alloc = format!("{}/{}", placement.pool, placement.alloc);
        assert_eq!(outputs["alloc"], alloc.as_str(), "{}: the outputs of the attempt that ran last", task.id);
        assert_eq!(outputs["attempt"], run.attempt);
        if lost_tasks.contains(&task.id) {
            assert_ne!(placement.pool, lost_pool, "{} ran again elsewhere", task.id);
            assert_eq!((run.attempt, run.system_failures), (2, 1), "{}: one lost attempt", task.id);
            assert!(run.events.iter().any(|e| e.error.as_ref().is_some_and(|e| e.code == "placement_lost")));
        } else {
            assert_eq!(run.attempt, 1, "{}", task.id);
        }
    }
    let pool = client.pool(&lost_pool).await.unwrap();
    assert_eq!(pool.allocs, 0, "the lost pool's allocs are ended");
    // A task's log, asked of a daemon that does not run it: read from the one that does.
    let asked = &daemons[0].1;
    let own_pool = format!("w{}", urls.iter().position(|u| *u == asked.url).unwrap());
    let elsewhere = tasks
        .iter()
        .find(|t| t.placement.as_ref().is_some_and(|p| p.pool != own_pool))
        .expect("a task run by another daemon");
    let logs = asked.client().task_logs("spread", &elsewhere.id, None, None, 0).await.unwrap();
    assert_eq!(logs.text, format!("hello-from-{}\n", elsewhere.id));
}

/// The user's story on Redis: an application removed takes its runs, one submitted again under
/// its id runs afresh, one dropped after its retention takes its runs; and a plugin's quota
/// follows the file of the daemon that starts last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_application_takes_its_runs_on_redis() {
    let redis = RedisServer::start();
    let (dir, data) = data_dir();
    let config = |name: &str, jobs: u64| {
        let path = dir.path().join(name);
        let text = format!(
            "store = \"{}\"\n[queues.\"root.examples\"]\n[scheduler]\ncompleting_grace = \"1s\"\napp_retention = \"4s\"\n\
             [plugins]\nhttp_jobs = {jobs}\n",
            redis.url()
        );
        std::fs::write(&path, text).unwrap();
        path
    };
    let first = config("first.toml", 2);
    let daemon =
        Daemon::start(&data, &["--config", first.to_str().unwrap(), "--pool", "worker=cpu=4", "--run-pool", "worker"]);
    assert!(eventually(Duration::from_secs(10), async || scheduler(&redis) == daemon.url).await, "it schedules");
    assert_eq!(daemon.client().namespace("http:jobs").await.unwrap().quota, 2);
    crate::exec::a_removed_application_takes_its_runs_and_runs_afresh_when_submitted_again(&daemon.url).await;
    let (_other_dir, other_data) = data_dir();
    let second = config("second.toml", 5);
    let other =
        Daemon::start(&other_data, &["--config", second.to_str().unwrap(), "--pool", "w2=cpu=1", "--run-pool", "w2"]);
    assert_eq!(
        other.client().namespace("http:jobs").await.unwrap().quota,
        5,
        "the file of the daemon that started last"
    );
}
