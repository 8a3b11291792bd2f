//! Lists in pages against a real daemon in-process (`allot_server::run` over an embedded store):
//! the list helpers follow every page; the page methods give one page and where the next starts.

use std::sync::Arc;

use allot_client::{Allocate, Client, PageArgs, MAX_PAGE_LIMIT};
use allot_core::{NamespaceName, Token};
use allot_store::{EmbeddedConfig, EmbeddedStore, Store};

/// A store with `namespaces` namespaces and, in the first, `grants` grants; served until the
/// test ends.
async fn daemon(dir: &std::path::Path, namespaces: usize, grants: usize) -> Client {
    let store: Arc<dyn Store> = Arc::new(EmbeddedStore::open(&EmbeddedConfig::new(dir.to_owned())).unwrap());
    let name = |i: usize| NamespaceName::new(&format!("ns-{i:05}")).unwrap();
    // Many at once, so the store group-commits them.
    let mut puts = tokio::task::JoinSet::new();
    for i in 0..namespaces {
        let store = store.clone();
        puts.spawn(async move { store.put_namespace(name(i), grants.max(1) as u64).await.map(|_| ()) });
    }
    for i in 0..grants {
        let store = store.clone();
        puts.spawn(async move {
            let request = allot_core::AllocateRequest {
                namespace: name(0),
                token: Token::new(&format!("t{i:05}")).unwrap(),
                units: 1,
                scope: None,
                constraints: allot_core::Constraints::default(),
                lease: allot_core::LeaseRequest::None,
            };
            // The namespace may not exist yet: try until it does.
            loop {
                match store.allocate(request.clone(), std::time::Duration::ZERO).await {
                    Ok(_) => return Ok(()),
                    Err(allot_store::StoreError::Quotas(allot_core::LedgerError::NamespaceNotFound(_))) => {
                        tokio::task::yield_now().await
                    }
                    Err(err) => return Err(err),
                }
            }
        });
    }
    while let Some(put) = puts.join_next().await {
        put.unwrap().unwrap();
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(allot_server::run(listener, allot_server::ServerState::new(store), std::future::pending()));
    Client::new(&format!("http://{addr}")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_helpers_follow_every_page() {
    let dir = tempfile::tempdir().unwrap();
    let client = daemon(dir.path(), 2_100, 1_001).await;
    // Three pages of at most 1000.
    let list = client.namespaces().await.unwrap();
    assert_eq!(list.namespaces.len(), 2_100);
    assert!(list.namespaces.windows(2).all(|w| w[0].name < w[1].name), "in name order, once each");
    assert_eq!(list.next_cursor, None);
    // 1001 grants: a full page and one more.
    let grants = client.grants("ns-00000").await.unwrap().grants;
    assert_eq!(grants.len(), 1_001);
    assert_eq!((grants[0].token.as_str(), grants[1_000].token.as_str()), ("t00000", "t01000"));
    client.allocate("ns-00001", "x", &Allocate::default()).await.unwrap();
    assert_eq!(client.grants("ns-00001").await.unwrap().grants.len(), 1);
    assert!(client.waiters("ns-00001").await.unwrap().waiters.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_says_where_the_next_starts() {
    let dir = tempfile::tempdir().unwrap();
    let client = daemon(dir.path(), 25, 0).await;
    let first = client.namespaces_page(&PageArgs { limit: Some(10), cursor: None }).await.unwrap();
    assert_eq!(first.namespaces.len(), 10);
    let cursor = first.next_cursor.clone().expect("more pages");
    let second = client.namespaces_page(&PageArgs { limit: Some(20), cursor: Some(cursor) }).await.unwrap();
    let names: Vec<&str> = second.namespaces.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names.first().copied(), Some("ns-00010"));
    assert_eq!((names.len(), second.next_cursor), (15, None));
    // The daemon's default page size, and its limits.
    assert_eq!(client.namespaces_page(&PageArgs::default()).await.unwrap().namespaces.len(), 25);
    let too_big = PageArgs { limit: Some(MAX_PAGE_LIMIT + 1), cursor: None };
    let err = client.namespaces_page(&too_big).await.unwrap_err();
    assert_eq!((err.status(), err.code()), (Some(400), Some("invalid_argument")), "{err}");
    let made_up = PageArgs { limit: None, cursor: Some("not a cursor".into()) };
    let err = client.pools_page(&made_up).await.unwrap_err();
    assert_eq!((err.status(), err.code()), (Some(400), Some("invalid_cursor")), "{err}");
}
