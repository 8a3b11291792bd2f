//! Placement rules and per-group limits over the API, with callers authenticated: an
//! application runs as its caller (user and groups), and the rules choose its queue when it
//! names none or one its user may not submit to.

use allot_core::access::hash_token;
use allot_core::access::{Binding, Pattern, Permission, Policy, Principal, Role};
use allot_core::apps::placement::{Filter, PlacementRule, PlacementRules, RuleKind};
use allot_server::{Access, Credential, OpenRoutes, ServerState};
use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::support::*;

const ADMIN: &str = "allot_admin";
const ANN: &str = "allot_ann";
const BOB: &str = "allot_bob";
const SHIM: &str = "allot_shim";
const NOBODY: &str = "allot_nobody";

fn access() -> Access {
    let grants = |permission: Permission, patterns: &[&str]| Role {
        grants: patterns.iter().map(|p| (permission, Pattern::parse(p).unwrap())).collect(),
    };
    let submit =
        grants(Permission::Use, &["queue:root.users", "queue:root.groups", "queue:root.default", "queue:root.sales"]);
    let shim = Role {
        grants: vec![
            (Permission::Use, Pattern::parse("*").unwrap()),
            (Permission::Impersonate, Pattern::parse("*").unwrap()),
        ],
    };
    let policy = Policy::new(
        [("submit".to_owned(), submit), ("shim".to_owned(), shim)].into(),
        vec![
            Binding { role: "admin".into(), users: vec!["root".into()], groups: vec![] },
            // The users a shim submits for are judged too: carl by his group.
            Binding {
                role: "submit".into(),
                users: vec!["ann".into(), "bob".into()],
                groups: vec!["data-science".into()],
            },
            Binding { role: "shim".into(), users: vec!["shim".into()], groups: vec![] },
        ],
    )
    .unwrap();
    let credential = |token: &str, user: &str, groups: &[&str]| {
        Credential::new(user, &hash_token(token), Principal::new(user, groups.iter().copied()), None).unwrap()
    };
    let credentials = vec![
        credential(ADMIN, "root", &[]),
        credential(ANN, "ann", &["data-eng", "ops"]),
        credential(BOB, "bob", &["ops"]),
        credential(SHIM, "shim", &[]),
        credential(NOBODY, "nobody", &[]),
    ];
    Access::new(policy, credentials, OpenRoutes::default()).unwrap()
}

fn rule(kind: RuleKind, create: bool, parent: Option<PlacementRule>, filter: Filter) -> PlacementRule {
    PlacementRule::new(kind, create, parent, filter).unwrap()
}

fn fixed(queue: &str) -> PlacementRule {
    rule(RuleKind::Fixed(queue.into()), false, None, Filter::default())
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// `provided`; `user` (create) under `root.users`, not for bob; `primary_group` (create) under
/// `root.groups`, for `data-*` groups; `fixed root.default`.
fn rules() -> PlacementRules {
    let not_bob = Filter::new(true, &names(&["bob"]), &[], "user").unwrap();
    let data_groups = Filter::new(false, &[], &names(&["data-.*"]), "primary_group").unwrap();
    PlacementRules::new(vec![
        rule(RuleKind::Provided, false, None, Filter::default()),
        rule(RuleKind::User, true, Some(fixed("root.users")), not_bob),
        rule(RuleKind::PrimaryGroup, true, Some(fixed("root.groups")), data_groups),
        fixed("root.default"),
    ])
}

async fn call(h: &Harness, method: Method, uri: &str, token: &str, body: Value) -> (StatusCode, Value) {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let response = h.router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

async fn harness(rules: PlacementRules) -> Harness {
    let h = Harness::with_state(|state: ServerState| state.with_access(access()).with_placement(rules));
    for (queue, limits) in [
        ("root.users", json!({})),
        ("root.groups", json!({})),
        ("root.default", json!({})),
        ("root.sales", json!({"submit_acl": "bob"})),
    ] {
        let (status, answer) = call(&h, Method::PUT, &format!("/v1/queues/{queue}"), ADMIN, limits).await;
        assert!(status.is_success(), "{queue}: {answer}");
    }
    h
}

/// Submits `app` as `token`: the status, and the queue, rule, user and groups of the answer.
async fn submit(h: &Harness, token: &str, app: Value) -> (StatusCode, Value) {
    let (status, answer) = call(h, Method::POST, "/v1/apps", token, app).await;
    if !status.is_success() {
        return (status, answer["error"].clone());
    }
    let app = &answer["app"];
    (status, json!([app["queue"], app["queue_rule"], app["user"], app["user_groups"]]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rules_choose_the_queue_of_an_application_that_names_none_or_one_it_may_not_use() {
    let h = harness(rules()).await;
    // ann names none: her own queue, made under root.users; she runs with her groups.
    let (status, app) = submit(&h, ANN, json!({"id": "a1"})).await;
    assert_eq!(status, StatusCode::CREATED, "{app}");
    assert_eq!(app, json!(["root.users.ann", "user (create) under fixed root.users", "ann", ["data-eng", "ops"]]));
    let (status, queue) = call(&h, Method::GET, "/v1/queues/root.users.ann", ADMIN, Value::Null).await;
    assert_eq!((status, queue["leaf"].clone()), (StatusCode::OK, json!(true)), "the queue is made: {queue}");
    // ann names a queue whose ACL leaves her out: the rules again.
    let (_, app) = submit(&h, ANN, json!({"id": "a2", "queue": "root.sales"})).await;
    assert_eq!(app[0], "root.users.ann");
    // bob names it and may use it: it is his, as named (by its path or its one name).
    let (_, app) = submit(&h, BOB, json!({"id": "b1", "queue": "root.sales"})).await;
    assert_eq!(app, json!(["root.sales", null, "bob", ["ops"]]));
    let (_, app) = submit(&h, BOB, json!({"id": "b2", "queue": "sales"})).await;
    assert_eq!(app[0], "root.sales");
    // bob names none: the user rule leaves him out, his group is not data-*: the fixed rule.
    let (_, app) = submit(&h, BOB, json!({"id": "b3"})).await;
    assert_eq!((app[0].clone(), app[1].clone()), (json!("root.default"), json!("fixed root.default")));
    // A shim submits for carl of data-science: the primary group's queue, made.
    let carl = json!({"id": "c1", "user": "carl", "user_groups": ["data-science"]});
    let (status, app) = submit(&h, SHIM, carl).await;
    assert_eq!(status, StatusCode::CREATED, "{app}");
    // ...carl's own queue first, as the user rule comes first.
    assert_eq!(app[0], "root.users.carl");
    // Submitting again answers the application where it is.
    let (status, app) = submit(&h, ANN, json!({"id": "a1"})).await;
    assert_eq!((status, app[0].clone()), (StatusCode::OK, json!("root.users.ann")));
    // Naming other groups is submitting for someone else.
    let (status, error) = submit(&h, ANN, json!({"id": "a3", "user_groups": ["admins"]})).await;
    assert_eq!((status, error["code"].clone()), (StatusCode::FORBIDDEN, json!("forbidden")), "{error}");
    // One who may submit nowhere is refused before any rule is tried.
    let (status, error) = submit(&h, NOBODY, json!({"id": "n1"})).await;
    assert_eq!((status, error["code"].clone()), (StatusCode::FORBIDDEN, json!("forbidden")), "{error}");
    // A queue that cannot be a path is refused as such.
    let (status, error) = submit(&h, BOB, json!({"id": "b4", "queue": "sales.eu"})).await;
    assert_eq!((status, error["code"].clone()), (StatusCode::BAD_REQUEST, json!("invalid_queue")), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_queue_refused_with_no_rule_to_help_is_forbidden_and_without_rules_a_queue_is_needed() {
    // Only for bob: ann's named queue is refused and nothing places her.
    let only_bob = Filter::new(false, &names(&["bob"]), &[], "fixed").unwrap();
    let h =
        harness(PlacementRules::new(vec![rule(RuleKind::Fixed("root.default".into()), false, None, only_bob)])).await;
    let (status, error) = submit(&h, ANN, json!({"id": "a1", "queue": "root.sales"})).await;
    assert_eq!((status, error["code"].clone()), (StatusCode::FORBIDDEN, json!("forbidden")), "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(message.starts_with("user `ann` is not in the submit_acl or admin_acl of queue `root.sales`"), "{message}");
    assert!(message.contains("; and no placement rule placed the application"), "{message}");
    assert!(message.contains("its filter leaves user `ann` out"), "{message}");
    let (status, answer) = call(&h, Method::GET, "/v1/apps/a1", ADMIN, Value::Null).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing is left behind: {answer}");
    // Naming none: no rule gives a usable queue, and each says why.
    let (status, error) = submit(&h, ANN, json!({"id": "a2"})).await;
    assert_eq!((status, error["code"].clone()), (StatusCode::CONFLICT, json!("no_usable_queue")), "{error}");
    let message = error["message"].as_str().unwrap();
    assert_eq!(
        message,
        "application `a2` of user `ann`: no placement rule placed the application: `fixed root.default`: its filter \
         leaves user `ann` out"
    );

    // No rules: the application names its queue.
    let h = harness(PlacementRules::default()).await;
    let (status, error) = submit(&h, ANN, json!({"id": "a1"})).await;
    assert_eq!((status, error["code"].clone()), (StatusCode::CONFLICT, json!("no_usable_queue")), "{error}");
    assert!(error["message"].as_str().unwrap().contains("no placement rules are configured"), "{error}");
    let (status, app) = submit(&h, ANN, json!({"id": "a1", "queue": "users"})).await;
    assert_eq!((status, app), (StatusCode::CREATED, json!(["root.users", null, "ann", ["data-eng", "ops"]])));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_limits_are_set_and_shown_with_the_queue() {
    let h = harness(PlacementRules::default()).await;
    let limits = json!({"group_max_apps": 2, "group_max": "cpu=4"});
    let (status, answer) = call(&h, Method::PUT, "/v1/queues/root.groups", ADMIN, limits).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let (_, queue) = call(&h, Method::GET, "/v1/queues/root.groups", ADMIN, Value::Null).await;
    assert_eq!((queue["group_max_apps"].clone(), queue["group_max"].clone()), (json!(2), json!("cpu=4")), "{queue}");
    let (status, error) = call(&h, Method::PUT, "/v1/queues/root.groups", ADMIN, json!({"group_max": "cpu=x"})).await;
    assert_eq!((status, error["error"]["code"].clone()), (StatusCode::BAD_REQUEST, json!("invalid_resources")));
}
