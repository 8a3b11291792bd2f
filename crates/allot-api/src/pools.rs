//! The pools' bodies: pools, offers and allocs. Resources are written in their text form, e.g.
//! `cpu=4,mem=16GiB`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{integer, object};

/// `PUT /v1/pools/{pool}`: create a pool or change its capacity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutPool {
    /// e.g. `cpu=16,mem=64GiB,disk=1TiB,gpu=2`.
    pub capacity: String,
    /// What the scheduler's selectors match, e.g. `{"zone": "eu"}`; not given keeps them.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "object::optional")]
    pub labels: Option<std::collections::BTreeMap<String, String>>,
    /// The task types the executor of this pool runs, e.g. `["http", "noop"]`: the scheduler
    /// places no task of another type here. A list with `"*"`: every type its daemon has (what a
    /// pool runs until it is given a list). Not given keeps what it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugins: Option<Vec<String>>,
    /// What things allot does not manage hold in the pool, e.g. `cpu=2,mem=4GiB` (YuniKorn's
    /// occupied resources): never offered, and tasks that no longer fit are preempted. `""`
    /// clears it; not given keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub occupied: Option<String>,
}

/// `POST /v1/pools/{pool}/drain`: cordon the pool and preempt its tasks after a grace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Drain {
    /// How long its tasks may run on before they are preempted (default 30,000 ms; 0: at
    /// once). Draining a pool already drained keeps the earlier time.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "integer::optional")]
    pub grace_ms: Option<u64>,
}

/// A cordoned pool: it takes no new allocs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PoolCordon {
    /// How long ago it was cordoned (the daemon's clock).
    pub since_ms_ago: u64,
    /// Drained: how long until its tasks are preempted; 0 once they are (those that may not be
    /// preempted, and gang members, run to their end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_in_ms: Option<u64>,
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
    /// Held by things allot does not manage (never offered); `""` when nothing is.
    #[serde(default)]
    pub occupied: String,
    /// Cordoned (no new allocs; `allot pool cordon`), and drained if it says when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cordon: Option<PoolCordon>,
    pub stats: PoolStats,
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
    /// The task types its executor runs; `null`: every type its daemon has.
    #[serde(default)]
    pub plugins: Option<Vec<String>>,
    /// The daemons (by URL) whose live executors run its tasks; empty when no daemon runs it:
    /// then only tasks without a type (run by outside workers that read their allocs) are placed
    /// on it.
    /// Absent in the change feed's events (which say what changed in the store, not who runs
    /// it): read the pool for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_by: Option<Vec<String>>,
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
    /// The owner's labels (keys and values at most 16 KiB in all; keys starting with `allot/`
    /// are allot's own, and refused).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
    /// The owner's free-form metadata: a JSON object, at most 16 KiB written compactly (what runs
    /// in the alloc, its results [Reflow: an alloc's execs]). `null` is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<serde_json::Value>,
}

/// `PATCH /v1/pools/{pool}/allocs/{alloc}`: change what the owner attaches to a live alloc. What
/// is not given is kept; the lease is not renewed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AnnotateAlloc {
    /// Labels to set (added or changed), after `remove_labels` are removed: a label in both is
    /// set.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
    /// Labels to remove.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove_labels: Vec<String>,
    /// New metadata, replacing what it had (a JSON object, at most 16 KiB); `null` removes it;
    /// absent keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Option<serde_json::Value>>,
}

/// A field that may be absent (`None`), `null` (`Some(None)`) or a value.
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Option<serde_json::Value>>, D::Error> {
    Option::<serde_json::Value>::deserialize(deserializer).map(Some)
}

/// What an alloc the scheduler holds has in it: a task of an application, or a placeholder of
/// its gang until a task of the group takes it over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AllocTask {
    pub app: String,
    /// The task in it; its run (and outputs) at `GET /v1/pools/{pool}/allocs/{alloc}/run`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// The gang placeholder in it (`group#member`), until a task takes it over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placeholder: Option<String>,
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
    /// The owner's free-form metadata; absent when it has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<serde_json::Value>,
    /// For an alloc the scheduler holds: the task or gang placeholder in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<AllocTask>,
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
