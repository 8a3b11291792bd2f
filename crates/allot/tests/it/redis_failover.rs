//! A Redis Cluster failover under load: 3 primaries with a replica each (`appendfsync always`,
//! `cluster-node-timeout 2000`), two daemons, allocate/release through both, the replication
//! link of one primary cut (its replica's process stopped, `CLIENT KILL TYPE replica`) a few
//! dozen answers before that primary is killed with SIGKILL, its replica promoted, the killed node back
//! as a replica. From every answer: no change answered "nothing was changed" is found made by its
//! retry, no fencing number is given twice; then every acknowledged grant is there and every
//! acknowledged release is not (without `--redis-min-replicas`, except changes acknowledged after
//! the cut: Redis's documented loss), no namespace ever held more than its quota, and the window
//! in which the affected namespaces were unavailable is printed beside Redis's own failure
//! detection. Run with and without `--redis-min-replicas 1`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use allot_client::{Allocate, Status};
use allot_store_redis::testing::RedisCluster;

use crate::support::{data_dir, eventually, pause, Daemon, PATIENCE};

const NAMESPACES: usize = 12;
const QUOTA: u64 = 5;
/// Grants a namespace keeps to the end, to be found there after the failover.
const KEPT: usize = 2;
const WORKERS: usize = 8;

/// Per namespace: when each read answered, and whether it succeeded.
type Probes = BTreeMap<String, Vec<(Instant, bool)>>;

#[derive(Default)]
struct Log {
    codes: BTreeMap<String, u64>,
    /// Grants acknowledged and kept to the end, per namespace.
    kept: BTreeMap<String, BTreeSet<String>>,
    released: u64,
    /// Per namespace, every fencing number answered and the token it was given to.
    fencing: BTreeMap<String, BTreeMap<u64, String>>,
    /// Fencing numbers answered for two tokens.
    given_twice: Vec<(String, u64, String, String)>,
    /// Changes answered "nothing was changed" that their retry found made.
    /// Changes answered "nothing was changed" that their retry found made, and when the grant a
    /// release was for was acknowledged: without `--redis-min-replicas`, a grant acknowledged
    /// after the cut may be lost with the primary, and its release then finds nothing (Redis's
    /// documented loss, not a false answer).
    untrue: Vec<(String, Option<Instant>)>,
    /// When each change was acknowledged: a kept grant, or a release (by token).
    acked: BTreeMap<String, Instant>,
}

impl Log {
    /// Notes a granted answer's fencing number.
    fn granted(&mut self, namespace: &str, token: &str, answer: &allot_client::AllocateResponse) {
        let Some(grant) = &answer.grant else { return };
        let given = self.fencing.entry(namespace.to_owned()).or_default();
        match given.get(&grant.fencing) {
            Some(other) if other != token => {
                self.given_twice.push((namespace.to_owned(), grant.fencing, other.clone(), token.to_owned()))
            }
            _ => {
                given.insert(grant.fencing, token.to_owned());
            }
        }
    }
}

/// Whether an answer says the change was not made.
fn nothing_changed(err: &allot_client::ClientError) -> bool {
    err.code().is_some_and(nothing_changed_code)
}

/// Whether an error code says the change was not made.
fn nothing_changed_code(code: &str) -> bool {
    matches!(code, "store_unavailable" | "not_enough_replicas")
}

/// Two daemons on `cluster` (plus `extra` flags), with namespaces `<prefix>-0..` of `quota`:
/// their temporary directories, data directories (the logs are beside them) and the daemons.
async fn two_daemons(
    cluster: &RedisCluster,
    prefix: &str,
    quota: u64,
    extra: &[&str],
) -> ([tempfile::TempDir; 2], [std::path::PathBuf; 2], [Daemon; 2]) {
    let address = cluster.address();
    let quotas: Vec<String> = (0..NAMESPACES).map(|n| format!("{prefix}-{n}={quota}")).collect();
    let mut args = vec!["--store", address.as_str()];
    for quota in &quotas {
        args.extend(["--quota", quota.as_str()]);
    }
    args.extend(extra);
    let ((d1, data1), (d2, data2)) = (data_dir(), data_dir());
    let daemons = [Daemon::start(&data1, &args), Daemon::start(&data2, &args)];
    // What the daemons seeded (the namespaces) is on every replica before a test kills a primary:
    // replication is asynchronous, and a namespace a replica never got is gone after promotion.
    replicated(cluster).await;
    ([d1, d2], [data1, data2], daemons)
}

/// Waits until every replica has applied everything its primary had written when called.
async fn replicated(cluster: &RedisCluster) {
    let offset = |node: usize| {
        let info = cluster.nodes[node].cli(&["INFO", "replication"]);
        let field = info.lines().find_map(|l| l.strip_prefix("master_repl_offset:")).map(str::trim);
        field.and_then(|f| f.parse::<u64>().ok()).unwrap_or(0)
    };
    for primary in (0..cluster.nodes.len()).filter(|&i| cluster.is_primary(i)) {
        let Some(replica) = cluster.replica_of(primary) else { continue };
        let written = offset(primary);
        let caught_up = eventually(PATIENCE, async || offset(replica) >= written).await;
        assert!(caught_up, "the replica of node {primary} never caught up with it");
    }
}

/// A client that answers the daemon's 503s as given, without its own retries (of a call the
/// store could not take, or of a release): the test counts them and times the unavailability by
/// them.
fn answers_as_given(daemon: &Daemon) -> allot_client::Client {
    daemon.client().with_unavailable_retry(0, Duration::ZERO).with_release_retry(Duration::ZERO)
}

/// Counts a failed call's code: what a failover may answer (`not_enough_replicas` only with
/// `--redis-min-replicas`, from the promoted primary until a replica attaches).
fn count(log: &Mutex<Log>, err: &allot_client::ClientError, min_replicas: bool) {
    let code = err.code().unwrap_or("http").to_owned();
    let expected = ["store_unavailable", "store_outcome_unknown"].contains(&code.as_str())
        || (min_replicas && code == "not_enough_replicas");
    assert!(expected, "a failover answered {code}: {err}");
    *log.lock().unwrap().codes.entry(code).or_default() += 1;
}

async fn failover(min_replicas: bool) {
    let cluster = RedisCluster::start_with_replicas(3);
    let victim = (0..cluster.nodes.len()).find(|&i| cluster.is_primary(i)).expect("a primary");
    let successor = cluster.replica_of(victim).expect("the primary has a replica");
    let extra: &[&str] = if min_replicas { &["--redis-min-replicas", "1"] } else { &[] };
    let (_dirs, [data1, data2], daemons) = two_daemons(&cluster, "ns", QUOTA, extra).await;

    let log: Arc<Mutex<Log>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let over_grants = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for worker in 0..WORKERS {
        let (client, log, stop) = (answers_as_given(&daemons[worker % 2]), log.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            let mut round = 0;
            while !stop.load(Ordering::Relaxed) {
                round += 1;
                let namespace = format!("ns-{}", (worker * 7 + round) % NAMESPACES);
                let token = format!("w{worker}-{round}");
                let mut answer = client.allocate(&namespace, &token, &Allocate::default()).await;
                // "Nothing was changed" must be true: the same call again does not find it made.
                let mut granted_surely = true;
                let started = Instant::now();
                while let Err(err) = &answer {
                    count(&log, err, min_replicas);
                    if !nothing_changed(err) {
                        granted_surely = false;
                        break;
                    }
                    assert!(started.elapsed() < PATIENCE, "{namespace}/{token} never answered: {err}");
                    pause().await;
                    answer = client.allocate(&namespace, &token, &Allocate::default()).await;
                    if let Ok(again) = &answer {
                        if again.existing {
                            log.lock().unwrap().untrue.push((format!("allocate {namespace}/{token}"), None));
                        }
                    }
                }
                let granted_at = Instant::now();
                if let Ok(answer) = &answer {
                    if answer.status != Status::Granted {
                        continue;
                    }
                    let mut log = log.lock().unwrap();
                    log.granted(&namespace, &token, answer);
                    let kept = log.kept.entry(namespace.clone()).or_default();
                    if round % 10 == 0 && kept.len() < KEPT {
                        kept.insert(token.clone());
                        log.acked.insert(token, Instant::now());
                        continue;
                    }
                }
                // Granted, or unknown: released until the release is acknowledged (a shard
                // short of replicas refuses it until one is attached again).
                let started = Instant::now();
                // The codes of the failed tries: if each said "nothing was changed", the grant
                // must still be there to release.
                let mut refused: Vec<String> = Vec::new();
                loop {
                    match client.release(&namespace, &token, None).await {
                        Ok(released) => {
                            let mut log = log.lock().unwrap();
                            let only_refused =
                                !refused.is_empty() && refused.iter().all(|code| nothing_changed_code(code));
                            if only_refused && granted_surely && !released.released {
                                let what = format!("release {namespace}/{token} (answered {refused:?})");
                                log.untrue.push((what, Some(granted_at)));
                            }
                            log.acked.insert(token.clone(), Instant::now());
                            break;
                        }
                        Err(err) if started.elapsed() < PATIENCE => {
                            count(&log, &err, min_replicas);
                            refused.push(err.code().unwrap_or("http").to_owned());
                            pause().await;
                        }
                        Err(err) => panic!("a release was never acknowledged: {err}"),
                    }
                }
                log.lock().unwrap().released += 1;
            }
        }));
    }
    // Every namespace read every 20 ms through the first daemon: when it answers, and that it
    // never holds more than its quota.
    let probes: Arc<Mutex<Probes>> = Arc::default();
    let prober = {
        let (client, stop, over_grants, probes) =
            (answers_as_given(&daemons[0]), stop.clone(), over_grants.clone(), probes.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let mut reads = tokio::task::JoinSet::new();
                for n in 0..NAMESPACES {
                    let client = client.clone();
                    reads.spawn(async move {
                        let namespace = format!("ns-{n}");
                        let view = client.namespace(&namespace).await;
                        (namespace, Instant::now(), view)
                    });
                }
                while let Some(read) = reads.join_next().await {
                    let (namespace, at, view) = read.unwrap();
                    if let Ok(view) = &view {
                        if view.granted_units > QUOTA {
                            over_grants.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    probes.lock().unwrap().entry(namespace).or_default().push((at, view.is_ok()));
                }
                pause().await;
            }
        })
    };
    // Changes acknowledged from `since` on.
    let acked_since = |since: Instant| log.lock().unwrap().acked.values().filter(|at| **at >= since).count();
    // Calls answered so far, acknowledged or refused (with `--redis-min-replicas` a shard short of
    // replicas refuses its changes, and its workers retry them).
    let answered = || {
        let log = log.lock().unwrap();
        log.acked.len() as u64 + log.codes.values().sum::<u64>()
    };

    // Under load before the cut (wait for it, not for a time): every namespace holds the grants
    // it keeps to the end, and many were released.
    let loaded = eventually(PATIENCE, async || {
        let log = log.lock().unwrap();
        log.released >= 100
            && (0..NAMESPACES).all(|n| log.kept.get(&format!("ns-{n}")).is_some_and(|k| k.len() == KEPT))
    })
    .await;
    assert!(loaded, "the load never kept {KEPT} grants in every namespace and released 100");
    let mut cluster = cluster;
    let lines_before: Vec<usize> = [&data1, &data2]
        .iter()
        .map(|data| std::fs::read_to_string(data.with_extension("log")).unwrap_or_default().lines().count())
        .collect();
    // The replication link cut half a second before the kill, as a failover that loses the last
    // writes: the replica's process stopped, the primary drops it, writes go on, the primary
    // dies, the replica goes on. (With `--redis-min-replicas 1` the primary refuses changes from
    // the cut on.)
    let info = cluster.nodes[successor].cli(&["INFO", "server"]);
    let pid = info.lines().find_map(|l| l.strip_prefix("process_id:")).expect("a process id").trim().to_owned();
    let signal = |sig: &str| assert!(std::process::Command::new("kill").args([sig, &pid]).status().unwrap().success());
    // From here on a write may not reach the replica: one made before the stop can still sit in
    // the primary's replication buffer when the link is cut.
    let cut = Instant::now();
    signal("-STOP");
    cluster.nodes[victim].cli(&["CLIENT", "KILL", "TYPE", "replica"]);
    // Writes go on after the cut (wait for them, not for a time).
    let at_cut = answered();
    let went_on = eventually(PATIENCE, async || answered() >= at_cut + 30).await;
    assert!(went_on, "no writes were answered after the cut");
    cluster.nodes[victim].stop();
    let killed = Instant::now();
    signal("-CONT");
    let promoted = eventually(PATIENCE, async || cluster.is_primary(successor)).await;
    assert!(promoted, "the replica was never promoted");
    let detection = killed.elapsed();
    // The load goes on against the promoted replica before the killed node is back (wait for
    // it, not for a time): every namespace answers a read again, and changes are acknowledged.
    let promoted_at = Instant::now();
    let at_promotion = answered();
    let served = eventually(PATIENCE, async || {
        let probes = probes.lock().unwrap();
        let back = (0..NAMESPACES).all(|n| {
            probes.get(&format!("ns-{n}")).and_then(|p| p.last()).is_some_and(|(at, ok)| *ok && *at >= promoted_at)
        });
        back && answered() >= at_promotion + 30
    })
    .await;
    let behind: Vec<(usize, Option<(Instant, bool)>)> = (0..NAMESPACES)
        .map(|n| (n, probes.lock().unwrap().get(&format!("ns-{n}")).and_then(|p| p.last().copied())))
        .filter(|(_, last)| !last.is_some_and(|(at, ok)| ok && at >= promoted_at))
        .collect();
    assert!(
        served,
        "the namespaces were not served again after the promotion: {} calls answered since, namespaces \
         not read since: {behind:?}; errors {:?}",
        answered() - at_promotion,
        log.lock().unwrap().codes
    );
    cluster.nodes[victim].restart();
    let rejoined = killed.elapsed();
    // And once the killed node replicates the promoted one (with `--redis-min-replicas`, the
    // shard takes changes again).
    let replicates = eventually(PATIENCE, async || cluster.replica_of(successor) == Some(victim)).await;
    assert!(replicates, "the killed node never came back as a replica");
    let replicating = Instant::now();
    let went_on = eventually(PATIENCE, async || acked_since(replicating) >= 30).await;
    assert!(went_on, "no changes were acknowledged after the killed node came back");
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await.unwrap();
    }
    prober.await.unwrap();

    let log = Arc::try_unwrap(log).ok().unwrap().into_inner().unwrap();
    // The unavailability of each affected namespace, as its probes saw it: from its first failed
    // read after the kill to the first read that answered after its last failed one.
    let mut windows = BTreeMap::new();
    for (namespace, probes) in probes.lock().unwrap().iter() {
        let after: Vec<&(Instant, bool)> = probes.iter().filter(|(at, _)| *at >= killed).collect();
        let Some(first) = after.iter().find(|(_, ok)| !ok) else { continue };
        let last = after.iter().rev().find(|(_, ok)| !ok).expect("a failed read");
        let back = after.iter().find(|(at, ok)| *ok && at > &last.0).expect("the namespace came back");
        windows.insert(namespace.clone(), (first.0.duration_since(killed), back.0.duration_since(killed)));
    }
    let worst = windows.values().map(|(_, back)| *back).max().unwrap_or_default();
    eprintln!(
        "failover (min replicas: {min_replicas}): Redis promoted the replica {detection:?} after the kill; \
         {} namespaces unavailable (from, until after the kill: {windows:?}), the last back {worst:?} after \
         the kill ({:?} beyond Redis's detection); the killed node back as a replica {rejoined:?} after the kill; errors {:?}; {} releases",
        windows.len(),
        worst.saturating_sub(detection),
        log.codes,
        log.released,
    );
    assert_eq!(over_grants.load(Ordering::Relaxed), 0, "a namespace held more than its quota");
    // No change answered "nothing was changed" was made; no fencing number was given twice.
    let untrue: Vec<&String> = log
        .untrue
        .iter()
        .filter(|(_, granted_at)| min_replicas || !granted_at.is_some_and(|at| at >= cut))
        .map(|(what, _)| what)
        .collect();
    assert!(untrue.is_empty(), "answered \"nothing was changed\" and made: {untrue:?}");
    assert!(log.given_twice.is_empty(), "fencing numbers given twice: {:?}", log.given_twice);
    // Every acknowledged grant kept is there; every acknowledged release is gone. Without
    // replicas required, what the README promises: only changes acknowledged in the last moment
    // before the primary died (here, after the link was cut) may be lost.
    let client = daemons[1].client();
    let mut lost = Vec::new();
    for n in 0..NAMESPACES {
        let namespace = format!("ns-{n}");
        let grants = client.grants(&namespace).await.unwrap().grants;
        let held: BTreeSet<String> = grants.into_iter().map(|g| g.token).collect();
        let kept = log.kept.get(&namespace).cloned().unwrap_or_default();
        for token in held.symmetric_difference(&kept) {
            let at = log.acked.get(token).copied();
            // No upper bound: a write the primary made just before it died can be answered to
            // the client after `killed` was taken; a write after the promotion is kept.
            let late = at.is_some_and(|at| at >= cut);
            assert!(
                !min_replicas && late,
                "{namespace}/{token}: an acknowledged change was lost (acknowledged {at:?})"
            );
            lost.push(format!("{namespace}/{token}"));
        }
    }
    eprintln!("changes acknowledged after the cut and lost with the primary: {lost:?}");
    assert!(!windows.is_empty(), "the kill affected no namespace");
    // Each daemon logs the failover as a few lines, not one per failed call.
    for (data, before) in [&data1, &data2].into_iter().zip(lines_before) {
        let log = std::fs::read_to_string(data.with_extension("log")).unwrap_or_default();
        let failover: Vec<&str> = log.lines().skip(before).collect();
        eprintln!("a daemon logged the failover in {} lines:\n{}", failover.len(), failover.join("\n"));
        assert!(failover.len() <= 12, "{} lines for one failover", failover.len());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_killed_under_load_fails_over_and_loses_nothing_acknowledged() {
    failover(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_killed_under_load_with_min_replicas_fails_over_and_loses_nothing_acknowledged() {
    failover(true).await;
}

/// How long after a release through one daemon a call waiting through the other gets the grant,
/// once per namespace and round: the times, sorted. Every wait is granted: with the daemons'
/// checks without a message an hour apart (`--redis-wake-poll 1h`), only the wake-up message (or
/// the check a new subscription makes) can end it before its 30 s run out.
async fn wake_times(holder: &allot_client::Client, waiter: &allot_client::Client, rounds: usize) -> Vec<Duration> {
    let mut times = Vec::new();
    for round in 0..rounds {
        for n in 0..NAMESPACES {
            let namespace = format!("wake-{n}");
            let held = holder.allocate(&namespace, &format!("holder-{round}"), &Allocate::default()).await.unwrap();
            assert_eq!(held.status, Status::Granted);
            let waiting = {
                let (waiter, namespace) = (waiter.clone(), namespace.clone());
                let wait = Allocate { wait_ms: Some(30_000), ..Allocate::default() };
                tokio::spawn(async move {
                    let answer = waiter.allocate(&namespace, &format!("waiter-{round}"), &wait).await.unwrap();
                    (answer.status, Instant::now())
                })
            };
            let queued =
                eventually(PATIENCE, async || holder.namespace(&namespace).await.is_ok_and(|view| view.waiters == 1))
                    .await;
            assert!(queued, "the waiter never queued in {namespace}");
            holder.release(&namespace, &format!("holder-{round}"), None).await.unwrap();
            let released = Instant::now();
            let (status, granted) = waiting.await.unwrap();
            assert_eq!(status, Status::Granted, "{namespace}: the waiter was not woken by the release");
            times.push(granted.saturating_duration_since(released));
            waiter.release(&namespace, &format!("waiter-{round}"), None).await.unwrap();
        }
    }
    times.sort();
    times
}

fn p99(times: &[Duration]) -> Duration {
    times[(times.len() * 99).div_ceil(100) - 1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wake_ups_cross_daemons_while_a_node_is_down_the_first_listed_or_a_replica() {
    let mut cluster = RedisCluster::start_with_replicas(3);
    // The first node of --store: the one the wake-ups used to hang on.
    assert!(cluster.is_primary(0), "redis-cli makes the first nodes primaries");
    let successor = cluster.replica_of(0).expect("the first node has a replica");
    let (_dirs, datas, daemons) = two_daemons(&cluster, "wake", 1, &["--redis-wake-poll", "1h"]).await;
    let (holder, waiter) = (daemons[0].client(), daemons[1].client());
    let before = wake_times(&holder, &waiter, 2).await;

    cluster.nodes[0].stop();
    let promoted = eventually(PATIENCE, async || cluster.is_primary(successor)).await;
    assert!(promoted, "the replica was never promoted");
    // How soon is measured in the failover test above (printed), not asserted.
    let following = eventually(PATIENCE, async || {
        let mut all = true;
        for n in 0..NAMESPACES {
            all &= holder.namespace(&format!("wake-{n}")).await.is_ok();
            all &= waiter.namespace(&format!("wake-{n}")).await.is_ok();
        }
        all
    })
    .await;
    if !following {
        for n in 0..NAMESPACES {
            eprintln!("holder {n}: {:?}", holder.namespace(&format!("wake-{n}")).await.map(|_| ()));
            eprintln!("waiter {n}: {:?}", waiter.namespace(&format!("wake-{n}")).await.map(|_| ()));
        }
        for data in &datas {
            eprintln!(
                "LOG {}:\n{}",
                data.display(),
                std::fs::read_to_string(data.with_extension("log")).unwrap_or_default()
            );
        }
    }
    assert!(following, "the daemons never reached the promoted replica");
    let down = wake_times(&holder, &waiter, 5).await;
    eprintln!(
        "cross-daemon wake over {} namespaces: before the kill p50 {:?} p99 {:?} max {:?}; \
         with the first node down ({} wakes) p50 {:?} p99 {:?} max {:?}",
        NAMESPACES,
        before[before.len() / 2],
        p99(&before),
        before.last().unwrap(),
        down.len(),
        down[down.len() / 2],
        p99(&down),
        down.last().unwrap(),
    );

    // Back as a replica; then a replica down instead (of another primary).
    cluster.nodes[0].restart();
    let other = (1..cluster.nodes.len()).find(|&i| cluster.is_primary(i)).expect("another primary");
    let replica = cluster.replica_of(other).expect("it has a replica");
    cluster.nodes[replica].stop();
    let replica_down = wake_times(&holder, &waiter, 2).await;
    eprintln!(
        "with a replica down ({} wakes) p50 {:?} p99 {:?} max {:?}",
        replica_down.len(),
        replica_down[replica_down.len() / 2],
        p99(&replica_down),
        replica_down.last().unwrap(),
    );
}
