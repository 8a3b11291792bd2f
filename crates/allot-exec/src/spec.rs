//! What a task's spec says to the executor: `{"type": ..., "plugin": ..., "inputs": ...,
//! "retries": ..., "cache_version": ..., "cache": ...}`, the rest for its plugin; and the key of
//! its outputs in the catalog [Flyte's catalog key: the task's identity, version, interface and
//! inputs], which covers everything in the spec that decides what the task does.

use allot_core::catalog::{canonical, hex_digest};
use allot_core::runs::{CacheLookup, ExecError, RetryPolicy};

use crate::plugin::Plugin;

/// The keys of a spec that are the executor's own settings, not what the task does: left out of
/// the cache key (a task retried more or less often, or cached or not, does the same).
const EXECUTOR_KEYS: [&str; 2] = ["retries", "cache"];

/// The format of the cache key; another format is another key (outputs kept under an older one
/// are not reused).
const KEY_FORMAT: &str = "allot-cache-key/2";

/// What a task's spec says of how to run it.
#[derive(Debug, Clone)]
pub(crate) struct RunSpec {
    pub(crate) task_type: String,
    pub(crate) plugin: Option<String>,
    /// The whole spec, as its plugin receives it.
    pub(crate) spec: serde_json::Value,
    pub(crate) inputs: serde_json::Value,
    /// `retries`: new attempts after user failures; the daemon's default when absent.
    pub(crate) retries: Option<u32>,
    /// `cache_version`: the task's outputs are kept for reuse, and reused, under its cache key
    /// (unless `"cache": false`).
    pub(crate) cache_version: Option<String>,
    pub(crate) cache: bool,
}

pub use allot_api::spec::{retries, with_retries};

pub(crate) fn parse(text: &str) -> Result<RunSpec, ExecError> {
    let bad = |why: &str| ExecError::user("bad_spec", format!("the task's spec {why}"));
    let spec: serde_json::Value = if text.trim().is_empty() {
        return Err(bad("is empty: it names no task type (`{\"type\": \"shell\", ...}`)"));
    } else {
        serde_json::from_str(text).map_err(|e| bad(&format!("is not JSON: {e}")))?
    };
    let task_type = spec.get("type").and_then(|t| t.as_str()).ok_or_else(|| bad("has no string `type`"))?.to_owned();
    let plugin = match spec.get("plugin") {
        None => None,
        Some(p) => Some(p.as_str().ok_or_else(|| bad("has a `plugin` that is not a string"))?.to_owned()),
    };
    let inputs = spec.get("inputs").cloned().unwrap_or(serde_json::Value::Null);
    let retries = retries(&spec).map_err(|why| bad(&format!("has {why}")))?;
    let cache_version = match spec.get("cache_version") {
        None => None,
        Some(serde_json::Value::String(v)) => Some(v.clone()),
        Some(_) => return Err(bad("has a `cache_version` that is not a string")),
    };
    let cache = match spec.get("cache") {
        None => true,
        Some(serde_json::Value::Bool(on)) => *on,
        Some(_) => return Err(bad("has a `cache` that is not true or false")),
    };
    Ok(RunSpec { task_type, plugin, spec, inputs, retries, cache_version, cache })
}

impl RunSpec {
    /// Its retry policy: its own `retries`, else the daemon's default, with the daemon's system
    /// budget.
    pub(crate) fn policy(&self, default: RetryPolicy) -> RetryPolicy {
        match self.retries {
            Some(retries) => RetryPolicy::new(retries, default.system_retries),
            None => default,
        }
    }

    /// What the catalog is asked for it, if it may be cached by `plugin`: the key is a digest of
    /// the task type, the plugin, the cache version, the spec (its inputs and the executor's own
    /// settings left out) and the inputs, each JSON with sorted keys. Two tasks share outputs
    /// only if they would do the same: the same plugin given the same spec and inputs.
    pub(crate) fn cache_lookup(&self, plugin: &dyn Plugin) -> Option<CacheLookup> {
        let version = self.cache_version.as_ref().filter(|_| self.cache && plugin.properties().caching)?;
        let mut spec = self.spec.clone();
        if let Some(fields) = spec.as_object_mut() {
            fields.remove("inputs");
            for key in EXECUTOR_KEYS {
                fields.remove(key);
            }
        }
        let spec_digest = hex_digest(&[canonical(&spec).as_bytes()]);
        let inputs_digest = hex_digest(&[canonical(&self.inputs).as_bytes()]);
        let parts = [
            KEY_FORMAT.as_bytes(),
            self.task_type.as_bytes(),
            plugin.id().as_bytes(),
            version.as_bytes(),
            spec_digest.as_bytes(),
            inputs_digest.as_bytes(),
        ];
        Some(CacheLookup {
            key: hex_digest(&parts),
            task_type: self.task_type.clone(),
            plugin: plugin.id().to_owned(),
            cache_version: version.clone(),
            spec_digest,
            inputs_digest,
            hit: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_are_a_whole_number_up_to_the_most() {
        let of = |text: &str| retries(&serde_json::from_str(text).unwrap());
        assert_eq!(of(r#"{"type": "shell"}"#), Ok(None));
        assert_eq!(of(r#"{"retries": 0}"#), Ok(Some(0)));
        assert_eq!(of(r#"{"retries": 100}"#), Ok(Some(100)));
        assert_eq!(of(r#"{"retries": 91.0}"#), Ok(Some(91)), "a whole number, as JSON Schema counts them");
        for bad in [
            r#"{"retries": 101}"#,
            r#"{"retries": -1}"#,
            r#"{"retries": 1.5}"#,
            r#"{"retries": 1e300}"#,
            r#"{"retries": "2"}"#,
        ] {
            assert!(of(bad).unwrap_err().contains("from 0 to 100"), "{bad}");
        }
    }
}

#[cfg(test)]
mod retries_beside_the_spec {
    use serde_json::json;

    use super::with_retries;

    #[test]
    fn are_kept_in_it() {
        let spec = json!({ "type": "shell", "command": "true" });
        let kept = with_retries(Some(spec.clone()), Some(2)).unwrap().unwrap();
        assert_eq!(kept["retries"], 2);
        assert_eq!(with_retries(Some(spec.clone()), None).unwrap(), Some(spec));
        assert_eq!(with_retries(None, None).unwrap(), None);
        let inside = json!({ "type": "shell", "retries": 1 });
        assert_eq!(with_retries(Some(inside), Some(2)).unwrap().unwrap()["retries"], 2, "beside the spec wins");
        assert_eq!(with_retries(None, Some(1)).unwrap(), Some(json!({ "retries": 1 })));
        assert!(with_retries(Some(json!({ "type": "noop" })), Some(101)).is_err(), "out of bounds");
        assert!(with_retries(Some(json!("shell")), Some(1)).is_err(), "not an object");
    }
}
