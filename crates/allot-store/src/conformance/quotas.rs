//! The checks of the token quotas: namespaces, grants, caps, fencing, leases, sessions, waiters
//! and pages.

use std::sync::Arc;
use std::time::Duration;

use allot_core::{
    AllocateRequest, CapLevel, Constraints, Lease, LeaseRequest, LedgerError, NamespaceName, QueuePlace, Refusal,
    Scope, Token,
};

use crate::{read_all, Allocation, Page, PageRequest, Store, StoreError, MAX_PAGE};

use super::{eventually, Time};

/// Runs every check of the token quotas against `store`: those that do not move time
/// concurrently (each works in its own namespaces), then those that do, one by one.
pub async fn run(store: Arc<dyn Store>, time: &dyn Time) {
    let store_ref = &*store;
    tokio::join!(
        namespaces_are_created_changed_and_removed(store_ref),
        grants_until_the_quota_is_full(store_ref),
        a_quota_of_zero_pauses_and_a_lowered_quota_keeps_waiters(store_ref),
        a_retry_must_match_the_lease(store_ref),
        allocate_and_release_are_idempotent(store_ref),
        tokens_of_allots_own_are_out_of_clients_reach(store_ref),
        caps_match_scopes_exactly(store_ref),
        stale_fencing_is_refused(store_ref),
        waiters_are_woken_in_order(store_ref),
        a_timed_out_wait_reports_its_place(store_ref),
        raising_the_quota_admits_a_waiter(store_ref),
        concurrent_allocations_never_over_grant(store.clone()),
        namespaces_page_by_name(store_ref),
        grants_page_by_token(store_ref),
        waiters_page_in_queue_order(store_ref),
        sessions_page_by_id(store_ref),
    );
    ttl_leases_are_swept(store_ref, time).await;
    sessions_hold_and_free_grants(store_ref, time).await;
    a_sessions_waiters_live_and_end_with_it(store_ref, time).await;
}

fn ns(name: &str) -> NamespaceName {
    NamespaceName::new(&format!("conformance:{name}")).unwrap()
}

fn token(name: &str) -> Token {
    Token::new(name).unwrap()
}

pub(super) fn request(namespace: &NamespaceName, name: &str, units: u64) -> AllocateRequest {
    AllocateRequest {
        namespace: namespace.clone(),
        token: token(name),
        units,
        scope: None,
        constraints: Constraints::default(),
        lease: LeaseRequest::None,
    }
}

#[track_caller]
fn assert_granted(allocation: &Allocation) -> u64 {
    match allocation {
        Allocation::Granted { grant, .. } => grant.grant.fencing,
        other => panic!("expected a grant, got {other:?}"),
    }
}

async fn namespaces_are_created_changed_and_removed(store: &dyn Store) {
    let name = ns("namespaces");
    let (created, view) = store.put_namespace(name.clone(), 3).await.unwrap();
    assert!(created);
    assert_eq!(view.quota, 3);
    let (created, view) = store.put_namespace(name.clone(), 5).await.unwrap();
    assert!(!created);
    assert_eq!(view.quota, 5);
    assert!(read_all(|page| store.namespaces(page)).await.unwrap().iter().any(|v| v.name == name));
    assert_eq!(store.namespace(name.clone()).await.unwrap().quota, 5);
    store.allocate(request(&name, "t", 1), Duration::ZERO).await.unwrap();
    let in_use = store.remove_namespace(name.clone(), false).await;
    assert!(matches!(in_use, Err(StoreError::Quotas(LedgerError::NamespaceInUse { grants: 1, .. }))), "{in_use:?}");
    assert_eq!(store.remove_namespace(name.clone(), true).await.unwrap(), 1);
    let gone = store.namespace(name.clone()).await;
    assert!(matches!(gone, Err(StoreError::Quotas(LedgerError::NamespaceNotFound(_)))), "{gone:?}");
    let gone = store.allocate(request(&name, "t", 1), Duration::ZERO).await;
    assert!(matches!(gone, Err(StoreError::Quotas(LedgerError::NamespaceNotFound(_)))), "{gone:?}");
}

async fn grants_until_the_quota_is_full(store: &dyn Store) {
    let name = ns("quota");
    store.put_namespace(name.clone(), 3).await.unwrap();
    assert_granted(&store.allocate(request(&name, "a", 2), Duration::ZERO).await.unwrap());
    let refused = store.allocate(request(&name, "b", 2), Duration::ZERO).await.unwrap();
    assert_eq!(refused, Allocation::Refused { refusal: Refusal::Exhausted, place: None });
    assert_granted(&store.allocate(request(&name, "c", 1), Duration::ZERO).await.unwrap());
    let view = store.namespace(name.clone()).await.unwrap();
    assert_eq!((view.granted_units, view.grants), (3, 2));
    // More than the whole quota is exhausted, not an error: the quota may be raised.
    let too_big = store.allocate(request(&name, "d", 4), Duration::ZERO).await.unwrap();
    assert_eq!(too_big, Allocation::Refused { refusal: Refusal::Exhausted, place: None });
}

async fn a_quota_of_zero_pauses_and_a_lowered_quota_keeps_waiters(store: &dyn Store) {
    let name = ns("paused");
    store.put_namespace(name.clone(), 0).await.unwrap();
    let paused = store.allocate(request(&name, "a", 1), Duration::ZERO).await.unwrap();
    assert_eq!(paused, Allocation::Refused { refusal: Refusal::Exhausted, place: None });
    // A waiter of a paused namespace is granted when the quota is raised.
    let (woken, _) = tokio::join!(store.allocate(request(&name, "a", 1), Duration::from_secs(10)), async {
        queue_is(store, &name, &["a"]).await;
        store.put_namespace(name.clone(), 2).await.unwrap();
    });
    assert_granted(&woken.unwrap());
    // Lowered below a waiter's units, the quota keeps the waiter; raised again, it admits it.
    let (big, _) = tokio::join!(store.allocate(request(&name, "big", 2), Duration::from_secs(10)), async {
        queue_is(store, &name, &["big"]).await;
        store.put_namespace(name.clone(), 1).await.unwrap();
        assert_eq!(
            store.waiters(name.clone(), PageRequest::first(10)).await.unwrap().items.len(),
            1,
            "lowering the quota dropped a waiter"
        );
        store.release(name.clone(), token("a"), None).await.unwrap();
        store.put_namespace(name.clone(), 3).await.unwrap();
    });
    assert_granted(&big.unwrap());
}

async fn a_retry_must_match_the_lease(store: &dyn Store) {
    let name = ns("retry-lease");
    store.put_namespace(name.clone(), 2).await.unwrap();
    let with_ttl = AllocateRequest { lease: LeaseRequest::Ttl { ttl_ms: 60_000 }, ..request(&name, "t", 1) };
    assert_granted(&store.allocate(with_ttl.clone(), Duration::ZERO).await.unwrap());
    let retried = store.allocate(with_ttl.clone(), Duration::ZERO).await.unwrap();
    assert!(matches!(retried, Allocation::Granted { existing: true, .. }), "{retried:?}");
    let other = AllocateRequest { lease: LeaseRequest::Ttl { ttl_ms: 30_000 }, ..with_ttl.clone() };
    let err = store.allocate(other, Duration::ZERO).await.unwrap_err();
    assert_eq!(
        err,
        StoreError::Quotas(LedgerError::TokenConflict {
            token: token("t"),
            waiting: false,
            field: "ttl_ms",
            held: "ttl_ms 60000".into(),
            asked: "ttl_ms 30000".into(),
        })
    );
    let opened = store.open_session(60_000, Some("ada".into())).await.unwrap().session;
    assert_eq!(opened.owner.as_deref(), Some("ada"), "a session keeps who opened it");
    let session = opened.id;
    let read = store.session(session).await.unwrap().session;
    assert_eq!(read.owner.as_deref(), Some("ada"), "{read:?}");
    let kept = store.keepalive_session(session).await.unwrap().session;
    assert_eq!(kept.owner.as_deref(), Some("ada"), "{kept:?}");
    let listed = crate::read_all(|page| store.sessions(page)).await.unwrap();
    assert!(listed.iter().any(|info| info.session.id == session && info.session.owner.as_deref() == Some("ada")));
    let in_session = AllocateRequest { lease: LeaseRequest::Session(session), ..with_ttl.clone() };
    let err = store.allocate(in_session, Duration::ZERO).await.unwrap_err();
    assert!(matches!(err, StoreError::Quotas(LedgerError::TokenConflict { field: "session", .. })), "{err:?}");
    let unscoped = AllocateRequest { units: 2, ..with_ttl };
    let err = store.allocate(unscoped, Duration::ZERO).await.unwrap_err();
    assert!(
        matches!(&err, StoreError::Quotas(LedgerError::TokenConflict { field: "units", held, asked, .. })
        if held == "1" && asked == "2"),
        "{err:?}"
    );
    store.close_session(session).await.unwrap();
}

async fn allocate_and_release_are_idempotent(store: &dyn Store) {
    let name = ns("idempotent");
    store.put_namespace(name.clone(), 1).await.unwrap();
    let first = store.allocate(request(&name, "a", 1), Duration::ZERO).await.unwrap();
    let again = store.allocate(request(&name, "a", 1), Duration::ZERO).await.unwrap();
    match (&first, &again) {
        (Allocation::Granted { grant: g1, existing: false }, Allocation::Granted { grant: g2, existing: true }) => {
            assert_eq!(g1.grant, g2.grant)
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(store.namespace(name.clone()).await.unwrap().granted_units, 1);
    assert!(store.release(name.clone(), token("a"), None).await.unwrap().is_some());
    assert!(store.release(name.clone(), token("a"), None).await.unwrap().is_none());
    assert!(store.release(name.clone(), token("never"), None).await.unwrap().is_none());
    assert_eq!(store.namespace(name.clone()).await.unwrap().granted_units, 0);
}

/// Tokens that begin with `@` are allot's own (a task's placement or run): only `allocate_held`
/// and `release_held` reach them, with the queue as any other's.
async fn tokens_of_allots_own_are_out_of_clients_reach(store: &dyn Store) {
    let name = ns("held");
    store.put_namespace(name.clone(), 1).await.unwrap();
    let refused = store.allocate(request(&name, "@a:t:1", 1), Duration::ZERO).await;
    assert!(matches!(refused, Err(StoreError::Quotas(LedgerError::SchedulerToken(_)))), "{refused:?}");
    assert_granted(&store.allocate_held(request(&name, "@a:t:1", 1), Duration::ZERO).await.unwrap());
    let again = store.allocate_held(request(&name, "@a:t:1", 1), Duration::ZERO).await.unwrap();
    assert!(matches!(again, Allocation::Granted { existing: true, .. }), "{again:?}");
    for fencing in [None, Some(1)] {
        let released = store.release(name.clone(), token("@a:t:1"), fencing).await;
        assert!(matches!(released, Err(StoreError::Quotas(LedgerError::HeldByScheduler { .. }))), "{released:?}");
        let renewed = store.keepalive_grant(name.clone(), token("@a:t:1"), fencing).await;
        assert!(matches!(renewed, Err(StoreError::Quotas(LedgerError::HeldByScheduler { .. }))), "{renewed:?}");
    }
    // One of allot's own waits in the queue like a client's, and is granted when room comes.
    let waiting = store.allocate_held(request(&name, "@a:t2:1", 1), Duration::from_secs(30));
    let freeing = async {
        eventually("the second waits", || async { store.namespace(name.clone()).await.unwrap().waiters == 1 }).await;
        assert!(store.release_held(name.clone(), token("@a:t:1")).await.unwrap().is_some());
    };
    let (granted, ()) = tokio::join!(waiting, freeing);
    assert_granted(&granted.unwrap());
    assert!(store.release_held(name.clone(), token("@a:t2:1")).await.unwrap().is_some());
    assert!(store.release_held(name.clone(), token("@a:t2:1")).await.unwrap().is_none(), "idempotent");
    assert_eq!(store.namespace(name).await.unwrap().granted_units, 0);
}

async fn caps_match_scopes_exactly(store: &dyn Store) {
    let name = ns("caps");
    store.put_namespace(name.clone(), 100).await.unwrap();
    let caps = Constraints { project: Some(1), namespace: None };
    let scoped = |t: &str, project: &str| AllocateRequest {
        scope: Some(Scope::new(project, "dev").unwrap()),
        constraints: caps,
        ..request(&name, t, 1)
    };
    assert_granted(&store.allocate(scoped("a", "proj"), Duration::ZERO).await.unwrap());
    assert_granted(&store.allocate(scoped("b", "proj2"), Duration::ZERO).await.unwrap());
    let refused = store.allocate(scoped("c", "proj"), Duration::ZERO).await.unwrap();
    assert_eq!(
        refused,
        Allocation::Refused {
            refusal: Refusal::CapExceeded { level: CapLevel::Project, cap: 1, held: 1 },
            place: None
        }
    );
}

async fn stale_fencing_is_refused(store: &dyn Store) {
    let name = ns("fencing");
    store.put_namespace(name.clone(), 1).await.unwrap();
    let f1 = assert_granted(&store.allocate(request(&name, "a", 1), Duration::ZERO).await.unwrap());
    store.release(name.clone(), token("a"), Some(f1)).await.unwrap();
    let f2 = assert_granted(&store.allocate(request(&name, "a", 1), Duration::ZERO).await.unwrap());
    assert!(f2 > f1);
    let stale = store.release(name.clone(), token("a"), Some(f1)).await;
    assert!(matches!(stale, Err(StoreError::Quotas(LedgerError::StaleFencing { .. }))), "{stale:?}");
    let stale = store.keepalive_grant(name.clone(), token("a"), Some(f1)).await;
    assert!(matches!(stale, Err(StoreError::Quotas(LedgerError::StaleFencing { .. }))), "{stale:?}");
    assert!(store.release(name.clone(), token("a"), Some(f2)).await.unwrap().is_some());
}

async fn ttl_leases_are_swept(store: &dyn Store, time: &dyn Time) {
    let name = ns("ttl");
    store.put_namespace(name.clone(), 1).await.unwrap();
    let mut r = request(&name, "a", 1);
    r.lease = LeaseRequest::Ttl { ttl_ms: 500 };
    let granted = store.allocate(r, Duration::ZERO).await.unwrap();
    let Allocation::Granted { grant, .. } = granted else { panic!("{granted:?}") };
    assert!(matches!(grant.grant.lease, Lease::Ttl { ttl_ms: 500, .. }));
    assert!(grant.expires_in_ms.unwrap() <= 500);
    // A keepalive restarts the lease.
    time.advance(Duration::from_millis(300)).await;
    let renewed = store.keepalive_grant(name.clone(), token("a"), None).await.unwrap();
    assert!(renewed.expires_in_ms.unwrap() > 400, "{renewed:?}");
    time.advance(Duration::from_millis(300)).await;
    assert_eq!(store.namespace(name.clone()).await.unwrap().granted_units, 1, "renewed lease must still hold");
    // Past its expiry, it is freed by the sweeper, without any other call.
    time.advance(Duration::from_millis(250)).await;
    eventually("the sweeper freed an expired grant", async || {
        store.namespace(name.clone()).await.unwrap().granted_units == 0
    })
    .await;
    assert_eq!(store.namespace(name.clone()).await.unwrap().stats.expired, 1);
}

async fn sessions_hold_and_free_grants(store: &dyn Store, time: &dyn Time) {
    let name = ns("sessions");
    store.put_namespace(name.clone(), 2).await.unwrap();
    let session = store.open_session(800, None).await.unwrap();
    let id = session.session.id;
    for t in ["a", "b"] {
        let mut r = request(&name, t, 1);
        r.lease = LeaseRequest::Session(id);
        assert_granted(&store.allocate(r, Duration::ZERO).await.unwrap());
    }
    assert_eq!(store.session(id).await.unwrap().session.grants.len(), 2);
    for _ in 0..3 {
        time.advance(Duration::from_millis(300)).await;
        store.keepalive_session(id).await.unwrap();
    }
    assert_eq!(store.namespace(name.clone()).await.unwrap().granted_units, 2, "kept-alive session must hold");
    time.advance(Duration::from_millis(850)).await;
    eventually("an expired session's grants were freed", async || {
        store.namespace(name.clone()).await.unwrap().granted_units == 0
    })
    .await;
    let gone = store.keepalive_session(id).await;
    assert!(matches!(gone, Err(StoreError::Quotas(LedgerError::SessionNotFound(_)))), "{gone:?}");

    let session = store.open_session(10_000, None).await.unwrap();
    let mut r = request(&name, "c", 1);
    r.lease = LeaseRequest::Session(session.session.id);
    assert_granted(&store.allocate(r, Duration::ZERO).await.unwrap());
    store.close_session(session.session.id).await.unwrap();
    assert_eq!(store.namespace(name.clone()).await.unwrap().granted_units, 0);
}

/// A waiter under a session follows the session's keepalives (granted after its first deadline
/// has passed, the session kept alive), and ends with it: once the session expires its waiter is
/// answered `session_not_found` and holds no waiter behind it back.
async fn a_sessions_waiters_live_and_end_with_it(store: &dyn Store, time: &dyn Time) {
    let name = ns("session-waiters");
    store.put_namespace(name.clone(), 3).await.unwrap();
    assert_granted(&store.allocate(request(&name, "holder", 3), Duration::ZERO).await.unwrap());
    let kept = store.open_session(800, None).await.unwrap().session.id;
    let mut r = request(&name, "kept", 1);
    r.lease = LeaseRequest::Session(kept);
    let (granted, ()) = tokio::join!(store.allocate(r, Duration::from_secs(60)), async {
        queue_is(store, &name, &["kept"]).await;
        for _ in 0..4 {
            time.advance(Duration::from_millis(300)).await;
            store.keepalive_session(kept).await.unwrap();
        }
        store.release(name.clone(), token("holder"), None).await.unwrap();
    });
    assert_granted(&granted.unwrap());
    assert_eq!(store.session(kept).await.unwrap().session.grants.len(), 1, "the grant is the session's");
    store.close_session(kept).await.unwrap();

    // The quota is 3: 2 held. `big` (2, under a session never kept alive) does not fit and
    // holds `small` (1, which fits) back until its session expires.
    assert_granted(&store.allocate(request(&name, "held", 2), Duration::ZERO).await.unwrap());
    let lapsing = store.open_session(800, None).await.unwrap().session.id;
    let mut r = request(&name, "big", 2);
    r.lease = LeaseRequest::Session(lapsing);
    let (big, small, ()) = tokio::join!(
        store.allocate(r, Duration::from_secs(60)),
        async {
            queue_is(store, &name, &["big"]).await;
            store.allocate(request(&name, "small", 1), Duration::from_secs(60)).await
        },
        async {
            queue_is(store, &name, &["big", "small"]).await;
            time.advance(Duration::from_millis(900)).await;
        }
    );
    assert!(matches!(big, Err(StoreError::Quotas(LedgerError::SessionNotFound(_)))), "{big:?}");
    assert_granted(&small.unwrap());
    assert_eq!(store.namespace(name).await.unwrap().granted_units, 3);
}

/// Waits until the namespace's queue holds exactly `tokens`, in that order.
async fn queue_is(store: &dyn Store, name: &NamespaceName, tokens: &[&str]) {
    eventually(&format!("the queue of {name} became {tokens:?}"), async || {
        let waiters = store.waiters(name.clone(), PageRequest::first(MAX_PAGE)).await.unwrap().items;
        waiters.iter().map(|w| w.token.as_str()).collect::<Vec<_>>() == tokens
    })
    .await;
}

async fn waiters_are_woken_in_order(store: &dyn Store) {
    let name = ns("waiters");
    store.put_namespace(name.clone(), 1).await.unwrap();
    assert_granted(&store.allocate(request(&name, "holder", 1), Duration::ZERO).await.unwrap());
    let (first, second, ()) = tokio::join!(
        store.allocate(request(&name, "w1", 1), Duration::from_secs(10)),
        async {
            queue_is(store, &name, &["w1"]).await;
            store.allocate(request(&name, "w2", 1), Duration::from_millis(1000)).await
        },
        async {
            queue_is(store, &name, &["w1", "w2"]).await;
            store.release(name.clone(), token("holder"), None).await.unwrap();
        }
    );
    assert_granted(&first.unwrap());
    let second = second.unwrap();
    assert_eq!(
        second,
        Allocation::Refused { refusal: Refusal::Exhausted, place: Some(QueuePlace { position: 1, units_ahead: 0 }) }
    );
}

async fn a_timed_out_wait_reports_its_place(store: &dyn Store) {
    let name = ns("timeout");
    store.put_namespace(name.clone(), 2).await.unwrap();
    assert_granted(&store.allocate(request(&name, "holder", 2), Duration::ZERO).await.unwrap());
    let (_, late) = tokio::join!(store.allocate(request(&name, "big", 2), Duration::from_secs(3)), async {
        queue_is(store, &name, &["big"]).await;
        store.allocate(request(&name, "small", 1), Duration::from_millis(200)).await
    });
    assert_eq!(
        late.unwrap(),
        Allocation::Refused { refusal: Refusal::Exhausted, place: Some(QueuePlace { position: 2, units_ahead: 2 }) }
    );
    assert!(store.waiters(name.clone(), PageRequest::first(10)).await.unwrap().items.is_empty());
}

async fn raising_the_quota_admits_a_waiter(store: &dyn Store) {
    let name = ns("raise");
    store.put_namespace(name.clone(), 1).await.unwrap();
    assert_granted(&store.allocate(request(&name, "holder", 1), Duration::ZERO).await.unwrap());
    let (woken, _) = tokio::join!(store.allocate(request(&name, "w", 1), Duration::from_secs(10)), async {
        queue_is(store, &name, &["w"]).await;
        store.put_namespace(name.clone(), 2).await.unwrap();
    });
    assert_granted(&woken.unwrap());
}

async fn concurrent_allocations_never_over_grant(store: Arc<dyn Store>) {
    let name = ns("concurrent");
    store.put_namespace(name.clone(), 5).await.unwrap();
    let mut tasks = Vec::new();
    for worker in 0..32 {
        let store = store.clone();
        let name = name.clone();
        tasks.push(tokio::spawn(async move {
            let mut held = 0;
            for round in 0..20 {
                let t = format!("w{worker}-{round}");
                let wait = if round % 2 == 0 { Duration::ZERO } else { Duration::from_millis(20) };
                if let Allocation::Granted { .. } = store.allocate(request(&name, &t, 1), wait).await.unwrap() {
                    held += 1;
                    let view = store.namespace(name.clone()).await.unwrap();
                    assert!(view.granted_units <= 5, "over-granted: {view:?}");
                    store.release(name.clone(), token(&t), None).await.unwrap();
                }
            }
            held
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap();
    }
    assert!(total > 0);
    let view = store.namespace(name).await.unwrap();
    assert_eq!((view.granted_units, view.waiters), (0, 0));
}

/// Keys of a page, as text, to compare pages in assertions.
fn keys<T>(page: &Page<T, impl Clone>, key: impl Fn(&T) -> String) -> Vec<String> {
    page.items.iter().map(key).collect()
}

async fn namespaces_page_by_name(store: &dyn Store) {
    let name = |i: &str| ns(&format!("page:{i}"));
    for i in 0..25 {
        store.put_namespace(name(&format!("{i:02}")), 1).await.unwrap();
    }
    // Other checks add namespaces of their own meanwhile: start after "conformance:page" and
    // keep the names of this check.
    let ours = |page: &Page<allot_core::NamespaceView, NamespaceName>| {
        keys(page, |v| v.name.to_string())
            .into_iter()
            .filter(|n| n.starts_with("conformance:page:"))
            .collect::<Vec<_>>()
    };
    let first = store.namespaces(PageRequest::new(Some(ns("page")), 10)).await.unwrap();
    let expected: Vec<String> = (0..10).map(|i| name(&format!("{i:02}")).to_string()).collect();
    assert_eq!(ours(&first), expected);
    assert_eq!(first.next, Some(name("09")));
    // Between two pages: the cursor's own namespace and one ahead go away, one is added behind
    // the cursor (not listed any more) and one ahead (listed).
    store.remove_namespace(name("09"), false).await.unwrap();
    store.remove_namespace(name("12"), false).await.unwrap();
    store.put_namespace(name("05x"), 1).await.unwrap();
    store.put_namespace(name("15x"), 1).await.unwrap();
    let second = store.namespaces(PageRequest::new(first.next.clone(), 10)).await.unwrap();
    assert!(second.items.len() <= 10);
    assert_eq!(
        ours(&second),
        ["10", "11", "13", "14", "15", "15x", "16", "17", "18", "19"].map(|i| name(i).to_string())
    );
    let mut rest = Vec::new();
    let mut after = second.next.clone();
    while let Some(key) = after.filter(|k| k.as_str().starts_with("conformance:page:")) {
        let page = store.namespaces(PageRequest::new(Some(key), 2)).await.unwrap();
        assert!(page.items.len() <= 2, "{page:?}");
        rest.extend(ours(&page));
        after = page.next;
    }
    assert_eq!(rest, ["20", "21", "22", "23", "24"].map(|i| name(i).to_string()));
    let all: Vec<String> =
        read_all(|page| store.namespaces(page)).await.unwrap().into_iter().map(|v| v.name.to_string()).collect();
    assert!(all.windows(2).all(|w| w[0] < w[1]), "namespaces are listed in name order, once each");
}

async fn grants_page_by_token(store: &dyn Store) {
    let name = ns("grant-pages");
    store.put_namespace(name.clone(), 100).await.unwrap();
    // Granted out of order: a page is in token order whatever the order of the grants.
    for i in (0..25).rev() {
        assert_granted(&store.allocate(request(&name, &format!("t{i:02}"), 1), Duration::ZERO).await.unwrap());
    }
    let tokens = |page: &Page<crate::GrantInfo, Token>| keys(page, |g| g.grant.token.to_string());
    let first = store.grants(name.clone(), PageRequest::first(10)).await.unwrap();
    assert_eq!(tokens(&first), (0..10).map(|i| format!("t{i:02}")).collect::<Vec<_>>());
    assert_eq!(first.next, Some(token("t09")));
    store.release(name.clone(), token("t09"), None).await.unwrap();
    store.release(name.clone(), token("t12"), None).await.unwrap();
    assert_granted(&store.allocate(request(&name, "t05x", 1), Duration::ZERO).await.unwrap());
    assert_granted(&store.allocate(request(&name, "t15x", 1), Duration::ZERO).await.unwrap());
    let second = store.grants(name.clone(), PageRequest::new(first.next, 10)).await.unwrap();
    assert_eq!(tokens(&second), ["t10", "t11", "t13", "t14", "t15", "t15x", "t16", "t17", "t18", "t19"]);
    assert_eq!(second.next, Some(token("t19")));
    let last = store.grants(name.clone(), PageRequest::new(second.next, 10)).await.unwrap();
    assert_eq!(tokens(&last), ["t20", "t21", "t22", "t23", "t24"]);
    assert_eq!(last.next, None, "the last page says so");
    // A list that fills its pages exactly ends without an empty page.
    let exact = store.grants(name.clone(), PageRequest::new(Some(token("t19")), 5)).await.unwrap();
    assert_eq!((exact.items.len(), exact.next), (5, None));
    let all = read_all(|page| store.grants(name.clone(), page)).await.unwrap();
    assert_eq!(all.len(), 25);
    let missing = store.grants(ns("grant-pages-none"), PageRequest::first(10)).await;
    assert!(matches!(missing, Err(StoreError::Quotas(LedgerError::NamespaceNotFound(_)))), "{missing:?}");
}

async fn waiters_page_in_queue_order(store: &dyn Store) {
    let name = ns("waiter-pages");
    store.put_namespace(name.clone(), 1).await.unwrap();
    assert_granted(&store.allocate(request(&name, "holder", 1), Duration::ZERO).await.unwrap());
    let tokens = |page: &Page<allot_core::WaiterView, u64>| keys(page, |w| w.token.to_string());
    let wait = |t: &'static str| store.allocate(request(&name, t, 1), Duration::from_secs(20));
    let (a, b, c, d, ()) = tokio::join!(
        wait("w1"),
        async {
            queue_is(store, &name, &["w1"]).await;
            wait("w2").await
        },
        async {
            queue_is(store, &name, &["w1", "w2"]).await;
            wait("w3").await
        },
        async {
            queue_is(store, &name, &["w1", "w2", "w3"]).await;
            wait("w4").await
        },
        async {
            queue_is(store, &name, &["w1", "w2", "w3", "w4"]).await;
            let first = store.waiters(name.clone(), PageRequest::first(2)).await.unwrap();
            assert_eq!(tokens(&first), ["w1", "w2"]);
            let places: Vec<usize> = first.items.iter().map(|w| w.place.position).collect();
            assert_eq!(places, [1, 2]);
            assert_eq!(first.next, Some(first.items[1].arrival));
            // The queue moves between two pages: w1 is granted; the next page still starts
            // after w2, with the places of that read.
            store.release(name.clone(), token("holder"), None).await.unwrap();
            queue_is(store, &name, &["w2", "w3", "w4"]).await;
            let second = store.waiters(name.clone(), PageRequest::new(first.next, 2)).await.unwrap();
            assert_eq!(tokens(&second), ["w3", "w4"]);
            let places: Vec<(usize, u64)> =
                second.items.iter().map(|w| (w.place.position, w.place.units_ahead)).collect();
            assert_eq!(places, [(2, 1), (3, 2)]);
            assert_eq!(second.next, None);
            store.put_namespace(name.clone(), 4).await.unwrap();
        }
    );
    for answer in [a, b, c, d] {
        assert_granted(&answer.unwrap());
    }
}

async fn sessions_page_by_id(store: &dyn Store) {
    let mut ours = Vec::new();
    for _ in 0..5 {
        ours.push(store.open_session(60_000, None).await.unwrap().session.id);
    }
    ours.sort();
    // Other checks open and close sessions meanwhile: every page is in id order, and each of
    // these is listed once.
    let mut listed = Vec::new();
    let (mut after, mut closed) = (None, false);
    loop {
        let page = store.sessions(PageRequest::new(after, 2)).await.unwrap();
        assert!(page.items.len() <= 2, "{page:?}");
        listed.extend(page.items.iter().map(|s| s.session.id));
        if !closed {
            // The last of these (never on the first page, four are before it) is closed between
            // two pages: never listed.
            store.close_session(ours[4]).await.unwrap();
            closed = true;
        }
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert!(listed.windows(2).all(|w| w[0] < w[1]), "sessions are listed in id order, once each: {listed:?}");
    let found: Vec<_> = ours.iter().filter(|id| listed.contains(id)).collect();
    assert_eq!(found, ours[..4].iter().collect::<Vec<_>>());
    for id in &ours[..4] {
        store.close_session(*id).await.unwrap();
    }
}
