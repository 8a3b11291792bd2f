//! Every error code an answer of the API can carry: the contract clients match on. Each code is
//! listed once, with the part of allot it belongs to and the HTTP status it is answered with.

/// Declares [`ErrorCode`]: each code once, with its part and status; [`ErrorCode::ALL`] holds
/// every one, in this order.
macro_rules! error_codes {
    ($($variant:ident = $code:literal, $part:ident, $status:literal;)*) => {
        /// A stable, machine-readable error code.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $($variant,)*
        }

        impl ErrorCode {
            /// Every code, by part, as the document lists them.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            pub fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $code,)*
                }
            }

            /// The code `text` names, if it is one of these (a newer daemon may answer others).
            pub fn parse(text: &str) -> Option<ErrorCode> {
                match text {
                    $($code => Some(ErrorCode::$variant),)*
                    _ => None,
                }
            }

            pub fn part(self) -> Part {
                match self {
                    $(ErrorCode::$variant => Part::$part,)*
                }
            }

            /// The HTTP status the code is answered with (`namespace_not_found` is also a 409,
            /// when an application or task names a namespace that does not exist).
            pub fn status(self) -> u16 {
                match self {
                    $(ErrorCode::$variant => $status,)*
                }
            }
        }
    };
}

error_codes! {
    InvalidJson = "invalid_json", Daemon, 400;
    InvalidArgument = "invalid_argument", Daemon, 400;
    InvalidName = "invalid_name", Daemon, 400;
    InvalidCursor = "invalid_cursor", Daemon, 400;
    NotFound = "not_found", Daemon, 404;
    MethodNotAllowed = "method_not_allowed", Daemon, 405;
    PayloadTooLarge = "payload_too_large", Daemon, 413;
    Internal = "internal", Daemon, 500;
    StoreUnavailable = "store_unavailable", Daemon, 503;
    StoreOutcomeUnknown = "store_outcome_unknown", Daemon, 503;
    NotEnoughReplicas = "not_enough_replicas", Daemon, 503;
    ShuttingDown = "shutting_down", Daemon, 503;
    Starting = "starting", Daemon, 503;
    StoreFailed = "store_failed", Daemon, 503;
    Unsupported = "unsupported", Daemon, 501;
    Unauthenticated = "unauthenticated", Access, 401;
    Forbidden = "forbidden", Access, 403;
    CapsWithoutScope = "caps_without_scope", Quotas, 400;
    NamespaceNotFound = "namespace_not_found", Quotas, 404;
    GrantNotFound = "grant_not_found", Quotas, 404;
    SessionNotFound = "session_not_found", Quotas, 404;
    StaleFencing = "stale_fencing", Quotas, 409;
    TokenConflict = "token_conflict", Quotas, 409;
    NamespaceInUse = "namespace_in_use", Quotas, 409;
    InvalidResources = "invalid_resources", Pools, 400;
    PoolNotFound = "pool_not_found", Pools, 404;
    AllocNotFound = "alloc_not_found", Pools, 404;
    OfferNotFound = "offer_not_found", Pools, 404;
    OfferExpired = "offer_expired", Pools, 409;
    ExceedsCapacity = "exceeds_capacity", Pools, 409;
    PoolStopped = "pool_stopped", Pools, 409;
    PoolCordoned = "pool_cordoned", Pools, 409;
    PoolInUse = "pool_in_use", Pools, 409;
    AllocEnded = "alloc_ended", Pools, 409;
    AllocIdTaken = "alloc_id_taken", Pools, 409;
    HeldByScheduler = "held_by_scheduler", Pools, 409;
    InvalidQueue = "invalid_queue", Apps, 400;
    QueueNotFound = "queue_not_found", Apps, 404;
    AppNotFound = "app_not_found", Apps, 404;
    TaskNotFound = "task_not_found", Apps, 404;
    QueueInUse = "queue_in_use", Apps, 409;
    QueueNotALeaf = "queue_not_a_leaf", Apps, 409;
    NoUsableQueue = "no_usable_queue", Apps, 409;
    AppConflict = "app_conflict", Apps, 409;
    TaskConflict = "task_conflict", Apps, 409;
    TaskGroupConflict = "task_group_conflict", Apps, 409;
    AppEnded = "app_ended", Apps, 409;
    GangNeverFits = "gang_never_fits", Apps, 409;
    GangExceedsQueue = "gang_exceeds_queue", Apps, 409;
    GangExceedsQuota = "gang_exceeds_quota", Apps, 409;
    TaskNeverFits = "task_never_fits", Apps, 409;
    TokensExceedQuota = "tokens_exceed_quota", Apps, 409;
    TaskTypeUnknown = "task_type_unknown", Apps, 409;
    LargerThanTaskGroup = "larger_than_task_group", Apps, 409;
    IllegalTransition = "illegal_transition", Apps, 409;
    UnknownTaskGroup = "unknown_task_group", Apps, 409;
    UnknownPriorityClass = "unknown_priority_class", Apps, 409;
    RunNotFound = "run_not_found", Runs, 404;
    LogsNotFound = "logs_not_found", Runs, 404;
    RunNotHere = "run_not_here", Runs, 409;
    RevisionCompacted = "revision_compacted", Watch, 410;
    WatchUnsupported = "watch_unsupported", Watch, 501;
    ApiTokenExists = "api_token_exists", Access, 409;
    ApiTokenNotFound = "api_token_not_found", Access, 404;
    BindingNotFound = "binding_not_found", Access, 404;
    UnknownRole = "unknown_role", Access, 409;
}

/// The part of allot an error code belongs to; `Daemon` for the codes any route may answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Daemon,
    Quotas,
    Pools,
    Apps,
    Runs,
    /// The change feed (`GET /v1/watch`).
    Watch,
    /// Identity and access: API tokens and bindings.
    Access,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_reads_back_and_is_listed_once() {
        let mut seen = std::collections::HashSet::new();
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::parse(code.as_str()), Some(*code));
            assert!(seen.insert(code.as_str()), "{} twice", code.as_str());
            assert!((400..600).contains(&code.status()), "{}", code.as_str());
        }
        assert_eq!(ErrorCode::parse("no_such_code"), None);
    }
}
