//! The catalog as a plugin reaches it [Flyte `TaskExecutionContext.Catalog()`]: outputs a plugin
//! keeps and looks up itself (a part of its work done before, a sub-job's result), beside the
//! outputs the executor keeps for whole tasks by their cache key.
//!
//! A plugin's entries are its own and its application's queue's (`allot_core::catalog`): no
//! plugin reads or overwrites another's, no one who may run tasks in one queue can put outputs
//! another queue's tasks would take, and none of them is a task's cache key. An entry, once kept,
//! stays until its retention is over (`[executor] cache_retention`): the first put wins, as for
//! tasks.

use std::sync::Arc;

use allot_core::apps::{AppId, TaskId};
use allot_core::catalog::{check_outputs, plugin_catalog_key, CatalogScope};
use allot_core::clock::TimeSource;
use allot_core::runs::ExecError;
use allot_core::Millis;
use allot_store::{keep_first, CachedOutputs, Store};

/// An entry of the catalog.
#[derive(Debug, Clone, PartialEq)]
pub struct CatalogEntry {
    /// Its key (hex SHA-256).
    pub key: String,
    pub outputs: serde_json::Value,
    /// The task whose plugin kept it.
    pub app: AppId,
    pub task: TaskId,
    /// When it was kept (ms since the epoch).
    pub at: Millis,
}

impl CatalogEntry {
    /// The entry kept under `key`.
    pub fn of(key: String, kept: CachedOutputs) -> Result<CatalogEntry, ExecError> {
        let outputs = serde_json::from_str(&kept.outputs)
            .map_err(|e| ExecError::system("bad_catalog_entry", format!("entry {key}: {e}")))?;
        Ok(CatalogEntry { key, outputs, app: kept.app, task: kept.task, at: kept.at })
    }
}

/// What a put did: the entry now kept, and whether it is the one just put (`false`: one was
/// kept before under the key, and stays).
#[derive(Debug, Clone, PartialEq)]
pub struct Kept {
    pub entry: CatalogEntry,
    pub created: bool,
}

/// The catalog of one task's round.
#[derive(Clone)]
pub struct Catalog {
    store: Option<Arc<dyn Store>>,
    scope: CatalogScope,
    /// The task whose plugin calls: what it keeps is said to be this task's.
    app: AppId,
    task: TaskId,
    clock: Arc<dyn TimeSource>,
}

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let task = format!("{}/{}", self.app, self.task);
        f.debug_struct("Catalog").field("scope", &self.scope).field("task", &task).finish_non_exhaustive()
    }
}

impl Catalog {
    pub fn new(
        store: Arc<dyn Store>,
        scope: CatalogScope,
        (app, task): (AppId, TaskId),
        clock: Arc<dyn TimeSource>,
    ) -> Catalog {
        Catalog { store: Some(store), scope, app, task, clock }
    }

    /// A catalog that reaches no store (a context made outside an executor): every call fails.
    pub fn detached((app, task): (AppId, TaskId)) -> Catalog {
        let scope = CatalogScope { plugin: String::new(), queue: String::new(), max_output_bytes: 0 };
        Catalog { store: None, scope, app, task, clock: Arc::new(allot_core::clock::SystemTime) }
    }

    pub fn scope(&self) -> &CatalogScope {
        &self.scope
    }

    /// The key of entry `name` at `version` for `inputs` (JSON, its keys' order not counting).
    pub fn key(&self, name: &str, version: &str, inputs: &serde_json::Value) -> Result<String, ExecError> {
        plugin_catalog_key(&self.scope, name, version, inputs)
            .map_err(|e| ExecError::user("bad_catalog_entry", e.to_string()))
    }

    fn store(&self) -> Result<&Arc<dyn Store>, ExecError> {
        self.store.as_ref().ok_or_else(|| ExecError::system("no_catalog", "this context reaches no catalog"))
    }

    /// The outputs kept as entry `name` at `version` for `inputs`, if any.
    pub async fn get(
        &self,
        name: &str,
        version: &str,
        inputs: &serde_json::Value,
    ) -> Result<Option<CatalogEntry>, ExecError> {
        let key = self.key(name, version, inputs)?;
        match self.store()?.cached_outputs(&key).await.map_err(store_error)? {
            Some(kept) => CatalogEntry::of(key, kept).map(Some),
            None => Ok(None),
        }
    }

    /// Keeps `outputs` as entry `name` at `version` for `inputs`, unless one is kept there
    /// already (it stays): answers the entry kept.
    pub async fn put(
        &self,
        name: &str,
        version: &str,
        inputs: &serde_json::Value,
        outputs: &serde_json::Value,
    ) -> Result<Kept, ExecError> {
        let key = self.key(name, version, inputs)?;
        let text = outputs.to_string();
        check_outputs(&self.scope, &text).map_err(|e| ExecError::user("outputs_too_large", e.to_string()))?;
        let entry =
            CachedOutputs { outputs: text, app: self.app.clone(), task: self.task.clone(), at: self.clock.wall_ms() };
        let (kept, created) = keep_first(&**self.store()?, &key, entry).await.map_err(store_error)?;
        Ok(Kept { entry: CatalogEntry::of(key, kept)?, created })
    }
}

fn store_error(err: allot_store::StoreError) -> ExecError {
    ExecError::system("store", err.to_string())
}
