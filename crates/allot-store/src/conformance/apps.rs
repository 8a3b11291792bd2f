//! The conformance checks of the applications part: queues, applications and tasks placed on
//! the pools and the token quotas of the same store. Each check works in queues, pools and
//! namespaces of its own. The scheduler runs by itself, so a check waits (a few seconds at
//! most) for what it expects.

use std::sync::Arc;
use std::time::Duration;

use allot_core::apps::queues::{QueueLimits, QueuePath};
use allot_core::apps::states::{AppState, TaskState};
use allot_core::apps::{
    AppId, AppSpec, GroupName, QueueRule, SchedError, SchedulingPolicy, TaskEnd, TaskEnding, TaskGroup, TaskId,
    TaskSpec, TokenNeed,
};
use allot_core::pools::{AllocState, PoolError, PoolName};
use allot_core::{LedgerError, NamespaceName, Resources};

use super::{eventually, Time};
use crate::{Store, StoreError, TaskInfo};

/// Runs every check of the applications part against `store`.
pub async fn run_apps(store: Arc<dyn Store>, time: &dyn Time) {
    let store = &*store;
    tokio::join!(
        queues_are_created_changed_and_removed(store),
        tasks_are_placed_on_pools_and_release_on_completion(store),
        a_task_holds_its_alloc_and_tokens_together_or_nothing(store),
        a_gang_reserves_all_its_placeholders_or_none(store),
        submission_is_idempotent_and_checked(store),
        a_pool_removed_with_force_fails_the_tasks_placed_on_it(store),
        task_ends_reported_together_are_each_answered(store),
        task_ends_reported_with_their_runs_keep_both(store),
        group_limits_bind_the_primary_group(store),
        a_placement_rule_that_creates_makes_the_queue_with_the_application(store),
    );
    a_refused_submission_leaves_nothing_behind(store, time).await;
}

fn res(text: &str) -> Resources {
    text.parse().unwrap()
}

fn queue(name: &str) -> QueuePath {
    QueuePath::new(&format!("root.conformance-{name}")).unwrap()
}

fn pool(name: &str) -> PoolName {
    PoolName::new(&format!("conformance-apps-{name}")).unwrap()
}

fn app(id: &str, queue: QueuePath) -> AppSpec {
    AppSpec {
        id: AppId::new(&format!("conformance-{id}")).unwrap(),
        queue,
        user: "conformance".into(),
        user_groups: Vec::new(),
        tags: Default::default(),
        groups: Vec::new(),
        policy: SchedulingPolicy::default(),
        queue_rule: None,
        priority: Default::default(),
    }
}

/// A task that runs only on `pool` (by its label).
fn task(id: &str, resources: &str, on: &PoolName) -> TaskSpec {
    TaskSpec {
        preemptable: true,
        id: TaskId::new(id).unwrap(),
        resources: res(resources),
        tokens: Vec::new(),
        group: None,
        priority: Default::default(),
        selector: [("conformance".to_owned(), on.to_string())].into(),
        spec: String::new(),
    }
}

async fn labelled_pool(store: &dyn Store, name: &PoolName, capacity: &str) {
    store.put_pool(name.clone(), res(capacity)).await.unwrap();
    store.label_pool(name.clone(), [("conformance".to_owned(), name.to_string())].into()).await.unwrap();
}

async fn task_state(store: &dyn Store, app: &AppId, task: &str) -> TaskInfo {
    store.task(app.clone(), TaskId::new(task).unwrap()).await.unwrap()
}

async fn queues_are_created_changed_and_removed(store: &dyn Store) {
    let path = QueuePath::new("root.conformance-q.leaf").unwrap();
    let acl = |text: &str| Some(allot_core::access::Acl::parse(text).unwrap());
    let limits = QueueLimits {
        max_apps: Some(2),
        submit_acl: acl("ada,bob data"),
        admin_acl: acl(" ops"),
        ..Default::default()
    };
    let (created, view) = store.put_queue(path.clone(), limits.clone()).await.unwrap();
    assert!(created && view.leaf && view.limits == limits);
    assert_eq!(store.queue(path.clone()).await.unwrap().limits, limits, "kept with its ACLs");
    let parent = store.queue(QueuePath::new("root.conformance-q").unwrap()).await.unwrap();
    assert!(!parent.leaf, "the parent is made, and is not a leaf");
    let (created, view) = store.put_queue(path.clone(), QueueLimits::default()).await.unwrap();
    assert!(!created && view.limits.max_apps.is_none(), "a put changes the limits");
    let (created, view) =
        store.seed_queue(path.clone(), QueueLimits { max_apps: Some(9), ..Default::default() }).await.unwrap();
    assert!(!created && view.limits.max_apps.is_none(), "a seed keeps what the store has");
    assert!(store.queues().await.unwrap().iter().any(|q| q.path == path));
    store.remove_queue(path.clone()).await.unwrap();
    assert!(matches!(store.queue(path).await, Err(StoreError::Apps(SchedError::Queue(_)))));
}

async fn tasks_are_placed_on_pools_and_release_on_completion(store: &dyn Store) {
    let (q, p) = (queue("place"), pool("place"));
    store.put_queue(q.clone(), QueueLimits::default()).await.unwrap();
    labelled_pool(store, &p, "cpu=4").await;
    let spec = app("place", q);
    let id = spec.id.clone();
    store.add_app(spec).await.unwrap();
    store.add_task(id.clone(), task("t1", "cpu=3", &p)).await.unwrap();
    store.add_task(id.clone(), task("t2", "cpu=3", &p)).await.unwrap();
    eventually("t1 is placed", || async { task_state(store, &id, "t1").await.task.state == TaskState::Allocated })
        .await;
    let t1 = task_state(store, &id, "t1").await.task;
    let placement = t1.placement.clone().unwrap();
    assert_eq!(placement.pool, p);
    // The alloc is the scheduler's: it cannot be freed by hand.
    assert!(matches!(store.inspect_alloc(p.clone(), placement.alloc).await.unwrap(), AllocState::Live(_)));
    let freed = store.free_alloc(p.clone(), placement.alloc).await;
    assert!(matches!(freed, Err(StoreError::Pools(PoolError::HeldByScheduler { .. }))), "{freed:?}");
    // t2 waits, and says why.
    eventually("t2 says why it waits", || async { task_state(store, &id, "t2").await.why.is_some() }).await;
    assert_eq!(task_state(store, &id, "t2").await.task.state, TaskState::Pending);
    // What an executor reads of a task: the task as the store answers it, without why.
    for name in ["t1", "t2"] {
        let stored = store.stored_task(id.clone(), TaskId::new(name).unwrap()).await.unwrap();
        assert_eq!(stored.as_ref(), Some(&task_state(store, &id, name).await.task), "{name}");
    }
    assert_eq!(store.stored_task(id.clone(), TaskId::new("t3").unwrap()).await.unwrap(), None, "no such task");
    let nowhere = AppId::new("place-nowhere").unwrap();
    assert_eq!(store.stored_task(nowhere, TaskId::new("t1").unwrap()).await.unwrap(), None, "no such application");
    store.start_task(id.clone(), TaskId::new("t1").unwrap()).await.unwrap();
    store.finish_task(id.clone(), TaskId::new("t1").unwrap(), None).await.unwrap();
    assert!(matches!(store.inspect_alloc(p.clone(), placement.alloc).await.unwrap(), AllocState::Ended(_)));
    eventually("t2 is placed once t1's room is free", || async {
        task_state(store, &id, "t2").await.task.state == TaskState::Allocated
    })
    .await;
    let t2 = task_state(store, &id, "t2").await.task;
    let removed = store.remove_app(id.clone()).await.unwrap();
    assert_eq!(removed.app.spec.id, id);
    // The answer is what it became, and what was released.
    assert_eq!(removed.app.state, AppState::Failed, "a live application removed ends");
    assert_eq!(removed.app.reason.as_deref(), Some(allot_core::apps::REMOVED));
    assert_eq!(removed.tasks.get(&TaskState::Killed), Some(&1), "{:?}", removed.tasks);
    assert_eq!(removed.tasks.get(&TaskState::Completed), Some(&1), "{:?}", removed.tasks);
    let released = removed.released.expect("a removal says what it released");
    assert_eq!(released.tasks_killed, vec![TaskId::new("t2").unwrap()]);
    assert_eq!(released.placements.iter().map(|p| p.alloc).collect::<Vec<_>>(), vec![t2.placement.unwrap().alloc]);
    assert_eq!(store.pool(p).await.unwrap().allocs, 0, "removing the application freed its alloc");
    assert_eq!(store.stored_task(id.clone(), TaskId::new("t2").unwrap()).await.unwrap(), None, "gone with its app");
    assert!(matches!(store.app(id).await, Err(StoreError::Apps(SchedError::AppNotFound(_)))));
}

/// Several task ends in one call: each is answered in order, a refused one (an unknown task, a
/// task that has not been placed, one reported twice) changes nothing, the others release
/// what they held.
async fn task_ends_reported_together_are_each_answered(store: &dyn Store) {
    let (q, p) = (queue("ends"), pool("ends"));
    store.put_queue(q.clone(), QueueLimits::default()).await.unwrap();
    labelled_pool(store, &p, "cpu=2").await;
    let spec = app("ends", q);
    let id = spec.id.clone();
    store.add_app(spec).await.unwrap();
    for name in ["t1", "t2", "t3"] {
        store.add_task(id.clone(), task(name, "cpu=1", &p)).await.unwrap();
    }
    eventually("two tasks are placed", || async { store.pool(p.clone()).await.unwrap().allocs == 2 }).await;
    let mut placed = Vec::new();
    let mut waiting = None;
    for name in ["t1", "t2", "t3"] {
        match task_state(store, &id, name).await.task.state {
            TaskState::Allocated => placed.push(TaskId::new(name).unwrap()),
            _ => waiting = Some(TaskId::new(name).unwrap()),
        }
    }
    let waiting = waiting.expect("the pool has room for two");
    let end = |task: &TaskId, failed: Option<&str>| TaskEnd {
        app: id.clone(),
        task: task.clone(),
        ending: TaskEnding::of(failed.map(str::to_owned)),
    };
    let answers = store
        .finish_tasks(vec![
            end(&placed[0], None),
            end(&TaskId::new("nope").unwrap(), None),
            end(&placed[1], Some("exit 2")),
            end(&placed[0], None),
        ])
        .await
        .unwrap();
    assert_eq!(answers.len(), 4, "one answer per report: {answers:?}");
    assert_eq!(answers[0].as_ref().unwrap().task.state, TaskState::Completed);
    assert!(matches!(answers[1], Err(SchedError::TaskNotFound { .. })), "{:?}", answers[1]);
    let failed = answers[2].as_ref().unwrap();
    assert_eq!((failed.task.state, failed.task.reason.as_deref()), (TaskState::Failed, Some("exit 2")));
    assert!(matches!(answers[3], Err(SchedError::Illegal(_))), "a second end is refused: {:?}", answers[3]);
    assert_eq!(task_state(store, &id, placed[0].as_str()).await.task.state, TaskState::Completed);
    eventually("the waiting task is placed in the room both freed", || async {
        task_state(store, &id, waiting.as_str()).await.task.state == TaskState::Allocated
    })
    .await;
    let refused = store.finish_tasks(vec![end(&placed[1], None)]).await.unwrap();
    assert!(matches!(refused[..], [Err(SchedError::Illegal(_))]), "{refused:?}");
    assert!(store.finish_tasks(Vec::new()).await.unwrap().is_empty());
    store.remove_app(id).await.unwrap();
}

/// Task ends reported with the runs that ended them (`Store::finish_runs`): each answered as
/// `finish_tasks` answers it, and every run given kept, the refused reports' too (the executor
/// removes a run whose task is gone).
async fn task_ends_reported_with_their_runs_keep_both(store: &dyn Store) {
    let (q, p) = (queue("runends"), pool("runends"));
    store.put_queue(q.clone(), QueueLimits::default()).await.unwrap();
    labelled_pool(store, &p, "cpu=2").await;
    let spec = app("runends", q);
    let id = spec.id.clone();
    store.add_app(spec).await.unwrap();
    for name in ["t1", "t2"] {
        store.add_task(id.clone(), task(name, "cpu=1", &p)).await.unwrap();
    }
    eventually("both tasks are placed", || async { store.pool(p.clone()).await.unwrap().allocs == 2 }).await;
    let (t1, t2, gone) = (TaskId::new("t1").unwrap(), TaskId::new("t2").unwrap(), TaskId::new("gone").unwrap());
    let end = |task: &TaskId, failed: Option<&str>| TaskEnd {
        app: id.clone(),
        task: task.clone(),
        ending: TaskEnding::of(failed.map(str::to_owned)),
    };
    let mut ended = allot_core::runs::Run::new(5);
    ended.task_seq = Some(7);
    let answers = store
        .finish_runs(vec![
            (end(&t1, None), Some(ended.clone())),
            (end(&gone, None), Some(ended.clone())),
            (end(&t2, Some("exit 1")), None),
        ])
        .await
        .unwrap();
    assert_eq!(answers.len(), 3, "one answer per report: {answers:?}");
    assert_eq!(answers[0].as_ref().unwrap().task.state, TaskState::Completed);
    assert!(matches!(answers[1], Err(SchedError::TaskNotFound { .. })), "{:?}", answers[1]);
    assert_eq!(answers[2].as_ref().unwrap().task.state, TaskState::Failed);
    assert_eq!(store.run(id.clone(), t1.clone()).await.unwrap(), Some(ended.clone()));
    assert_eq!(store.run(id.clone(), gone.clone()).await.unwrap(), Some(ended));
    assert_eq!(store.run(id.clone(), t2).await.unwrap(), None, "no run given, none kept");
    assert_eq!(store.pool(p.clone()).await.unwrap().allocs, 0, "both ends released their allocs");
    store.remove_run(id.clone(), gone).await.unwrap();
    store.remove_app(id).await.unwrap();
}

async fn a_pool_removed_with_force_fails_the_tasks_placed_on_it(store: &dyn Store) {
    let (q, p) = (queue("removed"), pool("removed"));
    store.put_queue(q.clone(), QueueLimits::default()).await.unwrap();
    labelled_pool(store, &p, "cpu=2").await;
    let spec = app("removed", q);
    let id = spec.id.clone();
    store.add_app(spec).await.unwrap();
    store.add_task(id.clone(), task("t1", "cpu=1", &p)).await.unwrap();
    eventually("t1 is placed", || async { task_state(store, &id, "t1").await.task.state == TaskState::Allocated })
        .await;
    let refused = store.remove_pool(p.clone(), false).await;
    assert!(matches!(refused, Err(StoreError::Pools(PoolError::PoolInUse { .. }))), "{refused:?}");
    store.remove_pool(p.clone(), true).await.unwrap();
    eventually("t1 fails with its pool", || async {
        task_state(store, &id, "t1").await.task.state == TaskState::Failed
    })
    .await;
    let reason = task_state(store, &id, "t1").await.task.reason.unwrap_or_default();
    assert!(reason.contains(p.as_str()), "the reason names the pool: {reason}");
    store.remove_app(id).await.unwrap();
}

async fn a_task_holds_its_alloc_and_tokens_together_or_nothing(store: &dyn Store) {
    let (q, p) = (queue("tokens"), pool("tokens"));
    let namespace = NamespaceName::new("conformance:apps-tokens").unwrap();
    store.put_queue(q.clone(), QueueLimits::default()).await.unwrap();
    labelled_pool(store, &p, "cpu=8").await;
    store.put_namespace(namespace.clone(), 1).await.unwrap();
    let spec = app("tokens", q);
    let id = spec.id.clone();
    store.add_app(spec).await.unwrap();
    for name in ["t1", "t2"] {
        let need = TokenNeed { namespace: namespace.clone(), units: 1 };
        store.add_task(id.clone(), TaskSpec { tokens: vec![need], ..task(name, "cpu=1", &p) }).await.unwrap();
    }
    eventually("one task is placed", || async {
        task_state(store, &id, "t1").await.task.state == TaskState::Allocated
    })
    .await;
    eventually("the other waits for the token", || async { task_state(store, &id, "t2").await.why.is_some() }).await;
    assert_eq!(store.pool(p.clone()).await.unwrap().allocs, 1, "the waiting task holds no alloc");
    let grants = store.grants(namespace.clone(), crate::PageRequest::first(10)).await.unwrap().items;
    assert_eq!(grants.len(), 1);
    let held = grants[0].grant.token.clone();
    assert_eq!(held.as_str(), format!("@{id}:t1"));
    // The grant is the scheduler's: no client ends it, renews it, or takes a token of its form.
    for fencing in [None, Some(grants[0].grant.fencing)] {
        let released = store.release(namespace.clone(), held.clone(), fencing).await;
        assert!(matches!(released, Err(StoreError::Quotas(LedgerError::HeldByScheduler { .. }))), "{released:?}");
        let renewed = store.keepalive_grant(namespace.clone(), held.clone(), fencing).await;
        assert!(matches!(renewed, Err(StoreError::Quotas(LedgerError::HeldByScheduler { .. }))), "{renewed:?}");
    }
    for token in [held.as_str(), "@someone-else"] {
        let taken = store.allocate(super::quotas::request(&namespace, token, 1), Duration::from_millis(50)).await;
        assert!(matches!(taken, Err(StoreError::Quotas(LedgerError::SchedulerToken(_)))), "{taken:?}");
    }
    assert_eq!(store.namespace(namespace.clone()).await.unwrap().granted_units, 1, "nothing was released");
    // Nor is the namespace removed under the task, with force or not: the task would run on,
    // uncounted, in a namespace made again.
    for force in [false, true] {
        let removed = store.remove_namespace(namespace.clone(), force).await;
        let Err(StoreError::Quotas(LedgerError::NamespaceHeldByScheduler { grants: 1, token, .. })) = &removed else {
            panic!("removing the namespace (force {force}): {removed:?}");
        };
        assert_eq!(token, &held, "the refusal names the task's grant");
    }
    assert_eq!(store.namespace(namespace.clone()).await.unwrap().granted_units, 1, "the namespace is kept whole");
    store.finish_task(id.clone(), TaskId::new("t1").unwrap(), Some("boom".into())).await.unwrap();
    eventually("the token goes to the other task", || async {
        task_state(store, &id, "t2").await.task.state == TaskState::Allocated
    })
    .await;
    store.remove_app(id).await.unwrap();
    assert_eq!(store.namespace(namespace.clone()).await.unwrap().granted_units, 0);
    store.remove_namespace(namespace, false).await.expect("with its tasks ended, the namespace goes");
}

async fn a_gang_reserves_all_its_placeholders_or_none(store: &dyn Store) {
    let (q, p) = (queue("gang"), pool("gang"));
    store.put_queue(q.clone(), QueueLimits::default()).await.unwrap();
    labelled_pool(store, &p, "cpu=4").await;
    let selector: std::collections::BTreeMap<String, String> = [("conformance".to_owned(), p.to_string())].into();
    let gang = |name: &str| {
        let mut spec = app(name, q.clone());
        spec.groups = vec![TaskGroup {
            name: GroupName::new("workers").unwrap(),
            min_members: 3,
            min_resources: res("cpu=1"),
            selector: selector.clone(),
            tokens: Vec::new(),
        }];
        spec
    };
    let (first, second) = (gang("gang-1"), gang("gang-2"));
    let (a, b) = (first.id.clone(), second.id.clone());
    store.add_app(first).await.unwrap();
    store.add_app(second).await.unwrap();
    eventually("one gang is reserved", || async {
        let (x, y) = (store.app(a.clone()).await.unwrap(), store.app(b.clone()).await.unwrap());
        x.app.state == AppState::Running || y.app.state == AppState::Running
    })
    .await;
    let (x, y) = (store.app(a.clone()).await.unwrap(), store.app(b.clone()).await.unwrap());
    let (held, waiting) = if x.app.state == AppState::Running { (x, y) } else { (y, x) };
    assert_eq!(held.app.slots.len(), 3, "all its placeholders");
    assert!(waiting.app.slots.is_empty(), "the other holds none");
    assert_eq!(waiting.app.state, AppState::Reserving, "it waits for its gang to be reserved");
    let member = TaskSpec { group: Some(GroupName::new("workers").unwrap()), ..task("m0", "cpu=1", &p) };
    store.add_task(held.app.spec.id.clone(), member).await.unwrap();
    let held_id = held.app.spec.id.clone();
    eventually("a member takes a placeholder over", || async {
        task_state(store, &held_id, "m0").await.task.state == TaskState::Allocated
    })
    .await;
    let m0 = task_state(store, &held_id, "m0").await.task;
    assert!(held.app.slots.iter().any(|s| Some(&s.placement) == m0.placement.as_ref()), "in place");
    store.complete_app(held_id.clone()).await.unwrap();
    let waiting_id = waiting.app.spec.id.clone();
    eventually("the other gang is reserved once the first is done", || async {
        store.app(waiting_id.clone()).await.unwrap().app.state == AppState::Running
    })
    .await;
    store.remove_app(held_id).await.unwrap();
    store.remove_app(waiting_id).await.unwrap();
    assert_eq!(store.pool(p).await.unwrap().allocs, 0);
}

async fn submission_is_idempotent_and_checked(store: &dyn Store) {
    let q = queue("submit");
    let p = pool("submit");
    store.put_queue(q.clone(), QueueLimits::default()).await.unwrap();
    labelled_pool(store, &p, "cpu=2").await;
    let spec = app("submit", q.clone());
    let id = spec.id.clone();
    assert!(store.add_app(spec.clone()).await.unwrap().1);
    assert!(!store.add_app(spec.clone()).await.unwrap().1, "the same content again");
    let other = AppSpec { user: "someone-else".into(), ..spec };
    assert!(matches!(store.add_app(other).await, Err(StoreError::Apps(SchedError::AppConflict { .. }))));
    let mut gang = app("submit-gang", q);
    gang.groups = vec![TaskGroup {
        name: GroupName::new("g").unwrap(),
        min_members: 1,
        min_resources: res("cpu=3"),
        selector: [("conformance".to_owned(), p.to_string())].into(),
        tokens: Vec::new(),
    }];
    let refused = store.add_app(gang).await;
    assert!(matches!(refused, Err(StoreError::Apps(SchedError::GroupNeverFits { .. }))), "{refused:?}");
    store.remove_app(id).await.unwrap();
}

async fn a_refused_submission_leaves_nothing_behind(store: &dyn Store, time: &dyn Time) {
    let (q, p) = (queue("atomic"), pool("atomic"));
    store.put_queue(q.clone(), QueueLimits::default()).await.unwrap();
    labelled_pool(store, &p, "cpu=4").await;
    let mut spec = app("atomic", q.clone());
    spec.groups = vec![TaskGroup {
        name: GroupName::new("g").unwrap(),
        min_members: 1,
        min_resources: res("cpu=1"),
        selector: [("conformance".to_owned(), p.to_string())].into(),
        tokens: Vec::new(),
    }];
    let id = spec.id.clone();
    let member = |name: &str, resources: &str| TaskSpec {
        group: Some(GroupName::new("g").unwrap()),
        ..task(name, resources, &p)
    };
    let missing = NamespaceName::new("conformance:no-such-namespace").unwrap();
    let refusals = [
        // The second task is larger than its group's placeholder.
        (vec![member("m0", "cpu=1"), member("m1", "cpu=2")], "larger_than_task_group"),
        // A task names a token namespace that does not exist.
        (
            vec![TaskSpec { tokens: vec![TokenNeed { namespace: missing, units: 1 }], ..task("t", "cpu=1", &p) }],
            "namespace_not_found",
        ),
        // One task given twice with different content.
        (vec![task("t", "cpu=1", &p), task("t", "cpu=2", &p)], "task_conflict"),
    ];
    for (tasks, what) in refusals {
        let refused = store.submit_app(spec.clone(), tasks).await;
        assert!(refused.is_err(), "{what}: {refused:?}");
        assert!(
            matches!(store.app(id.clone()).await, Err(StoreError::Apps(SchedError::AppNotFound(_)))),
            "{what}: a refused submission left its application behind"
        );
    }
    // Nothing was reserved for it meanwhile, and the same submission, corrected, goes through.
    time.advance(Duration::from_millis(300)).await;
    assert_eq!(store.pool(p.clone()).await.unwrap().allocs, 0, "no placeholder held for a refused application");
    let (info, created, tasks) = store.submit_app(spec.clone(), vec![member("m0", "cpu=1")]).await.unwrap();
    assert!(created && info.app.spec.id == id && tasks.len() == 1 && tasks[0].1);
    // Adding to an existing application is all or nothing too.
    let refused = store.submit_app(spec.clone(), vec![member("m1", "cpu=1"), member("m2", "cpu=9")]).await;
    assert!(refused.is_err(), "{refused:?}");
    let page = store.tasks(id.clone(), crate::PageRequest::first(10)).await.unwrap();
    assert_eq!(page.items.len(), 1, "the refused submission added no task");
    let (_, created, tasks) = store.submit_app(spec, vec![member("m0", "cpu=1"), member("m1", "cpu=1")]).await.unwrap();
    assert!(!created);
    assert_eq!(tasks.iter().map(|(_, new)| *new).collect::<Vec<_>>(), vec![false, true]);
    store.remove_app(id).await.unwrap();
    assert_eq!(store.pool(p).await.unwrap().allocs, 0);
}

async fn group_limits_bind_the_primary_group(store: &dyn Store) {
    let (q, p) = (queue("groups"), pool("groups"));
    let limits = QueueLimits { group_max_apps: Some(1), group_max: Some(res("cpu=2")), ..Default::default() };
    store.put_queue(q.clone(), limits.clone()).await.unwrap();
    assert_eq!(store.queue(q.clone()).await.unwrap().limits, limits, "kept with its group limits");
    labelled_pool(store, &p, "cpu=8").await;
    let submit = |id: &str, user: &str, groups: &[&str]| {
        let spec = AppSpec {
            user: user.into(),
            user_groups: groups.iter().map(|g| g.to_string()).collect(),
            ..app(id, q.clone())
        };
        let id = spec.id.clone();
        let p = p.clone();
        async move {
            store.submit_app(spec, vec![task("t", "cpu=1", &p)]).await.unwrap();
            id
        }
    };
    let ann = submit("groups-ann", "ann", &["data", "ops"]).await;
    eventually("ann's task is placed", || async {
        task_state(store, &ann, "t").await.task.state == TaskState::Allocated
    })
    .await;
    assert_eq!(store.app(ann.clone()).await.unwrap().app.spec.user_groups, ["data", "ops"], "kept with the app");
    // bob's primary group is data too: its one running application is the most.
    let bob = submit("groups-bob", "bob", &["data"]).await;
    eventually("bob's application waits for its group", || async {
        let why = store.app(bob.clone()).await.unwrap().why.map(|why| why.to_string()).unwrap_or_default();
        why.contains("group `data` already runs the maximum of 1 applications")
    })
    .await;
    // carl's primary group is ops (ann's second group does not count): it runs.
    let carl = submit("groups-carl", "carl", &["ops"]).await;
    eventually("carl's task is placed", || async {
        task_state(store, &carl, "t").await.task.state == TaskState::Allocated
    })
    .await;
    assert_eq!(task_state(store, &bob, "t").await.task.state, TaskState::Pending);
    store.complete_app(ann).await.unwrap();
    eventually("bob's task is placed once ann's application ended", || async {
        task_state(store, &bob, "t").await.task.state == TaskState::Allocated
    })
    .await;
}

async fn a_placement_rule_that_creates_makes_the_queue_with_the_application(store: &dyn Store) {
    let made = QueuePath::new("root.conformance-made.users.ann").unwrap();
    // Without `create`, a missing queue is not found, and nothing is made.
    let named =
        AppSpec { queue_rule: Some(QueueRule { rule: "user".into(), create: false }), ..app("made-no", made.clone()) };
    let refused = store.submit_app(named, Vec::new()).await;
    assert!(matches!(refused, Err(StoreError::Apps(SchedError::Queue(_)))), "{refused:?}");
    assert!(store.queue(made.clone()).await.is_err());
    let rule = QueueRule { rule: "user (create) under fixed root.conformance-made.users".into(), create: true };
    let spec = AppSpec { queue_rule: Some(rule.clone()), ..app("made", made.clone()) };
    let id = spec.id.clone();
    let (info, created, _) = store.submit_app(spec.clone(), Vec::new()).await.unwrap();
    assert!(created);
    assert_eq!(info.app.spec.queue_rule, Some(rule.clone()));
    let queue = store.queue(made.clone()).await.unwrap();
    assert!(queue.leaf && queue.limits == QueueLimits::default(), "made with no limits");
    assert!(store.queue(QueuePath::new("root.conformance-made.users").unwrap()).await.is_ok(), "its parents too");
    assert_eq!(store.app(id.clone()).await.unwrap().app.spec.queue_rule, Some(rule), "kept with the app");
    // The same again: the application as it is, the queue as it is.
    let (_, created, _) = store.submit_app(spec, Vec::new()).await.unwrap();
    assert!(!created);
    // A queue is not made under a leaf that holds live applications.
    let under = QueuePath::new("root.conformance-made.users.ann.more").unwrap();
    let rule = QueueRule { rule: "fixed (create)".into(), create: true };
    let refused =
        store.submit_app(AppSpec { queue_rule: Some(rule), ..app("made-under", under.clone()) }, Vec::new()).await;
    assert!(matches!(refused, Err(StoreError::Apps(SchedError::Queue(_)))), "{refused:?}");
    assert!(store.queue(under).await.is_err());
    store.remove_app(id).await.unwrap();
}
