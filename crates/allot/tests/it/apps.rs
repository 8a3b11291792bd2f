//! Queues, applications and tasks from the command line against a real daemon: the example
//! application files submitted as YAML and TOML, where tasks run and why one waits, tasks
//! reported started, completed and failed, and files that do not hold an application.

use std::io::Write as _;
use std::process::{Command, Output, Stdio};

use crate::cli::{allot, code};
use crate::support::{data_dir, eventually_blocking, Daemon, ALLOT, PATIENCE};

const ETL_YAML: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/examples/etl.yaml");
const ETL_TOML: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/examples/etl.toml");

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Runs the CLI and asserts it exits 0; its stdout.
#[track_caller]
fn ok(daemon: &Daemon, args: &[&str]) -> String {
    let output = allot(daemon, args);
    assert_eq!(code(&output), 0, "allot {}: {output:?}", args.join(" "));
    stdout(&output)
}

/// `--json` output of a command that exits 0.
#[track_caller]
fn json(daemon: &Daemon, args: &[&str]) -> serde_json::Value {
    let mut args = args.to_vec();
    args.push("--json");
    serde_json::from_str(&ok(daemon, &args)).unwrap()
}

/// Whether `check` holds within [`PATIENCE`].
fn eventually(check: impl FnMut() -> bool) -> bool {
    eventually_blocking(PATIENCE, check)
}

/// The value of `key: value` in a command's details.
#[track_caller]
fn field<'a>(text: &'a str, key: &str) -> &'a str {
    let prefix = format!("{key}:");
    let line = text.lines().find(|line| line.starts_with(&prefix)).unwrap_or_else(|| panic!("no {key}:\n{text}"));
    line[prefix.len()..].trim()
}

/// The table row that starts with `first` (the header excepted).
#[track_caller]
fn row<'a>(table: &'a str, first: &str) -> &'a str {
    table
        .lines()
        .find(|line| line.split_whitespace().next() == Some(first))
        .unwrap_or_else(|| panic!("no row {first}:\n{table}"))
}

#[tokio::test]
async fn the_example_application_runs_where_it_fits_and_says_why_it_waits() {
    let (_dir, data) = data_dir();
    let daemon = tokio::task::spawn_blocking(move || Daemon::start(&data, &[])).await.unwrap();
    tokio::task::spawn_blocking(move || {
        let d = &daemon;
        // What the example needs (its comments say so).
        let set = ok(d, &["queue", "set", "root.analytics.etl", "--max", "cpu=8,mem=32GiB"]);
        assert_eq!(set, "created queue root.analytics.etl (max cpu=8,mem=32GiB, sort fifo)\n");
        let pool =
            ok(d, &["pool", "set", "worker-1", "cpu=16,mem=64GiB", "--label", "zone=eu-1", "--label", "disk=ssd"]);
        assert_eq!(pool, "created pool worker-1 with capacity cpu=16,mem=64GiB, labels disk=ssd,zone=eu-1\n");
        assert_eq!(field(&ok(d, &["pool", "get", "worker-1"]), "labels"), "disk=ssd,zone=eu-1");
        ok(d, &["quota", "set", "db:warehouse", "2"]);

        let submitted = ok(d, &["app", "submit", ETL_YAML]);
        assert!(
            submitted.starts_with("submitted app etl-nightly to queue root.analytics.etl (3 tasks: "),
            "{submitted}"
        );
        // The TOML file is the same application: the daemon answers it as already submitted.
        let again = ok(d, &["app", "submit", ETL_TOML]);
        assert!(again.starts_with("app etl-nightly was already submitted with this content"), "{again}");

        // The queue's max (cpu=8) takes extract (cpu=2) and transform (cpu=4); load (cpu=4) waits.
        let placed = eventually(|| {
            let app = json(d, &["app", "show", "etl-nightly"]);
            app["app"]["tasks"]["Allocated"] == 2 && app["app"]["tasks"]["Pending"] == 1
        });
        assert!(placed, "{}", ok(d, &["app", "show", "etl-nightly"]));
        let shown = ok(d, &["app", "show", "etl-nightly"]);
        assert_eq!((field(&shown, "queue"), field(&shown, "user")), ("root.analytics.etl", "alice"), "{shown}");
        assert_eq!(field(&shown, "tags"), "schedule=nightly,team=data", "{shown}");
        assert_eq!(field(&shown, "tasks"), "3 tasks: 2 Allocated, 1 Pending", "{shown}");
        for task in ["extract", "transform"] {
            let line = row(&shown, task);
            assert!(line.contains(" Allocated ") && line.contains(" worker-1/"), "{task} runs on worker-1:\n{shown}");
        }
        let load = row(&shown, "load");
        assert!(load.contains(" Pending ") && load.contains("db:warehouse=1"), "{shown}");
        assert!(
            load.contains("queue `root.analytics.etl` would go over its max of cpu=8 (cpu=6 used, cpu=4 more wanted)"),
            "why load waits:\n{shown}"
        );
        let waiting = ok(d, &["task", "show", "etl-nightly", "load"]);
        assert_eq!(field(&waiting, "runs on"), "-", "{waiting}");
        assert!(field(&waiting, "waiting").ends_with("more wanted) (queue_limit)"), "{waiting}");

        let list = ok(d, &["app", "list"]);
        assert!(list.starts_with("APP"), "{list}");
        let app_row = row(&list, "etl-nightly");
        assert!(app_row.contains("root.analytics.etl") && app_row.contains("alice"), "{list}");
        assert!(app_row.contains("2 Allocated, 1 Pending"), "{list}");
        let queues = ok(d, &["queue", "list"]);
        let queue_row: Vec<&str> = row(&queues, "root.analytics.etl").split_whitespace().collect();
        assert_eq!(queue_row, ["root.analytics.etl", "cpu=6,mem=12GiB", "cpu=8,mem=32GiB", "-", "1", "1", "1", "fifo"]);
        assert_eq!(json(d, &["queue", "show", "root.analytics.etl"])["used"], "cpu=6,mem=12GiB");

        // extract runs and completes: its room goes to load, which also takes its token.
        let started = ok(d, &["task", "start", "etl-nightly", "extract"]);
        assert!(started.starts_with("started task etl-nightly/extract: Running on worker-1/"), "{started}");
        let completed = ok(d, &["task", "complete", "etl-nightly", "extract"]);
        assert_eq!(completed, "completed task etl-nightly/extract: Completed\n");
        assert!(
            eventually(|| json(d, &["task", "show", "etl-nightly", "load"])["state"] == "Allocated"),
            "load was never placed: {}",
            ok(d, &["task", "show", "etl-nightly", "load"])
        );
        let load = ok(d, &["task", "show", "etl-nightly", "load"]);
        assert!(field(&load, "runs on").starts_with("worker-1/"), "{load}");
        assert!(field(&load, "held tokens").starts_with("db:warehouse=1 (token "), "{load}");
        // Placed on a pool no daemon runs: a task without a type is run by whoever reads its
        // alloc (here the test), so nothing is said to wait for.
        assert_eq!(field(&load, "waiting"), "-", "{load}");
        let extract = ok(d, &["task", "show", "etl-nightly", "extract"]);
        assert!(field(&extract, "ran on").starts_with("worker-1/"), "where it ran: {extract}");
        assert_eq!(field(&extract, "spec"), r#"{"args":["--date","2024-06-01"],"image":"etl/extract:1.4"}"#);

        // A task from the command line: the queue is full again (transform 4 + load 4).
        let added = ok(
            d,
            &[
                "task",
                "add",
                "etl-nightly",
                "--id",
                "report",
                "--resources",
                "cpu=1",
                "--priority",
                "-1",
                "--tokens",
                "db:warehouse=1",
                "--selector",
                "zone=eu-1",
                "--spec",
                r#"{"to": "ops"}"#,
            ],
        );
        assert!(added.starts_with("added task etl-nightly/report ("), "{added}");
        let report = json(d, &["task", "show", "etl-nightly", "report"]);
        assert_eq!((report["priority"].clone(), report["spec"]["to"].clone()), (serde_json::json!(-1), "ops".into()));
        assert_eq!(report["tokens"], serde_json::json!([{"namespace": "db:warehouse", "units": 1}]));
        assert!(
            eventually(|| json(d, &["task", "show", "etl-nightly", "report"])["waiting"]["code"] == "queue_limit"),
            "{}",
            ok(d, &["task", "show", "etl-nightly", "report"])
        );
        let failed = ok(d, &["task", "fail", "etl-nightly", "transform", "--reason", "out of memory"]);
        assert!(failed.starts_with("failed task etl-nightly/transform: Failed"), "{failed}");
        assert!(eventually(|| json(d, &["task", "show", "etl-nightly", "report"])["state"] == "Allocated"));
        assert_eq!(ok(d, &["-q", "task", "list", "etl-nightly"]), "extract\nload\nreport\ntransform\n");

        // Removing the application releases everything it holds.
        let removed = ok(d, &["app", "remove", "etl-nightly"]);
        assert!(removed.starts_with("removed app etl-nightly: "), "{removed}");
        let gone = allot(d, &["app", "show", "etl-nightly"]);
        assert_eq!(code(&gone), 1, "{gone:?}");
        assert!(stderr(&gone).starts_with("error: app_not_found: "), "{gone:?}");
        assert_eq!(json(d, &["queue", "show", "root.analytics.etl"])["used"], "");
        assert_eq!(json(d, &["quota", "get", "db:warehouse"])["granted_units"], 0);
        assert_eq!(ok(d, &["queue", "remove", "root.analytics.etl"]), "removed queue root.analytics.etl\n");
        // A pool set again keeps its labels unless told otherwise.
        let kept = ok(d, &["pool", "set", "worker-1", "cpu=8,mem=64GiB"]);
        assert_eq!(kept, "set pool worker-1 with capacity cpu=8,mem=64GiB, labels disk=ssd,zone=eu-1\n");
        assert_eq!(
            ok(d, &["pool", "set", "worker-1", "cpu=8", "--clear-labels"]),
            "set pool worker-1 with capacity cpu=8\n"
        );
        assert_eq!(json(d, &["pool", "get", "worker-1"])["labels"], serde_json::json!({}));
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn an_application_completes_or_fails_and_names_its_gang() {
    let (_dir, data) = data_dir();
    let daemon = tokio::task::spawn_blocking(move || Daemon::start(&data, &["--pool", "w=cpu=4"])).await.unwrap();
    tokio::task::spawn_blocking(move || {
        let d = &daemon;
        ok(d, &["queue", "set", "root.batch", "--max-apps", "1", "--sort", "priority"]);
        let gang = "id: gang\nqueue: root.batch\ntask_groups:\n  - name: workers\n    min_members: 2\n    \
                    min_resources: cpu=1\npolicy:\n  gang: Hard\ntasks:\n  - id: w1\n    resources: cpu=1\n    \
                    group: workers\n";
        let submitted = submit_stdin(d, gang);
        assert_eq!(code(&submitted), 0, "{submitted:?}");
        // Two placeholders are reserved; w1 takes one over, the other waits for a second member.
        assert!(eventually(|| json(d, &["app", "show", "gang"])["app"]["placeholders"].as_array().unwrap().len() == 2));
        let shown = ok(d, &["app", "show", "gang"]);
        assert_eq!((field(&shown, "task groups"), field(&shown, "gang")), ("workers (2 × cpu=1)", "Hard"), "{shown}");
        assert!(field(&shown, "timeout left").ends_with(" (placeholders)"), "{shown}");
        assert_eq!(field(&shown, "placeholders"), "2 held, 1 taken over by tasks", "{shown}");
        let placeholders = &shown[shown.find("PLACEHOLDER").expect("a table of placeholders")..];
        assert!(
            row(placeholders, "workers#1").contains(" w/") && row(placeholders, "workers#2").contains(" w/"),
            "{shown}"
        );
        // One running application at most: the next one waits for the queue.
        let second = submit_stdin(d, "id: second\nqueue: root.batch\ntasks:\n  - id: t\n    resources: cpu=1\n");
        assert_eq!(code(&second), 0, "{second:?}");
        assert!(eventually(|| json(d, &["app", "show", "second"])["tasks"][0]["waiting"]["code"] == "queue_limit"));
        let list = ok(d, &["queue", "list"]);
        assert!(row(&list, "root.batch").contains(" 1/1 "), "running apps of the max: {list}");

        let failed = ok(d, &["app", "fail", "gang", "--reason", "cancelled by alice"]);
        assert!(failed.starts_with("failed app gang: ") && failed.ends_with("(cancelled by alice)\n"), "{failed}");
        assert!(eventually(|| json(d, &["app", "show", "second"])["tasks"][0]["state"] == "Allocated"));
        let completed = ok(d, &["app", "complete", "second"]);
        assert!(completed.starts_with("completed app second: "), "{completed}");
        let ended = allot(d, &["app", "complete", "second"]);
        assert_eq!(code(&ended), 1, "{ended:?}");
        assert!(stderr(&ended).starts_with("error: app_ended: "), "{ended:?}");
        assert_eq!(ok(d, &["-q", "app", "list"]), "gang\nsecond\n");
    })
    .await
    .unwrap();
}

/// `allot app submit -` with `yaml` on stdin.
fn submit_stdin(daemon: &Daemon, yaml: &str) -> Output {
    let mut child = Command::new(ALLOT)
        .args(["app", "submit", "-"])
        .env("ALLOT_SERVER", &daemon.url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(yaml.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

#[tokio::test]
async fn a_file_that_is_not_an_application_names_the_file_the_place_and_the_field() {
    let (dir, data) = data_dir();
    let daemon = tokio::task::spawn_blocking(move || Daemon::start(&data, &["--pool", "w=cpu=4"])).await.unwrap();
    tokio::task::spawn_blocking(move || {
        let d = &daemon;
        ok(d, &["queue", "set", "root.etl"]);
        let example = std::fs::read_to_string(ETL_YAML).unwrap().replace("root.analytics.etl", "root.etl");
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path.to_str().unwrap().to_owned()
        };
        let refused = |args: &[&str], exit: i32| {
            let output = allot(d, args);
            assert_eq!(code(&output), exit, "{output:?}");
            assert!(output.stdout.is_empty(), "{output:?}");
            stderr(&output)
        };

        // A wrong type: priority is a number.
        let wrong = write("wrong.yaml", &example.replace("priority: 0", "priority: high"));
        let err = refused(&["app", "submit", &wrong], 1);
        assert!(
            err.starts_with(&format!("error: {wrong}:38:15: tasks[2].priority: invalid type: string \"high\"")),
            "{err}"
        );
        // An unknown field, in TOML.
        let toml = std::fs::read_to_string(ETL_TOML)
            .unwrap()
            .replace("[[tasks]]\nid = \"transform\"\nresources", "[[tasks]]\nid = \"transform\"\nresorces");
        let unknown = write("unknown.toml", &toml);
        let err = refused(&["app", "submit", &unknown], 1);
        let expected = format!("error: {unknown}:29:1: tasks[1].resorces: unknown field `resorces`, expected one of");
        assert!(err.starts_with(&expected), "{err}");
        // A missing field, on stdin.
        let missing = submit_stdin(d, "id: a\nqueue: root.etl\ntasks:\n  - id: t1\n    resources: cpu=1\n  - id: t2\n");
        assert_eq!(code(&missing), 1, "{missing:?}");
        assert!(stderr(&missing).starts_with("error: <stdin>:6:5: tasks[1]: missing field `resources`"), "{missing:?}");
        // Well formed, but resources that are not resources: checked before the daemon is asked.
        let lots = write("lots.yml", &example.replace("cpu=4,mem=8GiB", "cpu=lots"));
        let err = refused(&["app", "submit", &lots], 1);
        assert!(err.starts_with(&format!("error: {lots}: tasks[1].resources: ")), "{err}");
        // A name that tells no format, and no file at all.
        let json = write("app.json", "{}");
        let err = refused(&["app", "submit", &json], 2);
        assert!(err.contains("end it in .yaml, .yml or .toml"), "{err}");
        let err = refused(&["app", "submit", "/nonexistent/etl.yaml"], 1);
        assert!(err.starts_with("error: /nonexistent/etl.yaml: "), "{err}");
        // What only the daemon knows: the token namespace does not exist.
        let err = refused(&["app", "submit", ETL_YAML], 1);
        assert!(
            err.starts_with("error: queue_not_found: ") || err.starts_with("error: namespace_not_found: "),
            "{err}"
        );
        // Flags that make no sense are usage errors.
        let err = refused(&["task", "add", "a", "--id", "t", "--resources", "cpu=1", "--tokens", "db"], 2);
        assert!(err.contains("NAMESPACE=UNITS"), "{err}");
        let err = refused(&["task", "add", "a", "--id", "t", "--resources", "cpu=1", "--spec", "{"], 2);
        assert!(err.contains("not JSON"), "{err}");
        let err = refused(&["queue", "set", "root.etl", "--sort", "lifo"], 2);
        assert!(err.contains("fifo"), "{err}");
        // Nothing was submitted.
        assert_eq!(ok(d, &["app", "list"]), "no apps\n");
    })
    .await
    .unwrap();
}
