//! `Mux`: offers by a deadline with the failures reported, and alloc URIs routed by their pool.

use std::sync::Arc;
use std::time::Duration;

use allot_client::pools::{
    allocate, AllocNeed, AllocateOptions, DaemonPool, Mux, PoolCallError, PoolOffer, PoolSource,
};
use tokio::time::Instant;

use super::*;

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
    // Its calls time out only after a minute: long past the wait the mux is given.
    let silent_client = Client::new(&format!("http://{}", silent.local_addr().unwrap()))
        .unwrap()
        .with_request_timeout(Duration::from_secs(60));
    mux.add_pool(Arc::new(DaemonPool::new(silent_client, "silent").unwrap())).unwrap();
    assert_eq!(mux.pool_names(), ["a1", "a2", "b1", "dead", "silent"]);
    let err = mux.add_pool(Arc::new(b.pool("a1"))).unwrap_err();
    assert!(matches!(err, PoolCallError::DuplicatePool { .. }), "{err}");

    let started = Instant::now();
    // Long enough for a real daemon's answer on a machine slow at times.
    let report = mux.offers(Duration::from_secs(2)).await;
    let took = started.elapsed();
    // The silent pool never answers: waiting for it would take its calls' minute.
    assert!(took < Duration::from_secs(30), "stragglers are not waited for: {took:?}");
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

    // One offer by its URI; the allocs of every pool, the broken ones reported.
    assert_eq!(mux.offer("a1/1").await.unwrap().available, r("cpu=2"));
    assert_eq!(mux.offer("a2/1").await.unwrap().available, r("cpu=1"), "what the alloc left");
    let err = mux.offer("a1/2").await.unwrap_err();
    assert_eq!(err.code(), Some("offer_not_found"), "{err}");
    let err = mux.offer("dead/1").await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    let report = mux.allocs(Duration::from_secs(2)).await;
    let uris: Vec<&str> = report.allocs.iter().map(|a| a.uri.as_str()).collect();
    assert_eq!(uris, [alloc.uri.as_str()]);
    assert_eq!(report.asked, 5);
    assert_eq!(report.failed.iter().map(|f| f.pool.as_str()).collect::<Vec<_>>(), ["dead"]);
    assert_eq!(report.timed_out, ["silent"]);
    assert!(!report.is_complete());

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

/// Caching turned on and off at run time (Reflow's `SetCaching`): on, the pools' offers come from
/// their caches; off, every call goes to the pools again; the pools stay the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mux_caching_is_turned_on_and_off_at_run_time() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path()).await;
    daemon.put_pools(["x".to_owned()], "cpu=2").await;
    let mux = Mux::new();
    let x = Counted::new(daemon.pool("x"));
    mux.add_pool(x.clone()).unwrap();
    async fn asked(mux: &Mux) -> usize {
        mux.offers(Duration::from_secs(5)).await.offers.len()
    }
    assert_eq!((asked(&mux).await, asked(&mux).await), (1, 1));
    assert_eq!(x.offers_calls(), 2, "without caching every call asks the pool");

    mux.set_caching(Some(Duration::from_secs(3600)));
    assert_eq!(mux.caching(), Some(Duration::from_secs(3600)));
    assert_eq!((asked(&mux).await, asked(&mux).await), (1, 1));
    assert_eq!(x.offers_calls(), 3, "cached: asked once");
    assert!(mux.caching_pool("x").is_some());
    // An offer read through the cache is what the cache holds.
    assert_eq!(mux.offer("x/1").await.unwrap().available, r("cpu=2"));
    assert_eq!(x.offers_calls(), 3);

    mux.set_caching(None);
    assert_eq!(mux.caching(), None);
    assert!(mux.caching_pool("x").is_none());
    assert_eq!(asked(&mux).await, 1);
    assert_eq!(x.offers_calls(), 4, "off again: the pool is asked");
    assert_eq!(mux.pool_names(), ["x"]);
}
