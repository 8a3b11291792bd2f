//! The change feed's events as the embedded store keeps them on disk (in the log record of the
//! change, then in the kept events' segments): an [`EventRecord`] per event, its object in the
//! parts' own records. Kinds, and the codes of what holds a queue's work back, are stored by name,
//! so a reordering of the enums cannot misread a file; text is borrowed when written and owned
//! when read.

use std::borrow::Cow;
use std::collections::BTreeMap;

use allot_core::apps::queues::QueueUsage;
use allot_core::apps::{QueueView, Why};
use allot_core::pools::{Cordon, EndedAlloc, PoolStats, PoolView};
use allot_core::watch::EventKind;
use allot_core::{Millis, NamespaceName, NamespaceStats, NamespaceView, Session, SessionId, Token};
use serde::{Deserialize, Serialize};

use super::apps::{AppRecord, QueueRecord, TaskRecord};
use super::runs::{RunRecord, RunRow};
use super::{
    resources_from, resources_record, AllocRecord, AllocRecordV0, CorruptRecord, GrantRecord, ResourcesRecord,
};
use crate::event::{Event, EventObject};
use crate::{GrantInfo, SessionInfo};

/// One event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventRecord<'a> {
    pub revision: u64,
    /// `EventKind::name`.
    pub kind: Cow<'a, str>,
    pub key: Cow<'a, str>,
    pub cause: Option<Cow<'a, str>>,
    pub at: Millis,
    pub object: ObjectRecord<'a>,
}

/// An event's object (`EventObject`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ObjectRecord<'a> {
    Namespace(NamespaceViewRecord<'a>),
    Grant {
        namespace: Cow<'a, str>,
        token: Cow<'a, str>,
        grant: GrantRecord,
        expires_in_ms: Option<u64>,
    },
    Waiter {
        namespace: Cow<'a, str>,
        token: Cow<'a, str>,
    },
    Session(SessionInfoRecord),
    Pool(PoolViewRecord),
    /// A live alloc as written before allocs had metadata (`Alloc1` since).
    Alloc {
        pool: Cow<'a, str>,
        id: u64,
        alloc: AllocRecordV0,
    },
    /// An ended alloc as written before allocs had metadata (`EndedAlloc1` since).
    EndedAlloc {
        pool: Cow<'a, str>,
        id: u64,
        alloc: AllocRecordV0,
    },
    Queue(Box<QueueViewRecord>),
    App {
        id: Cow<'a, str>,
        app: Box<AppRecord>,
    },
    Task {
        app: Cow<'a, str>,
        id: Cow<'a, str>,
        task: Box<TaskRecord>,
    },
    /// A run as written before its events had details (`Run1` since).
    Run(Box<RunRecord>),
    Gone,
    /// A session with its owner (written since sessions have one; `Session` is read as one
    /// without).
    OwnedSession(SessionInfoRecord, Option<String>),
    /// A pool with what is occupied and its cordon (since, drain at) (written since pools have
    /// them; `Pool` is read as one with neither).
    PoolRoom(PoolViewRecord, ResourcesRecord, Option<(Millis, Option<Millis>)>),
    /// A live alloc, with its metadata.
    Alloc1 {
        pool: Cow<'a, str>,
        id: u64,
        alloc: AllocRecord,
    },
    /// An ended alloc, with its metadata.
    EndedAlloc1 {
        pool: Cow<'a, str>,
        id: u64,
        alloc: AllocRecord,
    },
    /// A run, with what its events say of when they occurred and their custom information.
    Run1(Box<RunRow>),
}

/// A namespace's view (`NamespaceView`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceViewRecord<'a> {
    pub name: Cow<'a, str>,
    pub quota: u64,
    pub granted_units: u64,
    pub grants: u64,
    pub waiters: u64,
    pub waiting_units: u64,
    pub longest_wait_ms: u64,
    pub next_fencing: u64,
    /// granted, exhausted, cap exceeded, released, expired.
    pub stats: [u64; 5],
}

/// A session and the time its lease had left (`SessionInfo`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionInfoRecord {
    pub id: u128,
    pub ttl_ms: u64,
    pub deadline: Millis,
    /// (namespace, token) of its grants.
    pub grants: Vec<(String, String)>,
    pub expires_in_ms: u64,
}

/// A pool's view (`PoolView`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolViewRecord {
    pub name: String,
    pub capacity: ResourcesRecord,
    pub labels: BTreeMap<String, String>,
    pub allocated: ResourcesRecord,
    pub expired: ResourcesRecord,
    pub allocs: u64,
    pub expired_allocs: u64,
    pub stopped: bool,
    /// accepted, offer expired, freed, reclaimed.
    pub stats: [u64; 4],
}

/// A queue's view (`QueueView`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueViewRecord {
    pub path: String,
    pub limits: QueueRecord,
    pub allocated: ResourcesRecord,
    pub running_apps: u64,
    /// Per user: running applications and what they hold.
    pub users: Vec<(String, u64, ResourcesRecord)>,
    pub leaf: bool,
    pub apps: u64,
    pub pending_tasks: u64,
    /// By `Why::code`.
    pub waiting: Vec<(String, u64)>,
    /// Per group: the same as per user.
    #[serde(default)]
    pub groups: Vec<(String, u64, ResourcesRecord)>,
}

/// Per user or group: running applications and what they hold.
fn usage_record(usage: &BTreeMap<String, (u64, allot_core::Resources)>) -> Vec<(String, u64, ResourcesRecord)> {
    usage.iter().map(|(name, (apps, held))| (name.clone(), *apps, resources_record(held))).collect()
}

/// The encoding of a sequence of events: postcard, as a sequence of [`EventRecord`]s.
pub fn encode_events(events: &[Event]) -> Vec<u8> {
    EncodedEvents::encode(events).bytes
}

/// Reads what [`encode_events`] wrote.
pub fn decode_events(bytes: &[u8]) -> Result<Vec<Event>, CorruptRecord> {
    let records: Vec<EventRecord<'static>> = super::decode("events", "", bytes)?;
    records.into_iter().map(EventRecord::into_event).collect()
}

/// Events as [`encode_events`] encodes them (the sequence's length, then each event's
/// [`EventRecord`]), with where each record ends: the log writes the whole, the change feed keeps
/// each event's record as it is, so an event is encoded once.
#[derive(Debug, Default)]
pub struct EncodedEvents {
    pub(crate) bytes: Vec<u8>,
    /// Where the first record starts (after the sequence's length).
    start: usize,
    /// Where each record ends, in order.
    ends: Vec<usize>,
    /// The revision of the last event.
    last: Option<u64>,
}

/// The variant numbers of the [`ObjectRecord`]s whose record ends with an object's own record as
/// its table keeps it (postcard writes a variant as its number, a varint): an event of such an
/// object is written around the bytes its change's write has already (`encode_with`).
const TASK_VARIANT: u32 = 9;
const ALLOC_VARIANT: u32 = 14;
const ENDED_ALLOC_VARIANT: u32 = 15;
const RUN_VARIANT: u32 = 16;

impl EncodedEvents {
    pub fn encode(events: &[Event]) -> EncodedEvents {
        Self::encode_with(events, |_| None)
    }

    /// [`EncodedEvents::encode`], byte for byte, given the record of some events' objects as
    /// their tables keep it (`object(i)`, for the `i`th event: a task's `TaskRecord`, a run's
    /// `RunRow`, an alloc's `AllocRecord`, live or ended): those are copied in, not converted and
    /// encoded again. Another object's record is ignored.
    pub fn encode_with<'r>(events: &[Event], object: impl Fn(usize) -> Option<&'r [u8]>) -> EncodedEvents {
        // A sequence's length as postcard writes it, a varint, as it writes a `usize`.
        let bytes = Vec::with_capacity(2 + 96 * events.len());
        let mut bytes = postcard::to_extend(&events.len(), bytes).expect("a length always encodes");
        let start = bytes.len();
        let mut ends = Vec::with_capacity(events.len());
        for (i, event) in events.iter().enumerate() {
            let around = match object(i) {
                Some(record) => Self::extend_around(bytes, event, record),
                None => Err(bytes),
            };
            bytes = around.unwrap_or_else(|bytes| {
                postcard::to_extend(&EventRecord::of(event), bytes).expect("events always encode")
            });
            ends.push(bytes.len());
        }
        EncodedEvents { bytes, start, ends, last: events.last().map(|event| event.revision) }
    }

    /// `event`'s record written around its object's `record`: the fields before the object, the
    /// object's variant and its fields before its record, then the record. `Err` (with `bytes`
    /// as they were) for an object whose record is not its last field.
    fn extend_around(bytes: Vec<u8>, event: &Event, record: &[u8]) -> Result<Vec<u8>, Vec<u8>> {
        let head = (event.revision, event.kind.name(), event.key.as_str(), event.cause.as_deref(), event.at);
        let encoded = match &event.object {
            EventObject::Task(task) => {
                postcard::to_extend(&(head, TASK_VARIANT, task.app.as_str(), task.spec.id.as_str()), bytes)
            }
            EventObject::Run(_) => postcard::to_extend(&(head, RUN_VARIANT), bytes),
            EventObject::Alloc(alloc) => {
                postcard::to_extend(&(head, ALLOC_VARIANT, alloc.pool.as_str(), alloc.id.0), bytes)
            }
            EventObject::EndedAlloc(ended) => {
                let alloc = &ended.alloc;
                postcard::to_extend(&(head, ENDED_ALLOC_VARIANT, alloc.pool.as_str(), alloc.id.0), bytes)
            }
            _ => return Err(bytes),
        };
        let mut bytes = encoded.expect("events always encode");
        bytes.extend_from_slice(record);
        Ok(bytes)
    }

    /// The revision of the last event, if any.
    pub fn last_revision(&self) -> Option<u64> {
        self.last
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Each event's record, in order.
    pub fn records(&self) -> impl Iterator<Item = &[u8]> {
        let starts = std::iter::once(self.start).chain(self.ends.iter().copied());
        starts.zip(self.ends.iter().copied()).map(|(start, end)| &self.bytes[start..end])
    }
}

/// Reads one event's record, as [`EncodedEvents::records`] gives it.
pub fn decode_event(bytes: &[u8]) -> Result<Event, CorruptRecord> {
    super::decode::<EventRecord<'static>>("events", "", bytes)?.into_event()
}

/// The kind and key of an event's record, read without decoding the rest: what a watcher's
/// filter looks at. `None` for a record that does not start as an [`EventRecord`] does.
pub fn kind_and_key(bytes: &[u8]) -> Option<(EventKind, &str)> {
    /// The first fields of an [`EventRecord`], borrowed.
    #[derive(Deserialize)]
    struct Head<'a> {
        _revision: u64,
        kind: &'a str,
        key: &'a str,
    }
    let (head, _) = postcard::take_from_bytes::<Head<'_>>(bytes).ok()?;
    Some((EventKind::parse(head.kind)?, head.key))
}

impl<'a> EventRecord<'a> {
    pub fn of(event: &'a Event) -> EventRecord<'a> {
        EventRecord {
            revision: event.revision,
            kind: Cow::Borrowed(event.kind.name()),
            key: Cow::Borrowed(&event.key),
            cause: event.cause.as_deref().map(Cow::Borrowed),
            at: event.at,
            object: ObjectRecord::of(&event.object),
        }
    }

    pub fn into_event(self) -> Result<Event, CorruptRecord> {
        let r = Reader { key: format!("{}", self.revision) };
        let kind = EventKind::parse(&self.kind).ok_or_else(|| r.err(format!("unknown kind `{}`", self.kind)))?;
        Ok(Event {
            revision: self.revision,
            kind,
            key: self.key.into_owned(),
            cause: self.cause.map(Cow::into_owned),
            at: self.at,
            object: self.object.into_object(&r)?,
        })
    }
}

/// The object of an `alloc.ended` event.
fn ended_alloc(record: AllocRecord, pool: &str, id: u64, r: &Reader) -> Result<EventObject, CorruptRecord> {
    match record.into_alloc(pool, id)? {
        (alloc, Some((ended_at, reason))) => Ok(EventObject::EndedAlloc(EndedAlloc { alloc, ended_at, reason })),
        (_, None) => Err(r.err("an ended alloc without its end")),
    }
}

/// Turns errors of the core's constructors into [`CorruptRecord`]s of one event.
struct Reader {
    key: String,
}

impl Reader {
    fn session(&self, s: SessionInfoRecord, owner: Option<String>) -> Result<EventObject, CorruptRecord> {
        let grants = s.grants.iter().map(|(n, t)| Ok((self.namespace(n)?, self.token(t)?)));
        Ok(EventObject::Session(SessionInfo {
            session: Session {
                id: SessionId(s.id),
                ttl_ms: s.ttl_ms,
                deadline: s.deadline,
                grants: grants.collect::<Result<_, CorruptRecord>>()?,
                owner,
            },
            expires_in_ms: s.expires_in_ms,
        }))
    }

    fn err(&self, reason: impl ToString) -> CorruptRecord {
        CorruptRecord { table: "events", key: self.key.clone(), reason: reason.to_string() }
    }

    fn namespace(&self, name: &str) -> Result<NamespaceName, CorruptRecord> {
        NamespaceName::new(name).map_err(|e| self.err(e))
    }

    fn token(&self, token: &str) -> Result<Token, CorruptRecord> {
        Token::new(token).map_err(|e| self.err(e))
    }

    fn resources(&self, record: ResourcesRecord) -> Result<allot_core::Resources, CorruptRecord> {
        resources_from(record, "events", &self.key)
    }
}

impl<'a> ObjectRecord<'a> {
    fn of(object: &'a EventObject) -> ObjectRecord<'a> {
        match object {
            EventObject::Namespace(view) => ObjectRecord::Namespace(NamespaceViewRecord {
                name: Cow::Borrowed(view.name.as_str()),
                quota: view.quota,
                granted_units: view.granted_units,
                grants: view.grants as u64,
                waiters: view.waiters as u64,
                waiting_units: view.waiting_units,
                longest_wait_ms: view.longest_wait_ms,
                next_fencing: view.next_fencing,
                stats: {
                    let s = &view.stats;
                    [s.granted, s.exhausted, s.cap_exceeded, s.released, s.expired]
                },
            }),
            EventObject::Grant(info) => ObjectRecord::Grant {
                namespace: Cow::Borrowed(info.grant.namespace.as_str()),
                token: Cow::Borrowed(info.grant.token.as_str()),
                grant: GrantRecord::from_grant(&info.grant),
                expires_in_ms: info.expires_in_ms,
            },
            EventObject::Waiter { namespace, token } => ObjectRecord::Waiter {
                namespace: Cow::Borrowed(namespace.as_str()),
                token: Cow::Borrowed(token.as_str()),
            },
            EventObject::Session(info) => ObjectRecord::OwnedSession(
                SessionInfoRecord {
                    id: info.session.id.0,
                    ttl_ms: info.session.ttl_ms,
                    deadline: info.session.deadline,
                    grants: info.session.grants.iter().map(|(n, t)| (n.to_string(), t.to_string())).collect(),
                    expires_in_ms: info.expires_in_ms,
                },
                info.session.owner.clone(),
            ),
            EventObject::Pool(view) => ObjectRecord::PoolRoom(
                PoolViewRecord {
                    name: view.name.to_string(),
                    capacity: resources_record(&view.capacity),
                    labels: view.labels.clone(),
                    allocated: resources_record(&view.allocated),
                    expired: resources_record(&view.expired),
                    allocs: view.allocs as u64,
                    expired_allocs: view.expired_allocs as u64,
                    stopped: view.stopped,
                    stats: {
                        let s = &view.stats;
                        [s.accepted, s.offer_expired, s.freed, s.reclaimed]
                    },
                },
                resources_record(&view.occupied),
                view.cordon.map(|c| (c.since, c.drain_at)),
            ),
            EventObject::Alloc(alloc) => ObjectRecord::Alloc1 {
                pool: Cow::Borrowed(alloc.pool.as_str()),
                id: alloc.id.0,
                alloc: AllocRecord::live(alloc),
            },
            EventObject::EndedAlloc(ended) => ObjectRecord::EndedAlloc1 {
                pool: Cow::Borrowed(ended.alloc.pool.as_str()),
                id: ended.alloc.id.0,
                alloc: AllocRecord::ended(ended),
            },
            EventObject::Queue(view) => ObjectRecord::Queue(Box::new(QueueViewRecord {
                path: view.path.to_string(),
                limits: QueueRecord::of(&view.limits),
                allocated: resources_record(&view.usage.allocated),
                running_apps: view.usage.running_apps,
                users: usage_record(&view.usage.users),
                leaf: view.leaf,
                apps: view.apps,
                pending_tasks: view.pending_tasks,
                waiting: view.waiting.iter().map(|(code, n)| ((*code).to_owned(), *n)).collect(),
                groups: usage_record(&view.usage.groups),
            })),
            EventObject::App(app) => {
                ObjectRecord::App { id: Cow::Borrowed(app.spec.id.as_str()), app: Box::new(AppRecord::of(app)) }
            }
            EventObject::Task(task) => ObjectRecord::Task {
                app: Cow::Borrowed(task.app.as_str()),
                id: Cow::Borrowed(task.spec.id.as_str()),
                task: Box::new(TaskRecord::of(task)),
            },
            EventObject::Run(run) => ObjectRecord::Run1(Box::new(RunRow::of(run))),
            EventObject::Gone => ObjectRecord::Gone,
        }
    }

    fn into_object(self, r: &Reader) -> Result<EventObject, CorruptRecord> {
        Ok(match self {
            ObjectRecord::Namespace(v) => {
                let [granted, exhausted, cap_exceeded, released, expired] = v.stats;
                EventObject::Namespace(NamespaceView {
                    name: r.namespace(&v.name)?,
                    quota: v.quota,
                    granted_units: v.granted_units,
                    grants: v.grants as usize,
                    waiters: v.waiters as usize,
                    waiting_units: v.waiting_units,
                    longest_wait_ms: v.longest_wait_ms,
                    next_fencing: v.next_fencing,
                    stats: NamespaceStats { granted, exhausted, cap_exceeded, released, expired },
                })
            }
            ObjectRecord::Grant { namespace, token, grant, expires_in_ms } => {
                EventObject::Grant(GrantInfo { grant: grant.into_grant(&namespace, &token)?, expires_in_ms })
            }
            ObjectRecord::Waiter { namespace, token } => {
                EventObject::Waiter { namespace: r.namespace(&namespace)?, token: r.token(&token)? }
            }
            ObjectRecord::Session(s) => r.session(s, None)?,
            ObjectRecord::OwnedSession(s, owner) => r.session(s, owner)?,
            ObjectRecord::Pool(v) => ObjectRecord::PoolRoom(v, Vec::new(), None).into_object(r)?,
            ObjectRecord::PoolRoom(v, occupied, cordon) => {
                let [accepted, offer_expired, freed, reclaimed] = v.stats;
                EventObject::Pool(Box::new(PoolView {
                    name: allot_core::pools::PoolName::new(&v.name).map_err(|e| r.err(e))?,
                    capacity: r.resources(v.capacity)?,
                    labels: v.labels,
                    allocated: r.resources(v.allocated)?,
                    expired: r.resources(v.expired)?,
                    allocs: v.allocs as usize,
                    expired_allocs: v.expired_allocs as usize,
                    stopped: v.stopped,
                    occupied: r.resources(occupied)?,
                    cordon: cordon.map(|(since, drain_at)| Cordon { since, drain_at }),
                    stats: PoolStats { accepted, offer_expired, freed, reclaimed },
                }))
            }
            ObjectRecord::Alloc { pool, id, alloc } => {
                EventObject::Alloc(AllocRecord::from(alloc).into_alloc(&pool, id)?.0)
            }
            ObjectRecord::Alloc1 { pool, id, alloc } => EventObject::Alloc(alloc.into_alloc(&pool, id)?.0),
            ObjectRecord::EndedAlloc { pool, id, alloc } => ended_alloc(AllocRecord::from(alloc), &pool, id, r)?,
            ObjectRecord::EndedAlloc1 { pool, id, alloc } => ended_alloc(alloc, &pool, id, r)?,
            ObjectRecord::Queue(v) => {
                let (path, limits) = v.limits.into_queue(&v.path)?;
                let usage = |entries: Vec<(String, u64, ResourcesRecord)>| {
                    entries
                        .into_iter()
                        .map(|(name, apps, held)| Ok((name, (apps, r.resources(held)?))))
                        .collect::<Result<_, CorruptRecord>>()
                };
                let (users, groups) = (usage(v.users)?, usage(v.groups)?);
                let waiting = v
                    .waiting
                    .into_iter()
                    .map(|(code, n)| {
                        Why::code_named(&code)
                            .map(|code| (code, n))
                            .ok_or_else(|| r.err(format!("unknown code `{code}`")))
                    })
                    .collect::<Result<_, CorruptRecord>>()?;
                EventObject::Queue(Box::new(QueueView {
                    path,
                    limits,
                    usage: QueueUsage {
                        allocated: r.resources(v.allocated)?,
                        running_apps: v.running_apps,
                        users,
                        groups,
                    },
                    leaf: v.leaf,
                    apps: v.apps,
                    pending_tasks: v.pending_tasks,
                    waiting,
                }))
            }
            ObjectRecord::App { id, app } => EventObject::App(Box::new(app.into_app(&id)?)),
            ObjectRecord::Task { app, id, task } => EventObject::Task(Box::new(task.into_task(&app, &id)?)),
            ObjectRecord::Run(run) => EventObject::Run(Box::new(run.into_run(&r.key)?)),
            ObjectRecord::Run1(run) => EventObject::Run(Box::new(run.into_run(&r.key)?)),
            ObjectRecord::Gone => EventObject::Gone,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Events encoded one by one read back the same, alone and as the log's sequence, which is
    /// byte for byte what postcard writes for the sequence of their records.
    #[test]
    fn events_encoded_one_by_one_make_the_logs_sequence() {
        let event = |revision, kind, key: &str, cause: Option<&str>, object| Event {
            revision,
            kind,
            key: key.to_owned(),
            cause: cause.map(str::to_owned),
            at: 1_000 + revision,
            object,
        };
        let waiter =
            EventObject::Waiter { namespace: NamespaceName::new("web").unwrap(), token: Token::new("t").unwrap() };
        let run = EventObject::Run(Box::new(crate::conformance::sample_run()));
        let events = vec![
            event(7, EventKind::WaiterGaveUp, "namespaces/web/waiters/t", Some("timed_out"), waiter),
            event(9, EventKind::RunChanged, "apps/a/tasks/t/run", None, run),
            event(300, EventKind::PoolRemoved, "pools/p", None, EventObject::Gone),
        ];
        let encoded = EncodedEvents::encode(&events);
        let records: Vec<EventRecord<'_>> = events.iter().map(EventRecord::of).collect();
        assert_eq!(encoded.bytes, postcard::to_allocvec(&records).unwrap());
        assert_eq!(decode_events(&encoded.bytes).unwrap(), events);
        assert_eq!(encoded.len(), events.len());
        for (record, event) in encoded.records().zip(&events) {
            assert_eq!(decode_event(record).unwrap(), *event);
            assert_eq!(kind_and_key(record), Some((event.kind, event.key.as_str())));
        }
        assert!(EncodedEvents::encode(&[]).is_empty());
        assert_eq!(kind_and_key(&[0xff]), None);
    }

    /// An event written around its object's record as its table keeps it is the event encoded
    /// whole, byte for byte; a record given for an object that has none there is ignored. (Every
    /// record of the embedded store checks the same in debug builds, for every kind of object.)
    #[test]
    fn events_written_around_their_objects_records_are_the_events_encoded_whole() {
        let run = crate::conformance::sample_run();
        let record = postcard::to_allocvec(&RunRow::of(&run)).unwrap();
        let event = |revision, kind, object| Event {
            revision,
            kind,
            key: "apps/a/tasks/t/run".to_owned(),
            cause: Some("why".to_owned()),
            at: 12,
            object,
        };
        let events = vec![
            event(1, EventKind::RunChanged, EventObject::Run(Box::new(run))),
            event(2, EventKind::PoolRemoved, EventObject::Gone),
        ];
        let given = |_| Some(record.as_slice());
        assert_eq!(EncodedEvents::encode_with(&events, given).bytes, EncodedEvents::encode(&events).bytes);
    }

    /// A run's event written before events had details (the `Run` object) still reads, among
    /// other events, as a run without them; one written now keeps them.
    #[test]
    fn runs_in_events_of_an_earlier_version_read_back() {
        let run = crate::conformance::sample_run();
        let record = |revision, object| EventRecord {
            revision,
            kind: Cow::Borrowed("run.changed"),
            key: Cow::Borrowed("a/t"),
            cause: None,
            at: 5,
            object,
        };
        let older = vec![
            record(1, ObjectRecord::Run(Box::new(RunRecord::of(&run)))),
            record(2, ObjectRecord::Run1(Box::new(RunRow::of(&run)))),
        ];
        let events = decode_events(&postcard::to_allocvec(&older).unwrap()).unwrap();
        let without = crate::conformance::without_details(run.clone());
        assert_ne!(without, run, "the sample's events have details");
        let runs: Vec<_> = events
            .into_iter()
            .map(|e| match e.object {
                EventObject::Run(run) => *run,
                other => panic!("not a run: {other:?}"),
            })
            .collect();
        assert_eq!(runs, vec![without, run]);
    }
}
