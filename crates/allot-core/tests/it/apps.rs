//! The scheduler: placements on pools and tokens, gangs all or nothing, timeouts, queue limits,
//! fair share, selectors, and why things wait. Every step checks the invariants of the pools,
//! the ledger and the scheduler. At length, as one thing: every check drives the one `Bench`
//! below (a scheduler over real pools and a real ledger), and splitting them would only move it.

use allot_core::apps::priority::Priority;
use std::collections::BTreeMap;

use allot_core::apps::queues::{QueueLimits, QueuePath, SortPolicy};
use allot_core::apps::states::{AppState, TaskState};
use allot_core::apps::{
    AppId, AppSpec, GangStyle, GroupName, Runner, Runners, SchedConfig, SchedError, Scheduler, SchedulingPolicy,
    TaskGroup, TaskId, TaskSpec, TokenNeed, Why, World, RESERVATION_TIMEOUT,
};
use allot_core::pools::{LeaseRules, PoolName, Pools};
use allot_core::{
    AllocateRequest, Constraints, Decision, LeaseRequest, Ledger, LedgerError, Millis, NamespaceName, Resources, Token,
};

pub(crate) struct Bench {
    pub(crate) sched: Scheduler,
    pub(crate) pools: Pools,
    pub(crate) ledger: Ledger,
    pub(crate) now: Millis,
    next_id: u64,
}

pub(crate) fn res(text: &str) -> Resources {
    text.parse().unwrap()
}

pub(crate) fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

pub(crate) fn app_spec(id: &str, queue: &str) -> AppSpec {
    AppSpec::new(AppId::new(id).unwrap(), QueuePath::new(queue).unwrap(), "alice")
}

pub(crate) fn group(name: &str, members: u32, resources: &str) -> TaskGroup {
    TaskGroup {
        name: GroupName::new(name).unwrap(),
        min_members: members,
        min_resources: res(resources),
        selector: BTreeMap::new(),
        tokens: Vec::new(),
    }
}

pub(crate) fn task(id: &str, resources: &str) -> TaskSpec {
    TaskSpec {
        preemptable: true,
        id: TaskId::new(id).unwrap(),
        resources: res(resources),
        tokens: Vec::new(),
        group: None,
        priority: Priority::default(),
        selector: BTreeMap::new(),
        spec: String::new(),
    }
}

pub(crate) fn member(id: &str, group: &str, resources: &str) -> TaskSpec {
    TaskSpec { group: Some(GroupName::new(group).unwrap()), ..task(id, resources) }
}

pub(crate) fn aid(id: &str) -> AppId {
    AppId::new(id).unwrap()
}

pub(crate) fn tid(id: &str) -> TaskId {
    TaskId::new(id).unwrap()
}

impl Bench {
    pub(crate) fn new() -> Bench {
        Bench::with_config(SchedConfig { completing_grace_ms: 0, ..SchedConfig::default() })
    }

    pub(crate) fn with_config(config: SchedConfig) -> Bench {
        Bench {
            sched: Scheduler::new(config),
            pools: Pools::new(LeaseRules::default()),
            ledger: Ledger::new(),
            now: 1_000,
            next_id: 1,
        }
    }

    pub(crate) fn pool(&mut self, name: &str, capacity: &str, pool_labels: &[(&str, &str)]) {
        let name = PoolName::new(name).unwrap();
        self.pools.put_pool(&name, res(capacity));
        self.pools.label_pool(&name, labels(pool_labels), self.now).unwrap();
    }

    /// Live executors: each runs its pools with its task types.
    pub(crate) fn run(&mut self, executors: &[(&[&str], &[&str])]) {
        let leases: Vec<Runner> = executors
            .iter()
            .map(|(pools, types)| Runner {
                pools: pools.iter().map(|p| PoolName::new(p).unwrap()).collect(),
                task_types: types.iter().map(|t| (*t).to_owned()).collect(),
                live: true,
            })
            .collect();
        self.sched.set_runners(Runners::from_leases(&leases));
    }

    pub(crate) fn queue(&mut self, path: &str, limits: QueueLimits) {
        self.sched.put_queue(QueuePath::new(path).unwrap(), limits).unwrap();
    }

    pub(crate) fn namespace(&mut self, name: &str, quota: u64) {
        self.ledger.put_namespace(&NamespaceName::new(name).unwrap(), quota, self.now).unwrap();
    }

    pub(crate) fn submit(&mut self, spec: AppSpec) -> Result<(), SchedError> {
        let world = World { pools: &mut self.pools, ledger: &mut self.ledger };
        self.sched.add_app(spec, self.now, &world).map(|_| ())
    }

    pub(crate) fn add(&mut self, app: &str, spec: TaskSpec) -> Result<(), SchedError> {
        let world = World { pools: &mut self.pools, ledger: &mut self.ledger };
        self.sched.add_task(&aid(app), spec, self.now, &world).map(|_| ())
    }

    pub(crate) fn cycle(&mut self) -> allot_core::apps::CycleReport {
        let mut next = self.next_id;
        let now = self.now;
        let (report, _) = {
            let mut world = World { pools: &mut self.pools, ledger: &mut self.ledger };
            self.sched.schedule(now, &mut world, &mut || {
                next += 1;
                next
            })
        };
        self.next_id = next;
        self.check();
        report
    }

    pub(crate) fn check(&self) {
        self.sched.check_invariants(&self.pools).unwrap();
        self.pools.check_invariants().unwrap();
        self.ledger.check_invariants().unwrap();
    }

    pub(crate) fn state(&self, app: &str, task: &str) -> TaskState {
        self.sched.task(&aid(app), &tid(task)).unwrap().state
    }

    pub(crate) fn pool_of(&self, app: &str, task: &str) -> String {
        self.sched.task(&aid(app), &tid(task)).unwrap().placement.as_ref().unwrap().pool.to_string()
    }

    pub(crate) fn app_state(&self, app: &str) -> AppState {
        self.sched.app(&aid(app)).unwrap().state
    }

    pub(crate) fn complete(&mut self, app: &str, task: &str) {
        let now = self.now;
        let mut world = World { pools: &mut self.pools, ledger: &mut self.ledger };
        self.sched.finish_task(&aid(app), &tid(task), None, now, &mut world).unwrap();
        self.check();
    }
}

#[test]
fn tasks_are_placed_best_fit_and_their_app_runs_then_completes() {
    let mut b = Bench::new();
    b.pool("big", "cpu=16,mem=64GiB", &[]);
    b.pool("small", "cpu=4,mem=16GiB", &[]);
    b.queue("root.etl", QueueLimits::default());
    b.submit(app_spec("etl-1", "root.etl")).unwrap();
    assert_eq!(b.app_state("etl-1"), AppState::Accepted);
    b.add("etl-1", task("t1", "cpu=2,mem=4GiB")).unwrap();
    b.add("etl-1", task("t2", "cpu=8,mem=4GiB")).unwrap();
    let report = b.cycle();
    assert_eq!(report.placed, 2);
    assert_eq!(b.pool_of("etl-1", "t1"), "small", "the smallest pool that fits");
    assert_eq!(b.pool_of("etl-1", "t2"), "big");
    assert_eq!(b.app_state("etl-1"), AppState::Running);
    let usage = b.sched.queue(&QueuePath::new("root.etl").unwrap()).unwrap().usage;
    assert_eq!(usage.allocated, res("cpu=10,mem=8GiB"));
    assert_eq!(usage.running_apps, 1);
    b.complete("etl-1", "t1");
    assert_eq!(b.app_state("etl-1"), AppState::Running, "one task is left");
    b.complete("etl-1", "t2");
    assert_eq!(b.app_state("etl-1"), AppState::Completed);
    let usage = b.sched.queue(&QueuePath::new("root").unwrap()).unwrap().usage;
    assert!(usage.allocated.is_empty());
    assert_eq!(usage.running_apps, 0);
    assert_eq!(b.pools.pool(&PoolName::new("big").unwrap(), b.now).unwrap().allocs, 0, "the alloc was freed");
}

#[test]
fn adding_is_idempotent_and_other_content_conflicts() {
    let mut b = Bench::new();
    b.pool("p", "cpu=4", &[]);
    b.queue("root.q", QueueLimits::default());
    b.submit(app_spec("a", "root.q")).unwrap();
    b.submit(app_spec("a", "root.q")).unwrap();
    let mut other = app_spec("a", "root.q");
    other.user = "bob".into();
    assert_eq!(b.submit(other), Err(SchedError::AppConflict { id: aid("a"), field: "user" }));
    b.add("a", task("t", "cpu=1")).unwrap();
    b.add("a", task("t", "cpu=1")).unwrap();
    assert!(matches!(b.add("a", task("t", "cpu=2")), Err(SchedError::TaskConflict { field: "resources", .. })));
    assert!(matches!(b.submit(app_spec("b", "root")), Err(SchedError::Queue(_))), "root has a child: not a leaf");
    assert!(matches!(b.submit(app_spec("b", "root.nope")), Err(SchedError::Queue(_))));
}

#[test]
fn a_task_with_token_needs_holds_nothing_until_both_can_be_had() {
    let mut b = Bench::new();
    b.pool("p", "cpu=8", &[]);
    b.queue("root.q", QueueLimits::default());
    b.namespace("openai", 2);
    b.submit(app_spec("a", "root.q")).unwrap();
    let needs = |units| vec![TokenNeed { namespace: NamespaceName::new("openai").unwrap(), units }];
    b.add("a", TaskSpec { tokens: needs(2), ..task("t1", "cpu=1") }).unwrap();
    b.add("a", TaskSpec { tokens: needs(1), ..task("t2", "cpu=1") }).unwrap();
    b.cycle();
    assert_eq!(b.state("a", "t1"), TaskState::Allocated);
    assert_eq!(b.state("a", "t2"), TaskState::Pending);
    let why = b.sched.task_why(&aid("a"), &tid("t2")).unwrap();
    assert!(matches!(why, Why::Tokens(_)), "{why:?}");
    assert_eq!(why.to_string(), "token namespace `openai` has 0 of 2 units free and 1 needed");
    assert_eq!(b.pools.pool(&PoolName::new("p").unwrap(), b.now).unwrap().allocs, 1, "t2 holds no alloc");
    b.complete("a", "t1");
    b.cycle();
    assert_eq!(b.state("a", "t2"), TaskState::Allocated);
    let held = &b.sched.task(&aid("a"), &tid("t2")).unwrap().placement.as_ref().unwrap().grants;
    assert_eq!(held[0].token.as_str(), "@a:t2");
}

#[test]
fn a_placements_grants_are_the_schedulers_alone() {
    let mut b = Bench::new();
    b.pool("p", "cpu=8", &[]);
    b.queue("root.q", QueueLimits::default());
    b.namespace("openai", 2);
    let openai = NamespaceName::new("openai").unwrap();
    b.submit(app_spec("a", "root.q")).unwrap();
    // A client's token named as the scheduler's were before `@` does not stand in the way.
    let client = |token: &str| AllocateRequest {
        namespace: openai.clone(),
        token: Token::new(token).unwrap(),
        units: 1,
        scope: None,
        constraints: Constraints::default(),
        lease: LeaseRequest::None,
    };
    let (decision, _) = b.ledger.allocate(client("a:t1"), b.now, false).unwrap();
    assert!(matches!(decision, Decision::Granted { .. }), "{decision:?}");
    b.add("a", TaskSpec { tokens: vec![TokenNeed { namespace: openai.clone(), units: 1 }], ..task("t1", "cpu=1") })
        .unwrap();
    b.cycle();
    assert_eq!(b.state("a", "t1"), TaskState::Allocated);
    let mine = Token::new("@a:t1").unwrap();
    assert_eq!(b.ledger.grant(&openai, &mine).unwrap().units, 1);
    assert_eq!(b.ledger.namespace(&openai, b.now).unwrap().granted_units, 2);

    // No client takes, ends or renews it, nor takes a name of that form before the scheduler.
    let now = b.now;
    assert!(matches!(b.ledger.allocate(client("@a:t1"), now, false), Err(LedgerError::SchedulerToken(_))));
    assert!(matches!(b.ledger.allocate(client("@a:t9"), now, true), Err(LedgerError::SchedulerToken(_))));
    for fencing in [None, Some(1)] {
        assert!(matches!(b.ledger.release(&openai, &mine, fencing, now), Err(LedgerError::HeldByScheduler { .. })));
        assert!(matches!(
            b.ledger.keepalive_grant(&openai, &mine, fencing, now),
            Err(LedgerError::HeldByScheduler { .. })
        ));
    }
    assert_eq!(b.ledger.namespace(&openai, now).unwrap().granted_units, 2, "nothing was released");

    // The task's end releases it, and only it: the client's grant stays.
    b.complete("a", "t1");
    assert!(b.ledger.grant(&openai, &mine).is_err());
    assert_eq!(b.ledger.grant(&openai, &Token::new("a:t1").unwrap()).unwrap().units, 1);
}

#[test]
fn two_gangs_that_cannot_both_fit_never_hold_halves() {
    let mut b = Bench::new();
    b.pool("p1", "cpu=4", &[]);
    b.pool("p2", "cpu=4", &[]);
    b.queue("root.q", QueueLimits::default());
    for id in ["g1", "g2"] {
        let mut spec = app_spec(id, "root.q");
        spec.groups = vec![group("workers", 3, "cpu=2")];
        b.submit(spec).unwrap();
        for m in 0..3 {
            b.add(id, member(&format!("w{m}"), "workers", "cpu=2")).unwrap();
        }
    }
    b.cycle();
    // One gang holds 3 of the 4 places; the other holds nothing at all.
    assert_eq!(b.app_state("g1"), AppState::Running, "a gang wholly reserved runs");
    assert_eq!(b.app_state("g2"), AppState::Reserving, "a gang waiting to be reserved");
    assert!(b.sched.app(&aid("g2")).unwrap().slots.is_empty());
    let why = b.sched.app_why(&aid("g2")).unwrap();
    assert_eq!(why.code(), "gang_not_reserved", "{why:?}");
    assert!(why.to_string().contains("member 2 of task group `workers`"), "{why}");
    for m in 0..3 {
        assert_eq!(b.state("g1", &format!("w{m}")), TaskState::Allocated);
        assert_eq!(b.state("g2", &format!("w{m}")), TaskState::Pending);
    }
    for m in 0..3 {
        b.complete("g1", &format!("w{m}"));
    }
    b.cycle();
    assert_eq!(b.app_state("g2"), AppState::Running);
}

#[test]
fn a_smaller_application_behind_a_waiting_gang_is_placed() {
    let mut b = Bench::new();
    b.pool("p", "cpu=4", &[]);
    b.queue("root.q", QueueLimits::default());
    let mut gang = app_spec("gang", "root.q");
    gang.groups = vec![group("g", 1, "cpu=3")];
    b.submit(app_spec("first", "root.q")).unwrap();
    b.add("first", task("t", "cpu=2")).unwrap();
    b.submit(gang).unwrap();
    b.submit(app_spec("small", "root.q")).unwrap();
    b.add("small", task("t", "cpu=1")).unwrap();
    b.cycle();
    assert_eq!(b.app_state("gang"), AppState::Reserving);
    assert_eq!(b.state("small", "t"), TaskState::Allocated, "FIFO skips what cannot fit");
}

#[test]
fn soft_placeholder_timeout_releases_the_unused_and_runs_on() {
    let mut b = Bench::new();
    b.pool("p", "cpu=8", &[]);
    b.queue("root.q", QueueLimits::default());
    let mut spec = app_spec("a", "root.q");
    spec.groups = vec![group("g", 3, "cpu=2")];
    spec.policy = SchedulingPolicy {
        placeholder_timeout_ms: 10_000,
        gang: GangStyle::Soft,
        reserve_timeout_ms: None,
        max_parallelism: None,
    };
    b.submit(spec).unwrap();
    b.add("a", member("m0", "g", "cpu=1")).unwrap();
    assert_eq!(b.app_state("a"), AppState::Reserving, "waits for its gang");
    b.cycle();
    assert_eq!(b.app_state("a"), AppState::Running, "every placeholder is held");
    assert_eq!(b.state("a", "m0"), TaskState::Allocated);
    let placeholder = b.sched.app(&aid("a")).unwrap().slots[0].placement.clone();
    assert_eq!(
        b.sched.task(&aid("a"), &tid("m0")).unwrap().placement.as_ref(),
        Some(&placeholder),
        "taken over in place"
    );
    assert_eq!(b.sched.app_why(&aid("a")), Some(Why::GangMissing { missing: 2 }));
    assert_eq!(b.pools.pool(&PoolName::new("p").unwrap(), b.now).unwrap().allocs, 3);
    b.now += 9_999;
    b.cycle();
    assert_eq!(b.app_state("a"), AppState::Running);
    assert_eq!(b.pools.pool(&PoolName::new("p").unwrap(), b.now).unwrap().allocs, 3, "not timed out yet");
    b.now += 1;
    let report = b.cycle();
    assert_eq!(report.timed_out, 1);
    assert_eq!(b.app_state("a"), AppState::Running);
    assert_eq!(
        b.pools.pool(&PoolName::new("p").unwrap(), b.now).unwrap().allocs,
        1,
        "two unused placeholders released"
    );
    b.add("a", member("m1", "g", "cpu=1")).unwrap();
    b.cycle();
    assert_eq!(b.state("a", "m1"), TaskState::Allocated, "placed as an ordinary task");
}

#[test]
fn hard_placeholder_timeout_fails_the_application() {
    let mut b = Bench::new();
    b.pool("p", "cpu=8", &[]);
    b.queue("root.q", QueueLimits::default());
    let mut spec = app_spec("a", "root.q");
    spec.groups = vec![group("g", 2, "cpu=2")];
    spec.policy = SchedulingPolicy {
        placeholder_timeout_ms: 5_000,
        gang: GangStyle::Hard,
        reserve_timeout_ms: None,
        max_parallelism: None,
    };
    b.submit(spec).unwrap();
    // Larger than what the placeholders leave free: it waits; no task of the gang is added.
    b.add("a", task("other", "cpu=5")).unwrap();
    b.cycle();
    assert_eq!(b.pools.pool(&PoolName::new("p").unwrap(), b.now).unwrap().allocs, 2, "both placeholders");
    b.now += 5_000;
    b.cycle();
    let app = b.sched.app(&aid("a")).unwrap();
    assert_eq!(app.state, AppState::Failed);
    assert_eq!(app.reason.as_deref(), Some(RESERVATION_TIMEOUT));
    assert_eq!(b.state("a", "other"), TaskState::Failed, "unplaced tasks fail");
    assert_eq!(b.pools.pool(&PoolName::new("p").unwrap(), b.now).unwrap().allocs, 0);
}

/// [YuniKorn `timeoutPlaceholderProcessing`, case 1] A Hard gang whose tasks already run is not
/// failed at the placeholder timeout: its unused placeholders are released and it goes on.
#[test]
fn hard_placeholder_timeout_of_a_running_application_releases_only_the_unused() {
    let mut b = Bench::new();
    b.pool("p", "cpu=8", &[]);
    b.queue("root.q", QueueLimits::default());
    let mut spec = app_spec("a", "root.q");
    spec.groups = vec![group("g", 3, "cpu=2")];
    spec.policy = SchedulingPolicy {
        placeholder_timeout_ms: 5_000,
        gang: GangStyle::Hard,
        reserve_timeout_ms: None,
        max_parallelism: None,
    };
    b.submit(spec).unwrap();
    b.add("a", member("m0", "g", "cpu=2")).unwrap();
    b.add("a", member("m1", "g", "cpu=2")).unwrap();
    b.cycle();
    assert_eq!((b.state("a", "m0"), b.state("a", "m1")), (TaskState::Allocated, TaskState::Allocated));
    b.now += 5_000;
    let report = b.cycle();
    assert_eq!(report.timed_out, 1);
    let app = b.sched.app(&aid("a")).unwrap();
    assert_eq!(app.state, AppState::Running, "{:?}", app.reason);
    assert_eq!((b.state("a", "m0"), b.state("a", "m1")), (TaskState::Allocated, TaskState::Allocated), "kept");
    assert_eq!(b.pools.pool(&PoolName::new("p").unwrap(), b.now).unwrap().allocs, 2, "the unused one released");
    b.add("a", member("m2", "g", "cpu=2")).unwrap();
    b.cycle();
    assert_eq!(b.state("a", "m2"), TaskState::Allocated, "placed as an ordinary task");
    b.check();
}

#[test]
fn a_gang_that_never_reserves_hits_its_reserve_timeout() {
    for style in [GangStyle::Hard, GangStyle::Soft] {
        let mut b = Bench::new();
        b.pool("p", "cpu=4", &[]);
        b.queue("root.q", QueueLimits::default());
        b.submit(app_spec("hog", "root.q")).unwrap();
        b.add("hog", task("t", "cpu=3")).unwrap();
        let mut spec = app_spec("a", "root.q");
        spec.groups = vec![group("g", 2, "cpu=1")];
        spec.policy = SchedulingPolicy {
            placeholder_timeout_ms: 60_000,
            gang: style,
            reserve_timeout_ms: Some(3_000),
            max_parallelism: None,
        };
        b.submit(spec).unwrap();
        b.add("a", member("m0", "g", "cpu=1")).unwrap();
        b.cycle();
        assert_eq!(b.app_state("a"), AppState::Reserving);
        b.now += 3_000;
        b.cycle();
        match style {
            GangStyle::Hard => {
                assert_eq!(b.app_state("a"), AppState::Failed);
                assert_eq!(b.state("a", "m0"), TaskState::Failed);
            }
            GangStyle::Soft => {
                assert_eq!(b.app_state("a"), AppState::Running, "goes on without its gang");
                assert_eq!(b.state("a", "m0"), TaskState::Allocated);
            }
        }
    }
}

#[test]
fn gangs_that_can_never_fit_are_refused_at_submission() {
    let mut b = Bench::new();
    b.pool("p", "cpu=4", &[("zone", "eu")]);
    b.queue("root.q", QueueLimits { max: Some(res("cpu=6")), ..QueueLimits::default() });
    let mut spec = app_spec("a", "root.q");
    spec.groups = vec![group("g", 1, "cpu=5")];
    let err = b.submit(spec).unwrap_err();
    assert!(matches!(err, SchedError::GroupNeverFits { .. }), "{err}");
    let mut spec = app_spec("a", "root.q");
    spec.groups = vec![TaskGroup { selector: labels(&[("zone", "us")]), ..group("g", 1, "cpu=1") }];
    assert!(matches!(b.submit(spec), Err(SchedError::GroupNeverFits { .. })));
    let mut spec = app_spec("a", "root.q");
    spec.groups = vec![group("g", 4, "cpu=2")];
    let err = b.submit(spec).unwrap_err();
    assert!(matches!(err, SchedError::GangExceedsQueue(_)), "{err}");
    assert!(err.to_string().contains("root.q"), "{err}");
    // A real task larger than its group's placeholder is refused when added.
    let mut spec = app_spec("a", "root.q");
    spec.groups = vec![group("g", 1, "cpu=2")];
    b.submit(spec).unwrap();
    let err = b.add("a", member("big", "g", "cpu=3")).unwrap_err();
    assert!(matches!(err, SchedError::LargerThanGroup { .. }), "{err}");
    assert!(matches!(b.add("a", member("x", "nope", "cpu=1")), Err(SchedError::UnknownGroup { .. })));
}

#[test]
fn a_gang_with_token_needs_reserves_its_tokens_with_its_placeholders() {
    let mut b = Bench::new();
    b.pool("p", "cpu=8", &[]);
    b.queue("root.q", QueueLimits::default());
    b.namespace("llm", 3);
    let mut spec = app_spec("a", "root.q");
    spec.groups = vec![TaskGroup {
        tokens: vec![TokenNeed { namespace: NamespaceName::new("llm").unwrap(), units: 2 }],
        ..group("g", 2, "cpu=1")
    }];
    // More than the quota could ever grant is refused at once.
    let err = b.submit(spec.clone()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the gang can never be placed: its placeholders need 4 units of token namespace `llm`, whose quota is 3"
    );
    // A quota of 0 is a pause: the gang waits for it.
    b.namespace("llm", 0);
    b.submit(spec).unwrap();
    b.cycle();
    let why = b.sched.app_why(&aid("a")).unwrap();
    assert!(why.to_string().contains("token namespace `llm` is paused (its quota is 0)"), "{why}");
    assert_eq!(b.pools.pool(&PoolName::new("p").unwrap(), b.now).unwrap().allocs, 0, "no placeholder without tokens");
    b.ledger.put_namespace(&NamespaceName::new("llm").unwrap(), 4, b.now).unwrap();
    b.cycle();
    assert_eq!(b.app_state("a"), AppState::Running);
    assert_eq!(b.ledger.namespace(&NamespaceName::new("llm").unwrap(), b.now).unwrap().granted_units, 4);
    let mut world = World { pools: &mut b.pools, ledger: &mut b.ledger };
    b.sched.complete_app(&aid("a"), 2_000, &mut world).unwrap();
    assert_eq!(b.ledger.namespace(&NamespaceName::new("llm").unwrap(), b.now).unwrap().granted_units, 0, "released");
    b.check();
}

/// Token sums past any quota saturate: a gang whose groups' needs add up beyond `u64` is refused,
/// never wrapped round to a sum that fits.
#[test]
fn a_gang_whose_token_needs_overflow_is_refused_not_wrapped() {
    let mut b = Bench::new();
    b.pool("p", "cpu=64", &[]);
    b.queue("root.q", QueueLimits::default());
    b.namespace("ns", 5);
    let need = |units| vec![TokenNeed { namespace: NamespaceName::new("ns").unwrap(), units }];
    let mut spec = app_spec("a", "root.q");
    spec.groups = vec![
        TaskGroup { tokens: need(allot_core::quotas::MAX_UNITS), ..group("g1", 10_000, "cpu=0.001") },
        TaskGroup { tokens: need(1), ..group("g2", 1, "cpu=0.001") },
    ];
    let err = b.submit(spec).unwrap_err();
    assert!(matches!(err, SchedError::GangExceedsQuota { .. }), "{err}");
}

/// Queue limits that contradict themselves or the tree are refused, as YuniKorn refuses them,
/// and leave the queue as it was; limits that agree are taken.
#[test]
fn queue_limits_that_contradict_the_tree_are_refused() {
    let mut b = Bench::new();
    let limits = |guaranteed: &str, max: Option<&str>| QueueLimits {
        guaranteed: res(guaranteed),
        max: max.map(res),
        ..QueueLimits::default()
    };
    let put = |b: &mut Bench, path: &str, l: QueueLimits| b.sched.put_queue(QueuePath::new(path).unwrap(), l);
    let refused = |result: Result<_, SchedError>| match result {
        Err(SchedError::Queue(allot_core::apps::queues::QueueError::Limits { why, .. })) => why,
        other => panic!("expected refused limits, got {other:?}"),
    };
    assert!(
        refused(put(&mut b, "root.t", limits("cpu=8", Some("cpu=4")))).contains("guarantee of `cpu` is above its max")
    );
    put(&mut b, "root.t", limits("cpu=4", Some("cpu=8"))).unwrap();
    // A child: its max and guarantee within the parent's max (memory is not limited above).
    let why = refused(put(&mut b, "root.t.a", limits("", Some("cpu=16"))));
    assert_eq!(why, "its max of `cpu` is above the max of `root.t`");
    let why = refused(put(&mut b, "root.t.a", limits("cpu=9", None)));
    assert_eq!(why, "its guarantee of `cpu` is above the max of `root.t`");
    put(&mut b, "root.t.a", limits("cpu=3,mem=100", Some("cpu=8,mem=200"))).unwrap();
    // Siblings' guarantees add up within the parent's (for what it guarantees).
    let why = refused(put(&mut b, "root.t.b", limits("cpu=2", None)));
    assert!(why.starts_with("with its siblings it would be guaranteed more `cpu` (cpu=5"), "{why}");
    put(&mut b, "root.t.b", limits("cpu=1", None)).unwrap();
    // The parent, changed: not below what its children hold.
    let why = refused(put(&mut b, "root.t", limits("cpu=4", Some("cpu=6"))));
    assert_eq!(why, "the max of `root.t.a` is above it in `cpu`");
    let why = refused(put(&mut b, "root.t", limits("cpu=3", Some("cpu=8"))));
    assert!(why.starts_with("its children are guaranteed more `cpu`"), "{why}");
    let view = b.sched.queue(&QueuePath::new("root.t").unwrap()).unwrap();
    assert_eq!((view.limits.guaranteed, view.limits.max), (res("cpu=4"), Some(res("cpu=8"))), "unchanged");
    // A queue under a leaf that holds applications would turn it into a parent.
    b.submit(app_spec("busy", "root.t.b")).unwrap();
    let err = put(&mut b, "root.t.b.c", QueueLimits::default()).unwrap_err();
    assert!(matches!(err, SchedError::Queue(allot_core::apps::queues::QueueError::UnderBusyLeaf { .. })), "{err}");
}

#[test]
fn queue_limits_hold_placements_back_and_say_which() {
    let mut b = Bench::new();
    b.pool("p", "cpu=64", &[]);
    b.queue("root.team", QueueLimits { max: Some(res("cpu=4")), ..QueueLimits::default() });
    b.queue("root.team.etl", QueueLimits { max_apps: Some(1), ..QueueLimits::default() });
    b.submit(app_spec("a", "root.team.etl")).unwrap();
    b.submit(app_spec("b", "root.team.etl")).unwrap();
    b.add("a", task("t1", "cpu=3")).unwrap();
    b.add("a", task("t2", "cpu=3")).unwrap();
    b.add("b", task("t1", "cpu=1")).unwrap();
    b.cycle();
    assert_eq!(b.state("a", "t1"), TaskState::Allocated);
    let why = b.sched.task_why(&aid("a"), &tid("t2")).unwrap().to_string();
    assert_eq!(why, "queue `root.team` would go over its max of cpu=4 (cpu=3 used, cpu=3 more wanted)");
    let why = b.sched.app_why(&aid("b")).unwrap().to_string();
    assert_eq!(why, "queue `root.team.etl` already runs its maximum of 1 applications");
    // Raising the limit takes effect on the next cycle; nothing already placed moves.
    b.queue("root.team.etl", QueueLimits::default());
    b.cycle();
    assert_eq!(b.state("b", "t1"), TaskState::Allocated);
    // A per-user limit.
    b.queue("root.solo", QueueLimits { user_max: Some(res("cpu=1")), ..QueueLimits::default() });
    b.submit(app_spec("c", "root.solo")).unwrap();
    b.add("c", task("t1", "cpu=1")).unwrap();
    b.add("c", task("t2", "cpu=1")).unwrap();
    b.cycle();
    assert_eq!(b.state("c", "t2"), TaskState::Pending);
    assert!(b.sched.task_why(&aid("c"), &tid("t2")).unwrap().to_string().starts_with("user `alice` would go over"));
}

#[test]
fn sibling_queues_share_by_their_guarantees() {
    let mut b = Bench::new();
    b.pool("p", "cpu=30", &[]);
    b.queue("root.a", QueueLimits { guaranteed: res("cpu=20"), ..QueueLimits::default() });
    b.queue("root.b", QueueLimits { guaranteed: res("cpu=10"), ..QueueLimits::default() });
    for (app, queue) in [("a", "root.a"), ("b", "root.b")] {
        b.submit(app_spec(app, queue)).unwrap();
        for i in 0..40 {
            b.add(app, task(&format!("t{i}"), "cpu=1")).unwrap();
        }
    }
    b.cycle();
    let used = |b: &Bench, q: &str| {
        b.sched.queue(&QueuePath::new(q).unwrap()).unwrap().usage.allocated.get_milli("cpu") / 1000
    };
    assert_eq!((used(&b, "root.a"), used(&b, "root.b")), (20, 10), "2:1 like the guarantees");
}

#[test]
fn selectors_pick_pools_by_label_and_priority_orders_a_queue() {
    let mut b = Bench::new();
    b.pool("cpu-pool", "cpu=8", &[("kind", "cpu")]);
    b.pool("gpu-pool", "cpu=8,gpu=1", &[("kind", "gpu")]);
    b.queue("root.q", QueueLimits { sort: SortPolicy::Priority, ..QueueLimits::default() });
    b.submit(app_spec("a", "root.q")).unwrap();
    b.add("a", TaskSpec { selector: labels(&[("kind", "gpu")]), ..task("t", "cpu=1") }).unwrap();
    b.add("a", TaskSpec { selector: labels(&[("kind", "tpu")]), ..task("u", "cpu=1") }).unwrap();
    b.cycle();
    assert_eq!(b.pool_of("a", "t"), "gpu-pool");
    let why = b.sched.task_why(&aid("a"), &tid("u")).unwrap();
    assert_eq!(why.to_string(), "no pool that takes allocs has the labels kind=tpu");
    // Priority: the later, higher-priority application goes first.
    b.pool("one", "cpu=1", &[("kind", "one")]);
    b.submit(app_spec("low", "root.q")).unwrap();
    b.submit(app_spec("high", "root.q")).unwrap();
    let one = labels(&[("kind", "one")]);
    b.add("low", TaskSpec { selector: one.clone(), ..task("t", "cpu=1") }).unwrap();
    b.add("high", TaskSpec { selector: one, priority: Priority::of(10), ..task("t", "cpu=1") }).unwrap();
    b.cycle();
    assert_eq!(b.state("high", "t"), TaskState::Allocated);
    assert_eq!(b.state("low", "t"), TaskState::Pending);
    let why = b.sched.task_why(&aid("low"), &tid("t")).unwrap().to_string();
    assert_eq!(
        why,
        "no matching pool has cpu=1 free; the closest, `one`, lacks cpu=1; if no room comes, it may preempt in 30s \
         (its queue's preemption_delay); but as things are, it cannot preempt: its queue is not below its \
         guarantee, and no task there has a lower priority"
    );
}

#[test]
fn tasks_like_one_that_found_no_room_are_passed_over_and_say_why_as_it_does() {
    let mut b = Bench::new();
    b.pool("p", "cpu=4", &[]);
    b.queue("root.q", QueueLimits::default());
    b.submit(app_spec("fill", "root.q")).unwrap();
    b.add("fill", task("f", "cpu=2")).unwrap();
    b.cycle();
    b.submit(app_spec("a", "root.q")).unwrap();
    // Three alike that do not fit now, then three that do while room lasts: the cycle goes past
    // the alike ones.
    for id in ["big-1", "big-2", "big-3"] {
        b.add("a", task(id, "cpu=3")).unwrap();
    }
    for id in ["small-1", "small-2", "small-3"] {
        b.add("a", task(id, "cpu=1")).unwrap();
    }
    b.cycle();
    assert_eq!(b.state("a", "small-1"), TaskState::Allocated);
    assert_eq!(b.state("a", "small-2"), TaskState::Allocated);
    assert_eq!(b.state("a", "small-3"), TaskState::Pending);
    let first = b.sched.task_why(&aid("a"), &tid("big-1")).unwrap();
    assert!(first.to_string().starts_with("no matching pool has cpu=3 free"), "{first}");
    // Each task passed over waits for the same reason as the one tried.
    for id in ["big-2", "big-3"] {
        assert_eq!(b.sched.task_why(&aid("a"), &tid(id)), Some(first.clone()), "{id}");
    }
    let small = b.sched.task_why(&aid("a"), &tid("small-3")).unwrap();
    assert!(small.to_string().starts_with("no matching pool has cpu=1 free"), "{small}");
    // Once room comes, the tasks passed over are placed in their order, in the cycle that finds it.
    b.pool("large", "cpu=8", &[]);
    b.cycle();
    assert_eq!(b.state("a", "big-1"), TaskState::Allocated);
    assert_eq!(b.state("a", "big-2"), TaskState::Allocated);
    assert_eq!(b.state("a", "small-3"), TaskState::Allocated);
    assert_eq!(b.state("a", "big-3"), TaskState::Pending);
    let why = b.sched.task_why(&aid("a"), &tid("big-3")).unwrap();
    assert!(why.to_string().starts_with("no matching pool has cpu=3 free"), "{why}");
    // A task added later is tried although every shape the application had failed.
    b.cycle();
    b.add("a", task("late", "cpu=1")).unwrap();
    b.cycle();
    assert_eq!(b.state("a", "late"), TaskState::Allocated);
    // And room freed is found by the task passed over.
    b.complete("fill", "f");
    b.cycle();
    assert_eq!(b.state("a", "big-3"), TaskState::Pending, "p has cpu=2 free, large none");
    b.complete("a", "small-1");
    b.cycle();
    assert_eq!(b.state("a", "big-3"), TaskState::Allocated);
    b.check();
}

#[test]
fn removing_an_application_releases_everything_it_holds() {
    let mut b = Bench::new();
    b.pool("p", "cpu=8", &[]);
    b.queue("root.q", QueueLimits::default());
    b.namespace("ns", 5);
    let mut spec = app_spec("a", "root.q");
    spec.groups = vec![TaskGroup {
        tokens: vec![TokenNeed { namespace: NamespaceName::new("ns").unwrap(), units: 1 }],
        ..group("g", 2, "cpu=1")
    }];
    b.submit(spec).unwrap();
    b.add("a", member("m0", "g", "cpu=1")).unwrap();
    b.cycle();
    let now = b.now;
    let mut world = World { pools: &mut b.pools, ledger: &mut b.ledger };
    b.sched.remove_app(&aid("a"), now, &mut world).unwrap();
    b.check();
    assert_eq!(b.pools.pool(&PoolName::new("p").unwrap(), b.now).unwrap().allocs, 0);
    assert_eq!(b.ledger.namespace(&NamespaceName::new("ns").unwrap(), b.now).unwrap().granted_units, 0);
    assert!(matches!(b.sched.app(&aid("a")), Err(SchedError::AppNotFound(_))));
}

#[test]
fn restore_brings_back_usage_and_timers() {
    let mut b = Bench::new();
    b.pool("p", "cpu=8", &[]);
    b.queue("root.q", QueueLimits::default());
    let mut spec = app_spec("a", "root.q");
    spec.groups = vec![group("g", 2, "cpu=2")];
    spec.policy.placeholder_timeout_ms = 10_000;
    b.submit(spec).unwrap();
    b.add("a", member("m0", "g", "cpu=2")).unwrap();
    b.add("a", task("later", "cpu=1")).unwrap();
    b.cycle();
    b.now += 4_000;
    // Rebuild from what a store would hold.
    let queues = b.sched.queues().into_iter().map(|q| (q.path, q.limits)).collect();
    let apps: Vec<_> = b.sched.apps_after(None, usize::MAX).into_iter().cloned().collect();
    let tasks: Vec<_> = b.sched.tasks_after(&aid("a"), None, usize::MAX).unwrap().into_iter().cloned().collect();
    b.sched = Scheduler::restore(b.sched.config().clone(), queues, apps, tasks);
    b.check();
    assert_eq!(b.sched.next_deadline(), Some(1_000 + 10_000), "the timer keeps its deadline");
    b.now = 1_000 + 10_000;
    b.cycle();
    assert_eq!(b.app_state("a"), AppState::Running);
    assert_eq!(b.state("a", "later"), TaskState::Allocated);
}

#[test]
fn an_ended_application_is_forgotten_after_its_retention() {
    let mut b = Bench::new();
    b.sched.set_config(SchedConfig { completing_grace_ms: 0, retention_ms: 10_000, ..SchedConfig::default() });
    b.pool("p", "cpu=4", &[]);
    b.queue("root.q", QueueLimits::default());
    b.submit(app_spec("a", "root.q")).unwrap();
    b.add("a", task("t", "cpu=1")).unwrap();
    b.cycle();
    b.complete("a", "t");
    assert_eq!(b.app_state("a"), AppState::Completed);
    assert_eq!(b.sched.next_deadline(), Some(b.now + 10_000));
    b.now += 9_999;
    b.cycle();
    assert!(b.sched.app(&aid("a")).is_ok(), "still readable");
    b.now += 1;
    b.cycle();
    assert!(matches!(b.sched.app(&aid("a")), Err(SchedError::AppNotFound(_))), "forgotten");
    assert!(matches!(b.sched.task(&aid("a"), &tid("t")), Err(SchedError::AppNotFound(_))));
}

#[test]
fn removing_a_pool_fails_its_tasks_and_ends_the_gangs_held_there() {
    let mut b = Bench::new();
    b.pool("p", "cpu=8", &[]);
    b.queue("root.q", QueueLimits::default());
    b.namespace("ns", 2);
    b.submit(app_spec("a", "root.q")).unwrap();
    let need = vec![TokenNeed { namespace: NamespaceName::new("ns").unwrap(), units: 1 }];
    b.add("a", TaskSpec { tokens: need, ..task("t", "cpu=1") }).unwrap();
    let mut hard = app_spec("hard", "root.q");
    hard.groups = vec![group("g", 2, "cpu=1")];
    hard.policy.gang = GangStyle::Hard;
    b.submit(hard).unwrap();
    let mut soft = app_spec("soft", "root.q");
    soft.groups = vec![group("g", 2, "cpu=1")];
    b.submit(soft).unwrap();
    b.cycle();
    assert_eq!(b.app_state("hard"), AppState::Running);
    assert_eq!(b.app_state("soft"), AppState::Running);
    let pool = PoolName::new("p").unwrap();
    b.pools.remove_pool(&pool, true, 0).unwrap();
    let now = b.now;
    let mut world = World { pools: &mut b.pools, ledger: &mut b.ledger };
    b.sched.pool_removed(&pool, now, &mut world);
    let t = b.sched.task(&aid("a"), &tid("t")).unwrap();
    assert_eq!(t.state, TaskState::Failed);
    assert_eq!(t.reason.as_deref(), Some("its pool `p` was removed"));
    assert_eq!(b.ledger.namespace(&NamespaceName::new("ns").unwrap(), b.now).unwrap().granted_units, 0);
    assert_eq!(b.app_state("hard"), AppState::Failed);
    assert_eq!(b.app_state("soft"), AppState::Running);
    b.check();
}

#[test]
fn a_fair_queue_shares_between_its_applications_and_a_fifo_one_does_not() {
    for (sort, expected) in [(SortPolicy::Fair, (5, 5)), (SortPolicy::Fifo, (10, 0))] {
        let mut b = Bench::new();
        b.pool("p", "cpu=10", &[]);
        b.queue("root.q", QueueLimits { sort, ..QueueLimits::default() });
        for app in ["first", "second"] {
            b.submit(app_spec(app, "root.q")).unwrap();
            for i in 0..10 {
                b.add(app, task(&format!("t{i}"), "cpu=1")).unwrap();
            }
        }
        b.cycle();
        let placed =
            |b: &Bench, app: &str| (0..10).filter(|i| b.state(app, &format!("t{i}")) == TaskState::Allocated).count();
        assert_eq!((placed(&b, "first"), placed(&b, "second")), expected, "{sort:?}");
    }
}

#[test]
fn tasks_on_a_lost_pool_go_back_to_waiting_and_are_placed_elsewhere_until_it_is_back() {
    let mut b = Bench::new();
    b.pool("a", "cpu=2", &[]);
    b.queue("root.q", QueueLimits::default());
    b.namespace("ns", 5);
    b.submit(app_spec("x", "root.q")).unwrap();
    let needs = |id: &str| TaskSpec {
        tokens: vec![TokenNeed { namespace: NamespaceName::new("ns").unwrap(), units: 1 }],
        ..task(id, "cpu=1")
    };
    b.add("x", needs("t1")).unwrap();
    b.add("x", needs("t2")).unwrap();
    b.cycle();
    assert_eq!((b.pool_of("x", "t1"), b.pool_of("x", "t2")), ("a".to_owned(), "a".to_owned()));
    let now = b.now;
    let (a, spare) = (PoolName::new("a").unwrap(), PoolName::new("b").unwrap());
    let on = |pool: &PoolName| std::collections::HashSet::from([pool.clone()]);
    assert_eq!(b.sched.placed_on(&on(&a)), [(aid("x"), tid("t1")), (aid("x"), tid("t2"))], "what `a`'s executor runs");
    assert!(b.sched.placed_on(&on(&spare)).is_empty());
    let mut world = World { pools: &mut b.pools, ledger: &mut b.ledger };
    b.sched.pool_lost(&a, "the executor of pool `a` stopped", now, &mut world);
    b.check();
    for t in ["t1", "t2"] {
        let task = b.sched.task(&aid("x"), &tid(t)).unwrap();
        assert_eq!((task.state, task.placement.is_none()), (TaskState::Pending, true), "{t}");
        assert!(task.reason.as_deref().unwrap().contains("the executor of pool `a` stopped"));
    }
    assert_eq!(b.ledger.namespace(&NamespaceName::new("ns").unwrap(), b.now).unwrap().granted_units, 0);
    assert_eq!(b.pools.pool(&a, b.now).unwrap().allocs, 0, "its allocs are ended");
    // Nothing goes back on the lost pool; another pool takes them.
    b.cycle();
    assert_eq!(b.state("x", "t1"), TaskState::Pending);
    b.pool("b", "cpu=1", &[]);
    b.cycle();
    let placed: Vec<TaskState> = ["t1", "t2"].iter().map(|t| b.state("x", t)).collect();
    assert_eq!(placed.iter().filter(|s| **s == TaskState::Allocated).count(), 1, "one fits on `b`");
    assert!(b.sched.down_pools().contains(&a) && !b.sched.down_pools().contains(&spare));
    // Back: the other goes there.
    assert!(b.sched.pool_back(&a));
    b.cycle();
    assert_eq!((b.state("x", "t1"), b.state("x", "t2")), (TaskState::Allocated, TaskState::Allocated));
}

#[test]
fn a_gang_is_reserving_while_it_waits_and_running_once_every_placeholder_is_held() {
    let mut b = Bench::new();
    b.pool("p", "cpu=4", &[]);
    b.queue("root.q", QueueLimits::default());
    b.submit(app_spec("hog", "root.q")).unwrap();
    b.add("hog", task("t", "cpu=3")).unwrap();
    let mut spec = app_spec("a", "root.q");
    spec.groups = vec![group("g", 2, "cpu=1")];
    b.submit(spec).unwrap();
    b.add("a", member("m0", "g", "cpu=1")).unwrap();
    b.add("a", task("solo", "cpu=1")).unwrap();
    b.cycle();
    assert_eq!(b.app_state("a"), AppState::Reserving, "waiting for its gang");
    assert_eq!(b.sched.app_why(&aid("a")).map(|why| why.code()), Some("gang_not_reserved"));
    let why = b.sched.task_why(&aid("a"), &tid("solo")).unwrap();
    assert_eq!(why.code(), "gang_not_reserved", "nothing is placed before the gang: {why}");
    b.complete("hog", "t");
    b.cycle();
    // Every placeholder held: Running, as YuniKorn reports it; a task outside the groups is placed
    // as any other, and the application says what its gang still misses.
    assert_eq!(b.app_state("a"), AppState::Running);
    assert_eq!(b.state("a", "m0"), TaskState::Allocated);
    assert_eq!(b.state("a", "solo"), TaskState::Allocated);
    assert_eq!(b.sched.app_why(&aid("a")), Some(Why::GangMissing { missing: 1 }));
    b.check();
}

#[test]
fn records_of_the_older_gang_states_are_read_in_todays_meaning() {
    let mut b = Bench::new();
    b.pool("p", "cpu=1", &[]);
    b.queue("root.q", QueueLimits::default());
    for id in ["reserved", "waiting"] {
        let mut spec = app_spec(id, "root.q");
        spec.groups = vec![group("g", 1, "cpu=1")];
        b.submit(spec).unwrap();
        b.cycle();
    }
    assert_eq!(b.app_state("reserved"), AppState::Running);
    assert_eq!(b.app_state("waiting"), AppState::Reserving);
    let queues = b.sched.queues().into_iter().map(|q| (q.path, q.limits)).collect();
    let mut apps: Vec<_> = b.sched.apps_after(None, usize::MAX).into_iter().cloned().collect();
    for app in &mut apps {
        // What the older version wrote: a waiting gang Accepted, a reserved one Reserving.
        app.state = if app.reserved_at.is_some() { AppState::Reserving } else { AppState::Accepted };
    }
    let restored = Scheduler::restore(b.sched.config().clone(), queues, apps, Vec::new());
    assert_eq!(restored.app(&aid("reserved")).unwrap().state, AppState::Running);
    assert_eq!(restored.app(&aid("waiting")).unwrap().state, AppState::Reserving);
    assert!(restored.has_waiting(), "the waiting gang still waits");
}

#[test]
fn an_application_says_when_a_queue_max_holds_its_tasks_and_says_nothing_used_in_words() {
    let mut b = Bench::new();
    b.pool("p", "cpu=64", &[]);
    b.queue("root.small", QueueLimits { max: Some(res("cpu=2")), ..QueueLimits::default() });
    b.submit(app_spec("a", "root.small")).unwrap();
    b.add("a", task("big", "cpu=3")).unwrap();
    b.cycle();
    let want = "queue `root.small` would go over its max of cpu=2 (nothing used yet, cpu=3 more wanted)";
    assert_eq!(b.sched.task_why(&aid("a"), &tid("big")).unwrap().to_string(), want);
    let why = b.sched.app_why(&aid("a")).expect("the application says why it waits");
    assert_eq!(why.code(), "queue_limit");
    assert_eq!(why.to_string(), want);
    let view = b.sched.queue(&QueuePath::new("root.small").unwrap()).unwrap();
    assert!(view.waiting.get("queue_limit").is_some_and(|n| *n >= 1), "{:?}", view.waiting);
}

#[test]
fn a_task_goes_only_to_a_pool_that_runs_its_type() {
    let mut b = Bench::new();
    let plugins = allot_core::pools::PLUGINS_LABEL;
    b.pool("web", "cpu=4", &[(plugins, "http, noop")]);
    b.pool("shells", "cpu=8", &[(plugins, "shell")]);
    b.run(&[(&["web", "shells", "any"], &["*"])]);
    b.queue("root.q", QueueLimits::default());
    b.submit(app_spec("a", "root.q")).unwrap();
    let typed =
        |id: &str, task_type: &str| TaskSpec { spec: format!(r#"{{"type": "{task_type}"}}"#), ..task(id, "cpu=1") };
    b.add("a", typed("fetch", "http")).unwrap();
    b.add("a", typed("script", "shell")).unwrap();
    b.add("a", typed("odd", "sleep")).unwrap();
    b.add("a", task("untyped", "cpu=1")).unwrap();
    b.cycle();
    assert_eq!(b.pool_of("a", "fetch"), "web");
    assert_eq!(b.pool_of("a", "script"), "shells", "the best fit would be `web`, which does not run shell");
    assert_eq!(b.state("a", "odd"), TaskState::Pending);
    let why = b.sched.task_why(&aid("a"), &tid("odd")).unwrap();
    assert_eq!(why.code(), "type_not_run", "{why}");
    assert!(why.to_string().contains("tasks of type `sleep`"), "{why}");
    assert_eq!(b.sched.task_why(&aid("a"), &tid("untyped")).unwrap().code(), "type_not_run");
    // A pool that lists no types runs every type, and tasks with none.
    b.pool("any", "cpu=2", &[]);
    b.cycle();
    assert_eq!((b.pool_of("a", "odd"), b.pool_of("a", "untyped")), ("any".to_owned(), "any".to_owned()));
}

fn typed(id: &str, task_type: &str, resources: &str) -> TaskSpec {
    TaskSpec { spec: format!(r#"{{"type": "{task_type}"}}"#), ..task(id, resources) }
}

#[test]
fn a_task_with_a_type_goes_only_where_a_live_executor_runs_it() {
    let mut b = Bench::new();
    b.pool("idle", "cpu=1", &[]);
    b.pool("run", "cpu=8", &[]);
    b.run(&[(&["run"], &["shell"])]);
    b.queue("root.q", QueueLimits::default());
    b.submit(app_spec("a", "root.q")).unwrap();
    b.add("a", typed("script", "shell", "cpu=1")).unwrap();
    b.add("a", task("outside", "cpu=1")).unwrap();
    b.cycle();
    assert_eq!(b.pool_of("a", "script"), "run", "the best fit, `idle`, is run by no daemon");
    assert_eq!(b.pool_of("a", "outside"), "idle", "a task with no type goes where its selector allows");
    // Its executor stops: nothing with a type is placed there, and the task says why.
    b.add("a", typed("more", "shell", "cpu=1")).unwrap();
    b.sched.set_runners(Runners::from_leases(&[Runner {
        pools: vec![PoolName::new("run").unwrap()],
        task_types: vec!["shell".into()],
        live: false,
    }]));
    b.cycle();
    assert_eq!(b.state("a", "more"), TaskState::Pending);
    let why = b.sched.task_why(&aid("a"), &tid("more")).unwrap();
    assert_eq!(why.code(), "not_run", "{why}");
    assert_eq!(b.sched.app_why(&aid("a")), Some(why.clone()), "the application says so too");
    assert_eq!(
        why.to_string(),
        "the task has a type, and no daemon runs pools `idle`, `run`, which would take it: start one with --run-pool NAME"
    );
    b.run(&[(&["run"], &["shell"])]);
    b.cycle();
    assert_eq!(b.pool_of("a", "more"), "run");
    b.check();
}

#[test]
fn a_gang_is_never_split_between_pools_that_are_run_and_pools_that_are_not() {
    let mut b = Bench::new();
    // Each pool holds two members; two are run, one is not.
    b.pool("idle", "cpu=2", &[]);
    b.pool("run-1", "cpu=2", &[]);
    b.pool("run-2", "cpu=2", &[]);
    b.run(&[(&["run-1", "run-2"], &["shell"])]);
    b.queue("root.q", QueueLimits::default());
    // A gang of three typed members: only the run pools take them.
    let mut spec = app_spec("typed", "root.q");
    spec.groups = vec![group("g", 3, "cpu=1")];
    let tasks: Vec<TaskSpec> = (0..3)
        .map(|i| TaskSpec { group: Some(GroupName::new("g").unwrap()), ..typed(&format!("m{i}"), "shell", "cpu=1") })
        .collect();
    let mut world = World { pools: &mut b.pools, ledger: &mut b.ledger };
    b.sched.submit(spec, tasks, b.now, &world).unwrap();
    b.cycle();
    b.cycle();
    for i in 0..3 {
        assert!(b.pool_of("typed", &format!("m{i}")).starts_with("run-"), "member {i} on a pool no daemon runs");
    }
    // A gang of three with no type: the run pools have room for one, so all go where none is run?
    // No: `idle` holds two. It waits rather than split.
    let mut spec = app_spec("untyped", "root.q");
    spec.groups = vec![group("g", 3, "cpu=1")];
    world = World { pools: &mut b.pools, ledger: &mut b.ledger };
    b.sched.submit(spec, Vec::new(), b.now, &world).unwrap();
    b.cycle();
    assert_eq!(b.app_state("untyped"), AppState::Reserving, "room for 3 exists only across both sides");
    let why = b.sched.app_why(&aid("untyped")).unwrap().to_string();
    assert!(why.contains("the closest, `run-") && why.contains("lacks cpu=1"), "{why}");
    b.pool("idle", "cpu=4", &[]);
    b.cycle();
    assert_eq!(b.app_state("untyped"), AppState::Running);
    let pools: Vec<String> =
        b.sched.app(&aid("untyped")).unwrap().slots.iter().map(|s| s.placement.pool.to_string()).collect();
    assert_eq!(pools, ["idle", "idle", "idle"]);
    b.check();
}

#[test]
fn what_can_never_fit_is_refused_at_submit() {
    let mut b = Bench::new();
    b.pool("small", "cpu=2", &[("zone", "a")]);
    b.pool("big", "cpu=8", &[("zone", "b")]);
    b.run(&[(&["small", "big"], &["shell", "noop"])]);
    b.queue("root.q", QueueLimits::default());
    b.namespace("db", 2);
    b.submit(app_spec("a", "root.q")).unwrap();
    let code = |err: SchedError| match err {
        SchedError::NeverFits { why, .. } => (why.code(), why.to_string()),
        other => panic!("{other}"),
    };
    let mut wide = task("wide", "cpu=4");
    wide.selector = labels(&[("zone", "a")]);
    assert_eq!(
        code(b.add("a", wide).unwrap_err()),
        ("task_never_fits", "it asks for cpu=4, more than the capacity of every pool with the labels zone=a".into())
    );
    let mut greedy = task("greedy", "cpu=1");
    greedy.tokens = vec![TokenNeed { namespace: NamespaceName::new("db").unwrap(), units: 3 }];
    assert_eq!(code(b.add("a", greedy).unwrap_err()).0, "tokens_exceed_quota");
    let err = code(b.add("a", typed("odd", "spark", "cpu=1")).unwrap_err());
    assert_eq!(err.0, "task_type_unknown");
    assert!(err.1.contains("type `spark`"), "{}", err.1);
    // What fits somewhere is taken; a selector no pool matches waits for a pool to be made.
    b.add("a", task("fine", "cpu=8")).unwrap();
    let mut elsewhere = task("elsewhere", "cpu=64");
    elsewhere.selector = labels(&[("zone", "c")]);
    b.add("a", elsewhere).unwrap();
    // A quota of 0 is a pause, not a refusal.
    b.namespace("db", 0);
    let mut paused = task("paused", "cpu=1");
    paused.tokens = vec![TokenNeed { namespace: NamespaceName::new("db").unwrap(), units: 1 }];
    b.add("a", paused).unwrap();
    b.cycle();
    let why = b.sched.task_why(&aid("a"), &tid("paused")).unwrap();
    assert_eq!(why.to_string(), "token namespace `db` is paused (its quota is 0)");
}

#[test]
fn a_task_that_can_no_longer_fit_fails_its_application_after_the_grace() {
    let mut b = Bench::new();
    b.sched.set_config(SchedConfig { completing_grace_ms: 0, never_fits_grace_ms: 60_000, ..SchedConfig::default() });
    b.pool("p", "cpu=4", &[]);
    b.queue("root.q", QueueLimits::default());
    b.namespace("db", 4);
    for app in ["shrunk", "quota", "back"] {
        b.submit(app_spec(app, "root.q")).unwrap();
    }
    b.add("shrunk", task("t", "cpu=4")).unwrap();
    let mut needs = task("t", "cpu=0.1");
    needs.tokens = vec![TokenNeed { namespace: NamespaceName::new("db").unwrap(), units: 4 }];
    b.add("quota", needs).unwrap();
    b.add("back", task("t", "cpu=3")).unwrap();
    // The pool and the quota shrink before anything is placed.
    b.pool("p", "cpu=2", &[]);
    b.namespace("db", 2);
    b.cycle();
    for app in ["shrunk", "quota", "back"] {
        assert_eq!(b.sched.task_why(&aid(app), &tid("t")).unwrap().code(), "can_never_fit", "{app}");
        assert_eq!(b.sched.app_why(&aid(app)).unwrap().code(), "can_never_fit", "{app}");
    }
    assert_eq!(b.sched.next_deadline(), Some(b.now + 60_000));
    // Within the grace the pool grows back enough for one of them.
    b.now += 30_000;
    b.pool("p", "cpu=3", &[]);
    b.cycle();
    assert_eq!(b.state("back", "t"), TaskState::Allocated);
    b.now += 30_000;
    b.cycle();
    for app in ["shrunk", "quota"] {
        assert_eq!(b.app_state(app), AppState::Failed, "{app}");
        let reason = b.sched.app(&aid(app)).unwrap().reason.clone().unwrap();
        assert!(reason.starts_with("can_never_fit: task `t` can never fit: it "), "{reason}");
    }
    assert_eq!(b.app_state("back"), AppState::Running);
    b.check();
}

/// A cycle keeps the room of the cycle before and reads again only the pools changed since: a
/// lease that lapses meanwhile changes no pool, yet its room is free from then on; a keepalive
/// that revives it takes the room back.
#[test]
fn a_cycle_sees_the_room_of_leases_that_lapsed_or_came_back_since_the_last() {
    use allot_core::pools::{AllocId, AllocRequest};
    let mut b = Bench::new();
    b.pool("p", "cpu=4", &[]);
    b.pool("r", "cpu=8", &[]);
    b.queue("root.q", QueueLimits::default());
    b.submit(app_spec("a", "root.q")).unwrap();
    let worker = |min: &str| AllocRequest {
        min: res(min),
        max: None,
        owner: "worker".to_owned(),
        labels: BTreeMap::new(),
        metadata: None,
    };
    let (p, r) = (PoolName::new("p").unwrap(), PoolName::new("r").unwrap());
    let (held, _) = b.pools.accept(&p, worker("cpu=4"), AllocId(1_000_001), b.now).unwrap();
    b.pools.accept(&r, worker("cpu=8"), AllocId(1_000_002), b.now).unwrap();
    b.add("a", task("t1", "cpu=2")).unwrap();
    b.cycle();
    assert_eq!(b.state("a", "t1"), TaskState::Pending, "every pool is held by a worker's alloc");
    // Both leases lapse (not reclaimed yet); nothing is done to either pool.
    b.now = held.expires + 1;
    b.cycle();
    assert_eq!(b.state("a", "t1"), TaskState::Allocated, "the lapsed lease's room is free");
    assert_eq!(b.pool_of("a", "t1"), "p");
    // The worker on `r` comes back: its alloc holds its room again.
    b.pools.keepalive(&r, AllocId(1_000_002), 60_000, b.now).unwrap();
    b.add("a", task("t2", "cpu=6")).unwrap();
    b.cycle();
    assert_eq!(b.state("a", "t2"), TaskState::Pending, "r is held again by its revived alloc");
}
