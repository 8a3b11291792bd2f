//! The embedded store's change feed. The events of an operation are drafted from its changes
//! under the state lock, so they see the state right after it; they are given revisions there,
//! in log order, carried by the operation's log record (so they are durable with it) and handed
//! to the [`Feed`] by the same `deliver` that answers the operation, once its record is durable
//! (so a caller that has its answer finds its change in the feed).
//!
//! Revisions: the events of log record `seq` take revisions from `seq << WINDOW_BITS` up. Events
//! with no change of their own (a waiter queued or giving up) get a record of their own, with no
//! writes: every event published is in a durable record. So a store reopened after its last
//! durable record `seq` starts after `(seq + 1) << WINDOW_BITS`, above every revision it
//! published, and the events it kept (`archive`) are every one up to there. (After a rebuild
//! that took the log back to an earlier record, the next record's events go on after the
//! revisions already given, past its own window: a reopened store starts after the last event it
//! kept too, if that is higher.)

use allot_core::apps::{AppChange, Scheduler};
use allot_core::pools::{PoolChange, Pools};
use allot_core::watch::{keys, EventKind};
use allot_core::{Change, GrantEnd, Ledger, LedgerError, Millis, NamespaceName, Token, WaiterId};

use super::ops::Op;
use super::{grant_info, session_info, Shared, State};
use crate::runs::RunChange;
use crate::watch::{Event, EventObject};

/// The revisions of one log record: `1 << WINDOW_BITS` of them.
pub(super) const WINDOW_BITS: u32 = 20;

/// The first revision a store whose last record is `seq` may give.
pub(super) fn window_of(seq: u64) -> u64 {
    seq << WINDOW_BITS
}

/// An event before its revision.
#[derive(Debug)]
pub(super) struct Draft {
    pub(super) kind: EventKind,
    pub(super) key: String,
    pub(super) cause: Option<String>,
    pub(super) object: EventObject,
    /// The first write of its change (its index among the record's ops, see [`change`]): for a
    /// task, a run or an alloc, that write holds the object's own record, and the event is
    /// written around those bytes, not encoded again (`EncodedEvents::encode_with`).
    pub(super) record: Option<usize>,
}

impl Draft {
    pub(super) fn stamp(self, revision: u64, at: Millis) -> Event {
        Event { revision, kind: self.kind, key: self.key, cause: self.cause, at, object: self.object }
    }
}

/// Makes one change's writes, then its events. A change that drafts one event has its first
/// write noted as that event's `record`: the encoder writes the event around that write's bytes
/// when its object's record ends with them (`EncodedEvents::encode_with` knows which objects).
pub(super) fn change(
    ops: &mut Vec<Op>,
    drafts: &mut Vec<Draft>,
    write: impl FnOnce(&mut Vec<Op>),
    draft: impl FnOnce(&mut Vec<Draft>),
) {
    let (op, drafted) = (ops.len(), drafts.len());
    write(ops);
    draft(drafts);
    if let [one] = &mut drafts[drafted..] {
        one.record = (op < ops.len()).then_some(op);
    }
}

fn draft(kind: EventKind, key: String, object: EventObject) -> Draft {
    Draft { kind, key, cause: None, object, record: None }
}

/// A waiter's event.
pub(super) fn waiter(kind: EventKind, namespace: &NamespaceName, token: &Token, cause: Option<&str>) -> Draft {
    Draft {
        kind,
        key: keys::waiter(namespace, token),
        cause: cause.map(str::to_owned),
        object: EventObject::Waiter { namespace: namespace.clone(), token: token.clone() },
        record: None,
    }
}

/// Why a waiter the ledger cancelled cannot be granted.
pub(super) fn cancel_cause(err: &LedgerError) -> &'static str {
    match err {
        LedgerError::NamespaceNotFound(_) => "namespace_removed",
        LedgerError::SessionNotFound(_) => "session_ended",
        _ => "cancelled",
    }
}

/// The events of the ledger's changes, as the ledger is after them.
pub(super) fn quotas(ledger: &Ledger, changes: &[Change], now: Millis, out: &mut Vec<Draft>) {
    for change in changes {
        out.push(match change {
            // A moved fencing bound is the store's own bookkeeping.
            Change::Namespace { put: false, .. } => continue,
            Change::Namespace { name, .. } => match ledger.namespace(name, now) {
                Ok(view) => draft(EventKind::NamespacePut, keys::namespace(name), EventObject::Namespace(view)),
                Err(_) => continue,
            },
            Change::NamespaceRemoved { name, .. } => {
                draft(EventKind::NamespaceRemoved, keys::namespace(name), EventObject::Gone)
            }
            Change::GrantAdded(grant) | Change::Grant(grant) => {
                let kind = if matches!(change, Change::GrantAdded(_)) {
                    EventKind::GrantGranted
                } else {
                    EventKind::GrantRenewed
                };
                let key = keys::grant(grant.namespace.as_str(), grant.token.as_str());
                draft(kind, key, EventObject::Grant(grant_info(ledger, grant.clone(), now)))
            }
            Change::GrantRemoved { grant, cause } => {
                let kind = match cause {
                    GrantEnd::Released => EventKind::GrantReleased,
                    GrantEnd::Expired | GrantEnd::SessionExpired => EventKind::GrantExpired,
                    GrantEnd::SessionClosed => EventKind::GrantSessionClosed,
                };
                let key = keys::grant(grant.namespace.as_str(), grant.token.as_str());
                let object = EventObject::Grant(crate::GrantInfo { grant: grant.clone(), expires_in_ms: None });
                Draft { kind, key, cause: Some(cause.name().to_owned()), object, record: None }
            }
            Change::Session { id, opened, .. } => match ledger.session(*id) {
                Ok(session) => {
                    let kind = if *opened { EventKind::SessionOpened } else { EventKind::SessionRenewed };
                    draft(kind, keys::session(id), EventObject::Session(session_info(session, now)))
                }
                Err(_) => continue,
            },
            Change::SessionRemoved { id, expired } => {
                let kind = if *expired { EventKind::SessionExpired } else { EventKind::SessionClosed };
                draft(kind, keys::session(id), EventObject::Gone)
            }
        });
    }
}

/// The events of the pools' changes, as the pools are after them.
pub(super) fn pools(pools: &Pools, changes: &[PoolChange], now: Millis, out: &mut Vec<Draft>) {
    for change in changes {
        out.push(match change {
            PoolChange::Pool { name, .. } => match pools.pool(name, now) {
                Ok(view) => draft(EventKind::PoolPut, keys::pool(name), EventObject::Pool(Box::new(view))),
                Err(_) => continue,
            },
            PoolChange::PoolRemoved { name } => draft(EventKind::PoolRemoved, keys::pool(name), EventObject::Gone),
            PoolChange::Alloc(alloc) => {
                // A keepalive is what sets `last_keepalive`: an alloc without one is new.
                let kind = if alloc.last_keepalive.is_none() { EventKind::AllocMade } else { EventKind::AllocRenewed };
                draft(kind, keys::alloc(&alloc.pool, alloc.id), EventObject::Alloc(alloc.clone()))
            }
            PoolChange::AllocAnnotated(alloc) => {
                draft(EventKind::AllocAnnotated, keys::alloc(&alloc.pool, alloc.id), EventObject::Alloc(alloc.clone()))
            }
            PoolChange::AllocEnded(ended) => Draft {
                kind: EventKind::AllocEnded,
                key: keys::alloc(&ended.alloc.pool, ended.alloc.id),
                cause: Some(ended.reason.name().to_owned()),
                object: EventObject::EndedAlloc(ended.clone()),
                record: None,
            },
            // An ended alloc's retention running out changes nothing a watcher sees.
            PoolChange::EndedDropped { .. } => continue,
        });
    }
}

/// The events of the applications' changes.
pub(super) fn apps(sched: &Scheduler, changes: &[AppChange], out: &mut Vec<Draft>) {
    for change in changes {
        out.push(match change {
            AppChange::Queue { path, .. } => match sched.queue(path) {
                Ok(view) => draft(EventKind::QueuePut, keys::queue(path), EventObject::Queue(Box::new(view))),
                Err(_) => continue,
            },
            AppChange::QueueRemoved { path } => draft(EventKind::QueueRemoved, keys::queue(path), EventObject::Gone),
            AppChange::App(app) => {
                draft(EventKind::AppChanged, keys::app(&app.spec.id), EventObject::App(Box::new(app.clone())))
            }
            AppChange::AppRemoved { id } => draft(EventKind::AppRemoved, keys::app(id), EventObject::Gone),
            AppChange::Task(task) => Draft {
                kind: EventKind::TaskChanged,
                key: keys::task(&task.app, &task.spec.id),
                cause: task.reason.clone(),
                object: EventObject::Task(Box::new(task.clone())),
                record: None,
            },
            AppChange::TaskRemoved { app, task } => {
                draft(EventKind::TaskRemoved, keys::task(app, task), EventObject::Gone)
            }
        });
    }
}

/// The event of a change of the kept runs.
pub(super) fn runs(change: &RunChange, out: &mut Vec<Draft>) {
    match change {
        RunChange::Put { app, task, run } => {
            out.push(draft(EventKind::RunChanged, keys::run(app, task), EventObject::Run(run.clone())))
        }
        RunChange::Removed { app, task } => {
            out.push(draft(EventKind::RunRemoved, keys::run(app, task), EventObject::Gone))
        }
        // The catalog of outputs is not watched.
        RunChange::Cached { .. } | RunChange::Uncached { .. } => {}
    }
}

impl State {
    /// Forgets a waiting call that leaves the queue ungranted, drafting its event.
    pub(super) fn gave_up(&mut self, id: WaiterId, cause: &str) -> Option<super::Waiting> {
        let waiting = self.waiters.remove(&id)?;
        self.drafts.push(waiter(EventKind::WaiterGaveUp, &waiting.namespace, &waiting.token, Some(cause)));
        Some(waiting)
    }

    /// Publishes the drafted events that no change goes with, in a record of their own (once it
    /// and what came before are durable, in order).
    pub(super) fn flush_drafts(&mut self, shared: &Shared) {
        let drafts = std::mem::take(&mut self.drafts);
        if !drafts.is_empty() {
            drop(self.log_and_answer(shared, Vec::new(), Vec::new(), Vec::new(), drafts, shared.clock.now()));
        }
    }

    /// Gives `drafts` their revisions (those of the record about to be appended) and time.
    pub(super) fn stamp(&mut self, drafts: Vec<Draft>, now: Millis) -> Vec<Event> {
        if drafts.is_empty() {
            return Vec::new();
        }
        self.revision = self.revision.max(window_of(self.log.seq + 1));
        drafts
            .into_iter()
            .map(|draft| {
                self.revision += 1;
                draft.stamp(self.revision, now)
            })
            .collect()
    }
}
