//! The applications' records on a real `redis-server`: the scheduler holding the lease writes
//! them, a scheduler that takes the lease over loads exactly what was written, and a deposed
//! scheduler's writes are refused.

use std::collections::BTreeMap;
use std::time::Duration;

use allot_core::apps::queues::{QueueLimits, QueuePath};
use allot_core::apps::{
    AppChange, AppId, AppSpec, GroupName, SchedConfig, Scheduler, SchedulingPolicy, TaskGroup, TaskId, TaskSpec, World,
};
use allot_core::pools::{LeaseRules, PoolName, Pools};
use allot_core::Ledger;
use allot_store_redis::apps::lease::LeaseState;
use allot_store_redis::apps::records::WriteError;
use allot_store_redis::testing::RedisServer;
use allot_store_redis::{RedisConfig, RedisStore};

use crate::support::{self, until};

fn everything(sched: &Scheduler) -> String {
    let apps: Vec<_> = sched.apps_after(None, usize::MAX).into_iter().cloned().collect();
    let tasks: Vec<_> = apps
        .iter()
        .flat_map(|a| sched.tasks_after(&a.spec.id, None, usize::MAX).unwrap().into_iter().cloned().collect::<Vec<_>>())
        .collect();
    format!("{:?}\n{apps:?}\n{tasks:?}", sched.queues().into_iter().map(|q| (q.path, q.limits)).collect::<Vec<_>>())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_scheduler_loads_what_the_old_one_wrote_and_a_deposed_one_writes_nothing() {
    let server = RedisServer::start();
    let config = RedisConfig::parse(&server.url()).unwrap();
    let (a, b) = (RedisStore::open(&config).await.unwrap(), RedisStore::open(&config).await.unwrap());
    let LeaseState::Mine { fencing, .. } = a.acquire_sched_lease("a", Duration::from_millis(300)).await.unwrap() else {
        panic!("the lease is free")
    };

    // Scheduler a: a queue, a gang reserved and taken over, an ordinary task placed.
    let mut pools = Pools::new(LeaseRules::default());
    pools.put_pool(&PoolName::new("p").unwrap(), "cpu=8".parse().unwrap());
    let mut ledger = Ledger::new();
    let mut sched = Scheduler::new(SchedConfig::default());
    let mut changes: Vec<AppChange> = Vec::new();
    let (_, out) = sched
        .put_queue(QueuePath::new("root.q").unwrap(), QueueLimits { max_apps: Some(3), ..Default::default() })
        .unwrap();
    changes.extend(out.apps);
    let spec = AppSpec {
        id: AppId::new("gang").unwrap(),
        queue: QueuePath::new("root.q").unwrap(),
        user: "u".into(),
        user_groups: Vec::new(),
        tags: BTreeMap::from([("team".to_owned(), "data".to_owned())]),
        groups: vec![TaskGroup {
            name: GroupName::new("g").unwrap(),
            min_members: 2,
            min_resources: "cpu=2".parse().unwrap(),
            selector: BTreeMap::new(),
            tokens: Vec::new(),
        }],
        policy: SchedulingPolicy::default(),
        queue_rule: None,
        priority: Default::default(),
    };
    let world = World { pools: &mut pools, ledger: &mut ledger };
    changes.extend(sched.add_app(spec, 10, &world).unwrap().2.apps);
    for (id, group) in [("m0", Some("g")), ("other", None)] {
        let task = TaskSpec {
            preemptable: true,
            id: TaskId::new(id).unwrap(),
            resources: "cpu=1".parse().unwrap(),
            tokens: Vec::new(),
            group: group.map(|g| GroupName::new(g).unwrap()),
            priority: Default::default(),
            selector: BTreeMap::new(),
            spec: "{\"image\":\"x\"}".into(),
        };
        let world = World { pools: &mut pools, ledger: &mut ledger };
        changes.extend(sched.add_task(&AppId::new("gang").unwrap(), task, 11, &world).unwrap().2.apps);
    }
    let mut world = World { pools: &mut pools, ledger: &mut ledger };
    let mut id = 0;
    changes.extend(
        sched
            .schedule(12, &mut world, &mut || {
                id += 1;
                id
            })
            .1
            .apps,
    );
    assert_eq!(a.write_app_records("a", fencing, None, &changes).await.unwrap(), changes.len());

    // Scheduler b takes over once a's lease lapses, and loads exactly what a wrote.
    let mut next = 0;
    until("a's lease lapsed and b took it", async || {
        match b.acquire_sched_lease("b", Duration::from_secs(5)).await.unwrap() {
            LeaseState::Mine { fencing, .. } => next = fencing,
            LeaseState::Held { .. } => {}
        }
        next > 0
    })
    .await;
    assert_eq!(next, fencing + 1);
    let loaded = b.load_app_records(SchedConfig::default()).await.unwrap();
    assert_eq!(everything(&loaded), everything(&sched));

    // a is deposed: its writes are refused, whatever term it names.
    let removal = [AppChange::AppRemoved { id: AppId::new("gang").unwrap() }];
    for term in [fencing, next] {
        let refused = a.write_app_records("a", term, None, &removal).await;
        assert!(matches!(refused, Err(WriteError::Deposed { current }) if current == next), "{refused:?}");
    }
    assert_eq!(everything(&b.load_app_records(SchedConfig::default()).await.unwrap()), everything(&sched));
    // b's own removal goes through, tasks included.
    b.write_app_records("b", next, None, &removal).await.unwrap();
    let emptied = b.load_app_records(SchedConfig::default()).await.unwrap();
    assert!(emptied.apps_after(None, 10).is_empty());
    assert_eq!(emptied.queues().len(), 2, "root and root.q stay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocs_the_scheduler_holds_have_no_lease_cannot_be_freed_by_hand_and_refuse_an_older_term() {
    use allot_core::pools::{AllocId, AllocRequest, AllocState, PoolError, HELD};
    use allot_store::prelude::*;
    use allot_store::StoreError;

    let server = RedisServer::start();
    let store = support::open(&server.url()).await;
    let pool = PoolName::new("held").unwrap();
    store.put_pool(pool.clone(), "cpu=4".parse().unwrap()).await.unwrap();
    let request = AllocRequest { min: "cpu=3".parse().unwrap(), owner: "app/t1".into(), ..AllocRequest::default() };
    let alloc = store.accept_held_alloc(pool.clone(), request.clone(), AllocId(7), 2).await.unwrap();
    assert_eq!((alloc.id, alloc.expires), (AllocId(7), HELD));
    let retried = store.accept_held_alloc(pool.clone(), request.clone(), AllocId(7), 2).await.unwrap();
    assert_eq!(retried, alloc, "a retry finds the alloc it made");
    let deposed = store.accept_held_alloc(pool.clone(), request, AllocId(8), 1).await;
    assert!(matches!(deposed, Err(StoreError::Unavailable(_))), "an older term is refused: {deposed:?}");
    assert!(
        matches!(store.end_held_alloc(pool.clone(), alloc.id, 1).await, Err(StoreError::Unavailable(_))),
        "an older term cannot end it either"
    );
    let (_, kept) = store.keepalive_alloc(pool.clone(), alloc.id, 1000).await.unwrap();
    assert_eq!(kept.expires, HELD, "a keepalive changes nothing");
    let freed = store.free_alloc(pool.clone(), alloc.id).await;
    assert!(
        matches!(&freed, Err(StoreError::Pools(PoolError::HeldByScheduler { owner, .. })) if owner == "app/t1"),
        "{freed:?}"
    );
    let (stopped, _) = store.stop_if_idle_for(pool.clone(), 0).await.unwrap();
    assert!(!stopped, "a pool with a held alloc is never idle");
    store.end_held_alloc(pool.clone(), alloc.id, 2).await.unwrap();
    assert!(matches!(store.inspect_alloc(pool.clone(), alloc.id).await.unwrap(), AllocState::Ended(_)));
    store.end_held_alloc(pool.clone(), alloc.id, 3).await.unwrap();
    assert_eq!(store.pool(pool).await.unwrap().allocs, 0);
}
