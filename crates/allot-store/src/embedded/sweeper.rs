//! The sweeper task: expired leases of grants, sessions and allocs ended, and the daemon clock
//! logged at least once a second.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::recover::recover;
use super::*;

pub(super) async fn run_sweeper(shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.subscribe();
    let mut more = false;
    loop {
        if more {
            // More were due than one batch ends: the next batch a moment later. 100,000 leases
            // due at once end within about half a second, with the calls answered between the
            // batches on a CPU the sweep does not hold (docs/benchmarks.md, "A million leases").
            tokio::time::sleep(EXPIRE_PAUSE).await;
        } else {
            tokio::select! {
                _ = tokio::time::sleep(SWEEP_INTERVAL) => {}
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
        }
        match sweep(&shared) {
            None => return,
            Some((_, due)) => more = due,
        }
    }
}

/// The most leases one sweep ends under one hold of the lock: a hundred thousand due at once
/// are ended in batches, with the calls that wait for the lock answered between them.
pub(super) const EXPIRE_BATCH: usize = 256;

/// The pause between two batches of expiries.
const EXPIRE_PAUSE: std::time::Duration = std::time::Duration::from_millis(1);

/// One sweep: ends what expired by now, [`EXPIRE_BATCH`] leases at most (or, when broken, retries
/// the rebuild). Answers `None` once the store is closed, else the commit of its changes and
/// whether more leases are due.
pub(super) fn sweep(shared: &Shared) -> Option<(Option<Commit>, bool)> {
    let mut state = lock(shared);
    if state.closed {
        return None;
    }
    if state.failed.is_some() {
        return Some((None, false));
    }
    let now = shared.clock.now();
    if state.broken.is_some() {
        recover(shared, &mut state);
        return Some((None, false));
    }
    let effects = state.ledger.expire_some(now, EXPIRE_BATCH);
    if effects.expired > 0 {
        tracing::debug!(expired = effects.expired, "leases expired");
    }
    let more = state.ledger.next_deadline().is_some_and(|next| next <= now);
    let pool_changes = state.pools.sweep(now);
    if !effects.changes.is_empty() || !effects.cancelled.is_empty() || !pool_changes.is_empty() {
        return Some((Some(state.submit_all(shared, effects, pool_changes, Vec::new(), now)), more));
    }
    if now.saturating_sub(shared.clock_written.load(Ordering::Relaxed)) >= CLOCK_CHECKPOINT_MS {
        state.checkpoint_clock(shared);
    }
    Some((None, more))
}
