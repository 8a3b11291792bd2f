//! The change feed's vocabulary: what kinds of change there are, the key of the object each one is
//! about, and which changes a watcher asked for ([`Filter`]).
//!
//! A key is a path of the object in the API's own terms: `namespaces/hive:a`,
//! `namespaces/hive:a/grants/job-1`, `namespaces/hive:a/waiters/job-2`, `sessions/<id>`, `pools/p`,
//! `pools/p/allocs/3`, `queues/root.a`, `apps/etl`, `apps/etl/tasks/t1`. A filter's prefix matches
//! a key equal to it or that goes on from it after a separator (`/`, `:` or `.`): `namespaces/hive`
//! is the namespace `hive`, those under it (`hive:a`) and their grants and waiters, not `hive2`;
//! `queues/root.a` is that queue's subtree.

use std::fmt;

macro_rules! kinds {
    ($($variant:ident => $name:literal, $doc:literal;)*) => {
        /// What a change was. The name (`grant.granted`) is the API's.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum EventKind {
            $(#[doc = $doc] $variant,)*
        }

        impl EventKind {
            /// Every kind, in the order of the API's list.
            pub const ALL: &'static [EventKind] = &[$(EventKind::$variant,)*];

            pub fn name(self) -> &'static str {
                match self {
                    $(EventKind::$variant => $name,)*
                }
            }

            /// The kind of this name.
            pub fn parse(name: &str) -> Option<EventKind> {
                EventKind::ALL.iter().copied().find(|kind| kind.name() == name)
            }
        }
    };
}

kinds! {
    NamespacePut => "namespace.put", "A namespace was created or its quota changed.";
    NamespaceRemoved => "namespace.removed", "A namespace was removed, with every grant it held.";
    GrantGranted => "grant.granted", "A token was granted (at once, or to a waiter).";
    GrantRenewed => "grant.renewed", "A grant's lease was kept alive.";
    GrantReleased => "grant.released", "A grant was released by its holder.";
    GrantExpired => "grant.expired", "A grant ended with its lease (its TTL, or its session's).";
    GrantSessionClosed => "grant.session_closed", "A grant ended because its session was closed.";
    WaiterQueued => "waiter.queued", "An allocate call joined its namespace's queue.";
    WaiterAdmitted => "waiter.admitted", "A waiting call was granted.";
    WaiterGaveUp => "waiter.gave_up", "A waiting call left the queue ungranted: its wait ended, or it cannot be granted.";
    SessionOpened => "session.opened", "A session was opened.";
    SessionRenewed => "session.renewed", "A session was kept alive.";
    SessionClosed => "session.closed", "A session was closed; its grants ended.";
    SessionExpired => "session.expired", "A session's lease ran out; its grants ended.";
    PoolPut => "pool.put", "A pool was created, or its capacity, labels or stopped state changed.";
    PoolRemoved => "pool.removed", "A pool was removed.";
    AllocMade => "alloc.made", "An alloc was made from a pool's offer.";
    AllocRenewed => "alloc.renewed", "An alloc was kept alive.";
    AllocAnnotated => "alloc.annotated", "An alloc's labels or metadata were changed (by its owner, or by the scheduler when a task took a placeholder's alloc over).";
    AllocEnded => "alloc.ended", "An alloc ended: freed, reclaimed, or with its pool.";
    QueuePut => "queue.put", "A queue was created or its limits changed.";
    QueueRemoved => "queue.removed", "A queue was removed.";
    AppChanged => "app.changed", "An application changed: its state, its slots.";
    AppRemoved => "app.removed", "An application was removed, with its tasks.";
    TaskChanged => "task.changed", "A task changed: its state, its placement.";
    TaskRemoved => "task.removed", "A task was removed.";
    RunChanged => "run.changed", "A task's run changed: its phase, its attempt.";
    RunRemoved => "run.removed", "A task's run was forgotten.";
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which changes a watcher wants: any of `kinds` (none: every kind) about a key under any of
/// `prefixes` (none: every key).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Filter {
    pub kinds: Vec<EventKind>,
    pub prefixes: Vec<String>,
}

impl Filter {
    pub fn matches(&self, kind: EventKind, key: &str) -> bool {
        (self.kinds.is_empty() || self.kinds.contains(&kind))
            && (self.prefixes.is_empty() || self.prefixes.iter().any(|prefix| under(key, prefix)))
    }
}

/// Whether `key` is `prefix` or goes on from it after a separator.
pub fn under(key: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    match key.strip_prefix(prefix) {
        Some("") => true,
        Some(rest) => prefix.is_empty() || rest.starts_with(['/', ':', '.']),
        None => false,
    }
}

/// The keys of the objects of each part.
pub mod keys {
    use std::fmt::Display;

    pub fn namespace(name: impl Display) -> String {
        format!("namespaces/{name}")
    }

    /// (Joined, not formatted: every allocate and release makes one.)
    pub fn grant(namespace: &str, token: &str) -> String {
        ["namespaces/", namespace, "/grants/", token].concat()
    }

    /// A waiting allocate call: one per token in a namespace.
    pub fn waiter(namespace: impl Display, token: impl Display) -> String {
        format!("namespaces/{namespace}/waiters/{token}")
    }

    pub fn session(id: impl Display) -> String {
        format!("sessions/{id}")
    }

    pub fn pool(name: impl Display) -> String {
        format!("pools/{name}")
    }

    pub fn alloc(pool: impl Display, id: impl Display) -> String {
        format!("pools/{pool}/allocs/{id}")
    }

    pub fn queue(path: impl Display) -> String {
        format!("queues/{path}")
    }

    /// (The keys of applications, tasks and runs are joined, not formatted: a task's run makes
    /// several events.)
    pub fn app(id: impl AsRef<str>) -> String {
        ["apps/", id.as_ref()].concat()
    }

    pub fn task(app: impl AsRef<str>, task: impl AsRef<str>) -> String {
        ["apps/", app.as_ref(), "/tasks/", task.as_ref()].concat()
    }

    pub fn run(app: impl AsRef<str>, task: impl AsRef<str>) -> String {
        ["apps/", app.as_ref(), "/tasks/", task.as_ref(), "/run"].concat()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_read_back() {
        for kind in EventKind::ALL {
            assert_eq!(EventKind::parse(kind.name()), Some(*kind));
        }
        let mut names: Vec<&str> = EventKind::ALL.iter().map(|k| k.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), EventKind::ALL.len());
        assert_eq!(EventKind::parse("grant.nope"), None);
    }

    #[test]
    fn prefixes_match_whole_segments() {
        assert!(under("namespaces/hive", "namespaces/hive"));
        assert!(under("namespaces/hive:a", "namespaces/hive"));
        assert!(under("namespaces/hive/grants/t", "namespaces/hive"));
        assert!(under("namespaces/hive/grants/t", "namespaces/hive/"));
        assert!(!under("namespaces/hive2", "namespaces/hive"));
        assert!(under("queues/root.a.b", "queues/root.a"));
        assert!(!under("queues/root.ab", "queues/root.a"));
        assert!(under("apps/etl/tasks/t/run", "apps/etl"));
        assert!(!under("apps/etl2", "apps/etl"));
        assert!(under("anything", ""));
    }

    #[test]
    fn a_filter_takes_any_of_its_kinds_and_prefixes() {
        let all = Filter::default();
        assert!(all.matches(EventKind::PoolPut, "pools/p"));
        let filter = Filter {
            kinds: vec![EventKind::GrantGranted, EventKind::GrantReleased],
            prefixes: vec!["namespaces/a".into(), "namespaces/b".into()],
        };
        assert!(filter.matches(EventKind::GrantGranted, "namespaces/b/grants/t"));
        assert!(!filter.matches(EventKind::GrantExpired, "namespaces/b/grants/t"));
        assert!(!filter.matches(EventKind::GrantGranted, "namespaces/c/grants/t"));
    }
}
