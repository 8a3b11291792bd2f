//! SIGKILL in the middle of concurrent load, at both levels of durability: every acknowledged
//! grant, release, alloc and free survives, the counters equal what is held, and leases resume
//! with the TTL they had left.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use allot_client::{Accept, Allocate, Status};

use crate::support::{data_dir, eventually, Daemon, PATIENCE};

/// The lease of the grant that lives through the kill: longer than the load may take to build
/// on a loaded machine.
const LEASE_MS: u64 = 90_000;

/// How long a killed daemon stays down: longer than the slack of the lease checks, so that
/// downtime counted against a lease would show.
const DOWNTIME: Duration = Duration::from_millis(1500);

/// Lets [`DOWNTIME`] pass with the daemon down.
async fn stay_down() {
    // Real time must pass: the lease checks tell the time the daemon was down from the time it ran.
    tokio::time::sleep(DOWNTIME).await;
}

/// What the clients were told about a token (the watch tests use it too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acked {
    Granted,
    Released,
    /// A request was sent and not answered: either outcome is allowed.
    InFlight,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_changes_survive_sigkill_at_the_disk_level() {
    changes_survive_sigkill_under_load("disk").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_changes_survive_sigkill_at_the_process_level() {
    changes_survive_sigkill_under_load("process").await;
}

/// Tokens and allocs taken and given back by concurrent clients until the daemon is SIGKILLed;
/// after a restart, everything acknowledged is there, every acknowledged release and free is not,
/// and the counters equal what is held.
async fn changes_survive_sigkill_under_load(durability: &str) {
    let (_dir, data) = data_dir();
    let daemon = Daemon::start(
        &data,
        &["--quota", "crash=100000", "--pool", "crash-pool=cpu=100000", "--durability", durability],
    );
    assert_eq!(daemon.client().health().await.unwrap().durability, durability);
    // A release to a killed daemon is not retried here: the test records it as in flight.
    let client = daemon.client().with_release_retry(Duration::ZERO);
    let leased =
        client.allocate("crash", "leased", &Allocate { ttl_ms: Some(LEASE_MS), ..Allocate::default() }).await.unwrap();
    assert_eq!(leased.status, Status::Granted);
    let lease_started = std::time::Instant::now();

    let acked: Arc<Mutex<HashMap<String, Acked>>> = Arc::default();
    let allocs: Arc<Mutex<HashMap<String, Acked>>> = Arc::default();
    let mut workers = Vec::new();
    for worker in 0..16 {
        let client = client.clone();
        let acked = acked.clone();
        workers.push(tokio::spawn(async move {
            for round in 0.. {
                let token = format!("w{worker}-{round}");
                acked.lock().unwrap().insert(token.clone(), Acked::InFlight);
                match client.allocate("crash", &token, &Allocate::default()).await {
                    Ok(answer) if answer.status == Status::Granted => {
                        acked.lock().unwrap().insert(token.clone(), Acked::Granted)
                    }
                    Ok(answer) => panic!("unexpected answer {answer:?}"),
                    Err(_) => return,
                };
                // Keep one grant in three; release the others.
                if round % 3 == 0 {
                    continue;
                }
                acked.lock().unwrap().insert(token.clone(), Acked::InFlight);
                match client.release("crash", &token, None).await {
                    Ok(answer) => {
                        assert!(answer.released);
                        acked.lock().unwrap().insert(token, Acked::Released);
                    }
                    Err(_) => return,
                }
            }
        }));
    }
    for worker in 0..4 {
        let client = client.clone();
        let allocs = allocs.clone();
        workers.push(tokio::spawn(async move {
            let accept = Accept { min: "cpu=1".into(), owner: Some(format!("p{worker}")), ..Accept::default() };
            for round in 0.. {
                let Ok(offers) = client.offers("crash-pool").await else { return };
                let offer = offers.offers[0].id.clone();
                // An alloc is known only once answered: an accept in flight at the kill may
                // leave one nobody heard of, which the counters below still account for.
                let alloc = match client.accept("crash-pool", &offer, &accept).await {
                    Ok(alloc) => alloc,
                    Err(_) => return,
                };
                allocs.lock().unwrap().insert(alloc.id.clone(), Acked::Granted);
                if round % 3 == 0 {
                    continue;
                }
                allocs.lock().unwrap().insert(alloc.id.clone(), Acked::InFlight);
                match client.free_alloc("crash-pool", &alloc.id).await {
                    Ok(_) => allocs.lock().unwrap().insert(alloc.id, Acked::Released),
                    Err(_) => return,
                };
            }
        }));
    }
    // Killed once under load (wait for it, not for a time).
    let acknowledged = |of: &Arc<Mutex<HashMap<String, Acked>>>| {
        of.lock().unwrap().values().filter(|a| **a != Acked::InFlight).count()
    };
    let loaded = eventually(PATIENCE, async || acknowledged(&acked) > 100 && acknowledged(&allocs) > 20).await;
    assert!(loaded, "the load never reached 100 grants and 20 allocs acknowledged");
    let killed_after = lease_started.elapsed();
    tokio::task::spawn_blocking(move || daemon.kill9()).await.unwrap();
    for worker in workers {
        worker.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    let allocs = allocs.lock().unwrap().clone();
    let n_acked = acked.values().filter(|a| **a != Acked::InFlight).count();
    assert!(n_acked > 100, "too little load before the kill: {n_acked} acknowledged");
    let n_allocs = allocs.values().filter(|a| **a != Acked::InFlight).count();
    assert!(n_allocs > 20, "too little pool load before the kill: {n_allocs} acknowledged");

    stay_down().await;
    let restarted = std::time::Instant::now();
    let daemon = Daemon::start(&data, &["--durability", durability]);
    let client = daemon.client();
    let grants = client.grants("crash").await.unwrap().grants;
    let ran_since = restarted.elapsed();
    let held: HashMap<&str, u64> = grants.iter().map(|g| (g.token.as_str(), g.fencing)).collect();
    for (token, state) in &acked {
        match state {
            Acked::Granted => assert!(held.contains_key(token.as_str()), "acknowledged grant {token} was lost"),
            Acked::Released => assert!(!held.contains_key(token.as_str()), "acknowledged release of {token} was lost"),
            Acked::InFlight => {}
        }
    }
    let mut fencing: Vec<u64> = held.values().copied().collect();
    fencing.sort_unstable();
    fencing.dedup();
    assert_eq!(fencing.len(), held.len(), "fencing numbers must be unique");
    let namespace = client.namespace("crash").await.unwrap();
    assert_eq!(namespace.grants, grants.len() as u64, "the namespace counts the grants it holds");
    assert_eq!(namespace.granted_units, grants.iter().map(|g| g.units).sum::<u64>(), "and their units");

    let live = client.allocs("crash-pool").await.unwrap().allocs;
    let live_ids: Vec<&str> = live.iter().map(|a| a.id.as_str()).collect();
    for (id, state) in &allocs {
        match state {
            Acked::Granted => assert!(live_ids.contains(&id.as_str()), "acknowledged alloc {id} was lost"),
            Acked::Released => assert!(!live_ids.contains(&id.as_str()), "acknowledged free of {id} was lost"),
            Acked::InFlight => {}
        }
    }
    let pool = client.pool("crash-pool").await.unwrap();
    assert_eq!(pool.allocs, live.len() as u64, "the pool counts the allocs it holds");
    assert_eq!(pool.allocated, format!("cpu={}", live.len()), "and what they hold");

    // The lease had about LEASE_MS - killed_after ms left at the kill, less the time the daemon
    // ran since its restart; the clock is checkpointed at least once a second, and the time the
    // daemon was down (DOWNTIME) does not count.
    let leased = grants.iter().find(|g| g.token == "leased").expect("the leased grant survives");
    let left = leased.expires_in_ms.unwrap();
    let at_kill = LEASE_MS - killed_after.as_millis() as u64;
    let had_left = at_kill - ran_since.as_millis() as u64;
    assert!(
        left >= had_left.saturating_sub(300) && left <= at_kill + 1300,
        "had {at_kill} ms left at the kill and ran {ran_since:?} since the restart, resumed with {left}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocs_survive_sigkill_with_the_lease_time_they_had_left_at_the_disk_level() {
    allocs_survive_sigkill_with_the_lease_time_they_had_left("disk").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocs_survive_sigkill_with_the_lease_time_they_had_left_at_the_process_level() {
    allocs_survive_sigkill_with_the_lease_time_they_had_left("process").await;
}

async fn allocs_survive_sigkill_with_the_lease_time_they_had_left(durability: &str) {
    let (_dir, data) = data_dir();
    let args =
        ["--pool", "worker-1=cpu=4", "--alloc-lease", "8s", "--alloc-max-lease", "20s", "--durability", durability];
    let daemon = Daemon::start(&data, &args);
    let client = daemon.client();
    let accept = Accept { min: "cpu=1".into(), owner: Some("me".into()), ..Accept::default() };
    let short = client.accept("worker-1", "1", &accept).await.unwrap();
    let short_left = short.expires_in_ms.unwrap();
    assert!(short_left <= 8_000 && short_left > 7_000, "the configured lease: {short:?}");
    let long = client.accept("worker-1", "1", &accept).await.unwrap();
    let kept = client.keepalive_alloc("worker-1", &long.id, Duration::from_secs(60)).await.unwrap();
    assert_eq!(kept.interval_ms, 20_000, "capped by the configured maximum");
    let kept_at = std::time::Instant::now();
    let freed = client.accept("worker-1", "1", &accept).await.unwrap();
    client.free_alloc("worker-1", &freed.id).await.unwrap();
    let killed_after = kept_at.elapsed();
    tokio::task::spawn_blocking(move || daemon.kill9()).await.unwrap();
    stay_down().await;

    let restarted = std::time::Instant::now();
    let daemon = Daemon::start(&data, &args);
    let client = daemon.client();
    let allocs = client.allocs("worker-1").await.unwrap().allocs;
    let ran_since = restarted.elapsed();
    let mut ids: Vec<&str> = allocs.iter().map(|a| a.id.as_str()).collect();
    ids.sort();
    let mut expected = vec![short.id.as_str(), long.id.as_str()];
    expected.sort();
    assert_eq!(ids, expected, "acknowledged allocs survive; the freed one does not come back");
    // The long lease had 20 s less the time the daemon ran since the keepalive (before the kill
    // and since the restart): the time it was down (DOWNTIME) does not count. The clock resumes
    // from the last record before the kill (the free, or a checkpoint after it), so the lease
    // resumes with at least that (less the keepalive's own answer time: slack under DOWNTIME),
    // and never with more than the 20 s it was given.
    let left = allocs.iter().find(|a| a.id == long.id).unwrap().expires_in_ms.unwrap();
    let had_left = 20_000 - (killed_after + ran_since).as_millis() as i64;
    let slack = DOWNTIME.as_millis() as i64 * 2 / 3;
    assert!((had_left - slack..=20_000).contains(&left), "had about {had_left} ms left, resumed with {left}");
    assert_eq!(client.offers("worker-1").await.unwrap().offers[0].available, "cpu=2");
}
