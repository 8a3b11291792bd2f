//! Waiting allocates in the Redis-shaped run: a client asks for units with `wait_ms`; a call the
//! quota cannot answer at once waits in its namespace's queue in Redis, in the background, while
//! the plan goes on. Its answer is decided in Redis (a release, a lapse or a keepalive's end that
//! frees room hands it the units in queue order) or by the daemon's clock (its wait runs out,
//! `RedisConfig::time`), and the call learns it at its next wake-up: after every step the
//! simulation waits for the calls whose answer is decided, in the order they started waiting, so
//! the history is the same from run to run. Before a daemon closes (a restart, a failover) its
//! waiting calls go, one by one from the back of each queue, so no call waits across one and
//! none lets another in as it leaves. Checked: a waiter is granted only after
//! every waiter ahead of it in its namespace (no caps here, so the queue is strict); the grants
//! themselves go through the same checks as the others. The waiting allocates have a namespace of
//! their own, so the plans drawn before they joined meet the namespaces they met then.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use allot_api::GrantList;
use axum::http::{Method, StatusCode};
use tokio::task::JoinHandle;

use super::{code_of, namespace, Grip, Known, Sim};
use crate::check::{parse, Violation};

/// How long after its deadline Redis's sweep drops a waiter nobody claimed (`GRACE_MS` in
/// `lua/namespace.lua`).
const ABANDONED_AFTER_MS: u64 = 30_000;

/// How long a waiter that goes may take to leave the queue: one whose leaving Redis refuses
/// stays (cut at one replica required).
const LEAVE_WITHIN: Duration = Duration::from_millis(300);

/// How long the harness waits for a call whose answer is decided before it calls the run broken.
const ANSWER_WITHIN: Duration = Duration::from_secs(30);

/// A call that waits for its answer.
pub(super) struct Waiter {
    ns: u8,
    name: String,
    units: u64,
    /// Until when its call waits, on the daemon's monotonic clock (`Sim::clock`), which decides it.
    deadline: u64,
    /// Until when it waits as Redis counts (on Redis's clock, `Sim::now`): the sweep drops a
    /// waiter left behind from then on, and a grace.
    redis_deadline: u64,
    /// It asked where a waiter left behind by its token still stood (`Sim::orphans`), and
    /// took that one's place in the queue.
    resumed: bool,
    call: JoinHandle<(StatusCode, bytes::Bytes)>,
}

/// A waiting allocate's token: apart from the plain grants' (`c{client}-t{token}`), so the two
/// never ask for one token.
pub(super) fn waiting_token(client: u8, token: u8) -> String {
    format!("c{client}-w{token}")
}

impl Sim {
    /// `PUT` of grant `c{client}-w{token}` of `units` in the waiting allocates' namespace,
    /// waiting up to `wait_ms`.
    pub(super) async fn wait_grant(
        &mut self,
        client: u8,
        token: u8,
        units: u8,
        wait_ms: u32,
    ) -> Result<String, Violation> {
        let (ns, name) = (super::PLAIN_NAMESPACES, waiting_token(client, token));
        if self.waiting.iter().any(|waiter| waiter.ns == ns && waiter.name == name) {
            return Ok("already waiting".to_owned());
        }
        let path = format!("/v1/namespaces/{}/grants/{name}", namespace(ns));
        let body = serde_json::json!({ "units": units, "ttl_ms": 6_000, "wait_ms": wait_ms });
        // The daemon counts the wait from the call (`RedisStore::allocate`), as the harness does.
        let (deadline, redis_deadline) = (self.clock.now() + u64::from(wait_ms), self.now + u64::from(wait_ms));
        let call = tokio::spawn(super::ask(self.daemon().api.clone(), Method::PUT, path, Some(body)));
        // Answered at once, or queued: Redis says which (nothing else runs meanwhile).
        let started = tokio::time::Instant::now();
        loop {
            if call.is_finished() {
                let (status, body) = call.await.map_err(|err| Violation::new(format!("the call panicked: {err}")))?;
                return self.granted(ns, &name, u64::from(units), status, &body);
            }
            if self.queued(ns).await?.contains(&name) {
                // Its units may come any time from now: in doubt until its answer.
                let at_risk = self.acknowledged_at_risk();
                *self.model.grip(ns, &name) = Grip { known: Known::InDoubt, at_risk };
                let resumed = self.orphans.get(&(ns, name.clone())).is_some_and(|until| *until > self.now);
                let units = u64::from(units);
                self.waiting.push(Waiter { ns, name, units, deadline, redis_deadline, resumed, call });
                return Ok("waiting".to_owned());
            }
            if started.elapsed() > ANSWER_WITHIN {
                return Err(Violation::new(format!("{name} neither answered nor queued")));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// The grants whose calls still wait, or that Redis may still grant a waiter left behind,
    /// by namespace and token: in doubt whatever a listing says.
    pub(super) fn waiting_tokens(&self) -> BTreeSet<(u8, String)> {
        let now = self.now;
        let orphans = self.orphans.iter().filter(|(_, until)| **until > now).map(|(key, _)| key.clone());
        self.waiting.iter().map(|waiter| (waiter.ns, waiter.name.clone())).chain(orphans).collect()
    }

    /// The tokens waiting in `ns`'s queue, as the daemon lists them.
    async fn queued(&self, ns: u8) -> Result<BTreeSet<String>, Violation> {
        let path = format!("/v1/namespaces/{}/waiters?limit=1000", namespace(ns));
        let (status, body) = self.call(Method::GET, path.clone(), None).await;
        if !status.is_success() {
            return Err(Violation::new(format!("GET {path} answered {status}: {}", code_of(&body))));
        }
        let list: serde_json::Value = parse(&body)?;
        let waiters = list["waiters"].as_array().cloned().unwrap_or_default();
        Ok(waiters.iter().filter_map(|waiter| waiter["token"].as_str().map(str::to_owned)).collect())
    }

    /// Before the daemon closes: its waiting calls whose answer is decided are learned, then the
    /// others go away one by one from the back of the queue (a call that goes takes its waiter
    /// out of the queue), so none lets another in as it leaves: the daemon's own shutdown would
    /// answer them all at once, in an order of its threads'.
    pub(super) async fn leave_queues(&mut self) -> Result<(), Violation> {
        self.settle_waiters().await?;
        while let Some(waiter) = self.waiting.pop() {
            waiter.call.abort();
            let _ = waiter.call.await;
            // Its leaving is a write of its own (`WaitGuard`): gone from the queue, or refused
            // (cut at one replica required) and left behind.
            let started = tokio::time::Instant::now();
            let mut gone = false;
            while started.elapsed() < LEAVE_WITHIN {
                if !self.queued(waiter.ns).await?.contains(&waiter.name) {
                    gone = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            if !gone || self.pair.cut.is_some() {
                self.orphans.insert((waiter.ns, waiter.name.clone()), waiter.redis_deadline + ABANDONED_AFTER_MS);
            }
            *self.model.grip(waiter.ns, &waiter.name) = Grip { known: Known::InDoubt, at_risk: false };
            let how = if gone { "left the queue" } else { "left behind in the queue" };
            self.record(format!("  waiter {} of {}: its call went, {how}", waiter.name, namespace(waiter.ns)));
        }
        Ok(())
    }

    /// Waits for the calls whose answer is decided (granted in Redis, or their wait run out on
    /// the daemon's clock), in the order Redis granted them, and learns their answers.
    pub(super) async fn settle_waiters(&mut self) -> Result<(), Violation> {
        // A call that leaves the queue lets the waiters behind it in: until no more are decided.
        loop {
            let before = self.waiting.len();
            self.settle_decided().await?;
            if self.waiting.is_empty() || self.waiting.len() == before {
                return Ok(());
            }
        }
    }

    /// One pass of `settle_waiters`.
    async fn settle_decided(&mut self) -> Result<(), Violation> {
        // The grants listed, with their fencing numbers: the order Redis handed them out.
        let mut granted: BTreeMap<(u8, String), u64> = BTreeMap::new();
        for ns in 0..super::NAMESPACES {
            let path = format!("/v1/namespaces/{}/grants?limit=1000", namespace(ns));
            let (status, body) = self.call(Method::GET, path.clone(), None).await;
            if !status.is_success() {
                return Err(Violation::new(format!("GET {path} answered {status}: {}", code_of(&body))));
            }
            let list: GrantList = parse(&body)?;
            granted.extend(list.grants.into_iter().map(|grant| ((ns, grant.token), grant.fencing)));
        }
        let now = self.clock.now();
        let waiting = std::mem::take(&mut self.waiting);
        let mut ahead: Vec<(u8, String)> = Vec::new();
        let mut decided = Vec::new();
        for waiter in waiting {
            let fencing = granted.get(&(waiter.ns, waiter.name.clone())).copied();
            if !(fencing.is_some() || now >= waiter.deadline) {
                ahead.push((waiter.ns, waiter.name.clone()));
                self.waiting.push(waiter);
                continue;
            }
            // The queue is strict: no one ahead in its namespace still waits (a waiter that
            // asked again where one left behind still stood has that one's place).
            if let (Some(_), false) = (fencing, waiter.resumed) {
                if let Some((_, before)) = ahead.iter().find(|(ns, _)| *ns == waiter.ns) {
                    return Err(Violation::new(format!(
                        "{} in {} was granted while {before}, ahead of it, still waits",
                        waiter.name,
                        namespace(waiter.ns)
                    )));
                }
            }
            decided.push((fencing.unwrap_or(0), waiter));
        }
        // Learned in the order they were given their numbers.
        decided.sort_by_key(|(fencing, _)| *fencing);
        for (_, waiter) in decided {
            let answered = tokio::time::timeout(ANSWER_WITHIN, waiter.call).await;
            let Ok(Ok((status, body))) = answered else {
                return Err(Violation::new(format!("{}'s waiting call never answered", waiter.name)));
            };
            let granted = status.is_success()
                && serde_json::from_slice::<allot_api::AllocateResponse>(&body)
                    .is_ok_and(|answer| answer.status == allot_api::Status::Granted);
            if self.pair.cut.is_some() || !status.is_success() {
                // Its leaving the queue (with units or not) may be lost by a failover (cut at no
                // replica required), refused (cut at one), or never made (the call failed): a
                // waiter left behind may be granted (again) until the sweep drops it.
                self.orphans.insert((waiter.ns, waiter.name.clone()), waiter.redis_deadline + ABANDONED_AFTER_MS);
                if !granted {
                    *self.model.grip(waiter.ns, &waiter.name) = Grip { known: Known::InDoubt, at_risk: false };
                }
            }
            let mut line = self.granted(waiter.ns, &waiter.name, waiter.units, status, &body)?;
            if status.is_success() && !granted {
                // Its place when it left depends on whether the ones ahead whose wait ran out in
                // the same step left before it, which their calls decide among themselves.
                line = format!("{} its wait ran out", status.as_u16());
            }
            self.record(format!("  waiter {} of {}: {line}", waiter.name, namespace(waiter.ns)));
        }
        Ok(())
    }
}
