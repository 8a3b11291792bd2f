//! What the crash tests of gang scheduling share: a gang to submit, and the checks that must
//! hold whatever moment a daemon was killed at.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use allot_client::{AddTask, Client, SubmitApp, TaskGroup, TokenNeed};

pub(crate) const POOLS: usize = 3;
pub(crate) const MEMBERS: u32 = 4;

/// A gang of [`MEMBERS`] tasks of `cpu=1` in `root.crash`, each holding a unit of `seats` if
/// given.
pub(crate) fn gang(id: &str, seats: Option<&str>) -> SubmitApp {
    let tokens: Vec<TokenNeed> =
        seats.into_iter().map(|namespace| TokenNeed { namespace: namespace.to_owned(), units: 1 }).collect();
    SubmitApp {
        priority: None,
        priority_class: None,
        id: id.to_owned(),
        queue: Some("root.crash".to_owned()),
        user: "crash".to_owned(),
        user_groups: Vec::new(),
        tags: BTreeMap::new(),
        task_groups: vec![TaskGroup {
            name: "workers".to_owned(),
            min_members: MEMBERS,
            min_resources: "cpu=1".to_owned(),
            selector: BTreeMap::new(),
            tokens: tokens.clone(),
        }],
        policy: Default::default(),
        tasks: (0..MEMBERS)
            .map(|m| AddTask {
                preemptable: None,
                priority_class: None,
                id: format!("m{m}"),
                resources: "cpu=1".to_owned(),
                tokens: tokens.clone(),
                group: Some("workers".to_owned()),
                priority: Default::default(),
                selector: BTreeMap::new(),
                spec: None,
                retries: None,
            })
            .collect(),
    }
}

/// Retries a call that may meet the moment of a takeover (503) until it answers.
macro_rules! retry {
    ($call:expr) => {{
        let (mut answer, mut last) = (None, String::new());
        let answered = $crate::support::eventually($crate::support::PATIENCE, async || match $call.await {
            Ok(given) => {
                answer = Some(given);
                true
            }
            Err(err) => {
                last = err.to_string();
                false
            }
        })
        .await;
        assert!(answered, "no answer within {:?}: {last}", $crate::support::PATIENCE);
        answer.expect("answered")
    }};
}
pub(crate) use retry;

/// What the daemon says: every application's state and unused placeholders, the placements of
/// its placed tasks, and every live alloc of pools `p0`.. and grant of `seats`.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    apps: Vec<(String, String, usize)>,
    /// (owner, alloc uri, tokens) of unused placeholders and placed tasks.
    placements: Vec<(String, String, Vec<String>)>,
    allocs: BTreeSet<String>,
    grants: BTreeSet<String>,
}

async fn snapshot(client: &Client, seats: Option<&str>) -> Snapshot {
    let mut apps = Vec::new();
    let mut placements = Vec::new();
    let tokens = |p: &allot_client::Placement| p.tokens.iter().map(|t| t.token.clone()).collect::<Vec<_>>();
    for app in retry!(client.apps()).apps {
        apps.push((app.id.clone(), app.state.clone(), app.placeholders.len()));
        for slot in app.placeholders.iter().filter(|s| s.task.is_none()) {
            let owner = format!("{}#{}", app.id, slot.member);
            placements.push((owner, slot.placement.uri.clone(), tokens(&slot.placement)));
        }
        for task in retry!(client.tasks(&app.id)).tasks {
            if matches!(task.state.as_str(), "Allocated" | "Running") {
                let placement = task.placement.expect("a placed task has a placement");
                placements.push((format!("{}/{}", app.id, task.id), placement.uri.clone(), tokens(&placement)));
            }
        }
    }
    let mut allocs = BTreeSet::new();
    for pool in 0..POOLS {
        for alloc in retry!(client.allocs(&format!("p{pool}"))).allocs {
            allocs.insert(alloc.uri);
        }
    }
    let mut grants = BTreeSet::new();
    if let Some(seats) = seats {
        grants = retry!(client.grants(seats)).grants.into_iter().map(|g| g.token).collect();
    }
    placements.sort();
    Snapshot { apps, placements, allocs, grants }
}

/// Checks, on a snapshot that two reads in a row agree on (the scheduler may place between the
/// reads of one snapshot): no gang held in part; no alloc or token placed twice; every live
/// alloc and grant belongs to exactly one placement, and every placement's alloc and grant live.
pub(crate) async fn check_consistent(client: &Client, seats: Option<&str>) {
    let mut last = snapshot(client, seats).await;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(20) {
        let next = snapshot(client, seats).await;
        if next == last {
            break;
        }
        last = next;
    }
    for (app, state, placeholders) in &last.apps {
        match state.as_str() {
            // Waiting for its gang (YuniKorn's Reserving): nothing held yet. Reserved: Running,
            // with every placeholder.
            "Reserving" => assert_eq!(*placeholders, 0, "{app}: a gang held in part before its reservation"),
            "Running" => assert_eq!(*placeholders, MEMBERS as usize, "{app}: a gang held in part"),
            "Accepted" => assert_eq!(*placeholders, 0, "{app}: placeholders before its gang"),
            _ => {}
        }
    }
    let mut placed = BTreeSet::new();
    let mut granted = BTreeSet::new();
    for (owner, uri, tokens) in &last.placements {
        assert!(placed.insert(uri.clone()), "{owner}: alloc {uri} placed twice");
        assert_eq!(tokens.len(), usize::from(seats.is_some()), "{owner}: holds its alloc and its seat together");
        for token in tokens {
            assert!(granted.insert(token.clone()), "{owner}: token {token} granted twice");
        }
    }
    assert_eq!(last.allocs, placed, "every live alloc belongs to exactly one placement, and every placement's lives");
    assert_eq!(last.grants, granted, "every grant belongs to exactly one placement, and every placement's is held");
}
