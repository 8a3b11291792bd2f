//! The writes of the embedded store as plain data: every change of every part becomes a list of
//! [`Op`]s on the redb tables. The write-ahead log carries them, and [`apply`] is the one place
//! that writes them into the database (at a checkpoint, and when the log is replayed at open).
//!
//! Applying the same ops twice leaves the same tables: replaying a log whose records were already
//! checkpointed is harmless.

use redb::{ReadableTable, WriteTransaction};
use serde::{Deserialize, Serialize};

use crate::records::apps::{APPS, QUEUES, TASKS};
use crate::records::runs::{CATALOG, RUNS};
use crate::records::{ALLOCS, GRANTS, NAMESPACES, POOLS, POOL_LABELS, RETIRED_FENCING, SESSIONS};

/// A table of the database (see [`crate::records`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Table {
    Namespaces,
    RetiredFencing,
    Grants,
    Sessions,
    Pools,
    Allocs,
    PoolLabels,
    Queues,
    Apps,
    Tasks,
    Runs,
    Catalog,
}

/// A key of one of the tables, by its shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Key {
    /// `namespaces`, `retired_fencing`, `pools`, `pool_labels`, `queues`, `apps`, `catalog`.
    Name(String),
    /// `grants` (namespace, token), `tasks` and `runs` (application, task).
    Pair(String, String),
    /// `sessions`.
    Id(u128),
    /// `allocs` (pool, alloc id).
    Numbered(String, u64),
}

/// One write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Op {
    /// Inserts or replaces a record. `retired_fencing` values are a u64, little-endian.
    Put(Table, Key, Vec<u8>),
    Remove(Table, Key),
    /// Removes every record whose key starts with `first`: a removed namespace's grants, a
    /// removed pool's allocs, a removed application's tasks.
    RemoveUnder(Table, String),
}

impl Op {
    pub(crate) fn put(table: Table, key: Key, value: Vec<u8>) -> Op {
        Op::Put(table, key, value)
    }

    pub(crate) fn name(name: &str) -> Key {
        Key::Name(name.to_owned())
    }

    pub(crate) fn pair(first: &str, second: &str) -> Key {
        Key::Pair(first.to_owned(), second.to_owned())
    }
}

/// Why ops could not be applied.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ApplyError {
    #[error("{0}")]
    Db(String),
    #[error("a logged write does not fit its table: {0}")]
    Shape(String),
}

fn db(err: impl Into<redb::Error>) -> ApplyError {
    ApplyError::Db(err.into().to_string())
}

/// Writes `ops`, in order, in `txn`.
pub(crate) fn apply<'a>(txn: &WriteTransaction, ops: impl IntoIterator<Item = &'a Op>) -> Result<(), ApplyError> {
    let mut namespaces = txn.open_table(NAMESPACES).map_err(db)?;
    let mut retired = txn.open_table(RETIRED_FENCING).map_err(db)?;
    let mut grants = txn.open_table(GRANTS).map_err(db)?;
    let mut sessions = txn.open_table(SESSIONS).map_err(db)?;
    let mut pools = txn.open_table(POOLS).map_err(db)?;
    let mut allocs = txn.open_table(ALLOCS).map_err(db)?;
    let mut pool_labels = txn.open_table(POOL_LABELS).map_err(db)?;
    let mut queues = txn.open_table(QUEUES).map_err(db)?;
    let mut apps = txn.open_table(APPS).map_err(db)?;
    let mut tasks = txn.open_table(TASKS).map_err(db)?;
    let mut runs = txn.open_table(RUNS).map_err(db)?;
    let mut catalog = txn.open_table(CATALOG).map_err(db)?;
    let shape = |op: &Op| ApplyError::Shape(format!("{op:?}"));
    for op in ops {
        match op {
            Op::Put(table, key, value) => {
                let value = value.as_slice();
                match (table, key) {
                    (Table::Namespaces, Key::Name(k)) => namespaces.insert(k.as_str(), value).map(drop),
                    (Table::RetiredFencing, Key::Name(k)) => {
                        let bytes: [u8; 8] = value.try_into().map_err(|_| shape(op))?;
                        retired.insert(k.as_str(), u64::from_le_bytes(bytes)).map(drop)
                    }
                    (Table::Grants, Key::Pair(a, b)) => grants.insert((a.as_str(), b.as_str()), value).map(drop),
                    (Table::Sessions, Key::Id(id)) => sessions.insert(*id, value).map(drop),
                    (Table::Pools, Key::Name(k)) => pools.insert(k.as_str(), value).map(drop),
                    (Table::Allocs, Key::Numbered(p, id)) => allocs.insert((p.as_str(), *id), value).map(drop),
                    (Table::PoolLabels, Key::Name(k)) => pool_labels.insert(k.as_str(), value).map(drop),
                    (Table::Queues, Key::Name(k)) => queues.insert(k.as_str(), value).map(drop),
                    (Table::Apps, Key::Name(k)) => apps.insert(k.as_str(), value).map(drop),
                    (Table::Tasks, Key::Pair(a, b)) => tasks.insert((a.as_str(), b.as_str()), value).map(drop),
                    (Table::Runs, Key::Pair(a, b)) => runs.insert((a.as_str(), b.as_str()), value).map(drop),
                    (Table::Catalog, Key::Name(k)) => catalog.insert(k.as_str(), value).map(drop),
                    _ => return Err(shape(op)),
                }
                .map_err(db)?;
            }
            Op::Remove(table, key) => match (table, key) {
                (Table::Namespaces, Key::Name(k)) => namespaces.remove(k.as_str()).map(drop),
                (Table::RetiredFencing, Key::Name(k)) => retired.remove(k.as_str()).map(drop),
                (Table::Grants, Key::Pair(a, b)) => grants.remove((a.as_str(), b.as_str())).map(drop),
                (Table::Sessions, Key::Id(id)) => sessions.remove(*id).map(drop),
                (Table::Pools, Key::Name(k)) => pools.remove(k.as_str()).map(drop),
                (Table::Allocs, Key::Numbered(p, id)) => allocs.remove((p.as_str(), *id)).map(drop),
                (Table::PoolLabels, Key::Name(k)) => pool_labels.remove(k.as_str()).map(drop),
                (Table::Queues, Key::Name(k)) => queues.remove(k.as_str()).map(drop),
                (Table::Apps, Key::Name(k)) => apps.remove(k.as_str()).map(drop),
                (Table::Tasks, Key::Pair(a, b)) => tasks.remove((a.as_str(), b.as_str())).map(drop),
                (Table::Runs, Key::Pair(a, b)) => runs.remove((a.as_str(), b.as_str())).map(drop),
                (Table::Catalog, Key::Name(k)) => catalog.remove(k.as_str()).map(drop),
                _ => return Err(shape(op)),
            }
            .map_err(db)?,
            Op::RemoveUnder(table, first) => {
                let first = first.as_str();
                match table {
                    // Tokens and task ids may be any text, so there is no fixed upper bound:
                    // every key of `first` sorts at or after (first, ""), before any other's.
                    Table::Grants => remove_pairs_under(&mut grants, first).map_err(db)?,
                    Table::Tasks => remove_pairs_under(&mut tasks, first).map_err(db)?,
                    Table::Allocs => {
                        allocs.retain_in((first, 0)..=(first, u64::MAX), |_, _| false).map_err(db)?;
                    }
                    _ => return Err(shape(op)),
                }
            }
        }
    }
    Ok(())
}

fn remove_pairs_under(
    table: &mut redb::Table<'_, (&'static str, &'static str), &'static [u8]>,
    first: &str,
) -> Result<(), redb::StorageError> {
    let mut doomed = Vec::new();
    for entry in table.range((first, "")..)? {
        let (key, _) = entry?;
        let (a, b) = key.value();
        if a != first {
            break;
        }
        doomed.push(b.to_owned());
    }
    for second in &doomed {
        table.remove((first, second.as_str()))?;
    }
    Ok(())
}
