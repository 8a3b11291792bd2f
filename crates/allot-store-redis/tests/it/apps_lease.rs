//! The scheduler's lease on a real `redis-server`: one holder at a time, renewals keep the term,
//! a lapsed lease goes to the next daemon with a higher fencing number, a release hands over at
//! once.

use std::time::Duration;

use allot_store_redis::apps::lease::LeaseState;
use allot_store_redis::testing::RedisServer;
use allot_store_redis::{RedisConfig, RedisStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_scheduler_at_a_time_with_a_fencing_number_per_term() {
    let server = RedisServer::start();
    let config = RedisConfig::parse(&server.url()).unwrap();
    let (a, b) = (RedisStore::open(&config).await.unwrap(), RedisStore::open(&config).await.unwrap());
    let ttl = Duration::from_millis(400);
    let first = a.acquire_sched_lease("daemon-a", ttl).await.unwrap();
    assert!(matches!(first, LeaseState::Mine { fencing: 1, .. }), "{first:?}");
    let refused = b.acquire_sched_lease("daemon-b", ttl).await.unwrap();
    assert!(matches!(&refused, LeaseState::Held { holder, fencing: 1, .. } if holder == "daemon-a"), "{refused:?}");
    // Renewing keeps the term.
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(matches!(a.acquire_sched_lease("daemon-a", ttl).await.unwrap(), LeaseState::Mine { fencing: 1, .. }));
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(matches!(b.acquire_sched_lease("daemon-b", ttl).await.unwrap(), LeaseState::Held { .. }), "renewed");
    // A lapsed lease goes to the next daemon, in a new term.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let taken = b.acquire_sched_lease("daemon-b", ttl).await.unwrap();
    assert!(matches!(taken, LeaseState::Mine { fencing: 2, .. }), "{taken:?}");
    let deposed = a.acquire_sched_lease("daemon-a", ttl).await.unwrap();
    assert!(matches!(&deposed, LeaseState::Held { holder, fencing: 2, .. } if holder == "daemon-b"), "{deposed:?}");
    // A release hands over at once, and the next term has the next number.
    a.release_sched_lease("daemon-a").await.unwrap();
    assert!(matches!(a.acquire_sched_lease("daemon-a", ttl).await.unwrap(), LeaseState::Held { .. }), "not a's to end");
    b.release_sched_lease("daemon-b").await.unwrap();
    let next = a.acquire_sched_lease("daemon-a", ttl).await.unwrap();
    assert!(matches!(next, LeaseState::Mine { fencing: 3, .. }), "{next:?}");
}
