//! Every seed that found a bug, run again as it was found (its plan's length matters: a plan is
//! drawn step by step from the seed).

use allot_sim::{check_seed, Shape};

fn holds(seed: u64, steps: usize) {
    if let Err(failure) = check_seed(seed, Shape { steps, ..Shape::default() }) {
        panic!("{failure}");
    }
}

/// A failed append rebuilt the store from the log while an allocate appended before it waited
/// for its sync (the disk level): the rebuild published the allocate's events, and its sync
/// published them again, so a watcher was given one revision twice (a debug assertion of the
/// feed caught it first, in seed 304).
#[test]
fn a_failed_append_does_not_publish_the_events_waiting_for_a_sync_twice() {
    holds(300, 200);
    holds(304, 200);
}

/// The checker's own bug, found by the first long run: a release answered "nothing released"
/// was taken as the last word on its token, though an allocate sent before it (its answer lost)
/// was decided after it; now a call of the other kind that ran at any moment beside a call
/// leaves its outcome in doubt.
#[test]
fn calls_that_ran_side_by_side_leave_the_outcome_in_doubt() {
    holds(2144, 150);
}
