//! `allot bench compare`'s probe of allot's own work: allocate+release pairs handed to the
//! daemon's parts in this process, with no socket, so the daemon's CPU per pair under the load
//! splits into the HTTP stack with the kernel (what the baseline server costs) and allot's own
//! work (what this measures).
//!
//! - `api`: the whole API service as `allot serve` builds it (the hot path's recognition and
//!   access check, the body's JSON, the store, metrics, the JSON answer), handed requests made in
//!   memory; the answers' bodies are read. The binary gives it ([`ApiOver`]): the load generator
//!   does not link the server.
//! - `store`: the embedded store at the `process` level called directly (the ledger's decision,
//!   the log record with its events, the change feed).
//!
//! Each runs on one thread of its own, like a serving thread, on the servers' CPUs with `--pin`;
//! the CPU counted is the whole process's (the store's checkpointer among it), while the load
//! generator is idle.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_core::{AllocateRequest, Constraints, LeaseRequest, NamespaceName, Token};
use allot_store::{Durability, EmbeddedConfig, EmbeddedStore, QuotaStore, Store};
use anyhow::Context as _;
use axum::body::Body;
use axum::http::{Method, Request};
use axum::response::Response;
use serde::Serialize;
use tower::util::BoxCloneSyncService;
use tower::ServiceExt as _;

/// Tokens cycled through, one per client of the load's smallest count.
const TOKENS: usize = 16;

/// CPU per allocate+release pair of allot's own work, in µs.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct OwnWork {
    pub(crate) api_us_per_pair: f64,
    pub(crate) store_us_per_pair: f64,
}

/// `allot bench own-work`: the probe alone, in rounds.
pub(crate) async fn run(args: crate::OwnWorkArgs, api_over: ApiOver) -> anyhow::Result<()> {
    anyhow::ensure!(args.rounds >= 1, "--rounds must be at least 1");
    let cpus = args.cpu.map(|cpu| vec![cpu]);
    let mut rounds = Vec::new();
    for round in 1..=args.rounds {
        let (duration, cpus) = (args.duration, cpus.clone());
        let own = tokio::task::spawn_blocking(move || measure(duration, cpus, api_over)).await??;
        if !args.output.json {
            println!(
                "round {round}: the API {:.2} µs CPU/pair, of which the store {:.2}",
                own.api_us_per_pair, own.store_us_per_pair
            );
        }
        rounds.push(own);
    }
    let median = |of: fn(&OwnWork) -> f64| crate::report::median(rounds.iter().map(of).collect()).unwrap_or(f64::NAN);
    let medians =
        OwnWork { api_us_per_pair: median(|o| o.api_us_per_pair), store_us_per_pair: median(|o| o.store_us_per_pair) };
    if args.output.json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "rounds": rounds, "median": medians }))?);
    } else {
        println!(
            "median: the API {:.2} µs CPU/pair, of which the store {:.2}",
            medians.api_us_per_pair, medians.store_us_per_pair
        );
    }
    Ok(())
}

/// The daemon's whole API over a store, as `allot serve` builds it, boxed (which adds one
/// allocation per call to what the probe measures).
pub type ApiOver = fn(Arc<dyn Store>) -> BoxCloneSyncService<Request<Body>, Response, Infallible>;

/// Measures both for about `duration` each, on a thread restricted to `cpus` (if any).
pub(crate) fn measure(duration: Duration, cpus: Option<Vec<usize>>, api_over: ApiOver) -> anyhow::Result<OwnWork> {
    let probe = std::thread::spawn(move || -> anyhow::Result<OwnWork> {
        if let Some(cpus) = &cpus {
            allot_host::affinity::restrict_thread(0, cpus).context("cannot move the probe to the servers' CPUs")?;
        }
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let scratch = tempfile::tempdir()?;
        let store_us_per_pair = runtime.block_on(store_pairs(&scratch.path().join("store"), duration))?;
        let api_us_per_pair = runtime.block_on(api_pairs(&scratch.path().join("api"), duration, api_over))?;
        Ok(OwnWork { api_us_per_pair, store_us_per_pair })
    });
    probe.join().map_err(|_| anyhow::anyhow!("the probe of allot's own work panicked"))?
}

async fn open(dir: &std::path::Path) -> anyhow::Result<Arc<EmbeddedStore>> {
    let config = EmbeddedConfig::new(dir).with_durability(Durability::Process);
    let store = EmbeddedStore::open(&config)?;
    store.put_namespace(NamespaceName::new("bench")?, 1_000_000).await?;
    Ok(Arc::new(store))
}

/// Runs `pair` until `duration` has passed; the process's CPU µs per pair.
async fn per_pair<F: AsyncFnMut(usize) -> anyhow::Result<()>>(duration: Duration, mut pair: F) -> anyhow::Result<f64> {
    let own = std::process::id();
    let cpu = || crate::cpu::process_cpu_seconds(own).context("cannot read this process's CPU time");
    let (started, cpu_before) = (Instant::now(), cpu()?);
    let mut pairs = 0;
    while started.elapsed() < duration {
        // The clock read once per 256 pairs.
        for _ in 0..256 {
            pair(pairs).await?;
            pairs += 1;
        }
    }
    Ok((cpu()? - cpu_before) * 1e6 / pairs as f64)
}

async fn store_pairs(dir: &std::path::Path, duration: Duration) -> anyhow::Result<f64> {
    let store = open(dir).await?;
    let namespace = NamespaceName::new("bench")?;
    let tokens: Vec<Token> = (0..TOKENS).map(|i| Token::new(&format!("token-{i}"))).collect::<Result<_, _>>()?;
    let measured = per_pair(duration, async |i| {
        let token = tokens[i % TOKENS].clone();
        let request = AllocateRequest {
            namespace: namespace.clone(),
            token: token.clone(),
            units: 1,
            scope: None,
            constraints: Constraints::default(),
            lease: LeaseRequest::None,
        };
        store.allocate(request, Duration::ZERO).await?;
        store.release(namespace.clone(), token, None).await?;
        Ok(())
    })
    .await;
    store.shutdown().await;
    measured
}

async fn api_pairs(dir: &std::path::Path, duration: Duration, api_over: ApiOver) -> anyhow::Result<f64> {
    let store = open(dir).await?;
    let api = api_over(store.clone());
    let paths: Vec<String> = (0..TOKENS).map(|i| format!("/v1/namespaces/bench/grants/token-{i}")).collect();
    let measured = per_pair(duration, async |i| {
        for (method, body) in [(Method::PUT, r#"{"units":1}"#), (Method::DELETE, "")] {
            let request = Request::builder()
                .method(method)
                .uri(paths[i % TOKENS].as_str())
                .header("content-type", "application/json")
                .body(Body::from(body))?;
            let answer = api.clone().oneshot(request).await?;
            anyhow::ensure!(answer.status().is_success(), "the probe's call was answered {}", answer.status());
            axum::body::to_bytes(answer.into_body(), usize::MAX).await?;
        }
        Ok(())
    })
    .await;
    store.shutdown().await;
    measured
}
