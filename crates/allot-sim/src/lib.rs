//! allot's deterministic simulator: the real embedded store (run step by step, on a simulated
//! disk), the real server's handlers, and simulated clients, driven through one seeded plan of
//! steps with faults at every one (crashes and power losses at any point, failed writes and
//! syncs, clock jumps, answers lost on the network), every invariant checked after every step.
//! A failing seed is shrunk to the shortest plan that still fails, and printed with its history.
//!
//! The Redis-shaped part runs apart ([`replicated`]): the real Redis store on real `redis-server`
//! processes, a primary and its asynchronous replica, failed over at random, the daemon's and
//! Redis's clocks jumping apart.
//!
//! `cargo test -p allot-sim` runs 1,000 seeds; `allot-sim --seeds N` (or `--minutes M`) runs more;
//! `allot-sim --redis` runs replicated seeds.
//! `crates/allot-sim/tests/it/regressions.rs` keeps every plan that found a bug, as shrunk.

pub mod apps;
pub mod check;
pub mod clock;
pub mod disk;
pub mod plan;
pub mod plugin;
pub mod queue;
pub mod replicated;
pub mod run;
pub mod shrink;
pub mod tenancy;

use std::fmt::Write as _;

pub use plan::Shape;
pub use run::{durability_of, Outcome};

/// A seed whose run broke an invariant, shrunk.
#[derive(Debug)]
pub struct SeedFailure {
    pub seed: u64,
    pub shape: Shape,
    /// The first failure of the seed's whole plan.
    pub failure: run::Failure,
    /// The shortest plan found that still fails, its failure and history.
    pub shrunk: Vec<plan::Step>,
    pub shrunk_outcome: Outcome,
}

impl std::fmt::Display for SeedFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let durability = durability_of(self.seed);
        writeln!(f, "seed {} (durability {durability}) failed {}", self.seed, self.failure)?;
        let shrunk = self.shrunk_outcome.failure.as_ref().map_or_else(|| "?".to_owned(), ToString::to_string);
        writeln!(f, "shrunk to {} steps, failing {shrunk}; its history:", self.shrunk.len())?;
        let mut history = String::new();
        for line in &self.shrunk_outcome.history {
            let _ = writeln!(history, "  {line}");
        }
        write!(f, "{history}replay: allot-sim --seed {} --steps {}", self.seed, self.shape.steps)
    }
}

/// Runs `seed`'s plan; a failure is shrunk before it is returned.
pub fn check_seed(seed: u64, shape: Shape) -> Result<Outcome, Box<SeedFailure>> {
    let steps = plan::draw(seed, shape);
    let outcome = run::run(seed, &steps, shape);
    let Some(failure) = outcome.failure.clone() else { return Ok(outcome) };
    let shrunk = shrink::shrink(&steps, 2_000, |plan| run::run(seed, plan, shape).failure.is_some());
    let shrunk_outcome = run::run(seed, &shrunk, shape);
    Err(Box::new(SeedFailure { seed, shape, failure, shrunk, shrunk_outcome }))
}
