//! Applications on Redis: three daemons share one real `redis-server`; one schedules (it holds
//! the scheduler's lease), the others forward the applications part to it. The scheduling daemon
//! is killed with SIGKILL while gangs with token needs are being reserved and taken over; another
//! takes over within seconds, no task or placeholder is placed twice, no gang is held in part,
//! every alloc and grant in Redis belongs to exactly one placement, acknowledged completions
//! stay, and the work then finishes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use allot_client::{AddTask, Client, SubmitApp, TaskGroup, TokenNeed};
use allot_store_redis::testing::RedisServer;

use crate::support::{data_dir, eventually, Daemon};

const POOLS: usize = 3;
const MEMBERS: u32 = 4;
const NAMESPACE: &str = "seats";

fn gang(id: &str) -> SubmitApp {
    let tokens = vec![TokenNeed { namespace: NAMESPACE.to_owned(), units: 1 }];
    SubmitApp {
        id: id.to_owned(),
        queue: "root.crash".to_owned(),
        user: "crash".to_owned(),
        tags: BTreeMap::new(),
        task_groups: vec![TaskGroup {
            name: "workers".to_owned(),
            min_members: MEMBERS,
            min_resources: "cpu=1".to_owned(),
            selector: BTreeMap::new(),
            tokens: tokens.clone(),
        }],
        policy: Default::default(),
        tasks: (0..MEMBERS)
            .map(|m| AddTask {
                id: format!("m{m}"),
                resources: "cpu=1".to_owned(),
                tokens: tokens.clone(),
                group: Some("workers".to_owned()),
                priority: 0,
                selector: BTreeMap::new(),
                spec: None,
            })
            .collect(),
    }
}

/// Retries a call that may meet the moment of a takeover (503) until it answers.
macro_rules! retry {
    ($call:expr) => {{
        let started = Instant::now();
        loop {
            match $call.await {
                Ok(answer) => break answer,
                Err(err) => {
                    assert!(started.elapsed() < Duration::from_secs(30), "no answer in 30 s: {err}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }};
}

fn url(daemon: &Daemon) -> String {
    format!("http://{}", daemon.address())
}

/// The base URL of the daemon that holds the scheduler's lease, read from Redis.
fn scheduler(redis: &RedisServer) -> String {
    let holder = redis.cli(&["HGET", "allot:{allot-apps}:lease", "holder"]);
    holder.split_whitespace().next().unwrap_or_default().to_owned()
}

/// What the daemons say: every application's state and unused placeholders, the placements of
/// placed tasks, and every live alloc and grant (as Redis has them).
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    apps: Vec<(String, String, usize)>,
    /// (owner, alloc uri, tokens) of unused placeholders and placed tasks.
    placements: Vec<(String, String, Vec<String>)>,
    allocs: BTreeSet<String>,
    grants: BTreeSet<String>,
}

async fn snapshot(client: &Client) -> Snapshot {
    let mut apps = Vec::new();
    let mut placements = Vec::new();
    let tokens = |p: &allot_client::Placement| p.tokens.iter().map(|t| t.token.clone()).collect::<Vec<_>>();
    for app in retry!(client.apps()).apps {
        apps.push((app.id.clone(), app.state.clone(), app.placeholders.len()));
        for slot in app.placeholders.iter().filter(|s| s.task.is_none()) {
            placements.push((
                format!("{}#{}", app.id, slot.member),
                slot.placement.uri.clone(),
                tokens(&slot.placement),
            ));
        }
        for task in retry!(client.tasks(&app.id)).tasks {
            if matches!(task.state.as_str(), "Allocated" | "Running") {
                let placement = task.placement.expect("a placed task has a placement");
                placements.push((format!("{}/{}", app.id, task.id), placement.uri.clone(), tokens(&placement)));
            }
        }
    }
    let mut allocs = BTreeSet::new();
    for pool in 0..POOLS {
        for alloc in retry!(client.allocs(&format!("p{pool}"))).allocs {
            allocs.insert(alloc.uri);
        }
    }
    let grants = retry!(client.grants(NAMESPACE)).grants.into_iter().map(|g| g.token).collect();
    placements.sort();
    Snapshot { apps, placements, allocs, grants }
}

/// Checks what must hold whatever moment the scheduler was killed at, on a snapshot that two
/// reads in a row agree on.
async fn check_consistent(client: &Client) {
    let mut last = snapshot(client).await;
    for _ in 0..100 {
        let next = snapshot(client).await;
        if next == last {
            break;
        }
        last = next;
    }
    for (app, state, placeholders) in &last.apps {
        match state.as_str() {
            "Reserving" => assert_eq!(*placeholders, MEMBERS as usize, "{app}: a gang held in part"),
            "Accepted" => assert_eq!(*placeholders, 0, "{app}: placeholders before its gang"),
            _ => {}
        }
    }
    let mut placed = BTreeSet::new();
    let mut granted = BTreeSet::new();
    for (owner, uri, tokens) in &last.placements {
        assert!(placed.insert(uri.clone()), "{owner}: alloc {uri} placed twice");
        assert_eq!(tokens.len(), 1, "{owner}: holds its alloc and its seat together");
        for token in tokens {
            assert!(granted.insert(token.clone()), "{owner}: token {token} granted twice");
        }
    }
    assert_eq!(last.allocs, placed, "every live alloc belongs to exactly one placement, and every placement's lives");
    assert_eq!(last.grants, granted, "every grant belongs to exactly one placement, and every placement's is held");
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
            submitter.submit_app(&gang(&id)).await.unwrap();
        }
        let worker = {
            let (client, completed) = (daemons[b].2.client(), completed.clone());
            tokio::spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(3);
                while Instant::now() < deadline {
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
        tokio::time::sleep(Duration::from_millis(150 + 100 * round)).await;
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
        let _ = worker.await;
        check_consistent(&daemons[0].2.client()).await;
        check_consistent(&daemons[1].2.client()).await;
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
        check_consistent(&client).await;
        apps.iter().all(|a| a.state == "Completed")
    })
    .await;
    assert!(finished, "every gang ran and completed: {:?}", client.apps().await.unwrap().apps);
}
