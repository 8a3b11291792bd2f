//! The token quotas' series: totals over every namespace, and each selected namespace's own.

use super::*;

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

type NamespaceCount = fn(&NamespaceView) -> u64;

/// Every series of the token quotas, one name each (`allot_quotas_*`): the series without a
/// `namespace` label sums every namespace; one with it is a selected namespace's own (so a sum
/// over a name counts the selected namespaces twice: select `{namespace=""}` or
/// `{namespace!=""}`).
pub(super) fn encode_quotas(
    encoder: &mut DescriptorEncoder<'_>,
    totals: &NamespaceTotals,
    namespaces: &[NamespaceView],
) -> Result<(), std::fmt::Error> {
    encode_gauge(encoder, "allot_quotas_namespaces", "Namespaces", gauge(totals.namespaces))?;
    let labels = |view: &NamespaceView| vec![("namespace", view.name.to_string())];
    let gauges: [Totalled<u64, NamespaceCount>; 5] = [
        ("allot_quotas_quota_units", "Quotas, in units", totals.quota, |v| v.quota),
        ("allot_quotas_granted_units", "Units granted now", totals.granted_units, |v| v.granted_units),
        ("allot_quotas_grants", "Grants held now", totals.grants, |v| v.grants as u64),
        ("allot_quotas_waiters", "Allocate calls waiting now", totals.waiters, |v| v.waiters as u64),
        ("allot_quotas_waiting_units", "Units wanted by the waiters", totals.waiting_units, |v| v.waiting_units),
    ];
    for (name, help, total, value) in gauges {
        let each = namespaces.iter().map(|view| (labels(view), Value::Gauge(gauge(value(view)))));
        let series = std::iter::once((Vec::new(), Value::Gauge(gauge(total)))).chain(each);
        encode_series(encoder, name, help, MetricType::Gauge, series)?;
    }
    let seconds = |ms: u64| Value::Float(ms as f64 / 1000.0);
    let each = namespaces.iter().map(|view| (labels(view), seconds(view.longest_wait_ms)));
    encode_series(
        encoder,
        "allot_quotas_longest_wait_seconds",
        "How long the longest waiter has waited",
        MetricType::Gauge,
        std::iter::once((Vec::new(), seconds(totals.longest_wait_ms))).chain(each),
    )?;

    let all = (Vec::new(), [totals.granted, totals.exhausted, totals.cap_exceeded, totals.released, totals.expired]);
    let each = namespaces.iter().map(|view| {
        let stats = &view.stats;
        (labels(view), [stats.granted, stats.exhausted, stats.cap_exceeded, stats.released, stats.expired])
    });
    let counts: Vec<(Labels, [u64; 5])> = std::iter::once(all).chain(each).collect();
    let allocations = counts.iter().flat_map(|(labels, [granted, exhausted, cap_exceeded, ..])| {
        [("granted", granted), ("exhausted", exhausted), ("namespace_quota_exceeded", cap_exceeded)].map(
            |(result, count)| {
                let mut labels = labels.clone();
                labels.push(("result", result.to_owned()));
                (labels, Value::Counter(*count))
            },
        )
    });
    encode_series(
        encoder,
        "allot_quotas_allocations",
        "Allocate decisions by result, since start",
        MetricType::Counter,
        allocations,
    )?;
    for (name, help, at) in [
        ("allot_quotas_releases", "Grants released, since start", 3),
        ("allot_quotas_expirations", "Grants ended by an expired lease, since start", 4),
    ] {
        let series = counts.iter().map(|(labels, values)| (labels.clone(), Value::Counter(values[at])));
        encode_series(encoder, name, help, MetricType::Counter, series)?;
    }
    Ok(())
}
