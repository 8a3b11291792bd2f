//! The leased resource pools part of a backend: pools, their offer, and allocs under leases.

use allot_core::pools::{
    Alloc, AllocId, AllocNotes, AllocRequest, AllocState, CordonOrder, EndedAlloc, Labels, Offer, PoolName, PoolView,
};
use allot_core::Resources;
use async_trait::async_trait;

use crate::{Page, PageRequest, StoreError};

/// The leased resource pools of a backend.
#[async_trait]
pub trait PoolStore: Send + Sync {
    /// Creates a pool or changes its capacity (a stopped pool starts again); true if created.
    async fn put_pool(&self, name: PoolName, capacity: Resources) -> Result<(bool, PoolView), StoreError>;
    /// Creates a pool with `capacity` only if it does not exist; an existing one keeps its
    /// capacity (the configuration seeds pools, as it seeds quotas). Returns true if created.
    async fn seed_pool(&self, name: PoolName, capacity: Resources) -> Result<(bool, PoolView), StoreError>;
    /// Removes a pool; with `force`, also when it has allocs. Returns how many allocs ended.
    async fn remove_pool(&self, name: PoolName, force: bool) -> Result<usize, StoreError>;
    /// A page of the pools, ordered by name.
    async fn pools(&self, page: PageRequest<PoolName>) -> Result<Page<PoolView, PoolName>, StoreError>;
    async fn pool(&self, name: PoolName) -> Result<PoolView, StoreError>;
    /// The pool's one offer (everything free), or `None` when nothing is free or it is stopped.
    async fn offer(&self, name: PoolName) -> Result<Option<Offer>, StoreError>;
    /// Accepts the pool's offer: makes an alloc, or answers [`PoolError::OfferExpired`].
    async fn accept(&self, name: PoolName, request: AllocRequest) -> Result<Alloc, StoreError>;
    /// Renews an alloc's lease; returns the interval granted (ms) and the alloc.
    async fn keepalive_alloc(&self, name: PoolName, id: AllocId, interval_ms: u64) -> Result<(u64, Alloc), StoreError>;
    /// Changes a live alloc's labels and metadata (its owner's notes); the lease is not renewed.
    async fn annotate_alloc(&self, name: PoolName, id: AllocId, notes: AllocNotes) -> Result<Alloc, StoreError>;
    async fn free_alloc(&self, name: PoolName, id: AllocId) -> Result<EndedAlloc, StoreError>;
    async fn inspect_alloc(&self, name: PoolName, id: AllocId) -> Result<AllocState, StoreError>;
    /// A page of the live allocs of a pool, ordered by id.
    async fn allocs(&self, name: PoolName, page: PageRequest<AllocId>) -> Result<Page<Alloc, AllocId>, StoreError>;
    /// Stops the pool if it has been idle for `idle_ms`; else the time (ms) until it would be.
    async fn stop_if_idle_for(&self, name: PoolName, idle_ms: u64) -> Result<(bool, u64), StoreError>;
    /// Replaces a pool's labels (what the scheduler's selectors match).
    async fn label_pool(&self, name: PoolName, labels: Labels) -> Result<PoolView, StoreError>;
    /// Sets what things allot does not manage hold in the pool (never offered); the scheduler
    /// preempts the tasks that no longer fit.
    async fn occupy_pool(&self, name: PoolName, occupied: Resources) -> Result<PoolView, StoreError>;
    /// Cordons, drains or uncordons the pool; the scheduler preempts a drained pool's tasks once
    /// its drain is due.
    async fn cordon_pool(&self, name: PoolName, order: CordonOrder) -> Result<PoolView, StoreError>;
}
