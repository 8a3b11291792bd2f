//! The Redis backend of [`Store`]: several daemons share one Redis or Redis Cluster.
//!
//! Every allocate, release, keepalive and sweep is one atomic Lua script on the hash slot of its
//! namespace (`allot:{<namespace>}:...`), and every script reads the time from Redis (`TIME`),
//! never from a daemon, so daemons with different clocks agree on every lease. The scripts are
//! Redis functions, loaded once per server; they and the key layout are in `src/lua/`, and
//! `lua/namespace.lua` documents both. (Only a test's library, [`testing::TestClock`], reads a
//! time the test sets instead.)
//!
//! - Quotas live in Redis: a quota changed through one daemon holds at once for all. The
//!   configuration file only seeds namespaces that do not exist yet
//!   ([`seed_namespace`](allot_store::QuotaStore::seed_namespace)).
//! - Waiters queue in Redis, first come first served across daemons. A script that grants a
//!   waiter records the answer and publishes the waiter's id on `allot:woken`; the daemon where
//!   the call waits is subscribed and claims the answer at once. A waiting call also checks every
//!   [`RedisConfig::wake_poll`] (250 ms by default), so a lost message delays an answer but never
//!   loses it.
//! - Sessions share one hash slot (`allot:{allot-sessions}`). A grant held under a session is
//!   kept in its namespace with a copy of the session's deadline; a session keepalive renews
//!   those copies namespace by namespace, and each namespace's sweep ends its session grants at
//!   that deadline on its own.
//! - Every daemon runs the sweep (idempotent): each namespace every [`SWEEP_INTERVAL`], each
//!   pool when its next deadline comes (at most a second later).
//! - When Redis cannot be reached, calls fail with [`StoreError::Unavailable`] (nothing was
//!   done) or [`StoreError::OutcomeUnknown`] (the call was sent, its answer was lost), and the
//!   connection comes back by itself.
//!
//! # Modules
//!
//! The four parts, each in its own module over one shared handle:
//! - `quotas`: token quotas (namespaces, grants, waiting allocate calls); `sessions`: the sessions
//!   grants may be held under; `wake`: the wake-ups of waiting calls and of the scheduler;
//! - `pools`: leased resource pools (pools, offers, allocs, keepalive, sweep);
//! - [`apps`]: applications, queues and tasks, and the one daemon that schedules them;
//! - `runs`: the runs of tasks, the catalog of outputs and the executors' leases.
//!
//! Under them: `store` (the handle [`RedisStore`] and the one call path), `sweep` (the sweeper),
//! `registry` (the lists of namespaces and pools), `keys` (hash tags), `reply` (replies read back
//! into domain types), `errors` (failed calls as [`StoreError`]s), `scripts` (the function
//! library), `conn` and `cluster` (the connection, to one Redis or a cluster), `timeouts`,
//! `config` ([`RedisConfig`]). With the `testing` feature, `testing` starts real Redis servers
//! and clusters for tests, and a store whose functions read a clock the test sets.
//! Imports run one way: the parts use the modules under them, and this file starts them.

mod access;
pub mod apps;
mod cluster;
mod config;
mod conn;
mod errors;
mod feed;
mod keys;
mod pools;
mod quotas;
mod registry;
mod reply;
mod runs;
mod scripts;
mod sessions;
pub mod snapshot;
mod store;
mod sweep;
#[cfg(feature = "testing")]
pub mod testing;
mod timeouts;
mod wake;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use allot_core::watch::Filter;
use allot_store::{CommitStats, Store, StoreError};
use allot_store::{WatchError, WatchStore, Watcher};
use async_trait::async_trait;
use redis::RedisError;
use tokio::task::JoinHandle;

pub use crate::config::{BadAddress, RedisConfig};
pub use crate::quotas::DirectScripts;
pub use crate::store::RedisStore;
pub use crate::sweep::SWEEP_INTERVAL;

use crate::conn::Conn;
use crate::errors::{redis_error, refuses_library};
use crate::scripts::Scripts;
use crate::store::Inner;

impl RedisStore {
    /// Connects (waiting, with a warning every few seconds, until Redis answers), then starts the
    /// subscriber of wake-ups and the sweeper.
    pub async fn open(config: &RedisConfig) -> Result<RedisStore, StoreError> {
        Self::open_with(config, Scripts::new(config.cluster, config.min_replicas)).await
    }

    /// Opens with the function library `scripts` (a test's may read a clock of its own).
    pub(crate) async fn open_with(config: &RedisConfig, scripts: Scripts) -> Result<RedisStore, StoreError> {
        let conn = Self::connect(config, &scripts).await?;
        let feed_conn = Self::connect(config, &scripts).await?;
        let inner = Arc::new(Inner::new(conn, feed_conn, scripts, config));
        // What the streams hold is copied into the log, and every event the log keeps is read,
        // before the first watcher comes and before this daemon changes anything.
        while let Err(err) = feed::copy_every_stream(&inner).await {
            tracing::warn!(error = %err, "cannot copy the change feed's streams yet; retrying");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        while let Err(err) = feed::load(&inner).await {
            tracing::warn!(error = %err, "cannot read the change feed's log yet; retrying");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let copier = tokio::spawn(feed::run_copier(inner.clone()));
        let reader = tokio::spawn(feed::run_reader(inner.clone()));
        let subscriber = match inner.conn.cluster() {
            Some(link) => tokio::spawn(wake::run_sharded_subscriber(inner.clone(), link)),
            None => tokio::spawn(wake::run_subscriber(inner.clone(), config.clone())),
        };
        let sweeper = tokio::spawn(sweep::run_sweeper(inner.clone()));
        tracing::info!(urls = ?config.redacted_urls(), cluster = config.cluster, "redis store open");
        let store = RedisStore { inner, tasks: Mutex::new(vec![subscriber, sweeper, copier, reader]) };
        // Every time this daemon decides by (the scheduler's timers, what is left of a lease) is
        // Redis's: its own wall clock may be off by any amount.
        while let Err(err) = store.read_redis_clock().await {
            tracing::warn!(error = %err, "cannot read Redis's clock yet; retrying");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        if let Err(err) = store.index_runs().await {
            tracing::warn!(error = %err, "cannot index the runs kept by an earlier version now; the next start will");
        }
        Ok(store)
    }

    /// Fails at once, without retrying, when a server refuses the function library.
    async fn connect(config: &RedisConfig, scripts: &Scripts) -> Result<Conn, StoreError> {
        let mut warned = Instant::now() - Duration::from_secs(60);
        loop {
            let attempt = async {
                let conn = Conn::connect(config).await?;
                conn.load_library(&scripts.library).await?;
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
                        tracing::warn!(urls = ?config.redacted_urls(), error = %err, "cannot reach Redis yet; retrying");
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
}

/// The change feed: the shared log as this daemon has read it (see `feed.rs`).
impl WatchStore for RedisStore {
    fn watch(&self, filter: Filter, since: Option<u64>) -> Result<Watcher, WatchError> {
        self.inner.feed.feed.subscribe(filter, since)
    }

    fn watch_inside(&self, filter: Filter, since: Option<u64>) -> Result<Watcher, WatchError> {
        self.inner.feed.feed.subscribe_inside(filter, since)
    }

    /// The last revision this daemon read: a change not in the log yet is copied after it.
    fn revision(&self) -> u64 {
        self.inner.feed.feed.revision()
    }

    fn feed_kept(&self) -> (usize, u64) {
        self.inner.feed.feed.kept()
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

    /// Redis's clock is a wall clock (`TIME`).
    fn wall_ms(&self) -> allot_core::Millis {
        self.now()
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

    /// Redis answers a `PING` within `conn::RESPONSE_TIMEOUT` (2 s).
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

    /// Slot by slot (`snapshot.rs`), on the runtime this is called from (off its threads), into
    /// a temporary file first: `out` may block (an answer's body), which it must not do on the
    /// runtime, and the scheduling pauses only while Redis is read.
    fn snapshot(
        &self,
        out: &mut dyn std::io::Write,
    ) -> Result<(allot_store::snapshot::SnapshotHeader, allot_store::snapshot::SnapshotSummary), StoreError> {
        use std::io::Seek;
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| StoreError::Unavailable("a Redis snapshot is taken on the daemon's runtime".into()))?;
        let failed = |err: std::io::Error| StoreError::Unavailable(format!("cannot write the snapshot: {err}"));
        let mut file = tempfile::tempfile().map_err(failed)?;
        let taken = runtime.block_on(self.snapshot_to(&mut file))?;
        file.rewind().map_err(failed)?;
        std::io::copy(&mut file, out).map_err(failed)?;
        Ok(taken)
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
