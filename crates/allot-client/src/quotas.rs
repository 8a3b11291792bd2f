//! The token quotas' routes: namespaces, grants (allocate, release, keepalive), waiters and
//! sessions.

use std::time::Duration;

use reqwest::Method;

use crate::path::*;
use crate::*;

impl Client {
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
    pub async fn keepalive_grant(
        &self,
        namespace: &str,
        token: &str,
        fencing: Option<u64>,
    ) -> Result<Grant, ClientError> {
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
}
