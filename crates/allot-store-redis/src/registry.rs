//! The registries of namespaces and of pools (`lua/registry.lua`, in the `{allot-registry}` slot):
//! a name is listed before its namespace or pool is created and unlisted after it is removed, so
//! nothing exists in Redis without being listed. The sweepers walk these lists; the list calls
//! read them page by page, in name order.

use allot_core::pools::PoolName;
use allot_core::NamespaceName;
use allot_store::StoreError;
use redis::Value;

use crate::errors::redis_error;
use crate::reply::{corrupt, Reply};
use crate::store::Inner;

/// The slot of the registries of namespaces and pools.
const REGISTRY_SLOT: &str = "allot:{allot-registry}";
const NAMESPACES: &str = "allot:{allot-registry}:namespaces";
const POOLS: &str = "allot:{allot-registry}:pools";
const RETIRED: &str = "allot:{allot-registry}:retired";

/// Every namespace listed (the sweepers' list).
pub(crate) async fn namespaces(inner: &Inner) -> Result<Vec<NamespaceName>, StoreError> {
    let names = registry_members(inner, NAMESPACES).await?;
    Ok(names.iter().filter_map(|name| NamespaceName::new(name).ok()).collect())
}

/// Every pool listed (the sweepers' list).
pub(crate) async fn pools(inner: &Inner) -> Result<Vec<PoolName>, StoreError> {
    let names = registry_members(inner, POOLS).await?;
    Ok(names.iter().filter_map(|name| PoolName::new(name).ok()).collect())
}

/// The namespaces removed (and perhaps made again) since this list began: their fencing
/// counters outlive them (`lua/remove_namespace.lua`).
pub(crate) async fn retired(inner: &Inner) -> Result<Vec<String>, StoreError> {
    registry_members(inner, RETIRED).await
}

/// Adds a name to a registry (`kind`: `namespaces`, `pools` or `retired`), or removes it (`op`).
pub(crate) async fn register(inner: &Inner, op: &str, kind: &str, name: &str) -> Result<(), StoreError> {
    inner.eval(&inner.scripts.registry, REGISTRY_SLOT, &[op, kind, name], true).await?;
    Ok(())
}

/// Up to `limit + 1` names of a registry after `after`, in name order: a page and whether more
/// follow (see [`allot_store::Page::from_read`]).
pub(crate) async fn registry_page(
    inner: &Inner,
    kind: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<String>, StoreError> {
    let count = (limit + 1).to_string();
    let args = ["page", kind, after.unwrap_or(""), &count];
    inner.eval(&inner.scripts.registry, REGISTRY_SLOT, &args, false).await?.rest_texts()
}

/// The names listed in a registry set (namespaces or pools).
async fn registry_members(inner: &Inner, key: &str) -> Result<Vec<String>, StoreError> {
    let value = inner.conn.query(redis::cmd("SMEMBERS").arg(key)).await.map_err(|e| redis_error(e, false))?;
    match value {
        Value::Set(items) | Value::Array(items) => Reply::new(Value::Array(items))?.rest_texts(),
        other => Err(corrupt(format!("registry {key}: reply {other:?}"))),
    }
}
