//! The CLI against a real daemon: output, `--json`, and exit codes that tell granted, exhausted,
//! cap exceeded and errors apart.

use std::process::{Command, Output};

use crate::support::{data_dir, Daemon, ALLOT};

fn allot(daemon: &Daemon, args: &[&str]) -> Output {
    Command::new(ALLOT).args(args).env("ALLOT_SERVER", &daemon.url).output().unwrap()
}

#[track_caller]
fn code(output: &Output) -> i32 {
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
