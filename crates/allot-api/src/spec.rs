//! What allot itself reads of a task's `spec` (otherwise opaque to it: the plugin's), checked
//! where a task comes in (the API, application files) and read where it runs (the executor).

/// The most retries a task may have: as the core's `allot_core::runs::MAX_RETRIES` (a test of
/// the server holds the two together).
pub const MAX_RETRIES: u32 = 100;

/// A spec with a task's own `retries` (given beside its spec, as Flyte's task metadata has
/// them) written into it, where the executor reads them: they take the place of any `retries`
/// in the spec; a task without a spec gets one that holds only them. The number is checked as
/// [`retries`] checks it.
pub fn with_retries(
    spec: Option<serde_json::Value>,
    task_retries: Option<u64>,
) -> Result<Option<serde_json::Value>, String> {
    let Some(n) = task_retries else { return Ok(spec) };
    let number = serde_json::Value::from(n);
    retries(&serde_json::json!({ "retries": number }))?;
    let mut fields = match spec {
        Some(serde_json::Value::Object(fields)) => fields,
        None | Some(serde_json::Value::Null) => serde_json::Map::new(),
        Some(other) => return Err(format!("retries are given beside a spec that is not an object: {other}")),
    };
    fields.insert("retries".to_owned(), number);
    Ok(Some(serde_json::Value::Object(fields)))
}

/// Reads a spec's `retries`: `None` when absent; an error when it is not a whole number from 0
/// to [`MAX_RETRIES`] (`2.0` is one, as JSON Schema's integers). The API and application files
/// check it when a task is added.
pub fn retries(spec: &serde_json::Value) -> Result<Option<u32>, String> {
    let Some(value) = spec.get("retries") else { return Ok(None) };
    let whole = value.as_u64().or_else(|| {
        value.as_f64().filter(|n| n.fract() == 0.0 && (0.0..=f64::from(MAX_RETRIES)).contains(n)).map(|n| n as u64)
    });
    match whole {
        Some(n) if n <= u64::from(MAX_RETRIES) => Ok(Some(n as u32)),
        _ => Err(format!("retries must be a whole number from 0 to {MAX_RETRIES}, got {value}")),
    }
}
