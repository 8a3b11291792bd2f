//! The sweeper task: expired leases of grants, sessions and allocs ended, and the daemon clock
//! logged at least once a second.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::recover::recover;
use super::*;

pub(super) async fn run_sweeper(shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(SWEEP_INTERVAL) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        if sweep(&shared).is_none() {
            return;
        }
    }
}

/// One sweep: ends what expired by now (or, when broken, retries the rebuild). Answers `None`
/// once the store is closed, else when its changes are durable.
pub(super) fn sweep(shared: &Shared) -> Option<Option<Commit>> {
    let mut state = lock(shared);
    if state.closed {
        return None;
    }
    if state.failed.is_some() {
        return Some(None);
    }
    let now = shared.clock.now();
    if state.broken.is_some() {
        recover(shared, &mut state);
        return Some(None);
    }
    let effects = state.ledger.expire(now);
    if effects.expired > 0 {
        tracing::debug!(expired = effects.expired, "leases expired");
    }
    let pool_changes = state.pools.sweep(now);
    if !effects.changes.is_empty() || !effects.cancelled.is_empty() || !pool_changes.is_empty() {
        return Some(Some(state.submit_all(shared, effects, pool_changes, Vec::new(), now)));
    }
    if now.saturating_sub(shared.clock_written.load(Ordering::Relaxed)) >= CLOCK_CHECKPOINT_MS {
        state.checkpoint_clock(shared);
    }
    Some(None)
}
