//! Leased resource pools [Reflow `pool`]: every pool, its allocs and their leases, and the
//! decisions over them.
//!
//! At length, as one thing: the pools and the two indexes over them (leases by expiry, ended
//! allocs by end time) change together in every operation; apart, they would be kept in step
//! across files.
//!
//! A pool has a capacity (a [`Resources`] vector). It offers everything that is free as one
//! offer; accepting the offer with a request (a minimum and an optional maximum) makes an
//! *alloc*. An alloc holds a lease that its owner renews with keepalives; an alloc whose lease has
//! lapsed still holds its resources until it is *reclaimed*: by an accept that needs the room (the
//! most-expired first) or by the sweeper once it has been expired for `reclaim_after_ms`. Until
//! then a keepalive revives it, as in Reflow. Ended allocs (freed, reclaimed, stopped) stay
//! readable for `retention_ms` (at most [`MAX_ENDED_PER_POOL`] per pool) and say why they ended
//! (Reflow's zombies).
//!
//! Like the token ledger, every operation takes `now` and returns [`PoolChange`]s for the store
//! to make durable; nothing here does I/O, reads a clock or draws random numbers (alloc ids come
//! from the caller).
//!
//! Invariants, checked by `Pools::check_invariants` in tests:
//! - for every pool, the resources of its allocs (expired or not) sum to at most its capacity
//!   less what is occupied (by things allot does not manage), whatever order accepts,
//!   keepalives, frees and sweeps come in (unless the capacity was put, or more occupied,
//!   below what was held: nothing is revoked here, no new alloc is made there, and the
//!   scheduler preempts the tasks that no longer fit, `Pools::strained`);
//! - a cordoned pool makes no offer and no new alloc;
//! - `leases` holds exactly one entry per alloc, at its expiry;
//! - an ended alloc is in `ended` of its pool and nowhere else.

use std::collections::{btree_map, BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::ops::Bound;
use std::sync::Arc;

use crate::first_after;
use crate::names::{check, NameError};
use crate::quotas::Millis;
use crate::resources::Resources;

/// The id of a pool's one offer [Reflow `offerID`]: an offer is "everything free in the pool",
/// and accepting it is checked against what is free at that moment.
pub const OFFER_ID: &str = "1";
/// At most this many ended allocs are kept per pool (the oldest go first), whatever their
/// retention, so a pool with a high churn keeps a bounded record.
pub const MAX_ENDED_PER_POOL: usize = 1024;

/// A pool's name: the first part of a `pool/alloc` URI, so it has no `/`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolName(Arc<str>);

impl PoolName {
    pub fn new(name: &str) -> Result<PoolName, NameError> {
        check("pool", name)?;
        Ok(PoolName(Arc::from(name)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The address of its text: two names at one address are the same name (the converse does
    /// not hold: the same name may be held twice).
    pub(crate) fn addr(&self) -> usize {
        Arc::as_ptr(&self.0) as *const u8 as usize
    }
}

impl fmt::Display for PoolName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What [`AllocId::parse`] takes, as a regular expression for the API's document.
pub const ALLOC_ID_PATTERN: &str = "^[0-9a-fA-F]{16}$";

/// An alloc's id: 16 lowercase hex digits, drawn at random by the store [Reflow `newID`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AllocId(pub u64);

impl AllocId {
    pub fn parse(text: &str) -> Result<AllocId, NameError> {
        if text.len() != 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(NameError::BadAllocId { text: text.to_owned() });
        }
        u64::from_str_radix(text, 16).map(AllocId).map_err(|_| NameError::BadAllocId { text: text.to_owned() })
    }
}

impl fmt::Display for AllocId {
    /// Sixteen hexadecimal digits (every alloc's key and event has one).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = crate::names::hex_digits(self.0);
        f.write_str(std::str::from_utf8(&text).map_err(|_| fmt::Error)?)
    }
}

/// Lease rules. The defaults are Reflow's: a 2-minute lease at accept, at most 5 minutes per
/// keepalive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseRules {
    /// The lease an alloc gets when it is made.
    pub initial_ms: u64,
    /// The longest lease a keepalive grants.
    pub max_ms: u64,
    /// The sweeper reclaims an alloc once its lease has lapsed for this long (an accept that
    /// needs the room reclaims it at once).
    pub reclaim_after_ms: u64,
    /// How long an ended alloc stays readable.
    pub retention_ms: u64,
}

impl LeaseRules {
    /// The lease a keepalive asking for `interval_ms` gets: at most [`LeaseRules::max_ms`]; zero
    /// is refused.
    pub fn grant(&self, interval_ms: u64) -> Result<u64, PoolError> {
        if interval_ms == 0 {
            return Err(PoolError::OutOfRange { what: "keepalive interval", value: 0, min: 1, max: self.max_ms });
        }
        Ok(interval_ms.min(self.max_ms))
    }
}

impl Default for LeaseRules {
    fn default() -> LeaseRules {
        LeaseRules { initial_ms: 120_000, max_ms: 300_000, reclaim_after_ms: 60_000, retention_ms: 3_600_000 }
    }
}

/// The longest idle time `stop_if_idle_for` takes: 2^53 - 1 ms, exact in every JSON client (and
/// in the Redis functions' numbers).
pub const MAX_IDLE_MS: u64 = (1 << 53) - 1;

/// Checks the idle time of a stop-if-idle; every backend checks it first.
pub fn check_idle(idle_ms: u64) -> Result<(), PoolError> {
    if idle_ms > MAX_IDLE_MS {
        return Err(PoolError::OutOfRange { what: "idle_ms", value: idle_ms, min: 0, max: MAX_IDLE_MS });
    }
    Ok(())
}

/// What an accept asks for [Reflow `AllocMeta`, `Requirements`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AllocRequest {
    /// The alloc is made only if at least this much is free.
    pub min: Resources,
    /// Take up to this much when it is free; `None` means exactly `min`. Where `max` is below
    /// `min` (or does not name a resource `min` names), `min` counts: see [`AllocRequest::upper`].
    pub max: Option<Resources>,
    pub owner: String,
    pub labels: BTreeMap<String, String>,
    /// Its owner's free-form metadata: JSON text, at most [`MAX_ALLOC_METADATA_BYTES`].
    pub metadata: Option<String>,
}

/// The most an alloc's metadata may hold (its JSON text, in bytes): what an owner says of the
/// work in it, not the work's data.
pub const MAX_ALLOC_METADATA_BYTES: usize = 16 * 1024;

/// The most an alloc's labels may hold (their keys and values, in bytes).
pub const MAX_ALLOC_LABEL_BYTES: usize = 16 * 1024;

/// Checks the size of what an owner attaches to an alloc: its labels and its metadata.
pub fn check_alloc_notes(labels: &Labels, metadata: Option<&str>) -> Result<(), PoolError> {
    let label_bytes: usize = labels.iter().map(|(key, value)| key.len() + value.len()).sum();
    if label_bytes > MAX_ALLOC_LABEL_BYTES {
        return Err(PoolError::TooLarge { what: "labels", bytes: label_bytes, max: MAX_ALLOC_LABEL_BYTES });
    }
    let metadata_bytes = metadata.map_or(0, str::len);
    if metadata_bytes > MAX_ALLOC_METADATA_BYTES {
        return Err(PoolError::TooLarge { what: "metadata", bytes: metadata_bytes, max: MAX_ALLOC_METADATA_BYTES });
    }
    Ok(())
}

impl AllocRequest {
    /// Checks what the request says by itself: some `min`, labels and metadata within their
    /// bounds. Every backend checks this before it looks at any pool.
    pub fn check(&self) -> Result<(), PoolError> {
        if self.min.is_empty() {
            return Err(PoolError::EmptyRequest);
        }
        check_alloc_notes(&self.labels, self.metadata.as_deref())
    }

    /// The most the alloc may take: `max` raised to `min` per resource (so `max cpu=4` with
    /// `min cpu=2,mem=8GiB` takes up to 4 cpu and 8GiB of memory), or `min` without a `max`.
    pub fn upper(&self) -> Resources {
        match &self.max {
            Some(max) => max.max(&self.min),
            None => self.min.clone(),
        }
    }
}

/// A live alloc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alloc {
    pub pool: PoolName,
    pub id: AllocId,
    pub resources: Resources,
    pub owner: String,
    /// Shared: an alloc is copied into its events and records several times a placement, and
    /// its labels change only when its owner annotates it.
    pub labels: Arc<Labels>,
    /// Its owner's free-form metadata (JSON text), if any.
    pub metadata: Option<String>,
    pub created: Millis,
    /// `None` until the first keepalive.
    pub last_keepalive: Option<Millis>,
    pub expires: Millis,
}

/// A change of what an owner attaches to its alloc ([`Pools::annotate`]): what is not given is
/// kept.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AllocNotes {
    /// Labels to set (a value) or remove (`None`).
    pub labels: BTreeMap<String, Option<String>>,
    /// New metadata: `Some(None)` removes it.
    pub metadata: Option<Option<String>>,
}

impl AllocNotes {
    /// `alloc`'s labels and metadata with these changes made.
    pub fn apply(&self, alloc: &Alloc) -> (Labels, Option<String>) {
        let mut labels = Labels::clone(&alloc.labels);
        for (key, value) in &self.labels {
            match value {
                Some(value) => labels.insert(key.clone(), value.clone()),
                None => labels.remove(key),
            };
        }
        let metadata = self.metadata.clone().unwrap_or_else(|| alloc.metadata.clone());
        (labels, metadata)
    }
}

/// Why an alloc ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    /// Its owner freed it.
    Freed,
    /// Its lease had lapsed and its room was needed, or the sweeper collected it.
    Reclaimed,
    /// Its pool was stopped as idle.
    PoolStopped,
    /// Its pool was removed.
    PoolRemoved,
}

impl EndReason {
    /// The stable name, as the API writes it.
    pub fn name(self) -> &'static str {
        match self {
            EndReason::Freed => "freed",
            EndReason::Reclaimed => "reclaimed",
            EndReason::PoolStopped => "pool_stopped",
            EndReason::PoolRemoved => "pool_removed",
        }
    }
}

impl fmt::Display for EndReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EndReason::Freed => "freed",
            EndReason::Reclaimed => "reclaimed after its lease lapsed",
            EndReason::PoolStopped => "its pool was stopped as idle",
            EndReason::PoolRemoved => "its pool was removed",
        })
    }
}

/// An alloc that ended, kept for [`LeaseRules::retention_ms`] [Reflow's zombie allocs].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndedAlloc {
    pub alloc: Alloc,
    pub ended_at: Millis,
    pub reason: EndReason,
}

/// What `inspect` finds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocState {
    Live(Alloc),
    Ended(EndedAlloc),
}

/// A pool's one offer: everything free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    pub pool: PoolName,
    pub available: Resources,
}

/// A pool taken out of use by its operator [Kubernetes' cordon and drain]: it takes no new
/// alloc; once `drain_at` (a drain) has passed, the tasks the scheduler placed there are
/// preempted, and taken back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cordon {
    /// When it was cordoned (kept when it is drained later).
    pub since: Millis,
    /// When its tasks are preempted, if it is drained.
    pub drain_at: Option<Millis>,
}

/// What an operator orders of a pool's use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CordonOrder {
    /// No new allocs; what is there runs on.
    Cordon,
    /// Cordoned, and its tasks preempted once `grace_ms` has passed (an earlier drain keeps its
    /// earlier time).
    Drain { grace_ms: u64 },
    /// Takes new allocs again; a drain not carried out yet is called off.
    Uncordon,
}

/// A pool itself, without its allocs: what a store keeps of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolSettings {
    pub capacity: Resources,
    /// Held by things allot does not manage [YuniKorn's occupied resources]: never offered.
    pub occupied: Resources,
    pub stopped: bool,
    pub labels: Labels,
    pub cordon: Option<Cordon>,
}

/// A record a backend must make durable, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolChange {
    Pool {
        name: PoolName,
        settings: PoolSettings,
    },
    PoolRemoved {
        name: PoolName,
    },
    /// Insert or update a live alloc.
    Alloc(Alloc),
    /// Its owner changed a live alloc's labels or metadata (stored as [`PoolChange::Alloc`]).
    AllocAnnotated(Alloc),
    /// An alloc ended; it is kept as ended until dropped.
    AllocEnded(EndedAlloc),
    /// An ended alloc's retention is over.
    EndedDropped {
        pool: PoolName,
        id: AllocId,
    },
}

/// A live alloc of `pools`, or why there is none: its pool does not exist, it ended, or it never
/// was.
fn live_alloc<'a>(
    pools: &'a mut BTreeMap<PoolName, PoolState>,
    name: &PoolName,
    id: AllocId,
) -> Result<&'a mut Alloc, PoolError> {
    let pool = pools.get_mut(name).ok_or_else(|| PoolError::PoolNotFound(name.clone()))?;
    match (pool.allocs.get_mut(&id), pool.ended.get(&id)) {
        (Some(alloc), _) => Ok(alloc),
        (None, Some(ended)) => Err(PoolError::AllocEnded { pool: name.clone(), id, reason: ended.reason }),
        (None, None) => Err(PoolError::AllocNotFound { pool: name.clone(), id }),
    }
}

/// A pool the scheduler must take tasks from (see [`Pools::strained`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Strain {
    pub pool: PoolName,
    /// Drained, and its drain is due: every task there goes.
    pub drained: bool,
    /// What allocs with a running lease hold beyond what it may hold now.
    pub over: Resources,
}

/// Per-pool counters, for metrics. They count since the daemon started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    pub accepted: u64,
    pub offer_expired: u64,
    pub freed: u64,
    pub reclaimed: u64,
}

/// A pool as seen from outside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolView {
    pub name: PoolName,
    pub capacity: Resources,
    /// What the scheduler's selectors match (`zone=eu`, `gpu=a100`).
    pub labels: Labels,
    /// Held by allocs whose lease is running.
    pub allocated: Resources,
    /// Held by allocs whose lease has lapsed and that are not reclaimed yet.
    pub expired: Resources,
    pub allocs: usize,
    pub expired_allocs: usize,
    pub stopped: bool,
    /// Held by things allot does not manage.
    pub occupied: Resources,
    pub cordon: Option<Cordon>,
    pub stats: PoolStats,
}

/// A request the pools refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("pool `{0}` does not exist")]
    PoolNotFound(PoolName),
    #[error("pool `{0}` is stopped (it was idle); put it again to use it")]
    PoolStopped(PoolName),
    #[error("pool `{0}` is cordoned: it takes no new allocs until it is uncordoned")]
    PoolCordoned(PoolName),
    #[error("pool `{pool}` still has {allocs} allocs; free them or remove it with force")]
    PoolInUse { pool: PoolName, allocs: usize },
    #[error("the offer of pool `{pool}` has expired: {wanted} is not free (free: {free}); try another offer")]
    OfferExpired { pool: PoolName, wanted: Resources, free: Box<Resources> },
    #[error("alloc `{pool}/{id}` does not exist")]
    AllocNotFound { pool: PoolName, id: AllocId },
    #[error("alloc `{pool}/{id}` has ended ({reason}); it can no longer be kept alive or changed")]
    AllocEnded { pool: PoolName, id: AllocId, reason: EndReason },
    #[error("alloc id `{pool}/{id}` is already taken")]
    AllocIdTaken { pool: PoolName, id: AllocId },
    #[error("an alloc request must ask for some resources: `min` is empty")]
    EmptyRequest,
    /// More than the pool's whole capacity: it can never fit (unless the capacity is raised).
    #[error("pool `{pool}` can never fit {wanted}: its whole capacity is {capacity}")]
    ExceedsCapacity { pool: PoolName, wanted: Resources, capacity: Box<Resources> },
    #[error("{what} must be between {min} and {max} ms, got {value}")]
    OutOfRange { what: &'static str, value: u64, min: u64, max: u64 },
    /// The alloc holds a placed task of an application: it ends with the task, not by hand.
    #[error("alloc `{pool}/{id}` is held by the scheduler for `{owner}`; complete or remove the task instead")]
    HeldByScheduler { pool: PoolName, id: AllocId, owner: String },
    #[error("an alloc's {what} may hold at most {max} bytes, got {bytes}")]
    TooLarge { what: &'static str, bytes: usize, max: usize },
}

/// A pool's labels, or a selector over them: a selector matches a pool that has every one of its
/// labels with the same value.
pub type Labels = BTreeMap<String, String>;

/// The label that holds which task types a pool's executor runs (`shell,noop`), when an
/// operator limits them: the scheduler places a task of another type elsewhere. A pool without
/// it runs every type its daemon has. Set through a pool's `plugins`, never as a label.
pub const PLUGINS_LABEL: &str = "allot/plugins";

/// Whether `name` can be a task type in a pool's `plugins`: 1 to 100 of A-Z, a-z, 0-9, `.`,
/// `_`, `-` (so a list of them is one label value, comma-separated).
pub fn is_task_type(name: &str) -> bool {
    !name.is_empty() && name.len() <= 100 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// The task types a pool's labels let it run; `None`: every type.
pub fn plugins_of(labels: &Labels) -> Option<Vec<&str>> {
    let listed = labels.get(PLUGINS_LABEL)?;
    Some(listed.split(',').map(str::trim).filter(|t| !t.is_empty()).collect())
}

/// What a label key starting with this is kept for: allot's own labels ([`PLUGINS_LABEL`], and
/// those the scheduler gives the allocs it holds). Owners do not set them.
pub const RESERVED_LABEL_PREFIX: &str = "allot/";

/// The label of an alloc the scheduler holds: the application it holds it for.
pub const APP_LABEL: &str = "allot/app";

/// The label of an alloc the scheduler holds: the task in it.
pub const TASK_LABEL: &str = "allot/task";

/// The label of an alloc the scheduler holds for a gang: the placeholder in it
/// (`group#member`), until a task of the group takes it over.
pub const PLACEHOLDER_LABEL: &str = "allot/placeholder";

/// The labels of an alloc the scheduler holds for task `task` of application `app`.
pub fn task_labels(app: &str, task: &str) -> Labels {
    Labels::from([(APP_LABEL.to_owned(), app.to_owned()), (TASK_LABEL.to_owned(), task.to_owned())])
}

/// The labels of an alloc the scheduler holds for member `member` of gang group `group`.
pub fn placeholder_labels(app: &str, group: &str, member: u32) -> Labels {
    Labels::from([(APP_LABEL.to_owned(), app.to_owned()), (PLACEHOLDER_LABEL.to_owned(), format!("{group}#{member}"))])
}

/// True if `labels` has every label of `selector`, with the same value.
pub fn selector_matches(selector: &Labels, labels: &Labels) -> bool {
    selector.iter().all(|(key, value)| labels.get(key) == Some(value))
}

/// The expiry of an alloc the scheduler holds for a placed task: it has no lease (allot holds it
/// until the task ends), so it never lapses and the sweeper never reclaims it.
pub const HELD: Millis = Millis::MAX;

#[derive(Debug, Clone, Default)]
struct PoolState {
    capacity: Resources,
    occupied: Resources,
    /// `capacity` less `occupied`: what allocs may hold.
    usable: Resources,
    cordon: Option<Cordon>,
    labels: Labels,
    /// The sum of `allocs`' resources (lapsed or not), kept with every insert and removal.
    held_sum: Resources,
    allocs: HashMap<AllocId, Alloc>,
    ended: HashMap<AllocId, EndedAlloc>,
    /// The ended allocs in the order they ended (for [`MAX_ENDED_PER_POOL`]).
    ended_order: std::collections::VecDeque<AllocId>,
    stopped: bool,
    /// True once the capacity was set below what the allocs held (for `check_invariants`).
    capacity_lowered: bool,
    stats: PoolStats,
}

/// The least key of the lease index for a lease lapsing after `at`: the leases lapsed by `at`
/// are those before it.
fn first_lease_after(at: Millis) -> (Millis, PoolName, AllocId) {
    (at.saturating_add(1), PoolName(Arc::from("")), AllocId(0))
}

/// What ending an alloc of pool `name` changes outside the pool: the lease and retention indexes
/// (`dropped`: the oldest ended alloc, which the pool no longer keeps), and the changes to record.
fn index_end(
    leases: &mut BTreeSet<(Millis, PoolName, AllocId)>,
    endings: &mut BTreeSet<(Millis, PoolName, AllocId)>,
    name: &PoolName,
    ended: EndedAlloc,
    dropped: Option<EndedAlloc>,
    changes: &mut Vec<PoolChange>,
) {
    let id = ended.alloc.id;
    leases.remove(&(ended.alloc.expires, name.clone(), id));
    endings.insert((ended.ended_at, name.clone(), id));
    changes.push(PoolChange::AllocEnded(ended));
    if let Some(dropped) = dropped {
        endings.remove(&(dropped.ended_at, name.clone(), dropped.alloc.id));
        changes.push(PoolChange::EndedDropped { pool: name.clone(), id: dropped.alloc.id });
    }
}

impl PoolState {
    /// Ends live alloc `id` (`None`, and nothing changes, if there is none): counts it and keeps
    /// it as ended. Returns it, and the oldest ended alloc if that one is no longer kept (past
    /// [`MAX_ENDED_PER_POOL`]).
    fn end(&mut self, id: AllocId, reason: EndReason, now: Millis) -> Option<(EndedAlloc, Option<EndedAlloc>)> {
        let alloc = self.remove_alloc(id)?;
        match reason {
            EndReason::Freed => self.stats.freed += 1,
            EndReason::Reclaimed => self.stats.reclaimed += 1,
            EndReason::PoolStopped | EndReason::PoolRemoved => {}
        }
        let ended = EndedAlloc { alloc, ended_at: now, reason };
        self.ended.insert(id, ended.clone());
        self.ended_order.push_back(id);
        let mut dropped = None;
        if self.ended_order.len() > MAX_ENDED_PER_POOL {
            dropped = self.ended_order.pop_front().and_then(|oldest| self.ended.remove(&oldest));
        }
        Some((ended, dropped))
    }

    /// The resources of every alloc, expired or not.
    fn held(&self) -> Resources {
        self.held_sum.clone()
    }

    /// The record of the pool itself (not its allocs) for the store.
    fn change(&self, name: &PoolName) -> PoolChange {
        PoolChange::Pool {
            name: name.clone(),
            settings: PoolSettings {
                capacity: self.capacity.clone(),
                occupied: self.occupied.clone(),
                stopped: self.stopped,
                labels: self.labels.clone(),
                cordon: self.cordon,
            },
        }
    }

    /// Sets the capacity and what is occupied; `capacity_lowered` once what allocs may hold is
    /// below what they hold.
    fn set_room(&mut self, capacity: Resources, occupied: Resources) {
        self.usable = capacity.saturating_sub(&occupied);
        self.capacity = capacity;
        self.occupied = occupied;
        self.capacity_lowered |= !self.usable.fits(&self.held());
    }

    /// The sum of the allocs' resources, counted again (for `check_invariants`).
    fn held_counted(&self) -> Resources {
        self.allocs.values().fold(Resources::new(), |sum, a| sum.checked_add(&a.resources).unwrap_or(sum))
    }

    fn insert_alloc(&mut self, alloc: Alloc) {
        self.held_sum = self.held_sum.checked_add(&alloc.resources).unwrap_or_else(|| self.held_sum.clone());
        self.allocs.insert(alloc.id, alloc);
    }

    fn remove_alloc(&mut self, id: AllocId) -> Option<Alloc> {
        let alloc = self.allocs.remove(&id)?;
        self.held_sum = self.held_sum.saturating_sub(&alloc.resources);
        Some(alloc)
    }

    /// Neither stopped nor cordoned.
    fn takes_allocs(&self) -> bool {
        !self.stopped && self.cordon.is_none()
    }

    /// When its drain is due, if it is drained.
    fn drain_at(&self) -> Option<Millis> {
        self.cordon.and_then(|c| c.drain_at)
    }

    /// What is free for new allocs: the room less what allocs with a running lease hold
    /// (`lapsed`: what those whose lease lapsed hold).
    fn free_of(&self, lapsed: Option<&Resources>) -> Resources {
        let live = match lapsed {
            Some(lapsed) => self.held_sum.saturating_sub(lapsed),
            None => self.held_sum.clone(),
        };
        self.usable.saturating_sub(&live)
    }

    /// Split of the held resources into (running leases, lapsed leases).
    fn held_by_state(&self, now: Millis) -> (Resources, Resources) {
        let (mut live, mut lapsed) = (Resources::new(), Resources::new());
        for alloc in self.allocs.values() {
            let sum = if alloc.expires > now { &mut live } else { &mut lapsed };
            *sum = sum.checked_add(&alloc.resources).unwrap_or_else(|| sum.clone());
        }
        (live, lapsed)
    }
}

/// Every pool, and the decisions over them.
#[derive(Debug)]
pub struct Pools {
    rules: LeaseRules,
    pools: BTreeMap<PoolName, PoolState>,
    /// Every live alloc by expiry, for the sweeper.
    leases: BTreeSet<(Millis, PoolName, AllocId)>,
    /// Ended allocs by end time, for retention.
    endings: BTreeSet<(Millis, PoolName, AllocId)>,
    /// What changed since the scheduler last asked ([`Pools::take_changed`]).
    changed: PoolsChanged,
    /// Every pool's drain, by when it is due: a cycle finds the drains due and the next one
    /// without a walk of every pool.
    drains: BTreeSet<(Millis, PoolName)>,
    /// Every pool whose allocs may hold more than it may hold now (its capacity lowered, or more
    /// occupied), and maybe some that no longer do: only these are looked at for it.
    over: BTreeSet<PoolName>,
}

/// The pools changed since the last [`Pools::take_changed`]: what a scheduling cycle reads again
/// of the room it kept from the cycle before (`Pools::spots` of the named pools only).
///
/// Invariant: every operation that may change what `Pools::spots` gives for a pool (its allocs,
/// their leases, its capacity or occupied room) names the pool; one that may change which pools
/// it gives or their labels (a pool put, removed, cordoned, labelled or stopped) sets `all`.
/// A lease lapsing as time passes changes nothing here: the reader asks
/// [`Pools::lapsing_between`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolsChanged {
    /// The `Pools` these are changes of (each has its own number): changes of another say
    /// nothing of this one.
    pub of: u64,
    /// Read every pool again.
    pub all: bool,
    /// The pools to read again (a pool may be named more than once); empty when `all`.
    pub names: Vec<PoolName>,
}

/// The most pools [`PoolsChanged`] names before it says `all` instead (when nobody asks).
const MAX_NAMED_CHANGES: usize = 4096;

impl PoolsChanged {
    fn new() -> PoolsChanged {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        PoolsChanged { of: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed), all: true, names: Vec::new() }
    }

    fn pool(&mut self, name: &PoolName) {
        if self.all {
            return;
        }
        if self.names.len() >= MAX_NAMED_CHANGES {
            self.every();
        } else {
            self.names.push(name.clone());
        }
    }

    fn every(&mut self) {
        self.all = true;
        self.names = Vec::new();
    }
}

impl Default for Pools {
    fn default() -> Pools {
        Pools {
            rules: LeaseRules::default(),
            pools: BTreeMap::new(),
            leases: BTreeSet::new(),
            endings: BTreeSet::new(),
            changed: PoolsChanged::new(),
            drains: BTreeSet::new(),
            over: BTreeSet::new(),
        }
    }
}

impl Pools {
    pub fn new(rules: LeaseRules) -> Pools {
        Pools { rules, ..Pools::default() }
    }

    /// What changed since the last call (the first time: everything), and forgets it. For the
    /// one scheduler that places on these pools: it keeps the room of its last cycle and reads
    /// again only these.
    pub fn take_changed(&mut self) -> PoolsChanged {
        let of = self.changed.of;
        std::mem::replace(&mut self.changed, PoolsChanged { of, all: false, names: Vec::new() })
    }

    /// The pools with a live alloc whose lease lapsed after `after` and by `now`.
    pub fn lapsing_between(&self, after: Millis, now: Millis) -> impl Iterator<Item = &PoolName> + '_ {
        let (from, to) = (first_lease_after(after), first_lease_after(now));
        let range = if from < to { Some(self.leases.range(from..to)) } else { None };
        range.into_iter().flatten().map(|(_, name, _)| name)
    }

    pub fn rules(&self) -> LeaseRules {
        self.rules
    }

    /// Changes the lease rules; running leases keep their expiry.
    pub fn set_rules(&mut self, rules: LeaseRules) {
        self.rules = rules;
    }

    /// Creates a pool or changes its capacity; a stopped pool starts again. Lowering the capacity
    /// ends no alloc; it only stops new ones. Returns true if it was created.
    pub fn put_pool(&mut self, name: &PoolName, capacity: Resources) -> (bool, Vec<PoolChange>) {
        // It may start again, or be new.
        self.changed.every();
        let created = !self.pools.contains_key(name);
        let pool = self.pools.entry(name.clone()).or_default();
        let occupied = pool.occupied.clone();
        pool.set_room(capacity, occupied);
        pool.stopped = false;
        let change = pool.change(name);
        self.note_room(name);
        (created, vec![change])
    }

    /// Sets what things allot does not manage hold in a pool: it is never offered, and the
    /// scheduler preempts what no longer fits (as for a lowered capacity).
    pub fn occupy(
        &mut self,
        name: &PoolName,
        occupied: Resources,
        now: Millis,
    ) -> Result<(PoolView, Vec<PoolChange>), PoolError> {
        let pool = self.pools.get_mut(name).ok_or_else(|| PoolError::PoolNotFound(name.clone()))?;
        self.changed.pool(name);
        let capacity = pool.capacity.clone();
        pool.set_room(capacity, occupied);
        let change = pool.change(name);
        let view = view_of(name, pool, now);
        self.note_room(name);
        Ok((view, vec![change]))
    }

    /// Cordons, drains or uncordons a pool.
    pub fn cordon(
        &mut self,
        name: &PoolName,
        order: CordonOrder,
        now: Millis,
    ) -> Result<(PoolView, Vec<PoolChange>), PoolError> {
        let pool = self.pools.get_mut(name).ok_or_else(|| PoolError::PoolNotFound(name.clone()))?;
        self.changed.every();
        let since = pool.cordon.map_or(now, |c| c.since);
        let drain_at = pool.drain_at();
        if let Some(at) = drain_at {
            self.drains.remove(&(at, name.clone()));
        }
        pool.cordon = match order {
            CordonOrder::Cordon => Some(Cordon { since, drain_at }),
            CordonOrder::Drain { grace_ms } => {
                let at = now.saturating_add(grace_ms);
                Some(Cordon { since, drain_at: Some(drain_at.map_or(at, |earlier| earlier.min(at))) })
            }
            CordonOrder::Uncordon => None,
        };
        if let Some(at) = pool.drain_at() {
            self.drains.insert((at, name.clone()));
        }
        let change = pool.change(name);
        Ok((view_of(name, pool, now), vec![change]))
    }

    /// Replaces a pool's labels.
    pub fn label_pool(
        &mut self,
        name: &PoolName,
        labels: Labels,
        now: Millis,
    ) -> Result<(PoolView, Vec<PoolChange>), PoolError> {
        let pool = self.pools.get_mut(name).ok_or_else(|| PoolError::PoolNotFound(name.clone()))?;
        self.changed.every();
        pool.labels = labels;
        let change = pool.change(name);
        Ok((view_of(name, pool, now), vec![change]))
    }

    /// Removes a pool; with allocs only when `force` (they end with it, at `now`: each is an
    /// `AllocEnded` change before the pool's removal). Returns how many ended.
    pub fn remove_pool(
        &mut self,
        name: &PoolName,
        force: bool,
        now: Millis,
    ) -> Result<(usize, Vec<PoolChange>), PoolError> {
        let btree_map::Entry::Occupied(entry) = self.pools.entry(name.clone()) else {
            return Err(PoolError::PoolNotFound(name.clone()));
        };
        if !entry.get().allocs.is_empty() && !force {
            return Err(PoolError::PoolInUse { pool: name.clone(), allocs: entry.get().allocs.len() });
        }
        let pool = entry.remove();
        self.changed.every();
        self.over.remove(name);
        if let Some(at) = pool.drain_at() {
            self.drains.remove(&(at, name.clone()));
        }
        for alloc in pool.allocs.values() {
            self.leases.remove(&(alloc.expires, name.clone(), alloc.id));
        }
        for ended in pool.ended.values() {
            self.endings.remove(&(ended.ended_at, name.clone(), ended.alloc.id));
        }
        let mut changes: Vec<PoolChange> = pool
            .allocs
            .values()
            .map(|alloc| {
                PoolChange::AllocEnded(EndedAlloc {
                    alloc: alloc.clone(),
                    ended_at: now,
                    reason: EndReason::PoolRemoved,
                })
            })
            .collect();
        changes.push(PoolChange::PoolRemoved { name: name.clone() });
        Ok((pool.allocs.len(), changes))
    }

    /// The pool's offer: everything not held by an alloc whose lease is running (lapsed allocs
    /// are offered: an accept reclaims them). `None` when nothing is free or the pool is stopped.
    pub fn offer(&self, name: &PoolName, now: Millis) -> Result<Option<Offer>, PoolError> {
        self.offer_sparing(name, now, &Resources::new())
    }

    /// [`Pools::offer`], `spared` left out of it: the room the scheduler holds on the pool for a
    /// preemptor (`Scheduler::room_held`), which no alloc of an outside worker may take.
    pub fn offer_sparing(&self, name: &PoolName, now: Millis, spared: &Resources) -> Result<Option<Offer>, PoolError> {
        let pool = self.pools.get(name).ok_or_else(|| PoolError::PoolNotFound(name.clone()))?;
        if pool.stopped || pool.cordon.is_some() {
            return Ok(None);
        }
        let (live, _) = pool.held_by_state(now);
        let available = pool.usable.saturating_sub(&live).saturating_sub(spared);
        Ok((!available.is_empty()).then(|| Offer { pool: name.clone(), available }))
    }

    /// Accepts the pool's offer with `request` [Reflow `ResourcePool.New`]. The alloc gets
    /// `max` (or `min`) capped by what is free, and never less than `min`. When `min` does not fit,
    /// lapsed allocs are reclaimed, most-expired first, only as many as needed; if it still does
    /// not fit, nothing is reclaimed and the answer is [`PoolError::OfferExpired`].
    pub fn accept(
        &mut self,
        name: &PoolName,
        request: AllocRequest,
        id: AllocId,
        now: Millis,
    ) -> Result<(Alloc, Vec<PoolChange>), PoolError> {
        self.accept_sparing(name, request, id, now, &Resources::new())
    }

    /// [`Pools::accept`], leaving `spared` free (see [`Pools::offer_sparing`]).
    pub fn accept_sparing(
        &mut self,
        name: &PoolName,
        request: AllocRequest,
        id: AllocId,
        now: Millis,
        spared: &Resources,
    ) -> Result<(Alloc, Vec<PoolChange>), PoolError> {
        let expires = now + self.rules.initial_ms;
        self.make_alloc(name, request, id, now, expires, spared)
    }

    /// Accepts like [`Pools::accept`] for a task the scheduler places: the alloc has no lease
    /// ([`HELD`]); it ends by [`Pools::end_held`] when the task ends.
    pub fn accept_held(
        &mut self,
        name: &PoolName,
        request: AllocRequest,
        id: AllocId,
        now: Millis,
    ) -> Result<(Alloc, Vec<PoolChange>), PoolError> {
        self.make_alloc(name, request, id, now, HELD, &Resources::new())
    }

    fn make_alloc(
        &mut self,
        name: &PoolName,
        request: AllocRequest,
        id: AllocId,
        now: Millis,
        expires: Millis,
        spared: &Resources,
    ) -> Result<(Alloc, Vec<PoolChange>), PoolError> {
        request.check()?;
        self.changed.pool(name);
        let Pools { pools, leases, endings, .. } = self;
        let pool = pools.get_mut(name).ok_or_else(|| PoolError::PoolNotFound(name.clone()))?;
        if pool.stopped {
            return Err(PoolError::PoolStopped(name.clone()));
        }
        if pool.cordon.is_some() {
            return Err(PoolError::PoolCordoned(name.clone()));
        }
        if pool.allocs.contains_key(&id) || pool.ended.contains_key(&id) {
            return Err(PoolError::AllocIdTaken { pool: name.clone(), id });
        }
        if !pool.capacity.fits(&request.min) {
            return Err(PoolError::ExceedsCapacity {
                pool: name.clone(),
                wanted: request.min,
                capacity: Box::new(pool.capacity.clone()),
            });
        }
        let mut held = pool.held();
        let mut victims = Vec::new();
        let mut free = pool.usable.saturating_sub(&held).saturating_sub(spared);
        // The lapsed allocs are looked at only when the live ones leave no room (a walk over the
        // pool's allocs: not on every accept of a large pool).
        let mut lapsed: Vec<&Alloc> = Vec::new();
        if !free.fits(&request.min) {
            lapsed = pool.allocs.values().filter(|a| a.expires <= now).collect();
            // Most-expired last, so `pop` takes it first.
            lapsed.sort_by(|a, b| b.expires.cmp(&a.expires).then(b.id.cmp(&a.id)));
        }
        while !free.fits(&request.min) {
            let Some(victim) = lapsed.pop() else { break };
            held = held.saturating_sub(&victim.resources);
            free = pool.usable.saturating_sub(&held).saturating_sub(spared);
            victims.push(victim.id);
        }
        if !free.fits(&request.min) {
            pool.stats.offer_expired += 1;
            return Err(PoolError::OfferExpired { pool: name.clone(), wanted: request.min, free: Box::new(free) });
        }
        let resources = request.upper().min(&free);
        let alloc = Alloc {
            pool: name.clone(),
            id,
            resources,
            owner: request.owner,
            labels: Arc::new(request.labels),
            metadata: request.metadata,
            created: now,
            last_keepalive: None,
            expires,
        };
        let mut changes = Vec::with_capacity(victims.len() + 1);
        for victim in victims {
            if let Some((ended, dropped)) = pool.end(victim, EndReason::Reclaimed, now) {
                index_end(leases, endings, name, ended, dropped, &mut changes);
            }
        }
        pool.stats.accepted += 1;
        pool.insert_alloc(alloc.clone());
        leases.insert((alloc.expires, name.clone(), id));
        changes.push(PoolChange::Alloc(alloc.clone()));
        Ok((alloc, changes))
    }

    /// Renews an alloc's lease for `interval_ms`, capped at [`LeaseRules::max_ms`]; returns the
    /// interval granted [Reflow `Alloc.Keepalive`]. An alloc whose lease has lapsed but that is
    /// not reclaimed yet is revived. An ended alloc is [`PoolError::AllocEnded`]: its owner
    /// should stop trying.
    pub fn keepalive(
        &mut self,
        name: &PoolName,
        id: AllocId,
        interval_ms: u64,
        now: Millis,
    ) -> Result<(u64, Alloc, Vec<PoolChange>), PoolError> {
        let granted = self.rules.grant(interval_ms)?;
        let alloc = live_alloc(&mut self.pools, name, id)?;
        if alloc.expires == HELD {
            // The scheduler holds it until its task ends: a keepalive changes nothing.
            return Ok((granted, alloc.clone(), Vec::new()));
        }
        self.changed.pool(name);
        self.leases.remove(&(alloc.expires, name.clone(), id));
        alloc.expires = now + granted;
        alloc.last_keepalive = Some(now);
        self.leases.insert((alloc.expires, name.clone(), id));
        let alloc = alloc.clone();
        Ok((granted, alloc.clone(), vec![PoolChange::Alloc(alloc)]))
    }

    /// Changes the labels and metadata its owner attaches to a live alloc (what ran in it, its
    /// results) [Reflow: an alloc's execs and their results]. The lease is not renewed. An alloc
    /// the scheduler holds is its task's: [`PoolError::HeldByScheduler`].
    pub fn annotate(
        &mut self,
        name: &PoolName,
        id: AllocId,
        notes: &AllocNotes,
    ) -> Result<(Alloc, Vec<PoolChange>), PoolError> {
        let alloc = live_alloc(&mut self.pools, name, id)?;
        if alloc.expires == HELD {
            return Err(PoolError::HeldByScheduler { pool: name.clone(), id, owner: alloc.owner.clone() });
        }
        let (labels, metadata) = notes.apply(alloc);
        check_alloc_notes(&labels, metadata.as_deref())?;
        alloc.labels = Arc::new(labels);
        alloc.metadata = metadata;
        let alloc = alloc.clone();
        Ok((alloc.clone(), vec![PoolChange::AllocAnnotated(alloc)]))
    }

    /// Gives an alloc the scheduler holds new labels ([`task_labels`] when a task takes a
    /// placeholder over). Nothing for an alloc that is not held.
    pub fn relabel_held(&mut self, name: &PoolName, id: AllocId, labels: Labels) -> Vec<PoolChange> {
        match self.pools.get_mut(name).and_then(|pool| pool.allocs.get_mut(&id)) {
            Some(alloc) if alloc.expires == HELD && *alloc.labels != labels => {
                alloc.labels = Arc::new(labels);
                vec![PoolChange::AllocAnnotated(alloc.clone())]
            }
            _ => Vec::new(),
        }
    }

    /// Frees an alloc. Freeing an alloc that already ended answers its record again.
    pub fn free(
        &mut self,
        name: &PoolName,
        id: AllocId,
        now: Millis,
    ) -> Result<(EndedAlloc, Vec<PoolChange>), PoolError> {
        let pool = self.pools.get(name).ok_or_else(|| PoolError::PoolNotFound(name.clone()))?;
        if let Some(ended) = pool.ended.get(&id) {
            return Ok((ended.clone(), Vec::new()));
        }
        match pool.allocs.get(&id) {
            None => return Err(PoolError::AllocNotFound { pool: name.clone(), id }),
            Some(alloc) if alloc.expires == HELD => {
                return Err(PoolError::HeldByScheduler { pool: name.clone(), id, owner: alloc.owner.clone() })
            }
            Some(_) => {}
        }
        let mut changes = Vec::new();
        if !self.end_alloc(name, id, EndReason::Freed, now, &mut changes) {
            return Err(PoolError::AllocNotFound { pool: name.clone(), id });
        }
        let ended = self.pools.get(name).and_then(|pool| pool.ended.get(&id)).cloned();
        let ended = ended.ok_or_else(|| PoolError::AllocNotFound { pool: name.clone(), id })?;
        Ok((ended, changes))
    }

    /// Frees an alloc of the scheduler's (its task ended). Nothing happens if it is gone already
    /// (its pool was removed with force).
    pub fn end_held(&mut self, name: &PoolName, id: AllocId, now: Millis) -> Vec<PoolChange> {
        let mut changes = Vec::new();
        self.end_alloc(name, id, EndReason::Freed, now, &mut changes);
        changes
    }

    /// Every pool that takes new allocs, with what is free in it (its capacity less what allocs
    /// with a running lease hold: an accept reclaims lapsed ones), its capacity and its labels.
    ///
    /// O(pools + lapsed allocs): what allocs hold is kept as a sum, and the lapsed ones are read
    /// from the lease index, so a cycle of the scheduler does not walk every alloc.
    pub fn spots(&self, now: Millis) -> impl Iterator<Item = (&PoolName, Resources, &Resources, &Labels)> + '_ {
        let lapsed = self.lapsed_by_pool(now);
        self.pools
            .iter()
            .filter(|(_, pool)| pool.takes_allocs())
            .map(move |(name, pool)| (name, pool.free_of(lapsed.get(name)), &pool.capacity, &pool.labels))
    }

    /// What [`Pools::spots`] gives as free in pool `name`, `None` if it gives nothing of it;
    /// `lapsed` is [`Pools::lapsed_by_pool`] at the same time.
    pub fn spot_free(&self, name: &PoolName, lapsed: &HashMap<&PoolName, Resources>) -> Option<Resources> {
        let pool = self.pools.get(name).filter(|pool| pool.takes_allocs())?;
        Some(pool.free_of(lapsed.get(name)))
    }

    /// What the allocs whose lease has lapsed by `now` hold, by pool (those with none left out).
    /// O(lapsed allocs), read from the lease index.
    pub fn lapsed_by_pool(&self, now: Millis) -> HashMap<&PoolName, Resources> {
        let mut lapsed: HashMap<&PoolName, Resources> = HashMap::new();
        for (_, name, id) in self.leases.range(..first_lease_after(now)) {
            if let Some(alloc) = self.pools.get(name).and_then(|pool| pool.allocs.get(id)) {
                let sum = lapsed.entry(name).or_default();
                *sum = sum.checked_add(&alloc.resources).unwrap_or_else(|| sum.clone());
            }
        }
        lapsed
    }

    /// The pools the scheduler must take tasks from: each drained one whose drain is due (every
    /// task), and each whose allocs with a running lease hold more than it may hold now (its
    /// capacity lowered, or more of it occupied), with how much more. O(pools); lapsed allocs
    /// are counted only in a pool found over.
    pub fn strained(&self, now: Millis) -> Vec<Strain> {
        let mut strained = Vec::new();
        // Only the pools whose drain is due or that may hold too much, in the order of names.
        let due = self.drains.iter().take_while(|(at, _)| *at <= now).map(|(_, name)| name);
        let looked_at: BTreeSet<&PoolName> = due.chain(&self.over).collect();
        for (name, pool) in looked_at.into_iter().filter_map(|name| Some((name, self.pools.get(name)?))) {
            let drained = pool.drain_at().is_some_and(|at| at <= now);
            // Most pools hold what they may: a comparison, no walk of the allocs.
            let over = match pool.usable.fits(&pool.held_sum) {
                true => Resources::new(),
                false => pool.held_by_state(now).0.saturating_sub(&pool.usable),
            };
            if drained || !over.is_empty() {
                strained.push(Strain { pool: name.clone(), drained, over });
            }
        }
        strained
    }

    /// The cordoned pools (not stopped) with their labels.
    pub fn cordoned(&self) -> impl Iterator<Item = (&PoolName, &Labels)> + '_ {
        self.pools
            .iter()
            .filter(|(_, pool)| !pool.stopped && pool.cordon.is_some())
            .map(|(name, pool)| (name, &pool.labels))
    }

    /// The earliest drain not due yet.
    pub fn next_drain(&self, now: Millis) -> Option<Millis> {
        let after = now.checked_add(1)?;
        self.drains.range((after, PoolName(Arc::from("")))..).next().map(|(at, _)| *at)
    }

    /// Keeps `over` in step with what pool `name`'s allocs hold and what it may hold.
    fn note_room(&mut self, name: &PoolName) {
        match self.pools.get(name) {
            Some(pool) if !pool.usable.fits(&pool.held_sum) => {
                self.over.insert(name.clone());
            }
            _ => {
                self.over.remove(name);
            }
        }
    }

    /// Whether some pool that is not stopped has the labels of `selector`. A cordoned pool
    /// counts: a cordon, like what is occupied, is for a time.
    pub fn any_matches(&self, selector: &Labels) -> bool {
        self.pools.values().any(|pool| !pool.stopped && selector_matches(selector, &pool.labels))
    }

    /// True if some pool that is not stopped matches `selector` and could hold `wanted` when
    /// empty (its whole capacity: cordons and occupied room are for a time).
    pub fn could_ever_fit(&self, wanted: &Resources, selector: &Labels) -> bool {
        self.pools
            .values()
            .any(|pool| !pool.stopped && selector_matches(selector, &pool.labels) && pool.capacity.fits(wanted))
    }

    pub fn inspect(&self, name: &PoolName, id: AllocId) -> Result<AllocState, PoolError> {
        let pool = self.pools.get(name).ok_or_else(|| PoolError::PoolNotFound(name.clone()))?;
        if let Some(alloc) = pool.allocs.get(&id) {
            return Ok(AllocState::Live(alloc.clone()));
        }
        match pool.ended.get(&id) {
            Some(ended) => Ok(AllocState::Ended(ended.clone())),
            None => Err(PoolError::AllocNotFound { pool: name.clone(), id }),
        }
    }

    /// Stops the pool if every alloc's lease has lapsed at least `idle_ms` ago (a pool with no
    /// allocs is idle): its allocs end and it makes no more offers until it is put again.
    /// Returns `(true, 0)` when it stopped, else `(false, ms)` with the time until it would be
    /// idle if no alloc were kept alive meanwhile [Reflow `StopIfIdleFor`, which returned the time
    /// until the last lease ends instead].
    pub fn stop_if_idle_for(
        &mut self,
        name: &PoolName,
        idle_ms: u64,
        now: Millis,
    ) -> Result<(bool, u64, Vec<PoolChange>), PoolError> {
        check_idle(idle_ms)?;
        let Pools { pools, leases, endings, .. } = self;
        let pool = pools.get_mut(name).ok_or_else(|| PoolError::PoolNotFound(name.clone()))?;
        let until_idle =
            pool.allocs.values().map(|a| a.expires.saturating_add(idle_ms).saturating_sub(now)).max().unwrap_or(0);
        if until_idle > 0 {
            return Ok((false, until_idle, Vec::new()));
        }
        let ids: Vec<AllocId> = pool.allocs.keys().copied().collect();
        let mut changes = Vec::new();
        for id in ids {
            if let Some((ended, dropped)) = pool.end(id, EndReason::PoolStopped, now) {
                index_end(leases, endings, name, ended, dropped, &mut changes);
            }
        }
        pool.stopped = true;
        changes.push(pool.change(name));
        self.changed.every();
        self.note_room(name);
        Ok((true, 0, changes))
    }

    /// Reclaims allocs whose lease lapsed at least `reclaim_after_ms` ago and drops ended allocs
    /// past their retention.
    pub fn sweep(&mut self, now: Millis) -> Vec<PoolChange> {
        let mut changes = Vec::new();
        let cutoff = now.saturating_sub(self.rules.reclaim_after_ms);
        while let Some((expires, name, id)) = self.leases.first().cloned() {
            if expires > cutoff {
                break;
            }
            // Out of the index first: a lease entry without its alloc must not stop the sweep.
            self.leases.pop_first();
            self.end_alloc(&name, id, EndReason::Reclaimed, now, &mut changes);
        }
        let cutoff = now.saturating_sub(self.rules.retention_ms);
        while let Some((ended_at, name, id)) = self.endings.first().cloned() {
            if ended_at > cutoff {
                break;
            }
            self.endings.pop_first();
            if let Some(pool) = self.pools.get_mut(&name) {
                pool.ended.remove(&id);
                // Ended in time order, so it is the oldest one left.
                if pool.ended_order.front() == Some(&id) {
                    pool.ended_order.pop_front();
                } else {
                    pool.ended_order.retain(|other| *other != id);
                }
            }
            changes.push(PoolChange::EndedDropped { pool: name, id });
        }
        changes
    }

    /// The earliest time the sweeper has work, if any.
    pub fn next_deadline(&self) -> Option<Millis> {
        let reclaim = self.leases.first().map(|(expires, ..)| expires + self.rules.reclaim_after_ms);
        let drop = self.endings.first().map(|(ended_at, ..)| ended_at + self.rules.retention_ms);
        reclaim.into_iter().chain(drop).min()
    }

    pub fn pools(&self, now: Millis) -> Vec<PoolView> {
        self.pools_after(None, usize::MAX, now)
    }

    /// At most `limit` pools whose names come after `after`, ordered by name.
    pub fn pools_after(&self, after: Option<&PoolName>, limit: usize, now: Millis) -> Vec<PoolView> {
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        self.pools.range((from, Bound::Unbounded)).take(limit).map(|(name, pool)| view_of(name, pool, now)).collect()
    }

    pub fn pool(&self, name: &PoolName, now: Millis) -> Result<PoolView, PoolError> {
        let pool = self.pools.get(name).ok_or_else(|| PoolError::PoolNotFound(name.clone()))?;
        Ok(view_of(name, pool, now))
    }

    /// The live allocs of a pool, ordered by id.
    pub fn allocs(&self, name: &PoolName) -> Result<Vec<Alloc>, PoolError> {
        self.allocs_after(name, None, usize::MAX)
    }

    /// At most `limit` live allocs of a pool whose ids come after `after`, ordered by id.
    pub fn allocs_after(&self, name: &PoolName, after: Option<AllocId>, limit: usize) -> Result<Vec<Alloc>, PoolError> {
        let pool = self.pools.get(name).ok_or_else(|| PoolError::PoolNotFound(name.clone()))?;
        Ok(first_after(pool.allocs.values(), |a| &a.id, after.as_ref(), limit).into_iter().cloned().collect())
    }

    /// Rebuilds the pools from durable records. Leases keep the expiry they had (the store's
    /// clock continues across restarts), so an alloc comes back with the lease time it had left,
    /// not already expired [unlike Reflow's restored allocs].
    pub fn restore(
        rules: LeaseRules,
        pools: Vec<(PoolName, PoolSettings)>,
        allocs: Vec<Alloc>,
        ended: Vec<EndedAlloc>,
    ) -> Result<Pools, PoolError> {
        let mut restored = Pools::new(rules);
        for (name, settings) in pools {
            let PoolSettings { capacity, occupied, stopped, labels, cordon } = settings;
            let usable = capacity.saturating_sub(&occupied);
            let state = PoolState { capacity, occupied, usable, stopped, labels, cordon, ..PoolState::default() };
            restored.pools.insert(name, state);
        }
        for alloc in allocs {
            let pool =
                restored.pools.get_mut(&alloc.pool).ok_or_else(|| PoolError::PoolNotFound(alloc.pool.clone()))?;
            restored.leases.insert((alloc.expires, alloc.pool.clone(), alloc.id));
            pool.insert_alloc(alloc);
        }
        for (name, pool) in restored.pools.iter_mut() {
            pool.capacity_lowered = !pool.usable.fits(&pool.held_sum);
            if pool.capacity_lowered {
                restored.over.insert(name.clone());
            }
            if let Some(at) = pool.drain_at() {
                restored.drains.insert((at, name.clone()));
            }
        }
        // Oldest first: the most ended allocs a pool keeps drops the oldest.
        let mut ended = ended;
        ended.sort_by_key(|record| record.ended_at);
        for record in ended {
            let pool = restored
                .pools
                .get_mut(&record.alloc.pool)
                .ok_or_else(|| PoolError::PoolNotFound(record.alloc.pool.clone()))?;
            restored.endings.insert((record.ended_at, record.alloc.pool.clone(), record.alloc.id));
            pool.ended_order.push_back(record.alloc.id);
            pool.ended.insert(record.alloc.id, record);
        }
        Ok(restored)
    }

    /// Ends live alloc `id` of pool `name`; false, and nothing changes, if there is none.
    fn end_alloc(
        &mut self,
        name: &PoolName,
        id: AllocId,
        reason: EndReason,
        now: Millis,
        changes: &mut Vec<PoolChange>,
    ) -> bool {
        let Some((ended, dropped)) = self.pools.get_mut(name).and_then(|pool| pool.end(id, reason, now)) else {
            return false;
        };
        self.changed.pool(name);
        index_end(&mut self.leases, &mut self.endings, name, ended, dropped, changes);
        if self.over.contains(name) {
            self.note_room(name);
        }
        true
    }

    /// Checks the invariants in the module docs; for tests.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut leases = 0;
        for (name, pool) in &self.pools {
            // A capacity lowered below what is held is allowed (nothing is revoked); otherwise
            // the allocs fit in it.
            let counted = pool.held_counted();
            if counted != pool.held_sum {
                return Err(format!("{name}: the held sum is {} but the allocs hold {counted}", pool.held_sum));
            }
            if !pool.capacity_lowered && !pool.usable.fits(&pool.held()) {
                return Err(format!("{name}: allocs hold {} of a usable capacity of {}", pool.held(), pool.usable));
            }
            if pool.usable != pool.capacity.saturating_sub(&pool.occupied) {
                return Err(format!("{name}: usable {} is not capacity less occupied", pool.usable));
            }
            if !pool.usable.fits(&pool.held_sum) && !self.over.contains(name) {
                return Err(format!("{name}: holds more than it may, and is not in the index of such pools"));
            }
            if let Some(at) = pool.drain_at() {
                if !self.drains.contains(&(at, name.clone())) {
                    return Err(format!("{name}: its drain at {at} is not in the index of drains"));
                }
            }
            for (id, alloc) in &pool.allocs {
                if !self.leases.contains(&(alloc.expires, name.clone(), *id)) {
                    return Err(format!("{name}/{id}: no lease entry"));
                }
                if pool.ended.contains_key(id) {
                    return Err(format!("{name}/{id}: both live and ended"));
                }
                leases += 1;
            }
        }
        if leases != self.leases.len() {
            return Err(format!("{} lease entries for {leases} allocs", self.leases.len()));
        }
        let drains = self.pools.values().filter(|pool| pool.drain_at().is_some()).count();
        if drains != self.drains.len() {
            return Err(format!("{} drains indexed for {drains} pools draining", self.drains.len()));
        }
        Ok(())
    }
}

fn view_of(name: &PoolName, pool: &PoolState, now: Millis) -> PoolView {
    let (allocated, expired) = pool.held_by_state(now);
    PoolView {
        name: name.clone(),
        capacity: pool.capacity.clone(),
        labels: pool.labels.clone(),
        allocated,
        expired,
        allocs: pool.allocs.len(),
        expired_allocs: pool.allocs.values().filter(|a| a.expires <= now).count(),
        stopped: pool.stopped,
        occupied: pool.occupied.clone(),
        cordon: pool.cordon,
        stats: pool.stats,
    }
}
