//! allot's HTTP/JSON API over any [`Store`].
//!
//! - [`app`] builds the router (tested in-process); [`run`] serves it on a listener until a
//!   shutdown signal, then shuts down gracefully: it stops accepting, answers waiters with their
//!   place in the queue, lets in-flight requests finish and flushes the store.
//! - `routes`: one handler per route; `convert`: wire types <-> domain types; `extract`:
//!   extractors whose rejections are JSON errors; `error`: [`ApiError`]; `metrics`: Prometheus.
//!
//! Architecture invariant: this crate and `allot-api` are the only ones that know HTTP and JSON.

pub mod affinity;
mod app_convert;
mod app_routes;
mod convert;
mod document;
mod error;
mod extract;
mod forward;
mod hot;
mod metrics;
mod objects;
mod page;
pub use page::DEFAULT_PAGE;
mod pool_routes;
mod routes;
mod runs_here;
mod threads;
pub use runs_here::{RunCounters, RunsHere};
pub use threads::ServingThreads;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use allot_store::{Store, MAX_WAIT};
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post, put};
use axum::serve::ListenerExt;
use axum::{Json, Router, ServiceExt as _};
use tokio::net::TcpListener;
use utoipa::OpenApi;

pub use app_routes::submit;
pub use error::ApiError;
pub use hot::Api;
pub use metrics::{Metrics, MetricsConfig};

/// The largest request body: bodies are small JSON objects.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// The largest body of an application submitted with its tasks (`POST /v1/apps`): about 50,000
/// tasks.
pub const MAX_SUBMIT_BODY_BYTES: usize = 16 * 1024 * 1024;

/// What every handler shares: one reference-counted [`Shared`], so that the clones axum makes
/// for every request (the route's service, each middleware's state, the handler's) count one
/// reference, not one per field.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

/// The fields of [`AppState`].
#[derive(Clone)]
pub struct Shared {
    pub store: Arc<dyn Store>,
    pub metrics: Arc<Metrics>,
    /// The longest an allocate may wait for room (the document states it): at most [`MAX_WAIT`].
    pub max_wait: Duration,
    /// Forwards the applications part to the daemon that schedules, on a shared store.
    pub forwarder: reqwest::Client,
    /// The executor of the tasks this daemon runs, if it runs any.
    pub executor: Option<Arc<dyn RunsHere>>,
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl AppState {
    /// The state over `store`, with metrics that select no namespace or pool (totals only).
    pub fn new(store: Arc<dyn Store>) -> AppState {
        let forwarder = reqwest::Client::builder()
            .timeout(MAX_WAIT + Duration::from_secs(30))
            .build()
            .expect("an HTTP client with a timeout builds");
        AppState(Arc::new(Shared {
            store,
            metrics: Arc::new(Metrics::default()),
            max_wait: MAX_WAIT,
            forwarder,
            executor: None,
        }))
    }

    fn with(self, change: impl FnOnce(&mut Shared)) -> AppState {
        let mut shared = Arc::unwrap_or_clone(self.0);
        change(&mut shared);
        AppState(Arc::new(shared))
    }

    /// The same, with allocates waiting at most `max_wait` (capped at [`MAX_WAIT`]).
    #[must_use]
    pub fn with_max_wait(self, max_wait: Duration) -> AppState {
        self.with(|shared| shared.max_wait = max_wait.min(MAX_WAIT))
    }

    /// The same, with the executor of the tasks this daemon runs (their logs and wake-ups are
    /// served here).
    #[must_use]
    pub fn with_executor(self, executor: Arc<dyn RunsHere>) -> AppState {
        self.with(|shared| shared.executor = Some(executor))
    }

    /// The same, with series of their own at `/metrics` for what `config` selects.
    #[must_use]
    pub fn with_metrics(self, config: MetricsConfig) -> AppState {
        self.with(|shared| shared.metrics = Arc::new(Metrics::new(config)))
    }

    /// The same state under a reference count of its own, for one serving thread: the clones
    /// of its requests then write a counter that no other thread writes.
    fn for_one_thread(&self) -> AppState {
        AppState(Arc::new(Shared::clone(&self.0)))
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "allot",
        description = "A resource manager for task executions: token quotas with caps, leases, sessions, \
fencing numbers and a first-come-first-served waiting queue.\n\n\
Every error answer has the body `{\"error\": {\"code\": ..., \"message\": ...}}`. Codes: invalid_json, \
invalid_argument, invalid_name, invalid_cursor, caps_without_scope (400); namespace_not_found, grant_not_found, \
session_not_found, not_found (404); method_not_allowed (405); stale_fencing, token_conflict, \
namespace_in_use (409); payload_too_large (413); store_unavailable, \
store_outcome_unknown, not_enough_replicas, shutting_down (503); internal (500). Pools: invalid_resources (400); pool_not_found, \
alloc_not_found, offer_not_found (404); offer_expired, exceeds_capacity, pool_stopped, pool_in_use, \
alloc_ended, held_by_scheduler (409). An ended alloc reads as 410 Gone with its record. Applications: \
invalid_queue (400); queue_not_found, app_not_found, task_not_found, run_not_found, logs_not_found, run_not_here (404); queue_in_use, \
queue_not_a_leaf, app_conflict, task_conflict, task_group_conflict, app_ended, gang_never_fits, gang_exceeds_queue, \
larger_than_task_group, illegal_transition, and unknown_task_group and namespace_not_found when the application or task \
names a task group or token namespace that does not exist (409: the path's resource exists).\n\n\
Names (namespaces, tokens, projects, namespace scopes, pools) follow one rule: 1 to 255 characters, no control \
characters, no `/`, not `.` or `..`; a namespace's `:`-separated segments are not empty. A name in a path is \
percent-decoded once (`%2F` is a `/`, refused; a `%` is sent as `%25`).\n\n\
Lists (namespaces, grants, waiters, sessions, pools, allocs) come in pages: `limit` items (1 to 1000, default 100) \
from `cursor` (the `next_cursor` of the page before; none for the first page). `next_cursor` is null on the last \
page. A cursor is opaque and does not expire: a page read after changes neither repeats nor skips an item that \
stayed listed."
    ),
    paths(
        routes::healthz,
        routes::readyz,
        routes::list_namespaces,
        routes::get_namespace,
        routes::put_namespace,
        routes::remove_namespace,
        routes::list_grants,
        routes::get_grant,
        routes::allocate,
        routes::release,
        routes::keepalive_grant,
        routes::list_waiters,
        routes::open_session,
        routes::list_sessions,
        routes::get_session,
        routes::keepalive_session,
        routes::close_session,
        pool_routes::list_pools,
        pool_routes::get_pool,
        pool_routes::put_pool,
        pool_routes::remove_pool,
        pool_routes::list_offers,
        pool_routes::accept,
        pool_routes::list_allocs,
        pool_routes::get_alloc,
        pool_routes::free_alloc,
        pool_routes::keepalive_alloc,
        pool_routes::stop_if_idle,
        app_routes::list_queues,
        app_routes::get_queue,
        app_routes::put_queue,
        app_routes::remove_queue,
        app_routes::list_apps,
        app_routes::submit_app,
        app_routes::get_app,
        app_routes::remove_app,
        app_routes::complete_app,
        app_routes::fail_app,
        app_routes::list_tasks,
        app_routes::add_task,
        app_routes::get_task,
        app_routes::get_task_run,
        app_routes::get_task_logs,
        app_routes::wake_task,
        app_routes::remove_task,
        app_routes::start_task,
        app_routes::complete_task,
        app_routes::fail_task,
    )
)]
struct ApiDoc;

/// The OpenAPI document of the API, with the limits the server enforces (allocates waiting at
/// most `max_wait`).
pub fn openapi(max_wait: Duration) -> serde_json::Value {
    let derived = serde_json::to_value(ApiDoc::openapi()).expect("the document serializes");
    document::with_limits(derived, max_wait)
}

/// The whole API: the hot path ([`hot`]: allocate and release), then the router.
pub fn app(state: AppState) -> Api {
    Api::new(router(state.clone()), state)
}

/// The router of the whole API.
fn router(state: AppState) -> Router {
    let document = Arc::new(openapi(state.max_wait));
    Router::new()
        .route("/healthz", get(routes::healthz))
        .route("/readyz", get(routes::readyz))
        .route("/metrics", get(metrics::scrape))
        .route("/openapi.json", get(move || async move { Json(document.as_ref().clone()) }))
        .route("/v1/namespaces", get(routes::list_namespaces))
        .route(
            "/v1/namespaces/{namespace}",
            get(routes::get_namespace).put(routes::put_namespace).delete(routes::remove_namespace),
        )
        .route("/v1/namespaces/{namespace}/grants", get(routes::list_grants))
        .route(
            "/v1/namespaces/{namespace}/grants/{token}",
            put(routes::allocate).get(routes::get_grant).delete(routes::release),
        )
        .route("/v1/namespaces/{namespace}/grants/{token}/keepalive", post(routes::keepalive_grant))
        .route("/v1/namespaces/{namespace}/waiters", get(routes::list_waiters))
        .route("/v1/sessions", post(routes::open_session).get(routes::list_sessions))
        .route("/v1/sessions/{id}", get(routes::get_session).delete(routes::close_session))
        .route("/v1/sessions/{id}/keepalive", post(routes::keepalive_session))
        .route("/v1/pools", get(pool_routes::list_pools))
        .route(
            "/v1/pools/{pool}",
            get(pool_routes::get_pool).put(pool_routes::put_pool).delete(pool_routes::remove_pool),
        )
        .route("/v1/pools/{pool}/offers", get(pool_routes::list_offers))
        .route("/v1/pools/{pool}/offers/{offer}", post(pool_routes::accept))
        .route("/v1/pools/{pool}/allocs", get(pool_routes::list_allocs))
        .route("/v1/pools/{pool}/allocs/{alloc}", get(pool_routes::get_alloc).delete(pool_routes::free_alloc))
        .route("/v1/pools/{pool}/allocs/{alloc}/keepalive", post(pool_routes::keepalive_alloc))
        .route("/v1/pools/{pool}/stop-if-idle", post(pool_routes::stop_if_idle))
        .route("/v1/queues", get(app_routes::list_queues))
        .route(
            "/v1/queues/{queue}",
            get(app_routes::get_queue).put(app_routes::put_queue).delete(app_routes::remove_queue),
        )
        .route(
            "/v1/apps",
            get(app_routes::list_apps).post(app_routes::submit_app).layer(DefaultBodyLimit::max(MAX_SUBMIT_BODY_BYTES)),
        )
        .route("/v1/apps/{app}", get(app_routes::get_app).delete(app_routes::remove_app))
        .route("/v1/apps/{app}/complete", post(app_routes::complete_app))
        .route("/v1/apps/{app}/fail", post(app_routes::fail_app))
        .route("/v1/apps/{app}/tasks", get(app_routes::list_tasks).post(app_routes::add_task))
        .route("/v1/apps/{app}/tasks/{task}", get(app_routes::get_task).delete(app_routes::remove_task))
        .route("/v1/apps/{app}/tasks/{task}/run", get(app_routes::get_task_run))
        .route("/v1/apps/{app}/tasks/{task}/logs", get(app_routes::get_task_logs))
        .route("/v1/apps/{app}/tasks/{task}/wake", post(app_routes::wake_task))
        .route("/v1/apps/{app}/tasks/{task}/start", post(app_routes::start_task))
        .route("/v1/apps/{app}/tasks/{task}/complete", post(app_routes::complete_task))
        .route("/v1/apps/{app}/tasks/{task}/fail", post(app_routes::fail_task))
        .fallback(|| async { ApiError::not_found() })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), metrics::track))
        .layer(axum::middleware::from_fn_with_state(state.clone(), forward::to_scheduler))
        .with_state(state)
}

/// Serves the API over `state` on `listener` until `shutdown` completes, then shuts down
/// gracefully and shuts the store down (answering waiters, flushing).
pub async fn run(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve(listener, state, Box::pin(shutdown), ServingThreads { count: 0, pin: false }).await
}

/// [`run`], with connections served on `threads.count` serving threads of their own, each with a
/// single-threaded runtime, instead of on the caller's runtime (which still accepts them and runs
/// the shutdown), pinned to CPUs of their own if `threads.pin`. A count of 0 serves them on the
/// caller's runtime, as [`run`] does. For a store whose calls
/// need no task of the caller's runtime: the embedded store (its log is written by its own
/// threads), not Redis (its connections are driven by tasks of the runtime that opened them).
pub async fn run_with_threads(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
    threads: ServingThreads,
) -> std::io::Result<()> {
    serve(listener, state, Box::pin(shutdown), threads).await
}

/// [`run`], not generic: the server loop is compiled (and optimised) here, in this crate, not in
/// whichever crate calls `run`.
async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
    threads: ServingThreads,
) -> std::io::Result<()> {
    let store = state.store.clone();
    let (closing_tx, closing_rx) = tokio::sync::oneshot::channel();
    let graceful = {
        let store = store.clone();
        async move {
            shutdown.await;
            tracing::info!("shutting down: no new connections; answering waiters");
            // Answer waiters now, so their long polls end and the connections can drain.
            let closing = tokio::spawn(async move { store.shutdown().await });
            let _ = closing_tx.send(closing);
        }
    };
    // Answers are small and each one ends a request: send them at once (no Nagle delay).
    let listener = listener.tap_io(|stream| {
        if let Err(err) = stream.set_nodelay(true) {
            tracing::debug!(error = %err, "cannot set TCP_NODELAY");
        }
    });
    let served = match threads.count {
        0 => axum::serve(listener, app(state).into_make_service()).with_graceful_shutdown(graceful).await,
        _ => threads::serve(listener, || app(state.for_one_thread()), threads, graceful).await,
    };
    match closing_rx.await {
        Ok(closing) => {
            let _ = closing.await;
        }
        Err(_) => store.shutdown().await,
    }
    tracing::info!("stopped");
    served
}
