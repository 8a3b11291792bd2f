//! Each namespace's waiting queue served in arrival order, checked between two readings of it
//! (its waiters and its grants, read after one step and after the next).
//!
//! One step polls one call at most, so between two readings: the waiters still waiting keep their
//! order, and every waiter new to the queue arrived after them (it is listed behind them); a token
//! that holds a grant it did not hold before was granted in its turn: every waiter ahead of it
//! (every waiter, for a token that was not waiting) that still waits is held back by its scope's
//! cap, before the step or after it. The second rule is what a listing alone cannot show: a small
//! waiter granted past a large head that still does not fit leaves a queue that looks right.

use std::collections::BTreeMap;

use allot_api::{GrantList, WaiterList};

use crate::check::{Model, Violation};

/// What the last reading of each namespace showed; `None` when there is none to compare with
/// (the first step, after a crash, or when the store could not be read).
#[derive(Debug)]
pub struct QueueOrder {
    seen: Vec<Option<Reading>>,
}

#[derive(Debug)]
struct Reading {
    /// The waiters, head first, and whether each was held back by its scope's cap.
    waiting: Vec<(String, bool)>,
    /// Each token holding a grant, and the grant's fencing number.
    granted: BTreeMap<String, u64>,
}

impl QueueOrder {
    pub fn new(namespaces: u8) -> QueueOrder {
        QueueOrder { seen: (0..namespaces).map(|_| None).collect() }
    }

    /// The daemon started again: its queues are new.
    pub fn forget(&mut self) {
        self.seen.iter_mut().for_each(|seen| *seen = None);
    }

    /// Namespace `ns` could not be read: the next reading is compared with nothing.
    pub fn forget_namespace(&mut self, ns: u8) {
        self.seen[usize::from(ns)] = None;
    }

    /// Checks namespace `ns`'s reading against the one before, and keeps it for the next.
    pub fn served_in_order(&mut self, ns: u8, grants: &GrantList, waiters: &WaiterList) -> Result<(), Violation> {
        let now = Reading {
            waiting: waiters.waiters.iter().map(|w| (w.token.clone(), w.blocked_by_cap.is_some())).collect(),
            granted: grants.grants.iter().map(|g| (g.token.clone(), g.fencing)).collect(),
        };
        let before = self.seen[usize::from(ns)].replace(now);
        let Some(before) = before else { return Ok(()) };
        let now = self.seen[usize::from(ns)].as_ref().expect("just kept");
        let name = Model::namespace(ns);
        in_arrival_order(&name, &before, now)?;
        granted_in_turn(&name, &before, now)
    }
}

/// The waiters of both readings are in the same order, and the new ones are behind them.
fn in_arrival_order(name: &str, before: &Reading, now: &Reading) -> Result<(), Violation> {
    let was_waiting = |token: &str| before.waiting.iter().any(|(t, _)| t == token);
    let mut stayed = before.waiting.iter().map(|(t, _)| t).filter(|t| now.waiting.iter().any(|(n, _)| n == *t));
    let mut newcomer: Option<&str> = None;
    for (token, _) in &now.waiting {
        if !was_waiting(token) {
            newcomer.get_or_insert(token);
            continue;
        }
        if let Some(newcomer) = newcomer {
            return Err(Violation::new(format!(
                "{name}: waiter {newcomer} joined the queue after {token}, yet it is listed ahead of it"
            )));
        }
        let expected = stayed.next().expect("as many stayed as are listed again");
        if expected != token {
            return Err(Violation::new(format!(
                "{name}: waiter {expected} arrived before {token}, yet {token} is listed ahead of it"
            )));
        }
    }
    Ok(())
}

/// Every token newly granted was granted in its turn.
fn granted_in_turn(name: &str, before: &Reading, now: &Reading) -> Result<(), Violation> {
    let capped = |reading: &Reading, token: &str| reading.waiting.iter().any(|(t, capped)| t == token && *capped);
    for (token, fencing) in &now.granted {
        if before.granted.get(token) == Some(fencing) {
            continue;
        }
        let ahead = before.waiting.iter().position(|(t, _)| t == token).unwrap_or(before.waiting.len());
        let passed = before.waiting[..ahead].iter().map(|(t, _)| t).find(|waiter| {
            let still_waits = now.waiting.iter().any(|(t, _)| t == *waiter);
            still_waits && !capped(before, waiter) && !capped(now, waiter)
        });
        if let Some(waiter) = passed {
            return Err(Violation::new(format!(
                "{name}: {token} was granted past waiter {waiter}, which was ahead of it, still waits, \
                 and is held back by no cap"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grants(held: &[(&str, u64)]) -> GrantList {
        let grants: Vec<_> = held
            .iter()
            .map(|(token, fencing)| {
                serde_json::json!({ "namespace": "sim:ns0", "token": token, "units": 1, "fencing": fencing })
            })
            .collect();
        serde_json::from_value(serde_json::json!({ "grants": grants })).unwrap()
    }

    fn waiters(waiting: &[(&str, bool)]) -> WaiterList {
        let waiters: Vec<_> = waiting
            .iter()
            .enumerate()
            .map(|(index, (token, capped))| {
                let mut waiter = serde_json::json!({
                    "position": index + 1, "units_ahead": index, "token": token, "units": 1, "waited_ms": 0
                });
                if *capped {
                    waiter["blocked_by_cap"] = "namespace".into();
                }
                waiter
            })
            .collect();
        serde_json::from_value(serde_json::json!({ "waiters": waiters })).unwrap()
    }

    /// A reading in short: the tokens held (with their fencing numbers), and the waiters (held
    /// back by their cap or not), head first.
    type Short<'a> = (&'a [(&'a str, u64)], &'a [(&'a str, bool)]);

    fn readings(first: Short<'_>, second: Short<'_>) -> Result<(), Violation> {
        let mut order = QueueOrder::new(1);
        order.served_in_order(0, &grants(first.0), &waiters(first.1))?;
        order.served_in_order(0, &grants(second.0), &waiters(second.1))
    }

    #[test]
    fn waiters_served_first_come_first_served_pass() {
        // The head granted; a newcomer behind the one left.
        let head_granted = readings(
            (&[("a", 1)], &[("w1", false), ("w2", false)]),
            (&[("a", 1), ("w1", 2)], &[("w2", false), ("w3", false)]),
        );
        assert!(head_granted.is_ok(), "{head_granted:?}");
        // A waiter behind one held back by its cap may be granted, and so may a new token.
        let past_a_capped =
            readings((&[], &[("capped", true), ("w2", false)]), (&[("w2", 1), ("new", 2)], &[("capped", true)]));
        assert!(past_a_capped.is_ok(), "{past_a_capped:?}");
        // A grant held before (even one whose waiter left) is not a new one.
        assert!(readings((&[("a", 1)], &[("w1", false)]), (&[("a", 1)], &[("w1", false)])).is_ok());
    }

    #[test]
    fn a_waiter_passed_over_or_listed_out_of_arrival_order_is_a_violation() {
        let passed = readings((&[], &[("big", false), ("small", false)]), (&[("small", 1)], &[("big", false)]));
        let err = passed.unwrap_err();
        assert!(err.0.contains("small was granted past waiter big"), "{err}");
        // A new request granted while the head still waits jumps the whole queue.
        let jumped = readings((&[], &[("big", false)]), (&[("new", 1)], &[("big", false)])).unwrap_err();
        assert!(jumped.0.contains("new was granted past waiter big"), "{jumped}");
        // The same token granted again (a new fencing number) past the head.
        let again = readings((&[("t", 1)], &[("big", false)]), (&[("t", 2)], &[("big", false)])).unwrap_err();
        assert!(again.0.contains("t was granted past"), "{again}");

        let swapped = readings((&[], &[("w1", false), ("w2", false)]), (&[], &[("w2", false), ("w1", false)]));
        let err = swapped.unwrap_err();
        assert!(err.0.contains("w1 arrived before w2"), "{err}");
        let newcomer_ahead = readings((&[], &[("w1", false)]), (&[], &[("new", false), ("w1", false)])).unwrap_err();
        assert!(newcomer_ahead.0.contains("new joined the queue after w1"), "{newcomer_ahead}");
    }

    #[test]
    fn a_namespace_forgotten_is_compared_with_nothing() {
        let mut order = QueueOrder::new(1);
        order.served_in_order(0, &grants(&[]), &waiters(&[("w1", false), ("w2", false)])).unwrap();
        order.forget_namespace(0);
        assert!(order.served_in_order(0, &grants(&[]), &waiters(&[("w2", false), ("w1", false)])).is_ok());
        order.forget();
        assert!(order.served_in_order(0, &grants(&[("w2", 1)]), &waiters(&[("w1", false)])).is_ok());
    }
}
