//! Pools that change under the scheduler: cordoned (nothing new placed there), drained (its tasks
//! preempted once the grace is over), occupied by others, shrunk below what is placed there.

use allot_core::apps::priority::Priority;
use allot_core::apps::queues::QueueLimits;
use allot_core::apps::{TaskSpec, World, DEFAULT_PREEMPTION_GRACE_MS};
use allot_core::pools::{CordonOrder, PoolName};

use super::apps::{aid, app_spec, group, member, res, task, tid, Bench};

fn pool(name: &str) -> PoolName {
    PoolName::new(name).unwrap()
}

fn order(b: &mut Bench, name: &str, order: CordonOrder) {
    b.pools.cordon(&pool(name), order, b.now).unwrap();
}

/// The tasks of `app` being preempted, by id, with the reason they are given.
fn marked(b: &Bench, app: &str, ids: &[&str]) -> Vec<String> {
    ids.iter()
        .filter(|id| b.sched.task(&aid(app), &tid(id)).unwrap().preempting.is_some())
        .map(|id| (*id).to_owned())
        .collect()
}

/// What is held on each pool fits what it may hold, unless it was shrunk below it.
fn fits(b: &Bench, name: &str) -> bool {
    let view = b.pools.pool(&pool(name), b.now).unwrap();
    view.capacity.saturating_sub(&view.occupied).fits(&view.allocated)
}

/// Pools `p1` and `p2` of `cpu=4`, `p2` cordoned (so that tasks go to `p1` first), and queue
/// `root.q`.
fn p2_cordoned() -> Bench {
    let mut b = Bench::new();
    b.pool("p1", "cpu=4", &[]);
    b.pool("p2", "cpu=4", &[]);
    order(&mut b, "p2", CordonOrder::Cordon);
    b.queue("root.q", QueueLimits::default());
    b
}

#[test]
fn nothing_new_is_placed_on_a_cordoned_pool_and_what_runs_there_runs_on() {
    let mut b = Bench::new();
    b.pool("p1", "cpu=2", &[]);
    b.pool("p2", "cpu=2", &[]);
    b.queue("root.q", QueueLimits::default());
    b.submit(app_spec("app", "root.q")).unwrap();
    b.add("app", task("a", "cpu=1")).unwrap();
    b.cycle();
    let first = b.pool_of("app", "a");
    order(&mut b, &first, CordonOrder::Cordon);
    for id in ["b", "c"] {
        b.add("app", task(id, "cpu=1")).unwrap();
    }
    b.cycle();
    let other = if first == "p1" { "p2" } else { "p1" };
    assert_eq!((b.pool_of("app", "b"), b.pool_of("app", "c")), (other.to_owned(), other.to_owned()));
    b.add("app", task("d", "cpu=1")).unwrap();
    b.now += 10 * DEFAULT_PREEMPTION_GRACE_MS;
    b.cycle();
    assert!(b.sched.task(&aid("app"), &tid("d")).unwrap().placement.is_none(), "the cordoned pool's room is not used");
    assert_eq!(b.pool_of("app", "a"), first, "a cordon preempts nothing");
    assert!(marked(&b, "app", &["a", "b", "c"]).is_empty());
    order(&mut b, &first, CordonOrder::Uncordon);
    b.cycle();
    assert_eq!(b.pool_of("app", "d"), first);
}

#[test]
fn a_drained_pools_tasks_are_preempted_after_the_grace_and_placed_elsewhere_but_not_those_that_may_not_be() {
    let mut b = p2_cordoned();
    b.submit(app_spec("app", "root.q")).unwrap();
    for id in ["a", "b", "c"] {
        b.add("app", task(id, "cpu=1")).unwrap();
    }
    b.add("app", TaskSpec { preemptable: false, ..task("keep", "cpu=1") }).unwrap();
    b.cycle();
    assert!(["a", "b", "c", "keep"].iter().all(|id| b.pool_of("app", id) == "p1"));
    order(&mut b, "p2", CordonOrder::Uncordon);
    order(&mut b, "p1", CordonOrder::Drain { grace_ms: 5_000 });
    b.cycle();
    assert!(marked(&b, "app", &["a", "b", "c", "keep"]).is_empty(), "within the grace nothing is preempted");
    assert_eq!(b.sched.next_deadline(), Some(b.now + 5_000), "the scheduler wakes when the drain is due");
    b.now += 5_000;
    b.cycle();
    assert_eq!(marked(&b, "app", &["a", "b", "c", "keep"]), ["a", "b", "c"]);
    let mark = b.sched.task(&aid("app"), &tid("a")).unwrap().preempting.clone().unwrap();
    assert_eq!(mark.by, None);
    assert!(mark.reason.contains("pool `p1` is drained"), "{}", mark.reason);
    // The executor ends one; the others keep their room until their grace ends.
    {
        let now = b.now;
        let mut world = World { pools: &mut b.pools, ledger: &mut b.ledger };
        b.sched.preempted(&aid("app"), &tid("a"), now, &mut world).unwrap();
    }
    b.cycle();
    assert_eq!(b.pool_of("app", "a"), "p2", "placed again on a pool that is not cordoned");
    assert_eq!(b.pool_of("app", "b"), "p1");
    b.now += DEFAULT_PREEMPTION_GRACE_MS;
    b.cycle();
    for id in ["a", "b", "c"] {
        assert_eq!(b.pool_of("app", id), "p2");
        let t = b.sched.task(&aid("app"), &tid(id)).unwrap();
        assert_eq!(t.preemptions, 1);
    }
    assert_eq!(b.pool_of("app", "keep"), "p1", "a task that may not be preempted runs to its end");
    assert!(fits(&b, "p1") && fits(&b, "p2"));
}

#[test]
fn a_drain_never_breaks_a_gang_and_an_uncordon_calls_off_what_it_had_not_carried_out() {
    let mut b = p2_cordoned();
    b.submit(app_spec("solo", "root.q")).unwrap();
    b.add("solo", task("a", "cpu=1")).unwrap();
    let mut gang = app_spec("gang", "root.q");
    gang.groups = vec![group("g", 2, "cpu=1")];
    b.submit(gang).unwrap();
    b.add("gang", member("m0", "g", "cpu=1")).unwrap();
    b.add("gang", member("m1", "g", "cpu=1")).unwrap();
    for _ in 0..4 {
        b.cycle();
    }
    assert_eq!((b.pool_of("gang", "m0"), b.pool_of("gang", "m1")), ("p1".to_owned(), "p1".to_owned()));
    order(&mut b, "p2", CordonOrder::Uncordon);
    order(&mut b, "p1", CordonOrder::Drain { grace_ms: 0 });
    b.cycle();
    assert_eq!(marked(&b, "solo", &["a"]), ["a"]);
    assert!(marked(&b, "gang", &["m0", "m1"]).is_empty(), "no gang member is taken");
    // Uncordoned before the victim ended: the mark is called off and it runs on.
    order(&mut b, "p1", CordonOrder::Uncordon);
    b.cycle();
    assert!(marked(&b, "solo", &["a"]).is_empty());
    assert_eq!(b.pool_of("solo", "a"), "p1");
    b.now += DEFAULT_PREEMPTION_GRACE_MS;
    b.cycle();
    assert_eq!(b.pool_of("solo", "a"), "p1");
}

#[test]
fn a_pool_shrunk_below_what_is_placed_preempts_the_lowest_priority_youngest_as_few_as_needed() {
    let mut b = Bench::new();
    b.pool("p", "cpu=6", &[]);
    b.queue("root.q", QueueLimits::default());
    b.submit(app_spec("app", "root.q")).unwrap();
    for (id, cpu, priority) in [("old", "cpu=2", 0), ("high", "cpu=2", 5), ("young", "cpu=1", 0), ("tiny", "cpu=1", 0)]
    {
        b.add("app", TaskSpec { priority: Priority::of(priority), ..task(id, cpu) }).unwrap();
        b.cycle();
        b.now += 1;
    }
    let all = ["old", "high", "young", "tiny"];
    // Something allot does not manage takes one cpu: the youngest of the lowest priority goes.
    b.pools.occupy(&pool("p"), res("cpu=1"), b.now).unwrap();
    b.cycle();
    assert_eq!(marked(&b, "app", &all), ["tiny"]);
    // The capacity is lowered by two more: two cpus more must go beyond `tiny`'s. The youngest
    // of priority 0, `young` (1), then `old` (2) are chosen; the last pass drops `young`, not
    // needed once `old` goes; `high` is never reached.
    b.pools.put_pool(&pool("p"), res("cpu=4"));
    b.cycle();
    assert_eq!(marked(&b, "app", &all), ["old", "tiny"]);
    assert!(!fits(&b, "p"), "the victims hold their room until they end");
    b.now += DEFAULT_PREEMPTION_GRACE_MS;
    b.cycle();
    assert!(fits(&b, "p"), "once they end the pool holds what it may");
    assert!(marked(&b, "app", &all).is_empty());
    assert_eq!((b.pool_of("app", "high"), b.pool_of("app", "young")), ("p".to_owned(), "p".to_owned()));
    // Room back: the victims are placed again.
    b.pools.occupy(&pool("p"), res(""), b.now).unwrap();
    b.pools.put_pool(&pool("p"), res("cpu=6"));
    b.cycle();
    assert!(all.iter().all(|id| b.sched.task(&aid("app"), &tid(id)).unwrap().placement.is_some()));
}

#[test]
fn a_task_whose_pools_are_all_cordoned_waits_and_says_so() {
    let mut b = Bench::new();
    b.pool("p", "cpu=2", &[]);
    order(&mut b, "p", CordonOrder::Cordon);
    b.queue("root.q", QueueLimits::default());
    b.submit(app_spec("app", "root.q")).unwrap();
    b.add("app", task("a", "cpu=1")).unwrap();
    b.cycle();
    let why = b.sched.task_why(&aid("app"), &tid("a")).unwrap().to_string();
    assert!(why.contains("cordoned"), "{why}");
    order(&mut b, "p", CordonOrder::Uncordon);
    b.cycle();
    assert_eq!(b.pool_of("app", "a"), "p");
}
