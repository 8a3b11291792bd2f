//! Leased resource pools over time, on the Redis `pool` function and on `allot_core::pools::Pools`,
//! both at the times a [`TestClock`] sets and under the same lease rules: put (create, resize,
//! start a stopped pool again), remove, accept (with reclaim of lapsed allocs), keepalive, free,
//! stop-if-idle, and the sweep when the clock moves on. Every step compares the answer (the
//! alloc made, its resources and lease, the error), then the whole state: each pool's view and
//! offer, its live allocs, and what inspecting every alloc ever made finds.

use allot_core::pools::{AllocId, AllocRequest, AllocState, LeaseRules, PoolError, PoolName, Pools};
use allot_core::{Millis, Resources};
use allot_store::prelude::*;
use allot_store::{read_all, Store, StoreError};
use allot_store_redis::testing::{RedisServer, TestClock};
use allot_store_redis::RedisStore;

use super::{generator, Rng, Trail};

const SEEDS: u64 = 16;
const STEPS: usize = 150;
/// Short leases, so that allocs lapse, are reclaimed and are forgotten within a sequence.
const RULES: LeaseRules = LeaseRules { initial_ms: 1_000, max_ms: 3_000, reclaim_after_ms: 2_000, retention_ms: 5_000 };

#[derive(Debug, Clone)]
enum Op {
    Put {
        pool: usize,
        capacity: Resources,
    },
    Remove {
        pool: usize,
        force: bool,
    },
    Accept {
        pool: usize,
        request: AllocRequest,
    },
    /// Of the `alloc`-th alloc made in the sequence (or one never made).
    Keepalive {
        pool: usize,
        alloc: usize,
        interval_ms: u64,
    },
    Free {
        pool: usize,
        alloc: usize,
    },
    StopIfIdle {
        pool: usize,
        idle_ms: u64,
    },
    /// The clock moves on by this many ms; both sweep.
    Advance(u64),
}

fn resources(cpu: u64, mem_gib: u64) -> Resources {
    let text = match mem_gib {
        0 => format!("cpu={cpu}"),
        mem => format!("cpu={cpu},mem={mem}GiB"),
    };
    text.parse().unwrap()
}

fn random_op(rng: &mut Rng, pools: usize, allocs: usize) -> Op {
    let pool = rng.below(pools as u64) as usize;
    // Mostly one of the last allocs made; now and then any, or one never made.
    let alloc = match rng.below(4) {
        0 => rng.below(allocs as u64 + 1) as usize,
        _ => allocs.saturating_sub(1 + rng.below(4) as usize),
    };
    match rng.below(40) {
        0..=1 => Op::Put { pool, capacity: resources(2 + rng.below(7), rng.below(9)) },
        2 => Op::Remove { pool, force: rng.below(2) == 0 },
        3..=14 => {
            let min = resources(rng.below(4), rng.below(4));
            let max = (rng.below(3) == 0).then(|| resources(rng.below(6), rng.below(6)));
            Op::Accept {
                pool,
                request: AllocRequest { min, max, owner: format!("o{}", rng.below(3)), ..Default::default() },
            }
        }
        15..=22 => Op::Keepalive { pool, alloc, interval_ms: rng.below(4_000) },
        23..=26 => Op::Free { pool, alloc },
        27..=28 => Op::StopIfIdle { pool, idle_ms: 500 * rng.below(5) },
        _ => Op::Advance(100 + 100 * rng.below(10)),
    }
}

/// One sequence: the store and the core, side by side.
struct Sequence<'a> {
    store: &'a RedisStore,
    clock: &'a mut TestClock,
    core: Pools,
    names: Vec<PoolName>,
    /// Every alloc made in the sequence, in order, with its pool.
    allocs: Vec<(usize, AllocId)>,
    trail: Trail,
}

/// An answer as both sides can give it.
fn core_error<T>(result: Result<T, StoreError>) -> Result<T, PoolError> {
    result.map_err(|err| match err {
        StoreError::Pools(err) => err,
        other => panic!("Redis failed: {other}"),
    })
}

impl Sequence<'_> {
    /// The pool and id of the `alloc`-th alloc of the sequence, or of one never made in `pool`.
    fn alloc(&self, alloc: usize, pool: usize) -> (PoolName, AllocId) {
        let (pool, id) = self.allocs.get(alloc).copied().unwrap_or((pool, AllocId(u64::MAX - alloc as u64)));
        (self.names[pool].clone(), id)
    }

    async fn run(&mut self, op: Op) {
        self.trail.step(&op);
        let now = self.clock.now();
        match op {
            Op::Put { pool, capacity } => {
                let name = &self.names[pool];
                let redis = self.store.put_pool(name.clone(), capacity.clone()).await.unwrap();
                let (created, _) = self.core.put_pool(name, capacity);
                self.trail.agree("the answer", redis, (created, self.core.pool(name, now).unwrap()));
            }
            Op::Remove { pool, force } => {
                let redis = core_error(self.store.remove_pool(self.names[pool].clone(), force).await);
                let core = self.core.remove_pool(&self.names[pool], force, now).map(|(ended, _)| ended);
                self.trail.agree("the answer", redis, core);
            }
            Op::Accept { pool, request } => {
                let name = &self.names[pool];
                let redis = core_error(self.store.accept(name.clone(), request.clone()).await);
                // The core takes the id Redis drew; where Redis refused, one no alloc has.
                let id = redis.as_ref().map_or(AllocId(u64::MAX / 2), |alloc| alloc.id);
                let core = self.core.accept(name, request, id, now).map(|(alloc, _)| alloc);
                if redis.is_ok() {
                    self.allocs.push((pool, id));
                }
                self.trail.agree("the answer", redis, core);
            }
            Op::Keepalive { pool, alloc, interval_ms } => {
                let (name, id) = self.alloc(alloc, pool);
                let redis = core_error(self.store.keepalive_alloc(name.clone(), id, interval_ms).await);
                let core = self.core.keepalive(&name, id, interval_ms, now);
                self.trail.agree("the answer", redis, core.map(|(granted, alloc, _)| (granted, alloc)));
            }
            Op::Free { pool, alloc } => {
                let (name, id) = self.alloc(alloc, pool);
                let redis = core_error(self.store.free_alloc(name.clone(), id).await);
                let core = self.core.free(&name, id, now).map(|(ended, _)| ended);
                self.trail.agree("the answer", redis, core);
            }
            Op::StopIfIdle { pool, idle_ms } => {
                let redis = core_error(self.store.stop_if_idle_for(self.names[pool].clone(), idle_ms).await);
                let core = self.core.stop_if_idle_for(&self.names[pool], idle_ms, now);
                self.trail.agree("the answer", redis, core.map(|(stopped, until_idle, _)| (stopped, until_idle)));
            }
            Op::Advance(ms) => {
                let now = now + ms;
                self.clock.set(self.store, now).await;
                self.core.sweep(now);
            }
        }
        self.compare_state().await;
    }

    /// Each pool's view, offer and live allocs, and every alloc of the sequence as inspected.
    async fn compare_state(&self) {
        let now = self.clock.now();
        for name in &self.names {
            let redis = core_error(self.store.pool(name.clone()).await);
            self.trail.agree(&format!("pool {name}"), redis, self.core.pool(name, now));
            let redis = core_error(self.store.offer(name.clone()).await);
            self.trail.agree(&format!("the offer of {name}"), redis, self.core.offer(name, now));
            let redis = core_error(read_all(|page| self.store.allocs(name.clone(), page)).await);
            self.trail.agree(&format!("the allocs of {name}"), redis, self.core.allocs(name));
        }
        for (pool, id) in &self.allocs {
            let name = &self.names[*pool];
            let redis: Result<AllocState, PoolError> = core_error(self.store.inspect_alloc(name.clone(), *id).await);
            self.trail.agree(&format!("alloc {name}/{id}"), redis, self.core.inspect(name, *id));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_over_time_answer_like_the_core() {
    let server = RedisServer::start();
    let (store, mut clock) = TestClock::open(&server, 5_000_000).await;
    store.set_pool_rules(RULES);
    let mut steps = 0;
    for seed in 1..=SEEDS {
        // Fresh pools per sequence, so sequences do not see each other.
        let names: Vec<PoolName> = (0..2).map(|i| PoolName::new(&format!("over-time-{seed}-{i}")).unwrap()).collect();
        let mut sequence = Sequence {
            store: &store,
            clock: &mut clock,
            core: Pools::new(RULES),
            names: names.clone(),
            allocs: Vec::new(),
            trail: Trail::new(seed),
        };
        for pool in 0..names.len() {
            sequence.run(Op::Put { pool, capacity: resources(4, 4) }).await;
        }
        let mut rng = generator(seed);
        for _ in 0..STEPS {
            let op = random_op(&mut rng, names.len(), sequence.allocs.len());
            sequence.run(op).await;
            steps += 1;
        }
    }
    println!("{steps} steps agreed");
    store.shutdown().await;
}

/// The times a test clock sets are the ones the functions read: an alloc made at a set time
/// carries it, and is reclaimed only once the clock passes its lease and the reclaim delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_functions_read_the_test_clock() {
    let server = RedisServer::start();
    let start: Millis = 7_000_000;
    let (store, mut clock) = TestClock::open(&server, start).await;
    store.set_pool_rules(RULES);
    let pool = PoolName::new("clocked").unwrap();
    store.put_pool(pool.clone(), resources(1, 0)).await.unwrap();
    let request = AllocRequest { min: resources(1, 0), ..Default::default() };
    let alloc = store.accept(pool.clone(), request).await.unwrap();
    assert_eq!((alloc.created, alloc.expires), (start, start + RULES.initial_ms));
    clock.set(&store, start + RULES.initial_ms + RULES.reclaim_after_ms - 1).await;
    assert!(matches!(store.inspect_alloc(pool.clone(), alloc.id).await.unwrap(), AllocState::Live(_)));
    clock.set(&store, start + RULES.initial_ms + RULES.reclaim_after_ms).await;
    let AllocState::Ended(ended) = store.inspect_alloc(pool, alloc.id).await.unwrap() else { panic!("not reclaimed") };
    assert_eq!(ended.ended_at, start + RULES.initial_ms + RULES.reclaim_after_ms);
    store.shutdown().await;
}
