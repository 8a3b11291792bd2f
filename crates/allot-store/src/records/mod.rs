//! The embedded backend's on-disk format (see docs/design.md).
//!
//! Tables of one redb file:
//! - `namespaces`: namespace -> [`NamespaceRecord`]
//! - `retired_fencing`: namespace -> next fencing number of a removed namespace
//! - `grants`: (namespace, token) -> [`GrantRecord`]
//! - `sessions`: session id -> [`SessionRecord`]
//! - `pools`: pool -> [`PoolRecord`]
//! - `allocs`: (pool, alloc id) -> [`AllocRecord`] (live allocs and ended ones still retained)
//! - `pool_labels`: pool -> labels (a table of its own, so pool records keep their format)
//! - `queues`, `apps`, `tasks`: the applications part, see [`apps`]
//! - `runs`, `catalog`: the runs of tasks and the outputs kept for reuse, see [`runs`]
//! - `meta`: `format` -> [`FORMAT_VERSION`], `clock` -> the daemon clock at the last commit,
//!   `seq` -> the number of the last commit
//!
//! Values are postcard-encoded. The format version is checked at open: a file written by a newer
//! format is refused rather than misread.

pub mod apps;
pub mod runs;

use std::collections::BTreeMap;

use allot_core::pools::{Alloc, AllocId, EndReason, EndedAlloc, PoolName};
use allot_core::{Grant, Lease, Millis, NamespaceName, ResourceName, Resources, Scope, SessionId, Token};
use redb::TableDefinition;
use serde::{Deserialize, Serialize};

pub const FORMAT_VERSION: u64 = 1;

pub const NAMESPACES: TableDefinition<&str, &[u8]> = TableDefinition::new("namespaces");
pub const RETIRED_FENCING: TableDefinition<&str, u64> = TableDefinition::new("retired_fencing");
pub const GRANTS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("grants");
pub const SESSIONS: TableDefinition<u128, &[u8]> = TableDefinition::new("sessions");
pub const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
pub const POOLS: TableDefinition<&str, &[u8]> = TableDefinition::new("pools");
pub const ALLOCS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("allocs");
pub const POOL_LABELS: TableDefinition<&str, &[u8]> = TableDefinition::new("pool_labels");

pub const META_FORMAT: &str = "format";
pub const META_CLOCK: &str = "clock";
pub const META_SEQ: &str = "seq";
/// The wall clock (Unix ms) less the daemon clock, as the daemon that last opened the store had
/// them: with the daemon clock of the last record, when that daemon stopped.
pub const META_WALL_OFFSET: &str = "wall_offset";

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
}

/// A record that does not decode, or decodes to something the core refuses.
#[derive(Debug, thiserror::Error)]
#[error("corrupt record in table `{table}` at key `{key}`: {reason}")]
pub struct CorruptRecord {
    pub table: &'static str,
    pub key: String,
    pub reason: String,
}

pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    postcard::to_allocvec(value).expect("records always encode")
}

pub fn decode<'a, T: Deserialize<'a>>(table: &'static str, key: &str, bytes: &'a [u8]) -> Result<T, CorruptRecord> {
    postcard::from_bytes(bytes).map_err(|err| CorruptRecord { table, key: key.to_owned(), reason: err.to_string() })
}

/// Decodes a record whose type gained `added` optional fields at its end since the format
/// began: one written before ends where they start, and reads as if they were absent (an
/// `Option`'s `None` is one zero byte in postcard).
pub fn decode_grown<T: serde::de::DeserializeOwned>(
    table: &'static str,
    key: &str,
    bytes: &[u8],
    added: usize,
) -> Result<T, CorruptRecord> {
    decode::<T>(table, key, bytes).or_else(|err| {
        (1..=added)
            .find_map(|missing| {
                let mut older = bytes.to_vec();
                older.resize(bytes.len() + missing, 0);
                decode::<T>(table, key, &older).ok()
            })
            .ok_or(err)
    })
}

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
        let corrupt = |reason: String| CorruptRecord { table: "grants", key: format!("{namespace}/{token}"), reason };
        let scope = match self.scope {
            None => None,
            Some((project, domain)) => Some(Scope::new(&project, &domain).map_err(|e| corrupt(e.to_string()))?),
        };
        Ok(Grant {
            namespace: NamespaceName::new(namespace).map_err(|e| corrupt(e.to_string()))?,
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
        })
    }
}

/// A resource vector: (name, milli-units) pairs.
pub type ResourcesRecord = Vec<(String, u64)>;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolRecord {
    pub capacity: ResourcesRecord,
    pub stopped: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocRecord {
    pub resources: ResourcesRecord,
    pub owner: String,
    pub labels: BTreeMap<String, String>,
    pub created: Millis,
    pub last_keepalive: Option<Millis>,
    pub expires: Millis,
    /// When and why it ended (0 freed, 1 reclaimed, 2 pool stopped, 3 pool removed).
    pub ended: Option<(Millis, u8)>,
}

pub fn resources_record(resources: &Resources) -> ResourcesRecord {
    resources.iter().map(|(name, milli)| (name.as_str().to_owned(), milli)).collect()
}

pub fn resources_from(record: ResourcesRecord, table: &'static str, key: &str) -> Result<Resources, CorruptRecord> {
    let mut resources = Resources::new();
    for (name, milli) in record {
        let name = ResourceName::new(&name).map_err(|e| CorruptRecord {
            table,
            key: key.to_owned(),
            reason: e.to_string(),
        })?;
        resources.set_milli(name, milli);
    }
    Ok(resources)
}

fn reason_code(reason: EndReason) -> u8 {
    match reason {
        EndReason::Freed => 0,
        EndReason::Reclaimed => 1,
        EndReason::PoolStopped => 2,
        EndReason::PoolRemoved => 3,
    }
}

impl AllocRecord {
    pub fn live(alloc: &Alloc) -> AllocRecord {
        AllocRecord {
            resources: resources_record(&alloc.resources),
            owner: alloc.owner.clone(),
            labels: alloc.labels.clone(),
            created: alloc.created,
            last_keepalive: alloc.last_keepalive,
            expires: alloc.expires,
            ended: None,
        }
    }

    pub fn ended(ended: &EndedAlloc) -> AllocRecord {
        AllocRecord { ended: Some((ended.ended_at, reason_code(ended.reason))), ..AllocRecord::live(&ended.alloc) }
    }

    /// The alloc, and when and why it ended if it did.
    pub fn into_alloc(self, pool: &str, id: u64) -> Result<(Alloc, Option<(Millis, EndReason)>), CorruptRecord> {
        let key = format!("{pool}/{}", AllocId(id));
        let corrupt = |reason: String| CorruptRecord { table: "allocs", key: key.clone(), reason };
        let alloc = Alloc {
            pool: PoolName::new(pool).map_err(|e| corrupt(e.to_string()))?,
            id: AllocId(id),
            resources: resources_from(self.resources, "allocs", &key)?,
            owner: self.owner,
            labels: self.labels,
            created: self.created,
            last_keepalive: self.last_keepalive,
            expires: self.expires,
        };
        let ended = match self.ended {
            None => None,
            Some((at, code)) => Some((
                at,
                match code {
                    0 => EndReason::Freed,
                    1 => EndReason::Reclaimed,
                    2 => EndReason::PoolStopped,
                    3 => EndReason::PoolRemoved,
                    other => return Err(corrupt(format!("unknown end reason {other}"))),
                },
            )),
        };
        Ok((alloc, ended))
    }
}
