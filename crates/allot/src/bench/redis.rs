//! `allot bench redis`: allocate+release pairs on one Redis, three ways, in one run.
//!
//! - `direct`: allot's own allocate and release functions called straight from this process (one
//!   multiplexed connection shared by all clients, so calls of different clients are pipelined;
//!   no daemon, no HTTP): the ceiling of any Redis-backed design.
//! - `flyte`: Flyte's command sequence against a Redis SET: SISMEMBER, SCARD, SMEMBERS with the
//!   caps counted by prefix on the client, SADD; SREM to release. Four round trips, not atomic.
//!   Each client has its own connection, as each of Flyte's workers checks one out of go-redis's
//!   pool per command.
//! - `allot`: the same load through `allot serve --store redis://...` over HTTP, with this
//!   process's load generator.
//!
//! As in Flyte's default web-API pool, the quota is 1,000 with caps of 100 per project and 50 per
//! project+domain, and 900 tokens are held (30 projects × 3 domains × 10) before measuring.

use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;

use allot_core::{AllocateRequest, Constraints, LeaseRequest, NamespaceName, Scope, Token};
use allot_store::{Allocation, Store};
use allot_store_redis::testing::RedisServer;
use allot_store_redis::{DirectScripts, RedisConfig, RedisStore};
use anyhow::{bail, Context};
use redis::aio::MultiplexedConnection;
use serde::Serialize;

use super::children::{self, Scratch};
use super::closed::{closed_loop, Pair, Row};
use super::load::{self, ScopedLoad, Target};
use super::report::{self, Check};
use super::RedisBenchArgs;

const PROJECT_CAP: u64 = 100;
const NAMESPACE_CAP: u64 = 50;
/// allot must reach this share of the direct script's pairs/s...
const MIN_VS_DIRECT: f64 = 0.5;
/// ...and this multiple of Flyte's sequence.
const MIN_VS_FLYTE: f64 = 3.0;
/// Load clients spread over this many projects, so no cap refuses them.
const LOAD_PROJECTS: usize = 8;

#[derive(Serialize)]
struct Output {
    redis: String,
    held: u64,
    quota: u64,
    /// `allot serve --threads` of the daemon under test (none: its default).
    daemon_threads: Option<u16>,
    rows: Vec<Row>,
    checks: Vec<Check>,
}

pub(super) async fn run(args: RedisBenchArgs) -> anyhow::Result<()> {
    if args.clients.is_empty() || args.clients.iter().any(|&c| c == 0 || c > 100) {
        bail!("--clients must list numbers of clients between 1 and 100 (the pool has room for 100), e.g. 16,64");
    }
    // A server of our own unless one is given.
    let own = if args.redis.is_none() { Some(RedisServer::start()) } else { None };
    let url = args.redis.clone().unwrap_or_else(|| own.as_ref().map(RedisServer::url).unwrap_or_default());
    let config = RedisConfig::parse(&url)?;
    let run = load::run_id();
    let namespace = NamespaceName::new(&format!("bench:{run}"))?;
    let flyte_key = format!("bench-flyte:{run}");

    let store = RedisStore::open(&config).await?;
    setup_allot(&store, &namespace, args.quota, args.held).await?;
    let redis_client = redis::Client::open(config.urls[0].as_str())?;
    let flyte = redis_client.get_multiplexed_async_connection().await?;
    setup_flyte(&flyte, &flyte_key, args.held).await?;
    let direct = Arc::new(DirectScripts::connect(&config).await?);

    let scratch = Scratch::new(None)?;
    let exe = std::env::current_exe()?;
    let mut serve_args: Vec<OsString> = vec![
        "serve".into(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--store".into(),
        url.clone().into(),
        "--data-dir".into(),
        scratch.join("unused").into(),
    ];
    if let Some(threads) = args.daemon_threads {
        serve_args.extend(["--threads".into(), threads.to_string().into()]);
    }
    let daemon = children::spawn_listening("allot", &exe, &serve_args, scratch.join("allot.log")).await?;
    let scoped = ScopedLoad { projects: LOAD_PROJECTS, project_cap: PROJECT_CAP, namespace_cap: NAMESPACE_CAP };
    let target = Target::allot("allot", daemon.endpoint.clone(), namespace.as_str()).with_scopes(scoped);

    let mut rows = Vec::new();
    for &clients in &args.clients {
        let spec = args.window.spec(clients, &args.output);
        let row = closed_loop("direct", clients, &spec, {
            let (direct, namespace) = (direct.clone(), namespace.clone());
            move |index, token| {
                let (direct, namespace) = (direct.clone(), namespace.clone());
                async move { direct_pair(&direct, &namespace, index, &token).await }
            }
        })
        .await;
        report_row(&args, &row);
        rows.push(row);
        // Flyte's go-redis client checks a pooled connection out per command: no pipelining
        // between workers. Each client here has a connection of its own, used one command at a
        // time.
        let mut connections = Vec::with_capacity(clients);
        for _ in 0..clients {
            connections.push(redis_client.get_multiplexed_async_connection().await?);
        }
        let connections = Arc::new(connections);
        let row = closed_loop("flyte", clients, &spec, {
            let (key, quota) = (Arc::<str>::from(flyte_key.as_str()), args.quota);
            move |index, token| {
                let (mut flyte, key) = (connections[index].clone(), key.clone());
                async move { flyte_pair(&mut flyte, &key, quota, index, &token).await }
            }
        })
        .await;
        report_row(&args, &row);
        rows.push(row);
        let result = load::run_load(&target, &spec).await?;
        let row = Row {
            target: "allot".into(),
            clients,
            pairs_per_s: result.pairs_per_s,
            pair_ms: result.pair_ms,
            errors: result.errors,
            not_granted: result.not_granted,
            first_error: result.first_error,
        };
        report_row(&args, &row);
        rows.push(row);
    }
    daemon.stop().await;
    store.remove_namespace(namespace, true).await?;
    store.shutdown().await;
    redis::cmd("DEL").arg(&flyte_key).query_async::<()>(&mut flyte.clone()).await?;

    let checks = checks(&args.clients, &rows);
    if args.output.json {
        let output = Output {
            redis: url,
            held: args.held,
            quota: args.quota,
            daemon_threads: args.daemon_threads,
            rows,
            checks: checks.clone(),
        };
        println!("{}", serde_json::to_string_pretty(&output)?);
    } else {
        let threads = args.daemon_threads.map_or_else(|| "its default".to_owned(), |n| n.to_string());
        println!(
            "Redis {url}: quota {}, {} held, caps {PROJECT_CAP} per project and {NAMESPACE_CAP} per project+domain; \
             daemon threads: {threads}",
            args.quota, args.held
        );
        print!("{}", table(&rows));
        println!("targets (allot through one daemon):");
        print!("{}", report::checks(&checks));
    }
    if args.check && checks.iter().any(|c| !c.ok) {
        bail!("allot missed a target");
    }
    Ok(())
}

fn report_row(args: &RedisBenchArgs, row: &Row) {
    if !args.output.json {
        eprintln!(
            "{} × {}: {:.0} pairs/s, pair p99 {:.3} ms",
            row.target, row.clients, row.pairs_per_s, row.pair_ms.p99
        );
    }
}

fn scope_of(project: String, domain: &str) -> Scope {
    Scope::new(&project, domain).expect("valid scope")
}

fn request(namespace: &NamespaceName, token: &str, scope: Scope) -> AllocateRequest {
    AllocateRequest {
        namespace: namespace.clone(),
        token: Token::new(token).expect("valid token"),
        units: 1,
        scope: Some(scope),
        constraints: Constraints { project: Some(PROJECT_CAP), namespace: Some(NAMESPACE_CAP) },
        lease: LeaseRequest::None,
    }
}

/// The held token `i`: 30 projects × 3 domains.
fn held_scope(i: u64) -> (String, String) {
    (format!("held-{}", i % 30), format!("d{}", (i / 30) % 3))
}

async fn setup_allot(store: &RedisStore, namespace: &NamespaceName, quota: u64, held: u64) -> anyhow::Result<()> {
    store.put_namespace(namespace.clone(), quota).await?;
    for i in 0..held {
        let (project, domain) = held_scope(i);
        let answer = store
            .allocate(request(namespace, &format!("held-{i}"), scope_of(project, &domain)), Duration::ZERO)
            .await?;
        if !matches!(answer, Allocation::Granted { .. }) {
            bail!("cannot hold token {i}: {answer:?}");
        }
    }
    Ok(())
}

async fn setup_flyte(conn: &MultiplexedConnection, key: &str, held: u64) -> anyhow::Result<()> {
    let mut cmd = redis::cmd("SADD");
    cmd.arg(key);
    for i in 0..held {
        let (project, domain) = held_scope(i);
        cmd.arg(format!("ex:{project}:{domain}:held-{i}"));
    }
    cmd.query_async::<()>(&mut conn.clone()).await.context("SADD of the held tokens")
}

async fn direct_pair(direct: &DirectScripts, namespace: &NamespaceName, index: usize, token: &str) -> Pair {
    let scope = scope_of(format!("load-{}", index % LOAD_PROJECTS), "dev");
    let request = request(namespace, token, scope);
    match direct.allocate(&request).await {
        Ok(true) => {}
        Ok(false) => return Pair::NotGranted,
        Err(err) => return Pair::Failed(err.to_string()),
    }
    match direct.release(namespace, &request.token).await {
        Ok(true) => Pair::Done,
        Ok(false) => Pair::Failed("the release released nothing".into()),
        Err(err) => Pair::Failed(err.to_string()),
    }
}

/// Flyte's `AllocateResource` and `ReleaseResource`, command for command (see
/// `../shared/reference/flyte.md` §1.3-1.6).
async fn flyte_pair(conn: &mut MultiplexedConnection, key: &str, quota: u64, index: usize, token: &str) -> Pair {
    let project = format!("load-{}", index % LOAD_PROJECTS);
    let member = format!("ex:{project}:dev:{token}");
    let result: redis::RedisResult<Pair> = async {
        let found: bool = redis::cmd("SISMEMBER").arg(key).arg(&member).query_async(conn).await?;
        if !found {
            let size: u64 = redis::cmd("SCARD").arg(key).query_async(conn).await?;
            if size >= quota {
                return Ok(Pair::NotGranted);
            }
            let members: Vec<String> = redis::cmd("SMEMBERS").arg(key).query_async(conn).await?;
            let project_prefix = format!("ex:{project}");
            let scope_prefix = format!("ex:{project}:dev");
            let in_project = members.iter().filter(|m| m.starts_with(&project_prefix)).count() as u64;
            let in_scope = members.iter().filter(|m| m.starts_with(&scope_prefix)).count() as u64;
            if in_project >= PROJECT_CAP || in_scope >= NAMESPACE_CAP {
                return Ok(Pair::NotGranted);
            }
            redis::cmd("SADD").arg(key).arg(&member).query_async::<()>(conn).await?;
        }
        let removed: u64 = redis::cmd("SREM").arg(key).arg(&member).query_async(conn).await?;
        Ok(if removed == 1 { Pair::Done } else { Pair::Failed("SREM removed nothing".into()) })
    }
    .await;
    result.unwrap_or_else(|err| Pair::Failed(err.to_string()))
}

fn rate(rows: &[Row], target: &str, clients: usize) -> Option<f64> {
    rows.iter().find(|r| r.target == target && r.clients == clients).map(|r| r.pairs_per_s).filter(|&r| r > 0.0)
}

fn checks(clients: &[usize], rows: &[Row]) -> Vec<Check> {
    let mut checks = Vec::new();
    for &n in clients {
        let allot = rate(rows, "allot", n);
        let vs = |base: &str| Some(allot? / rate(rows, base, n)?);
        checks.push(Check::at_least(format!("pairs/s vs direct script at {n} clients"), vs("direct"), MIN_VS_DIRECT));
        checks.push(Check::at_least(format!("pairs/s vs Flyte's sequence at {n} clients"), vs("flyte"), MIN_VS_FLYTE));
        let errors =
            rows.iter().find(|r| r.target == "allot" && r.clients == n).map(|r| (r.errors + r.not_granted) as f64);
        checks.push(Check::at_most(format!("errors at {n} clients"), errors, 0.0));
    }
    checks
}

fn table(rows: &[Row]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<8} {:>7} {:>10} {:>10} {:>9} {:>11} {:>11} {:>7}",
        "target", "clients", "pairs/s", "vs direct", "vs flyte", "pair p50 ms", "pair p99 ms", "errors"
    );
    for row in rows {
        let ratio = |base: &str| {
            rate(rows, base, row.clients).map_or_else(|| "-".to_owned(), |b| format!("{:.2}", row.pairs_per_s / b))
        };
        let _ = writeln!(
            out,
            "{:<8} {:>7} {:>10.0} {:>10} {:>9} {:>11.3} {:>11.3} {:>7}",
            row.target,
            row.clients,
            row.pairs_per_s,
            ratio("direct"),
            ratio("flyte"),
            row.pair_ms.p50,
            row.pair_ms.p99,
            row.errors + row.not_granted
        );
    }
    for row in rows.iter().filter(|r| r.first_error.is_some()) {
        let _ = writeln!(
            out,
            "{} × {}: first error: {}",
            row.target,
            row.clients,
            row.first_error.as_deref().unwrap_or("")
        );
    }
    out
}
