//! The daemon over a real socket: configuration, health, OpenAPI, metrics, waiting, shutdown.

use std::io::Write;
use std::time::Duration;

use allot_client::{Allocate, Status};

use crate::support::{data_dir, eventually, Daemon};

#[tokio::test]
async fn registers_quotas_from_the_config_file_and_flags() {
    let (dir, data) = data_dir();
    let config = dir.path().join("allot.toml");
    let text = "metrics_namespaces = [\"hive:cluster-a\"]\n[quotas]\n\"hive:cluster-a\" = 10\n\"hive:cluster-b\" = 4\n";
    std::fs::write(&config, text).unwrap();
    let daemon = Daemon::start(&data, &["--config", config.to_str().unwrap(), "--quota", "hive:cluster-b=6"]);
    let client = daemon.client();
    assert_eq!(client.namespace("hive:cluster-a").await.unwrap().quota, 10);
    assert_eq!(client.namespace("hive:cluster-b").await.unwrap().quota, 6, "a flag wins over the file");
    let health = client.health().await.unwrap();
    assert_eq!((health.status.as_str(), health.backend.as_str()), ("ok", "embedded"));
    let openapi = client.openapi().await.unwrap();
    assert!(openapi["openapi"].as_str().unwrap().starts_with("3."));
    assert!(openapi["paths"]["/v1/sessions/{id}/keepalive"]["post"].is_object());
    client.allocate("hive:cluster-a", "t", &Allocate::default()).await.unwrap();
    let metrics = client.metrics().await.unwrap();
    assert!(metrics.contains("allot_quotas_granted_units{namespace=\"hive:cluster-a\"} 1"), "{metrics}");
    assert!(!metrics.contains("namespace=\"hive:cluster-b\""), "not selected: totals only\n{metrics}");
    assert!(metrics.contains("allot_quotas_quota_units 16"), "{metrics}");
    assert!(metrics.contains("allot_http_request_duration_seconds_count"), "{metrics}");
    // It says where its dashboard is, and the dashboard is there.
    let log = || std::fs::read_to_string(data.with_extension("log")).unwrap_or_default();
    let said =
        eventually(Duration::from_secs(30), async || log().contains(&format!("the dashboard: {}/ui", daemon.url)))
            .await;
    assert!(said, "{}", log());
    let page = reqwest::get(format!("{}/ui", daemon.url)).await.unwrap();
    assert_eq!(page.status(), 200);
}

#[tokio::test]
async fn a_bad_config_file_is_a_clear_error() {
    let (dir, data) = data_dir();
    let config = dir.path().join("allot.toml");
    std::fs::write(&config, "[quotas]\n\"a::b\" = 1\n").unwrap();
    let output = std::process::Command::new(crate::support::ALLOT)
        .args(["serve", "--listen", "127.0.0.1:0", "--config", config.to_str().unwrap(), "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("empty segment"), "{stderr}");
}

/// `--advertise` names this daemon to the others (and in the scheduler's lease): anything but an
/// http(s) URL with a host is refused before the daemon starts, with the usage exit code.
#[test]
fn an_advertised_address_that_is_not_a_url_is_refused() {
    let (_dir, data) = data_dir();
    for bad in ["restore me", "ftp://host:1", "http://", "10.0.0.5:7070"] {
        let output = std::process::Command::new(crate::support::ALLOT)
            .args(["serve", "--listen", "127.0.0.1:0", "--advertise", bad, "--data-dir"])
            .arg(&data)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{bad}: {stderr}");
        assert!(stderr.contains("--advertise") && stderr.contains("http://10.0.0.5:7070"), "{bad}: {stderr}");
    }
    assert!(!data.exists(), "nothing was made");
}

#[tokio::test]
async fn a_release_wakes_the_waiter_and_sigterm_answers_waiters() {
    let (_dir, data) = data_dir();
    let daemon = Daemon::start(&data, &["--quota", "gpu=1"]);
    let client = daemon.client();
    client.allocate("gpu", "holder", &Allocate::default()).await.unwrap();
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move {
            client.allocate("gpu", "next", &Allocate { wait_ms: Some(20_000), ..Allocate::default() }).await
        })
    };
    assert!(eventually(Duration::from_secs(5), async || client.waiters("gpu").await.unwrap().waiters.len() == 1).await);
    client.release("gpu", "holder", None).await.unwrap();
    let woken = waiting.await.unwrap().unwrap();
    assert_eq!(woken.status, Status::Granted);
    assert_eq!(woken.grant.unwrap().fencing, 2);

    // A waiter still waiting at SIGTERM is answered with its place, and the daemon exits cleanly.
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move {
            client.allocate("gpu", "last", &Allocate { wait_ms: Some(60_000), ..Allocate::default() }).await
        })
    };
    assert!(eventually(Duration::from_secs(5), async || client.waiters("gpu").await.unwrap().waiters.len() == 1).await);
    let status = tokio::task::spawn_blocking(move || daemon.terminate()).await.unwrap();
    assert!(status.success(), "{status:?}");
    let answer = waiting.await.unwrap().unwrap();
    assert_eq!(answer.status, Status::Exhausted);
    assert_eq!(answer.queue.unwrap().position, 1);

    // Everything acknowledged is still there after the restart.
    let daemon = Daemon::start(&data, &[]);
    let client = daemon.client();
    let grants = client.grants("gpu").await.unwrap().grants;
    assert_eq!(grants.iter().map(|g| g.token.as_str()).collect::<Vec<_>>(), ["next"]);
    // After a clean shutdown, fencing numbers go on one by one.
    assert_eq!(client.namespace("gpu").await.unwrap().next_fencing, 3);
    client.release("gpu", "next", None).await.unwrap();
    let after = client.allocate("gpu", "after", &Allocate::default()).await.unwrap();
    assert_eq!(after.grant.unwrap().fencing, 3);
}

/// The daemon's open TCP connections: its sockets (from `/proc/<pid>/fd`) that the kernel's
/// TCP tables list as established. Counted by connection, not by descriptor: the daemon's other
/// sockets (its listener, the signal channels each runtime opens as it starts) do not count.
fn connections(pid: u32) -> usize {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap();
    let inodes: std::collections::HashSet<String> = fds
        .filter_map(Result::ok)
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|to| to.to_string_lossy().strip_prefix("socket:[")?.strip_suffix(']').map(str::to_owned))
        .collect();
    const ESTABLISHED: &str = "01";
    let tables: String =
        ["/proc/net/tcp", "/proc/net/tcp6"].iter().filter_map(|table| std::fs::read_to_string(table).ok()).collect();
    // Each line: sl local remote st tx:rx tr:when retrnsmt uid timeout inode (a header's `st` is
    // not a state).
    tables
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .filter(|fields| fields.len() > 9 && fields[3] == ESTABLISHED && inodes.contains(fields[9]))
        .count()
}

/// A client over HTTP/2 keeps its many waiters on one connection: the daemon holds no socket per
/// waiter, and hands the quota to them in their order as it frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_an_http2_client_share_one_connection_and_are_served_in_order() {
    const WAITERS: usize = 60;
    let (_dir, data) = data_dir();
    let daemon = Daemon::start(&data, &["--quota", "gpu=1"]);
    let client = allot_client::Client::new_http2(&daemon.url).unwrap();
    client.allocate("gpu", "holder", &Allocate::default()).await.unwrap();
    let mut waiting = Vec::with_capacity(WAITERS);
    for i in 0..WAITERS {
        let asking = client.clone();
        let token = format!("w{i:02}");
        waiting.push(tokio::spawn(async move {
            asking.allocate("gpu", &token, &Allocate { wait_ms: Some(60_000), ..Allocate::default() }).await
        }));
        // In order: each is queued before the next asks.
        let queued =
            eventually(Duration::from_secs(10), async || client.waiters("gpu").await.unwrap().waiters.len() == i + 1)
                .await;
        assert!(queued, "waiter {i} is queued");
    }
    // One connection carries them all (a second at most: one the client is replacing).
    let during = connections(daemon.pid());
    assert!(during <= 2, "{WAITERS} waiters over HTTP/2 hold {during} connections of the daemon");
    let mut holder = "holder".to_owned();
    for (i, waiter) in waiting.into_iter().enumerate() {
        client.release("gpu", &holder, None).await.unwrap();
        let answer = waiter.await.unwrap().unwrap();
        assert_eq!(answer.status, Status::Granted, "waiter {i}");
        holder = answer.grant.unwrap().token;
        assert_eq!(holder, format!("w{i:02}"), "served in the queue's order");
    }
}

/// SIGTERM sent the moment the daemon prints its address (while it still starts its executor and
/// sources) ends it cleanly: the signal is listened for from the start, not only once it serves.
#[test]
fn sigterm_right_after_the_address_line_is_a_clean_stop() {
    let (_dir, data) = data_dir();
    for round in 0..5 {
        let daemon = Daemon::start(&data, &["--pool", "w=cpu=1", "--run-pool", "w"]);
        let status = daemon.terminate();
        assert!(status.success(), "round {round}: the daemon ended with {status} on SIGTERM");
    }
}

#[tokio::test]
async fn a_waiter_whose_client_goes_away_leaves_the_queue() {
    let (_dir, data) = data_dir();
    let daemon = Daemon::start(&data, &["--quota", "gpu=1"]);
    let client = daemon.client();
    client.allocate("gpu", "holder", &Allocate::default()).await.unwrap();
    let mut stream = std::net::TcpStream::connect(daemon.address()).unwrap();
    let body = r#"{"wait_ms": 30000}"#;
    write!(
        stream,
        "PUT /v1/namespaces/gpu/grants/gone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    assert!(eventually(Duration::from_secs(5), async || client.waiters("gpu").await.unwrap().waiters.len() == 1).await);
    drop(stream);
    let left =
        eventually(Duration::from_secs(5), async || client.waiters("gpu").await.unwrap().waiters.is_empty()).await;
    assert!(left, "the waiter of a closed connection is still queued");
    client.release("gpu", "holder", None).await.unwrap();
    assert!(client.grants("gpu").await.unwrap().grants.is_empty(), "a departed waiter was granted");
}

#[tokio::test]
async fn seeds_pools_from_the_config_file_flags_and_this_machine() {
    let (dir, data) = data_dir();
    let config = dir.path().join("allot.toml");
    std::fs::write(&config, "local_pool = \"here\"\n[pools]\nworker-1 = \"cpu=2,mem=4GiB\"\nworker-2 = \"cpu=1\"\n")
        .unwrap();
    let daemon = tokio::task::spawn_blocking(move || {
        Daemon::start(&data, &["--config", config.to_str().unwrap(), "--pool", "worker-2=cpu=8,gpu=1"])
    })
    .await
    .unwrap();
    let client = daemon.client();
    let pools = client.pools().await.unwrap().pools;
    let capacity = |name: &str| pools.iter().find(|p| p.name == name).map(|p| p.capacity.clone());
    assert_eq!(capacity("worker-1").as_deref(), Some("cpu=2,mem=4GiB"));
    assert_eq!(capacity("worker-2").as_deref(), Some("cpu=8,gpu=1"), "the flag wins over the file");
    let here: allot_core::Resources = capacity("here").expect("the local pool").parse().unwrap();
    let cpus = std::thread::available_parallelism().unwrap().get() as u64;
    assert_eq!(here.get_milli("cpu"), cpus * 1000);
    assert!(here.get_milli("mem") > 0 && here.get_milli("disk") > 0, "{here}");
}
