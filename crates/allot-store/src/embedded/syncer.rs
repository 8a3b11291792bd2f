//! The syncer thread: operations made durable at the disk level (group commit) and answered,
//! and the log flushed at the process level.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::wal::Segment;
use crate::StoreError;

use super::recover::fail_syncs;
use super::*;

/// Makes operations durable at the disk level (group commit: one sync for every operation queued
/// meanwhile, spaced by [`SYNC_SPACING`] under load), and flushes the log every
/// [`FLUSH_INTERVAL`] at the process level.
pub(super) fn run_syncer(shared: &Shared) {
    let mut last_sync: Option<Instant> = None;
    let mut last_batch = 0;
    loop {
        let batch = {
            let syncs = lock_plain(&shared.syncs);
            let (mut syncs, _) = shared
                .sync_wanted
                .wait_timeout_while(syncs, FLUSH_INTERVAL, |syncs| syncs.is_empty() && !*lock_plain(&shared.stop))
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let spacing = last_sync.map_or(Duration::ZERO, |last| SYNC_SPACING.saturating_sub(last.elapsed()));
            // Under load (several waiting now, or in the last batch) even one waiting operation
            // waits for the spacing: syncing it at once would start a run of small batches.
            if (syncs.len() > 1 || last_batch > 1) && !spacing.is_zero() {
                drop(syncs);
                std::thread::sleep(spacing);
                syncs = lock_plain(&shared.syncs);
            }
            std::mem::take(&mut *syncs)
        };
        if !batch.is_empty() {
            last_sync = Some(Instant::now());
            last_batch = batch.len();
        }
        if !sync_batch(shared, batch) && *lock_plain(&shared.stop) {
            return;
        }
    }
}

/// Makes `batch` durable with one sync of each segment it was appended to and answers it, or
/// fails it (the store then rebuilds from the database); an empty batch flushes the current
/// segment. Answers whether there was a batch.
pub(super) fn sync_batch(shared: &Shared, batch: Vec<Pending>) -> bool {
    if batch.is_empty() {
        let segment = lock(shared).log.segment.clone();
        if let Err(err) = segment.sync() {
            tracing::warn!(error = %err, "cannot flush the log to disk");
        }
        return false;
    }
    let mut segments: Vec<&Arc<dyn Segment>> = Vec::new();
    for pending in &batch {
        if !segments.iter().any(|s| Arc::ptr_eq(s, &pending.segment)) {
            segments.push(&pending.segment);
        }
    }
    let started = Instant::now();
    let synced = segments.iter().try_for_each(|segment| segment.sync());
    match synced {
        Ok(()) => {
            shared.stats.commit(batch.len(), started.elapsed());
            batch.into_iter().for_each(|pending| pending.answer.deliver(shared));
        }
        Err(err) => {
            let reason = format!("the disk failed while making the change durable: {err}");
            tracing::error!(error = %reason, operations = batch.len(), "sync failed; rebuilding from the store");
            fail_syncs(shared, lock(shared), &reason, batch);
        }
    }
    true
}

impl Answer {
    /// The operation is durable: its events go to the feed, then its caller is told and the
    /// waiters it woke get their grants (so a caller with its answer finds the change in the feed).
    pub(super) fn deliver(self, shared: &Shared) {
        if !self.events.is_empty() {
            shared.feed.publish_encoded(self.events, &self.encoded, self.at);
        }
        let _ = self.ack.send(Ok(()));
        for (tx, grant) in self.woken {
            let _ = tx.send(WaiterAnswer::Granted(grant));
        }
        for (tx, err) in self.cancelled {
            let _ = tx.send(WaiterAnswer::Cancelled(err));
        }
    }

    /// The operation is durable and its events were published already (by a rebuild that read
    /// its record back): its caller and the waiters it woke are told.
    pub(super) fn deliver_published(mut self, shared: &Shared) {
        self.events.clear();
        self.deliver(shared);
    }

    pub(super) fn fail(self, err: &StoreError) {
        let _ = self.ack.send(Err(err.clone()));
        for (tx, _) in self.woken {
            let _ = tx.send(WaiterAnswer::Failed(err.clone()));
        }
        for (tx, _) in self.cancelled {
            let _ = tx.send(WaiterAnswer::Failed(err.clone()));
        }
    }
}
