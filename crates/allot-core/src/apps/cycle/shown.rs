//! The priority each queue with work shows its parent in a cycle [YuniKorn's
//! `GetCurrentPriority`]: a leaf, what the application it places next shows
//! (`Scheduler::shown_priority`, kept by its `Lane`); a parent, the highest its children show;
//! each plus its `priority_offset`, or that alone when fenced. Kept as counts of each priority
//! per queue, so a change moves only what it touches, up the tree.

use std::collections::BTreeMap;

use foldhash::HashMap;

use crate::apps::priority;
use crate::apps::queues::{QueuePath, Queues};

/// What each queue with work shows, kept through one cycle.
#[derive(Default)]
pub(super) struct ShownPriorities {
    /// Per queue, how many of its children (of a leaf, its lane) show each priority.
    inside: HashMap<QueuePath, BTreeMap<i32, u32>>,
    shown: HashMap<QueuePath, i32>,
}

impl ShownPriorities {
    /// What `queue` shows: the lowest there is while it has nothing to place.
    pub(super) fn of(&self, queue: &QueuePath) -> i32 {
        self.shown.get(queue).copied().unwrap_or(i32::MIN)
    }

    /// One of `queue`'s applications or children shows `new` instead of `old` (none: not
    /// counted); what its ancestors show follows.
    pub(super) fn change(&mut self, queues: &Queues, queue: &QueuePath, old: Option<i32>, new: Option<i32>) {
        if old == new {
            return;
        }
        self.update(queues, queue, |inside| {
            if let Some(old) = old {
                if let Some(count) = inside.get_mut(&old) {
                    *count -= 1;
                    if *count == 0 {
                        inside.remove(&old);
                    }
                }
            }
            if let Some(new) = new {
                *inside.entry(new).or_default() += 1;
            }
        });
    }

    /// Changes what `queue`'s applications and children show, and what its ancestors show with
    /// it.
    pub(super) fn update(&mut self, queues: &Queues, queue: &QueuePath, edit: impl FnOnce(&mut BTreeMap<i32, u32>)) {
        let inside = match self.inside.get_mut(queue) {
            Some(inside) => inside,
            None => self.inside.entry(queue.clone()).or_default(),
        };
        let top_before = inside.last_key_value().map(|(priority, _)| *priority);
        edit(inside);
        let top = inside.last_key_value().map(|(priority, _)| *priority);
        // What it shows follows its top alone.
        if top == top_before {
            return;
        }
        let limits = queues.get(queue);
        let (policy, offset) = limits.map_or_else(Default::default, |l| (l.priority_policy, l.priority_offset));
        let value = priority::shown(policy, offset, top);
        let before = match value {
            Some(value) => self.shown.insert(queue.clone(), value),
            None => self.shown.remove(queue),
        };
        if before != value {
            if let Some(parent) = queue.parent() {
                self.change(queues, &parent, before, value);
            }
        }
    }
}
