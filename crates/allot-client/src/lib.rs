//! An async client for the allot daemon's HTTP API (v1).
//!
//! [`Client`] has one method per route; each returns the wire type of `allot-api` that the route
//! answers with, or a [`ClientError`]. The daemon's refusals (a 4xx or 5xx with an error body) are
//! [`ClientError::Api`] with the stable error code; an allocate that is not granted
//! (`Exhausted`, `NamespaceQuotaExceeded`) is not an error but an [`AllocateResponse`] with that
//! status.
//!
//! Modules: one per part for its routes (`quotas`, `pools`, `apps`, `runs`; `pools` also holds
//! Reflow's client side of pools: mux, caching, allocate, keepalive), `watch` (the change feed as
//! a stream that resumes by itself, [`Client::watch`]), `sse` (a reader of Server-Sent Events),
//! `path` (request paths), `error` ([`ClientError`]).
//!
//! A whole program (`examples/allocate.rs`, built by the test command):
//!
//! ```no_run
#![doc = include_str!("../examples/allocate.rs")]
//! ```

mod access;
mod apps;
mod error;
mod path;
pub mod pools;
mod quotas;
mod runs;
mod snapshot;
pub mod sse;
mod watch;

use std::time::Duration;

pub use allot_api::*;
use reqwest::{Method, RequestBuilder, Url};
use serde::de::DeserializeOwned;

pub use crate::error::ClientError;
use crate::error::{decode_error, snippet};
pub use crate::snapshot::SnapshotStream;
pub use crate::watch::{WatchFilter, DEFAULT_WATCH_RECONNECT, WATCH_IDLE_TIMEOUT};

/// How long a connection to the daemon may take to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a request may take by default, from sending to the end of the answer. An allocate
/// that waits (`wait_ms`) gets its wait on top of this.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a release is retried by default while the daemon or its store is unreachable.
pub const DEFAULT_RELEASE_RETRY: Duration = Duration::from_secs(300);

/// How many times by default a call answered 503 `store_unavailable` or `starting` with
/// `Retry-After` is sent again (nothing was changed by it), see [`Client::with_unavailable_retry`].
pub const DEFAULT_UNAVAILABLE_RETRIES: u32 = 5;
/// Within how long, from the first try, those retries are made by default.
pub const DEFAULT_UNAVAILABLE_RETRY_FOR: Duration = Duration::from_secs(10);
/// The longest pause before a retry, whatever `Retry-After` asks.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(5);

/// A client of one allot daemon.
///
/// Cheap to clone: clones share one connection pool. There is no timeout on the client as a whole
/// (so long polls are not cut); every request gets its own, see [`Client::with_request_timeout`].
/// How a client talks to a daemon over HTTPS.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// CA certificates (PEM) to trust besides the system's: the daemon's, if self-signed.
    pub ca_cert_pem: Option<Vec<u8>>,
    /// A client certificate and its private key (PEM, both in one), for mutual TLS.
    pub identity_pem: Option<Vec<u8>>,
}

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
    /// How long a watch stream keeps trying to reach the daemon, in a row.
    watch_reconnect_for: Duration,
    /// The API token sent with every call (`Authorization: Bearer ...`).
    token: Option<std::sync::Arc<str>>,
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

    /// Like [`Client::new`], every call over HTTP/2 (for `http://`, h2c with prior knowledge: the
    /// daemon speaks both on one port). Calls then share one connection as streams: many long-poll
    /// waiters and watches cost the daemon a few KiB each instead of a connection each
    /// (docs/benchmarks.md, "Many waiters"). A daemon behind a proxy that speaks only HTTP/1.1
    /// needs [`Client::new`].
    pub fn new_http2(base_url: &str) -> Result<Client, ClientError> {
        let http = reqwest::Client::builder().connect_timeout(CONNECT_TIMEOUT).http2_prior_knowledge().build()?;
        Client::with_http_client(base_url, http)
    }

    /// Like [`Client::new`], for a daemon served over HTTPS (`https://...`): trusting `tls`'s CA
    /// besides the system's, and presenting its client certificate (mutual TLS). Over HTTP/1.1;
    /// give [`Client::with_http_client`] a client of your own for HTTP/2 over TLS.
    pub fn with_tls(base_url: &str, tls: &TlsOptions) -> Result<Client, ClientError> {
        let bad = |what: &str, err: reqwest::Error| ClientError::InvalidTls(format!("{what}: {err}"));
        let mut builder = reqwest::Client::builder().use_rustls_tls().http1_only().connect_timeout(CONNECT_TIMEOUT);
        if let Some(pem) = &tls.ca_cert_pem {
            for cert in reqwest::Certificate::from_pem_bundle(pem).map_err(|e| bad("the CA certificate", e))? {
                builder = builder.add_root_certificate(cert);
            }
        }
        if let Some(pem) = &tls.identity_pem {
            builder = builder.identity(reqwest::Identity::from_pem(pem).map_err(|e| bad("the client certificate", e))?);
        }
        Client::with_http_client(base_url, builder.build()?)
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
            watch_reconnect_for: DEFAULT_WATCH_RECONNECT,
            token: None,
        })
    }

    /// Sends `token` with every call, as `Authorization: Bearer TOKEN` (a daemon with access
    /// configured answers 401 `unauthenticated` without one). An empty token sends none.
    #[must_use]
    pub fn with_token(mut self, token: &str) -> Client {
        let token = token.trim();
        self.token = (!token.is_empty()).then(|| token.into());
        self
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

    /// Sets how a call answered 503 `store_unavailable` or `starting` with a `Retry-After` header
    /// is retried: up to `retries` more times, each after the pause the header asks (at most 5 s),
    /// as long as the next try starts within `within` of the first. Such an answer means nothing
    /// was changed (the daemon's store could not be reached, or, on Redis, a scheduler is being
    /// elected, or the daemon is still opening its store), so any call is safe to send again. Defaults: [`DEFAULT_UNAVAILABLE_RETRIES`] within
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
        let request = self.http.request(method, url).timeout(self.request_timeout);
        Ok(match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        })
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
    /// A 503 `store_unavailable` or `starting` with `Retry-After` is sent again, as
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
                    if matches!(err.code(), Some("store_unavailable" | "starting"))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::path::grant_path;

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
