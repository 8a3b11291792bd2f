//! The flags of `allot serve` (each with its environment variable), and the threads they make:
//! how many serve requests and how many run the daemon's runtime.

use std::net::SocketAddr;
use std::path::PathBuf;

use allot_store::Durability;

#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on [default: 127.0.0.1:7070].
    #[arg(long, value_name = "ADDRESS", env = "ALLOT_LISTEN")]
    pub(super) listen: Option<SocketAddr>,
    /// Directory of the embedded store [default: ./allot-data].
    #[arg(long, value_name = "DIR", env = "ALLOT_DATA_DIR")]
    pub(super) data_dir: Option<PathBuf>,
    /// What an acknowledged change of the embedded store survives: `disk` (the default: flushed
    /// to disk before the answer, survives a power loss) or `process` (handed to the operating
    /// system before the answer: survives a crash or kill -9 of the daemon; a power loss may lose
    /// the last second).
    #[arg(long, value_name = "LEVEL", env = "ALLOT_DURABILITY")]
    pub(super) durability: Option<Durability>,
    /// Where state lives: `embedded` (the default: a durable store in --data-dir),
    /// `redis://HOST:PORT` (one Redis shared by several daemons) or
    /// `redis+cluster://HOST:PORT[,HOST:PORT...]` (a Redis Cluster).
    #[arg(long, value_name = "STORE", env = "ALLOT_STORE")]
    pub(super) store: Option<String>,
    /// On Redis: answer a change only once this many replicas have it (`WAIT`), so that a
    /// failover does not lose what was acknowledged [default: 0, the primary's answer]. A change
    /// the replicas do not confirm within 1 s answers `store_outcome_unknown`.
    #[arg(long, value_name = "N", env = "ALLOT_REDIS_MIN_REPLICAS")]
    pub(super) redis_min_replicas: Option<u32>,
    /// On Redis, the daemon that schedules: while applications wait, read the pools and quotas
    /// again this often, for room other clients free through Redis directly (room made through a
    /// daemon starts a cycle at once anyway) [default: 1s].
    #[arg(long, value_name = "DURATION", env = "ALLOT_REDIS_SCHED_REFRESH", value_parser = allot_bench::duration::parse)]
    pub(super) redis_sched_refresh: Option<std::time::Duration>,
    /// On Redis, how often a waiting allocate checks its answer even without a wake-up message
    /// (one lost, or sent while the daemon reconnected): the most a lost message delays an
    /// answer [default: 250ms].
    #[arg(long, value_name = "DURATION", env = "ALLOT_REDIS_WAKE_POLL", value_parser = allot_bench::duration::parse)]
    pub(super) redis_wake_poll: Option<std::time::Duration>,
    /// Serve a non-loopback --listen address without `[auth]`: anyone who reaches the port may do
    /// anything (a warning is logged at every start). Without it such a daemon refuses to start.
    #[arg(long, env = "ALLOT_INSECURE_NO_AUTH")]
    pub(super) insecure_no_auth: bool,
    /// Write the audit trail (every change and every refusal, one JSON line each) to this file,
    /// reopened on SIGHUP for log rotation; `off` keeps none [default: the log, when `[auth]` is
    /// configured].
    #[arg(long, value_name = "FILE", env = "ALLOT_AUDIT_LOG")]
    pub(super) audit_log: Option<PathBuf>,
    /// Serve HTTPS with this certificate (PEM, with its chain); re-read on SIGHUP or when the file
    /// changes, without dropping connections.
    #[arg(long, value_name = "FILE", env = "ALLOT_TLS_CERT", requires = "tls_key")]
    pub(super) tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", env = "ALLOT_TLS_KEY", requires = "tls_cert")]
    pub(super) tls_key: Option<PathBuf>,
    /// Ask clients for a certificate signed by this CA (PEM): its subject's common name is the
    /// caller's user, its organizations the user's groups (a token, if given, wins).
    #[arg(long, value_name = "FILE", env = "ALLOT_TLS_CLIENT_CA", requires = "tls_cert")]
    pub(super) tls_client_ca: Option<PathBuf>,
    /// The CA certificates (PEM) of the other daemons' HTTPS certificates, for this daemon's own
    /// calls to them (applications calls forwarded to the daemon that schedules, the executor's
    /// reports); without it, the system's CAs and the certificates of --tls-cert.
    #[arg(long, value_name = "FILE", env = "ALLOT_PEER_CA_CERT")]
    pub(super) peer_ca_cert: Option<PathBuf>,
    /// With `--store rediss://...`: trust these CA certificates (PEM) for the Redis server's
    /// certificate instead of the system's.
    #[arg(long, value_name = "FILE", env = "ALLOT_REDIS_CA_CERT")]
    pub(super) redis_ca_cert: Option<PathBuf>,
    /// TOML configuration file; its keys are listed below.
    #[arg(long, value_name = "FILE", env = "ALLOT_CONFIG")]
    pub(super) config: Option<PathBuf>,
    /// Seed a namespace quota, e.g. `--quota hive:cluster-a=10`: the namespace is created with
    /// it if it does not exist yet; an existing one keeps the quota the store has. Repeatable;
    /// wins over the configuration file.
    #[arg(long = "quota", value_name = "NAMESPACE=QUOTA")]
    pub(super) quotas: Vec<String>,
    /// Seed a leased resource pool, e.g. `--pool worker-1=cpu=16,mem=64GiB`: created with this
    /// capacity if it does not exist yet. Repeatable; wins over the configuration file.
    #[arg(long = "pool", value_name = "POOL=RESOURCES")]
    pub(super) pools: Vec<String>,
    /// Run here the tasks the scheduler places on this pool (with their plugins). Repeatable; the
    /// local pool is run here too.
    #[arg(long = "run-pool", value_name = "POOL")]
    pub(super) run_pools: Vec<String>,
    /// Offer this machine's own resources as a pool of this name (detected cpu, memory less 5 %,
    /// and the disk of the data directory), e.g. `--local-pool local`.
    #[arg(long, value_name = "POOL", env = "ALLOT_LOCAL_POOL")]
    pub(super) local_pool: Option<String>,
    /// The lease an alloc gets when it is made [default: 2m].
    #[arg(long, value_name = "DURATION", value_parser = allot_bench::duration::parse)]
    pub(super) alloc_lease: Option<std::time::Duration>,
    /// The longest lease one keepalive grants [default: 5m].
    #[arg(long, value_name = "DURATION", value_parser = allot_bench::duration::parse)]
    pub(super) alloc_max_lease: Option<std::time::Duration>,
    /// The longest an allocate may wait for room (`wait_ms`), at most 5m; keep it below the idle
    /// timeout of any proxy in front of the daemon [default: 5m].
    #[arg(long, value_name = "DURATION", env = "ALLOT_MAX_WAIT", value_parser = allot_bench::duration::parse)]
    pub(super) max_wait: Option<std::time::Duration>,
    /// Close a connection with no request at work that neither starts a request nor is sent a
    /// byte for this long (closed within half as long again): an idle keep-alive connection, one
    /// that says nothing, one sending its headers or its body a byte at a time. A long poll is at
    /// work; a watch is sent its heartbeats. At least 1s [default: 2m].
    #[arg(long, value_name = "DURATION", env = "ALLOT_IDLE_TIMEOUT", value_parser = allot_bench::duration::parse)]
    pub(super) idle_timeout: Option<std::time::Duration>,
    /// The most connections open at once; past it, new ones wait to be accepted until one ends
    /// [default: the open-files limit less an eighth of it, at least 256, kept for the store,
    /// the runs' logs and the daemon's own connections].
    #[arg(long, value_name = "N", env = "ALLOT_MAX_CONNECTIONS", value_parser = clap::value_parser!(u32).range(1..))]
    pub(super) max_connections: Option<u32>,
    /// Give these namespaces series of their own at /metrics (every namespace counts in the
    /// totals): `NAME` selects NAME and the namespaces under it (`NAME:...`), `PREFIX*` every name
    /// that starts with PREFIX, `*` all. Repeatable; replaces the file's `metrics_namespaces`.
    #[arg(long = "metrics-namespaces", value_name = "PATTERN")]
    pub(super) metrics_namespaces: Vec<String>,
    /// The same for pools; replaces the file's `metrics_pools`.
    #[arg(long = "metrics-pools", value_name = "PATTERN")]
    pub(super) metrics_pools: Vec<String>,
    /// Threads that serve requests [default: one per CPU on the embedded store; one per CPU
    /// less one, at least one, on Redis, which needs a CPU too].
    #[arg(long, env = "ALLOT_THREADS", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub(super) threads: Option<u16>,
    /// On the embedded store, pin each thread that serves requests to a CPU of its own (when
    /// there are no more of them than CPUs this process may use): a shorter tail where other busy
    /// processes share the CPUs (the kernel cannot stack two serving threads on one CPU), for
    /// more CPU per request (docs/benchmarks.md).
    #[arg(long, env = "ALLOT_PIN_THREADS", value_name = "BOOL", default_value_t = false, action = clap::ArgAction::Set)]
    pub(super) pin_threads: bool,
    /// Watch this directory for application files (`.yaml`, `.yml`, `.toml`, as `allot app
    /// submit` takes): a new file submits its application, a removed one removes it.
    #[arg(long, value_name = "DIR", env = "ALLOT_APPS_DIR")]
    pub(super) apps_dir: Option<PathBuf>,
    /// On a Redis store, the base URL at which the other daemons reach this one while it
    /// schedules applications (they forward the applications part to it) [default:
    /// http://ADDRESS with the address it listens on; give it when listening on 0.0.0.0].
    #[arg(long, value_name = "URL", env = "ALLOT_ADVERTISE", value_parser = advertised_url)]
    pub(super) advertise: Option<String>,
    /// Log format on stderr.
    #[arg(long, env = "ALLOT_LOG_FORMAT", value_enum, default_value = "text")]
    pub(super) log_format: LogFormat,
}

/// The threads that serve requests: `--threads`; else, on Redis, one per CPU less one, at least
/// one (on two CPUs shared with Redis and the clients, one beat two in 4 of 5 alternating `bench
/// pairs` runs, by 7–27 %, docs/benchmarks.md: Redis keeps a CPU); on the embedded store, one per
/// CPU (its log is written by the serving threads themselves).
fn request_threads(args: &ServeArgs) -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    match args.threads {
        Some(threads) => usize::from(threads),
        None if on_redis(args) => cpus.saturating_sub(1).max(1),
        None => cpus,
    }
}

fn on_redis(args: &ServeArgs) -> bool {
    args.store.as_deref().is_some_and(|store| store.starts_with("redis"))
}

/// Transparent huge pages off for the daemon's process, before its threads start (Linux; elsewhere
/// nothing). With them the kernel backs the allocator's arenas with 2 MiB pages, and the few
/// bytes an idle keep-alive connection or watcher touches pull whole huge pages in: 27 KiB of
/// resident memory each against 15 KiB without, at no CPU per request that `bench compare`
/// could tell apart (docs/benchmarks.md, "Idle connections"). A refusal only costs memory.
pub(crate) fn no_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_THP_DISABLE takes plain integers and reads or writes no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

/// The worker threads of the daemon's runtime. On Redis they serve the requests (the store's
/// connections are driven by tasks of this runtime). On the embedded store the requests have
/// serving threads of their own ([`serving_threads`]) and one worker runs the rest: accepting
/// connections, expiring leases, the scheduler, the executor.
pub(crate) fn worker_threads(args: &ServeArgs) -> usize {
    if on_redis(args) {
        request_threads(args)
    } else {
        1
    }
}

/// The serving threads, each with a single-threaded runtime of its own, that serve the
/// connections from start to end: none on Redis; on the embedded store, one per request thread
/// (with two on two CPUs shared with the clients, the disk level served about a quarter more
/// pairs/s at 64 clients than on two workers of one runtime, the process level as many), pinned
/// to CPUs of their own with `--pin-threads true` (docs/benchmarks.md).
pub(super) fn serving_threads(args: &ServeArgs) -> allot_server::ServingThreads {
    let count = if on_redis(args) { 0 } else { request_threads(args) };
    allot_server::ServingThreads { count, pin: args.pin_threads }
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(super) enum LogFormat {
    Text,
    Json,
}

/// `--advertise`: an `http://` or `https://` URL with a host, as the other daemons call it.
fn advertised_url(text: &str) -> Result<String, String> {
    let example = "give one such as http://10.0.0.5:7070";
    let uri: axum::http::Uri = text.parse().map_err(|err| format!("`{text}` is not a URL ({err}); {example}"))?;
    let web = matches!(uri.scheme_str(), Some("http" | "https"));
    if !web || uri.host().is_none_or(str::is_empty) {
        return Err(format!("`{text}` is not an http:// or https:// URL with a host; {example}"));
    }
    Ok(text.to_owned())
}
