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

/// What the snapshot's writer hands the answer: bytes of the archive, or why it stopped.
enum Piece {
    Bytes(bytes::Bytes),
    Failed(allot_store::StoreError),
}

/// Hands what the store writes to the answer's body, a write at a time (the store writes through
/// a buffer of its own); fails once the caller went away.
struct ToBody(tokio::sync::mpsc::Sender<Piece>);

impl std::io::Write for ToBody {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let piece = Piece::Bytes(bytes::Bytes::copy_from_slice(buf));
        self.0.blocking_send(piece).map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A point-in-time archive of everything the store holds, for `allot snapshot save` (its layout:
/// docs/design.md, "Snapshots"), streamed while it is read; operations go on meanwhile. On Redis
/// it is taken by the daemon that schedules applications (another forwards the call there).
#[utoipa::path(get, path = "/v1/snapshot", tag = "daemon",
    responses(
        (status = 200, content_type = "application/octet-stream",
            description = "the archive: a header line (its format, the revision it holds every change up to, when it was taken), \
                the records, and the SHA-256 of all of it at its end. An answer cut short lacks that checksum: \
                `allot snapshot status FILE` tells a whole archive from a broken one."),
        (status = 501, body = api::ErrorBody, description = "unsupported: this daemon's store takes no snapshots"),
        (status = 503, body = api::ErrorBody, description = "store_unavailable: the log could not be written into the database first, \
            Redis could not be read, or (on Redis) no daemon schedules applications right now: retry")))]
pub(crate) async fn snapshot(
    State(state): State<ServerState>,
) -> Result<axum::response::Response, crate::error::ApiError> {
    use futures_util::StreamExt;
    let (pieces, mut received) = tokio::sync::mpsc::channel::<Piece>(4);
    let (store, runtime) = (state.store.clone(), tokio::runtime::Handle::current());
    // On a thread of its own, lowered to the lowest priority once the read began: the calls
    // served meanwhile keep the CPU they need.
    let started = std::thread::Builder::new().name("allot-snapshot".into()).spawn(move || {
        let _runtime = runtime.enter();
        let mut body = allot_host::priority::LowerWhenLarge::new(ToBody(pieces.clone()));
        if let Err(err) = store.snapshot(&mut body) {
            tracing::warn!(error = %err, "snapshot failed");
            let _ = pieces.blocking_send(Piece::Failed(err));
        }
    });
    if let Err(err) = started {
        return Err(crate::error::ApiError::of(
            allot_api::ErrorCode::Internal,
            format!("cannot start the snapshot's thread: {err}"),
        ));
    }
    let first = match received.recv().await {
        Some(Piece::Bytes(first)) => first,
        Some(Piece::Failed(err)) => return Err(err.into()),
        None => {
            return Err(crate::error::ApiError::of(
                allot_api::ErrorCode::Internal,
                "the snapshot's writer stopped without a word",
            ))
        }
    };
    // A failure after the first bytes cuts the answer short: the archive then lacks its checksum.
    let rest = futures_util::stream::unfold(received, |mut received| async move {
        match received.recv().await {
            Some(Piece::Bytes(bytes)) => Some((Ok(bytes), received)),
            Some(Piece::Failed(err)) => Some((Err(std::io::Error::other(err.to_string())), received)),
            None => None,
        }
    });
    let body = futures_util::stream::once(async move { Ok::<_, std::io::Error>(first) }).chain(rest);
    let headers = [
        (axum::http::header::CONTENT_TYPE, "application/octet-stream"),
        (axum::http::header::CONTENT_DISPOSITION, "attachment; filename=\"allot.snapshot\""),
    ];
    Ok((headers, axum::body::Body::from_stream(body)).into_response())
}
