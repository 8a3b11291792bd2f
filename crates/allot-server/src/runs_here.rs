//! What the HTTP edge needs of the executor of the tasks this daemon runs (their wake-ups, where
//! their logs are, their counters at `/metrics`). The binary wires the executor in through
//! [`RunsHere`], so the server builds without the executor and its plugins.

use allot_core::apps::{AppId, TaskId};

/// The executor of the tasks this daemon runs, as the edge sees it.
pub trait RunsHere: Send + Sync {
    /// This daemon's name in the executors' leases (its URL).
    fn node(&self) -> &str;
    /// Wakes the run of `task` of `app` for a round now, if this daemon drives it; false if not.
    fn wake(&self, app: &AppId, task: &TaskId) -> bool;
    /// Whose catalog entries the plugin of the run of `task` of `app` reaches, if this daemon
    /// drives it now.
    fn catalog_scope(&self, app: &AppId, task: &TaskId) -> Option<allot_core::catalog::CatalogScope>;
    /// The directory of the attempts of `task` of `app` on this machine: the logs route serves
    /// only files inside it.
    fn task_dir(&self, app: &AppId, task: &TaskId) -> std::path::PathBuf;
    /// Its counters now.
    fn counters(&self) -> RunCounters;
}

/// The executor's counters, since the daemon started (`active`: now).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RunCounters {
    /// Runs being driven now.
    pub active: u64,
    pub rounds: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub aborted: u64,
    /// Attempts that failed and were followed by another.
    pub retried: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Times a run was held back by its application's parallelism.
    pub held_back: u64,
    /// Lists taken of the tasks placed on this daemon's pools.
    pub lists: u64,
    /// Times the change feed was cut under the executor (each followed by a list).
    pub feed_cuts: u64,
    /// Whether the executor follows the store's change feed now (else it lists periodically).
    pub following_feed: bool,
    /// The plugins' own counters: (plugin, name) and value.
    pub plugins: Vec<((String, String), u64)>,
}
