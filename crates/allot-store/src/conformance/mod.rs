//! The conformance suite: what every backend of [`Store`](crate::Store) must do, checked over `dyn Store`.
//!
//! Each check works in namespaces of its own (prefixed `conformance:`), so the whole suite runs
//! against one store, empty or not. A backend's tests call [`run`], [`run_pools`], [`run_apps`],
//! [`run_runs`], [`run_watch`] and [`run_access`]; a failed check panics with the name of the check and what differed.
//!
//! Time is moved on through [`Time`], not slept through: the embedded store's clock is moved by
//! hand ([`MovedTime`]), one Redis server's through its test clock (`allot_store_redis::testing::TestClock`,
//! moved by that crate's tests); only what cannot be moved (a Redis Cluster's clock, Redis's own
//! key expiries) is waited out ([`WaitedTime`]). The checks that move time run one after another,
//! after the others (which run concurrently), so no check sees another's time pass. What other
//! tasks make true is awaited with [`eventually`], never a fixed wait.

mod access;
mod apps;
mod pools;
mod quotas;
mod runs;
mod watch;

pub use access::run_access;
pub use apps::run_apps;
pub use pools::run_pools;
pub use quotas::run;
pub use runs::{run_runs, sample_run, without_details};
pub use watch::run_watch;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

/// How the checks move a backend's time on.
#[async_trait]
pub trait Time: Send + Sync {
    /// Moves the backend's clock on by `by`, then lets its background work (the sweeper, the
    /// scheduler) act at the new time before it returns.
    async fn advance(&self, by: Duration);
}

/// For a backend whose clock cannot be moved: the time is waited out.
pub struct WaitedTime;

#[async_trait]
impl Time for WaitedTime {
    async fn advance(&self, by: Duration) {
        // The one clock no test moves (a Redis Cluster's, Redis's key expiries): waited out.
        tokio::time::sleep(by).await;
    }
}

/// The embedded store on a [`ManualClock`](crate::clock::ManualClock): the clock is moved, then
/// the store sweeps and schedules at once.
pub struct MovedTime {
    pub clock: crate::clock::ManualClock,
    pub store: Arc<crate::EmbeddedStore>,
}

#[async_trait]
impl Time for MovedTime {
    async fn advance(&self, by: Duration) {
        self.clock.advance(by);
        self.store.tick().await.expect("the store sweeps and schedules");
    }
}

/// Waits until a condition holds; fails, naming what was awaited, after a minute.
pub(crate) use allot_host::wait::until as eventually;
