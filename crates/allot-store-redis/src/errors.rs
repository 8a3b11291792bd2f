//! What a failed Redis call means for the caller, as a [`StoreError`]: `Unavailable` when nothing
//! was done (refused, not sent, or a slot not served while a replica takes over),
//! `OutcomeUnknown` when a change may have been applied and its answer was lost, and
//! `NotEnoughReplicas` when a primary short of replicas refused a change before applying it.

use allot_store::StoreError;
use redis::RedisError;

use crate::cluster;
use crate::conn::{self, WriteError};

/// Whether `err` is a server's answer that loading the library again will not change (an unknown
/// command on Redis 6, a script error), rather than a passing state (loading, failing over).
pub(crate) fn refuses_library(err: &RedisError) -> bool {
    let passing = ["LOADING", "BUSY", "TRYAGAIN", "MASTERDOWN", "CLUSTERDOWN", "MOVED", "ASK"];
    matches!(err.kind(), redis::ErrorKind::Server(_)) && !err.code().is_some_and(|code| passing.contains(&code))
}

/// Maps a failed call. Only a `mutating` call that may have reached Redis and was not answered
/// may have taken effect; a call refused before it was sent (no server listening, no connection
/// to the slot's node) or refused by Redis changed nothing.
pub(crate) fn redis_error(err: RedisError, mutating: bool) -> StoreError {
    if let Some(refusal) = replicas_refusal(&err) {
        return refusal;
    }
    if mutating && maybe_sent(&err) {
        StoreError::OutcomeUnknown(format!(
            "Redis did not answer a change it may have received: {} (the node that holds it may be failing over)",
            short_cause(&err)
        ))
    } else if failing_over(&err) {
        StoreError::Unavailable(
            "the Redis node that holds this failed or is handing its slots over, and a replica is taking its \
             place; retry in about a second"
                .to_owned(),
        )
    } else {
        StoreError::Unavailable(format!("Redis: {err}"))
    }
}

/// The refusal of a change by a primary with too few replicas (`ALLOT_NOREPLICAS <attached>
/// <required> <port>`, from the function's check before it writes), in words.
fn replicas_refusal(err: &RedisError) -> Option<StoreError> {
    // Alone, or the first answer of a change followed by `WAIT`.
    let errors = err.clone().into_server_errors()?;
    let (_, refusal) = errors.iter().find(|(_, e)| e.code() == "ALLOT_NOREPLICAS")?;
    let mut words = refusal.details().unwrap_or_default().split_whitespace();
    let (attached, required, port) = (words.next()?, words.next()?, words.next().unwrap_or("?"));
    Some(StoreError::NotEnoughReplicas(format!(
        "the Redis primary that holds this (port {port}) has {attached} of the {required} replicas \
         --redis-min-replicas requires attached (a failover left it none, or they fell behind), so it refused \
         the change before applying it; retry once a replica is attached"
    )))
}

/// Whether an error that changed nothing comes from a node failing over or a slot moving
/// ([`cluster::slot_not_served`]), or a node still loading its data after a restart.
fn failing_over(err: &RedisError) -> bool {
    cluster::slot_not_served(err) || err.code() == Some("LOADING")
}

/// What went wrong with a call that may have been received, in words.
fn short_cause(err: &RedisError) -> &'static str {
    if err.is_timeout() {
        "no answer within the timeout"
    } else {
        "the connection broke"
    }
}

/// Maps a failed call made through [`Conn::write`] or [`Conn::fcall`].
pub(crate) fn call_error(err: WriteError, mutating: bool) -> StoreError {
    match err {
        WriteError::Redis(err) => redis_error(err, mutating),
        WriteError::Unreplicated { acked, wanted } => StoreError::OutcomeUnknown(format!(
            "Redis applied the change on its primary, and only {acked} of the {wanted} replicas required \
             (--redis-min-replicas) had it within {} ms: a failover now could lose it",
            conn::REPLICA_TIMEOUT.as_millis()
        )),
    }
}

/// Whether a failed call may have reached Redis: its connection broke or timed out while it was
/// in flight. A refused connection, no connection to the slot's node, and an error answered by
/// Redis mean it did not (or did nothing).
fn maybe_sent(err: &RedisError) -> bool {
    !err.is_connection_refusal()
        && err.kind() != redis::ErrorKind::ClusterConnectionNotFound
        && (err.is_timeout() || err.is_connection_dropped())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error Redis answers `reply` with (e.g. `-MOVED 3999 127.0.0.1:7001`).
    fn answered(reply: &str) -> RedisError {
        let value = redis::parse_redis_value(format!("{reply}\r\n").as_bytes()).unwrap();
        value.extract_error().unwrap_err()
    }

    #[test]
    fn a_primary_short_of_replicas_refuses_in_words() {
        let err = redis_error(answered("-ALLOT_NOREPLICAS 0 1 7004"), true);
        let StoreError::NotEnoughReplicas(message) = &err else { panic!("{err:?}") };
        assert!(message.contains("(port 7004) has 0 of the 1 replicas"), "{message}");
        assert!(err.to_string().ends_with("nothing was changed"), "{err}");
    }

    #[test]
    fn a_failover_is_said_in_words_and_changed_nothing() {
        for reply in
            ["-MOVED 3999 127.0.0.1:7001", "-CLUSTERDOWN The cluster is down", "-TRYAGAIN later", "-READONLY no"]
        {
            let err = redis_error(answered(reply), true);
            let StoreError::Unavailable(message) = &err else { panic!("{reply}: {err:?}") };
            assert!(message.contains("a replica is taking its place; retry in about a second"), "{reply}: {message}");
            assert!(!message.contains("MOVED") && !message.contains("Moved"), "{reply}: {message}");
            assert!(err.to_string().ends_with("nothing was changed"), "{err}");
        }
    }
}
