//! [`Mux`]: many pools, on one daemon or several, addressed by alloc URIs `pool/alloc`.

use crate::Client;
use allot_api as api;
use async_trait::async_trait;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::*;

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
    /// The caches' time to live; none: no caching. Changed under `caches`' lock.
    caching: RwLock<Option<Duration>>,
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
            .field("caching", &self.caching())
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
            caching: RwLock::new(None),
            concurrency: DEFAULT_MUX_CONCURRENCY,
        }
    }

    /// An empty mux that serves every pool through a [`CachingPool`] whose offers live `ttl`.
    pub fn with_caching(ttl: Duration) -> Mux {
        Mux { caching: RwLock::new(Some(ttl)), ..Mux::new() }
    }

    /// Sets how many pools [`Mux::offers`] asks at the same time (at least 1).
    #[must_use]
    pub fn with_concurrency(mut self, concurrency: usize) -> Mux {
        self.concurrency = concurrency.max(1);
        self
    }

    /// The cache time to live, when caching is on.
    pub fn caching(&self) -> Option<Duration> {
        *self.caching.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Turns caching on (offers cached `ttl`) or off (`None`) now, for every pool in the mux and
    /// those added after [Reflow's `Mux.SetCaching`]. Turned on, each pool gets a fresh cache (a
    /// cache of the same time to live is kept); turned off, calls go to the pools themselves.
    pub fn set_caching(&self, ttl: Option<Duration>) {
        let mut caches = lock(&self.caches);
        let mut caching = self.caching.write().unwrap_or_else(PoisonError::into_inner);
        if *caching == ttl {
            return;
        }
        *caching = ttl;
        let sources: Vec<Arc<dyn PoolSource>> = self
            .snapshot()
            .iter()
            .map(|(name, pool)| caches.get(name).map_or_else(|| pool.clone(), |cache| cache.source().clone()))
            .collect();
        caches.clear();
        let mut map = PoolMap::new();
        let mut new_caches = HashMap::new();
        for source in sources {
            let name = source.name().to_owned();
            let pool = wrap(ttl, &HashMap::new(), source, &mut new_caches);
            map.insert(name, pool);
        }
        *caches = new_caches;
        *self.pools.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(map);
    }

    /// Replaces the set of pools. With caching, a pool whose name was already in the mux keeps
    /// its cache (now in front of the new source); the caches of pools no longer there are dropped.
    pub fn set_pools(&self, pools: impl IntoIterator<Item = Arc<dyn PoolSource>>) -> Result<(), PoolCallError> {
        let mut caches = lock(&self.caches);
        let mut map = PoolMap::new();
        let mut new_caches = HashMap::new();
        for pool in pools {
            let name = pool.name().to_owned();
            check_pool_name(&name)?;
            if map.contains_key(&name) {
                return Err(PoolCallError::DuplicatePool { pool: name });
            }
            let pool = self.wrap(&caches, pool, &mut new_caches);
            map.insert(name, pool);
        }
        *caches = new_caches;
        *self.pools.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(map);
        Ok(())
    }

    /// Adds one pool; its name must not be in the mux yet.
    pub fn add_pool(&self, pool: Arc<dyn PoolSource>) -> Result<(), PoolCallError> {
        let mut caches = lock(&self.caches);
        let name = pool.name().to_owned();
        check_pool_name(&name)?;
        let mut map = PoolMap::clone(&self.snapshot());
        if map.contains_key(&name) {
            return Err(PoolCallError::DuplicatePool { pool: name });
        }
        let mut added = HashMap::new();
        let pool = self.wrap(&caches, pool, &mut added);
        caches.extend(added);
        map.insert(name, pool);
        *self.pools.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(map);
        Ok(())
    }

    /// Adds every pool the daemon of `client` has now; answers how many.
    pub async fn add_daemon(&self, client: &Client) -> Result<usize, PoolCallError> {
        let pools =
            DaemonPool::all(client).await.map_err(|err| PoolCallError::from_client(client.base_url(), None, err))?;
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
        wrap(self.caching(), existing, pool, new_caches)
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

    fn route(&self, pool: &str) -> Result<Arc<dyn PoolSource>, PoolCallError> {
        self.pool(pool).ok_or_else(|| PoolCallError::UnknownPool { pool: pool.to_owned() })
    }

    /// Asks every pool for its offers, at most [`Mux::with_concurrency`] at a time, and answers
    /// by `timeout` with what it got: the offers, the pools that failed (with their error) and
    /// those that had not answered (abandoned, their calls cancelled).
    pub async fn offers(&self, timeout: Duration) -> OfferReport {
        let (offers, asked, failed, timed_out) =
            self.ask_every_pool(timeout, |pool| async move { pool.offers().await }).await;
        OfferReport { offers: offers.into_iter().flatten().collect(), asked, failed, timed_out }
    }

    /// Calls `ask` on every pool, at most [`Mux::with_concurrency`] at a time, until `timeout`:
    /// the answers, how many pools were asked, the failures and the pools that had not answered
    /// (abandoned, their calls cancelled), both in name order.
    async fn ask_every_pool<T, F, Fut>(
        &self,
        timeout: Duration,
        ask: F,
    ) -> (Vec<T>, usize, Vec<PoolFailure>, Vec<String>)
    where
        T: Send + 'static,
        F: Fn(Arc<dyn PoolSource>) -> Fut,
        Fut: std::future::Future<Output = Result<T, PoolCallError>> + Send + 'static,
    {
        let pools = self.snapshot();
        let deadline = later(Instant::now(), timeout);
        let permits = Arc::new(Semaphore::new(self.concurrency));
        let mut tasks = JoinSet::new();
        let mut pending = HashMap::with_capacity(pools.len());
        for (name, pool) in pools.iter() {
            let (call, permits) = (ask(pool.clone()), permits.clone());
            let handle = tasks.spawn(async move {
                let _permit = permits.acquire_owned().await;
                call.await
            });
            pending.insert(handle.id(), name.clone());
        }
        let (mut answers, mut failed) = (Vec::new(), Vec::new());
        while let Ok(Some(joined)) = tokio::time::timeout_at(deadline, tasks.join_next_with_id()).await {
            match joined {
                Ok((id, result)) => {
                    let pool = pending.remove(&id).unwrap_or_default();
                    match result {
                        Ok(answer) => answers.push(answer),
                        Err(error) => failed.push(PoolFailure { pool, error }),
                    }
                }
                Err(err) => {
                    let pool = pending.remove(&err.id()).unwrap_or_default();
                    let error = PoolCallError::Panicked { pool: pool.clone(), detail: err.to_string() };
                    failed.push(PoolFailure { pool, error });
                }
            }
        }
        // Stragglers are abandoned: dropping the set cancels their calls.
        tasks.abort_all();
        let mut timed_out: Vec<String> = pending.into_values().collect();
        timed_out.sort();
        failed.sort_by(|a: &PoolFailure, b: &PoolFailure| a.pool.cmp(&b.pool));
        (answers, pools.len(), failed, timed_out)
    }

    /// Lists the live allocs of every pool, at most [`Mux::with_concurrency`] pools at a time,
    /// and answers by `timeout` with what it got [Reflow's `Mux.Allocs()`]: the allocs, the pools
    /// that failed (with their error) and those that had not answered.
    pub async fn allocs(&self, timeout: Duration) -> AllocReport {
        let (allocs, asked, failed, timed_out) =
            self.ask_every_pool(timeout, |pool| async move { pool.allocs().await }).await;
        AllocReport { allocs: allocs.into_iter().flatten().collect(), asked, failed, timed_out }
    }

    /// The offer at `uri` (`pool/offer`) [Reflow's `Mux.Offer(uri)`].
    pub async fn offer(&self, uri: &str) -> Result<PoolOffer, PoolCallError> {
        let (pool, offer) = split_uri(uri)?;
        self.route(pool)?.offer(offer).await
    }

    /// Accepts `offer` in its pool.
    pub async fn accept(&self, offer: &PoolOffer, request: &AllocNeed) -> Result<api::Alloc, PoolCallError> {
        self.route(&offer.pool)?.accept(&offer.id, request).await
    }

    /// Inspects the alloc at `uri` (`pool/alloc`).
    pub async fn alloc(&self, uri: &str) -> Result<api::Alloc, PoolCallError> {
        let (pool, alloc) = split_uri(uri)?;
        self.route(pool)?.alloc(alloc).await
    }

    /// Renews the lease of the alloc at `uri` (`pool/alloc`).
    pub async fn keepalive(&self, uri: &str, interval: Duration) -> Result<api::AllocKeepaliveResponse, PoolCallError> {
        let (pool, alloc) = split_uri(uri)?;
        self.route(pool)?.keepalive(alloc, interval).await
    }

    /// Frees the alloc at `uri` (`pool/alloc`).
    pub async fn free(&self, uri: &str) -> Result<api::Alloc, PoolCallError> {
        let (pool, alloc) = split_uri(uri)?;
        self.route(pool)?.free(alloc).await
    }
}

/// With caching (`ttl`), `pool` behind its cache (the existing one of its name, if any).
fn wrap(
    ttl: Option<Duration>,
    existing: &HashMap<String, CachingPool>,
    pool: Arc<dyn PoolSource>,
    new_caches: &mut HashMap<String, CachingPool>,
) -> Arc<dyn PoolSource> {
    let Some(ttl) = ttl else { return pool };
    let name = pool.name().to_owned();
    let caching = match existing.get(&name) {
        Some(old) if old.ttl() == ttl => old.with_source(pool),
        _ => CachingPool::new(pool, ttl),
    };
    new_caches.insert(name, caching.clone());
    Arc::new(caching)
}

#[async_trait]
impl PoolSet for Mux {
    async fn offers_within(&self, timeout: Duration) -> OfferReport {
        self.offers(timeout).await
    }

    async fn accept_offer(&self, offer: &PoolOffer, request: &AllocNeed) -> Result<api::Alloc, PoolCallError> {
        self.accept(offer, request).await
    }

    async fn alloc_by_uri(&self, uri: &str) -> Result<api::Alloc, PoolCallError> {
        self.alloc(uri).await
    }

    async fn keepalive_by_uri(
        &self,
        uri: &str,
        interval: Duration,
    ) -> Result<api::AllocKeepaliveResponse, PoolCallError> {
        self.keepalive(uri, interval).await
    }

    async fn free_by_uri(&self, uri: &str) -> Result<api::Alloc, PoolCallError> {
        self.free(uri).await
    }
}
