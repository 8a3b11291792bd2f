//! The embedded backend: the conformance suite, restarts, and a disk that fails.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use allot_core::{AllocateRequest, Constraints, LeaseRequest, NamespaceName, Token};
use allot_store::fault::FlakyDisk;
use allot_store::{conformance, Allocation, EmbeddedConfig, EmbeddedStore, Store, StoreError};

fn ns(name: &str) -> NamespaceName {
    NamespaceName::new(name).unwrap()
}

fn request(namespace: &str, token: &str, lease: LeaseRequest) -> AllocateRequest {
    AllocateRequest {
        namespace: ns(namespace),
        token: Token::new(token).unwrap(),
        units: 1,
        scope: None,
        constraints: Constraints::default(),
        lease,
    }
}

fn open(dir: &std::path::Path) -> EmbeddedStore {
    EmbeddedStore::open(&EmbeddedConfig { data_dir: dir.to_owned() }).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_passes_the_conformance_suite() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(open(dir.path()));
    conformance::run(store.clone()).await;
    store.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_survives_a_restart_and_leases_keep_their_remaining_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.put_namespace(ns("hive"), 3).await.unwrap();
    store.allocate(request("hive", "plain", LeaseRequest::None), Duration::ZERO).await.unwrap();
    store.allocate(request("hive", "leased", LeaseRequest::Ttl { ttl_ms: 3000 }), Duration::ZERO).await.unwrap();
    let session = store.open_session(60_000).await.unwrap().session.id;
    store.allocate(request("hive", "in-session", LeaseRequest::Session(session)), Duration::ZERO).await.unwrap();
    store.release(ns("hive"), Token::new("plain").unwrap(), None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    store.shutdown().await;
    drop(store);

    // The time the daemon is down does not count against the leases.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let store = open(dir.path());
    let grants = store.grants(ns("hive")).await.unwrap();
    let tokens: Vec<&str> = grants.iter().map(|g| g.grant.token.as_str()).collect();
    assert_eq!(tokens, ["in-session", "leased"]);
    let leased = &grants[1];
    let left = leased.expires_in_ms.unwrap();
    assert!((1500..=2100).contains(&left), "the lease should have about 2000 ms left, has {left}");
    assert_eq!(store.session(session).await.unwrap().session.grants.len(), 1);
    let next = store.allocate(request("hive", "next", LeaseRequest::None), Duration::ZERO).await.unwrap();
    let Allocation::Granted { grant, .. } = next else { panic!("{next:?}") };
    // Fencing numbers go on above the block reserved before the restart.
    assert_eq!(grant.grant.fencing, 2 + allot_core::FENCING_BLOCK);
    store.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_disk_gets_a_clear_error_and_keeps_the_state_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("allot.redb");
    let failing = Arc::new(AtomicBool::new(false));
    let make = {
        let failing = failing.clone();
        move || FlakyDisk::open(&path, failing.clone()).unwrap()
    };
    let store = EmbeddedStore::open_with_backend(make).unwrap();
    store.put_namespace(ns("hive"), 2).await.unwrap();
    store.allocate(request("hive", "kept", LeaseRequest::None), Duration::ZERO).await.unwrap();

    failing.store(true, Ordering::SeqCst);
    let lost = store.allocate(request("hive", "lost", LeaseRequest::None), Duration::ZERO).await;
    assert!(matches!(&lost, Err(StoreError::Unavailable(reason)) if reason.contains("no space")), "{lost:?}");
    let release = store.release(ns("hive"), Token::new("kept").unwrap(), None).await;
    assert!(matches!(release, Err(StoreError::Unavailable(_))), "{release:?}");

    failing.store(false, Ordering::SeqCst);
    // The state is what was durable: `kept` is still granted, `lost` never was.
    let mut tokens = Vec::new();
    for _ in 0..100 {
        match store.grants(ns("hive")).await {
            Ok(grants) => {
                tokens = grants.into_iter().map(|g| g.grant.token.as_str().to_owned()).collect();
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    assert_eq!(tokens, ["kept"]);
    // And the store works again.
    let granted = store.allocate(request("hive", "after", LeaseRequest::None), Duration::ZERO).await.unwrap();
    assert!(matches!(granted, Allocation::Granted { .. }), "{granted:?}");
    assert!(store.commit_stats().failures >= 1);
    store.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_data_directory_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let err = EmbeddedStore::open(&EmbeddedConfig { data_dir: file.join("data") }).err().expect("must fail");
    assert!(err.to_string().contains("cannot create the data directory"), "{err}");
}
