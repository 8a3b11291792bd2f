//! Preemption: to restore guarantees and priorities, by YuniKorn's rules made exact; the room
//! held for the preemptor; victims that end by their executor or at the end of their grace.

use allot_core::apps::priority::Priority;
use allot_core::apps::queues::{PreemptionPolicy, QueueLimits, QueuePath};
use allot_core::apps::states::TaskState;
use allot_core::apps::{SchedConfig, TaskSpec, World, DEFAULT_PREEMPTION_DELAY_MS, DEFAULT_PREEMPTION_GRACE_MS};
use allot_core::pools::PoolName;

use super::apps::{aid, app_spec, group, member, res, task, tid, Bench};

const DELAY: u64 = DEFAULT_PREEMPTION_DELAY_MS;
const GRACE: u64 = DEFAULT_PREEMPTION_GRACE_MS;

fn used(b: &Bench, queue: &str) -> u64 {
    b.sched.queue(&QueuePath::new(queue).unwrap()).unwrap().usage.allocated.get_milli("cpu") / 1000
}

fn placed(b: &Bench, app: &str) -> usize {
    (0..100).filter(|i| b.sched.task(&aid(app), &tid(&format!("t{i}"))).is_ok_and(|t| t.placement.is_some())).count()
}

/// What is allocated on the pool never exceeds its capacity.
fn no_overcommit(b: &Bench) {
    let pool = b.pools.pool(&PoolName::new("p").unwrap(), b.now).unwrap();
    assert!(pool.capacity.fits(&pool.allocated), "{} allocated of {}", pool.allocated, pool.capacity);
}

/// Application `app` in `queue` with one task `t` of priority 10, then a cycle once its delay
/// has passed.
fn urgent(b: &mut Bench, app: &str, queue: &str) {
    b.submit(app_spec(app, queue)).unwrap();
    b.add(app, TaskSpec { priority: Priority::of(10), ..task("t", "cpu=1") }).unwrap();
    b.now += DELAY;
    b.cycle();
}

fn guaranteed(cpu: &str) -> QueueLimits {
    QueueLimits { guaranteed: res(cpu), ..QueueLimits::default() }
}

fn tasks(b: &mut Bench, app: &str, n: usize, priority: i32) {
    for i in 0..n {
        let spec = TaskSpec { priority: Priority::of(priority), ..task(&format!("t{i}"), "cpu=1") };
        b.add(app, spec).unwrap();
    }
}

#[test]
fn a_queue_below_its_guarantee_takes_it_back_after_the_delay_and_the_grace_never_more() {
    let mut b = Bench::new();
    b.pool("p", "cpu=10", &[]);
    b.queue("root.a", guaranteed("cpu=5"));
    b.queue("root.b", guaranteed("cpu=5"));
    b.submit(app_spec("batch", "root.b")).unwrap();
    tasks(&mut b, "batch", 10, 0);
    b.cycle();
    assert_eq!(used(&b, "root.b"), 10, "b borrows what a does not use");
    b.submit(app_spec("mine", "root.a")).unwrap();
    tasks(&mut b, "mine", 7, 0);
    b.cycle();
    let why = b.sched.task_why(&aid("mine"), &tid("t0")).unwrap().to_string();
    assert!(why.contains("it may preempt in 30s"), "{why}");
    assert!(why.contains("as things are, it would preempt batch/t9 on pool `p`"), "whom: {why}");
    // The delay passes: the youngest of b's tasks are chosen, as many as a's guarantee allows.
    b.now += DELAY;
    b.cycle();
    no_overcommit(&b);
    let marked: Vec<String> = (0..10)
        .filter(|i| b.sched.task(&aid("batch"), &tid(&format!("t{i}"))).unwrap().preempting.is_some())
        .map(|i| format!("t{i}"))
        .collect();
    assert_eq!(marked, ["t5", "t6", "t7", "t8", "t9"], "the youngest, five: b keeps its guarantee");
    assert_eq!(used(&b, "root.b"), 10, "the victims keep their room until they end");
    let why = b.sched.task_why(&aid("mine"), &tid("t0")).unwrap();
    assert_eq!(why.code(), "preempting");
    // A sixth task of a would take a above its guarantee: it does not preempt.
    let why = b.sched.task_why(&aid("mine"), &tid("t5")).unwrap().to_string();
    assert!(why.contains("it cannot preempt"), "{why}");
    // The grace passes: the victims are taken back and a is placed in the same cycle.
    b.now += GRACE;
    b.cycle();
    no_overcommit(&b);
    assert_eq!((used(&b, "root.a"), used(&b, "root.b")), (5, 5));
    let victim = b.sched.task(&aid("batch"), &tid("t9")).unwrap();
    assert_eq!((victim.state, victim.preemptions), (TaskState::Pending, 1));
    assert!(victim.reason.as_deref().unwrap().starts_with("preempted for mine/"), "{:?}", victim.reason);
    // And nothing more moves: b is at its guarantee, a at its.
    b.now += DELAY + GRACE;
    b.cycle();
    assert_eq!((used(&b, "root.a"), used(&b, "root.b")), (5, 5));
    let none_marked =
        (0..10).all(|i| b.sched.task(&aid("batch"), &tid(&format!("t{i}"))).unwrap().preempting.is_none());
    assert!(none_marked, "b's waiting tasks do not preempt back");
}

#[test]
fn a_victim_whose_executor_ends_it_frees_its_room_at_once_and_nobody_else_takes_it() {
    let mut b = Bench::new();
    b.pool("p", "cpu=4", &[]);
    b.queue("root.a", guaranteed("cpu=2"));
    b.queue("root.b", QueueLimits::default());
    b.queue("root.c", QueueLimits::default());
    b.submit(app_spec("batch", "root.b")).unwrap();
    tasks(&mut b, "batch", 4, 0);
    b.cycle();
    b.submit(app_spec("mine", "root.a")).unwrap();
    tasks(&mut b, "mine", 1, 0);
    b.now += DELAY;
    b.cycle();
    let victim = (0..4).find(|i| b.sched.task(&aid("batch"), &tid(&format!("t{i}"))).unwrap().preempting.is_some());
    let victim = tid(&format!("t{}", victim.expect("one victim")));
    // The executor ends it: back to waiting at once.
    {
        let now = b.now;
        let mut world = World { pools: &mut b.pools, ledger: &mut b.ledger };
        b.sched.preempted(&aid("batch"), &victim, now, &mut world).unwrap();
    }
    b.check();
    // Another queue's task arrives: the room freed is held for `mine`, not for it.
    b.submit(app_spec("other", "root.c")).unwrap();
    tasks(&mut b, "other", 1, 100);
    b.cycle();
    assert_eq!(placed(&b, "mine"), 1);
    assert_eq!(placed(&b, "other"), 0);
    no_overcommit(&b);
    // A task not being preempted cannot be reported so.
    let now = b.now;
    let mut world = World { pools: &mut b.pools, ledger: &mut b.ledger };
    assert!(b.sched.preempted(&aid("batch"), &tid("t0"), now, &mut world).is_err());
}

#[test]
fn a_higher_priority_takes_as_little_as_possible_lowest_priority_then_youngest() {
    let mut b = Bench::new();
    b.pool("p", "cpu=6", &[]);
    b.queue("root.q", QueueLimits::default());
    b.submit(app_spec("low", "root.q")).unwrap();
    // Placed in this order: old1 (cpu=2, priority 0), mid (cpu=2, priority 5), young (cpu=1, priority 0),
    // tiny (cpu=1, priority 0).
    for (id, cpu, priority) in [("old1", "cpu=2", 0), ("mid", "cpu=2", 5), ("young", "cpu=1", 0), ("tiny", "cpu=1", 0)]
    {
        b.add("low", TaskSpec { priority: Priority::of(priority), ..task(id, cpu) }).unwrap();
        b.cycle();
        b.now += 1;
    }
    b.submit(app_spec("urgent", "root.q")).unwrap();
    b.add("urgent", TaskSpec { priority: Priority::of(10), ..task("t", "cpu=2") }).unwrap();
    b.now += DELAY;
    b.cycle();
    let marked: Vec<&str> = ["old1", "mid", "young", "tiny"]
        .into_iter()
        .filter(|t| b.sched.task(&aid("low"), &tid(t)).unwrap().preempting.is_some())
        .collect();
    // Lowest priority first, youngest first: tiny, young (2 cpu: enough). Not old1 and not mid.
    assert_eq!(marked, ["young", "tiny"]);
    // The same with one cpu free: only one of them is needed, and the last pass drops the other.
    let mut b = Bench::new();
    b.pool("p", "cpu=6", &[]);
    b.queue("root.q", QueueLimits::default());
    b.submit(app_spec("low", "root.q")).unwrap();
    for (id, cpu) in [("big", "cpu=2"), ("small", "cpu=1"), ("two", "cpu=2")] {
        b.add("low", task(id, cpu)).unwrap();
        b.cycle();
        b.now += 1;
    }
    b.submit(app_spec("urgent", "root.q")).unwrap();
    b.add("urgent", TaskSpec { priority: Priority::of(10), ..task("t", "cpu=2") }).unwrap();
    b.now += DELAY;
    b.cycle();
    let marked: Vec<&str> = ["big", "small", "two"]
        .into_iter()
        .filter(|t| b.sched.task(&aid("low"), &tid(t)).unwrap().preempting.is_some())
        .collect();
    // One cpu is free: the youngest, `two` (cpu=2), alone would do; `small` would too; the
    // youngest goes first and is enough.
    assert_eq!(marked, ["two"]);
}

#[test]
fn what_may_not_be_taken_is_not_and_the_waiting_task_says_why() {
    let setup = |victim: TaskSpec, queue: QueueLimits, config: SchedConfig| {
        let mut b = Bench::with_config(config);
        b.pool("p", "cpu=1", &[]);
        b.queue("root.low", queue);
        b.queue("root.high", QueueLimits::default());
        b.submit(app_spec("low", "root.low")).unwrap();
        b.add("low", victim).unwrap();
        b.cycle();
        urgent(&mut b, "high", "root.high");
        let marked = b.sched.task(&aid("low"), &tid("v")).unwrap().preempting.is_some();
        (marked, b.sched.task_why(&aid("high"), &tid("t")).unwrap().to_string())
    };
    let config = || SchedConfig { completing_grace_ms: 0, ..SchedConfig::default() };
    let plain = || task("v", "cpu=1");
    assert!(setup(plain(), QueueLimits::default(), config()).0, "the baseline: it is taken");
    let (marked, why) = setup(TaskSpec { preemptable: false, ..plain() }, QueueLimits::default(), config());
    assert!(!marked && why.contains("may not be preempted"), "{why}");
    let disabled = QueueLimits { preemption: PreemptionPolicy::Disabled, ..QueueLimits::default() };
    let (marked, why) = setup(plain(), disabled, config());
    assert!(!marked && why.contains("preemption disabled"), "{why}");
    let off = SchedConfig { preemption: false, ..config() };
    assert!(!setup(plain(), QueueLimits::default(), off).0, "preemption off for the daemon");
    let (marked, why) = setup(TaskSpec { priority: Priority::of(10), ..plain() }, QueueLimits::default(), config());
    assert!(!marked && why.contains("no task there has a lower priority"), "{why}");
}

#[test]
fn a_task_preempted_max_preemptions_times_is_protected() {
    let config = SchedConfig { completing_grace_ms: 0, max_preemptions: 1, ..SchedConfig::default() };
    let mut b = Bench::with_config(config);
    b.pool("p", "cpu=1", &[]);
    b.queue("root.q", QueueLimits::default());
    b.submit(app_spec("low", "root.q")).unwrap();
    b.add("low", task("v", "cpu=1")).unwrap();
    b.cycle();
    urgent(&mut b, "high", "root.q");
    b.now += GRACE;
    b.cycle();
    assert_eq!(b.sched.task(&aid("high"), &tid("t")).unwrap().state, TaskState::Allocated);
    assert_eq!(b.sched.task(&aid("low"), &tid("v")).unwrap().preemptions, 1);
    // `high` ends; `low/v` is placed again; a new urgent task may not take it again.
    b.complete("high", "t");
    b.cycle();
    assert_eq!(b.sched.task(&aid("low"), &tid("v")).unwrap().state, TaskState::Allocated);
    urgent(&mut b, "again", "root.q");
    assert!(b.sched.task(&aid("low"), &tid("v")).unwrap().preempting.is_none());
    let why = b.sched.task_why(&aid("again"), &tid("t")).unwrap().to_string();
    assert!(why.contains("max_preemptions"), "{why}");
}

#[test]
fn a_preemption_fence_keeps_a_queues_tasks_from_taking_outside_it() {
    let mut b = Bench::new();
    b.pool("p", "cpu=1", &[]);
    b.queue("root.fenced", QueueLimits { preemption: PreemptionPolicy::Fence, ..QueueLimits::default() });
    b.queue("root.other", QueueLimits::default());
    b.submit(app_spec("low", "root.other")).unwrap();
    b.add("low", task("v", "cpu=1")).unwrap();
    b.cycle();
    urgent(&mut b, "high", "root.fenced");
    assert!(b.sched.task(&aid("low"), &tid("v")).unwrap().preempting.is_none());
    let why = b.sched.task_why(&aid("high"), &tid("t")).unwrap().to_string();
    assert!(why.contains("preemption fence"), "{why}");
}

/// The executor of a task being preempted ends it: its placement is released.
fn executor_ends(b: &mut Bench, app: &str, task: &str) {
    let now = b.now;
    let mut world = World { pools: &mut b.pools, ledger: &mut b.ledger };
    b.sched.preempted(&aid(app), &tid(task), now, &mut world).unwrap();
    b.check();
}

/// A gang of two members of cpu=1 in `root.q`, reserved on pool `p` and placed.
fn placed_gang(b: &mut Bench, preemptable: [bool; 2]) {
    let mut gang = app_spec("gang", "root.q");
    gang.groups = vec![group("workers", 2, "cpu=1")];
    b.submit(gang).unwrap();
    for (m, preemptable) in preemptable.into_iter().enumerate() {
        b.add("gang", TaskSpec { preemptable, ..member(&format!("w{m}"), "workers", "cpu=1") }).unwrap();
    }
    b.cycle();
    b.cycle();
    assert_eq!((b.state("gang", "w0"), b.state("gang", "w1")), (TaskState::Allocated, TaskState::Allocated));
}

#[test]
fn a_gang_is_taken_whole_and_reserved_again_never_placed_in_part() {
    let mut b = Bench::new();
    b.pool("p", "cpu=2", &[("zone", "a")]);
    // Room where a member taken back could go alone, if it were let.
    b.pool("spare", "cpu=1", &[("zone", "b")]);
    b.queue("root.q", QueueLimits::default());
    let mut gang = app_spec("gang", "root.q");
    gang.groups = vec![group("workers", 2, "cpu=1")];
    gang.groups[0].selector = [("zone".to_owned(), "a".to_owned())].into();
    b.submit(gang).unwrap();
    for m in 0..2 {
        b.add("gang", member(&format!("w{m}"), "workers", "cpu=1")).unwrap();
    }
    b.cycle();
    b.cycle();
    assert_eq!((b.state("gang", "w0"), b.state("gang", "w1")), (TaskState::Allocated, TaskState::Allocated));
    // An urgent task that needs one of the gang's two places: the whole gang goes.
    b.submit(app_spec("urgent", "root.q")).unwrap();
    let spec = TaskSpec { priority: Priority::of(100), ..task("t", "cpu=1") };
    b.add("urgent", TaskSpec { selector: [("zone".to_owned(), "a".to_owned())].into(), ..spec }).unwrap();
    b.now += DELAY;
    b.cycle();
    let members = |b: &Bench| -> Vec<bool> {
        (0..2).map(|m| b.sched.task(&aid("gang"), &tid(&format!("w{m}"))).unwrap().preempting.is_some()).collect()
    };
    assert_eq!(members(&b), [true, true], "both members are taken, or neither");
    assert_eq!(b.sched.task_why(&aid("urgent"), &tid("t")).unwrap().code(), "preempting");
    // One member's executor ends it: it waits for its gang, even with room for it alone.
    executor_ends(&mut b, "gang", "w0");
    b.cycle();
    no_overcommit_on(&b, &["p", "spare"]);
    assert_eq!(b.state("urgent", "t"), TaskState::Allocated, "the room w0 freed was held for the preemptor");
    assert_eq!(b.state("gang", "w0"), TaskState::Pending);
    assert_eq!(b.sched.task_why(&aid("gang"), &tid("w0")).unwrap().code(), "after_gang");
    assert_eq!(b.state("gang", "w1"), TaskState::Allocated, "w1 runs on until its executor ends it");
    // The preemptor is placed: the gang's last mark is not called off for that.
    assert_eq!(members(&b), [false, true]);
    executor_ends(&mut b, "gang", "w1");
    let app = b.sched.app(&aid("gang")).unwrap();
    assert_eq!(app.state.name(), "Reserving", "the gang waits to be reserved again");
    assert!(app.slots.is_empty() && app.reserved_at.is_none());
    assert_eq!(app.gang_preempted_at, Some(b.now));
    b.cycle();
    // One place on `p` for two members: nothing of it is placed.
    assert_eq!((b.state("gang", "w0"), b.state("gang", "w1")), (TaskState::Pending, TaskState::Pending));
    let pool = b.pools.pool(&PoolName::new("spare").unwrap(), b.now).unwrap();
    assert!(pool.allocated.is_empty(), "no member went alone to the spare pool");
    for m in ["w0", "w1"] {
        let member = b.sched.task(&aid("gang"), &tid(m)).unwrap();
        assert_eq!(member.preemptions, 1);
        assert!(member.reason.as_deref().unwrap().starts_with("preempted for urgent/t"), "{:?}", member.reason);
    }
    // The urgent task ends: the gang is reserved again, whole.
    b.complete("urgent", "t");
    b.cycle();
    b.cycle();
    assert_eq!((b.state("gang", "w0"), b.state("gang", "w1")), (TaskState::Allocated, TaskState::Allocated));
    assert_eq!(b.sched.app(&aid("gang")).unwrap().state.name(), "Running");
    no_overcommit_on(&b, &["p", "spare"]);
}

/// A gang of two fills pool `p` of `root.q`; a task of priority 100 arrives there and a cycle
/// runs once its delay has passed.
fn urgent_beside_a_gang(preemptable: [bool; 2]) -> Bench {
    let mut b = Bench::new();
    b.pool("p", "cpu=2", &[]);
    b.queue("root.q", QueueLimits::default());
    placed_gang(&mut b, preemptable);
    b.submit(app_spec("urgent", "root.q")).unwrap();
    b.add("urgent", TaskSpec { priority: Priority::of(100), ..task("t", "cpu=1") }).unwrap();
    b.now += DELAY;
    b.cycle();
    b
}

#[test]
fn a_gang_being_taken_whose_last_member_fails_otherwise_is_reserved_again() {
    let mut b = urgent_beside_a_gang([true, true]);
    executor_ends(&mut b, "gang", "w0");
    // The pool's executors stop before w1's ends it: w1 fails there, as a gang member does.
    {
        let now = b.now;
        let mut world = World { pools: &mut b.pools, ledger: &mut b.ledger };
        b.sched.pool_lost(&PoolName::new("p").unwrap(), "its executor stopped", now, &mut world);
    }
    b.check();
    assert_eq!(b.state("gang", "w1"), TaskState::Failed);
    let app = b.sched.app(&aid("gang")).unwrap();
    assert_eq!(app.state.name(), "Reserving", "w0 does not wait for a gang that is gone");
    assert!(app.slots.is_empty());
    assert_eq!(b.sched.task(&aid("gang"), &tid("w0")).unwrap().slot, None);
}

#[test]
fn a_gang_with_a_member_that_may_not_be_taken_is_not_taken_at_all() {
    let b = urgent_beside_a_gang([true, false]);
    for m in 0..2 {
        assert!(b.sched.task(&aid("gang"), &tid(&format!("w{m}"))).unwrap().preempting.is_none());
    }
    let why = b.sched.task_why(&aid("urgent"), &tid("t")).unwrap().to_string();
    assert!(why.contains("gang"), "{why}");
}

#[test]
fn a_single_task_is_taken_rather_than_a_whole_gang() {
    let mut b = Bench::new();
    b.pool("p", "cpu=3", &[]);
    b.queue("root.q", QueueLimits::default());
    placed_gang(&mut b, [true, true]);
    b.submit(app_spec("batch", "root.q")).unwrap();
    tasks(&mut b, "batch", 1, 0);
    b.cycle();
    b.submit(app_spec("urgent", "root.q")).unwrap();
    b.add("urgent", TaskSpec { priority: Priority::of(100), ..task("t", "cpu=1") }).unwrap();
    b.now += DELAY;
    b.cycle();
    assert_eq!(marked(&b, "batch", 1), ["t0"], "one victim rather than two");
    for m in 0..2 {
        assert!(b.sched.task(&aid("gang"), &tid(&format!("w{m}"))).unwrap().preempting.is_none());
    }
}

#[test]
fn a_task_whose_held_pool_is_lost_holds_nothing_and_may_preempt_again() {
    let mut b = Bench::new();
    b.pool("p", "cpu=1", &[]);
    b.pool("other", "cpu=1", &[]);
    b.queue("root.q", QueueLimits::default());
    b.submit(app_spec("low", "root.q")).unwrap();
    b.add("low", task("v", "cpu=1")).unwrap();
    b.add("low", task("w", "cpu=1")).unwrap();
    b.cycle();
    urgent(&mut b, "high", "root.q");
    let held = b.sched.task(&aid("high"), &tid("t")).unwrap().held.clone().expect("room held");
    // The executors of that pool stop: its tasks wait again, and the room held there is no more.
    {
        let now = b.now;
        let mut world = World { pools: &mut b.pools, ledger: &mut b.ledger };
        b.sched.pool_lost(&held, "its executor stopped", now, &mut world);
    }
    b.cycle();
    // What was held there is given up; a new decision may hold room on the pool still up.
    let task = b.sched.task(&aid("high"), &tid("t")).unwrap();
    assert_ne!(task.held.as_ref(), Some(&held), "nothing is held on a pool that is down");
}

/// What is allocated on each of `pools` never exceeds its capacity.
fn no_overcommit_on(b: &Bench, pools: &[&str]) {
    for name in pools {
        let pool = b.pools.pool(&PoolName::new(name).unwrap(), b.now).unwrap();
        assert!(pool.capacity.fits(&pool.allocated), "{name}: {} allocated of {}", pool.allocated, pool.capacity);
    }
}

fn marked(b: &Bench, app: &str, n: usize) -> Vec<String> {
    (0..n)
        .filter(|i| b.sched.task(&aid(app), &tid(&format!("t{i}"))).unwrap().preempting.is_some())
        .map(|i| format!("t{i}"))
        .collect()
}

#[test]
fn a_gang_below_its_guarantee_preempts_for_every_member_at_once_and_nobody_takes_its_room() {
    let mut b = Bench::new();
    b.pool("p", "cpu=4", &[]);
    b.pool("q", "cpu=4", &[]);
    b.queue("root.a", guaranteed("cpu=4"));
    b.queue("root.b", QueueLimits::default());
    b.queue("root.c", QueueLimits::default());
    b.submit(app_spec("batch", "root.b")).unwrap();
    tasks(&mut b, "batch", 8, 0);
    b.cycle();
    assert_eq!(used(&b, "root.b"), 8, "b borrows every pool");
    // A gang of two members of cpu=2: with it, a is at its guarantee.
    let mut gang = app_spec("gang", "root.a");
    gang.groups = vec![group("workers", 2, "cpu=2")];
    b.submit(gang).unwrap();
    for m in 0..2 {
        b.add("gang", member(&format!("w{m}"), "workers", "cpu=2")).unwrap();
    }
    b.cycle();
    let why = b.sched.app_why(&aid("gang")).unwrap().to_string();
    assert!(why.contains("it may preempt in 30s"), "{why}");
    // Whom it would take, as things are: what it takes once the delay is over (below).
    assert!(why.contains("it would preempt batch/t3, batch/t2, batch/t1, batch/t0 on pool `p` for its gang"), "{why}");
    assert!(b.sched.task_why(&aid("gang"), &tid("w0")).unwrap().to_string().contains("it may preempt"));
    b.now += DELAY;
    b.cycle();
    no_overcommit_on(&b, &["p", "q"]);
    // Room for both members at once: four of b's tasks, and no more; the first pool that has
    // them (the youngest there first), for both.
    assert_eq!(marked(&b, "batch", 8), ["t0", "t1", "t2", "t3"]);
    let app = b.sched.app(&aid("gang")).unwrap();
    let p = PoolName::new("p").unwrap();
    assert_eq!(app.held, [p.clone(), p], "room held for each member");
    assert!(app.slots.is_empty(), "nothing of the gang is placed before its victims end");
    assert_eq!(b.sched.app_why(&aid("gang")).unwrap().code(), "preempting");
    // Another queue's application arrives, as urgent as b's tasks: it may not preempt them, and
    // the room the victims free is the gang's.
    b.submit(app_spec("other", "root.c")).unwrap();
    tasks(&mut b, "other", 4, 0);
    b.cycle();
    assert_eq!(b.sched.app_why(&aid("gang")).unwrap().code(), "preempting", "the gang still waits for its room");
    b.now += GRACE;
    b.cycle();
    b.cycle();
    no_overcommit_on(&b, &["p", "q"]);
    let app = b.sched.app(&aid("gang")).unwrap();
    assert_eq!(app.slots.len(), 2, "the whole gang is reserved");
    assert!(app.held.is_empty(), "reserved, it holds no room any more");
    assert_eq!((b.state("gang", "w0"), b.state("gang", "w1")), (TaskState::Allocated, TaskState::Allocated));
    assert_eq!(placed(&b, "other"), 0, "nobody took the room held for the gang");
    assert_eq!((used(&b, "root.a"), used(&b, "root.b")), (4, 4));
    let victim = b.sched.task(&aid("batch"), &tid("t3")).unwrap();
    assert_eq!((victim.state, victim.preemptions), (TaskState::Pending, 1));
    assert!(victim.reason.as_deref().unwrap().starts_with("preempted for gang/workers"), "{:?}", victim.reason);
    // And nothing more moves.
    b.now += DELAY + GRACE;
    b.cycle();
    assert!(marked(&b, "batch", 8).is_empty(), "b's waiting tasks do not preempt back");
    assert_eq!((used(&b, "root.a"), used(&b, "root.b")), (4, 4));
}

#[test]
fn a_gang_preempts_all_of_its_room_or_none() {
    let mut b = Bench::new();
    b.pool("p", "cpu=4", &[]);
    b.queue("root.a", guaranteed("cpu=4"));
    b.queue("root.b", QueueLimits::default());
    b.submit(app_spec("batch", "root.b")).unwrap();
    tasks(&mut b, "batch", 2, 0);
    // Two of the pool's four are held by tasks that may not be preempted.
    b.submit(app_spec("pinned", "root.b")).unwrap();
    for i in 0..2 {
        b.add("pinned", TaskSpec { preemptable: false, ..task(&format!("t{i}"), "cpu=1") }).unwrap();
    }
    b.cycle();
    let mut gang = app_spec("gang", "root.a");
    gang.groups = vec![group("workers", 3, "cpu=1")];
    b.submit(gang).unwrap();
    b.now += DELAY;
    b.cycle();
    // Two members could have room, the third not: nothing is taken.
    assert!(marked(&b, "batch", 2).is_empty(), "no victim for a gang that cannot have all its room");
    assert!(b.sched.app(&aid("gang")).unwrap().held.is_empty());
    let why = b.sched.app_why(&aid("gang")).unwrap().to_string();
    assert!(why.contains("it cannot preempt"), "{why}");
    assert!(why.contains("preemptable: false"), "{why}");
}

/// The queue `root.team` may hold cpu=2 in all (its `max`), over two leaves; `root.other` has
/// no limit; the pool has room to spare.
fn team_at_its_max(b: &mut Bench) {
    b.pool("p", "cpu=10", &[]);
    b.queue("root.team", QueueLimits { max: Some(res("cpu=2")), ..QueueLimits::default() });
    b.queue("root.team.a", QueueLimits::default());
    b.queue("root.team.b", QueueLimits::default());
    b.queue("root.other", QueueLimits::default());
    b.submit(app_spec("batch", "root.team.a")).unwrap();
    tasks(b, "batch", 3, 0);
    b.submit(app_spec("other", "root.other")).unwrap();
    tasks(b, "other", 2, 0);
    b.cycle();
    assert_eq!((placed(b, "batch"), placed(b, "other"), used(b, "root.team")), (2, 2, 2));
}

#[test]
fn a_task_held_back_by_its_queues_max_takes_a_lower_priority_task_of_that_queue_and_its_room_stays_its() {
    let mut b = Bench::new();
    team_at_its_max(&mut b);
    b.submit(app_spec("urgent", "root.team.b")).unwrap();
    b.add("urgent", TaskSpec { priority: Priority::of(10), ..task("t", "cpu=1") }).unwrap();
    b.cycle();
    let why = b.sched.task_why(&aid("urgent"), &tid("t")).unwrap();
    assert_eq!(why.code(), "queue_limit");
    assert!(why.to_string().contains("it may preempt in 30s"), "{why}");
    assert!(why.to_string().contains("it would preempt batch/t1"), "{why}");
    b.now += DELAY;
    b.cycle();
    // One of the team's tasks, of a lower priority, the youngest; never one outside the team.
    assert_eq!(marked(&b, "batch", 3), ["t1"]);
    assert!(marked(&b, "other", 2).is_empty());
    assert_eq!(b.sched.task_why(&aid("urgent"), &tid("t")).unwrap().code(), "preempting");
    // The team's waiting task of a lower priority does not take what the victim frees.
    b.cycle();
    assert_eq!(b.sched.task_why(&aid("urgent"), &tid("t")).unwrap().code(), "preempting");
    executor_ends(&mut b, "batch", "t1");
    b.cycle();
    b.check();
    assert_eq!(b.state("urgent", "t"), TaskState::Allocated);
    assert_eq!((b.state("batch", "t1"), b.state("batch", "t2")), (TaskState::Pending, TaskState::Pending));
    assert_eq!(used(&b, "root.team"), 2, "never over its max");
    // Nothing preempts back, however long it waits.
    b.now += DELAY + GRACE;
    b.cycle();
    assert!(marked(&b, "batch", 3).is_empty());
    assert_eq!(b.state("urgent", "t"), TaskState::Allocated);
}

#[test]
fn a_task_held_back_by_its_queues_max_takes_nothing_of_an_equal_priority_nor_outside_its_queue() {
    let mut b = Bench::new();
    team_at_its_max(&mut b);
    b.submit(app_spec("peer", "root.team.b")).unwrap();
    tasks(&mut b, "peer", 1, 0);
    b.now += DELAY;
    b.cycle();
    assert!(marked(&b, "batch", 3).is_empty() && marked(&b, "other", 2).is_empty());
    // Nothing of a lower priority under the queue: it waits on the limit, and no more is said.
    let why = b.sched.task_why(&aid("peer"), &tid("t0")).unwrap();
    assert_eq!(why.code(), "queue_limit");
    assert!(!why.to_string().contains("preempt"), "{why}");
}

#[test]
fn room_a_whole_gang_frees_beyond_its_preemptors_need_goes_to_the_queue_still_owed_its_guarantee() {
    let mut b = Bench::new();
    b.pool("p", "cpu=3", &[]);
    b.queue("root.a", guaranteed("cpu=2"));
    b.queue("root.b", QueueLimits::default());
    b.queue("root.c", QueueLimits::default());
    let mut gang = app_spec("gang", "root.b");
    gang.groups = vec![group("workers", 3, "cpu=1")];
    b.submit(gang).unwrap();
    for m in 0..3 {
        b.add("gang", member(&format!("w{m}"), "workers", "cpu=1")).unwrap();
    }
    b.cycle();
    b.cycle();
    // `a` is owed cpu=2; `c`, of a higher priority, is owed nothing and comes first otherwise.
    b.submit(app_spec("a", "root.a")).unwrap();
    tasks(&mut b, "a", 2, 0);
    b.submit(app_spec("c", "root.c")).unwrap();
    tasks(&mut b, "c", 2, 5);
    b.now += DELAY;
    b.cycle();
    let held = |b: &Bench, task: &str| b.sched.task(&aid("a"), &tid(task)).unwrap().held.is_some();
    assert!(held(&b, "t0") && held(&b, "t1"), "the gang frees room for both of a's tasks, held for them");
    for m in ["w0", "w1", "w2"] {
        executor_ends(&mut b, "gang", m);
    }
    b.cycle();
    no_overcommit(&b);
    assert_eq!((b.state("a", "t0"), b.state("a", "t1")), (TaskState::Allocated, TaskState::Allocated));
    assert_eq!((used(&b, "root.a"), placed(&b, "c")), (2, 1), "c has what is left");
}
