//! Tasks that wait alike. Within one cycle the room only shrinks and the queues' usage only
//! grows (preemption comes after the placements), so a task asking for what a task of the same
//! application already failed to get this cycle fails too, for the same reason. The cycle keeps
//! the first such task of each shape (its representative) with its reason, and passes over the
//! others without trying them: a cycle costs the applications' shapes, not their tasks. A task
//! passed over waits for the reason its representative gives (`Scheduler::task_why`).
//!
//! A shape is what decides where a task may go and what it may preempt: resources, selector,
//! tokens, type (when pools run only some types), priority, and whether it was preempted before
//! (its preemption delay runs from then). A task in a group (it may take a placeholder) or with
//! room held for it is never passed over.

use std::ops::Bound;

use foldhash::HashMap;

use super::super::spec::TokenNeed;
use super::super::states::TaskState;
use super::super::why::Why;
use super::super::{pending_key, AppId, PendingKey, Scheduler, Task, TaskId};
use crate::pools::Labels;
use crate::resources::Resources;

/// What two tasks that wait alike share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Shape {
    resources: Resources,
    selector: Labels,
    tokens: Vec<TokenNeed>,
    task_type: Option<String>,
    priority: i32,
    preempted: bool,
}

impl Shape {
    /// The shape of a task that may be passed over; `None` for one that never is.
    pub(crate) fn of(task: &Task, task_type: Option<&str>) -> Option<Shape> {
        plain(task).then(|| Shape {
            resources: task.spec.resources.clone(),
            selector: task.spec.selector.clone(),
            tokens: task.spec.tokens.clone(),
            task_type: task_type.map(str::to_owned),
            priority: task.spec.priority.value(),
            preempted: task.preempted_at.is_some(),
        })
    }

    /// Whether `task` (of type `task_type`) has this shape; compares without copying.
    pub(crate) fn fits(&self, task: &Task, task_type: Option<&str>) -> bool {
        plain(task)
            && self.priority == task.spec.priority.value()
            && self.preempted == task.preempted_at.is_some()
            && self.resources == task.spec.resources
            && self.selector == task.spec.selector
            && self.tokens == task.spec.tokens
            && self.task_type.as_deref() == task_type
    }
}

/// Neither in a group nor holding room.
fn plain(task: &Task) -> bool {
    task.spec.group.is_none() && task.held.is_none()
}

/// A shape of an application that found no place in the last cycle: its representative and the
/// reason it was given then.
#[derive(Debug, Clone)]
pub(crate) struct Failed {
    pub(crate) shape: Shape,
    pub(crate) task: TaskId,
    pub(crate) why: Why,
    /// Whether pools ran only some types then (the shape holds the type).
    pub(crate) typed: bool,
}

/// Each application's shapes that found no place in the last cycle.
pub(crate) type FailedShapes = HashMap<AppId, Vec<Failed>>;

/// The distinct shapes of an application's pending tasks as a cycle compares them (`typed`);
/// `None` when one of them is never passed over, or they have too many shapes to be worth it.
#[derive(Debug, Clone)]
pub(crate) struct PendingShapes {
    typed: bool,
    shapes: Option<Vec<Shape>>,
}

/// Each application's [`PendingShapes`], where worked out.
pub(crate) type PendingShapesOf = HashMap<AppId, PendingShapes>;

/// Beyond this many distinct shapes an application's tasks are looked at one by one.
const MAX_SHAPES: usize = 8;

impl Scheduler {
    /// Whether every pending task of `app` is like one that failed this cycle: then none of them
    /// is tried, and none looked at.
    pub(super) fn every_shape_failed(&mut self, app: &AppId, typed: bool) -> bool {
        let Some(failed) = self.failed_shapes.get(app) else { return false };
        let known = self.pending_shapes.get(app).filter(|known| known.typed == typed);
        let shapes = match known {
            Some(known) => known.shapes.as_ref(),
            None => {
                let shapes = self.distinct_shapes(app, typed);
                let covered = shapes.as_ref().is_some_and(|shapes| covers(failed, shapes));
                self.pending_shapes.insert(app.clone(), PendingShapes { typed, shapes });
                return covered;
            }
        };
        shapes.is_some_and(|shapes| covers(failed, shapes))
    }

    /// The distinct shapes of the pending tasks of `app` (see [`PendingShapes`]).
    fn distinct_shapes(&self, app: &AppId, typed: bool) -> Option<Vec<Shape>> {
        let mut shapes: Vec<Shape> = Vec::new();
        // The tasks in order, not each pending one looked up: a backlog's first cycle reads them all.
        for task in self.tasks.get(app)?.values().filter(|task| task.state == TaskState::Pending) {
            let task_type = self.type_ref(app, task, typed);
            if shapes.iter().any(|shape| shape.fits(task, task_type)) {
                continue;
            }
            if shapes.len() == MAX_SHAPES {
                return None;
            }
            shapes.push(Shape::of(task, task_type)?);
        }
        Some(shapes)
    }

    /// The type a cycle compares a task's shape by: its own when pools run only some types (as
    /// `place_task` reads it).
    pub(super) fn type_ref(&self, app: &AppId, task: &Task, typed: bool) -> Option<&str> {
        match typed && !task.spec.spec.is_empty() {
            true => self.task_types.get(app)?.get(&task.spec.id)?.as_deref(),
            false => None,
        }
    }

    /// The first pending task of `app` after `after` that is not like one that failed this
    /// cycle: those are passed over.
    pub(super) fn next_to_try(&self, app: &AppId, after: Option<&PendingKey>, typed: bool) -> Option<PendingKey> {
        let pending = self.pending.get(app)?;
        let mut keys = match after {
            Some(after) => pending.range((Bound::Excluded(after), Bound::Unbounded)),
            None => pending.range::<PendingKey, _>(..),
        };
        let (Some(failed), Some(tasks)) = (self.failed_shapes.get(app), self.tasks.get(app)) else {
            return keys.next().cloned();
        };
        keys.find(|key| {
            let Some(task) = tasks.get(&key.2) else { return true };
            let task_type = self.type_ref(app, task, typed);
            !failed.iter().any(|failed| failed.shape.fits(task, task_type))
        })
        .cloned()
    }

    /// Why a pending task the last cycle passed over waits: as its representative, unless that
    /// one is being given room by preemption (which the others are not).
    pub(crate) fn why_like(&self, app: &AppId, task: &Task) -> Option<Why> {
        let failed = self
            .failed_shapes
            .get(app)?
            .iter()
            .find(|failed| failed.shape.fits(task, self.type_ref(app, task, failed.typed)))?;
        match self.why_task.get(&(app.clone(), failed.task.clone())) {
            Some(why) if !matches!(why, Why::Preempting { .. }) => Some(why.clone()),
            _ => Some(failed.why.clone()),
        }
    }

    /// The next pending task of `app` after `task` that the last cycle passed over as like it,
    /// with the reason its shape was given: once `task` preempts, that one may too (`preempt`
    /// considers the representatives only, and each one's next when it succeeds).
    pub(super) fn next_like(&self, app: &AppId, task: &TaskId) -> Option<(TaskId, Why)> {
        let tasks = self.tasks.get(app)?;
        let first = tasks.get(task)?;
        let failed = self
            .failed_shapes
            .get(app)?
            .iter()
            .find(|failed| failed.shape.fits(first, self.type_ref(app, first, failed.typed)))?;
        let after = pending_key(first);
        self.pending.get(app)?.range((Bound::Excluded(after), Bound::Unbounded)).find_map(|key| {
            let next = tasks.get(&key.2)?;
            let passed_over = !self.why_task.contains_key(&(app.clone(), key.2.clone()))
                && failed.shape.fits(next, self.type_ref(app, next, failed.typed));
            passed_over.then(|| (key.2.clone(), failed.why.clone()))
        })
    }
}

/// Whether every shape of `shapes` failed.
fn covers(failed: &[Failed], shapes: &[Shape]) -> bool {
    shapes.iter().all(|shape| failed.iter().any(|failed| &failed.shape == shape))
}
