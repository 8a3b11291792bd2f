//! The scheduler on Redis, where a placement is carried out in steps over slots that other
//! clients change too:
//! - a scheduler that dies between carrying out a placement and recording it leaves an alloc and
//!   a grant that no record holds, named in its intents; the daemon that takes the scheduling
//!   over undoes them before anything else, in its own term, after which the dead scheduler's
//!   late steps are refused;
//! - a placement that Redis refuses (another client took the room since the scheduler last read
//!   the pools) is undone with its whole cycle and decided again.

use std::time::Duration;

use allot_core::apps::states::TaskState;
use allot_core::apps::{AppId, TaskId, TaskSpec};
use allot_core::pools::{AllocId, AllocRequest, AllocState, PoolName};
use allot_core::{AllocateRequest, Constraints, LeaseRequest, NamespaceName, Token};
use allot_store::prelude::*;
use allot_store::{AppsHome, StoreError};
use allot_store_redis::apps::lease::LeaseState;
use allot_store_redis::testing::RedisServer;
use allot_store_redis::{RedisConfig, RedisStore};

use crate::support::{self, until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_undoes_what_a_dead_scheduler_made_but_never_recorded() {
    let server = RedisServer::start();
    let config = RedisConfig::parse(&server.url()).unwrap();
    let dead = RedisStore::open(&config).await.unwrap();
    let (pool, namespace) = (PoolName::new("p").unwrap(), NamespaceName::new("seats").unwrap());
    dead.put_pool(pool.clone(), "cpu=4".parse().unwrap()).await.unwrap();
    dead.put_namespace(namespace.clone(), 2).await.unwrap();

    // The dead scheduler's term: it names an alloc and a grant in its intents, makes them, and
    // dies before writing the records that would hold them.
    let LeaseState::Mine { fencing, .. } = dead.acquire_sched_lease("dead", Duration::from_millis(300)).await.unwrap()
    else {
        panic!("the lease is free")
    };
    let intents = r#"[{"k":"accept","pool":"p","id":"00000000000000aa","resources":"cpu=3","owner":"gone:t1"},
        {"k":"take","namespace":"seats","token":"gone:t1","units":2}]"#;
    dead.write_app_records("dead", fencing, Some(intents), &[]).await.unwrap();
    let request = AllocRequest { min: "cpu=3".parse().unwrap(), owner: "gone:t1".into(), ..AllocRequest::default() };
    let orphan = dead.accept_held_alloc(pool.clone(), request.clone(), AllocId(0xaa), fencing).await.unwrap();
    let grant = AllocateRequest {
        namespace: namespace.clone(),
        token: Token::new("gone:t1").unwrap(),
        units: 2,
        scope: None,
        constraints: Constraints::default(),
        lease: LeaseRequest::None,
    };
    dead.allocate(grant, Duration::ZERO).await.unwrap();
    assert_eq!(dead.pool(pool.clone()).await.unwrap().allocs, 1);

    // Another daemon takes the scheduling over once the lease lapses.
    let next = RedisStore::open(&config).await.unwrap();
    next.start_scheduling("http://127.0.0.1:9");
    until("the successor took over", async || next.apps_home() == AppsHome::Here).await;
    assert!(
        matches!(next.inspect_alloc(pool.clone(), orphan.id).await.unwrap(), AllocState::Ended(_)),
        "the alloc no record holds is ended"
    );
    assert_eq!(next.namespace(namespace.clone()).await.unwrap().granted_units, 0, "and the grant released");
    // The dead scheduler, if it still ran, changes nothing any more: not in the pool it left...
    let late = dead.accept_held_alloc(pool.clone(), request, AllocId(0xbb), fencing).await;
    assert!(matches!(late, Err(StoreError::Unavailable(_))), "{late:?}");
    assert_eq!(next.pool(pool).await.unwrap().allocs, 0);
    // ...nor in the records.
    assert!(dead.write_app_records("dead", fencing, Some(""), &[]).await.is_err());
    next.shutdown().await;
}

/// Two daemons on `server`: the first schedules, on pool `p` (cpu=4).
async fn one_schedules(server: &RedisServer) -> (RedisStore, RedisStore, PoolName) {
    let config = RedisConfig::parse(&server.url()).unwrap();
    let store = RedisStore::open(&config).await.unwrap();
    let other = RedisStore::open(&config).await.unwrap();
    let pool = PoolName::new("p").unwrap();
    store.put_pool(pool.clone(), "cpu=4".parse().unwrap()).await.unwrap();
    store.start_scheduling("http://127.0.0.1:9");
    until("this daemon schedules", async || store.apps_home() == AppsHome::Here).await;
    (store, other, pool)
}

fn task_spec(id: &str, resources: &str) -> TaskSpec {
    TaskSpec {
        preemptable: true,
        id: TaskId::new(id).unwrap(),
        resources: resources.parse().unwrap(),
        tokens: Vec::new(),
        group: None,
        priority: Default::default(),
        selector: Default::default(),
        spec: String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placement_redis_refuses_is_undone_and_decided_again() {
    let server = RedisServer::start();
    let (store, other, pool) = one_schedules(&server).await;
    let app = AppId::new("a").unwrap();
    support::add_app(&store, "root.q", &app).await;
    let state = async |id: &str| store.task(app.clone(), TaskId::new(id).unwrap()).await.unwrap().task.state;
    store.add_task(app.clone(), task_spec("t1", "cpu=1")).await.unwrap();
    until("t1 is placed", async || state("t1").await == TaskState::Allocated).await;
    // Another client takes the rest of the pool; the scheduler's view of the pools is younger
    // than a second, so it still sees room for t2, and Redis refuses the placement.
    let request = AllocRequest { min: "cpu=3".parse().unwrap(), owner: "someone".into(), ..AllocRequest::default() };
    let theirs = other.accept(pool.clone(), request).await.unwrap();
    store.add_task(app.clone(), task_spec("t2", "cpu=2")).await.unwrap();
    until("t2 says why it waits", async || {
        store.task(app.clone(), TaskId::new("t2").unwrap()).await.unwrap().why.is_some()
    })
    .await;
    // Through three more scheduling cycles (t2 waits: a cycle runs at every retry):
    let cycles = store.sched_stats().cycles;
    until("three more scheduling cycles ran", async || {
        assert_eq!(state("t2").await, TaskState::Pending, "t2 is never placed while the room is taken");
        assert_eq!(store.pool(pool.clone()).await.unwrap().allocs, 2, "no alloc of the refused cycle is left");
        store.sched_stats().cycles >= cycles + 3
    })
    .await;
    other.free_alloc(pool.clone(), theirs.id).await.unwrap();
    until("t2 is placed once the room is free", async || state("t2").await == TaskState::Allocated).await;
    store.shutdown().await;
}

/// A daemon that does not schedule reads a task as the scheduler last committed it, from its
/// record (the executor's reading, without a call to the daemon that schedules): the same task,
/// placement and number as the scheduler has it, and nothing once it is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_that_does_not_schedule_reads_a_task_as_committed() {
    let server = RedisServer::start();
    let (store, other, _pool) = one_schedules(&server).await;
    assert_ne!(other.apps_home(), AppsHome::Here);
    let app = AppId::new("a").unwrap();
    let id = TaskId::new("t1").unwrap();
    assert_eq!(other.stored_task(app.clone(), id.clone()).await.unwrap(), None, "no such application yet");
    support::add_app(&store, "root.q", &app).await;
    store.add_task(app.clone(), task_spec("t1", "cpu=1")).await.unwrap();
    until("t1 is placed", async || {
        store.task(app.clone(), id.clone()).await.unwrap().task.state == TaskState::Allocated
    })
    .await;
    let scheduled = store.task(app.clone(), id.clone()).await.unwrap().task;
    assert_eq!(store.stored_task(app.clone(), id.clone()).await.unwrap().as_ref(), Some(&scheduled));
    let read = other.stored_task(app.clone(), id.clone()).await.unwrap().expect("the task's record");
    assert_eq!(
        (read.seq, read.state, &read.placement, &read.spec),
        (scheduled.seq, scheduled.state, &scheduled.placement, &scheduled.spec)
    );
    store.finish_task(app.clone(), id.clone(), None).await.unwrap();
    let read = other.stored_task(app.clone(), id.clone()).await.unwrap().expect("the task's record");
    assert_eq!(read.state, TaskState::Completed, "a report answered is in the record");
    store.remove_app(app.clone()).await.unwrap();
    assert_eq!(other.stored_task(app.clone(), id.clone()).await.unwrap(), None, "gone with its application");
    assert_eq!(store.stored_task(app, id).await.unwrap(), None);
    other.shutdown().await;
    store.shutdown().await;
}

/// The scheduler decides by the clock it is given (`RedisConfig::time`), not the machine's: two
/// daemons stepped by hand (`testing::schedule_once`) on one manual clock, Redis's functions on
/// the same time. The first holds the lease and places a task a turn; once its clock passes the
/// lease with no renewal it no longer takes the applications part's changes, and the second takes
/// the scheduling over and places on; no real time is waited for.
#[tokio::test]
async fn stepped_on_a_clock_it_is_given_the_scheduler_holds_its_lease_while_that_clock_says() {
    use std::sync::Arc;

    use allot_core::clock::ManualClock;
    use allot_store_redis::testing::{join_election, schedule_once, TestClock};

    const START: u64 = 1_800_000_000_000;
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let on_clock = |config: RedisConfig| config.with_time(Arc::new(clock.clone()));
    let (first, mut redis_time) = TestClock::open_configured(&server, START, on_clock).await;
    let (second, _) = TestClock::open_configured(&server, START, on_clock).await;
    let pool = PoolName::new("p").unwrap();
    first.put_pool(pool.clone(), "cpu=4".parse().unwrap()).await.unwrap();

    let one = join_election(&first, "http://127.0.0.1:1");
    schedule_once(&first, &one).await;
    assert_eq!(first.apps_home(), AppsHome::Here);
    let two = join_election(&second, "http://127.0.0.1:2");
    schedule_once(&second, &two).await;
    assert_eq!(second.apps_home(), AppsHome::At("http://127.0.0.1:1".into()));

    let app = AppId::new("a").unwrap();
    support::add_app(&first, "root.q", &app).await;
    first.add_task(app.clone(), task_spec("t1", "cpu=1")).await.unwrap();
    let state = async |store: &RedisStore, id: &str| {
        store.task(app.clone(), TaskId::new(id).unwrap()).await.unwrap().task.state
    };
    assert_eq!(state(&first, "t1").await, TaskState::Pending, "nothing is placed between turns");
    schedule_once(&first, &one).await;
    assert_eq!(state(&first, "t1").await, TaskState::Allocated);

    // The lease runs 3 s, of which the daemon counts 2.5 as surely its own. At 2.4 s, still.
    clock.advance(Duration::from_millis(2_400));
    redis_time.set(&first, START + 2_400).await;
    first.add_task(app.clone(), task_spec("t2", "cpu=1")).await.unwrap();
    // At 3 s, with no renewal, it is not: the first daemon refuses what only the scheduler does.
    clock.advance(Duration::from_millis(600));
    redis_time.set(&first, START + 3_000).await;
    let refused = first.add_task(app.clone(), task_spec("t3", "cpu=1")).await;
    assert!(matches!(refused, Err(StoreError::Unavailable(_))), "{refused:?}");
    // The second takes the lease Redis's clock let lapse, loads the records, and places.
    schedule_once(&second, &two).await;
    assert_eq!(second.apps_home(), AppsHome::Here);
    assert_eq!(state(&second, "t1").await, TaskState::Allocated, "what the first placed holds");
    schedule_once(&second, &two).await;
    assert_eq!(state(&second, "t2").await, TaskState::Allocated);
    first.shutdown().await;
    second.shutdown().await;
}

/// The scheduler's timers read Redis's clock from a daemon's start, never the daemon's own wall
/// clock (found by `allot-sim --redis`, seed 91: a daemon whose wall clock had jumped more than
/// an hour ahead restarted and forgot an application that had ended a moment before, its
/// retention counted on the wall clock until the daemon's first pool call read Redis's).
#[tokio::test]
async fn a_daemon_whose_wall_clock_is_hours_ahead_keeps_an_ended_application_its_retention() {
    use std::sync::Arc;

    use allot_core::clock::{ManualClock, TimeSource};
    use allot_store_redis::testing::{join_election, schedule_once, TestClock};

    let server = RedisServer::start();
    let clock = ManualClock::new();
    // Redis's clock reads three hours behind the daemons' wall clock.
    let start = clock.wall_ms() - 3 * 3_600_000;
    let on_clock = |config: RedisConfig| config.with_time(Arc::new(clock.clone()));
    let (first, mut redis_time) = TestClock::open_configured(&server, start, on_clock).await;
    let pool = PoolName::new("p").unwrap();
    first.put_pool(pool.clone(), "cpu=4".parse().unwrap()).await.unwrap();
    let one = join_election(&first, "http://127.0.0.1:1");
    schedule_once(&first, &one).await;
    let (app, id) = (AppId::new("a").unwrap(), TaskId::new("t1").unwrap());
    support::add_app(&first, "root.q", &app).await;
    first.add_task(app.clone(), task_spec("t1", "cpu=1")).await.unwrap();
    schedule_once(&first, &one).await;
    first.finish_task(app.clone(), id.clone(), None).await.unwrap();
    // It completes once its completing grace (30 s) has run on Redis's clock.
    let ended = start + 31_000;
    redis_time.set(&first, ended).await;
    schedule_once(&first, &one).await;
    schedule_once(&first, &one).await;
    let state = first.app(app.clone()).await.unwrap().app.state;
    assert!(state.is_terminal(), "its one task ended it: {state:?}");
    first.shutdown().await;

    // A daemon that starts (no pool call yet) schedules by Redis's clock: the application ended
    // a moment ago, not three hours ago.
    let (second, _) = TestClock::open_configured(&server, ended, on_clock).await;
    let two = join_election(&second, "http://127.0.0.1:2");
    schedule_once(&second, &two).await;
    assert_eq!(second.apps_home(), AppsHome::Here);
    schedule_once(&second, &two).await;
    let kept = second.app(app.clone()).await;
    assert!(kept.is_ok(), "an application ended a moment ago by Redis's clock was forgotten: {kept:?}");

    // Its retention (an hour) runs on Redis's clock: past it, the application goes.
    redis_time.set(&second, ended + 3_600_000 + 1_000).await;
    schedule_once(&second, &two).await;
    schedule_once(&second, &two).await;
    let forgotten = second.app(app.clone()).await;
    assert!(forgotten.is_err(), "past its retention on Redis's clock the application is forgotten: {forgotten:?}");
    second.shutdown().await;
}
