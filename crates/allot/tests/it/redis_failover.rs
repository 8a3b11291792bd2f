//! A Redis Cluster failover under load: 3 primaries with a replica each (`appendfsync always`,
//! `cluster-node-timeout 2000`), two daemons, allocate/release through both, one primary killed
//! with SIGKILL, its replica promoted, the killed node back as a replica. Then every acknowledged
//! grant is there, every acknowledged release is not, no namespace ever held more than its quota,
//! and the window in which the affected namespaces were unavailable is printed beside Redis's own
//! failure detection. Run with and without `--redis-min-replicas 1`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use allot_client::{Allocate, Status};
use allot_store_redis::testing::RedisCluster;

use crate::support::{data_dir, eventually, Daemon};

const NAMESPACES: usize = 12;
const QUOTA: u64 = 5;
/// Grants a namespace keeps to the end, to be found there after the failover.
const KEPT: usize = 2;
const WORKERS: usize = 8;

#[derive(Default)]
struct Log {
    /// Per namespace: when calls failed, and when they succeeded.
    failed: BTreeMap<String, Vec<Instant>>,
    succeeded: BTreeMap<String, Vec<Instant>>,
    codes: BTreeMap<String, u64>,
    /// Grants acknowledged and kept to the end, per namespace.
    kept: BTreeMap<String, BTreeSet<String>>,
    released: u64,
}

async fn failover(min_replicas: bool) {
    let cluster = RedisCluster::start_with_replicas(3);
    let victim = (0..cluster.nodes.len()).find(|&i| cluster.is_primary(i)).expect("a primary");
    let successor = cluster.replica_of(victim).expect("the primary has a replica");
    let address = cluster.address();
    let quotas: Vec<String> = (0..NAMESPACES).map(|n| format!("ns-{n}={QUOTA}")).collect();
    let mut args = vec!["--store", address.as_str()];
    for quota in &quotas {
        args.extend(["--quota", quota.as_str()]);
    }
    if min_replicas {
        args.extend(["--redis-min-replicas", "1"]);
    }
    let (_d1, data1) = data_dir();
    let (_d2, data2) = data_dir();
    let daemons = [Daemon::start(&data1, &args), Daemon::start(&data2, &args)];

    let log: Arc<Mutex<Log>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let over_grants = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for worker in 0..WORKERS {
        let (client, log, stop) = (daemons[worker % 2].client(), log.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            let mut round = 0;
            while !stop.load(Ordering::Relaxed) {
                round += 1;
                let namespace = format!("ns-{}", (worker * 7 + round) % NAMESPACES);
                let token = format!("w{worker}-{round}");
                let answer = client.allocate(&namespace, &token, &Allocate::default()).await;
                let mut log_now = |ok: bool| {
                    let mut log = log.lock().unwrap();
                    let times = if ok { &mut log.succeeded } else { &mut log.failed };
                    times.entry(namespace.clone()).or_default().push(Instant::now());
                };
                match answer {
                    Ok(answer) => {
                        log_now(true);
                        if answer.status != Status::Granted {
                            continue;
                        }
                        let mut log = log.lock().unwrap();
                        let kept = log.kept.entry(namespace.clone()).or_default();
                        if round % 10 == 0 && kept.len() < KEPT {
                            kept.insert(token);
                            continue;
                        }
                    }
                    Err(err) => {
                        log_now(false);
                        let code = err.code().unwrap_or("http").to_owned();
                        assert!(
                            code == "store_unavailable" || code == "store_outcome_unknown",
                            "a failover answered {code}: {err}"
                        );
                        *log.lock().unwrap().codes.entry(code).or_default() += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                // Granted, or unknown: released until the release is acknowledged.
                let released = client.release(&namespace, &token, None).await;
                assert!(released.is_ok(), "a release was never acknowledged: {released:?}");
                log.lock().unwrap().released += 1;
            }
        }));
    }
    let poller = {
        let (client, stop, over_grants) = (daemons[0].client(), stop.clone(), over_grants.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                for n in 0..NAMESPACES {
                    if let Ok(view) = client.namespace(&format!("ns-{n}")).await {
                        if view.granted_units > QUOTA {
                            over_grants.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };

    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut cluster = cluster;
    cluster.nodes[victim].stop();
    let killed = Instant::now();
    let promoted = eventually(Duration::from_secs(20), async || cluster.is_primary(successor)).await;
    assert!(promoted, "the replica was never promoted");
    let detection = killed.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.nodes[victim].restart();
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await.unwrap();
    }
    poller.await.unwrap();

    let log = Arc::try_unwrap(log).ok().unwrap().into_inner().unwrap();
    // The unavailability of each affected namespace: from the kill to its first success after
    // its last failure.
    let mut windows = BTreeMap::new();
    for (namespace, failed) in &log.failed {
        let Some(last) = failed.iter().filter(|&&t| t >= killed).max() else { continue };
        let back = log.succeeded.get(namespace).and_then(|s| s.iter().find(|&&t| t > *last).copied());
        let back = back.expect("the namespace came back");
        windows.insert(namespace.clone(), back.duration_since(killed));
    }
    let worst = windows.values().max().copied().unwrap_or_default();
    eprintln!(
        "failover (min replicas: {min_replicas}): Redis promoted the replica {detection:?} after the kill; \
         {} namespaces unavailable, the longest for {worst:?} after the kill ({:?} beyond Redis's detection); \
         errors {:?}; {} releases",
        windows.len(),
        worst.saturating_sub(detection),
        log.codes,
        log.released,
    );
    assert_eq!(over_grants.load(Ordering::Relaxed), 0, "a namespace held more than its quota");
    // Every acknowledged grant kept is there; every acknowledged release is gone.
    let client = daemons[1].client();
    for n in 0..NAMESPACES {
        let namespace = format!("ns-{n}");
        let grants = client.grants(&namespace).await.unwrap().grants;
        let held: BTreeSet<String> = grants.into_iter().map(|g| g.token).collect();
        let kept = log.kept.get(&namespace).cloned().unwrap_or_default();
        assert_eq!(held, kept, "{namespace}: the grants after the failover are not the acknowledged ones");
    }
    assert!(!windows.is_empty(), "the kill affected no namespace");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_killed_under_load_fails_over_and_loses_nothing_acknowledged() {
    failover(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_killed_under_load_with_min_replicas_fails_over_and_loses_nothing_acknowledged() {
    failover(true).await;
}
