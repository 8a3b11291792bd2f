//! `allot bench compare`: the same pair load, one target at a time, in rounds: the baseline
//! server, a fresh daemon at each durability level, Throttle when it is installed and etcd when it
//! is installed; then a table of every target's medians over the rounds (pairs/s as a ratio of the
//! baseline's, latency, the server's CPU time per pair) and the checks against the targets.

use std::ffi::OsString;

use anyhow::bail;
use serde::Serialize;

use crate::children::{self, Scratch, Server};
use crate::load::{self, LoadResult, LoadSpec, Target};
use crate::own_work::OwnWork;
use crate::placement::Placement;
use crate::report::{self, Check, Summary};
use crate::CompareArgs;

/// At the process level, pairs/s at least this multiple of Throttle's, at every number of
/// clients (issue 41).
const PROCESS_VS_THROTTLE: f64 = 1.1;
/// At the process level, server CPU per pair at most this multiple of Throttle's.
const PROCESS_CPU_VS_THROTTLE: f64 = 0.9;
/// At the disk level, pairs/s at least this share of the baseline's, at [`DISK_BASELINE_CLIENTS`].
const DISK_VS_BASELINE: f64 = 0.5;
const DISK_BASELINE_CLIENTS: [usize; 2] = [64, 256];
/// At the disk level, pairs/s at least this multiple of etcd's, at [`DISK_ETCD_CLIENTS`].
const DISK_VS_ETCD: f64 = 8.0;
const DISK_ETCD_CLIENTS: [usize; 2] = [16, 64];
/// Both levels: p99 request latency at most this (ms) at [`P99_CLIENTS`], in every round.
const MAX_P99_MS: f64 = 10.0;
const P99_CLIENTS: usize = 64;

/// The daemon's rows, one per durability level.
const DISK: &str = "allot-disk";
const PROCESS: &str = "allot-process";
/// With `--auth`: the process level with an API token on every request.
const PROCESS_AUTH: &str = "allot-process-auth";
/// With `--auth`: the same, and the audit trail written to a file.
const PROCESS_AUTH_AUDIT: &str = "allot-process-auth-audit";
/// With `--tls`: the token over HTTPS.
const PROCESS_AUTH_TLS: &str = "allot-process-auth-tls";
/// With `--auth`: pairs/s at least this share of the same level's without authentication.
const AUTH_VS_PLAIN: f64 = 0.95;
/// With `--auth`: with the audit trail written too, at least this share.
const AUDIT_VS_PLAIN: f64 = 0.9;
const AUTH_CLIENTS: [usize; 2] = [16, 64];

/// The JSON output of `allot bench compare --json`.
#[derive(Serialize)]
struct CompareOutput {
    /// Every round's measurements.
    results: Vec<LoadResult>,
    /// Medians over the rounds, per target and number of clients.
    summaries: Vec<Summary>,
    checks: Vec<Check>,
    /// Targets that could not be measured, and why.
    skipped: Vec<String>,
    /// The CPUs of the servers and of the load generator, with `--pin`.
    #[serde(skip_serializing_if = "Option::is_none")]
    placement: Option<Placement>,
    /// The query of the watcher of another namespace attached to every allot daemon throughout.
    watcher: String,
    /// allot's own work per pair, measured in this process without sockets.
    #[serde(skip_serializing_if = "Option::is_none")]
    own_work: Option<OwnWork>,
    /// Per number of clients, the CPU per pair the target leaves allot above the HTTP stack:
    /// [`PROCESS_CPU_VS_THROTTLE`] × Throttle's less the baseline's, beside allot's measured.
    room: Vec<Room>,
}

/// What the CPU target leaves allot's own work at one number of clients, in µs per pair.
#[derive(Serialize)]
struct Room {
    clients: usize,
    /// [`PROCESS_CPU_VS_THROTTLE`] × Throttle's CPU per pair − the baseline's.
    room_us_per_pair: f64,
    /// allot-process's CPU per pair − the baseline's.
    allot_us_per_pair: f64,
}

/// Runs `allot bench compare`.
pub(super) async fn run(args: CompareArgs, api_over: crate::ApiOver) -> anyhow::Result<()> {
    if args.clients.is_empty() || args.clients.contains(&0) {
        bail!("--clients must list numbers of clients of at least 1, e.g. 16,64");
    }
    if args.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    let quota = args.load.quota.max(args.clients.iter().copied().max().unwrap_or(1) as u64);
    let namespace = args.load.namespace.clone();
    let scratch = Scratch::new(args.tmp_dir.as_deref())?;
    let exe = std::env::current_exe()?;
    let mut placement = Placement::pinned(args.pin)?;
    let server_cpus = placement.as_ref().map(|p| p.servers.clone());
    let server_cpus = server_cpus.as_deref();
    let mut skipped = Vec::new();
    let mut servers: Vec<Server> = Vec::new();
    let mut targets: Vec<Target> = Vec::new();

    // A daemon at `level`, its data directory named after its row.
    let serve = |level: &str, row: &str| -> Vec<OsString> {
        let data = scratch.join(&format!("{row}-data"));
        ["serve", "--listen", "127.0.0.1:0", "--durability", level]
            .into_iter()
            .map(OsString::from)
            .chain(["--data-dir".into(), data.into_os_string()])
            .collect()
    };
    let mut spawns: Vec<(&str, Vec<OsString>, Option<String>)> = vec![
        ("baseline", vec!["baseline-server".into(), "--listen".into(), "127.0.0.1:0".into()], None),
        (DISK, serve("disk", DISK), None),
        (PROCESS, serve("process", PROCESS), None),
    ];
    let mut ca_pem = None;
    if args.auth {
        // One token, bound to the built-in admin role.
        let token = allot_core::access::token_of_secret(&rand::random());
        let config = scratch.join("auth.toml");
        std::fs::write(
            &config,
            format!(
                "[auth]\n[[auth.tokens]]\nuser = \"bench\"\nhash = \"{}\"\n[[auth.bindings]]\nrole = \"admin\"\nusers = [\"bench\"]\n",
                allot_core::access::hash_token(&token)
            ),
        )?;
        // The process level with `[auth]`, and `extra` flags.
        let with_auth = |row: &str, extra: Vec<OsString>| -> Vec<OsString> {
            let mut child_args = serve("process", row);
            child_args.extend(["--config".into(), config.clone().into_os_string()]);
            child_args.extend(extra);
            child_args
        };
        let off = || vec!["--audit-log".into(), "off".into()];
        // The token's cost alone: no audit trail (its cost is the next row's).
        spawns.push((PROCESS_AUTH, with_auth(PROCESS_AUTH, off()), Some(token.clone())));
        let trail = vec!["--audit-log".into(), scratch.join("audit.jsonl").into_os_string()];
        spawns.push((PROCESS_AUTH_AUDIT, with_auth(PROCESS_AUTH_AUDIT, trail), Some(token.clone())));
        if args.tls {
            let (ca, cert, key) = certificates()?;
            let (cert_path, key_path) = (scratch.join("cert.pem"), scratch.join("key.pem"));
            std::fs::write(&cert_path, cert)?;
            std::fs::write(&key_path, key)?;
            let mut tls = off();
            tls.extend([
                "--tls-cert".into(),
                cert_path.into_os_string(),
                "--tls-key".into(),
                key_path.into_os_string(),
            ]);
            spawns.push((PROCESS_AUTH_TLS, with_auth(PROCESS_AUTH_TLS, tls), Some(token)));
            ca_pem = Some(ca);
        }
    }
    // Every daemon serves the pairs with a watcher of another namespace attached (what a
    // dashboard or a shim of another team is to a busy namespace), kept open through every round.
    let watched = format!("{namespace}-watched");
    let watch_query = format!("prefix=namespaces/{}", crate::http::encode_segment(&watched));
    let mut watchers: Vec<(&str, crate::watch::Readers)> = Vec::new();
    for (name, child_args, token) in spawns {
        let started =
            children::spawn_listening(name, &exe, &child_args, scratch.join(&format!("{name}.log")), server_cpus).await;
        let server = match started {
            Ok(mut server) => {
                if let Some(token) = &token {
                    server.endpoint = server.endpoint.clone().with_token(token);
                }
                if let (Some(ca), PROCESS_AUTH_TLS) = (&ca_pem, name) {
                    server.endpoint = server.endpoint.clone().with_ca(ca.as_bytes())?;
                }
                server
            }
            Err(err) => {
                skip(&mut skipped, format!("{err:#}"));
                continue;
            }
        };
        match load::setup_namespace(&server.endpoint, &namespace, quota).await {
            Ok(()) => targets.push(Target::allot(name, server.endpoint.clone(), &namespace).with_pid(server.pid())),
            Err(err) => skip(&mut skipped, format!("{name}: cannot set up namespace `{namespace}`: {err:#}")),
        }
        if name != "baseline" {
            let attached = async {
                load::setup_namespace(&server.endpoint, &watched, 1).await?;
                crate::watch::attach(&server.endpoint, 1, &watch_query).await
            };
            match attached.await {
                Ok(readers) => watchers.push((name, readers)),
                Err(err) => skip(&mut skipped, format!("{name}: cannot attach a watcher of `{watched}`: {err:#}")),
            }
        }
        servers.push(server);
    }

    if !args.no_throttle {
        match args.throttle.clone().or_else(children::find_throttle) {
            None => skip(
                &mut skipped,
                "throttle: not installed (`cargo install throttle-server`, or pass --throttle PATH)".to_owned(),
            ),
            Some(program) => match children::spawn_throttle(&program, &scratch, &namespace, quota, server_cpus).await {
                Ok(server) => {
                    targets
                        .push(Target::throttle("throttle", server.endpoint.clone(), &namespace).with_pid(server.pid()));
                    servers.push(server);
                }
                Err(err) => skip(&mut skipped, format!("{err:#}")),
            },
        }
    }
    if !args.no_etcd {
        match args.etcd.clone().or_else(|| children::find_program("etcd")) {
            None => skip(
                &mut skipped,
                "etcd: not installed (`apt-get install etcd-server`, or pass --etcd PATH)".to_owned(),
            ),
            Some(program) => match children::spawn_etcd(&program, &scratch, server_cpus).await {
                Ok(server) => {
                    targets.push(Target::etcd("etcd", server.endpoint.clone(), &namespace).with_pid(server.pid()));
                    servers.push(server);
                }
                Err(err) => skip(&mut skipped, format!("{err:#}")),
            },
        }
    }

    if let Some(placement) = &mut placement {
        // Every thread of this process is the load generator's (the children keep their CPUs).
        allot_host::affinity::restrict_process(&placement.load).map_err(|err| {
            anyhow::anyhow!("--pin: cannot move the load generator to CPUs {:?}: {err}", placement.load)
        })?;
        let pids = servers.iter().map(|server| (server.name.clone(), server.pid()));
        for (name, pid) in pids.chain([("load".to_owned(), Some(std::process::id()))]) {
            if let Some(cpus) = pid.and_then(allowed_cpus_of) {
                placement.allowed.insert(name, cpus);
            }
        }
        if !args.output.json {
            eprintln!(
                "pinned: the servers on CPUs {:?}, the load generator on CPUs {:?}",
                placement.servers, placement.load
            );
        }
    }

    let pids: Vec<u32> = servers.iter().filter_map(Server::pid).collect();
    // Rounds outermost, so a slow spell of the machine hits every target alike.
    let mut results = Vec::new();
    for round in 1..=args.rounds {
        for &clients in &args.clients {
            for target in &targets {
                // What the target before left to do (a daemon's checkpoint of the log its pairs
                // wrote, etcd's compaction) runs on the same CPUs: it is done before this one
                // is measured, or it would be counted against this one.
                let settled = crate::cpu::settle(&pids).await;
                let spec = LoadSpec::new(clients, args.duration, &args.load, &args.output);
                match load::run_load(target, &spec).await {
                    Ok(mut result) => {
                        result.settled_ms = Some(settled.waited.as_millis() as u64);
                        result.settled = Some(settled.quiet);
                        if !args.output.json {
                            eprintln!(
                                "round {round}: {} × {clients}: {:.0} pairs/s, p99 {:.3} ms, {} µs CPU/pair, steal {}, \
                                 settled {}",
                                target.name,
                                result.pairs_per_s,
                                result.request_ms.p99,
                                result.server_cpu_us_per_pair.map_or_else(|| "-".to_owned(), |c| format!("{c:.1}")),
                                result.steal_pct.map_or_else(|| "-".to_owned(), |s| format!("{s:.1}%")),
                                settled.describe(),
                            );
                        }
                        results.push(result);
                    }
                    Err(err) => skip(&mut skipped, format!("round {round}: {} × {clients}: {err:#}", target.name)),
                }
            }
        }
    }
    // Each watcher must have stayed attached through every round.
    let detached: Vec<(String, usize)> = watchers
        .into_iter()
        .map(|(name, readers)| {
            let ended = readers.ended();
            readers.stop();
            (name.to_owned(), ended)
        })
        .collect();
    for server in servers {
        server.stop().await;
    }
    // The probe, with the servers stopped and the load generator idle.
    let probe_for = args.duration.min(std::time::Duration::from_secs(2));
    let servers = placement.as_ref().map(|p| p.servers.clone());
    let measured = tokio::task::spawn_blocking(move || crate::own_work::measure(probe_for, servers, api_over)).await;
    let own_work = match measured.map_err(anyhow::Error::from).and_then(|measured| measured) {
        Ok(own) => Some(own),
        Err(err) => {
            skip(&mut skipped, format!("allot's own work in process: {err:#}"));
            None
        }
    };

    let summaries = report::summaries(&results);
    let mut checks = checks(&args.clients, &summaries);
    checks.extend(watcher_checks(&targets, &detached));
    let room = room(&args.clients, &summaries);
    if args.output.json {
        let output = CompareOutput {
            results,
            summaries,
            checks: checks.clone(),
            skipped,
            placement,
            watcher: watch_query,
            own_work,
            room,
        };
        println!("{}", serde_json::to_string_pretty(&output)?);
    } else {
        println!(
            "medians of {} round(s) of {:?} each; every allot daemon with a watcher of `{watch_query}` attached",
            args.rounds, args.duration
        );
        print!("{}", report::summary_table(&summaries));
        if let Some(own) = own_work {
            println!(
                "allot's own work in process, no sockets: the API {:.2} µs CPU/pair, of which the store {:.2}",
                own.api_us_per_pair, own.store_us_per_pair
            );
        }
        for room in &room {
            println!(
                "at {} clients: allot-process {:.1} µs CPU/pair above the baseline; the CPU target leaves {:.1} \
                 ({PROCESS_CPU_VS_THROTTLE} × throttle − baseline)",
                room.clients, room.allot_us_per_pair, room.room_us_per_pair
            );
        }
        println!("targets:");
        print!("{}", report::checks(&checks));
    }
    if args.check && checks.iter().any(|check| !check.ok) {
        bail!("the daemon missed a target");
    }
    Ok(())
}

/// A CA made for the run, and a certificate it signs for 127.0.0.1 with its key: PEM each.
fn certificates() -> anyhow::Result<(String, String, String)> {
    let ca_key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.distinguished_name.push(rcgen::DnType::CommonName, "allot bench CA");
    let ca = params.self_signed(&ca_key)?;
    let key = rcgen::KeyPair::generate()?;
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])?.signed_by(&key, &ca, &ca_key)?;
    Ok((ca.pem(), cert.pem(), key.serialize_pem()))
}

/// The CPUs process `pid` may run on, as `/proc/<pid>/status` lists them (`0-1`, `3`); `None`
/// where that cannot be read.
fn allowed_cpus_of(pid: u32) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| line.strip_prefix("Cpus_allowed_list:")).map(|list| list.trim().to_owned())
}

/// Says on stderr that something is not measured, and remembers it for the JSON output.
fn skip(skipped: &mut Vec<String>, reason: String) {
    eprintln!("skipped: {reason}");
    skipped.push(reason);
}

/// The medians of `target` at `clients` clients, if measured.
fn find<'a>(summaries: &'a [Summary], target: &str, clients: usize) -> Option<&'a Summary> {
    summaries.iter().find(|s| s.target == target && s.clients == clients)
}

/// Per number of clients with the three rows measured, the room the CPU target leaves allot.
fn room(clients: &[usize], summaries: &[Summary]) -> Vec<Room> {
    let cpu = |target: &str, n: usize| find(summaries, target, n).and_then(|s| s.server_cpu_us_per_pair);
    let room = |n: usize| {
        let (allot, throttle, baseline) = (cpu(PROCESS, n)?, cpu("throttle", n)?, cpu("baseline", n)?);
        Some(Room {
            clients: n,
            room_us_per_pair: PROCESS_CPU_VS_THROTTLE * throttle - baseline,
            allot_us_per_pair: allot - baseline,
        })
    };
    clients.iter().filter_map(|&n| room(n)).collect()
}

/// Every allot daemon measured kept its watcher of another namespace attached through every
/// round (`detached`: per daemon that had one, how many of its watchers ended).
fn watcher_checks(targets: &[Target], detached: &[(String, usize)]) -> Vec<Check> {
    targets
        .iter()
        .filter(|target| target.name.starts_with("allot-"))
        .map(|target| {
            let ended = detached.iter().find(|(name, _)| *name == target.name).map(|(_, ended)| *ended as f64);
            Check::at_most(format!("{}: watchers of another namespace that ended", target.name), ended, 0.0)
        })
        .collect()
}

/// The targets of each durability level, on the medians of the rounds.
fn checks(clients: &[usize], summaries: &[Summary]) -> Vec<Check> {
    let find = |target: &str, n: usize| find(summaries, target, n);
    let ratio = |target: &str, other: &str, n: usize| {
        let (a, b) = (find(target, n)?, find(other, n)?);
        (b.pairs_per_s > 0.0).then(|| a.pairs_per_s / b.pairs_per_s)
    };
    let mut checks = Vec::new();
    for &n in clients {
        checks.push(Check::at_least(
            format!("{PROCESS}: pairs/s vs throttle at {n} clients"),
            ratio(PROCESS, "throttle", n),
            PROCESS_VS_THROTTLE,
        ));
        let cpu = find(PROCESS, n)
            .and_then(|p| p.server_cpu_us_per_pair)
            .zip(find("throttle", n).and_then(|t| t.server_cpu_us_per_pair))
            .map(|(p, t)| p / t);
        checks.push(Check::at_most(
            format!("{PROCESS}: server CPU per pair vs throttle at {n} clients"),
            cpu,
            PROCESS_CPU_VS_THROTTLE,
        ));
        if AUTH_CLIENTS.contains(&n) && find(PROCESS_AUTH, n).is_some() {
            checks.push(Check::at_least(
                format!("{PROCESS_AUTH}: pairs/s vs {PROCESS} at {n} clients"),
                ratio(PROCESS_AUTH, PROCESS, n),
                AUTH_VS_PLAIN,
            ));
        }
        if AUTH_CLIENTS.contains(&n) && find(PROCESS_AUTH_AUDIT, n).is_some() {
            checks.push(Check::at_least(
                format!("{PROCESS_AUTH_AUDIT}: pairs/s vs {PROCESS} at {n} clients"),
                ratio(PROCESS_AUTH_AUDIT, PROCESS, n),
                AUDIT_VS_PLAIN,
            ));
        }
        if DISK_BASELINE_CLIENTS.contains(&n) {
            checks.push(Check::at_least(
                format!("{DISK}: pairs/s vs baseline at {n} clients"),
                ratio(DISK, "baseline", n),
                DISK_VS_BASELINE,
            ));
        }
        if DISK_ETCD_CLIENTS.contains(&n) {
            checks.push(Check::at_least(
                format!("{DISK}: pairs/s vs etcd at {n} clients"),
                ratio(DISK, "etcd", n),
                DISK_VS_ETCD,
            ));
        }
        for level in [DISK, PROCESS] {
            if n == P99_CLIENTS {
                checks.push(Check::at_most(
                    format!("{level}: p99 request latency (ms) at {n} clients, worst round"),
                    find(level, n).map(|s| s.p99_ms_worst),
                    MAX_P99_MS,
                ));
            }
            checks.push(Check::at_most(
                format!("{level}: errors at {n} clients, all rounds"),
                find(level, n).map(|s| s.errors as f64),
                0.0,
            ));
        }
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::{room, watcher_checks, DISK, PROCESS, PROCESS_AUTH};
    use crate::http::Endpoint;
    use crate::load::Target;
    use crate::report::Summary;

    #[test]
    fn every_allot_daemon_keeps_its_watcher_of_another_namespace() {
        let endpoint = Endpoint::parse("http://127.0.0.1:1").unwrap();
        let targets: Vec<Target> = ["baseline", DISK, PROCESS, PROCESS_AUTH]
            .into_iter()
            .map(|name| Target::allot(name, endpoint.clone(), "bench"))
            .collect();
        // The disk level's watcher stayed, the process level's ended, the token's never attached.
        let detached = vec![(DISK.to_owned(), 0), (PROCESS.to_owned(), 1)];
        let checks = watcher_checks(&targets, &detached);
        let outcome: Vec<(bool, Option<f64>)> = checks.iter().map(|c| (c.ok, c.value)).collect();
        assert_eq!(outcome, vec![(true, Some(0.0)), (false, Some(1.0)), (false, None)], "{:?}", checks);
        assert!(checks.iter().all(|c| !c.what.starts_with("baseline")), "the baseline holds no watcher");
    }

    fn summary(target: &str, clients: usize, cpu: Option<f64>) -> Summary {
        Summary {
            target: target.to_owned(),
            clients,
            rounds: 1,
            pairs_per_s: 1.0,
            p50_ms: 0.0,
            p99_ms: 0.0,
            server_cpu_us_per_pair: cpu,
            p99_ms_worst: 0.0,
            max_ms: 0.0,
            errors: 0,
        }
    }

    #[test]
    fn the_room_is_what_the_cpu_target_leaves_above_the_baseline() {
        let summaries = [
            summary("baseline", 16, Some(17.0)),
            summary(PROCESS, 16, Some(24.0)),
            summary("throttle", 16, Some(20.0)),
            // No Throttle at 64 clients: no room to tell.
            summary("baseline", 64, Some(15.0)),
            summary(PROCESS, 64, Some(22.0)),
        ];
        let rooms = room(&[16, 64], &summaries);
        assert_eq!(rooms.len(), 1, "only where Throttle, the baseline and allot were measured");
        assert_eq!(rooms[0].clients, 16);
        assert!((rooms[0].room_us_per_pair - 1.0).abs() < 1e-9, "0.9 × 20 − 17: {}", rooms[0].room_us_per_pair);
        assert!((rooms[0].allot_us_per_pair - 7.0).abs() < 1e-9);
    }
}
