//! The token quotas part of a backend: namespaces with quotas, grants, waiters and sessions.

use std::time::Duration;

use allot_core::{
    AllocateRequest, Grant, Lease, Millis, NamespaceName, NamespaceView, QueuePlace, Refusal, Session, SessionId,
    Token, WaiterView,
};
use async_trait::async_trait;

use crate::{Page, PageRequest, StoreError};

/// The answer to an allocate call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allocation {
    /// `existing` is true when the token was already granted (an idempotent retry).
    Granted { grant: GrantInfo, existing: bool },
    /// Not granted; `place` says where the request stood in the queue when its wait ended.
    Refused { refusal: Refusal, place: Option<QueuePlace> },
}

/// A grant and the time its lease has left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantInfo {
    pub grant: Grant,
    /// Milliseconds until the lease ends without a keepalive; `None` when the grant has no lease.
    pub expires_in_ms: Option<u64>,
}

/// A session and the time its lease has left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    pub session: Session,
    pub expires_in_ms: u64,
}

/// The token quotas of a backend.
///
/// `allocate` with a non-zero `wait` joins the namespace's first-come-first-served queue and
/// returns when granted, when the wait ends (with the request's place in the queue), or when the
/// store shuts down.
#[async_trait]
pub trait QuotaStore: Send + Sync {
    /// Creates a namespace or changes its quota; true if it was created.
    async fn put_namespace(&self, name: NamespaceName, quota: u64) -> Result<(bool, NamespaceView), StoreError>;
    /// Creates a namespace with `quota` only if it does not exist; an existing one keeps its
    /// quota. This is how the configuration seeds quotas: the store is authoritative. Returns
    /// true if it was created.
    async fn seed_namespace(&self, name: NamespaceName, quota: u64) -> Result<(bool, NamespaceView), StoreError>;
    /// Removes a namespace; with `force`, also when it has grants. Returns how many grants ended.
    async fn remove_namespace(&self, name: NamespaceName, force: bool) -> Result<usize, StoreError>;
    /// A page of the namespaces, ordered by name.
    async fn namespaces(
        &self,
        page: PageRequest<NamespaceName>,
    ) -> Result<Page<NamespaceView, NamespaceName>, StoreError>;
    async fn namespace(&self, name: NamespaceName) -> Result<NamespaceView, StoreError>;

    async fn allocate(&self, request: AllocateRequest, wait: Duration) -> Result<Allocation, StoreError>;
    /// Releases a token; the released grant, or `None` if it was not granted.
    async fn release(
        &self,
        namespace: NamespaceName,
        token: Token,
        fencing: Option<u64>,
    ) -> Result<Option<GrantInfo>, StoreError>;
    async fn keepalive_grant(
        &self,
        namespace: NamespaceName,
        token: Token,
        fencing: Option<u64>,
    ) -> Result<GrantInfo, StoreError>;
    /// Allocates a token of allot's own (beginning with `@`, for a task's run), which
    /// [`QuotaStore::allocate`] refuses to clients; otherwise the same.
    async fn allocate_held(&self, request: AllocateRequest, wait: Duration) -> Result<Allocation, StoreError>;
    /// Releases a token of allot's own (idempotent), which [`QuotaStore::release`] refuses to
    /// clients.
    async fn release_held(&self, namespace: NamespaceName, token: Token) -> Result<Option<GrantInfo>, StoreError>;
    /// A page of a namespace's grants, ordered by token.
    async fn grants(
        &self,
        namespace: NamespaceName,
        page: PageRequest<Token>,
    ) -> Result<Page<GrantInfo, Token>, StoreError>;
    async fn grant(&self, namespace: NamespaceName, token: Token) -> Result<GrantInfo, StoreError>;
    /// A page of a namespace's waiters in queue order, keyed by arrival number
    /// ([`WaiterView::arrival`]): the next page holds the waiters that arrived after the last one
    /// of this page and still wait, with their places at that read.
    async fn waiters(
        &self,
        namespace: NamespaceName,
        page: PageRequest<u64>,
    ) -> Result<Page<WaiterView, u64>, StoreError>;

    /// Opens a session for `owner` (the user that opens it, when access is configured).
    async fn open_session(&self, ttl_ms: u64, owner: Option<String>) -> Result<SessionInfo, StoreError>;
    async fn keepalive_session(&self, id: SessionId) -> Result<SessionInfo, StoreError>;
    /// Closes a session and releases its grants.
    async fn close_session(&self, id: SessionId) -> Result<SessionInfo, StoreError>;
    /// A page of the live sessions, ordered by id.
    async fn sessions(&self, page: PageRequest<SessionId>) -> Result<Page<SessionInfo, SessionId>, StoreError>;
    async fn session(&self, id: SessionId) -> Result<SessionInfo, StoreError>;
}

/// How long a lease has left at `now`; `session_deadline` looks up a session's deadline.
pub fn expires_in(lease: Lease, now: Millis, session_deadline: impl Fn(SessionId) -> Option<Millis>) -> Option<u64> {
    match lease {
        Lease::None => None,
        Lease::Ttl { deadline, .. } => Some(deadline.saturating_sub(now)),
        Lease::Session(id) => session_deadline(id).map(|deadline| deadline.saturating_sub(now)),
    }
}
