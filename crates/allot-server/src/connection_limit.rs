//! How many connections a daemon takes at once (`--max-connections`): a connection takes a slot
//! before it is accepted and gives it back when it ends (after its TLS handshake fails, or it
//! closes). At the limit none is accepted: the kernel holds new ones in the listen backlog until
//! one ends. The default leaves an eighth of the open-files limit (at least 256) to the store,
//! the runs' logs and pipes, and the connections the daemon opens: a flood of connections never
//! keeps the store from opening a file.

use std::io;
use std::sync::Arc;

use axum::serve::Listener;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

/// The connections' series: open now, the most allowed, and those that waited for a place
/// (registered by `Metrics`, kept up here).
#[derive(Debug, Clone, Default)]
pub(crate) struct ConnectionMetrics {
    pub(crate) open: Gauge,
    pub(crate) max: Gauge,
    pub(crate) waited: Counter,
}

/// The most connections open at once by default: the open-files limit (`RLIMIT_NOFILE`, as
/// [`raise_open_files_limit`] left it) less an eighth of it, at least 256, kept for everything
/// else the daemon opens.
pub fn default_max_connections() -> usize {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct it is given, which lives across the call.
    let files = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
    } else {
        1024
    };
    let kept = (files / 8).max(256);
    files.saturating_sub(kept).max(64)
}

/// Raises the open-files soft limit to the hard one, as Go's runtime does at start: a daemon
/// holding many connections or watches needs more than the usual default of 1,024. Returns the
/// limit now in force.
pub fn raise_open_files_limit() -> std::io::Result<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: as above; setrlimit only reads the struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        limit = raised;
    }
    Ok(limit.rlim_cur)
}

/// A connection's slot among the open connections allowed ([`Capped`]), held until it ends;
/// counted in `allot_connections_open` meanwhile.
#[derive(Debug)]
pub(crate) struct Slot {
    _permit: tokio::sync::OwnedSemaphorePermit,
    open: Gauge,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.dec();
    }
}

/// Where an accepted connection comes from, with its slot.
#[derive(Debug)]
pub(crate) struct Admitted {
    pub addr: std::net::SocketAddr,
    pub slot: Option<Slot>,
}

impl From<std::net::SocketAddr> for Admitted {
    fn from(addr: std::net::SocketAddr) -> Admitted {
        Admitted { addr, slot: None }
    }
}

/// A listener that accepts a connection only once one of `max` slots is free (see the module).
pub(crate) struct Capped<L> {
    inner: L,
    slots: Arc<tokio::sync::Semaphore>,
    max: usize,
    metrics: ConnectionMetrics,
    /// Said in the log when the limit was last reached, until a connection is accepted at once.
    at_limit: bool,
}

impl<L> Capped<L> {
    pub(crate) fn new(inner: L, max: usize, metrics: ConnectionMetrics) -> Capped<L> {
        let max = max.clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        metrics.max.set(i64::try_from(max).unwrap_or(i64::MAX));
        Capped { inner, slots: Arc::new(tokio::sync::Semaphore::new(max)), max, metrics, at_limit: false }
    }

    /// The listener, given back.
    pub(crate) fn into_inner(self) -> L {
        self.inner
    }
}

impl<L> Listener for Capped<L>
where
    L: Listener<Addr = std::net::SocketAddr>,
{
    type Io = L::Io;
    type Addr = Admitted;

    async fn accept(&mut self) -> (L::Io, Admitted) {
        let slot = match self.slots.clone().try_acquire_owned() {
            Ok(slot) => {
                self.at_limit = false;
                slot
            }
            Err(_) => {
                self.metrics.waited.inc();
                if !self.at_limit {
                    self.at_limit = true;
                    tracing::warn!(
                        max_connections = self.max,
                        "at the most connections allowed: accepting no more until one ends (--max-connections)"
                    );
                }
                self.slots.clone().acquire_owned().await.expect("the slots are never closed")
            }
        };
        let (io, addr) = self.inner.accept().await;
        self.metrics.open.inc();
        (io, Admitted { addr, slot: Some(Slot { _permit: slot, open: self.metrics.open.clone() }) })
    }

    fn local_addr(&self) -> io::Result<Admitted> {
        self.inner.local_addr().map(Admitted::from)
    }
}
