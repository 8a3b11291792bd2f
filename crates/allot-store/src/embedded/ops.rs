//! The writes of the embedded store as plain data: every change of every part becomes a list of
//! [`Op`]s on the redb tables. The write-ahead log carries them, and [`apply`] is the one place
//! that writes them into the database (at a checkpoint, and when the log is replayed at open).
//!
//! Applying the same ops twice leaves the same tables: replaying a log whose records were already
//! checkpointed is harmless.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use redb::{ReadableTable, WriteTransaction};
use serde::{Deserialize, Serialize};

use crate::records::access::ACCESS;
use crate::records::apps::{APPS, QUEUES, TASKS};
use crate::records::runs::{CATALOG, RUNS};
use crate::records::{ALLOCS, GRANTS, NAMESPACES, POOLS, POOL_LABELS, RETIRED_FENCING, SESSIONS};

/// A table of the database (see [`crate::records`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
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
    /// (Last: the logged variants keep their numbers.)
    Access,
}

/// A key of one of the tables, by its shape.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) enum Key {
    /// `namespaces`, `retired_fencing`, `pools`, `pool_labels`, `queues`, `apps`, `catalog`,
    /// `access`.
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
    /// Inserts a record whose key holds none (a new grant): as [`Op::Put`] in the database, but
    /// a removal of it within the same checkpoint cancels both. (Last in the enum: the logged
    /// variants keep their numbers.)
    Create(Table, Key, Vec<u8>),
}

impl Op {
    pub(crate) fn put(table: Table, key: Key, value: Vec<u8>) -> Op {
        Op::Put(table, key, value)
    }

    /// The record it writes, if it writes one.
    pub(crate) fn value(&self) -> Option<&[u8]> {
        match self {
            Op::Put(_, _, value) | Op::Create(_, _, value) => Some(value),
            Op::Remove(..) | Op::RemoveUnder(..) => None,
        }
    }

    /// About what it takes in a log record (to reserve a frame's room): its value, its key's
    /// text, and up to 32 bytes of tags, lengths and numbers (varints).
    pub(crate) fn framed_bytes(&self) -> usize {
        let key = |key: &Key| match key {
            Key::Name(name) => name.len(),
            Key::Pair(first, second) => first.len() + second.len(),
            Key::Id(_) => 0,
            Key::Numbered(first, _) => first.len(),
        };
        32 + match self {
            Op::Put(_, k, value) | Op::Create(_, k, value) => key(k) + value.len(),
            Op::Remove(_, k) => key(k),
            Op::RemoveUnder(_, first) => first.len(),
        }
    }

    pub(crate) fn name(name: &str) -> Key {
        Key::Name(name.to_owned())
    }

    pub(crate) fn pair(first: &str, second: &str) -> Key {
        Key::Pair(first.to_owned(), second.to_owned())
    }
}

/// An [`Op`] read in place from a log segment, its text and bytes borrowed: what a checkpoint
/// reads of every record, most of which net to nothing (a grant created and released within
/// it), so nothing of them is copied. Decodes exactly what [`Op`] encodes: the same variants,
/// in the same order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
pub(crate) enum OpRef<'a> {
    Put(Table, #[serde(borrow)] KeyRef<'a>, &'a [u8]),
    Remove(Table, #[serde(borrow)] KeyRef<'a>),
    RemoveUnder(Table, &'a str),
    Create(Table, #[serde(borrow)] KeyRef<'a>, &'a [u8]),
}

/// A [`Key`] read in place. Ordered as the database orders a table's keys (each table has keys
/// of one shape: their fields in turn, text by its bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
pub(crate) enum KeyRef<'a> {
    Name(&'a str),
    Pair(&'a str, &'a str),
    Id(u128),
    Numbered(&'a str, u64),
}

impl<'a> OpRef<'a> {
    /// `op`, borrowed.
    #[cfg(test)]
    pub(crate) fn of(op: &'a Op) -> OpRef<'a> {
        match op {
            Op::Put(table, key, value) => OpRef::Put(*table, KeyRef::of(key), value),
            Op::Remove(table, key) => OpRef::Remove(*table, KeyRef::of(key)),
            Op::RemoveUnder(table, first) => OpRef::RemoveUnder(*table, first),
            Op::Create(table, key, value) => OpRef::Create(*table, KeyRef::of(key), value),
        }
    }
}

impl OpRef<'_> {
    /// The op, copied.
    pub(crate) fn to_op(self) -> Op {
        match self {
            OpRef::Put(table, key, value) => Op::Put(table, key.to_key(), value.to_vec()),
            OpRef::Remove(table, key) => Op::Remove(table, key.to_key()),
            OpRef::RemoveUnder(table, first) => Op::RemoveUnder(table, first.to_owned()),
            OpRef::Create(table, key, value) => Op::Create(table, key.to_key(), value.to_vec()),
        }
    }
}

impl<'a> KeyRef<'a> {
    #[cfg(test)]
    fn of(key: &'a Key) -> KeyRef<'a> {
        match key {
            Key::Name(name) => KeyRef::Name(name),
            Key::Pair(a, b) => KeyRef::Pair(a, b),
            Key::Id(id) => KeyRef::Id(*id),
            Key::Numbered(a, n) => KeyRef::Numbered(a, *n),
        }
    }

    fn to_key(self) -> Key {
        match self {
            KeyRef::Name(name) => Key::Name(name.to_owned()),
            KeyRef::Pair(a, b) => Op::pair(a, b),
            KeyRef::Id(id) => Key::Id(id),
            KeyRef::Numbered(a, n) => Key::Numbered(a.to_owned(), n),
        }
    }

    /// The first part of a two-part key.
    pub(crate) fn first(&self) -> Option<&'a str> {
        match *self {
            KeyRef::Pair(first, _) | KeyRef::Numbered(first, _) => Some(first),
            KeyRef::Name(_) | KeyRef::Id(_) => None,
        }
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

/// The tables of a write transaction, opened once for all the ops written in it.
pub(crate) struct Tables<'txn> {
    namespaces: redb::Table<'txn, &'static str, &'static [u8]>,
    retired: redb::Table<'txn, &'static str, u64>,
    grants: redb::Table<'txn, (&'static str, &'static str), &'static [u8]>,
    sessions: redb::Table<'txn, u128, &'static [u8]>,
    pools: redb::Table<'txn, &'static str, &'static [u8]>,
    allocs: redb::Table<'txn, (&'static str, u64), &'static [u8]>,
    pool_labels: redb::Table<'txn, &'static str, &'static [u8]>,
    queues: redb::Table<'txn, &'static str, &'static [u8]>,
    apps: redb::Table<'txn, &'static str, &'static [u8]>,
    tasks: redb::Table<'txn, (&'static str, &'static str), &'static [u8]>,
    runs: redb::Table<'txn, (&'static str, &'static str), &'static [u8]>,
    catalog: redb::Table<'txn, &'static str, &'static [u8]>,
    access: redb::Table<'txn, &'static str, &'static [u8]>,
}

impl<'txn> Tables<'txn> {
    pub(crate) fn open(txn: &'txn WriteTransaction) -> Result<Tables<'txn>, ApplyError> {
        Ok(Tables {
            namespaces: txn.open_table(NAMESPACES).map_err(db)?,
            retired: txn.open_table(RETIRED_FENCING).map_err(db)?,
            grants: txn.open_table(GRANTS).map_err(db)?,
            sessions: txn.open_table(SESSIONS).map_err(db)?,
            pools: txn.open_table(POOLS).map_err(db)?,
            allocs: txn.open_table(ALLOCS).map_err(db)?,
            pool_labels: txn.open_table(POOL_LABELS).map_err(db)?,
            queues: txn.open_table(QUEUES).map_err(db)?,
            apps: txn.open_table(APPS).map_err(db)?,
            tasks: txn.open_table(TASKS).map_err(db)?,
            runs: txn.open_table(RUNS).map_err(db)?,
            catalog: txn.open_table(CATALOG).map_err(db)?,
            access: txn.open_table(ACCESS).map_err(db)?,
        })
    }

    /// Writes one op.
    pub(crate) fn apply(&mut self, op: &Op) -> Result<(), ApplyError> {
        let shape = || ApplyError::Shape(format!("{op:?}"));
        match op {
            Op::Put(table, key, value) | Op::Create(table, key, value) => {
                let value = value.as_slice();
                match (table, key) {
                    (Table::Namespaces, Key::Name(k)) => self.namespaces.insert(k.as_str(), value).map(drop),
                    (Table::RetiredFencing, Key::Name(k)) => {
                        let bytes: [u8; 8] = value.try_into().map_err(|_| shape())?;
                        self.retired.insert(k.as_str(), u64::from_le_bytes(bytes)).map(drop)
                    }
                    (Table::Grants, Key::Pair(a, b)) => self.grants.insert((a.as_str(), b.as_str()), value).map(drop),
                    (Table::Sessions, Key::Id(id)) => self.sessions.insert(*id, value).map(drop),
                    (Table::Pools, Key::Name(k)) => self.pools.insert(k.as_str(), value).map(drop),
                    (Table::Allocs, Key::Numbered(p, id)) => self.allocs.insert((p.as_str(), *id), value).map(drop),
                    (Table::PoolLabels, Key::Name(k)) => self.pool_labels.insert(k.as_str(), value).map(drop),
                    (Table::Queues, Key::Name(k)) => self.queues.insert(k.as_str(), value).map(drop),
                    (Table::Apps, Key::Name(k)) => self.apps.insert(k.as_str(), value).map(drop),
                    (Table::Tasks, Key::Pair(a, b)) => self.tasks.insert((a.as_str(), b.as_str()), value).map(drop),
                    (Table::Runs, Key::Pair(a, b)) => self.runs.insert((a.as_str(), b.as_str()), value).map(drop),
                    (Table::Catalog, Key::Name(k)) => self.catalog.insert(k.as_str(), value).map(drop),
                    (Table::Access, Key::Name(k)) => self.access.insert(k.as_str(), value).map(drop),
                    _ => return Err(shape()),
                }
                .map_err(db)
            }
            Op::Remove(table, key) => match (table, key) {
                (Table::Namespaces, Key::Name(k)) => self.namespaces.remove(k.as_str()).map(drop),
                (Table::RetiredFencing, Key::Name(k)) => self.retired.remove(k.as_str()).map(drop),
                (Table::Grants, Key::Pair(a, b)) => self.grants.remove((a.as_str(), b.as_str())).map(drop),
                (Table::Sessions, Key::Id(id)) => self.sessions.remove(*id).map(drop),
                (Table::Pools, Key::Name(k)) => self.pools.remove(k.as_str()).map(drop),
                (Table::Allocs, Key::Numbered(p, id)) => self.allocs.remove((p.as_str(), *id)).map(drop),
                (Table::PoolLabels, Key::Name(k)) => self.pool_labels.remove(k.as_str()).map(drop),
                (Table::Queues, Key::Name(k)) => self.queues.remove(k.as_str()).map(drop),
                (Table::Apps, Key::Name(k)) => self.apps.remove(k.as_str()).map(drop),
                (Table::Tasks, Key::Pair(a, b)) => self.tasks.remove((a.as_str(), b.as_str())).map(drop),
                (Table::Runs, Key::Pair(a, b)) => self.runs.remove((a.as_str(), b.as_str())).map(drop),
                (Table::Catalog, Key::Name(k)) => self.catalog.remove(k.as_str()).map(drop),
                (Table::Access, Key::Name(k)) => self.access.remove(k.as_str()).map(drop),
                _ => return Err(shape()),
            }
            .map_err(db),
            Op::RemoveUnder(table, first) => {
                let first = first.as_str();
                match table {
                    // Tokens and task ids may be any text, so there is no fixed upper bound:
                    // every key of `first` sorts at or after (first, ""), before any other's.
                    Table::Grants => remove_pairs_under(&mut self.grants, first).map_err(db),
                    Table::Tasks => remove_pairs_under(&mut self.tasks, first).map_err(db),
                    Table::Allocs => self.allocs.retain_in((first, 0)..=(first, u64::MAX), |_, _| false).map_err(db),
                    _ => Err(shape()),
                }
            }
        }
    }
}

/// The net effect of a run of ops, for writing fewer: the last write of each record, and the
/// removals by prefix, which [`Net::ops`] puts first (a write of a record under a prefix is kept
/// only if it came after the prefix's last removal). A grant created and released within one
/// checkpoint comes to nothing: its key held no record before the run, and holds none after.
/// It holds the ops borrowed from the segments read, and copies only what it gives back.
#[derive(Debug, Default)]
pub(crate) struct Net<'a> {
    under: Vec<(Table, &'a str)>,
    /// Hashed with foldhash, not SipHash: a checkpoint after 100,000 changes hashed them for a
    /// good part of its CPU (docs/benchmarks.md, "A million leases").
    last: HashMap<(Table, KeyRef<'a>), Last<'a>, foldhash::fast::RandomState>,
}

/// The last write of a record in the run, and whether the run created it.
#[derive(Debug)]
struct Last<'a> {
    value: Option<&'a [u8]>,
    /// The record's first op in the run was an [`Op::Create`]: the database holds no record of
    /// the key from before the run.
    created: bool,
}

impl<'a> Net<'a> {
    pub(crate) fn add(&mut self, op: OpRef<'a>) {
        match op {
            OpRef::Put(table, key, value) => self.write(table, key, value, false),
            OpRef::Create(table, key, value) => self.write(table, key, value, true),
            OpRef::Remove(table, key) => match self.last.entry((table, key)) {
                Entry::Occupied(entry) if entry.get().created => {
                    entry.remove();
                }
                Entry::Occupied(mut entry) => entry.get_mut().value = None,
                Entry::Vacant(entry) => {
                    entry.insert(Last { value: None, created: false });
                }
            },
            OpRef::RemoveUnder(table, first) => {
                self.last.retain(|(t, key), _| !(*t == table && key.first() == Some(first)));
                if !self.under.contains(&(table, first)) {
                    self.under.push((table, first));
                }
            }
        }
    }

    fn write(&mut self, table: Table, key: KeyRef<'a>, value: &'a [u8], created: bool) {
        match self.last.entry((table, key)) {
            Entry::Occupied(mut entry) => entry.get_mut().value = Some(value),
            Entry::Vacant(entry) => {
                entry.insert(Last { value: Some(value), created });
            }
        }
    }

    /// What was added, settled: its removals by prefix, and each record's last write in the
    /// tables' key order.
    pub(crate) fn settle(self) -> Settled<'a> {
        let mut last: Vec<_> = self.last.into_iter().map(|(at, last)| (at, last.value)).collect();
        last.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        // Removals by prefix go before every write, and removals commute: their order does not
        // matter.
        let mut under = self.under;
        under.sort_unstable();
        Settled { under, last }
    }
}

/// The net of a run of ops (a [`Net`], settled): what a checkpoint writes, and what the store
/// reads over the database at open instead of writing it first (`read::Records`).
#[derive(Debug, Default)]
pub(crate) struct Settled<'a> {
    /// The removals by prefix, sorted.
    under: Vec<(Table, &'a str)>,
    /// Each record's last write, in the tables' key order.
    last: Vec<Write<'a>>,
}

/// A record's last write in a run: its table and key, and its value (`None`: removed).
pub(crate) type Write<'a> = ((Table, KeyRef<'a>), Option<&'a [u8]>);

impl<'a> Settled<'a> {
    /// Ops with the same effect as the run, in an order that keeps it: the removals by prefix,
    /// then each record's last write in the tables' key order. In key order, consecutive writes
    /// fall on the same pages of the database: a checkpoint of 50,000 new grants into a database
    /// of a million wrote them in 354 ms in hash order, 76-100 ms in key order (its cache holds a
    /// fraction of the pages; docs/benchmarks.md, "A million leases").
    pub(crate) fn ops(&self) -> impl Iterator<Item = Op> + '_ {
        let under = self.under.iter().map(|&(table, first)| OpRef::RemoveUnder(table, first));
        let last = self.last.iter().map(|&((table, key), value)| match value {
            Some(value) => OpRef::Put(table, key, value),
            None => OpRef::Remove(table, key),
        });
        under.chain(last).map(OpRef::to_op)
    }

    /// The last writes of `table`'s records, in key order.
    pub(crate) fn writes_of(&self, table: Table) -> &[Write<'a>] {
        let start = self.last.partition_point(|((t, _), _)| *t < table);
        let end = self.last.partition_point(|((t, _), _)| *t <= table);
        &self.last[start..end]
    }

    /// Whether the run removed every record of `table` whose key starts with `first` (the
    /// records written after that removal are among [`Settled::writes_of`]).
    pub(crate) fn removes_under(&self, table: Table, first: &str) -> bool {
        self.under.binary_search(&(table, first)).is_ok()
    }
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

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;

    fn database() -> redb::Database {
        redb::Builder::new().create_with_backend(redb::backends::InMemoryBackend::new()).unwrap()
    }

    /// Every record of the tables the random ops touch.
    fn contents(db: &redb::Database) -> Vec<(String, Vec<u8>)> {
        let txn = db.begin_read().unwrap();
        let mut out = Vec::new();
        for entry in txn.open_table(GRANTS).unwrap().iter().unwrap() {
            let (key, value) = entry.unwrap();
            out.push((format!("grant {:?}", key.value()), value.value().to_vec()));
        }
        for entry in txn.open_table(NAMESPACES).unwrap().iter().unwrap() {
            let (key, value) = entry.unwrap();
            out.push((format!("namespace {}", key.value()), value.value().to_vec()));
        }
        out
    }

    /// [`contents`] as the store reads them at open, with `tail` laid over the database.
    fn contents_over(db: &redb::Database, tail: &Settled<'_>) -> Vec<(String, Vec<u8>)> {
        let txn = db.begin_read().unwrap();
        let records = super::super::read::Records::new(&txn, tail);
        let mut out = Vec::new();
        records
            .pairs(GRANTS, Table::Grants, |a, b, value| {
                out.push((format!("grant {:?}", (a, b)), value.to_vec()));
                Ok(())
            })
            .unwrap();
        records
            .names(NAMESPACES, Table::Namespaces, |name, value| {
                out.push((format!("namespace {name}"), value.to_vec()));
                Ok(())
            })
            .unwrap();
        out
    }

    fn write(db: &redb::Database, ops: impl IntoIterator<Item = Op>) {
        let txn = db.begin_write().unwrap();
        {
            let mut tables = Tables::open(&txn).unwrap();
            for op in ops {
                tables.apply(&op).unwrap();
            }
        }
        txn.commit().unwrap();
    }

    #[test]
    fn the_net_effect_of_ops_written_or_read_over_equals_writing_them_one_by_one() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let (one_by_one, net_db) = (database(), database());
        // Each round on namespaces of its own.
        for round in 0..200 {
            let names = [format!("a{round}"), format!("b{round}")];
            // Some records exist before the checkpoint.
            let before: Vec<Op> = (0..rng.gen_range(0..6))
                .map(|i| Op::put(Table::Grants, Op::pair(&names[i % 2], &format!("t{i}")), vec![i as u8]))
                .collect();
            // The grants that exist, as the ledger knows them: a new one is created, an
            // existing one put again (a renewed lease).
            let mut present: std::collections::HashSet<(String, String)> = before
                .iter()
                .filter_map(|op| match op {
                    Op::Put(_, Key::Pair(a, b), _) => Some((a.clone(), b.clone())),
                    _ => None,
                })
                .collect();
            write(&one_by_one, before.clone());
            write(&net_db, before);
            let ops: Vec<Op> = (0..rng.gen_range(1..30))
                .map(|_| {
                    let namespace = names[rng.gen_range(0..2)].as_str();
                    let token = format!("t{}", rng.gen_range(0..6));
                    let key = Op::pair(namespace, &token);
                    let pair = (namespace.to_owned(), token);
                    match rng.gen_range(0..10) {
                        0..=4 if present.insert(pair.clone()) => Op::Create(Table::Grants, key, vec![rng.gen()]),
                        0..=4 => Op::put(Table::Grants, key, vec![rng.gen()]),
                        5..=7 => {
                            present.remove(&pair);
                            Op::Remove(Table::Grants, key)
                        }
                        8 => Op::put(Table::Namespaces, Op::name(namespace), vec![rng.gen()]),
                        _ => {
                            present.retain(|(a, _)| a != namespace);
                            Op::RemoveUnder(Table::Grants, namespace.to_owned())
                        }
                    }
                })
                .collect();
            write(&one_by_one, ops.clone());
            let mut net = Net::default();
            ops.iter().for_each(|op| net.add(OpRef::of(op)));
            let settled = net.settle();
            // Read over the database as at open, the net is what writing the ops gives.
            assert_eq!(contents_over(&net_db, &settled), contents(&one_by_one), "round {round}, read over: {ops:?}");
            write(&net_db, settled.ops());
            // What is read in place is what was written.
            for op in &ops {
                let bytes = postcard::to_allocvec(op).unwrap();
                assert_eq!(postcard::from_bytes::<OpRef<'_>>(&bytes).unwrap(), OpRef::of(op));
            }
            assert_eq!(contents(&one_by_one), contents(&net_db), "round {round}: {ops:?}");
        }
    }

    /// The allocs (a name and a number) and the sessions (a number) of the database, as written
    /// and as read with `tail` laid over them.
    fn numbered(db: &redb::Database, tail: Option<&Settled<'_>>) -> Vec<String> {
        let txn = db.begin_read().unwrap();
        let mut out = Vec::new();
        match tail {
            None => {
                for entry in txn.open_table(ALLOCS).unwrap().iter().unwrap() {
                    let (key, value) = entry.unwrap();
                    out.push(format!("alloc {:?} {:?}", key.value(), value.value()));
                }
                for entry in txn.open_table(SESSIONS).unwrap().iter().unwrap() {
                    let (key, value) = entry.unwrap();
                    out.push(format!("session {} {:?}", key.value(), value.value()));
                }
            }
            Some(tail) => {
                let records = super::super::read::Records::new(&txn, tail);
                records
                    .numbered(ALLOCS, Table::Allocs, |pool, id, value| {
                        out.push(format!("alloc {:?} {value:?}", (pool, id)));
                        Ok(())
                    })
                    .unwrap();
                records
                    .ids(SESSIONS, Table::Sessions, |id, value| {
                        out.push(format!("session {id} {value:?}"));
                        Ok(())
                    })
                    .unwrap();
            }
        }
        out
    }

    /// Numbers whose order differs from their bytes' (little-endian) order, so that a merge in
    /// the wrong order shows.
    #[test]
    fn allocs_and_sessions_read_over_the_database_are_what_writing_them_gives() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let (one_by_one, over) = (database(), database());
        // The tables made.
        write(&one_by_one, []);
        write(&over, []);
        let numbers = [0u64, 1, 255, 256, 257, 65_535, 65_536, 1 << 40, u64::MAX - 1, u64::MAX];
        for round in 0..200 {
            let pools = [format!("p{round}"), format!("p{round}x"), format!("q{round}")];
            let mut ops = Vec::new();
            for _ in 0..rng.gen_range(1..25) {
                let pool = pools[rng.gen_range(0..pools.len())].as_str();
                let id = numbers[rng.gen_range(0..numbers.len())];
                let session = (u128::from(numbers[rng.gen_range(0..numbers.len())]) << 64) | u128::from(id);
                ops.push(match rng.gen_range(0..10) {
                    0..=3 => Op::put(Table::Allocs, Key::Numbered(pool.to_owned(), id), vec![rng.gen()]),
                    4..=5 => Op::Remove(Table::Allocs, Key::Numbered(pool.to_owned(), id)),
                    6 => Op::RemoveUnder(Table::Allocs, pool.to_owned()),
                    7..=8 => Op::put(Table::Sessions, Key::Id(session), vec![rng.gen()]),
                    _ => Op::Remove(Table::Sessions, Key::Id(session)),
                });
            }
            let mut net = Net::default();
            ops.iter().for_each(|op| net.add(OpRef::of(op)));
            let settled = net.settle();
            write(&one_by_one, ops.clone());
            assert_eq!(numbered(&over, Some(&settled)), numbered(&one_by_one, None), "round {round}: {ops:?}");
            write(&over, settled.ops());
            assert_eq!(numbered(&over, None), numbered(&one_by_one, None), "round {round}, written: {ops:?}");
        }
    }

    #[test]
    fn a_grant_created_and_removed_in_one_run_writes_nothing() {
        let key = || Op::pair("hive", "t1");
        let ops = [
            Op::Create(Table::Grants, key(), vec![1]),
            Op::put(Table::Grants, key(), vec![2]),
            Op::Remove(Table::Grants, key()),
        ];
        let mut net = Net::default();
        ops.iter().for_each(|op| net.add(OpRef::of(op)));
        assert_eq!(net.settle().ops().count(), 0);

        // A record that may exist from before the run is still removed.
        let mut net = Net::default();
        ops[1..].iter().for_each(|op| net.add(OpRef::of(op)));
        assert_eq!(net.settle().ops().collect::<Vec<_>>(), vec![Op::Remove(Table::Grants, key())]);
    }
}
