//! `ApiError`: the one error type at the HTTP edge, with a stable machine-readable code. Every
//! code an answer can carry is an [`ErrorCode`], listed once with its part and status; the
//! OpenAPI document lists the codes from there (`document.rs`).

use allot_api::{ErrorBody, ErrorDetail};
use allot_core::access::AccessError;
use allot_core::apps::queues::QueueError;
use allot_core::apps::{NeverFits, SchedError};
use allot_core::pools::PoolError;
use allot_core::{LedgerError, NameError, ResourcesError};
use allot_store::StoreError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

pub(crate) use allot_api::{ErrorCode, Part};

/// The status `code` is answered with.
fn status_of(code: ErrorCode) -> StatusCode {
    StatusCode::from_u16(code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// An error answer: HTTP status, stable code, and a message a person understands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// With `revision_compacted`: the oldest revision a watch can start after.
    pub compact_revision: Option<u64>,
}

/// The longest value an error message repeats whole, in bytes; a longer one is cut to
/// [`ECHOED_PREFIX`] and its length.
const MAX_ECHOED: usize = 96;
const ECHOED_PREFIX: usize = 64;
/// The longest error message, in bytes.
const MAX_MESSAGE: usize = 4096;

/// `message` with every quoted value (between backticks or double quotes) longer than
/// [`MAX_ECHOED`] cut to its first bytes: a caller's bad value is named, not sent back whole.
fn bounded(message: String) -> String {
    if message.len() <= MAX_ECHOED {
        return message;
    }
    let mut out = String::with_capacity(message.len().min(MAX_MESSAGE));
    let mut rest = message.as_str();
    while let Some(open) = rest.find(['`', '"']) {
        let quote = rest.as_bytes()[open] as char;
        out.push_str(&rest[..=open]);
        rest = &rest[open + 1..];
        let Some(close) = rest.find(quote) else { break };
        let value = &rest[..close];
        if value.len() > MAX_ECHOED {
            let mut cut = ECHOED_PREFIX;
            while !value.is_char_boundary(cut) {
                cut -= 1;
            }
            out.push_str(&value[..cut]);
            out.push_str(&format!("… ({} bytes)", value.len()));
        } else {
            out.push_str(value);
        }
        out.push(quote);
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    if out.len() > MAX_MESSAGE {
        let mut cut = MAX_MESSAGE;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push('…');
    }
    out
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: bounded(message.into()), compact_revision: None }
    }

    /// An answer with `code`, in the status the code is answered with.
    pub fn of(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError::new(status_of(code), code.as_str(), message)
    }

    pub fn invalid_argument(message: impl Into<String>) -> ApiError {
        ApiError::of(ErrorCode::InvalidArgument, message)
    }

    pub fn invalid_json(message: impl Into<String>) -> ApiError {
        ApiError::of(ErrorCode::InvalidJson, message)
    }

    pub fn not_found() -> ApiError {
        ApiError::of(ErrorCode::NotFound, "no such route; see /openapi.json")
    }

    pub fn method_not_allowed() -> ApiError {
        ApiError::of(ErrorCode::MethodNotAllowed, "this route does not take that method")
    }
}

impl From<NameError> for ApiError {
    fn from(err: NameError) -> ApiError {
        ApiError::of(ErrorCode::InvalidName, err.to_string())
    }
}

impl From<LedgerError> for ApiError {
    fn from(err: LedgerError) -> ApiError {
        let code = match &err {
            LedgerError::NamespaceNotFound(_) => ErrorCode::NamespaceNotFound,
            LedgerError::GrantNotFound { .. } => ErrorCode::GrantNotFound,
            LedgerError::SessionNotFound(_) => ErrorCode::SessionNotFound,
            LedgerError::StaleFencing { .. } => ErrorCode::StaleFencing,
            LedgerError::TokenConflict { .. } => ErrorCode::TokenConflict,
            LedgerError::NamespaceInUse { .. } => ErrorCode::NamespaceInUse,
            LedgerError::OutOfRange { .. } => ErrorCode::InvalidArgument,
            LedgerError::CapsWithoutScope => ErrorCode::CapsWithoutScope,
            LedgerError::SchedulerToken(_) => ErrorCode::InvalidArgument,
            LedgerError::HeldByScheduler { .. } => ErrorCode::HeldByScheduler,
            LedgerError::NamespaceHeldByScheduler { .. } => ErrorCode::HeldByScheduler,
        };
        ApiError::of(code, err.to_string())
    }
}

impl From<PoolError> for ApiError {
    fn from(err: PoolError) -> ApiError {
        let code = match &err {
            PoolError::PoolNotFound(_) => ErrorCode::PoolNotFound,
            PoolError::AllocNotFound { .. } => ErrorCode::AllocNotFound,
            PoolError::PoolStopped(_) => ErrorCode::PoolStopped,
            PoolError::PoolCordoned(_) => ErrorCode::PoolCordoned,
            PoolError::PoolInUse { .. } => ErrorCode::PoolInUse,
            // The client should try another offer [Reflow `errOfferExpired`].
            PoolError::OfferExpired { .. } => ErrorCode::OfferExpired,
            // Fatal for a keepalive loop: the alloc will not come back.
            PoolError::AllocEnded { .. } => ErrorCode::AllocEnded,
            PoolError::AllocIdTaken { .. } => ErrorCode::AllocIdTaken,
            // It can never fit (unless the capacity is raised): try another pool.
            PoolError::ExceedsCapacity { .. } => ErrorCode::ExceedsCapacity,
            // The scheduler frees it when its task ends.
            PoolError::HeldByScheduler { .. } => ErrorCode::HeldByScheduler,
            PoolError::EmptyRequest | PoolError::OutOfRange { .. } | PoolError::TooLarge { .. } => {
                ErrorCode::InvalidArgument
            }
        };
        ApiError::of(code, err.to_string())
    }
}

impl From<SchedError> for ApiError {
    fn from(err: SchedError) -> ApiError {
        let code = match &err {
            SchedError::Invalid(_) => ErrorCode::InvalidArgument,
            SchedError::Queue(QueueError::BadPath(_)) => ErrorCode::InvalidQueue,
            SchedError::Queue(QueueError::NotFound(_)) => ErrorCode::QueueNotFound,
            // Refusals that depend on what the store holds (child queues, pools, limits, the
            // application's groups) are conflicts; 400 is for what a request says by itself.
            SchedError::Queue(QueueError::NotALeaf { .. } | QueueError::UnderBusyLeaf { .. }) => {
                ErrorCode::QueueNotALeaf
            }
            SchedError::Queue(QueueError::HasChildren { .. } | QueueError::RemoveRoot) => ErrorCode::QueueInUse,
            // Limits that contradict themselves or the queues around them, named in the message.
            SchedError::Queue(QueueError::Limits { .. }) => ErrorCode::InvalidArgument,
            SchedError::QueueInUse { .. } => ErrorCode::QueueInUse,
            SchedError::AppNotFound(_) => ErrorCode::AppNotFound,
            SchedError::TaskNotFound { .. } => ErrorCode::TaskNotFound,
            SchedError::AppConflict { .. } => ErrorCode::AppConflict,
            SchedError::TaskConflict { .. } => ErrorCode::TaskConflict,
            SchedError::AppEnded { .. } => ErrorCode::AppEnded,
            // What the body names does not exist; the path's application does (so not 404).
            SchedError::UnknownGroup { .. } => ErrorCode::UnknownTaskGroup,
            SchedError::UnknownPriorityClass { .. } => ErrorCode::UnknownPriorityClass,
            SchedError::NotPreempting { .. } => ErrorCode::IllegalTransition,
            // Like two tasks of one id with different content (`task_conflict`).
            SchedError::GroupConflict { .. } => ErrorCode::TaskGroupConflict,
            SchedError::LargerThanGroup { .. } => ErrorCode::LargerThanTaskGroup,
            SchedError::GroupNeverFits { .. } => ErrorCode::GangNeverFits,
            SchedError::GangExceedsQueue(_) => ErrorCode::GangExceedsQueue,
            SchedError::GangExceedsQuota { .. } => ErrorCode::GangExceedsQuota,
            // Refused at once rather than left waiting for what can never come.
            SchedError::NeverFits { why, .. } => match why {
                NeverFits::Resources { .. } => ErrorCode::TaskNeverFits,
                NeverFits::Tokens { .. } => ErrorCode::TokensExceedQuota,
                NeverFits::TaskType { .. } => ErrorCode::TaskTypeUnknown,
            },
            SchedError::NamespaceNotFound(_) => ErrorCode::NamespaceNotFound,
            SchedError::Illegal(_) => ErrorCode::IllegalTransition,
        };
        // A namespace the body names does not exist; the path's application does (so not 404).
        let status = match &err {
            SchedError::NamespaceNotFound(_) => StatusCode::CONFLICT,
            _ => status_of(code),
        };
        ApiError::new(status, code.as_str(), err.to_string())
    }
}

impl From<AccessError> for ApiError {
    fn from(err: AccessError) -> ApiError {
        let code = match &err {
            AccessError::TokenExists(_) => ErrorCode::ApiTokenExists,
            AccessError::TokenNotFound(_) => ErrorCode::ApiTokenNotFound,
            AccessError::BindingNotFound(_) => ErrorCode::BindingNotFound,
            AccessError::Invalid(_) => ErrorCode::InvalidArgument,
        };
        ApiError::of(code, err.to_string())
    }
}

impl From<ResourcesError> for ApiError {
    fn from(err: ResourcesError) -> ApiError {
        ApiError::of(ErrorCode::InvalidResources, err.to_string())
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> ApiError {
        match err {
            StoreError::Quotas(err) => err.into(),
            StoreError::Unavailable(_) => ApiError::of(ErrorCode::StoreUnavailable, err.to_string()),
            StoreError::OutcomeUnknown(_) => ApiError::of(ErrorCode::StoreOutcomeUnknown, err.to_string()),
            StoreError::NotEnoughReplicas(_) => ApiError::of(ErrorCode::NotEnoughReplicas, err.to_string()),
            StoreError::ShuttingDown => ApiError::of(ErrorCode::ShuttingDown, err.to_string()),
            StoreError::Failed(_) => ApiError::of(ErrorCode::StoreFailed, err.to_string()),
            StoreError::Invalid(message) => ApiError::invalid_argument(message),
            StoreError::Pools(err) => err.into(),
            StoreError::Apps(err) => err.into(),
            StoreError::Access(err) => err.into(),
            StoreError::Unsupported(message) => ApiError::of(ErrorCode::Unsupported, message),
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
        let error =
            ErrorDetail { code: self.code.to_owned(), message: self.message, compact_revision: self.compact_revision };
        let body = ErrorBody { error };
        let mut response = (self.status, Json(body)).into_response();
        if unavailable {
            // The store or the daemon is expected back soon: tell clients when to try again.
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// The codes written as text where an answer is made (the second argument of `new`), in
    /// every source file of this crate: (file, code).
    fn codes_written_in_sources() -> Vec<(String, String)> {
        let maker = concat!("ApiError", "::new(");
        let mut found = Vec::new();
        let mut dirs = vec![PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/src"))];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                if path.extension().is_none_or(|ext| ext != "rs") {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                for (at, _) in text.match_indices(maker) {
                    // The code is the second argument; a code passed as a value is an ErrorCode's.
                    let Some((_, second)) = text[at + maker.len()..].split_once(',') else { continue };
                    let Some(literal) = second.trim_start().strip_prefix('"') else { continue };
                    let code = &literal[..literal.find('"').unwrap()];
                    found.push((path.display().to_string(), code.to_owned()));
                }
            }
        }
        found
    }

    #[test]
    fn every_code_an_answer_can_carry_is_listed() {
        let listed: Vec<&str> = ErrorCode::ALL.iter().map(|code| code.as_str()).collect();
        let written = codes_written_in_sources();
        assert!(written.iter().any(|(_, code)| code == "invalid_cursor"), "the sources were not read: {written:?}");
        for (file, code) in &written {
            assert!(listed.contains(&code.as_str()), "{file} answers `{code}`, which ErrorCode does not list");
        }
    }

    #[test]
    fn codes_are_distinct_snake_case_words() {
        for (i, code) in ErrorCode::ALL.iter().enumerate() {
            let text = code.as_str();
            assert!(text.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{text}");
            assert!(ErrorCode::ALL[..i].iter().all(|other| other.as_str() != text), "{text} twice");
        }
    }

    #[test]
    fn a_long_bad_value_is_echoed_as_a_prefix() {
        let long = "x".repeat(1_000_000);
        let err = ApiError::invalid_argument(format!("application id `{long}` is not an id"));
        assert!(err.message.len() < 200, "{}", err.message.len());
        assert!(
            err.message.starts_with(&format!("application id `{}… (1000000 bytes)`", "x".repeat(64))),
            "{}",
            err.message
        );
        assert!(err.message.ends_with("` is not an id"));
        let short = ApiError::invalid_argument("queue `root.a` and \"b\"");
        assert_eq!(short.message, "queue `root.a` and \"b\"");
        let unclosed = ApiError::invalid_argument(format!("`{long}"));
        assert!(unclosed.message.len() <= MAX_MESSAGE + 3, "a message is bounded: {}", unclosed.message.len());
        let wide = ApiError::invalid_argument(format!("`{}`", "é".repeat(100)));
        assert!(wide.message.contains("… (200 bytes)`"), "cut at a character: {}", wide.message);
    }
}
