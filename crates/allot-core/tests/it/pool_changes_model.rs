//! A model test of pools that change under the scheduler: random tasks (some that may not be
//! preempted) on two pools whose capacity, occupied room and cordons change at random, with
//! cycles, time passing and executors ending their victims. Checked after every step: every
//! invariant of the scheduler and the pools; nothing placed on a cordoned pool after it was
//! cordoned; no mark of a pool that is no longer strained survives a cycle. Checked after a quiet
//! phase (a grace passes, cycles run): a pool holds more than it may, or a drained pool holds
//! tasks, only through tasks that may not be preempted.

use allot_core::apps::queues::QueueLimits;
use allot_core::apps::states::TaskState;
use allot_core::apps::{SchedConfig, TaskSpec, World, DEFAULT_PREEMPTION_GRACE_MS};
use allot_core::pools::{CordonOrder, PoolName};
use proptest::prelude::*;

use super::apps::{aid, app_spec, res, task, tid, Bench};

const POOLS: [&str; 2] = ["p0", "p1"];

#[derive(Debug, Clone)]
enum Op {
    /// A task of one cpu, of `priority`, that may be preempted or not.
    Add {
        priority: i32,
        preemptable: bool,
    },
    Cycle,
    Wait {
        ms: u32,
    },
    Capacity {
        pool: usize,
        cpu: u8,
    },
    Occupy {
        pool: usize,
        cpu: u8,
    },
    Cordon {
        pool: usize,
        order: u8,
        grace_ms: u32,
    },
    /// The executor of the task (by number) ends it, if it is being preempted.
    ExecutorEnds {
        task: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..3i32, any::<bool>()).prop_map(|(priority, preemptable)| Op::Add { priority, preemptable }),
        Just(Op::Cycle),
        Just(Op::Cycle),
        (0..40_000u32).prop_map(|ms| Op::Wait { ms }),
        (0..2usize, 0..6u8).prop_map(|(pool, cpu)| Op::Capacity { pool, cpu }),
        (0..2usize, 0..4u8).prop_map(|(pool, cpu)| Op::Occupy { pool, cpu }),
        (0..2usize, 0..3u8, 0..40_000u32).prop_map(|(pool, order, grace_ms)| Op::Cordon { pool, order, grace_ms }),
        (0..24u8).prop_map(|task| Op::ExecutorEnds { task }),
    ]
}

struct Model {
    b: Bench,
    tasks: u8,
}

impl Model {
    fn new() -> Model {
        let config = SchedConfig { completing_grace_ms: 0, ..SchedConfig::default() };
        let mut b = Bench::with_config(config);
        for pool in POOLS {
            b.pool(pool, "cpu=3", &[]);
        }
        b.queue("root.q", QueueLimits::default());
        b.submit(app_spec("app", "root.q")).unwrap();
        Model { b, tasks: 0 }
    }

    fn pool(i: usize) -> PoolName {
        PoolName::new(POOLS[i]).unwrap()
    }

    fn apply(&mut self, op: &Op) {
        let now = self.b.now;
        match *op {
            Op::Add { priority, preemptable } => {
                let spec = TaskSpec {
                    priority: allot_core::apps::priority::Priority::of(priority),
                    preemptable,
                    ..task(&format!("t{}", self.tasks), "cpu=1")
                };
                // Refused when no pool could ever hold it (both shrunk to no cpu): as it should be.
                match self.b.add("app", spec) {
                    Ok(()) => self.tasks += 1,
                    Err(allot_core::apps::SchedError::NeverFits { .. }) => {}
                    Err(err) => panic!("{err}"),
                }
            }
            Op::Cycle => {
                self.b.cycle();
            }
            Op::Wait { ms } => self.b.now += u64::from(ms),
            Op::Capacity { pool, cpu } => {
                // A capacity names some resource (an empty one is refused at the edge).
                self.b.pools.put_pool(&Model::pool(pool), res(&format!("cpu={cpu},mem=1")));
            }
            Op::Occupy { pool, cpu } => {
                self.b.pools.occupy(&Model::pool(pool), res(&format!("cpu={cpu}")), now).unwrap();
            }
            Op::Cordon { pool, order, grace_ms } => {
                let order = match order {
                    0 => CordonOrder::Cordon,
                    1 => CordonOrder::Drain { grace_ms: u64::from(grace_ms) },
                    _ => CordonOrder::Uncordon,
                };
                self.b.pools.cordon(&Model::pool(pool), order, now).unwrap();
            }
            Op::ExecutorEnds { task } if task >= self.tasks => {}
            Op::ExecutorEnds { task } => {
                let id = tid(&format!("t{task}"));
                if self.b.sched.task(&aid("app"), &id).unwrap().preempting.is_some() {
                    let mut world = World { pools: &mut self.b.pools, ledger: &mut self.b.ledger };
                    self.b.sched.preempted(&aid("app"), &id, now, &mut world).unwrap();
                }
            }
        }
        self.b.check();
    }

    /// Each placed task: (pool, preemptable, being preempted, by a task).
    fn placed(&self) -> Vec<(String, bool, bool, bool)> {
        (0..self.tasks)
            .filter_map(|t| {
                let task = self.b.sched.task(&aid("app"), &tid(&format!("t{t}"))).unwrap();
                let placement = task.placement.as_ref()?;
                matches!(task.state, TaskState::Allocated | TaskState::Running).then(|| {
                    let by_task = task.preempting.as_ref().is_some_and(|p| p.by.is_some());
                    (placement.pool.to_string(), task.spec.preemptable, task.preempting.is_some(), by_task)
                })
            })
            .collect()
    }

    /// After a cycle: a mark of a pool stands only while its pool is strained.
    fn check_marks(&self) -> Result<(), String> {
        let strained: Vec<String> = self.b.pools.strained(self.b.now).into_iter().map(|s| s.pool.to_string()).collect();
        for (pool, _, marked, by_task) in self.placed() {
            if marked && !by_task && !strained.contains(&pool) {
                return Err(format!("a task on {pool} is marked by its pool, which is not strained"));
            }
        }
        Ok(())
    }

    /// After the quiet phase: what strains a pool is only what may not be preempted.
    fn check_settled(&self) -> Result<(), String> {
        for strain in self.b.pools.strained(self.b.now) {
            let preemptable =
                self.placed().into_iter().filter(|(pool, p, ..)| *pool == strain.pool.as_str() && *p).count();
            if preemptable > 0 {
                return Err(format!("{strain:?} still holds {preemptable} tasks that may be preempted"));
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: super::cases(200), ..ProptestConfig::default() })]

    #[test]
    fn pools_that_change_preempt_what_no_longer_fits_and_nothing_more(
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        let mut m = Model::new();
        for op in &ops {
            // Where tasks were placed before: nothing new may land on a pool cordoned now.
            let cordoned: Vec<String> = (0..POOLS.len())
                .filter(|i| m.b.pools.pool(&Model::pool(*i), m.b.now).unwrap().cordon.is_some())
                .map(|i| POOLS[i].to_owned())
                .collect();
            let before = m.placed().into_iter().filter(|t| cordoned.contains(&t.0)).count();
            m.apply(op);
            let after = m.placed().into_iter().filter(|t| cordoned.contains(&t.0)).count();
            prop_assert!(after <= before, "placed on a cordoned pool by {op:?}");
            if matches!(op, Op::Cycle) {
                m.check_marks().map_err(|e| TestCaseError::fail(format!("after {op:?}: {e}")))?;
            }
        }
        // Quiet: every drain comes due, every grace ends.
        for _ in 0..3 {
            m.b.now += 40_000 + DEFAULT_PREEMPTION_GRACE_MS;
            m.b.cycle();
            m.b.cycle();
        }
        m.check_settled().map_err(TestCaseError::fail)?;
    }
}
