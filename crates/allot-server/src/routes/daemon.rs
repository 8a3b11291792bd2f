//! The handlers of the daemon itself: whether it answers (`/healthz`) and whether it can serve
//! every part now (`/readyz`).

use allot_api as api;
use allot_store::AppsHome;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;

use crate::ServerState;

#[utoipa::path(get, path = "/healthz", tag = "daemon", responses((status = 200, body = api::Health)))]
pub(crate) async fn healthz(State(state): State<ServerState>) -> Json<api::Health> {
    Json(api::Health {
        status: "ok".into(),
        backend: state.store.backend().into(),
        durability: state.store.durability().into(),
        version: env!("CARGO_PKG_VERSION").into(),
    })
}

/// How long `/readyz` waits for the daemon that schedules applications to answer.
const REACH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether this daemon can serve every part of the API now: its store answers, and the
/// applications part is served here or by a daemon this one reaches (on Redis, the one elected to
/// schedule). `/healthz` only says that the process answers.
#[utoipa::path(get, path = "/readyz", tag = "daemon",
    responses((status = 200, body = api::Readiness, description = "ready: every check passes"),
        (status = 503, body = api::Readiness, description = "not ready (starting, a scheduler being elected, the store unreachable, shutting down): the failed checks say why")))]
pub(crate) async fn readyz(State(state): State<ServerState>) -> axum::response::Response {
    let check = |name: &str, ready: bool, message: Option<String>| api::ReadinessCheck {
        name: name.to_owned(),
        ready,
        message,
    };
    let store = match state.store.check_ready().await {
        Ok(()) => check("store", true, None),
        Err(err) => check("store", false, Some(err.to_string())),
    };
    let apps = match state.store.apps_home() {
        AppsHome::Here => check("applications", true, None),
        AppsHome::Unknown => check(
            "applications",
            false,
            Some("no daemon schedules applications yet (one is being elected, within about 3 s)".to_owned()),
        ),
        AppsHome::At(base) => match reach(state.forwarder.client(), &base).await {
            Ok(()) => check("applications", true, Some(format!("served by the daemon that schedules, at {base}"))),
            Err(why) => check(
                "applications",
                false,
                Some(format!("the daemon that schedules applications, at {base}, does not answer: {why}")),
            ),
        },
    };
    let checks = vec![store, apps];
    let ready = checks.iter().all(|c| c.ready);
    let body = api::Readiness {
        status: if ready { "ready" } else { "not_ready" }.to_owned(),
        backend: state.store.backend().to_owned(),
        checks,
    };
    if ready {
        return (StatusCode::OK, Json(body)).into_response();
    }
    // Expected soon, as every 503 of the API says.
    let retry = [(axum::http::header::RETRY_AFTER, "1")];
    (StatusCode::SERVICE_UNAVAILABLE, retry, Json(body)).into_response()
}

/// Whether the daemon at `base` answers its `/healthz` within [`REACH_TIMEOUT`].
async fn reach(client: &reqwest::Client, base: &str) -> Result<(), String> {
    let answer =
        client.get(format!("{base}/healthz")).timeout(REACH_TIMEOUT).send().await.map_err(|e| e.to_string())?;
    match answer.status() {
        status if status.is_success() => Ok(()),
        status => Err(format!("it answered {status}")),
    }
}
