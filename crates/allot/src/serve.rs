//! `allot serve`: configuration (flags > environment > TOML file > defaults), logging, the store
//! (embedded by default, or Redis), quota seeding, and the server until SIGTERM or SIGINT.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use allot_core::apps::queues::{QueueLimits, QueuePath, SortPolicy};
use allot_core::apps::SchedConfig;
use allot_core::pools::{LeaseRules, PoolName};
use allot_core::{NamespaceName, Resources};
use allot_server::MetricsConfig;
use allot_store::{Durability, EmbeddedConfig, EmbeddedStore, Store};
use allot_store_redis::{RedisConfig, RedisStore};
use anyhow::{bail, Context};
use serde::Deserialize;
use tracing_subscriber::filter::Targets;

use crate::sources::{AppManager, DirectorySource, HttpApi};

/// The default listen address: loopback only.
pub(crate) const DEFAULT_LISTEN: &str = "127.0.0.1:7070";
/// The default data directory, relative to the working directory.
pub(crate) const DEFAULT_DATA_DIR: &str = "allot-data";

/// `allot serve --help` after the options: every key of the configuration file, and the exit
/// codes. A test checks that every key the file accepts is here.
pub(crate) const SERVE_AFTER_HELP: &str = r#"Configuration file (--config), with every key:
  listen = "127.0.0.1:7070"     # --listen
  data_dir = "allot-data"       # --data-dir
  durability = "disk"           # --durability: disk or process (the embedded store)
  store = "embedded"            # --store
  redis_min_replicas = 1        # --redis-min-replicas: replicas a change reaches before its answer
  local_pool = "local"          # --local-pool (its tasks are run here)
  run_pools = ["worker-1"]      # --run-pool: run the tasks placed on these pools here
  max_wait = "5m"               # --max-wait: the longest an allocate may wait (at most 5m)
  metrics_namespaces = ["hive"] # --metrics-namespaces: series of their own at /metrics
  metrics_pools = ["worker-*"]  # --metrics-pools: the same for pools (else totals only)
  apps_dir = "apps"             # --apps-dir: application files the daemon watches
  [quotas]                      # --quota: namespace = quota
  "hive:cluster-a" = 10
  [pools]                       # --pool: pool = "resources"
  worker-1 = "cpu=16,mem=64GiB"
  [queues."root.analytics"]     # queues seeded at start (parents are made)
  guaranteed = "cpu=16"         # fair share between sibling queues
  max = "cpu=64,mem=256GiB"     # the most its applications hold together
  max_apps = 20                 # the most applications running at once
  user_max_apps = 5             # the same, per user
  user_max = "cpu=16"           # the most one user's applications hold
  sort = "fifo"                 # fifo, fair or priority
  [scheduler]
  completing_grace = "30s"      # how long an application whose tasks all ended waits for more
  app_retention = "1h"          # how long an ended application stays readable
  [executor]                    # how the tasks run here are retried (Flyte's budgets)
  retries = 0                   # new attempts after user failures, for a task whose spec names none
  system_retries = 3            # new attempts after system failures (a daemon lost, a service down)
  [plugins]                     # a plugin's quota is this file's value at every start
  http_jobs = 10                # the http plugin's jobs at once (its quota `http:jobs`)
  [plugins.task_types]          # the plugin of a task type that several plugins register
  sql = "warehouse"
  [plugins.external.warehouse]  # a plugin served by another process (create, get, delete)
  url = "http://127.0.0.1:8000/tasks"
  task_types = ["sql"]
  jobs_quota = 4                # optional: its jobs at once (its quota `warehouse:jobs`)
  [secrets]                     # given to plugins: a value, or read from env: or file:
  warehouse-token = "env:WAREHOUSE_TOKEN"
  [alloc_leases]
  initial = "2m"                # --alloc-lease: the lease an alloc gets when it is made
  max = "5m"                    # --alloc-max-lease: the longest lease one keepalive grants
  reclaim_after = "1m"          # how long after its lease lapses the sweeper reclaims an alloc
  retention = "1h"              # how long an ended alloc stays readable
Flags and environment variables win over the file; quotas, pools and queues only seed the store.

Exit codes:
  0  stopped by SIGTERM or SIGINT after a clean shutdown
  1  cannot start (configuration, store, address), or the server failed
  2  usage error"#;

#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on [default: 127.0.0.1:7070].
    #[arg(long, value_name = "ADDRESS", env = "ALLOT_LISTEN")]
    listen: Option<SocketAddr>,
    /// Directory of the embedded store [default: ./allot-data].
    #[arg(long, value_name = "DIR", env = "ALLOT_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// What an acknowledged change of the embedded store survives: `disk` (the default: flushed
    /// to disk before the answer, survives a power loss) or `process` (handed to the operating
    /// system before the answer: survives a crash or kill -9 of the daemon; a power loss may lose
    /// the last second).
    #[arg(long, value_name = "LEVEL", env = "ALLOT_DURABILITY")]
    durability: Option<Durability>,
    /// Where state lives: `embedded` (the default: a durable store in --data-dir),
    /// `redis://HOST:PORT` (one Redis shared by several daemons) or
    /// `redis+cluster://HOST:PORT[,HOST:PORT...]` (a Redis Cluster).
    #[arg(long, value_name = "STORE", env = "ALLOT_STORE")]
    store: Option<String>,
    /// On Redis: answer a change only once this many replicas have it (`WAIT`), so that a
    /// failover does not lose what was acknowledged [default: 0, the primary's answer]. A change
    /// the replicas do not confirm within 1 s answers `store_outcome_unknown`.
    #[arg(long, value_name = "N", env = "ALLOT_REDIS_MIN_REPLICAS")]
    redis_min_replicas: Option<u32>,
    /// TOML configuration file; its keys are listed below.
    #[arg(long, value_name = "FILE", env = "ALLOT_CONFIG")]
    config: Option<PathBuf>,
    /// Seed a namespace quota, e.g. `--quota hive:cluster-a=10`: the namespace is created with
    /// it if it does not exist yet; an existing one keeps the quota the store has. Repeatable;
    /// wins over the configuration file.
    #[arg(long = "quota", value_name = "NAMESPACE=QUOTA")]
    quotas: Vec<String>,
    /// Seed a leased resource pool, e.g. `--pool worker-1=cpu=16,mem=64GiB`: created with this
    /// capacity if it does not exist yet. Repeatable; wins over the configuration file.
    #[arg(long = "pool", value_name = "POOL=RESOURCES")]
    pools: Vec<String>,
    /// Run here the tasks the scheduler places on this pool (with their plugins). Repeatable; the
    /// local pool is run here too.
    #[arg(long = "run-pool", value_name = "POOL")]
    run_pools: Vec<String>,
    /// Offer this machine's own resources as a pool of this name (detected cpu, memory less 5 %,
    /// and the disk of the data directory), e.g. `--local-pool local`.
    #[arg(long, value_name = "POOL", env = "ALLOT_LOCAL_POOL")]
    local_pool: Option<String>,
    /// The lease an alloc gets when it is made [default: 2m].
    #[arg(long, value_name = "DURATION", value_parser = allot_bench::duration::parse)]
    alloc_lease: Option<std::time::Duration>,
    /// The longest lease one keepalive grants [default: 5m].
    #[arg(long, value_name = "DURATION", value_parser = allot_bench::duration::parse)]
    alloc_max_lease: Option<std::time::Duration>,
    /// The longest an allocate may wait for room (`wait_ms`), at most 5m; keep it below the idle
    /// timeout of any proxy in front of the daemon [default: 5m].
    #[arg(long, value_name = "DURATION", env = "ALLOT_MAX_WAIT", value_parser = allot_bench::duration::parse)]
    max_wait: Option<std::time::Duration>,
    /// Give these namespaces series of their own at /metrics (every namespace counts in the
    /// totals): `NAME` selects NAME and the namespaces under it (`NAME:...`), `PREFIX*` every name
    /// that starts with PREFIX, `*` all. Repeatable; replaces the file's `metrics_namespaces`.
    #[arg(long = "metrics-namespaces", value_name = "PATTERN")]
    metrics_namespaces: Vec<String>,
    /// The same for pools; replaces the file's `metrics_pools`.
    #[arg(long = "metrics-pools", value_name = "PATTERN")]
    metrics_pools: Vec<String>,
    /// Threads that serve requests [default: one per CPU on the embedded store; one per CPU
    /// less one, at least one, on Redis, which needs a CPU too].
    #[arg(long, env = "ALLOT_THREADS", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub(crate) threads: Option<u16>,
    /// On the embedded store, pin each thread that serves requests to a CPU of its own (when
    /// there are no more of them than CPUs this process may use): a shorter tail where other busy
    /// processes share the CPUs (the kernel cannot stack two serving threads on one CPU), for
    /// more CPU per request (docs/benchmarks.md).
    #[arg(long, env = "ALLOT_PIN_THREADS", value_name = "BOOL", default_value_t = false, action = clap::ArgAction::Set)]
    pin_threads: bool,
    /// Watch this directory for application files (`.yaml`, `.yml`, `.toml`, as `allot app
    /// submit` takes): a new file submits its application, a removed one removes it.
    #[arg(long, value_name = "DIR", env = "ALLOT_APPS_DIR")]
    apps_dir: Option<PathBuf>,
    /// On a Redis store, the base URL at which the other daemons reach this one while it
    /// schedules applications (they forward the applications part to it) [default:
    /// http://ADDRESS with the address it listens on; give it when listening on 0.0.0.0].
    #[arg(long, value_name = "URL", env = "ALLOT_ADVERTISE")]
    advertise: Option<String>,
    /// Log format on stderr.
    #[arg(long, env = "ALLOT_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
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
fn serving_threads(args: &ServeArgs) -> allot_server::ServingThreads {
    let count = if on_redis(args) { 0 } else { request_threads(args) };
    allot_server::ServingThreads { count, pin: args.pin_threads }
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// The configuration file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    listen: Option<SocketAddr>,
    data_dir: Option<PathBuf>,
    durability: Option<String>,
    store: Option<String>,
    redis_min_replicas: Option<u32>,
    /// Namespace quotas seeded at start [Flyte `ResourceRegistrar`]: created where they do not
    /// exist yet; the store is authoritative for the rest.
    #[serde(default)]
    quotas: BTreeMap<String, u64>,
    /// Leased resource pools seeded at start, e.g. `worker-1 = "cpu=16,mem=64GiB"`.
    #[serde(default)]
    pools: BTreeMap<String, String>,
    /// Offer this machine's resources as a pool of this name.
    local_pool: Option<String>,
    /// Pools whose tasks this daemon runs.
    #[serde(default)]
    run_pools: Vec<String>,
    /// Lease rules of allocs.
    #[serde(default)]
    alloc_leases: AllocLeases,
    /// The longest an allocate may wait, e.g. `60s` (default and most `5m`).
    max_wait: Option<String>,
    /// Namespaces and pools with series of their own at /metrics (patterns, see the flags).
    #[serde(default)]
    metrics_namespaces: Vec<String>,
    #[serde(default)]
    metrics_pools: Vec<String>,
    /// A directory of application files the daemon watches.
    apps_dir: Option<PathBuf>,
    /// Queues seeded at start, by path: created where they do not exist yet.
    #[serde(default)]
    queues: BTreeMap<String, QueueConfig>,
    #[serde(default)]
    scheduler: SchedulerConfig,
    #[serde(default)]
    executor: ExecutorFileConfig,
    #[serde(default)]
    plugins: PluginsConfig,
    /// Secrets given to plugins, by name: a value, `env:VAR` or `file:PATH`.
    #[serde(default)]
    secrets: BTreeMap<String, String>,
}

/// `[executor]`: the retry budgets of the tasks this daemon runs [Flyte's `RetryStrategy`
/// default and `max-node-retries-system-failures`].
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecutorFileConfig {
    /// New attempts after user failures, for a task whose spec names no `retries` (default 0).
    retries: Option<u32>,
    /// New attempts after system failures, for every task (default 3).
    system_retries: Option<u32>,
}

/// The retry policy from `[executor]`.
fn retry_policy(file: &ExecutorFileConfig) -> anyhow::Result<allot_core::runs::RetryPolicy> {
    use allot_core::runs::{RetryPolicy, MAX_RETRIES};
    let defaults = RetryPolicy::default();
    let (retries, system_retries) =
        (file.retries.unwrap_or(defaults.retries()), file.system_retries.unwrap_or(defaults.system_retries));
    for (key, value) in [("retries", retries), ("system_retries", system_retries)] {
        if value > MAX_RETRIES {
            bail!("[executor] {key} is {value}; the most is {MAX_RETRIES}");
        }
    }
    Ok(RetryPolicy::new(retries, system_retries))
}

/// `[plugins]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PluginsConfig {
    http_jobs: Option<u64>,
    #[serde(default)]
    task_types: BTreeMap<String, String>,
    #[serde(default)]
    external: BTreeMap<String, ExternalConfig>,
}

/// `[plugins.external.<id>]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExternalConfig {
    url: String,
    task_types: Vec<String>,
    jobs_quota: Option<u64>,
}

/// The plugins' settings, resolved.
#[derive(Debug, Default)]
struct Plugins {
    builtin: allot_exec::builtin::BuiltinConfig,
    task_types: BTreeMap<String, String>,
    secrets: BTreeMap<String, String>,
}

/// Reads a secret's value: `env:VAR`, `file:PATH` (its content, trailing newline cut) or the
/// value itself.
fn secret_value(name: &str, text: &str) -> anyhow::Result<String> {
    if let Some(var) = text.strip_prefix("env:") {
        std::env::var(var).with_context(|| format!("[secrets] {name}: environment variable {var} is not set"))
    } else if let Some(path) = text.strip_prefix("file:") {
        let value = std::fs::read_to_string(path).with_context(|| format!("[secrets] {name}: cannot read {path}"))?;
        Ok(value.trim_end_matches(['\n', '\r']).to_owned())
    } else {
        Ok(text.to_owned())
    }
}

fn plugins(file: PluginsConfig, secrets: BTreeMap<String, String>) -> anyhow::Result<Plugins> {
    let mut builtin = allot_exec::builtin::BuiltinConfig::default();
    if let Some(jobs) = file.http_jobs {
        builtin.http_jobs = jobs;
    }
    for (id, external) in file.external {
        builtin.external.push(allot_exec::builtin::ExternalPlugin {
            id,
            url: external.url,
            task_types: external.task_types,
            jobs_quota: external.jobs_quota,
        });
    }
    let secrets = secrets
        .iter()
        .map(|(name, text)| Ok((name.clone(), secret_value(name, text)?)))
        .collect::<anyhow::Result<_>>()?;
    Ok(Plugins { builtin, task_types: file.task_types, secrets })
}

/// `[queues."root.a.b"]`: a queue's limits; a limit not given is no limit.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct QueueConfig {
    guaranteed: Option<String>,
    max: Option<String>,
    max_apps: Option<u64>,
    user_max_apps: Option<u64>,
    user_max: Option<String>,
    sort: Option<String>,
}

/// `[scheduler]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SchedulerConfig {
    /// How long an application whose tasks have all ended waits for new ones before it is
    /// Completed (default 30s, YuniKorn's).
    completing_grace: Option<String>,
    /// How long an ended application stays readable (default 1h).
    app_retention: Option<String>,
}

/// A queue's limits from the file.
fn queue_limits(path: &str, queue: QueueConfig) -> anyhow::Result<QueueLimits> {
    let resources = |what: &str, text: Option<String>| -> anyhow::Result<Option<Resources>> {
        text.map(|t| t.parse().with_context(|| format!("[queues.\"{path}\"] {what}: `{t}`"))).transpose()
    };
    let sort = match queue.sort.as_deref() {
        None | Some("fifo") => SortPolicy::Fifo,
        Some("fair") => SortPolicy::Fair,
        Some("priority") => SortPolicy::Priority,
        Some(other) => bail!("[queues.\"{path}\"] sort: `{other}` is not fifo, fair or priority"),
    };
    Ok(QueueLimits {
        guaranteed: resources("guaranteed", queue.guaranteed)?.unwrap_or_default(),
        max: resources("max", queue.max)?,
        max_apps: queue.max_apps,
        user_max_apps: queue.user_max_apps,
        user_max: resources("user_max", queue.user_max)?,
        sort,
    })
}

/// `[alloc_leases]`: durations such as `2m` or `30s`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AllocLeases {
    /// The lease an alloc gets when it is made (default 2m).
    initial: Option<String>,
    /// The longest lease one keepalive grants (default 5m).
    max: Option<String>,
    /// How long after its lease lapses the sweeper reclaims an alloc (default 1m).
    reclaim_after: Option<String>,
    /// How long an ended alloc stays readable (default 1h).
    retention: Option<String>,
}

/// The configuration, resolved.
#[derive(Debug)]
struct Config {
    listen: SocketAddr,
    data_dir: PathBuf,
    durability: Durability,
    store: StoreChoice,
    quotas: Vec<(NamespaceName, u64)>,
    pools: Vec<(PoolName, Resources)>,
    pool_rules: LeaseRules,
    max_wait: std::time::Duration,
    metrics: MetricsConfig,
    queues: Vec<(QueuePath, QueueLimits)>,
    sched: SchedConfig,
    apps_dir: Option<PathBuf>,
    run_pools: Vec<PoolName>,
    retry: allot_core::runs::RetryPolicy,
    plugins: Plugins,
}

/// The lease rules from the file's `[alloc_leases]` and the flags (which win).
fn lease_rules(args: &ServeArgs, file: &AllocLeases) -> anyhow::Result<LeaseRules> {
    let mut rules = LeaseRules::default();
    let ms = |what: &str, text: &str| -> anyhow::Result<u64> {
        let duration =
            allot_bench::duration::parse(text).map_err(|err| anyhow::anyhow!("[alloc_leases] {what}: {err}"))?;
        Ok(duration.as_millis().min(u128::from(u64::MAX)) as u64)
    };
    for (what, text, field) in [
        ("initial", &file.initial, &mut rules.initial_ms),
        ("max", &file.max, &mut rules.max_ms),
        ("reclaim_after", &file.reclaim_after, &mut rules.reclaim_after_ms),
        ("retention", &file.retention, &mut rules.retention_ms),
    ] {
        if let Some(text) = text {
            *field = ms(what, text)?;
        }
    }
    if let Some(lease) = args.alloc_lease {
        rules.initial_ms = lease.as_millis() as u64;
    }
    if let Some(max) = args.alloc_max_lease {
        rules.max_ms = max.as_millis() as u64;
    }
    if rules.initial_ms == 0 || rules.max_ms == 0 {
        bail!("alloc leases must be longer than zero");
    }
    Ok(rules)
}

#[derive(Debug)]
enum StoreChoice {
    Embedded,
    Redis(RedisConfig),
}

fn store_choice(address: Option<&str>) -> anyhow::Result<StoreChoice> {
    match address.map(str::trim) {
        None | Some("embedded") => Ok(StoreChoice::Embedded),
        Some(address) => Ok(StoreChoice::Redis(
            RedisConfig::parse(address).map_err(|err| anyhow::anyhow!("{err}, or `embedded` for the default store"))?,
        )),
    }
}

fn read_config_file(path: &Path) -> anyhow::Result<ConfigFile> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("invalid configuration file {}", path.display()))
}

fn resolve(args: &ServeArgs) -> anyhow::Result<Config> {
    let file = match &args.config {
        Some(path) => read_config_file(path)?,
        None => ConfigFile::default(),
    };
    let mut quotas = file.quotas;
    for quota in &args.quotas {
        let Some((name, value)) = quota.rsplit_once('=') else {
            bail!("--quota takes NAMESPACE=QUOTA, got `{quota}`");
        };
        let value: u64 =
            value.trim().parse().with_context(|| format!("--quota {quota}: the quota must be a whole number"))?;
        quotas.insert(name.to_owned(), value);
    }
    let quotas = quotas
        .into_iter()
        .map(|(name, quota)| Ok((NamespaceName::new(&name).with_context(|| format!("quota for `{name}`"))?, quota)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let pool_rules = lease_rules(args, &file.alloc_leases)?;
    let mut pools = file.pools;
    for pool in &args.pools {
        let Some((name, capacity)) = pool.split_once('=') else {
            bail!("--pool takes POOL=RESOURCES, e.g. worker-1=cpu=16,mem=64GiB; got `{pool}`");
        };
        pools.insert(name.to_owned(), capacity.to_owned());
    }
    let data_dir = args.data_dir.clone().or(file.data_dir).unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
    let store = store_choice(args.store.as_deref().or(file.store.as_deref()))?;
    let store = match (store, args.redis_min_replicas.or(file.redis_min_replicas)) {
        (StoreChoice::Redis(redis), Some(replicas)) => StoreChoice::Redis(redis.with_min_replicas(replicas)),
        (StoreChoice::Embedded, Some(_)) => bail!(
            "--redis-min-replicas applies to a Redis store (--store redis://...); the embedded store's \
             guarantee is set with --durability"
        ),
        (store, None) => store,
    };
    let durability = match (args.durability, file.durability.as_deref()) {
        (Some(level), _) => Some(level),
        (None, Some(text)) => Some(text.parse().map_err(|err: String| anyhow::anyhow!("durability: {err}"))?),
        (None, None) => None,
    };
    if durability.is_some() && !matches!(store, StoreChoice::Embedded) {
        bail!(
            "--durability applies to the embedded store; on Redis an answer is as durable as Redis's own \
             persistence settings (appendonly, appendfsync) make it"
        );
    }
    let durability = durability.unwrap_or_default();
    let mut run_pools = if args.run_pools.is_empty() { file.run_pools } else { args.run_pools.clone() };
    if let Some(name) = args.local_pool.clone().or(file.local_pool) {
        let capacity = local_resources(&data_dir).context("cannot detect this machine's resources for --local-pool")?;
        pools.insert(name.clone(), capacity.to_string());
        run_pools.push(name);
    }
    let run_pools = run_pools
        .iter()
        .map(|name| PoolName::new(name).with_context(|| format!("--run-pool `{name}`")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let pools = pools
        .into_iter()
        .map(|(name, capacity)| {
            let pool = PoolName::new(&name).with_context(|| format!("pool `{name}`"))?;
            let capacity: Resources =
                capacity.parse().with_context(|| format!("the capacity of pool `{name}`: `{capacity}`"))?;
            Ok((pool, capacity))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let max_wait = match (args.max_wait, &file.max_wait) {
        (Some(flag), _) => flag,
        (None, Some(text)) => allot_bench::duration::parse(text).map_err(|err| anyhow::anyhow!("max_wait: {err}"))?,
        (None, None) => allot_store::MAX_WAIT,
    };
    if max_wait > allot_store::MAX_WAIT {
        bail!("--max-wait (max_wait) is {max_wait:?}; the most is 5m");
    }
    let pick = |flags: &[String], file: Vec<String>| if flags.is_empty() { file } else { flags.to_vec() };
    let metrics = MetricsConfig {
        namespaces: pick(&args.metrics_namespaces, file.metrics_namespaces),
        pools: pick(&args.metrics_pools, file.metrics_pools),
    };
    metrics.check().map_err(anyhow::Error::msg)?;
    let queues = file
        .queues
        .into_iter()
        .map(|(path, queue)| {
            let queue_path = QueuePath::new(&path).with_context(|| format!("[queues.\"{path}\"]"))?;
            Ok((queue_path, queue_limits(&path, queue)?))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let ms = |key: &str, text: &Option<String>| -> anyhow::Result<Option<u64>> {
        text.as_deref()
            .map(|text| {
                let duration =
                    allot_bench::duration::parse(text).map_err(|err| anyhow::anyhow!("[scheduler] {key}: {err}"))?;
                Ok(duration.as_millis() as u64)
            })
            .transpose()
    };
    let defaults = SchedConfig::default();
    let sched = SchedConfig {
        completing_grace_ms: ms("completing_grace", &file.scheduler.completing_grace)?
            .unwrap_or(defaults.completing_grace_ms),
        retention_ms: ms("app_retention", &file.scheduler.app_retention)?.unwrap_or(defaults.retention_ms),
        ..defaults
    };
    Ok(Config {
        retry: retry_policy(&file.executor)?,
        plugins: plugins(file.plugins, file.secrets)?,
        run_pools,
        apps_dir: args.apps_dir.clone().or(file.apps_dir),
        queues,
        sched,
        pools,
        pool_rules,
        max_wait,
        metrics,
        listen: args.listen.or(file.listen).unwrap_or_else(|| DEFAULT_LISTEN.parse().expect("valid address")),
        data_dir,
        durability,
        store,
        quotas,
    })
}

/// Logs on stderr, filtered by `RUST_LOG`: a level (`info`, the default) and `target=level`
/// items, comma-separated (e.g. `info,allot_store=debug`).
fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let (filter, bad) = match std::env::var("RUST_LOG") {
        Ok(text) if !text.trim().is_empty() => match text.parse::<Targets>() {
            Ok(filter) => (filter, None),
            Err(err) => (Targets::new().with_default(tracing::Level::INFO), Some(format!("`{text}`: {err}"))),
        },
        _ => (Targets::new().with_default(tracing::Level::INFO), None),
    };
    let ansi = std::io::stderr().is_terminal();
    let registry = tracing_subscriber::registry().with(filter);
    match format {
        LogFormat::Text => {
            registry.with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi)).init()
        }
        LogFormat::Json => registry.with(tracing_subscriber::fmt::layer().json().with_writer(std::io::stderr)).init(),
    }
    if let Some(bad) = bad {
        tracing::warn!("RUST_LOG is not a filter ({bad}); logging at info");
    }
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(err) => {
                tracing::error!(error = %err, "cannot listen for SIGTERM");
                let _ = interrupt.await;
                return;
            }
        };
        tokio::select! {
            _ = interrupt => tracing::info!("SIGINT received"),
            _ = terminate.recv() => tracing::info!("SIGTERM received"),
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}

pub(crate) async fn run(args: ServeArgs) -> anyhow::Result<()> {
    init_logging(args.log_format);
    let config = resolve(&args)?;
    // Listening first: on Redis, the other daemons reach this one at its address if it schedules.
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let address = listener.local_addr()?;
    // The URL the other daemons reach this one at: it names this daemon in the scheduler's lease
    // and in its executor's.
    let advertise = match &args.advertise {
        Some(url) => url.trim_end_matches('/').to_owned(),
        None if address.ip().is_unspecified() => format!("http://127.0.0.1:{}", address.port()),
        None => format!("http://{address}"),
    };
    let store: Arc<dyn Store> = match &config.store {
        StoreChoice::Embedded => {
            let store =
                EmbeddedStore::open(&EmbeddedConfig::new(config.data_dir.clone()).with_durability(config.durability))
                    .with_context(|| format!("cannot open the store in {}", config.data_dir.display()))?;
            store.set_pool_rules(config.pool_rules);
            store.set_sched_config(config.sched.clone());
            Arc::new(store)
        }
        StoreChoice::Redis(redis) => {
            // Each daemon would watch its own directory, and only the one that schedules can
            // submit: the source would follow the lease around. Not carried yet.
            anyhow::ensure!(
                config.apps_dir.is_none(),
                "--apps-dir needs the embedded store: on Redis, submit applications through the API \
                 (`allot app submit FILE` to any daemon)"
            );
            let store = RedisStore::open(redis).await.context("cannot open the Redis store")?;
            store.set_pool_rules(config.pool_rules);
            store.set_sched_config(config.sched.clone());
            if args.advertise.is_none() && address.ip().is_unspecified() {
                tracing::warn!(
                    %address,
                    "listening on every interface: give --advertise so that the other daemons reach this one \
                     when it schedules; using 127.0.0.1 meanwhile"
                );
            }
            store.start_scheduling(&advertise);
            Arc::new(store)
        }
    };
    for (name, quota) in &config.quotas {
        let (created, view) =
            seeded(&format!("cannot register quota of `{name}`"), || store.seed_namespace(name.clone(), *quota))
                .await?;
        if created {
            tracing::info!(namespace = %name, quota, "quota registered");
        } else if view.quota != *quota {
            tracing::warn!(
                namespace = %name,
                configured = quota,
                kept = view.quota,
                "the store already has this namespace and keeps its quota; change it with `allot quota set`"
            );
        }
    }
    for (name, capacity) in &config.pools {
        let (created, view) =
            seeded(&format!("cannot register pool `{name}`"), || store.seed_pool(name.clone(), capacity.clone()))
                .await?;
        if created {
            tracing::info!(pool = %name, capacity = %capacity, "pool registered");
        } else if view.capacity != *capacity {
            tracing::warn!(
                pool = %name,
                configured = %capacity,
                kept = %view.capacity,
                "the store already has this pool and keeps its capacity; change it with `allot pool set`"
            );
        }
    }
    for (path, limits) in &config.queues {
        match store.seed_queue(path.clone(), limits.clone()).await {
            Ok((true, _)) => tracing::info!(queue = %path, "queue registered"),
            Ok((false, view)) if view.limits != *limits => tracing::warn!(
                queue = %path,
                "the store already has this queue and keeps its limits; change them with `allot queue set`"
            ),
            Ok(_) => {}
            Err(err) => return Err(err).with_context(|| format!("cannot register queue `{path}`")),
        }
    }
    tracing::info!(%address, data_dir = %config.data_dir.display(), backend = store.backend(), durability = store.durability(), "allot serving");
    // The one line on stdout: scripts and tests read the address from it.
    println!("allot listening on http://{address}");
    let mut state =
        allot_server::ServerState::new(store.clone()).with_max_wait(config.max_wait).with_metrics(config.metrics);
    let (stop_executor, executor_stopped) = tokio::sync::watch::channel(false);
    if !config.run_pools.is_empty() {
        let executor = start_executor(
            &store,
            &config.run_pools,
            &config.data_dir,
            &config.plugins,
            config.retry,
            advertise.clone(),
        )
        .await?;
        state = state.with_executor(Arc::new(RunsHere(executor.clone())));
        tokio::spawn(executor.run(executor_stopped));
    }
    // The sources of applications: the API, and the directory of application files if one is set.
    let mut http = HttpApi::new(listener, state, serving_threads(&args));
    let mut directory = config.apps_dir.map(|dir| DirectorySource::new(dir, store.clone()));
    if let Some(directory) = &mut directory {
        directory.init().await.context("the applications directory")?;
    }
    http.init().await?;
    http.start().await?;
    if let Some(directory) = &mut directory {
        directory.start().await?;
    }
    let names: Vec<&str> = std::iter::once(http.name()).chain(directory.as_ref().map(|d| d.name())).collect();
    tracing::info!(sources = ?names, "taking applications in");
    let failed = tokio::select! {
        _ = shutdown_signal() => None,
        result = http.failed() => Some(result),
    };
    stop_executor.send_replace(true);
    if let Some(directory) = &mut directory {
        directory.stop().await;
    }
    match failed {
        Some(result) => result.context("server failed"),
        None => {
            http.stop().await;
            Ok(())
        }
    }
}

/// Loads the plugins (a failing one stops the start) and makes the executor of the tasks placed
/// on `pools`.
async fn start_executor(
    store: &Arc<dyn Store>,
    pools: &[PoolName],
    data_dir: &Path,
    plugins: &Plugins,
    retry: allot_core::runs::RetryPolicy,
    node: String,
) -> anyhow::Result<Arc<allot_exec::Executor>> {
    use allot_exec::{builtin, Executor, ExecutorConfig, Registry, Secrets, SetupContext, Waker};

    // Plugins wake their tasks through the executor, which exists once they are loaded: the
    // waker forwards to it.
    let executor: Arc<std::sync::OnceLock<Arc<Executor>>> = Arc::default();
    let forward = {
        let executor = executor.clone();
        Waker::new(move |run| {
            if let Some(executor) = executor.get() {
                executor.wake(run);
            }
        })
    };
    let secrets = Secrets::new(plugins.secrets.clone());
    let counters = allot_exec::PluginCounters::default();
    let registry = Registry::load(builtin::configured(&plugins.builtin), &plugins.task_types, |id| {
        SetupContext::new(id, store.clone(), secrets.clone(), forward.clone()).with_counters(counters.clone())
    })
    .await
    .context("cannot load the task plugins")?;
    let mut config = ExecutorConfig::new(pools.iter().cloned().collect(), data_dir.join("tasks"));
    config.secrets = secrets;
    config.counters = counters;
    config.node = node;
    config.retry = retry;
    let made = Executor::new(store.clone(), Arc::new(registry), config);
    let _ = executor.set(made.clone());
    tracing::info!(pools = ?pools, "running the tasks placed on these pools");
    Ok(made)
}

/// This machine's resources [Reflow's local pool]: cpu from the available parallelism, memory
/// from /proc/meminfo less 5 % for the system, disk from the filesystem of the data directory.
fn local_resources(data_dir: &Path) -> anyhow::Result<Resources> {
    let cpus = std::thread::available_parallelism().map(|n| n.get() as u64).unwrap_or(1);
    let meminfo = std::fs::read_to_string("/proc/meminfo").context("cannot read /proc/meminfo")?;
    let mem_kib: u64 = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .context("/proc/meminfo has no MemTotal")?;
    let mem = mem_kib * 1024 / 100 * 95;
    std::fs::create_dir_all(data_dir).with_context(|| format!("cannot create {}", data_dir.display()))?;
    let disk = disk_bytes(data_dir)?;
    Ok(Resources::new().with("cpu", cpus).with("mem", mem).with("disk", disk))
}

/// The size of the filesystem that holds `path`, from `df`.
fn disk_bytes(path: &Path) -> anyhow::Result<u64> {
    let output = std::process::Command::new("df")
        .args(["-P", "-k"])
        .arg(path)
        .output()
        .context("cannot run df to measure the disk")?;
    let text = String::from_utf8_lossy(&output.stdout);
    let kib: u64 = text
        .lines()
        .nth(1)
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|size| size.parse().ok())
        .with_context(|| format!("cannot read the disk size from df: {text}"))?;
    Ok(kib * 1024)
}

/// The executor as the HTTP edge sees it (`allot_server::RunsHere`): the server does not depend
/// on the executor; the binary joins them.
struct RunsHere(Arc<allot_exec::Executor>);

impl allot_server::RunsHere for RunsHere {
    fn node(&self) -> &str {
        self.0.node()
    }

    fn wake(&self, app: &allot_core::apps::AppId, task: &allot_core::apps::TaskId) -> bool {
        self.0.wake_driven(&allot_exec::RunKey { app: app.clone(), task: task.clone() })
    }

    fn counters(&self) -> allot_server::RunCounters {
        let counts = self.0.stats().counts();
        allot_server::RunCounters {
            active: self.0.active() as u64,
            rounds: counts.rounds,
            succeeded: counts.succeeded,
            failed: counts.failed,
            aborted: counts.aborted,
            retried: counts.retried,
            cache_hits: counts.cache_hits,
            cache_misses: counts.cache_misses,
            held_back: counts.held_back,
            plugins: self.0.plugin_counters().snapshot(),
        }
    }
}

/// How long the daemon's start waits for a store that is not ready yet (a Redis still loading, a
/// shard whose replicas are not attached yet) before it gives up.
const SEED_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// Runs a call of the start's seeding (idempotent: it creates only what does not exist) again
/// while the store answers that it is not ready, for [`SEED_PATIENCE`] at most; `what` names it
/// in the error.
async fn seeded<T, Call, Answer>(what: &str, mut call: Call) -> anyhow::Result<T>
where
    Call: FnMut() -> Answer,
    Answer: std::future::Future<Output = Result<T, allot_store::StoreError>>,
{
    use allot_store::StoreError;
    let started = std::time::Instant::now();
    let mut warned = false;
    loop {
        match call().await {
            Err(
                err @ (StoreError::Unavailable(_) | StoreError::OutcomeUnknown(_) | StoreError::NotEnoughReplicas(_)),
            ) if started.elapsed() < SEED_PATIENCE => {
                if !std::mem::replace(&mut warned, true) {
                    tracing::warn!(error = %err, "{what} yet: the store is not ready; trying again for up to 30 s");
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            other => return other.with_context(|| what.to_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names serde expects in a table, from its error for an unknown key.
    fn keys_of<T: serde::de::DeserializeOwned + std::fmt::Debug>(table: &str) -> Vec<String> {
        let err = toml::from_str::<T>(&format!("{table}no_such_key = 1")).unwrap_err().to_string();
        let expected = err.split("expected").nth(1).unwrap_or_else(|| panic!("no list of keys in: {err}"));
        expected.split('`').skip(1).step_by(2).map(str::to_owned).collect()
    }

    #[test]
    fn serve_help_lists_every_configuration_key() {
        let top = keys_of::<ConfigFile>("");
        let leases = keys_of::<ConfigFile>("[alloc_leases]\n");
        let queue = keys_of::<ConfigFile>("[queues.\"root.a\"]\n");
        let scheduler = keys_of::<ConfigFile>("[scheduler]\n");
        let plugins = keys_of::<ConfigFile>("[plugins]\n");
        let executor = keys_of::<ConfigFile>("[executor]\n");
        let external = keys_of::<ConfigFile>("[plugins.external.x]\nurl = \"http://a\"\ntask_types = []\n");
        assert!(
            top.contains(&"alloc_leases".to_owned()) && leases.contains(&"retention".to_owned()),
            "{top:?} {leases:?}"
        );
        assert!(queue.contains(&"user_max".to_owned()) && scheduler.contains(&"completing_grace".to_owned()));
        assert!(plugins.contains(&"task_types".to_owned()) && external.contains(&"jobs_quota".to_owned()));
        assert!(executor.contains(&"system_retries".to_owned()), "{executor:?}");
        let tables = [&leases, &queue, &scheduler, &plugins, &external, &executor];
        for key in top.iter().chain(tables.into_iter().flatten()) {
            let listed = SERVE_AFTER_HELP.lines().any(|line| {
                let line = line.trim_start();
                line.starts_with(&format!("{key} ="))
                    || line.starts_with(&format!("[{key}]"))
                    || line.starts_with(&format!("[{key}."))
                    || (line.starts_with('[')
                        && (line.contains(&format!(".{key}.")) || line.contains(&format!(".{key}]"))))
            });
            assert!(listed, "`{key}` is missing from `allot serve --help`");
        }
        // The example in the help is a valid file.
        let example: String = SERVE_AFTER_HELP
            .lines()
            .take_while(|line| !line.starts_with("Flags"))
            .skip(1)
            .map(|line| line.to_owned() + "\n")
            .collect();
        let file: ConfigFile = toml::from_str(&example).unwrap_or_else(|err| panic!("{err}\n{example}"));
        assert_eq!(file.alloc_leases.retention.as_deref(), Some("1h"));
        assert_eq!(file.plugins.external["warehouse"].jobs_quota, Some(4));
        assert_eq!(retry_policy(&file.executor).unwrap(), allot_core::runs::RetryPolicy::new(0, 3));
    }

    #[test]
    fn retry_budgets_come_from_the_file_within_bounds() {
        let file: ConfigFile = toml::from_str("[executor]\nretries = 2\nsystem_retries = 5\n").unwrap();
        let policy = retry_policy(&file.executor).unwrap();
        assert_eq!((policy.user_attempts, policy.system_retries), (3, 5), "2 retries: 3 attempts in all");
        let file: ConfigFile = toml::from_str("[executor]\nsystem_retries = 101\n").unwrap();
        let err = retry_policy(&file.executor).unwrap_err().to_string();
        assert_eq!(err, "[executor] system_retries is 101; the most is 100");
    }
}
