//! `allot bench apps`: one application's tasks placed end to end, through a fresh daemon.
//!
//! Each round starts a daemon (embedded store, durability on) with `--pools` pools (default 500),
//! each with room for `tasks / pools + 1` tasks of `cpu=1,mem=10`, and a queue `root.bench`. The
//! clock starts at the application's submission (`POST /v1/apps`); then `--in-flight` clients
//! (default 32), each on its own keep-alive connection, add the `--tasks` tasks (default 5,000)
//! with `POST /v1/apps/{app}/tasks`, while one more connection reads the application every
//! `--poll` (`GET /v1/apps/{app}`, its tasks by state). The clock stops at the first reading
//! that has every task Allocated. Connections are opened and pools made before the clock starts.
//!
//! YuniKorn on KWOK published 833 pods/s; the target is 4,200 tasks/s.
//!
//! Each round also reports the daemon's CPU time (every thread; with `--across`, both daemons')
//! from the submission to the last reading, per task, and how busy the machine was; the run, the
//! rate the median of that CPU per task allows this machine's cores at most (every core the
//! daemon's, every step in parallel).
//!
//! With `--one-call`, the application is submitted with all its tasks in one call, as `allot run`
//! does (one commit for every task), and the clock starts before that call.
//!
//! With `--run`, the daemon runs every pool's tasks (`--run-pool` for each), the tasks are
//! `noop`, and the clock stops at the first reading with every task Completed: placed, started,
//! run by the plugin round by round with every step durable, and reported. Dask's distributed
//! scheduler documents about 200 µs of overhead per task (5,000 tasks/s); the target is 50,000
//! (issue 41: ten times Dask's; 10,000 before it).
//!
//! Each round also splits the daemon's CPU time per task by thread (`/proc/<pid>/task`): the
//! serving threads (the HTTP requests), the runtime (the scheduler's cycles, the executor's runs
//! and reports), the checkpointer and the syncer. Run with and without `--run` (and with
//! `--one-call`, where the submission is the serving threads' part), it gives the cost per task of
//! each step: submitting, placing, running with the run's record and report.
//!
//! With `--across`, two daemons share one Redis, each running its own pools (labelled with the
//! daemon): each round runs one application on the scheduling daemon's pools and one on the
//! other's, whose executor learns of its tasks from the change feed, in alternating order, each
//! removed before the next starts; the ratio of the second rate to the first is the target (0.8).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hyper::body::Bytes;
use hyper::{Method, StatusCode};
use serde::Serialize;

use crate::children::{self, Scratch};
use crate::cpu::{process_cpu_seconds, thread_cpu_seconds, CpuShare, CpuTimes};
use crate::http::{Conn, Endpoint};
use crate::latency::Latency;
use crate::report::{self, median, Check};
use crate::AppsBenchArgs;

const TASK: &str = "cpu=1,mem=10";
const QUEUE: &str = "root.bench";
const APP: &str = "bench-app";
/// YuniKorn's published rate on KWOK, and the target.
const YUNIKORN_PER_S: f64 = 833.0;
const MIN_PER_S: f64 = 4_200.0;
/// Dask's documented rate, and the target when the tasks are run too (issue 41: ten times it).
const DASK_PER_S: f64 = 5_000.0;
const MIN_RUN_PER_S: f64 = 50_000.0;
/// With `--across`: the rate on the other daemon's pools over the rate on the scheduler's own.
const MIN_ACROSS_RATIO: f64 = 0.8;

/// Where a round's application runs: pools `<name>-<i>` labelled `daemon=<name>`, its tasks
/// selecting them (no label and no selector: `node-<i>`).
#[derive(Debug, Clone)]
struct Side {
    name: &'static str,
    labelled: bool,
}

const ANYWHERE: Side = Side { name: "node", labelled: false };
const SCHEDULER: Side = Side { name: "sched", labelled: true };
const OTHER: Side = Side { name: "other", labelled: true };

#[derive(Serialize)]
struct Output {
    tasks: usize,
    pools: usize,
    in_flight: usize,
    rounds: Vec<Round>,
    median_tasks_per_s: Option<f64>,
    /// The median of the rounds' CPU time of the daemon per task, in µs.
    daemon_cpu_us_per_task: Option<f64>,
    /// The median over the rounds of each thread's CPU time per task, in µs.
    daemon_cpu_us_per_task_by_thread: BTreeMap<String, f64>,
    /// The CPUs this process may use.
    cores: usize,
    /// The rate that CPU per task allows `cores` at most.
    bound_tasks_per_s: Option<f64>,
    checks: Vec<Check>,
}

/// One round on a fresh daemon.
#[derive(Debug, Clone, Serialize)]
struct Round {
    round: u16,
    /// From the submission until a reading had every task Allocated (Completed with `--run`).
    seconds: f64,
    tasks_per_s: f64,
    /// From the submission until the last add was answered.
    added_seconds: f64,
    /// From the last add's answer to the reading with every task Allocated.
    lag_ms: f64,
    submit_ms: f64,
    add_ms: Latency,
    polls: u64,
    cpu: Option<CpuShare>,
    /// The daemon's CPU time (every thread; with `--across`, both daemons') from the submission
    /// to the last reading, per task.
    daemon_cpu_us_per_task: Option<f64>,
    /// The same by thread, named as the daemon names them (less an index; see [`THREADS`]).
    daemon_cpu_us_per_task_by_thread: BTreeMap<String, f64>,
    /// How many threads the daemons had at the start (each thread's time is read in ticks of
    /// its own: the split may exceed the total by up to two ticks a thread).
    daemon_threads: usize,
}

/// What each of the daemon's threads does, as the text output explains them.
const THREADS: &[(&str, &str)] = &[
    ("allot-serve", "the serving threads: the HTTP requests (the submission, the adds, the readings)"),
    ("tokio-rt-worker", "the runtime: the scheduler's cycles and commits, the executor's runs and reports"),
    ("allot-checkpoin", "the checkpointer: the log folded into the database"),
    ("allot-syncer", "the syncer: the log made durable, the events published to the feed"),
    ("allot-log-spare", "the spare maker: the log's next segments made ahead"),
];

pub(super) async fn run(args: AppsBenchArgs) -> anyhow::Result<()> {
    if args.tasks == 0 || args.pools == 0 || args.in_flight == 0 {
        bail!("--tasks, --pools and --in-flight must be at least 1");
    }
    let capacity = {
        let per_pool = (args.tasks / args.pools + 1) as u64;
        format!("cpu={per_pool},mem={}", per_pool * 10)
    };
    if args.across {
        return across(AppsBenchArgs { redis: true, run: true, ..args }, &capacity).await;
    }
    let mut rounds = Vec::new();
    for round in 1..=args.rounds {
        let scratch = Scratch::new(args.tmp_dir.as_deref())?;
        let redis = args.redis.then(allot_host::redis::RedisServer::start);
        let daemon = match &redis {
            Some(redis) => {
                let daemon = children::spawn_daemon_with(&scratch, &["--store".into(), redis.url().into()]).await?;
                scheduling(&daemon.endpoint).await?;
                daemon
            }
            None => {
                let mut more = Vec::new();
                if args.run {
                    for i in 0..args.pools {
                        more.extend(["--run-pool".into(), format!("node-{i}").into()]);
                    }
                }
                children::spawn_daemon_with(&scratch, &more).await?
            }
        };
        let outcome = measure(
            &args,
            &daemon.endpoint,
            &daemon.pid().into_iter().collect::<Vec<_>>(),
            &capacity,
            round,
            &ANYWHERE,
        )
        .await;
        daemon.stop().await;
        rounds.push(outcome?);
    }
    let median_tasks_per_s = median(rounds.iter().map(|r| r.tasks_per_s).collect());
    let checks = if args.run {
        vec![Check::at_least("tasks/s, submission to all Completed".to_owned(), median_tasks_per_s, MIN_RUN_PER_S)]
    } else {
        vec![Check::at_least("tasks/s, submission to all Allocated".to_owned(), median_tasks_per_s, MIN_PER_S)]
    };
    // What the daemon's own CPU time allows this machine at most, were every core its and every
    // step in parallel: a bound, not a forecast.
    let daemon_cpu_us_per_task = median(rounds.iter().filter_map(|r| r.daemon_cpu_us_per_task).collect());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let bound_tasks_per_s = daemon_cpu_us_per_task.filter(|us| *us > 0.0).map(|us| cores as f64 * 1e6 / us);
    let daemon_cpu_us_per_task_by_thread = by_thread_medians(&rounds);
    if args.output.json {
        let output = Output {
            tasks: args.tasks,
            pools: args.pools,
            in_flight: args.in_flight,
            rounds,
            median_tasks_per_s,
            daemon_cpu_us_per_task,
            daemon_cpu_us_per_task_by_thread,
            cores,
            bound_tasks_per_s,
            checks: checks.clone(),
        };
        println!("{}", serde_json::to_string_pretty(&output)?);
    } else {
        let (until, anchor) = if args.run {
            ("run (noop) to Completed", format!("Dask's scheduler: {DASK_PER_S} tasks/s"))
        } else {
            ("placed (Allocated)", format!("YuniKorn on KWOK: {YUNIKORN_PER_S} pods/s"))
        };
        println!(
            "one application, {} tasks of {TASK} added over HTTP ({} in flight), {} pools of {capacity}, one daemon \
             ({} store), {until}; {anchor}",
            args.tasks,
            args.in_flight,
            args.pools,
            if args.redis { "Redis" } else { "embedded" }
        );
        for r in &rounds {
            let steal = r.cpu.map_or_else(|| "-".to_owned(), |c| format!("{:.1}%", c.steal_pct));
            let busy = r.cpu.map_or_else(|| "-".to_owned(), |c| format!("{:.0}%", c.busy_pct));
            let daemon = r.daemon_cpu_us_per_task.map_or_else(|| "-".to_owned(), |us| format!("{us:.1} µs"));
            println!(
                "  round {}: {:>7.0} tasks/s  all done after {:.3} s (adds answered after {:.3} s, then {:.1} ms)  \
                 add p50 {:.2} ms p99 {:.2} ms  submit {:.2} ms  {} polls  daemon CPU per task {daemon}  \
                 machine busy {busy}  steal {steal}",
                r.round,
                r.tasks_per_s,
                r.seconds,
                r.added_seconds,
                r.lag_ms,
                r.add_ms.p50,
                r.add_ms.p99,
                r.submit_ms,
                r.polls
            );
        }
        if let Some(rate) = median_tasks_per_s {
            match args.run {
                true => println!("median {rate:.0} tasks/s ({:.1}x Dask)", rate / DASK_PER_S),
                false => println!("median {rate:.0} tasks/s ({:.1}x YuniKorn)", rate / YUNIKORN_PER_S),
            }
        }
        if let (Some(us), Some(bound)) = (daemon_cpu_us_per_task, bound_tasks_per_s) {
            println!("the daemon's CPU per task {us:.1} µs (median): at most {bound:.0} tasks/s on this machine's {cores} cores");
        }
        if !daemon_cpu_us_per_task_by_thread.is_empty() {
            println!("of it, by thread (medians, µs per task):");
            for (name, us) in &daemon_cpu_us_per_task_by_thread {
                let what = THREADS.iter().find(|(n, _)| n == name).map_or("", |(_, what)| what);
                println!("  {name:<16} {us:>6.1}  {what}");
            }
        }
        println!("targets:");
        print!("{}", report::checks(&checks));
    }
    if args.check && checks.iter().any(|c| !c.ok) {
        bail!("a target was missed");
    }
    Ok(())
}

/// Waits until a daemon on Redis schedules (it answers the applications part).
async fn scheduling(endpoint: &Endpoint) -> anyhow::Result<()> {
    let mut conn = Conn::connect(endpoint).await?;
    let started = Instant::now();
    while conn.request(Method::GET, "/v1/queues", Bytes::new()).await?.0 != StatusCode::OK {
        if started.elapsed() > Duration::from_secs(15) {
            bail!("the daemon on Redis did not start scheduling within 15 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Sends one request and answers its body; an answer other than 2xx is an error.
pub(super) async fn call(conn: &mut Conn, method: Method, path: &str, body: Vec<u8>) -> anyhow::Result<Bytes> {
    let (status, answer) = conn.request(method.clone(), path, Bytes::from(body)).await?;
    if !status.is_success() {
        bail!("{method} {path}: {status}: {}", String::from_utf8_lossy(&answer));
    }
    Ok(answer)
}

/// `--across`: per round, one Redis and two daemons; an application on each daemon's pools.
async fn across(args: AppsBenchArgs, capacity: &str) -> anyhow::Result<()> {
    let (mut own, mut other) = (Vec::new(), Vec::new());
    for round in 1..=args.rounds {
        let redis = allot_host::redis::RedisServer::start();
        let (first, second) = (Scratch::new(args.tmp_dir.as_deref())?, Scratch::new(args.tmp_dir.as_deref())?);
        let serve = |side: &Side| {
            let mut more: Vec<std::ffi::OsString> = vec!["--store".into(), redis.url().into()];
            for i in 0..args.pools {
                more.extend(["--run-pool".into(), format!("{}-{i}", side.name).into()]);
            }
            more
        };
        let scheduler = children::spawn_daemon_with(&first, &serve(&SCHEDULER)).await?;
        scheduling(&scheduler.endpoint).await?;
        let follower = children::spawn_daemon_with(&second, &serve(&OTHER)).await?;
        let order = if round % 2 == 1 { [&SCHEDULER, &OTHER] } else { [&OTHER, &SCHEDULER] };
        let mut outcome = Ok(());
        for side in order {
            let daemons: Vec<u32> = [scheduler.pid(), follower.pid()].into_iter().flatten().collect();
            let measured = measure(&args, &scheduler.endpoint, &daemons, capacity, round, side).await;
            // The next application starts with the scheduler as this one found it.
            let measured = match measured {
                Ok(measured) => {
                    remove_app(&scheduler.endpoint, &format!("{APP}-{}", side.name)).await.map(|()| measured)
                }
                err => err,
            };
            match measured {
                Ok(measured) if side.name == SCHEDULER.name => own.push(measured),
                Ok(measured) => other.push(measured),
                Err(err) => {
                    outcome = Err(err);
                    break;
                }
            }
        }
        scheduler.stop().await;
        follower.stop().await;
        outcome?;
    }
    let rate = |rounds: &[Round]| median(rounds.iter().map(|r| r.tasks_per_s).collect());
    let ratio = match (rate(&own), rate(&other)) {
        (Some(own), Some(other)) if own > 0.0 => Some(other / own),
        _ => None,
    };
    let checks = vec![Check::at_least(
        "tasks/s to Completed on the other daemon's pools / on the scheduler's own".to_owned(),
        ratio,
        MIN_ACROSS_RATIO,
    )];
    if args.output.json {
        let output = serde_json::json!({
            "tasks": args.tasks,
            "pools": args.pools,
            "own": own,
            "other": other,
            "ratio": ratio,
            "checks": checks,
        });
        println!("{}", serde_json::to_string_pretty(&output)?);
    } else {
        println!(
            "two daemons on one Redis, {} noop tasks per application over {} pools of {capacity} per daemon, \
             submission to all Completed",
            args.tasks, args.pools
        );
        // The machine's CPU busy over the run, and what that is per task (all its cores).
        let cpu = |r: &Round| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
            r.cpu.map_or_else(
                || "-".to_owned(),
                |c| {
                    let per_task = c.busy_pct / 100.0 * cores * r.seconds * 1000.0 / args.tasks as f64;
                    format!("busy {:.0}%, {per_task:.2} ms CPU/task", c.busy_pct)
                },
            )
        };
        for (own, other) in own.iter().zip(&other) {
            println!(
                "  round {}: on the scheduler's pools {:>7.0} tasks/s ({}), on the other daemon's {:>7.0} tasks/s ({})",
                own.round,
                own.tasks_per_s,
                cpu(own),
                other.tasks_per_s,
                cpu(other)
            );
        }
        if let Some(ratio) = ratio {
            println!("median ratio {ratio:.2}");
        }
        println!("targets:");
        print!("{}", report::checks(&checks));
    }
    if args.check && checks.iter().any(|c| !c.ok) {
        bail!("a target was missed");
    }
    Ok(())
}

/// The CPU time the `daemons` have used together, in seconds; `None` if one cannot be read.
fn daemons_cpu_seconds(daemons: &[u32]) -> Option<f64> {
    if daemons.is_empty() {
        return None;
    }
    daemons.iter().map(|pid| process_cpu_seconds(*pid)).sum()
}

/// The CPU time of the `daemons`' threads together, in seconds, by thread name, and how many
/// threads were read (nothing if `/proc` cannot be read).
fn daemons_thread_cpu_seconds(daemons: &[u32]) -> (BTreeMap<String, f64>, usize) {
    let (mut total, mut threads) = (BTreeMap::new(), 0);
    for (name, seconds) in daemons.iter().filter_map(|pid| thread_cpu_seconds(*pid)).flatten() {
        *total.entry(name).or_insert(0.0) += seconds;
        threads += 1;
    }
    (total, threads)
}

/// The median over `rounds` of each thread's CPU time per task, in µs.
fn by_thread_medians(rounds: &[Round]) -> BTreeMap<String, f64> {
    let names: std::collections::BTreeSet<&String> =
        rounds.iter().flat_map(|r| r.daemon_cpu_us_per_task_by_thread.keys()).collect();
    names
        .into_iter()
        .filter_map(|name| {
            let values = rounds.iter().map(|r| r.daemon_cpu_us_per_task_by_thread.get(name).copied().unwrap_or(0.0));
            median(values.collect()).map(|us| (name.clone(), us))
        })
        .filter(|(_, us)| *us > 0.0)
        .collect()
}

/// Removes application `app` and waits until it is gone.
async fn remove_app(endpoint: &Endpoint, app: &str) -> anyhow::Result<()> {
    let mut conn = Conn::connect(endpoint).await?;
    let path = format!("/v1/apps/{app}");
    call(&mut conn, Method::DELETE, &path, Vec::new()).await?;
    let started = Instant::now();
    while conn.request(Method::GET, &path, Bytes::new()).await?.0 != StatusCode::NOT_FOUND {
        if started.elapsed() > Duration::from_secs(60) {
            bail!("application {app} was not removed within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

async fn measure(
    args: &AppsBenchArgs,
    endpoint: &Endpoint,
    daemons: &[u32],
    capacity: &str,
    round: u16,
    side: &Side,
) -> anyhow::Result<Round> {
    let app = if side.labelled { format!("{APP}-{}", side.name) } else { APP.to_owned() };
    let label: std::collections::BTreeMap<String, String> = match side.labelled {
        true => [("daemon".to_owned(), side.name.to_owned())].into(),
        false => Default::default(),
    };
    let mut conns = Vec::with_capacity(args.in_flight);
    for _ in 0..args.in_flight {
        conns.push(Conn::connect(endpoint).await?);
    }
    // Pools, through every connection at once (each is a durable commit).
    let body = serde_json::to_vec(&serde_json::json!({ "capacity": capacity, "labels": label }))?;
    let next = Arc::new(AtomicUsize::new(0));
    let mut makers = Vec::new();
    for mut conn in conns {
        let (next, body, pools, name) = (next.clone(), body.clone(), args.pools, side.name);
        makers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= pools {
                    return Ok::<_, anyhow::Error>(conn);
                }
                call(&mut conn, Method::PUT, &format!("/v1/pools/{name}-{i}"), body.clone()).await?;
            }
        }));
    }
    let mut conns = Vec::with_capacity(args.in_flight);
    for maker in makers {
        conns.push(maker.await??);
    }
    let mut setup = Conn::connect(endpoint).await?;
    call(&mut setup, Method::PUT, &format!("/v1/queues/{QUEUE}"), b"{}".to_vec()).await?;
    let mut poller = Conn::connect(endpoint).await?;
    let tasks: Vec<allot_api::AddTask> = (0..args.tasks)
        .map(|i| allot_api::AddTask {
            preemptable: None,
            priority_class: None,
            id: format!("task-{i}"),
            resources: TASK.to_owned(),
            tokens: Vec::new(),
            group: None,
            priority: Default::default(),
            selector: label.clone(),
            spec: args.run.then(|| serde_json::json!({ "type": "noop" })),
            retries: None,
        })
        .collect();
    let submit = serde_json::to_vec(&allot_api::SubmitApp {
        priority: None,
        priority_class: None,
        id: app.clone(),
        queue: Some(QUEUE.to_owned()),
        user: "bench".to_owned(),
        user_groups: Vec::new(),
        tags: Default::default(),
        task_groups: Vec::new(),
        policy: Default::default(),
        tasks: if args.one_call { tasks.clone() } else { Vec::new() },
    })?;
    let bodies: Arc<Vec<Vec<u8>>> = Arc::new(match args.one_call {
        true => Vec::new(),
        false => tasks.iter().map(serde_json::to_vec).collect::<Result<_, _>>()?,
    });
    let tasks_path: Arc<str> = format!("/v1/apps/{app}/tasks").into();

    let cpu_before = CpuTimes::now();
    let daemon_before = daemons_cpu_seconds(daemons);
    let (threads_before, daemon_threads) = daemons_thread_cpu_seconds(daemons);
    let started = Instant::now();
    call(&mut setup, Method::POST, "/v1/apps", submit).await.context("cannot submit the application")?;
    let submit_ms = started.elapsed().as_secs_f64() * 1000.0;
    let next = Arc::new(AtomicUsize::new(0));
    let mut adders = Vec::new();
    for mut conn in conns {
        let (next, bodies, path) = (next.clone(), bodies.clone(), tasks_path.clone());
        adders.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(body) = bodies.get(i) else { return Ok::<_, anyhow::Error>((latencies, Instant::now())) };
                let sent = Instant::now();
                let (status, answer) = conn.request(Method::POST, &path, Bytes::from(body.clone())).await?;
                if status != StatusCode::CREATED {
                    bail!("adding task-{i}: {status}: {}", String::from_utf8_lossy(&answer));
                }
                latencies.push(sent.elapsed().as_nanos() as u64);
            }
        }));
    }
    let want = args.tasks as u64;
    let poll_path = format!("/v1/apps/{app}");
    let mut polls = 0u64;
    let deadline = started + Duration::from_secs(120);
    let done = loop {
        let answer = call(&mut poller, Method::GET, &poll_path, Vec::new()).await?;
        polls += 1;
        let app: allot_api::App = serde_json::from_slice(&answer).context("the application's answer")?;
        let until = if args.run { "Completed" } else { "Allocated" };
        if app.tasks.get(until).copied().unwrap_or(0) >= want {
            break Instant::now();
        }
        if Instant::now() > deadline {
            bail!("not every task was {until} within 120 s: {:?}", app.tasks);
        }
        tokio::time::sleep(args.poll).await;
    };
    let cpu = CpuTimes::now().zip(cpu_before).and_then(|(after, before)| before.share_until(&after));
    let daemon_cpu_us_per_task = daemons_cpu_seconds(daemons)
        .zip(daemon_before)
        .map(|(after, before)| (after - before) * 1e6 / args.tasks as f64);
    let daemon_cpu_us_per_task_by_thread = daemons_thread_cpu_seconds(daemons)
        .0
        .into_iter()
        .map(|(name, after)| {
            let before = threads_before.get(&name).copied().unwrap_or(0.0);
            (name, (after - before).max(0.0) * 1e6 / args.tasks as f64)
        })
        .filter(|(_, us)| *us > 0.0)
        .collect();
    let mut latencies = Vec::with_capacity(args.tasks);
    let mut last_added = started;
    for adder in adders {
        let (l, finished) = adder.await??;
        latencies.extend(l);
        last_added = last_added.max(finished);
    }
    let seconds = done.duration_since(started).as_secs_f64();
    Ok(Round {
        round,
        seconds,
        tasks_per_s: args.tasks as f64 / seconds,
        added_seconds: last_added.duration_since(started).as_secs_f64(),
        lag_ms: done.saturating_duration_since(last_added).as_secs_f64() * 1000.0,
        submit_ms,
        add_ms: Latency::from_nanos(latencies),
        polls,
        cpu,
        daemon_cpu_us_per_task,
        daemon_cpu_us_per_task_by_thread,
        daemon_threads,
    })
}
