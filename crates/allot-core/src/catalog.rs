//! The catalog's keys [Flyte's catalog]: digests of what makes two pieces of work the same.
//! Whole tasks are keyed by the executor (`allot-exec`'s spec); a plugin's own entries by
//! [`plugin_catalog_key`]: its plugin, its application's queue, and the entry's name, version and
//! inputs, so no plugin reaches another's entries and no queue another's (Flyte's catalog is per
//! project and domain).

use sha2::{Digest, Sha256};

/// The format of a plugin's catalog keys (a change of it makes new keys).
const PLUGIN_KEY_FORMAT: &str = "allot-plugin-catalog/1";
/// The longest name or version of an entry, in bytes.
pub const MAX_NAME_BYTES: usize = 256;

/// Whose entries a plugin's calls reach, and how much one may keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogScope {
    pub plugin: String,
    /// The queue of the application of the task the plugin runs.
    pub queue: String,
    /// The most an entry's outputs may hold (their JSON text, in bytes).
    pub max_output_bytes: usize,
}

/// Why an entry cannot be named or kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    #[error("a catalog entry's {what} has 1 to {MAX_NAME_BYTES} bytes; `{start}` has {bytes}")]
    BadName { what: &'static str, start: String, bytes: usize },
    #[error("a catalog entry's outputs are {bytes} bytes; at most {max}")]
    TooLarge { bytes: usize, max: usize },
}

/// The key of entry `name` at `version` for `inputs` in `scope`.
pub fn plugin_catalog_key(
    scope: &CatalogScope,
    name: &str,
    version: &str,
    inputs: &serde_json::Value,
) -> Result<String, CatalogError> {
    for (what, text) in [("name", name), ("version", version)] {
        if text.is_empty() || text.len() > MAX_NAME_BYTES {
            let start = text.chars().take(40).collect();
            return Err(CatalogError::BadName { what, start, bytes: text.len() });
        }
    }
    let inputs = canonical(inputs);
    let parts: [&[u8]; 6] = [
        PLUGIN_KEY_FORMAT.as_bytes(),
        scope.plugin.as_bytes(),
        scope.queue.as_bytes(),
        name.as_bytes(),
        version.as_bytes(),
        inputs.as_bytes(),
    ];
    Ok(hex_digest(&parts))
}

/// Checks the size of outputs to keep in `scope`.
pub fn check_outputs(scope: &CatalogScope, outputs_text: &str) -> Result<(), CatalogError> {
    match outputs_text.len() {
        bytes if bytes > scope.max_output_bytes => Err(CatalogError::TooLarge { bytes, max: scope.max_output_bytes }),
        _ => Ok(()),
    }
}

/// Hex SHA-256 of `parts`, each preceded by its length (so parts cannot run into each other).
pub fn hex_digest(parts: &[&[u8]]) -> String {
    let mut digest = Sha256::new();
    for part in parts {
        digest.update((part.len() as u64).to_be_bytes());
        digest.update(part);
    }
    digest.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// JSON text with every object's keys sorted, whatever order the value keeps them in: equal
/// values give equal text.
pub fn canonical(value: &serde_json::Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &serde_json::Value, out: &mut String) {
    match value {
        serde_json::Value::Object(fields) => {
            let mut keys: Vec<&String> = fields.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&fields[key], out);
            }
            out.push('}');
        }
        serde_json::Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_text_sorts_keys_at_every_depth() {
        let a: serde_json::Value = serde_json::from_str(r#"{"b": [{"y": 1, "x": 2}], "a": "t"}"#).unwrap();
        let b: serde_json::Value = serde_json::from_str(r#"{"a": "t", "b": [{"x": 2, "y": 1}]}"#).unwrap();
        assert_eq!(canonical(&a), canonical(&b));
        assert_eq!(canonical(&a), r#"{"a":"t","b":[{"x":2,"y":1}]}"#);
    }

    #[test]
    fn a_plugins_keys_differ_by_plugin_queue_name_version_and_inputs() {
        let scope = CatalogScope { plugin: "p".into(), queue: "root.a".into(), max_output_bytes: 10 };
        let inputs = serde_json::json!({"b": 1, "a": [2]});
        let key = plugin_catalog_key(&scope, "n", "1", &inputs).unwrap();
        let reordered = serde_json::from_str(r#"{"a": [2], "b": 1}"#).unwrap();
        assert_eq!(plugin_catalog_key(&scope, "n", "1", &reordered).unwrap(), key);
        let other_queue = CatalogScope { queue: "root.b".into(), ..scope.clone() };
        let other_plugin = CatalogScope { plugin: "q".into(), ..scope.clone() };
        for other in [
            plugin_catalog_key(&other_queue, "n", "1", &inputs),
            plugin_catalog_key(&other_plugin, "n", "1", &inputs),
            plugin_catalog_key(&scope, "n", "2", &inputs),
            plugin_catalog_key(&scope, "m", "1", &inputs),
            plugin_catalog_key(&scope, "n", "1", &serde_json::json!({"b": 1})),
        ] {
            assert_ne!(other.unwrap(), key);
        }
        assert!(matches!(plugin_catalog_key(&scope, "", "1", &inputs), Err(CatalogError::BadName { .. })));
        assert!(plugin_catalog_key(&scope, "n", &"v".repeat(MAX_NAME_BYTES + 1), &inputs).is_err());
        assert_eq!(check_outputs(&scope, "0123456789"), Ok(()));
        assert!(check_outputs(&scope, "0123456789a").is_err());
    }
}
