//! `GET /v1/watch`: every change after a revision, as a [`Stream`] that reconnects and resumes by
//! itself.
//!
//! The stream remembers where it is: the revision of the last event it delivered, or a later one
//! the daemon said the watcher had passed (a heartbeat's `id`, or the `Allot-Revision` a stream
//! starts after). A connection that is cut, goes silent for longer than [`WATCH_IDLE_TIMEOUT`]
//! (the daemon sends a heartbeat every 15 s), or ends is opened again with `Last-Event-ID` set to
//! it, so no event is missed or delivered twice. A watcher that fell behind is told where to
//! resume, and resumes there the same way. While the daemon cannot be reached (it restarts, 503),
//! the stream tries again with a growing pause, for at most [`Client::with_watch_reconnect`]'s
//! limit in a row; then it yields the error and ends.
//!
//! Errors that retrying cannot fix are yielded, and end the stream: `410 revision_compacted` (the
//! events after the revision are no longer kept: list again, then watch from the list's
//! revision; [`ClientError::code`] tells it), a bad filter (`400 invalid_argument`), a store with
//! no change feed (`501 watch_unsupported`). A daemon on the embedded store keeps its events
//! across a restart (or a crash), so the stream resumes across one too, with nothing missed;
//! only a watcher older than what it keeps gets `revision_compacted`.

use std::time::{Duration, Instant};

use allot_api::{WatchBehind, WatchEvent};
use futures_util::Stream;
use reqwest::{Method, Response};

use crate::error::decode_error;
use crate::sse;
use crate::{api_error, Client, ClientError};

/// A watch stream that receives nothing (not even a heartbeat) for this long is taken as cut and
/// opened again: three of the daemon's heartbeats.
pub const WATCH_IDLE_TIMEOUT: Duration = Duration::from_secs(45);
/// How long by default a watch stream keeps trying to reach a daemon it lost, in a row.
pub const DEFAULT_WATCH_RECONNECT: Duration = Duration::from_secs(60);
/// The first pause before trying again, doubled up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(50);
const MAX_PAUSE: Duration = Duration::from_secs(2);

/// Which changes a watch asks for: any of `kinds` (kind names such as `grant.granted`; none:
/// every kind) about a key under any of `prefixes` (e.g. `namespaces/hive`, `pools/p`,
/// `apps/etl`; none: every key).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchFilter {
    pub kinds: Vec<String>,
    pub prefixes: Vec<String>,
}

impl Client {
    /// Sets how long a watch stream keeps trying to reach the daemon again, in a row, before it
    /// yields the error and ends ([`DEFAULT_WATCH_RECONNECT`] by default).
    #[must_use]
    pub fn with_watch_reconnect(mut self, within: Duration) -> Client {
        self.watch_reconnect_for = within;
        self
    }

    /// `GET /v1/watch`: every change `filter` takes after revision `since`, in commit order,
    /// reconnecting and resuming by itself (see the module's documentation). An `Err` item ends
    /// the stream. The stream connects when it is first polled: `since: None` means from then.
    pub fn watch(
        &self,
        filter: WatchFilter,
        since: Option<u64>,
    ) -> impl Stream<Item = Result<WatchEvent, ClientError>> + Send + Unpin + 'static {
        let watching = Watching {
            client: self.clone(),
            filter,
            resume: since,
            connected: None,
            lines: sse::Parser::default(),
            failing_since: None,
            pause: FIRST_PAUSE,
            ended: false,
        };
        Box::pin(futures_util::stream::unfold(watching, |mut watching| async move {
            let item = watching.next().await?;
            Some((item, watching))
        }))
    }
}

/// One watch stream's state.
struct Watching {
    client: Client,
    filter: WatchFilter,
    /// The revision to resume after: every event the filter takes up to it was delivered.
    resume: Option<u64>,
    connected: Option<Response>,
    lines: sse::Parser,
    /// Since when the daemon could not be reached, in a row.
    failing_since: Option<Instant>,
    pause: Duration,
    ended: bool,
}

impl Watching {
    async fn next(&mut self) -> Option<Result<WatchEvent, ClientError>> {
        loop {
            if self.ended {
                return None;
            }
            if let Some(message) = self.lines.message() {
                match self.read(message) {
                    Ok(Some(event)) => return Some(Ok(event)),
                    Ok(None) => continue,
                    Err(err) => return self.end(err),
                }
            }
            let Some(response) = &mut self.connected else {
                if let Err(err) = self.connect().await {
                    let first = *self.failing_since.get_or_insert_with(Instant::now);
                    if !err.is_retryable() || first.elapsed() + self.pause > self.client.watch_reconnect_for {
                        return self.end(err);
                    }
                    tokio::time::sleep(self.pause).await;
                    self.pause = (self.pause * 2).min(MAX_PAUSE);
                }
                continue;
            };
            match tokio::time::timeout(WATCH_IDLE_TIMEOUT, response.chunk()).await {
                Ok(Ok(Some(bytes))) => self.lines.feed(&bytes),
                // Ended (the daemon shuts down), cut, or silent: open it again from where it was.
                Ok(Ok(None)) | Ok(Err(_)) | Err(_) => self.connected = None,
            }
        }
    }

    fn end(&mut self, err: ClientError) -> Option<Result<WatchEvent, ClientError>> {
        self.ended = true;
        self.connected = None;
        Some(Err(err))
    }

    /// Opens the stream after `resume`.
    async fn connect(&mut self) -> Result<(), ClientError> {
        let mut request = self.client.request(Method::GET, "/v1/watch")?;
        for kind in &self.filter.kinds {
            request = request.query(&[("kind", kind)]);
        }
        for prefix in &self.filter.prefixes {
            request = request.query(&[("prefix", prefix)]);
        }
        if let Some(revision) = self.resume {
            request = request.header("last-event-id", revision.to_string());
        }
        let mut request = request.build()?;
        // The request's timeout is for the answer's head only: the stream has no end.
        *request.timeout_mut() = None;
        let sent = tokio::time::timeout(self.client.request_timeout, self.client.http.execute(request));
        let response = match sent.await {
            Ok(response) => response?,
            Err(_) => {
                return Err(ClientError::Api {
                    status: 503,
                    code: "unexpected_response".to_owned(),
                    message: format!("GET /v1/watch: no answer within {:?}", self.client.request_timeout),
                })
            }
        };
        let status = response.status();
        if !status.is_success() {
            let body = response.bytes().await?;
            return Err(api_error("GET /v1/watch", status, &body));
        }
        // Where a stream from now starts, so that a reconnect before the first event misses
        // nothing either.
        let start = response.headers().get("allot-revision").and_then(|v| v.to_str().ok()?.parse().ok());
        self.resume = self.resume.max(start);
        self.connected = Some(response);
        self.lines = sse::Parser::default();
        self.failing_since = None;
        self.pause = FIRST_PAUSE;
        Ok(())
    }

    /// What a message says: an event to deliver, or only where the watcher is.
    fn read(&mut self, message: sse::Message) -> Result<Option<WatchEvent>, ClientError> {
        let id = message.id.as_deref().and_then(|id| id.trim().parse::<u64>().ok());
        match (message.event.as_deref(), message.data) {
            (Some("behind"), Some(data)) => {
                let behind: WatchBehind = serde_json::from_str(&data)
                    .map_err(|err| decode_error("GET /v1/watch: a behind message", err, data.as_bytes()))?;
                // The events after it are still kept (or the reconnect says they are not).
                self.resume = Some(behind.resume);
                self.connected = None;
                Ok(None)
            }
            (_, Some(data)) => {
                let event: WatchEvent = serde_json::from_str(&data)
                    .map_err(|err| decode_error("GET /v1/watch: an event", err, data.as_bytes()))?;
                self.resume = Some(event.revision);
                Ok(Some(event))
            }
            // A heartbeat that says how far the watcher has got.
            (_, None) => {
                self.resume = self.resume.max(id);
                Ok(None)
            }
        }
    }
}
