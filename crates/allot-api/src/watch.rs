//! The change feed's bodies: one change as `GET /v1/watch` sends it ([`WatchEvent`], the `data` of
//! each Server-Sent Events message) and the last message of a watcher that fell behind
//! ([`WatchBehind`]).
//!
//! An event's object is the wire type the rest of the API answers for it (a `Grant`, a `Pool`, a
//! `TaskRun`...), as it is after the change, or `null` for a removal that carries no last state.
//! Which type it is follows from the kind: its family, the kind's name up to its `.`
//! (`grant.released` → `grant` → [`Grant`]), as [`WatchObject::FAMILIES`] lists.

use serde::{Deserialize, Serialize, Serializer};
use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{PartialSchema, ToSchema};

use crate::{Alloc, App, Grant, GrantRef, Namespace, Pool, Queue, Session, Task, TaskRun};

/// One change: the `data` of a `GET /v1/watch` message (whose `id` is its revision and whose
/// `event` its kind).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(try_from = "RawWatchEvent")]
pub struct WatchEvent {
    /// Where the change is in the feed: revisions increase in commit order (not by one). Resume
    /// after it with `since` or `Last-Event-ID`.
    pub revision: u64,
    /// What changed, e.g. `grant.granted` (the list is in the document's `WatchEvent` schema).
    pub kind: String,
    /// The object's key, e.g. `namespaces/hive/grants/t1`, `pools/p/allocs/3`, `queues/root.a`,
    /// `apps/etl/tasks/t1/run`: what a `prefix` filter matches.
    pub key: String,
    /// Why, where a kind has several causes: how a grant or an alloc ended (`released`,
    /// `expired`, `reclaimed`...), why a waiter gave up, why a task ended.
    pub cause: Option<String>,
    /// When the change was decided, by the store's clock (milliseconds since the Unix epoch).
    /// The object's relative times (`expires_in_ms`, `created_ms_ago`...) are as of then.
    pub at_ms: u64,
    /// The object as it is after the change (for a removal: its last state, or `null`).
    pub object: WatchObject,
}

/// A [`WatchEvent`] as it is read, before its object is read by its kind.
#[derive(Deserialize)]
struct RawWatchEvent {
    revision: u64,
    kind: String,
    key: String,
    #[serde(default)]
    cause: Option<String>,
    at_ms: u64,
    #[serde(default)]
    object: serde_json::Value,
}

impl TryFrom<RawWatchEvent> for WatchEvent {
    type Error = String;

    fn try_from(raw: RawWatchEvent) -> Result<WatchEvent, String> {
        let object = WatchObject::read(&raw.kind, raw.object)?;
        Ok(WatchEvent {
            revision: raw.revision,
            kind: raw.kind,
            key: raw.key,
            cause: raw.cause,
            at_ms: raw.at_ms,
            object,
        })
    }
}

/// Declares [`WatchObject`]: one variant per family of kinds, with the wire type of its object.
macro_rules! families {
    ($($variant:ident($body:ty) = $family:literal;)*) => {
        /// The object of a [`WatchEvent`], by the family of its kind.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum WatchObject {
            $($variant($body),)*
            /// Removed, with no last state: the key says what.
            Gone,
            /// An object of a family this client does not know (a newer daemon's), as it came.
            Other(serde_json::Value),
        }

        impl WatchObject {
            /// Every family of kinds (a kind's name up to its `.`) and the name of its object's
            /// schema in the document.
            pub const FAMILIES: &'static [(&'static str, &'static str)] = &[$(($family, stringify!($body)),)*];

            /// The object of an event of `kind`, from its JSON (`null`: [`WatchObject::Gone`]).
            pub fn read(kind: &str, value: serde_json::Value) -> Result<WatchObject, String> {
                if value.is_null() {
                    return Ok(WatchObject::Gone);
                }
                let family = kind.split_once('.').map_or(kind, |(family, _)| family);
                match family {
                    $($family => serde_json::from_value(value)
                        .map(WatchObject::$variant)
                        .map_err(|err| format!("the object of a `{kind}` event: {err}")),)*
                    _ => Ok(WatchObject::Other(value)),
                }
            }
        }

        impl Serialize for WatchObject {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                match self {
                    $(WatchObject::$variant(body) => body.serialize(serializer),)*
                    WatchObject::Gone => serializer.serialize_none(),
                    WatchObject::Other(value) => value.serialize(serializer),
                }
            }
        }

        impl PartialSchema for WatchObject {
            fn schema() -> RefOr<Schema> {
                let one_of = OneOfBuilder::new()
                    $(.item(Ref::from_schema_name(<$body as ToSchema>::name())))*
                    .item(ObjectBuilder::new().schema_type(Type::Null))
                    .description(Some("The object as it is after the change, of the wire type its kind's family \
                        names (`grant.*`: Grant, `pool.*`: Pool, `run.*`: TaskRun...); null for a removal that \
                        carries no last state"));
                Schema::OneOf(one_of.build()).into()
            }
        }

        impl ToSchema for WatchObject {
            fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
                $(
                    schemas.push((<$body as ToSchema>::name().into_owned(), <$body as PartialSchema>::schema()));
                    <$body as ToSchema>::schemas(schemas);
                )*
            }
        }
    };
}

families! {
    Namespace(Namespace) = "namespace";
    Grant(Grant) = "grant";
    Waiter(GrantRef) = "waiter";
    Session(Session) = "session";
    Pool(Pool) = "pool";
    Alloc(Alloc) = "alloc";
    Queue(Queue) = "queue";
    App(App) = "app";
    Task(Task) = "task";
    Run(TaskRun) = "run";
}

/// The `data` of the last message (`event: behind`) of a watcher that fell further behind than
/// its buffer: the stream ends after it; watch again from `resume` and nothing is missed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WatchBehind {
    /// The revision to resume after (`since`, or `Last-Event-ID`; the message's `id` is it too).
    pub resume: u64,
    /// How many events a watcher may have waiting before it is ended.
    pub buffer: u64,
    /// For people.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_reads_back_its_object_by_its_kind() {
        let pool = Pool {
            name: "p".into(),
            capacity: "cpu=4".into(),
            allocated: String::new(),
            expired: String::new(),
            allocs: 0,
            expired_allocs: 0,
            stopped: false,
            occupied: String::new(),
            cordon: None,
            stats: crate::PoolStats { accepted: 0, offer_expired: 0, freed: 0, reclaimed: 0 },
            labels: Default::default(),
            plugins: None,
            run_by: None,
        };
        let event = WatchEvent {
            revision: 7,
            kind: "pool.put".into(),
            key: "pools/p".into(),
            cause: None,
            at_ms: 1,
            object: WatchObject::Pool(pool),
        };
        let text = serde_json::to_string(&event).unwrap();
        assert_eq!(serde_json::from_str::<WatchEvent>(&text).unwrap(), event);
        let waiter = r#"{"revision":8,"kind":"waiter.queued","key":"namespaces/a/waiters/t","cause":null,"at_ms":2,
            "object":{"namespace":"a","token":"t"}}"#;
        let waiter: WatchEvent = serde_json::from_str(waiter).unwrap();
        assert_eq!(waiter.object, WatchObject::Waiter(GrantRef { namespace: "a".into(), token: "t".into() }));
        let gone = r#"{"revision":9,"kind":"pool.removed","key":"pools/p","cause":null,"at_ms":3,"object":null}"#;
        let gone: WatchEvent = serde_json::from_str(gone).unwrap();
        assert_eq!(gone.object, WatchObject::Gone);
        assert!(serde_json::to_string(&gone).unwrap().ends_with(r#""object":null}"#));
        let newer = r#"{"revision":10,"kind":"thing.made","key":"things/x","cause":null,"at_ms":4,"object":{"x":1}}"#;
        let newer: WatchEvent = serde_json::from_str(newer).unwrap();
        assert_eq!(newer.object, WatchObject::Other(serde_json::json!({"x": 1})));
        let wrong = r#"{"revision":11,"kind":"pool.put","key":"pools/p","cause":null,"at_ms":5,"object":{"x":1}}"#;
        assert!(serde_json::from_str::<WatchEvent>(wrong).unwrap_err().to_string().contains("pool.put"));
    }
}
