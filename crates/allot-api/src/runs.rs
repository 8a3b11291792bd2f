//! The runs' bodies: how a task is being run by its plugin (attempts, phases, events, cache),
//! its logs and its wake-up.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Why an attempt of a task failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RunError {
    /// `user` or `system`: each has its own retry budget.
    pub kind: String,
    /// Stable and machine-readable (`exit_3`, `bad_spec`, `process_vanished`...).
    pub code: String,
    pub message: String,
}

/// A link to a task's logs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RunLog {
    pub name: String,
    pub uri: String,
}

/// A change of a task's run: one per attempt, phase and version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RunEvent {
    pub attempt: u32,
    /// NotReady, WaitingForResources, Queued, Initializing, Running, Success, RetryableFailure
    /// or PermanentFailure.
    pub phase: String,
    pub version: u32,
    pub reason: String,
    /// When it was recorded, in ms since the epoch.
    pub at_ms: u64,
    /// When it happened, as the plugin reported it (a job that its service says started earlier
    /// than the round that saw it), in ms since the epoch: never after `at_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub occurred_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RunError>,
    /// Links to its logs or consoles.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logs: Vec<RunLog>,
    /// What the plugin tells of it for the front end (an outside job's id and link): a JSON
    /// object of at most 16 KiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub custom_info: Option<serde_json::Value>,
}

/// How a task is being run by its plugin, and its phase timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TaskRun {
    pub app: String,
    pub task: String,
    /// 1 for the first attempt.
    pub attempt: u32,
    pub phase: String,
    pub user_failures: u32,
    pub system_failures: u32,
    /// `running`, `ending` (its attempt is being aborted or finalized) or `ended`.
    pub stage: String,
    /// How it ended: `succeeded`, `failed: ...` or `aborted: ...`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ending: Option<String>,
    /// What the task gave as outputs, once it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub outputs: Option<serde_json::Value>,
    /// What the output cache looked up, for a task with a `cache_version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<RunCache>,
    pub events: Vec<RunEvent>,
}

/// The output cache's key for a task and its parts [Flyte's catalog key]: two tasks share
/// outputs only when every part is the same.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RunCache {
    /// The key in the catalog: SHA-256 (hex) of the parts below.
    pub key: String,
    pub task_type: String,
    /// The plugin that runs it.
    pub plugin: String,
    pub cache_version: String,
    /// SHA-256 (hex) of the task's spec as its plugin receives it (JSON with sorted keys),
    /// without its `inputs` and the executor's own `retries` and `cache`: for `shell`, the
    /// command and its environment; for `http`, the job's body.
    pub spec_digest: String,
    /// SHA-256 (hex) of its `inputs` (JSON with sorted keys).
    pub inputs_digest: String,
    /// For a hit, the task whose outputs it took (`app/task`); absent for a miss.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hit: Option<String>,
}

/// A piece of a task's log, from `offset` (bytes): read again from `next_offset` to follow it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TaskLogs {
    pub app: String,
    pub task: String,
    pub attempt: u32,
    /// The log's name, e.g. `stdout` or `stderr`.
    pub stream: String,
    pub offset: u64,
    pub next_offset: u64,
    /// The log's text from `offset` (at most 256 KiB at once; invalid UTF-8 is replaced).
    pub text: String,
    /// True once nothing more will be written: the attempt is over.
    pub ended: bool,
}

/// Where a wake-up went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Woken {
    pub app: String,
    pub task: String,
}

/// An entry of a plugin's catalog to look up [Flyte `Catalog().Download`]: its name, version and
/// inputs. The entries a call reaches are those of the plugin that runs the task named in the
/// path, in its application's queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CatalogLookup {
    /// 1 to 256 bytes.
    pub name: String,
    /// 1 to 256 bytes: a new version is a new entry.
    pub version: String,
    /// Any JSON (the order of an object's keys does not count).
    #[serde(default)]
    #[schema(value_type = Object)]
    pub inputs: serde_json::Value,
}

/// Outputs to keep in a plugin's catalog [Flyte `Catalog().Upload`]: the first kept under a key
/// stays until its retention is over.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CatalogPut {
    pub name: String,
    pub version: String,
    #[serde(default)]
    #[schema(value_type = Object)]
    pub inputs: serde_json::Value,
    /// At most the daemon's `max_output_bytes` (1 MiB by default), as JSON text.
    #[schema(value_type = Object)]
    pub outputs: serde_json::Value,
}

/// An entry of a plugin's catalog.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CatalogEntry {
    /// Its key: SHA-256 (hex) of the plugin, the queue, the name, the version and the inputs.
    pub key: String,
    #[schema(value_type = Object)]
    pub outputs: serde_json::Value,
    /// The task whose plugin kept it.
    pub app: String,
    pub task: String,
    /// When it was kept, in ms since the epoch.
    pub kept_at_ms: u64,
}

/// What a lookup found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CatalogFound {
    pub key: String,
    /// `null`: nothing is kept under the key.
    pub entry: Option<CatalogEntry>,
}

/// What a put kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CatalogKept {
    /// Whether the entry is the one just put (`false`: another was kept before, and stays).
    pub created: bool,
    pub entry: CatalogEntry,
}
