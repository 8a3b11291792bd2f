//! The handlers of the token quotas: namespaces, grants, waiters and sessions; one per route,
//! each a thin conversion around one `QuotaStore` call.

use std::future::Future;

use crate::access::{withdrawn, Caller, HeldToken, Who};
use allot_api as api;
use allot_core::access::{Permission, Resource};
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;

use super::Answer;
use crate::convert::quotas as convert;
use crate::error::ApiError;
use crate::extract::{JsonBody, QueryArgs, Segments};
use crate::page::{cursor, visible_page, PageQuery};
use crate::ServerState;

/// A page of the namespaces, ordered by name.
#[utoipa::path(get, path = "/v1/namespaces", tag = "namespaces", params(PageQuery),
    responses((status = 200, body = api::NamespaceList), (status = 400, body = api::ErrorBody, description = "invalid_argument (limit) or invalid_cursor")))]
pub(crate) async fn list_namespaces(
    State(state): State<ServerState>,
    who: crate::access::Who,
    QueryArgs(query): QueryArgs<PageQuery>,
) -> Answer<api::NamespaceList> {
    let visible = |item: &allot_core::NamespaceView| who.may_read(&Resource::Namespace(item.name.to_string()));
    let store = &state.store;
    let page = visible_page(query.request()?, |page| store.namespaces(page), visible, |item| item.name.clone()).await?;
    Ok(Json(api::NamespaceList {
        namespaces: page.items.into_iter().map(convert::namespace).collect(),
        next_cursor: cursor(page.next),
    }))
}

#[utoipa::path(get, path = "/v1/namespaces/{namespace}", tag = "namespaces",
    params(("namespace" = String, Path, description = "`:`-separated namespace, e.g. `hive:cluster-a`")),
    responses((status = 400, body = api::ErrorBody, description = "invalid input"), (status = 200, body = api::Namespace), (status = 404, body = api::ErrorBody)))]
pub(crate) async fn get_namespace(
    State(state): State<ServerState>,
    Segments(name): Segments<String>,
) -> Answer<api::Namespace> {
    let view = state.store.namespace(convert::namespace_name(&name)?).await?;
    Ok(Json(convert::namespace(view)))
}

#[utoipa::path(put, path = "/v1/namespaces/{namespace}", tag = "namespaces",
    params(("namespace" = String, Path)),
    request_body = api::PutNamespace,
    responses((status = 503, body = api::ErrorBody, description = "store_unavailable or shutting_down"), (status = 201, body = api::PutNamespaceResponse, description = "created"),
        (status = 200, body = api::PutNamespaceResponse, description = "quota changed"),
        (status = 400, body = api::ErrorBody)))]
pub(crate) async fn put_namespace(
    State(state): State<ServerState>,
    Segments(name): Segments<String>,
    JsonBody(body): JsonBody<api::PutNamespace>,
) -> Result<(StatusCode, Json<api::PutNamespaceResponse>), ApiError> {
    let (created, view) = state.store.put_namespace(convert::namespace_name(&name)?, body.quota).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(api::PutNamespaceResponse { created, namespace: convert::namespace(view) })))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct RemoveQuery {
    /// Remove the namespace even if clients hold grants in it (they end with it). Grants allot
    /// holds for tasks' placements or runs are never ended this way (`held_by_scheduler`).
    #[serde(default)]
    force: bool,
}

#[utoipa::path(delete, path = "/v1/namespaces/{namespace}", tag = "namespaces",
    params(("namespace" = String, Path), RemoveQuery),
    responses((status = 503, body = api::ErrorBody, description = "store_unavailable or shutting_down"), (status = 400, body = api::ErrorBody, description = "invalid input"), (status = 200, body = api::RemovedNamespace), (status = 404, body = api::ErrorBody),
        (status = 409, body = api::ErrorBody, description = "namespace_in_use (clients hold grants; remove it with force), or held_by_scheduler (tasks hold grants, with force or not)")))]
pub(crate) async fn remove_namespace(
    State(state): State<ServerState>,
    Segments(name): Segments<String>,
    QueryArgs(query): QueryArgs<RemoveQuery>,
) -> Answer<api::RemovedNamespace> {
    let grants_ended = state.store.remove_namespace(convert::namespace_name(&name)?, query.force).await?;
    Ok(Json(api::RemovedNamespace { name, grants_ended: grants_ended as u64 }))
}

/// A page of the namespace's grants, ordered by token.
#[utoipa::path(get, path = "/v1/namespaces/{namespace}/grants", tag = "grants",
    params(("namespace" = String, Path), PageQuery),
    responses((status = 400, body = api::ErrorBody, description = "invalid_name, invalid_argument (limit) or invalid_cursor"), (status = 200, body = api::GrantList), (status = 404, body = api::ErrorBody)))]
pub(crate) async fn list_grants(
    State(state): State<ServerState>,
    Segments(name): Segments<String>,
    QueryArgs(query): QueryArgs<PageQuery>,
) -> Answer<api::GrantList> {
    let page = state.store.grants(convert::namespace_name(&name)?, query.request()?).await?;
    Ok(Json(api::GrantList {
        grants: page.items.into_iter().map(convert::grant).collect(),
        next_cursor: cursor(page.next),
    }))
}

#[utoipa::path(get, path = "/v1/namespaces/{namespace}/grants/{token}", tag = "grants",
    params(("namespace" = String, Path), ("token" = String, Path)),
    responses((status = 400, body = api::ErrorBody, description = "invalid input"), (status = 200, body = api::Grant), (status = 404, body = api::ErrorBody)))]
pub(crate) async fn get_grant(
    State(state): State<ServerState>,
    Segments((name, token)): Segments<(String, String)>,
) -> Answer<api::Grant> {
    let info = state.store.grant(convert::namespace_name(&name)?, convert::token(&token)?).await?;
    Ok(Json(convert::grant(info)))
}

/// Allocate: idempotent per token. The answer is 200 whatever the status; errors are 4xx/5xx.
#[utoipa::path(put, path = "/v1/namespaces/{namespace}/grants/{token}", tag = "grants",
    params(("namespace" = String, Path), ("token" = String, Path, description = "the caller's idempotency key")),
    request_body(content = Option<api::Allocate>, description = "optional: an empty body asks for 1 unit, no scope, no lease"),
    responses((status = 200, body = api::AllocateResponse, description = "Granted, Exhausted or NamespaceQuotaExceeded"),
        (status = 400, body = api::ErrorBody), (status = 404, body = api::ErrorBody),
        (status = 409, body = api::ErrorBody, description = "token_conflict or units_exceed_quota"),
        (status = 503, body = api::ErrorBody)))]
pub(crate) async fn allocate(
    State(state): State<ServerState>,
    held: Option<axum::Extension<HeldToken>>,
    caller: Option<axum::Extension<Caller>>,
    Segments((name, token)): Segments<(String, String)>,
    JsonBody(body): JsonBody<api::Allocate>,
) -> Answer<api::AllocateResponse> {
    let caller = caller.map_or(Caller::Anyone, |c| c.0);
    allocate_grant(&state, &name, &token, body, &caller, held.map(|e| e.0)).await
}

/// What [`allocate`] does, once its path and body are read (the hot path calls it too).
///
/// Not an `async fn`: the request is checked at once, and the future returned holds only the
/// store's call while it waits (an `async fn` would keep its arguments beside it; a daemon may
/// hold 100,000 waiting calls).
pub(crate) fn allocate_grant<'a>(
    state: &'a ServerState,
    name: &str,
    token: &str,
    body: api::Allocate,
    caller: &'a Caller,
    held: Option<HeldToken>,
) -> impl Future<Output = Answer<api::AllocateResponse>> + Send + 'a {
    use futures_util::future::{ready, Either};
    let (request, wait) = match convert::allocate_request(name, token, body, state.max_wait) {
        Ok(converted) => converted,
        // Boxed: the answer is large, and only a refused call pays for it.
        Err(err) => return Either::Left(Box::pin(ready(Err(err)))),
    };
    if matches!(request.lease, allot_core::LeaseRequest::Session(_)) || ends_if_withdrawn(state, caller, wait) {
        return Either::Right(Either::Right(Box::pin(allocate_checked(state, request, wait, caller, held))));
    }
    let allocation = state.store.allocate(request, wait);
    Either::Right(Either::Left(async move { Ok(Json(convert::allocation(allocation.await?))) }))
}

/// Whether an allocate call ends, as its caller leaving would, when its token is revoked or
/// expires, or its caller loses `use` on the namespace: one that waits, under access control.
fn ends_if_withdrawn(state: &ServerState, caller: &Caller, wait: std::time::Duration) -> bool {
    !wait.is_zero() && state.access.is_some() && *caller != Caller::Anyone
}

/// [`allocate_grant`] for the calls that need more than the store: a grant joining a session
/// (only the caller's own), and a wait that ends if access is withdrawn meanwhile.
async fn allocate_checked(
    state: &ServerState,
    request: allot_core::AllocateRequest,
    wait: std::time::Duration,
    caller: &Caller,
    held: Option<HeldToken>,
) -> Answer<api::AllocateResponse> {
    if let allot_core::LeaseRequest::Session(id) = request.lease {
        own_session(state, caller, id).await?;
    }
    if !ends_if_withdrawn(state, caller, wait) {
        return Ok(Json(convert::allocation(state.store.allocate(request, wait).await?)));
    }
    let namespace = Resource::Namespace(request.namespace.to_string());
    let still = move |policy: &allot_core::access::Policy, principal: &allot_core::access::Principal| {
        policy.check(principal, Permission::Use, namespace.clone())
    };
    tokio::select! {
        allocation = state.store.allocate(request, wait) => Ok(Json(convert::allocation(allocation?))),
        ended = withdrawn(state.access.clone(), Some(caller.clone()), held, still) => Err(ended.into()),
    }
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct FencingQuery {
    /// Refuse the release if the grant's fencing number is not this one.
    pub(crate) fencing: Option<u64>,
}

/// Release: idempotent; says whether anything was released.
#[utoipa::path(delete, path = "/v1/namespaces/{namespace}/grants/{token}", tag = "grants",
    params(("namespace" = String, Path), ("token" = String, Path), FencingQuery),
    responses((status = 503, body = api::ErrorBody, description = "store_unavailable or shutting_down"), (status = 400, body = api::ErrorBody, description = "invalid input"), (status = 200, body = api::ReleaseResponse), (status = 404, body = api::ErrorBody),
        (status = 409, body = api::ErrorBody, description = "stale_fencing")))]
pub(crate) async fn release(
    State(state): State<ServerState>,
    Segments((name, token)): Segments<(String, String)>,
    QueryArgs(query): QueryArgs<FencingQuery>,
) -> Answer<api::ReleaseResponse> {
    release_grant(&state, &name, &token, query.fencing).await
}

/// What [`release`] does, once its path and query are read (the hot path calls it too). Not an
/// `async fn`, as [`allocate_grant`].
pub(crate) fn release_grant<'a>(
    state: &'a ServerState,
    name: &str,
    token: &str,
    fencing: Option<u64>,
) -> impl Future<Output = Answer<api::ReleaseResponse>> + Send + 'a {
    use futures_util::future::{ready, Either};
    let checked =
        (|| Ok::<_, ApiError>((convert::namespace_name(name)?, convert::token(token)?, convert::fencing(fencing)?)))();
    let (namespace, token, fencing) = match checked {
        Ok(checked) => checked,
        Err(err) => return Either::Left(Box::pin(ready(Err(err)))),
    };
    let released = state.store.release(namespace, token, fencing);
    Either::Right(async move {
        let released = released.await?;
        Ok(Json(api::ReleaseResponse { released: released.is_some(), grant: released.map(convert::grant) }))
    })
}

#[utoipa::path(post, path = "/v1/namespaces/{namespace}/grants/{token}/keepalive", tag = "grants",
    params(("namespace" = String, Path), ("token" = String, Path)),
    request_body(content = Option<api::Keepalive>, description = "optional: an empty body renews whatever the fencing number"),
    responses((status = 503, body = api::ErrorBody, description = "store_unavailable or shutting_down"), (status = 400, body = api::ErrorBody, description = "invalid input"), (status = 200, body = api::Grant), (status = 404, body = api::ErrorBody),
        (status = 409, body = api::ErrorBody, description = "stale_fencing")))]
pub(crate) async fn keepalive_grant(
    State(state): State<ServerState>,
    Segments((name, token)): Segments<(String, String)>,
    JsonBody(body): JsonBody<api::Keepalive>,
) -> Answer<api::Grant> {
    let info = state
        .store
        .keepalive_grant(convert::namespace_name(&name)?, convert::token(&token)?, convert::fencing(body.fencing)?)
        .await?;
    Ok(Json(convert::grant(info)))
}

/// A page of the namespace's waiters, head first. The queue moves while it is paged: the next
/// page holds the waiters that arrived after the last one of this page and still wait, with
/// their places at that read; waiters that arrive meanwhile are at the end.
#[utoipa::path(get, path = "/v1/namespaces/{namespace}/waiters", tag = "grants",
    params(("namespace" = String, Path), PageQuery),
    responses((status = 400, body = api::ErrorBody, description = "invalid_name, invalid_argument (limit) or invalid_cursor"), (status = 200, body = api::WaiterList), (status = 404, body = api::ErrorBody)))]
pub(crate) async fn list_waiters(
    State(state): State<ServerState>,
    Segments(name): Segments<String>,
    QueryArgs(query): QueryArgs<PageQuery>,
) -> Answer<api::WaiterList> {
    let page = state.store.waiters(convert::namespace_name(&name)?, query.request()?).await?;
    Ok(Json(api::WaiterList {
        waiters: page.items.into_iter().map(convert::waiter).collect(),
        next_cursor: cursor(page.next),
    }))
}

#[utoipa::path(post, path = "/v1/sessions", tag = "sessions", request_body = api::OpenSession,
    responses((status = 503, body = api::ErrorBody, description = "store_unavailable or shutting_down"), (status = 201, body = api::Session), (status = 400, body = api::ErrorBody)))]
pub(crate) async fn open_session(
    State(state): State<ServerState>,
    who: Who,
    JsonBody(body): JsonBody<api::OpenSession>,
) -> Result<(StatusCode, axum::Extension<crate::audit::Noted>, Json<api::Session>), ApiError> {
    let owner = who.principal().map(|principal| principal.user.clone());
    let info = state.store.open_session(convert::lease_ttl(body.ttl_ms)?, owner).await?;
    let made = crate::audit::Noted { made: Some(format!("sessions/{}", info.session.id)), ..Default::default() };
    Ok((StatusCode::CREATED, axum::Extension(made), Json(convert::session(info))))
}

/// A page of the open sessions, ordered by id.
#[utoipa::path(get, path = "/v1/sessions", tag = "sessions", params(PageQuery),
    responses((status = 200, body = api::SessionList), (status = 400, body = api::ErrorBody, description = "invalid_argument (limit) or invalid_cursor")))]
pub(crate) async fn list_sessions(
    State(state): State<ServerState>,
    who: Who,
    QueryArgs(query): QueryArgs<PageQuery>,
) -> Answer<api::SessionList> {
    // The caller's own sessions; an admin of the daemon sees all.
    let everyone = who.may(Permission::Admin, &Resource::Daemon);
    let visible = |info: &allot_store::SessionInfo| everyone || owns(&who, &info.session);
    let store = &state.store;
    let id = |info: &allot_store::SessionInfo| info.session.id;
    let page = visible_page(query.request()?, |page| store.sessions(page), visible, id).await?;
    Ok(Json(api::SessionList {
        sessions: page.items.into_iter().map(convert::session).collect(),
        next_cursor: cursor(page.next),
    }))
}

#[utoipa::path(get, path = "/v1/sessions/{id}", tag = "sessions", params(("id" = String, Path)),
    responses((status = 400, body = api::ErrorBody, description = "invalid input"), (status = 200, body = api::Session), (status = 404, body = api::ErrorBody)))]
pub(crate) async fn get_session(
    State(state): State<ServerState>,
    who: Who,
    Segments(id): Segments<String>,
) -> Answer<api::Session> {
    let info = state.store.session(convert::session_id(&id)?).await?;
    if !owns(&who, &info.session) && !who.may(Permission::Admin, &Resource::Daemon) {
        return Err(not_yours(&who.principal().map_or_else(String::new, |p| p.user.clone()), info.session.id));
    }
    Ok(Json(convert::session(info)))
}

/// One keepalive renews every grant of the session.
#[utoipa::path(post, path = "/v1/sessions/{id}/keepalive", tag = "sessions", params(("id" = String, Path)),
    responses((status = 503, body = api::ErrorBody, description = "store_unavailable or shutting_down"), (status = 400, body = api::ErrorBody, description = "invalid input"), (status = 200, body = api::Session), (status = 404, body = api::ErrorBody)))]
pub(crate) async fn keepalive_session(
    State(state): State<ServerState>,
    caller: Option<axum::Extension<Caller>>,
    Segments(id): Segments<String>,
) -> Answer<api::Session> {
    let id = convert::session_id(&id)?;
    own_session(&state, &caller.map_or(Caller::Anyone, |c| c.0), id).await?;
    let info = state.store.keepalive_session(id).await?;
    Ok(Json(convert::session(info)))
}

/// Closes the session and releases its grants.
#[utoipa::path(delete, path = "/v1/sessions/{id}", tag = "sessions", params(("id" = String, Path)),
    responses((status = 503, body = api::ErrorBody, description = "store_unavailable or shutting_down"), (status = 400, body = api::ErrorBody, description = "invalid input"), (status = 200, body = api::Session), (status = 404, body = api::ErrorBody)))]
pub(crate) async fn close_session(
    State(state): State<ServerState>,
    caller: Option<axum::Extension<Caller>>,
    Segments(id): Segments<String>,
) -> Answer<api::Session> {
    let id = convert::session_id(&id)?;
    own_session(&state, &caller.map_or(Caller::Anyone, |c| c.0), id).await?;
    let info = state.store.close_session(id).await?;
    Ok(Json(convert::session(info)))
}

/// Whether the caller opened `session` (everyone does without access configured).
fn owns(who: &Who, session: &allot_core::Session) -> bool {
    who.principal().is_none_or(|principal| session.owner.as_ref() == Some(&principal.user))
}

/// The refusal of a call on another user's session.
fn not_yours(user: &str, id: allot_core::SessionId) -> ApiError {
    ApiError::of(
        crate::error::ErrorCode::Forbidden,
        format!("session `{id}` is not user `{user}`'s: only the user that opened it, or an admin of the daemon, may use it"),
    )
}

/// Refuses a caller that neither opened session `id` nor is an admin of the daemon (a session
/// that does not exist is left to the store to answer).
pub(crate) async fn own_session(
    state: &ServerState,
    caller: &Caller,
    id: allot_core::SessionId,
) -> Result<(), ApiError> {
    let (Caller::Principal(principal), Some(access)) = (caller, state.access.as_deref()) else { return Ok(()) };
    if access.policy().allows(principal, Permission::Admin, &Resource::Daemon) {
        return Ok(());
    }
    match state.store.session(id).await {
        Ok(info) if info.session.owner.as_ref() != Some(&principal.user) => Err(not_yours(&principal.user, id)),
        _ => Ok(()),
    }
}
