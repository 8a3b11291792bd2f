//! Readiness apart from liveness, on Redis: two daemons share one real `redis-server`; the one
//! that does not schedule is ready while it reaches the one that does. The scheduler is killed
//! with SIGKILL: until the other takes the scheduling over, it is alive (`/healthz`) and not ready
//! (`/readyz` says why), its applications calls answer 503 `store_unavailable` (logged as a
//! warning, not an error), and a client with its default retries, and the CLI, get their answer
//! anyway.

use std::collections::BTreeMap;
use std::time::Duration;

use allot_client::{AddTask, ClientError, SubmitApp};
use allot_store_redis::testing::RedisServer;

use crate::redis_apps::scheduler;
use crate::support::{data_dir, eventually, Daemon};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_daemon_is_ready_while_it_reaches_the_scheduler_and_clients_ride_out_an_election() {
    let redis = RedisServer::start();
    let store = redis.url();
    let args = ["--store", store.as_str(), "--pool", "idle=cpu=1"];
    let ((_d1, data1), (_d2, data2)) = (data_dir(), data_dir());
    let first = Daemon::start(&data1, &args);
    assert!(eventually(Duration::from_secs(10), async || scheduler(&redis) == first.url).await, "the first schedules");
    let second = Daemon::start(&data2, &args);
    let client = second.client();
    let ready = eventually(Duration::from_secs(10), async || client.ready().await.is_ok_and(|r| r.status == "ready"));
    assert!(ready.await, "{:?}", client.ready().await);
    let readiness = client.ready().await.unwrap();
    let served_at = format!("served by the daemon that schedules, at {}", first.url);
    assert_eq!(readiness.checks[1].message.as_deref(), Some(served_at.as_str()), "{readiness:?}");

    // A task that waits says why, through the daemon that forwards.
    client.put_queue("root.wait", &Default::default()).await.unwrap();
    let task = AddTask {
        preemptable: None,
        priority_class: None,
        id: "stuck".to_owned(),
        resources: "cpu=1".to_owned(),
        tokens: Vec::new(),
        group: None,
        priority: Default::default(),
        selector: [("zone".to_owned(), "nowhere".to_owned())].into(),
        spec: None,
        retries: None,
    };
    let app = SubmitApp {
        priority: None,
        priority_class: None,
        id: "idle".to_owned(),
        queue: Some("root.wait".to_owned()),
        user: "me".to_owned(),
        user_groups: Vec::new(),
        tags: BTreeMap::new(),
        task_groups: Vec::new(),
        policy: Default::default(),
        tasks: vec![task],
    };
    client.submit_app(&app).await.unwrap();
    let said = eventually(Duration::from_secs(10), async || {
        client.task("idle", "stuck").await.is_ok_and(|t| t.waiting.is_some())
    });
    assert!(said.await, "it says why it waits");
    let waiting = client.task("idle", "stuck").await.unwrap().waiting.unwrap();
    assert_eq!(waiting.code, "no_pool_matches");
    assert_eq!(waiting.message, "no pool that takes allocs has the labels zone=nowhere");

    // The scheduler dies; its lease holds the scheduling for up to 3 s more.
    let first_url = first.url.clone();
    first.kill9();
    let readiness = client.ready().await.unwrap();
    assert_eq!(readiness.status, "not_ready", "{readiness:?}");
    let [store_check, apps_check] = &readiness.checks[..] else { panic!("two checks: {readiness:?}") };
    assert!(store_check.ready && !apps_check.ready, "{readiness:?}");
    let why = apps_check.message.clone().unwrap_or_default();
    assert!(why.contains(&first_url) && why.contains("does not answer"), "{why}");
    assert_eq!(client.health().await.unwrap().status, "ok", "alive all along");
    let once = client.clone().with_unavailable_retry(0, Duration::ZERO).apps().await;
    assert!(
        matches!(&once, Err(ClientError::Api { status: 503, code, .. }) if code == "store_unavailable"),
        "{once:?}"
    );
    // The client's own retries ride the election out, and so does the CLI's.
    let server = second.url.clone();
    let cli = tokio::task::spawn_blocking(move || {
        std::process::Command::new(crate::support::ALLOT)
            .args(["app", "list", "-q", "--server", &server])
            .output()
            .unwrap()
    });
    let retried = client.apps().await;
    assert!(retried.is_ok_and(|list| list.apps.iter().any(|a| a.id == "idle")), "retried through the election");
    let cli = cli.await.unwrap();
    assert!(cli.status.success(), "{}", String::from_utf8_lossy(&cli.stderr));
    assert_eq!(String::from_utf8_lossy(&cli.stdout), "idle\n");
    let readiness = client.ready().await.unwrap();
    assert_eq!(readiness.status, "ready", "{readiness:?}");
    assert_eq!(scheduler(&redis), second.url, "the second took the scheduling over");

    // The 503s of the election are an expected state: warnings, not errors.
    let log = std::fs::read_to_string(data2.with_extension("log")).unwrap();
    assert!(log.lines().any(|l| l.contains("WARN") && l.contains("request answered 503")), "{log}");
    assert!(!log.lines().any(|l| l.contains("ERROR")), "{log}");
}

/// A daemon whose store cannot be opened yet (its Redis is down) already listens: every call is
/// answered 503 `starting` with `Retry-After`, `/readyz` says not ready and `/healthz` that it is
/// alive; a client with retries waits, and gets its answer once the store opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_answers_starting_until_its_store_opens() {
    let mut starting = Starting::start(&["--quota", "hive:a=3"]).await;
    let (redis, url) = (&mut starting.redis, starting.url.clone());

    let http = reqwest::Client::new();
    let answer = http.get(format!("{url}/v1/namespaces")).send().await.unwrap();
    assert_eq!(answer.status(), 503);
    assert_eq!(answer.headers()["retry-after"], "1");
    let body: serde_json::Value = answer.json().await.unwrap();
    assert_eq!(body["error"]["code"], "starting", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("starting") && message.contains("redis"), "{message}");
    let post = http.post(format!("{url}/v1/namespaces/hive:b/tokens/t1")).body("{}").send().await.unwrap();
    assert_eq!(post.status(), 503, "a change is refused too, and made nowhere");

    let client = allot_client::Client::new(&url).unwrap();
    let readiness = client.ready().await.unwrap();
    assert_eq!(readiness.status, "not_ready", "{readiness:?}");
    assert!(!readiness.checks[0].ready && readiness.checks[0].name == "store", "{readiness:?}");
    assert_eq!(client.health().await.unwrap().status, "starting", "alive while it starts");
    let once = client.clone().with_unavailable_retry(0, Duration::ZERO).namespaces().await;
    assert!(matches!(&once, Err(ClientError::Api { status: 503, code, .. }) if code == "starting"), "{once:?}");

    // A client with retries waits for the store; Redis comes up meanwhile.
    let patient = client.clone().with_unavailable_retry(u32::MAX, crate::support::PATIENCE);
    let waiting = tokio::spawn(async move { patient.namespaces().await });
    redis.restart();
    let list = waiting.await.unwrap().expect("answered once the store opened");
    assert!(list.namespaces.iter().any(|n| n.name == "hive:a"), "{list:?}");
    assert!(!list.namespaces.iter().any(|n| n.name == "hive:b"), "nothing was made while starting: {list:?}");
    let ready = crate::support::eventually(crate::support::PATIENCE, async || {
        client.ready().await.is_ok_and(|r| r.status == "ready")
    });
    assert!(ready.await, "{:?}", client.ready().await);
    assert_eq!(client.health().await.unwrap().status, "ok");
}

/// While it starts, the daemon takes no more connections than `--max-connections`, and closes
/// one that sends nothing after the idle timeout: a flood of silent connections neither runs it
/// out of file descriptors nor keeps out, for longer than that, the clients that wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starting_daemon_takes_at_most_its_connections_and_closes_silent_ones() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let starting = Starting::start(&["--max-connections", "2", "--idle-timeout", "3s"]).await;
    let address = starting.url.trim_start_matches("http://").to_owned();
    let mut silent = Vec::new();
    for _ in 0..2 {
        silent.push(tokio::net::TcpStream::connect(&address).await.unwrap());
    }
    let mut third = tokio::net::TcpStream::connect(&address).await.unwrap();
    third.write_all(b"GET /v1/namespaces HTTP/1.1\r\nhost: allot\r\n\r\n").await.unwrap();
    let mut answer = Vec::new();
    // The silent two hold both places for the idle timeout (3 s): no answer before then. A slow
    // machine only delays an answer.
    let early = tokio::time::timeout(Duration::from_millis(500), third.read_buf(&mut answer)).await;
    assert!(early.is_err(), "the third connection was answered past the limit: {answer:?}");
    // Then the silent ones are closed, and the third is answered.
    for (i, conn) in silent.iter_mut().enumerate() {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(crate::support::PATIENCE, conn.read(&mut byte)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "silent connection {i} was not closed: {read:?}");
    }
    let answered = tokio::time::timeout(crate::support::PATIENCE, async {
        while !String::from_utf8_lossy(&answer).contains("\"starting\"") {
            assert!(third.read_buf(&mut answer).await.unwrap() > 0, "closed unanswered: {answer:?}");
        }
    });
    assert!(answered.await.is_ok(), "the third connection was never answered: {}", String::from_utf8_lossy(&answer));
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 503"), "{}", String::from_utf8_lossy(&answer));
}

/// A daemon on a Redis that is down, so it stays starting; `redis.restart()` lets it open.
struct Starting {
    redis: RedisServer,
    url: String,
    _daemon: Reaper,
    _dir: tempfile::TempDir,
}

impl Starting {
    async fn start(args: &[&str]) -> Starting {
        let mut redis = RedisServer::start();
        let store = redis.url();
        redis.stop();
        let (dir, data) = data_dir();
        let log_path = data.with_extension("log");
        let log = std::fs::File::create(&log_path).unwrap();
        let child = std::process::Command::new(crate::support::ALLOT)
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&data)
            .args(["--store", store.as_str()])
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap();
        let daemon = Reaper(child);
        let address = |log: &str| {
            let line = log.lines().find(|l| l.contains("answering 503 `starting`"))?;
            let at = line.split("address=").nth(1)?;
            Some(at.split_whitespace().next()?.to_owned())
        };
        let listening = crate::support::eventually(crate::support::PATIENCE, async || {
            address(&std::fs::read_to_string(&log_path).unwrap_or_default()).is_some()
        })
        .await;
        let log = std::fs::read_to_string(&log_path).unwrap();
        assert!(listening, "the daemon says it listens while starting: {log}");
        let url = format!("http://{}", address(&log).unwrap());
        Starting { redis, url, _daemon: daemon, _dir: dir }
    }
}

/// Kills a daemon process when the test ends, whatever happened.
struct Reaper(std::process::Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
