//! Several real daemons on one real `redis-server`: shared quotas, no over-grant under random
//! concurrent load with caps, first-come-first-served waiting across daemons, and a Redis outage
//! in the middle of load.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use allot_client::{Allocate, Caps, ClientError, Scope, Status};
use allot_store_redis::testing::RedisServer;

use crate::support::{data_dir, eventually, Daemon, PATIENCE};

fn start_daemon(redis: &RedisServer, extra: &[&str]) -> (tempfile::TempDir, Daemon) {
    let (dir, data) = data_dir();
    let url = redis.url();
    let mut args = vec!["--store", url.as_str()];
    args.extend_from_slice(extra);
    let daemon = Daemon::start(&data, &args);
    (dir, daemon)
}

/// A small deterministic generator, so a failing run can be replayed.
type Rng = allot_core::testing::XorShift;

const QUOTA: u64 = 10;
const PROJECT_CAP: u64 = 6;
const SCOPE_CAP: u64 = 4;

/// Reads the grants of `namespace` straight from Redis (one atomic HGETALL) and checks the
/// quota and both caps. Returns the tokens granted.
fn check_redis(conn: &mut redis::Connection, namespace: &str) -> Vec<String> {
    let key = format!("allot:{{{namespace}}}:grants");
    let grants: Vec<(String, String)> = redis::cmd("HGETALL").arg(&key).query(conn).expect("HGETALL");
    let (mut total, mut projects, mut scopes) = (0u64, HashMap::new(), HashMap::new());
    for (_, record) in &grants {
        let f: Vec<&str> = record.split('\n').collect();
        let units: u64 = f[0].parse().unwrap();
        total += units;
        *projects.entry(f[7].to_owned()).or_insert(0u64) += units;
        *scopes.entry((f[7].to_owned(), f[8].to_owned())).or_insert(0u64) += units;
    }
    assert!(total <= QUOTA, "over-granted: {total} > {QUOTA}: {grants:?}");
    for (project, held) in &projects {
        assert!(*held <= PROJECT_CAP, "project {project} holds {held} > cap {PROJECT_CAP}");
    }
    for (scope, held) in &scopes {
        assert!(*held <= SCOPE_CAP, "scope {scope:?} holds {held} > cap {SCOPE_CAP}");
    }
    grants.into_iter().map(|(token, _)| token).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_daemons_share_quotas_and_never_over_grant() {
    let redis = RedisServer::start();
    // Different configurations: the first daemon seeds the quota, the others keep it.
    let (_d1, first) = start_daemon(&redis, &["--quota", &format!("shared={QUOTA}")]);
    let (_d2, second) = start_daemon(&redis, &["--quota", "shared=99"]);
    // The third takes its store from the configuration file.
    let (d3, data) = data_dir();
    let config = d3.path().join("allot.toml");
    std::fs::write(&config, format!("store = \"{}\"\n[quotas]\nshared = 7\n", redis.url())).unwrap();
    let third = Daemon::start(&data, &["--config", config.to_str().unwrap()]);
    let daemons = [first.client(), second.client(), third.client()];
    assert_eq!(third.client().health().await.unwrap().backend, "redis");
    for client in &daemons {
        assert_eq!(client.namespace("shared").await.unwrap().quota, QUOTA, "the first seed holds for all");
    }
    // A quota changed through one daemon holds at once for all.
    daemons[1].put_namespace("shared", 3).await.unwrap();
    for client in &daemons {
        assert_eq!(client.namespace("shared").await.unwrap().quota, 3);
    }
    daemons[2].put_namespace("shared", QUOTA).await.unwrap();

    let counts: Arc<Mutex<HashMap<&'static str, u64>>> = Arc::default();
    let mut workers = Vec::new();
    for worker in 0..12u64 {
        let daemons = daemons.clone();
        let counts = counts.clone();
        let url = redis.url();
        workers.push(tokio::spawn(async move {
            let mut conn = redis::Client::open(url.as_str()).unwrap().get_connection().unwrap();
            let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15 ^ (worker + 1));
            let mut held: Vec<String> = Vec::new();
            for round in 0..40 {
                let client = &daemons[rng.below(3) as usize];
                let release = !held.is_empty() && rng.below(2) == 0;
                if release {
                    let token = held.swap_remove(rng.below(held.len() as u64) as usize);
                    let answer = client.release("shared", &token, None).await.unwrap();
                    assert!(answer.released, "{token} was acknowledged and must still be granted");
                    *counts.lock().unwrap().entry("released").or_default() += 1;
                } else {
                    let token = format!("w{worker}-{round}");
                    let request = Allocate {
                        units: Some(1 + rng.below(3)),
                        scope: Some(Scope {
                            project: ["p1", "p2"][rng.below(2) as usize].into(),
                            namespace: ["dev", "prod"][rng.below(2) as usize].into(),
                        }),
                        caps: Some(Caps { project: Some(PROJECT_CAP), namespace: Some(SCOPE_CAP) }),
                        wait_ms: Some(if rng.below(2) == 0 { 0 } else { 30 }),
                        ..Allocate::default()
                    };
                    let answer = client.allocate("shared", &token, &request).await.unwrap();
                    let outcome = match answer.status {
                        Status::Granted => {
                            held.push(token);
                            "granted"
                        }
                        Status::Exhausted => "exhausted",
                        Status::NamespaceQuotaExceeded => "cap_exceeded",
                    };
                    *counts.lock().unwrap().entry(outcome).or_default() += 1;
                }
                // After every step: no quota or cap exceeded, and every acknowledged grant is in Redis.
                let in_redis = check_redis(&mut conn, "shared");
                for token in &held {
                    assert!(in_redis.contains(token), "acknowledged grant {token} is not in Redis");
                }
            }
            for token in held {
                assert!(daemons[0].release("shared", &token, None).await.unwrap().released);
            }
        }));
    }
    for worker in workers {
        worker.await.unwrap();
    }
    let counts = counts.lock().unwrap().clone();
    println!("outcomes over three daemons: {counts:?}");
    for outcome in ["granted", "exhausted", "cap_exceeded", "released"] {
        assert!(counts.get(outcome).copied().unwrap_or(0) > 0, "no `{outcome}` happened: {counts:?}");
    }
    let view = daemons[2].namespace("shared").await.unwrap();
    assert_eq!((view.granted_units, view.waiters), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_keep_their_order_across_daemons() {
    let redis = RedisServer::start();
    let (_d1, first) = start_daemon(&redis, &["--quota", "fifo=1"]);
    let (_d2, second) = start_daemon(&redis, &[]);
    let (_d3, third) = start_daemon(&redis, &[]);
    let (a, b, c) = (first.client(), second.client(), third.client());
    assert_eq!(a.allocate("fifo", "holder", &Allocate::default()).await.unwrap().status, Status::Granted);

    let queue_is = |client: allot_client::Client, tokens: &'static [&'static str]| async move {
        let ok = eventually(Duration::from_secs(5), async || {
            let waiters = client.waiters("fifo").await.unwrap().waiters;
            waiters.iter().map(|w| w.token.as_str()).collect::<Vec<_>>() == tokens
        })
        .await;
        assert!(ok, "the queue never became {tokens:?}");
    };
    let wait = Allocate { wait_ms: Some(20_000), ..Allocate::default() };
    // w1 and w3 wait on the second daemon, w2 on the third, in that order.
    let w1 = tokio::spawn({
        let (b, wait) = (b.clone(), wait.clone());
        async move { (b.allocate("fifo", "w1", &wait).await.unwrap(), Instant::now()) }
    });
    queue_is(a.clone(), &["w1"]).await;
    let w2 = tokio::spawn({
        let (c, wait) = (c.clone(), wait.clone());
        async move { (c.allocate("fifo", "w2", &wait).await.unwrap(), Instant::now()) }
    });
    queue_is(a.clone(), &["w1", "w2"]).await;
    let w3 = tokio::spawn({
        let (b, wait) = (b.clone(), wait.clone());
        async move { (b.allocate("fifo", "w3", &wait).await.unwrap(), Instant::now()) }
    });
    queue_is(a.clone(), &["w1", "w2", "w3"]).await;

    // Each release, through another daemon than the waiter's, grants the head of the queue.
    let mut handoffs = Vec::new();
    for (releaser, token, next, rest) in
        [(&a, "holder", w1, &["w2", "w3"][..]), (&c, "w1", w2, &["w3"][..]), (&a, "w2", w3, &[][..])]
    {
        let released_at = Instant::now();
        assert!(releaser.release("fifo", token, None).await.unwrap().released);
        let (answer, granted_at) = next.await.unwrap();
        assert_eq!(answer.status, Status::Granted, "{answer:?}");
        handoffs.push(granted_at.saturating_duration_since(released_at));
        let waiting: Vec<String> = a.waiters("fifo").await.unwrap().waiters.into_iter().map(|w| w.token).collect();
        assert_eq!(waiting, rest);
    }
    println!("release-to-grant across daemons: {handoffs:?}");
}

/// One request straight over HTTP, to see the status, headers and error body.
async fn raw_get(url: &str) -> (u16, Option<String>, serde_json::Value) {
    let response = reqwest::get(url).await.unwrap();
    let status = response.status().as_u16();
    let retry_after = response.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
    (status, retry_after, response.json().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_answers_503_and_recovers_without_losing_anything() {
    let mut redis = RedisServer::start_durable();
    let (_dir, daemon) = start_daemon(&redis, &["--quota", "outage=1000"]);
    let client = daemon.client();
    // Grants held across the outage: all must be there after it.
    for i in 0..20 {
        let answer = client.allocate("outage", &format!("held-{i}"), &Allocate::default()).await.unwrap();
        assert_eq!(answer.status, Status::Granted);
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let errors: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    // Grants the workers were answered, all together.
    let answered = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut workers = Vec::new();
    for worker in 0..4 {
        let (client, stop, errors, answered) = (client.clone(), stop.clone(), errors.clone(), answered.clone());
        workers.push(tokio::spawn(async move {
            let mut granted = 0u64;
            for round in 0.. {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let token = format!("w{worker}-{round}");
                match client.allocate("outage", &token, &Allocate::default()).await {
                    Ok(answer) => {
                        assert_eq!(answer.status, Status::Granted);
                        granted += 1;
                        answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Err(err) => {
                        // (No pause: the release below waits for Redis.)
                        let code = err.code().unwrap_or("http").to_owned();
                        *errors.lock().unwrap().entry(code).or_default() += 1;
                    }
                }
                // Released whatever happened (the outcome of a failed allocate is unknown); the
                // client retries until the release is acknowledged.
                let released = client.release("outage", &token, None).await;
                assert!(released.is_ok(), "a release was lost: {released:?}");
            }
            granted
        }));
    }
    // Under load (wait for it, not for a time), then Redis stops.
    let grants_so_far = || answered.load(std::sync::atomic::Ordering::Relaxed);
    assert!(eventually(PATIENCE, async || grants_so_far() >= 40).await, "the load never reached 40 grants");

    redis.stop();
    // Releases issued during the outage complete once Redis is back: each is refused once (seen
    // here, without the client's retries), then sent again with them.
    let refused: Arc<std::sync::atomic::AtomicU64> = Arc::default();
    let releases: Vec<_> = (0..5)
        .map(|i| {
            let (client, refused) = (client.clone(), refused.clone());
            let once = client.clone().with_unavailable_retry(0, Duration::ZERO).with_release_retry(Duration::ZERO);
            tokio::spawn(async move {
                let token = format!("held-{i}");
                let first = once.release("outage", &token, None).await;
                // Refused: Redis is down, or (sent while its connection broke) its outcome unknown.
                let codes = [Some("store_unavailable"), Some("store_outcome_unknown")];
                let unavailable = first.as_ref().is_err_and(|err| codes.contains(&err.code()));
                assert!(unavailable, "a release during the outage: {first:?}");
                refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                client.release("outage", &token, None).await
            })
        })
        .collect();
    let (status, retry_after, body) = raw_get(&format!("{}/v1/namespaces/outage", daemon.url)).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "store_unavailable", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("Redis"), "{body}");
    assert_eq!(retry_after.as_deref(), Some("1"));
    // (The client's own retries of `store_unavailable` are off: this checks the daemon's answer.)
    let once = client.clone().with_unavailable_retry(0, Duration::ZERO);
    let failed = once.allocate("outage", "during", &Allocate::default()).await;
    assert!(matches!(&failed, Err(ClientError::Api { status: 503, .. })), "{failed:?}");
    // The daemon stays up, and is not ready: its store does not answer.
    assert_eq!(raw_get(&format!("{}/healthz", daemon.url)).await.0, 200);
    let (status, _, readiness) = raw_get(&format!("{}/readyz", daemon.url)).await;
    assert_eq!((status, readiness["checks"][0]["ready"].clone()), (503, serde_json::json!(false)), "{readiness}");
    assert!(readiness["checks"][0]["message"].as_str().unwrap().contains("Redis"), "{readiness}");
    let all_refused = eventually(PATIENCE, async || refused.load(std::sync::atomic::Ordering::Relaxed) == 5);
    assert!(all_refused.await, "the releases sent during the outage were not all refused");

    redis.restart();
    let recovered = eventually(Duration::from_secs(10), async || client.namespace("outage").await.is_ok()).await;
    assert!(recovered, "the daemon did not recover by itself");
    let ready = eventually(Duration::from_secs(10), async || client.ready().await.is_ok_and(|r| r.status == "ready"));
    assert!(ready.await, "ready again: {:?}", client.ready().await);
    let after = client.allocate("outage", "after", &Allocate::default()).await.unwrap();
    assert_eq!(after.status, Status::Granted);
    assert!(client.release("outage", "after", None).await.unwrap().released);
    for release in releases {
        let answer = release.await.unwrap().expect("a release during the outage was retried until acknowledged");
        assert!(answer.released);
    }
    // The workers go on after the outage: more grants answered (wait for it, not for a time).
    let before_stop = grants_so_far();
    let went_on = eventually(PATIENCE, async || grants_so_far() >= before_stop + 20);
    assert!(went_on.await, "the workers answered no grant after the outage");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut granted = 0;
    for worker in workers {
        granted += worker.await.unwrap();
    }
    let errors = errors.lock().unwrap().clone();
    println!("grants: {granted}, errors during the outage: {errors:?}");
    // (A worker may have spent the whole outage retrying its release, so it saw no error.)
    for code in errors.keys() {
        assert!(code == "store_unavailable" || code == "store_outcome_unknown", "unexpected error {code}");
    }
    // Everything acknowledged is there: the 15 held grants, and nothing else.
    let grants = client.grants("outage").await.unwrap().grants;
    let mut tokens: Vec<String> = grants.into_iter().map(|g| g.token).collect();
    tokens.sort();
    let mut expected: Vec<String> = (5..20).map(|i| format!("held-{i}")).collect();
    expected.sort();
    assert_eq!(tokens, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_daemons_share_pools_and_never_over_allocate() {
    use allot_client::Accept;
    let redis = RedisServer::start();
    let (_d1, first) = start_daemon(&redis, &["--pool", "shared=cpu=4,mem=8GiB"]);
    let (_d2, second) = start_daemon(&redis, &["--pool", "shared=cpu=64"]);
    let (_d3, third) = start_daemon(&redis, &[]);
    let daemons = [first.client(), second.client(), third.client()];
    for client in &daemons {
        assert_eq!(client.pool("shared").await.unwrap().capacity, "cpu=4,mem=8GiB", "the first seed holds for all");
    }
    let counts: Arc<Mutex<HashMap<&'static str, u64>>> = Arc::default();
    let mut workers = Vec::new();
    for worker in 0..12u64 {
        let (daemons, counts) = (daemons.clone(), counts.clone());
        workers.push(tokio::spawn(async move {
            let mut rng = Rng::new(0x5851_f42d_4c95_7f2d ^ (worker + 1));
            let mut held: Vec<String> = Vec::new();
            for _ in 0..30 {
                let client = &daemons[rng.below(3) as usize];
                if !held.is_empty() && rng.below(2) == 0 {
                    let id = held.swap_remove(rng.below(held.len() as u64) as usize);
                    let freed = client.free_alloc("shared", &id).await.unwrap();
                    assert_eq!(freed.ended, Some(allot_client::EndReason::Freed));
                    *counts.lock().unwrap().entry("freed").or_default() += 1;
                } else {
                    let min = format!("cpu={},mem={}GiB", 1 + rng.below(2), rng.below(3));
                    let accept = Accept { min, max: Some("cpu=2,mem=4GiB".into()), ..Accept::default() };
                    match client.accept("shared", "1", &accept).await {
                        Ok(alloc) => {
                            held.push(alloc.id);
                            *counts.lock().unwrap().entry("accepted").or_default() += 1;
                        }
                        Err(err) if err.code() == Some("offer_expired") => {
                            *counts.lock().unwrap().entry("offer_expired").or_default() += 1;
                        }
                        Err(err) => panic!("{err}"),
                    }
                }
                // One atomic read of the pool: what the allocs hold never exceeds the capacity.
                let pool = client.pool("shared").await.unwrap();
                let capacity: allot_core::Resources = pool.capacity.parse().unwrap();
                let allocated: allot_core::Resources = pool.allocated.parse().unwrap();
                let lapsed: allot_core::Resources = pool.expired.parse().unwrap();
                let held_all = allocated.checked_add(&lapsed).unwrap();
                assert!(capacity.fits(&held_all), "over-allocated: {held_all} of {capacity}");
            }
            for id in held {
                daemons[0].free_alloc("shared", &id).await.unwrap();
            }
        }));
    }
    for worker in workers {
        worker.await.unwrap();
    }
    let counts = counts.lock().unwrap().clone();
    println!("pool outcomes over three daemons: {counts:?}");
    for outcome in ["accepted", "offer_expired", "freed"] {
        assert!(counts.get(outcome).copied().unwrap_or(0) > 0, "no `{outcome}` happened: {counts:?}");
    }
    let pool = daemons[2].pool("shared").await.unwrap();
    assert_eq!((pool.allocs, pool.allocated.as_str()), (0, ""));
}

/// `allot bench redis` runs its three targets in every round on a real Redis and a real daemon,
/// and reports medians of them.
#[test]
fn bench_redis_measures_three_targets_each_round() {
    let redis = RedisServer::start();
    let output = std::process::Command::new(crate::support::ALLOT)
        .args(["bench", "redis", "--redis", &redis.url(), "--clients", "2", "--duration", "300ms"])
        .args(["--warmup", "100ms", "--rounds", "2", "--held", "90", "--quota", "100", "--json"])
        .output()
        .expect("run allot bench redis");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON report");
    let measured = report["measured"].as_array().expect("measured");
    assert_eq!(measured.len(), 6, "{report:#}");
    for m in measured {
        assert!(m["pairs_per_s"].as_f64().unwrap() > 0.0, "{m:#}");
        assert_eq!(m["errors"], 0, "{m:#}");
        assert_eq!(m["not_granted"], 0, "{m:#}");
    }
    let summaries = report["summaries"].as_array().expect("summaries");
    let targets: Vec<&str> = summaries.iter().map(|s| s["target"].as_str().unwrap()).collect();
    assert_eq!(targets, ["direct", "flyte", "allot"]);
    assert!(summaries[2]["vs_flyte"].as_f64().unwrap() > 0.0, "{report:#}");
    // The bench cleans up after itself: of its namespace only the fencing counter and the primary
    // that gave its last number are left, as of any removed namespace (fencing numbers never go
    // back, failovers or not), and its change feed's stream, emptied once its events are copied
    // into the shared log.
    let mut conn = redis::Client::open(redis.url()).unwrap().get_connection().unwrap();
    // (The bench has ended: nothing changes them any more.)
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("*bench*").query(&mut conn).unwrap();
    keys.sort();
    let left: Vec<&str> = keys.iter().map(|k| k.rsplit(':').next().unwrap()).collect();
    assert!(left == ["feed", "fencing", "fencing_by"] || left == ["fencing", "fencing_by"], "{keys:?}");
}
