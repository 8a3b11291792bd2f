//! Answering while the daemon starts: from the moment it listens until its store is open (a
//! large embedded store being read, a Redis not reachable yet), every call is answered 503
//! `starting` with `Retry-After: 1`, so clients wait and try again instead of being refused or
//! left hanging. `/healthz` answers 200 (status `starting`: the process is alive) and `/readyz`
//! 503, as orchestrators expect of a process that is loading.
//!
//! Invariant: each answer closes its connection (an HTTP/2 one once the requests it brought are
//! answered), so a client's next call opens a new one, which
//! the daemon's server accepts once [`Starting::ready`] handed it the listener.
//!
//! Bounded as the daemon's server is: at most `max_connections` open at once (the others wait in
//! the listen backlog), and a connection that has not had its answer within the idle timeout
//! (one that says nothing, or says it a byte at a time) is closed, also after the daemon is
//! ready.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_api as api;
use axum::body::Body;
use axum::http::{header, HeaderValue, Request, Response, StatusCode};
use axum::serve::Listener;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::connection_limit::{Capped, ConnectionMetrics};
use crate::connections::{http2_builder, protocol_of, Protocol};
use crate::error::ErrorCode;
use crate::tls::{Accepting, Tls};

/// The server of a starting daemon (see the module). [`Starting::ready`] stops it.
pub struct Starting {
    stop: oneshot::Sender<()>,
    accepting: JoinHandle<TcpListener>,
}

/// Answers on `listener` (over TLS if `tls` is given) while the daemon starts, at most
/// `max_connections` at once, each closed after `idle_timeout` if not answered by then;
/// `backend` names the store being opened (`embedded`, `redis`).
pub fn starting(
    listener: TcpListener,
    tls: Option<Arc<Tls>>,
    backend: &'static str,
    max_connections: usize,
    idle_timeout: Duration,
) -> Starting {
    let (stop, stopped) = oneshot::channel();
    let since = Instant::now();
    let accepting = tokio::spawn(async move {
        let capped = Capped::new(listener, max_connections, ConnectionMetrics::default());
        let mut accepting = Accepting::new(capped, tls);
        let mut stopped = std::pin::pin!(stopped);
        loop {
            tokio::select! {
                biased;
                _ = &mut stopped => break,
                (io, peer) = accepting.accept() => {
                    let service = hyper::service::service_fn(move |request: Request<Incoming>| async move {
                        Ok::<_, std::convert::Infallible>(answer(request.uri().path(), backend, since))
                    });
                    tokio::spawn(async move {
                        // The slot is given back when the connection ends, or is cut off.
                        let _slot = peer.slot;
                        let served = async move { match protocol_of(&io).await {
                            Protocol::Http1 => {
                                http1::Builder::new().keep_alive(false).serve_connection(TokioIo::new(io), service).await
                            }
                            // The requests already sent are answered, then the connection goes
                            // (GOAWAY), as an HTTP/1.1 answer closes its own.
                            Protocol::Http2 => {
                                let connection = http2_builder().serve_connection(TokioIo::new(io), service);
                                let mut connection = std::pin::pin!(connection);
                                connection.as_mut().graceful_shutdown();
                                connection.await
                            }
                        } };
                        match tokio::time::timeout(idle_timeout, served).await {
                            Ok(Ok(())) => {}
                            Ok(Err(err)) => tracing::trace!(error = %err, "a connection ended with an error while starting"),
                            Err(_) => tracing::debug!(addr = %peer.addr, "a connection had no answer in time while starting: closed"),
                        }
                    });
                }
            }
        }
        accepting.into_inner().into_inner()
    });
    Starting { stop, accepting }
}

impl Starting {
    /// Stops answering `starting` and hands the listener back, for the daemon's server: the
    /// connections waiting to be accepted are its.
    pub async fn ready(self) -> io::Result<TcpListener> {
        let _ = self.stop.send(());
        self.accepting.await.map_err(io::Error::other)
    }
}

/// The answer to a call on `path`, `since` the daemon began to start.
fn answer(path: &str, backend: &str, since: Instant) -> Response<Body> {
    let waited = since.elapsed().as_secs_f64();
    let why = format!("the daemon is starting: it is opening its store ({backend}, {waited:.1} s so far); try again");
    let (status, body) = match path {
        "/healthz" => (
            StatusCode::OK,
            serde_json::to_vec(&api::Health {
                status: "starting".to_owned(),
                backend: backend.to_owned(),
                durability: String::new(),
                version: env!("CARGO_PKG_VERSION").to_owned(),
            }),
        ),
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            serde_json::to_vec(&api::Readiness {
                status: "not_ready".to_owned(),
                backend: backend.to_owned(),
                checks: vec![api::ReadinessCheck { name: "store".to_owned(), ready: false, message: Some(why) }],
            }),
        ),
        _ => (
            StatusCode::SERVICE_UNAVAILABLE,
            serde_json::to_vec(&api::ErrorBody {
                error: api::ErrorDetail {
                    code: ErrorCode::Starting.as_str().to_owned(),
                    message: why,
                    compact_revision: None,
                },
            }),
        ),
    };
    let mut response = Response::new(Body::from(body.unwrap_or_default()));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if status != StatusCode::OK {
        headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}
