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

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

use allot_api as api;
use async_trait::async_trait;
use rand::seq::SliceRandom;
use rand::Rng;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::{Client, ClientError};

pub use allot_core::{Resources, SizeWeights};

/// How many pools [`Mux::offers`] asks at the same time by default.
pub const DEFAULT_MUX_CONCURRENCY: usize = 64;
/// How long [`allocate`] waits for offers by default [Reflow `offersTimeout`].
pub const DEFAULT_OFFERS_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Errors

/// Why a pool operation failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
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

impl PoolError {
    /// Wraps a daemon call's error; the daemon's `offer_expired` becomes [`PoolError::OfferExpired`].
    pub fn from_client(pool: &str, offer: Option<&str>, err: ClientError) -> PoolError {
        if err.code() == Some("offer_expired") {
            let detail = match &err {
                ClientError::Api { message, .. } => message.clone(),
                other => other.to_string(),
            };
            let offer = offer.unwrap_or("?").to_owned();
            return PoolError::OfferExpired { pool: pool.to_owned(), offer, local: false, detail };
        }
        PoolError::Daemon { pool: pool.to_owned(), source: Arc::new(err) }
    }

    /// The pool the error is about, if any.
    pub fn pool(&self) -> Option<&str> {
        match self {
            PoolError::OfferExpired { pool, .. }
            | PoolError::UnknownPool { pool }
            | PoolError::InvalidPoolName { pool }
            | PoolError::DuplicatePool { pool }
            | PoolError::Daemon { pool, .. }
            | PoolError::Timeout { pool, .. }
            | PoolError::BadAnswer { pool, .. }
            | PoolError::Panicked { pool, .. } => Some(pool),
            PoolError::InvalidUri { .. } => None,
        }
    }

    /// The stable error code: the daemon's (e.g. `alloc_ended`), `offer_expired` for
    /// [`PoolError::OfferExpired`], `pool_not_found` for [`PoolError::UnknownPool`].
    pub fn code(&self) -> Option<&str> {
        match self {
            PoolError::OfferExpired { .. } => Some("offer_expired"),
            PoolError::UnknownPool { .. } => Some("pool_not_found"),
            PoolError::Daemon { source, .. } => source.code(),
            _ => None,
        }
    }

    /// The HTTP status of the daemon's refusal.
    pub fn status(&self) -> Option<u16> {
        match self {
            PoolError::Daemon { source, .. } => source.status(),
            PoolError::OfferExpired { local: false, .. } => Some(409),
            _ => None,
        }
    }

    pub fn is_offer_expired(&self) -> bool {
        matches!(self, PoolError::OfferExpired { .. })
    }

    /// The pool is not in this mux, or the daemon does not know it.
    pub fn is_pool_not_found(&self) -> bool {
        self.code() == Some("pool_not_found")
    }

    /// True when repeating the call may succeed: the daemon could not be reached, did not answer
    /// in time, or answered 503 ([`ClientError::is_retryable`]).
    pub fn is_retryable(&self) -> bool {
        match self {
            PoolError::Daemon { source, .. } => source.is_retryable(),
            PoolError::Timeout { .. } => true,
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
        matches!(self, PoolError::InvalidUri { .. })
            || matches!(self.code(), Some("alloc_ended" | "alloc_not_found" | "pool_not_found"))
    }
}

/// Splits an alloc URI `pool/alloc` at its first `/`.
pub fn split_uri(uri: &str) -> Result<(&str, &str), PoolError> {
    match uri.split_once('/') {
        Some((pool, alloc)) if !pool.is_empty() && !alloc.is_empty() => Ok((pool, alloc)),
        _ => Err(PoolError::InvalidUri { uri: uri.to_owned() }),
    }
}

fn check_pool_name(name: &str) -> Result<(), PoolError> {
    if name.is_empty() || name.contains('/') {
        return Err(PoolError::InvalidPoolName { pool: name.to_owned() });
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
pub struct AllocRequest {
    pub min: Resources,
    pub max: Option<Resources>,
    pub owner: Option<String>,
    pub labels: BTreeMap<String, String>,
}

impl AllocRequest {
    pub fn new(min: Resources) -> AllocRequest {
        AllocRequest { min, ..AllocRequest::default() }
    }

    #[must_use]
    pub fn with_max(mut self, max: Resources) -> AllocRequest {
        self.max = Some(max);
        self
    }

    #[must_use]
    pub fn with_owner(mut self, owner: impl Into<String>) -> AllocRequest {
        self.owner = Some(owner.into());
        self
    }

    #[must_use]
    pub fn with_label(mut self, key: impl Into<String>, value: impl Into<String>) -> AllocRequest {
        self.labels.insert(key.into(), value.into());
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
        }
    }
}

/// The resources of an alloc, read from its text form.
pub fn alloc_resources(alloc: &api::Alloc) -> Result<Resources, PoolError> {
    alloc.resources.parse().map_err(|err| PoolError::BadAnswer {
        pool: alloc.pool.clone(),
        detail: format!("alloc resources `{}`: {err}", alloc.resources),
    })
}

/// A pool that failed to answer [`Mux::offers`].
#[derive(Debug, Clone)]
pub struct PoolFailure {
    pub pool: String,
    pub error: PoolError,
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

// ---------------------------------------------------------------------------------------------
// Pool sources

/// One pool: its offers, accepting them, and its allocs (addressed by their id within the pool).
#[async_trait]
pub trait PoolSource: Send + Sync {
    /// The pool's name: the first part of its allocs' URIs. Never contains `/`.
    fn name(&self) -> &str;

    /// The pool's offers now.
    async fn offers(&self) -> Result<Vec<PoolOffer>, PoolError>;

    /// Accepts offer `offer` (an id from [`PoolSource::offers`]) with `request`.
    async fn accept(&self, offer: &str, request: &AllocRequest) -> Result<api::Alloc, PoolError>;

    /// Inspects alloc `alloc` (its id within the pool), live or ended.
    async fn alloc(&self, alloc: &str) -> Result<api::Alloc, PoolError>;

    /// Renews the lease of `alloc`, asking for `interval`; answers the interval granted.
    async fn keepalive(&self, alloc: &str, interval: Duration) -> Result<api::AllocKeepaliveResponse, PoolError>;

    /// Frees `alloc`.
    async fn free(&self, alloc: &str) -> Result<api::Alloc, PoolError>;
}

#[async_trait]
impl<T: PoolSource + ?Sized> PoolSource for Arc<T> {
    fn name(&self) -> &str {
        (**self).name()
    }

    async fn offers(&self) -> Result<Vec<PoolOffer>, PoolError> {
        (**self).offers().await
    }

    async fn accept(&self, offer: &str, request: &AllocRequest) -> Result<api::Alloc, PoolError> {
        (**self).accept(offer, request).await
    }

    async fn alloc(&self, alloc: &str) -> Result<api::Alloc, PoolError> {
        (**self).alloc(alloc).await
    }

    async fn keepalive(&self, alloc: &str, interval: Duration) -> Result<api::AllocKeepaliveResponse, PoolError> {
        (**self).keepalive(alloc, interval).await
    }

    async fn free(&self, alloc: &str) -> Result<api::Alloc, PoolError> {
        (**self).free(alloc).await
    }
}

/// One pool on one daemon.
#[derive(Debug, Clone)]
pub struct DaemonPool {
    client: Client,
    name: String,
}

impl DaemonPool {
    /// Pool `name` on the daemon of `client`. Fails if the name is empty or has a `/`.
    pub fn new(client: Client, name: impl Into<String>) -> Result<DaemonPool, PoolError> {
        let name = name.into();
        check_pool_name(&name)?;
        Ok(DaemonPool { client, name })
    }

    /// Every pool the daemon of `client` has now.
    pub async fn all(client: &Client) -> Result<Vec<DaemonPool>, ClientError> {
        let list = client.pools().await?;
        Ok(list.pools.into_iter().map(|pool| DaemonPool { client: client.clone(), name: pool.name }).collect())
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    fn error(&self, err: ClientError) -> PoolError {
        PoolError::from_client(&self.name, None, err)
    }
}

#[async_trait]
impl PoolSource for DaemonPool {
    fn name(&self) -> &str {
        &self.name
    }

    async fn offers(&self) -> Result<Vec<PoolOffer>, PoolError> {
        let list = self.client.offers(&self.name).await.map_err(|err| self.error(err))?;
        list.offers
            .into_iter()
            .map(|offer| {
                let available = offer.available.parse().map_err(|err| PoolError::BadAnswer {
                    pool: self.name.clone(),
                    detail: format!("offer {} available `{}`: {err}", offer.id, offer.available),
                })?;
                Ok(PoolOffer { pool: self.name.clone(), id: offer.id, available })
            })
            .collect()
    }

    async fn accept(&self, offer: &str, request: &AllocRequest) -> Result<api::Alloc, PoolError> {
        self.client
            .accept(&self.name, offer, &request.to_accept())
            .await
            .map_err(|err| PoolError::from_client(&self.name, Some(offer), err))
    }

    async fn alloc(&self, alloc: &str) -> Result<api::Alloc, PoolError> {
        self.client.alloc(&self.name, alloc).await.map_err(|err| self.error(err))
    }

    async fn keepalive(&self, alloc: &str, interval: Duration) -> Result<api::AllocKeepaliveResponse, PoolError> {
        self.client.keepalive_alloc(&self.name, alloc, interval).await.map_err(|err| self.error(err))
    }

    async fn free(&self, alloc: &str) -> Result<api::Alloc, PoolError> {
        self.client.free_alloc(&self.name, alloc).await.map_err(|err| self.error(err))
    }
}

// ---------------------------------------------------------------------------------------------
// PoolSet: what `allocate` and `spawn_keepalive` work on

/// A set of pools addressed by alloc URIs `pool/alloc`: a [`Mux`], or any single [`PoolSource`]
/// (a set of one).
#[async_trait]
pub trait PoolSet: Send + Sync {
    /// The offers of every pool, waiting at most `timeout`; failures and stragglers are reported.
    async fn offers_within(&self, timeout: Duration) -> OfferReport;

    /// Accepts `offer` (routed by its pool).
    async fn accept_offer(&self, offer: &PoolOffer, request: &AllocRequest) -> Result<api::Alloc, PoolError>;

    async fn alloc_by_uri(&self, uri: &str) -> Result<api::Alloc, PoolError>;

    async fn keepalive_by_uri(&self, uri: &str, interval: Duration) -> Result<api::AllocKeepaliveResponse, PoolError>;

    async fn free_by_uri(&self, uri: &str) -> Result<api::Alloc, PoolError>;
}

/// The alloc id of `uri` if its pool part names `pool`.
fn alloc_of<'a, P: PoolSource + ?Sized>(pool: &P, uri: &'a str) -> Result<&'a str, PoolError> {
    let (name, alloc) = split_uri(uri)?;
    if name != pool.name() {
        return Err(PoolError::UnknownPool { pool: name.to_owned() });
    }
    Ok(alloc)
}

#[async_trait]
impl<T: PoolSource + ?Sized> PoolSet for T {
    async fn offers_within(&self, timeout: Duration) -> OfferReport {
        let mut report = OfferReport { asked: 1, ..OfferReport::default() };
        match tokio::time::timeout(timeout, self.offers()).await {
            Ok(Ok(offers)) => report.offers = offers,
            Ok(Err(error)) => report.failed.push(PoolFailure { pool: self.name().to_owned(), error }),
            Err(_) => report.timed_out.push(self.name().to_owned()),
        }
        report
    }

    async fn accept_offer(&self, offer: &PoolOffer, request: &AllocRequest) -> Result<api::Alloc, PoolError> {
        if offer.pool != self.name() {
            return Err(PoolError::UnknownPool { pool: offer.pool.clone() });
        }
        self.accept(&offer.id, request).await
    }

    async fn alloc_by_uri(&self, uri: &str) -> Result<api::Alloc, PoolError> {
        self.alloc(alloc_of(self, uri)?).await
    }

    async fn keepalive_by_uri(&self, uri: &str, interval: Duration) -> Result<api::AllocKeepaliveResponse, PoolError> {
        self.keepalive(alloc_of(self, uri)?, interval).await
    }

    async fn free_by_uri(&self, uri: &str) -> Result<api::Alloc, PoolError> {
        self.free(alloc_of(self, uri)?).await
    }
}

// ---------------------------------------------------------------------------------------------
// Mux

type PoolMap = BTreeMap<String, Arc<dyn PoolSource>>;

/// Many pools, on one daemon or several, each known by its name (unique in the mux).
///
/// With caching ([`Mux::with_caching`]) every pool is served through a [`CachingPool`]; the caches
/// are kept per pool name, so [`Mux::set_pools`] with the same names keeps them [Reflow re-wrapped
/// every pool on every refresh, throwing the caches away].
pub struct Mux {
    pools: RwLock<Arc<PoolMap>>,
    /// Serialises changes to the pool set; the caches by pool name when caching is on.
    caches: Mutex<HashMap<String, CachingPool>>,
    caching: Option<Duration>,
    concurrency: usize,
}

impl Default for Mux {
    fn default() -> Mux {
        Mux::new()
    }
}

impl fmt::Debug for Mux {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mux")
            .field("pools", &self.pool_names())
            .field("caching", &self.caching)
            .field("concurrency", &self.concurrency)
            .finish()
    }
}

impl Mux {
    /// An empty mux without caching.
    pub fn new() -> Mux {
        Mux {
            pools: RwLock::new(Arc::new(PoolMap::new())),
            caches: Mutex::new(HashMap::new()),
            caching: None,
            concurrency: DEFAULT_MUX_CONCURRENCY,
        }
    }

    /// An empty mux that serves every pool through a [`CachingPool`] whose offers live `ttl`.
    pub fn with_caching(ttl: Duration) -> Mux {
        Mux { caching: Some(ttl), ..Mux::new() }
    }

    /// Sets how many pools [`Mux::offers`] asks at the same time (at least 1).
    #[must_use]
    pub fn with_concurrency(mut self, concurrency: usize) -> Mux {
        self.concurrency = concurrency.max(1);
        self
    }

    /// The cache time to live, when caching is on.
    pub fn caching(&self) -> Option<Duration> {
        self.caching
    }

    /// Replaces the set of pools. With caching, a pool whose name was already in the mux keeps
    /// its cache (now in front of the new source); the caches of pools no longer there are dropped.
    pub fn set_pools(&self, pools: impl IntoIterator<Item = Arc<dyn PoolSource>>) -> Result<(), PoolError> {
        let mut caches = lock(&self.caches);
        let mut map = PoolMap::new();
        let mut new_caches = HashMap::new();
        for pool in pools {
            let name = pool.name().to_owned();
            check_pool_name(&name)?;
            if map.contains_key(&name) {
                return Err(PoolError::DuplicatePool { pool: name });
            }
            let pool = self.wrap(&caches, pool, &mut new_caches);
            map.insert(name, pool);
        }
        *caches = new_caches;
        *self.pools.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(map);
        Ok(())
    }

    /// Adds one pool; its name must not be in the mux yet.
    pub fn add_pool(&self, pool: Arc<dyn PoolSource>) -> Result<(), PoolError> {
        let mut caches = lock(&self.caches);
        let name = pool.name().to_owned();
        check_pool_name(&name)?;
        let mut map = PoolMap::clone(&self.snapshot());
        if map.contains_key(&name) {
            return Err(PoolError::DuplicatePool { pool: name });
        }
        let mut added = HashMap::new();
        let pool = self.wrap(&caches, pool, &mut added);
        caches.extend(added);
        map.insert(name, pool);
        *self.pools.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(map);
        Ok(())
    }

    /// Adds every pool the daemon of `client` has now; answers how many.
    pub async fn add_daemon(&self, client: &Client) -> Result<usize, PoolError> {
        let pools =
            DaemonPool::all(client).await.map_err(|err| PoolError::from_client(client.base_url(), None, err))?;
        let count = pools.len();
        for pool in pools {
            self.add_pool(Arc::new(pool))?;
        }
        Ok(count)
    }

    /// Removes a pool (and its cache); answers whether it was there.
    pub fn remove_pool(&self, name: &str) -> bool {
        let mut caches = lock(&self.caches);
        let mut map = PoolMap::clone(&self.snapshot());
        let removed = map.remove(name).is_some();
        caches.remove(name);
        *self.pools.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(map);
        removed
    }

    /// With caching, `pool` behind its cache (the existing one of its name, if any).
    fn wrap(
        &self,
        existing: &HashMap<String, CachingPool>,
        pool: Arc<dyn PoolSource>,
        new_caches: &mut HashMap<String, CachingPool>,
    ) -> Arc<dyn PoolSource> {
        let Some(ttl) = self.caching else { return pool };
        let name = pool.name().to_owned();
        let caching = match existing.get(&name) {
            Some(old) => CachingPool { source: pool, cache: old.cache.clone() },
            None => CachingPool::new(pool, ttl),
        };
        new_caches.insert(name, caching.clone());
        Arc::new(caching)
    }

    fn snapshot(&self) -> Arc<PoolMap> {
        self.pools.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The pool of this name (behind its cache, with caching on).
    pub fn pool(&self, name: &str) -> Option<Arc<dyn PoolSource>> {
        self.snapshot().get(name).cloned()
    }

    /// The cache of this pool, with caching on.
    pub fn caching_pool(&self, name: &str) -> Option<CachingPool> {
        lock(&self.caches).get(name).cloned()
    }

    /// The pools' names, in order.
    pub fn pool_names(&self) -> Vec<String> {
        self.snapshot().keys().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.snapshot().len()
    }

    pub fn is_empty(&self) -> bool {
        self.snapshot().is_empty()
    }

    fn route(&self, pool: &str) -> Result<Arc<dyn PoolSource>, PoolError> {
        self.pool(pool).ok_or_else(|| PoolError::UnknownPool { pool: pool.to_owned() })
    }

    /// Asks every pool for its offers, at most [`Mux::with_concurrency`] at a time, and answers
    /// by `timeout` with what it got: the offers, the pools that failed (with their error) and
    /// those that had not answered (abandoned, their calls cancelled).
    pub async fn offers(&self, timeout: Duration) -> OfferReport {
        let pools = self.snapshot();
        let deadline = later(Instant::now(), timeout);
        let permits = Arc::new(Semaphore::new(self.concurrency));
        let mut tasks = JoinSet::new();
        let mut pending = HashMap::with_capacity(pools.len());
        for (name, pool) in pools.iter() {
            let (pool, permits) = (pool.clone(), permits.clone());
            let handle = tasks.spawn(async move {
                let _permit = permits.acquire_owned().await;
                pool.offers().await
            });
            pending.insert(handle.id(), name.clone());
        }
        let mut report = OfferReport { asked: pools.len(), ..OfferReport::default() };
        while let Ok(Some(joined)) = tokio::time::timeout_at(deadline, tasks.join_next_with_id()).await {
            match joined {
                Ok((id, result)) => {
                    let pool = pending.remove(&id).unwrap_or_default();
                    match result {
                        Ok(offers) => report.offers.extend(offers),
                        Err(error) => report.failed.push(PoolFailure { pool, error }),
                    }
                }
                Err(err) => {
                    let pool = pending.remove(&err.id()).unwrap_or_default();
                    let error = PoolError::Panicked { pool: pool.clone(), detail: err.to_string() };
                    report.failed.push(PoolFailure { pool, error });
                }
            }
        }
        // Stragglers are abandoned: dropping the set cancels their calls.
        tasks.abort_all();
        let mut timed_out: Vec<String> = pending.into_values().collect();
        timed_out.sort();
        report.timed_out = timed_out;
        report.failed.sort_by(|a, b| a.pool.cmp(&b.pool));
        report
    }

    /// Accepts `offer` in its pool.
    pub async fn accept(&self, offer: &PoolOffer, request: &AllocRequest) -> Result<api::Alloc, PoolError> {
        self.route(&offer.pool)?.accept(&offer.id, request).await
    }

    /// Inspects the alloc at `uri` (`pool/alloc`).
    pub async fn alloc(&self, uri: &str) -> Result<api::Alloc, PoolError> {
        let (pool, alloc) = split_uri(uri)?;
        self.route(pool)?.alloc(alloc).await
    }

    /// Renews the lease of the alloc at `uri` (`pool/alloc`).
    pub async fn keepalive(&self, uri: &str, interval: Duration) -> Result<api::AllocKeepaliveResponse, PoolError> {
        let (pool, alloc) = split_uri(uri)?;
        self.route(pool)?.keepalive(alloc, interval).await
    }

    /// Frees the alloc at `uri` (`pool/alloc`).
    pub async fn free(&self, uri: &str) -> Result<api::Alloc, PoolError> {
        let (pool, alloc) = split_uri(uri)?;
        self.route(pool)?.free(alloc).await
    }
}

#[async_trait]
impl PoolSet for Mux {
    async fn offers_within(&self, timeout: Duration) -> OfferReport {
        self.offers(timeout).await
    }

    async fn accept_offer(&self, offer: &PoolOffer, request: &AllocRequest) -> Result<api::Alloc, PoolError> {
        self.accept(offer, request).await
    }

    async fn alloc_by_uri(&self, uri: &str) -> Result<api::Alloc, PoolError> {
        self.alloc(uri).await
    }

    async fn keepalive_by_uri(&self, uri: &str, interval: Duration) -> Result<api::AllocKeepaliveResponse, PoolError> {
        self.keepalive(uri, interval).await
    }

    async fn free_by_uri(&self, uri: &str) -> Result<api::Alloc, PoolError> {
        self.free(uri).await
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

// ---------------------------------------------------------------------------------------------
// CachingPool

/// One pool's offers served from a cache [Reflow `CachingPool`], with these rules:
///
/// - the cached offers live `ttl` from the moment they were asked for, whether or not they are
///   empty (Reflow expired only an empty cache); an empty answer is cached too;
/// - each cached offer is *tracked*: an accept through the cache reserves what it may get
///   (`max` capped by what is left, else `min`) before it is sent, and once granted the offer
///   keeps `left - granted`; freeing an alloc through the cache gives its resources back;
/// - an accept whose `min` the tracked offer cannot hold fails at once with a local
///   [`PoolError::OfferExpired`], without a call to the daemon;
/// - when the daemon says the offer is gone (`offer_expired`, `pool_stopped`, `pool_not_found`)
///   the offer is marked outdated and the next [`PoolSource::offers`] refreshes; a transient error
///   (connection, timeout, 503) changes nothing but the reservation, which is given back;
/// - no lock is held across a call to the daemon, and concurrent callers that find the cache
///   stale share one refresh (and its error).
///
/// Tracking is per refresh: an accept or free that completes after the cache was refreshed does
/// not touch the new offers (the daemon's answer is newer than the client's arithmetic).
/// Allocs that end by expiry are not given back; the next refresh sees the room.
///
/// Cheap to clone; clones share the cache.
#[derive(Clone)]
pub struct CachingPool {
    source: Arc<dyn PoolSource>,
    cache: Arc<Cache>,
}

struct Cache {
    ttl: Duration,
    state: Mutex<CacheState>,
    /// Held by the one caller refreshing; the others wait for it and share its answer.
    refresh: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct CacheState {
    /// Bumped by every successful refresh.
    generation: u64,
    /// Bumped by every finished refresh, successful or not.
    attempts: u64,
    /// The error of the last finished refresh, if it failed: `(attempt, error)`.
    last_error: Option<(u64, PoolError)>,
    /// When the cached offers were asked for; `None` before the first refresh.
    fetched: Option<Instant>,
    offers: Vec<Tracked>,
    /// The allocs accepted through this cache in the current generation, by alloc id.
    taken: HashMap<String, Taken>,
}

struct Tracked {
    offer: PoolOffer,
    available: Resources,
    outdated: bool,
}

struct Taken {
    offer: String,
    resources: Resources,
}

impl CacheState {
    fn is_fresh(&self, now: Instant, ttl: Duration) -> bool {
        match self.fetched {
            Some(fetched) => now < later(fetched, ttl) && !self.offers.iter().any(|t| t.outdated),
            None => false,
        }
    }

    fn valid_offers(&self) -> Vec<PoolOffer> {
        self.offers
            .iter()
            .filter(|t| !t.outdated && !t.available.is_empty())
            .map(|t| PoolOffer { available: t.available.clone(), ..t.offer.clone() })
            .collect()
    }

    /// The tracked offer `id` if the cache is still at `generation`.
    fn tracked(&mut self, generation: u64, id: &str) -> Option<&mut Tracked> {
        if self.generation != generation {
            return None;
        }
        self.offers.iter_mut().find(|t| t.offer.id == id)
    }
}

/// What a cached offer looks like now, for inspection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedOffer {
    /// The offer as the pool gave it.
    pub offer: PoolOffer,
    /// What is left of it by the client's tracking.
    pub available: Resources,
    /// The daemon said it is gone; the next `offers` refreshes.
    pub outdated: bool,
}

/// The state of a [`CachingPool`], for inspection and tests.
#[derive(Debug, Clone)]
pub struct CacheSnapshot {
    pub offers: Vec<CachedOffer>,
    /// How long ago the cached offers were asked for; `None` before the first refresh.
    pub age: Option<Duration>,
    /// True when `offers` would be answered from the cache now.
    pub fresh: bool,
    /// Finished calls of the underlying `offers` (successful or not).
    pub refreshes: u64,
    /// Successful refreshes.
    pub generation: u64,
    /// Allocs accepted through the cache and not freed through it, in the current generation.
    pub tracked_allocs: usize,
}

/// What an accept through the cache reserved of its tracked offer; given back when dropped
/// unless the accept settled it.
struct Reservation<'a> {
    cache: &'a Cache,
    generation: u64,
    offer: String,
    amount: Resources,
    settled: bool,
}

impl Reservation<'_> {
    /// The accept succeeded: the offer keeps `left + reserved - granted`, and the alloc is tracked.
    fn granted(mut self, alloc: &api::Alloc) {
        self.settled = true;
        // Unreadable resources: keep the reservation as the best guess of what was taken.
        let granted = alloc_resources(alloc).unwrap_or_else(|_| self.amount.clone());
        let mut state = lock(&self.cache.state);
        if let Some(tracked) = state.tracked(self.generation, &self.offer) {
            let restored = tracked.available.checked_add(&self.amount).unwrap_or_else(|| tracked.available.clone());
            tracked.available = restored.saturating_sub(&granted);
            state.taken.insert(alloc.id.clone(), Taken { offer: self.offer.clone(), resources: granted });
        }
    }

    /// The accept failed: give the reservation back, and mark the offer outdated if `outdated`.
    fn failed(mut self, outdated: bool) {
        self.settled = true;
        give_back(self.cache, self.generation, &self.offer, &self.amount, outdated);
    }
}

impl Drop for Reservation<'_> {
    /// The accept was cancelled: its outcome is unknown, so give the reservation back (if the
    /// daemon did grant it, its next `offer_expired` corrects the cache).
    fn drop(&mut self) {
        if !self.settled {
            give_back(self.cache, self.generation, &self.offer, &self.amount, false);
        }
    }
}

fn give_back(cache: &Cache, generation: u64, offer: &str, amount: &Resources, outdated: bool) {
    let mut state = lock(&cache.state);
    if let Some(tracked) = state.tracked(generation, offer) {
        tracked.available = tracked.available.checked_add(amount).unwrap_or_else(|| tracked.available.clone());
        tracked.outdated |= outdated;
    }
}

impl CachingPool {
    /// `source` behind a cache whose offers live `ttl`.
    pub fn new(source: Arc<dyn PoolSource>, ttl: Duration) -> CachingPool {
        let cache = Cache { ttl, state: Mutex::new(CacheState::default()), refresh: tokio::sync::Mutex::new(()) };
        CachingPool { source, cache: Arc::new(cache) }
    }

    pub fn ttl(&self) -> Duration {
        self.cache.ttl
    }

    /// The pool behind the cache.
    pub fn source(&self) -> &Arc<dyn PoolSource> {
        &self.source
    }

    /// Expires the cache: the next `offers` refreshes (accepts still use the tracked offers
    /// until then).
    pub fn invalidate(&self) {
        lock(&self.cache.state).fetched = None;
    }

    /// The cache's state now.
    pub fn snapshot(&self) -> CacheSnapshot {
        let state = lock(&self.cache.state);
        let now = Instant::now();
        CacheSnapshot {
            offers: state
                .offers
                .iter()
                .map(|t| CachedOffer { offer: t.offer.clone(), available: t.available.clone(), outdated: t.outdated })
                .collect(),
            age: state.fetched.map(|fetched| now.saturating_duration_since(fetched)),
            fresh: state.is_fresh(now, self.cache.ttl),
            refreshes: state.attempts,
            generation: state.generation,
            tracked_allocs: state.taken.len(),
        }
    }

    /// Forgets a tracked alloc that the daemon says is gone.
    fn forget_alloc(&self, alloc: &str, result: &Result<impl Sized, PoolError>) {
        if let Err(err) = result {
            if err.is_alloc_gone() {
                lock(&self.cache.state).taken.remove(alloc);
            }
        }
    }
}

impl fmt::Debug for CachingPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachingPool").field("pool", &self.source.name()).field("ttl", &self.cache.ttl).finish()
    }
}

#[async_trait]
impl PoolSource for CachingPool {
    fn name(&self) -> &str {
        self.source.name()
    }

    async fn offers(&self) -> Result<Vec<PoolOffer>, PoolError> {
        let cache = &*self.cache;
        let seen = {
            let state = lock(&cache.state);
            if state.is_fresh(Instant::now(), cache.ttl) {
                return Ok(state.valid_offers());
            }
            state.attempts
        };
        // Single flight: one caller refreshes; whoever waited meanwhile takes its answer. If the
        // refreshing caller is cancelled, the next in line refreshes.
        let _refreshing = cache.refresh.lock().await;
        {
            let state = lock(&cache.state);
            if state.attempts != seen {
                match &state.last_error {
                    Some((attempt, err)) if *attempt == state.attempts => return Err(err.clone()),
                    _ if state.is_fresh(Instant::now(), cache.ttl) => return Ok(state.valid_offers()),
                    _ => {}
                }
            }
        }
        let asked = Instant::now();
        let result = self.source.offers().await;
        let mut state = lock(&cache.state);
        state.attempts += 1;
        match result {
            Ok(offers) => {
                state.generation += 1;
                state.fetched = Some(asked);
                state.last_error = None;
                state.taken.clear();
                state.offers = offers
                    .into_iter()
                    .map(|offer| Tracked { available: offer.available.clone(), offer, outdated: false })
                    .collect();
                Ok(state.valid_offers())
            }
            Err(err) => {
                // The cache stays as it was.
                state.last_error = Some((state.attempts, err.clone()));
                Err(err)
            }
        }
    }

    async fn accept(&self, offer: &str, request: &AllocRequest) -> Result<api::Alloc, PoolError> {
        let reservation = {
            let mut state = lock(&self.cache.state);
            let generation = state.generation;
            match state.tracked(generation, offer) {
                None => None,
                Some(tracked) if tracked.outdated => {
                    return Err(PoolError::OfferExpired {
                        pool: self.name().to_owned(),
                        offer: offer.to_owned(),
                        local: true,
                        detail: "the cached offer is outdated; ask for offers again".to_owned(),
                    });
                }
                Some(tracked) if !tracked.available.fits(&request.min) => {
                    return Err(PoolError::OfferExpired {
                        pool: self.name().to_owned(),
                        offer: offer.to_owned(),
                        local: true,
                        detail: format!("{} wanted, {} left", request.min, tracked.available),
                    });
                }
                Some(tracked) => {
                    let amount = request.max_or_min().min(&tracked.available);
                    tracked.available = tracked.available.saturating_sub(&amount);
                    Some(Reservation {
                        cache: &self.cache,
                        generation,
                        offer: offer.to_owned(),
                        amount,
                        settled: false,
                    })
                }
            }
        };
        let result = self.source.accept(offer, request).await;
        if let Some(reservation) = reservation {
            match &result {
                Ok(alloc) => reservation.granted(alloc),
                Err(err) => reservation.failed(err.is_offer_gone()),
            }
        }
        result
    }

    async fn alloc(&self, alloc: &str) -> Result<api::Alloc, PoolError> {
        let result = self.source.alloc(alloc).await;
        self.forget_alloc(alloc, &result);
        result
    }

    async fn keepalive(&self, alloc: &str, interval: Duration) -> Result<api::AllocKeepaliveResponse, PoolError> {
        let result = self.source.keepalive(alloc, interval).await;
        self.forget_alloc(alloc, &result);
        result
    }

    async fn free(&self, alloc: &str) -> Result<api::Alloc, PoolError> {
        let result = self.source.free(alloc).await;
        match &result {
            Ok(freed) => {
                let mut state = lock(&self.cache.state);
                if let Some(taken) = state.taken.remove(alloc) {
                    // Only a free gives the room back; an alloc that was reclaimed did not.
                    if freed.ended == Some(api::EndReason::Freed) {
                        let generation = state.generation;
                        if let Some(tracked) = state.tracked(generation, &taken.offer) {
                            tracked.available = tracked
                                .available
                                .checked_add(&taken.resources)
                                .unwrap_or_else(|| tracked.available.clone());
                        }
                    }
                }
            }
            Err(_) => self.forget_alloc(alloc, &result),
        }
        result
    }
}

// ---------------------------------------------------------------------------------------------
// Picking offers and allocating

/// Up to `n` offers to try, best first [Reflow `pickN`]: offers that cannot fit `min` are
/// dropped; offers that can hold `max` come first, in ascending [`Resources::distance`] to `max`
/// (the tightest fit first); then offers that fit `min` but not `max`, also in ascending distance
/// to `max` (the largest first). Offers at equal distance keep their order (shuffle them first).
/// The distance counts every resource, weighted by `weights` (Reflow counted only cpu and mem).
pub fn pick_n<'a>(
    offers: &'a [PoolOffer],
    n: usize,
    min: &Resources,
    max: &Resources,
    weights: &SizeWeights,
) -> Vec<&'a PoolOffer> {
    let mut ranked: Vec<(bool, f64, &PoolOffer)> = offers
        .iter()
        .filter(|offer| offer.available.fits(min))
        .map(|offer| (!offer.available.fits(max), offer.available.distance(max, weights), offer))
        .collect();
    ranked.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    ranked.into_iter().take(n).map(|(_, _, offer)| offer).collect()
}

/// How much to ask of an offer with `available` for a request of `min` to `max`: `max` capped by
/// what is available, or the whole offer when what would be left is useless: no cpu, no mem or no
/// disk left (each counted only if the offer has some) [Reflow's whole-offer rule].
pub fn amount_to_take(available: &Resources, min: &Resources, max: &Resources) -> Resources {
    use allot_core::resources::{CPU, DISK, MEM};
    let want = max.max(min).min(available);
    let left = available.saturating_sub(&want);
    let useless = [CPU, MEM, DISK].iter().any(|name| available.get_milli(name) > 0 && left.get_milli(name) == 0);
    if useless {
        available.clone()
    } else {
        want
    }
}

/// Waits between retries: `initial * factor^retry`, at most `max`, then shortened by a random
/// part of at most `jitter` (a wait lies in `[w - jitter * w, w)`, as Reflow's `retry.Jitter`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    pub initial: Duration,
    pub factor: f64,
    pub max: Duration,
    /// 0 to 1.
    pub jitter: f64,
}

impl Backoff {
    /// The wait before retry `retry` (0 for the first retry) without jitter.
    pub fn nominal(&self, retry: u32) -> Duration {
        let factor = self.factor.max(1.0).powi(retry.min(1000) as i32);
        let secs = (self.initial.as_secs_f64() * factor).min(self.max.as_secs_f64());
        Duration::try_from_secs_f64(secs).unwrap_or(self.max)
    }

    /// The wait before retry `retry`, jittered.
    pub fn wait(&self, retry: u32) -> Duration {
        let nominal = self.nominal(retry).as_secs_f64();
        let spread = nominal * self.jitter.clamp(0.0, 1.0);
        let cut = if spread > 0.0 { rand::thread_rng().gen_range(0.0..spread) } else { 0.0 };
        Duration::from_secs_f64(nominal - cut)
    }
}

/// How [`allocate`] tries.
#[derive(Debug, Clone)]
pub struct AllocateOptions {
    /// How many rounds of "get offers, try the best picks" (default 6, Reflow's).
    pub tries: u32,
    /// How many offers each round tries, best first (default 10, Reflow's).
    pub picks: usize,
    /// The wait between rounds (default 50 ms doubling up to 1 s, jitter 0.2; Reflow had none).
    pub backoff: Backoff,
    /// How resources weigh in the best-fit distance (default: every resource, 8 GiB mem = 1 cpu).
    pub weights: SizeWeights,
    /// How long a round waits for offers (default 10 s).
    pub offers_timeout: Duration,
}

impl Default for AllocateOptions {
    fn default() -> AllocateOptions {
        AllocateOptions {
            tries: 6,
            picks: 10,
            backoff: Backoff {
                initial: Duration::from_millis(50),
                factor: 2.0,
                max: Duration::from_secs(1),
                jitter: 0.2,
            },
            weights: SizeWeights::default(),
            offers_timeout: DEFAULT_OFFERS_TIMEOUT,
        }
    }
}

/// What one round of [`allocate`] saw.
#[derive(Debug, Clone, Default)]
pub struct TryReport {
    /// Offers received.
    pub offers: usize,
    /// Offers picked (those that fit `min`, at most `picks`).
    pub picked: usize,
    /// Picks refused because the offer was gone (`offer_expired`, `pool_stopped`, `pool_not_found`).
    pub expired: usize,
    /// Picks refused with a transient error.
    pub transient: Vec<PoolError>,
    /// Pools that failed to give offers.
    pub failed_pools: Vec<PoolFailure>,
    /// Pools that did not give offers in time.
    pub timed_out_pools: Vec<String>,
}

impl fmt::Display for TryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} offers, {} fit", self.offers, self.picked)?;
        if self.expired > 0 {
            write!(f, ", {} gone when accepted", self.expired)?;
        }
        if let Some(last) = self.transient.last() {
            write!(f, ", {} transient errors (last: {last})", self.transient.len())?;
        }
        if let Some(first) = self.failed_pools.first() {
            write!(f, ", {} pools failed (first: {})", self.failed_pools.len(), first.error)?;
        }
        if !self.timed_out_pools.is_empty() {
            write!(f, ", {} pools timed out", self.timed_out_pools.len())?;
        }
        Ok(())
    }
}

/// Why [`allocate`] gave no alloc.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AllocateError {
    /// The request cannot be met by any offer: `min` is empty, or `max` is below `min`.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// Accepting an offer failed with an error that another offer would not fix.
    #[error("accepting offer {offer} failed on try {try_number}: {error}")]
    Accept { offer: String, try_number: u32, error: PoolError },
    /// No pool could give offers, and retrying will not help.
    #[error("no pool gave offers: {}", failures_text(.failed))]
    Offers { failed: Vec<PoolFailure> },
    /// Every try ended without an alloc.
    #[error("no alloc for {min} after {} tries: {}", .tries.len(), tries_text(.tries))]
    Unavailable { min: Resources, tries: Vec<TryReport> },
}

fn failures_text(failed: &[PoolFailure]) -> String {
    failed.iter().map(|f| f.error.to_string()).collect::<Vec<_>>().join("; ")
}

fn tries_text(tries: &[TryReport]) -> String {
    tries.iter().enumerate().map(|(i, t)| format!("try {}: {t}", i + 1)).collect::<Vec<_>>().join("; ")
}

impl AllocateError {
    /// True when trying again later may succeed (nothing fit or everything was taken).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, AllocateError::Unavailable { .. })
    }
}

/// Allocates from `pools` [Reflow `pool.Allocate`, improved]: up to `options.tries` rounds with
/// backoff between them; each round gets the offers, shuffles them (so concurrent callers spread
/// out), and tries up to `options.picks` of them in [`pick_n`] order, asking each for
/// [`amount_to_take`]. An offer that is gone or a transient error moves on to the next pick; any
/// other error is returned at once.
pub async fn allocate<P: PoolSet + ?Sized>(
    pools: &P,
    request: &AllocRequest,
    options: &AllocateOptions,
) -> Result<api::Alloc, AllocateError> {
    if request.min.is_empty() {
        return Err(AllocateError::InvalidRequest("min is empty".to_owned()));
    }
    let max = request.max_or_min();
    let mut tries = Vec::new();
    for attempt in 0..options.tries.max(1) {
        if attempt > 0 {
            tokio::time::sleep(options.backoff.wait(attempt - 1)).await;
        }
        let report = pools.offers_within(options.offers_timeout).await;
        let mut offers = report.offers;
        shuffle(&mut offers);
        let picks = pick_n(&offers, options.picks, &request.min, &max, &options.weights);
        let mut outcome = TryReport {
            offers: offers.len(),
            picked: picks.len(),
            failed_pools: report.failed,
            timed_out_pools: report.timed_out,
            ..TryReport::default()
        };
        if offers.is_empty()
            && outcome.timed_out_pools.is_empty()
            && !outcome.failed_pools.is_empty()
            && outcome.failed_pools.iter().all(|f| !f.error.is_retryable())
        {
            return Err(AllocateError::Offers { failed: outcome.failed_pools });
        }
        for offer in picks {
            let take = amount_to_take(&offer.available, &request.min, &max);
            let accept = AllocRequest {
                min: request.min.clone(),
                max: (take != request.min).then_some(take),
                owner: request.owner.clone(),
                labels: request.labels.clone(),
            };
            match pools.accept_offer(offer, &accept).await {
                Ok(alloc) => return Ok(alloc),
                Err(err) if err.is_offer_gone() => outcome.expired += 1,
                Err(err) if err.is_retryable() => outcome.transient.push(err),
                Err(error) => return Err(AllocateError::Accept { offer: offer.uri(), try_number: attempt + 1, error }),
            }
        }
        tries.push(outcome);
    }
    Err(AllocateError::Unavailable { min: request.min.clone(), tries })
}

fn shuffle<T>(items: &mut [T]) {
    items.shuffle(&mut rand::thread_rng());
}

// ---------------------------------------------------------------------------------------------
// Keepalive

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
    /// ([`PoolError::is_alloc_gone`]).
    #[error("the alloc is gone: {0}")]
    Gone(PoolError),
    /// The daemon refused the keepalive with an error that retrying will not fix.
    #[error("the keepalive was refused: {0}")]
    Refused(PoolError),
    /// The keepalive kept failing with transient errors until the lease ended, or would end
    /// before the next try (`lease_ended`), or until the retries ran out.
    #[error("the keepalive failed {tries} times{}; last error: {last_error}", if *.lease_ended { " until the lease ended" } else { "" })]
    GaveUp { tries: u32, lease_ended: bool, last_error: PoolError },
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
                Err(_) => PoolError::Timeout { pool: pool.clone(), timeout },
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_split_at_the_first_slash() {
        assert_eq!(split_uri("pool/0123456789abcdef").unwrap(), ("pool", "0123456789abcdef"));
        assert_eq!(split_uri("pool/a/b").unwrap(), ("pool", "a/b"));
        for bad in ["pool", "/alloc", "pool/", ""] {
            assert!(matches!(split_uri(bad), Err(PoolError::InvalidUri { .. })), "{bad}");
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
        let api = |status: u16, code: &str| PoolError::Daemon {
            pool: "p".into(),
            source: Arc::new(ClientError::Api { status, code: code.into(), message: String::new() }),
        };
        let expired = PoolError::from_client(
            "p",
            Some("1"),
            ClientError::Api { status: 409, code: "offer_expired".into(), message: "gone".into() },
        );
        assert!(matches!(expired, PoolError::OfferExpired { local: false, .. }) && expired.is_offer_gone());
        assert!(api(409, "pool_stopped").is_offer_gone() && !api(409, "pool_stopped").is_alloc_gone());
        for code in ["alloc_ended", "alloc_not_found", "pool_not_found"] {
            assert!(api(409, code).is_alloc_gone(), "{code}");
        }
        assert!(PoolError::UnknownPool { pool: "p".into() }.is_alloc_gone());
        assert!(api(503, "store_unavailable").is_retryable() && !api(503, "store_unavailable").is_alloc_gone());
        assert!(!api(400, "invalid_argument").is_retryable());
    }
}
