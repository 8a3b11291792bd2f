//! Conversions of namespaces, grants, waiters and sessions between wire types and domain types.

use std::time::Duration;

use allot_core::{
    AllocateRequest, Constraints, Lease, LeaseRequest, NamespaceName, NamespaceView, Refusal, Scope, SessionId, Token,
    WaiterView, MAX_TTL_MS, MAX_UNITS,
};
use allot_store::{Allocation, GrantInfo, SessionInfo};

use crate::error::ApiError;

pub(crate) fn namespace_name(name: &str) -> Result<NamespaceName, ApiError> {
    Ok(NamespaceName::new(name)?)
}

pub(crate) fn token(token: &str) -> Result<Token, ApiError> {
    Ok(Token::new(token)?)
}

pub(crate) fn session_id(id: &str) -> Result<SessionId, ApiError> {
    Ok(SessionId::parse(id)?)
}

/// The shortest lease (of a grant or a session) the API takes: a shorter one would end before a
/// keepalive could reach the daemon. (The core takes any positive TTL; the edge is stricter.)
pub(crate) const MIN_LEASE_MS: u64 = 1000;

/// Checks a lease's TTL as the API takes it: [`MIN_LEASE_MS`] to [`MAX_TTL_MS`].
pub(crate) fn lease_ttl(ttl_ms: u64) -> Result<u64, ApiError> {
    if !(MIN_LEASE_MS..=MAX_TTL_MS).contains(&ttl_ms) {
        return Err(ApiError::invalid_argument(format!(
            "ttl_ms must be between {MIN_LEASE_MS} (1 second) and {MAX_TTL_MS} (30 days), got {ttl_ms}"
        )));
    }
    Ok(ttl_ms)
}

/// Checks a fencing number a release or keepalive names: fencing numbers stay below 2^53.
pub(crate) fn fencing(fencing: Option<u64>) -> Result<Option<u64>, ApiError> {
    match fencing {
        Some(value) if value > MAX_UNITS => Err(ApiError::invalid_argument(format!(
            "fencing must be at most {MAX_UNITS} (fencing numbers stay below 2^53), got {value}"
        ))),
        other => Ok(other),
    }
}

/// An allocate body and its path, as a request, with how long it may wait.
pub(crate) fn allocate_request(
    namespace: &str,
    token_text: &str,
    body: allot_api::Allocate,
    max_wait: Duration,
) -> Result<(AllocateRequest, Duration), ApiError> {
    let lease = match (body.ttl_ms, &body.session) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid_argument(
                "give either ttl_ms (the grant's own lease) or session (the session's lease), not both",
            ))
        }
        (Some(ttl_ms), None) => LeaseRequest::Ttl { ttl_ms: lease_ttl(ttl_ms)? },
        (None, Some(id)) => LeaseRequest::Session(session_id(id)?),
        (None, None) => LeaseRequest::None,
    };
    let wait_ms = body.wait_ms.unwrap_or(0);
    let max_wait_ms = max_wait.as_millis() as u64;
    if wait_ms > max_wait_ms {
        return Err(ApiError::invalid_argument(format!(
            "wait_ms must be at most {max_wait_ms} (this daemon's --max-wait), got {wait_ms}"
        )));
    }
    let scope = match body.scope {
        Some(scope) => Some(Scope::new(&scope.project, &scope.namespace)?),
        None => None,
    };
    let caps = body.caps.unwrap_or_default();
    let request = AllocateRequest {
        namespace: namespace_name(namespace)?,
        token: token(token_text)?,
        units: body.units.unwrap_or(1),
        scope,
        constraints: Constraints { project: caps.project, namespace: caps.namespace },
        lease,
    };
    Ok((request, Duration::from_millis(wait_ms)))
}

pub(crate) fn namespace(view: NamespaceView) -> allot_api::Namespace {
    allot_api::Namespace {
        name: view.name.to_string(),
        quota: view.quota,
        granted_units: view.granted_units,
        grants: view.grants as u64,
        waiters: view.waiters as u64,
        waiting_units: view.waiting_units,
        longest_wait_ms: view.longest_wait_ms,
        next_fencing: view.next_fencing,
    }
}

fn scope(scope: Option<Scope>) -> Option<allot_api::Scope> {
    scope.map(|s| allot_api::Scope { project: s.project.to_string(), namespace: s.namespace.to_string() })
}

fn cap_level(level: allot_core::CapLevel) -> allot_api::CapLevel {
    match level {
        allot_core::CapLevel::Project => allot_api::CapLevel::Project,
        allot_core::CapLevel::Namespace => allot_api::CapLevel::Namespace,
    }
}

pub(crate) fn grant(info: GrantInfo) -> allot_api::Grant {
    let grant = info.grant;
    let (ttl_ms, session) = match grant.lease {
        Lease::None => (None, None),
        Lease::Ttl { ttl_ms, .. } => (Some(ttl_ms), None),
        Lease::Session(id) => (None, Some(id.to_string())),
    };
    allot_api::Grant {
        namespace: grant.namespace.to_string(),
        token: grant.token.to_string(),
        units: grant.units,
        scope: scope(grant.scope),
        fencing: grant.fencing,
        ttl_ms,
        session,
        expires_in_ms: info.expires_in_ms,
        held_by: grant.token.is_scheduler_held().then(|| super::pools::HELD_BY_SCHEDULER.to_owned()),
    }
}

pub(crate) fn allocation(allocation: Allocation) -> allot_api::AllocateResponse {
    match allocation {
        Allocation::Granted { grant: info, existing } => allot_api::AllocateResponse {
            status: allot_api::Status::Granted,
            grant: Some(grant(info)),
            existing,
            cap: None,
            queue: None,
        },
        Allocation::Refused { refusal, place } => {
            let queue =
                place.map(|p| allot_api::QueuePlace { position: p.position as u64, units_ahead: p.units_ahead });
            let (status, cap) = match refusal {
                Refusal::Exhausted => (allot_api::Status::Exhausted, None),
                Refusal::CapExceeded { level, cap, held } => (
                    allot_api::Status::NamespaceQuotaExceeded,
                    Some(allot_api::CapRefusal { level: cap_level(level), cap, held }),
                ),
            };
            allot_api::AllocateResponse { status, grant: None, existing: false, cap, queue }
        }
    }
}

pub(crate) fn waiter(view: WaiterView) -> allot_api::Waiter {
    allot_api::Waiter {
        position: view.place.position as u64,
        units_ahead: view.place.units_ahead,
        token: view.token.to_string(),
        units: view.units,
        scope: scope(view.scope),
        waited_ms: view.waited_ms,
        blocked_by_cap: view.blocked_by_cap.map(cap_level),
    }
}

pub(crate) fn session(info: SessionInfo) -> allot_api::Session {
    allot_api::Session {
        id: info.session.id.to_string(),
        ttl_ms: info.session.ttl_ms,
        expires_in_ms: info.expires_in_ms,
        grants: info
            .session
            .grants
            .into_iter()
            .map(|(namespace, token)| allot_api::GrantRef {
                namespace: namespace.to_string(),
                token: token.to_string(),
            })
            .collect(),
        owner: info.session.owner,
    }
}

// ---- Pools.
