//! The handlers of leased resource pools: one per route, each a thin conversion around one
//! `Store` call.

use allot_api as api;
use allot_core::pools::{AllocState, CordonOrder, OFFER_ID};
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;

use super::Answer;
use crate::convert::pools as convert;
use crate::error::ApiError;
use crate::extract::{JsonBody, QueryArgs, Segments};
use crate::page::{cursor, visible_page, PageQuery};
use crate::ServerState;

/// A page of the pools, ordered by name.
#[utoipa::path(get, path = "/v1/pools", tag = "pools", params(PageQuery), responses((status = 400, body = api::ErrorBody, description = "invalid_argument (limit) or invalid_cursor"), (status = 503, body = api::ErrorBody, description = "store_unavailable, store_outcome_unknown, not_enough_replicas or shutting_down"), (status = 200, body = api::PoolList)))]
pub(crate) async fn list_pools(
    State(state): State<ServerState>,
    who: crate::access::Who,
    QueryArgs(query): QueryArgs<PageQuery>,
) -> Answer<api::PoolList> {
    let visible =
        |item: &allot_core::pools::PoolView| who.may_read(&allot_core::access::Resource::Pool(item.name.to_string()));
    let store = &state.store;
    let page = visible_page(query.request()?, |page| store.pools(page), visible, |item| item.name.clone()).await?;
    let leases = state.store.executors().await?;
    Ok(Json(api::PoolList {
        pools: page.items.into_iter().map(|view| convert::pool(view, Some(&leases), state.store.now())).collect(),
        next_cursor: cursor(page.next),
    }))
}

#[utoipa::path(get, path = "/v1/pools/{pool}", tag = "pools",
    params(("pool" = String, Path, description = "the pool's name: 1 to 255 bytes, no control characters, no `/`")),
    responses((status = 400, body = api::ErrorBody, description = "invalid_name, invalid_resources, invalid_argument or invalid_json"), (status = 503, body = api::ErrorBody, description = "store_unavailable, store_outcome_unknown, not_enough_replicas or shutting_down"), (status = 200, body = api::Pool), (status = 404, body = api::ErrorBody, description = "pool_not_found")))]
pub(crate) async fn get_pool(State(state): State<ServerState>, Segments(name): Segments<String>) -> Answer<api::Pool> {
    let view = state.store.pool(convert::pool_name(&name)?).await?;
    Ok(Json(convert::pool(view, Some(&state.store.executors().await?), state.store.now())))
}

#[utoipa::path(put, path = "/v1/pools/{pool}", tag = "pools",
    params(("pool" = String, Path, description = "the pool's name: 1 to 255 bytes, no control characters, no `/`")),
    request_body = api::PutPool,
    responses((status = 503, body = api::ErrorBody, description = "store_unavailable, store_outcome_unknown, not_enough_replicas or shutting_down"), (status = 201, body = api::PutPoolResponse, description = "created"),
        (status = 200, body = api::PutPoolResponse, description = "capacity changed, or a stopped pool started"),
        (status = 400, body = api::ErrorBody, description = "invalid_name or invalid_resources")))]
pub(crate) async fn put_pool(
    State(state): State<ServerState>,
    Segments(name): Segments<String>,
    JsonBody(body): JsonBody<api::PutPool>,
) -> Result<(StatusCode, Json<api::PutPoolResponse>), ApiError> {
    let capacity = convert::resources(&body.capacity)?;
    if capacity.is_empty() {
        return Err(ApiError::invalid_argument(
            "a pool's capacity must name some resources above zero, e.g. `cpu=4,mem=16GiB`; \
             to take a pool out of service use stop-if-idle or DELETE",
        ));
    }
    let pool = convert::pool_name(&name)?;
    // Refused before anything changes: a label allot keeps, a task type that cannot be.
    convert::pool_labels(body.labels.clone(), body.plugins.clone(), &Default::default())?;
    let occupied = body.occupied.as_deref().map(convert::resources).transpose()?;
    let (created, mut view) = state.store.put_pool(pool.clone(), capacity).await?;
    if let Some(labels) = convert::pool_labels(body.labels, body.plugins, &view.labels)? {
        view = state.store.label_pool(pool.clone(), labels).await?;
    }
    if let Some(occupied) = occupied.filter(|o| *o != view.occupied) {
        view = state.store.occupy_pool(pool, occupied).await?;
    }
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    let pool = convert::pool(view, Some(&state.store.executors().await?), state.store.now());
    Ok((status, Json(api::PutPoolResponse { created, pool })))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct RemovePoolQuery {
    /// Remove the pool even if it has allocs (they end with it).
    #[serde(default)]
    force: bool,
}

#[utoipa::path(delete, path = "/v1/pools/{pool}", tag = "pools",
    params(("pool" = String, Path), RemovePoolQuery),
    responses((status = 400, body = api::ErrorBody, description = "invalid_name, invalid_resources, invalid_argument or invalid_json"), (status = 503, body = api::ErrorBody, description = "store_unavailable, store_outcome_unknown, not_enough_replicas or shutting_down"), (status = 200, body = api::RemovedPool), (status = 404, body = api::ErrorBody),
        (status = 409, body = api::ErrorBody, description = "pool_in_use")))]
pub(crate) async fn remove_pool(
    State(state): State<ServerState>,
    Segments(name): Segments<String>,
    QueryArgs(query): QueryArgs<RemovePoolQuery>,
) -> Answer<api::RemovedPool> {
    let ended = state.store.remove_pool(convert::pool_name(&name)?, query.force).await?;
    Ok(Json(api::RemovedPool { name, allocs_ended: ended as u64 }))
}

/// The pool's offers: one holding everything free, or none.
#[utoipa::path(get, path = "/v1/pools/{pool}/offers", tag = "pools",
    params(("pool" = String, Path, description = "the pool's name: 1 to 255 bytes, no control characters, no `/`")),
    responses((status = 400, body = api::ErrorBody, description = "invalid_name, invalid_resources, invalid_argument or invalid_json"), (status = 503, body = api::ErrorBody, description = "store_unavailable, store_outcome_unknown, not_enough_replicas or shutting_down"), (status = 200, body = api::OfferList), (status = 404, body = api::ErrorBody)))]
pub(crate) async fn list_offers(
    State(state): State<ServerState>,
    Segments(name): Segments<String>,
) -> Answer<api::OfferList> {
    let offer = state.store.offer(convert::pool_name(&name)?).await?;
    Ok(Json(api::OfferList { offers: offer.into_iter().map(convert::offer).collect() }))
}

/// One offer of the pool, by its id [Reflow's `Pool.Offer(id)`]: what is free now. A pool that
/// has nothing free has no offer (`offer_not_found`), as its list of offers is then empty.
#[utoipa::path(get, path = "/v1/pools/{pool}/offers/{offer}", tag = "pools",
    params(("pool" = String, Path), ("offer" = String, Path, description = "the offer's id (`1`)")),
    responses((status = 200, body = api::Offer), (status = 400, body = api::ErrorBody, description = "invalid_name"),
        (status = 404, body = api::ErrorBody, description = "pool_not_found or offer_not_found: no such offer, or the pool has nothing free now"),
        (status = 503, body = api::ErrorBody, description = "store_unavailable, store_outcome_unknown, not_enough_replicas or shutting_down")))]
pub(crate) async fn get_offer(
    State(state): State<ServerState>,
    Segments((name, offer)): Segments<(String, String)>,
) -> Answer<api::Offer> {
    let pool = convert::pool_name(&name)?;
    let found = state.store.offer(pool.clone()).await?.filter(|_| offer == OFFER_ID);
    found.map(|found| Json(convert::offer(found))).ok_or_else(|| {
        let message = if offer == OFFER_ID {
            format!("pool `{pool}` has no offer now: nothing of it is free (see GET /v1/pools/{{pool}}/offers)")
        } else {
            format!("pool `{pool}` has no offer `{offer}`: its one offer is `{OFFER_ID}` (see GET /v1/pools/{{pool}}/offers)")
        };
        ApiError::new(StatusCode::NOT_FOUND, "offer_not_found", message)
    })
}

/// Accepts an offer: makes an alloc with at least `min` and at most `max`.
#[utoipa::path(post, path = "/v1/pools/{pool}/offers/{offer}", tag = "pools",
    params(("pool" = String, Path), ("offer" = String, Path, description = "the offer's id (`1`)")),
    request_body = api::Accept,
    responses((status = 503, body = api::ErrorBody, description = "store_unavailable, store_outcome_unknown, not_enough_replicas or shutting_down"), (status = 201, body = api::Alloc),
        (status = 409, body = api::ErrorBody, description = "offer_expired: the room is gone, try another offer; pool_stopped"),
        (status = 400, body = api::ErrorBody, description = "invalid_resources or invalid_argument"),
        (status = 404, body = api::ErrorBody, description = "pool_not_found")))]
pub(crate) async fn accept(
    State(state): State<ServerState>,
    Segments((name, offer)): Segments<(String, String)>,
    JsonBody(body): JsonBody<api::Accept>,
) -> Result<(StatusCode, Json<api::Alloc>), ApiError> {
    let pool = convert::pool_name(&name)?;
    let request = convert::alloc_request(body)?;
    if offer != OFFER_ID {
        // A pool has one offer, `1`; an unknown pool is still `pool_not_found`.
        state.store.pool(pool.clone()).await?;
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "offer_not_found",
            format!("pool `{pool}` has no offer `{offer}`: its one offer is `{OFFER_ID}` (see GET /v1/pools/{{pool}}/offers)"),
        ));
    }
    let alloc = state.store.accept(pool, request).await?;
    Ok((StatusCode::CREATED, Json(convert::alloc(alloc, None, state.store.now()))))
}

/// A page of the pool's live allocs, ordered by id.
#[utoipa::path(get, path = "/v1/pools/{pool}/allocs", tag = "pools",
    params(("pool" = String, Path, description = "the pool's name: 1 to 255 bytes, no control characters, no `/`"), PageQuery),
    responses((status = 400, body = api::ErrorBody, description = "invalid_name, invalid_argument (limit) or invalid_cursor"), (status = 503, body = api::ErrorBody, description = "store_unavailable, store_outcome_unknown, not_enough_replicas or shutting_down"), (status = 200, body = api::AllocList), (status = 404, body = api::ErrorBody)))]
pub(crate) async fn list_allocs(
    State(state): State<ServerState>,
    Segments(name): Segments<String>,
    QueryArgs(query): QueryArgs<PageQuery>,
) -> Answer<api::AllocList> {
    let page = state.store.allocs(convert::pool_name(&name)?, query.request()?).await?;
    let now = state.store.now();
    Ok(Json(api::AllocList {
        allocs: page.items.into_iter().map(|a| convert::alloc(a, None, now)).collect(),
        next_cursor: cursor(page.next),
    }))
}

/// Inspects an alloc: 200 while it lives; 410 Gone once it has ended, with its record (kept for
/// a while after it ends, saying why it ended).
#[utoipa::path(get, path = "/v1/pools/{pool}/allocs/{alloc}", tag = "pools",
    params(("pool" = String, Path), ("alloc" = String, Path, description = "16 hex digits")),
    responses((status = 400, body = api::ErrorBody, description = "invalid_name, invalid_resources, invalid_argument or invalid_json"), (status = 503, body = api::ErrorBody, description = "store_unavailable, store_outcome_unknown, not_enough_replicas or shutting_down"), (status = 200, body = api::Alloc, description = "a live alloc"),
        (status = 410, body = api::Alloc, description = "an ended alloc's record: `ended` says why"),
        (status = 404, body = api::ErrorBody, description = "alloc_not_found")))]
pub(crate) async fn get_alloc(
    State(state): State<ServerState>,
    Segments((name, id)): Segments<(String, String)>,
) -> Result<(StatusCode, Json<api::Alloc>), ApiError> {
    let found = state.store.inspect_alloc(convert::pool_name(&name)?, convert::alloc_id(&id)?).await?;
    let status = if matches!(found, AllocState::Live(_)) { StatusCode::OK } else { StatusCode::GONE };
    Ok((status, Json(convert::alloc_state(found, state.store.now()))))
}

/// Frees an alloc; freeing an ended alloc answers its record again.
#[utoipa::path(delete, path = "/v1/pools/{pool}/allocs/{alloc}", tag = "pools",
    params(("pool" = String, Path), ("alloc" = String, Path)),
    responses((status = 400, body = api::ErrorBody, description = "invalid_name, invalid_resources, invalid_argument or invalid_json"), (status = 503, body = api::ErrorBody, description = "store_unavailable, store_outcome_unknown, not_enough_replicas or shutting_down"), (status = 200, body = api::Alloc), (status = 404, body = api::ErrorBody)))]
pub(crate) async fn free_alloc(
    State(state): State<ServerState>,
    Segments((name, id)): Segments<(String, String)>,
) -> Answer<api::Alloc> {
    let ended = state.store.free_alloc(convert::pool_name(&name)?, convert::alloc_id(&id)?).await?;
    Ok(Json(convert::ended_alloc(ended, state.store.now())))
}

/// Changes the labels and metadata its owner attaches to a live alloc (what runs in it, its
/// results); what the body does not name is kept, and the lease is not renewed.
#[utoipa::path(patch, path = "/v1/pools/{pool}/allocs/{alloc}", tag = "pools",
    params(("pool" = String, Path), ("alloc" = String, Path, description = "16 hex digits")),
    request_body = api::AnnotateAlloc,
    responses((status = 200, body = api::Alloc), (status = 400, body = api::ErrorBody, description = "invalid_name, invalid_argument (an `allot/` label, metadata not an object, more than 16 KiB of labels or of metadata) or invalid_json"),
        (status = 404, body = api::ErrorBody, description = "pool_not_found or alloc_not_found"),
        (status = 409, body = api::ErrorBody, description = "alloc_ended, or held_by_scheduler (the alloc of a task)"),
        (status = 503, body = api::ErrorBody, description = "store_unavailable, store_outcome_unknown, not_enough_replicas or shutting_down")))]
pub(crate) async fn annotate_alloc(
    State(state): State<ServerState>,
    Segments((name, id)): Segments<(String, String)>,
    JsonBody(body): JsonBody<api::AnnotateAlloc>,
) -> Answer<api::Alloc> {
    let notes = convert::alloc_notes(body)?;
    let alloc = state.store.annotate_alloc(convert::pool_name(&name)?, convert::alloc_id(&id)?, notes).await?;
    Ok(Json(convert::alloc(alloc, None, state.store.now())))
}

/// Renews an alloc's lease; answers the interval granted. `alloc_ended` (409) is final.
#[utoipa::path(post, path = "/v1/pools/{pool}/allocs/{alloc}/keepalive", tag = "pools",
    params(("pool" = String, Path), ("alloc" = String, Path)),
    request_body = api::AllocKeepalive,
    responses((status = 400, body = api::ErrorBody, description = "invalid_name, invalid_resources, invalid_argument or invalid_json"), (status = 503, body = api::ErrorBody, description = "store_unavailable, store_outcome_unknown, not_enough_replicas or shutting_down"), (status = 200, body = api::AllocKeepaliveResponse),
        (status = 409, body = api::ErrorBody, description = "alloc_ended: freed or reclaimed; stop keeping it alive"),
        (status = 404, body = api::ErrorBody)))]
pub(crate) async fn keepalive_alloc(
    State(state): State<ServerState>,
    Segments((name, id)): Segments<(String, String)>,
    JsonBody(body): JsonBody<api::AllocKeepalive>,
) -> Answer<api::AllocKeepaliveResponse> {
    let (granted, alloc) =
        state.store.keepalive_alloc(convert::pool_name(&name)?, convert::alloc_id(&id)?, body.interval_ms).await?;
    Ok(Json(api::AllocKeepaliveResponse {
        interval_ms: granted,
        alloc: convert::alloc(alloc, None, state.store.now()),
    }))
}

/// Stops the pool if every alloc's lease has lapsed for `idle_ms`.
#[utoipa::path(post, path = "/v1/pools/{pool}/stop-if-idle", tag = "pools",
    params(("pool" = String, Path, description = "the pool's name: 1 to 255 bytes, no control characters, no `/`")),
    request_body = api::StopIfIdle,
    responses((status = 400, body = api::ErrorBody, description = "invalid_name, invalid_resources, invalid_argument or invalid_json"), (status = 503, body = api::ErrorBody, description = "store_unavailable, store_outcome_unknown, not_enough_replicas or shutting_down"), (status = 200, body = api::StopIfIdleResponse), (status = 404, body = api::ErrorBody)))]
pub(crate) async fn stop_if_idle(
    State(state): State<ServerState>,
    Segments(name): Segments<String>,
    JsonBody(body): JsonBody<api::StopIfIdle>,
) -> Answer<api::StopIfIdleResponse> {
    let (stopped, until_idle_ms) = state.store.stop_if_idle_for(convert::pool_name(&name)?, body.idle_ms).await?;
    Ok(Json(api::StopIfIdleResponse { stopped, until_idle_ms }))
}

/// The grace a drain gives a pool's tasks when the body names none.
pub(crate) const DEFAULT_DRAIN_GRACE_MS: u64 = 30_000;

/// Cordons the pool: it takes no new allocs (offers none, the scheduler places nothing there);
/// what runs there runs on.
#[utoipa::path(post, path = "/v1/pools/{pool}/cordon", tag = "pools",
    params(("pool" = String, Path, description = "the pool's name: 1 to 255 bytes, no control characters, no `/`")),
    responses((status = 400, body = api::ErrorBody, description = "invalid_name"), (status = 503, body = api::ErrorBody, description = "store_unavailable, store_outcome_unknown, not_enough_replicas or shutting_down"), (status = 200, body = api::Pool), (status = 404, body = api::ErrorBody, description = "pool_not_found")))]
pub(crate) async fn cordon(State(state): State<ServerState>, Segments(name): Segments<String>) -> Answer<api::Pool> {
    order(state, &name, CordonOrder::Cordon).await
}

/// Drains the pool: cordoned, and once the grace has passed its tasks are preempted (placed
/// again elsewhere); tasks that may not be preempted and gang members run to their end.
#[utoipa::path(post, path = "/v1/pools/{pool}/drain", tag = "pools",
    params(("pool" = String, Path, description = "the pool's name: 1 to 255 bytes, no control characters, no `/`")),
    request_body = api::Drain,
    responses((status = 400, body = api::ErrorBody, description = "invalid_name, invalid_argument or invalid_json"), (status = 503, body = api::ErrorBody, description = "store_unavailable, store_outcome_unknown, not_enough_replicas or shutting_down"), (status = 200, body = api::Pool), (status = 404, body = api::ErrorBody, description = "pool_not_found")))]
pub(crate) async fn drain(
    State(state): State<ServerState>,
    Segments(name): Segments<String>,
    JsonBody(body): JsonBody<api::Drain>,
) -> Answer<api::Pool> {
    let grace_ms = body.grace_ms.unwrap_or(DEFAULT_DRAIN_GRACE_MS);
    if grace_ms > allot_core::apps::spec::MAX_TIMEOUT_MS {
        return Err(ApiError::invalid_argument(format!(
            "grace_ms is {grace_ms}; at most {} (about a year)",
            allot_core::apps::spec::MAX_TIMEOUT_MS
        )));
    }
    order(state, &name, CordonOrder::Drain { grace_ms }).await
}

/// Uncordons the pool: it takes allocs again, and a drain not carried out yet is called off.
#[utoipa::path(post, path = "/v1/pools/{pool}/uncordon", tag = "pools",
    params(("pool" = String, Path, description = "the pool's name: 1 to 255 bytes, no control characters, no `/`")),
    responses((status = 400, body = api::ErrorBody, description = "invalid_name"), (status = 503, body = api::ErrorBody, description = "store_unavailable, store_outcome_unknown, not_enough_replicas or shutting_down"), (status = 200, body = api::Pool), (status = 404, body = api::ErrorBody, description = "pool_not_found")))]
pub(crate) async fn uncordon(State(state): State<ServerState>, Segments(name): Segments<String>) -> Answer<api::Pool> {
    order(state, &name, CordonOrder::Uncordon).await
}

async fn order(state: ServerState, name: &str, order: CordonOrder) -> Answer<api::Pool> {
    let view = state.store.cordon_pool(convert::pool_name(name)?, order).await?;
    Ok(Json(convert::pool(view, Some(&state.store.executors().await?), state.store.now())))
}
