//! The change feed on Redis. Every function that changes something appends its events to its own
//! slot's stream (`<slot>:feed`) in the same call (`lua/namespace.lua`'s `emit`/`flush_feed`),
//! so a change and its events are one atomic write. The daemons copy those streams into one
//! shared log (`lua/feed.lua`, the `{allot-feed}` slot), where each event gets its revision, and
//! each daemon reads the log into its own [`Feed`], which serves its watchers.
//!
//! - **Copying.** A call that finds its slot's stream empty publishes the stream's name on
//!   `allot:feed`; every daemon's subscriber marks it to copy ([`FeedState::mark`]). A copy
//!   reads the stream after the cursor the log keeps for it, appends those events to the log
//!   only if the cursor is still where it read it (another daemon may have copied them: it then
//!   goes on from there), then trims what it copied from the stream. A copy is a page: a stream
//!   with more is copied again at the next turn, after a page of every other marked stream.
//!   Every [`SWEEP_EVERY`] a daemon marks every stream (every namespace and pool listed, the
//!   sessions, applications and runs), so a message lost costs a delay, never an event; and
//!   it copies every stream when it opens the store (before it serves) and when it subscribes
//!   again, so that what a daemon killed left in the streams comes before any later change.
//! - **Order.** The log is one order every daemon reads alike; each stream's events are in it in
//!   the order they were committed (one stream per namespace with its grants and waiters, per
//!   pool with its allocs, one for the sessions, one for the applications (one scheduler at a
//!   time writes them), one for the runs). Events of different streams are in the order they
//!   were copied: a grant ended by a session's close may come before or after the close.
//! - **Reading.** After a copy the copier publishes on `allot:feed:log`; each daemon reads the
//!   log from its last revision (and every second without a message) and publishes what it read
//!   into its [`Feed`]. At open, a daemon reads every event the log keeps first, so a watcher
//!   may resume on any daemon from a revision another gave it.
//! - **Connections.** Copies go on the feed's own connection (with `--redis-min-replicas` they
//!   wait for the replicas, and must not hold a caller's change up behind them); a trim, which is
//!   idempotent and needs no replicas, goes with the slot's reads on the store's connection. (With
//!   the trims on the feed's connection, a change in flight on a Cluster node that died was now and
//!   then answered "never sent" (`tests/it/outage.rs`, about one run in eight under load); not
//!   since.)
//! - **Retention.** The log keeps [`WatchConfig::retain_events`] events and none older than
//!   `retain_for` (trimmed by each copy, and each sweep while nothing is copied); `F:meta`
//!   `compacted` says after which revision it keeps everything.

use std::sync::Arc;
use std::time::Duration;

use allot_core::apps::AppId;
use allot_core::pools::PoolName;
use allot_core::watch::{keys, EventKind};
use allot_core::{NamespaceName, Session, SessionId, Token};
use allot_store::records::apps::{AppRecord, QueueRecord, TaskRecord};
use allot_store::{Event, EventObject, GrantInfo, SessionInfo, StoreError};
use futures_util::{stream, StreamExt};
use redis::Value;

use crate::errors::{call_error, redis_error};
use crate::keys::{prefix, unescape_tag};
use crate::reply::{self, corrupt, into_text, Reply};
use crate::store::Inner;
use crate::wake::LOG_CHANNEL;
use crate::{pools, registry};

/// The slot of the shared log.
const FEED_SLOT: &str = "allot:{allot-feed}";
const LOG: &str = "allot:{allot-feed}:log";
const META: &str = "allot:{allot-feed}:meta";
const CURSORS: &str = "allot:{allot-feed}:cursors";
/// How often every stream is looked at, whatever the messages said.
const SWEEP_EVERY: Duration = Duration::from_secs(2);
/// How often the log is read without a message.
const READ_EVERY: Duration = Duration::from_secs(1);
/// Entries copied or read per call.
const PAGE: usize = 500;

/// The streams of the slots that are not a namespace's or a pool's.
const FIXED_STREAMS: &[&str] = &["allot:{allot-sessions}:feed", "allot:{allot-apps}:feed", "allot:{allot-runs}:feed"];

/// Copies marked streams into the log, and every stream each [`SWEEP_EVERY`]; every stream at
/// once at start and after a subscription is made again (events a daemon killed left in the
/// streams, whose messages nobody heard, come now, not at the next sweep).
///
/// Streams are copied in turns of one page each: a stream that never empties (a namespace under
/// full load) takes one page per turn, and a quiet stream marked meanwhile (the applications')
/// waits one turn, not until the busy one is empty.
pub(crate) async fn run_copier(inner: Arc<Inner>) {
    let mut sweep = tokio::time::interval(SWEEP_EVERY);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Some stream had more than a page: the next turn starts at once.
    let mut more = false;
    loop {
        if inner.feed.copy_all_wanted.swap(false, std::sync::atomic::Ordering::SeqCst) {
            if let Err(err) = list_streams(&inner).await {
                tracing::debug!(error = %err, "feed: cannot list the streams; trying again");
                inner.feed.copy_all_wanted.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            let streams = every_stream(&inner);
            inner.feed.dirty.lock().unwrap_or_else(|p| p.into_inner()).extend(streams);
        } else {
            tokio::select! {
                biased;
                _ = sweep.tick() => {
                    let streams = every_stream(&inner);
                    inner.feed.dirty.lock().unwrap_or_else(|p| p.into_inner()).extend(streams);
                    if let Err(err) = retain(&inner).await {
                        tracing::debug!(error = %err, "feed: cannot trim the log; trying at the next sweep");
                    }
                }
                () = std::future::ready(()), if more => {}
                _ = inner.feed.copy_wanted.notified() => {}
            }
        }
        let dirty = std::mem::take(&mut *inner.feed.dirty.lock().unwrap_or_else(|p| p.into_inner()));
        let left = std::sync::atomic::AtomicBool::new(false);
        stream::iter(dirty)
            .for_each_concurrent(8, |source| {
                let (inner, left) = (&inner, &left);
                async move {
                    match copy(inner, &source).await {
                        Ok(Copied::All) => {}
                        Ok(Copied::More) => {
                            left.store(true, std::sync::atomic::Ordering::Relaxed);
                            inner.feed.dirty.lock().unwrap_or_else(|p| p.into_inner()).insert(source);
                        }
                        // Tried again when marked, or at the next sweep.
                        Err(err) => {
                            tracing::debug!(stream = %source, error = %err, "feed: copy failed; trying again");
                            inner.feed.dirty.lock().unwrap_or_else(|p| p.into_inner()).insert(source);
                        }
                    }
                }
            })
            .await;
        more = left.into_inner();
    }
}

/// What a turn of [`copy`] left in its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Copied {
    All,
    More,
}

/// Copies every stream into the log now: at open, before this daemon serves, so that events a
/// daemon killed left in the streams (their messages heard by nobody) take their revisions
/// before any change this daemon makes, not at the next sweep after them.
pub(crate) async fn copy_every_stream(inner: &Inner) -> Result<(), StoreError> {
    // A log that no primary has given a revision yet notes this one: a replica promoted without
    // its first copies then starts above them (`fresh_floor`), not at 1 again. Best effort: a
    // primary short of the replicas required refuses it, and the daemon starts all the same.
    if let Err(err) = feed_call(inner, FEED_SLOT, &["note"]).await {
        tracing::debug!(error = %err, "cannot note this primary in the feed's log");
    }
    list_streams(inner).await?;
    let results: Vec<Result<(), StoreError>> = stream::iter(every_stream(inner))
        .map(|source| async move {
            while copy(inner, &source).await? == Copied::More {}
            Ok(())
        })
        .buffer_unordered(8)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Reads the namespaces and pools listed now into `Inner::listed` (as the sweeper does each
/// second).
async fn list_streams(inner: &Inner) -> Result<(), StoreError> {
    let (namespaces, pools) = (registry::namespaces(inner).await?, registry::pools(inner).await?);
    *inner.listed.lock().unwrap_or_else(|p| p.into_inner()) =
        crate::store::Listed { namespaces: namespaces.into(), pools: pools.into() };
    Ok(())
}

/// Every stream that may hold events: those of the namespaces and pools the sweeper last listed.
fn every_stream(inner: &Inner) -> Vec<String> {
    let listed = inner.listed.lock().unwrap_or_else(|p| p.into_inner());
    let mut streams: Vec<String> = FIXED_STREAMS.iter().map(|s| (*s).to_owned()).collect();
    streams.extend(listed.namespaces.iter().map(|n| format!("{}:feed", prefix(n))));
    streams.extend(listed.pools.iter().map(|p| format!("{}:feed", pools::prefix(p))));
    streams
}

/// Copies a page of what `source` holds into the log; says whether more is left.
async fn copy(inner: &Inner, source: &str) -> Result<Copied, StoreError> {
    loop {
        let cursor = match cursor_of(inner, source) {
            Some(cursor) => cursor,
            None => {
                let value = query(inner, redis::cmd("HGET").arg(CURSORS).arg(source)).await?;
                let cursor = into_text(value).unwrap_or_else(|_| "0-0".to_owned());
                set_cursor(inner, source, &cursor);
                cursor
            }
        };
        let value =
            query(inner, redis::cmd("XRANGE").arg(source).arg(format!("({cursor}")).arg("+").arg("COUNT").arg(PAGE))
                .await?;
        let entries = entries(value)?;
        let Some((last, _)) = entries.last() else { return Ok(Copied::All) };
        let last = last.clone();
        let mut args: Vec<String> = vec![
            "copy".into(),
            source.to_owned(),
            cursor.clone(),
            last.clone(),
            inner.feed.config.retain_events.to_string(),
            inner.feed.config.retain_for.as_millis().to_string(),
        ];
        for (_, fields) in entries {
            let mut fields = fields.into_iter();
            let (Some(t), Some(at)) = (fields.next(), fields.next()) else { continue };
            if t != "t" {
                return Err(corrupt(format!("feed entry of {source} starts with `{t}`")));
            }
            while let (Some(kind), Some(value)) = (fields.next(), fields.next()) {
                args.extend([at.clone(), kind, value]);
            }
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut reply = feed_call(inner, FEED_SLOT, &args).await?;
        match reply.text()?.as_str() {
            "copied" => {
                set_cursor(inner, source, &last);
                let publish = redis::cmd("PUBLISH").arg(LOG_CHANNEL).arg(reply.uint()?).to_owned();
                if let Err(err) = inner.feed_conn.query(&publish).await {
                    tracing::debug!(error = %err, "feed: cannot tell the daemons the log grew");
                }
                inner.feed.read_wanted.notify_one();
                // A trim is idempotent and needs no replicas: it goes as a call that may be sent
                // again, on the connection of the slot's own calls.
                let mut left = inner.eval(&inner.scripts.feed, source, &["trim", &last], false).await?;
                return Ok(if left.uint()? == 0 { Copied::All } else { Copied::More });
            }
            // Another daemon copied them: go on from where it left the cursor.
            "moved" => set_cursor(inner, source, &reply.text()?),
            other => return Err(corrupt(format!("feed copy answer `{other}`"))),
        }
    }
}

/// Drops from the log what retention no longer keeps, as each copy does: called each sweep, so
/// that events older than `retain_for` go while nothing is copied too. This daemon's feed then
/// keeps no more than the log does.
async fn retain(inner: &Inner) -> Result<(), StoreError> {
    let (keep, ms) =
        (inner.feed.config.retain_events.to_string(), inner.feed.config.retain_for.as_millis().to_string());
    let mut reply = feed_call(inner, FEED_SLOT, &["retain", &keep, &ms]).await?;
    match reply.text()?.as_str() {
        "retained" => {
            inner.feed.feed.forget_through(reply.uint()?);
            Ok(())
        }
        other => Err(corrupt(format!("feed retain answer `{other}`"))),
    }
}

fn cursor_of(inner: &Inner, source: &str) -> Option<String> {
    inner.feed.cursors.lock().unwrap_or_else(|p| p.into_inner()).get(source).cloned()
}

fn set_cursor(inner: &Inner, source: &str, cursor: &str) {
    inner.feed.cursors.lock().unwrap_or_else(|p| p.into_inner()).insert(source.to_owned(), cursor.to_owned());
}

async fn query(inner: &Inner, cmd: &redis::Cmd) -> Result<Value, StoreError> {
    inner.feed_conn.query(cmd).await.map_err(|e| redis_error(e, false))
}

/// Calls `lua/feed.lua` on the feed's own connection (a change: a copy, a trim).
async fn feed_call(inner: &Inner, key: &str, args: &[&str]) -> Result<Reply, StoreError> {
    let library = &inner.scripts.library;
    match inner.feed_conn.fcall(library, &inner.scripts.feed, key, args, true).await {
        Ok(value) => Reply::new(value),
        Err(err) => Err(call_error(err, true)),
    }
}

/// The entries of an `XRANGE` answer: id, and fields and values in order.
fn entries(value: Value) -> Result<Vec<(String, Vec<String>)>, StoreError> {
    let Value::Array(items) = value else { return Err(corrupt(format!("XRANGE answered {value:?}"))) };
    items
        .into_iter()
        .map(|item| {
            let Value::Array(pair) = item else { return Err(corrupt("a stream entry is not a pair")) };
            let [id, Value::Array(fields)] = <[Value; 2]>::try_from(pair).map_err(|_| corrupt("a stream entry"))?
            else {
                return Err(corrupt("a stream entry's fields"));
            };
            let id = into_text(id).map_err(|_| corrupt("a stream entry's id"))?;
            let fields: Result<Vec<String>, _> =
                fields.into_iter().map(|f| into_text(f).map_err(|_| corrupt("a stream field"))).collect();
            Ok((id, fields?))
        })
        .collect()
}

/// Reads every event the log keeps into the feed (at open).
pub(crate) async fn load(inner: &Inner) -> Result<(), StoreError> {
    let meta = query(inner, redis::cmd("HMGET").arg(META).arg("rev").arg("compacted")).await?;
    let (rev, compacted) = match &meta {
        Value::Array(v) if v.len() == 2 => {
            let number = |v: &Value| into_text(v.clone()).ok().and_then(|t| t.parse::<u64>().ok()).unwrap_or(0);
            (number(&v[0]), number(&v[1]))
        }
        other => return Err(corrupt(format!("feed meta {other:?}"))),
    };
    inner.feed.feed.skip_to(compacted);
    read(inner).await?;
    tracing::debug!(rev, compacted, kept = inner.feed.feed.kept().0, "feed loaded");
    Ok(())
}

/// Reads the log from this daemon's last revision when told it grew, and every [`READ_EVERY`].
pub(crate) async fn run_reader(inner: Arc<Inner>) {
    loop {
        tokio::select! {
            _ = inner.feed.read_wanted.notified() => {}
            _ = tokio::time::sleep(READ_EVERY) => {}
        }
        if let Err(err) = read(&inner).await {
            tracing::debug!(error = %err, "feed: cannot read the log");
        }
    }
}

/// Publishes what the log holds after this daemon's last revision.
async fn read(inner: &Inner) -> Result<(), StoreError> {
    loop {
        let last = inner.feed.feed.revision();
        let value =
            query(inner, redis::cmd("XRANGE").arg(LOG).arg(format!("(0-{last}")).arg("+").arg("COUNT").arg(PAGE))
                .await?;
        let entries = entries(value)?;
        let full = entries.len() == PAGE;
        let mut events = Vec::with_capacity(entries.len());
        let mut now = 0;
        let mut previous = last;
        for (id, fields) in entries {
            let revision = id.strip_prefix("0-").and_then(|r| r.parse::<u64>().ok());
            let Some(revision) = revision else { return Err(corrupt(format!("log entry id {id}"))) };
            // Revisions in the log are dense: a gap is events trimmed before this daemon read
            // them. Its watchers start over after them.
            if revision > previous + 1 {
                tracing::warn!(last = previous, revision, "the feed's log dropped events this daemon had not read");
                inner.feed.feed.publish(std::mem::take(&mut events), now);
                inner.feed.feed.skip_to(revision - 1);
            }
            previous = revision;
            match event(revision, &fields) {
                Ok(event) => {
                    now = now.max(event.at);
                    events.push(event);
                }
                Err(err) => {
                    tracing::warn!(revision, error = %err, "feed: an event that cannot be read is passed over");
                }
            }
        }
        if !events.is_empty() {
            inner.feed.feed.publish(events, now);
        }
        if !full {
            return Ok(());
        }
    }
}

/// The field `name` of a log entry.
fn field<'a>(fields: &'a [String], name: &str) -> Result<&'a str, StoreError> {
    fields
        .chunks(2)
        .find(|pair| pair[0] == name)
        .and_then(|pair| pair.get(1))
        .map(String::as_str)
        .ok_or_else(|| corrupt(format!("log entry without `{name}`")))
}

/// Which slot a stream is of.
enum Slot {
    Namespace(NamespaceName),
    Pool(PoolName),
    Sessions,
    Apps,
    Runs,
}

fn slot_of(stream: &str) -> Result<Slot, StoreError> {
    let bad = || corrupt(format!("feed stream `{stream}`"));
    let key = stream.strip_suffix(":feed").ok_or_else(bad)?;
    Ok(match key {
        "allot:{allot-sessions}" => Slot::Sessions,
        "allot:{allot-apps}" => Slot::Apps,
        "allot:{allot-runs}" => Slot::Runs,
        _ => match key.strip_prefix("allot:pool:") {
            Some(tag) => Slot::Pool(PoolName::new(&unescape_tag(tag).ok_or_else(bad)?).map_err(corrupt)?),
            None => {
                let tag = key.strip_prefix("allot:").ok_or_else(bad)?;
                Slot::Namespace(NamespaceName::new(&unescape_tag(tag).ok_or_else(bad)?).map_err(corrupt)?)
            }
        },
    })
}

/// Reads one event of the log.
fn event(revision: u64, fields: &[String]) -> Result<Event, StoreError> {
    let slot = slot_of(field(fields, "s")?)?;
    let at: u64 = field(fields, "t")?.parse().map_err(|_| corrupt("an event's time"))?;
    let kind_name = field(fields, "k")?;
    let kind = EventKind::parse(kind_name).ok_or_else(|| corrupt(format!("event kind `{kind_name}`")))?;
    let mut parts = field(fields, "v")?.splitn(3, '\n');
    let (id, cause, object) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let mut cause = (!cause.is_empty()).then(|| cause.to_owned());
    let (key, object) = match (&slot, kind) {
        (Slot::Namespace(ns), EventKind::NamespacePut) => {
            let numbers = object
                .split(',')
                .map(|n| n.parse::<i64>().map(Value::Int).map_err(|_| corrupt("a namespace view")))
                .collect::<Result<Vec<_>, _>>()?;
            (keys::namespace(ns), EventObject::Namespace(reply::view(ns, &mut Reply::new(Value::Array(numbers))?)?))
        }
        (Slot::Namespace(ns), EventKind::NamespaceRemoved) => (keys::namespace(ns), EventObject::Gone),
        (
            Slot::Namespace(ns),
            EventKind::GrantGranted
            | EventKind::GrantRenewed
            | EventKind::GrantReleased
            | EventKind::GrantExpired
            | EventKind::GrantSessionClosed,
        ) => {
            let (expires_in, record) = object.split_once('\n').ok_or_else(|| corrupt("a grant event"))?;
            let grant = reply::grant(ns, id, record)?;
            let expires_in_ms = expires_in.parse::<i64>().ok().and_then(|n| u64::try_from(n).ok());
            (keys::grant(ns.as_str(), id), EventObject::Grant(GrantInfo { grant, expires_in_ms }))
        }
        (Slot::Namespace(ns), EventKind::WaiterQueued | EventKind::WaiterAdmitted | EventKind::WaiterGaveUp) => {
            let token = Token::new(id).map_err(corrupt)?;
            (keys::waiter(ns, id), EventObject::Waiter { namespace: ns.clone(), token })
        }
        (Slot::Sessions, EventKind::SessionOpened | EventKind::SessionRenewed) => {
            let session = SessionId::parse(id).map_err(corrupt)?;
            // `ttl\ndeadline`, then `\nowner` since sessions have one ('' when unknown).
            let mut fields = object.splitn(3, '\n');
            let mut number =
                || fields.next().and_then(|t| t.parse::<u64>().ok()).ok_or_else(|| corrupt("a session event"));
            let (ttl_ms, deadline) = (number()?, number()?);
            let owner = fields.next().filter(|owner| !owner.is_empty()).map(str::to_owned);
            let info = SessionInfo {
                session: Session { id: session, ttl_ms, deadline, grants: Default::default(), owner },
                expires_in_ms: deadline.saturating_sub(at),
            };
            (keys::session(id), EventObject::Session(info))
        }
        (Slot::Sessions, EventKind::SessionClosed | EventKind::SessionExpired) => {
            (keys::session(id), EventObject::Gone)
        }
        (Slot::Pool(pool), EventKind::PoolPut) => {
            let fields = object.split('\n').map(|f| Value::BulkString(f.as_bytes().to_vec())).collect();
            (
                keys::pool(pool),
                EventObject::Pool(Box::new(pools::view_of(pool, &mut Reply::new(Value::Array(fields))?)?)),
            )
        }
        (Slot::Pool(pool), EventKind::PoolRemoved) => (keys::pool(pool), EventObject::Gone),
        (
            Slot::Pool(pool),
            EventKind::AllocMade | EventKind::AllocRenewed | EventKind::AllocAnnotated | EventKind::AllocEnded,
        ) => {
            let object = match pools::record(pool, id, object)? {
                allot_core::pools::AllocState::Live(alloc) => EventObject::Alloc(alloc),
                allot_core::pools::AllocState::Ended(ended) => EventObject::EndedAlloc(ended),
            };
            (keys::alloc(pool, id), object)
        }
        (Slot::Apps, EventKind::QueuePut) => {
            let record: QueueRecord = serde_json::from_str(object).map_err(corrupt)?;
            let (path, limits) = record.into_queue(id).map_err(corrupt)?;
            // The record holds the limits; what the queue holds is the scheduler's to count (read
            // the queue for it).
            let view = allot_core::apps::QueueView {
                path,
                limits,
                usage: Default::default(),
                leaf: false,
                apps: 0,
                pending_tasks: 0,
                waiting: Default::default(),
            };
            (keys::queue(id), EventObject::Queue(Box::new(view)))
        }
        (Slot::Apps, EventKind::QueueRemoved) => (keys::queue(id), EventObject::Gone),
        (Slot::Apps, EventKind::AppChanged) => {
            let record: AppRecord = serde_json::from_str(object).map_err(corrupt)?;
            (keys::app(id), EventObject::App(Box::new(record.into_app(id).map_err(corrupt)?)))
        }
        (Slot::Apps, EventKind::AppRemoved) => (keys::app(id), EventObject::Gone),
        (Slot::Apps, EventKind::TaskChanged | EventKind::TaskRemoved) => {
            let (app, task) = id.split_once('/').ok_or_else(|| corrupt(format!("task `{id}`")))?;
            if kind == EventKind::TaskRemoved {
                (keys::task(app, task), EventObject::Gone)
            } else {
                let record: TaskRecord = serde_json::from_str(object).map_err(corrupt)?;
                let task_ = record.into_task(app, task).map_err(corrupt)?;
                cause = task_.reason.clone();
                (keys::task(app, task), EventObject::Task(Box::new(task_)))
            }
        }
        (Slot::Runs, EventKind::RunChanged | EventKind::RunRemoved) => {
            let (app, task) = id.split_once('/').ok_or_else(|| corrupt(format!("run `{id}`")))?;
            AppId::new(app).map_err(corrupt)?;
            if kind == EventKind::RunRemoved {
                (keys::run(app, task), EventObject::Gone)
            } else {
                (keys::run(app, task), EventObject::Run(Box::new(crate::runs::decode(id, object.as_bytes())?)))
            }
        }
        _ => return Err(corrupt(format!("event kind `{kind_name}` from another slot's stream"))),
    };
    Ok(Event { revision, kind, key, cause, at, object })
}
