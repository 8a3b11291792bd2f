//! The router and its handlers: one handler per route, each a thin conversion around one store
//! call, in one module per part (`quotas`, `pools`, `apps`, `runs`) and one for the daemon itself
//! (`daemon`: health and readiness), and `watch`: the change feed, and the revision every read
//! reflects.

pub(crate) mod apps;
pub(crate) mod daemon;
pub(crate) mod pools;
pub(crate) mod quotas;
pub(crate) mod runs;
pub(crate) mod watch;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post, put};
use axum::{Json, Router};

use crate::error::ApiError;
use crate::{forward, metrics, openapi, ServerState, MAX_BODY_BYTES, MAX_SUBMIT_BODY_BYTES};

/// A handler's answer: JSON, or an error answer.
pub(crate) type Answer<T> = Result<Json<T>, ApiError>;

/// What a 503 of a store call may say, in the document.
pub(crate) const UNAVAILABLE: &str = "store_unavailable, store_outcome_unknown, not_enough_replicas or shutting_down";

/// The router of the whole API.
pub(crate) fn router(state: ServerState) -> Router {
    let document = Arc::new(openapi(state.max_wait));
    Router::new()
        .route("/healthz", get(daemon::healthz))
        .route("/readyz", get(daemon::readyz))
        .route("/metrics", get(metrics::scrape))
        .route("/openapi.json", get(move || async move { Json(document.as_ref().clone()) }))
        .route("/v1/namespaces", get(quotas::list_namespaces))
        .route(
            "/v1/namespaces/{namespace}",
            get(quotas::get_namespace).put(quotas::put_namespace).delete(quotas::remove_namespace),
        )
        .route("/v1/namespaces/{namespace}/grants", get(quotas::list_grants))
        .route(
            "/v1/namespaces/{namespace}/grants/{token}",
            put(quotas::allocate).get(quotas::get_grant).delete(quotas::release),
        )
        .route("/v1/namespaces/{namespace}/grants/{token}/keepalive", post(quotas::keepalive_grant))
        .route("/v1/namespaces/{namespace}/waiters", get(quotas::list_waiters))
        .route("/v1/sessions", post(quotas::open_session).get(quotas::list_sessions))
        .route("/v1/sessions/{id}", get(quotas::get_session).delete(quotas::close_session))
        .route("/v1/sessions/{id}/keepalive", post(quotas::keepalive_session))
        .route("/v1/pools", get(pools::list_pools))
        .route("/v1/pools/{pool}", get(pools::get_pool).put(pools::put_pool).delete(pools::remove_pool))
        .route("/v1/pools/{pool}/offers", get(pools::list_offers))
        .route("/v1/pools/{pool}/offers/{offer}", post(pools::accept))
        .route("/v1/pools/{pool}/allocs", get(pools::list_allocs))
        .route("/v1/pools/{pool}/allocs/{alloc}", get(pools::get_alloc).delete(pools::free_alloc))
        .route("/v1/pools/{pool}/allocs/{alloc}/keepalive", post(pools::keepalive_alloc))
        .route("/v1/pools/{pool}/stop-if-idle", post(pools::stop_if_idle))
        .route("/v1/queues", get(apps::list_queues))
        .route("/v1/queues/{queue}", get(apps::get_queue).put(apps::put_queue).delete(apps::remove_queue))
        .route(
            "/v1/apps",
            get(apps::list_apps).post(apps::submit_app).layer(DefaultBodyLimit::max(MAX_SUBMIT_BODY_BYTES)),
        )
        .route("/v1/apps/{app}", get(apps::get_app).delete(apps::remove_app))
        .route("/v1/apps/{app}/complete", post(apps::complete_app))
        .route("/v1/apps/{app}/fail", post(apps::fail_app))
        .route("/v1/apps/{app}/tasks", get(apps::list_tasks).post(apps::add_task))
        .route("/v1/apps/{app}/tasks/{task}", get(apps::get_task).delete(apps::remove_task))
        .route("/v1/apps/{app}/tasks/{task}/run", get(runs::get_task_run))
        .route("/v1/apps/{app}/tasks/{task}/logs", get(runs::get_task_logs))
        .route("/v1/apps/{app}/tasks/{task}/wake", post(runs::wake_task))
        .route("/v1/apps/{app}/tasks/{task}/start", post(apps::start_task))
        .route("/v1/apps/{app}/tasks/{task}/complete", post(apps::complete_task))
        .route("/v1/apps/{app}/tasks/{task}/fail", post(apps::fail_task))
        .route("/v1/tasks/finish", post(apps::finish_tasks))
        .route("/v1/watch", get(watch::watch))
        .fallback(|| async { ApiError::not_found() })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), watch::stamp_revision))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), metrics::track))
        .layer(axum::middleware::from_fn_with_state(state.clone(), forward::to_scheduler))
        .with_state(state)
}
