//! The server on serving threads of its own (`allot_server::run_with_threads`, as `allot serve`
//! runs on the embedded store), over a real socket: connections on different threads share one
//! store, a release on one thread wakes a waiter on another, and a shutdown answers the waiters,
//! lets every thread end and returns.

use std::sync::Arc;
use std::time::Duration;

use allot_api::Status;
use allot_client::{Allocate, Client};
use allot_store::{EmbeddedConfig, EmbeddedStore, Store};

use crate::support::until;

#[tokio::test]
async fn connections_on_different_threads_share_the_store_and_shut_down_together() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(EmbeddedStore::open(&EmbeddedConfig::new(dir.path().to_owned())).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(allot_server::run_with_threads(
        listener,
        allot_server::ServerState::new(store),
        async move {
            let _ = stopped.await;
        },
        // Pinned where the machine has three CPUs or more; on fewer, unpinned.
        allot_server::ServingThreads { count: 3, pin: true },
    ));
    // Each client has connections of its own; they are handed round-robin to the threads.
    let clients: Vec<Client> = (0..6).map(|_| Client::new(&base).unwrap()).collect();
    clients[0].put_namespace("gpu", 4).await.unwrap();

    // Six clients, four units: every allocate is answered (granted or refused) and every grant
    // is released.
    let mut rounds = tokio::task::JoinSet::new();
    for (index, client) in clients.iter().enumerate() {
        let client = client.clone();
        rounds.spawn(async move {
            let mut granted = 0;
            for round in 0..50 {
                let token = format!("c{index}-{round}");
                let answer = client.allocate("gpu", &token, &Allocate::default()).await.unwrap();
                if answer.status == Status::Granted {
                    granted += 1;
                    client.release("gpu", &token, None).await.unwrap();
                }
            }
            granted
        });
    }
    let mut granted = 0;
    while let Some(round) = rounds.join_next().await {
        granted += round.unwrap();
    }
    assert!(granted >= 4, "only {granted} allocates were granted");
    assert!(clients[0].grants("gpu").await.unwrap().grants.is_empty(), "every grant was released");

    // A waiter on one connection is woken by a release on another.
    for token in ["a", "b", "c", "d"] {
        assert_eq!(clients[1].allocate("gpu", token, &Allocate::default()).await.unwrap().status, Status::Granted);
    }
    let wait = |client: Client, token: &'static str| {
        tokio::spawn(async move {
            client.allocate("gpu", token, &Allocate { wait_ms: Some(30_000), ..Allocate::default() }).await
        })
    };
    let woken = wait(clients[2].clone(), "woken");
    let queued = async || clients[0].waiters("gpu").await.unwrap().waiters.len();
    until("a waiter is queued", async || queued().await >= 1).await;
    clients[3].release("gpu", "a", None).await.unwrap();
    assert_eq!(woken.await.unwrap().unwrap().status, Status::Granted);

    // A waiter still waiting at shutdown is answered with its place; the server returns.
    let last = wait(clients[4].clone(), "last");
    until("the last waiter is queued", async || queued().await >= 1).await;
    stop.send(()).unwrap();
    let answer = last.await.unwrap().unwrap();
    assert_eq!(answer.status, Status::Exhausted);
    assert_eq!(answer.queue.unwrap().position, 1);
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the server returns after its shutdown")
        .unwrap()
        .unwrap();
}
