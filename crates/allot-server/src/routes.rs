//! The handlers: one per route, each a thin conversion around one `Store` call.

use allot_api as api;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;

use crate::convert;
use crate::error::ApiError;
use crate::extract::{JsonBody, QueryArgs, Segments};
use crate::AppState;

type Answer<T> = Result<Json<T>, ApiError>;

#[utoipa::path(get, path = "/healthz", tag = "daemon", responses((status = 200, body = api::Health)))]
pub(crate) async fn healthz(State(state): State<AppState>) -> Json<api::Health> {
    Json(api::Health {
        status: "ok".into(),
        backend: state.store.backend().into(),
        version: env!("CARGO_PKG_VERSION").into(),
    })
}

#[utoipa::path(get, path = "/v1/namespaces", tag = "namespaces",
    responses((status = 200, body = api::NamespaceList)))]
pub(crate) async fn list_namespaces(State(state): State<AppState>) -> Answer<api::NamespaceList> {
    let namespaces = state.store.namespaces().await?;
    Ok(Json(api::NamespaceList { namespaces: namespaces.into_iter().map(convert::namespace).collect() }))
}

#[utoipa::path(get, path = "/v1/namespaces/{namespace}", tag = "namespaces",
    params(("namespace" = String, Path, description = "`:`-separated namespace, e.g. `hive:cluster-a`")),
    responses((status = 400, body = api::ErrorBody, description = "invalid input"), (status = 200, body = api::Namespace), (status = 404, body = api::ErrorBody)))]
pub(crate) async fn get_namespace(
    State(state): State<AppState>,
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
    State(state): State<AppState>,
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
    /// Remove the namespace even if it has grants (they end with it).
    #[serde(default)]
    force: bool,
}

#[utoipa::path(delete, path = "/v1/namespaces/{namespace}", tag = "namespaces",
    params(("namespace" = String, Path), RemoveQuery),
    responses((status = 503, body = api::ErrorBody, description = "store_unavailable or shutting_down"), (status = 400, body = api::ErrorBody, description = "invalid input"), (status = 200, body = api::RemovedNamespace), (status = 404, body = api::ErrorBody),
        (status = 409, body = api::ErrorBody, description = "namespace_in_use")))]
pub(crate) async fn remove_namespace(
    State(state): State<AppState>,
    Segments(name): Segments<String>,
    QueryArgs(query): QueryArgs<RemoveQuery>,
) -> Answer<api::RemovedNamespace> {
    let grants_ended = state.store.remove_namespace(convert::namespace_name(&name)?, query.force).await?;
    Ok(Json(api::RemovedNamespace { name, grants_ended: grants_ended as u64 }))
}

#[utoipa::path(get, path = "/v1/namespaces/{namespace}/grants", tag = "grants",
    params(("namespace" = String, Path)),
    responses((status = 400, body = api::ErrorBody, description = "invalid input"), (status = 200, body = api::GrantList), (status = 404, body = api::ErrorBody)))]
pub(crate) async fn list_grants(
    State(state): State<AppState>,
    Segments(name): Segments<String>,
) -> Answer<api::GrantList> {
    let grants = state.store.grants(convert::namespace_name(&name)?).await?;
    Ok(Json(api::GrantList { grants: grants.into_iter().map(convert::grant).collect() }))
}

#[utoipa::path(get, path = "/v1/namespaces/{namespace}/grants/{token}", tag = "grants",
    params(("namespace" = String, Path), ("token" = String, Path)),
    responses((status = 400, body = api::ErrorBody, description = "invalid input"), (status = 200, body = api::Grant), (status = 404, body = api::ErrorBody)))]
pub(crate) async fn get_grant(
    State(state): State<AppState>,
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
    State(state): State<AppState>,
    Segments((name, token)): Segments<(String, String)>,
    JsonBody(body): JsonBody<api::Allocate>,
) -> Answer<api::AllocateResponse> {
    let (request, wait) = convert::allocate_request(&name, &token, body, state.max_wait)?;
    let allocation = state.store.allocate(request, wait).await?;
    Ok(Json(convert::allocation(allocation)))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct FencingQuery {
    /// Refuse the release if the grant's fencing number is not this one.
    fencing: Option<u64>,
}

/// Release: idempotent; says whether anything was released.
#[utoipa::path(delete, path = "/v1/namespaces/{namespace}/grants/{token}", tag = "grants",
    params(("namespace" = String, Path), ("token" = String, Path), FencingQuery),
    responses((status = 503, body = api::ErrorBody, description = "store_unavailable or shutting_down"), (status = 400, body = api::ErrorBody, description = "invalid input"), (status = 200, body = api::ReleaseResponse), (status = 404, body = api::ErrorBody),
        (status = 409, body = api::ErrorBody, description = "stale_fencing")))]
pub(crate) async fn release(
    State(state): State<AppState>,
    Segments((name, token)): Segments<(String, String)>,
    QueryArgs(query): QueryArgs<FencingQuery>,
) -> Answer<api::ReleaseResponse> {
    let released = state
        .store
        .release(convert::namespace_name(&name)?, convert::token(&token)?, convert::fencing(query.fencing)?)
        .await?;
    Ok(Json(api::ReleaseResponse { released: released.is_some(), grant: released.map(convert::grant) }))
}

#[utoipa::path(post, path = "/v1/namespaces/{namespace}/grants/{token}/keepalive", tag = "grants",
    params(("namespace" = String, Path), ("token" = String, Path)),
    request_body(content = Option<api::Keepalive>, description = "optional: an empty body renews whatever the fencing number"),
    responses((status = 503, body = api::ErrorBody, description = "store_unavailable or shutting_down"), (status = 400, body = api::ErrorBody, description = "invalid input"), (status = 200, body = api::Grant), (status = 404, body = api::ErrorBody),
        (status = 409, body = api::ErrorBody, description = "stale_fencing")))]
pub(crate) async fn keepalive_grant(
    State(state): State<AppState>,
    Segments((name, token)): Segments<(String, String)>,
    JsonBody(body): JsonBody<api::Keepalive>,
) -> Answer<api::Grant> {
    let info = state
        .store
        .keepalive_grant(convert::namespace_name(&name)?, convert::token(&token)?, convert::fencing(body.fencing)?)
        .await?;
    Ok(Json(convert::grant(info)))
}

#[utoipa::path(get, path = "/v1/namespaces/{namespace}/waiters", tag = "grants",
    params(("namespace" = String, Path)),
    responses((status = 400, body = api::ErrorBody, description = "invalid input"), (status = 200, body = api::WaiterList), (status = 404, body = api::ErrorBody)))]
pub(crate) async fn list_waiters(
    State(state): State<AppState>,
    Segments(name): Segments<String>,
) -> Answer<api::WaiterList> {
    let waiters = state.store.waiters(convert::namespace_name(&name)?).await?;
    Ok(Json(api::WaiterList { waiters: waiters.into_iter().map(convert::waiter).collect() }))
}

#[utoipa::path(post, path = "/v1/sessions", tag = "sessions", request_body = api::OpenSession,
    responses((status = 503, body = api::ErrorBody, description = "store_unavailable or shutting_down"), (status = 201, body = api::Session), (status = 400, body = api::ErrorBody)))]
pub(crate) async fn open_session(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<api::OpenSession>,
) -> Result<(StatusCode, Json<api::Session>), ApiError> {
    let info = state.store.open_session(convert::lease_ttl(body.ttl_ms)?).await?;
    Ok((StatusCode::CREATED, Json(convert::session(info))))
}

#[utoipa::path(get, path = "/v1/sessions", tag = "sessions", responses((status = 200, body = api::SessionList)))]
pub(crate) async fn list_sessions(State(state): State<AppState>) -> Answer<api::SessionList> {
    let sessions = state.store.sessions().await?;
    Ok(Json(api::SessionList { sessions: sessions.into_iter().map(convert::session).collect() }))
}

#[utoipa::path(get, path = "/v1/sessions/{id}", tag = "sessions", params(("id" = String, Path)),
    responses((status = 400, body = api::ErrorBody, description = "invalid input"), (status = 200, body = api::Session), (status = 404, body = api::ErrorBody)))]
pub(crate) async fn get_session(State(state): State<AppState>, Segments(id): Segments<String>) -> Answer<api::Session> {
    let info = state.store.session(convert::session_id(&id)?).await?;
    Ok(Json(convert::session(info)))
}

/// One keepalive renews every grant of the session.
#[utoipa::path(post, path = "/v1/sessions/{id}/keepalive", tag = "sessions", params(("id" = String, Path)),
    responses((status = 503, body = api::ErrorBody, description = "store_unavailable or shutting_down"), (status = 400, body = api::ErrorBody, description = "invalid input"), (status = 200, body = api::Session), (status = 404, body = api::ErrorBody)))]
pub(crate) async fn keepalive_session(
    State(state): State<AppState>,
    Segments(id): Segments<String>,
) -> Answer<api::Session> {
    let info = state.store.keepalive_session(convert::session_id(&id)?).await?;
    Ok(Json(convert::session(info)))
}

/// Closes the session and releases its grants.
#[utoipa::path(delete, path = "/v1/sessions/{id}", tag = "sessions", params(("id" = String, Path)),
    responses((status = 503, body = api::ErrorBody, description = "store_unavailable or shutting_down"), (status = 400, body = api::ErrorBody, description = "invalid input"), (status = 200, body = api::Session), (status = 404, body = api::ErrorBody)))]
pub(crate) async fn close_session(
    State(state): State<AppState>,
    Segments(id): Segments<String>,
) -> Answer<api::Session> {
    let info = state.store.close_session(convert::session_id(&id)?).await?;
    Ok(Json(convert::session(info)))
}
