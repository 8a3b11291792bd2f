//! The store the executor of the Redis-shaped run is given: its daemon's `RedisStore`, every call
//! counted and made one at a time, so that a turn of the executor can tell when it has nothing
//! left to do (no call in flight, none started since the last look) and runs the same way from
//! run to run (the calls' order is the order the executor's tasks ask, not the order Redis's
//! answers come back in).
//!
//! What the executor would ask the daemon that schedules over HTTP (the applications part, when
//! its own daemon does not schedule) is asked of that daemon's store in process: the work its
//! handlers would do, without the wire, whose timing a turn could not tell from idleness. Its
//! change feed is not offered (the executor lists the tasks placed on its pools on its timer,
//! as on a store without one): the feed's events come when Redis's messages do, at moments of
//! the real clock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use std::time::Duration;

use allot_core::apps::queues::{QueueLimits, QueuePath, Queues};
use allot_core::apps::TaskSpec;
use allot_core::apps::{AppId, AppOrder, AppPlace, AppSpec, QueueView, SchedError, SchedStats, Task, TaskEnd, TaskId};
use allot_core::pools::{
    Alloc, AllocId, AllocNotes, AllocRequest, AllocState, CordonOrder, EndedAlloc, Labels, Offer, PoolName, PoolView,
};
use allot_core::runs::Run;
use allot_core::watch::Filter;
use allot_core::{AllocateRequest, Millis, NamespaceName, NamespaceView, Resources, SessionId, Token, WaiterView};
use allot_store::prelude::*;
use allot_store::{
    AccessRecords, Allocation, ApiTokenRecord, AppInfo, AppsHome, BindingRecord, CachedOutputs, CommitStats,
    ExecutorLease, GrantInfo, Page, PageRequest, SessionInfo, StoreError, Submitted, TaskInfo, WatchError, Watcher,
};
use allot_store_redis::RedisStore;

/// The daemons' stores, as the simulation opens and closes them.
pub(super) type Daemons = Arc<Mutex<Vec<Option<Arc<RedisStore>>>>>;

/// The executor's runtime about to park (no task ready): the tasks waiting for that moment.
#[derive(Default)]
pub(super) struct Idle {
    wakers: Mutex<Vec<Waker>>,
}

impl Idle {
    /// The runtime has no task ready (its `on_thread_park` hook): every waiter is woken.
    pub(super) fn about_to_park(&self) {
        let wakers = std::mem::take(&mut *self.wakers.lock().unwrap_or_else(|p| p.into_inner()));
        wakers.into_iter().for_each(Waker::wake);
    }

    /// Woken the next time the runtime is about to park.
    pub(super) fn wake_when_about_to_park(&self, waker: &Waker) {
        self.wakers.lock().unwrap_or_else(|p| p.into_inner()).push(waker.clone());
    }

    /// Returns the next time the runtime is about to park.
    async fn until_about_to_park(&self) {
        let mut waiting = false;
        std::future::poll_fn(|cx| {
            if std::mem::replace(&mut waiting, true) {
                return Poll::Ready(());
            }
            self.wake_when_about_to_park(cx.waker());
            Poll::Pending
        })
        .await
    }
}

/// The executor's calls: one at a time, counted.
#[derive(Default)]
pub(super) struct Calls {
    idle: Arc<Idle>,
    /// Held through each call: the next waits (first come, first served).
    one_at_a_time: tokio::sync::Mutex<()>,
    started: AtomicU64,
    in_flight: AtomicU64,
    failed: AtomicU64,
}

/// A call under way: counted in flight until dropped.
struct Call<'a> {
    calls: &'a Calls,
    _turn: tokio::sync::MutexGuard<'a, ()>,
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        self.calls.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Calls {
    async fn begin(&self) -> Call<'_> {
        let turn = self.one_at_a_time.lock().await;
        self.started.fetch_add(1, Ordering::SeqCst);
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        Call { calls: self, _turn: turn }
    }

    /// A call's answer, handed to its caller once every other task of the executor's runtime
    /// has run as far as it can: the answer comes from another thread at a moment of the real
    /// clock, and the runtime would otherwise run its caller before or after the others as that
    /// moment falls.
    async fn answered<T>(&self, answer: Result<T, StoreError>) -> Result<T, StoreError> {
        if answer.is_err() {
            self.failed.fetch_add(1, Ordering::SeqCst);
        }
        self.idle.until_about_to_park().await;
        answer
    }

    /// Calls started so far.
    pub(super) fn started(&self) -> u64 {
        self.started.load(Ordering::SeqCst)
    }

    /// Calls started and not answered.
    pub(super) fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Calls that failed so far: after one, a run whose ending could not be stored replays its
    /// last round.
    pub(super) fn failed(&self) -> u64 {
        self.failed.load(Ordering::SeqCst)
    }
}

/// The executor's daemon's store (`local`), and the daemon that schedules found among `daemons`.
pub(super) struct ExecStore {
    local: Arc<RedisStore>,
    daemons: Daemons,
    pub(super) calls: Arc<Calls>,
}

impl ExecStore {
    pub(super) fn new(local: Arc<RedisStore>, daemons: Daemons, idle: Arc<Idle>) -> ExecStore {
        let calls = Calls { idle, ..Calls::default() };
        ExecStore { local, daemons, calls: Arc::new(calls) }
    }

    fn local(&self) -> Arc<RedisStore> {
        self.local.clone()
    }

    /// The daemon that schedules as this one sees it: itself if it says so, else another that
    /// says so (the executor's calls would go there), else itself (which refuses them).
    fn scheduling(&self) -> Arc<RedisStore> {
        if self.local.apps_home() == AppsHome::Here {
            return self.local.clone();
        }
        let daemons = self.daemons.lock().unwrap_or_else(|p| p.into_inner());
        let here = daemons.iter().flatten().find(|store| store.apps_home() == AppsHome::Here);
        here.cloned().unwrap_or_else(|| self.local.clone())
    }
}

/// Implements `$trait` for [`ExecStore`]: each listed call made through [`Calls`] on the store
/// its route names (`local` or `scheduling`); `$rest` as written.
macro_rules! forward {
    ($trait:ident { $($route:ident: fn $name:ident(&self $(, $arg:ident: $ty:ty)*) -> $ret:ty;)* } $($rest:tt)*) => {
        #[async_trait::async_trait]
        impl $trait for ExecStore {
            $(
                async fn $name(&self $(, $arg: $ty)*) -> $ret {
                    let _call = self.calls.begin().await;
                    let store = self.$route();
                    let answer = <RedisStore as $trait>::$name(&store $(, $arg)*).await;
                    self.calls.answered(answer).await
                }
            )*
            $($rest)*
        }
    };
}

forward!(QuotaStore {
    local: fn put_namespace(&self, name: NamespaceName, quota: u64) -> Result<(bool, NamespaceView), StoreError>;
    local: fn seed_namespace(&self, name: NamespaceName, quota: u64) -> Result<(bool, NamespaceView), StoreError>;
    local: fn remove_namespace(&self, name: NamespaceName, force: bool) -> Result<usize, StoreError>;
    local: fn namespaces(&self, page: PageRequest<NamespaceName>) -> Result<Page<NamespaceView, NamespaceName>, StoreError>;
    local: fn namespace(&self, name: NamespaceName) -> Result<NamespaceView, StoreError>;
    local: fn allocate(&self, request: AllocateRequest, wait: Duration) -> Result<Allocation, StoreError>;
    local: fn release(&self, namespace: NamespaceName, token: Token, fencing: Option<u64>) -> Result<Option<GrantInfo>, StoreError>;
    local: fn keepalive_grant(&self, namespace: NamespaceName, token: Token, fencing: Option<u64>) -> Result<GrantInfo, StoreError>;
    local: fn allocate_held(&self, request: AllocateRequest, wait: Duration) -> Result<Allocation, StoreError>;
    local: fn release_held(&self, namespace: NamespaceName, token: Token) -> Result<Option<GrantInfo>, StoreError>;
    local: fn grants(&self, namespace: NamespaceName, page: PageRequest<Token>) -> Result<Page<GrantInfo, Token>, StoreError>;
    local: fn grant(&self, namespace: NamespaceName, token: Token) -> Result<GrantInfo, StoreError>;
    local: fn waiters(&self, namespace: NamespaceName, page: PageRequest<u64>) -> Result<Page<WaiterView, u64>, StoreError>;
    local: fn open_session(&self, ttl_ms: u64, owner: Option<String>) -> Result<SessionInfo, StoreError>;
    local: fn keepalive_session(&self, id: SessionId) -> Result<SessionInfo, StoreError>;
    local: fn close_session(&self, id: SessionId) -> Result<SessionInfo, StoreError>;
    local: fn sessions(&self, page: PageRequest<SessionId>) -> Result<Page<SessionInfo, SessionId>, StoreError>;
    local: fn session(&self, id: SessionId) -> Result<SessionInfo, StoreError>;
});

forward!(PoolStore {
    local: fn put_pool(&self, name: PoolName, capacity: Resources) -> Result<(bool, PoolView), StoreError>;
    local: fn seed_pool(&self, name: PoolName, capacity: Resources) -> Result<(bool, PoolView), StoreError>;
    local: fn remove_pool(&self, name: PoolName, force: bool) -> Result<usize, StoreError>;
    local: fn pools(&self, page: PageRequest<PoolName>) -> Result<Page<PoolView, PoolName>, StoreError>;
    local: fn pool(&self, name: PoolName) -> Result<PoolView, StoreError>;
    local: fn offer(&self, name: PoolName) -> Result<Option<Offer>, StoreError>;
    local: fn accept(&self, name: PoolName, request: AllocRequest) -> Result<Alloc, StoreError>;
    local: fn keepalive_alloc(&self, name: PoolName, id: AllocId, interval_ms: u64) -> Result<(u64, Alloc), StoreError>;
    local: fn annotate_alloc(&self, name: PoolName, id: AllocId, notes: AllocNotes) -> Result<Alloc, StoreError>;
    local: fn free_alloc(&self, name: PoolName, id: AllocId) -> Result<EndedAlloc, StoreError>;
    local: fn inspect_alloc(&self, name: PoolName, id: AllocId) -> Result<AllocState, StoreError>;
    local: fn allocs(&self, name: PoolName, page: PageRequest<AllocId>) -> Result<Page<Alloc, AllocId>, StoreError>;
    local: fn stop_if_idle_for(&self, name: PoolName, idle_ms: u64) -> Result<(bool, u64), StoreError>;
    local: fn label_pool(&self, name: PoolName, labels: Labels) -> Result<PoolView, StoreError>;
    local: fn occupy_pool(&self, name: PoolName, occupied: Resources) -> Result<PoolView, StoreError>;
    local: fn cordon_pool(&self, name: PoolName, order: CordonOrder) -> Result<PoolView, StoreError>;
});

forward!(AppStore {
    scheduling: fn put_queue(&self, path: QueuePath, limits: QueueLimits) -> Result<(bool, QueueView), StoreError>;
    scheduling: fn seed_queue(&self, path: QueuePath, limits: QueueLimits) -> Result<(bool, QueueView), StoreError>;
    scheduling: fn remove_queue(&self, path: QueuePath) -> Result<(), StoreError>;
    scheduling: fn queues(&self) -> Result<Vec<QueueView>, StoreError>;
    scheduling: fn queue_tree(&self) -> Result<Queues, StoreError>;
    scheduling: fn queue(&self, path: QueuePath) -> Result<QueueView, StoreError>;
    scheduling: fn add_app(&self, spec: AppSpec) -> Result<(AppInfo, bool), StoreError>;
    scheduling: fn submit_app(&self, spec: AppSpec, tasks: Vec<TaskSpec>) -> Result<Submitted, StoreError>;
    scheduling: fn app(&self, id: AppId) -> Result<AppInfo, StoreError>;
    scheduling: fn apps(&self, page: PageRequest<AppId>) -> Result<Page<AppInfo, AppId>, StoreError>;
    scheduling: fn apps_in_order(&self, order: AppOrder, page: PageRequest<AppPlace>) -> Result<Page<AppInfo, AppPlace>, StoreError>;
    scheduling: fn remove_app(&self, id: AppId) -> Result<AppInfo, StoreError>;
    scheduling: fn complete_app(&self, id: AppId) -> Result<AppInfo, StoreError>;
    scheduling: fn fail_app(&self, id: AppId, reason: String) -> Result<AppInfo, StoreError>;
    scheduling: fn add_task(&self, app: AppId, spec: TaskSpec) -> Result<(TaskInfo, bool), StoreError>;
    scheduling: fn task(&self, app: AppId, task: TaskId) -> Result<TaskInfo, StoreError>;
    // Read where the executor is: the scheduler's, when its daemon schedules, else the record.
    local: fn stored_task(&self, app: AppId, task: TaskId) -> Result<Option<Task>, StoreError>;
    scheduling: fn placed_on(&self, pools: &std::collections::HashSet<PoolName>) -> Result<Vec<(AppId, TaskId)>, StoreError>;
    scheduling: fn tasks(&self, app: AppId, page: PageRequest<TaskId>) -> Result<Page<TaskInfo, TaskId>, StoreError>;
    scheduling: fn start_task(&self, app: AppId, task: TaskId) -> Result<TaskInfo, StoreError>;
    scheduling: fn finish_task(&self, app: AppId, task: TaskId, failed: Option<String>) -> Result<TaskInfo, StoreError>;
    scheduling: fn finish_tasks(&self, ends: Vec<TaskEnd>) -> Result<Vec<Result<TaskInfo, SchedError>>, StoreError>;
    scheduling: fn remove_task(&self, app: AppId, task: TaskId) -> Result<TaskInfo, StoreError>;
}
    fn sched_stats(&self) -> SchedStats {
        self.local.sched_stats()
    }

    fn set_tenancy(&self, tenancy: allot_core::access::Tenancy) {
        self.local.set_tenancy(tenancy);
    }

    /// Here when some daemon schedules (its calls are made to it in process), else unknown.
    fn apps_home(&self) -> AppsHome {
        match self.scheduling().apps_home() {
            AppsHome::Here => AppsHome::Here,
            _ => AppsHome::Unknown,
        }
    }
);

forward!(RunStore {
    local: fn put_run(&self, app: AppId, task: TaskId, run: Run) -> Result<(), StoreError>;
    local: fn run(&self, app: AppId, task: TaskId) -> Result<Option<Run>, StoreError>;
    local: fn runs(&self) -> Result<Vec<(AppId, TaskId, Run)>, StoreError>;
    local: fn remove_run(&self, app: AppId, task: TaskId) -> Result<(), StoreError>;
    local: fn cached_outputs(&self, key: &str) -> Result<Option<CachedOutputs>, StoreError>;
    local: fn put_cached_outputs(&self, key: String, entry: CachedOutputs) -> Result<(), StoreError>;
    local: fn forget_cached_outputs(&self, kept_before: Millis, limit: usize) -> Result<usize, StoreError>;
    local: fn renew_executor(&self, node: &str, pools: &[PoolName], task_types: &[String], ttl: Duration) -> Result<(), StoreError>;
    local: fn executors(&self) -> Result<Vec<ExecutorLease>, StoreError>;
});

forward!(AccessStore {
    local: fn add_api_token(&self, token: ApiTokenRecord) -> Result<(), StoreError>;
    local: fn revoke_api_token(&self, name: &str) -> Result<ApiTokenRecord, StoreError>;
    local: fn put_binding(&self, binding: BindingRecord) -> Result<(), StoreError>;
    local: fn remove_binding(&self, name: &str) -> Result<BindingRecord, StoreError>;
    local: fn access_records(&self) -> Result<AccessRecords, StoreError>;
    local: fn access_version(&self) -> Result<u64, StoreError>;
});

/// No change feed: the executor lists on its timer.
impl WatchStore for ExecStore {
    fn watch(&self, _: Filter, _: Option<u64>) -> Result<Watcher, WatchError> {
        Err(WatchError::Unsupported { backend: "the simulation's executor store" })
    }

    fn revision(&self) -> u64 {
        0
    }

    fn feed_kept(&self) -> (usize, u64) {
        (0, 0)
    }

    fn watch_inside(&self, filter: Filter, since: Option<u64>) -> Result<Watcher, WatchError> {
        self.watch(filter, since)
    }
}

#[async_trait::async_trait]
impl Store for ExecStore {
    fn backend(&self) -> &'static str {
        self.local.backend()
    }

    fn durability(&self) -> &'static str {
        self.local.durability()
    }

    fn now(&self) -> Millis {
        self.local.now()
    }

    fn wall_ms(&self) -> Millis {
        self.local.wall_ms()
    }

    fn commit_stats(&self) -> CommitStats {
        self.local.commit_stats()
    }

    /// The daemon's store is the simulation's to close.
    async fn shutdown(&self) {}

    /// The runs, then the reports, at the daemon that schedules (as its handler would).
    async fn finish_runs(
        &self,
        ends: Vec<(TaskEnd, Option<Run>)>,
    ) -> Result<Vec<Result<TaskInfo, SchedError>>, StoreError> {
        let _call = self.calls.begin().await;
        let store = self.scheduling();
        let answer = <RedisStore as Store>::finish_runs(&store, ends).await;
        self.calls.answered(answer).await
    }
}
