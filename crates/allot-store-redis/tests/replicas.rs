//! `--redis-min-replicas`: a change is acknowledged only once that many replicas have it
//! (`WAIT`); when they do not confirm it in time, the answer is an unknown outcome, never a
//! success.

use allot_store::prelude::*;
use std::time::{Duration, Instant};

use allot_core::{AllocateRequest, Constraints, LeaseRequest, NamespaceName, Token};
use allot_store::StoreError;
use allot_store_redis::testing::RedisServer;
use allot_store_redis::{RedisConfig, RedisStore};

fn request(token: &str) -> AllocateRequest {
    AllocateRequest {
        namespace: NamespaceName::new("replicated").unwrap(),
        token: Token::new(token).unwrap(),
        units: 1,
        scope: None,
        constraints: Constraints::default(),
        lease: LeaseRequest::None,
    }
}

/// Starts a replica of `primary` and waits until the primary counts it.
fn replica_of(primary: &RedisServer) -> RedisServer {
    // Redis waits 5 s by default before it sends the first copy, for more replicas to join.
    primary.cli(&["CONFIG", "SET", "repl-diskless-sync-delay", "0"]);
    let replica = RedisServer::start();
    replica.cli(&["REPLICAOF", "127.0.0.1", &primary.port.to_string()]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !primary.cli(&["INFO", "replication"]).contains("state=online") {
        assert!(Instant::now() < deadline, "the replica never connected");
        std::thread::sleep(Duration::from_millis(50));
    }
    replica
}

async fn open(primary: &RedisServer, min_replicas: u32) -> RedisStore {
    let config = RedisConfig::parse(&primary.url()).unwrap().with_min_replicas(min_replicas);
    RedisStore::open(&config).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_is_acknowledged_once_its_replicas_have_it_and_unknown_when_they_do_not() {
    let primary = RedisServer::start();
    let mut replica = replica_of(&primary);
    let store = open(&primary, 1).await;
    store.put_namespace(NamespaceName::new("replicated").unwrap(), 100).await.unwrap();
    for i in 0..50 {
        let token = format!("t{i}");
        store.allocate(request(&token), Duration::ZERO).await.unwrap();
        // Acknowledged means the replica has it already.
        let held = replica.cli(&["HEXISTS", "allot:{replicated}:grants", &token]);
        assert_eq!(held.trim(), "1", "grant {token} acknowledged before the replica had it");
    }

    // One replica fewer than required: the change is applied on the primary, but not confirmed.
    let two = open(&primary, 2).await;
    let started = Instant::now();
    let answer = two.allocate(request("needs-two"), Duration::ZERO).await;
    let Err(err @ StoreError::OutcomeUnknown(_)) = &answer else {
        panic!("a change two replicas did not confirm answered {answer:?}")
    };
    let message = err.to_string();
    assert!(message.contains("1 of the 2 replicas") && message.contains("--redis-min-replicas"), "{message}");
    assert!(started.elapsed() >= Duration::from_millis(900), "WAIT gave up after {:?}", started.elapsed());

    // The replica gone: nothing is acknowledged. (`WAIT` holds its connection until it returns,
    // so a call may time out behind the sweeper's own `WAIT`s: unknown either way.)
    replica.stop();
    let answer = store.allocate(request("alone"), Duration::ZERO).await;
    assert!(matches!(answer, Err(StoreError::OutcomeUnknown(_))), "{answer:?}");

    // Without the option, the primary's answer is enough.
    let unreplicated = open(&primary, 0).await;
    unreplicated.allocate(request("primary-only"), Duration::ZERO).await.unwrap();
    store.shutdown().await;
    two.shutdown().await;
    unreplicated.shutdown().await;
}
