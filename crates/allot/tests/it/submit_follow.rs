//! `allot app submit --follow` (alias `allot run`) as a user in CI meets it (its stderr is a
//! pipe, not a terminal): a line per task state change, a daemon killed with SIGKILL and
//! restarted under it ridden out, and a task that waits long says why, e.g. a pool that no
//! daemon runs.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{data_dir, eventually, Daemon, ALLOT};

const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples");

/// `allot app submit --follow` as a child process, its output collected as it is written.
struct Following {
    child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    /// The threads that read the pipes: they end with them.
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Following {
    fn start(args: &[&str]) -> Following {
        Following::start_as(&["app", "submit", "--follow"], args)
    }

    /// `command` (`app submit --follow`, or its alias `run`) with `args`.
    fn start_as(command: &[&str], args: &[&str]) -> Following {
        let mut child = Command::new(ALLOT)
            .args(command)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start allot app submit --follow");
        let collect = |mut pipe: Box<dyn Read + Send>| {
            let text: Arc<Mutex<String>> = Arc::default();
            let into = text.clone();
            let reader = std::thread::spawn(move || {
                let mut buffer = [0u8; 4096];
                while let Ok(n @ 1..) = pipe.read(&mut buffer) {
                    into.lock().unwrap().push_str(&String::from_utf8_lossy(&buffer[..n]));
                }
            });
            (text, reader)
        };
        let (stdout, out_reader) = collect(Box::new(child.stdout.take().unwrap()));
        let (stderr, err_reader) = collect(Box::new(child.stderr.take().unwrap()));
        Following { child, stdout, stderr, readers: vec![out_reader, err_reader] }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Whether stderr says `text` within `limit`.
    async fn says(&self, text: &str, limit: Duration) -> bool {
        eventually(limit, async || self.stderr().contains(text)).await
    }

    /// Its exit status within `limit` (killed if it has not ended by then), stdout and stderr.
    async fn end(mut self, limit: Duration) -> (Option<ExitStatus>, String, String) {
        let mut status = None;
        let child = &mut self.child;
        eventually(limit, async || {
            status = child.try_wait().unwrap();
            status.is_some()
        })
        .await;
        if status.is_none() {
            // (A `limit` of zero: one look.)
            status = self.child.try_wait().unwrap();
        }
        if status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // The readers end with the pipes.
        for reader in std::mem::take(&mut self.readers) {
            reader.join().unwrap();
        }
        let stdout = self.stdout.lock().unwrap().clone();
        (status, stdout, self.stderr())
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The daemon is killed with SIGKILL while `allot app submit --follow` follows its application,
/// and restarted on the same data and address: it says so, waits, and takes the application to
/// Completed; its progress is a line per task state change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_follow_outlives_a_daemon_restart() {
    let (dir, data) = data_dir();
    let config = format!("{EXAMPLES}/allot.toml");
    let args = ["--config", config.as_str(), "--pool", "worker=cpu=4", "--run-pool", "worker"];
    let daemon = Daemon::start(&data, &args);
    let file = dir.path().join("restart.yaml");
    std::fs::write(
        &file,
        "id: restart\nqueue: root.examples\nuser: me\ntasks:\n  - id: nap\n    resources: cpu=1\n    \
         spec: {type: sleep, seconds: 3}\n  - id: quick\n    resources: cpu=1\n    spec: {type: noop}\n",
    )
    .unwrap();
    let following =
        Following::start(&[file.to_str().unwrap(), "--server", &daemon.url, "--poll", "100ms", "--timeout", "60s"]);
    let client = daemon.client();
    let running = eventually(Duration::from_secs(20), async || {
        client.task("restart", "nap").await.is_ok_and(|t| t.state == "Running")
    });
    assert!(running.await, "the task runs: {}", following.stderr());
    let address = daemon.address();
    daemon.kill9();
    assert!(following.says("note: the daemon at", Duration::from_secs(10)).await, "{}", following.stderr());
    let daemon = Daemon::start_on(&address, &data, &args);
    let (status, stdout, stderr) = following.end(Duration::from_secs(60)).await;
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("app restart: Completed"), "{stdout}\n{stderr}");
    assert!(stderr.contains("answers again after"), "{stderr}");
    for line in ["nap: Running on worker/", "nap: Completed", "quick: Completed"] {
        assert!(stderr.lines().any(|l| l.starts_with('[') && l.contains(line)), "`{line}`: {stderr}");
    }
    assert_eq!(daemon.client().app("restart").await.unwrap().state, "Completed");
}

/// A task with a type that only a pool no daemon runs would take waits: the API, `allot app
/// show` and `allot app submit --follow` (once it has waited a few seconds) say why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_follow_says_why_a_task_waits() {
    let (dir, data) = data_dir();
    let config = format!("{EXAMPLES}/allot.toml");
    let daemon =
        Daemon::start(&data, &["--config", &config, "--pool", "idle=cpu=2", "--pool", "w=cpu=1", "--run-pool", "w"]);
    let file = dir.path().join("lonely.yaml");
    std::fs::write(
        &file,
        "id: lonely\nqueue: root.examples\nuser: me\ntasks:\n  - id: alone\n    resources: cpu=2\n    \
         spec: {type: noop}\n",
    )
    .unwrap();
    let following =
        Following::start(&[file.to_str().unwrap(), "--server", &daemon.url, "--poll", "100ms", "--note-after", "0s"]);
    let reason =
        "the task has a type, and no daemon runs pool `idle`, which would take it: start one with --run-pool idle";
    assert!(following.says(reason, Duration::from_secs(20)).await, "{}", following.stderr());
    let stderr = following.stderr();
    let note = stderr.lines().find(|l| l.contains(reason)).unwrap();
    assert!(note.starts_with("note: task alone waits (waiting "), "{note}");
    let task = daemon.client().task("lonely", "alone").await.unwrap();
    let waiting = task.waiting.expect("the task says why it waits");
    assert_eq!((waiting.code.as_str(), waiting.message.as_str()), ("not_run", reason));
    let show = Command::new(ALLOT).args(["app", "show", "lonely", "--server", &daemon.url]).output().unwrap();
    assert!(String::from_utf8_lossy(&show.stdout).contains(reason), "{}", String::from_utf8_lossy(&show.stdout));
    let (status, _, _) = following.end(Duration::ZERO).await;
    assert_eq!(status, None, "it still waits");
}

/// `allot app submit --help` gives the exit codes when following, and the default of `--timeout`;
/// `allot run --help` gives them too and says it is the same command; the options of following
/// are refused without `--follow`.
#[test]
fn submit_follow_help_gives_its_exit_codes_and_run_is_its_alias() {
    for (command, more) in
        [(&["app", "submit", "--help"][..], "--follow"), (&["run", "--help"][..], "allot app submit --follow FILE")]
    {
        let help = Command::new(ALLOT).args(command).output().unwrap();
        let text = String::from_utf8_lossy(&help.stdout);
        assert!(help.status.success(), "{text}");
        for part in
            ["Exit codes when following", "1  a task did not complete", "--timeout <DURATION>", "[default: 5m]", more]
        {
            assert!(text.contains(part), "{command:?} `{part}`: {text}");
        }
    }
    let refused = Command::new(ALLOT).args(["app", "submit", "app.yaml", "--replace"]).output().unwrap();
    assert_eq!(refused.status.code(), Some(2), "{}", String::from_utf8_lossy(&refused.stderr));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--follow"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

/// Following an application that exists: one that has ended is not run again (it says so, and
/// how to); `--replace` removes it and runs it again. The first time through the alias `allot
/// run`: the same command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_follow_of_an_application_that_exists_says_so_and_replace_runs_it_again() {
    let (dir, data) = data_dir();
    let config = format!("{EXAMPLES}/allot.toml");
    let daemon = Daemon::start(&data, &["--config", config.as_str(), "--pool", "worker=cpu=4", "--run-pool", "worker"]);
    let file = dir.path().join("again.yaml");
    std::fs::write(
        &file,
        "id: again\nqueue: root.examples\nuser: me\ntasks:\n  - id: quick\n    resources: cpu=1\n    spec: {type: noop}\n",
    )
    .unwrap();
    let args = [file.to_str().unwrap(), "--server", &daemon.url, "--poll", "100ms", "--timeout", "60s"];
    let (status, stdout, stderr) = Following::start_as(&["run"], &args).end(Duration::from_secs(60)).await;
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("app again: Completed"), "{stdout}\n{stderr}");
    let (status, stdout, stderr) = Following::start(&args).end(Duration::from_secs(60)).await;
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{stdout}\n{stderr}");
    assert!(stderr.contains("app again already exists and has ended (Completed): nothing was run"), "{stderr}");
    assert!(stderr.contains("allot app submit --follow --replace"), "{stderr}");
    assert!(!stdout.contains("Completed after"), "no summary of a run that did not happen: {stdout}");
    let replace = [&args[..], &["--replace"]].concat();
    let (status, stdout, stderr) = Following::start(&replace).end(Duration::from_secs(60)).await;
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{stdout}\n{stderr}");
    assert!(stderr.contains("removed app again (Completed) to run it again"), "{stderr}");
    assert!(stderr.contains("submitted app again") && stdout.contains("app again: Completed"), "{stdout}\n{stderr}");
}

/// A shell task that fails: the summary of `allot app submit --follow` shows the end of its stderr and the command
/// that shows all of it; a task whose retries are used up reads `Failed`, its cause beside it,
/// in the summary and in `allot task show`; a command that cannot be run names that command too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_follow_shows_a_failed_tasks_stderr_and_failed_once_its_retries_are_used_up() {
    let (dir, data) = data_dir();
    let config = format!("{EXAMPLES}/allot.toml");
    let daemon = Daemon::start(&data, &["--config", config.as_str(), "--pool", "worker=cpu=4", "--run-pool", "worker"]);
    let file = dir.path().join("fails.yaml");
    std::fs::write(
        &file,
        "id: fails\nqueue: root.examples\nuser: me\ntasks:\n  - id: full\n    resources: cpu=1\n    retries: 1\n    \
         spec: {type: shell, command: 'echo writing; echo \"disk full\" >&2; exit 3'}\n  - id: missing\n    \
         resources: cpu=1\n    spec: {type: shell, command: 'no-such-command-anywhere'}\n",
    )
    .unwrap();
    let args = [file.to_str().unwrap(), "--server", &daemon.url, "--poll", "100ms", "--timeout", "60s"];
    let (status, stdout, stderr) = Following::start(&args).end(Duration::from_secs(60)).await;
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{stdout}\n{stderr}");
    let command = format!("allot task logs fails full --stream stderr --server {}", daemon.url);
    let shown = format!("full: the end of its stderr (all of it: `{command}`):\n    disk full\n");
    assert!(stdout.contains(&shown), "{stdout}");
    assert!(
        stdout.contains("missing: the end of its stderr") && stdout.contains("no-such-command-anywhere"),
        "{stdout}"
    );
    let attempts = "full: attempt 1: RetryableFailure (user error exit_3), attempt 2: Failed (retryable failure, no \
                    retries left: exit status 3)";
    assert!(stdout.contains(attempts), "{stdout}");
    let words: Vec<&str> = command.split(' ').collect();
    let logs = Command::new(ALLOT).args(&words[1..]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&logs.stdout), "disk full\n", "the command shown shows it");
    let show = Command::new(ALLOT).args(["task", "show", "fails", "full", "--server", &daemon.url]).output().unwrap();
    let show = String::from_utf8_lossy(&show.stdout);
    assert!(show.contains("2: Failed (retryable failure, no retries left: exit status 3)"), "{show}");
    assert!(!show.contains("RetryableFailure"), "{show}");
    let missing = daemon.client().task("fails", "missing").await.unwrap();
    let reason = missing.reason.unwrap_or_default();
    assert!(reason.contains("its stderr: `allot task logs fails missing --stream stderr`"), "{reason}");
    assert!(!reason.contains("stderr.log"), "{reason}");
}

/// An application submitted with no task waits for tasks to be added; failed by hand meanwhile,
/// the follow ends, with an error status (it did not complete).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_follow_of_an_application_without_tasks_ends_when_it_is_ended_by_hand() {
    let (dir, data) = data_dir();
    let daemon = Daemon::start(&data, &["--pool", "worker=cpu=1", "--run-pool", "worker"]);
    let client = daemon.client();
    client.put_queue("root.empty", &Default::default()).await.unwrap();
    let file = dir.path().join("empty.yaml");
    std::fs::write(&file, "id: empty\nqueue: root.empty\nuser: me\ntasks: []\n").unwrap();
    let following = Following::start(&[file.to_str().unwrap(), "--server", &daemon.url, "--poll", "100ms"]);
    assert!(following.says("submitted app empty", Duration::from_secs(20)).await, "{}", following.stderr());
    client.fail_app("empty", Some("given up by hand")).await.unwrap();
    let (status, stdout, stderr) = following.end(Duration::from_secs(30)).await;
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{stdout}\n{stderr}");
    assert!(stdout.contains("app empty: Failed"), "{stdout}\n{stderr}");
}
