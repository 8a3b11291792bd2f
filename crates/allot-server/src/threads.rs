//! Serving threads: connections are accepted on the caller's runtime and handed, round-robin, to
//! a fixed set of threads, each running a single-threaded runtime of its own. A connection is
//! read, handled and answered on one thread from start to end.
//!
//! Why: on tokio's work-stealing runtime a request often wakes one worker to read it and is
//! answered from another, so every request pays thread wake-ups (futex calls, reschedule
//! interrupts) besides its socket calls. One thread per connection cuts them; on two CPUs shared
//! with the clients the disk level served about a quarter more pairs/s at 64 clients. The cost: a
//! connection waits while its thread waits for a CPU (docs/benchmarks.md).
//!
//! Invariants: every thread has an API (router) of its own, alike (handlers share the store through
//! `ServerState`); a connection handed to a thread never moves; on shutdown the acceptor stops first,
//! then every thread stops accepting, lets its connections finish their requests and ends.

use std::future::Future;
use std::io;
use std::net::SocketAddr;

use std::sync::Arc;

use axum::serve::Listener;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

use crate::connection_limit::{Admitted, Slot};
use crate::tls::{Accepting, Tls};
use allot_host::affinity;

use crate::Api;

/// How connections are served: on the caller's runtime, or on serving threads of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServingThreads {
    /// How many serving threads; 0 serves on the caller's runtime.
    pub count: usize,
    /// Pin each serving thread to a CPU of its own, when there are no more threads than CPUs
    /// the process may run on. Unpinned, the kernel balances the CPUs by load and may put two
    /// busy serving threads on one CPU, where they take turns of a scheduler tick (4 ms) while
    /// other processes run on the other CPU; pinned, each keeps its CPU, for a shorter tail, but
    /// shares it with whatever else runs there, for more CPU per request (docs/benchmarks.md).
    pub pin: bool,
}

/// Serves, on `threads.count` serving threads (at least one is started), each with the API
/// that `api` makes for it, the connections `listener` accepts, until `shutdown` completes;
/// then shuts down gracefully and returns once every thread has ended.
pub(crate) async fn serve<L>(
    mut listener: L,
    api: impl Fn() -> Api,
    tls: Option<Arc<Tls>>,
    idle_timeout: std::time::Duration,
    threads: ServingThreads,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()>
where
    L: Listener<Io = TcpStream, Addr = Admitted>,
{
    // Thread `i` is pinned to `cpus[i]`; no thread is pinned if there are too few CPUs.
    let mut cpus = if threads.pin { affinity::allowed_cpus() } else { Vec::new() };
    if threads.pin && threads.count > cpus.len() {
        tracing::info!(
            threads = threads.count,
            cpus = cpus.len(),
            "serving threads not pinned: more threads than CPUs to pin them to"
        );
        cpus.clear();
    }
    let threads = threads.count.max(1);
    let local = listener.local_addr()?.addr;
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut hand_to = Vec::with_capacity(threads);
    let mut joins = Vec::with_capacity(threads);
    for index in 0..threads {
        let (tx, rx) = mpsc::unbounded_channel();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let api = api();
        let tls = tls.clone();
        let mut stop = stop_rx.clone();
        let cpu = cpus.get(index).copied();
        let join = std::thread::Builder::new().name(format!("allot-serve-{index}")).spawn(move || {
            if let Some(cpu) = cpu {
                if let Err(err) = affinity::pin_current_thread(cpu) {
                    tracing::warn!(error = %err, cpu, "cannot pin a serving thread to its CPU; it runs unpinned");
                }
            }
            runtime.block_on(async move {
                let stopped = async move {
                    let _ = stop.wait_for(|stop| *stop).await;
                };
                // Handshakes (with TLS) run on this thread too.
                crate::connections::serve(Accepting::new(Handed { rx, local }, tls), api, idle_timeout, stopped).await
            })
        })?;
        hand_to.push(tx);
        joins.push(join);
    }

    let mut shutdown = std::pin::pin!(shutdown);
    let mut next = 0;
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            (stream, admitted) = listener.accept() => {
                // Handed over as a standard socket, with its slot: it is registered again with
                // the runtime of the thread that serves it.
                match stream.into_std() {
                    Ok(stream) => {
                        // A send fails only if that thread has ended, which it does only once
                        // told to stop.
                        let _ = hand_to[next].send((stream, admitted.slot));
                        next = (next + 1) % threads;
                    }
                    Err(err) => tracing::debug!(error = %err, peer = %admitted.addr, "cannot hand over a connection"),
                }
            }
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(hand_to);
    let ended = tokio::task::spawn_blocking(move || joins.into_iter().map(|join| join.join()).collect::<Vec<_>>())
        .await
        .map_err(io::Error::other)?;
    for thread in ended {
        match thread {
            Ok(served) => served?,
            Err(_) => return Err(io::Error::other("a serving thread panicked")),
        }
    }
    Ok(())
}

/// The connections handed to one serving thread, as a listener.
struct Handed {
    rx: mpsc::UnboundedReceiver<(std::net::TcpStream, Option<Slot>)>,
    local: SocketAddr,
}

impl Listener for Handed {
    type Io = TcpStream;
    type Addr = Admitted;

    async fn accept(&mut self) -> (TcpStream, Admitted) {
        loop {
            let Some((stream, slot)) = self.rx.recv().await else {
                // The acceptor has stopped: so has this thread's server, which stops accepting.
                return std::future::pending().await;
            };
            match TcpStream::from_std(stream) {
                Ok(stream) => {
                    let addr = stream.peer_addr().unwrap_or(self.local);
                    return (stream, Admitted { addr, slot });
                }
                Err(err) => tracing::debug!(error = %err, "cannot serve a handed-over connection"),
            }
        }
    }

    fn local_addr(&self) -> io::Result<Admitted> {
        Ok(Admitted::from(self.local))
    }
}
