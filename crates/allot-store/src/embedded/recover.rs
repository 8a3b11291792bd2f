//! Recovery after a failed append or sync: the operations waiting are failed, the log is folded
//! into the database and the state rebuilt from it (the feed given the events of what proved
//! durable).

use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

use crate::StoreError;

use super::open::{load, Loaded};
use super::*;

/// After a failed sync: the log is written into the database (from what the disk holds: after a
/// failed fdatasync the kernel may drop the pages it could not write) and the state rebuilt from
/// it; then `failed` and every other operation waiting for a sync are answered `OutcomeUnknown`,
/// before anything later is acknowledged.
pub(super) fn fail_syncs(shared: &Shared, mut state: MutexGuard<'_, State>, reason: &str, failed: Vec<Pending>) {
    shared.stats.failures.fetch_add(1, Ordering::Relaxed);
    let later = std::mem::take(&mut *lock_plain(&shared.syncs));
    recover(shared, &mut state);
    drop(state);
    let err = StoreError::OutcomeUnknown(reason.to_owned());
    failed.into_iter().chain(later).for_each(|pending| pending.answer.fail(&err));
}

/// After a failed append or sync, under the state lock: writes the whole log into the database
/// and rebuilds the state from it, then starts a new segment. If that fails, the store is marked
/// broken (refusing work) and the sweeper tries again.
pub(super) fn recover(shared: &Shared, state: &mut State) {
    for (_, Waiting { tx, .. }) in state.waiters.drain() {
        let err = StoreError::Unavailable("the store could not be written; the wait was ended".into());
        let _ = tx.send(WaiterAnswer::Failed(err));
    }
    let current = state.log.number;
    let rebuilt = {
        let mut db = lock_plain(&shared.db);
        let reopened = match db.take() {
            Some(database) => Ok(database),
            None => (shared.opener)(),
        };
        reopened.and_then(|database| {
            let loaded = load(&database, shared.files.as_ref(), current, &mut lock_plain(&shared.archive));
            if loaded.is_ok() {
                *db = Some(database);
            }
            loaded
        })
    };
    let loaded = match rebuilt {
        Ok((loaded, events)) => {
            publish_recovered(shared, &events);
            loaded
        }
        Err(err) => {
            tracing::error!(error = %err, "cannot rebuild the store; retrying");
            state.broken = Some(format!("the store cannot be rebuilt: {err}"));
            return;
        }
    };
    let number = state.log.next_number;
    let segment = match shared.files.create(number, wal::SEGMENT_BYTES) {
        Ok(segment) => segment,
        Err(err) => {
            state.broken = Some(format!("cannot start a log segment: {err}"));
            return;
        }
    };
    let Loaded { mut ledger, mut pools, sched, runs, access, seq, .. } = loaded;
    ledger.carry_over_from(&state.ledger);
    state.ledger = ledger;
    pools.set_rules(state.pools.rules());
    state.pools = pools;
    // The settings (its tenancy with them) are the daemon's, not the records'.
    let config = state.sched.config().clone();
    state.sched = sched;
    state.sched.set_config(config);
    let mut runs = runs;
    runs.carry_executors_from(&mut state.runs);
    state.sched.set_runners(crate::runs::runners_of(&runs.leases(shared.clock.now())));
    state.runs = runs;
    // The version moves on: a daemon's cache of what it held before reads it all again.
    let version = state.access.version + 1;
    state.access = access;
    state.access.set_version(version);
    state.log = LogWriter::new(segment, number, seq);
    state.broken = None;
    tracing::info!(seq, "store rebuilt from the database");
}

/// Publishes the events of records that became durable although their operations were not
/// answered so (a failed sync whose writes reached the disk after all): the state rebuilt holds
/// their changes, so the feed has their events, in order, after what it published.
fn publish_recovered(shared: &Shared, batches: &[wal::Events]) {
    let published = shared.feed.revision();
    let mut events = Vec::new();
    for batch in batches.iter().filter(|batch| batch.last > published) {
        match crate::records::events::decode_events(&batch.bytes) {
            Ok(decoded) => events.extend(decoded.into_iter().filter(|event| event.revision > published)),
            Err(err) => tracing::error!(error = %err, "the events of a record rebuilt cannot be read"),
        }
    }
    if !events.is_empty() {
        tracing::warn!(
            events = events.len(),
            "changes whose outcome was unknown are durable: their events are published"
        );
        shared.feed.publish(events, shared.clock.now());
    }
}
