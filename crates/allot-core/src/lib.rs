//! allot's pure decision core.
//!
//! One module per part of allot, and what they share:
//! - `access`: who may do what: principals, permissions over patterns of resources, roles.
//! - `quotas`: the token-quota state machine (the [`Ledger`]): namespaces with quotas, grants with
//!   scopes, caps, fencing numbers and leases, sessions, and the first-come-first-served waiters.
//! - `pools`: pools of resources, their offers and leased allocs, and the mux over them.
//! - `apps`: the scheduler of applications: hierarchical queues (`apps::queues`), the state
//!   machines of applications and tasks (`apps::states`), gangs, placements on pools and tokens.
//! - `runs`: the run of a placed task by its plugin: phases, transitions, retries, events.
//! - `names`, `resources`: validated names and resource vectors, shared by all four.
//! - `watch`: the change feed's kinds of change, keys and filters.
//! - `clock`: where the time comes from ([`clock::TimeSource`]); `clock::ManualClock` under
//!   the `testing` feature.
//! - `testing` (the `testing` feature): a seeded random generator for tests.
//!
//! Architecture invariant: this crate does no I/O, reads no clock and spawns nothing (`clock`
//! only defines the source others read; its `SystemTime` is read by callers). Time comes
//! in as a `now` argument, so every decision is a plain function of state and input, tested
//! deterministically and shared by every backend.

pub mod access;
pub mod apps;
pub mod catalog;
pub mod clock;
pub mod names;
pub mod pools;
pub mod quotas;
pub mod resources;
pub mod runs;
#[cfg(feature = "testing")]
pub mod testing;
pub mod watch;

pub use names::{
    NameError, NamespaceName, Scope, SessionId, Token, MAX_NAME_CHARS, NAMESPACE_PATTERN, NAME_PATTERN,
    SCHEDULER_TOKEN_PREFIX, SESSION_ID_PATTERN,
};
pub use quotas::{
    check_client_token, check_held_request, check_request, check_session_ttl, grant_conflict, waiter_conflict,
    AllocateRequest, CapLevel, Change, Conflict, Constraints, Decision, Effects, Grant, GrantEnd, Lease, LeaseRequest,
    Ledger, LedgerError, Millis, NamespaceStats, NamespaceView, QueuePlace, Refusal, RestoreError, Restoring, Session,
    TokenShortage, WaiterId, WaiterView, Woken, FENCING_BLOCK, MAX_TTL_MS, MAX_UNITS,
};
pub use resources::{ResourceName, Resources, ResourcesError, SizeWeights};

/// The `limit` smallest items by `key` whose keys come after `after`, in key order: one page of
/// an unordered collection. O(n) to select, then O(limit log limit) to sort the page.
pub fn first_after<T, K: Ord + ?Sized>(
    items: impl Iterator<Item = T>,
    key: impl Fn(&T) -> &K,
    after: Option<&K>,
    limit: usize,
) -> Vec<T> {
    let mut page: Vec<T> = items.filter(|item| !matches!(after, Some(after) if key(item) <= after)).collect();
    if page.len() > limit {
        if limit == 0 {
            return Vec::new();
        }
        page.select_nth_unstable_by(limit - 1, |a, b| key(a).cmp(key(b)));
        page.truncate(limit);
    }
    page.sort_unstable_by(|a, b| key(a).cmp(key(b)));
    page
}
