//! The change feed's event: one committed change as watchers see it (`watch` hands them out,
//! `records::events` keeps them on disk).

use allot_core::apps::{App, QueueView, Task};
use allot_core::pools::{Alloc, EndedAlloc, PoolView};
use allot_core::runs::Run;
use allot_core::watch::EventKind;
use allot_core::{Millis, NamespaceName, NamespaceView, Token};

use crate::{GrantInfo, SessionInfo};

/// One change, as watchers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub revision: u64,
    pub kind: EventKind,
    /// The object's key (`allot_core::watch::keys`).
    pub key: String,
    /// Why, where a kind has several causes: how a grant or an alloc ended, why a waiter gave up,
    /// the reason a task ended.
    pub cause: Option<String>,
    /// The store's clock when the change was decided.
    pub at: Millis,
    pub object: EventObject,
}

/// The object an event is about, as it is after the change (for a removal: its last state when
/// the change carries it, else only its key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventObject {
    Namespace(NamespaceView),
    Grant(GrantInfo),
    /// A waiting allocate call: its namespace and token.
    Waiter {
        namespace: NamespaceName,
        token: Token,
    },
    Session(SessionInfo),
    Pool(Box<PoolView>),
    Alloc(Alloc),
    EndedAlloc(EndedAlloc),
    Queue(Box<QueueView>),
    App(Box<App>),
    Task(Box<Task>),
    Run(Box<Run>),
    /// Removed: the key says what.
    Gone,
}
