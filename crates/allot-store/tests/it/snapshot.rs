//! Snapshots of the embedded store: taken while it serves, restored into a new data directory.

use std::sync::Arc;
use std::time::Duration;

use allot_core::LeaseRequest;
use allot_store::clock::{ManualClock, TimeSource};
use allot_store::embedded::snapshot::{restore, LeaseTime, RestoreError, RestoreOptions, DEFAULT_BUMP_REVISION};
use allot_store::prelude::*;
use allot_store::snapshot::{verify, SnapshotError, Table, MAGIC};
use allot_store::{read_all, Allocation, EmbeddedConfig, EmbeddedStore, WatchError};

use crate::embedded::{ns, request};

fn open_on(dir: &std::path::Path, clock: &ManualClock) -> EmbeddedStore {
    EmbeddedStore::open(&EmbeddedConfig::new(dir.to_owned()).with_time(Arc::new(clock.clone()))).unwrap()
}

/// The records of an archive: everything after its header line, its checksum aside.
fn records(archive: &[u8]) -> &[u8] {
    let header_end = MAGIC.len() + archive[MAGIC.len()..].iter().position(|b| *b == b'\n').unwrap() + 1;
    &archive[header_end..archive.len() - 32]
}

async fn tokens(store: &EmbeddedStore, namespace: &str) -> Vec<(String, u64, Option<u64>)> {
    let grants = read_all(|page| store.grants(ns(namespace), page)).await.unwrap();
    grants.into_iter().map(|g| (g.grant.token.as_str().to_owned(), g.grant.fencing, g.expires_in_ms)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_restores_what_it_held_and_nothing_after() {
    let dirs = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = open_on(&dirs.path().join("a"), &clock);
    store.put_namespace(ns("hive"), 10).await.unwrap();
    store.allocate(request("hive", "plain", LeaseRequest::None), Duration::ZERO).await.unwrap();
    store.allocate(request("hive", "leased", LeaseRequest::Ttl { ttl_ms: 60_000 }), Duration::ZERO).await.unwrap();
    let session = store.open_session(120_000, Some("ada".into())).await.unwrap().session.id;
    store.allocate(request("hive", "in-session", LeaseRequest::Session(session)), Duration::ZERO).await.unwrap();
    store.put_namespace(ns("gone"), 1).await.unwrap();
    store.allocate(request("gone", "x", LeaseRequest::None), Duration::ZERO).await.unwrap();
    store.remove_namespace(ns("gone"), true).await.unwrap();
    clock.advance(Duration::from_millis(10_000));

    let mut archive = Vec::new();
    let (header, summary) = store.snapshot(&mut archive).unwrap();
    assert_eq!(summary.bytes, archive.len() as u64);
    assert_eq!((summary.count(Table::Grants), summary.count(Table::Sessions)), (3, 1));
    assert_eq!(summary.count(Table::RetiredFencing), 1, "a removed namespace's fencing numbers are kept");
    assert!(header.revision >= store.revision(), "every change so far is in it");
    // Changes after the snapshot are not in it.
    store.allocate(request("hive", "later", LeaseRequest::None), Duration::ZERO).await.unwrap();
    let (checked, _) = verify(&archive[..]).unwrap();
    assert_eq!(checked, header);

    // Restored a minute later, the leases go on with what they had left.
    clock.advance(Duration::from_millis(60_000));
    let options =
        RestoreOptions { leases: LeaseTime::Resume, bump_revision: DEFAULT_BUMP_REVISION, now_ms: clock.wall_ms() };
    let restored = restore(&archive[..], &dirs.path().join("b"), &options).unwrap();
    assert!(restored.first_revision > header.revision + DEFAULT_BUMP_REVISION);
    let copy = open_on(&dirs.path().join("b"), &clock);
    assert_eq!(
        tokens(&copy, "hive").await,
        [("in-session".into(), 3, Some(110_000)), ("leased".into(), 2, Some(50_000)), ("plain".into(), 1, None)]
    );
    let kept = copy.session(session).await.unwrap().session;
    assert_eq!(kept.owner.as_deref(), Some("ada"));
    // Fencing numbers go on above every one the archive holds, in a removed namespace too.
    let next = copy.allocate(request("hive", "next", LeaseRequest::None), Duration::ZERO).await.unwrap();
    let Allocation::Granted { grant, .. } = next else { panic!("{next:?}") };
    assert!(grant.grant.fencing > 3, "fencing number {} given again", grant.grant.fencing);
    copy.put_namespace(ns("gone"), 1).await.unwrap();
    let again = copy.allocate(request("gone", "y", LeaseRequest::None), Duration::ZERO).await.unwrap();
    let Allocation::Granted { grant, .. } = again else { panic!("{again:?}") };
    assert!(grant.grant.fencing > 1, "fencing number {} given again", grant.grant.fencing);
    // A watcher resuming from any revision the first store gave is told to list again.
    for since in [0, header.revision, store.revision()] {
        let refused = copy.watch(allot_core::watch::Filter::default(), Some(since)).err();
        assert!(matches!(refused, Some(WatchError::Compacted { .. })), "resume from {since}: {refused:?}");
    }
    assert!(copy.revision() >= restored.first_revision);

    // Restored with a bump the first store then went past: a watcher resuming from the first
    // store's newest revision is told to list again, not fed this store's events below it.
    let small = RestoreOptions { bump_revision: 1, ..options };
    let behind = restore(&archive[..], &dirs.path().join("c"), &small).unwrap();
    for i in 0..3 {
        store.allocate(request("hive", &format!("after-{i}"), LeaseRequest::None), Duration::ZERO).await.unwrap();
    }
    let third = open_on(&dirs.path().join("c"), &clock);
    assert!(store.revision() > third.revision(), "the first store went past the restored one's start");
    let refused = third.watch(allot_core::watch::Filter::default(), Some(store.revision())).err();
    assert_eq!(refused, Some(WatchError::Ahead { since: store.revision(), newest: third.revision() }));
    assert!(third.revision() >= behind.first_revision);
    assert!(third.watch(allot_core::watch::Filter::default(), Some(third.revision())).is_ok(), "its own newest");
    store.shutdown().await;
    copy.shutdown().await;
    third.shutdown().await;
}

/// Snapshot, restore, snapshot again: the same records, byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_store_snapshots_to_the_same_records() {
    let dirs = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = open_on(&dirs.path().join("a"), &clock);
    store.put_namespace(ns("hive"), 100).await.unwrap();
    for i in 0..50 {
        let lease = if i % 2 == 0 { LeaseRequest::Ttl { ttl_ms: 30_000 } } else { LeaseRequest::None };
        store.allocate(request("hive", &format!("t{i}"), lease), Duration::ZERO).await.unwrap();
    }
    let mut first = Vec::new();
    store.snapshot(&mut first).unwrap();
    store.shutdown().await;
    let options = RestoreOptions { leases: LeaseTime::Resume, bump_revision: 0, now_ms: clock.wall_ms() };
    restore(&first[..], &dirs.path().join("b"), &options).unwrap();
    let copy = open_on(&dirs.path().join("b"), &clock);
    let mut second = Vec::new();
    copy.snapshot(&mut second).unwrap();
    assert!(records(&first) == records(&second), "the records differ after a round trip");
    copy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restored_with_expire_the_leases_count_the_time_since_the_snapshot() {
    let dirs = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = open_on(&dirs.path().join("a"), &clock);
    store.put_namespace(ns("hive"), 10).await.unwrap();
    store.allocate(request("hive", "short", LeaseRequest::Ttl { ttl_ms: 60_000 }), Duration::ZERO).await.unwrap();
    store.allocate(request("hive", "long", LeaseRequest::Ttl { ttl_ms: 3_600_000 }), Duration::ZERO).await.unwrap();
    let mut archive = Vec::new();
    store.snapshot(&mut archive).unwrap();
    store.shutdown().await;

    clock.advance(Duration::from_millis(120_000));
    let options =
        RestoreOptions { leases: LeaseTime::Expire, bump_revision: DEFAULT_BUMP_REVISION, now_ms: clock.wall_ms() };
    restore(&archive[..], &dirs.path().join("b"), &options).unwrap();
    let copy = open_on(&dirs.path().join("b"), &clock);
    crate::support::until("the short lease expired", async || tokens(&copy, "hive").await.len() == 1).await;
    assert_eq!(
        tokens(&copy, "hive").await,
        [("long".into(), 2, Some(3_480_000))],
        "the short lease expired, the long one counts the 2 minutes"
    );
    copy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_archive_or_a_used_directory_restores_nothing() {
    let dirs = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = open_on(&dirs.path().join("a"), &clock);
    store.put_namespace(ns("hive"), 10).await.unwrap();
    store.allocate(request("hive", "t", LeaseRequest::None), Duration::ZERO).await.unwrap();
    let mut archive = Vec::new();
    store.snapshot(&mut archive).unwrap();
    store.shutdown().await;
    drop(store);
    let options = RestoreOptions { leases: LeaseTime::Resume, bump_revision: 0, now_ms: clock.wall_ms() };
    let target = dirs.path().join("b");

    let mut altered = archive.clone();
    let at = altered.len() - 40;
    altered[at] ^= 0x20;
    let cut = &archive[..archive.len() - 10];
    for (bad, expected) in [(&altered[..], "checksum does not match"), (cut, "incomplete")] {
        let err = restore(bad, &target, &options).unwrap_err();
        assert!(err.to_string().contains(expected), "{err}");
        assert!(!target.exists(), "a refused archive left {}", target.display());
    }
    let siblings: Vec<_> = std::fs::read_dir(dirs.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(siblings, ["a"], "nothing is left behind");
    let not_a_snapshot = restore(&b"{\"quotas\": []}"[..], &target, &options).unwrap_err();
    assert!(matches!(not_a_snapshot, RestoreError::Snapshot(SnapshotError::NotASnapshot)), "{not_a_snapshot}");

    // A directory in use is never written over.
    let err = restore(&archive[..], &dirs.path().join("a"), &options).unwrap_err();
    assert!(matches!(err, RestoreError::NotEmpty { .. }), "{err}");
    let reopened = open_on(&dirs.path().join("a"), &clock);
    assert_eq!(tokens(&reopened, "hive").await.len(), 1);
    reopened.shutdown().await;
    // An empty directory (a mount point, say) is filled where it is, keeping its mode; a refused
    // archive leaves it empty.
    std::fs::create_dir(&target).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o750)).unwrap();
    assert!(restore(&altered[..], &target, &options).is_err());
    assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0, "a refused archive left something in it");
    restore(&archive[..], &target, &options).unwrap();
    assert_eq!(std::fs::metadata(&target).unwrap().permissions().mode() & 0o777, 0o750);
    let names: Vec<String> =
        std::fs::read_dir(&target).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(names.iter().all(|name| !name.starts_with(".restoring")), "{names:?}");
    let restored = open_on(&target, &clock);
    assert_eq!(tokens(&restored, "hive").await.len(), 1);
    restored.shutdown().await;
}
