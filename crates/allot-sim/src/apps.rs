//! The applications' invariants, over what the daemon lists: no alloc holds two things (a task
//! or placeholder is placed in one place, and an alloc is never given twice); every placement is
//! on an alloc the pool holds; a gang is held all or nothing (reserving, nothing of it is placed;
//! before any of its tasks is placed or ended, its placeholders are none or all)
//! ([`placed_rightly`]); nothing is placed on a pool, or holds a seat of a namespace, its
//! application's user may not use ([`placed_where_allowed`]).

use std::collections::{BTreeMap, BTreeSet};

use allot_api::{App, Task};

use crate::check::{Model, Violation};
use crate::tenancy;

/// States after which an application does nothing more.
pub fn ended(state: &str) -> bool {
    matches!(state, "Completing" | "Completed" | "Failing" | "Failed" | "Rejected")
}

/// Checks the applications listed (`live`: every live alloc's URI, if the pools could be read).
pub fn placed_rightly(apps: &[(App, Vec<Task>)], live: Option<&BTreeSet<String>>) -> Result<(), Violation> {
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for (app, tasks) in apps {
        let mut placed = Vec::new();
        for task in tasks.iter().filter(|task| holds(&task.state)) {
            if let Some(placement) = &task.placement {
                placed.push((placement.uri.clone(), format!("task {}/{}", app.id, task.id)));
            }
        }
        for placeholder in &app.placeholders {
            // A placeholder a task took is the task's place, listed with the task.
            if placeholder.task.is_none() {
                let what = format!("placeholder {}/{}#{}", app.id, placeholder.group, placeholder.member);
                placed.push((placeholder.placement.uri.clone(), what));
            }
        }
        for (uri, what) in placed {
            if live.is_some_and(|live| !live.contains(&uri)) {
                return Err(Violation::new(format!("{what} is placed on {uri}, which its pool does not hold")));
            }
            if let Some(other) = seen.insert(uri.clone(), what.clone()) {
                return Err(Violation::new(format!("{uri} holds both {other} and {what}")));
            }
        }
        let placeholders = app.placeholders.len();
        let tasks_placed = tasks.iter().filter(|t| t.placement.is_some() && holds(&t.state)).count();
        if app.state == "Reserving" && placeholders + tasks_placed > 0 {
            return Err(Violation::new(format!(
                "{} is reserving its gang, yet {placeholders} placeholders and {tasks_placed} tasks of it are placed",
                app.id
            )));
        }
        let tasks_placed_or_ended = tasks_placed > 0 || tasks.iter().any(|t| task_ended(&t.state));
        for group in &app.task_groups {
            let members = app.placeholders.iter().filter(|p| p.group == group.name).count();
            let min = group.min_members as usize;
            if !tasks_placed_or_ended && members != 0 && members != min {
                return Err(Violation::new(format!(
                    "{}'s gang {} holds {members} of its {min} placeholders: all or nothing",
                    app.id, group.name
                )));
            }
        }
    }
    Ok(())
}

/// Everything of each application placed is on a pool its user may use, with seats of namespaces
/// it may use (the embedded simulation's teams).
pub fn placed_where_allowed(apps: &[(App, Vec<Task>)]) -> Result<(), Violation> {
    apps.iter().try_for_each(|(app, tasks)| may_be_placed(app, tasks))
}

fn may_be_placed(app: &App, tasks: &[Task]) -> Result<(), Violation> {
    let Some(team) = (0..2).find(|team| tenancy::user(*team) == app.user) else {
        return Err(Violation::new(format!("{} was submitted by {}, who is no simulated client", app.id, app.user)));
    };
    let forbidden = |uri: &str, seats: &[allot_api::TokenNeed], what: String| {
        let pool = uri.split_once('/').map_or(uri, |(pool, _)| pool);
        let pool_allowed = (0..2).any(|p| Model::pool(p) == pool && tenancy::may_use_pool(team, p));
        let seat = seats
            .iter()
            .find(|seat| !(0..2).any(|n| Model::namespace(n) == seat.namespace && tenancy::may_use_namespace(team, n)));
        match (pool_allowed, seat) {
            (true, None) => Ok(()),
            (false, _) => {
                Err(Violation::new(format!("{what} of {} is placed on {uri}, a pool it may not use", app.user)))
            }
            (true, Some(seat)) => Err(Violation::new(format!(
                "{what} of {} is placed holding a seat of {}, a namespace it may not use",
                app.user, seat.namespace
            ))),
        }
    };
    for task in tasks.iter().filter(|task| holds(&task.state)) {
        if let Some(placement) = &task.placement {
            forbidden(&placement.uri, &task.tokens, format!("task {}/{}", app.id, task.id))?;
        }
    }
    for placeholder in &app.placeholders {
        let seats = app.task_groups.iter().find(|g| g.name == placeholder.group).map_or(&[][..], |g| &g.tokens);
        let what = format!("placeholder {}/{}#{}", app.id, placeholder.group, placeholder.member);
        forbidden(&placeholder.placement.uri, seats, what)?;
    }
    Ok(())
}

/// States in which a placed task holds its placement.
fn holds(state: &str) -> bool {
    matches!(state, "Allocated" | "Running")
}

fn task_ended(state: &str) -> bool {
    matches!(state, "Completed" | "Failed" | "Killed" | "Rejected")
}
