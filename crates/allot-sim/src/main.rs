//! `allot-sim`: runs the simulator over many seeds, or replays one.

use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Parser;

use allot_sim::{check_seed, Shape};

/// Runs seeded simulations of allot (the real store and handlers, faults at every step) and
/// checks every invariant after every step; a failing seed is shrunk and printed with its history.
#[derive(Debug, Parser)]
#[command(name = "allot-sim", version)]
struct Args {
    /// Replays this one seed, printing its history.
    #[arg(long, conflicts_with_all = ["seeds", "minutes"])]
    seed: Option<u64>,
    /// Runs this many seeds, from `--first`.
    #[arg(long, default_value_t = 1_000)]
    seeds: u64,
    /// Runs seeds for this many minutes instead of a count.
    #[arg(long)]
    minutes: Option<f64>,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    first: u64,
    /// Steps per seed.
    #[arg(long, default_value_t = Shape::default().steps)]
    steps: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // A panic is a failing run, reported with its seed and shrunk history: not printed as it
    // happens (shrinking runs a failing plan hundreds of times).
    std::panic::set_hook(Box::new(|_| {}));
    let shape = Shape { steps: args.steps, ..Shape::default() };
    if let Some(seed) = args.seed {
        return match check_seed(seed, shape) {
            Ok(outcome) => {
                outcome.history.iter().for_each(|line| println!("{line}"));
                println!("seed {seed}: every invariant held");
                Ok(())
            }
            Err(failure) => bail!("{failure}"),
        };
    }
    let started = Instant::now();
    let until = args.minutes.map(|m| started + Duration::from_secs_f64(m * 60.0));
    let mut ran = 0u64;
    let mut seed = args.first;
    loop {
        let done = match until {
            Some(until) => Instant::now() >= until,
            None => ran >= args.seeds,
        };
        if done {
            break;
        }
        if let Err(failure) = check_seed(seed, shape) {
            bail!("{failure}\n({ran} seeds passed before it)");
        }
        ran += 1;
        seed += 1;
    }
    println!(
        "{ran} seeds ({} to {}) of {} steps: every invariant held, in {:.1} s",
        args.first,
        seed.saturating_sub(1),
        shape.steps,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
