//! On a store that several daemons share (Redis), one daemon at a time schedules applications
//! and serves the applications part; the others forward those calls to it, as they came, and
//! answer what it answered. A call that finds no scheduler (one is taking over) is a 503 to retry.
//! Which routes are forwarded is declared with each route (`access::Home`, in `routes::routes`).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use allot_store::AppsHome;

use crate::access::{Home, Needs};
use crate::error::ApiError;
use crate::{ServerState, FORWARDED, MAX_BODY_BYTES, MAX_SUBMIT_BODY_BYTES};

/// How long a forwarded snapshot may take, start to end.
const SNAPSHOT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(6 * 3600);

fn unavailable(message: String) -> Response {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", message).into_response()
}

/// Serves a route of the daemon that schedules here, if it is this one, or forwards it there.
pub(crate) async fn to_scheduler(
    State((state, needs)): State<(ServerState, Arc<Needs>)>,
    request: Request,
    next: Next,
) -> Response {
    let home = match request.extensions().get::<MatchedPath>() {
        Some(route) => needs.home(request.method(), route.as_str()),
        None => Home::Any,
    };
    if home == Home::Any {
        return next.run(request).await;
    }
    match state.store.apps_home() {
        AppsHome::Here => next.run(request).await,
        AppsHome::Unknown => unavailable(
            "no daemon schedules applications right now (one is taking the scheduling over); retry".to_owned(),
        ),
        AppsHome::At(_) if request.headers().contains_key(&FORWARDED) => {
            unavailable("the scheduling of applications is moving between daemons; retry".to_owned())
        }
        AppsHome::At(base) => match forward(state.forwarder.client(), &base, request).await {
            Ok(response) => response,
            Err(Unforwarded::TooLarge(limit)) => ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                format!("the request body is too large: this route takes at most {limit} bytes"),
            )
            .into_response(),
            Err(Unforwarded::NoAnswer(message)) => {
                unavailable(format!("the daemon that schedules applications ({base}) did not answer: {message}; retry"))
            }
        },
    }
}

/// Why a call was not forwarded.
enum Unforwarded {
    /// Its body is larger than its route takes (the limit, in bytes): a 413, as the scheduler
    /// would answer, not a 503 to retry.
    TooLarge(usize),
    NoAnswer(String),
}

impl From<reqwest::Error> for Unforwarded {
    fn from(err: reqwest::Error) -> Unforwarded {
        Unforwarded::NoAnswer(err.to_string())
    }
}

/// The most a route's body may hold (`routes::routes` sets the same): a submission's, or any other.
fn body_limit(method: &axum::http::Method, path: &str) -> usize {
    match (method, path) {
        (&axum::http::Method::POST, "/v1/apps") => MAX_SUBMIT_BODY_BYTES,
        _ => MAX_BODY_BYTES,
    }
}

async fn forward(client: &reqwest::Client, base: &str, request: Request) -> Result<Response, Unforwarded> {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let limit = body_limit(&parts.method, parts.uri.path());
    let body = match axum::body::to_bytes(body, limit).await {
        Ok(body) => body,
        // The one error reading a body in memory gives besides the connection's.
        Err(err) if is_length_limit(&err) => return Err(Unforwarded::TooLarge(limit)),
        Err(err) => return Err(Unforwarded::NoAnswer(err.to_string())),
    };
    let mut outgoing = client.request(parts.method, format!("{base}{path}")).header(FORWARDED, "1").body(body);
    // The daemon that schedules authenticates and authorizes the call itself.
    for name in [header::CONTENT_TYPE, header::ACCEPT, header::AUTHORIZATION] {
        if let Some(value) = parts.headers.get(&name) {
            outgoing = outgoing.header(name, value);
        }
    }
    if path.starts_with("/v1/snapshot") {
        // An archive may take long and be large: it streams through, with time for it.
        outgoing = outgoing.timeout(SNAPSHOT_TIMEOUT);
    }
    let answer = outgoing.send().await?;
    let status = answer.status();
    let mut headers = Vec::new();
    for name in [
        header::CONTENT_TYPE,
        header::CONTENT_DISPOSITION,
        header::RETRY_AFTER,
        header::LOCATION,
        crate::routes::watch::REVISION,
    ] {
        if let Some(value) = answer.headers().get(&name) {
            headers.push((name, value.clone()));
        }
    }
    let streamed = answer.headers().get(header::CONTENT_TYPE).is_some_and(|t| t == "application/octet-stream");
    // An archive is passed on as it comes (a break shows as a truncated archive, which its
    // checksum tells); every other answer is read whole, so that a break is a 503 to retry.
    let body = if streamed { Body::from_stream(answer.bytes_stream()) } else { Body::from(answer.bytes().await?) };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    for (name, value) in headers {
        response.headers_mut().insert(name, value);
    }
    Ok(response)
}

/// Whether reading a body failed for its length limit.
fn is_length_limit(err: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(err) = source {
        if err.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use allot_store::{EmbeddedConfig, EmbeddedStore};

    use crate::access::Home;
    use crate::ServerState;

    /// The daemon that schedules serves the applications part, but for what the daemon that runs
    /// a task serves itself (its logs, on its machine, its wake-ups and its plugin's catalog), the snapshot (it reads
    /// the applications part under the scheduler's lock) and the run of the task in an alloc;
    /// any daemon the rest.
    #[tokio::test]
    async fn the_scheduler_serves_the_applications_part() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(EmbeddedStore::open(&EmbeddedConfig::new(dir.path())).unwrap());
        let (_, needs) = crate::routes::routes(ServerState::new(store));
        let mut scheduled = 0;
        for (method, path, _) in needs.all() {
            let apps_part = ["/v1/apps", "/v1/queues", "/v1/tasks"].iter().any(|root| path.starts_with(root));
            let runner_side = path.ends_with("/logs") || path.ends_with("/wake") || path.contains("/catalog");
            let snapshot = path == "/v1/snapshot";
            let alloc_run = path == "/v1/pools/{pool}/allocs/{alloc}/run";
            let expected =
                if (apps_part && !runner_side) || snapshot || alloc_run { Home::Scheduler } else { Home::Any };
            assert_eq!(needs.home(method, path), expected, "{method} {path}");
            scheduled += usize::from(expected == Home::Scheduler);
        }
        assert!(scheduled >= 19, "{scheduled} routes of the daemon that schedules");
        assert_eq!(needs.home(&axum::http::Method::GET, "/v1/apps/{app}/tasks/{task}/logs"), Home::Any);
    }
}
