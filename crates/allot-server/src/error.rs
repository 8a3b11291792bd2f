//! `ApiError`: the one error type at the HTTP edge, with a stable machine-readable code.

use allot_api::{ErrorBody, ErrorDetail};
use allot_core::apps::queues::QueueError;
use allot_core::apps::SchedError;
use allot_core::pools::PoolError;
use allot_core::{LedgerError, NameError, ResourcesError};
use allot_store::StoreError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

/// An error answer: HTTP status, stable code, and a message a person understands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into() }
    }

    pub fn invalid_argument(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_argument", message)
    }

    pub fn invalid_json(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", message)
    }

    pub fn not_found() -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route; see /openapi.json")
    }

    pub fn method_not_allowed() -> ApiError {
        ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "this route does not take that method")
    }
}

impl From<NameError> for ApiError {
    fn from(err: NameError) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_name", err.to_string())
    }
}

impl From<LedgerError> for ApiError {
    fn from(err: LedgerError) -> ApiError {
        let (status, code) = match &err {
            LedgerError::NamespaceNotFound(_) => (StatusCode::NOT_FOUND, "namespace_not_found"),
            LedgerError::GrantNotFound { .. } => (StatusCode::NOT_FOUND, "grant_not_found"),
            LedgerError::SessionNotFound(_) => (StatusCode::NOT_FOUND, "session_not_found"),
            LedgerError::StaleFencing { .. } => (StatusCode::CONFLICT, "stale_fencing"),
            LedgerError::TokenConflict { .. } => (StatusCode::CONFLICT, "token_conflict"),
            LedgerError::NamespaceInUse { .. } => (StatusCode::CONFLICT, "namespace_in_use"),
            LedgerError::OutOfRange { .. } => (StatusCode::BAD_REQUEST, "invalid_argument"),
            LedgerError::CapsWithoutScope => (StatusCode::BAD_REQUEST, "caps_without_scope"),
        };
        ApiError::new(status, code, err.to_string())
    }
}

impl From<PoolError> for ApiError {
    fn from(err: PoolError) -> ApiError {
        let (status, code) = match &err {
            PoolError::PoolNotFound(_) => (StatusCode::NOT_FOUND, "pool_not_found"),
            PoolError::AllocNotFound { .. } => (StatusCode::NOT_FOUND, "alloc_not_found"),
            PoolError::PoolStopped(_) => (StatusCode::CONFLICT, "pool_stopped"),
            PoolError::PoolInUse { .. } => (StatusCode::CONFLICT, "pool_in_use"),
            // The client should try another offer [Reflow `errOfferExpired`].
            PoolError::OfferExpired { .. } => (StatusCode::CONFLICT, "offer_expired"),
            // Fatal for a keepalive loop: the alloc will not come back.
            PoolError::AllocEnded { .. } => (StatusCode::CONFLICT, "alloc_ended"),
            PoolError::AllocIdTaken { .. } => (StatusCode::CONFLICT, "alloc_id_taken"),
            // It can never fit (unless the capacity is raised): try another pool.
            PoolError::ExceedsCapacity { .. } => (StatusCode::CONFLICT, "exceeds_capacity"),
            // The scheduler frees it when its task ends.
            PoolError::HeldByScheduler { .. } => (StatusCode::CONFLICT, "held_by_scheduler"),
            PoolError::EmptyRequest | PoolError::OutOfRange { .. } => (StatusCode::BAD_REQUEST, "invalid_argument"),
        };
        ApiError::new(status, code, err.to_string())
    }
}

impl From<SchedError> for ApiError {
    fn from(err: SchedError) -> ApiError {
        let (status, code) = match &err {
            SchedError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_argument"),
            SchedError::Queue(QueueError::BadPath(_)) => (StatusCode::BAD_REQUEST, "invalid_queue"),
            SchedError::Queue(QueueError::NotFound(_)) => (StatusCode::NOT_FOUND, "queue_not_found"),
            // Refusals that depend on what the store holds (child queues, pools, limits, the
            // application's groups) are conflicts; 400 is for what a request says by itself.
            SchedError::Queue(QueueError::NotALeaf { .. }) => (StatusCode::CONFLICT, "queue_not_a_leaf"),
            SchedError::Queue(QueueError::HasChildren { .. } | QueueError::RemoveRoot) => {
                (StatusCode::CONFLICT, "queue_in_use")
            }
            SchedError::QueueInUse { .. } => (StatusCode::CONFLICT, "queue_in_use"),
            SchedError::AppNotFound(_) => (StatusCode::NOT_FOUND, "app_not_found"),
            SchedError::TaskNotFound { .. } => (StatusCode::NOT_FOUND, "task_not_found"),
            SchedError::AppConflict { .. } => (StatusCode::CONFLICT, "app_conflict"),
            SchedError::TaskConflict { .. } => (StatusCode::CONFLICT, "task_conflict"),
            SchedError::AppEnded { .. } => (StatusCode::CONFLICT, "app_ended"),
            // What the body names does not exist; the path's application does (so not 404).
            SchedError::UnknownGroup { .. } => (StatusCode::CONFLICT, "unknown_task_group"),
            // Like two tasks of one id with different content (`task_conflict`).
            SchedError::GroupConflict { .. } => (StatusCode::CONFLICT, "task_group_conflict"),
            SchedError::LargerThanGroup { .. } => (StatusCode::CONFLICT, "larger_than_task_group"),
            SchedError::GroupNeverFits { .. } => (StatusCode::CONFLICT, "gang_never_fits"),
            SchedError::GangExceedsQueue(_) => (StatusCode::CONFLICT, "gang_exceeds_queue"),
            SchedError::NamespaceNotFound(_) => (StatusCode::CONFLICT, "namespace_not_found"),
            SchedError::Illegal(_) => (StatusCode::CONFLICT, "illegal_transition"),
        };
        ApiError::new(status, code, err.to_string())
    }
}

impl From<ResourcesError> for ApiError {
    fn from(err: ResourcesError) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_resources", err.to_string())
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> ApiError {
        match err {
            StoreError::Ledger(err) => err.into(),
            StoreError::Unavailable(_) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", err.to_string())
            }
            StoreError::OutcomeUnknown(_) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "store_outcome_unknown", err.to_string())
            }
            StoreError::NotEnoughReplicas(_) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "not_enough_replicas", err.to_string())
            }
            StoreError::ShuttingDown => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "shutting_down", err.to_string())
            }
            StoreError::Invalid(message) => ApiError::invalid_argument(message),
            StoreError::Pool(err) => err.into(),
            StoreError::Sched(err) => err.into(),
        }
    }
}

/// Failed requests of an outage are logged as a few lines, not one per request.
static FAILURES: allot_store::quiet::Quiet = allot_store::quiet::Quiet::new();
/// The same, for requests answered 503.
static UNAVAILABLE: allot_store::quiet::Quiet = allot_store::quiet::Quiet::new();

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // A 503 is an expected, documented state (a scheduler being elected, the store briefly
        // unreachable, a shutdown) that clients retry: a warning. Other 5xx are errors.
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            if let Some(held_back) = UNAVAILABLE.admit() {
                tracing::warn!(code = self.code, message = %self.message, more_since_last = held_back, "request answered 503; the client may retry");
            }
        } else if self.status.is_server_error() {
            if let Some(held_back) = FAILURES.admit() {
                tracing::error!(code = self.code, message = %self.message, more_since_last = held_back, "request failed");
            }
        }
        let unavailable = self.status == StatusCode::SERVICE_UNAVAILABLE;
        let body = ErrorBody { error: ErrorDetail { code: self.code.to_owned(), message: self.message } };
        let mut response = (self.status, Json(body)).into_response();
        if unavailable {
            // The store or the daemon is expected back soon: tell clients when to try again.
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
        }
        response
    }
}
