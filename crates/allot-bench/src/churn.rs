//! `allot bench churn`: growth is bounded (issue 43, point 7).
//!
//! A fresh daemon on its embedded store, with every retention set to `--retention` (ended
//! applications, ended allocs, kept events, outputs kept for reuse) and its executor on the
//! applications' pool, takes `--duration` of churn at full speed: `--clients` connections each
//! allocating and releasing tokens of new names, as many accepting and freeing allocs, and two
//! submitting applications of ten `noop` tasks (which run and complete). Every `--sample` the
//! data directory's size on disk is read with what the daemon holds: the live state (grants,
//! allocs and applications not ended) and what retention keeps (ended allocs and applications).
//! Then the load stops and, once `--retention` and a sweep more have passed, a last sample shows
//! the store back at its live state.
//!
//! What it shows: the store's size levels off once the retention is reached, at the live state
//! plus what retention keeps, instead of growing with the work done. No target is checked (the
//! figures are read against each other).
//!
//! With `--redis` the daemon runs on a `redis-server` started for the run (append-only file on):
//! Redis's `used_memory` is sampled too, and the disk is Redis's directory.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hyper::body::Bytes;
use hyper::{Method, StatusCode};
use serde::Serialize;

use crate::apps::call;
use crate::children::{self, Scratch};
use crate::http::Conn;
use crate::leases::{disk_usage, redis_memory};
use crate::ChurnBenchArgs;

const NAMESPACE: &str = "churn-tokens";
const ALLOC_POOL: &str = "churn-allocs";
const APP_POOL: &str = "churn-apps";
const QUEUE: &str = "root.churn";
const TASKS_PER_APP: usize = 10;

#[derive(Debug, Serialize)]
struct Output {
    store: &'static str,
    duration_s: f64,
    retention_s: f64,
    done: Done,
    samples: Vec<Sample>,
    /// After the load stopped and the retention passed.
    settled: Sample,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
struct Done {
    token_pairs: u64,
    alloc_pairs: u64,
    apps: u64,
}

#[derive(Debug, Clone, Serialize)]
struct Sample {
    at_s: f64,
    disk_bytes: u64,
    /// On Redis: its `used_memory`.
    redis_used_memory: Option<u64>,
    /// The live state.
    grants: u64,
    allocs: u64,
    apps_live: u64,
    /// What retention keeps (ended allocs are kept too, at most 1,024 per pool, not counted here).
    apps_ended: u64,
    /// The runs the store keeps (each application's tasks have one): read from Redis at every
    /// sample, from the embedded store's files once the daemon stopped (the last sample only).
    runs: Option<u64>,
    done: Done,
}

#[derive(Default)]
struct Counters {
    token_pairs: AtomicU64,
    alloc_pairs: AtomicU64,
    apps: AtomicU64,
}

impl Counters {
    fn done(&self) -> Done {
        Done {
            token_pairs: self.token_pairs.load(Ordering::Relaxed),
            alloc_pairs: self.alloc_pairs.load(Ordering::Relaxed),
            apps: self.apps.load(Ordering::Relaxed),
        }
    }
}

pub(super) async fn run(args: ChurnBenchArgs) -> anyhow::Result<()> {
    if args.clients == 0 || args.sample.is_zero() || args.retention.is_zero() {
        bail!("--clients, --sample and --retention must be more than 0");
    }
    let scratch = Scratch::new(args.tmp_dir.as_deref())?;
    let retention = humantime::format_duration(args.retention).to_string();
    let config = format!(
        "[scheduler]\napp_retention = \"{retention}\"\ncompleting_grace = \"1s\"\n\
         [alloc_leases]\nretention = \"{retention}\"\n\
         [watch]\nretain_for = \"{retention}\"\n\
         [executor]\ncache_retention = \"{retention}\"\n"
    );
    let config_path = scratch.join("churn.toml");
    std::fs::write(&config_path, config).context("cannot write the daemon's configuration")?;
    let mut more: Vec<std::ffi::OsString> =
        vec!["--config".into(), config_path.into(), "--run-pool".into(), APP_POOL.into()];
    let redis = args.redis.then(allot_host::redis::RedisServer::start);
    if let Some(redis) = &redis {
        more.extend(["--store".into(), redis.url().into()]);
    }
    let daemon = children::spawn_daemon_with(&scratch, &more).await?;
    let endpoint = daemon.endpoint.clone();
    let store = Store { data: scratch.join("allot-data"), redis: redis.as_ref() };
    let mut setup = Conn::connect(&endpoint).await?;
    crate::load::setup_namespace(&endpoint, NAMESPACE, args.clients as u64).await?;
    for pool in [ALLOC_POOL, APP_POOL] {
        let body = serde_json::to_vec(&serde_json::json!({ "capacity": "cpu=100000,mem=100000GiB" }))?;
        call(&mut setup, Method::PUT, &format!("/v1/pools/{pool}"), body).await?;
    }
    call(&mut setup, Method::PUT, &format!("/v1/queues/{QUEUE}"), b"{}".to_vec()).await?;

    let counters = Arc::new(Counters::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = Vec::new();
    for c in 0..args.clients {
        let conn = Conn::connect(&endpoint).await?;
        load.push(tokio::spawn(tokens(conn, c, counters.clone(), stop.clone())));
        let conn = Conn::connect(&endpoint).await?;
        load.push(tokio::spawn(allocs(conn, counters.clone(), stop.clone())));
    }
    for c in 0..2 {
        let conn = Conn::connect(&endpoint).await?;
        load.push(tokio::spawn(apps(conn, c, counters.clone(), stop.clone())));
    }
    let started = Instant::now();
    let mut samples = Vec::new();
    while started.elapsed() < args.duration {
        tokio::time::sleep(args.sample.min(args.duration.saturating_sub(started.elapsed()))).await;
        let sample = sample(&mut setup, &store, started, counters.done()).await?;
        eprintln!(
            "{:>6.0} s: {} bytes on disk{}; live {} grants, {} allocs, {} applications; kept {} ended applications{}",
            sample.at_s,
            sample.disk_bytes,
            sample.redis_used_memory.map(|m| format!(", Redis used_memory {m}")).unwrap_or_default(),
            sample.grants,
            sample.allocs,
            sample.apps_live,
            sample.apps_ended,
            sample.runs.map(|r| format!(", {r} runs")).unwrap_or_default()
        );
        samples.push(sample);
    }
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await??;
    }
    let done = counters.done();
    // Everything ended during the load is past its retention after this long, and swept.
    tokio::time::sleep(args.retention + Duration::from_secs(15)).await;
    let mut settled = sample(&mut setup, &store, started, done).await?;
    daemon.stop().await;
    if store.redis.is_none() {
        settled.runs = Some(embedded_runs(&store.data).await?);
    }
    let output = Output {
        store: if args.redis { "redis" } else { "embedded" },
        duration_s: args.duration.as_secs_f64(),
        retention_s: args.retention.as_secs_f64(),
        done,
        samples,
        settled,
    };
    if args.output.json {
        println!("{}", serde_json::to_string_pretty(&output)?);
    } else {
        print(&output);
    }
    Ok(())
}

fn print(o: &Output) {
    let d = &o.done;
    println!(
        "churn on the {} store for {:.0} s with every retention {:.0} s: {} token pairs, {} alloc pairs, {} \
         applications of {TASKS_PER_APP} tasks",
        o.store, o.duration_s, o.retention_s, d.token_pairs, d.alloc_pairs, d.apps
    );
    println!(
        "{:>8} {:>14} {:>14} {:>8} {:>8} {:>10} {:>12} {:>8}",
        "at s", "disk bytes", "Redis memory", "grants", "allocs", "apps live", "apps ended", "runs"
    );
    for s in o.samples.iter().chain(std::iter::once(&o.settled)) {
        let memory = s.redis_used_memory.map_or_else(|| "-".to_owned(), |m| m.to_string());
        let runs = s.runs.map_or_else(|| "-".to_owned(), |r| r.to_string());
        println!(
            "{:>8.0} {:>14} {memory:>14} {:>8} {:>8} {:>10} {:>12} {runs:>8}",
            s.at_s, s.disk_bytes, s.grants, s.allocs, s.apps_live, s.apps_ended
        );
    }
    println!("(the last line: the load stopped, the retention passed)");
}

/// Where the store keeps its state.
struct Store<'r> {
    data: std::path::PathBuf,
    redis: Option<&'r allot_host::redis::RedisServer>,
}

async fn sample(conn: &mut Conn, store: &Store<'_>, started: Instant, done: Done) -> anyhow::Result<Sample> {
    let namespace: allot_api::Namespace =
        serde_json::from_slice(&call(conn, Method::GET, &format!("/v1/namespaces/{NAMESPACE}"), Vec::new()).await?)?;
    let pool: allot_api::Pool =
        serde_json::from_slice(&call(conn, Method::GET, &format!("/v1/pools/{ALLOC_POOL}"), Vec::new()).await?)?;
    let (mut apps_live, mut apps_ended) = (0, 0);
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(cursor) => format!("/v1/apps?limit=1000&cursor={cursor}"),
            None => "/v1/apps?limit=1000".to_owned(),
        };
        let page: allot_api::AppList = serde_json::from_slice(&call(conn, Method::GET, &path, Vec::new()).await?)?;
        for app in &page.apps {
            match app.state.as_str() {
                "Completed" | "Failed" | "Rejected" => apps_ended += 1,
                _ => apps_live += 1,
            }
        }
        cursor = page.next_cursor;
        if cursor.is_none() {
            break;
        }
    }
    Ok(Sample {
        at_s: started.elapsed().as_secs_f64(),
        disk_bytes: match store.redis {
            Some(redis) => disk_usage(redis.dir())?,
            None => disk_usage(&store.data)?,
        },
        redis_used_memory: store.redis.map(redis_memory).transpose()?,
        grants: namespace.grants,
        allocs: pool.allocs,
        apps_live,
        apps_ended,
        runs: store.redis.map(redis_runs).transpose()?,
        done,
    })
}

/// The runs a Redis keeps.
fn redis_runs(redis: &allot_host::redis::RedisServer) -> anyhow::Result<u64> {
    redis.cli(&["HLEN", "allot:{allot-runs}:runs"]).trim().parse().context("unreadable HLEN of the runs")
}

/// The runs an embedded store keeps in `data_dir` (its daemon stopped).
async fn embedded_runs(data_dir: &std::path::Path) -> anyhow::Result<u64> {
    use allot_store::{RunStore, Store as _};
    let store = allot_store::EmbeddedStore::open(&allot_store::EmbeddedConfig::new(data_dir))
        .context("cannot open the stopped daemon's store")?;
    let runs = store.runs().await?.len() as u64;
    store.shutdown().await;
    Ok(runs)
}

/// Allocates and releases tokens of new names until stopped.
async fn tokens(mut conn: Conn, client: usize, counters: Arc<Counters>, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let path = format!("/v1/namespaces/{NAMESPACE}/grants/t-{client}-{i}");
        for method in [Method::PUT, Method::DELETE] {
            let (status, body) = conn.request(method, &path, Bytes::new()).await?;
            if status != StatusCode::OK {
                bail!("{path}: {status}: {}", String::from_utf8_lossy(&body));
            }
        }
        counters.token_pairs.fetch_add(1, Ordering::Relaxed);
        i += 1;
    }
    Ok(())
}

#[derive(serde::Deserialize)]
struct Accepted {
    id: String,
}

/// Accepts and frees allocs until stopped.
async fn allocs(mut conn: Conn, counters: Arc<Counters>, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    let pool = format!("/v1/pools/{ALLOC_POOL}");
    let accept = Bytes::from_static(br#"{"min":"cpu=1,mem=1GiB","owner":"churn"}"#);
    while !stop.load(Ordering::Relaxed) {
        let (status, body) = conn.request(Method::POST, &format!("{pool}/offers/1"), accept.clone()).await?;
        if status != StatusCode::CREATED {
            bail!("accept: {status}: {}", String::from_utf8_lossy(&body));
        }
        let id = serde_json::from_slice::<Accepted>(&body)?.id;
        let (status, body) = conn.request(Method::DELETE, &format!("{pool}/allocs/{id}"), Bytes::new()).await?;
        if status != StatusCode::OK {
            bail!("free: {status}: {}", String::from_utf8_lossy(&body));
        }
        counters.alloc_pairs.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// Submits applications of `noop` tasks until stopped, never more than 20 of its own unended.
async fn apps(mut conn: Conn, client: usize, counters: Arc<Counters>, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    let mut i = 0u64;
    let tasks: Vec<serde_json::Value> = (0..TASKS_PER_APP)
        .map(|t| serde_json::json!({ "id": format!("t-{t}"), "resources": "cpu=1", "spec": { "type": "noop" } }))
        .collect();
    while !stop.load(Ordering::Relaxed) {
        let id = format!("churn-{client}-{i}");
        let body = serde_json::json!({ "id": id, "queue": QUEUE, "user": "churn", "tasks": tasks });
        call(&mut conn, Method::POST, "/v1/apps", serde_json::to_vec(&body)?).await?;
        counters.apps.fetch_add(1, Ordering::Relaxed);
        // Paced by the executor: an application 20 back must have ended first.
        if i >= 20 {
            let back = format!("/v1/apps/churn-{client}-{}", i - 20);
            loop {
                let app: allot_api::App =
                    serde_json::from_slice(&call(&mut conn, Method::GET, &back, Vec::new()).await?)?;
                if matches!(app.state.as_str(), "Completed" | "Failed") || stop.load(Ordering::Relaxed) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        i += 1;
    }
    Ok(())
}
