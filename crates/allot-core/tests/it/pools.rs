//! The pool ledger with an injected clock: offers, accepts, leases, reclaim, idle stop, restore.

use allot_core::pools::{
    AllocId, AllocRequest, AllocState, EndReason, LeaseRules, Offer, PoolChange, PoolError, PoolName, PoolSettings,
    PoolView, Pools, MAX_ENDED_PER_POOL,
};
use allot_core::Resources;

fn pool() -> PoolName {
    PoolName::new("worker-1").unwrap()
}

fn res(text: &str) -> Resources {
    text.parse().unwrap()
}

fn want(min: &str) -> AllocRequest {
    AllocRequest { min: res(min), owner: "test".into(), ..AllocRequest::default() }
}

fn between(min: &str, max: &str) -> AllocRequest {
    AllocRequest { max: Some(res(max)), ..want(min) }
}

const RULES: LeaseRules =
    LeaseRules { initial_ms: 120_000, max_ms: 300_000, reclaim_after_ms: 60_000, retention_ms: 600_000 };

fn pools(capacity: &str) -> Pools {
    let mut pools = Pools::new(RULES);
    pools.put_pool(&pool(), res(capacity));
    pools
}

fn available(pools: &Pools, now: u64) -> Option<Resources> {
    pools.offer(&pool(), now).unwrap().map(|Offer { available, .. }| available)
}

#[test]
fn one_offer_holds_everything_free_and_none_when_full() {
    let mut pools = pools("cpu=4,mem=16GiB");
    assert_eq!(available(&pools, 0), Some(res("cpu=4,mem=16GiB")));
    pools.accept(&pool(), want("cpu=1,mem=4GiB"), AllocId(1), 0).unwrap();
    assert_eq!(available(&pools, 0), Some(res("cpu=3,mem=12GiB")));
    pools.accept(&pool(), want("cpu=3,mem=12GiB"), AllocId(2), 0).unwrap();
    assert_eq!(available(&pools, 0), None);
    pools.check_invariants().unwrap();
}

#[test]
fn an_accept_takes_up_to_max_and_at_least_min() {
    let mut pools = pools("cpu=4,mem=16GiB");
    let (alloc, _) = pools.accept(&pool(), between("cpu=1,mem=1GiB", "cpu=8,mem=2GiB"), AllocId(1), 0).unwrap();
    assert_eq!(alloc.resources, res("cpu=4,mem=2GiB"), "max capped by what is free");
    let (alloc, _) = pools.accept(&pool(), want("mem=1GiB"), AllocId(2), 0).unwrap();
    assert_eq!(alloc.resources, res("mem=1GiB"), "exactly min without max");
    assert_eq!(pools.accept(&pool(), want(""), AllocId(3), 0), Err(PoolError::EmptyRequest));
    let taken = pools.accept(&pool(), want("mem=1"), AllocId(1), 0);
    assert!(matches!(taken, Err(PoolError::AllocIdTaken { .. })), "{taken:?}");
    // More than the whole capacity can never fit: a distinct error, not an expired offer.
    let never = pools.accept(&pool(), want("cpu=5"), AllocId(5), 0);
    assert!(matches!(never, Err(PoolError::ExceedsCapacity { .. })), "{never:?}");
}

#[test]
fn a_max_below_min_or_silent_on_a_resource_takes_min_there() {
    let mut pools = pools("cpu=4,mem=16GiB");
    let (alloc, _) = pools.accept(&pool(), between("cpu=1,mem=1GiB", "cpu=2"), AllocId(1), 0).unwrap();
    assert_eq!(alloc.resources, res("cpu=2,mem=1GiB"));
    let (alloc, _) = pools.accept(&pool(), between("cpu=1", "cpu=0.5"), AllocId(2), 0).unwrap();
    assert_eq!(alloc.resources, res("cpu=1"));
    pools.check_invariants().unwrap();
}

#[test]
fn an_offer_whose_room_is_gone_is_a_distinct_error_and_changes_nothing() {
    let mut pools = pools("cpu=2");
    pools.accept(&pool(), want("cpu=1"), AllocId(1), 0).unwrap();
    let late = pools.accept(&pool(), want("cpu=2"), AllocId(2), 0);
    assert!(matches!(late, Err(PoolError::OfferExpired { .. })), "{late:?}");
    assert_eq!(pools.allocs(&pool()).unwrap().len(), 1);
    assert_eq!(pools.pool(&pool(), 0).unwrap().stats.offer_expired, 1);
}

#[test]
fn lapsed_allocs_are_offered_and_reclaimed_most_expired_first_only_as_needed() {
    let mut pools = pools("cpu=3");
    for (id, at) in [(1, 0), (2, 10_000), (3, 20_000)] {
        pools.accept(&pool(), want("cpu=1"), AllocId(id), at).unwrap();
    }
    // All three leases (2 minutes) have lapsed at 200 s; their room is offered.
    let now = 200_000;
    assert_eq!(available(&pools, now), Some(res("cpu=3")));
    let (_, changes) = pools.accept(&pool(), want("cpu=2"), AllocId(4), now).unwrap();
    let reclaimed: Vec<AllocId> = changes
        .iter()
        .filter_map(|c| match c {
            PoolChange::AllocEnded(e) if e.reason == EndReason::Reclaimed => Some(e.alloc.id),
            _ => None,
        })
        .collect();
    assert_eq!(reclaimed, vec![AllocId(1), AllocId(2)], "the two most expired, no more");
    assert!(matches!(pools.inspect(&pool(), AllocId(3)).unwrap(), AllocState::Live(_)));
    match pools.inspect(&pool(), AllocId(1)).unwrap() {
        AllocState::Ended(ended) => assert_eq!((ended.reason, ended.ended_at), (EndReason::Reclaimed, now)),
        live => panic!("{live:?}"),
    }
    pools.check_invariants().unwrap();
}

#[test]
fn keepalive_grants_at_most_the_cap_and_revives_a_lapsed_alloc() {
    let mut pools = pools("cpu=1");
    let (alloc, _) = pools.accept(&pool(), want("cpu=1"), AllocId(1), 0).unwrap();
    assert_eq!(alloc.expires, 120_000, "Reflow's initial lease");
    let (granted, alloc, _) = pools.keepalive(&pool(), AllocId(1), 3_600_000, 1_000).unwrap();
    assert_eq!((granted, alloc.expires, alloc.last_keepalive), (300_000, 301_000, Some(1_000)));
    let (granted, _, _) = pools.keepalive(&pool(), AllocId(1), 1, 2_000).unwrap();
    assert_eq!(granted, 1, "no lower bound but zero");
    assert!(matches!(pools.keepalive(&pool(), AllocId(1), 0, 2_000), Err(PoolError::OutOfRange { .. })));
    // Lapsed but not reclaimed: a keepalive brings it back.
    let (_, alloc, _) = pools.keepalive(&pool(), AllocId(1), 60_000, 30_000).unwrap();
    assert_eq!(alloc.expires, 90_000);
    assert_eq!(available(&pools, 30_000), None);
}

#[test]
fn an_ended_alloc_says_why_and_cannot_be_kept_alive() {
    let mut pools = pools("cpu=1");
    pools.accept(&pool(), want("cpu=1"), AllocId(1), 0).unwrap();
    let (ended, changes) = pools.free(&pool(), AllocId(1), 5).unwrap();
    assert_eq!(ended.reason, EndReason::Freed);
    assert_eq!(changes.len(), 1);
    let (again, changes) = pools.free(&pool(), AllocId(1), 6).unwrap();
    assert_eq!((again, changes.len()), (ended, 0), "freeing twice is harmless");
    let gone = pools.keepalive(&pool(), AllocId(1), 1000, 7);
    assert!(matches!(gone, Err(PoolError::AllocEnded { reason: EndReason::Freed, .. })), "{gone:?}");
    assert!(matches!(pools.free(&pool(), AllocId(9), 7), Err(PoolError::AllocNotFound { .. })));
    // Readable until its retention ends, then gone.
    pools.sweep(5 + RULES.retention_ms - 1);
    assert!(matches!(pools.inspect(&pool(), AllocId(1)), Ok(AllocState::Ended(_))));
    pools.sweep(5 + RULES.retention_ms);
    assert!(matches!(pools.inspect(&pool(), AllocId(1)), Err(PoolError::AllocNotFound { .. })));
}

#[test]
fn a_pool_keeps_a_bounded_number_of_ended_allocs() {
    let mut pools = pools("cpu=1");
    for id in 0..(MAX_ENDED_PER_POOL as u64 + 10) {
        pools.accept(&pool(), want("cpu=1"), AllocId(id), id).unwrap();
        pools.free(&pool(), AllocId(id), id).unwrap();
    }
    assert!(matches!(pools.inspect(&pool(), AllocId(9)), Err(PoolError::AllocNotFound { .. })), "the oldest went");
    assert!(matches!(pools.inspect(&pool(), AllocId(10)), Ok(AllocState::Ended(_))));
    pools.check_invariants().unwrap();
}

#[test]
fn the_sweeper_reclaims_once_a_lease_has_lapsed_long_enough() {
    let mut pools = pools("cpu=1");
    pools.accept(&pool(), want("cpu=1"), AllocId(1), 0).unwrap();
    let lapse = RULES.initial_ms + RULES.reclaim_after_ms;
    assert_eq!(pools.next_deadline(), Some(lapse));
    assert!(pools.sweep(lapse - 1).is_empty());
    assert!(matches!(pools.inspect(&pool(), AllocId(1)), Ok(AllocState::Live(_))));
    let changes = pools.sweep(lapse);
    assert!(matches!(&changes[..], [PoolChange::AllocEnded(e)] if e.reason == EndReason::Reclaimed));
    assert_eq!(pools.pool(&pool(), lapse).unwrap().stats.reclaimed, 1);
}

#[test]
fn an_idle_pool_stops_and_otherwise_says_when_it_would_be_idle() {
    let mut pools = pools("cpu=2");
    // Reflow's cases: an empty pool stops...
    let (stopped, _, _) = pools.stop_if_idle_for(&pool(), 1_000, 0).unwrap();
    assert!(stopped);
    assert_eq!(available(&pools, 0), None);
    assert!(matches!(pools.accept(&pool(), want("cpu=1"), AllocId(1), 0), Err(PoolError::PoolStopped(_))));
    // ...and is started again by putting it.
    pools.put_pool(&pool(), res("cpu=2"));
    pools.accept(&pool(), want("cpu=1"), AllocId(1), 0).unwrap();
    pools.keepalive(&pool(), AllocId(1), 100, 0).unwrap();
    // The lease ends at 100 ms; idle 1 s after that.
    let (stopped, until_idle, _) = pools.stop_if_idle_for(&pool(), 1_000, 50).unwrap();
    assert_eq!((stopped, until_idle), (false, 1_050));
    pools.accept(&pool(), want("cpu=1"), AllocId(2), 50).unwrap();
    pools.keepalive(&pool(), AllocId(2), 60_000, 50).unwrap();
    let (_, until_idle, _) = pools.stop_if_idle_for(&pool(), 1_000, 50).unwrap();
    assert_eq!(until_idle, 61_000, "the last lease counts");
    let (stopped, _, changes) = pools.stop_if_idle_for(&pool(), 1_000, 61_050).unwrap();
    assert!(stopped);
    let ended = changes.iter().filter(|c| matches!(c, PoolChange::AllocEnded(e) if e.reason == EndReason::PoolStopped));
    assert_eq!(ended.count(), 2);
}

#[test]
fn restored_allocs_keep_the_lease_time_they_had_left() {
    let mut pools = pools("cpu=2");
    pools.accept(&pool(), want("cpu=1"), AllocId(7), 1_000).unwrap();
    let (_, alloc, _) = pools.keepalive(&pool(), AllocId(7), 90_000, 10_000).unwrap();
    let restored = Pools::restore(
        RULES,
        vec![(pool(), PoolSettings { capacity: res("cpu=2"), ..Default::default() })],
        pools.allocs(&pool()).unwrap(),
        Vec::new(),
    )
    .unwrap();
    match restored.inspect(&pool(), AllocId(7)).unwrap() {
        AllocState::Live(back) => assert_eq!(back, alloc),
        ended => panic!("{ended:?}"),
    }
    assert_eq!(restored.offer(&pool(), 50_000).unwrap().unwrap().available, res("cpu=1"));
    restored.check_invariants().unwrap();
}

#[test]
fn removing_a_pool_with_allocs_needs_force() {
    let mut pools = pools("cpu=2");
    pools.accept(&pool(), want("cpu=1"), AllocId(1), 0).unwrap();
    assert!(matches!(pools.remove_pool(&pool(), false, 0), Err(PoolError::PoolInUse { allocs: 1, .. })));
    let (ended, changes) = pools.remove_pool(&pool(), true, 7).unwrap();
    assert_eq!(ended, 1);
    assert!(
        matches!(&changes[..], [PoolChange::AllocEnded(e), PoolChange::PoolRemoved { .. }] if e.reason == EndReason::PoolRemoved && e.ended_at == 7),
        "its alloc ends with it, then the pool goes: {changes:?}"
    );
    assert!(matches!(pools.offer(&pool(), 0), Err(PoolError::PoolNotFound(_))));
    pools.check_invariants().unwrap();
}

/// Random accepts, keepalives, frees, sweeps and idle stops over three pools: no pool is ever
/// over-allocated and the indexes stay consistent.
#[test]
fn random_operations_never_over_allocate() {
    for seed in 1..=20u64 {
        let mut rng = allot_core::testing::XorShift::new(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let names: Vec<PoolName> = (0..3).map(|i| PoolName::new(&format!("p{i}")).unwrap()).collect();
        let mut pools =
            Pools::new(LeaseRules { initial_ms: 1_000, max_ms: 5_000, reclaim_after_ms: 500, retention_ms: 2_000 });
        for name in &names {
            pools.put_pool(name, res("cpu=4,mem=8GiB,gpu=1"));
        }
        let mut now = 0;
        let mut next_id = 0;
        for step in 0..400 {
            now += rng.below(300);
            let name = &names[rng.below(3) as usize];
            let id = AllocId(rng.below(next_id + 1));
            match rng.below(6) {
                0 | 1 => {
                    next_id += 1;
                    let min = format!("cpu={},mem={}GiB", 1 + rng.below(3), rng.below(5));
                    let request = if rng.below(2) == 0 { want(&min) } else { between(&min, "cpu=4,mem=8GiB,gpu=1") };
                    let _ = pools.accept(name, request, AllocId(next_id), now);
                }
                2 => {
                    let _ = pools.keepalive(name, id, 1 + rng.below(3_000), now);
                }
                3 => {
                    let _ = pools.free(name, id, now);
                }
                4 => {
                    pools.sweep(now);
                }
                _ => {
                    if rng.below(10) == 0 {
                        let _ = pools.stop_if_idle_for(name, 200, now);
                        pools.put_pool(name, res("cpu=4,mem=8GiB,gpu=1"));
                    }
                }
            }
            if let Err(err) = pools.check_invariants() {
                panic!("seed {seed}, step {step}: {err}");
            }
        }
    }
}

#[test]
fn a_cordoned_pool_offers_nothing_and_takes_no_alloc_until_uncordoned() {
    use allot_core::pools::CordonOrder;
    let mut pools = pools("cpu=4");
    pools.accept(&pool(), want("cpu=1"), AllocId(1), 0).unwrap();
    let (view, changes) = pools.cordon(&pool(), CordonOrder::Cordon, 10).unwrap();
    assert_eq!(view.cordon.map(|c| (c.since, c.drain_at)), Some((10, None)));
    assert!(matches!(&changes[..], [PoolChange::Pool { settings, .. }] if settings.cordon.is_some()));
    assert_eq!(available(&pools, 20), None);
    assert_eq!(pools.accept(&pool(), want("cpu=1"), AllocId(2), 20), Err(PoolError::PoolCordoned(pool())));
    // What is there runs on: a keepalive renews, a free frees.
    pools.keepalive(&pool(), AllocId(1), 1000, 20).unwrap();
    assert_eq!(pools.spots(20).count(), 0, "the scheduler sees no room there");
    // A drain keeps the first cordon's time, and a second drain never puts the first one off.
    let (view, _) = pools.cordon(&pool(), CordonOrder::Drain { grace_ms: 100 }, 30).unwrap();
    assert_eq!(view.cordon.map(|c| (c.since, c.drain_at)), Some((10, Some(130))));
    let (view, _) = pools.cordon(&pool(), CordonOrder::Drain { grace_ms: 1000 }, 40).unwrap();
    assert_eq!(view.cordon.and_then(|c| c.drain_at), Some(130));
    assert_eq!(pools.next_drain(40), Some(130));
    assert!(pools.strained(129).is_empty());
    assert!(matches!(&pools.strained(130)[..], [s] if s.drained && s.pool == pool()));
    pools.cordon(&pool(), CordonOrder::Uncordon, 140).unwrap();
    assert!(pools.strained(140).is_empty());
    assert_eq!(available(&pools, 140), Some(res("cpu=3")));
    pools.check_invariants().unwrap();
}

#[test]
fn what_is_occupied_is_never_offered_and_a_pool_that_shrank_says_by_how_much() {
    let mut pools = pools("cpu=4,mem=8");
    pools.occupy(&pool(), res("cpu=1"), 0).unwrap();
    assert_eq!(available(&pools, 0), Some(res("cpu=3,mem=8")));
    let refused = pools.accept(&pool(), want("cpu=4"), AllocId(1), 0);
    assert!(matches!(refused, Err(PoolError::OfferExpired { .. })), "{refused:?}");
    pools.accept(&pool(), want("cpu=3,mem=2"), AllocId(1), 0).unwrap();
    assert!(pools.strained(0).is_empty());
    // More occupied: the allocs hold more than may be held, by cpu=1.
    pools.occupy(&pool(), res("cpu=2"), 0).unwrap();
    assert!(matches!(&pools.strained(0)[..], [s] if !s.drained && s.over == res("cpu=1")));
    // A lower capacity adds to it; nothing is revoked by the pools (the scheduler preempts).
    pools.put_pool(&pool(), res("cpu=3,mem=8"));
    assert!(matches!(&pools.strained(0)[..], [s] if s.over == res("cpu=2")));
    // A lapsed lease is not counted: it would be reclaimed.
    assert!(pools.strained(RULES.initial_ms).is_empty());
    pools.check_invariants().unwrap();
    // Restored from its record, a pool keeps what is occupied and its cordon.
    pools.cordon(&pool(), allot_core::pools::CordonOrder::Cordon, 5).unwrap();
    let view = pools.pool(&pool(), 5).unwrap();
    let settings = PoolSettings {
        capacity: view.capacity.clone(),
        occupied: view.occupied.clone(),
        stopped: false,
        labels: Default::default(),
        cordon: view.cordon,
    };
    let restored = Pools::restore(RULES, vec![(pool(), settings)], pools.allocs(&pool()).unwrap(), Vec::new()).unwrap();
    // (Its counters count since the daemon started.)
    assert_eq!(restored.pool(&pool(), 5).unwrap(), PoolView { stats: Default::default(), ..view });
    restored.check_invariants().unwrap();
}

proptest::proptest! {
    /// An alloc's id is shown as sixteen lowercase hexadecimal digits and read back the same.
    #[test]
    fn an_alloc_id_is_shown_in_sixteen_hex_digits_and_read_back(id in proptest::prelude::any::<u64>()) {
        let shown = AllocId(id).to_string();
        proptest::prop_assert_eq!(&shown, &format!("{id:016x}"));
        proptest::prop_assert_eq!(AllocId::parse(&shown).unwrap(), AllocId(id));
    }
}
