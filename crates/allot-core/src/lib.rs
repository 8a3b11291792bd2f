//! allot's pure decision core.
//!
//! - `names`: validated namespaces, tokens, scopes and session ids.
//! - `ledger`: the token-quota state machine: namespaces with quotas, grants with scopes, caps,
//!   fencing numbers and leases, sessions, and the first-come-first-served waiting queue.
//!
//! Architecture invariant: this crate does no I/O, reads no clock and spawns nothing. Time comes
//! in as a `now` argument, so every decision is a plain function of state and input, tested
//! deterministically and shared by every backend.

pub mod ledger;
pub mod names;
pub mod pool;
pub mod resources;
pub mod testing;

pub use ledger::{
    check_request, check_session_ttl, grant_conflict, waiter_conflict, AllocateRequest, CapLevel, Change, Conflict,
    Constraints, Decision, Effects, Grant, Lease, LeaseRequest, Ledger, LedgerError, Millis, NamespaceStats,
    NamespaceView, QueuePlace, Refusal, RestoreError, Session, WaiterId, WaiterView, Woken, FENCING_BLOCK, MAX_TTL_MS,
    MAX_UNITS,
};
pub use names::{NameError, NamespaceName, Scope, SessionId, Token, MAX_NAME_CHARS, NAMESPACE_PATTERN, NAME_PATTERN};
pub use resources::{ResourceName, Resources, ResourcesError, SizeWeights};
