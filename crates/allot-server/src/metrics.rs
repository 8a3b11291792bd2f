//! Prometheus metrics: request latency histograms, and gauges and counters of the namespaces and
//! pools read from the store at each scrape (so they are exact, never polled or guessed).
//!
//! A scrape stays small however many namespaces and pools there are: totals over all of them
//! always, and series of their own only for the namespaces and pools selected by
//! [`MetricsConfig`] (none by default).
//!
//! Names (all prefixed `allot_`). Totals: `namespaces` (how many), `namespaces_quota_units`,
//! `namespaces_granted_units`, `namespaces_grants`, `namespaces_waiters`,
//! `namespaces_waiting_units` (sums), `namespaces_longest_wait_seconds` (the longest),
//! `namespaces_allocations_total` (label `result`), `namespaces_releases_total`,
//! `namespaces_expirations_total`; `pools`, `pools_capacity`, `pools_allocated`, `pools_expired`
//! (label `resource`), `pools_allocs`, `pools_accepts_total`, `pools_offer_expired_total`,
//! `pools_frees_total`, `pools_reclaims_total`. Per selected namespace (label `namespace`):
//! `quota_units`, `granted_units`, `grants`, `waiters`, `waiting_units`, `longest_wait_seconds`,
//! `allocations_total` (label `result`: `granted`, `exhausted`, `namespace_quota_exceeded`),
//! `releases_total`, `expirations_total`. Per selected pool (label `pool`): `pool_capacity`,
//! `pool_allocated`, `pool_expired` (label `resource`), `pool_allocs`, `pool_accepts_total`,
//! `pool_offer_expired_total`, `pool_frees_total`, `pool_reclaims_total`. And
//! Per queue (label `queue`; every queue): `queue_used`, `queue_guaranteed`, `queue_max` (label
//! `resource`), `queue_running_apps`, `queue_apps`, `queue_pending_apps`, `queue_pending_tasks`, `queue_waiting` (label `reason`: what holds them);
//! and the scheduler's `sched_cycles_total`, `sched_placements_total`, `sched_reservations_total`,
//! `sched_takeovers_total`, `sched_timeouts_total` (label `kind`: `placeholder`, `reserve`). And
//! On a daemon that runs tasks, its executor's `exec_runs_active`, `exec_rounds_total`,
//! `exec_retries_total`, `exec_held_back_total`, `exec_runs_ended_total` (label `result`:
//! `succeeded`, `failed`, `aborted`) and `exec_cache_lookups_total` (label `result`: `hit`,
//! `miss`), and the plugins' own `plugin_counter_total` (labels `plugin`, `counter`). And
//! `store_commits_total`, `store_committed_operations_total`, `store_commit_seconds_total`,
//! `store_commit_failures_total`, `store_commit_duration_seconds` (a histogram),
//! `store_commit_max_seconds`, `store_durability` (label `level`: `disk`, `process`, `redis`),
//! `http_request_duration_seconds` (labels `method`, `route`,
//! `status`).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use allot_core::apps::{QueueView, SchedStats};
use allot_core::pools::PoolView;
use allot_core::{NamespaceView, Resources};
use allot_store::{for_each_page, CommitStats, Store, StoreError};

use crate::runs_here::RunCounters;
use axum::extract::{MatchedPath, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::error::ApiError;
use crate::ServerState;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: String,
    route: String,
    status: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NamespaceLabels {
    namespace: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    queue: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueResourceLabels {
    queue: String,
    resource: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueReasonLabels {
    queue: String,
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TimeoutLabels {
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolResourceLabels {
    pool: String,
    resource: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResourceLabels {
    resource: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TotalResultLabels {
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    namespace: String,
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

/// The daemon's metrics.
#[derive(Debug)]
pub struct Metrics {
    /// Tells these metrics apart in the threads' caches of request histograms.
    id: u64,
    config: MetricsConfig,
    registry: Registry,
    requests: Family<RequestLabels, Histogram>,
    snapshot: Arc<Mutex<Snapshot>>,
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
}

fn encode_exec(encoder: &mut DescriptorEncoder<'_>, exec: &RunCounters) -> Result<(), std::fmt::Error> {
    let active = Gauge::<i64>::default();
    active.set(gauge(exec.active));
    let metric = encoder.encode_descriptor(
        "allot_exec_runs_active",
        "Task runs this daemon's executor drives now",
        None,
        MetricType::Gauge,
    )?;
    active.encode(metric)?;
    encode_counter(encoder, "allot_exec_rounds", "Plugin rounds, since start", exec.rounds)?;
    encode_counter(encoder, "allot_exec_retries", "Failed attempts followed by another, since start", exec.retried)?;
    encode_counter(
        encoder,
        "allot_exec_held_back",
        "Times a run was held back by its application's max_parallelism, since start",
        exec.held_back,
    )?;
    let ended = Family::<TotalResultLabels, Counter>::default();
    for (result, count) in [("succeeded", exec.succeeded), ("failed", exec.failed), ("aborted", exec.aborted)] {
        ended.get_or_create(&TotalResultLabels { result }).inc_by(count);
    }
    encode_family(encoder, "allot_exec_runs_ended", "Task runs ended, by result, since start", &ended)?;
    let cache = Family::<TotalResultLabels, Counter>::default();
    cache.get_or_create(&TotalResultLabels { result: "hit" }).inc_by(exec.cache_hits);
    cache.get_or_create(&TotalResultLabels { result: "miss" }).inc_by(exec.cache_misses);
    encode_family(encoder, "allot_exec_cache_lookups", "Output cache lookups, by result, since start", &cache)?;
    let plugins = Family::<PluginCounterLabels, Counter>::default();
    for ((plugin, counter), value) in &exec.plugins {
        plugins.get_or_create(&PluginCounterLabels { plugin: plugin.clone(), counter: counter.clone() }).inc_by(*value);
    }
    encode_family(
        encoder,
        "allot_plugin_counter",
        "Counters the plugins keep (their metrics scope), since start",
        &plugins,
    )
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginCounterLabels {
    plugin: String,
    counter: String,
}

/// Sums over every namespace (the longest wait: the longest of all).
#[derive(Debug, Default)]
struct NamespaceTotals {
    namespaces: u64,
    quota: u64,
    granted_units: u64,
    grants: u64,
    waiters: u64,
    waiting_units: u64,
    longest_wait_ms: u64,
    granted: u64,
    exhausted: u64,
    cap_exceeded: u64,
    released: u64,
    expired: u64,
}

impl NamespaceTotals {
    fn add(&mut self, v: &NamespaceView) {
        self.namespaces += 1;
        self.quota = self.quota.saturating_add(v.quota);
        self.granted_units = self.granted_units.saturating_add(v.granted_units);
        self.grants = self.grants.saturating_add(v.grants as u64);
        self.waiters = self.waiters.saturating_add(v.waiters as u64);
        self.waiting_units = self.waiting_units.saturating_add(v.waiting_units);
        self.longest_wait_ms = self.longest_wait_ms.max(v.longest_wait_ms);
        self.granted = self.granted.saturating_add(v.stats.granted);
        self.exhausted = self.exhausted.saturating_add(v.stats.exhausted);
        self.cap_exceeded = self.cap_exceeded.saturating_add(v.stats.cap_exceeded);
        self.released = self.released.saturating_add(v.stats.released);
        self.expired = self.expired.saturating_add(v.stats.expired);
    }
}

/// Sums over every pool; resources in milli-units, per resource name.
#[derive(Debug, Default)]
struct PoolTotals {
    pools: u64,
    capacity: BTreeMap<String, u128>,
    allocated: BTreeMap<String, u128>,
    expired: BTreeMap<String, u128>,
    allocs: u64,
    accepted: u64,
    offer_expired: u64,
    freed: u64,
    reclaimed: u64,
}

impl PoolTotals {
    fn add(&mut self, v: &PoolView) {
        self.pools += 1;
        for (sum, resources) in
            [(&mut self.capacity, &v.capacity), (&mut self.allocated, &v.allocated), (&mut self.expired, &v.expired)]
        {
            for (name, milli) in resources.iter() {
                *sum.entry(name.to_string()).or_default() += u128::from(milli);
            }
        }
        self.allocs = self.allocs.saturating_add(v.allocs as u64);
        self.accepted = self.accepted.saturating_add(v.stats.accepted);
        self.offer_expired = self.offer_expired.saturating_add(v.stats.offer_expired);
        self.freed = self.freed.saturating_add(v.stats.freed);
        self.reclaimed = self.reclaimed.saturating_add(v.stats.reclaimed);
    }
}

type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;
/// A metric's name, help and how to read its value from a view.
type Described<F> = (&'static str, &'static str, F);
type PoolResources = fn(&PoolView) -> &Resources;
type PoolCount = fn(&PoolView) -> u64;
type NamespaceGauge = fn(&NamespaceView) -> i64;

/// Per pool and resource, in units (a resource the pool lacks is not listed).
fn resource_family(
    pools: &[PoolView],
    value: impl Fn(&PoolView) -> &Resources,
) -> Family<PoolResourceLabels, FloatGauge> {
    let family = Family::<PoolResourceLabels, FloatGauge>::default();
    for view in pools {
        for (name, milli) in value(view).iter() {
            let labels = PoolResourceLabels { pool: view.name.to_string(), resource: name.to_string() };
            family.get_or_create(&labels).set(milli as f64 / 1000.0);
        }
    }
    family
}

type QueueResources = fn(&QueueView) -> Option<&Resources>;
type QueueCount = fn(&QueueView) -> u64;

fn encode_queues(encoder: &mut DescriptorEncoder<'_>, queues: &[QueueView]) -> Result<(), std::fmt::Error> {
    let resources: [Described<QueueResources>; 3] = [
        ("allot_queue_used", "Held by the placements of the queue's applications, per resource", |v| {
            Some(&v.usage.allocated)
        }),
        ("allot_queue_guaranteed", "The queue's guaranteed resources, per resource", |v| Some(&v.limits.guaranteed)),
        ("allot_queue_max", "The queue's maximum, per resource (none: no maximum)", |v| v.limits.max.as_ref()),
    ];
    for (name, help, value) in resources {
        let family = Family::<QueueResourceLabels, FloatGauge>::default();
        for view in queues {
            for (resource, milli) in value(view).into_iter().flat_map(|r| r.iter()) {
                let labels = QueueResourceLabels { queue: view.path.to_string(), resource: resource.to_string() };
                family.get_or_create(&labels).set(milli as f64 / 1000.0);
            }
        }
        encode_family(encoder, name, help, &family)?;
    }
    let counts: [Described<QueueCount>; 4] = [
        ("allot_queue_running_apps", "Applications holding placements in the queue", |v| v.usage.running_apps),
        ("allot_queue_apps", "Applications in the queue that have not ended", |v| v.apps),
        ("allot_queue_pending_apps", "Applications in the queue not running yet", |v| {
            v.apps.saturating_sub(v.usage.running_apps)
        }),
        ("allot_queue_pending_tasks", "Tasks in the queue waiting to be placed", |v| v.pending_tasks),
    ];
    for (name, help, value) in counts {
        let family = Family::<QueueLabels, Gauge>::default();
        for view in queues {
            family.get_or_create(&QueueLabels { queue: view.path.to_string() }).set(gauge(value(view)));
        }
        encode_family(encoder, name, help, &family)?;
    }
    let waiting = Family::<QueueReasonLabels, Gauge>::default();
    for view in queues {
        for (reason, count) in &view.waiting {
            waiting.get_or_create(&QueueReasonLabels { queue: view.path.to_string(), reason }).set(gauge(*count));
        }
    }
    encode_family(
        encoder,
        "allot_queue_waiting",
        "Applications and tasks waiting in the queue, by what holds them (reason: queue_limit, no_pool_matches, \
         no_room, tokens, gang_not_reserved, gang_missing_members, after_gang)",
        &waiting,
    )
}

fn encode_sched(encoder: &mut DescriptorEncoder<'_>, stats: &SchedStats) -> Result<(), std::fmt::Error> {
    for (name, help, value) in [
        ("allot_sched_cycles", "Scheduling cycles, since start", stats.cycles),
        ("allot_sched_placements", "Tasks placed on a pool of their own, since start", stats.placements),
        ("allot_sched_reservations", "Gangs reserved (all their placeholders), since start", stats.reservations),
        ("allot_sched_takeovers", "Tasks that took a placeholder over, since start", stats.takeovers),
    ] {
        encode_counter(encoder, name, help, value)?;
    }
    let timeouts = Family::<TimeoutLabels, Counter>::default();
    timeouts.get_or_create(&TimeoutLabels { kind: "placeholder" }).inc_by(stats.placeholder_timeouts);
    timeouts.get_or_create(&TimeoutLabels { kind: "reserve" }).inc_by(stats.reserve_timeouts);
    encode_family(encoder, "allot_sched_timeouts", "Gang timeouts by kind, since start", &timeouts)
}

fn encode_pools(encoder: &mut DescriptorEncoder<'_>, pools: &[PoolView]) -> Result<(), std::fmt::Error> {
    let resources: [Described<PoolResources>; 3] = [
        ("allot_pool_capacity", "The pool's capacity, per resource", |v| &v.capacity),
        ("allot_pool_allocated", "Held by allocs whose lease runs, per resource", |v| &v.allocated),
        ("allot_pool_expired", "Held by allocs whose lease lapsed (not reclaimed yet), per resource", |v| &v.expired),
    ];
    for (name, help, value) in resources {
        encode_family(encoder, name, help, &resource_family(pools, value))?;
    }
    let allocs = Family::<PoolLabels, Gauge>::default();
    for view in pools {
        allocs.get_or_create(&PoolLabels { pool: view.name.to_string() }).set(gauge(view.allocs as u64));
    }
    encode_family(encoder, "allot_pool_allocs", "Live allocs (lapsed ones included)", &allocs)?;
    let counters: [Described<PoolCount>; 4] = [
        ("allot_pool_accepts", "Offers accepted, since start", |v| v.stats.accepted),
        ("allot_pool_offer_expired", "Accepts refused because the room was gone, since start", |v| {
            v.stats.offer_expired
        }),
        ("allot_pool_frees", "Allocs freed, since start", |v| v.stats.freed),
        ("allot_pool_reclaims", "Allocs reclaimed after their lease lapsed, since start", |v| v.stats.reclaimed),
    ];
    for (name, help, value) in counters {
        let family = Family::<PoolLabels, Counter>::default();
        for view in pools {
            family.get_or_create(&PoolLabels { pool: view.name.to_string() }).inc_by(value(view));
        }
        encode_family(encoder, name, help, &family)?;
    }
    Ok(())
}

fn encode_pool_totals(encoder: &mut DescriptorEncoder<'_>, totals: &PoolTotals) -> Result<(), std::fmt::Error> {
    encode_gauge(encoder, "allot_pools", "Pools", gauge(totals.pools))?;
    for (name, help, sums) in [
        ("allot_pools_capacity", "The capacity of all pools, per resource", &totals.capacity),
        ("allot_pools_allocated", "Held by allocs whose lease runs in all pools, per resource", &totals.allocated),
        ("allot_pools_expired", "Held by lapsed allocs in all pools, per resource", &totals.expired),
    ] {
        let family = Family::<ResourceLabels, FloatGauge>::default();
        for (resource, milli) in sums {
            family.get_or_create(&ResourceLabels { resource: resource.clone() }).set(*milli as f64 / 1000.0);
        }
        encode_family(encoder, name, help, &family)?;
    }
    encode_gauge(encoder, "allot_pools_allocs", "Live allocs of all pools", gauge(totals.allocs))?;
    for (name, help, value) in [
        ("allot_pools_accepts", "Offers accepted in all pools, since start", totals.accepted),
        (
            "allot_pools_offer_expired",
            "Accepts refused in all pools because the room was gone, since start",
            totals.offer_expired,
        ),
        ("allot_pools_frees", "Allocs freed in all pools, since start", totals.freed),
        ("allot_pools_reclaims", "Allocs reclaimed in all pools, since start", totals.reclaimed),
    ] {
        encode_counter(encoder, name, help, value)?;
    }
    Ok(())
}

fn encode_namespace_totals(
    encoder: &mut DescriptorEncoder<'_>,
    totals: &NamespaceTotals,
) -> Result<(), std::fmt::Error> {
    for (name, help, value) in [
        ("allot_namespaces", "Namespaces", totals.namespaces),
        ("allot_namespaces_quota_units", "The quotas of all namespaces", totals.quota),
        ("allot_namespaces_granted_units", "Units granted now in all namespaces", totals.granted_units),
        ("allot_namespaces_grants", "Grants held now in all namespaces", totals.grants),
        ("allot_namespaces_waiters", "Allocate calls waiting now in all namespaces", totals.waiters),
        ("allot_namespaces_waiting_units", "Units wanted by the waiters of all namespaces", totals.waiting_units),
    ] {
        encode_gauge(encoder, name, help, gauge(value))?;
    }
    let longest = FloatGauge::default();
    longest.set(totals.longest_wait_ms as f64 / 1000.0);
    let metric = encoder.encode_descriptor(
        "allot_namespaces_longest_wait_seconds",
        "How long the longest waiter of all namespaces has waited",
        None,
        MetricType::Gauge,
    )?;
    longest.encode(metric)?;
    let allocations = Family::<TotalResultLabels, Counter>::default();
    for (result, count) in [
        ("granted", totals.granted),
        ("exhausted", totals.exhausted),
        ("namespace_quota_exceeded", totals.cap_exceeded),
    ] {
        allocations.get_or_create(&TotalResultLabels { result }).inc_by(count);
    }
    encode_family(
        encoder,
        "allot_namespaces_allocations",
        "Allocate decisions in all namespaces by result, since start",
        &allocations,
    )?;
    encode_counter(
        encoder,
        "allot_namespaces_releases",
        "Grants released in all namespaces, since start",
        totals.released,
    )?;
    encode_counter(
        encoder,
        "allot_namespaces_expirations",
        "Grants ended by an expired lease in all namespaces, since start",
        totals.expired,
    )
}

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
        let snapshot = Arc::new(Mutex::new(Snapshot::default()));
        registry.register_collector(Box::new(StoreCollector { snapshot: snapshot.clone() }));
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        Metrics { id, config, registry, requests, snapshot }
    }

    /// Times a request into `allot_http_request_duration_seconds`. The histogram is looked up
    /// once per thread, route, method and status; after that, without a lock or an allocation.
    pub(crate) fn observe_request(&self, method: &Method, route: &str, status: u16, took: Duration) {
        thread_local! {
            /// This thread's handles on request histograms, by metrics.
            static HISTOGRAMS: RefCell<HashMap<u64, ByRoute>> = RefCell::new(HashMap::new());
        }
        HISTOGRAMS.with_borrow_mut(|histograms| {
            let by_route = histograms.entry(self.id).or_default();
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
        });
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
        encode_namespace_totals(&mut encoder, &snapshot.namespace_totals)?;
        let gauges: [Described<NamespaceGauge>; 5] = [
            ("allot_quota_units", "The namespace's quota", |v| gauge(v.quota)),
            ("allot_granted_units", "Units granted now", |v| gauge(v.granted_units)),
            ("allot_grants", "Grants held now", |v| gauge(v.grants as u64)),
            ("allot_waiters", "Allocate calls waiting now", |v| gauge(v.waiters as u64)),
            ("allot_waiting_units", "Units wanted by the waiters", |v| gauge(v.waiting_units)),
        ];
        for (name, help, value) in gauges {
            let family = Family::<NamespaceLabels, Gauge>::default();
            for view in &snapshot.namespaces {
                family.get_or_create(&NamespaceLabels { namespace: view.name.to_string() }).set(value(view));
            }
            encode_family(&mut encoder, name, help, &family)?;
        }
        let longest = Family::<NamespaceLabels, FloatGauge>::default();
        for view in &snapshot.namespaces {
            longest
                .get_or_create(&NamespaceLabels { namespace: view.name.to_string() })
                .set(view.longest_wait_ms as f64 / 1000.0);
        }
        encode_family(&mut encoder, "allot_longest_wait_seconds", "How long the longest waiter has waited", &longest)?;

        let allocations = Family::<ResultLabels, Counter>::default();
        let releases = Family::<NamespaceLabels, Counter>::default();
        let expirations = Family::<NamespaceLabels, Counter>::default();
        for view in &snapshot.namespaces {
            let namespace = view.name.to_string();
            for (result, count) in [
                ("granted", view.stats.granted),
                ("exhausted", view.stats.exhausted),
                ("namespace_quota_exceeded", view.stats.cap_exceeded),
            ] {
                allocations.get_or_create(&ResultLabels { namespace: namespace.clone(), result }).inc_by(count);
            }
            let labels = NamespaceLabels { namespace };
            releases.get_or_create(&labels).inc_by(view.stats.released);
            expirations.get_or_create(&labels).inc_by(view.stats.expired);
        }
        encode_family(&mut encoder, "allot_allocations", "Allocate decisions by result, since start", &allocations)?;
        encode_family(&mut encoder, "allot_releases", "Grants released, since start", &releases)?;
        encode_family(
            &mut encoder,
            "allot_expirations",
            "Grants ended by an expired lease, since start",
            &expirations,
        )?;

        encode_pool_totals(&mut encoder, &snapshot.pool_totals)?;
        encode_pools(&mut encoder, &snapshot.pools)?;
        encode_queues(&mut encoder, &snapshot.queues)?;
        encode_sched(&mut encoder, &snapshot.sched)?;
        if let Some(exec) = &snapshot.exec {
            encode_exec(&mut encoder, exec)?;
        }

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
    let response = next.run(request).await;
    let route = route.as_ref().map_or("unmatched", MatchedPath::as_str);
    state.metrics.observe_request(&method, route, response.status().as_u16(), started.elapsed());
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
}
