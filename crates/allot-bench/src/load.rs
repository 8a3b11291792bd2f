//! The load generator: N clients in a closed loop of allocate+release pairs against one target,
//! measured over a fixed window after a warm-up.
//!
//! Each client owns one keep-alive HTTP/1.1 connection and a fresh token per pair. A pair counts
//! when its allocate started inside the window and its release answered inside it; an error counts
//! when its request started inside the window. A request that fails or times out drops its
//! connection; the client reconnects and goes on.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use hyper::body::Bytes;
use hyper::{Method, StatusCode};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::http::{encode_segment, Conn, Endpoint};
use crate::latency::Latency;
use crate::{LoadOpts, OutputOpts};

/// The body of every allocate: one unit, no lease, no wait.
const ALLOCATE_BODY: &str = "{}";
/// How long a client pauses after a failed request before the next one.
const ERROR_PAUSE: Duration = Duration::from_millis(10);

/// What the pairs are made of on a given server.
#[derive(Debug, Clone)]
enum Protocol {
    /// allot's API: `PUT`/`DELETE {grants}{token}`, where `grants` is `/v1/namespaces/{ns}/grants/`.
    Allot { grants: String },
    /// Throttle's API: one peer per client, `PUT`/`DELETE /peers/{peer}/{semaphore}` with body `1`.
    Throttle { semaphore: String },
    /// etcd's JSON gateway: a transaction that puts `{prefix}/{token}` if it does not exist, then
    /// a delete of that key.
    Etcd { prefix: String },
}

/// A server under load.
#[derive(Debug, Clone)]
pub(super) struct Target {
    /// Its name in reports (`baseline`, `allot`, `throttle`).
    pub(super) name: String,
    pub(super) endpoint: Endpoint,
    protocol: Protocol,
    /// When set, allocates carry a scope and caps (allot's API only).
    scoped: Option<ScopedLoad>,
    /// The server's process, when known: its CPU time over the window is measured.
    pub(super) pid: Option<u32>,
}

/// Allocates with a scope and caps: client `i` holds in project `load-{i % projects}`, scope
/// `dev`, under the given project and namespace caps [Flyte's web-API defaults: 100 and 50].
#[derive(Debug, Clone, Copy)]
pub(super) struct ScopedLoad {
    pub(super) projects: usize,
    pub(super) project_cap: u64,
    pub(super) namespace_cap: u64,
}

impl ScopedLoad {
    /// The scope and caps of client `index`, as the fields of an allocate request.
    pub(super) fn project(&self, index: usize) -> String {
        format!("load-{}", index % self.projects.max(1))
    }

    fn body(&self, index: usize) -> Bytes {
        let body = format!(
            r#"{{"scope":{{"project":"{}","namespace":"dev"}},"caps":{{"project":{},"namespace":{}}}}}"#,
            self.project(index),
            self.project_cap,
            self.namespace_cap
        );
        Bytes::from(body)
    }
}

impl Target {
    /// A server that speaks allot's API (allot itself or the baseline server).
    pub(super) fn allot(name: &str, endpoint: Endpoint, namespace: &str) -> Target {
        let grants = format!("/v1/namespaces/{}/grants/", encode_segment(namespace));
        Target { name: name.to_owned(), endpoint, protocol: Protocol::Allot { grants }, scoped: None, pid: None }
    }

    /// An etcd server: a token is a key under `prefix/`.
    pub(super) fn etcd(name: &str, endpoint: Endpoint, prefix: &str) -> Target {
        Target {
            name: name.to_owned(),
            endpoint,
            protocol: Protocol::Etcd { prefix: prefix.to_owned() },
            scoped: None,
            pid: None,
        }
    }

    /// Measures the CPU time of process `pid` (the server) over the window.
    pub(super) fn with_pid(mut self, pid: Option<u32>) -> Target {
        self.pid = pid;
        self
    }

    /// Allocates carry a scope and caps.
    pub(super) fn with_scopes(mut self, scoped: ScopedLoad) -> Target {
        self.scoped = Some(scoped);
        self
    }

    /// A Throttle server with `semaphore` configured.
    pub(super) fn throttle(name: &str, endpoint: Endpoint, semaphore: &str) -> Target {
        Target {
            name: name.to_owned(),
            endpoint,
            protocol: Protocol::Throttle { semaphore: encode_segment(semaphore) },
            scoped: None,
            pid: None,
        }
    }
}

/// How to run the load.
#[derive(Debug, Clone)]
pub(super) struct LoadSpec {
    pub(super) clients: usize,
    pub(super) warmup: Duration,
    pub(super) duration: Duration,
    pub(super) timeout: Duration,
    pub(super) progress: bool,
}

impl LoadSpec {
    pub(super) fn new(clients: usize, duration: Duration, load: &LoadOpts, output: &OutputOpts) -> LoadSpec {
        LoadSpec { clients, warmup: load.warmup, duration, timeout: load.timeout, progress: show_progress(output) }
    }
}

/// Whether to draw progress bars: only on a terminal, and not with `--no-progress`.
pub(super) fn show_progress(output: &OutputOpts) -> bool {
    !output.no_progress && std::io::stdout().is_terminal() && std::io::stderr().is_terminal()
}

/// The measurements of one load run.
#[derive(Debug, Clone, Serialize)]
pub(super) struct LoadResult {
    pub(super) target: String,
    pub(super) url: String,
    pub(super) clients: usize,
    /// The length of the measurement window.
    pub(super) seconds: f64,
    /// Allocate+release pairs completed in the window.
    pub(super) pairs: u64,
    /// Requests answered in the window (allocates and releases, whatever the answer).
    pub(super) requests: u64,
    /// Transport failures, timeouts, unexpected HTTP statuses and releases that released nothing.
    pub(super) errors: u64,
    /// Allocates answered with another status than `Granted`.
    pub(super) not_granted: u64,
    pub(super) pairs_per_s: f64,
    pub(super) requests_per_s: f64,
    /// Latency of single requests (allocates and releases).
    pub(super) request_ms: Latency,
    /// Latency of a whole pair, from sending the allocate to the release's answer.
    pub(super) pair_ms: Latency,
    pub(super) allocate_ms: Latency,
    pub(super) release_ms: Latency,
    /// The server process's CPU time (user and system, every thread) per pair in the window,
    /// in µs, when its process is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) server_cpu_us_per_pair: Option<f64>,
    /// The server's CPU time over the window, in CPUs (1.0 = one core busy all along).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) server_cpus: Option<f64>,
    /// The share of the machine's CPU time the hypervisor took away (steal) over the window, in
    /// percent: a slow spell of a shared VM shows here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) steal_pct: Option<f64>,
    /// The first error seen, for diagnosis.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) first_error: Option<String>,
    /// How long the servers took to fall quiet before this load (`bench compare`: what the
    /// target before left to do is not counted against this one), in ms; `settled: false` when
    /// they did not within the longest wait, and the load ran anyway.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) settled_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) settled: Option<bool>,
}

/// A short id that makes this run's tokens differ from every earlier run's.
pub(super) fn run_id() -> String {
    let millis = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
    format!("{:x}{:04x}", millis % 0x1_0000_0000, std::process::id() % 0x1_0000)
}

/// Creates `namespace` with `quota` on an allot API server (or changes its quota).
pub(super) async fn setup_namespace(endpoint: &Endpoint, namespace: &str, quota: u64) -> anyhow::Result<()> {
    let mut conn = Conn::connect(endpoint).await?;
    let path = format!("/v1/namespaces/{}", encode_segment(namespace));
    let body = Bytes::from(serde_json::to_vec(&allot_api::PutNamespace { quota })?);
    let (status, answer) = conn.request(Method::PUT, &path, body).await?;
    if !status.is_success() {
        bail!("PUT {path} answered {status}: {}", String::from_utf8_lossy(&answer));
    }
    Ok(())
}

/// Removes `namespace` and its grants from an allot API server.
pub(super) async fn remove_namespace(endpoint: &Endpoint, namespace: &str) -> anyhow::Result<()> {
    let mut conn = Conn::connect(endpoint).await?;
    let path = format!("/v1/namespaces/{}?force=true", encode_segment(namespace));
    let (status, answer) = conn.request(Method::DELETE, &path, Bytes::new()).await?;
    if !status.is_success() {
        bail!("DELETE {path} answered {status}: {}", String::from_utf8_lossy(&answer));
    }
    Ok(())
}

/// The outcome of one request of a pair.
enum Outcome {
    /// Granted (allocate) or released (release).
    Done,
    /// The allocate was answered, but not with a grant.
    NotGranted,
    /// Anything else; the connection is dropped when `reconnect`.
    Failed { message: String, reconnect: bool },
}

/// The part of an allocate answer the load generator reads.
#[derive(Deserialize)]
struct AllocateStatus<'a> {
    #[serde(borrow)]
    status: &'a str,
}

/// The part of a release answer the load generator reads.
#[derive(Deserialize)]
struct ReleaseStatus {
    released: bool,
}

/// One client: its connection and, for Throttle, its peer.
struct Client {
    target: Arc<Target>,
    conn: Option<Conn>,
    peer: Option<u64>,
    timeout: Duration,
    allocate_body: Bytes,
}

impl Client {
    /// Connects and, for Throttle, creates the client's peer.
    async fn prepare(target: Arc<Target>, index: usize, timeout: Duration) -> anyhow::Result<Client> {
        let allocate_body = match (&target.protocol, target.scoped) {
            (Protocol::Throttle { .. }, _) => Bytes::from_static(b"1"),
            (Protocol::Etcd { .. }, _) => Bytes::new(),
            (Protocol::Allot { .. }, Some(scoped)) => scoped.body(index),
            (Protocol::Allot { .. }, None) => Bytes::from_static(ALLOCATE_BODY.as_bytes()),
        };
        let mut client = Client { target, conn: None, peer: None, timeout, allocate_body };
        client.connect().await?;
        Ok(client)
    }

    async fn connect(&mut self) -> anyhow::Result<&mut Conn> {
        let conn = match self.conn.take() {
            Some(conn) => conn,
            None => {
                let mut conn = Conn::connect(&self.target.endpoint).await?.with_timeout(self.timeout);
                if matches!(self.target.protocol, Protocol::Throttle { .. }) && self.peer.is_none() {
                    let body = Bytes::from_static(br#"{"expires_in":"1h"}"#);
                    let (status, answer) = conn.request(Method::POST, "/new_peer", body).await?;
                    if status != StatusCode::OK {
                        bail!("POST /new_peer answered {status}: {}", String::from_utf8_lossy(&answer));
                    }
                    self.peer = Some(serde_json::from_slice(&answer).context("POST /new_peer: not a peer id")?);
                }
                conn
            }
        };
        Ok(self.conn.insert(conn))
    }

    /// The allocate (or, `releasing`, the release) of `token`: method, path and body.
    fn request(&self, token: &str, releasing: bool) -> (Method, String, Bytes) {
        match (&self.target.protocol, releasing) {
            (Protocol::Allot { grants }, false) => {
                (Method::PUT, format!("{grants}{token}"), self.allocate_body.clone())
            }
            (Protocol::Allot { grants }, true) => (Method::DELETE, format!("{grants}{token}"), Bytes::new()),
            (Protocol::Throttle { semaphore }, releasing) => {
                let path = format!("/peers/{}/{semaphore}", self.peer.unwrap_or_default());
                if releasing {
                    (Method::DELETE, path, Bytes::new())
                } else {
                    (Method::PUT, path, self.allocate_body.clone())
                }
            }
            (Protocol::Etcd { prefix }, releasing) => {
                use base64::Engine as _;
                let key = base64::engine::general_purpose::STANDARD.encode(format!("{prefix}/{token}"));
                if releasing {
                    (Method::POST, "/v3/kv/deleterange".to_owned(), Bytes::from(format!(r#"{{"key":"{key}"}}"#)))
                } else {
                    let body = format!(
                        r#"{{"compare":[{{"key":"{key}","target":"CREATE","create_revision":"0"}}],"success":[{{"request_put":{{"key":"{key}","value":"MQ=="}}}}]}}"#
                    );
                    (Method::POST, "/v3/kv/txn".to_owned(), Bytes::from(body))
                }
            }
        }
    }

    /// Sends one request and sorts its answer into an outcome.
    async fn call(&mut self, token: &str, releasing: bool) -> Outcome {
        let (method, path, body) = self.request(token, releasing);
        let path = path.as_str();
        let conn = match self.connect().await {
            Ok(conn) => conn,
            Err(err) => return Outcome::Failed { message: format!("{err:#}"), reconnect: true },
        };
        let (status, body) = match conn.request(method, path, body).await {
            Ok(answer) => answer,
            Err(err) => return Outcome::Failed { message: format!("{err:#}"), reconnect: true },
        };
        let unexpected = || Outcome::Failed {
            message: format!("{status}: {}", String::from_utf8_lossy(&body[..body.len().min(200)])),
            reconnect: false,
        };
        if let Protocol::Etcd { .. } = self.target.protocol {
            let text = String::from_utf8_lossy(&body);
            return match releasing {
                _ if status != StatusCode::OK => unexpected(),
                // A transaction whose comparison failed leaves `succeeded` out.
                false if text.contains(r#""succeeded":true"#) => Outcome::Done,
                false => Outcome::NotGranted,
                true if text.contains(r#""deleted":"1""#) => Outcome::Done,
                true => Outcome::Failed { message: "the release released nothing".into(), reconnect: false },
            };
        }
        let throttle = matches!(self.target.protocol, Protocol::Throttle { .. });
        match (throttle, releasing) {
            // Throttle answers 200 once the lock is acquired and 202 while it is pending.
            (true, false) if status == StatusCode::ACCEPTED => Outcome::NotGranted,
            (true, _) if status == StatusCode::OK => Outcome::Done,
            (true, _) => unexpected(),
            (false, _) if status != StatusCode::OK => unexpected(),
            (false, false) => match serde_json::from_slice::<AllocateStatus<'_>>(&body) {
                Ok(answer) if answer.status == "Granted" => Outcome::Done,
                Ok(_) => Outcome::NotGranted,
                Err(_) => unexpected(),
            },
            (false, true) => match serde_json::from_slice::<ReleaseStatus>(&body) {
                Ok(answer) if answer.released => Outcome::Done,
                Ok(_) => Outcome::Failed { message: "the release released nothing".into(), reconnect: false },
                Err(_) => unexpected(),
            },
        }
    }

    /// Ends the client's peer on Throttle (not measured).
    async fn finish(mut self) {
        if let (Some(peer), Some(conn)) = (self.peer, self.conn.as_mut()) {
            let _ = conn.request(Method::DELETE, &format!("/peers/{peer}"), Bytes::new()).await;
        }
    }
}

/// What one client measured.
#[derive(Default)]
struct Samples {
    allocate: Vec<u64>,
    release: Vec<u64>,
    pair: Vec<u64>,
    requests: u64,
    errors: u64,
    not_granted: u64,
    first_error: Option<String>,
}

impl Samples {
    fn merge(&mut self, other: Samples) {
        self.allocate.extend(other.allocate);
        self.release.extend(other.release);
        self.pair.extend(other.pair);
        self.requests += other.requests;
        self.errors += other.errors;
        self.not_granted += other.not_granted;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

/// Live counters for the progress bar.
#[derive(Default)]
struct Live {
    pairs: AtomicU64,
    errors: AtomicU64,
}

/// The window of a run.
#[derive(Clone, Copy)]
struct Window {
    start: Instant,
    end: Instant,
}

impl Window {
    fn contains(&self, from: Instant, to: Instant) -> bool {
        from >= self.start && to <= self.end
    }
}

async fn client_loop(mut client: Client, index: usize, run: Arc<str>, window: Window, live: Arc<Live>) -> Samples {
    let mut samples = Samples::default();
    let failure = |samples: &mut Samples, client: &mut Client, started: Instant, message: String, reconnect| {
        if reconnect {
            client.conn = None;
        }
        live.errors.fetch_add(1, Ordering::Relaxed);
        if started >= window.start {
            samples.errors += 1;
        }
        if samples.first_error.is_none() {
            samples.first_error = Some(message);
        }
    };
    let mut seq: u64 = 0;
    loop {
        let started = Instant::now();
        if started >= window.end {
            break;
        }
        seq += 1;
        let token = format!("{run}-{index}-{seq}");
        let allocated = match client.call(&token, false).await {
            Outcome::Done => Instant::now(),
            Outcome::NotGranted => {
                if window.contains(started, Instant::now()) {
                    samples.requests += 1;
                    samples.not_granted += 1;
                }
                continue;
            }
            Outcome::Failed { message, reconnect } => {
                failure(&mut samples, &mut client, started, format!("allocate: {message}"), reconnect);
                tokio::time::sleep(ERROR_PAUSE).await;
                continue;
            }
        };
        match client.call(&token, true).await {
            Outcome::Done | Outcome::NotGranted => {}
            Outcome::Failed { message, reconnect } => {
                failure(&mut samples, &mut client, started, format!("release: {message}"), reconnect);
                tokio::time::sleep(ERROR_PAUSE).await;
                continue;
            }
        }
        let released = Instant::now();
        live.pairs.fetch_add(1, Ordering::Relaxed);
        if window.contains(started, released) {
            samples.requests += 2;
            samples.allocate.push(nanos(allocated - started));
            samples.release.push(nanos(released - allocated));
            samples.pair.push(nanos(released - started));
        }
    }
    client.finish().await;
    samples
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// Runs the pair load against `target` and measures it.
pub(super) async fn run_load(target: &Target, spec: &LoadSpec) -> anyhow::Result<LoadResult> {
    let target = Arc::new(target.clone());
    let mut clients = Vec::with_capacity(spec.clients);
    for index in 0..spec.clients {
        let client = Client::prepare(target.clone(), index, spec.timeout)
            .await
            .with_context(|| format!("{}: cannot prepare a client", target.name))?;
        clients.push(client);
    }
    let run: Arc<str> = run_id().into();
    let began = Instant::now();
    let window = Window { start: began + spec.warmup, end: began + spec.warmup + spec.duration };
    let live = Arc::new(Live::default());
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(index, client)| tokio::spawn(client_loop(client, index, run.clone(), window, live.clone())))
        .collect();

    // The server's CPU time and the machine's steal at the window's start and end.
    let server = target.pid;
    let cpu = tokio::spawn(async move {
        tokio::time::sleep_until(window.start.into()).await;
        let start = server.and_then(crate::cpu::process_cpu_seconds);
        let machine = crate::cpu::CpuTimes::now();
        tokio::time::sleep_until(window.end.into()).await;
        let used = start.zip(server.and_then(crate::cpu::process_cpu_seconds)).map(|(start, end)| end - start);
        let share = machine.zip(crate::cpu::CpuTimes::now()).and_then(|(start, end)| start.share_until(&end));
        (used, share.map(|share| share.steal_pct))
    });
    let bar = progress_bar(spec, &format!("{} × {}", target.name, spec.clients));
    let ticker = tokio::spawn(tick(bar.clone(), began, window, live.clone()));
    let mut samples = Samples::default();
    for task in tasks {
        samples.merge(task.await.context("a client task failed")?);
    }
    ticker.abort();
    bar.finish_and_clear();

    let seconds = spec.duration.as_secs_f64();
    let pairs = samples.pair.len() as u64;
    let (server_cpu, steal_pct) = cpu.await.unwrap_or_default();
    let mut requests_ns = samples.allocate.clone();
    requests_ns.extend_from_slice(&samples.release);
    Ok(LoadResult {
        target: target.name.clone(),
        url: target.endpoint.url(),
        clients: spec.clients,
        seconds,
        pairs,
        requests: samples.requests,
        errors: samples.errors,
        not_granted: samples.not_granted,
        pairs_per_s: pairs as f64 / seconds,
        requests_per_s: samples.requests as f64 / seconds,
        request_ms: Latency::from_nanos(requests_ns),
        pair_ms: Latency::from_nanos(samples.pair),
        allocate_ms: Latency::from_nanos(samples.allocate),
        release_ms: Latency::from_nanos(samples.release),
        server_cpu_us_per_pair: server_cpu.filter(|_| pairs > 0).map(|cpu| cpu * 1e6 / pairs as f64),
        server_cpus: server_cpu.map(|cpu| cpu / seconds),
        steal_pct,
        first_error: samples.first_error,
        settled_ms: None,
        settled: None,
    })
}

/// A progress bar over `len` steps on stderr, or a hidden one.
pub(super) fn progress_bar_len(show: bool, prefix: &str, len: u64) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len).with_prefix(prefix.to_owned());
    if let Ok(style) = ProgressStyle::with_template("{prefix:>14} [{bar:20.cyan/blue}] {msg}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

fn progress_bar(spec: &LoadSpec, prefix: &str) -> ProgressBar {
    let total = spec.warmup + spec.duration;
    progress_bar_len(spec.progress, prefix, u64::try_from(total.as_millis()).unwrap_or(u64::MAX))
}

/// Updates the bar ten times a second with the phase and the current rate.
async fn tick(bar: ProgressBar, began: Instant, window: Window, live: Arc<Live>) {
    let total = window.end - began;
    let mut last = (Instant::now(), 0u64);
    let mut interval = tokio::time::interval(Duration::from_millis(100));
    loop {
        interval.tick().await;
        let now = Instant::now();
        let pairs = live.pairs.load(Ordering::Relaxed);
        let rate = (pairs - last.1) as f64 / (now - last.0).as_secs_f64().max(1e-3);
        last = (now, pairs);
        let phase = if now < window.start { "warm-up" } else { "measuring" };
        bar.set_position(u64::try_from((now - began).min(total).as_millis()).unwrap_or(0));
        let errors = match live.errors.load(Ordering::Relaxed) {
            0 => String::new(),
            n => format!(", {n} errors"),
        };
        bar.set_message(format!(
            "{:.1}/{:.1}s {phase} {rate:>6.0} pairs/s{errors}",
            (now - began).min(total).as_secs_f64(),
            total.as_secs_f64(),
        ));
    }
}
