//! Moves the daemon-clock times of a snapshot's records by a signed amount, so that an archive
//! taken on one store's clock restores onto another's (the Redis store's clock is Redis `TIME`,
//! Unix ms; the embedded store's is its own daemon clock, persisted in `meta.clock`).
//!
//! Shifted, on the daemon clock (the store's `now`, `Store::now`):
//! - `grants`: `granted_at`, and the deadline of a TTL lease (`Ledger`, `now` from the store).
//! - `sessions`: `deadline` (`now + ttl` on the store's clock).
//! - `pools`: the cordon's `since` and `drain_at` (`Pools::cordon`, `now` from the store).
//! - `allocs`: `created`, `last_keepalive`, `expires` (not [`HELD`]: a held alloc never lapses), `ended`'s time.
//! - `apps`: `submitted`, `reserved_at`, `completing_since`, `ended_at` (the scheduler's `now`,
//!   moved back together by `Scheduler::count_downtime`), and each slot's placement's `at`.
//! - `tasks`: `added`, the placement's `at`, `preempted_at`, and the time of `preempting`.
//!
//! Not shifted, on the wall clock (Unix ms, whatever the store's clock):
//! - `runs`: `started` and each event's `at`: the executor's `now_ms` is `config.clock.wall_ms()`,
//!   `SystemTime` (crates/allot-exec/src/executor.rs, `now_ms` and `ExecutorConfig::new`).
//! - `catalog`: `at`, set from the same `now_ms` (`Executor::keep_outputs`), and compared with the
//!   wall clock less the retention (`forget_old_outputs`).
//! - `access`: an API token's `created` and `expires`: `SystemTime::now()` when made
//!   (crates/allot-server/src/routes/access.rs, `now_ms`), compared with `SystemTime::now()`.
//!
//! No time at all: `namespaces`, `retired_fencing`, `pool_labels`, `queues` (their `_ms` fields
//! are durations), and access bindings: those are re-encoded only.
//!
//! Every record is decoded as the embedded store decodes it at a start (older records, written
//! before their type grew fields, too) and encoded again: the result is the record's canonical
//! form. Its key must be one of its table's, as a restore requires.

use allot_core::pools::{Labels, HELD};
use allot_core::Millis;

use crate::access::{ApiTokenRecord, BindingRecord};
use crate::records::apps::{decode_app, decode_task, QueueRecord, QUEUE_FIELDS_ADDED};
use crate::records::runs::{CachedRecord, RunRow, RUN_FIELDS_ADDED};
use crate::records::{
    decode, decode_alloc, decode_grown, encode, CorruptRecord, GrantRecord, LeaseRecord, NamespaceRecord, PoolRecord,
    SessionRecord, POOL_FIELDS_ADDED, SESSION_FIELDS_ADDED,
};
use crate::snapshot::{decode_key, hex, Table};

/// A record that cannot be rebased: its key is not one of its table's, or its value does not
/// decode as the table's record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("record {key} of table `{table}` cannot be rebased: {reason}")]
pub struct RebaseError {
    /// The table's name ([`Table::name`]).
    pub table: &'static str,
    /// The record's key, hex.
    pub key: String,
    pub reason: String,
}

/// Decodes a record of `table`, moves every time in it that is on the daemon clock by `shift` ms
/// (saturating at 0 and never moving the "held" sentinel / u64::MAX-like sentinels), and encodes it again.
/// With shift 0 it still re-encodes: the result is the record's canonical form (a record written
/// before its type grew fields comes out with them as None).
pub fn rebase(table: Table, key: &[u8], value: &[u8], shift: i64) -> Result<Vec<u8>, RebaseError> {
    let fail = |reason: String| RebaseError { table: table.name(), key: hex(key), reason };
    let corrupt = |err: CorruptRecord| fail(err.reason);
    let bad_key = || fail("its key is not one of this table's".into());
    let name = table.name();
    let at = |time: &mut Millis| *time = shifted(*time, shift);
    let encoded = match table {
        Table::Namespaces => {
            decode_key::<&str>(key).ok_or_else(bad_key)?;
            encode(&decode::<NamespaceRecord>(name, "", value).map_err(corrupt)?)
        }
        Table::RetiredFencing => {
            decode_key::<&str>(key).ok_or_else(bad_key)?;
            // The next fencing number, as a key is encoded (`encode_key(&u64)`): kept as it is.
            decode_key::<u64>(value).ok_or_else(|| fail("not a fencing number".into()))?;
            value.to_vec()
        }
        Table::Grants => {
            decode_key::<(&str, &str)>(key).ok_or_else(bad_key)?;
            let mut record: GrantRecord = decode(name, "", value).map_err(corrupt)?;
            at(&mut record.granted_at);
            if let LeaseRecord::Ttl { deadline, .. } = &mut record.lease {
                at(deadline);
            }
            encode(&record)
        }
        Table::Sessions => {
            decode_key::<u128>(key).ok_or_else(bad_key)?;
            let mut record: SessionRecord = decode_grown(name, "", value, SESSION_FIELDS_ADDED).map_err(corrupt)?;
            at(&mut record.deadline);
            encode(&record)
        }
        Table::Pools => {
            decode_key::<&str>(key).ok_or_else(bad_key)?;
            let mut record: PoolRecord = decode_grown(name, "", value, POOL_FIELDS_ADDED).map_err(corrupt)?;
            if let Some((since, drain_at)) = &mut record.cordon {
                at(since);
                drain_at.as_mut().map(at);
            }
            encode(&record)
        }
        Table::PoolLabels => {
            decode_key::<&str>(key).ok_or_else(bad_key)?;
            encode(&decode::<Labels>(name, "", value).map_err(corrupt)?)
        }
        Table::Allocs => {
            decode_key::<(&str, u64)>(key).ok_or_else(bad_key)?;
            let mut record = decode_alloc("", value).map_err(corrupt)?;
            at(&mut record.created);
            record.last_keepalive.as_mut().map(at);
            // A held alloc's `expires` is `HELD`, which `shifted` leaves as it is.
            at(&mut record.expires);
            if let Some((ended_at, _)) = &mut record.ended {
                at(ended_at);
            }
            encode(&record)
        }
        Table::Queues => {
            decode_key::<&str>(key).ok_or_else(bad_key)?;
            encode(&decode_grown::<QueueRecord>(name, "", value, QUEUE_FIELDS_ADDED).map_err(corrupt)?)
        }
        Table::Apps => {
            decode_key::<&str>(key).ok_or_else(bad_key)?;
            let mut record = decode_app("", value).map_err(corrupt)?;
            at(&mut record.submitted);
            record.reserved_at.as_mut().map(at);
            record.completing_since.as_mut().map(at);
            record.ended_at.as_mut().map(at);
            for slot in &mut record.slots {
                at(&mut slot.placement.at);
            }
            encode(&record)
        }
        Table::Tasks => {
            decode_key::<(&str, &str)>(key).ok_or_else(bad_key)?;
            let mut record = decode_task("", value).map_err(corrupt)?;
            at(&mut record.added);
            if let Some(placement) = &mut record.placement {
                at(&mut placement.at);
            }
            record.preempted_at.as_mut().map(at);
            if let Some((_, _, since, _)) = &mut record.preempting {
                at(since);
            }
            encode(&record)
        }
        // Wall clock: `started` and the events' `at` stay.
        Table::Runs => {
            decode_key::<(&str, &str)>(key).ok_or_else(bad_key)?;
            encode(&decode_grown::<RunRow>(name, "", value, RUN_FIELDS_ADDED).map_err(corrupt)?)
        }
        // Wall clock: `at` stays.
        Table::Catalog => {
            decode_key::<&str>(key).ok_or_else(bad_key)?;
            encode(&decode::<CachedRecord>(name, "", value).map_err(corrupt)?)
        }
        // Wall clock: a token's `created` and `expires` stay.
        Table::Access => {
            let access_key = decode_key::<&str>(key).ok_or_else(bad_key)?;
            if access_key.starts_with("token/") {
                encode(&decode::<ApiTokenRecord>(name, "", value).map_err(corrupt)?)
            } else if access_key.starts_with("binding/") {
                encode(&decode::<BindingRecord>(name, "", value).map_err(corrupt)?)
            } else {
                return Err(fail("an access key is `token/NAME` or `binding/NAME`".into()));
            }
        }
    };
    Ok(encoded)
}

/// The record's canonical form: [`rebase`] by 0.
pub fn canonical(table: Table, key: &[u8], value: &[u8]) -> Result<Vec<u8>, RebaseError> {
    rebase(table, key, value, 0)
}

/// `time` moved by `shift` ms, saturating at 0; [`HELD`] (`u64::MAX`, never) stays, and no
/// other time is moved onto it.
fn shifted(time: Millis, shift: i64) -> Millis {
    if time == HELD {
        return time;
    }
    let moved = match u64::try_from(shift) {
        Ok(later) => time.saturating_add(later),
        Err(_) => time.saturating_sub(shift.unsigned_abs()),
    };
    moved.min(HELD - 1)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::records::apps::{AppRecord, PlacementRecord, SlotRecord, TaskRecord, APP_FIELDS_ADDED};
    use crate::records::runs::RunRow;
    use crate::records::AllocRecord;
    use crate::snapshot::encode_key;

    /// A key as an archive holds it.
    fn key_of<K: serde::Serialize + ?Sized>(key: &K) -> Vec<u8> {
        let mut out = Vec::new();
        encode_key(key, &mut out);
        out
    }

    fn grant() -> GrantRecord {
        GrantRecord {
            units: 3,
            scope: Some(("proj".into(), "dom".into())),
            fencing: 7,
            lease: LeaseRecord::Ttl { ttl_ms: 30_000, deadline: 1_030_000 },
            granted_at: 1_000_000,
        }
    }

    fn alloc(expires: Millis) -> AllocRecord {
        AllocRecord {
            resources: vec![("cpu".into(), 2_000)],
            owner: "ada".into(),
            labels: BTreeMap::from([("k".into(), "v".into())]).into(),
            created: 10_000,
            last_keepalive: Some(12_000),
            expires,
            ended: Some((15_000, 1)),
            metadata: Some(r#"{"step":3}"#.into()),
        }
    }

    fn placement(at: Millis) -> PlacementRecord {
        PlacementRecord {
            pool: "p".into(),
            alloc: 4,
            resources: vec![("cpu".into(), 1_000)],
            grants: vec![("ns".into(), "tok".into(), 1)],
            at,
        }
    }

    fn app() -> AppRecord {
        AppRecord {
            queue: "root.q".into(),
            user: "ada".into(),
            tags: BTreeMap::new(),
            groups: Vec::new(),
            placeholder_timeout_ms: 60_000,
            gang: "Soft".into(),
            reserve_timeout_ms: Some(5_000),
            state: "Running".into(),
            seq: 1,
            submitted: 20_000,
            reserved_at: Some(21_000),
            slots: vec![SlotRecord { group: "g".into(), member: 0, placement: placement(22_000), task: None }],
            gang_given_up: false,
            counted: true,
            completing_since: Some(23_000),
            reason: None,
            ended_at: Some(24_000),
            max_parallelism: Some(2),
            user_groups: vec!["hive".into()],
            queue_rule: None,
            priority: Some(1),
            priority_class: None,
            held: Vec::new(),
            gang_preempted_at: None,
        }
    }

    fn task() -> TaskRecord {
        TaskRecord {
            resources: vec![("cpu".into(), 1_000)],
            tokens: vec![("ns".into(), 1)],
            group: None,
            priority: 0,
            selector: BTreeMap::new(),
            spec: "{}".into(),
            state: "Running".into(),
            seq: 2,
            added: 30_000,
            placement: Some(placement(31_000)),
            slot: None,
            reason: None,
            priority_class: None,
            preemptable: Some(true),
            preemptions: Some(1),
            preempted_at: Some(32_000),
            preempting: Some(("a".into(), "t".into(), 33_000, "room".into())),
            held: None,
        }
    }

    fn session() -> SessionRecord {
        SessionRecord { ttl_ms: 10_000, deadline: 50_000, owner: None }
    }

    fn pool() -> PoolRecord {
        PoolRecord { capacity: vec![("cpu".into(), 8_000)], stopped: false, occupied: None, cordon: None }
    }

    /// One record of every table, with its key.
    fn samples() -> Vec<(Table, Vec<u8>, Vec<u8>)> {
        let token = ApiTokenRecord {
            name: "ci".into(),
            hash: format!("sha256:{:0>64}", 1),
            user: "ada".into(),
            groups: Vec::new(),
            created: 1_700_000_000_000,
            expires: Some(1_800_000_000_000),
        };
        let binding =
            BindingRecord { name: "b".into(), role: "admin".into(), users: vec!["ada".into()], groups: vec![] };
        let cached = CachedRecord { outputs: "{}".into(), app: "a".into(), task: "t".into(), at: 1_700_000_000_000 };
        let queue = QueueRecord::of(&allot_core::apps::queues::QueueLimits::default());
        vec![
            (Table::Namespaces, key_of("ns"), encode(&NamespaceRecord { quota: 10, next_fencing: 3 })),
            (Table::RetiredFencing, key_of("old"), key_of(&9u64)),
            (Table::Grants, key_of(&("ns", "tok")), encode(&grant())),
            (Table::Sessions, key_of(&42u128), encode(&SessionRecord { owner: Some("ada".into()), ..session() })),
            (Table::Pools, key_of("p"), encode(&PoolRecord { cordon: Some((40_000, Some(41_000))), ..pool() })),
            (Table::PoolLabels, key_of("p"), encode(&Labels::from([("zone".into(), "a".into())]))),
            (Table::Allocs, key_of(&("p", 4u64)), encode(&alloc(14_000))),
            (Table::Queues, key_of("root.q"), encode(&queue)),
            (Table::Apps, key_of("a"), encode(&app())),
            (Table::Tasks, key_of(&("a", "t")), encode(&task())),
            (Table::Runs, key_of(&("a", "t")), encode(&RunRow::of(&crate::conformance::sample_run()))),
            (Table::Catalog, key_of("cache-key"), encode(&cached)),
            (Table::Access, key_of("token/ci"), encode(&token)),
            (Table::Access, key_of("binding/b"), encode(&binding)),
        ]
    }

    #[test]
    fn a_grant_moved_and_moved_back_is_the_same_bytes() {
        let (key, bytes) = (key_of(&("ns", "tok")), encode(&grant()));
        let later = rebase(Table::Grants, &key, &bytes, 5_000).unwrap();
        let moved: GrantRecord = decode("grants", "", &later).unwrap();
        assert_eq!(
            moved,
            GrantRecord {
                lease: LeaseRecord::Ttl { ttl_ms: 30_000, deadline: 1_035_000 },
                granted_at: 1_005_000,
                ..grant()
            }
        );
        assert_eq!(rebase(Table::Grants, &key, &later, -5_000).unwrap(), bytes);
    }

    #[test]
    fn every_table_moves_back_to_its_bytes_and_is_canonical_as_written() {
        for (table, key, value) in samples() {
            assert_eq!(canonical(table, &key, &value).unwrap(), value, "{}", table.name());
            let later = rebase(table, &key, &value, 86_400_000).unwrap();
            assert_eq!(rebase(table, &key, &later, -86_400_000).unwrap(), value, "{}", table.name());
        }
    }

    #[test]
    fn daemon_clock_times_move_and_wall_clock_ones_stay() {
        let shift = 1_000;
        let moved = |table: Table, key: Vec<u8>, value: Vec<u8>| rebase(table, &key, &value, shift).unwrap();
        let session: SessionRecord =
            decode("sessions", "", &moved(Table::Sessions, key_of(&1u128), encode(&session()))).unwrap();
        assert_eq!(session.deadline, 51_000);
        let cordoned = PoolRecord { cordon: Some((40_000, Some(41_000))), ..pool() };
        let pool: PoolRecord = decode("pools", "", &moved(Table::Pools, key_of("p"), encode(&cordoned))).unwrap();
        assert_eq!(pool.cordon, Some((41_000, Some(42_000))));
        let alloc: AllocRecord =
            decode("allocs", "", &moved(Table::Allocs, key_of(&("p", 4u64)), encode(&alloc(14_000)))).unwrap();
        assert_eq!(
            (alloc.created, alloc.last_keepalive, alloc.expires, alloc.ended),
            (11_000, Some(13_000), 15_000, Some((16_000, 1)))
        );
        let app = decode_app("", &moved(Table::Apps, key_of("a"), encode(&app()))).unwrap();
        assert_eq!(
            (app.submitted, app.reserved_at, app.completing_since, app.ended_at, app.slots[0].placement.at),
            (21_000, Some(22_000), Some(24_000), Some(25_000), 23_000)
        );
        assert_eq!((app.placeholder_timeout_ms, app.reserve_timeout_ms), (60_000, Some(5_000)), "durations stay");
        let task = decode_task("", &moved(Table::Tasks, key_of(&("a", "t")), encode(&task()))).unwrap();
        assert_eq!(
            (task.added, task.placement.map(|p| p.at), task.preempted_at, task.preempting.map(|p| p.2)),
            (31_000, Some(32_000), Some(33_000), Some(34_000))
        );
        for (table, key, value) in samples() {
            if matches!(table, Table::Runs | Table::Catalog | Table::Access) {
                assert_eq!(rebase(table, &key, &value, shift).unwrap(), value, "{} is on the wall clock", table.name());
            }
        }
    }

    #[test]
    fn a_held_allocs_sentinel_is_not_moved() {
        let key = key_of(&("p", 4u64));
        for shift in [5_000, -5_000, i64::MAX, i64::MIN] {
            let bytes = rebase(Table::Allocs, &key, &encode(&alloc(HELD)), shift).unwrap();
            let record: AllocRecord = decode("allocs", "", &bytes).unwrap();
            assert_eq!(record.expires, HELD, "shift {shift}");
        }
        let record: AllocRecord =
            decode("allocs", "", &rebase(Table::Allocs, &key, &encode(&alloc(HELD)), 5_000).unwrap()).unwrap();
        assert_eq!(record.created, 15_000, "its other times move");
        // Nothing else is moved onto the sentinel.
        let late = rebase(Table::Allocs, &key, &encode(&alloc(HELD - 10)), i64::MAX).unwrap();
        assert_eq!(decode::<AllocRecord>("allocs", "", &late).unwrap().expires, HELD - 1);
    }

    #[test]
    fn a_shift_below_zero_saturates_at_zero() {
        let (key, bytes) = (key_of(&("ns", "tok")), encode(&grant()));
        let record: GrantRecord =
            decode("grants", "", &rebase(Table::Grants, &key, &bytes, -2_000_000).unwrap()).unwrap();
        assert_eq!((record.granted_at, record.lease), (0, LeaseRecord::Ttl { ttl_ms: 30_000, deadline: 0 }));
        let bytes = rebase(Table::Allocs, &key_of(&("p", 1u64)), &encode(&alloc(14_000)), i64::MIN).unwrap();
        let record: AllocRecord = decode("allocs", "", &bytes).unwrap();
        assert_eq!(
            (record.created, record.last_keepalive, record.expires, record.ended),
            (0, Some(0), 0, Some((0, 1)))
        );
    }

    #[test]
    fn a_record_of_one_table_given_as_another_is_refused() {
        let grant_key = key_of(&("ns", "tok"));
        // Its key is not one of the table's.
        let err = rebase(Table::Sessions, &grant_key, &encode(&session()), 0).unwrap_err();
        assert_eq!((err.table, err.key.as_str()), ("sessions", hex(&grant_key).as_str()));
        assert!(err.to_string().contains("its key is not one of this table's"), "{err}");
        // Its value is not the table's record.
        let namespace = encode(&NamespaceRecord { quota: 10, next_fencing: 3 });
        let err = rebase(Table::Allocs, &key_of(&("p", 4u64)), &namespace, 0).unwrap_err();
        assert_eq!(err.table, "allocs");
        assert!(rebase(Table::Apps, &key_of("a"), &encode(&grant()), 0).is_err());
        assert!(rebase(Table::Tasks, &key_of(&("a", "t")), &encode(&session()), 0).is_err());
        assert!(rebase(Table::Grants, &grant_key, &encode(&session()), 0).is_err());
        assert!(rebase(Table::RetiredFencing, &key_of("old"), &encode(&grant()), 0).is_err());
        assert!(rebase(Table::Access, &key_of("other/x"), &encode(&grant()), 0).is_err());
    }

    #[test]
    fn an_older_record_comes_out_in_its_full_encoding() {
        let full = encode(&session());
        let older = &full[..full.len() - SESSION_FIELDS_ADDED];
        assert_eq!(canonical(Table::Sessions, &key_of(&1u128), older).unwrap(), full);
        let full = encode(&pool());
        let older = &full[..full.len() - POOL_FIELDS_ADDED];
        assert_eq!(canonical(Table::Pools, &key_of("p"), older).unwrap(), full);
        // An older application is moved too, and comes out in the full encoding.
        let newer = AppRecord {
            max_parallelism: None,
            user_groups: Vec::new(),
            queue_rule: None,
            priority: None,
            priority_class: None,
            ..app()
        };
        let full = encode(&newer);
        let older = &full[..full.len() - APP_FIELDS_ADDED];
        let moved = rebase(Table::Apps, &key_of("a"), older, 1_000).unwrap();
        assert_eq!(decode_app("", &moved).unwrap().submitted, 21_000);
        assert_eq!(rebase(Table::Apps, &key_of("a"), &moved, -1_000).unwrap(), full);
    }
}
