//! Preemption [YuniKorn's laws, made exact; issue 42]: after a cycle's placements, a pending task
//! that found no room may take room from placed tasks, on one pool; and a pool that is drained,
//! or shrank below what is placed there, takes its own tasks back (`evict`).
//!
//! At length, as one thing: the marks on victims, the room held for preemptors and the calling
//! off of what is no longer wanted are one state, kept in step by every function here; apart,
//! each file would have to know the others' invariants.
//!
//! Who may preempt: a task that has waited its queue's `preemption_delay` (since it was added, or
//! last preempted itself), whose tokens are there (preemption frees pools, not tokens), and
//! either whose queues are below their guarantees with it placed (then it takes tasks of lower
//! or equal priority), or that has a higher priority than its victims (where the fences allow);
//! one its queue's own ceiling (`max`, `borrow_limit`) holds back takes only tasks of a lower
//! priority under that queue, as many as free what the ceiling needs too. Room a decision frees
//! beyond its preemptor's need is held for the next tasks owed their guarantee (`claim_surplus`).
//!
//! Who may be taken: a placed task of another application, preemptable, taken fewer than
//! `max_preemptions` times, not already being preempted, inside the preemptor's fence, in no
//! queue with preemption `disabled`, and only where taking it leaves each of its queues at or
//! above its guarantee (a queue above the preemptor too gains what the preemptor holds). A
//! reserved gang's members go whole or not at all (a gang is never left below its minimum): all
//! of them or none, as one victim of its highest member's priority, and only once every member
//! is placed and may be taken; once taken back, it waits to be reserved again (`regang`).
//! Lowest priority first, then the youngest; then a last pass drops every victim not needed.
//!
//! Invariants:
//! - no overcommit: a victim keeps its placement until it has ended (its executor ends the
//!   attempt and reports it, or its grace runs out); only then is its room free;
//! - no stolen room: the room the preemptor needs on its pool is held for it (`Task::held`):
//!   every other placement sees that pool smaller until the preemptor is placed;
//! - no loops: a victim's own priority is at most its preemptor's, and its queues stay at or
//!   above their guarantees, so it cannot preempt back; each preemption is counted on the victim.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};

use super::{Cycle, Room};
use crate::apps::queues::{PreemptionPolicy, QueuePath};
use crate::apps::states::TaskState;
use crate::apps::why::Preemption;
use crate::apps::{AppChange, AppId, Outcome, Preempting, Scheduler, TaskId, Why, World, DEFAULT_PREEMPTION_DELAY_MS};
use crate::pools::{selector_matches, PoolName};
use crate::quotas::Millis;
use crate::resources::Resources;

type TaskRef = (AppId, TaskId);

/// A task that may be taken: its priority (as the preemptor's is seen), its age (placed at,
/// added as), itself as listed, its queue.
type Candidate<'a> = (i32, (Millis, u64), &'a Listed, &'a QueuePath);

/// What a plan finds of the placed tasks of one application (by its index in `Placed::apps`)
/// and priority: the rule their queues break, else their priority and the preemptor's where the
/// paths meet.
type Seen = (usize, i32, Result<(i32, i32), &'static str>);

/// What the plans of one cycle found of the queues of an application's tasks at one priority
/// (the application by its index in `Placed::apps`), for a preemptor of one leaf and priority:
/// the queues do not change during a cycle's planning.
type SeenInCycle = HashMap<(usize, i32, QueuePath, i32), Result<(i32, i32), &'static str>>;

/// What the plans of one cycle read once: see `SeenInCycle`; each preemptor leaf's path up to
/// the root and fence; and, for the last size wanted, whether each pool's free room holds it
/// (known until a decision takes room from that pool). With how many pools and placed tasks
/// they looked at, which bounds them.
#[derive(Default)]
struct PlanCache {
    looked: usize,
    seen: SeenInCycle,
    leaves: HashMap<QueuePath, std::rc::Rc<(Vec<QueuePath>, QueuePath)>>,
    free_fits: Option<(Resources, Vec<Option<bool>>)>,
}

impl PlanCache {
    /// Whether the free room of the room's pool `spot` holds `wanted`.
    fn free_fits(&mut self, room: &Room, spot: usize, wanted: &Resources) -> bool {
        if self.free_fits.as_ref().is_none_or(|(w, _)| w != wanted) {
            self.free_fits = Some((wanted.clone(), vec![None; room.spots.len()]));
        }
        let Some((_, known)) = self.free_fits.as_mut() else { return room.spots[spot].free.fits(wanted) };
        *known[spot].get_or_insert_with(|| room.spots[spot].free.fits(wanted))
    }

    /// Room was taken from the room's pool `spot`.
    fn taken_from(&mut self, spot: usize) {
        if let Some(known) = self.free_fits.as_mut().and_then(|(_, known)| known.get_mut(spot)) {
            *known = None;
        }
    }
}

/// A cycle's plans look at no more pools and placed tasks than this many plans that each read
/// every pool: a plan that stops early (at a pool no other can beat, see `Placed::floor`) costs
/// little, and more plans are made.
const MAX_PLANS_PER_CYCLE: usize = 16;

/// The most tasks still inside their delay one cycle says whom they would preempt for.
const MAX_PREVIEWS_PER_CYCLE: usize = 4;

/// What may preempt, in the order a cycle's preemptions take them (the greatest first): whether
/// its queue is below its guarantee, its priority, how early it was added.
type Waiting = (bool, i32, Reverse<u64>, Wants);

/// A task that found no room, or an application whose gang found none.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Wants {
    Task(TaskRef),
    Gang(AppId),
}

const OWN_APPLICATION: &str = "the tasks that hold the room are of its own application";
const BEING_PREEMPTED: &str = "the tasks that hold the room are being preempted already";
const OUTSIDE_CEILING: &str = "the tasks that hold the room are outside the queue whose limit holds it back";
const GANG_KEPT: &str = "the tasks that hold the room are gang members, and a gang is never broken";

/// The placed tasks on each pool of the cycle's room as its plans see them: for each (by its
/// index in the room), those not marked by this cycle, and those it marked counted by
/// application (refused without a look up). What a plan reads of a task is read once, when
/// listed: during a cycle's planning nothing changes a placed task but its mark.
#[derive(Clone)]
struct Placed {
    at: Vec<(Vec<Listed>, HashMap<usize, usize>)>,
    /// The applications with placed tasks, and their queues.
    apps: Vec<(AppId, QueuePath)>,
    /// The gangs that may be taken whole.
    gangs: Vec<PlacedGang>,
    /// What placed tasks hold, each once per run of tasks that hold alike.
    shapes: Vec<Resources>,
    /// How many are placed.
    count: usize,
    /// The least score (see `plan`) a plan with victims can have: none takes a task of lower
    /// priority than the lowest placed, fewer than one, or one smaller than the smallest placed.
    floor: (i32, usize, u64),
}

/// A placed task as plans read it.
#[derive(Clone)]
struct Listed {
    /// Its application, by its index in `Placed::apps`.
    app: usize,
    task: TaskId,
    priority: i32,
    /// Placed at, added as.
    age: (Millis, u64),
    /// What it holds, by its index in `Placed::shapes`.
    shape: usize,
    /// The rule that keeps it from being taken whatever the preemptor, if any.
    rule: Option<&'static str>,
    /// The gang it is a member of (by its index in `Placed::gangs`): taken whole or not at all.
    gang: Option<usize>,
}

/// A reserved gang whose every member is placed and may be taken: all of it goes, or none.
#[derive(Clone)]
struct PlacedGang {
    /// Every member: its id, what it holds, its pool's index in the room (if there).
    members: Vec<(TaskId, Resources, Option<usize>)>,
    /// What all its members hold.
    total: Resources,
}

impl PlacedGang {
    /// What its members hold on the room's pool `spot`.
    fn on(&self, spot: usize) -> Resources {
        let here = self.members.iter().filter(|m| m.2 == Some(spot));
        here.fold(Resources::new(), |sum, m| sum.checked_add(&m.1).unwrap_or(sum))
    }
}

impl Placed {
    /// The plan's victims on the room's pool `spot` are marked: listed no more, counted.
    fn mark(&mut self, spot: usize, victims: &[(TaskRef, Resources)]) {
        let indexes: Vec<usize> = victims.iter().filter_map(|((app, _), _)| self.app_index(app)).collect();
        let Some((listed, marked)) = self.at.get_mut(spot) else { return };
        for index in indexes {
            *marked.entry(index).or_default() += 1;
        }
        let apps = &self.apps;
        let is = |task: &Listed, victim: &TaskRef| task.task == victim.1 && apps[task.app].0 == victim.0;
        let before = listed.len();
        listed.retain(|task| !victims.iter().any(|(victim, _)| is(task, victim)));
        // A gang's members on other pools go with it.
        if before - listed.len() < victims.len() {
            for (listed, _) in self.at.iter_mut() {
                listed.retain(|task| !victims.iter().any(|(victim, _)| is(task, victim)));
            }
        }
    }

    /// The index of `app` in `apps`, if it has placed tasks.
    fn app_index(&self, app: &AppId) -> Option<usize> {
        self.apps.iter().position(|(a, _)| a == app)
    }
}

/// What a plan makes room for: a task, or a member of a gang.
#[derive(Clone, Copy)]
struct Want<'a> {
    app: &'a AppId,
    leaf: &'a QueuePath,
    wanted: &'a Resources,
    selector: &'a crate::pools::Labels,
    priority: i32,
    /// Whether the preemptor's queues are below their guarantees with it placed.
    below: bool,
    /// The queue whose max (or borrow limit) holds it back, and what its tasks must free of it:
    /// then its victims are of that queue, of lower priority, and free that too.
    ceiling: Option<(&'a QueuePath, &'a Resources)>,
}

/// The queue whose resource ceiling (its `max`, or its guarantee and `borrow_limit`) keeps a task
/// from being placed, if that is what `why` says.
fn ceiling_hit(why: &Why) -> Option<&crate::apps::queues::LimitHit> {
    use crate::apps::queues::Limit;
    match why {
        Why::QueueLimit(hit) if matches!(hit.limit, Limit::Max { .. } | Limit::Borrow { .. }) => Some(hit),
        Why::NoRoomYet { room, .. } => ceiling_hit(room),
        _ => None,
    }
}

/// Adds to `surplus` on `spot` what victims free there (`freed`) beyond what their preemptors
/// take (`taken`).
fn spare(surplus: &mut HashMap<usize, Resources>, spot: usize, freed: &Resources, taken: &Resources) {
    let extra = freed.saturating_sub(taken);
    if !extra.is_empty() {
        let sum = surplus.entry(spot).or_default();
        *sum = sum.checked_add(&extra).unwrap_or_else(|| sum.clone());
    }
}

/// What every member of an application's gang holds together.
pub(super) fn gang_total(app: &crate::apps::App) -> Resources {
    app.gang_members().iter().fold(Resources::new(), |sum, m| sum.checked_add(&m.2).unwrap_or(sum))
}

/// Victims on one pool for one preemptor.
struct Plan {
    spot: usize,
    /// Every task taken: those on the pool, and the other members of a gang taken whole.
    victims: Vec<(TaskRef, Resources)>,
    /// What the victims free on the pool.
    freed: Resources,
    /// Whether the preemptor's queues are below their guarantees (else it preempts by priority).
    below: bool,
}

/// What preemptions decided and not yet carried out will move, per queue (and every queue above
/// it): what the victims being preempted will leave, what the tasks with room held will take.
/// Guarantees are judged on usage after both.
#[derive(Default, Clone)]
struct Flows {
    leaving: HashMap<QueuePath, Resources>,
    arriving: HashMap<QueuePath, Resources>,
}

fn add_up(map: &mut HashMap<QueuePath, Resources>, leaf: &QueuePath, resources: &Resources) {
    add_up_from(map, leaf.ancestors(), resources);
}

/// Adds `resources` to the sum of each of `queues` (paths as `QueuePath::ancestors` answers).
fn add_up_from<'a>(
    map: &mut HashMap<QueuePath, Resources>,
    queues: impl Iterator<Item = &'a str>,
    resources: &Resources,
) {
    for queue in queues {
        match map.get_mut(queue) {
            Some(sum) => *sum = sum.checked_add(resources).unwrap_or_else(|| sum.clone()),
            None => {
                let sum = Resources::new().checked_add(resources).unwrap_or_default();
                map.insert(QueuePath::of_ancestor(queue), sum);
            }
        }
    }
}

/// Why no victim could be taken: counts per rule, the most common named (of as many, the last
/// in the order of the rules' texts).
#[derive(Default)]
struct Refusals(Vec<(&'static str, usize)>);

impl Refusals {
    fn note(&mut self, rule: &'static str) {
        self.note_n(rule, 1);
    }

    fn note_n(&mut self, rule: &'static str, n: usize) {
        if n == 0 {
            return;
        }
        // A few rules, most often the same text again: found by its address first.
        let same = |r: &&'static str| std::ptr::eq(*r, rule) || *r == rule;
        match self.0.iter_mut().find(|(r, _)| same(r)) {
            Some((_, count)) => *count += n,
            None => self.0.push((rule, n)),
        }
    }

    fn say(&self) -> String {
        match self.0.iter().max_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(b.0))) {
            Some((rule, _)) => format!("it cannot preempt: {rule}"),
            None => "it cannot preempt: nothing placed on the pools it may use would free enough room".to_owned(),
        }
    }
}

/// A task with no room says what preemption says of it too (one that no longer says why it
/// waits is left so).
fn wait_with(why_task: &mut HashMap<TaskRef, Why>, key: &TaskRef, preemption: Preemption) {
    if let Some(why) = why_task.get_mut(key) {
        let room = std::mem::replace(why, Why::AfterGang);
        *why = Why::NoRoomYet { room: Box::new(room), preemption };
    }
}

impl Scheduler {
    /// Notes a task's preemption marks in the indexes (at restore).
    pub(in crate::apps) fn index_preemption(&mut self, task: &crate::apps::Task) {
        let key = || (task.app.clone(), task.spec.id.clone());
        if let Some(p) = &task.preempting {
            self.victims.insert(key(), (p.by.clone(), p.at));
        }
        if let Some(pool) = &task.held {
            self.holders.insert(key(), pool.clone());
        }
    }

    /// The room held on each pool: what holders still need there beyond what the tasks being
    /// preempted there will free. Drops stale index entries.
    pub(super) fn held_room(&mut self) -> HashMap<PoolName, Resources> {
        let tasks = &self.tasks;
        let task = |key: &TaskRef| tasks.get(&key.0).and_then(|t| t.get(&key.1));
        self.holders.retain(|key, pool| {
            task(key).is_some_and(|t| t.state == TaskState::Pending && t.held.as_ref() == Some(pool))
        });
        self.victims.retain(|key, _| task(key).is_some_and(|t| t.preempting.is_some()));
        let apps = &self.apps;
        self.gang_holders.retain(|app| apps.get(app).is_some_and(|a| a.awaits_gang() && !a.held.is_empty()));
        self.room_held().into_iter().collect()
    }

    /// The room held on each pool for preemptors: what the tasks and gangs that preempted still
    /// need there beyond what the tasks being preempted there will free. Every placement but a
    /// holder's, the scheduler's own and an outside worker's alike, is to leave it free.
    pub fn room_held(&self) -> std::collections::BTreeMap<PoolName, Resources> {
        let mut held = std::collections::BTreeMap::new();
        if self.holders.is_empty() && self.gang_holders.is_empty() {
            return held;
        }
        let task = |key: &TaskRef| self.tasks.get(&key.0).and_then(|t| t.get(&key.1));
        let mut add = |pool: &PoolName, resources: &Resources| {
            let sum: &mut Resources = held.entry(pool.clone()).or_default();
            *sum = sum.checked_add(resources).unwrap_or_else(|| sum.clone());
        };
        for (key, pool) in &self.holders {
            // An entry not (or no longer) so in its task is stale: it holds nothing.
            let Some(t) = task(key).filter(|t| t.state == TaskState::Pending && t.held.as_ref() == Some(pool)) else {
                continue;
            };
            add(pool, &t.spec.resources);
        }
        for app in self.gang_holders.iter().filter_map(|app| self.apps.get(app)) {
            if !app.awaits_gang() {
                continue;
            }
            for ((_, _, wanted, _, _), pool) in app.gang_members().iter().zip(&app.held) {
                add(pool, wanted);
            }
        }
        for key in self.victims.keys() {
            let Some(placement) = task(key).filter(|t| t.preempting.is_some()).and_then(|t| t.placement.as_ref())
            else {
                continue;
            };
            if let Some(sum) = held.get_mut(&placement.pool) {
                *sum = sum.saturating_sub(&placement.resources);
            }
        }
        held.retain(|_, r| !r.is_empty());
        held
    }

    /// The earliest deadline of preemption: a victim's grace, or a task's delay.
    pub(super) fn preemption_deadline(&self) -> Option<Millis> {
        let grace = self.config.preemption_grace_ms;
        let victims = self.victims.values().map(|(_, at)| at.saturating_add(grace)).min();
        victims.into_iter().chain(self.next_preemption).chain(self.next_drain).min()
    }

    /// Takes back the placements of the victims whose grace is over (once the preemptions no
    /// longer wanted are called off).
    pub(super) fn end_graces(&mut self, now: Millis, world: &mut World<'_>, out: &mut Outcome) {
        let _ = self.reconsider(out);
        let grace = self.config.preemption_grace_ms;
        let due: Vec<TaskRef> = self
            .victims
            .iter()
            .filter(|(_, (_, at))| at.saturating_add(grace) <= now)
            .map(|(key, _)| key.clone())
            .collect();
        for (app, task) in due {
            // A task gone meanwhile leaves only its stale index entry, which is dropped.
            let _ = self.take_back(&app, &task, now, world, out);
        }
    }

    /// Preemption by the pools themselves: a drained pool once its drain is due, and a pool that
    /// holds more than it may now (its capacity lowered, or more of it occupied). Their tasks are
    /// marked as any victim, for no preemptor, and taken back the same way (by their executor,
    /// or at the end of their grace). Drained: every task there; over: lowest priority first,
    /// then the youngest, as few as free what is over. Never a task that may not be preempted,
    /// nor a gang member: they run to their end (a drain waits for them). A mark whose pool is
    /// no longer strained (uncordoned, grown back) is called off.
    pub(super) fn evict(&mut self, now: Millis, world: &mut World<'_>, out: &mut Outcome) {
        self.next_drain = world.pools.next_drain(now);
        let strained = world.pools.strained(now);
        let tasks = &self.tasks;
        let pool_of = |key: &TaskRef| {
            tasks.get(&key.0).and_then(|t| t.get(&key.1)).and_then(|t| t.placement.as_ref()).map(|p| p.pool.clone())
        };
        let off: Vec<TaskRef> = self
            .victims
            .iter()
            .filter(|(key, (by, _))| {
                by.is_none() && pool_of(key).is_none_or(|pool| !strained.iter().any(|s| s.pool == pool))
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in off {
            self.victims.remove(&key);
            if let Some(task) = self.tasks.get_mut(&key.0).and_then(|t| t.get_mut(&key.1)) {
                if task.preempting.take().is_some() {
                    out.apps.push(AppChange::Task(task.clone()));
                }
            }
        }
        if strained.is_empty() {
            return;
        }
        // The placed tasks on the strained pools (cordoned ones are not in a cycle's room).
        let mut placed: HashMap<&PoolName, Vec<&crate::apps::Task>> =
            strained.iter().map(|s| (&s.pool, Vec::new())).collect();
        for task in self.tasks.values().flat_map(|tasks| tasks.values()) {
            if let (TaskState::Allocated | TaskState::Running, Some(placement)) = (task.state, &task.placement) {
                if let Some(on) = placed.get_mut(&placement.pool) {
                    on.push(task);
                }
            }
        }
        // Each pool's victims: (priority, age, task, what it holds).
        type Evicted = (i32, (Millis, u64), TaskRef, Resources);
        let mut decided: Vec<(Vec<Evicted>, String)> = Vec::new();
        for strain in &strained {
            let mut leaving = Resources::new();
            let mut candidates: Vec<Evicted> = Vec::new();
            for task in placed.get(&strain.pool).into_iter().flatten() {
                let Some(placement) = &task.placement else { continue };
                if task.preempting.is_some() {
                    leaving = leaving.checked_add(&placement.resources).unwrap_or(leaving);
                } else if task.spec.preemptable && task.spec.group.is_none() && task.slot.is_none() {
                    let key = (task.app.clone(), task.spec.id.clone());
                    let age = (placement.at, task.seq);
                    candidates.push((task.spec.priority.value(), age, key, placement.resources.clone()));
                }
            }
            let (chosen, reason) = if strain.drained {
                (candidates, format!("its pool `{}` is drained", strain.pool))
            } else {
                let need = strain.over.saturating_sub(&leaving);
                if need.is_empty() {
                    continue;
                }
                candidates.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
                let mut freed = Resources::new();
                let mut chosen = Vec::new();
                for candidate in candidates {
                    if freed.fits(&need) {
                        break;
                    }
                    let lacking = need.saturating_sub(&freed);
                    if lacking.iter().any(|(name, _)| candidate.3.get_milli(name.as_str()) > 0) {
                        freed = freed.checked_add(&candidate.3).unwrap_or(freed);
                        chosen.push(candidate);
                    }
                }
                // As few as possible: drop, last chosen first, every one not needed.
                let mut index = chosen.len();
                while index > 0 && freed.fits(&need) {
                    index -= 1;
                    let without = freed.saturating_sub(&chosen[index].3);
                    if without.fits(&need) {
                        freed = without;
                        chosen.remove(index);
                    }
                }
                let reason = format!("its pool `{}` shrank: it may hold less than is placed there", strain.pool);
                (chosen, reason)
            };
            if !chosen.is_empty() {
                decided.push((chosen, reason));
            }
        }
        for (chosen, reason) in decided {
            self.stats.preemption_decisions += 1;
            for (_, _, key, ..) in chosen {
                let Some(task) = self.tasks.get_mut(&key.0).and_then(|t| t.get_mut(&key.1)) else { continue };
                task.preempting = Some(Preempting { by: None, at: now, reason: reason.clone() });
                out.apps.push(AppChange::Task(task.clone()));
                self.victims.insert(key, (None, now));
            }
        }
    }

    /// A victim goes back to waiting, its placement released, its preemption counted; a task
    /// not (or no longer) marked is left as it is.
    pub(in crate::apps) fn take_back(
        &mut self,
        app: &AppId,
        task: &TaskId,
        now: Millis,
        world: &mut World<'_>,
        out: &mut Outcome,
    ) -> Result<(), crate::apps::SchedError> {
        self.victims.remove(&(app.clone(), task.clone()));
        let record = self.task_mut(app, task)?;
        let Some(preempting) = record.preempting.clone() else { return Ok(()) };
        // A marked task is placed (an invariant): the requeue below takes, and stores these.
        record.preemptions = record.preemptions.saturating_add(1);
        record.preempted_at = Some(now);
        const PREFIX: &str = crate::apps::PREEMPTED_REASON_PREFIX;
        let reason = match &preempting.by {
            Some(by) => format!("{PREFIX} for {}/{}: {}", by.0, by.1, preempting.reason),
            None => format!("{PREFIX}: {}", preempting.reason),
        };
        let member = record.slot.is_some();
        self.requeue(app, task, &reason, now, world, out)?;
        self.stats.preemptions += 1;
        if member {
            self.regang(app, now, world, out);
        }
        Ok(())
    }

    /// A gang taken back by preemption, once none of its members is placed any more: its
    /// placeholders are gone (each went with its member's placement), and it waits to be
    /// reserved again, its members with it. Until then its members taken back wait
    /// ([`Why::AfterGang`]): a gang is never placed in part.
    pub(in crate::apps) fn regang(&mut self, app_id: &AppId, now: Millis, world: &mut World<'_>, out: &mut Outcome) {
        let Some(tasks) = self.tasks.get(app_id) else { return };
        let members: Vec<&crate::apps::Task> = tasks.values().filter(|t| t.slot.is_some()).collect();
        // Taken back: waiting, yet still on its placeholder's number.
        let taken_back = members.iter().any(|t| t.state == TaskState::Pending);
        let placed = members.iter().any(|t| matches!(t.state, TaskState::Allocated | TaskState::Running));
        if !taken_back || placed {
            return;
        }
        let members: Vec<TaskId> = members.iter().map(|t| t.spec.id.clone()).collect();
        for member in &members {
            if let Some(task) = self.tasks.get_mut(app_id).and_then(|t| t.get_mut(member)) {
                task.slot = None;
                out.apps.push(AppChange::Task(task.clone()));
            }
        }
        self.release_slots(app_id, false, now, world, out);
        let Some(app) = self.apps.get_mut(app_id) else { return };
        if app.state != crate::apps::states::AppState::Running {
            return;
        }
        app.reserved_at = None;
        app.gang_preempted_at = Some(now);
        crate::apps::transition_known(app, &[crate::apps::states::AppEvent::Reserve], out);
        out.apps.push(AppChange::App(app.clone()));
    }

    /// After the cycle's placements: each pending task that found no room and may preempt
    /// chooses its victims, highest priority first.
    pub(super) fn preempt(&mut self, world: &mut World<'_>, cycle: &mut Cycle<'_>) {
        self.next_preemption = None;
        let leaving = self.reconsider(&mut cycle.out);
        if !self.config.preemption {
            return;
        }
        let mut flows = Flows { leaving, arriving: self.arriving() };
        // A task whose queue is below its guarantee first (a queue's guarantee is restored
        // before any borrowing queue's priorities are served), then the highest priority, then
        // the earliest added. The tasks the cycle passed over as like one that found no room
        // (`alike`) are not here: each comes in after the one before it preempted.
        let eligible =
            |t: &&crate::apps::Task| t.state == TaskState::Pending && t.held.is_none() && t.spec.group.is_none();
        let mut waiting: BinaryHeap<Waiting> = self
            .why_task
            .iter()
            .filter(|(_, why)| matches!(why, Why::NoRoom { .. }))
            .filter_map(|((app, task), _)| self.tasks.get(app)?.get(task).filter(eligible))
            .map(|t| self.preemption_order(t, &flows))
            .collect();
        // And each task its queue's limit holds back, where a task of a lower priority is placed
        // under that queue (the only ones it may take) and the limit can hold it at all.
        let held_back: Vec<(&crate::apps::Task, &QueuePath)> = self
            .why_task
            .iter()
            .filter_map(|((app, task), why)| {
                Some((self.tasks.get(app)?.get(task).filter(eligible)?, &ceiling_hit(why)?.queue))
            })
            .filter(|(t, queue)| self.under_ceiling(queue, &t.spec.resources))
            .collect();
        if !held_back.is_empty() {
            let lowest = self.lowest_priority_under(held_back.iter().map(|(_, queue)| *queue));
            for (t, queue) in held_back {
                if lowest.get(queue).is_some_and(|low| *low < t.spec.priority.value()) {
                    waiting.push(self.preemption_order(t, &flows));
                }
            }
        }
        // And each gang that found no room, holding none.
        let gangs: Vec<Waiting> = self
            .why_app
            .iter()
            .filter(|(_, why)| matches!(why, Why::GangNotReserved { cause: Some(cause), .. } if matches!(**cause, Why::NoRoom { .. })))
            .filter_map(|(app, _)| self.apps.get(app).filter(|a| a.awaits_gang() && a.held.is_empty()))
            .map(|app| self.gang_order(app, &flows))
            .collect();
        waiting.extend(gangs);
        // Planning reads the allocs of every pool a task may use: a cycle's plans look at a
        // bounded number of pools and placed tasks, and it plans for one task of an application
        // whose plan failed; a shape that failed is not planned again.
        let mut previewed = 0;
        let mut failed_apps: HashSet<AppId> = HashSet::new();
        let mut failed_shapes: HashMap<(Resources, crate::pools::Labels, QueuePath, i32), String> = HashMap::new();
        // Which tasks are placed on each pool, read when a first plan needs it.
        let mut placed: Option<Placed> = None;
        let mut cache = PlanCache::default();
        // Each leaf's delay, read once.
        let mut delays: HashMap<QueuePath, u64> = HashMap::new();
        // By spot: what the victims marked this cycle free beyond what their preemptors need.
        let mut surplus: HashMap<usize, Resources> = HashMap::new();
        while let Some((restored, priority, _, wants)) = waiting.pop() {
            let key = match wants {
                Wants::Task(key) => key,
                Wants::Gang(app) => {
                    if restored {
                        let now = self.gang_order(&self.apps[&app], &flows);
                        if !now.0 {
                            waiting.push(now);
                            continue;
                        }
                    }
                    if placed
                        .as_ref()
                        .is_some_and(|p| cache.looked >= MAX_PLANS_PER_CYCLE * (p.count + p.at.len()).max(1))
                    {
                        break;
                    }
                    let placed = placed.get_or_insert_with(|| self.placed_by_pool(&cycle.room));
                    let preview = previewed < MAX_PREVIEWS_PER_CYCLE;
                    let scratch = (placed, &mut cache, &mut surplus);
                    if self.preempt_for_gang(&app, preview, world, cycle, &mut flows, scratch) {
                        previewed += 1;
                    }
                    continue;
                }
            };
            let task = &self.tasks[&key.0][&key.1];
            // The room held since it was ordered may have filled its queue's guarantee: then it
            // comes in again where it now belongs (this only goes from restoring to not).
            if restored {
                let now = self.preemption_order(task, &flows);
                if !now.0 {
                    waiting.push(now);
                    continue;
                }
            }
            let leaf = &self.apps[&key.0].spec.queue;
            let from = task.added.max(task.preempted_at.unwrap_or(0));
            let delay = match delays.get(leaf) {
                Some(delay) => *delay,
                None => *delays.entry(leaf.clone()).or_insert(self.preemption_delay(leaf)),
            };
            let may_from = from.saturating_add(delay);
            if cycle.now < may_from {
                self.next_preemption = Some(self.next_preemption.map_or(may_from, |n| n.min(may_from)));
                // Whom it would take is looked at for the first few only: a plan reads the
                // allocs of every pool the task may use. Not for a task waiting out the delay
                // since it was preempted itself: after a preemption, as many victims wait as
                // preemptors were placed, and what they would take is what was just taken from
                // them.
                let preview = previewed < MAX_PREVIEWS_PER_CYCLE && from == task.added;
                let whom = preview.then(|| {
                    previewed += 1;
                    let placed = placed.get_or_insert_with(|| self.placed_by_pool(&cycle.room));
                    match self.plan(&key, world, cycle, &flows, placed, &mut cache) {
                        Ok(plan) => {
                            let pool = &cycle.room.spots[plan.spot].name;
                            let names: Vec<String> =
                                plan.victims.iter().map(|((app, task), _)| format!("{app}/{task}")).collect();
                            format!("it would preempt {} on pool `{pool}`", names.join(", "))
                        }
                        Err(rule) => rule,
                    }
                });
                let said = Preemption::In { seconds: (may_from - cycle.now).div_ceil(1000), whom };
                wait_with(&mut self.why_task, &key, said);
                continue;
            }
            if placed.as_ref().is_some_and(|p| cache.looked >= MAX_PLANS_PER_CYCLE * (p.count + p.at.len()).max(1)) {
                break;
            }
            // Room a decision of this cycle frees beyond its preemptor's need (a gang taken whole,
            // a large victim) goes first to a task owed its queue's guarantee, held for it.
            if restored && !surplus.is_empty() {
                // The next task like it is found before it holds room (one holding room has no
                // like).
                let next = self.next_like(&key.0, &key.1);
                if self.claim_surplus(&key, &mut surplus, cycle, &mut flows) {
                    if let Some((next, why)) = next {
                        waiting.push(self.preemption_order(&self.tasks[&key.0][&next], &flows));
                        self.why_task.insert((key.0.clone(), next), why);
                    }
                    continue;
                }
            }
            if failed_apps.contains(&key.0) {
                continue;
            }
            let task = &self.tasks[&key.0][&key.1];
            let shape = (
                task.spec.resources.clone(),
                task.spec.selector.clone(),
                self.apps[&key.0].spec.queue.clone(),
                priority,
            );
            let said = match failed_shapes.get(&shape) {
                Some(said) => Err(said.clone()),
                None => {
                    let placed = placed.get_or_insert_with(|| self.placed_by_pool(&cycle.room));
                    self.plan(&key, world, cycle, &flows, placed, &mut cache)
                }
            };
            let said = match said {
                Ok(plan) => {
                    if let Some((next, why)) = self.next_like(&key.0, &key.1) {
                        waiting.push(self.preemption_order(&self.tasks[&key.0][&next], &flows));
                        self.why_task.insert((key.0.clone(), next), why);
                    }
                    if let Some(placed) = placed.as_mut() {
                        placed.mark(plan.spot, &plan.victims);
                    }
                    cache.taken_from(plan.spot);
                    spare(&mut surplus, plan.spot, &plan.freed, &self.tasks[&key.0][&key.1].spec.resources);
                    self.carry_out(&key, plan, cycle, &mut flows);
                    continue;
                }
                Err(said) => {
                    failed_apps.insert(key.0.clone());
                    failed_shapes.insert(shape, said.clone());
                    said
                }
            };
            wait_with(&mut self.why_task, &key, Preemption::Cannot(said));
        }
    }

    /// Where a waiting task comes in the cycle's preemptions ([`Waiting`]).
    fn preemption_order(&self, task: &crate::apps::Task, flows: &Flows) -> Waiting {
        let restores = self.below_guarantee(&self.apps[&task.app].spec.queue, &task.spec.resources, flows);
        (restores, task.spec.priority.value(), Reverse(task.seq), Wants::Task((task.app.clone(), task.spec.id.clone())))
    }

    /// Where a waiting gang comes in the cycle's preemptions: as a task of its application's
    /// priority asking for every member at once.
    fn gang_order(&self, app: &crate::apps::App, flows: &Flows) -> Waiting {
        let restores = self.below_guarantee(&app.spec.queue, &gang_total(app), flows);
        (restores, self.app_priority(&app.spec.id), Reverse(app.seq), Wants::Gang(app.spec.id.clone()))
    }

    /// A gang that found no room preempts for all its members at once, or not at all: victims
    /// for each member (on as many pools as it takes), the room held for each until the gang
    /// is reserved. Whether it may, and whom it may take, go by the rules of a task's
    /// preemption, its delay counted from its submission (or from when it was itself taken
    /// back). Inside its delay it says whom it would take, if `preview`: answers whether it
    /// looked. What its victims free beyond its members' need is added to `surplus`, by spot.
    fn preempt_for_gang(
        &mut self,
        app_id: &AppId,
        preview: bool,
        world: &World<'_>,
        cycle: &mut Cycle<'_>,
        flows: &mut Flows,
        (placed, cache, surplus): (&mut Placed, &mut PlanCache, &mut HashMap<usize, Resources>),
    ) -> bool {
        let app = &self.apps[app_id];
        let may_from = app.reserving_since().saturating_add(self.preemption_delay(&app.spec.queue));
        if cycle.now < may_from {
            self.next_preemption = Some(self.next_preemption.map_or(may_from, |n| n.min(may_from)));
            // Not for a gang waiting out the delay since it was taken back itself: what it
            // would take is what was just taken from it.
            let preview = preview && app.gang_preempted_at.is_none();
            let whom = preview.then(|| match self.plan_gang(app_id, world, cycle, flows, placed, cache) {
                Ok(plans) => {
                    let mut pools: Vec<&PoolName> = Vec::new();
                    let mut names: Vec<String> = Vec::new();
                    for plan in plans.iter().filter(|plan| !plan.victims.is_empty()) {
                        let pool = &cycle.room.spots[plan.spot].name;
                        if !pools.contains(&pool) {
                            pools.push(pool);
                        }
                        names.extend(plan.victims.iter().map(|((app, task), _)| format!("{app}/{task}")));
                    }
                    let pools: Vec<String> = pools.iter().map(|pool| format!("`{pool}`")).collect();
                    let on = if pools.len() == 1 { "pool" } else { "pools" };
                    format!("it would preempt {} on {on} {} for its gang", names.join(", "), pools.join(", "))
                }
                Err(rule) => rule,
            });
            let said = Preemption::In { seconds: (may_from - cycle.now).div_ceil(1000), whom };
            self.gang_waits(app_id, said);
            return preview;
        }
        match self.plan_gang(app_id, world, cycle, flows, placed, cache) {
            Ok(plans) => {
                for plan in &plans {
                    placed.mark(plan.spot, &plan.victims);
                    cache.taken_from(plan.spot);
                }
                self.carry_out_gang(app_id, plans, cycle, flows, surplus);
            }
            Err(said) => self.gang_waits(app_id, Preemption::Cannot(said)),
        }
        false
    }

    /// A gang with no room says what preemption says of it too.
    fn gang_waits(&mut self, app_id: &AppId, preemption: Preemption) {
        if let Some(why) = self.why_app.get_mut(app_id) {
            let room = std::mem::replace(why, Why::AfterGang);
            *why = Why::NoRoomYet { room: Box::new(room), preemption };
        }
    }

    /// Victims for every member of the gang, in order, each plan made on the room and the
    /// placed tasks as the plans before it leave them; or why there are none.
    fn plan_gang(
        &self,
        app_id: &AppId,
        world: &World<'_>,
        cycle: &mut Cycle<'_>,
        flows: &Flows,
        placed: &Placed,
        cache: &mut PlanCache,
    ) -> Result<Vec<Plan>, String> {
        let app = &self.apps[app_id];
        let members = app.gang_members();
        let mut units: std::collections::BTreeMap<&crate::names::NamespaceName, u64> = Default::default();
        for need in members.iter().flat_map(|m| &m.4) {
            let sum = units.entry(&need.namespace).or_default();
            *sum = sum.saturating_add(need.units);
        }
        for (namespace, units) in units {
            if world.ledger.room_for(namespace, units).is_err() {
                return Err(format!(
                    "it cannot preempt: the tokens its gang needs of `{namespace}` are short as well, and preemption \
                     frees pools, not tokens"
                ));
            }
        }
        let below = self.below_guarantee(&app.spec.queue, &gang_total(app), flows);
        // As its reservation would: on the pools live executors run if it can, else on the others.
        let types = self.gang_types(app_id, cycle.room.typed);
        let sides: &[Option<bool>] = match cycle.room.typed && types.iter().all(Option::is_none) {
            true => &[Some(true), Some(false)],
            false => &[None],
        };
        let mut said = String::new();
        for side in sides {
            let allowed = self.allowed(app_id, &types, *side, cycle);
            match self.plan_members(app_id, &members, below, allowed.as_ref(), cycle, flows, placed, cache) {
                Ok(plans) => return Ok(plans),
                Err(why) => said = why,
            }
        }
        Err(said)
    }

    /// [`Scheduler::plan_gang`] on the pools `allowed`.
    #[allow(clippy::too_many_arguments)]
    fn plan_members(
        &self,
        app_id: &AppId,
        members: &[crate::apps::GangMember],
        below: bool,
        allowed: Option<&super::Allowed>,
        cycle: &Cycle<'_>,
        flows: &Flows,
        placed: &Placed,
        cache: &mut PlanCache,
    ) -> Result<Vec<Plan>, String> {
        let leaf = &self.apps[app_id].spec.queue;
        let priority = self.app_priority(app_id);
        let (mut room, mut placed, mut flows) = (cycle.room.clone(), placed.clone(), flows.clone());
        let mut plans = Vec::with_capacity(members.len());
        for (_, _, wanted, selector, _) in members {
            // Plans read what is free in `room`, which changes from member to member.
            cache.free_fits = None;
            if let Ok(spot) = room.best_fit(wanted, selector, &HashMap::new(), allowed) {
                room.take(spot, wanted);
                plans.push(Plan { spot, victims: Vec::new(), freed: Resources::new(), below });
                continue;
            }
            let want = Want { app: app_id, leaf, wanted, selector, priority, below, ceiling: None };
            let plan = match self.plan_for(&want, allowed, &room, &flows, &placed, cache) {
                Ok(plan) => plan,
                Err(said) => {
                    cache.free_fits = None;
                    return Err(said);
                }
            };
            room.set_free(plan.spot, |free| {
                free.checked_add(&plan.freed).unwrap_or_else(|| free.clone()).saturating_sub(wanted)
            });
            placed.mark(plan.spot, &plan.victims);
            for ((victim_app, _), resources) in &plan.victims {
                add_up(&mut flows.leaving, &self.apps[victim_app].spec.queue, resources);
            }
            plans.push(plan);
        }
        cache.free_fits = None;
        if plans.iter().all(|plan| plan.victims.is_empty()) {
            return Err("it cannot preempt: its gang finds room without taking any task, on pools it may not use yet"
                .to_owned());
        }
        Ok(plans)
    }

    /// Marks every member's victims and holds the room of every member for the gang; adds to
    /// `surplus` what the victims free on each spot beyond the members placed there need (a
    /// whole gang taken for a smaller one), which goes to the next tasks owed their guarantee.
    fn carry_out_gang(
        &mut self,
        app_id: &AppId,
        plans: Vec<Plan>,
        cycle: &mut Cycle<'_>,
        flows: &mut Flows,
        surplus: &mut HashMap<usize, Resources>,
    ) {
        let Some(app) = self.apps.get(app_id) else { return };
        let members = app.gang_members();
        let Some(Ok(by)) = members.first().map(|m| TaskId::new(m.0.as_str()).map(|group| (app_id.clone(), group)))
        else {
            return;
        };
        let (leaf, total) = (app.spec.queue.clone(), gang_total(app));
        let reason = match plans.first().is_some_and(|plan| plan.below) {
            true => "its queue is below its guarantee (for its gang)".to_owned(),
            false => format!("it has a higher priority ({}, for its gang)", self.app_priority(app_id)),
        };
        let mut held = Vec::with_capacity(plans.len());
        let mut names = Vec::new();
        let mut shown: Option<PoolName> = None;
        // By spot: what the victims there free, and what the members placed there take.
        let mut by_spot: HashMap<usize, (Resources, Resources)> = HashMap::new();
        for ((_, _, wanted, _, _), plan) in members.iter().zip(plans) {
            let pool = cycle.room.spots[plan.spot].name.clone();
            if !plan.victims.is_empty() && shown.is_none() {
                shown = Some(pool.clone());
            }
            self.mark_victims(&by, &plan.victims, &reason, cycle, flows, &mut names);
            self.hold(plan.spot, &wanted.saturating_sub(&plan.freed), cycle);
            let (freed, taken) = by_spot.entry(plan.spot).or_default();
            *freed = freed.checked_add(&plan.freed).unwrap_or_else(|| freed.clone());
            *taken = taken.checked_add(wanted).unwrap_or_else(|| taken.clone());
            held.push(pool);
        }
        for (spot, (freed, taken)) in by_spot {
            spare(surplus, spot, &freed, &taken);
        }
        add_up(&mut flows.arriving, &leaf, &total);
        if let Some(app) = self.apps.get_mut(app_id) {
            app.held = held;
            cycle.out.apps.push(AppChange::App(app.clone()));
        }
        self.gang_holders.insert(app_id.clone());
        self.stats.preemption_decisions += 1;
        if let Some(pool) = shown {
            let grace_ms = self.config.preemption_grace_ms;
            self.why_app.insert(app_id.clone(), Why::Preempting { pool, victims: names, grace_ms });
        }
    }

    /// Before a gang's reservation: the room held for its members is given back to the room,
    /// so that it may take it. Answers what was given back, by spot, and whether a pool it held
    /// room on is gone or down; `None` when it holds no room.
    pub(super) fn unhold_gang(&self, app_id: &AppId, cycle: &mut Cycle<'_>) -> Option<(Vec<(usize, Resources)>, bool)> {
        if !self.gang_holders.contains(app_id) {
            return None;
        }
        let app = self.apps.get(app_id).filter(|app| !app.held.is_empty())?;
        let (mut given, mut lost) = (Vec::with_capacity(app.held.len()), false);
        for ((_, _, wanted, _, _), pool) in app.gang_members().iter().zip(&app.held) {
            let Some(i) = cycle.room.spot_of(pool) else {
                lost = true;
                continue;
            };
            let portion = cycle.held.get(&i).map(|h| h.min(wanted)).unwrap_or_default();
            cycle.room.give_back(i, &portion);
            if let Some(h) = cycle.held.get_mut(&i) {
                *h = h.saturating_sub(&portion);
            }
            given.push((i, portion));
        }
        Some((given, lost))
    }

    /// After a gang's reservation: reserved, or with no victim left to wait for, or a pool it
    /// held room on lost, it holds nothing any more (and, not reserved, may preempt again);
    /// else the room is held again, and it says so.
    pub(super) fn rehold_gang(
        &mut self,
        app_id: &AppId,
        (given, lost): (Vec<(usize, Resources)>, bool),
        reserved: Result<(), Why>,
        cycle: &mut Cycle<'_>,
    ) -> Result<(), Why> {
        let mut victims: Vec<String> = Vec::new();
        let mut pool = None;
        for ((app, task), (by, _)) in &self.victims {
            if by.as_ref().is_some_and(|by| by.0 == *app_id) {
                victims.push(format!("{app}/{task}"));
                if pool.is_none() {
                    pool = self
                        .tasks
                        .get(app)
                        .and_then(|t| t.get(task))
                        .and_then(|t| t.placement.as_ref())
                        .map(|p| p.pool.clone());
                }
            }
        }
        match (reserved, lost, pool) {
            (Err(_), false, Some(pool)) => {
                for (i, portion) in given {
                    self.hold(i, &portion, cycle);
                }
                Err(Why::Preempting { pool, victims, grace_ms: self.config.preemption_grace_ms })
            }
            (reserved, ..) => {
                self.gang_holders.remove(app_id);
                if let Some(app) = self.apps.get_mut(app_id) {
                    if !app.held.is_empty() {
                        app.held.clear();
                        cycle.out.apps.push(AppChange::App(app.clone()));
                    }
                }
                reserved
            }
        }
    }

    /// Everything room is held for: each task (its application, itself, what it wants) and each
    /// gang still waiting to be reserved (its application, no task, what all its members want).
    fn holds(&self) -> impl Iterator<Item = (&crate::apps::App, Option<&TaskId>, Resources)> + '_ {
        let tasks = self.holders.keys().filter_map(|(app, task)| {
            let resources = self.tasks.get(app)?.get(task)?.spec.resources.clone();
            Some((self.apps.get(app)?, Some(task), resources))
        });
        let gangs = self
            .gang_holders
            .iter()
            .filter_map(|app| self.apps.get(app))
            .filter(|a| a.awaits_gang() && !a.held.is_empty());
        tasks.chain(gangs.map(|app| (app, None, gang_total(app))))
    }

    /// What the tasks and gangs with room held for them will use once placed, in `queue` and the
    /// queues under it, but for what `except` names: an application's task, or (with no task)
    /// everything of the application.
    pub(super) fn held_under(&self, queue: &QueuePath, except: (&AppId, Option<&TaskId>)) -> Resources {
        let excepted = |app: &crate::apps::App, task: Option<&TaskId>| {
            &app.spec.id == except.0 && (except.1.is_none() || task == except.1)
        };
        self.holds()
            .filter(|(app, task, _)| !excepted(app, *task))
            .filter(|(app, ..)| app.spec.queue.ancestors().any(|q| q == queue.as_str()))
            .fold(Resources::new(), |held, (.., resources)| held.checked_add(&resources).unwrap_or(held))
    }

    /// What the tasks and gangs with room held for them will use once placed, per queue (and
    /// every queue above it).
    pub(super) fn arriving(&self) -> HashMap<QueuePath, Resources> {
        let mut arriving = HashMap::new();
        for (app, _, resources) in self.holds() {
            add_up(&mut arriving, &app.spec.queue, &resources);
        }
        arriving
    }

    /// Preemptions decided earlier and not carried out yet are called off where they are no
    /// longer wanted or allowed: the preemptor no longer waits for the room (placed elsewhere,
    /// removed, ended), or its victims' queues would now end below their guarantees (a task of
    /// theirs ended meanwhile). The latest decided go first. Called-off victims run on.
    /// Answers what the victims still marked will leave, per queue (and every queue above it).
    pub(super) fn reconsider(&mut self, out: &mut Outcome) -> HashMap<QueuePath, Resources> {
        if self.victims.is_empty() {
            return HashMap::new();
        }
        // Marks of a pool (drained or shrunk) are called off by `evict`, which sees the pools.
        let mut marked: Vec<(TaskRef, TaskRef, Millis)> =
            self.victims.iter().filter_map(|(victim, (by, at))| Some((victim.clone(), by.clone()?, *at))).collect();
        marked.sort_by_key(|m| std::cmp::Reverse(m.2));
        let mut leaving: HashMap<QueuePath, Resources> = HashMap::new();
        for victim in self.victims.keys() {
            if let Some(t) = self.tasks.get(&victim.0).and_then(|t| t.get(&victim.1)) {
                if let (Some(placement), Some(app)) = (&t.placement, self.apps.get(&victim.0)) {
                    add_up(&mut leaving, &app.spec.queue, &placement.resources);
                }
            }
        }
        // A queue's tasks with room held for them count as its own: they are placed into it.
        let arriving = self.arriving();
        let empty = Resources::new();
        let mut gangs_off: std::collections::BTreeSet<AppId> = std::collections::BTreeSet::new();
        for (victim, by, _) in marked {
            let Some(task) = self.tasks.get(&victim.0).and_then(|t| t.get(&victim.1)) else { continue };
            let Some(placement) = task.placement.clone() else { continue };
            let waits = self.waits_for_room(&by);
            let path: Vec<QueuePath> =
                self.apps.get(&by.0).map(|app| app.spec.queue.up_to_root().collect()).unwrap_or_default();
            let leaf = self.apps[&victim.0].spec.queue.clone();
            let below = leaf.up_to_root().filter(|q| !path.contains(q)).any(|queue| {
                let Some(limits) = self.queues.get(&queue) else { return false };
                let used = self.usage.get(&queue).map_or(&empty, |u| &u.allocated);
                let gone = leaving.get(&queue).unwrap_or(&empty);
                let coming = arriving.get(&queue).unwrap_or(&empty);
                limits.guaranteed.iter().any(|(name, guarantee)| {
                    let name = name.as_str();
                    let left = used.get_milli(name).saturating_add(coming.get_milli(name));
                    placement.resources.get_milli(name) > 0 && left.saturating_sub(gone.get_milli(name)) < guarantee
                })
            });
            if waits && !below {
                continue;
            }
            // A gang's marks are called off together, below.
            if task.slot.is_some() {
                gangs_off.insert(victim.0.clone());
                continue;
            }
            self.call_off(&victim, &leaf, &placement.resources, &mut leaving, out);
        }
        for app in gangs_off {
            let Some(tasks) = self.tasks.get(&app) else { continue };
            // Once one of its members was taken back, the rest of it goes too.
            if tasks.values().any(|t| t.slot.is_some() && t.state == TaskState::Pending) {
                continue;
            }
            let marked: Vec<(TaskRef, Resources)> = tasks
                .values()
                .filter(|t| t.slot.is_some() && t.preempting.is_some())
                .filter_map(|t| Some(((app.clone(), t.spec.id.clone()), t.placement.as_ref()?.resources.clone())))
                .collect();
            let leaf = self.apps[&app].spec.queue.clone();
            for (victim, resources) in marked {
                self.call_off(&victim, &leaf, &resources, &mut leaving, out);
            }
        }
        leaving
    }

    /// A victim's mark is called off: it runs on, and no longer counts as leaving its queues.
    fn call_off(
        &mut self,
        victim: &TaskRef,
        leaf: &QueuePath,
        resources: &Resources,
        leaving: &mut HashMap<QueuePath, Resources>,
        out: &mut Outcome,
    ) {
        for queue in leaf.up_to_root() {
            if let Some(sum) = leaving.get_mut(&queue) {
                *sum = sum.saturating_sub(resources);
            }
        }
        self.victims.remove(victim);
        if let Some(task) = self.tasks.get_mut(&victim.0).and_then(|t| t.get_mut(&victim.1)) {
            task.preempting = None;
            out.apps.push(AppChange::Task(task.clone()));
        }
    }

    /// Whether the preemptor `by` still waits for the room its victims free: a task pending with
    /// room held for it, or (`by` naming an application waiting for its gang) a gang holding room.
    fn waits_for_room(&self, by: &TaskRef) -> bool {
        if let Some(app) = self.apps.get(&by.0).filter(|app| app.awaits_gang()) {
            return !app.held.is_empty();
        }
        self.tasks
            .get(&by.0)
            .and_then(|t| t.get(&by.1))
            .is_some_and(|t| t.state == TaskState::Pending && t.held.is_some())
    }

    /// The delay a task of `leaf` waits before it may preempt: the nearest queue's that sets one.
    fn preemption_delay(&self, leaf: &QueuePath) -> u64 {
        leaf.up_to_root()
            .find_map(|q| self.queues.get(&q).and_then(|l| l.preemption_delay_ms))
            .unwrap_or(DEFAULT_PREEMPTION_DELAY_MS)
    }

    /// Whether placing `wanted` keeps every queue from `leaf` up that has a guarantee within it
    /// (for the resources it names, counting what holders there will take), with at least one
    /// such queue that names a resource wanted.
    fn below_guarantee(&self, leaf: &QueuePath, wanted: &Resources, flows: &Flows) -> bool {
        let mut guaranteed = false;
        let empty = Resources::new();
        for queue in leaf.ancestors() {
            let Some(limits) = self.queues.get_str(queue).filter(|l| !l.guaranteed.is_empty()) else { continue };
            let used = self.usage.get(queue).map_or(&empty, |u| &u.allocated);
            let arriving = flows.arriving.get(queue).unwrap_or(&empty);
            for (name, guarantee) in limits.guaranteed.iter() {
                let name = name.as_str();
                let want = wanted.get_milli(name);
                if want == 0 {
                    continue;
                }
                guaranteed = true;
                if used.get_milli(name).saturating_add(arriving.get_milli(name)).saturating_add(want) > guarantee {
                    return false;
                }
            }
        }
        guaranteed
    }

    /// The queue whose subtree a task of `leaf` preempts in: the nearest with preemption
    /// `fence`, else `root`.
    fn preemption_fence(&self, leaf: &QueuePath) -> QueuePath {
        leaf.up_to_root()
            .find(|q| self.queues.get(q).is_some_and(|l| l.preemption == PreemptionPolicy::Fence))
            .unwrap_or_else(QueuePath::root)
    }

    /// A task's priority as seen at `above` (an ancestor of `leaf`): its own, plus the offsets
    /// of the queues from its leaf up to below `above`, a priority fence showing its offset alone.
    fn priority_at(&self, priority: i32, leaf: &QueuePath, above: &QueuePath) -> i32 {
        let mut value = priority;
        for queue in leaf.up_to_root().take_while(|q| q != above) {
            if let Some(limits) = self.queues.get(&queue) {
                value = crate::apps::priority::shown(limits.priority_policy, limits.priority_offset, Some(value))
                    .unwrap_or(value);
            }
        }
        value
    }

    /// The placed tasks on each pool, and the floor of a plan's score.
    fn placed_by_pool(&self, room: &Room) -> Placed {
        // A placement names its pool by the text the room names it by, as a rule: found by its
        // address (the last one found first), else by name.
        let mut by_addr: Vec<(usize, usize)> = room.spots.iter().enumerate().map(|(i, s)| (s.name.addr(), i)).collect();
        by_addr.sort_unstable();
        let mut last: Option<(usize, usize)> = None;
        let mut spot_of = |pool: &PoolName| {
            let addr = pool.addr();
            if let Some((_, i)) = last.filter(|(a, _)| *a == addr) {
                return Some(i);
            }
            let found = match by_addr.binary_search_by_key(&addr, |(a, _)| *a) {
                Ok(at) => Some(by_addr[at].1),
                Err(_) => room.spot_of(pool),
            };
            if let Some(i) = found {
                last = Some((addr, i));
            }
            found
        };
        let placed_now: u64 = self
            .counts
            .values()
            .flat_map(|c| [c.get(&TaskState::Allocated), c.get(&TaskState::Running)])
            .flatten()
            .sum();
        let per_pool = usize::try_from(placed_now).unwrap_or(0) / room.spots.len().max(1) + 1;
        let mut at: Vec<(Vec<Listed>, HashMap<usize, usize>)> = Vec::with_capacity(room.spots.len());
        at.resize_with(room.spots.len(), || (Vec::with_capacity(per_pool), HashMap::new()));
        let mut apps: Vec<(AppId, QueuePath)> = Vec::new();
        let mut gangs: Vec<PlacedGang> = Vec::new();
        let mut shapes: Vec<Resources> = Vec::new();
        let (mut count, mut priority, mut size) = (0, i32::MAX, u64::MAX);
        // Sized once per run of equal resources (most tasks ask alike).
        let mut sized: Option<&Resources> = None;
        let max_preemptions = self.config.max_preemptions;
        let placed_in = |app: &AppId| {
            let counts = self.counts.get(app);
            [TaskState::Allocated, TaskState::Running]
                .iter()
                .any(|s| counts.and_then(|c| c.get(s)).is_some_and(|n| *n > 0))
        };
        // Only the applications with a task placed: a backlog's are passed over at once.
        for (app_id, tasks) in self.tasks.iter().filter(|(app, _)| placed_in(app)) {
            let mut index = None;
            // Its reserved gang, read at its first member: taken whole (its index in `gangs`,
            // and its members' priority: the highest of them), or the rule that keeps it.
            let mut gang: Option<Result<(usize, i32), &'static str>> = None;
            for task in tasks.values() {
                let (TaskState::Allocated | TaskState::Running, Some(placement)) = (task.state, &task.placement) else {
                    continue;
                };
                let Some((listed, _)) = spot_of(&placement.pool).and_then(|i| at.get_mut(i)) else { continue };
                let app = match index {
                    Some(app) => app,
                    None => {
                        let Some(queue) = self.apps.get(app_id).map(|a| a.spec.queue.clone()) else { break };
                        apps.push((app_id.clone(), queue));
                        *index.insert(apps.len() - 1)
                    }
                };
                let rule = if task.preempting.is_some() {
                    Some(BEING_PREEMPTED)
                } else if task.slot.is_some() {
                    // Its gang's rules are its own: what keeps one member keeps every one.
                    let found = gang.get_or_insert_with(|| {
                        let found = self.placed_gang(app_id, tasks, &mut spot_of)?;
                        gangs.push(found.0);
                        Ok((gangs.len() - 1, found.1))
                    });
                    found.err()
                } else if !task.spec.preemptable {
                    Some("the tasks that hold the room may not be preempted (preemptable: false)")
                } else if task.spec.group.is_some() {
                    Some(GANG_KEPT)
                } else if task.preemptions >= max_preemptions {
                    Some("the tasks that hold the room were preempted max_preemptions times and are protected")
                } else {
                    None
                };
                if shapes.last() != Some(&placement.resources) {
                    shapes.push(placement.resources.clone());
                }
                let in_gang = gang.and_then(Result::ok).filter(|_| task.slot.is_some() && rule.is_none());
                listed.push(Listed {
                    app,
                    task: task.spec.id.clone(),
                    priority: in_gang.map_or(task.spec.priority.value(), |(_, priority)| priority),
                    age: (placement.at, task.seq),
                    shape: shapes.len() - 1,
                    rule,
                    gang: in_gang.map(|(g, _)| g),
                });
                count += 1;
                priority = priority.min(task.spec.priority.value());
                if sized != Some(&placement.resources) {
                    size = size.min(placement.resources.size(&room.weights) as u64);
                    sized = Some(&placement.resources);
                }
            }
        }
        Placed { at, apps, gangs, shapes, count, floor: (priority, 1, size) }
    }

    /// The application's reserved gang as plans take it, whole, with its members' priority (the
    /// highest of them); or the rule that keeps it: it is not running on every placeholder, or
    /// one of its members may not be taken.
    fn placed_gang(
        &self,
        app_id: &AppId,
        tasks: &std::collections::BTreeMap<TaskId, crate::apps::Task>,
        spot_of: &mut impl FnMut(&PoolName) -> Option<usize>,
    ) -> Result<(PlacedGang, i32), &'static str> {
        let app = self.apps.get(app_id).ok_or(GANG_KEPT)?;
        if app.state != crate::apps::states::AppState::Running || app.slots.is_empty() {
            return Err(GANG_KEPT);
        }
        let mut gang = PlacedGang { members: Vec::with_capacity(app.slots.len()), total: Resources::new() };
        let mut priority = i32::MIN;
        for slot in &app.slots {
            let member = slot.task.as_ref().and_then(|t| tasks.get(t)).ok_or(GANG_KEPT)?;
            let (TaskState::Allocated | TaskState::Running, Some(placement)) = (member.state, &member.placement) else {
                return Err(GANG_KEPT);
            };
            if member.preempting.is_some() {
                return Err(BEING_PREEMPTED);
            }
            if !member.spec.preemptable {
                return Err("the tasks that hold the room are members of a gang that may not be preempted \
                            (preemptable: false), and a gang goes whole or not at all");
            }
            if member.preemptions >= self.config.max_preemptions {
                return Err("the tasks that hold the room are members of a gang preempted max_preemptions times, \
                            which is protected");
            }
            priority = priority.max(member.spec.priority.value());
            gang.total = gang.total.checked_add(&placement.resources).unwrap_or_else(|| gang.total.clone());
            gang.members.push((member.spec.id.clone(), placement.resources.clone(), spot_of(&placement.pool)));
        }
        Ok((gang, priority))
    }

    /// The victims on one pool that make room for the task, or why there are none.
    fn plan(
        &self,
        key: &TaskRef,
        world: &World<'_>,
        cycle: &mut Cycle<'_>,
        flows: &Flows,
        placed: &Placed,
        cache: &mut PlanCache,
    ) -> Result<Plan, String> {
        let task = &self.tasks[&key.0][&key.1];
        let leaf = self.apps[&key.0].spec.queue.clone();
        for need in &task.spec.tokens {
            if world.ledger.room_for(&need.namespace, need.units).is_err() {
                return Err(format!(
                    "it cannot preempt: the tokens it needs of `{}` are short as well, and preemption frees pools, \
                     not tokens",
                    need.namespace
                ));
            }
        }
        let wanted = &task.spec.resources;
        let hit = self.why_task.get(key).and_then(ceiling_hit).map(|hit| hit.queue.clone());
        let excess = hit.as_ref().map(|queue| self.over_ceiling(queue, wanted, flows));
        let ceiling = match (&hit, &excess) {
            (Some(queue), Some(excess)) if excess.is_empty() => {
                return Err(format!(
                    "it cannot preempt: the tasks leaving its queue `{queue}` free what its limit needs"
                ));
            }
            (Some(queue), Some(excess)) => Some((queue, excess)),
            _ => None,
        };
        // Held back by its queue's own limit, it takes by priority, from that queue.
        let below = ceiling.is_none() && self.below_guarantee(&leaf, wanted, flows);
        let task_type = if cycle.room.typed { self.type_of(&key.0, &key.1) } else { None };
        let allowed = self.allowed(&key.0, &[task_type], None, cycle);
        let want = Want {
            app: &key.0,
            leaf: &leaf,
            wanted,
            selector: &task.spec.selector,
            priority: task.spec.priority.value(),
            below,
            ceiling,
        };
        self.plan_for(&want, allowed.as_ref(), &cycle.room, flows, placed, cache)
    }

    /// Whether `wanted` alone fits under `queue`'s ceiling (else nothing taken there helps).
    fn under_ceiling(&self, queue: &QueuePath, wanted: &Resources) -> bool {
        let Some(limits) = self.queues.get(queue) else { return false };
        let fits_max = limits.max.as_ref().is_none_or(|max| max.fits(wanted));
        let fits_borrow = limits.borrow_limit.as_ref().is_none_or(|limit| {
            limit.iter().all(|(name, borrow)| {
                let cap = limits.guaranteed.get_milli(name.as_str()).saturating_add(borrow);
                wanted.get_milli(name.as_str()) <= cap
            })
        });
        fits_max && fits_borrow
    }

    /// The lowest priority of a task placed under each of `queues` (those with none placed are
    /// left out): one pass over the placed tasks.
    fn lowest_priority_under<'a>(&self, queues: impl Iterator<Item = &'a QueuePath>) -> HashMap<QueuePath, i32> {
        let wanted: HashSet<&str> = queues.map(QueuePath::as_str).collect();
        let mut lowest: HashMap<QueuePath, i32> = HashMap::new();
        for (app_id, tasks) in &self.tasks {
            let Some(app) = self.apps.get(app_id) else { continue };
            let under: Vec<&str> = app.spec.queue.ancestors().filter(|q| wanted.contains(q)).collect();
            if under.is_empty() {
                continue;
            }
            let placed = tasks.values().filter(|t| matches!(t.state, TaskState::Allocated | TaskState::Running));
            let Some(low) = placed.map(|t| t.spec.priority.value()).min() else { continue };
            for queue in under {
                let entry = lowest.entry(QueuePath::of_ancestor(queue)).or_insert(low);
                *entry = (*entry).min(low);
            }
        }
        lowest
    }

    /// What of `queue`'s ceiling (its `max`, and its guarantee plus `borrow_limit`) `wanted` more
    /// would exceed, with what is leaving it and what is held for others counted.
    fn over_ceiling(&self, queue: &QueuePath, wanted: &Resources, flows: &Flows) -> Resources {
        let Some(limits) = self.queues.get(queue) else { return Resources::new() };
        let empty = Resources::new();
        let used = self.usage.get(queue).map_or(&empty, |u| &u.allocated);
        let (arriving, leaving) =
            (flows.arriving.get(queue).unwrap_or(&empty), flows.leaving.get(queue).unwrap_or(&empty));
        let now = used.checked_add(arriving).unwrap_or_else(|| used.clone()).saturating_sub(leaving);
        let mut caps: Vec<(String, u64)> = Vec::new();
        if let Some(max) = &limits.max {
            caps.extend(max.iter().map(|(name, cap)| (name.to_string(), cap)));
        }
        if let Some(limit) = &limits.borrow_limit {
            for (name, borrow) in limit.iter() {
                let cap = limits.guaranteed.get_milli(name.as_str()).saturating_add(borrow);
                caps.push((name.to_string(), cap));
            }
        }
        let mut excess = Resources::new();
        for (name, cap) in caps {
            let over = now.get_milli(&name).saturating_add(wanted.get_milli(&name)).saturating_sub(cap);
            if over > excess.get_milli(&name) {
                excess = excess.with_milli(&name, over);
            }
        }
        excess
    }

    /// The victims on one pool of `room` that make room for `want`, or why there are none.
    fn plan_for(
        &self,
        want: &Want<'_>,
        allowed: Option<&super::Allowed>,
        room: &Room,
        flows: &Flows,
        placed: &Placed,
        cache: &mut PlanCache,
    ) -> Result<Plan, String> {
        let Want { app: app_id, leaf, wanted, selector, priority, below, ceiling } = *want;
        let of_leaf = match cache.leaves.get(leaf) {
            Some(of_leaf) => of_leaf.clone(),
            None => {
                let of_leaf = std::rc::Rc::new((leaf.up_to_root().collect(), self.preemption_fence(leaf)));
                cache.leaves.insert(leaf.clone(), of_leaf.clone());
                of_leaf
            }
        };
        let (path, fence): (&Vec<QueuePath>, &QueuePath) = (&of_leaf.0, &of_leaf.1);
        let mut refusals = Refusals::default();
        let mut best: Option<((i32, usize, u64), Plan)> = None;
        let mut seen: Vec<Seen> = Vec::new();
        let own = placed.app_index(app_id);
        for (i, spot) in room.spots.iter().enumerate() {
            if !selector_matches(selector, &spot.labels) || allowed.is_some_and(|a| !a.takes(i)) {
                continue;
            }
            // The placed tasks here that may be taken, lowest priority first, then youngest (placed
            // last, then added last).
            let mut candidates: Vec<Candidate> = Vec::new();
            // Every task listed is placed (listed this cycle, and only marked since): those of
            // its own application, then those marked, are refused before they are looked up.
            cache.looked += 1;
            let Some((listed, marked)) = placed.at.get(i) else { continue };
            for (app, n) in marked {
                refusals.note_n(if Some(*app) == own { OWN_APPLICATION } else { BEING_PREEMPTED }, *n);
            }
            for victim in listed {
                cache.looked += 1;
                if Some(victim.app) == own {
                    refusals.note(OWN_APPLICATION);
                    continue;
                }
                if let Some(rule) = victim.rule {
                    refusals.note(rule);
                    continue;
                }
                let victim_priority = victim.priority;
                let victim_leaf = &placed.apps[victim.app].1;
                if ceiling.is_some_and(|(queue, _)| !victim_leaf.ancestors().any(|q| q == queue.as_str())) {
                    refusals.note(OUTSIDE_CEILING);
                    continue;
                }
                let known = seen.iter().find(|(a, p, _)| *a == victim.app && *p == victim_priority);
                let queues = match known {
                    Some((.., queues)) => *queues,
                    None => {
                        let cycle_key = (victim.app, victim_priority, leaf.clone(), priority);
                        let queues = *cache.seen.entry(cycle_key).or_insert_with(|| {
                            self.seen_from((victim_leaf, victim_priority), (leaf, path, priority), fence)
                        });
                        seen.push((victim.app, victim_priority, queues));
                        queues
                    }
                };
                let (theirs, ours) = match queues {
                    Ok(priorities) => priorities,
                    Err(rule) => {
                        refusals.note(rule);
                        continue;
                    }
                };
                // Restoring a guarantee takes from other queues only: a victim of its own queue
                // would leave the queue where it was. A higher priority takes within it too.
                let allowed_by_priority = if below { theirs <= ours && victim_leaf != leaf } else { theirs < ours };
                if !allowed_by_priority {
                    refusals.note(match below {
                        true => "the tasks that hold the room have a higher priority",
                        false => "its queue is not below its guarantee, and no task there has a lower priority",
                    });
                    continue;
                }
                candidates.push((theirs, victim.age, victim, victim_leaf));
            }
            // Nothing to take here: only room already free would do (not expected, as the task
            // found none), and the pool is passed without a look at its sums.
            if candidates.is_empty() && (ceiling.is_some() || !cache.free_fits(room, i, wanted)) {
                continue;
            }
            candidates.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
            let free = &spot.free;
            let mut freed = Resources::new();
            let mut taken: HashMap<QueuePath, Resources> = HashMap::new();
            // Each victim (a gang taken whole is one): what it frees here, what it holds in all.
            let mut chosen: Vec<(&Listed, Cow<Resources>, &Resources)> = Vec::new();
            // And, under a queue's limit, what all the victims free of it (wherever they are).
            let mut freed_in_queue = Resources::new();
            let fits = |freed: &Resources, in_queue: &Resources| {
                free.checked_add(freed).is_some_and(|room| room.fits(wanted))
                    && ceiling.is_none_or(|(_, excess)| in_queue.fits(excess))
            };
            for (_, _, victim, victim_leaf) in candidates {
                if fits(&freed, &freed_in_queue) {
                    break;
                }
                let (here, resources) = match victim.gang {
                    None => (Cow::Borrowed(&placed.shapes[victim.shape]), &placed.shapes[victim.shape]),
                    // A gang is one victim, once, whichever of its members comes first.
                    Some(g) if chosen.iter().any(|(v, ..)| v.gang == Some(g)) => continue,
                    Some(g) => (Cow::Owned(placed.gangs[g].on(i)), &placed.gangs[g].total),
                };
                // Only what helps: a victim holding none of what is lacking frees nothing needed.
                let lacking = wanted.saturating_sub(&free.checked_add(&freed).unwrap_or_default());
                let lacking_in_queue = ceiling.map(|(_, excess)| excess.saturating_sub(&freed_in_queue));
                let helps = lacking.iter().any(|(name, _)| here.get_milli(name.as_str()) > 0)
                    || lacking_in_queue
                        .is_some_and(|l| l.iter().any(|(name, _)| resources.get_milli(name.as_str()) > 0));
                if !helps {
                    continue;
                }
                if self.below_its_guarantee(victim_leaf, (path, wanted), resources, &taken, flows) {
                    refusals
                        .note("taking the tasks that hold the room would leave their queues below their guarantees");
                    continue;
                }
                add_up(&mut taken, victim_leaf, resources);
                freed = freed.checked_add(&here).unwrap_or(freed);
                freed_in_queue = freed_in_queue.checked_add(resources).unwrap_or(freed_in_queue);
                chosen.push((victim, here, resources));
            }
            if !fits(&freed, &freed_in_queue) {
                continue;
            }
            // As little as possible: drop, last chosen first, every victim the room does not need.
            let mut index = chosen.len();
            while index > 0 {
                index -= 1;
                let without = freed.saturating_sub(&chosen[index].1);
                let without_in_queue = freed_in_queue.saturating_sub(chosen[index].2);
                if fits(&without, &without_in_queue) {
                    (freed, freed_in_queue) = (without, without_in_queue);
                    chosen.remove(index);
                }
            }
            let worst = chosen.iter().map(|(v, ..)| v.priority).max().unwrap_or(i32::MIN);
            let count = chosen.iter().map(|(v, ..)| v.gang.map_or(1, |g| placed.gangs[g].members.len())).sum();
            let size = chosen.iter().map(|(.., r)| r.size(&room.weights) as u64).sum();
            let score = (worst, count, size);
            if best.as_ref().is_none_or(|(b, _)| score < *b) {
                let mut victims = Vec::with_capacity(count);
                for (v, _, r) in chosen {
                    let app = &placed.apps[v.app].0;
                    match v.gang {
                        None => victims.push(((app.clone(), v.task.clone()), r.clone())),
                        Some(g) => victims.extend(
                            placed.gangs[g].members.iter().map(|(task, r, _)| ((app.clone(), task.clone()), r.clone())),
                        ),
                    }
                }
                best = Some((score, Plan { spot: i, victims, freed, below }));
            }
            // No later pool does better than the floor, and a tie keeps the first pool: done.
            if best.as_ref().is_some_and(|(b, _)| *b <= placed.floor) {
                break;
            }
        }
        best.map(|(_, plan)| plan).ok_or_else(|| refusals.say())
    }

    /// For a plan, of the placed tasks of `victim_leaf` at `victim_priority`: the rule their
    /// queues break (outside the preemptor's `fence`, or preemption disabled), else their
    /// priority and the preemptor's (of `leaf`, whose `path` up to the root is given, at
    /// `priority`) where the two paths meet.
    fn seen_from(
        &self,
        (victim_leaf, victim_priority): (&QueuePath, i32),
        (leaf, path, priority): (&QueuePath, &[QueuePath], i32),
        fence: &QueuePath,
    ) -> Result<(i32, i32), &'static str> {
        if !victim_leaf.up_to_root().any(|q| q == *fence) {
            return Err("the tasks that hold the room are outside its queue's preemption fence");
        }
        if victim_leaf
            .up_to_root()
            .any(|q| self.queues.get(&q).is_some_and(|l| l.preemption == PreemptionPolicy::Disabled))
        {
            return Err("the tasks that hold the room are in queues with preemption disabled");
        }
        let lca = victim_leaf.up_to_root().find(|q| path.contains(q)).unwrap_or_else(QueuePath::root);
        Ok((self.priority_at(victim_priority, victim_leaf, &lca), self.priority_at(priority, leaf, &lca)))
    }

    /// Whether taking `resources` more (beyond `taken` by this plan and what is leaving already)
    /// would leave a queue from `leaf` up below its guarantee; its tasks with room held for them
    /// count as its own (they are placed into it). A queue on the preemptor's `path` gains what
    /// the preemptor `wanted` too: it is refused only if it ends lower than it is, and below its
    /// guarantee (a gang taken whole for a smaller preemptor of its own queue).
    fn below_its_guarantee(
        &self,
        leaf: &QueuePath,
        (path, wanted): (&[QueuePath], &Resources),
        resources: &Resources,
        taken: &HashMap<QueuePath, Resources>,
        flows: &Flows,
    ) -> bool {
        let empty = Resources::new();
        leaf.ancestors().any(|queue| {
            let Some(limits) = self.queues.get_str(queue) else { return false };
            let on_path = path.iter().any(|p| p.as_str() == queue);
            let used = self.usage.get(queue).map_or(&empty, |u| &u.allocated);
            let already = taken.get(queue).unwrap_or(&empty);
            let leaving = flows.leaving.get(queue).unwrap_or(&empty);
            let arriving = flows.arriving.get(queue).unwrap_or(&empty);
            limits.guaranteed.iter().any(|(name, guarantee)| {
                let name = name.as_str();
                let take = resources.get_milli(name);
                let now = used
                    .get_milli(name)
                    .saturating_add(arriving.get_milli(name))
                    .saturating_sub(leaving.get_milli(name));
                let left = now.saturating_sub(already.get_milli(name)).saturating_sub(take);
                match on_path {
                    false => take > 0 && left < guarantee,
                    true => {
                        let left = left.saturating_add(wanted.get_milli(name));
                        take > 0 && left < now && left < guarantee
                    }
                }
            })
        })
    }

    /// A task owed its queue's guarantee takes room that victims marked this cycle free beyond
    /// their preemptors' need, where it fits: the room is held for it as for a preemptor, and it
    /// waits for those victims. Answers whether it did.
    fn claim_surplus(
        &mut self,
        key: &TaskRef,
        surplus: &mut HashMap<usize, Resources>,
        cycle: &mut Cycle<'_>,
        flows: &mut Flows,
    ) -> bool {
        if surplus.is_empty() {
            return false;
        }
        let task = &self.tasks[&key.0][&key.1];
        let wanted = task.spec.resources.clone();
        let task_type = if cycle.room.typed { self.type_of(&key.0, &key.1) } else { None };
        let allowed = self.allowed(&key.0, &[task_type], None, cycle);
        let fits = |spot: usize, extra: &Resources| {
            extra.fits(&wanted)
                && cycle.room.spots.get(spot).is_some_and(|s| selector_matches(&task.spec.selector, &s.labels))
                && allowed.as_ref().is_none_or(|a| a.takes(spot))
        };
        let Some(spot) = surplus.iter().filter(|(spot, extra)| fits(**spot, extra)).map(|(spot, _)| *spot).min() else {
            return false;
        };
        if let Some(extra) = surplus.get_mut(&spot) {
            *extra = extra.saturating_sub(&wanted);
        }
        let pool = cycle.room.spots[spot].name.clone();
        let Some(task) = self.tasks.get_mut(&key.0).and_then(|t| t.get_mut(&key.1)) else { return false };
        task.held = Some(pool.clone());
        cycle.out.apps.push(AppChange::Task(task.clone()));
        self.pending_shapes.remove(&key.0);
        add_up(&mut flows.arriving, &self.apps[&key.0].spec.queue, &wanted);
        self.holders.insert(key.clone(), pool);
        if let Some(why) = self.still_preempting(key) {
            self.why_task.insert(key.clone(), why);
        }
        true
    }

    /// Marks the plan's victims and holds the room for the preemptor.
    fn carry_out(&mut self, key: &TaskRef, plan: Plan, cycle: &mut Cycle<'_>, flows: &mut Flows) {
        let pool = cycle.room.spots[plan.spot].name.clone();
        let leaf = self.apps[&key.0].spec.queue.clone();
        // The preemptor holds the room: its change is recorded after its victims'.
        let Some(task) = self.tasks.get_mut(&key.0).and_then(|t| t.get_mut(&key.1)) else { return };
        task.held = Some(pool.clone());
        self.pending_shapes.remove(&key.0);
        let (wanted, priority) = (task.spec.resources.clone(), task.spec.priority.value());
        let holder = task.clone();
        add_up(&mut flows.arriving, &leaf, &wanted);
        let reason = match plan.below {
            true => "its queue is below its guarantee".to_owned(),
            false => format!("it has a higher priority ({priority})"),
        };
        let mut names = Vec::with_capacity(plan.victims.len());
        self.mark_victims(key, &plan.victims, &reason, cycle, flows, &mut names);
        cycle.out.apps.push(AppChange::Task(holder));
        self.holders.insert(key.clone(), pool.clone());
        // What it needs beyond what its victims free there is taken from the room now, for it.
        self.hold(plan.spot, &wanted.saturating_sub(&plan.freed), cycle);
        self.stats.preemption_decisions += 1;
        self.why_task
            .insert(key.clone(), Why::Preempting { pool, victims: names, grace_ms: self.config.preemption_grace_ms });
    }

    /// Marks `victims` as preempted for `by`, each named in `names`.
    fn mark_victims(
        &mut self,
        by: &TaskRef,
        victims: &[(TaskRef, Resources)],
        reason: &str,
        cycle: &mut Cycle<'_>,
        flows: &mut Flows,
        names: &mut Vec<String>,
    ) {
        let now = cycle.now;
        for (victim, resources) in victims {
            let Some(task) = self.tasks.get_mut(&victim.0).and_then(|t| t.get_mut(&victim.1)) else { continue };
            task.preempting = Some(Preempting { by: Some(by.clone()), at: now, reason: reason.to_owned() });
            cycle.out.apps.push(AppChange::Task(task.clone()));
            self.victims.insert(victim.clone(), (Some(by.clone()), now));
            add_up(&mut flows.leaving, &self.apps[&victim.0].spec.queue, resources);
            names.push(format!("{}/{}", victim.0, victim.1));
        }
    }

    /// Takes up to `wanted` of what is free on `spot` out of the cycle's room, held.
    fn hold(&self, spot: usize, wanted: &Resources, cycle: &mut Cycle<'_>) {
        let hold = wanted.min(&cycle.room.spots[spot].free);
        cycle.room.take(spot, &hold);
        let held = cycle.held.entry(spot).or_default();
        *held = held.checked_add(&hold).unwrap_or_else(|| held.clone());
    }

    /// Before a holder's placement: the room held for it on its pool is given back to the room,
    /// so that it may take it. Answers what was given back.
    pub(super) fn unhold(
        &self,
        key: &TaskRef,
        room: &mut Room,
        held: &mut HashMap<usize, Resources>,
    ) -> Option<(usize, Resources)> {
        let task = self.tasks.get(&key.0)?.get(&key.1)?;
        let i = room.spot_of(task.held.as_ref()?)?;
        let wanted = &task.spec.resources;
        let portion = held.get(&i).map(|h| h.min(wanted)).unwrap_or_default();
        room.give_back(i, &portion);
        if let Some(h) = held.get_mut(&i) {
            *h = h.saturating_sub(&portion);
        }
        Some((i, portion))
    }

    /// What a task with room held for it waits for: its victims, on its pool.
    pub(super) fn still_preempting(&self, key: &TaskRef) -> Option<Why> {
        let pool = self.holders.get(key)?.clone();
        let mut victims: Vec<String> =
            self.victims_for(key).iter().map(|(app, task)| format!("{app}/{task}")).collect();
        victims.sort();
        Some(Why::Preempting { pool, victims, grace_ms: self.config.preemption_grace_ms })
    }

    /// The victims a task with room held for it waits for: those marked for it, else (room it
    /// took beyond another preemptor's need) those leaving its pool for a preemptor.
    fn victims_for(&self, key: &TaskRef) -> Vec<&TaskRef> {
        let own: Vec<&TaskRef> =
            self.victims.iter().filter(|(_, (by, _))| by.as_ref() == Some(key)).map(|(victim, _)| victim).collect();
        if !own.is_empty() {
            return own;
        }
        let Some(pool) = self.holders.get(key) else { return own };
        let on_pool = |victim: &TaskRef| {
            let task = self.tasks.get(&victim.0).and_then(|t| t.get(&victim.1));
            task.and_then(|t| t.placement.as_ref()).is_some_and(|p| &p.pool == pool)
        };
        self.victims
            .iter()
            .filter(|(victim, (by, _))| by.is_some() && on_pool(victim))
            .map(|(victim, _)| victim)
            .collect()
    }

    /// The task holds no room any more (its pool is gone or down): it waits as any task, and
    /// may preempt again.
    pub(super) fn drop_hold(&mut self, key: &TaskRef, cycle: &mut Cycle<'_>) {
        self.holders.remove(key);
        self.pending_shapes.remove(&key.0);
        if let Some(task) = self.tasks.get_mut(&key.0).and_then(|t| t.get_mut(&key.1)) {
            if task.held.take().is_some() {
                cycle.out.apps.push(AppChange::Task(task.clone()));
            }
        }
    }

    /// After a holder's placement: placed, it holds nothing any more; not placed, the room is
    /// held again, unless nothing is preempted for it any more (then it waits as any task).
    pub(super) fn rehold(&mut self, key: &TaskRef, given: (usize, Resources), placed: bool, cycle: &mut Cycle<'_>) {
        if placed || self.victims_for(key).is_empty() {
            self.holders.remove(key);
            self.pending_shapes.remove(&key.0);
            if let Some(task) = self.tasks.get_mut(&key.0).and_then(|t| t.get_mut(&key.1)) {
                task.held = None;
                if !placed {
                    cycle.out.apps.push(AppChange::Task(task.clone()));
                }
            }
            return;
        }
        let (i, portion) = given;
        cycle.room.take(i, &portion);
        let held = cycle.held.entry(i).or_default();
        *held = held.checked_add(&portion).unwrap_or_else(|| held.clone());
    }
}
