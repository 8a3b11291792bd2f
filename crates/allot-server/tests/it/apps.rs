//! The applications over the API: queues, applications and tasks, and bad ones refused.

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_applications_and_tasks_over_the_api() {
    let h = Harness::new();
    let (status, _) =
        h.call(Method::PUT, "/v1/pools/gpu-1", r#"{"capacity": "cpu=8,gpu=1", "labels": {"kind": "gpu"}}"#).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, body) = h.call(Method::PUT, "/v1/queues/root.ml", r#"{"max": "cpu=6", "sort": "priority"}"#).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["queue"]["sort"], "priority");
    let app = json!({
        "id": "train-1", "queue": "root.ml", "user": "ada",
        "task_groups": [{"name": "workers", "min_members": 2, "min_resources": "cpu=2", "selector": {"kind": "gpu"}}],
        "policy": {"placeholder_timeout_ms": 60000, "gang": "Hard"},
        "tasks": [{"id": "w0", "resources": "cpu=2", "group": "workers", "spec": {"image": "trainer:1"}},
                  {"id": "w1", "resources": "cpu=1", "group": "workers"},
                  {"id": "eval", "resources": "cpu=4"}]
    });
    let (status, body) = h.call(Method::POST, "/v1/apps", &app.to_string()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["tasks"].as_array().unwrap().len(), 3);
    let (status, again) = h.call(Method::POST, "/v1/apps", &app.to_string()).await;
    assert_eq!((status, again["created"].clone()), (StatusCode::OK, json!(false)));
    let body = until(&h, "/v1/apps/train-1", |b| b["state"] == "Running").await;
    assert_eq!(body["placeholders"].as_array().unwrap().len(), 2);
    assert_eq!(body["tasks"]["Allocated"], 2);
    let w0 = until(&h, "/v1/apps/train-1/tasks/w0", |b| b["state"] == "Allocated").await;
    assert_eq!(w0["placement"]["pool"], "gpu-1");
    assert_eq!(w0["spec"]["image"], "trainer:1", "the opaque spec comes back as it was given");
    // `eval` would take the queue over its max: it waits and says so.
    let eval = until(&h, "/v1/apps/train-1/tasks/eval", |b| !b["waiting"].is_null()).await;
    assert_eq!(eval["waiting"]["code"], "queue_limit", "{eval}");
    assert!(eval["waiting"]["message"].as_str().unwrap().contains("root.ml"), "{eval}");
    let app = until(&h, "/v1/apps/train-1", |b| !b["waiting"].is_null()).await;
    assert_eq!(app["waiting"], eval["waiting"], "the application says what holds its task back");
    let metrics = h.call(Method::GET, "/metrics", "").await.1;
    let metrics = metrics.as_str().unwrap();
    for line in [
        "allot_apps_queue_used{queue=\"root.ml\",resource=\"cpu\"} 4",
        "allot_apps_queue_max{queue=\"root.ml\",resource=\"cpu\"} 6",
        "allot_apps_queue_pending_tasks{queue=\"root.ml\"} 1",
        // The task, and its application, which says what holds its tasks back.
        "allot_apps_queue_waiting{queue=\"root.ml\",reason=\"queue_limit\"} 2",
        "allot_apps_reservations_total 1",
        "allot_apps_takeovers_total 2",
    ] {
        assert!(metrics.contains(line), "missing `{line}` in:\n{metrics}");
    }
    // The alloc is held by the scheduler.
    let uri = w0["placement"]["uri"].as_str().unwrap();
    let (status, body) = h
        .call(Method::DELETE, &format!("/v1/pools/{uri}").replace("/v1/pools/gpu-1/", "/v1/pools/gpu-1/allocs/"), "")
        .await;
    assert_eq!((status, body["error"]["code"].clone()), (StatusCode::CONFLICT, json!("held_by_scheduler")));
    // Reports from whoever runs the tasks.
    let (status, body) = h.call(Method::POST, "/v1/apps/train-1/tasks/w0/start", "").await;
    assert_eq!((status, body["state"].clone()), (StatusCode::OK, json!("Running")));
    let (status, body) = h.call(Method::POST, "/v1/apps/train-1/tasks/w0/start", "").await;
    assert_eq!((status, body["error"]["code"].clone()), (StatusCode::CONFLICT, json!("illegal_transition")));
    let (status, body) = h.call(Method::POST, "/v1/apps/train-1/tasks/w0/complete", "").await;
    assert_eq!((status, body["state"].clone()), (StatusCode::OK, json!("Completed")));
    until(&h, "/v1/apps/train-1/tasks/eval", |b| b["state"] == "Allocated").await;
    let (status, body) = h.call(Method::POST, "/v1/apps/train-1/fail", r#"{"reason": "bad data"}"#).await;
    assert_eq!(
        (status, body["state"].clone(), body["reason"].clone()),
        (StatusCode::OK, json!("Failed"), json!("bad data"))
    );
    let (_, pool) = h.call(Method::GET, "/v1/pools/gpu-1", "").await;
    assert_eq!(pool["allocs"], 0, "everything was released: {pool}");
    let (status, list) = h.call(Method::GET, "/v1/apps?limit=1", "").await;
    assert_eq!((status, list["apps"][0]["id"].clone()), (StatusCode::OK, json!("train-1")));
    let (status, _) = h.call(Method::DELETE, "/v1/apps/train-1", "").await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_grants_are_the_schedulers_and_no_client_releases_them() {
    let h = Harness::new();
    h.call(Method::PUT, "/v1/pools/p", r#"{"capacity": "cpu=4"}"#).await;
    h.call(Method::PUT, "/v1/queues/root.q", "{}").await;
    h.call(Method::PUT, "/v1/namespaces/seats", r#"{"quota": 2}"#).await;
    // A client's token with the name the scheduler's had before `@` is no one else's.
    let (status, _) = h.call(Method::PUT, "/v1/namespaces/seats/grants/a:t", r#"{"units": 1}"#).await;
    assert_eq!(status, StatusCode::OK);
    let app = r#"{"id": "a", "queue": "root.q", "tasks": [{"id": "t", "resources": "cpu=1", "tokens": [{"namespace": "seats", "units": 1}]}]}"#;
    assert_eq!(h.call(Method::POST, "/v1/apps", app).await.0, StatusCode::CREATED);
    until(&h, "/v1/apps/a/tasks/t", |b| b["state"] == "Allocated").await;
    let (status, grant) = h.call(Method::GET, "/v1/namespaces/seats/grants/@a:t", "").await;
    assert_eq!((status, grant["held_by"].clone()), (StatusCode::OK, json!("scheduler")), "{grant}");
    assert!(grant["ttl_ms"].is_null() && grant["expires_in_ms"].is_null(), "{grant}");
    let (_, client) = h.call(Method::GET, "/v1/namespaces/seats/grants/a:t", "").await;
    assert!(client["held_by"].is_null(), "{client}");
    let fencing = grant["fencing"].as_u64().unwrap();
    for (method, uri, body, want, code) in [
        (Method::DELETE, "/v1/namespaces/seats/grants/@a:t".to_owned(), "", StatusCode::CONFLICT, "held_by_scheduler"),
        (
            Method::DELETE,
            format!("/v1/namespaces/seats/grants/@a:t?fencing={fencing}"),
            "",
            StatusCode::CONFLICT,
            "held_by_scheduler",
        ),
        (
            Method::DELETE,
            "/v1/namespaces/seats/grants/%40a:t".to_owned(),
            "",
            StatusCode::CONFLICT,
            "held_by_scheduler",
        ),
        (
            Method::POST,
            "/v1/namespaces/seats/grants/@a:t/keepalive".to_owned(),
            "{}",
            StatusCode::CONFLICT,
            "held_by_scheduler",
        ),
        (
            Method::PUT,
            "/v1/namespaces/seats/grants/@a:t".to_owned(),
            r#"{"units": 1}"#,
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        (
            Method::PUT,
            "/v1/namespaces/seats/grants/@b:t".to_owned(),
            r#"{"units": 1, "wait_ms": 100}"#,
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        // Nor is the namespace removed under the task, with force or not.
        (Method::DELETE, "/v1/namespaces/seats".to_owned(), "", StatusCode::CONFLICT, "held_by_scheduler"),
        (Method::DELETE, "/v1/namespaces/seats?force=true".to_owned(), "", StatusCode::CONFLICT, "held_by_scheduler"),
    ] {
        let (status, answer) = h.call(method.clone(), &uri, body).await;
        assert_eq!((status, answer["error"]["code"].as_str()), (want, Some(code)), "{method} {uri}: {answer}");
    }
    let (_, namespace) = h.call(Method::GET, "/v1/namespaces/seats", "").await;
    assert_eq!(namespace["granted_units"], 2, "nothing was released: {namespace}");
    // The task's end releases its grant, and only it.
    h.call(Method::POST, "/v1/apps/a/tasks/t/complete", "").await;
    let (status, _) = h.call(Method::GET, "/v1/namespaces/seats/grants/@a:t", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = h.call(Method::GET, "/v1/namespaces/seats/grants/a:t", "").await;
    assert_eq!(status, StatusCode::OK);
    let (status, removed) = h.call(Method::DELETE, "/v1/namespaces/seats?force=true", "").await;
    assert_eq!(
        (status, removed["grants_ended"].clone()),
        (StatusCode::OK, json!(1)),
        "the client's grant ends: {removed}"
    );
}

#[tokio::test]
async fn bad_applications_get_a_code_and_change_nothing() {
    let h = Harness::new();
    h.call(Method::PUT, "/v1/pools/small", r#"{"capacity": "cpu=2"}"#).await;
    h.call(Method::PUT, "/v1/queues/root.q", r#"{"max": "cpu=4"}"#).await;
    let cases = [
        (r#"{"id": "a", "queue": "root"}"#, StatusCode::CONFLICT, "queue_not_a_leaf"),
        (r#"{"id": "a", "queue": "root.nope"}"#, StatusCode::NOT_FOUND, "queue_not_found"),
        (r#"{"id": "a", "queue": "Root.Q"}"#, StatusCode::BAD_REQUEST, "invalid_queue"),
        (r#"{"id": "a:b", "queue": "root.q"}"#, StatusCode::BAD_REQUEST, "invalid_argument"),
        (
            r#"{"id": "a", "queue": "root.q", "task_groups": [{"name": "g", "min_members": 1, "min_resources": "cpu=3"}]}"#,
            StatusCode::CONFLICT,
            "gang_never_fits",
        ),
        (
            r#"{"id": "a", "queue": "root.q", "task_groups": [{"name": "g", "min_members": 3, "min_resources": "cpu=2"}]}"#,
            StatusCode::CONFLICT,
            "gang_exceeds_queue",
        ),
        (
            r#"{"id": "a", "queue": "root.q", "tasks": [{"id": "t", "resources": "cpu=1", "tokens": [{"namespace": "none", "units": 1}]}]}"#,
            // The body names what does not exist, not the path: 409, so that a client never
            // reads it as "the application is gone".
            StatusCode::CONFLICT,
            "namespace_not_found",
        ),
        (
            r#"{"id": "a", "queue": "root.q", "policy": {"placeholder_timeout_ms": 5}}"#,
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        (r#"{"id": "a", "queue": "root.q", "surprise": 1}"#, StatusCode::BAD_REQUEST, "invalid_json"),
        // An object is an object: an array of its fields in order is refused, at any depth.
        (r#"{"id": "a", "queue": "root.q", "policy": [null, null]}"#, StatusCode::BAD_REQUEST, "invalid_json"),
        (
            r#"{"id": "a", "queue": "root.q", "task_groups": [["g", 1, "cpu=1"]]}"#,
            StatusCode::BAD_REQUEST,
            "invalid_json",
        ),
        (r#"{"id": "a", "queue": "root.q", "tasks": [["t", "cpu=1"]]}"#, StatusCode::BAD_REQUEST, "invalid_json"),
        (
            r#"{"id": "a", "queue": "root.q", "tasks": [{"id": "t", "resources": "cpu=lots"}]}"#,
            StatusCode::BAD_REQUEST,
            "invalid_resources",
        ),
    ];
    for (body, status, code) in cases {
        let (got, answer) = h.call(Method::POST, "/v1/apps", body).await;
        assert_eq!((got, answer["error"]["code"].as_str()), (status, Some(code)), "{body}: {answer}");
    }
    // A refused submission leaves nothing behind, whichever part of it was refused.
    let (_, list) = h.call(Method::GET, "/v1/apps", "").await;
    assert_eq!(list["apps"], json!([]), "{list}");
    let larger = r#"{"id": "big", "resources": "cpu=3", "group": "g"}"#;
    h.call(Method::POST, "/v1/apps", r#"{"id": "gang", "queue": "root.q", "task_groups": [{"name": "g", "min_members": 1, "min_resources": "cpu=2"}]}"#).await;
    let (status, body) = h.call(Method::POST, "/v1/apps/gang/tasks", larger).await;
    assert_eq!((status, body["error"]["code"].clone()), (StatusCode::CONFLICT, json!("larger_than_task_group")));
    // A task that names what does not exist, on an application that does: 409, never 404.
    for (task, code) in [
        (r#"{"id": "t", "resources": "cpu=1", "tokens": [{"namespace": "none", "units": 1}]}"#, "namespace_not_found"),
        (r#"{"id": "t", "resources": "cpu=1", "group": "nope"}"#, "unknown_task_group"),
    ] {
        let (status, body) = h.call(Method::POST, "/v1/apps/gang/tasks", task).await;
        assert_eq!((status, body["error"]["code"].clone()), (StatusCode::CONFLICT, json!(code)), "{task}");
    }
    let (status, body) = h.call(Method::GET, "/v1/apps/nope/tasks/x", "").await;
    assert_eq!((status, body["error"]["code"].clone()), (StatusCode::NOT_FOUND, json!("app_not_found")));
}

#[tokio::test]
async fn a_large_application_is_submitted_with_its_tasks_in_one_call() {
    let h = Harness::new();
    let (status, _) = h.call(Method::PUT, "/v1/pools/big", r#"{"capacity": "cpu=5000"}"#).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _) = h.call(Method::PUT, "/v1/queues/root.big", "").await;
    assert_eq!(status, StatusCode::CREATED);
    // 3,000 tasks: a body of about 300 KB, larger than other calls may send (64 KiB). Without a
    // type (run by an outside worker): no executor runs here.
    let tasks: Vec<Value> = (0..3000)
        .map(|i| json!({"id": format!("task-{i:05}"), "resources": "cpu=1", "spec": {"image": "x", "n": i}}))
        .collect();
    let body = json!({"id": "big", "queue": "root.big", "user": "u", "tasks": tasks}).to_string();
    assert!(body.len() > 200_000);
    let (status, got) = h.call(Method::POST, "/v1/apps", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{got}");
    assert_eq!(got["tasks"].as_array().unwrap().len(), 3000);
    let app = until(&h, "/v1/apps/big", |app| app["tasks"]["Allocated"] == json!(3000)).await;
    assert_eq!(app["tasks"].as_object().unwrap().len(), 1, "every task placed: {app}");
    // Other calls keep their limit.
    let huge = format!(r#"{{"quota": 1, "pad": "{}"}}"#, "x".repeat(100_000));
    let (status, _) = h.call(Method::PUT, "/v1/namespaces/big", &huge).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
}

/// Waking a task: a task that does not exist is a 404 of its own; one that exists and is not run
/// by this daemon is a conflict (409 `run_not_here`), not a missing resource.
#[tokio::test]
async fn waking_a_task_not_run_here_is_a_conflict_and_a_missing_one_a_404() {
    let h = Harness::new();
    h.call(Method::PUT, "/v1/queues/root.q", "{}").await;
    let app =
        serde_json::json!({"id": "etl", "queue": "root.q", "user": "u", "tasks": [{"id": "t1", "resources": "cpu=1"}]});
    let (status, _) = h.call(Method::POST, "/v1/apps", &app.to_string()).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, body) = h.call(Method::POST, "/v1/apps/etl/tasks/t1/wake", "").await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("run_not_here")), "{body}");
    let (status, body) = h.call(Method::POST, "/v1/apps/etl/tasks/nope/wake", "").await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("task_not_found")), "{body}");
    let (status, body) = h.call(Method::POST, "/v1/apps/nope/tasks/t1/wake", "").await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("app_not_found")), "{body}");
}

#[tokio::test]
async fn task_ends_are_reported_in_one_call_each_answered_in_order() {
    let h = Harness::new();
    h.call(Method::PUT, "/v1/pools/ends", r#"{"capacity": "cpu=2"}"#).await;
    h.call(Method::PUT, "/v1/queues/root.ends", "{}").await;
    let app = json!({"id": "ends", "queue": "root.ends",
        "tasks": [{"id": "a", "resources": "cpu=1"}, {"id": "b", "resources": "cpu=1"}]});
    let (status, body) = h.call(Method::POST, "/v1/apps", &app.to_string()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    until(&h, "/v1/apps/ends", |b| b["tasks"]["Allocated"] == 2).await;
    let reports = json!({"tasks": [
        {"app": "ends", "task": "a", "outcome": "completed"},
        {"app": "ends", "task": "Not A Name", "outcome": "completed"},
        {"app": "ends", "task": "b", "outcome": "failed", "reason": "exit 3"},
        {"app": "nope", "task": "a", "outcome": "failed"},
        {"app": "ends", "task": "a", "outcome": "completed"},
    ]});
    let (status, body) = h.call(Method::POST, "/v1/tasks/finish", &reports.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let answers = body["tasks"].as_array().unwrap();
    let got: Vec<(Value, Value, Value)> =
        answers.iter().map(|a| (a["task"].clone(), a["ended"]["state"].clone(), a["error"]["code"].clone())).collect();
    assert_eq!(
        got,
        vec![
            (json!("a"), json!("Completed"), Value::Null),
            (json!("Not A Name"), Value::Null, json!("invalid_argument")),
            (json!("b"), json!("Failed"), Value::Null),
            (json!("a"), Value::Null, json!("app_not_found")),
            (json!("a"), Value::Null, json!("illegal_transition")),
        ],
        "{body}"
    );
    assert_eq!(answers[2]["ended"]["reason"], "exit 3");
    assert!(answers[4]["error"]["message"].as_str().unwrap().contains("Completed"), "{body}");
    let (_, pool) = h.call(Method::GET, "/v1/pools/ends", "").await;
    assert_eq!(pool["allocs"], 0, "both ends released their allocs: {pool}");
    until(&h, "/v1/apps/ends", |b| b["state"] == "Completing" || b["state"] == "Completed").await;

    // Bad calls are refused whole, and change nothing.
    let many: Vec<Value> =
        (0..1001).map(|i| json!({"app": "ends", "task": format!("t{i}"), "outcome": "completed"})).collect();
    for (body, code) in [
        (json!({"tasks": many}).to_string(), "invalid_argument"),
        (r#"{"tasks": [{"app": "ends", "task": "a", "outcome": "done"}]}"#.to_owned(), "invalid_json"),
        (r#"{"tasks": [{"app": "ends", "task": "a"}]}"#.to_owned(), "invalid_json"),
        (r#"{"ends": []}"#.to_owned(), "invalid_json"),
    ] {
        let (status, answer) = h.call(Method::POST, "/v1/tasks/finish", &body).await;
        assert_eq!((status, answer["error"]["code"].clone()), (StatusCode::BAD_REQUEST, json!(code)), "{answer}");
    }
    let (status, body) = h.call(Method::POST, "/v1/tasks/finish", r#"{"tasks": []}"#).await;
    assert_eq!((status, body), (StatusCode::OK, json!({"tasks": []})));
}
