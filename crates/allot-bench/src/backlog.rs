//! `allot bench backlog`: many applications waiting at once (issue 43, point 6).
//!
//! Two measurements, each against its target:
//!
//! - **a cycle with a backlog**, in this process (`Scheduler::schedule`, as `bench sched`): every
//!   pool is filled by one application's tasks (untimed), then `--pending` tasks (default
//!   100,000) wait in applications of `--tasks-per-app` (100) over ten queues, with no room for
//!   any. Timed: cycles that find nothing changed, and cycles after one placed task completed
//!   (each places one waiting task into its room). Target: no cycle slower than 50 ms.
//! - **a restart with a backlog**, through a fresh daemon on its embedded store: `--apps`
//!   applications (default 10,000) of `--tasks-per-app` tasks each are submitted (one call each,
//!   over `--in-flight` connections), with room in the pools for `--room` of them. The daemon is
//!   killed with SIGKILL and started again on the same port and data directory; from the kill,
//!   the times of its first answer, of `/readyz` ready, and of "scheduling again": a probe
//!   application submitted as soon as the daemon takes it, whose one task asks for what only
//!   the probe's pool has (`probe=1`), placed. Target: scheduling again within 2 s of the kill.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_core::apps::queues::{QueueLimits, QueuePath};
use allot_core::apps::{AppId, TaskEnd, TaskEnding, TaskId, World};
use allot_core::Resources;
use anyhow::{bail, Context};
use hyper::body::Bytes;
use hyper::{Method, StatusCode};
use serde::Serialize;

use crate::apps::call;
use crate::children::{self, Scratch};
use crate::http::{Conn, Endpoint};
use crate::report::{self, median, Check};
use crate::sched::{app_spec, capacity_for, empty_world, task_spec};
use crate::watch::resident_kib;
use crate::BacklogBenchArgs;

const MAX_CYCLE_MS: f64 = 50.0;
const MAX_RESTART_S: f64 = 2.0;
/// What every task of the backlog asks for.
const TASK: &str = "cpu=1,mem=10";
/// Queues the backlog's applications are spread over (`root.q0`..).
const QUEUES: usize = 10;
/// Pools in process, each filled before the backlog is added.
const CYCLE_POOLS: usize = 500;
const PER_POOL: usize = 20;
/// Cycles timed of each kind.
const CYCLES: usize = 20;

#[derive(Debug, Serialize)]
struct Output {
    cycle: CycleFigures,
    restart: Option<RestartFigures>,
    checks: Vec<Check>,
}

#[derive(Debug, Serialize)]
struct CycleFigures {
    pending: usize,
    apps: usize,
    pools: usize,
    /// Cycles that found nothing changed: median and slowest (ms).
    idle_median_ms: f64,
    idle_max_ms: f64,
    /// Cycles that placed one task into the room one completed task left.
    one_median_ms: f64,
    one_max_ms: f64,
    setup_seconds: f64,
}

#[derive(Debug, Serialize)]
struct RestartFigures {
    apps: usize,
    tasks: usize,
    /// Tasks placed before the kill (the pools' room).
    placed: u64,
    submitted_per_s: f64,
    /// The daemon's resident memory with the backlog, and after the restart.
    full_kib: u64,
    restarted_kib: u64,
    first_answer_s: Option<f64>,
    ready_s: f64,
    scheduling_s: f64,
}

pub(super) async fn run(args: BacklogBenchArgs) -> anyhow::Result<()> {
    if args.pending == 0 || args.tasks_per_app == 0 || args.in_flight == 0 {
        bail!("--pending, --tasks-per-app and --in-flight must be at least 1");
    }
    let cycle = tokio::task::spawn_blocking({
        let args = args.clone();
        move || measure_cycles(args.pending, args.tasks_per_app)
    })
    .await??;
    eprintln!("cycles with {} pending: slowest {:.1} ms", cycle.pending, cycle.idle_max_ms.max(cycle.one_max_ms));
    let restart = match args.apps {
        0 => None,
        _ => Some(measure_restart(&args).await?),
    };
    let mut checks = vec![Check::at_most(
        format!("slowest cycle with {} tasks pending (ms)", cycle.pending),
        Some(cycle.idle_max_ms.max(cycle.one_max_ms)),
        MAX_CYCLE_MS,
    )];
    if let Some(restart) = &restart {
        let what = format!("kill -9 to scheduling again, {} tasks stored (s)", restart.tasks);
        checks.push(Check::at_most(what, Some(restart.scheduling_s), MAX_RESTART_S));
    }
    let output = Output { cycle, restart, checks: checks.clone() };
    report::finish(&output, args.output.json, print, args.check, &checks)
}

fn print(o: &Output) {
    let c = &o.cycle;
    println!(
        "a cycle in process, {} tasks of {TASK} pending in {} applications over {QUEUES} queues, {} pools full:",
        c.pending, c.apps, c.pools
    );
    println!("  nothing changed: median {:.2} ms, slowest {:.2} ms ({CYCLES} cycles)", c.idle_median_ms, c.idle_max_ms);
    println!(
        "  one task completed, one placed in its room: median {:.2} ms, slowest {:.2} ms ({CYCLES} cycles)",
        c.one_median_ms, c.one_max_ms
    );
    if let Some(r) = &o.restart {
        println!(
            "a daemon (embedded store) with {} applications, {} tasks ({} placed), submitted at {:.0} tasks/s; \
             memory {} KiB, after the restart {} KiB",
            r.apps, r.tasks, r.placed, r.submitted_per_s, r.full_kib, r.restarted_kib
        );
        let first = r.first_answer_s.map_or_else(|| "-".to_owned(), |s| format!("{s:.3} s"));
        println!(
            "  from kill -9: first answer {first}, ready {:.3} s, scheduling again (a new task placed) {:.3} s",
            r.ready_s, r.scheduling_s
        );
    }
    println!("targets:");
    print!("{}", report::checks(&o.checks));
}

/// The in-process measurement (see the module).
fn measure_cycles(pending: usize, per_app: usize) -> anyhow::Result<CycleFigures> {
    let started = Instant::now();
    let (mut sched, mut pools, mut ledger) = empty_world(CYCLE_POOLS, &capacity_for(PER_POOL))?;
    let task: Resources = TASK.parse()?;
    let mut next_id = 0u64;
    let mut ids = || {
        next_id += 1;
        next_id
    };
    let mut now = 1;
    let fill = AppId::new("fill")?;
    sched.put_queue(QueuePath::new("root.fill")?, QueueLimits::default())?;
    for q in 0..QUEUES {
        sched.put_queue(QueuePath::new(&format!("root.q{q}"))?, QueueLimits::default())?;
    }
    let mut world = World { pools: &mut pools, ledger: &mut ledger };
    sched.add_app(app_spec(&fill, "root.fill")?, now, &world)?;
    let filled = CYCLE_POOLS * PER_POOL;
    for i in 0..filled {
        sched.add_task(&fill, task_spec(&format!("fill-{i}"), &task)?, now, &world)?;
    }
    let mut placed = 0;
    while placed < filled {
        now += 1;
        let (report, _) = sched.schedule(now, &mut world, &mut ids);
        if report.placed == 0 {
            bail!("{placed} of {filled} filling tasks placed: the rest do not fit");
        }
        placed += report.placed;
    }
    let apps = pending.div_ceil(per_app);
    for a in 0..apps {
        let id = AppId::new(&format!("app-{a}"))?;
        sched.add_app(app_spec(&id, &format!("root.q{}", a % QUEUES))?, now, &world)?;
        for t in 0..per_app.min(pending - a * per_app) {
            sched.add_task(&id, task_spec(&format!("t-{t}"), &task)?, now, &world)?;
        }
    }
    let setup_seconds = started.elapsed().as_secs_f64();
    let mut time = |sched: &mut allot_core::apps::Scheduler, world: &mut World<'_>, now, want: usize| {
        let start = Instant::now();
        let (report, outcome) = sched.schedule(now, world, &mut ids);
        let took = start.elapsed().as_secs_f64() * 1000.0;
        drop(outcome);
        match report.placed == want {
            true => Ok(took),
            false => Err(anyhow::anyhow!("a cycle placed {} tasks, not {want}", report.placed)),
        }
    };
    let mut idle = Vec::new();
    for _ in 0..CYCLES {
        now += 1;
        idle.push(time(&mut sched, &mut world, now, 0)?);
    }
    let mut one = Vec::new();
    for i in 0..CYCLES {
        now += 1;
        let end =
            TaskEnd { app: fill.clone(), task: TaskId::new(&format!("fill-{i}"))?, ending: TaskEnding::Completed };
        let (answers, _) = sched.finish_tasks(vec![end], now, &mut world);
        for answer in answers {
            answer?;
        }
        one.push(time(&mut sched, &mut world, now, 1)?);
    }
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    Ok(CycleFigures {
        pending,
        apps,
        pools: CYCLE_POOLS,
        idle_median_ms: median(idle.clone()).unwrap_or(0.0),
        idle_max_ms: max(&idle),
        one_median_ms: median(one.clone()).unwrap_or(0.0),
        one_max_ms: max(&one),
        setup_seconds,
    })
}

/// The daemon's measurement (see the module).
async fn measure_restart(args: &BacklogBenchArgs) -> anyhow::Result<RestartFigures> {
    let scratch = Scratch::new(args.tmp_dir.as_deref())?;
    let daemon = children::spawn_daemon(&scratch).await?;
    let endpoint = daemon.endpoint.clone();
    let mut setup = Conn::connect(&endpoint).await?;
    // Room for `--room` tasks over ten pools; the probe's pool has room for the probe only.
    let per_pool = args.room.div_ceil(10);
    for i in 0..10 {
        let body = serde_json::to_vec(&serde_json::json!({ "capacity": capacity_for(per_pool).to_string() }))?;
        call(&mut setup, Method::PUT, &format!("/v1/pools/room-{i}"), body).await?;
    }
    let body = serde_json::to_vec(&serde_json::json!({ "capacity": "probe=1" }))?;
    call(&mut setup, Method::PUT, "/v1/pools/probe", body).await?;
    for q in 0..QUEUES {
        call(&mut setup, Method::PUT, &format!("/v1/queues/root.q{q}"), b"{}".to_vec()).await?;
    }
    call(&mut setup, Method::PUT, "/v1/queues/root.probe", b"{}".to_vec()).await?;

    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut submitters = Vec::new();
    for _ in 0..args.in_flight {
        let mut conn = Conn::connect(&endpoint).await?;
        let (next, apps, per_app) = (next.clone(), args.apps, args.tasks_per_app);
        submitters.push(tokio::spawn(async move {
            loop {
                let a = next.fetch_add(1, Ordering::Relaxed);
                if a >= apps {
                    return Ok::<_, anyhow::Error>(());
                }
                let tasks: Vec<serde_json::Value> =
                    (0..per_app).map(|t| serde_json::json!({ "id": format!("t-{t}"), "resources": TASK })).collect();
                let body = serde_json::json!({
                    "id": format!("app-{a}"), "queue": format!("root.q{}", a % QUEUES), "user": "bench", "tasks": tasks,
                });
                call(&mut conn, Method::POST, "/v1/apps", serde_json::to_vec(&body)?).await?;
            }
        }));
    }
    for submitter in submitters {
        submitter.await??;
    }
    let tasks = args.apps * args.tasks_per_app;
    let submitted_per_s = tasks as f64 / started.elapsed().as_secs_f64();
    eprintln!("{} applications, {tasks} tasks submitted ({submitted_per_s:.0} tasks/s)", args.apps);
    // Until the pools' room is taken (the scheduler placed what fits).
    let room = (per_pool * 10).min(tasks) as u64;
    let waited = Instant::now();
    let placed = loop {
        let placed = allocated_in_pools(&mut setup).await?;
        if placed >= room {
            break placed;
        }
        if waited.elapsed() > Duration::from_secs(300) {
            bail!("{placed} of {room} tasks placed after 300 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let full_kib = resident_kib(daemon.pid().context("the daemon's process")?)?;

    let listen = endpoint.authority.clone();
    let killed = Instant::now();
    daemon.kill().await;
    let probe = Endpoint::parse(&format!("http://{listen}"))?;
    let timer = tokio::spawn(async move { until_scheduling(&probe, killed).await });
    let daemon = children::spawn_daemon_again(&scratch, &["--listen".into(), listen.into()]).await?;
    let (first_answer_s, ready_s, scheduling_s) = timer.await.context("the restart's probe")??;
    let restarted_kib = resident_kib(daemon.pid().context("the daemon's process")?)?;
    daemon.stop().await;
    if args.keep {
        eprintln!("the daemon's data directory is kept: {}", scratch.keep().join("allot-data").display());
    }
    Ok(RestartFigures {
        apps: args.apps,
        tasks,
        placed,
        submitted_per_s,
        full_kib,
        restarted_kib,
        first_answer_s,
        ready_s,
        scheduling_s,
    })
}

/// The tasks placed in the pools, by their allocs.
async fn allocated_in_pools(conn: &mut Conn) -> anyhow::Result<u64> {
    let answer = call(conn, Method::GET, "/v1/pools", Vec::new()).await?;
    let pools: allot_api::PoolList = serde_json::from_slice(&answer).context("the pools' answer")?;
    Ok(pools.pools.iter().map(|p| p.allocs).sum())
}

/// From `killed`: the daemon's first answer, `/readyz` ready, and the probe application's task
/// placed (submitted as soon as the daemon takes it).
async fn until_scheduling(probe: &Endpoint, killed: Instant) -> anyhow::Result<(Option<f64>, f64, f64)> {
    let since = || killed.elapsed().as_secs_f64();
    let give_up = Duration::from_secs(120);
    let mut first_answer = None;
    let mut conn = loop {
        if let Ok(mut conn) = Conn::connect(probe).await {
            if let Ok((status, _)) = conn.request(Method::GET, "/readyz", Bytes::new()).await {
                first_answer.get_or_insert_with(since);
                if status == StatusCode::OK {
                    break conn;
                }
            }
        }
        if killed.elapsed() > give_up {
            bail!("the daemon was not ready within {give_up:?} of the kill");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let ready = since();
    let submit = serde_json::json!({
        "id": "probe", "queue": "root.probe", "user": "bench", "tasks": [{ "id": "probe", "resources": "probe=1" }],
    });
    let submit = serde_json::to_vec(&submit)?;
    loop {
        let (status, answer) = conn.request(Method::POST, "/v1/apps", Bytes::from(submit.clone())).await?;
        match status {
            StatusCode::CREATED | StatusCode::OK => break,
            StatusCode::SERVICE_UNAVAILABLE => tokio::time::sleep(Duration::from_millis(2)).await,
            _ => bail!("submitting the probe: {status}: {}", String::from_utf8_lossy(&answer)),
        }
    }
    loop {
        let answer = call(&mut conn, Method::GET, "/v1/apps/probe", Vec::new()).await?;
        let app: allot_api::App = serde_json::from_slice(&answer).context("the probe's answer")?;
        if app.tasks.get("Allocated").copied().unwrap_or(0) >= 1 {
            return Ok((first_answer, ready, since()));
        }
        if killed.elapsed() > give_up {
            bail!("the probe's task was not placed within {give_up:?} of the kill: {:?}", app.tasks);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
