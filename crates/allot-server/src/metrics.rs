//! Prometheus metrics: request latency histograms, and per-namespace gauges and counters read from
//! the store at each scrape (so they are exact, never polled or guessed).
//!
//! Names (all prefixed `allot_`): `quota_units`, `granted_units`, `grants`, `waiters`,
//! `waiting_units`, `longest_wait_seconds` (gauges, label `namespace`); `allocations_total`
//! (label `result`: `granted`, `exhausted`, `namespace_quota_exceeded`), `releases_total`,
//! `expirations_total`; `store_commits_total`, `store_committed_operations_total`,
//! `store_commit_seconds_total`, `store_commit_failures_total`; and
//! `http_request_duration_seconds` (labels `method`, `route`, `status`).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use allot_core::pool::PoolView;
use allot_core::{NamespaceView, Resources};
use allot_store::CommitStats;
use axum::extract::{MatchedPath, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::error::ApiError;
use crate::AppState;

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
struct PoolResourceLabels {
    pool: String,
    resource: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    namespace: String,
    result: &'static str,
}

/// The daemon's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Histogram>,
    snapshot: Arc<Mutex<Snapshot>>,
}

/// What the store said at the last scrape.
#[derive(Debug, Default)]
struct Snapshot {
    namespaces: Vec<NamespaceView>,
    pools: Vec<PoolView>,
    commits: CommitStats,
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

/// Encodes the snapshot; registered as a collector so it shares the registry's output.
#[derive(Debug)]
struct StoreCollector {
    snapshot: Arc<Mutex<Snapshot>>,
}

impl Default for Metrics {
    fn default() -> Metrics {
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
        Metrics { registry, requests, snapshot }
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

/// A count as a gauge value, clamped to what an i64 gauge can hold.
fn gauge(count: u64) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

impl Collector for StoreCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snapshot = self.snapshot.lock().unwrap_or_else(|p| p.into_inner());
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
        let longest = Family::<NamespaceLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
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

        encode_pools(&mut encoder, &snapshot.pools)?;

        let commits = snapshot.commits;
        let store_counters: [(&str, &str, u64); 3] = [
            ("allot_store_commits", "Durable write transactions", commits.commits),
            ("allot_store_committed_operations", "Operations made durable", commits.operations),
            ("allot_store_commit_failures", "Write transactions that failed", commits.failures),
        ];
        for (name, help, value) in store_counters {
            let counter = Counter::<u64>::default();
            counter.inc_by(value);
            let metric =
                encoder.encode_descriptor(name, help, None, prometheus_client::metrics::MetricType::Counter)?;
            counter.encode(metric)?;
        }
        let seconds = Counter::<f64, std::sync::atomic::AtomicU64>::default();
        seconds.inc_by(commits.commit_micros as f64 / 1e6);
        let metric = encoder.encode_descriptor(
            "allot_store_commit_seconds",
            "Time spent in durable commits",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        seconds.encode(metric)
    }
}

/// `GET /metrics`: the Prometheus text format.
pub(crate) async fn scrape(State(state): State<AppState>) -> Result<Response, ApiError> {
    let namespaces = state.store.namespaces().await?;
    let pools = state.store.pools().await?;
    let commits = state.store.commit_stats();
    let metrics = &state.metrics;
    // The collector locks the snapshot while encoding: the lock must be released before.
    *metrics.snapshot.lock().unwrap_or_else(|p| p.into_inner()) = Snapshot { namespaces, pools, commits };
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &metrics.registry).map_err(|_| {
        ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, "internal", "cannot encode metrics")
    })?;
    Ok(([(CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response())
}

/// Middleware: times every request into `allot_http_request_duration_seconds`.
pub(crate) async fn track(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().as_str().to_owned();
    let route = match request.extensions().get::<MatchedPath>() {
        Some(path) => path.as_str().to_owned(),
        None => "unmatched".to_owned(),
    };
    let response = next.run(request).await;
    let labels = RequestLabels { method, route, status: response.status().as_u16() };
    state.metrics.requests.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
    response
}
