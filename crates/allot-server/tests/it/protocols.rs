//! The protocols a daemon speaks on one port: HTTP/1.1, and HTTP/2 with prior knowledge (h2c) or
//! chosen by ALPN over TLS. Many waiters share one HTTP/2 connection and are handed the quota in
//! their order; a shutdown does not wait for a connection that never said what it speaks.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use allot_server::{run_with_threads, ServerState, ServingThreads, Tls, TlsFiles};
use allot_store::{EmbeddedConfig, EmbeddedStore, Store};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http2;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A server on a free loopback port, over a fresh embedded store.
struct Served {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    done: JoinHandle<std::io::Result<()>>,
    _dir: tempfile::TempDir,
}

async fn serve(tls: Option<Arc<Tls>>) -> Served {
    serve_with(tls, |state| state).await
}

async fn serve_with(tls: Option<Arc<Tls>>, configure: impl FnOnce(ServerState) -> ServerState) -> Served {
    serve_on(ServingThreads { count: 0, pin: false }, tls, configure).await
}

/// [`serve_with`], on serving threads of its own (`threads.count` > 0).
async fn serve_on(
    threads: ServingThreads,
    tls: Option<Arc<Tls>>,
    configure: impl FnOnce(ServerState) -> ServerState,
) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(EmbeddedStore::open(&EmbeddedConfig::new(dir.path().join("data"))).unwrap());
    let mut state = configure(ServerState::new(store));
    if let Some(tls) = tls {
        state = state.with_tls(tls);
    }
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let done = tokio::spawn(run_with_threads(
        listener,
        state,
        async move {
            let _ = stopped.await;
        },
        threads,
    ));
    Served { addr, stop, done, _dir: dir }
}

impl Served {
    /// Shuts the server down; fails if that does not end within a minute.
    async fn shut_down(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(60), self.done).await.expect("the server shut down").unwrap().unwrap();
    }
}

type H2 = http2::SendRequest<Full<Bytes>>;

/// An HTTP/2 client over `io` (a plain TCP stream: prior knowledge).
async fn h2_over<IO>(io: IO) -> H2
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = http2::Builder::new(TokioExecutor::new()).handshake(TokioIo::new(io)).await.unwrap();
    tokio::spawn(connection);
    sender
}

async fn call(h2: &mut H2, method: Method, path: &str, body: &str) -> (StatusCode, Value) {
    let request = Request::builder()
        .method(method)
        .uri(format!("http://localhost{path}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    h2.ready().await.unwrap();
    let answer = h2.send_request(request).await.unwrap();
    assert_eq!(answer.version(), hyper::Version::HTTP_2);
    let status = answer.status();
    let bytes = answer.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// Twenty allocates wait on one HTTP/2 connection, each sent once the one before is queued; the
/// quota (one unit) passes from the holder along the queue, each waiter releasing once granted:
/// their fencing numbers grow in the order they came. HTTP/1.1 on the same port goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_waiters_share_one_http2_connection_and_are_served_in_order() {
    let served = serve(None).await;
    let mut h2 = h2_over(TcpStream::connect(served.addr).await.unwrap()).await;
    assert!(call(&mut h2, Method::PUT, "/v1/namespaces/hive", r#"{"quota":1}"#).await.0.is_success());
    let (status, held) = call(&mut h2, Method::PUT, "/v1/namespaces/hive/grants/holder", "{}").await;
    assert_eq!((status, held["status"].as_str()), (StatusCode::OK, Some("Granted")), "{held}");
    let mut waiters = Vec::new();
    for i in 0..20 {
        let mut stream = h2.clone();
        waiters.push(tokio::spawn(async move {
            let path = format!("/v1/namespaces/hive/grants/w-{i}");
            let (status, answer) = call(&mut stream, Method::PUT, &path, r#"{"wait_ms":60000}"#).await;
            assert_eq!((status, answer["status"].as_str()), (StatusCode::OK, Some("Granted")), "{answer}");
            let fencing = answer["grant"]["fencing"].as_u64().unwrap();
            assert_eq!(call(&mut stream, Method::DELETE, &path, "").await.0, StatusCode::OK);
            fencing
        }));
        loop {
            let (_, namespace) = call(&mut h2, Method::GET, "/v1/namespaces/hive", "").await;
            if namespace["waiters"].as_u64() == Some(i + 1) {
                break;
            }
            tokio::task::yield_now().await;
        }
    }
    let health = reqwest::get(format!("http://{}/healthz", served.addr)).await.unwrap();
    assert_eq!((health.status(), health.version()), (reqwest::StatusCode::OK, reqwest::Version::HTTP_11));
    assert_eq!(call(&mut h2, Method::DELETE, "/v1/namespaces/hive/grants/holder", "").await.0, StatusCode::OK);
    let mut fencing = Vec::new();
    for waiter in waiters {
        fencing.push(waiter.await.unwrap());
    }
    assert!(fencing.windows(2).all(|pair| pair[0] < pair[1]), "granted in the order they came: {fencing:?}");
    served.shut_down().await;
}

/// A connection that sent nothing, and one that sent only the start of HTTP/2's preface, do not
/// hold a shutdown up; an open HTTP/2 connection is closed by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_does_not_wait_for_connections_that_said_nothing() {
    let served = serve(None).await;
    let _silent = TcpStream::connect(served.addr).await.unwrap();
    let mut partial = TcpStream::connect(served.addr).await.unwrap();
    partial.write_all(b"PRI * HTTP/2").await.unwrap();
    let mut h2 = h2_over(TcpStream::connect(served.addr).await.unwrap()).await;
    assert_eq!(call(&mut h2, Method::GET, "/healthz", "").await.0, StatusCode::OK);
    served.shut_down().await;
}

/// Over TLS, a client that offers `h2` by ALPN speaks HTTP/2; one that offers only `http/1.1`
/// (reqwest here) speaks HTTP/1.1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_is_chosen_by_alpn_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.key_pair.serialize_pem()).unwrap();
    let tls = Tls::load(TlsFiles { cert, key, client_ca: None }).unwrap();
    let served = serve(Some(Arc::new(tls))).await;

    let mut roots = rustls::RootCertStore::empty();
    roots.add(certified.cert.der().clone()).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(served.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let stream = connector.connect(name, tcp).await.unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let mut h2 = h2_over(stream).await;
    let (status, health) = call(&mut h2, Method::GET, "/healthz", "").await;
    assert_eq!(status, StatusCode::OK, "{health}");

    // A client that offers only HTTP/1.1 gets it.
    let client = reqwest::Client::builder()
        .http1_only()
        .add_root_certificate(reqwest::Certificate::from_pem(certified.cert.pem().as_bytes()).unwrap())
        .build()
        .unwrap();
    let port = served.addr.port();
    let health = client.get(format!("https://localhost:{port}/healthz")).send().await.unwrap();
    assert_eq!((health.status(), health.version()), (reqwest::StatusCode::OK, reqwest::Version::HTTP_11));
    served.shut_down().await;
}

/// A connection that sends no request's headers within the idle timeout of opening or of its
/// last answer is closed: one that says nothing, one that sends half its headers (Slowloris), an
/// idle keep-alive one. A request in flight, a watch here, is never idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_without_a_request_are_closed_after_the_idle_timeout() {
    use tokio::io::AsyncReadExt;
    let idle = Duration::from_secs(1);
    let served =
        serve_with(None, |state| state.with_idle_timeout(idle).with_heartbeat(Duration::from_millis(100))).await;
    let open = || TcpStream::connect(served.addr);
    let silent = open().await.unwrap();
    let mut slow = open().await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n").await.unwrap();
    let mut kept = open().await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n").await.unwrap();
    // Whole headers, then half the body they announce: its handler waits for the rest, not at work.
    let mut half_body = open().await.unwrap();
    half_body
        .write_all(b"PUT /v1/namespaces/half HTTP/1.1\r\nhost: localhost\r\ncontent-length: 14\r\n\r\n{\"quota\"")
        .await
        .unwrap();
    // One that sends its headers a byte at a time, never ending them.
    let trickle = open().await.unwrap();
    let (mut trickle_read, mut trickle_write) = trickle.into_split();
    let trickling = tokio::spawn(async move {
        for byte in b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n".iter().cycle() {
            if trickle_write.write_all(&[*byte]).await.is_err() {
                return;
            }
            // Time must really pass between the bytes: what is checked is a timeout of the daemon's.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let mut watch = open().await.unwrap();
    watch.write_all(b"GET /v1/watch HTTP/1.1\r\nhost: localhost\r\n\r\n").await.unwrap();
    // A long poll, waiting three times the idle timeout for a unit that never comes.
    let one = |method: &str, path: &str, body: &str| {
        format!("{method} {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}", body.len())
    };
    let mut setup = open().await.unwrap();
    setup.write_all(one("PUT", "/v1/namespaces/full", r#"{"quota": 1}"#).as_bytes()).await.unwrap();
    setup.write_all(one("PUT", "/v1/namespaces/full/grants/a", "{}").as_bytes()).await.unwrap();
    let (mut answers, mut chunk) = (Vec::new(), [0u8; 4096]);
    while String::from_utf8_lossy(&answers).matches("Granted").count() == 0 {
        let read = tokio::time::timeout(Duration::from_secs(60), setup.read(&mut chunk)).await.unwrap().unwrap();
        assert!(read > 0, "{}", String::from_utf8_lossy(&answers));
        answers.extend_from_slice(&chunk[..read]);
    }
    let mut polling = open().await.unwrap();
    polling.write_all(one("PUT", "/v1/namespaces/full/grants/b", r#"{"wait_ms": 3000}"#).as_bytes()).await.unwrap();
    let started = std::time::Instant::now();
    let mut trickled = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), trickle_read.read_to_end(&mut trickled))
        .await
        .expect("the trickling connection was not closed")
        .unwrap();
    assert!(!String::from_utf8_lossy(&trickled).contains("HTTP/1.1 200"));
    trickling.await.unwrap();
    // Each is closed by the daemon: the read ends (generously bounded: a slow machine is slow).
    for (what, mut stream) in [("silent", silent), ("slow", slow), ("half a body", half_body), ("kept alive", kept)] {
        let mut answered = Vec::new();
        tokio::time::timeout(Duration::from_secs(60), stream.read_to_end(&mut answered))
            .await
            .unwrap_or_else(|_| panic!("the {what} connection was not closed"))
            .unwrap();
        let answered = String::from_utf8_lossy(&answered);
        let answers = answered.matches("HTTP/1.1 200").count();
        assert_eq!(answers, usize::from(what == "kept alive"), "{what}: {answered}");
    }
    // The watch lives on well past the idle timeout, sending heartbeats.
    let mut seen = Vec::new();
    while started.elapsed() < 3 * idle || !String::from_utf8_lossy(&seen).contains(": heartbeat") {
        let read = tokio::time::timeout(Duration::from_secs(60), watch.read(&mut chunk)).await.unwrap().unwrap();
        assert!(read > 0, "the watch was closed after {:?}: {}", started.elapsed(), String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&chunk[..read]);
    }
    drop(watch);
    // The long poll is answered, Exhausted after its wait, on the connection it came on.
    let mut answer = Vec::new();
    while !String::from_utf8_lossy(&answer).contains("Exhausted") {
        let read = tokio::time::timeout(Duration::from_secs(60), polling.read(&mut chunk)).await.unwrap().unwrap();
        assert!(read > 0, "the long poll was closed: {}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&chunk[..read]);
    }
    assert!(started.elapsed() >= 2 * idle, "it waited its 3 s");
    // The half-sent body made nothing (asked on a new connection: the others were idle too long).
    let mut asking = open().await.unwrap();
    asking.write_all(b"GET /v1/namespaces/half HTTP/1.1\r\nhost: localhost\r\n\r\n").await.unwrap();
    let mut answer = Vec::new();
    while !String::from_utf8_lossy(&answer).contains("not_found") {
        let read = tokio::time::timeout(Duration::from_secs(60), asking.read(&mut chunk)).await.unwrap().unwrap();
        assert!(read > 0, "{}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&chunk[..read]);
    }
    drop(setup);
    served.shut_down().await;
}

/// At most `max_connections` are open at once: one past it waits to be accepted and is served once
/// one ends, on the caller's runtime and on serving threads alike; every place comes back.
#[tokio::test]
async fn connections_past_the_limit_wait_until_one_ends() {
    use tokio::io::AsyncReadExt;
    for count in [0, 2] {
        let served = serve_on(ServingThreads { count, pin: false }, None, |state| state.with_max_connections(2)).await;
        let open = || TcpStream::connect(served.addr);
        // Sends a request and reads its answer's head.
        async fn answered(stream: &mut TcpStream) -> String {
            stream.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n").await.unwrap();
            read_answer(stream).await
        }
        async fn read_answer(stream: &mut TcpStream) -> String {
            let (mut seen, mut chunk) = (Vec::new(), [0u8; 1024]);
            while !String::from_utf8_lossy(&seen).contains("\"status\"") {
                let read =
                    tokio::time::timeout(Duration::from_secs(60), stream.read(&mut chunk)).await.unwrap().unwrap();
                assert!(read > 0, "closed: {}", String::from_utf8_lossy(&seen));
                seen.extend_from_slice(&chunk[..read]);
            }
            String::from_utf8_lossy(&seen).into_owned()
        }
        let mut first = open().await.unwrap();
        let mut second = open().await.unwrap();
        assert!(answered(&mut first).await.starts_with("HTTP/1.1 200"));
        assert!(answered(&mut second).await.starts_with("HTTP/1.1 200"));
        // A third: the kernel's backlog takes it, the daemon does not serve it while both are open
        // (looked at for half a second: a slow machine only makes an answer later).
        let mut third = open().await.unwrap();
        third.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n").await.unwrap();
        let mut chunk = [0u8; 1024];
        let early = tokio::time::timeout(Duration::from_millis(500), third.read(&mut chunk)).await;
        assert!(early.is_err(), "threads {count}: the third connection was served past the limit: {early:?}");
        drop(first);
        assert!(read_answer(&mut third).await.starts_with("HTTP/1.1 200"), "threads {count}");
        // Every place comes back: with two held, connections one after another are each served.
        drop((second, third));
        for _ in 0..10 {
            let mut next = open().await.unwrap();
            let mut also = open().await.unwrap();
            assert!(answered(&mut next).await.starts_with("HTTP/1.1 200"), "threads {count}");
            assert!(answered(&mut also).await.starts_with("HTTP/1.1 200"), "threads {count}");
        }
        // The metrics tell the limit, how many are open, and that one waited.
        let metrics = reqwest::get(format!("http://{}/metrics", served.addr)).await.unwrap().text().await.unwrap();
        let value = |name: &str| -> f64 {
            let line =
                metrics.lines().find(|line| line.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name}"));
            line[name.len() + 1..].trim().parse().unwrap()
        };
        assert_eq!(value("allot_connections_max"), 2.0, "threads {count}");
        assert!(value("allot_connections_waited_total") >= 1.0, "threads {count}");
        assert!((1.0..=2.0).contains(&value("allot_connections_open")), "threads {count}");
        served.shut_down().await;
    }
}
