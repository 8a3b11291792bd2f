//! The records as the store reads them when it opens: each table in key order, with the log's
//! records that the database does not hold yet laid over it (`open::open`). The first checkpoint
//! then writes those records into the database, as it writes any others.

use std::borrow::Cow;

use redb::{ReadTransaction, ReadableTable, TableDefinition};

use super::ops::{KeyRef, Settled, Table};
use super::OpenError;
use crate::records::CorruptRecord;

/// The records of a read transaction, with `tail` laid over them.
pub(super) struct Records<'t, 's> {
    txn: &'t ReadTransaction,
    tail: &'t Settled<'s>,
}

/// A table's key, seen as a [`KeyRef`]: ordered alike (the tables' keys are text compared by
/// bytes, numbers, and pairs of them compared in turn), so the database's records and the
/// tail's writes merge in one pass.
pub(super) trait KeyShape: redb::Key + 'static {
    fn key_ref<'k>(key: Self::SelfType<'k>) -> KeyRef<'k>
    where
        Self: 'k;
}

impl KeyShape for &'static str {
    fn key_ref<'k>(key: Self::SelfType<'k>) -> KeyRef<'k>
    where
        Self: 'k,
    {
        KeyRef::Name(key)
    }
}

impl KeyShape for (&'static str, &'static str) {
    fn key_ref<'k>((first, second): Self::SelfType<'k>) -> KeyRef<'k>
    where
        Self: 'k,
    {
        KeyRef::Pair(first, second)
    }
}

impl KeyShape for u128 {
    fn key_ref<'k>(key: Self::SelfType<'k>) -> KeyRef<'k>
    where
        Self: 'k,
    {
        KeyRef::Id(key)
    }
}

impl KeyShape for (&'static str, u64) {
    fn key_ref<'k>((first, number): Self::SelfType<'k>) -> KeyRef<'k>
    where
        Self: 'k,
    {
        KeyRef::Numbered(first, number)
    }
}

/// A table's value as the bytes the log writes for it (a `u64` little-endian).
pub(super) trait ValueShape: redb::Value + 'static {
    fn bytes<'v>(value: Self::SelfType<'v>) -> Cow<'v, [u8]>
    where
        Self: 'v;
}

impl ValueShape for &'static [u8] {
    fn bytes<'v>(value: Self::SelfType<'v>) -> Cow<'v, [u8]>
    where
        Self: 'v,
    {
        Cow::Borrowed(value)
    }
}

impl ValueShape for u64 {
    fn bytes<'v>(value: Self::SelfType<'v>) -> Cow<'v, [u8]>
    where
        Self: 'v,
    {
        Cow::Owned(value.to_le_bytes().to_vec())
    }
}

fn read_err(err: impl Into<redb::Error>) -> OpenError {
    OpenError::Read(err.into().to_string())
}

fn misfit(table: Table, key: KeyRef<'_>) -> OpenError {
    CorruptRecord {
        table: "log",
        key: format!("{key:?}"),
        reason: format!("a logged write does not fit table {table:?}"),
    }
    .into()
}

impl<'t, 's> Records<'t, 's> {
    pub(super) fn new(txn: &'t ReadTransaction, tail: &'t Settled<'s>) -> Records<'t, 's> {
        Records { txn, tail }
    }

    /// Hands every record of `table` (stored in `def`) to `f`, in key order, as the database
    /// would hold them with the tail written.
    pub(super) fn each<K: KeyShape, V: ValueShape>(
        &self,
        def: TableDefinition<'_, K, V>,
        table: Table,
        mut f: impl FnMut(KeyRef<'_>, &[u8]) -> Result<(), OpenError>,
    ) -> Result<(), OpenError> {
        let mut laid = self.tail.writes_of(table).iter().peekable();
        let removed = |key: &KeyRef<'_>| key.first().is_some_and(|first| self.tail.removes_under(table, first));
        for entry in self.txn.open_table(def).map_err(read_err)?.iter().map_err(read_err)? {
            let (key, value) = entry.map_err(read_err)?;
            let key = K::key_ref(key.value());
            while let Some(((_, before), written)) = laid.next_if(|((_, laid), _)| *laid < key) {
                if let Some(value) = written {
                    f(*before, value)?;
                }
            }
            if let Some((_, written)) = laid.next_if(|((_, laid), _)| *laid == key) {
                if let Some(value) = written {
                    f(key, value)?;
                }
            } else if !removed(&key) {
                f(key, &V::bytes(value.value()))?;
            }
        }
        for ((_, key), written) in laid {
            if let Some(value) = written {
                f(*key, value)?;
            }
        }
        Ok(())
    }

    /// [`Records::each`] of a table keyed by a name.
    pub(super) fn names<V: ValueShape>(
        &self,
        def: TableDefinition<'_, &'static str, V>,
        table: Table,
        mut f: impl FnMut(&str, &[u8]) -> Result<(), OpenError>,
    ) -> Result<(), OpenError> {
        self.each(def, table, |key, value| match key {
            KeyRef::Name(name) => f(name, value),
            other => Err(misfit(table, other)),
        })
    }

    /// [`Records::each`] of a table keyed by a pair of names.
    pub(super) fn pairs(
        &self,
        def: TableDefinition<'_, (&'static str, &'static str), &'static [u8]>,
        table: Table,
        mut f: impl FnMut(&str, &str, &[u8]) -> Result<(), OpenError>,
    ) -> Result<(), OpenError> {
        self.each(def, table, |key, value| match key {
            KeyRef::Pair(first, second) => f(first, second, value),
            other => Err(misfit(table, other)),
        })
    }

    /// [`Records::each`] of a table keyed by an id.
    pub(super) fn ids(
        &self,
        def: TableDefinition<'_, u128, &'static [u8]>,
        table: Table,
        mut f: impl FnMut(u128, &[u8]) -> Result<(), OpenError>,
    ) -> Result<(), OpenError> {
        self.each(def, table, |key, value| match key {
            KeyRef::Id(id) => f(id, value),
            other => Err(misfit(table, other)),
        })
    }

    /// [`Records::each`] of a table keyed by a name and a number.
    pub(super) fn numbered(
        &self,
        def: TableDefinition<'_, (&'static str, u64), &'static [u8]>,
        table: Table,
        mut f: impl FnMut(&str, u64, &[u8]) -> Result<(), OpenError>,
    ) -> Result<(), OpenError> {
        self.each(def, table, |key, value| match key {
            KeyRef::Numbered(first, number) => f(first, number, value),
            other => Err(misfit(table, other)),
        })
    }
}
