//! The scheduling cycle: timers first, then as many placements as fit, queue by queue.
//!
//! At length, as one thing: the order of placements, where each may go (the room of every pool,
//! what a user may use and which pools run a task's type) and the commit of one placement are
//! the steps of one loop over one `Cycle`'s state; apart they would pass that state around.
//!
//! Order: sibling queues by the priority each shows (a leaf, that of the application it places
//! next; a parent, the highest of its children's), then by
//! fair share (what they use over what they are guaranteed, the most dominant resource; queues
//! with no guarantee after the others, least used first), both as they are at each placement,
//! from the top of the tree down; inside a leaf queue, applications by its sort policy (`fifo`:
//! submission order, each application placing all it can before the next; `priority`: the
//! highest pending task first; `fair`: round robin, least used first); inside an application,
//! tasks by priority, then order of adding.
//!
//! Nothing blocks the line: an application or task that cannot be placed now is skipped for
//! this cycle with the reason (`Why`), and the ones behind it go on. So a gang waiting for room
//! never blocks a smaller application behind it; what bounds the gang's own wait is its reserve
//! timeout.
//!
//! Placement: best fit over every resource (the smallest weighted free space that fits, through
//! an index of pools by free size), then every token need checked with `Ledger::room_for`, and
//! only then the alloc and the grants taken, in one step. A gang reserves every placeholder of
//! every group the same way: all are found room first (on a scratch copy of what is free), all
//! tokens checked, then all taken.

use std::cmp::Reverse;
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::hash::{Hash, Hasher};
use std::ops::Bound;
use std::sync::Arc;

use foldhash::{HashMap, HashMapExt};

mod alike;
mod preempt;
mod shown;

pub(crate) use alike::{Failed, FailedShapes, PendingShapesOf, Shape};
use shown::ShownPriorities;

use super::runners::{Runners, TaskTypes};
use super::why::Why;
use super::{
    pending_key, release, resources_never_fit, task_known, tokens_never_fit, transition_known, Account, AppChange,
    AppId, GangStyle, HeldTokens, Outcome, PendingKey, Placement, Scheduler, Slot, TaskId, TokenNeed, World,
    RESERVATION_TIMEOUT,
};
use crate::access::{Principal, Resource};
use crate::apps::queues::{limit_at, LimitHit, QueuePath, QueueUsage, SortPolicy};
use crate::apps::states::{AppEvent, AppState, TaskEvent, TaskState};
use crate::names::Token;
use crate::pools::{self, plugins_of, selector_matches, AllocId, AllocRequest, Labels, PoolError, PoolName, Pools};
use crate::quotas::{AllocateRequest, Constraints, Decision, LeaseRequest, Millis, TokenShortage};
use crate::resources::{Resources, SizeWeights};

/// What one cycle did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CycleReport {
    /// Tasks placed on a pool of their own.
    pub placed: usize,
    /// Gangs reserved (all their placeholders).
    pub reserved: usize,
    /// Tasks that took a placeholder over.
    pub taken_over: usize,
    /// Applications whose reserve or placeholder timeout ran out.
    pub timed_out: usize,
}

/// One pool as the cycle sees it.
#[derive(Clone, PartialEq)]
struct Spot {
    name: PoolName,
    free: Resources,
    labels: Labels,
    /// The task types it runs, when its `plugins` limit them.
    plugins: Option<Vec<String>>,
    /// The task types its live executors run; `None` when no live executor runs it.
    run: Option<Arc<TaskTypes>>,
}

impl Spot {
    /// Whether a task of `task_type` may be placed here: a task with a type where a live
    /// executor runs that type (and its `plugins`, if any, list it); a task with no type (run by
    /// whoever reports it) wherever its `plugins` do not limit the types.
    fn runs(&self, task_type: Option<&str>) -> bool {
        match task_type {
            None => self.plugins.is_none(),
            Some(task_type) => {
                self.plugins.as_ref().is_none_or(|listed| listed.iter().any(|t| t == task_type))
                    && self.run.as_ref().is_some_and(|run| run.has(task_type))
            }
        }
    }
}

/// What is free in every pool, indexed by weighted size for best fit.
#[derive(Clone)]
struct Room {
    spots: Vec<Spot>,
    index: BTreeSet<(u64, usize)>,
    weights: SizeWeights,
    /// Some pool does not take every task type: it limits them, or is not run by an executor
    /// of every type. Only then is a task's type read.
    typed: bool,
    /// Some pool limits the task types it runs (its `plugins`): only then may a task without a
    /// type be kept from a pool.
    limited: bool,
    /// What is free in every pool together, kept only when some queue holds part of its
    /// guarantee free (a `lend_limit`).
    total: Option<Resources>,
    /// The cordoned pools and their labels (to say so of a task no other pool takes).
    cordoned: Vec<(PoolName, Labels)>,
    /// Each spot by its pool's name, made when first asked (a cycle that places tasks with room
    /// held for them asks; most cycles never do).
    by_name: std::sync::OnceLock<HashMap<PoolName, usize>>,
    /// The spots whose `free` changed since it was made or caught up (`set_free`): a kept room
    /// reads them again, as it does the pools changed since.
    touched: Vec<usize>,
}

/// The room and filters of the last cycle, kept for the next (`Scheduler::room_at`). Valid while
/// the scheduler's own inputs to them stay as they were: its weights, tenancy, the pools down
/// and what the executors run (each change drops it), and no queue holds guarantees free (with
/// `total`, the room is made anew every cycle). Never cloned: a copy of the scheduler starts
/// without one (the changes it would read next are this one's).
#[derive(Default)]
pub(crate) struct KeptRoom(Option<Kept>);

struct Kept {
    room: Room,
    filters: Filters,
    /// The cycle's time, and the `Pools` whose room it is ([`PoolsChanged::of`]).
    at: Millis,
    of: u64,
}

impl Clone for KeptRoom {
    fn clone(&self) -> KeptRoom {
        KeptRoom(None)
    }
}

impl std::fmt::Debug for KeptRoom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "KeptRoom(kept)" } else { "KeptRoom(none)" })
    }
}

impl KeptRoom {
    /// Forgets the kept room: the next cycle makes its room anew.
    pub(crate) fn drop_kept(&mut self) {
        self.0 = None;
    }
}

/// Sizes are non-negative, so their bit patterns sort like the numbers.
fn size_key(resources: &Resources, weights: &SizeWeights) -> u64 {
    resources.size(weights).max(0.0).to_bits()
}

impl Room {
    /// The room of every pool but the `down` ones (their executors stopped), with what the
    /// executors run on each; with the `totals` of every pool if asked.
    fn new(
        pools: &Pools,
        now: Millis,
        weights: &SizeWeights,
        down: &BTreeSet<PoolName>,
        runners: &Runners,
        totals: bool,
    ) -> Room {
        let spots: Vec<Spot> = pools
            .spots(now)
            .filter(|(name, ..)| !down.contains(*name))
            .map(|(name, free, _, labels)| Spot {
                name: name.clone(),
                free,
                labels: labels.clone(),
                plugins: plugins_of(labels).map(|types| types.into_iter().map(str::to_owned).collect()),
                run: runners.of(name).cloned(),
            })
            .collect();
        let index = spots.iter().enumerate().map(|(i, spot)| (size_key(&spot.free, weights), i)).collect();
        let typed =
            spots.iter().any(|spot| spot.plugins.is_some() || !spot.run.as_ref().is_some_and(|run| run.is_every()));
        let limited = spots.iter().any(|spot| spot.plugins.is_some());
        let total =
            totals.then(|| spots.iter().fold(Resources::new(), |sum, spot| sum.checked_add(&spot.free).unwrap_or(sum)));
        let cordoned = pools.cordoned().map(|(name, labels)| (name.clone(), labels.clone())).collect();
        Room {
            spots,
            index,
            weights: weights.clone(),
            typed,
            limited,
            total,
            cordoned,
            by_name: Default::default(),
            touched: Vec::new(),
        }
    }

    /// Brings the room of a cycle at `since` to `now`: reads again what is free in each pool
    /// `changed` names, each whose lease lapsed in between and each spot the last cycle
    /// touched. False when the set of pools in the room would change (it must be made anew).
    fn catch_up(
        &mut self,
        pools: &Pools,
        since: Millis,
        now: Millis,
        changed: &[PoolName],
        down: &BTreeSet<PoolName>,
    ) -> bool {
        let lapsed = pools.lapsed_by_pool(now);
        let mut again = std::mem::take(&mut self.touched);
        for name in changed.iter().chain(pools.lapsing_between(since, now)) {
            match self.spot_of(name) {
                Some(i) => again.push(i),
                // A pool that is not in the room, and now would be.
                None if !down.contains(name) && pools.spot_free(name, &lapsed).is_some() => return false,
                None => {}
            }
        }
        again.sort_unstable();
        again.dedup();
        for i in again {
            let Some(free) = pools.spot_free(&self.spots[i].name, &lapsed) else { return false };
            if free != self.spots[i].free {
                self.set_free(i, |_| free);
            }
        }
        self.touched.clear();
        true
    }

    /// The same room as `other` (a kept room caught up against one made anew; for debug builds).
    fn same_as(&self, other: &Room) -> bool {
        self.spots == other.spots
            && self.index == other.index
            && self.typed == other.typed
            && self.limited == other.limited
            && self.total == other.total
            && self.cordoned == other.cordoned
    }

    /// The spot of pool `name`, if it is in the room.
    fn spot_of(&self, name: &PoolName) -> Option<usize> {
        let by_name =
            self.by_name.get_or_init(|| self.spots.iter().enumerate().map(|(i, s)| (s.name.clone(), i)).collect());
        by_name.get(name).copied()
    }

    /// The matching pool with the least free space that fits `wanted` (less what `taken` says
    /// is already promised in it) among those `allowed` (every pool when none), or why there is
    /// none.
    fn best_fit(
        &self,
        wanted: &Resources,
        selector: &Labels,
        taken: &HashMap<usize, Resources>,
        allowed: Option<&Allowed>,
    ) -> Result<usize, Why> {
        let size = wanted.size(&self.weights);
        // A pool that fits has a size at least `size`; allow for rounding of the float sums.
        let lower = (size - size * 1e-9 - 1e-12).max(0.0).to_bits();
        for &(_, i) in self.index.range((Bound::Included((lower, 0)), Bound::Unbounded)) {
            let spot = &self.spots[i];
            if !selector_matches(selector, &spot.labels) || allowed.is_some_and(|a| !a.takes(i)) {
                continue;
            }
            let fits = match taken.get(&i) {
                Some(promised) => spot.free.saturating_sub(promised).fits(wanted),
                None => spot.free.fits(wanted),
            };
            if fits {
                return Ok(i);
            }
        }
        Err(self.why_not(wanted, selector, taken, allowed))
    }

    fn why_not(
        &self,
        wanted: &Resources,
        selector: &Labels,
        taken: &HashMap<usize, Resources>,
        allowed: Option<&Allowed>,
    ) -> Why {
        let mut closest: Option<(f64, usize, Resources)> = None;
        let (mut matched, mut permitted, mut run) = (false, false, false);
        // Matching pools no live executor runs, and whether each has the room now.
        let mut unrun: Vec<(&PoolName, bool)> = Vec::new();
        for (i, spot) in self.spots.iter().enumerate() {
            if !selector_matches(selector, &spot.labels) || allowed.is_some_and(|a| !a.on_side(i)) {
                continue;
            }
            matched = true;
            if allowed.is_some_and(|a| !a.permits(i)) {
                continue;
            }
            permitted = true;
            run |= spot.run.is_some();
            if spot.run.is_none() {
                unrun.push((
                    &spot.name,
                    spot.free.saturating_sub(taken.get(&i).unwrap_or(&Resources::new())).fits(wanted),
                ));
            }
            if allowed.is_some_and(|a| !a.runs(i)) {
                continue;
            }
            let free = match taken.get(&i) {
                Some(promised) => spot.free.saturating_sub(promised),
                None => spot.free.clone(),
            };
            let lacks = wanted.saturating_sub(&free);
            let size = lacks.size(&self.weights);
            if closest.as_ref().is_none_or(|(best, ..)| size < *best) {
                closest = Some((size, i, lacks));
            }
        }
        let typed = |allowed: &Allowed| allowed.task_type.as_deref().is_some_and(|t| !t.is_empty());
        let pools = || match selector.is_empty() {
            true => "any pool that takes allocs".to_owned(),
            false => {
                let labels: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!("any pool that takes allocs with the labels {}", labels.join(","))
            }
        };
        match (closest, allowed) {
            (None, Some(allowed)) if matched && !permitted => {
                Why::Forbidden { user: allowed.user.clone().unwrap_or_default(), what: pools() }
            }
            (None, Some(allowed)) if permitted && !run && typed(allowed) => {
                Why::NotRun { pools: unrun.iter().map(|(p, _)| p.to_string()).collect() }
            }
            // A pool no daemon runs has the room the run ones lack: running it is the way.
            (Some(_), Some(allowed)) if typed(allowed) && unrun.iter().any(|(_, fits)| *fits) => {
                Why::NotRun { pools: unrun.iter().filter(|(_, fits)| *fits).map(|(p, _)| p.to_string()).collect() }
            }
            (None, Some(allowed)) if permitted => {
                Why::TypeNotRun { task_type: allowed.task_type.clone(), pools: pools() }
            }
            (None, _) => Why::NoPoolMatches {
                selector: selector.clone(),
                cordoned: self
                    .cordoned
                    .iter()
                    .filter(|(_, labels)| selector_matches(selector, labels))
                    .map(|(p, _)| p.clone())
                    .collect(),
            },
            (Some((_, i, lacks)), _) => {
                Why::NoRoom { wanted: wanted.clone(), closest: Some(Box::new((self.spots[i].name.clone(), lacks))) }
            }
        }
    }

    /// Whether `pool` runs tasks of `task_type` (a pool not in the room, down, is not asked).
    fn runs(&self, pool: &PoolName, task_type: Option<&str>) -> bool {
        self.spots.iter().find(|spot| &spot.name == pool).is_none_or(|spot| spot.runs(task_type))
    }

    fn take(&mut self, i: usize, resources: &Resources) {
        self.set_free(i, |free| free.saturating_sub(resources));
    }

    fn give_back(&mut self, i: usize, resources: &Resources) {
        self.set_free(i, |free| free.checked_add(resources).unwrap_or_else(|| free.clone()));
    }

    /// Changes what is free in spot `i`, and its place in the index with it.
    fn set_free(&mut self, i: usize, change: impl FnOnce(&Resources) -> Resources) {
        let spot = &mut self.spots[i];
        self.index.remove(&(size_key(&spot.free, &self.weights), i));
        let before = std::mem::replace(&mut spot.free, Resources::new());
        spot.free = change(&before);
        if let Some(total) = &mut self.total {
            let rest = total.saturating_sub(&before);
            *total = rest.checked_add(&spot.free).unwrap_or(rest);
        }
        self.index.insert((size_key(&spot.free, &self.weights), i));
        self.touched.push(i);
    }
}

/// Shapes (resources, selector and the class of pools the user may use) that found no room this
/// cycle: room only shrinks during a cycle, so the same shape is not searched for again.
#[derive(Default)]
struct NoRoom(HashMap<u64, Vec<(Resources, Labels, u32, Why)>>);

impl NoRoom {
    fn hash(wanted: &Resources, selector: &Labels, class: u32) -> u64 {
        let mut hasher = DefaultHasher::new();
        wanted.hash(&mut hasher);
        selector.hash(&mut hasher);
        class.hash(&mut hasher);
        hasher.finish()
    }

    fn get(&self, wanted: &Resources, selector: &Labels, class: u32) -> Option<&Why> {
        let shapes = self.0.get(&NoRoom::hash(wanted, selector, class))?;
        shapes.iter().find(|(r, s, c, _)| r == wanted && s == selector && *c == class).map(|(.., why)| why)
    }

    fn insert(&mut self, wanted: &Resources, selector: &Labels, class: u32, why: Why) {
        let shapes = self.0.entry(NoRoom::hash(wanted, selector, class)).or_default();
        shapes.push((wanted.clone(), selector.clone(), class, why));
    }
}

/// Which pools one placement may take this cycle, by spot: those its application's user may use
/// (while tenancy is enforced) and that run its task's type (where pools limit the types).
/// Placements with the same user and type share a `class` (it keys what found no room).
#[derive(Clone)]
struct Allowed {
    class: u32,
    user: Option<String>,
    task_type: Option<String>,
    /// By the user's permissions; `None`: every pool.
    permitted: Option<Arc<[bool]>>,
    /// By the task's type; `None`: every pool.
    running: Option<Arc<[bool]>>,
    /// For a gang with no type, the side it is placed on: pools run by a live executor (`true`)
    /// or not; `None`: both.
    side: Option<(bool, Arc<[bool]>)>,
}

impl Allowed {
    fn on_side(&self, i: usize) -> bool {
        self.side.as_ref().is_none_or(|(_, run)| run[i])
    }

    fn permits(&self, i: usize) -> bool {
        self.permitted.as_ref().is_none_or(|p| p[i])
    }

    fn runs(&self, i: usize) -> bool {
        self.running.as_ref().is_none_or(|r| r[i])
    }

    fn takes(&self, i: usize) -> bool {
        self.permits(i) && self.runs(i) && self.on_side(i)
    }
}

/// What a cycle learns once of the pools each user may use and each task type runs on.
#[derive(Default)]
struct Filters {
    permitted: HashMap<Principal, Arc<[bool]>>,
    running: HashMap<Option<String>, Arc<[bool]>>,
    /// By spot: whether a live executor runs it (or not, by side).
    sides: HashMap<bool, Arc<[bool]>>,
    classes: HashMap<ClassKey, u32>,
}

/// What makes two placements take the same pools: the user, the task types (joined), the side.
type ClassKey = (Option<Principal>, Option<String>, Option<bool>);

/// A leaf queue's applications with work in this cycle.
struct Lane {
    ancestors: Vec<QueuePath>,
    apps: Vec<AppId>,
    /// The application it places next.
    at: usize,
    sort: SortPolicy,
    /// The priority it shows its queue: that of the application it places next.
    shown: Option<i32>,
}

impl Lane {
    /// Nothing more of the application it places next this cycle. In a fair lane the others
    /// take turns, so it leaves the ring; in the others the lane only moves on (no shifting of
    /// a long backlog's applications, one by one).
    fn skip(&mut self) {
        match self.sort {
            SortPolicy::Fair => {
                self.apps.remove(self.at);
                if self.at >= self.apps.len() {
                    self.at = 0;
                }
            }
            SortPolicy::Fifo | SortPolicy::Priority => self.at += 1,
        }
    }
}

/// What a cycle carries from step to step.
struct Cycle<'c> {
    now: Millis,
    room: Room,
    cursors: HashMap<AppId, PendingKey>,
    no_room: NoRoom,
    ids: &'c mut dyn FnMut() -> u64,
    out: Outcome,
    report: CycleReport,
    /// Each user's and task type's pools, computed at their first placement of the cycle.
    filters: Filters,
    /// `Scheduler::never_fits` as the cycle found it: since when each application's task could
    /// never fit, kept for those that still cannot.
    never_fits_before: HashMap<AppId, (Millis, String)>,
    /// By spot: the room held there for tasks that preempted (taken out of `room`).
    held: HashMap<usize, Resources>,
    /// By queue (and every queue above): what the tasks and gangs with room held for them
    /// will use once placed, less what of it the cycle placed. A queue's fair share counts it.
    arriving: HashMap<QueuePath, Resources>,
}

impl Scheduler {
    /// Runs the timers that are due (placeholder and reserve timeouts) and nothing else: a store
    /// that carries out placements elsewhere (Redis) frees what they release before a cycle
    /// places into the room.
    pub fn run_timers(&mut self, now: Millis, world: &mut World<'_>) -> (usize, Outcome) {
        let mut out = Outcome::default();
        let timed_out = self.expire(now, world, &mut out);
        (timed_out, out)
    }

    /// Runs one scheduling cycle: timers, then every placement that fits now. `ids` draws alloc
    /// ids (an id already taken is drawn again).
    pub fn schedule(
        &mut self,
        now: Millis,
        world: &mut World<'_>,
        ids: &mut dyn FnMut() -> u64,
    ) -> (CycleReport, Outcome) {
        let mut out = Outcome::default();
        let timed_out = self.expire(now, world, &mut out);
        self.stats.cycles += 1;
        self.why_app.clear();
        self.why_task.clear();
        self.failed_shapes.clear();
        // Kept for the applications this cycle finds still cannot fit.
        let never_fits_before = std::mem::take(&mut self.never_fits);
        let mut lanes = self.lanes();
        if lanes.is_empty() {
            self.next_preemption = None;
            return (CycleReport { timed_out, ..CycleReport::default() }, out);
        }
        let held_room = self.held_room();
        let (room, filters, pools_of) = self.room_at(now, world.pools);
        let mut cycle = Cycle {
            now,
            room,
            cursors: HashMap::new(),
            no_room: NoRoom::default(),
            ids,
            out,
            report: CycleReport { timed_out, ..CycleReport::default() },
            filters,
            never_fits_before,
            held: HashMap::new(),
            arriving: self.arriving(),
        };
        // The room held for preemptors is no one else's.
        for (i, spot) in cycle.room.spots.iter().enumerate() {
            if let Some(held) = held_room.get(&spot.name) {
                cycle.held.insert(i, held.min(&spot.free));
            }
        }
        for (i, held) in &cycle.held {
            cycle.room.take(*i, held);
        }
        let mut priorities = self.queue_priorities(&mut lanes);
        // With one lane there is no order to keep.
        let ordered = lanes.len() > 1;
        let mut heap: BinaryHeap<Reverse<(Vec<u64>, usize)>> = lanes
            .iter()
            .enumerate()
            .map(|(i, lane)| Reverse((self.fair_key(&lane.ancestors, &priorities, &cycle.arriving), i)))
            .collect();
        while let Some(Reverse((key, i))) = heap.pop() {
            // A lane's key only grows in a cycle (its queues use more, show lower priorities as
            // their work is placed). Under a parent other than the root it moves with its
            // siblings' placements too: one found stale goes back in its place. A leaf of the
            // root's changes only by its own steps, after which it went back with its key new.
            if lanes[i].ancestors.len() > 2 && !heap.is_empty() {
                let now_key = self.fair_key(&lanes[i].ancestors, &priorities, &cycle.arriving);
                if now_key > key {
                    heap.push(Reverse((now_key, i)));
                    continue;
                }
            }
            let lane = &mut lanes[i];
            let mut requeue = false;
            while lane.at < lane.apps.len() {
                let app = lane.apps[lane.at].clone();
                let stepped = self.step_app(&app, world, &mut cycle);
                if stepped {
                    if lane.sort == SortPolicy::Fair {
                        lane.at = (lane.at + 1) % lane.apps.len();
                    }
                } else {
                    lane.skip();
                }
                // The lane shows what it places next: a change of it moves the lane's key.
                let mut moved = false;
                if ordered {
                    let next = self.next_shown(lane);
                    if next != lane.shown {
                        if let Some(leaf) = lane.ancestors.last() {
                            priorities.change(&self.queues, leaf, lane.shown, next);
                        }
                        lane.shown = next;
                        moved = true;
                    }
                }
                // One step, then the lane takes its turn again among the others.
                if stepped || moved {
                    requeue = lane.at < lane.apps.len();
                    break;
                }
            }
            if requeue {
                heap.push(Reverse((self.fair_key(&lanes[i].ancestors, &priorities, &cycle.arriving), i)));
            }
        }
        self.preempt(world, &mut cycle);
        self.kept_room.0 = Some(Kept { room: cycle.room, filters: cycle.filters, at: now, of: pools_of });
        (cycle.report, cycle.out)
    }

    /// The room of every pool for a cycle at `now`, with what the cycle learns of the pools
    /// each user and task type may take, and the number of `pools`: the last cycle's, caught up
    /// with the pools changed since (so a cycle costs what changed, not every pool); made anew
    /// the first time, after `Pools` says everything changed, or when the kept one is dropped.
    fn room_at(&mut self, now: Millis, pools: &mut Pools) -> (Room, Filters, u64) {
        let totals = self.queues.any_lend_limit();
        let changed = pools.take_changed();
        let kept = self.kept_room.0.take().filter(|kept| {
            !totals && kept.room.total.is_none() && !changed.all && kept.of == changed.of && kept.at <= now
        });
        let caught_up = kept.and_then(|kept| {
            let mut room = kept.room;
            room.catch_up(pools, kept.at, now, &changed.names, &self.down).then_some((room, kept.filters))
        });
        let made = || Room::new(pools, now, &self.config.weights, &self.down, &self.runners, totals);
        let (room, filters) = caught_up.unwrap_or_else(|| (made(), Filters::default()));
        debug_assert!(room.same_as(&made()), "the kept room, caught up, is the room made anew");
        (room, filters, changed.of)
    }

    /// The leaf queues with applications that have work, each in its sort order.
    fn lanes(&self) -> Vec<Lane> {
        let mut leaves: BTreeMap<&QueuePath, Vec<&AppId>> = BTreeMap::new();
        for (id, app) in &self.apps {
            let pending = self.pending.get(id).is_some_and(|p| !p.is_empty());
            let work = match app.state {
                AppState::Reserving => app.awaits_gang() || pending,
                AppState::Accepted | AppState::Running | AppState::Resuming => pending,
                _ => false,
            };
            if work {
                leaves.entry(&app.spec.queue).or_default().push(id);
            }
        }
        leaves
            .into_iter()
            .map(|(queue, apps)| {
                let sort = self.queues.get(queue).map(|l| l.sort).unwrap_or_default();
                let mut keyed: Vec<((i64, f64, u64), AppId)> = apps
                    .into_iter()
                    .map(|id| {
                        let app = &self.apps[id];
                        let key = match sort {
                            SortPolicy::Fifo => (0, 0.0, app.seq),
                            SortPolicy::Priority => (-i64::from(self.app_priority(id)), 0.0, app.seq),
                            SortPolicy::Fair => (0, self.app_used(id).size(&self.config.weights), app.seq),
                        };
                        (key, id.clone())
                    })
                    .collect();
                keyed.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal));
                let mut ancestors: Vec<QueuePath> = queue.up_to_root().collect();
                ancestors.reverse();
                Lane { ancestors, apps: keyed.into_iter().map(|(_, id)| id).collect(), at: 0, sort, shown: None }
            })
            .collect()
    }

    /// What an application's placements hold.
    fn app_used(&self, id: &AppId) -> Resources {
        self.placements_of(id).map(|p| &p.resources).fold(Resources::new(), |sum, r| sum.checked_add(r).unwrap_or(sum))
    }

    /// What an application waits with: the priority of its first pending task, or its own (a
    /// gang waiting to be reserved).
    fn app_priority(&self, id: &AppId) -> i32 {
        match self.pending.get(id).and_then(|p| p.first()) {
            Some(first) => first.0 .0,
            None => self.apps[id].spec.priority.value(),
        }
    }

    /// The priority an application shows its queue: what it waits with (`app_priority`) while
    /// it has a task pending or a gang to reserve; none once nothing of it waits.
    fn shown_priority(&self, id: &AppId) -> Option<i32> {
        let pending = self.pending.get(id).is_some_and(|p| !p.is_empty());
        (pending || self.apps[id].awaits_gang()).then(|| self.app_priority(id))
    }

    /// The priority each queue with work shows its parent at the start of the cycle (a leaf:
    /// what the application it places first shows), kept up to date by the cycle as it places.
    fn queue_priorities(&self, lanes: &mut [Lane]) -> ShownPriorities {
        let mut shown = ShownPriorities::default();
        for lane in lanes {
            lane.shown = self.next_shown(lane);
            if let Some(leaf) = lane.ancestors.last() {
                shown.change(&self.queues, leaf, None, lane.shown);
            }
        }
        shown
    }

    /// What the application a lane places next shows, past those with nothing left to place.
    fn next_shown(&self, lane: &mut Lane) -> Option<i32> {
        while let Some(id) = lane.apps.get(lane.at) {
            if let Some(shown) = self.shown_priority(id) {
                return Some(shown);
            }
            lane.skip();
        }
        None
    }

    /// A leaf's key among the others: for each queue from the top of the tree down to the leaf,
    /// the priority it shows (higher first), then its fair share (lower first), counting the
    /// room held for it (`arriving`) as used.
    fn fair_key(
        &self,
        ancestors: &[QueuePath],
        priorities: &ShownPriorities,
        arriving: &HashMap<QueuePath, Resources>,
    ) -> Vec<u64> {
        ancestors
            .iter()
            .skip(1)
            .flat_map(|queue| {
                let priority = priorities.of(queue);
                // Higher first in a min-heap: i32::MAX maps to 0.
                let priority_key = (i64::from(i32::MAX) - i64::from(priority)) as u64;
                let empty = Resources::new();
                let allocated = self.usage.get(queue).map_or(&empty, |u| &u.allocated);
                let held = arriving.get(queue).and_then(|held| allocated.checked_add(held));
                let used = held.as_ref().unwrap_or(allocated);
                let guaranteed = self.queues.get(queue).map(|l| &l.guaranteed);
                let share = match guaranteed.filter(|g| g.iter().any(|(_, v)| v > 0)) {
                    Some(guaranteed) => guaranteed
                        .iter()
                        .filter(|(_, g)| *g > 0)
                        .map(|(name, g)| used.get_milli(name.as_str()) as f64 / g as f64)
                        .fold(0.0, f64::max),
                    // After every queue with a guarantee, least used first.
                    None => 1e15 + used.size(&self.config.weights),
                };
                [priority_key, share.max(0.0).to_bits()]
            })
            .collect()
    }

    /// The first limit, from the application's leaf queue up, that `wanted` more would break.
    /// What preemption holds for other tasks and gangs (`holding`: not this task itself) counts
    /// as used: the room a queue's preemptions free under its max is theirs.
    fn limit_hit(
        &self,
        app: &AppId,
        wanted: &Resources,
        starts_app: bool,
        holding: Option<&TaskId>,
    ) -> Option<LimitHit> {
        let app_id = app;
        let app = &self.apps[app];
        let nothing = QueueUsage::default();
        let held = !self.holders.is_empty() || !self.gang_holders.is_empty();
        app.spec.queue.up_to_root().find_map(|queue| {
            let limits = self.queues.get(&queue)?;
            let mut used = self.usage.get(&queue).unwrap_or(&nothing);
            let with_held;
            // Only a queue's own ceilings read what it has allocated.
            if held && (limits.max.is_some() || limits.borrow_limit.is_some()) {
                let others = self.held_under(&queue, (app_id, holding));
                if !others.is_empty() {
                    let allocated = used.allocated.checked_add(&others).unwrap_or_else(|| used.allocated.clone());
                    with_held = QueueUsage { allocated, ..used.clone() };
                    used = &with_held;
                }
            }
            let limit = limit_at(limits, used, app.spec.owner(), wanted, starts_app)?;
            Some(LimitHit { queue, limit })
        })
    }

    /// Whether placing `wanted` for the application would use room that a queue outside its own
    /// holds free of its guarantee (its `lend_limit`).
    fn lend_hit(&self, app: &AppId, wanted: &Resources, room: &Room) -> Option<LimitHit> {
        let free = room.total.as_ref()?;
        let held = self.queues.held_back(|queue| self.usage.get(queue).map(|u| &u.allocated));
        self.queues.lend_hit(&self.apps[app].spec.queue, wanted, free, &held)
    }

    /// Places the application's next thing that fits (its gang, or one task). False when nothing
    /// more of it can be placed this cycle.
    fn step_app(&mut self, app_id: &AppId, world: &mut World<'_>, cycle: &mut Cycle<'_>) -> bool {
        let app = &self.apps[app_id];
        if !app.counted {
            if let Some(hit) = self.limit_hit(app_id, &Resources::new(), true, None) {
                self.why_app.insert(app_id.clone(), Why::QueueLimit(hit));
                return false;
            }
        }
        if app.awaits_gang() {
            return match self.reserve(app_id, world, cycle) {
                Ok(()) => true,
                Err(why) => {
                    if let Why::CanNeverFit(never) = &why {
                        self.mark_never_fits(app_id, format!("its gang can never be placed: {never}"), cycle);
                    }
                    self.why_app.insert(app_id.clone(), why);
                    false
                }
            };
        }
        let typed = cycle.room.typed;
        let mut after = cycle.cursors.get(app_id).cloned();
        loop {
            if self.every_shape_failed(app_id, typed) {
                return false;
            }
            let Some(key) = self.next_to_try(app_id, after.as_ref(), typed) else { return false };
            let task = key.2.clone();
            after = Some(key);
            // A task that preempted takes the room held for it.
            let held = (app_id.clone(), task.clone());
            let given = match self.holders.contains_key(&held) {
                true => {
                    let given = self.unhold(&held, &mut cycle.room, &mut cycle.held);
                    if given.is_none() {
                        // Its pool is gone or down: nothing is held for it any more.
                        self.drop_hold(&held, cycle);
                    }
                    given
                }
                false => None,
            };
            let placed = self.place_task(app_id, &task, world, cycle);
            if let Some(given) = given {
                if placed.is_ok() {
                    let resources = self.tasks.get(app_id).and_then(|t| t.get(&task)).map(|t| &t.spec.resources);
                    arrived(&mut cycle.arriving, &self.apps[app_id].spec.queue, resources);
                }
                self.rehold(&held, given, placed.is_ok(), cycle);
            }
            match placed {
                Ok(()) => {
                    if let Some(after) = after {
                        cycle.cursors.insert(app_id.clone(), after);
                    }
                    return true;
                }
                Err(why) => {
                    let tried = self.tasks.get(app_id).and_then(|t| t.get(&task));
                    if let Some(shape) = tried.and_then(|t| Shape::of(t, self.type_ref(app_id, t, typed))) {
                        let failed = Failed { shape, task: task.clone(), why: why.clone(), typed };
                        self.failed_shapes.entry(app_id.clone()).or_default().push(failed);
                    }
                    // A queue's limit holds the application back, not only this task: it says so;
                    // and so does a task that can never fit (which fails it after a grace) or
                    // that no daemon runs (stranded until one does).
                    if matches!(
                        why,
                        Why::QueueLimit(_) | Why::CanNeverFit(_) | Why::NotRun { .. } | Why::TypeNotRun { .. }
                    ) {
                        self.why_app.entry(app_id.clone()).or_insert_with(|| why.clone());
                    }
                    if let Why::CanNeverFit(never) = &why {
                        self.mark_never_fits(app_id, format!("task `{task}` can never fit: {never}"), cycle);
                    }
                    // Room still held for it: it waits for its victims, and says so.
                    let key = (app_id.clone(), task);
                    let why = self.still_preempting(&key).unwrap_or(why);
                    self.why_task.insert(key, why);
                }
            }
        }
    }

    /// Places one pending task: on a placeholder of its group if one is free, else (once its
    /// application runs) on a pool of its own.
    fn place_task(
        &mut self,
        app_id: &AppId,
        task_id: &TaskId,
        world: &mut World<'_>,
        cycle: &mut Cycle<'_>,
    ) -> Result<(), Why> {
        let app = &self.apps[app_id];
        let task = &self.tasks[app_id][task_id];
        // A member of a gang being taken back by preemption (it ended, others still end) waits
        // for the gang to be reserved again: no member is placed alone.
        if task.slot.is_some() {
            return Err(Why::AfterGang);
        }
        // A task's type (read from its spec when it was added) matters only when some pool does
        // not run every type.
        let typed = cycle.room.typed && !task.spec.spec.is_empty();
        let task_type = if typed { self.type_of(app_id, task_id) } else { None };
        if let Some(group) = &task.spec.group {
            let runs = |pool: &PoolName| !cycle.room.typed || cycle.room.runs(pool, task_type.as_deref());
            let free = |s: &Slot| s.task.is_none() && &s.group == group && runs(&s.placement.pool);
            if let Some(slot) = app.slots.iter().position(free) {
                self.take_over(app_id, task_id, slot, world, cycle);
                return Ok(());
            }
        }
        if app.awaits_gang() {
            return Err(Why::AfterGang);
        }
        let group = task.spec.group.as_ref().and_then(|g| app.spec.group(g));
        let mut selector = group.map(|g| g.selector.clone()).unwrap_or_default();
        selector.extend(task.spec.selector.iter().map(|(k, v)| (k.clone(), v.clone())));
        let wanted = task.spec.resources.clone();
        let needs = task.spec.tokens.clone();
        if let Some(hit) = self
            .limit_hit(app_id, &wanted, !app.counted, Some(task_id))
            .or_else(|| self.lend_hit(app_id, &wanted, &cycle.room))
        {
            return Err(Why::QueueLimit(hit));
        }
        if let Some(never) = task_type.as_deref().and_then(|t| self.type_never_runs(t)) {
            return Err(Why::CanNeverFit(never));
        }
        let allowed = self.allowed(app_id, &[task_type], None, cycle);
        if let Some(why) = self.forbidden_tokens(app_id, &needs) {
            return Err(why);
        }
        let class = allowed.as_ref().map_or(0, |a| a.class);
        // A task with room held for it sees more room than the others: not what they found.
        let holder = task.held.is_some();
        if let Some(why) = cycle.no_room.get(&wanted, &selector, class).filter(|_| !holder) {
            return Err(why.clone());
        }
        let spot = match cycle.room.best_fit(&wanted, &selector, &HashMap::new(), allowed.as_ref()) {
            Ok(spot) => spot,
            Err(why) => {
                let why = match why {
                    Why::NoRoom { .. } => {
                        resources_never_fit(world.pools, &wanted, &selector).map_or(why, Why::CanNeverFit)
                    }
                    why => why,
                };
                if !holder {
                    cycle.no_room.insert(&wanted, &selector, class, why.clone());
                }
                return Err(why);
            }
        };
        for need in &needs {
            world.ledger.room_for(&need.namespace, need.units).map_err(tokens_why)?;
        }
        let owner = [app_id.as_str(), "/", task_id.as_str()].concat();
        let labels = pools::task_labels(app_id.as_str(), task_id.as_str());
        let token = (app_id.as_str(), task_id.as_str());
        let placement = commit(spot, &wanted, (owner, labels), token, &needs, world, cycle)?;
        let account = Account::of(&app.spec);
        self.charge(&account, &placement.resources, true);
        let Some(app) = self.apps.get_mut(app_id) else {
            cycle.out.broken.push(format!("placed a task of application `{app_id}`, which does not exist"));
            return Ok(());
        };
        let newly_counted = !app.counted;
        app.counted = true;
        let ran = app.state == AppState::Accepted && transition_known(app, &[AppEvent::Run], &mut cycle.out);
        if newly_counted || ran {
            cycle.out.apps.push(AppChange::App(app.clone()));
        }
        if newly_counted {
            self.count_app(&account, true);
        }
        self.allocate_task(app_id, task_id, placement, None, cycle);
        self.stats.placements += 1;
        cycle.report.placed += 1;
        Ok(())
    }

    /// Moves a Pending task to Allocated on `placement`.
    fn allocate_task(
        &mut self,
        app_id: &AppId,
        task_id: &TaskId,
        placement: Placement,
        slot: Option<u32>,
        cycle: &mut Cycle<'_>,
    ) {
        let Some(task) = self.tasks.get_mut(app_id).and_then(|t| t.get_mut(task_id)) else {
            cycle.out.broken.push(format!("placed task `{task_id}` of application `{app_id}`, which does not exist"));
            return;
        };
        if let Some(pending) = self.pending.get_mut(app_id) {
            pending.remove(&pending_key(task));
        }
        self.pending_shapes.remove(app_id);
        let before = task.state;
        task.state = task_known(task.state, &[TaskEvent::Schedule, TaskEvent::Allocate], &mut cycle.out);
        task.placement = Some(placement);
        // Placed: it holds no room any more.
        task.held = None;
        task.slot = slot;
        let after = task.state;
        cycle.out.apps.push(AppChange::Task(task.clone()));
        self.count(app_id, Some(before), Some(after));
    }

    /// A task takes placeholder `slot` of its application over, in place.
    fn take_over(
        &mut self,
        app_id: &AppId,
        task_id: &TaskId,
        slot: usize,
        world: &mut World<'_>,
        cycle: &mut Cycle<'_>,
    ) {
        let Some(taken) = self.apps.get_mut(app_id).and_then(|app| app.slots.get_mut(slot)) else {
            cycle.out.broken.push(format!("application `{app_id}` has no placeholder {slot} to take over"));
            return;
        };
        taken.task = Some(task_id.clone());
        let placement = taken.placement.clone();
        // The alloc now names the task in it, not the placeholder.
        let labels = pools::task_labels(app_id.as_str(), task_id.as_str());
        cycle.out.pools.extend(world.pools.relabel_held(&placement.pool, placement.alloc, labels));
        let member = taken.member;
        let Some(app) = self.apps.get(app_id) else { return };
        cycle.out.apps.push(AppChange::App(app.clone()));
        self.allocate_task(app_id, task_id, placement, Some(member), cycle);
        self.stats.takeovers += 1;
        cycle.report.taken_over += 1;
    }

    /// Reserves every placeholder of the application's gang, or none; a gang with room held for
    /// it (it preempted) takes that room.
    fn reserve(&mut self, app_id: &AppId, world: &mut World<'_>, cycle: &mut Cycle<'_>) -> Result<(), Why> {
        let given = self.unhold_gang(app_id, cycle);
        let reserved = self.reserve_now(app_id, world, cycle);
        match given {
            Some(given) => {
                if reserved.is_ok() {
                    let app = &self.apps[app_id];
                    arrived(&mut cycle.arriving, &app.spec.queue, Some(&preempt::gang_total(app)));
                }
                self.rehold_gang(app_id, given, reserved, cycle)
            }
            None => reserved,
        }
    }

    /// The task types of the application's gang members known now: a placeholder goes where
    /// they all run.
    fn gang_types(&self, app_id: &AppId, typed: bool) -> Vec<Option<String>> {
        self.tasks.get(app_id).filter(|_| typed).map_or_else(Vec::new, |tasks| {
            let mut types: Vec<Option<String>> =
                tasks.values().filter(|t| t.spec.group.is_some()).map(|t| self.type_of(app_id, &t.spec.id)).collect();
            types.sort();
            types.dedup();
            types
        })
    }

    fn reserve_now(&mut self, app_id: &AppId, world: &mut World<'_>, cycle: &mut Cycle<'_>) -> Result<(), Why> {
        let app = &self.apps[app_id];
        let members = app.gang_members();
        let total = members.iter().fold(Resources::new(), |sum, m| sum.checked_add(&m.2).unwrap_or(sum));
        if let Some(hit) =
            self.limit_hit(app_id, &total, !app.counted, None).or_else(|| self.lend_hit(app_id, &total, &cycle.room))
        {
            return Err(Why::GangNotReserved { member: None, cause: Some(Box::new(Why::QueueLimit(hit))) });
        }
        let types = self.gang_types(app_id, cycle.room.typed);
        if let Some(never) = types.iter().flatten().find_map(|t| self.type_never_runs(t)) {
            return Err(Why::CanNeverFit(never));
        }
        let needs: Vec<TokenNeed> = members.iter().flat_map(|m| m.4.iter().cloned()).collect();
        if let Some(why) = self.forbidden_tokens(app_id, &needs) {
            return Err(Why::GangNotReserved { member: None, cause: Some(Box::new(why)) });
        }
        // A gang is never split between pools that executors run and pools they do not: with a
        // type it goes where its types run; with none, on run pools if they have the room, else
        // on the others.
        let sides: &[Option<bool>] = match cycle.room.typed && types.iter().all(Option::is_none) {
            true => &[Some(true), Some(false)],
            false => &[None],
        };
        let mut found = None;
        let mut refusals = Vec::with_capacity(sides.len());
        for side in sides {
            let allowed = self.allowed(app_id, &types, *side, cycle);
            match room_for_members(&members, &cycle.room, allowed.as_ref()) {
                Ok(spots) => {
                    found = Some(spots);
                    break;
                }
                Err(why) => refusals.push(why),
            }
        }
        // Why not: a side's lack of room says more than a side with no pool at all.
        let no_pool = |why: &Why| matches!(why, Why::GangNotReserved { cause: Some(cause), .. } if matches!(**cause, Why::NoPoolMatches { .. }));
        let found = found.ok_or_else(|| {
            let first = refusals.iter().position(|why| !no_pool(why)).unwrap_or(0);
            refusals.swap_remove(first)
        });
        let spots = found.map_err(|why| match why {
            Why::GangNotReserved { member: Some((group, member)), cause: Some(cause) }
                if matches!(*cause, Why::NoRoom { .. }) =>
            {
                let named = members.iter().find(|m| m.0 == group && m.1 == member);
                match named.and_then(|(_, _, wanted, selector, _)| resources_never_fit(world.pools, wanted, selector)) {
                    Some(never) => Why::CanNeverFit(never),
                    None => Why::GangNotReserved { member: Some((group, member)), cause: Some(cause) },
                }
            }
            why => why,
        })?;
        // Then every token, summed per namespace.
        let mut units: BTreeMap<&crate::names::NamespaceName, u64> = BTreeMap::new();
        for need in members.iter().flat_map(|m| &m.4) {
            let sum = units.entry(&need.namespace).or_default();
            *sum = sum.saturating_add(need.units);
        }
        for (namespace, units) in units {
            world.ledger.room_for(namespace, units).map_err(|shortage| match tokens_why(shortage) {
                never @ Why::CanNeverFit(_) => never,
                why => Why::GangNotReserved { member: None, cause: Some(Box::new(why)) },
            })?;
        }
        // Everything is there: take it all.
        let mut slots: Vec<Slot> = Vec::with_capacity(members.len());
        for ((group, member, wanted, _, needs), spot) in members.into_iter().zip(spots.iter().copied()) {
            let owner = format!("{app_id}/{group}#{member}");
            let member_name = format!("{group}#{member}");
            let labels = pools::placeholder_labels(app_id.as_str(), group.as_str(), member);
            match commit(spot, &wanted, (owner, labels), (app_id.as_str(), &member_name), &needs, world, cycle) {
                Ok(placement) => slots.push(Slot { group, member, placement, task: None }),
                Err(why) => {
                    // Not expected (everything was checked): undo what was taken.
                    for (slot, spot) in slots.iter().zip(spots) {
                        cycle.room.give_back(spot, &slot.placement.resources);
                        release(&slot.placement, cycle.now, world, &mut cycle.out);
                    }
                    return Err(Why::GangNotReserved { member: None, cause: Some(Box::new(why)) });
                }
            }
        }
        let Some(app) = self.apps.get_mut(app_id) else {
            cycle.out.broken.push(format!("reserved a gang for application `{app_id}`, which does not exist"));
            return Ok(());
        };
        let (account, counted) = (Account::of(&app.spec), app.counted);
        app.slots = slots;
        // Reserved: it holds no room any more.
        app.held.clear();
        app.reserved_at = Some(cycle.now);
        app.counted = true;
        transition_known(app, &[AppEvent::Run], &mut cycle.out);
        cycle.out.apps.push(AppChange::App(app.clone()));
        self.charge(&account, &total, true);
        if !counted {
            self.count_app(&account, true);
        }
        self.stats.reservations += 1;
        cycle.report.reserved += 1;
        Ok(())
    }

    /// The pools a placement of `app_id`'s tasks of `types` may take this cycle: those its user
    /// may use and that run every one of the types (and on `side`, when given: run by a live
    /// executor or not); `None` when every pool may be taken.
    fn allowed(
        &self,
        app_id: &AppId,
        types: &[Option<String>],
        side: Option<bool>,
        cycle: &mut Cycle<'_>,
    ) -> Option<Allowed> {
        let tenancy = &self.config.tenancy;
        // Every pool takes it: no tenancy, and its types (none, here) kept from no pool.
        let untyped = types.iter().all(Option::is_none) && !cycle.room.limited && side.is_none();
        if tenancy.is_open() && (!cycle.room.typed || untyped) {
            return None;
        }
        let spots = &cycle.room.spots;
        let filters = &mut cycle.filters;
        let user = (!tenancy.is_open()).then(|| self.apps[app_id].spec.principal());
        let permitted = user.as_ref().map(|user| match filters.permitted.get(user) {
            Some(by_spot) => by_spot.clone(),
            None => {
                let by_spot: Arc<[bool]> =
                    spots.iter().map(|spot| tenancy.may_use(user, &Resource::Pool(spot.name.to_string()))).collect();
                filters.permitted.insert(user.clone(), by_spot.clone());
                by_spot
            }
        });
        let key = match types {
            [] => None,
            [one] => one.clone(),
            many => Some(many.iter().map(|t| t.clone().unwrap_or_default()).collect::<Vec<_>>().join(",")),
        };
        // Looked up before made: a placement of a user and type seen before this cycle clones
        // nothing but two reference counts.
        let running = cycle.room.typed.then(|| match filters.running.get(&key) {
            Some(by_spot) => by_spot.clone(),
            None => {
                let by_spot: Arc<[bool]> =
                    spots.iter().map(|spot| types.iter().all(|t| spot.runs(t.as_deref()))).collect();
                filters.running.insert(key.clone(), by_spot.clone());
                by_spot
            }
        });
        let side = side.map(|run| {
            let by_spot = filters
                .sides
                .entry(run)
                .or_insert_with(|| spots.iter().map(|spot| spot.run.is_some() == run).collect());
            (run, by_spot.clone())
        });
        let class_key: ClassKey = (user, key, side.as_ref().map(|s| s.0));
        let class = match filters.classes.get(&class_key) {
            Some(class) => *class,
            None => {
                let next = u32::try_from(filters.classes.len()).unwrap_or(u32::MAX).saturating_add(1);
                filters.classes.insert(class_key.clone(), next);
                next
            }
        };
        let (user, key, _) = class_key;
        Some(Allowed { class, user: user.map(|u| u.user), task_type: key, permitted, running, side })
    }

    /// Notes that a task of the application (or its gang) can never fit: since the cycle that
    /// first said so, it fails once `never_fits_grace_ms` has passed.
    fn mark_never_fits(&mut self, app_id: &AppId, what: String, cycle: &Cycle<'_>) {
        let since = cycle.never_fits_before.get(app_id).map_or(cycle.now, |(since, _)| *since);
        self.never_fits.entry(app_id.clone()).or_insert((since, what));
    }

    /// Why the application's user may not hold `needs`: the first namespace it may not use.
    fn forbidden_tokens(&self, app_id: &AppId, needs: &[TokenNeed]) -> Option<Why> {
        if self.config.tenancy.is_open() || needs.is_empty() {
            return None;
        }
        let spec = &self.apps[app_id].spec;
        let user = spec.principal();
        let need = needs
            .iter()
            .find(|n| !self.config.tenancy.may_use(&user, &Resource::Namespace(n.namespace.to_string())))?;
        Some(Why::Forbidden { user: spec.user.clone(), what: format!("namespace `{}`", need.namespace) })
    }

    /// Runs the timers that are due: reserve timeouts, placeholder timeouts, completing grace.
    /// Returns how many applications timed out.
    pub(super) fn expire(&mut self, now: Millis, world: &mut World<'_>, out: &mut Outcome) -> usize {
        self.end_graces(now, world, out);
        self.evict(now, world, out);
        let due: Vec<AppId> = self
            .apps
            .values()
            .filter(|app| app_deadline(app, &self.config).is_some_and(|d| d <= now))
            .map(|app| app.spec.id.clone())
            .collect();
        let mut timed_out = 0;
        for id in due {
            let app = &self.apps[&id];
            let style = app.spec.policy.gang;
            if app.reserve_deadline().is_some_and(|d| d <= now) {
                timed_out += 1;
                self.stats.reserve_timeouts += 1;
                match style {
                    GangStyle::Soft => {
                        let Some(app) = self.apps.get_mut(&id) else { continue };
                        app.gang_given_up = true;
                        // Nothing of it is placed: it waits as an ordinary application.
                        transition_known(app, &[AppEvent::Resume, AppEvent::Accept], out);
                        app.reason = Some("its gang was not reserved in time; it runs without one".to_owned());
                        out.apps.push(AppChange::App(app.clone()));
                    }
                    GangStyle::Hard => self.fail_with(&id, RESERVATION_TIMEOUT, now, world, out),
                }
            } else if app.placeholder_deadline().is_some_and(|d| d <= now) {
                timed_out += 1;
                self.stats.placeholder_timeouts += 1;
                // [YuniKorn `timeoutPlaceholderProcessing`] An application that already runs
                // tasks goes on without its unused placeholders, whatever its style; one that
                // runs none yet loses its reservation (Soft goes on without, Hard fails).
                let placed = self.tasks.get(&id).is_some_and(|tasks| {
                    tasks.values().any(|t| matches!(t.state, TaskState::Allocated | TaskState::Running))
                });
                if placed {
                    self.release_unused_placeholders(&id, now, world, out);
                } else {
                    self.lose_reservation(&id, None, RESERVATION_TIMEOUT, now, world, out);
                }
            } else if app.state == AppState::Completing {
                self.finish_completing(&id, now, out);
            } else if app.state.is_terminal() {
                self.forget(&id, out);
            }
        }
        let grace = self.config.never_fits_grace_ms;
        let unfit: Vec<(AppId, String)> = self
            .never_fits
            .iter()
            .filter(|(_, (since, _))| since.saturating_add(grace) <= now)
            .map(|(id, (_, what))| (id.clone(), what.clone()))
            .collect();
        for (id, what) in unfit {
            self.never_fits.remove(&id);
            if self.apps.get(&id).is_some_and(|app| !app.state.is_terminal()) {
                let waited = std::time::Duration::from_millis(grace);
                let reason = format!("can_never_fit: {what} (no pool or quota grew back in {waited:?})");
                self.fail_with(&id, &reason, now, world, out);
            }
        }
        timed_out
    }

    /// The earliest time a timer is due, if any.
    pub fn next_deadline(&self) -> Option<Millis> {
        let grace = self.config.never_fits_grace_ms;
        let unfit = self.never_fits.values().map(|(since, _)| since.saturating_add(grace)).min();
        let apps = self.apps.values().filter_map(|app| app_deadline(app, &self.config));
        apps.chain(unfit).chain(self.preemption_deadline()).min()
    }
}

fn app_deadline(app: &super::App, config: &super::SchedConfig) -> Option<Millis> {
    let completing = (app.state == AppState::Completing)
        .then(|| app.completing_since.unwrap_or(0).saturating_add(config.completing_grace_ms));
    let forget = app.ended_at.filter(|_| app.state.is_terminal()).map(|at| at.saturating_add(config.retention_ms));
    [app.reserve_deadline(), app.placeholder_deadline(), completing, forget].into_iter().flatten().min()
}

/// Room held for work of `leaf` was taken by it: `resources` (if known) come off what is
/// arriving in `leaf` and every queue above.
fn arrived(arriving: &mut HashMap<QueuePath, Resources>, leaf: &QueuePath, resources: Option<&Resources>) {
    let Some(resources) = resources.filter(|_| !arriving.is_empty()) else { return };
    for queue in leaf.ancestors() {
        if let Some(sum) = arriving.get_mut(queue) {
            *sum = sum.saturating_sub(resources);
        }
    }
}

/// Room for every member of a gang, on a scratch copy of what is free: the spot of each.
fn room_for_members(members: &[super::GangMember], room: &Room, allowed: Option<&Allowed>) -> Result<Vec<usize>, Why> {
    let mut promised: HashMap<usize, Resources> = HashMap::new();
    let mut spots = Vec::with_capacity(members.len());
    for (group, member, wanted, selector, _) in members {
        let found = room.best_fit(wanted, selector, &promised, allowed);
        let spot = found.map_err(|why| Why::GangNotReserved {
            member: Some((group.clone(), *member)),
            cause: Some(Box::new(why)),
        })?;
        let sum = promised.entry(spot).or_default();
        *sum = sum.checked_add(wanted).unwrap_or_else(|| sum.clone());
        spots.push(spot);
    }
    Ok(spots)
}

/// Why tokens cannot be had now: more than the namespace's quota can never be (a quota of 0 is
/// a pause, waited out).
fn tokens_why(shortage: TokenShortage) -> Why {
    match tokens_never_fit(&shortage) {
        Some(never) => Why::CanNeverFit(never),
        None => Why::Tokens(shortage),
    }
}

/// Takes an alloc of `wanted` on `spot` and a grant of every need under the token of the
/// placement of `(app, what)` ([`Token::of_placement`]: no client's), or nothing.
fn commit(
    spot: usize,
    wanted: &Resources,
    (owner, labels): (String, Labels),
    (app, what): (&str, &str),
    needs: &[TokenNeed],
    world: &mut World<'_>,
    cycle: &mut Cycle<'_>,
) -> Result<Placement, Why> {
    // Application and task ids always make a valid token; checked before anything is taken.
    let Ok(token) = Token::of_placement(app, what) else {
        cycle.out.broken.push(format!("`{app}:{what}` does not make a valid token for a placement's grants"));
        return Err(Why::NoRoom { wanted: wanted.clone(), closest: None });
    };
    let pool = cycle.room.spots[spot].name.clone();
    let request = AllocRequest { min: wanted.clone(), max: None, owner, labels, metadata: None };
    let mut attempts = 0;
    let (alloc, changes) = loop {
        let id = AllocId((cycle.ids)());
        match world.pools.accept_held(&pool, request.clone(), id, cycle.now) {
            Ok(made) => break made,
            Err(PoolError::AllocIdTaken { .. }) if attempts < 8 => attempts += 1,
            Err(_) => return Err(Why::NoRoom { wanted: wanted.clone(), closest: None }),
        }
    };
    cycle.out.pools.extend(changes);
    cycle.room.take(spot, &alloc.resources);
    let mut placement =
        Placement { pool, alloc: alloc.id, resources: alloc.resources, grants: Vec::new(), at: cycle.now };
    for need in needs {
        let request = AllocateRequest {
            namespace: need.namespace.clone(),
            token: token.clone(),
            units: need.units,
            scope: None,
            constraints: Constraints::default(),
            lease: LeaseRequest::None,
        };
        match world.ledger.allocate_held(request, cycle.now, false) {
            Ok((Decision::Granted { grant, .. }, effects)) => {
                cycle.out.ledger(effects);
                placement.grants.push(HeldTokens {
                    namespace: grant.namespace,
                    token: grant.token,
                    units: grant.units,
                });
            }
            _ => {
                // Not expected (room_for said yes): undo what was taken.
                cycle.room.give_back(spot, &placement.resources);
                release(&placement, cycle.now, world, &mut cycle.out);
                let shortage = world.ledger.room_for(&need.namespace, need.units).err();
                return Err(shortage.map_or(Why::NoRoom { wanted: wanted.clone(), closest: None }, Why::Tokens));
            }
        }
    }
    Ok(placement)
}
