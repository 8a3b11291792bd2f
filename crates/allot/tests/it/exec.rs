//! A daemon that runs the tasks placed on its pool: submitted tasks run with their plugins
//! (`noop`, `sleep`) and are reported Completed; a task whose type no plugin runs fails, with
//! the reason.

use std::collections::BTreeMap;
use std::time::Duration;

use allot_client::{AddTask, SubmitApp};

use crate::support::{data_dir, eventually, Daemon};

pub(crate) fn task(id: &str, spec: serde_json::Value) -> AddTask {
    AddTask {
        preemptable: None,
        priority_class: None,
        id: id.to_owned(),
        resources: "cpu=1".to_owned(),
        tokens: Vec::new(),
        group: None,
        priority: Default::default(),
        selector: BTreeMap::new(),
        spec: Some(spec),
        retries: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_runs_the_tasks_placed_on_its_pool() {
    let (_dir, data) = data_dir();
    let daemon = Daemon::start(&data, &["--pool", "w=cpu=2", "--run-pool", "w"]);
    let client = daemon.client();
    client.put_queue("root.run", &Default::default()).await.unwrap();
    let app = SubmitApp {
        priority: None,
        priority_class: None,
        id: "run-1".to_owned(),
        queue: Some("root.run".to_owned()),
        user: "me".to_owned(),
        user_groups: Vec::new(),
        tags: BTreeMap::new(),
        task_groups: Vec::new(),
        policy: Default::default(),
        tasks: vec![
            task("quick", serde_json::json!({ "type": "noop" })),
            task("nap", serde_json::json!({ "type": "sleep", "seconds": 0.3 })),
            task("later", serde_json::json!({ "type": "sleep", "seconds": 0.1 })),
        ],
    };
    // A type no daemon runs is refused at once, naming the task, and nothing is left behind.
    let odd = SubmitApp { tasks: vec![task("odd", serde_json::json!({ "type": "teleport" }))], ..app.clone() };
    let refused = client.submit_app(&odd).await.unwrap_err().to_string();
    assert!(
        refused.contains("409") && refused.contains("task_type_unknown") && refused.contains("task `odd`"),
        "{refused}"
    );
    assert!(refused.contains("no daemon runs tasks of type `teleport`"), "{refused}");
    assert!(client.app("run-1").await.is_err(), "a refused submission leaves nothing");
    client.submit_app(&app).await.unwrap();
    // Room for two at a time: the others run as the first ones end and free their allocs.
    let ended = eventually(Duration::from_secs(20), async || {
        let tasks = client.tasks("run-1").await.unwrap().tasks;
        tasks.iter().all(|t| t.state == "Completed" || t.state == "Failed")
    })
    .await;
    let tasks = client.tasks("run-1").await.unwrap().tasks;
    assert!(ended, "every task ended: {tasks:?}");
    let states: BTreeMap<&str, &str> = tasks.iter().map(|t| (t.id.as_str(), t.state.as_str())).collect();
    assert_eq!(states, BTreeMap::from([("later", "Completed"), ("nap", "Completed"), ("quick", "Completed")]));
    // The runs, over the API and the CLI: the phase timeline of each task.
    let nap = client.task_run("run-1", "nap").await.unwrap();
    let phases: Vec<&str> = nap.events.iter().map(|e| e.phase.as_str()).collect();
    assert_eq!(phases, ["NotReady", "Running", "Success"]);
    assert_eq!((nap.stage.as_str(), nap.ending.as_deref()), ("ended", Some("succeeded")));
    // A run's end is in the store (where the test saw it) a moment before the executor lets the
    // run go: its gauge follows.
    let idle =
        eventually(Duration::from_secs(5), async || client.metrics().await.unwrap().contains("allot_runs_active 0"))
            .await;
    assert!(idle, "the executor lets its runs go");
    let metrics = client.metrics().await.unwrap();
    let line = "allot_runs_ended_total{result=\"succeeded\"} 3";
    assert!(metrics.contains(line), "{line}\n{metrics}");
    let missing = client.task_run("run-1", "nope").await.unwrap_err();
    assert!(missing.to_string().contains("task_not_found"), "{missing}");
    let output = std::process::Command::new(crate::support::ALLOT)
        .args(["--server", &format!("http://{}", daemon.address()), "task", "events", "run-1", "nap"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success() && text.contains("Success") && text.contains("succeeded"), "{text}");
}

const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples");

/// `allot app submit --follow` on the examples: it submits, follows the application to its end and prints a
/// summary; a task that fails makes it exit non-zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allot_run_takes_the_examples_to_their_end() {
    let (_dir, data) = data_dir();
    let config = format!("{EXAMPLES}/allot.toml");
    let daemon = Daemon::start(&data, &["--config", &config, "--pool", "worker=cpu=4", "--run-pool", "worker"]);
    let server = format!("http://{}", daemon.address());
    let run = |file: &str| {
        std::process::Command::new(crate::support::ALLOT)
            .args(["app", "submit", "--follow", file, "--server", &server, "--poll", "50ms"])
            .output()
            .unwrap()
    };
    let output = run(&format!("{EXAMPLES}/hello.yaml"));
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(text.contains("app hello: Completed"), "{text}");
    for task in ["greet", "think", "nothing"] {
        assert!(text.lines().any(|l| l.starts_with(task) && l.contains("Completed")), "{task}: {text}");
    }
    let nothing = text.lines().find(|l| l.starts_with("nothing")).unwrap();
    assert!(nothing.contains("miss"), "its outputs are kept for reuse: {nothing}");
    let client = daemon.client();
    assert_eq!(client.app("hello").await.unwrap().state, "Completed");
    let greet = client.task_run("hello", "greet").await.unwrap();
    assert_eq!(greet.outputs, Some(serde_json::json!({ "greeted": true })));
    // A task that fails: the application fails, and so does `allot app submit --follow`.
    let failing = data.parent().unwrap().join("failing.yaml");
    std::fs::write(
        &failing,
        "id: failing\nqueue: root.examples\nuser: me\ntasks:\n  - id: bad\n    resources: cpu=1\n    spec: {type: shell, command: 'exit 4'}\n",
    )
    .unwrap();
    let output = run(failing.to_str().unwrap());
    let text = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(text.contains("app failing: Failed") && text.contains("exit_4"), "{text}");
}

/// The Python agent of `examples/agent`, on a free port; killed when dropped.
struct Agent {
    child: std::process::Child,
    url: String,
}

impl Agent {
    fn start() -> Agent {
        use std::io::BufRead;
        let mut child = std::process::Command::new("python3")
            .args([&format!("{EXAMPLES}/agent/agent.py"), "--port", "0"])
            // The agent is written on the Python package's plugin kit.
            .env("PYTHONPATH", concat!(env!("CARGO_MANIFEST_DIR"), "/../../clients/python"))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs the example agent (install Python 3: apt-get install python3)");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let url = line.trim().strip_prefix("listening on ").expect("the agent says where it listens").to_owned();
        Agent { child, url }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plugin written in Python, served by another process (`external`): `allot app submit --follow` takes the
/// example application to its end, with the outputs the agent computed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_plugin_written_in_python_runs_its_tasks() {
    let agent = Agent::start();
    let (_dir, data) = data_dir();
    let example = std::fs::read_to_string(format!("{EXAMPLES}/agent/allot.toml")).unwrap();
    let config = data.parent().unwrap().join("allot.toml");
    std::fs::write(&config, example.replace("http://127.0.0.1:8000", &agent.url)).unwrap();
    let daemon =
        Daemon::start(&data, &["--config", config.to_str().unwrap(), "--pool", "worker=cpu=4", "--run-pool", "worker"]);
    let output = std::process::Command::new(crate::support::ALLOT)
        .args([
            "app",
            "submit",
            "--follow",
            &format!("{EXAMPLES}/agent/wordcount.yaml"),
            "--server",
            &daemon.url,
            "--poll",
            "50ms",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}\n{}", String::from_utf8_lossy(&output.stderr));
    let client = daemon.client();
    for (task, words) in [("short", 4), ("longer", 8), ("third", 3)] {
        let run = client.task_run("wordcount", task).await.unwrap();
        assert_eq!(run.outputs, Some(serde_json::json!({ "words": words })), "{task}");
    }
    let quota = client.namespace("wordcount:jobs").await.unwrap();
    assert_eq!((quota.quota, quota.granted_units), (2, 0), "the agent's quota is made, and nothing is left held");
}

/// `allot task logs --follow` prints a shell task's output as it is written and stops when the
/// attempt ends; without `--follow` it prints what there is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_logs_follow_a_running_shell_task_to_its_end() {
    let (_dir, data) = data_dir();
    let daemon = Daemon::start(&data, &["--pool", "w=cpu=2", "--run-pool", "w"]);
    let client = daemon.client();
    client.put_queue("root.logs", &Default::default()).await.unwrap();
    let command = "for i in 1 2 3 4 5; do echo line $i; sleep 0.2; done; echo oops >&2";
    let app = SubmitApp {
        priority: None,
        priority_class: None,
        id: "logs".to_owned(),
        queue: Some("root.logs".to_owned()),
        user: "me".to_owned(),
        user_groups: Vec::new(),
        tags: BTreeMap::new(),
        task_groups: Vec::new(),
        policy: Default::default(),
        tasks: vec![task("talk", serde_json::json!({ "type": "shell", "command": command }))],
    };
    client.submit_app(&app).await.unwrap();
    let logs = |args: &[&str]| {
        let mut all = vec!["--server", &daemon.url, "task", "logs", "logs", "talk"];
        all.extend_from_slice(args);
        std::process::Command::new(crate::support::ALLOT).args(all).output().unwrap()
    };
    let running = eventually(Duration::from_secs(10), async || {
        client.task_run("logs", "talk").await.is_ok_and(|r| r.phase == "Running")
    })
    .await;
    assert!(running, "the task runs");
    let followed = logs(&["--follow"]);
    let text = String::from_utf8_lossy(&followed.stdout);
    assert!(followed.status.success(), "{text}\n{}", String::from_utf8_lossy(&followed.stderr));
    assert_eq!(text, "line 1\nline 2\nline 3\nline 4\nline 5\n", "every line, once, in order");
    // It stopped because the attempt ended: the run is over by then.
    let run = client.task_run("logs", "talk").await.unwrap();
    assert_ne!(run.phase, "Running", "--follow stopped while the task still ran");
    let stderr = logs(&["--stream", "stderr"]);
    assert_eq!(String::from_utf8_lossy(&stderr.stdout), "oops\n");
    // With --json, a line of JSON per piece read, the last saying the attempt ended.
    let json = logs(&["--json"]);
    assert!(json.status.success(), "{}", String::from_utf8_lossy(&json.stderr));
    let pieces: Vec<serde_json::Value> =
        String::from_utf8_lossy(&json.stdout).lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    let text: String = pieces.iter().map(|piece| piece["text"].as_str().unwrap()).collect();
    assert_eq!(text, "line 1\nline 2\nline 3\nline 4\nline 5\n", "{pieces:?}");
    let last = pieces.last().unwrap();
    assert_eq!(
        (last["ended"].as_bool(), last["stream"].as_str(), last["attempt"].as_u64()),
        (Some(true), Some("stdout"), Some(1))
    );
    assert_eq!(last["next_offset"].as_u64(), Some(text.len() as u64), "{last}");
    let missing = logs(&["--stream", "nope"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("logs_not_found"));
}

/// The logs route reads only files the daemon keeps for the run: a command that swaps its log for
/// a symbolic link to another file, or a FIFO, gets `logs_not_found`, never the file; an offset no
/// file can reach is a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_logs_never_read_a_file_outside_the_runs_directory() {
    let (dir, data) = data_dir();
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, "the daemon's secret\n").unwrap();
    let daemon = Daemon::start(&data, &["--pool", "w=cpu=2", "--run-pool", "w"]);
    let client = daemon.client();
    client.put_queue("root.logs", &Default::default()).await.unwrap();
    let swap =
        format!("echo mine; rm stdout.log; ln -s {} stdout.log; rm stderr.log; mkfifo stderr.log", secret.display());
    let app = SubmitApp {
        priority: None,
        priority_class: None,
        id: "swap".to_owned(),
        queue: Some("root.logs".to_owned()),
        user: "me".to_owned(),
        user_groups: Vec::new(),
        tags: BTreeMap::new(),
        task_groups: Vec::new(),
        policy: Default::default(),
        tasks: vec![task("t", serde_json::json!({ "type": "shell", "command": swap }))],
    };
    client.submit_app(&app).await.unwrap();
    let ended = eventually(Duration::from_secs(20), async || {
        client.task_run("swap", "t").await.is_ok_and(|r| r.phase == "Success")
    })
    .await;
    assert!(ended, "the task ran: {:?}", client.task_run("swap", "t").await);
    for stream in ["stdout", "stderr"] {
        let answer = reqwest::get(format!("{}/v1/apps/swap/tasks/t/logs?stream={stream}", daemon.url)).await.unwrap();
        let status = answer.status();
        let body = answer.text().await.unwrap();
        assert_eq!(status, 404, "{stream}: {body}");
        assert!(body.contains("logs_not_found") && !body.contains("daemon's secret"), "{stream}: {body}");
    }
    let far =
        reqwest::get(format!("{}/v1/apps/swap/tasks/t/logs?offset=18446744073709551615", daemon.url)).await.unwrap();
    assert_eq!(far.status(), 400);
    assert!(far.text().await.unwrap().contains("invalid_argument"));
}

/// A task with a type is placed only on a pool that a live executor runs with that type; one
/// that only a pool no daemon runs would take waits, and says so; a task without a type (run by
/// an outside worker that reads its alloc) goes there. The pools say who runs them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_with_a_type_goes_only_to_a_pool_a_daemon_runs() {
    let (_dir, data) = data_dir();
    let daemon = Daemon::start(&data, &["--pool", "idle=cpu=4", "--pool", "w=cpu=1", "--run-pool", "w"]);
    let client = daemon.client();
    client.put_queue("root.wait", &Default::default()).await.unwrap();
    let zone: BTreeMap<String, String> = [("zone".to_owned(), "a".to_owned())].into();
    client.put_pool_with_labels("idle", "cpu=4", zone.clone()).await.unwrap();
    let pools = client.pools().await.unwrap().pools;
    let run_by: BTreeMap<&str, Option<Vec<String>>> =
        pools.iter().map(|p| (p.name.as_str(), p.run_by.clone())).collect();
    assert_eq!(run_by, BTreeMap::from([("idle", Some(vec![])), ("w", Some(vec![daemon.url.clone()]))]));
    let list = allot(&daemon.url, &["pool", "list"]);
    let list = String::from_utf8_lossy(&list.stdout);
    assert!(list.lines().any(|l| l.starts_with("idle") && l.contains("no daemon")), "{list}");
    let show = allot(&daemon.url, &["pool", "show", "idle"]);
    let show = String::from_utf8_lossy(&show.stdout);
    assert!(
        show.contains("no daemon (tasks with a type are not placed here; start one with --run-pool idle)"),
        "{show}"
    );
    // Best fit would take `idle` for both; the typed one goes to `w`, the other to `idle`.
    let typed = task("typed", serde_json::json!({ "type": "noop" }));
    // Too large for `w`: best fit takes `idle`, which no daemon runs (an outside worker does).
    let mut outside = task("outside", serde_json::json!({ "image": "x" }));
    outside.spec = None;
    outside.resources = "cpu=2".to_owned();
    let mut stranded = task("stranded", serde_json::json!({ "type": "noop" }));
    stranded.selector = zone;
    let app = SubmitApp {
        priority: None,
        priority_class: None,
        id: "elsewhere".to_owned(),
        queue: Some("root.wait".to_owned()),
        user: "me".to_owned(),
        user_groups: Vec::new(),
        tags: BTreeMap::new(),
        task_groups: Vec::new(),
        policy: Default::default(),
        tasks: vec![outside, stranded],
    };
    client.submit_app(&app).await.unwrap();
    client.add_task("elsewhere", &typed).await.unwrap();
    let placed = eventually(Duration::from_secs(10), async || {
        let tasks = client.tasks("elsewhere").await.unwrap().tasks;
        let state = |id: &str| tasks.iter().find(|t| t.id == id).map(|t| t.state.clone()).unwrap_or_default();
        state("outside") == "Allocated" && state("typed") != "Pending" && state("typed") != "New"
    })
    .await;
    assert!(placed, "{:?}", client.tasks("elsewhere").await);
    let pool_of = |t: allot_api::Task| t.placement.map(|p| p.pool).unwrap_or_default();
    assert_eq!(pool_of(client.task("elsewhere", "outside").await.unwrap()), "idle");
    assert_eq!(pool_of(client.task("elsewhere", "typed").await.unwrap()), "w");
    let stranded = client.task("elsewhere", "stranded").await.unwrap();
    assert_eq!(stranded.state, "Pending");
    let waiting = stranded.waiting.expect("it says why it waits");
    assert_eq!(waiting.code, "not_run");
    assert_eq!(
        waiting.message,
        "the task has a type, and no daemon runs pool `idle`, which would take it: start one with --run-pool idle"
    );
    // The application says so too (`allot app list`'s WAITING, the dashboard's overview).
    let app = client.app("elsewhere").await.unwrap();
    assert_eq!(app.waiting.map(|w| w.code).as_deref(), Some("not_run"), "{:?}", app.state);
    let list = allot(&daemon.url, &["app", "list"]);
    let list = String::from_utf8_lossy(&list.stdout);
    assert!(list.lines().any(|l| l.starts_with("elsewhere") && l.contains("not_run")), "{list}");
}

/// Runs `allot ARGS... --server URL`.
fn allot(server: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(crate::support::ALLOT).args(args).args(["--server", server]).output().unwrap()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// The user's story, on the daemon at `server`: `allot app submit --follow examples/hello.yaml`, `allot app
/// remove hello`, `allot app submit --follow examples/hello.yaml` again: the runs went with the application, and
/// the second runs its tasks afresh (new events, the command run again, its log its own); the
/// cache key's parts are in `allot task show`. Then the application, dropped after
/// `app_retention`, takes its runs too.
pub(crate) async fn a_removed_application_takes_its_runs_and_runs_afresh_when_submitted_again(server: &str) {
    let client = allot_client::Client::new(server).unwrap();
    let hello = format!("{EXAMPLES}/hello.yaml");
    let run = || allot(server, &["app", "submit", "--follow", &hello, "--poll", "50ms"]);
    let output = run();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let first = client.task_run("hello", "greet").await.unwrap();
    let output = allot(server, &["app", "remove", "hello"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let removed_at = now_ms();
    let gone = client.task_run("hello", "greet").await.unwrap_err().to_string();
    assert!(gone.contains("app_not_found"), "the run went with its application: {gone}");
    let output = run();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success() && text.contains("app hello: Completed"), "{text}");
    let second = client.task_run("hello", "greet").await.unwrap();
    assert!(second.events.iter().all(|e| e.at_ms >= removed_at), "new events only: {second:?}\nbefore: {first:?}");
    // Started anew, not the first command's end read again from its files.
    assert!(second.events.iter().any(|e| e.phase == "Running" && e.reason == "started"), "{second:?}");
    assert_eq!((second.attempt, second.outputs.clone()), (1, Some(serde_json::json!({ "greeted": true }))));
    let logs = client.task_logs("hello", "greet", None, None, 0).await.unwrap();
    assert_eq!(logs.text.lines().count(), 1, "the command ran again, into a log of its own: {:?}", logs.text);
    // The cached task reuses the outputs the first `nothing` kept (the catalog outlives runs),
    // and says why.
    let output = allot(server, &["task", "show", "hello", "nothing"]);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("hit: the outputs of hello/nothing"), "{text}");
    assert!(text.contains("type noop, plugin noop, cache_version 1, spec sha256:"), "{text}");
    // Dropped after its retention: its runs go too.
    let dropped = eventually(Duration::from_secs(15), async || {
        client.app("hello").await.is_err_and(|e| e.to_string().contains("app_not_found"))
    })
    .await;
    assert!(dropped, "the ended application is dropped after app_retention");
    let gone = client.task_run("hello", "greet").await.unwrap_err().to_string();
    assert!(gone.contains("app_not_found"), "its runs went with it: {gone}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_application_takes_its_runs_on_the_embedded_store() {
    let (dir, data) = data_dir();
    let config = dir.path().join("allot.toml");
    std::fs::write(
        &config,
        "[queues.\"root.examples\"]\n[scheduler]\ncompleting_grace = \"1s\"\napp_retention = \"4s\"\n",
    )
    .unwrap();
    let daemon =
        Daemon::start(&data, &["--config", config.to_str().unwrap(), "--pool", "worker=cpu=4", "--run-pool", "worker"]);
    a_removed_application_takes_its_runs_and_runs_afresh_when_submitted_again(&daemon.url).await;
}

/// The executor follows the change feed: with its periodic list a minute apart (`[executor]
/// scan`), the tasks of an application submitted meanwhile run and end within seconds, the first
/// list at start the only one, also with a watcher buffer of one event (`[watch] buffer`): that
/// bounds the watchers of clients, not the executor's, which is the daemon's own and holds a
/// burst (`WatchConfig::inside_buffer`; a cut under it is tested in `allot-exec`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_executor_runs_tasks_as_the_change_feed_brings_them_not_at_its_periodic_list() {
    for buffer in [4096, 1] {
        let (dir, data) = data_dir();
        let config = dir.path().join("allot.toml");
        let text = format!("[queues.\"root.fed\"]\n[watch]\nbuffer = {buffer}\n[executor]\nscan = \"60s\"\n");
        std::fs::write(&config, text).unwrap();
        let daemon =
            Daemon::start(&data, &["--config", config.to_str().unwrap(), "--pool", "w=cpu=4", "--run-pool", "w"]);
        let client = daemon.client();
        let following = eventually(Duration::from_secs(10), async || {
            client.metrics().await.unwrap().contains("allot_runs_following_feed 1")
        })
        .await;
        assert!(following, "the executor follows the feed");
        let tasks = (0..8).map(|i| task(&format!("t{i}"), serde_json::json!({ "type": "noop" }))).collect();
        let app = SubmitApp {
            priority: None,
            priority_class: None,
            id: "fed".to_owned(),
            queue: Some("root.fed".to_owned()),
            user: "me".to_owned(),
            user_groups: Vec::new(),
            tags: BTreeMap::new(),
            task_groups: Vec::new(),
            policy: Default::default(),
            tasks,
        };
        client.submit_app(&app).await.unwrap();
        // Well within the minute until the next periodic list.
        let ended = eventually(Duration::from_secs(15), async || {
            client.tasks("fed").await.unwrap().tasks.iter().all(|t| t.state == "Completed")
        })
        .await;
        assert!(ended, "buffer {buffer}: every task completed: {:?}", client.tasks("fed").await.unwrap().tasks);
        let metrics = client.metrics().await.unwrap();
        let value = |name: &str| -> u64 {
            let line = metrics.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_default();
            line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{name}: {metrics}"))
        };
        let (lists, cuts) = (value("allot_runs_lists_total"), value("allot_runs_feed_cuts_total"));
        assert_eq!((lists, cuts), (1, 0), "buffer {buffer}: found by the feed, not by a list");
    }
}

/// `retries` of a task (beside its spec, as Flyte's task metadata has them, or in it) give it new
/// attempts after user failures; the daemon's file sets the default; `allot app submit --follow` shows each
/// attempt; a value out of bounds, or two different ones, are refused when submitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_are_configurable_and_each_attempt_shows() {
    let (dir, data) = data_dir();
    let config = dir.path().join("allot.toml");
    std::fs::write(&config, "[queues.\"root.r\"]\n[executor]\nretries = 1\nsystem_retries = 2\n").unwrap();
    let daemon = Daemon::start(&data, &["--config", config.to_str().unwrap(), "--pool", "w=cpu=2", "--run-pool", "w"]);
    // Fails twice, then succeeds (the count is kept beside the attempts' directories).
    let flaky = "n=$(cat ../tries 2>/dev/null || echo 0); n=$((n+1)); echo $n > ../tries; test $n -ge 3";
    let file = dir.path().join("retries.yaml");
    let yaml = format!(
        "id: retries\nqueue: root.r\ntasks:\n  - id: flaky\n    resources: cpu=1\n    retries: 2\n    spec: {{type: shell, command: '{flaky}'}}\n  - id: always\n    resources: cpu=1\n    spec: {{type: shell, command: 'exit 5'}}\n"
    );
    std::fs::write(&file, yaml).unwrap();
    let output = allot(&daemon.url, &["app", "submit", "--follow", file.to_str().unwrap(), "--poll", "50ms"]);
    let text = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "`always` fails: {text}");
    assert!(
        text.contains(
            "flaky: attempt 1: RetryableFailure (user error exit_1), attempt 2: RetryableFailure (user error \
             exit_1), attempt 3: Success"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "always: attempt 1: RetryableFailure (user error exit_5), attempt 2: Failed (retryable failure, no \
             retries left: exit status 5)"
        ),
        "{text}"
    );
    let client = daemon.client();
    assert_eq!(client.task("retries", "flaky").await.unwrap().state, "Completed");
    assert_eq!(client.task_run("retries", "always").await.unwrap().attempt, 2, "the file's default: one retry");
    // Out of bounds: refused by the file's check and by the API, with the field.
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "id: bad\nqueue: root.r\ntasks:\n  - id: t\n    resources: cpu=1\n    spec: {type: shell, command: 'true', retries: 101}\n").unwrap();
    let output = allot(&daemon.url, &["app", "submit", bad.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && err.contains("tasks[0].spec.retries must be a whole number from 0 to 100"),
        "{err}"
    );
    let negative = task("t", serde_json::json!({ "type": "shell", "command": "true", "retries": -1 }));
    let refused = client.add_task("retries", &negative).await.unwrap_err();
    assert_eq!(refused.code(), Some("invalid_argument"), "{refused}");
    assert!(refused.to_string().contains("retries must be a whole number from 0 to 100"), "{refused}");
    // Beside the spec: kept in it, in the place of any the spec names.
    let app: allot_api::SubmitApp =
        serde_json::from_value(serde_json::json!({"id": "beside", "queue": "root.r"})).unwrap();
    client.submit_app(&app).await.unwrap();
    let spec = serde_json::json!({ "type": "shell", "command": "true", "retries": 3 });
    let mut beside = task("same", spec.clone());
    beside.retries = Some(3);
    let added = client.add_task("beside", &beside).await.unwrap();
    assert_eq!(added.task.spec.as_ref().unwrap()["retries"], 3, "{added:?}");
    let mut twice = task("twice", spec);
    twice.retries = Some(4);
    let added = client.add_task("beside", &twice).await.unwrap();
    assert_eq!(added.task.spec.as_ref().unwrap()["retries"], 4, "beside the spec wins: {added:?}");
    let mut over = task("over", serde_json::json!({ "type": "shell", "command": "true" }));
    over.retries = Some(101);
    let refused = client.add_task("beside", &over).await.unwrap_err();
    assert_eq!(refused.code(), Some("invalid_argument"), "{refused}");
}

/// A plugin's quota is the daemon's configuration: changed in the file, it holds after a
/// restart, and the change is logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugins_quota_follows_the_daemons_file_across_a_restart() {
    let (dir, data) = data_dir();
    let config = dir.path().join("allot.toml");
    let start = |jobs: u64| {
        std::fs::write(&config, format!("[plugins]\nhttp_jobs = {jobs}\n")).unwrap();
        Daemon::start(&data, &["--config", config.to_str().unwrap(), "--pool", "w=cpu=1", "--run-pool", "w"])
    };
    let daemon = start(2);
    assert_eq!(daemon.client().namespace("http:jobs").await.unwrap().quota, 2);
    assert!(daemon.terminate().success());
    let daemon = start(5);
    assert_eq!(daemon.client().namespace("http:jobs").await.unwrap().quota, 5, "the file's new value holds");
    let log = std::fs::read_to_string(data.with_extension("log")).unwrap();
    let line = log.lines().find(|l| l.contains("plugin quota changed")).unwrap_or_else(|| panic!("{log}"));
    assert!(line.contains("was=2") && line.contains("quota=5"), "{line}");
}

/// An alloc says what runs in it [Reflow: an alloc's execs and their results]: its owner's
/// labels and metadata (given at accept, changed later, in the API and the watch), and for an
/// alloc the scheduler holds, the gang placeholder or the task in it, with the task's run and
/// outputs reachable from the alloc while the alloc is kept (after the task ended too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocs_say_what_runs_in_them() {
    use allot_client::{Accept, AnnotateAlloc, WatchFilter, WatchObject};
    use futures_util::StreamExt;
    use serde_json::json;

    let (_dir, data) = data_dir();
    let daemon = Daemon::start(&data, &["--pool", "w=cpu=2", "--run-pool", "w", "--pool", "mine=cpu=2"]);
    let client = daemon.client();
    let filter = WatchFilter { kinds: vec!["alloc.made".into(), "alloc.annotated".into()], prefixes: Vec::new() };
    // From the revision of a list (its `Allot-Revision`), as a watcher resumes.
    let listed = reqwest::get(format!("{}/v1/pools", client.base_url())).await.unwrap();
    let revision = listed.headers()["allot-revision"].to_str().unwrap().parse::<u64>().unwrap();
    let mut events = client.watch(filter, Some(revision));

    // An owner's alloc: labels and metadata at accept, then changed.
    let made = json!({"exec": "e1", "digest": "sha256:ab/cd", "size": 12345678901234_u64});
    let accept = Accept {
        min: "cpu=1".into(),
        labels: [("job".to_owned(), "etl".to_owned())].into(),
        metadata: Some(made.clone()),
        ..Accept::default()
    };
    let alloc = client.accept("mine", "1", &accept).await.unwrap();
    assert_eq!((alloc.metadata.as_ref(), alloc.task.as_ref()), (Some(&made), None));
    let done = json!({"exec": "e1", "exit": 0, "results": ["s3://out/1"]});
    let notes = AnnotateAlloc {
        labels: [("result".to_owned(), "ok".to_owned())].into(),
        remove_labels: vec!["job".into()],
        metadata: Some(Some(done.clone())),
    };
    let changed = client.annotate_alloc("mine", &alloc.id, &notes).await.unwrap();
    assert_eq!(changed.labels, [("result".to_owned(), "ok".to_owned())].into());
    assert_eq!((changed.metadata.as_ref(), changed.expires_in_ms.is_some()), (Some(&done), true));
    assert_eq!(client.alloc("mine", &alloc.id).await.unwrap().metadata, Some(done.clone()));
    // Refused, with nothing changed: allot's own labels, metadata that is not an object or is
    // too large.
    let refusals = [
        AnnotateAlloc { labels: [("allot/task".to_owned(), "t".to_owned())].into(), ..AnnotateAlloc::default() },
        AnnotateAlloc { remove_labels: vec!["allot/app".to_owned()], ..AnnotateAlloc::default() },
        AnnotateAlloc { metadata: Some(Some(json!([1, 2]))), ..AnnotateAlloc::default() },
        AnnotateAlloc { metadata: Some(Some(json!({"x": "y".repeat(17 * 1024)}))), ..AnnotateAlloc::default() },
    ];
    for refused in refusals {
        let err = client.annotate_alloc("mine", &alloc.id, &refused).await.unwrap_err();
        assert_eq!((err.status(), err.code()), (Some(400), Some("invalid_argument")), "{refused:?}: {err}");
    }
    assert_eq!(client.alloc("mine", &alloc.id).await.unwrap().metadata, Some(done.clone()));
    // The watch carried both, with the metadata.
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let event = tokio::time::timeout(Duration::from_secs(30), events.next()).await.unwrap().unwrap().unwrap();
        if let WatchObject::Alloc(watched) = event.object {
            if watched.id == alloc.id {
                seen.push((event.kind, watched.metadata));
            }
        }
    }
    assert_eq!(seen, [("alloc.made".to_owned(), Some(made)), ("alloc.annotated".to_owned(), Some(done))]);
    let none = client.alloc_run("mine", &alloc.id).await.unwrap_err();
    assert_eq!(none.code(), Some("task_not_found"), "{none}");

    // A gang's placeholder: its alloc names it.
    client.put_queue("root.held", &Default::default()).await.unwrap();
    let app: SubmitApp = serde_json::from_value(json!({"id": "held", "queue": "root.held", "user": "me",
        "task_groups": [{"name": "g", "min_members": 1, "min_resources": "cpu=1", "selector": {}}]}))
    .unwrap();
    client.submit_app(&app).await.unwrap();
    let mut held = None;
    let reserved = eventually(Duration::from_secs(20), async || {
        held = client.allocs("w").await.unwrap().allocs.into_iter().find(|a| a.task.is_some());
        held.is_some()
    })
    .await;
    assert!(reserved, "the placeholder is held");
    let held = held.unwrap();
    let holds = held.task.clone().unwrap();
    assert_eq!((holds.app.as_str(), holds.task, holds.placeholder.as_deref()), ("held", None, Some("g#0")));
    let waiting = client.alloc_run("w", &held.id).await.unwrap_err();
    assert!(waiting.code() == Some("task_not_found") && waiting.to_string().contains("placeholder `g#0`"), "{waiting}");
    // A task of the group takes it over: the alloc names the task, and its run and outputs are
    // read from the alloc, live or ended.
    let member =
        AddTask { group: Some("g".to_owned()), ..task("t", json!({ "type": "noop", "inputs": {"answer": 42} })) };
    client.add_task("held", &member).await.unwrap();
    let mut run = None;
    let ran = eventually(Duration::from_secs(20), async || {
        run = client.alloc_run("w", &held.id).await.ok().filter(|r| r.outputs.is_some());
        run.is_some()
    })
    .await;
    assert!(ran, "the task's run is read from its alloc");
    let run = run.unwrap();
    assert_eq!((run.app.as_str(), run.task.as_str(), run.outputs), ("held", "t", Some(json!({"answer": 42}))));
    let now = client.alloc("w", &held.id).await.unwrap();
    let holds = now.task.unwrap();
    assert_eq!((holds.task.as_deref(), holds.placeholder), (Some("t"), None), "the task, not the placeholder");
}

/// A plugin's catalog over HTTP (what an external plugin calls, the Rust client here): reached
/// for a task while it runs on the daemon, keyed by name, version and inputs, the first put
/// staying; a task not running here is `run_not_here`, a name out of bounds a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_tasks_plugin_catalog_is_reached_over_http() {
    use allot_client::{CatalogLookup, CatalogPut};
    use serde_json::json;

    let (_dir, data) = data_dir();
    let daemon = Daemon::start(&data, &["--pool", "w=cpu=2", "--run-pool", "w"]);
    let client = daemon.client();
    client.put_queue("root.cat", &Default::default()).await.unwrap();
    let app: SubmitApp = serde_json::from_value(json!({"id": "cat", "queue": "root.cat", "user": "me",
        "tasks": [{"id": "long", "resources": "cpu=1", "spec": {"type": "sleep", "seconds": 600}}]}))
    .unwrap();
    client.submit_app(&app).await.unwrap();
    let lookup = CatalogLookup { name: "part".into(), version: "1".into(), inputs: json!({"n": 1}) };
    // Until the task's first round, the daemon does not run it yet.
    let found =
        eventually(Duration::from_secs(20), async || client.catalog_lookup("cat", "long", &lookup).await.is_ok()).await;
    assert!(found, "the running task's catalog is reached");
    assert_eq!(client.catalog_lookup("cat", "long", &lookup).await.unwrap().entry, None);
    let put =
        CatalogPut { name: "part".into(), version: "1".into(), inputs: json!({"n": 1}), outputs: json!({"rows": 3}) };
    let kept = client.catalog_put("cat", "long", &put).await.unwrap();
    assert!(kept.created);
    assert_eq!(
        (kept.entry.app.as_str(), kept.entry.task.as_str(), &kept.entry.outputs),
        ("cat", "long", &json!({"rows": 3}))
    );
    let again =
        client.catalog_put("cat", "long", &CatalogPut { outputs: json!({"rows": 4}), ..put.clone() }).await.unwrap();
    assert_eq!((again.created, again.entry.outputs.clone()), (false, json!({"rows": 3})), "the first put stays");
    let found = client.catalog_lookup("cat", "long", &lookup).await.unwrap();
    assert_eq!((found.key, found.entry.map(|e| e.outputs)), (kept.entry.key, Some(json!({"rows": 3}))));
    let other = CatalogLookup { inputs: json!({"n": 2}), ..lookup.clone() };
    assert_eq!(client.catalog_lookup("cat", "long", &other).await.unwrap().entry, None, "other inputs, other entry");
    // Refused: a name out of bounds, a task that does not exist, a task that is not running.
    let long = CatalogLookup { name: "x".repeat(257), ..lookup.clone() };
    let err = client.catalog_lookup("cat", "long", &long).await.unwrap_err();
    assert_eq!((err.status(), err.code()), (Some(400), Some("invalid_argument")), "{err}");
    let err = client.catalog_lookup("cat", "nope", &lookup).await.unwrap_err();
    assert_eq!(err.code(), Some("task_not_found"), "{err}");
    client.remove_app("cat").await.unwrap();
    let gone = eventually(Duration::from_secs(20), async || {
        client.catalog_put("cat", "long", &put).await.is_err_and(|e| e.code() == Some("app_not_found"))
    })
    .await;
    assert!(gone, "no catalog for a task that is gone");
}
