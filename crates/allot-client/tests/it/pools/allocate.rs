//! `allocate` on real daemons: the whole offer or what it asks, and at scale through a caching mux.

use std::sync::Arc;
use std::time::Duration;

use allot_client::pools::{allocate, AllocNeed, AllocateError, AllocateOptions, Mux, PoolSource};

use super::*;

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

    // A pool the daemon does not have: at once (its offers asked for once), not after 6 tries.
    let missing = Counted::new(daemon.pool("nope"));
    let mux = Mux::new();
    mux.add_pool(missing.clone()).unwrap();
    let err = allocate(&mux, &AllocNeed::new(r("cpu=1")), &AllocateOptions::default()).await.unwrap_err();
    assert!(matches!(&err, AllocateError::Offers { failed } if failed[0].error.is_pool_not_found()), "{err}");
    assert_eq!(missing.offers_calls(), 1, "a missing pool is not asked again");

    // A bad request is refused before any call.
    let err = allocate(&roomy, &AllocNeed::new(r("")), &options).await.unwrap_err();
    assert!(matches!(err, AllocateError::InvalidRequest(_)), "{err}");
    // A max below min takes min, as the daemon does.
    let alloc = allocate(&roomy, &AllocNeed::new(r("cpu=2")).with_max(r("cpu=1")), &options).await.unwrap();
    assert_eq!(alloc.resources, "cpu=2");
}

/// The shared table's scenario (`testdata/offer_picks.json`, `daemon`), which the Python client's
/// `alloc()` runs too: the same pools, the same pick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_picks_the_pool_the_shared_scenario_names() {
    let table = super::pick::offer_picks();
    let scenario = &table["daemon"];
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path()).await;
    let mux = Mux::new();
    for (name, capacity) in scenario["pools"].as_object().unwrap() {
        daemon.client.put_pool(name, capacity.as_str().unwrap()).await.unwrap();
        mux.add_pool(Arc::new(daemon.pool(name))).unwrap();
    }
    let request = AllocNeed::new(r(scenario["min"].as_str().unwrap()));
    let alloc = allocate(&mux, &request, &quick_options()).await.unwrap();
    assert_eq!(alloc.uri, format!("{}/{}", scenario["pool"].as_str().unwrap(), alloc.id));
    assert_eq!(alloc.resources, scenario["resources"].as_str().unwrap());
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
}
