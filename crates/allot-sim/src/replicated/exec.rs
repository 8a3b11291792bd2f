//! The executor of the Redis-shaped run: the real `Executor` of the first daemon, running the
//! applications' tasks of its pool (`sim-xpool`) with the simulation's plugin (`plugin.rs`, no
//! seats), in a process of its own: a single-threaded tokio runtime whose clock is paused and
//! moved only with the simulation's. Its daemon's restart or failover kills it mid-step (the
//! runtime dropped with every task of it) and starts another, which resumes the runs from what
//! Redis kept.
//!
//! It runs in turns (after the time moves, with its lease's renewal before each scheduling turn,
//! and when the plan says) until it has nothing left to do: its runtime about to park (no task
//! ready: the `on_thread_park` hook tells) with no call of its store in flight and none started
//! since the last time it was about to park ([`settle`]). Its calls are made one at a time, each
//! answer handed back once the runtime is otherwise idle (`exec_store.rs`), so a turn runs the
//! same way from run to run; Redis's answers come through the simulation's own runtime, which
//! runs meanwhile on its thread.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use allot_core::pools::PoolName;
use allot_exec::{Executor, ExecutorConfig, Registry, Secrets, SetupContext, Waker as ExecWaker};
use allot_store::prelude::*;
use allot_store_redis::RedisStore;
use rand::rngs::StdRng;
use rand::Rng;

use super::exec_store::{Calls, Daemons, ExecStore, Idle};
use super::Step;
use crate::check::Violation;
use crate::clock::SimClock;
use crate::plan::Report;
use crate::plugin::SharedJournal;

/// The executor's pool and its CPUs; its labels are what its tasks select.
pub(super) const EXEC_POOL: &str = "sim-xpool";
pub(super) const EXEC_CAPACITY: u64 = 4;

/// What the executor's tasks select: its pool alone.
pub(super) fn exec_only() -> serde_json::Value {
    serde_json::json!({ "for": "exec" })
}

/// How long a turn may take before the run is called broken (an executor that never rests).
const SETTLE_WITHIN: Duration = Duration::from_secs(60);

/// How long a gang of the executor's waits to be reserved before its tasks are scheduled one by
/// one (as the other applications' gangs, `apps.rs`).
const RESERVE_TIMEOUT_MS: u64 = 5_000;

/// The applications each client submits to the executor at most.
pub(super) const RUNS_PER_CLIENT: u8 = 3;

/// One step of the executor's part: a submission of tasks it runs, a turn of it, or a client's
/// report of one of its tasks (as a runner of its own would, or an operator).
pub(super) fn draw_step(rng: &mut StdRng) -> Step {
    match rng.gen_range(0..12) {
        0..4 => Step::SubmitRun {
            client: rng.gen_range(0..super::CLIENTS),
            app: rng.gen_range(0..RUNS_PER_CLIENT),
            tasks: rng.gen_range(1..=3),
            run: rng.gen(),
            gang: rng.gen_bool(0.3),
        },
        10..11 => Step::ReportRun {
            client: rng.gen_range(0..super::CLIENTS),
            app: rng.gen(),
            task: rng.gen(),
            report: if rng.gen_bool(0.5) { Report::Complete } else { Report::Fail },
        },
        _ => Step::Execute,
    }
}

/// The id of a client's application of the executor.
pub(super) fn run_app_id(client: u8, app: u8) -> String {
    format!("x{client}-{}", app % RUNS_PER_CLIENT)
}

/// The executor's process.
pub(super) struct ExecProcess {
    runtime: Arc<tokio::runtime::Runtime>,
    idle: Arc<Idle>,
    calls: Arc<Calls>,
    executor: Arc<Executor>,
    /// What its plugin saw in this life.
    pub(super) journal: SharedJournal,
    /// Kept (never sent): the executor runs until its process is killed.
    _stop: tokio::sync::watch::Sender<bool>,
}

impl ExecProcess {
    /// Starts the executor of the daemon whose store is `local` (the others' among `daemons`),
    /// its clock `clock`, its tasks' directories under `dir`. It does nothing before its first
    /// turn.
    pub(super) async fn start(local: Arc<RedisStore>, daemons: Daemons, clock: &SimClock, dir: &Path) -> ExecProcess {
        let idle = Arc::new(Idle::default());
        let hook = idle.clone();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .on_thread_park(move || hook.about_to_park())
            .build()
            .expect("the executor's runtime builds");
        let store = Arc::new(ExecStore::new(local, daemons, idle.clone()));
        let calls = store.calls.clone();
        let counted = calls.clone();
        let journal = crate::plugin::journal_counting(Box::new(move || counted.failed()));
        let store: Arc<dyn Store> = store;
        let setup = |id: &str| SetupContext::new(id, store.clone(), Secrets::default(), ExecWaker::new(|_| {}));
        let entries = vec![crate::plugin::entry(journal.clone())];
        let registry = Registry::load(entries, &Default::default(), setup).await.expect("the plugin loads");
        let pools: HashSet<PoolName> = [PoolName::new(EXEC_POOL).expect("a pool's name")].into();
        let mut config = ExecutorConfig::new(pools, dir.to_owned());
        config.node = "sim-exec".to_owned();
        config.clock = Arc::new(clock.clone());
        // Redis keeps the lease with `PX`, on its real clock, which the simulation does not move:
        // a lease of seconds would lapse or not as the steps' real time fell. The executor never
        // stops here but with its daemon, which starts another at once.
        config.lease = Duration::from_secs(24 * 3600);
        let executor = Executor::new(store, Arc::new(registry), config);
        let (stop, stopped) = tokio::sync::watch::channel(false);
        runtime.spawn(executor.clone().run(stopped));
        ExecProcess { runtime: Arc::new(runtime), idle, calls, executor, journal, _stop: stop }
    }

    /// The executor's turn: it runs until it has nothing left to do.
    pub(super) async fn turn(&self) -> Result<(), Violation> {
        let (runtime, idle, calls) = (self.runtime.clone(), self.idle.clone(), self.calls.clone());
        // Off the simulation's thread, whose runtime carries the calls to Redis meanwhile.
        let settled = tokio::task::spawn_blocking(move || runtime.block_on(settle(&idle, &calls))).await;
        settled.unwrap_or_else(|panic| Err(Violation::new(format!("the executor's turn panicked: {panic}"))))
    }

    /// Its lease renewed, in a turn. While the link is cut at one replica required, the renewal
    /// is applied on the primary and answered unreplicated after `WAIT`'s second.
    async fn renew_lease(&self) -> Result<(), Violation> {
        let executor = self.executor.clone();
        self.runtime.spawn(async move { drop(executor.take_lease().await) });
        self.turn().await
    }

    /// Its time moves on by `ms` (its timers due fire at its next turn).
    pub(super) async fn advance(&self, ms: u64) {
        let runtime = self.runtime.clone();
        let advanced = move || runtime.block_on(tokio::time::advance(Duration::from_millis(ms)));
        tokio::task::spawn_blocking(advanced).await.expect("the executor's clock moves");
    }

    /// Wakes its list of the tasks placed on its pool, as a wake of a run it does not drive does.
    fn list_now(&self) {
        let nobody = allot_exec::RunKey {
            app: allot_core::apps::AppId::new("sim-nobody").expect("an application's id"),
            task: allot_core::apps::TaskId::new("t").expect("a task's id"),
        };
        self.executor.wake(&nobody);
    }

    /// Store calls made so far in this life.
    pub(super) fn calls(&self) -> u64 {
        self.calls.started()
    }

    /// Killed: every task of it dropped where it stands, as by `kill -9`.
    pub(super) async fn kill(self) {
        let ExecProcess { runtime, .. } = self;
        // A runtime is dropped off the async threads.
        tokio::task::spawn_blocking(move || drop(runtime)).await.expect("the executor's runtime drops");
    }
}

/// Runs until the executor's runtime is about to park twice in a row with no call in flight and
/// none started since the look before.
async fn settle(idle: &Idle, calls: &Calls) -> Result<(), Violation> {
    let began = std::time::Instant::now();
    let mut last = calls.started();
    let mut quiet_looks = 0;
    std::future::poll_fn(|cx| {
        let (in_flight, started) = (calls.in_flight(), calls.started());
        quiet_looks = if in_flight == 0 && started == last { quiet_looks + 1 } else { 0 };
        last = started;
        // The first look is at the turn's start; the others each when the runtime is about to park.
        if quiet_looks > 2 {
            return Poll::Ready(Ok(()));
        }
        if began.elapsed() > SETTLE_WITHIN {
            return Poll::Ready(Err(Violation::new(format!(
                "the executor never rested in a turn ({started} calls made, {in_flight} in flight)"
            ))));
        }
        idle.wake_when_about_to_park(cx.waker());
        if in_flight > 0 {
            // Redis answers on the other thread.
            std::thread::yield_now();
        }
        Poll::Pending
    })
    .await
}

impl super::Sim {
    /// The executor's time moves on by `ms` (with the daemons'), then it takes its turn: what the
    /// history says of it. Without time moving, it is woken to list the tasks placed on its pool
    /// first, as the change feed would tell it of them.
    pub(super) async fn execute(&mut self, ms: u64) -> Result<String, Violation> {
        let Some(exec) = &self.exec else { return Ok("no executor".to_owned()) };
        if ms > 0 {
            exec.advance(ms).await;
        } else {
            exec.list_now();
        }
        exec.turn().await?;
        let rounds = crate::plugin::lock(&exec.journal).rounds;
        Ok(format!("the executor: {rounds} rounds, {} calls in this life", exec.calls()))
    }

    /// The executor's lease renewed, as its own task does every second: read by the scheduler's
    /// next turn, which would otherwise take its pool as lost by Redis's real clock (a lease's
    /// expiry), not the simulation's.
    pub(super) async fn renew_executor(&self) -> Result<(), Violation> {
        match &self.exec {
            Some(exec) => exec.renew_lease().await,
            None => Ok(()),
        }
    }

    /// The plugin's journal: what broke its rules in this life of the executor.
    pub(super) fn check_runs(&self) -> Result<(), Violation> {
        self.exec.as_ref().map_or(Ok(()), |exec| crate::plugin::violations(&exec.journal))
    }

    /// A submission of `tasks` tasks of one CPU for the executor, as `run` says.
    pub(super) async fn submit_run(
        &mut self,
        client: u8,
        app: u8,
        tasks: u8,
        run: u8,
        gang: bool,
    ) -> Result<String, Violation> {
        let id = run_app_id(client, app);
        let asks = crate::plan::RunAsks::of(run);
        let spec = serde_json::json!({ "type": "sim", "rounds": asks.rounds, "end": asks.end, "retries": 1 });
        let group = gang.then_some("gang");
        let specs: Vec<_> = (0..tasks)
            .map(|t| {
                serde_json::json!({
                    "id": format!("t{t}"), "resources": "cpu=1", "group": group, "selector": exec_only(), "spec": spec,
                })
            })
            .collect();
        let mut body = serde_json::json!({ "id": id, "queue": "root.sim", "tasks": specs, "priority": asks.priority });
        if gang {
            body["policy"] = serde_json::json!({ "reserve_timeout_ms": RESERVE_TIMEOUT_MS });
            body["task_groups"] = serde_json::json!([{
                "name": "gang", "min_members": tasks, "min_resources": "cpu=1", "selector": exec_only(),
            }]);
        }
        self.submit_body(id, body).await
    }

    /// After the plan: the link heals, and the daemons schedule and the executor runs as time
    /// moves on, until every application of the executor listed has ended (its tasks all ran
    /// to their end, as their specs asked), every invariant checked on the way. A simulated
    /// minute at most.
    pub(super) async fn runs_end(&mut self) -> Result<String, Violation> {
        self.step(Step::Heal).await?;
        let mut running = Vec::new();
        for second in 0..60 {
            self.step(Step::Schedule).await?;
            self.check().await?;
            if let Some(apps) = self.list_apps().await? {
                running = (apps.iter())
                    .filter(|(app, _)| app.id.starts_with('x') && !crate::apps::ended(&app.state))
                    .map(|(app, tasks)| {
                        let states: Vec<String> =
                            tasks.iter().map(|task| format!("{} {}", task.id, task.state)).collect();
                        format!("{} {} ({})", app.id, app.state, states.join(", "))
                    })
                    .collect();
                if running.is_empty() {
                    let tasks = ended_as_asked(&apps, &self.ended_from_outside)?;
                    return Ok(format!(
                        "after the plan: every application of the executor ended within {second} s, its {tasks} tasks each as its spec asked"
                    ));
                }
            }
            self.step(Step::Advance { ms: 1_000 }).await?;
        }
        Err(Violation::new(format!(
            "a minute after the faults stopped, applications of the executor still run: {}",
            running.join("; ")
        )))
    }
}

/// Every task of the executor's applications ended as its spec asked, unless a client ended it
/// from outside (`ended_from_outside`): `ok` completed, `retry` (once retried) and `fail`
/// failed. Faults, restarts and preemptions on the way change how often a task ran, never how it
/// ends. Answers how many tasks were checked.
fn ended_as_asked(
    apps: &[(allot_api::App, Vec<allot_api::Task>)],
    ended_from_outside: &std::collections::BTreeSet<String>,
) -> Result<usize, Violation> {
    let mut ended = 0;
    for (app, tasks) in apps.iter().filter(|(app, _)| app.id.starts_with('x')) {
        for task in tasks {
            if ended_from_outside.contains(&format!("{}/{}", app.id, task.id)) {
                continue;
            }
            ended += 1;
            let asked = task.spec.as_ref().and_then(|spec| spec.get("end")).and_then(|end| end.as_str());
            let expected = if asked == Some("ok") { "Completed" } else { "Failed" };
            if task.state != expected {
                return Err(Violation::new(format!(
                    "{}/{} ended {} ({}), its spec asked it to end {asked:?}",
                    app.id,
                    task.id,
                    task.state,
                    task.reason.as_deref().unwrap_or("no reason given")
                )));
            }
        }
    }
    Ok(ended)
}
