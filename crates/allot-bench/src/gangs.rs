//! `allot bench gangs`: gangs competing for room, end to end through a fresh daemon, with all or
//! nothing checked at every poll.
//!
//! A fresh daemon (embedded store, durability on) gets `--pools` pools (default 5) sharing room
//! for `--room` members (default 50, so `cpu=10` each) and a queue `root.gangs`. The clock starts
//! when the bench submits `--apps` applications (default 100), 16 at a time, each with one task
//! group of `--members` members (default 10) of `cpu=1` and its member tasks in the same request.
//! The bench runs the tasks itself, over the API: one connection reads every application every
//! `--poll`, and a task it finds Allocated is started (`POST .../start`) and completed
//! (`POST .../complete`) `--run` (default 20 ms) later. The clock stops at the first reading with
//! every task of every application Completed.
//!
//! At every reading, each application must hold its gang whole or not at all: its placeholders
//! number 0 or `--members`, and with none it has no task Allocated or Running (nothing is placed
//! outside its gang). Everything must finish within `--timeout`: a deadlock (gangs each holding
//! part of the room, none whole) would not. The report gives the most members held at one reading
//! (free placeholders and placed tasks: at most the room), and the most gangs running at once
//! (holding anything) and whole (holding every member: at most room / members). A gang whose
//! first members have finished holds less, so a new gang may start beside it before it ends.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_client::{AddTask, Client, PageArgs, PutQueue, SubmitApp, TaskGroup};
use anyhow::{bail, Context};
use serde::Serialize;
use tokio::task::JoinSet;

use crate::children::{self, Scratch};
use crate::cpu::{CpuShare, CpuTimes};
use crate::report::{self, Check};
use crate::GangsBenchArgs;

const QUEUE: &str = "root.gangs";
const GROUP: &str = "workers";
/// Applications submitted at once.
const SUBMITTERS: usize = 16;

#[derive(Debug, Clone, Serialize)]
struct Output {
    apps: usize,
    members: u32,
    room: u32,
    pools: u32,
    run_ms: f64,
    /// From the first submission until every task of every application was Completed.
    seconds: f64,
    /// The most applications holding anything (members not yet finished) at one reading.
    max_gangs_at_once: usize,
    /// The most applications holding every member of their gang at one reading.
    max_whole_gangs_at_once: usize,
    /// The most members held at one reading (free placeholders, and tasks Allocated or Running).
    max_members_held: u64,
    polls: u64,
    /// Readings of an application holding part of its gang, or a task placed outside it.
    violations: Vec<String>,
    /// Applications by state at the end.
    final_states: BTreeMap<String, usize>,
    cpu: Option<CpuShare>,
    checks: Vec<Check>,
}

pub(super) async fn run(args: GangsBenchArgs) -> anyhow::Result<()> {
    if args.apps == 0 || args.members == 0 || args.pools == 0 || args.room < args.members {
        bail!("--apps, --members and --pools must be at least 1, and --room at least --members");
    }
    if !args.room.is_multiple_of(args.pools) {
        bail!("--room must be a multiple of --pools (each pool holds room / pools members)");
    }
    let scratch = Scratch::new(args.tmp_dir.as_deref())?;
    // An application whose tasks have all completed is Completed at once (no completing grace).
    let config = scratch.join("allot.toml");
    std::fs::write(&config, "[scheduler]\ncompleting_grace = \"0s\"\n")?;
    let daemon = children::spawn_daemon_with(&scratch, &["--config".into(), config.into()]).await?;
    let outcome = measure(&args, &daemon.endpoint.url()).await;
    daemon.stop().await;
    let output = outcome?;
    if args.output.json {
        println!("{}", serde_json::to_string_pretty(&output)?);
    } else {
        let steal = output.cpu.map_or_else(|| "-".to_owned(), |c| format!("{:.1}%", c.steal_pct));
        println!(
            "{} applications, each a gang of {} members of cpu=1, {} pools with room for {} members at once, \
             each task run {:.0} ms by the bench over the API; one daemon (embedded store)",
            output.apps, output.members, output.pools, output.room, output.run_ms
        );
        println!(
            "  every gang run and completed after {:.3} s ({:.1} gangs/s); at most {} gangs running at once ({} of \
             them whole), {} members held; {} polls; steal {steal}",
            output.seconds,
            output.apps as f64 / output.seconds,
            output.max_gangs_at_once,
            output.max_whole_gangs_at_once,
            output.max_members_held,
            output.polls
        );
        let states: Vec<String> = output.final_states.iter().map(|(s, n)| format!("{n} {s}")).collect();
        println!("  applications at the end: {}", states.join(", "));
        for violation in output.violations.iter().take(10) {
            println!("  VIOLATION {violation}");
        }
        println!("checks:");
        print!("{}", report::checks(&output.checks));
    }
    if args.check && output.checks.iter().any(|c| !c.ok) {
        bail!("a check failed");
    }
    Ok(())
}

fn app_id(i: usize) -> String {
    format!("gang-{i:04}")
}

fn submission(i: usize, members: u32) -> SubmitApp {
    SubmitApp {
        priority: None,
        priority_class: None,
        id: app_id(i),
        queue: Some(QUEUE.to_owned()),
        user: "bench".to_owned(),
        user_groups: Vec::new(),
        tags: BTreeMap::new(),
        task_groups: vec![TaskGroup {
            name: GROUP.to_owned(),
            min_members: members,
            min_resources: "cpu=1".to_owned(),
            selector: BTreeMap::new(),
            tokens: Vec::new(),
        }],
        policy: Default::default(),
        tasks: (0..members)
            .map(|m| AddTask {
                preemptable: None,
                priority_class: None,
                id: format!("member-{m}"),
                resources: "cpu=1".to_owned(),
                tokens: Vec::new(),
                group: Some(GROUP.to_owned()),
                priority: Default::default(),
                selector: BTreeMap::new(),
                spec: None,
                retries: None,
            })
            .collect(),
    }
}

async fn measure(args: &GangsBenchArgs, url: &str) -> anyhow::Result<Output> {
    let client = Client::new(url)?.with_request_timeout(Duration::from_secs(30));
    let per_pool = args.room / args.pools;
    for i in 0..args.pools {
        client.put_pool(&format!("gang-node-{i}"), &format!("cpu={per_pool}")).await?;
    }
    client.put_queue(QUEUE, &PutQueue::default()).await?;
    let members = args.members;
    let want = u64::from(members);

    let cpu_before = CpuTimes::now();
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut submitters = JoinSet::new();
    for _ in 0..SUBMITTERS.min(args.apps) {
        let (client, next, apps) = (client.clone(), next.clone(), args.apps);
        submitters.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= apps {
                    return Ok::<_, anyhow::Error>(());
                }
                client
                    .submit_app(&submission(i, members))
                    .await
                    .with_context(|| format!("submitting {}", app_id(i)))?;
            }
        });
    }

    let mut runners = JoinSet::new();
    let mut dispatched: BTreeSet<(String, String)> = BTreeSet::new();
    let (mut polls, mut max_gangs, mut max_whole, mut max_held) = (0u64, 0usize, 0usize, 0u64);
    let mut violations = Vec::new();
    let deadline = started + args.timeout;
    let page = PageArgs { limit: Some(1000), cursor: None };
    let (done, completed, final_states) = loop {
        let apps = if args.apps <= 1000 { client.apps_page(&page).await?.apps } else { client.apps().await?.apps };
        polls += 1;
        let at = started.elapsed().as_secs_f64() * 1000.0;
        let (mut gangs, mut whole, mut members_held, mut completed) = (0, 0, 0, 0);
        for app in &apps {
            let count = |state: &str| app.tasks.get(state).copied().unwrap_or(0);
            let held = app.placeholders.len();
            let placed = count("Allocated") + count("Running");
            if held != 0 && held != members as usize {
                violations
                    .push(format!("at {at:.1} ms: {} ({}) holds {held} of {members} placeholders", app.id, app.state));
            }
            if held == 0 && placed > 0 {
                violations.push(format!(
                    "at {at:.1} ms: {} ({}) has {placed} tasks placed without its gang",
                    app.id, app.state
                ));
            }
            // What it holds: placeholders no task took over, and its placed tasks (each on the
            // placeholder it took over).
            let holds = app.placeholders.iter().filter(|p| p.task.is_none()).count() as u64 + placed;
            members_held += holds;
            gangs += usize::from(holds > 0);
            whole += usize::from(holds == want);
            if count("Completed") == want {
                completed += 1;
            }
            if count("Allocated") == 0 {
                continue;
            }
            for task in client.tasks(&app.id).await?.tasks {
                if task.state != "Allocated" || !dispatched.insert((app.id.clone(), task.id.clone())) {
                    continue;
                }
                let (client, run) = (client.clone(), args.run);
                let (app, id) = (app.id.clone(), task.id);
                runners.spawn(async move {
                    let started = client.start_task(&app, &id).await;
                    tokio::time::sleep(run).await;
                    let completed = client.complete_task(&app, &id).await;
                    started.and(completed).with_context(|| format!("running {app}/{id}"))
                });
            }
        }
        max_gangs = max_gangs.max(gangs);
        max_whole = max_whole.max(whole);
        max_held = max_held.max(members_held);
        while let Some(finished) = runners.try_join_next() {
            finished??;
        }
        if apps.len() == args.apps && completed == args.apps {
            let mut states = BTreeMap::new();
            for app in &apps {
                *states.entry(app.state.clone()).or_default() += 1;
            }
            break (Instant::now(), completed, states);
        }
        if Instant::now() > deadline {
            let mut states: BTreeMap<String, usize> = BTreeMap::new();
            for app in &apps {
                *states.entry(format!("{} with {} placeholders", app.state, app.placeholders.len())).or_default() += 1;
            }
            bail!(
                "not every gang completed within {:?} ({completed} of {} did): {states:?}; a deadlock?",
                args.timeout,
                args.apps
            );
        }
        tokio::time::sleep(args.poll).await;
    };
    let cpu = CpuTimes::now().zip(cpu_before).and_then(|(after, before)| before.share_until(&after));
    while let Some(submitted) = submitters.join_next().await {
        submitted??;
    }
    while let Some(finished) = runners.join_next().await {
        finished??;
    }
    let checks = vec![
        Check::at_most("readings of a gang held in part".to_owned(), Some(violations.len() as f64), 0.0),
        Check::at_least("gangs run and completed".to_owned(), Some(completed as f64), args.apps as f64),
        Check::at_most("most members held at once (the room)".to_owned(), Some(max_held as f64), f64::from(args.room)),
        Check::at_most(
            "most whole gangs at once (room / members)".to_owned(),
            Some(max_whole as f64),
            f64::from(args.room / members),
        ),
    ];
    Ok(Output {
        apps: args.apps,
        members,
        room: args.room,
        pools: args.pools,
        run_ms: args.run.as_secs_f64() * 1000.0,
        seconds: done.duration_since(started).as_secs_f64(),
        max_gangs_at_once: max_gangs,
        max_whole_gangs_at_once: max_whole,
        max_members_held: max_held,
        polls,
        violations,
        final_states,
        cpu,
        checks,
    })
}
