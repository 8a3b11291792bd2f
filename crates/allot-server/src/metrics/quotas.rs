//! The token quotas' series: totals over every namespace, and each selected namespace's own.

use super::*;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct NamespaceLabels {
    namespace: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ResultLabels {
    namespace: String,
    result: &'static str,
}

/// Sums over every namespace (the longest wait: the longest of all).
#[derive(Debug, Default)]
pub(super) struct NamespaceTotals {
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
    pub(super) fn add(&mut self, v: &NamespaceView) {
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

pub(super) type NamespaceGauge = fn(&NamespaceView) -> i64;

pub(super) fn encode_namespace_totals(
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

/// The series of each selected namespace.
pub(super) fn encode_namespaces(
    encoder: &mut DescriptorEncoder<'_>,
    namespaces: &[NamespaceView],
) -> Result<(), std::fmt::Error> {
    let gauges: [Described<NamespaceGauge>; 5] = [
        ("allot_quota_units", "The namespace's quota", |v| gauge(v.quota)),
        ("allot_granted_units", "Units granted now", |v| gauge(v.granted_units)),
        ("allot_grants", "Grants held now", |v| gauge(v.grants as u64)),
        ("allot_waiters", "Allocate calls waiting now", |v| gauge(v.waiters as u64)),
        ("allot_waiting_units", "Units wanted by the waiters", |v| gauge(v.waiting_units)),
    ];
    for (name, help, value) in gauges {
        let family = Family::<NamespaceLabels, Gauge>::default();
        for view in namespaces {
            family.get_or_create(&NamespaceLabels { namespace: view.name.to_string() }).set(value(view));
        }
        encode_family(encoder, name, help, &family)?;
    }
    let longest = Family::<NamespaceLabels, FloatGauge>::default();
    for view in namespaces {
        longest
            .get_or_create(&NamespaceLabels { namespace: view.name.to_string() })
            .set(view.longest_wait_ms as f64 / 1000.0);
    }
    encode_family(encoder, "allot_longest_wait_seconds", "How long the longest waiter has waited", &longest)?;

    let allocations = Family::<ResultLabels, Counter>::default();
    let releases = Family::<NamespaceLabels, Counter>::default();
    let expirations = Family::<NamespaceLabels, Counter>::default();
    for view in namespaces {
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
    encode_family(encoder, "allot_allocations", "Allocate decisions by result, since start", &allocations)?;
    encode_family(encoder, "allot_releases", "Grants released, since start", &releases)?;
    encode_family(encoder, "allot_expirations", "Grants ended by an expired lease, since start", &expirations)?;
    Ok(())
}
