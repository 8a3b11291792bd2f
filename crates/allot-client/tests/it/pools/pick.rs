//! Reflow's pick order (`pickN`) and the whole-offer rule, as pure functions.

use allot_client::pools::{amount_to_take, pick_n, PoolOffer, Resources, SizeWeights};

use super::*;

/// Reflow's `small = {mem:10, cpu:1, disk:20}` (mem and disk in bytes) scaled by `factor`.
fn small(factor: f64) -> Resources {
    let scaled = |milli: u64| (milli as f64 * factor).round() as u64;
    Resources::new()
        .with_milli("mem", scaled(10_000))
        .with_milli("cpu", scaled(1000))
        .with_milli("disk", scaled(20_000))
}

fn medium(factor: f64) -> Resources {
    small(2.0 * factor)
}

fn large(factor: f64) -> Resources {
    small(4.0 * factor)
}

fn offers_of(resources: &[Resources]) -> Vec<PoolOffer> {
    resources.iter().enumerate().map(|(i, r)| PoolOffer::new(format!("p{i}"), "1", r.clone())).collect()
}

/// Reflow's `TestPickN`, all eight cases. `SizeWeights::default()` reproduces Reflow's
/// `ScaledDistance` here: every offer is a multiple of `small`, whose 10 bytes of mem (over 8 GiB)
/// and 20 bytes of disk (over 256 GiB) add a negligible amount, in proportion to the cpu; so the
/// order is the cpu distance's, as in Reflow.
#[test]
fn pick_n_orders_offers_like_reflow() {
    let weights = SizeWeights::default();
    // A table of cases: its type says what each column is, once.
    #[allow(clippy::type_complexity)]
    let cases: Vec<(Resources, Resources, Vec<Resources>, Vec<(usize, Vec<Resources>)>)> = vec![
        (large(1.0), large(1.2), vec![medium(1.0), medium(1.2)], vec![(2, vec![])]),
        (
            medium(0.9),
            medium(1.2),
            vec![large(1.0), medium(1.0), small(1.0)],
            vec![(2, vec![large(1.0), medium(1.0)]), (1, vec![large(1.0)])],
        ),
        (
            large(0.9),
            large(1.2),
            vec![large(1.0), small(1.0), medium(1.0), small(1.0), large(1.1)],
            vec![(2, vec![large(1.1), large(1.0)]), (4, vec![large(1.1), large(1.0)])],
        ),
        (
            medium(0.9),
            medium(1.2),
            vec![small(1.5), medium(1.1), large(1.0), small(1.0), large(1.0), medium(1.0)],
            vec![(2, vec![large(1.0), large(1.0)]), (4, vec![large(1.0), large(1.0), medium(1.1), medium(1.0)])],
        ),
        (
            medium(1.2),
            large(1.2),
            vec![large(1.0), medium(1.0), small(1.0), medium(1.1), large(1.1)],
            vec![(1, vec![large(1.1)]), (3, vec![large(1.1), large(1.0)])],
        ),
        (
            medium(1.0),
            large(1.0),
            vec![medium(1.1), medium(1.2), medium(1.3), large(1.0), large(1.1)],
            vec![(1, vec![large(1.0)]), (2, vec![large(1.0), large(1.1)])],
        ),
        (
            medium(0.9),
            large(1.0),
            vec![medium(1.0), medium(1.0), medium(1.0), medium(1.0), large(1.1)],
            vec![(2, vec![large(1.1), medium(1.0)]), (4, vec![large(1.1), medium(1.0), medium(1.0), medium(1.0)])],
        ),
        (
            medium(0.9),
            large(1.0),
            vec![
                small(1.0),
                small(1.5),
                small(1.7),
                medium(1.0),
                medium(1.0),
                medium(1.3),
                medium(1.8),
                large(1.1),
                large(1.5),
                large(1.8),
            ],
            vec![
                (2, vec![large(1.1), large(1.5)]),
                (4, vec![large(1.1), large(1.5), large(1.8), medium(1.8)]),
                (50, vec![large(1.1), large(1.5), large(1.8), medium(1.8), medium(1.3), medium(1.0), medium(1.0)]),
            ],
        ),
    ];
    for (i, (min, max, offers, want_by_n)) in cases.into_iter().enumerate() {
        let offers = offers_of(&offers);
        for (n, want) in want_by_n {
            let got: Vec<Resources> =
                pick_n(&offers, n, &min, &max, &weights).into_iter().map(|o| o.available.clone()).collect();
            assert_eq!(got, want, "case {i}, n {n}");
        }
    }
}

/// Unlike Reflow's `ScaledDistance` (cpu and mem only), the distance counts gpu and disk: a
/// cpu-only request goes to the cpu machine before the gpu machine, and to the offer with the
/// disk closest to what it asks.
#[test]
fn pick_n_counts_gpu_and_disk() {
    let weights = SizeWeights::default();
    let offers = offers_of(&[r("cpu=8,mem=32GiB,gpu=4"), r("cpu=8,mem=32GiB")]);
    let got: Vec<&str> =
        pick_n(&offers, 10, &r("cpu=2"), &r("cpu=4"), &weights).into_iter().map(|o| o.pool.as_str()).collect();
    assert_eq!(got, ["p1", "p0"], "the gpu machine last for a cpu-only request");
    let got: Vec<&str> = pick_n(&offers, 10, &r("cpu=2,gpu=1"), &r("cpu=4,gpu=1"), &weights)
        .into_iter()
        .map(|o| o.pool.as_str())
        .collect();
    assert_eq!(got, ["p0"], "only the gpu machine fits a gpu request");

    let offers = offers_of(&[r("cpu=4,disk=4TiB"), r("cpu=4,disk=200GiB"), r("cpu=4,disk=1TiB")]);
    let got: Vec<&str> = pick_n(&offers, 10, &r("cpu=1,disk=100GiB"), &r("cpu=4,disk=100GiB"), &weights)
        .into_iter()
        .map(|o| o.pool.as_str())
        .collect();
    assert_eq!(got, ["p1", "p2", "p0"], "the closest disk first");

    // The weights are configurable: a cpu-heavy offer against a disk-heavy one.
    let offers = offers_of(&[r("cpu=4,disk=1TiB"), r("cpu=16,disk=150GiB")]);
    let (min, max) = (r("cpu=1,disk=100GiB"), r("cpu=4,disk=100GiB"));
    let order = |weights: &SizeWeights| -> Vec<String> {
        pick_n(&offers, 10, &min, &max, weights).into_iter().map(|o| o.pool.clone()).collect()
    };
    assert_eq!(order(&SizeWeights::default()), ["p0", "p1"], "12 spare cpu weigh more than 924 GiB of disk");
    let disk_heavy = SizeWeights::default().with("disk", 16.0 * (1u64 << 30) as f64);
    assert_eq!(order(&disk_heavy), ["p1", "p0"], "with 16 GiB of disk = 1 cpu, the disk waste weighs more");
}

#[test]
fn whole_offer_is_taken_when_the_leftover_would_be_useless() {
    let cases = [
        // (available, min, max, taken)
        ("cpu=4,mem=8GiB", "cpu=2,mem=4GiB", "cpu=4,mem=7GiB", "cpu=4,mem=8GiB"), // no cpu left
        ("cpu=8,mem=4GiB", "cpu=1,mem=4GiB", "cpu=1,mem=4GiB", "cpu=8,mem=4GiB"), // no mem left
        (
            "cpu=8,mem=32GiB,disk=100GB",
            "cpu=1,mem=1GiB,disk=100GB",
            "cpu=1,mem=1GiB,disk=100GB",
            "cpu=8,mem=32GiB,disk=100GB",
        ),
        ("cpu=8,mem=32GiB", "cpu=2,mem=4GiB", "cpu=2,mem=4GiB", "cpu=2,mem=4GiB"), // useful leftover
        ("cpu=8,mem=32GiB", "cpu=2,mem=4GiB", "cpu=16,mem=4GiB", "cpu=8,mem=32GiB"), // max capped: no cpu left
        // An offer without disk: disk is not counted.
        ("cpu=8,mem=32GiB", "cpu=1,mem=1GiB,disk=0", "cpu=1,mem=1GiB", "cpu=1,mem=1GiB"),
        // Only cpu, mem and disk make a leftover useless; no gpu left is fine.
        ("cpu=8,mem=32GiB,gpu=1", "cpu=1,mem=1GiB,gpu=1", "cpu=1,mem=1GiB,gpu=1", "cpu=1,gpu=1,mem=1GiB"),
    ];
    for (available, min, max, taken) in cases {
        assert_eq!(amount_to_take(&r(available), &r(min), &r(max)), r(taken), "{available} {min} {max}");
    }
}
