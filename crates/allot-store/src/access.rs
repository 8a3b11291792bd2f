//! The access part of a backend: the API tokens made through the API (kept as hashes, never the
//! token) and the bindings of roles to users and groups made through it, shared by every daemon
//! of a store. Each daemon reads them again whenever their version moves.

use allot_core::access::AccessError;
use allot_core::Millis;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::StoreError;

/// An API token as the store keeps it: its hash (`sha256:HEX`), never the token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiTokenRecord {
    /// Unique among the store's tokens; what lists, revocation and the audit trail name.
    pub name: String,
    pub hash: String,
    pub user: String,
    pub groups: Vec<String>,
    /// When it was made (Unix ms, the wall clock).
    pub created: Millis,
    /// When it stops being accepted (ms), if ever.
    pub expires: Option<Millis>,
}

/// A role given to users and groups through the API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindingRecord {
    /// Unique among the store's bindings.
    pub name: String,
    pub role: String,
    pub users: Vec<String>,
    pub groups: Vec<String>,
}

/// Everything of the access part, and its version.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessRecords {
    /// Moves with every change: a daemon that read this version has read everything.
    pub version: u64,
    pub tokens: Vec<ApiTokenRecord>,
    pub bindings: Vec<BindingRecord>,
}

#[async_trait]
pub trait AccessStore: Send + Sync {
    /// Adds a token; a name in use is refused (`AccessError::TokenExists`), as is a hash in use.
    async fn add_api_token(&self, token: ApiTokenRecord) -> Result<(), StoreError>;
    /// Removes a token (its revocation), answering it.
    async fn revoke_api_token(&self, name: &str) -> Result<ApiTokenRecord, StoreError>;
    /// Creates or replaces a binding.
    async fn put_binding(&self, binding: BindingRecord) -> Result<(), StoreError>;
    /// Removes a binding, answering it.
    async fn remove_binding(&self, name: &str) -> Result<BindingRecord, StoreError>;
    /// Every token and binding, with their version.
    async fn access_records(&self) -> Result<AccessRecords, StoreError>;
    /// The version alone (cheap: daemons ask it often).
    async fn access_version(&self) -> Result<u64, StoreError>;
}

impl From<AccessError> for StoreError {
    fn from(err: AccessError) -> StoreError {
        StoreError::Access(err)
    }
}
