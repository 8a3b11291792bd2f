//! `allot bench compare`: the same pair load, one target at a time, against the baseline server, a
//! fresh daemon with durability on, and Throttle when it is installed; then a table with every
//! target's pairs/s as a ratio of the baseline's and the checks against the targets.

use std::ffi::OsString;

use anyhow::bail;
use serde::Serialize;

use super::children::{self, Scratch, Server};
use super::load::{self, LoadResult, LoadSpec, Target};
use super::report::{self, Check};
use super::CompareArgs;

/// The daemon must serve at least this share of the baseline's pairs/s.
const MIN_RATIO: f64 = 0.85;
/// The daemon's p99 request latency at [`P99_CLIENTS`] clients must be at most this (ms).
const MAX_P99_MS: f64 = 5.0;
const P99_CLIENTS: usize = 16;

/// The JSON output of `allot bench compare --json`.
#[derive(Serialize)]
struct CompareOutput {
    results: Vec<LoadResult>,
    checks: Vec<Check>,
    /// Targets that could not be measured, and why.
    skipped: Vec<String>,
}

/// Runs `allot bench compare`.
pub(super) async fn run(args: CompareArgs) -> anyhow::Result<()> {
    if args.clients.is_empty() || args.clients.contains(&0) {
        bail!("--clients must list numbers of clients of at least 1, e.g. 16,64");
    }
    let quota = args.load.quota.max(args.clients.iter().copied().max().unwrap_or(1) as u64);
    let namespace = args.load.namespace.clone();
    let scratch = Scratch::new(args.tmp_dir.as_deref())?;
    let exe = std::env::current_exe()?;
    let mut skipped = Vec::new();
    let mut servers: Vec<Server> = Vec::new();
    let mut targets: Vec<Target> = Vec::new();

    let spawns: [(&str, Vec<OsString>); 2] = [
        ("baseline", vec!["baseline-server".into(), "--listen".into(), "127.0.0.1:0".into()]),
        (
            "allot",
            vec![
                "serve".into(),
                "--listen".into(),
                "127.0.0.1:0".into(),
                "--data-dir".into(),
                scratch.join("allot-data").into(),
            ],
        ),
    ];
    for (name, child_args) in spawns {
        let started = children::spawn_listening(name, &exe, &child_args, scratch.join(&format!("{name}.log"))).await;
        let server = match started {
            Ok(server) => server,
            Err(err) => {
                skip(&mut skipped, format!("{err:#}"));
                continue;
            }
        };
        match load::setup_namespace(&server.endpoint, &namespace, quota).await {
            Ok(()) => targets.push(Target::allot(name, server.endpoint.clone(), &namespace)),
            Err(err) => skip(&mut skipped, format!("{name}: cannot set up namespace `{namespace}`: {err:#}")),
        }
        servers.push(server);
    }

    if !args.no_throttle {
        match args.throttle.clone().or_else(children::find_throttle) {
            None => skip(
                &mut skipped,
                "throttle: not installed (`cargo install throttle-server`, or pass --throttle PATH)".to_owned(),
            ),
            Some(program) => match children::spawn_throttle(&program, &scratch, &namespace, quota).await {
                Ok(server) => {
                    targets.push(Target::throttle("throttle", server.endpoint.clone(), &namespace));
                    servers.push(server);
                }
                Err(err) => skip(&mut skipped, format!("{err:#}")),
            },
        }
    }

    let mut results = Vec::new();
    for &clients in &args.clients {
        for target in &targets {
            let spec = LoadSpec::new(clients, args.duration, &args.load, &args.output);
            match load::run_load(target, &spec).await {
                Ok(result) => {
                    if !args.output.json {
                        eprintln!(
                            "{} × {clients}: {:.0} pairs/s, p99 {:.3} ms",
                            target.name, result.pairs_per_s, result.request_ms.p99
                        );
                    }
                    results.push(result);
                }
                Err(err) => skip(&mut skipped, format!("{} × {clients}: {err:#}", target.name)),
            }
        }
    }
    for server in servers {
        server.stop().await;
    }

    let checks = checks(&args.clients, &results);
    if args.output.json {
        let output = CompareOutput { results, checks: checks.clone(), skipped };
        println!("{}", serde_json::to_string_pretty(&output)?);
    } else {
        print!("{}", report::compare_table(&results));
        println!("targets (allot, durability on):");
        print!("{}", report::checks(&checks));
    }
    if args.check && checks.iter().any(|check| !check.ok) {
        bail!("the daemon missed a target");
    }
    Ok(())
}

/// Says on stderr that something is not measured, and remembers it for the JSON output.
fn skip(skipped: &mut Vec<String>, reason: String) {
    eprintln!("skipped: {reason}");
    skipped.push(reason);
}

/// The targets for the daemon: pairs/s ratio to the baseline at every number of clients,
/// p99 request latency at 16 clients, no errors.
fn checks(clients: &[usize], results: &[LoadResult]) -> Vec<Check> {
    let mut checks = Vec::new();
    for &n in clients {
        let allot = results.iter().find(|r| r.target == "allot" && r.clients == n);
        let ratio = allot.and_then(|allot| report::ratio_to_baseline(results, allot));
        checks.push(Check::at_least(format!("pairs/s vs baseline at {n} clients"), ratio, MIN_RATIO));
        if n == P99_CLIENTS {
            let p99 = allot.map(|allot| allot.request_ms.p99);
            checks.push(Check::at_most(format!("p99 request latency (ms) at {n} clients"), p99, MAX_P99_MS));
        }
        let errors = allot.map(|allot| (allot.errors + allot.not_granted) as f64);
        checks.push(Check::at_most(format!("errors at {n} clients"), errors, 0.0));
    }
    checks
}
