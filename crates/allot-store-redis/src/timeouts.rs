//! How long the connections to Redis wait: shared by the standalone connection (`conn.rs`) and
//! the cluster's (`cluster.rs`).

use std::time::Duration;

/// How long one call may take before it is answered "outcome unknown".
pub(crate) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a change waits for its replicas (`WAIT`) with `--redis-min-replicas`; within
/// [`RESPONSE_TIMEOUT`], so a late replica is told apart from a lost answer.
pub(crate) const REPLICA_TIMEOUT: Duration = Duration::from_secs(1);
/// How long connecting to a node may take.
pub(crate) const CONNECTION_TIMEOUT: Duration = Duration::from_secs(1);
