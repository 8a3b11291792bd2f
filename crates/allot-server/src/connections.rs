//! Serving accepted connections: each over HTTP/1.1 on a task of the current runtime, until a
//! shutdown; then no new connections, and the open ones finish the request they are in and close.
//!
//! Why not `axum::serve`: it serves through hyper-util's protocol-sniffing builder, which reads a
//! connection's first bytes apart and hands them back, and hyper then grows its read buffer from
//! 8 to 16 KiB on every connection, copying it: 4 KiB more resident memory for each idle
//! connection or watcher (docs/benchmarks.md, "Idle connections"). The daemon speaks HTTP/1.1
//! only, so hyper's HTTP/1 builder serves it directly.
//!
//! Invariant: every request carries its connection's [`Peer`] as `ConnectInfo<Peer>`, as
//! `axum::serve` with connect info would set it.

use std::future::Future;
use std::io;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::serve::Listener;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tower::ServiceExt as _;

use crate::tls::{Conn, Peer};
use crate::Api;

/// Serves the connections `listener` accepts with `api` until `shutdown` completes; then stops
/// accepting, asks every open connection to close once its request is answered, and returns when
/// all have.
pub(crate) async fn serve<L>(mut listener: L, api: Api, shutdown: impl Future<Output = ()>) -> io::Result<()>
where
    L: Listener<Io = Conn, Addr = Peer>,
{
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            (io, peer) = listener.accept() => {
                let service = api.clone().map_request(move |request: hyper::Request<Incoming>| {
                    let mut request = request.map(Body::new);
                    request.extensions_mut().insert(ConnectInfo(peer.clone()));
                    request
                });
                let connection = http1::Builder::new()
                    .serve_connection(TokioIo::new(io), TowerToHyperService::new(service));
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    if let Err(err) = connection.await {
                        tracing::trace!(error = %err, "connection ended with an error");
                    }
                });
            }
        }
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
