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
//! - **Idle connections end**: a connection with no handler at work (one waiting for the rest of
//!   its request's body is not) that neither starts or ends a request nor writes a byte for the
//!   idle timeout (checked every half of it: closed after one to one and a half timeouts) is
//!   closed: one that says nothing, one that sends its headers or its body a byte at a time
//!   (Slowloris), an idle keep-alive connection. A long poll is at work; a watch writes its
//!   heartbeats. Not hyper's header read timeout: that registers a timer for every request, about
//!   a microsecond of CPU per pair on this path (docs/benchmarks.md); this costs a few atomic
//!   additions a request, and a timer a connection.
//!
//! - **At most `--max-connections` open at once**: the listener is [`crate::connection_limit::Capped`];
//!   a connection's slot is held by its task here while it is served.
//!
//! Invariant: every request carries its connection's [`Peer`] as `ConnectInfo<Peer>`, as
//! `axum::serve` with connect info would set it.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::serve::Listener;
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
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
            (io, mut peer) = listener.accept() => {
                // Held while the connection is served; its requests' copies of the peer have none.
                let slot = peer.slot.take();
                let activity = Arc::new(Activity::default());
                let requests = activity.clone();
                let bodies = activity.clone();
                let service = api.clone().map_request(move |request: hyper::Request<Incoming>| {
                    let mut request = request.map(|body| Body::new(Reading::of(body, &bodies)));
                    request.extensions_mut().insert(ConnectInfo(peer.clone()));
                    request
                });
                let service = TowerToHyperService::new(CountRequests { inner: service, activity: requests });
                let (watcher, stopping) = (graceful.watcher(), stopping.clone());
                tokio::spawn(async move {
                    let _slot = slot;
                    let mut idle = std::pin::pin!(activity.idle_for(idle_timeout));
                    let protocol = tokio::select! {
                        () = stopping.cancelled() => return,
                        () = &mut idle => return,
                        protocol = protocol_of(&io) => protocol,
                    };
                    let io = TokioIo::new(Counted { io, activity: activity.clone() });
                    let serving = async {
                        match protocol {
                            Protocol::Http1 => watcher.watch(http1::Builder::new().serve_connection(io, service)).await,
                            Protocol::Http2 => watcher.watch(http2_builder().serve_connection(io, service)).await,
                        }
                    };
                    let ended = tokio::select! {
                        ended = serving => ended,
                        () = &mut idle => {
                            tracing::trace!("an idle connection closed");
                            return;
                        }
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

/// What a connection has done, for its idle watchdog ([`Activity::idle_for`]).
#[derive(Debug, Default)]
struct Activity {
    /// Requests whose handlers have not answered yet (a long poll waits in its handler).
    in_flight: AtomicUsize,
    /// Request bodies not all come yet. A handler waiting for the rest of its body is not at work:
    /// it counts in `in_flight` and here, and the bytes it reads are no progress, so a body sent a
    /// byte at a time is cut off as headers sent so are.
    bodies_pending: AtomicUsize,
    /// Counts requests begun and ended, and writes: a change is progress.
    progress: AtomicU64,
}

impl Activity {
    /// Ends once the connection has had no request in flight and made no progress for
    /// `timeout`, seen at two looks `timeout / 2` apart: between one and one and a half
    /// timeouts after its last progress.
    async fn idle_for(&self, timeout: Duration) {
        let look_every = timeout / 2;
        let mut seen = self.progress.load(Ordering::Relaxed);
        let mut quiet_looks = 0;
        loop {
            tokio::time::sleep(look_every).await;
            let progress = self.progress.load(Ordering::Relaxed);
            if progress != seen || self.at_work() {
                (seen, quiet_looks) = (progress, 0);
                continue;
            }
            quiet_looks += 1;
            if quiet_looks == 2 {
                return;
            }
        }
    }

    /// True while some handler is at work: in flight, and not waiting for the rest of its body.
    fn at_work(&self) -> bool {
        // Read in this order, a body that ends between the two reads shows as work: never a
        // handler at work missed.
        let in_flight = self.in_flight.load(Ordering::Relaxed);
        in_flight > self.bodies_pending.load(Ordering::Relaxed)
    }
}

/// A request's body, counted in its connection's [`Activity`] as pending until it has all come
/// (its end, an error, or the body dropped unread).
struct Reading {
    body: Incoming,
    pending: Option<BodyPending>,
}

impl Reading {
    fn of(body: Incoming, activity: &Arc<Activity>) -> Reading {
        use hyper::body::Body as _;
        let pending = (!body.is_end_stream()).then(|| {
            activity.bodies_pending.fetch_add(1, Ordering::Relaxed);
            BodyPending(activity.clone())
        });
        Reading { body, pending }
    }
}

impl hyper::body::Body for Reading {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, hyper::Error>>> {
        let frame = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(frame, Poll::Ready(None | Some(Err(_)))) || self.body.is_end_stream() {
            self.pending = None;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// A body not all come yet, counted in [`Activity::bodies_pending`] until dropped.
struct BodyPending(Arc<Activity>);

impl Drop for BodyPending {
    fn drop(&mut self) {
        self.0.bodies_pending.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A request's handler at work, counted in its connection's [`Activity`] until dropped.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn begin(activity: &Arc<Activity>) -> InFlight {
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        activity.progress.fetch_add(1, Ordering::Relaxed);
        InFlight(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.progress.fetch_add(1, Ordering::Relaxed);
    }
}

/// Counts every request of `inner` in flight in its connection's [`Activity`].
#[derive(Clone)]
struct CountRequests<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S: tower::Service<R>, R> tower::Service<R> for CountRequests<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = Counting<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Counting<S::Future> {
        Counting { answer: self.inner.call(request), _in_flight: InFlight::begin(&self.activity) }
    }
}

pin_project_lite::pin_project! {
    /// A request's answer, counted in flight until it is ready (or dropped).
    struct Counting<F> {
        #[pin]
        answer: F,
        _in_flight: InFlight,
    }
}

impl<F: Future> Future for Counting<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.project().answer.poll(cx)
    }
}

/// A connection's stream, counting its writes as progress (a watch's heartbeats, a body).
struct Counted {
    io: Conn,
    activity: Arc<Activity>,
}

impl Counted {
    fn wrote(&self, written: &Poll<io::Result<usize>>) {
        if matches!(written, Poll::Ready(Ok(n)) if *n > 0) {
            self.activity.progress.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl AsyncRead for Counted {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write(cx, buf);
        self.wrote(&written);
        written
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.wrote(&written);
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
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
