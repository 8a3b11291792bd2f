//! The checkpointer thread: the log's sealed segments written into the database (their events
//! into the kept events' files); and, for tests, a stop without the last checkpoint (a crash).
//! Beside it, the thread that makes spare log segments ahead.

use super::open::fold_into;
use super::recover::fail_syncs;
use super::*;

/// Writes the log into the database every [`CHECKPOINT_INTERVAL`], and once more when stopped.
pub(super) fn run_checkpointer(shared: &Shared) {
    loop {
        let stop = {
            let stop = lock_plain(&shared.stop);
            let (stop, _) = shared
                .stop_changed
                .wait_timeout_while(stop, CHECKPOINT_INTERVAL, |stop| !*stop)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            *stop
        };
        if stop && shared.crashed.load(Ordering::SeqCst) {
            return;
        }
        if let Err(err) = checkpoint(shared) {
            tracing::warn!(error = %err, "checkpoint failed; the log keeps everything until the next one");
        }
        if stop {
            return;
        }
    }
}

/// Makes the spare log segments the log asks for ([`State::ask_for_spare`]), off the state
/// lock, until stopped: a thread of its own, as the checkpointer may be folding a burst's log
/// for most of a second while the log fills a segment in a fifth of one.
pub(super) fn run_spare_maker(shared: &Shared) {
    loop {
        {
            let stop = lock_plain(&shared.stop);
            let stop = shared
                .stop_changed
                .wait_while(stop, |stop| !*stop && !shared.spare_wanted.load(Ordering::SeqCst))
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if *stop {
                return;
            }
        }
        shared.spare_wanted.store(false, Ordering::SeqCst);
        if let Err(err) = shared.files.prepare_spare(wal::SEGMENT_BYTES) {
            tracing::warn!(error = %err, "cannot make a spare log segment; the log makes its next one itself");
        }
    }
}

/// Seals the current segment (if it holds anything) and writes every sealed one into the
/// database (their events kept first), then deletes them; deletes the kept events' segments the
/// feed no longer keeps.
pub(super) fn checkpoint(shared: &Shared) -> Result<(), String> {
    // One at a time: the checkpointer's, and one a snapshot asks for.
    let _checkpointing = lock_plain(&shared.checkpointing);
    let reserved = {
        let mut state = lock(shared);
        (state.broken.is_none() && state.log.len > 0).then(|| {
            state.log.next_number += 1;
            state.log.next_number - 1
        })
    };
    if let Some(number) = reserved {
        // Created outside the lock: creating syncs the directory.
        let segment = shared
            .files
            .create(number, wal::SEGMENT_BYTES)
            .map_err(|err| format!("cannot start a log segment: {err}"))?;
        let mut state = lock(shared);
        if state.broken.is_some() || state.log.number >= number {
            // A rebuild meanwhile started a newer segment: keep it.
            drop(state);
            shared.files.remove(number).map_err(|err| err.to_string())?;
        } else {
            let sealed = state.log.switch(number, segment);
            if shared.durability == Durability::Disk {
                // The sealed segment is durable before anything is appended to the next one:
                // otherwise a record of it (the clock, which nobody waits for) could be lost
                // while later ones are synced, and replay ends at such a gap.
                if let Err(err) = sealed.sync() {
                    let reason = format!("the disk failed while sealing a log segment: {err}");
                    fail_syncs(shared, state, &reason, Vec::new());
                    return Err(reason);
                }
            } else {
                drop(state);
                sealed.sync().map_err(|err| format!("cannot flush the log to disk: {err}"))?;
            }
        }
    }
    let current = lock(shared).log.number;
    let listed = shared.files.list().map_err(|err| format!("cannot list the log's segments: {err}"))?;
    let sealed: Vec<u64> = listed.into_iter().filter(|n| *n < current).collect();
    // Events that aged past `retain_for` while nothing was published go too.
    shared.feed.expire(shared.clock.now());
    if sealed.is_empty() {
        forget_unkept_events(shared);
        return Ok(());
    }
    {
        let mut db = lock_plain(&shared.db);
        if db.is_none() {
            *db = Some((shared.opener)().map_err(|err| err.to_string())?);
        }
        let database = db.as_ref().expect("opened above");
        if let Err(err) = fold_into(database, shared.files.as_ref(), &sealed, &mut lock_plain(&shared.archive), None) {
            // Reopened before the next use: a failed commit can leave redb unusable.
            *db = None;
            return Err(err);
        }
    }
    for number in sealed {
        shared.files.remove(number).map_err(|err| format!("cannot remove a folded segment: {err}"))?;
    }
    forget_unkept_events(shared);
    Ok(())
}

/// The kept events the feed no longer keeps are not kept on disk either.
fn forget_unkept_events(shared: &Shared) {
    let compacted = shared.feed.kept().1;
    lock_plain(&shared.archive).trim(compacted);
}

impl EmbeddedStore {
    /// Stops as a `kill -9` would leave the files: no last record, no last checkpoint (the log
    /// keeps what it has not written into the database; the kept events' files, what the last
    /// checkpoint copied). Operations not answered yet may or may not be durable, as after a
    /// crash. For tests of what a reopened store brings back; returns once its files are
    /// released, so it can be opened again.
    #[cfg(feature = "testing")]
    pub async fn crash(self) {
        self.shared.crashed.store(true, Ordering::SeqCst);
        self.shared.shutting_down.store(true, Ordering::SeqCst);
        self.shared.shutdown.send_replace(true);
        lock(&self.shared).closed = true;
        let threads = stop_threads(&self.shared, &self.threads);
        let _ = tokio::task::spawn_blocking(move || threads.into_iter().for_each(|t| drop(t.join()))).await;
        for task in [&self.sweeper, &self.scheduler] {
            let task = task.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(task) = task {
                let _ = task.await;
            }
        }
    }
}
