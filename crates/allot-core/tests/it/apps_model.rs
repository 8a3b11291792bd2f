//! A property test of the scheduler: random sequences of every operation (submitting
//! applications with and without gangs, adding, starting, finishing and removing tasks,
//! completing, failing and removing applications, scheduling cycles, time passing) never break
//! an invariant of the scheduler, the pools or the ledger, never take an illegal transition
//! (an operation answers an error or changes state by the tables), never hold a gang in part,
//! and every application ends once its tasks have.

use allot_core::apps::priority::Priority;
use std::collections::BTreeMap;

use allot_core::apps::queues::{QueueLimits, QueuePath};
use allot_core::apps::states::{AppState, TaskState};
use allot_core::apps::{
    AppId, AppSpec, GangStyle, GroupName, SchedConfig, SchedError, Scheduler, SchedulingPolicy, TaskGroup, TaskId,
    TaskSpec, TokenNeed, World,
};
use allot_core::pools::{LeaseRules, PoolName, Pools};
use allot_core::{Ledger, Millis, NamespaceName};
use proptest::prelude::*;

const GRACE_MS: u64 = 500;

#[derive(Debug, Clone)]
enum Op {
    Submit { app: u8, gang: Option<(u32, u8, bool)>, queue: u8 },
    AddTask { app: u8, task: u8, cpu: u8, member: bool, token: bool },
    Cycle,
    Start { app: u8, task: u8 },
    Finish { app: u8, task: u8, fail: bool },
    RemoveTask { app: u8, task: u8 },
    CompleteApp { app: u8 },
    FailApp { app: u8 },
    RemoveApp { app: u8 },
    Wait { ms: u16 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..4u8, proptest::option::of((1..4u32, 1..3u8, any::<bool>())), 0..2u8)
            .prop_map(|(app, gang, queue)| Op::Submit { app, gang, queue }),
        (0..4u8, 0..6u8, 1..4u8, any::<bool>(), any::<bool>())
            .prop_map(|(app, task, cpu, member, token)| Op::AddTask { app, task, cpu, member, token }),
        Just(Op::Cycle),
        Just(Op::Cycle),
        (0..4u8, 0..6u8).prop_map(|(app, task)| Op::Start { app, task }),
        (0..4u8, 0..6u8, any::<bool>()).prop_map(|(app, task, fail)| Op::Finish { app, task, fail }),
        (0..4u8, 0..6u8).prop_map(|(app, task)| Op::RemoveTask { app, task }),
        (0..4u8).prop_map(|app| Op::CompleteApp { app }),
        (0..4u8).prop_map(|app| Op::FailApp { app }),
        (0..4u8).prop_map(|app| Op::RemoveApp { app }),
        (0..3000u16).prop_map(|ms| Op::Wait { ms }),
    ]
}

struct World2 {
    sched: Scheduler,
    pools: Pools,
    ledger: Ledger,
    now: Millis,
    next_id: u64,
}

fn app_id(app: u8) -> AppId {
    AppId::new(&format!("app-{app}")).unwrap()
}

fn task_id(task: u8) -> TaskId {
    TaskId::new(&format!("t{task}")).unwrap()
}

fn tokens() -> NamespaceName {
    NamespaceName::new("seats").unwrap()
}

impl World2 {
    fn new() -> World2 {
        let mut pools = Pools::new(LeaseRules::default());
        for name in ["p1", "p2", "p3"] {
            pools.put_pool(&PoolName::new(name).unwrap(), "cpu=4".parse().unwrap());
        }
        let mut ledger = Ledger::new();
        ledger.put_namespace(&tokens(), 3, 0).unwrap();
        let mut sched = Scheduler::new(SchedConfig { completing_grace_ms: GRACE_MS, ..SchedConfig::default() });
        sched.put_queue(QueuePath::new("root.a").unwrap(), QueueLimits::default()).unwrap();
        sched
            .put_queue(QueuePath::new("root.b").unwrap(), QueueLimits { max_apps: Some(1), ..QueueLimits::default() })
            .unwrap();
        World2 { sched, pools, ledger, now: 1, next_id: 0 }
    }

    fn world(&mut self) -> (&mut Scheduler, World<'_>) {
        (&mut self.sched, World { pools: &mut self.pools, ledger: &mut self.ledger })
    }

    fn apply(&mut self, op: &Op) -> Result<(), SchedError> {
        let now = self.now;
        match op.clone() {
            Op::Submit { app, gang, queue } => {
                let groups = gang
                    .map(|(members, cpu, _)| {
                        vec![TaskGroup {
                            name: GroupName::new("g").unwrap(),
                            min_members: members,
                            min_resources: format!("cpu={cpu}").parse().unwrap(),
                            selector: BTreeMap::new(),
                            tokens: if members == 1 {
                                vec![TokenNeed { namespace: tokens(), units: 1 }]
                            } else {
                                vec![]
                            },
                        }]
                    })
                    .unwrap_or_default();
                let hard = gang.is_some_and(|(_, _, hard)| hard);
                let spec = AppSpec {
                    id: app_id(app),
                    queue: QueuePath::new(if queue == 0 { "root.a" } else { "root.b" }).unwrap(),
                    user: "u".into(),
                    user_groups: Vec::new(),
                    tags: BTreeMap::new(),
                    groups,
                    policy: SchedulingPolicy {
                        placeholder_timeout_ms: 2_000,
                        gang: if hard { GangStyle::Hard } else { GangStyle::Soft },
                        reserve_timeout_ms: Some(4_000),
                        max_parallelism: None,
                    },
                    queue_rule: None,
                    priority: Default::default(),
                };
                let (sched, world) = self.world();
                sched.add_app(spec, now, &world).map(|_| ())
            }
            Op::AddTask { app, task, cpu, member, token } => {
                let spec = TaskSpec {
                    preemptable: true,
                    id: task_id(task),
                    resources: format!("cpu={}", if member { 1 } else { cpu }).parse().unwrap(),
                    tokens: if token { vec![TokenNeed { namespace: tokens(), units: 1 }] } else { vec![] },
                    group: member.then(|| GroupName::new("g").unwrap()),
                    priority: Priority::of(i32::from(task % 3)),
                    selector: BTreeMap::new(),
                    spec: String::new(),
                };
                let world = World { pools: &mut self.pools, ledger: &mut self.ledger };
                self.sched.add_task(&app_id(app), spec, now, &world).map(|_| ())
            }
            Op::Cycle => {
                let mut next = self.next_id;
                let (sched, mut world) = self.world();
                sched.schedule(now, &mut world, &mut || {
                    next += 1;
                    next
                });
                self.next_id = next;
                Ok(())
            }
            Op::Start { app, task } => self.sched.start_task(&app_id(app), &task_id(task)).map(|_| ()),
            Op::Finish { app, task, fail } => {
                let (sched, mut world) = self.world();
                let failed = fail.then(|| "boom".to_owned());
                sched.finish_task(&app_id(app), &task_id(task), failed, now, &mut world).map(|_| ())
            }
            Op::RemoveTask { app, task } => {
                let (sched, mut world) = self.world();
                sched.remove_task(&app_id(app), &task_id(task), now, &mut world).map(|_| ())
            }
            Op::CompleteApp { app } => {
                let (sched, mut world) = self.world();
                sched.complete_app(&app_id(app), now, &mut world).map(|_| ())
            }
            Op::FailApp { app } => {
                let (sched, mut world) = self.world();
                sched.fail_app(&app_id(app), "failed", now, &mut world).map(|_| ())
            }
            Op::RemoveApp { app } => {
                let (sched, mut world) = self.world();
                sched.remove_app(&app_id(app), now, &mut world).map(|_| ())
            }
            Op::Wait { ms } => {
                self.now += u64::from(ms);
                Ok(())
            }
        }
    }

    fn check(&self) -> Result<(), String> {
        self.sched.check_invariants(&self.pools)?;
        self.pools.check_invariants()?;
        self.ledger.check_invariants()?;
        for app in self.sched.apps_after(None, usize::MAX) {
            let members: u32 = app.spec.groups.iter().map(|g| g.min_members).sum();
            match app.state {
                // Waiting for its gang, or never had one: no placeholder is held.
                AppState::Reserving | AppState::Accepted | AppState::New if !app.slots.is_empty() => {
                    return Err(format!("{}: {} holds placeholders", app.spec.id, app.state))
                }
                // A gang reserved: all its placeholders, until one is taken over or released.
                AppState::Running if app.reserved_at.is_some() && app.slots.len() > members as usize => {
                    return Err(format!("{}: {} of {members} placeholders", app.spec.id, app.slots.len()))
                }
                _ => {}
            }
            if app.awaits_gang() && app.reserved_at.is_some() {
                return Err(format!("{}: waits for its gang after it was reserved", app.spec.id));
            }
        }
        Ok(())
    }
}

/// The events an application can take from a state, by the tables: a state change outside them
/// would be a silent transition.
fn reachable(from: AppState, to: AppState) -> bool {
    let mut seen = vec![from];
    let mut i = 0;
    while i < seen.len() {
        for (state, _, next) in allot_core::apps::states::APP_TRANSITIONS {
            if *state == seen[i] && !seen.contains(next) {
                seen.push(*next);
            }
        }
        i += 1;
    }
    seen.contains(&to)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: super::cases(300), ..ProptestConfig::default() })]

    #[test]
    fn random_operations_keep_every_invariant_and_applications_end_with_their_tasks(ops in proptest::collection::vec(op(), 1..80)) {
        let mut w = World2::new();
        for op in &ops {
            let before: BTreeMap<AppId, AppState> =
                w.sched.apps_after(None, usize::MAX).into_iter().map(|a| (a.spec.id.clone(), a.state)).collect();
            let _ = w.apply(op);
            w.check().map_err(|e| TestCaseError::fail(format!("after {op:?}: {e}")))?;
            for app in w.sched.apps_after(None, usize::MAX) {
                if let Some(was) = before.get(&app.spec.id) {
                    prop_assert!(reachable(*was, app.state), "{}: {was} -> {} is not in the table", app.spec.id, app.state);
                }
            }
        }
        // Let every task end: placed ones complete, waiting ones fail; then time passes.
        let apps: Vec<AppId> = w.sched.apps_after(None, usize::MAX).into_iter().map(|a| a.spec.id.clone()).collect();
        for app in &apps {
            let tasks: Vec<(TaskId, TaskState)> = w
                .sched
                .tasks_after(app, None, usize::MAX)
                .unwrap()
                .into_iter()
                .map(|t| (t.spec.id.clone(), t.state))
                .collect();
            for (task, state) in tasks {
                if !state.is_terminal() {
                    let now = w.now;
                    let (sched, mut world) = w.world();
                    let failed = (state == TaskState::Pending).then(|| "gave up".to_owned());
                    sched.finish_task(app, &task, failed, now, &mut world).unwrap();
                }
            }
        }
        // An application with no task at all waits for tasks: its user removes it.
        for app in &apps {
            if w.sched.tasks_after(app, None, 1).unwrap().is_empty() {
                let now = w.now;
                let (sched, mut world) = w.world();
                sched.remove_app(app, now, &mut world).unwrap();
            }
        }
        w.now += GRACE_MS;
        w.apply(&Op::Cycle).unwrap();
        w.check().map_err(TestCaseError::fail)?;
        for app in w.sched.apps_after(None, usize::MAX) {
            let has_tasks = !w.sched.tasks_after(&app.spec.id, None, 1).unwrap().is_empty();
            if has_tasks {
                prop_assert!(app.state.is_terminal(), "{} has ended tasks but is {}", app.spec.id, app.state);
                prop_assert!(app.slots.is_empty());
            }
        }
        prop_assert_eq!(w.pools.pools(w.now).iter().map(|p| p.allocs).sum::<usize>(), 0, "everything was released");
        prop_assert_eq!(w.ledger.namespace(&tokens(), w.now).unwrap().granted_units, 0);
    }
}
