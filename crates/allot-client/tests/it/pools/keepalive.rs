//! `spawn_keepalive`: an alloc kept alive, transient errors retried within the lease, and a lost
//! alloc reported.

use std::sync::Arc;
use std::time::Duration;

use allot_client::pools::{
    allocate, spawn_keepalive, AllocNeed, Backoff, DaemonPool, KeepaliveOptions, LostReason, Mux, PoolOffer, PoolSet,
    PoolSource,
};
use tokio::time::Instant;

use super::*;

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
