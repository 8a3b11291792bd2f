//! A store on one real `redis-server` whose functions read a clock the test sets
//! ([`TestClock`]), to compare them with the core at given times; and, for the tests' convenience,
//! the process spawner of `allot-host`.

use allot_core::Millis;
pub use allot_host::redis::{RedisCluster, RedisServer};

use crate::config::RedisConfig;
use crate::scripts::Scripts;
use crate::store::RedisStore;
use crate::{registry, sweep};

/// The time of the functions of a store opened by [`TestClock::open`]: they read it from a key
/// of the server instead of Redis's `TIME` (a daemon's functions never do). Only on one server:
/// on a cluster the key would be in another slot than the functions' keys.
pub struct TestClock {
    conn: redis::aio::MultiplexedConnection,
    now: Millis,
}

/// The key the test library reads the time from.
const CLOCK_KEY: &str = "allot:test:now";

impl TestClock {
    /// Sets the time to `start` (ms), then opens a store on `server` whose functions read it.
    pub async fn open(server: &RedisServer, start: Millis) -> (RedisStore, TestClock) {
        TestClock::open_configured(server, start, |config| config).await
    }

    /// As [`TestClock::open`], with the store's configuration changed by `configure`.
    pub async fn open_configured(
        server: &RedisServer,
        start: Millis,
        configure: impl FnOnce(RedisConfig) -> RedisConfig,
    ) -> (RedisStore, TestClock) {
        let client = redis::Client::open(server.url()).expect("a Redis address");
        let conn = client.get_multiplexed_async_connection().await.expect("a connection to the test server");
        let mut clock = TestClock { conn, now: start };
        clock.write().await;
        let config = configure(RedisConfig::parse(&server.url()).expect("a Redis address"));
        let scripts = Scripts::with_test_clock(CLOCK_KEY, config.min_replicas);
        let store = RedisStore::open_with(&config, scripts).await.expect("the store opens");
        (store, clock)
    }

    pub fn now(&self) -> Millis {
        self.now
    }

    /// Moves the time to `now`, then sweeps `store` once, as its sweeper would: every session,
    /// pool and namespace lease due by then has ended when this returns. (The store's own sweeper
    /// also runs; at a time that stands still a second sweep finds nothing more to do.)
    pub async fn set(&mut self, store: &RedisStore, now: Millis) {
        self.now = now;
        self.write().await;
        let names = registry::namespaces(&store.inner).await.expect("the namespaces are listed");
        let pools = registry::pools(&store.inner).await.expect("the pools are listed");
        // Every pool's deadlines moved with the clock: none is put off.
        store.inner.pool_sweeps.lock().unwrap_or_else(|p| p.into_inner()).clear();
        sweep::sweep(&store.inner, &names, &pools).await;
    }

    /// Moves the time to `now` without sweeping: the store's own sweeper finds what is due.
    #[cfg(test)]
    pub(crate) async fn move_to(&mut self, now: Millis) {
        self.now = now;
        self.write().await;
    }

    async fn write(&mut self) {
        let set = redis::cmd("SET").arg(CLOCK_KEY).arg(self.now).to_owned();
        set.query_async::<()>(&mut self.conn).await.expect("the clock is set");
    }
}

/// Enters `store` in the election of the scheduler as `advertise`, without starting the daemon's
/// tasks that renew its lease and run its rounds: [`schedule_once`] does what they would, when
/// the caller says. Answers its name in the election.
pub fn join_election(store: &RedisStore, advertise: &str) -> String {
    store.enter_election(advertise)
}

/// One renewal (or taking) of the scheduler's lease by `holder`, as the daemon's election task
/// does every half second; when that changed this daemon's term, the turn of scheduling it wakes
/// (the new term's records loaded, or the scheduling let go).
pub async fn renew_lease(store: &RedisStore, holder: &str) {
    if store.renew_lease(holder).await {
        store.scheduling_turn(holder).await;
    }
}

/// One renewal of the scheduler's lease and one turn of scheduling by `holder` (from
/// [`join_election`]), as the daemon's own tasks do them; the time is the store's
/// `RedisConfig::time` and its functions' clock. Answers how long the daemon would wait before
/// its next turn.
pub async fn schedule_once(store: &RedisStore, holder: &str) -> std::time::Duration {
    store.renew_lease(holder).await;
    store.scheduling_turn(holder).await
}
