//! An async client for the allot daemon's HTTP API (v1).
//!
//! [`Client`] has one method per route; each returns the wire type of `allot-api` that the route
//! answers with, or a [`ClientError`]. The daemon's refusals (a 4xx or 5xx with an error body) are
//! [`ClientError::Api`] with the stable error code; an allocate that is not granted
//! (`Exhausted`, `NamespaceQuotaExceeded`) is not an error but an [`AllocateResponse`] with that
//! status.
//!
//! ```no_run
//! # async fn example() -> Result<(), allot_client::ClientError> {
//! use allot_client::{Allocate, Client, Status};
//!
//! let client = Client::new("http://127.0.0.1:7070")?;
//! client.put_namespace("hive:cluster-a", 10).await?;
//! let answer = client.allocate("hive:cluster-a", "job-1", &Allocate { units: Some(2), ..Allocate::default() }).await?;
//! if answer.status == Status::Granted {
//!     client.release("hive:cluster-a", "job-1", None).await?;
//! }
//! # Ok(())
//! # }
//! ```

mod error;
mod path;
pub mod pools;

use std::time::Duration;

pub use allot_api::*;
use reqwest::{Method, RequestBuilder, Url};
use serde::de::DeserializeOwned;

pub use crate::error::ClientError;
use crate::error::{decode_error, snippet};
use crate::path::segment;

/// How long a connection to the daemon may take to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a request may take by default, from sending to the end of the answer. An allocate
/// that waits (`wait_ms`) gets its wait on top of this.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a release is retried by default while the daemon or its store is unreachable.
pub const DEFAULT_RELEASE_RETRY: Duration = Duration::from_secs(300);

/// How many times by default a call answered 503 `store_unavailable` with `Retry-After` is sent
/// again (nothing was changed by it), see [`Client::with_unavailable_retry`].
pub const DEFAULT_UNAVAILABLE_RETRIES: u32 = 5;
/// Within how long, from the first try, those retries are made by default.
pub const DEFAULT_UNAVAILABLE_RETRY_FOR: Duration = Duration::from_secs(10);
/// The longest pause before a retry, whatever `Retry-After` asks.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(5);

/// A client of one allot daemon.
///
/// Cheap to clone: clones share one connection pool. There is no timeout on the client as a whole
/// (so long polls are not cut); every request gets its own, see [`Client::with_request_timeout`].
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    /// The base URL without a trailing `/`, e.g. `http://127.0.0.1:7070`.
    base: String,
    request_timeout: Duration,
    release_retry_for: Duration,
    /// Retries of a call answered 503 `store_unavailable`, and within how long.
    unavailable_retries: u32,
    unavailable_retry_for: Duration,
}

impl Client {
    /// A client of the daemon at `base_url`, e.g. `http://127.0.0.1:7070`.
    ///
    /// A URL without a scheme (`127.0.0.1:7070`) means `http://`. The URL may have a path (a daemon
    /// behind a reverse proxy under `/allot`), but no query or fragment.
    pub fn new(base_url: &str) -> Result<Client, ClientError> {
        let http = reqwest::Client::builder().connect_timeout(CONNECT_TIMEOUT).build()?;
        Client::with_http_client(base_url, http)
    }

    /// Like [`Client::new`], with a `reqwest::Client` configured by the caller (proxies, TLS, ...).
    /// Do not give it a global timeout shorter than the longest wait you will ask for.
    pub fn with_http_client(base_url: &str, http: reqwest::Client) -> Result<Client, ClientError> {
        let base = normalize_base(base_url)?;
        Ok(Client {
            http,
            base,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            release_retry_for: DEFAULT_RELEASE_RETRY,
            unavailable_retries: DEFAULT_UNAVAILABLE_RETRIES,
            unavailable_retry_for: DEFAULT_UNAVAILABLE_RETRY_FOR,
        })
    }

    /// Sets how long each request may take ([`DEFAULT_REQUEST_TIMEOUT`] by default). An allocate
    /// that waits gets its `wait_ms` on top of this.
    #[must_use]
    pub fn with_request_timeout(mut self, timeout: Duration) -> Client {
        self.request_timeout = timeout;
        self
    }

    /// Sets how long [`Client::release`] keeps retrying while the daemon or its store is
    /// unreachable ([`DEFAULT_RELEASE_RETRY`] by default; zero for a single try).
    #[must_use]
    pub fn with_release_retry(mut self, retry_for: Duration) -> Client {
        self.release_retry_for = retry_for;
        self
    }

    /// Sets how a call answered 503 `store_unavailable` with a `Retry-After` header is retried:
    /// up to `retries` more times, each after the pause the header asks (at most 5 s), as long as
    /// the next try starts within `within` of the first. Such an answer means nothing was changed
    /// (the daemon's store could not be reached, or, on Redis, a scheduler is being elected), so
    /// any call is safe to send again. Defaults: [`DEFAULT_UNAVAILABLE_RETRIES`] within
    /// [`DEFAULT_UNAVAILABLE_RETRY_FOR`]; `0` retries answers the first 503 as an error. Other
    /// 503s (`store_outcome_unknown`, `shutting_down`) are never retried here.
    #[must_use]
    pub fn with_unavailable_retry(mut self, retries: u32, within: Duration) -> Client {
        self.unavailable_retries = retries;
        self.unavailable_retry_for = within;
        self
    }

    /// `GET /readyz`: whether the daemon can serve every part of the API now, and if not, why.
    /// A daemon that is not ready answers 503 with the same body: that is an answer here, not an
    /// error.
    pub async fn ready(&self) -> Result<Readiness, ClientError> {
        let (request, body) = self.send_accepting(self.request(Method::GET, "/readyz")?, Some(503)).await?;
        serde_json::from_slice(&body).map_err(|err| decode_error(request, err, &body))
    }

    /// The daemon's base URL, without a trailing `/`.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// `GET /healthz`: whether the daemon is up, its store backend and version.
    pub async fn health(&self) -> Result<Health, ClientError> {
        self.json(self.request(Method::GET, "/healthz")?).await
    }

    /// `GET /metrics`: the daemon's metrics in the Prometheus text format.
    pub async fn metrics(&self) -> Result<String, ClientError> {
        let (request, body) = self.send(self.request(Method::GET, "/metrics")?).await?;
        String::from_utf8(body).map_err(|err| {
            let body = err.as_bytes().to_vec();
            decode_error(request, err.utf8_error(), &body)
        })
    }

    /// `GET /openapi.json`: the API's OpenAPI 3.1 document.
    pub async fn openapi(&self) -> Result<serde_json::Value, ClientError> {
        self.json(self.request(Method::GET, "/openapi.json")?).await
    }

    /// `GET /v1/namespaces`, every page: every namespace with its quota and use, by name.
    pub async fn namespaces(&self) -> Result<NamespaceList, ClientError> {
        self.all_pages("/v1/namespaces").await
    }

    /// `GET /v1/namespaces`: one page of the namespaces, by name.
    pub async fn namespaces_page(&self, page: &PageArgs) -> Result<NamespaceList, ClientError> {
        self.page("/v1/namespaces", page).await
    }

    /// `GET /v1/namespaces/{namespace}`: one namespace with its quota and use.
    pub async fn namespace(&self, namespace: &str) -> Result<Namespace, ClientError> {
        self.json(self.request(Method::GET, &namespace_path(namespace)?)?).await
    }

    /// `PUT /v1/namespaces/{namespace}`: creates `namespace` with `quota` units, or changes its
    /// quota. Lowering a quota below the granted units ends no grant; it only stops new ones.
    pub async fn put_namespace(&self, namespace: &str, quota: u64) -> Result<PutNamespaceResponse, ClientError> {
        let request = self.request(Method::PUT, &namespace_path(namespace)?)?.json(&PutNamespace { quota });
        self.json(request).await
    }

    /// `DELETE /v1/namespaces/{namespace}`: removes a namespace. Without `force` the daemon refuses
    /// (`namespace_in_use`) while it has grants or waiters; with `force` they end with it.
    pub async fn remove_namespace(&self, namespace: &str, force: bool) -> Result<RemovedNamespace, ClientError> {
        let mut path = namespace_path(namespace)?;
        if force {
            path.push_str("?force=true");
        }
        self.json(self.request(Method::DELETE, &path)?).await
    }

    /// `PUT /v1/namespaces/{namespace}/grants/{token}`: allocates `token`.
    ///
    /// The answer's status says whether it was granted; `Exhausted` and `NamespaceQuotaExceeded`
    /// are answers, not errors. With `wait_ms` the daemon holds the request until there is room or
    /// the wait ends, and this request's timeout is the wait plus the usual request timeout.
    pub async fn allocate(
        &self,
        namespace: &str,
        token: &str,
        allocate: &Allocate,
    ) -> Result<AllocateResponse, ClientError> {
        let mut request = self.request(Method::PUT, &grant_path(namespace, token)?)?.json(allocate);
        if let Some(wait_ms) = allocate.wait_ms {
            request = request.timeout(self.request_timeout.saturating_add(Duration::from_millis(wait_ms)));
        }
        self.json(request).await
    }

    /// `DELETE /v1/namespaces/{namespace}/grants/{token}`: releases `token`. Idempotent: releasing
    /// a token that is not granted answers `released: false`. With `fencing`, the daemon refuses
    /// (`stale_fencing`) if the grant carries another fencing number.
    pub async fn release(
        &self,
        namespace: &str,
        token: &str,
        fencing: Option<u64>,
    ) -> Result<ReleaseResponse, ClientError> {
        let mut path = grant_path(namespace, token)?;
        if let Some(fencing) = fencing {
            path.push_str(&format!("?fencing={fencing}"));
        }
        // A release is idempotent, so it is safe to repeat until the daemon acknowledges it: a
        // lost release would hold the units until the lease (if any) ends.
        let started = std::time::Instant::now();
        let mut pause = Duration::from_millis(50);
        loop {
            match self.json(self.request(Method::DELETE, &path)?).await {
                Err(err) if err.is_retryable() && started.elapsed() + pause < self.release_retry_for => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                res => return res,
            }
        }
    }

    /// `POST /v1/namespaces/{namespace}/grants/{token}/keepalive`: renews the grant's lease. With
    /// `fencing`, the daemon refuses (`stale_fencing`) if the grant carries another fencing number.
    pub async fn keepalive(&self, namespace: &str, token: &str, fencing: Option<u64>) -> Result<Grant, ClientError> {
        let path = format!("{}/keepalive", grant_path(namespace, token)?);
        self.json(self.request(Method::POST, &path)?.json(&Keepalive { fencing })).await
    }

    /// `GET /v1/namespaces/{namespace}/grants`, every page: the grants of a namespace, by token.
    pub async fn grants(&self, namespace: &str) -> Result<GrantList, ClientError> {
        self.all_pages(&format!("{}/grants", namespace_path(namespace)?)).await
    }

    /// `GET /v1/namespaces/{namespace}/grants`: one page of the grants of a namespace, by token.
    pub async fn grants_page(&self, namespace: &str, page: &PageArgs) -> Result<GrantList, ClientError> {
        self.page(&format!("{}/grants", namespace_path(namespace)?), page).await
    }

    /// `GET /v1/namespaces/{namespace}/grants/{token}`: one grant (`grant_not_found` if the token is
    /// not granted).
    pub async fn grant(&self, namespace: &str, token: &str) -> Result<Grant, ClientError> {
        self.json(self.request(Method::GET, &grant_path(namespace, token)?)?).await
    }

    /// `GET /v1/namespaces/{namespace}/waiters`, every page: the allocate calls waiting for room,
    /// head first. The queue may move between two pages: each page gives the places at its read.
    pub async fn waiters(&self, namespace: &str) -> Result<WaiterList, ClientError> {
        self.all_pages(&format!("{}/waiters", namespace_path(namespace)?)).await
    }

    /// `GET /v1/namespaces/{namespace}/waiters`: one page of the waiters, head first; the next
    /// page continues after the last waiter of this one in arrival order.
    pub async fn waiters_page(&self, namespace: &str, page: &PageArgs) -> Result<WaiterList, ClientError> {
        self.page(&format!("{}/waiters", namespace_path(namespace)?), page).await
    }

    /// `POST /v1/sessions`: opens a session that lives `ttl_ms` milliseconds past its last
    /// keepalive.
    pub async fn open_session(&self, ttl_ms: u64) -> Result<Session, ClientError> {
        self.json(self.request(Method::POST, "/v1/sessions")?.json(&OpenSession { ttl_ms })).await
    }

    /// `POST /v1/sessions/{id}/keepalive`: renews a session's lease.
    pub async fn keepalive_session(&self, id: &str) -> Result<Session, ClientError> {
        let path = format!("{}/keepalive", session_path(id)?);
        self.json(self.request(Method::POST, &path)?).await
    }

    /// `DELETE /v1/sessions/{id}`: closes a session and releases its grants.
    pub async fn close_session(&self, id: &str) -> Result<Session, ClientError> {
        self.json(self.request(Method::DELETE, &session_path(id)?)?).await
    }

    /// `GET /v1/sessions`, every page: every open session, by id.
    pub async fn sessions(&self) -> Result<SessionList, ClientError> {
        self.all_pages("/v1/sessions").await
    }

    /// `GET /v1/sessions`: one page of the open sessions, by id.
    pub async fn sessions_page(&self, page: &PageArgs) -> Result<SessionList, ClientError> {
        self.page("/v1/sessions", page).await
    }

    /// `GET /v1/sessions/{id}`: one session and its grants.
    pub async fn session(&self, id: &str) -> Result<Session, ClientError> {
        self.json(self.request(Method::GET, &session_path(id)?)?).await
    }

    /// `GET /v1/pools`, every page: every pool with its capacity and use, by name.
    pub async fn pools(&self) -> Result<PoolList, ClientError> {
        self.all_pages("/v1/pools").await
    }

    /// `GET /v1/pools`: one page of the pools, by name.
    pub async fn pools_page(&self, page: &PageArgs) -> Result<PoolList, ClientError> {
        self.page("/v1/pools", page).await
    }

    /// `GET /v1/pools/{pool}`.
    pub async fn pool(&self, pool: &str) -> Result<Pool, ClientError> {
        self.json(self.request(Method::GET, &pool_path(pool)?)?).await
    }

    /// `PUT /v1/pools/{pool}`: creates a pool with `capacity` (e.g. `cpu=4,mem=16GiB`) or
    /// changes it; a stopped pool starts again.
    pub async fn put_pool(&self, pool: &str, capacity: &str) -> Result<PutPoolResponse, ClientError> {
        let body = PutPool { capacity: capacity.to_owned(), labels: None };
        self.json(self.request(Method::PUT, &pool_path(pool)?)?.json(&body)).await
    }

    /// `PUT /v1/pools/{pool}` with labels: creates or changes a pool and replaces its labels
    /// (what the scheduler's selectors match).
    pub async fn put_pool_with_labels(
        &self,
        pool: &str,
        capacity: &str,
        labels: std::collections::BTreeMap<String, String>,
    ) -> Result<PutPoolResponse, ClientError> {
        let body = PutPool { capacity: capacity.to_owned(), labels: Some(labels) };
        self.json(self.request(Method::PUT, &pool_path(pool)?)?.json(&body)).await
    }

    /// `GET /v1/queues`: every queue, in path order.
    pub async fn queues(&self) -> Result<QueueList, ClientError> {
        self.json(self.request(Method::GET, "/v1/queues")?).await
    }

    /// `GET /v1/queues/{queue}`.
    pub async fn queue(&self, queue: &str) -> Result<Queue, ClientError> {
        self.json(self.request(Method::GET, &queue_path(queue)?)?).await
    }

    /// `PUT /v1/queues/{queue}`: creates a queue (and its parents) or changes its limits.
    pub async fn put_queue(&self, queue: &str, limits: &PutQueue) -> Result<PutQueueResponse, ClientError> {
        self.json(self.request(Method::PUT, &queue_path(queue)?)?.json(limits)).await
    }

    /// `DELETE /v1/queues/{queue}`: removes a leaf queue with no live application.
    pub async fn remove_queue(&self, queue: &str) -> Result<RemovedQueue, ClientError> {
        self.json(self.request(Method::DELETE, &queue_path(queue)?)?).await
    }

    /// `POST /v1/apps`: submits an application (and the tasks it carries).
    pub async fn submit_app(&self, app: &SubmitApp) -> Result<SubmitAppResponse, ClientError> {
        self.json(self.request(Method::POST, "/v1/apps")?.json(app)).await
    }

    /// `GET /v1/apps`, every page: every application, by id.
    pub async fn apps(&self) -> Result<AppList, ClientError> {
        self.all_pages("/v1/apps").await
    }

    /// `GET /v1/apps`: one page of the applications, by id.
    pub async fn apps_page(&self, page: &PageArgs) -> Result<AppList, ClientError> {
        self.page("/v1/apps", page).await
    }

    /// `GET /v1/apps/{app}`: its state, tasks by state, placeholders, and why it waits.
    pub async fn app(&self, app: &str) -> Result<App, ClientError> {
        self.json(self.request(Method::GET, &app_path(app)?)?).await
    }

    /// `DELETE /v1/apps/{app}`: removes it and releases everything it holds.
    pub async fn remove_app(&self, app: &str) -> Result<App, ClientError> {
        self.json(self.request(Method::DELETE, &app_path(app)?)?).await
    }

    /// `POST /v1/apps/{app}/complete`.
    pub async fn complete_app(&self, app: &str) -> Result<App, ClientError> {
        self.json(self.request(Method::POST, &format!("{}/complete", app_path(app)?))?).await
    }

    /// `POST /v1/apps/{app}/fail`.
    pub async fn fail_app(&self, app: &str, reason: Option<&str>) -> Result<App, ClientError> {
        let body = Fail { reason: reason.map(str::to_owned) };
        self.json(self.request(Method::POST, &format!("{}/fail", app_path(app)?))?.json(&body)).await
    }

    /// `GET /v1/apps/{app}/tasks`, every page: the application's tasks, by id.
    pub async fn tasks(&self, app: &str) -> Result<TaskList, ClientError> {
        self.all_pages(&format!("{}/tasks", app_path(app)?)).await
    }

    /// `GET /v1/apps/{app}/tasks`: one page of the application's tasks, by id.
    pub async fn tasks_page(&self, app: &str, page: &PageArgs) -> Result<TaskList, ClientError> {
        self.page(&format!("{}/tasks", app_path(app)?), page).await
    }

    /// `POST /v1/apps/{app}/tasks`: adds a task.
    pub async fn add_task(&self, app: &str, task: &AddTask) -> Result<AddTaskResponse, ClientError> {
        self.json(self.request(Method::POST, &format!("{}/tasks", app_path(app)?))?.json(task)).await
    }

    /// `GET /v1/apps/{app}/tasks/{task}`: its state, placement (alloc and tokens), or why it waits.
    pub async fn task(&self, app: &str, task: &str) -> Result<Task, ClientError> {
        self.json(self.request(Method::GET, &task_path(app, task)?)?).await
    }

    /// `GET /v1/apps/{app}/tasks/{task}/run`: how the task is being run, and its phase timeline.
    pub async fn task_run(&self, app: &str, task: &str) -> Result<TaskRun, ClientError> {
        self.json(self.request(Method::GET, &format!("{}/run", task_path(app, task)?))?).await
    }

    /// `GET /v1/apps/{app}/tasks/{task}/logs`: a piece of a task's log (`stream`, default
    /// `stdout`) of `attempt` (default the current one) from `offset`, on the daemon that runs it.
    pub async fn task_logs(
        &self,
        app: &str,
        task: &str,
        stream: Option<&str>,
        attempt: Option<u32>,
        offset: u64,
    ) -> Result<TaskLogs, ClientError> {
        let mut request = self.request(Method::GET, &format!("{}/logs", task_path(app, task)?))?;
        request = request.query(&[("offset", offset.to_string())]);
        if let Some(stream) = stream {
            request = request.query(&[("stream", stream)]);
        }
        if let Some(attempt) = attempt {
            request = request.query(&[("attempt", attempt.to_string())]);
        }
        self.json(request).await
    }

    /// `POST /v1/apps/{app}/tasks/{task}/wake`: the task's plugin runs its next round at once,
    /// on the daemon that runs it.
    pub async fn wake_task(&self, app: &str, task: &str) -> Result<Woken, ClientError> {
        self.json(self.request(Method::POST, &format!("{}/wake", task_path(app, task)?))?).await
    }

    /// `DELETE /v1/apps/{app}/tasks/{task}`: removes it and releases what it holds.
    pub async fn remove_task(&self, app: &str, task: &str) -> Result<Task, ClientError> {
        self.json(self.request(Method::DELETE, &task_path(app, task)?)?).await
    }

    /// `POST /v1/apps/{app}/tasks/{task}/start`: reports an Allocated task running.
    pub async fn start_task(&self, app: &str, task: &str) -> Result<Task, ClientError> {
        self.json(self.request(Method::POST, &format!("{}/start", task_path(app, task)?))?).await
    }

    /// `POST /v1/apps/{app}/tasks/{task}/complete`: reports it completed; what it holds is released.
    pub async fn complete_task(&self, app: &str, task: &str) -> Result<Task, ClientError> {
        self.json(self.request(Method::POST, &format!("{}/complete", task_path(app, task)?))?).await
    }

    /// `POST /v1/apps/{app}/tasks/{task}/fail`: reports it failed; what it holds is released.
    pub async fn fail_task(&self, app: &str, task: &str, reason: Option<&str>) -> Result<Task, ClientError> {
        let body = Fail { reason: reason.map(str::to_owned) };
        self.json(self.request(Method::POST, &format!("{}/fail", task_path(app, task)?))?.json(&body)).await
    }

    /// `DELETE /v1/pools/{pool}`: removes a pool; with `force` also when it has allocs.
    pub async fn remove_pool(&self, pool: &str, force: bool) -> Result<RemovedPool, ClientError> {
        let path = format!("{}?force={force}", pool_path(pool)?);
        self.json(self.request(Method::DELETE, &path)?).await
    }

    /// `GET /v1/pools/{pool}/offers`: the pool's offer (everything free), if any.
    pub async fn offers(&self, pool: &str) -> Result<OfferList, ClientError> {
        let path = format!("{}/offers", pool_path(pool)?);
        self.json(self.request(Method::GET, &path)?).await
    }

    /// `POST /v1/pools/{pool}/offers/{offer}`: accepts an offer. `offer_expired` (409) means the
    /// room is gone: try another offer.
    pub async fn accept(&self, pool: &str, offer: &str, request: &Accept) -> Result<Alloc, ClientError> {
        let path = format!("{}/offers/{}", pool_path(pool)?, segment("offer", offer)?);
        self.json(self.request(Method::POST, &path)?.json(request)).await
    }

    /// `GET /v1/pools/{pool}/allocs`, every page: the live allocs of a pool, by id.
    pub async fn allocs(&self, pool: &str) -> Result<AllocList, ClientError> {
        self.all_pages(&format!("{}/allocs", pool_path(pool)?)).await
    }

    /// `GET /v1/pools/{pool}/allocs`: one page of the live allocs of a pool, by id.
    pub async fn allocs_page(&self, pool: &str, page: &PageArgs) -> Result<AllocList, ClientError> {
        self.page(&format!("{}/allocs", pool_path(pool)?), page).await
    }

    /// `GET /v1/pools/{pool}/allocs/{alloc}`: an alloc, live or ended (the daemon answers an
    /// ended one with 410 Gone and its record; `ended` says why).
    pub async fn alloc(&self, pool: &str, alloc: &str) -> Result<Alloc, ClientError> {
        let (request, body) =
            self.send_accepting(self.request(Method::GET, &alloc_path(pool, alloc)?)?, Some(410)).await?;
        serde_json::from_slice(&body).map_err(|err| decode_error(request, err, &body))
    }

    /// `POST /v1/pools/{pool}/allocs/{alloc}/keepalive`: renews the lease; answers the interval
    /// granted. `alloc_ended` (409) is final.
    pub async fn keepalive_alloc(
        &self,
        pool: &str,
        alloc: &str,
        interval: Duration,
    ) -> Result<AllocKeepaliveResponse, ClientError> {
        let path = format!("{}/keepalive", alloc_path(pool, alloc)?);
        let body = AllocKeepalive { interval_ms: interval.as_millis().min(u128::from(u64::MAX)) as u64 };
        self.json(self.request(Method::POST, &path)?.json(&body)).await
    }

    /// `DELETE /v1/pools/{pool}/allocs/{alloc}`: frees an alloc.
    pub async fn free_alloc(&self, pool: &str, alloc: &str) -> Result<Alloc, ClientError> {
        self.json(self.request(Method::DELETE, &alloc_path(pool, alloc)?)?).await
    }

    /// `POST /v1/pools/{pool}/stop-if-idle`: stops the pool if it has been idle for `idle`.
    pub async fn stop_if_idle(&self, pool: &str, idle: Duration) -> Result<StopIfIdleResponse, ClientError> {
        let path = format!("{}/stop-if-idle", pool_path(pool)?);
        let body = StopIfIdle { idle_ms: idle.as_millis().min(u128::from(u64::MAX)) as u64 };
        self.json(self.request(Method::POST, &path)?.json(&body)).await
    }

    /// One page of the list at `path`.
    async fn page<L: Paged>(&self, path: &str, page: &PageArgs) -> Result<L, ClientError> {
        let mut request = self.request(Method::GET, path)?;
        if let Some(limit) = page.limit {
            request = request.query(&[("limit", limit)]);
        }
        if let Some(cursor) = &page.cursor {
            request = request.query(&[("cursor", cursor)]);
        }
        self.json(request).await
    }

    /// Every page of the list at `path`, from the first, as one list (`next_cursor` is `None`).
    async fn all_pages<L: Paged>(&self, path: &str) -> Result<L, ClientError> {
        let mut args = PageArgs { limit: Some(MAX_PAGE_LIMIT), cursor: None };
        let mut list: L = self.page(path, &args).await?;
        while let Some(cursor) = list.take_next_cursor() {
            if args.cursor.as_deref() == Some(cursor.as_str()) {
                return Err(ClientError::Api {
                    status: 200,
                    code: "unexpected_response".to_owned(),
                    message: format!("GET {path}: the daemon gave the same cursor twice"),
                });
            }
            args.cursor = Some(cursor);
            list.append(self.page(path, &args).await?);
        }
        Ok(list)
    }

    /// A request to `path` (which starts with `/` and is already encoded) with the default timeout.
    fn request(&self, method: Method, path: &str) -> Result<RequestBuilder, ClientError> {
        let text = format!("{}{path}", self.base);
        let url = Url::parse(&text).map_err(|err| ClientError::InvalidUrl(format!("`{text}`: {err}")))?;
        Ok(self.http.request(method, url).timeout(self.request_timeout))
    }

    /// Sends `request` and decodes a successful answer's JSON body as `T`.
    async fn json<T: DeserializeOwned>(&self, request: RequestBuilder) -> Result<T, ClientError> {
        let (request, body) = self.send(request).await?;
        serde_json::from_slice(&body).map_err(|err| decode_error(request, err, &body))
    }

    /// Sends `request`; answers "METHOD path" (for error messages) and the body of a successful
    /// answer, or the daemon's error.
    async fn send(&self, request: RequestBuilder) -> Result<(String, Vec<u8>), ClientError> {
        self.send_accepting(request, None).await
    }

    /// [`Client::send`], taking the answer of status `also` as a success too.
    ///
    /// A 503 `store_unavailable` with `Retry-After` is sent again, as
    /// [`Client::with_unavailable_retry`] says.
    async fn send_accepting(
        &self,
        request: RequestBuilder,
        also: Option<u16>,
    ) -> Result<(String, Vec<u8>), ClientError> {
        let mut request = request.build()?;
        let what = format!("{} {}", request.method(), request.url().path());
        let started = std::time::Instant::now();
        let mut retries = 0;
        loop {
            // A body that cannot be cloned (none of this client's) is sent once.
            let again = if retries < self.unavailable_retries { request.try_clone() } else { None };
            let response = self.http.execute(request).await?;
            let status = response.status();
            let pause = retry_after(response.headers());
            let body = response.bytes().await?.to_vec();
            if status.is_success() || Some(status.as_u16()) == also {
                return Ok((what, body));
            }
            let err = api_error(&what, status, &body);
            match (again, pause) {
                (Some(next), Some(pause))
                    if err.code() == Some("store_unavailable")
                        && started.elapsed() + pause <= self.unavailable_retry_for =>
                {
                    tokio::time::sleep(pause).await;
                    request = next;
                    retries += 1;
                }
                _ => return Err(err),
            }
        }
    }
}

/// The pause a `Retry-After` header asks for, in seconds (its date form is not used), at most
/// [`MAX_RETRY_AFTER`].
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let seconds: u64 = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(seconds).min(MAX_RETRY_AFTER))
}

/// The error of an answer with status `status` and `body` to the request `what`.
fn api_error(what: &str, status: reqwest::StatusCode, body: &[u8]) -> ClientError {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(ErrorBody { error }) => {
            ClientError::Api { status: status.as_u16(), code: error.code, message: error.message }
        }
        Err(_) => {
            let reason = status.canonical_reason().unwrap_or("unexpected status");
            let text = snippet(body);
            let message =
                if text.is_empty() { format!("{what}: {reason}") } else { format!("{what}: {reason}: {text}") };
            ClientError::Api { status: status.as_u16(), code: "unexpected_response".to_owned(), message }
        }
    }
}

/// The most items the daemon answers in one page of a list.
pub const MAX_PAGE_LIMIT: u32 = 1000;

/// Which page of a list to read: `PageArgs::default()` is the first page, of the daemon's default
/// size (100).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageArgs {
    /// Items per page, 1 to [`MAX_PAGE_LIMIT`].
    pub limit: Option<u32>,
    /// The `next_cursor` of the page before; `None` for the first page.
    pub cursor: Option<String>,
}

/// A list body that comes in pages.
trait Paged: DeserializeOwned {
    /// Takes the cursor of the next page out of this one.
    fn take_next_cursor(&mut self) -> Option<String>;
    /// Appends the items of the next page, and takes its cursor.
    fn append(&mut self, page: Self);
}

macro_rules! paged {
    ($($list:ty => $items:ident),* $(,)?) => {$(
        impl Paged for $list {
            fn take_next_cursor(&mut self) -> Option<String> {
                self.next_cursor.take()
            }
            fn append(&mut self, page: Self) {
                self.$items.extend(page.$items);
                self.next_cursor = page.next_cursor;
            }
        }
    )*};
}

paged!(
    NamespaceList => namespaces,
    GrantList => grants,
    WaiterList => waiters,
    SessionList => sessions,
    PoolList => pools,
    AllocList => allocs,
    AppList => apps,
    TaskList => tasks,
);

/// Checks a base URL and drops its trailing `/`.
fn normalize_base(base_url: &str) -> Result<String, ClientError> {
    let trimmed = base_url.trim();
    if trimmed.is_empty() {
        return Err(ClientError::InvalidUrl("the server URL is empty".to_owned()));
    }
    let text = if trimmed.contains("://") { trimmed.to_owned() } else { format!("http://{trimmed}") };
    let url = Url::parse(&text).map_err(|err| ClientError::InvalidUrl(format!("`{base_url}`: {err}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ClientError::InvalidUrl(format!("`{base_url}`: the scheme must be http or https")));
    }
    if url.host_str().unwrap_or_default().is_empty() {
        return Err(ClientError::InvalidUrl(format!("`{base_url}`: no host")));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(ClientError::InvalidUrl(format!("`{base_url}`: a server URL has no query or fragment")));
    }
    Ok(url.as_str().trim_end_matches('/').to_owned())
}

fn namespace_path(namespace: &str) -> Result<String, ClientError> {
    Ok(format!("/v1/namespaces/{}", segment("namespace", namespace)?))
}

fn grant_path(namespace: &str, token: &str) -> Result<String, ClientError> {
    Ok(format!("{}/grants/{}", namespace_path(namespace)?, segment("token", token)?))
}

fn pool_path(pool: &str) -> Result<String, ClientError> {
    Ok(format!("/v1/pools/{}", segment("pool", pool)?))
}

fn alloc_path(pool: &str, alloc: &str) -> Result<String, ClientError> {
    Ok(format!("{}/allocs/{}", pool_path(pool)?, segment("alloc", alloc)?))
}

fn queue_path(queue: &str) -> Result<String, ClientError> {
    Ok(format!("/v1/queues/{}", segment("queue", queue)?))
}

fn app_path(app: &str) -> Result<String, ClientError> {
    Ok(format!("/v1/apps/{}", segment("application", app)?))
}

fn task_path(app: &str, task: &str) -> Result<String, ClientError> {
    Ok(format!("{}/tasks/{}", app_path(app)?, segment("task", task)?))
}

fn session_path(id: &str) -> Result<String, ClientError> {
    Ok(format!("/v1/sessions/{}", segment("session id", id)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        assert_eq!(normalize_base("http://127.0.0.1:7070").unwrap(), "http://127.0.0.1:7070");
        assert_eq!(normalize_base("http://127.0.0.1:7070/").unwrap(), "http://127.0.0.1:7070");
        assert_eq!(normalize_base("127.0.0.1:7070").unwrap(), "http://127.0.0.1:7070");
        assert_eq!(normalize_base("localhost:7070").unwrap(), "http://localhost:7070");
        assert_eq!(normalize_base("http://proxy/allot/").unwrap(), "http://proxy/allot");
        assert!(normalize_base("").is_err());
        assert!(normalize_base("ftp://host").is_err());
        assert!(normalize_base("http://host/?x=1").is_err());
        assert!(normalize_base("http://").is_err());
    }

    #[test]
    fn paths() {
        assert_eq!(grant_path("hive:a", "job 1/2").unwrap(), "/v1/namespaces/hive%3Aa/grants/job%201%2F2");
        assert!(grant_path("hive", "..").is_err());
    }

    #[test]
    fn retry_after_is_read_in_seconds_and_capped() {
        let headers = |value: &str| {
            let mut headers = reqwest::header::HeaderMap::new();
            headers.insert(reqwest::header::RETRY_AFTER, value.parse().unwrap());
            headers
        };
        assert_eq!(retry_after(&headers("1")), Some(Duration::from_secs(1)));
        assert_eq!(retry_after(&headers(" 0 ")), Some(Duration::ZERO));
        assert_eq!(retry_after(&headers("3600")), Some(MAX_RETRY_AFTER));
        assert_eq!(retry_after(&headers("Wed, 21 Oct 2015 07:28:00 GMT")), None);
        assert_eq!(retry_after(&reqwest::header::HeaderMap::new()), None);
    }

    #[test]
    fn api_error_display() {
        let err = ClientError::Api {
            status: 404,
            code: "namespace_not_found".to_owned(),
            message: "namespace `x` does not exist".to_owned(),
        };
        assert_eq!(err.to_string(), "namespace_not_found: namespace `x` does not exist (HTTP 404)");
        assert_eq!(err.code(), Some("namespace_not_found"));
        assert_eq!(err.status(), Some(404));
    }
}
