//! The handlers of identity and access: API tokens made, listed and revoked through the API, and
//! bindings of roles to users and groups. Every route needs `admin` on the daemon.

use std::time::{Duration, SystemTime};

use allot_api as api;
use allot_store::{ApiTokenRecord, BindingRecord};
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;

use super::{Answer, UNAVAILABLE};
use crate::access::{hash_token, make_token};
use crate::error::{ApiError, ErrorCode};
use crate::extract::{JsonBody, Segments};
use crate::ServerState;

/// The longest a token made through the API may live: ten years.
pub(crate) const MAX_API_TOKEN_TTL_MS: u64 = 10 * 365 * 24 * 3600 * 1000;
const MAX_TTL: Duration = Duration::from_millis(MAX_API_TOKEN_TTL_MS);
/// A name of a token or binding, as the document states it.
pub(crate) const NAME_PATTERN: &str = "^[A-Za-z0-9._-]{1,100}$";
/// A user or group name (with its length, 1 to 255 characters), as the document states it.
pub(crate) const PERSON_PATTERN: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$";

fn now_ms() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A name of a token or binding: 1 to 100 of A-Z, a-z, 0-9, `.`, `_`, `-`.
fn checked_name(what: &str, name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= 100
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    match ok {
        true => Ok(()),
        false => Err(ApiError::of(
            ErrorCode::InvalidName,
            format!("{what} `{name}` is not a name: 1 to 100 of A-Z, a-z, 0-9, `.`, `_`, `-`"),
        )),
    }
}

fn checked_people(users: &[String], groups: &[String]) -> Result<(), ApiError> {
    let bad = users
        .iter()
        .chain(groups)
        .find(|name| name.is_empty() || name.chars().count() > 255 || name.chars().any(char::is_control));
    match bad {
        Some(name) => Err(ApiError::invalid_argument(format!(
            "`{name}` is not a user or group name: 1 to 255 characters, no control characters"
        ))),
        None => Ok(()),
    }
}

/// Reads the store's tokens and bindings again at once: this daemon acts on its own change
/// before answering it (the others within a second).
async fn refreshed(state: &ServerState) {
    if let Some(access) = &state.access {
        if let Err(err) = access.refresh(state.store.as_ref()).await {
            tracing::warn!(error = %err, "cannot read the API tokens again after a change; the next reading will");
        }
    }
}

fn token_wire(record: ApiTokenRecord) -> api::ApiToken {
    api::ApiToken {
        name: record.name,
        user: record.user,
        groups: record.groups,
        created_ms: record.created,
        expires_ms: record.expires,
    }
}

fn binding_wire(record: BindingRecord) -> api::Binding {
    api::Binding { name: record.name, role: record.role, users: record.users, groups: record.groups }
}

/// Makes an API token for a user: the answer shows the token this once; the store keeps its hash.
#[utoipa::path(post, path = "/v1/api-tokens", tag = "access", request_body = api::CreateApiToken,
    responses((status = 201, body = api::CreatedApiToken, description = "made"),
        (status = 400, body = api::ErrorBody, description = "invalid_name, invalid_argument or invalid_json"),
        (status = 409, body = api::ErrorBody, description = "api_token_exists"),
        (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn create_api_token(
    State(state): State<ServerState>,
    JsonBody(body): JsonBody<api::CreateApiToken>,
) -> Result<(StatusCode, axum::Extension<crate::audit::Noted>, Json<api::CreatedApiToken>), ApiError> {
    checked_name("API token", &body.name)?;
    checked_people(std::slice::from_ref(&body.user), &body.groups)?;
    let expires = match body.ttl_ms.map(Duration::from_millis) {
        Some(ttl) if ttl < Duration::from_secs(1) || ttl > MAX_TTL => {
            return Err(ApiError::invalid_argument("ttl_ms must be at least 1000 and at most ten years"));
        }
        Some(ttl) => Some(now_ms() + ttl.as_millis() as u64),
        None => None,
    };
    let token = make_token();
    let record = ApiTokenRecord {
        name: body.name,
        hash: hash_token(&token),
        user: body.user,
        groups: body.groups,
        created: now_ms(),
        expires,
    };
    state.store.add_api_token(record.clone()).await?;
    refreshed(&state).await;
    let made = crate::audit::Noted { made: Some(format!("api-tokens/{}", record.name)), ..Default::default() };
    Ok((
        StatusCode::CREATED,
        axum::Extension(made),
        Json(api::CreatedApiToken { token, api_token: token_wire(record) }),
    ))
}

/// The API tokens made through the API.
#[utoipa::path(get, path = "/v1/api-tokens", tag = "access",
    responses((status = 200, body = api::ApiTokenList), (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn list_api_tokens(State(state): State<ServerState>) -> Answer<api::ApiTokenList> {
    let records = state.store.access_records().await?;
    Ok(Json(api::ApiTokenList { api_tokens: records.tokens.into_iter().map(token_wire).collect() }))
}

/// Revokes an API token: no call is accepted with it any more, and the calls it holds open (long
/// polls, watches) end within a second, on every daemon of the store.
#[utoipa::path(delete, path = "/v1/api-tokens/{name}", tag = "access",
    params(("name" = String, Path, description = "the token's name")),
    responses((status = 200, body = api::ApiToken, description = "revoked"),
        (status = 404, body = api::ErrorBody, description = "api_token_not_found"),
        (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn revoke_api_token(
    State(state): State<ServerState>,
    Segments(name): Segments<String>,
) -> Answer<api::ApiToken> {
    let record = state.store.revoke_api_token(&name).await?;
    refreshed(&state).await;
    Ok(Json(token_wire(record)))
}

/// Gives a role to users and groups (replacing the binding of that name).
#[utoipa::path(put, path = "/v1/bindings/{name}", tag = "access", request_body = api::PutBinding,
    params(("name" = String, Path, description = "the binding's name")),
    responses((status = 200, body = api::Binding),
        (status = 400, body = api::ErrorBody, description = "invalid_name, invalid_argument or invalid_json"),
        (status = 409, body = api::ErrorBody, description = "unknown_role: no role of that name"),
        (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn put_binding(
    State(state): State<ServerState>,
    Segments(name): Segments<String>,
    JsonBody(body): JsonBody<api::PutBinding>,
) -> Answer<api::Binding> {
    checked_name("binding", &name)?;
    checked_people(&body.users, &body.groups)?;
    let known = match &state.access {
        Some(access) => access.has_role(&body.role),
        None => matches!(body.role.as_str(), "admin" | "reader"),
    };
    if !known {
        return Err(ApiError::of(
            ErrorCode::UnknownRole,
            format!(
                "role `{}` is not defined ([auth.roles] of the configuration file; built in: admin, reader)",
                body.role
            ),
        ));
    }
    let record = BindingRecord { name, role: body.role, users: body.users, groups: body.groups };
    state.store.put_binding(record.clone()).await?;
    refreshed(&state).await;
    Ok(Json(binding_wire(record)))
}

/// The bindings made through the API.
#[utoipa::path(get, path = "/v1/bindings", tag = "access",
    responses((status = 200, body = api::BindingList), (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn list_bindings(State(state): State<ServerState>) -> Answer<api::BindingList> {
    let records = state.store.access_records().await?;
    Ok(Json(api::BindingList { bindings: records.bindings.into_iter().map(binding_wire).collect() }))
}

#[utoipa::path(delete, path = "/v1/bindings/{name}", tag = "access",
    params(("name" = String, Path, description = "the binding's name")),
    responses((status = 200, body = api::Binding, description = "removed"),
        (status = 404, body = api::ErrorBody, description = "binding_not_found"),
        (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn remove_binding(
    State(state): State<ServerState>,
    Segments(name): Segments<String>,
) -> Answer<api::Binding> {
    let record = state.store.remove_binding(&name).await?;
    refreshed(&state).await;
    Ok(Json(binding_wire(record)))
}

/// The most checks one `GET /v1/whoami` may ask.
const MAX_CHECKS: usize = 100;

/// Who the caller is, and which of the checks asked (`can=use:namespace:hive:a`, repeated) it
/// may do: what a client (the dashboard) asks before it offers an action.
#[utoipa::path(get, path = "/v1/whoami", tag = "access",
    params(("can" = Option<Vec<String>>, Query, description = "checks, each `PERMISSION:RESOURCE`: a permission (read, use, admin, impersonate) and `namespace:NAME`, `pool:NAME`, `queue:PATH` or `daemon`; at most 100", style = Form, explode = true)),
    responses((status = 200, body = api::WhoAmI), (status = 400, body = api::ErrorBody, description = "invalid_argument: a check that is not one")))]
pub(crate) async fn whoami(
    who: crate::access::Who,
    crate::extract::QueryArgs(pairs): crate::extract::QueryArgs<Vec<(String, String)>>,
) -> Answer<api::WhoAmI> {
    use allot_core::access::{Permission, Resource};
    if pairs.len() > MAX_CHECKS {
        return Err(ApiError::invalid_argument(format!("at most {MAX_CHECKS} checks at once")));
    }
    let mut can = std::collections::BTreeMap::new();
    for (key, check) in pairs {
        if key != "can" {
            return Err(ApiError::invalid_argument(format!("`{key}` is not a parameter: `can` is the only one")));
        }
        let bad = || {
            ApiError::invalid_argument(format!(
                "`{check}` is not a check: PERMISSION:RESOURCE, e.g. `use:namespace:hive:a`, `admin:pool:gpu`, \
             `use:queue:root.a`, `read:daemon`"
            ))
        };
        let (permission, resource) = check.split_once(':').ok_or_else(bad)?;
        let permission = Permission::parse(permission).ok_or_else(bad)?;
        let resource = match resource.split_once(':') {
            Some(("namespace", name)) if !name.is_empty() => Resource::Namespace(name.to_owned()),
            Some(("pool", name)) if !name.is_empty() => Resource::Pool(name.to_owned()),
            Some(("queue", path)) if !path.is_empty() => Resource::Queue(path.to_owned()),
            None if resource == "daemon" => Resource::Daemon,
            _ => return Err(bad()),
        };
        can.insert(check.clone(), who.may(permission, &resource));
    }
    let (user, groups) = match who.principal() {
        Some(principal) => (Some(principal.user.clone()), principal.groups.clone()),
        None => (None, Vec::new()),
    };
    Ok(Json(api::WhoAmI { user, groups, access: who.checks(), can }))
}
