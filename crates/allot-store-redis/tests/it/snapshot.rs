//! Snapshots across stores: an archive of the embedded store restored into a real Redis, taken
//! again there, and restored into a new data directory. At every step the archive holds the same
//! records, byte for byte once their times are on one clock (the canonical form); and the
//! restored Redis serves them: leases go on, fencing numbers go on above the archive's, a watcher
//! of an older revision lists again.

use std::sync::Arc;
use std::time::Duration;

use allot_core::apps::queues::{QueueLimits, QueuePath};
use allot_core::apps::states::TaskState;
use allot_core::apps::{AppId, AppSpec, SchedulingPolicy, TaskId, TaskSpec, TokenNeed};
use allot_core::pools::{AllocRequest, CordonOrder, PoolName};
use allot_core::watch::Filter;
use allot_core::{AllocateRequest, Constraints, LeaseRequest, NamespaceName, Resources, Scope, Token};
use allot_store::access::{ApiTokenRecord, BindingRecord};
use allot_store::clock::{ManualClock, TimeSource};
use allot_store::embedded::snapshot::{restore, LeaseTime, RestoreOptions, DEFAULT_BUMP_REVISION};
use allot_store::prelude::*;
use allot_store::runs::CachedOutputs;
use allot_store::snapshot::{SnapshotHeader, SnapshotReader, Table};
use allot_store::snapshot_rebase::rebase;
use allot_store::{read_all, Allocation, EmbeddedConfig, EmbeddedStore, Store, WatchError};
use allot_store_redis::apps::lease::LeaseState;
use allot_store_redis::snapshot::RestoreError;
use allot_store_redis::testing::{RedisCluster, RedisServer, TestClock};

use crate::support::until;

fn ns(name: &str) -> NamespaceName {
    NamespaceName::new(name).unwrap()
}

fn res(text: &str) -> Resources {
    text.parse().unwrap()
}

fn grant(namespace: &str, token: &str, lease: LeaseRequest, scope: Option<Scope>) -> AllocateRequest {
    AllocateRequest {
        namespace: ns(namespace),
        token: Token::new(token).unwrap(),
        units: 2,
        constraints: Constraints { project: scope.as_ref().and(Some(50)), namespace: None },
        scope,
        lease,
    }
}

/// Something in every table: grants of every lease kind, a removed namespace's fencing, a
/// session, pools labelled, occupied and cordoned, allocs live and ended, an application whose
/// tasks the scheduler placed (its allocs and tokens), a run, kept outputs, a token, a binding.
async fn fill(store: &EmbeddedStore) -> AppId {
    store.put_namespace(ns("hive"), 100).await.unwrap();
    store.allocate(grant("hive", "plain", LeaseRequest::None, None), Duration::ZERO).await.unwrap();
    let scope = Some(Scope::new("web", "api").unwrap());
    store.allocate(grant("hive", "leased", LeaseRequest::Ttl { ttl_ms: 60_000 }, scope), Duration::ZERO).await.unwrap();
    let session = store.open_session(120_000, Some("ada".into())).await.unwrap().session.id;
    store.allocate(grant("hive", "in-session", LeaseRequest::Session(session), None), Duration::ZERO).await.unwrap();
    store.put_namespace(ns("gone"), 10).await.unwrap();
    store.allocate(grant("gone", "x", LeaseRequest::None, None), Duration::ZERO).await.unwrap();
    store.remove_namespace(ns("gone"), true).await.unwrap();

    let gpu = PoolName::new("gpu").unwrap();
    store.put_pool(gpu.clone(), res("cpu=8,mem=16")).await.unwrap();
    store.label_pool(gpu.clone(), [("zone".to_owned(), "a".to_owned())].into()).await.unwrap();
    store.occupy_pool(gpu.clone(), res("cpu=0.5")).await.unwrap();
    let request = |owner: &str| AllocRequest {
        min: res("cpu=1.25"),
        max: None,
        owner: owner.into(),
        labels: [("job".to_owned(), owner.to_owned())].into(),
        metadata: Some(format!(r#"{{"by":"{owner}","n":[1,2.5,null]}}"#)),
    };
    store.accept(gpu.clone(), request("kept")).await.unwrap();
    let freed = store.accept(gpu.clone(), request("freed")).await.unwrap();
    store.free_alloc(gpu.clone(), freed.id).await.unwrap();
    let old = PoolName::new("old").unwrap();
    store.put_pool(old.clone(), res("cpu=1")).await.unwrap();
    store.cordon_pool(old, CordonOrder::Drain { grace_ms: 30_000 }).await.unwrap();

    let queue = QueuePath::new("root.batch").unwrap();
    store.put_queue(queue.clone(), QueueLimits { max_apps: Some(5), ..Default::default() }).await.unwrap();
    let app = AppId::new("etl").unwrap();
    let spec = AppSpec {
        id: app.clone(),
        queue,
        user: "ada".into(),
        user_groups: vec!["data".into()],
        tags: Default::default(),
        groups: Vec::new(),
        policy: SchedulingPolicy::default(),
        queue_rule: None,
        priority: Default::default(),
    };
    store.add_app(spec).await.unwrap();
    for id in ["t1", "t2"] {
        let task = TaskSpec {
            preemptable: true,
            id: TaskId::new(id).unwrap(),
            resources: res("cpu=2"),
            tokens: vec![TokenNeed { namespace: ns("hive"), units: 3 }],
            group: None,
            priority: Default::default(),
            selector: [("zone".to_owned(), "a".to_owned())].into(),
            spec: format!("{{\"task\":\"{id}\"}}"),
        };
        store.add_task(app.clone(), task).await.unwrap();
    }
    for id in ["t1", "t2"] {
        let task = TaskId::new(id).unwrap();
        until("the scheduler placed the task", async || {
            store.task(app.clone(), task.clone()).await.unwrap().task.state == TaskState::Allocated
        })
        .await;
    }
    let t1 = TaskId::new("t1").unwrap();
    store.put_run(app.clone(), t1.clone(), allot_store::conformance::sample_run()).await.unwrap();
    let outputs = CachedOutputs { outputs: "{\"rows\":3}".into(), app: app.clone(), task: t1, at: 1_700_000_000_000 };
    store.put_cached_outputs("k".repeat(64), outputs).await.unwrap();
    let token = ApiTokenRecord {
        name: "ci".into(),
        hash: format!("sha256:{}", "0".repeat(64)),
        user: "ci-bot".into(),
        groups: vec!["ops".into()],
        created: 1_700_000_000_000,
        expires: Some(1_900_000_000_000),
    };
    store.add_api_token(token).await.unwrap();
    let binding = BindingRecord {
        name: "ops".into(),
        role: "admin".into(),
        users: vec!["ada".into()],
        groups: vec!["ops".into()],
    };
    store.put_binding(binding).await.unwrap();
    app
}

fn fencing(allocation: &Allocation) -> u64 {
    match allocation {
        Allocation::Granted { grant, .. } => grant.grant.fencing,
        refused => panic!("refused: {refused:?}"),
    }
}

/// A record of an archive: its table, key and value.
type Record = (Table, Vec<u8>, Vec<u8>);

/// An archive's header and its records in canonical form: every time moved so that the
/// archive's clock reads one fixed value.
fn canonical(archive: &[u8]) -> (SnapshotHeader, Vec<Record>) {
    const AT: i64 = 1 << 42;
    let mut reader = SnapshotReader::new(archive).unwrap();
    let header = reader.header().clone();
    let shift = AT - header.clock_ms as i64;
    let mut records = Vec::new();
    while let Some((table, key, value)) = reader.next().unwrap() {
        records.push((table, key.to_vec(), rebase(table, key, value, shift).unwrap()));
    }
    (header, records)
}

/// The records of an archive as they are.
fn records(archive: &[u8]) -> Vec<Record> {
    let mut reader = SnapshotReader::new(archive).unwrap();
    let mut records = Vec::new();
    while let Some((table, key, value)) = reader.next().unwrap() {
        records.push((table, key.to_vec(), value.to_vec()));
    }
    records
}

/// An archive of an embedded store [`fill`]ed, taken 10 s later.
async fn filled_archive(config: &EmbeddedConfig, clock: &ManualClock) -> (Vec<u8>, SnapshotHeader, AppId) {
    let embedded = EmbeddedStore::open(config).unwrap();
    let app = fill(&embedded).await;
    clock.advance(Duration::from_millis(10_000));
    let mut archive = Vec::new();
    let (header, _) = embedded.snapshot(&mut archive).unwrap();
    embedded.shutdown().await;
    (archive, header, app)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_archive_moves_embedded_to_redis_to_embedded_and_keeps_every_record() {
    let dirs = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let config = |dir: &str| EmbeddedConfig::new(dirs.path().join(dir)).with_time(Arc::new(clock.clone()));
    let (first, first_header, app) = filled_archive(&config("a"), &clock).await;
    let first_file = dirs.path().join("first.snapshot");
    std::fs::write(&first_file, &first).unwrap();

    // Into Redis, whose clock is far from the embedded store's.
    let server = RedisServer::start();
    let (redis, mut redis_clock) = TestClock::open(&server, 1_800_000_000_000).await;
    let options =
        RestoreOptions { leases: LeaseTime::Resume, bump_revision: DEFAULT_BUMP_REVISION, now_ms: redis_clock.now() };
    let restored = redis.restore(&first_file, &options, false).await.unwrap();
    assert!(restored.first_revision > first_header.revision + DEFAULT_BUMP_REVISION);
    let again = redis.restore(&first_file, &options, false).await;
    assert!(
        matches!(again, Err(RestoreError::NotEmpty { .. })),
        "a Redis that holds allot's state is refused: {again:?}"
    );

    let mut second = Vec::new();
    let (second_header, _) = redis.snapshot_to(&mut second).await.unwrap();
    assert_eq!(second_header.backend, "redis");
    assert_eq!(second_header.clock_ms, redis_clock.now());
    let (_, first_records) = canonical(&first);
    let (_, second_records) = canonical(&second);
    let tables = |records: &[Record]| {
        let mut counts = std::collections::BTreeMap::new();
        for (table, _, _) in records {
            *counts.entry(table.name()).or_insert(0) += 1;
        }
        counts
    };
    assert_eq!(tables(&first_records).len(), Table::ALL.len(), "every table has records: {:?}", tables(&first_records));
    assert_eq!(tables(&second_records), tables(&first_records));
    for (a, b) in first_records.iter().zip(&second_records) {
        assert_eq!(a, b, "the record of table `{}` came back from Redis the same", a.0.name());
    }

    // Back into a new data directory: the same records again, on the same clock as Redis's.
    let second_file = dirs.path().join("second.snapshot");
    std::fs::write(&second_file, &second).unwrap();
    let back_options = RestoreOptions { now_ms: clock.wall_ms(), ..options };
    restore(&second[..], &dirs.path().join("b"), &back_options).unwrap();
    let back = EmbeddedStore::open(&config("b")).unwrap();
    let mut third = Vec::new();
    let (third_header, _) = back.snapshot(&mut third).unwrap();
    assert_eq!(third_header.clock_ms, second_header.clock_ms, "the restored store's clock goes on from the archive's");
    assert_eq!(records(&third), records(&second), "byte for byte");
    assert_eq!(canonical(&third).1, first_records);
    let placed = back.task(app.clone(), TaskId::new("t1").unwrap()).await.unwrap().task;
    assert_eq!(placed.state, TaskState::Allocated, "the placed task is still placed");
    back.shutdown().await;

    // The restored Redis serves: the lease has what it had left, fencing numbers go on above
    // every number the archive holds (of the removed namespace too), and a watcher of an older
    // revision is told to list again.
    let grants = read_all(|page| redis.grants(ns("hive"), page)).await.unwrap();
    let leased = grants.iter().find(|g| g.grant.token.as_str() == "leased").unwrap();
    assert_eq!(leased.expires_in_ms, Some(50_000), "60 s less the 10 s before the snapshot");
    let held_fencing = grants.iter().map(|g| g.grant.fencing).max().unwrap();
    let next = redis.allocate(grant("hive", "after", LeaseRequest::None, None), Duration::ZERO).await.unwrap();
    assert!(fencing(&next) > held_fencing);
    redis.put_namespace(ns("gone"), 10).await.unwrap();
    let gone = redis.allocate(grant("gone", "y", LeaseRequest::None, None), Duration::ZERO).await.unwrap();
    assert!(fencing(&gone) > 1, "the removed namespace's numbers are not given again");
    redis_clock.set(&redis, redis_clock.now() + 50_001).await;
    let grants = read_all(|page| redis.grants(ns("hive"), page)).await.unwrap();
    assert!(grants.iter().all(|g| g.grant.token.as_str() != "leased"), "the lease ran out on Redis's clock");
    let fresh = crate::support::open(&server.url()).await;
    let resumed = fresh.watch(Filter::default(), Some(first_header.revision));
    assert!(matches!(resumed, Err(WatchError::Compacted { .. })), "{:?}", resumed.err());
    fresh.shutdown().await;
    redis.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_archive_writes_nothing_into_redis() {
    let dirs = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let embedded =
        EmbeddedStore::open(&EmbeddedConfig::new(dirs.path().join("a")).with_time(Arc::new(clock.clone()))).unwrap();
    embedded.put_namespace(ns("hive"), 10).await.unwrap();
    embedded.allocate(grant("hive", "plain", LeaseRequest::None, None), Duration::ZERO).await.unwrap();
    let mut archive = Vec::new();
    embedded.snapshot(&mut archive).unwrap();
    embedded.shutdown().await;
    let last = archive.len() - 40;
    archive[last] ^= 0x55;
    let file = dirs.path().join("damaged.snapshot");
    std::fs::write(&file, &archive).unwrap();

    let server = RedisServer::start();
    let redis = crate::support::open(&server.url()).await;
    let options = RestoreOptions { leases: LeaseTime::Expire, bump_revision: 1, now_ms: clock.wall_ms() };
    let refused = redis.restore(&file, &options, false).await;
    assert!(matches!(refused, Err(RestoreError::Snapshot(_))), "{refused:?}");
    let listed = read_all(|page| redis.namespaces(page)).await.unwrap();
    assert!(listed.is_empty(), "nothing was written: {listed:?}");
    redis.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_archive_restores_into_a_redis_cluster_and_comes_back_the_same() {
    let dirs = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let config = EmbeddedConfig::new(dirs.path().join("a")).with_time(Arc::new(clock.clone()));
    let (first, first_header, _) = filled_archive(&config, &clock).await;
    let file = dirs.path().join("first.snapshot");
    std::fs::write(&file, &first).unwrap();

    let cluster = RedisCluster::start(3);
    let redis = crate::support::open(&cluster.address()).await;
    let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let options = RestoreOptions { leases: LeaseTime::Resume, bump_revision: DEFAULT_BUMP_REVISION, now_ms: wall };
    redis.restore(&file, &options, false).await.unwrap();
    // Changed after the restore, on slots of every primary: a restore without `--replace` is
    // refused; with it, what the cluster held is removed from every primary first.
    for name in ["extra-1", "extra-2", "extra-3", "extra-4", "extra-5", "extra-6"] {
        redis.put_namespace(ns(name), 3).await.unwrap();
    }
    redis.put_namespace(ns("hive"), 99).await.unwrap();
    let refused = redis.restore(&file, &options, false).await;
    assert!(matches!(refused, Err(RestoreError::NotEmpty { .. })), "{refused:?}");
    let restored = redis.restore(&file, &options, true).await.unwrap();

    // Taken again slot by slot, across the three primaries: the records the archive held (and
    // none of the later ones), moved onto Redis's clock by what the restore moved them by.
    let mut second = Vec::new();
    redis.snapshot_to(&mut second).await.unwrap();
    let back = first_header.clock_ms as i64 - restored.clock_ms as i64;
    let moved_back: Vec<Record> = records(&second)
        .into_iter()
        .map(|(table, key, value)| {
            let value = rebase(table, &key, &value, back).unwrap();
            (table, key, value)
        })
        .collect();
    assert_eq!(moved_back, records(&first));
    redis.shutdown().await;
}

/// A restore that stops part way (here Redis runs out of memory) leaves its mark: a second
/// restore without `replace` is refused, and one with it starts over and removes the mark. A
/// Redis a daemon uses (the scheduler's lease running) is refused even with `replace`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_stopped_part_way_is_marked_and_one_into_a_redis_in_use_refused() {
    let dirs = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let embedded =
        EmbeddedStore::open(&EmbeddedConfig::new(dirs.path().join("a")).with_time(Arc::new(clock.clone()))).unwrap();
    embedded.put_namespace(ns("hive"), 1_000_000).await.unwrap();
    for i in 0..20_000 {
        embedded
            .allocate(grant("hive", &format!("grant-{i:05}"), LeaseRequest::None, None), Duration::ZERO)
            .await
            .unwrap();
    }
    let file = dirs.path().join("big.snapshot");
    let mut archive = Vec::new();
    embedded.snapshot(&mut archive).unwrap();
    embedded.shutdown().await;
    std::fs::write(&file, &archive).unwrap();

    let server = RedisServer::start();
    let redis = crate::support::open(&server.url()).await;
    let raw = redis::Client::open(server.url()).unwrap();
    let mut raw = raw.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO").arg("memory").query_async(&mut raw).await.unwrap();
    let used: u64 = info.lines().find_map(|l| l.strip_prefix("used_memory:")).unwrap().trim().parse().unwrap();
    // 20,000 grants take megabytes in Redis: this stops the restore within its first calls.
    let _: () =
        redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(used + 256 * 1024).query_async(&mut raw).await.unwrap();
    let options = RestoreOptions { leases: LeaseTime::Resume, bump_revision: 1, now_ms: clock.wall_ms() };
    let stopped = redis.restore(&file, &options, false).await;
    assert!(matches!(stopped, Err(RestoreError::Store(_))), "{stopped:?}");
    assert!(stopped.unwrap_err().to_string().contains("restore again with --replace"));
    let mark = redis.unfinished_restore().await.unwrap();
    assert!(mark.as_deref().is_some_and(|m| m.contains("big.snapshot")), "{mark:?}");
    let _: () = redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(0).query_async(&mut raw).await.unwrap();
    // The stopped restore let go of the scheduler's lease, or, when Redis refused that write too
    // (out of memory), its hold lapses within the restore's TTL.
    let mut again = None;
    until("the stopped restore's hold of the lease ends", async || {
        let tried = redis.restore(&file, &options, false).await;
        let held = matches!(&tried, Err(RestoreError::InUse { holder, .. }) if holder.starts_with("restore "));
        again = Some(tried);
        !held
    })
    .await;
    let again = again.unwrap();
    assert!(
        matches!(&again, Err(RestoreError::NotEmpty { what }) if what == "a restore that did not finish"),
        "{again:?}"
    );
    let restored = redis.restore(&file, &options, true).await.unwrap();
    assert_eq!(restored.summary.count(Table::Grants), 20_000);
    assert_eq!(redis.unfinished_restore().await.unwrap(), None, "the mark is gone once it finished");
    let grants = read_all(|page| redis.grants(ns("hive"), page)).await.unwrap();
    assert_eq!(grants.len(), 20_000);

    let first_term = match redis.acquire_sched_lease("daemon-a", Duration::from_secs(60)).await.unwrap() {
        LeaseState::Mine { fencing, .. } => fencing,
        other => panic!("{other:?}"),
    };
    let in_use = redis.restore(&file, &options, true).await;
    assert!(matches!(&in_use, Err(RestoreError::InUse { holder, .. }) if holder == "daemon-a"), "{in_use:?}");
    // A daemon that does not schedule uses the Redis too: it asked for the lease, within its TTL.
    let held = redis.acquire_sched_lease("daemon-b", Duration::from_secs(60)).await.unwrap();
    assert!(matches!(&held, LeaseState::Held { holder, .. } if holder == "daemon-a"), "{held:?}");
    redis.release_sched_lease("daemon-a").await.unwrap();
    let in_use = redis.restore(&file, &options, true).await;
    assert!(matches!(&in_use, Err(RestoreError::InUse { holder, .. }) if holder == "daemon-b"), "{in_use:?}");
    redis.release_sched_lease("daemon-b").await.unwrap();
    redis.restore(&file, &options, true).await.unwrap();
    // The restore held the lease while it wrote and let it go; its terms count on, through the
    // removal of everything else.
    match redis.acquire_sched_lease("daemon-c", Duration::from_secs(60)).await.unwrap() {
        LeaseState::Mine { fencing, .. } => assert!(fencing > first_term + 1, "{fencing} after {first_term}"),
        other => panic!("the lease is free after a restore: {other:?}"),
    }
    redis.shutdown().await;
}

/// A Redis whose only state is a removed namespace's fencing counter is not empty: a restore over
/// it could give that namespace's numbers again, so it needs `--replace`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_namespaces_fencing_counter_is_state_a_restore_keeps() {
    let dirs = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let embedded =
        EmbeddedStore::open(&EmbeddedConfig::new(dirs.path().join("a")).with_time(Arc::new(clock.clone()))).unwrap();
    embedded.put_namespace(ns("hive"), 10).await.unwrap();
    let mut archive = Vec::new();
    embedded.snapshot(&mut archive).unwrap();
    embedded.shutdown().await;
    let file = dirs.path().join("a.snapshot");
    std::fs::write(&file, &archive).unwrap();

    let server = RedisServer::start();
    let redis = crate::support::open(&server.url()).await;
    redis.put_namespace(ns("gone"), 5).await.unwrap();
    redis.allocate(grant("gone", "t", LeaseRequest::None, None), Duration::ZERO).await.unwrap();
    redis.remove_namespace(ns("gone"), true).await.unwrap();
    let options = RestoreOptions { leases: LeaseTime::Resume, bump_revision: 1, now_ms: clock.wall_ms() };
    let refused = redis.restore(&file, &options, false).await;
    assert!(
        matches!(&refused, Err(RestoreError::NotEmpty { what }) if what.contains("removed namespaces")),
        "{refused:?}"
    );
    redis.restore(&file, &options, true).await.unwrap();
    let listed = read_all(|page| redis.namespaces(page)).await.unwrap();
    assert_eq!(listed.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["hive"]);
    redis.shutdown().await;
}

/// A daemon that finds a restore holding the scheduler's lease (it started while the restore
/// began, past the mark's check) refuses every call from then on, and says why: what it read
/// before is not what the restore writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_that_finds_a_restore_under_way_refuses_every_call() {
    let server = RedisServer::start();
    let restoring = crate::support::open(&server.url()).await;
    let held = restoring.acquire_sched_lease("restore 1@test", Duration::from_secs(60)).await.unwrap();
    assert!(matches!(held, LeaseState::Mine { .. }), "{held:?}");
    let daemon = crate::support::open(&server.url()).await;
    daemon.put_namespace(ns("hive"), 1).await.expect("served before its first ask for the lease");
    daemon.start_scheduling("http://127.0.0.1:9");
    until("the daemon refuses calls", async || daemon.put_namespace(ns("hive"), 2).await.is_err()).await;
    let refused = daemon.allocate(grant("hive", "t", LeaseRequest::None, None), Duration::ZERO).await;
    let Err(allot_store::StoreError::Unavailable(why)) = &refused else { panic!("{refused:?}") };
    assert!(why.contains("restore 1@test") && why.contains("restart"), "{why}");
    assert!(daemon.check_ready().await.is_err(), "not ready either");
    // The restore ending does not make the daemon's state the restored one: it still refuses.
    restoring.release_sched_lease("restore 1@test").await.unwrap();
    assert!(daemon.put_namespace(ns("hive"), 3).await.is_err());
    daemon.shutdown().await;
    restoring.shutdown().await;
}
