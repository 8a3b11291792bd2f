//! The token quotas of the embedded store: each operation is the ledger's, made durable through
//! the write-ahead log; and the allocate calls that wait in a namespace's queue for their answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use allot_core::{
    AllocateRequest, Change, Decision, Effects, Millis, NamespaceName, NamespaceView, QueuePlace, Refusal, SessionId,
    Token, WaiterId, WaiterView,
};
use async_trait::async_trait;
use tokio::sync::oneshot;

use super::ops::{Key, Op, Table};
use allot_core::watch::EventKind;

use super::{
    durable, feed, grant_info, lock, session_info, Commit, EmbeddedStore, Shared, State, WaiterAnswer, Waiting,
};
use crate::records::{encode, GrantRecord, NamespaceRecord, SessionRecord};
use crate::{check_wait, Allocation, GrantInfo, Page, PageRequest, QuotaStore, SessionInfo, StoreError};

/// The writes of ledger changes.
pub(super) fn ops<'a>(changes: impl Iterator<Item = &'a Change>, out: &mut Vec<Op>) {
    for change in changes {
        match change {
            Change::Namespace { name, quota, next_fencing, .. } => {
                let record = NamespaceRecord { quota: *quota, next_fencing: *next_fencing };
                out.push(Op::put(Table::Namespaces, Op::name(name.as_str()), encode(&record)));
                out.push(Op::Remove(Table::RetiredFencing, Op::name(name.as_str())));
            }
            Change::NamespaceRemoved { name, next_fencing } => {
                out.push(Op::Remove(Table::Namespaces, Op::name(name.as_str())));
                let fencing = next_fencing.to_le_bytes().to_vec();
                out.push(Op::put(Table::RetiredFencing, Op::name(name.as_str()), fencing));
                out.push(Op::RemoveUnder(Table::Grants, name.as_str().to_owned()));
            }
            Change::Grant(grant) => {
                let key = Op::pair(grant.namespace.as_str(), grant.token.as_str());
                out.push(Op::put(Table::Grants, key, encode(&GrantRecord::from_grant(grant))));
            }
            Change::GrantAdded(grant) => {
                let key = Op::pair(grant.namespace.as_str(), grant.token.as_str());
                out.push(Op::Create(Table::Grants, key, encode(&GrantRecord::from_grant(grant))));
            }
            Change::GrantRemoved { grant: allot_core::Grant { namespace, token, .. }, .. } => {
                out.push(Op::Remove(Table::Grants, Op::pair(namespace.as_str(), token.as_str())));
            }
            Change::Session { id, ttl_ms, deadline, owner, .. } => {
                let record = SessionRecord { ttl_ms: *ttl_ms, deadline: *deadline, owner: owner.clone() };
                out.push(Op::put(Table::Sessions, Key::Id(id.0), encode(&record)));
            }
            Change::SessionRemoved { id, .. } => out.push(Op::Remove(Table::Sessions, Key::Id(id.0))),
        }
    }
}

#[async_trait]
impl QuotaStore for EmbeddedStore {
    async fn put_namespace(&self, name: NamespaceName, quota: u64) -> Result<(bool, NamespaceView), StoreError> {
        self.mutate(|ledger, now| {
            let (created, effects) = ledger.put_namespace(&name, quota, now)?;
            Ok(((created, ledger.namespace(&name, now)?), effects))
        })
        .await
    }

    async fn seed_namespace(&self, name: NamespaceName, quota: u64) -> Result<(bool, NamespaceView), StoreError> {
        // Checked and created under one lock: a seed never overwrites a quota.
        self.mutate(|ledger, now| {
            if let Ok(view) = ledger.namespace(&name, now) {
                return Ok(((false, view), Effects::default()));
            }
            let (created, effects) = ledger.put_namespace(&name, quota, now)?;
            Ok(((created, ledger.namespace(&name, now)?), effects))
        })
        .await
    }

    async fn remove_namespace(&self, name: NamespaceName, force: bool) -> Result<usize, StoreError> {
        self.mutate(|ledger, _| ledger.remove_namespace(&name, force)).await
    }

    async fn namespaces(
        &self,
        page: PageRequest<NamespaceName>,
    ) -> Result<Page<NamespaceView, NamespaceName>, StoreError> {
        let limit = page.limit();
        self.read(|ledger, now| {
            let views = ledger.namespaces_after(page.after(), limit + 1, now);
            Ok(Page::from_read(views, limit, |v| v.name.clone()))
        })
    }

    async fn namespace(&self, name: NamespaceName) -> Result<NamespaceView, StoreError> {
        self.read(|ledger, now| ledger.namespace(&name, now))
    }

    /// Not an `async fn`: the ledger decides at once, under the lock, and the future returned
    /// holds only what its answer waits for (a commit, or a place in the queue). A daemon may hold
    /// 100,000 waiting calls; an `async fn` would keep the request beside the wait.
    fn allocate<'life0, 'async_trait>(
        &'life0 self,
        request: AllocateRequest,
        wait: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<Allocation, StoreError>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        self.allocate_as(request, wait, false)
    }

    async fn allocate_held(&self, request: AllocateRequest, wait: Duration) -> Result<Allocation, StoreError> {
        self.allocate_as(request, wait, true).await
    }

    async fn release_held(&self, namespace: NamespaceName, token: Token) -> Result<Option<GrantInfo>, StoreError> {
        self.mutate(|ledger, now| {
            let (grant, effects) = ledger.release_held(&namespace, &token, now)?;
            Ok((grant.map(|g| grant_info(ledger, g, now)), effects))
        })
        .await
    }

    async fn release(
        &self,
        namespace: NamespaceName,
        token: Token,
        fencing: Option<u64>,
    ) -> Result<Option<GrantInfo>, StoreError> {
        self.mutate(|ledger, now| {
            let (grant, effects) = ledger.release(&namespace, &token, fencing, now)?;
            Ok((grant.map(|g| grant_info(ledger, g, now)), effects))
        })
        .await
    }

    async fn keepalive_grant(
        &self,
        namespace: NamespaceName,
        token: Token,
        fencing: Option<u64>,
    ) -> Result<GrantInfo, StoreError> {
        self.mutate(|ledger, now| {
            let (grant, effects) = ledger.keepalive_grant(&namespace, &token, fencing, now)?;
            Ok((grant_info(ledger, grant, now), effects))
        })
        .await
    }

    async fn grants(
        &self,
        namespace: NamespaceName,
        page: PageRequest<Token>,
    ) -> Result<Page<GrantInfo, Token>, StoreError> {
        let limit = page.limit();
        self.read(|ledger, now| {
            let grants = ledger.grants_after(&namespace, page.after(), limit + 1)?;
            let infos = grants.into_iter().map(|g| grant_info(ledger, g, now)).collect();
            Ok(Page::from_read(infos, limit, |g: &GrantInfo| g.grant.token.clone()))
        })
    }

    async fn grant(&self, namespace: NamespaceName, token: Token) -> Result<GrantInfo, StoreError> {
        self.read(|ledger, now| Ok(grant_info(ledger, ledger.grant(&namespace, &token)?, now)))
    }

    async fn waiters(
        &self,
        namespace: NamespaceName,
        page: PageRequest<u64>,
    ) -> Result<Page<WaiterView, u64>, StoreError> {
        let limit = page.limit();
        self.read(|ledger, now| {
            let waiters = ledger.waiters_after(&namespace, page.after().copied(), limit + 1, now)?;
            Ok(Page::from_read(waiters, limit, |w| w.arrival))
        })
    }

    async fn open_session(&self, ttl_ms: u64, owner: Option<String>) -> Result<SessionInfo, StoreError> {
        let id = SessionId(self.shared.ids.next_u128());
        self.mutate(|ledger, now| {
            let (session, effects) = ledger.open_session(id, ttl_ms, owner, now)?;
            Ok((session_info(session, now), effects))
        })
        .await
    }

    async fn keepalive_session(&self, id: SessionId) -> Result<SessionInfo, StoreError> {
        self.mutate(|ledger, now| {
            let (session, effects) = ledger.keepalive_session(id, now)?;
            Ok((session_info(session, now), effects))
        })
        .await
    }

    async fn close_session(&self, id: SessionId) -> Result<SessionInfo, StoreError> {
        self.mutate(|ledger, now| {
            let (session, effects) = ledger.close_session(id, now)?;
            Ok((session_info(session, now), effects))
        })
        .await
    }

    async fn sessions(&self, page: PageRequest<SessionId>) -> Result<Page<SessionInfo, SessionId>, StoreError> {
        let limit = page.limit();
        self.read(|ledger, now| {
            let sessions = ledger.sessions_after(page.after().copied(), limit + 1);
            let infos = sessions.into_iter().map(|s| session_info(s, now)).collect();
            Ok(Page::from_read(infos, limit, |s: &SessionInfo| s.session.id))
        })
    }

    async fn session(&self, id: SessionId) -> Result<SessionInfo, StoreError> {
        self.read(|ledger, now| Ok(session_info(ledger.session(id)?, now)))
    }
}

/// What an allocate call does once the ledger decided (and the lock is released).
enum Then {
    /// Waits for the grant's commit (an idempotent retry for the commit of the grant it
    /// repeats), then answers it with its lease as of the decision.
    Commit { rx: Commit, info: GrantInfo, existing: bool, at: Millis },
    /// A refusal changed nothing; it is answered once what it saw is durable.
    Refuse { rx: Commit, answer: Result<Allocation, StoreError> },
    /// Queued: waits for its answer.
    Wait { namespace: NamespaceName, waiter: WaiterId, answer: oneshot::Receiver<WaiterAnswer> },
}

impl EmbeddedStore {
    /// An allocate call: a client's, or (`held`) one of allot's own tokens for a task's run.
    fn allocate_as(
        &self,
        request: AllocateRequest,
        wait: Duration,
        held: bool,
    ) -> Pin<Box<dyn Future<Output = Result<Allocation, StoreError>> + Send + '_>> {
        match self.decide_allocate(request, wait, held) {
            Err(err) => Box::pin(std::future::ready(Err(err))),
            Ok(Then::Commit { rx, mut info, existing, at }) => Box::pin(async move {
                durable(rx).await?;
                // The time the commit took counts against the lease.
                let waited = self.shared.clock.now().saturating_sub(at);
                info.expires_in_ms = info.expires_in_ms.map(|left| left.saturating_sub(waited));
                Ok(Allocation::Granted { grant: info, existing })
            }),
            Ok(Then::Refuse { rx, answer }) => Box::pin(async move {
                durable(rx).await?;
                answer
            }),
            Ok(Then::Wait { namespace, waiter, answer }) => Box::pin(self.wait_for(namespace, waiter, answer, wait)),
        }
    }

    /// The ledger's decision on an allocate call, under the lock: granted, refused or queued.
    fn decide_allocate(&self, request: AllocateRequest, wait: Duration, held: bool) -> Result<Then, StoreError> {
        check_wait(wait)?;
        let mut state = self.lock();
        state.usable(&self.shared)?;
        let now = self.shared.clock.now();
        let (namespace, token) = (request.namespace.clone(), request.token.clone());
        let decided = if held {
            state.ledger.allocate_held(request, now, !wait.is_zero())
        } else {
            state.ledger.allocate(request, now, !wait.is_zero())
        };
        Ok(match decided {
            Err(err) => Then::Refuse { rx: state.barrier(&self.shared, now), answer: Err(err.into()) },
            Ok((decision, effects)) => match decision {
                Decision::Granted { grant, existing } => {
                    let info = grant_info(&state.ledger, grant, now);
                    Then::Commit { rx: state.submit(&self.shared, effects, now), info, existing, at: now }
                }
                Decision::Refused { refusal, place } => {
                    let answer = Ok(Allocation::Refused { refusal, place });
                    Then::Refuse { rx: state.barrier(&self.shared, now), answer }
                }
                Decision::Queued { waiter, replaced, .. } => {
                    let (tx, answer) = oneshot::channel();
                    state.waiters.insert(waiter, Waiting { tx, namespace: namespace.clone(), token: token.clone() });
                    match replaced {
                        // Dropping the old sender tells the older call it was taken over; the
                        // waiter goes on under the same token.
                        Some(old) => drop(state.waiters.remove(&old)),
                        None => {
                            state.drafts.push(feed::waiter(EventKind::WaiterQueued, &namespace, &token, None));
                            state.flush_drafts(&self.shared);
                        }
                    }
                    Then::Wait { namespace, waiter, answer }
                }
            },
        })
    }

    /// Waits for a queued allocate call's answer, until `wait` ends (or the store, shutting down,
    /// answers it). (Its state is made here and captured, not passed to an `async fn`, which would
    /// keep both.)
    fn wait_for(
        &self,
        namespace: NamespaceName,
        waiter: WaiterId,
        mut answer: oneshot::Receiver<WaiterAnswer>,
        wait: Duration,
    ) -> impl Future<Output = Result<Allocation, StoreError>> + Send + '_ {
        let mut guard = WaiterGuard { shared: &self.shared, namespace, waiter, armed: true };
        async move {
            // At a shutdown the store answers every waiter (`refuse_every_waiter`).
            tokio::select! {
                res = &mut answer => {
                    guard.disarm();
                    return self.answer_of(res);
                }
                _ = tokio::time::sleep(wait) => {}
            }
            guard.disarm();
            let cancelled = self.lock().cancel_wait(&self.shared, &guard.namespace, guard.waiter, "timed_out");
            match cancelled {
                Some((refusal, place, rx)) => {
                    // Those woken by this cancellation are answered by the committer; this caller
                    // only needs its own answer.
                    drop(rx);
                    Ok(Allocation::Refused { refusal, place: Some(place) })
                }
                // Granted or cancelled meanwhile: the answer is on its way.
                None => self.answer_of(answer.await),
            }
        }
    }

    fn answer_of(&self, answer: Result<WaiterAnswer, oneshot::error::RecvError>) -> Result<Allocation, StoreError> {
        match answer {
            Ok(WaiterAnswer::Granted(grant)) => {
                let state = self.lock();
                let info = grant_info(&state.ledger, grant, self.shared.clock.now());
                Ok(Allocation::Granted { grant: info, existing: false })
            }
            Ok(WaiterAnswer::Cancelled(err)) => Err(err.into()),
            Ok(WaiterAnswer::Failed(err)) => Err(err),
            Ok(WaiterAnswer::Refused(refusal, place)) => Ok(Allocation::Refused { refusal, place: Some(place) }),
            // A newer call with the same token took this waiter's place.
            Err(_) => Err(StoreError::Invalid("a newer allocate call with the same token took over this wait".into())),
        }
    }
}

/// Takes a waiter out of the queue if its caller goes away before an answer.
struct WaiterGuard<'a> {
    shared: &'a Arc<Shared>,
    namespace: NamespaceName,
    waiter: WaiterId,
    armed: bool,
}

impl WaiterGuard<'_> {
    /// The call is answered: nothing to undo when it ends.
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        drop(lock(self.shared).cancel_wait(self.shared, &self.namespace, self.waiter, "caller_left"));
    }
}

impl State {
    /// Takes every waiting call out of its queue, each answered with where it stood (the store
    /// shuts down). From the back of each queue: no one leaving lets in one behind it.
    pub(super) fn refuse_every_waiter(&mut self, shared: &Shared) {
        let mut waiting: Vec<(u64, WaiterId, NamespaceName)> = self
            .waiters
            .iter()
            .filter_map(|(id, w)| Some((self.ledger.waiter_arrival(&w.namespace, *id)?, *id, w.namespace.clone())))
            .collect();
        waiting.sort_unstable_by_key(|&(arrival, ..)| std::cmp::Reverse(arrival));
        for (_, waiter, namespace) in waiting {
            if let Some((refusal, place, _, Some(waiting))) =
                self.take_waiter(shared, &namespace, waiter, "shutting_down")
            {
                let _ = waiting.tx.send(WaiterAnswer::Refused(refusal, place));
            }
        }
    }

    /// Takes a waiting call out of its namespace's queue, if it is still there (not granted or
    /// cancelled meanwhile): its refusal and place, and the commit of what its leaving changed
    /// (those it made room for are admitted and answered by the committer).
    fn cancel_wait(
        &mut self,
        shared: &Shared,
        namespace: &NamespaceName,
        waiter: WaiterId,
        cause: &str,
    ) -> Option<(Refusal, QueuePlace, Commit)> {
        let (refusal, place, commit, _) = self.take_waiter(shared, namespace, waiter, cause)?;
        Some((refusal, place, commit))
    }

    /// [`State::cancel_wait`], and the call's waiting entry (where its answer goes), if it has one.
    fn take_waiter(
        &mut self,
        shared: &Shared,
        namespace: &NamespaceName,
        waiter: WaiterId,
        cause: &str,
    ) -> Option<(Refusal, QueuePlace, Commit, Option<Waiting>)> {
        let now = shared.clock.now();
        let (refusal, place, effects) = self.ledger.cancel_waiter(namespace, waiter, now)?;
        let waiting = self.gave_up(waiter, cause);
        Some((refusal, place, self.submit(shared, effects, now), waiting))
    }
}
