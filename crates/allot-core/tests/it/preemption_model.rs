//! A model test of preemption (issue 42, point 4): random queues with guarantees, applications
//! of random priorities arriving and ending, cycles and time passing; then a quiet phase with no
//! arrivals. Checked after every cycle: every invariant of the scheduler and the pools, never
//! more allocated than the pool holds, no queue ever taken below its guarantee by what is being
//! preempted, and no cycle that decides a preemption finds the tasks placed as at an earlier
//! such cycle (a preemption loop: A takes B's room, then B takes A's). Checked in the quiet
//! phase, round by round: a queue owed its guarantee (below it, a task of its waiting past the
//! delay, a task it may take in a queue above its guarantee) is no longer owed after one cycle
//! plus the victims' grace and the cycle that ends it. Checked after the quiet phase: preemption
//! has stopped (the last rounds preempt nothing), no task was preempted more than
//! `max_preemptions` times, and no preemption the rules allow is left undone, for a task or for a
//! gang (whose members all fit in its queue's guarantee, with as many tasks it may take).

use std::collections::{BTreeMap, BTreeSet};

use allot_core::apps::priority::Priority;
use allot_core::apps::queues::{QueueLimits, QueuePath};
use allot_core::apps::states::TaskState;
use allot_core::apps::{SchedConfig, TaskSpec, World, DEFAULT_PREEMPTION_DELAY_MS, DEFAULT_PREEMPTION_GRACE_MS};
use allot_core::pools::PoolName;
use proptest::prelude::*;

use super::apps::{aid, app_spec, group, member, res, task, tid, Bench};

const QUEUES: usize = 3;
const MAX_PREEMPTIONS: u32 = 3;

#[derive(Debug, Clone)]
enum Op {
    /// An application of `priority` in queue `queue` with `tasks` tasks of one cpu.
    Submit {
        queue: usize,
        priority: i32,
        tasks: u8,
    },
    /// An application of `priority` in queue `queue` whose gang is `members` members of one cpu,
    /// each a task.
    SubmitGang {
        queue: usize,
        priority: i32,
        members: u8,
    },
    Cycle,
    /// Time passes (up to a delay and a grace).
    Wait {
        ms: u32,
    },
    /// A placed task of application `app` (by arrival) ends.
    Finish {
        app: usize,
        task: u8,
    },
    /// The executor of a task being preempted ends it.
    ExecutorEnds {
        app: usize,
        task: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..QUEUES, 0..3i32, 1..5u8).prop_map(|(queue, priority, tasks)| Op::Submit { queue, priority, tasks }),
        (0..QUEUES, 0..3i32, 1..4u8).prop_map(|(queue, priority, members)| Op::SubmitGang { queue, priority, members }),
        Just(Op::Cycle),
        Just(Op::Cycle),
        (0..70_000u32).prop_map(|ms| Op::Wait { ms }),
        (0..8usize, 0..5u8).prop_map(|(app, task)| Op::Finish { app, task }),
        (0..8usize, 0..5u8).prop_map(|(app, task)| Op::ExecutorEnds { app, task }),
    ]
}

struct Model {
    b: Bench,
    capacity: u64,
    guarantees: [u64; QUEUES],
    /// Each application: its queue and how many tasks.
    apps: Vec<(usize, u8)>,
    /// The applications with a gang (of all their tasks), by arrival.
    gangs: BTreeSet<usize>,
    /// Where every task stood ([`Model::placements`]) before each cycle that decided a
    /// preemption.
    decided_at: BTreeSet<Vec<u8>>,
}

fn queue(i: usize) -> String {
    format!("root.q{i}")
}

impl Model {
    fn new(capacity: u64, guarantees: [u64; QUEUES]) -> Model {
        // Ended applications stay readable for the whole history.
        let retention_ms = 1000 * 24 * 3600 * 1000;
        let config = SchedConfig {
            completing_grace_ms: 0,
            retention_ms,
            max_preemptions: MAX_PREEMPTIONS,
            ..SchedConfig::default()
        };
        let mut b = Bench::with_config(config);
        b.pool("p", &format!("cpu={capacity}"), &[]);
        for (i, guarantee) in guarantees.iter().enumerate() {
            let limits = QueueLimits { guaranteed: res(&format!("cpu={guarantee}")), ..QueueLimits::default() };
            b.queue(&queue(i), limits);
        }
        Model { b, capacity, guarantees, apps: Vec::new(), gangs: BTreeSet::new(), decided_at: BTreeSet::new() }
    }

    fn apply(&mut self, op: &Op) -> Result<(), String> {
        match *op {
            Op::Submit { queue: q, priority, tasks } => {
                let id = format!("a{}", self.apps.len());
                self.b.submit(app_spec(&id, &queue(q))).unwrap();
                for t in 0..tasks {
                    let spec = TaskSpec { priority: Priority::of(priority), ..task(&format!("t{t}"), "cpu=1") };
                    self.b.add(&id, spec).unwrap();
                }
                self.apps.push((q, tasks));
            }
            Op::SubmitGang { queue: q, priority, members } => {
                let id = format!("a{}", self.apps.len());
                let mut spec = app_spec(&id, &queue(q));
                spec.groups = vec![group("g", u32::from(members), "cpu=1")];
                self.b.submit(spec).unwrap();
                for t in 0..members {
                    let spec = TaskSpec { priority: Priority::of(priority), ..member(&format!("t{t}"), "g", "cpu=1") };
                    self.b.add(&id, spec).unwrap();
                }
                self.gangs.insert(self.apps.len());
                self.apps.push((q, members));
            }
            Op::Cycle => return self.cycle(),
            Op::Wait { ms } => self.b.now += u64::from(ms),
            Op::Finish { app, task } | Op::ExecutorEnds { app, task }
                if app >= self.apps.len() || task >= self.apps[app].1 => {}
            Op::Finish { app, task } => {
                let (app, task) = (format!("a{app}"), format!("t{task}"));
                let state = self.b.sched.task(&aid(&app), &tid(&task)).unwrap().state;
                if matches!(state, TaskState::Allocated | TaskState::Running) {
                    self.b.complete(&app, &task);
                }
            }
            Op::ExecutorEnds { app, task } => {
                let (app, task) = (aid(&format!("a{app}")), tid(&format!("t{task}")));
                if self.b.sched.task(&app, &task).unwrap().preempting.is_some() {
                    let now = self.b.now;
                    let mut world = World { pools: &mut self.b.pools, ledger: &mut self.b.ledger };
                    self.b.sched.preempted(&app, &task, now, &mut world).unwrap();
                    self.b.check();
                }
            }
        }
        Ok(())
    }

    /// One cycle; fails if it decides a preemption with the tasks placed as before an earlier
    /// cycle that decided one.
    fn cycle(&mut self) -> Result<(), String> {
        let before = self.placements();
        let marked = |m: &Model| -> Vec<Option<allot_core::apps::Preempting>> {
            m.each_task().into_iter().map(|t| t.preempting).collect()
        };
        let marked_before = marked(self);
        self.b.cycle();
        // A task marked now that was not (or by another preemptor) before.
        let decided = marked(self).iter().zip(&marked_before).any(|(after, before)| after.is_some() && after != before);
        if decided && !self.decided_at.insert(before.clone()) {
            return Err(format!(
                "a preemption loop: a cycle decided a preemption with the tasks placed as before an earlier one that \
                 did ({before:?})"
            ));
        }
        Ok(())
    }

    /// Every task, by application then task.
    fn each_task(&self) -> Vec<allot_core::apps::Task> {
        let mut all = Vec::new();
        for (i, (_, n)) in self.apps.iter().enumerate() {
            for t in 0..*n {
                all.push(self.b.sched.task(&aid(&format!("a{i}")), &tid(&format!("t{t}"))).unwrap().clone());
            }
        }
        all
    }

    /// Where every task stands: waiting (0, or 3 with room held for it), placed (1, or 4 while
    /// being preempted), ended (2).
    fn placements(&self) -> Vec<u8> {
        let of = |t: &allot_core::apps::Task| match t.state {
            TaskState::Allocated | TaskState::Running if t.preempting.is_some() => 4,
            TaskState::Allocated | TaskState::Running => 1,
            state if state.is_terminal() => 2,
            _ if self.held(t) => 3,
            _ => 0,
        };
        self.each_task().iter().map(of).collect()
    }

    /// Whether room is held for a task: for itself, or for its application's gang.
    fn held(&self, t: &allot_core::apps::Task) -> bool {
        t.held.is_some()
            || (t.state == TaskState::Pending && self.b.sched.app(&t.app).is_ok_and(|app| !app.held.is_empty()))
    }

    fn is_gang(&self, t: &allot_core::apps::Task) -> bool {
        self.gangs.contains(&t.app.as_str()[1..].parse::<usize>().unwrap())
    }

    /// The queues owed their guarantee now: below it, with a task waiting that may preempt (it
    /// waited the delay since it was added and since it was last preempted), while a queue above
    /// its guarantee holds a task it may take (of lower or equal priority, not yet protected).
    fn owed(&self) -> BTreeSet<usize> {
        let (tasks, now) = (self.each_task(), self.b.now);
        let delay = DEFAULT_PREEMPTION_DELAY_MS;
        let queue_of = |t: &allot_core::apps::Task| self.apps[t.app.as_str()[1..].parse::<usize>().unwrap()].0;
        let mut owed = BTreeSet::new();
        for q in (0..QUEUES).filter(|q| self.used(*q) < self.guarantees[*q]) {
            // A gang's members preempt together, not each alone: see `undone`.
            let may_preempt = |t: &&allot_core::apps::Task| {
                queue_of(t) == q
                    && !self.is_gang(t)
                    && t.state == TaskState::Pending
                    && now >= t.added + delay
                    && t.preempted_at.is_none_or(|at| now >= at + delay)
            };
            let Some(top) = tasks.iter().filter(may_preempt).map(|t| t.spec.priority.value()).max() else { continue };
            let takeable = (0..QUEUES).filter(|r| *r != q && self.used(*r) > self.guarantees[*r]).any(|r| {
                tasks.iter().any(|t| {
                    queue_of(t) == r
                        && !self.is_gang(t)
                        && matches!(t.state, TaskState::Allocated | TaskState::Running)
                        && t.preempting.is_none()
                        && t.spec.priority.value() <= top
                        && t.preemptions < MAX_PREEMPTIONS
                }) || self.gang_takeable(r, top)
            });
            if takeable {
                owed.insert(q);
            }
        }
        owed
    }

    /// Whether a whole gang of queue `r` may be taken by a task of priority `top`: every member
    /// placed, none marked, of lower or equal priority, none protected, and `r` left at or above
    /// its guarantee without it.
    fn gang_takeable(&self, r: usize, top: i32) -> bool {
        self.gangs.iter().filter(|g| self.apps[**g].0 == r).any(|&g| {
            let members: Vec<allot_core::apps::Task> = (0..self.apps[g].1)
                .map(|t| self.b.sched.task(&aid(&format!("a{g}")), &tid(&format!("t{t}"))).unwrap().clone())
                .collect();
            members.iter().all(|t| {
                matches!(t.state, TaskState::Allocated | TaskState::Running)
                    && t.preempting.is_none()
                    && t.spec.priority.value() <= top
                    && t.preemptions < MAX_PREEMPTIONS
            }) && self.used(r) >= self.guarantees[r] + members.len() as u64
        })
    }

    fn used(&self, q: usize) -> u64 {
        let view = self.b.sched.queue(&QueuePath::new(&queue(q)).unwrap()).unwrap();
        view.usage.allocated.get_milli("cpu") / 1000
    }

    /// Every task: (queue, priority, state, being preempted, preemptions, room held for it, a
    /// gang's member).
    fn tasks(&self) -> Vec<(usize, i32, TaskState, bool, u32, bool, bool)> {
        let mut all = Vec::new();
        for (i, (q, n)) in self.apps.iter().enumerate() {
            for t in 0..*n {
                let task = self.b.sched.task(&aid(&format!("a{i}")), &tid(&format!("t{t}"))).unwrap();
                all.push((
                    *q,
                    task.spec.priority.value(),
                    task.state,
                    task.preempting.is_some(),
                    task.preemptions,
                    self.held(task),
                    self.gangs.contains(&i),
                ));
            }
        }
        all
    }

    /// The safety checks of every step.
    fn check(&self) -> Result<(), String> {
        let pool = self.b.pools.pool(&PoolName::new("p").unwrap(), self.b.now).unwrap();
        if pool.allocated.get_milli("cpu") > self.capacity * 1000 {
            return Err(format!("overcommitted: {} of cpu={}", pool.allocated, self.capacity));
        }
        let tasks = self.tasks();
        for q in 0..QUEUES {
            // What it will hold once the preemptions decided are carried out: the victims gone,
            // the tasks they make room for (of the same queue, for a priority) placed.
            let leaving = tasks.iter().filter(|t| t.0 == q && t.3).count() as u64;
            let arriving = tasks.iter().filter(|t| t.0 == q && t.5).count() as u64;
            let after = self.used(q) + arriving - leaving;
            if after < self.used(q) && after < self.guarantees[q] {
                return Err(format!(
                    "queue {q} is being taken below its guarantee: uses {}, {leaving} leaving, {arriving} arriving, \
                     guaranteed {}",
                    self.used(q),
                    self.guarantees[q]
                ));
            }
        }
        if let Some(t) = tasks.iter().find(|t| t.4 > MAX_PREEMPTIONS) {
            return Err(format!("a task preempted {} times", t.4));
        }
        // A gang is placed whole or not at all: while part of it is placed and none of it has
        // ended, every member placed is being taken back.
        for &g in &self.gangs {
            let members: Vec<allot_core::apps::Task> = (0..self.apps[g].1)
                .map(|t| self.b.sched.task(&aid(&format!("a{g}")), &tid(&format!("t{t}"))).unwrap().clone())
                .collect();
            let placed: Vec<&allot_core::apps::Task> =
                members.iter().filter(|t| matches!(t.state, TaskState::Allocated | TaskState::Running)).collect();
            let ended = members.iter().any(|t| t.state.is_terminal());
            if !ended
                && !placed.is_empty()
                && placed.len() < members.len()
                && placed.iter().any(|t| t.preempting.is_none())
            {
                return Err(format!(
                    "the gang of a{g} is held in part: {} of {} members placed",
                    placed.len(),
                    members.len()
                ));
            }
        }
        Ok(())
    }

    /// A preemption the rules allow and nobody made: a queue below its guarantee with a task
    /// waiting, and another above its guarantee holding a task of lower or equal priority that
    /// may still be taken.
    fn undone(&self) -> Option<String> {
        let tasks = self.tasks();
        if let Some(gang) = self.gang_undone(&tasks) {
            return Some(gang);
        }
        for q in 0..QUEUES {
            let waiting = tasks.iter().filter(|t| t.0 == q && !t.6 && t.2 == TaskState::Pending);
            let Some(top) = waiting.map(|t| t.1).max() else {
                continue;
            };
            if self.used(q) >= self.guarantees[q] {
                continue;
            }
            for r in (0..QUEUES).filter(|r| *r != q && self.used(*r) > self.guarantees[*r]) {
                let takeable = tasks.iter().any(|t| {
                    t.0 == r
                        && !t.6
                        && matches!(t.2, TaskState::Allocated | TaskState::Running)
                        && t.1 <= top
                        && t.4 < MAX_PREEMPTIONS
                }) || self.gang_takeable(r, top);
                if takeable {
                    return Some(format!(
                        "queue {q} uses {} of its guarantee {} with a task of priority {top} waiting, and queue {r} \
                         uses {} over its guarantee {} with a task it may take",
                        self.used(q),
                        self.guarantees[q],
                        self.used(r),
                        self.guarantees[r]
                    ));
                }
            }
        }
        None
    }

    /// A gang left waiting though the rules let it preempt: all its members fit in its queue's
    /// guarantee, and the room free with the tasks it may take (of lower or equal priority, in
    /// queues above their guarantees, as many as keep them at it) hold them.
    fn gang_undone(&self, tasks: &[(usize, i32, TaskState, bool, u32, bool, bool)]) -> Option<String> {
        let pool = self.b.pools.pool(&PoolName::new("p").unwrap(), self.b.now).unwrap();
        let free = self.capacity - pool.allocated.get_milli("cpu") / 1000;
        for &g in &self.gangs {
            let (q, members) = self.apps[g];
            let app = self.b.sched.app(&aid(&format!("a{g}"))).unwrap();
            if !app.awaits_gang() || self.used(q) + u64::from(members) > self.guarantees[q] {
                continue;
            }
            let priority = self.b.sched.task(&aid(&format!("a{g}")), &tid("t0")).unwrap().spec.priority.value();
            let mut supply = free;
            for r in (0..QUEUES).filter(|r| *r != q && self.used(*r) > self.guarantees[*r]) {
                let takeable = tasks
                    .iter()
                    .filter(|t| {
                        t.0 == r
                            && !t.6
                            && matches!(t.2, TaskState::Allocated | TaskState::Running)
                            && t.1 <= priority
                            && t.4 < MAX_PREEMPTIONS
                    })
                    .count() as u64;
                supply += takeable.min(self.used(r) - self.guarantees[r]);
            }
            if supply >= u64::from(members) {
                return Some(format!(
                    "the gang of a{g} ({members} members, priority {priority}) waits in queue {q} (uses {} of its \
                     guarantee {}), with {free} free and room for {supply} in all it may take",
                    self.used(q),
                    self.guarantees[q]
                ));
            }
        }
        None
    }

    fn preemptions(&self) -> u32 {
        self.tasks().iter().map(|t| t.4).sum::<u32>() + self.tasks().iter().filter(|t| t.3).count() as u32
    }
}

/// One history: its steps with the checks of every step, then the quiet phase and its checks.
fn run(capacity: u64, shares: [u64; QUEUES], ops: &[Op]) -> Result<(), TestCaseError> {
    // Guarantees that the pool can keep together.
    let mut guarantees = shares;
    while guarantees.iter().sum::<u64>() > capacity {
        let most = (0..QUEUES).max_by_key(|i| guarantees[*i]).unwrap();
        guarantees[most] -= 1;
    }
    let mut m = Model::new(capacity, guarantees);
    for op in ops {
        m.apply(op).map_err(|e| TestCaseError::fail(format!("after {op:?}: {e}")))?;
        // Between cycles a task may end on its own under a preemption decided before: the
        // next cycle calls off what is no longer allowed, before any grace ends.
        if matches!(op, Op::Cycle) {
            m.check().map_err(|e| TestCaseError::fail(format!("after {op:?}: {e}")))?;
        }
    }
    // The quiet phase: nothing arrives or ends by itself; each round lets a delay and a grace
    // pass. Every task may be preempted at most MAX_PREEMPTIONS times, so it settles.
    // First every waiting task waits out the delay. Each round then is one cycle, the
    // victims' grace, and the cycle that ends it: what a queue was owed at a round's start,
    // it is no longer owed at its end.
    let round = DEFAULT_PREEMPTION_DELAY_MS.max(DEFAULT_PREEMPTION_GRACE_MS);
    m.b.now += DEFAULT_PREEMPTION_DELAY_MS;
    let tasks = m.tasks().len() as u32;
    let mut history: BTreeMap<u32, u32> = BTreeMap::new();
    for i in 0..(tasks * MAX_PREEMPTIONS + 4) {
        let owed = m.owed();
        m.cycle().map_err(|e| TestCaseError::fail(format!("quiet round {i}: {e}")))?;
        m.b.now += round;
        m.cycle().map_err(|e| TestCaseError::fail(format!("quiet round {i}: {e}")))?;
        m.check().map_err(|e| TestCaseError::fail(format!("quiet round {i}: {e}")))?;
        let still: Vec<usize> = m.owed().intersection(&owed).copied().collect();
        prop_assert!(
            still.is_empty(),
            "quiet round {i}: queues {still:?} still owed their guarantee after a cycle and the grace \
             (guarantees {guarantees:?}, capacity {capacity}, uses {:?})",
            (0..QUEUES).map(|q| m.used(q)).collect::<Vec<_>>()
        );
        history.insert(i, m.preemptions());
    }
    let last: Vec<u32> = history.values().rev().take(3).copied().collect();
    prop_assert!(last.windows(2).all(|w| w[0] == w[1]), "preemption never stops: {history:?}");
    if let Some(undone) = m.undone() {
        return Err(TestCaseError::fail(format!("{undone} (guarantees {guarantees:?}, capacity {capacity})")));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: super::cases(200), ..ProptestConfig::default() })]

    #[test]
    fn preemption_restores_guarantees_and_priorities_without_loops_or_overcommit(
        capacity in 3..10u64,
        shares in proptest::array::uniform3(0..4u64),
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        run(capacity, shares, &ops)?;
    }
}

/// A history CI's random cases found (2026-12-03): a gang taken whole for one task frees two
/// cpus more than it needs; of the two alike tasks of a queue owed its guarantee, only the first
/// was given that room (the next like it was looked for once the first held room, and one
/// holding room has no like), so the second preempted a task placed again meanwhile: its queue
/// waited a second grace, its victim was preempted twice.
#[test]
fn the_room_a_gang_frees_beyond_its_preemptors_need_goes_to_every_alike_task_still_owed() -> Result<(), TestCaseError> {
    use Op::*;
    run(
        7,
        [3, 2, 0],
        &[
            SubmitGang { queue: 2, priority: 2, members: 2 },
            SubmitGang { queue: 2, priority: 0, members: 3 },
            Cycle,
            Submit { queue: 0, priority: 0, tasks: 2 },
            Cycle,
            Submit { queue: 0, priority: 2, tasks: 2 },
            Submit { queue: 1, priority: 0, tasks: 2 },
        ],
    )
}

/// Another (a longer run's, seed 101): a gang of one taken a whole gang of two; the cpu it
/// freed beyond its need went to nobody, so a queue owed its guarantee waited for a task of a
/// sibling to be placed there first and preempted it a grace later.
#[test]
fn the_room_a_gang_taken_for_a_gang_frees_beyond_its_need_goes_to_a_task_still_owed() -> Result<(), TestCaseError> {
    use Op::*;
    run(
        6,
        [1, 2, 3],
        &[
            SubmitGang { queue: 2, priority: 0, members: 2 },
            Submit { queue: 2, priority: 1, tasks: 3 },
            Submit { queue: 1, priority: 0, tasks: 2 },
            Submit { queue: 0, priority: 0, tasks: 1 },
            SubmitGang { queue: 2, priority: 1, members: 1 },
            Cycle,
            SubmitGang { queue: 1, priority: 2, members: 1 },
            Finish { app: 4, task: 0 },
            Submit { queue: 0, priority: 0, tasks: 1 },
        ],
    )
}

/// A third (seed 303): a queue's task of the highest priority, below its guarantee, waited
/// while a sibling's task of the lowest was placed in the one free cpu, and preempted it a grace
/// later: the sibling's fair share left out the room held for its own preemptors, so it came
/// first.
#[test]
fn the_room_held_for_a_queues_preemptors_counts_in_its_fair_share() -> Result<(), TestCaseError> {
    use Op::*;
    run(
        5,
        [2, 2, 1],
        &[
            SubmitGang { queue: 2, priority: 0, members: 2 },
            Submit { queue: 2, priority: 0, tasks: 3 },
            Submit { queue: 2, priority: 2, tasks: 2 },
            Cycle,
            Submit { queue: 0, priority: 2, tasks: 2 },
            Submit { queue: 1, priority: 2, tasks: 2 },
        ],
    )
}

/// A fourth (seed 1010): a FIFO queue above its guarantee showed the highest priority of its
/// applications (1, a gang that could not be reserved) but placed the one it places next (of
/// priority 0) in the two free cpus, ahead of a sibling below its guarantee; that sibling's task
/// preempted them a grace later.
#[test]
fn a_fifo_queue_shows_the_priority_of_the_application_it_places_next() -> Result<(), TestCaseError> {
    use Op::*;
    run(
        9,
        [1, 2, 0],
        &[
            SubmitGang { queue: 2, priority: 1, members: 3 },
            Submit { queue: 2, priority: 0, tasks: 2 },
            Submit { queue: 2, priority: 1, tasks: 3 },
            SubmitGang { queue: 0, priority: 1, members: 2 },
            Wait { ms: 20236 },
            Cycle,
            Submit { queue: 1, priority: 0, tasks: 2 },
            SubmitGang { queue: 2, priority: 2, members: 1 },
            SubmitGang { queue: 2, priority: 2, members: 3 },
            Wait { ms: 9764 },
            Cycle,
        ],
    )
}
