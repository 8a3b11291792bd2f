//! `CachingPool`: tracked offers, outdated offers refreshed, transient errors that change nothing,
//! shared refreshes and the TTL.

use std::sync::Arc;
use std::time::Duration;

use allot_client::pools::{AllocNeed, CachingPool, DaemonPool, PoolCallError, PoolOffer, PoolSource, Resources};

use super::*;

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

/// A caching pool in front of a server that never answers: the refresh fails with a retryable
/// error that every concurrent caller shares, and the (empty) cache is left as it was. (The
/// server holds each connection a moment: with a closed port the refresh failed so fast that
/// callers under load came one after another and shared nothing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_refresh_is_shared_and_leaves_the_cache_alone() {
    let address = failing_slowly(Duration::from_millis(300)).await;
    let source = Counted::new(DaemonPool::new(client_of(address), "w").unwrap());
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

    until("the cache's TTL passed", async || !cache.snapshot().fresh).await;
    assert!(cache.offers().await.unwrap().is_empty(), "refreshed: nothing free");
    assert_eq!(source.offers_calls(), 2);

    // An empty answer is cached for the TTL too, and expires.
    other.free(&taken.id).await.unwrap();
    assert!(cache.offers().await.unwrap().is_empty());
    assert_eq!(source.offers_calls(), 2);
    until("the cache's TTL passed again", async || !cache.snapshot().fresh).await;
    assert_eq!(cache.offers().await.unwrap()[0].available, r("cpu=4"));
    assert_eq!(source.offers_calls(), 3);
}
