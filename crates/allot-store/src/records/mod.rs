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
//!   `seq` -> the number of the last commit, `events_seq` -> the last commit whose events are kept
//!
//! The records of each part are in a module of their own (`quotas`, `pools`, `apps`, `runs`);
//! `events` holds the change feed's events as the log and the kept events' files carry them; this
//! one holds the format's version, the `meta` table and the encoding.
//!
//! Values are postcard-encoded. The format version is checked at open: a file written by a newer
//! format is refused rather than misread.

pub mod access;
pub mod apps;
pub mod events;
mod pools;
mod quotas;
pub mod runs;

pub use pools::*;
pub use quotas::*;

use redb::TableDefinition;
use serde::{Deserialize, Serialize};

pub const FORMAT_VERSION: u64 = 1;

pub const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

pub const META_FORMAT: &str = "format";
pub const META_CLOCK: &str = "clock";
pub const META_SEQ: &str = "seq";
/// The wall clock (Unix ms) less the daemon clock, as the daemon that last opened the store had
/// them: with the daemon clock of the last record, when that daemon stopped.
pub const META_WALL_OFFSET: &str = "wall_offset";
/// The number of the last commit whose change feed events are in the kept events' files (with
/// `seq`, by this version; a version before the files moves `seq` alone).
pub const META_EVENTS_SEQ: &str = "events_seq";

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

/// Decodes a record of `table`; `key` names it in the error (written out only then: a start
/// decodes a million grants).
pub fn decode<'a, T: Deserialize<'a>>(
    table: &'static str,
    key: impl std::fmt::Display,
    bytes: &'a [u8],
) -> Result<T, CorruptRecord> {
    postcard::from_bytes(bytes).map_err(|err| CorruptRecord { table, key: key.to_string(), reason: err.to_string() })
}

/// Decodes a record whose type gained `added` optional fields at its end since the format
/// began: one written before ends where they start, and reads as if they were absent (an
/// `Option`'s `None` is one zero byte in postcard).
pub fn decode_grown<T: serde::de::DeserializeOwned>(
    table: &'static str,
    key: impl std::fmt::Display + Copy,
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
