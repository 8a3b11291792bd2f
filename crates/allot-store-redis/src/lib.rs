//! The Redis backend of [`Store`]: several daemons share one Redis or Redis Cluster.
//!
//! Every allocate, release, keepalive and sweep is one atomic Lua script on the hash slot of its
//! namespace (`allot:{<namespace>}:...`), and every script reads the time from Redis (`TIME`),
//! never from a daemon, so daemons with different clocks agree on every lease. The scripts are
//! Redis functions, loaded once per server; they and the key layout are in `src/lua/`, and
//! `lua/namespace.lua` documents both.
//!
//! - Quotas live in Redis: a quota changed through one daemon holds at once for all. The
//!   configuration file only seeds namespaces that do not exist yet ([`Store::seed_namespace`]).
//! - Waiters queue in Redis, first come first served across daemons. A script that grants a
//!   waiter records the answer and publishes the waiter's id on `allot:woken`; the daemon where
//!   the call waits is subscribed and claims the answer at once. A waiting call also checks every
//!   [`POLL_INTERVAL`], so a lost message delays an answer but never loses it.
//! - Sessions share one hash slot (`allot:{allot-sessions}`). A grant held under a session is
//!   kept in its namespace with a copy of the session's deadline; a session keepalive renews
//!   those copies namespace by namespace, and each namespace's sweep ends its session grants at
//!   that deadline on its own.
//! - Every daemon runs the sweep (idempotent): each namespace every [`SWEEP_INTERVAL`].
//! - When Redis cannot be reached, calls fail with [`StoreError::Unavailable`] (nothing was
//!   done) or [`StoreError::OutcomeUnknown`] (the call was sent, its answer was lost), and the
//!   connection comes back by itself.

pub mod app_records;
mod apps;
mod cluster;
mod conn;
mod pools;
mod reply;
mod runs;
mod sched;
pub mod sched_lease;
mod scripts;
pub mod testing;
mod timeouts;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use allot_core::pools::{Alloc, AllocId, AllocRequest, AllocState, EndedAlloc, Labels, Offer, PoolName, PoolView};
use allot_core::{
    check_request, check_session_ttl, AllocateRequest, LeaseRequest, LedgerError, NamespaceName, NamespaceView,
    QueuePlace, Resources, Session, SessionId, Token, WaiterId, WaiterView,
};
use allot_store::{
    check_wait, Allocation, CommitStats, GrantInfo, Page, PageRequest, PoolStore, QuotaStore, SessionInfo, Store,
    StoreError,
};
use async_trait::async_trait;
use futures_util::{stream, StreamExt};
use redis::{RedisError, Value};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use crate::conn::{Conn, WriteError};
use crate::reply::{corrupt, Reply};
use crate::scripts::{Function, Scripts};

/// How often a daemon sweeps every namespace for leases that are due.
pub const SWEEP_INTERVAL: Duration = Duration::from_millis(100);
/// How often a waiting call checks its answer even without a message.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// The channel on which scripts publish the waiters they answered.
const CHANNEL: &str = "allot:woken";
/// The channel on which a daemon says it made room that may admit a waiting application (a
/// quota or a pool put): whoever schedules reads the pools and namespaces again and runs a
/// cycle at once. A plain channel: on a cluster every node forwards it to every subscriber.
const SCHED_CHANNEL: &str = "allot:sched";
/// The slot of the registries of namespaces and pools (`lua/registry.lua`).
const REGISTRY_SLOT: &str = "allot:{allot-registry}";
const REGISTRY: &str = "allot:{allot-registry}:namespaces";
const POOL_REGISTRY: &str = "allot:{allot-registry}:pools";
const SESSIONS: &str = "allot:{allot-sessions}";

/// Where the Redis backend connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// Server URLs: one standalone server, or seed nodes of a cluster.
    pub urls: Vec<String>,
    pub cluster: bool,
    /// How many replicas must have a change before it is acknowledged (`WAIT`); 0, the
    /// default, acknowledges once the primary applied it.
    pub min_replicas: u32,
}

/// A `--store` value that is not a Redis address.
#[derive(Debug, thiserror::Error)]
#[error(
    "`{0}` is not a Redis store address: use redis://HOST:PORT (one server) or \
     redis+cluster://HOST:PORT[,HOST:PORT...] (a Redis Cluster)"
)]
pub struct BadAddress(String);

impl RedisConfig {
    /// Reads `redis://HOST:PORT[/DB]` (also `rediss://`) or
    /// `redis+cluster://HOST:PORT[,HOST:PORT...]`.
    pub fn parse(address: &str) -> Result<RedisConfig, BadAddress> {
        let bad = || BadAddress(address.to_owned());
        if let Some(nodes) = address.strip_prefix("redis+cluster://") {
            let urls: Vec<String> =
                nodes.split(',').filter(|n| !n.trim().is_empty()).map(|n| format!("redis://{}", n.trim())).collect();
            if urls.is_empty() {
                return Err(bad());
            }
            for url in &urls {
                redis::Client::open(url.as_str()).map_err(|_| bad())?;
            }
            return Ok(RedisConfig { urls, cluster: true, min_replicas: 0 });
        }
        if !(address.starts_with("redis://") || address.starts_with("rediss://")) {
            return Err(bad());
        }
        redis::Client::open(address).map_err(|_| bad())?;
        Ok(RedisConfig { urls: vec![address.to_owned()], cluster: false, min_replicas: 0 })
    }

    /// Acknowledges a change only once `replicas` replicas have it.
    pub fn with_min_replicas(self, replicas: u32) -> RedisConfig {
        RedisConfig { min_replicas: replicas, ..self }
    }
}

/// The key prefix of a namespace. Its hash tag is the namespace name with `%`, `{` and `}`
/// escaped, so that every key of the namespace hashes to one slot whatever the name holds.
fn prefix(namespace: &NamespaceName) -> String {
    format!("allot:{}", hash_tag(namespace.as_str()))
}

/// `{name}` with `%`, `{` and `}` of the name escaped, so the hash tag is never empty or cut
/// short: every key that starts with it hashes to one slot.
fn hash_tag(name: &str) -> String {
    let mut tag = String::with_capacity(name.len() + 2);
    tag.push('{');
    for c in name.chars() {
        match c {
            '%' => tag.push_str("%25"),
            '{' => tag.push_str("%7B"),
            '}' => tag.push_str("%7D"),
            c => tag.push(c),
        }
    }
    tag.push('}');
    tag
}

/// Whether `err` is a server's answer that loading the library again will not change (an unknown
/// command on Redis 6, a script error), rather than a passing state (loading, failing over).
fn refuses_library(err: &RedisError) -> bool {
    let passing = ["LOADING", "BUSY", "TRYAGAIN", "MASTERDOWN", "CLUSTERDOWN", "MOVED", "ASK"];
    matches!(err.kind(), redis::ErrorKind::Server(_)) && !err.code().is_some_and(|code| passing.contains(&code))
}

/// Maps a failed call. Only a `mutating` call that may have reached Redis and was not answered
/// may have taken effect; a call refused before it was sent (no server listening, no connection
/// to the slot's node) or refused by Redis changed nothing.
fn redis_error(err: RedisError, mutating: bool) -> StoreError {
    if let Some(refusal) = replicas_refusal(&err) {
        return refusal;
    }
    if mutating && maybe_sent(&err) {
        StoreError::OutcomeUnknown(format!(
            "Redis did not answer a change it may have received: {} (the node that holds it may be failing over)",
            short_cause(&err)
        ))
    } else if failing_over(&err) {
        StoreError::Unavailable(
            "the Redis node that holds this failed or is handing its slots over, and a replica is taking its \
             place; retry in about a second"
                .to_owned(),
        )
    } else {
        StoreError::Unavailable(format!("Redis: {err}"))
    }
}

/// The refusal of a change by a primary with too few replicas (`ALLOT_NOREPLICAS <attached>
/// <required> <port>`, from the function's check before it writes), in words.
fn replicas_refusal(err: &RedisError) -> Option<StoreError> {
    // Alone, or the first answer of a change followed by `WAIT`.
    let errors = err.clone().into_server_errors()?;
    let (_, refusal) = errors.iter().find(|(_, e)| e.code() == "ALLOT_NOREPLICAS")?;
    let mut words = refusal.details().unwrap_or_default().split_whitespace();
    let (attached, required, port) = (words.next()?, words.next()?, words.next().unwrap_or("?"));
    Some(StoreError::NotEnoughReplicas(format!(
        "the Redis primary that holds this (port {port}) has {attached} of the {required} replicas \
         --redis-min-replicas requires attached (a failover left it none, or they fell behind), so it refused \
         the change before applying it; retry once a replica is attached"
    )))
}

/// Whether an error that changed nothing comes from a node failing over or a slot moving
/// ([`cluster::slot_not_served`]), or a node still loading its data after a restart.
fn failing_over(err: &RedisError) -> bool {
    cluster::slot_not_served(err) || err.code() == Some("LOADING")
}

/// What went wrong with a call that may have been received, in words.
fn short_cause(err: &RedisError) -> &'static str {
    if err.is_timeout() {
        "no answer within the timeout"
    } else {
        "the connection broke"
    }
}

/// Maps a failed call made through [`Conn::write`] or [`Conn::fcall`].
fn call_error(err: WriteError, mutating: bool) -> StoreError {
    match err {
        WriteError::Redis(err) => redis_error(err, mutating),
        WriteError::Unreplicated { acked, wanted } => StoreError::OutcomeUnknown(format!(
            "Redis applied the change on its primary, and only {acked} of the {wanted} replicas required \
             (--redis-min-replicas) had it within {} ms: a failover now could lose it",
            conn::REPLICA_TIMEOUT.as_millis()
        )),
    }
}

/// Whether a failed call may have reached Redis: its connection broke or timed out while it was
/// in flight. A refused connection, no connection to the slot's node, and an error answered by
/// Redis mean it did not (or did nothing).
fn maybe_sent(err: &RedisError) -> bool {
    !err.is_connection_refusal()
        && err.kind() != redis::ErrorKind::ClusterConnectionNotFound
        && (err.is_timeout() || err.is_connection_dropped())
}

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

/// A session as its slot answers: Redis's time, its TTL and deadline, and the namespaces it
/// touched.
struct LiveSession {
    now: u64,
    ttl: u64,
    deadline: u64,
    namespaces: Vec<String>,
}

struct Inner {
    pool_rules: Mutex<allot_core::pools::LeaseRules>,
    /// Redis's clock (ms) at the last pool call, and the local instant it was read.
    redis_clock: Mutex<Option<(u64, Instant)>>,
    conn: Conn,
    scripts: Scripts,
    /// Waiting calls of this daemon, by namespace prefix and waiter id.
    waits: Mutex<HashMap<(String, u64), Arc<Notify>>>,
    /// Told when a call starts waiting: on a cluster, the subscriber subscribes to its
    /// namespace's channel.
    wait_started: Notify,
    shutdown: watch::Sender<bool>,
    calls: AtomicU64,
    call_micros: AtomicU64,
    failures: AtomicU64,
    /// The applications part: who schedules, and the scheduler if it is this daemon.
    apps: sched::Apps,
}

/// The Redis backend. Cheap to share behind an `Arc`; [`Store::shutdown`] stops its tasks.
pub struct RedisStore {
    inner: Arc<Inner>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl RedisStore {
    /// Connects (waiting, with a warning every few seconds, until Redis answers), then starts the
    /// subscriber of wake-ups and the sweeper.
    pub async fn open(config: &RedisConfig) -> Result<RedisStore, StoreError> {
        let conn = Self::connect(config).await?;
        let (shutdown, _) = watch::channel(false);
        let inner = Arc::new(Inner {
            redis_clock: Mutex::new(None),
            pool_rules: Mutex::new(allot_core::pools::LeaseRules::default()),
            conn,
            scripts: Scripts::new(config.cluster, config.min_replicas),
            waits: Mutex::new(HashMap::new()),
            wait_started: Notify::new(),
            shutdown,
            calls: AtomicU64::new(0),
            call_micros: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            apps: sched::Apps::new(),
        });
        let subscriber = match inner.conn.cluster() {
            Some(link) => tokio::spawn(run_sharded_subscriber(inner.clone(), link)),
            None => tokio::spawn(run_subscriber(inner.clone(), config.urls[0].clone())),
        };
        let sweeper = tokio::spawn(run_sweeper(inner.clone()));
        tracing::info!(urls = ?config.urls, cluster = config.cluster, "redis store open");
        let store = RedisStore { inner, tasks: Mutex::new(vec![subscriber, sweeper]) };
        if let Err(err) = store.index_runs().await {
            tracing::warn!(error = %err, "cannot index the runs kept by an earlier version now; the next start will");
        }
        Ok(store)
    }

    /// Fails at once, without retrying, when a server refuses the function library.
    async fn connect(config: &RedisConfig) -> Result<Conn, StoreError> {
        let mut warned = Instant::now() - Duration::from_secs(60);
        loop {
            let attempt = async {
                let conn = Conn::connect(&config.urls, config.cluster, config.min_replicas).await?;
                conn.load_library(&Scripts::new(config.cluster, config.min_replicas).library).await?;
                Ok::<_, RedisError>(conn)
            };
            match attempt.await {
                Ok(conn) => return Ok(conn),
                Err(err) if refuses_library(&err) => {
                    return Err(StoreError::Invalid(format!(
                        "Redis refused allot's function library ({err}); allot needs Redis 7.0 or newer, with FUNCTION and FCALL allowed for its user"
                    )));
                }
                Err(err) => {
                    if warned.elapsed() >= Duration::from_secs(5) {
                        tracing::warn!(urls = ?config.urls, error = %err, "cannot reach Redis yet; retrying");
                        warned = Instant::now();
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    /// Sets the lease rules of allocs made through this daemon (default: Reflow's). Daemons that
    /// share a Redis should use the same rules.
    pub fn set_pool_rules(&self, rules: allot_core::pools::LeaseRules) {
        *self.inner.pool_rules.lock().unwrap_or_else(|p| p.into_inner()) = rules;
    }

    fn live(&self) -> Result<(), StoreError> {
        if *self.inner.shutdown.borrow() {
            return Err(StoreError::ShuttingDown);
        }
        Ok(())
    }
}

impl Inner {
    async fn eval(&self, lua: &Function, key: &str, args: &[&str], mutating: bool) -> Result<Reply, StoreError> {
        let started = Instant::now();
        let res = self.conn.fcall(&self.scripts.library, lua, key, args, mutating).await;
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.call_micros.fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        match res {
            Ok(value) => Reply::new(value),
            Err(err) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(function = %lua.name, error = ?err, "redis call failed");
                Err(call_error(err, mutating))
            }
        }
    }

    async fn sessions(&self, args: &[&str], mutating: bool) -> Result<Reply, StoreError> {
        self.eval(&self.scripts.sessions, SESSIONS, args, mutating).await
    }

    /// Ends the sessions whose deadline has passed (up to 256 a call); answers how many.
    async fn sweep_sessions(&self) -> Result<u64, StoreError> {
        self.sessions(&["sweep", ""], true).await?.uint()
    }

    /// Reads `{now, ttl, deadline, namespaces...}` of a live session; `None` if it is not.
    fn session_reply(mut reply: Reply) -> Result<Option<LiveSession>, StoreError> {
        if reply.is_empty() {
            return Ok(None);
        }
        let (now, ttl, deadline) = (reply.uint()?, reply.uint()?, reply.uint()?);
        Ok(Some(LiveSession { now, ttl, deadline, namespaces: reply.rest_texts()? }))
    }

    /// The grants a session holds in `namespaces`.
    async fn session_info(
        &self,
        id: SessionId,
        now: u64,
        ttl: u64,
        deadline: u64,
        namespaces: &[String],
    ) -> Result<SessionInfo, StoreError> {
        let mut grants = BTreeSet::new();
        let sid = id.to_string();
        for name in namespaces {
            let Ok(namespace) = NamespaceName::new(name) else { continue };
            let mut reply = self.eval(&self.scripts.session_grants, &prefix(&namespace), &[&sid], false).await?;
            for token in reply.rest_texts()? {
                grants.insert((namespace.clone(), Token::new(&token).map_err(corrupt)?));
            }
        }
        Ok(SessionInfo {
            session: Session { id, ttl_ms: ttl, deadline, grants },
            expires_in_ms: deadline.saturating_sub(now),
        })
    }

    /// Runs a session script in each namespace the session touched, a few at a time.
    async fn fan_out(&self, lua: &Function, namespaces: &[String], args: &[&str]) -> Result<(), StoreError> {
        let keys: Vec<String> =
            namespaces.iter().filter_map(|n| NamespaceName::new(n).ok()).map(|n| prefix(&n)).collect();
        let mut calls = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(16) {
            calls.clear();
            for key in chunk {
                calls.push(self.eval(lua, key, args, true));
            }
            for result in futures_util::future::join_all(calls.drain(..)).await {
                result?;
            }
        }
        Ok(())
    }

    /// Claims the answer of waiter `wid`; with `cancel`, takes it out of the queue if it still
    /// waits. `None` while it still waits.
    async fn claim(
        &self,
        namespace: &NamespaceName,
        token: &Token,
        key: &str,
        wid: u64,
        cancel: bool,
    ) -> Result<Option<Allocation>, StoreError> {
        let wid_text = wid.to_string();
        let mut reply = self.eval(&self.scripts.claim, key, &[&wid_text, if cancel { "1" } else { "0" }], true).await?;
        match reply.text()?.as_str() {
            "waiting" => Ok(None),
            "granted" => {
                let grant = reply::grant_info(&mut reply, namespace, token.as_str())?;
                Ok(Some(Allocation::Granted { grant, existing: false }))
            }
            "refused" => {
                let refusal = reply::refusal(&mut reply)?;
                let place = QueuePlace { position: reply.uint()? as usize, units_ahead: reply.uint()? };
                Ok(Some(Allocation::Refused { refusal, place: Some(place) }))
            }
            "error" => Err(reply::error(namespace, Some(token), &mut reply)?),
            "gone" => Err(StoreError::Invalid(
                "a newer allocate call with the same token took over this wait, or the grant it won was \
                 already released"
                    .into(),
            )),
            other => Err(corrupt(format!("claim reply `{other}`"))),
        }
    }
}

/// Takes a waiter out of the queue if its caller goes away before an answer.
struct WaitGuard {
    inner: Arc<Inner>,
    namespace: NamespaceName,
    token: Token,
    key: String,
    wid: u64,
    armed: bool,
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        self.inner.waits.lock().unwrap_or_else(|p| p.into_inner()).remove(&(self.key.clone(), self.wid));
        if !self.armed {
            return;
        }
        let (inner, namespace, token, key, wid) =
            (self.inner.clone(), self.namespace.clone(), self.token.clone(), self.key.clone(), self.wid);
        tokio::spawn(async move {
            if let Err(err) = inner.claim(&namespace, &token, &key, wid, true).await {
                tracing::debug!(error = %err, "could not withdraw an abandoned waiter; the sweep will");
            }
        });
    }
}

impl RedisStore {
    async fn wait_for(
        &self,
        namespace: NamespaceName,
        token: Token,
        key: String,
        wid: u64,
        wait: Duration,
    ) -> Result<Allocation, StoreError> {
        let deadline = tokio::time::Instant::now() + wait;
        let notify = Arc::new(Notify::new());
        self.inner.waits.lock().unwrap_or_else(|p| p.into_inner()).insert((key.clone(), wid), notify.clone());
        self.inner.wait_started.notify_one();
        let mut guard = WaitGuard { inner: self.inner.clone(), namespace, token, key, wid, armed: true };
        let mut shutdown = self.inner.shutdown.subscribe();
        // The answer may have come before this call was listening.
        let mut check = true;
        loop {
            if check {
                match self.inner.claim(&guard.namespace, &guard.token, &guard.key, wid, false).await {
                    Ok(Some(answer)) => {
                        guard.armed = false;
                        return Ok(answer);
                    }
                    Ok(None) => {}
                    // Redis is away for now: keep waiting, the next check may succeed.
                    Err(StoreError::Unavailable(_) | StoreError::OutcomeUnknown(_)) => {}
                    Err(err) => {
                        guard.armed = false;
                        return Err(err);
                    }
                }
            }
            let poll = tokio::time::Instant::now() + POLL_INTERVAL;
            tokio::select! {
                _ = notify.notified() => check = true,
                _ = tokio::time::sleep_until(poll.min(deadline)) => check = true,
                _ = shutdown.wait_for(|stop| *stop) => break,
            }
            if tokio::time::Instant::now() >= deadline {
                break;
            }
        }
        // The wait is over: leave the queue, or take the answer that came meanwhile.
        let answer = self.inner.claim(&guard.namespace, &guard.token, &guard.key, wid, true).await;
        if answer.is_ok() {
            guard.armed = false;
        }
        answer?.ok_or_else(|| corrupt("a cancelled waiter still waits"))
    }
}

#[async_trait]
impl Store for RedisStore {
    fn backend(&self) -> &'static str {
        "redis"
    }

    fn durability(&self) -> &'static str {
        "redis"
    }

    /// Redis's clock as last seen by a pool call (allocs' times are in it), or the wall clock
    /// before any.
    fn now(&self) -> allot_core::Millis {
        pools::now(&self.inner)
    }

    fn commit_stats(&self) -> CommitStats {
        let calls = self.inner.calls.load(Ordering::Relaxed);
        CommitStats {
            commits: calls,
            operations: calls,
            commit_micros: self.inner.call_micros.load(Ordering::Relaxed),
            failures: self.inner.failures.load(Ordering::Relaxed),
            ..CommitStats::default()
        }
    }

    /// Redis answers a `PING` within [`conn::RESPONSE_TIMEOUT`].
    async fn check_ready(&self) -> Result<(), StoreError> {
        self.live()?;
        let ping = redis::cmd("PING");
        match tokio::time::timeout(conn::RESPONSE_TIMEOUT, self.inner.conn.query(&ping)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(err)) => Err(redis_error(err, false)),
            Err(_) => Err(StoreError::Unavailable(format!(
                "Redis did not answer a PING within {} ms",
                conn::RESPONSE_TIMEOUT.as_millis()
            ))),
        }
    }

    async fn shutdown(&self) {
        if self.inner.shutdown.send_replace(true) {
            return;
        }
        // Waiting calls leave the queue and answer with their place.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.inner.waits.lock().unwrap_or_else(|p| p.into_inner()).is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let tasks: Vec<JoinHandle<()>> = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        for task in tasks {
            task.abort();
            let _ = task.await;
        }
        // Hand the scheduling over at once rather than after the lease's TTL.
        if let Some(holder) = self.inner.apps.holder() {
            if let Err(err) = self.release_sched_lease(&holder).await {
                tracing::warn!(error = %err, "could not hand the scheduler's lease over");
            }
        }
        tracing::info!("redis store closed");
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
        let mut reply =
            inner.eval(&inner.scripts.remove_namespace, &prefix(&name), &[if force { "1" } else { "0" }], true).await?;
        match reply.text()?.as_str() {
            "removed" => {
                let grants = reply.uint()? as usize;
                register(inner, "remove", "namespaces", name.as_str()).await?;
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
        let names = registry_page(&self.inner, "namespaces", page.after().map(NamespaceName::as_str), page.limit())
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
                Err(StoreError::Ledger(LedgerError::NamespaceNotFound(_))) => {}
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
        self.live()?;
        check_wait(wait)?;
        check_request(&request)?;
        let inner = &self.inner;
        let key = prefix(&request.namespace);
        // A session's deadline comes from its own slot; the grant keeps a copy of it.
        let session_deadline = match request.lease {
            LeaseRequest::Session(id) => {
                let sid = id.to_string();
                let reply = inner.sessions(&["touch", &sid, request.namespace.as_str()], true).await?;
                match Inner::session_reply(reply)? {
                    Some(session) => session.deadline,
                    None => return Err(LedgerError::SessionNotFound(id).into()),
                }
            }
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
                self.wait_for(request.namespace, request.token, key, wid, wait).await
            }
            "err" => Err(reply::error(&request.namespace, Some(&request.token), &mut reply)?),
            other => Err(corrupt(format!("allocate reply `{other}`"))),
        }
    }

    async fn release(
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

    async fn keepalive_grant(
        &self,
        namespace: NamespaceName,
        token: Token,
        fencing: Option<u64>,
    ) -> Result<GrantInfo, StoreError> {
        self.live()?;
        let inner = &self.inner;
        let fencing = fencing.map(|f| f.to_string()).unwrap_or_default();
        let mut reply =
            inner.eval(&inner.scripts.keepalive, &prefix(&namespace), &[token.as_str(), &fencing], true).await?;
        match reply.text()?.as_str() {
            "grant" => {
                let mut info = reply::grant_info(&mut reply, &namespace, token.as_str())?;
                // A session grant lives as long as its session: renew the session.
                if let allot_core::Lease::Session(id) = info.grant.lease {
                    info.expires_in_ms = Some(self.keepalive_session(id).await?.expires_in_ms);
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
        let tokens = hash_keys(&self.inner, &key).await?;
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

    async fn open_session(&self, ttl_ms: u64) -> Result<SessionInfo, StoreError> {
        self.live()?;
        check_session_ttl(ttl_ms)?;
        let id = SessionId(rand::random());
        let (sid, ttl) = (id.to_string(), ttl_ms.to_string());
        let mut reply = self.inner.sessions(&["open", &sid, &ttl], true).await?;
        if reply.len() != 3 {
            return Err(StoreError::Unavailable("a session id was drawn twice; try again".into()));
        }
        let (now, ttl_ms, deadline) = (reply.uint()?, reply.uint()?, reply.uint()?);
        Ok(SessionInfo {
            session: Session { id, ttl_ms, deadline, grants: BTreeSet::new() },
            expires_in_ms: deadline.saturating_sub(now),
        })
    }

    async fn keepalive_session(&self, id: SessionId) -> Result<SessionInfo, StoreError> {
        self.live()?;
        let sid = id.to_string();
        let reply = self.inner.sessions(&["keepalive", &sid], true).await?;
        let Some(LiveSession { now, ttl, deadline, namespaces }) = Inner::session_reply(reply)? else {
            return Err(LedgerError::SessionNotFound(id).into());
        };
        let deadline_text = deadline.to_string();
        self.inner.fan_out(&self.inner.scripts.session_extend, &namespaces, &[&sid, &deadline_text]).await?;
        self.inner.session_info(id, now, ttl, deadline, &namespaces).await
    }

    async fn close_session(&self, id: SessionId) -> Result<SessionInfo, StoreError> {
        self.live()?;
        let sid = id.to_string();
        let reply = self.inner.sessions(&["close", &sid], true).await?;
        let Some(LiveSession { now, ttl, deadline, namespaces }) = Inner::session_reply(reply)? else {
            return Err(LedgerError::SessionNotFound(id).into());
        };
        // What the session held, before its grants end.
        let info = self.inner.session_info(id, now, ttl, deadline, &namespaces).await?;
        let deadline_text = deadline.to_string();
        self.inner.fan_out(&self.inner.scripts.session_end, &namespaces, &[&sid, &deadline_text]).await?;
        Ok(info)
    }

    async fn sessions(&self, page: PageRequest<SessionId>) -> Result<Page<SessionInfo, SessionId>, StoreError> {
        let mut reply = self.inner.sessions(&["list", ""], false).await?;
        let _now = reply.uint()?;
        let mut live = Vec::new();
        while !reply.is_empty() {
            live.push(SessionId::parse(&reply.text()?).map_err(corrupt)?);
            let (_ttl, _deadline) = (reply.uint()?, reply.uint()?);
        }
        // The live sessions are a zset by deadline: the page is picked here, by id.
        let ids = allot_core::first_after(live.into_iter(), |id| id, page.after(), page.limit() + 1);
        let Page { items: ids, next } = Page::from_read(ids, page.limit(), |id| *id);
        let mut items = Vec::with_capacity(ids.len());
        for id in ids {
            // Read each one whole; one that ended meanwhile is left out.
            match self.session(id).await {
                Ok(info) => items.push(info),
                Err(StoreError::Ledger(LedgerError::SessionNotFound(_))) => {}
                Err(err) => return Err(err),
            }
        }
        Ok(Page { items, next })
    }

    async fn session(&self, id: SessionId) -> Result<SessionInfo, StoreError> {
        let sid = id.to_string();
        let reply = self.inner.sessions(&["get", &sid], false).await?;
        let Some(LiveSession { now, ttl, deadline, namespaces }) = Inner::session_reply(reply)? else {
            return Err(LedgerError::SessionNotFound(id).into());
        };
        self.inner.session_info(id, now, ttl, deadline, &namespaces).await
    }
}

#[async_trait]
impl PoolStore for RedisStore {
    async fn put_pool(&self, name: PoolName, capacity: Resources) -> Result<(bool, PoolView), StoreError> {
        self.live()?;
        let put = pools::put(&self.inner, name, capacity, false).await?;
        nudge_scheduler(&self.inner).await;
        Ok(put)
    }

    async fn seed_pool(&self, name: PoolName, capacity: Resources) -> Result<(bool, PoolView), StoreError> {
        self.live()?;
        let put = pools::put(&self.inner, name, capacity, true).await?;
        nudge_scheduler(&self.inner).await;
        Ok(put)
    }

    async fn remove_pool(&self, name: PoolName, force: bool) -> Result<usize, StoreError> {
        self.live()?;
        pools::remove(&self.inner, name, force).await
    }

    async fn pools(&self, page: PageRequest<PoolName>) -> Result<Page<PoolView, PoolName>, StoreError> {
        pools::list(&self.inner, page).await
    }

    async fn pool(&self, name: PoolName) -> Result<PoolView, StoreError> {
        pools::view(&self.inner, &name).await
    }

    async fn offer(&self, name: PoolName) -> Result<Option<Offer>, StoreError> {
        pools::offer(&self.inner, name).await
    }

    async fn accept(&self, name: PoolName, request: AllocRequest) -> Result<Alloc, StoreError> {
        self.live()?;
        pools::accept(&self.inner, name, request).await
    }

    async fn keepalive_alloc(&self, name: PoolName, id: AllocId, interval_ms: u64) -> Result<(u64, Alloc), StoreError> {
        self.live()?;
        pools::keepalive(&self.inner, name, id, interval_ms).await
    }

    async fn free_alloc(&self, name: PoolName, id: AllocId) -> Result<EndedAlloc, StoreError> {
        self.live()?;
        pools::free(&self.inner, name, id).await
    }

    async fn inspect_alloc(&self, name: PoolName, id: AllocId) -> Result<AllocState, StoreError> {
        pools::inspect(&self.inner, name, id).await
    }

    async fn allocs(&self, name: PoolName, page: PageRequest<AllocId>) -> Result<Page<Alloc, AllocId>, StoreError> {
        pools::allocs(&self.inner, name, page).await
    }

    async fn stop_if_idle_for(&self, name: PoolName, idle_ms: u64) -> Result<(bool, u64), StoreError> {
        self.live()?;
        pools::stop_if_idle(&self.inner, name, idle_ms).await
    }

    async fn label_pool(&self, name: PoolName, labels: Labels) -> Result<PoolView, StoreError> {
        self.live()?;
        pools::label(&self.inner, &name, &labels).await
    }
}

impl RedisStore {
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
        register(inner, "add", "namespaces", name.as_str()).await?;
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
        nudge_scheduler(inner).await;
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

async fn registry(inner: &Inner) -> Result<Vec<NamespaceName>, StoreError> {
    let names = registry_members(inner, REGISTRY).await?;
    Ok(names.iter().filter_map(|name| NamespaceName::new(name).ok()).collect())
}

/// Adds a name to a registry (`kind`: `namespaces` or `pools`), or removes it (`op`).
async fn register(inner: &Inner, op: &str, kind: &str, name: &str) -> Result<(), StoreError> {
    inner.eval(&inner.scripts.registry, REGISTRY_SLOT, &[op, kind, name], true).await?;
    Ok(())
}

/// Up to `limit + 1` names of a registry after `after`, in name order: a page and whether more
/// follow (see [`Page::from_read`]).
async fn registry_page(
    inner: &Inner,
    kind: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<String>, StoreError> {
    let count = (limit + 1).to_string();
    let args = ["page", kind, after.unwrap_or(""), &count];
    inner.eval(&inner.scripts.registry, REGISTRY_SLOT, &args, false).await?.rest_texts()
}

/// The fields of a hash (the tokens of a namespace's grants, the ids of a pool's allocs).
async fn hash_keys(inner: &Inner, key: &str) -> Result<Vec<String>, StoreError> {
    let value = inner.conn.query(redis::cmd("HKEYS").arg(key)).await.map_err(|e| redis_error(e, false))?;
    match value {
        Value::Array(items) => Reply::new(Value::Array(items))?.rest_texts(),
        other => Err(corrupt(format!("HKEYS {key}: reply {other:?}"))),
    }
}

/// The names listed in a registry set (namespaces or pools).
async fn registry_members(inner: &Inner, key: &str) -> Result<Vec<String>, StoreError> {
    let value = inner.conn.query(redis::cmd("SMEMBERS").arg(key)).await.map_err(|e| redis_error(e, false))?;
    match value {
        Value::Set(items) | Value::Array(items) => Reply::new(Value::Array(items))?.rest_texts(),
        other => Err(corrupt(format!("registry {key}: reply {other:?}"))),
    }
}

/// Says on [`SCHED_CHANNEL`] that room was made. Best effort: a message lost is made up for by
/// the scheduler's own reading of the pools and namespaces, at most a second later.
async fn nudge_scheduler(inner: &Inner) {
    let publish = redis::cmd("PUBLISH").arg(SCHED_CHANNEL).arg("room").to_owned();
    if let Err(err) = inner.conn.query(&publish).await {
        tracing::debug!(error = %err, "could not tell the scheduler about new room");
    }
}

/// Listens on [`CHANNEL`] and wakes this daemon's waiting calls, and on [`SCHED_CHANNEL`] and
/// wakes its scheduler. After a reconnection every waiting call checks its answer, as messages
/// may have been missed meanwhile.
async fn run_subscriber(inner: Arc<Inner>, url: String) {
    loop {
        let attempt = async {
            let client = redis::Client::open(url.as_str())?;
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&[CHANNEL, SCHED_CHANNEL]).await?;
            Ok::<_, RedisError>(pubsub)
        };
        match attempt.await {
            Ok(pubsub) => {
                wake_all(&inner);
                inner.apps.room_made();
                let mut messages = pubsub.into_on_message();
                while let Some(message) = messages.next().await {
                    if message.get_channel_name() == SCHED_CHANNEL {
                        inner.apps.room_made();
                        continue;
                    }
                    wake_listed(&inner, &String::from_utf8_lossy(message.get_payload_bytes()));
                }
                tracing::warn!("lost the subscription to wake-ups; reconnecting");
            }
            Err(err) => tracing::debug!(error = %err, "cannot subscribe to wake-ups yet"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// On a Redis Cluster: subscribes (`SSUBSCRIBE`) to the channel of every namespace a call of this
/// daemon waits in, on the node that serves its slot, and wakes those calls. Each message stays
/// on its slot's node, so losing any one node loses only the wake-ups of its slots until its
/// replica takes over; when the slot map changes, the subscriptions are made again on the new
/// primaries and every waiting call checks its answer. Channels stay subscribed once used (one
/// per namespace at most).
async fn run_sharded_subscriber(inner: Arc<Inner>, link: Arc<cluster::ClusterLink>) {
    let mut generations = link.generations();
    let mut shutdown = inner.shutdown.subscribe();
    loop {
        generations.borrow_and_update();
        let (pushes, mut received) = tokio::sync::mpsc::unbounded_channel();
        let conn = match cluster::subscriber(&link.addresses(), pushes) {
            Ok(client) => client.get_async_connection().await,
            Err(err) => Err(err),
        };
        match conn {
            Ok(mut conn) => {
                if let Err(err) = conn.subscribe(SCHED_CHANNEL).await {
                    tracing::debug!(error = %err, "cannot subscribe to the scheduler's channel yet");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                inner.apps.room_made();
                let mut subscribed: std::collections::HashSet<String> = std::collections::HashSet::new();
                // The waiting calls are looked at when one starts, not at every message.
                let mut calls_started = true;
                'connected: loop {
                    let wanted: Vec<String> = if std::mem::take(&mut calls_started) {
                        let waits = inner.waits.lock().unwrap_or_else(|p| p.into_inner());
                        let prefixes: BTreeSet<&String> = waits.keys().map(|(prefix, _)| prefix).collect();
                        prefixes.into_iter().filter(|p| !subscribed.contains(*p)).cloned().collect()
                    } else {
                        Vec::new()
                    };
                    // Each call of a newly subscribed namespace checks its answer, in case the
                    // message came before the subscription (after a reconnection: all of them).
                    for prefix in wanted {
                        if let Err(err) = conn.ssubscribe(format!("{prefix}:wake")).await {
                            tracing::debug!(error = %err, %prefix, "cannot subscribe to a namespace's wake-ups yet");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            break 'connected;
                        }
                        subscribed.insert(prefix.clone());
                        wake_prefix(&inner, &prefix);
                    }
                    tokio::select! {
                        push = received.recv() => match push {
                            Some(push) if push.kind == redis::PushKind::SMessage => {
                                if let Some(Value::BulkString(payload)) = push.data.get(1) {
                                    wake_listed(&inner, &String::from_utf8_lossy(payload));
                                }
                            }
                            Some(push) if push.kind == redis::PushKind::Message => inner.apps.room_made(),
                            Some(_) => {}
                            None => break 'connected,
                        },
                        _ = inner.wait_started.notified() => calls_started = true,
                        _ = generations.changed() => break 'connected,
                        _ = shutdown.changed() => return,
                    }
                }
            }
            Err(err) => {
                tracing::debug!(error = %err, "cannot subscribe to wake-ups yet");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        if *inner.shutdown.borrow() {
            return;
        }
    }
}

/// Wakes the calls named by a message `<namespace prefix>\n<waiter id>,<waiter id>...`.
fn wake_listed(inner: &Inner, payload: &str) {
    let Some((key, ids)) = payload.split_once('\n') else { return };
    let waits = inner.waits.lock().unwrap_or_else(|p| p.into_inner());
    for id in ids.split(',').filter_map(|id| id.parse::<u64>().ok()) {
        if let Some(notify) = waits.get(&(key.to_owned(), id)) {
            notify.notify_one();
        }
    }
}

/// Wakes every call waiting in the namespace of `prefix`: each checks its answer.
fn wake_prefix(inner: &Inner, prefix: &str) {
    for ((key, _), notify) in inner.waits.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        if key == prefix {
            notify.notify_one();
        }
    }
}

fn wake_all(inner: &Inner) {
    for notify in inner.waits.lock().unwrap_or_else(|p| p.into_inner()).values() {
        notify.notify_one();
    }
}

/// Sweeps the sessions and every namespace each [`SWEEP_INTERVAL`].
async fn run_sweeper(inner: Arc<Inner>) {
    let mut names: Vec<NamespaceName> = Vec::new();
    let mut listed = Instant::now() - Duration::from_secs(60);
    let mut ticker = tokio::time::interval(SWEEP_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if listed.elapsed() >= Duration::from_secs(1) {
            match registry(&inner).await {
                Ok(list) => {
                    names = list;
                    listed = Instant::now();
                }
                Err(err) => {
                    tracing::debug!(error = %err, "sweep: cannot list namespaces");
                    continue;
                }
            }
        }
        if let Err(err) = inner.sweep_sessions().await {
            tracing::debug!(error = %err, "sweep of sessions failed");
        }
        pools::sweep_all(&inner).await;
        let inner = &inner;
        stream::iter(names.iter())
            .for_each_concurrent(16, |name| async move {
                if let Err(err) = inner.eval(&inner.scripts.sweep, &prefix(name), &[], true).await {
                    tracing::debug!(namespace = %name, error = %err, "sweep failed");
                }
            })
            .await;
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
        let conn = Conn::connect(&config.urls, config.cluster, config.min_replicas)
            .await
            .map_err(|e| redis_error(e, false))?;
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
    use super::*;

    /// Regression: the session sweep answered a bare integer, which every sweep (each 100 ms)
    /// read as a corrupt reply.
    #[tokio::test]
    async fn the_session_sweep_answers_how_many_sessions_ended() {
        let server = crate::testing::RedisServer::start();
        let store = RedisStore::open(&RedisConfig::parse(&server.url()).unwrap()).await.unwrap();
        store.open_session(1000).await.unwrap();
        assert_eq!(store.inner.sweep_sessions().await.unwrap(), 0);
        tokio::time::sleep(Duration::from_millis(1100)).await;
        // The daemon's own sweeper may have ended it first: 0 or 1, but never an error.
        assert!(store.inner.sweep_sessions().await.unwrap() <= 1);
        assert!(store.sessions(allot_store::PageRequest::first(10)).await.unwrap().items.is_empty());
        store.shutdown().await;
    }

    #[test]
    fn prefixes_keep_one_hash_tag_whatever_the_name() {
        let p = prefix(&NamespaceName::new("}a{b%").unwrap());
        assert_eq!(p, "allot:{%7Da%7Bb%25}");
        assert_eq!(prefix(&NamespaceName::new("hive:cluster-a").unwrap()), "allot:{hive:cluster-a}");
    }

    #[test]
    fn store_addresses_are_parsed() {
        let single = RedisConfig::parse("redis://127.0.0.1:6379").unwrap();
        assert_eq!((single.urls.len(), single.cluster), (1, false));
        let cluster = RedisConfig::parse("redis+cluster://127.0.0.1:7000, 127.0.0.1:7001").unwrap();
        assert_eq!(cluster.urls, vec!["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]);
        assert!(cluster.cluster);
        for bad in ["127.0.0.1:6379", "http://x", "redis+cluster://", "embedded"] {
            assert!(RedisConfig::parse(bad).is_err(), "{bad}");
        }
    }
}

#[cfg(test)]
mod error_tests {
    use super::*;

    /// The error Redis answers `reply` with (e.g. `-MOVED 3999 127.0.0.1:7001`).
    fn answered(reply: &str) -> RedisError {
        let value = redis::parse_redis_value(format!("{reply}\r\n").as_bytes()).unwrap();
        value.extract_error().unwrap_err()
    }

    #[test]
    fn a_primary_short_of_replicas_refuses_in_words() {
        let err = redis_error(answered("-ALLOT_NOREPLICAS 0 1 7004"), true);
        let StoreError::NotEnoughReplicas(message) = &err else { panic!("{err:?}") };
        assert!(message.contains("(port 7004) has 0 of the 1 replicas"), "{message}");
        assert!(err.to_string().ends_with("nothing was changed"), "{err}");
    }

    #[test]
    fn a_failover_is_said_in_words_and_changed_nothing() {
        for reply in
            ["-MOVED 3999 127.0.0.1:7001", "-CLUSTERDOWN The cluster is down", "-TRYAGAIN later", "-READONLY no"]
        {
            let err = redis_error(answered(reply), true);
            let StoreError::Unavailable(message) = &err else { panic!("{reply}: {err:?}") };
            assert!(message.contains("a replica is taking its place; retry in about a second"), "{reply}: {message}");
            assert!(!message.contains("MOVED") && !message.contains("Moved"), "{reply}: {message}");
            assert!(err.to_string().ends_with("nothing was changed"), "{err}");
        }
    }
}
