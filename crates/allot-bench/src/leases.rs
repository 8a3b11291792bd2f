//! `allot bench leases`: a million live TTL grants on one daemon's embedded store (issue 43,
//! point 4).
//!
//! A fresh daemon gets `--namespaces` namespaces (default 1,000) with room for every grant, then
//! `--grants` grants (default 1,000,000), each with its own TTL lease of an hour, spread evenly
//! over the namespaces, allocated by `--clients` keep-alive connections. Then:
//!
//! - **memory**: the daemon's resident memory, idle with its namespaces and with every grant, per
//!   grant; and the same after the restart below, against a fresh daemon's idle memory;
//! - **restart**: the daemon is killed with SIGKILL and started again on the same port and data
//!   directory; the time from the kill to the first 200 of a read (`GET` of a namespace), and
//!   when it first answered at all (503 `starting` while it reads its store);
//! - **disk**: the data directory's size (blocks used) per grant, after the restart;
//! - **expiry at once**: a tenth of the grants are released and allocated again with a TTL that
//!   ends them all at the same moment, while `--clients` connections run allocate+release pairs
//!   in another namespace; the answers' latencies around that moment (max and p99).
//!
//! - **a snapshot while serving** (issue 44, point 1): `--clients` connections run pairs for
//!   [`PAIRS_ALONE`], then again while `allot snapshot save` (under `nice -n 19`, as a backup job
//!   beside the daemon would run) takes the whole store (every grant); the pairs/s of the two,
//!   and the answers' latencies during the snapshot.
//!
//! Targets: ≤ 512 bytes of memory and ≤ 200 bytes of disk per grant, the restart ≤ 1 s, no
//! answer slower than 50 ms while the tenth expires; during the snapshot at least 0.8 of the
//! pairs/s without it, and no answer slower than 50 ms.
//!
//! With `--redis`, the daemon runs on a `redis-server` started for the run: Redis's
//! `used_memory` per grant and its files' blocks per grant are reported, with no targets.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hyper::body::Bytes;
use hyper::{Method, StatusCode};
use serde::Serialize;

use crate::children::{self, Scratch};
use crate::http::{Conn, Endpoint};
use crate::latency::Latency;
use crate::report::{self, Check};
use crate::watch::resident_kib;
use crate::LeasesBenchArgs;

const MAX_BYTES_PER_GRANT: f64 = 512.0;
const MAX_DISK_PER_GRANT: f64 = 200.0;
const MAX_RESTART_S: f64 = 1.0;
const MAX_EXPIRY_LATENCY_MS: f64 = 50.0;
const MIN_PAIRS_DURING_SNAPSHOT: f64 = 0.8;
const MAX_SNAPSHOT_LATENCY_MS: f64 = 50.0;
/// How long pairs run alone, for the pairs/s a snapshot is compared with.
const PAIRS_ALONE: Duration = Duration::from_secs(3);
/// The TTL of the grants that do not expire during the run.
const LONG_TTL_MS: u64 = 3_600_000;
/// The namespace of the pairs measured while the tenth expires.
const PAIRS_NAMESPACE: &str = "bench-pairs";

#[derive(Debug, Serialize)]
struct Output {
    durability: String,
    /// On Redis: Redis's `used_memory` with the grants less before them, per grant.
    redis_bytes_per_grant: Option<f64>,
    grants: usize,
    namespaces: usize,
    fill_per_s: f64,
    idle_kib: u64,
    full_kib: u64,
    bytes_per_grant: f64,
    fresh_idle_kib: u64,
    restarted_kib: u64,
    bytes_per_grant_after_restart: f64,
    disk_bytes: u64,
    disk_bytes_per_grant: f64,
    restart_first_answer_s: Option<f64>,
    restart_serving_s: f64,
    /// The embedded store's open after the restart, from the daemon's log: milliseconds spent
    /// reading the log (and writing it into the database, when it must be first), and reading
    /// the records and the kept events.
    restart_log_ms: Option<u64>,
    restart_read_ms: Option<u64>,
    /// The grants the daemon held after the restart (every one, or the bench fails).
    restored: u64,
    expired: usize,
    expiry_window: Latency,
    pairs_before: Latency,
    /// Pairs alone, then while a snapshot of every grant is taken (`allot snapshot save`).
    snapshot: SnapshotUnderLoad,
    checks: Vec<Check>,
}

#[derive(Debug, Serialize)]
struct SnapshotUnderLoad {
    seconds: f64,
    bytes: u64,
    pairs_per_s_alone: f64,
    pairs_per_s_during: f64,
    /// `pairs_per_s_during / pairs_per_s_alone`.
    ratio: f64,
    answers_alone: Latency,
    answers_during: Latency,
}

pub(super) async fn run(args: LeasesBenchArgs) -> anyhow::Result<()> {
    if args.grants == 0 || args.namespaces == 0 || args.clients == 0 {
        bail!("--grants, --namespaces and --clients must be at least 1");
    }
    let scratch = Scratch::new(args.tmp_dir.as_deref())?;
    let redis = args.redis.then(allot_host::redis::RedisServer::start);
    let durability: Vec<std::ffi::OsString> = match &redis {
        Some(redis) => vec!["--store".into(), redis.url().into()],
        None => vec!["--durability".into(), args.durability.clone().into()],
    };
    let daemon = children::spawn_daemon_with(&scratch, &durability).await?;
    let endpoint = daemon.endpoint.clone();
    let pid = daemon.pid().context("the daemon's process")?;
    let per_namespace = args.grants.div_ceil(args.namespaces) as u64;
    for i in 0..args.namespaces {
        crate::load::setup_namespace(&endpoint, &namespace(i), per_namespace).await?;
    }
    crate::load::setup_namespace(&endpoint, PAIRS_NAMESPACE, args.clients as u64).await?;
    let idle_kib = resident_kib(pid)?;
    let redis_idle = redis.as_ref().map(redis_memory).transpose()?;
    let started = Instant::now();
    allocate_all(&endpoint, &args, (0..args.grants).collect(), |_| LONG_TTL_MS).await?;
    let fill_per_s = args.grants as f64 / started.elapsed().as_secs_f64();
    let full_kib = resident_kib(pid)?;
    let redis_full = redis.as_ref().map(redis_memory).transpose()?;
    eprintln!("{} grants allocated ({fill_per_s:.0}/s)", args.grants);

    // Killed, and started again where its clients look for it.
    let listen = endpoint.authority.clone();
    let mut killed = Instant::now();
    daemon.kill().await;
    if args.keep {
        // The data as the kill left it, for a look at the restart (`allot serve --data-dir` on a
        // copy of it); the copy's time is not counted in the restart's.
        let copying = Instant::now();
        copy_dir(&scratch.join("allot-data"), &scratch.join("killed-data"))?;
        killed += copying.elapsed();
    }
    let (daemon, first_answer, serving) = restart(&scratch, &listen, &durability, killed).await?;
    let pid = daemon.pid().context("the daemon's process")?;
    let opened = store_open_times(&scratch.join("allot-again.log"));
    let restarted_kib = resident_kib(pid)?;
    let restored = count_grants(&endpoint, args.namespaces).await?;
    if restored != args.grants as u64 {
        bail!("after the restart the daemon holds {restored} grants, not {}", args.grants);
    }
    let disk_bytes = match &redis {
        Some(redis) => disk_usage(redis.dir())?,
        None => disk_usage(&scratch.join("allot-data"))?,
    };
    let fresh_idle_kib = {
        let fresh_scratch = Scratch::new(args.tmp_dir.as_deref())?;
        let fresh = children::spawn_daemon_with(&fresh_scratch, &durability).await?;
        for i in 0..args.namespaces {
            crate::load::setup_namespace(&fresh.endpoint, &namespace(i), per_namespace).await?;
        }
        let kib = resident_kib(fresh.pid().context("the fresh daemon's process")?)?;
        fresh.stop().await;
        kib
    };
    eprintln!("restarted: serving {serving:.3} s after the kill");
    let snapshot = snapshot_under_load(&endpoint, &args, &scratch.join("bench.snapshot")).await?;
    eprintln!("snapshot of every grant taken in {:.3} s while pairs ran", snapshot.seconds);

    // A tenth, released and allocated again so that their leases all end at one moment.
    let tenth: Vec<usize> = (0..args.grants).step_by(10).collect();
    release_all(&endpoint, &args, tenth.clone()).await?;
    let estimate = Duration::from_secs_f64(tenth.len() as f64 / fill_per_s * 2.0) + Duration::from_secs(2);
    let deadline = Instant::now() + estimate;
    allocate_all(&endpoint, &args, tenth.clone(), move |_| {
        deadline.saturating_duration_since(Instant::now()).as_millis().max(1) as u64
    })
    .await?;
    if Instant::now() >= deadline {
        eprintln!("warning: the tenth took longer to allocate than allowed for: some expired before the others");
    }
    let (pairs_before, expiry_window) = pairs_around(&endpoint, &args, deadline).await?;
    // Every one of the tenth ends (the sweeper ends them in batches): waited for, within reason.
    let mut expired = count_gone(&endpoint, &tenth, args.namespaces).await?;
    let waited = Instant::now();
    while expired < tenth.len() && waited.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        expired = count_gone(&endpoint, &tenth, args.namespaces).await?;
    }
    daemon.stop().await;
    if args.keep {
        eprintln!("kept: {} (the data as the kill left it in killed-data)", scratch.keep().display());
    }

    let per_grant = |kib_more: i64| kib_more as f64 * 1024.0 / args.grants as f64;
    let redis_bytes_per_grant =
        redis_idle.zip(redis_full).map(|(idle, full)| (full as f64 - idle as f64) / args.grants as f64);
    let bytes_per_grant = per_grant(full_kib as i64 - idle_kib as i64);
    let bytes_per_grant_after_restart = per_grant(restarted_kib as i64 - fresh_idle_kib as i64);
    let disk_bytes_per_grant = disk_bytes as f64 / args.grants as f64;
    // The targets are the embedded store's; on Redis the figures are reported.
    let checks = match redis {
        Some(_) => Vec::new(),
        None => vec![
            Check::at_most(
                "memory per grant over the idle daemon, after the restart (bytes)".into(),
                Some(bytes_per_grant_after_restart),
                MAX_BYTES_PER_GRANT,
            ),
            Check::at_most("disk per grant (bytes)".into(), Some(disk_bytes_per_grant), MAX_DISK_PER_GRANT),
            Check::at_most("kill -9 to serving (s)".into(), Some(serving), MAX_RESTART_S),
            Check::at_most(
                "slowest answer while a tenth expires (ms)".into(),
                Some(expiry_window.max),
                MAX_EXPIRY_LATENCY_MS,
            ),
            Check::at_least(
                "pairs/s during a snapshot of every grant, over pairs/s without".into(),
                Some(snapshot.ratio),
                MIN_PAIRS_DURING_SNAPSHOT,
            ),
            Check::at_most(
                "slowest answer during the snapshot (ms)".into(),
                Some(snapshot.answers_during.max),
                MAX_SNAPSHOT_LATENCY_MS,
            ),
        ],
    };
    let output = Output {
        durability: if args.redis { "redis".to_owned() } else { args.durability.clone() },
        redis_bytes_per_grant,
        grants: args.grants,
        namespaces: args.namespaces,
        fill_per_s,
        idle_kib,
        full_kib,
        bytes_per_grant,
        fresh_idle_kib,
        restarted_kib,
        bytes_per_grant_after_restart,
        disk_bytes,
        disk_bytes_per_grant,
        restart_first_answer_s: first_answer,
        restart_serving_s: serving,
        restart_log_ms: opened.map(|o| o.0),
        restart_read_ms: opened.map(|o| o.1),
        restored,
        expired,
        expiry_window,
        pairs_before,
        snapshot,
        checks: checks.clone(),
    };
    report::finish(&output, args.output.json, print, args.check, &checks)
}

fn print(o: &Output) {
    println!(
        "{} live TTL grants over {} namespaces on one daemon (durability {}), allocated at {:.0}/s",
        o.grants, o.namespaces, o.durability, o.fill_per_s
    );
    if let Some(bytes) = o.redis_bytes_per_grant {
        println!("  Redis: {bytes:.0} bytes of used_memory per grant");
    }
    println!(
        "  memory: idle {} KiB, with the grants {} KiB ({:.0} bytes per grant); after the restart {} KiB against a \
         fresh daemon's {} KiB ({:.0} bytes per grant)",
        o.idle_kib, o.full_kib, o.bytes_per_grant, o.restarted_kib, o.fresh_idle_kib, o.bytes_per_grant_after_restart
    );
    println!("  disk: {} bytes used ({:.0} bytes per grant)", o.disk_bytes, o.disk_bytes_per_grant);
    let first = o.restart_first_answer_s.map_or_else(|| "-".to_owned(), |s| format!("{s:.3} s"));
    println!(
        "  restart: first answer {first}, serving {:.3} s after the kill, with all {} grants",
        o.restart_serving_s, o.restored
    );
    if let (Some(log), Some(read)) = (o.restart_log_ms, o.restart_read_ms) {
        println!("  the store's open: the log read in {log} ms, the records and kept events in {read} ms");
    }
    println!(
        "  a tenth ({}) expiring at once: answers around that moment p50 {:.2} ms p99 {:.2} ms max {:.2} ms ({} \
         pairs); before it p99 {:.2} ms max {:.2} ms",
        o.expired,
        o.expiry_window.p50,
        o.expiry_window.p99,
        o.expiry_window.max,
        o.expiry_window.count,
        o.pairs_before.p99,
        o.pairs_before.max
    );
    let snap = &o.snapshot;
    println!(
        "  a snapshot of every grant ({} bytes) taken in {:.3} s: pairs {:.0}/s during it against {:.0}/s alone ({:.2}); \
         answers during it p99 {:.2} ms max {:.2} ms (alone p99 {:.2} ms max {:.2} ms)",
        snap.bytes,
        snap.seconds,
        snap.pairs_per_s_during,
        snap.pairs_per_s_alone,
        snap.ratio,
        snap.answers_during.p99,
        snap.answers_during.max,
        snap.answers_alone.p99,
        snap.answers_alone.max
    );
    println!("targets:");
    print!("{}", report::checks(&o.checks));
}

fn namespace(i: usize) -> String {
    format!("ns-{i:04}")
}

/// Grant `i`'s path: its namespace (grants spread evenly) and token.
fn grant_path(i: usize, namespaces: usize) -> String {
    format!("/v1/namespaces/{}/grants/g-{i}", namespace(i % namespaces))
}

/// Allocates the grants `which`, each with the TTL `ttl(i)` gives when it is sent.
async fn allocate_all(
    endpoint: &Endpoint,
    args: &LeasesBenchArgs,
    which: Vec<usize>,
    ttl: impl Fn(usize) -> u64 + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let ttl = Arc::new(ttl);
    each(endpoint, args, which, move |i| {
        let body = format!(r#"{{"ttl_ms":{}}}"#, ttl(i));
        (Method::PUT, body, StatusCode::OK)
    })
    .await
}

async fn release_all(endpoint: &Endpoint, args: &LeasesBenchArgs, which: Vec<usize>) -> anyhow::Result<()> {
    each(endpoint, args, which, |_| (Method::DELETE, String::new(), StatusCode::OK)).await
}

/// Sends one request per grant of `which` over `--clients` connections.
async fn each(
    endpoint: &Endpoint,
    args: &LeasesBenchArgs,
    which: Vec<usize>,
    request: impl Fn(usize) -> (Method, String, StatusCode) + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let (which, request) = (Arc::new(which), Arc::new(request));
    let next = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..args.clients {
        let mut conn = Conn::connect(endpoint).await?;
        let (which, request, next, namespaces) = (which.clone(), request.clone(), next.clone(), args.namespaces);
        clients.push(tokio::spawn(async move {
            loop {
                let Some(&i) = which.get(next.fetch_add(1, Ordering::Relaxed)) else {
                    return Ok::<_, anyhow::Error>(());
                };
                let (method, body, want) = request(i);
                let (status, answer) = conn.request(method, &grant_path(i, namespaces), Bytes::from(body)).await?;
                if status != want {
                    bail!("grant {i}: {status}: {}", String::from_utf8_lossy(&answer));
                }
            }
        }));
    }
    for client in clients {
        client.await??;
    }
    Ok(())
}

/// Copies the directory `from` (files and directories only) to `to`.
fn copy_dir(from: &std::path::Path, to: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("cannot create {}", to.display()))?;
    for entry in std::fs::read_dir(from).with_context(|| format!("cannot read {}", from.display()))? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target).with_context(|| format!("cannot copy {}", entry.path().display()))?;
        }
    }
    Ok(())
}

/// The embedded store's last open in the daemon's log `log`: the milliseconds of its log and of
/// its records (the `log_ms` and `read_ms` of its line), if the log has them.
fn store_open_times(log: &std::path::Path) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(log).ok()?;
    let line = text.lines().rev().find(|line| line.contains("log_ms="))?;
    let field = |name: &str| -> Option<u64> {
        let rest = &line[line.find(name)? + name.len()..];
        rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
    };
    Some((field("log_ms=")?, field("read_ms=")?))
}

/// Starts the daemon again on `listen`, and times from `killed` its first answer and its first
/// 200 to a read.
async fn restart(
    scratch: &Scratch,
    listen: &str,
    durability: &[std::ffi::OsString],
    killed: Instant,
) -> anyhow::Result<(children::Server, Option<f64>, f64)> {
    let mut more: Vec<std::ffi::OsString> = vec!["--listen".into(), listen.into()];
    more.extend(durability.iter().cloned());
    let probe = Endpoint::parse(&format!("http://{listen}"))?;
    let starting = tokio::spawn(async move {
        let mut first_answer = None;
        loop {
            if let Ok(mut conn) = Conn::connect(&probe).await {
                if let Ok((status, _)) =
                    conn.request(Method::GET, &format!("/v1/namespaces/{}", namespace(0)), Bytes::new()).await
                {
                    first_answer.get_or_insert(killed.elapsed().as_secs_f64());
                    if status == StatusCode::OK {
                        return (first_answer, killed.elapsed().as_secs_f64());
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    let daemon = children::spawn_daemon_again(scratch, &more).await?;
    let (first_answer, serving) = starting.await.context("the restart's probe")?;
    Ok((daemon, first_answer, serving))
}

/// Allocate+release pairs in their own namespace over `--clients` connections from now until 3 s
/// after `deadline`: the latencies of the answers before `deadline` and from it on.
async fn pairs_around(
    endpoint: &Endpoint,
    args: &LeasesBenchArgs,
    deadline: Instant,
) -> anyhow::Result<(Latency, Latency)> {
    let end = deadline + Duration::from_secs(3);
    let mut clients = Vec::new();
    for c in 0..args.clients {
        let mut conn = Conn::connect(endpoint).await?;
        clients.push(tokio::spawn(async move {
            let (mut before, mut around) = (Vec::new(), Vec::new());
            let path = format!("/v1/namespaces/{PAIRS_NAMESPACE}/grants/pair-{c}");
            while Instant::now() < end {
                for method in [Method::PUT, Method::DELETE] {
                    let sent = Instant::now();
                    let (status, answer) = conn.request(method, &path, Bytes::new()).await?;
                    if status != StatusCode::OK {
                        bail!("{path}: {status}: {}", String::from_utf8_lossy(&answer));
                    }
                    let took = sent.elapsed().as_nanos() as u64;
                    if sent < deadline {
                        before.push(took)
                    } else {
                        around.push(took)
                    }
                }
            }
            Ok::<_, anyhow::Error>((before, around))
        }));
    }
    let (mut before, mut around) = (Vec::new(), Vec::new());
    for client in clients {
        let (b, a) = client.await??;
        before.extend(b);
        around.extend(a);
    }
    Ok((Latency::from_nanos(before), Latency::from_nanos(around)))
}

/// Pairs for [`PAIRS_ALONE`], then pairs while `allot snapshot save FILE` runs against the
/// daemon (this binary, as a child).
async fn snapshot_under_load(
    endpoint: &Endpoint,
    args: &LeasesBenchArgs,
    file: &std::path::Path,
) -> anyhow::Result<SnapshotUnderLoad> {
    let ((), alone_pairs, alone_s, answers_alone) =
        pairs_until(endpoint, args, tokio::time::sleep(PAIRS_ALONE)).await?;
    let exe = std::env::current_exe().context("this binary's path")?;
    let scheme = if endpoint.tls.is_some() { "https" } else { "http" };
    // The saving client at the lowest priority, as a backup job beside the daemon would run.
    let mut save = tokio::process::Command::new("nice");
    save.args(["-n", "19"])
        .arg(exe)
        .args(["snapshot", "save"])
        .arg(file)
        .env("ALLOT_SERVER", format!("{scheme}://{}{}", endpoint.authority, endpoint.prefix));
    save.env_remove("ALLOT_TOKEN").stdout(std::process::Stdio::null()).kill_on_drop(true);
    let started = Instant::now();
    let (saved, during_pairs, during_s, answers_during) = pairs_until(endpoint, args, save.output()).await?;
    let seconds = started.elapsed().as_secs_f64();
    let saved = saved.context("running `allot snapshot save`")?;
    if !saved.status.success() {
        bail!("`allot snapshot save` failed: {}", String::from_utf8_lossy(&saved.stderr));
    }
    let bytes =
        std::fs::metadata(file).with_context(|| format!("the snapshot {} was not written", file.display()))?.len();
    std::fs::remove_file(file).ok();
    let (alone, during) = (alone_pairs as f64 / alone_s, during_pairs as f64 / during_s);
    Ok(SnapshotUnderLoad {
        seconds,
        bytes,
        pairs_per_s_alone: alone,
        pairs_per_s_during: during,
        ratio: during / alone,
        answers_alone,
        answers_during,
    })
}

/// Allocate+release pairs on `--clients` connections until `done` ends: what it answered, how
/// many pairs, in how many seconds, and the answers' latencies.
async fn pairs_until<T>(
    endpoint: &Endpoint,
    args: &LeasesBenchArgs,
    done: impl std::future::Future<Output = T>,
) -> anyhow::Result<(T, u64, f64, Latency)> {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for c in 0..args.clients {
        let mut conn = Conn::connect(endpoint).await?;
        let stop = stop.clone();
        clients.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            let path = format!("/v1/namespaces/{PAIRS_NAMESPACE}/grants/pair-{c}");
            while !stop.load(Ordering::Relaxed) {
                for method in [Method::PUT, Method::DELETE] {
                    let sent = Instant::now();
                    let (status, answer) = conn.request(method, &path, Bytes::new()).await?;
                    if status != StatusCode::OK {
                        bail!("{path}: {status}: {}", String::from_utf8_lossy(&answer));
                    }
                    answers.push(sent.elapsed().as_nanos() as u64);
                }
            }
            Ok::<_, anyhow::Error>(answers)
        }));
    }
    let started = Instant::now();
    let outcome = done.await;
    stop.store(true, Ordering::Relaxed);
    let seconds = started.elapsed().as_secs_f64();
    let mut answers = Vec::new();
    for client in clients {
        answers.extend(client.await??);
    }
    Ok((outcome, (answers.len() / 2) as u64, seconds, Latency::from_nanos(answers)))
}

/// The grants the `namespaces` hold, by their counts.
async fn count_grants(endpoint: &Endpoint, namespaces: usize) -> anyhow::Result<u64> {
    let mut conn = Conn::connect(endpoint).await?;
    let mut total = 0;
    for i in 0..namespaces {
        let path = format!("/v1/namespaces/{}", namespace(i));
        let (status, answer) = conn.request(Method::GET, &path, Bytes::new()).await?;
        if status != StatusCode::OK {
            bail!("GET {path}: {status}: {}", String::from_utf8_lossy(&answer));
        }
        total += serde_json::from_slice::<allot_api::Namespace>(&answer)?.grants;
    }
    Ok(total)
}

/// How many of the grants `which` are gone (404 to a read).
async fn count_gone(endpoint: &Endpoint, which: &[usize], namespaces: usize) -> anyhow::Result<usize> {
    let mut conn = Conn::connect(endpoint).await?;
    let mut gone = 0;
    for &i in which {
        let (status, _) = conn.request(Method::GET, &grant_path(i, namespaces), Bytes::new()).await?;
        if status == StatusCode::NOT_FOUND {
            gone += 1;
        }
    }
    Ok(gone)
}

/// Redis's `used_memory` (bytes).
pub(super) fn redis_memory(redis: &allot_host::redis::RedisServer) -> anyhow::Result<u64> {
    let info = redis.cli(&["INFO", "memory"]);
    let line = info.lines().find_map(|l| l.strip_prefix("used_memory:")).context("no used_memory in INFO")?;
    line.trim().parse().context("unreadable used_memory")
}

/// The bytes the files under `dir` take on disk (their blocks, as `du` counts them).
pub(super) fn disk_usage(dir: &std::path::Path) -> anyhow::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() { disk_usage(&entry.path())? } else { meta.blocks() * 512 };
    }
    Ok(total)
}
