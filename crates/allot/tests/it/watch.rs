//! `allot watch` against a real daemon: the changes other commands make, one JSON object per line
//! (and one readable line per event), the daemon's shutdown not held up by open watches, Ctrl-C
//! ending it cleanly, a compaction after a restart as a clear error, and a store with no change
//! feed.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use allot_store_redis::testing::RedisServer;

use crate::cli::{allot, code};
use crate::support::{data_dir, Daemon, ALLOT};

/// `allot watch ARGS` running, its stdout read line by line.
struct Watching {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Watching {
    fn start(daemon: &Daemon, args: &[&str]) -> Watching {
        let mut child = Command::new(ALLOT)
            .arg("watch")
            .args(args)
            .env("ALLOT_SERVER", &daemon.url)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Watching { child, lines }
    }

    /// The next line, within 10 s.
    fn line(&self) -> String {
        self.lines.recv_timeout(Duration::from_secs(10)).expect("a line within 10 s")
    }

    /// Ctrl-C, and its exit code.
    fn interrupt(mut self) -> i32 {
        let sent = Command::new("kill").args(["-INT", &self.child.id().to_string()]).status().unwrap();
        assert!(sent.success());
        self.child.wait().unwrap().code().expect("an exit code, not a signal")
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The revision a read reflects now (`Allot-Revision`): a watch from it sees what comes next.
async fn revision(daemon: &Daemon) -> String {
    let response = reqwest::get(format!("{}/v1/namespaces", daemon.url)).await.unwrap();
    response.headers()["allot-revision"].to_str().unwrap().to_owned()
}

#[tokio::test]
async fn allot_watch_prints_the_changes_other_commands_make_and_ends_on_ctrl_c() {
    let (_dir, data) = data_dir();
    let daemon = tokio::task::spawn_blocking(move || Daemon::start(&data, &[])).await.unwrap();
    let since = revision(&daemon).await;
    tokio::task::spawn_blocking(move || {
        let json = Watching::start(&daemon, &["--json", "--since", &since, "--prefix", "namespaces/hive"]);
        let people = Watching::start(&daemon, &["--since", &since, "--kind", "namespace.put,grant.granted"]);
        for args in
            [&["quota", "set", "hive", "2"][..], &["quota", "set", "other", "1"], &["quota", "set", "hive", "5"]]
        {
            assert_eq!(code(&allot(&daemon, args)), 0, "{args:?}");
        }
        let granted = allot(&daemon, &["token", "alloc", "hive", "t1"]);
        assert_eq!(code(&granted), 0, "{granted:?}");

        let events: Vec<serde_json::Value> = (0..3).map(|_| serde_json::from_str(&json.line()).unwrap()).collect();
        let seen: Vec<(&str, &str)> =
            events.iter().map(|e| (e["kind"].as_str().unwrap(), e["key"].as_str().unwrap())).collect();
        assert_eq!(
            seen,
            [
                ("namespace.put", "namespaces/hive"),
                ("namespace.put", "namespaces/hive"),
                ("grant.granted", "namespaces/hive/grants/t1")
            ]
        );
        assert_eq!((events[0]["object"]["quota"].as_u64(), events[1]["object"]["quota"].as_u64()), (Some(2), Some(5)));
        assert_eq!(events[2]["object"]["token"], "t1");
        let revisions: Vec<u64> = events.iter().map(|e| e["revision"].as_u64().unwrap()).collect();
        assert!(revisions.windows(2).all(|pair| pair[0] < pair[1]), "{revisions:?}");

        let lines: Vec<String> = (0..4).map(|_| people.line()).collect();
        let expected = [
            "namespace.put  namespaces/hive  quota=2 granted=0 grants=0",
            "namespace.put  namespaces/other  quota=1 granted=0 grants=0",
            "namespace.put  namespaces/hive  quota=5 granted=0 grants=0",
            "grant.granted  namespaces/hive/grants/t1  units=1 fencing=1",
        ];
        for (line, expected) in lines.iter().zip(expected) {
            let (revision, rest) = line.split_once("  ").unwrap();
            assert!(revision.parse::<u64>().is_ok() && rest == expected, "{line:?} is not `<revision>  {expected}`");
        }
        assert_eq!(lines[0].split_once("  ").unwrap().0, revisions[0].to_string());

        // Open watches end when the daemon stops: they do not hold its shutdown up.
        let started = std::time::Instant::now();
        assert!(daemon.terminate().success());
        assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
        // The watches wait for it to come back, until Ctrl-C ends them cleanly.
        assert_eq!(json.interrupt(), 0);
        assert_eq!(people.interrupt(), 0);
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_revision_the_daemon_no_longer_keeps_is_a_clear_error() {
    let (_dir, data) = data_dir();
    let daemon = tokio::task::spawn_blocking({
        let data = data.clone();
        move || Daemon::start(&data, &[])
    })
    .await
    .unwrap();
    let before = revision(&daemon).await;
    tokio::task::spawn_blocking(move || {
        assert_eq!(code(&allot(&daemon, &["quota", "set", "hive", "1"])), 0);
        // Restarted on its data directory: its feed keeps nothing from before.
        let address = daemon.address();
        assert!(daemon.terminate().success());
        let daemon = Daemon::start_on(&address, &data, &[]);
        let watch = allot(&daemon, &["watch", "--since", &before]);
        assert_eq!(code(&watch), 1, "{watch:?}");
        let stderr = String::from_utf8_lossy(&watch.stderr);
        assert!(stderr.starts_with("error: revision_compacted: "), "{stderr}");
        assert!(stderr.contains("the oldest revision a watch can start after is "), "{stderr}");
        let bad = allot(&daemon, &["watch", "--kind", "grant.nope"]);
        assert_eq!(code(&bad), 1, "{bad:?}");
        assert!(
            String::from_utf8_lossy(&bad.stderr).contains("invalid_argument: unknown kind `grant.nope`"),
            "{bad:?}"
        );
        assert_eq!(code(&allot(&daemon, &["watch", "--since", "soon"])), 2, "a usage error");
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_store_with_no_change_feed_answers_501_watch_unsupported() {
    let redis = RedisServer::start();
    let (_dir, data) = data_dir();
    let url = redis.url();
    let daemon = tokio::task::spawn_blocking(move || Daemon::start(&data, &["--store", &url])).await.unwrap();
    let response = reqwest::get(format!("{}/v1/watch", daemon.url)).await.unwrap();
    assert_eq!(response.status().as_u16(), 501);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "watch_unsupported");
    let watch = tokio::task::spawn_blocking(move || allot(&daemon, &["watch"])).await.unwrap();
    assert_eq!(code(&watch), 1, "{watch:?}");
    assert!(String::from_utf8_lossy(&watch.stderr).contains("error: watch_unsupported: "), "{watch:?}");
}
