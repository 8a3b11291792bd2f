//! `allot bench watch`: the change feed (`GET /v1/watch`, Server-Sent Events) under load, on a
//! daemon it starts at the process level of durability.
//!
//! - **delay**: one watcher of a namespace's grants; each sample allocates a token and measures
//!   from the allocate's answer to the event's arrival at the watcher (0 when the event came
//!   first: the feed is published before the caller is answered);
//! - **with watchers**: allocate+release pairs with no watcher, then with `--watchers` watchers
//!   attached that watch other keys (pools nobody uses: what a shim's or an executor's watchers
//!   are to a busy namespace), then with as many that watch the pairs' namespace and read every
//!   event, alternating for `--rounds` rounds; the ratios of the medians; with the watchers of
//!   every event, how many events they received a second and the CPU the daemon and the load
//!   generator used meanwhile (what each event delivered costs), and how many watchers ended
//!   before the run did (fell behind);
//!   and how far behind they were (the lag: from an event's decision, by the daemon's clock, to
//!   its arrival, by this machine's wall clock, less how far apart the two clocks are as the
//!   delay samples at idle find them; millisecond resolution);
//! - **idle watchers**: `--idle` watchers of a key nothing changes; the daemon's resident memory
//!   before and after, per watcher;
//! - **through a second daemon**: two daemons on a Redis server the bench starts; the delay from
//!   an allocate's answer through one to its event at a watcher on the other.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::{Buf, BytesMut};
use hyper::body::Bytes;
use hyper::{Method, StatusCode};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use allot_client::sse;

use crate::children::{self, Scratch, Server};
use crate::http::{encode_segment, open_stream, Conn, Endpoint, Stream};
use crate::latency::Latency;
use crate::load::{self, LoadSpec, Target};
use crate::placement::Placement;
use crate::report::{self, Check};
use crate::WatchArgs;

/// The delay target at p99 (ms), a watcher on the same daemon.
const MAX_DELAY_P99_MS: f64 = 5.0;
/// The delay target at p99 (ms), a watcher on a second daemon on one Redis.
const MAX_REDIS_DELAY_P99_MS: f64 = 50.0;
/// Pairs with watchers attached, as a share of the rate without.
const MIN_RATE_WITH_WATCHERS: f64 = 0.8;
/// Pairs with watchers of every event attached, as a share of the rate without (issue 41).
const MIN_RATE_WITH_WATCHERS_OF_ALL: f64 = 0.9;
/// The lag of a watcher of every event under the pairs' load, at p99 (ms).
const MAX_LAG_P99_MS: f64 = 100.0;
/// The resident memory an idle watcher may cost the daemon (KiB).
const MAX_KIB_PER_IDLE_WATCHER: f64 = 16.0;
/// How long to wait for an event that should come.
const EVENT_TIMEOUT: Duration = Duration::from_secs(5);

/// The JSON output of `allot bench watch --json`.
#[derive(Serialize)]
struct WatchOutput {
    url: String,
    samples: usize,
    /// From an allocate's answer to its event's arrival at the watcher.
    delay_ms: Latency,
    /// The same through a second daemon on one Redis, when measured.
    redis_samples: usize,
    redis_delay_ms: Option<Latency>,
    watchers: usize,
    /// Pairs/s per round: without watchers, with watchers of other keys, with watchers of every
    /// event of the pairs.
    pairs_without: Vec<f64>,
    pairs_with: Vec<f64>,
    pairs_with_all: Vec<f64>,
    /// The medians with watchers over the median without.
    ratio: Option<f64>,
    ratio_all: Option<f64>,
    /// Per round, with the watchers of every event: what they received and what it cost.
    fan_out: Vec<FanOut>,
    /// With the watchers of every event, under the pairs' load: from each event's decision to
    /// its arrival at the first watcher, every round (ms, at millisecond resolution).
    lag_ms: Latency,
    /// The daemon's CPU time per pair without watchers (µs), the median of the rounds.
    daemon_us_per_pair: Option<f64>,
    /// The daemon's CPU time per event delivered to a watcher of every event, beyond what its
    /// pairs cost without watchers (µs), the median of the rounds; the load generator's per event
    /// received (µs; its watchers and its clients share the process).
    daemon_us_per_event: Option<f64>,
    bench_us_per_event: Option<f64>,
    idle_watchers: usize,
    /// The daemon's resident memory per idle watcher (KiB), when its process is known.
    kib_per_idle_watcher: Option<f64>,
    /// The same per idle keep-alive connection that asked one `/healthz` (no watch), on a fresh
    /// daemon: what any HTTP/1.1 connection costs it.
    kib_per_idle_connection: Option<f64>,
    checks: Vec<Check>,
}

/// One run of pairs with the watchers of every event attached.
#[derive(Debug, Clone, Serialize)]
struct FanOut {
    pairs_per_s: f64,
    /// Events (messages with data) all the watchers received a second, over the run and its warmup.
    events_per_s: f64,
    /// CPU time over the same time, in CPUs (1.0: a core busy all along).
    daemon_cpus: Option<f64>,
    bench_cpus: Option<f64>,
    /// Watchers whose stream ended before the run did (a watcher that falls behind is ended).
    ended: usize,
}

/// Runs `allot bench watch`.
pub(super) async fn run(args: WatchArgs) -> anyhow::Result<()> {
    if args.samples == 0 || args.clients == 0 || args.rounds == 0 {
        bail!("--samples, --clients and --rounds must be at least 1");
    }
    let scratch = Scratch::new(args.tmp_dir.as_deref())?;
    let placement = Placement::pinned(args.pin)?;
    let level = ["--durability".into(), "process".into()];
    let server = children::spawn_daemon_on(&scratch, &level, placement.as_ref().map(|p| &p.servers[..])).await?;
    if let Some(Placement { load, .. }) = &placement {
        if let Err(err) = allot_host::affinity::restrict_process(load) {
            server.stop().await;
            bail!("--pin: cannot move the load generator to CPUs {load:?}: {err}");
        }
    }
    let outcome = measure(&args, &server).await;
    server.stop().await;
    let output = outcome?;
    if args.output.json {
        println!("{}", serde_json::to_string_pretty(&output)?);
    } else {
        let d = &output.delay_ms;
        println!("watch ({}), ms from an allocate's answer to its event:", output.url);
        println!(
            "  p50 {:.3}  p90 {:.3}  p99 {:.3}  max {:.3}  ({} samples)",
            d.p50, d.p90, d.p99, d.max, output.samples
        );
        if let Some(d) = &output.redis_delay_ms {
            println!(
                "  through a second daemon on one Redis: p50 {:.3}  p90 {:.3}  p99 {:.3}  max {:.3}  ({} samples)",
                d.p50, d.p90, d.p99, d.max, output.redis_samples
            );
        }
        let ratio = |r: Option<f64>| r.map_or("-".to_owned(), |r| format!("{r:.2}"));
        println!("pairs/s without watchers {:?}", output.pairs_without);
        println!(
            "  with {} watchers of other keys {:?}: ratio {}",
            output.watchers,
            output.pairs_with,
            ratio(output.ratio)
        );
        println!(
            "  with {} watchers of every pair's events {:?}: ratio {}",
            output.watchers,
            output.pairs_with_all,
            ratio(output.ratio_all)
        );
        let cpus = |c: Option<f64>| c.map_or("-".to_owned(), |c| format!("{c:.2}"));
        let l = &output.lag_ms;
        println!(
            "    lag of a watcher of every event, decision to arrival: p50 {:.0}  p99 {:.0}  max {:.0} ms ({} events)",
            l.p50, l.p99, l.max, l.count
        );
        for round in &output.fan_out {
            println!(
                "    {:.0} events/s received, daemon {} CPUs, load generator {} CPUs, {} watchers ended early",
                round.events_per_s,
                cpus(round.daemon_cpus),
                cpus(round.bench_cpus),
                round.ended
            );
        }
        let us = |u: Option<f64>| u.map_or("-".to_owned(), |u| format!("{u:.2}"));
        println!(
            "  CPU µs: daemon per pair without watchers {}, per event delivered {}; load generator per event \
             received {}",
            us(output.daemon_us_per_pair),
            us(output.daemon_us_per_event),
            us(output.bench_us_per_event)
        );
        match (output.kib_per_idle_watcher, output.kib_per_idle_connection) {
            (Some(kib), Some(plain)) => println!(
                "{} idle watchers: {kib:.1} KiB each (an idle keep-alive connection without a watch: {plain:.1} KiB)",
                output.idle_watchers
            ),
            _ => println!("{} idle watchers: memory not measured", output.idle_watchers),
        }
        println!("targets:");
        print!("{}", report::checks(&output.checks));
    }
    if args.check && output.checks.iter().any(|check| !check.ok) {
        bail!("the daemon missed a target");
    }
    Ok(())
}

async fn measure(args: &WatchArgs, server: &Server) -> anyhow::Result<WatchOutput> {
    let endpoint = server.endpoint.clone();
    let namespace = format!("bench-watch-{}", load::run_id());
    load::setup_namespace(&endpoint, &namespace, 1_000_000).await?;
    let (delays, skew_ms) = delays(&endpoint, &endpoint, &namespace, args.samples).await?;
    let redis_delay_ms = match args.redis_samples {
        0 => None,
        samples => Some(Latency::from_nanos(redis_delays(args, samples).await?)),
    };

    let target = Target::allot("allot", endpoint.clone(), &namespace).with_pid(server.pid());
    let spec = LoadSpec {
        clients: args.clients,
        warmup: Duration::from_millis(500),
        duration: args.duration,
        timeout: Duration::from_secs(10),
        progress: false,
    };
    let (mut without, mut with, mut with_all) = (Vec::new(), Vec::new(), Vec::new());
    let (mut fan_out, mut us_per_pair, mut us_per_event, mut bench_us_per_event) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut lags = Vec::new();
    let others = format!("prefix=pools/bench-others-{}", load::run_id());
    let everything = format!("prefix=namespaces/{}", encode_segment(&namespace));
    // Each load starts once the daemon is done with the one before (its checkpoint of the log the
    // pairs wrote), which would otherwise be counted against it.
    let pids: Vec<u32> = server.pid().into_iter().collect();
    for _ in 0..args.rounds {
        crate::cpu::settle(&pids).await;
        let alone = load::run_load(&target, &spec).await?;
        without.push(alone.pairs_per_s);
        us_per_pair.extend(alone.server_cpu_us_per_pair);
        let readers = attach(&endpoint, args.watchers, &others).await?;
        crate::cpu::settle(&pids).await;
        with.push(load::run_load(&target, &spec).await?.pairs_per_s);
        readers.stop();
        let readers = attach(&endpoint, args.watchers, &everything).await?;
        crate::cpu::settle(&pids).await;
        let before = Usage::now(server.pid(), &readers);
        let loaded = load::run_load(&target, &spec).await?;
        let usage = Usage::now(server.pid(), &readers).since(&before);
        lags.extend(readers.lags.lock().unwrap_or_else(|p| p.into_inner()).drain(..));
        with_all.push(loaded.pairs_per_s);
        let round = FanOut {
            pairs_per_s: loaded.pairs_per_s,
            events_per_s: usage.events / usage.seconds,
            daemon_cpus: usage.daemon.map(|cpu| cpu / usage.seconds),
            bench_cpus: usage.bench.map(|cpu| cpu / usage.seconds),
            ended: readers.ended(),
        };
        readers.stop();
        // The daemon's CPU beyond its pairs' (at the rate of the round without watchers).
        if let (Some(daemon), Some(per_pair)) = (usage.daemon, alone.server_cpu_us_per_pair) {
            if usage.events > 0.0 {
                let pairs = loaded.pairs_per_s * usage.seconds;
                us_per_event.push((daemon * 1e6 - pairs * per_pair) / usage.events);
            }
        }
        if let Some(bench) = usage.bench.filter(|_| usage.events > 0.0) {
            bench_us_per_event.push(bench * 1e6 / usage.events);
        }
        fan_out.push(round);
    }
    let ratio_of = |rates: &[f64]| match (report::median(without.clone()), report::median(rates.to_vec())) {
        (Some(base), Some(loaded)) if base > 0.0 => Some(loaded / base),
        _ => None,
    };
    let (ratio, ratio_all) = (ratio_of(&with), ratio_of(&with_all));

    let (kib_per_idle_watcher, kib_per_idle_connection) = match server.pid() {
        Some(pid) if args.idle > 0 => {
            let before = resident_kib(pid)?;
            let idle = open_idle(&endpoint, args.idle).await?;
            // Let the daemon settle what it allocated for them.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let watchers = resident_kib(pid)?;
            drop(idle);
            // As many plain connections, on a fresh daemon (memory freed by the watchers would be
            // reused and hide their cost).
            let fresh_scratch = Scratch::new(args.tmp_dir.as_deref())?;
            let fresh = children::spawn_daemon_with(&fresh_scratch, &["--durability".into(), "process".into()]).await?;
            let plain = match fresh.pid() {
                Some(fresh_pid) => {
                    let before_plain = resident_kib(fresh_pid)?;
                    let conns = open_plain(&fresh.endpoint, args.idle).await;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    let after_plain = resident_kib(fresh_pid);
                    drop(conns);
                    Some((before_plain, after_plain?))
                }
                None => None,
            };
            fresh.stop().await;
            let per = |from: u64, to: u64| to.saturating_sub(from) as f64 / args.idle as f64;
            (Some(per(before, watchers)), plain.map(|(from, to)| per(from, to)))
        }
        _ => (None, None),
    };
    let delay_ms = Latency::from_nanos(delays);
    // Less the daemon clock's distance from this machine's wall clock (measured at idle above).
    let lag_ms = Latency::from_nanos(lags.into_iter().map(|ms| (ms - skew_ms).max(0) as u64 * 1_000_000).collect());
    let mut checks = vec![
        Check::at_most(
            "p99 delay to a watcher on the same daemon (ms)".to_owned(),
            Some(delay_ms.p99),
            MAX_DELAY_P99_MS,
        ),
        Check::at_least(
            format!("pairs/s with {} watchers of other keys / without", args.watchers),
            ratio,
            MIN_RATE_WITH_WATCHERS,
        ),
    ];
    if args.watchers == 1 {
        // Issue 41's targets are for one watcher of everything (a dashboard, a shim).
        checks.push(Check::at_least(
            "pairs/s with 1 watcher of every event / without".to_owned(),
            ratio_all,
            MIN_RATE_WITH_WATCHERS_OF_ALL,
        ));
        checks.push(Check::at_most(
            "p99 lag of a watcher of every event under the pairs' load (ms)".to_owned(),
            (lag_ms.count > 0).then_some(lag_ms.p99),
            MAX_LAG_P99_MS,
        ));
    }
    if let Some(redis) = &redis_delay_ms {
        checks.push(Check::at_most(
            "p99 delay to a watcher on a second daemon on one Redis (ms)".to_owned(),
            Some(redis.p99),
            MAX_REDIS_DELAY_P99_MS,
        ));
    }
    if args.idle > 0 {
        checks.push(Check::at_most(
            format!("daemon memory per idle watcher, {} of them (KiB)", args.idle),
            kib_per_idle_watcher,
            MAX_KIB_PER_IDLE_WATCHER,
        ));
    }
    Ok(WatchOutput {
        url: endpoint.url(),
        samples: args.samples,
        delay_ms,
        redis_samples: args.redis_samples,
        redis_delay_ms,
        watchers: args.watchers,
        pairs_without: without,
        pairs_with: with,
        pairs_with_all: with_all,
        ratio,
        ratio_all,
        fan_out,
        lag_ms,
        daemon_us_per_pair: report::median(us_per_pair),
        daemon_us_per_event: report::median(us_per_event),
        bench_us_per_event: report::median(bench_us_per_event),
        idle_watchers: args.idle,
        kib_per_idle_watcher,
        kib_per_idle_connection,
        checks,
    })
}

/// `samples` delays (ns) from an allocate's answer through one daemon to its event at a watcher on
/// another, both on a Redis server of the bench's own.
async fn redis_delays(args: &WatchArgs, samples: usize) -> anyhow::Result<Vec<u64>> {
    let redis = allot_host::redis::RedisServer::start();
    let store: [std::ffi::OsString; 2] = ["--store".into(), redis.url().into()];
    let (first, second) = (Scratch::new(args.tmp_dir.as_deref())?, Scratch::new(args.tmp_dir.as_deref())?);
    let writer = children::spawn_daemon_with(&first, &store).await?;
    let watcher = children::spawn_daemon_with(&second, &store).await?;
    let namespace = format!("bench-watch-{}", load::run_id());
    let measured = async {
        load::setup_namespace(&writer.endpoint, &namespace, 1_000_000).await?;
        delays(&writer.endpoint, &watcher.endpoint, &namespace, samples).await.map(|(delays, _)| delays)
    }
    .await;
    writer.stop().await;
    watcher.stop().await;
    measured
}

/// `samples` delays (ns) from an allocate's answer through `writer` to its event at a watcher on
/// `watcher` (the same daemon, or another on the same store).
async fn delays(
    writer: &Endpoint,
    watcher: &Endpoint,
    namespace: &str,
    samples: usize,
) -> anyhow::Result<(Vec<u64>, i64)> {
    let query = format!("kind=grant.granted&prefix=namespaces/{}", encode_segment(namespace));
    let mut stream = EventStream::open(watcher, &query).await?;
    let (arrivals, mut arrived) = mpsc::unbounded_channel::<(String, Instant, i64)>();
    let reader = tokio::spawn(async move {
        while let Ok(Some(message)) = stream.next().await {
            let at = Instant::now();
            let data = message.data.as_deref();
            // Each event comes at once here: this machine's wall clock less the event's time is
            // how far the daemon's clock is from it.
            let skew = data.and_then(at_ms).map_or(0, |at| wall_ms() as i64 - at as i64);
            if let Some(key) = data.and_then(key_of) {
                if arrivals.send((key, at, skew)).is_err() {
                    return;
                }
            }
        }
    });
    let mut conn = Conn::connect(writer).await?;
    let grants = format!("/v1/namespaces/{}/grants/", encode_segment(namespace));
    let mut early: HashMap<String, Instant> = HashMap::new();
    let mut delays = Vec::with_capacity(samples);
    let mut skews = Vec::with_capacity(samples);
    let run = load::run_id();
    for i in 0..samples {
        let token = format!("{run}-{i}");
        let (status, body) = conn.request(Method::PUT, &format!("{grants}{token}"), Bytes::new()).await?;
        let answered = Instant::now();
        if status != StatusCode::OK || !body.starts_with(br#"{"status":"Granted""#) {
            bail!("the allocate of `{token}` was answered {status}: {}", String::from_utf8_lossy(&body));
        }
        let key = format!("namespaces/{namespace}/grants/{token}");
        let at = loop {
            if let Some(at) = early.remove(&key) {
                break at;
            }
            match tokio::time::timeout(EVENT_TIMEOUT, arrived.recv()).await {
                Ok(Some((seen, at, skew))) if seen == key => {
                    skews.push(skew);
                    break at;
                }
                Ok(Some((seen, at, _))) => drop(early.insert(seen, at)),
                Ok(None) => bail!("the watch ended"),
                Err(_) => bail!("no event for `{key}` within {EVENT_TIMEOUT:?}"),
            }
        };
        delays.push(u64::try_from(at.saturating_duration_since(answered).as_nanos()).unwrap_or(u64::MAX));
        conn.request(Method::DELETE, &format!("{grants}{token}"), Bytes::new()).await?;
    }
    reader.abort();
    skews.sort_unstable();
    Ok((delays, skews.get(skews.len() / 2).copied().unwrap_or(0)))
}

/// The `at_ms` of an event's JSON data, read without parsing the rest.
fn at_ms(data: &str) -> Option<u64> {
    let rest = &data[data.find("\"at_ms\":")? + "\"at_ms\":".len()..];
    let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    rest[..digits].parse().ok()
}

/// This machine's wall clock, in milliseconds since the Unix epoch.
fn wall_ms() -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    u64::try_from(now.as_millis()).unwrap_or(u64::MAX)
}

/// The `key` of an event's JSON data.
fn key_of(data: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(data).ok()?;
    value.get("key")?.as_str().map(str::to_owned)
}

/// Watchers read to the end, each by a task of its own, the events they received, and the lag
/// of each event at the first of them (ms).
pub(super) struct Readers {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    events: Arc<AtomicU64>,
    lags: Arc<std::sync::Mutex<Vec<i64>>>,
}

impl Readers {
    /// How many have ended (their stream did).
    pub(super) fn ended(&self) -> usize {
        self.tasks.iter().filter(|task| task.is_finished()).count()
    }

    pub(super) fn stop(self) {
        self.tasks.into_iter().for_each(|task| task.abort());
    }
}

/// `count` watchers of `query`.
pub(super) async fn attach(endpoint: &Endpoint, count: usize, query: &str) -> anyhow::Result<Readers> {
    let events = Arc::new(AtomicU64::new(0));
    let lags = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::with_capacity(count);
    for index in 0..count {
        let mut stream = EventStream::open(endpoint, query).await?;
        let (events, lags) = (events.clone(), lags.clone());
        tasks.push(tokio::spawn(async move {
            while let Ok(Some(message)) = stream.next().await {
                if message.event.as_deref() != Some("behind") {
                    events.fetch_add(1, Ordering::Relaxed);
                }
                if let Some(at) = message.data.as_deref().and_then(at_ms).filter(|_| index == 0) {
                    let lag = wall_ms() as i64 - at as i64;
                    lags.lock().unwrap_or_else(|p| p.into_inner()).push(lag);
                }
            }
        }));
    }
    Ok(Readers { tasks, events, lags })
}

/// The events watchers had received and the CPU time the daemon and this process had used, at a
/// moment.
struct Usage {
    at: Instant,
    events: u64,
    daemon: Option<f64>,
    bench: Option<f64>,
}

/// What was received and used between two moments.
struct Spent {
    seconds: f64,
    events: f64,
    daemon: Option<f64>,
    bench: Option<f64>,
}

impl Usage {
    fn now(daemon: Option<u32>, readers: &Readers) -> Usage {
        Usage {
            at: Instant::now(),
            events: readers.events.load(Ordering::Relaxed),
            daemon: daemon.and_then(crate::cpu::process_cpu_seconds),
            bench: crate::cpu::process_cpu_seconds(std::process::id()),
        }
    }

    /// From `before` to this.
    fn since(&self, before: &Usage) -> Spent {
        let minus = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a - b);
        Spent {
            seconds: self.at.duration_since(before.at).as_secs_f64().max(1e-9),
            events: self.events.saturating_sub(before.events) as f64,
            daemon: minus(self.daemon, before.daemon),
            bench: minus(self.bench, before.bench),
        }
    }
}

/// `count` watchers of a key nothing changes, opened (their answer's head read) and kept.
async fn open_idle(endpoint: &Endpoint, count: usize) -> anyhow::Result<Vec<EventStream>> {
    let query = format!("prefix=pools/bench-idle-{}", load::run_id());
    let mut streams = Vec::with_capacity(count);
    for i in 0..count {
        streams.push(EventStream::open(endpoint, &query).await.with_context(|| format!("idle watcher {i}"))?);
    }
    Ok(streams)
}

/// `count` keep-alive connections that each asked `/healthz` once, kept open and idle.
async fn open_plain(endpoint: &Endpoint, count: usize) -> anyhow::Result<Vec<Conn>> {
    let mut conns = Vec::with_capacity(count);
    for i in 0..count {
        let mut conn = Conn::connect(endpoint).await.with_context(|| format!("idle connection {i}"))?;
        conn.request(Method::GET, "/healthz", Bytes::new()).await?;
        conns.push(conn);
    }
    Ok(conns)
}

/// The resident memory of process `pid` (KiB), from `/proc`.
pub(super) fn resident_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).context("cannot read the daemon's status")?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).context("no VmRSS in /proc status")?;
    line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).context("unreadable VmRSS")
}

/// A watch over one raw HTTP/1.1 connection: the answer's chunks decoded as they come, and read
/// into messages by the client's Server-Sent Events parser.
struct EventStream {
    stream: Stream,
    /// Bytes read and not decoded yet.
    input: BytesMut,
    messages: sse::Parser,
    chunked: bool,
}

impl EventStream {
    async fn open(endpoint: &Endpoint, query: &str) -> anyhow::Result<EventStream> {
        let mut stream = open_stream(endpoint).await?;
        let request = format!(
            "GET {}/v1/watch?{query} HTTP/1.1\r\nhost: {}\r\naccept: text/event-stream\r\n{}\r\n",
            endpoint.prefix, endpoint.authority, endpoint.headers
        );
        stream.write_all(request.as_bytes()).await?;
        let mut input = BytesMut::with_capacity(4096);
        let (status, head_len, chunked) = loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut answer = httparse::Response::new(&mut headers);
            if let httparse::Status::Complete(len) = answer.parse(&input).context("not HTTP/1.1")? {
                let chunked = answer.headers.iter().any(|h| {
                    h.name.eq_ignore_ascii_case("transfer-encoding") && h.value.eq_ignore_ascii_case(b"chunked")
                });
                break (answer.code.unwrap_or(0), len, chunked);
            }
            if stream.read_buf(&mut input).await? == 0 {
                bail!("the daemon closed the watch before answering");
            }
        };
        if status != 200 {
            bail!("GET /v1/watch?{query} was answered {status}: {}", String::from_utf8_lossy(&input[head_len..]));
        }
        input.advance(head_len);
        Ok(EventStream { stream, input, messages: sse::Parser::default(), chunked })
    }

    /// The next message with data (heartbeats are passed over), or `None` when the stream ends.
    async fn next(&mut self) -> anyhow::Result<Option<sse::Message>> {
        loop {
            while let Some(message) = self.messages.message() {
                if message.data.is_some() {
                    return Ok(Some(message));
                }
            }
            if !self.decode()? && self.stream.read_buf(&mut self.input).await? == 0 {
                return Ok(None);
            }
        }
    }

    /// Feeds whole chunks (or everything, when not chunked) of the input to the parser; false
    /// when more must be read first.
    fn decode(&mut self) -> anyhow::Result<bool> {
        if !self.chunked {
            let moved = !self.input.is_empty();
            self.messages.feed(&self.input.split());
            return Ok(moved);
        }
        let mut moved = false;
        while let Some(line) = find(&self.input, b"\r\n") {
            let size = std::str::from_utf8(&self.input[..line])
                .ok()
                .and_then(|s| usize::from_str_radix(s.split(';').next().unwrap_or("").trim(), 16).ok())
                .context("a bad chunk size")?;
            if self.input.len() < line + 2 + size + 2 {
                break;
            }
            self.input.advance(line + 2);
            let chunk = self.input.split_to(size);
            self.input.advance(2);
            self.messages.feed(&chunk);
            moved = true;
            if size == 0 {
                break;
            }
        }
        Ok(moved)
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_read_from_event_data() {
        assert_eq!(
            key_of(r#"{"revision":3,"kind":"grant.granted","key":"namespaces/a/grants/t"}"#).as_deref(),
            Some("namespaces/a/grants/t")
        );
        assert_eq!(key_of("not json"), None);
    }

    #[test]
    fn the_time_of_an_event_is_read_from_its_data() {
        let data = r#"{"revision":3,"kind":"grant.granted","key":"k","cause":null,"at_ms":1764374400123,"object":{}}"#;
        assert_eq!(at_ms(data), Some(1_764_374_400_123));
        assert_eq!(at_ms(r#"{"at_ms":7}"#), Some(7));
        assert_eq!(at_ms(r#"{"revision":3}"#), None);
        assert_eq!(at_ms(r#"{"at_ms":"x"}"#), None);
    }
}
