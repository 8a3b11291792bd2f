//! `allot baseline-server`: the benchmark's baseline, an HTTP/1.1 server on the same stack as the
//! daemon (axum on hyper and tokio) that answers every request at once with a small fixed JSON body
//! shaped like a real allot answer, reads and discards request bodies, and holds nothing.
//!
//! Comparing the daemon with it in the same run, under the same clients, measures what allot's own
//! work (ledger, durability) costs, independent of how fast the machine is.

use std::io::Write as _;
use std::net::SocketAddr;

use axum::body::Bytes;
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::serve::ListenerExt;
use axum::Router;

/// Options of `allot baseline-server`.
#[derive(Debug, clap::Args)]
pub struct BaselineArgs {
    /// The address to listen on; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
}

/// The answer to an allocate (`PUT .../grants/{token}`).
const GRANTED: &str =
    r#"{"status":"Granted","grant":{"namespace":"bench","token":"token","units":1,"fencing":1},"existing":false}"#;
/// The answer to a release (`DELETE .../grants/{token}`).
const RELEASED: &str = r#"{"released":true,"grant":{"namespace":"bench","token":"token","units":1,"fencing":1}}"#;
/// The answer to `PUT /v1/namespaces/{namespace}`.
const NAMESPACE: &str = r#"{"created":true,"namespace":{"name":"bench","quota":1000000,"granted_units":0,"grants":0,"waiters":0,"waiting_units":0,"longest_wait_ms":0,"next_fencing":1}}"#;
/// The answer to `GET /healthz`.
const HEALTH: &str = r#"{"status":"ok","backend":"baseline","version":"0"}"#;
/// The answer to everything else.
const EMPTY: &str = "{}";

/// Runs the baseline server until SIGTERM or SIGINT.
pub async fn baseline_server(args: BaselineArgs) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let local = listener.local_addr()?;
    let listener = listener.tap_io(|stream| {
        let _ = stream.set_nodelay(true);
    });
    let app = Router::new().fallback(answer);
    println!("allot listening on http://{local}");
    std::io::stdout().flush()?;
    axum::serve(listener, app).with_graceful_shutdown(shutdown_signal()).await?;
    Ok(())
}

/// Answers at once; the body (already read by the `Bytes` extractor) is dropped.
async fn answer(method: Method, uri: Uri, _body: Bytes) -> Response {
    let path = uri.path();
    let body = if path.contains("/grants/") {
        match method {
            Method::PUT => GRANTED,
            Method::DELETE => RELEASED,
            _ => EMPTY,
        }
    } else if method == Method::PUT && path.starts_with("/v1/namespaces/") {
        NAMESPACE
    } else if path == "/healthz" {
        HEALTH
    } else {
        EMPTY
    };
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(_) => {
                let _ = interrupt.await;
                return;
            }
        };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_allot_answers() {
        let granted: allot_api::AllocateResponse = serde_json::from_str(GRANTED).unwrap();
        assert_eq!(granted.status, allot_api::Status::Granted);
        let released: allot_api::ReleaseResponse = serde_json::from_str(RELEASED).unwrap();
        assert!(released.released);
        let _: allot_api::PutNamespaceResponse = serde_json::from_str(NAMESPACE).unwrap();
        let _: allot_api::Health = serde_json::from_str(HEALTH).unwrap();
    }
}
