//! Reflow's pick order (`pickN`) and the whole-offer rule, as pure functions; the cases shared
//! with the Python client are in `testdata/offer_picks.json`.

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

/// The distance's weights are configurable: a cpu-heavy offer against a disk-heavy one. (The
/// default weights' cases, and the whole-offer rule's, are in the shared table below.)
#[test]
fn pick_n_weighs_resources_as_told() {
    let offers = offers_of(&[r("cpu=4,disk=1TiB"), r("cpu=16,disk=150GiB")]);
    let (min, max) = (r("cpu=1,disk=100GiB"), r("cpu=4,disk=100GiB"));
    let order = |weights: &SizeWeights| -> Vec<String> {
        pick_n(&offers, 10, &min, &max, weights).into_iter().map(|o| o.pool.clone()).collect()
    };
    assert_eq!(order(&SizeWeights::default()), ["p0", "p1"], "12 spare cpu weigh more than 924 GiB of disk");
    let disk_heavy = SizeWeights::default().with("disk", 16.0 * (1u64 << 30) as f64);
    assert_eq!(order(&disk_heavy), ["p1", "p0"], "with 16 GiB of disk = 1 cpu, the disk waste weighs more");
}

/// The shared table of the pick rule, `testdata/offer_picks.json`: the Python client's `alloc()`
/// is tested against the same cases, this crate's functions being the reference.
pub(super) fn offer_picks() -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/offer_picks.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn pick_n_and_amount_to_take_follow_the_shared_table() {
    let table = offer_picks();
    let cases = table["cases"].as_array().unwrap();
    assert!(cases.len() > 10, "the table has its cases");
    let text = |value: &serde_json::Value| value.as_str().unwrap().to_owned();
    for case in cases {
        let why = text(&case["why"]);
        let min = r(&text(&case["min"]));
        let max = case.get("max").map_or_else(|| min.clone(), |max| r(&text(max)));
        let offers: Vec<PoolOffer> = case["offers"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, available)| PoolOffer::new(i.to_string(), "1", r(&text(available))))
            .collect();
        let picks = pick_n(&offers, offers.len(), &min, &max, &SizeWeights::default());
        let got: Vec<u64> = picks.iter().map(|offer| offer.pool.parse().unwrap()).collect();
        let want: Vec<u64> = case["picks"].as_array().unwrap().iter().map(|i| i.as_u64().unwrap()).collect();
        assert_eq!(got, want, "{why}");
        let takes: Vec<Resources> = picks.iter().map(|offer| amount_to_take(&offer.available, &min, &max)).collect();
        let want: Vec<Resources> = case["takes"].as_array().unwrap().iter().map(|t| r(&text(t))).collect();
        assert_eq!(takes, want, "{why}");
    }
}
