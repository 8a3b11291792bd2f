//! The checks of leased resource pools: pools, the offer, allocs, leases, reclaims, idle stops
//! and pages.

use std::sync::Arc;
use std::time::Duration;

use allot_core::pools::{
    AllocId, AllocNotes, AllocRequest, AllocState, CordonOrder, EndReason, PoolError, PoolName, MAX_ALLOC_LABEL_BYTES,
    MAX_ALLOC_METADATA_BYTES,
};
use allot_core::Resources;

use crate::{read_all, PageRequest, Store, StoreError};

use super::Time;

/// Runs every check of leased resource pools against `store`, concurrently (each in its own
/// pools, prefixed `conformance-`).
pub async fn run_pools(store: Arc<dyn Store>, time: &dyn Time) {
    let store_ref = &*store;
    tokio::join!(
        pools_are_created_changed_and_removed(store_ref),
        one_offer_holds_everything_free(store_ref),
        allocs_end_and_say_why(store_ref),
        concurrent_accepts_never_over_allocate(store.clone()),
        pools_and_allocs_page_by_name_and_id(store_ref),
        cordoned_and_occupied_pools(store_ref),
        allocs_carry_their_owners_notes(store_ref),
        quantities_past_2_pow_53_stay_exact(store_ref),
    );
    lapsed_allocs_are_offered_and_reclaimed_when_needed(store_ref, time).await;
    an_idle_pool_stops(store_ref, time).await;
}

fn pool_name(name: &str) -> PoolName {
    PoolName::new(&format!("conformance-{name}")).unwrap()
}

fn res(text: &str) -> Resources {
    text.parse().unwrap()
}

fn wants(min: &str, max: Option<&str>) -> AllocRequest {
    AllocRequest { min: res(min), max: max.map(res), owner: "conformance".into(), ..AllocRequest::default() }
}

async fn pools_are_created_changed_and_removed(store: &dyn Store) {
    let name = pool_name("pools");
    let (created, view) = store.put_pool(name.clone(), res("cpu=2")).await.unwrap();
    assert!(created);
    assert_eq!(view.capacity, res("cpu=2"));
    let (created, view) = store.put_pool(name.clone(), res("cpu=4,mem=1GiB")).await.unwrap();
    assert!(!created);
    assert_eq!(view.capacity, res("cpu=4,mem=1GiB"));
    assert!(read_all(|page| store.pools(page)).await.unwrap().iter().any(|p| p.name == name));
    store.accept(name.clone(), wants("cpu=1", None)).await.unwrap();
    let in_use = store.remove_pool(name.clone(), false).await;
    assert!(matches!(in_use, Err(StoreError::Pools(PoolError::PoolInUse { allocs: 1, .. }))), "{in_use:?}");
    assert_eq!(store.remove_pool(name.clone(), true).await.unwrap(), 1);
    let gone = store.pool(name.clone()).await;
    assert!(matches!(gone, Err(StoreError::Pools(PoolError::PoolNotFound(_)))), "{gone:?}");
}

/// Quantities are exact to the milli-unit up to the largest the API takes: a milli-unit more than
/// the capacity is refused, even past 2^53 (where a double would round them together), and what
/// an alloc leaves is offered to the milli-unit.
async fn quantities_past_2_pow_53_stay_exact(store: &dyn Store) {
    let name = pool_name("exact");
    // `mem` at the largest quantity there is: u64::MAX milli-units, cut to a whole unit.
    let capacity = "cpu=9007199254740992,mem=18446744073709551";
    store.put_pool(name.clone(), res(capacity)).await.unwrap();
    for above in ["cpu=9007199254740993", "cpu=9007199254740992.001"] {
        let refused = store.accept(name.clone(), wants(above, None)).await;
        assert!(matches!(refused, Err(StoreError::Pools(PoolError::ExceedsCapacity { .. }))), "{above}: {refused:?}");
    }
    let taken = "cpu=9007199254740991.999,mem=18446744073709550";
    let alloc = store.accept(name.clone(), wants(taken, None)).await.unwrap();
    assert_eq!(alloc.resources, res(taken));
    let offer = store.offer(name.clone()).await.unwrap().map(|o| o.available);
    assert_eq!(offer, Some(res("cpu=0.001,mem=1")), "what is left, to the milli-unit");
    store.free_alloc(name.clone(), alloc.id).await.unwrap();
    let offer = store.offer(name.clone()).await.unwrap().map(|o| o.available);
    assert_eq!(offer, Some(res(capacity)));
}

async fn cordoned_and_occupied_pools(store: &dyn Store) {
    let name = pool_name("cordon");
    store.put_pool(name.clone(), res("cpu=4")).await.unwrap();
    let alloc = store.accept(name.clone(), wants("cpu=1", None)).await.unwrap();
    // What is occupied is never offered.
    let view = store.occupy_pool(name.clone(), res("cpu=2")).await.unwrap();
    assert_eq!(view.occupied, res("cpu=2"));
    assert_eq!(store.offer(name.clone()).await.unwrap().map(|o| o.available), Some(res("cpu=1")));
    let refused = store.accept(name.clone(), wants("cpu=2", None)).await;
    assert!(matches!(refused, Err(StoreError::Pools(PoolError::OfferExpired { .. }))), "{refused:?}");
    // Cordoned: no offer, no alloc; what is there is kept alive.
    let view = store.cordon_pool(name.clone(), CordonOrder::Cordon).await.unwrap();
    let since = view.cordon.expect("cordoned").since;
    assert_eq!(view.cordon.and_then(|c| c.drain_at), None);
    assert_eq!(store.offer(name.clone()).await.unwrap(), None);
    let refused = store.accept(name.clone(), wants("cpu=1", None)).await;
    assert!(matches!(refused, Err(StoreError::Pools(PoolError::PoolCordoned(_)))), "{refused:?}");
    store.keepalive_alloc(name.clone(), alloc.id, 60_000).await.unwrap();
    // Drained: the first drain's time holds; a later, longer one does not put it off.
    let view = store.cordon_pool(name.clone(), CordonOrder::Drain { grace_ms: 60_000 }).await.unwrap();
    let cordon = view.cordon.expect("still cordoned");
    let drain_at = cordon.drain_at.expect("drained");
    assert_eq!(cordon.since, since, "a drain keeps the cordon's time");
    assert!(drain_at >= since + 60_000, "{drain_at} {since}");
    let view = store.cordon_pool(name.clone(), CordonOrder::Drain { grace_ms: 600_000 }).await.unwrap();
    assert_eq!(view.cordon.and_then(|c| c.drain_at), Some(drain_at));
    // A new capacity keeps the cordon and what is occupied.
    let (_, view) = store.put_pool(name.clone(), res("cpu=5")).await.unwrap();
    assert_eq!((view.cordon.map(|c| c.since), view.occupied.clone()), (Some(since), res("cpu=2")));
    assert_eq!(store.pool(name.clone()).await.unwrap(), view);
    // Uncordoned, with nothing occupied: everything free is offered again.
    let view = store.cordon_pool(name.clone(), CordonOrder::Uncordon).await.unwrap();
    assert_eq!(view.cordon, None);
    store.occupy_pool(name.clone(), Resources::new()).await.unwrap();
    assert_eq!(store.offer(name.clone()).await.unwrap().map(|o| o.available), Some(res("cpu=4")));
    let gone = store.cordon_pool(pool_name("no-such-pool"), CordonOrder::Cordon).await;
    assert!(matches!(gone, Err(StoreError::Pools(PoolError::PoolNotFound(_)))), "{gone:?}");
}

async fn one_offer_holds_everything_free(store: &dyn Store) {
    let name = pool_name("offers");
    store.put_pool(name.clone(), res("cpu=4,mem=8GiB,gpu=1")).await.unwrap();
    assert_eq!(store.offer(name.clone()).await.unwrap().unwrap().available, res("cpu=4,mem=8GiB,gpu=1"));
    let alloc = store.accept(name.clone(), wants("cpu=1,mem=1GiB", Some("cpu=2,mem=2GiB,gpu=2"))).await.unwrap();
    assert_eq!(alloc.resources, res("cpu=2,mem=2GiB,gpu=1"), "max, capped by what is free");
    assert_eq!(store.offer(name.clone()).await.unwrap().unwrap().available, res("cpu=2,mem=6GiB"));
    let late = store.accept(name.clone(), wants("cpu=3", None)).await;
    assert!(matches!(late, Err(StoreError::Pools(PoolError::OfferExpired { .. }))), "{late:?}");
    let exact = store.accept(name.clone(), wants("cpu=2,mem=6GiB", None)).await.unwrap();
    assert_eq!(exact.resources, res("cpu=2,mem=6GiB"));
    assert_eq!(store.offer(name.clone()).await.unwrap(), None, "nothing free, no offer");
    let never = store.accept(name.clone(), wants("cpu=2,gpu=2", None)).await;
    assert!(matches!(never, Err(StoreError::Pools(PoolError::ExceedsCapacity { .. }))), "{never:?}");
    let view = store.pool(name.clone()).await.unwrap();
    assert_eq!((view.allocs, view.stats.accepted, view.stats.offer_expired), (2, 2, 1));
    store.free_alloc(name.clone(), exact.id).await.unwrap();
    // A max below min (or silent on a resource) takes min there.
    let raised = store.accept(name.clone(), wants("cpu=1,mem=1GiB", Some("cpu=0.5"))).await.unwrap();
    assert_eq!(raised.resources, res("cpu=1,mem=1GiB"));
}

async fn allocs_end_and_say_why(store: &dyn Store) {
    let name = pool_name("ending");
    store.put_pool(name.clone(), res("cpu=1")).await.unwrap();
    let alloc = store.accept(name.clone(), wants("cpu=1", None)).await.unwrap();
    let (granted, renewed) = store.keepalive_alloc(name.clone(), alloc.id, 3_600_000).await.unwrap();
    assert_eq!(granted, 300_000, "capped at the longest lease");
    assert!(renewed.last_keepalive.is_some());
    let ended = store.free_alloc(name.clone(), alloc.id).await.unwrap();
    assert_eq!(ended.reason, EndReason::Freed);
    let again = store.free_alloc(name.clone(), alloc.id).await.unwrap();
    assert_eq!(again.reason, EndReason::Freed, "freeing twice answers the same record");
    let kept = store.keepalive_alloc(name.clone(), alloc.id, 1_000).await;
    assert!(matches!(kept, Err(StoreError::Pools(PoolError::AllocEnded { .. }))), "{kept:?}");
    match store.inspect_alloc(name.clone(), alloc.id).await.unwrap() {
        AllocState::Ended(ended) => assert_eq!((ended.reason, ended.alloc.resources), (EndReason::Freed, res("cpu=1"))),
        live => panic!("{live:?}"),
    }
    let missing = store.inspect_alloc(name.clone(), AllocId(42)).await;
    assert!(matches!(missing, Err(StoreError::Pools(PoolError::AllocNotFound { .. }))), "{missing:?}");
}

/// An owner's labels and metadata travel with its alloc, exactly as given, and change only as
/// asked: within their bounds, while the alloc lives, without renewing its lease.
async fn allocs_carry_their_owners_notes(store: &dyn Store) {
    let name = pool_name("notes");
    store.put_pool(name.clone(), res("cpu=2")).await.unwrap();
    // Text a JSON encoder may rewrite (escapes, a slash, non-ASCII, a long number): kept as is.
    let metadata = r#"{"exec":"sha256:ab/cd","results":[1,2.50,12345678901234567890],"note":"ü "q" 
"}"#;
    let request = AllocRequest {
        labels: [("job".to_owned(), "etl".to_owned())].into(),
        metadata: Some(metadata.to_owned()),
        ..wants("cpu=1", None)
    };
    let alloc = store.accept(name.clone(), request).await.unwrap();
    assert_eq!(alloc.metadata.as_deref(), Some(metadata));
    let read = |state: AllocState| match state {
        AllocState::Live(alloc) => alloc,
        AllocState::Ended(ended) => ended.alloc,
    };
    assert_eq!(read(store.inspect_alloc(name.clone(), alloc.id).await.unwrap()), alloc, "read back as made");

    let notes = AllocNotes {
        labels: [("step".to_owned(), Some("2".to_owned())), ("job".to_owned(), None)].into(),
        metadata: Some(Some(r#"{"done":true}"#.to_owned())),
    };
    let changed = store.annotate_alloc(name.clone(), alloc.id, notes).await.unwrap();
    assert_eq!(*changed.labels, [("step".to_owned(), "2".to_owned())].into());
    assert_eq!(changed.metadata.as_deref(), Some(r#"{"done":true}"#));
    assert_eq!(
        (changed.expires, changed.last_keepalive),
        (alloc.expires, alloc.last_keepalive),
        "the lease is as it was"
    );
    assert_eq!(read(store.inspect_alloc(name.clone(), alloc.id).await.unwrap()), changed);
    let kept = store.annotate_alloc(name.clone(), alloc.id, AllocNotes::default()).await.unwrap();
    assert_eq!(kept, changed, "nothing asked, nothing changed");

    // Over a bound: refused, and nothing changed.
    let big = "x".repeat(MAX_ALLOC_LABEL_BYTES);
    let too_many = AllocNotes { labels: [("big".to_owned(), Some(big))].into(), ..AllocNotes::default() };
    let refused = store.annotate_alloc(name.clone(), alloc.id, too_many).await;
    assert!(matches!(refused, Err(StoreError::Pools(PoolError::TooLarge { what: "labels", .. }))), "{refused:?}");
    let huge = format!(r#"{{"x":"{}"}}"#, "y".repeat(MAX_ALLOC_METADATA_BYTES));
    let too_big = AllocNotes { metadata: Some(Some(huge.clone())), ..AllocNotes::default() };
    let refused = store.annotate_alloc(name.clone(), alloc.id, too_big).await;
    assert!(matches!(refused, Err(StoreError::Pools(PoolError::TooLarge { what: "metadata", .. }))), "{refused:?}");
    let refused = store.accept(name.clone(), AllocRequest { metadata: Some(huge), ..wants("cpu=1", None) }).await;
    assert!(matches!(refused, Err(StoreError::Pools(PoolError::TooLarge { .. }))), "{refused:?}");
    assert_eq!(read(store.inspect_alloc(name.clone(), alloc.id).await.unwrap()), changed);

    let cleared = AllocNotes { metadata: Some(None), ..AllocNotes::default() };
    let cleared = store.annotate_alloc(name.clone(), alloc.id, cleared).await.unwrap();
    assert_eq!((cleared.metadata, cleared.labels.len()), (None, 1));

    // Ended: its record keeps what it carried, and changes no more.
    let last = AllocNotes { metadata: Some(Some(r#"{"exit":0}"#.to_owned())), ..AllocNotes::default() };
    store.annotate_alloc(name.clone(), alloc.id, last).await.unwrap();
    let ended = store.free_alloc(name.clone(), alloc.id).await.unwrap();
    assert_eq!(ended.alloc.metadata.as_deref(), Some(r#"{"exit":0}"#));
    let late = store.annotate_alloc(name.clone(), alloc.id, AllocNotes::default()).await;
    assert!(matches!(late, Err(StoreError::Pools(PoolError::AllocEnded { .. }))), "{late:?}");
    let missing = store.annotate_alloc(name.clone(), AllocId(42), AllocNotes::default()).await;
    assert!(matches!(missing, Err(StoreError::Pools(PoolError::AllocNotFound { .. }))), "{missing:?}");
}

async fn lapsed_allocs_are_offered_and_reclaimed_when_needed(store: &dyn Store, time: &dyn Time) {
    let name = pool_name("lapse");
    store.put_pool(name.clone(), res("cpu=2")).await.unwrap();
    let first = store.accept(name.clone(), wants("cpu=1", None)).await.unwrap();
    let second = store.accept(name.clone(), wants("cpu=1", None)).await.unwrap();
    store.keepalive_alloc(name.clone(), first.id, 100).await.unwrap();
    store.keepalive_alloc(name.clone(), second.id, 200).await.unwrap();
    time.advance(Duration::from_millis(350)).await;
    // Lapsed allocs are offered...
    assert_eq!(store.offer(name.clone()).await.unwrap().unwrap().available, res("cpu=2"));
    // ...and a keepalive revives one that is not reclaimed yet.
    store.keepalive_alloc(name.clone(), second.id, 60_000).await.unwrap();
    assert_eq!(store.offer(name.clone()).await.unwrap().unwrap().available, res("cpu=1"));
    // An accept that needs the room reclaims the lapsed one.
    store.accept(name.clone(), wants("cpu=1", None)).await.unwrap();
    match store.inspect_alloc(name.clone(), first.id).await.unwrap() {
        AllocState::Ended(ended) => assert_eq!(ended.reason, EndReason::Reclaimed),
        live => panic!("{live:?}"),
    }
    assert!(matches!(store.inspect_alloc(name.clone(), second.id).await.unwrap(), AllocState::Live(_)));
    assert_eq!(store.pool(name.clone()).await.unwrap().stats.reclaimed, 1);
}

async fn an_idle_pool_stops(store: &dyn Store, time: &dyn Time) {
    let name = pool_name("idle");
    store.put_pool(name.clone(), res("cpu=1")).await.unwrap();
    let alloc = store.accept(name.clone(), wants("cpu=1", None)).await.unwrap();
    store.keepalive_alloc(name.clone(), alloc.id, 100).await.unwrap();
    let (stopped, until_idle) = store.stop_if_idle_for(name.clone(), 200).await.unwrap();
    assert!(!stopped);
    assert!((150..=300).contains(&until_idle), "idle in about 300 ms, said {until_idle}");
    time.advance(Duration::from_millis(until_idle + 20)).await;
    let (stopped, _) = store.stop_if_idle_for(name.clone(), 200).await.unwrap();
    assert!(stopped);
    assert_eq!(store.offer(name.clone()).await.unwrap(), None);
    let refused = store.accept(name.clone(), wants("cpu=1", None)).await;
    assert!(matches!(refused, Err(StoreError::Pools(PoolError::PoolStopped(_)))), "{refused:?}");
    match store.inspect_alloc(name.clone(), alloc.id).await.unwrap() {
        AllocState::Ended(ended) => assert_eq!(ended.reason, EndReason::PoolStopped),
        live => panic!("{live:?}"),
    }
    store.put_pool(name.clone(), res("cpu=1")).await.unwrap();
    store.accept(name.clone(), wants("cpu=1", None)).await.unwrap();
}

async fn concurrent_accepts_never_over_allocate(store: Arc<dyn Store>) {
    let name = pool_name("concurrent");
    store.put_pool(name.clone(), res("cpu=4,mem=4GiB")).await.unwrap();
    let mut tasks = Vec::new();
    for worker in 0..16u64 {
        let (store, name) = (store.clone(), name.clone());
        tasks.push(tokio::spawn(async move {
            let mut made = 0;
            for round in 0..10u64 {
                let min = if (worker + round) % 2 == 0 { "cpu=1" } else { "cpu=1,mem=1GiB" };
                match store.accept(name.clone(), wants(min, None)).await {
                    Ok(alloc) => {
                        made += 1;
                        let view = store.pool(name.clone()).await.unwrap();
                        assert!(view.capacity.fits(&view.allocated), "over-allocated: {view:?}");
                        store.free_alloc(name.clone(), alloc.id).await.unwrap();
                    }
                    Err(StoreError::Pools(PoolError::OfferExpired { .. })) => {}
                    Err(err) => panic!("{err}"),
                }
            }
            made
        }));
    }
    let mut made = 0;
    for task in tasks {
        made += task.await.unwrap();
    }
    assert!(made > 0);
    let view = store.pool(name).await.unwrap();
    assert_eq!((view.allocs, view.allocated.is_empty()), (0, true));
}

async fn pools_and_allocs_page_by_name_and_id(store: &dyn Store) {
    let name = |i: usize| pool_name(&format!("page-{i:02}"));
    for i in 0..12 {
        store.put_pool(name(i), res("cpu=10")).await.unwrap();
    }
    let mut listed = Vec::new();
    let mut after = Some(pool_name("page"));
    while let Some(key) = after.filter(|k| k.as_str().starts_with("conformance-page")) {
        let page = store.pools(PageRequest::new(Some(key), 5)).await.unwrap();
        assert!(page.items.len() <= 5, "{page:?}");
        listed
            .extend(page.items.iter().map(|p| p.name.clone()).filter(|n| n.as_str().starts_with("conformance-page-")));
        after = page.next;
    }
    assert_eq!(listed, (0..12).map(name).collect::<Vec<_>>());

    let pool = name(0);
    let mut ids = Vec::new();
    for _ in 0..7 {
        ids.push(store.accept(pool.clone(), wants("cpu=1", None)).await.unwrap().id);
    }
    ids.sort();
    let first = store.allocs(pool.clone(), PageRequest::first(3)).await.unwrap();
    assert_eq!(first.items.iter().map(|a| a.id).collect::<Vec<_>>(), ids[..3]);
    assert_eq!(first.next, Some(ids[2]));
    // Freed between two pages: not listed.
    store.free_alloc(pool.clone(), ids[4]).await.unwrap();
    let second = store.allocs(pool.clone(), PageRequest::new(first.next, 3)).await.unwrap();
    assert_eq!(second.items.iter().map(|a| a.id).collect::<Vec<_>>(), [ids[3], ids[5], ids[6]]);
    assert_eq!(second.next, None);
    let missing = store.allocs(pool_name("page-none"), PageRequest::first(3)).await;
    assert!(matches!(missing, Err(StoreError::Pools(PoolError::PoolNotFound(_)))), "{missing:?}");
}
