//! The executor on the store's change feed: which changes it watches, what each one asks of it
//! (a task placed on one of its pools is driven at once; a task that changed otherwise, or went,
//! wakes its run if it is driven here), and the applications' meta kept fresh from the feed.
//!
//! The feed is the local store's (on Redis, it carries the scheduling daemon's changes too); the
//! executor lists the tasks placed on its pools when it starts following it and whenever it is
//! cut, from the revision read before the list, so nothing falls between the two.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use allot_core::apps::{App, AppId, Task, TaskId};
use allot_core::pools::PoolName;
use allot_core::watch::{EventKind, Filter};
use allot_store::{Event, EventObject};

use crate::apps::{placed_on, AppMeta};
use crate::context::RunKey;

/// The changes the executor watches: tasks and applications, changed or removed.
pub(crate) fn filter() -> Filter {
    Filter {
        kinds: vec![EventKind::TaskChanged, EventKind::TaskRemoved, EventKind::AppChanged, EventKind::AppRemoved],
        prefixes: Vec::new(),
    }
}

/// What an event asks of the executor.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step<'a> {
    /// The task is placed (Allocated or Running) on one of its pools: drive it, unless it is
    /// (with the change, whose task is the run's first reading: [`placed_task`]).
    Drive(RunKey, Arc<Event>),
    /// The task changed otherwise (ended, waits again, placed elsewhere) or went: its run, if
    /// driven here, reads it again at once.
    Wake(RunKey),
    /// The application changed: its meta as it is now.
    AppChanged(&'a App),
    /// The application went, with its tasks: every run of it driven here reads its task again.
    AppRemoved(AppId),
    /// Nothing for the executor.
    Nothing,
}

/// What `event` asks of the executor of `pools`.
pub(crate) fn step<'a>(event: &'a Arc<Event>, pools: &HashSet<PoolName>) -> Step<'a> {
    match (event.kind, &event.object) {
        (EventKind::TaskChanged, EventObject::Task(task)) => {
            let key = RunKey { app: task.app.clone(), task: task.spec.id.clone() };
            if placed_on(task.state, task.placement.as_ref().map(|p| &p.pool), pools) {
                // Kept whole (shared, not copied): most runs start from the task read again.
                Step::Drive(key, event.clone())
            } else {
                Step::Wake(key)
            }
        }
        (EventKind::TaskRemoved, _) => task_of(&event.key).map_or(Step::Nothing, Step::Wake),
        (EventKind::AppChanged, EventObject::App(app)) => Step::AppChanged(app),
        (EventKind::AppRemoved, _) => app_of(&event.key).map_or(Step::Nothing, Step::AppRemoved),
        _ => Step::Nothing,
    }
}

/// The task a change carries, if it carries one.
pub(crate) fn placed_task(event: &Event) -> Option<&Task> {
    match &event.object {
        EventObject::Task(task) => Some(task),
        _ => None,
    }
}

/// The application of a key `apps/<app>`.
fn app_of(key: &str) -> Option<AppId> {
    AppId::new(key.strip_prefix("apps/")?).ok()
}

/// The task of a key `apps/<app>/tasks/<task>`.
fn task_of(key: &str) -> Option<RunKey> {
    let (app, task) = key.strip_prefix("apps/")?.split_once("/tasks/")?;
    Some(RunKey { app: AppId::new(app).ok()?, task: TaskId::new(task).ok()? })
}

/// At most this many applications are kept track of; past it, all are dropped (and read again).
const MAX_KEPT: usize = 10_000;

/// The meta of the applications whose tasks run here (queue, user, labels, parallelism), read
/// once per application while the executor follows the feed, and kept as `app.changed` says;
/// dropped when the application goes and whenever the executor stops following the feed (it
/// cannot tell what changed meanwhile). Without a feed nothing is kept: every run reads it.
#[derive(Debug, Default)]
pub(crate) struct Metas {
    kept: Mutex<Kept>,
}

#[derive(Debug, Default)]
struct Kept {
    following: bool,
    /// Moves on whenever everything kept is dropped: no reading begun before is kept.
    generation: u64,
    /// Counts the changes of applications.
    changes: u64,
    /// The count at the last change of each application that changed: a reading of it begun
    /// before may be older than the change, and is not kept.
    changed: HashMap<AppId, u64>,
    apps: HashMap<AppId, AppMeta>,
}

/// Where things stood when a reading began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reading {
    generation: u64,
    changes: u64,
}

impl Kept {
    fn drop_all(&mut self) {
        self.generation += 1;
        self.changed.clear();
        self.apps.clear();
    }

    fn change(&mut self, app: &AppId) {
        if self.changed.len() >= MAX_KEPT || self.apps.len() >= MAX_KEPT {
            self.drop_all();
        }
        self.changes += 1;
        self.changed.insert(app.clone(), self.changes);
    }
}

impl Metas {
    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The executor follows the feed from now on: what is read from now is kept.
    pub(crate) fn follow(&self) {
        let mut kept = self.lock();
        kept.following = true;
        kept.drop_all();
    }

    /// The executor no longer follows the feed: nothing is kept.
    pub(crate) fn unfollow(&self) {
        let mut kept = self.lock();
        kept.following = false;
        kept.drop_all();
    }

    /// The application's meta if kept, else where things stand before it is read (to give back
    /// to [`Metas::keep`] with what was read).
    pub(crate) fn get(&self, app: &AppId) -> Result<AppMeta, Reading> {
        let kept = self.lock();
        kept.apps.get(app).cloned().ok_or(Reading { generation: kept.generation, changes: kept.changes })
    }

    /// Keeps what was read of an application, unless it changed since the reading began (or the
    /// executor does not follow the feed).
    pub(crate) fn keep(&self, app: &AppId, meta: AppMeta, reading: Reading) {
        let mut kept = self.lock();
        let changed_since = kept.changed.get(app).is_some_and(|&at| at > reading.changes);
        if !kept.following || kept.generation != reading.generation || changed_since {
            return;
        }
        kept.apps.insert(app.clone(), meta);
    }

    /// The application changed: its meta is as it says, if kept.
    pub(crate) fn changed(&self, app: &App) {
        let mut kept = self.lock();
        kept.change(&app.spec.id);
        if let Some(meta) = kept.apps.get_mut(&app.spec.id) {
            *meta = AppMeta::of(&app.spec);
        }
    }

    /// The application went.
    pub(crate) fn removed(&self, app: &AppId) {
        let mut kept = self.lock();
        kept.change(app);
        kept.apps.remove(app);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_core::watch::keys;

    #[test]
    fn keys_read_back() {
        let key = RunKey { app: AppId::new("etl").unwrap(), task: TaskId::new("t-1").unwrap() };
        assert_eq!(task_of(&keys::task(&key.app, &key.task)), Some(key.clone()));
        assert_eq!(app_of(&keys::app(&key.app)), Some(key.app.clone()));
        assert_eq!(task_of(&keys::app(&key.app)), None);
        assert_eq!(task_of("pools/p/allocs/1"), None);
    }

    #[test]
    fn a_reading_older_than_a_change_of_its_application_is_not_kept_nor_anything_without_the_feed() {
        let metas = Metas::default();
        let (a, b) = (AppId::new("a").unwrap(), AppId::new("b").unwrap());
        let meta = AppMeta { queue: "root.q".into(), ..AppMeta::default() };
        // Not following: nothing kept.
        let reading = metas.get(&a).unwrap_err();
        metas.keep(&a, meta.clone(), reading);
        assert!(metas.get(&a).is_err());
        metas.follow();
        let reading = metas.get(&a).unwrap_err();
        metas.keep(&a, meta.clone(), reading);
        assert_eq!(metas.get(&a), Ok(meta.clone()));
        // A change of another application while a reading was under way: kept all the same.
        let reading = metas.get(&b).unwrap_err();
        metas.removed(&a);
        metas.keep(&b, meta.clone(), reading);
        assert_eq!(metas.get(&b), Ok(meta.clone()));
        // A change of its own: not kept (it may be older than the change).
        let reading = metas.get(&a).unwrap_err();
        metas.removed(&a);
        metas.keep(&a, meta.clone(), reading);
        assert!(metas.get(&a).is_err());
        let reading = metas.get(&a).unwrap_err();
        metas.keep(&a, meta.clone(), reading);
        assert_eq!(metas.get(&a), Ok(meta));
        metas.unfollow();
        assert!(metas.get(&a).is_err() && metas.get(&b).is_err(), "dropped when the feed is not followed");
    }
}
