//! What the clients were told, and the invariants the daemon must keep with it.
//!
//! Every grant and alloc a client uses is, as far as its answers go, certainly held (with the
//! fencing number, units or CPUs and lease it was told), certainly gone (refused, released,
//! freed, or found missing), or in doubt (a call whose answer never came, or a call that may
//! undo it still running). The daemon must hold everything certainly held whose lease is
//! certainly running, never hold what is certainly gone (a released token or a freed alloc never
//! comes back), never be over a quota or a pool's capacity, hand out fencing numbers that only
//! grow, and keep its watch revisions growing, crashes or not.
//!
//! At length, as one thing: the model of what every client knows, and each check of the daemon
//! against it, kept together because every check reads the same knowledge.

use std::collections::{BTreeMap, BTreeSet};

use allot_api::{
    Alloc, AllocKeepaliveResponse, AllocList, AllocateResponse, Grant, GrantList, ReleaseResponse, Session,
    SessionList, Status, WaiterList,
};
use allot_core::apps::states::{AppState, TaskState};
use allot_core::Millis;
use axum::http::{Method, StatusCode};

use crate::plan::{Call, Report, RunAsks, Shape, APPS_PER_CLIENT, GANG_RESERVE_TIMEOUT_MS, PROJECT_CAP, SCOPE_CAP};
use crate::tenancy;

/// An invariant broken, said so that a person understands which.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation(pub String);

impl Violation {
    pub fn new(what: impl Into<String>) -> Violation {
        Violation(what.into())
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a client knows of one grant or alloc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Known {
    /// Held: `size` (units, or CPUs), `fencing` (grants), and a lease certainly running until
    /// `alive_until` (the simulation's time; `None`: no lease).
    Held { size: u64, fencing: u64, alive_until: Option<u64> },
    /// Never granted, refused, released, freed or found missing.
    Gone,
    /// A call whose outcome nobody was told.
    InDoubt,
}

/// One grant's or alloc's knowledge, and the calls on it still running that may make it
/// (`makers`: allocates) or end it (`enders`: releases, frees).
#[derive(Debug, Clone)]
struct Thing {
    known: Known,
    makers: u32,
    enders: u32,
    /// How many makers and enders were ever sent.
    makers_sent: u64,
    enders_sent: u64,
    /// The highest fencing number of the namespace answered before the last allocate was sent:
    /// a grant that allocate makes must be numbered above it.
    fencing_floor: u64,
    /// A grant's session (its index in [`Model::sessions`]), as its last allocate asked.
    session: Option<usize>,
    /// An alloc's keepalives: the earliest its lease may end by each (its send time plus the
    /// interval asked), and when it ended at the daemon (`None`: it may not have run yet).
    keeps: Vec<(u64, Option<u64>)>,
}

impl Default for Thing {
    fn default() -> Thing {
        let (makers_sent, enders_sent) = (0, 0);
        Thing {
            known: Known::Gone,
            makers: 0,
            enders: 0,
            makers_sent,
            enders_sent,
            fencing_floor: 0,
            session: None,
            keeps: Vec::new(),
        }
    }
}

/// The calls that may run beside a call, as it was sent: those of the other kind running then,
/// and, counted against the totals when it is answered, those sent during its life. Any of them
/// may be ordered after it, so its answer does not say what holds afterwards.
#[derive(Debug, Clone, Copy, Default)]
pub struct Overlap {
    makers: u32,
    enders: u32,
    makers_sent: u64,
    enders_sent: u64,
    /// The same for the closes of a grant's session.
    session_closes: u32,
    session_closes_sent: u64,
    /// What the client knew when it sent the call.
    known: Option<Known>,
    /// An alloc's keepalive: its place in [`Thing::keeps`].
    keep: Option<usize>,
}

/// What a call acts on, resolved when it is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Namespace `ns`'s token `token` of client `client`, in session number `session` of
    /// [`Model::sessions`] if given.
    Grant { ns: u8, client: u8, token: u8, session: Option<usize> },
    /// A new session.
    NewSession,
    /// Session number `index` of [`Model::sessions`].
    Session { index: usize },
    /// Application `app` (submitted, or to submit).
    App { app: String },
    /// Task `task` of application `app`.
    Task { app: String, task: String },
    /// A new alloc of pool `pool`.
    NewAlloc { pool: u8 },
    /// Pool `pool`'s alloc `id`.
    Alloc { pool: u8, id: String },
}

/// What every client was told.
#[derive(Debug)]
pub struct Model {
    shape: Shape,
    /// By (namespace, client, token).
    grants: BTreeMap<(u8, u8, u8), Thing>,
    /// By (pool, id).
    allocs: BTreeMap<(u8, String), Thing>,
    /// Each client's allocs, in the order it got them.
    owned: BTreeMap<u8, Vec<(u8, String)>>,
    /// Every session opened, in order, by id.
    sessions: Vec<(String, Thing)>,
    /// Each client's sessions (indexes in `sessions`).
    client_sessions: BTreeMap<u8, Vec<usize>>,
    /// Each application submitted (or perhaps submitted: its answer lost), and its tasks.
    apps: BTreeMap<String, u8>,
    /// The applications whose submission was acknowledged: each survives every crash, until
    /// the daemon's wall clock may have passed its retention since it ended.
    acknowledged_apps: BTreeSet<String>,
    /// The daemon's wall clock at the last reading.
    wall: Millis,
    /// For each application submitted: the last reading of the wall clock, and how far it moved
    /// forward in all since its submission was sent. It jumps back and forth; the daemon's
    /// applications' timers count every forward move between two opens as downtime and never go
    /// back, so the sum of the forward moves bounds how far they went.
    app_walls: BTreeMap<String, (Millis, Millis)>,
    /// The tasks whose report of their end (complete, fail) was acknowledged: each stays ended.
    ended_tasks: BTreeSet<(String, String)>,
    /// The tasks and applications the change feed told ended (by the executor's reports, the
    /// scheduler, the clients): an event is published once its change is durable, so each stays
    /// ended while its application is kept. The task's number tells it from a task added again
    /// under its id after its application was forgotten.
    published_ends: BTreeMap<(String, String), u64>,
    published_app_ends: BTreeSet<String>,
    /// The applications listed ended at some check: with those the feed told ended, the only
    /// ones the daemon may forget.
    seen_ended_apps: BTreeSet<String>,
    /// The highest fencing number a grant of each namespace was answered with.
    fencing: Vec<u64>,
    /// The highest watch revision seen.
    revision: u64,
}

impl Model {
    pub fn new(shape: Shape) -> Model {
        Model {
            shape,
            grants: BTreeMap::new(),
            allocs: BTreeMap::new(),
            owned: BTreeMap::new(),
            sessions: Vec::new(),
            client_sessions: BTreeMap::new(),
            apps: BTreeMap::new(),
            acknowledged_apps: BTreeSet::new(),
            wall: 0,
            app_walls: BTreeMap::new(),
            ended_tasks: BTreeSet::new(),
            published_ends: BTreeMap::new(),
            published_app_ends: BTreeSet::new(),
            seen_ended_apps: BTreeSet::new(),
            fencing: vec![0; usize::from(shape.namespaces)],
            revision: 0,
        }
    }

    pub fn namespace(ns: u8) -> String {
        format!("sim:ns{ns}")
    }

    pub fn pool(pool: u8) -> String {
        format!("sim-pool{pool}")
    }

    fn token_name(client: u8, token: u8) -> String {
        format!("c{client}-t{token}")
    }

    /// Whether `client`'s team may not use what `call` on `target` names (a submission: the seats
    /// of the first namespace its tasks ask for).
    fn forbidden(&self, client: u8, call: Call, target: &Target) -> bool {
        let team = tenancy::team(client);
        match target {
            Target::App { .. } => {
                matches!(call, Call::Submit { seats: true, .. }) && !tenancy::may_use_namespace(team, 0)
            }
            Target::Grant { ns, .. } => !tenancy::may_use_namespace(team, *ns),
            Target::NewAlloc { pool } | Target::Alloc { pool, .. } => !tenancy::may_use_pool(team, *pool),
            _ => false,
        }
    }

    fn thing(&mut self, target: &Target) -> Option<&mut Thing> {
        match target {
            Target::Grant { ns, client, token, .. } => Some(self.grants.entry((*ns, *client, *token)).or_default()),
            Target::NewAlloc { .. } | Target::NewSession | Target::App { .. } | Target::Task { .. } => None,
            Target::Session { index } => Some(&mut self.sessions[*index].1),
            Target::Alloc { pool, id } => Some(self.allocs.entry((*pool, id.clone())).or_default()),
        }
    }

    /// What `call` of `client` acts on, or `None` when there is nothing (no alloc to free).
    pub fn target(&self, client: u8, call: Call) -> Option<Target> {
        let owned = |alloc: u8| {
            let owned = self.owned.get(&client).filter(|owned| !owned.is_empty())?;
            let (pool, id) = &owned[usize::from(alloc) % owned.len()];
            Some(Target::Alloc { pool: *pool, id: id.clone() })
        };
        let session = |session: u8| {
            let sessions = self.client_sessions.get(&client).filter(|sessions| !sessions.is_empty())?;
            Some(sessions[usize::from(session) % sessions.len()])
        };
        let grant = |ns: u8, token: u8, session: Option<usize>| Target::Grant {
            ns: ns % self.shape.namespaces,
            client,
            token,
            session,
        };
        match call {
            Call::Allocate { ns, token, session: asked, .. } => Some(grant(ns, token, asked.and_then(session))),
            Call::Release { ns, token } | Call::Keepalive { ns, token } => Some(grant(ns, token, None)),
            Call::OpenSession { .. } => Some(Target::NewSession),
            Call::Submit { app, .. } => Some(Target::App { app: format!("a{client}-{}", app % APPS_PER_CLIENT) }),
            Call::Report { app, task, .. } => {
                let app = format!("a{client}-{}", app % APPS_PER_CLIENT);
                let tasks = *self.apps.get(&app)?;
                Some(Target::Task { task: format!("t{}", task % tasks), app })
            }
            Call::KeepSession { session: asked } | Call::CloseSession { session: asked } => {
                session(asked).map(|index| Target::Session { index })
            }
            Call::Accept { pool, .. } => Some(Target::NewAlloc { pool: pool % self.shape.pools }),
            Call::Free { alloc } | Call::KeepAlloc { alloc, .. } => owned(alloc),
        }
    }

    /// The HTTP call a client makes.
    pub fn request(&self, call: Call, target: &Target) -> (Method, String, Option<serde_json::Value>) {
        let path = match target {
            Target::Grant { ns, client, token, .. } => {
                format!("/v1/namespaces/{}/grants/{}", Model::namespace(*ns), Model::token_name(*client, *token))
            }
            Target::NewSession => "/v1/sessions".to_owned(),
            Target::App { .. } => "/v1/apps".to_owned(),
            Target::Task { app, task } => format!("/v1/apps/{app}/tasks/{task}"),
            Target::Session { index } => format!("/v1/sessions/{}", self.sessions[*index].0),
            Target::NewAlloc { pool } => format!("/v1/pools/{}/offers/1", Model::pool(*pool)),
            Target::Alloc { pool, id } => format!("/v1/pools/{}/allocs/{id}", Model::pool(*pool)),
        };
        match call {
            Call::Allocate { units, ttl_ms, wait_ms, scope, .. } => {
                let mut body = serde_json::json!({ "units": units });
                if let Some(scope) = scope {
                    body["scope"] = serde_json::json!({ "project": format!("p{}", scope / 2), "namespace": format!("n{}", scope % 2) });
                    body["caps"] = serde_json::json!({ "project": PROJECT_CAP, "namespace": SCOPE_CAP });
                }
                if let Some(ttl) = ttl_ms {
                    body["ttl_ms"] = ttl.into();
                }
                if let Some(wait) = wait_ms {
                    body["wait_ms"] = wait.into();
                }
                if let Target::Grant { session: Some(index), .. } = target {
                    body["session"] = self.sessions[*index].0.clone().into();
                }
                (Method::PUT, path, Some(body))
            }
            Call::Release { .. } | Call::Free { .. } | Call::CloseSession { .. } => (Method::DELETE, path, None),
            Call::Keepalive { .. } | Call::KeepSession { .. } => (Method::POST, format!("{path}/keepalive"), None),
            Call::OpenSession { ttl_ms } => (Method::POST, path, Some(serde_json::json!({ "ttl_ms": ttl_ms }))),
            Call::Submit { tasks, cpu, gang, seats, run, .. } => {
                let Target::App { app } = target else { unreachable!("a submission's target is its application") };
                let resources = format!("cpu={cpu}");
                let tokens = if seats {
                    serde_json::json!([{ "namespace": Model::namespace(0), "units": 1 }])
                } else {
                    serde_json::json!([])
                };
                let group = gang.then_some("gang");
                let tasks: Vec<_> = (0..tasks)
                    .map(|t| {
                        let asks = RunAsks::of(run);
                        let spec = serde_json::json!({
                            "type": "sim", "rounds": asks.rounds, "seat": asks.seat, "end": asks.end, "retries": 1,
                        });
                        serde_json::json!({
                            "id": format!("t{t}"), "resources": resources, "tokens": tokens, "group": group, "spec": spec,
                            "priority": asks.priority,
                        })
                    })
                    .collect();
                let mut body = serde_json::json!({ "id": app, "queue": "root.sim", "tasks": tasks });
                if gang {
                    // A gang its user's pools can never hold whole (team 1's, on one pool) waits
                    // this long to be reserved, then is scheduled as tasks.
                    body["policy"] = serde_json::json!({ "reserve_timeout_ms": GANG_RESERVE_TIMEOUT_MS });
                    body["task_groups"] = serde_json::json!([{
                        "name": "gang", "min_members": tasks.len(), "min_resources": resources, "tokens": tokens,
                    }]);
                }
                (Method::POST, path, Some(body))
            }
            Call::Report { report, .. } => (Method::POST, format!("{path}/{}", report.as_str()), None),
            Call::Accept { min, max, .. } => (
                Method::POST,
                path,
                Some(serde_json::json!({ "min": format!("cpu={min}"), "max": format!("cpu={max}") })),
            ),
            Call::KeepAlloc { interval_ms, .. } => {
                (Method::POST, format!("{path}/keepalive"), Some(serde_json::json!({ "interval_ms": interval_ms })))
            }
        }
    }

    /// A call is sent at `now`: until answered, what it may change is in doubt. Answers what
    /// may run beside it.
    /// The daemon's wall clock reads `wall` now.
    pub fn wall_reading(&mut self, wall: Millis) {
        self.wall = wall;
        for (last, forward) in self.app_walls.values_mut() {
            *forward = forward.saturating_add(wall.saturating_sub(*last));
            *last = wall;
        }
    }

    pub fn sent(&mut self, call: Call, target: &Target, now: u64) -> Overlap {
        if let (Call::Submit { .. }, Target::App { app }) = (call, target) {
            self.app_walls.entry(app.clone()).or_insert((self.wall, 0));
        }
        let (floor, session) = match target {
            Target::Grant { ns, session, .. } => (self.fencing[usize::from(*ns)], *session),
            _ => (0, None),
        };
        if let (Call::CloseSession { .. }, Target::Session { index }) = (call, target) {
            self.session_grants_in_doubt(*index);
        }
        let mut overlap = Overlap::default();
        if let Some(index) = session {
            let session = &self.sessions[index].1;
            (overlap.session_closes, overlap.session_closes_sent) = (session.enders, session.enders_sent);
        }
        let Some(thing) = self.thing(target) else { return overlap };
        let (makers, enders) = (thing.makers, thing.enders);
        overlap.known = Some(thing.known);
        match call {
            Call::Allocate { .. } => thing.makers_sent += 1,
            Call::Release { .. } | Call::Free { .. } | Call::CloseSession { .. } => thing.enders_sent += 1,
            _ => {}
        }
        (overlap.makers, overlap.enders) = (makers, enders);
        (overlap.makers_sent, overlap.enders_sent) = (thing.makers_sent, thing.enders_sent);
        match call {
            Call::Allocate { .. } => {
                thing.makers += 1;
                thing.fencing_floor = floor;
                thing.session = session;
                if thing.known == Known::Gone {
                    thing.known = Known::InDoubt;
                }
            }
            Call::Release { .. } | Call::Free { .. } | Call::CloseSession { .. } => {
                thing.enders += 1;
                if matches!(thing.known, Known::Held { .. }) {
                    thing.known = Known::InDoubt;
                }
            }
            // An alloc's keepalive sets its lease to the interval asked for, which may end it
            // sooner than the lease it has.
            Call::KeepAlloc { interval_ms, .. } => {
                let earliest = now + u64::from(interval_ms);
                if let Known::Held { alive_until: Some(until), size, fencing } = thing.known {
                    thing.known = Known::Held { size, fencing, alive_until: Some(until.min(earliest)) };
                }
                thing.keeps.push((earliest, None));
                overlap.keep = Some(thing.keeps.len() - 1);
            }
            Call::Keepalive { .. } | Call::Accept { .. } | Call::OpenSession { .. } | Call::KeepSession { .. } => {}
            Call::Submit { .. } | Call::Report { .. } => {}
        }
        overlap
    }

    /// Every application whose submission was acknowledged is among `listed`, unless it was
    /// seen ended and the daemon's wall clock moved forward by its retention since (an ended one
    /// is forgotten that long after its end by the applications' timers, which count the wall
    /// clock's forward jumps), and every task whose end was acknowledged is ended.
    pub fn apps_hold(&mut self, listed: &[(allot_api::App, Vec<allot_api::Task>)]) -> Result<(), Violation> {
        for (app, _) in listed {
            if AppState::ALL.iter().any(|state| state.name() == app.state && state.is_terminal()) {
                self.seen_ended_apps.insert(app.id.clone());
            }
        }
        let ids: BTreeSet<&str> = listed.iter().map(|(app, _)| app.id.as_str()).collect();
        let retention = allot_core::apps::SchedConfig::default().retention_ms;
        let may_be_forgotten = |app: &String| {
            let ended = self.seen_ended_apps.contains(app) || self.published_app_ends.contains(app);
            ended && self.app_walls.get(app).is_some_and(|(_, forward)| *forward >= retention)
        };
        let gone = self.acknowledged_apps.iter().find(|app| !ids.contains(app.as_str()) && !may_be_forgotten(app));
        if let Some(app) = gone {
            return Err(Violation::new(format!("application {app}, whose submission was acknowledged, is gone")));
        }
        for (app, tasks) in listed {
            let app_ended = AppState::ALL.iter().any(|state| state.name() == app.state && state.is_terminal());
            if !app_ended && self.published_app_ends.contains(&app.id) && !may_be_forgotten(&app.id) {
                return Err(Violation::new(format!(
                    "application {}, published as ended on the change feed, is {} again",
                    app.id, app.state
                )));
            }
            for task in tasks {
                let state = TaskState::ALL.iter().find(|state| state.name() == task.state);
                let ended = state.is_some_and(|state| state.is_terminal());
                let key = (app.id.clone(), task.id.clone());
                if !ended && self.ended_tasks.contains(&key) {
                    return Err(Violation::new(format!(
                        "task {}/{}, whose end was acknowledged, is {} again",
                        app.id, task.id, task.state
                    )));
                }
                if !ended && self.published_ends.get(&key) == Some(&task.seq) && !may_be_forgotten(&app.id) {
                    return Err(Violation::new(format!(
                        "task {}/{}, published as ended on the change feed, is {} again",
                        app.id, task.id, task.state
                    )));
                }
            }
        }
        Ok(())
    }

    /// An event the change feed gave the simulation's watcher: a task or an application it tells
    /// ended must stay so (the event is published once its change is durable, at the store's
    /// durability, whoever made it: the executor reporting a run's end, the scheduler, a client).
    pub fn published(&mut self, event: &allot_store::Event) {
        match &event.object {
            allot_store::EventObject::Task(task) if task.state.is_terminal() => {
                self.published_task_end(task.app.as_str(), task.spec.id.as_str(), task.seq);
            }
            allot_store::EventObject::App(app) if app.state.is_terminal() => {
                self.published_app_ends.insert(app.spec.id.to_string());
            }
            _ => {}
        }
    }

    /// The feed told task `task` (number `seq`) of application `app` ended.
    fn published_task_end(&mut self, app: &str, task: &str, seq: u64) {
        self.published_ends.insert((app.to_owned(), task.to_owned()), seq);
    }

    /// The grants held in session `index` may have ended with it.
    fn session_grants_in_doubt(&mut self, index: usize) {
        for grant in self.grants.values_mut().filter(|grant| grant.session == Some(index)) {
            if matches!(grant.known, Known::Held { .. }) {
                grant.known = Known::InDoubt;
            }
        }
    }

    /// The call's answer will not reach its client: what it may have changed stays in doubt.
    pub fn lost(&mut self, call: Call, target: &Target) {
        if let (Target::App { app }, Call::Submit { tasks, .. }) = (target, call) {
            self.apps.entry(app.clone()).or_insert(tasks);
        }
        if let Some(thing) = self.thing(target) {
            let ends = matches!(call, Call::Release { .. } | Call::Free { .. } | Call::CloseSession { .. });
            if ends || matches!(call, Call::Allocate { .. }) {
                thing.known = Known::InDoubt;
            }
        }
    }

    /// The call ended at the daemon (answered, or dropped with its connection).
    pub fn ended(&mut self, call: Call, target: &Target, overlap: &Overlap, now: u64) {
        let Some(thing) = self.thing(target) else { return };
        if let Some(keep) = overlap.keep.and_then(|keep| thing.keeps.get_mut(keep)) {
            keep.1 = Some(now);
        }
        match call {
            Call::Allocate { .. } => thing.makers -= 1,
            Call::Release { .. } | Call::Free { .. } | Call::CloseSession { .. } => thing.enders -= 1,
            _ => {}
        }
    }

    /// Client `client` learns the answer to `call` on `target`, sent at `sent_at` and answered
    /// at `now`, `overlap` what may have run beside it, checking it against what it knew.
    #[allow(clippy::too_many_arguments)]
    pub fn learn(
        &mut self,
        client: u8,
        call: Call,
        target: &Target,
        (sent_at, now): (u64, u64),
        overlap: Overlap,
        status: StatusCode,
        body: &[u8],
    ) -> Result<(), Violation> {
        let name = match target {
            Target::Grant { ns, client, token, .. } => {
                format!("{}/{}", Model::namespace(*ns), Model::token_name(*client, *token))
            }
            Target::NewSession => "a new session".to_owned(),
            Target::Session { index } => format!("session {}", self.sessions[*index].0),
            Target::App { app } => format!("application {app}"),
            Target::Task { app, task } => format!("task {app}/{task}"),
            Target::NewAlloc { pool } => format!("a new alloc of {}", Model::pool(*pool)),
            Target::Alloc { pool, id } => format!("{}/{id}", Model::pool(*pool)),
        };
        // A call on what the client's team may not use is refused, and changes nothing.
        let forbidden = self.forbidden(client, call, target);
        if status == StatusCode::FORBIDDEN && !forbidden {
            return Err(Violation::new(format!(
                "{name}: refused to {} as forbidden, though it may use it: {}",
                tenancy::user(tenancy::team(client)),
                String::from_utf8_lossy(body)
            )));
        }
        if status.is_success() && forbidden {
            return Err(Violation::new(format!(
                "{name}: {} may not use it, yet its call succeeded: {}",
                tenancy::user(tenancy::team(client)),
                String::from_utf8_lossy(body)
            )));
        }
        if let Target::NewAlloc { pool } = *target {
            if status == StatusCode::CREATED {
                let alloc: Alloc = parse(body)?;
                let thing = self.allocs.entry((pool, alloc.id.clone())).or_default();
                if thing.known != Known::Gone || thing.makers + thing.enders > 0 {
                    return Err(Violation::new(format!("{name}: id {} given again", alloc.id)));
                }
                thing.known = held_alloc(&alloc, sent_at)?;
                self.owned.entry(client).or_default().push((pool, alloc.id));
            }
            return Ok(());
        }
        if let (Target::App { app }, Call::Submit { tasks, .. }) = (target, call) {
            // Known from its first answer on (or from a lost one: it may exist), as submitted.
            if status.is_success() {
                self.apps.entry(app.clone()).or_insert(tasks);
                self.acknowledged_apps.insert(app.clone());
            }
            return Ok(());
        }
        if let Target::Task { app, task } = target {
            let ends = matches!(call, Call::Report { report: Report::Complete | Report::Fail, .. });
            if ends && status.is_success() {
                self.ended_tasks.insert((app.clone(), task.clone()));
            }
            return Ok(());
        }
        if *target == Target::NewSession {
            if status.is_success() {
                let session: Session = parse(body)?;
                let alive_until = Some(sent_at + session.expires_in_ms);
                let held = Thing { known: Known::Held { size: 0, fencing: 0, alive_until }, ..Thing::default() };
                self.sessions.push((session.id, held));
                self.client_sessions.entry(client).or_default().push(self.sessions.len() - 1);
            }
            return Ok(());
        }
        // A grant in a session lives at most as long as the session is certainly kept.
        let session_until = match target {
            Target::Grant { session: Some(index), .. } => match self.sessions[*index].1.known {
                Known::Held { alive_until, .. } => alive_until,
                _ => Some(sent_at),
            },
            _ => None,
        };
        let floor = self.thing(target).map_or(0, |thing| thing.fencing_floor);
        let before = self.thing(target).map_or(Known::Gone, |thing| thing.known);
        let held_grant = |grant: &Grant| {
            let lease = grant.expires_in_ms.map(|left| sent_at + left);
            let alive_until = match (lease, session_until) {
                (Some(lease), Some(session)) => Some(lease.min(session)),
                (lease, session) => lease.or(session),
            };
            Known::Held { size: grant.units, fencing: grant.fencing, alive_until }
        };
        let known = match (call, status) {
            (Call::Allocate { .. }, StatusCode::OK | StatusCode::CREATED) => {
                let answer: AllocateResponse = parse(body)?;
                match (answer.status, answer.grant) {
                    (Status::Granted, Some(grant)) => {
                        if answer.existing {
                            if let Known::Held { fencing, .. } = before {
                                if grant.fencing != fencing {
                                    return Err(Violation::new(format!(
                                        "{name}: asked again, the grant came back with fencing {} instead of {fencing}",
                                        grant.fencing
                                    )));
                                }
                            }
                        } else if grant.fencing <= floor {
                            return Err(Violation::new(format!(
                                "{name}: a new grant with fencing {}, asked for after one with {floor} was answered: \
                                 fencing numbers must grow",
                                grant.fencing
                            )));
                        }
                        if let Target::Grant { ns, .. } = target {
                            let highest = &mut self.fencing[usize::from(*ns)];
                            *highest = (*highest).max(grant.fencing);
                        }
                        held_grant(&grant)
                    }
                    (Status::Granted, None) => return Err(Violation::new(format!("{name}: granted without a grant"))),
                    _ => Known::Gone,
                }
            }
            (Call::Release { .. }, StatusCode::OK) => {
                let answer: ReleaseResponse = parse(body)?;
                if let Known::Held { alive_until: None, .. } = before {
                    if !answer.released {
                        return Err(Violation::new(format!("{name}: held without a lease, yet release found nothing")));
                    }
                }
                Known::Gone
            }
            (Call::Keepalive { .. }, StatusCode::OK) => {
                let grant: Grant = parse(body)?;
                kept_alive_what_was_there(before, &name)?;
                held_grant(&grant)
            }
            (Call::Free { .. }, StatusCode::OK) => Known::Gone,
            (Call::CloseSession { .. }, StatusCode::OK | StatusCode::NO_CONTENT) => {
                if let Target::Session { index } = target {
                    self.session_closed(*index);
                }
                Known::Gone
            }
            (Call::KeepSession { .. }, StatusCode::OK) => {
                let session: Session = parse(body)?;
                kept_alive_what_was_there(before, &name)?;
                Known::Held { size: 0, fencing: 0, alive_until: Some(sent_at + session.expires_in_ms) }
            }
            (Call::KeepAlloc { .. }, StatusCode::OK) => {
                let answer: AllocKeepaliveResponse = parse(body)?;
                kept_alive_what_was_there(before, &name)?;
                held_alloc(&answer.alloc, sent_at)?
            }
            (
                Call::Keepalive { .. }
                | Call::Free { .. }
                | Call::KeepAlloc { .. }
                | Call::KeepSession { .. }
                | Call::CloseSession { .. },
                StatusCode::NOT_FOUND,
            ) => {
                if let Known::Held { alive_until, .. } = before {
                    let ends = matches!(call, Call::Free { .. } | Call::CloseSession { .. });
                    if alive_until.is_none_or(|until| now < until) && !ends {
                        // A keepalive answered while the lease certainly ran must find it.
                        return Err(Violation::new(format!(
                            "{name}: its lease was running, yet a keepalive found nothing"
                        )));
                    }
                }
                Known::Gone
            }
            // A keepalive that failed changes nothing; any other failure leaves it in doubt.
            (Call::Keepalive { .. } | Call::KeepAlloc { .. } | Call::KeepSession { .. }, _) => before,
            // "Nothing was changed" (`store_unavailable`, `forbidden`): it is as it was when the call
            // was sent.
            _ if matches!(error_code(body).as_deref(), Some("store_unavailable" | "forbidden")) => {
                overlap.known.unwrap_or(Known::InDoubt)
            }
            _ => Known::InDoubt,
        };
        // A close of the grant's session that ran beside it may have ended it after.
        let session_closed = match target {
            Target::Grant { session: Some(index), .. } => {
                let session = &self.sessions[*index].1;
                overlap.session_closes > 0 || session.enders_sent > overlap.session_closes_sent
            }
            _ => false,
        };
        let Some(thing) = self.thing(target) else { return Ok(()) };
        // A call of the other kind that ran beside this one may have been ordered after it.
        let makers_beside = overlap.makers > 0 || thing.makers_sent > overlap.makers_sent;
        let enders_beside = overlap.enders > 0 || thing.enders_sent > overlap.enders_sent;
        let undone = match known {
            Known::Held { .. } => enders_beside || session_closed,
            Known::Gone => makers_beside,
            Known::InDoubt => false,
        };
        // Another keepalive of an alloc that ran beside this call may have been decided after it,
        // with a shorter interval.
        let known = match known {
            Known::Held { size, fencing, alive_until: Some(until) } => {
                let beside = thing.keeps.iter().enumerate().filter(|(index, (_, ended))| {
                    Some(*index) != overlap.keep && ended.is_none_or(|ended| ended >= sent_at)
                });
                let until = beside.map(|(_, (earliest, _))| *earliest).fold(until, u64::min);
                Known::Held { size, fencing, alive_until: Some(until) }
            }
            known => known,
        };
        thing.known = if undone { Known::InDoubt } else { known };
        Ok(())
    }

    /// A call that gives back each grant, alloc and session a client may hold.
    pub fn everything_held(&self) -> Vec<(u8, Call)> {
        let mut calls = Vec::new();
        for (&(ns, client, token), thing) in &self.grants {
            if thing.known != Known::Gone {
                calls.push((client, Call::Release { ns, token }));
            }
        }
        for (&client, owned) in &self.owned {
            for (alloc, (pool, id)) in owned.iter().enumerate() {
                if self.allocs.get(&(*pool, id.clone())).is_some_and(|thing| thing.known != Known::Gone) {
                    calls.push((client, Call::Free { alloc: alloc as u8 }));
                }
            }
        }
        for (&client, sessions) in &self.client_sessions {
            for (session, index) in sessions.iter().enumerate() {
                if self.sessions[*index].1.known != Known::Gone {
                    calls.push((client, Call::CloseSession { session: session as u8 }));
                }
            }
        }
        calls
    }

    /// Session `index` was closed: its grants ended with it, but those an allocate may yet make.
    fn session_closed(&mut self, index: usize) {
        for grant in self.grants.values_mut().filter(|grant| grant.session == Some(index)) {
            if grant.makers == 0 && grant.known != Known::InDoubt {
                grant.known = Known::Gone;
            }
        }
    }

    /// Checks a listing of the sessions, read at `now`.
    pub fn sessions_hold(&self, body: &[u8], now: u64) -> Result<(), Violation> {
        let list: SessionList = parse(body)?;
        let listed: BTreeMap<String, (u64, u64)> = list.sessions.iter().map(|s| (s.id.clone(), (0, 0))).collect();
        held_as_told("sessions", self.sessions.iter().map(|(id, thing)| (id.clone(), thing)), &listed, now)
    }

    /// The watch revision the daemon reads at now: it never goes back.
    pub fn revision(&mut self, revision: u64) -> Result<(), Violation> {
        if revision < self.revision {
            return Err(Violation::new(format!("the watch revision went back from {} to {revision}", self.revision)));
        }
        self.revision = revision;
        Ok(())
    }

    /// Checks a listing of namespace `ns`'s grants, read at `now`.
    pub fn grants_hold(&self, ns: u8, list: &GrantList, now: u64) -> Result<(), Violation> {
        let name = Model::namespace(ns);
        let units: u64 = list.grants.iter().map(|g| g.units).sum();
        if units > self.shape.quota {
            return Err(Violation::new(format!("{name} holds {units} units over its quota of {}", self.shape.quota)));
        }
        // Every scoped allocate names the same caps: no project or scope ever holds more.
        let mut projects: BTreeMap<&str, u64> = BTreeMap::new();
        let mut scopes: BTreeMap<(&str, &str), u64> = BTreeMap::new();
        for grant in &list.grants {
            if let Some(scope) = &grant.scope {
                *projects.entry(&scope.project).or_default() += grant.units;
                *scopes.entry((&scope.project, &scope.namespace)).or_default() += grant.units;
            }
        }
        if let Some((project, held)) = projects.into_iter().find(|(_, held)| *held > PROJECT_CAP) {
            return Err(Violation::new(format!(
                "{name}: project {project} holds {held} units over its cap of {PROJECT_CAP}"
            )));
        }
        if let Some(((project, scope), held)) = scopes.into_iter().find(|(_, held)| *held > SCOPE_CAP) {
            return Err(Violation::new(format!(
                "{name}: {project}/{scope} holds {held} units over its cap of {SCOPE_CAP}"
            )));
        }
        let listed: BTreeMap<String, (u64, u64)> =
            list.grants.iter().map(|g| (g.token.clone(), (g.units, g.fencing))).collect();
        let known = self.grants.range((ns, 0, 0)..=(ns, u8::MAX, u8::MAX));
        let known = known.map(|(&(_, client, token), thing)| (Model::token_name(client, token), thing));
        held_as_told(&name, known, &listed, now)
    }

    /// The waiters of namespace `ns` (a listing of them all, head first) wait rightly: first come,
    /// first served, and a waiter that fits is granted by the change that made room. Each is
    /// listed at its place with the units ahead of it; one held back by its scope's cap waits for
    /// its scope and holds no one up; the first that is not must not fit beside the grants (a
    /// listing of them), and everyone behind it waits for it.
    pub fn waiters_wait_rightly(&self, ns: u8, grants: &GrantList, waiters: &WaiterList) -> Result<(), Violation> {
        let granted: u64 = grants.grants.iter().map(|g| g.units).sum();
        let name = Model::namespace(ns);
        let mut ahead = 0u64;
        let mut held_up = false;
        for (index, waiter) in waiters.waiters.iter().enumerate() {
            if waiter.position != index as u64 + 1 || waiter.units_ahead != ahead {
                return Err(Violation::new(format!(
                    "{name}: waiter {} is listed at place {} with {} units ahead; it is at {} with {ahead}",
                    waiter.token,
                    waiter.position,
                    waiter.units_ahead,
                    index + 1
                )));
            }
            ahead = ahead.saturating_add(waiter.units);
            if held_up || waiter.blocked_by_cap.is_some() {
                continue;
            }
            if granted + waiter.units <= self.shape.quota {
                return Err(Violation::new(format!(
                    "{name}: waiter {} at place {} ({} units) fits ({granted} of {} granted), and no one \
                     ahead of it holds it up, yet it waits",
                    waiter.token,
                    index + 1,
                    waiter.units,
                    self.shape.quota
                )));
            }
            held_up = true;
        }
        Ok(())
    }

    /// Checks a listing of pool `pool`'s allocs, read at `now`.
    pub fn allocs_hold(&self, pool: u8, body: &[u8], now: u64) -> Result<(), Violation> {
        let list: AllocList = parse(body)?;
        let name = Model::pool(pool);
        let mut listed = BTreeMap::new();
        let mut cpus = 0;
        for alloc in list.allocs.iter().filter(|alloc| alloc.ended.is_none()) {
            let size = cpus_of(&alloc.resources)?;
            cpus += size;
            listed.insert(alloc.id.clone(), (size, 0));
        }
        if cpus > self.shape.cpus {
            return Err(Violation::new(format!("{name} holds allocs of {cpus} CPUs over its {}", self.shape.cpus)));
        }
        let known = self.allocs.range((pool, String::new())..(pool + 1, String::new()));
        held_as_told(&name, known.map(|((_, id), thing)| (id.clone(), thing)), &listed, now)
    }
}

/// Everything told held, with its lease running, is listed as told (`listed`: size and fencing
/// by name); nothing told gone is.
fn held_as_told<'a>(
    owner: &str,
    known: impl Iterator<Item = (String, &'a Thing)>,
    listed: &BTreeMap<String, (u64, u64)>,
    now: u64,
) -> Result<(), Violation> {
    for (name, thing) in known {
        match (thing.known, listed.get(&name)) {
            (Known::Held { size, fencing, alive_until }, found) if alive_until.is_none_or(|until| now < until) => {
                match found {
                    None => {
                        return Err(Violation::new(format!("{owner}/{name}: held as its client was told, lease running, but gone")))
                    }
                    Some(&(held_size, held_fencing)) if held_size != size || held_fencing != fencing => {
                        return Err(Violation::new(format!(
                            "{owner}/{name}: told {size} with fencing {fencing}, held as {held_size} with {held_fencing}"
                        )))
                    }
                    Some(_) => {}
                }
            }
            (Known::Gone, Some(_)) => {
                return Err(Violation::new(format!("{owner}/{name}: its client was told it is gone, yet it is held")))
            }
            _ => {}
        }
    }
    Ok(())
}

/// An alloc as its client knows it: its CPUs, and its lease certainly running until the time the
/// call was sent plus what the answer says is left.
fn held_alloc(alloc: &Alloc, sent_at: u64) -> Result<Known, Violation> {
    let left = alloc.expires_in_ms.unwrap_or(0);
    let alive_until = u64::try_from(left).ok().map(|left| sent_at + left).unwrap_or(sent_at);
    Ok(Known::Held { size: cpus_of(&alloc.resources)?, fencing: 0, alive_until: Some(alive_until) })
}

/// The CPUs of a resource text such as `cpu=3`.
pub(crate) fn cpus_of(resources: &str) -> Result<u64, Violation> {
    resources.split(',').find_map(|part| part.strip_prefix("cpu=")).map_or(Ok(0), |cpus| {
        cpus.parse().map_err(|_| Violation::new(format!("resources that do not read: {resources}")))
    })
}

/// A keepalive that found its grant, alloc or session: its client must not have been told it
/// is gone (nothing comes back once released, freed or closed).
fn kept_alive_what_was_there(before: Known, name: &str) -> Result<(), Violation> {
    match before {
        Known::Gone => {
            Err(Violation::new(format!("{name}: a keepalive found it, though its client was told it is gone")))
        }
        _ => Ok(()),
    }
}

/// The `code` of an error answer.
fn error_code(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<allot_api::ErrorBody>(body).ok().map(|error| error.error.code)
}

pub(crate) fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Violation> {
    serde_json::from_slice(body).map_err(|err| {
        Violation::new(format!("an answer that does not read: {err}: {}", String::from_utf8_lossy(body)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(token: &str, units: u64, fencing: u64) -> serde_json::Value {
        serde_json::json!({ "namespace": "sim:ns0", "token": token, "units": units, "fencing": fencing })
    }

    fn listed_app(state: &str, task_state: &str, seq: u64) -> (allot_api::App, Vec<allot_api::Task>) {
        let app = serde_json::json!({
            "id": "c0-a0", "queue": "root.sim", "user": "c0", "tags": {}, "state": state,
            "task_groups": [], "policy": {}, "tasks": {}, "placeholders": [],
            "placeholders_expire_in_ms": null, "waiting": null, "reason": null,
        });
        let task = serde_json::json!({
            "app": "c0-a0", "id": "t0", "seq": seq, "state": task_state, "resources": "cpu=1",
            "tokens": [], "group": null, "priority": 0, "selector": {}, "spec": null,
            "placement": null, "waiting": null, "reason": null,
        });
        (serde_json::from_value(app).unwrap(), vec![serde_json::from_value(task).unwrap()])
    }

    /// What the change feed told ended (an executor's report, say) stays ended: a task or an
    /// application listed as running again is a violation; a task of another number under the
    /// same id (added again after its application was forgotten) is not that task.
    #[test]
    fn a_task_or_application_the_feed_told_ended_and_listed_running_again_is_a_violation() {
        let mut model = Model::new(Shape::default());
        assert!(model.apps_hold(&[listed_app("Running", "Running", 7)]).is_ok());
        model.published_task_end("c0-a0", "t0", 7);
        assert!(model.apps_hold(&[listed_app("Running", "Completed", 7)]).is_ok());
        let err = model.apps_hold(&[listed_app("Running", "Running", 7)]).unwrap_err();
        assert!(err.to_string().contains("task c0-a0/t0, published as ended on the change feed, is Running again"));
        assert!(model.apps_hold(&[listed_app("Running", "Running", 8)]).is_ok());
        model.published_app_ends.insert("c0-a0".to_owned());
        assert!(model.apps_hold(&[listed_app("Completed", "Completed", 7)]).is_ok());
        let err = model.apps_hold(&[listed_app("Running", "Completed", 7)]).unwrap_err();
        assert!(err.to_string().contains("application c0-a0, published as ended on the change feed, is Running again"));
    }

    #[test]
    fn a_grant_told_held_and_missing_or_told_released_and_held_is_a_violation() {
        let shape = Shape::default();
        let mut model = Model::new(shape);
        let call =
            Call::Allocate { ns: 0, token: 1, units: 2, ttl_ms: None, session: None, wait_ms: None, scope: None };
        let target = model.target(2, call).unwrap();
        let overlap = model.sent(call, &target, 0);
        model.ended(call, &target, &overlap, 0);
        let answer = serde_json::json!({ "status": "Granted", "grant": grant("c2-t1", 2, 5), "existing": false });
        model.learn(2, call, &target, (0, 0), overlap, StatusCode::OK, answer.to_string().as_bytes()).unwrap();
        let empty = serde_json::json!({ "grants": [] }).to_string();
        let held = serde_json::json!({ "grants": [grant("c2-t1", 2, 5)] }).to_string();
        assert!(model.grants_hold(0, &parse(held.as_bytes()).unwrap(), 10).is_ok());
        let gone = model.grants_hold(0, &parse(empty.as_bytes()).unwrap(), 10).unwrap_err();
        assert!(gone.0.contains("c2-t1"), "{gone}");

        let release = Call::Release { ns: 0, token: 1 };
        let overlap = model.sent(release, &target, 20);
        model.ended(release, &target, &overlap, 20);
        let released = serde_json::json!({ "released": true }).to_string();
        model.learn(2, release, &target, (20, 20), overlap, StatusCode::OK, released.as_bytes()).unwrap();
        assert!(model.grants_hold(0, &parse(empty.as_bytes()).unwrap(), 30).is_ok());
        let back = model.grants_hold(0, &parse(held.as_bytes()).unwrap(), 30).unwrap_err();
        assert!(back.0.contains("told it is gone"), "{back}");
    }

    #[test]
    fn a_forbidden_call_that_succeeds_or_a_permitted_one_refused_as_forbidden_is_a_violation() {
        let mut model = Model::new(Shape::default());
        let call =
            Call::Allocate { ns: 0, token: 0, units: 1, ttl_ms: None, session: None, wait_ms: None, scope: None };
        let forbidden = serde_json::json!({ "error": { "code": "forbidden", "message": "no" } }).to_string();
        let granted = serde_json::json!({ "status": "Granted", "grant": grant("c1-t0", 1, 1), "existing": false });
        let mut answer = |client: u8, status: StatusCode, body: &[u8]| {
            let target = model.target(client, call).unwrap();
            let overlap = model.sent(call, &target, 0);
            model.ended(call, &target, &overlap, 0);
            model.learn(client, call, &target, (0, 0), overlap, status, body)
        };
        // Client 1 is of team 1, which may not use namespace 0; client 0 is of team 0, which may.
        assert!(answer(1, StatusCode::FORBIDDEN, forbidden.as_bytes()).is_ok());
        let err = answer(1, StatusCode::OK, granted.to_string().as_bytes()).unwrap_err();
        assert!(err.0.contains("team1 may not use it"), "{err}");
        let err = answer(0, StatusCode::FORBIDDEN, forbidden.as_bytes()).unwrap_err();
        assert!(err.0.contains("refused to team0 as forbidden"), "{err}");
    }

    fn waiter(position: u64, units_ahead: u64, token: &str, units: u64, capped: bool) -> serde_json::Value {
        let mut waiter = serde_json::json!({
            "position": position, "units_ahead": units_ahead, "token": token, "units": units, "waited_ms": 0
        });
        if capped {
            waiter["blocked_by_cap"] = "namespace".into();
        }
        waiter
    }

    #[test]
    fn a_waiter_that_fits_and_is_held_up_by_no_one_is_a_violation_wherever_it_stands() {
        let model = Model::new(Shape { quota: 4, ..Shape::default() });
        let grants = serde_json::json!({ "grants": [grant("a", 3, 1)] }).to_string();
        let list = |waiters: Vec<serde_json::Value>| serde_json::json!({ "waiters": waiters }).to_string();
        let grants = parse(grants.as_bytes()).unwrap();
        let check = |waiters| model.waiters_wait_rightly(0, &grants, &parse(list(waiters).as_bytes()).unwrap());
        // Behind a waiter held back by its cap, one that fits waits: wrong.
        let err = check(vec![waiter(1, 0, "capped", 1, true), waiter(2, 1, "fits", 1, false)]).unwrap_err();
        assert!(err.0.contains("fits") && err.0.contains("place 2"), "{err}");
        // Behind one the quota holds back, any waiter waits, even one that fits.
        assert!(check(vec![waiter(1, 0, "big", 2, false), waiter(2, 2, "small", 1, false)]).is_ok());
        // A place or the units ahead listed wrong.
        let err = check(vec![waiter(1, 0, "big", 2, false), waiter(3, 2, "small", 1, false)]).unwrap_err();
        assert!(err.0.contains("listed at place 3"), "{err}");
        let err = check(vec![waiter(1, 0, "big", 2, false), waiter(2, 1, "small", 1, false)]).unwrap_err();
        assert!(err.0.contains("1 units ahead"), "{err}");
    }

    #[test]
    fn over_the_quota_and_a_fencing_number_that_does_not_grow_are_violations() {
        let mut model = Model::new(Shape { quota: 3, ..Shape::default() });
        let over = serde_json::json!({ "grants": [grant("a", 2, 1), grant("b", 2, 2)] }).to_string();
        assert!(model.grants_hold(0, &parse(over.as_bytes()).unwrap(), 0).unwrap_err().0.contains("over its quota"));

        let first =
            Call::Allocate { ns: 0, token: 0, units: 1, ttl_ms: None, session: None, wait_ms: None, scope: None };
        let target = model.target(0, first).unwrap();
        let overlap = model.sent(first, &target, 0);
        model.ended(first, &target, &overlap, 0);
        let answer = serde_json::json!({ "status": "Granted", "grant": grant("c0-t0", 1, 7), "existing": false });
        model.learn(0, first, &target, (0, 0), overlap, StatusCode::OK, answer.to_string().as_bytes()).unwrap();
        let second =
            Call::Allocate { ns: 0, token: 1, units: 1, ttl_ms: None, session: None, wait_ms: None, scope: None };
        let target = model.target(0, second).unwrap();
        let overlap = model.sent(second, &target, 1);
        model.ended(second, &target, &overlap, 1);
        let stale = serde_json::json!({ "status": "Granted", "grant": grant("c0-t1", 1, 7), "existing": false });
        let err =
            model.learn(0, second, &target, (1, 1), overlap, StatusCode::OK, stale.to_string().as_bytes()).unwrap_err();
        assert!(err.0.contains("fencing numbers must grow"), "{err}");
    }
}
