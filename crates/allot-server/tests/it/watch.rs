//! The change feed over the API: `GET /v1/watch` as Server-Sent Events, read frame by frame as a
//! client would: changes made through the API in order with their ids, resuming by `since` and
//! by `Last-Event-ID`, compaction, bad input, heartbeats, a watcher that falls behind, shutdown,
//! and "list, then watch from the list's revision".

use std::time::Duration;

use allot_api::{WatchBehind, WatchEvent, WatchObject};
use allot_store::WatchConfig;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::json;
use tower::ServiceExt;

use crate::support::*;

/// One Server-Sent Events message.
#[derive(Debug, Default)]
struct Message {
    id: Option<u64>,
    event: Option<String>,
    data: String,
    comments: Vec<String>,
}

impl Message {
    fn read(text: &str) -> Message {
        let mut message = Message::default();
        for line in text.lines() {
            if let Some(comment) = line.strip_prefix(':') {
                message.comments.push(comment.trim_start().to_owned());
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "id" => message.id = Some(value.parse().unwrap()),
                "event" => message.event = Some(value.to_owned()),
                "data" => message.data.push_str(value),
                other => panic!("an SSE field `{other}` in {text:?}"),
            }
        }
        message
    }

    /// The event it carries, checked against its `id` and `event`.
    fn change(&self) -> WatchEvent {
        let event: WatchEvent = serde_json::from_str(&self.data).unwrap_or_else(|e| panic!("{e}: {self:?}"));
        assert_eq!(self.id, Some(event.revision), "{self:?}");
        assert_eq!(self.event.as_deref(), Some(event.kind.as_str()), "{self:?}");
        event
    }
}

/// An open watch stream.
struct Stream {
    headers: HeaderMap,
    body: Body,
    text: String,
    /// Every byte of the body read so far.
    sent: String,
}

impl Stream {
    /// `GET uri`, which must answer 200 with an event stream.
    async fn open(h: &Harness, uri: &str, last_event_id: Option<u64>) -> Stream {
        let mut request = Request::builder().method(Method::GET).uri(uri);
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id.to_string());
        }
        let response = h.router.clone().oneshot(request.body(Body::empty()).unwrap()).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{uri}");
        assert_eq!(response.headers()["content-type"], "text/event-stream", "{uri}");
        let (headers, body) = (response.headers().clone(), response.into_body());
        Stream { headers, body, text: String::new(), sent: String::new() }
    }

    /// The revision the stream starts after.
    fn start(&self) -> u64 {
        self.headers["allot-revision"].to_str().unwrap().parse().unwrap()
    }

    /// The next message, within 10 s; `None` once the stream has ended.
    async fn next(&mut self) -> Option<Message> {
        loop {
            if let Some(end) = self.text.find("\n\n") {
                let message = Message::read(&self.text[..end]);
                self.text.drain(..end + 2);
                return Some(message);
            }
            let frame =
                tokio::time::timeout(Duration::from_secs(10), self.body.frame()).await.expect("a message within 10 s");
            match frame {
                None => return None,
                Some(frame) => {
                    let data = frame.unwrap().into_data().unwrap();
                    self.text.push_str(std::str::from_utf8(&data).unwrap());
                    self.sent.push_str(std::str::from_utf8(&data).unwrap());
                }
            }
        }
    }

    /// The next `n` events (heartbeats skipped).
    async fn events(&mut self, n: usize) -> Vec<WatchEvent> {
        let mut events = Vec::new();
        while events.len() < n {
            let message = self.next().await.expect("the stream goes on");
            if message.data.is_empty() {
                continue;
            }
            events.push(message.change());
        }
        events
    }
}

fn kinds(events: &[WatchEvent]) -> Vec<(&str, &str)> {
    events.iter().map(|e| (e.kind.as_str(), e.key.as_str())).collect()
}

fn revision(headers: &HeaderMap) -> u64 {
    headers["allot-revision"].to_str().unwrap().parse().unwrap()
}

/// `GET uri`: its status and headers.
async fn head(h: &Harness, uri: &str) -> (StatusCode, HeaderMap) {
    let request = Request::builder().method(Method::GET).uri(uri).body(Body::empty()).unwrap();
    let response = h.router.clone().oneshot(request).await.unwrap();
    (response.status(), response.headers().clone())
}

#[tokio::test]
async fn a_stream_sees_the_changes_made_through_the_api_in_order_with_their_ids() {
    let h = Harness::new();
    let mut all = Stream::open(&h, "/v1/watch", None).await;
    let mut grants = Stream::open(&h, "/v1/watch?kind=grant.granted,grant.released&prefix=namespaces/hive", None).await;
    assert_eq!(all.headers["cache-control"], "no-cache");
    assert_eq!(all.start(), h.store.revision());

    h.call(Method::PUT, "/v1/namespaces/hive", r#"{"quota": 2}"#).await;
    h.call(Method::PUT, "/v1/namespaces/hive2", r#"{"quota": 2}"#).await;
    let (status, _) = h.call(Method::PUT, "/v1/namespaces/hive/grants/t1", r#"{"units": 2, "ttl_ms": 60000}"#).await;
    assert_eq!(status, StatusCode::OK);
    h.call(Method::PUT, "/v1/namespaces/hive2/grants/t1", "").await;
    h.call(Method::DELETE, "/v1/namespaces/hive/grants/t1", "").await;
    h.call(Method::PUT, "/v1/pools/p", r#"{"capacity": "cpu=4"}"#).await;
    let (_, alloc) = h.call(Method::POST, "/v1/pools/p/offers/1", r#"{"min": "cpu=1"}"#).await;
    let alloc_id = alloc["id"].as_str().unwrap().to_owned();
    h.call(Method::DELETE, &format!("/v1/pools/p/allocs/{alloc_id}"), "").await;

    let events = all.events(8).await;
    let alloc_key = format!("pools/p/allocs/{alloc_id}");
    assert_eq!(
        kinds(&events),
        [
            ("namespace.put", "namespaces/hive"),
            ("namespace.put", "namespaces/hive2"),
            ("grant.granted", "namespaces/hive/grants/t1"),
            ("grant.granted", "namespaces/hive2/grants/t1"),
            ("grant.released", "namespaces/hive/grants/t1"),
            ("pool.put", "pools/p"),
            ("alloc.made", alloc_key.as_str()),
            ("alloc.ended", alloc_key.as_str()),
        ]
    );
    assert!(events.windows(2).all(|pair| pair[0].revision < pair[1].revision), "{events:?}");
    assert!(events[0].revision > all.start());
    match &events[2].object {
        WatchObject::Grant(grant) => {
            assert_eq!((grant.token.as_str(), grant.units, grant.ttl_ms), ("t1", 2, Some(60_000)));
            assert_eq!(grant.expires_in_ms, Some(60_000), "as of the change");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(events[4].cause.as_deref(), Some("released"));
    match (&events[5].object, &events[7].object) {
        (WatchObject::Pool(pool), WatchObject::Alloc(ended)) => {
            assert_eq!(pool.capacity, "cpu=4");
            assert_eq!(ended.ended, Some(allot_api::EndReason::Freed));
        }
        other => panic!("{other:?}"),
    }
    // The raw JSON: the fields the API states.
    let raw: serde_json::Value = serde_json::to_value(&events[4]).unwrap();
    assert_eq!(raw["kind"], "grant.released");
    assert!(raw["at_ms"].as_u64().unwrap() > 0 && raw["object"]["namespace"] == "hive", "{raw}");

    let filtered = grants.events(2).await;
    assert_eq!(
        kinds(&filtered),
        [("grant.granted", "namespaces/hive/grants/t1"), ("grant.released", "namespaces/hive/grants/t1")]
    );
    assert_eq!((filtered[0].revision, filtered[1].revision), (events[2].revision, events[4].revision));
}

#[tokio::test]
async fn many_streams_of_the_same_events_get_the_same_bytes() {
    let h = Harness::new();
    let mut streams = Vec::new();
    for _ in 0..20 {
        streams.push(Stream::open(&h, "/v1/watch?prefix=namespaces/hive", None).await);
    }
    h.call(Method::PUT, "/v1/namespaces/hive", r#"{"quota": 5}"#).await;
    for i in 0..5 {
        h.call(Method::PUT, &format!("/v1/namespaces/hive/grants/t{i}"), "").await;
        h.call(Method::DELETE, &format!("/v1/namespaces/hive/grants/t{i}"), "").await;
    }
    let mut texts = Vec::new();
    for stream in &mut streams {
        let events = stream.events(11).await;
        assert_eq!(events.last().map(|e| e.kind.as_str()), Some("grant.released"));
        // Everything read: what the stream sent, byte for byte (the last message's end included).
        assert!(stream.text.is_empty());
        texts.push(stream.sent.clone());
    }
    assert!(texts.iter().all(|text| *text == texts[0]), "{texts:?}");
    assert_eq!(texts[0].matches("\nevent: grant.").count(), 10, "{}", texts[0]);
}

#[tokio::test]
async fn since_and_last_event_id_resume_with_nothing_missed_or_repeated() {
    let h = Harness::new();
    let start = h.store.revision();
    for (i, quota) in (1..=6).enumerate() {
        h.call(Method::PUT, &format!("/v1/namespaces/n{i}"), &format!(r#"{{"quota": {quota}}}"#)).await;
    }
    let mut first = Stream::open(&h, &format!("/v1/watch?since={start}"), None).await;
    assert_eq!(first.start(), start);
    let events = first.events(6).await;
    let keys: Vec<String> = events.iter().map(|e| e.key.clone()).collect();
    assert_eq!(keys, (0..6).map(|i| format!("namespaces/n{i}")).collect::<Vec<_>>());
    drop(first);

    // A client that had the first two resumes after the second, by `since`...
    let mut resumed = Stream::open(&h, &format!("/v1/watch?since={}", events[1].revision), None).await;
    assert_eq!(resumed.events(4).await, events[2..]);
    // ... or as an EventSource does, by Last-Event-ID, which wins over `since`.
    let uri = format!("/v1/watch?since={start}");
    let mut reconnected = Stream::open(&h, &uri, Some(events[3].revision)).await;
    assert_eq!(reconnected.start(), events[3].revision);
    assert_eq!(reconnected.events(2).await, events[4..]);
    // And goes on with what comes.
    h.call(Method::PUT, "/v1/namespaces/later", r#"{"quota": 1}"#).await;
    let later = reconnected.events(1).await;
    assert_eq!(later[0].key, "namespaces/later");
    assert_eq!(resumed.events(1).await, later);
}

#[tokio::test]
async fn a_revision_no_longer_kept_is_410_revision_compacted_naming_the_oldest() {
    let h = Harness::with_watch(WatchConfig { retain_events: 2, ..WatchConfig::default() }, Duration::from_secs(15));
    let start = h.store.revision();
    for i in 0..5 {
        h.call(Method::PUT, &format!("/v1/namespaces/n{i}"), r#"{"quota": 1}"#).await;
    }
    let (kept, oldest) = h.store.feed_kept();
    assert_eq!(kept, 2);
    let (status, body) = h.call(Method::GET, &format!("/v1/watch?since={start}"), "").await;
    assert_eq!((status, body["error"]["code"].clone()), (StatusCode::GONE, json!("revision_compacted")), "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(&format!("the oldest revision a watch can start after is {oldest}")), "{message}");
    // By Last-Event-ID too; from the oldest kept, the two kept events.
    let request = Request::builder().uri("/v1/watch").header("last-event-id", start.to_string()).body(Body::empty());
    let response = h.router.clone().oneshot(request.unwrap()).await.unwrap();
    assert_eq!(response.status(), StatusCode::GONE);
    let mut stream = Stream::open(&h, &format!("/v1/watch?since={oldest}"), None).await;
    let keys: Vec<String> = stream.events(2).await.into_iter().map(|e| e.key).collect();
    assert_eq!(keys, ["namespaces/n3", "namespaces/n4"]);

    let (_, body) = h.call(Method::GET, "/metrics", "").await;
    let text = body.as_str().unwrap();
    assert!(text.contains("allot_watch_events_kept 2"), "{text}");
    assert!(text.contains(&format!("allot_watch_oldest_revision {oldest}")), "{text}");
    assert!(text.contains("allot_watch_watchers 1"), "{text}");
    drop(stream);
    let (_, body) = h.call(Method::GET, "/metrics", "").await;
    assert!(body.as_str().unwrap().contains("allot_watch_watchers 0"), "{body}");
}

#[tokio::test]
async fn bad_input_is_400_invalid_argument_naming_what_is_valid() {
    let h = Harness::new();
    let (status, body) = h.call(Method::GET, "/v1/watch?kind=grant.granted,grant.nope", "").await;
    assert_eq!((status, body["error"]["code"].clone()), (StatusCode::BAD_REQUEST, json!("invalid_argument")));
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("`grant.nope`") && message.contains("grant.granted, grant.renewed"), "{message}");
    for uri in
        ["/v1/watch?since=-3", "/v1/watch?since=soon", "/v1/watch?from=1", "/v1/watch?since=99999999999999999999"]
    {
        let (status, body) = h.call(Method::GET, uri, "").await;
        assert_eq!(
            (status, body["error"]["code"].clone()),
            (StatusCode::BAD_REQUEST, json!("invalid_argument")),
            "{uri}"
        );
    }
    let request = Request::builder().uri("/v1/watch").header("last-event-id", "x").body(Body::empty()).unwrap();
    assert_eq!(h.router.clone().oneshot(request).await.unwrap().status(), StatusCode::BAD_REQUEST);
    let (status, _) = h.call(Method::POST, "/v1/watch", "").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn an_idle_stream_gets_heartbeats_that_carry_the_revision_passed() {
    let h = Harness::with_watch(WatchConfig::default(), Duration::from_millis(50));
    let mut pools = Stream::open(&h, "/v1/watch?kind=pool.put", None).await;
    let heartbeat = pools.next().await.unwrap();
    assert_eq!(heartbeat.comments, ["heartbeat"]);
    assert_eq!((heartbeat.id, heartbeat.event, heartbeat.data.as_str()), (None, None, ""));
    // A change the filter does not take: the next heartbeat says the watcher has passed it, so a
    // client that reconnects resumes from there.
    h.call(Method::PUT, "/v1/namespaces/hive", r#"{"quota": 1}"#).await;
    let passed = h.store.revision();
    let heartbeat = loop {
        let message = pools.next().await.unwrap();
        assert!(message.data.is_empty(), "{message:?}");
        if message.id.is_some() {
            break message;
        }
    };
    assert_eq!((heartbeat.comments.as_slice(), heartbeat.id), (&["heartbeat".to_owned()][..], Some(passed)));
    // Then heartbeats alone again.
    assert_eq!(pools.next().await.unwrap().id, None);
}

#[tokio::test]
async fn a_watcher_that_falls_behind_is_told_where_to_resume_and_misses_nothing() {
    let h = Harness::with_watch(WatchConfig { buffer: 2, ..WatchConfig::default() }, Duration::from_secs(15));
    // Not read while the changes are made: it falls behind.
    let mut slow = Stream::open(&h, "/v1/watch", None).await;
    for i in 0..10 {
        h.call(Method::PUT, &format!("/v1/namespaces/n{i}"), r#"{"quota": 1}"#).await;
    }
    // It gets what its buffer held, then where to resume.
    let mut given = Vec::new();
    let behind = loop {
        let message = slow.next().await.unwrap();
        if message.event.as_deref() == Some("behind") {
            break message;
        }
        given.push(message);
    };
    assert_eq!(given.len(), 2, "its buffer held two: {given:?}");
    let last_given = given.last().and_then(|m| m.id).unwrap();
    let said: WatchBehind = serde_json::from_str(&behind.data).unwrap();
    assert_eq!((said.resume, said.buffer, behind.id), (last_given, 2, Some(last_given)));
    assert!(said.message.contains("fell behind"), "{}", said.message);
    assert!(slow.next().await.is_none(), "the stream ends after it");

    let mut again = Stream::open(&h, "/v1/watch", Some(said.resume)).await;
    let keys: Vec<String> = again.events(8).await.into_iter().map(|e| e.key).collect();
    assert_eq!(keys, (2..10).map(|i| format!("namespaces/n{i}")).collect::<Vec<_>>(), "nothing missed");
}

#[tokio::test]
async fn a_list_then_a_watch_from_its_revision_misses_nothing() {
    let h = Harness::new();
    h.call(Method::PUT, "/v1/namespaces/a", r#"{"quota": 1}"#).await;
    let (status, headers) = head(&h, "/v1/namespaces").await;
    assert_eq!(status, StatusCode::OK);
    let listed = revision(&headers);
    assert_eq!(listed, h.store.revision());
    h.call(Method::PUT, "/v1/namespaces/b", r#"{"quota": 1}"#).await;
    h.call(Method::PUT, "/v1/namespaces/a", r#"{"quota": 5}"#).await;
    let mut stream = Stream::open(&h, &format!("/v1/watch?since={listed}"), None).await;
    let events = stream.events(2).await;
    assert_eq!(kinds(&events), [("namespace.put", "namespaces/b"), ("namespace.put", "namespaces/a")]);
    match &events[1].object {
        WatchObject::Namespace(namespace) => assert_eq!(namespace.quota, 5),
        other => panic!("{other:?}"),
    }

    // Every read says the revision it reflects; writes and the daemon's own routes do not.
    h.call(Method::PUT, "/v1/pools/p", r#"{"capacity": "cpu=1"}"#).await;
    h.call(Method::PUT, "/v1/queues/root.a", "{}").await;
    let now = h.store.revision();
    for uri in [
        "/v1/namespaces/a",
        "/v1/namespaces/a/grants",
        "/v1/sessions",
        "/v1/pools",
        "/v1/pools/p",
        "/v1/queues",
        "/v1/apps",
    ] {
        let (status, headers) = head(&h, uri).await;
        assert_eq!((status, revision(&headers)), (StatusCode::OK, now), "{uri}");
    }
    let (status, headers) = head(&h, "/v1/namespaces/none").await;
    assert_eq!((status, revision(&headers)), (StatusCode::NOT_FOUND, now));
    let request = Request::builder().method(Method::PUT).uri("/v1/namespaces/c").body(Body::from(r#"{"quota": 1}"#));
    let response = h.router.clone().oneshot(request.unwrap()).await.unwrap();
    assert!(!response.headers().contains_key("allot-revision"));
    assert!(!head(&h, "/healthz").await.1.contains_key("allot-revision"));
}

#[tokio::test]
async fn a_stream_ends_when_the_store_shuts_down() {
    let h = Harness::new();
    let mut stream = Stream::open(&h, "/v1/watch", None).await;
    h.call(Method::PUT, "/v1/namespaces/a", r#"{"quota": 1}"#).await;
    h.store.shutdown().await;
    assert_eq!(stream.events(1).await[0].key, "namespaces/a", "what was published is sent first");
    assert!(stream.next().await.is_none());
    let (status, body) = h.call(Method::GET, "/v1/watch", "").await;
    assert_eq!((status, body["error"]["code"].clone()), (StatusCode::SERVICE_UNAVAILABLE, json!("shutting_down")));
}
