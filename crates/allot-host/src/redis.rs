//! Real `redis-server` processes: one server, or a cluster of primaries (with replicas), on free
//! loopback ports, each in a temporary directory of its own, killed on drop. A missing
//! `redis-server` is a panic whose message names the install command: the load generator and the
//! tests that use these cannot go on without one.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const INSTALL: &str = "redis-server was not found on PATH. allot's Redis tests and `allot bench`'s Redis \
                       runs need a real server:                        install it with `sudo apt-get install -y redis-server` (Debian/Ubuntu) and run again";

fn redis_server() -> PathBuf {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("redis-server"))
        .find(|path| path.is_file());
    found.unwrap_or_else(|| panic!("{INSTALL}"))
}

/// A port nothing listens on now. `redis-server` cannot be handed a bound socket, so the port is
/// chosen before the server binds it; [`RedisServer`] starts on another one if it was taken
/// meanwhile.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// Runs `redis-cli -p port args...` and returns what it printed.
fn cli(port: u16, args: &[&str]) -> Option<String> {
    let out =
        Command::new("redis-cli").arg("-p").arg(port.to_string()).args(args).stderr(Stdio::null()).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One `redis-server` on a free port.
pub struct RedisServer {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    cluster: bool,
    fsync: &'static str,
    /// Arguments added to the server's command line (TLS).
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a server that also takes TLS connections on the port it answers, with
    /// `cert` and `key` (PEM): `rediss://127.0.0.1:<tls port>`. The plain port stays open for
    /// the harness's `redis-cli`.
    pub fn start_tls(cert: &Path, key: &Path) -> (RedisServer, u16) {
        let tls_port = free_port();
        let dir = tempfile::tempdir().expect("a temporary directory");
        let extra = vec![
            "--tls-port".to_owned(),
            tls_port.to_string(),
            "--tls-cert-file".to_owned(),
            cert.display().to_string(),
            "--tls-key-file".to_owned(),
            key.display().to_string(),
            "--tls-auth-clients".to_owned(),
            "no".to_owned(),
        ];
        let mut server = RedisServer { port: free_port(), dir, child: None, cluster: false, fsync: "everysec", extra };
        assert!(server.try_start(), "redis-server with TLS did not start. {INSTALL}");
        (server, tls_port)
    }

    /// Starts a server with an append-only file fsynced every second (Redis's default).
    pub fn start() -> RedisServer {
        Self::start_with(false, "everysec")
    }

    /// Starts a server that fsyncs its append-only file before every answer, so that a write
    /// it acknowledged survives `kill -9`.
    pub fn start_durable() -> RedisServer {
        Self::start_with(false, "always")
    }

    fn start_with(cluster: bool, fsync: &'static str) -> RedisServer {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut server = RedisServer { port: free_port(), dir, child: None, cluster, fsync, extra: Vec::new() };
        // A port taken between its choice and the server's bind: the server exits; take another.
        for _ in 0..5 {
            if server.try_start() {
                return server;
            }
            server.port = free_port();
        }
        panic!("redis-server did not start on any of five free ports. {INSTALL}")
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills the server with SIGKILL, as an outage.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and data directory; waits until it answers.
    pub fn restart(&mut self) {
        assert!(self.try_start(), "redis-server could not bind port {} again", self.port);
    }

    /// Starts the server on its port; true once it answers, false if it exited first (the port
    /// was taken by another process).
    fn try_start(&mut self) -> bool {
        self.stop();
        let mut cmd = Command::new(redis_server());
        cmd.arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--save", "", "--appendonly", "yes", "--appendfsync", self.fsync, "--daemonize", "no"])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if self.cluster {
            cmd.args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
            ]);
        }
        let child =
            self.child.insert(cmd.spawn().unwrap_or_else(|err| panic!("cannot start redis-server: {err}. {INSTALL}")));
        let started = Instant::now();
        loop {
            // Exited: it could not bind (whoever answers on the port is not this server).
            if child.try_wait().ok().flatten().is_some() {
                self.child = None;
                return false;
            }
            // Answering, and this server (not another one on the same port).
            let pid = format!("process_id:{}", child.id());
            if cli(self.port, &["INFO", "server"]).is_some_and(|info| info.lines().any(|l| l.trim() == pid)) {
                return true;
            }
            assert!(started.elapsed() < Duration::from_secs(10), "redis-server on port {} did not start", self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs a command with `redis-cli` and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args).unwrap_or_else(|| panic!("redis-cli {args:?} failed"))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A Redis Cluster, all slots assigned.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Primaries only, their append-only files fsynced every second.
    pub fn start(primaries: usize) -> RedisCluster {
        Self::start_with(primaries, 0, "everysec")
    }

    /// `primaries` primaries with one replica each, every node fsyncing its append-only file
    /// before it answers (`appendfsync always`), as an operator runs it for failover.
    pub fn start_with_replicas(primaries: usize) -> RedisCluster {
        let cluster = Self::start_with(primaries, 1, "always");
        let started = Instant::now();
        let synced = || {
            cluster.nodes.iter().all(|n| {
                cli(n.port, &["INFO", "replication"]).is_some_and(|i| {
                    i.contains("role:master") && i.contains("state=online") || i.contains("master_link_status:up")
                })
            })
        };
        while !synced() {
            assert!(started.elapsed() < Duration::from_secs(30), "the replicas never caught up");
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster
    }

    fn start_with(primaries: usize, replicas: usize, fsync: &'static str) -> RedisCluster {
        let count = primaries * (1 + replicas);
        let nodes: Vec<RedisServer> = (0..count).map(|_| RedisServer::start_with(true, fsync)).collect();
        for node in &nodes {
            // Redis waits 5 s by default before a replica's first copy, for others to join.
            node.cli(&["CONFIG", "SET", "repl-diskless-sync-delay", "0"]);
        }
        let addresses: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let replicas = replicas.to_string();
        let mut args = vec!["--cluster", "create"];
        args.extend(addresses.iter().map(String::as_str));
        args.extend(["--cluster-replicas", replicas.as_str(), "--cluster-yes"]);
        let out = Command::new("redis-cli").args(&args).output().expect("redis-cli --cluster create");
        assert!(out.status.success(), "cluster create failed: {}", String::from_utf8_lossy(&out.stdout));
        let started = Instant::now();
        let all_ok =
            || nodes.iter().all(|n| cli(n.port, &["CLUSTER", "INFO"]).is_some_and(|i| i.contains("cluster_state:ok")));
        while !all_ok() {
            assert!(started.elapsed() < Duration::from_secs(20), "the cluster never became ready");
            std::thread::sleep(Duration::from_millis(50));
        }
        RedisCluster { nodes }
    }

    /// The index of the node that replicates node `primary`, if one does.
    pub fn replica_of(&self, primary: usize) -> Option<usize> {
        let id = self.nodes[primary].cli(&["CLUSTER", "MYID"]).trim().to_owned();
        self.nodes.iter().position(|n| {
            n.port != self.nodes[primary].port
                && cli(n.port, &["INFO", "replication"]).is_some_and(|i| i.contains("role:slave"))
                && cli(n.port, &["CLUSTER", "NODES"])
                    .is_some_and(|nodes| nodes.lines().any(|l| l.contains("myself") && l.contains(&id)))
        })
    }

    /// Whether node `index` is a primary now.
    pub fn is_primary(&self, index: usize) -> bool {
        cli(self.nodes[index].port, &["INFO", "replication"]).is_some_and(|i| i.contains("role:master"))
    }

    /// The `--store` address of the cluster.
    pub fn address(&self) -> String {
        let nodes: Vec<String> = self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        format!("redis+cluster://{}", nodes.join(","))
    }
}
