//! What a call answers when Redis goes away: a call that never reached Redis changed nothing
//! (`Unavailable`); only a call that Redis may have received and never answered is
//! `OutcomeUnknown`. Both messages name Redis, not a disk.

use allot_store::prelude::*;
use std::time::Duration;

use allot_core::{NamespaceName, Token};
use allot_store::StoreError;
use allot_store_redis::testing::RedisServer;
use allot_store_redis::RedisStore;

use crate::support::{self, request, until};

async fn open(server: &RedisServer) -> RedisStore {
    let store = support::open(&server.url()).await;
    store.put_namespace(NamespaceName::new("outage").unwrap(), 100).await.unwrap();
    store.allocate(request("outage", "before"), Duration::ZERO).await.unwrap();
    store
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_to_a_killed_server_are_unavailable_and_name_redis() {
    let mut server = RedisServer::start();
    let store = open(&server).await;
    server.stop();
    let mut unknown = 0;
    let mut refused = Vec::new();
    for i in 0..20 {
        match store.allocate(request("outage", &format!("after-{i}")), Duration::ZERO).await {
            Err(StoreError::OutcomeUnknown(reason)) => {
                // Only the call that finds the connection broken may not know whether it left.
                unknown += 1;
                assert!(reason.contains("Redis"), "{reason}");
            }
            Err(err @ StoreError::Unavailable(_)) => refused.push(err.to_string()),
            other => panic!("a call to a killed server answered {other:?}"),
        }
        // Calls spread over time, as a daemon's are: the store's reconnects run between them.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(unknown <= 1, "{unknown} calls that were never sent answered outcome unknown");
    assert!(refused.len() >= 19, "{refused:?}");
    for message in &refused {
        assert!(message.contains("Redis") && message.contains("nothing was changed"), "{message}");
        assert!(!message.contains("disk"), "{message}");
    }
    assert!(refused.iter().any(|m| m.to_lowercase().contains("refused")), "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_in_flight_when_the_server_dies_has_an_unknown_outcome() {
    let mut server = RedisServer::start();
    let store = std::sync::Arc::new(open(&server).await);
    // Writes wait while clients are paused: the call below is sent and held unanswered.
    server.cli(&["CLIENT", "PAUSE", "10000", "WRITE"]);
    let call = tokio::spawn({
        let store = store.clone();
        async move { store.allocate(request("outage", "in-flight"), Duration::ZERO).await }
    });
    wait_until_held(std::slice::from_ref(&server)).await;
    assert!(!call.is_finished(), "the call waits for the paused server");
    server.stop();
    let answer = call.await.unwrap();
    let Err(err @ StoreError::OutcomeUnknown(_)) = answer else {
        panic!("a call sent and never answered must be an unknown outcome, not {answer:?}")
    };
    let message = err.to_string();
    assert!(
        message.contains("Redis did not answer") && message.contains("may or may not have been applied"),
        "{message}"
    );
    assert!(!message.contains("disk"), "{message}");
    // Answered by the kill (the connection broke), not by waiting out the response timeout.
    assert!(message.contains("the connection broke"), "{message}");
}

/// On a Redis Cluster, a change sent to a node that dies before it answers may have been
/// applied: it is `OutcomeUnknown`, never "nothing was changed", whatever the client library
/// would do after (it used to send the change again on a new connection, and its last error,
/// "connection refused" from the dead node, read as "never sent").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_in_flight_when_its_cluster_node_dies_has_an_unknown_outcome() {
    let mut cluster = allot_store_redis::testing::RedisCluster::start(3);
    let store = std::sync::Arc::new(support::open(&cluster.address()).await);
    store.put_namespace(NamespaceName::new("outage").unwrap(), 100).await.unwrap();
    store.allocate(request("outage", "before"), Duration::ZERO).await.unwrap();
    // Every node holds its writes: the call below is sent to the namespace's node and waits.
    for node in &cluster.nodes {
        node.cli(&["CLIENT", "PAUSE", "10000", "WRITE"]);
    }
    let call = tokio::spawn({
        let store = store.clone();
        async move { store.allocate(request("outage", "in-flight"), Duration::ZERO).await }
    });
    wait_until_held(&cluster.nodes).await;
    assert!(!call.is_finished(), "the call waits for the paused node");
    for node in &mut cluster.nodes {
        node.stop();
    }
    let answer = call.await.unwrap();
    let Err(err @ StoreError::OutcomeUnknown(_)) = answer else {
        panic!("a change sent and never answered must be an unknown outcome, not {answer:?}")
    };
    let message = err.to_string();
    assert!(message.contains("may or may not have been applied") && message.contains("Redis"), "{message}");
}

/// Waits until a call was sent and is held by one of `servers` (not still in the client, where a
/// kill would rightly make it "never sent"): a write held by `CLIENT PAUSE` is a blocked client.
async fn wait_until_held(servers: &[RedisServer]) {
    let held = |server: &RedisServer| {
        let info = server.cli(&["INFO", "clients"]);
        info.lines().any(|line| line.trim().strip_prefix("blocked_clients:").is_some_and(|n| n != "0"))
    };
    until("the call reached a server", async || servers.iter().any(held)).await;
}

/// A Redis that lost its last writes (a failover to a replica that lacked them, or a restart
/// without them) gives the waiter ids it lost again. A call still waiting on a lost id must not
/// take the place or the answer of the other caller's waiter given that id: here the first
/// caller's wait ends, and withdrawing its (lost) waiter must leave the second caller's alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_lost_with_the_last_writes_leaves_another_callers_waiter_alone() {
    let server = RedisServer::start();
    let store = std::sync::Arc::new(support::open(&server.url()).await);
    store.put_namespace(NamespaceName::new("lost").unwrap(), 1).await.unwrap();
    store.allocate(request("lost", "holder"), Duration::ZERO).await.unwrap();
    // Its wait ends after the second caller queued (a few Redis calls away; on a machine stalled
    // longer than that the first call ends first and the test checks less, but still passes).
    let first = {
        let store = store.clone();
        tokio::spawn(async move { store.allocate(request("lost", "first"), Duration::from_secs(5)).await })
    };
    until("the first caller waits", async || server.cli(&["HGET", "allot:{lost}:wtok", "first"]).trim() == "1").await;
    // Its waiter lost, as the writes that made it would be (the id counter back where it was).
    for args in [
        &["ZREM", "allot:{lost}:queue", "1"][..],
        &["HDEL", "allot:{lost}:wreq", "1"],
        &["HDEL", "allot:{lost}:wtok", "first"],
        &["ZREM", "allot:{lost}:wdl", "1"],
        &["HINCRBY", "allot:{lost}:ns", "waiting_units", "-1"],
        &["SET", "allot:{lost}:wseq", "0"],
    ] {
        server.cli(args);
    }
    let second = {
        let store = store.clone();
        tokio::spawn(async move { store.allocate(request("lost", "second"), Duration::from_secs(60)).await })
    };
    until("the second caller waits under the lost id", async || {
        server.cli(&["HGET", "allot:{lost}:wtok", "second"]).trim() == "1"
    })
    .await;
    let first = first.await.unwrap();
    assert!(!matches!(first, Ok(allot_store::Allocation::Granted { .. })), "the lost wait: {first:?}");
    store.release(NamespaceName::new("lost").unwrap(), Token::new("holder").unwrap(), None).await.unwrap();
    let second = second.await.unwrap();
    assert!(
        matches!(&second, Ok(allot_store::Allocation::Granted { grant, .. }) if grant.grant.token.as_str() == "second"),
        "the second caller's grant: {second:?}"
    );
}
