//! The token quotas' bodies: namespaces, grants (allocate, release, keepalive), waiters and
//! sessions.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{integer, object};

/// The status of an allocate call [Flyte `AllocationStatus`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum Status {
    /// The token is granted: go ahead.
    Granted,
    /// The namespace quota is full.
    Exhausted,
    /// A project- or namespace-scope cap is full; `cap` says which.
    NamespaceQuotaExceeded,
}

/// A level of cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CapLevel {
    Project,
    Namespace,
}

/// Who holds a grant: the holder's project and namespace scope (Flyte's project and domain).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Scope {
    pub project: String,
    pub namespace: String,
}

/// Optional caps per scope [Flyte `ResourceConstraintsSpec`]. Absent means no cap; 0 means the
/// scope may hold nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Caps {
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "integer::optional")]
    pub project: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "integer::optional")]
    pub namespace: Option<u64>,
}

/// `PUT /v1/namespaces/{namespace}`: create a namespace or change its quota.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutNamespace {
    /// How many units the namespace may have granted at once.
    #[serde(deserialize_with = "integer::required")]
    pub quota: u64,
}

/// A namespace and its current use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Namespace {
    pub name: String,
    pub quota: u64,
    pub granted_units: u64,
    pub grants: u64,
    pub waiters: u64,
    pub waiting_units: u64,
    /// How long the longest waiter has waited, in milliseconds.
    pub longest_wait_ms: u64,
    /// The fencing number the next grant will carry.
    pub next_fencing: u64,
}

/// The answer to `PUT /v1/namespaces/{namespace}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PutNamespaceResponse {
    /// True if the namespace did not exist before.
    pub created: bool,
    pub namespace: Namespace,
}

/// A page of the namespaces, ordered by name (`GET /v1/namespaces`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NamespaceList {
    pub namespaces: Vec<Namespace>,
    /// Where the next page starts: give it as `cursor`. `null` on the last page.
    #[serde(default)]
    pub next_cursor: Option<String>,
}

/// The answer to `DELETE /v1/namespaces/{namespace}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RemovedNamespace {
    pub name: String,
    /// Grants that ended with the namespace (only with `force`).
    pub grants_ended: u64,
}

/// `PUT /v1/namespaces/{namespace}/grants/{token}`: allocate `units` under `token`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Allocate {
    /// How many units; 1 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "integer::optional")]
    pub units: Option<u64>,
    /// The holder's scope; needed when caps are given.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "object::optional")]
    pub scope: Option<Scope>,
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "object::optional")]
    pub caps: Option<Caps>,
    /// The grant expires this many milliseconds after the grant or its last keepalive.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "integer::optional")]
    pub ttl_ms: Option<u64>,
    /// Attach the grant to this session: it lives as long as the session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Wait up to this many milliseconds for room instead of answering at once (long poll).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "integer::optional")]
    pub wait_ms: Option<u64>,
}

/// A granted token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Grant {
    pub namespace: String,
    pub token: String,
    pub units: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
    /// Increases with every grant of the namespace; pass it on to the protected resource.
    pub fencing: u64,
    /// The TTL of the grant's own lease, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// The session the grant is attached to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Milliseconds until the lease ends without a keepalive; absent when the grant has no lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_ms: Option<u64>,
    /// `scheduler` for a grant allot holds for a task (its token begins with `@`: its placement's
    /// `@<app>:<task>`, its run's `@<app>:<task>:<attempt>`): it has no lease, lives until the
    /// task or run ends, and no client may release it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by: Option<String>,
}

/// Which cap refused a request, and how full it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CapRefusal {
    pub level: CapLevel,
    pub cap: u64,
    pub held: u64,
}

/// Where a waiting request stood when its wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct QueuePlace {
    /// 1 is the head of the queue.
    pub position: u64,
    /// Units wanted by the waiters ahead.
    pub units_ahead: u64,
}

/// The answer to an allocate call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AllocateResponse {
    pub status: Status,
    /// Set when `status` is `Granted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<Grant>,
    /// True when the token was already granted (an idempotent retry).
    #[serde(default)]
    pub existing: bool,
    /// Set when `status` is `NamespaceQuotaExceeded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap: Option<CapRefusal>,
    /// Set when the request waited and its wait ended without a grant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueuePlace>,
}

/// The answer to `DELETE /v1/namespaces/{namespace}/grants/{token}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReleaseResponse {
    /// False when the token was not granted (releasing is idempotent).
    pub released: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<Grant>,
}

/// `POST /v1/namespaces/{namespace}/grants/{token}/keepalive`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Keepalive {
    /// Refuse the keepalive if the grant's fencing number is not this one.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "integer::optional")]
    pub fencing: Option<u64>,
}

/// A page of a namespace's grants, ordered by token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GrantList {
    pub grants: Vec<Grant>,
    /// Where the next page starts: give it as `cursor`. `null` on the last page.
    #[serde(default)]
    pub next_cursor: Option<String>,
}

/// A waiting allocate call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Waiter {
    pub position: u64,
    pub units_ahead: u64,
    pub token: String,
    pub units: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
    pub waited_ms: u64,
    /// Set when the waiter is held back by its own cap rather than by the quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_by_cap: Option<CapLevel>,
}

/// A page of a namespace's waiters, head first. A cursor continues after the last waiter of its page in arrival order, whatever moved meanwhile; each page gives the places at its read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WaiterList {
    pub waiters: Vec<Waiter>,
    /// Where the next page starts: give it as `cursor`. `null` on the last page.
    #[serde(default)]
    pub next_cursor: Option<String>,
}

/// `POST /v1/sessions`: open a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenSession {
    /// The session ends this many milliseconds after it is opened or last kept alive.
    #[serde(deserialize_with = "integer::required")]
    pub ttl_ms: u64,
}

/// A grant attached to a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GrantRef {
    pub namespace: String,
    pub token: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Session {
    pub id: String,
    pub ttl_ms: u64,
    pub expires_in_ms: u64,
    pub grants: Vec<GrantRef>,
    /// The user that opened it, when the daemon checks who calls: only that user (or an admin of
    /// the daemon) may see it, keep it alive, close it or attach grants to it.
    #[serde(default)]
    pub owner: Option<String>,
}

/// A page of the open sessions, ordered by id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SessionList {
    pub sessions: Vec<Session>,
    /// Where the next page starts: give it as `cursor`. `null` on the last page.
    #[serde(default)]
    pub next_cursor: Option<String>,
}
