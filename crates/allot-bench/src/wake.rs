//! `allot bench wake`: how long after a release the next waiter gets its grant.
//!
//! In a namespace with quota 1, each sample: a holder allocates the unit; a waiter sends an
//! allocate with `wait_ms` on its own connection; once the waiter shows in the namespace's waiter
//! list, the holder releases. The wake latency is the time from sending the release until the
//! waiter's `Granted` answer has arrived. The waiter then releases its grant for the next sample.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hyper::body::Bytes;
use hyper::{Method, StatusCode};
use serde::Serialize;

use crate::children::{self, Scratch, Server};
use crate::http::{encode_segment, Conn, Endpoint};
use crate::latency::Latency;
use crate::load::{self, progress_bar_len, show_progress};
use crate::report::{self, Check};
use crate::WakeArgs;

/// How long the waiter asks to wait; far longer than any sample should take.
const WAIT_MS: u64 = 10_000;
/// How long to look for the waiter in the waiter list.
const QUEUE_TIMEOUT: Duration = Duration::from_secs(5);
/// The wake latency target at p99 (ms).
const MAX_P99_MS: f64 = 10.0;
/// The wake latency target at p99 across daemons sharing a Redis (ms).
const MAX_P99_ACROSS_DAEMONS_MS: f64 = 100.0;

/// The JSON output of `allot bench wake --json`.
#[derive(Serialize)]
struct WakeOutput {
    url: String,
    samples: usize,
    /// From sending the release until the waiter's grant arrived.
    wake_ms: Latency,
    /// From sending the release until its own answer arrived.
    release_ms: Latency,
    checks: Vec<Check>,
}

/// Runs `allot bench wake`.
pub(super) async fn run(args: WakeArgs) -> anyhow::Result<()> {
    if args.samples == 0 {
        bail!("--samples must be at least 1");
    }
    let scratch = Scratch::new(args.tmp_dir.as_deref())?;
    let server = match &args.server {
        Some(_) => None,
        None => {
            let exe = std::env::current_exe()?;
            let data_dir = scratch.join("allot-data").into_os_string();
            let serve_args = ["serve".into(), "--listen".into(), "127.0.0.1:0".into(), "--data-dir".into(), data_dir];
            Some(children::spawn_listening("allot", &exe, &serve_args, scratch.join("allot.log"), None).await?)
        }
    };
    let outcome = measure(&args, server.as_ref()).await;
    if let Some(server) = server {
        server.stop().await;
    }
    let output = outcome?;
    if args.output.json {
        println!("{}", serde_json::to_string_pretty(&output)?);
    } else {
        println!("wake latency ({}), {} samples, ms:", output.url, output.samples);
        println!("  {:<9} {:>8} {:>8} {:>8} {:>8} {:>8}", "", "p50", "p90", "p99", "max", "mean");
        for (name, latency) in [("wake", &output.wake_ms), ("release", &output.release_ms)] {
            println!(
                "  {name:<9} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>8.3}",
                latency.p50, latency.p90, latency.p99, latency.max, latency.mean
            );
        }
        println!("targets:");
        print!("{}", report::checks(&output.checks));
    }
    if args.check && output.checks.iter().any(|check| !check.ok) {
        bail!("the daemon missed a target");
    }
    Ok(())
}

async fn measure(args: &WakeArgs, server: Option<&Server>) -> anyhow::Result<WakeOutput> {
    let endpoint = match (&args.server, server) {
        (_, Some(server)) => server.endpoint.clone(),
        (Some(url), None) => Endpoint::parse(url)?,
        (None, None) => bail!("no server"),
    };
    let own_namespace = args.namespace.is_none();
    let namespace = args.namespace.clone().unwrap_or_else(|| format!("bench-wake-{}", load::run_id()));
    load::setup_namespace(&endpoint, &namespace, 1)
        .await
        .with_context(|| format!("cannot set up namespace `{namespace}` with quota 1 at {}", endpoint.url()))?;
    let paths = Paths::new(&namespace);
    // The holder releases through another daemon when one is given (daemons sharing a Redis).
    let release_endpoint = match &args.release_server {
        Some(url) => Endpoint::parse(url)?,
        None => endpoint.clone(),
    };
    let mut holder = Conn::connect(&release_endpoint).await?;
    let mut waiter = Conn::connect(&endpoint).await?;
    let mut poller = Conn::connect(&release_endpoint).await?;

    let total = args.warmup_samples + args.samples;
    let bar = progress_bar_len(show_progress(&args.output), "wake", total as u64);
    let run = load::run_id();
    let mut wakes = Vec::with_capacity(args.samples);
    let mut releases = Vec::with_capacity(args.samples);
    let mut outcome = Ok(());
    for i in 0..total {
        match sample(&paths, &mut holder, &mut waiter, &mut poller, &format!("{run}-{i}")).await {
            Ok((wake, release)) if i >= args.warmup_samples => {
                wakes.push(wake);
                releases.push(release);
            }
            Ok(_) => {}
            Err(err) => {
                outcome = Err(err.context(format!("sample {i}")));
                break;
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    if own_namespace {
        if let Err(err) = load::remove_namespace(&endpoint, &namespace).await {
            eprintln!("warning: cannot remove namespace `{namespace}`: {err:#}");
        }
    }
    outcome?;
    let wake_ms = Latency::from_nanos(wakes);
    let (what, limit) = match &args.release_server {
        None => ("p99 wake latency (ms)", MAX_P99_MS),
        Some(_) => ("p99 wake latency across daemons (ms)", MAX_P99_ACROSS_DAEMONS_MS),
    };
    let checks = vec![Check::at_most(what.to_owned(), Some(wake_ms.p99), limit)];
    Ok(WakeOutput {
        url: endpoint.url(),
        samples: args.samples,
        wake_ms,
        release_ms: Latency::from_nanos(releases),
        checks,
    })
}

/// The paths of one namespace.
struct Paths {
    grants: String,
    waiters: String,
}

impl Paths {
    fn new(namespace: &str) -> Paths {
        let namespace = format!("/v1/namespaces/{}", encode_segment(namespace));
        Paths { grants: format!("{namespace}/grants/"), waiters: format!("{namespace}/waiters") }
    }

    fn grant(&self, token: &str) -> String {
        format!("{}{}", self.grants, encode_segment(token))
    }
}

/// One wake-up; returns the wake latency and the release's own latency, in nanoseconds.
async fn sample(
    paths: &Paths,
    holder: &mut Conn,
    waiter: &mut Conn,
    poller: &mut Conn,
    id: &str,
) -> anyhow::Result<(u64, u64)> {
    let (held, waiting) = (format!("h-{id}"), format!("w-{id}"));
    let (held_path, waiting_path) = (paths.grant(&held), paths.grant(&waiting));
    expect_granted("holder allocate", holder.request(Method::PUT, &held_path, Bytes::from_static(b"{}")).await?)?;

    let wait_body = Bytes::from(format!(r#"{{"wait_ms":{WAIT_MS}}}"#));
    let waiting_call = async {
        let answer = waiter.request(Method::PUT, &waiting_path, wait_body).await;
        (answer, Instant::now())
    };
    let release_call = async {
        wait_until_queued(poller, &paths.waiters, &waiting).await?;
        let sent = Instant::now();
        let answer = holder.request(Method::DELETE, &held_path, Bytes::new()).await?;
        anyhow::Ok((answer, sent, Instant::now()))
    };
    let ((waiter_answer, woken), released) = tokio::join!(waiting_call, release_call);
    let (release_answer, sent, release_done) = released?;
    expect_granted("waiter allocate", waiter_answer?)?;
    expect_released("holder release", release_answer)?;
    expect_released("waiter release", waiter.request(Method::DELETE, &waiting_path, Bytes::new()).await?)?;
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    Ok((nanos(woken.saturating_duration_since(sent)), nanos(release_done - sent)))
}

/// Polls the waiter list until `token` is in it.
async fn wait_until_queued(poller: &mut Conn, waiters: &str, token: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + QUEUE_TIMEOUT;
    loop {
        let (status, body) = poller.request(Method::GET, waiters, Bytes::new()).await?;
        if status != StatusCode::OK {
            bail!("GET {waiters} answered {status}: {}", String::from_utf8_lossy(&body));
        }
        let list: allot_api::WaiterList =
            serde_json::from_slice(&body).with_context(|| format!("GET {waiters}: not a waiter list"))?;
        if list.waiters.iter().any(|waiter| waiter.token == token) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the waiter `{token}` did not show in {waiters} within {QUEUE_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn expect_granted(what: &str, (status, body): (StatusCode, Bytes)) -> anyhow::Result<()> {
    let answer: Option<allot_api::AllocateResponse> = serde_json::from_slice(&body).ok();
    match answer {
        Some(answer) if status == StatusCode::OK && answer.status == allot_api::Status::Granted => Ok(()),
        _ => bail!("{what}: expected Granted, got {status}: {}", String::from_utf8_lossy(&body)),
    }
}

fn expect_released(what: &str, (status, body): (StatusCode, Bytes)) -> anyhow::Result<()> {
    let answer: Option<allot_api::ReleaseResponse> = serde_json::from_slice(&body).ok();
    match answer {
        Some(answer) if status == StatusCode::OK && answer.released => Ok(()),
        _ => bail!("{what}: expected released, got {status}: {}", String::from_utf8_lossy(&body)),
    }
}
