//! The router and its handlers: one handler per route, each a thin conversion around one store
//! call, in one module per part (`quotas`, `pools`, `apps`, `runs`) and one for the daemon itself
//! (`daemon`: health and readiness), and `watch`: the change feed, and the revision every read
//! reflects.

pub(crate) mod access;
pub(crate) mod apps;
pub(crate) mod daemon;
pub(crate) mod pools;
pub(crate) mod quotas;
pub(crate) mod runs;
pub(crate) mod watch;

use std::sync::Arc;

use allot_core::access::{Kind, Permission};
use axum::extract::DefaultBodyLimit;
use axum::http::Method;
use axum::routing::{delete, get, post, put, MethodRouter};
use axum::{Json, Router};

use crate::access::{self as checks, Home, Need, Needs, Target};
use crate::error::ApiError;
use crate::{forward, metrics, openapi, ServerState, MAX_BODY_BYTES, MAX_SUBMIT_BODY_BYTES};

/// A handler's answer: JSON, or an error answer.
pub(crate) type Answer<T> = Result<Json<T>, ApiError>;

/// What a 503 of a store call may say, in the document.
pub(crate) const UNAVAILABLE: &str =
    "store_unavailable, store_outcome_unknown, not_enough_replicas, store_failed or shutting_down";

/// The routes, each with the one permission it needs and the daemon that serves it
/// (`access::Needs`): a handler cannot be added without them.
struct Declared {
    router: Router<ServerState>,
    needs: Needs,
}

impl Declared {
    /// A route any daemon serves.
    fn route(self, path: &'static str, handlers: MethodRouter<ServerState>, needs: &[(Method, Need)]) -> Declared {
        self.declare(path, handlers, needs, Home::Any)
    }

    /// A route of the applications part, served by the daemon that schedules (`forward.rs`).
    fn scheduled(self, path: &'static str, handlers: MethodRouter<ServerState>, needs: &[(Method, Need)]) -> Declared {
        self.declare(path, handlers, needs, Home::Scheduler)
    }

    fn declare(
        mut self,
        path: &'static str,
        handlers: MethodRouter<ServerState>,
        needs: &[(Method, Need)],
        home: Home,
    ) -> Declared {
        for (method, need) in needs {
            self.needs.declare(method.clone(), path, *need, home);
        }
        self.router = self.router.route(path, handlers);
        self
    }
}

const NAMESPACE: Target = Target::Path(Kind::Namespace);
const POOL: Target = Target::Path(Kind::Pool);
const QUEUE: Target = Target::Path(Kind::Queue);
const APP: Target = Target::AppQueue;

fn read(target: Target) -> Need {
    Need::Needs(Permission::Read, target)
}

fn work(target: Target) -> Need {
    Need::Needs(Permission::Use, target)
}

fn admin(target: Target) -> Need {
    Need::Needs(Permission::Admin, target)
}

/// The router of the whole API, and the permission of each of its routes.
pub(crate) fn routes(state: ServerState) -> (Router, Arc<Needs>) {
    use Method as M;
    // Made when first asked for: building it is a fifth of a daemon's start.
    let (document, max_wait) = (Arc::new(std::sync::OnceLock::new()), state.max_wait);
    let some = Target::Some;
    let declared = Declared { router: Router::new(), needs: Needs::default() }
        .route("/healthz", get(daemon::healthz), &[(M::GET, Need::Open)])
        // The dashboard's files hold no data: what it shows it reads through the API.
        .route("/", get(crate::ui::root), &[(M::GET, Need::Open)])
        .route("/ui", get(crate::ui::page), &[(M::GET, Need::Open)])
        .route("/ui/assets/{file}", get(crate::ui::asset), &[(M::GET, Need::Open)])
        .route("/ui/{*page}", get(crate::ui::page), &[(M::GET, Need::Open)])
        .route("/readyz", get(daemon::readyz), &[(M::GET, Need::Open)])
        .route("/metrics", get(metrics::scrape), &[(M::GET, read(Target::Daemon))])
        .route(
            "/openapi.json",
            get(move || async move { Json(document.get_or_init(|| openapi(max_wait)).clone()) }),
            &[(M::GET, read(Target::Daemon))],
        )
        .route("/v1/namespaces", get(quotas::list_namespaces), &[(M::GET, read(some(Kind::Namespace)))])
        .route(
            "/v1/namespaces/{namespace}",
            get(quotas::get_namespace).put(quotas::put_namespace).delete(quotas::remove_namespace),
            &[(M::GET, read(NAMESPACE)), (M::PUT, admin(NAMESPACE)), (M::DELETE, admin(NAMESPACE))],
        )
        .route("/v1/namespaces/{namespace}/grants", get(quotas::list_grants), &[(M::GET, read(NAMESPACE))])
        .route(
            "/v1/namespaces/{namespace}/grants/{token}",
            put(quotas::allocate).get(quotas::get_grant).delete(quotas::release),
            &[(M::PUT, work(NAMESPACE)), (M::GET, read(NAMESPACE)), (M::DELETE, work(NAMESPACE))],
        )
        .route(
            "/v1/namespaces/{namespace}/grants/{token}/keepalive",
            post(quotas::keepalive_grant),
            &[(M::POST, work(NAMESPACE))],
        )
        .route("/v1/namespaces/{namespace}/waiters", get(quotas::list_waiters), &[(M::GET, read(NAMESPACE))])
        // A session is not in one namespace: whoever may use some namespace may open one, and its
        // id (128 random bits) is the capability to keep it alive or close it.
        .route(
            "/v1/sessions",
            post(quotas::open_session).get(quotas::list_sessions),
            &[(M::POST, work(some(Kind::Namespace))), (M::GET, read(some(Kind::Namespace)))],
        )
        .route(
            "/v1/sessions/{id}",
            get(quotas::get_session).delete(quotas::close_session),
            &[(M::GET, read(some(Kind::Namespace))), (M::DELETE, work(some(Kind::Namespace)))],
        )
        .route(
            "/v1/sessions/{id}/keepalive",
            post(quotas::keepalive_session),
            &[(M::POST, work(some(Kind::Namespace)))],
        )
        .route("/v1/pools", get(pools::list_pools), &[(M::GET, read(some(Kind::Pool)))])
        .route(
            "/v1/pools/{pool}",
            get(pools::get_pool).put(pools::put_pool).delete(pools::remove_pool),
            &[(M::GET, read(POOL)), (M::PUT, admin(POOL)), (M::DELETE, admin(POOL))],
        )
        .route("/v1/pools/{pool}/offers", get(pools::list_offers), &[(M::GET, read(POOL))])
        .route(
            "/v1/pools/{pool}/offers/{offer}",
            get(pools::get_offer).post(pools::accept),
            &[(M::GET, read(POOL)), (M::POST, work(POOL))],
        )
        .route("/v1/pools/{pool}/allocs", get(pools::list_allocs), &[(M::GET, read(POOL))])
        .route(
            "/v1/pools/{pool}/allocs/{alloc}",
            get(pools::get_alloc).delete(pools::free_alloc).patch(pools::annotate_alloc),
            &[(M::GET, read(POOL)), (M::DELETE, work(POOL)), (M::PATCH, work(POOL))],
        )
        // The run of the task in an alloc: the handler also checks `read` on its application.
        .scheduled("/v1/pools/{pool}/allocs/{alloc}/run", get(runs::get_alloc_run), &[(M::GET, read(POOL))])
        .route("/v1/pools/{pool}/allocs/{alloc}/keepalive", post(pools::keepalive_alloc), &[(M::POST, work(POOL))])
        .route("/v1/pools/{pool}/stop-if-idle", post(pools::stop_if_idle), &[(M::POST, admin(POOL))])
        .route("/v1/pools/{pool}/cordon", post(pools::cordon), &[(M::POST, admin(POOL))])
        .route("/v1/pools/{pool}/drain", post(pools::drain), &[(M::POST, admin(POOL))])
        .route("/v1/pools/{pool}/uncordon", post(pools::uncordon), &[(M::POST, admin(POOL))])
        .scheduled("/v1/queues", get(apps::list_queues), &[(M::GET, read(some(Kind::Queue)))])
        .scheduled(
            "/v1/queues/{queue}",
            get(apps::get_queue).put(apps::put_queue).delete(apps::remove_queue),
            &[(M::GET, read(QUEUE)), (M::PUT, admin(QUEUE)), (M::DELETE, admin(QUEUE))],
        )
        // A submission names its queue in its body: the handler checks `use` on it.
        .scheduled(
            "/v1/apps",
            get(apps::list_apps).post(apps::submit_app).layer(DefaultBodyLimit::max(MAX_SUBMIT_BODY_BYTES)),
            &[(M::GET, read(some(Kind::Queue))), (M::POST, work(Target::Body(Kind::Queue)))],
        )
        .scheduled(
            "/v1/apps/{app}",
            get(apps::get_app).delete(apps::remove_app),
            &[(M::GET, read(APP)), (M::DELETE, work(APP))],
        )
        .scheduled("/v1/apps/{app}/complete", post(apps::complete_app), &[(M::POST, work(APP))])
        .scheduled("/v1/apps/{app}/fail", post(apps::fail_app), &[(M::POST, work(APP))])
        .scheduled(
            "/v1/apps/{app}/tasks",
            get(apps::list_tasks).post(apps::add_task),
            &[(M::GET, read(APP)), (M::POST, work(APP))],
        )
        .scheduled(
            "/v1/apps/{app}/tasks/{task}",
            get(apps::get_task).delete(apps::remove_task),
            &[(M::GET, read(APP)), (M::DELETE, work(APP))],
        )
        .scheduled("/v1/apps/{app}/tasks/{task}/run", get(runs::get_task_run), &[(M::GET, read(APP))])
        // A task's logs and wake-ups are served by the daemon that runs it, on its machine.
        .route("/v1/apps/{app}/tasks/{task}/logs", get(runs::get_task_logs), &[(M::GET, read(APP))])
        .route("/v1/apps/{app}/tasks/{task}/wake", post(runs::wake_task), &[(M::POST, work(APP))])
        // A plugin's catalog, reached for the task it runs (its plugin and queue are the scope).
        .route("/v1/apps/{app}/tasks/{task}/catalog", post(runs::catalog_put), &[(M::POST, work(APP))])
        .route("/v1/apps/{app}/tasks/{task}/catalog/lookup", post(runs::catalog_lookup), &[(M::POST, work(APP))])
        .scheduled("/v1/apps/{app}/tasks/{task}/start", post(apps::start_task), &[(M::POST, work(APP))])
        .scheduled("/v1/apps/{app}/tasks/{task}/complete", post(apps::complete_task), &[(M::POST, work(APP))])
        .scheduled("/v1/apps/{app}/tasks/{task}/fail", post(apps::fail_task), &[(M::POST, work(APP))])
        // Each end names its application: the handler checks `use` on each one's queue.
        .scheduled("/v1/tasks/finish", post(apps::finish_tasks), &[(M::POST, work(some(Kind::Queue)))])
        .route(
            "/v1/api-tokens",
            post(access::create_api_token).get(access::list_api_tokens),
            &[(M::POST, admin(Target::Daemon)), (M::GET, admin(Target::Daemon))],
        )
        .route("/v1/api-tokens/{name}", delete(access::revoke_api_token), &[(M::DELETE, admin(Target::Daemon))])
        .route("/v1/bindings", get(access::list_bindings), &[(M::GET, admin(Target::Daemon))])
        .route(
            "/v1/bindings/{name}",
            put(access::put_binding).delete(access::remove_binding),
            &[(M::PUT, admin(Target::Daemon)), (M::DELETE, admin(Target::Daemon))],
        )
        // Any caller may ask who it is and what it may do.
        .route("/v1/whoami", get(access::whoami), &[(M::GET, Need::Authenticated)])
        // The whole store, API tokens' hashes among it: the daemon's admins only.
        .scheduled("/v1/snapshot", get(daemon::snapshot), &[(M::GET, admin(Target::Daemon))])
        // The filter names what is watched: the handler checks `read` on it.
        .route("/v1/watch", get(watch::watch), &[(M::GET, read(Target::Named))]);
    let needs = Arc::new(declared.needs);
    let router = declared
        .router
        .fallback(|| async { ApiError::not_found() })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), watch::stamp_revision))
        .route_layer(axum::middleware::from_fn_with_state((state.clone(), needs.clone()), checks::authorize))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), metrics::track))
        // Outermost of the route's layers: a call forwarded is authorized and counted where it
        // is served.
        .route_layer(axum::middleware::from_fn_with_state((state.clone(), needs.clone()), forward::to_scheduler))
        .with_state(state);
    (router, needs)
}
