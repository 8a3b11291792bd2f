//! The pools over the API: pools, offers and allocs.

use allot_server::MetricsConfig;
use axum::http::{Method, StatusCode};
use serde_json::json;

use crate::support::*;

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
        "allot_pools_capacity{pool=\"worker-1\",resource=\"gpu\"} 1.0",
        "allot_pools_allocated{pool=\"worker-1\",resource=\"mem\"} 4294967296.0",
        "allot_pools_accepts_total{pool=\"worker-1\"} 1",
        "allot_pools_offer_expired_total{pool=\"worker-1\"} 1",
        "allot_pools_reclaims_total{pool=\"worker-1\"} 0",
        "allot_pools_allocs{pool=\"worker-1\"} 1",
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
