//! `allot-sim`: runs the simulator over many seeds, or replays one.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Parser;

use allot_sim::{check_seed, replicated, Shape};

/// mimalloc, as the daemon runs on: glibc's allocator returned the simulated disk's large buffers
/// to the kernel and faulted them in again on every store opened (a fifth of a seed's time).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Runs seeded simulations of allot (the real store and handlers, faults at every step) and
/// checks every invariant after every step; a failing seed is shrunk and printed with its history.
/// Seeds run when neither a count nor a time is given.
const DEFAULT_SEEDS: u64 = 1_000;

/// `--minutes`: a positive number of minutes.
fn minutes(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(minutes) if minutes.is_finite() && minutes > 0.0 => Ok(minutes),
        _ => Err(format!("`{text}` is not a positive number of minutes")),
    }
}

#[derive(Debug, Parser)]
#[command(name = "allot-sim", version)]
struct Args {
    /// Replays this one seed, printing its history.
    #[arg(long, conflicts_with_all = ["seeds", "minutes"])]
    seed: Option<u64>,
    /// Runs this many seeds, from `--first` (1,000 when neither this nor `--minutes` is given).
    #[arg(long)]
    seeds: Option<u64>,
    /// Runs seeds for this many minutes (with `--seeds`, stops at whichever comes first).
    #[arg(long, value_parser = minutes)]
    minutes: Option<f64>,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    first: u64,
    /// Steps per seed.
    #[arg(long, default_value_t = Shape::default().steps)]
    steps: usize,
    /// Seeds run at once, each on a thread of its own (default: one per CPU).
    #[arg(long)]
    jobs: Option<usize>,
    /// With `--seed`: the daemon's log (its `tracing` lines, at this level) on stderr.
    #[arg(long, requires = "seed")]
    log: Option<tracing_subscriber::filter::LevelFilter>,
    /// Runs the Redis-shaped part instead: the Redis store on a real primary and replica
    /// (`redis-server` on the PATH), the link cut and the primary failed over at random.
    #[arg(long)]
    redis: bool,
}

/// Runs `seed`: its history, or its failure (shrunk) said in full.
fn check(args: &Args, seed: u64) -> Result<Vec<String>, String> {
    if args.redis {
        let steps = args.steps.min(REDIS_STEPS);
        replicated::check_seed(seed, steps).map(|outcome| outcome.history).map_err(|failure| failure.to_string())
    } else {
        let shape = Shape { steps: args.steps, ..Shape::default() };
        check_seed(seed, shape).map(|outcome| outcome.history).map_err(|failure| failure.to_string())
    }
}

/// The most steps of a replicated run (each Redis call is a real one).
const REDIS_STEPS: usize = 120;

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // A panic is a failing run, reported with its seed and shrunk history: not printed as it
    // happens (shrinking runs a failing plan hundreds of times).
    std::panic::set_hook(Box::new(|_| {}));
    if let Some(level) = args.log {
        tracing_subscriber::fmt().with_max_level(level).with_writer(std::io::stderr).without_time().init();
    }
    if let Some(seed) = args.seed {
        return match check(&args, seed) {
            Ok(history) => {
                history.iter().for_each(|line| println!("{line}"));
                println!("seed {seed}: every invariant held");
                Ok(())
            }
            Err(failure) => bail!("{failure}"),
        };
    }
    let started = Instant::now();
    let until = args.minutes.map(|m| started + Duration::from_secs_f64(m * 60.0));
    let seeds = match (args.seeds, until) {
        (Some(seeds), _) => seeds,
        (None, Some(_)) => u64::MAX - args.first,
        (None, None) => DEFAULT_SEEDS,
    };
    let end = args.first.saturating_add(seeds);
    let jobs = args.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1);
    let next = AtomicU64::new(args.first);
    let (ran, stop) = (AtomicU64::new(0), AtomicBool::new(false));
    let failures: Mutex<Vec<(u64, String)>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) && until.is_none_or(|until| Instant::now() < until) {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= end {
                        break;
                    }
                    match check(&args, seed) {
                        Ok(_) => {
                            ran.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(failure) => {
                            stop.store(true, Ordering::Relaxed);
                            failures.lock().unwrap_or_else(|p| p.into_inner()).push((seed, failure));
                        }
                    }
                }
            });
        }
    });
    let ran = ran.into_inner();
    let mut failures = failures.into_inner().unwrap_or_else(|p| p.into_inner());
    failures.sort();
    if let Some((_, failure)) = failures.first() {
        bail!("{failure}\n({ran} seeds passed)");
    }
    let (what, steps) =
        if args.redis { ("replicated seeds", args.steps.min(REDIS_STEPS)) } else { ("seeds", args.steps) };
    println!(
        "{ran} {what} from {} of {steps} steps, {jobs} at a time: every invariant held, in {:.1} s",
        args.first,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
