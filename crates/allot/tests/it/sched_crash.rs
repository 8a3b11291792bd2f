//! SIGKILL while the scheduler reserves gangs and tasks take placeholders over: after a restart
//! no gang is held in part, every live alloc belongs to exactly one placement (no task placed
//! twice, no alloc left behind), acknowledged completions stay, and the work then finishes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::gangs::{check_consistent, gang, POOLS};
use crate::support::{data_dir, eventually, Daemon, PATIENCE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_gang_reservations_and_takeovers_loses_nothing_and_holds_no_half_gang() {
    let (dir, data) = data_dir();
    let config = dir.path().join("allot.toml");
    std::fs::write(&config, "[scheduler]\ncompleting_grace = \"1s\"\n[queues.\"root.crash\"]\n").unwrap();
    let pools: Vec<String> = (0..POOLS).map(|p| format!("p{p}=cpu=6")).collect();
    let mut args: Vec<&str> = vec!["--config", config.to_str().unwrap()];
    for pool in &pools {
        args.extend(["--pool", pool.as_str()]);
    }
    let mut daemon = Daemon::start(&data, &args);
    let completed: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let mut submitted = 0;
    for round in 0..3 {
        let client = daemon.client();
        // Room for 18 members: 4 gangs of 4 at a time, so the rest wait and are reserved as
        // others complete.
        for _ in 0..8 {
            let id = format!("gang-{submitted}");
            submitted += 1;
            client.submit_app(&gang(&id, None)).await.unwrap();
        }
        // A worker completes placed tasks as they come: completions free room, and the next
        // gangs are reserved while the daemon is killed.
        let worker = {
            let (client, completed) = (client.clone(), completed.clone());
            tokio::spawn(async move {
                loop {
                    let Ok(apps) = client.apps().await else { return };
                    for app in apps.apps.iter().filter(|a| a.state == "Running" || a.state == "Reserving") {
                        let Ok(tasks) = client.tasks(&app.id).await else { return };
                        for task in tasks.tasks.iter().filter(|t| t.state == "Allocated") {
                            match client.complete_task(&app.id, &task.id).await {
                                Ok(_) => completed.lock().unwrap().push((app.id.clone(), task.id.clone())),
                                Err(_) => return,
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
        let address = daemon.address();
        daemon.kill9();
        let _ = worker.await;
        daemon = Daemon::start_on(&address, &data, &args);
        let client = daemon.client();
        check_consistent(&client, None).await;
        let acknowledged = completed.lock().unwrap().clone();
        for (app, task) in &acknowledged {
            let task = client.task(app, task).await.unwrap();
            assert_eq!(task.state, "Completed", "an acknowledged completion of {app}/{} was lost", task.id);
        }
    }
    // And the work finishes: every gang runs and completes.
    let client = daemon.client();
    let finished = eventually(Duration::from_secs(60), async || {
        let apps = client.apps().await.unwrap().apps;
        for app in &apps {
            for task in client.tasks(&app.id).await.unwrap().tasks.iter().filter(|t| t.state == "Allocated") {
                client.complete_task(&app.id, &task.id).await.unwrap();
            }
        }
        check_consistent(&client, None).await;
        apps.iter().all(|a| a.state == "Completed")
    })
    .await;
    assert!(finished, "every gang ran and completed: {:?}", client.apps().await.unwrap().apps);
}
