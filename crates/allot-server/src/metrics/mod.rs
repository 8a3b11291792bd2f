//! Prometheus metrics: request latency histograms, and gauges and counters of the namespaces and
//! pools read from the store at each scrape (so they are exact, never polled or guessed).
//!
//! A scrape stays small however many namespaces and pools there are: totals over all of them
//! always, and series of their own only for the namespaces and pools selected by
//! [`MetricsConfig`] (none by default).
//!
//! Names: one prefix per part (`allot_quotas_`, `allot_pools_`, `allot_apps_`, `allot_runs_`)
//! and `allot_` alone for the daemon's own (`http_`, `audit_`, `store_`, `watch_`); one name per
//! quantity, its variants in labels. docs/metrics.md lists them all.
//!
//! - Token quotas: `allot_quotas_namespaces` (how many), `allot_quotas_quota_units`,
//!   `_granted_units`, `_grants`, `_waiters`, `_waiting_units`, `_longest_wait_seconds`,
//!   `_allocations_total` (label `result`: `granted`, `exhausted`, `namespace_quota_exceeded`),
//!   `_releases_total`, `_expirations_total`. The series without a `namespace` label is the total
//!   over every namespace; a selected namespace has its own, labelled `namespace`.
//! - Pools: `allot_pools` (how many), `allot_pools_cordoned`, `allot_pools_capacity`,
//!   `_allocated`, `_expired`, `_occupied` (label `resource`), `_allocs`, `_accepts_total`, `_offer_expired_total`, `_frees_total`,
//!   `_reclaims_total`; the total without a `pool` label, a selected pool's own with it.
//! - Applications, per queue (label `queue`; every queue): `allot_apps_queue_used`,
//!   `_queue_guaranteed`, `_queue_max` (label `resource`), `_queue_running_apps`, `_queue_apps`,
//!   `_queue_pending_apps`, `_queue_pending_tasks`, `_queue_waiting` (label `reason`: what holds
//!   them); the scheduler's `allot_apps_cycles_total`, `_placements_total`,
//!   `_reservations_total`, `_takeovers_total`, `_preemption_decisions_total`,
//!   `_preemptions_total`, `_timeouts_total` (label `kind`: `placeholder`,
//!   `reserve`).
//! - Runs, on a daemon that runs tasks (its executor): `allot_runs_active`, `_rounds_total`,
//!   `_retries_total`, `_held_back_total`, `_lists_total`, `_feed_cuts_total`,
//!   `_following_feed`, `_ended_total` (label `result`: `succeeded`, `failed`, `aborted`),
//!   `_cache_lookups_total` (label `result`: `hit`, `miss`), and the plugins' own
//!   `_plugin_counter_total` (labels `plugin`, `counter`).
//! - The daemon: `allot_store_commits_total`, `_committed_operations_total`,
//!   `_commit_seconds_total`, `_commit_failures_total`, `_commit_duration_seconds` (a
//!   histogram), `_commit_max_seconds`, `_durability` (label `level`: `disk`, `process`,
//!   `redis`); `allot_http_request_duration_seconds` (labels `method`, `route`, `status`);
//!   `allot_audit_events_total` (label `outcome`); `allot_connections_open`, `_max` and
//!   `_waited_total` (connections that waited for a place, `--max-connections`); the change feed's `allot_watch_watchers`
//!   (streams open on this daemon), `_events_kept` and `_oldest_revision` (what the store keeps
//!   for watchers that resume).
//!
//! This module holds the registry, the scrape and the request histograms; the series of each
//! part are encoded by `quotas`, `pools`, `apps` and `runs`, the change feed's by `watch`.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use allot_core::apps::{QueueView, SchedStats};
use allot_core::pools::PoolView;
use allot_core::{NamespaceView, Resources};
use allot_store::{for_each_page, CommitStats, Store, StoreError};

use crate::connection_limit::ConnectionMetrics;
use crate::runs_here::RunCounters;
use axum::extract::{MatchedPath, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::error::ApiError;

mod apps;
mod pools;
mod quotas;
mod runs;
mod watch;

use crate::ServerState;
use apps::*;
use pools::*;
use quotas::*;
use runs::*;
pub(crate) use watch::Watching;
use watch::*;

/// Labels of series that share a name and differ in which labels they have: a part's total has
/// none of the object's (`namespace`, `pool`), a selected object's own series has it.
type Labels = Vec<(&'static str, String)>;

/// The value of one series written by [`encode_series`].
#[derive(Debug, Clone, Copy)]
enum Value {
    Gauge(i64),
    Float(f64),
    Counter(u64),
}

impl Value {
    fn write(self, metric: &mut MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        match self {
            Value::Gauge(value) => metric.encode_gauge(&value),
            Value::Float(value) => metric.encode_gauge(&value),
            Value::Counter(value) => metric.encode_counter::<NoLabelSet, u64, f64>(&value, None),
        }
    }
}

/// Series under one name, in the order given; one with no labels (a part's total) is written
/// without braces.
fn encode_series(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    kind: MetricType,
    series: impl IntoIterator<Item = (Labels, Value)>,
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in series {
        match labels.is_empty() {
            true => value.write(&mut metric)?,
            false => value.write(&mut metric.encode_family(&labels)?)?,
        }
    }
    Ok(())
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: String,
    route: String,
    status: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TotalResultLabels {
    result: &'static str,
}

/// Which namespaces and pools have series of their own at `/metrics`; all of them count in the
/// totals. A pattern `NAME` selects NAME and what is under it (`hive` selects `hive` and
/// `hive:cluster-a`, not `hive2`); `PREFIX*` selects every name that starts with PREFIX (`*`
/// selects all: one series per namespace, which is large with many namespaces).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetricsConfig {
    pub namespaces: Vec<String>,
    pub pools: Vec<String>,
}

impl MetricsConfig {
    /// Refuses an empty pattern (it would select nothing).
    pub fn check(&self) -> Result<(), String> {
        match self.namespaces.iter().chain(&self.pools).any(String::is_empty) {
            true => Err("a metrics selection pattern is empty; use `*` to select every name".into()),
            false => Ok(()),
        }
    }
}

/// Whether `name` is selected by one of `patterns` (see [`MetricsConfig`]).
fn selected(patterns: &[String], name: &str) -> bool {
    patterns.iter().any(|pattern| match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name.strip_prefix(pattern.as_str()).is_some_and(|rest| rest.is_empty() || rest.starts_with(':')),
    })
}

/// A thread's handles on the request histograms of one [`Metrics`]: by route, then method and
/// status.
type ByRoute = HashMap<Box<str>, Vec<(Method, u16, Histogram)>>;

thread_local! {
    /// This thread's handles on request histograms, by metrics (their id), each beside what
    /// tells whether those metrics still live.
    static HISTOGRAMS: RefCell<HashMap<u64, (std::sync::Weak<()>, ByRoute)>> = RefCell::new(HashMap::new());
}

/// The daemon's metrics.
#[derive(Debug)]
pub struct Metrics {
    /// Tells these metrics apart in the threads' caches of request histograms.
    id: u64,
    /// Held while these metrics live: a thread's cache drops the handles of metrics gone.
    alive: Arc<()>,
    config: MetricsConfig,
    registry: Registry,
    requests: Family<RequestLabels, Histogram>,
    snapshot: Arc<Mutex<Snapshot>>,
    /// Watch streams open on this daemon.
    watchers: Gauge,
    /// Connections open, the most allowed, and those that waited for a place.
    connections: ConnectionMetrics,
    /// Audited calls, by outcome: `ok`, `refused`, `failed` (made at the start, so that a call
    /// counts without a look-up in the family).
    audited: [Counter; 3],
    /// Scheduled backups, by outcome, and when the last one succeeded.
    backups: Family<OutcomeLabels, Counter>,
    backup_success: Gauge,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

/// What the store said at the last scrape: the selected views and the totals of all.
#[derive(Debug, Default)]
struct Snapshot {
    namespaces: Vec<NamespaceView>,
    namespace_totals: NamespaceTotals,
    pools: Vec<PoolView>,
    pool_totals: PoolTotals,
    commits: CommitStats,
    durability: &'static str,
    /// Every queue (a queue tree is small: each has series of its own).
    queues: Vec<QueueView>,
    sched: SchedStats,
    /// The executor's counters, on a daemon that runs tasks.
    exec: Option<RunCounters>,
    /// What the change feed keeps: events, and the oldest revision a watch can start after.
    feed: (usize, u64),
}

type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;
/// A metric's name, help and how to read its value from a view.
type Described<F> = (&'static str, &'static str, F);
/// A metric's name, help, total over every object, and how to read an object's own value.
type Totalled<T, F> = (&'static str, &'static str, T, F);

/// Encodes the snapshot; registered as a collector so it shares the registry's output.
#[derive(Debug)]
struct StoreCollector {
    snapshot: Arc<Mutex<Snapshot>>,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new(MetricsConfig::default())
    }
}

impl Metrics {
    /// Metrics with series of their own for the namespaces and pools `config` selects.
    pub fn new(config: MetricsConfig) -> Metrics {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Histogram>::new_with_constructor(|| {
            // 50 µs to about 1.6 s.
            Histogram::new(exponential_buckets(0.00005, 2.0, 16))
        });
        registry.register(
            "allot_http_request_duration_seconds",
            "Time to answer an HTTP request, by method, route and status",
            requests.clone(),
        );
        let watchers = register_watchers(&mut registry);
        let connections = ConnectionMetrics::default();
        registry.register("allot_connections_open", "Connections open on this daemon", connections.open.clone());
        registry.register(
            "allot_connections_max",
            "The most connections open at once (--max-connections)",
            connections.max.clone(),
        );
        registry.register(
            "allot_connections_waited",
            "Connections that waited to be accepted: the most were open",
            connections.waited.clone(),
        );
        let audited = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "allot_audit_events",
            "Calls written to the audit trail (changes and refusals), by outcome: ok, refused, failed",
            audited.clone(),
        );
        let audited =
            ["ok", "refused", "failed"].map(|outcome| audited.get_or_create(&OutcomeLabels { outcome }).clone());
        let backups = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "allot_backups",
            "Scheduled backups ([backup] in the daemon's file), by outcome: ok, failed",
            backups.clone(),
        );
        let backup_success = Gauge::default();
        registry.register(
            "allot_backup_last_success_timestamp_seconds",
            "When the last scheduled backup was written whole (Unix seconds; 0: none yet)",
            backup_success.clone(),
        );
        let snapshot = Arc::new(Mutex::new(Snapshot::default()));
        registry.register_collector(Box::new(StoreCollector { snapshot: snapshot.clone() }));
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let alive = Arc::new(());
        Metrics {
            id,
            alive,
            config,
            registry,
            requests,
            snapshot,
            watchers,
            connections,
            audited,
            backups,
            backup_success,
        }
    }

    /// The connections' series, for the listener that counts them.
    pub(crate) fn connections(&self) -> ConnectionMetrics {
        self.connections.clone()
    }

    /// Counts a call written to the audit trail.
    pub(crate) fn audited(&self, outcome: &'static str) {
        let index = match outcome {
            "ok" => 0,
            "refused" => 1,
            _ => 2,
        };
        self.audited[index].inc();
    }

    /// Counts a scheduled backup: written whole at `written` (Unix seconds), or failed (`None`).
    pub fn backed_up(&self, written: Option<u64>) {
        let outcome = if written.is_some() { "ok" } else { "failed" };
        self.backups.get_or_create(&OutcomeLabels { outcome }).inc();
        if let Some(at) = written {
            self.backup_success.set(at as i64);
        }
    }

    /// Counts a watch stream as open until the guard is dropped.
    pub(crate) fn watching(&self) -> Watching {
        Watching::new(&self.watchers)
    }

    /// Times a request into `allot_http_request_duration_seconds`. The histogram is looked up
    /// once per thread, route, method and status; after that, without a lock or an allocation.
    /// A method outside HTTP's standard ones is counted as `OTHER`: a caller cannot add series.
    pub(crate) fn observe_request(&self, method: &Method, route: &str, status: u16, took: Duration) {
        let other;
        let method = match *method {
            Method::GET | Method::HEAD | Method::POST | Method::PUT | Method::DELETE | Method::PATCH => method,
            Method::OPTIONS | Method::CONNECT | Method::TRACE => method,
            _ => {
                other = Method::from_bytes(b"OTHER").expect("a valid token");
                &other
            }
        };
        HISTOGRAMS.with_borrow_mut(|histograms| {
            if let Some((_, by_route)) = histograms.get_mut(&self.id) {
                return self.observe_in(by_route, method, route, status, took);
            }
            // A thread can outlive the metrics it served (daemons built in turn in one process:
            // tests, the simulator): their handles go with them, not kept for the thread's life.
            histograms.retain(|_, (alive, _)| alive.strong_count() > 0);
            let (_, by_route) = histograms.entry(self.id).or_insert((Arc::downgrade(&self.alive), ByRoute::new()));
            self.observe_in(by_route, method, route, status, took);
        });
    }

    /// [`Metrics::observe_request`] with this thread's handles on these metrics.
    fn observe_in(&self, by_route: &mut ByRoute, method: &Method, route: &str, status: u16, took: Duration) {
        if !by_route.contains_key(route) {
            by_route.insert(route.into(), Vec::new());
        }
        let kinds = by_route.get_mut(route).expect("inserted above");
        let histogram = match kinds.iter().find(|(m, s, _)| m == method && *s == status) {
            Some((_, _, histogram)) => histogram,
            None => {
                let labels = RequestLabels { method: method.to_string(), route: route.to_owned(), status };
                let histogram = self.requests.get_or_create(&labels).clone();
                kinds.push((method.clone(), status, histogram));
                &kinds.last().expect("pushed above").2
            }
        };
        histogram.observe(took.as_secs_f64());
    }
}

fn encode_family<L, M>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    family: &Family<L, M>,
) -> Result<(), std::fmt::Error>
where
    L: EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug,
    M: EncodeMetric + prometheus_client::metrics::TypedMetric,
{
    let metric = encoder.encode_descriptor(name, help, None, M::TYPE)?;
    family.encode(metric)
}

/// One gauge without labels.
fn encode_gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: i64,
) -> Result<(), std::fmt::Error> {
    let gauge = Gauge::<i64>::default();
    gauge.set(value);
    gauge.encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

/// One counter without labels.
fn encode_counter(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: u64,
) -> Result<(), std::fmt::Error> {
    let counter = Counter::<u64>::default();
    counter.inc_by(value);
    counter.encode(encoder.encode_descriptor(name, help, None, MetricType::Counter)?)
}

/// The commit-time histogram: a sync of the log at the disk level, an append at the process level.
fn encode_commit_durations(encoder: &mut DescriptorEncoder<'_>, commits: &CommitStats) -> Result<(), std::fmt::Error> {
    let mut buckets: Vec<(f64, u64)> = allot_store::COMMIT_BUCKETS_MICROS
        .iter()
        .zip(commits.buckets)
        .map(|(&bound, count)| (bound as f64 / 1e6, count))
        .collect();
    buckets.push((f64::INFINITY, commits.buckets[allot_store::COMMIT_BUCKETS_MICROS.len()]));
    let count = commits.buckets.iter().sum();
    let metric = encoder.encode_descriptor(
        "allot_store_commit_duration_seconds",
        "Commits by time taken: a sync of the log (disk durability) or an append (process durability)",
        None,
        MetricType::Histogram,
    )?;
    let mut metric = metric;
    metric.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
        commits.commit_micros as f64 / 1e6,
        count,
        &buckets,
        None,
    )?;
    let max = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
    max.set(commits.max_micros as f64 / 1e6);
    max.encode(encoder.encode_descriptor(
        "allot_store_commit_max_seconds",
        "The slowest commit since the daemon started",
        None,
        MetricType::Gauge,
    )?)
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LevelLabel {
    level: String,
}

/// What an acknowledged change survives, as a label of a gauge of 1 (`disk`, `process`, `redis`).
fn encode_durability(encoder: &mut DescriptorEncoder<'_>, level: &str) -> Result<(), std::fmt::Error> {
    let family = Family::<LevelLabel, Gauge>::default();
    family.get_or_create(&LevelLabel { level: level.to_owned() }).set(1);
    family.encode(encoder.encode_descriptor(
        "allot_store_durability",
        "What an acknowledged change survives: disk (a power loss), process (a crash of the daemon), redis",
        None,
        MetricType::Gauge,
    )?)
}

/// A count as a gauge value, clamped to what an i64 gauge can hold.
fn gauge(count: u64) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

impl Collector for StoreCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snapshot = self.snapshot.lock().unwrap_or_else(|p| p.into_inner());
        encode_quotas(&mut encoder, &snapshot.namespace_totals, &snapshot.namespaces)?;
        encode_pools(&mut encoder, &snapshot.pool_totals, &snapshot.pools)?;
        encode_queues(&mut encoder, &snapshot.queues)?;
        encode_sched(&mut encoder, &snapshot.sched)?;
        if let Some(exec) = &snapshot.exec {
            encode_exec(&mut encoder, exec)?;
        }
        encode_feed(&mut encoder, snapshot.feed)?;

        let commits = snapshot.commits;
        for (name, help, value) in [
            ("allot_store_commits", "Durable write transactions", commits.commits),
            ("allot_store_committed_operations", "Operations made durable", commits.operations),
            ("allot_store_commit_failures", "Write transactions that failed", commits.failures),
        ] {
            encode_counter(&mut encoder, name, help, value)?;
        }
        let seconds = Counter::<f64, std::sync::atomic::AtomicU64>::default();
        seconds.inc_by(commits.commit_micros as f64 / 1e6);
        let metric = encoder.encode_descriptor(
            "allot_store_commit_seconds",
            "Time spent in durable commits",
            None,
            MetricType::Counter,
        )?;
        seconds.encode(metric)?;
        encode_commit_durations(&mut encoder, &commits)?;
        encode_durability(&mut encoder, snapshot.durability)
    }
}

/// Reads every namespace and pool page by page: totals of all, views of the selected ones.
async fn snapshot(store: &dyn Store, config: &MetricsConfig) -> Result<Snapshot, StoreError> {
    let mut snapshot = Snapshot {
        commits: store.commit_stats(),
        durability: store.durability(),
        sched: store.sched_stats(),
        feed: store.feed_kept(),
        ..Snapshot::default()
    };
    // On a shared store, the daemon that schedules reports the queues (once, not once per daemon).
    if store.apps_home() == allot_store::AppsHome::Here {
        snapshot.queues = store.queues().await?;
    }
    for_each_page(
        |page| store.namespaces(page),
        |view| {
            snapshot.namespace_totals.add(&view);
            if selected(&config.namespaces, view.name.as_str()) {
                snapshot.namespaces.push(view);
            }
        },
    )
    .await?;
    for_each_page(
        |page| store.pools(page),
        |view| {
            snapshot.pool_totals.add(&view);
            if selected(&config.pools, view.name.as_str()) {
                snapshot.pools.push(view);
            }
        },
    )
    .await?;
    Ok(snapshot)
}

/// `GET /metrics`: the Prometheus text format.
pub(crate) async fn scrape(State(state): State<ServerState>) -> Result<Response, ApiError> {
    let metrics = &state.metrics;
    let mut snapshot = snapshot(state.store.as_ref(), &metrics.config).await?;
    snapshot.exec = state.executor.as_deref().map(|executor| executor.counters());
    // The collector locks the snapshot while encoding: the lock must be released before.
    *metrics.snapshot.lock().unwrap_or_else(|p| p.into_inner()) = snapshot;
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &metrics.registry).map_err(|_| {
        ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, "internal", "cannot encode metrics")
    })?;
    Ok(([(CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response())
}

/// Middleware: times every request into `allot_http_request_duration_seconds`.
pub(crate) async fn track(State(state): State<ServerState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let route = request.extensions().get::<MatchedPath>().cloned();
    let mut response = next.run(request).await;
    let route = route.as_ref().map_or("unmatched", MatchedPath::as_str);
    state.metrics.observe_request(&method, route, response.status().as_u16(), started.elapsed());
    if state.audit.is_some() {
        response.extensions_mut().insert(crate::audit::Route(route.to_owned().into()));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_select_a_name_and_what_is_under_it_or_a_prefix() {
        let patterns = ["hive".to_owned(), "api:open*".to_owned()];
        for (name, expected) in [
            ("hive", true),
            ("hive:cluster-a", true),
            ("hive2", false),
            ("hiv", false),
            ("api:openai", true),
            ("api:open", true),
            ("api:other", false),
        ] {
            assert_eq!(selected(&patterns, name), expected, "{name}");
        }
        assert!(selected(&["*".to_owned()], "anything"));
        assert!(!selected(&[], "hive"), "nothing is selected by default");
        let empty = MetricsConfig { namespaces: vec![String::new()], pools: vec![] };
        assert!(empty.check().is_err());
        assert!(MetricsConfig::default().check().is_ok());
    }

    /// A thread keeps handles on the request histograms of the metrics it served; once those
    /// metrics are dropped, the next metrics it serves drop them (found by the simulator, whose
    /// daemons, built in turn on one thread, grew its memory by about 30 KB a seed).
    #[test]
    fn a_thread_keeps_no_handles_on_metrics_gone() {
        let cached = || HISTOGRAMS.with_borrow(HashMap::len);
        let took = Duration::from_millis(1);
        let first = Metrics::new(MetricsConfig::default());
        first.observe_request(&Method::PUT, "/v1/a", 200, took);
        first.observe_request(&Method::GET, "/v1/b", 404, took);
        let second = Metrics::new(MetricsConfig::default());
        second.observe_request(&Method::PUT, "/v1/a", 200, took);
        assert_eq!(cached(), 2, "both metrics live: the thread keeps handles on each");
        drop(first);
        for _ in 0..3 {
            let next = Metrics::new(MetricsConfig::default());
            next.observe_request(&Method::PUT, "/v1/a", 200, took);
        }
        assert_eq!(cached(), 2, "the second metrics, and the last of the three made in turn");
        second.observe_request(&Method::PUT, "/v1/a", 201, took);
        assert_eq!(cached(), 2);
    }

    #[test]
    fn methods_a_caller_makes_up_add_no_series() {
        let metrics = Metrics::new(MetricsConfig::default());
        let took = Duration::from_millis(1);
        for made_up in ["FOO1", "FOO2", "BREW", "PROPFIND"] {
            metrics.observe_request(&Method::from_bytes(made_up.as_bytes()).unwrap(), "unmatched", 405, took);
        }
        metrics.observe_request(&Method::GET, "unmatched", 405, took);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &metrics.registry).unwrap();
        let series: Vec<&str> =
            text.lines().filter(|l| l.starts_with("allot_http_request_duration_seconds_count")).collect();
        assert_eq!(series.len(), 2, "{series:?}");
        assert!(series.iter().any(|l| l.contains("method=\"OTHER\"") && l.ends_with(" 4")), "{series:?}");
        assert!(!text.contains("FOO1"));
    }
}
