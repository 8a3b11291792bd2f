//! [`CachingPool`]: a pool's offers served from a cache with a time to live, tracking what is
//! taken from and given back to each cached offer.

use allot_api as api;
use async_trait::async_trait;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use super::*;

/// One pool's offers served from a cache [Reflow `CachingPool`], with these rules:
///
/// - the cached offers live `ttl` from the moment they were asked for, whether or not they are
///   empty (Reflow expired only an empty cache); an empty answer is cached too;
/// - each cached offer is *tracked*: an accept through the cache reserves what it may get
///   (`max` capped by what is left, else `min`) before it is sent, and once granted the offer
///   keeps `left - granted`; freeing an alloc through the cache gives its resources back;
/// - an accept whose `min` the tracked offer cannot hold fails at once with a local
///   [`PoolCallError::OfferExpired`], without a call to the daemon;
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
    last_error: Option<(u64, PoolCallError)>,
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

    /// `source` behind this cache (a pool of the same name, found again): the cached offers and
    /// their tracking are kept.
    pub(super) fn with_source(&self, source: Arc<dyn PoolSource>) -> CachingPool {
        CachingPool { source, cache: self.cache.clone() }
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
    fn forget_alloc(&self, alloc: &str, result: &Result<impl Sized, PoolCallError>) {
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

    async fn offers(&self) -> Result<Vec<PoolOffer>, PoolCallError> {
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

    /// From the cache while it is fresh (what is left of the offer after the accepts through
    /// it), else from the pool.
    async fn offer(&self, id: &str) -> Result<PoolOffer, PoolCallError> {
        {
            let state = lock(&self.cache.state);
            if state.is_fresh(Instant::now(), self.cache.ttl) {
                if let Some(offer) = state.valid_offers().into_iter().find(|offer| offer.id == id) {
                    return Ok(offer);
                }
            }
        }
        self.source.offer(id).await
    }

    async fn allocs(&self) -> Result<Vec<api::Alloc>, PoolCallError> {
        self.source.allocs().await
    }

    async fn accept(&self, offer: &str, request: &AllocNeed) -> Result<api::Alloc, PoolCallError> {
        let reservation = {
            let mut state = lock(&self.cache.state);
            let generation = state.generation;
            match state.tracked(generation, offer) {
                None => None,
                Some(tracked) if tracked.outdated => {
                    return Err(PoolCallError::OfferExpired {
                        pool: self.name().to_owned(),
                        offer: offer.to_owned(),
                        local: true,
                        detail: "the cached offer is outdated; ask for offers again".to_owned(),
                    });
                }
                Some(tracked) if !tracked.available.fits(&request.min) => {
                    return Err(PoolCallError::OfferExpired {
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

    async fn alloc(&self, alloc: &str) -> Result<api::Alloc, PoolCallError> {
        let result = self.source.alloc(alloc).await;
        self.forget_alloc(alloc, &result);
        result
    }

    async fn keepalive(&self, alloc: &str, interval: Duration) -> Result<api::AllocKeepaliveResponse, PoolCallError> {
        let result = self.source.keepalive(alloc, interval).await;
        self.forget_alloc(alloc, &result);
        result
    }

    async fn free(&self, alloc: &str) -> Result<api::Alloc, PoolCallError> {
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
