//! Priorities (of applications, tasks and queues) and borrowing with limits: the order the
//! scheduler places in, and what a queue may take of others' guarantees.

use std::collections::BTreeMap;

use allot_core::apps::priority::{Priority, PriorityClasses, PriorityPolicy};
use allot_core::apps::queues::{QueueLimits, QueuePath, SortPolicy};
use allot_core::apps::states::TaskState;
use allot_core::apps::{SchedConfig, SchedError, TaskSpec};

use super::apps::{aid, app_spec, res, task, tid, Bench};

fn classes() -> PriorityClasses {
    let classes = BTreeMap::from([("high".to_owned(), 1000), ("normal".to_owned(), 0), ("batch".to_owned(), -100)]);
    PriorityClasses::new(classes, Some("normal".to_owned())).unwrap()
}

fn bench_with_classes() -> Bench {
    Bench::with_config(SchedConfig { completing_grace_ms: 0, priority_classes: classes(), ..SchedConfig::default() })
}

fn class(name: &str) -> Priority {
    Priority { value: None, class: Some(name.to_owned()) }
}

fn used(b: &Bench, queue: &str) -> u64 {
    b.sched.queue(&QueuePath::new(queue).unwrap()).unwrap().usage.allocated.get_milli("cpu") / 1000
}

#[test]
fn applications_and_tasks_take_their_class_or_the_default_and_tasks_their_applications() {
    let mut b = bench_with_classes();
    b.pool("p", "cpu=8", &[]);
    b.queue("root.q", QueueLimits::default());
    b.submit(app_spec("plain", "root.q")).unwrap();
    let plain = b.sched.app(&aid("plain")).unwrap().spec.priority.clone();
    assert_eq!(plain, Priority { value: Some(0), class: Some("normal".into()) }, "the default class");
    b.submit(allot_core::apps::AppSpec { priority: class("batch"), ..app_spec("night", "root.q") }).unwrap();
    b.add("night", task("inherits", "cpu=1")).unwrap();
    b.add("night", TaskSpec { priority: class("high"), ..task("urgent", "cpu=1") }).unwrap();
    b.add("night", TaskSpec { priority: Priority::of(5), ..task("five", "cpu=1") }).unwrap();
    let priority = |t: &str| b.sched.task(&aid("night"), &tid(t)).unwrap().spec.priority.clone();
    assert_eq!(priority("inherits"), Priority { value: Some(-100), class: Some("batch".into()) });
    assert_eq!(priority("urgent"), Priority { value: Some(1000), class: Some("high".into()) });
    assert_eq!(priority("five"), Priority::of(5));
    // The same task again is the same; asked otherwise, a conflict.
    b.add("night", task("inherits", "cpu=1")).unwrap();
    let other = b.add("night", TaskSpec { priority: Priority::of(1), ..task("inherits", "cpu=1") });
    assert!(matches!(other, Err(SchedError::TaskConflict { field: "priority", .. })), "{other:?}");
    // The same application again is answered; with another priority, a conflict.
    b.submit(app_spec("plain", "root.q")).unwrap();
    let other = b.submit(allot_core::apps::AppSpec { priority: class("high"), ..app_spec("plain", "root.q") });
    assert!(matches!(other, Err(SchedError::AppConflict { field: "priority", .. })), "{other:?}");
    // An unknown class, or a value with a class, is refused.
    let unknown = b.submit(allot_core::apps::AppSpec { priority: class("nope"), ..app_spec("x", "root.q") });
    assert!(matches!(unknown, Err(SchedError::UnknownPriorityClass { .. })), "{unknown:?}");
    let both = Priority { value: Some(1), class: Some("high".into()) };
    let both = b.add("night", TaskSpec { priority: both, ..task("both", "cpu=1") });
    assert!(matches!(both, Err(SchedError::Invalid(_))), "{both:?}");
}

#[test]
fn a_priority_queue_places_the_application_of_higher_priority_first() {
    let mut b = bench_with_classes();
    b.pool("one", "cpu=1", &[]);
    b.queue("root.q", QueueLimits { sort: SortPolicy::Priority, ..QueueLimits::default() });
    b.submit(app_spec("first", "root.q")).unwrap();
    b.submit(allot_core::apps::AppSpec { priority: class("high"), ..app_spec("second", "root.q") }).unwrap();
    b.add("first", task("t", "cpu=1")).unwrap();
    // Its task names no priority: it has its application's.
    b.add("second", task("t", "cpu=1")).unwrap();
    b.cycle();
    assert_eq!(b.state("second", "t"), TaskState::Allocated);
    assert_eq!(b.state("first", "t"), TaskState::Pending);
}

/// A pool of four cpu, applications of 4 one-cpu tasks in `root.a` (priority 0) and `root.b`
/// (priority 10) with these limits: what each queue holds after a cycle.
fn race(a: QueueLimits, b_limits: QueueLimits) -> (u64, u64) {
    let mut b = Bench::new();
    b.pool("p", "cpu=4", &[]);
    b.queue("root.a", a);
    b.queue("root.b", b_limits);
    b.submit(app_spec("low", "root.a")).unwrap();
    b.submit(app_spec("high", "root.b")).unwrap();
    for i in 0..4 {
        b.add("low", task(&format!("t{i}"), "cpu=1")).unwrap();
        b.add("high", TaskSpec { priority: Priority::of(10), ..task(&format!("t{i}"), "cpu=1") }).unwrap();
    }
    b.cycle();
    (used(&b, "root.a"), used(&b, "root.b"))
}

#[test]
fn sibling_queues_go_by_priority_before_fair_share_with_offsets_and_fences() {
    // `a` is far below its guarantee and `b` above its: by fair share `a` would go first.
    let a = QueueLimits { guaranteed: res("cpu=100"), ..QueueLimits::default() };
    let b = QueueLimits { guaranteed: res("cpu=1"), ..QueueLimits::default() };
    assert_eq!(race(a, b), (0, 4), "the higher priority first");
    // An offset lifts a whole queue.
    let a = QueueLimits { priority_offset: 20, ..QueueLimits::default() };
    assert_eq!(race(a, QueueLimits::default()), (4, 0), "0 + 20 over 10");

    // A fence shows only its offset: what waits inside does not compete outside.
    let mut b = Bench::new();
    b.pool("p", "cpu=4", &[]);
    b.queue("root.fenced", QueueLimits { priority_policy: PriorityPolicy::Fence, ..QueueLimits::default() });
    b.queue("root.fenced.inner", QueueLimits::default());
    b.queue("root.open", QueueLimits::default());
    b.submit(app_spec("inside", "root.fenced.inner")).unwrap();
    b.submit(app_spec("outside", "root.open")).unwrap();
    for i in 0..4 {
        b.add("inside", TaskSpec { priority: Priority::of(1000), ..task(&format!("t{i}"), "cpu=1") }).unwrap();
        b.add("outside", TaskSpec { priority: Priority::of(5), ..task(&format!("t{i}"), "cpu=1") }).unwrap();
    }
    b.cycle();
    assert_eq!((used(&b, "root.fenced"), used(&b, "root.open")), (0, 4), "the fence shows 0, under 5");
}

#[test]
fn a_borrow_limit_caps_what_a_queue_takes_beyond_its_guarantee_and_an_unnamed_resource_is_unlimited() {
    let mut b = Bench::new();
    b.pool("p", "cpu=20,gpu=10", &[]);
    let limits = QueueLimits { guaranteed: res("cpu=4"), borrow_limit: Some(res("cpu=2")), ..QueueLimits::default() };
    b.queue("root.a", limits);
    b.submit(app_spec("a", "root.a")).unwrap();
    for i in 0..8 {
        b.add("a", task(&format!("t{i}"), "cpu=1")).unwrap();
    }
    // gpu is named by neither the guarantee nor the borrow limit: not limited at all.
    b.add("a", task("gpus", "gpu=10")).unwrap();
    b.cycle();
    assert_eq!(used(&b, "root.a"), 6, "guaranteed 4 + borrowed 2");
    assert_eq!(b.state("a", "gpus"), TaskState::Allocated);
    let why = b.sched.task_why(&aid("a"), &tid("t6")).unwrap().to_string();
    assert_eq!(
        why,
        "queue `root.a` would borrow more than its borrow_limit of cpu=2 beyond its guarantee of cpu=4 \
         (cpu=6 used, cpu=1 more wanted)"
    );
}

#[test]
fn a_lend_limit_keeps_the_rest_of_an_unused_guarantee_free_for_its_queue() {
    let mut b = Bench::new();
    b.pool("p", "cpu=10", &[]);
    // `owner` is guaranteed 6 and lends at most 2 of it while it does not use it: 4 stay free.
    let owner = QueueLimits { guaranteed: res("cpu=6"), lend_limit: Some(res("cpu=2")), ..QueueLimits::default() };
    b.queue("root.owner", owner);
    b.queue("root.other", QueueLimits::default());
    b.submit(app_spec("greedy", "root.other")).unwrap();
    for i in 0..10 {
        b.add("greedy", task(&format!("t{i}"), "cpu=1")).unwrap();
    }
    b.cycle();
    assert_eq!(used(&b, "root.other"), 6, "10 free, 4 of them kept for `owner`");
    let why = b.sched.task_why(&aid("greedy"), &tid("t6")).unwrap().to_string();
    assert_eq!(
        why,
        "queue `root.owner` does not lend cpu=4 of its unused guarantee (its lend_limit), and cpu=4 is free in all \
         pools together (cpu=1 wanted)"
    );
    // The owner is placed into what it kept, at once.
    b.submit(app_spec("mine", "root.owner")).unwrap();
    for i in 0..4 {
        b.add("mine", task(&format!("t{i}"), "cpu=1")).unwrap();
    }
    b.cycle();
    assert_eq!(used(&b, "root.owner"), 4);
    // Once the owner uses its guarantee beyond what it keeps, nothing is kept any more: `other`
    // is not held back, and the pool is full.
    assert_eq!(b.sched.task_why(&aid("greedy"), &tid("t6")).unwrap().code(), "no_room");
    // A queue below the lender (its child) may use what the lender keeps.
    let mut b = Bench::new();
    b.pool("p", "cpu=10", &[]);
    let owner = QueueLimits { guaranteed: res("cpu=6"), lend_limit: Some(res("cpu=0")), ..QueueLimits::default() };
    b.queue("root.owner", owner);
    b.queue("root.owner.child", QueueLimits::default());
    b.submit(app_spec("kid", "root.owner.child")).unwrap();
    for i in 0..10 {
        b.add("kid", task(&format!("t{i}"), "cpu=1")).unwrap();
    }
    b.cycle();
    assert_eq!(used(&b, "root.owner"), 10);
}

/// A queue shows the priority of what it still has to place, not of what it had at the start of
/// the cycle [YuniKorn keeps a queue's current priority as its asks change]: once its one urgent
/// task is placed, its bulk waits its turn by fair share with a sibling's of the same priority.
#[test]
fn a_queue_shows_the_priority_of_what_it_still_has_to_place_in_a_cycle() {
    let mut b = Bench::new();
    b.pool("p", "cpu=4", &[]);
    let half = || QueueLimits { guaranteed: res("cpu=2"), ..QueueLimits::default() };
    b.queue("root.a", half());
    b.queue("root.b", half());
    b.submit(app_spec("urgent", "root.a")).unwrap();
    b.add("urgent", TaskSpec { priority: Priority::of(10), ..task("t", "cpu=1") }).unwrap();
    b.submit(app_spec("bulk", "root.a")).unwrap();
    b.submit(app_spec("other", "root.b")).unwrap();
    for i in 0..4 {
        b.add("bulk", task(&format!("t{i}"), "cpu=1")).unwrap();
        b.add("other", task(&format!("t{i}"), "cpu=1")).unwrap();
    }
    b.cycle();
    assert_eq!(b.state("urgent", "t"), TaskState::Allocated, "the higher priority first");
    assert_eq!((used(&b, "root.a"), used(&b, "root.b")), (2, 2), "then by fair share");
}
