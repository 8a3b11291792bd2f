//! Serving accepted connections: each over HTTP/1.1 or HTTP/2 on a task of the current runtime,
//! until a shutdown; then no new connections, and the open ones finish the requests they are in
//! and close.
//!
//! - **HTTP/2** is spoken when a TLS client chose it (ALPN `h2`) or a plaintext one opens with
//!   HTTP/2's preface (prior knowledge, `h2c`). Many waiters or watches then share one
//!   connection, at a fraction of a connection's memory each (docs/benchmarks.md, "Many
//!   waiters"); up to [`H2_MAX_STREAMS`] of them on one connection.
//! - **Why not `axum::serve`**: it serves through hyper-util's protocol-sniffing builder, which
//!   reads a connection's first bytes apart and hands them back, and hyper then grows its read
//!   buffer from 8 to 16 KiB on every connection, copying it: 4 KiB more resident memory for each
//!   idle connection or watcher (docs/benchmarks.md, "Idle connections"). Here the first bytes
//!   are peeked at, not read: an HTTP/1.1 connection is served by hyper's HTTP/1 builder as if
//!   nothing had looked.
//!
//! - **Idle connections end**: an HTTP/1.1 connection that sends no request's headers within the
//!   idle timeout of opening or of its last answer is closed (hyper's header read timeout), and
//!   so is one that has not said what it speaks by then. A request in flight (a long poll, a
//!   watch) is never idle.
//!
//! Invariant: every request carries its connection's [`Peer`] as `ConnectInfo<Peer>`, as
//! `axum::serve` with connect info would set it.

use std::future::Future;
use std::io;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::serve::Listener;
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use crate::tls::{Conn, Peer};
use crate::Api;

/// Serves the connections `listener` accepts with `api` until `shutdown` completes; then stops
/// accepting, asks every open connection to close once its request is answered, and returns when
/// all have.
pub(crate) async fn serve<L>(
    mut listener: L,
    api: Api,
    idle_timeout: Duration,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()>
where
    L: Listener<Io = Conn, Addr = Peer>,
{
    let graceful = GracefulShutdown::new();
    // Ends the connections still being told apart (nothing sent yet) at a shutdown.
    let stopping = CancellationToken::new();
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
                let service = TowerToHyperService::new(service);
                let (watcher, stopping) = (graceful.watcher(), stopping.clone());
                tokio::spawn(async move {
                    let protocol = tokio::select! {
                        () = stopping.cancelled() => return,
                        protocol = tokio::time::timeout(idle_timeout, protocol_of(&io)) => match protocol {
                            Ok(protocol) => protocol,
                            Err(_) => return,
                        },
                    };
                    let ended = match protocol {
                        Protocol::Http1 => {
                            let http1 = http1::Builder::new()
                                .timer(TokioTimer::new())
                                .header_read_timeout(idle_timeout)
                                .serve_connection(TokioIo::new(io), service);
                            watcher.watch(http1).await
                        }
                        Protocol::Http2 => watcher.watch(http2_builder().serve_connection(TokioIo::new(io), service)).await,
                    };
                    if let Err(err) = ended {
                        tracing::trace!(error = %err, "connection ended with an error");
                    }
                });
            }
        }
    }
    drop(listener);
    stopping.cancel();
    graceful.shutdown().await;
    Ok(())
}

/// The most streams (requests: waiters, watches) one HTTP/2 connection may have open at once.
pub(crate) const H2_MAX_STREAMS: u32 = 16_384;

/// The first bytes of an HTTP/2 connection (RFC 9113, section 3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    Http1,
    Http2,
}

/// HTTP/2 when a TLS client chose it by ALPN, or a plaintext one's first bytes are HTTP/2's
/// preface; HTTP/1.1 otherwise (and for a connection closed or failing before it said: hyper's
/// HTTP/1 server then sees the end or the error itself). Peeks, never reads: HTTP/1.1's bytes are
/// all still there for hyper.
pub(crate) async fn protocol_of(io: &Conn) -> Protocol {
    let tcp = match io {
        Either::Right(tls) => {
            return if tls.get_ref().1.alpn_protocol() == Some(b"h2") { Protocol::Http2 } else { Protocol::Http1 };
        }
        Either::Left(tcp) => tcp,
    };
    let mut first = [0u8; H2_PREFACE.len()];
    for _ in 0..PREFACE_WAITS {
        let seen = match tcp.peek(&mut first).await {
            Ok(0) | Err(_) => return Protocol::Http1,
            Ok(seen) => seen,
        };
        if !H2_PREFACE.starts_with(&first[..seen]) {
            return Protocol::Http1;
        }
        if seen == H2_PREFACE.len() {
            return Protocol::Http2;
        }
        // Part of the preface came (`P`, `PR`...: an HTTP/1.1 method too, `PUT`, `PATCH`): the
        // rest follows at once from any real client; a peek would answer at once again.
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    // Still part of the preface after a second: hyper's HTTP/1 server answers what it is.
    Protocol::Http1
}

/// How many times (a millisecond apart) a connection that sent part of HTTP/2's preface is looked
/// at again for the rest.
const PREFACE_WAITS: usize = 1000;

/// How the daemon serves HTTP/2.
pub(crate) fn http2_builder() -> http2::Builder<TokioExecutor> {
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder.max_concurrent_streams(H2_MAX_STREAMS);
    builder
}
