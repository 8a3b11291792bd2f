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
//!
//! Each round measures the three back to back; the report gives medians over the rounds (a ratio
//! is the median of the rounds' ratios) and the machine's steal during each measurement.

use allot_store::prelude::*;
use std::ffi::OsString;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use allot_core::{AllocateRequest, Constraints, LeaseRequest, NamespaceName, Scope, Token};
use allot_host::redis::RedisServer;
use allot_store::{Allocation, Store};
use allot_store_redis::{DirectScripts, RedisConfig, RedisStore};
use anyhow::{bail, Context};
use redis::aio::MultiplexedConnection;
use serde::Serialize;

use crate::children::{self, Scratch};
use crate::closed::{closed_loop, Pair, Row};
use crate::cpu::{CpuShare, CpuTimes};
use crate::load::{self, ScopedLoad, Target};
use crate::report::{self, median, Check};
use crate::RedisBenchArgs;

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
    rounds: u16,
    /// Medians over the rounds.
    summaries: Vec<Summary>,
    /// Every measurement.
    measured: Vec<Measured>,
    checks: Vec<Check>,
}

/// One target measured in one round.
#[derive(Serialize)]
struct Measured {
    round: u16,
    #[serde(flatten)]
    row: Row,
    /// The machine's CPU over the measurement (warm-up and window).
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu: Option<CpuShare>,
}

/// One target at one number of clients, over all rounds.
#[derive(Serialize)]
struct Summary {
    target: String,
    clients: usize,
    /// Median over the rounds, as are the latencies and the steal.
    pairs_per_s: f64,
    pair_p50_ms: f64,
    pair_p99_ms: f64,
    /// Median of the rounds' ratios of this target's pairs/s to the direct script's.
    vs_direct: Option<f64>,
    /// Median of the rounds' ratios to Flyte's sequence.
    vs_flyte: Option<f64>,
    /// Errors and pairs not granted, over all rounds.
    errors: u64,
    steal_pct: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    first_error: Option<String>,
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
    let daemon = children::spawn_listening("allot", &exe, &serve_args, scratch.join("allot.log"), None).await?;
    let scoped = ScopedLoad { projects: LOAD_PROJECTS, project_cap: PROJECT_CAP, namespace_cap: NAMESPACE_CAP };
    let target = Target::allot("allot", daemon.endpoint.clone(), namespace.as_str()).with_scopes(scoped);

    let mut measured = Vec::new();
    for &clients in &args.clients {
        let spec = args.window.spec(clients, &args.output);
        // Flyte's go-redis client checks a pooled connection out per command: no pipelining
        // between workers. Each client here has a connection of its own, used one command at a
        // time.
        let mut connections = Vec::with_capacity(clients);
        for _ in 0..clients {
            connections.push(redis_client.get_multiplexed_async_connection().await?);
        }
        let connections = Arc::new(connections);
        for round in 1..=args.rounds {
            let direct = with_cpu(round, async {
                Ok(closed_loop("direct", clients, &spec, {
                    let (direct, namespace) = (direct.clone(), namespace.clone());
                    move |index, token| {
                        let (direct, namespace) = (direct.clone(), namespace.clone());
                        async move { direct_pair(&direct, &namespace, index, &token).await }
                    }
                })
                .await)
            })
            .await?;
            report_row(&args, &direct);
            measured.push(direct);
            let flyte = with_cpu(round, async {
                Ok(closed_loop("flyte", clients, &spec, {
                    let (key, quota, connections) =
                        (Arc::<str>::from(flyte_key.as_str()), args.quota, connections.clone());
                    move |index, token| {
                        let (mut flyte, key) = (connections[index].clone(), key.clone());
                        async move { flyte_pair(&mut flyte, &key, quota, index, &token).await }
                    }
                })
                .await)
            })
            .await?;
            report_row(&args, &flyte);
            measured.push(flyte);
            let allot = with_cpu(round, async {
                let result = load::run_load(&target, &spec).await?;
                Ok(Row {
                    target: "allot".into(),
                    clients,
                    pairs_per_s: result.pairs_per_s,
                    pair_ms: result.pair_ms,
                    errors: result.errors,
                    not_granted: result.not_granted,
                    first_error: result.first_error,
                })
            })
            .await?;
            report_row(&args, &allot);
            measured.push(allot);
        }
    }
    daemon.stop().await;
    store.remove_namespace(namespace, true).await?;
    store.shutdown().await;
    redis::cmd("DEL").arg(&flyte_key).query_async::<()>(&mut flyte.clone()).await?;

    let summaries = summarize(&args.clients, &measured);
    let checks = checks(&summaries);
    if args.output.json {
        let output = Output {
            redis: url,
            held: args.held,
            quota: args.quota,
            daemon_threads: args.daemon_threads,
            rounds: args.rounds,
            summaries,
            measured,
            checks: checks.clone(),
        };
        println!("{}", serde_json::to_string_pretty(&output)?);
    } else {
        let threads = args.daemon_threads.map_or_else(|| "its default".to_owned(), |n| n.to_string());
        println!(
            "Redis {url}: quota {}, {} held, caps {PROJECT_CAP} per project and {NAMESPACE_CAP} per project+domain; \
             daemon threads: {threads}; medians of {} rounds",
            args.quota, args.held, args.rounds
        );
        print!("{}", summary_table(&summaries));
        println!("rounds:");
        print!("{}", round_table(&measured));
        println!("targets (allot through one daemon, medians of the rounds' ratios):");
        print!("{}", report::checks(&checks));
    }
    if args.check && checks.iter().any(|c| !c.ok) {
        bail!("allot missed a target");
    }
    Ok(())
}

/// Runs `measure`, with the machine's CPU shares over it.
async fn with_cpu(round: u16, measure: impl Future<Output = anyhow::Result<Row>>) -> anyhow::Result<Measured> {
    let before = CpuTimes::now();
    let row = measure.await?;
    let cpu = before.zip(CpuTimes::now()).and_then(|(before, after)| before.share_until(&after));
    Ok(Measured { round, row, cpu })
}

fn report_row(args: &RedisBenchArgs, m: &Measured) {
    if !args.output.json {
        let steal = m.cpu.map_or_else(String::new, |cpu| format!(", steal {:.0} %", cpu.steal_pct));
        eprintln!(
            "round {}: {} × {}: {:.0} pairs/s, pair p99 {:.3} ms{steal}",
            m.round, m.row.target, m.row.clients, m.row.pairs_per_s, m.row.pair_ms.p99
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

/// The measurement of `target` at `clients` in `round`.
fn find<'a>(measured: &'a [Measured], round: u16, target: &str, clients: usize) -> Option<&'a Measured> {
    measured.iter().find(|m| m.round == round && m.row.target == target && m.row.clients == clients)
}

/// The pairs/s of `target` at `clients` in `round`, when it made any.
fn rate(measured: &[Measured], round: u16, target: &str, clients: usize) -> Option<f64> {
    find(measured, round, target, clients).map(|m| m.row.pairs_per_s).filter(|&r| r > 0.0)
}

/// `target`'s pairs/s over `base`'s in `round`.
fn round_ratio(measured: &[Measured], round: u16, target: &str, base: &str, clients: usize) -> Option<f64> {
    Some(rate(measured, round, target, clients)? / rate(measured, round, base, clients)?)
}

/// Medians over the rounds, per target and number of clients. A ratio is the median of the
/// rounds' ratios: each compares targets measured seconds apart.
fn summarize(clients: &[usize], measured: &[Measured]) -> Vec<Summary> {
    let mut summaries = Vec::new();
    for &n in clients {
        for target in ["direct", "flyte", "allot"] {
            let runs: Vec<&Measured> =
                measured.iter().filter(|m| m.row.target == target && m.row.clients == n).collect();
            let of = |f: &dyn Fn(&Measured) -> Option<f64>| median(runs.iter().filter_map(|m| f(m)).collect());
            let vs = |base: &str| of(&|m| round_ratio(measured, m.round, target, base, n));
            summaries.push(Summary {
                target: target.to_owned(),
                clients: n,
                pairs_per_s: of(&|m| Some(m.row.pairs_per_s)).unwrap_or(0.0),
                pair_p50_ms: of(&|m| Some(m.row.pair_ms.p50)).unwrap_or(0.0),
                pair_p99_ms: of(&|m| Some(m.row.pair_ms.p99)).unwrap_or(0.0),
                vs_direct: vs("direct"),
                vs_flyte: vs("flyte"),
                errors: runs.iter().map(|m| m.row.errors + m.row.not_granted).sum(),
                steal_pct: of(&|m| m.cpu.map(|cpu| cpu.steal_pct)),
                first_error: runs.iter().find_map(|m| m.row.first_error.clone()),
            });
        }
    }
    summaries
}

fn checks(summaries: &[Summary]) -> Vec<Check> {
    let mut checks = Vec::new();
    for allot in summaries.iter().filter(|s| s.target == "allot") {
        let n = allot.clients;
        checks.push(Check::at_least(
            format!("pairs/s vs direct script at {n} clients"),
            allot.vs_direct,
            MIN_VS_DIRECT,
        ));
        checks.push(Check::at_least(
            format!("pairs/s vs Flyte's sequence at {n} clients"),
            allot.vs_flyte,
            MIN_VS_FLYTE,
        ));
        checks.push(Check::at_most(format!("errors at {n} clients"), Some(allot.errors as f64), 0.0));
    }
    checks
}

/// `value` with `decimals` decimals, or `-` when there is none.
fn or_dash(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.decimals$}"))
}

fn summary_table(summaries: &[Summary]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<8} {:>7} {:>10} {:>10} {:>9} {:>11} {:>11} {:>7} {:>8}",
        "target", "clients", "pairs/s", "vs direct", "vs flyte", "pair p50 ms", "pair p99 ms", "errors", "steal %"
    );
    for s in summaries {
        let _ = writeln!(
            out,
            "{:<8} {:>7} {:>10.0} {:>10} {:>9} {:>11.3} {:>11.3} {:>7} {:>8}",
            s.target,
            s.clients,
            s.pairs_per_s,
            or_dash(s.vs_direct, 2),
            or_dash(s.vs_flyte, 2),
            s.pair_p50_ms,
            s.pair_p99_ms,
            s.errors,
            or_dash(s.steal_pct, 0)
        );
    }
    for s in summaries.iter().filter(|s| s.first_error.is_some()) {
        let _ = writeln!(out, "{} × {}: first error: {}", s.target, s.clients, s.first_error.as_deref().unwrap_or(""));
    }
    out
}

/// Each round's pairs/s, allot's ratios and the steal of its three measurements.
fn round_table(measured: &[Measured]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>5} {:>7} {:>8} {:>8} {:>8} {:>12} {:>11} {:>17}",
        "round", "clients", "direct", "flyte", "allot", "allot/direct", "allot/flyte", "steal % d/f/a"
    );
    let mut seen = Vec::new();
    for m in measured {
        let key = (m.round, m.row.clients);
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        let (round, n) = key;
        let of = |target: &str| find(measured, round, target, n);
        let pairs = |target: &str| or_dash(of(target).map(|m| m.row.pairs_per_s), 0);
        let steal = |target: &str| or_dash(of(target).and_then(|m| m.cpu).map(|cpu| cpu.steal_pct), 0);
        let vs = |base: &str| or_dash(round_ratio(measured, round, "allot", base, n), 2);
        let _ = writeln!(
            out,
            "{:>5} {:>7} {:>8} {:>8} {:>8} {:>12} {:>11} {:>17}",
            round,
            n,
            pairs("direct"),
            pairs("flyte"),
            pairs("allot"),
            vs("direct"),
            vs("flyte"),
            format!("{}/{}/{}", steal("direct"), steal("flyte"), steal("allot"))
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(round: u16, target: &str, pairs_per_s: f64, steal_pct: f64) -> Measured {
        Measured {
            round,
            row: Row {
                target: target.to_owned(),
                clients: 16,
                pairs_per_s,
                pair_ms: Default::default(),
                errors: 0,
                not_granted: u64::from(target == "allot" && round == 2),
                first_error: None,
            },
            cpu: Some(CpuShare { busy_pct: 100.0 - steal_pct, idle_pct: 0.0, steal_pct }),
        }
    }

    #[test]
    fn ratios_are_medians_of_each_rounds_ratio() {
        // Round 2 is slow for every target (noise): its ratios still count like the others.
        let all = vec![
            measured(1, "direct", 1000.0, 1.0),
            measured(1, "flyte", 100.0, 2.0),
            measured(1, "allot", 400.0, 3.0),
            measured(2, "direct", 500.0, 30.0),
            measured(2, "flyte", 50.0, 30.0),
            measured(2, "allot", 150.0, 30.0),
            measured(3, "direct", 900.0, 5.0),
            measured(3, "flyte", 100.0, 5.0),
            measured(3, "allot", 500.0, 5.0),
        ];
        let summaries = summarize(&[16], &all);
        let allot = summaries.iter().find(|s| s.target == "allot").unwrap();
        assert_eq!(allot.pairs_per_s, 400.0);
        // Rounds' allot/flyte: 4, 3, 5; allot/direct: 0.4, 0.3, 0.556.
        assert_eq!(allot.vs_flyte, Some(4.0));
        assert_eq!(allot.vs_direct, Some(0.4));
        assert_eq!(allot.steal_pct, Some(5.0));
        assert_eq!(allot.errors, 1);
        let checks = checks(&summaries);
        assert_eq!(checks.iter().map(|c| c.ok).collect::<Vec<_>>(), [false, true, false]);
        let table = round_table(&all);
        assert_eq!(table.lines().count(), 4, "{table}");
        assert!(table.lines().nth(2).unwrap().contains("0.30"), "{table}");
    }
}
