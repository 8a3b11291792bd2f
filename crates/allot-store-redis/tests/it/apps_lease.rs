//! The scheduler's lease on a real `redis-server`: one holder at a time, renewals keep the term,
//! a lapsed lease goes to the next daemon with a higher fencing number, a release hands over at
//! once.

use std::time::Duration;

use allot_store_redis::apps::lease::LeaseState;
use allot_store_redis::testing::RedisServer;
use allot_store_redis::{RedisConfig, RedisStore};

use crate::support::until;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_scheduler_at_a_time_with_a_fencing_number_per_term() {
    let server = RedisServer::start();
    let config = RedisConfig::parse(&server.url()).unwrap();
    let (a, b) = (RedisStore::open(&config).await.unwrap(), RedisStore::open(&config).await.unwrap());
    // Long enough that no pause of a loaded machine lets it lapse unasked.
    let ttl = Duration::from_secs(10);
    let first = a.acquire_sched_lease("daemon-a", ttl).await.unwrap();
    assert!(matches!(first, LeaseState::Mine { fencing: 1, .. }), "{first:?}");
    let refused = b.acquire_sched_lease("daemon-b", ttl).await.unwrap();
    assert!(matches!(&refused, LeaseState::Held { holder, fencing: 1, .. } if holder == "daemon-a"), "{refused:?}");
    // Renewing restarts the lease and keeps the term. (The lease runs on Redis's clock, `TIME`:
    // its passing is seen in what is left.)
    let mut left_before = ttl;
    until("Redis's clock moved on under the lease", async || {
        let LeaseState::Held { left, .. } = b.acquire_sched_lease("daemon-b", ttl).await.unwrap() else {
            panic!("b took a running lease")
        };
        left_before = left;
        left + Duration::from_millis(100) <= ttl
    })
    .await;
    assert!(matches!(a.acquire_sched_lease("daemon-a", ttl).await.unwrap(), LeaseState::Mine { fencing: 1, .. }));
    let renewed = b.acquire_sched_lease("daemon-b", ttl).await.unwrap();
    assert!(
        matches!(renewed, LeaseState::Held { fencing: 1, left, .. } if left > left_before),
        "renewed: {renewed:?}, {left_before:?} left before"
    );
    // A lapsed lease (renewed for 200 ms only) goes to the next daemon, in a new term.
    let short = a.acquire_sched_lease("daemon-a", Duration::from_millis(200)).await.unwrap();
    assert!(matches!(short, LeaseState::Mine { fencing: 1, .. }), "{short:?}");
    let mut taken = None;
    until("a's lease lapsed and b took it", async || {
        let state = b.acquire_sched_lease("daemon-b", ttl).await.unwrap();
        if matches!(state, LeaseState::Mine { .. }) {
            taken = Some(state);
        }
        taken.is_some()
    })
    .await;
    let taken = taken.unwrap();
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
