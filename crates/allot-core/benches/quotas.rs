//! Ledger throughput: one allocate + one release of the same token, on a namespace with a large
//! quota that holds a steady population of grants.
//!
//! Run: `cargo bench -p allot-core --bench quotas -- --warm-up-time 1 --measurement-time 3`

use std::cell::Cell;

use allot_core::{AllocateRequest, Constraints, Decision, LeaseRequest, Ledger, NamespaceName, Scope, Token};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

/// Distinct tokens cycled through; half of them are held at any time.
const TOKENS: usize = 1024;
const QUOTA: u64 = 1_000_000;

fn namespace() -> NamespaceName {
    NamespaceName::new("bench:pool").unwrap()
}

/// The requests to cycle through, built outside the timed loop.
fn requests(scoped: bool, lease: LeaseRequest) -> Vec<AllocateRequest> {
    (0..TOKENS)
        .map(|i| {
            let (scope, constraints) = if scoped {
                // 8 projects, 4 domains each; caps high enough never to refuse.
                let scope = Scope::new(&format!("proj{}", i % 8), &format!("dev{}", (i / 8) % 4)).unwrap();
                (Some(scope), Constraints { project: Some(QUOTA), namespace: Some(QUOTA) })
            } else {
                (None, Constraints::default())
            };
            AllocateRequest {
                namespace: namespace(),
                token: Token::new(&format!("token-{i:04}")).unwrap(),
                units: 1,
                scope,
                constraints,
                lease,
            }
        })
        .collect()
}

fn bench_pairs(c: &mut Criterion) {
    let mut group = c.benchmark_group("allocate_release");
    group.throughput(Throughput::Elements(1));
    let cases = [
        ("no_scope", requests(false, LeaseRequest::None)),
        ("scope_with_caps", requests(true, LeaseRequest::None)),
        ("ttl_lease", requests(false, LeaseRequest::Ttl { ttl_ms: 60_000 })),
    ];
    for (name, requests) in cases {
        let name_space = namespace();
        let mut ledger = Ledger::new();
        ledger.put_namespace(&name_space, QUOTA, 0).unwrap();
        // Keep half of the tokens granted, so the maps and the lease set are not empty: iteration
        // `i` allocates token `i` and releases token `i + TOKENS/2`, granted TOKENS/2 pairs ago.
        for request in &requests[TOKENS / 2..] {
            ledger.allocate(request.clone(), 0, false).unwrap();
        }
        // The request is cloned (its strings allocated) in criterion's untimed setup, and the
        // answers are dropped untimed: the timed routine is the two ledger calls.
        let next = Cell::new(0usize);
        group.bench_function(name, |b| {
            b.iter_batched(
                || {
                    let i = next.get();
                    next.set(i + 1);
                    (i, requests[i % TOKENS].clone())
                },
                |(i, request)| {
                    let now = i as u64;
                    let (decision, _) = ledger.allocate(request, now, false).unwrap();
                    debug_assert!(matches!(decision, Decision::Granted { existing: false, .. }));
                    let old = &requests[(i + TOKENS / 2) % TOKENS].token;
                    let (released, _) = ledger.release(&name_space, old, None, now).unwrap();
                    debug_assert!(released.is_some());
                    (decision, released)
                },
                BatchSize::SmallInput,
            )
        });
        ledger.check_invariants().unwrap();
        assert_eq!(ledger.namespace(&name_space, 0).unwrap().granted_units, (TOKENS / 2) as u64);
    }
    group.finish();
}

criterion_group!(benches, bench_pairs);
criterion_main!(benches);
