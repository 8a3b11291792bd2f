//! The scheduler on Redis: applications, queues and tasks live in Redis (`records.rs`), and
//! one daemon at a time schedules them, elected by the scheduler's lease (`lease.rs`).
//!
//! - The daemon that holds the lease keeps `allot_core::apps::Scheduler` in memory, loaded from
//!   the records when it takes the lease, and serves every call of the applications part; the
//!   other daemons' HTTP edge forwards those calls to it ([`AppsHome`]). It is the one writer of
//!   the records, and every write names its term (the fencing number): a deposed scheduler's
//!   writes are refused.
//! - Pools and token namespaces live in other hash slots, so a placement cannot be one atomic
//!   call. Each operation runs the core over a view of the pools and namespaces read from Redis
//!   (the *mirror*), then carries out its outcome in steps, each carrying the fencing number,
//!   which a pool or namespace refuses once it has seen a newer one:
//!   1. the allocs and grants to make are written as *intents* (fenced), then made, under the ids
//!      the core chose (a retry finds what it made). If one is refused (another client took the
//!      room since the mirror was read), those made are undone, the scheduler goes back to its
//!      state before the cycle, and the next cycle decides again on a fresh mirror;
//!   2. the records are written, with the allocs and grants to end as the new intents;
//!   3. those are ended (idempotent).
//! - A scheduler that takes over loads the records and the intents its predecessor left: made
//!   allocs and grants that no record holds are undone, ends are carried out again, each under
//!   the new fencing number (so the predecessor, if it still runs, is refused there from then
//!   on). Nothing is placed before that.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use allot_core::apps::queues::{QueueLimits, QueuePath};
use allot_core::apps::{Outcome, SchedConfig, SchedError, Scheduler, World};
use allot_core::pools::{Alloc, AllocId, AllocRequest, PoolName, PoolSettings, Pools, HELD};
use allot_core::{Grant, Lease, Ledger, Millis, NamespaceName, Resources, Token};
use allot_store::quiet::Quiet;
use allot_store::{AppsHome, PageRequest, PoolStore, QuotaStore, Store, StoreError};

use crate::apps::leader::Leader;
use crate::apps::lease::LeaseState;
use crate::apps::records::WriteError;
use crate::apps::steps::{encode_steps, steps, undo, Step, OTHERS, OTHERS_ALLOC};
use crate::keys::prefix;
use crate::reply::corrupt;
use crate::store::{Inner, RedisStore};

/// How long the scheduler's lease runs without a renewal.
pub(crate) const LEASE_TTL: Duration = Duration::from_secs(3);
/// How often the holder renews it (and the others try to take it).
const RENEW_EVERY: Duration = Duration::from_millis(500);
/// The holder stops scheduling this long before its lease would lapse unrenewed.
const LEASE_MARGIN: Duration = Duration::from_millis(500);
/// How often the scheduler tries again while something waits for room or tokens.
const RETRY_INTERVAL: Duration = Duration::from_millis(100);
/// The pause between a call that wakes the scheduler and its round.
const ROUND_GAP: Duration = Duration::from_millis(2);
/// How many steps of an outcome are sent to Redis at once.
const STEPS_AT_ONCE: usize = 64;
/// How often an idle scheduler reads the pools (to find those removed under its placements).
const IDLE_LOOK: Duration = Duration::from_secs(2);
/// How often the scheduler reads the executors' leases (a pool whose executors stopped is lost).
const EXECUTORS_EVERY: Duration = Duration::from_secs(1);

/// What of the mirror an operation reads again before it runs.
pub(crate) enum Fresh<'a> {
    No,
    /// The namespaces, with these too.
    Namespaces(&'a [NamespaceName]),
    /// The pools and the namespaces, with these too; and the executors' leases when they know
    /// none of these task types (a daemon that has just started runs them, perhaps).
    All(&'a [NamespaceName], &'a [String]),
}

fn not_here() -> StoreError {
    StoreError::Unavailable(
        "this daemon does not schedule applications right now (another one holds the scheduler's lease, or none \
         does yet); retry"
            .to_owned(),
    )
}

fn deposed(err: WriteError) -> StoreError {
    match err {
        WriteError::Deposed { current } => StoreError::Unavailable(format!(
            "this daemon's term as scheduler ended (the lease is in term {current}); retry"
        )),
        WriteError::Store(err) => err,
    }
}

impl RedisStore {
    /// Starts taking part in the election of the scheduler, as `advertise` (this daemon's base
    /// URL, where the others forward the applications part while it schedules).
    pub fn start_scheduling(&self, advertise: &str) {
        let holder = self.enter_election(advertise);
        let lease = tokio::spawn(run_lease(self.inner.clone(), holder));
        let rounds = tokio::spawn(run(self.inner.clone()));
        self.tasks.lock().unwrap_or_else(|p| p.into_inner()).extend([lease, rounds]);
    }

    /// Takes part in the election as `advertise` without starting the daemon's tasks: the
    /// caller renews the lease and runs the turns (`renew_lease`, `scheduling_turn`).
    pub(crate) fn enter_election(&self, advertise: &str) -> String {
        let holder = format!("{advertise} {:016x}", self.inner.ids.next_u64());
        *self.inner.apps.holder.lock().unwrap_or_else(|p| p.into_inner()) = Some(holder.clone());
        holder
    }

    /// Takes or renews the scheduler's lease once, and says who schedules. A lease is taken to
    /// run `LEASE_TTL` less `LEASE_MARGIN` from when it was asked for, on this daemon's clock.
    /// Answers whether this daemon's term changed (taken, lost or moved on): the rounds are
    /// woken to take the scheduling over, or to let it go.
    pub(crate) async fn renew_lease(&self, holder: &str) -> bool {
        let inner = &self.inner;
        let asked = inner.time.monotonic_ms();
        let lease = self.acquire_sched_lease(holder, LEASE_TTL).await;
        let mine = match lease {
            Ok(LeaseState::Mine { fencing, .. }) => {
                Some((fencing, asked + (LEASE_TTL - LEASE_MARGIN).as_millis() as Millis))
            }
            // A restore under way (it started while this daemon's first ask was on its way): no
            // daemon schedules meanwhile, and this one, whose reads came before it, refuses
            // every call until it is restarted.
            Ok(LeaseState::Held { holder: other, .. }) if other.starts_with(super::lease::RESTORE_HOLDER) => {
                inner.apps.set_home(AppsHome::Unknown);
                let mut seen = inner.restore_seen.lock().unwrap_or_else(|p| p.into_inner());
                if seen.is_none() {
                    tracing::error!(restore = %other, "a restore is writing into this Redis while this daemon runs: it refuses every call; restart it once the restore is done");
                    *seen = Some(other);
                }
                None
            }
            Ok(LeaseState::Held { holder: other, .. }) => {
                let url = other.split_whitespace().next().unwrap_or_default().to_owned();
                inner.apps.set_home(AppsHome::At(url));
                None
            }
            Err(err) => {
                if let Some(held_back) = LEASE_UNREACHABLE.admit() {
                    tracing::warn!(error = %err, more_since_last = held_back, "cannot reach the scheduler's lease");
                }
                // Ours runs on until its time, unless renewed.
                let kept = *inner.apps.lease.lock().unwrap_or_else(|p| p.into_inner());
                if kept.is_none() {
                    inner.apps.set_home(AppsHome::Unknown);
                }
                kept
            }
        };
        let changed = {
            let mut lease = inner.apps.lease.lock().unwrap_or_else(|p| p.into_inner());
            let changed = lease.map(|(f, _)| f) != mine.map(|(f, _)| f);
            *lease = mine;
            changed
        };
        if changed {
            inner.apps.wake.notify_one();
        }
        changed
    }

    /// One turn of scheduling as `holder`: in a new term, the records loaded first; while this
    /// daemon holds the lease, one round. Answers how long to wait before the next turn.
    pub(crate) async fn scheduling_turn(&self, holder: &str) -> Duration {
        let inner = &self.inner;
        let mut guard = inner.apps.leader.lock().await;
        let term = inner.apps.term();
        if guard.as_ref().map(|l| l.fencing) != term {
            *guard = None;
            if let Some(fencing) = term {
                match self.take_over(holder, fencing).await {
                    Ok(l) => *guard = Some(l),
                    Err(err) => {
                        if let Some(held_back) = TAKEOVER_FAILED.admit() {
                            tracing::warn!(error = %err, more_since_last = held_back, "could not take the scheduling over; retrying");
                        }
                    }
                }
            }
        }
        if term.is_some() {
            inner.apps.set_home(if guard.is_some() { AppsHome::Here } else { AppsHome::Unknown });
        }
        match guard.as_mut() {
            Some(l) => match self.round(holder, l).await {
                Ok(wait) => wait,
                Err(err) => {
                    if let Some(held_back) = ROUND_FAILED.admit() {
                        tracing::warn!(error = %err, more_since_last = held_back, "a scheduling round failed; loading the records again");
                    }
                    *guard = None;
                    RETRY_INTERVAL
                }
            },
            None if term.is_some() => RETRY_INTERVAL,
            None => RENEW_EVERY,
        }
    }

    /// The scheduler's settings, used from the next time this daemon takes the lease.
    pub fn set_sched_config(&self, config: SchedConfig) {
        *self.inner.apps.config.lock().unwrap_or_else(|p| p.into_inner()) = config;
    }

    /// A queue of the configuration file: registered if it does not exist, by this daemon as soon
    /// as it schedules (the records have one writer).
    pub(crate) async fn seed_queue_later(&self, path: QueuePath, limits: QueueLimits) {
        self.inner.apps.seeds.lock().unwrap_or_else(|p| p.into_inner()).push((path, limits));
        self.inner.apps.wake.notify_one();
    }

    /// Runs `query` on the scheduler, if this daemon holds the lease.
    pub(crate) async fn read_sched<T>(
        &self,
        query: impl FnOnce(&Scheduler) -> Result<T, SchedError>,
    ) -> Result<T, StoreError> {
        self.live()?;
        let mut leader = self.inner.apps.leader.lock().await;
        match self.inner.apps.current(&mut leader) {
            Some(l) => Ok(query(&l.sched)?),
            None => Err(not_here()),
        }
    }

    /// Runs an operation of the scheduler and carries out its outcome: the records, then what it
    /// ends in the pools and namespaces. An operation that fails changes nothing. `fresh` says
    /// what of the mirror to read again first (a submission is checked against the pools and
    /// namespaces as they are).
    pub(crate) async fn commit_sched<T>(
        &self,
        fresh: Fresh<'_>,
        op: impl FnOnce(&mut Scheduler, World<'_>, Millis) -> Result<(T, Outcome), SchedError>,
    ) -> Result<T, StoreError> {
        self.live()?;
        let holder = self.inner.apps.holder().ok_or_else(not_here)?;
        let mut guard = self.inner.apps.leader.lock().await;
        let Some(l) = self.inner.apps.current(&mut guard) else { return Err(not_here()) };
        match fresh {
            Fresh::No => {}
            // Nothing to check against: the mirror's namespaces are recent enough.
            Fresh::Namespaces([]) => {}
            Fresh::Namespaces(also) => l.ledger = self.read_ledger(&l.sched, also).await?,
            Fresh::All(also, types) => {
                (l.pools, l.ledger) = self.read_mirror(&l.sched, also).await?;
                l.mirror_read = Some(self.inner.time.monotonic_ms());
                if types.iter().any(|t| !l.sched.runners().knows(t)) {
                    let leases = allot_store::RunStore::executors(self).await?;
                    l.sched.set_runners(allot_store::runners_of(&leases));
                }
            }
        }
        let now = self.now();
        let (answer, outcome) = op(&mut l.sched, World { pools: &mut l.pools, ledger: &mut l.ledger }, now)?;
        match self.carry_out(&holder, l, &outcome).await {
            Ok(()) => {
                self.inner.apps.wake.notify_one();
                Ok(answer)
            }
            Err(err) => {
                // The records may be behind the scheduler in memory: load them again.
                *guard = None;
                Err(err.into())
            }
        }
    }

    /// Carries out an outcome: makes (undone if one is refused: `Refused`), records, ends.
    async fn carry_out(&self, holder: &str, l: &mut Leader, outcome: &Outcome) -> Result<(), Carry> {
        // The scheduler in memory may be half-changed: nothing of it is written, and the caller
        // loads the records again (Redis holds nothing of the change).
        if !outcome.broken.is_empty() {
            let broken = outcome.broken.join("; ");
            tracing::error!(%broken, "the scheduler found its state inconsistent; loading the records again");
            return Err(Carry::Failed(StoreError::Unavailable(format!(
                "the scheduler found its state inconsistent ({broken}); it loads it again from Redis"
            ))));
        }
        // The room held for preemptors is spared in the pools before anything is made or ended:
        // the ends may free a victim's room, which no outside worker's alloc may take.
        self.spare(l).await?;
        let (makes, mut ends) = steps(outcome);
        if !makes.is_empty() {
            let mut intents = makes.clone();
            intents.extend(l.unfinished.iter().cloned());
            self.write_app_records(holder, l.fencing, Some(&encode_steps(&intents)), &[]).await.map_err(deposed)?;
            let results = self.steps(&makes, l.fencing).await;
            if let Some(err) = results.iter().find_map(|r| r.as_ref().err()) {
                let err = err.clone();
                tracing::debug!(error = %err, "a placement could not be carried out; undoing the cycle's");
                let made: Vec<Step> =
                    makes.iter().zip(&results).filter(|(_, r)| r.is_ok()).filter_map(|(s, _)| undo(s)).collect();
                if let Some(Err(err)) = self.steps(&made, l.fencing).await.into_iter().find(Result::is_err) {
                    tracing::warn!(error = %err, "could not undo a step; the next scheduler will");
                    return Err(Carry::Failed(err));
                }
                return Err(Carry::Refused(err));
            }
        }
        ends.append(&mut l.unfinished);
        self.write_app_records(holder, l.fencing, Some(&encode_steps(&ends)), &outcome.apps).await.map_err(deposed)?;
        // The runs go with their tasks; one left by a failure here is forgotten by an executor
        // that finds its task gone.
        if let Err(err) = self.forget_ended_runs(&outcome.apps).await {
            tracing::warn!(error = %err, "could not forget the runs of removed tasks");
        }
        let results = self.steps(&ends, l.fencing).await;
        for (step, result) in ends.into_iter().zip(results) {
            if let Err(err) = result {
                tracing::warn!(error = %err, ?step, "could not end an alloc or grant; trying again later");
                l.unfinished.push(step);
            }
        }
        Ok(())
    }

    /// Writes the room held for preemptors on each pool where it changed since it was last
    /// written (on every pool, the first time in a term: a predecessor's may be left).
    async fn spare(&self, l: &mut Leader) -> Result<(), StoreError> {
        let held = l.sched.room_held();
        let changed: Vec<(PoolName, Resources)> = match &l.spared {
            Some(before) => {
                let mut pools: BTreeSet<&PoolName> = before.keys().collect();
                pools.extend(held.keys());
                pools
                    .into_iter()
                    .filter(|pool| before.get(*pool) != held.get(*pool))
                    .map(|pool| (pool.clone(), held.get(pool).cloned().unwrap_or_default()))
                    .collect()
            }
            None => l
                .pools
                .pools_after(None, usize::MAX, self.now())
                .into_iter()
                .map(|view| {
                    let spared = held.get(&view.name).cloned().unwrap_or_default();
                    (view.name, spared)
                })
                .collect(),
        };
        for chunk in changed.chunks(STEPS_AT_ONCE) {
            let written = chunk.iter().map(|(pool, spared)| self.spare_pool(pool.clone(), spared, l.fencing));
            if let Some(Err(err)) = futures_util::future::join_all(written).await.into_iter().find(Result::is_err) {
                return Err(err);
            }
        }
        l.spared = Some(held);
        Ok(())
    }

    /// Carries out steps that do not depend on each other, many at once.
    async fn steps(&self, steps: &[Step], fencing: u64) -> Vec<Result<(), StoreError>> {
        let mut results = Vec::with_capacity(steps.len());
        for chunk in steps.chunks(STEPS_AT_ONCE) {
            results.extend(futures_util::future::join_all(chunk.iter().map(|step| self.step(step, fencing))).await);
        }
        results
    }

    /// Carries out one step, in term `fencing`.
    async fn step(&self, step: &Step, fencing: u64) -> Result<(), StoreError> {
        let pool_name = |name: &str| PoolName::new(name).map_err(corrupt);
        let alloc_id = |id: &str| AllocId::parse(id).map_err(corrupt);
        match step {
            Step::Accept { pool, id, resources, owner, labels } => {
                let min: Resources = resources.parse().map_err(corrupt)?;
                let request =
                    AllocRequest { min, max: None, owner: owner.clone(), labels: labels.clone(), metadata: None };
                self.accept_held_alloc(pool_name(pool)?, request, alloc_id(id)?, fencing).await.map(|_| ())
            }
            Step::Label { pool, id, labels } => {
                self.label_held_alloc(pool_name(pool)?, alloc_id(id)?, labels, fencing).await
            }
            Step::End { pool, id } => self.end_held_alloc(pool_name(pool)?, alloc_id(id)?, fencing).await,
            Step::Take { namespace, token, units } => {
                match self.sched_grant(namespace, "take", fencing, token, *units).await?.as_str() {
                    "granted" => Ok(()),
                    _ => Err(StoreError::Unavailable(format!("namespace `{namespace}` has no room for {units} now"))),
                }
            }
            Step::Drop { namespace, token } => match self.sched_grant(namespace, "drop", fencing, token, 0).await {
                Ok(_) => Ok(()),
                Err(StoreError::Quotas(allot_core::LedgerError::NamespaceNotFound(_))) => Ok(()),
                Err(err) => Err(err),
            },
        }
    }

    /// Calls `lua/sched_grant.lua`; answers the reply's kind.
    async fn sched_grant(
        &self,
        namespace: &str,
        op: &str,
        fencing: u64,
        token: &str,
        units: u64,
    ) -> Result<String, StoreError> {
        let name = NamespaceName::new(namespace).map_err(corrupt)?;
        let (fencing, units) = (fencing.to_string(), units.to_string());
        let mut reply = self
            .inner
            .eval(&self.inner.scripts.sched_grant, &prefix(&name), &[op, &fencing, token, &units], true)
            .await?;
        let kind = reply.text()?;
        if kind != "err" {
            return Ok(kind);
        }
        Err(match reply.text()?.as_str() {
            "namespace_not_found" => allot_core::LedgerError::NamespaceNotFound(name).into(),
            "deposed" => StoreError::Unavailable(format!(
                "a newer scheduler (term {}) has taken over namespace `{namespace}`",
                reply.uint()?
            )),
            other => corrupt(format!("sched_grant error `{other}`")),
        })
    }

    /// Reads the pools and namespaces from Redis into the leader's mirror: the scheduler's own
    /// allocs and grants as they are, and what others hold as one lump per pool and per
    /// namespace (lapsed allocs count as held: the mirror never counts on reclaiming them).
    /// Namespaces are read only when the scheduler names them, or `also` does.
    async fn read_mirror(&self, sched: &Scheduler, also: &[NamespaceName]) -> Result<(Pools, Ledger), StoreError> {
        Ok((self.read_pools(sched).await?, self.read_ledger(sched, also).await?))
    }

    /// The pools part of the mirror.
    async fn read_pools(&self, sched: &Scheduler) -> Result<Pools, StoreError> {
        let placements = sched.live_placements();
        let mut own_allocs: HashMap<&PoolName, Vec<Alloc>> = HashMap::new();
        for p in &placements {
            own_allocs.entry(&p.pool).or_default().push(Alloc {
                pool: p.pool.clone(),
                id: p.alloc,
                resources: p.resources.clone(),
                owner: String::new(),
                labels: Default::default(),
                metadata: None,
                created: p.at,
                last_keepalive: None,
                expires: HELD,
            });
        }
        let mut pools = Vec::new();
        let mut allocs: Vec<Alloc> = Vec::new();
        let mut after = None;
        loop {
            let page = self.pools(PageRequest::new(after, 1000)).await?;
            for view in page.items {
                let mine = own_allocs.remove(&view.name).unwrap_or_default();
                let mut others = view.allocated.checked_add(&view.expired).unwrap_or_else(|| view.capacity.clone());
                for alloc in &mine {
                    others = others.saturating_sub(&alloc.resources);
                }
                if !others.is_empty() {
                    allocs.push(Alloc {
                        pool: view.name.clone(),
                        id: OTHERS_ALLOC,
                        resources: others,
                        owner: OTHERS.to_owned(),
                        labels: Default::default(),
                        metadata: None,
                        created: 0,
                        last_keepalive: None,
                        expires: HELD - 1,
                    });
                }
                allocs.extend(mine.into_iter().filter(|a| a.id != OTHERS_ALLOC));
                let settings = PoolSettings {
                    capacity: view.capacity,
                    occupied: view.occupied,
                    stopped: view.stopped,
                    labels: view.labels,
                    cordon: view.cordon,
                };
                pools.push((view.name, settings));
            }
            after = page.next;
            if after.is_none() {
                break;
            }
        }
        Pools::restore(crate::pools::rules(&self.inner), pools, allocs, Vec::new()).map_err(corrupt)
    }

    /// The namespaces part of the mirror: those the scheduler names, and `also`.
    async fn read_ledger(&self, sched: &Scheduler, also: &[NamespaceName]) -> Result<Ledger, StoreError> {
        let mut own: HashMap<NamespaceName, Vec<(Token, u64)>> = HashMap::new();
        for placement in sched.live_placements() {
            for held in &placement.grants {
                own.entry(held.namespace.clone()).or_default().push((held.token.clone(), held.units));
            }
        }
        let mut wanted = sched.namespaces_named();
        wanted.extend(own.keys().cloned());
        wanted.extend(also.iter().cloned());
        let mut namespaces = Vec::new();
        let mut grants = Vec::new();
        for name in wanted {
            let view = match self.namespace(name).await {
                Ok(view) => view,
                Err(StoreError::Quotas(allot_core::LedgerError::NamespaceNotFound(_))) => continue,
                Err(err) => return Err(err),
            };
            let mine = own.remove(&view.name).unwrap_or_default();
            let mine_units: u64 = mine.iter().map(|(_, units)| units).sum();
            // A namespace with waiters takes no one ahead of them: it looks full.
            let others = if view.waiters > 0 {
                view.quota.max(view.granted_units).saturating_sub(mine_units)
            } else {
                view.granted_units.saturating_sub(mine_units)
            };
            let grant = |token: Token, units: u64| Grant {
                namespace: view.name.clone(),
                token,
                units,
                scope: None,
                fencing: 0,
                lease: Lease::None,
                granted_at: 0,
            };
            if others > 0 {
                grants.push(grant(Token::new(OTHERS).expect("a valid token"), others));
            }
            grants.extend(mine.into_iter().map(|(token, units)| grant(token, units)));
            namespaces.push((view.name, view.quota.max(view.granted_units), 1));
        }
        Ledger::restore(namespaces, Vec::new(), Vec::new(), grants).map_err(corrupt)
    }

    /// Takes the scheduling over in term `fencing`: loads the records, settles what the last
    /// scheduler left half done, and reads the mirror.
    async fn take_over(&self, holder: &str, fencing: u64) -> Result<Leader, StoreError> {
        let config = self.inner.apps.config.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let (mut sched, intents) = self.load_app_records_and_intents(config).await?;
        // Before the first submission it decides on: a task's type is checked against them.
        let leases = allot_store::RunStore::executors(self).await?;
        sched.set_runners(allot_store::runners_of(&leases));
        let intents: Vec<Step> = if intents.is_empty() {
            Vec::new()
        } else {
            serde_json::from_str(&intents).map_err(|e| corrupt(format!("scheduler intents: {e}")))?
        };
        let (mut held, mut granted) = (HashSet::new(), HashSet::new());
        for placement in sched.live_placements() {
            held.insert(placement.alloc.to_string());
            for tokens in &placement.grants {
                granted.insert((tokens.namespace.to_string(), tokens.token.to_string()));
            }
        }
        let mut settled = 0;
        for step in &intents {
            let todo = match step {
                Step::Accept { id, .. } if held.contains(id) => None,
                Step::Take { namespace, token, .. } if granted.contains(&(namespace.clone(), token.clone())) => None,
                Step::Accept { .. } | Step::Take { .. } => undo(step),
                Step::End { .. } | Step::Drop { .. } | Step::Label { .. } => Some(step.clone()),
            };
            if let Some(todo) = todo {
                self.step(&todo, fencing).await?;
                settled += 1;
            }
        }
        self.write_app_records(holder, fencing, Some(""), &[]).await.map_err(deposed)?;
        let (pools, ledger) = self.read_mirror(&sched, &[]).await?;
        let mut leader = Leader {
            fencing,
            sched,
            pools,
            ledger,
            unfinished: Vec::new(),
            mirror_read: Some(self.inner.time.monotonic_ms()),
            executors_read: None,
            spared: None,
        };
        let mut outcome = pools_gone(&mut leader, self.now());
        let seeds = std::mem::take(&mut *self.inner.apps.seeds.lock().unwrap_or_else(|p| p.into_inner()));
        for (path, limits) in seeds {
            if leader.sched.queue(&path).is_err() {
                // A seed the tree refuses (its limits contradict what is there) is left out.
                match leader.sched.put_queue(path.clone(), limits) {
                    Ok((_, seeded)) => outcome.apps.extend(seeded.apps),
                    Err(err) => tracing::warn!(queue = %path, error = %err, "a queue of the file was not made"),
                }
            }
        }
        self.carry_out(holder, &mut leader, &outcome).await?;
        *self.inner.apps.stats.lock().unwrap_or_else(|p| p.into_inner()) = leader.sched.stats();
        tracing::info!(fencing, settled, "this daemon schedules applications");
        Ok(leader)
    }

    /// One round of the scheduler: timers, then a cycle, each carried out. Answers how long to
    /// wait before the next round.
    async fn round(&self, holder: &str, l: &mut Leader) -> Result<Duration, StoreError> {
        let now = self.now();
        // How long since a reading of the daemon's monotonic clock.
        let since = |at: Millis| Duration::from_millis(self.inner.time.monotonic_ms().saturating_sub(at));
        if l.executors_read.is_none_or(|at| since(at) >= EXECUTORS_EVERY) {
            let leases = allot_store::RunStore::executors(self).await?;
            l.executors_read = Some(self.inner.time.monotonic_ms());
            let changed = executors_changed(l, &leases, now);
            if !changed.is_empty() {
                self.carry_out(holder, l, &changed).await.map_err(StoreError::from)?;
            }
        }
        let due = l.sched.next_deadline().is_some_and(|d| d <= now);
        // The mirror is read again at most every `refresh` while something waits: what the
        // scheduler changes it changes in the mirror too, and a placement the mirror allowed but
        // Redis refuses makes it read at once. With nothing to place and no timer due, the pools
        // are still looked at now and then: a pool removed with force fails the tasks on it.
        let idle = !due && !l.sched.has_waiting();
        // Room was made by some daemon: what waits is looked at again on the pools and
        // namespaces as they are now, not up to `refresh` later.
        if self.inner.apps.room_made.swap(false, Ordering::SeqCst) && !idle {
            l.mirror_read = None;
        }
        let age = l.mirror_read.map(since);
        if idle && age.is_some_and(|age| age < IDLE_LOOK) {
            return Ok(self.idle_wait(l, now));
        }
        if idle || age.is_none_or(|age| age >= self.inner.apps.refresh) {
            (l.pools, l.ledger) = self.read_mirror(&l.sched, &[]).await?;
            l.mirror_read = Some(self.inner.time.monotonic_ms());
        }
        let gone = pools_gone(l, now);
        if !gone.is_empty() {
            self.carry_out(holder, l, &gone).await.map_err(StoreError::from)?;
        }
        if due {
            let (_, outcome) = l.sched.run_timers(now, &mut World { pools: &mut l.pools, ledger: &mut l.ledger });
            self.carry_out(holder, l, &outcome).await.map_err(StoreError::from)?;
        }
        let tenancy = self.inner.apps.config.lock().unwrap_or_else(|p| p.into_inner()).tenancy.clone();
        l.sched.set_tenancy(tenancy);
        let (report, outcome) =
            l.sched.schedule(now, &mut World { pools: &mut l.pools, ledger: &mut l.ledger }, &mut || {
                self.inner.ids.next_u64()
            });
        if report.placed + report.reserved + report.taken_over > 0 {
            tracing::debug!(?report, "scheduling cycle");
        }
        match self.carry_out(holder, l, &outcome).await {
            Ok(()) => {}
            Err(Carry::Refused(err)) => {
                // Nothing of the cycle was kept: the records are as before it. Load them and
                // decide again on a fresh mirror.
                tracing::debug!(error = %err, "a cycle's placements were refused; deciding again");
                let (mut sched, _) = self.load_app_records_and_intents(l.sched.config().clone()).await?;
                sched.carry_stats(l.sched.stats());
                sched.set_runners(l.sched.runners().clone());
                l.sched = sched;
                l.mirror_read = None;
            }
            Err(Carry::Failed(err)) => return Err(err),
        }
        *self.inner.apps.stats.lock().unwrap_or_else(|p| p.into_inner()) = l.sched.stats();
        Ok(self.idle_wait(l, now))
    }

    fn idle_wait(&self, l: &Leader, now: Millis) -> Duration {
        let mut wait = if l.sched.has_waiting() { RETRY_INTERVAL } else { RENEW_EVERY };
        if let Some(deadline) = l.sched.next_deadline() {
            wait = wait.min(Duration::from_millis(deadline.saturating_sub(now)));
        }
        wait
    }
}

/// Why an outcome was not carried out.
#[derive(Debug)]
enum Carry {
    /// A placement could not be made (another client took the room or the tokens since the
    /// mirror was read): what was made is undone, nothing was recorded.
    Refused(StoreError),
    /// Redis failed, or the lease moved on: the records may be behind the scheduler in memory.
    Failed(StoreError),
}

impl From<StoreError> for Carry {
    fn from(err: StoreError) -> Carry {
        Carry::Failed(err)
    }
}

impl From<Carry> for StoreError {
    fn from(carry: Carry) -> StoreError {
        match carry {
            Carry::Refused(err) | Carry::Failed(err) => err,
        }
    }
}

/// Fails the placements on pools that are gone (removed with force, by any daemon): their
/// tasks fail, and gangs lose their reservations (`Scheduler::pool_removed`).
fn pools_gone(l: &mut Leader, now: Millis) -> Outcome {
    let gone: HashSet<PoolName> = l
        .sched
        .live_placements()
        .into_iter()
        .filter(|p| l.pools.allocs(&p.pool).is_err())
        .map(|p| p.pool.clone())
        .collect();
    let mut outcome = Outcome::default();
    for pool in gone {
        let lost = l.sched.pool_removed(&pool, now, &mut World { pools: &mut l.pools, ledger: &mut l.ledger });
        outcome.apps.extend(lost.apps);
        outcome.pools.extend(lost.pools);
        outcome.ledger.changes.extend(lost.ledger.changes);
    }
    outcome
}

/// Takes the pools of executors whose leases lapsed as lost (their placed tasks go back to
/// waiting, to be placed elsewhere), unless a live executor runs them too; a lost pool that a live
/// executor runs again is back.
fn executors_changed(l: &mut Leader, leases: &[allot_store::ExecutorLease], now: Millis) -> Outcome {
    l.sched.set_runners(allot_store::runners_of(leases));
    let live: HashSet<&PoolName> = leases.iter().filter(|e| e.live).flat_map(|e| &e.pools).collect();
    let back: Vec<PoolName> = l.sched.down_pools().iter().filter(|p| live.contains(p)).cloned().collect();
    for pool in back {
        tracing::info!(%pool, "an executor runs this pool again: it takes placements");
        l.sched.pool_back(&pool);
    }
    let mut outcome = Outcome::default();
    for lease in leases.iter().filter(|e| !e.live) {
        for pool in &lease.pools {
            if live.contains(pool) || l.sched.down_pools().contains(pool) {
                continue;
            }
            let reason = format!("the daemon that runs pool `{pool}` ({}) stopped", lease.node);
            tracing::warn!(%pool, node = %lease.node, "the executor of this pool stopped: its tasks are placed again");
            let lost = l.sched.pool_lost(pool, &reason, now, &mut World { pools: &mut l.pools, ledger: &mut l.ledger });
            outcome.apps.extend(lost.apps);
            outcome.pools.extend(lost.pools);
            outcome.ledger.changes.extend(lost.ledger.changes);
        }
    }
    outcome
}

/// The election: takes or renews the lease every [`RENEW_EVERY`], and says who schedules.
async fn run_lease(inner: Arc<Inner>, holder: String) {
    let store = RedisStore { inner: inner.clone(), tasks: Mutex::new(Vec::new()) };
    loop {
        let asked = inner.time.monotonic_ms();
        store.renew_lease(&holder).await;
        let spent = Duration::from_millis(inner.time.monotonic_ms().saturating_sub(asked));
        tokio::time::sleep(RENEW_EVERY.saturating_sub(spent)).await;
    }
}

// Repeated warnings of an outage, written a few times rather than at every retry.
static LEASE_UNREACHABLE: Quiet = Quiet::new();
static TAKEOVER_FAILED: Quiet = Quiet::new();
static ROUND_FAILED: Quiet = Quiet::new();

/// The scheduling rounds, while this daemon holds the lease; a new term loads the records first.
async fn run(inner: Arc<Inner>) {
    let store = RedisStore { inner: inner.clone(), tasks: Mutex::new(Vec::new()) };
    let Some(holder) = inner.apps.holder() else { return };
    let mut shutdown = inner.shutdown.subscribe();
    loop {
        let wait = store.scheduling_turn(&holder).await;
        let woken = tokio::select! {
            _ = inner.apps.wake.notified() => true,
            _ = tokio::time::sleep(wait) => false,
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        if woken {
            // A short pause lets the calls that follow join the same round.
            tokio::time::sleep(ROUND_GAP).await;
        }
    }
}
