//! One pool as the machinery sees it ([`PoolSource`]; [`DaemonPool`] is one pool on one daemon),
//! and a set of pools addressed by alloc URIs ([`PoolSet`]: a [`Mux`] or any single pool).

use crate::{Client, ClientError};
use allot_api as api;
use async_trait::async_trait;
use std::sync::Arc;
use std::time::Duration;

use super::*;

/// One pool: its offers, accepting them, and its allocs (addressed by their id within the pool).
#[async_trait]
pub trait PoolSource: Send + Sync {
    /// The pool's name: the first part of its allocs' URIs. Never contains `/`.
    fn name(&self) -> &str;

    /// The pool's offers now.
    async fn offers(&self) -> Result<Vec<PoolOffer>, PoolCallError>;

    /// One offer by its id [Reflow's `Pool.Offer(id)`]; `offer_not_found` when the pool has no
    /// such offer now.
    async fn offer(&self, id: &str) -> Result<PoolOffer, PoolCallError>;

    /// Every alloc of the pool that is live now [Reflow's `Pool.Allocs()`].
    async fn allocs(&self) -> Result<Vec<api::Alloc>, PoolCallError>;

    /// Accepts offer `offer` (an id from [`PoolSource::offers`]) with `request`.
    async fn accept(&self, offer: &str, request: &AllocNeed) -> Result<api::Alloc, PoolCallError>;

    /// Inspects alloc `alloc` (its id within the pool), live or ended.
    async fn alloc(&self, alloc: &str) -> Result<api::Alloc, PoolCallError>;

    /// Renews the lease of `alloc`, asking for `interval`; answers the interval granted.
    async fn keepalive(&self, alloc: &str, interval: Duration) -> Result<api::AllocKeepaliveResponse, PoolCallError>;

    /// Frees `alloc`.
    async fn free(&self, alloc: &str) -> Result<api::Alloc, PoolCallError>;
}

#[async_trait]
impl<T: PoolSource + ?Sized> PoolSource for Arc<T> {
    fn name(&self) -> &str {
        (**self).name()
    }

    async fn offers(&self) -> Result<Vec<PoolOffer>, PoolCallError> {
        (**self).offers().await
    }

    async fn offer(&self, id: &str) -> Result<PoolOffer, PoolCallError> {
        (**self).offer(id).await
    }

    async fn allocs(&self) -> Result<Vec<api::Alloc>, PoolCallError> {
        (**self).allocs().await
    }

    async fn accept(&self, offer: &str, request: &AllocNeed) -> Result<api::Alloc, PoolCallError> {
        (**self).accept(offer, request).await
    }

    async fn alloc(&self, alloc: &str) -> Result<api::Alloc, PoolCallError> {
        (**self).alloc(alloc).await
    }

    async fn keepalive(&self, alloc: &str, interval: Duration) -> Result<api::AllocKeepaliveResponse, PoolCallError> {
        (**self).keepalive(alloc, interval).await
    }

    async fn free(&self, alloc: &str) -> Result<api::Alloc, PoolCallError> {
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
    pub fn new(client: Client, name: impl Into<String>) -> Result<DaemonPool, PoolCallError> {
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

    fn error(&self, err: ClientError) -> PoolCallError {
        PoolCallError::from_client(&self.name, None, err)
    }

    fn pool_offer(&self, offer: api::Offer) -> Result<PoolOffer, PoolCallError> {
        let available = offer.available.parse().map_err(|err| PoolCallError::BadAnswer {
            pool: self.name.clone(),
            detail: format!("offer {} available `{}`: {err}", offer.id, offer.available),
        })?;
        Ok(PoolOffer { pool: self.name.clone(), id: offer.id, available })
    }
}

#[async_trait]
impl PoolSource for DaemonPool {
    fn name(&self) -> &str {
        &self.name
    }

    async fn offers(&self) -> Result<Vec<PoolOffer>, PoolCallError> {
        let list = self.client.offers(&self.name).await.map_err(|err| self.error(err))?;
        list.offers.into_iter().map(|offer| self.pool_offer(offer)).collect()
    }

    async fn offer(&self, id: &str) -> Result<PoolOffer, PoolCallError> {
        let offer = self
            .client
            .offer(&self.name, id)
            .await
            .map_err(|err| PoolCallError::from_client(&self.name, Some(id), err))?;
        self.pool_offer(offer)
    }

    async fn allocs(&self) -> Result<Vec<api::Alloc>, PoolCallError> {
        Ok(self.client.allocs(&self.name).await.map_err(|err| self.error(err))?.allocs)
    }

    async fn accept(&self, offer: &str, request: &AllocNeed) -> Result<api::Alloc, PoolCallError> {
        self.client
            .accept(&self.name, offer, &request.to_accept())
            .await
            .map_err(|err| PoolCallError::from_client(&self.name, Some(offer), err))
    }

    async fn alloc(&self, alloc: &str) -> Result<api::Alloc, PoolCallError> {
        self.client.alloc(&self.name, alloc).await.map_err(|err| self.error(err))
    }

    async fn keepalive(&self, alloc: &str, interval: Duration) -> Result<api::AllocKeepaliveResponse, PoolCallError> {
        self.client.keepalive_alloc(&self.name, alloc, interval).await.map_err(|err| self.error(err))
    }

    async fn free(&self, alloc: &str) -> Result<api::Alloc, PoolCallError> {
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
    async fn accept_offer(&self, offer: &PoolOffer, request: &AllocNeed) -> Result<api::Alloc, PoolCallError>;

    async fn alloc_by_uri(&self, uri: &str) -> Result<api::Alloc, PoolCallError>;

    async fn keepalive_by_uri(
        &self,
        uri: &str,
        interval: Duration,
    ) -> Result<api::AllocKeepaliveResponse, PoolCallError>;

    async fn free_by_uri(&self, uri: &str) -> Result<api::Alloc, PoolCallError>;
}

/// The alloc id of `uri` if its pool part names `pool`.
fn alloc_of<'a, P: PoolSource + ?Sized>(pool: &P, uri: &'a str) -> Result<&'a str, PoolCallError> {
    let (name, alloc) = split_uri(uri)?;
    if name != pool.name() {
        return Err(PoolCallError::UnknownPool { pool: name.to_owned() });
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

    async fn accept_offer(&self, offer: &PoolOffer, request: &AllocNeed) -> Result<api::Alloc, PoolCallError> {
        if offer.pool != self.name() {
            return Err(PoolCallError::UnknownPool { pool: offer.pool.clone() });
        }
        self.accept(&offer.id, request).await
    }

    async fn alloc_by_uri(&self, uri: &str) -> Result<api::Alloc, PoolCallError> {
        self.alloc(alloc_of(self, uri)?).await
    }

    async fn keepalive_by_uri(
        &self,
        uri: &str,
        interval: Duration,
    ) -> Result<api::AllocKeepaliveResponse, PoolCallError> {
        self.keepalive(alloc_of(self, uri)?, interval).await
    }

    async fn free_by_uri(&self, uri: &str) -> Result<api::Alloc, PoolCallError> {
        self.free(alloc_of(self, uri)?).await
    }
}
