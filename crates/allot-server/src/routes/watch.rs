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

use std::convert::Infallible;
use std::time::Duration;

use allot_api as api;
use allot_core::watch::{EventKind, Filter};
use allot_store::{WatchError, Watcher};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::sse::{Event as Message, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;

use crate::convert::watch as convert;
use crate::error::{ApiError, ErrorCode};
use crate::extract::QueryArgs;
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
        WatchError::Compacted { since, oldest } => ApiError::of(
            ErrorCode::RevisionCompacted,
            format!(
                "the events after revision {since} are no longer kept: the oldest revision a watch can start \
                 after is {oldest}. List again, then watch from the list's revision (its Allot-Revision header)"
            ),
        ),
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
    headers: HeaderMap,
    QueryArgs(pairs): QueryArgs<Vec<(String, String)>>,
) -> Result<Response, ApiError> {
    let request = WatchRequest::read(&pairs, headers.get(LAST_EVENT_ID))?;
    let watcher = state.store.watch(request.filter, request.since).map_err(refused)?;
    let start = watcher.revision();
    let stream =
        Streaming { watcher, heartbeat: state.heartbeat, sent: start, ended: false, _open: state.metrics.watching() };
    let mut response = Sse::new(stream.messages()).into_response();
    let headers = response.headers_mut();
    headers.insert(REVISION, HeaderValue::from(start));
    // Proxies that buffer answers (nginx) would hold the events back.
    headers.insert(HeaderName::from_static("x-accel-buffering"), HeaderValue::from_static("no"));
    Ok(response)
}

/// One open stream.
struct Streaming {
    watcher: Watcher,
    heartbeat: Duration,
    /// The last revision the client was given as an `id`.
    sent: u64,
    /// The last message was sent; the stream ends.
    ended: bool,
    _open: Watching,
}

impl Streaming {
    fn messages(self) -> impl Stream<Item = Result<Message, Infallible>> + Send {
        futures_util::stream::unfold(self, |mut stream| async move {
            let message = stream.next().await?;
            Some((Ok(message), stream))
        })
    }

    /// The next message; `None` ends the stream.
    async fn next(&mut self) -> Option<Message> {
        if self.ended {
            return None;
        }
        // `Watcher::next` is cancel-safe: a heartbeat loses no event.
        let next = match tokio::time::timeout(self.heartbeat, self.watcher.next()).await {
            Err(_silent) => {
                let heartbeat = Message::default().comment("heartbeat");
                let passed = self.watcher.revision();
                if passed <= self.sent {
                    return Some(heartbeat);
                }
                self.sent = passed;
                return Some(heartbeat.id(passed.to_string()));
            }
            Ok(next) => next,
        };
        match next {
            Ok(event) => {
                self.sent = event.revision;
                let data = serde_json::to_string(&convert::event(&event)).ok()?;
                Some(Message::default().id(event.revision.to_string()).event(event.kind.name()).data(data))
            }
            Err(WatchError::Behind { resume, buffer }) => {
                self.ended = true;
                let behind = api::WatchBehind {
                    resume,
                    buffer: buffer as u64,
                    message: format!(
                        "this watcher fell behind by more than {buffer} events and is ended; watch again after \
                         revision {resume} (since={resume}, or Last-Event-ID) and nothing is missed"
                    ),
                };
                let data = serde_json::to_string(&behind).ok()?;
                Some(Message::default().id(resume.to_string()).event("behind").data(data))
            }
            // The store shuts down.
            Err(_) => None,
        }
    }
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
    use super::*;

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
