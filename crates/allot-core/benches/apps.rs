//! One scheduling cycle placing 10,000 pending tasks of `cpu=1,mem=10` (two applications in
//! `root.a` and `root.b`) over 500 pools of `cpu=21,mem=210`: YuniKorn's `BenchmarkScheduling`
//! set-up, as `allot bench sched` runs it. The set-up (pools, applications, tasks) is untimed;
//! the timed routine is one `Scheduler::schedule`, and its answer is dropped untimed.
//!
//! Run: `cargo bench -p allot-core --bench apps -- --warm-up-time 1 --measurement-time 10`

use std::collections::BTreeMap;
use std::sync::Arc;

use allot_core::access::{Binding, Pattern, Permission, Policy, Role, Tenancy};
use allot_core::apps::queues::{QueueLimits, QueuePath};
use allot_core::apps::{AppId, AppSpec, Outcome, Runner, Runners, SchedConfig, Scheduler, TaskId, TaskSpec, World};
use allot_core::pools::{LeaseRules, PoolName, Pools};
use allot_core::{Ledger, Resources};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

const TASKS: usize = 10_000;
const POOLS: usize = 500;

fn res(text: &str) -> Resources {
    text.parse().unwrap()
}

/// The scheduler with every task pending, its pools and its ledger.
fn setup() -> (Scheduler, Pools, Ledger) {
    setup_with(String::new(), false)
}

/// The same, every task with `spec`; with `run`, every pool run by an executor of the built-in
/// types.
fn setup_with(spec: String, run: bool) -> (Scheduler, Pools, Ledger) {
    let mut sched = Scheduler::new(SchedConfig::default());
    let runner = Runner {
        pools: (0..POOLS).map(|i| PoolName::new(&format!("node-{i}")).unwrap()).collect(),
        task_types: ["http", "noop", "shell", "sleep"].map(str::to_owned).to_vec(),
        live: true,
    };
    if run {
        sched.set_runners(Runners::from_leases(&[runner]));
    }
    let mut pools = Pools::new(LeaseRules::default());
    let mut ledger = Ledger::new();
    let per_pool = (TASKS / POOLS + 1) as u64;
    let capacity = res(&format!("cpu={per_pool},mem={}", per_pool * 10));
    for i in 0..POOLS {
        pools.put_pool(&PoolName::new(&format!("node-{i}")).unwrap(), capacity.clone());
    }
    let mut apps = Vec::new();
    for (i, (queue, guaranteed)) in
        [("root.a", "cpu=10000,mem=100000"), ("root.b", "cpu=10000,mem=1000000")].into_iter().enumerate()
    {
        let path = QueuePath::new(queue).unwrap();
        sched.put_queue(path.clone(), QueueLimits { guaranteed: res(guaranteed), ..QueueLimits::default() }).unwrap();
        let id = AppId::new(&format!("app-{}", i + 1)).unwrap();
        let spec = AppSpec::new(id.clone(), path, "bench");
        sched.add_app(spec, 1, &World { pools: &mut pools, ledger: &mut ledger }).unwrap();
        apps.push(id);
    }
    let task = res("cpu=1,mem=10");
    for i in 0..TASKS {
        let spec = TaskSpec {
            preemptable: true,
            id: TaskId::new(&format!("task-{i}")).unwrap(),
            resources: task.clone(),
            tokens: Vec::new(),
            group: None,
            priority: Default::default(),
            selector: BTreeMap::new(),
            spec: spec.clone(),
        };
        let world = World { pools: &mut pools, ledger: &mut ledger };
        sched.add_task(&apps[usize::from(i >= TASKS / 2)], spec, 1, &world).unwrap();
    }
    (sched, pools, ledger)
}

/// The timed routine: one cycle, which places every task. Everything is returned, so it is
/// dropped after the clock stops.
fn cycle((mut sched, mut pools, mut ledger): (Scheduler, Pools, Ledger)) -> (Scheduler, Pools, Ledger, Outcome) {
    let mut next = 0u64;
    let mut world = World { pools: &mut pools, ledger: &mut ledger };
    let (report, outcome) = sched.schedule(2, &mut world, &mut || {
        next += 1;
        next
    });
    assert_eq!(report.placed, TASKS);
    (sched, pools, ledger, outcome)
}

fn bench_cycle(c: &mut Criterion) {
    let mut group = c.benchmark_group("schedule");
    group.throughput(Throughput::Elements(TASKS as u64));
    group.sample_size(10);
    group.bench_function("10000_tasks_500_pools", |b| {
        b.iter_batched(setup, cycle, BatchSize::PerIteration);
    });
    // The same, with tenancy enforced: every placement is checked against the user's roles (the
    // pools it may use, computed once per user in a cycle).
    group.bench_function("10000_tasks_500_pools_tenancy", |b| {
        let role = Role { grants: vec![(Permission::Use, Pattern::parse("pool:node-*").unwrap())] };
        let binding = Binding { role: "nodes".into(), users: vec!["bench".into()], groups: vec![] };
        let policy = Arc::new(Policy::new([("nodes".to_owned(), role)].into(), vec![binding]).unwrap());
        b.iter_batched(
            || {
                let (mut sched, pools, ledger) = setup();
                sched.set_tenancy(Tenancy::Enforced(policy.clone()));
                (sched, pools, ledger)
            },
            cycle,
            BatchSize::PerIteration,
        );
    });
    // Every task with a type (a shell command), on pools run by executors of the built-in types:
    // each placement reads its task's type.
    group.bench_function("10000_tasks_500_pools_typed", |b| {
        let spec = r#"{"type": "shell", "command": "make test", "env": {"CI": "1"}}"#.to_owned();
        b.iter_batched(|| setup_with(spec.clone(), true), cycle, BatchSize::PerIteration);
    });
    group.finish();
}

criterion_group!(benches, bench_cycle);
criterion_main!(benches);
