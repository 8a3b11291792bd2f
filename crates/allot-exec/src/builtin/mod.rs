//! The plugins that come with allot.

mod job;
mod noop;
mod shell;
mod sleep;

pub use job::JOBS_QUOTA;

use crate::plugin::PluginEntry;

/// The built-in plugins' settings (`[plugins]` in the daemon's configuration).
#[derive(Debug, Clone)]
pub struct BuiltinConfig {
    /// The quota of the `http` plugin's jobs (`http:jobs`), made at the first start.
    pub http_jobs: u64,
    /// Plugins served by other processes.
    pub external: Vec<ExternalPlugin>,
}

impl Default for BuiltinConfig {
    fn default() -> BuiltinConfig {
        BuiltinConfig { http_jobs: 10, external: Vec::new() }
    }
}

/// A plugin served by another process over HTTP/JSON (`[plugins.external.<id>]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalPlugin {
    pub id: String,
    pub url: String,
    pub task_types: Vec<String>,
    /// With a quota, each of its jobs holds a token of `<id>:jobs` while it runs.
    pub jobs_quota: Option<u64>,
}

/// Every built-in plugin's entry, with the default settings.
pub fn entries() -> Vec<PluginEntry> {
    configured(&BuiltinConfig::default())
}

/// Every built-in plugin's entry, and one per external plugin.
pub fn configured(config: &BuiltinConfig) -> Vec<PluginEntry> {
    let mut entries = vec![noop::entry(), shell::entry(), sleep::entry(), job::http_entry(config.http_jobs)];
    for plugin in &config.external {
        let types: Vec<&str> = plugin.task_types.iter().map(String::as_str).collect();
        entries.push(job::external_entry(&plugin.id, &plugin.url, &types, plugin.jobs_quota));
    }
    entries
}
