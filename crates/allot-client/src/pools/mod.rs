//! Client-side pool machinery [Reflow `pool`: `Mux`, `CachingPool`, `Allocate`, `Keepalive`],
//! minus Reflow's bugs.
//!
//! - [`PoolSource`]: one pool that can be asked for offers, whose offers can be accepted and whose
//!   allocs can be inspected, kept alive and freed. [`DaemonPool`] is one pool on one daemon.
//! - [`Mux`]: many pools, on one daemon or several, addressed by alloc URIs `pool/alloc`.
//!   [`Mux::offers`] asks every pool at once (at most [`DEFAULT_MUX_CONCURRENCY`] at a time) and
//!   answers by its deadline with the offers it got **and** the pools that failed or did not answer
//!   in time ([`OfferReport`]); nothing is dropped silently and stragglers are not waited for.
//! - [`CachingPool`]: serves a pool's offers from a cache with a time to live, tracks what was
//!   taken from (and given back to) a cached offer, refuses locally what the tracked offer cannot
//!   hold, refreshes after the daemon says an offer expired, but not after a transient error, and
//!   shares one refresh among concurrent callers. [`Mux::with_caching`] keeps one per pool name.
//! - [`allocate`]: picks offers best-fit first and accepts one, retrying with backoff
//!   ([`pick_n`] is the order, [`amount_to_take`] the whole-offer rule).
//! - [`spawn_keepalive`]: keeps one alloc alive in the background and says when it is lost.
//!
//! [`PoolSet`] is what [`allocate`] and [`spawn_keepalive`] work on: a [`Mux`] or any single
//! [`PoolSource`].
//!
//! Modules: `calls` (the pools' routes as [`Client`](crate::Client) methods), `source`, `mux`,
//! `caching`, `allocate`, `keepalive`; this one holds their errors, offers and requests.

mod allocate;
mod caching;
mod calls;
mod keepalive;
mod mux;
mod source;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use allot_api as api;
use tokio::time::Instant;

use crate::ClientError;

pub use allocate::{allocate, amount_to_take, pick_n, AllocateError, AllocateOptions, Backoff, TryReport};
pub use allot_core::{Resources, SizeWeights};
pub use caching::{CacheSnapshot, CachedOffer, CachingPool};
pub use keepalive::{spawn_keepalive, KeepaliveHandle, KeepaliveOptions, KeepaliveStatus, LostReason};
pub use mux::Mux;
pub use source::{DaemonPool, PoolSet, PoolSource};

/// How many pools [`Mux::offers`] asks at the same time by default.
pub const DEFAULT_MUX_CONCURRENCY: usize = 64;
/// How long [`allocate`] waits for offers by default [Reflow `offersTimeout`].
pub const DEFAULT_OFFERS_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Errors

/// Why a pool operation failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum PoolCallError {
    /// The offer cannot give what was asked: the room is gone; try another offer. `local` is
    /// true when a [`CachingPool`] refused it from its tracked offer without asking the daemon.
    #[error("offer_expired: offer {pool}/{offer}{}: {detail}", if *.local { " (refused by the client's cache)" } else { "" })]
    OfferExpired { pool: String, offer: String, local: bool, detail: String },
    /// An alloc URI without a `/`, or with an empty pool or alloc part.
    #[error("invalid alloc URI `{uri}`: expected `pool/alloc`")]
    InvalidUri { uri: String },
    /// The mux (or the single pool) has no pool of this name.
    #[error("pool_not_found: no pool `{pool}` here")]
    UnknownPool { pool: String },
    /// A pool name that cannot be part of a URI (empty or with a `/`).
    #[error("invalid pool name `{pool}`: it must be non-empty and without `/`")]
    InvalidPoolName { pool: String },
    /// Two pools of the same name in one mux.
    #[error("pool `{pool}` is in the mux twice")]
    DuplicatePool { pool: String },
    /// The daemon refused the call, or could not be reached.
    #[error("pool {pool}: {source}")]
    Daemon { pool: String, source: Arc<ClientError> },
    /// No answer within the time allowed (a mux deadline or a keepalive call timeout).
    #[error("pool {pool}: no answer within {timeout:?}")]
    Timeout { pool: String, timeout: Duration },
    /// The daemon answered something this client cannot read.
    #[error("pool {pool}: unreadable answer: {detail}")]
    BadAnswer { pool: String, detail: String },
    /// The task asking the pool panicked.
    #[error("pool {pool}: the call panicked: {detail}")]
    Panicked { pool: String, detail: String },
}

impl PoolCallError {
    /// Wraps a daemon call's error; the daemon's `offer_expired` becomes [`PoolCallError::OfferExpired`].
    pub fn from_client(pool: &str, offer: Option<&str>, err: ClientError) -> PoolCallError {
        if err.code() == Some("offer_expired") {
            let detail = match &err {
                ClientError::Api { message, .. } => message.clone(),
                other => other.to_string(),
            };
            let offer = offer.unwrap_or("?").to_owned();
            return PoolCallError::OfferExpired { pool: pool.to_owned(), offer, local: false, detail };
        }
        PoolCallError::Daemon { pool: pool.to_owned(), source: Arc::new(err) }
    }

    /// The pool the error is about, if any.
    pub fn pool(&self) -> Option<&str> {
        match self {
            PoolCallError::OfferExpired { pool, .. }
            | PoolCallError::UnknownPool { pool }
            | PoolCallError::InvalidPoolName { pool }
            | PoolCallError::DuplicatePool { pool }
            | PoolCallError::Daemon { pool, .. }
            | PoolCallError::Timeout { pool, .. }
            | PoolCallError::BadAnswer { pool, .. }
            | PoolCallError::Panicked { pool, .. } => Some(pool),
            PoolCallError::InvalidUri { .. } => None,
        }
    }

    /// The stable error code: the daemon's (e.g. `alloc_ended`), `offer_expired` for
    /// [`PoolCallError::OfferExpired`], `pool_not_found` for [`PoolCallError::UnknownPool`].
    pub fn code(&self) -> Option<&str> {
        match self {
            PoolCallError::OfferExpired { .. } => Some("offer_expired"),
            PoolCallError::UnknownPool { .. } => Some("pool_not_found"),
            PoolCallError::Daemon { source, .. } => source.code(),
            _ => None,
        }
    }

    /// The HTTP status of the daemon's refusal.
    pub fn status(&self) -> Option<u16> {
        match self {
            PoolCallError::Daemon { source, .. } => source.status(),
            PoolCallError::OfferExpired { local: false, .. } => Some(409),
            _ => None,
        }
    }

    pub fn is_offer_expired(&self) -> bool {
        matches!(self, PoolCallError::OfferExpired { .. })
    }

    /// The pool is not in this mux, or the daemon does not know it.
    pub fn is_pool_not_found(&self) -> bool {
        self.code() == Some("pool_not_found")
    }

    /// True when repeating the call may succeed: the daemon could not be reached, did not answer
    /// in time, or answered 503 ([`ClientError::is_retryable`]).
    pub fn is_retryable(&self) -> bool {
        match self {
            PoolCallError::Daemon { source, .. } => source.is_retryable(),
            PoolCallError::Timeout { .. } => true,
            _ => false,
        }
    }

    /// True when the offer cannot be accepted any more but another offer may be: the room is
    /// gone (`offer_expired`), the pool stopped (`pool_stopped`), is gone (`pool_not_found`) or
    /// is too small for the request whatever is free (`exceeds_capacity`).
    pub fn is_offer_gone(&self) -> bool {
        matches!(self.code(), Some("offer_expired" | "pool_stopped" | "pool_not_found" | "exceeds_capacity"))
    }

    /// True when the alloc will not come back: it ended (`alloc_ended`), is unknown
    /// (`alloc_not_found`), its pool is gone (`pool_not_found`, or not in the mux), or its URI is
    /// not an alloc URI. A keepalive loop stops at once on these.
    pub fn is_alloc_gone(&self) -> bool {
        matches!(self, PoolCallError::InvalidUri { .. })
            || matches!(self.code(), Some("alloc_ended" | "alloc_not_found" | "pool_not_found"))
    }
}

/// Splits an alloc URI `pool/alloc` at its first `/`.
pub fn split_uri(uri: &str) -> Result<(&str, &str), PoolCallError> {
    match uri.split_once('/') {
        Some((pool, alloc)) if !pool.is_empty() && !alloc.is_empty() => Ok((pool, alloc)),
        _ => Err(PoolCallError::InvalidUri { uri: uri.to_owned() }),
    }
}

fn check_pool_name(name: &str) -> Result<(), PoolCallError> {
    if name.is_empty() || name.contains('/') {
        return Err(PoolCallError::InvalidPoolName { pool: name.to_owned() });
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Offers and requests

/// An offer of one pool: `available` is what it holds (for an offer from a [`CachingPool`], what
/// is left of it by the client's tracking).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolOffer {
    pub pool: String,
    /// The offer's id within its pool (the daemon's offers are `1`).
    pub id: String,
    pub available: Resources,
}

impl PoolOffer {
    pub fn new(pool: impl Into<String>, id: impl Into<String>, available: Resources) -> PoolOffer {
        PoolOffer { pool: pool.into(), id: id.into(), available }
    }

    /// `pool/offer`.
    pub fn uri(&self) -> String {
        format!("{}/{}", self.pool, self.id)
    }
}

/// What an alloc needs: at least `min`, up to `max` when free (`None`: exactly `min`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllocNeed {
    pub min: Resources,
    pub max: Option<Resources>,
    pub owner: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// The owner's free-form metadata (a JSON object, at most 16 KiB).
    pub metadata: Option<serde_json::Value>,
}

impl AllocNeed {
    pub fn new(min: Resources) -> AllocNeed {
        AllocNeed { min, ..AllocNeed::default() }
    }

    #[must_use]
    pub fn with_max(mut self, max: Resources) -> AllocNeed {
        self.max = Some(max);
        self
    }

    #[must_use]
    pub fn with_owner(mut self, owner: impl Into<String>) -> AllocNeed {
        self.owner = Some(owner.into());
        self
    }

    #[must_use]
    pub fn with_label(mut self, key: impl Into<String>, value: impl Into<String>) -> AllocNeed {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// The owner's metadata: a JSON object, shown with the alloc (API, watch, dashboard).
    #[must_use]
    pub fn with_metadata(mut self, metadata: serde_json::Value) -> AllocNeed {
        self.metadata = Some(metadata);
        self
    }

    /// The most to take, as the daemon reads it: `max` raised to `min` per resource, or `min`
    /// when there is no `max`.
    pub fn max_or_min(&self) -> Resources {
        match &self.max {
            Some(max) => max.max(&self.min),
            None => self.min.clone(),
        }
    }

    /// The wire form.
    pub fn to_accept(&self) -> api::Accept {
        api::Accept {
            min: self.min.to_string(),
            max: self.max.as_ref().map(Resources::to_string),
            owner: self.owner.clone(),
            labels: self.labels.clone(),
            metadata: self.metadata.clone(),
        }
    }
}

/// The resources of an alloc, read from its text form.
pub fn alloc_resources(alloc: &api::Alloc) -> Result<Resources, PoolCallError> {
    alloc.resources.parse().map_err(|err| PoolCallError::BadAnswer {
        pool: alloc.pool.clone(),
        detail: format!("alloc resources `{}`: {err}", alloc.resources),
    })
}

/// A pool that failed to answer [`Mux::offers`].
#[derive(Debug, Clone)]
pub struct PoolFailure {
    pub pool: String,
    pub error: PoolCallError,
}

/// What [`Mux::allocs`] got: the live allocs of the pools that answered, and which pools
/// failed or did not answer by the deadline.
#[derive(Debug, Clone, Default)]
pub struct AllocReport {
    pub allocs: Vec<api::Alloc>,
    /// How many pools were asked.
    pub asked: usize,
    pub failed: Vec<PoolFailure>,
    /// The pools that had not answered by the deadline (in name order).
    pub timed_out: Vec<String>,
}

impl AllocReport {
    /// True when every pool answered.
    pub fn is_complete(&self) -> bool {
        self.failed.is_empty() && self.timed_out.is_empty()
    }
}

/// What [`Mux::offers`] (or [`PoolSet::offers_within`]) got: the offers, and which pools failed
/// or did not answer by the deadline.
#[derive(Debug, Clone, Default)]
pub struct OfferReport {
    pub offers: Vec<PoolOffer>,
    /// How many pools were asked.
    pub asked: usize,
    pub failed: Vec<PoolFailure>,
    /// The pools that had not answered by the deadline (abandoned, in name order).
    pub timed_out: Vec<String>,
}

impl OfferReport {
    /// True when every pool answered.
    pub fn is_complete(&self) -> bool {
        self.failed.is_empty() && self.timed_out.is_empty()
    }
}

impl fmt::Display for OfferReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} offers from {} pools", self.offers.len(), self.asked)?;
        if !self.failed.is_empty() {
            write!(f, "; {} failed (", self.failed.len())?;
            for (i, failure) in self.failed.iter().take(3).enumerate() {
                if i > 0 {
                    f.write_str("; ")?;
                }
                write!(f, "{}", failure.error)?;
            }
            if self.failed.len() > 3 {
                f.write_str("; ...")?;
            }
            f.write_str(")")?;
        }
        if !self.timed_out.is_empty() {
            write!(f, "; {} timed out", self.timed_out.len())?;
        }
        Ok(())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `at + duration`, without overflowing for a huge duration (which then means "never").
fn later(at: Instant, duration: Duration) -> Instant {
    const NEVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    at.checked_add(duration.min(NEVER)).unwrap_or(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_split_at_the_first_slash() {
        assert_eq!(split_uri("pool/0123456789abcdef").unwrap(), ("pool", "0123456789abcdef"));
        assert_eq!(split_uri("pool/a/b").unwrap(), ("pool", "a/b"));
        for bad in ["pool", "/alloc", "pool/", ""] {
            assert!(matches!(split_uri(bad), Err(PoolCallError::InvalidUri { .. })), "{bad}");
        }
    }

    #[test]
    fn backoff_grows_caps_and_jitters_downwards() {
        let backoff =
            Backoff { initial: Duration::from_secs(2), factor: 1.5, max: Duration::from_secs(30), jitter: 0.2 };
        let nominal: Vec<f64> = (0..5).map(|k| backoff.nominal(k).as_secs_f64()).collect();
        assert_eq!(nominal, [2.0, 3.0, 4.5, 6.75, 10.125], "Reflow's keepalive waits");
        assert_eq!(backoff.nominal(20), Duration::from_secs(30));
        for k in 0..5 {
            let wait = backoff.wait(k);
            assert!(wait <= backoff.nominal(k) && wait >= backoff.nominal(k).mul_f64(0.8), "{wait:?}");
        }
    }

    #[test]
    fn error_classes() {
        let api = |status: u16, code: &str| PoolCallError::Daemon {
            pool: "p".into(),
            source: Arc::new(ClientError::Api { status, code: code.into(), message: String::new() }),
        };
        let expired = PoolCallError::from_client(
            "p",
            Some("1"),
            ClientError::Api { status: 409, code: "offer_expired".into(), message: "gone".into() },
        );
        assert!(matches!(expired, PoolCallError::OfferExpired { local: false, .. }) && expired.is_offer_gone());
        assert!(api(409, "pool_stopped").is_offer_gone() && !api(409, "pool_stopped").is_alloc_gone());
        for code in ["alloc_ended", "alloc_not_found", "pool_not_found"] {
            assert!(api(409, code).is_alloc_gone(), "{code}");
        }
        assert!(PoolCallError::UnknownPool { pool: "p".into() }.is_alloc_gone());
        assert!(api(503, "store_unavailable").is_retryable() && !api(503, "store_unavailable").is_alloc_gone());
        assert!(!api(400, "invalid_argument").is_retryable());
    }
}
