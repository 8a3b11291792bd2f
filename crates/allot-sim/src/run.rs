//! One run of a plan: the real embedded store (stepped, on a [`SimDisk`]) under the real server's
//! handlers, called by simulated clients, every step chosen by the plan; what the clients were
//! told is kept in a [`Model`] and checked against what the daemon holds after every step.
//!
//! Determinism: nothing here reads the machine's clock or a random source; the store reads the
//! [`SimClock`], tokio's timers run on a paused clock moved with it, and every future is polled
//! by hand, in plan order, on one thread. A run's history (every step and every answer, byte for
//! byte) is a function of its plan.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use std::collections::BTreeSet;

use allot_api::{AllocList, App, AppList, Task, TaskList};
use allot_core::clock::TimeSource as _;
use allot_core::pools::{LeaseRules, PoolName};
use allot_core::watch::Filter;
use allot_exec::{Executor, ExecutorConfig, Registry, Secrets, SetupContext, Waker as ExecWaker};
use allot_server::{Api, ServerState};
use allot_store::embedded::Step as StoreStep;
use allot_store::ids::SeededIds;
use allot_store::prelude::*;
use allot_store::{Durability, EmbeddedConfig, EmbeddedStore};
use allot_store::{WatchError, Watcher};
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use bytes::Bytes;
use tower::Service as _;

use crate::apps;
use crate::check::{parse, Model, Overlap, Target, Violation};
use crate::clock::SimClock;
use crate::disk::SimDisk;
use crate::plan::{Call, Shape, Step, Work};
use crate::plugin::SharedJournal;
use crate::queue::QueueOrder;
use crate::tenancy;

/// An answer: its status and body.
type Answer = (StatusCode, Bytes);
type Calling = Pin<Box<dyn Future<Output = Answer> + Send>>;

/// How many times the executor's turn gives way to the process's tasks: enough for every run
/// ready to take its next step.
const EXECUTE_YIELDS: usize = 20;

/// What a run did, and the first invariant it broke.
#[derive(Debug)]
pub struct Outcome {
    /// Every step and what came of it, one line each.
    pub history: Vec<String>,
    pub failure: Option<Failure>,
}

/// An invariant broken at a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The step's index in the plan (the plan's length: after the last step, while draining).
    pub step: usize,
    pub violation: Violation,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "at step {}: {}", self.step, self.violation)
    }
}

/// The durability a seed runs at: even seeds `disk`, odd ones `process`.
pub fn durability_of(seed: u64) -> Durability {
    if seed.is_multiple_of(2) {
        Durability::Disk
    } else {
        Durability::Process
    }
}

/// Runs `steps` as `seed`'s run (at its durability, the store's random ids drawn from it), then
/// lets every call still in flight end (no more faults, time moving on) and checks everything
/// once more.
///
/// A panic anywhere (a debug assertion of the store, say) is a failure of the step it happened in.
pub fn run(seed: u64, steps: &[Step], shape: Shape) -> Outcome {
    let history = Arc::new(std::sync::Mutex::new(Vec::new()));
    let played = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut sim = Sim::start(seed, shape, history.clone());
        sim.play(steps)
    }));
    let history = std::mem::take(&mut *history.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
    let failure = played.unwrap_or_else(|panic| {
        let step = history.iter().filter(|line| !line.starts_with("drain")).count();
        Some(Failure { step, violation: panicked(panic.as_ref()) })
    });
    Outcome { history, failure }
}

/// A panic, as the violation of the step it happened in.
pub(crate) fn panicked(panic: &(dyn std::any::Any + Send)) -> Violation {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_owned());
    Violation::new(format!("panicked: {message}"))
}

/// A daemon: the store and the API over it, in a process of its own: a single-threaded tokio
/// runtime whose clock is paused (moved only with the [`SimClock`]). A crash drops the process,
/// and every task it spawned with it.
struct Daemon {
    store: Arc<EmbeddedStore>,
    api: Api,
    /// What the daemon's executor's plugin saw in this life of the daemon.
    journal: SharedJournal,
    /// Kept (never sent) so that the executor runs until the process is dropped.
    _stop_executor: tokio::sync::watch::Sender<bool>,
    process: tokio::runtime::Runtime,
}

impl Daemon {
    /// Runs `work` inside the process (polling a future that reads tokio's time needs it).
    fn within<T>(&self, work: impl FnOnce() -> T) -> T {
        let _entered = self.process.enter();
        work()
    }

    /// The daemon is killed: everything it holds is dropped inside its process, then the process.
    fn kill(self) {
        let Daemon { store, api, process, .. } = self;
        {
            let _entered = process.enter();
            drop(api);
            drop(store);
        }
        drop(process);
    }
}

/// A call in flight.
struct InFlight {
    client: u8,
    call: Call,
    target: Target,
    /// What may run beside it.
    overlap: Overlap,
    /// The simulation's time when it was sent.
    sent_at: u64,
    answer: Calling,
    /// The network broke: its answer will not reach the client.
    lost: bool,
}

struct Sim {
    shape: Shape,
    seed: u64,
    /// How many times the daemon started.
    starts: u64,
    durability: Durability,
    clock: SimClock,
    disk: SimDisk,
    /// The kept events' files (real files: the feed's archive is not simulated).
    events: tempfile::TempDir,
    /// The executor's task directories (real files, as the events').
    tasks: tempfile::TempDir,
    daemon: Option<Daemon>,
    /// A watcher of every event, resumed after each start from the last revision it was given.
    watcher: Option<Watcher>,
    /// The last revision the watcher was given.
    watched: u64,
    calls: Vec<InFlight>,
    /// The clients cut off from the daemon by a partition.
    partitioned: BTreeSet<u8>,
    model: Model,
    /// The waiting queues as last read, to check the next reading against.
    queues: QueueOrder,
    /// Shared with [`run`], which reads it even after a panic.
    history: Arc<std::sync::Mutex<Vec<String>>>,
}

fn poll_once(answer: &mut Calling) -> Poll<Answer> {
    answer.as_mut().poll(&mut Context::from_waker(Waker::noop()))
}

impl Sim {
    fn start(seed: u64, shape: Shape, history: Arc<std::sync::Mutex<Vec<String>>>) -> Sim {
        Sim {
            shape,
            seed,
            starts: 0,
            durability: durability_of(seed),
            clock: SimClock::new(),
            disk: SimDisk::new(),
            events: tempfile::tempdir().expect("a temporary directory"),
            tasks: tempfile::tempdir().expect("a temporary directory"),
            daemon: None,
            watcher: None,
            watched: 0,
            calls: Vec::new(),
            partitioned: BTreeSet::new(),
            model: Model::new(shape),
            queues: QueueOrder::new(shape.namespaces),
            history,
        }
    }

    fn open(&mut self) -> Result<(), String> {
        let disk = self.disk.clone();
        // Each start draws its own ids, from the seed and how many starts came before.
        self.starts += 1;
        let starts = self.starts;
        let config = EmbeddedConfig::new(self.events.path())
            .with_durability(self.durability)
            .with_time(Arc::new(self.clock.clone()))
            .with_ids(Arc::new(SeededIds::new(self.seed.wrapping_mul(1_000_003).wrapping_add(starts))));
        let store = EmbeddedStore::open_stepped(move || disk.database(), self.disk.log(), &config)
            .map_err(|err| format!("the store does not open again: {err}"))?;
        // Leases short enough to lapse, and be reclaimed, within a run.
        store.set_pool_rules(LeaseRules {
            initial_ms: 10_000,
            max_ms: 30_000,
            reclaim_after_ms: 5_000,
            retention_ms: 60_000,
        });
        let store = Arc::new(store);
        let process = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a single-threaded runtime builds");
        let api = {
            let _entered = process.enter();
            allot_server::api(ServerState::new(store.clone()).with_access(tenancy::access()))
        };
        let journal = crate::plugin::journal(self.disk.clone());
        let stop_executor = self.start_executor(&process, store.clone(), journal.clone());
        let since = (self.watched > 0).then_some(self.watched);
        let watcher = match store.watch(Filter::default(), since) {
            // What the watcher missed is no longer kept: it lists again, and watches from now.
            Err(WatchError::Compacted { .. }) => store.watch(Filter::default(), None),
            other => other,
        };
        self.watcher = Some(watcher.map_err(|err| format!("the watcher cannot resume: {err}"))?);
        self.daemon = Some(Daemon { store, api, journal, _stop_executor: stop_executor, process });
        Ok(())
    }

    /// Starts the daemon's executor in `process`, running both pools' tasks with the simulation's
    /// plugin (writing to `journal`): it takes its lease, lists what is placed, then follows the
    /// change feed. Returns what would stop it, kept while the daemon lives: it is never sent, the
    /// process being dropped with the executor when the daemon is killed.
    fn start_executor(
        &self,
        process: &tokio::runtime::Runtime,
        store: Arc<EmbeddedStore>,
        journal: SharedJournal,
    ) -> tokio::sync::watch::Sender<bool> {
        let store: Arc<dyn Store> = store;
        let setup = |id: &str| SetupContext::new(id, store.clone(), Secrets::default(), ExecWaker::new(|_| {}));
        let entries = vec![crate::plugin::entry(journal)];
        let registry = process.block_on(Registry::load(entries, &Default::default(), setup)).expect("the plugin loads");
        let pools = (0..self.shape.pools).map(|pool| PoolName::new(&Model::pool(pool)).expect("a pool's name"));
        let mut config = ExecutorConfig::new(pools.collect(), self.tasks.path().to_owned());
        config.node = "sim".to_owned();
        config.clock = Arc::new(self.clock.clone());
        let executor = Executor::new(store, Arc::new(registry), config);
        let (stop, stopped) = tokio::sync::watch::channel(false);
        process.spawn(executor.run(stopped));
        stop
    }

    fn record(&self, line: String) {
        self.history.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(line);
    }

    fn daemon(&self) -> &Daemon {
        self.daemon.as_ref().expect("the daemon runs between steps")
    }

    /// A call with `token`.
    fn send(&self, token: &str, method: Method, path: String, body: Option<serde_json::Value>) -> Calling {
        let mut api = self.daemon().api.clone();
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header(axum::http::header::CONTENT_TYPE, "application/json")
            .header(axum::http::header::AUTHORIZATION, format!("Bearer {token}"))
            .body(body.map_or_else(Body::empty, |json| Body::from(json.to_string())))
            .expect("a valid request");
        Box::pin(async move {
            let response = api.call(request).await.unwrap_or_else(|never| match never {});
            let status = response.status();
            let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap_or_default();
            (status, bytes)
        })
    }

    /// A call the simulation makes for itself (setting up, observing), answered at once or never.
    fn ask(&mut self, method: Method, path: String, body: Option<serde_json::Value>) -> Answer {
        self.ask_as(tenancy::ADMIN_TOKEN, method, path, body)
    }

    /// [`Sim::ask`], with `token`.
    fn ask_as(&mut self, token: &str, method: Method, path: String, body: Option<serde_json::Value>) -> Answer {
        let mut answer = self.send(token, method, path, body);
        match self.poll(&mut answer) {
            Poll::Ready(answer) => answer,
            Poll::Pending => {
                // A change at the disk level waits for a sync.
                self.work(Work::Sync);
                match self.poll(&mut answer) {
                    Poll::Ready(answer) => answer,
                    Poll::Pending => (StatusCode::REQUEST_TIMEOUT, Bytes::from_static(b"no answer")),
                }
            }
        }
    }

    /// The executor's turn: every task of the daemon's process runs until it waits.
    fn execute(&self) {
        self.daemon().process.block_on(async {
            for _ in 0..EXECUTE_YIELDS {
                tokio::task::yield_now().await;
            }
        });
    }

    /// Polls call `index` in flight once, inside the daemon's process.
    fn poll_call(&mut self, index: usize) -> Poll<Answer> {
        let Sim { daemon, calls, .. } = self;
        let daemon = daemon.as_ref().expect("the daemon runs between steps");
        daemon.within(|| poll_once(&mut calls[index].answer))
    }

    /// Polls `answer` once, inside the daemon's process.
    fn poll(&self, answer: &mut Calling) -> Poll<Answer> {
        self.daemon().within(|| poll_once(answer))
    }

    /// Time passes by `ms`: the simulation's clock, and the daemon's timers with it.
    fn advance(&self, ms: u64) {
        self.clock.advance(ms);
        self.daemon().process.block_on(tokio::time::advance(Duration::from_millis(ms)));
    }

    fn play(&mut self, steps: &[Step]) -> Option<Failure> {
        if let Err(err) = self.open() {
            return Some(Failure { step: 0, violation: Violation::new(err) });
        }
        for ns in 0..self.shape.namespaces {
            let body = serde_json::json!({ "quota": self.shape.quota });
            let (status, _) = self.ask(Method::PUT, format!("/v1/namespaces/{}", Model::namespace(ns)), Some(body));
            assert!(status.is_success(), "the namespaces are made ({status})");
        }
        let seats = serde_json::json!({ "quota": crate::plugin::SEATS_QUOTA });
        let (status, _) =
            self.ask(Method::PUT, format!("/v1/namespaces/{}", crate::plugin::SEATS_NAMESPACE), Some(seats));
        assert!(status.is_success(), "the plugin's namespace is made ({status})");
        for pool in 0..self.shape.pools {
            let body = serde_json::json!({ "capacity": format!("cpu={}", self.shape.cpus) });
            let (status, _) = self.ask(Method::PUT, format!("/v1/pools/{}", Model::pool(pool)), Some(body));
            assert!(status.is_success(), "the pools are made ({status})");
        }
        // Tasks of a higher priority preempt those of a lower one at once.
        let queue = serde_json::json!({ "preemption_delay_ms": 0 });
        let (status, _) = self.ask(Method::PUT, "/v1/queues/root.sim".to_owned(), Some(queue));
        assert!(status.is_success(), "the queue is made ({status})");
        for (index, step) in steps.iter().enumerate() {
            self.model.wall_reading(self.clock.wall_ms());
            let line = match self.step(*step) {
                Ok(line) => line,
                Err(violation) => return Some(Failure { step: index, violation }),
            };
            self.record(format!("{index} {step:?}: {line}"));
            if let Err(violation) = self.check() {
                return Some(Failure { step: index, violation });
            }
        }
        let end = steps.len();
        if let Err(violation) = self.drain() {
            return Some(Failure { step: end, violation });
        }
        if let Err(violation) = self.end_apps() {
            return Some(Failure { step: end, violation });
        }
        if let Err(violation) = self.seats_given_back() {
            return Some(Failure { step: end, violation });
        }
        // Many calls ended since the last reading: the queues' order is not compared across them.
        self.queues.forget();
        self.check().err().map(|violation| Failure { step: end, violation })
    }

    fn step(&mut self, step: Step) -> Result<String, Violation> {
        Ok(match step {
            Step::Send { client, call } => {
                let client = client % self.shape.clients;
                if self.calls.iter().any(|c| c.client == client && !c.lost) {
                    return Ok("busy".into());
                }
                let Some(target) = self.model.target(client, call) else { return Ok("nothing to call on".into()) };
                if self.partitioned.contains(&client) {
                    // Lost on the way: it never runs, and the client cannot tell.
                    let overlap = self.model.sent(call, &target, self.clock.now());
                    self.model.lost(call, &target);
                    self.model.ended(call, &target, &overlap, self.clock.now());
                    return Ok("lost on the way (partitioned)".into());
                }
                let (method, path, body) = self.model.request(call, &target);
                let answer = self.send(&tenancy::token(client), method, path, body);
                let overlap = self.model.sent(call, &target, self.clock.now());
                let sent_at = self.clock.now();
                self.calls.push(InFlight { client, call, target, overlap, sent_at, answer, lost: false });
                "sent".into()
            }
            Step::Poll { pick } => {
                if self.calls.is_empty() {
                    return Ok("idle".into());
                }
                let index = usize::from(pick) % self.calls.len();
                match self.poll_call(index) {
                    Poll::Pending => "pending".into(),
                    Poll::Ready(answer) => self.answered(index, answer)?,
                }
            }
            Step::Cut { pick, abandon } => {
                if self.calls.is_empty() {
                    return Ok("idle".into());
                }
                let index = usize::from(pick) % self.calls.len();
                let call = &mut self.calls[index];
                call.lost = true;
                self.model.lost(call.call, &call.target);
                if abandon {
                    let call = self.calls.remove(index);
                    self.model.ended(call.call, &call.target, &call.overlap, self.clock.now());
                    return Ok("abandoned".into());
                }
                "lost".into()
            }
            Step::Partition { client } => {
                let client = client % self.shape.clients;
                self.partitioned.insert(client);
                let mut cut = 0;
                for call in self.calls.iter_mut().filter(|call| call.client == client && !call.lost) {
                    call.lost = true;
                    self.model.lost(call.call, &call.target);
                    cut += 1;
                }
                format!("cut off, {cut} answers to come lost")
            }
            Step::Heal { client } => {
                let client = client % self.shape.clients;
                if self.partitioned.remove(&client) {
                    "connected again".into()
                } else {
                    "connected".into()
                }
            }
            Step::Work(work) => self.work(work),
            Step::Advance { ms } => {
                self.advance(u64::from(ms));
                format!("now {}", self.clock.now())
            }
            Step::WallJump { ms } => {
                self.clock.jump_wall(i64::from(ms));
                "jumped".into()
            }
            Step::Fail(fault) => {
                self.disk.fail_next(fault);
                "armed".into()
            }
            Step::Crash { power, torn } => {
                for call in std::mem::take(&mut self.calls) {
                    self.model.lost(call.call, &call.target);
                    self.model.ended(call.call, &call.target, &call.overlap, self.clock.now());
                }
                // Killed: nothing the dying process does (its destructors) reaches the disk.
                self.disk.kill();
                self.queues.forget();
                self.watcher = None;
                if let Some(daemon) = self.daemon.take() {
                    daemon.kill();
                }
                if power && self.durability == Durability::Disk {
                    self.disk.power_loss(u32::from(torn));
                } else {
                    self.disk.crash();
                }
                self.open().map_err(Violation::new)?;
                "restarted".into()
            }
        })
    }

    fn work(&mut self, work: Work) -> String {
        let step = match work {
            Work::Sync => StoreStep::Sync,
            Work::Checkpoint => StoreStep::Checkpoint,
            Work::Sweep => StoreStep::Sweep,
            Work::Schedule => StoreStep::Schedule,
            Work::Execute => {
                self.execute();
                let rounds = crate::plugin::lock(&self.daemon().journal).rounds;
                return format!("{rounds} rounds in this life");
            }
        };
        match self.daemon().store.step(step) {
            Ok(()) => "done".into(),
            Err(err) => format!("failed: {err}"),
        }
    }

    /// Call `index` answered: its client learns the answer, unless the network lost it.
    fn answered(&mut self, index: usize, (status, body): Answer) -> Result<String, Violation> {
        let call = self.calls.remove(index);
        let text = String::from_utf8_lossy(&body).into_owned();
        self.model.ended(call.call, &call.target, &call.overlap, self.clock.now());
        if call.lost {
            return Ok(format!("{} (lost) {text}", status.as_u16()));
        }
        let times = (call.sent_at, self.clock.now());
        self.model.learn(call.client, call.call, &call.target, times, call.overlap, status, &body)?;
        Ok(format!("{} {text}", status.as_u16()))
    }

    /// After the plan: no more faults; the daemon works and time moves on until every call has
    /// its answer (a call that waits for room gets it or is told it timed out).
    fn drain(&mut self) -> Result<(), Violation> {
        self.disk.crash();
        self.partitioned.clear();
        for _ in 0..200 {
            if self.calls.is_empty() {
                return Ok(());
            }
            for work in [Work::Sync, Work::Sweep, Work::Checkpoint, Work::Execute, Work::Sync] {
                self.work(work);
            }
            let mut index = 0;
            while index < self.calls.len() {
                match self.poll_call(index) {
                    Poll::Ready(answer) => {
                        let line = self.answered(index, answer)?;
                        self.record(format!("drain: {line}"));
                    }
                    Poll::Pending => index += 1,
                }
            }
            self.advance(100);
        }
        Err(Violation::new(format!("{} calls never answered after the plan, 20 s on", self.calls.len())))
    }

    /// Once every application has ended, the seats the plugin took are all given back (within a
    /// simulated minute, the executor working: a run sees its task ended at its next reading):
    /// every attempt that took one released it, whatever its end.
    fn seats_given_back(&mut self) -> Result<(), Violation> {
        let name = crate::plugin::SEATS_NAMESPACE;
        let mut still = String::new();
        for _ in 0..60 {
            let (_, grants) = self.ask(Method::GET, format!("/v1/namespaces/{name}/grants?limit=1000"), None);
            let (_, waiters) = self.ask(Method::GET, format!("/v1/namespaces/{name}/waiters?limit=1000"), None);
            let grants: allot_api::GrantList = parse(&grants)?;
            let waiters: allot_api::WaiterList = parse(&waiters)?;
            let held: Vec<&str> = grants.grants.iter().map(|g| g.token.as_str()).collect();
            let waiting: Vec<&str> = waiters.waiters.iter().map(|w| w.token.as_str()).collect();
            if held.is_empty() && waiting.is_empty() {
                return Ok(());
            }
            still = format!("held by {held:?} and waited for by {waiting:?}");
            // The run of the first seat held, as the daemon keeps it: why it did not give it back.
            if let Some((app, task)) = held.first().and_then(|token| token.split_once(':')) {
                let task = task.split_once(':').map_or(task, |(task, _)| task);
                let (_, run) = self.ask(Method::GET, format!("/v1/apps/{app}/tasks/{task}/run"), None);
                still.push_str(&format!("; the run of the first: {}", String::from_utf8_lossy(&run)));
            }
            for work in [Work::Execute, Work::Sync, Work::Execute] {
                self.work(work);
            }
            self.advance(1_000);
        }
        Err(Violation::new(format!("every application ended, yet a minute on the plugin's seats are {still}")))
    }

    /// Takes every event ready for the watcher: each after the one before, none twice.
    fn watch(&mut self) -> Result<(), Violation> {
        let Some(watcher) = self.watcher.as_mut() else { return Ok(()) };
        loop {
            let next = {
                let _entered = self.daemon.as_ref().expect("the daemon runs between steps").process.enter();
                let mut next = std::pin::pin!(watcher.next());
                next.as_mut().poll(&mut Context::from_waker(Waker::noop()))
            };
            match next {
                Poll::Pending => return Ok(()),
                Poll::Ready(Ok(event)) => {
                    if event.revision <= self.watched {
                        return Err(Violation::new(format!(
                            "the watcher was given revision {} ({:?} {}) after revision {}",
                            event.revision, event.kind, event.key, self.watched
                        )));
                    }
                    self.watched = event.revision;
                    self.model.published(&event);
                }
                Poll::Ready(Err(WatchError::Behind { .. })) => {
                    let store = &self.daemon().store;
                    self.watcher =
                        Some(store.watch(Filter::default(), Some(self.watched)).map_err(|err| {
                            Violation::new(format!("the watcher fell behind and cannot resume: {err}"))
                        })?);
                    return Ok(());
                }
                Poll::Ready(Err(err)) => return Err(Violation::new(format!("the watcher ended: {err}"))),
            }
        }
    }

    /// Checks what the daemon holds against what its clients were told.
    fn check(&mut self) -> Result<(), Violation> {
        self.model.wall_reading(self.clock.wall_ms());
        self.watch()?;
        crate::plugin::violations(&self.daemon().journal)?;
        let revision = self.daemon().store.revision();
        self.model.revision(revision)?;
        for ns in 0..self.shape.namespaces {
            let name = Model::namespace(ns);
            let Some(body) = self.list(format!("/v1/namespaces/{name}/grants?limit=1000"))? else {
                self.queues.forget_namespace(ns);
                continue;
            };
            let grants = parse(&body)?;
            self.model.grants_hold(ns, &grants, self.clock.now())?;
            let (status, waiters) = self.ask(Method::GET, format!("/v1/namespaces/{name}/waiters?limit=1000"), None);
            if status != StatusCode::OK {
                self.queues.forget_namespace(ns);
                continue;
            }
            let waiters = parse(&waiters)?;
            self.model.waiters_wait_rightly(ns, &grants, &waiters)?;
            self.queues.served_in_order(ns, &grants, &waiters)?;
        }
        if let Some(body) = self.list("/v1/sessions?limit=1000".to_owned())? {
            self.model.sessions_hold(&body, self.clock.now())?;
        }
        let mut live = Some(BTreeSet::new());
        for pool in 0..self.shape.pools {
            let name = Model::pool(pool);
            let Some(body) = self.list(format!("/v1/pools/{name}/allocs?limit=1000"))? else {
                live = None;
                continue;
            };
            self.model.allocs_hold(pool, &body, self.clock.now())?;
            if let (Some(live), Ok(list)) = (live.as_mut(), serde_json::from_slice::<AllocList>(&body)) {
                live.extend(list.allocs.into_iter().filter(|alloc| alloc.ended.is_none()).map(|alloc| alloc.uri));
            }
        }
        match self.apps() {
            Some(apps) => {
                self.model.apps_hold(&apps)?;
                apps::placed_rightly(&apps, live.as_ref())?;
                apps::placed_where_allowed(&apps)
            }
            None => Ok(()),
        }
    }

    /// A listing's body; `None` while the store rebuilds after a failed write (nothing to read
    /// until it has); any other answer than 200 breaks the rule that a read of what exists works.
    fn list(&mut self, path: String) -> Result<Option<Bytes>, Violation> {
        let (status, body) = self.ask(Method::GET, path.clone(), None);
        match status {
            StatusCode::OK => Ok(Some(body)),
            StatusCode::SERVICE_UNAVAILABLE => Ok(None),
            _ => Err(Violation::new(format!("GET {path} answered {status}: {}", String::from_utf8_lossy(&body)))),
        }
    }

    /// Every application and its tasks, or `None` while the store cannot be read.
    fn apps(&mut self) -> Option<Vec<(App, Vec<Task>)>> {
        let (status, body) = self.ask(Method::GET, "/v1/apps?limit=1000".to_owned(), None);
        let list: AppList = serde_json::from_slice(&body).ok().filter(|_| status == StatusCode::OK)?;
        let mut apps = Vec::new();
        for app in list.apps {
            let (status, body) = self.ask(Method::GET, format!("/v1/apps/{}/tasks?limit=1000", app.id), None);
            let tasks: TaskList = serde_json::from_slice(&body).ok().filter(|_| status == StatusCode::OK)?;
            apps.push((app, tasks.tasks));
        }
        Some(apps)
    }

    /// A call made now and waited for (syncing as the disk level needs), its answer learned.
    fn call_now(&mut self, client: u8, call: Call) -> Result<(), Violation> {
        let Some(target) = self.model.target(client, call) else { return Ok(()) };
        let (method, path, body) = self.model.request(call, &target);
        let sent_at = self.clock.now();
        let overlap = self.model.sent(call, &target, sent_at);
        let (status, body) = self.ask_as(&tenancy::token(client), method, path, body);
        self.model.ended(call, &target, &overlap, self.clock.now());
        self.model.learn(client, call, &target, (sent_at, self.clock.now()), overlap, status, &body)?;
        let text = String::from_utf8_lossy(&body);
        self.record(format!("end: {call:?}: {} {text}", status.as_u16()));
        Ok(())
    }

    /// After the plan and its calls: the clients give back what they hold, and the tasks placed
    /// are started and completed, while the scheduler cycles and time moves on, until every
    /// application has ended (as every application must, once its tasks do).
    fn end_apps(&mut self) -> Result<(), Violation> {
        for (client, call) in self.model.everything_held() {
            self.call_now(client, call)?;
        }
        for _ in 0..120 {
            self.work(Work::Schedule);
            self.work(Work::Sync);
            let Some(apps) = self.apps() else {
                return Err(Violation::new("the store cannot be read after the plan"));
            };
            let live: Vec<_> = apps.into_iter().filter(|(app, _)| !apps::ended(&app.state)).collect();
            if live.is_empty() {
                return Ok(());
            }
            for (app, tasks) in &live {
                for task in tasks {
                    let report = match task.state.as_str() {
                        "Allocated" => "start",
                        "Running" => "complete",
                        _ => continue,
                    };
                    let path = format!("/v1/apps/{}/tasks/{}/{report}", app.id, task.id);
                    let (status, body) = self.ask(Method::POST, path, None);
                    let text = String::from_utf8_lossy(&body);
                    self.record(format!("end: {report} {}/{}: {} {text}", app.id, task.id, status.as_u16()));
                }
            }
            for work in [Work::Sync, Work::Execute, Work::Sync, Work::Sweep, Work::Checkpoint] {
                self.work(work);
            }
            self.advance(1_000);
        }
        let apps = self.apps().unwrap_or_default();
        let live: Vec<String> = apps
            .iter()
            .filter(|(app, _)| !apps::ended(&app.state))
            .map(|(app, tasks)| {
                let tasks: Vec<String> = tasks.iter().map(|t| format!("{} {}", t.id, t.state)).collect();
                format!("{} {} [{}] waiting: {:?}", app.id, app.state, tasks.join(", "), app.waiting)
            })
            .collect();
        Err(Violation::new(format!("applications that never ended, 2 minutes on: {}", live.join("; "))))
    }
}
