//! Token quotas over time, on the Redis functions and on `allot_core::Ledger`, both at the times a
//! [`TestClock`] sets: TTL leases and their keepalives, sessions (open, keepalive, close; the
//! grants held under one end with it), expiry (the clock moves on, then both sweep), and waiting
//! calls. Every step compares the answer (status, units, scope, lease, fencing number, time
//! left), then the whole state: each namespace's numbers, grants and queue, and the sessions.
//! A waiting call is answered when the core says its waiter was granted or cancelled, with the
//! same grant: the fencing numbers give the order in which the queue was served.
//!
//! Not generated: a waiting call under a session that ends while it waits. The core cancels such
//! a waiter when its session ends, by close or by expiry; the Redis functions do so on close, but
//! after an expiry the waiter stays queued (holding up the ones behind it) until its turn comes
//! or its wait ends, and only then is answered `session_not_found`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_core::{
    AllocateRequest, Constraints, Decision, Effects, Grant, Lease, LeaseRequest, Ledger, LedgerError, Millis,
    NamespaceName, Scope, Session, SessionId, Token, WaiterId,
};
use allot_store::prelude::*;
use allot_store::{read_all, Allocation, Store, StoreError};
use allot_store_redis::testing::{RedisServer, TestClock};
use allot_store_redis::RedisStore;
use tokio::task::JoinHandle;

use super::{generator, Rng, Trail};

const SEEDS: u64 = 30;
const STEPS: usize = 150;
/// How long a waiting call waits: longer than a sequence lasts, in Redis's time and in real time.
const WAIT: Duration = allot_store::MAX_WAIT;
/// How long a step may wait for a call's answer to arrive from Redis.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
enum Op {
    Put {
        ns: usize,
        quota: u64,
    },
    Remove {
        ns: usize,
        force: bool,
    },
    Allocate {
        ns: usize,
        request: AllocateRequest,
        session: Option<usize>,
        wait: bool,
    },
    Release {
        ns: usize,
        token: Token,
    },
    Keepalive {
        ns: usize,
        token: Token,
    },
    OpenSession {
        slot: usize,
        ttl_ms: u64,
    },
    KeepaliveSession {
        slot: usize,
    },
    CloseSession {
        slot: usize,
    },
    /// The clock moves on by this many ms; both sweep.
    Advance(u64),
}

/// A token's units and lease follow from its number (so that a token asked again is mostly a
/// retry, not a conflict): t0, t3, t6 hold no lease, t1, t4, t7 a TTL, t2, t5 a session's.
fn random_op(rng: &mut Rng, names: &[NamespaceName], slots: usize) -> Op {
    let ns = rng.below(names.len() as u64) as usize;
    let number = rng.below(8);
    let token = Token::new(&format!("t{number}")).unwrap();
    let slot = rng.below(slots as u64) as usize;
    match rng.below(40) {
        0..=1 => Op::Put { ns, quota: 3 + rng.below(8) },
        2 => Op::Remove { ns, force: rng.below(3) == 0 },
        3..=17 => {
            // A scope half the time (mostly the token's own); a cap on it now and then.
            let scope = number.is_multiple_of(2).then(|| {
                let (project, namespace) = match rng.below(8) {
                    0 => ("p2", "dev"),
                    _ => (["p1", "p2"][(number / 2 % 2) as usize], "prod"),
                };
                Scope::new(project, namespace).unwrap()
            });
            let mut cap = || (scope.is_some() && rng.below(4) == 0).then(|| 1 + rng.below(6));
            let constraints = Constraints { project: cap(), namespace: cap() };
            let (lease, session) = match number % 3 {
                0 => (LeaseRequest::None, None),
                1 => (LeaseRequest::Ttl { ttl_ms: 500 + 100 * rng.below(26) }, None),
                // The session's id is known when the step runs.
                _ => (LeaseRequest::None, Some(slot)),
            };
            let wait = session.is_none() && rng.below(3) == 0;
            let request = AllocateRequest {
                namespace: names[ns].clone(),
                token,
                units: 1 + number / 3,
                scope,
                constraints,
                lease,
            };
            Op::Allocate { ns, request, session, wait }
        }
        18..=23 => Op::Release { ns, token },
        24..=26 => Op::Keepalive { ns, token },
        27..=29 => Op::OpenSession { slot, ttl_ms: 1000 + 100 * rng.below(51) },
        30..=31 => Op::KeepaliveSession { slot },
        32 => Op::CloseSession { slot },
        _ => Op::Advance(100 + 100 * rng.below(10)),
    }
}

/// A call that waits in Redis, and its waiter in the core's queue.
struct Waiting {
    ns: usize,
    token: Token,
    call: JoinHandle<Result<Allocation, StoreError>>,
}

/// One sequence: the store and the core, side by side.
struct Sequence<'a> {
    store: &'a Arc<RedisStore>,
    clock: &'a mut TestClock,
    ledger: Ledger,
    names: Vec<NamespaceName>,
    /// The session of each slot: one that was never opened, or the last one opened there.
    sessions: Vec<SessionId>,
    waiting: HashMap<WaiterId, Waiting>,
    trail: Trail,
}

/// An answer as both sides can give it: the error of a refusal as the core words it.
fn core_error<T>(result: Result<T, StoreError>) -> Result<T, LedgerError> {
    result.map_err(|err| match err {
        StoreError::Quotas(err) => err,
        other => panic!("Redis failed: {other}"),
    })
}

impl Sequence<'_> {
    fn now(&self) -> Millis {
        self.clock.now()
    }

    /// The time a grant's lease has left, as the core holds it.
    fn expires_in(&self, grant: &Grant) -> Option<u64> {
        match grant.lease {
            Lease::None => None,
            Lease::Ttl { deadline, .. } => Some(deadline.saturating_sub(self.now())),
            Lease::Session(id) => Some(self.ledger.session(id).map_or(0, |s| s.deadline.saturating_sub(self.now()))),
        }
    }

    async fn run(&mut self, op: Op) {
        self.trail.step(&op);
        let now = self.now();
        let effects = match op {
            Op::Put { ns, quota } => {
                let redis = core_error(self.store.put_namespace(self.names[ns].clone(), quota).await);
                let core = self.ledger.put_namespace(&self.names[ns], quota, now);
                self.agree_then(redis.map(|(created, _)| created), core)
            }
            Op::Remove { ns, force } => {
                let redis = core_error(self.store.remove_namespace(self.names[ns].clone(), force).await);
                let core = self.ledger.remove_namespace(&self.names[ns], force);
                self.agree_then(redis, core)
            }
            Op::Allocate { ns, mut request, session, wait } => {
                if let Some(slot) = session {
                    request.lease = LeaseRequest::Session(self.sessions[slot]);
                }
                // A token that waits already is asked again without waiting (a second waiting
                // call would take the wait over from the first).
                let wait = wait && !self.waiting.values().any(|w| w.ns == ns && w.token == request.token);
                match wait {
                    true => self.allocate_waiting(ns, request).await,
                    false => self.allocate_now(request).await,
                }
            }
            Op::Release { ns, token } => {
                let redis = core_error(self.store.release(self.names[ns].clone(), token.clone(), None).await);
                let core = self.ledger.release(&self.names[ns], &token, None, now);
                self.agree_then(redis.map(|g| g.map(|g| g.grant)), core)
            }
            Op::Keepalive { ns, token } => {
                let redis = core_error(self.store.keepalive_grant(self.names[ns].clone(), token.clone(), None).await);
                let core = self.ledger.keepalive_grant(&self.names[ns], &token, None, now);
                let answer = |(grant, _): &(Grant, Effects)| (grant.clone(), self.expires_in(grant));
                let core_answer = core.as_ref().map(answer).map_err(Clone::clone);
                self.trail.agree("the answer", redis.map(|g| (g.grant, g.expires_in_ms)), core_answer);
                core.map(|(_, effects)| effects).unwrap_or_default()
            }
            Op::OpenSession { slot, ttl_ms } => {
                let redis = core_error(self.store.open_session(ttl_ms, None).await);
                let id = redis.as_ref().map_or(self.sessions[slot], |info| info.session.id);
                let core = self.ledger.open_session(id, ttl_ms, None, now);
                self.sessions[slot] = id;
                self.agree_then(redis.map(|info| info.session), core)
            }
            Op::KeepaliveSession { slot } => {
                let redis = core_error(self.store.keepalive_session(self.sessions[slot]).await);
                let core = self.ledger.keepalive_session(self.sessions[slot], now);
                self.agree_then(redis.map(|info| info.session), core)
            }
            Op::CloseSession { slot } => {
                let redis = core_error(self.store.close_session(self.sessions[slot]).await);
                let core = self.ledger.close_session(self.sessions[slot], now);
                self.agree_then(redis.map(|info| info.session), core)
            }
            Op::Advance(ms) => {
                let now = now + ms;
                self.clock.set(self.store, now).await;
                self.ledger.expire(now)
            }
        };
        self.answer_waiting(effects).await;
        self.compare_state().await;
    }

    /// Checks that both answered the same, and passes the core's effects on.
    #[track_caller]
    fn agree_then<R: PartialEq + std::fmt::Debug, C: Clone + Into<R>>(
        &self,
        redis: Result<R, LedgerError>,
        core: Result<(C, Effects), LedgerError>,
    ) -> Effects {
        let core_answer = core.as_ref().map(|(answer, _)| answer.clone().into()).map_err(Clone::clone);
        self.trail.agree("the answer", redis, core_answer);
        core.map(|(_, effects)| effects).unwrap_or_default()
    }

    async fn allocate_now(&mut self, request: AllocateRequest) -> Effects {
        let redis = core_error(self.store.allocate(request.clone(), Duration::ZERO).await).map(|a| self.answer_of(a));
        let core = self.ledger.allocate(request, self.now(), false);
        let core_answer = core.as_ref().map(|(decision, _)| self.decided(decision)).map_err(Clone::clone);
        self.trail.agree("the answer", redis, core_answer);
        core.map(|(_, effects)| effects).unwrap_or_default()
    }

    /// A call that may wait: if the core queues it, it must wait in Redis too (its token in the
    /// namespace's queue); if not, both answer now.
    async fn allocate_waiting(&mut self, ns: usize, request: AllocateRequest) -> Effects {
        let store = self.store.clone();
        let asked = request.clone();
        let call = tokio::spawn(async move { store.allocate(asked, WAIT).await });
        let core = self.ledger.allocate(request.clone(), self.now(), true);
        match core {
            Ok((Decision::Queued { waiter, replaced, .. }, effects)) => {
                self.trail.agree("a waiter taken over", replaced, None);
                self.until_queued(ns, &request.token, &call).await;
                self.waiting.insert(waiter, Waiting { ns, token: request.token, call });
                effects
            }
            core => {
                let redis = core_error(self.answer_of_call(call).await).map(|a| self.answer_of(a));
                let core_answer = core.as_ref().map(|(decision, _)| self.decided(decision)).map_err(Clone::clone);
                self.trail.agree("the answer", redis, core_answer);
                core.map(|(_, effects)| effects).unwrap_or_default()
            }
        }
    }

    /// Waits until `token` is in the queue of namespace `ns` in Redis; fails if the call is
    /// answered instead.
    async fn until_queued(&self, ns: usize, token: &Token, call: &JoinHandle<Result<Allocation, StoreError>>) {
        let started = Instant::now();
        loop {
            let waiters = read_all(|page| self.store.waiters(self.names[ns].clone(), page)).await.unwrap();
            if waiters.iter().any(|w| &w.token == token) {
                return;
            }
            self.trail.agree("the call waits", !call.is_finished(), true);
            self.trail.agree("the call waits within 5 s", started.elapsed() < ANSWER_WITHIN, true);
            // Polls Redis's queue, checking at each look that the call still waits.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// The waiting calls the core answered by this step must be answered in Redis, with the same
    /// grant or error; the others still wait.
    async fn answer_waiting(&mut self, effects: Effects) {
        let mut answered: Vec<(WaiterId, Result<String, LedgerError>)> = Vec::new();
        for woken in &effects.woken {
            let answer = Decision::Granted { grant: woken.grant.clone(), existing: false };
            answered.push((woken.waiter, Ok(self.decided(&answer))));
        }
        for (waiter, err) in effects.cancelled {
            answered.push((waiter, Err(err)));
        }
        for (waiter, core) in answered {
            let waiting = self.waiting.remove(&waiter).expect("the core answers a waiter of this test");
            let redis = core_error(self.answer_of_call(waiting.call).await).map(|a| self.answer_of(a));
            self.trail.agree(&format!("the answer of the call that waited for {}", waiting.token), redis, core);
        }
        for waiting in self.waiting.values() {
            self.trail.agree(&format!("the call for {} still waits", waiting.token), waiting.call.is_finished(), false);
        }
    }

    /// The answer of a call that waited, once Redis gives it.
    async fn answer_of_call(&self, call: JoinHandle<Result<Allocation, StoreError>>) -> Result<Allocation, StoreError> {
        match tokio::time::timeout(ANSWER_WITHIN, call).await {
            Ok(answer) => answer.expect("the call does not panic"),
            Err(_) => self.trail.fail(&format!("Redis gave no answer within {ANSWER_WITHIN:?}")),
        }
    }

    /// An answer of the store, in words both sides can give.
    fn answer_of(&self, allocation: Allocation) -> String {
        match allocation {
            Allocation::Granted { grant, existing } => {
                format!("granted {:?} existing {existing}, {:?} ms left", grant.grant, grant.expires_in_ms)
            }
            Allocation::Refused { refusal, place } => format!("refused {refusal:?} {place:?}"),
        }
    }

    /// A decision of the core, in the same words.
    fn decided(&self, decision: &Decision) -> String {
        match decision {
            Decision::Granted { grant, existing } => {
                format!("granted {grant:?} existing {existing}, {:?} ms left", self.expires_in(grant))
            }
            Decision::Refused { refusal, place } => format!("refused {refusal:?} {place:?}"),
            Decision::Queued { .. } => "queued".to_owned(),
        }
    }

    /// Each namespace's numbers, grants and queue, and every session, on both.
    async fn compare_state(&self) {
        let now = self.now();
        for name in &self.names {
            let redis = core_error(self.store.namespace(name.clone()).await);
            self.trail.agree(&format!("namespace {name}"), redis, self.ledger.namespace(name, now));
            let redis = core_error(read_all(|page| self.store.grants(name.clone(), page)).await);
            let core = self.ledger.grants(name);
            self.trail.agree(
                &format!("the grants of {name}"),
                redis.map(|grants| grants.into_iter().map(|g| (g.grant, g.expires_in_ms)).collect::<Vec<_>>()),
                core.map(|grants| grants.into_iter().map(|g| (g.clone(), self.expires_in(&g))).collect()),
            );
            // Waiter ids and arrival numbers are each backend's own; places are compared.
            let redis = core_error(read_all(|page| self.store.waiters(name.clone(), page)).await);
            let core = self.ledger.waiters(name, now);
            let shown = |w: allot_core::WaiterView| (w.place, w.token, w.units, w.scope, w.waited_ms, w.blocked_by_cap);
            self.trail.agree(
                &format!("the queue of {name}"),
                redis.map(|waiters| waiters.into_iter().map(shown).collect::<Vec<_>>()),
                core.map(|waiters| waiters.into_iter().map(shown).collect()),
            );
        }
        let redis = read_all(|page| self.store.sessions(page)).await.unwrap();
        let redis: Vec<(Session, u64)> = redis.into_iter().map(|info| (info.session, info.expires_in_ms)).collect();
        let core: Vec<(Session, u64)> =
            self.ledger.sessions().into_iter().map(|s| (s.clone(), s.deadline.saturating_sub(now))).collect();
        self.trail.agree("the sessions", redis, core);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_over_time_answer_like_the_ledger() {
    let server = RedisServer::start();
    let (store, mut clock) = TestClock::open(&server, 1_000_000).await;
    let store = Arc::new(store);
    let mut steps = 0;
    for seed in 1..=SEEDS {
        // Fresh namespaces and sessions per sequence, so sequences do not see each other.
        let names: Vec<NamespaceName> =
            (0..2).map(|i| NamespaceName::new(&format!("over-time:{seed}:{i}")).unwrap()).collect();
        let mut sequence = Sequence {
            store: &store,
            clock: &mut clock,
            ledger: Ledger::new(),
            names: names.clone(),
            // Sessions never opened: both answer session_not_found until one is.
            sessions: (0..2).map(|slot| SessionId(u128::from(seed) << 8 | slot)).collect(),
            waiting: HashMap::new(),
            trail: Trail::new(seed),
        };
        for ns in 0..names.len() {
            sequence.run(Op::Put { ns, quota: 6 }).await;
        }
        for slot in 0..2 {
            sequence.run(Op::OpenSession { slot, ttl_ms: 3000 }).await;
        }
        let mut rng = generator(seed);
        for _ in 0..STEPS {
            let op = random_op(&mut rng, &names, 2);
            sequence.run(op).await;
            steps += 1;
        }
        // The calls still waiting leave their queues when they are dropped; the sessions end.
        for (_, waiting) in sequence.waiting.drain() {
            waiting.call.abort();
        }
        let after = clock.now() + 10_000;
        clock.set(&store, after).await;
    }
    println!("{steps} steps agreed");
    store.shutdown().await;
}
