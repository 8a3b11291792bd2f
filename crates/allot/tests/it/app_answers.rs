//! What the applications part answers a new user, on a real daemon on the embedded store and on
//! two daemons sharing a real `redis-server` (through the one that forwards to the scheduler):
//! a submission refused with a 4xx leaves nothing behind; a gang is Reserving while it waits
//! and Running once every placeholder is held; the allocs the scheduler holds have no lease and
//! say who holds them; an application says when a queue's max holds its tasks; a removal answers
//! what the application became and what was released. On Redis, a quota raised or a pool grown
//! by any daemon starts a scheduling cycle at once.

use std::time::Duration;

use allot_client::Client;
use allot_store_redis::testing::RedisServer;
use serde_json::json;

use crate::redis_apps::scheduler;
use crate::support::{data_dir, eventually, Daemon, PATIENCE};

fn submit(value: serde_json::Value) -> allot_api::SubmitApp {
    serde_json::from_value(value).expect("a valid submission")
}

fn queue(value: serde_json::Value) -> allot_api::PutQueue {
    serde_json::from_value(value).expect("valid queue limits")
}

/// The checks, on whichever daemon `client` talks to.
async fn answers(client: &Client) {
    client.put_queue("root.answers", &queue(json!({}))).await.unwrap();
    client.put_queue("root.answers-small", &queue(json!({"max": "cpu=1"}))).await.unwrap();
    client.put_pool("answers", "cpu=2").await.unwrap();
    let group = json!([{"name": "g", "min_members": 2, "min_resources": "cpu=1"}]);

    // A task larger than its group's placeholder: 409, and no application is left holding room.
    let refused = client
        .submit_app(&submit(json!({"id": "gang", "queue": "root.answers", "task_groups": group, "tasks": [
            {"id": "m0", "resources": "cpu=1", "group": "g"},
            {"id": "m1", "resources": "cpu=2", "group": "g"},
        ]})))
        .await
        .unwrap_err();
    assert_eq!((refused.status(), refused.code()), (Some(409), Some("larger_than_task_group")), "{refused}");
    let refused = client
        .submit_app(&submit(json!({"id": "gang", "queue": "root.answers", "task_groups": group, "tasks": [
            {"id": "m0", "resources": "cpu=1", "group": "g"},
            {"id": "solo", "resources": "cpu=1", "tokens": [{"namespace": "answers:none", "units": 1}]},
        ]})))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Some("namespace_not_found"), "{refused}");
    let gone = client.app("gang").await.unwrap_err();
    assert_eq!(gone.code(), Some("app_not_found"), "a refused submission left its application: {gone}");
    // Nothing reserved for it now, nor by a later cycle: the gang below finds the whole pool
    // (cpu=2) free and holds exactly its own 2 placeholders.
    assert!(client.allocs("answers").await.unwrap().allocs.is_empty(), "nothing was reserved for it");

    // Waiting for its gang: Reserving. Every placeholder held: Running.
    let submitted = client
        .submit_app(&submit(json!({"id": "gang", "queue": "root.answers", "task_groups": group, "tasks": [
            {"id": "m0", "resources": "cpu=1", "group": "g"},
            {"id": "solo", "resources": "cpu=1"},
        ]})))
        .await
        .unwrap();
    assert_eq!(submitted.app.state, "Reserving", "{:?}", submitted.app);
    assert_eq!(submitted.tasks.len(), 2);
    let reserved = eventually(Duration::from_secs(10), async || {
        client.app("gang").await.is_ok_and(|app| app.state == "Running" && app.placeholders.len() == 2)
    })
    .await;
    assert!(reserved, "the gang was reserved: {:?}", client.app("gang").await);
    let gang = client.app("gang").await.unwrap();
    assert_eq!(gang.waiting.as_ref().map(|w| w.code.as_str()), Some("gang_missing_members"), "{gang:?}");
    assert!(gang.placeholders_expire_in_ms.is_some(), "{gang:?}");

    // The scheduler's allocs have no lease: no expiry, and who holds them.
    let allocs = client.allocs("answers").await.unwrap().allocs;
    assert_eq!(allocs.len(), 2, "{allocs:?}");
    for alloc in &allocs {
        assert_eq!(alloc.expires_in_ms, None, "{alloc:?}");
        assert_eq!(alloc.held_by.as_deref(), Some("scheduler"), "{alloc:?}");
        assert!(alloc.owner.starts_with("gang/"), "{alloc:?}");
    }
    // And what is in each: the task that took a placeholder over, and the placeholder left.
    let mut holds = Vec::new();
    let named = eventually(Duration::from_secs(10), async || {
        let allocs = client.allocs("answers").await.unwrap().allocs;
        holds = allocs.into_iter().filter_map(|a| a.task).map(|t| (t.app, t.task, t.placeholder)).collect();
        holds.sort();
        holds.iter().any(|(_, task, _)| task.is_some())
    })
    .await;
    assert!(named && holds.len() == 2, "{holds:?}");
    assert!(holds.iter().all(|(app, _, _)| app == "gang"), "{holds:?}");
    assert_eq!((holds[0].1.as_deref(), holds[1].1.as_deref()), (None, Some("m0")), "{holds:?}");
    assert!(holds[0].2.as_ref().is_some_and(|p| p.starts_with("g#")) && holds[1].2.is_none(), "{holds:?}");
    let raw: serde_json::Value =
        reqwest::get(format!("{}/v1/pools/answers/allocs", client.base_url())).await.unwrap().json().await.unwrap();
    assert!(raw["allocs"][0]["expires_in_ms"].is_null(), "{raw}");

    // A queue's max holds a task back: the application says so too, in words.
    client
        .submit_app(&submit(json!({"id": "small", "queue": "root.answers-small", "tasks": [
            {"id": "big", "resources": "cpu=2"},
        ]})))
        .await
        .unwrap();
    let said = eventually(Duration::from_secs(10), async || {
        client.app("small").await.is_ok_and(|app| app.waiting.is_some_and(|w| w.code == "queue_limit"))
    })
    .await;
    let small = client.app("small").await.unwrap();
    assert!(said, "the application says why it waits: {small:?}");
    let message = small.waiting.unwrap().message;
    assert_eq!(
        message,
        "queue `root.answers-small` would go over its max of cpu=1 (nothing used yet, cpu=2 more wanted)"
    );

    // Removed: what it became, and what was released.
    let removed = client.remove_app("gang").await.unwrap();
    assert_eq!(removed.state, "Failed", "{removed:?}");
    assert_eq!(removed.reason.as_deref(), Some("removed"));
    assert_eq!(removed.tasks.get("Killed"), Some(&2), "{removed:?}");
    let released = removed.released.expect("what the removal released");
    let mut killed = released.tasks_killed.clone();
    killed.sort();
    assert_eq!(killed, ["m0", "solo"]);
    assert_eq!(released.placements.len(), 2, "{released:?}");
    assert_eq!(released.resources, "cpu=2");
    assert!(client.allocs("answers").await.unwrap().allocs.is_empty());
    assert_eq!(client.app("gang").await.unwrap_err().code(), Some("app_not_found"));
    let removed = client.remove_app("small").await.unwrap();
    assert_eq!(removed.state, "Failed");
    assert!(removed.released.unwrap().placements.is_empty());
    orders(client).await;
}

fn wall_now() -> std::time::SystemTime {
    std::time::SystemTime::now()
}

/// When an application was submitted and ended, as timestamps, and lists in those orders.
async fn orders(client: &Client) {
    let before = wall_now() - Duration::from_secs(1);
    // Submitted in an order that is not their ids'.
    let ids = ["order-c", "order-a", "order-d", "order-b"];
    for id in ids {
        client.submit_app(&submit(json!({"id": id, "queue": "root.answers"}))).await.unwrap();
    }
    // Two end: `order-c` first, then `order-d` (in one millisecond or not: submitted in that
    // order too, they are listed in it).
    client.fail_app("order-c", Some("first to end")).await.unwrap();
    client.fail_app("order-d", Some("second to end")).await.unwrap();
    let after = wall_now() + Duration::from_secs(1);
    let listed = |apps: Vec<allot_api::App>| -> Vec<String> {
        apps.into_iter().map(|app| app.id).filter(|id| id.starts_with("order-")).collect()
    };
    let in_order = async |sort| listed(client.apps_in_order(sort).await.unwrap().apps);
    use allot_api::AppSort;
    assert_eq!(in_order(AppSort::Id).await, ["order-a", "order-b", "order-c", "order-d"]);
    assert_eq!(in_order(AppSort::Submitted).await, ids);
    assert_eq!(in_order(AppSort::SubmittedNewestFirst).await, ["order-b", "order-d", "order-a", "order-c"]);
    // Ended first (by end), then the rest in submission order, whichever the direction.
    assert_eq!(in_order(AppSort::Ended).await, ["order-c", "order-d", "order-a", "order-b"]);
    assert_eq!(in_order(AppSort::EndedNewestFirst).await, ["order-d", "order-c", "order-a", "order-b"]);

    // Page by page, one at a time, the same order.
    let mut paged = Vec::new();
    let mut page = allot_client::PageArgs { limit: Some(1), cursor: None };
    loop {
        let list = client.apps_page_in_order(AppSort::SubmittedNewestFirst, &page).await.unwrap();
        paged.extend(listed(list.apps));
        match list.next_cursor {
            Some(cursor) => page.cursor = Some(cursor),
            None => break,
        }
    }
    assert_eq!(paged, ["order-b", "order-d", "order-a", "order-c"]);
    // A cursor goes on in its own list's order, whatever `sort` says.
    let first = client.apps_page_in_order(AppSort::Submitted, &allot_client::PageArgs { limit: Some(1), cursor: None });
    let first = first.await.unwrap();
    let next = allot_client::PageArgs { limit: Some(1000), cursor: first.next_cursor };
    let rest = client.apps_page_in_order(AppSort::Id, &next).await.unwrap();
    let all = listed(client.apps_in_order(AppSort::Submitted).await.unwrap().apps);
    assert_eq!(listed(first.apps.into_iter().chain(rest.apps).collect()), all);

    // The timestamps: within the test's time, in submission order, the end after it.
    let timestamp = |text: &str| humantime::parse_rfc3339(text).unwrap_or_else(|e| panic!("`{text}`: {e}"));
    let mut last = before;
    for id in ids {
        let app = client.app(id).await.unwrap();
        let submitted = timestamp(&app.submitted_at);
        assert!(submitted >= last && submitted <= after, "{id}: {}", app.submitted_at);
        last = submitted;
        match app.ended_at.as_deref() {
            Some(ended) => {
                assert!(["order-c", "order-d"].contains(&id), "{id} has not ended");
                assert!(timestamp(ended) >= submitted && timestamp(ended) <= after, "{id}: {ended}");
            }
            None => assert!(["order-a", "order-b"].contains(&id), "{id} ended: {app:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applications_answer_what_a_new_user_expects_on_the_embedded_store() {
    let (_dir, data) = data_dir();
    let daemon = tokio::task::spawn_blocking(move || Daemon::start(&data, &[])).await.unwrap();
    answers(&daemon.client()).await;
}

/// Two daemons on one Redis; the calls go to the one that does not schedule (it forwards).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applications_answer_what_a_new_user_expects_on_redis_and_room_made_anywhere_schedules_at_once() {
    let redis = RedisServer::start();
    let store = redis.url();
    let start = |store: String| {
        tokio::task::spawn_blocking(move || {
            let (dir, data) = data_dir();
            // The pools and quotas are read again only when a daemon made room: an hour's refresh
            // never comes within the test.
            let daemon = Daemon::start(&data, &["--store", &store, "--redis-sched-refresh", "1h"]);
            (dir, daemon)
        })
    };
    let (_a_dir, a) = start(store.clone()).await.unwrap();
    let (_b_dir, b) = start(store).await.unwrap();
    let elected =
        eventually(Duration::from_secs(10), async || [&a, &b].iter().any(|d| d.url == scheduler(&redis))).await;
    assert!(elected, "one daemon schedules");
    let (leader, other) = if a.url == scheduler(&redis) { (&a, &b) } else { (&b, &a) };
    let other = other.client();
    let ready = eventually(Duration::from_secs(10), async || other.queues().await.is_ok()).await;
    assert!(ready, "the applications part is served");
    answers(&other).await;

    // Room made through the daemon that does not schedule (a quota raised, a pool grown) admits
    // what waits at once, not when the scheduler next reads the pools and namespaces: that is in
    // an hour (`--redis-sched-refresh`), so only the room made can admit it. Five times each.
    let leader = leader.client();
    other.put_queue("root.room", &queue(json!({}))).await.unwrap();
    for round in 0..5 {
        let (pool, namespace) = (format!("room-{round}"), format!("room:{round}"));
        let labels: std::collections::BTreeMap<String, String> = [("room".to_owned(), pool.clone())].into();
        // What waits could fit (what can never fit is refused at submit): the quota is paused
        // (0), and half the pool is held by an alloc.
        other.put_pool_with_labels(&pool, "cpu=2", labels.clone()).await.unwrap();
        let held = allot_api::Accept { min: "cpu=1".into(), owner: Some("me".into()), ..Default::default() };
        other.accept(&pool, "1", &held).await.unwrap();
        other.put_namespace(&namespace, 0).await.unwrap();
        let group = json!([{"name": "g", "min_members": 1, "min_resources": "cpu=1",
            "selector": {}, "tokens": [{"namespace": namespace, "units": 2}]}]);
        let gang = format!("tokens-{round}");
        other.submit_app(&submit(json!({"id": gang, "queue": "root.room", "task_groups": group}))).await.unwrap();
        let task = format!("big-{round}");
        other
            .submit_app(&submit(json!({"id": task, "queue": "root.room", "tasks": [
                {"id": "t", "resources": "cpu=2", "selector": {"room": pool}},
            ]})))
            .await
            .unwrap();
        let waiting = eventually(Duration::from_secs(10), async || {
            let gang = leader.app(&gang).await;
            let task = leader.task(&task, "t").await;
            gang.is_ok_and(|g| g.waiting.is_some()) && task.is_ok_and(|t| t.waiting.is_some())
        })
        .await;
        assert!(waiting, "both wait");
        // Room made through the other daemon.
        other.put_namespace(&namespace, 2).await.unwrap();
        let reserved =
            eventually(PATIENCE, async || leader.app(&gang).await.is_ok_and(|app| app.state == "Running")).await;
        assert!(reserved, "the gang was reserved once its tokens were there");
        other.put_pool_with_labels(&pool, "cpu=4", labels).await.unwrap();
        let placed =
            eventually(PATIENCE, async || leader.task(&task, "t").await.is_ok_and(|t| t.state == "Allocated")).await;
        assert!(placed, "the task was placed once its pool grew");
        other.remove_app(&gang).await.unwrap();
        other.remove_app(&task).await.unwrap();
    }

    // A task added through the other daemon right after the pool only it fits in was made there:
    // what seems never to fit on the scheduler's last reading is asked again on the pools as
    // they are, not refused.
    let labels: std::collections::BTreeMap<String, String> = [("room".to_owned(), "fresh".to_owned())].into();
    other.put_pool_with_labels("fresh", "cpu=64", labels).await.unwrap();
    other.submit_app(&submit(json!({"id": "late", "queue": "root.room"}))).await.unwrap();
    let big: allot_api::AddTask =
        serde_json::from_value(json!({"id": "big", "resources": "cpu=64", "selector": {"room": "fresh"}})).unwrap();
    other.add_task("late", &big).await.unwrap();
    // And what can never fit is still refused.
    let huge: allot_api::AddTask =
        serde_json::from_value(json!({"id": "huge", "resources": "cpu=65", "selector": {"room": "fresh"}})).unwrap();
    let refused = other.add_task("late", &huge).await.unwrap_err().to_string();
    assert!(refused.contains("task_never_fits"), "{refused}");
}
