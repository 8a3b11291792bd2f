//! [`spawn_keepalive`]: keeps one alloc alive in the background and says when it is lost.

use allot_api as api;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

use super::*;

/// How [`spawn_keepalive`] keeps an alloc alive. The defaults are Reflow's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KeepaliveOptions {
    /// The lease each keepalive asks for (default 2 min; the daemon grants at most 5 min).
    pub lease: Duration,
    /// Renew this long before the granted lease ends (default 30 s). When the granted lease is
    /// not longer than this, renew after half of it instead.
    pub offset: Duration,
    /// The longest one keepalive call may take (default 10 s); never past the lease's end.
    pub call_timeout: Duration,
    /// The wait between retries of a failed keepalive (default 2 s × 1.5, at most 30 s, jitter 0.2).
    pub retry: Backoff,
    /// How many times a failed keepalive is retried before giving up (default 5).
    pub retries: u32,
}

impl Default for KeepaliveOptions {
    fn default() -> KeepaliveOptions {
        KeepaliveOptions {
            lease: Duration::from_secs(120),
            offset: Duration::from_secs(30),
            call_timeout: Duration::from_secs(10),
            retry: Backoff { initial: Duration::from_secs(2), factor: 1.5, max: Duration::from_secs(30), jitter: 0.2 },
            retries: 5,
        }
    }
}

/// Why a kept-alive alloc was lost.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum LostReason {
    /// The alloc will not come back: it ended, is unknown, or its pool is gone
    /// ([`PoolCallError::is_alloc_gone`]).
    #[error("the alloc is gone: {0}")]
    Gone(PoolCallError),
    /// The daemon refused the keepalive with an error that retrying will not fix.
    #[error("the keepalive was refused: {0}")]
    Refused(PoolCallError),
    /// The keepalive kept failing with transient errors until the lease ended, or would end
    /// before the next try (`lease_ended`), or until the retries ran out.
    #[error("the keepalive failed {tries} times{}; last error: {last_error}", if *.lease_ended { " until the lease ended" } else { "" })]
    GaveUp { tries: u32, lease_ended: bool, last_error: PoolCallError },
    /// The keepalive task ended without saying why (it panicked).
    #[error("the keepalive task ended unexpectedly")]
    TaskEnded,
}

/// What the keepalive of one alloc is doing.
#[derive(Debug, Clone, Default)]
pub struct KeepaliveStatus {
    /// Keepalive calls made, failed ones included.
    pub calls: u64,
    /// Successful keepalives.
    pub renewals: u64,
    /// The last interval granted.
    pub granted: Option<Duration>,
    /// When the lease ends, by the client's clock (measured from when the call was sent).
    pub lease_ends: Option<Instant>,
    /// Set once the alloc is lost; the keepalive has stopped.
    pub lost: Option<LostReason>,
}

/// The owner's side of [`spawn_keepalive`]: dropping it (or [`KeepaliveHandle::stop`]) stops
/// the keepalive.
#[derive(Debug)]
pub struct KeepaliveHandle {
    uri: String,
    status: watch::Receiver<KeepaliveStatus>,
    task: tokio::task::JoinHandle<()>,
}

impl KeepaliveHandle {
    /// The alloc's URI.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// The keepalive's status now.
    pub fn status(&self) -> KeepaliveStatus {
        self.status.borrow().clone()
    }

    /// A receiver of the status, to watch it from elsewhere.
    pub fn subscribe(&self) -> watch::Receiver<KeepaliveStatus> {
        self.status.clone()
    }

    /// Waits until the alloc is lost, and says why.
    pub async fn lost(&self) -> LostReason {
        let mut status = self.status.clone();
        let lost = status.wait_for(|s| s.lost.is_some()).await.ok().and_then(|s| s.lost.clone());
        lost.or_else(|| self.status.borrow().lost.clone()).unwrap_or(LostReason::TaskEnded)
    }

    /// Stops keeping the alloc alive (it is not freed).
    pub fn stop(self) {
        self.task.abort();
    }
}

impl Drop for KeepaliveHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Keeps `alloc` alive in a background task until it is lost or the handle is dropped
/// [Reflow `pool.Keepalive`, improved].
///
/// Each round asks for `options.lease` and sleeps until `options.offset` before the granted lease
/// ends, or for half the granted lease when it is not longer than the offset (Reflow busy-looped
/// then). A failed keepalive (transient error or 5xx) is retried with `options.retry` backoff, at
/// most `options.retries` times, and only while the lease lasts: a call's timeout is cut to what
/// is left of the lease, and when the next wait would reach the lease's end the alloc is reported
/// lost at once (Reflow's retries, per-call timeouts included, could run nearly a minute past the
/// lease). Errors that say the alloc is gone stop at once, and so do other refusals. The first
/// keepalive is sent at once. Must be called within a Tokio runtime.
pub fn spawn_keepalive<P: PoolSet + ?Sized + 'static>(
    pools: Arc<P>,
    alloc: &api::Alloc,
    options: KeepaliveOptions,
) -> KeepaliveHandle {
    let lease_ends = later(Instant::now(), Duration::from_millis(alloc.expires_in_ms.unwrap_or(0).max(0) as u64));
    let (sender, status) =
        watch::channel(KeepaliveStatus { lease_ends: Some(lease_ends), ..KeepaliveStatus::default() });
    let uri = alloc.uri.clone();
    let task = tokio::spawn(keep_alive(pools, uri.clone(), lease_ends, options, sender));
    KeepaliveHandle { uri, status, task }
}

async fn keep_alive<P: PoolSet + ?Sized>(
    pools: Arc<P>,
    uri: String,
    mut lease_ends: Instant,
    options: KeepaliveOptions,
    status: watch::Sender<KeepaliveStatus>,
) {
    let pool = split_uri(&uri).map(|(pool, _)| pool.to_owned()).unwrap_or_default();
    let lost = |reason: LostReason| status.send_modify(|s| s.lost = Some(reason));
    loop {
        let mut retry = 0u32;
        let (sent, granted) = loop {
            let sent = Instant::now();
            let left = lease_ends.saturating_duration_since(sent);
            // The first call of a round may revive a lapsed alloc (the daemon allows it until it
            // is reclaimed); retries stay inside the lease.
            let timeout = if left.is_zero() { options.call_timeout } else { options.call_timeout.min(left) };
            status.send_modify(|s| s.calls += 1);
            let error = match tokio::time::timeout(timeout, pools.keepalive_by_uri(&uri, options.lease)).await {
                Ok(Ok(answer)) => break (sent, Duration::from_millis(answer.interval_ms)),
                Ok(Err(err)) if err.is_alloc_gone() => return lost(LostReason::Gone(err)),
                Ok(Err(err)) if !(err.is_retryable() || err.status().is_some_and(|s| s >= 500)) => {
                    return lost(LostReason::Refused(err));
                }
                Ok(Err(err)) => err,
                Err(_) => PoolCallError::Timeout { pool: pool.clone(), timeout },
            };
            if retry >= options.retries {
                return lost(LostReason::GaveUp { tries: retry + 1, lease_ended: false, last_error: error });
            }
            // Retry only if the next try can start before the lease ends.
            let wait = options.retry.wait(retry).max(Duration::from_millis(1));
            if lease_ends.saturating_duration_since(Instant::now()) <= wait {
                return lost(LostReason::GaveUp { tries: retry + 1, lease_ended: true, last_error: error });
            }
            tokio::time::sleep(wait).await;
            retry += 1;
        };
        lease_ends = later(sent, granted);
        status.send_modify(|s| {
            s.renewals += 1;
            s.granted = Some(granted);
            s.lease_ends = Some(lease_ends);
        });
        let pause = if granted > options.offset { granted - options.offset } else { granted / 2 };
        tokio::time::sleep(pause.max(Duration::from_millis(1))).await;
    }
}
