//! Starting, stopping and killing a real daemon.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

pub(crate) const ALLOT: &str = env!("CARGO_BIN_EXE_allot");

/// A daemon process; killed when dropped.
pub(crate) struct Daemon {
    child: Child,
    pub(crate) url: String,
}

impl Daemon {
    /// Starts `allot serve` on a free loopback port with `data_dir`, plus `args`.
    pub(crate) fn start(data_dir: &Path, args: &[&str]) -> Daemon {
        Daemon::start_on("127.0.0.1:0", data_dir, args)
    }

    /// Starts `allot serve` on `listen` (e.g. the `address()` of a daemon that stopped, to
    /// restart it where its clients look for it) with `data_dir`, plus `args`.
    pub(crate) fn start_on(listen: &str, data_dir: &Path, args: &[&str]) -> Daemon {
        Daemon::start_in(Path::new("."), listen, data_dir, args)
    }

    /// As [`Daemon::start_on`], in the working directory `dir` (its relative paths read from there).
    pub(crate) fn start_in(dir: &Path, listen: &str, data_dir: &Path, args: &[&str]) -> Daemon {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(data_dir.with_extension("log"))
            .expect("daemon log file");
        let mut child = Command::new(ALLOT)
            .current_dir(dir)
            .args(["serve", "--listen", listen, "--data-dir"])
            .arg(data_dir)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("start allot serve");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let first = lines.next().and_then(Result::ok);
            let _ = tx.send(first);
            // Keep reading so the daemon never blocks on a full pipe.
            for _ in lines {}
        });
        let line = rx.recv_timeout(Duration::from_secs(30)).ok().flatten().unwrap_or_else(|| {
            let log = std::fs::read_to_string(data_dir.with_extension("log")).unwrap_or_default();
            panic!("the daemon did not report its address; its log:\n{log}")
        });
        let url = line.strip_prefix("allot listening on ").expect("the ready line").trim().to_owned();
        Daemon { child, url }
    }

    pub(crate) fn client(&self) -> allot_client::Client {
        allot_client::Client::new(&self.url).unwrap()
    }

    /// SIGKILL: no chance to flush anything.
    pub(crate) fn kill9(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }

    /// SIGTERM, and wait for the exit (at most [`PATIENCE`]: then SIGKILL, and the test fails).
    pub(crate) fn terminate(mut self) -> ExitStatus {
        self.signal("TERM");
        let pid = self.child.id().to_string();
        let child = &mut self.child;
        std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::channel();
            scope.spawn(move || {
                let _ = tx.send(child.wait().expect("wait"));
            });
            rx.recv_timeout(PATIENCE).unwrap_or_else(|_| {
                // The waiting thread ends with the process.
                let _ = Command::new("kill").args(["-KILL", &pid]).status();
                panic!("the daemon did not stop within {PATIENCE:?} of SIGTERM")
            })
        })
    }

    /// Sends the daemon a signal (`HUP`, `STOP`, ...).
    pub(crate) fn signal(&self, name: &str) {
        let status = Command::new("kill").args([&format!("-{name}"), &self.child.id().to_string()]).status().unwrap();
        assert!(status.success(), "kill -{name}");
    }

    /// The daemon's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn address(&self) -> String {
        self.url.trim_start_matches("http://").to_owned()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A temporary directory with a `data` path inside for the daemon.
pub(crate) fn data_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    (dir, data)
}

/// How long a test waits for a condition before it says it never came: long enough for a loaded
/// CI machine.
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

/// Polls `check` until it holds or `limit` passes; whether it held.
pub(crate) async fn eventually(limit: Duration, check: impl AsyncFnMut() -> bool) -> bool {
    allot_host::wait::within(limit, check).await
}

/// The pause between two looks at a condition, for a loop that cannot be a closure (a spawned
/// task's: the compiler cannot prove such a closure's future `Send`).
pub(crate) async fn pause() {
    allot_host::wait::pause().await;
}

/// [`eventually`] for a test without a runtime of its own (one that calls the command line).
pub(crate) fn eventually_blocking(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime");
    runtime.block_on(eventually(limit, async || check()))
}

/// Tokens for `people` (a user and its groups each), in order, and their `[[auth.tokens]]`
/// entries for a daemon's configuration file.
pub(crate) fn tokens(people: &[(&str, &[&str])]) -> (Vec<String>, String) {
    let made: Vec<(String, String)> =
        people.iter().map(|(user, groups)| crate::access::make_token(user, groups)).collect();
    let entries = made.iter().map(|(_, entry)| entry.as_str()).collect::<Vec<_>>().join("\n");
    (made.into_iter().map(|(token, _)| token).collect(), entries)
}

/// One call of the API with `token` (none: without one) and a JSON `body` (none: without one):
/// its status and JSON answer (`null` for a watch's stream, whose head is the answer).
pub(crate) async fn api_call(
    url: &str,
    token: Option<&str>,
    method: reqwest::Method,
    path: &str,
    body: Option<String>,
) -> (u16, serde_json::Value) {
    let mut request = reqwest::Client::new().request(method, format!("{url}{path}"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.header("content-type", "application/json").body(body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    if response.headers().get("content-type").is_some_and(|v| v == "text/event-stream") {
        return (status, serde_json::Value::Null);
    }
    (status, response.json().await.unwrap_or(serde_json::Value::Null))
}
