//! The simulator in the normal test suite: 1,000 seeds (ten tests of a hundred, run in parallel),
//! and the same seed run twice giving the same history, byte for byte.

use allot_sim::{check_seed, plan, run, Shape};

/// The suite's runs: 150 steps each (`allot-sim` runs 300 by default), of the default shape.
fn suite() -> Shape {
    Shape { steps: 150, ..Shape::default() }
}

fn seeds(first: u64) {
    for seed in first..first + 100 {
        if let Err(failure) = check_seed(seed, suite()) {
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

/// The same across processes too: each process hashes with keys of its own (std's and
/// foldhash's), so a history that followed a hash table's order would differ here.
#[test]
fn a_seed_gives_the_same_history_in_two_processes() {
    // Seeds whose executor runs tasks through rounds, waits for seats and lives through crashes.
    for seed in ["7", "28", "342"] {
        let replay = || {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_allot-sim"))
                .args(["--seed", seed, "--steps", "150"])
                .output()
                .expect("allot-sim runs");
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            out.stdout
        };
        let first = replay();
        assert!(String::from_utf8_lossy(&first).contains("every invariant held"));
        assert_eq!(first, replay(), "seed {seed} replayed in two processes");
    }
}

/// `--seeds` and `--minutes` together stop at whichever comes first; a time that is not a
/// positive number of minutes is refused.
#[test]
fn a_count_of_seeds_bounds_a_timed_run() {
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_allot-sim")).args(args).output().expect("allot-sim runs")
    };
    let out = run(&["--seeds", "3", "--minutes", "600", "--steps", "20", "--jobs", "1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("3 seeds from 0"), "{said}");
    for minutes in ["0", "-1", "soon"] {
        let out = run(&[&format!("--minutes={minutes}")]);
        assert_eq!(out.status.code(), Some(2), "--minutes {minutes}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("positive number of minutes"), "--minutes {minutes}");
    }
}

/// Preemption runs in the simulation: a seed where a task of a higher priority takes a lower
/// one's place, through the same checks (the victim seen being preempted, or preempted before).
#[test]
fn a_seed_preempts() {
    let seed = 18;
    let steps = plan::draw(seed, Shape::default());
    let outcome = run::run(seed, &steps, Shape::default());
    assert!(outcome.failure.is_none(), "seed {seed}: {:?}", outcome.failure);
    let preempted = |line: &&String| line.contains("\"preempting\":{") || line.contains("\"preemptions\":1");
    assert!(outcome.history.iter().any(|line| preempted(&line)), "seed {seed}: nothing was preempted");
}
