//! The API in-process (`api()` with `oneshot`) over a real embedded store in a temporary directory:
//! every answer shape, and bad input that must get a 4xx with a code and change nothing.

use std::sync::Arc;

use allot_server::{api, Api, MetricsConfig, ServerState};
use allot_store::{read_all, EmbeddedConfig, EmbeddedStore, Store};
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

struct Harness {
    router: Api,
    store: Arc<dyn Store>,
    _dir: tempfile::TempDir,
}

impl Harness {
    fn new() -> Harness {
        Harness::with_metrics(MetricsConfig::default())
    }

    /// With series of their own at `/metrics` for what `config` selects.
    fn with_metrics(config: MetricsConfig) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::open(&EmbeddedConfig::new(dir.path().to_owned())).unwrap());
        Harness { router: api(ServerState::new(store.clone()).with_metrics(config)), store, _dir: dir }
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
        let store = &*self.store;
        let namespaces = read_all(|page| store.namespaces(page)).await.unwrap();
        let mut text = format!("{namespaces:?}");
        for view in namespaces {
            text += &format!("{:?}", read_all(|page| store.grants(view.name.clone(), page)).await.unwrap());
        }
        text + &format!("{:?}", read_all(|page| store.sessions(page)).await.unwrap().len())
    }
}

#[tokio::test]
async fn quotas_grants_and_sessions_over_the_api() {
    let h = Harness::with_metrics(MetricsConfig { namespaces: vec!["hive".into()], pools: vec![] });
    h.call(Method::PUT, "/v1/namespaces/other", r#"{"quota": 7}"#).await;
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
    // A body that is not JSON is refused, even one of whitespace that JSON does not allow (a
    // form feed: schemathesis found it taken as an empty body).
    let (status, body) = h.call(Method::PUT, "/v1/namespaces/hive:cluster-a/grants/t4", "\x0c").await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_json")), "{body}");
    // An empty body, or one of JSON whitespace, allocates one unit.
    let (_, body) = h.call(Method::PUT, "/v1/namespaces/hive:cluster-a/grants/t4", " \r\n\t").await;
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
        "allot_namespaces 2",
        "allot_namespaces_quota_units 10",
        "allot_namespaces_granted_units 1",
        "allot_namespaces_allocations_total{result=\"namespace_quota_exceeded\"} 1",
        "allot_granted_units{namespace=\"hive:cluster-a\"} 1",
        "allot_allocations_total{namespace=\"hive:cluster-a\",result=\"namespace_quota_exceeded\"} 1",
        "allot_expirations_total",
        "allot_waiters",
        "allot_longest_wait_seconds",
        "allot_http_request_duration_seconds_bucket",
        // Each request in the series of its method, route and status.
        "allot_http_request_duration_seconds_count{method=\"DELETE\",route=\"/v1/namespaces/{namespace}/grants/{token}\",status=\"200\"} 2",
        "allot_http_request_duration_seconds_count{method=\"GET\",route=\"/v1/namespaces/{namespace}/grants/{token}\",status=\"404\"} 1",
        "allot_store_commits_total",
    ] {
        assert!(text.contains(metric), "{metric} missing from\n{text}");
    }
    assert!(!text.contains("namespace=\"other\""), "an unselected namespace has series of its own:\n{text}");
}

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
    let h = Harness::with_metrics(MetricsConfig { namespaces: vec![], pools: vec!["worker-*".into()] });
    h.call(Method::PUT, "/v1/pools/other", r#"{"capacity": "cpu=1"}"#).await;
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
        "allot_pools 2",
        "allot_pools_capacity{resource=\"cpu\"} 5.0",
        "allot_pools_allocated{resource=\"cpu\"} 2.0",
        "allot_pools_accepts_total 1",
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

impl Harness {
    /// Follows a list route page by page with `limit`; every page and the items of all of them.
    async fn pages(&self, uri: &str, field: &str, limit: usize) -> (Vec<Value>, Vec<Value>) {
        let (mut pages, mut items) = (Vec::new(), Vec::new());
        let mut cursor: Option<String> = None;
        loop {
            let separator = if uri.contains('?') { '&' } else { '?' };
            let mut page_uri = format!("{uri}{separator}limit={limit}");
            if let Some(cursor) = &cursor {
                page_uri += &format!("&cursor={cursor}");
            }
            let (status, body) = self.call(Method::GET, &page_uri, "").await;
            assert_eq!(status, StatusCode::OK, "{page_uri}: {body}");
            let page = body[field].as_array().unwrap_or_else(|| panic!("{page_uri}: {body}")).clone();
            assert!(page.len() <= limit, "{page_uri}: {} items", page.len());
            assert!(body.as_object().unwrap().contains_key("next_cursor"), "{body}");
            items.extend(page);
            cursor = body["next_cursor"].as_str().map(str::to_owned);
            pages.push(body);
            if cursor.is_none() {
                return (pages, items);
            }
        }
    }
}

fn strings(items: &[Value], field: &str) -> Vec<String> {
    items.iter().map(|item| item[field].as_str().unwrap().to_owned()).collect()
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
        for _ in 0..200 {
            let (_, body) = h.call(Method::GET, "/v1/namespaces/ns-001/waiters", "").await;
            if body["waiters"].as_array().unwrap().len() == i + 1 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
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
        "allot_namespaces 10000",
        "allot_namespaces_quota_units 100000",
        "allot_namespaces_granted_units 4",
        "allot_namespaces_allocations_total{result=\"granted\"} 1",
        "allot_pools 300",
        "allot_pools_capacity{resource=\"cpu\"} 600.0",
        "allot_granted_units{namespace=\"team-007:ns-00700\"} 4",
        "allot_quota_units{namespace=\"team-008:ns-00809\"} 10",
        "allot_pool_capacity{pool=\"pool-019\",resource=\"cpu\"} 2.0",
    ] {
        assert!(text.contains(metric), "{metric} missing from\n{text}");
    }
    let series = |prefix: &str| text.lines().filter(|line| line.starts_with(prefix)).count();
    assert_eq!(series("allot_quota_units{"), 11, "series for the selected namespaces only");
    assert_eq!(series("allot_pool_allocs{"), 10, "series for the selected pools only");
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

/// Polls `GET uri` until `done` holds on its body (the scheduler runs by itself).
async fn until(h: &Harness, uri: &str, done: impl Fn(&Value) -> bool) -> Value {
    let started = std::time::Instant::now();
    loop {
        let (_, body) = h.call(Method::GET, uri, "").await;
        if done(&body) {
            return body;
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "{uri}: never so; last {body}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

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
        "allot_queue_used{queue=\"root.ml\",resource=\"cpu\"} 4",
        "allot_queue_max{queue=\"root.ml\",resource=\"cpu\"} 6",
        "allot_queue_pending_tasks{queue=\"root.ml\"} 1",
        // The task, and its application, which says what holds its tasks back.
        "allot_queue_waiting{queue=\"root.ml\",reason=\"queue_limit\"} 2",
        "allot_sched_reservations_total 1",
        "allot_sched_takeovers_total 2",
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
    // 3,000 tasks: a body of about 300 KB, larger than other calls may send (64 KiB).
    let tasks: Vec<Value> = (0..3000)
        .map(|i| json!({"id": format!("task-{i:05}"), "resources": "cpu=1", "spec": {"type": "noop", "n": i}}))
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
