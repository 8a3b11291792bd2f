//! The pools of the embedded store: each operation is `Pools`', made durable through the
//! write-ahead log.

use allot_core::pools::{
    Alloc, AllocId, AllocNotes, AllocRequest, AllocState, CordonOrder, EndedAlloc, Labels, Offer, PoolChange,
    PoolError, PoolName, PoolSettings, PoolView,
};
use allot_core::{Effects, Resources};
use async_trait::async_trait;

use super::ops::{Key, Op, Table};
use super::EmbeddedStore;
use crate::records::{encode, resources_record, AllocRecord, PoolRecord};
use crate::{Page, PageRequest, PoolStore, StoreError};

/// The writes of pool changes.
pub(super) fn ops<'a>(changes: impl Iterator<Item = &'a PoolChange>, out: &mut Vec<Op>) {
    for change in changes {
        match change {
            PoolChange::Pool { name, settings } => {
                let PoolSettings { capacity, occupied, stopped, labels, cordon } = settings;
                let record = PoolRecord {
                    capacity: resources_record(capacity),
                    stopped: *stopped,
                    occupied: (!occupied.is_empty()).then(|| resources_record(occupied)),
                    cordon: cordon.map(|c| (c.since, c.drain_at)),
                };
                out.push(Op::put(Table::Pools, Op::name(name.as_str()), encode(&record)));
                out.push(if labels.is_empty() {
                    Op::Remove(Table::PoolLabels, Op::name(name.as_str()))
                } else {
                    Op::put(Table::PoolLabels, Op::name(name.as_str()), encode(labels))
                });
            }
            PoolChange::PoolRemoved { name } => {
                out.push(Op::Remove(Table::Pools, Op::name(name.as_str())));
                out.push(Op::Remove(Table::PoolLabels, Op::name(name.as_str())));
                out.push(Op::RemoveUnder(Table::Allocs, name.as_str().to_owned()));
            }
            PoolChange::Alloc(alloc) | PoolChange::AllocAnnotated(alloc) => {
                let key = Key::Numbered(alloc.pool.as_str().to_owned(), alloc.id.0);
                out.push(Op::put(Table::Allocs, key, encode(&AllocRecord::live(alloc))));
            }
            // An ended alloc stays readable, across restarts too, until its retention is over (or
            // the pool's most ended allocs are kept): then it is dropped.
            PoolChange::AllocEnded(ended) => {
                let key = Key::Numbered(ended.alloc.pool.as_str().to_owned(), ended.alloc.id.0);
                out.push(Op::put(Table::Allocs, key, encode(&AllocRecord::ended(ended))));
            }
            PoolChange::EndedDropped { pool, id } => {
                out.push(Op::Remove(Table::Allocs, Key::Numbered(pool.as_str().to_owned(), id.0)));
            }
        }
    }
}

#[async_trait]
impl PoolStore for EmbeddedStore {
    async fn put_pool(&self, name: PoolName, capacity: Resources) -> Result<(bool, PoolView), StoreError> {
        self.mutate_pools(|pools, now| {
            let (created, changes) = pools.put_pool(&name, capacity);
            Ok(((created, pools.pool(&name, now)?), changes))
        })
        .await
        .inspect(|_| {
            // A lowered capacity may leave tasks that no longer fit: the scheduler looks.
            self.shared.wake_scheduler.notify_one();
        })
    }

    async fn seed_pool(&self, name: PoolName, capacity: Resources) -> Result<(bool, PoolView), StoreError> {
        self.mutate_pools(|pools, now| {
            if let Ok(view) = pools.pool(&name, now) {
                return Ok(((false, view), Vec::new()));
            }
            let (created, changes) = pools.put_pool(&name, capacity);
            Ok(((created, pools.pool(&name, now)?), changes))
        })
        .await
    }

    /// With `force`, tasks placed on the pool fail and gangs holding placeholders there lose
    /// their reservation, in the same commit.
    async fn remove_pool(&self, name: PoolName, force: bool) -> Result<usize, StoreError> {
        self.commit_sched(|sched, mut world, now| {
            let (ended, changes) = world.pools.remove_pool(&name, force, now)?;
            let mut outcome = sched.pool_removed(&name, now, &mut world);
            outcome.pools.splice(0..0, changes);
            Ok((ended, outcome))
        })
        .await
    }

    async fn pools(&self, page: PageRequest<PoolName>) -> Result<Page<PoolView, PoolName>, StoreError> {
        let limit = page.limit();
        self.read_pools(|pools, now| {
            Ok(Page::from_read(pools.pools_after(page.after(), limit + 1, now), limit, |p| p.name.clone()))
        })
    }

    async fn pool(&self, name: PoolName) -> Result<PoolView, StoreError> {
        self.read_pools(|pools, now| pools.pool(&name, now))
    }

    /// The room held there for a preemptor is not offered.
    async fn offer(&self, name: PoolName) -> Result<Option<Offer>, StoreError> {
        self.read_state(|state, now| {
            let spared = state.sched.room_held().remove(&name).unwrap_or_default();
            Ok(state.pools.offer_sparing(&name, now, &spared)?)
        })
    }

    /// The room held there for a preemptor is left free.
    async fn accept(&self, name: PoolName, request: AllocRequest) -> Result<Alloc, StoreError> {
        // Ids are drawn at random [Reflow `newID`]; a taken one is drawn again.
        loop {
            let id = AllocId(self.shared.ids.next_u64());
            let request = request.clone();
            let accepted = self
                .commit(|state, now| {
                    let spared = state.sched.room_held().remove(&name).unwrap_or_default();
                    let (alloc, changes) = state.pools.accept_sparing(&name, request, id, now, &spared)?;
                    Ok((alloc, Effects::default(), changes))
                })
                .await;
            match accepted {
                Err(StoreError::Pools(PoolError::AllocIdTaken { .. })) => continue,
                res => return res,
            }
        }
    }

    async fn keepalive_alloc(&self, name: PoolName, id: AllocId, interval_ms: u64) -> Result<(u64, Alloc), StoreError> {
        self.mutate_pools(|pools, now| {
            let (granted, alloc, changes) = pools.keepalive(&name, id, interval_ms, now)?;
            Ok(((granted, alloc), changes))
        })
        .await
    }

    async fn annotate_alloc(&self, name: PoolName, id: AllocId, notes: AllocNotes) -> Result<Alloc, StoreError> {
        self.mutate_pools(|pools, _| pools.annotate(&name, id, &notes)).await
    }

    async fn free_alloc(&self, name: PoolName, id: AllocId) -> Result<EndedAlloc, StoreError> {
        self.mutate_pools(|pools, now| pools.free(&name, id, now)).await
    }

    async fn inspect_alloc(&self, name: PoolName, id: AllocId) -> Result<AllocState, StoreError> {
        self.read_pools(|pools, _| pools.inspect(&name, id))
    }

    async fn allocs(&self, name: PoolName, page: PageRequest<AllocId>) -> Result<Page<Alloc, AllocId>, StoreError> {
        let limit = page.limit();
        self.read_pools(|pools, _| {
            Ok(Page::from_read(pools.allocs_after(&name, page.after().copied(), limit + 1)?, limit, |a| a.id))
        })
    }

    async fn stop_if_idle_for(&self, name: PoolName, idle_ms: u64) -> Result<(bool, u64), StoreError> {
        self.mutate_pools(|pools, now| {
            let (stopped, until_idle, changes) = pools.stop_if_idle_for(&name, idle_ms, now)?;
            Ok(((stopped, until_idle), changes))
        })
        .await
    }

    async fn label_pool(&self, name: PoolName, labels: Labels) -> Result<PoolView, StoreError> {
        self.mutate_pools(|pools, now| pools.label_pool(&name, labels, now)).await
    }

    async fn occupy_pool(&self, name: PoolName, occupied: Resources) -> Result<PoolView, StoreError> {
        let view = self.mutate_pools(|pools, now| pools.occupy(&name, occupied, now)).await?;
        self.shared.wake_scheduler.notify_one();
        Ok(view)
    }

    async fn cordon_pool(&self, name: PoolName, order: CordonOrder) -> Result<PoolView, StoreError> {
        let view = self.mutate_pools(|pools, now| pools.cordon(&name, order, now)).await?;
        self.shared.wake_scheduler.notify_one();
        Ok(view)
    }
}
