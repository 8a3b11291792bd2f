//! Token quotas on Redis: [`QuotaStore`] as calls of the namespace functions (`lua/allocate.lua`,
//! `release.lua`, `keepalive.lua`, ... on the namespace's own slot, see `lua/namespace.lua`), and
//! the same allocate and release called straight from a client ([`DirectScripts`], for `allot
//! bench redis`). A waiting allocate waits through `wake.rs`; the session calls are `sessions.rs`'s.

use std::time::Duration;

use allot_core::{
    check_client_token, check_held_request, check_request, AllocateRequest, LeaseRequest, LedgerError, NamespaceName,
    NamespaceView, QueuePlace, SessionId, Token, WaiterId, WaiterView,
};
use allot_store::{check_wait, Allocation, GrantInfo, Page, PageRequest, QuotaStore, SessionInfo, StoreError};
use async_trait::async_trait;
use futures_util::{stream, StreamExt};

use crate::config::RedisConfig;
use crate::conn::Conn;
use crate::errors::{call_error, redis_error};
use crate::keys::prefix;
use crate::reply::{self, corrupt, Reply};
use crate::scripts::Scripts;
use crate::store::RedisStore;
use crate::{registry, sessions, wake};

/// The request's fields as the scripts take them (see `lua/namespace.lua`).
struct RequestArgs([String; 10]);

impl RequestArgs {
    fn new(request: &AllocateRequest, session_deadline: u64) -> RequestArgs {
        let (project, scope) = match &request.scope {
            Some(scope) => (scope.project.to_string(), scope.namespace.to_string()),
            None => (String::new(), String::new()),
        };
        let cap = |cap: Option<u64>| cap.map(|c| c.to_string()).unwrap_or_default();
        let (kind, ttl, session) = match request.lease {
            LeaseRequest::None => ("n", 0, String::new()),
            LeaseRequest::Ttl { ttl_ms } => ("t", ttl_ms, String::new()),
            LeaseRequest::Session(id) => ("s", 0, id.to_string()),
        };
        RequestArgs([
            request.token.as_str().to_owned(),
            request.units.to_string(),
            project,
            scope,
            cap(request.constraints.project),
            cap(request.constraints.namespace),
            kind.to_owned(),
            ttl.to_string(),
            session,
            session_deadline.to_string(),
        ])
    }
}

#[async_trait]
impl QuotaStore for RedisStore {
    async fn put_namespace(&self, name: NamespaceName, quota: u64) -> Result<(bool, NamespaceView), StoreError> {
        self.put(name, quota, false).await
    }

    async fn seed_namespace(&self, name: NamespaceName, quota: u64) -> Result<(bool, NamespaceView), StoreError> {
        self.put(name, quota, true).await
    }

    async fn remove_namespace(&self, name: NamespaceName, force: bool) -> Result<usize, StoreError> {
        self.live()?;
        let inner = &self.inner;
        // Listed as retired first: its fencing counter, kept when it goes, is in every snapshot.
        registry::register(inner, "add", "retired", name.as_str()).await?;
        let mut reply =
            inner.eval(&inner.scripts.remove_namespace, &prefix(&name), &[if force { "1" } else { "0" }], true).await?;
        match reply.text()?.as_str() {
            "removed" => {
                let grants = reply.uint()? as usize;
                registry::register(inner, "remove", "namespaces", name.as_str()).await?;
                Ok(grants)
            }
            "err" => Err(reply::error(&name, None, &mut reply)?),
            other => Err(corrupt(format!("remove reply `{other}`"))),
        }
    }

    async fn namespaces(
        &self,
        page: PageRequest<NamespaceName>,
    ) -> Result<Page<NamespaceView, NamespaceName>, StoreError> {
        let names =
            registry::registry_page(&self.inner, "namespaces", page.after().map(NamespaceName::as_str), page.limit())
                .await?
                .iter()
                .filter_map(|name| NamespaceName::new(name).ok())
                .collect();
        let Page { items: names, next } = Page::from_read(names, page.limit(), NamespaceName::clone);
        let views: Vec<Result<NamespaceView, StoreError>> =
            stream::iter(names).map(|name| self.namespace(name)).buffered(16).collect().await;
        let mut items = Vec::new();
        for view in views {
            match view {
                Ok(view) => items.push(view),
                // Listed but removed meanwhile (or half created by a daemon that died).
                Err(StoreError::Quotas(LedgerError::NamespaceNotFound(_))) => {}
                Err(err) => return Err(err),
            }
        }
        Ok(Page { items, next })
    }

    async fn namespace(&self, name: NamespaceName) -> Result<NamespaceView, StoreError> {
        let inner = &self.inner;
        let mut reply = inner.eval(&inner.scripts.view, &prefix(&name), &[], false).await?;
        if reply.len() == 2 {
            reply.text()?;
            return Err(reply::error(&name, None, &mut reply)?);
        }
        reply::view(&name, &mut reply)
    }

    async fn allocate(&self, request: AllocateRequest, wait: Duration) -> Result<Allocation, StoreError> {
        check_request(&request)?;
        self.allocate_checked(request, wait).await
    }

    async fn allocate_held(&self, request: AllocateRequest, wait: Duration) -> Result<Allocation, StoreError> {
        check_held_request(&request)?;
        self.allocate_checked(request, wait).await
    }

    async fn release_held(&self, namespace: NamespaceName, token: Token) -> Result<Option<GrantInfo>, StoreError> {
        self.release_checked(namespace, token, None).await
    }

    async fn release(
        &self,
        namespace: NamespaceName,
        token: Token,
        fencing: Option<u64>,
    ) -> Result<Option<GrantInfo>, StoreError> {
        check_client_token(&namespace, &token)?;
        self.release_checked(namespace, token, fencing).await
    }

    async fn keepalive_grant(
        &self,
        namespace: NamespaceName,
        token: Token,
        fencing: Option<u64>,
    ) -> Result<GrantInfo, StoreError> {
        self.live()?;
        check_client_token(&namespace, &token)?;
        let inner = &self.inner;
        let fencing = fencing.map(|f| f.to_string()).unwrap_or_default();
        let mut reply =
            inner.eval(&inner.scripts.keepalive, &prefix(&namespace), &[token.as_str(), &fencing], true).await?;
        match reply.text()?.as_str() {
            "grant" => {
                let mut info = reply::grant_info(&mut reply, &namespace, token.as_str())?;
                // A session grant lives as long as its session: renew the session.
                if let allot_core::Lease::Session(id) = info.grant.lease {
                    info.expires_in_ms = Some(sessions::keepalive(&self.inner, id).await?.expires_in_ms);
                }
                Ok(info)
            }
            "err" => Err(reply::error(&namespace, Some(&token), &mut reply)?),
            other => Err(corrupt(format!("keepalive reply `{other}`"))),
        }
    }

    async fn grants(
        &self,
        namespace: NamespaceName,
        page: PageRequest<Token>,
    ) -> Result<Page<GrantInfo, Token>, StoreError> {
        // Grants live in a hash (one write per grant): the page is picked from its keys here, in
        // byte order (Lua compares strings by the server's locale), then its grants are read.
        let key = format!("{}:grants", prefix(&namespace));
        let tokens = self.inner.hash_keys(&key).await?;
        let after = page.after().map(Token::as_str);
        let tokens = allot_core::first_after(tokens.into_iter(), String::as_str, after, page.limit() + 1);
        let Page { items: tokens, next } = Page::from_read(tokens, page.limit(), String::clone);
        let next = next.map(|t| Token::new(&t)).transpose().map_err(corrupt)?;
        let mut args: Vec<&str> = vec![""];
        args.extend(tokens.iter().map(String::as_str));
        let items = self.read_grants(&namespace, &args).await?;
        Ok(Page { items, next })
    }

    async fn grant(&self, namespace: NamespaceName, token: Token) -> Result<GrantInfo, StoreError> {
        let mut grants = self.read_grants(&namespace, &[token.as_str()]).await?;
        grants.pop().ok_or_else(|| corrupt("an empty grant reply"))
    }

    async fn waiters(
        &self,
        namespace: NamespaceName,
        page: PageRequest<u64>,
    ) -> Result<Page<WaiterView, u64>, StoreError> {
        let inner = &self.inner;
        let after = page.after().map(u64::to_string).unwrap_or_default();
        let limit = (page.limit() + 1).to_string();
        let mut reply = inner.eval(&inner.scripts.waiters, &prefix(&namespace), &[&after, &limit], false).await?;
        let first = reply.text()?;
        if first == "err" {
            return Err(reply::error(&namespace, None, &mut reply)?);
        }
        let now: u64 = first.parse().map_err(|_| corrupt("waiters reply"))?;
        let (ahead, mut units_ahead) = (reply.uint()? as usize, reply.uint()?);
        let mut res = Vec::new();
        while !reply.is_empty() {
            let id = reply.uint()?;
            let arrival = reply.uint()?;
            let record = reply.text()?;
            let level = reply::cap_level(&reply.text()?)?;
            let f: Vec<&str> = record.split('\n').collect();
            if f.len() != 12 {
                return Err(corrupt("a waiter record"));
            }
            let units: u64 = f[1].parse().map_err(|_| corrupt("waiter units"))?;
            let since: u64 = f[10].parse().map_err(|_| corrupt("waiter since"))?;
            res.push(WaiterView {
                id: WaiterId(id),
                arrival,
                place: QueuePlace { position: ahead + res.len() + 1, units_ahead },
                token: Token::new(f[0]).map_err(corrupt)?,
                units,
                scope: reply::scope(f[2], f[3])?,
                waited_ms: now.saturating_sub(since),
                blocked_by_cap: level,
            });
            units_ahead = units_ahead.saturating_add(units);
        }
        Ok(Page::from_read(res, page.limit(), |w| w.arrival))
    }

    async fn open_session(&self, ttl_ms: u64, owner: Option<String>) -> Result<SessionInfo, StoreError> {
        self.live()?;
        sessions::open(&self.inner, ttl_ms, owner).await
    }

    async fn keepalive_session(&self, id: SessionId) -> Result<SessionInfo, StoreError> {
        self.live()?;
        sessions::keepalive(&self.inner, id).await
    }

    async fn close_session(&self, id: SessionId) -> Result<SessionInfo, StoreError> {
        self.live()?;
        sessions::close(&self.inner, id).await
    }

    async fn sessions(&self, page: PageRequest<SessionId>) -> Result<Page<SessionInfo, SessionId>, StoreError> {
        sessions::list(&self.inner, page).await
    }

    async fn session(&self, id: SessionId) -> Result<SessionInfo, StoreError> {
        sessions::get(&self.inner, id).await
    }
}

impl RedisStore {
    async fn allocate_checked(&self, request: AllocateRequest, wait: Duration) -> Result<Allocation, StoreError> {
        self.live()?;
        check_wait(wait)?;
        let inner = &self.inner;
        // The wait counts from the call, not from when its waiter was queued.
        let deadline = inner.time.monotonic_ms().saturating_add(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX));
        let key = prefix(&request.namespace);
        // A session's deadline comes from its own slot; the grant keeps a copy of it.
        let session_deadline = match request.lease {
            LeaseRequest::Session(id) => sessions::touch(inner, id, &request.namespace).await?,
            _ => 0,
        };
        let fields = RequestArgs::new(&request, session_deadline);
        let wait_ms = (wait.as_millis() as u64).to_string();
        let mut args: Vec<&str> = fields.0.iter().map(String::as_str).collect();
        args.push(&wait_ms);
        let mut reply = inner.eval(&inner.scripts.allocate, &key, &args, true).await?;
        match reply.text()?.as_str() {
            "granted" => {
                let existing = reply.int()? == 1;
                let grant = reply::grant_info(&mut reply, &request.namespace, request.token.as_str())?;
                Ok(Allocation::Granted { grant, existing })
            }
            "refused" => {
                let refusal = reply::refusal(&mut reply)?;
                let position = reply.uint()? as usize;
                let units_ahead = reply.uint()?;
                let place = (position > 0).then_some(QueuePlace { position, units_ahead });
                Ok(Allocation::Refused { refusal, place })
            }
            "queued" => {
                let wid = reply.uint()?;
                wake::wait_for(inner, request.namespace, request.token, key, wid, deadline).await
            }
            "err" => Err(reply::error(&request.namespace, Some(&request.token), &mut reply)?),
            other => Err(corrupt(format!("allocate reply `{other}`"))),
        }
    }

    async fn release_checked(
        &self,
        namespace: NamespaceName,
        token: Token,
        fencing: Option<u64>,
    ) -> Result<Option<GrantInfo>, StoreError> {
        self.live()?;
        let inner = &self.inner;
        let fencing = fencing.map(|f| f.to_string()).unwrap_or_default();
        let mut reply =
            inner.eval(&inner.scripts.release, &prefix(&namespace), &[token.as_str(), &fencing], true).await?;
        match reply.text()?.as_str() {
            "released" => {
                let grant = reply::grant(&namespace, token.as_str(), &reply.text()?)?;
                Ok(Some(GrantInfo { grant, expires_in_ms: None }))
            }
            "none" => Ok(None),
            "err" => Err(reply::error(&namespace, Some(&token), &mut reply)?),
            other => Err(corrupt(format!("release reply `{other}`"))),
        }
    }

    async fn put(
        &self,
        name: NamespaceName,
        quota: u64,
        create_only: bool,
    ) -> Result<(bool, NamespaceView), StoreError> {
        self.live()?;
        if quota > allot_core::MAX_UNITS {
            return Err(
                LedgerError::OutOfRange { what: "quota", value: quota, min: 0, max: allot_core::MAX_UNITS }.into()
            );
        }
        let inner = &self.inner;
        // Listed first: a namespace is never in Redis without being in the registry.
        registry::register(inner, "add", "namespaces", name.as_str()).await?;
        let quota_text = quota.to_string();
        let mut reply = inner
            .eval(
                &inner.scripts.put_namespace,
                &prefix(&name),
                &[&quota_text, if create_only { "1" } else { "0" }],
                true,
            )
            .await?;
        let created = reply.int()? == 1;
        let view = reply::view(&name, &mut reply)?;
        wake::nudge_scheduler(inner).await;
        Ok((created, view))
    }

    /// Calls the `grants` function with `args`: one token, or `""` and the tokens of a page.
    async fn read_grants(&self, namespace: &NamespaceName, args: &[&str]) -> Result<Vec<GrantInfo>, StoreError> {
        let inner = &self.inner;
        let mut reply = inner.eval(&inner.scripts.grants, &prefix(namespace), args, false).await?;
        let first = reply.text()?;
        if first == "err" {
            let token = args.first().filter(|t| !t.is_empty()).and_then(|t| Token::new(t).ok());
            return Err(reply::error(namespace, token.as_ref(), &mut reply)?);
        }
        let mut res = Vec::new();
        while !reply.is_empty() {
            let token = reply.text()?;
            res.push(reply::grant_info(&mut reply, namespace, &token)?);
        }
        Ok(res)
    }
}

/// The allocate and release scripts called straight from a Rust client, with no daemon and no
/// HTTP: the ceiling of any Redis-backed design, for `allot bench redis`.
pub struct DirectScripts {
    conn: Conn,
    scripts: Scripts,
}

impl DirectScripts {
    pub async fn connect(config: &RedisConfig) -> Result<DirectScripts, StoreError> {
        let conn = Conn::connect(config).await.map_err(|e| redis_error(e, false))?;
        Ok(DirectScripts { conn, scripts: Scripts::new(config.cluster, config.min_replicas) })
    }

    /// Allocates without waiting; true if granted.
    pub async fn allocate(&self, request: &AllocateRequest) -> Result<bool, StoreError> {
        let fields = RequestArgs::new(request, 0);
        let mut args: Vec<&str> = fields.0.iter().map(String::as_str).collect();
        args.push("0");
        let value = self
            .conn
            .fcall(&self.scripts.library, &self.scripts.allocate, &prefix(&request.namespace), &args, true)
            .await;
        let mut reply = Reply::new(value.map_err(|e| call_error(e, true))?)?;
        Ok(reply.text()? == "granted")
    }

    /// Releases; true if the token was granted.
    pub async fn release(&self, namespace: &NamespaceName, token: &Token) -> Result<bool, StoreError> {
        let value = self
            .conn
            .fcall(&self.scripts.library, &self.scripts.release, &prefix(namespace), &[token.as_str(), ""], true)
            .await;
        let mut reply = Reply::new(value.map_err(|e| call_error(e, true))?)?;
        Ok(reply.text()? == "released")
    }
}

#[cfg(test)]
mod tests {
    use allot_core::Constraints;
    use allot_store::Store;
    use redis::Value;

    use super::*;
    use crate::testing::{RedisServer, TestClock};

    /// Queues `request` as a waiting allocate does, with no call waiting for the answer yet:
    /// the waiter's id.
    async fn queue(store: &RedisStore, request: &AllocateRequest) -> u64 {
        let fields = RequestArgs::new(request, 0);
        let mut args: Vec<&str> = fields.0.iter().map(String::as_str).collect();
        args.push("60000");
        let inner = &store.inner;
        let mut reply = inner.eval(&inner.scripts.allocate, &prefix(&request.namespace), &args, true).await.unwrap();
        assert_eq!(reply.text().unwrap(), "queued");
        reply.uint().unwrap()
    }

    async fn answers_kept(store: &RedisStore, name: &NamespaceName) -> i64 {
        let hlen = redis::cmd("HLEN").arg(format!("{}:woken", prefix(name))).to_owned();
        match store.inner.conn.query(&hlen).await.unwrap() {
            Value::Int(n) => n,
            other => panic!("HLEN answered {other:?}"),
        }
    }

    /// Regression (seen once in CI, in `quotas_over_time_answer_like_the_ledger`): a sweep that ran
    /// between a namespace's removal and the moment a waiting call claimed its answer deleted
    /// the answer, and the call failed with "a newer allocate call ... took over this wait"
    /// instead of being told the namespace is gone. A namespace made again under the same name
    /// keeps such answers for the grace time only.
    #[tokio::test]
    async fn a_waiter_of_a_removed_namespace_is_told_so_even_after_a_sweep() {
        let server = RedisServer::start();
        let (store, mut clock) = TestClock::open(&server, 1_700_000_000_000).await;
        let name = NamespaceName::new("removed-while-waiting").unwrap();
        let request = |token: &str| AllocateRequest {
            namespace: name.clone(),
            token: Token::new(token).unwrap(),
            units: 1,
            scope: None,
            constraints: Constraints::default(),
            lease: LeaseRequest::None,
        };
        store.put_namespace(name.clone(), 1).await.unwrap();
        store.allocate(request("held"), Duration::ZERO).await.unwrap();
        let first = queue(&store, &request("first")).await;
        let second = queue(&store, &request("second")).await;
        store.remove_namespace(name.clone(), true).await.unwrap();
        crate::sweep::sweep(&store.inner, std::slice::from_ref(&name), &[]).await;

        let token = Token::new("first").unwrap();
        let answer = wake::wait_for(
            &store.inner,
            name.clone(),
            token,
            prefix(&name),
            first,
            store.inner.time.monotonic_ms() + 5_000,
        )
        .await;
        assert!(
            matches!(&answer, Err(StoreError::Quotas(LedgerError::NamespaceNotFound(n))) if *n == name),
            "the waiter is told its namespace is gone: {answer:?}"
        );

        // Made again: the answer nobody claimed yet is kept for the grace time, then dropped.
        store.put_namespace(name.clone(), 1).await.unwrap();
        assert_eq!(answers_kept(&store, &name).await, 1, "the answer of waiter {second} is kept");
        clock.set(&store, clock.now() + 31_000).await;
        assert_eq!(answers_kept(&store, &name).await, 0, "after the grace time nobody will claim it");
        store.shutdown().await;
    }
}
