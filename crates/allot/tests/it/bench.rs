//! `allot bench compare` against real servers it starts itself (the baseline server and fresh
//! daemons of this binary).

use std::process::Command;

use crate::support::ALLOT;

/// The CPUs of a kernel CPU list such as `0-2,5`.
fn cpu_list(list: &str) -> Vec<u64> {
    list.split(',')
        .flat_map(|part| match part.split_once('-') {
            Some((first, last)) => (first.parse().unwrap()..=last.parse().unwrap()).collect::<Vec<u64>>(),
            None => vec![part.parse().unwrap()],
        })
        .collect()
}

/// With `--pin`, every server runs on the first half of the CPUs and the load generator on the
/// other half, as the kernel reports their affinity; every round is measured, with its steal time.
#[test]
fn bench_compare_pins_the_servers_and_the_load_generator_apart() {
    let output = Command::new(ALLOT)
        .args(["bench", "compare", "--pin", "--no-throttle", "--no-etcd", "--clients", "2", "--rounds", "1"])
        .args(["--duration", "300ms", "--warmup", "100ms", "--json"])
        .output()
        .expect("run allot bench compare");
    let stderr = String::from_utf8_lossy(&output.stderr);
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        assert!(!output.status.success() && stderr.contains("--pin needs at least 2 CPUs"), "{stderr}");
        return;
    }
    assert!(output.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON report");
    let placement = &report["placement"];
    let numbers = |value: &serde_json::Value| -> Vec<u64> {
        value.as_array().expect("a list of CPUs").iter().map(|cpu| cpu.as_u64().unwrap()).collect()
    };
    let (servers, load) = (numbers(&placement["servers"]), numbers(&placement["load"]));
    assert!(!servers.is_empty() && !load.is_empty(), "{report:#}");
    assert!(servers.iter().all(|cpu| !load.contains(cpu)), "{report:#}");
    let allowed = placement["allowed"].as_object().expect("what the kernel allows each process");
    for name in ["baseline", "allot-disk", "allot-process"] {
        assert_eq!(cpu_list(allowed[name].as_str().unwrap()), servers, "{name}: {report:#}");
    }
    assert_eq!(cpu_list(allowed["load"].as_str().unwrap()), load, "{report:#}");
    // Each daemon served with a watcher of another namespace attached, through every round.
    assert!(report["watcher"].as_str().is_some_and(|q| q.starts_with("prefix=namespaces/")), "{report:#}");
    let checks = report["checks"].as_array().expect("checks");
    for name in ["allot-disk", "allot-process"] {
        let what = format!("{name}: watchers of another namespace that ended");
        let check = checks.iter().find(|c| c["what"] == what.as_str()).unwrap_or_else(|| panic!("{what}: {report:#}"));
        assert_eq!((check["ok"].as_bool(), check["value"].as_f64()), (Some(true), Some(0.0)), "{report:#}");
    }

    let results = report["results"].as_array().expect("results");
    let targets: Vec<&str> = results.iter().map(|r| r["target"].as_str().unwrap()).collect();
    assert_eq!(targets, ["baseline", "allot-disk", "allot-process"]);
    for result in results {
        assert!(result["pairs_per_s"].as_f64().unwrap() > 0.0, "{result:#}");
        assert_eq!(result["errors"], 0, "{result:#}");
        // CPU time comes in clock ticks (10 ms): a server that used less than one over a short
        // run on a busy machine reads 0.
        assert!(result["server_cpu_us_per_pair"].as_f64().unwrap() >= 0.0, "{result:#}");
        assert!((0.0..=100.0).contains(&result["steal_pct"].as_f64().unwrap()), "{result:#}");
        // Each target is measured once the servers fell quiet (idle ones do within the wait).
        assert!(result["settled_ms"].as_u64().is_some(), "{result:#}");
        assert_eq!(result["settled"], true, "{result:#}");
    }
}

/// `allot bench leases` at a small scale: the grants are held, the daemon killed and started
/// again on its data (every grant read back), a snapshot of them taken while pairs run, and the
/// tenth given one deadline all expire.
#[test]
fn bench_leases_holds_restarts_and_expires_a_tenth() {
    let output = Command::new(ALLOT)
        .args(["bench", "leases", "--grants", "3000", "--namespaces", "7", "--clients", "4", "--json"])
        .output()
        .expect("run allot bench leases");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON on stdout");
    assert_eq!(report["grants"], 3000, "{report}");
    assert_eq!(report["restored"], 3000, "every grant is back after kill -9: {report}");
    assert_eq!(report["expired"], 300, "every one of the tenth expired: {report}");
    assert!(report["restart_serving_s"].as_f64().unwrap() > 0.0, "{report}");
    assert!(report["disk_bytes"].as_u64().unwrap() > 0, "{report}");
    // The daemon's resident memory is read before and with the grants (at 3,000 grants the
    // difference is within what the allocator returns and the kernel reclaims: either way).
    for read in ["idle_kib", "full_kib", "restarted_kib", "fresh_idle_kib"] {
        assert!(report[read].as_u64().is_some_and(|kib| kib > 0), "{read}: {report}");
    }
    assert!(report["expiry_window"]["count"].as_u64().unwrap() > 0, "pairs were answered as the tenth expired");
    // A snapshot of every grant was taken while pairs ran.
    let snapshot = &report["snapshot"];
    assert!(snapshot["bytes"].as_u64().unwrap() > 3000 * 20, "{report}");
    assert!(snapshot["answers_during"]["count"].as_u64().unwrap() > 0, "pairs ran during the snapshot: {report}");
    assert!(snapshot["ratio"].as_f64().unwrap() > 0.0, "{report}");
    assert_eq!(report["checks"].as_array().unwrap().len(), 6, "{report}");
}

/// `allot bench waiters` at a small scale: every waiter queued over HTTP/2, then handed the
/// quota along the queue, each grant in its order.
#[test]
fn bench_waiters_queues_over_http2_and_hands_the_quota_over_in_order() {
    let output = Command::new(ALLOT)
        .args(["bench", "waiters", "--waiters", "2000", "--connections", "3", "--quota", "7", "--json"])
        .output()
        .expect("run allot bench waiters");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON on stdout");
    assert_eq!((report["waiters"].as_u64(), report["connections"].as_u64()), (Some(2000), Some(3)), "{report}");
    assert_eq!(report["out_of_order"], 0, "every grant in the queue's order: {report}");
    assert!(report["handover_per_s"].as_f64().unwrap() > 0.0, "{report}");
    for read in ["before_kib", "with_waiters_kib"] {
        assert!(report[read].as_u64().is_some_and(|kib| kib > 0), "{read}: {report}");
    }
    assert_eq!(report["checks"].as_array().unwrap().len(), 3, "{report}");
}

/// `allot bench apps --run` at a small scale: every task run to Completed, and each round's CPU
/// time of the daemon read from its process, with the rate it allows this machine's CPUs at most.
#[test]
fn bench_apps_runs_every_task_and_reads_the_daemons_cpu_per_task() {
    let output = Command::new(ALLOT)
        .args(["bench", "apps", "--run", "--one-call", "--tasks", "300", "--pools", "3", "--rounds", "1", "--json"])
        .output()
        .expect("run allot bench apps");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON on stdout");
    let rounds = report["rounds"].as_array().expect("rounds");
    assert_eq!(rounds.len(), 1, "{report:#}");
    assert!(rounds[0]["tasks_per_s"].as_f64().unwrap() > 0.0, "{report:#}");
    // CPU time comes in clock ticks (10 ms): a quick round may read 0, but it is read.
    let per_task = rounds[0]["daemon_cpu_us_per_task"].as_f64().expect("the daemon's CPU per task is read");
    assert!(per_task >= 0.0, "{report:#}");
    assert_eq!(report["daemon_cpu_us_per_task"].as_f64(), Some(per_task), "the median of one round: {report:#}");
    let cores = report["cores"].as_u64().expect("the CPUs counted") as f64;
    match report["bound_tasks_per_s"].as_f64() {
        Some(bound) => assert!((bound - cores * 1e6 / per_task).abs() < 1e-6 * bound, "{report:#}"),
        None => assert_eq!(per_task, 0.0, "a bound is given whenever the daemon used CPU: {report:#}"),
    }
    // The same time by thread, named without their index; together no more than the process's
    // (a thread's user and system times are each cut to ticks of 10 ms on their own, and the
    // process's likewise: two ticks of slack per thread, and two more).
    let by_thread = rounds[0]["daemon_cpu_us_per_task_by_thread"].as_object().expect("the CPU by thread");
    let threads = rounds[0]["daemon_threads"].as_u64().expect("the daemon's threads counted");
    assert!(threads >= 1, "{report:#}");
    let tick_per_task = 10_000.0 / 300.0;
    let sum: f64 = by_thread.values().map(|us| us.as_f64().expect("µs per task")).sum();
    assert!(sum <= per_task + tick_per_task * (2 * threads + 2) as f64 + 1e-9, "{report:#}");
    for (name, us) in by_thread {
        assert!(us.as_f64().unwrap() > 0.0, "only threads that ran: {report:#}");
        let index = name.rsplit_once('-').map(|(_, last)| last);
        assert!(!index.is_some_and(|i| i.bytes().all(|b| b.is_ascii_digit())), "{name}: {report:#}");
    }
    assert!(report["daemon_cpu_us_per_task_by_thread"].is_object(), "the medians by thread: {report:#}");
    assert_eq!(report["checks"][0]["limit"].as_f64(), Some(50_000.0), "issue 41's target: {report:#}");
}
