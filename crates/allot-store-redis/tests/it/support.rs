//! What several tests use: a store opened on a server's address, a plain allocate request, an
//! application in a queue of its own, and a wait for a condition that other tasks make true.

use allot_core::apps::queues::{QueueLimits, QueuePath};
use allot_core::apps::{AppId, AppSpec, SchedulingPolicy};
use allot_core::{AllocateRequest, Constraints, LeaseRequest, NamespaceName, Token};
use allot_store::AppStore;
use allot_store_redis::{RedisConfig, RedisStore};

/// A store on the Redis (or cluster) at `address`.
pub(crate) async fn open(address: &str) -> RedisStore {
    RedisStore::open(&RedisConfig::parse(address).unwrap()).await.unwrap()
}

/// One unit of `namespace` under `token`: no scope, no cap, no lease.
pub(crate) fn request(namespace: &str, token: &str) -> AllocateRequest {
    AllocateRequest {
        namespace: NamespaceName::new(namespace).unwrap(),
        token: Token::new(token).unwrap(),
        units: 1,
        scope: None,
        constraints: Constraints::default(),
        lease: LeaseRequest::None,
    }
}

/// Waits until a condition holds; fails, naming what was awaited, after a minute.
pub(crate) use allot_host::wait::until;

/// Adds application `app` (no task groups, the default policy) in queue `queue`, made first.
pub(crate) async fn add_app(store: &RedisStore, queue: &str, app: &AppId) {
    let queue = QueuePath::new(queue).unwrap();
    store.put_queue(queue.clone(), QueueLimits::default()).await.unwrap();
    let spec = AppSpec {
        id: app.clone(),
        queue,
        user: "u".into(),
        user_groups: Vec::new(),
        tags: Default::default(),
        groups: Vec::new(),
        policy: SchedulingPolicy::default(),
        queue_rule: None,
        priority: Default::default(),
    };
    store.add_app(spec).await.unwrap();
}
