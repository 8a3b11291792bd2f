//! The syncer thread: operations made durable at the disk level (group commit) and answered,
//! and the log flushed at the process level.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::wal::Segment;
use crate::StoreError;

use super::recover::fail_syncs;
use super::*;

/// Makes operations durable at the disk level (group commit: one sync for every operation queued
/// meanwhile, spaced by [`SYNC_SPACING`] under load unless as many wait as the largest of the
/// last syncs carried), and flushes the log every [`FLUSH_INTERVAL`] at the process level.
pub(super) fn run_syncer(shared: &Shared) {
    let mut last_sync: Option<Instant> = None;
    let mut recent = RecentBatches::default();
    loop {
        let whole = recent.largest();
        let batch = {
            let syncs = lock_plain(&shared.syncs);
            let (mut syncs, _) = shared
                .sync_wanted
                .wait_timeout_while(syncs, FLUSH_INTERVAL, |syncs| syncs.is_empty() && !*lock_plain(&shared.stop))
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if let Some(wait) = gather_for(syncs.len(), whole, last_sync.map(|at| at.elapsed())) {
                shared.sync_full.store(whole, Ordering::Relaxed);
                syncs = shared
                    .sync_wanted
                    .wait_timeout_while(syncs, wait, |syncs| syncs.len() < whole)
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .0;
                shared.sync_full.store(0, Ordering::Relaxed);
            }
            std::mem::take(&mut *syncs)
        };
        if !batch.is_empty() {
            last_sync = Some(Instant::now());
            recent.record(batch.len());
        }
        if !sync_batch(shared, batch) && *lock_plain(&shared.stop) {
            return;
        }
    }
}

/// How long the syncer lets operations gather before it syncs them, given how many wait now, a
/// whole batch (the largest of the last syncs, [`RecentBatches`]) and how long ago the last sync
/// started; `None`: at once. While fewer wait than a whole batch, syncs start [`SYNC_SPACING`]
/// apart: syncing each at once would start a run of small batches, a sync's CPU each. Once a
/// whole batch waits, the callers of a closed loop of that many are all back and waiting longer
/// would gather nobody more; a lone caller is synced at once, and an empty queue (a flush) too.
pub(super) fn gather_for(waiting: usize, whole: usize, since_last_sync: Option<Duration>) -> Option<Duration> {
    let spacing = since_last_sync.map_or(Duration::ZERO, |since| SYNC_SPACING.saturating_sub(since));
    (waiting > 0 && waiting < whole && !spacing.is_zero()).then_some(spacing)
}

/// The sizes of the last syncs' batches. The largest is a whole batch: with callers in a closed
/// loop, all of them (a sync that did not wait for a straggler carried one fewer). Not the last
/// one alone: when the daemon's CPU, not the syncs, bounds how fast callers come back, a batch is
/// what one spacing gathered, and starting a sync as soon as that many wait would only sync more
/// often for the same load.
#[derive(Debug, Default)]
pub(super) struct RecentBatches {
    sizes: [usize; 8],
    next: usize,
}

impl RecentBatches {
    pub(super) fn record(&mut self, size: usize) {
        self.sizes[self.next] = size;
        self.next = (self.next + 1) % self.sizes.len();
    }

    pub(super) fn largest(&self) -> usize {
        self.sizes.iter().copied().max().unwrap_or(0)
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

#[cfg(test)]
mod tests {
    use super::*;

    const US: fn(u64) -> Duration = Duration::from_micros;

    #[test]
    fn a_lone_caller_is_synced_at_once() {
        assert_eq!(gather_for(1, 0, None), None);
        assert_eq!(gather_for(1, 1, Some(US(10))), None);
    }

    #[test]
    fn under_load_a_sync_waits_out_the_spacing_from_the_last() {
        assert_eq!(gather_for(3, 16, Some(US(100))), Some(SYNC_SPACING - US(100)));
        assert_eq!(gather_for(1, 2, Some(Duration::ZERO)), Some(SYNC_SPACING));
        assert_eq!(gather_for(3, 16, Some(SYNC_SPACING)), None, "the spacing is over");
        assert_eq!(gather_for(3, 16, None), None, "no sync before");
        assert_eq!(gather_for(0, 16, Some(US(100))), None, "nothing to gather: a flush");
    }

    #[test]
    fn a_whole_batch_is_the_largest_of_the_last_eight() {
        let mut recent = RecentBatches::default();
        assert_eq!(recent.largest(), 0);
        recent.record(16);
        recent.record(15);
        assert_eq!(recent.largest(), 16, "a straggler left behind does not shrink it");
        for _ in 0..8 {
            recent.record(3);
        }
        assert_eq!(recent.largest(), 3, "forgotten after eight syncs");
    }

    #[test]
    fn as_many_waiting_as_a_whole_batch_are_synced_at_once() {
        assert_eq!(gather_for(16, 16, Some(US(100))), None);
        assert_eq!(gather_for(20, 16, Some(US(100))), None);
        assert_eq!(gather_for(15, 16, Some(US(100))), Some(SYNC_SPACING - US(100)));
    }
}
