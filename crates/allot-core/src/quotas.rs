//! The ledger: every namespace, grant, session and waiter, and the decisions over them.
//!
//! At length, as one thing: a grant, its namespace's counters, its lease or session and the
//! waiters it lets in change together in every operation; apart, they would be kept in step
//! across files.
//!
//! Each operation takes the daemon clock's `now` and returns the [`Effects`] a backend must make
//! durable (`changes`) and deliver (`woken`, `cancelled`). The ledger itself never blocks, never
//! does I/O and never reads a clock.
//!
//! Invariants, checked by `Ledger::check_invariants` in tests:
//! - for every namespace, `granted` is the sum of its grants' units, and every scope counter is the
//!   sum of the units of the grants of that scope;
//! - a new grant never makes `granted` exceed the quota nor a scope's units exceed the cap the
//!   request named;
//! - `leases` holds exactly one entry per grant with a TTL lease and one per session;
//! - waiters are in arrival order; `quota_blocked` is true iff some waiter is blocked by the quota
//!   (not only by a cap), and then no new request is granted ahead of it.

use std::collections::{btree_map, BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::ops::Bound;
use std::sync::Arc;

use crate::first_after;
use crate::names::{NamespaceName, Scope, SessionId, Token};

/// A time on the daemon clock, in milliseconds. The daemon clock is monotonic and survives
/// restarts (the backend persists it), so a lease keeps the TTL it had left across a restart.
pub type Millis = u64;

/// The largest quota, cap or number of units: 2^53 - 1, the largest integer every JSON client
/// reads exactly.
pub const MAX_UNITS: u64 = (1 << 53) - 1;
/// Fencing numbers are reserved durably in blocks of this size, so a grant does not have to
/// rewrite its namespace's record; after a crash, numbering continues above the last block (a
/// clean shutdown writes the exact next number: [`Ledger::fencing_checkpoint`]).
pub const FENCING_BLOCK: u64 = 1024;
/// The longest TTL of a grant or session: 30 days.
pub const MAX_TTL_MS: u64 = 30 * 24 * 3600 * 1000;

/// Optional caps per scope [Flyte `ResourceConstraintsSpec`]. `None` means no cap at that level;
/// `Some(0)` means the scope may hold nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Constraints {
    pub project: Option<u64>,
    pub namespace: Option<u64>,
}

/// Which cap refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapLevel {
    Project,
    Namespace,
}

/// What a new grant's lease should be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseRequest {
    /// Held until released.
    None,
    /// Expires `ttl_ms` after the grant or its last keepalive.
    Ttl { ttl_ms: u64 },
    /// Lives as long as the session.
    Session(SessionId),
}

/// A grant's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    None,
    Ttl { ttl_ms: u64, deadline: Millis },
    Session(SessionId),
}

/// A request for `units` of a namespace's quota under `token`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocateRequest {
    pub namespace: NamespaceName,
    pub token: Token,
    pub units: u64,
    pub scope: Option<Scope>,
    pub constraints: Constraints,
    pub lease: LeaseRequest,
}

/// A token that is currently allocated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub namespace: NamespaceName,
    pub token: Token,
    pub units: u64,
    pub scope: Option<Scope>,
    /// Increases with every grant of the namespace, across restarts and re-creations.
    pub fencing: u64,
    pub lease: Lease,
    pub granted_at: Millis,
}

/// A client's liveness: grants attached to it live while it is kept alive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub id: SessionId,
    pub ttl_ms: u64,
    pub deadline: Millis,
    pub grants: BTreeSet<(NamespaceName, Token)>,
    /// The user that opened it, when access is configured: only it (or an admin of the daemon)
    /// may keep it alive, close it, or attach grants to it.
    pub owner: Option<String>,
}

/// Identifies one waiting allocate call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WaiterId(pub u64);

/// Where a waiter stands: 1-based position and the units wanted by the waiters ahead of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuePlace {
    pub position: usize,
    pub units_ahead: u64,
}

/// Why a request was not granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The namespace quota is full [Flyte `AllocationStatusExhausted`].
    Exhausted,
    /// A cap is full [Flyte `AllocationStatusNamespaceQuotaExceeded`].
    CapExceeded { level: CapLevel, cap: u64, held: u64 },
}

/// The answer to an allocate call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// `existing` is true when the token was already granted (an idempotent retry).
    Granted { grant: Grant, existing: bool },
    /// Not granted. `place` is set when the request is, or was, in the waiting queue.
    Refused { refusal: Refusal, place: Option<QueuePlace> },
    /// The request waits in the queue; it is answered through [`Effects::woken`] or by
    /// [`Ledger::cancel_waiter`].
    Queued { waiter: WaiterId, place: QueuePlace, replaced: Option<WaiterId> },
}

/// A record a backend must make durable, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Insert or update a namespace. `next_fencing` is the durable fencing bound: every fencing
    /// number handed out is below it, and after a restart numbering continues from it.
    /// `put` when a put made or changed it (else only its durable fencing bound moved).
    Namespace { name: NamespaceName, quota: u64, next_fencing: u64, put: bool },
    /// Remove a namespace and all its grants; keep its fencing high-water mark.
    NamespaceRemoved { name: NamespaceName, next_fencing: u64 },
    /// Update a grant (a renewed lease).
    Grant(Grant),
    /// Insert a grant that did not exist: no record of its namespace and token is kept before
    /// this change (a store may drop both it and a removal that follows it).
    GrantAdded(Grant),
    /// A grant ended; `grant` is as it was.
    GrantRemoved { grant: Grant, cause: GrantEnd },
    /// Insert or update a session (its grants are recorded on the grants); `opened` when it is
    /// new, else a keepalive.
    Session { id: SessionId, ttl_ms: u64, deadline: Millis, opened: bool, owner: Option<String> },
    /// A session ended: closed, or `expired`.
    SessionRemoved { id: SessionId, expired: bool },
}

/// A waiter that was granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Woken {
    pub waiter: WaiterId,
    pub grant: Grant,
}

/// Why a grant ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GrantEnd {
    /// Its holder released it.
    Released,
    /// Its TTL lease ran out.
    Expired,
    /// Its session was closed.
    SessionClosed,
    /// Its session's lease ran out.
    SessionExpired,
}

impl GrantEnd {
    /// The stable name, for the API and logs.
    pub fn name(self) -> &'static str {
        match self {
            GrantEnd::Released => "released",
            GrantEnd::Expired => "expired",
            GrantEnd::SessionClosed => "session_closed",
            GrantEnd::SessionExpired => "session_expired",
        }
    }
}

/// What an operation did besides its answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Effects {
    /// Records to make durable before the operation (and the woken waiters) are answered.
    pub changes: Vec<Change>,
    /// Waiters granted by this operation.
    pub woken: Vec<Woken>,
    /// Waiters that can no longer be granted (their namespace or session is gone), and why.
    pub cancelled: Vec<(WaiterId, LedgerError)>,
    /// Grants ended because their lease expired.
    pub expired: u64,
}

impl Effects {
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty() && self.woken.is_empty() && self.cancelled.is_empty()
    }
}

/// Why a namespace cannot grant what a placement needs now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenShortage {
    pub namespace: NamespaceName,
    /// False if the namespace does not exist (any more).
    pub exists: bool,
    pub quota: u64,
    pub granted: u64,
    pub wanted: u64,
    /// Allocate calls waiting in the namespace's queue: a placement comes after all of them.
    pub waiters: usize,
}

impl fmt::Display for TokenShortage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.exists {
            return write!(f, "token namespace `{}` does not exist", self.namespace);
        }
        if self.quota == 0 {
            return write!(f, "token namespace `{}` is paused (its quota is 0)", self.namespace);
        }
        write!(
            f,
            "token namespace `{}` has {} of {} units free and {} needed",
            self.namespace,
            self.quota.saturating_sub(self.granted),
            self.quota,
            self.wanted
        )?;
        if self.waiters > 0 {
            write!(f, "; {} waiters are ahead in its queue (this would be number {})", self.waiters, self.waiters + 1)?;
        }
        Ok(())
    }
}

/// A request the ledger refuses to consider.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    #[error("namespace `{0}` does not exist")]
    NamespaceNotFound(NamespaceName),
    #[error("token `{token}` is not granted in namespace `{namespace}`")]
    GrantNotFound { namespace: NamespaceName, token: Token },
    #[error("session `{0}` does not exist (it was closed or it expired)")]
    SessionNotFound(SessionId),
    #[error("fencing number {given} is stale: the grant's fencing number is {current}")]
    StaleFencing { given: u64, current: u64 },
    /// A retried allocate must ask for exactly what its token holds or waits for; `field` is the
    /// first field (in wire terms: `units`, `scope`, `caps`, `ttl_ms`, `session`) that differs.
    #[error(
        "token `{token}` is already {} with a different {field} ({}: {held}; asked: {asked}); \
         release it first or use another token",
        conflict_state(.waiting).0,
        conflict_state(.waiting).1
    )]
    TokenConflict { token: Token, waiting: bool, field: &'static str, held: String, asked: String },
    #[error("namespace `{namespace}` still has {grants} grants; release them or remove it with force")]
    NamespaceInUse { namespace: NamespaceName, grants: usize },
    /// A namespace where tasks' placements or runs hold grants is not removed, with force or not.
    #[error(
        "namespace `{namespace}` has {grants} grants that allot holds for tasks' placements or runs (such as \
         `{token}`); they end when their tasks end: end those tasks or their applications, then remove it"
    )]
    NamespaceHeldByScheduler { namespace: NamespaceName, grants: usize, token: Token },
    #[error("{what} must be between {min} and {max}, got {value}")]
    OutOfRange { what: &'static str, value: u64, min: u64, max: u64 },
    #[error("caps need a scope: give the holder's project and namespace scope")]
    CapsWithoutScope,
    /// A client asked for a token of allot's own form ([`Token::is_scheduler_held`]).
    #[error(
        "token `{0}` begins with `@`, which only allot's own tokens do (the grants a task's placement or run \
         holds): use a token that does not"
    )]
    SchedulerToken(Token),
    /// A client tried to release or keep alive a grant allot holds for a task.
    #[error(
        "token `{token}` of namespace `{namespace}` is allot's own, held for a task's placement or run: it is \
         released when the task or run ends (end the task or its application instead)"
    )]
    HeldByScheduler { namespace: NamespaceName, token: Token },
}

/// How a token conflict names what the token has: granted, or waiting.
fn conflict_state(waiting: &bool) -> (&'static str, &'static str) {
    if *waiting {
        ("waiting", "waiting for")
    } else {
        ("granted", "granted")
    }
}

/// A store whose records do not fit together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestoreError {
    #[error("grant `{token}` belongs to namespace `{namespace}`, which does not exist")]
    OrphanGrant { namespace: NamespaceName, token: Token },
    #[error("grant `{token}` of namespace `{namespace}` is attached to session `{session}`, which does not exist")]
    MissingSession { namespace: NamespaceName, token: Token, session: SessionId },
    #[error("namespace `{0}` holds more units than its counters can represent")]
    Overflow(NamespaceName),
}

/// Per-namespace counters, for metrics. They count since the daemon started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NamespaceStats {
    pub granted: u64,
    pub exhausted: u64,
    pub cap_exceeded: u64,
    pub released: u64,
    pub expired: u64,
}

impl NamespaceStats {
    fn count(&mut self, refusal: Refusal) {
        match refusal {
            Refusal::Exhausted => self.exhausted += 1,
            Refusal::CapExceeded { .. } => self.cap_exceeded += 1,
        }
    }
}

/// A namespace as seen from outside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceView {
    pub name: NamespaceName,
    pub quota: u64,
    pub granted_units: u64,
    pub grants: usize,
    pub waiters: usize,
    pub waiting_units: u64,
    pub longest_wait_ms: u64,
    pub next_fencing: u64,
    pub stats: NamespaceStats,
}

/// A waiter as seen from outside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaiterView {
    pub id: WaiterId,
    /// The waiter's number in arrival order: it increases along the queue and stays when a retry
    /// takes the waiter over (the id changes). A page of waiters continues after one.
    pub arrival: u64,
    pub place: QueuePlace,
    pub token: Token,
    pub units: u64,
    pub scope: Option<Scope>,
    pub waited_ms: u64,
    /// `None` when the waiter is blocked by the namespace quota (or by a waiter ahead of it).
    pub blocked_by_cap: Option<CapLevel>,
}

/// A namespace's waiters in arrival order, and what finds one without walking the queue: its
/// arrival number by token and by id (arrival numbers increase along the queue, so a binary search
/// finds its place), and the units they want together.
///
/// Invariant: `by_token` and `by_id` hold exactly the queue's waiters; `units` is their units'
/// sum. Every change of the queue goes through these methods.
#[derive(Debug, Clone, Default)]
struct WaitQueue {
    queue: VecDeque<Waiter>,
    by_token: HashMap<Token, u64>,
    by_id: HashMap<WaiterId, u64>,
    /// The units wanted (a sum of up to 2^53 each: wider than `u64`).
    units: u128,
}

impl std::ops::Deref for WaitQueue {
    type Target = VecDeque<Waiter>;

    fn deref(&self) -> &VecDeque<Waiter> {
        &self.queue
    }
}

impl WaitQueue {
    fn push_back(&mut self, waiter: Waiter) {
        debug_assert!(self.queue.back().is_none_or(|last| last.arrival < waiter.arrival));
        self.by_token.insert(waiter.request.token.clone(), waiter.arrival);
        self.by_id.insert(waiter.id, waiter.arrival);
        self.units += u128::from(waiter.request.units);
        self.queue.push_back(waiter);
    }

    fn remove(&mut self, index: usize) -> Option<Waiter> {
        let waiter = self.queue.remove(index)?;
        Self::forget(&mut self.by_token, &mut self.by_id, &mut self.units, &waiter);
        Some(waiter)
    }

    /// Keeps the waiters `keep` says to keep, in their order.
    fn retain(&mut self, mut keep: impl FnMut(&Waiter) -> bool) {
        let (by_token, by_id, units) = (&mut self.by_token, &mut self.by_id, &mut self.units);
        self.queue.retain(|waiter| {
            let kept = keep(waiter);
            if !kept {
                Self::forget(by_token, by_id, units, waiter);
            }
            kept
        });
    }

    fn forget(
        by_token: &mut HashMap<Token, u64>,
        by_id: &mut HashMap<WaiterId, u64>,
        units: &mut u128,
        waiter: &Waiter,
    ) {
        by_token.remove(&waiter.request.token);
        by_id.remove(&waiter.id);
        *units -= u128::from(waiter.request.units);
    }

    /// Gives the waiter at `index` a new id (a new call took it over); returns the old one.
    fn take_over(&mut self, index: usize, id: WaiterId) -> WaiterId {
        let waiter = &mut self.queue[index];
        let old = std::mem::replace(&mut waiter.id, id);
        self.by_id.remove(&old);
        self.by_id.insert(id, waiter.arrival);
        old
    }

    fn index_of_token(&self, token: &Token) -> Option<usize> {
        self.index_of_arrival(*self.by_token.get(token)?)
    }

    fn index_of_id(&self, id: WaiterId) -> Option<usize> {
        self.index_of_arrival(*self.by_id.get(&id)?)
    }

    fn index_of_arrival(&self, arrival: u64) -> Option<usize> {
        let index = self.queue.partition_point(|w| w.arrival < arrival);
        (self.queue.get(index)?.arrival == arrival).then_some(index)
    }

    /// The units all the waiters want (saturating).
    fn units(&self) -> u64 {
        u64::try_from(self.units).unwrap_or(u64::MAX)
    }

    /// The units the waiters ahead of `index` want (saturating), counted from the nearer end.
    fn units_before(&self, index: usize) -> u64 {
        let sum =
            |waiters: &mut dyn Iterator<Item = &Waiter>| waiters.map(|w| u128::from(w.request.units)).sum::<u128>();
        let before = if index <= self.queue.len() / 2 {
            sum(&mut self.queue.iter().take(index))
        } else {
            self.units - sum(&mut self.queue.iter().skip(index))
        };
        u64::try_from(before).unwrap_or(u64::MAX)
    }

    /// Checks the invariant, and that arrival numbers increase along the queue; for tests.
    fn check(&self) -> Result<(), String> {
        if self.queue.iter().zip(self.queue.iter().skip(1)).any(|(a, b)| a.arrival >= b.arrival) {
            return Err("arrival numbers do not increase along the queue".to_owned());
        }
        let units: u128 = self.queue.iter().map(|w| u128::from(w.request.units)).sum();
        let indexed = self.queue.iter().all(|w| {
            self.by_token.get(&w.request.token) == Some(&w.arrival) && self.by_id.get(&w.id) == Some(&w.arrival)
        });
        if units != self.units
            || !indexed
            || self.by_token.len() != self.queue.len()
            || self.by_id.len() != self.queue.len()
        {
            return Err("the waiters' indexes disagree with their queue".to_owned());
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
struct Waiter {
    id: WaiterId,
    /// Increases along the queue (see [`WaiterView::arrival`]).
    arrival: u64,
    request: AllocateRequest,
    since: Millis,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum LeaseKey {
    Grant(NamespaceName, Token),
    Session(SessionId),
}

/// A ledger being restored from a store (see [`Ledger::restoring`]).
#[derive(Debug)]
pub struct Restoring {
    ledger: Ledger,
    /// Every lease, gathered, then built into the ledger's set at once (sorted, not one by one).
    leases: Vec<(Millis, LeaseKey)>,
}

impl Restoring {
    /// Adds `grants`. The grants of one namespace best come in a row (a store reads them so):
    /// its state is then found once, and its table sized once.
    pub fn add_grants(&mut self, grants: Vec<Grant>) -> Result<(), RestoreError> {
        let ledger = &mut self.ledger;
        self.leases.reserve(grants.len());
        let runs: Vec<usize> = grants.chunk_by(|a, b| a.namespace == b.namespace).map(<[Grant]>::len).collect();
        let mut grants = grants.into_iter();
        for run in runs {
            let mut batch = grants.by_ref().take(run);
            let Some(first) = batch.next() else { break };
            let Some(state) = ledger.namespaces.get_mut(&first.namespace) else {
                return Err(RestoreError::OrphanGrant { namespace: first.namespace, token: first.token });
            };
            state.grants.reserve(run);
            for grant in std::iter::once(first).chain(batch) {
                if grant.units > MAX_UNITS || state.granted + grant.units > u64::MAX / 2 {
                    return Err(RestoreError::Overflow(grant.namespace));
                }
                match grant.lease {
                    Lease::None => {}
                    Lease::Ttl { deadline, .. } => {
                        self.leases.push((deadline, LeaseKey::Grant(grant.namespace.clone(), grant.token.clone())));
                    }
                    Lease::Session(id) => {
                        let Some(session) = ledger.sessions.get_mut(&id) else {
                            return Err(RestoreError::MissingSession {
                                namespace: grant.namespace,
                                token: grant.token,
                                session: id,
                            });
                        };
                        session.grants.insert((grant.namespace.clone(), grant.token.clone()));
                    }
                }
                state.next_fencing = state.next_fencing.max(grant.fencing + 1);
                state.fencing_bound = state.fencing_bound.max(state.next_fencing);
                state.add_units(&grant);
                state.grants.insert(grant);
            }
        }
        Ok(())
    }

    /// The restored ledger.
    pub fn finish(self) -> Ledger {
        let mut ledger = self.ledger;
        let mut leases = self.leases;
        // By deadline, then each deadline's few by name: comparing names at every step of one
        // sort took most of a restart's (100 of 124 ms at a million grants). In place: a stable
        // sort's buffer (20 MiB there) stayed in the daemon's memory. The set's own sort then
        // finds them in order in one pass.
        leases.sort_unstable_by_key(|(deadline, _)| *deadline);
        leases.chunk_by_mut(|a, b| a.0 == b.0).for_each(<[_]>::sort_unstable);
        ledger.leases = leases.into_iter().collect();
        ledger
    }
}

/// A namespace's grants, found by token: a hash table of the grants themselves, keyed by their
/// own `token` (a map from token to grant would keep each token twice; at a million grants, 16
/// bytes each and more in the table's empty slots).
#[derive(Debug, Clone, Default)]
struct Grants {
    table: hashbrown::HashTable<Grant>,
    hasher: std::collections::hash_map::RandomState,
}

impl Grants {
    fn hash(&self, token: &Token) -> u64 {
        hash_of(&self.hasher, token)
    }

    fn get(&self, token: &Token) -> Option<&Grant> {
        self.table.find(self.hash(token), |g| &g.token == token)
    }

    fn get_mut(&mut self, token: &Token) -> Option<&mut Grant> {
        let hash = self.hash(token);
        self.table.find_mut(hash, |g| &g.token == token)
    }

    /// Puts `grant` in, in place of the grant of its token if there is one (returned).
    fn insert(&mut self, grant: Grant) -> Option<Grant> {
        let hash = self.hash(&grant.token);
        let hasher = &self.hasher;
        match self.table.entry(hash, |g| g.token == grant.token, |g| hash_of(hasher, &g.token)) {
            hashbrown::hash_table::Entry::Occupied(mut entry) => Some(std::mem::replace(entry.get_mut(), grant)),
            hashbrown::hash_table::Entry::Vacant(entry) => {
                entry.insert(grant);
                None
            }
        }
    }

    fn remove(&mut self, token: &Token) -> Option<Grant> {
        let hash = self.hash(token);
        self.table.find_entry(hash, |g| &g.token == token).ok().map(|entry| entry.remove().0)
    }

    fn reserve(&mut self, more: usize) {
        let hasher = &self.hasher;
        self.table.reserve(more, |g| hash_of(hasher, &g.token));
    }

    fn values(&self) -> impl Iterator<Item = &Grant> {
        self.table.iter()
    }

    fn len(&self) -> usize {
        self.table.len()
    }

    fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

/// Where a grant of `token` sits in a [`Grants`] table (the table rehashes with it as it grows).
fn hash_of(hasher: &std::collections::hash_map::RandomState, token: &Token) -> u64 {
    std::hash::BuildHasher::hash_one(hasher, token)
}

#[derive(Debug, Clone, Default)]
struct NamespaceState {
    quota: u64,
    granted: u64,
    next_fencing: u64,
    /// The durable bound on fencing numbers: `next_fencing <= fencing_bound`.
    fencing_bound: u64,
    grants: Grants,
    project_units: HashMap<Arc<str>, u64>,
    scope_units: HashMap<Scope, u64>,
    waiters: WaitQueue,
    /// True iff a waiter is blocked by the quota: new requests then queue behind it.
    quota_blocked: bool,
    stats: NamespaceStats,
}

/// All the state of the token quotas, and every decision over it.
#[derive(Debug, Default)]
pub struct Ledger {
    namespaces: BTreeMap<NamespaceName, NamespaceState>,
    /// Fencing high-water marks of removed namespaces, so a re-created namespace keeps counting up.
    retired_fencing: HashMap<NamespaceName, u64>,
    sessions: HashMap<SessionId, Session>,
    leases: BTreeSet<(Millis, LeaseKey)>,
    next_waiter: u64,
}

/// Refuses a release or keepalive that names another fencing number than the grant's.
fn check_fencing(grant: &Grant, fencing: Option<u64>) -> Result<(), LedgerError> {
    match fencing {
        Some(given) if given != grant.fencing => Err(LedgerError::StaleFencing { given, current: grant.fencing }),
        _ => Ok(()),
    }
}

/// Checks what a client's allocate request says by itself: not a token of allot's own form,
/// units, caps and TTL in range, and a scope wherever there are caps. Every backend checks this
/// before it looks at any state.
pub fn check_request(request: &AllocateRequest) -> Result<(), LedgerError> {
    if request.token.is_scheduler_held() {
        return Err(LedgerError::SchedulerToken(request.token.clone()));
    }
    check_held_request(request)
}

/// Refuses a client's release or keepalive of a token of allot's own form: whether or not it
/// is granted now, only allot ends it (when its task or run does). Every backend checks this
/// first.
pub fn check_client_token(namespace: &NamespaceName, token: &Token) -> Result<(), LedgerError> {
    if token.is_scheduler_held() {
        return Err(LedgerError::HeldByScheduler { namespace: namespace.clone(), token: token.clone() });
    }
    Ok(())
}

/// Checks what an allocate request of allot's own says by itself (a task's placement or run, under
/// a token beginning with `@`): as [`check_request`], but for the token's form.
pub fn check_held_request(request: &AllocateRequest) -> Result<(), LedgerError> {
    check_range("units", request.units, 1, MAX_UNITS)?;
    if let Some(cap) = request.constraints.project {
        check_range("project cap", cap, 0, MAX_UNITS)?;
    }
    if let Some(cap) = request.constraints.namespace {
        check_range("namespace cap", cap, 0, MAX_UNITS)?;
    }
    let has_caps = request.constraints.project.is_some() || request.constraints.namespace.is_some();
    if has_caps && request.scope.is_none() {
        return Err(LedgerError::CapsWithoutScope);
    }
    if let LeaseRequest::Ttl { ttl_ms } = request.lease {
        check_range("ttl_ms", ttl_ms, 1, MAX_TTL_MS)?;
    }
    Ok(())
}

/// Checks a session's TTL.
pub fn check_session_ttl(ttl_ms: u64) -> Result<(), LedgerError> {
    check_range("ttl_ms", ttl_ms, 1, MAX_TTL_MS)
}

fn check_range(what: &'static str, value: u64, min: u64, max: u64) -> Result<(), LedgerError> {
    if value < min || value > max {
        return Err(LedgerError::OutOfRange { what, value, min, max });
    }
    Ok(())
}

impl NamespaceState {
    fn cap_refusal(&self, request: &AllocateRequest) -> Option<Refusal> {
        let Some(scope) = &request.scope else { return None };
        if let Some(cap) = request.constraints.project {
            let held = self.project_units.get(&scope.project).copied().unwrap_or(0);
            if held + request.units > cap {
                return Some(Refusal::CapExceeded { level: CapLevel::Project, cap, held });
            }
        }
        if let Some(cap) = request.constraints.namespace {
            let held = self.scope_units.get(scope).copied().unwrap_or(0);
            if held + request.units > cap {
                return Some(Refusal::CapExceeded { level: CapLevel::Namespace, cap, held });
            }
        }
        None
    }

    fn fits_quota(&self, units: u64) -> bool {
        self.granted + units <= self.quota
    }

    fn add_units(&mut self, grant: &Grant) {
        self.granted += grant.units;
        let Some(scope) = &grant.scope else { return };
        // Look up before inserting: the keys are cloned only for a scope's first grant.
        match self.project_units.get_mut(&scope.project) {
            Some(units) => *units += grant.units,
            None => {
                self.project_units.insert(scope.project.clone(), grant.units);
            }
        }
        match self.scope_units.get_mut(scope) {
            Some(units) => *units += grant.units,
            None => {
                self.scope_units.insert(scope.clone(), grant.units);
            }
        }
    }

    fn remove_units(&mut self, grant: &Grant) {
        self.granted -= grant.units;
        let Some(scope) = &grant.scope else { return };
        // Counters of scopes that hold nothing are dropped, so the maps stay as small as the
        // set of active scopes.
        if let Some(units) = self.project_units.get_mut(&scope.project) {
            *units -= grant.units;
            if *units == 0 {
                self.project_units.remove(&scope.project);
            }
        }
        if let Some(units) = self.scope_units.get_mut(scope) {
            *units -= grant.units;
            if *units == 0 {
                self.scope_units.remove(scope);
            }
        }
    }

    fn place_of(&self, index: usize) -> QueuePlace {
        QueuePlace { position: index + 1, units_ahead: self.waiters.units_before(index) }
    }

    fn longest_wait(&self, now: Millis) -> u64 {
        self.waiters.iter().map(|w| now.saturating_sub(w.since)).max().unwrap_or(0)
    }
}

impl Ledger {
    pub fn new() -> Ledger {
        Ledger::default()
    }

    /// Rebuilds a ledger from durable records. Waiters are not durable: they start empty.
    pub fn restore(
        namespaces: Vec<(NamespaceName, u64, u64)>,
        retired_fencing: Vec<(NamespaceName, u64)>,
        sessions: Vec<(SessionId, u64, Millis, Option<String>)>,
        grants: Vec<Grant>,
    ) -> Result<Ledger, RestoreError> {
        let mut restoring = Ledger::restoring(namespaces, retired_fencing, sessions);
        restoring.add_grants(grants)?;
        Ok(restoring.finish())
    }

    /// [`Ledger::restore`] in steps, for a store that reads its grants while the ledger is built:
    /// the namespaces and sessions first, then the grants in batches
    /// ([`Restoring::add_grants`]), then [`Restoring::finish`].
    pub fn restoring(
        namespaces: Vec<(NamespaceName, u64, u64)>,
        retired_fencing: Vec<(NamespaceName, u64)>,
        sessions: Vec<(SessionId, u64, Millis, Option<String>)>,
    ) -> Restoring {
        let mut ledger = Ledger::new();
        ledger.retired_fencing = retired_fencing.into_iter().collect();
        for (name, quota, next_fencing) in namespaces {
            let state =
                NamespaceState { quota, next_fencing, fencing_bound: next_fencing, ..NamespaceState::default() };
            ledger.namespaces.insert(name, state);
        }
        let mut leases = Vec::with_capacity(sessions.len());
        for (id, ttl_ms, deadline, owner) in sessions {
            ledger.sessions.insert(id, Session { id, ttl_ms, deadline, grants: BTreeSet::new(), owner });
            leases.push((deadline, LeaseKey::Session(id)));
        }
        Restoring { ledger, leases }
    }

    /// Takes over what lives only in memory from `previous` when a ledger is rebuilt from the
    /// store: the counters (they count since the daemon started) and the waiter ids, so an id
    /// handed out before the rebuild never names a newer waiter.
    pub fn carry_over_from(&mut self, previous: &Ledger) {
        self.next_waiter = self.next_waiter.max(previous.next_waiter);
        for (name, state) in &mut self.namespaces {
            if let Some(old) = previous.namespaces.get(name) {
                state.stats = old.stats;
            }
        }
    }

    /// Creates a namespace or changes its quota [Flyte `RegisterResourceQuota`]. Raising a quota
    /// admits waiters at once; lowering it revokes nothing and cancels no waiter (a waiter larger
    /// than the new quota waits for it to be raised again, or for its wait to end). A quota of 0
    /// pauses the namespace. Returns true if it was created.
    pub fn put_namespace(
        &mut self,
        name: &NamespaceName,
        quota: u64,
        now: Millis,
    ) -> Result<(bool, Effects), LedgerError> {
        check_range("quota", quota, 0, MAX_UNITS)?;
        let mut effects = Effects::default();
        let created = !self.namespaces.contains_key(name);
        let state = self.namespaces.entry(name.clone()).or_default();
        if created {
            state.next_fencing = self.retired_fencing.remove(name).unwrap_or(1);
            state.fencing_bound = state.next_fencing;
        }
        state.quota = quota;
        effects.changes.push(Change::Namespace {
            name: name.clone(),
            quota,
            next_fencing: state.fencing_bound,
            put: true,
        });
        self.admit_at(name, now, &mut effects);
        Ok((created, effects))
    }

    /// Removes a namespace. With grants, only when `force` (the grants end with it). Its waiters
    /// are cancelled.
    pub fn remove_namespace(&mut self, name: &NamespaceName, force: bool) -> Result<(usize, Effects), LedgerError> {
        let btree_map::Entry::Occupied(entry) = self.namespaces.entry(name.clone()) else {
            return Err(LedgerError::NamespaceNotFound(name.clone()));
        };
        // allot's own grants end with their tasks and runs, never with a client's call: not even
        // with force (the tasks would run on, uncounted, in a namespace made again).
        let grants = &entry.get().grants;
        let held: Vec<&Token> = grants.values().map(|g| &g.token).filter(|t| t.is_scheduler_held()).collect();
        if let Some(token) = held.first() {
            let (token, grants) = ((*token).clone(), held.len());
            return Err(LedgerError::NamespaceHeldByScheduler { namespace: name.clone(), grants, token });
        }
        if !grants.is_empty() && !force {
            return Err(LedgerError::NamespaceInUse { namespace: name.clone(), grants: grants.len() });
        }
        let state = entry.remove();
        let mut effects = Effects::default();
        for grant in state.grants.values() {
            self.forget_lease(grant);
        }
        effects.cancelled =
            state.waiters.iter().map(|w| (w.id, LedgerError::NamespaceNotFound(name.clone()))).collect();
        // No grant of this name can be made until it is created again, so the exact next number
        // is a safe bound: a re-created namespace continues without a jump.
        effects.changes.push(Change::NamespaceRemoved { name: name.clone(), next_fencing: state.next_fencing });
        self.retired_fencing.insert(name.clone(), state.next_fencing);
        Ok((state.grants.len(), effects))
    }

    /// The records that make every namespace's exact next fencing number durable, for a clean
    /// shutdown: after them, numbering continues where it stopped instead of at the reserved
    /// bound (a jump of up to [`FENCING_BLOCK`], which only a crash leaves). Each durable bound is
    /// lowered to the next number, so a later grant reserves a new block as usual.
    pub fn fencing_checkpoint(&mut self) -> Vec<Change> {
        let mut changes = Vec::new();
        for (name, state) in &mut self.namespaces {
            if state.fencing_bound != state.next_fencing {
                state.fencing_bound = state.next_fencing;
                changes.push(Change::Namespace {
                    name: name.clone(),
                    quota: state.quota,
                    next_fencing: state.next_fencing,
                    put: false,
                });
            }
        }
        changes
    }

    /// Allocates `request.units` under `request.token` [Flyte `AllocateResource`].
    ///
    /// Allocating a token that is already granted returns the same grant. When the request cannot
    /// be granted and `wait` is true, it joins the waiting queue (first come, first served).
    pub fn allocate(
        &mut self,
        request: AllocateRequest,
        now: Millis,
        wait: bool,
    ) -> Result<(Decision, Effects), LedgerError> {
        check_request(&request)?;
        self.decide(request, now, wait)
    }

    /// Allocates a grant of allot's own, under a token beginning with `@` that no client may
    /// name: a task's placement ([`Token::of_placement`], never waiting), or the plugin quota of
    /// a task's run (which may wait). Otherwise as [`Ledger::allocate`].
    pub fn allocate_held(
        &mut self,
        request: AllocateRequest,
        now: Millis,
        wait: bool,
    ) -> Result<(Decision, Effects), LedgerError> {
        check_held_request(&request)?;
        self.decide(request, now, wait)
    }

    fn decide(
        &mut self,
        request: AllocateRequest,
        now: Millis,
        wait: bool,
    ) -> Result<(Decision, Effects), LedgerError> {
        if let LeaseRequest::Session(id) = request.lease {
            if !self.sessions.contains_key(&id) {
                return Err(LedgerError::SessionNotFound(id));
            }
        }
        let Some(state) = self.namespaces.get_mut(&request.namespace) else {
            return Err(LedgerError::NamespaceNotFound(request.namespace));
        };
        if let Some(grant) = state.grants.get(&request.token) {
            if let Some(conflict) = grant_conflict(grant, &request) {
                return Err(conflict.into_error(request.token, false));
            }
            return Ok((Decision::Granted { grant: grant.clone(), existing: true }, Effects::default()));
        }
        // A request larger than the quota is not refused outright: the quota may be raised (a
        // quota of 0 is a paused namespace). It is `Exhausted`, or waits, like any other.
        // The counters do not change until this call decides, so the caps are checked once.
        let cap_refusal = state.cap_refusal(&request);
        // A cap smaller than the request can never be met: answer at once, even when waiting.
        if let Some(refusal @ Refusal::CapExceeded { cap, .. }) = cap_refusal {
            if request.units > cap || !wait {
                state.stats.cap_exceeded += 1;
                return Ok((Decision::Refused { refusal, place: None }, Effects::default()));
            }
        }
        // A token already in the queue keeps its place; the new call takes the waiter over.
        if let Some(index) = state.waiters.index_of_token(&request.token) {
            if let Some(conflict) = waiter_conflict(&state.waiters[index].request, &request) {
                return Err(conflict.into_error(request.token, true));
            }
            let place = state.place_of(index);
            if !wait {
                let refusal = cap_refusal.unwrap_or(Refusal::Exhausted);
                return Ok((Decision::Refused { refusal, place: Some(place) }, Effects::default()));
            }
            let waiter = WaiterId(self.next_waiter);
            self.next_waiter += 1;
            // The request is the same, so the queue's blocking state does not change.
            let old = state.waiters.take_over(index, waiter);
            return Ok((Decision::Queued { waiter, place, replaced: Some(old) }, Effects::default()));
        }
        let refusal = match cap_refusal {
            Some(refusal) => Some(refusal),
            None if state.quota_blocked || !state.fits_quota(request.units) => Some(Refusal::Exhausted),
            None => None,
        };
        if let Some(refusal) = refusal {
            if !wait {
                state.stats.count(refusal);
                return Ok((Decision::Refused { refusal, place: None }, Effects::default()));
            }
            let waiter = WaiterId(self.next_waiter);
            self.next_waiter += 1;
            let place = state.place_of(state.waiters.len());
            if refusal == Refusal::Exhausted {
                state.quota_blocked = true;
            }
            state.waiters.push_back(Waiter { id: waiter, arrival: waiter.0, request, since: now });
            return Ok((Decision::Queued { waiter, place, replaced: None }, Effects::default()));
        }
        let mut effects = Effects::default();
        let grant = self.insert_grant(request, now, &mut effects)?;
        Ok((Decision::Granted { grant, existing: false }, effects))
    }

    /// Whether `units` more of the namespace's quota could be granted now, without waiting and
    /// without jumping its waiting queue; changes nothing. The scheduler asks this for every
    /// namespace a placement needs before it takes anything, so it never holds a part.
    pub fn room_for(&self, name: &NamespaceName, units: u64) -> Result<(), TokenShortage> {
        let Some(state) = self.namespaces.get(name) else {
            return Err(TokenShortage {
                namespace: name.clone(),
                exists: false,
                quota: 0,
                granted: 0,
                wanted: units,
                waiters: 0,
            });
        };
        if state.quota_blocked || !state.fits_quota(units) {
            return Err(TokenShortage {
                namespace: name.clone(),
                exists: true,
                quota: state.quota,
                granted: state.granted,
                wanted: units,
                waiters: state.waiters.len(),
            });
        }
        Ok(())
    }

    /// A waiter's arrival number (it increases along its queue), if it is waiting.
    pub fn waiter_arrival(&self, namespace: &NamespaceName, waiter: WaiterId) -> Option<u64> {
        self.namespaces.get(namespace)?.waiters.by_id.get(&waiter).copied()
    }

    /// Takes a waiter out of the queue (its wait timed out or its caller left) and says where it
    /// stood. `None` if it is no longer waiting: it was granted or cancelled meanwhile.
    pub fn cancel_waiter(
        &mut self,
        namespace: &NamespaceName,
        waiter: WaiterId,
        now: Millis,
    ) -> Option<(Refusal, QueuePlace, Effects)> {
        let state = self.namespaces.get_mut(namespace)?;
        let index = state.waiters.index_of_id(waiter)?;
        let place = state.place_of(index);
        let removed = state.waiters.remove(index)?;
        let refusal = state.cap_refusal(&removed.request).unwrap_or(Refusal::Exhausted);
        state.stats.count(refusal);
        let mut effects = Effects::default();
        // The waiter may have held up the ones behind it.
        self.admit_at(namespace, now, &mut effects);
        Some((refusal, place, effects))
    }

    /// Releases a token [Flyte `ReleaseResource`]. Idempotent: returns the released grant, or
    /// `None` if the token was not granted. A stale fencing number is refused, and so is a token
    /// of allot's own ([`check_client_token`]).
    pub fn release(
        &mut self,
        namespace: &NamespaceName,
        token: &Token,
        fencing: Option<u64>,
        now: Millis,
    ) -> Result<(Option<Grant>, Effects), LedgerError> {
        check_client_token(namespace, token)?;
        self.release_any(namespace, token, fencing, now)
    }

    /// Releases a grant of allot's own (a task's placement or run), when the task or run ends.
    /// Idempotent.
    pub fn release_held(
        &mut self,
        namespace: &NamespaceName,
        token: &Token,
        now: Millis,
    ) -> Result<(Option<Grant>, Effects), LedgerError> {
        self.release_any(namespace, token, None, now)
    }

    fn release_any(
        &mut self,
        namespace: &NamespaceName,
        token: &Token,
        fencing: Option<u64>,
        now: Millis,
    ) -> Result<(Option<Grant>, Effects), LedgerError> {
        let Some(state) = self.namespaces.get_mut(namespace) else {
            return Err(LedgerError::NamespaceNotFound(namespace.clone()));
        };
        let Some(grant) = state.grants.get(token) else {
            return Ok((None, Effects::default()));
        };
        check_fencing(grant, fencing)?;
        let mut effects = Effects::default();
        let grant = self.remove_grant(namespace, token, GrantEnd::Released, &mut effects);
        self.admit_at(namespace, now, &mut effects);
        Ok((grant, effects))
    }

    /// Renews a grant's lease: a TTL lease starts over; a session lease renews the session.
    pub fn keepalive_grant(
        &mut self,
        namespace: &NamespaceName,
        token: &Token,
        fencing: Option<u64>,
        now: Millis,
    ) -> Result<(Grant, Effects), LedgerError> {
        check_client_token(namespace, token)?;
        let Some(state) = self.namespaces.get_mut(namespace) else {
            return Err(LedgerError::NamespaceNotFound(namespace.clone()));
        };
        let Some(grant) = state.grants.get_mut(token) else {
            return Err(LedgerError::GrantNotFound { namespace: namespace.clone(), token: token.clone() });
        };
        check_fencing(grant, fencing)?;
        let mut effects = Effects::default();
        match grant.lease {
            Lease::None => {}
            Lease::Ttl { ttl_ms, deadline } => {
                let key = LeaseKey::Grant(namespace.clone(), token.clone());
                self.leases.remove(&(deadline, key.clone()));
                grant.lease = Lease::Ttl { ttl_ms, deadline: now + ttl_ms };
                self.leases.insert((now + ttl_ms, key));
                effects.changes.push(Change::Grant(grant.clone()));
            }
            Lease::Session(id) => {
                let grant = grant.clone();
                let (_, session_effects) = self.keepalive_session(id, now)?;
                return Ok((grant, session_effects));
            }
        }
        Ok((grant.clone(), effects))
    }

    /// Opens a session with the given TTL, for `owner` (the user that opens it, if known).
    pub fn open_session(
        &mut self,
        id: SessionId,
        ttl_ms: u64,
        owner: Option<String>,
        now: Millis,
    ) -> Result<(Session, Effects), LedgerError> {
        check_session_ttl(ttl_ms)?;
        let session = Session { id, ttl_ms, deadline: now + ttl_ms, grants: BTreeSet::new(), owner };
        if let Some(old) = self.sessions.insert(id, session.clone()) {
            self.leases.remove(&(old.deadline, LeaseKey::Session(id)));
        }
        self.leases.insert((session.deadline, LeaseKey::Session(id)));
        let change =
            Change::Session { id, ttl_ms, deadline: session.deadline, opened: true, owner: session.owner.clone() };
        Ok((session, Effects { changes: vec![change], ..Effects::default() }))
    }

    /// Renews a session, and so every grant attached to it.
    pub fn keepalive_session(&mut self, id: SessionId, now: Millis) -> Result<(Session, Effects), LedgerError> {
        let Some(session) = self.sessions.get_mut(&id) else {
            return Err(LedgerError::SessionNotFound(id));
        };
        self.leases.remove(&(session.deadline, LeaseKey::Session(id)));
        session.deadline = now + session.ttl_ms;
        self.leases.insert((session.deadline, LeaseKey::Session(id)));
        let change = Change::Session {
            id,
            ttl_ms: session.ttl_ms,
            deadline: session.deadline,
            opened: false,
            owner: session.owner.clone(),
        };
        Ok((session.clone(), Effects { changes: vec![change], ..Effects::default() }))
    }

    /// Closes a session and releases its grants.
    pub fn close_session(&mut self, id: SessionId, now: Millis) -> Result<(Session, Effects), LedgerError> {
        let Some(session) = self.sessions.get(&id).cloned() else {
            return Err(LedgerError::SessionNotFound(id));
        };
        let mut effects = Effects::default();
        self.end_session(&session, now, false, &mut effects);
        Ok((session, effects))
    }

    /// Ends every lease whose deadline is at or before `now`.
    pub fn expire(&mut self, now: Millis) -> Effects {
        self.expire_some(now, usize::MAX)
    }

    /// Ends at most `limit` of the leases whose deadline is at or before `now`, earliest first:
    /// a store ends a great many due at once in batches, answering other calls between them.
    /// More are due when [`Ledger::next_deadline`] is still at or before `now`.
    pub fn expire_some(&mut self, now: Millis, limit: usize) -> Effects {
        let mut effects = Effects::default();
        let mut ended = 0;
        while let Some((deadline, key)) = self.leases.first().cloned() {
            if deadline > now || ended == limit {
                break;
            }
            ended += 1;
            self.leases.pop_first();
            match key {
                LeaseKey::Grant(namespace, token) => {
                    if self.remove_grant(&namespace, &token, GrantEnd::Expired, &mut effects).is_some() {
                        self.admit_at(&namespace, now, &mut effects);
                    }
                }
                LeaseKey::Session(id) => {
                    if let Some(session) = self.sessions.get(&id).cloned() {
                        self.end_session(&session, now, true, &mut effects);
                    }
                }
            }
        }
        effects
    }

    /// The earliest lease deadline, if any lease is running.
    pub fn next_deadline(&self) -> Option<Millis> {
        self.leases.first().map(|(deadline, _)| *deadline)
    }

    pub fn namespaces(&self, now: Millis) -> Vec<NamespaceView> {
        self.namespaces_after(None, usize::MAX, now)
    }

    /// At most `limit` namespaces whose names come after `after`, ordered by name.
    pub fn namespaces_after(&self, after: Option<&NamespaceName>, limit: usize, now: Millis) -> Vec<NamespaceView> {
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        self.namespaces
            .range((from, Bound::Unbounded))
            .take(limit)
            .map(|(name, state)| view_of(name, state, now))
            .collect()
    }

    pub fn namespace(&self, name: &NamespaceName, now: Millis) -> Result<NamespaceView, LedgerError> {
        match self.namespaces.get(name) {
            Some(state) => Ok(view_of(name, state, now)),
            None => Err(LedgerError::NamespaceNotFound(name.clone())),
        }
    }

    /// The grants of a namespace, ordered by token.
    pub fn grants(&self, name: &NamespaceName) -> Result<Vec<Grant>, LedgerError> {
        self.grants_after(name, None, usize::MAX)
    }

    /// At most `limit` grants of a namespace whose tokens come after `after`, ordered by token.
    pub fn grants_after(
        &self,
        name: &NamespaceName,
        after: Option<&Token>,
        limit: usize,
    ) -> Result<Vec<Grant>, LedgerError> {
        let Some(state) = self.namespaces.get(name) else {
            return Err(LedgerError::NamespaceNotFound(name.clone()));
        };
        let grants = first_after(state.grants.values(), |g| &g.token, after, limit);
        Ok(grants.into_iter().cloned().collect())
    }

    pub fn grant(&self, name: &NamespaceName, token: &Token) -> Result<Grant, LedgerError> {
        let Some(state) = self.namespaces.get(name) else {
            return Err(LedgerError::NamespaceNotFound(name.clone()));
        };
        match state.grants.get(token) {
            Some(grant) => Ok(grant.clone()),
            None => Err(LedgerError::GrantNotFound { namespace: name.clone(), token: token.clone() }),
        }
    }

    /// The waiters of a namespace, in queue order.
    pub fn waiters(&self, name: &NamespaceName, now: Millis) -> Result<Vec<WaiterView>, LedgerError> {
        self.waiters_after(name, None, usize::MAX, now)
    }

    /// At most `limit` waiters of a namespace that arrived after arrival number `after`, in
    /// queue order, with their places now.
    pub fn waiters_after(
        &self,
        name: &NamespaceName,
        after: Option<u64>,
        limit: usize,
        now: Millis,
    ) -> Result<Vec<WaiterView>, LedgerError> {
        let Some(state) = self.namespaces.get(name) else {
            return Err(LedgerError::NamespaceNotFound(name.clone()));
        };
        // Arrival numbers increase along the queue, so the page starts at a partition point.
        let start = after.map_or(0, |after| state.waiters.partition_point(|w| w.arrival <= after));
        let QueuePlace { mut units_ahead, .. } = state.place_of(start);
        let mut res = Vec::with_capacity(limit.min(state.waiters.len() - start));
        for (index, waiter) in state.waiters.iter().enumerate().skip(start).take(limit) {
            let blocked_by_cap = match state.cap_refusal(&waiter.request) {
                Some(Refusal::CapExceeded { level, .. }) => Some(level),
                _ => None,
            };
            res.push(WaiterView {
                id: waiter.id,
                arrival: waiter.arrival,
                place: QueuePlace { position: index + 1, units_ahead },
                token: waiter.request.token.clone(),
                units: waiter.request.units,
                scope: waiter.request.scope.clone(),
                waited_ms: now.saturating_sub(waiter.since),
                blocked_by_cap,
            });
            units_ahead = units_ahead.saturating_add(waiter.request.units);
        }
        Ok(res)
    }

    /// Sessions, ordered by id.
    pub fn sessions(&self) -> Vec<Session> {
        self.sessions_after(None, usize::MAX)
    }

    /// At most `limit` sessions whose ids come after `after`, ordered by id.
    pub fn sessions_after(&self, after: Option<SessionId>, limit: usize) -> Vec<Session> {
        first_after(self.sessions.values(), |s| &s.id, after.as_ref(), limit).into_iter().cloned().collect()
    }

    pub fn session(&self, id: SessionId) -> Result<Session, LedgerError> {
        self.sessions.get(&id).cloned().ok_or(LedgerError::SessionNotFound(id))
    }

    /// Grants `request`: its namespace and its session (for a session lease) must exist, or
    /// nothing changes.
    fn insert_grant(
        &mut self,
        request: AllocateRequest,
        now: Millis,
        effects: &mut Effects,
    ) -> Result<Grant, LedgerError> {
        let Ledger { namespaces, sessions, leases, .. } = self;
        let Some(state) = namespaces.get_mut(&request.namespace) else {
            return Err(LedgerError::NamespaceNotFound(request.namespace));
        };
        let session = match request.lease {
            LeaseRequest::Session(id) => Some(sessions.get_mut(&id).ok_or(LedgerError::SessionNotFound(id))?),
            LeaseRequest::None | LeaseRequest::Ttl { .. } => None,
        };
        let lease = match request.lease {
            LeaseRequest::None => Lease::None,
            LeaseRequest::Ttl { ttl_ms } => Lease::Ttl { ttl_ms, deadline: now + ttl_ms },
            LeaseRequest::Session(id) => Lease::Session(id),
        };
        let grant = Grant {
            namespace: request.namespace,
            token: request.token,
            units: request.units,
            scope: request.scope,
            fencing: state.next_fencing,
            lease,
            granted_at: now,
        };
        state.next_fencing += 1;
        state.stats.granted += 1;
        state.add_units(&grant);
        let replaced = state.grants.insert(grant.clone());
        // `Change::GrantAdded` promises stores that no record of this token exists.
        debug_assert!(replaced.is_none(), "a grant is inserted only for a token that holds none");
        if state.next_fencing > state.fencing_bound {
            state.fencing_bound = state.next_fencing + FENCING_BLOCK;
            effects.changes.push(Change::Namespace {
                name: grant.namespace.clone(),
                quota: state.quota,
                next_fencing: state.fencing_bound,
                put: false,
            });
        }
        if let Lease::Ttl { deadline, .. } = lease {
            leases.insert((deadline, LeaseKey::Grant(grant.namespace.clone(), grant.token.clone())));
        }
        if let Some(session) = session {
            session.grants.insert((grant.namespace.clone(), grant.token.clone()));
        }
        effects.changes.push(Change::GrantAdded(grant.clone()));
        Ok(grant)
    }

    fn remove_grant(
        &mut self,
        namespace: &NamespaceName,
        token: &Token,
        cause: GrantEnd,
        effects: &mut Effects,
    ) -> Option<Grant> {
        let state = self.namespaces.get_mut(namespace)?;
        let grant = state.grants.remove(token)?;
        state.remove_units(&grant);
        match cause {
            GrantEnd::Released | GrantEnd::SessionClosed => state.stats.released += 1,
            GrantEnd::Expired | GrantEnd::SessionExpired => {
                state.stats.expired += 1;
                effects.expired += 1;
            }
        }
        self.forget_lease(&grant);
        effects.changes.push(Change::GrantRemoved { grant: grant.clone(), cause });
        Some(grant)
    }

    fn forget_lease(&mut self, grant: &Grant) {
        match grant.lease {
            Lease::None => {}
            Lease::Ttl { deadline, .. } => {
                self.leases.remove(&(deadline, LeaseKey::Grant(grant.namespace.clone(), grant.token.clone())));
            }
            Lease::Session(id) => {
                if let Some(session) = self.sessions.get_mut(&id) {
                    session.grants.remove(&(grant.namespace.clone(), grant.token.clone()));
                }
            }
        }
    }

    fn end_session(&mut self, session: &Session, now: Millis, expired: bool, effects: &mut Effects) {
        let mut touched = BTreeSet::new();
        let cause = if expired { GrantEnd::SessionExpired } else { GrantEnd::SessionClosed };
        for (namespace, token) in &session.grants {
            if self.remove_grant(namespace, token, cause, effects).is_some() {
                touched.insert(namespace.clone());
            }
        }
        self.sessions.remove(&session.id);
        self.leases.remove(&(session.deadline, LeaseKey::Session(session.id)));
        effects.changes.push(Change::SessionRemoved { id: session.id, expired });
        // Requests waiting to join the session can never be granted now.
        for (name, state) in &mut self.namespaces {
            let before = state.waiters.len();
            state.waiters.retain(|waiter| {
                if waiter.request.lease != LeaseRequest::Session(session.id) {
                    return true;
                }
                effects.cancelled.push((waiter.id, LedgerError::SessionNotFound(session.id)));
                false
            });
            if state.waiters.len() != before {
                touched.insert(name.clone());
            }
        }
        for namespace in touched {
            self.admit_at(&namespace, now, effects);
        }
    }

    /// Grants waiters in queue order while they fit. A waiter blocked only by its cap is passed
    /// over (it holds nothing back); the first waiter blocked by the quota stops the walk.
    fn admit_at(&mut self, namespace: &NamespaceName, now: Millis, effects: &mut Effects) {
        // Waiters passed over stay blocked by their caps while others are granted (granting only
        // raises counters), so the walk never goes back.
        let mut index = 0;
        loop {
            let Some(state) = self.namespaces.get_mut(namespace) else { return };
            let mut blocked = false;
            let mut next = None;
            while index < state.waiters.len() {
                let request = &state.waiters[index].request;
                if state.cap_refusal(request).is_some() {
                    index += 1;
                    continue;
                }
                if !state.fits_quota(request.units) {
                    blocked = true;
                } else {
                    next = Some(index);
                }
                break;
            }
            let Some(next) = next else {
                state.quota_blocked = blocked;
                return;
            };
            let Some(waiter) = state.waiters.remove(next) else { return };
            match self.insert_grant(waiter.request, now, effects) {
                Ok(grant) => effects.woken.push(Woken { waiter: waiter.id, grant }),
                // The session ended while the request waited: it can hold nothing.
                Err(refused) => effects.cancelled.push((waiter.id, refused)),
            }
        }
    }

    /// Checks the invariants in the module docs; for tests.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut ttl_leases = 0;
        for (name, state) in &self.namespaces {
            state.waiters.check().map_err(|err| format!("{name}: {err}"))?;
            let granted: u64 = state.grants.values().map(|g| g.units).sum();
            if granted != state.granted {
                return Err(format!("{name}: granted {} but grants sum to {granted}", state.granted));
            }
            let mut projects: HashMap<Arc<str>, u64> = HashMap::new();
            let mut scopes: HashMap<Scope, u64> = HashMap::new();
            for grant in state.grants.values() {
                if state.next_fencing > state.fencing_bound {
                    return Err(format!(
                        "{name}: next fencing {} above its bound {}",
                        state.next_fencing, state.fencing_bound
                    ));
                }
                if grant.fencing >= state.next_fencing {
                    return Err(format!("{name}: grant fencing {} >= next {}", grant.fencing, state.next_fencing));
                }
                if let Some(scope) = &grant.scope {
                    *projects.entry(scope.project.clone()).or_default() += grant.units;
                    *scopes.entry(scope.clone()).or_default() += grant.units;
                }
                if matches!(grant.lease, Lease::Ttl { .. }) {
                    ttl_leases += 1;
                }
            }
            if projects != state.project_units || scopes != state.scope_units {
                return Err(format!("{name}: scope counters disagree with grants"));
            }
            let quota_blocked = state.waiters.iter().any(|w| state.cap_refusal(&w.request).is_none());
            if quota_blocked != state.quota_blocked {
                return Err(format!("{name}: quota_blocked is {} but should be {quota_blocked}", state.quota_blocked));
            }
            if let Some(waiter) = state.waiters.iter().find(|w| {
                state.cap_refusal(&w.request).is_none()
                    && state.fits_quota(w.request.units)
                    && !blocked_before(state, w.id)
            }) {
                return Err(format!("{name}: waiter {:?} fits but was not granted", waiter.id));
            }
        }
        if self.leases.len() != ttl_leases + self.sessions.len() {
            return Err(format!(
                "{} leases for {ttl_leases} TTL grants and {} sessions",
                self.leases.len(),
                self.sessions.len()
            ));
        }
        Ok(())
    }
}

/// "2 units, scope p/dev" for error messages.
/// The first field in which a retried allocate differs from what its token already has, with
/// both values in words. Every backend words them the same way (the Redis functions too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub field: &'static str,
    pub held: String,
    pub asked: String,
}

impl Conflict {
    fn into_error(self, token: Token, waiting: bool) -> LedgerError {
        LedgerError::TokenConflict { token, waiting, field: self.field, held: self.held, asked: self.asked }
    }
}

/// How a conflict shows a scope: `project/namespace`, or `none`.
pub fn describe_scope(scope: Option<&Scope>) -> String {
    match scope {
        Some(scope) => format!("{}/{}", scope.project, scope.namespace),
        None => "none".into(),
    }
}

/// How a conflict shows caps: `project 3, namespace none`.
pub fn describe_caps(caps: Constraints) -> String {
    let cap = |cap: Option<u64>| cap.map_or_else(|| "none".to_owned(), |cap| cap.to_string());
    format!("project {}, namespace {}", cap(caps.project), cap(caps.namespace))
}

/// How a conflict shows a lease: `no lease`, `ttl_ms 30000` or `session <id>`.
pub fn describe_lease(lease: LeaseRequest) -> String {
    match lease {
        LeaseRequest::None => "no lease".into(),
        LeaseRequest::Ttl { ttl_ms } => format!("ttl_ms {ttl_ms}"),
        LeaseRequest::Session(id) => format!("session {id}"),
    }
}

/// The lease a grant was asked with.
fn lease_request(lease: Lease) -> LeaseRequest {
    match lease {
        Lease::None => LeaseRequest::None,
        Lease::Ttl { ttl_ms, .. } => LeaseRequest::Ttl { ttl_ms },
        Lease::Session(id) => LeaseRequest::Session(id),
    }
}

fn lease_conflict(held: LeaseRequest, asked: LeaseRequest) -> Option<Conflict> {
    if held == asked {
        return None;
    }
    // A session on either side names the session; otherwise the TTLs differ.
    let field = match (held, asked) {
        (LeaseRequest::Session(_), _) | (_, LeaseRequest::Session(_)) => "session",
        _ => "ttl_ms",
    };
    Some(Conflict { field, held: describe_lease(held), asked: describe_lease(asked) })
}

/// The first of units and scope in which `request` differs from what its token has.
fn units_or_scope_conflict(units: u64, scope: Option<&Scope>, request: &AllocateRequest) -> Option<Conflict> {
    if units != request.units {
        return Some(Conflict { field: "units", held: units.to_string(), asked: request.units.to_string() });
    }
    if scope != request.scope.as_ref() {
        return Some(Conflict {
            field: "scope",
            held: describe_scope(scope),
            asked: describe_scope(request.scope.as_ref()),
        });
    }
    None
}

/// Why `request` is not a retry of `grant`: units, scope and lease must match (caps only gate
/// admission, so they need not).
pub fn grant_conflict(grant: &Grant, request: &AllocateRequest) -> Option<Conflict> {
    units_or_scope_conflict(grant.units, grant.scope.as_ref(), request)
        .or_else(|| lease_conflict(lease_request(grant.lease), request.lease))
}

/// Why `request` is not a retry of the `waiting` request of the same token: everything must match.
pub fn waiter_conflict(waiting: &AllocateRequest, request: &AllocateRequest) -> Option<Conflict> {
    if let Some(conflict) = units_or_scope_conflict(waiting.units, waiting.scope.as_ref(), request) {
        return Some(conflict);
    }
    if waiting.constraints != request.constraints {
        let (held, asked) = (describe_caps(waiting.constraints), describe_caps(request.constraints));
        return Some(Conflict { field: "caps", held, asked });
    }
    lease_conflict(waiting.lease, request.lease)
}

/// True if a waiter ahead of `id` is blocked by the quota (so `id` rightly waits behind it).
fn blocked_before(state: &NamespaceState, id: WaiterId) -> bool {
    state
        .waiters
        .iter()
        .take_while(|w| w.id != id)
        .any(|w| state.cap_refusal(&w.request).is_none() && !state.fits_quota(w.request.units))
}

fn view_of(name: &NamespaceName, state: &NamespaceState, now: Millis) -> NamespaceView {
    NamespaceView {
        name: name.clone(),
        quota: state.quota,
        granted_units: state.granted,
        grants: state.grants.len(),
        waiters: state.waiters.len(),
        waiting_units: state.waiters.units(),
        longest_wait_ms: state.longest_wait(now),
        next_fencing: state.next_fencing,
        stats: state.stats,
    }
}
