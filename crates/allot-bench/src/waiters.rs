//! `allot bench waiters`: many long-poll waiters on one daemon (issue 43, point 5).
//!
//! A fresh daemon (embedded store, `--durability`) gets one namespace whose quota (`--quota`,
//! default 100) is held whole by as many grants. Then `--waiters` allocates (default 100,000) of
//! one unit each, with `wait_ms` the daemon's longest, are sent as HTTP/2 streams over
//! `--connections` connections (h2c, prior knowledge), until the namespace lists every one as
//! waiting. Then:
//!
//! - **memory**: the daemon's resident memory before the waiters and with all of them, per waiter;
//! - **handover**: the holders release the quota; each waiter, as its grant arrives, releases it
//!   at once on its own connection, so the quota passes along the queue unit by unit. The rate is
//!   the waiters over the time from the first release sent to the last grant received;
//! - **order**: the queue's order is read (the waiter list, paged) before the handover; every
//!   grant's fencing number must grow along it: the quota was handed in arrival order.
//!
//! With `--server`, the waiters go to a daemon already running (its memory is not measured).
//!
//! Targets: ≤ 4 KiB per waiter, ≥ 5,000 grants/s handed over, every grant in order.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http2;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Serialize;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::children::{self, Scratch};
use crate::http::{Conn, Endpoint};
use crate::report::{self, Check};
use crate::watch::resident_kib;
use crate::WaitersBenchArgs;

const MAX_BYTES_PER_WAITER: f64 = 4096.0;
const MIN_HANDOVER_PER_S: f64 = 5000.0;
const NAMESPACE: &str = "bench-waiters";
/// How long each waiter asks to wait: the daemon's longest (`MAX_WAIT`).
const WAIT_MS: u64 = 300_000;

#[derive(Debug, Serialize)]
struct Output {
    durability: String,
    waiters: usize,
    connections: usize,
    quota: u64,
    /// How fast the waiters were queued (sent until all listed).
    queued_per_s: f64,
    /// The daemon's resident memory (not measured with `--server`).
    before_kib: Option<u64>,
    with_waiters_kib: Option<u64>,
    bytes_per_waiter: Option<f64>,
    handover_s: f64,
    handover_per_s: f64,
    /// Grants whose fencing number is not above the one of the waiter before them in the queue.
    out_of_order: usize,
    checks: Vec<Check>,
}

/// What a waiter learned: its token's number, its grant's fencing number, when it came.
struct Granted {
    waiter: usize,
    fencing: u64,
    at: Instant,
}

pub(super) async fn run(args: WaitersBenchArgs) -> anyhow::Result<()> {
    if args.waiters == 0 || args.connections == 0 || args.quota == 0 {
        bail!("--waiters, --connections and --quota must be at least 1");
    }
    let scratch = Scratch::new(args.tmp_dir.as_deref())?;
    let more: Vec<std::ffi::OsString> = vec!["--durability".into(), args.durability.clone().into()];
    let daemon = match &args.server {
        Some(_) => None,
        None => Some(children::spawn_daemon_with(&scratch, &more).await?),
    };
    let endpoint = match (&daemon, &args.server) {
        (Some(daemon), _) => daemon.endpoint.clone(),
        (None, Some(url)) => Endpoint::parse(url)?,
        (None, None) => unreachable!("a daemon is started when no server is given"),
    };
    let pid = daemon.as_ref().and_then(children::Server::pid);
    let resident = || pid.map(resident_kib).transpose();
    crate::load::setup_namespace(&endpoint, NAMESPACE, args.quota).await?;
    let mut conn = Conn::connect(&endpoint).await?;
    for holder in 0..args.quota {
        let (status, answer) = conn.request(Method::PUT, &holder_path(holder), Bytes::from_static(b"{}")).await?;
        if status != StatusCode::OK {
            bail!("holder {holder}: {status}: {}", String::from_utf8_lossy(&answer));
        }
    }
    let mut connections = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        connections.push(connect_h2(&endpoint).await?);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before_kib = resident()?;

    // Every waiter sent, each on its connection's stream, and listed by the daemon.
    let started = Instant::now();
    let (granted_tx, mut granted_rx) = mpsc::unbounded_channel();
    let mut waiting = Vec::with_capacity(args.waiters);
    for waiter in 0..args.waiters {
        let sender = connections[waiter % args.connections].clone();
        let (granted_tx, authority) = (granted_tx.clone(), endpoint.authority.clone());
        waiting.push(tokio::spawn(async move {
            let granted = wait_then_release(sender, &authority, waiter).await?;
            let _ = granted_tx.send(granted);
            Ok::<_, anyhow::Error>(())
        }));
    }
    drop(granted_tx);
    wait_listed(&mut conn, args.waiters as u64).await?;
    let queued_per_s = args.waiters as f64 / started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let with_waiters_kib = resident()?;
    eprintln!("{} waiters queued ({queued_per_s:.0}/s)", args.waiters);
    let arrival = queue_order(&mut conn).await?;
    if arrival.len() != args.waiters {
        bail!("the waiter list holds {} waiters, not {}", arrival.len(), args.waiters);
    }

    // The quota handed along the queue.
    let released = Instant::now();
    let mut holders = Vec::new();
    for holder in 0..args.quota {
        let endpoint = endpoint.clone();
        holders.push(tokio::spawn(async move {
            let mut conn = Conn::connect(&endpoint).await?;
            let (status, answer) = conn.request(Method::DELETE, &holder_path(holder), Bytes::new()).await?;
            if status != StatusCode::OK {
                bail!("releasing holder {holder}: {status}: {}", String::from_utf8_lossy(&answer));
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    let mut grants = Vec::with_capacity(args.waiters);
    while let Some(granted) = granted_rx.recv().await {
        grants.push(granted);
    }
    for task in holders.into_iter().chain(waiting) {
        task.await.context("a client task")??;
    }
    if grants.len() != args.waiters {
        bail!("{} of {} waiters got their grant", grants.len(), args.waiters);
    }
    let last = grants.iter().map(|g| g.at).max().expect("at least one waiter");
    let handover_s = last.duration_since(released).as_secs_f64();
    let handover_per_s = args.waiters as f64 / handover_s;
    let out_of_order = out_of_order(&grants, &arrival);
    if let Some(daemon) = daemon {
        daemon.stop().await;
    }

    let bytes_per_waiter = before_kib
        .zip(with_waiters_kib)
        .map(|(before, with)| (with as f64 - before as f64) * 1024.0 / args.waiters as f64);
    let checks = vec![
        Check::at_most("memory per waiter (bytes)".into(), bytes_per_waiter, MAX_BYTES_PER_WAITER),
        Check::at_least("grants handed over per second".into(), Some(handover_per_s), MIN_HANDOVER_PER_S),
        Check::at_most("grants out of the queue's order".into(), Some(out_of_order as f64), 0.0),
    ];
    let output = Output {
        durability: args.durability.clone(),
        waiters: args.waiters,
        connections: args.connections,
        quota: args.quota,
        queued_per_s,
        before_kib,
        with_waiters_kib,
        bytes_per_waiter,
        handover_s,
        handover_per_s,
        out_of_order,
        checks: checks.clone(),
    };
    report::finish(&output, args.output.json, print, args.check, &checks)
}

fn print(o: &Output) {
    println!(
        "{} waiters on one namespace (quota {}, durability {}) over {} HTTP/2 connections, queued at {:.0}/s",
        o.waiters, o.quota, o.durability, o.connections, o.queued_per_s
    );
    if let (Some(before), Some(with), Some(per)) = (o.before_kib, o.with_waiters_kib, o.bytes_per_waiter) {
        println!("  memory: {before} KiB before, {with} KiB with the waiters ({per:.0} bytes per waiter)");
    }
    println!(
        "  handover: every waiter granted (and released) within {:.3} s of the quota's release: {:.0} grants/s, {} \
         out of order",
        o.handover_s, o.handover_per_s, o.out_of_order
    );
    println!("targets:");
    print!("{}", report::checks(&o.checks));
}

fn holder_path(holder: u64) -> String {
    format!("/v1/namespaces/{NAMESPACE}/grants/holder-{holder}")
}

fn waiter_token(waiter: usize) -> String {
    format!("w-{waiter}")
}

/// An HTTP/2 connection with prior knowledge, driven on a task of its own.
async fn connect_h2(endpoint: &Endpoint) -> anyhow::Result<http2::SendRequest<Full<Bytes>>> {
    if endpoint.tls.is_some() {
        bail!("bench waiters speaks h2c only (a plaintext daemon)");
    }
    let tcp = TcpStream::connect(&endpoint.authority)
        .await
        .with_context(|| format!("cannot connect to {}", endpoint.authority))?;
    tcp.set_nodelay(true)?;
    let (sender, connection) =
        http2::Builder::new(TokioExecutor::new()).handshake(TokioIo::new(tcp)).await.context("the HTTP/2 handshake")?;
    tokio::spawn(async move {
        if let Err(err) = connection.await {
            eprintln!("an HTTP/2 connection ended: {err}");
        }
    });
    Ok(sender)
}

/// One request over an HTTP/2 connection: its status and body.
async fn h2_request(
    sender: &mut http2::SendRequest<Full<Bytes>>,
    authority: &str,
    method: Method,
    path: &str,
    body: Bytes,
) -> anyhow::Result<(StatusCode, Bytes)> {
    let request = Request::builder()
        .method(method)
        .uri(format!("http://{authority}{path}"))
        .header("content-type", "application/json")
        .body(Full::new(body))?;
    sender.ready().await.context("the HTTP/2 connection")?;
    let answer = sender.send_request(request).await.context("an HTTP/2 request")?;
    let status = answer.status();
    let body = answer.into_body().collect().await.context("an HTTP/2 answer's body")?.to_bytes();
    Ok((status, body))
}

/// Waits for one unit, then releases it at once: the waiter's grant as it arrived.
async fn wait_then_release(
    mut sender: http2::SendRequest<Full<Bytes>>,
    authority: &str,
    waiter: usize,
) -> anyhow::Result<Granted> {
    let path = format!("/v1/namespaces/{NAMESPACE}/grants/{}", waiter_token(waiter));
    let body = Bytes::from(format!(r#"{{"wait_ms":{WAIT_MS}}}"#));
    let (status, answer) = h2_request(&mut sender, authority, Method::PUT, &path, body).await?;
    let at = Instant::now();
    if status != StatusCode::OK {
        bail!("waiter {waiter}: {status}: {}", String::from_utf8_lossy(&answer));
    }
    let answer: allot_api::AllocateResponse = serde_json::from_slice(&answer).context("an allocate's answer")?;
    let Some(grant) = answer.grant else { bail!("waiter {waiter} was not granted: {:?}", answer.status) };
    let (status, answer) = h2_request(&mut sender, authority, Method::DELETE, &path, Bytes::new()).await?;
    if status != StatusCode::OK {
        bail!("releasing waiter {waiter}: {status}: {}", String::from_utf8_lossy(&answer));
    }
    Ok(Granted { waiter, fencing: grant.fencing, at })
}

/// Waits until the namespace lists `waiters` waiters.
async fn wait_listed(conn: &mut Conn, waiters: u64) -> anyhow::Result<()> {
    let path = format!("/v1/namespaces/{NAMESPACE}");
    let since = Instant::now();
    loop {
        let (status, answer) = conn.request(Method::GET, &path, Bytes::new()).await?;
        if status != StatusCode::OK {
            bail!("GET {path}: {status}: {}", String::from_utf8_lossy(&answer));
        }
        let namespace: allot_api::Namespace = serde_json::from_slice(&answer)?;
        if namespace.waiters >= waiters {
            return Ok(());
        }
        if since.elapsed() > Duration::from_millis(WAIT_MS / 2) {
            bail!("only {} of {waiters} waiters queued after {} s", namespace.waiters, WAIT_MS / 2000);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Each waiter's place in the queue (by its token's number), read from the waiter list.
async fn queue_order(conn: &mut Conn) -> anyhow::Result<HashMap<usize, usize>> {
    let mut order = HashMap::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(cursor) => format!("/v1/namespaces/{NAMESPACE}/waiters?limit=1000&cursor={cursor}"),
            None => format!("/v1/namespaces/{NAMESPACE}/waiters?limit=1000"),
        };
        let (status, answer) = conn.request(Method::GET, &path, Bytes::new()).await?;
        if status != StatusCode::OK {
            bail!("GET {path}: {status}: {}", String::from_utf8_lossy(&answer));
        }
        let page: allot_api::WaiterList = serde_json::from_slice(&answer)?;
        for waiter in page.waiters {
            let number = waiter.token.strip_prefix("w-").and_then(|n| n.parse().ok());
            let number = number.with_context(|| format!("a waiter of another bench: {}", waiter.token))?;
            let place = order.len();
            order.insert(number, place);
        }
        match page.next_cursor {
            Some(next) => cursor = Some(crate::http::encode_segment(&next)),
            None => return Ok(order),
        }
    }
}

/// How many grants, taken in the queue's order, carry a fencing number not above the one before.
fn out_of_order(grants: &[Granted], arrival: &HashMap<usize, usize>) -> usize {
    let mut by_place: Vec<(usize, u64)> =
        grants.iter().map(|g| (arrival.get(&g.waiter).copied().unwrap_or(usize::MAX), g.fencing)).collect();
    by_place.sort_unstable();
    by_place.windows(2).filter(|pair| pair[1].1 <= pair[0].1).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_out_of_the_queues_order_are_counted() {
        let at = Instant::now();
        let grant = |waiter, fencing| Granted { waiter, fencing, at };
        let arrival: HashMap<usize, usize> = [(7, 0), (3, 1), (5, 2)].into_iter().collect();
        assert_eq!(out_of_order(&[grant(3, 11), grant(7, 10), grant(5, 12)], &arrival), 0);
        assert_eq!(out_of_order(&[grant(3, 10), grant(7, 11), grant(5, 12)], &arrival), 1);
    }
}
