//! The token quotas over the API: namespaces, grants, waiters and sessions.

use allot_server::MetricsConfig;
use axum::http::{Method, StatusCode};
use serde_json::json;

use crate::support::*;

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
    // And one of whitespace only, which is no JSON document (schemathesis found "\n" taken as an
    // empty body); an empty body allocates one unit.
    let (status, body) = h.call(Method::PUT, "/v1/namespaces/hive:cluster-a/grants/t4", " \r\n\t").await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_json")), "{body}");
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
        "allot_quotas_quota_units{namespace=\"hive:cluster-a\"} 3",
        "allot_quotas_namespaces 2",
        "allot_quotas_quota_units 10",
        "allot_quotas_granted_units 1",
        "allot_quotas_allocations_total{result=\"namespace_quota_exceeded\"} 1",
        "allot_quotas_granted_units{namespace=\"hive:cluster-a\"} 1",
        "allot_quotas_allocations_total{namespace=\"hive:cluster-a\",result=\"namespace_quota_exceeded\"} 1",
        "allot_quotas_expirations_total",
        "allot_quotas_waiters",
        "allot_quotas_longest_wait_seconds",
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

#[tokio::test]
async fn a_paused_namespace_answers_exhausted() {
    let h = Harness::new();
    let (status, _) = h.call(Method::PUT, "/v1/namespaces/paused", r#"{"quota": 0}"#).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, body) = h.call(Method::PUT, "/v1/namespaces/paused/grants/t", r#"{"units": 3}"#).await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("Exhausted")), "{body}");
}
