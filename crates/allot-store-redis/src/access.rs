//! The access part on Redis: API tokens and bindings in two hashes of the `{allot-access}` slot,
//! each change one call of `lua/access.lua` that also moves the version every daemon watches.

use allot_core::access::AccessError;
use allot_store::{AccessRecords, AccessStore, ApiTokenRecord, BindingRecord, StoreError};
use async_trait::async_trait;
use redis::Value;

use crate::errors::redis_error;
use crate::reply::{corrupt, Reply};
use crate::store::RedisStore;

const PREFIX: &str = "allot:{allot-access}";
const TOKENS: &str = "allot:{allot-access}:tokens";
const BINDINGS: &str = "allot:{allot-access}:bindings";
const VERSION: &str = "allot:{allot-access}:version";

impl RedisStore {
    /// Calls `lua/access.lua` (a change: it waits for the replicas, `--redis-min-replicas`).
    async fn access_call(&self, args: &[&str]) -> Result<Reply, StoreError> {
        self.live()?;
        self.inner.eval(&self.inner.scripts.access, PREFIX, args, true).await
    }

    /// The records of a hash, decoded.
    async fn access_hash<T: serde::de::DeserializeOwned>(&self, key: &str) -> Result<Vec<T>, StoreError> {
        let cmd = redis::cmd("HVALS").arg(key).clone();
        let Value::Array(values) = self.inner.conn.query(&cmd).await.map_err(|e| redis_error(e, false))? else {
            return Err(corrupt(format!("{key}: not a list")));
        };
        values
            .into_iter()
            .map(|value| match value {
                Value::BulkString(json) => serde_json::from_slice(&json).map_err(|e| corrupt(format!("{key}: {e}"))),
                other => Err(corrupt(format!("{key}: {other:?}"))),
            })
            .collect()
    }
}

fn decode<T: serde::de::DeserializeOwned>(what: &str, reply: &mut Reply) -> Result<T, StoreError> {
    let json = reply.text()?;
    serde_json::from_str(&json).map_err(|e| corrupt(format!("{what}: {e}")))
}

#[async_trait]
impl AccessStore for RedisStore {
    async fn add_api_token(&self, token: ApiTokenRecord) -> Result<(), StoreError> {
        let json = serde_json::to_string(&token).expect("records encode");
        let mut reply = self.access_call(&["add_token", &token.name, &json]).await?;
        match reply.uint()? {
            1 => Ok(()),
            _ => Err(AccessError::TokenExists(token.name).into()),
        }
    }

    async fn revoke_api_token(&self, name: &str) -> Result<ApiTokenRecord, StoreError> {
        let mut reply = self.access_call(&["revoke_token", name]).await?;
        match reply.uint()? {
            1 => decode("an API token", &mut reply),
            _ => Err(AccessError::TokenNotFound(name.to_owned()).into()),
        }
    }

    async fn put_binding(&self, binding: BindingRecord) -> Result<(), StoreError> {
        let json = serde_json::to_string(&binding).expect("records encode");
        self.access_call(&["put_binding", &binding.name, &json]).await?;
        Ok(())
    }

    async fn remove_binding(&self, name: &str) -> Result<BindingRecord, StoreError> {
        let mut reply = self.access_call(&["remove_binding", name]).await?;
        match reply.uint()? {
            1 => decode("a binding", &mut reply),
            _ => Err(AccessError::BindingNotFound(name.to_owned()).into()),
        }
    }

    async fn access_records(&self) -> Result<AccessRecords, StoreError> {
        // The version first: a change made while the records are read moves it again, and the
        // daemon reads everything once more.
        let version = self.access_version().await?;
        let mut tokens: Vec<ApiTokenRecord> = self.access_hash(TOKENS).await?;
        let mut bindings: Vec<BindingRecord> = self.access_hash(BINDINGS).await?;
        tokens.sort_by(|a, b| a.name.cmp(&b.name));
        bindings.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(AccessRecords { version, tokens, bindings })
    }

    async fn access_version(&self) -> Result<u64, StoreError> {
        let cmd = redis::cmd("GET").arg(VERSION).clone();
        match self.inner.conn.query(&cmd).await.map_err(|e| redis_error(e, false))? {
            Value::Nil => Ok(0),
            Value::BulkString(text) => {
                String::from_utf8_lossy(&text).parse().map_err(|e| corrupt(format!("{VERSION}: {e}")))
            }
            Value::Int(n) => Ok(u64::try_from(n).unwrap_or(0)),
            other => Err(corrupt(format!("{VERSION}: {other:?}"))),
        }
    }
}
