//! The CLI against a real daemon: output, `--json`, and exit codes that tell granted, exhausted,
//! cap exceeded and errors apart.

use std::process::{Command, Output};

use std::time::Duration;

use allot_client::Allocate;

use crate::support::{data_dir, eventually, Daemon, ALLOT};

pub(crate) fn allot(daemon: &Daemon, args: &[&str]) -> Output {
    Command::new(ALLOT).args(args).env("ALLOT_SERVER", &daemon.url).output().unwrap()
}

#[track_caller]
pub(crate) fn code(output: &Output) -> i32 {
    output.status.code().expect("exit code")
}

#[tokio::test]
async fn exit_codes_tell_granted_exhausted_cap_and_errors_apart() {
    let (_dir, data) = data_dir();
    let daemon = tokio::task::spawn_blocking(move || Daemon::start(&data, &[])).await.unwrap();
    let daemon = std::sync::Arc::new(daemon);
    let d = daemon.clone();
    tokio::task::spawn_blocking(move || {
        let set = allot(&d, &["quota", "set", "hive", "2"]);
        assert_eq!(code(&set), 0, "{set:?}");
        let granted = allot(&d, &["token", "alloc", "hive", "t1", "--project", "p", "--scope-namespace", "dev"]);
        assert_eq!(code(&granted), 0, "{granted:?}");
        assert!(String::from_utf8_lossy(&granted.stdout).contains("granted"), "{granted:?}");
        let capped = allot(
            &d,
            &["token", "alloc", "hive", "t2", "--project", "p", "--scope-namespace", "dev", "--project-cap", "1"],
        );
        assert_eq!(code(&capped), 4, "{capped:?}");
        let second = allot(&d, &["token", "alloc", "hive", "t3", "--json"]);
        assert_eq!(code(&second), 0, "{second:?}");
        let json: serde_json::Value = serde_json::from_slice(&second.stdout).unwrap();
        assert_eq!(json["status"], "Granted");
        let exhausted = allot(&d, &["token", "alloc", "hive", "t4", "--wait", "100ms"]);
        assert_eq!(code(&exhausted), 3, "{exhausted:?}");
        assert!(
            String::from_utf8_lossy(&exhausted.stdout).starts_with("exhausted: namespace quota full"),
            "{exhausted:?}"
        );
        // A quota of 0 is a pause, and says so.
        assert_eq!(code(&allot(&d, &["quota", "set", "paused", "0"])), 0);
        let paused = allot(&d, &["token", "alloc", "paused", "t"]);
        assert_eq!(code(&paused), 3, "{paused:?}");
        assert_eq!(String::from_utf8_lossy(&paused.stdout), "exhausted: namespace paused is paused (its quota is 0)\n");
        let shown = String::from_utf8_lossy(&allot(&d, &["quota", "get", "paused"]).stdout).into_owned();
        assert!(shown.lines().any(|l| l.starts_with("free units") && l.ends_with("paused")), "{shown}");
        let missing = allot(&d, &["token", "alloc", "nope", "t"]);
        assert_eq!(code(&missing), 1, "{missing:?}");
        assert!(String::from_utf8_lossy(&missing.stderr).contains("namespace_not_found"), "{missing:?}");
        let list = allot(&d, &["quota", "list"]);
        assert_eq!(code(&list), 0);
        let text = String::from_utf8_lossy(&list.stdout);
        assert!(text.lines().next().unwrap().contains("NAMESPACE"), "{text}");
        assert!(text.contains("hive"), "{text}");
        let usage = allot(&d, &["token", "alloc"]);
        assert_eq!(code(&usage), 2);
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn pools_and_allocs_from_the_command_line() {
    let (_dir, data) = data_dir();
    let daemon = tokio::task::spawn_blocking(move || Daemon::start(&data, &[])).await.unwrap();
    tokio::task::spawn_blocking(move || {
        let d = &daemon;
        let text = |output: &Output| String::from_utf8_lossy(&output.stdout).into_owned();
        let set = allot(d, &["pool", "set", "worker-1", "cpu=4,mem=16GiB"]);
        assert_eq!((code(&set), text(&set)), (0, "created pool worker-1 with capacity cpu=4,mem=16GiB\n".into()));
        let offers = allot(d, &["pool", "offers", "worker-1"]);
        assert_eq!(text(&offers), "worker-1/1: cpu=4,mem=16GiB\n");
        let accepted = allot(d, &["alloc", "accept", "worker-1", "cpu=1", "--max", "cpu=2,mem=1GiB", "--json"]);
        assert_eq!(code(&accepted), 0, "{accepted:?}");
        let alloc: serde_json::Value = serde_json::from_slice(&accepted.stdout).unwrap();
        assert_eq!(alloc["resources"], "cpu=2,mem=1GiB");
        let uri = alloc["uri"].as_str().unwrap();
        let kept = allot(d, &["alloc", "keepalive", uri, "1h"]);
        assert_eq!(text(&kept), format!("kept alive {uri} for 5m\n"), "the daemon caps the lease");
        let late = allot(d, &["alloc", "accept", "worker-1", "cpu=3"]);
        assert_eq!(code(&late), 1);
        assert!(String::from_utf8_lossy(&late.stderr).contains("offer_expired"), "{late:?}");
        let freed = allot(d, &["alloc", "free", uri]);
        assert_eq!(code(&freed), 0, "{freed:?}");
        let gone = allot(d, &["alloc", "keepalive", uri]);
        assert!(String::from_utf8_lossy(&gone.stderr).contains("alloc_ended"), "{gone:?}");
        let list = allot(d, &["pool", "list"]);
        assert!(text(&list).starts_with("POOL"), "{list:?}");
        let bad = allot(d, &["pool", "set", "p", "cpu=lots"]);
        assert_eq!(code(&bad), 1);
        assert!(String::from_utf8_lossy(&bad.stderr).contains("invalid_resources"), "{bad:?}");
        let stopped = allot(d, &["pool", "stop-if-idle", "worker-1", "0s"]);
        assert_eq!(text(&stopped), "stopped pool worker-1\n");
    })
    .await
    .unwrap();
}

/// Reflow's mux from the command line: the allocs of several pools on two daemons in one list,
/// a pool that cannot answer reported after it; one offer by its URI.
#[tokio::test]
async fn allocs_of_several_pools_and_daemons_and_one_offer_by_its_uri() {
    let ((_a_dir, a_data), (_b_dir, b_data)) = (data_dir(), data_dir());
    let a = tokio::task::spawn_blocking(move || Daemon::start(&a_data, &[])).await.unwrap();
    let b = tokio::task::spawn_blocking(move || Daemon::start(&b_data, &[])).await.unwrap();
    tokio::task::spawn_blocking(move || {
        let text = |output: &Output| String::from_utf8_lossy(&output.stdout).into_owned();
        let errors = |output: &Output| String::from_utf8_lossy(&output.stderr).into_owned();
        for (daemon, pool) in [(&a, "a1"), (&a, "a2"), (&b, "b1")] {
            assert_eq!(code(&allot(daemon, &["pool", "set", pool, "cpu=4"])), 0);
        }
        let mut uris = Vec::new();
        for (daemon, pool) in [(&a, "a1"), (&a, "a2"), (&b, "b1")] {
            let accepted = allot(daemon, &["-q", "alloc", "accept", pool, "cpu=1"]);
            assert_eq!(code(&accepted), 0, "{accepted:?}");
            uris.push(text(&accepted).trim().to_owned());
        }
        let both = allot(&a, &["alloc", "list", "--all", "--daemon", &b.url, "--json"]);
        assert_eq!(code(&both), 0, "{both:?}");
        let found: serde_json::Value = serde_json::from_slice(&both.stdout).unwrap();
        let listed: Vec<&str> =
            found["allocs"].as_array().unwrap().iter().map(|a| a["uri"].as_str().unwrap()).collect();
        assert_eq!(listed, uris.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(found["failed"], serde_json::json!([]));
        let named = allot(&a, &["-q", "alloc", "list", "a2", "nope"]);
        assert_eq!(code(&named), 1, "a pool that is not there is reported: {named:?}");
        assert_eq!(text(&named).trim(), uris[1]);
        assert!(errors(&named).contains("pool nope") && errors(&named).contains("pool_not_found"), "{named:?}");
        let usage = allot(&a, &["alloc", "list"]);
        assert_eq!(code(&usage), 2, "{usage:?}");
        // A daemon that does not answer is an error of the call (1), not of its usage.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let dead = allot(&a, &["alloc", "list", "--all", "--daemon", &format!("http://{closed}")]);
        assert_eq!(code(&dead), 1, "{dead:?}");

        let offer = allot(&a, &["offer", "get", "a1/1"]);
        assert_eq!((code(&offer), text(&offer)), (0, "a1/1: cpu=3\n".to_owned()), "{offer:?}");
        let none = allot(&a, &["offer", "get", "a1/2"]);
        assert_eq!(code(&none), 1);
        assert!(errors(&none).contains("offer_not_found"), "{none:?}");
        let not_uri = allot(&a, &["offer", "get", "a1"]);
        assert_eq!(code(&not_uri), 2, "a usage error");
        assert!(errors(&not_uri).contains("POOL/OFFER"), "{not_uri:?}");
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_alloc_says_the_daemon_restarted_and_waits_again() {
    let (_dir, data) = data_dir();
    let daemon = tokio::task::spawn_blocking({
        let data = data.clone();
        move || Daemon::start(&data, &["--quota", "gpu=1"])
    })
    .await
    .unwrap();
    daemon.client().allocate("gpu", "holder", &Allocate::default()).await.unwrap();
    let (url, address) = (daemon.url.clone(), daemon.address());
    let waiting = std::process::Command::new(ALLOT)
        .args(["token", "alloc", "gpu", "next", "--wait", "60s"])
        .env("ALLOT_SERVER", &url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let queued = async |daemon: &Daemon| {
        let client = daemon.client();
        eventually(Duration::from_secs(10), async || {
            client.waiters("gpu").await.is_ok_and(|list| list.waiters.iter().any(|w| w.token == "next"))
        })
        .await
    };
    assert!(queued(&daemon).await, "the CLI never waited");

    // A clean restart (SIGTERM answers the waiter early), then a crash (the connection closes):
    // each time the CLI queues again on the daemon that comes back at the same address.
    let daemon = tokio::task::spawn_blocking({
        let (data, address) = (data.clone(), address.clone());
        move || {
            assert!(daemon.terminate().success());
            Daemon::start_on(&address, &data, &[])
        }
    })
    .await
    .unwrap();
    assert!(queued(&daemon).await, "the CLI did not wait again after a clean restart");
    let daemon = tokio::task::spawn_blocking(move || {
        daemon.kill9();
        Daemon::start_on(&address, &data, &[])
    })
    .await
    .unwrap();
    assert!(queued(&daemon).await, "the CLI did not wait again after a crash");

    assert!(daemon.client().release("gpu", "holder", None).await.unwrap().released);
    let output = tokio::task::spawn_blocking(move || waiting.wait_with_output()).await.unwrap().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(code(&output), 0, "{stdout}{stderr}");
    assert!(stdout.starts_with("granted gpu token next"), "{stdout}");
    let notes: Vec<&str> =
        stderr.lines().filter(|line| line.contains("restarted or went away while waiting")).collect();
    assert_eq!(notes.len(), 2, "one note per restart: {stderr}");
    assert!(notes[0].contains("shutting down") && notes[0].contains("allocate is idempotent"), "{stderr}");
    assert!(notes[1].contains("connection closed"), "{stderr}");
    assert!(!stderr.lines().any(|line| line.starts_with("error")), "{stderr}");
}

#[tokio::test]
async fn quiet_prints_only_ids_and_options_go_before_or_after_the_command() {
    let (_dir, data) = data_dir();
    let daemon =
        tokio::task::spawn_blocking(move || Daemon::start(&data, &["--pool", "worker-1=cpu=4,mem=24051816857"]))
            .await
            .unwrap();
    tokio::task::spawn_blocking(move || {
        let d = &daemon;
        let text = |output: &Output| String::from_utf8_lossy(&output.stdout).into_owned();
        // Without ALLOT_SERVER: --server before the command, then after it.
        let bare = |args: &[&str]| Command::new(ALLOT).args(args).env_remove("ALLOT_SERVER").output().unwrap();
        let set = bare(&["--server", &d.url, "-q", "quota", "set", "hive", "3"]);
        assert_eq!((code(&set), text(&set)), (0, "hive\n".to_owned()), "{set:?}");
        let alloc = bare(&["token", "alloc", "hive", "t1", "--server", &d.url, "--quiet"]);
        assert_eq!((code(&alloc), text(&alloc)), (0, "t1\n".to_owned()), "{alloc:?}");
        let session = allot(d, &["session", "open", "--ttl", "30s", "-q"]);
        let id = text(&session);
        assert!(id.trim().len() > 8 && !id.contains(' ') && id.ends_with('\n'), "{session:?}");
        let listed = allot(d, &["-q", "session", "list"]);
        assert_eq!(text(&listed), id);
        let json = allot(d, &["--json", "token", "list", "hive"]);
        let grants: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
        assert_eq!(grants["grants"][0]["token"], "t1");
        let accepted = allot(d, &["alloc", "accept", "worker-1", "cpu=1", "-q"]);
        let uri = text(&accepted);
        assert!(uri.starts_with("worker-1/") && uri.lines().count() == 1, "{accepted:?}");
        assert_eq!(text(&allot(d, &["-q", "alloc", "list", "worker-1"])), uri);
        // Numbers as people write them; --json keeps the exact text form.
        let pool = allot(d, &["pool", "show", "worker-1"]);
        assert!(text(&pool).contains("capacity:  cpu=4,mem=22.4GiB"), "{pool:?}");
        assert!(text(&pool).contains("runs:      every task type"), "{pool:?}");
        assert_eq!(text(&allot(d, &["pool", "get", "worker-1"])), text(&pool), "`get` is `show`");
        let exact = allot(d, &["pool", "get", "worker-1", "--json"]);
        let exact: serde_json::Value = serde_json::from_slice(&exact.stdout).unwrap();
        assert_eq!(exact["capacity"], "cpu=4,mem=24051816857");
        // Cordoned, drained, uncordoned; occupied room set and cleared.
        let cordoned = allot(d, &["pool", "cordon", "worker-1"]);
        assert_eq!(text(&cordoned), "pool worker-1 cordoned\n", "{cordoned:?}");
        let refused = allot(d, &["alloc", "accept", "worker-1", "cpu=1"]);
        assert_eq!(code(&refused), 1, "{refused:?}");
        assert!(String::from_utf8_lossy(&refused.stderr).contains("error: pool_cordoned"), "{refused:?}");
        let drained = allot(d, &["pool", "drain", "worker-1", "--grace", "1h"]);
        assert!(text(&drained).starts_with("pool worker-1 draining in "), "{drained:?}");
        assert!(text(&allot(d, &["pool", "list"])).contains("draining in"));
        let up = allot(d, &["pool", "uncordon", "worker-1"]);
        assert_eq!(text(&up), "pool worker-1 up\n", "{up:?}");
        let occupied = allot(d, &["pool", "set", "worker-1", "cpu=4,mem=24051816857", "--occupied", "cpu=1"]);
        assert_eq!(code(&occupied), 0, "{occupied:?}");
        assert!(text(&allot(d, &["pool", "show", "worker-1"])).contains("occupied:  cpu=1"));
        let offers = allot(d, &["pool", "offers", "worker-1"]);
        assert!(text(&offers).contains(": cpu=2,"), "cpu=4 less 1 held, less 1 occupied: {offers:?}");
        let removed = allot(d, &["pool", "rm", "worker-1", "--force"]);
        assert_eq!(text(&removed), "removed pool worker-1 (1 alloc ended)\n");
        // Bad combinations are usage errors.
        let both = allot(d, &["--json", "quota", "list", "-q"]);
        assert_eq!(code(&both), 2, "{both:?}");
        assert!(String::from_utf8_lossy(&both.stderr).contains("cannot be used together"), "{both:?}");
        let serve = allot(d, &["--server", &d.url, "serve"]);
        assert_eq!(code(&serve), 2, "{serve:?}");
    })
    .await
    .unwrap();
}
