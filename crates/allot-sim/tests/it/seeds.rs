//! The simulator in the normal test suite: 1,000 seeds (ten tests of a hundred, run in parallel),
//! and the same seed run twice giving the same history, byte for byte.

use allot_sim::{check_seed, plan, run, Shape};

/// The suite's runs: 150 steps each (`allot-sim` runs 300 by default).
const SUITE: Shape = Shape { steps: 150, clients: 6, namespaces: 2, quota: 8, tokens: 3, pools: 2, cpus: 8 };

fn seeds(first: u64) {
    for seed in first..first + 100 {
        if let Err(failure) = check_seed(seed, SUITE) {
            panic!("{failure}");
        }
    }
}

macro_rules! hundred {
    ($($name:ident = $first:expr),* $(,)?) => {
        $(#[test] fn $name() { seeds($first) })*
    };
}

hundred!(
    seeds_0 = 0,
    seeds_100 = 100,
    seeds_200 = 200,
    seeds_300 = 300,
    seeds_400 = 400,
    seeds_500 = 500,
    seeds_600 = 600,
    seeds_700 = 700,
    seeds_800 = 800,
    seeds_900 = 900,
);

#[test]
fn a_seed_gives_the_same_history_twice() {
    for seed in [6, 7] {
        let steps = plan::draw(seed, Shape::default());
        let first = run::run(seed, &steps, Shape::default());
        let second = run::run(seed, &steps, Shape::default());
        assert!(first.failure.is_none(), "seed {seed}: {:?}", first.failure);
        assert!(first.history.len() > steps.len(), "seed {seed}: every step and the drain recorded");
        assert!(
            first.history.iter().any(|line| line.contains("\"status\":\"Granted\"")),
            "seed {seed}: something was granted"
        );
        assert_eq!(first.history, second.history, "seed {seed} ran twice");
    }
}
