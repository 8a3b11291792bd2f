//! The embedded store's change feed: every committed change an event, in commit order, with the
//! object as it is after it; resumable from a revision, across a restart or a crash too; compacted
//! by retention; a slow watcher ended without holding writers up; every watcher ended at shutdown.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use allot_core::apps::queues::{QueueLimits, QueuePath};
use allot_core::apps::{AppId, AppSpec, SchedulingPolicy, TaskId, TaskSpec};
use allot_core::pools::{AllocRequest, PoolName};
use allot_core::runs::Run;
use allot_core::watch::{EventKind, Filter};
use allot_core::{LeaseRequest, Token};
use allot_store::clock::ManualClock;

use crate::embedded::{ns, request};
use allot_store::prelude::*;
use allot_store::{
    Allocation, Durability, EmbeddedConfig, EmbeddedStore, Event, EventObject, WatchConfig, WatchError, Watcher,
};

fn open(dir: &std::path::Path, clock: &ManualClock, watch: WatchConfig) -> Arc<EmbeddedStore> {
    open_at(dir, clock, watch, Durability::default())
}

fn open_at(
    dir: &std::path::Path,
    clock: &ManualClock,
    watch: WatchConfig,
    durability: Durability,
) -> Arc<EmbeddedStore> {
    let config = EmbeddedConfig::new(dir.to_owned())
        .with_time(Arc::new(clock.clone()))
        .with_watch(watch)
        .with_durability(durability);
    Arc::new(EmbeddedStore::open(&config).unwrap())
}

/// The next event, within a second.
async fn next(watcher: &mut Watcher) -> Arc<Event> {
    tokio::time::timeout(Duration::from_secs(1), watcher.next()).await.expect("an event within a second").unwrap()
}

/// The state a task reached, if the event is about a task.
fn task_state(event: &Event) -> Option<allot_core::apps::states::TaskState> {
    match &event.object {
        EventObject::Task(task) => Some(task.state),
        _ => None,
    }
}

fn kinds(events: &[Arc<Event>]) -> Vec<(&'static str, &str, Option<&str>)> {
    events.iter().map(|e| (e.kind.name(), e.key.as_str(), e.cause.as_deref())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_of_the_quotas_is_an_event_in_commit_order() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = open(dir.path(), &clock, WatchConfig::default());
    let mut watcher = store.watch(Filter::default(), None).unwrap();
    store.put_namespace(ns("hive"), 1).await.unwrap();
    store.allocate(request("hive", "a", LeaseRequest::Ttl { ttl_ms: 1000 }), Duration::ZERO).await.unwrap();
    // A second call waits for the first's unit; the release hands it over.
    let waiting = {
        let store = store.clone();
        tokio::spawn(
            async move { store.allocate(request("hive", "b", LeaseRequest::None), Duration::from_secs(5)).await },
        )
    };
    let mut seen = vec![next(&mut watcher).await, next(&mut watcher).await, next(&mut watcher).await];
    store.keepalive_grant(ns("hive"), Token::new("a").unwrap(), None).await.unwrap();
    store.release(ns("hive"), Token::new("a").unwrap(), None).await.unwrap();
    assert!(matches!(waiting.await.unwrap().unwrap(), Allocation::Granted { .. }));
    // A grant under a session ends when the session's lease runs out, by the clock.
    let session = store.open_session(2000, None).await.unwrap().session.id;
    store.release(ns("hive"), Token::new("b").unwrap(), None).await.unwrap();
    store.allocate(request("hive", "c", LeaseRequest::Session(session)), Duration::ZERO).await.unwrap();
    clock.advance(Duration::from_millis(2500));
    store.tick().await.unwrap();
    for _ in 0..9 {
        seen.push(next(&mut watcher).await);
    }
    let session_key = format!("sessions/{session}");
    assert_eq!(
        kinds(&seen),
        [
            ("namespace.put", "namespaces/hive", None),
            ("grant.granted", "namespaces/hive/grants/a", None),
            ("waiter.queued", "namespaces/hive/waiters/b", None),
            ("grant.renewed", "namespaces/hive/grants/a", None),
            ("grant.released", "namespaces/hive/grants/a", Some("released")),
            ("grant.granted", "namespaces/hive/grants/b", None),
            ("waiter.admitted", "namespaces/hive/waiters/b", None),
            ("session.opened", session_key.as_str(), None),
            ("grant.released", "namespaces/hive/grants/b", Some("released")),
            ("grant.granted", "namespaces/hive/grants/c", None),
            ("grant.expired", "namespaces/hive/grants/c", Some("session_expired")),
            ("session.expired", session_key.as_str(), None),
        ]
    );
    assert!(seen.windows(2).all(|w| w[0].revision < w[1].revision), "revisions increase");
    // The object is as it is after the change.
    let EventObject::Namespace(view) = &seen[0].object else { panic!("{:?}", seen[0]) };
    assert_eq!(view.quota, 1);
    let EventObject::Grant(granted) = &seen[1].object else { panic!("{:?}", seen[1]) };
    assert_eq!((granted.grant.token.as_str(), granted.expires_in_ms), ("a", Some(1000)));
    assert_eq!(store.revision(), seen.last().unwrap().revision, "a read now reflects the last event");
    store.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_queues_and_runs_are_events_too() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = open(dir.path(), &clock, WatchConfig::default());
    let pool = PoolName::new("p").unwrap();
    let mut watcher = store.watch(Filter { kinds: vec![], prefixes: vec!["pools/p".into()] }, None).unwrap();
    store.put_pool(pool.clone(), "cpu=4".parse().unwrap()).await.unwrap();
    let want = AllocRequest { min: "cpu=1".parse().unwrap(), owner: "me".into(), ..AllocRequest::default() };
    let alloc = store.accept(pool.clone(), want).await.unwrap();
    store.keepalive_alloc(pool.clone(), alloc.id, 60_000).await.unwrap();
    store.free_alloc(pool.clone(), alloc.id).await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(next(&mut watcher).await);
    }
    let key = format!("pools/p/allocs/{}", alloc.id);
    assert_eq!(
        kinds(&seen),
        [
            ("pool.put", "pools/p", None),
            ("alloc.made", key.as_str(), None),
            ("alloc.renewed", key.as_str(), None),
            ("alloc.ended", key.as_str(), Some("freed")),
        ]
    );
    // A pool removed with force ends its allocs first.
    let want = AllocRequest { min: "cpu=1".parse().unwrap(), owner: "me".into(), ..AllocRequest::default() };
    let held = store.accept(pool.clone(), want).await.unwrap();
    store.remove_pool(pool.clone(), true).await.unwrap();
    let seen = vec![next(&mut watcher).await, next(&mut watcher).await, next(&mut watcher).await];
    let held_key = format!("pools/p/allocs/{}", held.id);
    assert_eq!(
        kinds(&seen),
        [
            ("alloc.made", held_key.as_str(), None),
            ("alloc.ended", held_key.as_str(), Some("pool_removed")),
            ("pool.removed", "pools/p", None),
        ]
    );
    // Queues and runs, watched by kind.
    let kinds_only =
        Filter { kinds: vec![EventKind::QueuePut, EventKind::RunChanged, EventKind::RunRemoved], prefixes: vec![] };
    let mut watcher = store.watch(kinds_only, None).unwrap();
    let queue = QueuePath::new("root.q").unwrap();
    store.put_queue(queue.clone(), QueueLimits::default()).await.unwrap();
    let (app, task) = (AppId::new("etl").unwrap(), TaskId::new("t1").unwrap());
    store.put_run(app.clone(), task.clone(), Run::new(1)).await.unwrap();
    store.remove_run(app, task).await.unwrap();
    let seen = vec![next(&mut watcher).await, next(&mut watcher).await, next(&mut watcher).await];
    assert_eq!(
        kinds(&seen),
        [
            ("queue.put", "queues/root.q", None),
            ("run.changed", "apps/etl/tasks/t1/run", None),
            ("run.removed", "apps/etl/tasks/t1/run", None),
        ]
    );
    let EventObject::Run(run) = &seen[1].object else { panic!("{:?}", seen[1]) };
    assert_eq!(**run, Run::new(1));
    store.shutdown().await;
}

/// Random changes of many tokens, watched from the start: the events replayed give the grants the
/// store holds at the end; none is missing or twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_events_replayed_give_the_final_state() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = open(dir.path(), &clock, WatchConfig::default());
    let start = store.revision();
    store.put_namespace(ns("hive"), 20).await.unwrap();
    let mut rng = allot_core::testing::XorShift::new(7);
    for _ in 0..400 {
        let token = format!("t{}", rng.below(30));
        match rng.below(4) {
            // A token asked again with another lease is a conflict, which changes nothing.
            0 | 1 => drop(store.allocate(request("hive", &token, LeaseRequest::None), Duration::ZERO).await),
            2 => drop(store.release(ns("hive"), Token::new(&token).unwrap(), None).await.unwrap()),
            _ => {
                let lease = LeaseRequest::Ttl { ttl_ms: 1000 + rng.below(3000) };
                drop(store.allocate(request("hive", &token, lease), Duration::ZERO).await);
                clock.advance(Duration::from_millis(rng.below(500)));
                store.tick().await.unwrap();
            }
        }
    }
    let end = store.revision();
    let mut watcher =
        store.watch(Filter { kinds: vec![], prefixes: vec!["namespaces/hive".into()] }, Some(start)).unwrap();
    let mut held = BTreeMap::new();
    let mut last = start;
    while last < end {
        let event = next(&mut watcher).await;
        assert!(event.revision > last, "in order, none twice");
        last = event.revision;
        match (&event.kind, &event.object) {
            (EventKind::GrantGranted | EventKind::GrantRenewed, EventObject::Grant(info)) => {
                held.insert(info.grant.token.to_string(), info.grant.fencing);
            }
            (EventKind::GrantReleased | EventKind::GrantExpired, EventObject::Grant(info)) => {
                assert!(held.remove(info.grant.token.as_str()).is_some(), "an end of a grant the events never granted");
            }
            _ => {}
        }
    }
    let grants = allot_store::read_all(|page| store.grants(ns("hive"), page)).await.unwrap();
    let now: BTreeMap<String, u64> = grants.iter().map(|g| (g.grant.token.to_string(), g.grant.fencing)).collect();
    assert_eq!(held, now);
    store.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_resumes_from_a_revision_until_it_is_no_longer_kept() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let watch = WatchConfig { retain_events: 10, ..WatchConfig::default() };
    let store = open(dir.path(), &clock, watch);
    store.put_namespace(ns("hive"), 100).await.unwrap();
    let listed = store.revision();
    for i in 0..5 {
        store.allocate(request("hive", &format!("t{i}"), LeaseRequest::None), Duration::ZERO).await.unwrap();
    }
    // List, then watch from the list's revision: the five grants after it, nothing before.
    let mut watcher = store.watch(Filter::default(), Some(listed)).unwrap();
    for i in 0..5 {
        assert_eq!(next(&mut watcher).await.key, format!("namespaces/hive/grants/t{i}"));
    }
    for i in 5..30 {
        store.allocate(request("hive", &format!("t{i}"), LeaseRequest::None), Duration::ZERO).await.unwrap();
    }
    match store.watch(Filter::default(), Some(listed)) {
        Err(WatchError::Compacted { since, oldest }) => {
            assert_eq!(since, listed);
            assert_eq!(oldest, store.feed_kept().1);
            // From the oldest kept, it resumes.
            let mut again = store.watch(Filter::default(), Some(oldest)).unwrap();
            assert!(next(&mut again).await.revision > oldest);
        }
        other => panic!("{other:?}"),
    }
    store.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_watcher_is_ended_and_writers_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = open(dir.path(), &clock, WatchConfig { buffer: 8, ..WatchConfig::default() });
    store.put_namespace(ns("hive"), 1000).await.unwrap();
    let mut slow = store.watch(Filter::default(), None).unwrap();
    let started = store.revision();
    for i in 0..100 {
        store.allocate(request("hive", &format!("t{i}"), LeaseRequest::None), Duration::ZERO).await.unwrap();
    }
    // It has the 8 events its buffer held, then it is ended with the revision to resume from.
    let mut last = started;
    let ended = loop {
        match slow.next().await {
            Ok(event) => last = event.revision,
            Err(err) => break err,
        }
    };
    assert_eq!(ended, WatchError::Behind { resume: last, buffer: 8 });
    assert!(last > started);
    assert_eq!(store.namespace(ns("hive")).await.unwrap().granted_units, 100, "every write went through");
    store.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutting_down_ends_every_watcher_and_revisions_go_on_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = open(dir.path(), &clock, WatchConfig::default());
    let start = store.revision();
    store.put_namespace(ns("hive"), 1).await.unwrap();
    let before = store.revision();
    let mut watcher = store.watch(Filter::default(), None).unwrap();
    store.shutdown().await;
    assert_eq!(watcher.next().await.err(), Some(WatchError::Closed));
    drop(store);
    let store = open(dir.path(), &clock, WatchConfig::default());
    assert!(store.revision() > before, "revisions go on after a restart");
    // What the store published before it closed is kept across the restart.
    let mut resumed = store.watch(Filter::default(), Some(start)).unwrap();
    assert_eq!(next(&mut resumed).await.revision, before);
    // A revision before what it keeps is refused, as before the restart.
    assert_eq!(
        store.watch(Filter::default(), Some(start - 1)).err(),
        Some(WatchError::Compacted { since: start - 1, oldest: start })
    );
    store.shutdown().await;
}

/// Submits application `app` in `queue` with one task `t1` of `cpu=1` and plugin spec `spec`.
async fn submit_one_task(store: &EmbeddedStore, app: &AppId, queue: QueuePath, spec: &str) {
    let app_spec = AppSpec {
        id: app.clone(),
        queue,
        user: "u".into(),
        user_groups: Vec::new(),
        tags: Default::default(),
        groups: Vec::new(),
        policy: SchedulingPolicy::default(),
        queue_rule: None,
        priority: Default::default(),
    };
    let task = TaskSpec {
        preemptable: true,
        id: TaskId::new("t1").unwrap(),
        resources: "cpu=1".parse().unwrap(),
        tokens: Vec::new(),
        group: None,
        priority: Default::default(),
        selector: Default::default(),
        spec: spec.to_owned(),
    };
    store.submit_app(app_spec, vec![task]).await.unwrap();
}

/// Reads the events of `watcher` up to revision `until`.
async fn read_until(watcher: &mut Watcher, until: u64) -> Vec<Arc<Event>> {
    let mut seen = Vec::new();
    while seen.last().is_none_or(|e: &Arc<Event>| e.revision < until) {
        seen.push(next(watcher).await);
    }
    seen
}

/// Changes of every part, watched by `watcher`: a namespace, grants (a waiter admitted, and one
/// that gave up: events with no change of their own), a session, a pool and its allocs, a queue,
/// an application placed, a run. Answers what the watcher saw, once every change is answered.
async fn changes_of_every_part(store: &Arc<EmbeddedStore>, watcher: &mut Watcher) -> Vec<Arc<Event>> {
    let mut seen = Vec::new();
    store.put_namespace(ns("hive"), 1).await.unwrap();
    store.allocate(request("hive", "a", LeaseRequest::Ttl { ttl_ms: 1000 }), Duration::ZERO).await.unwrap();
    let waiting = {
        let store = store.clone();
        tokio::spawn(
            async move { store.allocate(request("hive", "b", LeaseRequest::None), Duration::from_secs(5)).await },
        )
    };
    while seen.last().is_none_or(|e: &Arc<Event>| e.kind != EventKind::WaiterQueued) {
        seen.push(next(watcher).await);
    }
    let gave_up = store.allocate(request("hive", "c", LeaseRequest::None), Duration::from_millis(20)).await;
    assert!(matches!(gave_up.unwrap(), Allocation::Refused { .. }));
    store.release(ns("hive"), Token::new("a").unwrap(), None).await.unwrap();
    assert!(matches!(waiting.await.unwrap().unwrap(), Allocation::Granted { .. }));
    store.open_session(2000, None).await.unwrap();
    let pool = PoolName::new("p").unwrap();
    store.put_pool(pool.clone(), "cpu=4".parse().unwrap()).await.unwrap();
    let want = AllocRequest { min: "cpu=1".parse().unwrap(), owner: "me".into(), ..AllocRequest::default() };
    let alloc = store.accept(pool.clone(), want).await.unwrap();
    store.keepalive_alloc(pool.clone(), alloc.id, 60_000).await.unwrap();
    store.free_alloc(pool, alloc.id).await.unwrap();
    let queue = QueuePath::new("root.q").unwrap();
    store.put_queue(queue.clone(), QueueLimits::default()).await.unwrap();
    let app = AppId::new("etl").unwrap();
    submit_one_task(store, &app, queue, "{}").await;
    store.tick().await.unwrap();
    store.put_run(app, TaskId::new("t1").unwrap(), Run::new(1)).await.unwrap();
    seen.extend(read_until(watcher, store.revision()).await);
    let kinds: std::collections::BTreeSet<&str> = seen.iter().map(|e| e.kind.name()).collect();
    for kind in ["waiter.queued", "waiter.gave_up", "waiter.admitted", "session.opened", "alloc.ended", "queue.put"] {
        assert!(kinds.contains(kind), "{kind} is not among {kinds:?}");
    }
    for kind in ["app.changed", "task.changed", "run.changed"] {
        assert!(kinds.contains(kind), "{kind} is not among {kinds:?}");
    }
    seen
}

/// Stops the store cleanly, or as a crash would.
async fn stop(store: Arc<EmbeddedStore>, crash: bool) {
    if crash {
        Arc::into_inner(store).expect("nothing else holds the store").crash().await;
    } else {
        store.shutdown().await;
    }
}

/// Reopened after a shutdown or a crash, at either level of durability, a store keeps the events
/// it published, as it published them: a watcher resuming from any revision before the restart
/// gets exactly the events after it, then the new ones, none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopened_store_resumes_a_watcher_with_exactly_the_events_after_its_revision() {
    for durability in Durability::ALL {
        for crash in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let clock = ManualClock::new();
            let store = open_at(dir.path(), &clock, WatchConfig::default(), durability);
            let start = store.revision();
            let mut watcher = store.watch(Filter::default(), Some(start)).unwrap();
            let seen = changes_of_every_part(&store, &mut watcher).await;
            let last = seen.last().unwrap().revision;
            assert_eq!(store.revision(), last);
            stop(store, crash).await;

            let store = open_at(dir.path(), &clock, WatchConfig::default(), durability);
            let case = format!("{durability}, crash: {crash}");
            assert!(store.revision() > last, "{case}: revisions go on above every one published");
            assert_eq!(store.feed_kept(), (seen.len(), start), "{case}");
            let mut resumed = Vec::new();
            for (k, from) in std::iter::once(start).chain(seen.iter().map(|e| e.revision)).enumerate() {
                let mut watcher = store.watch(Filter::default(), Some(from)).unwrap();
                let backlog = match seen.get(k..) {
                    Some(after) if !after.is_empty() => read_until(&mut watcher, last).await,
                    _ => Vec::new(),
                };
                assert_eq!(backlog, seen[k..], "{case}: resumed after {from}");
                resumed.push(watcher);
            }
            // Then the new changes, after what each had.
            store.put_namespace(ns("after"), 1).await.unwrap();
            for watcher in &mut resumed {
                let event = next(watcher).await;
                assert_eq!((event.key.as_str(), event.revision > last), ("namespaces/after", true), "{case}");
            }
            store.shutdown().await;
        }
    }
}

/// The newest file of kept events, in `dir`.
fn newest_events_file(dir: &std::path::Path) -> std::path::PathBuf {
    let mut files: Vec<_> = std::fs::read_dir(dir.join(allot_store::embedded::EVENTS_DIR))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "events"))
        .collect();
    files.sort();
    files.pop().expect("a file of kept events")
}

/// A crash in the middle of writing kept events leaves a torn frame at the end of their file:
/// it is cut at open, and the records it was copying, still in the log, are copied again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_tail_of_the_kept_events_is_cut_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = open(dir.path(), &clock, WatchConfig::default());
    let start = store.revision();
    let mut watcher = store.watch(Filter::default(), Some(start)).unwrap();
    store.put_namespace(ns("hive"), 100).await.unwrap();
    for i in 0..10 {
        store.allocate(request("hive", &format!("t{i}"), LeaseRequest::None), Duration::ZERO).await.unwrap();
        if i == 4 {
            // The first ones are in the kept events' file, the others (likely) in the log only.
            store.checkpoint_now().unwrap();
        }
    }
    let seen = read_until(&mut watcher, store.revision()).await;
    stop(store, true).await;
    let file = newest_events_file(dir.path());
    let whole = std::fs::metadata(&file).unwrap().len();
    assert!(whole > 0, "the checkpoint kept events");
    // A frame's header and part of its body.
    let mut torn = std::fs::read(&file).unwrap();
    torn.extend(200u32.to_le_bytes());
    torn.extend([7u8; 60]);
    std::fs::write(&file, torn).unwrap();

    let store = open(dir.path(), &clock, WatchConfig::default());
    let mut resumed = store.watch(Filter::default(), Some(start)).unwrap();
    assert_eq!(read_until(&mut resumed, seen.last().unwrap().revision).await, seen);
    store.put_namespace(ns("after"), 1).await.unwrap();
    assert_eq!(next(&mut resumed).await.key, "namespaces/after", "none twice, none missed");
    // Nothing after the cut is in the way of what comes next: it is kept across another crash.
    let after = store.revision();
    stop(store, true).await;
    let store = open(dir.path(), &clock, WatchConfig::default());
    let mut again = store.watch(Filter::default(), Some(start)).unwrap();
    let kept = read_until(&mut again, after).await;
    assert_eq!((kept.len(), &kept[..seen.len()]), (seen.len() + 1, &seen[..]));
    store.shutdown().await;
}

/// A reopened store keeps what the feed kept, no more: by count and by age.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_bounds_what_a_reopened_store_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let watch = WatchConfig { retain_events: 10, retain_for: Duration::from_secs(60), ..WatchConfig::default() };
    let store = open(dir.path(), &clock, watch);
    let start = store.revision();
    let mut watcher = store.watch(Filter::default(), Some(start)).unwrap();
    store.put_namespace(ns("hive"), 100).await.unwrap();
    for i in 0..30 {
        store.allocate(request("hive", &format!("t{i}"), LeaseRequest::None), Duration::ZERO).await.unwrap();
    }
    let seen = read_until(&mut watcher, store.revision()).await;
    let oldest = seen[seen.len() - 11].revision;
    assert_eq!(store.feed_kept(), (10, oldest));
    stop(store, true).await;

    let store = open(dir.path(), &clock, watch);
    assert_eq!(store.feed_kept(), (10, oldest), "as many as before, from the same one");
    assert_eq!(store.watch(Filter::default(), Some(start)).err(), Some(WatchError::Compacted { since: start, oldest }));
    let mut resumed = store.watch(Filter::default(), Some(oldest)).unwrap();
    assert_eq!(read_until(&mut resumed, seen.last().unwrap().revision).await, seen[seen.len() - 10..]);
    // By age: a minute later, a change; reopened, only it is kept.
    clock.advance(Duration::from_secs(61));
    store.allocate(request("hive", "late", LeaseRequest::None), Duration::ZERO).await.unwrap();
    let late = store.revision();
    stop(store, false).await;
    let store = open(dir.path(), &clock, watch);
    assert_eq!(store.feed_kept(), (1, seen.last().unwrap().revision));
    let mut resumed = store.watch(Filter::default(), Some(store.feed_kept().1)).unwrap();
    assert_eq!(next(&mut resumed).await.revision, late);
    store.shutdown().await;
}

/// Events that age past `retain_for` go while nothing changes too: from the feed at the next
/// checkpoint (and from disk with it), not only when a later change is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_past_their_retention_go_while_the_store_is_idle() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let watch = WatchConfig { retain_for: Duration::from_secs(60), ..WatchConfig::default() };
    let store = open(dir.path(), &clock, watch);
    let start = store.revision();
    store.put_namespace(ns("hive"), 100).await.unwrap();
    for i in 0..5 {
        store.allocate(request("hive", &format!("t{i}"), LeaseRequest::None), Duration::ZERO).await.unwrap();
    }
    let last = store.revision();
    store.checkpoint_now().unwrap();
    assert_eq!(store.feed_kept(), (6, start), "within their retention, every event is kept");
    clock.advance(Duration::from_secs(59));
    store.checkpoint_now().unwrap();
    assert_eq!(store.feed_kept(), (6, start));
    clock.advance(Duration::from_secs(2));
    store.checkpoint_now().unwrap();
    assert_eq!(store.feed_kept(), (0, last), "a minute later, none is");
    assert_eq!(
        store.watch(Filter::default(), Some(start)).err(),
        Some(WatchError::Compacted { since: start, oldest: last })
    );
    let mut from_last = store.watch(Filter::default(), Some(last)).unwrap();
    store.allocate(request("hive", "late", LeaseRequest::None), Duration::ZERO).await.unwrap();
    let late = store.revision();
    assert_eq!(next(&mut from_last).await.revision, late);
    stop(store, true).await;
    let store = open(dir.path(), &clock, watch);
    assert_eq!(store.feed_kept(), (1, last), "reopened, only what retention keeps");
    store.shutdown().await;
}

/// An application's life as events: accepted and placed (its task with the alloc it holds, and
/// the alloc itself), started, failed with its reason, and the alloc ended with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applications_life_is_a_line_of_events() {
    use allot_core::apps::states::TaskState;

    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = open(dir.path(), &clock, WatchConfig::default());
    let pool = PoolName::new("p").unwrap();
    store.put_pool(pool.clone(), "cpu=4".parse().unwrap()).await.unwrap();
    let queue = QueuePath::new("root.q").unwrap();
    store.put_queue(queue.clone(), QueueLimits::default()).await.unwrap();
    let filter = Filter { kinds: vec![], prefixes: vec!["apps/etl".into(), "pools/p/allocs".into()] };
    let mut watcher = store.watch(filter, None).unwrap();
    let app = AppId::new("etl").unwrap();
    submit_one_task(&store, &app, queue, "").await;
    store.tick().await.unwrap();
    let mut seen = Vec::new();
    let placed = loop {
        let event = next(&mut watcher).await;
        seen.push(event.clone());
        if task_state(&event) == Some(TaskState::Allocated) {
            break event;
        }
    };
    let EventObject::Task(task) = &placed.object else { panic!("{placed:?}") };
    let alloc = task.placement.as_ref().expect("a placed task says where").alloc;
    assert!(
        seen.iter().any(|e| e.kind == EventKind::AllocMade && e.key == format!("pools/p/allocs/{alloc}")),
        "its alloc was made: {:?}",
        kinds(&seen)
    );
    assert!(seen.iter().any(|e| e.kind == EventKind::AppChanged), "{:?}", kinds(&seen));
    store.start_task(app.clone(), TaskId::new("t1").unwrap()).await.unwrap();
    store.finish_task(app.clone(), TaskId::new("t1").unwrap(), Some("exit 3".into())).await.unwrap();
    let mut ended = Vec::new();
    while !ended.iter().any(|e: &Arc<Event>| task_state(e) == Some(TaskState::Failed)) {
        ended.push(next(&mut watcher).await);
    }
    let failed = ended.iter().find(|e| task_state(e) == Some(TaskState::Failed)).unwrap();
    assert_eq!((failed.key.as_str(), failed.cause.as_deref()), ("apps/etl/tasks/t1", Some("exit 3")));
    assert!(ended.iter().any(|e| task_state(e) == Some(TaskState::Running)), "{:?}", kinds(&ended));
    // Its alloc ended with it (the same commit: it is in the events up to the task's failure).
    let freed = ended.iter().find(|e| e.kind == EventKind::AllocEnded).expect("its alloc ended with it");
    assert_eq!(freed.key, format!("pools/p/allocs/{alloc}"));
    store.shutdown().await;
}

/// A sync that wrote the record but failed leaves its operation's outcome unknown; the store,
/// rebuilt from what the disk holds, has the change, and so does its feed: a watcher gets its
/// event, and so does one that resumes after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_whose_outcome_was_unknown_but_is_durable_is_in_the_feed() {
    let dir = tempfile::tempdir().unwrap();
    let (store, faults) = allot_store::fault::open_flaky_store(dir.path()).unwrap();
    store.put_namespace(ns("hive"), 2).await.unwrap();
    let start = store.revision();
    let mut watcher = store.watch(Filter::default(), Some(start)).unwrap();
    faults.fail_after_syncs.store(true, std::sync::atomic::Ordering::SeqCst);
    let answer = store.allocate(request("hive", "ghost", LeaseRequest::None), Duration::ZERO).await;
    assert!(matches!(answer, Err(allot_store::StoreError::OutcomeUnknown(_))), "{answer:?}");
    faults.fail_after_syncs.store(false, std::sync::atomic::Ordering::SeqCst);
    let granted = store.grant(ns("hive"), Token::new("ghost").unwrap()).await;
    assert!(granted.is_ok(), "the record reached the disk: {granted:?}");
    let event = next(&mut watcher).await;
    assert_eq!((event.kind, event.key.as_str()), (EventKind::GrantGranted, "namespaces/hive/grants/ghost"));
    store.release(ns("hive"), Token::new("ghost").unwrap(), None).await.unwrap();
    let released = next(&mut watcher).await;
    assert_eq!(released.kind, EventKind::GrantReleased);
    store.shutdown().await;
    drop(store);
    let (store, _) = allot_store::fault::open_flaky_store(dir.path()).unwrap();
    let mut resumed = store.watch(Filter::default(), Some(start)).unwrap();
    assert_eq!(next(&mut resumed).await, event);
    assert_eq!(next(&mut resumed).await, released);
    store.shutdown().await;
}
