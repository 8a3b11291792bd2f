//! `allot bench sched`: the scheduler's cycles in this process (no daemon, no store, no HTTP),
//! set up as YuniKorn's `BenchmarkScheduling` (yunikorn-core `pkg/scheduler/tests/
//! performance_test.go`).
//!
//! Queues `root.a` and `root.b` (guaranteed `cpu=10000,mem=100000` and `cpu=10000,mem=1000000`,
//! as YuniKorn's `vcore` and `memory`), one application in each, and `--tasks` tasks (default
//! 10,000) of `cpu=1,mem=10`, half per application. Each pool (YuniKorn's node) holds
//! `tasks / pools + 1` tasks, as YuniKorn sizes its nodes: `cpu=21,mem=210` for 500 pools,
//! `cpu=11,mem=110` for 1,000 (`--capacity` sets another). The applications, tasks and pools are
//! made first, untimed; then `Scheduler::schedule` is called until nothing is pending, and only
//! those calls are timed (the changes each cycle answers are dropped after the clock stops: the
//! store writes them in the daemon). One untimed run of each number of pools comes first; then
//! rounds alternate the numbers of pools, so noise on a shared machine spoils a round of each,
//! not one of them. After each run, cycles that place one task each (added just before, every
//! other task placed) are timed too: the daemon's scheduler runs a cycle each time a task is
//! added, so their fixed cost bounds how fast tasks added one by one are placed.
//!
//! YuniKorn published 359.5 placements/s at 500 nodes and 177.6 at 1,000; the targets are 50
//! times that, and a rate at 1,000 pools at least 0.7 of the rate at 500.
//!
//! With `--preemption` (issue 42, point 9), each round also runs, at each number of pools, a
//! tenth of the tasks placed by preemption, then the same run without the need (see
//! [`measure_preemption`]); the target is a rate with preemption at least 0.7 of the rate
//! without, in the same round.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use allot_core::apps::queues::{QueueLimits, QueuePath};
use allot_core::apps::states::TaskState;
use allot_core::apps::{
    AppChange, AppId, AppSpec, CycleReport, Outcome, SchedConfig, Scheduler, TaskEnd, TaskEnding, TaskId, TaskSpec,
    World, DEFAULT_PREEMPTION_DELAY_MS,
};
use allot_core::pools::{LeaseRules, PoolName, Pools};
use allot_core::quotas::Millis;
use allot_core::{Ledger, Resources};
use anyhow::{bail, Context};
use serde::Serialize;

use crate::cpu::{CpuShare, CpuTimes};
use crate::report::{self, median, Check};
use crate::SchedBenchArgs;

/// What every task asks for (YuniKorn: `memory` 10, `vcore` 1).
const TASK: &str = "cpu=1,mem=10";
/// Cycles of one task each measured after the run.
const ONE_TASK_CYCLES: usize = 50;
/// YuniKorn's published placements/s at 500 and 1,000 nodes.
const YUNIKORN_500: f64 = 359.5;
const YUNIKORN_1000: f64 = 177.6;
/// The targets: placements/s at 500 and 1,000 pools, and rate(1000) / rate(500).
const MIN_RATE_500: f64 = 18_000.0;
const MIN_RATE_1000: f64 = 8_900.0;
const MIN_SCALING: f64 = 0.7;
/// The target: placements/s with a tenth of the tasks placed by preemption, over the same run
/// without preemption.
const MIN_PREEMPTION_RATIO: f64 = 0.7;

#[derive(Serialize)]
struct Output {
    tasks: usize,
    task: &'static str,
    rounds: u16,
    summaries: Vec<Summary>,
    measured: Vec<Measured>,
    /// Median of the rounds' rate(1000) / rate(500), when both were measured.
    scaling: Option<f64>,
    /// With `--preemption`: each number of pools over every round, and each round's pair of runs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    preemption: Vec<PreemptionSummary>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    preemption_measured: Vec<PreemptionPair>,
    checks: Vec<Check>,
}

/// One run: every task placed over `pools` pools.
#[derive(Debug, Clone, Serialize)]
struct Measured {
    round: u16,
    pools: usize,
    capacity: String,
    /// Cycles until nothing was pending.
    cycles: usize,
    placed: usize,
    /// Time spent in `schedule`.
    seconds: f64,
    placements_per_s: f64,
    /// The slowest cycle.
    max_cycle_ms: f64,
    /// The median time of a cycle that places one task added just before, with every other task
    /// placed (as the daemon's cycles, woken by each task added); none without spare room.
    one_task_cycle_us: Option<f64>,
    /// Set-up (pools, applications, tasks), untimed in the rate.
    setup_seconds: f64,
    cpu: Option<CpuShare>,
}

/// One number of pools over every round.
#[derive(Debug, Clone, Serialize)]
struct Summary {
    pools: usize,
    capacity: String,
    median_per_s: f64,
    min_per_s: f64,
    max_per_s: f64,
    /// (max - min) / median, in percent.
    spread_pct: f64,
    median_seconds: f64,
    cycles: usize,
    /// Median over the rounds of the median one-task cycle.
    one_task_cycle_us: Option<f64>,
    /// YuniKorn's published rate at as many nodes, when there is one.
    yunikorn_per_s: Option<f64>,
}

/// One run of the preemption scenario ([`measure_preemption`]).
#[derive(Debug, Clone, Serialize)]
struct PreemptionRun {
    capacity: String,
    /// Every placement: `root.b`'s tasks, then `root.a`'s (the victims, waiting again, find no
    /// room and are not placed again).
    placed: usize,
    cycles: usize,
    /// Time spent in `schedule` and in the victims' reports.
    seconds: f64,
    /// Of which in the victims' reports (`Scheduler::finish_tasks`).
    report_seconds: f64,
    placements_per_s: f64,
    /// Preemptions decided (one victim each here), and victims taken back.
    decisions: u64,
    preemptions: u64,
    /// Cycles that decided preemptions, and the time spent in them.
    deciding_cycles: usize,
    deciding_seconds: f64,
}

/// One round at one number of pools: the run with preemption, then without.
#[derive(Debug, Clone, Serialize)]
struct PreemptionPair {
    round: u16,
    pools: usize,
    with: PreemptionRun,
    without: PreemptionRun,
    /// with.placements_per_s / without.placements_per_s.
    ratio: f64,
    /// The time of the cycles that decided preemptions over the decisions: a bound from above
    /// on one decision (those cycles also place the preemptors decided before and fail every
    /// task still waiting).
    decision_cycle_us: Option<f64>,
    /// (with.seconds - without.seconds) / decisions: everything preemption adds, per decision
    /// (the decision, its victim's report, the cycles more, the victims waiting again).
    added_us_per_decision: Option<f64>,
}

/// The preemption runs at one number of pools over every round (medians).
#[derive(Debug, Clone, Serialize)]
struct PreemptionSummary {
    pools: usize,
    /// The pools' capacity with preemption, and without (room for every task).
    capacity: String,
    capacity_without: String,
    placed: usize,
    decisions: u64,
    cycles: usize,
    with_per_s: f64,
    without_per_s: f64,
    /// Median of the rounds' ratios.
    ratio: f64,
    decision_cycle_us: Option<f64>,
    added_us_per_decision: Option<f64>,
}

pub(super) async fn run(args: SchedBenchArgs) -> anyhow::Result<()> {
    if args.tasks < 2 || args.pools.is_empty() || args.pools.contains(&0) {
        bail!("--tasks must be at least 2 and every --pools at least 1");
    }
    let capacity = args.capacity.as_deref().map(str::parse::<Resources>).transpose().context("--capacity")?;
    let (measured, preemption_measured) = tokio::task::spawn_blocking({
        let (args, capacity) = (args.clone(), capacity.clone());
        move || measure_all(&args, capacity.as_ref())
    })
    .await??;
    let summaries = summarise(&args.pools, &measured);
    let preemption = summarise_preemption(&args.pools, &preemption_measured);
    let ratio = |pools: usize| preemption.iter().find(|s| s.pools == pools).map(|s| s.ratio);
    let scaling = scaling(&measured, args.rounds);
    let rate = |pools: usize| summaries.iter().find(|s| s.pools == pools).map(|s| s.median_per_s);
    let mut checks = Vec::new();
    if capacity.is_none() && args.tasks == 10_000 {
        if args.pools.contains(&500) {
            checks.push(Check::at_least("placements/s at 500 pools".to_owned(), rate(500), MIN_RATE_500));
        }
        if args.pools.contains(&1000) {
            checks.push(Check::at_least("placements/s at 1000 pools".to_owned(), rate(1000), MIN_RATE_1000));
        }
        if args.pools.contains(&500) && args.pools.contains(&1000) {
            checks.push(Check::at_least("rate(1000 pools) / rate(500 pools)".to_owned(), scaling, MIN_SCALING));
        }
    }
    if args.preemption && args.tasks == 10_000 {
        for pools in [500, 1000].into_iter().filter(|n| args.pools.contains(n)) {
            let what = format!("rate with preemption / without at {pools} pools");
            checks.push(Check::at_least(what, ratio(pools), MIN_PREEMPTION_RATIO));
        }
    }
    if args.output.json {
        let output = Output {
            tasks: args.tasks,
            task: TASK,
            rounds: args.rounds,
            summaries,
            measured,
            scaling,
            preemption,
            preemption_measured,
            checks: checks.clone(),
        };
        println!("{}", serde_json::to_string_pretty(&output)?);
    } else {
        println!(
            "{} tasks of {TASK} in two applications (root.a, root.b), placed in process by Scheduler::schedule; \
             {} rounds",
            args.tasks, args.rounds
        );
        println!(
            "{:>6} {:<16} {:>7} {:>14} {:>10} {:>10} {:>7} {:>10} {:>11} {:>13}",
            "pools",
            "pool capacity",
            "cycles",
            "placements/s",
            "min",
            "max",
            "spread",
            "median ms",
            "YuniKorn/s",
            "1-task cycle"
        );
        for s in &summaries {
            println!(
                "{:>6} {:<16} {:>7} {:>14.0} {:>10.0} {:>10.0} {:>6.1}% {:>10.1} {:>11} {:>13}",
                s.pools,
                s.capacity,
                s.cycles,
                s.median_per_s,
                s.min_per_s,
                s.max_per_s,
                s.spread_pct,
                s.median_seconds * 1000.0,
                s.yunikorn_per_s.map_or_else(|| "-".to_owned(), |y| format!("{y}")),
                s.one_task_cycle_us.map_or_else(|| "-".to_owned(), |us| format!("{us:.0} µs")),
            );
        }
        println!(
            "(1-task cycle: the median cycle placing one task added just before, with every other task placed, \
             as the daemon runs a cycle per wake-up)"
        );
        if let Some(scaling) = scaling {
            println!("rate(1000 pools) / rate(500 pools): {scaling:.3} (median of the rounds' ratios)");
        }
        println!("rounds:");
        for m in &measured {
            let steal = m.cpu.map_or_else(|| "-".to_owned(), |c| format!("{:.1}%", c.steal_pct));
            println!(
                "  round {:>2}  {:>5} pools  {:>10.0} placements/s  {:>8.1} ms in {} cycles (slowest {:.1} ms)  \
                 setup {:.0} ms  steal {steal}",
                m.round,
                m.pools,
                m.placements_per_s,
                m.seconds * 1000.0,
                m.cycles,
                m.max_cycle_ms,
                m.setup_seconds * 1000.0
            );
        }
        if !preemption.is_empty() {
            print_preemption(&preemption, &preemption_measured);
        }
        if !checks.is_empty() {
            println!("targets:");
            print!("{}", report::checks(&checks));
        }
    }
    if args.check && checks.iter().any(|c| !c.ok) {
        bail!("a target was missed");
    }
    Ok(())
}

fn print_preemption(summaries: &[PreemptionSummary], pairs: &[PreemptionPair]) {
    let us = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |us| format!("{us:.1} µs"));
    println!(
        "preemption: a tenth of the tasks placed by preempting root.b's (one victim each, reported ended at once), \
         against the same run with room for them all"
    );
    println!(
        "{:>6} {:<16} {:>7} {:>9} {:>7} {:>12} {:>12} {:>7} {:>16} {:>15}",
        "pools",
        "pool capacity",
        "placed",
        "decisions",
        "cycles",
        "with/s",
        "without/s",
        "ratio",
        "deciding cycle",
        "added"
    );
    for s in summaries {
        println!(
            "{:>6} {:<16} {:>7} {:>9} {:>7} {:>12.0} {:>12.0} {:>7.3} {:>16} {:>15}",
            s.pools,
            s.capacity,
            s.placed,
            s.decisions,
            s.cycles,
            s.with_per_s,
            s.without_per_s,
            s.ratio,
            us(s.decision_cycle_us),
            us(s.added_us_per_decision),
        );
    }
    println!(
        "(per decision; deciding cycle: the time of the cycles that decided preemptions over the decisions, a bound \
         from above; added: (time with - time without) / decisions, all that preemption adds; without: pools \
         larger by the tenth)"
    );
    println!("preemption rounds:");
    for p in pairs {
        println!(
            "  round {:>2}  {:>5} pools  with {:>10.0}/s ({:.1} ms in {} cycles, {} deciding {:.1} ms, reports {:.2} ms)  \
             without {:>10.0}/s ({:.1} ms in {} cycles)  ratio {:.3}",
            p.round,
            p.pools,
            p.with.placements_per_s,
            p.with.seconds * 1000.0,
            p.with.cycles,
            p.with.deciding_cycles,
            p.with.deciding_seconds * 1000.0,
            p.with.report_seconds * 1000.0,
            p.without.placements_per_s,
            p.without.seconds * 1000.0,
            p.without.cycles,
            p.ratio,
        );
    }
}

type AllMeasured = (Vec<Measured>, Vec<PreemptionPair>);

fn measure_all(args: &SchedBenchArgs, capacity: Option<&Resources>) -> anyhow::Result<AllMeasured> {
    // One untimed run of each first: the first run in a process is slower (the allocator grows
    // its heap).
    for &pools in &args.pools {
        measure(args.tasks, pools, capacity)?;
        if args.preemption {
            measure_pair(0, args.tasks, pools)?;
        }
    }
    let (mut measured, mut pairs) = (Vec::new(), Vec::new());
    for round in 1..=args.rounds {
        for &pools in &args.pools {
            let run = measure(args.tasks, pools, capacity)?;
            measured.push(Measured { round, ..run });
            if args.preemption {
                pairs.push(measure_pair(round, args.tasks, pools)?);
            }
        }
    }
    Ok((measured, pairs))
}

/// The preemption scenario with preemption, then without, at one number of pools.
fn measure_pair(round: u16, tasks: usize, pools: usize) -> anyhow::Result<PreemptionPair> {
    let with = measure_preemption(tasks, pools, true)?;
    let without = measure_preemption(tasks, pools, false)?;
    let per_decision = |seconds: f64| (with.decisions > 0).then(|| seconds * 1e6 / with.decisions as f64);
    Ok(PreemptionPair {
        round,
        pools,
        ratio: with.placements_per_s / without.placements_per_s,
        decision_cycle_us: per_decision(with.deciding_seconds),
        added_us_per_decision: per_decision(with.seconds - without.seconds),
        with,
        without,
    })
}

/// The pool capacity that holds `tasks / pools + 1` tasks (YuniKorn's node size).
fn default_capacity(tasks: usize, pools: usize) -> Resources {
    let per_pool = (tasks / pools + 1) as u64;
    format!("cpu={per_pool},mem={}", per_pool * 10).parse().expect("a valid resources text")
}

/// The scheduler, pools and ledger of one run, with every task added and pending.
struct Setup {
    sched: Scheduler,
    pools: Pools,
    ledger: Ledger,
    apps: Vec<AppId>,
}

/// Builds YuniKorn's set-up: two queues, two applications, `tasks` tasks, `pools` pools.
fn setup(tasks: usize, pools: usize, capacity: &Resources) -> anyhow::Result<Setup> {
    let now = 1;
    let (mut sched, mut pool_state, mut ledger) = empty_world(pools, capacity)?;
    let queues = [("root.a", "cpu=10000,mem=100000"), ("root.b", "cpu=10000,mem=1000000")];
    let mut apps = Vec::new();
    for (i, (queue, guaranteed)) in queues.into_iter().enumerate() {
        let limits = QueueLimits { guaranteed: guaranteed.parse()?, ..QueueLimits::default() };
        sched.put_queue(QueuePath::new(queue)?, limits)?;
        let id = AppId::new(&format!("app-{}", i + 1))?;
        let world = World { pools: &mut pool_state, ledger: &mut ledger };
        sched.add_app(app_spec(&id, queue)?, now, &world)?;
        apps.push(id);
    }
    let resources: Resources = TASK.parse()?;
    for i in 0..tasks {
        // Half per application, as YuniKorn's asks: numPods / 2 and the rest.
        let app = &apps[usize::from(i >= tasks / 2)];
        let world = World { pools: &mut pool_state, ledger: &mut ledger };
        sched.add_task(app, task_spec(&format!("task-{i}"), &resources)?, now, &world)?;
    }
    Ok(Setup { sched, pools: pool_state, ledger, apps })
}

/// A scheduler with no queue yet, `pools` pools `node-0`.. of `capacity`, no namespace.
pub(super) fn empty_world(pools: usize, capacity: &Resources) -> anyhow::Result<(Scheduler, Pools, Ledger)> {
    let mut pool_state = Pools::new(LeaseRules::default());
    for i in 0..pools {
        pool_state.put_pool(&PoolName::new(&format!("node-{i}"))?, capacity.clone());
    }
    Ok((Scheduler::new(SchedConfig::default()), pool_state, Ledger::new()))
}

/// An application of user `bench` in `queue`, with no gang.
pub(super) fn app_spec(id: &AppId, queue: &str) -> anyhow::Result<AppSpec> {
    Ok(AppSpec::new(id.clone(), QueuePath::new(queue)?, "bench"))
}

/// A preemptable task of `resources`, of no type, at the default priority.
pub(super) fn task_spec(id: &str, resources: &Resources) -> anyhow::Result<TaskSpec> {
    Ok(TaskSpec {
        preemptable: true,
        id: TaskId::new(id)?,
        resources: resources.clone(),
        tokens: Vec::new(),
        group: None,
        priority: Default::default(),
        selector: BTreeMap::new(),
        spec: String::new(),
    })
}

/// A run's timed cycles: only `Scheduler::schedule` is timed, and each cycle's changes are
/// dropped after the clock stops (the store writes them in the daemon).
#[derive(Default)]
struct Timed {
    spent: Duration,
    slowest: Duration,
    cycles: usize,
    placed: usize,
}

impl Timed {
    /// One cycle at `now`.
    fn cycle(
        &mut self,
        sched: &mut Scheduler,
        world: &mut World<'_>,
        now: Millis,
        ids: &mut dyn FnMut() -> u64,
    ) -> (CycleReport, Outcome, Duration) {
        let start = Instant::now();
        let (report, outcome) = sched.schedule(now, world, ids);
        let took = start.elapsed();
        self.spent += took;
        self.slowest = self.slowest.max(took);
        self.cycles += 1;
        self.placed += report.placed;
        (report, outcome, took)
    }

    /// Cycles one millisecond apart from `now` until nothing is pending; answers the next `now`.
    /// Nothing is refused for want of room, so every cycle that leaves something pending placed
    /// something; the bound only stops a scheduler that would loop forever.
    fn until_placed(
        &mut self,
        sched: &mut Scheduler,
        world: &mut World<'_>,
        mut now: Millis,
        bound: usize,
        ids: &mut dyn FnMut() -> u64,
    ) -> Millis {
        let cycles = self.cycles;
        while sched.has_waiting() && self.cycles - cycles <= bound {
            let (report, outcome, _) = self.cycle(sched, world, now, ids);
            drop(outcome);
            now += 1;
            if report.placed == 0 {
                break;
            }
        }
        now
    }
}

/// The pool capacity that holds `n` tasks.
pub(super) fn capacity_for(n: usize) -> Resources {
    format!("cpu={n},mem={}", n * 10).parse().expect("a valid resources text")
}

/// `--preemption`'s scenario over `pools` pools: a tenth of the tasks placed by preemption.
///
/// Queue `root.b`, guaranteed half of what it is given, borrows: its application's tasks (the
/// other nine tenths, rounded up to fill every pool) fill every pool, in timed cycles. Then
/// `root.a`, guaranteed room for every task, adds the tenth (untimed) and time jumps past its
/// preemption delay. Each cycle decides preemptions (as many as the scheduler's bound on a
/// cycle's planning lets it), one victim of `root.b` each; the victims' executors report them
/// ended at once, in one batch (`Scheduler::finish_tasks` with `TaskEnding::Preempted`, as the
/// stores do), and the next cycle places their preemptors in the room held for them. The
/// victims wait again and find no room (they are neither placed again nor counted).
///
/// Without (`preempt` false), the same run with every pool larger by a tenth of the tasks over
/// the pools: `root.a`'s tasks are placed in the first cycle after the jump.
///
/// Counted: every placement, `root.b`'s tasks then `root.a`'s (the same number in both runs).
/// Timed: every `schedule` call from the first, and the victims' reports.
fn measure_preemption(tasks: usize, pools: usize, preempt: bool) -> anyhow::Result<PreemptionRun> {
    let tenth = (tasks / 10).max(1);
    let per_pool = (tasks - tenth).div_ceil(pools);
    let borrowed = per_pool * pools;
    let capacity = capacity_for(if preempt { per_pool } else { per_pool + tenth.div_ceil(pools) });
    let now = 1;
    let (mut sched, mut pool_state, mut ledger) = empty_world(pools, &capacity)?;
    let queues = [("root.a", tasks, "urgent"), ("root.b", borrowed / 2, "batch")];
    let mut apps = Vec::new();
    for (queue, guaranteed, app) in queues {
        let limits = QueueLimits { guaranteed: capacity_for(guaranteed), ..QueueLimits::default() };
        sched.put_queue(QueuePath::new(queue)?, limits)?;
        let id = AppId::new(app)?;
        let world = World { pools: &mut pool_state, ledger: &mut ledger };
        sched.add_app(app_spec(&id, queue)?, now, &world)?;
        apps.push(id);
    }
    let (urgent, batch) = (&apps[0], &apps[1]);
    let resources: Resources = TASK.parse()?;
    for i in 0..borrowed {
        let world = World { pools: &mut pool_state, ledger: &mut ledger };
        sched.add_task(batch, task_spec(&format!("batch-{i}"), &resources)?, now, &world)?;
    }
    let mut next_id = 0u64;
    let mut ids = || {
        next_id += 1;
        next_id
    };
    let mut timed = Timed::default();
    let mut world = World { pools: &mut pool_state, ledger: &mut ledger };
    let now = timed.until_placed(&mut sched, &mut world, now + 1, borrowed, &mut ids);
    for i in 0..tenth {
        sched.add_task(urgent, task_spec(&format!("urgent-{i}"), &resources)?, now, &world)?;
    }
    let mut now = now + DEFAULT_PREEMPTION_DELAY_MS;
    let (mut reports, mut deciding, mut deciding_cycles) = (Duration::ZERO, Duration::ZERO, 0);
    while timed.placed < borrowed + tenth {
        if timed.cycles > borrowed + 2 * tenth {
            bail!("{pools} pools: {} of {} placed after {} cycles", timed.placed, borrowed + tenth, timed.cycles);
        }
        let decided_before = sched.stats().preemption_decisions;
        let (report, outcome, took) = timed.cycle(&mut sched, &mut world, now, &mut ids);
        let decided = sched.stats().preemption_decisions - decided_before;
        if decided > 0 {
            deciding += took;
            deciding_cycles += 1;
        }
        // The victims marked by this cycle (each is changed once when marked).
        let victims: Vec<TaskEnd> = outcome
            .apps
            .iter()
            .filter_map(|change| match change {
                AppChange::Task(task) if task.preempting.is_some() && task.placement.is_some() => {
                    Some(TaskEnd { app: task.app.clone(), task: task.spec.id.clone(), ending: TaskEnding::Preempted })
                }
                _ => None,
            })
            .collect();
        drop(outcome);
        if report.placed == 0 && decided == 0 {
            bail!("{pools} pools: a cycle placed nothing and decided no preemption");
        }
        // Their executors end them at once and report it, in one commit of the store.
        let start = Instant::now();
        let (answers, outcome) = sched.finish_tasks(victims, now, &mut world);
        reports += start.elapsed();
        drop(outcome);
        for answer in answers {
            answer?;
        }
        now += 1;
    }
    let seconds = (timed.spent + reports).as_secs_f64();
    let stats = sched.stats();
    let allocated = |app: &AppId| sched.task_counts(app).get(&TaskState::Allocated).copied().unwrap_or(0) as usize;
    // Every task of root.a placed, root.b's less its victims; with room for all, none preempted.
    let preempted = stats.preemptions as usize;
    if allocated(urgent) != tenth || allocated(batch) != borrowed - preempted || preempt != (preempted == tenth) {
        bail!(
            "{pools} pools of {capacity}: {} of {tenth} urgent and {} of {borrowed} batch tasks Allocated, {preempted}              preempted",
            allocated(urgent),
            allocated(batch)
        );
    }
    Ok(PreemptionRun {
        capacity: capacity.to_string(),
        placed: timed.placed,
        cycles: timed.cycles,
        seconds,
        report_seconds: reports.as_secs_f64(),
        placements_per_s: timed.placed as f64 / seconds,
        decisions: stats.preemption_decisions,
        preemptions: stats.preemptions,
        deciding_cycles,
        deciding_seconds: deciding.as_secs_f64(),
    })
}

fn measure(tasks: usize, pools: usize, capacity: Option<&Resources>) -> anyhow::Result<Measured> {
    let capacity = capacity.cloned().unwrap_or_else(|| default_capacity(tasks, pools));
    let started = Instant::now();
    let Setup { mut sched, pools: mut pool_state, mut ledger, apps } = setup(tasks, pools, &capacity)?;
    let setup_seconds = started.elapsed().as_secs_f64();
    let mut next_id = 0u64;
    let mut ids = || {
        next_id += 1;
        next_id
    };
    let mut timed = Timed::default();
    let cpu_before = CpuTimes::now();
    let mut world = World { pools: &mut pool_state, ledger: &mut ledger };
    timed.until_placed(&mut sched, &mut world, 2, tasks, &mut ids);
    let Timed { spent, slowest, cycles, placed } = timed;
    let cpu = CpuTimes::now().zip(cpu_before).and_then(|(after, before)| before.share_until(&after));
    let allocated: u64 =
        apps.iter().map(|app| sched.task_counts(app).get(&TaskState::Allocated).copied().unwrap_or(0)).sum();
    if allocated != tasks as u64 || placed != tasks {
        bail!(
            "{pools} pools of {capacity}: {allocated} of {tasks} tasks Allocated ({placed} placements in {cycles} \
             cycles); every task should fit"
        );
    }
    // Then cycles as the daemon runs them, woken by each task added: one task each, with every
    // other task placed.
    let task: Resources = TASK.parse()?;
    let mut one_task = Vec::new();
    for j in 0..ONE_TASK_CYCLES {
        let now = 2 + (cycles + j) as u64;
        sched.add_task(&apps[0], task_spec(&format!("one-more-{j}"), &task)?, now, &world)?;
        let start = Instant::now();
        let (report, outcome) = sched.schedule(now, &mut world, &mut ids);
        let took = start.elapsed();
        drop(outcome);
        if report.placed != 1 {
            // No room left (a --capacity without spare room): not measured.
            one_task.clear();
            break;
        }
        one_task.push(took.as_secs_f64() * 1e6);
    }
    let seconds = spent.as_secs_f64();
    Ok(Measured {
        round: 0,
        pools,
        capacity: capacity.to_string(),
        cycles,
        placed,
        seconds,
        placements_per_s: placed as f64 / seconds,
        max_cycle_ms: slowest.as_secs_f64() * 1000.0,
        one_task_cycle_us: median(one_task),
        setup_seconds,
        cpu,
    })
}

fn summarise(pools: &[usize], measured: &[Measured]) -> Vec<Summary> {
    pools
        .iter()
        .map(|&n| {
            let runs: Vec<&Measured> = measured.iter().filter(|m| m.pools == n).collect();
            let rates: Vec<f64> = runs.iter().map(|m| m.placements_per_s).collect();
            let median_per_s = median(rates.clone()).unwrap_or(0.0);
            let min_per_s = rates.iter().copied().fold(f64::INFINITY, f64::min);
            let max_per_s = rates.iter().copied().fold(0.0, f64::max);
            Summary {
                pools: n,
                capacity: runs.first().map(|m| m.capacity.clone()).unwrap_or_default(),
                median_per_s,
                min_per_s,
                max_per_s,
                spread_pct: if median_per_s > 0.0 { 100.0 * (max_per_s - min_per_s) / median_per_s } else { 0.0 },
                median_seconds: median(runs.iter().map(|m| m.seconds).collect()).unwrap_or(0.0),
                cycles: runs.iter().map(|m| m.cycles).max().unwrap_or(0),
                one_task_cycle_us: median(runs.iter().filter_map(|m| m.one_task_cycle_us).collect()),
                yunikorn_per_s: match n {
                    500 => Some(YUNIKORN_500),
                    1000 => Some(YUNIKORN_1000),
                    _ => None,
                },
            }
        })
        .collect()
}

fn summarise_preemption(pools: &[usize], pairs: &[PreemptionPair]) -> Vec<PreemptionSummary> {
    pools
        .iter()
        .filter_map(|&n| {
            let runs: Vec<&PreemptionPair> = pairs.iter().filter(|p| p.pools == n).collect();
            let first = runs.first()?;
            let of = |f: &dyn Fn(&PreemptionPair) -> f64| median(runs.iter().map(|p| f(p)).collect());
            Some(PreemptionSummary {
                pools: n,
                capacity: first.with.capacity.clone(),
                capacity_without: first.without.capacity.clone(),
                placed: first.with.placed,
                decisions: first.with.decisions,
                cycles: runs.iter().map(|p| p.with.cycles).max().unwrap_or(0),
                with_per_s: of(&|p| p.with.placements_per_s).unwrap_or(0.0),
                without_per_s: of(&|p| p.without.placements_per_s).unwrap_or(0.0),
                ratio: of(&|p| p.ratio).unwrap_or(0.0),
                decision_cycle_us: median(runs.iter().filter_map(|p| p.decision_cycle_us).collect()),
                added_us_per_decision: median(runs.iter().filter_map(|p| p.added_us_per_decision).collect()),
            })
        })
        .collect()
}

/// The median over rounds of rate(1000 pools) / rate(500 pools), each ratio within one round.
fn scaling(measured: &[Measured], rounds: u16) -> Option<f64> {
    let rate = |round: u16, pools: usize| {
        measured.iter().find(|m| m.round == round && m.pools == pools).map(|m| m.placements_per_s)
    };
    median((1..=rounds).filter_map(|r| Some(rate(r, 1000)? / rate(r, 500)?)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_are_sized_as_yunikorn_sizes_nodes() {
        assert_eq!(default_capacity(10_000, 500).to_string(), "cpu=21,mem=210");
        assert_eq!(default_capacity(10_000, 1000).to_string(), "cpu=11,mem=110");
    }

    #[test]
    fn a_tenth_is_placed_by_preemption_and_without_it_by_room() {
        let with = measure_preemption(200, 10, true).unwrap();
        assert_eq!((with.placed, with.decisions, with.preemptions), (200, 20, 20));
        assert_eq!(with.capacity, "cpu=18,mem=180");
        assert!(with.deciding_cycles >= 1 && with.report_seconds > 0.0);
        let without = measure_preemption(200, 10, false).unwrap();
        assert_eq!((without.placed, without.decisions, without.preemptions), (200, 0, 0));
        assert_eq!(without.capacity, "cpu=20,mem=200");
    }

    #[test]
    fn a_small_run_places_every_task() {
        let run = measure(200, 10, None).unwrap();
        assert_eq!(run.placed, 200);
        assert!(run.cycles >= 1);
        assert!(run.placements_per_s > 0.0);
    }
}
