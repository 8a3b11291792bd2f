//! The pools' series: totals over every pool, and each selected pool's own.

use super::*;

/// Sums over every pool; resources in milli-units, per resource name.
#[derive(Debug, Default)]
pub(super) struct PoolTotals {
    pools: u64,
    capacity: BTreeMap<String, u128>,
    allocated: BTreeMap<String, u128>,
    expired: BTreeMap<String, u128>,
    occupied: BTreeMap<String, u128>,
    cordoned: u64,
    allocs: u64,
    accepted: u64,
    offer_expired: u64,
    freed: u64,
    reclaimed: u64,
}

impl PoolTotals {
    pub(super) fn add(&mut self, v: &PoolView) {
        self.pools += 1;
        self.cordoned += u64::from(v.cordon.is_some());
        for (sum, resources) in [
            (&mut self.capacity, &v.capacity),
            (&mut self.allocated, &v.allocated),
            (&mut self.expired, &v.expired),
            (&mut self.occupied, &v.occupied),
        ] {
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

type PoolResources = fn(&PoolView) -> &Resources;

type PoolCount = fn(&PoolView) -> u64;

/// Every series of the pools, one name each (`allot_pools_*`): the series without a `pool` label
/// sums every pool; one with it is a selected pool's own (so a sum over a name counts the
/// selected pools twice: select `{pool=""}` or `{pool!=""}`). Resources in units, per resource
/// (a resource a pool lacks is not listed).
pub(super) fn encode_pools(
    encoder: &mut DescriptorEncoder<'_>,
    totals: &PoolTotals,
    pools: &[PoolView],
) -> Result<(), std::fmt::Error> {
    encode_gauge(encoder, "allot_pools", "Pools", gauge(totals.pools))?;
    let labels = |view: &PoolView| vec![("pool", view.name.to_string())];
    let units = |milli: u128| Value::Float(milli as f64 / 1000.0);
    encode_gauge(encoder, "allot_pools_cordoned", "Pools cordoned (drained ones too)", gauge(totals.cordoned))?;
    let resources: [Totalled<&BTreeMap<String, u128>, PoolResources>; 4] = [
        ("allot_pools_capacity", "Capacity, per resource", &totals.capacity, |v| &v.capacity),
        ("allot_pools_allocated", "Held by allocs whose lease runs, per resource", &totals.allocated, |v| &v.allocated),
        (
            "allot_pools_expired",
            "Held by allocs whose lease lapsed (not reclaimed yet), per resource",
            &totals.expired,
            |v| &v.expired,
        ),
        (
            "allot_pools_occupied",
            "Held by things allot does not manage (never offered), per resource",
            &totals.occupied,
            |v| &v.occupied,
        ),
    ];
    for (name, help, sums, value) in resources {
        let all = sums.iter().map(|(resource, milli)| (vec![("resource", resource.clone())], units(*milli)));
        let each = pools.iter().flat_map(|view| {
            value(view).iter().map(move |(resource, milli)| {
                let mut labels = labels(view);
                labels.push(("resource", resource.to_string()));
                (labels, units(u128::from(milli)))
            })
        });
        encode_series(encoder, name, help, MetricType::Gauge, all.chain(each))?;
    }
    let each = pools.iter().map(|view| (labels(view), Value::Gauge(gauge(view.allocs as u64))));
    encode_series(
        encoder,
        "allot_pools_allocs",
        "Live allocs (lapsed ones included)",
        MetricType::Gauge,
        std::iter::once((Vec::new(), Value::Gauge(gauge(totals.allocs)))).chain(each),
    )?;
    let counters: [Totalled<u64, PoolCount>; 4] = [
        ("allot_pools_accepts", "Offers accepted, since start", totals.accepted, |v| v.stats.accepted),
        (
            "allot_pools_offer_expired",
            "Accepts refused because the room was gone, since start",
            totals.offer_expired,
            |v| v.stats.offer_expired,
        ),
        ("allot_pools_frees", "Allocs freed, since start", totals.freed, |v| v.stats.freed),
        ("allot_pools_reclaims", "Allocs reclaimed after their lease lapsed, since start", totals.reclaimed, |v| {
            v.stats.reclaimed
        }),
    ];
    for (name, help, total, value) in counters {
        let each = pools.iter().map(|view| (labels(view), Value::Counter(value(view))));
        let series = std::iter::once((Vec::new(), Value::Counter(total))).chain(each);
        encode_series(encoder, name, help, MetricType::Counter, series)?;
    }
    Ok(())
}
