//! Identity and access over the API: every route declares the one permission it needs, and each
//! is checked with no token, a wrong one, one without the permission, one with it on another
//! resource, and one with it.

use std::collections::BTreeSet;

use allot_core::access::{Binding, Kind, Pattern, Permission, Policy, Principal, Role};
use allot_server::access::{hash_token, Need, Target};
use allot_server::{Access, Credential, OpenRoutes, ServerState};
use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::support::*;

const ADMIN: &str = "allot_admin";
const READER: &str = "allot_reader";
const TEAM: &str = "allot_team";
const NOBODY: &str = "allot_nobody";
const CARL: &str = "allot_carl";
/// Reads every pool, and nothing else.
const POOLS_ONLY: &str = "allot_pools";

fn access() -> Access {
    let team = Role {
        grants: ["namespace:team:*", "pool:team-*", "queue:root.team"]
            .iter()
            .flat_map(|p| [(Permission::Use, Pattern::parse(p).unwrap())])
            .collect(),
    };
    let pools = Role { grants: vec![(Permission::Read, Pattern::parse("pool:*").unwrap())] };
    let policy = Policy::new(
        [("team".to_owned(), team), ("pools".to_owned(), pools)].into(),
        vec![
            Binding { role: "pools".into(), users: vec![], groups: vec!["pool-readers".into()] },
            Binding { role: "admin".into(), users: vec!["root".into()], groups: vec![] },
            Binding { role: "reader".into(), users: vec!["auditor".into()], groups: vec![] },
            Binding { role: "team".into(), users: vec![], groups: vec!["team".into()] },
        ],
    )
    .unwrap();
    let credential = |token: &str, user: &str, groups: &[&str]| {
        Credential::new(user, &hash_token(token), Principal::new(user, groups.iter().copied()), None).unwrap()
    };
    let credentials = vec![
        credential(ADMIN, "root", &[]),
        credential(READER, "auditor", &[]),
        credential(TEAM, "ada", &["team"]),
        credential(NOBODY, "nobody", &[]),
        credential(CARL, "carl", &["team"]),
        credential(POOLS_ONLY, "pool-watcher", &["pool-readers"]),
    ];
    Access::new(policy, credentials, OpenRoutes::default()).unwrap()
}

async fn call(h: &Harness, method: &Method, uri: &str, token: Option<&str>, body: &str) -> (StatusCode, Value, bool) {
    let mut request = Request::builder().method(method.clone()).uri(uri);
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    if !body.is_empty() {
        request = request.header(header::CONTENT_TYPE, "application/json");
    }
    let response = h.router.clone().oneshot(request.body(Body::from(body.to_owned())).unwrap()).await.unwrap();
    let status = response.status();
    let challenged = response.headers().contains_key(header::WWW_AUTHENTICATE);
    // A watch streams for ever: its head is the answer.
    if response.headers().get(header::CONTENT_TYPE).is_some_and(|v| v == "text/event-stream") {
        return (status, Value::Null, challenged);
    }
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null), challenged)
}

/// The team's namespace, pool and queue, and another's, made by the admin.
async fn make_resources(h: &Harness) {
    for (uri, body) in [
        ("/v1/namespaces/team:a", r#"{"quota": 5}"#),
        ("/v1/namespaces/other:a", r#"{"quota": 5}"#),
        ("/v1/pools/team-p", r#"{"capacity": "cpu=4"}"#),
        ("/v1/pools/other-p", r#"{"capacity": "cpu=4"}"#),
        ("/v1/queues/root.team", "{}"),
        ("/v1/queues/root.other", "{}"),
    ] {
        let (status, body, _) = call(h, &Method::PUT, uri, Some(ADMIN), body).await;
        assert!(status.is_success(), "{uri}: {status} {body}");
    }
}

/// The route's path with its parameters filled in: on the team's resources, or another's.
fn fill(path: &str, own: bool) -> String {
    let (namespace, pool, queue, app) = if own {
        ("team:a", "team-p", "root.team", "team-app")
    } else {
        ("other:a", "other-p", "root.other", "other-app")
    };
    path.replace("{namespace}", namespace)
        .replace("{pool}", pool)
        .replace("{queue}", queue)
        .replace("{app}", app)
        .replace("{token}", "t1")
        .replace("{task}", "t1")
        .replace("{id}", "0123456789abcdef0123456789abcdef")
        .replace("{offer}", "0")
        .replace("{alloc}", "0123456789abcdef")
        .replace("{name}", "x")
        .replace("{file}", "app.js")
        .replace("{*page}", "namespaces/team:a")
}

/// A body for `method` on `path`: one that names the team's resources (`own`) or another's
/// where the body names them (a submission's queue), else `{}`.
fn body_of(method: &Method, path: &str, own: bool) -> String {
    match (method, path) {
        (&Method::POST, "/v1/apps") => {
            let queue = if own { "root.team" } else { "root.other" };
            json!({"id": format!("app-in-{}", &queue[5..]), "queue": queue}).to_string()
        }
        (&Method::PUT | &Method::POST, _) => "{}".to_owned(),
        _ => String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_needs_one_permission_and_is_refused_without_it() {
    let h = Harness::with_state(|state: ServerState| state.with_access(access()));
    let needs = allot_server::route_needs(ServerState::new(h.store.clone()));
    // Every documented operation has its permission, and every route is documented.
    let (_, document, _) = call(&h, &Method::GET, "/openapi.json", Some(READER), "").await;
    let mut documented = BTreeSet::new();
    for (path, item) in document["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            let method: Method = method.to_uppercase().parse().unwrap();
            assert!(needs.get(&method, path).is_some(), "{method} {path} declares no permission");
            documented.insert((method.to_string(), path.clone()));
        }
    }
    let declared: BTreeSet<(String, String)> = needs.all().map(|(m, p, _)| (m.to_string(), p.to_owned())).collect();
    // The document, the metrics and the dashboard's files are not in the document.
    let undocumented: Vec<_> = declared.difference(&documented).map(|(m, p)| format!("{m} {p}")).collect();
    assert_eq!(
        undocumented,
        ["GET /", "GET /metrics", "GET /openapi.json", "GET /ui", "GET /ui/assets/{file}", "GET /ui/{*page}"],
        "the routes and the document disagree"
    );

    make_resources(&h).await;
    // The team's application is ada's: its own user may end it with `use`.
    for (id, queue, user) in
        [("team-app", "root.team", json!(["ada", ["team"]])), ("other-app", "root.other", json!(["root", []]))]
    {
        let tasks = json!([{"id": "t1", "resources": "cpu=1"}]);
        let app = json!({"id": id, "queue": queue, "user": user[0], "user_groups": user[1], "tasks": tasks});
        let (status, body, _) = call(&h, &Method::POST, "/v1/apps", Some(ADMIN), &app.to_string()).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }

    let mut checked = 0;
    // Removals last: the resources the others are checked on stay.
    let mut routes: Vec<_> = needs.all().collect();
    routes.sort_by_key(|(method, path, _)| (**method == Method::DELETE, *path));
    for (method, path, need) in routes {
        let uri = fill(path, true);
        let body = &body_of(method, path, true);
        let (permission, target) = match need {
            Need::Open => {
                let (status, _, _) = call(&h, method, &uri, None, body).await;
                assert!(status.is_success() || status.is_redirection(), "{method} {path} is open: {status}");
                continue;
            }
            Need::Authenticated => {
                let (status, _, challenged) = call(&h, method, &uri, None, body).await;
                assert!(status == StatusCode::UNAUTHORIZED && challenged, "{method} {path} needs a caller: {status}");
                let (status, answer, _) = call(&h, method, &uri, Some(NOBODY), body).await;
                assert_eq!(status, StatusCode::OK, "{method} {path} answers any caller: {answer}");
                continue;
            }
            Need::Needs(permission, target) => (permission, target),
        };
        checked += 1;
        let (status, answer, challenged) = call(&h, method, &uri, None, body).await;
        assert_eq!(
            (status, answer["error"]["code"].clone()),
            (StatusCode::UNAUTHORIZED, json!("unauthenticated")),
            "{method} {path}"
        );
        assert!(challenged, "{method} {path}: a 401 carries WWW-Authenticate");
        let (status, answer, challenged) = call(&h, method, &uri, Some("allot_wrong"), body).await;
        assert_eq!(
            (status, answer["error"]["code"].clone()),
            (StatusCode::UNAUTHORIZED, json!("unauthenticated")),
            "{method} {path}"
        );
        assert!(challenged && !answer.to_string().contains("allot_wrong"), "{method} {path}: the token is not echoed");
        let (status, answer, _) = call(&h, method, &uri, Some(NOBODY), body).await;
        assert_eq!(
            (status, answer["error"]["code"].clone()),
            (StatusCode::FORBIDDEN, json!("forbidden")),
            "{method} {path}"
        );
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("`{permission}`")),
            "{method} {path}: the refusal names the permission: {message}"
        );
        if permission != Permission::Read {
            let (status, _, _) = call(&h, method, &uri, Some(READER), body).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}: reading is not {permission}");
        }
        // With it on another resource.
        if matches!(target, Target::Path(_) | Target::AppQueue | Target::Body(_)) {
            let other = fill(path, false);
            let (status, answer, _) = call(&h, method, &other, Some(TEAM), &body_of(method, path, false)).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{method} {other}: {answer}");
            let message = answer["error"]["message"].as_str().unwrap();
            assert!(message.contains("other"), "{method} {other}: the refusal names the resource: {message}");
        }
        // With it.
        let token = if permission == Permission::Read { READER } else { ADMIN };
        let (status, answer, _) = call(&h, method, &uri, Some(token), body).await;
        assert!(
            status != StatusCode::UNAUTHORIZED && status != StatusCode::FORBIDDEN,
            "{method} {path} with `{permission}`: {status} {answer}"
        );
        let team_may =
            permission != Permission::Admin && !matches!(target, Target::Daemon | Target::Some(Kind::Daemon));
        if team_may && !matches!(target, Target::Some(_) | Target::Named) {
            let (status, answer, _) = call(&h, method, &uri, Some(TEAM), body).await;
            assert!(
                status != StatusCode::UNAUTHORIZED && status != StatusCode::FORBIDDEN,
                "{method} {path} by the team on its own: {status} {answer}"
            );
        }
    }
    assert!(checked > 40, "{checked} routes checked");
    let (status, _, _) = call(&h, &Method::GET, "/healthz", None, "").await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_answer_only_what_the_caller_may_see_and_submissions_are_the_callers() {
    let h = Harness::with_state(|state: ServerState| state.with_access(access()));
    make_resources(&h).await;
    let names = |list: &Value, field: &str, key: &str| -> Vec<String> {
        list[field].as_array().unwrap().iter().map(|item| item[key].as_str().unwrap().to_owned()).collect()
    };
    let (_, list, _) = call(&h, &Method::GET, "/v1/namespaces", Some(TEAM), "").await;
    assert_eq!(names(&list, "namespaces", "name"), vec!["team:a"]);
    let (_, list, _) = call(&h, &Method::GET, "/v1/namespaces", Some(ADMIN), "").await;
    assert_eq!(names(&list, "namespaces", "name"), vec!["other:a", "team:a"]);
    let (_, list, _) = call(&h, &Method::GET, "/v1/pools", Some(TEAM), "").await;
    assert_eq!(names(&list, "pools", "name"), vec!["team-p"]);
    let (_, list, _) = call(&h, &Method::GET, "/v1/queues", Some(TEAM), "").await;
    assert_eq!(names(&list, "queues", "path"), vec!["root.team"]);
    let (status, _, _) = call(&h, &Method::GET, "/v1/namespaces", Some(NOBODY), "").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "who may see no namespace may not list them");

    // The application's user is the caller; naming another needs `impersonate`.
    let app = json!({"id": "mine", "queue": "root.team"});
    let (status, answer, _) = call(&h, &Method::POST, "/v1/apps", Some(TEAM), &app.to_string()).await;
    assert_eq!((status, answer["app"]["user"].clone()), (StatusCode::CREATED, json!("ada")), "{answer}");
    let app = json!({"id": "theirs", "queue": "root.team", "user": "bob"});
    let (status, answer, _) = call(&h, &Method::POST, "/v1/apps", Some(TEAM), &app.to_string()).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("`impersonate`"), "{answer}");
    // Even the admin submits for a user only where that user may submit: bob may use nothing.
    let (status, answer, _) = call(&h, &Method::POST, "/v1/apps", Some(ADMIN), &app.to_string()).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("user `bob` may not do this: it needs `use` on queue `root.team`"), "{message}");
    let app = json!({"id": "theirs", "queue": "root.team", "user": "carl", "user_groups": ["team"]});
    let (status, answer, _) = call(&h, &Method::POST, "/v1/apps", Some(ADMIN), &app.to_string()).await;
    assert_eq!((status, answer["app"]["user"].clone()), (StatusCode::CREATED, json!("carl")), "{answer}");
    let app = json!({"id": "elsewhere", "queue": "root.other"});
    let (status, _, _) = call(&h, &Method::POST, "/v1/apps", Some(TEAM), &app.to_string()).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (_, list, _) = call(&h, &Method::GET, "/v1/apps", Some(TEAM), "").await;
    assert_eq!(names(&list, "apps", "id"), vec!["mine", "theirs"]);

    // A watch may see only what the caller may read.
    for (query, token, allowed) in [
        ("?prefix=namespaces/team:a", TEAM, true),
        ("?prefix=namespaces/other:a", TEAM, false),
        ("?prefix=namespaces/team", TEAM, false),
        ("?prefix=pools/team-p", TEAM, true),
        ("?prefix=pools/other-p", TEAM, false),
        ("?kind=pool.put", POOLS_ONLY, true),
        ("?kind=grant.granted", POOLS_ONLY, false),
        ("?kind=grant.granted", TEAM, false),
        ("", TEAM, false),
        ("", READER, true),
    ] {
        let (status, answer, _) = call(&h, &Method::GET, &format!("/v1/watch{query}"), Some(token), "").await;
        let expected = if allowed { StatusCode::OK } else { StatusCode::FORBIDDEN };
        assert_eq!(status, expected, "watch{query}: {answer}");
    }
    // Reports of task ends are checked one by one.
    let ends = json!({"tasks": [
        {"app": "mine", "task": "t1", "outcome": "completed"},
    ]});
    let (status, answer, _) = call(&h, &Method::POST, "/v1/tasks/finish", Some(TEAM), &ends.to_string()).await;
    assert_eq!(
        (status, answer["tasks"][0]["error"]["code"].clone()),
        (StatusCode::OK, json!("task_not_found")),
        "{answer}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_made_through_the_api_work_until_revoked_and_revocation_ends_open_calls() {
    let h = Harness::with_state(|state: ServerState| state.with_access(access()));
    for (uri, body) in [("/v1/namespaces/team:a", r#"{"quota": 1}"#), ("/v1/pools/team-p", r#"{"capacity": "cpu=1"}"#)]
    {
        let (status, _, _) = call(&h, &Method::PUT, uri, Some(ADMIN), body).await;
        assert!(status.is_success());
    }
    // Only an admin makes tokens; the answer shows the token once.
    let made = json!({"name": "bob-laptop", "user": "bob", "groups": ["team"]});
    let (status, _, _) = call(&h, &Method::POST, "/v1/api-tokens", Some(TEAM), &made.to_string()).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, answer, _) = call(&h, &Method::POST, "/v1/api-tokens", Some(ADMIN), &made.to_string()).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    let bob = answer["token"].as_str().unwrap().to_owned();
    assert_eq!(answer["api_token"]["user"], "bob");
    let (status, answer, _) = call(&h, &Method::POST, "/v1/api-tokens", Some(ADMIN), &made.to_string()).await;
    assert_eq!((status, answer["error"]["code"].clone()), (StatusCode::CONFLICT, json!("api_token_exists")));
    for bad in [
        json!({"name": "a b", "user": "bob"}),
        json!({"name": "x", "user": ""}),
        json!({"name": "x", "user": "b", "ttl_ms": 5}),
    ] {
        let (status, _, _) = call(&h, &Method::POST, "/v1/api-tokens", Some(ADMIN), &bad.to_string()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    }
    let (_, list, _) = call(&h, &Method::GET, "/v1/api-tokens", Some(ADMIN), "").await;
    assert_eq!(list["api_tokens"].as_array().unwrap().len(), 1);
    assert!(!list.to_string().contains(&bob) && !list.to_string().contains("sha256"), "no token, no hash: {list}");

    // Bob is of group `team`: he may use the team's namespace, not another's.
    let (status, answer, _) = call(&h, &Method::PUT, "/v1/namespaces/team:a/grants/held", Some(&bob), "").await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let (status, _, _) = call(&h, &Method::GET, "/v1/namespaces/other:a", Some(&bob), "").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // A binding made through the API gives him `reader`; one naming no role is refused.
    let (status, answer, _) =
        call(&h, &Method::PUT, "/v1/bindings/bob-reads", Some(ADMIN), r#"{"role": "nope", "users": ["bob"]}"#).await;
    assert_eq!((status, answer["error"]["code"].clone()), (StatusCode::CONFLICT, json!("unknown_role")));
    let (status, _, _) =
        call(&h, &Method::PUT, "/v1/bindings/bob-reads", Some(ADMIN), r#"{"role": "reader", "users": ["bob"]}"#).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) = call(&h, &Method::GET, "/v1/namespaces/other:a", Some(&bob), "").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "he may read it now (it does not exist)");
    let (_, list, _) = call(&h, &Method::GET, "/v1/bindings", Some(ADMIN), "").await;
    assert_eq!(list["bindings"][0]["role"], "reader");

    // A long poll and a watch held open with his token end once it is revoked.
    let router = h.router.clone();
    let waiting = {
        let bob = bob.clone();
        tokio::spawn(async move {
            let request = Request::builder()
                .method(Method::PUT)
                .uri("/v1/namespaces/team:a/grants/waits")
                .header(header::AUTHORIZATION, format!("Bearer {bob}"))
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(r#"{"wait_ms": 60000}"#))
                .unwrap();
            let response = router.oneshot(request).await.unwrap();
            let status = response.status();
            let bytes = response.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8_lossy(&bytes).into_owned())
        })
    };
    let watch = Request::builder()
        .uri("/v1/watch?prefix=namespaces/team:a")
        .header(header::AUTHORIZATION, format!("Bearer {bob}"))
        .body(Body::empty())
        .unwrap();
    let watching = h.router.clone().oneshot(watch).await.unwrap();
    assert_eq!(watching.status(), StatusCode::OK);
    let stream_ended = tokio::spawn(async move { watching.into_body().collect().await.is_ok() });
    waiters(&h, 1).await;
    assert!(!waiting.is_finished() && !stream_ended.is_finished(), "both are open");
    let (status, _, _) = call(&h, &Method::DELETE, "/v1/api-tokens/bob-laptop", Some(ADMIN), "").await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = tokio::time::timeout(std::time::Duration::from_secs(30), waiting).await.unwrap().unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(body.contains("revoked"), "{body}");
    assert!(tokio::time::timeout(std::time::Duration::from_secs(30), stream_ended).await.unwrap().unwrap());
    let (status, answer, _) = call(&h, &Method::GET, "/v1/namespaces/team:a", Some(&bob), "").await;
    assert_eq!((status, answer["error"]["code"].clone()), (StatusCode::UNAUTHORIZED, json!("unauthenticated")));
    let (_, namespace, _) = call(&h, &Method::GET, "/v1/namespaces/team:a", Some(ADMIN), "").await;
    assert_eq!(namespace["granted_units"], 1, "the revoked waiter left the queue, the held grant stays: {namespace}");
    let (status, _, _) = call(&h, &Method::DELETE, "/v1/api-tokens/bob-laptop", Some(ADMIN), "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_acls_as_yunikorn_has_them_hold_down_the_tree_besides_roles() {
    let h = Harness::with_state(|state: ServerState| state.with_access(access()));
    make_resources(&h).await;
    let (status, answer, _) =
        call(&h, &Method::PUT, "/v1/queues/root.team", Some(ADMIN), r#"{"submit_acl": "ada ops"}"#).await;
    assert_eq!((status, answer["queue"]["submit_acl"].clone()), (StatusCode::OK, json!("ada ops")), "{answer}");
    for leaf in ["root.team.batch", "root.team.etl"] {
        let (status, _, _) = call(&h, &Method::PUT, &format!("/v1/queues/{leaf}"), Some(ADMIN), "{}").await;
        assert_eq!(status, StatusCode::CREATED);
    }
    let (status, _, _) =
        call(&h, &Method::PUT, "/v1/queues/root.team.etl", Some(ADMIN), r#"{"submit_acl": "carl"}"#).await;
    assert_eq!(status, StatusCode::OK);
    let (status, answer, _) =
        call(&h, &Method::PUT, "/v1/queues/root.team", Some(ADMIN), r#"{"submit_acl": "a b c"}"#).await;
    assert_eq!((status, answer["error"]["code"].clone()), (StatusCode::BAD_REQUEST, json!("invalid_argument")));
    for (token, queue, expected) in [
        (TEAM, "root.team.batch", StatusCode::CREATED),
        // Carl holds the team's role, but the parent's list leaves him out of `batch`...
        (CARL, "root.team.batch", StatusCode::FORBIDDEN),
        // ...and `etl`'s own list lets him in (access on a queue or a parent is enough).
        (CARL, "root.team.etl", StatusCode::CREATED),
        (TEAM, "root.team.etl", StatusCode::CREATED),
    ] {
        let app = json!({"id": format!("{}-{}", &token[6..], queue.replace('.', "-")), "queue": queue});
        let (status, answer, _) = call(&h, &Method::POST, "/v1/apps", Some(token), &app.to_string()).await;
        assert_eq!(status, expected, "{token} to {queue}: {answer}");
        if status == StatusCode::FORBIDDEN {
            assert!(answer["error"]["message"].as_str().unwrap().contains("submit_acl"), "{answer}");
        }
    }
    // A list on a queue with none above it: the roles alone decided before.
    let app = json!({"id": "carl-free", "queue": "root.other"});
    let (status, _, _) = call(&h, &Method::POST, "/v1/apps", Some(CARL), &app.to_string()).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "carl's roles do not reach root.other");
    // The admin role is never held back by an ACL.
    let (status, _, _) =
        call(&h, &Method::PUT, "/v1/queues/root.team", Some(ADMIN), r#"{"admin_acl": " ops", "submit_acl": "ada"}"#)
            .await;
    assert_eq!(status, StatusCode::OK);
    let app = json!({"id": "root-app", "queue": "root.team.batch", "user": "ada", "user_groups": ["team"]});
    let (status, answer, _) = call(&h, &Method::POST, "/v1/apps", Some(ADMIN), &app.to_string()).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_belong_to_their_opener() {
    let h = Harness::with_state(|state: ServerState| state.with_access(access()));
    make_resources(&h).await;
    let (status, opened, _) = call(&h, &Method::POST, "/v1/sessions", Some(TEAM), r#"{"ttl_ms": 60000}"#).await;
    assert_eq!((status, opened["owner"].clone()), (StatusCode::CREATED, json!("ada")), "{opened}");
    let id = opened["id"].as_str().unwrap().to_owned();
    let in_session = json!({"session": id}).to_string();
    let (status, answer, _) =
        call(&h, &Method::PUT, "/v1/namespaces/team:a/grants/ada-1", Some(TEAM), &in_session).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    // Carl is in the same team: he sees none of ada's sessions and may do nothing with hers.
    let (status, list, _) = call(&h, &Method::GET, "/v1/sessions", Some(CARL), "").await;
    assert_eq!((status, list["sessions"].clone()), (StatusCode::OK, json!([])), "{list}");
    for (method, uri, body) in [
        (Method::GET, format!("/v1/sessions/{id}"), String::new()),
        (Method::POST, format!("/v1/sessions/{id}/keepalive"), String::new()),
        (Method::DELETE, format!("/v1/sessions/{id}"), String::new()),
        (Method::PUT, "/v1/namespaces/team:a/grants/carl-1".to_owned(), in_session.clone()),
    ] {
        let (status, answer, _) = call(&h, &method, &uri, Some(CARL), &body).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {uri}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(&format!("session `{id}` is not user `carl`'s")), "{message}");
    }
    let (_, namespace, _) = call(&h, &Method::GET, "/v1/namespaces/team:a", Some(ADMIN), "").await;
    assert_eq!(namespace["granted_units"], 1, "carl attached nothing, closed nothing: {namespace}");
    // Its opener sees it and keeps it alive; an admin of the daemon sees every session.
    let (_, list, _) = call(&h, &Method::GET, "/v1/sessions", Some(TEAM), "").await;
    assert_eq!(list["sessions"].as_array().unwrap().len(), 1, "{list}");
    let (status, _, _) = call(&h, &Method::POST, "/v1/sessions", Some(CARL), r#"{"ttl_ms": 60000}"#).await;
    assert_eq!(status, StatusCode::CREATED);
    let (_, list, _) = call(&h, &Method::GET, "/v1/sessions", Some(ADMIN), "").await;
    assert_eq!(list["sessions"].as_array().unwrap().len(), 2, "{list}");
    let (status, _, _) = call(&h, &Method::POST, &format!("/v1/sessions/{id}/keepalive"), Some(TEAM), "").await;
    assert_eq!(status, StatusCode::OK);
    let (status, closed, _) = call(&h, &Method::DELETE, &format!("/v1/sessions/{id}"), Some(TEAM), "").await;
    assert_eq!((status, closed["grants"].as_array().unwrap().len()), (StatusCode::OK, 1), "{closed}");
}

/// A call that stays open with `token` (a waiting allocate, or a watch): its status and body
/// once it ends.
fn open_call(
    h: &Harness,
    token: &str,
    method: Method,
    uri: &str,
    body: &'static str,
) -> tokio::task::JoinHandle<(StatusCode, String)> {
    let router = h.router.clone();
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .unwrap();
    tokio::spawn(async move {
        let response = router.oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    })
}

/// Waits until namespace `team:a` has `n` waiters.
async fn waiters(h: &Harness, n: usize) {
    eventually(&format!("namespace team:a has {n} waiters"), async || {
        let (_, list, _) = call(h, &Method::GET, "/v1/namespaces/team:a/waiters", Some(ADMIN), "").await;
        list["waiters"].as_array().map(Vec::len) == Some(n)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn withdrawn_access_ends_open_calls() {
    let h = Harness::with_state(|state: ServerState| state.with_access(access()));
    make_resources(&h).await;
    let (status, _, _) =
        call(&h, &Method::PUT, "/v1/namespaces/team:a/grants/full", Some(ADMIN), r#"{"units": 5}"#).await;
    assert_eq!(status, StatusCode::OK);
    // Eve holds the team's role only by a binding made through the API.
    let made = json!({"name": "eve-laptop", "user": "eve", "groups": ["visitors"]});
    let (_, answer, _) = call(&h, &Method::POST, "/v1/api-tokens", Some(ADMIN), &made.to_string()).await;
    let eve = answer["token"].as_str().unwrap().to_owned();
    let binding = r#"{"role": "team", "users": ["eve"]}"#;
    assert_eq!(call(&h, &Method::PUT, "/v1/bindings/visit", Some(ADMIN), binding).await.0, StatusCode::OK);
    let waiting = open_call(&h, &eve, Method::PUT, "/v1/namespaces/team:a/grants/eve-1", r#"{"wait_ms": 300000}"#);
    let watching = open_call(&h, &eve, Method::GET, "/v1/watch?prefix=namespaces/team:a", "");
    waiters(&h, 1).await;
    // The binding goes: both calls end, the allocate saying why.
    assert_eq!(call(&h, &Method::DELETE, "/v1/bindings/visit", Some(ADMIN), "").await.0, StatusCode::OK);
    let (status, body) = tokio::time::timeout(std::time::Duration::from_secs(30), waiting).await.unwrap().unwrap();
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body.contains("access was withdrawn") && body.contains("namespace `team:a`"), "{body}");
    let (status, _) = tokio::time::timeout(std::time::Duration::from_secs(30), watching).await.unwrap().unwrap();
    assert_eq!(status, StatusCode::OK, "the stream was open, and has ended");
    waiters(&h, 0).await;
    let (_, namespace, _) = call(&h, &Method::GET, "/v1/namespaces/team:a", Some(ADMIN), "").await;
    assert_eq!(namespace["granted_units"], 5, "nothing was granted to eve: {namespace}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_tokens_expiry_ends_its_open_calls() {
    let expires = std::time::SystemTime::now() + std::time::Duration::from_secs(2);
    let credential = |name: &str, token: &str, principal: Principal, expires| {
        Credential::new(name, &hash_token(token), principal, expires).unwrap()
    };
    let brief = credential("brief", "allot_brief", Principal::new("ada", ["team"]), Some(expires));
    let root = credential("root", ADMIN, Principal::new("root", [""; 0]), None);
    let file = Access::new(access().policy().as_ref().clone(), vec![brief, root], OpenRoutes::default()).unwrap();
    let h = Harness::with_state(|state: ServerState| state.with_access(file));
    make_resources(&h).await;
    let (status, _, _) =
        call(&h, &Method::PUT, "/v1/namespaces/team:a/grants/full", Some(ADMIN), r#"{"units": 5}"#).await;
    assert_eq!(status, StatusCode::OK);
    let waiting =
        open_call(&h, "allot_brief", Method::PUT, "/v1/namespaces/team:a/grants/ada-1", r#"{"wait_ms": 300000}"#);
    let watching = open_call(&h, "allot_brief", Method::GET, "/v1/watch?prefix=namespaces/team:a", "");
    let (status, body) = tokio::time::timeout(std::time::Duration::from_secs(30), waiting).await.unwrap().unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(tokio::time::timeout(std::time::Duration::from_secs(30), watching).await.is_ok(), "the watch ended too");
    let (_, namespace, _) = call(&h, &Method::GET, "/v1/namespaces/team:a", Some(ADMIN), "").await;
    assert_eq!(namespace["granted_units"], 5, "nothing was granted after the token expired: {namespace}");
}
