//! Change-feed events as the wire shows them: each object converted as its part's routes convert
//! it, with its relative times as of the change.

use std::collections::BTreeMap;

use allot_api as api;
use allot_store::{AppInfo, Event, EventObject, TaskInfo};

use super::{apps, pools, quotas, runs};

pub(crate) fn event(event: &Event) -> WatchEventData<'_> {
    WatchEventData {
        revision: event.revision,
        kind: event.kind.name(),
        key: &event.key,
        cause: event.cause.as_deref(),
        at_ms: event.at,
        object: object(event),
    }
}

/// An event as a frame's `data` carries it: [`api::WatchEvent`]'s fields, with its names and in
/// its order, the kind, key and cause borrowed from the event instead of copied (a test holds
/// the two to the same JSON).
#[derive(Debug, serde::Serialize)]
pub(crate) struct WatchEventData<'a> {
    revision: u64,
    kind: &'a str,
    key: &'a str,
    cause: Option<&'a str>,
    at_ms: u64,
    object: api::WatchObject,
}

/// An event's object. What an event does not carry is left out: an application's task counts and
/// why it or a task waits (read them with `GET`).
fn object(event: &Event) -> api::WatchObject {
    use api::WatchObject as Wire;
    let at = event.at;
    match event.object.clone() {
        EventObject::Namespace(view) => Wire::Namespace(quotas::namespace(view)),
        EventObject::Grant(info) => Wire::Grant(quotas::grant(info)),
        EventObject::Waiter { namespace, token } => {
            Wire::Waiter(api::GrantRef { namespace: namespace.to_string(), token: token.to_string() })
        }
        EventObject::Session(info) => Wire::Session(quotas::session(info)),
        EventObject::Pool(view) => Wire::Pool(pools::pool(*view, None, at)),
        EventObject::Alloc(alloc) => Wire::Alloc(pools::alloc(alloc, None, at)),
        EventObject::EndedAlloc(ended) => Wire::Alloc(pools::ended_alloc(ended, at)),
        EventObject::Queue(view) => Wire::Queue(apps::queue(*view)),
        EventObject::App(app) => Wire::App(apps::app(
            AppInfo { app: *app, tasks: BTreeMap::new(), why: None, released: None },
            apps::Times::on_store_clock(at),
        )),
        EventObject::Task(task) => Wire::Task(apps::task(TaskInfo { task: *task, why: None }, at)),
        EventObject::Run(run) => {
            let (app, task) = run_of(&event.key);
            Wire::Run(runs::task_run(app, task, *run))
        }
        EventObject::Gone => Wire::Gone,
    }
}

/// The application and task of a run's key (`apps/{app}/tasks/{task}/run`; ids hold no `/`).
fn run_of(key: &str) -> (&str, &str) {
    key.strip_prefix("apps/")
        .and_then(|rest| rest.strip_suffix("/run"))
        .and_then(|rest| rest.split_once("/tasks/"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use allot_core::watch::EventKind;

    use super::*;

    /// The API's own event, made by copying what [`event`] borrows.
    fn owned(event: &Event) -> api::WatchEvent {
        api::WatchEvent {
            revision: event.revision,
            kind: event.kind.name().to_owned(),
            key: event.key.clone(),
            cause: event.cause.clone(),
            at_ms: event.at,
            object: object(event),
        }
    }

    #[test]
    fn an_events_data_is_the_json_of_the_apis_watch_event() {
        let waiter = Event {
            revision: 7,
            kind: EventKind::WaiterGaveUp,
            key: "namespaces/hive/waiters/t\\\"1".to_owned(),
            cause: Some("timed out \"now\"".to_owned()),
            at: 1_795_923_318_977,
            object: EventObject::Waiter {
                namespace: allot_core::NamespaceName::new("hive").unwrap(),
                token: allot_core::Token::new("t1").unwrap(),
            },
        };
        let gone = Event {
            revision: u64::MAX,
            kind: EventKind::PoolRemoved,
            key: "pools/p".to_owned(),
            cause: None,
            at: 0,
            object: EventObject::Gone,
        };
        for event in [waiter, gone] {
            let borrowed = serde_json::to_string(&super::event(&event)).unwrap();
            assert_eq!(borrowed, serde_json::to_string(&owned(&event)).unwrap());
            let read: api::WatchEvent = serde_json::from_str(&borrowed).unwrap();
            assert_eq!(read, owned(&event));
        }
    }

    #[test]
    fn a_runs_key_names_its_application_and_task() {
        assert_eq!(run_of(&allot_core::watch::keys::run("etl", "t-1")), ("etl", "t-1"));
        assert_eq!(run_of("pools/p"), ("", ""));
    }
}
