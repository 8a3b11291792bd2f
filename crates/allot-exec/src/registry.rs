//! Which plugin runs a task [Flyte `Handler.ResolvePlugin`], loaded once at start.
//!
//! A task's plugin is, in order: the one the task names; the one the configuration names for its
//! type; the one plugin registered for its type; the default plugin. Unlike Flyte, a second
//! default plugin, or two plugins for one type with no configured choice, stop the start with an
//! error instead of one being ignored.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::context::SetupContext;
use crate::plugin::{Plugin, PluginEntry};

/// Why the plugins could not be loaded: the daemon does not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("two plugins have the id `{0}`")]
    DuplicateId(String),
    #[error("plugin `{0}` registers no task type")]
    NoTaskTypes(String),
    #[error("plugins `{first}` and `{second}` are both the default plugin: at most one may be")]
    TwoDefaults { first: String, second: String },
    #[error(
        "task type `{task_type}` is registered by plugins {plugins}: choose one in the configuration \
         ([plugins.task_types] {task_type} = \"...\")"
    )]
    Ambiguous { task_type: String, plugins: String },
    #[error("the configuration picks plugin `{plugin}` for task type `{task_type}`, but no such plugin is registered")]
    UnknownChoice { task_type: String, plugin: String },
    #[error("plugin `{id}` failed to load: {error}")]
    LoadFailed { id: String, error: String },
}

/// Why a task has no plugin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("the task names plugin `{0}`, which is not registered")]
    UnknownPlugin(String),
    #[error("no plugin runs task type `{0}`, and there is no default plugin")]
    NoPlugin(String),
}

/// The loaded plugins, and who runs which task type.
pub struct Registry {
    plugins: BTreeMap<String, Arc<dyn Plugin>>,
    by_type: BTreeMap<String, String>,
    default: Option<String>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("plugins", &self.plugins.keys().collect::<Vec<_>>())
            .field("by_type", &self.by_type)
            .field("default", &self.default)
            .finish()
    }
}

impl Registry {
    /// Checks the entries against each other and the configured choices (`task type ->
    /// plugin`), then runs every loader once, in id order. `setup` makes each plugin's context.
    pub async fn load(
        entries: Vec<PluginEntry>,
        choices: &BTreeMap<String, String>,
        setup: impl Fn(&str) -> SetupContext,
    ) -> Result<Registry, RegistryError> {
        let mut by_id: BTreeMap<String, PluginEntry> = BTreeMap::new();
        let mut default: Option<String> = None;
        for entry in entries {
            if entry.task_types.is_empty() && !entry.default {
                return Err(RegistryError::NoTaskTypes(entry.id));
            }
            if entry.default {
                if let Some(first) = &default {
                    return Err(RegistryError::TwoDefaults { first: first.clone(), second: entry.id });
                }
                default = Some(entry.id.clone());
            }
            if by_id.contains_key(&entry.id) {
                return Err(RegistryError::DuplicateId(entry.id));
            }
            by_id.insert(entry.id.clone(), entry);
        }
        let mut claims: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for entry in by_id.values() {
            for task_type in &entry.task_types {
                claims.entry(task_type.clone()).or_default().push(entry.id.clone());
            }
        }
        let mut by_type = BTreeMap::new();
        for (task_type, plugin) in choices {
            if !by_id.contains_key(plugin) {
                return Err(RegistryError::UnknownChoice { task_type: task_type.clone(), plugin: plugin.clone() });
            }
            by_type.insert(task_type.clone(), plugin.clone());
        }
        for (task_type, ids) in claims {
            if by_type.contains_key(&task_type) {
                continue;
            }
            match ids.as_slice() {
                [one] => {
                    by_type.insert(task_type, one.clone());
                }
                _ => {
                    let plugins = ids.iter().map(|id| format!("`{id}`")).collect::<Vec<_>>().join(", ");
                    return Err(RegistryError::Ambiguous { task_type, plugins });
                }
            }
        }
        let mut plugins = BTreeMap::new();
        for (id, entry) in by_id {
            let plugin = (entry.loader)(setup(&id))
                .await
                .map_err(|error| RegistryError::LoadFailed { id: id.clone(), error })?;
            tracing::info!(plugin = %id, task_types = ?entry.task_types, default = entry.default, "plugin loaded");
            plugins.insert(id, plugin);
        }
        Ok(Registry { plugins, by_type, default })
    }

    /// The plugin of a task of `task_type`, or the one it names.
    pub fn resolve(&self, task_type: &str, named: Option<&str>) -> Result<Arc<dyn Plugin>, ResolveError> {
        if let Some(id) = named {
            return self.plugins.get(id).cloned().ok_or_else(|| ResolveError::UnknownPlugin(id.to_owned()));
        }
        let id = self
            .by_type
            .get(task_type)
            .or(self.default.as_ref())
            .ok_or_else(|| ResolveError::NoPlugin(task_type.to_owned()))?;
        Ok(self.plugins[id].clone())
    }

    /// The task types it runs, as the executor's lease says: `*` for every type when there is a
    /// default plugin.
    pub fn task_types(&self) -> Vec<String> {
        let every = self.default.as_ref().map(|_| allot_core::apps::EVERY_TYPE.to_owned());
        self.by_type.keys().cloned().chain(every).collect()
    }

    /// The loaded plugins' ids.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.plugins.keys().map(String::as_str)
    }
}
