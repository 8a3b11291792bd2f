//! `Client::watch` against a real daemon over a socket: events in commit order, a watcher that
//! falls behind resumed by the client with nothing missed or repeated, a daemon restarted on the
//! same port and data directory resumed where the stream was, and the errors that end a stream.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use allot_client::{Client, WatchEvent, WatchFilter};
use allot_core::watch::Filter;
use allot_store::prelude::*;
use allot_store::{EmbeddedConfig, EmbeddedStore, Store, WatchConfig};
use futures_util::StreamExt;

/// A daemon in-process over an embedded store, on a real socket.
struct Daemon {
    addr: SocketAddr,
    store: Arc<dyn Store>,
    stop: tokio::sync::oneshot::Sender<()>,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Daemon {
    /// On `addr` (`None`: a free port), over the store in `dir`.
    async fn start(dir: &std::path::Path, addr: Option<SocketAddr>, watch: WatchConfig) -> Daemon {
        let config = EmbeddedConfig::new(dir.to_owned()).with_watch(watch);
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::open(&config).unwrap());
        let listener = tokio::net::TcpListener::bind(addr.unwrap_or(([127, 0, 0, 1], 0).into())).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served =
            tokio::spawn(allot_server::run(listener, allot_server::ServerState::new(store.clone()), async move {
                let _ = stopped.await;
            }));
        Daemon { addr, store, stop, served }
    }

    fn client(&self) -> Client {
        Client::new(&format!("http://{}", self.addr)).unwrap()
    }

    /// Shuts it down gracefully (its watch streams end) and waits until it has.
    async fn stop(self) {
        let _ = self.stop.send(());
        self.served.await.unwrap().unwrap();
    }
}

/// The next item, within 10 s.
async fn next<S: futures_util::Stream + Unpin>(stream: &mut S) -> Option<S::Item> {
    tokio::time::timeout(Duration::from_secs(10), stream.next()).await.expect("an item within 10 s")
}

fn keys(events: &[WatchEvent]) -> Vec<(u64, String, String)> {
    events.iter().map(|e| (e.revision, e.kind.clone(), e.key.clone())).collect()
}

#[tokio::test]
async fn a_watcher_that_falls_behind_is_resumed_by_the_client_with_nothing_missed_or_repeated() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path(), None, WatchConfig { buffer: 2, ..WatchConfig::default() }).await;
    let client = daemon.client();
    // From now: the stream opens when it is first polled, so the revision is given.
    let since = Some(daemon.store.revision());
    let mut watch = client.watch(WatchFilter::default(), since);
    client.put_namespace("hive", 100).await.unwrap();
    let first = next(&mut watch).await.unwrap().unwrap();
    assert_eq!((first.kind.as_str(), first.key.as_str()), ("namespace.put", "namespaces/hive"));
    let session = client.open_session(60_000).await.unwrap();
    for i in 0..20 {
        let allocate = allot_client::Allocate { session: Some(session.id.clone()), ..Default::default() };
        client.allocate("hive", &format!("t{i}"), &allocate).await.unwrap();
    }
    // One commit closes the session and ends its twenty grants: twenty-one events at once, more
    // than the daemon's watcher may have waiting. It is ended with where to resume, and the
    // client resumes there.
    client.close_session(&session.id).await.unwrap();

    // What the store's own feed kept, read from its backlog (not held to the buffer).
    let last = daemon.store.revision();
    let mut truth = daemon.store.watch(Filter::default(), since).unwrap();
    let mut expected = Vec::new();
    while expected.last().is_none_or(|(revision, _, _): &(u64, String, String)| *revision < last) {
        let event = tokio::time::timeout(Duration::from_secs(10), truth.next()).await.unwrap().unwrap();
        expected.push((event.revision, event.kind.name().to_owned(), event.key.clone()));
    }
    assert_eq!(expected.len(), 1 + 1 + 20 + 21, "{expected:?}");
    let mut got = vec![first];
    while got.len() < expected.len() {
        got.push(next(&mut watch).await.unwrap().unwrap());
    }
    assert_eq!(keys(&got), expected);
    let closed = got.iter().filter(|e| e.kind == "grant.session_closed").count();
    assert_eq!(closed, 20);
    assert!(got.iter().any(|e| e.kind == "session.closed"));
    // It was ended (at least once: on a busy machine the twenty allocates may already outrun a
    // buffer of two) and opened again as often, one watcher left.
    let metrics = client.metrics().await.unwrap();
    assert!(metrics.contains("allot_watch_watchers 1"), "{metrics}");
    let opened = r#"allot_http_request_duration_seconds_count{method="GET",route="/v1/watch",status="200"} "#;
    let opens: u64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix(opened))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no count of watches opened: {metrics}"));
    assert!(opens >= 2, "opened again after it was ended: {opens}");
    daemon.stop().await;
}

#[tokio::test]
async fn the_stream_reconnects_across_a_daemon_restart_and_resumes_where_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path(), None, WatchConfig::default()).await;
    let addr = daemon.addr;
    let client = daemon.client();
    let mut watch = client.watch(WatchFilter::default(), Some(daemon.store.revision()));
    client.put_namespace("a", 1).await.unwrap();
    let a = next(&mut watch).await.unwrap().unwrap();
    assert_eq!(a.key, "namespaces/a");

    // The daemon stops (the stream ends; the client finds the port closed and keeps trying); its
    // store changes meanwhile, and it comes back on the same port and data directory.
    daemon.stop().await;
    let store = EmbeddedStore::open(&EmbeddedConfig::new(dir.path().to_owned())).unwrap();
    store.put_namespace(allot_core::NamespaceName::new("b").unwrap(), 2).await.unwrap();
    store.shutdown().await;
    drop(store);
    let restarted = Daemon::start(dir.path(), Some(addr), WatchConfig::default()).await;
    let start = restarted.store.revision();
    assert!(start > a.revision, "revisions go on after a restart: {start} after {}", a.revision);
    // The restarted store kept its events: the client resumes after the last one it had, with
    // the change it missed, then what comes next; nothing twice.
    let b = next(&mut watch).await.unwrap().unwrap();
    assert_eq!((b.kind.as_str(), b.key.as_str()), ("namespace.put", "namespaces/b"));
    assert!(a.revision < b.revision && b.revision < start, "{} {} {start}", a.revision, b.revision);
    restarted.client().put_namespace("c", 3).await.unwrap();
    let c = next(&mut watch).await.unwrap().unwrap();
    assert_eq!((c.kind.as_str(), c.key.as_str()), ("namespace.put", "namespaces/c"));
    assert!(c.revision > start);
    restarted.stop().await;
}

#[tokio::test]
async fn errors_that_retrying_cannot_fix_end_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path(), None, WatchConfig { retain_events: 1, ..WatchConfig::default() }).await;
    let client = daemon.client();
    let start = daemon.store.revision();
    client.put_namespace("a", 1).await.unwrap();
    client.put_namespace("b", 1).await.unwrap();
    let mut compacted = client.watch(WatchFilter::default(), Some(start));
    let err = next(&mut compacted).await.unwrap().unwrap_err();
    assert_eq!((err.status(), err.code()), (Some(410), Some("revision_compacted")), "{err}");
    assert!(next(&mut compacted).await.is_none());

    let mut bad = client.watch(WatchFilter { kinds: vec!["grant.nope".into()], prefixes: vec![] }, None);
    let err = next(&mut bad).await.unwrap().unwrap_err();
    assert_eq!((err.status(), err.code()), (Some(400), Some("invalid_argument")), "{err}");
    assert!(next(&mut bad).await.is_none());
    daemon.stop().await;

    // A daemon that stays away: the stream tries for as long as it is told, then says why.
    let nobody = Client::new(&format!("http://{}", free_addr().await)).unwrap();
    let gone = nobody.with_watch_reconnect(Duration::from_millis(300));
    let mut unreachable = gone.watch(WatchFilter::default(), None);
    let err = next(&mut unreachable).await.unwrap().unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert!(next(&mut unreachable).await.is_none());
}

/// An address nothing listens on.
async fn free_addr() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}
