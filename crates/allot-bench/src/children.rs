//! Servers the benchmark starts as child processes: the baseline server and fresh daemons (the
//! `allot` binary this crate runs in, `std::env::current_exe()`), Throttle and etcd. Each child's
//! stderr goes to a log file in a scratch directory, which is removed at the end; children are
//! stopped with SIGTERM, killed if they linger, and killed when dropped.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hyper::body::Bytes;
use hyper::Method;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::http::{Conn, Endpoint};

/// How long a child may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a child may take to stop after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// The line a server prints on stdout once it listens.
const LISTENING: &str = "allot listening on ";

/// A temporary directory for data directories, configs and logs; removed when dropped.
pub(super) struct Scratch {
    path: PathBuf,
}

impl Scratch {
    /// Makes a new directory in `parent`, or in the system's temporary directory.
    pub(super) fn new(parent: Option<&Path>) -> anyhow::Result<Scratch> {
        let parent = parent.map_or_else(std::env::temp_dir, Path::to_path_buf);
        let path = parent.join(format!("allot-bench-{}", crate::load::run_id()));
        std::fs::create_dir_all(&path).with_context(|| format!("cannot create {}", path.display()))?;
        Ok(Scratch { path })
    }

    pub(super) fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Keeps the directory (it is not removed when dropped); answers where it is.
    pub(super) fn keep(self) -> PathBuf {
        let path = self.path.clone();
        std::mem::forget(self);
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A server running as a child process.
pub(super) struct Server {
    pub(super) name: String,
    pub(super) endpoint: Endpoint,
    child: Child,
}

impl Server {
    /// The child's process id (until it is stopped).
    pub(super) fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Kills the child with SIGKILL, as a crash, and reaps it.
    pub(super) async fn kill(mut self) {
        let _ = self.child.kill().await;
    }

    /// Stops the child: SIGTERM, then SIGKILL if it has not exited within [`STOP_TIMEOUT`].
    pub(super) async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status().await;
        }
        if tokio::time::timeout(STOP_TIMEOUT, self.child.wait()).await.is_err() {
            eprintln!("{}: still running {STOP_TIMEOUT:?} after SIGTERM; killing it", self.name);
            let _ = self.child.kill().await;
        }
    }
}

/// Starts this binary's daemon (`allot serve`) on a free loopback port, with its embedded store
/// and its log in `scratch`.
pub(super) async fn spawn_daemon(scratch: &Scratch) -> anyhow::Result<Server> {
    spawn_daemon_with(scratch, &[]).await
}

/// [`spawn_daemon`] with more arguments for `allot serve`.
pub(super) async fn spawn_daemon_with(scratch: &Scratch, more: &[std::ffi::OsString]) -> anyhow::Result<Server> {
    spawn_daemon_on(scratch, more, None).await
}

/// [`spawn_daemon_with`], on `cpus` only when given.
pub(super) async fn spawn_daemon_on(
    scratch: &Scratch,
    more: &[std::ffi::OsString],
    cpus: Option<&[usize]>,
) -> anyhow::Result<Server> {
    let exe = std::env::current_exe()?;
    let mut serve: Vec<std::ffi::OsString> = vec![
        "serve".into(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--data-dir".into(),
        scratch.join("allot-data").into(),
    ];
    serve.extend(more.iter().cloned());
    spawn_listening("allot", &exe, &serve, scratch.join("allot.log"), cpus).await
}

/// Starts this binary's daemon again on the data directory of `scratch` (its log appended to),
/// with `more` arguments (`--listen ADDRESS` to listen where it did).
pub(super) async fn spawn_daemon_again(scratch: &Scratch, more: &[std::ffi::OsString]) -> anyhow::Result<Server> {
    let exe = std::env::current_exe()?;
    let mut serve: Vec<std::ffi::OsString> =
        vec!["serve".into(), "--data-dir".into(), scratch.join("allot-data").into()];
    serve.extend(more.iter().cloned());
    spawn_listening("allot", &exe, &serve, scratch.join("allot-again.log"), None).await
}

/// Lets the process `command` starts run on `cpus` only, when given (its threads inherit that).
fn restrict<'c>(command: &'c mut Command, cpus: Option<&[usize]>) -> &'c mut Command {
    if let Some(cpus) = cpus {
        let cpus = cpus.to_vec();
        // SAFETY: the closure runs in the child between fork and exec; it allocates nothing and
        // makes one system call.
        unsafe {
            command.pre_exec(move || allot_host::affinity::restrict_thread(0, &cpus));
        }
    }
    command
}

/// Starts `program args` (on `cpus` only, when given) and waits for its `allot listening on
/// http://...` line on stdout.
pub(super) async fn spawn_listening(
    name: &str,
    program: &Path,
    args: &[OsString],
    log: PathBuf,
    cpus: Option<&[usize]>,
) -> anyhow::Result<Server> {
    let log_file = std::fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
    let mut child = restrict(&mut Command::new(program), cpus)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("{name}: cannot start {}", program.display()))?;
    let stdout = child.stdout.take().context("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let url = tokio::time::timeout(START_TIMEOUT, async {
        while let Some(line) = lines.next_line().await? {
            if let Some(url) = line.strip_prefix(LISTENING) {
                return Ok(Some(url.trim().to_owned()));
            }
        }
        Ok::<_, std::io::Error>(None)
    })
    .await;
    let url = match url {
        Ok(Ok(Some(url))) => url,
        Ok(Ok(None)) | Ok(Err(_)) => {
            let status = child.wait().await.map(|s| s.to_string()).unwrap_or_default();
            bail!("{name} exited before listening ({status}){}", log_tail(&log));
        }
        Err(_) => bail!("{name} did not listen within {START_TIMEOUT:?}{}", log_tail(&log)),
    };
    // Keep reading stdout so the child never blocks on (or is killed by) a closed pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(Server { name: name.to_owned(), endpoint: Endpoint::parse(&url)?, child })
}

/// The Throttle binary: `throttle` on PATH, or in ~/.cargo/bin where `cargo install` puts it.
pub(super) fn find_throttle() -> Option<PathBuf> {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")));
    find_program("throttle")
        .or_else(|| cargo_home.map(|home| home.join("bin").join("throttle")).filter(|p| p.is_file()))
}

/// `name` on PATH.
pub(super) fn find_program(name: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths).map(|dir| dir.join(name)).find(|path| path.is_file())
}

/// Starts a one-member etcd on free ports, its data in `scratch` (fsync on every commit, as etcd
/// always does), and waits until its JSON gateway answers.
pub(super) async fn spawn_etcd(program: &Path, scratch: &Scratch, cpus: Option<&[usize]>) -> anyhow::Result<Server> {
    let free = || -> anyhow::Result<u16> { Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port()) };
    let (client, peer) = (free()?, free()?);
    let client_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let log = scratch.join("etcd.log");
    let mut child = restrict(&mut Command::new(program), cpus)
        .arg("--data-dir")
        .arg(scratch.join("etcd-data"))
        .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
        .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &format!("default={peer_url}"), "--log-level", "warn"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("etcd: cannot start {}", program.display()))?;
    let endpoint = Endpoint::parse(&client_url)?;
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait()? {
            bail!("etcd exited before listening ({status}){}", log_tail(&log));
        }
        if let Ok(mut conn) = Conn::connect(&endpoint).await {
            let probe = Bytes::from_static(br#"{"key":"AA=="}"#);
            if let Ok((status, _)) = conn.request(Method::POST, "/v3/kv/range", probe).await {
                if status.is_success() {
                    break;
                }
            }
        }
        if Instant::now() > deadline {
            bail!("etcd did not answer on {client_url} within {START_TIMEOUT:?}{}", log_tail(&log));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(Server { name: "etcd".to_owned(), endpoint, child })
}

/// Starts Throttle on a free port with one semaphore of `count`, and waits until it answers.
pub(super) async fn spawn_throttle(
    program: &Path,
    scratch: &Scratch,
    semaphore: &str,
    count: u64,
    cpus: Option<&[usize]>,
) -> anyhow::Result<Server> {
    let config = scratch.join("throttle.toml");
    std::fs::write(&config, format!("[semaphores]\n\"{semaphore}\" = {count}\n"))?;
    // Throttle does not tell which port it bound, so pick a free one first.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let log = scratch.join("throttle.log");
    let log_file = std::fs::File::create(&log)?;
    let mut child = restrict(&mut Command::new(program), cpus)
        .args(["--address", "127.0.0.1", "--port", &port.to_string(), "--configuration"])
        .arg(&config)
        .env("THROTTLE_LOG", "WARN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("throttle: cannot start {}", program.display()))?;
    let endpoint = Endpoint::parse(&format!("http://127.0.0.1:{port}"))?;
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait()? {
            bail!("throttle exited before listening ({status}){}", log_tail(&log));
        }
        if let Ok(mut conn) = Conn::connect(&endpoint).await {
            if let Ok((status, _)) = conn.request(Method::GET, "/health", Bytes::new()).await {
                if status.is_success() {
                    break;
                }
            }
        }
        if Instant::now() > deadline {
            bail!("throttle did not answer on {} within {START_TIMEOUT:?}{}", endpoint.url(), log_tail(&log));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(Server { name: "throttle".to_owned(), endpoint, child })
}

/// The last lines of a log file, as a suffix for an error message.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    if lines.is_empty() {
        return String::new();
    }
    let tail = lines[lines.len().saturating_sub(10)..].join("\n  ");
    format!("; its last log lines:\n  {tail}")
}
