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

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use allot_core::apps::queues::{QueueLimits, QueuePath};
use allot_core::apps::states::TaskState;
use allot_core::apps::{AppId, AppSpec, SchedConfig, Scheduler, SchedulingPolicy, TaskId, TaskSpec, World};
use allot_core::pools::{LeaseRules, PoolName, Pools};
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

#[derive(Serialize)]
struct Output {
    tasks: usize,
    task: &'static str,
    rounds: u16,
    summaries: Vec<Summary>,
    measured: Vec<Measured>,
    /// Median of the rounds' rate(1000) / rate(500), when both were measured.
    scaling: Option<f64>,
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

pub(super) async fn run(args: SchedBenchArgs) -> anyhow::Result<()> {
    if args.tasks < 2 || args.pools.is_empty() || args.pools.contains(&0) {
        bail!("--tasks must be at least 2 and every --pools at least 1");
    }
    let capacity = args.capacity.as_deref().map(str::parse::<Resources>).transpose().context("--capacity")?;
    let measured = tokio::task::spawn_blocking({
        let (args, capacity) = (args.clone(), capacity.clone());
        move || measure_all(&args, capacity.as_ref())
    })
    .await??;
    let summaries = summarise(&args.pools, &measured);
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
    if args.output.json {
        let output = Output {
            tasks: args.tasks,
            task: TASK,
            rounds: args.rounds,
            summaries,
            measured,
            scaling,
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

fn measure_all(args: &SchedBenchArgs, capacity: Option<&Resources>) -> anyhow::Result<Vec<Measured>> {
    // One untimed run of each first: the first run in a process is slower (the allocator grows
    // its heap).
    for &pools in &args.pools {
        measure(args.tasks, pools, capacity)?;
    }
    let mut measured = Vec::new();
    for round in 1..=args.rounds {
        for &pools in &args.pools {
            let run = measure(args.tasks, pools, capacity)?;
            measured.push(Measured { round, ..run });
        }
    }
    Ok(measured)
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
    let mut sched = Scheduler::new(SchedConfig::default());
    let mut pool_state = Pools::new(LeaseRules::default());
    let mut ledger = Ledger::new();
    for i in 0..pools {
        pool_state.put_pool(&PoolName::new(&format!("node-{i}"))?, capacity.clone());
    }
    let queues = [("root.a", "cpu=10000,mem=100000"), ("root.b", "cpu=10000,mem=1000000")];
    let mut apps = Vec::new();
    for (i, (queue, guaranteed)) in queues.into_iter().enumerate() {
        let limits = QueueLimits { guaranteed: guaranteed.parse()?, ..QueueLimits::default() };
        sched.put_queue(QueuePath::new(queue)?, limits);
        let id = AppId::new(&format!("app-{}", i + 1))?;
        let spec = AppSpec {
            id: id.clone(),
            queue: QueuePath::new(queue)?,
            user: "bench".to_owned(),
            user_groups: Vec::new(),
            tags: BTreeMap::new(),
            groups: Vec::new(),
            policy: SchedulingPolicy::default(),
            queue_rule: None,
            priority: Default::default(),
        };
        let world = World { pools: &mut pool_state, ledger: &mut ledger };
        sched.add_app(spec, now, &world)?;
        apps.push(id);
    }
    let resources: Resources = TASK.parse()?;
    for i in 0..tasks {
        // Half per application, as YuniKorn's asks: numPods / 2 and the rest.
        let app = &apps[usize::from(i >= tasks / 2)];
        let spec = TaskSpec {
            preemptable: true,
            id: TaskId::new(&format!("task-{i}"))?,
            resources: resources.clone(),
            tokens: Vec::new(),
            group: None,
            priority: Default::default(),
            selector: BTreeMap::new(),
            spec: String::new(),
        };
        let world = World { pools: &mut pool_state, ledger: &mut ledger };
        sched.add_task(app, spec, now, &world)?;
    }
    Ok(Setup { sched, pools: pool_state, ledger, apps })
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
    let (mut spent, mut slowest) = (Duration::ZERO, Duration::ZERO);
    let (mut cycles, mut placed) = (0, 0);
    let cpu_before = CpuTimes::now();
    // Nothing is refused for want of room, so every cycle that leaves something pending placed
    // something; the bound only stops a scheduler that would loop forever.
    while sched.has_waiting() && cycles <= tasks {
        let now = 2 + cycles as u64;
        let mut world = World { pools: &mut pool_state, ledger: &mut ledger };
        let start = Instant::now();
        let (report, outcome) = sched.schedule(now, &mut world, &mut ids);
        let took = start.elapsed();
        drop(outcome);
        spent += took;
        slowest = slowest.max(took);
        cycles += 1;
        placed += report.placed;
        if report.placed == 0 {
            break;
        }
    }
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
        let spec = TaskSpec {
            preemptable: true,
            id: TaskId::new(&format!("one-more-{j}"))?,
            resources: task.clone(),
            tokens: Vec::new(),
            group: None,
            priority: Default::default(),
            selector: BTreeMap::new(),
            spec: String::new(),
        };
        let mut world = World { pools: &mut pool_state, ledger: &mut ledger };
        sched.add_task(&apps[0], spec, now, &world)?;
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
    fn a_small_run_places_every_task() {
        let run = measure(200, 10, None).unwrap();
        assert_eq!(run.placed, 200);
        assert!(run.cycles >= 1);
        assert!(run.placements_per_s > 0.0);
    }
}
