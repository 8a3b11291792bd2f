//! What the API tests share: the API in-process over a real embedded store in a temporary
//! directory, and helpers to call it.

use std::sync::Arc;

use allot_server::{api, Api, MetricsConfig, ServerState};
use allot_store::{read_all, EmbeddedConfig, EmbeddedStore, Store};
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

pub(crate) struct Harness {
    pub(crate) router: Api,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) _dir: tempfile::TempDir,
}

impl Harness {
    pub(crate) fn new() -> Harness {
        Harness::with_metrics(MetricsConfig::default())
    }

    /// With series of their own at `/metrics` for what `config` selects.
    pub(crate) fn with_metrics(config: MetricsConfig) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::open(&EmbeddedConfig::new(dir.path().to_owned())).unwrap());
        Harness { router: api(ServerState::new(store.clone()).with_metrics(config)), store, _dir: dir }
    }

    /// With the server's state made by `state` from the default one.
    pub(crate) fn with_state(state: impl FnOnce(ServerState) -> ServerState) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::open(&EmbeddedConfig::new(dir.path().to_owned())).unwrap());
        Harness { router: api(state(ServerState::new(store.clone()))), store, _dir: dir }
    }

    /// Over a store that keeps its change feed as `watch` says, with watch streams that send a
    /// heartbeat after `heartbeat` of silence.
    pub(crate) fn with_watch(watch: allot_store::WatchConfig, heartbeat: std::time::Duration) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let config = EmbeddedConfig::new(dir.path().to_owned()).with_watch(watch);
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::open(&config).unwrap());
        Harness { router: api(ServerState::new(store.clone()).with_heartbeat(heartbeat)), store, _dir: dir }
    }

    pub(crate) async fn call(&self, method: Method, uri: &str, body: &str) -> (StatusCode, Value) {
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
    pub(crate) async fn everything(&self) -> String {
        let store = &*self.store;
        let namespaces = read_all(|page| store.namespaces(page)).await.unwrap();
        let mut text = format!("{namespaces:?}");
        for view in namespaces {
            text += &format!("{:?}", read_all(|page| store.grants(view.name.clone(), page)).await.unwrap());
        }
        text + &format!("{:?}", read_all(|page| store.sessions(page)).await.unwrap().len())
    }
}

impl Harness {
    /// Follows a list route page by page with `limit`; every page and the items of all of them.
    pub(crate) async fn pages(&self, uri: &str, field: &str, limit: usize) -> (Vec<Value>, Vec<Value>) {
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

pub(crate) fn strings(items: &[Value], field: &str) -> Vec<String> {
    items.iter().map(|item| item[field].as_str().unwrap().to_owned()).collect()
}

/// Polls `GET uri` until `done` holds on its body (the scheduler runs by itself).
pub(crate) async fn until(h: &Harness, uri: &str, done: impl Fn(&Value) -> bool) -> Value {
    let mut body = Value::Null;
    eventually(&format!("{uri} is as awaited"), async || {
        body = h.call(Method::GET, uri, "").await.1;
        done(&body)
    })
    .await;
    body
}

/// Waits until a condition holds; fails, naming what was awaited, after a minute.
pub(crate) use allot_host::wait::until as eventually;
