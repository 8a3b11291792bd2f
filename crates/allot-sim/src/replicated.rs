//! The Redis-shaped part under failover: the real Redis store (its function library on real
//! `redis-server` processes, a primary and an asynchronous replica) under the real server's
//! handlers, driven through a seeded plan of grants, releases, keepalives, allocs, sessions,
//! applications scheduled in turns (`apps.rs`), the first daemon's executor running a pool's
//! tasks in turns (`exec.rs`) and time, with the
//! replication link cut and healed and the primary failed over to its replica at random. Two
//! daemons share the primary, as daemons that share the work do: each client's calls go to one
//! of them, the applications' to the one that holds the scheduler's lease; a restart restarts
//! one (the other takes the lease it hands over), a failover both. A waiting call on one daemon
//! is handed its units by a release on the other, through Redis. A
//! failover after a cut loses the primary's last writes, as Redis documents; the checks say what
//! may be lost and what never:
//!
//! - at `--redis-min-replicas 0`, only changes made while the link was cut (acknowledged or not);
//!   at 1, only changes never acknowledged (a change is answered once its replica has it);
//! - never more units granted than the quota, and no refusal while the room was certainly there;
//! - a fencing number never given twice in a namespace, lost writes or not (each one given is
//!   above every one a client was told before);
//! - the change feed's revisions only grow for a watcher that lives through the failover: it is
//!   told to list again, never handed other events under revisions it saw;
//! - a lease lapses when it should, and not before;
//! - a session acknowledged (and not at risk) is listed while its lease certainly runs, and its
//!   grants held with it; one closed never comes back, nor do its grants;
//! - a pool never holds more than its capacity in live allocs; an alloc acknowledged (and not at
//!   risk) is held while its lease certainly runs, and one freed never comes back.
//!
//! Clocks: Redis's decides every lease. The daemon's wall clock jumps back and forth, Redis's
//! steps forward alone, and a promoted primary's clock may be behind the dead one's by less than
//! the failover took (the bound `fresh_floor` in `namespace.lua` relies on): every check above
//! holds through them.
//!
//! At length, as one thing: one model. Grants, sessions and allocs share the link's state (cut, at risk, a
//! failover's losses) that every check reads, as `check.rs` keeps the embedded simulation's.
//!
//! Determinism: Redis's clock is the simulation's (`TestClock`: the functions read the time from
//! a key), and so is the daemon's (`RedisConfig::time`), whose ids are drawn from the seed
//! (`RedisConfig::ids`); the scheduler runs only in the plan's turns; calls run one at a time to their answer, and a cut or a failover first waits until the
//! replica holds everything the primary acknowledged, so what a failover loses is exactly what the
//! plan did while cut. What timing may still move (when the feed copies events into its log) is
//! not recorded in the history; errors are recorded by their code (their messages name ports).

use std::collections::BTreeMap;
use std::future::Future as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_api::{AllocateResponse, Grant, GrantList, ReleaseResponse, Status};
use allot_core::watch::Filter;
use allot_server::{Api, ServerState};
use allot_store::ids::SeededIds;
use allot_store::prelude::*;
use allot_store::{WatchError, Watcher};
use allot_store_redis::testing::{join_election, renew_lease, RedisServer, TestClock};
use allot_store_redis::RedisStore;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tower::ServiceExt as _;

use crate::check::{cpus_of, parse, Violation};
use crate::clock::SimClock;
use crate::plan::Report;
use crate::run::{Failure, Outcome};

mod apps;
mod exec;
mod exec_store;
mod waits;

/// Clients, namespaces, each namespace's quota, tokens per client.
const CLIENTS: u8 = 3;
const NAMESPACES: u8 = 3;
/// The namespaces of plain and session grants; the last one is the waiting allocates' (`waits.rs`).
const PLAIN_NAMESPACES: u8 = 2;
const QUOTA: u64 = 4;
const TOKENS: u8 = 3;
/// The pool the clients take allocs of, and its CPUs.
const POOL: &str = "sim-rpool";
const CAPACITY: u64 = 4;
/// The allocs' leases (short enough to lapse within a run), as the embedded simulation has them.
const POOL_RULES: allot_core::pools::LeaseRules =
    allot_core::pools::LeaseRules { initial_ms: 10_000, max_ms: 30_000, reclaim_after_ms: 5_000, retention_ms: 60_000 };
/// Where the simulation's clock starts (ms): 2026-11-30, as Redis's clock would read.
const START_MS: u64 = 1_795_996_800_000;
/// How long a failover takes at least, on Redis's clock: the primary must be seen dead first
/// (Redis Cluster's `cluster-node-timeout` is 15 s by default, Sentinel's
/// `down-after-milliseconds` 30 s). The promoted primary's fencing numbers are above its
/// predecessors' by a floor taken from its clock, so some time passes in every failover.
const FAILOVER_MS: u64 = 1_000;
/// How many daemons share the primary, as daemons that share the work do: a client's calls go
/// to one of them ([`Sim::daemon_for`]), and a restart restarts one.
const DAEMONS: usize = 2;
/// How long the harness waits for a replica to catch up before it calls the run broken.
const CATCH_UP: Duration = Duration::from_secs(30);

/// A step of a replicated run. As in [`crate::plan`], a step names what it acts on by numbers
/// taken modulo what there is, so any subsequence of a plan is a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// `PUT /v1/namespaces/{ns}/grants/c{client}-t{token}`: `units`, a lease of `ttl_ms`.
    Grant { client: u8, ns: u8, token: u8, units: u8, ttl_ms: u32 },
    /// `DELETE` of that grant.
    Release { client: u8, ns: u8, token: u8 },
    /// `POST .../keepalive` of that grant.
    Keepalive { client: u8, ns: u8, token: u8 },
    /// The simulation's time moves on by `ms` (Redis's with it), and the leases due lapse.
    Advance { ms: u32 },
    /// The replication link is cut: the replica stops (its process paused) once it holds
    /// everything, and the primary drops it.
    Cut,
    /// The replica runs again and catches up.
    Heal,
    /// The primary dies; the replica (paused or not) is promoted, the daemon restarts on it, and a
    /// new replica of it starts. The promoted primary's clock reads `behind_ms` less than the dead
    /// one's would (another host's clock), less than the failover took: the bound within which
    /// fencing numbers are promised never to go back (`fresh_floor` in `namespace.lua`).
    Failover { behind_ms: u16 },
    /// The daemon restarts on the same primary.
    Restart,
    /// `POST /v1/sessions`: a session of `client`, with a lease of `ttl_ms`.
    OpenSession { client: u8, ttl_ms: u32 },
    /// `PUT` of grant `c{client}-t{token}` of `units` in `ns`, in the client's session number
    /// `session` (modulo those it opened).
    SessionGrant { client: u8, ns: u8, token: u8, units: u8, session: u8 },
    /// `POST /v1/sessions/{id}/keepalive` of the client's session number `session`.
    KeepSession { client: u8, session: u8 },
    /// `DELETE /v1/sessions/{id}` of the client's session number `session`: its grants end.
    CloseSession { client: u8, session: u8 },
    /// `POST /v1/pools/sim-rpool/offers/1`: an alloc of `min` to `max` CPUs for `client`.
    Accept { client: u8, min: u8, max: u8 },
    /// `DELETE` of the client's alloc number `alloc` (modulo those it got).
    Free { client: u8, alloc: u8 },
    /// `POST .../keepalive` of the client's alloc number `alloc`, asking for `interval_ms`.
    KeepAlloc { client: u8, alloc: u8, interval_ms: u32 },
    /// `POST /v1/apps`: the client's application number `app` (of four), of `tasks` tasks of
    /// `cpu` CPUs each on the applications' pool, a gang of all of them if `gang`, of priority
    /// `priority` (a task of a higher one preempts one of a lower one: the queue preempts at once).
    Submit { client: u8, app: u8, tasks: u8, cpu: u8, gang: bool, priority: u8 },
    /// The daemon's turn at scheduling: its lease renewed (or taken), then one round
    /// (`testing::schedule_once`), as its own tasks would at that time.
    Schedule,
    /// `PUT` of grant `c{client}-w{token}` of `units` in the waiting allocates' namespace, with
    /// `wait_ms`: a call that must wait goes on in the background (`waits.rs`).
    WaitGrant { client: u8, token: u8, units: u8, wait_ms: u32 },
    /// `DELETE` of that grant: its units go to the waiters in queue order.
    WaitRelease { client: u8, token: u8 },
    /// `POST /v1/apps/{app}/tasks/{task}/{report}` of the client's application number `app`
    /// (modulo those it knows it has) and its task number `task` (modulo its tasks), as the
    /// task's runner would (one that ends a task starts it first).
    Report { client: u8, app: u8, task: u8, report: Report },
    /// The network between the clients and the daemon drops the answer to the next change a
    /// client asks for: the call is made, and its client learns nothing of how it went (as a
    /// `503 store_outcome_unknown`, which it must handle anyway).
    LoseAnswer,
    /// The daemon's wall clock jumps by `ms` (back when negative; an operator, NTP); its
    /// monotonic clock and Redis's do not move. Redis's clock decides every lease.
    WallJump { ms: i32 },
    /// Redis's clock steps forward by `ms` (NTP on its host), the daemon's clocks do not: leases
    /// due by Redis's new time lapse, and the daemon learns the new time from its next call.
    RedisJump { ms: u32 },
    /// `POST /v1/apps`: the client's application number `app` (of three) for the executor (`exec.rs`):
    /// `tasks` tasks of one CPU on its pool, of the simulation's plugin as `run` says
    /// (`RunAsks::of`, without seats), a gang of all of them if `gang`.
    SubmitRun { client: u8, app: u8, tasks: u8, run: u8, gang: bool },
    /// The executor's turn: it runs until it has nothing left to do.
    Execute,
    /// `POST /v1/apps/{app}/tasks/{task}/{report}` of the client's application number `app` for
    /// the executor (modulo those it knows it has) and its task number `task`: the task ended (or
    /// started) from outside while the executor runs it.
    ReportRun { client: u8, app: u8, task: u8, report: Report },
}

/// The plan of `seed`: `steps` steps of grants, time and the link, with the pool's steps, the
/// sessions' and the applications' drawn apart and put between them (about one of each for every
/// four, of the applications one for every three), so that the plans drawn before they joined
/// are still there, step for step.
pub fn draw(seed: u64, steps: usize) -> Vec<Step> {
    let mut pools = StdRng::seed_from_u64(seed ^ 0x706f_6f6c);
    let mut sessions = StdRng::seed_from_u64(seed ^ 0x7365_7373);
    let mut apps = StdRng::seed_from_u64(seed ^ 0x6170_7073);
    let mut waits = StdRng::seed_from_u64(seed ^ 0x7761_6974);
    let mut losses = StdRng::seed_from_u64(seed ^ 0x6c6f_7374);
    let mut clocks = StdRng::seed_from_u64(seed ^ 0x636c_636b);
    let mut execs = StdRng::seed_from_u64(seed ^ 0x6578_6563);
    let mut plan = Vec::with_capacity(steps * 2);
    for mut step in draw_quotas(seed, steps) {
        if losses.gen_range(0..12) == 0 {
            plan.push(Step::LoseAnswer);
        }
        match clocks.gen_range(0..30) {
            0 => plan.push(Step::WallJump { ms: clocks.gen_range(-3_600_000..=3_600_000) }),
            1 => plan.push(Step::RedisJump { ms: clocks.gen_range(1..=20) * 500 }),
            _ => {}
        }
        if let Step::Failover { behind_ms } = &mut step {
            *behind_ms = clocks.gen_range(0..FAILOVER_MS as u16);
        }
        if waits.gen_range(0..5) == 0 {
            let (client, token) = (waits.gen_range(0..CLIENTS), waits.gen_range(0..TOKENS));
            plan.push(match waits.gen_range(0..10) {
                0..6 => Step::WaitGrant {
                    client,
                    token,
                    units: waits.gen_range(1..=3),
                    wait_ms: waits.gen_range(1..=8) * 1_000,
                },
                _ => Step::WaitRelease { client, token },
            });
        }
        if apps.gen_range(0..3) == 0 {
            plan.push(apps::draw_step(&mut apps));
        }
        if execs.gen_range(0..4) == 0 {
            plan.push(exec::draw_step(&mut execs));
        }
        if sessions.gen_range(0..4) == 0 {
            let (client, session) = (sessions.gen_range(0..CLIENTS), sessions.gen_range(0..4));
            plan.push(match sessions.gen_range(0..10) {
                0..3 => Step::OpenSession { client, ttl_ms: sessions.gen_range(2..=8) * 1_000 },
                3..6 => Step::SessionGrant {
                    client,
                    ns: sessions.gen_range(0..PLAIN_NAMESPACES),
                    token: sessions.gen_range(0..TOKENS),
                    units: sessions.gen_range(1..=2),
                    session,
                },
                6..8 => Step::KeepSession { client, session },
                _ => Step::CloseSession { client, session },
            });
        }
        if pools.gen_range(0..4) == 0 {
            let (client, alloc) = (pools.gen_range(0..CLIENTS), pools.gen_range(0..8));
            plan.push(match pools.gen_range(0..10) {
                0..5 => {
                    let min = pools.gen_range(1..=2);
                    Step::Accept { client, min, max: pools.gen_range(min..=3) }
                }
                5..8 => Step::Free { client, alloc },
                _ => Step::KeepAlloc { client, alloc, interval_ms: pools.gen_range(1..=6) * 1_000 },
            });
        }
        plan.push(step);
    }
    plan
}

/// The grants', time's and the link's steps of `seed`'s plan.
fn draw_quotas(seed: u64, steps: usize) -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x0072_6564_6973);
    (0..steps)
        .map(|_| {
            let (client, ns, token) =
                (rng.gen_range(0..CLIENTS), rng.gen_range(0..PLAIN_NAMESPACES), rng.gen_range(0..TOKENS));
            match rng.gen_range(0..100) {
                0..40 => {
                    Step::Grant { client, ns, token, units: rng.gen_range(1..=2), ttl_ms: rng.gen_range(1..=6) * 1_000 }
                }
                40..58 => Step::Release { client, ns, token },
                58..70 => Step::Keepalive { client, ns, token },
                70..84 => Step::Advance { ms: rng.gen_range(1..=4) * 500 },
                84..89 => Step::Cut,
                89..94 => Step::Heal,
                94..98 => Step::Failover { behind_ms: 0 },
                _ => Step::Restart,
            }
        })
        .collect()
}

/// The replicas a seed's changes wait for: even seeds none (Redis's default), odd ones one.
pub fn min_replicas_of(seed: u64) -> u32 {
    u32::from(!seed.is_multiple_of(2))
}

/// A seed whose replicated run broke an invariant, shrunk.
#[derive(Debug)]
pub struct SeedFailure {
    pub seed: u64,
    pub steps: usize,
    pub failure: Failure,
    pub shrunk: Vec<Step>,
    pub shrunk_outcome: Outcome,
}

impl std::fmt::Display for SeedFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let replicas = min_replicas_of(self.seed);
        writeln!(f, "replicated seed {} (min replicas {replicas}) failed {}", self.seed, self.failure)?;
        let shrunk = self.shrunk_outcome.failure.as_ref().map_or_else(|| "?".to_owned(), ToString::to_string);
        writeln!(f, "shrunk to {} steps, failing {shrunk}; its history:", self.shrunk.len())?;
        for line in &self.shrunk_outcome.history {
            writeln!(f, "  {line}")?;
        }
        write!(f, "replay: allot-sim --redis --seed {} --steps {}", self.seed, self.steps)
    }
}

/// Runs `seed`'s plan of `steps` steps; a failure is shrunk (within a few dozen runs: each
/// starts Redis processes) before it is returned.
pub fn check_seed(seed: u64, steps: usize) -> Result<Outcome, Box<SeedFailure>> {
    let plan = draw(seed, steps);
    let outcome = run(seed, &plan);
    let Some(failure) = outcome.failure.clone() else { return Ok(outcome) };
    let shrunk = crate::shrink::shrink(&plan, 60, |plan| run(seed, plan).failure.is_some());
    let shrunk_outcome = run(seed, &shrunk);
    Err(Box::new(SeedFailure { seed, steps, failure, shrunk, shrunk_outcome }))
}

/// Runs `steps` as `seed`'s replicated run, every invariant checked after every step. A panic is
/// a failure of the step it happened in.
pub fn run(seed: u64, steps: &[Step]) -> Outcome {
    let history = Arc::new(std::sync::Mutex::new(Vec::new()));
    let played = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime builds");
        let mut sim = runtime.block_on(Sim::start(seed, history.clone()));
        let failure = runtime.block_on(sim.play(steps));
        runtime.block_on(sim.stop());
        failure
    }));
    let history = std::mem::take(&mut *history.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
    let failure = played
        .unwrap_or_else(|panic| Some(Failure { step: history.len(), violation: crate::run::panicked(panic.as_ref()) }));
    Outcome { history, failure }
}

/// What the clients know of one grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Known {
    /// Held with `fencing`, its lease running until `until` (Redis's time, ms).
    Held { units: u64, fencing: u64, until: u64 },
    /// Never granted, released, lapsed, or found missing.
    Gone,
    /// An answer nobody has (the call's outcome unknown, or a change a failover may have lost):
    /// learned from the next listing.
    InDoubt,
}

/// One grant's knowledge; `at_risk`: the last change to it is one a failover may lose.
#[derive(Debug, Clone, Copy)]
struct Grip {
    known: Known,
    at_risk: bool,
}

/// What the clients were told, per `(namespace, token)`, and the highest fencing number a
/// client may hold per namespace; and of the pool's allocs, per `(client, number)`: its id and
/// what the client knows of it (`units` its CPUs, `fencing` 0).
#[derive(Debug, Default)]
struct Model {
    grips: BTreeMap<(u8, String), Grip>,
    highest_fencing: BTreeMap<u8, u64>,
    allocs: BTreeMap<(u8, usize), (String, Grip)>,
    /// The sessions opened, in order: the client's, its id, what it knows of the session
    /// (`units` 0, `fencing` 0).
    sessions: Vec<(u8, String, Grip)>,
    /// The grants held in a session (by the session's index in `sessions`): a session grant's
    /// lease is its session's (`until` is `u64::MAX` in its grip), and it ends with it.
    in_session: BTreeMap<(u8, String), usize>,
    /// The applications submitted, by id: their tasks, and what their client knows of the
    /// submission (`units` its tasks, `until` `u64::MAX` once acknowledged).
    apps: BTreeMap<String, Grip>,
}

impl Model {
    fn grip(&mut self, ns: u8, token: &str) -> &mut Grip {
        self.grips.entry((ns, token.to_owned())).or_insert(Grip { known: Known::Gone, at_risk: false })
    }

    /// Where the lease of `grant` (token `token` of `ns`), as answered `now`, runs until: its
    /// session's (`u64::MAX`, the session's grip saying), or its own. Notes which session holds it.
    fn until_of(&mut self, ns: u8, token: &str, grant: &Grant, now: u64) -> u64 {
        let key = (ns, token.to_owned());
        let session = grant.session.as_ref().and_then(|id| self.sessions.iter().position(|(_, s, _)| s == id));
        match session {
            Some(index) => {
                self.in_session.insert(key, index);
                u64::MAX
            }
            None => {
                self.in_session.remove(&key);
                now + grant.expires_in_ms.unwrap_or(0)
            }
        }
    }

    /// Session `index` is gone (`known`), or in doubt: so are its grants. They stay noted as
    /// its (a failover may bring them back with it) until listed or granted otherwise.
    fn session_ended(&mut self, index: usize, known: Known, at_risk: bool) {
        for (key, _) in self.in_session.iter().filter(|(_, s)| **s == index) {
            if let Some(grip) = self.grips.get_mut(key) {
                *grip = Grip { known, at_risk: at_risk || grip.at_risk };
            }
        }
    }

    /// A fencing number given in `ns` now: above every one given before.
    fn fencing_given(&mut self, ns: u8, token: &str, fencing: u64) -> Result<(), Violation> {
        let highest = self.highest_fencing.entry(ns).or_default();
        if fencing <= *highest {
            return Err(Violation::new(format!(
                "{token} in {} was given fencing number {fencing}, not above {highest} given before",
                namespace(ns)
            )));
        }
        *highest = fencing;
        Ok(())
    }
}

fn namespace(ns: u8) -> String {
    format!("sim:r{ns}")
}

fn token(client: u8, token: u8) -> String {
    format!("c{client}-t{token}")
}

/// The primary, its replica, and whether the link between them is cut: the process id of the
/// replica, paused (it cannot be asked for it then).
struct Pair {
    primary: RedisServer,
    replica: RedisServer,
    cut: Option<String>,
}

impl Pair {
    async fn start() -> Pair {
        let primary = RedisServer::start();
        let replica = start_replica_of(&primary).await;
        Pair { primary, replica, cut: None }
    }
}

/// A daemon on the primary: its store and the API over it, and the clock its functions read.
struct Daemon {
    store: Arc<RedisStore>,
    api: Api,
    clock: TestClock,
    /// Its name in the election of the scheduler; it takes part only in its turns
    /// ([`Step::Schedule`]).
    holder: String,
}

struct Sim {
    seed: u64,
    min_replicas: u32,
    /// The last step was a turn in which the daemon scheduled (`apps.rs`).
    turn_scheduled: bool,
    /// The waiting allocates still waiting, in the order they started to.
    waiting: Vec<waits::Waiter>,
    /// Waiters whose calls answered while their leaving the queue may not have stuck (cut, or
    /// the call failed), by namespace and token: Redis may still grant them until the sweep
    /// drops them (their deadline and a grace, by when).
    orphans: BTreeMap<(u8, String), u64>,
    /// The CPUs the pool's live allocs held at its last listing (after the step before): what
    /// an accept may find held at most, since between two steps allocs only lapse and are
    /// reclaimed. `None` before the first listing.
    pool_held: Option<u64>,
    /// The answer to the next change a client asks for is lost ([`Step::LoseAnswer`]).
    lose_next_answer: AtomicBool,
    /// The daemons' clock (`RedisConfig::time`), at `now` on Redis's.
    clock: SimClock,
    /// How many times a daemon was opened: each draws its ids from the seed and this.
    starts: u64,
    /// How many single daemons restarted ([`Step::Restart`]): which one restarts next.
    restarts: usize,
    pair: Pair,
    daemons: [Option<Daemon>; DAEMONS],
    /// The daemons' stores, as the executor finds the one that schedules.
    stores: exec_store::Daemons,
    /// The first daemon's executor (`exec.rs`), and where its tasks' directories are.
    exec: Option<exec::ExecProcess>,
    exec_dir: tempfile::TempDir,
    /// The tasks a client reported ended (`{app}/{task}`): they may end otherwise than their spec
    /// asked.
    ended_from_outside: std::collections::BTreeSet<String>,
    /// The daemon the step's calls go to.
    serving: usize,
    now: u64,
    model: Model,
    watcher: Option<Watcher>,
    watched: u64,
    history: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Sim {
    async fn start(seed: u64, history: Arc<std::sync::Mutex<Vec<String>>>) -> Sim {
        let pair = Pair::start().await;
        let clock = SimClock::new();
        // Its wall clock reads Redis's.
        clock.jump_wall(START_MS as i64 - allot_core::clock::TimeSource::wall_ms(&clock) as i64);
        let mut sim = Sim {
            seed,
            min_replicas: min_replicas_of(seed),
            turn_scheduled: false,
            waiting: Vec::new(),
            orphans: BTreeMap::new(),
            pool_held: None,
            lose_next_answer: AtomicBool::new(false),
            clock,
            starts: 0,
            restarts: 0,
            pair,
            daemons: [None, None],
            stores: Arc::new(std::sync::Mutex::new(vec![None; DAEMONS])),
            exec: None,
            exec_dir: tempfile::tempdir().expect("a directory for the executor's tasks"),
            ended_from_outside: Default::default(),
            serving: 0,
            now: START_MS,
            model: Model::default(),
            watcher: None,
            watched: 0,
            history,
        };
        sim.open_all().await;
        for ns in 0..NAMESPACES {
            let path = format!("/v1/namespaces/{}", namespace(ns));
            let (status, body) = sim.call(Method::PUT, path, Some(serde_json::json!({ "quota": QUOTA }))).await;
            assert!(status.is_success(), "the namespaces are made: {status} {}", String::from_utf8_lossy(&body));
        }
        let path = format!("/v1/pools/{POOL}");
        let (status, body) =
            sim.call(Method::PUT, path, Some(serde_json::json!({ "capacity": format!("cpu={CAPACITY}") }))).await;
        assert!(status.is_success(), "the pool is made: {status} {}", String::from_utf8_lossy(&body));
        sim.start_apps().await;
        sim
    }

    async fn open_all(&mut self) {
        for index in 0..DAEMONS {
            self.open(index).await;
        }
    }

    /// Opens daemon `index` on the primary, its clock at the simulation's time; the first
    /// resumes the watcher from the last revision it was given.
    async fn open(&mut self, index: usize) {
        let replicas = self.min_replicas;
        self.starts += 1;
        let ids = SeededIds::new(self.seed.wrapping_mul(1_000_003).wrapping_add(self.starts));
        let configure = |config: allot_store_redis::RedisConfig| {
            // Waiting calls look at their answer often: settling them is quick.
            (config.with_min_replicas(replicas).with_time(Arc::new(self.clock.clone())))
                .with_ids(Arc::new(ids))
                .with_wake_poll(Duration::from_millis(2))
        };
        let (store, mut clock) = TestClock::open_configured(&self.pair.primary, self.now, configure).await;
        store.set_pool_rules(POOL_RULES);
        let holder = join_election(&store, "http://127.0.0.1:9");
        let store = Arc::new(store);
        clock.set(&store, self.now).await;
        let api = allot_server::api(ServerState::new(store.clone()));
        if index == 0 {
            let since = (self.watched > 0).then_some(self.watched);
            let watcher = match store.watch(Filter::default(), since) {
                // What the watcher missed is no longer kept (or was lost): it lists again.
                Err(WatchError::Compacted { .. }) => store.watch(Filter::default(), None),
                other => other,
            };
            self.watcher = Some(watcher.expect("the watcher resumes"));
        }
        // It takes part in the election at once, as a daemon that starts does.
        renew_lease(&store, &holder).await;
        self.stores.lock().unwrap_or_else(|p| p.into_inner())[index] = Some(store.clone());
        if index == 0 {
            let exec = exec::ExecProcess::start(store.clone(), self.stores.clone(), &self.clock, self.exec_dir.path());
            self.exec = Some(exec.await);
        }
        self.daemons[index] = Some(Daemon { store, api, clock, holder });
    }

    /// Daemon `index` goes: its executor first (killed where it stands), then its store.
    async fn close_daemon(&mut self, index: usize) {
        if index == 0 {
            if let Some(exec) = self.exec.take() {
                exec.kill().await;
            }
        }
        self.stores.lock().unwrap_or_else(|p| p.into_inner())[index] = None;
        if let Some(daemon) = self.daemons[index].take() {
            daemon.store.shutdown().await;
        }
    }

    /// Closes every daemon: the waiting calls go first, one by one (`waits.rs`).
    async fn close(&mut self) -> Result<(), Violation> {
        self.watcher = None;
        let left = if self.daemons.iter().any(Option::is_some) { self.leave_queues().await } else { Ok(()) };
        for index in 0..DAEMONS {
            self.close_daemon(index).await;
        }
        left
    }

    /// Closes daemon `index` alone. Every waiting call goes first, on either daemon (none waits
    /// across a restart, so none is left behind by another's leaving out of queue order).
    async fn close_one(&mut self, index: usize) -> Result<(), Violation> {
        if index == 0 {
            self.watcher = None;
        }
        let left = self.leave_queues().await;
        self.close_daemon(index).await;
        left
    }

    async fn stop(&mut self) {
        // The run is over: what its waiting calls answer now is not checked.
        let _ = self.close().await;
        if let Some(pid) = self.pair.cut.take() {
            signal(&pid, "-CONT");
        }
    }

    fn record(&self, line: String) {
        tracing::info!("{line}");
        self.history.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(line);
    }

    /// The daemon serving the step's calls.
    fn daemon(&self) -> &Daemon {
        self.daemons[self.serving].as_ref().expect("the daemons run between steps")
    }

    /// The first daemon, which sets Redis's clock and holds the watcher.
    fn first_mut(&mut self) -> &mut Daemon {
        self.daemons[0].as_mut().expect("the daemons run between steps")
    }

    /// Every daemon's election task renews (or takes) the scheduler's lease, in turn.
    async fn renew_leases(&self) {
        for daemon in self.daemons.iter().flatten() {
            renew_lease(&daemon.store, &daemon.holder).await;
        }
    }

    /// The daemon that schedules now (the first if none knows it does).
    fn scheduling(&self) -> usize {
        let here = |daemon: &Option<Daemon>| {
            daemon.as_ref().is_some_and(|d| matches!(d.store.apps_home(), allot_store::AppsHome::Here))
        };
        self.daemons.iter().position(here).unwrap_or(0)
    }

    /// Where `step`'s calls go: a client's to its daemon (clients spread over the daemons), the
    /// applications' to the daemon that schedules (another would forward them there), the rest
    /// to the first.
    fn daemon_for(&self, step: Step) -> usize {
        match step {
            Step::Grant { client, .. }
            | Step::Release { client, .. }
            | Step::Keepalive { client, .. }
            | Step::OpenSession { client, .. }
            | Step::SessionGrant { client, .. }
            | Step::KeepSession { client, .. }
            | Step::CloseSession { client, .. }
            | Step::Accept { client, .. }
            | Step::Free { client, .. }
            | Step::KeepAlloc { client, .. }
            | Step::WaitGrant { client, .. }
            | Step::WaitRelease { client, .. } => usize::from(client) % DAEMONS,
            Step::Submit { .. } | Step::SubmitRun { .. } | Step::Report { .. } | Step::ReportRun { .. } => {
                self.scheduling()
            }
            _ => 0,
        }
    }

    /// A call through the daemon's handlers; a change's answer is dropped if the plan says so
    /// ([`Step::LoseAnswer`]): the change is made, its client told its outcome is unknown.
    async fn call(&self, method: Method, path: String, body: Option<serde_json::Value>) -> (StatusCode, bytes::Bytes) {
        let lose = method != Method::GET && self.lose_next_answer.swap(false, Ordering::Relaxed);
        let answer = ask(self.daemon().api.clone(), method, path, body).await;
        if !lose {
            return answer;
        }
        let error = allot_api::ErrorBody {
            error: allot_api::ErrorDetail {
                code: "store_outcome_unknown".to_owned(),
                message: "the answer was lost on the network (simulated)".to_owned(),
                compact_revision: None,
            },
        };
        let body = serde_json::to_vec(&error).expect("an error body serialises");
        (StatusCode::SERVICE_UNAVAILABLE, body.into())
    }

    async fn play(&mut self, steps: &[Step]) -> Option<Failure> {
        for (index, step) in steps.iter().enumerate() {
            let checked = match self.step(*step).await {
                Ok(line) => {
                    self.record(format!("{index} {step:?} at daemon {}: {line}", self.serving));
                    match self.settle_waiters().await {
                        Ok(()) => self.check().await,
                        Err(violation) => Err(violation),
                    }
                }
                Err(violation) => Err(violation),
            };
            if let Err(violation) = checked {
                tracing::warn!(step = index, "{violation}");
                return Some(Failure { step: index, violation });
            }
        }
        match self.runs_end().await {
            Ok(line) => {
                self.record(line);
                None
            }
            Err(violation) => {
                tracing::warn!("{violation}");
                Some(Failure { step: steps.len(), violation })
            }
        }
    }

    /// The clock moved to `now` and the primary swept: the leases due lapsed. The sweep writes:
    /// while cut, at one replica required, it is refused, and the lapsed grants stay until the
    /// link heals (safe: their units stay taken).
    fn leases_lapse(&mut self) {
        let (now, at_risk) = (self.now, self.acknowledged_at_risk());
        let refused = self.pair.cut.is_some() && self.min_replicas > 0;
        // A session whose lease ran out is ended by the sweep (refused while cut at one replica
        // required), its grants with it: in doubt until listed.
        let lapsed: Vec<usize> = (self.model.sessions.iter().enumerate())
            .filter(|(_, (_, _, grip))| matches!(grip.known, Known::Held { until, .. } if until <= now))
            .map(|(index, _)| index)
            .collect();
        for index in lapsed {
            self.model.sessions[index].2.known = Known::InDoubt;
            self.model.session_ended(index, Known::InDoubt, false);
        }
        // An alloc whose lease ran out is reclaimed later (or at once by an accept that needs
        // its room): in doubt until listed.
        for (_, grip) in self.model.allocs.values_mut() {
            if matches!(grip.known, Known::Held { until, .. } if until <= now) {
                grip.known = Known::InDoubt;
            }
        }
        for grip in self.model.grips.values_mut() {
            if let Known::Held { until, .. } = grip.known {
                // Due before now: the sweep ended it. Due right now: either way.
                if until < now && !refused {
                    *grip = Grip { known: Known::Gone, at_risk: at_risk || grip.at_risk };
                } else if until <= now {
                    grip.known = Known::InDoubt;
                }
            }
        }
    }

    /// Whether a change made now may be lost by a failover even once acknowledged.
    fn acknowledged_at_risk(&self) -> bool {
        self.pair.cut.is_some() && self.min_replicas == 0
    }

    async fn step(&mut self, step: Step) -> Result<String, Violation> {
        self.serving = self.daemon_for(step);
        Ok(match step {
            Step::Grant { client, ns, token: t, units, ttl_ms } => {
                let name = token(client, t);
                let path = format!("/v1/namespaces/{}/grants/{name}", namespace(ns));
                let body = serde_json::json!({ "units": units, "ttl_ms": ttl_ms });
                let (status, body) = self.call(Method::PUT, path, Some(body)).await;
                self.granted(ns, &name, u64::from(units), status, &body)?
            }
            Step::Release { client, ns, token: t } => self.release(ns, &token(client, t)).await?,
            Step::Keepalive { client, ns, token: t } => {
                let name = token(client, t);
                let path = format!("/v1/namespaces/{}/grants/{name}/keepalive", namespace(ns));
                let (status, body) = self.call(Method::POST, path, None).await;
                self.kept_alive(ns, &name, status, &body)?
            }
            Step::Advance { ms } => {
                self.now += u64::from(ms);
                self.clock.advance(u64::from(ms));
                let now = self.now;
                let daemon = self.first_mut();
                daemon.clock.set(&daemon.store, now).await;
                // Their election tasks renew the scheduler's lease on the way (at least every
                // half second, so within every step of time the plan draws).
                self.renew_leases().await;
                self.leases_lapse();
                // The executor did meanwhile what fell due.
                let executed = self.execute(u64::from(ms)).await?;
                format!("now {now}; {executed}")
            }
            Step::Cut => {
                if self.pair.cut.is_some() {
                    return Ok("already cut".into());
                }
                caught_up(&self.pair.primary, &self.pair.replica).await;
                let pid = pid_of(&self.pair.replica);
                signal(&pid, "-STOP");
                self.pair.primary.cli(&["CLIENT", "KILL", "TYPE", "replica"]);
                dropped(&self.pair.primary).await;
                self.pair.cut = Some(pid);
                "cut".into()
            }
            Step::Heal => {
                let Some(pid) = self.pair.cut.take() else { return Ok("not cut".into()) };
                signal(&pid, "-CONT");
                caught_up(&self.pair.primary, &self.pair.replica).await;
                // What lapsed while the sweep was refused is swept now, as part of this step:
                // the daemon's own sweeper (on the real clock) would at a moment of its own, and
                // a waiter handed the units then would take a fencing number out of turn.
                let now = self.now;
                let daemon = self.first_mut();
                daemon.clock.set(&daemon.store, now).await;
                // The replica holds everything now: nothing is at risk. A lease that lapsed while
                // the sweep was refused (one replica required) may be swept from now on, by the
                // daemon's own sweeper, whose rounds follow the real clock: in doubt until listed.
                let now = self.now;
                let allocs = self.model.allocs.values_mut().map(|(_, grip)| grip);
                let sessions = self.model.sessions.iter_mut().map(|(_, _, grip)| grip);
                for apps in self.model.apps.values_mut() {
                    apps.at_risk = false;
                }
                for grip in self.model.grips.values_mut().chain(allocs).chain(sessions) {
                    grip.at_risk = false;
                    if matches!(grip.known, Known::Held { until, .. } if until <= now) {
                        grip.known = Known::InDoubt;
                    }
                }
                "healed, the replica caught up".into()
            }
            Step::Failover { behind_ms } => {
                let lossy = self.pair.cut.is_some();
                if !lossy {
                    caught_up(&self.pair.primary, &self.pair.replica).await;
                }
                // Its waiting calls answer while the link is still cut, if it is.
                self.close().await?;
                let cut = self.pair.cut.take();
                self.pair.primary.stop();
                if let Some(pid) = cut {
                    signal(&pid, "-CONT");
                }
                // The replica is promoted; a new server becomes its replica; the dead primary goes.
                // Its clock reads less than the dead one's would by `behind_ms`.
                self.now += FAILOVER_MS - u64::from(behind_ms.min(FAILOVER_MS as u16 - 1));
                self.clock.advance(FAILOVER_MS);
                let promoted = std::mem::replace(&mut self.pair.replica, RedisServer::start());
                promoted.cli(&["REPLICAOF", "NO", "ONE"]);
                self.pair.primary = promoted;
                attach(&self.pair.primary, &self.pair.replica).await;
                let allocs = self.model.allocs.values_mut().map(|(_, grip)| grip);
                let sessions = self.model.sessions.iter_mut().map(|(_, _, grip)| grip);
                let apps = self.model.apps.values_mut();
                for grip in self.model.grips.values_mut().chain(allocs).chain(sessions).chain(apps) {
                    if std::mem::take(&mut grip.at_risk) {
                        grip.known = Known::InDoubt;
                    }
                }
                // The promoted primary's clock has moved on by the failover's time, less its lag.
                self.open_all().await;
                self.leases_lapse();
                if lossy {
                    "failed over, losing the writes made while cut".into()
                } else {
                    "failed over, the replica had everything".into()
                }
            }
            Step::Restart => {
                if self.pair.cut.is_some() && self.min_replicas > 0 {
                    // Its start writes (the feed's copies), which the primary refuses without its
                    // replica: it would wait for the link to heal.
                    return Ok("not restarted: the primary lacks the replica the daemon requires".into());
                }
                let index = self.restarts % DAEMONS;
                self.restarts += 1;
                self.close_one(index).await?;
                // It handed the scheduler's lease over as it stopped: the others' election tasks
                // take it before it is back.
                self.renew_leases().await;
                self.open(index).await;
                format!("daemon {index} restarted")
            }
            Step::OpenSession { client, ttl_ms } => {
                let body = serde_json::json!({ "ttl_ms": ttl_ms });
                let (status, body) = self.call(Method::POST, "/v1/sessions".to_owned(), Some(body)).await;
                self.session_opened(client, status, &body)?
            }
            Step::SessionGrant { client, ns, token: t, units, session } => {
                let Some((index, id)) = self.session_of(client, session) else { return Ok("no session".into()) };
                let name = token(client, t);
                let path = format!("/v1/namespaces/{}/grants/{name}", namespace(ns));
                let body = serde_json::json!({ "units": units, "session": id });
                let (status, body) = self.call(Method::PUT, path, Some(body)).await;
                if status == StatusCode::NOT_FOUND || status == StatusCode::GONE {
                    // Its session is gone: nothing was granted. Not one certainly open, though.
                    let (now, grip) = (self.now, self.model.sessions[index].2);
                    if matches!(grip.known, Known::Held { until, .. } if until > now) && !grip.at_risk {
                        return Err(Violation::new(format!(
                            "a grant in session {index}, open as far as its client knows, found it {}",
                            code_of(&body)
                        )));
                    }
                    return Ok(format!("{} {}", status.as_u16(), code_of(&body)));
                }
                // The session's id is drawn at random: the history names it by its number.
                self.granted(ns, &name, u64::from(units), status, &body)?.replace(&id, &format!("session {index}"))
            }
            Step::KeepSession { client, session } => {
                let Some((index, id)) = self.session_of(client, session) else { return Ok("no session".into()) };
                let path = format!("/v1/sessions/{id}/keepalive");
                let (status, body) = self.call(Method::POST, path, None).await;
                self.session_kept(index, status, &body)?
            }
            Step::CloseSession { client, session } => {
                let Some((index, id)) = self.session_of(client, session) else { return Ok("no session".into()) };
                let (status, body) = self.call(Method::DELETE, format!("/v1/sessions/{id}"), None).await;
                self.session_closed(index, status, &body)?
            }
            Step::Accept { client, min, max } => {
                let path = format!("/v1/pools/{POOL}/offers/1");
                let body = serde_json::json!({ "min": format!("cpu={min}"), "max": format!("cpu={max}") });
                let (status, body) = self.call(Method::POST, path, Some(body)).await;
                self.accepted(client, (min, max), status, &body)?
            }
            Step::Free { client, alloc } => {
                let Some((key, id)) = self.alloc_of(client, alloc) else { return Ok("no alloc to free".into()) };
                let (status, body) = self.call(Method::DELETE, format!("/v1/pools/{POOL}/allocs/{id}"), None).await;
                self.freed(key, status, &body)?
            }
            Step::KeepAlloc { client, alloc, interval_ms } => {
                let Some((key, id)) = self.alloc_of(client, alloc) else { return Ok("no alloc to keep".into()) };
                let path = format!("/v1/pools/{POOL}/allocs/{id}/keepalive");
                let body = serde_json::json!({ "interval_ms": interval_ms });
                let (status, body) = self.call(Method::POST, path, Some(body)).await;
                self.alloc_kept(key, status, &body)?
            }
            Step::Submit { client, app, tasks, cpu, gang, priority } => {
                self.submit(client, app, (tasks, cpu, gang, priority)).await?
            }
            Step::Schedule => self.schedule().await?,
            Step::WaitGrant { client, token, units, wait_ms } => self.wait_grant(client, token, units, wait_ms).await?,
            Step::WaitRelease { client, token } => {
                let name = waits::waiting_token(client, token);
                let line = self.release(PLAIN_NAMESPACES, &name).await?;
                if self.waiting_tokens().contains(&(PLAIN_NAMESPACES, name.clone())) {
                    // A waiter its token left behind may still be granted after the release.
                    self.model.grip(PLAIN_NAMESPACES, &name).known = Known::InDoubt;
                }
                line
            }
            Step::Report { client, app, task, report } => self.report(format!("a{client}-"), app, task, report).await,
            Step::ReportRun { client, app, task, report } => {
                self.report(format!("x{client}-"), app, task, report).await
            }
            Step::LoseAnswer => {
                self.lose_next_answer.store(true, Ordering::Relaxed);
                "the next change's answer will be lost".to_owned()
            }
            Step::WallJump { ms } => {
                self.clock.jump_wall(i64::from(ms));
                "the daemon's wall clock jumped".to_owned()
            }
            Step::SubmitRun { client, app, tasks, run, gang } => self.submit_run(client, app, tasks, run, gang).await?,
            Step::Execute => self.execute(0).await?,
            Step::RedisJump { ms } => {
                self.now += u64::from(ms);
                let now = self.now;
                let daemon = self.first_mut();
                daemon.clock.set(&daemon.store, now).await;
                self.leases_lapse();
                format!("Redis's clock jumped to {now}")
            }
        })
    }

    /// `DELETE` of grant `name` in `ns`.
    async fn release(&mut self, ns: u8, name: &str) -> Result<String, Violation> {
        let path = format!("/v1/namespaces/{}/grants/{name}", namespace(ns));
        let (status, body) = self.call(Method::DELETE, path, None).await;
        self.released(ns, name, status, &body)
    }

    /// Client `client`'s session number `number` (modulo those it opened): its index and id.
    fn session_of(&self, client: u8, number: u8) -> Option<(usize, String)> {
        let mine: Vec<usize> =
            (self.model.sessions.iter().enumerate()).filter(|(_, (c, _, _))| *c == client).map(|(i, _)| i).collect();
        let index = *mine.get(usize::from(number) % mine.len().max(1))?;
        Some((index, self.model.sessions[index].1.clone()))
    }

    /// The answer to a session opened by `client` (its id kept, not told in the history).
    fn session_opened(&mut self, client: u8, status: StatusCode, body: &[u8]) -> Result<String, Violation> {
        if !status.is_success() {
            return Ok(format!("{} {}", status.as_u16(), code_of(body)));
        }
        let session: allot_api::Session = parse(body)?;
        let until = self.now + session.expires_in_ms;
        let grip = Grip { known: Known::Held { units: 0, fencing: 0, until }, at_risk: self.acknowledged_at_risk() };
        self.model.sessions.push((client, session.id, grip));
        // Its lease is not told, as an alloc's.
        Ok(format!("{} session {}", status.as_u16(), self.model.sessions.len() - 1))
    }

    fn session_kept(&mut self, index: usize, status: StatusCode, body: &[u8]) -> Result<String, Violation> {
        let (at_risk, now, cut) = (self.acknowledged_at_risk(), self.now, self.pair.cut.is_some());
        let grip = self.model.sessions[index].2;
        let name = format!("session {index}");
        if let Some(line) = not_done(&mut self.model.sessions[index].2, &name, "keepalive", status, body, cut) {
            // Found gone, or in doubt: so are its grants.
            if self.model.sessions[index].2.known != grip.known {
                self.model.session_ended(index, Known::InDoubt, grip.at_risk || cut);
            }
            return line;
        }
        let session: allot_api::Session = parse(body)?;
        if matches!(grip.known, Known::Gone) && !grip.at_risk {
            return Err(Violation::new(format!("session {index}, closed or found gone, was kept alive")));
        }
        let until = now + session.expires_in_ms;
        self.model.sessions[index].2 =
            Grip { known: Known::Held { units: 0, fencing: 0, until }, at_risk: at_risk || grip.at_risk };
        Ok(format!("{} session {index} kept", status.as_u16()))
    }

    fn session_closed(&mut self, index: usize, status: StatusCode, body: &[u8]) -> Result<String, Violation> {
        let (at_risk, cut) = (self.acknowledged_at_risk(), self.pair.cut.is_some());
        let grip = self.model.sessions[index].2;
        let name = format!("session {index}");
        if let Some(line) = not_done(&mut self.model.sessions[index].2, &name, "close", status, body, cut) {
            if self.model.sessions[index].2.known != grip.known {
                self.model.session_ended(index, Known::InDoubt, grip.at_risk || cut);
            }
            return line;
        }
        let at_risk = at_risk || grip.at_risk;
        self.model.sessions[index].2 = Grip { known: Known::Gone, at_risk };
        self.model.session_ended(index, Known::Gone, at_risk);
        Ok(format!("{} session {index} closed", status.as_u16()))
    }

    /// The sessions as the primary lists them: what a client was told open (and no failover may
    /// undo) is there while its lease certainly runs; what it was told closed or gone is not.
    /// What was in doubt is learned (a session found gone leaves its grants in doubt: the
    /// grants' listing tells).
    async fn check_sessions(&mut self) -> Result<(), Violation> {
        let now = self.now;
        let (status, body) = self.call(Method::GET, "/v1/sessions?limit=1000".to_owned(), None).await;
        if status != StatusCode::OK {
            return Err(Violation::new(format!("GET /v1/sessions answered {status}: {}", code_of(&body))));
        }
        let list: allot_api::SessionList = parse(&body)?;
        let listed: BTreeMap<&str, &allot_api::Session> = list.sessions.iter().map(|s| (s.id.as_str(), s)).collect();
        let learned_at_risk = self.acknowledged_at_risk();
        let mut gone = Vec::new();
        for (index, (_, id, grip)) in self.model.sessions.iter_mut().enumerate() {
            let session = listed.get(id.as_str()).map(|session| match session.expires_in_ms {
                0 => Known::InDoubt,
                left => Known::Held { units: 0, fencing: 0, until: now + left },
            });
            if session.is_none() && grip.known != Known::Gone {
                gone.push(index);
            }
            listed_as_told(grip, &format!("session {index}"), session, now, learned_at_risk)?;
        }
        for index in gone {
            let at_risk = self.model.sessions[index].2.at_risk;
            self.model.session_ended(index, Known::InDoubt, at_risk);
        }
        Ok(())
    }

    /// Client `client`'s alloc number `number` (modulo those it got), and its id.
    fn alloc_of(&self, client: u8, number: u8) -> Option<((u8, usize), String)> {
        let got = self.model.allocs.keys().filter(|(c, _)| *c == client).count();
        let key = (client, usize::from(number) % got.max(1));
        self.model.allocs.get(&key).map(|(id, _)| (key, id.clone()))
    }

    /// The answer to an accept of `min` to `max` CPUs by client `client`: refused as expired
    /// only when `min` CPUs were not certainly free. The alloc's id is kept, not told in the
    /// history (ids are drawn at random).
    fn accepted(
        &mut self,
        client: u8,
        (min, max): (u8, u8),
        status: StatusCode,
        body: &[u8],
    ) -> Result<String, Violation> {
        let code = code_of(body);
        let free = self.pool_held.map(|held| CAPACITY.saturating_sub(held));
        if status == StatusCode::CONFLICT && code == "offer_expired" && free >= Some(u64::from(min)) {
            return Err(Violation::new(format!(
                "an accept of cpu={min} to cpu={max} was refused as {code} with {} CPUs certainly free",
                free.unwrap_or_default()
            )));
        }
        if status != StatusCode::CREATED {
            // An accept whose outcome is unknown may have made an alloc nobody knows: the
            // listing tells (see `check_pool`).
            return Ok(format!("{} {code}", status.as_u16()));
        }
        let alloc: allot_api::Alloc = parse(body)?;
        let cpus = cpus_of(&alloc.resources)?;
        if self.model.allocs.values().any(|(id, _)| *id == alloc.id) {
            return Err(Violation::new(format!("alloc id {} given again", alloc.id)));
        }
        let number = self.model.allocs.keys().filter(|(c, _)| *c == client).count();
        let until = self.now + u64::try_from(alloc.expires_in_ms.unwrap_or(0)).unwrap_or(0);
        let grip = Grip { known: Known::Held { units: cpus, fencing: 0, until }, at_risk: self.acknowledged_at_risk() };
        self.model.allocs.insert((client, number), (alloc.id, grip));
        // Its lease is not told: read after a failover, what is left of it may be a few ms
        // short of the whole (the daemon counts the real time since it last read Redis's clock).
        Ok(format!("201 alloc c{client}#{number} of cpu={cpus}"))
    }

    fn freed(&mut self, key: (u8, usize), status: StatusCode, body: &[u8]) -> Result<String, Violation> {
        let (at_risk, cut) = (self.acknowledged_at_risk(), self.pair.cut.is_some());
        let name = format!("alloc c{}#{}", key.0, key.1);
        let Some((_, grip)) = self.model.allocs.get_mut(&key) else { return Ok("unknown".into()) };
        if let Some(line) = not_done(grip, &name, "free", status, body, cut) {
            return line;
        }
        *grip = Grip { known: Known::Gone, at_risk: at_risk || grip.at_risk };
        Ok(format!("{} freed {name}", status.as_u16()))
    }

    fn alloc_kept(&mut self, key: (u8, usize), status: StatusCode, body: &[u8]) -> Result<String, Violation> {
        let (at_risk, now, cut) = (self.acknowledged_at_risk(), self.now, self.pair.cut.is_some());
        let name = format!("alloc c{}#{}", key.0, key.1);
        let Some((_, grip)) = self.model.allocs.get_mut(&key) else { return Ok("unknown".into()) };
        if let Some(line) = not_done(grip, &name, "keepalive", status, body, cut) {
            return line;
        }
        let kept: allot_api::AllocKeepaliveResponse = parse(body)?;
        if matches!(grip.known, Known::Gone) && !grip.at_risk {
            return Err(Violation::new(format!("{name}, freed or found gone, was kept alive")));
        }
        let until = now + kept.interval_ms;
        let cpus = cpus_of(&kept.alloc.resources)?;
        *grip = Grip { known: Known::Held { units: cpus, fencing: 0, until }, at_risk: at_risk || grip.at_risk };
        Ok(format!("{} kept {name} until {until}", status.as_u16()))
    }

    /// The pool's allocs as the primary lists them: never over its capacity; what a client was
    /// told held (and no failover may undo) is there while its lease certainly runs; what it was
    /// told freed or gone is not. What was in doubt is learned.
    async fn check_pool(&mut self) -> Result<(), Violation> {
        let now = self.now;
        let path = format!("/v1/pools/{POOL}/allocs?limit=1000");
        let (status, body) = self.call(Method::GET, path.clone(), None).await;
        if status != StatusCode::OK {
            return Err(Violation::new(format!("GET {path} answered {status}: {}", code_of(&body))));
        }
        let list: allot_api::AllocList = parse(&body)?;
        let live: BTreeMap<&str, &allot_api::Alloc> =
            list.allocs.iter().filter(|alloc| alloc.ended.is_none()).map(|alloc| (alloc.id.as_str(), alloc)).collect();
        let mut total = 0;
        for alloc in live.values() {
            total += cpus_of(&alloc.resources)?;
        }
        if total > CAPACITY {
            return Err(Violation::new(format!(
                "{POOL} holds {total} CPUs in live allocs, over its capacity {CAPACITY}"
            )));
        }
        self.pool_held = Some(total);
        // Learned while a failover may lose what the primary holds (cut, no replica required):
        // an alloc another's accept reclaimed meanwhile, say, may come back.
        let learned_at_risk = self.acknowledged_at_risk();
        for ((client, number), (id, grip)) in &mut self.model.allocs {
            // A lease run out but not reclaimed yet is in doubt (the daemon's own sweeper may
            // reclaim it any time).
            let listed = match live.get(id.as_str()) {
                Some(alloc) => Some(match alloc.expires_in_ms.and_then(|left| u64::try_from(left).ok()) {
                    Some(left) if left > 0 => {
                        Known::Held { units: cpus_of(&alloc.resources)?, fencing: 0, until: now + left }
                    }
                    _ => Known::InDoubt,
                }),
                None => None,
            };
            listed_as_told(grip, &format!("alloc c{client}#{number}"), listed, now, learned_at_risk)?;
        }
        Ok(())
    }

    /// The answer to a grant of `units` to `name` in `ns`.
    fn granted(
        &mut self,
        ns: u8,
        name: &str,
        units: u64,
        status: StatusCode,
        body: &[u8],
    ) -> Result<String, Violation> {
        let at_risk = self.acknowledged_at_risk();
        let now = self.now;
        if !status.is_success() {
            return Ok(self.failed(ns, name, status, body));
        }
        let answer: AllocateResponse = parse(body)?;
        let certain_room = self.certain_room(ns);
        let grip = *self.model.grip(ns, name);
        match (answer.status, answer.grant) {
            (Status::Granted, Some(grant)) => {
                let fencing = grant.fencing;
                match grip.known {
                    Known::Held { fencing: told, .. } if answer.existing && told != fencing => {
                        return Err(Violation::new(format!(
                            "{name} granted again with fencing {fencing}, told {told} before"
                        )));
                    }
                    Known::Gone if answer.existing => {
                        return Err(Violation::new(format!("{name}, released or lapsed, was still granted")));
                    }
                    _ if !answer.existing => self.model.fencing_given(ns, name, fencing)?,
                    _ => {}
                }
                let until = self.model.until_of(ns, name, &grant, now);
                *self.model.grip(ns, name) = Grip {
                    known: Known::Held { units: grant.units, fencing, until },
                    at_risk: at_risk || grip.at_risk,
                };
            }
            (Status::Exhausted, _) => {
                if let Some(free) = certain_room.filter(|free| *free >= units) {
                    if matches!(grip.known, Known::Gone) {
                        return Err(Violation::new(format!(
                            "{name} was refused {units} units with {free} certainly free"
                        )));
                    }
                }
            }
            (other, _) => return Err(Violation::new(format!("{name}: an allocate answered {other:?}"))),
        }
        Ok(format!("{} {}", status.as_u16(), String::from_utf8_lossy(body)))
    }

    /// The units of `ns` certainly free, if every grant in it is certain.
    fn certain_room(&self, ns: u8) -> Option<u64> {
        let mut held = 0;
        for ((n, _), grip) in &self.model.grips {
            if *n != ns {
                continue;
            }
            match grip.known {
                _ if grip.at_risk => return None,
                Known::InDoubt => return None,
                Known::Held { units, .. } => held += units,
                Known::Gone => {}
            }
        }
        Some(QUOTA.saturating_sub(held))
    }

    fn released(&mut self, ns: u8, name: &str, status: StatusCode, body: &[u8]) -> Result<String, Violation> {
        if !status.is_success() {
            return Ok(self.failed(ns, name, status, body));
        }
        let answer: ReleaseResponse = parse(body)?;
        let at_risk = self.acknowledged_at_risk();
        let grip = self.model.grip(ns, name);
        match grip.known {
            Known::Held { .. } if !answer.released && !grip.at_risk => {
                return Err(Violation::new(format!("{name} was held, yet its release found nothing")));
            }
            Known::Gone if answer.released && !grip.at_risk => {
                return Err(Violation::new(format!("{name}, released or lapsed, was released again")));
            }
            _ => {}
        }
        *grip = Grip { known: Known::Gone, at_risk: at_risk || grip.at_risk };
        Ok(format!("{} {}", status.as_u16(), String::from_utf8_lossy(body)))
    }

    fn kept_alive(&mut self, ns: u8, name: &str, status: StatusCode, body: &[u8]) -> Result<String, Violation> {
        let at_risk = self.acknowledged_at_risk();
        let now = self.now;
        let grip = self.model.grip(ns, name);
        if status == StatusCode::NOT_FOUND {
            if matches!(grip.known, Known::Held { .. }) && !grip.at_risk {
                return Err(Violation::new(format!("{name} was held, yet its keepalive found nothing")));
            }
            // Its session lapsed: the grant is listed until a sweep ends the session with it
            // (one lapsed at this very ms is swept only after it), so it is in doubt till then.
            grip.known = if code_of(body) == "session_not_found" { Known::InDoubt } else { Known::Gone };
            return Ok(format!("{} {}", status.as_u16(), code_of(body)));
        }
        if !status.is_success() {
            return Ok(self.failed(ns, name, status, body));
        }
        let grant: Grant = parse(body)?;
        if matches!(grip.known, Known::Gone) && !grip.at_risk {
            return Err(Violation::new(format!("{name}, released or lapsed, was kept alive")));
        }
        let until = self.model.until_of(ns, name, &grant, now);
        let grip = self.model.grip(ns, name);
        *grip = Grip {
            known: Known::Held { units: grant.units, fencing: grant.fencing, until },
            at_risk: at_risk || grip.at_risk,
        };
        Ok(format!("{} {}", status.as_u16(), String::from_utf8_lossy(body)))
    }

    /// A call that failed: refused before anything was written (too few replicas, Redis not
    /// reachable), or with its outcome unknown (the grant in doubt until the next listing).
    fn failed(&mut self, ns: u8, name: &str, status: StatusCode, body: &[u8]) -> String {
        let code = code_of(body);
        if code == "store_outcome_unknown" {
            let at_risk = self.pair.cut.is_some();
            *self.model.grip(ns, name) = Grip { known: Known::InDoubt, at_risk };
        }
        format!("{} {code}", status.as_u16())
    }

    /// Checks what the primary holds against what the clients were told, and learns what was in
    /// doubt.
    async fn check(&mut self) -> Result<(), Violation> {
        self.watch()?;
        self.check_runs()?;
        self.check_pool().await?;
        self.check_apps().await?;
        self.check_sessions().await?;
        let now = self.now;
        for ns in 0..NAMESPACES {
            let path = format!("/v1/namespaces/{}/grants?limit=1000", namespace(ns));
            let (status, body) = self.call(Method::GET, path.clone(), None).await;
            if status != StatusCode::OK {
                return Err(Violation::new(format!("GET {path} answered {status}: {}", code_of(&body))));
            }
            let list: GrantList = parse(&body)?;
            let total: u64 = list.grants.iter().map(|grant| grant.units).sum();
            if total > QUOTA {
                return Err(Violation::new(format!("{} grants {total} units over its quota {QUOTA}", namespace(ns))));
            }
            let listed: BTreeMap<&str, &Grant> =
                list.grants.iter().map(|grant| (grant.token.as_str(), grant)).collect();
            // A waiting call's grant stays in doubt until the call answers (`waits.rs`).
            let waiting = self.waiting_tokens();
            let grips =
                self.model.grips.iter_mut().filter(|((n, name), _)| *n == ns && !waiting.contains(&(*n, name.clone())));
            for ((n, name), grip) in grips {
                let held = listed.get(name.as_str());
                match (grip.known, held) {
                    (Known::Held { fencing, until, .. }, Some(grant)) => {
                        if grant.fencing != fencing && !grip.at_risk {
                            return Err(Violation::new(format!(
                                "{name} in {} holds fencing {}, its client was told {fencing}",
                                namespace(*n),
                                grant.fencing
                            )));
                        }
                        let listed_until = now + grant.expires_in_ms.unwrap_or(0);
                        // A session grant's lease is its session's, checked with the sessions.
                        if listed_until != until && until != u64::MAX && !grip.at_risk {
                            return Err(Violation::new(format!(
                                "{name}'s lease ends at {listed_until}, its client was told {until}"
                            )));
                        }
                    }
                    (Known::Held { until, .. }, None) if !grip.at_risk && until > now => {
                        return Err(Violation::new(format!(
                            "{name} in {}, acknowledged and alive until {until} (now {now}), is gone",
                            namespace(*n)
                        )));
                    }
                    (Known::Gone, Some(grant)) if !grip.at_risk => {
                        return Err(Violation::new(format!(
                            "{name} in {}, released or lapsed, is held again (fencing {})",
                            namespace(*n),
                            grant.fencing
                        )));
                    }
                    _ => {}
                }
                // What the primary holds is what there is from now on (certain unless a failover
                // may still undo it). A grant whose lease has run out but that is not swept yet
                // (the sweep was refused while the link was cut, or is due right now) is in doubt:
                // the daemon's own sweeper, whose rounds follow the real clock, may end it before
                // the next step, or not.
                grip.known = match held {
                    Some(grant) if grant.expires_in_ms == Some(0) => Known::InDoubt,
                    Some(grant) if grant.session.is_some() => {
                        Known::Held { units: grant.units, fencing: grant.fencing, until: u64::MAX }
                    }
                    Some(grant) => Known::Held {
                        units: grant.units,
                        fencing: grant.fencing,
                        until: now + grant.expires_in_ms.unwrap_or(0),
                    },
                    None => Known::Gone,
                };
            }
            // A grant a client never heard of holds a fencing number it may have been given.
            for grant in &list.grants {
                let highest = self.model.highest_fencing.entry(ns).or_default();
                *highest = (*highest).max(grant.fencing);
                if !self.model.grips.contains_key(&(ns, grant.token.clone())) {
                    return Err(Violation::new(format!(
                        "{} holds {}, which nobody asked for",
                        namespace(ns),
                        grant.token
                    )));
                }
                // Which session holds it, as listed (a failover may have brought back a grant
                // its client knew ended with its session).
                self.model.until_of(ns, &grant.token, grant, now);
            }
        }
        Ok(())
    }

    /// Takes every event ready for the watcher: each after the one before, none twice.
    fn watch(&mut self) -> Result<(), Violation> {
        let Some(watcher) = self.watcher.as_mut() else { return Ok(()) };
        loop {
            let next = {
                let mut next = std::pin::pin!(watcher.next());
                next.as_mut().poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
            };
            match next {
                std::task::Poll::Pending => return Ok(()),
                std::task::Poll::Ready(Ok(event)) => {
                    if event.revision <= self.watched {
                        return Err(Violation::new(format!(
                            "the watcher was given revision {} ({:?} {}) after revision {}",
                            event.revision, event.kind, event.key, self.watched
                        )));
                    }
                    self.watched = event.revision;
                }
                std::task::Poll::Ready(Err(WatchError::Behind { .. } | WatchError::Compacted { .. })) => {
                    // It lists again, then watches from now.
                    self.watcher = Some(
                        (self.daemons[0].as_ref().expect("the daemons run between steps"))
                            .store
                            .watch(Filter::default(), None)
                            .map_err(|err| Violation::new(format!("the watcher cannot start again: {err}")))?,
                    );
                    return Ok(());
                }
                std::task::Poll::Ready(Err(err)) => return Err(Violation::new(format!("the watcher ended: {err}"))),
            }
        }
    }
}

/// A session or an alloc (`name`) as the primary lists it (`listed`: what it holds, `None` if not
/// listed) against what its client was told (`grip`): held while its lease certainly runs, and
/// never back once ended, unless a failover may undo what the client knows. Then `grip` learns
/// the listing; a change learned while a failover may lose it (`learned_at_risk`) is at risk.
fn listed_as_told(
    grip: &mut Grip,
    name: &str,
    listed: Option<Known>,
    now: u64,
    learned_at_risk: bool,
) -> Result<(), Violation> {
    match (grip.known, listed) {
        (Known::Held { until, .. }, None) if !grip.at_risk && until > now => {
            return Err(Violation::new(format!("{name}, acknowledged and alive until {until} (now {now}), is gone")));
        }
        (Known::Gone, Some(_)) if !grip.at_risk => {
            return Err(Violation::new(format!("{name}, ended as its client knows, is held again")));
        }
        _ => {}
    }
    let known = listed.unwrap_or(Known::Gone);
    grip.at_risk |= learned_at_risk && known != grip.known;
    grip.known = known;
    Ok(())
}

/// What an answer to `call` on `name` (a session's or an alloc's) that did not succeed teaches, or
/// `None` if it succeeded: found gone (a violation if its client knew it held, and no failover
/// may undo that), refused before anything was written, or with its outcome unknown (then in
/// doubt, at risk if the link is `cut`). The line for the history, or the violation.
fn not_done(
    grip: &mut Grip,
    name: &str,
    call: &str,
    status: StatusCode,
    body: &[u8],
    cut: bool,
) -> Option<Result<String, Violation>> {
    let code = code_of(body);
    if status == StatusCode::NOT_FOUND || status == StatusCode::GONE {
        if matches!(grip.known, Known::Held { .. }) && !grip.at_risk {
            return Some(Err(Violation::new(format!("{name} was held, yet its {call} found it {code}"))));
        }
        grip.known = Known::Gone;
    } else if status.is_success() {
        return None;
    } else if code == "store_outcome_unknown" {
        *grip = Grip { known: Known::InDoubt, at_risk: cut };
    }
    Some(Ok(format!("{} {code}", status.as_u16())))
}

/// One call through the daemon's handlers, and its answer.
async fn ask(api: Api, method: Method, path: String, body: Option<serde_json::Value>) -> (StatusCode, bytes::Bytes) {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header(axum::http::header::CONTENT_TYPE, "application/json")
        .body(body.map_or_else(Body::empty, |json| Body::from(json.to_string())))
        .expect("a valid request");
    let response = api.oneshot(request).await.unwrap_or_else(|never| match never {});
    let status = response.status();
    (status, axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap_or_default())
}

/// An error answer's code (its message may name ports, which differ from run to run).
fn code_of(body: &[u8]) -> String {
    serde_json::from_slice::<allot_api::ErrorBody>(body).map_or_else(|_| "?".to_owned(), |error| error.error.code)
}

/// `server`'s process id, as it says.
fn pid_of(server: &RedisServer) -> String {
    let info = server.cli(&["INFO", "server"]);
    field(&info, "process_id").unwrap_or_else(|| panic!("no process_id in INFO: {info}"))
}

/// Sends `sig` (`-STOP`, `-CONT`) to process `pid`.
fn signal(pid: &str, sig: &str) {
    let status = std::process::Command::new("kill").args([sig, pid]).status().expect("kill runs");
    assert!(status.success(), "kill {sig} {pid}");
}

/// A new server, made a replica of `primary`; returns once it caught up.
async fn start_replica_of(primary: &RedisServer) -> RedisServer {
    let replica = RedisServer::start();
    attach(primary, &replica).await;
    replica
}

/// Makes `replica` a replica of `primary`; returns once it caught up.
async fn attach(primary: &RedisServer, replica: &RedisServer) {
    // Redis waits 5 s by default before it sends the first copy, for more replicas to join.
    primary.cli(&["CONFIG", "SET", "repl-diskless-sync-delay", "0"]);
    replica.cli(&["REPLICAOF", "127.0.0.1", &port_of(primary)]);
    caught_up(primary, replica).await;
}

/// Waits until `primary` lists no replica: a replica's connection killed may still be listed
/// for a moment (freed asynchronously), and a change meanwhile would pass the store's check of
/// its replicas and then wait for one in vain (found by the suite's determinism test, seed 5: a
/// grant after a cut answered `store_outcome_unknown` once in a few runs, `not_enough_replicas`
/// otherwise).
async fn dropped(primary: &RedisServer) {
    let started = Instant::now();
    loop {
        let info = primary.cli(&["INFO", "replication"]);
        if field(&info, "connected_slaves").as_deref() == Some("0") {
            return;
        }
        assert!(started.elapsed() < CATCH_UP, "the primary still lists its replica after {CATCH_UP:?}: {info}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn port_of(server: &RedisServer) -> String {
    server.url().rsplit(':').next().expect("a port in the URL").to_owned()
}

/// Waits until `replica` is attached to `primary` (online, as the primary sees it) and holds
/// everything the primary wrote (as the replica says: the primary learns the replica's offset
/// only from its acknowledgements, once a second).
async fn caught_up(primary: &RedisServer, replica: &RedisServer) {
    let started = Instant::now();
    loop {
        let info = primary.cli(&["INFO", "replication"]);
        let offset = field(&info, "master_repl_offset");
        let online = info.lines().any(|line| line.starts_with("slave") && line.contains("state=online"));
        let theirs = replica.cli(&["INFO", "replication"]);
        let linked = field(&theirs, "master_link_status").is_some_and(|status| status == "up");
        if online && linked && offset.is_some() && field(&theirs, "slave_repl_offset") == offset {
            return;
        }
        assert!(started.elapsed() < CATCH_UP, "the replica did not catch up within {CATCH_UP:?}: {info}\n{theirs}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn field(info: &str, name: &str) -> Option<String> {
    info.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(':')).map(|value| value.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_is_a_function_of_its_seed() {
        assert_eq!(draw(3, 50), draw(3, 50));
        assert_ne!(draw(3, 50), draw(4, 50));
        let plan = draw(11, 400);
        assert!(plan.iter().any(|step| matches!(step, Step::Failover { .. })), "failovers are drawn");
        assert!(plan.iter().any(|step| matches!(step, Step::Cut)), "cuts are drawn");
        assert!(plan.iter().any(|step| matches!(step, Step::Accept { .. })), "accepts are drawn");
        assert!(plan.iter().any(|step| matches!(step, Step::SessionGrant { .. })), "grants in sessions are drawn");
        assert!(plan.iter().any(|step| matches!(step, Step::Submit { gang: true, .. })), "gangs are submitted");
        assert!(plan.iter().any(|step| matches!(step, Step::Schedule)), "the daemon schedules");
        assert!(plan.iter().any(|step| matches!(step, Step::SubmitRun { gang: true, .. })), "gangs are run");
        assert!(plan.iter().any(|step| matches!(step, Step::Execute)), "the executor takes turns");
        assert!(plan.iter().any(|step| matches!(step, Step::ReportRun { .. })), "its tasks are ended from outside");
        assert!(plan.iter().any(|step| matches!(step, Step::WaitGrant { .. })), "calls wait");
        assert!(plan.iter().any(|step| matches!(step, Step::LoseAnswer)), "answers are lost");
        assert!(plan.iter().any(|step| matches!(step, Step::WallJump { .. })), "the daemon's clock jumps");
        assert!(plan.iter().any(|step| matches!(step, Step::RedisJump { .. })), "Redis's clock jumps");
        assert!(
            plan.iter().any(|step| matches!(step, Step::Failover { behind_ms } if *behind_ms > 0)),
            "a promoted primary's clock is behind"
        );
        // The pool's steps go between the steps drawn before the pool joined, which stay as they were.
        let quotas: Vec<Step> = plan
            .into_iter()
            .filter(|step| {
                !matches!(
                    step,
                    Step::Accept { .. }
                        | Step::Free { .. }
                        | Step::KeepAlloc { .. }
                        | Step::OpenSession { .. }
                        | Step::SessionGrant { .. }
                        | Step::KeepSession { .. }
                        | Step::CloseSession { .. }
                        | Step::Submit { .. }
                        | Step::Schedule
                        | Step::Report { .. }
                        | Step::WaitGrant { .. }
                        | Step::WaitRelease { .. }
                        | Step::LoseAnswer
                        | Step::WallJump { .. }
                        | Step::RedisJump { .. }
                        | Step::SubmitRun { .. }
                        | Step::Execute
                        | Step::ReportRun { .. }
                )
            })
            .map(|step| match step {
                Step::Failover { .. } => Step::Failover { behind_ms: 0 },
                step => step,
            })
            .collect();
        assert_eq!(quotas, draw_quotas(11, 400));
    }
}
