//! The checks of the change feed: every change an event, each object's events in commit order,
//! none twice and none skipped; a watch resumed from any revision it was given; "list, then watch
//! from the list's revision" misses nothing. A backend may publish an event after it answered the
//! change (Redis copies it into its log first): the checks wait for what they expect, up to
//! [`PATIENCE`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use allot_core::watch::{keys, EventKind, Filter};
use allot_core::{AllocateRequest, Constraints, LeaseRequest, NamespaceName, Token};

use super::eventually;
use crate::{read_all, Allocation, Event, Store, Watcher};

/// How long an acknowledged change may take to reach a watcher in these checks.
const PATIENCE: Duration = Duration::from_secs(10);

/// Runs every check of the change feed against `store`.
pub async fn run_watch(store: Arc<dyn Store>) {
    let first = random_changes_replayed_give_the_final_grants(store.clone()).await;
    a_watch_resumed_from_a_revision_gets_exactly_what_came_after(&*store, &first).await;
    a_list_then_a_watch_from_its_revision_miss_nothing(store).await;
}

fn ns(name: &str) -> NamespaceName {
    NamespaceName::new(&format!("conformance:{name}")).unwrap()
}

fn request(namespace: &NamespaceName, token: &str) -> AllocateRequest {
    AllocateRequest {
        namespace: namespace.clone(),
        token: Token::new(token).unwrap(),
        units: 1,
        scope: None,
        constraints: Constraints::default(),
        lease: LeaseRequest::None,
    }
}

fn grants_of(namespace: &NamespaceName) -> Filter {
    Filter {
        kinds: vec![EventKind::GrantGranted, EventKind::GrantReleased],
        prefixes: vec![keys::namespace(namespace)],
    }
}

/// The next event, or `None` after `PATIENCE` without one.
async fn next(watcher: &mut Watcher) -> Option<Arc<Event>> {
    match tokio::time::timeout(PATIENCE, watcher.next()).await {
        Ok(Ok(event)) => Some(event),
        Ok(Err(err)) => panic!("the watch ended: {err}"),
        Err(_) => None,
    }
}

/// Applies grant events to a set of tokens held; panics on an event that does not follow from
/// the state before it (a grant of a held token, a release of one not held: an event twice, or
/// one skipped).
fn replay(held: &mut BTreeSet<String>, event: &Event) {
    let token = event.key.rsplit('/').next().unwrap().to_owned();
    match event.kind {
        EventKind::GrantGranted => assert!(held.insert(token), "granted twice without a release: {event:?}"),
        EventKind::GrantReleased => assert!(held.remove(&token), "released without a grant: {event:?}"),
        other => panic!("an event the filter does not take: {other}"),
    }
}

async fn held_now(store: &dyn Store, namespace: &NamespaceName) -> BTreeSet<String> {
    let grants = read_all(|page| store.grants(namespace.clone(), page)).await.unwrap();
    grants.into_iter().map(|g| g.grant.token.to_string()).collect()
}

/// Random allocations and releases of a few tokens by four workers: the events of each token
/// alternate granted and released, and replayed they give the grants the store holds at the end.
/// Returns the namespace and the events seen, in revision order.
async fn random_changes_replayed_give_the_final_grants(store: Arc<dyn Store>) -> (NamespaceName, Vec<Arc<Event>>) {
    let namespace = ns("watch-random");
    let start = store.revision();
    let mut watcher = store.watch(grants_of(&namespace), Some(start)).expect("a watch from the store's revision");
    store.put_namespace(namespace.clone(), 1000).await.unwrap();
    let mut workers = Vec::new();
    for worker in 0..4u64 {
        let (store, namespace) = (store.clone(), namespace.clone());
        workers.push(tokio::spawn(async move {
            let mut seed = worker * 7919 + 17;
            for _ in 0..60 {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let token = format!("t{}", (seed >> 33) % 12);
                if (seed >> 20) % 3 == 0 {
                    store.release(namespace.clone(), Token::new(&token).unwrap(), None).await.unwrap();
                } else {
                    let answer = store.allocate(request(&namespace, &token), Duration::ZERO).await.unwrap();
                    assert!(matches!(answer, Allocation::Granted { .. }), "{answer:?}");
                }
            }
        }));
    }
    for worker in workers {
        worker.await.unwrap();
    }
    let last = held_now(&*store, &namespace).await;
    let mut held = BTreeSet::new();
    let mut seen: Vec<Arc<Event>> = Vec::new();
    // Every change was made before the grants were read: the events end with the final state (which
    // the replay may pass through before), and nothing comes after.
    loop {
        let patience = if held == last { Duration::from_millis(500) } else { PATIENCE };
        let event = match tokio::time::timeout(patience, watcher.next()).await {
            Ok(Ok(event)) => event,
            Ok(Err(err)) => panic!("the watch ended: {err}"),
            Err(_) if held == last => break,
            Err(_) => panic!("events stopped short of the final grants: replayed {held:?}, held {last:?}"),
        };
        if let Some(before) = seen.last() {
            assert!(
                event.revision > before.revision,
                "revisions go back: {} after {}",
                event.revision,
                before.revision
            );
        }
        replay(&mut held, &event);
        seen.push(event);
    }
    (namespace, seen)
}

/// A watch from a revision it was given (any event's) gets exactly the events after it.
async fn a_watch_resumed_from_a_revision_gets_exactly_what_came_after(
    store: &dyn Store,
    (namespace, seen): &(NamespaceName, Vec<Arc<Event>>),
) {
    for cut in [0, seen.len() / 3, seen.len() - 1] {
        let since = seen[cut].revision;
        let mut watcher = store.watch(grants_of(namespace), Some(since)).expect("kept");
        for expected in &seen[cut + 1..] {
            let event = next(&mut watcher).await.expect("the events after the revision");
            assert_eq!((event.revision, event.kind, &event.key), (expected.revision, expected.kind, &expected.key));
        }
    }
}

/// Grants listed at a revision, then watched from it while changes go on: the list with the
/// events replayed onto it is what the store holds at the end (an event the list already shows
/// may come again, and is then one the list reflects: a grant of a token listed, or a release
/// of one not listed, is passed over only before the first event that follows from the list).
async fn a_list_then_a_watch_from_its_revision_miss_nothing(store: Arc<dyn Store>) {
    let namespace = ns("watch-list");
    store.put_namespace(namespace.clone(), 1000).await.unwrap();
    for i in 0..20 {
        store.allocate(request(&namespace, &format!("t{i}")), Duration::ZERO).await.unwrap();
    }
    let before = store.revision();
    let writer = {
        let (store, namespace) = (store.clone(), namespace.clone());
        tokio::spawn(async move {
            for i in 0..40 {
                let token = Token::new(&format!("t{}", i % 20)).unwrap();
                if i % 2 == 0 {
                    store.release(namespace.clone(), token, None).await.unwrap();
                } else {
                    store.allocate(request(&namespace, &format!("u{i}")), Duration::ZERO).await.unwrap();
                }
            }
        })
    };
    // The revision is taken while the writer writes (or after it is done, at worst).
    eventually("the writer has begun", async || store.revision() > before).await;
    let revision = store.revision();
    let mut held = held_now(&*store, &namespace).await;
    let mut watcher = store.watch(grants_of(&namespace), Some(revision)).expect("the list's revision is kept");
    writer.await.unwrap();
    let last = held_now(&*store, &namespace).await;
    // Per token, the events the list already reflects are passed over.
    let mut caught_up: BTreeMap<String, bool> = BTreeMap::new();
    while held != last {
        let event = next(&mut watcher)
            .await
            .unwrap_or_else(|| panic!("the list and the watch missed a change: replayed {held:?}, held {last:?}"));
        let token = event.key.rsplit('/').next().unwrap().to_owned();
        let follows = match event.kind {
            EventKind::GrantGranted => !held.contains(&token),
            _ => held.contains(&token),
        };
        if follows {
            caught_up.insert(token, true);
            replay(&mut held, &event);
        } else {
            assert!(!caught_up.get(&token).copied().unwrap_or(false), "an event twice after the list: {event:?}");
        }
    }
}
