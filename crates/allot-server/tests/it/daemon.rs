//! What the API does for every part: readiness, bad input refused with a code, a full disk,
//! pages, the OpenAPI document and the metrics.

use std::sync::Arc;

use allot_server::{api, MetricsConfig, ServerState};
use allot_store::Store;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::support::*;

/// `/readyz` says whether every part can be served: on the embedded store, from the open to the
/// shutdown; `/healthz` only says that the process answers.
#[tokio::test]
async fn readiness_is_apart_from_liveness() {
    let h = Harness::new();
    let (status, body) = h.call(Method::GET, "/readyz", "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"status": "ready", "backend": "embedded", "checks": [
            {"name": "store", "ready": true}, {"name": "applications", "ready": true}]})
    );
    h.store.shutdown().await;
    let (status, body) = h.call(Method::GET, "/readyz", "").await;
    assert_eq!((status, body["status"].clone()), (StatusCode::SERVICE_UNAVAILABLE, json!("not_ready")), "{body}");
    assert_eq!(body["checks"][0]["ready"], false, "{body}");
    assert!(body["checks"][0]["message"].as_str().unwrap().contains("shutting down"), "{body}");
    let (status, body) = h.call(Method::GET, "/healthz", "").await;
    assert_eq!((status, body["status"].clone()), (StatusCode::OK, json!("ok")));
    let (_, document) = h.call(Method::GET, "/openapi.json", "").await;
    let responses = &document["paths"]["/readyz"]["get"]["responses"];
    assert!(responses["200"].is_object() && responses["503"].is_object(), "{responses}");
}

/// An internal error under the store's lock (here a panic, injected) stops the embedded store:
/// every operation, read or write, is answered `503 store_failed` and `/readyz` says why, until a
/// restart rebuilds the state from the log, where everything acknowledged before is.
#[tokio::test]
async fn an_internal_error_stops_the_store_until_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        Arc::new(allot_store::EmbeddedStore::open(&allot_store::EmbeddedConfig::new(dir.path().to_owned())).unwrap())
    };
    let embedded = open();
    let store: Arc<dyn Store> = embedded.clone();
    let h = Harness { router: api(ServerState::new(store.clone())), store, _dir: tempfile::tempdir().unwrap() };
    let (status, _) = h.call(Method::PUT, "/v1/namespaces/ns", r#"{"quota": 3}"#).await;
    assert!(status.is_success());
    let (status, granted) = h.call(Method::PUT, "/v1/namespaces/ns/grants/t1", r#"{"units": 2}"#).await;
    assert!(status.is_success(), "{granted}");

    embedded.panic_under_lock();
    for (method, uri, body) in [
        (Method::PUT, "/v1/namespaces/ns/grants/t2", r#"{"units": 1}"#),
        (Method::DELETE, "/v1/namespaces/ns/grants/t1", ""),
        (Method::PUT, "/v1/pools/p", r#"{"capacity": "cpu=1"}"#),
        (Method::GET, "/v1/namespaces/ns", ""),
    ] {
        let (status, body) = h.call(method.clone(), uri, body).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{method} {uri}: {body}");
        assert_eq!(body["error"]["code"], "store_failed", "{method} {uri}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().contains("until the daemon is restarted"), "{body}");
    }
    let (status, body) = h.call(Method::GET, "/readyz", "").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["checks"][0]["ready"], false, "{body}");
    assert!(body["checks"][0]["message"].as_str().unwrap().contains("internal error"), "{body}");
    let (status, _) = h.call(Method::GET, "/healthz", "").await;
    assert_eq!(status, StatusCode::OK, "the process still answers");

    h.store.shutdown().await;
    drop(h);
    drop(embedded);
    let store: Arc<dyn Store> = open();
    let h = Harness { router: api(ServerState::new(store.clone())), store, _dir: tempfile::tempdir().unwrap() };
    let (status, body) = h.call(Method::GET, "/v1/namespaces/ns/grants/t1", "").await;
    assert_eq!(status, StatusCode::OK, "the acknowledged grant survived: {body}");
    assert_eq!((body["units"].as_u64(), body["fencing"].as_u64()), (Some(2), Some(1)), "{body}");
    let (status, body) = h.call(Method::PUT, "/v1/namespaces/ns/grants/t2", r#"{"units": 1}"#).await;
    assert!(status.is_success(), "a restarted store serves again: {body}");
    let (status, _) = h.call(Method::GET, "/readyz", "").await;
    assert_eq!(status, StatusCode::OK);
}

/// Each case: method, uri, body, expected status, expected code.
const BAD_INPUT: &[(&str, &str, &str, u16, &str)] = &[
    ("PUT", "/v1/namespaces/x", "{", 400, "invalid_json"),
    ("PUT", "/v1/namespaces/x", r#"{"quota": "ten"}"#, 400, "invalid_json"),
    ("PUT", "/v1/namespaces/x", r#"{"quota": -1}"#, 400, "invalid_json"),
    ("PUT", "/v1/namespaces/x", r#"{"quota": 1.5}"#, 400, "invalid_json"),
    ("PUT", "/v1/namespaces/x", r#"{"quota": 18446744073709551616}"#, 400, "invalid_json"),
    ("PUT", "/v1/namespaces/x", r#"{"quota": 9007199254740992}"#, 400, "invalid_argument"),
    ("PUT", "/v1/namespaces/x", r#"{"quota": 1, "extra": true}"#, 400, "invalid_json"),
    ("PUT", "/v1/namespaces/x", r#"[1, 2]"#, 400, "invalid_json"),
    ("PUT", "/v1/namespaces/x", r#"[10]"#, 400, "invalid_json"),
    ("PUT", "/v1/namespaces/x", r#"10"#, 400, "invalid_json"),
    ("PUT", "/v1/namespaces/a%2Fb", r#"{"quota": 1}"#, 400, "invalid_name"),
    ("PUT", "/v1/namespaces/a/b", r#"{"quota": 1}"#, 404, "not_found"),
    ("PUT", "/v1/namespaces/hive/grants/a%2Fb", "{}", 400, "invalid_name"),
    ("PUT", "/v1/namespaces/hive/grants/t", r#"[1]"#, 400, "invalid_json"),
    (
        "PUT",
        "/v1/namespaces/hive/grants/t",
        r#"{"scope": {"project": "p", "namespace": "d"}, "caps": [1, 2]}"#,
        400,
        "invalid_json",
    ),
    ("PUT", "/v1/namespaces/hive/grants/t", r#"{"scope": ["p", "d"]}"#, 400, "invalid_json"),
    ("PUT", "/v1/namespaces/hive/grants/t", r#"{"units": 1.5}"#, 400, "invalid_json"),
    ("PUT", "/v1/namespaces/x", "", 400, "invalid_json"),
    ("PUT", "/v1/namespaces/a::b", r#"{"quota": 1}"#, 400, "invalid_name"),
    ("PUT", "/v1/namespaces/a:", r#"{"quota": 1}"#, 400, "invalid_name"),
    ("PUT", "/v1/namespaces/a%0Ab", r#"{"quota": 1}"#, 400, "invalid_name"),
    ("PUT", "/v1/namespaces/%FF", r#"{"quota": 1}"#, 400, "invalid_name"),
    ("PUT", "/v1/namespaces/hive/grants/t", r#"{"units": 0}"#, 400, "invalid_argument"),
    ("PUT", "/v1/namespaces/hive/grants/t", r#"{"units": -3}"#, 400, "invalid_json"),
    ("PUT", "/v1/namespaces/hive/grants/t", r#"{"units": 1e30}"#, 400, "invalid_json"),
    ("PUT", "/v1/namespaces/hive/grants/t", r#"{"units": 1152921504606846976}"#, 400, "invalid_argument"),
    ("PUT", "/v1/namespaces/hive/grants/t", r#"{"ttl_ms": 0}"#, 400, "invalid_argument"),
    ("PUT", "/v1/namespaces/hive/grants/t", r#"{"wait_ms": 86400000}"#, 400, "invalid_argument"),
    ("PUT", "/v1/namespaces/hive/grants/t", r#"{"caps": {"project": 1}}"#, 400, "caps_without_scope"),
    ("PUT", "/v1/namespaces/hive/grants/t", r#"{"scope": {"project": "", "namespace": "d"}}"#, 400, "invalid_name"),
    ("PUT", "/v1/namespaces/hive/grants/t", r#"{"session": "nope"}"#, 400, "invalid_name"),
    (
        "PUT",
        "/v1/namespaces/hive/grants/t",
        r#"{"session": "00000000000000000000000000000001"}"#,
        404,
        "session_not_found",
    ),
    (
        "PUT",
        "/v1/namespaces/hive/grants/t",
        r#"{"ttl_ms": 5, "session": "00000000000000000000000000000001"}"#,
        400,
        "invalid_argument",
    ),
    ("PUT", "/v1/namespaces/hive/grants/held", r#"{"units": 2}"#, 409, "token_conflict"),
    ("PUT", "/v1/namespaces/hive/grants/held", r#"{"ttl_ms": 1000}"#, 409, "token_conflict"),
    ("PUT", "/v1/namespaces/nope/grants/t", "{}", 404, "namespace_not_found"),
    ("DELETE", "/v1/namespaces/hive/grants/held?fencing=99", "", 409, "stale_fencing"),
    ("DELETE", "/v1/namespaces/hive/grants/held?fencing=abc", "", 400, "invalid_argument"),
    ("DELETE", "/v1/namespaces/hive/grants/held?fencing=9223372036854775808", "", 400, "invalid_argument"),
    ("POST", "/v1/namespaces/hive/grants/held/keepalive", r#"{"fencing": 9007199254740992}"#, 400, "invalid_argument"),
    ("DELETE", "/v1/namespaces/hive", "", 409, "namespace_in_use"),
    ("DELETE", "/v1/namespaces/nope", "", 404, "namespace_not_found"),
    ("POST", "/v1/namespaces/hive/grants/missing/keepalive", "", 404, "grant_not_found"),
    ("POST", "/v1/sessions", r#"{"ttl_ms": 0}"#, 400, "invalid_argument"),
    ("POST", "/v1/sessions", r#"{"ttl_ms": 999}"#, 400, "invalid_argument"),
    ("PUT", "/v1/namespaces/hive/grants/t", r#"{"ttl_ms": 999}"#, 400, "invalid_argument"),
    ("POST", "/v1/sessions", r#"{"ttl_ms": 99999999999999}"#, 400, "invalid_argument"),
    ("POST", "/v1/sessions/zz/keepalive", "", 400, "invalid_name"),
    ("GET", "/v1/sessions/00000000000000000000000000000001", "", 404, "session_not_found"),
    ("GET", "/v1/nothing-here", "", 404, "not_found"),
    ("GET", "/v1/namespaces?limit=0", "", 400, "invalid_argument"),
    ("GET", "/v1/namespaces?limit=1001", "", 400, "invalid_argument"),
    ("GET", "/v1/namespaces?limit=-1", "", 400, "invalid_argument"),
    ("GET", "/v1/namespaces?limit=ten", "", 400, "invalid_argument"),
    ("GET", "/v1/namespaces?page=2", "", 400, "invalid_argument"),
    ("GET", "/v1/namespaces?cursor=", "", 400, "invalid_cursor"),
    ("GET", "/v1/namespaces?cursor=zz", "", 400, "invalid_cursor"),
    // A cursor of the pools list, given to the namespaces list.
    ("GET", "/v1/namespaces?cursor=phive", "", 400, "invalid_cursor"),
    ("GET", "/v1/namespaces?cursor=na::b", "", 400, "invalid_cursor"),
    ("GET", "/v1/namespaces/hive/grants?cursor=nhive", "", 400, "invalid_cursor"),
    ("GET", "/v1/namespaces/hive/grants?limit=100000", "", 400, "invalid_argument"),
    ("GET", "/v1/namespaces/nope/grants?limit=10", "", 404, "namespace_not_found"),
    ("GET", "/v1/namespaces/hive/waiters?cursor=w", "", 400, "invalid_cursor"),
    ("GET", "/v1/namespaces/hive/waiters?limit=0", "", 400, "invalid_argument"),
    ("GET", "/v1/sessions?cursor=s00", "", 400, "invalid_cursor"),
    ("GET", "/v1/namespaces/hive/waiters?cursor=w-1", "", 400, "invalid_cursor"),
    ("GET", "/v1/pools?limit=0", "", 400, "invalid_argument"),
    ("GET", "/v1/pools?cursor=nhive", "", 400, "invalid_cursor"),
    ("GET", "/v1/pools/nope/allocs?cursor=a00", "", 400, "invalid_cursor"),
    ("PATCH", "/v1/namespaces/hive", "", 405, "method_not_allowed"),
];

#[tokio::test]
async fn bad_input_gets_a_4xx_with_a_code_and_changes_nothing() {
    let h = Harness::new();
    h.call(Method::PUT, "/v1/namespaces/hive", r#"{"quota": 2}"#).await;
    h.call(Method::PUT, "/v1/namespaces/hive/grants/held", "").await;
    let before = h.everything().await;
    for (method, uri, body, status, code) in BAD_INPUT {
        let (got_status, got) = h.call(Method::from_bytes(method.as_bytes()).unwrap(), uri, body).await;
        assert_eq!(got_status.as_u16(), *status, "{method} {uri} {body}: {got}");
        assert_eq!(got["error"]["code"], *code, "{method} {uri} {body}: {got}");
        let message = got["error"]["message"].as_str().unwrap();
        assert!(!message.is_empty(), "{method} {uri}: empty message");
    }
    // Over-long, unicode and empty names.
    let long = "n".repeat(256);
    let (status, got) = h.call(Method::PUT, &format!("/v1/namespaces/{long}"), r#"{"quota": 1}"#).await;
    assert_eq!((status, got["error"]["code"].clone()), (StatusCode::BAD_REQUEST, json!("invalid_name")));
    let (status, got) = h.call(Method::PUT, &format!("/v1/namespaces/hive/grants/{long}"), "").await;
    assert_eq!((status, got["error"]["code"].clone()), (StatusCode::BAD_REQUEST, json!("invalid_name")));
    let huge = format!(r#"{{"quota": 1, "pad": "{}"}}"#, "x".repeat(100_000));
    let (status, got) = h.call(Method::PUT, "/v1/namespaces/big", &huge).await;
    assert_eq!((status, got["error"]["code"].clone()), (StatusCode::PAYLOAD_TOO_LARGE, json!("payload_too_large")));
    assert_eq!(h.everything().await, before, "a refused request changed the store");

    // Unicode is a name like any other.
    let (status, got) = h.call(Method::PUT, "/v1/namespaces/%E5%90%8D%E5%89%8D:%C3%BC", r#"{"quota": 1}"#).await;
    assert_eq!(status, StatusCode::CREATED, "{got}");
    assert_eq!(got["namespace"]["name"], "名前:ü");
    let (_, got) = h.call(Method::PUT, "/v1/namespaces/%E5%90%8D%E5%89%8D:%C3%BC/grants/a%25b%20c%3F", "").await;
    assert_eq!(got["grant"]["token"], "a%b c?", "{got}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_a_503_with_a_code_and_the_state_stays_whole() {
    use std::sync::atomic::Ordering;

    let dir = tempfile::tempdir().unwrap();
    let (store, faults) = allot_store::fault::open_flaky_store(dir.path()).unwrap();
    let store: Arc<dyn Store> = Arc::new(store);
    let h = Harness { router: api(ServerState::new(store.clone())), store, _dir: dir };
    h.call(Method::PUT, "/v1/namespaces/hive", r#"{"quota": 2}"#).await;
    h.call(Method::PUT, "/v1/namespaces/hive/grants/kept", "").await;
    let before = h.call(Method::GET, "/v1/namespaces/hive/grants", "").await;

    faults.fail_writes.store(true, Ordering::SeqCst);
    for (method, uri, body) in [
        (Method::PUT, "/v1/namespaces/hive/grants/lost", ""),
        (Method::DELETE, "/v1/namespaces/hive/grants/kept", ""),
        (Method::PUT, "/v1/namespaces/hive", r#"{"quota": 5}"#),
        (Method::POST, "/v1/sessions", r#"{"ttl_ms": 1000}"#),
    ] {
        let (status, got) = h.call(method.clone(), uri, body).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{method} {uri}: {got}");
        // `store_unavailable` when the database could be reopened and shows the write did not
        // land; `store_outcome_unknown` when it cannot be reopened while the disk is full.
        let code = got["error"]["code"].as_str().unwrap();
        assert!(["store_unavailable", "store_outcome_unknown"].contains(&code), "{method} {uri}: {got}");
        let message = got["error"]["message"].as_str().unwrap();
        assert!(message.contains("no space left on device"), "{message}");
    }

    faults.fail_writes.store(false, Ordering::SeqCst);
    // Once the disk has room, the daemon answers again with exactly what was acknowledged.
    let mut after = (StatusCode::SERVICE_UNAVAILABLE, Value::Null);
    eventually("the daemon answers again once the disk has room", async || {
        after = h.call(Method::GET, "/v1/namespaces/hive/grants", "").await;
        after.0 == StatusCode::OK
    })
    .await;
    assert_eq!(after, before);
    let (_, namespace) = h.call(Method::GET, "/v1/namespaces/hive", "").await;
    assert_eq!((namespace["quota"].clone(), namespace["granted_units"].clone()), (json!(2), json!(1)));
    let (status, got) = h.call(Method::PUT, "/v1/namespaces/hive/grants/after", "").await;
    assert_eq!((status, got["status"].clone()), (StatusCode::OK, json!("Granted")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_come_in_pages_that_say_where_the_next_starts() {
    let h = Harness::new();
    let names: Vec<String> = (0..105).map(|i| format!("ns-{i:03}")).collect();
    for name in &names {
        h.store.put_namespace(allot_core::NamespaceName::new(name).unwrap(), 30).await.unwrap();
    }
    // 100 by default, then the rest, then the end.
    let (_, first) = h.call(Method::GET, "/v1/namespaces", "").await;
    assert_eq!(first["namespaces"].as_array().unwrap().len(), allot_server::DEFAULT_PAGE);
    let cursor = first["next_cursor"].as_str().unwrap();
    let (_, rest) = h.call(Method::GET, &format!("/v1/namespaces?cursor={cursor}"), "").await;
    assert_eq!(strings(rest["namespaces"].as_array().unwrap(), "name"), names[100..]);
    assert_eq!(rest["next_cursor"], Value::Null);
    let (pages, items) = h.pages("/v1/namespaces", "namespaces", 10).await;
    assert_eq!((pages.len(), strings(&items, "name")), (11, names.clone()));
    let (pages, _) = h.pages("/v1/namespaces", "namespaces", 1000).await;
    assert_eq!(pages.len(), 1);

    // Grants by token; a page read after a release neither repeats nor skips.
    for i in 0..25 {
        let (_, body) = h.call(Method::PUT, &format!("/v1/namespaces/ns-000/grants/t{i:02}"), "").await;
        assert_eq!(body["status"], "Granted");
    }
    let (_, first) = h.call(Method::GET, "/v1/namespaces/ns-000/grants?limit=10", "").await;
    h.call(Method::DELETE, "/v1/namespaces/ns-000/grants/t10", "").await;
    let cursor = first["next_cursor"].as_str().unwrap();
    let (_, second) = h.call(Method::GET, &format!("/v1/namespaces/ns-000/grants?limit=10&cursor={cursor}"), "").await;
    let tokens = strings(second["grants"].as_array().unwrap(), "token");
    assert_eq!(tokens, (11..21).map(|i| format!("t{i:02}")).collect::<Vec<_>>());
    let (pages, items) = h.pages("/v1/namespaces/ns-000/grants", "grants", 8).await;
    assert_eq!((pages.len(), items.len()), (3, 24));

    // Waiters, head first.
    h.call(Method::PUT, "/v1/namespaces/ns-001", r#"{"quota": 1}"#).await;
    h.call(Method::PUT, "/v1/namespaces/ns-001/grants/holder", "").await;
    let mut waiting = Vec::new();
    for i in 0..3 {
        let router = h.router.clone();
        let request = Request::builder()
            .method(Method::PUT)
            .uri(format!("/v1/namespaces/ns-001/grants/w{i}"))
            .body(Body::from(r#"{"wait_ms": 20000}"#))
            .unwrap();
        waiting.push(tokio::spawn(router.oneshot(request)));
        // One at a time, so the queue order is known.
        until(&h, "/v1/namespaces/ns-001/waiters", |body| body["waiters"].as_array().unwrap().len() == i + 1).await;
    }
    let (pages, items) = h.pages("/v1/namespaces/ns-001/waiters", "waiters", 2).await;
    assert_eq!((pages.len(), strings(&items, "token")), (2, vec!["w0".into(), "w1".into(), "w2".into()]));
    assert_eq!(items[2]["position"], 3, "{items:?}");
    h.call(Method::PUT, "/v1/namespaces/ns-001", r#"{"quota": 4}"#).await;
    for answer in waiting {
        assert_eq!(answer.await.unwrap().unwrap().status(), StatusCode::OK);
    }

    // Sessions by id, pools by name, allocs by id.
    for _ in 0..3 {
        h.call(Method::POST, "/v1/sessions", r#"{"ttl_ms": 60000}"#).await;
    }
    let (pages, items) = h.pages("/v1/sessions", "sessions", 2).await;
    let ids = strings(&items, "id");
    assert_eq!((pages.len(), ids.len()), (2, 3));
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    for pool in ["p-c", "p-a", "p-b"] {
        h.call(Method::PUT, &format!("/v1/pools/{pool}"), r#"{"capacity": "cpu=3"}"#).await;
    }
    let (pages, items) = h.pages("/v1/pools", "pools", 2).await;
    assert_eq!((pages.len(), strings(&items, "name")), (2, vec!["p-a".into(), "p-b".into(), "p-c".into()]));
    for _ in 0..3 {
        h.call(Method::POST, "/v1/pools/p-a/offers/1", r#"{"min": "cpu=1"}"#).await;
    }
    let (pages, items) = h.pages("/v1/pools/p-a/allocs", "allocs", 2).await;
    let ids = strings(&items, "id");
    assert_eq!((pages.len(), ids.len()), (2, 3));
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
}

#[tokio::test]
async fn the_openapi_document_describes_pages() {
    let h = Harness::new();
    let (_, document) = h.call(Method::GET, "/openapi.json", "").await;
    for path in [
        "/v1/namespaces",
        "/v1/namespaces/{namespace}/grants",
        "/v1/namespaces/{namespace}/waiters",
        "/v1/sessions",
        "/v1/pools",
        "/v1/pools/{pool}/allocs",
    ] {
        let params = document["paths"][path]["get"]["parameters"].as_array().unwrap_or_else(|| panic!("{path}"));
        let param = |name: &str| params.iter().find(|p| p["name"] == name).unwrap_or_else(|| panic!("{path} {name}"));
        assert_eq!(param("limit")["in"], "query", "{path}");
        assert_eq!(param("cursor")["in"], "query", "{path}");
        assert!(param("cursor")["schema"]["pattern"].as_str().is_some_and(|p| p.starts_with('^')), "{path}");
        let limit = &param("limit")["schema"];
        assert_eq!((limit["minimum"].clone(), limit["maximum"].clone()), (json!(1), json!(1000)), "{path}: {limit}");
        let codes = document["paths"][path]["get"]["responses"]["400"]["description"].as_str().unwrap();
        assert!(codes.contains("invalid_cursor"), "{path}: {codes}");
    }
    for schema in ["NamespaceList", "GrantList", "WaiterList", "SessionList", "PoolList", "AllocList"] {
        let next = &document["components"]["schemas"][schema]["properties"]["next_cursor"];
        assert!(next.is_object(), "{schema} has no next_cursor");
    }
    let description = document["info"]["description"].as_str().unwrap();
    assert!(description.contains("invalid_cursor") && description.contains("next_cursor"), "{description}");
}

/// 10,000 namespaces and 300 pools: a scrape has the totals and the selected ones' series only,
/// so its size does not grow with the number of namespaces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_stay_small_with_10000_namespaces() {
    let h = Harness::with_metrics(MetricsConfig {
        namespaces: vec!["team-007:ns-00700".into(), "team-008:ns-0080*".into()],
        pools: vec!["pool-01*".into()],
    });
    let name = |i: usize| allot_core::NamespaceName::new(&format!("team-{:03}:ns-{i:05}", i / 100)).unwrap();
    // Many at once, so the store group-commits them.
    for chunk in (0..10_000).collect::<Vec<_>>().chunks(1000) {
        let mut puts = tokio::task::JoinSet::new();
        for &i in chunk {
            let store = h.store.clone();
            puts.spawn(async move { store.put_namespace(name(i), 10).await });
        }
        while let Some(put) = puts.join_next().await {
            put.unwrap().unwrap();
        }
    }
    for i in 0..300 {
        let pool = allot_core::pools::PoolName::new(&format!("pool-{i:03}")).unwrap();
        h.store.put_pool(pool, "cpu=2,mem=1GiB".parse().unwrap()).await.unwrap();
    }
    h.call(Method::PUT, "/v1/namespaces/team-007:ns-00700/grants/t", r#"{"units": 4}"#).await;
    let (status, body) = h.call(Method::GET, "/metrics", "").await;
    assert_eq!(status, StatusCode::OK);
    let text = body.as_str().unwrap();
    let lines = text.lines().count();
    eprintln!("scrape at 10,000 namespaces and 300 pools: {lines} lines, {} bytes", text.len());
    // Fixed: totals, request histograms, store counters; 11 selected namespaces and 10 pools.
    assert!(lines < 600, "{lines} lines");
    assert!(text.len() < 64 * 1024, "{} bytes", text.len());
    for metric in [
        "allot_quotas_namespaces 10000",
        "allot_quotas_quota_units 100000",
        "allot_quotas_granted_units 4",
        "allot_quotas_allocations_total{result=\"granted\"} 1",
        "allot_pools 300",
        "allot_pools_capacity{resource=\"cpu\"} 600.0",
        "allot_quotas_granted_units{namespace=\"team-007:ns-00700\"} 4",
        "allot_quotas_quota_units{namespace=\"team-008:ns-00809\"} 10",
        "allot_pools_capacity{pool=\"pool-019\",resource=\"cpu\"} 2.0",
    ] {
        assert!(text.contains(metric), "{metric} missing from\n{text}");
    }
    let series = |prefix: &str| text.lines().filter(|line| line.starts_with(prefix)).count();
    assert_eq!(series("allot_quotas_quota_units{"), 11, "series for the selected namespaces only");
    assert_eq!(series("allot_pools_allocs{"), 10, "series for the selected pools only");
}

#[tokio::test]
async fn the_document_states_the_limits_the_server_enforces() {
    let h = Harness::new();
    let (_, doc) = h.call(Method::GET, "/openapi.json", "").await;
    let parameters = |path: &str, method: &str| doc["paths"][path][method]["parameters"].as_array().unwrap().clone();
    // Optional flags are query parameters, not required path parameters.
    let release = parameters("/v1/namespaces/{namespace}/grants/{token}", "delete");
    let fencing = release.iter().find(|p| p["name"] == "fencing").unwrap();
    assert_eq!((fencing["in"].as_str(), fencing["required"].as_bool()), (Some("query"), Some(false)), "{fencing}");
    for path in ["/v1/namespaces/{namespace}", "/v1/pools/{pool}"] {
        let force = parameters(path, "delete").into_iter().find(|p| p["name"] == "force").unwrap();
        assert_eq!((force["in"].as_str(), force["required"].as_bool()), (Some("query"), Some(false)), "{force}");
    }
    // Names, ids and ranges come from the checks' own constants.
    let allocate = parameters("/v1/namespaces/{namespace}/grants/{token}", "put");
    assert_eq!(allocate[0]["schema"]["pattern"], allot_core::NAMESPACE_PATTERN);
    assert_eq!(allocate[1]["schema"]["pattern"], allot_core::NAME_PATTERN);
    assert_eq!(allocate[1]["schema"]["maxLength"], 255);
    let session = &parameters("/v1/sessions/{id}", "get")[0]["schema"];
    assert_eq!(session["pattern"], "^[0-9a-fA-F]{32}$");
    let schemas = &doc["components"]["schemas"];
    assert_eq!(schemas["PutNamespace"]["properties"]["quota"]["maximum"], allot_core::MAX_UNITS);
    assert_eq!(schemas["PutNamespace"]["properties"]["quota"]["minimum"], 0);
    assert_eq!(schemas["Allocate"]["properties"]["units"]["minimum"], 1);
    assert_eq!(schemas["Allocate"]["properties"]["wait_ms"]["maximum"], 300_000);
    assert!(schemas["PutPool"]["properties"]["capacity"]["pattern"].is_string());
    // The allocate and keepalive bodies are optional (an empty body is `{}`).
    let put = &doc["paths"]["/v1/namespaces/{namespace}/grants/{token}"]["put"];
    assert_ne!(put["requestBody"]["required"], true, "{}", put["requestBody"]);
    let keepalive = &doc["paths"]["/v1/namespaces/{namespace}/grants/{token}/keepalive"]["post"];
    assert_ne!(keepalive["requestBody"]["required"], true, "{}", keepalive["requestBody"]);
}
