//! allot's wire types: the JSON bodies of the HTTP API, shared by the server and the client.
//!
//! These are the API's contract and change only compatibly. They are plain data: no logic, no
//! validation (the server validates when it converts them into `allot_core` types).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub mod apps;
pub mod spec;
pub use apps::*;

/// Nested objects are JSON objects: serde would also read a struct from an array (`[1, 2]` as
/// `{"project": 1, "namespace": 2}`), which the API's document does not allow.
pub mod object {
    use std::fmt;
    use std::marker::PhantomData;

    use serde::de::value::MapAccessDeserializer;
    use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};

    struct MapOnly<T>(PhantomData<T>);

    impl<'de, T: Deserialize<'de>> Visitor<'de> for MapOnly<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            T::deserialize(MapAccessDeserializer::new(map))
        }
    }

    struct OptionalMap<T>(PhantomData<T>);

    impl<'de, T: Deserialize<'de>> Visitor<'de> for OptionalMap<T> {
        type Value = Option<T>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON object or null")
        }
        fn visit_none<E>(self) -> Result<Option<T>, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Option<T>, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Option<T>, D::Error> {
            deserializer.deserialize_map(MapOnly(PhantomData)).map(Some)
        }
    }

    /// For an `Option<T>` field whose `T` is a struct.
    pub fn optional<'de, D: Deserializer<'de>, T: Deserialize<'de>>(deserializer: D) -> Result<Option<T>, D::Error> {
        deserializer.deserialize_option(OptionalMap(PhantomData))
    }
}

/// Reading integers as JSON Schema defines them: `integer` includes numbers whose fraction is
/// zero (`10.0`, `1e3`), which serde would refuse for a `u64`. Used on every integer a request
/// body carries; a fraction, a negative number or one above `u64::MAX` is still refused.
pub mod integer {
    use serde::de::{self, Deserialize, Deserializer, Visitor};

    struct Integer(u64);

    impl<'de> Deserialize<'de> for Integer {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Integer, D::Error> {
            struct Whole;
            impl Visitor<'_> for Whole {
                type Value = Integer;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("a whole number, 0 or more")
                }
                fn visit_u64<E: de::Error>(self, value: u64) -> Result<Integer, E> {
                    Ok(Integer(value))
                }
                fn visit_i64<E: de::Error>(self, value: i64) -> Result<Integer, E> {
                    u64::try_from(value).map(Integer).map_err(|_| E::custom(format!("{value} is negative")))
                }
                fn visit_f64<E: de::Error>(self, value: f64) -> Result<Integer, E> {
                    // 2^64 is the first value above u64::MAX that an f64 holds.
                    if value.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&value) {
                        Ok(Integer(value as u64))
                    } else {
                        Err(E::custom(format!("{value} is not a whole number from 0 to {}", u64::MAX)))
                    }
                }
            }
            deserializer.deserialize_u64(Whole)
        }
    }

    /// For a `u64` field.
    pub fn required<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
        Integer::deserialize(deserializer).map(|i| i.0)
    }

    /// For an `Option<u64>` field (`null` or absent is `None`).
    pub fn optional<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
        Option::<Integer>::deserialize(deserializer).map(|i| i.map(|i| i.0))
    }

    /// For a `u32` field.
    pub fn required_u32<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
        let value = Integer::deserialize(deserializer)?.0;
        u32::try_from(value).map_err(|_| de::Error::custom(format!("{value} is above {}", u32::MAX)))
    }

    /// For an `i32` field (such as a priority).
    pub fn signed<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i32, D::Error> {
        struct Signed;
        impl Visitor<'_> for Signed {
            type Value = i32;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "a whole number from {} to {}", i32::MIN, i32::MAX)
            }
            fn visit_u64<E: de::Error>(self, value: u64) -> Result<i32, E> {
                i32::try_from(value).map_err(|_| E::custom(format!("{value} is above {}", i32::MAX)))
            }
            fn visit_i64<E: de::Error>(self, value: i64) -> Result<i32, E> {
                i32::try_from(value).map_err(|_| E::custom(format!("{value} is not from {} to {}", i32::MIN, i32::MAX)))
            }
            fn visit_f64<E: de::Error>(self, value: f64) -> Result<i32, E> {
                if value.fract() == 0.0 && (f64::from(i32::MIN)..=f64::from(i32::MAX)).contains(&value) {
                    Ok(value as i32)
                } else {
                    Err(E::custom(format!("{value} is not a whole number from {} to {}", i32::MIN, i32::MAX)))
                }
            }
        }
        deserializer.deserialize_i64(Signed)
    }
}

/// The status of an allocate call [Flyte `AllocationStatus`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum Status {
    /// The token is granted: go ahead.
    Granted,
    /// The namespace quota is full.
    Exhausted,
    /// A project- or namespace-scope cap is full; `cap` says which.
    NamespaceQuotaExceeded,
}

/// A level of cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CapLevel {
    Project,
    Namespace,
}

/// Who holds a grant: the holder's project and namespace scope (Flyte's project and domain).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Scope {
    pub project: String,
    pub namespace: String,
}

/// Optional caps per scope [Flyte `ResourceConstraintsSpec`]. Absent means no cap; 0 means the
/// scope may hold nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Caps {
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "integer::optional")]
    pub project: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "integer::optional")]
    pub namespace: Option<u64>,
}

/// `PUT /v1/namespaces/{namespace}`: create a namespace or change its quota.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutNamespace {
    /// How many units the namespace may have granted at once.
    #[serde(deserialize_with = "integer::required")]
    pub quota: u64,
}

/// A namespace and its current use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Namespace {
    pub name: String,
    pub quota: u64,
    pub granted_units: u64,
    pub grants: u64,
    pub waiters: u64,
    pub waiting_units: u64,
    /// How long the longest waiter has waited, in milliseconds.
    pub longest_wait_ms: u64,
    /// The fencing number the next grant will carry.
    pub next_fencing: u64,
}

/// The answer to `PUT /v1/namespaces/{namespace}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PutNamespaceResponse {
    /// True if the namespace did not exist before.
    pub created: bool,
    pub namespace: Namespace,
}

/// A page of the namespaces, ordered by name (`GET /v1/namespaces`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NamespaceList {
    pub namespaces: Vec<Namespace>,
    /// Where the next page starts: give it as `cursor`. `null` on the last page.
    #[serde(default)]
    pub next_cursor: Option<String>,
}

/// The answer to `DELETE /v1/namespaces/{namespace}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RemovedNamespace {
    pub name: String,
    /// Grants that ended with the namespace (only with `force`).
    pub grants_ended: u64,
}

/// `PUT /v1/namespaces/{namespace}/grants/{token}`: allocate `units` under `token`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Allocate {
    /// How many units; 1 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "integer::optional")]
    pub units: Option<u64>,
    /// The holder's scope; needed when caps are given.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "object::optional")]
    pub scope: Option<Scope>,
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "object::optional")]
    pub caps: Option<Caps>,
    /// The grant expires this many milliseconds after the grant or its last keepalive.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "integer::optional")]
    pub ttl_ms: Option<u64>,
    /// Attach the grant to this session: it lives as long as the session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Wait up to this many milliseconds for room instead of answering at once (long poll).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "integer::optional")]
    pub wait_ms: Option<u64>,
}

/// A granted token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Grant {
    pub namespace: String,
    pub token: String,
    pub units: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
    /// Increases with every grant of the namespace; pass it on to the protected resource.
    pub fencing: u64,
    /// The TTL of the grant's own lease, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// The session the grant is attached to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Milliseconds until the lease ends without a keepalive; absent when the grant has no lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_ms: Option<u64>,
}

/// Which cap refused a request, and how full it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CapRefusal {
    pub level: CapLevel,
    pub cap: u64,
    pub held: u64,
}

/// Where a waiting request stood when its wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct QueuePlace {
    /// 1 is the head of the queue.
    pub position: u64,
    /// Units wanted by the waiters ahead.
    pub units_ahead: u64,
}

/// The answer to an allocate call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AllocateResponse {
    pub status: Status,
    /// Set when `status` is `Granted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<Grant>,
    /// True when the token was already granted (an idempotent retry).
    #[serde(default)]
    pub existing: bool,
    /// Set when `status` is `NamespaceQuotaExceeded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap: Option<CapRefusal>,
    /// Set when the request waited and its wait ended without a grant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueuePlace>,
}

/// The answer to `DELETE /v1/namespaces/{namespace}/grants/{token}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReleaseResponse {
    /// False when the token was not granted (releasing is idempotent).
    pub released: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<Grant>,
}

/// `POST /v1/namespaces/{namespace}/grants/{token}/keepalive`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Keepalive {
    /// Refuse the keepalive if the grant's fencing number is not this one.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "integer::optional")]
    pub fencing: Option<u64>,
}

/// A page of a namespace's grants, ordered by token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GrantList {
    pub grants: Vec<Grant>,
    /// Where the next page starts: give it as `cursor`. `null` on the last page.
    #[serde(default)]
    pub next_cursor: Option<String>,
}

/// A waiting allocate call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Waiter {
    pub position: u64,
    pub units_ahead: u64,
    pub token: String,
    pub units: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
    pub waited_ms: u64,
    /// Set when the waiter is held back by its own cap rather than by the quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_by_cap: Option<CapLevel>,
}

/// A page of a namespace's waiters, head first. A cursor continues after the last waiter of its page in arrival order, whatever moved meanwhile; each page gives the places at its read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WaiterList {
    pub waiters: Vec<Waiter>,
    /// Where the next page starts: give it as `cursor`. `null` on the last page.
    #[serde(default)]
    pub next_cursor: Option<String>,
}

/// `POST /v1/sessions`: open a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenSession {
    /// The session ends this many milliseconds after it is opened or last kept alive.
    #[serde(deserialize_with = "integer::required")]
    pub ttl_ms: u64,
}

/// A grant attached to a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GrantRef {
    pub namespace: String,
    pub token: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Session {
    pub id: String,
    pub ttl_ms: u64,
    pub expires_in_ms: u64,
    pub grants: Vec<GrantRef>,
}

/// A page of the open sessions, ordered by id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SessionList {
    pub sessions: Vec<Session>,
    /// Where the next page starts: give it as `cursor`. `null` on the last page.
    #[serde(default)]
    pub next_cursor: Option<String>,
}

/// `GET /healthz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Health {
    pub status: String,
    pub backend: String,
    /// What an acknowledged change survives: `disk` (a power loss) or `process` (a crash of the
    /// daemon, not a power loss) on the embedded store; `redis` on Redis (what its persistence
    /// settings keep).
    #[serde(default)]
    pub durability: String,
    pub version: String,
}

/// `GET /readyz`: whether this daemon can serve every part of the API now (200), or not yet (503).
/// `/healthz` only says that the process answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Readiness {
    /// `ready` or `not_ready`.
    pub status: String,
    pub backend: String,
    /// One per part the daemon serves, in a fixed order: `store` (quotas, pools and runs) and
    /// `applications` (queues, applications and tasks).
    pub checks: Vec<ReadinessCheck>,
}

/// Whether one part of the API can be served now, and why not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReadinessCheck {
    pub name: String,
    pub ready: bool,
    /// Why it is not ready (or, when ready, where it is served, e.g. by another daemon).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Every error answer: a stable machine-readable `code` and a message for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// One of the codes listed in the API's description, e.g. `namespace_not_found`.
    pub code: String,
    pub message: String,
}

// ---- Leased resource pools. Resources are written in their text form, e.g. `cpu=4,mem=16GiB`.

/// `PUT /v1/pools/{pool}`: create a pool or change its capacity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutPool {
    /// e.g. `cpu=16,mem=64GiB,disk=1TiB,gpu=2`.
    pub capacity: String,
    /// What the scheduler's selectors match, e.g. `{"zone": "eu"}`; not given keeps them.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "object::optional")]
    pub labels: Option<std::collections::BTreeMap<String, String>>,
}

/// Counters of a pool since the daemon started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PoolStats {
    pub accepted: u64,
    pub offer_expired: u64,
    pub freed: u64,
    pub reclaimed: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Pool {
    pub name: String,
    pub capacity: String,
    /// Held by allocs whose lease is running.
    pub allocated: String,
    /// Held by allocs whose lease has lapsed, not reclaimed yet (offered again).
    pub expired: String,
    pub allocs: u64,
    pub expired_allocs: u64,
    /// A stopped pool (idle) makes no offers until it is put again.
    pub stopped: bool,
    pub stats: PoolStats,
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PutPoolResponse {
    pub created: bool,
    pub pool: Pool,
}

/// A page of the pools, ordered by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PoolList {
    pub pools: Vec<Pool>,
    /// Where the next page starts: give it as `cursor`. `null` on the last page.
    #[serde(default)]
    pub next_cursor: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RemovedPool {
    pub name: String,
    pub allocs_ended: u64,
}

/// A pool's offer: everything free in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Offer {
    pub id: String,
    pub pool: String,
    pub available: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct OfferList {
    /// Empty when nothing is free; at most one per pool.
    pub offers: Vec<Offer>,
}

/// `POST /v1/pools/{pool}/offers/{offer}`: accept the offer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Accept {
    /// The least the alloc needs, e.g. `cpu=2,mem=4GiB`.
    pub min: String,
    /// Take up to this much when it is free; absent means exactly `min`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
}

/// Why an alloc ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    Freed,
    Reclaimed,
    PoolStopped,
    PoolRemoved,
}

/// An alloc [Reflow `AllocInspect`]. Times are relative to the daemon's clock when it answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Alloc {
    /// `pool/alloc`, the alloc's address in a mux of pools.
    pub uri: String,
    pub pool: String,
    pub id: String,
    pub resources: String,
    pub owner: String,
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
    pub created_ms_ago: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_keepalive_ms_ago: Option<u64>,
    /// Negative once the lease has lapsed (the alloc may still be revived until reclaimed).
    /// Absent (`null`) for an alloc held by the scheduler for a task: it has no lease, and lives
    /// until the task ends (`held_by`).
    pub expires_in_ms: Option<i64>,
    /// Who holds an alloc that has no lease: `scheduler` (for the task its `owner` names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by: Option<String>,
    /// Set once the alloc has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<EndReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_ms_ago: Option<u64>,
}

/// A page of a pool's live allocs, ordered by id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AllocList {
    pub allocs: Vec<Alloc>,
    /// Where the next page starts: give it as `cursor`. `null` on the last page.
    #[serde(default)]
    pub next_cursor: Option<String>,
}

/// `POST /v1/pools/{pool}/allocs/{alloc}/keepalive`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AllocKeepalive {
    /// The lease asked for; the daemon grants at most its maximum (5 minutes by default).
    #[serde(deserialize_with = "integer::required")]
    pub interval_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AllocKeepaliveResponse {
    /// The lease granted: keep alive again before it runs out.
    pub interval_ms: u64,
    pub alloc: Alloc,
}

/// `POST /v1/pools/{pool}/stop-if-idle`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StopIfIdle {
    #[serde(deserialize_with = "integer::required")]
    pub idle_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StopIfIdleResponse {
    pub stopped: bool,
    /// When not stopped: how long until the pool would be idle, if no alloc is kept alive.
    pub until_idle_ms: u64,
}

#[cfg(test)]
mod tests {
    #[derive(Debug, serde::Deserialize)]
    struct Units {
        #[serde(deserialize_with = "crate::integer::required")]
        units: u64,
    }

    /// A whole number spelled with a fraction of zero is read exactly, up to 2^53: JSON numbers
    /// are parsed to the nearest float (serde_json's `float_roundtrip`), not one step off.
    #[test]
    fn whole_floats_are_read_exactly() {
        for (text, want) in
            [("4081970639192801.0", 4_081_970_639_192_801), ("1e3", 1000), ("9007199254740991.0", (1 << 53) - 1)]
        {
            let read: Units = serde_json::from_str(&format!(r#"{{"units": {text}}}"#)).unwrap();
            assert_eq!(read.units, want, "{text}");
        }
        assert!(serde_json::from_str::<Units>(r#"{"units": 2.5}"#).is_err());
    }
}
