//! The Redis functions against the core: random sequences of operations, the same on both, must
//! get the same answers and leave the same state, step by step. The decisions exist twice (Rust
//! in `allot-core`, Lua in `src/lua/`); these tests and the conformance suite keep them equal.
//!
//! - here, quotas without time (put, remove, allocate, release) against the ledger through the
//!   embedded store. Fencing numbers are compared as a property (they increase per namespace),
//!   not as values: the embedded store reserves them in blocks, so after a namespace is removed
//!   and created again its numbers may jump (but never go back);
//! - `quotas`: quotas over time (TTL leases, keepalives, sessions, waiting calls and the order
//!   they are granted in) against `allot_core::Ledger` itself, both at the times a
//!   [`TestClock`](allot_store_redis::testing::TestClock) sets;
//! - `pools`: pools over time (put, accept, keepalive, free, sweep, stop-if-idle) against
//!   `allot_core::pools::Pools`, likewise.

mod pools;
mod quotas;

use allot_store::prelude::*;
use std::collections::HashMap;
use std::time::Duration;

use allot_core::{AllocateRequest, Constraints, LeaseRequest, NamespaceName, Scope, Token};
use allot_store::{read_all, Allocation, EmbeddedConfig, EmbeddedStore, Store, StoreError};
use allot_store_redis::testing::RedisServer;

use crate::support;

type Rng = allot_core::testing::XorShift;

/// The generator of sequence `seed`.
fn generator(seed: u64) -> Rng {
    Rng::new(0x2545_f491_4f6c_dd1d ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// A number below `n`, two times in three.
fn maybe(rng: &mut Rng, n: u64) -> Option<u64> {
    (rng.below(3) > 0).then(|| rng.below(n))
}

/// Who holds a grant: a scope three times in four, with caps two times in three each.
fn holder(rng: &mut Rng) -> (Option<Scope>, Constraints) {
    let scope = (rng.below(4) > 0).then(|| {
        Scope::new(["p1", "p2", "p10"][rng.below(3) as usize], ["dev", "prod"][rng.below(2) as usize]).unwrap()
    });
    let constraints = match scope {
        Some(_) => Constraints { project: maybe(rng, 7), namespace: maybe(rng, 5) },
        None => Constraints::default(),
    };
    (scope, constraints)
}

/// The steps of one random sequence so far: where the backends disagree, the test fails with
/// the seed and every step that led there.
struct Trail {
    seed: u64,
    steps: Vec<String>,
}

impl Trail {
    fn new(seed: u64) -> Trail {
        Trail { seed, steps: Vec::new() }
    }

    fn step(&mut self, step: impl std::fmt::Debug) {
        self.steps.push(format!("{step:?}"));
    }

    /// Fails unless Redis answered `redis` where the core answered `core`.
    #[track_caller]
    fn agree<T: PartialEq + std::fmt::Debug>(&self, what: &str, redis: T, core: T) {
        if redis != core {
            self.fail(&format!("{what} differs\n redis: {redis:?}\n  core: {core:?}"));
        }
    }

    /// Fails the test, saying `why`, the seed and the steps.
    #[track_caller]
    fn fail(&self, why: &str) -> ! {
        let steps: Vec<String> = self.steps.iter().enumerate().map(|(i, s)| format!("{:4} {s}", i + 1)).collect();
        panic!("seed {}, step {}: {why}\nsteps:\n{}", self.seed, self.steps.len(), steps.join("\n"));
    }
}

#[derive(Debug, Clone)]
enum Op {
    Put(usize, u64),
    Remove(usize, bool),
    Allocate(usize, AllocateRequest),
    Release(usize, Token),
}

fn random_op(rng: &mut Rng, names: &[NamespaceName]) -> Op {
    let ns = rng.below(names.len() as u64) as usize;
    match rng.below(20) {
        0 => Op::Put(ns, rng.below(9)),
        1 => Op::Remove(ns, rng.below(2) == 0),
        2..=10 => {
            let (scope, constraints) = holder(rng);
            Op::Allocate(
                ns,
                AllocateRequest {
                    namespace: names[ns].clone(),
                    token: Token::new(&format!("t{}", rng.below(12))).unwrap(),
                    units: 1 + rng.below(4),
                    scope,
                    constraints,
                    lease: LeaseRequest::None,
                },
            )
        }
        _ => Op::Release(ns, Token::new(&format!("t{}", rng.below(12))).unwrap()),
    }
}

/// An answer with what may differ between backends (times, fencing values) left out.
fn comparable(result: Result<String, StoreError>) -> String {
    match result {
        Ok(answer) => answer,
        Err(StoreError::Quotas(err)) => format!("error: {err}"),
        Err(other) => panic!("a backend failed: {other}"),
    }
}

async fn apply(store: &dyn Store, op: &Op, names: &[NamespaceName], fencing: &mut HashMap<usize, u64>) -> String {
    let result = match op.clone() {
        Op::Put(ns, quota) => store
            .put_namespace(names[ns].clone(), quota)
            .await
            .map(|(created, v)| format!("created {created}, quota {}, granted {}", v.quota, v.granted_units)),
        Op::Remove(ns, force) => store.remove_namespace(names[ns].clone(), force).await.map(|n| format!("removed {n}")),
        Op::Allocate(ns, request) => store.allocate(request, Duration::ZERO).await.map(|answer| match answer {
            Allocation::Granted { grant, existing } => {
                let last = fencing.entry(ns).or_insert(0);
                if !existing {
                    assert!(grant.grant.fencing > *last, "fencing went from {last} to {}", grant.grant.fencing);
                    *last = grant.grant.fencing;
                }
                format!("granted {} {:?} existing {existing}", grant.grant.units, grant.grant.scope)
            }
            Allocation::Refused { refusal, place } => format!("refused {refusal:?} {place:?}"),
        }),
        Op::Release(ns, token) => store
            .release(names[ns].clone(), token, None)
            .await
            .map(|g| format!("released {:?}", g.map(|g| (g.grant.units, g.grant.scope)))),
    };
    comparable(result)
}

async fn state(store: &dyn Store, names: &[NamespaceName]) -> Vec<String> {
    let mut out = Vec::new();
    for name in names {
        let view = store.namespace(name.clone()).await;
        out.push(match view {
            Ok(v) => format!(
                "{name}: quota {} granted {} grants {} waiters {} stats {:?}",
                v.quota, v.granted_units, v.grants, v.waiters, v.stats
            ),
            Err(err) => comparable(Err(err)),
        });
        if let Ok(grants) = read_all(|page| store.grants(name.clone(), page)).await {
            let grants: Vec<_> = grants.into_iter().map(|g| (g.grant.token, g.grant.units, g.grant.scope)).collect();
            out.push(format!("{grants:?}"));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_functions_answer_like_the_ledger() {
    let server = RedisServer::start();
    let redis = support::open(&server.url()).await;
    let dir = tempfile::tempdir().unwrap();
    let embedded = EmbeddedStore::open(&EmbeddedConfig::new(dir.path().join("data"))).unwrap();
    let mut steps = 0;
    for seed in 1..=12u64 {
        // Fresh namespaces per sequence, so sequences do not see each other.
        let names: Vec<NamespaceName> =
            (0..2).map(|i| NamespaceName::new(&format!("diff:{seed}:{i}")).unwrap()).collect();
        for name in &names {
            redis.put_namespace(name.clone(), 6).await.unwrap();
            embedded.put_namespace(name.clone(), 6).await.unwrap();
        }
        let mut rng = generator(seed);
        let (mut fencing_redis, mut fencing_embedded) = (HashMap::new(), HashMap::new());
        for step in 0..150 {
            let op = random_op(&mut rng, &names);
            let expected = apply(&embedded, &op, &names, &mut fencing_embedded).await;
            let got = apply(&redis, &op, &names, &mut fencing_redis).await;
            assert_eq!(got, expected, "seed {seed}, step {step}: {op:?}");
            let (expected, got) = (state(&embedded, &names).await, state(&redis, &names).await);
            assert_eq!(got, expected, "seed {seed}, step {step}, after {op:?}");
            steps += 1;
        }
    }
    println!("{steps} steps agreed");
    redis.shutdown().await;
    embedded.shutdown().await;
}
