//! A run's plan: the steps a seed draws, each a choice the simulation makes (who calls what,
//! which call goes on, what fails, how much time passes). A step names what it acts on by a
//! number taken modulo what there is when it runs, so any subsequence of a plan is a plan too:
//! what shrinking a failing run needs.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::disk::Fault;

/// The shape of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Steps drawn.
    pub steps: usize,
    /// Clients calling the daemon, each with one call in flight at most.
    pub clients: u8,
    /// Namespaces, each of [`Shape::quota`] units.
    pub namespaces: u8,
    /// Each namespace's quota.
    pub quota: u64,
    /// Tokens per client and namespace.
    pub tokens: u8,
    /// Pools, each of [`Shape::cpus`] CPUs.
    pub pools: u8,
    /// Each pool's capacity, in CPUs.
    pub cpus: u64,
}

impl Default for Shape {
    fn default() -> Shape {
        Shape { steps: 300, clients: 6, namespaces: 2, quota: 5, tokens: 3, pools: 2, cpus: 8 }
    }
}

/// A call a client makes, over HTTP to the daemon's real handlers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// `PUT /v1/namespaces/{ns}/grants/{token}`, with a lease of `ttl_ms` if given, or in the
    /// client's session number `session` (modulo those it knows of; none if it knows none),
    /// waiting up to `wait_ms` for room if given.
    /// With `scope`, the grant is held by project `p{scope / 2}`'s namespace `n{scope % 2}`,
    /// under the caps [`PROJECT_CAP`] and [`SCOPE_CAP`].
    Allocate {
        ns: u8,
        token: u8,
        units: u8,
        ttl_ms: Option<u32>,
        session: Option<u8>,
        wait_ms: Option<u32>,
        scope: Option<u8>,
    },
    /// `DELETE /v1/namespaces/{ns}/grants/{token}`.
    Release { ns: u8, token: u8 },
    /// `POST /v1/namespaces/{ns}/grants/{token}/keepalive`.
    Keepalive { ns: u8, token: u8 },
    /// `POST /v1/pools/{pool}/offers/1`: an alloc of `min` to `max` CPUs.
    Accept { pool: u8, min: u8, max: u8 },
    /// `DELETE /v1/pools/{pool}/allocs/{id}` of the client's alloc number `alloc` (modulo those it
    /// knows of).
    Free { alloc: u8 },
    /// `POST /v1/pools/{pool}/allocs/{id}/keepalive` of the client's alloc number `alloc`,
    /// asking for a lease of `interval_ms`.
    KeepAlloc { alloc: u8, interval_ms: u32 },
    /// `POST /v1/sessions` with a lease of `ttl_ms`.
    OpenSession { ttl_ms: u32 },
    /// `POST /v1/sessions/{id}/keepalive` of the client's session number `session`.
    KeepSession { session: u8 },
    /// `DELETE /v1/sessions/{id}` of the client's session number `session`: its grants end.
    CloseSession { session: u8 },
    /// `POST /v1/apps`: the client's application number `app` (of [`APPS_PER_CLIENT`]), of
    /// `tasks` tasks of `cpu` CPUs each, a gang of all of them if `gang`, each task also holding
    /// a unit of the first namespace if `seats`; the executor runs each task with the simulation's
    /// plugin as `run` says ([`RunAsks::of`]).
    Submit { app: u8, tasks: u8, cpu: u8, gang: bool, seats: bool, run: u8 },
    /// `POST /v1/apps/{app}/tasks/{task}/{report}` on the client's application number `app`
    /// (modulo those it submitted) and its task number `task`.
    Report { app: u8, task: u8, report: Report },
}

/// The cap every scoped allocate names for its project, and for its project's namespace.
pub const PROJECT_CAP: u64 = 5;
pub const SCOPE_CAP: u64 = 3;

/// How long a gang waits to be reserved before its tasks are scheduled one by one.
pub const GANG_RESERVE_TIMEOUT_MS: u64 = 30_000;

/// The applications each client submits at most: submitting one again is idempotent.
pub const APPS_PER_CLIENT: u8 = 2;

/// What a task's plugin does (the simulation's, `plugin.rs`): its rounds, whether it holds one of the
/// plugin's seats through them, and how it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunAsks {
    pub rounds: u8,
    pub seat: bool,
    pub end: &'static str,
    /// The task's priority: a task of a higher one preempts one of a lower one (the queue's
    /// `preemption_delay` is short).
    pub priority: i32,
}

impl RunAsks {
    /// One to three rounds; a seat half the time; ends well half the time, else retried or
    /// failed for good; a priority of 0, 1 or 2.
    pub fn of(run: u8) -> RunAsks {
        let end = match (run / 6) % 4 {
            2 => "retry",
            3 => "fail",
            _ => "ok",
        };
        RunAsks { rounds: 1 + run % 3, seat: (run / 3) % 2 == 1, end, priority: i32::from((run / 24) % 3) }
    }
}

/// What a task's runner reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    Start,
    Complete,
    Fail,
}

impl Report {
    pub fn as_str(self) -> &'static str {
        match self {
            Report::Start => "start",
            Report::Complete => "complete",
            Report::Fail => "fail",
        }
    }
}

/// One step of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Client `client` (modulo the clients) sends `call`, unless a call of its is in flight.
    Send { client: u8, call: Call },
    /// The daemon works on call `pick` (modulo those in flight); an answer ready reaches its client.
    Poll { pick: u16 },
    /// The network between call `pick`'s client and the daemon breaks: the answer never arrives.
    /// With `abandon`, the daemon drops the call too (its connection closed mid-way).
    Cut { pick: u16, abandon: bool },
    /// The network between client `client` (modulo the clients) and the daemon breaks, until
    /// healed: every call it sends meanwhile is lost on the way (the client cannot tell whether
    /// it arrived), and so is every answer due to it (its keepalives stop arriving).
    Partition { client: u8 },
    /// The network between client `client` and the daemon works again.
    Heal { client: u8 },
    /// Background work of the store: the syncer, the checkpointer, the sweeper.
    Work(Work),
    /// Time passes.
    Advance { ms: u32 },
    /// The wall clock jumps (back when negative); the monotonic one does not.
    WallJump { ms: i32 },
    /// The disk's next operation of the kind fails.
    Fail(Fault),
    /// The daemon is killed and started again; with `power`, the machine lost power: what was not
    /// synced is lost but for a torn share (`torn` thousandths) of it.
    Crash { power: bool, torn: u16 },
}

/// The store's background work, each run when the plan says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    Sync,
    Checkpoint,
    Sweep,
    /// The scheduler's cycle.
    Schedule,
    /// The executor's turn: it runs until it waits (for the store, a timer, or a wake-up).
    Execute,
}

/// The steps of `seed`'s run.
pub fn draw(seed: u64, shape: Shape) -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..shape.steps).map(|_| step(&mut rng, shape)).collect()
}

fn step(rng: &mut StdRng, shape: Shape) -> Step {
    match rng.gen_range(0..100) {
        0..=29 => Step::Send { client: rng.gen_range(0..shape.clients), call: call(rng, shape) },
        30..=55 => Step::Poll { pick: rng.gen() },
        56..=59 => Step::Work(Work::Execute),
        60..=62 => Step::Cut { pick: rng.gen(), abandon: rng.gen() },
        63..=72 => Step::Work(Work::Sync),
        73..=75 => Step::Work(Work::Checkpoint),
        76..=79 => Step::Work(Work::Sweep),
        80..=82 => Step::Work(Work::Schedule),
        83..=89 => Step::Advance { ms: *[1, 10, 100, 1_000, 5_000].get(rng.gen_range(0..5)).expect("in range") },
        90 => Step::Partition { client: rng.gen_range(0..shape.clients) },
        91 => Step::Heal { client: rng.gen_range(0..shape.clients) },
        92..=93 => Step::WallJump { ms: rng.gen_range(-3_600_000..3_600_000) },
        94..=96 => Step::Fail(if rng.gen() { Fault::Write } else { Fault::Sync }),
        _ => Step::Crash { power: rng.gen_bool(0.5), torn: rng.gen_range(0..=1000) },
    }
}

fn call(rng: &mut StdRng, shape: Shape) -> Call {
    let ns = rng.gen_range(0..shape.namespaces);
    let token = rng.gen_range(0..shape.tokens);
    if rng.gen_bool(0.15) {
        return match rng.gen_range(0..10) {
            0..=3 => Call::Submit {
                app: rng.gen_range(0..APPS_PER_CLIENT),
                tasks: rng.gen_range(1..=3),
                cpu: rng.gen_range(1..=3),
                gang: rng.gen_bool(0.5),
                seats: rng.gen_bool(0.3),
                run: rng.gen(),
            },
            4..=5 => Call::Report { app: rng.gen(), task: rng.gen(), report: Report::Start },
            6..=8 => Call::Report { app: rng.gen(), task: rng.gen(), report: Report::Complete },
            _ => Call::Report { app: rng.gen(), task: rng.gen(), report: Report::Fail },
        };
    }
    if rng.gen_bool(0.1) {
        return match rng.gen_range(0..10) {
            0..=3 => Call::OpenSession { ttl_ms: rng.gen_range(1_000..20_000) },
            4..=7 => Call::KeepSession { session: rng.gen() },
            _ => Call::CloseSession { session: rng.gen() },
        };
    }
    if rng.gen_bool(0.3) {
        return match rng.gen_range(0..10) {
            0..=4 => {
                let min = rng.gen_range(1..=3);
                Call::Accept { pool: rng.gen_range(0..shape.pools), min, max: min + rng.gen_range(0..=2) }
            }
            5..=6 => Call::Free { alloc: rng.gen() },
            _ => Call::KeepAlloc { alloc: rng.gen(), interval_ms: rng.gen_range(1_000..30_000) },
        };
    }
    match rng.gen_range(0..10) {
        0..=4 => {
            let session = rng.gen_bool(0.4).then(|| rng.gen());
            Call::Allocate {
                ns,
                token,
                units: rng.gen_range(1..=3),
                ttl_ms: (session.is_none() && rng.gen_bool(0.5)).then(|| rng.gen_range(500..20_000)),
                session,
                wait_ms: rng.gen_bool(0.5).then(|| rng.gen_range(0..10_000)),
                scope: rng.gen_bool(0.4).then(|| rng.gen_range(0..4)),
            }
        }
        5..=8 => Call::Release { ns, token },
        _ => Call::Keepalive { ns, token },
    }
}
