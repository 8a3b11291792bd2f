//! Tenancy in the scheduler, as a property: random roles and bindings (changed between cycles, as
//! bindings are through the API), pools with labels, namespaces, and applications of random users
//! and groups, with tasks, token needs, selectors and gangs. After every cycle, nothing placed in
//! it (a task's alloc and grants, a gang's placeholders) is on a pool, or in a namespace, that
//! the application's user may not use under the policy of that cycle.

use allot_core::apps::priority::Priority;
use std::collections::BTreeMap;
use std::sync::Arc;

use allot_core::access::{Binding, Pattern, Permission, Policy, Principal, Resource, Role, Tenancy};
use allot_core::apps::queues::{QueueLimits, QueuePath};
use allot_core::apps::{
    AppChange, AppId, AppSpec, GroupName, Placement, SchedConfig, Scheduler, SchedulingPolicy, TaskGroup, TaskId,
    TaskSpec, TokenNeed, World,
};
use allot_core::pools::{LeaseRules, PoolName, Pools};
use allot_core::{Ledger, NamespaceName, Resources};
use proptest::prelude::*;

const USERS: [&str; 4] = ["ann", "bob", "cid", "dee"];
const GROUPS: [&str; 3] = ["ops", "data", "ml"];
const POOLS: [&str; 4] = ["gpu-1", "gpu-2", "cpu-1", "cpu-2"];
const NAMESPACES: [&str; 3] = ["hive", "hive:etl", "openai"];
/// What a role may grant `use` on.
const PATTERNS: [&str; 8] =
    ["pool:gpu-*", "pool:gpu-1", "pool:cpu-*", "pool:cpu-2", "namespace:hive:*", "namespace:openai", "*", "queue:root"];

/// A role: the patterns (by index) it grants `use` on.
fn role() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0..PATTERNS.len(), 0..4)
}

/// A binding: a role (by index) to some users and groups.
fn binding() -> impl Strategy<Value = (usize, Vec<usize>, Vec<usize>)> {
    (0..3usize, prop::collection::vec(0..USERS.len(), 0..2), prop::collection::vec(0..GROUPS.len(), 0..2))
}

fn policy_of(roles: &[Vec<usize>], bindings: &[(usize, Vec<usize>, Vec<usize>)]) -> Policy {
    let roles: BTreeMap<String, Role> = roles
        .iter()
        .enumerate()
        .map(|(i, patterns)| {
            let grants = patterns.iter().map(|p| (Permission::Use, Pattern::parse(PATTERNS[*p]).unwrap())).collect();
            (format!("r{i}"), Role { grants })
        })
        .collect();
    let bindings = bindings
        .iter()
        .map(|(role, users, groups)| Binding {
            role: format!("r{}", role % roles.len().max(1)),
            users: users.iter().map(|u| USERS[*u].to_owned()).collect(),
            groups: groups.iter().map(|g| GROUPS[*g].to_owned()).collect(),
        })
        .filter(|b| roles.contains_key(&b.role))
        .collect();
    Policy::new(roles, bindings).unwrap()
}

#[derive(Debug, Clone)]
struct TaskPlan {
    cpu: u64,
    /// A namespace (by index) and units, if it needs tokens.
    tokens: Option<(usize, u64)>,
    /// `kind=gpu` or `kind=cpu`, if it selects.
    selector: Option<bool>,
}

#[derive(Debug, Clone)]
enum Op {
    Submit {
        user: usize,
        groups: Vec<usize>,
        tasks: Vec<TaskPlan>,
        gang: Option<(u32, Option<usize>)>,
    },
    /// New bindings over the same roles (bindings change through the API).
    Rebind(Vec<(usize, Vec<usize>, Vec<usize>)>),
    Complete(usize),
    Cycle,
}

fn task_plan() -> impl Strategy<Value = TaskPlan> {
    (1..4u64, prop::option::of((0..NAMESPACES.len(), 1..3u64)), prop::option::of(any::<bool>()))
        .prop_map(|(cpu, tokens, selector)| TaskPlan { cpu, tokens, selector })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (
            0..USERS.len(),
            prop::collection::vec(0..GROUPS.len(), 0..3),
            prop::collection::vec(task_plan(), 1..4),
            prop::option::of((1..3u32, prop::option::of(0..NAMESPACES.len()))),
        )
            .prop_map(|(user, groups, tasks, gang)| Op::Submit { user, groups, tasks, gang }),
        1 => prop::collection::vec(binding(), 0..5).prop_map(Op::Rebind),
        2 => (0..64usize).prop_map(Op::Complete),
        3 => Just(Op::Cycle),
    ]
}

struct World_ {
    sched: Scheduler,
    pools: Pools,
    ledger: Ledger,
    now: u64,
    ids: u64,
    apps: Vec<AppId>,
}

fn res(cpu: u64) -> Resources {
    format!("cpu={cpu}").parse().unwrap()
}

/// Why a placement made under `policy` for `user` should not be.
fn trespass(policy: &Policy, user: &Principal, placement: &Placement) -> Option<String> {
    if !policy.allows(user, Permission::Use, &Resource::Pool(placement.pool.to_string())) {
        return Some(format!("{user} placed on pool {}", placement.pool));
    }
    let grant = placement
        .grants
        .iter()
        .find(|g| !policy.allows(user, Permission::Use, &Resource::Namespace(g.namespace.to_string())))?;
    Some(format!("{user} given tokens of {}", grant.namespace))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: super::cases(96), ..ProptestConfig::default() })]

    #[test]
    fn nothing_is_placed_where_its_user_may_not_go(
        roles in prop::collection::vec(role(), 1..4),
        bindings in prop::collection::vec(binding(), 0..5),
        ops in prop::collection::vec(op(), 1..40),
    ) {
        let mut w = World_ {
            sched: Scheduler::new(SchedConfig { completing_grace_ms: 0, ..SchedConfig::default() }),
            pools: Pools::new(LeaseRules::default()),
            ledger: Ledger::new(),
            now: 1000,
            ids: 0,
            apps: Vec::new(),
        };
        for (i, name) in POOLS.iter().enumerate() {
            let pool = PoolName::new(name).unwrap();
            w.pools.put_pool(&pool, res(4));
            let kind = if i < 2 { "gpu" } else { "cpu" };
            w.pools.label_pool(&pool, [("kind".to_owned(), kind.to_owned())].into(), w.now).unwrap();
        }
        for name in NAMESPACES {
            w.ledger.put_namespace(&NamespaceName::new(name).unwrap(), 4, w.now).unwrap();
        }
        w.sched.put_queue(QueuePath::new("root.q").unwrap(), QueueLimits::default()).unwrap();
        let mut policy = Arc::new(policy_of(&roles, &bindings));
        w.sched.set_tenancy(Tenancy::Enforced(policy.clone()));
        for op in ops {
            w.now += 1;
            match op {
                Op::Submit { user, groups, tasks, gang } => {
                    let id = AppId::new(&format!("a{}", w.apps.len())).unwrap();
                    let need = |n: usize, units| TokenNeed { namespace: NamespaceName::new(NAMESPACES[n]).unwrap(), units };
                    let groups_of = gang.map(|(members, tokens)| TaskGroup {
                        name: GroupName::new("g").unwrap(),
                        min_members: members,
                        min_resources: res(3),
                        selector: BTreeMap::new(),
                        tokens: tokens.map(|n| vec![need(n, 1)]).unwrap_or_default(),
                    });
                    let spec = AppSpec {
                        id: id.clone(),
                        queue: QueuePath::new("root.q").unwrap(),
                        user: USERS[user].to_owned(),
                        user_groups: groups.iter().map(|g| GROUPS[*g].to_owned()).collect(),
                        tags: BTreeMap::new(),
                        groups: groups_of.clone().into_iter().collect(),
                        policy: SchedulingPolicy::default(),
                        queue_rule: None,
                        priority: Default::default(),
                    };
                    let world = World { pools: &mut w.pools, ledger: &mut w.ledger };
                    w.sched.add_app(spec, w.now, &world).unwrap();
                    for (i, plan) in tasks.into_iter().enumerate() {
                        let in_gang = groups_of.is_some() && i == 0;
                        let selector = plan.selector.map(|gpu| {
                            [("kind".to_owned(), if gpu { "gpu" } else { "cpu" }.to_owned())].into()
                        });
                        let spec = TaskSpec {
                            preemptable: true,
                            id: TaskId::new(&format!("t{i}")).unwrap(),
                            resources: res(plan.cpu.min(3)),
                            tokens: match (in_gang, &groups_of) {
                                (true, Some(g)) => g.tokens.clone(),
                                _ => plan.tokens.map(|(n, units)| vec![need(n, units)]).unwrap_or_default(),
                            },
                            group: in_gang.then(|| GroupName::new("g").unwrap()),
                            priority: Priority::default(),
                            selector: selector.unwrap_or_default(),
                            spec: String::new(),
                        };
                        let world = World { pools: &mut w.pools, ledger: &mut w.ledger };
                        w.sched.add_task(&id, spec, w.now, &world).unwrap();
                    }
                    w.apps.push(id);
                }
                Op::Rebind(bindings) => {
                    policy = Arc::new(policy_of(&roles, &bindings));
                    w.sched.set_tenancy(Tenancy::Enforced(policy.clone()));
                }
                Op::Complete(pick) => {
                    let placed: Vec<(AppId, TaskId)> = w
                        .apps
                        .iter()
                        .flat_map(|app| {
                            let tasks = w.sched.tasks_after(app, None, 100).unwrap_or_default();
                            tasks.into_iter().filter(|t| t.placement.is_some() && !t.state.is_terminal())
                                .map(|t| (app.clone(), t.spec.id.clone())).collect::<Vec<_>>()
                        })
                        .collect();
                    if let Some((app, task)) = placed.get(pick % placed.len().max(1)).cloned() {
                        let mut world = World { pools: &mut w.pools, ledger: &mut w.ledger };
                        w.sched.finish_task(&app, &task, None, w.now, &mut world).unwrap();
                    }
                }
                Op::Cycle => {
                    let (now, mut ids) = (w.now, w.ids);
                    let (_, outcome) = {
                        let mut world = World { pools: &mut w.pools, ledger: &mut w.ledger };
                        w.sched.schedule(now, &mut world, &mut || { ids += 1; ids })
                    };
                    w.ids = ids;
                    // Everything this cycle placed: tasks on pools of their own, gangs' placeholders.
                    for change in &outcome.apps {
                        let (app, placements): (&AppId, Vec<&Placement>) = match change {
                            AppChange::Task(task) => (&task.app, task.placement.iter().collect()),
                            AppChange::App(app) => (&app.spec.id, app.slots.iter().map(|s| &s.placement).collect()),
                            _ => continue,
                        };
                        let user = w.sched.app(app).unwrap().spec.principal();
                        for placement in placements.into_iter().filter(|p| p.at == now) {
                            prop_assert_eq!(trespass(&policy, &user, placement), None);
                        }
                    }
                    w.sched.check_invariants(&w.pools).map_err(TestCaseError::fail)?;
                    w.pools.check_invariants().map_err(TestCaseError::fail)?;
                    w.ledger.check_invariants().map_err(TestCaseError::fail)?;
                }
            }
        }
    }
}
