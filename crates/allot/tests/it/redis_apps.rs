//! Applications on Redis: three daemons share one real `redis-server`; one schedules (it holds
//! the scheduler's lease), the others forward the applications part to it. The scheduling daemon
//! is killed with SIGKILL while gangs with token needs are being reserved and taken over; another
//! takes over within seconds, no task or placeholder is placed twice, no gang is held in part,
//! every alloc and grant in Redis belongs to exactly one placement, acknowledged completions
//! stay, and the work then finishes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use allot_store_redis::testing::RedisServer;

use crate::gangs::{check_consistent, gang, retry, POOLS};
use crate::support::{data_dir, eventually, Daemon, PATIENCE};

const NAMESPACE: &str = "seats";

fn url(daemon: &Daemon) -> String {
    format!("http://{}", daemon.address())
}

/// The base URL of the daemon that holds the scheduler's lease, read from Redis.
pub(crate) fn scheduler(redis: &RedisServer) -> String {
    let holder = redis.cli(&["HGET", "allot:{allot-apps}:lease", "holder"]);
    holder.split_whitespace().next().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_daemons_on_redis_the_scheduler_killed_mid_gangs_another_takes_over_and_nothing_is_placed_twice() {
    let redis = RedisServer::start();
    let (dir, _) = data_dir();
    let config = dir.path().join("allot.toml");
    std::fs::write(
        &config,
        format!(
            "store = \"{}\"\n[scheduler]\ncompleting_grace = \"1s\"\n[quotas]\n{NAMESPACE} = 14\n\
             [queues.\"root.crash\"]\n",
            redis.url()
        ),
    )
    .unwrap();
    let pools: Vec<String> = (0..POOLS).map(|p| format!("p{p}=cpu=6")).collect();
    let mut args: Vec<&str> = vec!["--config", config.to_str().unwrap()];
    for pool in &pools {
        args.extend(["--pool", pool.as_str()]);
    }
    let mut daemons: Vec<(tempfile::TempDir, std::path::PathBuf, Daemon)> = (0..3)
        .map(|_| {
            let (dir, data) = data_dir();
            let daemon = Daemon::start(&data, &args);
            (dir, data, daemon)
        })
        .collect();
    let found =
        eventually(Duration::from_secs(10), async || daemons.iter().any(|d| url(&d.2) == scheduler(&redis))).await;
    assert!(found, "one of the daemons schedules: {}", scheduler(&redis));
    let completed: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let mut submitted = 0;
    for round in 0..3 {
        let leader = daemons.iter().position(|d| url(&d.2) == scheduler(&redis)).expect("a scheduler");
        // Calls go through the other daemons: they forward to the scheduler.
        let (a, b) = ((leader + 1) % 3, (leader + 2) % 3);
        let submitter = daemons[a].2.client();
        // Room for 18 members and 14 seats: 3 gangs of 4 at a time, the rest wait.
        for _ in 0..8 {
            let id = format!("gang-{submitted}");
            submitted += 1;
            submitter.submit_app(&gang(&id, Some(NAMESPACE))).await.unwrap();
        }
        let stop = Arc::new(AtomicBool::new(false));
        let worker = {
            let (client, completed, stop) = (daemons[b].2.client(), completed.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(apps) = client.apps().await else { continue };
                    for app in apps.apps.iter().filter(|a| a.state == "Running" || a.state == "Reserving") {
                        let Ok(tasks) = client.tasks(&app.id).await else { continue };
                        for task in tasks.tasks.iter().filter(|t| t.state == "Allocated") {
                            if client.complete_task(&app.id, &task.id).await.is_ok() {
                                completed.lock().unwrap().push((app.id.clone(), task.id.clone()));
                            }
                        }
                    }
                }
            })
        };
        // Killed once the worker has completed a few more tasks, more in each round: a different
        // moment of the reservations each time (wait for it, not for a time).
        let target = completed.lock().unwrap().len() + 2 + 3 * round;
        let loaded = eventually(PATIENCE, async || completed.lock().unwrap().len() >= target).await;
        assert!(loaded, "the worker never completed {target} tasks");
        let (dir, data, killed) = daemons.remove(leader);
        let address = killed.address();
        let killed_url = url(&killed);
        killed.kill9();
        let started = Instant::now();
        let took_over = eventually(Duration::from_secs(10), async || {
            let now = scheduler(&redis);
            !now.is_empty() && now != killed_url && daemons[0].2.client().apps().await.is_ok()
        })
        .await;
        let takeover = started.elapsed();
        assert!(took_over, "no daemon took the scheduling over within 10 s");
        eprintln!("round {round}: {} took over in {takeover:?}", scheduler(&redis));
        // The worker went on through the takeover; the work after it is checked at the end.
        stop.store(true, Ordering::Relaxed);
        let _ = worker.await;
        check_consistent(&daemons[0].2.client(), Some(NAMESPACE)).await;
        check_consistent(&daemons[1].2.client(), Some(NAMESPACE)).await;
        let acknowledged = completed.lock().unwrap().clone();
        let client = daemons[0].2.client();
        for (app, task) in &acknowledged {
            let task = retry!(client.task(app, task));
            assert_eq!(task.state, "Completed", "an acknowledged completion of {app}/{} was lost", task.id);
        }
        // The killed daemon comes back, as a follower.
        daemons.push((dir, data.clone(), Daemon::start_on(&address, &data, &args)));
    }
    // And the work finishes: every gang runs and completes.
    let client = daemons[2].2.client();
    let finished = eventually(Duration::from_secs(60), async || {
        let apps = retry!(client.apps()).apps;
        for app in &apps {
            for task in retry!(client.tasks(&app.id)).tasks.iter().filter(|t| t.state == "Allocated") {
                let _ = client.complete_task(&app.id, &task.id).await;
            }
        }
        check_consistent(&client, Some(NAMESPACE)).await;
        apps.iter().all(|a| a.state == "Completed")
    })
    .await;
    assert!(finished, "every gang ran and completed: {:?}", client.apps().await.unwrap().apps);
}
