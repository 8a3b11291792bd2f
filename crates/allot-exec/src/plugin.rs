//! The plugin of a task type [Flyte `pluginmachinery/core`]: it drives a placed task through its
//! phases, one `handle` round at a time, and is always finalized.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use allot_core::runs::{ExecError, Transition};
use async_trait::async_trait;

use crate::context::{SetupContext, TaskContext};

/// What a plugin says of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginProperties {
    /// Whether a task whose type, version and inputs ran successfully before may reuse its
    /// recorded outputs instead of running again (a task may turn it off too).
    pub caching: bool,
    /// Whether its rounds act outside the run: start processes or jobs, call services, take
    /// tokens, write the task's directory. A run of such a plugin is stored before its first
    /// round, so that a restart finds what that round began (and leaves the task's directory
    /// as it was). A run of a plugin whose rounds only compute is first stored with its first
    /// round's outcome (with the task's end, when that round ends it): a restart before runs
    /// that round afresh.
    pub acts_outside: bool,
}

impl Default for PluginProperties {
    fn default() -> PluginProperties {
        PluginProperties { caching: true, acts_outside: true }
    }
}

/// A plugin. Every method is async and must not block a thread: a round that waits on
/// something outside answers where the task is and is called again (when woken through
/// [`TaskContext::waker`], or after a pause the executor picks by phase).
///
/// `handle` is called repeatedly, so it must be idempotent for the same attempt and state; so
/// must `abort` and `finalize`. `finalize` is always called once an attempt is over: after
/// success, after failure, and after `abort`.
#[async_trait]
pub trait Plugin: Send + Sync {
    fn id(&self) -> &str;

    fn properties(&self) -> PluginProperties {
        PluginProperties::default()
    }

    /// One round: where the task is now. An error is a system failure of the attempt.
    async fn handle(&self, ctx: &mut TaskContext) -> Result<Transition, ExecError>;

    /// Stops what the attempt started (the task was removed, or its attempt failed).
    async fn abort(&self, ctx: &mut TaskContext) -> Result<(), ExecError>;

    /// Cleans up after the attempt, whatever its end.
    async fn finalize(&self, ctx: &mut TaskContext) -> Result<(), ExecError>;
}

/// What a loader answers.
pub type LoadResult = Result<Arc<dyn Plugin>, String>;

/// Builds a plugin, once, at start.
pub type PluginLoader = Box<dyn Fn(SetupContext) -> Pin<Box<dyn Future<Output = LoadResult> + Send>> + Send + Sync>;

/// A plugin as it is registered [Flyte `PluginEntry`].
pub struct PluginEntry {
    pub id: String,
    /// The task types it runs.
    pub task_types: Vec<String>,
    pub loader: PluginLoader,
    /// Runs the tasks of a type no other plugin claims. At most one plugin is the default.
    pub default: bool,
}

impl PluginEntry {
    /// An entry whose loader is an async function of the setup context.
    pub fn new<F, Fut>(id: &str, task_types: &[&str], default: bool, loader: F) -> PluginEntry
    where
        F: Fn(SetupContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = LoadResult> + Send + 'static,
    {
        PluginEntry {
            id: id.to_owned(),
            task_types: task_types.iter().map(|t| (*t).to_owned()).collect(),
            loader: Box::new(move |setup| Box::pin(loader(setup))),
            default,
        }
    }
}

impl std::fmt::Debug for PluginEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginEntry")
            .field("id", &self.id)
            .field("task_types", &self.task_types)
            .field("default", &self.default)
            .finish_non_exhaustive()
    }
}
