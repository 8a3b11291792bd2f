//! Identity and access: the API tokens and the bindings of roles made through the API. Times are
//! milliseconds since the Unix epoch.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::integer;

/// `POST /v1/api-tokens`: make a token for a user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateApiToken {
    /// 1 to 100 of A-Z, a-z, 0-9, `.`, `_`, `-`: what lists, revocation and the audit trail name.
    pub name: String,
    pub user: String,
    #[serde(default)]
    pub groups: Vec<String>,
    /// How long it is accepted (at least 1 s); none: until revoked.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "integer::optional")]
    pub ttl_ms: Option<u64>,
}

/// An API token, as lists show it: never the token, nor its hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApiToken {
    pub name: String,
    pub user: String,
    pub groups: Vec<String>,
    pub created_ms: u64,
    pub expires_ms: Option<u64>,
}

/// The answer to `POST /v1/api-tokens`: the token, shown this once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CreatedApiToken {
    /// Give it to its user now: the daemon keeps only its hash.
    pub token: String,
    pub api_token: ApiToken,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApiTokenList {
    /// Those made through the API (the configuration file's are not listed).
    pub api_tokens: Vec<ApiToken>,
}

/// `PUT /v1/bindings/{name}`: give a role to users and groups.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutBinding {
    /// A role of the configuration file, or `admin` or `reader`.
    pub role: String,
    #[serde(default)]
    pub users: Vec<String>,
    #[serde(default)]
    pub groups: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Binding {
    pub name: String,
    pub role: String,
    pub users: Vec<String>,
    pub groups: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BindingList {
    /// Those made through the API (the configuration file's are not listed).
    pub bindings: Vec<Binding>,
}

/// `GET /v1/whoami`: who the caller is, and which of the checks it asked for (`can=PERMISSION:
/// RESOURCE`, e.g. `use:namespace:hive:a`, `admin:pool:gpu-1`, `use:queue:root.a`, `read:daemon`)
/// it may do. Without access configured every caller may do everything.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WhoAmI {
    /// The authenticated user; none without access configured.
    pub user: Option<String>,
    pub groups: Vec<String>,
    /// Whether the daemon checks who calls.
    pub access: bool,
    /// Each check asked, and whether the caller may.
    pub can: std::collections::BTreeMap<String, bool>,
}
