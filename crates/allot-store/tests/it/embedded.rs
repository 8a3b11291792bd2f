//! The embedded backend: the conformance suite, restarts, and a disk that fails.

use allot_store::prelude::*;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use allot_core::{AllocateRequest, Constraints, LeaseRequest, NamespaceName, Token};
use allot_store::clock::ManualClock;
use allot_store::fault::open_flaky_store;
use allot_store::{conformance, read_all, Allocation, EmbeddedConfig, EmbeddedStore, Store, StoreError};

use crate::support::until;

pub(crate) fn ns(name: &str) -> NamespaceName {
    NamespaceName::new(name).unwrap()
}

/// A request for one unit of `namespace` under `token`.
pub(crate) fn request(namespace: &str, token: &str, lease: LeaseRequest) -> AllocateRequest {
    AllocateRequest {
        namespace: ns(namespace),
        token: Token::new(token).unwrap(),
        units: 1,
        scope: None,
        constraints: Constraints::default(),
        lease,
    }
}

fn open(dir: &std::path::Path) -> EmbeddedStore {
    EmbeddedStore::open(&EmbeddedConfig::new(dir.to_owned())).unwrap()
}

/// The store in `dir` on `clock`, a clock the test moves by hand.
fn open_on(dir: &std::path::Path, clock: &ManualClock) -> EmbeddedStore {
    EmbeddedStore::open(&EmbeddedConfig::new(dir.to_owned()).with_time(Arc::new(clock.clone()))).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_passes_the_conformance_suite() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let embedded = Arc::new(open_on(dir.path(), &clock));
    let time = conformance::MovedTime { clock, store: embedded.clone() };
    let store: Arc<dyn Store> = embedded;
    conformance::run(store.clone(), &time).await;
    conformance::run_pools(store.clone(), &time).await;
    conformance::run_apps(store.clone(), &time).await;
    conformance::run_runs(store.clone(), &time).await;
    conformance::run_watch(store.clone()).await;
    conformance::run_access(store.clone()).await;
    store.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_survives_a_restart_and_leases_keep_their_remaining_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = open_on(dir.path(), &clock);
    store.put_namespace(ns("hive"), 3).await.unwrap();
    store.allocate(request("hive", "plain", LeaseRequest::None), Duration::ZERO).await.unwrap();
    store.allocate(request("hive", "leased", LeaseRequest::Ttl { ttl_ms: 3000 }), Duration::ZERO).await.unwrap();
    let session = store.open_session(60_000, Some("ada".into())).await.unwrap().session.id;
    store.allocate(request("hive", "in-session", LeaseRequest::Session(session)), Duration::ZERO).await.unwrap();
    store.release(ns("hive"), Token::new("plain").unwrap(), None).await.unwrap();
    clock.advance(Duration::from_millis(1000));
    store.shutdown().await;
    drop(store);

    // The time the daemon is down does not count against the leases.
    clock.advance(Duration::from_millis(1500));
    let store = open_on(dir.path(), &clock);
    let grants = read_all(|page| store.grants(ns("hive"), page)).await.unwrap();
    let tokens: Vec<&str> = grants.iter().map(|g| g.grant.token.as_str()).collect();
    assert_eq!(tokens, ["in-session", "leased"]);
    let leased = &grants[1];
    let left = leased.expires_in_ms.unwrap();
    assert_eq!(left, 2000, "the lease has the 2000 ms it had left");
    let kept = store.session(session).await.unwrap().session;
    assert_eq!((kept.grants.len(), kept.owner.as_deref()), (1, Some("ada")), "the session and its owner are kept");
    let next = store.allocate(request("hive", "next", LeaseRequest::None), Duration::ZERO).await.unwrap();
    let Allocation::Granted { grant, .. } = next else { panic!("{next:?}") };
    // After a clean shutdown, fencing numbers go on exactly where they stopped.
    assert_eq!(grant.grant.fencing, 4);
    store.shutdown().await;
}

/// More grants than the start reads in one batch, over namespaces that straddle the batches:
/// every grant, its lease and its session come back, and the leases still end on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_grants_over_several_namespaces_survive_a_restart_with_their_leases() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    // Handed to the operating system, not synced: what a crash of the process keeps.
    let open_on = |dir: &std::path::Path, clock: &ManualClock| {
        let config = EmbeddedConfig::new(dir.to_owned())
            .with_time(Arc::new(clock.clone()))
            .with_durability(allot_store::Durability::Process);
        EmbeddedStore::open(&config).unwrap()
    };
    let store = open_on(dir.path(), &clock);
    let names = ["a", "b:c", "d"];
    for name in names {
        store.put_namespace(ns(name), 10_000).await.unwrap();
    }
    let session = store.open_session(60_000, None).await.unwrap().session.id;
    for i in 0..20_000 {
        let lease = match i % 4 {
            0 => LeaseRequest::Ttl { ttl_ms: 1000 },
            1 => LeaseRequest::Ttl { ttl_ms: 120_000 },
            2 => LeaseRequest::Session(session),
            _ => LeaseRequest::None,
        };
        let namespace = names[i * names.len() / 20_000];
        store.allocate(request(namespace, &format!("t{i:05}"), lease), Duration::ZERO).await.unwrap();
    }
    let granted = async |store: &EmbeddedStore| {
        let mut units = Vec::new();
        for name in names {
            units.push(store.namespace(ns(name)).await.unwrap().granted_units);
        }
        units
    };
    assert_eq!(granted(&store).await, [6667, 6667, 6666]);
    // No shutdown: what a crash leaves.
    drop(store);

    let store = open_on(dir.path(), &clock);
    assert_eq!(granted(&store).await, [6667, 6667, 6666], "every grant is back");
    assert_eq!(store.session(session).await.unwrap().session.grants.len(), 5000, "and every one in the session");
    clock.advance(Duration::from_millis(1000));
    store.tick().await.unwrap();
    let total: u64 = granted(&store).await.iter().sum();
    assert_eq!(total, 15_000, "the 5,000 grants of 1 s expired, in batches, and no other");
    store.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_numbers_jump_only_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let fencing = |answer: Allocation| match answer {
        Allocation::Granted { grant, .. } => grant.grant.fencing,
        other => panic!("{other:?}"),
    };
    let store = open(dir.path());
    store.put_namespace(ns("hive"), 100).await.unwrap();
    for token in ["a", "b"] {
        store.allocate(request("hive", token, LeaseRequest::None), Duration::ZERO).await.unwrap();
    }
    store.shutdown().await;
    drop(store);
    // Twice in a row: the checkpoint also holds after a restart that granted from a new block.
    for (token, expected) in [("c", 3), ("d", 4)] {
        let store = open(dir.path());
        let answer = store.allocate(request("hive", token, LeaseRequest::None), Duration::ZERO).await.unwrap();
        assert_eq!(fencing(answer), expected, "a clean shutdown keeps numbering exact");
        store.shutdown().await;
    }
    // Without a shutdown (what a crash leaves), numbering continues at the reserved bound.
    let store = open(dir.path());
    store.allocate(request("hive", "e", LeaseRequest::None), Duration::ZERO).await.unwrap();
    drop(store);
    let store = open(dir.path());
    let answer = store.allocate(request("hive", "f", LeaseRequest::None), Duration::ZERO).await.unwrap();
    assert_eq!(fencing(answer), 6 + allot_core::FENCING_BLOCK, "after a crash, numbers jump past the block");
    store.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_disk_gets_a_clear_error_and_keeps_the_state_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (store, faults) = open_flaky_store(dir.path()).unwrap();
    store.put_namespace(ns("hive"), 2).await.unwrap();
    store.allocate(request("hive", "kept", LeaseRequest::None), Duration::ZERO).await.unwrap();

    faults.fail_writes.store(true, Ordering::SeqCst);
    let lost = store.allocate(request("hive", "lost", LeaseRequest::None), Duration::ZERO).await;
    // While the disk is full the database cannot even be reopened (reopening repairs it, which
    // writes), so the outcome of the failed commit is reported as unknown; later calls are refused.
    assert!(
        matches!(&lost, Err(StoreError::Unavailable(reason) | StoreError::OutcomeUnknown(reason)) if reason.contains("no space")),
        "{lost:?}"
    );
    let release = store.release(ns("hive"), Token::new("kept").unwrap(), None).await;
    assert!(matches!(release, Err(StoreError::Unavailable(_) | StoreError::OutcomeUnknown(_))), "{release:?}");

    faults.fail_writes.store(false, Ordering::SeqCst);
    // The state is what was durable: `kept` is still granted, `lost` never was.
    let mut tokens = Vec::new();
    until("the store reads again once the disk works", async || {
        let Ok(grants) = read_all(|page| store.grants(ns("hive"), page)).await else { return false };
        tokens = grants.into_iter().map(|g| g.grant.token.as_str().to_owned()).collect();
        true
    })
    .await;
    assert_eq!(tokens, ["kept"]);
    // And the store works again.
    let granted = store.allocate(request("hive", "after", LeaseRequest::None), Duration::ZERO).await.unwrap();
    assert!(matches!(granted, Allocation::Granted { .. }), "{granted:?}");
    assert!(store.commit_stats().failures >= 1);
    store.shutdown().await;
}

/// A log record as the log frames it: length, checksum, then the record (`seq`, `clock` and a
/// list of ops, here given already encoded), in postcard's encoding.
fn framed_record(seq: u8, ops: &[u8]) -> Vec<u8> {
    // postcard writes integers below 128 as one byte.
    let mut body = vec![seq, 0];
    body.extend_from_slice(ops);
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend(crc32fast::hash(&body).to_le_bytes());
    frame.extend(body);
    frame
}

/// A log written by a newer allot (a record whose kind of op this version does not know, whole
/// and with a good checksum) stops the store from opening, with a clear error, instead of being
/// taken for a torn tail and dropped with everything after it; nothing is changed on disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_from_a_newer_version_is_refused_not_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.put_namespace(ns("hive"), 3).await.unwrap();
    store.allocate(request("hive", "kept", LeaseRequest::None), Duration::ZERO).await.unwrap();
    store.shutdown().await;
    drop(store);

    // A segment after every other: a record with no ops, one with an op of kind 100 (past every
    // kind this version has), then one more record.
    let mut segment = framed_record(100, &[0]);
    segment.extend(framed_record(101, &[1, 100, 0]));
    segment.extend(framed_record(102, &[0]));
    segment.resize(4096, 0);
    let path = dir.path().join("wal").join(format!("{:016x}.wal", u32::MAX));
    std::fs::write(&path, &segment).unwrap();

    for _ in 0..2 {
        let err = EmbeddedStore::open(&EmbeddedConfig::new(dir.path().to_owned())).err().expect("must refuse");
        let message = err.to_string();
        assert!(message.contains("cannot replay the write-ahead log"), "{message}");
        assert!(message.contains("cannot read") && message.contains("newer version"), "{message}");
        assert_eq!(std::fs::read(&path).unwrap(), segment, "the segment is left as it was");
    }
    // Without that segment, the store opens with what it held.
    std::fs::remove_file(&path).unwrap();
    let store = open(dir.path());
    let grants = read_all(|page| store.grants(ns("hive"), page)).await.unwrap();
    assert_eq!(grants.iter().map(|g| g.grant.token.as_str()).collect::<Vec<_>>(), ["kept"]);
    store.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_data_directory_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let err = EmbeddedStore::open(&EmbeddedConfig::new(file.join("data"))).err().expect("must fail");
    assert!(err.to_string().contains("cannot create the data directory"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fsync_is_an_unknown_outcome_that_matches_what_is_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let (store, faults) = open_flaky_store(dir.path()).unwrap();
    store.put_namespace(ns("hive"), 2).await.unwrap();

    // The data reaches the file, only the fsync fails: the answer must not claim that nothing
    // changed, and what is read back afterwards is the rebuilt state.
    faults.fail_syncs.store(true, Ordering::SeqCst);
    let answer = store.allocate(request("hive", "ghost", LeaseRequest::None), Duration::ZERO).await;
    assert!(matches!(answer, Err(StoreError::OutcomeUnknown(_))), "{answer:?}");
    faults.fail_syncs.store(false, Ordering::SeqCst);
    // The store reopens the database as soon as the disk works again.
    let mut grants = None;
    until("the store recovered", async || {
        grants = read_all(|page| store.grants(ns("hive"), page)).await.ok();
        grants.is_some()
    })
    .await;
    let grants = grants.unwrap();
    // An idempotent retry settles it either way.
    let retried = store.allocate(request("hive", "ghost", LeaseRequest::None), Duration::ZERO).await.unwrap();
    let Allocation::Granted { existing, .. } = retried else { panic!("{retried:?}") };
    assert_eq!(existing, grants.len() == 1, "the retry must agree with what was read back: {grants:?}");
    store.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_namespace_removes_grants_with_any_token() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.put_namespace(ns("hive"), 5).await.unwrap();
    store.put_namespace(ns("hive2"), 5).await.unwrap();
    // Tokens that sort above any fixed bound, and a neighbour namespace that must be untouched.
    for token in ["\u{10FFFF}\u{10FFFF}\u{10FFFF}", "zzz", "a"] {
        store.allocate(request("hive", token, LeaseRequest::None), Duration::ZERO).await.unwrap();
    }
    store.allocate(request("hive2", "a", LeaseRequest::None), Duration::ZERO).await.unwrap();
    assert_eq!(store.remove_namespace(ns("hive"), true).await.unwrap(), 3);
    store.shutdown().await;
    drop(store);
    let store = open(dir.path());
    assert!(store.namespace(ns("hive")).await.is_err());
    assert_eq!(read_all(|page| store.grants(ns("hive2"), page)).await.unwrap().len(), 1);
    store.put_namespace(ns("hive"), 5).await.unwrap();
    assert!(
        read_all(|page| store.grants(ns("hive"), page)).await.unwrap().is_empty(),
        "grants of the removed namespace came back"
    );
    store.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pools_cordon_drain_and_occupied_room_survive_a_restart() {
    use allot_core::pools::{CordonOrder, PoolName};
    let dir = tempfile::tempdir().unwrap();
    let pool = PoolName::new("worker-1").unwrap();
    let clock = ManualClock::new();
    let store = open_on(dir.path(), &clock);
    store.put_pool(pool.clone(), "cpu=4".parse().unwrap()).await.unwrap();
    store.occupy_pool(pool.clone(), "cpu=1".parse().unwrap()).await.unwrap();
    let before = store.cordon_pool(pool.clone(), CordonOrder::Drain { grace_ms: 60_000 }).await.unwrap();
    store.shutdown().await;
    drop(store);
    let store = open_on(dir.path(), &clock);
    let after = store.pool(pool.clone()).await.unwrap();
    assert_eq!((after.occupied, after.cordon), (before.occupied, before.cordon));
    assert!(after.cordon.and_then(|c| c.drain_at).is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_and_allocs_survive_a_restart_with_the_lease_time_they_had_left() {
    use allot_core::pools::{AllocRequest, AllocState, PoolName};
    let dir = tempfile::tempdir().unwrap();
    let pool = PoolName::new("worker-1").unwrap();
    let clock = ManualClock::new();
    let store = open_on(dir.path(), &clock);
    store.put_pool(pool.clone(), "cpu=4,mem=8GiB".parse().unwrap()).await.unwrap();
    let request = |min: &str| AllocRequest { min: min.parse().unwrap(), owner: "me".into(), ..AllocRequest::default() };
    let kept = store.accept(pool.clone(), request("cpu=2,mem=4GiB")).await.unwrap();
    let freed = store.accept(pool.clone(), request("cpu=1")).await.unwrap();
    store.free_alloc(pool.clone(), freed.id).await.unwrap();
    let (granted, renewed) = store.keepalive_alloc(pool.clone(), kept.id, 3_000).await.unwrap();
    assert_eq!(granted, 3_000);
    clock.advance(Duration::from_millis(1000));
    store.shutdown().await;
    drop(store);

    // Down for 1.5 s: that time does not count against the lease (unlike Reflow, whose restored
    // allocs came back already expired).
    clock.advance(Duration::from_millis(1500));
    let store = open_on(dir.path(), &clock);
    match store.inspect_alloc(pool.clone(), kept.id).await.unwrap() {
        AllocState::Live(alloc) => {
            assert_eq!(alloc, renewed);
            let left = alloc.expires.saturating_sub(store.now());
            assert_eq!(left, 2000, "the lease has the 2000 ms it had left");
        }
        ended => panic!("{ended:?}"),
    }
    // An ended alloc stays readable across the restart, and says why it ended...
    match store.inspect_alloc(pool.clone(), freed.id).await.unwrap() {
        AllocState::Ended(ended) => assert_eq!(ended.reason, allot_core::pools::EndReason::Freed),
        live => panic!("{live:?}"),
    }
    let offer = store.offer(pool.clone()).await.unwrap().unwrap();
    assert_eq!(offer.available, "cpu=2,mem=4GiB".parse().unwrap());
    // ...until its retention (an hour) is over: then it is gone, after a restart too.
    clock.advance(Duration::from_secs(3601));
    store.tick().await.unwrap();
    let not_found = |answer: Result<AllocState, StoreError>| {
        matches!(answer, Err(StoreError::Pools(allot_core::pools::PoolError::AllocNotFound { .. })))
    };
    assert!(not_found(store.inspect_alloc(pool.clone(), freed.id).await));
    store.shutdown().await;
    drop(store);
    let store = open_on(dir.path(), &clock);
    assert!(not_found(store.inspect_alloc(pool.clone(), freed.id).await), "its record was removed");
    store.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserved_gang_keeps_its_placements_and_its_placeholder_timeout_counts_the_time_the_daemon_was_down() {
    use allot_core::apps::queues::{QueueLimits, QueuePath};
    use allot_core::apps::states::AppState;
    use allot_core::apps::{AppId, AppSpec, GangStyle, GroupName, SchedulingPolicy, TaskGroup};

    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = open_on(dir.path(), &clock);
    let id = AppId::new("gang").unwrap();
    let pool = allot_core::pools::PoolName::new("p").unwrap();
    store.put_pool(pool.clone(), "cpu=8".parse().unwrap()).await.unwrap();
    store.put_queue(QueuePath::new("root.q").unwrap(), QueueLimits::default()).await.unwrap();
    let spec = AppSpec {
        id: id.clone(),
        queue: QueuePath::new("root.q").unwrap(),
        user: "u".into(),
        user_groups: Vec::new(),
        tags: Default::default(),
        groups: vec![TaskGroup {
            name: GroupName::new("g").unwrap(),
            min_members: 3,
            min_resources: "cpu=2".parse().unwrap(),
            selector: Default::default(),
            tokens: Vec::new(),
        }],
        policy: SchedulingPolicy {
            placeholder_timeout_ms: 6000,
            gang: GangStyle::Soft,
            reserve_timeout_ms: None,
            max_parallelism: None,
        },
        queue_rule: None,
        priority: Default::default(),
    };
    let (submitted, _) = store.add_app(spec).await.unwrap();
    assert_eq!(submitted.app.state, AppState::Reserving, "waits for its gang");
    // One scheduling cycle reserves it (the scheduler's own may have done so already).
    store.tick().await.unwrap();
    let before = store.app(id.clone()).await.unwrap().app;
    assert_eq!(before.slots.len(), 3, "the gang was reserved");
    assert_eq!(before.state, AppState::Running, "a gang wholly reserved runs");
    // The clock is made durable at least once a second: after a crash, time since the last
    // checkpoint (under a second) counts as not passed. A sweep 1.3 s on logs it.
    clock.advance(Duration::from_millis(1300));
    store.tick().await.unwrap();
    // A crash: no shutdown. The daemon is down for 2.5 s, which the placeholder timeout counts
    // (wall-clock, as YuniKorn's), unlike the leases of grants and allocs.
    drop(store);
    clock.advance(Duration::from_millis(2500));
    let store = open_on(dir.path(), &clock);
    let after = store.app(id.clone()).await.unwrap().app;
    assert_eq!(after.slots, before.slots, "the same placeholders, on the same allocs");
    assert_eq!(after.state, AppState::Running);
    assert_eq!(store.pool(pool.clone()).await.unwrap().allocs, 3);
    let left = (after.reserved_at.unwrap() + 6000).saturating_sub(store.now());
    assert_eq!(left, 6000 - 1300 - 2500, "the placeholders have what was left, less the time down");
    // They time out when that time is up, not before (Soft: the unused are released, and it
    // goes on).
    clock.advance(Duration::from_millis(left - 100));
    store.tick().await.unwrap();
    assert_eq!(store.pool(pool.clone()).await.unwrap().allocs, 3, "the placeholder timeout ran early");
    clock.advance(Duration::from_millis(100));
    store.tick().await.unwrap();
    assert_eq!(store.app(id.clone()).await.unwrap().app.state, AppState::Running);
    assert_eq!(store.pool(pool).await.unwrap().allocs, 0, "the unused placeholders were released");
    store.shutdown().await;
}

/// A task's run is on disk when `put_run` answers, and comes back whole after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_survive_a_restart() {
    use allot_core::apps::{AppId, TaskId};
    use allot_store::RunStore;

    let dir = tempfile::tempdir().unwrap();
    let (app, task) = (AppId::new("etl").unwrap(), TaskId::new("t1").unwrap());
    let run = conformance::sample_run();
    {
        let store = open(dir.path());
        store.put_run(app.clone(), task.clone(), run.clone()).await.unwrap();
        store.put_run(app.clone(), TaskId::new("gone").unwrap(), run.clone()).await.unwrap();
        store.remove_run(app.clone(), TaskId::new("gone").unwrap()).await.unwrap();
        store.shutdown().await;
    }
    let store = open(dir.path());
    assert_eq!(store.runs().await.unwrap(), [(app, task, run)]);
    store.shutdown().await;
}

/// What a log's recorded events say is durable: per segment, how many appends were written and
/// how many of them a finished sync covered.
#[derive(Default)]
struct LogDurability {
    appended: std::collections::BTreeMap<u64, u64>,
    durable: std::collections::BTreeMap<u64, u64>,
}

impl LogDurability {
    fn see(&mut self, event: allot_store::fault::LogEvent) {
        use allot_store::fault::LogEvent;
        let (counts, segment, count) = match event {
            LogEvent::Append { segment, n } => (&mut self.appended, segment, n),
            LogEvent::SyncEnd { segment, covers } => (&mut self.durable, segment, covers),
            LogEvent::SyncStart { .. } | LogEvent::Created { .. } | LogEvent::SpareMade => return,
        };
        let seen = counts.entry(segment).or_default();
        *seen = (*seen).max(count);
    }

    /// How many appends of `segment` are not durable yet.
    fn unsynced(&self, segment: u64) -> u64 {
        let appended = self.appended.get(&segment).copied().unwrap_or(0);
        appended - self.durable.get(&segment).copied().unwrap_or(0).min(appended)
    }
}

/// At the disk level a later log segment is never synced while an earlier one holds appends that
/// no finished sync covered: a power loss could then keep the later records and lose the earlier
/// ones, and replay, which ends at a gap in the numbers, would drop acknowledged records. The
/// append nobody waits for is the daemon clock's, logged on an idle store; then a checkpoint seals
/// its segment while an allocate is appended to the next one. Syncs are slowed down so that the
/// sealed segment's sync would overlap the allocate's if the store let them run side by side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_log_segment_is_never_synced_before_an_earlier_one() {
    use allot_store::fault::LogEvent;

    let dir = tempfile::tempdir().unwrap();
    // On the machine's clocks: what is checked is how the syncer and the checkpointer threads
    // interleave on their own schedules, which start when the store opens.
    let (store, faults) = open_flaky_store(dir.path()).unwrap();
    let store = Arc::new(store);
    store.put_namespace(ns("hive"), 10).await.unwrap();
    // Idle for over a second: the sweeper logs the daemon clock, and nothing waits for its sync.
    let unsynced = |events: &[LogEvent]| {
        let mut log = LogDurability::default();
        events.iter().for_each(|event| log.see(*event));
        log.appended.keys().any(|segment| log.unsynced(*segment) > 0)
    };
    until("the idle store logged its clock", async || unsynced(&faults.log_events.lock().unwrap())).await;
    *faults.sync_delay.lock().unwrap() = Duration::from_millis(200);
    let seen = faults.log_events.lock().unwrap().len();
    let checkpoint = {
        let store = store.clone();
        tokio::task::spawn_blocking(move || store.checkpoint_now())
    };
    // The allocate comes while the checkpoint's (slowed) sync of the segment it sealed is under
    // way: a sync of an earlier segment that starts after the next one was created.
    until("the checkpoint sealed a segment and syncs it", async || {
        let events = faults.log_events.lock().unwrap();
        let mut created = None;
        events[seen..].iter().any(|event| match *event {
            LogEvent::Created { segment } => {
                created = Some(segment);
                false
            }
            LogEvent::SyncStart { segment } => created.is_some_and(|next| segment < next),
            _ => false,
        })
    })
    .await;
    let granted = store.allocate(request("hive", "after-the-seal", LeaseRequest::None), Duration::ZERO).await.unwrap();
    assert!(matches!(granted, Allocation::Granted { .. }), "{granted:?}");
    checkpoint.await.unwrap().unwrap();

    let events = faults.log_events.lock().unwrap().clone();
    let mut log = LogDurability::default();
    for (at, event) in events.iter().enumerate() {
        if let LogEvent::SyncStart { segment } = *event {
            for &earlier in log.appended.keys().filter(|earlier| **earlier < segment) {
                let unsynced = log.unsynced(earlier);
                assert!(
                    unsynced == 0,
                    "event {at}: segment {segment} is synced while segment {earlier} has {unsynced} of its {} \
                     appends not yet durable: {events:?}",
                    log.appended[&earlier]
                );
            }
        }
        log.see(*event);
    }
    assert!(log.appended.len() >= 2, "the allocate went to the segment after the sealed one: {events:?}");
    store.shutdown().await;
}

/// The API tokens and bindings made through the API outlive a restart, whether the log was
/// folded at a clean shutdown or is replayed after the process stopped without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_tokens_and_bindings_survive_a_restart_with_or_without_a_shutdown() {
    use allot_store::{ApiTokenRecord, BindingRecord};
    let dir = tempfile::tempdir().unwrap();
    let token = ApiTokenRecord {
        name: "ci".into(),
        hash: format!("sha256:{}", "ab".repeat(32)),
        user: "ci-bot".into(),
        groups: vec!["ops".into()],
        created: 5,
        expires: None,
    };
    let binding = BindingRecord { name: "ops".into(), role: "admin".into(), users: vec![], groups: vec!["ops".into()] };
    {
        let store = open(dir.path());
        store.add_api_token(token.clone()).await.unwrap();
        store.put_binding(binding.clone()).await.unwrap();
        // Stopped without a shutdown: the log is replayed at the next open.
        store.crash().await;
    }
    let store = open(dir.path());
    let records = store.access_records().await.unwrap();
    assert_eq!((records.tokens, records.bindings), (vec![token.clone()], vec![binding.clone()]));
    store.revoke_api_token("ci").await.unwrap();
    store.shutdown().await;
    drop(store);
    let store = open(dir.path());
    let records = store.access_records().await.unwrap();
    assert!(records.tokens.is_empty() && records.bindings == vec![binding]);
    store.shutdown().await;
}

/// A burst that fills half of the log's segment gets a spare segment made beside it (by a
/// thread of the store's, off the state lock), so that moving to the next segment renames a file instead
/// of writing and syncing 16 MB of zeros while every caller waits; what was written across the
/// segments reads back after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_full_log_segment_gets_a_spare_made_beside_it() {
    use allot_core::pools::{AllocNotes, AllocRequest, AllocState, PoolName, MAX_ALLOC_METADATA_BYTES};
    use allot_store::fault::LogEvent;

    let dir = tempfile::tempdir().unwrap();
    let (store, faults) = open_flaky_store(dir.path()).unwrap();
    let pool = PoolName::new("big").unwrap();
    store.put_pool(pool.clone(), "cpu=4".parse().unwrap()).await.unwrap();
    let request = AllocRequest { min: "cpu=1".parse().unwrap(), owner: "me".into(), ..AllocRequest::default() };
    let alloc = store.accept(pool.clone(), request).await.unwrap();
    // Each note rewrites the alloc with its metadata (in its record and its event): about twice
    // the metadata's bytes in the log. Half a segment is about 250 of them, unless a checkpoint
    // (every second) starts the next segment first.
    let note = |n: usize| {
        let metadata = format!(r#"{{"n":{n:>8},"x":"{}"}}"#, "y".repeat(MAX_ALLOC_METADATA_BYTES - 30));
        AllocNotes { metadata: Some(Some(metadata)), ..AllocNotes::default() }
    };
    let made = || faults.log_events.lock().unwrap().contains(&LogEvent::SpareMade);
    let store = Arc::new(store);
    let mut written = 0;
    until("a spare log segment is made", async || {
        // Many at once, so that the group commit takes them in a few syncs: half a segment
        // fills within a checkpoint's second however slow the disk's syncs are (one note per
        // sync took more than a second on a slow machine, and never got there).
        let mut notes = tokio::task::JoinSet::new();
        for _ in 0..64 {
            let (store, pool, note) = (store.clone(), pool.clone(), note(written));
            notes.spawn(async move { store.annotate_alloc(pool, alloc.id, note).await.unwrap() });
            written += 1;
        }
        notes.join_all().await;
        made()
    })
    .await;
    // On through the segments after (the next made from the spare, or by a checkpoint).
    let last = 2 * written;
    for n in written..=last {
        store.annotate_alloc(pool.clone(), alloc.id, note(n)).await.unwrap();
    }
    drop(store);
    let (store, _) = open_flaky_store(dir.path()).unwrap();
    match store.inspect_alloc(pool.clone(), alloc.id).await.unwrap() {
        AllocState::Live(kept) => assert_eq!(kept.metadata, note(last).metadata.unwrap(), "the last note reads back"),
        ended => panic!("the alloc ended: {ended:?}"),
    }
    store.shutdown().await;
}
