//! allot's load generator: the commands of `allot bench` and `allot baseline-server`, the server
//! it measures the daemon against. The `allot` binary parses them with the [`BenchArgs`] and
//! [`BaselineArgs`] given here and calls [`run`] and [`baseline_server`]; the daemons it measures
//! are that binary started again (`std::env::current_exe()`, `allot serve`).
//!
//! The main load is closed-loop allocate+release pairs: N clients, each with one keep-alive
//! HTTP/1.1 connection, each doing `PUT .../grants/{token}` then `DELETE .../grants/{token}` with a
//! fresh token, as fast as the answers come. The commands:
//!
//! - `allot bench pairs --server URL`: that load against a running daemon.
//! - `allot bench compare`: starts the baseline server, a fresh daemon (durability on) and, when it
//!   is installed, Throttle, and runs the same load against each in turn (each daemon with a watcher
//!   of another namespace attached); prints a table with every
//!   target's pairs/s as a ratio of the baseline's, measured in the same run. On a small machine the
//!   load generator and the server share the cores, so only such ratios compare across machines.
//! - `allot bench wake`: how long after a release the next waiter gets its grant.
//! - `allot bench watch`: the change feed: the delay from an allocate's answer to its event, pairs
//!   with watchers attached against none, and the memory of idle watchers.
//! - `allot bench pools`: accept+free pairs over 1,000 pools against token pairs, one daemon.
//! - `allot bench redis`: pairs on one Redis, three ways (allot's script called directly, Flyte's
//!   command sequence, allot through a daemon), with 900 of 1,000 tokens held and caps on.
//! - `allot bench sched`: the scheduler's cycles in process, YuniKorn's `BenchmarkScheduling`
//!   (10,000 tasks over 500 and 1,000 pools); with `--preemption`, a tenth of them placed by
//!   preemption against the same run without.
//! - `allot bench apps`: one application's 5,000 tasks added over HTTP to a fresh daemon, until
//!   every one is Allocated.
//! - `allot bench gangs`: 100 gangs of 10 through a fresh daemon with room for 5 at a time, each
//!   task run for a fixed time; all or nothing checked at every poll.
//!
//! Modules:
//! - `baseline`: the baseline server;
//! - `http`: one client connection and URL parsing;
//! - `load`: the pair load generator and its measurements; `closed`: the closed loop of `pools`
//!   and `redis`; `latency`: latency samples and their percentiles;
//! - `compare`: the comparison run; `children`: servers started as child processes;
//! - `cpu`: the machine's busy, idle and steal time; `report`: latency summaries, tables, checks;
//! - `wake`, `watch`, `pools`, `redis`: the wake-latency, change feed, pools and Redis measurements;
//! - `sched`, `apps`, `gangs`: the scheduler's benchmarks;
//! - [`duration`]: durations on the command line (`500ms`, `30s`), for every command of the
//!   binary.

mod apps;
mod backlog;
mod baseline;
mod children;
mod churn;
mod closed;
mod compare;
mod cpu;
pub mod duration;
mod gangs;
mod http;
mod latency;
mod leases;
mod load;
mod own_work;
mod placement;
mod pools;
mod redis;
mod report;
mod sched;
mod waiters;
mod wake;
mod watch;

use std::time::Duration;

use anyhow::{bail, Context};

pub use baseline::{baseline_server, BaselineArgs};
pub use own_work::ApiOver;

/// `allot bench --help` after the options.
pub const BENCH_AFTER_HELP: &str = "\
Publish numbers from the fat-LTO build: `cargo build --profile dist -p allot`, then
`target/dist/allot bench ...` (docs/benchmarks.md).

Exit codes:
  0  measured (and every target met, with --check)
  1  error, or a target missed with --check
  2  usage error";

/// Options of `allot bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Debug, clap::Subcommand)]
enum BenchCommand {
    /// Allocate+release pairs against a running daemon.
    #[command(after_help = BENCH_AFTER_HELP)]
    Pairs(PairsArgs),
    /// The same pairs against the baseline server, a fresh daemon and Throttle, one after another.
    #[command(after_help = BENCH_AFTER_HELP)]
    Compare(CompareArgs),
    /// allot's own work per allocate+release pair, in this process without sockets: the whole
    /// API, and the store alone (the part `compare` cannot tell from the HTTP stack).
    #[command(after_help = BENCH_AFTER_HELP)]
    OwnWork(OwnWorkArgs),
    /// How long after a release the next waiter gets its grant.
    #[command(after_help = BENCH_AFTER_HELP)]
    Wake(WakeArgs),
    /// The change feed: the delay to a watcher, pairs with watchers attached, idle watchers' memory.
    #[command(after_help = BENCH_AFTER_HELP)]
    Watch(WatchArgs),
    /// Pairs on one Redis: allot's script called directly, Flyte's command sequence, and allot
    /// through a daemon, with 900 of 1,000 tokens held and caps on.
    #[command(after_help = BENCH_AFTER_HELP)]
    Redis(RedisBenchArgs),
    /// Accept+free pairs over many pools against token pairs, through one fresh daemon.
    #[command(after_help = BENCH_AFTER_HELP)]
    Pools(PoolsBenchArgs),
    /// The scheduler's cycles in process: YuniKorn's BenchmarkScheduling (10,000 tasks over 500
    /// and 1,000 pools), placements/s.
    #[command(after_help = BENCH_AFTER_HELP)]
    Sched(SchedBenchArgs),
    /// One application's tasks added over HTTP to a fresh daemon, until every one is Allocated.
    #[command(after_help = BENCH_AFTER_HELP)]
    Apps(AppsBenchArgs),
    /// A million live TTL grants on one daemon: memory and disk per grant, kill -9 to serving, a
    /// tenth expiring at once.
    #[command(after_help = BENCH_AFTER_HELP)]
    Leases(LeasesBenchArgs),
    /// Gangs of tasks competing for room through a fresh daemon, each task run for a fixed time;
    /// checks all or nothing at every poll.
    #[command(after_help = BENCH_AFTER_HELP)]
    Gangs(GangsBenchArgs),
    /// Many applications waiting at once: a scheduling cycle with 100,000 tasks pending (in
    /// process), and a daemon with 10,000 applications of 100 tasks killed and started again.
    #[command(after_help = BENCH_AFTER_HELP)]
    Backlog(BacklogBenchArgs),
    /// Growth is bounded: tokens, allocs and applications churned at full speed with short
    /// retentions, the store's size on disk and what it holds sampled as it goes.
    #[command(after_help = BENCH_AFTER_HELP)]
    Churn(ChurnBenchArgs),
    /// Many long-poll waiters on one daemon over HTTP/2: memory per waiter, and the quota handed
    /// along the queue, in order.
    #[command(after_help = BENCH_AFTER_HELP)]
    Waiters(WaitersBenchArgs),
}

/// Options shared by every command: how to show progress and results.
#[derive(Debug, Clone, clap::Args)]
struct OutputOpts {
    /// Print the results as JSON on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Show no progress bar (it is never shown when stdout or stderr is not a terminal).
    #[arg(long)]
    no_progress: bool,
}

/// The measurement window of `pools` and `redis`: each kind of load runs `warmup`, then is
/// measured for `duration`.
#[derive(Debug, Clone, clap::Args)]
struct WindowOpts {
    /// How long to measure each kind of load at each number of clients.
    #[arg(long, default_value = "5s", value_parser = crate::duration::parse)]
    duration: Duration,
    /// Run the load this long before measuring.
    #[arg(long, default_value = "1s", value_parser = crate::duration::parse)]
    warmup: Duration,
}

impl WindowOpts {
    /// The load of `clients` clients over this window.
    fn spec(&self, clients: usize, output: &OutputOpts) -> load::LoadSpec {
        load::LoadSpec {
            clients,
            warmup: self.warmup,
            duration: self.duration,
            timeout: Duration::from_secs(10),
            progress: load::show_progress(output),
        }
    }
}

/// Options of the pair load shared by `pairs` and `compare`.
#[derive(Debug, Clone, clap::Args)]
struct LoadOpts {
    /// Run the load this long before measuring (e.g. 1s, 500ms).
    #[arg(long, default_value = "1s", value_parser = crate::duration::parse)]
    warmup: Duration,
    /// A request that takes longer than this is abandoned and counted as an error.
    #[arg(long, default_value = "10s", value_parser = crate::duration::parse)]
    timeout: Duration,
    /// The namespace the pairs use; it is created (or its quota changed) first.
    #[arg(long, default_value = "bench")]
    namespace: String,
    /// The quota the namespace is given (at least the number of clients).
    #[arg(long, default_value_t = 1_000_000)]
    quota: u64,
}

#[derive(Debug, clap::Args)]
struct PairsArgs {
    /// The daemon's URL.
    #[arg(long, env = "ALLOT_SERVER", default_value = "http://127.0.0.1:7070")]
    server: String,
    /// How many clients, each with its own connection.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// How long to measure (e.g. 10s, 500ms, 1m).
    #[arg(long, default_value = "10s", value_parser = crate::duration::parse)]
    duration: Duration,
    /// Do not create the namespace first (it must exist with room for every client).
    #[arg(long)]
    no_setup: bool,
    /// An API token sent with every request (a daemon with `[auth]`).
    #[arg(long, env = "ALLOT_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// A CA certificate (PEM) to trust for an https:// daemon.
    #[arg(long, value_name = "FILE")]
    ca_cert: Option<std::path::PathBuf>,
    #[command(flatten)]
    load: LoadOpts,
    #[command(flatten)]
    output: OutputOpts,
}

#[derive(Debug, clap::Args)]
struct CompareArgs {
    /// The numbers of clients to measure with, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "16,64,256")]
    clients: Vec<usize>,
    /// How long to measure each target at each number of clients, per round.
    #[arg(long, default_value = "5s", value_parser = crate::duration::parse)]
    duration: Duration,
    /// How many rounds (every target at every number of clients, in turn); the table shows
    /// the medians.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// The etcd server binary (`apt-get install etcd-server`); by default `etcd` on PATH.
    #[arg(long, conflicts_with = "no_etcd")]
    etcd: Option<std::path::PathBuf>,
    /// Do not run etcd.
    #[arg(long)]
    no_etcd: bool,
    /// The Throttle server binary (`cargo install throttle-server`); by default `throttle` on PATH
    /// or in ~/.cargo/bin.
    #[arg(long, conflicts_with = "no_throttle")]
    throttle: Option<std::path::PathBuf>,
    /// Do not run Throttle.
    #[arg(long)]
    no_throttle: bool,
    /// Exit with an error when the daemon misses a target (pairs/s ratios, CPU per pair, p99
    /// latency).
    #[arg(long)]
    check: bool,
    /// Where to make the scratch directory (the daemon's data directory, configs, logs); e.g.
    /// /dev/shm takes the disk out of the measurement. Default: the system's temporary directory.
    #[arg(long)]
    tmp_dir: Option<std::path::PathBuf>,
    /// Also measure the daemon at the process level with access configured (`[auth]`) and an
    /// API token on every request (`allot-process-auth`, no audit trail), against the same level
    /// without; and with the audit trail written to a file (`allot-process-auth-audit`).
    #[arg(long)]
    auth: bool,
    /// With `--auth`: also measure it over HTTPS (`allot-process-auth-tls`, a certificate of a
    /// CA made for the run).
    #[arg(long, requires = "auth")]
    tls: bool,
    /// Run the servers on the first half of the CPUs this process may use and the load generator
    /// on the other half, as `taskset` would (each server then sizes its threads for its half).
    /// Without it the kernel places them, and where it puts the threads moves the results from
    /// run to run when the clients share the machine. Needs at least 2 CPUs.
    #[arg(long)]
    pin: bool,
    #[command(flatten)]
    load: LoadOpts,
    #[command(flatten)]
    output: OutputOpts,
}

#[derive(Debug, clap::Args)]
struct WakeArgs {
    /// The daemon's URL; without it a fresh daemon is started (durability on) and stopped after.
    #[arg(long, env = "ALLOT_SERVER")]
    server: Option<String>,
    /// Release through this daemon instead (one that shares the first daemon's Redis): the wake
    /// then crosses daemons.
    #[arg(long, requires = "server")]
    release_server: Option<String>,
    /// How many wake-ups to measure.
    #[arg(long, default_value_t = 200)]
    samples: usize,
    /// Wake-ups run before measuring.
    #[arg(long, default_value_t = 10)]
    warmup_samples: usize,
    /// The namespace (quota 1) the measurement uses; by default a new one per run, removed after.
    #[arg(long)]
    namespace: Option<String>,
    /// Exit with an error when the p99 wake latency is over the target.
    #[arg(long)]
    check: bool,
    /// Where to make the scratch directory of a started daemon (see `compare --tmp-dir`).
    #[arg(long)]
    tmp_dir: Option<std::path::PathBuf>,
    #[command(flatten)]
    output: OutputOpts,
}

#[derive(Debug, clap::Args)]
struct WatchArgs {
    /// How many allocates to measure the delay to a watcher of.
    #[arg(long, default_value_t = 500)]
    samples: usize,
    /// How many watchers to attach while pairs run.
    #[arg(long, default_value_t = 100)]
    watchers: usize,
    /// How many idle watchers to open to measure their memory (0: none).
    #[arg(long, default_value_t = 10_000)]
    idle: usize,
    /// How many clients run pairs.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// How long each run of pairs is measured.
    #[arg(long, default_value = "4s", value_parser = crate::duration::parse)]
    duration: Duration,
    /// Runs of pairs without and with watchers, alternating.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// How many allocates to measure the delay of through a second daemon: two daemons on a
    /// Redis server the bench starts, the allocate made through one, the watcher on the other
    /// (0: not measured).
    #[arg(long, default_value_t = 500)]
    redis_samples: usize,
    /// Exit with an error when a check fails.
    #[arg(long)]
    check: bool,
    /// Where to make the daemon's scratch directory (see `compare --tmp-dir`).
    #[arg(long)]
    tmp_dir: Option<std::path::PathBuf>,
    /// Run the daemon on the first half of the CPUs this process may use and the load generator
    /// (its clients and watchers) on the other half, as `compare --pin` does: the daemon's cost
    /// of a watcher is then measured apart from the watchers' own reading. Needs at least 2 CPUs
    #[arg(long)]
    pin: bool,
    #[command(flatten)]
    output: OutputOpts,
}

#[derive(Debug, clap::Args)]
struct PoolsBenchArgs {
    /// How many pools.
    #[arg(long, default_value_t = 1000)]
    pools: usize,
    /// How many clients, each with its own connection.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Pools (of cpu=2) for the allocate helper under contention.
    #[arg(long, default_value_t = 20)]
    contention_pools: usize,
    /// Clients of the allocate helper under contention (more than the pools' 2 slots each).
    #[arg(long, default_value_t = 64)]
    contention_clients: usize,
    #[command(flatten)]
    window: WindowOpts,
    /// Exit with an error when a target is missed.
    #[arg(long)]
    check: bool,
    /// Where to make the daemon's scratch directory (see `compare --tmp-dir`).
    #[arg(long)]
    tmp_dir: Option<std::path::PathBuf>,
    #[command(flatten)]
    output: OutputOpts,
}

#[derive(Debug, clap::Args)]
struct RedisBenchArgs {
    /// The Redis to measure on (e.g. redis://127.0.0.1:6379); by default a `redis-server` from
    /// PATH is started on a free port and stopped after.
    #[arg(long)]
    redis: Option<String>,
    /// The numbers of clients to measure with, comma-separated (at most 100).
    #[arg(long, value_delimiter = ',', default_value = "16,64")]
    clients: Vec<usize>,
    /// The pool's quota.
    #[arg(long, default_value_t = 1000)]
    quota: u64,
    /// Tokens held before measuring.
    #[arg(long, default_value_t = 900)]
    held: u64,
    /// Worker threads of the daemon under test (`allot serve --threads`); by default the
    /// daemon's own default.
    #[arg(long, value_name = "N")]
    daemon_threads: Option<u16>,
    /// Rounds per number of clients. A round measures the three targets back to back; the
    /// results are medians over rounds, so a burst of noise on a shared machine spoils one
    /// round of all three, not one target.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=100))]
    rounds: u16,
    #[command(flatten)]
    window: WindowOpts,
    /// Exit with an error when allot misses a target (vs the direct script, vs Flyte).
    #[arg(long)]
    check: bool,
    #[command(flatten)]
    output: OutputOpts,
}

#[derive(Debug, Clone, clap::Args)]
struct SchedBenchArgs {
    /// The numbers of pools to place on, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "500,1000")]
    pools: Vec<usize>,
    /// How many tasks (of cpu=1,mem=10), half in each of the two applications.
    #[arg(long, default_value_t = 10_000)]
    tasks: usize,
    /// Each pool's capacity; by default room for tasks / pools + 1 tasks, as YuniKorn sizes its
    /// nodes (cpu=21,mem=210 for 500 pools). The targets are checked only with the default.
    #[arg(long)]
    capacity: Option<String>,
    /// Rounds; each places every task once per number of pools. The report gives medians.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..=1000))]
    rounds: u16,
    /// Also, in each round and at each number of pools, a run where a tenth of the tasks are
    /// placed by preempting others, then the same run with room for them all: the report gives
    /// the ratio of the rates and the cost of a preemption decision. These runs size their pools
    /// themselves (`--capacity` is for the first run only).
    #[arg(long)]
    preemption: bool,
    /// Exit with an error when a target is missed.
    #[arg(long)]
    check: bool,
    #[command(flatten)]
    output: OutputOpts,
}

#[derive(Debug, Clone, clap::Args)]
struct AppsBenchArgs {
    /// How many tasks the application gets (of cpu=1,mem=10).
    #[arg(long, default_value_t = 5000)]
    tasks: usize,
    /// How many pools; each holds tasks / pools + 1 tasks.
    #[arg(long, default_value_t = 500)]
    pools: usize,
    /// How many adds in flight at once, each on its own connection.
    #[arg(long, default_value_t = 32)]
    in_flight: usize,
    /// How often to read the application's task counts.
    #[arg(long, default_value = "5ms", value_parser = crate::duration::parse)]
    poll: Duration,
    /// Rounds, each on a fresh daemon. The report gives medians.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=100))]
    rounds: u16,
    /// Exit with an error when a target is missed.
    #[arg(long)]
    check: bool,
    /// Where to make the daemon's scratch directory (see `compare --tmp-dir`).
    #[arg(long)]
    tmp_dir: Option<std::path::PathBuf>,
    /// Run the daemon on a Redis store (a `redis-server` started for each round) instead of the
    /// embedded one. The target is the embedded store's.
    #[arg(long)]
    redis: bool,
    /// The daemon also runs the tasks (`noop`, with its executor on every pool): the clock stops
    /// when every task is Completed, not Allocated. The target is then 10,000 tasks/s.
    #[arg(long)]
    run: bool,
    /// Submit the application with all its tasks in one call (as `allot run` does), instead of
    /// adding them one by one with `--in-flight` clients.
    #[arg(long)]
    one_call: bool,
    /// Two daemons on one Redis, each running its own pools (implies `--redis --run`): each
    /// round runs an application on the scheduling daemon's pools and one on the other daemon's
    /// (whose executor learns of its tasks from the change feed), and reports the ratio of the
    /// rates. The target is 0.8.
    #[arg(long)]
    across: bool,
    #[command(flatten)]
    output: OutputOpts,
}

#[derive(Debug, Clone, clap::Args)]
struct LeasesBenchArgs {
    /// How many grants, each with its own TTL lease.
    #[arg(long, default_value_t = 1_000_000)]
    grants: usize,
    /// How many namespaces they are spread over.
    #[arg(long, default_value_t = 1000)]
    namespaces: usize,
    /// How many connections allocate them (and run pairs while a tenth expires).
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// The daemon's durability level (`disk`, the default, or `process`).
    #[arg(long, default_value = "disk")]
    durability: String,
    /// On a Redis store (a `redis-server` started for the run, append-only file on) instead of
    /// the embedded one: Redis's memory and file per grant are reported, and the restart is the
    /// daemon's alone.
    #[arg(long)]
    redis: bool,
    /// Exit with an error when a target is missed.
    #[arg(long)]
    check: bool,
    /// Where to make the daemon's scratch directory (see `compare --tmp-dir`).
    #[arg(long)]
    tmp_dir: Option<std::path::PathBuf>,
    /// Keep the scratch directory (the daemons' logs, their data, and a copy of the data as the
    /// kill left it) and say where it is: to look into the restart afterwards.
    #[arg(long)]
    keep: bool,
    #[command(flatten)]
    output: OutputOpts,
}

#[derive(Debug, Clone, clap::Args)]
struct BacklogBenchArgs {
    /// Tasks pending in the in-process cycles.
    #[arg(long, default_value_t = 100_000)]
    pending: usize,
    /// Applications the daemon holds when it is killed (0: no daemon run).
    #[arg(long, default_value_t = 10_000)]
    apps: usize,
    /// Tasks in each application (in process and in the daemon).
    #[arg(long, default_value_t = 100)]
    tasks_per_app: usize,
    /// Tasks the daemon's pools have room for; the rest stay pending.
    #[arg(long, default_value_t = 1_000)]
    room: usize,
    /// Keep the daemon's data directory (its path is printed), to start a daemon on it again.
    #[arg(long)]
    keep: bool,
    /// Submissions in flight at once, each on its own connection.
    #[arg(long, default_value_t = 8)]
    in_flight: usize,
    /// Exit with an error when a target is missed.
    #[arg(long)]
    check: bool,
    /// Where to make the daemon's scratch directory (see `compare --tmp-dir`).
    #[arg(long)]
    tmp_dir: Option<std::path::PathBuf>,
    #[command(flatten)]
    output: OutputOpts,
}

#[derive(Debug, Clone, clap::Args)]
struct ChurnBenchArgs {
    /// How long the churn lasts.
    #[arg(long, default_value = "10m", value_parser = crate::duration::parse)]
    duration: Duration,
    /// Every retention of the daemon (ended applications and allocs, events, kept outputs).
    #[arg(long, default_value = "1m", value_parser = crate::duration::parse)]
    retention: Duration,
    /// How often the store is sampled.
    #[arg(long, default_value = "30s", value_parser = crate::duration::parse)]
    sample: Duration,
    /// Connections allocating tokens, and as many accepting allocs.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// On a Redis store (a `redis-server` started for the run) instead of the embedded one:
    /// Redis's `used_memory` is sampled too.
    #[arg(long)]
    redis: bool,
    /// Where to make the daemon's scratch directory (see `compare --tmp-dir`).
    #[arg(long)]
    tmp_dir: Option<std::path::PathBuf>,
    #[command(flatten)]
    output: OutputOpts,
}

#[derive(Debug, Clone, clap::Args)]
struct WaitersBenchArgs {
    /// A daemon already running (its store fresh), instead of one started for the run: its memory
    /// is not measured.
    #[arg(long)]
    server: Option<String>,
    /// How many waiters, each an allocate of one unit waiting on its own HTTP/2 stream.
    #[arg(long, default_value_t = 100_000)]
    waiters: usize,
    /// The HTTP/2 connections they share.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// The namespace's quota: held whole while the waiters queue, then handed along the queue.
    #[arg(long, default_value_t = 100)]
    quota: u64,
    /// The daemon's durability level (`disk`, the default, or `process`).
    #[arg(long, default_value = "disk")]
    durability: String,
    /// Exit with an error when a target is missed.
    #[arg(long)]
    check: bool,
    /// Where to make the daemon's scratch directory (see `compare --tmp-dir`).
    #[arg(long)]
    tmp_dir: Option<std::path::PathBuf>,
    #[command(flatten)]
    output: OutputOpts,
}

#[derive(Debug, Clone, clap::Args)]
struct GangsBenchArgs {
    /// How many applications, each with one task group.
    #[arg(long, default_value_t = 100)]
    apps: usize,
    /// Members of each application's task group (and its tasks).
    #[arg(long, default_value_t = 10)]
    members: u32,
    /// How many members (of cpu=1) the pools hold at once.
    #[arg(long, default_value_t = 50)]
    room: u32,
    /// How many pools share that room.
    #[arg(long, default_value_t = 5)]
    pools: u32,
    /// How long each task runs, from when the bench sees it Allocated to its completion.
    #[arg(long, default_value = "20ms", value_parser = crate::duration::parse)]
    run: Duration,
    /// How often to read every application (and check all or nothing).
    #[arg(long, default_value = "5ms", value_parser = crate::duration::parse)]
    poll: Duration,
    /// Give up when the gangs have not all completed within this long.
    #[arg(long, default_value = "120s", value_parser = crate::duration::parse)]
    timeout: Duration,
    /// Exit with an error when a check fails.
    #[arg(long)]
    check: bool,
    /// Where to make the daemon's scratch directory (see `compare --tmp-dir`).
    #[arg(long)]
    tmp_dir: Option<std::path::PathBuf>,
    #[command(flatten)]
    output: OutputOpts,
}

#[derive(Debug, clap::Args)]
struct OwnWorkArgs {
    /// How long to measure each of the two, per round.
    #[arg(long, default_value = "2s", value_parser = crate::duration::parse)]
    duration: Duration,
    /// How many rounds (both measured in each); the last line shows the medians.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Run on this CPU only (as `compare --pin` runs its servers).
    #[arg(long)]
    cpu: Option<usize>,
    #[command(flatten)]
    output: OutputOpts,
}

/// Runs `allot bench`; `api_over` builds the daemon's API for the probe of allot's own work
/// (`compare`, `own-work`).
pub async fn run(args: BenchArgs, api_over: ApiOver) -> anyhow::Result<()> {
    match args.command {
        BenchCommand::Pairs(args) => pairs(args).await,
        BenchCommand::Compare(args) => compare::run(args, api_over).await,
        BenchCommand::OwnWork(args) => own_work::run(args, api_over).await,
        BenchCommand::Wake(args) => wake::run(args).await,
        BenchCommand::Watch(args) => watch::run(args).await,
        BenchCommand::Redis(args) => redis::run(args).await,
        BenchCommand::Pools(args) => pools::run(args).await,
        BenchCommand::Sched(args) => sched::run(args).await,
        BenchCommand::Apps(args) => apps::run(args).await,
        BenchCommand::Gangs(args) => gangs::run(args).await,
        BenchCommand::Leases(args) => leases::run(args).await,
        BenchCommand::Backlog(args) => backlog::run(args).await,
        BenchCommand::Churn(args) => churn::run(args).await,
        BenchCommand::Waiters(args) => waiters::run(args).await,
    }
}

async fn pairs(args: PairsArgs) -> anyhow::Result<()> {
    if args.clients == 0 {
        bail!("--clients must be at least 1");
    }
    let mut endpoint = http::Endpoint::parse(&args.server)?;
    if let Some(token) = &args.token {
        endpoint = endpoint.with_token(token);
    }
    if let Some(path) = &args.ca_cert {
        let pem = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        endpoint = endpoint.with_ca(&pem)?;
    }
    let target = load::Target::allot("allot", endpoint, &args.load.namespace);
    if !args.no_setup {
        load::setup_namespace(&target.endpoint, &args.load.namespace, args.load.quota.max(args.clients as u64))
            .await
            .with_context(|| format!("cannot set up namespace `{}` at {}", args.load.namespace, args.server))?;
    }
    let spec = load::LoadSpec::new(args.clients, args.duration, &args.load, &args.output);
    let result = load::run_load(&target, &spec).await?;
    if args.output.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        print!("{}", report::summary(&result));
    }
    Ok(())
}
