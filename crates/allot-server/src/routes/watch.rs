//! The change feed over HTTP: `GET /v1/watch` as Server-Sent Events, and the revision every read
//! reflects (the `Allot-Revision` header), so that "list, then watch from the list's revision"
//! misses nothing.
//!
//! A stream's messages: each event as `id: <revision>`, `event: <kind>`, `data: <WatchEvent JSON>`;
//! after a silence of the daemon's heartbeat interval, `: heartbeat` (an SSE comment, with an
//! `id:` line when the watcher has passed revisions its filter did not take, so that a client
//! that reconnects with `Last-Event-ID` resumes from there and not from further back); a watcher
//! that falls behind gets `event: behind` (with `id:` the revision to resume after) and the stream
//! ends; it ends too when the daemon shuts down.
//!
//! The fan-out is kept cheap: an event's message is encoded once for every stream (`frames.rs`),
//! and a stream writes every event its watcher has ready as one chunk of the body (taken without
//! waiting, `Watcher::next` being cancel-safe), so a busy watcher costs a write per batch, not
//! per event. The body is a plain stream of those bytes (`text/event-stream`, `no-cache`).

use allot_core::access::Permission;

use crate::access::{self, Who};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use allot_api as api;
use allot_core::watch::{EventKind, Filter};
use allot_store::{Event, WatchError, Watcher};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use futures_util::{FutureExt as _, Stream};
use tokio::time::{Instant, Sleep};

use crate::error::{ApiError, ErrorCode};
use crate::extract::QueryArgs;
use crate::frames::{self, Frames};
use crate::metrics::Watching;
use crate::ServerState;

/// The revision a read reflects (on every `GET` under `/v1/`), and the one a watch starts after.
pub(crate) const REVISION: HeaderName = HeaderName::from_static("allot-revision");
/// The revision an `EventSource` (or any client) resumes after on reconnect.
const LAST_EVENT_ID: HeaderName = HeaderName::from_static("last-event-id");

/// What a watch asks for.
#[derive(Debug, PartialEq, Eq)]
struct WatchRequest {
    filter: Filter,
    since: Option<u64>,
}

impl WatchRequest {
    /// From the query's pairs (`kind` and `prefix` repeated, kinds also `,`-separated) and the
    /// `Last-Event-ID` header, which wins over `since`.
    fn read(pairs: &[(String, String)], last_event_id: Option<&HeaderValue>) -> Result<WatchRequest, ApiError> {
        let mut request = WatchRequest { filter: Filter::default(), since: None };
        for (name, value) in pairs {
            match name.as_str() {
                "kind" => {
                    for name in value.split(',').map(str::trim).filter(|name| !name.is_empty()) {
                        let kind = EventKind::parse(name).ok_or_else(|| unknown_kind(name))?;
                        if !request.filter.kinds.contains(&kind) {
                            request.filter.kinds.push(kind);
                        }
                    }
                }
                "prefix" => request.filter.prefixes.push(value.clone()),
                "since" => request.since = Some(revision(value, "since")?),
                other => {
                    return Err(ApiError::invalid_argument(format!(
                        "unknown query parameter `{other}`: a watch takes kind, prefix and since"
                    )))
                }
            }
        }
        if let Some(header) = last_event_id {
            let text = header
                .to_str()
                .map_err(|_| ApiError::invalid_argument("the Last-Event-ID header must be a revision"))?;
            request.since = Some(revision(text, "the Last-Event-ID header")?);
        }
        Ok(request)
    }
}

fn revision(text: &str, what: &str) -> Result<u64, ApiError> {
    text.trim().parse().map_err(|_| {
        ApiError::invalid_argument(format!("{what} must be a revision (a whole number, 0 or more), got `{text}`"))
    })
}

fn unknown_kind(name: &str) -> ApiError {
    let kinds: Vec<&str> = EventKind::ALL.iter().map(|kind| kind.name()).collect();
    ApiError::invalid_argument(format!("unknown kind `{name}`; the kinds are: {}", kinds.join(", ")))
}

/// Why a watch cannot start, as an answer.
fn refused(err: WatchError) -> ApiError {
    let message = err.to_string();
    match err {
        WatchError::Compacted { since, oldest } => ApiError {
            compact_revision: Some(oldest),
            ..ApiError::of(
                ErrorCode::RevisionCompacted,
                format!(
                    "the events after revision {since} are no longer kept: the oldest revision a watch can start \
                     after is {oldest}. List again, then watch from the list's revision (its Allot-Revision header)"
                ),
            )
        },
        // The same answer as a revision no longer kept: the caller lists again.
        WatchError::Ahead { since, newest } => ApiError {
            compact_revision: Some(newest),
            ..ApiError::of(
                ErrorCode::RevisionCompacted,
                format!(
                    "revision {since} was never given by this daemon's store (its newest is {newest}; a store restored \
                     from a snapshot starts above the snapshot's revision, not above what came after it). List again, \
                     then watch from the list's revision (its Allot-Revision header)"
                ),
            )
        },
        WatchError::Unsupported { .. } => ApiError::of(ErrorCode::WatchUnsupported, message),
        WatchError::Closed => ApiError::of(ErrorCode::ShuttingDown, message),
        // Not an answer to a watch that starts; retry.
        WatchError::Behind { .. } => ApiError::of(ErrorCode::StoreUnavailable, message),
    }
}

/// Every change after a revision (or from now), as Server-Sent Events.
#[utoipa::path(get, path = "/v1/watch", tag = "watch",
    params(
        ("kind" = Option<Vec<String>>, Query, explode, description = "Kinds of change to send (repeat the parameter, or \
            separate kinds with `,`); none: every kind"),
        ("prefix" = Option<Vec<String>>, Query, explode, description = "Keys to send changes of (repeat for several): a \
            key equal to a prefix or going on from it after `/`, `:` or `.`, e.g. `namespaces/hive` (the namespace, \
            those under it, their grants and waiters), `pools/p`, `queues/root.a` (the subtree), `apps/etl`; none: \
            every key"),
        ("since" = Option<u64>, Query, description = "Send the changes after this revision (from the `Allot-Revision` \
            header of a list, or the last event's `id`); none: from now. `Last-Event-ID` wins over it"),
        ("Last-Event-ID" = Option<u64>, Header, description = "Sent by a reconnecting `EventSource`: resume after \
            this revision"),
    ),
    responses(
        (status = 200, content_type = "text/event-stream", body = api::WatchEvent, description = "Server-Sent \
            Events, one message per change in commit order: `id: <revision>`, `event: <kind>`, `data: <WatchEvent \
            JSON>`. A silent stream sends `: heartbeat` comments (with an `id:` line when it has passed revisions \
            that its filter did not take). A watcher that falls behind gets a last message `event: behind` whose \
            data is a WatchBehind naming the revision to resume after (its `id`); the stream also ends when the \
            daemon shuts down. The `Allot-Revision` header is the revision the stream starts after."),
        (status = 400, body = api::ErrorBody, description = "invalid_argument: an unknown kind (the message lists \
            them), a revision that is not a number, an unknown parameter"),
        (status = 410, body = api::ErrorBody, description = "revision_compacted: the events after `since` are no \
            longer kept; the message names the oldest revision a watch can start after"),
        (status = 501, body = api::ErrorBody, description = "watch_unsupported: this daemon's store has no change \
            feed"),
        (status = 503, body = api::ErrorBody, description = "shutting_down"),
    ))]
pub(crate) async fn watch(
    State(state): State<ServerState>,
    who: Who,
    held: Option<axum::Extension<access::HeldToken>>,
    caller: Option<axum::Extension<access::Caller>>,
    headers: HeaderMap,
    QueryArgs(pairs): QueryArgs<Vec<(String, String)>>,
) -> Result<Response, ApiError> {
    let request = WatchRequest::read(&pairs, headers.get(LAST_EVENT_ID))?;
    let watched = access::watched(&request.filter);
    for resource in &watched {
        who.check(Permission::Read, resource.clone())?;
    }
    let watcher = state.store.watch(request.filter, request.since).map_err(refused)?;
    let start = watcher.revision();
    let stream = Streaming::new(watcher, state.frames.clone(), state.heartbeat, state.metrics.watching());
    // The stream ends when the token it was opened with is revoked or expires, or its caller may
    // no longer read what it watches (within a second).
    let still = move |policy: &allot_core::access::Policy, principal: &allot_core::access::Principal| {
        watched.iter().try_for_each(|resource| policy.check(principal, Permission::Read, resource.clone()))
    };
    let ended = access::withdrawn(state.access.clone(), caller.map(|c| c.0), held.map(|e| e.0), still);
    let mut response =
        Response::new(Body::from_stream(futures_util::StreamExt::take_until(stream.chunks(), Box::pin(ended))));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(REVISION, HeaderValue::from(start));
    // Proxies that buffer answers (nginx) would hold the events back.
    headers.insert(HeaderName::from_static("x-accel-buffering"), HeaderValue::from_static("no"));
    Ok(response)
}

/// The most events written in one chunk of the body.
const MAX_CHUNK_EVENTS: usize = 256;

/// A heartbeat that carries no revision.
const HEARTBEAT: &[u8] = b": heartbeat\n\n";

/// One open stream: the body is written a chunk at a time, each chunk every event the watcher has
/// ready (up to [`MAX_CHUNK_EVENTS`]), their frames encoded once for every stream ([`Frames`]).
struct Streaming {
    watcher: Watcher,
    frames: frames::Reader,
    heartbeat: Duration,
    /// When the last chunk was written.
    written: Instant,
    /// Fires `heartbeat` after a chunk was written, or later: armed again when it fires, if a
    /// chunk was written since (cheaper than putting it off at every chunk).
    silence: Pin<Box<Sleep>>,
    /// The last revision the client was given as an `id`.
    sent: u64,
    /// The last message was sent; the stream ends.
    ended: bool,
    /// The events of the chunk being made, and their frames (kept to reuse their memory).
    ready: Vec<Arc<Event>>,
    chunk: Vec<Bytes>,
    _open: Watching,
}

impl Streaming {
    fn new(watcher: Watcher, frames: Arc<Frames>, heartbeat: Duration, open: Watching) -> Streaming {
        let sent = watcher.revision();
        Streaming {
            watcher,
            frames: frames.reader(),
            heartbeat,
            written: Instant::now(),
            silence: Box::pin(tokio::time::sleep(heartbeat)),
            sent,
            ended: false,
            ready: Vec::new(),
            chunk: Vec::new(),
            _open: open,
        }
    }

    fn chunks(self) -> impl Stream<Item = Result<Bytes, Infallible>> + Send {
        futures_util::stream::unfold(self, |mut stream| async move {
            let chunk = stream.next().await?;
            Some((Ok(chunk), stream))
        })
    }

    /// The next chunk of the body; `None` ends the stream.
    async fn next(&mut self) -> Option<Bytes> {
        if self.ended {
            return None;
        }
        // `Watcher::next` is cancel-safe: a heartbeat, or a watcher found with nothing ready, loses
        // no event. What is ready is taken without a timer.
        let first = match self.watcher.next().now_or_never() {
            Some(next) => next,
            None => loop {
                tokio::select! {
                    biased;
                    next = self.watcher.next() => break next,
                    () = self.silence.as_mut() => {}
                }
                let due = self.written + self.heartbeat;
                if Instant::now() < due {
                    self.silence.as_mut().reset(due);
                    continue;
                }
                return Some(self.heartbeat());
            },
        };
        let mut end = match first {
            Ok(event) => {
                self.ready.push(event);
                None
            }
            Err(err) => Some(err),
        };
        // Outside tokio's budget of operations per task: it would cut a chunk after 128 events
        // (the chunk is bounded anyway).
        while end.is_none() && self.ready.len() < MAX_CHUNK_EVENTS {
            match tokio::task::unconstrained(self.watcher.next()).now_or_never() {
                Some(Ok(event)) => self.ready.push(event),
                Some(Err(err)) => end = Some(err),
                None => break,
            }
        }
        if let Some(last) = self.ready.last() {
            self.sent = last.revision;
        }
        // The frames go into `body` (this stream alone) or `chunk` (shared with others).
        let mut body = Vec::new();
        self.frames.write(&self.ready, &mut self.chunk, &mut body);
        self.ready.clear();
        if let Some(err) = end {
            self.ended = true;
            // Otherwise the store shuts down: the stream ends after what was published.
            if let WatchError::Behind { resume, buffer } = err {
                self.chunk.push(behind(resume, buffer));
            }
        }
        self.written = Instant::now();
        // One shared frame goes as it is; else every frame, one after the other.
        if body.is_empty() && self.chunk.len() <= 1 {
            return self.chunk.pop();
        }
        body.reserve(self.chunk.iter().map(Bytes::len).sum());
        for frame in self.chunk.drain(..) {
            body.extend_from_slice(&frame);
        }
        Some(Bytes::from(body))
    }

    /// `: heartbeat`, with an `id:` when the watcher has passed revisions its filter did not take.
    fn heartbeat(&mut self) -> Bytes {
        self.written = Instant::now();
        self.silence.as_mut().reset(self.written + self.heartbeat);
        let passed = self.watcher.revision();
        if passed <= self.sent {
            return Bytes::from_static(HEARTBEAT);
        }
        self.sent = passed;
        Bytes::from(format!(": heartbeat\nid: {passed}\n\n"))
    }
}

/// The last message of a watcher that fell behind: where to resume.
fn behind(resume: u64, buffer: usize) -> Bytes {
    let behind = api::WatchBehind {
        resume,
        buffer: buffer as u64,
        message: format!(
            "this watcher fell behind by more than {buffer} events and is ended; watch again after revision \
             {resume} (since={resume}, or Last-Event-ID) and nothing is missed"
        ),
    };
    let mut frame = format!("id: {resume}\nevent: behind\ndata: ").into_bytes();
    // The JSON of a wire type is always made.
    let _ = serde_json::to_writer(&mut frame, &behind);
    frame.extend_from_slice(b"\n\n");
    Bytes::from(frame)
}

/// Middleware: every `GET` under `/v1/` answers with the revision it reflects (`Allot-Revision`).
///
/// The rule that makes "list, then watch from that revision" miss nothing: the revision is read
/// *before* the store is, so every change after it is either already in what the handler reads
/// or still to come in the feed after it. (A change committed between the two reads is then both
/// in the list and in the watch: it may be seen twice, never missed.) A watch stream sets its own:
/// the revision it starts after.
pub(crate) async fn stamp_revision(State(state): State<ServerState>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    if request.method() != Method::GET || !path.starts_with("/v1/") || path == "/v1/watch" {
        return next.run(request).await;
    }
    let revision = state.store.revision();
    let mut response = next.run(request).await;
    response.headers_mut().entry(REVISION).or_insert(HeaderValue::from(revision));
    response
}

#[cfg(test)]
mod tests {
    use allot_store::watch::Feed;
    use allot_store::{EventObject, WatchConfig};

    use super::*;
    use crate::metrics::Metrics;

    fn event(revision: u64) -> Event {
        let key = format!("pools/p{}", revision % 2);
        Event { revision, kind: EventKind::PoolRemoved, key, cause: None, at: 1, object: EventObject::Gone }
    }

    /// The body of `stream` until it has `messages` messages, chunk by chunk.
    async fn read(stream: &mut Streaming, messages: usize) -> Vec<Bytes> {
        let mut chunks = Vec::new();
        while chunks.iter().map(|chunk: &Bytes| chunk.windows(2).filter(|w| w == b"\n\n").count()).sum::<usize>()
            < messages
        {
            chunks.push(stream.next().await.expect("the stream goes on"));
        }
        chunks
    }

    #[tokio::test]
    async fn many_watchers_get_the_same_bytes_each_event_encoded_once_what_is_ready_in_one_chunk() {
        let feed = Feed::new(WatchConfig::default(), 0);
        let frames = Arc::new(Frames::default());
        let metrics = Metrics::default();
        let open = |filter: Filter| {
            let watcher = feed.subscribe(filter, None).unwrap();
            Streaming::new(watcher, frames.clone(), Duration::from_secs(60), metrics.watching())
        };
        let mut all: Vec<Streaming> = (0..100).map(|_| open(Filter::default())).collect();
        let mut odd = open(Filter { kinds: vec![], prefixes: vec!["pools/p1".into()] });
        feed.publish((1..=10).map(event), 0);

        let first = read(&mut all[0], 10).await;
        assert_eq!(first.len(), 1, "the ten events ready are one chunk");
        let expected: Vec<u8> = (1..=10).flat_map(|r| crate::frames::encode(&event(r)).to_vec()).collect();
        assert_eq!(first[0], expected);
        for stream in &mut all[1..] {
            assert_eq!(read(stream, 10).await, first);
        }
        let odd_bytes: Vec<u8> = (1..=10).step_by(2).flat_map(|r| crate::frames::encode(&event(r)).to_vec()).collect();
        assert_eq!(read(&mut odd, 5).await.concat(), odd_bytes);
        assert_eq!(frames.encoded(), 10, "each event encoded once for 101 streams");

        // One event ready: its frame is the chunk, shared, not copied.
        feed.publish([event(11)], 0);
        let (one, two) = all.split_at_mut(1);
        let (one, two) = (read(&mut one[0], 1).await, read(&mut two[0], 1).await);
        assert_eq!(one[0].as_ptr(), two[0].as_ptr());
        assert_eq!(frames.encoded(), 11);
    }

    /// A stream open alone writes its frames itself, the same bytes, and keeps none; once a
    /// second opens, they share the cache, and when it closes the first is alone again.
    #[tokio::test]
    async fn a_stream_alone_encodes_its_own_frames_the_same() {
        let feed = Feed::new(WatchConfig::default(), 0);
        let frames = Arc::new(Frames::default());
        let metrics = Metrics::default();
        let open = || {
            let watcher = feed.subscribe(Filter::default(), None).unwrap();
            Streaming::new(watcher, frames.clone(), Duration::from_secs(60), metrics.watching())
        };
        let bytes = |revisions: std::ops::RangeInclusive<u64>| -> Vec<u8> {
            revisions.flat_map(|r| crate::frames::encode(&event(r)).to_vec()).collect()
        };
        let mut alone = open();
        feed.publish((1..=3).map(event), 0);
        assert_eq!(read(&mut alone, 3).await.concat(), bytes(1..=3));
        assert_eq!(frames.encoded(), 0, "nothing kept for a stream alone");

        let mut second = open();
        feed.publish((4..=5).map(event), 0);
        assert_eq!(read(&mut alone, 2).await.concat(), bytes(4..=5));
        assert_eq!(read(&mut second, 2).await.concat(), bytes(4..=5));
        assert_eq!(frames.encoded(), 2, "shared by two streams: encoded once");

        drop(second);
        feed.publish([event(6)], 0);
        assert_eq!(read(&mut alone, 1).await.concat(), bytes(6..=6));
        assert_eq!(frames.encoded(), 2);
    }

    #[tokio::test]
    async fn a_chunk_is_at_most_so_many_events_and_a_watcher_behind_gets_them_then_where_to_resume() {
        let buffer = MAX_CHUNK_EVENTS + 10;
        let feed = Feed::new(WatchConfig { buffer, ..WatchConfig::default() }, 0);
        let metrics = Metrics::default();
        let watcher = feed.subscribe(Filter::default(), None).unwrap();
        let mut stream = Streaming::new(watcher, Arc::default(), Duration::from_secs(60), metrics.watching());
        let events = buffer as u64 + 5;
        feed.publish((1..=events).map(event), 0);
        let first = stream.next().await.unwrap();
        assert_eq!(first.windows(2).filter(|w| w == b"\n\n").count(), MAX_CHUNK_EVENTS);
        let last = String::from_utf8(stream.next().await.unwrap().to_vec()).unwrap();
        let messages: Vec<&str> = last.split_terminator("\n\n").collect();
        assert_eq!(messages.len(), 11, "{last}");
        assert!(
            messages[10].starts_with(&format!("id: {buffer}\nevent: behind\ndata: {{\"resume\":{buffer},")),
            "{last}"
        );
        assert_eq!(stream.next().await, None, "the stream ends after it");
    }

    fn pairs(query: &[(&str, &str)]) -> Vec<(String, String)> {
        query.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned())).collect()
    }

    #[test]
    fn kinds_come_repeated_or_comma_separated_and_last_event_id_wins() {
        let query = pairs(&[
            ("kind", "grant.granted,grant.released"),
            ("kind", "pool.put"),
            ("kind", "grant.granted"),
            ("prefix", "pools/p"),
            ("prefix", "namespaces/hive"),
            ("since", "10"),
        ]);
        let read = WatchRequest::read(&query, None).unwrap();
        assert_eq!(read.filter.kinds, vec![EventKind::GrantGranted, EventKind::GrantReleased, EventKind::PoolPut]);
        assert_eq!(read.filter.prefixes, vec!["pools/p".to_owned(), "namespaces/hive".to_owned()]);
        assert_eq!(read.since, Some(10));
        let header = HeaderValue::from_static("42");
        assert_eq!(WatchRequest::read(&query, Some(&header)).unwrap().since, Some(42));
        assert_eq!(WatchRequest::read(&[], None).unwrap(), WatchRequest { filter: Filter::default(), since: None });
    }

    #[test]
    fn bad_input_is_refused_with_what_is_valid() {
        let unknown = WatchRequest::read(&pairs(&[("kind", "grant.granted,grant.nope")]), None).unwrap_err();
        assert_eq!(unknown.code, "invalid_argument");
        assert!(
            unknown.message.contains("grant.nope") && unknown.message.contains("run.removed"),
            "{}",
            unknown.message
        );
        for query in [&[("since", "-1")][..], &[("since", "x")], &[("cursor", "1")]] {
            assert_eq!(WatchRequest::read(&pairs(query), None).unwrap_err().code, "invalid_argument", "{query:?}");
        }
        let header = HeaderValue::from_static("soon");
        assert_eq!(WatchRequest::read(&[], Some(&header)).unwrap_err().code, "invalid_argument");
    }
}
