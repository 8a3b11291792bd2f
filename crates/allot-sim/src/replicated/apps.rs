//! The applications part of the Redis-shaped run: clients submit applications and report their
//! tasks over the real server's handlers, and the daemon schedules in turns the plan gives
//! (`testing::schedule_once`: its lease renewed, then one round, on the simulation's clock), so a
//! lease that lapses between turns, a new term that loads the records, and a failover that loses
//! the scheduler's last writes all happen at points the seed decides. Checked after every step,
//! whenever the daemon can list the applications (it schedules): nothing placed twice, every
//! placement on an alloc the pool holds, a gang held all or nothing (`crate::apps`), the pool never
//! over its capacity, and every submission acknowledged (and not at risk) still there; after a
//! turn that scheduled, every application whose tasks all ended has ended.

use std::collections::{BTreeMap, BTreeSet};

use allot_api::{AllocList, App, AppList, Task, TaskList};
use allot_store::prelude::*;
use allot_store::AppsHome;
use allot_store_redis::testing::schedule_once;
use axum::http::{Method, StatusCode};
use rand::rngs::StdRng;
use rand::Rng;

use super::exec::{exec_only, EXEC_CAPACITY, EXEC_POOL};
use super::{code_of, Grip, Known, Sim, Step};
use crate::check::{cpus_of, parse, Violation};
use crate::plan::Report;

/// The applications' pool and its CPUs: apart from the clients' allocs, so the plans drawn
/// before the applications joined meet the pool they met then.
const APPS_POOL: &str = "sim-apool";
const APPS_CAPACITY: u64 = 4;
/// What the applications' tasks select: the applications' pool alone.
fn apps_only() -> serde_json::Value {
    serde_json::json!({ "for": "apps" })
}

/// How long a gang waits to be reserved before its tasks are scheduled one by one.
const RESERVE_TIMEOUT_MS: u64 = 5_000;

/// One step of the applications' part.
pub(super) fn draw_step(rng: &mut StdRng) -> Step {
    let (client, app) = (rng.gen_range(0..super::CLIENTS), rng.gen_range(0..APPS_PER_CLIENT));
    match rng.gen_range(0..10) {
        0..3 => Step::Submit {
            client,
            app,
            tasks: rng.gen_range(1..=3),
            cpu: rng.gen_range(1..=2),
            gang: rng.gen_bool(0.3),
            priority: rng.gen_range(0..=2),
        },
        3..6 => Step::Schedule,
        6..7 => Step::Report { client, app, task: rng.gen(), report: Report::Start },
        7..9 => Step::Report { client, app, task: rng.gen(), report: Report::Complete },
        _ => Step::Report { client, app, task: rng.gen(), report: Report::Fail },
    }
}

/// The applications each client submits at most (one submitted again with another shape is
/// refused as a conflict).
const APPS_PER_CLIENT: u8 = 4;

fn task_ended(state: &str) -> bool {
    matches!(state, "Completed" | "Failed" | "Killed" | "Rejected")
}

fn app_id(client: u8, app: u8) -> String {
    format!("a{client}-{}", app % APPS_PER_CLIENT)
}

impl Sim {
    /// The applications' pool and queue, made through the scheduler: the daemon takes its first
    /// turn for them.
    pub(super) async fn start_apps(&mut self) {
        let path = format!("/v1/pools/{APPS_POOL}");
        let body = serde_json::json!({ "capacity": format!("cpu={APPS_CAPACITY}"), "labels": { "for": "apps" } });
        let (status, _) = self.call(Method::PUT, path, Some(body)).await;
        assert!(status.is_success(), "the applications' pool is made ({status})");
        let path = format!("/v1/pools/{EXEC_POOL}");
        let body = serde_json::json!({ "capacity": format!("cpu={EXEC_CAPACITY}"), "labels": exec_only() });
        let (status, _) = self.call(Method::PUT, path, Some(body)).await;
        assert!(status.is_success(), "the executor's pool is made ({status})");
        self.schedule().await.expect("the first turn of scheduling");
        let queue = serde_json::json!({ "preemption_delay_ms": 0 });
        let (status, body) = self.call(Method::PUT, "/v1/queues/root.sim".to_owned(), Some(queue)).await;
        assert!(status.is_success(), "the queue is made: {status} {}", String::from_utf8_lossy(&body));
    }

    /// A submission of `tasks` tasks of `cpu` CPUs, a gang or not, of `priority`.
    pub(super) async fn submit(
        &mut self,
        client: u8,
        app: u8,
        (tasks, cpu, gang, priority): (u8, u8, bool, u8),
    ) -> Result<String, Violation> {
        let id = app_id(client, app);
        let resources = format!("cpu={cpu}");
        let specs: Vec<_> = (0..tasks)
            .map(|t| {
                let group = gang.then_some("gang");
                serde_json::json!({ "id": format!("t{t}"), "resources": resources, "group": group, "selector": apps_only() })
            })
            .collect();
        let mut body = serde_json::json!({ "id": id, "queue": "root.sim", "tasks": specs, "priority": priority });
        if gang {
            body["policy"] = serde_json::json!({ "reserve_timeout_ms": RESERVE_TIMEOUT_MS });
            body["task_groups"] = serde_json::json!([{ "name": "gang", "min_members": tasks, "min_resources": resources, "selector": apps_only() }]);
        }
        self.submit_body(id, body).await
    }

    /// `POST /v1/apps` of application `id`: what its client learns of it.
    pub(super) async fn submit_body(&mut self, id: String, body: serde_json::Value) -> Result<String, Violation> {
        let (status, body) = self.call(Method::POST, "/v1/apps".to_owned(), Some(body)).await;
        let at_risk = self.acknowledged_at_risk();
        let grip = self.model.apps.entry(id.clone()).or_insert(Grip { known: Known::Gone, at_risk: false });
        if status.is_success() {
            let answer: serde_json::Value = parse(&body)?;
            let submitted: App = serde_json::from_value(answer["app"].clone())
                .map_err(|err| Violation::new(format!("a submission's answer without its application: {err}")))?;
            // Submitted again, it is the first submission's (idempotent by id).
            if !matches!(grip.known, Known::Held { .. }) {
                let tasks = submitted.tasks.values().sum();
                *grip = Grip { known: Known::Held { units: tasks, fencing: 0, until: u64::MAX }, at_risk };
            }
            return Ok(format!("{} {id} {}", status.as_u16(), submitted.state));
        }
        if code_of(&body) == "store_outcome_unknown" && !matches!(grip.known, Known::Held { .. }) {
            *grip = Grip { known: Known::InDoubt, at_risk: self.pair.cut.is_some() };
        }
        Ok(format!("{} {}", status.as_u16(), code_of(&body)))
    }

    /// The daemon's turn: what it then says of where the scheduler is. A turn that scheduled
    /// has ended every application whose tasks all ended (checked with the step's listing,
    /// `check_apps`).
    /// Every daemon takes its turn, as their tasks would at that time; the one that holds the
    /// lease schedules.
    pub(super) async fn schedule(&mut self) -> Result<String, Violation> {
        self.renew_executor().await?;
        let mut said = Vec::new();
        for (index, daemon) in self.daemons.iter().enumerate() {
            let Some(daemon) = daemon else { continue };
            schedule_once(&daemon.store, &daemon.holder).await;
            said.push(match daemon.store.apps_home() {
                AppsHome::Here => {
                    self.turn_scheduled = true;
                    format!("daemon {index} schedules")
                }
                AppsHome::At(_) => format!("daemon {index}: another holds the lease"),
                AppsHome::Unknown => format!("daemon {index}: no scheduler known"),
            });
        }
        Ok(said.join(", "))
    }

    /// Every application with its tasks, or `None` when the daemon cannot list them (it does not
    /// schedule now).
    pub(super) async fn list_apps(&self) -> Result<Option<Vec<(App, Vec<Task>)>>, Violation> {
        let (status, body) = self.call(Method::GET, "/v1/apps?limit=1000".to_owned(), None).await;
        if !status.is_success() {
            if status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::BAD_GATEWAY {
                // Not the scheduler now, or between terms: nothing to read them from.
                return Ok(None);
            }
            return Err(Violation::new(format!("GET /v1/apps answered {status}: {}", code_of(&body))));
        }
        let list: AppList = parse(&body)?;
        let mut apps: Vec<(App, Vec<Task>)> = Vec::with_capacity(list.apps.len());
        for app in list.apps {
            let path = format!("/v1/apps/{}/tasks?limit=1000", app.id);
            let (status, body) = self.call(Method::GET, path.clone(), None).await;
            if !status.is_success() {
                return Err(Violation::new(format!("GET {path} answered {status}: {}", code_of(&body))));
            }
            let tasks: TaskList = parse(&body)?;
            apps.push((app, tasks.tasks));
        }
        Ok(Some(apps))
    }

    /// A report of the client's application number `app` (of those it knows it has, of ids
    /// starting with `prefix`) and its task number `task`.
    pub(super) async fn report(&mut self, prefix: String, app: u8, task: u8, report: Report) -> String {
        let known: Vec<(&String, u64)> = (self.model.apps.iter())
            .filter(|(id, _)| id.starts_with(&prefix))
            .filter_map(|(id, grip)| match grip.known {
                Known::Held { units, .. } if units > 0 => Some((id, units)),
                _ => None,
            })
            .collect();
        let Some((id, tasks)) =
            known.get(usize::from(app) % known.len().max(1)).map(|(id, tasks)| ((*id).clone(), *tasks))
        else {
            return "no application".to_owned();
        };
        let task = u64::from(task) % tasks;
        // A runner that ends a task has started it (a task started already, or not placed,
        // refuses the start: the end then tells).
        if report != Report::Start {
            self.ended_from_outside.insert(format!("{id}/t{task}"));
            self.call(Method::POST, format!("/v1/apps/{id}/tasks/t{task}/start"), None).await;
        }
        let path = format!("/v1/apps/{id}/tasks/t{task}/{}", report.as_str());
        let (status, body) = self.call(Method::POST, path, None).await;
        if status.is_success() {
            let state = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|answer| answer.get("state").and_then(|state| state.as_str().map(str::to_owned)))
                .unwrap_or_default();
            format!("{} {id}/t{task} {state}", status.as_u16())
        } else {
            format!("{} {}", status.as_u16(), code_of(&body))
        }
    }

    /// The applications' invariants, when the daemon can list them (it schedules now).
    pub(super) async fn check_apps(&mut self) -> Result<(), Violation> {
        let scheduled = std::mem::take(&mut self.turn_scheduled);
        // Read from the daemon that schedules (another would forward the call there).
        self.serving = self.scheduling();
        let Some(apps) = self.list_apps().await? else { return Ok(()) };
        if scheduled {
            for (app, tasks) in &apps {
                let done = !tasks.is_empty() && tasks.iter().all(|task| task_ended(&task.state));
                if done && !crate::apps::ended(&app.state) {
                    return Err(Violation::new(format!(
                        "{} is {} after a turn of the scheduler, though all its tasks ended",
                        app.id, app.state
                    )));
                }
            }
        }
        let mut live = BTreeSet::new();
        for (pool, capacity) in [(APPS_POOL, APPS_CAPACITY), (EXEC_POOL, EXEC_CAPACITY)] {
            let path = format!("/v1/pools/{pool}/allocs?limit=1000");
            let (status, body) = self.call(Method::GET, path.clone(), None).await;
            if !status.is_success() {
                return Err(Violation::new(format!("GET {path} answered {status}: {}", code_of(&body))));
            }
            let allocs: AllocList = parse(&body)?;
            let mut total = 0;
            for alloc in allocs.allocs.into_iter().filter(|alloc| alloc.ended.is_none()) {
                total += cpus_of(&alloc.resources)?;
                live.insert(alloc.uri);
            }
            if total > capacity {
                return Err(Violation::new(format!(
                    "{pool} holds {total} CPUs in live allocs, over its capacity {capacity}"
                )));
            }
        }
        crate::apps::placed_rightly(&apps, Some(&live))?;
        // Every submission acknowledged (and not at risk) is there; one in doubt, or never
        // acknowledged, that is there is known from now on (learned at risk while cut).
        let learned_at_risk = self.acknowledged_at_risk();
        let listed: BTreeMap<&str, u64> =
            apps.iter().map(|(app, tasks)| (app.id.as_str(), tasks.len() as u64)).collect();
        for (id, grip) in &mut self.model.apps {
            let held = matches!(grip.known, Known::Held { .. });
            match listed.get(id.as_str()) {
                Some(&tasks) => {
                    if !held {
                        grip.at_risk = learned_at_risk;
                    }
                    grip.known = Known::Held { units: tasks, fencing: 0, until: u64::MAX };
                }
                None if held && !grip.at_risk => {
                    return Err(Violation::new(format!("{id}, acknowledged, is not listed")));
                }
                None => {}
            }
        }
        Ok(())
    }
}
