//! On a store that several daemons share (Redis), one daemon at a time schedules applications
//! and serves the applications part; the others forward those calls to it, as they came, and
//! answer what it answered. A call that finds no scheduler (one is taking over) is a 503 to retry.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use allot_store::AppsHome;

use crate::error::ApiError;
use crate::{ServerState, FORWARDED, MAX_SUBMIT_BODY_BYTES};

/// The applications part, less what the daemon that runs a task serves itself (its logs, on its
/// machine, and its wake-ups).
fn is_apps_part(path: &str) -> bool {
    let served_here = path.starts_with("/v1/apps/") && (path.ends_with("/logs") || path.ends_with("/wake"));
    !served_here
        && ["/v1/apps", "/v1/queues", "/v1/tasks"]
            .iter()
            .any(|root| path.strip_prefix(root).is_some_and(|rest| rest.is_empty() || rest.starts_with('/')))
}

fn unavailable(message: String) -> Response {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", message).into_response()
}

/// Serves the applications part here, or forwards it to the daemon that schedules.
pub(crate) async fn to_scheduler(State(state): State<ServerState>, request: Request, next: Next) -> Response {
    if !is_apps_part(request.uri().path()) {
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
        AppsHome::At(base) => forward(&state.forwarder, &base, request).await.unwrap_or_else(|message| {
            unavailable(format!("the daemon that schedules applications ({base}) did not answer: {message}; retry"))
        }),
    }
}

async fn forward(client: &reqwest::Client, base: &str, request: Request) -> Result<Response, String> {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let body = axum::body::to_bytes(body, MAX_SUBMIT_BODY_BYTES).await.map_err(|e| e.to_string())?;
    let mut outgoing = client.request(parts.method, format!("{base}{path}")).header(FORWARDED, "1").body(body);
    // The daemon that schedules authenticates and authorizes the call itself.
    for name in [header::CONTENT_TYPE, header::ACCEPT, header::AUTHORIZATION] {
        if let Some(value) = parts.headers.get(&name) {
            outgoing = outgoing.header(name, value);
        }
    }
    let answer = outgoing.send().await.map_err(|e| e.to_string())?;
    let status = answer.status();
    let mut headers = Vec::new();
    for name in [header::CONTENT_TYPE, header::RETRY_AFTER, header::LOCATION, crate::routes::watch::REVISION] {
        if let Some(value) = answer.headers().get(&name) {
            headers.push((name, value.clone()));
        }
    }
    let bytes = answer.bytes().await.map_err(|e| e.to_string())?;
    let mut response = Response::new(Body::from(bytes));
    *response.status_mut() = status;
    for (name, value) in headers {
        response.headers_mut().insert(name, value);
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::is_apps_part;

    #[test]
    fn the_applications_part_is_under_apps_and_queues() {
        for (path, expected) in [
            ("/v1/apps", true),
            ("/v1/apps/a", true),
            ("/v1/queues", true),
            ("/v1/queues/root.a", true),
            ("/v1/apps/a/tasks/t/logs", false),
            ("/v1/apps/a/tasks/t/wake", false),
            ("/v1/appsx", false),
            ("/v1/queuesx/a", false),
            ("/v1/namespaces/a/grants/t", false),
        ] {
            assert_eq!(is_apps_part(path), expected, "{path}");
        }
    }
}
