//! `--redis-min-replicas`: a change is acknowledged only once that many replicas have it
//! (`WAIT`); when they do not confirm it in time, the answer is an unknown outcome, never a
//! success; on a primary with fewer replicas attached, a change is refused before it is applied,
//! at once (`NotEnoughReplicas`), and other primaries are not slowed.

use allot_store::prelude::*;
use std::time::{Duration, Instant};

use allot_core::{AllocateRequest, NamespaceName};
use allot_store::StoreError;
use allot_store_redis::testing::RedisServer;
use allot_store_redis::{RedisConfig, RedisStore};

use crate::support::{request, until};

/// Starts a replica of `primary` and waits until the primary counts it.
async fn replica_of(primary: &RedisServer) -> RedisServer {
    // Redis waits 5 s by default before it sends the first copy, for more replicas to join.
    primary.cli(&["CONFIG", "SET", "repl-diskless-sync-delay", "0"]);
    let replica = RedisServer::start();
    replica.cli(&["REPLICAOF", "127.0.0.1", &primary.port.to_string()]);
    // Attached as the store counts it: online, and acknowledging (a replica whose first
    // acknowledgement is late under load shows a lag; the store does not count it yet).
    let attached = |info: &str| {
        info.lines().filter(|line| line.starts_with("slave")).any(|line| {
            let lag =
                line.split(',').find_map(|field| field.strip_prefix("lag=")).and_then(|n| n.trim().parse::<i64>().ok());
            // `lag=-1`: acknowledged this very second (see `a_replica_that_has_just_acknowledged_...`).
            line.contains("state=online") && lag.is_some_and(|lag| lag <= 1)
        })
    };
    until("the primary counts its replica attached", async || attached(&primary.cli(&["INFO", "replication"]))).await;
    replica
}

async fn open(primary: &RedisServer, min_replicas: u32) -> RedisStore {
    let config = RedisConfig::parse(&primary.url()).unwrap().with_min_replicas(min_replicas);
    RedisStore::open(&config).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_is_acknowledged_once_its_replicas_have_it_and_unknown_when_they_do_not() {
    let primary = RedisServer::start();
    let mut replica = replica_of(&primary).await;
    let store = open(&primary, 1).await;
    // The first change waits, if it must, until Redis counts the replica attached.
    until("the first change is acknowledged with its replica", async || {
        match store.put_namespace(NamespaceName::new("replicated").unwrap(), 100).await {
            Ok(_) => true,
            Err(StoreError::NotEnoughReplicas(why)) => {
                eprintln!("not yet: {why}");
                false
            }
            Err(err) => panic!("{err}"),
        }
    })
    .await;
    for i in 0..50 {
        let token = format!("t{i}");
        // Acknowledged at once: an attached replica is never refused (see the next test).
        store.allocate(request("replicated", &token), Duration::ZERO).await.unwrap();
        // Acknowledged means the replica has it already.
        let held = replica.cli(&["HEXISTS", "allot:{replicated}:grants", &token]);
        assert_eq!(held.trim(), "1", "grant {token} acknowledged before the replica had it");
    }

    // One replica fewer attached than required: refused at once, before anything is written.
    let two = open(&primary, 2).await;
    let answer = two.allocate(request("replicated", "needs-two"), Duration::ZERO).await;
    let Err(err @ StoreError::NotEnoughReplicas(_)) = &answer else {
        panic!("a change on a primary with 1 of 2 replicas answered {answer:?}")
    };
    let message = err.to_string();
    assert!(message.contains("has 1 of the 2 replicas") && message.contains("nothing was changed"), "{message}");
    // Not WAIT's timeout: `NotEnoughReplicas` answers the check made before the write (a change
    // written and not confirmed in time is `OutcomeUnknown`), and nothing of it was applied.
    let held = primary.cli(&["HEXISTS", "allot:{replicated}:grants", "needs-two"]);
    assert_eq!(held.trim(), "0", "a refused change was applied");

    // Attached, but not confirming in time (its process stopped): applied on the primary, and
    // unknown.
    let pid = pid_of(&replica);
    signal(&pid, "-STOP");
    let started = Instant::now();
    let answer = store.allocate(request("replicated", "late"), Duration::ZERO).await;
    signal(&pid, "-CONT");
    let Err(err @ StoreError::OutcomeUnknown(_)) = &answer else {
        panic!("a change its replica did not confirm answered {answer:?}")
    };
    let message = err.to_string();
    // Unknown either way: WAIT's answer that the replica did not confirm, or, on a loaded machine,
    // the client's own timeout on the answer coming first.
    let waited = message.contains("0 of the 1 replicas") && message.contains("--redis-min-replicas");
    assert!(waited || message.contains("no answer within the timeout"), "{message}");
    assert!(started.elapsed() >= Duration::from_millis(900), "WAIT gave up after {:?}", started.elapsed());

    // The replica gone: refused before it is applied. Once the primary has seen it go: until
    // then the change is applied and waits for it, unknown (a loaded machine showed that race).
    replica.stop();
    until("the primary no longer counts its replica", async || {
        !primary.cli(&["INFO", "replication"]).contains("state=online")
    })
    .await;
    let answer = store.allocate(request("replicated", "alone"), Duration::ZERO).await;
    assert!(matches!(answer, Err(StoreError::NotEnoughReplicas(_))), "{answer:?}");
    let held = primary.cli(&["HEXISTS", "allot:{replicated}:grants", "alone"]);
    assert_eq!(held.trim(), "0", "a refused change was applied");

    // Without the option, the primary's answer is enough.
    let unreplicated = open(&primary, 0).await;
    unreplicated.allocate(request("replicated", "primary-only"), Duration::ZERO).await.unwrap();
    store.shutdown().await;
    two.shutdown().await;
    unreplicated.shutdown().await;
}

/// Right after a change's `WAIT`, Redis's `INFO` shows the replica that has just acknowledged
/// it with `lag=-1` for the first few milliseconds of each second (it subtracts the time of the
/// acknowledgement, from the precise clock, from the coarse clock's second, a tick behind): that
/// replica is attached, and no change is refused. Changes are made across several turns of the
/// wall clock's second, each a window in which the misreading came (1 change in ~300).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_has_just_acknowledged_counts_as_attached() {
    let primary = RedisServer::start();
    let _replica = replica_of(&primary).await;
    let store = open(&primary, 1).await;
    let namespace = NamespaceName::new("just-acknowledged").unwrap();
    let second = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let (mut turns, mut last, mut changes) = (0, second(), 0u64);
    while turns < 3 {
        changes += 1;
        if let Err(err) = store.put_namespace(namespace.clone(), changes).await {
            panic!("change {changes} on a primary with its replica attached: {err}");
        }
        if second() != last {
            (turns, last) = (turns + 1, second());
        }
    }
    eprintln!("{changes} changes acknowledged over {turns} turns of the second");
    store.shutdown().await;
}

/// On a Redis Cluster, a primary whose replica is gone refuses the changes of its slots at once,
/// before applying them; the other primaries go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_without_its_replica_refuses_changes_at_once_and_the_others_go_on() {
    let mut cluster = allot_store_redis::testing::RedisCluster::start_with_replicas(3);
    let victim = (0..cluster.nodes.len()).find(|&i| cluster.is_primary(i)).expect("a primary");
    let replica = cluster.replica_of(victim).expect("it has a replica");
    let config = RedisConfig::parse(&cluster.address()).unwrap().with_min_replicas(1);
    let store = RedisStore::open(&config).await.unwrap();
    let namespaces: Vec<NamespaceName> = (0..12).map(|n| NamespaceName::new(&format!("shard-{n}")).unwrap()).collect();
    for namespace in &namespaces {
        store.put_namespace(namespace.clone(), 10).await.unwrap();
    }
    cluster.nodes[replica].stop();
    let primary = &cluster.nodes[victim];
    until("the primary no longer counts its replica", async || {
        !primary.cli(&["INFO", "replication"]).contains("state=online")
    })
    .await;
    let (mut refused, mut granted) = (0, 0);
    for namespace in &namespaces {
        let request = AllocateRequest { namespace: namespace.clone(), ..request("replicated", "after") };
        match store.allocate(request, Duration::ZERO).await {
            Ok(_) => granted += 1,
            // At once: `NotEnoughReplicas` is the answer of the check made before the write (a
            // change written and then not replicated in time is `OutcomeUnknown`), and nothing
            // of it is on the primary.
            Err(err @ StoreError::NotEnoughReplicas(_)) => {
                refused += 1;
                assert!(err.to_string().contains(&format!("port {}", primary.port)), "{err}");
                let key = format!("allot:{{{namespace}}}:grants");
                assert_eq!(primary.cli(&["HEXISTS", &key, "after"]).trim(), "0", "{namespace}: refused, yet applied");
            }
            Err(other) => panic!("{namespace}: {other:?}"),
        }
    }
    assert!(refused > 0 && granted > 0, "{refused} refused, {granted} granted");
    store.shutdown().await;
}

/// The process id of a server.
fn pid_of(server: &RedisServer) -> String {
    let info = server.cli(&["INFO", "server"]);
    info.lines().find_map(|l| l.strip_prefix("process_id:")).unwrap().trim().to_owned()
}

fn signal(pid: &str, sig: &str) {
    assert!(std::process::Command::new("kill").args([sig, pid]).status().unwrap().success());
}

/// Cuts the replication link as a failover that loses the last writes: the replica's process
/// stopped (`kill -STOP`), the primary drops it. Answers the replica's pid, to go on with
/// `signal(&pid, "-CONT")`.
fn cut_replication(primary: &RedisServer, replica: &RedisServer) -> String {
    let pid = pid_of(replica);
    signal(&pid, "-STOP");
    primary.cli(&["CLIENT", "KILL", "TYPE", "replica"]);
    pid
}

/// The fencing number a store gave `token`, if granted.
async fn fencing_of(store: &RedisStore, token: &str) -> u64 {
    match store.allocate(request("replicated", token), Duration::ZERO).await.unwrap() {
        allot_store::Allocation::Granted { grant, .. } => grant.grant.fencing,
        other => panic!("{token}: {other:?}"),
    }
}

/// Without `--redis-min-replicas`, a replica promoted without the primary's last writes has lost
/// them (Redis's documented caveat), but the fencing numbers it gives continue above any its
/// predecessor gave: none is handed out twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_numbers_never_go_back_when_a_promoted_replica_lost_the_last_writes() {
    let mut primary = RedisServer::start();
    let replica = replica_of(&primary).await;
    let store = open(&primary, 0).await;
    store.put_namespace(NamespaceName::new("replicated").unwrap(), 100).await.unwrap();
    for i in 0..5 {
        fencing_of(&store, &format!("kept-{i}")).await;
    }
    until("the replica got the first grants", async || {
        replica.cli(&["HEXISTS", "allot:{replicated}:grants", "kept-4"]).trim() == "1"
    })
    .await;
    // The replication link cut (the replica's process stopped), writes go on, the primary dies.
    let pid = cut_replication(&primary, &replica);
    let mut given = Vec::new();
    for i in 0..10 {
        given.push(fencing_of(&store, &format!("lost-{i}")).await);
    }
    store.shutdown().await;
    primary.stop();
    signal(&pid, "-CONT");
    replica.cli(&["REPLICAOF", "NO", "ONE"]);
    assert_eq!(
        replica.cli(&["HEXISTS", "allot:{replicated}:grants", "lost-9"]).trim(),
        "0",
        "the last writes are lost"
    );
    let promoted = open(&replica, 0).await;
    let after = fencing_of(&promoted, "after").await;
    let highest = *given.iter().max().unwrap();
    assert!(
        after > highest,
        "fencing number {after} given again after a failover (the lost primary gave up to {highest})"
    );
    let next = fencing_of(&promoted, "next").await;
    assert_eq!(next, after + 1, "then one by one");
    let view = promoted.namespace(NamespaceName::new("replicated").unwrap()).await.unwrap();
    assert_eq!(view.stats.granted, 7, "grants made, the numbers passed over not counted: {view:?}");
    promoted.shutdown().await;
}

/// Waits until `store`'s feed has read at least `revision`.
async fn read_up_to(store: &RedisStore, revision: u64) {
    until(&format!("the feed reached revision {revision}"), async || store.revision() >= revision).await;
}

/// The change feed's revisions never go back either: a promoted replica that lacks the last
/// copies into the log gives revisions above any its predecessor gave, and a watcher resuming
/// from one of those is told to list again (`Compacted`), never handed other events under them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feed_revisions_never_go_back_when_a_promoted_replica_lost_the_last_copies() {
    let mut primary = RedisServer::start();
    let replica = replica_of(&primary).await;
    let store = open(&primary, 0).await;
    store.put_namespace(NamespaceName::new("replicated").unwrap(), 100).await.unwrap();
    for i in 0..5 {
        fencing_of(&store, &format!("kept-{i}")).await;
    }
    read_up_to(&store, 6).await;
    until("the replica got the first copies", async || {
        replica.cli(&["HGET", "allot:{allot-feed}:meta", "rev"]).trim() == "6"
    })
    .await;
    // The replication link cut, more changes copied into the log, the primary dies.
    let pid = cut_replication(&primary, &replica);
    for i in 0..10 {
        fencing_of(&store, &format!("lost-{i}")).await;
    }
    read_up_to(&store, 16).await;
    let highest = store.revision();
    store.shutdown().await;
    primary.stop();
    signal(&pid, "-CONT");
    replica.cli(&["REPLICAOF", "NO", "ONE"]);
    assert_eq!(replica.cli(&["HGET", "allot:{allot-feed}:meta", "rev"]).trim(), "6", "the last copies are lost");
    let promoted = open(&replica, 0).await;
    fencing_of(&promoted, "after").await;
    until(&format!("a revision above {highest} after the failover"), async || promoted.revision() > highest).await;
    let resumed = promoted.watch(allot_core::watch::Filter::default(), Some(highest));
    assert!(
        matches!(resumed, Err(allot_store::WatchError::Compacted { .. })),
        "a watcher resuming from a revision the failover lost must list again: {:?}",
        resumed.map(|_| ())
    );
    promoted.shutdown().await;
}

/// Two failovers, the second losing the first one's numbers: primary A fails over to B, whose
/// replica C is cut off before B gives its first numbers; B dies and C is promoted. C knows only
/// A's numbers: with the next multiple of 2^32 of its counter as its start, it gave B's numbers
/// again (found by `allot-sim --redis`, seed 4). Its start is a floor from its clock, above them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_numbers_never_go_back_across_two_failovers_when_the_second_loses_the_first_ones_numbers() {
    let mut a = RedisServer::start();
    let mut b = replica_of(&a).await;
    let store = open(&a, 0).await;
    store.put_namespace(NamespaceName::new("replicated").unwrap(), 100).await.unwrap();
    for i in 0..3 {
        fencing_of(&store, &format!("a-{i}")).await;
    }
    until("B has A's grants", async || b.cli(&["HEXISTS", "allot:{replicated}:grants", "a-2"]).trim() == "1").await;
    store.shutdown().await;
    a.stop();
    b.cli(&["REPLICAOF", "NO", "ONE"]);
    let c = replica_of(&b).await;
    until("C has B's copy of A's grants", async || {
        c.cli(&["HEXISTS", "allot:{replicated}:grants", "a-2"]).trim() == "1"
    })
    .await;
    let pid = cut_replication(&b, &c);
    let on_b = open(&b, 0).await;
    let mut given = Vec::new();
    for i in 0..5 {
        given.push(fencing_of(&on_b, &format!("b-{i}")).await);
    }
    on_b.shutdown().await;
    b.stop();
    signal(&pid, "-CONT");
    c.cli(&["REPLICAOF", "NO", "ONE"]);
    assert_eq!(c.cli(&["HEXISTS", "allot:{replicated}:grants", "b-0"]).trim(), "0", "B's numbers are lost");
    let on_c = open(&c, 0).await;
    let after = fencing_of(&on_c, "c-0").await;
    let highest = *given.iter().max().unwrap();
    assert!(
        after > highest,
        "fencing number {after} after two failovers; B, whose writes C lost, gave up to {highest}"
    );
    on_c.shutdown().await;
}

/// The feed's revisions across the same two failovers: C, lacking B's copies into the log, gives
/// revisions above B's, and a watcher resuming from one of B's is told to list again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feed_revisions_never_go_back_across_two_failovers_when_the_second_loses_the_first_ones_copies() {
    let mut a = RedisServer::start();
    let mut b = replica_of(&a).await;
    let store = open(&a, 0).await;
    store.put_namespace(NamespaceName::new("replicated").unwrap(), 100).await.unwrap();
    fencing_of(&store, "a-0").await;
    read_up_to(&store, 2).await;
    until("B has A's copies", async || b.cli(&["HGET", "allot:{allot-feed}:meta", "rev"]).trim() == "2").await;
    store.shutdown().await;
    a.stop();
    b.cli(&["REPLICAOF", "NO", "ONE"]);
    let c = replica_of(&b).await;
    until("C has them too", async || c.cli(&["HGET", "allot:{allot-feed}:meta", "rev"]).trim() == "2").await;
    let pid = cut_replication(&b, &c);
    let on_b = open(&b, 0).await;
    for i in 0..5 {
        fencing_of(&on_b, &format!("b-{i}")).await;
    }
    until("B copied its events", async || on_b.revision() > 2).await;
    let seen_on_b = on_b.revision();
    on_b.shutdown().await;
    b.stop();
    signal(&pid, "-CONT");
    c.cli(&["REPLICAOF", "NO", "ONE"]);
    let on_c = open(&c, 0).await;
    fencing_of(&on_c, "c-0").await;
    until(&format!("a revision above B's {seen_on_b}"), async || on_c.revision() > seen_on_b).await;
    let resumed = on_c.watch(allot_core::watch::Filter::default(), Some(seen_on_b));
    assert!(
        matches!(resumed, Err(allot_store::WatchError::Compacted { .. })),
        "a watcher resuming from B's revision {seen_on_b} must list again: {:?}",
        resumed.map(|_| ())
    );
    on_c.shutdown().await;
}

/// A namespace whose first numbers a failover lost: the promoted replica knows the namespace but
/// no number of it, and gave number 1 again (found by `allot-sim --redis`, seed 1020). A
/// namespace notes the primary it was made on, so a grant on another one moves to the floor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespaces_first_numbers_are_not_given_again_when_a_failover_lost_them() {
    let mut primary = RedisServer::start();
    let replica = replica_of(&primary).await;
    let store = open(&primary, 0).await;
    store.put_namespace(NamespaceName::new("replicated").unwrap(), 100).await.unwrap();
    until("the replica has the namespace", async || replica.cli(&["EXISTS", "allot:{replicated}:ns"]).trim() == "1")
        .await;
    let pid = cut_replication(&primary, &replica);
    let first = fencing_of(&store, "lost").await;
    store.shutdown().await;
    primary.stop();
    signal(&pid, "-CONT");
    replica.cli(&["REPLICAOF", "NO", "ONE"]);
    let promoted = open(&replica, 0).await;
    let after = fencing_of(&promoted, "after").await;
    assert!(after > first, "fencing number {after} after a failover that lost the namespace's first, {first}");
    promoted.shutdown().await;
}

/// A log whose first copies a failover lost: the first daemon's open notes its primary in the
/// log, so the promoted replica, which has that note and no copy, starts its revisions above the
/// lost ones instead of at 1 again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feed_revisions_are_not_given_again_when_a_failover_lost_the_logs_first_copies() {
    let mut primary = RedisServer::start();
    let replica = replica_of(&primary).await;
    let store = open(&primary, 0).await;
    until("the replica has the log's note", async || {
        replica.cli(&["HEXISTS", "allot:{allot-feed}:meta", "rev_by"]).trim() == "1"
    })
    .await;
    let pid = cut_replication(&primary, &replica);
    store.put_namespace(NamespaceName::new("replicated").unwrap(), 100).await.unwrap();
    fencing_of(&store, "lost").await;
    read_up_to(&store, 2).await;
    let lost = store.revision();
    store.shutdown().await;
    primary.stop();
    signal(&pid, "-CONT");
    replica.cli(&["REPLICAOF", "NO", "ONE"]);
    let promoted = open(&replica, 0).await;
    promoted.put_namespace(NamespaceName::new("replicated").unwrap(), 100).await.unwrap();
    until(&format!("a revision above the lost {lost}"), async || promoted.revision() > lost).await;
    let resumed = promoted.watch(allot_core::watch::Filter::default(), Some(lost));
    assert!(
        matches!(resumed, Err(allot_store::WatchError::Compacted { .. })),
        "a watcher resuming from the lost revision {lost} must list again: {:?}",
        resumed.map(|_| ())
    );
    promoted.shutdown().await;
}

/// The scheduler's lease across a failover that lost its last term: D1's term, given while the
/// replica was cut off, is lost; the promoted replica's next term must be above it, or D1 (which
/// learns it was deposed only at its next renewal) and the new scheduler would write under one
/// number, both accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_term_lost_in_a_failover_is_not_given_again() {
    use allot_store_redis::apps::lease::LeaseState;
    let mut primary = RedisServer::start();
    let replica = replica_of(&primary).await;
    let store = open(&primary, 0).await;
    let short = Duration::from_millis(300);
    let Ok(LeaseState::Mine { fencing: first, .. }) = store.acquire_sched_lease("d0", short).await else {
        panic!("d0 takes the first term")
    };
    until("the replica has the first term", async || {
        replica.cli(&["HGET", "allot:{allot-apps}:lease", "fencing"]).trim() == first.to_string()
    })
    .await;
    let pid = cut_replication(&primary, &replica);
    store.release_sched_lease("d0").await.unwrap();
    let Ok(LeaseState::Mine { fencing: lost, .. }) = store.acquire_sched_lease("d1", Duration::from_secs(60)).await
    else {
        panic!("d1 takes the next term")
    };
    store.shutdown().await;
    primary.stop();
    signal(&pid, "-CONT");
    replica.cli(&["REPLICAOF", "NO", "ONE"]);
    let promoted = open(&replica, 0).await;
    // d0's term, as the replica has it, runs out; then d2 takes the lease.
    let mut taken = 0;
    until("d2 takes the lease", async || {
        match promoted.acquire_sched_lease("d2", Duration::from_secs(60)).await.unwrap() {
            LeaseState::Mine { fencing, .. } => taken = fencing,
            LeaseState::Held { .. } => {}
        }
        taken > 0
    })
    .await;
    assert!(taken > lost, "d2's term {taken} after a failover that lost d1's term {lost}");
    promoted.shutdown().await;
}

/// The access part's version across a failover that lost its last change: a daemon that read
/// the lost version must see the promoted replica's next change as a move (it compares for
/// equality), not as the version it has, or it keeps tokens and bindings since changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_access_version_lost_in_a_failover_is_not_given_again() {
    use allot_store::access::BindingRecord;
    let binding = |name: &str| BindingRecord {
        name: name.to_owned(),
        role: "viewer".to_owned(),
        users: vec!["someone".to_owned()],
        groups: Vec::new(),
    };
    let mut primary = RedisServer::start();
    let replica = replica_of(&primary).await;
    let store = open(&primary, 0).await;
    store.put_binding(binding("kept")).await.unwrap();
    let kept = store.access_version().await.unwrap();
    until("the replica has the first change", async || {
        replica.cli(&["GET", "allot:{allot-access}:version"]).trim() == kept.to_string()
    })
    .await;
    let pid = cut_replication(&primary, &replica);
    store.put_binding(binding("lost")).await.unwrap();
    let lost = store.access_version().await.unwrap();
    store.shutdown().await;
    primary.stop();
    signal(&pid, "-CONT");
    replica.cli(&["REPLICAOF", "NO", "ONE"]);
    let promoted = open(&replica, 0).await;
    promoted.put_binding(binding("after")).await.unwrap();
    let after = promoted.access_version().await.unwrap();
    assert_ne!(after, lost, "the version after the failover is the one its lost change gave");
    promoted.shutdown().await;
}

/// How many function calls the primary has run.
fn fcalls(primary: &RedisServer) -> u64 {
    let stats = primary.cli(&["INFO", "commandstats"]);
    let line = stats.lines().find(|line| line.starts_with("cmdstat_fcall:")).unwrap_or_default();
    line.split(['=', ',']).nth(1).and_then(|calls| calls.parse().ok()).unwrap_or(0)
}

/// A waiting allocate whose primary loses its replica (at `--redis-min-replicas 1`) keeps
/// waiting while its checks for an answer are refused, and is granted once the replica is back
/// and room is made. (It used to end with the refusal and leave its waiter in the queue, to be
/// handed units nobody would hold: the Redis-shaped simulation's waiting allocates found it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_allocate_keeps_waiting_while_its_primary_lacks_its_replica() {
    use std::sync::Arc;

    use allot_store::{Allocation, PageRequest};

    let primary = RedisServer::start();
    let replica = replica_of(&primary).await;
    let config =
        RedisConfig::parse(&primary.url()).unwrap().with_min_replicas(1).with_wake_poll(Duration::from_millis(5));
    let store = Arc::new(RedisStore::open(&config).await.unwrap());
    let namespace = NamespaceName::new("replicated").unwrap();
    until("the namespace is made with its replica", async || store.put_namespace(namespace.clone(), 1).await.is_ok())
        .await;
    let first = store.allocate(request("replicated", "first"), Duration::ZERO).await.unwrap();
    assert!(matches!(first, Allocation::Granted { .. }), "{first:?}");
    let waiting = tokio::spawn({
        let store = store.clone();
        async move { store.allocate(request("replicated", "second"), Duration::from_secs(120)).await }
    });
    until("the second waits", async || {
        store.waiters(namespace.clone(), PageRequest::first(10)).await.is_ok_and(|page| page.items.len() == 1)
    })
    .await;
    // Cut: every check of the waiting call (one each 5 ms, among the daemon's other calls) is
    // refused for lack of a replica.
    let before = fcalls(&primary);
    let pid = cut_replication(&primary, &replica);
    until("the primary refused many calls since", async || fcalls(&primary) >= before + 60).await;
    assert!(!waiting.is_finished(), "the waiting call still waits: {:?}", waiting.await);
    signal(&pid, "-CONT");
    until("the first is released once the replica is back", async || {
        store.release(namespace.clone(), allot_core::Token::new("first").unwrap(), None).await.is_ok()
    })
    .await;
    let second = waiting.await.unwrap().unwrap();
    assert!(matches!(second, Allocation::Granted { .. }), "{second:?}");
    store.shutdown().await;
}

/// At `--redis-min-replicas 1`, an executor's lease renewed while its primary has no replica is
/// answered as not replicated, and renewed on the primary all the same (its pools were): a
/// replica's outage does not let the lease lapse, which would make whoever schedules take the
/// executor's pools as lost. (Before, the renewal stopped at its pools' write and the lease ran
/// out: the Redis-shaped simulator's seed 20433 saw a task failed for it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executors_lease_renewed_while_its_primary_lacks_its_replica_stays_live_there() {
    use allot_core::pools::PoolName;

    let primary = RedisServer::start();
    let replica = replica_of(&primary).await;
    let config = RedisConfig::parse(&primary.url()).unwrap().with_min_replicas(1);
    let store = RedisStore::open(&config).await.unwrap();
    let pools = [PoolName::new("gpu").unwrap()];
    let types = ["shell".to_owned()];
    let key = "allot:{allot-runs}:executor:node-a";
    until("the lease is taken with its replica", async || {
        store.renew_executor("node-a", &pools, &types, Duration::from_secs(5)).await.is_ok()
    })
    .await;
    let pid = cut_replication(&primary, &replica);
    until("the primary lists no replica", async || {
        primary.cli(&["INFO", "replication"]).contains("connected_slaves:0")
    })
    .await;
    let renewed = store.renew_executor("node-a", &pools, &types, Duration::from_secs(600)).await;
    assert!(matches!(renewed, Err(StoreError::OutcomeUnknown(_))), "not replicated: {renewed:?}");
    let left_ms: i64 = primary.cli(&["PTTL", key]).trim().parse().unwrap();
    assert!(left_ms > 5_000, "the lease was renewed on the primary for 600 s: {left_ms} ms left");
    let leases = store.executors().await.unwrap();
    assert!(leases.iter().any(|lease| lease.node == "node-a" && lease.live), "{leases:?}");
    signal(&pid, "-CONT");
    store.shutdown().await;
}
