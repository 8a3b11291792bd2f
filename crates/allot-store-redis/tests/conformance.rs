//! The shared conformance suite against a real `redis-server`, and against a real three-primary
//! Redis Cluster.

use std::sync::Arc;

use allot_store::{conformance, Store};
use allot_store_redis::testing::{RedisCluster, RedisServer};
use allot_store_redis::{RedisConfig, RedisStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_on_one_redis_server() {
    let server = RedisServer::start();
    let store = Arc::new(RedisStore::open(&RedisConfig::parse(&server.url()).unwrap()).await.unwrap());
    conformance::run(store.clone()).await;
    conformance::run_pools(store.clone()).await;
    store.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_on_a_three_primary_cluster() {
    let cluster = RedisCluster::start(3);
    let store = Arc::new(RedisStore::open(&RedisConfig::parse(&cluster.address()).unwrap()).await.unwrap());
    conformance::run(store.clone()).await;
    conformance::run_pools(store.clone()).await;
    store.shutdown().await;
}

/// A server that refuses the function library (here: a user without FUNCTION) is an error at
/// once, with the reason, not a wait that never ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_refuses_the_library_fails_at_once() {
    let server = RedisServer::start();
    server.cli(&["ACL", "SETUSER", "limited", "on", ">secret", "~*", "&*", "+@all", "-function"]);
    let url = format!("redis://limited:secret@127.0.0.1:{}", server.port);
    let opened =
        tokio::time::timeout(std::time::Duration::from_secs(10), RedisStore::open(&RedisConfig::parse(&url).unwrap()))
            .await
            .expect("open answers at once");
    let Err(err) = opened else { panic!("a user without FUNCTION must not open the store") };
    let message = err.to_string();
    assert!(message.contains("refused allot's function library") && message.contains("no permissions"), "{message}");
}
