//! The configuration of `allot serve`: the TOML file's schema (every key is in
//! [`SERVE_AFTER_HELP`], which a test checks), and the resolution of flags, environment, file and
//! defaults (in that order) into one checked [`Config`], names and resources parsed.
//!
//! At length, as one thing: the file's schema, the help text that lists its every key and the
//! resolution of each key are kept side by side, so that a key cannot be added to one alone.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use allot_core::apps::priority::{PriorityClasses, PriorityPolicy};
use allot_core::apps::queues::PreemptionPolicy;
use allot_core::apps::queues::{QueueLimits, QueuePath, SortPolicy};
use allot_core::apps::SchedConfig;
use allot_core::pools::{LeaseRules, PoolName};
use allot_core::{NamespaceName, Resources};
use allot_server::MetricsConfig;
use allot_store::{Durability, WatchConfig};
use allot_store_redis::RedisConfig;
use anyhow::{bail, Context};
use serde::Deserialize;

use super::flags::ServeArgs;

/// The default listen address: loopback only.
const DEFAULT_LISTEN: &str = "127.0.0.1:7070";
/// The default data directory, relative to the working directory.
const DEFAULT_DATA_DIR: &str = "allot-data";

/// `allot serve --help` after the options: every key of the configuration file, and the exit
/// codes. A test checks that every key the file accepts is here.
pub(crate) const SERVE_AFTER_HELP: &str = r#"Configuration file (--config), with every key:
  listen = "127.0.0.1:7070"     # --listen
  data_dir = "allot-data"       # --data-dir
  durability = "disk"           # --durability: disk or process (the embedded store)
  store = "embedded"            # --store
  redis_min_replicas = 1        # --redis-min-replicas: replicas a change reaches before its answer
  redis_sched_refresh = "1s"    # --redis-sched-refresh: how often waiting applications see others' room
  redis_wake_poll = "250ms"     # --redis-wake-poll: how often a waiting allocate checks without a message
  local_pool = "local"          # --local-pool (its tasks are run here)
  run_pools = ["worker-1"]      # --run-pool: run the tasks placed on these pools here
  max_wait = "5m"               # --max-wait: the longest an allocate may wait (at most 5m)
  idle_timeout = "2m"           # --idle-timeout: a connection idle this long is closed
  max_connections = 10000       # --max-connections: the most open at once (default: from the open-files limit)
  metrics_namespaces = ["hive"] # --metrics-namespaces: series of their own at /metrics
  metrics_pools = ["worker-*"]  # --metrics-pools: the same for pools (else totals only)
  apps_dir = "apps"             # --apps-dir: application files the daemon watches
  audit_log = "audit.jsonl"     # --audit-log: the audit trail (default: the log, with [auth]; "off": none)
  tls_cert = "cert.pem"         # --tls-cert: serve HTTPS (re-read on SIGHUP or change)
  tls_key = "key.pem"           # --tls-key
  tls_client_ca = "ca.pem"      # --tls-client-ca: client certificates name the caller
  peer_ca_cert = "ca.pem"       # --peer-ca-cert: the CA of the other daemons' HTTPS (default: tls_cert's)
  redis_ca_cert = "redis-ca.pem" # --redis-ca-cert: the CA of a rediss:// server
  [quotas]                      # --quota: namespace = quota
  "hive:cluster-a" = 10
  [pools]                       # --pool: pool = "resources"
  worker-1 = "cpu=16,mem=64GiB"
  [pools.web-1]                 # or a table: its capacity, and what its executor runs
  capacity = "cpu=4"
  plugins = ["http", "noop"]    # the task types placed there (set at every start; default: every type)
  [queues."root.analytics"]     # queues seeded at start (parents are made)
  guaranteed = "cpu=16"         # fair share between sibling queues
  max = "cpu=64,mem=256GiB"     # the most its applications hold together
  max_apps = 20                 # the most applications running at once
  user_max_apps = 5             # the same, per user
  user_max = "cpu=16"           # the most one user's applications hold
  sort = "fifo"                 # fifo, fair or priority
  group_max_apps = 10           # the same, per group (an application counts for its user's first group)
  group_max = "cpu=32"          # the most one group's applications hold
  submit_acl = "ada,bob data"   # who may submit here and below (YuniKorn's format; "*": all)
  admin_acl = " ops"            # who may administer (and submit) here and below
  borrow_limit = "cpu=8"        # the most it holds beyond its guarantee (a resource not named: no limit)
  lend_limit = "cpu=4"          # the most of its unused guarantee others may use; the rest is kept for it
  priority_offset = 100         # added to the priority it shows its parent (queues go by priority, then fair share)
  priority_policy = "fence"     # default, or fence: its parent sees the offset alone
  preemption = "default"        # default; fence: its tasks preempt only inside it; disabled: never preempted
  preemption_delay = "30s"      # how long a task waits before it may preempt (default: its parent's, else 30s)
  [[placement_rules]]           # choose the queue of an application that names none, or one its
                                # user may not submit to: the first rule giving a usable queue wins
  name = "user"                 # provided, user, primary_group, tag or fixed
  create = true                 # make the queue (a leaf, no limits) when it is missing
  parent = { name = "fixed", value = "root.users" } # what a name goes under (a rule itself; default root)
  [placement_rules.filter]      # whom the rule is for (none: everyone)
  type = "allow"                # allow: those listed; deny: all but those listed
  users = ["ada"]               # names, or regular expressions matching whole names
  groups = ["data-.*"]
  [[placement_rules]]
  name = "tag"
  value = "team"                # tag: the tag whose value names the queue; fixed: the queue
  [scheduler]
  completing_grace = "30s"      # how long an application whose tasks all ended waits for more
  app_retention = "1h"          # how long an ended application stays readable
  never_fits_grace = "5m"       # how long an application with a task that can never fit waits
  default_priority_class = "normal" # the class of an application that names no priority (default: 0)
  preemption = true             # preempt to restore guarantees and priorities (queues may opt out)
  preemption_grace = "30s"      # how long a preempted task's executor has to end it
  max_preemptions = 3           # a task preempted this many times is not taken again
  [priority_classes]            # named priorities for applications and tasks (priority_class = "high")
  high = 1000
  normal = 0
  [backup]                      # scheduled snapshots of the store, as `allot snapshot save` writes them (on Redis: by the daemon that schedules)
  every = "1h"                  # how often (default 1h)
  dir = "/var/backups/allot"    # where (each file allot-<time>.snapshot)
  keep = 24                     # the newest kept; older ones are removed (default 24)
  [watch]                       # the change feed (GET /v1/watch); on Redis, the shared log
  retain_events = 100000        # the most events kept for watchers that resume
  retain_for = "1h"             # events older than this are not kept
  buffer = 4096                 # events a watcher may lag behind before it is ended
  [executor]                    # the tasks run here: how they are retried (Flyte's budgets), found
  retries = 0                   # new attempts after user failures, for a task whose spec names none
  system_retries = 3            # new attempts after system failures (a daemon lost, a service down)
  scan = "10s"                  # how often the tasks placed here are listed, though the feed brings them
  scan_without_feed = "200ms"   # how often they are listed on a store without a change feed
  cache_retention = "30days"    # how long outputs kept for reuse (cache_version) stay, from when kept
  [plugins]                     # a plugin's quota is this file's value at every start
  http_jobs = 10                # the http plugin's jobs at once (its quota `http:jobs`)
  [plugins.http.services.reports] # a service http tasks may call: their spec.url is this URL or under it
  url = "https://jobs.example/reports"
  secret = "reports-token"      # optional: the [secrets] entry sent to it as a bearer token
  [plugins.shell]               # whom shell commands run as
  run_as = "allot-task"         # an unprivileged user of this machine (default: the daemon's own)
  allow_root = false            # with [auth], commands that would run as root are refused unless true
  [plugins.task_types]          # the plugin of a task type that several plugins register
  sql = "warehouse"
  [plugins.external.warehouse]  # a plugin served by another process (create, get, delete)
  url = "http://127.0.0.1:8000/tasks"
  task_types = ["sql"]
  jobs_quota = 4                # optional: its jobs at once (its quota `warehouse:jobs`)
  secret = "warehouse-token"    # optional: the [secrets] entry sent to it as a bearer token
  [secrets]                     # what plugins' calls carry: a value, or read from env: or file:
  warehouse-token = "env:WAREHOUSE_TOKEN"
  reports-token = "file:/etc/allot/reports-token"
  [auth]                        # API tokens and roles: with it, every call needs a token
  open_metrics = false          # serve /metrics without a token
  open_document = false         # serve /openapi.json without a token
  daemon_token = "env:ALLOT_DAEMON_TOKEN" # what this daemon's own calls to the others carry
  [[auth.tokens]]               # `allot api-token make` prints one
  name = "ada-laptop"
  user = "ada"
  groups = ["hive"]
  hash = "sha256:..."
  expires = "2027-01-31T00:00:00Z"
  [auth.roles.hive-team]        # permissions over patterns: namespace:, pool:, queue:, daemon, *
  read = ["pool:*"]
  use = ["namespace:hive:*", "queue:root.hive"]
  admin = []
  impersonate = []
  [[auth.bindings]]             # roles given to users and groups (built in: admin, reader)
  role = "hive-team"
  users = []
  groups = ["hive"]
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

/// The configuration file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    listen: Option<SocketAddr>,
    data_dir: Option<PathBuf>,
    durability: Option<String>,
    store: Option<String>,
    redis_min_replicas: Option<u32>,
    redis_sched_refresh: Option<String>,
    redis_wake_poll: Option<String>,
    /// Namespace quotas seeded at start [Flyte `ResourceRegistrar`]: created where they do not
    /// exist yet; the store is authoritative for the rest.
    #[serde(default)]
    quotas: BTreeMap<String, u64>,
    /// Leased resource pools seeded at start, e.g. `worker-1 = "cpu=16,mem=64GiB"`, or
    /// `[pools.worker-1]` with `capacity` and `plugins` (the task types its executor runs).
    #[serde(default)]
    pools: BTreeMap<String, PoolEntry>,
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
    /// How long a connection may go without a request's headers, e.g. `2m` (the default).
    idle_timeout: Option<String>,
    /// The most connections open at once (default: from the open-files limit).
    max_connections: Option<u32>,
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
    /// The rules that choose an application's queue, tried in order.
    #[serde(default)]
    placement_rules: Vec<RuleConfig>,
    #[serde(default)]
    scheduler: SchedulerConfig,
    /// Named priorities applications and tasks may ask for: name = value.
    #[serde(default)]
    priority_classes: BTreeMap<String, i32>,
    #[serde(default)]
    watch: WatchFileConfig,
    /// Scheduled snapshots.
    backup: Option<BackupFileConfig>,
    #[serde(default)]
    executor: ExecutorFileConfig,
    #[serde(default)]
    plugins: PluginsConfig,
    /// Secrets given to plugins, by name: a value, `env:VAR` or `file:PATH`.
    #[serde(default)]
    secrets: BTreeMap<String, String>,
    /// API tokens and roles: with it, every call needs a token.
    auth: Option<super::auth::AuthFile>,
    /// The audit trail's file (`--audit-log`).
    audit_log: Option<PathBuf>,
    /// HTTPS (`--tls-cert`, `--tls-key`, `--tls-client-ca`).
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_client_ca: Option<PathBuf>,
    /// `--redis-ca-cert`.
    redis_ca_cert: Option<PathBuf>,
    /// `--peer-ca-cert`.
    peer_ca_cert: Option<PathBuf>,
}

/// `[backup]`: scheduled snapshots of the store.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct BackupFileConfig {
    every: Option<String>,
    dir: Option<PathBuf>,
    keep: Option<usize>,
}

/// Scheduled snapshots, from `[backup]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct BackupConfig {
    pub(super) every: Duration,
    pub(super) dir: PathBuf,
    pub(super) keep: usize,
}

fn backup_config(file: Option<BackupFileConfig>) -> anyhow::Result<Option<BackupConfig>> {
    let Some(file) = file else { return Ok(None) };
    let every = match file.every.as_deref() {
        None => Duration::from_secs(3600),
        Some(text) => allot_bench::duration::parse(text).map_err(|err| anyhow::anyhow!("[backup] every: {err}"))?,
    };
    if every < Duration::from_secs(1) {
        bail!("[backup] every: at least 1s");
    }
    let dir = file.dir.ok_or_else(|| anyhow::anyhow!("[backup] dir: where to write the backups is needed"))?;
    let keep = file.keep.unwrap_or(24);
    if keep == 0 {
        bail!("[backup] keep: at least 1 (the newest backup is always kept)");
    }
    Ok(Some(BackupConfig { every, dir, keep }))
}

/// `[executor]`: the retry budgets of the tasks this daemon runs [Flyte's `RetryStrategy`
/// default and `max-node-retries-system-failures`], and how often it lists them.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecutorFileConfig {
    /// New attempts after user failures, for a task whose spec names no `retries` (default 0).
    retries: Option<u32>,
    /// New attempts after system failures, for every task (default 3).
    system_retries: Option<u32>,
    /// How often the tasks placed here are listed while the change feed brings them (a safety
    /// net; default 10 s).
    scan: Option<String>,
    /// How often they are listed on a store without a change feed (default 200 ms).
    scan_without_feed: Option<String>,
    /// How long outputs kept for reuse stay, from when they were kept (default 30 days).
    cache_retention: Option<String>,
}

/// How often the executor lists the tasks placed on its pools, and how long the outputs it keeps
/// for reuse stay, from `[executor]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ExecutorTimes {
    /// While it follows the change feed.
    pub(super) scan: Duration,
    /// On a store without one.
    pub(super) without_feed: Duration,
    /// How long outputs kept for reuse stay (from when they were kept).
    pub(super) cache_retention: Duration,
}

fn executor_times(file: &ExecutorFileConfig) -> anyhow::Result<ExecutorTimes> {
    use allot_exec::ExecutorConfig;
    let read = |key: &str, text: &Option<String>, default: Duration| -> anyhow::Result<Duration> {
        let Some(text) = text.as_deref() else { return Ok(default) };
        let duration = allot_bench::duration::parse(text).map_err(|err| anyhow::anyhow!("[executor] {key}: {err}"))?;
        if duration.is_zero() {
            bail!("[executor] {key}: must be more than 0");
        }
        Ok(duration)
    };
    Ok(ExecutorTimes {
        scan: read("scan", &file.scan, ExecutorConfig::SCAN)?,
        without_feed: read("scan_without_feed", &file.scan_without_feed, ExecutorConfig::SCAN_WITHOUT_FEED)?,
        cache_retention: read("cache_retention", &file.cache_retention, ExecutorConfig::CACHE_RETENTION)?,
    })
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

/// A pool of `[pools]`: its capacity, or a table with its capacity and the task types its
/// executor runs.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum PoolEntry {
    Capacity(String),
    Table(PoolTable),
}

/// `[pools.NAME]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolTable {
    capacity: String,
    /// The task types its executor runs (`plugins = ["http", "noop"]`); absent: every type.
    plugins: Option<Vec<String>>,
}

/// `[plugins]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PluginsConfig {
    http_jobs: Option<u64>,
    http: Option<HttpFile>,
    shell: Option<ShellFile>,
    #[serde(default)]
    task_types: BTreeMap<String, String>,
    #[serde(default)]
    external: BTreeMap<String, ExternalConfig>,
}

/// `[plugins.http]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpFile {
    #[serde(default)]
    services: BTreeMap<String, ServiceFile>,
}

/// `[plugins.http.services.<name>]`: a service http tasks may call, and the secret they carry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceFile {
    url: String,
    secret: Option<String>,
}

/// `[plugins.shell]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ShellFile {
    run_as: Option<String>,
    #[serde(default)]
    allow_root: bool,
}

/// `[plugins.external.<id>]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExternalConfig {
    url: String,
    secret: Option<String>,
    task_types: Vec<String>,
    jobs_quota: Option<u64>,
}

/// The plugins' settings, resolved.
#[derive(Debug, Default)]
pub(super) struct Plugins {
    pub(super) builtin: allot_exec::builtin::BuiltinConfig,
    pub(super) task_types: BTreeMap<String, String>,
    pub(super) secrets: BTreeMap<String, String>,
}

/// Reads a secret's value: `env:VAR`, `file:PATH` (its content, trailing newline cut) or the
/// value itself.
fn secret_value(name: &str, text: &str) -> anyhow::Result<String> {
    if let Some(var) = text.strip_prefix("env:") {
        std::env::var(var).with_context(|| format!("{name}: environment variable {var} is not set"))
    } else if let Some(path) = text.strip_prefix("file:") {
        let value = std::fs::read_to_string(path).with_context(|| format!("{name}: cannot read {path}"))?;
        Ok(value.trim_end_matches(['\n', '\r']).to_owned())
    } else {
        Ok(text.to_owned())
    }
}

/// The plugins' settings; `checked`: the daemon checks who calls (`[auth]`), so shell commands
/// are not run as root unless the file allows it.
fn plugins(file: PluginsConfig, secrets: BTreeMap<String, String>, checked: bool) -> anyhow::Result<Plugins> {
    let mut builtin = allot_exec::builtin::BuiltinConfig::default();
    let shell = file.shell.unwrap_or_default();
    if let Some(name) = &shell.run_as {
        let user =
            allot_exec::builtin::RunAs::named(name).map_err(|err| anyhow::anyhow!("[plugins.shell] run_as: {err}"))?;
        if user.uid != allot_exec::builtin::daemon_uid() && allot_exec::builtin::daemon_uid() != 0 {
            bail!(
                "[plugins.shell] run_as = \"{name}\": only a daemon running as root may run commands as another user"
            );
        }
        builtin.shell.run_as = Some(user);
    }
    builtin.shell.refuse_root = checked && !shell.allow_root;
    if let Some(jobs) = file.http_jobs {
        builtin.http_jobs = jobs;
    }
    let named = |what: &str, secret: &Option<String>| match secret {
        Some(name) if !secrets.contains_key(name) => bail!("{what}: secret `{name}` is not in [secrets]"),
        _ => Ok(()),
    };
    for (name, service) in file.http.unwrap_or_default().services {
        let what = format!("[plugins.http.services.{name}]");
        named(&what, &service.secret)?;
        let service = allot_exec::builtin::JobService { url: service.url, secret: service.secret };
        service.check().map_err(|err| anyhow::anyhow!("{what} {err}"))?;
        builtin.http_services.push(service);
    }
    for (id, external) in file.external {
        named(&format!("[plugins.external.{id}]"), &external.secret)?;
        builtin.external.push(allot_exec::builtin::ExternalPlugin {
            id,
            url: external.url,
            secret: external.secret,
            task_types: external.task_types,
            jobs_quota: external.jobs_quota,
        });
    }
    let secrets = secrets
        .iter()
        .map(|(name, text)| Ok((name.clone(), secret_value(&format!("[secrets] {name}"), text)?)))
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
    group_max_apps: Option<u64>,
    group_max: Option<String>,
    sort: Option<String>,
    /// YuniKorn's format: `"*"`, or `"user1,user2 group1,group2"`.
    submit_acl: Option<String>,
    admin_acl: Option<String>,
    borrow_limit: Option<String>,
    lend_limit: Option<String>,
    priority_offset: Option<i32>,
    /// `default` or `fence`.
    priority_policy: Option<String>,
    /// `default`, `fence` or `disabled`.
    preemption: Option<String>,
    preemption_delay: Option<String>,
}

/// `[[placement_rules]]` (and a rule's `parent`): YuniKorn's placement rules.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleConfig {
    /// provided, user, primary_group, tag or fixed.
    name: String,
    /// `tag`: the tag's name; `fixed`: the queue.
    value: Option<String>,
    #[serde(default)]
    create: bool,
    parent: Option<Box<RuleConfig>>,
    filter: Option<FilterConfig>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FilterConfig {
    /// allow (the default) or deny.
    #[serde(rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    users: Vec<String>,
    #[serde(default)]
    groups: Vec<String>,
}

/// A placement rule from the file; `at` says where it is, for errors.
fn placement_rule(rule: RuleConfig, at: &str) -> anyhow::Result<allot_core::apps::placement::PlacementRule> {
    use allot_core::apps::placement::{Filter, PlacementRule, RuleKind};
    let value = |kind: &str| {
        rule.value.clone().with_context(|| {
            format!(
                "{at}: a `{kind}` rule needs `value` (the {})",
                match kind {
                    "tag" => "tag's name",
                    _ => "queue",
                }
            )
        })
    };
    let kind = match rule.name.as_str() {
        "provided" => RuleKind::Provided,
        "user" => RuleKind::User,
        "primary_group" => RuleKind::PrimaryGroup,
        "tag" => RuleKind::Tag(value("tag")?),
        "fixed" => RuleKind::Fixed(value("fixed")?),
        other => bail!("{at}: `{other}` is not a rule: provided, user, primary_group, tag or fixed"),
    };
    if rule.value.is_some() && matches!(kind, RuleKind::Provided | RuleKind::User | RuleKind::PrimaryGroup) {
        bail!("{at}: a `{}` rule takes no `value`", rule.name);
    }
    let parent = rule.parent.map(|parent| placement_rule(*parent, &format!("{at}.parent"))).transpose()?;
    let filter = match rule.filter {
        None => Filter::default(),
        Some(filter) => {
            let deny = match filter.kind.as_deref() {
                None | Some("allow") => false,
                Some("deny") => true,
                Some(other) => bail!("{at}.filter: type `{other}` is not allow or deny"),
            };
            Filter::new(deny, &filter.users, &filter.groups, &rule.name).with_context(|| at.to_owned())?
        }
    };
    PlacementRule::new(kind, rule.create, parent, filter).with_context(|| at.to_owned())
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
    /// How long an application with a task that can never fit (pools or quotas shrank below
    /// it) waits for them to grow back before it fails (default 5m).
    never_fits_grace: Option<String>,
    /// The priority class of an application that names no priority (default: none, 0).
    default_priority_class: Option<String>,
    /// Whether the scheduler preempts at all (default true).
    preemption: Option<bool>,
    /// How long a preempted task's executor has to end it before the scheduler takes its
    /// placement back (default 30s).
    preemption_grace: Option<String>,
    /// How many times a task may be preempted before it is protected (default 3).
    max_preemptions: Option<u32>,
}

/// `[watch]`: how much of the change feed is kept, and how far a watcher may lag.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct WatchFileConfig {
    retain_events: Option<usize>,
    retain_for: Option<String>,
    buffer: Option<usize>,
}

/// The change feed's settings from `[watch]`.
fn watch_config(file: &WatchFileConfig) -> anyhow::Result<WatchConfig> {
    let defaults = WatchConfig::default();
    let retain_for = match file.retain_for.as_deref() {
        Some(text) => allot_bench::duration::parse(text).map_err(|err| anyhow::anyhow!("[watch] retain_for: {err}"))?,
        None => defaults.retain_for,
    };
    let buffer = file.buffer.unwrap_or(defaults.buffer);
    if buffer == 0 {
        anyhow::bail!("[watch] buffer: a watcher must be able to lag by at least 1 event");
    }
    let retain_events = file.retain_events.unwrap_or(defaults.retain_events);
    // The executor's watcher (inside the daemon) keeps its own, larger buffer.
    Ok(WatchConfig { retain_events, retain_for, buffer, ..defaults })
}

/// A queue's limits from the file.
fn queue_limits(path: &str, queue: QueueConfig) -> anyhow::Result<QueueLimits> {
    let resources = |what: &str, text: Option<String>| -> anyhow::Result<Option<Resources>> {
        text.map(|t| t.parse().with_context(|| format!("[queues.\"{path}\"] {what}: `{t}`"))).transpose()
    };
    let acl = |what: &str, text: Option<String>| -> anyhow::Result<Option<allot_core::access::Acl>> {
        text.map(|t| allot_core::access::Acl::parse(&t).with_context(|| format!("[queues.\"{path}\"] {what}")))
            .transpose()
    };
    let sort = match queue.sort.as_deref() {
        None | Some("fifo") => SortPolicy::Fifo,
        Some("fair") => SortPolicy::Fair,
        Some("priority") => SortPolicy::Priority,
        Some(other) => bail!("[queues.\"{path}\"] sort: `{other}` is not fifo, fair or priority"),
    };
    let priority_policy = match queue.priority_policy.as_deref() {
        None => PriorityPolicy::Default,
        Some(name) => PriorityPolicy::from_name(name)
            .with_context(|| format!("[queues.\"{path}\"] priority_policy: `{name}` is not default or fence"))?,
    };
    Ok(QueueLimits {
        guaranteed: resources("guaranteed", queue.guaranteed)?.unwrap_or_default(),
        max: resources("max", queue.max)?,
        max_apps: queue.max_apps,
        user_max_apps: queue.user_max_apps,
        user_max: resources("user_max", queue.user_max)?,
        group_max_apps: queue.group_max_apps,
        group_max: resources("group_max", queue.group_max)?,
        sort,
        submit_acl: acl("submit_acl", queue.submit_acl)?,
        admin_acl: acl("admin_acl", queue.admin_acl)?,
        borrow_limit: resources("borrow_limit", queue.borrow_limit)?,
        lend_limit: resources("lend_limit", queue.lend_limit)?,
        priority_offset: queue.priority_offset.unwrap_or(0),
        priority_policy,
        preemption: match queue.preemption.as_deref() {
            None => PreemptionPolicy::Default,
            Some(name) => PreemptionPolicy::from_name(name).with_context(|| {
                format!("[queues.\"{path}\"] preemption: `{name}` is not default, fence or disabled")
            })?,
        },
        preemption_delay_ms: queue
            .preemption_delay
            .map(|text| {
                allot_bench::duration::parse(&text)
                    .map(|d| d.as_millis() as u64)
                    .map_err(|err| anyhow::anyhow!("[queues.\"{path}\"] preemption_delay: {err}"))
            })
            .transpose()?,
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
pub(super) struct Config {
    pub(super) listen: SocketAddr,
    pub(super) data_dir: PathBuf,
    pub(super) durability: Durability,
    pub(super) store: StoreChoice,
    pub(super) quotas: Vec<(NamespaceName, u64)>,
    pub(super) pools: Vec<(PoolName, Resources)>,
    /// The task types pools' executors run, from `[pools.NAME] plugins`: set at every start.
    pub(super) pool_plugins: Vec<(PoolName, Vec<String>)>,
    pub(super) pool_rules: LeaseRules,
    pub(super) max_wait: std::time::Duration,
    pub(super) idle_timeout: std::time::Duration,
    /// `None`: the server's default ([`allot_server::default_max_connections`]).
    pub(super) max_connections: Option<usize>,
    pub(super) metrics: MetricsConfig,
    pub(super) queues: Vec<(QueuePath, QueueLimits)>,
    pub(super) placement: allot_core::apps::placement::PlacementRules,
    pub(super) sched: SchedConfig,
    pub(super) apps_dir: Option<PathBuf>,
    pub(super) run_pools: Vec<PoolName>,
    pub(super) retry: allot_core::runs::RetryPolicy,
    pub(super) executor_times: ExecutorTimes,
    pub(super) plugins: Plugins,
    pub(super) watch: WatchConfig,
    /// Who may do what (`[auth]`); none: everyone may do everything, on loopback only.
    pub(super) auth: Option<super::auth::Resolved>,
    /// Where the audit trail goes: a file, the log (with `[auth]`), or nowhere.
    pub(super) audit: Option<allot_server::AuditSink>,
    /// HTTPS, if configured.
    pub(super) tls: Option<allot_server::TlsFiles>,
    /// Scheduled snapshots, if configured.
    pub(super) backup: Option<BackupConfig>,
    /// The certificates (PEM) this daemon trusts, besides the system's CAs, in its calls to the
    /// other daemons: `--peer-ca-cert`, else (with HTTPS) its own certificate's chain.
    pub(super) peer_roots: Option<Vec<u8>>,
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
pub(super) enum StoreChoice {
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

pub(super) fn resolve(args: &ServeArgs) -> anyhow::Result<Config> {
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
        pools.insert(name.to_owned(), PoolEntry::Capacity(capacity.to_owned()));
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
    let refresh = flag_or_file(args.redis_sched_refresh, &file.redis_sched_refresh, "redis_sched_refresh")?;
    let store = match (store, refresh) {
        (StoreChoice::Redis(redis), Some(refresh)) => StoreChoice::Redis(redis.with_sched_refresh(refresh)),
        (StoreChoice::Embedded, Some(_)) => bail!(
            "--redis-sched-refresh applies to a Redis store (--store redis://...); the embedded store's scheduler \
             sees every change as it is made"
        ),
        (store, None) => store,
    };
    let wake_poll = flag_or_file(args.redis_wake_poll, &file.redis_wake_poll, "redis_wake_poll")?;
    let store = match (store, wake_poll) {
        // Each check is a call to Redis: a shorter period would make waiting calls a busy loop.
        (StoreChoice::Redis(_), Some(poll)) if poll < std::time::Duration::from_millis(10) => {
            bail!("--redis-wake-poll {poll:?} is too short: at least 10ms (each check is a call to Redis)")
        }
        (StoreChoice::Redis(redis), Some(poll)) => StoreChoice::Redis(redis.with_wake_poll(poll)),
        (StoreChoice::Embedded, Some(_)) => bail!(
            "--redis-wake-poll applies to a Redis store (--store redis://...); the embedded store wakes a \
             waiting allocate in the same process"
        ),
        (store, None) => store,
    };
    let store = match (store, args.redis_ca_cert.clone().or(file.redis_ca_cert)) {
        (StoreChoice::Redis(redis), Some(path)) => {
            let pem = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
            StoreChoice::Redis(redis.with_tls_ca(pem))
        }
        (StoreChoice::Embedded, Some(_)) => bail!("--redis-ca-cert applies to a Redis store (--store rediss://...)"),
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
        pools.insert(name.clone(), PoolEntry::Capacity(capacity.to_string()));
        run_pools.push(name);
    }
    let run_pools = run_pools
        .iter()
        .map(|name| PoolName::new(name).with_context(|| format!("--run-pool `{name}`")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut pool_plugins = Vec::new();
    let pools = pools
        .into_iter()
        .map(|(name, entry)| {
            let pool = PoolName::new(&name).with_context(|| format!("pool `{name}`"))?;
            let (capacity, plugins) = match entry {
                PoolEntry::Capacity(capacity) => (capacity, None),
                PoolEntry::Table(PoolTable { capacity, plugins }) => (capacity, plugins),
            };
            let capacity: Resources =
                capacity.parse().with_context(|| format!("the capacity of pool `{name}`: `{capacity}`"))?;
            if let Some(plugins) = plugins {
                if let Some(bad) = plugins.iter().find(|t| !allot_core::pools::is_task_type(t)) {
                    bail!(
                        "[pools.{name}] plugins: `{bad}` is not a task type (1 to 100 of A-Z, a-z, 0-9, `.`, `_`, `-`)"
                    );
                }
                pool_plugins.push((pool.clone(), plugins));
            }
            Ok((pool, capacity))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let max_wait = flag_or_file(args.max_wait, &file.max_wait, "max_wait")?.unwrap_or(allot_store::MAX_WAIT);
    if max_wait > allot_store::MAX_WAIT {
        bail!("--max-wait (max_wait) is {max_wait:?}; the most is 5m");
    }
    let idle_timeout = flag_or_file(args.idle_timeout, &file.idle_timeout, "idle_timeout")?
        .unwrap_or(allot_server::DEFAULT_IDLE_TIMEOUT);
    if idle_timeout < std::time::Duration::from_secs(1) {
        bail!("--idle-timeout (idle_timeout) is {idle_timeout:?}; the least is 1s");
    }
    let max_connections = match args.max_connections.or(file.max_connections) {
        Some(0) => bail!("max_connections is 0; the least is 1"),
        given => given.map(|n| n as usize),
    };
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
    let placement = file
        .placement_rules
        .into_iter()
        .enumerate()
        .map(|(i, rule)| placement_rule(rule, &format!("[[placement_rules]] #{}", i + 1)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let placement = allot_core::apps::placement::PlacementRules::new(placement);
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
        never_fits_grace_ms: ms("never_fits_grace", &file.scheduler.never_fits_grace)?
            .unwrap_or(defaults.never_fits_grace_ms),
        priority_classes: PriorityClasses::new(file.priority_classes, file.scheduler.default_priority_class)
            .map_err(|err| anyhow::anyhow!("[priority_classes]: {err}"))?,
        preemption: file.scheduler.preemption.unwrap_or(defaults.preemption),
        preemption_grace_ms: ms("preemption_grace", &file.scheduler.preemption_grace)?
            .unwrap_or(defaults.preemption_grace_ms),
        max_preemptions: file.scheduler.max_preemptions.unwrap_or(defaults.max_preemptions),
        ..defaults
    };
    let listen = args.listen.or(file.listen).unwrap_or_else(|| DEFAULT_LISTEN.parse().expect("valid address"));
    let auth = file.auth.map(|auth| super::auth::resolve(auth, secret_value)).transpose()?;
    let plugins = plugins(file.plugins, file.secrets, auth.is_some())?;
    super::auth::check_exposure(listen, auth.is_some(), args.insecure_no_auth)?;
    let audit = match (args.audit_log.clone().or(file.audit_log), &auth) {
        (Some(path), _) if path.as_os_str() == "off" => None,
        (Some(path), _) => Some(allot_server::AuditSink::File(path)),
        (None, Some(_)) => Some(allot_server::AuditSink::Log),
        (None, None) => None,
    };
    let tls = match (args.tls_cert.clone().or(file.tls_cert), args.tls_key.clone().or(file.tls_key)) {
        (Some(cert), Some(key)) => {
            Some(allot_server::TlsFiles { cert, key, client_ca: args.tls_client_ca.clone().or(file.tls_client_ca) })
        }
        (None, None) if args.tls_client_ca.is_none() && file.tls_client_ca.is_none() => None,
        _ => bail!("HTTPS needs both tls_cert and tls_key (--tls-cert, --tls-key); tls_client_ca needs them too"),
    };
    let peer_roots = match (args.peer_ca_cert.clone().or(file.peer_ca_cert), &tls) {
        (Some(path), _) => {
            Some(std::fs::read(&path).with_context(|| format!("--peer-ca-cert: cannot read {}", path.display()))?)
        }
        (None, Some(files)) => Some(
            std::fs::read(&files.cert).with_context(|| format!("--tls-cert: cannot read {}", files.cert.display()))?,
        ),
        (None, None) => None,
    };
    let backup = backup_config(file.backup)?;
    Ok(Config {
        tls,
        backup,
        peer_roots,
        audit,
        auth,
        watch: watch_config(&file.watch)?,
        retry: retry_policy(&file.executor)?,
        executor_times: executor_times(&file.executor)?,
        plugins,
        run_pools,
        apps_dir: args.apps_dir.clone().or(file.apps_dir),
        queues,
        placement,
        sched,
        pools,
        pool_plugins,
        pool_rules,
        max_wait,
        idle_timeout,
        max_connections,
        metrics,
        listen,
        data_dir,
        durability,
        store,
        quotas,
    })
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

/// A duration set by its flag, else by the file's `key` (text such as `250ms`), else not set.
fn flag_or_file(flag: Option<Duration>, file: &Option<String>, key: &str) -> anyhow::Result<Option<Duration>> {
    match (flag, file) {
        (Some(flag), _) => Ok(Some(flag)),
        (None, Some(text)) => {
            allot_bench::duration::parse(text).map(Some).map_err(|err| anyhow::anyhow!("{key}: {err}"))
        }
        (None, None) => Ok(None),
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
        let watch = keys_of::<ConfigFile>("[watch]\n");
        let rules = keys_of::<ConfigFile>("[[placement_rules]]\nname = \"user\"\n");
        let filter = keys_of::<ConfigFile>("[[placement_rules]]\nname = \"user\"\n[placement_rules.filter]\n");
        let external = keys_of::<ConfigFile>("[plugins.external.x]\nurl = \"http://a\"\ntask_types = []\n");
        let service = keys_of::<ConfigFile>("[plugins.http.services.x]\nurl = \"http://a\"\n");
        assert!(
            top.contains(&"alloc_leases".to_owned()) && leases.contains(&"retention".to_owned()),
            "{top:?} {leases:?}"
        );
        assert!(queue.contains(&"user_max".to_owned()) && scheduler.contains(&"completing_grace".to_owned()));
        assert!(plugins.contains(&"task_types".to_owned()) && external.contains(&"jobs_quota".to_owned()));
        assert!(executor.contains(&"system_retries".to_owned()), "{executor:?}");
        assert!(watch.contains(&"retain_for".to_owned()), "{watch:?}");
        assert!(rules.contains(&"parent".to_owned()) && filter.contains(&"groups".to_owned()), "{rules:?} {filter:?}");
        assert!(service.contains(&"secret".to_owned()), "{service:?}");
        let tables = [&leases, &queue, &scheduler, &plugins, &external, &service, &executor, &watch, &rules, &filter];
        for key in top.iter().chain(tables.into_iter().flatten()) {
            let listed = SERVE_AFTER_HELP.lines().any(|line| {
                let line = line.trim_start();
                line.starts_with(&format!("{key} ="))
                    || line.starts_with(&format!("[{key}]"))
                    || line.starts_with(&format!("[[{key}]]"))
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
        let rules: Vec<String> =
            file.placement_rules.into_iter().map(|rule| placement_rule(rule, "example").unwrap().to_string()).collect();
        assert_eq!(rules, ["user (create) under fixed root.users", "tag team"]);
        assert_eq!(file.plugins.external["warehouse"].jobs_quota, Some(4));
        assert_eq!(retry_policy(&file.executor).unwrap(), allot_core::runs::RetryPolicy::new(0, 3));
        let defaults = ExecutorTimes {
            scan: allot_exec::ExecutorConfig::SCAN,
            without_feed: allot_exec::ExecutorConfig::SCAN_WITHOUT_FEED,
            cache_retention: allot_exec::ExecutorConfig::CACHE_RETENTION,
        };
        assert_eq!(executor_times(&file.executor).unwrap(), defaults, "the help shows the defaults");
        assert_eq!(executor_times(&ExecutorFileConfig::default()).unwrap(), defaults);
        assert_eq!(watch_config(&file.watch).unwrap(), WatchConfig::default(), "the help shows the defaults");
    }

    #[test]
    fn http_services_and_external_plugins_name_only_configured_secrets() {
        let text = "[plugins.http.services.jobs]\nurl = \"http://127.0.0.1:9/jobs\"\nsecret = \"jobs-token\"\n";
        let file: ConfigFile = toml::from_str(text).unwrap();
        let secrets = BTreeMap::from([("jobs-token".to_owned(), "s3cret".to_owned())]);
        let resolved = plugins(file.plugins, secrets, false).unwrap();
        let expected = allot_exec::builtin::JobService {
            url: "http://127.0.0.1:9/jobs".to_owned(),
            secret: Some("jobs-token".to_owned()),
        };
        assert_eq!(resolved.builtin.http_services, [expected]);
        let file: ConfigFile = toml::from_str(text).unwrap();
        let err = plugins(file.plugins, BTreeMap::new(), false).unwrap_err().to_string();
        assert_eq!(err, "[plugins.http.services.jobs]: secret `jobs-token` is not in [secrets]");
        let file: ConfigFile = toml::from_str("[plugins.http.services.x]\nurl = \"file:///etc\"\n").unwrap();
        let err = plugins(file.plugins, BTreeMap::new(), false).unwrap_err().to_string();
        assert!(err.contains("only http and https"), "{err}");
        let external = "[plugins.external.w]\nurl = \"http://a\"\ntask_types = [\"sql\"]\nsecret = \"nope\"\n";
        let file: ConfigFile = toml::from_str(external).unwrap();
        let err = plugins(file.plugins, BTreeMap::new(), false).unwrap_err().to_string();
        assert_eq!(err, "[plugins.external.w]: secret `nope` is not in [secrets]");
    }

    #[test]
    fn the_change_feed_keeps_what_the_file_says() {
        let file: ConfigFile = toml::from_str("[watch]\nretain_events = 10\nretain_for = \"5m\"\n").unwrap();
        let config = watch_config(&file.watch).unwrap();
        let expected = WatchConfig {
            retain_events: 10,
            retain_for: std::time::Duration::from_secs(300),
            ..WatchConfig::default()
        };
        assert_eq!(config, expected);
        let file: ConfigFile = toml::from_str("[watch]\nbuffer = 0\n").unwrap();
        assert!(watch_config(&file.watch).unwrap_err().to_string().contains("[watch] buffer"));
        let file: ConfigFile = toml::from_str("[watch]\nretain_for = \"soon\"\n").unwrap();
        assert!(watch_config(&file.watch).unwrap_err().to_string().contains("[watch] retain_for"));
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

    #[test]
    fn how_often_the_executor_lists_comes_from_the_file() {
        let file: ConfigFile = toml::from_str("[executor]\nscan = \"1m\"\nscan_without_feed = \"1s\"\n").unwrap();
        let expected = ExecutorTimes {
            scan: Duration::from_secs(60),
            without_feed: Duration::from_secs(1),
            cache_retention: allot_exec::ExecutorConfig::CACHE_RETENTION,
        };
        assert_eq!(executor_times(&file.executor).unwrap(), expected);
        let file: ConfigFile = toml::from_str("[executor]\nscan = \"0s\"\n").unwrap();
        assert_eq!(executor_times(&file.executor).unwrap_err().to_string(), "[executor] scan: must be more than 0");
        let file: ConfigFile = toml::from_str("[executor]\nscan_without_feed = \"often\"\n").unwrap();
        assert!(executor_times(&file.executor).unwrap_err().to_string().starts_with("[executor] scan_without_feed: "));
        let file: ConfigFile = toml::from_str("[executor]\ncache_retention = \"2h\"\n").unwrap();
        assert_eq!(executor_times(&file.executor).unwrap().cache_retention, Duration::from_secs(7200));
    }
}
