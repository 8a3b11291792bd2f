//! The client-side pool machinery (`allot_client::pools`) against real daemons in-process: each
//! daemon is `allot_server::run` on 127.0.0.1 over an embedded store in a temporary directory.
//! The pick order and the whole-offer rule are also tested as pure functions.

mod allocate;
mod caching;
mod keepalive;
mod mux;
mod pick;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use allot_client::pools::{
    AllocNeed, AllocateOptions, Backoff, DaemonPool, PoolCallError, PoolOffer, PoolSource, Resources,
};
use allot_client::{Alloc, AllocKeepaliveResponse, Client};
use allot_store::clock::ManualClock;
use allot_store::{EmbeddedConfig, EmbeddedStore, Store};
use async_trait::async_trait;

use crate::support::until;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A real daemon on 127.0.0.1 over an embedded store.
struct Daemon {
    addr: SocketAddr,
    dir: PathBuf,
    client: Client,
    stop: Option<oneshot::Sender<()>>,
    served: Option<JoinHandle<()>>,
}

impl Daemon {
    async fn start(dir: &Path) -> Daemon {
        Daemon::start_at(dir, "127.0.0.1:0".parse().unwrap()).await
    }

    /// A daemon whose store reads `clock`, which only the test moves.
    async fn start_on(dir: &Path, clock: &ManualClock) -> Daemon {
        let config = EmbeddedConfig::new(dir.to_owned()).with_time(Arc::new(clock.clone()));
        Daemon::serve(dir, "127.0.0.1:0".parse().unwrap(), config).await
    }

    async fn start_at(dir: &Path, addr: SocketAddr) -> Daemon {
        Daemon::serve(dir, addr, EmbeddedConfig::new(dir.to_owned())).await
    }

    async fn serve(dir: &Path, addr: SocketAddr, config: EmbeddedConfig) -> Daemon {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::open(&config).unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(async move {
            allot_server::run(listener, allot_server::ServerState::new(store), async move {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        let client = client_of(addr);
        Daemon { addr, dir: dir.to_owned(), client, stop: Some(stop), served: Some(served) }
    }

    /// Stops the daemon and waits until its store is closed.
    async fn shutdown(&mut self) {
        drop(self.stop.take());
        if let Some(served) = self.served.take() {
            served.await.unwrap();
        }
    }

    /// A new daemon on the same data directory and port.
    async fn restart(&mut self) -> Daemon {
        self.shutdown().await;
        Daemon::start_at(&self.dir, self.addr).await
    }

    fn pool(&self, name: &str) -> DaemonPool {
        DaemonPool::new(self.client.clone(), name).unwrap()
    }

    async fn put_pools(&self, names: impl IntoIterator<Item = String>, capacity: &str) {
        for name in names {
            self.client.put_pool(&name, capacity).await.unwrap();
        }
    }

    /// How many `GET /v1/pools/{pool}/offers` the daemon answered (from its metrics).
    async fn offers_served(&self) -> u64 {
        let text = self.client.metrics().await.unwrap();
        text.lines()
            .filter(|line| {
                line.starts_with("allot_http_request_duration_seconds_count")
                    && line.contains(r#"route="/v1/pools/{pool}/offers""#)
                    && line.contains(r#"method="GET""#)
            })
            .map(|line| line.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64)
            .sum()
    }
}

fn client_of(addr: SocketAddr) -> Client {
    Client::new(&format!("http://{addr}")).unwrap().with_request_timeout(Duration::from_secs(5))
}

/// A port with nothing listening.
fn closed_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// An address whose every connection is held for `hold` and then closed without an answer: a
/// call to it fails (retryably), and not at once.
async fn failing_slowly(hold: std::time::Duration) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                // The peer's slowness is what the tests that use it are about.
                tokio::time::sleep(hold).await;
                drop(stream);
            });
        }
    });
    address
}

fn r(text: &str) -> Resources {
    text.parse().unwrap()
}

/// A real pool on a daemon, with its calls counted.
struct Counted {
    pool: DaemonPool,
    offers: AtomicUsize,
    accepts: AtomicUsize,
    keepalives: AtomicUsize,
}

impl Counted {
    fn new(pool: DaemonPool) -> Arc<Counted> {
        Arc::new(Counted {
            pool,
            offers: AtomicUsize::new(0),
            accepts: AtomicUsize::new(0),
            keepalives: AtomicUsize::new(0),
        })
    }

    fn offers_calls(&self) -> usize {
        self.offers.load(Ordering::SeqCst)
    }

    fn accept_calls(&self) -> usize {
        self.accepts.load(Ordering::SeqCst)
    }

    fn keepalive_calls(&self) -> usize {
        self.keepalives.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl PoolSource for Counted {
    fn name(&self) -> &str {
        self.pool.name()
    }

    async fn offers(&self) -> Result<Vec<PoolOffer>, PoolCallError> {
        self.offers.fetch_add(1, Ordering::SeqCst);
        self.pool.offers().await
    }

    async fn offer(&self, id: &str) -> Result<PoolOffer, PoolCallError> {
        self.pool.offer(id).await
    }

    async fn allocs(&self) -> Result<Vec<Alloc>, PoolCallError> {
        self.pool.allocs().await
    }

    async fn accept(&self, offer: &str, request: &AllocNeed) -> Result<Alloc, PoolCallError> {
        self.accepts.fetch_add(1, Ordering::SeqCst);
        self.pool.accept(offer, request).await
    }

    async fn alloc(&self, alloc: &str) -> Result<Alloc, PoolCallError> {
        self.pool.alloc(alloc).await
    }

    async fn keepalive(&self, alloc: &str, interval: Duration) -> Result<AllocKeepaliveResponse, PoolCallError> {
        self.keepalives.fetch_add(1, Ordering::SeqCst);
        self.pool.keepalive(alloc, interval).await
    }

    async fn free(&self, alloc: &str) -> Result<Alloc, PoolCallError> {
        self.pool.free(alloc).await
    }
}

fn quick_options() -> AllocateOptions {
    AllocateOptions {
        backoff: Backoff {
            initial: Duration::from_millis(5),
            factor: 2.0,
            max: Duration::from_millis(40),
            jitter: 0.2,
        },
        ..AllocateOptions::default()
    }
}
