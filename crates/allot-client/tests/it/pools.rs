//! The client-side pool machinery (`allot_client::pools`) against real daemons in-process: each
//! daemon is `allot_server::run` on 127.0.0.1 over an embedded store in a temporary directory.
//! The pick order and the whole-offer rule are also tested as pure functions.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use allot_client::pools::{
    allocate, amount_to_take, pick_n, spawn_keepalive, AllocNeed, AllocateError, AllocateOptions, Backoff, CachingPool,
    DaemonPool, KeepaliveOptions, LostReason, Mux, PoolCallError, PoolOffer, PoolSet, PoolSource, Resources,
    SizeWeights,
};
use allot_client::{Alloc, AllocKeepaliveResponse, Client};
use allot_store::{EmbeddedConfig, EmbeddedStore, Store};
use async_trait::async_trait;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

// ---- Harness ---------------------------------------------------------------------------------

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

    async fn start_at(dir: &Path, addr: SocketAddr) -> Daemon {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::open(&EmbeddedConfig::new(dir.to_owned())).unwrap());
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

// ---- pickN and the whole-offer rule (pure) -----------------------------------------------------

/// Reflow's `small = {mem:10, cpu:1, disk:20}` (mem and disk in bytes) scaled by `factor`.
fn small(factor: f64) -> Resources {
    let scaled = |milli: u64| (milli as f64 * factor).round() as u64;
    Resources::new()
        .with_milli("mem", scaled(10_000))
        .with_milli("cpu", scaled(1000))
        .with_milli("disk", scaled(20_000))
}

fn medium(factor: f64) -> Resources {
    small(2.0 * factor)
}

fn large(factor: f64) -> Resources {
    small(4.0 * factor)
}

fn offers_of(resources: &[Resources]) -> Vec<PoolOffer> {
    resources.iter().enumerate().map(|(i, r)| PoolOffer::new(format!("p{i}"), "1", r.clone())).collect()
}

/// Reflow's `TestPickN`, all eight cases. `SizeWeights::default()` reproduces Reflow's
/// `ScaledDistance` here: every offer is a multiple of `small`, whose 10 bytes of mem (over 8 GiB)
/// and 20 bytes of disk (over 256 GiB) add a negligible amount, in proportion to the cpu; so the
/// order is the cpu distance's, as in Reflow.
#[test]
fn pick_n_orders_offers_like_reflow() {
    let weights = SizeWeights::default();
    // A table of cases: its type says what each column is, once.
    #[allow(clippy::type_complexity)]
    let cases: Vec<(Resources, Resources, Vec<Resources>, Vec<(usize, Vec<Resources>)>)> = vec![
        (large(1.0), large(1.2), vec![medium(1.0), medium(1.2)], vec![(2, vec![])]),
        (
            medium(0.9),
            medium(1.2),
            vec![large(1.0), medium(1.0), small(1.0)],
            vec![(2, vec![large(1.0), medium(1.0)]), (1, vec![large(1.0)])],
        ),
        (
            large(0.9),
            large(1.2),
            vec![large(1.0), small(1.0), medium(1.0), small(1.0), large(1.1)],
            vec![(2, vec![large(1.1), large(1.0)]), (4, vec![large(1.1), large(1.0)])],
        ),
        (
            medium(0.9),
            medium(1.2),
            vec![small(1.5), medium(1.1), large(1.0), small(1.0), large(1.0), medium(1.0)],
            vec![(2, vec![large(1.0), large(1.0)]), (4, vec![large(1.0), large(1.0), medium(1.1), medium(1.0)])],
        ),
        (
            medium(1.2),
            large(1.2),
            vec![large(1.0), medium(1.0), small(1.0), medium(1.1), large(1.1)],
            vec![(1, vec![large(1.1)]), (3, vec![large(1.1), large(1.0)])],
        ),
        (
            medium(1.0),
            large(1.0),
            vec![medium(1.1), medium(1.2), medium(1.3), large(1.0), large(1.1)],
            vec![(1, vec![large(1.0)]), (2, vec![large(1.0), large(1.1)])],
        ),
        (
            medium(0.9),
            large(1.0),
            vec![medium(1.0), medium(1.0), medium(1.0), medium(1.0), large(1.1)],
            vec![(2, vec![large(1.1), medium(1.0)]), (4, vec![large(1.1), medium(1.0), medium(1.0), medium(1.0)])],
        ),
        (
            medium(0.9),
            large(1.0),
            vec![
                small(1.0),
                small(1.5),
                small(1.7),
                medium(1.0),
                medium(1.0),
                medium(1.3),
                medium(1.8),
                large(1.1),
                large(1.5),
                large(1.8),
            ],
            vec![
                (2, vec![large(1.1), large(1.5)]),
                (4, vec![large(1.1), large(1.5), large(1.8), medium(1.8)]),
                (50, vec![large(1.1), large(1.5), large(1.8), medium(1.8), medium(1.3), medium(1.0), medium(1.0)]),
            ],
        ),
    ];
    for (i, (min, max, offers, want_by_n)) in cases.into_iter().enumerate() {
        let offers = offers_of(&offers);
        for (n, want) in want_by_n {
            let got: Vec<Resources> =
                pick_n(&offers, n, &min, &max, &weights).into_iter().map(|o| o.available.clone()).collect();
            assert_eq!(got, want, "case {i}, n {n}");
        }
    }
}

/// Unlike Reflow's `ScaledDistance` (cpu and mem only), the distance counts gpu and disk: a
/// cpu-only request goes to the cpu machine before the gpu machine, and to the offer with the
/// disk closest to what it asks.
#[test]
fn pick_n_counts_gpu_and_disk() {
    let weights = SizeWeights::default();
    let offers = offers_of(&[r("cpu=8,mem=32GiB,gpu=4"), r("cpu=8,mem=32GiB")]);
    let got: Vec<&str> =
        pick_n(&offers, 10, &r("cpu=2"), &r("cpu=4"), &weights).into_iter().map(|o| o.pool.as_str()).collect();
    assert_eq!(got, ["p1", "p0"], "the gpu machine last for a cpu-only request");
    let got: Vec<&str> = pick_n(&offers, 10, &r("cpu=2,gpu=1"), &r("cpu=4,gpu=1"), &weights)
        .into_iter()
        .map(|o| o.pool.as_str())
        .collect();
    assert_eq!(got, ["p0"], "only the gpu machine fits a gpu request");

    let offers = offers_of(&[r("cpu=4,disk=4TiB"), r("cpu=4,disk=200GiB"), r("cpu=4,disk=1TiB")]);
    let got: Vec<&str> = pick_n(&offers, 10, &r("cpu=1,disk=100GiB"), &r("cpu=4,disk=100GiB"), &weights)
        .into_iter()
        .map(|o| o.pool.as_str())
        .collect();
    assert_eq!(got, ["p1", "p2", "p0"], "the closest disk first");

    // The weights are configurable: a cpu-heavy offer against a disk-heavy one.
    let offers = offers_of(&[r("cpu=4,disk=1TiB"), r("cpu=16,disk=150GiB")]);
    let (min, max) = (r("cpu=1,disk=100GiB"), r("cpu=4,disk=100GiB"));
    let order = |weights: &SizeWeights| -> Vec<String> {
        pick_n(&offers, 10, &min, &max, weights).into_iter().map(|o| o.pool.clone()).collect()
    };
    assert_eq!(order(&SizeWeights::default()), ["p0", "p1"], "12 spare cpu weigh more than 924 GiB of disk");
    let disk_heavy = SizeWeights::default().with("disk", 16.0 * (1u64 << 30) as f64);
    assert_eq!(order(&disk_heavy), ["p1", "p0"], "with 16 GiB of disk = 1 cpu, the disk waste weighs more");
}

#[test]
fn whole_offer_is_taken_when_the_leftover_would_be_useless() {
    let cases = [
        // (available, min, max, taken)
        ("cpu=4,mem=8GiB", "cpu=2,mem=4GiB", "cpu=4,mem=7GiB", "cpu=4,mem=8GiB"), // no cpu left
        ("cpu=8,mem=4GiB", "cpu=1,mem=4GiB", "cpu=1,mem=4GiB", "cpu=8,mem=4GiB"), // no mem left
        (
            "cpu=8,mem=32GiB,disk=100GB",
            "cpu=1,mem=1GiB,disk=100GB",
            "cpu=1,mem=1GiB,disk=100GB",
            "cpu=8,mem=32GiB,disk=100GB",
        ),
        ("cpu=8,mem=32GiB", "cpu=2,mem=4GiB", "cpu=2,mem=4GiB", "cpu=2,mem=4GiB"), // useful leftover
        ("cpu=8,mem=32GiB", "cpu=2,mem=4GiB", "cpu=16,mem=4GiB", "cpu=8,mem=32GiB"), // max capped: no cpu left
        // An offer without disk: disk is not counted.
        ("cpu=8,mem=32GiB", "cpu=1,mem=1GiB,disk=0", "cpu=1,mem=1GiB", "cpu=1,mem=1GiB"),
        // Only cpu, mem and disk make a leftover useless; no gpu left is fine.
        ("cpu=8,mem=32GiB,gpu=1", "cpu=1,mem=1GiB,gpu=1", "cpu=1,mem=1GiB,gpu=1", "cpu=1,gpu=1,mem=1GiB"),
    ];
    for (available, min, max, taken) in cases {
        assert_eq!(amount_to_take(&r(available), &r(min), &r(max)), r(taken), "{available} {min} {max}");
    }
}

// ---- allocate ----------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_takes_the_whole_offer_or_what_it_asks_on_a_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path()).await;
    daemon.client.put_pool("tight", "cpu=4,mem=8GiB").await.unwrap();
    daemon.client.put_pool("roomy", "cpu=8,mem=32GiB").await.unwrap();

    let tight = daemon.pool("tight");
    let request = AllocNeed::new(r("cpu=2,mem=4GiB")).with_max(r("cpu=4,mem=7GiB")).with_owner("me");
    let alloc = allocate(&tight, &request, &quick_options()).await.unwrap();
    assert_eq!(alloc.resources, "cpu=4,mem=8GiB", "no cpu would be left: the whole offer");
    assert_eq!(alloc.owner, "me");

    let roomy = daemon.pool("roomy");
    let alloc = allocate(&roomy, &AllocNeed::new(r("cpu=2,mem=4GiB")), &quick_options()).await.unwrap();
    assert_eq!(alloc.resources, "cpu=2,mem=4GiB");
    assert_eq!(alloc.uri, format!("roomy/{}", alloc.id));

    // Nothing fits: an error that says how many tries and why.
    let options = AllocateOptions { tries: 3, ..quick_options() };
    let err = allocate(&roomy, &AllocNeed::new(r("cpu=64")), &options).await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    let text = err.to_string();
    assert!(text.contains("after 3 tries") && text.contains("1 offers, 0 fit"), "{text}");

    // A pool the daemon does not have: at once, not after 6 tries.
    let started = Instant::now();
    let err =
        allocate(&daemon.pool("nope"), &AllocNeed::new(r("cpu=1")), &AllocateOptions::default()).await.unwrap_err();
    assert!(matches!(&err, AllocateError::Offers { failed } if failed[0].error.is_pool_not_found()), "{err}");
    assert!(started.elapsed() < Duration::from_millis(500));

    // A bad request is refused before any call.
    let err = allocate(&roomy, &AllocNeed::new(r("")), &options).await.unwrap_err();
    assert!(matches!(err, AllocateError::InvalidRequest(_)), "{err}");
    // A max below min takes min, as the daemon does.
    let alloc = allocate(&roomy, &AllocNeed::new(r("cpu=2")).with_max(r("cpu=1")), &options).await.unwrap();
    assert_eq!(alloc.resources, "cpu=2");
}

/// Reflow's `TestAllocateScale` and `TestMuxScaleWithCaching` on real daemons: 100 pools on two
/// daemons, each with room for two allocs; 150 concurrent allocates through a caching mux, twice
/// (the first round freed through the mux in between). At most 1% fail, and each pool's offers
/// are asked for exactly once, counted both at the source and in the daemons' metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn allocate_at_scale_through_a_caching_mux_asks_each_pool_once_per_cache_period() {
    const POOLS: usize = 100;
    const ALLOCS: usize = 150;
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let daemons = [Daemon::start(dir_a.path()).await, Daemon::start(dir_b.path()).await];
    let mut counted = Vec::new();
    for i in 0..POOLS {
        let daemon = &daemons[i % 2];
        let name = format!("pool-{i:03}");
        daemon.put_pools([name.clone()], "cpu=2,mem=2GiB").await;
        counted.push(Counted::new(daemon.pool(&name)));
    }
    let mux = Arc::new(Mux::with_caching(Duration::from_secs(60)));
    mux.set_pools(counted.iter().map(|c| c.clone() as Arc<dyn PoolSource>)).unwrap();
    let served_before: u64 = daemons[0].offers_served().await + daemons[1].offers_served().await;

    let round = |mux: Arc<Mux>| async move {
        let mut tasks = Vec::new();
        for i in 0..ALLOCS {
            let mux = mux.clone();
            tasks.push(tokio::spawn(async move {
                let request = AllocNeed::new(r("cpu=1,mem=1GiB")).with_owner(format!("job-{i}"));
                allocate(&*mux, &request, &AllocateOptions::default()).await
            }));
        }
        let mut allocs = Vec::new();
        let mut failures = Vec::new();
        for task in tasks {
            match task.await.unwrap() {
                Ok(alloc) => allocs.push(alloc),
                Err(err) => failures.push(err.to_string()),
            }
        }
        (allocs, failures)
    };

    let started = Instant::now();
    let (allocs, failures) = round(mux.clone()).await;
    assert!(failures.len() * 100 <= ALLOCS, "{} of {ALLOCS} failed: {failures:?}", failures.len());
    for alloc in &allocs {
        assert_eq!(alloc.resources, "cpu=1,mem=1GiB");
    }
    for pool in &counted {
        assert_eq!(pool.offers_calls(), 1, "{}: one offers call per cache period", pool.name());
        assert!(pool.accept_calls() <= 2, "{}: the cache lets only what fits reach the daemon", pool.name());
    }
    let accepted: usize = counted.iter().map(|c| c.accept_calls()).sum();
    assert_eq!(accepted, allocs.len(), "every accept that reached a daemon succeeded");
    let served: u64 = daemons[0].offers_served().await + daemons[1].offers_served().await;
    assert_eq!(served - served_before, POOLS as u64, "the daemons answered one offers call per pool");

    // Free everything through the mux: the caches get the room back, so the second round needs
    // no new offers call.
    let frees: Vec<_> = allocs
        .iter()
        .map(|alloc| {
            let (mux, uri) = (mux.clone(), alloc.uri.clone());
            tokio::spawn(async move { mux.free(&uri).await.unwrap() })
        })
        .collect();
    for free in frees {
        free.await.unwrap();
    }
    for pool in &counted {
        let cache = mux.caching_pool(pool.name()).unwrap().snapshot();
        assert_eq!(cache.offers[0].available, r("cpu=2,mem=2GiB"), "{}", pool.name());
    }
    let (allocs, failures) = round(mux.clone()).await;
    assert!(failures.len() * 100 <= ALLOCS, "{} of {ALLOCS} failed: {failures:?}", failures.len());
    for pool in &counted {
        assert_eq!(pool.offers_calls(), 1, "{}: still one offers call", pool.name());
    }
    let mut held = 0;
    for daemon in &daemons {
        held += daemon.client.pools().await.unwrap().pools.iter().map(|p| p.allocs).sum::<u64>();
    }
    assert_eq!(held as usize, allocs.len());
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
}

// ---- CachingPool -------------------------------------------------------------------------------

/// Reflow's `TestTrackedOffer`: a medium offer, 10 concurrent small accepts: exactly 2 reach the
/// daemon; each free through the cache gives `small` back. And 20 concurrent `offers` on a cold
/// cache share one call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracked_offer_sends_only_what_fits_and_frees_give_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path()).await;
    daemon.client.put_pool("w", "cpu=2,mem=2GiB").await.unwrap();
    let source = Counted::new(daemon.pool("w"));
    let cache = Arc::new(CachingPool::new(source.clone(), Duration::from_secs(60)));

    let calls: Vec<_> = (0..20)
        .map(|_| {
            let cache = cache.clone();
            tokio::spawn(async move { cache.offers().await.unwrap() })
        })
        .collect();
    for call in calls {
        let offers = call.await.unwrap();
        assert_eq!(offers, [PoolOffer::new("w", "1", r("cpu=2,mem=2GiB"))]);
    }
    assert_eq!(source.offers_calls(), 1, "concurrent callers share one refresh");

    let accepts: Vec<_> = (0..10)
        .map(|_| {
            let cache = cache.clone();
            tokio::spawn(async move { cache.accept("1", &AllocNeed::new(r("cpu=1,mem=1GiB"))).await })
        })
        .collect();
    let mut allocs = Vec::new();
    for accept in accepts {
        match accept.await.unwrap() {
            Ok(alloc) => allocs.push(alloc),
            Err(err) => assert!(matches!(err, PoolCallError::OfferExpired { local: true, .. }), "{err}"),
        }
    }
    assert_eq!((allocs.len(), source.accept_calls()), (2, 2), "exactly two accepts reach the daemon");
    let snapshot = cache.snapshot();
    assert_eq!(snapshot.offers[0].available, Resources::new());
    assert!(!snapshot.offers[0].outdated);
    assert!(cache.offers().await.unwrap().is_empty(), "an exhausted offer is not offered");

    cache.free(&allocs[0].id).await.unwrap();
    assert_eq!(cache.snapshot().offers[0].available, r("cpu=1,mem=1GiB"));
    cache.free(&allocs[1].id).await.unwrap();
    assert_eq!(cache.snapshot().offers[0].available, r("cpu=2,mem=2GiB"));
    // Freeing again gives nothing back twice.
    cache.free(&allocs[1].id).await.unwrap();
    assert_eq!(cache.snapshot().offers[0].available, r("cpu=2,mem=2GiB"));
    assert_eq!(source.offers_calls(), 1);
}

/// Reflow's `TestCachingPoolInvalidate`: someone else takes room directly; the accept through
/// the cache fails with the daemon's offer_expired, the offer is outdated, and the next `offers`
/// refreshes and shows what is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_offer_is_marked_outdated_and_the_next_offers_refreshes() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path()).await;
    daemon.client.put_pool("w", "cpu=4,mem=4GiB").await.unwrap();
    let source = Counted::new(daemon.pool("w"));
    let cache = CachingPool::new(source.clone(), Duration::from_secs(60));
    assert_eq!(cache.offers().await.unwrap()[0].available, r("cpu=4,mem=4GiB"));

    let other = daemon.pool("w");
    other.accept("1", &AllocNeed::new(r("cpu=1,mem=1GiB"))).await.unwrap();

    let err = cache.accept("1", &AllocNeed::new(r("cpu=4,mem=4GiB"))).await.unwrap_err();
    assert!(matches!(err, PoolCallError::OfferExpired { local: false, .. }), "{err}");
    assert_eq!(source.accept_calls(), 1);
    let snapshot = cache.snapshot();
    assert!(snapshot.offers[0].outdated && !snapshot.fresh);
    assert_eq!(snapshot.offers[0].available, r("cpu=4,mem=4GiB"), "the reservation was given back");

    // An outdated offer is refused locally until the refresh.
    let err = cache.accept("1", &AllocNeed::new(r("cpu=1"))).await.unwrap_err();
    assert!(matches!(err, PoolCallError::OfferExpired { local: true, .. }), "{err}");
    assert_eq!(source.accept_calls(), 1);

    assert_eq!(cache.offers().await.unwrap()[0].available, r("cpu=3,mem=3GiB"));
    assert_eq!(source.offers_calls(), 2, "refreshed once");
    let alloc = cache.accept("1", &AllocNeed::new(r("cpu=3,mem=3GiB"))).await.unwrap();
    assert_eq!(alloc.resources, "cpu=3,mem=3GiB");
    assert_eq!(source.offers_calls(), 2);
}

/// A transient error (the daemon is down) changes nothing in the cache: not outdated, nothing
/// taken, offers still served from it; once a daemon is back on the same data and port, the
/// same cached offer is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_error_does_not_invalidate_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::start(dir.path()).await;
    daemon.client.put_pool("w", "cpu=4,mem=4GiB").await.unwrap();
    let source = Counted::new(daemon.pool("w"));
    let cache = CachingPool::new(source.clone(), Duration::from_secs(60));
    cache.offers().await.unwrap();
    daemon.shutdown().await;

    let err = cache.accept("1", &AllocNeed::new(r("cpu=1"))).await.unwrap_err();
    assert!(err.is_retryable() && !err.is_offer_expired(), "{err}");
    let snapshot = cache.snapshot();
    assert!(snapshot.fresh && !snapshot.offers[0].outdated);
    assert_eq!(snapshot.offers[0].available, r("cpu=4,mem=4GiB"));
    assert_eq!(cache.offers().await.unwrap()[0].available, r("cpu=4,mem=4GiB"));
    assert_eq!(source.offers_calls(), 1, "served from the cache");

    let _daemon = daemon.restart().await;
    let alloc = cache.accept("1", &AllocNeed::new(r("cpu=1"))).await.unwrap();
    assert_eq!(alloc.resources, "cpu=1");
    assert_eq!(cache.snapshot().offers[0].available, r("cpu=3,mem=4GiB"));
    assert_eq!(source.offers_calls(), 1);
}

/// A caching pool in front of nothing: the refresh fails with a retryable error that every
/// concurrent caller shares, and the (empty) cache is left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_refresh_is_shared_and_leaves_the_cache_alone() {
    let source = Counted::new(DaemonPool::new(client_of(closed_port()), "w").unwrap());
    let cache = Arc::new(CachingPool::new(source.clone(), Duration::from_secs(60)));
    let calls: Vec<_> = (0..10)
        .map(|_| {
            let cache = cache.clone();
            tokio::spawn(async move { cache.offers().await })
        })
        .collect();
    for call in calls {
        let err = call.await.unwrap().unwrap_err();
        assert!(err.is_retryable(), "{err}");
    }
    assert!(source.offers_calls() < 10, "waiting callers share the failed refresh: {}", source.offers_calls());
    let snapshot = cache.snapshot();
    assert_eq!((snapshot.generation, snapshot.offers.len(), snapshot.fresh), (0, 0, false));
}

/// The TTL applies to a non-empty cache too (Reflow's applied only to an empty one): after it,
/// `offers` asks again and sees room taken or freed by others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_expiry_refreshes_even_a_non_empty_cache() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path()).await;
    daemon.client.put_pool("w", "cpu=4").await.unwrap();
    let source = Counted::new(daemon.pool("w"));
    let ttl = Duration::from_millis(200);
    let cache = CachingPool::new(source.clone(), ttl);
    assert_eq!(cache.offers().await.unwrap()[0].available, r("cpu=4"));

    let other = daemon.pool("w");
    let taken = other.accept("1", &AllocNeed::new(r("cpu=4"))).await.unwrap();
    assert_eq!(cache.offers().await.unwrap()[0].available, r("cpu=4"), "cached");
    assert_eq!(source.offers_calls(), 1);

    tokio::time::sleep(ttl + Duration::from_millis(20)).await;
    assert!(cache.offers().await.unwrap().is_empty(), "refreshed: nothing free");
    assert_eq!(source.offers_calls(), 2);

    // An empty answer is cached for the TTL too, and expires.
    other.free(&taken.id).await.unwrap();
    assert!(cache.offers().await.unwrap().is_empty());
    assert_eq!(source.offers_calls(), 2);
    tokio::time::sleep(ttl + Duration::from_millis(20)).await;
    assert_eq!(cache.offers().await.unwrap()[0].available, r("cpu=4"));
    assert_eq!(source.offers_calls(), 3);
}

// ---- Mux ---------------------------------------------------------------------------------------

/// Two daemons, a pool on a closed port and a pool whose daemon never answers: `offers` answers
/// by its deadline with the healthy pools' offers and reports the other two; alloc URIs are
/// routed by their pool part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mux_routes_by_uri_and_reports_failing_and_slow_pools() {
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (Daemon::start(dir_a.path()).await, Daemon::start(dir_b.path()).await);
    a.client.put_pool("a1", "cpu=2").await.unwrap();
    a.client.put_pool("a2", "cpu=4").await.unwrap();
    b.client.put_pool("b1", "cpu=8").await.unwrap();
    // Accepts connections (the kernel's backlog) but never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();

    let mux = Arc::new(Mux::new());
    assert_eq!(mux.add_daemon(&a.client).await.unwrap(), 2);
    mux.add_pool(Arc::new(b.pool("b1"))).unwrap();
    mux.add_pool(Arc::new(DaemonPool::new(client_of(closed_port()), "dead").unwrap())).unwrap();
    mux.add_pool(Arc::new(DaemonPool::new(client_of(silent.local_addr().unwrap()), "silent").unwrap())).unwrap();
    assert_eq!(mux.pool_names(), ["a1", "a2", "b1", "dead", "silent"]);
    let err = mux.add_pool(Arc::new(b.pool("a1"))).unwrap_err();
    assert!(matches!(err, PoolCallError::DuplicatePool { .. }), "{err}");

    let started = Instant::now();
    let report = mux.offers(Duration::from_millis(300)).await;
    let took = started.elapsed();
    assert!(took < Duration::from_millis(1000), "stragglers are not waited for: {took:?}");
    let mut got: Vec<(String, String)> =
        report.offers.iter().map(|o| (o.pool.clone(), o.available.to_string())).collect();
    got.sort();
    assert_eq!(got, [("a1".into(), "cpu=2".into()), ("a2".into(), "cpu=4".into()), ("b1".into(), "cpu=8".into())]);
    assert_eq!(report.asked, 5);
    assert_eq!(report.failed.len(), 1);
    assert_eq!(report.failed[0].pool, "dead");
    assert!(report.failed[0].error.is_retryable(), "{}", report.failed[0].error);
    assert_eq!(report.timed_out, ["silent"]);
    assert!(!report.is_complete());

    // Allocation works around the broken pools.
    let request = AllocNeed::new(r("cpu=3")).with_max(r("cpu=3"));
    let options = AllocateOptions { offers_timeout: Duration::from_millis(300), ..quick_options() };
    let alloc = allocate(&*mux, &request, &options).await.unwrap();
    assert_eq!((alloc.pool.as_str(), alloc.resources.as_str()), ("a2", "cpu=3"), "a2 is the tightest fit");

    // URI routing.
    let on_b = mux.accept(&PoolOffer::new("b1", "1", r("cpu=8")), &AllocNeed::new(r("cpu=1"))).await.unwrap();
    assert_eq!(on_b.uri, format!("b1/{}", on_b.id));
    assert_eq!(mux.alloc(&on_b.uri).await.unwrap().id, on_b.id);
    assert_eq!(mux.alloc(&alloc.uri).await.unwrap().resources, "cpu=3");
    let renewed = mux.keepalive(&on_b.uri, Duration::from_secs(60)).await.unwrap();
    assert_eq!(renewed.interval_ms, 60_000);
    assert_eq!(mux.free(&on_b.uri).await.unwrap().ended, Some(allot_client::EndReason::Freed));
    assert_eq!(b.client.pool("b1").await.unwrap().allocs, 0);
    assert_eq!(a.client.pool("a2").await.unwrap().allocs, 1);

    let err = mux.alloc("no-slash").await.unwrap_err();
    assert!(matches!(err, PoolCallError::InvalidUri { .. }) && !err.is_pool_not_found(), "{err}");
    let err = mux.free("zz/00000000000000ff").await.unwrap_err();
    assert!(matches!(err, PoolCallError::UnknownPool { .. }) && err.is_pool_not_found(), "{err}");
    // A pool the mux knows but whose daemon does not know the alloc.
    let err = mux.alloc("a1/00000000000000ff").await.unwrap_err();
    assert_eq!(err.code(), Some("alloc_not_found"), "{err}");
    drop(silent);
}

/// With caching, the caches are kept per pool name across `set_pools` (Reflow threw them away).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mux_caches_survive_set_pools() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path()).await;
    daemon.put_pools(["x".to_owned(), "y".to_owned()], "cpu=1").await;
    let mux = Mux::with_caching(Duration::from_secs(60));
    let (x, y) = (Counted::new(daemon.pool("x")), Counted::new(daemon.pool("y")));
    mux.set_pools([x.clone() as Arc<dyn PoolSource>, y.clone()]).unwrap();
    assert_eq!(mux.offers(Duration::from_secs(5)).await.offers.len(), 2);
    mux.set_pools([x.clone() as Arc<dyn PoolSource>]).unwrap();
    assert_eq!(mux.offers(Duration::from_secs(5)).await.offers.len(), 1);
    assert_eq!(x.offers_calls(), 1, "x kept its cache");
    assert!(mux.caching_pool("y").is_none());
    mux.set_pools([x.clone() as Arc<dyn PoolSource>, y.clone()]).unwrap();
    mux.offers(Duration::from_secs(5)).await;
    assert_eq!((x.offers_calls(), y.offers_calls()), (1, 2), "y's cache was dropped with it");
}

// ---- Keepalive ---------------------------------------------------------------------------------

fn fast_keepalive(lease_ms: u64, offset_ms: u64) -> KeepaliveOptions {
    KeepaliveOptions {
        lease: Duration::from_millis(lease_ms),
        offset: Duration::from_millis(offset_ms),
        call_timeout: Duration::from_millis(200),
        retry: Backoff {
            initial: Duration::from_millis(50),
            factor: 1.5,
            max: Duration::from_millis(100),
            jitter: 0.0,
        },
        retries: 5,
    }
}

/// 300 ms leases renewed 150 ms before they end keep an alloc alive for five lease lengths;
/// once the keepalive stops, the lease lapses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_keeps_an_alloc_alive_past_several_leases() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path()).await;
    daemon.client.put_pool("w", "cpu=4").await.unwrap();
    let source = Counted::new(daemon.pool("w"));
    let mux = Arc::new(Mux::new());
    mux.add_pool(source.clone()).unwrap();
    let alloc = mux.accept(&PoolOffer::new("w", "1", r("cpu=4")), &AllocNeed::new(r("cpu=1"))).await.unwrap();

    let handle = spawn_keepalive(mux.clone(), &alloc, fast_keepalive(300, 150));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let status = handle.status();
    assert!(status.lost.is_none(), "{:?}", status.lost);
    assert_eq!(status.granted, Some(Duration::from_millis(300)));
    // One at once, then one every 150 ms (plus the call's own time).
    assert!((5..=11).contains(&status.renewals), "{status:?}");
    assert_eq!(status.calls as usize, source.keepalive_calls());
    let seen = daemon.client.alloc("w", &alloc.id).await.unwrap();
    assert!(seen.expires_in_ms.unwrap() > 0 && seen.last_keepalive_ms_ago.unwrap() < 300, "{seen:?}");

    handle.stop();
    let calls = source.keepalive_calls();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(source.keepalive_calls(), calls, "stopped");
    let seen = daemon.client.alloc("w", &alloc.id).await.unwrap();
    assert!(seen.expires_in_ms.unwrap() < 0, "the lease lapsed without keepalives: {seen:?}");

    // Dropping the handle stops it too.
    let handle = spawn_keepalive(mux.clone(), &alloc, fast_keepalive(300, 100));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(handle.status().renewals >= 1, "revived: the alloc was lapsed but not reclaimed");
    drop(handle);
    let calls = source.keepalive_calls();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(source.keepalive_calls(), calls);
}

/// Someone else frees the alloc: the next keepalive gets 409 `alloc_ended`, the owner is told at
/// once, and no more calls are made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_stops_at_once_when_the_alloc_is_freed_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path()).await;
    daemon.client.put_pool("w", "cpu=4").await.unwrap();
    let source = Counted::new(daemon.pool("w"));
    let alloc = source.accept("1", &AllocNeed::new(r("cpu=1"))).await.unwrap();
    let handle = spawn_keepalive(source.clone(), &alloc, fast_keepalive(300, 100));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(handle.status().renewals, 1);

    daemon.client.free_alloc("w", &alloc.id).await.unwrap();
    let started = Instant::now();
    let lost = tokio::time::timeout(Duration::from_secs(2), handle.lost()).await.unwrap();
    assert!(started.elapsed() < Duration::from_millis(600), "at the next renewal: {:?}", started.elapsed());
    match &lost {
        LostReason::Gone(err) => assert_eq!(err.code(), Some("alloc_ended"), "{err}"),
        other => panic!("expected Gone, got {other}"),
    }
    assert_eq!(source.keepalive_calls(), 2, "no retries of a fatal error");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(source.keepalive_calls(), 2, "stopped");

    // An unknown alloc is just as final.
    let mut ghost = alloc.clone();
    ghost.uri = "w/00000000000000ff".to_owned();
    let handle = spawn_keepalive(source.clone(), &ghost, fast_keepalive(300, 100));
    let lost = tokio::time::timeout(Duration::from_secs(2), handle.lost()).await.unwrap();
    assert!(matches!(&lost, LostReason::Gone(err) if err.code() == Some("alloc_not_found")), "{lost}");
}

/// When the granted lease is not longer than the offset, the loop sleeps half the lease instead
/// of renewing back to back (Reflow's loop spun without sleeping).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_never_busy_loops_when_the_lease_is_shorter_than_the_offset() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path()).await;
    daemon.client.put_pool("w", "cpu=4").await.unwrap();
    let source = Counted::new(daemon.pool("w"));
    let alloc = source.accept("1", &AllocNeed::new(r("cpu=1"))).await.unwrap();
    let handle = spawn_keepalive(source.clone(), &alloc, fast_keepalive(200, 300));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let calls = source.keepalive_calls();
    // One every 100 ms (plus the call's own time): about 10 in a second; a busy loop would make
    // thousands. The lower bound leaves room for a slow, loaded machine.
    assert!((4..=12).contains(&calls), "{calls} keepalives in 1 s");
    let status = handle.status();
    assert!(status.lost.is_none() && status.granted == Some(Duration::from_millis(200)), "{status:?}");
}

/// The daemon goes away: transient errors are retried with backoff, but only while the lease
/// lasts; with a long lease the retries run out first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_retries_transient_errors_within_the_lease() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::start(dir.path()).await;
    daemon.client.put_pool("w", "cpu=4").await.unwrap();
    let source = Counted::new(daemon.pool("w"));
    let short = source.accept("1", &AllocNeed::new(r("cpu=1"))).await.unwrap();
    let long = source.accept("1", &AllocNeed::new(r("cpu=1"))).await.unwrap();
    let options = KeepaliveOptions { retries: 20, ..fast_keepalive(600, 200) };
    let short = spawn_keepalive(source.clone(), &short, options);
    // Renewed after 0.5 s; with 10 ms retries, six tries take about 0.25 s.
    let mut long_options = fast_keepalive(10_000, 9_500);
    long_options.retry =
        Backoff { initial: Duration::from_millis(10), factor: 1.5, max: Duration::from_secs(1), jitter: 0.2 };
    let long = spawn_keepalive(source.clone(), &long, long_options);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let lease_ends = short.status().lease_ends.unwrap();
    assert_eq!((short.status().renewals, long.status().renewals), (1, 1));
    daemon.shutdown().await;

    let lost = tokio::time::timeout(Duration::from_secs(3), short.lost()).await.unwrap();
    let now = Instant::now();
    match &lost {
        LostReason::GaveUp { tries, lease_ended: true, last_error } => {
            assert!(last_error.is_retryable(), "{last_error}");
            // Renewal at +400 ms; retries after 50 and 75 ms; the next wait (112 ms) would pass the end.
            assert!((2..=4).contains(tries), "{lost}");
        }
        other => panic!("expected GaveUp at the lease's end, got {other}"),
    }
    assert!(now <= lease_ends + Duration::from_millis(50), "gave up by the lease's end: {:?} late", now - lease_ends);

    let lost = tokio::time::timeout(Duration::from_secs(3), long.lost()).await.unwrap();
    assert!(matches!(lost, LostReason::GaveUp { tries: 6, lease_ended: false, .. }), "{lost}");
}

/// A single pool is a `PoolSet` of one: URIs must name it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_pool_is_a_pool_set() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path()).await;
    daemon.client.put_pool("w", "cpu=4").await.unwrap();
    let pool = daemon.pool("w");
    let report = pool.offers_within(Duration::from_secs(1)).await;
    assert_eq!((report.asked, report.offers.len()), (1, 1));
    let alloc = allocate(&pool, &AllocNeed::new(r("cpu=1")), &quick_options()).await.unwrap();
    assert_eq!(pool.alloc_by_uri(&alloc.uri).await.unwrap().id, alloc.id);
    let err = pool.free_by_uri(&format!("other/{}", alloc.id)).await.unwrap_err();
    assert!(err.is_pool_not_found(), "{err}");
    pool.free_by_uri(&alloc.uri).await.unwrap();
    assert!(DaemonPool::new(daemon.client.clone(), "a/b").is_err());
}
