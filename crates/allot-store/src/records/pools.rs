//! The pools' records: pools, their labels, and allocs (live, and ended ones still retained).

use std::collections::BTreeMap;
use std::sync::Arc;

use allot_core::pools::{Alloc, AllocId, EndReason, EndedAlloc, PoolName};
use allot_core::{Millis, ResourceName, Resources};
use redb::TableDefinition;
use serde::{Deserialize, Serialize};

use super::*;

pub const POOLS: TableDefinition<&str, &[u8]> = TableDefinition::new("pools");

pub const ALLOCS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("allocs");

pub const POOL_LABELS: TableDefinition<&str, &[u8]> = TableDefinition::new("pool_labels");

/// A resource vector: (name, milli-units) pairs.
pub type ResourcesRecord = Vec<(String, u64)>;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolRecord {
    pub capacity: ResourcesRecord,
    pub stopped: bool,
    /// Grown fields (read with [`POOL_FIELDS_ADDED`]): what things allot does not manage hold,
    /// and a cordon (since, drain at).
    pub occupied: Option<ResourcesRecord>,
    pub cordon: Option<(Millis, Option<Millis>)>,
}

/// How many fields [`PoolRecord`] gained at its end since its format began.
pub const POOL_FIELDS_ADDED: usize = 2;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocRecord {
    pub resources: ResourcesRecord,
    pub owner: String,
    /// Shared with the alloc it is made from (postcard writes it as the map itself).
    pub labels: Arc<BTreeMap<String, String>>,
    pub created: Millis,
    pub last_keepalive: Option<Millis>,
    pub expires: Millis,
    /// When and why it ended (0 freed, 1 reclaimed, 2 pool stopped, 3 pool removed).
    pub ended: Option<(Millis, u8)>,
    /// Grown field (read with [`decode_alloc`]): its owner's metadata (JSON text).
    pub metadata: Option<String>,
}

/// How many fields [`AllocRecord`] gained at its end since its format began.
pub const ALLOC_FIELDS_ADDED: usize = 1;

/// Decodes an alloc record, one written before the fields it gained too.
pub fn decode_alloc(key: impl std::fmt::Display + Copy, bytes: &[u8]) -> Result<AllocRecord, CorruptRecord> {
    super::decode_grown("allocs", key, bytes, ALLOC_FIELDS_ADDED)
}

/// An alloc as the change feed's events written before allocs had metadata hold it (inside an
/// event, a record cannot grow at its end): read, never written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocRecordV0 {
    pub resources: ResourcesRecord,
    pub owner: String,
    pub labels: BTreeMap<String, String>,
    pub created: Millis,
    pub last_keepalive: Option<Millis>,
    pub expires: Millis,
    pub ended: Option<(Millis, u8)>,
}

impl From<AllocRecordV0> for AllocRecord {
    fn from(v0: AllocRecordV0) -> AllocRecord {
        AllocRecord {
            resources: v0.resources,
            owner: v0.owner,
            labels: Arc::new(v0.labels),
            created: v0.created,
            last_keepalive: v0.last_keepalive,
            expires: v0.expires,
            ended: v0.ended,
            metadata: None,
        }
    }
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
            metadata: alloc.metadata.clone(),
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
            metadata: self.metadata,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An alloc's labels are shared with the alloc (`Arc`), and written as the map itself: the
    /// bytes are those the format always had (a record of the format before metadata, then no
    /// metadata), and they read back.
    #[test]
    fn an_alloc_records_shared_labels_are_written_as_the_map() {
        let labels: BTreeMap<String, String> =
            [("allot/app".into(), "a".into()), ("allot/task".into(), "t".into())].into();
        let v0 = AllocRecordV0 {
            resources: vec![("cpu".into(), 2000)],
            owner: "me".into(),
            labels: labels.clone(),
            created: 5,
            last_keepalive: Some(7),
            expires: 9,
            ended: None,
        };
        let record = AllocRecord::from(v0.clone());
        let mut before = encode(&v0);
        before.push(0);
        assert_eq!(encode(&record), before);
        let read = decode_alloc("pool/1", &before).unwrap();
        assert_eq!(*read.labels, labels);
        assert_eq!(read, record);
    }
}
