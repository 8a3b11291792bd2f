//! An ended alloc stays readable, and says why it ended, for its retention: also for a daemon
//! that opens the store afterwards (a restart), as the README promises.

use allot_core::pools::{AllocRequest, AllocState, EndReason, PoolName};
use allot_store::PoolStore;
use allot_store_redis::testing::RedisServer;
use allot_store_redis::{RedisConfig, RedisStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_alloc_is_readable_from_a_daemon_that_opens_the_store_afterwards() {
    let server = RedisServer::start();
    let config = RedisConfig::parse(&server.url()).unwrap();
    let pool = PoolName::new("worker-1").unwrap();
    let first = RedisStore::open(&config).await.unwrap();
    first.put_pool(pool.clone(), "cpu=4".parse().unwrap()).await.unwrap();
    let request = AllocRequest { min: "cpu=1".parse().unwrap(), owner: "me".into(), ..AllocRequest::default() };
    let freed = first.accept(pool.clone(), request).await.unwrap();
    first.free_alloc(pool.clone(), freed.id).await.unwrap();
    drop(first);
    let restarted = RedisStore::open(&config).await.unwrap();
    match restarted.inspect_alloc(pool, freed.id).await.unwrap() {
        AllocState::Ended(ended) => assert_eq!((ended.alloc.id, ended.reason), (freed.id, EndReason::Freed)),
        live => panic!("{live:?}"),
    }
}
