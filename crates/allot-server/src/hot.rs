//! The hot path: allocate and release (`PUT` and `DELETE /v1/namespaces/{namespace}/grants/{token}`),
//! the two calls every worker makes for every task, answered before the router.
//!
//! Why: through the router a call pays its route lookup, its path parameters copied into the
//! request, a clone of the route's boxed service and two boxed middleware futures, about as much
//! CPU as the ledger and the log together (docs/benchmarks.md, "Measurements behind the defaults"). Here a call is
//! recognised from its path and answered by the same functions the routes call.
//!
//! Invariants: a call is answered here only when the router would answer it the same way, with
//! the same metrics; anything else (a percent-encoded segment, a query other than `fencing`, a
//! body without a length or over the limit, every other route) goes to the router unchanged.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use allot_core::access::{Kind, Permission};
use axum::body::HttpBody as _;
use axum::extract::{ConnectInfo, Query, Request};
use axum::http::{header, HeaderName, HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use axum::routing::future::RouteFuture;
use axum::{Json, Router};
use futures_util::future::Either;
use tower::Service;

use crate::access::{resource_of, Caller, HeldToken, Need, Needs, Target};
use crate::audit;
use crate::error::ApiError;
use crate::extract::json_object;
use crate::routes::quotas::{allocate_grant, release_grant, FencingQuery};
use crate::{ServerState, MAX_BODY_BYTES};

/// A call's request id: the caller's, or one the daemon gives it (with the audit trail on).
const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// The daemon's own id of an audited call, named in its audit line.
const ALLOT_REQUEST_ID: HeaderName = HeaderName::from_static("allot-request-id");

/// The route allocate and release are counted under in the metrics, as the router names it.
const GRANT_ROUTE: &str = "/v1/namespaces/{namespace}/grants/{token}";

/// The whole API as one service: the hot path, then the router.
#[derive(Clone)]
pub struct Api {
    router: Router,
    /// What the router's table says allocate and release need, read once: the hot path answers
    /// a call with the permission the router would check, or leaves it to the router.
    grant_needs: GrantNeeds,
    state: ServerState,
}

/// The permission on the path's namespace that allocate and release need, as declared with
/// their route; `None` leaves the call to the router.
#[derive(Clone, Copy, Default)]
struct GrantNeeds {
    allocate: Option<Permission>,
    release: Option<Permission>,
}

impl GrantNeeds {
    fn of(needs: &Needs) -> GrantNeeds {
        let on_namespace = |method: Method| match needs.get(&method, GRANT_ROUTE)? {
            Need::Needs(permission, Target::Path(Kind::Namespace)) => Some(permission),
            _ => None,
        };
        GrantNeeds { allocate: on_namespace(Method::PUT), release: on_namespace(Method::DELETE) }
    }
}

impl Api {
    pub(crate) fn new(router: Router, needs: &Needs, state: ServerState) -> Api {
        Api { router, grant_needs: GrantNeeds::of(needs), state }
    }

    /// Every call through the router, to compare the two paths.
    #[cfg(test)]
    fn router_only(mut self) -> Api {
        self.grant_needs = GrantNeeds::default();
        self
    }
}

/// A call the hot path answers, and the permission its route needs on its namespace.
struct Hot {
    call: HotCall,
    permission: Permission,
}

enum HotCall {
    Allocate,
    Release { fencing: Option<u64> },
}

type HotFuture = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

impl Service<Request> for Api {
    type Response = Response;
    type Error = Infallible;
    type Future = Either<HotFuture, RouteFuture<Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Service::<Request>::poll_ready(&mut self.router, cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let Some(audit) = self.state.audit.clone() else { return self.dispatch(request) };
        // Audited: the call is recorded once answered, with its request id on the answer.
        let mut call = audit::Call {
            method: request.method().clone(),
            path: request.uri().path().to_owned(),
            route: None,
            caller: None,
            source: request.extensions().get::<ConnectInfo<crate::Peer>>().map(|info| info.0.addr),
            request_id: audit.request_id(),
            caller_request_id: audit::Audit::caller_request_id(request.headers().get(REQUEST_ID)),
        };
        let (caller, answered) = self.authenticated(request, true);
        call.caller = caller;
        let state = self.state.clone();
        Either::Left(Box::pin(async move {
            let mut response = answered.await?;
            let status = response.status().as_u16();
            if audit::audited(&call.method, status) {
                call.route = response.extensions_mut().remove::<audit::Route>().map(|route| route.0);
                state.metrics.audited(audit::outcome(status));
                // The caller's id back when it gave one, the daemon's own always.
                let own = call.request_id.header();
                let id = call.caller_request_id.clone().unwrap_or_else(|| own.clone());
                let noted = response.extensions_mut().remove::<audit::Noted>().unwrap_or_default();
                audit.record(call, status, noted);
                response.headers_mut().insert(REQUEST_ID, id);
                response.headers_mut().insert(ALLOT_REQUEST_ID, own);
            }
            Ok(response)
        }))
    }
}

impl Api {
    /// Authenticates the call, then answers it by the hot path or the router.
    fn dispatch(&mut self, request: Request) -> <Api as Service<Request>>::Future {
        self.authenticated(request, false).1
    }

    /// [`Api::dispatch`], and, if `keep_caller`, who the call turned out to be from (none if it
    /// was refused).
    fn authenticated(
        &mut self,
        mut request: Request,
        keep_caller: bool,
    ) -> (Option<Caller>, <Api as Service<Request>>::Future) {
        let refused = |refused: crate::access::Unauthenticated| -> (Option<Caller>, <Api as Service<Request>>::Future) {
            (None, Either::Left(Box::pin(std::future::ready(Ok(refused.into_response())))))
        };
        match recognise(&request, self.grant_needs) {
            // The caller goes to the answer itself, not through the request's extensions.
            Some(hot) => {
                let (caller, held) = match crate::access::caller_of(&self.state, &request) {
                    Ok(found) => found,
                    Err(err) => return refused(err),
                };
                let kept = keep_caller.then(|| caller.clone());
                (kept, Either::Left(answer(self.state.clone(), hot, request, caller, held)))
            }
            None => {
                if let Err(err) = crate::access::authenticate(&self.state, &mut request) {
                    return refused(err);
                }
                let caller = if keep_caller { request.extensions().get::<Caller>().cloned() } else { None };
                (caller, Either::Right(self.router.call(request)))
            }
        }
    }
}

/// The namespace and token of a grant's path, if they need no decoding.
fn grant_path(path: &str) -> Option<(&str, &str)> {
    // One pass over the bytes: a searcher of characters costs more to set up than this whole path.
    let rest = path.strip_prefix("/v1/namespaces/")?;
    let bytes = rest.as_bytes();
    let slash = bytes.iter().position(|&b| b == b'/' || b == b'%').filter(|&at| bytes[at] == b'/')?;
    let (namespace, token) = (&rest[..slash], rest[slash + 1..].strip_prefix("grants/")?);
    let plain = |segment: &str| !segment.is_empty() && !segment.bytes().any(|b| b == b'/' || b == b'%');
    (!namespace.is_empty() && plain(token)).then_some((namespace, token))
}

/// The call, if the hot path answers it as the router would.
fn recognise(request: &Request, needs: GrantNeeds) -> Option<Hot> {
    grant_path(request.uri().path())?;
    match *request.method() {
        // The router reads a body of any length up to the limit; here only one whose length is
        // known (from its `Content-Length`) and within it, so reading it cannot fail on its size.
        Method::PUT => {
            let length = request.body().size_hint().upper()?;
            let permission = needs.allocate.filter(|_| length <= MAX_BODY_BYTES as u64)?;
            Some(Hot { call: HotCall::Allocate, permission })
        }
        Method::DELETE => {
            let permission = needs.release?;
            let fencing = match request.uri().query() {
                None => None,
                Some(_) => Query::<FencingQuery>::try_from_uri(request.uri()).ok()?.0.fencing,
            };
            Some(Hot { call: HotCall::Release { fencing }, permission })
        }
        _ => None,
    }
}

/// Answers `hot`, and counts it as the router's metrics layer would.
///
/// Not an `async fn`: what can be done at once (the path read, the access check) is done here,
/// and the future returned holds only what the call needs while it waits. (An `async fn` keeps
/// its arguments, the whole request among them, for as long as it lives, beside its locals; a
/// daemon may hold 100,000 waiting calls.)
fn answer(state: ServerState, hot: Hot, request: Request, caller: Caller, held: Option<HeldToken>) -> HotFuture {
    let started = Instant::now();
    let (axum::http::request::Parts { method, uri, .. }, body) = request.into_parts();
    let (namespace, _) = grant_path(uri.path()).unwrap_or_default();
    if let Err(refused) =
        caller.check(state.access.as_deref(), hot.permission, resource_of(Kind::Namespace, namespace.to_owned()))
    {
        let response = answered(&state, &method, started, refused.into_response());
        return Box::pin(std::future::ready(Ok(response)));
    }
    Box::pin(async move {
        // The path is read again from the `Uri` kept: no copy of its parts is made.
        let (namespace, token) = grant_path(uri.path()).unwrap_or_default();
        let response = match hot.call {
            HotCall::Allocate => {
                // A statement of its own, not a `match` on the read: the read's future would then
                // stay in this one's state while the call waits.
                let body = read_allocate(body).await;
                match body {
                    Ok(body) => json_answer(allocate_grant(&state, namespace, token, body, &caller, held).await),
                    Err(err) => err.into_response(),
                }
            }
            HotCall::Release { fencing } => json_answer(release_grant(&state, namespace, token, fencing).await),
        };
        Ok(answered(&state, &method, started, response))
    })
}

/// The answer to a call of the hot path, counted in the metrics (and marked for the audit trail).
fn answered(state: &ServerState, method: &Method, started: Instant, mut response: Response) -> Response {
    state.metrics.observe_request(method, GRANT_ROUTE, response.status().as_u16(), started.elapsed());
    if state.audit.is_some() {
        response.extensions_mut().insert(audit::Route(GRANT_ROUTE.into()));
    }
    response
}

/// An answer as the router's `Json` would make it, its body written into a `Vec`: serde_json
/// writes a small answer in a few dozen pieces, each cheaper appended to a `Vec` than through
/// `BytesMut`'s writer, which axum's `Json` uses (about 0.2 µs of the 2.2 µs per pair the API
/// adds over the store in `allot bench compare`'s probe of allot's own work).
fn json_answer<T: serde::Serialize>(answer: Result<Json<T>, ApiError>) -> Response {
    match answer {
        Ok(Json(body)) => match serde_json::to_vec(&body) {
            Ok(bytes) => ([(header::CONTENT_TYPE, JSON)], bytes).into_response(),
            Err(_) => Json(body).into_response(),
        },
        Err(err) => err.into_response(),
    }
}

/// The content type of a JSON answer, as axum's `Json` sets it.
const JSON: HeaderValue = HeaderValue::from_static("application/json");

/// An allocate's body, read whole (its length is known: see [`recognise`]) and parsed.
async fn read_allocate(body: axum::body::Body) -> Result<allot_api::Allocate, ApiError> {
    let bytes = axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|err| ApiError::invalid_json(format!("cannot read the request body: {err}")))?;
    json_object(&bytes)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_grants_path_is_recognised_only_when_it_needs_no_decoding() {
        use super::grant_path;
        assert_eq!(grant_path("/v1/namespaces/web/grants/t-1"), Some(("web", "t-1")));
        assert_eq!(grant_path("/v1/namespaces/a:b/grants/x.y"), Some(("a:b", "x.y")));
        for path in [
            "/v1/namespaces/web/grants/",
            "/v1/namespaces//grants/t",
            "/v1/namespaces/web/grants/t/more",
            "/v1/namespaces/w%2Fb/grants/t",
            "/v1/namespaces/web/grants/t%20",
            "/v1/namespaces/web/waiters/t",
            "/v1/namespaces/web",
            "/v1/pools/web/grants/t",
        ] {
            assert_eq!(grant_path(path), None, "{path}");
        }
    }

    use std::sync::Arc;

    use allot_store::{EmbeddedConfig, EmbeddedStore};
    use axum::body::Body;
    use axum::http::header;
    use tower::ServiceExt as _;

    use super::*;

    fn request(method: Method, uri: &str, body: &str) -> Request {
        Request::builder().method(method).uri(uri).body(Body::from(body.to_owned())).unwrap()
    }

    #[tokio::test]
    async fn only_plain_grant_calls_are_recognised() {
        let dir = tempfile::tempdir().unwrap();
        let (_, needs) = crate::routes::routes(daemon(&dir));
        let needs = GrantNeeds::of(&needs);
        let grant = "/v1/namespaces/hive/grants/task-1";
        for (method, uri, hot) in [
            (Method::PUT, grant, true),
            (Method::DELETE, grant, true),
            (Method::DELETE, "/v1/namespaces/hive/grants/task-1?fencing=3", true),
            (Method::DELETE, "/v1/namespaces/hive/grants/task-1?fencing=x", false),
            (Method::DELETE, "/v1/namespaces/hive/grants/task-1?other=1", false),
            (Method::GET, grant, false),
            (Method::POST, grant, false),
            (Method::PUT, "/v1/namespaces/hive/grants/task%2D1", false),
            (Method::PUT, "/v1/namespaces/hive/grants/task-1/", false),
            (Method::POST, "/v1/namespaces/hive/grants/task-1/keepalive", false),
            (Method::PUT, "/v1/namespaces//grants/task-1", false),
            (Method::PUT, "/v1/namespaces/hive/grants/", false),
            (Method::PUT, "/v1/namespaces/hive", false),
            (Method::PUT, "/v1/namespaces/hive/x/grants/task-1", false),
            (Method::PUT, "/v1/namespaces/hive/grants/grants/task-1", false),
        ] {
            assert_eq!(recognise(&request(method.clone(), uri, ""), needs).is_some(), hot, "{method} {uri}");
        }
        let stream = futures_util::stream::empty::<Result<axum::body::Bytes, Infallible>>();
        let streamed = Request::builder().method(Method::PUT).uri(grant).body(Body::from_stream(stream)).unwrap();
        assert!(recognise(&streamed, needs).is_none(), "a body of unknown length goes to the router");
        let permission = recognise(&request(Method::PUT, grant, ""), needs).map(|hot| hot.permission);
        assert_eq!(permission, Some(Permission::Use), "the permission the router declares");
    }

    /// A daemon over a store of its own in `dir`, with access (`root` may do everything, `ada`
    /// may use namespace `hive` only) and the audit trail written to `dir/audit.log`.
    fn daemon(dir: &tempfile::TempDir) -> ServerState {
        use allot_core::access::{Binding, Pattern, Policy, Principal, Role};

        use crate::access::{Access, Credential, OpenRoutes};
        use crate::audit::{Audit, AuditSink};

        let store = Arc::new(EmbeddedStore::open(&EmbeddedConfig::new(dir.path().join("data"))).unwrap());
        let user = Role { grants: vec![(Permission::Use, Pattern::parse("namespace:hive").unwrap())] };
        let bindings = vec![
            Binding { role: "admin".into(), users: vec!["root".into()], groups: vec![] },
            Binding { role: "hive-user".into(), users: vec!["ada".into()], groups: vec![] },
        ];
        let policy = Policy::new([("hive-user".to_owned(), user)].into(), bindings).unwrap();
        let credentials = ["root", "ada"].map(|user| {
            let hash = allot_core::access::hash_token(&format!("allot_{user}"));
            Credential::new(user, &hash, Principal::new(user, [""; 0]), None).unwrap()
        });
        let access = Access::new(policy, credentials.into(), OpenRoutes::default()).unwrap();
        let audit = Audit::start(AuditSink::File(dir.path().join("audit.log"))).unwrap();
        ServerState::new(store).with_access(access).with_audit(audit)
    }

    /// The audit trail's lines so far, once there are `count`, without what differs between two
    /// daemons (the time and the daemon's own request ids).
    async fn audit_lines(dir: &tempfile::TempDir, count: usize) -> Vec<serde_json::Value> {
        let path = dir.path().join("audit.log");
        let read = || std::fs::read_to_string(&path).unwrap_or_default();
        // The audit writer gathers lines a moment before it writes them.
        let written = allot_host::wait::within(allot_host::wait::PATIENCE, async || read().lines().count() >= count);
        assert!(written.await, "{count} audit lines never came: {}", read());
        let mut lines: Vec<serde_json::Value> = read().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        for line in &mut lines {
            let object = line.as_object_mut().unwrap();
            object.retain(|key, _| !matches!(key.as_str(), "time" | "ts" | "at" | "request_id"));
        }
        lines
    }

    /// The same calls through the hot path and through the router alone, each by a daemon of its
    /// own with access and the audit trail on: the same answers, byte for byte and header for
    /// header (the revision header among them), the same refusals, and the same audit lines.
    #[tokio::test]
    async fn the_hot_path_answers_as_the_router_does() {
        let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
        let hot = crate::api(daemon(&dirs[0]));
        let routed = crate::api(daemon(&dirs[1])).router_only();
        let grant = "/v1/namespaces/hive/grants";
        let (root, ada, nobody) = (Some("allot_root"), Some("allot_ada"), None);
        let calls = [
            (root, Method::PUT, "/v1/namespaces/hive".to_owned(), r#"{"quota": 2}"#),
            (root, Method::PUT, "/v1/namespaces/other".to_owned(), r#"{"quota": 2}"#),
            (ada, Method::PUT, format!("{grant}/t1"), ""),
            (ada, Method::PUT, format!("{grant}/t1"), r#"{"units": 1}"#),
            (ada, Method::PUT, format!("{grant}/t1"), r#"{"units": 2}"#),
            (ada, Method::PUT, format!("{grant}/t2"), r#"{"units": 5}"#),
            (ada, Method::PUT, format!("{grant}/t2"), r#"{"units": 2}"#),
            (ada, Method::PUT, format!("{grant}/t3"), "[1]"),
            (ada, Method::PUT, format!("{grant}/t3"), r#"{"units": "one"}"#),
            (ada, Method::PUT, format!("{grant}/t3"), r#"{"wait_ms": 999999999}"#),
            (ada, Method::PUT, format!("{grant}/t3"), r#"{"ttl_ms": 0}"#),
            (ada, Method::PUT, format!("{grant}/T!"), ""),
            (ada, Method::PUT, "/v1/namespaces/other/grants/t1".to_owned(), ""),
            (ada, Method::DELETE, "/v1/namespaces/other/grants/t1".to_owned(), ""),
            (nobody, Method::PUT, format!("{grant}/t4"), ""),
            (Some("allot_wrong"), Method::DELETE, format!("{grant}/t1"), ""),
            (root, Method::PUT, "/v1/namespaces/missing/grants/t1".to_owned(), ""),
            (ada, Method::DELETE, format!("{grant}/t1?fencing=999"), ""),
            (ada, Method::DELETE, format!("{grant}/t1?fencing=one"), ""),
            (ada, Method::DELETE, format!("{grant}/t1?units=1"), ""),
            (ada, Method::DELETE, format!("{grant}/t1?fencing=1"), ""),
            (ada, Method::DELETE, format!("{grant}/t1"), ""),
            (root, Method::DELETE, "/v1/namespaces/missing/grants/t1".to_owned(), ""),
            (ada, Method::GET, "/v1/namespaces/hive".to_owned(), ""),
            (root, Method::GET, format!("{grant}/t2"), ""),
        ];
        let mut audited = 0;
        for (token, method, uri, body) in calls {
            let mut answers = Vec::new();
            for api in [&hot, &routed] {
                let mut call = request(method.clone(), &uri, body);
                if let Some(token) = token {
                    let bearer = format!("Bearer {token}");
                    call.headers_mut()
                        .insert(header::AUTHORIZATION, axum::http::HeaderValue::from_str(&bearer).unwrap());
                }
                let (mut parts, body) = api.clone().oneshot(call).await.unwrap().into_parts();
                parts.headers.remove(ALLOT_REQUEST_ID);
                parts.headers.remove(REQUEST_ID);
                // The router's routes set it from the body's exact size; on the wire hyper does
                // the same for the hot path's answers.
                parts.headers.remove(header::CONTENT_LENGTH);
                let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
                answers.push((parts.status, parts.headers, bytes));
            }
            assert_eq!(answers[0], answers[1], "{token:?} {method} {uri} {body}");
            audited += usize::from(audit::audited(&method, answers[0].0.as_u16()));
        }
        assert!(audited > 20, "{audited} calls audited");
        assert_eq!(audit_lines(&dirs[0], audited).await, audit_lines(&dirs[1], audited).await);
    }
}
