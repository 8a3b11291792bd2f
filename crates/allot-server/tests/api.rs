//! The API in-process (`app()` with `oneshot`) over a real embedded store in a temporary directory:
//! every answer shape, and bad input that must get a 4xx with a code and change nothing.

use std::sync::Arc;

use allot_server::{app, AppState};
use allot_store::{EmbeddedConfig, EmbeddedStore, Store};
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

struct Harness {
    router: Router,
    store: Arc<dyn Store>,
    _dir: tempfile::TempDir,
}

impl Harness {
    fn new() -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(EmbeddedStore::open(&EmbeddedConfig { data_dir: dir.path().to_owned() }).unwrap());
        Harness { router: app(AppState::new(store.clone())), store, _dir: dir }
    }

    async fn call(&self, method: Method, uri: &str, body: &str) -> (StatusCode, Value) {
        let request = Request::builder().method(method).uri(uri).body(Body::from(body.to_owned())).unwrap();
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            assert_eq!(response.headers()["retry-after"], "1", "a 503 must say when to retry");
        }
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
        };
        (status, value)
    }

    /// Everything the store holds, to check that a refused request changed nothing.
    async fn everything(&self) -> String {
        let mut text = format!("{:?}", self.store.namespaces().await.unwrap());
        for view in self.store.namespaces().await.unwrap() {
            text += &format!("{:?}", self.store.grants(view.name).await.unwrap());
        }
        text + &format!("{:?}", self.store.sessions().await.unwrap().len())
    }
}

#[tokio::test]
async fn quotas_grants_and_sessions_over_the_api() {
    let h = Harness::new();
    let (status, body) = h.call(Method::PUT, "/v1/namespaces/hive:cluster-a", r#"{"quota": 2}"#).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["namespace"]["quota"], 2);
    let (status, body) = h.call(Method::PUT, "/v1/namespaces/hive:cluster-a", r#"{"quota": 3}"#).await;
    assert_eq!((status, body["created"].clone()), (StatusCode::OK, json!(false)));

    let alloc = r#"{"units": 2, "scope": {"project": "p", "namespace": "dev"}, "caps": {"project": 2}}"#;
    let (status, body) = h.call(Method::PUT, "/v1/namespaces/hive:cluster-a/grants/t1", alloc).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "Granted", "{body}");
    assert_eq!(body["grant"]["fencing"], 1);
    let (_, again) = h.call(Method::PUT, "/v1/namespaces/hive:cluster-a/grants/t1", alloc).await;
    assert_eq!((again["status"].clone(), again["existing"].clone()), (json!("Granted"), json!(true)));
    let capped = r#"{"scope": {"project": "p", "namespace": "prod"}, "caps": {"project": 2}}"#;
    let (_, body) = h.call(Method::PUT, "/v1/namespaces/hive:cluster-a/grants/t2", capped).await;
    assert_eq!(body["status"], "NamespaceQuotaExceeded", "{body}");
    assert_eq!(body["cap"], json!({"level": "project", "cap": 2, "held": 2}));
    let (_, body) = h.call(Method::PUT, "/v1/namespaces/hive:cluster-a/grants/t3", r#"{"units": 2}"#).await;
    assert_eq!(body["status"], "Exhausted");
    // An empty body allocates one unit.
    let (_, body) = h.call(Method::PUT, "/v1/namespaces/hive:cluster-a/grants/t4", "").await;
    assert_eq!(body["status"], "Granted", "{body}");

    let (_, body) = h.call(Method::GET, "/v1/namespaces/hive:cluster-a/grants", "").await;
    assert_eq!(body["grants"].as_array().unwrap().len(), 2);
    let (status, body) = h.call(Method::DELETE, "/v1/namespaces/hive:cluster-a/grants/t1?fencing=1", "").await;
    assert_eq!((status, body["released"].clone()), (StatusCode::OK, json!(true)));
    let (_, body) = h.call(Method::DELETE, "/v1/namespaces/hive:cluster-a/grants/t1", "").await;
    assert_eq!(body["released"], false);

    let (status, session) = h.call(Method::POST, "/v1/sessions", r#"{"ttl_ms": 60000}"#).await;
    assert_eq!(status, StatusCode::CREATED);
    let id = session["id"].as_str().unwrap().to_owned();
    let body = format!(r#"{{"session": "{id}"}}"#);
    let (_, granted) = h.call(Method::PUT, "/v1/namespaces/hive:cluster-a/grants/in-session", &body).await;
    assert_eq!(granted["grant"]["session"], json!(id));
    let (_, kept) = h.call(Method::POST, &format!("/v1/sessions/{id}/keepalive"), "").await;
    assert_eq!(kept["grants"], json!([{"namespace": "hive:cluster-a", "token": "in-session"}]));
    let (status, _) = h.call(Method::DELETE, &format!("/v1/sessions/{id}"), "").await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = h.call(Method::GET, "/v1/namespaces/hive:cluster-a/grants/in-session", "").await;
    assert_eq!((status, body["error"]["code"].clone()), (StatusCode::NOT_FOUND, json!("grant_not_found")));

    let (status, body) = h.call(Method::GET, "/healthz", "").await;
    assert_eq!((status, body["backend"].clone()), (StatusCode::OK, json!("embedded")));
    let (status, body) = h.call(Method::GET, "/openapi.json", "").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body["paths"]["/v1/namespaces/{namespace}/grants/{token}"]["put"].is_object());
    let (status, body) = h.call(Method::GET, "/metrics", "").await;
    assert_eq!(status, StatusCode::OK);
    let text = body.as_str().unwrap();
    for metric in [
        "allot_quota_units{namespace=\"hive:cluster-a\"} 3",
        "allot_granted_units{namespace=\"hive:cluster-a\"} 1",
        "allot_allocations_total{namespace=\"hive:cluster-a\",result=\"namespace_quota_exceeded\"} 1",
        "allot_expirations_total",
        "allot_waiters",
        "allot_longest_wait_seconds",
        "allot_http_request_duration_seconds_bucket",
        "allot_store_commits_total",
    ] {
        assert!(text.contains(metric), "{metric} missing from\n{text}");
    }
}

#[tokio::test]
async fn a_wait_that_times_out_reports_its_place() {
    let h = Harness::new();
    h.call(Method::PUT, "/v1/namespaces/gpu", r#"{"quota": 1}"#).await;
    h.call(Method::PUT, "/v1/namespaces/gpu/grants/holder", "").await;
    let (status, body) = h.call(Method::PUT, "/v1/namespaces/gpu/grants/w", r#"{"wait_ms": 100}"#).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "Exhausted");
    assert_eq!(body["queue"], json!({"position": 1, "units_ahead": 0}));
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
    let h = Harness { router: app(AppState::new(store.clone())), store, _dir: dir };
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
    for _ in 0..100 {
        after = h.call(Method::GET, "/v1/namespaces/hive/grants", "").await;
        if after.0 == StatusCode::OK {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(after, before);
    let (_, namespace) = h.call(Method::GET, "/v1/namespaces/hive", "").await;
    assert_eq!((namespace["quota"].clone(), namespace["granted_units"].clone()), (json!(2), json!(1)));
    let (status, got) = h.call(Method::PUT, "/v1/namespaces/hive/grants/after", "").await;
    assert_eq!((status, got["status"].clone()), (StatusCode::OK, json!("Granted")));
}

#[tokio::test]
async fn pools_offers_and_allocs_over_the_api() {
    let h = Harness::new();
    let (status, body) = h.call(Method::PUT, "/v1/pools/worker-1", r#"{"capacity": "cpu=4,mem=16GiB,gpu=1"}"#).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["pool"]["capacity"], "cpu=4,gpu=1,mem=16GiB");
    let (_, body) = h.call(Method::GET, "/v1/pools/worker-1/offers", "").await;
    assert_eq!(body["offers"], json!([{"id": "1", "pool": "worker-1", "available": "cpu=4,gpu=1,mem=16GiB"}]));

    let accept = r#"{"min": "cpu=1,mem=2GiB", "max": "cpu=2,mem=4GiB", "owner": "me", "labels": {"run": "r1"}}"#;
    let (status, alloc) = h.call(Method::POST, "/v1/pools/worker-1/offers/1", accept).await;
    assert_eq!(status, StatusCode::CREATED, "{alloc}");
    assert_eq!(alloc["resources"], "cpu=2,mem=4GiB");
    let expires_in = alloc["expires_in_ms"].as_i64().unwrap();
    assert!((119_000..=120_000).contains(&expires_in), "Reflow's 2-minute lease: {expires_in}");
    let uri = alloc["uri"].as_str().unwrap().to_owned();
    let id = alloc["id"].as_str().unwrap().to_owned();
    assert_eq!(uri, format!("worker-1/{id}"));
    let (_, body) = h.call(Method::GET, "/v1/pools/worker-1/offers", "").await;
    assert_eq!(body["offers"][0]["available"], "cpu=2,gpu=1,mem=12GiB");

    let path = format!("/v1/pools/worker-1/allocs/{id}");
    let (status, body) = h.call(Method::POST, &format!("{path}/keepalive"), r#"{"interval_ms": 3600000}"#).await;
    assert_eq!((status, body["interval_ms"].clone()), (StatusCode::OK, json!(300_000)), "{body}");
    let (_, body) = h.call(Method::GET, &path, "").await;
    assert_eq!((body["owner"].clone(), body["labels"]["run"].clone()), (json!("me"), json!("r1")));
    assert!(body["last_keepalive_ms_ago"].as_u64().unwrap() < 1000, "{body}");

    // The room is gone: a distinct error, so the client tries another offer.
    let (status, body) = h.call(Method::POST, "/v1/pools/worker-1/offers/1", r#"{"min": "cpu=3"}"#).await;
    assert_eq!((status, body["error"]["code"].clone()), (StatusCode::CONFLICT, json!("offer_expired")), "{body}");

    let (_, body) = h.call(Method::GET, "/metrics", "").await;
    let text = body.as_str().unwrap();
    for metric in [
        "allot_pool_capacity{pool=\"worker-1\",resource=\"gpu\"} 1.0",
        "allot_pool_allocated{pool=\"worker-1\",resource=\"mem\"} 4294967296.0",
        "allot_pool_accepts_total{pool=\"worker-1\"} 1",
        "allot_pool_offer_expired_total{pool=\"worker-1\"} 1",
        "allot_pool_reclaims_total{pool=\"worker-1\"} 0",
        "allot_pool_allocs{pool=\"worker-1\"} 1",
    ] {
        assert!(text.contains(metric), "{metric} missing from\n{text}");
    }

    let (status, body) = h.call(Method::DELETE, &path, "").await;
    assert_eq!((status, body["ended"].clone()), (StatusCode::OK, json!("freed")), "{body}");
    let (status, body) = h.call(Method::POST, &format!("{path}/keepalive"), r#"{"interval_ms": 1000}"#).await;
    assert_eq!((status, body["error"]["code"].clone()), (StatusCode::CONFLICT, json!("alloc_ended")), "{body}");
    let (status, body) = h.call(Method::GET, &path, "").await;
    assert_eq!(status, StatusCode::GONE, "an ended alloc is gone");
    assert_eq!(body["ended"], "freed", "an ended alloc can still be inspected");

    let (_, body) = h.call(Method::POST, "/v1/pools/worker-1/stop-if-idle", r#"{"idle_ms": 0}"#).await;
    assert_eq!(body, json!({"stopped": true, "until_idle_ms": 0}));
    let (_, body) = h.call(Method::GET, "/v1/pools/worker-1/offers", "").await;
    assert_eq!(body["offers"], json!([]));
    let (status, body) = h.call(Method::POST, "/v1/pools/worker-1/offers/1", r#"{"min": "cpu=1"}"#).await;
    assert_eq!((status, body["error"]["code"].clone()), (StatusCode::CONFLICT, json!("pool_stopped")));

    let (_, document) = h.call(Method::GET, "/openapi.json", "").await;
    for path in [
        "/v1/pools/{pool}/offers/{offer}",
        "/v1/pools/{pool}/allocs/{alloc}/keepalive",
        "/v1/pools/{pool}/stop-if-idle",
    ] {
        assert!(document["paths"][path].is_object(), "{path} missing from the OpenAPI document");
    }

    // Bad input: a clear 4xx with a code.
    for (method, uri, body, status, code) in [
        (Method::PUT, "/v1/pools/p", r#"{"capacity": "cpu=four"}"#, StatusCode::BAD_REQUEST, "invalid_resources"),
        (Method::PUT, "/v1/pools/p", r#"{"capacity": "CPU=4"}"#, StatusCode::BAD_REQUEST, "invalid_resources"),
        (Method::PUT, "/v1/pools/p", r#"{"capacity": 4}"#, StatusCode::BAD_REQUEST, "invalid_json"),
        (Method::PUT, "/v1/pools/a%2Fb", r#"{"capacity": "cpu=1"}"#, StatusCode::BAD_REQUEST, "invalid_name"),
        (Method::PUT, "/v1/pools/p", r#"{"capacity": ""}"#, StatusCode::BAD_REQUEST, "invalid_argument"),
        (Method::PUT, "/v1/pools/p", r#"{"capacity": "cpu=0"}"#, StatusCode::BAD_REQUEST, "invalid_argument"),
        (Method::PUT, "/v1/pools/p", r#"["cpu=1"]"#, StatusCode::BAD_REQUEST, "invalid_json"),
        (Method::POST, "/v1/pools/worker-1/offers/2", r#"{"min": "cpu=1"}"#, StatusCode::NOT_FOUND, "offer_not_found"),
        (Method::POST, "/v1/pools/nope/offers/2", r#"{"min": "cpu=1"}"#, StatusCode::NOT_FOUND, "pool_not_found"),
        (Method::GET, "/v1/pools/nope/offers", "", StatusCode::NOT_FOUND, "pool_not_found"),
        (Method::POST, "/v1/pools/worker-1/offers/1", r#"{"min": ""}"#, StatusCode::BAD_REQUEST, "invalid_argument"),
        (
            Method::POST,
            "/v1/pools/worker-1/offers/1",
            r#"{"min": "cpu=2", "max": "cpu=1"}"#,
            StatusCode::CONFLICT,
            "pool_stopped",
        ),
        (Method::GET, "/v1/pools/worker-1/allocs/xyz", "", StatusCode::BAD_REQUEST, "invalid_name"),
        (Method::GET, "/v1/pools/worker-1/allocs/00000000000000ff", "", StatusCode::NOT_FOUND, "alloc_not_found"),
        (Method::POST, &format!("{path}/keepalive"), r#"{"interval_ms": -1}"#, StatusCode::BAD_REQUEST, "invalid_json"),
    ] {
        let (got, answer) = h.call(method.clone(), uri, body).await;
        assert_eq!((got, answer["error"]["code"].as_str()), (status, Some(code)), "{method} {uri} {body}: {answer}");
    }
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

#[tokio::test]
async fn offers_say_what_happened() {
    let h = Harness::new();
    h.call(Method::PUT, "/v1/pools/small", r#"{"capacity": "cpu=2"}"#).await;
    let (status, body) = h.call(Method::POST, "/v1/pools/small/offers/1", r#"{"min": "cpu=3"}"#).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("exceeds_capacity")), "{body}");
    let (status, _) = h.call(Method::POST, "/v1/pools/small/offers/1", r#"{"min": "cpu=2"}"#).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, body) = h.call(Method::POST, "/v1/pools/small/offers/1", r#"{"min": "cpu=1"}"#).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("offer_expired")), "{body}");
    let (status, body) = h.call(Method::POST, "/v1/pools/small/offers/7", r#"{"min": "cpu=1"}"#).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("offer_not_found")), "{body}");
}

#[tokio::test]
async fn a_paused_namespace_answers_exhausted() {
    let h = Harness::new();
    let (status, _) = h.call(Method::PUT, "/v1/namespaces/paused", r#"{"quota": 0}"#).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, body) = h.call(Method::PUT, "/v1/namespaces/paused/grants/t", r#"{"units": 3}"#).await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("Exhausted")), "{body}");
}
