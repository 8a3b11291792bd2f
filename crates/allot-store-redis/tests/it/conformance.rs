//! The shared conformance suite against a real `redis-server`, and against a real three-primary
//! Redis Cluster.
//!
//! On one server the functions read a [`TestClock`], which the suite moves where it moves time;
//! a cluster (whose functions read Redis's `TIME`: the test clock's key would be in another slot)
//! and Redis's own key expiries (executors' leases, `SET PX`) wait the time out.

use allot_store::prelude::*;
use std::sync::Arc;
use std::time::Duration;

use allot_store::conformance::{self, Time, WaitedTime};
use allot_store::Store;
use allot_store_redis::testing::{RedisCluster, RedisServer, TestClock};
use allot_store_redis::{RedisConfig, RedisStore};

use crate::support::{self, until};

/// Takes part in the scheduler's election, alone, and waits until this store schedules.
async fn schedule_here(store: &RedisStore) {
    store.start_scheduling("http://127.0.0.1:9");
    until("the only daemon became the scheduler", async || store.apps_home() == allot_store::AppsHome::Here).await;
}

/// The time of a store on one server: its functions' test clock, moved by the suite; each move
/// sweeps at once, as the store's sweeper would at that time.
struct MovedRedisTime {
    clock: tokio::sync::Mutex<TestClock>,
    store: Arc<RedisStore>,
}

#[async_trait::async_trait]
impl Time for MovedRedisTime {
    async fn advance(&self, by: Duration) {
        let mut clock = self.clock.lock().await;
        let now = clock.now() + by.as_millis() as u64;
        clock.set(&self.store, now).await;
    }
}

/// The whole suite, every part, on `store`, whose time `time` moves. The executors' leases are
/// Redis key expiries, on Redis's own clock: `run_runs` waits them out.
async fn conformance_on(store: Arc<RedisStore>, time: &dyn Time) {
    conformance::run(store.clone(), time).await;
    conformance::run_pools(store.clone(), time).await;
    schedule_here(&store).await;
    conformance::run_apps(store.clone(), time).await;
    conformance::run_runs(store.clone(), &WaitedTime).await;
    conformance::run_watch(store.clone()).await;
    conformance::run_access(store.clone()).await;
    store.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_on_one_redis_server() {
    let server = RedisServer::start();
    let start = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let (store, clock) = TestClock::open(&server, start).await;
    let store = Arc::new(store);
    let time = MovedRedisTime { clock: tokio::sync::Mutex::new(clock), store: store.clone() };
    conformance_on(store, &time).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_on_a_three_primary_cluster() {
    let cluster = RedisCluster::start(3);
    conformance_on(Arc::new(support::open(&cluster.address()).await), &WaitedTime).await;
}

/// A server that refuses the function library (here: a user without FUNCTION) is an error at
/// once, with the reason, not a wait that never ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_refuses_the_library_fails_at_once() {
    let server = RedisServer::start();
    server.cli(&["ACL", "SETUSER", "limited", "on", ">secret", "~*", "&*", "+@all", "-function"]);
    let url = format!("redis://limited:secret@127.0.0.1:{}", server.port);
    let opened =
        tokio::time::timeout(std::time::Duration::from_secs(10), RedisStore::open(&RedisConfig::parse(&url).unwrap()))
            .await
            .expect("open answers at once");
    let Err(err) = opened else { panic!("a user without FUNCTION must not open the store") };
    let message = err.to_string();
    assert!(message.contains("refused allot's function library") && message.contains("no permissions"), "{message}");
}

/// Daemons of an earlier version list namespaces and pools only in a set; the ordered index that
/// pages read is rebuilt from it when the two differ.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_listed_only_by_an_earlier_version_are_paged() {
    use allot_core::pools::PoolName;
    use allot_core::NamespaceName;
    use allot_store::{read_all, PageRequest};

    let server = RedisServer::start();
    let store = support::open(&server.url()).await;
    for name in ["b", "a", "c"] {
        store.put_namespace(NamespaceName::new(name).unwrap(), 1).await.unwrap();
        store.put_pool(PoolName::new(name).unwrap(), "cpu=1".parse().unwrap()).await.unwrap();
    }
    // As an earlier version leaves them: the sets, no index.
    server.cli(&["DEL", "allot:{allot-registry}:namespaces:by-name", "allot:{allot-registry}:pools:by-name"]);
    let page = store.namespaces(PageRequest::first(2)).await.unwrap();
    let names: Vec<&str> = page.items.iter().map(|v| v.name.as_str()).collect();
    assert_eq!((names, page.next.as_ref().map(NamespaceName::as_str)), (vec!["a", "b"], Some("b")));
    let pools = read_all(|page| store.pools(page)).await.unwrap();
    assert_eq!(pools.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["a", "b", "c"]);
    store.shutdown().await;
}

/// Runs kept by an earlier version are in the runs' hash only: the sets of runs by application
/// are built from it when a daemon opens the store, so that they too go with their application.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_kept_by_an_earlier_version_go_with_their_application() {
    use allot_core::apps::{AppId, TaskId, TaskSpec};
    use allot_core::runs::{PhaseInfo, RetryPolicy, Run, StateWrite, Transition};
    use allot_store::records::runs::RunRecord;

    let server = RedisServer::start();
    let mut ended = Run::new(1);
    let done = Transition::ephemeral(PhaseInfo::success("done"));
    ended.after_round(Ok((done, StateWrite::Unchanged)), RetryPolicy::default(), 2);
    ended.attempt_finalized(3);
    // As an earlier version left it: the hash, no set, no flag.
    let json = serde_json::to_string(&RunRecord::of(&ended)).unwrap();
    server.cli(&["HSET", "allot:{allot-runs}:runs", "old-app/t1", &json]);
    let store = support::open(&server.url()).await;
    schedule_here(&store).await;
    let app = AppId::new("old-app").unwrap();
    support::add_app(&store, "root.old", &app).await;
    let task = TaskSpec {
        preemptable: true,
        id: TaskId::new("t1").unwrap(),
        resources: "cpu=1".parse().unwrap(),
        tokens: Vec::new(),
        group: None,
        priority: Default::default(),
        selector: [("nowhere".to_owned(), "x".to_owned())].into(),
        spec: String::new(),
    };
    store.add_task(app.clone(), task).await.unwrap();
    let t1 = TaskId::new("t1").unwrap();
    assert!(store.run(app.clone(), t1.clone()).await.unwrap().is_some());
    store.remove_app(app.clone()).await.unwrap();
    assert_eq!(store.run(app, t1).await.unwrap(), None, "the earlier version's run went with its application");
    store.shutdown().await;
}

/// Outputs kept by a version without the catalog's index by time are indexed at open, so their
/// retention ends too.
#[tokio::test]
async fn outputs_kept_by_an_earlier_version_are_forgotten_after_their_retention() {
    use allot_store::records::runs::CachedRecord;
    use allot_store::CachedOutputs;

    let server = RedisServer::start();
    let entry = |at| CachedOutputs {
        outputs: "{}".into(),
        app: allot_core::apps::AppId::new("old-app").unwrap(),
        task: allot_core::apps::TaskId::new("t1").unwrap(),
        at,
    };
    // As an earlier version left them: the hash only.
    for (key, at) in [("old-1", 100), ("old-2", 300)] {
        let json = serde_json::to_string(&CachedRecord::of(&entry(at))).unwrap();
        server.cli(&["HSETNX", "allot:{allot-runs}:catalog", key, &json]);
    }
    let store = support::open(&server.url()).await;
    assert_eq!(store.forget_cached_outputs(200, 10).await.unwrap(), 1);
    assert_eq!(store.cached_outputs("old-1").await.unwrap(), None);
    assert_eq!(store.cached_outputs("old-2").await.unwrap(), Some(entry(300)));
    store.shutdown().await;
}

/// Where the retention tests' clock starts (ms), and how long their feed keeps events.
const RETENTION_START: u64 = 1_000_000;
const RETAIN_FOR: Duration = Duration::from_secs(60);

/// A store on `server` whose clock starts at [`RETENTION_START`] and whose feed keeps events
/// [`RETAIN_FOR`].
async fn retention_store(server: &RedisServer) -> (RedisStore, TestClock) {
    let watch = allot_store::WatchConfig { retain_for: RETAIN_FOR, ..allot_store::WatchConfig::default() };
    TestClock::open_configured(server, RETENTION_START, |config| config.with_watch(watch)).await
}

/// Namespace `hive` of `quota` units, and `grants` grants `{prefix}{i}` in it.
async fn hive(store: &RedisStore, quota: u64, grants: usize, prefix: &str) {
    store.put_namespace(allot_core::NamespaceName::new("hive").unwrap(), quota).await.unwrap();
    grant_in_hive(store, grants, prefix).await;
}

async fn grant_in_hive(store: &RedisStore, grants: usize, prefix: &str) {
    for i in 0..grants {
        store.allocate(support::request("hive", &format!("{prefix}{i}")), Duration::ZERO).await.unwrap();
    }
}

/// The shared log's length, and the revision below its oldest entry (`compacted`).
fn log_len(server: &RedisServer) -> u64 {
    server.cli(&["XLEN", "allot:{allot-feed}:log"]).trim().parse().unwrap()
}

fn compacted(server: &RedisServer) -> String {
    server.cli(&["HGET", "allot:{allot-feed}:meta", "compacted"]).trim().to_owned()
}

/// The shared log keeps no event older than `retain_for` while nothing is copied into it too (each
/// daemon's sweep trims it), and a daemon's feed keeps no more than the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_past_their_retention_go_from_an_idle_log() {
    use allot_core::watch::Filter;
    use allot_store::WatchError;

    let server = RedisServer::start();
    let (store, mut clock) = retention_store(&server).await;
    let first = store.revision();
    hive(&store, 100, 5, "t").await;
    let in_log = async || log_len(&server) == 6 && store.feed_kept().0 == 6;
    until("the six changes are in the log and the feed", in_log).await;
    let last = store.revision();
    clock.set(&store, RETENTION_START + RETAIN_FOR.as_millis() as u64 + 1_000).await;
    until("the idle log trimmed by age", async || log_len(&server) == 0).await;
    assert_eq!(compacted(&server), last.to_string());
    until("the daemon's feed trimmed with it", async || store.feed_kept() == (0, last)).await;
    assert_eq!(
        store.watch(Filter::default(), Some(first)).err(),
        Some(WatchError::Compacted { since: first, oldest: last })
    );
    store.shutdown().await;
}

/// Retention by age reads the log a page at a time, pages growing from a few entries: every aged
/// event goes, across pages, and no event younger than `retain_for`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_aged_event_goes_across_pages_and_no_young_one() {
    let server = RedisServer::start();
    let (store, mut clock) = retention_store(&server).await;
    hive(&store, 1_000, 700, "old").await;
    until("the 701 changes are in the log", async || log_len(&server) == 701).await;
    let aged = store.revision();
    clock.set(&store, RETENTION_START + RETAIN_FOR.as_millis() as u64 + 1_000).await;
    grant_in_hive(&store, 3, "new").await;
    until("the aged events gone, the young ones kept", async || log_len(&server) == 3).await;
    assert_eq!(compacted(&server), aged.to_string());
    store.shutdown().await;
}

/// A stream that does not empty (a namespace under full load) does not hold the others back:
/// streams are copied into the log a page each in turn, so a change of a quiet stream made while
/// a busy one is being copied comes a page or so later, not once the busy one is empty (before,
/// the applications' changes came 11 to 17 s late under `bench pairs` on another namespace, and
/// the executor ran tasks only at its periodic list). Nothing of the busy stream is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_stream_does_not_hold_the_others_back() {
    use allot_core::watch::{EventKind, Filter};
    use allot_core::NamespaceName;

    const BUSY: usize = 50_000;
    let server = RedisServer::start();
    let store = RedisStore::open(&RedisConfig::parse(&server.url()).unwrap()).await.unwrap();
    store.put_namespace(NamespaceName::new("busy").unwrap(), 10).await.unwrap();
    store.allocate(support::request("busy", "t"), Duration::ZERO).await.unwrap();
    let log_len = || server.cli(&["XLEN", "allot:{allot-feed}:log"]).trim().parse::<usize>().unwrap();
    until("the two changes are in the log", async || log_len() == 2).await;
    let mut watcher = store.watch(Filter::default(), Some(store.revision())).unwrap();
    // As many grant events as a namespace under load leaves in its stream, one an entry, copies
    // of the real one in the log (standalone Redis: one script may touch both slots).
    let fill = "local e = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)[1][2] \
                assert(e[5] == 'k' and e[6] == 'grant.granted') \
                for i = 1, tonumber(ARGV[1]) do redis.call('XADD', KEYS[1], '*', 't', e[4], e[6], e[8]) end \
                redis.call('PUBLISH', 'allot:feed', KEYS[1])";
    let busy = BUSY.to_string();
    server.cli(&["EVAL", fill, "2", "allot:{busy}:feed", "allot:{allot-feed}:log", &busy]);
    // The busy stream is being copied: a change of a quiet one now.
    let first = watcher.next().await.unwrap();
    assert_eq!(first.kind, EventKind::GrantGranted);
    store.open_session(60_000, None).await.unwrap();
    let mut before = 1;
    loop {
        let event = watcher.next().await.unwrap();
        match event.kind {
            EventKind::GrantGranted => before += 1,
            EventKind::SessionOpened => break,
            other => panic!("an event of kind {other:?}"),
        }
    }
    assert!(before < BUSY / 2, "the session came after {before} of the busy stream's {BUSY} events");
    while before < BUSY {
        assert_eq!(watcher.next().await.unwrap().kind, EventKind::GrantGranted);
        before += 1;
    }
    store.shutdown().await;
}
