//! The handle every part works through: [`RedisStore`] and its shared state [`Inner`] (the
//! connection, the function library, this daemon's waiting calls, the scheduler's state, the
//! counters of calls), and [`Inner::eval`], the one path by which a part calls a function: it
//! counts the call and maps a failure to a [`StoreError`] (`errors.rs`).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use allot_core::clock::TimeSource;
use allot_core::Millis;

use allot_store::watch::Feed;
use allot_store::{StoreError, WatchConfig};
use redis::Value;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use crate::apps::leader::Apps;
use crate::config::RedisConfig;
use crate::conn::Conn;
use crate::errors::{call_error, redis_error};
use crate::reply::{corrupt, Reply};
use crate::scripts::{Function, Scripts};

/// The Redis backend. Cheap to share behind an `Arc`; [`allot_store::Store::shutdown`] stops its
/// tasks.
pub struct RedisStore {
    pub(crate) inner: Arc<Inner>,
    /// The daemon's background tasks (subscriber, sweeper, election, scheduling rounds).
    pub(crate) tasks: Mutex<Vec<JoinHandle<()>>>,
}

pub(crate) struct Inner {
    pub(crate) pool_rules: Mutex<allot_core::pools::LeaseRules>,
    /// Redis's clock (ms) at the last pool call, and the daemon's monotonic reading then.
    pub(crate) redis_clock: Mutex<Option<(u64, Millis)>>,
    /// The daemon's clock (`RedisConfig::time`).
    pub(crate) time: Arc<dyn TimeSource>,
    /// Where random ids come from (`RedisConfig::ids`).
    pub(crate) ids: Arc<dyn allot_store::ids::IdSource>,
    pub(crate) conn: Conn,
    /// The change feed's own connection: its copies (which wait for the replicas with
    /// `--redis-min-replicas`) never queue ahead of a caller's change.
    pub(crate) feed_conn: Conn,
    pub(crate) scripts: Scripts,
    /// Waiting calls of this daemon, by namespace prefix and waiter id.
    pub(crate) waits: Mutex<HashMap<(String, u64), Arc<Notify>>>,
    /// How often a waiting call checks its answer without a message.
    pub(crate) wake_poll: std::time::Duration,
    /// Told when a call starts waiting: on a cluster, the subscriber subscribes to its
    /// namespace's channel.
    pub(crate) wait_started: Notify,
    pub(crate) shutdown: watch::Sender<bool>,
    /// Counted by [`Inner::eval`]: calls, their time, and those that failed.
    pub(crate) calls: AtomicU64,
    pub(crate) call_micros: AtomicU64,
    pub(crate) failures: AtomicU64,
    /// The applications part: who schedules, and the scheduler if it is this daemon.
    pub(crate) apps: Apps,
    /// The change feed as this daemon copies and reads it.
    pub(crate) feed: FeedState,
    /// When each pool is next swept (`pools::sweep_all`), on the daemon's monotonic clock: none
    /// yet is now.
    pub(crate) pool_sweeps: Mutex<HashMap<allot_core::pools::PoolName, Millis>>,
    /// The namespaces and pools listed, as the sweeper last read them (the feed's copier looks
    /// at their streams too).
    pub(crate) listed: Mutex<Listed>,
    /// Set for good when this daemon finds a restore holding the scheduler's lease: a restore
    /// writes into its Redis while it runs, so what it holds in memory is not what Redis will
    /// hold. It refuses every call until it is restarted.
    pub(crate) restore_seen: Mutex<Option<String>>,
}

/// The namespaces and pools of the registries.
#[derive(Default)]
pub(crate) struct Listed {
    pub(crate) namespaces: Arc<[allot_core::NamespaceName]>,
    pub(crate) pools: Arc<[allot_core::pools::PoolName]>,
}

impl Inner {
    pub(crate) fn new(conn: Conn, feed_conn: Conn, scripts: Scripts, config: &RedisConfig) -> Inner {
        let (shutdown, _) = watch::channel(false);
        Inner {
            redis_clock: Mutex::new(None),
            time: config.time.clone(),
            ids: config.ids.clone(),
            pool_rules: Mutex::new(allot_core::pools::LeaseRules::default()),
            conn,
            feed_conn,
            scripts,
            waits: Mutex::new(HashMap::new()),
            wake_poll: config.wake_poll,
            wait_started: Notify::new(),
            shutdown,
            calls: AtomicU64::new(0),
            call_micros: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            apps: Apps::new(config.sched_refresh, config.time.clone()),
            feed: FeedState::new(config.watch),
            pool_sweeps: Mutex::default(),
            listed: Mutex::default(),
            restore_seen: Mutex::new(None),
        }
    }

    /// Calls function `lua` on the slot of `key`; a `mutating` call that may have been applied
    /// and was not answered fails with [`StoreError::OutcomeUnknown`].
    pub(crate) async fn eval(
        &self,
        lua: &Function,
        key: &str,
        args: &[&str],
        mutating: bool,
    ) -> Result<Reply, StoreError> {
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

    /// The fields of a hash (the tokens of a namespace's grants, the ids of a pool's allocs).
    pub(crate) async fn hash_keys(&self, key: &str) -> Result<Vec<String>, StoreError> {
        let value = self.conn.query(redis::cmd("HKEYS").arg(key)).await.map_err(|e| redis_error(e, false))?;
        match value {
            Value::Array(items) => Reply::new(Value::Array(items))?.rest_texts(),
            other => Err(corrupt(format!("HKEYS {key}: reply {other:?}"))),
        }
    }
}

impl RedisStore {
    /// Refuses a change once the store is shutting down.
    pub(crate) fn live(&self) -> Result<(), StoreError> {
        if *self.inner.shutdown.borrow() {
            return Err(StoreError::ShuttingDown);
        }
        if let Some(restore) = &*self.inner.restore_seen.lock().unwrap_or_else(|p| p.into_inner()) {
            return Err(StoreError::Unavailable(format!(
                "a restore ({restore}) is writing into this daemon's Redis while it runs: what this daemon read \
                 before is not the restored state; restart it once the restore is done"
            )));
        }
        Ok(())
    }
}

/// This daemon's side of the change feed (`feed.rs`): its [`Feed`], and what it has to copy and
/// read.
pub(crate) struct FeedState {
    pub(crate) feed: Feed,
    pub(crate) config: WatchConfig,
    /// Streams told to have events not yet copied.
    pub(crate) dirty: Mutex<BTreeSet<String>>,
    pub(crate) copy_wanted: Notify,
    /// Every stream is to be copied at once, from the registry as it is now: messages may have
    /// been missed (this daemon just started, or subscribed again).
    pub(crate) copy_all_wanted: std::sync::atomic::AtomicBool,
    pub(crate) read_wanted: Notify,
    /// The cursor of each stream as this daemon last saw it.
    pub(crate) cursors: Mutex<HashMap<String, String>>,
}

impl FeedState {
    pub(crate) fn new(config: WatchConfig) -> FeedState {
        FeedState {
            feed: Feed::new(config, 0),
            config,
            dirty: Mutex::default(),
            copy_wanted: Notify::new(),
            copy_all_wanted: std::sync::atomic::AtomicBool::new(false),
            read_wanted: Notify::new(),
            cursors: Mutex::default(),
        }
    }

    /// A message said `stream` has events to copy.
    pub(crate) fn mark(&self, stream: &str) {
        self.dirty.lock().unwrap_or_else(|p| p.into_inner()).insert(stream.to_owned());
        self.copy_wanted.notify_one();
    }

    /// Messages may have been missed (a subscription made again): copy every stream at once.
    pub(crate) fn copy_all(&self) {
        self.copy_all_wanted.store(true, std::sync::atomic::Ordering::SeqCst);
        self.copy_wanted.notify_one();
    }

    /// A message said the log has new events.
    pub(crate) fn log_grew(&self) {
        self.read_wanted.notify_one();
    }
}
