//! `spawn_keepalive`: an alloc kept alive, transient errors retried within the lease, and a lost
//! alloc reported.

use std::sync::Arc;
use std::time::Duration;

use allot_client::pools::KeepaliveStatus;
use allot_client::pools::{
    allocate, spawn_keepalive, AllocNeed, Backoff, DaemonPool, KeepaliveOptions, LostReason, Mux, PoolOffer, PoolSet,
    PoolSource,
};
use tokio::sync::watch;
use tokio::time::Instant;

use super::*;

/// Waits until the keepalive task behind `status` has ended (its status's sender is dropped
/// with it): after that it makes no call.
async fn ended(mut status: watch::Receiver<KeepaliveStatus>) {
    let closed = async { while status.changed().await.is_ok() {} };
    tokio::time::timeout(Duration::from_secs(60), closed).await.expect("the keepalive task ended within 60 s");
}

/// Waits until `status` has counted `renewals` renewals; fails at once if the alloc is lost.
async fn renewed(status: &watch::Receiver<KeepaliveStatus>, renewals: u64) {
    let what = format!("{renewals} renewals");
    until(&what, async || {
        let now = status.borrow();
        now.renewals >= renewals || now.lost.is_some()
    })
    .await;
    let now = status.borrow();
    assert!(now.lost.is_none(), "lost before {renewals} renewals: {now:?}");
}

fn fast_keepalive(lease_ms: u64, offset_ms: u64) -> KeepaliveOptions {
    KeepaliveOptions {
        lease: Duration::from_millis(lease_ms),
        offset: Duration::from_millis(offset_ms),
        // Generous: a loaded machine answers slowly, and each test's leases leave room for it.
        call_timeout: Duration::from_secs(2),
        retry: Backoff {
            initial: Duration::from_millis(50),
            factor: 1.5,
            max: Duration::from_millis(100),
            jitter: 0.0,
        },
        retries: 5,
    }
}

/// 10 s leases renewed every 150 ms (9.85 s before they end) keep an alloc alive for nine lease
/// lengths of the daemon's clock, which the test moves by 9.85 s after each renewal; once the
/// keepalive stops, the lease lapses. (The client's own clock is real: a long lease lets a slow
/// machine's calls be slow.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_keeps_an_alloc_alive_past_several_leases() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let daemon = Daemon::start_on(dir.path(), &clock).await;
    daemon.client.put_pool("w", "cpu=4").await.unwrap();
    let source = Counted::new(daemon.pool("w"));
    let mux = Arc::new(Mux::new());
    mux.add_pool(source.clone()).unwrap();
    let alloc = mux.accept(&PoolOffer::new("w", "1", r("cpu=4")), &AllocNeed::new(r("cpu=1"))).await.unwrap();

    let started = Instant::now();
    let handle = spawn_keepalive(mux.clone(), &alloc, fast_keepalive(10_000, 9_850));
    let status = handle.subscribe();
    for renewals in 1..=10 {
        renewed(&status, renewals).await;
        clock.advance(Duration::from_millis(9_850));
    }
    let status = handle.status();
    assert!(status.lost.is_none(), "{:?}", status.lost);
    assert_eq!(status.granted, Some(Duration::from_millis(10_000)));
    // One at once, then one every 150 ms at most (plus the call's own time): never sooner.
    let most = started.elapsed().as_millis() / 150 + 1;
    assert!(u128::from(status.renewals) <= most, "{} renewals, at most {most}: {status:?}", status.renewals);
    assert_eq!(status.calls as usize, source.keepalive_calls());
    let seen = daemon.client.alloc("w", &alloc.id).await.unwrap();
    assert!(seen.expires_in_ms.unwrap() > 0 && seen.last_keepalive_ms_ago.unwrap() < 10_000, "{seen:?}");

    let task = handle.subscribe();
    handle.stop();
    ended(task.clone()).await;
    assert_eq!(task.borrow().calls as usize, source.keepalive_calls(), "stopped: no call after the last counted");
    clock.advance(Duration::from_millis(10_100));
    let seen = daemon.client.alloc("w", &alloc.id).await.unwrap();
    assert!(seen.expires_in_ms.unwrap() < 0, "the lease lapsed without keepalives: {seen:?}");

    // Dropping the handle stops it too.
    let before = source.keepalive_calls();
    let handle = spawn_keepalive(mux.clone(), &alloc, fast_keepalive(3000, 100));
    let task = handle.subscribe();
    renewed(&task, 1).await;
    let seen = daemon.client.alloc("w", &alloc.id).await.unwrap();
    assert!(seen.expires_in_ms.unwrap() > 0, "revived: the alloc was lapsed but not reclaimed: {seen:?}");
    drop(handle);
    ended(task.clone()).await;
    assert_eq!(
        before + task.borrow().calls as usize,
        source.keepalive_calls(),
        "dropped: no call after the last counted"
    );
}

/// Someone else frees the alloc: the next keepalive gets 409 `alloc_ended`, the owner is told at
/// once, and no more calls are made. (Renewals every second, 29 s before the lease ends: a slow
/// machine may renew once more before the alloc is freed, never lose the lease for it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_stops_at_once_when_the_alloc_is_freed_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let daemon = Daemon::start_on(dir.path(), &clock).await;
    daemon.client.put_pool("w", "cpu=4").await.unwrap();
    let source = Counted::new(daemon.pool("w"));
    let alloc = source.accept("1", &AllocNeed::new(r("cpu=1"))).await.unwrap();
    let handle = spawn_keepalive(source.clone(), &alloc, fast_keepalive(30_000, 29_000));
    let task = handle.subscribe();
    renewed(&task, 1).await;
    // Every call so far renewed.
    assert_eq!(handle.status().renewals as usize, source.keepalive_calls());

    daemon.client.free_alloc("w", &alloc.id).await.unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(60), handle.lost()).await.unwrap();
    match &lost {
        LostReason::Gone(err) => assert_eq!(err.code(), Some("alloc_ended"), "{err}"),
        other => panic!("expected Gone, got {other}"),
    }
    // Told at the next renewal, with no retries of a fatal error.
    let renewals = handle.status().renewals as usize;
    assert_eq!(source.keepalive_calls(), renewals + 1, "no retries of a fatal error");
    ended(task).await;
    assert_eq!(source.keepalive_calls(), renewals + 1, "stopped");

    // An unknown alloc is just as final.
    let mut ghost = alloc.clone();
    ghost.uri = "w/00000000000000ff".to_owned();
    let handle = spawn_keepalive(source.clone(), &ghost, fast_keepalive(300, 100));
    let lost = tokio::time::timeout(Duration::from_secs(60), handle.lost()).await.unwrap();
    assert!(matches!(&lost, LostReason::Gone(err) if err.code() == Some("alloc_not_found")), "{lost}");
}

/// When the granted lease is not longer than the offset, the loop sleeps half the lease instead
/// of renewing back to back (Reflow's loop spun without sleeping).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_never_busy_loops_when_the_lease_is_shorter_than_the_offset() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let daemon = Daemon::start_on(dir.path(), &clock).await;
    daemon.client.put_pool("w", "cpu=4").await.unwrap();
    let source = Counted::new(daemon.pool("w"));
    let alloc = source.accept("1", &AllocNeed::new(r("cpu=1"))).await.unwrap();
    let started = Instant::now();
    let handle = spawn_keepalive(source.clone(), &alloc, fast_keepalive(1000, 1500));
    renewed(&handle.subscribe(), 3).await;
    let calls = source.keepalive_calls();
    // One at once, then one every 500 ms at most (plus the call's own time): a busy loop would
    // make thousands. Only an upper bound: a slow machine makes fewer, never more.
    let most = started.elapsed().as_millis() / 500 + 1;
    assert!(calls as u128 <= most, "{calls} keepalives, at most {most} in {:?}", started.elapsed());
    let status = handle.status();
    assert!(status.lost.is_none() && status.granted == Some(Duration::from_millis(1000)), "{status:?}");
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
    renewed(&short.subscribe(), 1).await;
    renewed(&long.subscribe(), 1).await;
    let lease_ends = short.status().lease_ends.unwrap();
    assert_eq!((short.status().renewals, long.status().renewals), (1, 1));
    daemon.shutdown().await;

    let lost = tokio::time::timeout(Duration::from_secs(60), short.lost()).await.unwrap();
    let now = Instant::now();
    match &lost {
        LostReason::GaveUp { tries, lease_ended: true, last_error } => {
            assert!(last_error.is_retryable(), "{last_error}");
            // Renewal at +400 ms; retries after 50 and 75 ms; the next wait (112 ms) would pass the end.
            assert!((2..=4).contains(tries), "{lost}");
        }
        other => panic!("expected GaveUp at the lease's end, got {other}"),
    }
    // It retried for as long as the lease allowed: it gave up only when the next wait (at most
    // 100 ms) would pass the end (`lease_ended`), so not sooner than 100 ms before it.
    assert!(now + Duration::from_millis(100) >= lease_ends, "gave up {:?} before the lease's end", lease_ends - now);

    let lost = tokio::time::timeout(Duration::from_secs(60), long.lost()).await.unwrap();
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
