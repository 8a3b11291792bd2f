//! `allot bench pools`: accept+free pairs through one daemon against token allocate+release
//! pairs, with the same clients, in one run.
//!
//! A fresh daemon (embedded store, durability on) gets `--pools` pools (default 1,000) of
//! `cpu=64,mem=256GiB`; each client accepts `cpu=1,mem=1GiB` from a random pool and frees it, back
//! to back, over its own keep-alive HTTP/1.1 connection. Then the same clients run token pairs
//! (`PUT`/`DELETE .../grants/{token}`) on a namespace with room for all. The target: pool pairs at
//! least half as many per second as token pairs.

use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use hyper::body::Bytes;
use hyper::{Method, StatusCode};
use serde::Serialize;
use tokio::sync::Mutex;

use crate::children::{self, Scratch};
use crate::closed::{closed_loop, Pair, Row};
use crate::http::{Conn, Endpoint};
use crate::latency::Latency;
use crate::load;
use crate::report::{self, Check};
use crate::PoolsBenchArgs;

/// Pool pairs must reach this share of token pairs.
const MIN_RATIO: f64 = 0.5;
const CAPACITY: &str = "cpu=64,mem=256GiB";
const ACCEPT_BODY: &str = r#"{"min":"cpu=1,mem=1GiB","owner":"bench"}"#;

#[derive(Serialize)]
struct Output {
    pools: usize,
    rows: Vec<Row>,
    helper: HelperResult,
    checks: Vec<Check>,
}

/// The allocate helper under contention: more clients than room, through a caching mux.
#[derive(Debug, Clone, Serialize)]
struct HelperResult {
    pools: usize,
    slots: usize,
    clients: usize,
    attempts: u64,
    succeeded: u64,
    success_rate: f64,
    allocate_ms: Latency,
    first_error: Option<String>,
}

pub(super) async fn run(args: PoolsBenchArgs) -> anyhow::Result<()> {
    if args.clients == 0 || args.pools == 0 {
        bail!("--clients and --pools must be at least 1");
    }
    let scratch = Scratch::new(args.tmp_dir.as_deref())?;
    let daemon = children::spawn_daemon(&scratch).await?;
    let outcome = measure(&args, &daemon.endpoint).await;
    daemon.stop().await;
    let (rows, helper, checks) = outcome?;
    if args.output.json {
        let output = Output { pools: args.pools, rows, helper, checks: checks.clone() };
        println!("{}", serde_json::to_string_pretty(&output)?);
    } else {
        println!("{} pools of {CAPACITY}, {} clients, one daemon (embedded store)", args.pools, args.clients);
        for row in &rows {
            println!(
                "  {:<7} {:>9.0} pairs/s   pair p50 {:.3} ms   p99 {:.3} ms   errors {}",
                row.target,
                row.pairs_per_s,
                row.pair_ms.p50,
                row.pair_ms.p99,
                row.errors + row.not_granted
            );
        }
        println!(
            "allocate helper under contention: {} clients, {} pools with {} slots, caching mux: {}/{} succeeded ({:.1} %), \
             allocate p50 {:.3} ms, p99 {:.3} ms{}",
            helper.clients,
            helper.pools,
            helper.slots,
            helper.succeeded,
            helper.attempts,
            helper.success_rate * 100.0,
            helper.allocate_ms.p50,
            helper.allocate_ms.p99,
            helper.first_error.as_deref().map(|e| format!(" (first failure: {e})")).unwrap_or_default()
        );
        println!("targets:");
        print!("{}", report::checks(&checks));
    }
    if args.check && checks.iter().any(|c| !c.ok) {
        bail!("a target was missed");
    }
    Ok(())
}

async fn measure(args: &PoolsBenchArgs, endpoint: &Endpoint) -> anyhow::Result<(Vec<Row>, HelperResult, Vec<Check>)> {
    let mut setup = Conn::connect(endpoint).await?;
    let run = load::run_id();
    let body = Bytes::from(format!(r#"{{"capacity":"{CAPACITY}"}}"#));
    for i in 0..args.pools {
        let (status, answer) = setup.request(Method::PUT, &format!("/v1/pools/bench-{run}-{i}"), body.clone()).await?;
        if !status.is_success() {
            bail!("cannot create pool {i}: {status}: {}", String::from_utf8_lossy(&answer));
        }
    }
    let namespace = format!("bench-{run}");
    load::setup_namespace(endpoint, &namespace, args.clients as u64 * 2).await?;
    let spec = args.window.spec(args.clients, &args.output);
    let mut connections = Vec::with_capacity(args.clients);
    for _ in 0..args.clients {
        connections.push(Mutex::new(Conn::connect(endpoint).await?));
    }
    let connections = Arc::new(connections);
    let pools = args.pools as u64;
    let prefix: Arc<str> = format!("/v1/pools/bench-{run}-").into();
    let pool_row = closed_loop("pools", args.clients, &spec, {
        let (connections, prefix) = (connections.clone(), prefix.clone());
        move |index, token| {
            let (connections, prefix) = (connections.clone(), prefix.clone());
            async move {
                let pool = pick(&token, pools);
                let mut conn = connections[index].lock().await;
                pool_pair(&mut conn, &format!("{prefix}{pool}")).await
            }
        }
    })
    .await;
    let grants: Arc<str> = format!("/v1/namespaces/{namespace}/grants/").into();
    let token_row = closed_loop("tokens", args.clients, &spec, {
        let (connections, grants) = (connections.clone(), grants.clone());
        move |index, token| {
            let (connections, grants) = (connections.clone(), grants.clone());
            async move {
                let mut conn = connections[index].lock().await;
                token_pair(&mut conn, &format!("{grants}{token}")).await
            }
        }
    })
    .await;
    let ratio = (token_row.pairs_per_s > 0.0).then(|| pool_row.pairs_per_s / token_row.pairs_per_s);
    let checks = vec![
        Check::at_least("pool pairs/s vs token pairs/s".to_owned(), ratio, MIN_RATIO),
        Check::at_most("pool pair errors".to_owned(), Some((pool_row.errors + pool_row.not_granted) as f64), 0.0),
    ];
    let helper = contention(args, endpoint, &run).await?;
    Ok((vec![pool_row, token_row], helper, checks))
}

/// `--contention-clients` clients share `--contention-pools` pools of `cpu=2` (two slots each):
/// each takes `cpu=1` with the allocate helper through a caching mux, holds it 20 ms and frees it.
async fn contention(args: &PoolsBenchArgs, endpoint: &Endpoint, run: &str) -> anyhow::Result<HelperResult> {
    use allot_client::pools::{allocate, AllocNeed, AllocateOptions, DaemonPool, Mux};
    let client = allot_client::Client::new(&endpoint.url())?;
    let mux = Arc::new(Mux::with_caching(Duration::from_secs(1)));
    for i in 0..args.contention_pools {
        let name = format!("contended-{run}-{i}");
        client.put_pool(&name, "cpu=2").await?;
        mux.add_pool(Arc::new(DaemonPool::new(client.clone(), name)?))?;
    }
    let request = Arc::new(AllocNeed::new("cpu=1".parse()?).with_owner("bench"));
    let deadline = tokio::time::Instant::now() + args.window.duration;
    let mut tasks = Vec::new();
    for _ in 0..args.contention_clients {
        let (mux, request) = (mux.clone(), request.clone());
        tasks.push(tokio::spawn(async move {
            let (mut attempts, mut succeeded, mut latencies, mut first_error) = (0u64, 0u64, Vec::new(), None);
            while tokio::time::Instant::now() < deadline {
                let started = std::time::Instant::now();
                attempts += 1;
                match allocate(&*mux, &request, &AllocateOptions::default()).await {
                    Ok(alloc) => {
                        succeeded += 1;
                        latencies.push(started.elapsed().as_nanos() as u64);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        let _ = mux.free(&alloc.uri).await;
                    }
                    Err(err) => {
                        first_error.get_or_insert_with(|| err.to_string());
                    }
                }
            }
            (attempts, succeeded, latencies, first_error)
        }));
    }
    let (mut attempts, mut succeeded, mut latencies, mut first_error) = (0, 0, Vec::new(), None);
    for task in tasks {
        let (a, s, l, e) = task.await?;
        attempts += a;
        succeeded += s;
        latencies.extend(l);
        if first_error.is_none() {
            first_error = e;
        }
    }
    Ok(HelperResult {
        pools: args.contention_pools,
        slots: args.contention_pools * 2,
        clients: args.contention_clients,
        attempts,
        succeeded,
        success_rate: if attempts == 0 { 0.0 } else { succeeded as f64 / attempts as f64 },
        allocate_ms: Latency::from_nanos(latencies),
        first_error,
    })
}

/// A pool for the pair named `token`: spread evenly, different for consecutive pairs.
fn pick(token: &str, pools: u64) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in token.bytes() {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    hash % pools
}

#[derive(serde::Deserialize)]
struct Accepted {
    id: String,
}

async fn pool_pair(conn: &mut Conn, pool: &str) -> Pair {
    let accepted =
        conn.request(Method::POST, &format!("{pool}/offers/1"), Bytes::from_static(ACCEPT_BODY.as_bytes())).await;
    let id = match accepted {
        Ok((StatusCode::CREATED, body)) => match serde_json::from_slice::<Accepted>(&body) {
            Ok(alloc) => alloc.id,
            Err(err) => return Pair::Failed(format!("accept answer: {err}")),
        },
        Ok((StatusCode::CONFLICT, _)) => return Pair::NotGranted,
        Ok((status, body)) => return Pair::Failed(format!("accept: {status}: {}", String::from_utf8_lossy(&body))),
        Err(err) => return Pair::Failed(format!("accept: {err:#}")),
    };
    match conn.request(Method::DELETE, &format!("{pool}/allocs/{id}"), Bytes::new()).await {
        Ok((StatusCode::OK, _)) => Pair::Done,
        Ok((status, body)) => Pair::Failed(format!("free: {status}: {}", String::from_utf8_lossy(&body))),
        Err(err) => Pair::Failed(format!("free: {err:#}")),
    }
}

async fn token_pair(conn: &mut Conn, grant: &str) -> Pair {
    match conn.request(Method::PUT, grant, Bytes::from_static(b"{}")).await {
        Ok((StatusCode::OK, body)) if body.windows(9).any(|w| w == b"\"Granted\"") => {}
        Ok((StatusCode::OK, _)) => return Pair::NotGranted,
        Ok((status, body)) => return Pair::Failed(format!("allocate: {status}: {}", String::from_utf8_lossy(&body))),
        Err(err) => return Pair::Failed(format!("allocate: {err:#}")),
    }
    match conn.request(Method::DELETE, grant, Bytes::new()).await {
        Ok((StatusCode::OK, _)) => Pair::Done,
        Ok((status, body)) => Pair::Failed(format!("release: {status}: {}", String::from_utf8_lossy(&body))),
        Err(err) => Pair::Failed(format!("release: {err:#}")),
    }
}
