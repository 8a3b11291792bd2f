//! The token quotas' records: namespaces, the fencing numbers of removed ones, grants, sessions.

use allot_core::{Grant, Lease, Millis, NamespaceName, Scope, SessionId, Token};
use redb::TableDefinition;
use serde::{Deserialize, Serialize};

use super::*;

pub const NAMESPACES: TableDefinition<&str, &[u8]> = TableDefinition::new("namespaces");

pub const RETIRED_FENCING: TableDefinition<&str, u64> = TableDefinition::new("retired_fencing");

pub const GRANTS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("grants");

pub const SESSIONS: TableDefinition<u128, &[u8]> = TableDefinition::new("sessions");

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceRecord {
    pub quota: u64,
    pub next_fencing: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaseRecord {
    None,
    Ttl { ttl_ms: u64, deadline: Millis },
    Session(u128),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantRecord {
    pub units: u64,
    /// (project, namespace scope)
    pub scope: Option<(String, String)>,
    pub fencing: u64,
    pub lease: LeaseRecord,
    pub granted_at: Millis,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    pub ttl_ms: u64,
    pub deadline: Millis,
    /// Added with access per session: read as `None` from a record written before
    /// ([`SESSION_FIELDS_ADDED`]).
    pub owner: Option<String>,
}

/// The optional fields [`SessionRecord`] gained at its end.
pub const SESSION_FIELDS_ADDED: usize = 1;

impl GrantRecord {
    pub fn from_grant(grant: &Grant) -> GrantRecord {
        GrantRecord {
            units: grant.units,
            scope: grant.scope.as_ref().map(|s| (s.project.to_string(), s.namespace.to_string())),
            fencing: grant.fencing,
            lease: match grant.lease {
                Lease::None => LeaseRecord::None,
                Lease::Ttl { ttl_ms, deadline } => LeaseRecord::Ttl { ttl_ms, deadline },
                Lease::Session(id) => LeaseRecord::Session(id.0),
            },
            granted_at: grant.granted_at,
        }
    }

    pub fn into_grant(self, namespace: &str, token: &str) -> Result<Grant, CorruptRecord> {
        self.into_grant_of(GrantRecord::namespace_of(namespace, token)?, token)
    }

    /// The namespace name of the grant record keyed `namespace`/`token`.
    pub fn namespace_of(namespace: &str, token: &str) -> Result<NamespaceName, CorruptRecord> {
        NamespaceName::new(namespace).map_err(|e| CorruptRecord {
            table: "grants",
            key: format!("{namespace}/{token}"),
            reason: e.to_string(),
        })
    }

    /// [`GrantRecord::into_grant`] with the namespace's name made already (one name shared by
    /// every grant of a namespace read in a row).
    pub fn into_grant_of(self, namespace: NamespaceName, token: &str) -> Result<Grant, CorruptRecord> {
        let corrupt = |reason: String| CorruptRecord { table: "grants", key: format!("{namespace}/{token}"), reason };
        let scope = match self.scope {
            None => None,
            Some((project, domain)) => Some(Scope::new(&project, &domain).map_err(|e| corrupt(e.to_string()))?),
        };
        Ok(Grant {
            token: Token::new(token).map_err(|e| corrupt(e.to_string()))?,
            units: self.units,
            scope,
            fencing: self.fencing,
            lease: match self.lease {
                LeaseRecord::None => Lease::None,
                LeaseRecord::Ttl { ttl_ms, deadline } => Lease::Ttl { ttl_ms, deadline },
                LeaseRecord::Session(id) => Lease::Session(SessionId(id)),
            },
            granted_at: self.granted_at,
            namespace,
        })
    }
}
