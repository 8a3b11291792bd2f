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
