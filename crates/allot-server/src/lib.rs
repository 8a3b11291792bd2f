//! allot's HTTP/JSON API over any [`Store`].
//!
//! - [`api`] builds the whole API over a [`ServerState`] (tested in-process); [`run`] serves it on
//!   a listener until a shutdown signal, then shuts down gracefully: it stops accepting, answers
//!   waiters with their place in the queue, lets in-flight requests finish and flushes the store.
//! - `routes`: the router, and one handler per route in a module per part (`quotas`, `pools`,
//!   `apps`, `runs`, `daemon` for health, `watch` for the change feed); `convert`: wire types <->
//!   domain types, a module per part; `hot`: allocate and release served before the router.
//! - `extract`: extractors whose rejections are JSON errors; `objects`: request bodies read so
//!   that a struct comes only from a JSON object; `page`: cursors of lists; `error`: [`ApiError`].
//! - `forward`: the applications part forwarded to the daemon that schedules, on a shared store;
//!   `runs_here`: what the server asks of the executor of this daemon ([`RunsHere`]).
//! - `frames`: the change feed's events as Server-Sent Events, encoded once for every watch
//!   stream.
//! - `metrics`: Prometheus; `document`: the OpenAPI document's limits; `connections`: each
//!   accepted connection served over HTTP/1.1 until a graceful shutdown; `threads`: serving
//!   threads pinned to CPUs (with `allot_host::affinity`).
//!
//! Architecture invariant: this crate and `allot-api` are the only ones that know HTTP and JSON.

pub mod access;
pub mod audit;
mod connection_limit;
mod connections;
mod convert;
mod document;
mod error;
mod extract;
mod forward;
mod frames;
mod hot;
mod metrics;
mod objects;
mod page;
pub mod tls;
pub use page::DEFAULT_PAGE;
mod routes;
mod runs_here;
mod starting;
pub use starting::{starting, Starting};
mod threads;
mod ui;
pub use runs_here::{RunCounters, RunsHere};
pub use threads::ServingThreads;

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use allot_core::apps::placement::PlacementRules;
use allot_store::{Store, MAX_WAIT};
use tokio::net::TcpListener;
use utoipa::OpenApi;

pub use access::{Access, Caller, Credential, OpenRoutes};
pub use audit::{Audit, AuditSink};
pub use connection_limit::{default_max_connections, raise_open_files_limit};
pub use error::ApiError;
pub use hot::Api;
pub use metrics::{Metrics, MetricsConfig};
pub use routes::apps::submit;
use tls::Accepting;
pub use tls::{ClientCert, Peer, Tls, TlsFiles};

/// The largest request body: bodies are small JSON objects.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// The largest body of an application submitted with its tasks (`POST /v1/apps`): about 50,000
/// tasks.
pub const MAX_SUBMIT_BODY_BYTES: usize = 16 * 1024 * 1024;

/// Set on a call one daemon makes to another for a caller (a forwarded applications call, a
/// question about an application): a daemon never forwards a call twice (two daemons that each
/// think the other schedules, for the moment of a takeover, answer 503 rather than loop).
pub(crate) const FORWARDED: axum::http::HeaderName = axum::http::HeaderName::from_static("x-allot-forwarded");

/// How long a watch stream stays silent before it sends a heartbeat by default: well within the
/// idle timeouts of common proxies (60 s).
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(15);

/// How long a connection may go with no request in flight, no request begun and nothing sent to
/// it before it is closed (within half as long again): an idle keep-alive connection, or one that
/// sends its headers a byte at a time (Slowloris). Longer than the 90 s most clients keep an idle
/// connection for (reqwest, Go), so that a client never sends on a connection the daemon is
/// closing.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// What every handler shares: one reference-counted [`Shared`], so that the clones axum makes
/// for every request (the route's service, each middleware's state, the handler's) count one
/// reference, not one per field.
#[derive(Clone)]
pub struct ServerState(Arc<Shared>);

/// The fields of [`ServerState`].
#[derive(Clone)]
pub struct Shared {
    pub store: Arc<dyn Store>,
    pub metrics: Arc<Metrics>,
    /// The longest an allocate may wait for room (the document states it): at most [`MAX_WAIT`].
    pub max_wait: Duration,
    /// Forwards the applications part to the daemon that schedules, on a shared store.
    pub forwarder: Forwarder,
    /// The executor of the tasks this daemon runs, if it runs any.
    pub executor: Option<Arc<dyn RunsHere>>,
    /// How long a watch stream may stay silent: then it sends a heartbeat (an SSE comment).
    pub heartbeat: Duration,
    /// How long a connection may stay idle before it is closed ([`DEFAULT_IDLE_TIMEOUT`]).
    pub idle_timeout: Duration,
    /// The most connections open at once ([`default_max_connections`]): past it, no more are
    /// accepted until one ends.
    pub max_connections: usize,
    /// The change feed's events encoded as Server-Sent Events, once for every watch stream.
    pub(crate) frames: Arc<frames::Frames>,
    /// Who may do what; `None`: every caller may do everything (the daemon then listens only on
    /// loopback, unless told otherwise).
    pub access: Option<Arc<Access>>,
    /// The audit trail, if kept: changes and refusals.
    pub audit: Option<Arc<Audit>>,
    /// HTTPS, if configured.
    pub tls: Option<Arc<Tls>>,
    /// The placement rules that choose a submitted application's queue; none: it names one.
    pub placement: Arc<PlacementRules>,
}

impl std::ops::Deref for ServerState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// The HTTP client that forwards calls to the daemon that schedules, built when first used: it
/// reads the machine's root certificates (a fifth of a daemon's start), and a daemon on its own
/// never forwards.
#[derive(Clone, Default)]
pub struct Forwarder(Arc<OnceLock<reqwest::Client>>);

impl Forwarder {
    pub fn client(&self) -> &reqwest::Client {
        self.0.get_or_init(|| {
            reqwest::Client::builder()
                .timeout(MAX_WAIT + Duration::from_secs(30))
                .build()
                .expect("an HTTP client with a timeout builds")
        })
    }
}

impl ServerState {
    /// The state over `store`, with metrics that select no namespace or pool (totals only).
    pub fn new(store: Arc<dyn Store>) -> ServerState {
        let forwarder = Forwarder::default();
        ServerState(Arc::new(Shared {
            store,
            metrics: Arc::new(Metrics::default()),
            max_wait: MAX_WAIT,
            forwarder,
            executor: None,
            heartbeat: DEFAULT_HEARTBEAT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: default_max_connections(),
            frames: Arc::default(),
            access: None,
            audit: None,
            tls: None,
            placement: Arc::default(),
        }))
    }

    fn with(self, change: impl FnOnce(&mut Shared)) -> ServerState {
        let mut shared = Arc::unwrap_or_clone(self.0);
        change(&mut shared);
        ServerState(Arc::new(shared))
    }

    /// The same, with allocates waiting at most `max_wait` (capped at [`MAX_WAIT`]).
    #[must_use]
    pub fn with_max_wait(self, max_wait: Duration) -> ServerState {
        self.with(|shared| shared.max_wait = max_wait.min(MAX_WAIT))
    }

    /// The same, with the executor of the tasks this daemon runs (their logs and wake-ups are
    /// served here).
    #[must_use]
    pub fn with_executor(self, executor: Arc<dyn RunsHere>) -> ServerState {
        self.with(|shared| shared.executor = Some(executor))
    }

    /// The same, with calls authenticated by API token and authorized by `access`'s policy.
    #[must_use]
    pub fn with_access(self, access: Access) -> ServerState {
        // The scheduler gives applications only what their users may use, by the same policy.
        self.store.set_tenancy(allot_core::access::Tenancy::Enforced(access.policy()));
        self.with(|shared| shared.access = Some(Arc::new(access)))
    }

    /// The same, with every change and refusal written to `audit`.
    #[must_use]
    pub fn with_audit(self, audit: Audit) -> ServerState {
        self.with(|shared| shared.audit = Some(Arc::new(audit)))
    }

    /// The same, with calls forwarded to the other daemons trusting `pem`'s certificates too
    /// (their HTTPS certificates' CA, or the certificates themselves).
    pub fn with_peer_roots(self, pem: &[u8]) -> Result<ServerState, reqwest::Error> {
        let mut builder = reqwest::Client::builder().timeout(MAX_WAIT + Duration::from_secs(30));
        for cert in reqwest::Certificate::from_pem_bundle(pem)? {
            builder = builder.add_root_certificate(cert);
        }
        let forwarder = Forwarder(Arc::new(OnceLock::from(builder.build()?)));
        Ok(self.with(|shared| shared.forwarder = forwarder))
    }

    /// The same, with `rules` choosing the queue of a submitted application.
    #[must_use]
    pub fn with_placement(self, rules: PlacementRules) -> ServerState {
        self.with(|shared| shared.placement = Arc::new(rules))
    }

    /// The same, served over TLS.
    #[must_use]
    pub fn with_tls(self, tls: Arc<Tls>) -> ServerState {
        self.with(|shared| shared.tls = Some(tls))
    }

    /// The same, with watch streams that send a heartbeat after `heartbeat` of silence.
    #[must_use]
    pub fn with_heartbeat(self, heartbeat: Duration) -> ServerState {
        self.with(|shared| shared.heartbeat = heartbeat)
    }

    /// The same, with idle connections closed after `idle_timeout` ([`DEFAULT_IDLE_TIMEOUT`]).
    /// Keep the heartbeat of watches well below half of it: a watch is kept open by what it sends.
    #[must_use]
    pub fn with_idle_timeout(self, idle_timeout: Duration) -> ServerState {
        self.with(|shared| shared.idle_timeout = idle_timeout)
    }

    /// The same, with at most `max_connections` connections open at once (at least 1): past it,
    /// new ones wait in the listen backlog until one ends.
    #[must_use]
    pub fn with_max_connections(self, max_connections: usize) -> ServerState {
        self.with(|shared| shared.max_connections = max_connections.max(1))
    }

    /// The same, with series of their own at `/metrics` for what `config` selects.
    #[must_use]
    pub fn with_metrics(self, config: MetricsConfig) -> ServerState {
        self.with(|shared| shared.metrics = Arc::new(Metrics::new(config)))
    }

    /// The same state under a reference count of its own, for one serving thread: the clones
    /// of its requests then write a counter that no other thread writes.
    fn for_one_thread(&self) -> ServerState {
        ServerState(Arc::new(Shared::clone(&self.0)))
    }
}

// The description's paragraph on errors, with every code, is added by `document.rs` from the
// error codes themselves (`error::ErrorCode`).
#[derive(OpenApi)]
#[openapi(
    info(
        title = "allot",
        description = "A resource manager for task executions: token quotas with caps, leases, sessions, \
fencing numbers and a first-come-first-served waiting queue.\n\n\
Names (namespaces, tokens, projects, namespace scopes, pools) follow one rule: 1 to 255 characters, no control \
characters, no `/`, not `.` or `..`; a namespace's `:`-separated segments are not empty. A name in a path is \
percent-decoded once (`%2F` is a `/`, refused; a `%` is sent as `%25`).\n\n\
Lists (namespaces, grants, waiters, sessions, pools, allocs) come in pages: `limit` items (1 to 1000, default 100) \
from `cursor` (the `next_cursor` of the page before; none for the first page). `next_cursor` is null on the last \
page. A cursor is opaque and does not expire: a page read after changes neither repeats nor skips an item that \
stayed listed."
    ),
    paths(
        routes::daemon::healthz,
        routes::daemon::readyz,
        routes::daemon::snapshot,
        routes::quotas::list_namespaces,
        routes::quotas::get_namespace,
        routes::quotas::put_namespace,
        routes::quotas::remove_namespace,
        routes::quotas::list_grants,
        routes::quotas::get_grant,
        routes::quotas::allocate,
        routes::quotas::release,
        routes::quotas::keepalive_grant,
        routes::quotas::list_waiters,
        routes::quotas::open_session,
        routes::quotas::list_sessions,
        routes::quotas::get_session,
        routes::quotas::keepalive_session,
        routes::quotas::close_session,
        routes::pools::list_pools,
        routes::pools::get_pool,
        routes::pools::put_pool,
        routes::pools::remove_pool,
        routes::pools::list_offers,
        routes::pools::get_offer,
        routes::pools::accept,
        routes::pools::list_allocs,
        routes::pools::get_alloc,
        routes::pools::free_alloc,
        routes::pools::keepalive_alloc,
        routes::pools::annotate_alloc,
        routes::runs::get_alloc_run,
        routes::pools::stop_if_idle,
        routes::pools::cordon,
        routes::pools::drain,
        routes::pools::uncordon,
        routes::apps::list_queues,
        routes::apps::get_queue,
        routes::apps::put_queue,
        routes::apps::remove_queue,
        routes::apps::list_apps,
        routes::apps::submit_app,
        routes::apps::get_app,
        routes::apps::remove_app,
        routes::apps::complete_app,
        routes::apps::fail_app,
        routes::apps::list_tasks,
        routes::apps::add_task,
        routes::apps::get_task,
        routes::runs::get_task_run,
        routes::runs::get_task_logs,
        routes::runs::wake_task,
        routes::runs::catalog_lookup,
        routes::runs::catalog_put,
        routes::apps::remove_task,
        routes::apps::start_task,
        routes::apps::complete_task,
        routes::apps::fail_task,
        routes::apps::finish_tasks,
        routes::access::create_api_token,
        routes::access::list_api_tokens,
        routes::access::revoke_api_token,
        routes::access::put_binding,
        routes::access::list_bindings,
        routes::access::whoami,
        routes::access::remove_binding,
        routes::watch::watch,
    ),
    components(schemas(allot_api::WatchBehind))
)]
struct ApiDoc;

/// The OpenAPI document of the API, with the limits the server enforces (allocates waiting at
/// most `max_wait`).
pub fn openapi(max_wait: Duration) -> serde_json::Value {
    let derived = serde_json::to_value(ApiDoc::openapi()).expect("the document serializes");
    document::with_limits(derived, max_wait)
}

/// The permission every route of the router needs, as the router declares them.
pub fn route_needs(state: ServerState) -> Arc<access::Needs> {
    routes::routes(state).1
}

/// The whole API: the hot path ([`hot`]: allocate and release), then the router.
pub fn api(state: ServerState) -> Api {
    let (router, needs) = routes::routes(state.clone());
    Api::new(router, &needs, state)
}

/// Serves the API over `state` on `listener` until `shutdown` completes, then shuts down
/// gracefully and shuts the store down (answering waiters, flushing).
pub async fn run(
    listener: TcpListener,
    state: ServerState,
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
    state: ServerState,
    shutdown: impl Future<Output = ()> + Send + 'static,
    threads: ServingThreads,
) -> std::io::Result<()> {
    serve(listener, state, Box::pin(shutdown), threads).await
}

/// [`run`], not generic: the server loop is compiled (and optimised) here, in this crate, not in
/// whichever crate calls `run`.
async fn serve(
    listener: TcpListener,
    state: ServerState,
    shutdown: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
    threads: ServingThreads,
) -> std::io::Result<()> {
    let store = state.store.clone();
    if let Some(access) = &state.access {
        // The tokens and bindings made through the API, on any daemon of the store.
        access.follow(store.clone());
    }
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
    let (tls, idle) = (state.tls.clone(), state.idle_timeout);
    let listener = connection_limit::Capped::new(listener, state.max_connections, state.metrics.connections());
    let served = match threads.count {
        0 => connections::serve(Accepting::new(listener, tls), api(state), idle, graceful).await,
        _ => threads::serve(listener, || api(state.for_one_thread()), tls, idle, threads, graceful).await,
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
