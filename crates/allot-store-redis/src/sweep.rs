//! The sweeper: every daemon, every [`SWEEP_INTERVAL`], ends the sessions whose deadline passed,
//! then sweeps every pool and every namespace (`lua/pool.lua` `sweep`, `lua/sweep.lua`): the
//! leases that are due end and the waiters they made room for are admitted. A sweep is
//! idempotent, so daemons that share a Redis sweep side by side.

use std::sync::Arc;
use std::time::Duration;

use allot_core::pools::PoolName;
use allot_core::NamespaceName;
use futures_util::{stream, StreamExt};

use crate::keys::prefix;
use crate::store::{Inner, Listed};
use crate::{pools, registry, sessions};

/// How often a daemon sweeps every namespace for leases that are due.
pub const SWEEP_INTERVAL: Duration = Duration::from_millis(100);

/// Sweeps each [`SWEEP_INTERVAL`]; the lists of namespaces and pools are read again every second
/// (and kept in `Inner::listed` for the feed's copier).
pub(crate) async fn run_sweeper(inner: Arc<Inner>) {
    // When the lists were last read (the daemon's monotonic clock): never yet.
    let mut listed: Option<allot_core::Millis> = None;
    let mut ticker = tokio::time::interval(SWEEP_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if listed.is_none_or(|at| inner.time.monotonic_ms().saturating_sub(at) >= 1000) {
            match (registry::namespaces(&inner).await, registry::pools(&inner).await) {
                (Ok(namespaces), Ok(pools)) => {
                    *inner.listed.lock().unwrap_or_else(|p| p.into_inner()) =
                        Listed { namespaces: namespaces.into(), pools: pools.into() };
                    listed = Some(inner.time.monotonic_ms());
                }
                (Err(err), _) | (_, Err(err)) => {
                    tracing::debug!(error = %err, "sweep: cannot list namespaces and pools");
                    continue;
                }
            }
        }
        let (names, pools) = {
            let listed = inner.listed.lock().unwrap_or_else(|p| p.into_inner());
            (listed.namespaces.clone(), listed.pools.clone())
        };
        sweep(&inner, &names, &pools).await;
    }
}

/// One sweep: the sessions, the pools `pools` whose time has come, and the namespaces `names`.
/// Failures are logged; the next sweep tries again.
pub(crate) async fn sweep(inner: &Inner, names: &[NamespaceName], pools: &[PoolName]) {
    if let Err(err) = sessions::sweep(inner).await {
        tracing::debug!(error = %err, "sweep of sessions failed");
    }
    pools::sweep_all(inner, pools).await;
    stream::iter(names.iter())
        .for_each_concurrent(16, |name| async move {
            if let Err(err) = inner.eval(&inner.scripts.sweep, &prefix(name), &[], true).await {
                tracing::debug!(namespace = %name, error = %err, "sweep failed");
            }
        })
        .await;
}
