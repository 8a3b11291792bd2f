//! `allot watch` against a real daemon: the changes other commands make, one JSON object per line
//! (and one readable line per event), the daemon's shutdown not held up by open watches, Ctrl-C
//! ending it cleanly, a watcher resuming after a `kill -9` and a restart with every change after
//! its revision, a revision no longer kept as a clear error, and a store with no change feed.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use allot_client::sse::{Message, Parser};
use allot_client::Allocate;
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
    let (dir, data) = data_dir();
    // It keeps one event: the first of two is dropped.
    let config = dir.path().join("allot.toml");
    std::fs::write(&config, "[watch]\nretain_events = 1\n").unwrap();
    let config = config.to_str().unwrap().to_owned();
    let daemon = tokio::task::spawn_blocking({
        let (data, config) = (data.clone(), config.clone());
        move || Daemon::start(&data, &["--config", &config])
    })
    .await
    .unwrap();
    let before = revision(&daemon).await;
    tokio::task::spawn_blocking(move || {
        assert_eq!(code(&allot(&daemon, &["quota", "set", "hive", "1"])), 0);
        assert_eq!(code(&allot(&daemon, &["quota", "set", "hive", "2"])), 0);
        // Restarted on its data directory, its feed keeps what it kept before: not the first.
        let address = daemon.address();
        assert!(daemon.terminate().success());
        let daemon = Daemon::start_on(&address, &data, &["--config", &config]);
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

/// A `GET /v1/watch` stream, read as Server-Sent Events.
struct Sse {
    response: reqwest::Response,
    parser: Parser,
}

impl Sse {
    /// Opens `/v1/watch?{query}`, resuming after `last_event_id` if given.
    async fn open(daemon: &Daemon, query: &str, last_event_id: Option<u64>) -> Sse {
        let mut request = reqwest::Client::new().get(format!("{}/v1/watch?{query}", daemon.url));
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id.to_string());
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), 200, "{:?}", response.text().await);
        Sse { response, parser: Parser::default() }
    }

    /// The next message; `None` once the stream ends (the daemon went away).
    async fn message(&mut self) -> Option<Message> {
        loop {
            if let Some(message) = self.parser.message() {
                return Some(message);
            }
            match self.response.chunk().await {
                Ok(Some(bytes)) => self.parser.feed(&bytes),
                _ => return None,
            }
        }
    }

    /// The next event, within 10 s: its revision, kind and key.
    async fn event(&mut self) -> Seen {
        loop {
            let message = tokio::time::timeout(Duration::from_secs(10), self.message())
                .await
                .expect("an event within 10 s")
                .expect("the stream goes on");
            if let Some(seen) = Seen::of(&message) {
                return seen;
            }
        }
    }

    /// The events up to the grant of `token`.
    async fn events_until_granted(&mut self, token: &str) -> Vec<Seen> {
        let key = format!("namespaces/hive/grants/{token}");
        let mut seen = Vec::new();
        loop {
            let event = self.event().await;
            let done = event.kind == "grant.granted" && event.key == key;
            seen.push(event);
            if done {
                return seen;
            }
        }
    }
}

/// An event as a watcher saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    revision: u64,
    kind: String,
    key: String,
}

impl Seen {
    /// The event a message carries (not a heartbeat).
    fn of(message: &Message) -> Option<Seen> {
        assert_ne!(message.event.as_deref(), Some("behind"), "the watcher fell behind: {message:?}");
        let data: serde_json::Value = serde_json::from_str(message.data.as_deref()?).unwrap();
        let seen = Seen {
            revision: data["revision"].as_u64().unwrap(),
            kind: data["kind"].as_str().unwrap().to_owned(),
            key: data["key"].as_str().unwrap().to_owned(),
        };
        assert_eq!(message.id.as_deref(), Some(seen.revision.to_string().as_str()), "{message:?}");
        Some(seen)
    }

    /// The token of a grant's event.
    fn token(&self) -> Option<&str> {
        self.key.strip_prefix("namespaces/hive/grants/")
    }
}

/// What a client was told about a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Acked {
    Granted,
    Released,
    /// Asked, not answered: either outcome is allowed.
    InFlight,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_resumes_after_sigkill_with_every_change_after_its_revision_at_the_disk_level() {
    a_watcher_resumes_after_sigkill("disk").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_resumes_after_sigkill_with_every_change_after_its_revision_at_the_process_level() {
    a_watcher_resumes_after_sigkill("process").await;
}

/// A watcher follows grants and releases of concurrent clients over HTTP until the daemon is
/// SIGKILLed; restarted on the same data directory, the watcher resumes from the last revision it
/// had (`Last-Event-ID`) and gets every change after it, none twice: what it saw before and after
/// is exactly the daemon's whole history (watched again from the start), which holds every
/// acknowledged grant and release and replays into the grants the daemon holds.
async fn a_watcher_resumes_after_sigkill(durability: &str) {
    let (_dir, data) = data_dir();
    let args = ["--quota", "hive=1000000", "--durability", durability];
    let daemon = Daemon::start(&data, &args);
    let start: u64 = revision(&daemon).await.parse().unwrap();
    let filter = "prefix=namespaces/hive";
    let mut live = Sse::open(&daemon, &format!("{filter}&since={start}"), None).await;
    let watching = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some(message) = live.message().await {
            seen.extend(Seen::of(&message));
        }
        seen
    });

    let client = daemon.client().with_release_retry(Duration::ZERO);
    let acked: Arc<Mutex<HashMap<String, Acked>>> = Arc::default();
    let mut workers = Vec::new();
    for worker in 0..8 {
        let (client, acked) = (client.clone(), acked.clone());
        workers.push(tokio::spawn(async move {
            for round in 0.. {
                let token = format!("w{worker}-{round}");
                acked.lock().unwrap().insert(token.clone(), Acked::InFlight);
                match client.allocate("hive", &token, &Allocate::default()).await {
                    Ok(answer) => assert_eq!(answer.status, allot_client::Status::Granted),
                    Err(_) => return,
                }
                acked.lock().unwrap().insert(token.clone(), Acked::Granted);
                // Keep one grant in three; release the others.
                if round % 3 == 0 {
                    continue;
                }
                acked.lock().unwrap().insert(token.clone(), Acked::InFlight);
                match client.release("hive", &token, None).await {
                    Ok(_) => acked.lock().unwrap().insert(token, Acked::Released),
                    Err(_) => return,
                };
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    tokio::task::spawn_blocking(move || daemon.kill9()).await.unwrap();
    for worker in workers {
        worker.await.unwrap();
    }
    let before = watching.await.unwrap();
    let acked = acked.lock().unwrap().clone();
    assert!(before.len() > 100, "too little load before the kill: {} events seen", before.len());
    let last = before.last().unwrap().revision;

    let daemon = Daemon::start(&data, &args);
    assert!(revision(&daemon).await.parse::<u64>().unwrap() > last, "revisions go on above every one published");
    let mut resumed = Sse::open(&daemon, filter, Some(last)).await;
    let client = daemon.client();
    client.allocate("hive", "marker", &Allocate::default()).await.unwrap();
    let after = resumed.events_until_granted("marker").await;
    let mut whole = Sse::open(&daemon, &format!("{filter}&since={start}"), None).await;
    let history = whole.events_until_granted("marker").await;

    // Before and after, the watcher saw the whole history: nothing missed, nothing twice.
    let seen: Vec<Seen> = before.iter().chain(&after).cloned().collect();
    assert!(seen.windows(2).all(|pair| pair[0].revision < pair[1].revision), "in order, none twice");
    assert_eq!(seen.len(), history.len(), "{} seen before the kill, {} after", before.len(), after.len());
    assert!(seen == history, "what the watcher saw is the daemon's history");
    // Which holds every acknowledged change.
    let mut events: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for event in &history {
        if let Some(token) = event.token() {
            events.entry(token).or_default().push(event.kind.as_str());
        }
    }
    for (token, acked) in &acked {
        let kinds = events.get(token.as_str()).map(Vec::as_slice).unwrap_or_default();
        match acked {
            Acked::Granted => assert_eq!(kinds.first(), Some(&"grant.granted"), "the grant of {token}"),
            Acked::Released => assert_eq!(kinds, ["grant.granted", "grant.released"], "the release of {token}"),
            Acked::InFlight => {}
        }
    }
    // And replays into what the daemon holds.
    let replayed: Vec<&str> =
        events.iter().filter(|(_, kinds)| kinds.last() == Some(&"grant.granted")).map(|(t, _)| *t).collect();
    let grants = client.grants("hive").await.unwrap().grants;
    let mut held: Vec<&str> = grants.iter().map(|g| g.token.as_str()).collect();
    held.sort_unstable();
    assert_eq!(replayed, held);
}
