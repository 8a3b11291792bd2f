//! Hierarchical queues (YuniKorn's queues): a tree of `root.a.b` paths, each with limits, and the
//! check a placement makes against every queue from its leaf up to `root`.
//!
//! Limits are checked when placing, not when submitting: an application over a limit stays
//! waiting, and [`Queues::blocked_by`] says which limit of which queue holds it. Changing a limit
//! takes effect on the next check; lowering one ends nothing.
//!
//! Invariants: `root` always exists; a queue's parent exists; applications go to leaf queues
//! only (a queue with no child).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::apps::priority::PriorityPolicy;
use crate::resources::Resources;

/// The root of every queue tree.
pub const ROOT: &str = "root";
/// The longest queue path, in bytes.
pub const MAX_QUEUE_PATH: usize = 255;
/// What [`QueuePath::new`] takes, as a regular expression for the API's document (with
/// [`MAX_QUEUE_PATH`] as the longest).
pub const QUEUE_PATH_PATTERN: &str = "^root(\\.[a-z0-9_-]+)*$";

/// Why a queue path or tree change was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    #[error(
        "queue `{0}` is not a queue path: `root`, then `.`-separated segments of a-z, 0-9, `_` and `-` \
         (e.g. `root.analytics.etl`), at most 255 bytes; or, naming an application's queue, one such segment \
         (a queue under root)"
    )]
    BadPath(String),
    #[error("queue `{0}` does not exist")]
    NotFound(QueuePath),
    #[error("queue `{queue}` has child queues ({child}...): applications go to leaf queues only")]
    NotALeaf { queue: QueuePath, child: QueuePath },
    #[error("queue `{queue}` cannot be made: queue `{leaf}` above it holds applications, and applications go to leaf queues only")]
    UnderBusyLeaf { queue: QueuePath, leaf: QueuePath },
    #[error("queue `{queue}` has child queues; remove them first")]
    HasChildren { queue: QueuePath },
    #[error("queue `{queue}` cannot have these limits: {why}")]
    Limits { queue: QueuePath, why: String },
    #[error("the root queue cannot be removed")]
    RemoveRoot,
}

/// A queue's path, e.g. `root.analytics.etl`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueuePath(Arc<str>);

impl QueuePath {
    pub fn new(path: &str) -> Result<QueuePath, QueueError> {
        let segment_ok = |s: &str| {
            !s.is_empty() && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        };
        let mut segments = path.split('.');
        let valid = path.len() <= MAX_QUEUE_PATH && segments.next() == Some(ROOT) && segments.all(segment_ok);
        if !valid {
            return Err(QueueError::BadPath(path.to_owned()));
        }
        Ok(QueuePath(Arc::from(path)))
    }

    /// The queue an application names: a path under `root`, or one segment, the queue of that
    /// name under `root`.
    pub fn named(text: &str) -> Result<QueuePath, QueueError> {
        let qualified = text == ROOT || text.starts_with("root.");
        match qualified {
            true => QueuePath::new(text),
            false if text.contains('.') => Err(QueueError::BadPath(text.to_owned())),
            false => QueuePath::new(&format!("{ROOT}.{text}")).map_err(|_| QueueError::BadPath(text.to_owned())),
        }
    }

    pub fn root() -> QueuePath {
        QueuePath(Arc::from(ROOT))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The parent queue; `None` for `root`.
    pub fn parent(&self) -> Option<QueuePath> {
        self.0.rsplit_once('.').map(|(parent, _)| QueuePath(Arc::from(parent)))
    }

    /// This queue, then each ancestor up to `root`.
    pub fn up_to_root(&self) -> impl Iterator<Item = QueuePath> {
        std::iter::successors(Some(self.clone()), QueuePath::parent)
    }

    /// The paths of this queue, then of each ancestor up to `root`, as `up_to_root` without
    /// making a path of each: maps keyed by paths are read by them (`Borrow<str>`).
    pub(crate) fn ancestors(&self) -> impl Iterator<Item = &str> {
        std::iter::successors(Some(&*self.0), |path: &&str| path.rsplit_once('.').map(|(parent, _)| parent))
    }

    /// The path of an ancestor `ancestors` answered (valid, as a part of a valid path).
    pub(crate) fn of_ancestor(path: &str) -> QueuePath {
        QueuePath(Arc::from(path))
    }

    fn is_child_of(&self, parent: &QueuePath) -> bool {
        self.parent().as_ref() == Some(parent)
    }
}

/// A path hashes and compares as its text, so maps keyed by paths are read by the text.
impl std::borrow::Borrow<str> for QueuePath {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for QueuePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How a leaf queue orders its applications.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SortPolicy {
    /// First submitted, first placed.
    #[default]
    Fifo,
    /// The application using least first.
    Fair,
    /// Highest priority first, then first submitted.
    Priority,
}

/// A queue's limits. A resource that `max` (or `user_max`, `group_max`) does not name is not
/// limited.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueLimits {
    /// What the queue is promised: fair share between siblings is by it.
    pub guaranteed: Resources,
    pub max: Option<Resources>,
    /// The most applications running at once in the queue and below.
    pub max_apps: Option<u64>,
    /// The most applications one user runs at once in the queue and below.
    pub user_max_apps: Option<u64>,
    /// The most one user holds in the queue and below.
    pub user_max: Option<Resources>,
    /// The most applications of one group run at once in the queue and below: an application
    /// counts for its user's primary group (see [`Owner`]).
    pub group_max_apps: Option<u64>,
    /// The most one group's applications hold in the queue and below.
    pub group_max: Option<Resources>,
    pub sort: SortPolicy,
    /// Who may submit to the queue and below [YuniKorn `submitacl`] (none: its parent's say).
    pub submit_acl: Option<crate::access::Acl>,
    /// Who may administer, and submit to, the queue and below [YuniKorn `adminacl`].
    pub admin_acl: Option<crate::access::Acl>,
    /// The most the queue and below may hold beyond `guaranteed`, per resource named [Kueue's
    /// `borrowingLimit`]: what it holds stays within `guaranteed + borrow_limit`.
    pub borrow_limit: Option<Resources>,
    /// The most of its unused guarantee the queue lends to queues outside it, per resource named
    /// [Kueue's `lendingLimit`]: the rest of the unused part is held free for it.
    pub lend_limit: Option<Resources>,
    /// Added to the priority the queue shows its parent [YuniKorn `priority.offset`].
    pub priority_offset: i32,
    /// [YuniKorn `priority.policy`]: `Fence` shows the parent the offset alone.
    pub priority_policy: PriorityPolicy,
    /// [YuniKorn `preemption.policy`]: `Disabled`, its tasks (and those below) are never
    /// preempted; `Fence`, its tasks preempt only inside it.
    pub preemption: PreemptionPolicy,
    /// How long a task of it waits before it may preempt [YuniKorn `preemption.delay`]; none:
    /// its parent's, else 30 s.
    pub preemption_delay_ms: Option<u64>,
}

/// Whether and where a queue's tasks preempt, and are preempted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PreemptionPolicy {
    #[default]
    Default,
    /// Its tasks preempt only tasks inside it.
    Fence,
    /// Its tasks, and those of the queues below it, are never preempted.
    Disabled,
}

impl PreemptionPolicy {
    pub fn name(self) -> &'static str {
        match self {
            PreemptionPolicy::Default => "default",
            PreemptionPolicy::Fence => "fence",
            PreemptionPolicy::Disabled => "disabled",
        }
    }

    pub fn from_name(name: &str) -> Option<PreemptionPolicy> {
        [PreemptionPolicy::Default, PreemptionPolicy::Fence, PreemptionPolicy::Disabled]
            .into_iter()
            .find(|p| p.name() == name)
    }
}

/// What a queue (with everything below it) holds now, as the scheduler counts it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueUsage {
    pub allocated: Resources,
    pub running_apps: u64,
    /// Per user: running applications and what they hold.
    pub users: BTreeMap<String, (u64, Resources)>,
    /// Per group (the primary group of the applications' users): the same.
    pub groups: BTreeMap<String, (u64, Resources)>,
}

/// Whom the per-user and per-group limits count an application against: its user, and its
/// user's primary group, the first of its groups [YuniKorn tracks an application against one
/// group]. An application whose user has no group is held by no group limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner<'a> {
    pub user: &'a str,
    pub group: Option<&'a str>,
}

/// The limit that holds a placement back, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Limit {
    MaxApps {
        max: u64,
    },
    UserMaxApps {
        user: String,
        max: u64,
    },
    /// `resource` would exceed `max` (milli-units): `used` held, `wanted` more.
    Max {
        resource: String,
        max: u64,
        used: u64,
        wanted: u64,
    },
    UserMax {
        user: String,
        resource: String,
        max: u64,
        used: u64,
        wanted: u64,
    },
    GroupMaxApps {
        group: String,
        max: u64,
    },
    GroupMax {
        group: String,
        resource: String,
        max: u64,
        used: u64,
        wanted: u64,
    },
    /// `resource` would be held beyond `guaranteed + borrow_limit` (milli-units).
    Borrow {
        resource: String,
        guaranteed: u64,
        borrow_limit: u64,
        used: u64,
        wanted: u64,
    },
    /// `wanted` of `resource` would eat into the part of the queue's unused guarantee it does not
    /// lend (`held`), with `free` free in every pool together (milli-units).
    Lend {
        resource: String,
        held: u64,
        free: u64,
        wanted: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitHit {
    pub queue: QueuePath,
    pub limit: Limit,
}

impl fmt::Display for LimitHit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A quantity of zero is not held by a vector: it is written out.
        let amount = |resource: &str, milli: u64| match milli {
            0 => format!("{resource}=0"),
            milli => Resources::new().with_milli(resource, milli).to_string(),
        };
        // What is held so far, in words when it is nothing.
        let held = |resource: &str, used: u64| match used {
            0 => "nothing used yet".to_owned(),
            used => format!("{} used", amount(resource, used)),
        };
        let queue = &self.queue;
        match &self.limit {
            Limit::MaxApps { max } => write!(f, "queue `{queue}` already runs its maximum of {max} applications"),
            Limit::UserMaxApps { user, max } => {
                write!(f, "user `{user}` already runs the maximum of {max} applications in queue `{queue}`")
            }
            Limit::Max { resource, max, used, wanted } => write!(
                f,
                "queue `{queue}` would go over its max of {} ({}, {} more wanted)",
                amount(resource, *max),
                held(resource, *used),
                amount(resource, *wanted)
            ),
            Limit::UserMax { user, resource, max, used, wanted } => write!(
                f,
                "user `{user}` would go over the per-user max of {} in queue `{queue}` ({}, {} more wanted)",
                amount(resource, *max),
                held(resource, *used),
                amount(resource, *wanted)
            ),
            Limit::GroupMaxApps { group, max } => {
                write!(f, "group `{group}` already runs the maximum of {max} applications in queue `{queue}`")
            }
            Limit::GroupMax { group, resource, max, used, wanted } => write!(
                f,
                "group `{group}` would go over the per-group max of {} in queue `{queue}` ({}, {} more wanted)",
                amount(resource, *max),
                held(resource, *used),
                amount(resource, *wanted)
            ),
            Limit::Borrow { resource, guaranteed, borrow_limit, used, wanted } => write!(
                f,
                "queue `{queue}` would borrow more than its borrow_limit of {} beyond its guarantee of {} ({}, {} more \
                 wanted)",
                amount(resource, *borrow_limit),
                amount(resource, *guaranteed),
                held(resource, *used),
                amount(resource, *wanted)
            ),
            Limit::Lend { resource, held, free, wanted } => write!(
                f,
                "queue `{queue}` does not lend {} of its unused guarantee (its lend_limit), and {} is free in all pools \
                 together ({} wanted)",
                amount(resource, *held),
                amount(resource, *free),
                amount(resource, *wanted)
            ),
        }
    }
}

/// The limit of one queue that `wanted` more (for `owner`, starting an application if
/// `starts_app`) would break, given what the queue uses now.
pub fn limit_at(
    limits: &QueueLimits,
    used: &QueueUsage,
    owner: Owner<'_>,
    wanted: &Resources,
    starts_app: bool,
) -> Option<Limit> {
    let empty = (0, Resources::new());
    let user_used = used.users.get(owner.user).unwrap_or(&empty);
    let group_used = owner.group.map(|group| (group, used.groups.get(group).unwrap_or(&empty)));
    if starts_app {
        if let Some(max) = limits.max_apps.filter(|max| used.running_apps >= *max) {
            return Some(Limit::MaxApps { max });
        }
        if let Some(max) = limits.user_max_apps.filter(|max| user_used.0 >= *max) {
            return Some(Limit::UserMaxApps { user: owner.user.to_owned(), max });
        }
        if let (Some(max), Some((group, (apps, _)))) = (limits.group_max_apps, group_used) {
            if *apps >= max {
                return Some(Limit::GroupMaxApps { group: group.to_owned(), max });
            }
        }
    }
    if let Some((resource, max, used, wanted)) = limits.max.as_ref().and_then(|max| over(max, &used.allocated, wanted))
    {
        return Some(Limit::Max { resource, max, used, wanted });
    }
    if let Some(hit) =
        limits.borrow_limit.as_ref().and_then(|limit| over_borrow(limit, &limits.guaranteed, &used.allocated, wanted))
    {
        return Some(hit);
    }
    if let Some((resource, max, used, wanted)) =
        limits.user_max.as_ref().and_then(|max| over(max, &user_used.1, wanted))
    {
        return Some(Limit::UserMax { user: owner.user.to_owned(), resource, max, used, wanted });
    }
    let (group, (_, held)) = group_used?;
    let (resource, max, used, wanted) = over(limits.group_max.as_ref()?, held, wanted)?;
    Some(Limit::GroupMax { group: group.to_owned(), resource, max, used, wanted })
}

/// The first resource `max` names for which `used + wanted` goes over it.
/// The first resource `limit` names of which `have` holds more.
fn above<'a>(have: &Resources, limit: &'a Resources) -> Option<&'a str> {
    limit.iter().find(|(name, most)| have.get_milli(name.as_str()) > *most).map(|(name, _)| name.as_str())
}

fn over(max: &Resources, used: &Resources, wanted: &Resources) -> Option<(String, u64, u64, u64)> {
    max.iter().find_map(|(name, limit)| {
        let (used, wanted) = (used.get_milli(name.as_str()), wanted.get_milli(name.as_str()));
        (used.saturating_add(wanted) > limit).then(|| (name.as_str().to_owned(), limit, used, wanted))
    })
}

/// The first resource `borrow_limit` names for which `used + wanted` goes beyond `guaranteed`
/// by more than the limit (a resource `guaranteed` does not name is guaranteed 0).
fn over_borrow(
    borrow_limit: &Resources,
    guaranteed: &Resources,
    used: &Resources,
    wanted: &Resources,
) -> Option<Limit> {
    borrow_limit.iter().find_map(|(name, limit)| {
        let name = name.as_str();
        let (guaranteed, used, wanted) = (guaranteed.get_milli(name), used.get_milli(name), wanted.get_milli(name));
        (used.saturating_add(wanted) > guaranteed.saturating_add(limit)).then(|| Limit::Borrow {
            resource: name.to_owned(),
            guaranteed,
            borrow_limit: limit,
            used,
            wanted,
        })
    })
}

/// The queue tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queues {
    queues: BTreeMap<QueuePath, QueueLimits>,
}

impl Default for Queues {
    fn default() -> Queues {
        Queues { queues: BTreeMap::from([(QueuePath::root(), QueueLimits::default())]) }
    }
}

impl Queues {
    pub fn new() -> Queues {
        Queues::default()
    }

    /// Creates a queue (and any missing parent, with no limits) or changes its limits; true if
    /// it was created. A new limit holds from the next placement check; nothing is evicted.
    pub fn put(&mut self, path: QueuePath, limits: QueueLimits) -> bool {
        for ancestor in path.up_to_root().skip(1) {
            self.queues.entry(ancestor).or_default();
        }
        self.queues.insert(path, limits).is_none()
    }

    /// Removes a queue with no child queue (whoever holds its applications checks they are gone).
    pub fn remove(&mut self, path: &QueuePath) -> Result<QueueLimits, QueueError> {
        if path.parent().is_none() {
            return Err(QueueError::RemoveRoot);
        }
        if self.children(path).next().is_some() {
            return Err(QueueError::HasChildren { queue: path.clone() });
        }
        self.queues.remove(path).ok_or_else(|| QueueError::NotFound(path.clone()))
    }

    pub fn get(&self, path: &QueuePath) -> Option<&QueueLimits> {
        self.queues.get(path)
    }

    /// The limits of the queue of path `path`, as `get`.
    pub(crate) fn get_str(&self, path: &str) -> Option<&QueueLimits> {
        self.queues.get(path)
    }

    /// Every queue, parents before children.
    pub fn iter(&self) -> impl Iterator<Item = (&QueuePath, &QueueLimits)> {
        self.queues.iter()
    }

    /// Whether `limits` may be put at `path`, against themselves and the queues around it
    /// [YuniKorn's queue configuration checks]: a queue's guarantee is within its max; its max and
    /// its guarantee within every max above it; its children's maxes and guarantees within its
    /// max; and the guarantees of a queue's children add up to no more than its own guarantee,
    /// when it has one. Each compares only the resources the limit names (a resource a max does
    /// not name is not limited).
    pub fn check_limits(&self, path: &QueuePath, limits: &QueueLimits) -> Result<(), QueueError> {
        let refuse = |why: String| Err(QueueError::Limits { queue: path.clone(), why });
        let guaranteed = &limits.guaranteed;
        if let Some(name) = limits.max.as_ref().and_then(|max| above(guaranteed, max)) {
            return refuse(format!("its guarantee of `{name}` is above its max"));
        }
        for ancestor in path.up_to_root().skip(1) {
            let Some(ancestor_max) = self.get(&ancestor).and_then(|l| l.max.as_ref()) else { continue };
            if let Some(name) = limits.max.as_ref().and_then(|max| above(max, ancestor_max)) {
                return refuse(format!("its max of `{name}` is above the max of `{ancestor}`"));
            }
            if let Some(name) = above(guaranteed, ancestor_max) {
                return refuse(format!("its guarantee of `{name}` is above the max of `{ancestor}`"));
            }
        }
        let mut children_guaranteed = Resources::new();
        for child in self.children(path) {
            let Some(child_limits) = self.get(child) else { continue };
            if let Some(max) = &limits.max {
                if let Some(name) = child_limits.max.as_ref().and_then(|child_max| above(child_max, max)) {
                    return refuse(format!("the max of `{child}` is above it in `{name}`"));
                }
                if let Some(name) = above(&child_limits.guaranteed, max) {
                    return refuse(format!("the guarantee of `{child}` is above its max in `{name}`"));
                }
            }
            children_guaranteed = children_guaranteed.saturating_add(&child_limits.guaranteed);
        }
        if !guaranteed.is_empty() {
            if let Some(name) = above(&children_guaranteed, guaranteed) {
                return refuse(format!("its children are guaranteed more `{name}` than it is ({children_guaranteed})"));
            }
        }
        let Some(parent) = path.parent() else { return Ok(()) };
        let Some(parent_limits) = self.get(&parent).filter(|l| !l.guaranteed.is_empty()) else { return Ok(()) };
        let siblings =
            self.children(&parent).filter(|sibling| *sibling != path).filter_map(|sibling| self.get(sibling));
        let together = siblings.fold(guaranteed.clone(), |sum, sibling| sum.saturating_add(&sibling.guaranteed));
        if let Some(name) = above(&together, &parent_limits.guaranteed) {
            return refuse(format!(
                "with its siblings it would be guaranteed more `{name}` ({together}) than `{parent}` is ({})",
                parent_limits.guaranteed
            ));
        }
        Ok(())
    }

    pub fn children<'a>(&'a self, path: &'a QueuePath) -> impl Iterator<Item = &'a QueuePath> + 'a {
        self.queues.keys().filter(move |q| q.is_child_of(path))
    }

    /// Checks that `path` is a leaf queue, where applications go.
    pub fn leaf(&self, path: &QueuePath) -> Result<&QueueLimits, QueueError> {
        let limits = self.queues.get(path).ok_or_else(|| QueueError::NotFound(path.clone()))?;
        match self.children(path).next() {
            Some(child) => Err(QueueError::NotALeaf { queue: path.clone(), child: child.clone() }),
            None => Ok(limits),
        }
    }

    /// Whether some queue lends only part of its guarantee (only then is [`Queues::lend_hit`]
    /// worth asking).
    pub fn any_lend_limit(&self) -> bool {
        self.queues.values().any(|limits| limits.lend_limit.is_some())
    }

    /// What each queue holds free for itself and the queues below it: of each resource its
    /// `lend_limit` names, the unused guarantee beyond what it lends; and at least what its
    /// children hold together. Only queues that hold something; `used` gives what a queue holds.
    pub fn held_back<'u>(&self, used: impl Fn(&QueuePath) -> Option<&'u Resources>) -> BTreeMap<QueuePath, Resources> {
        let mut held: BTreeMap<QueuePath, Resources> = BTreeMap::new();
        // A child's path sorts after its parent's: in reverse, every child comes first.
        for (path, limits) in self.queues.iter().rev() {
            let below = held.get(path).cloned().unwrap_or_default();
            let mut own = Resources::new();
            if let Some(lend) = &limits.lend_limit {
                let empty = Resources::new();
                let used = used(path).unwrap_or(&empty);
                for (name, lent) in lend.iter() {
                    let unused =
                        limits.guaranteed.get_milli(name.as_str()).saturating_sub(used.get_milli(name.as_str()));
                    own.set_milli(name.clone(), unused.saturating_sub(lent));
                }
            }
            let total = below.max(&own);
            if let (Some(parent), false) = (path.parent(), total.is_empty()) {
                let sum = held.entry(parent).or_default();
                *sum = sum.checked_add(&total).unwrap_or_else(|| sum.clone());
            }
            match total.is_empty() {
                true => held.remove(path),
                false => held.insert(path.clone(), total),
            };
        }
        held
    }

    /// Whether placing `wanted` for an application of `leaf` would use room that queues outside
    /// it hold free (`held`, from [`Queues::held_back`]), with `free` free in every pool
    /// together: the queue that holds most of the first resource short, if so.
    pub fn lend_hit(
        &self,
        leaf: &QueuePath,
        wanted: &Resources,
        free: &Resources,
        held: &BTreeMap<QueuePath, Resources>,
    ) -> Option<LimitHit> {
        let path: Vec<QueuePath> = leaf.up_to_root().collect();
        // The queues beside the path (a sibling of the leaf or of a queue above it): what each
        // holds counts once, with everything below it.
        let beside: Vec<(&QueuePath, &Resources)> = held
            .iter()
            .filter(|(queue, _)| !path.contains(queue) && queue.parent().is_some_and(|p| path.contains(&p)))
            .collect();
        for (name, want) in wanted.iter() {
            let name = name.as_str();
            let kept: u64 = beside.iter().map(|(_, held)| held.get_milli(name)).sum();
            let free_now = free.get_milli(name);
            if kept == 0 || free_now >= want.saturating_add(kept) {
                continue;
            }
            let (queue, most) = beside.iter().max_by_key(|(_, held)| held.get_milli(name))?;
            return Some(LimitHit {
                queue: (*queue).clone(),
                limit: Limit::Lend {
                    resource: name.to_owned(),
                    held: most.get_milli(name),
                    free: free_now,
                    wanted: want,
                },
            });
        }
        None
    }

    /// The first limit, from `leaf` up to `root`, that placing `wanted` more for `owner` would
    /// break; `starts_app` when the placement makes the application a running one. `usage`
    /// gives what each queue holds now.
    pub fn blocked_by(
        &self,
        leaf: &QueuePath,
        owner: Owner<'_>,
        wanted: &Resources,
        starts_app: bool,
        usage: impl Fn(&QueuePath) -> QueueUsage,
    ) -> Option<LimitHit> {
        for queue in leaf.up_to_root() {
            let Some(limits) = self.queues.get(&queue) else { continue };
            if let Some(limit) = limit_at(limits, &usage(&queue), owner, wanted, starts_app) {
                return Some(LimitHit { queue, limit });
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(path: &str) -> QueuePath {
        QueuePath::new(path).unwrap()
    }

    fn res(text: &str) -> Resources {
        text.parse().unwrap()
    }

    #[test]
    fn paths_start_at_root() {
        assert_eq!(q("root.analytics.etl").parent(), Some(q("root.analytics")));
        assert_eq!(q("root").parent(), None);
        assert_eq!(
            q("root.a.b").up_to_root().map(|p| p.to_string()).collect::<Vec<_>>(),
            ["root.a.b", "root.a", "root"]
        );
        for bad in ["", "a", "root.", "root..a", "rootx", "root.A", "root.a b", "other.a"] {
            assert!(QueuePath::new(bad).is_err(), "{bad:?}");
        }
        assert!(QueuePath::new(&format!("root.{}", "a".repeat(251))).is_err());
    }

    #[test]
    fn applications_go_to_leaves_and_parents_are_made() {
        let mut queues = Queues::new();
        assert!(queues.put(q("root.analytics.etl"), QueueLimits::default()));
        assert!(queues.get(&q("root.analytics")).is_some(), "the parent is made");
        assert!(queues.leaf(&q("root.analytics.etl")).is_ok());
        assert!(matches!(queues.leaf(&q("root.analytics")), Err(QueueError::NotALeaf { .. })));
        assert!(matches!(queues.leaf(&q("root.nope")), Err(QueueError::NotFound(_))));
        assert!(matches!(queues.remove(&q("root.analytics")), Err(QueueError::HasChildren { .. })));
        assert_eq!(queues.remove(&q("root")), Err(QueueError::RemoveRoot));
        assert!(queues.remove(&q("root.analytics.etl")).is_ok());
        assert!(queues.leaf(&q("root.analytics")).is_ok(), "a parent with no child left is a leaf");
    }

    #[test]
    fn the_first_limit_from_the_leaf_up_says_what_holds_a_placement() {
        let mut queues = Queues::new();
        let etl = q("root.analytics.etl");
        queues.put(
            etl.clone(),
            QueueLimits { max: Some(res("cpu=8")), user_max_apps: Some(1), ..QueueLimits::default() },
        );
        queues.put(
            q("root.analytics"),
            QueueLimits { max: Some(res("mem=16GiB")), max_apps: Some(2), ..QueueLimits::default() },
        );
        // Every queue holds the same here: `cpu` and `apps` running applications, one of them ann's.
        let used = |cpu: &str, apps: u64| {
            let usage = QueueUsage {
                allocated: res(cpu),
                running_apps: apps,
                users: BTreeMap::from([("ann".to_owned(), (1, res(cpu)))]),
                groups: BTreeMap::new(),
            };
            move |_: &QueuePath| usage.clone()
        };
        let (ann, bob) = (Owner { user: "ann", group: None }, Owner { user: "bob", group: None });
        // Under every limit: nothing holds it. Resources a limit does not name are not limited.
        assert_eq!(queues.blocked_by(&etl, bob, &res("cpu=2,gpu=4"), true, used("cpu=4", 1)), None);
        // The leaf's cpu.
        let hit = queues.blocked_by(&etl, bob, &res("cpu=5"), false, used("cpu=4", 1)).unwrap();
        assert_eq!(
            hit,
            LimitHit {
                queue: etl.clone(),
                limit: Limit::Max { resource: "cpu".into(), max: 8000, used: 4000, wanted: 5000 }
            }
        );
        // The user's applications in the leaf, only when the placement starts an application.
        let hit = queues.blocked_by(&etl, ann, &res("cpu=1"), true, used("cpu=1", 1)).unwrap();
        assert_eq!(hit.limit, Limit::UserMaxApps { user: "ann".into(), max: 1 });
        assert_eq!(queues.blocked_by(&etl, ann, &res("cpu=1"), false, used("cpu=1", 1)), None);
        // The parent's application count.
        let hit = queues.blocked_by(&etl, bob, &res("cpu=1"), true, used("cpu=1", 2)).unwrap();
        assert_eq!((hit.queue, hit.limit), (q("root.analytics"), Limit::MaxApps { max: 2 }));
        // Lowering a limit holds the next placement back and ends nothing.
        queues.put(etl.clone(), QueueLimits { max: Some(res("cpu=2")), ..QueueLimits::default() });
        assert!(queues.blocked_by(&etl, bob, &res("cpu=1"), false, used("cpu=4", 1)).is_some());
    }

    #[test]
    fn a_group_limit_counts_the_applications_of_the_users_primary_group() {
        let mut queues = Queues::new();
        let etl = q("root.etl");
        queues.put(
            etl.clone(),
            QueueLimits { group_max_apps: Some(2), group_max: Some(res("cpu=4")), ..QueueLimits::default() },
        );
        // The group `data` runs two applications holding 3 cpu; `ops` runs none.
        let usage = QueueUsage {
            allocated: res("cpu=3"),
            running_apps: 2,
            users: BTreeMap::new(),
            groups: BTreeMap::from([("data".to_owned(), (2, res("cpu=3")))]),
        };
        let used = |_: &QueuePath| usage.clone();
        let ann = Owner { user: "ann", group: Some("data") };
        let hit = queues.blocked_by(&etl, ann, &res("cpu=1"), true, used).unwrap();
        assert_eq!(hit.limit, Limit::GroupMaxApps { group: "data".into(), max: 2 });
        assert_eq!(hit.to_string(), "group `data` already runs the maximum of 2 applications in queue `root.etl`");
        // More for a running application: the group's resources bind.
        assert_eq!(queues.blocked_by(&etl, ann, &res("cpu=1"), false, used), None);
        let hit = queues.blocked_by(&etl, ann, &res("cpu=2"), false, used).unwrap();
        assert_eq!(
            hit.limit,
            Limit::GroupMax { group: "data".into(), resource: "cpu".into(), max: 4000, used: 3000, wanted: 2000 }
        );
        // Another group, or a user with no group, is not held by `data`'s use.
        let bob = Owner { user: "bob", group: Some("ops") };
        assert_eq!(queues.blocked_by(&etl, bob, &res("cpu=4"), true, used), None);
        let carol = Owner { user: "carol", group: None };
        assert_eq!(queues.blocked_by(&etl, carol, &res("cpu=9"), true, used), None);
    }
}
