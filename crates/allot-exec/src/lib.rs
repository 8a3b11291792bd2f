//! allot's task plugins and their executor [Flyte's plugin machinery].
//!
//! - `plugin`: the [`Plugin`] trait and its [`PluginEntry`];
//! - `registry`: which plugin runs a task, loaded once at start;
//! - `catalog`: the outputs a plugin keeps and looks up itself;
//! - `context`: what a plugin is given at start and for each round, with the resource manager
//!   (allot's own token quotas, woken on release rather than polled);
//! - `spec`: what a task's spec says to the executor (its type, plugin, retries, cache key);
//! - `executor`: the loop that drives every task placed on this daemon's pools, round by round;
//! - `apps`: the applications part as the executor reaches it (this daemon's store, or over HTTP
//!   the daemon that schedules);
//! - `feed`: the executor on the store's change feed (what each change asks of it);
//! - `builtin`: the plugins that come with allot.
//!
//! The decisions over a run (phases, retries, events, abort then finalize) are pure, in
//! `allot_core::runs`.

pub mod apps;
pub mod builtin;
pub mod catalog;
pub mod context;
pub mod executor;
mod feed;
pub mod plugin;
pub mod registry;
pub mod spec;

pub use catalog::{Catalog, CatalogEntry, Kept};
pub use context::{
    Metadata, MetricsScope, PluginCounters, RoundOutput, RunKey, Secrets, SetupContext, TaskContext, TokenStatus,
    TokenWaits, Tokens, Waker,
};
pub use executor::{ExecCounts, ExecStats, Executor, ExecutorConfig, EXECUTOR_LEASE};
pub use plugin::{LoadResult, Plugin, PluginEntry, PluginLoader, PluginProperties};
pub use registry::{Registry, RegistryError, ResolveError};
