//! The pools' series: totals over every pool, and each selected pool's own.

use super::*;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct PoolLabels {
    pool: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct PoolResourceLabels {
    pool: String,
    resource: String,
}

/// Sums over every pool; resources in milli-units, per resource name.
#[derive(Debug, Default)]
pub(super) struct PoolTotals {
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
    pub(super) fn add(&mut self, v: &PoolView) {
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

pub(super) type PoolResources = fn(&PoolView) -> &Resources;

pub(super) type PoolCount = fn(&PoolView) -> u64;

/// Per pool and resource, in units (a resource the pool lacks is not listed).
pub(super) fn resource_family(
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

pub(super) fn encode_pools(encoder: &mut DescriptorEncoder<'_>, pools: &[PoolView]) -> Result<(), std::fmt::Error> {
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

pub(super) fn encode_pool_totals(
    encoder: &mut DescriptorEncoder<'_>,
    totals: &PoolTotals,
) -> Result<(), std::fmt::Error> {
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
