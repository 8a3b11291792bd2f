//! The scheduler's lease on Redis (`lua/sched_lease.lua`, in the `{allot-apps}` slot): it elects
//! the one daemon that schedules applications; its fencing number goes up at every new term, so
//! the writes of a deposed scheduler can be told from the current one's.

use std::time::Duration;

use allot_store::StoreError;

use crate::reply::corrupt;
use crate::store::RedisStore;

/// The lease's key: in the applications' hash slot.
pub const LEASE_KEY: &str = "allot:{allot-apps}:lease";

/// How the holder of the lease a restore takes begins: a daemon that finds it held so has no
/// scheduler to send applications' calls to.
pub const RESTORE_HOLDER: &str = "restore ";

/// The keys of the lease (and of the daemons that ask for it) that a restore keeps.
pub(crate) fn lease_keys() -> [String; 2] {
    [LEASE_KEY.to_owned(), format!("{LEASE_KEY}:daemons")]
}

/// What an acquire found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseState {
    /// This daemon holds the lease, in the term `fencing`, for `ttl`.
    Mine { fencing: u64, ttl: Duration },
    /// Another daemon holds it, for `left` more unless it renews.
    Held { holder: String, fencing: u64, left: Duration },
}

impl RedisStore {
    /// Takes the scheduler's lease for `holder`, or renews it; answers who holds it.
    pub async fn acquire_sched_lease(&self, holder: &str, ttl: Duration) -> Result<LeaseState, StoreError> {
        self.take_lease("acquire", holder, ttl).await
    }

    /// Takes the scheduler's lease for a restore (`holder` begins with [`RESTORE_HOLDER`]), only
    /// if no daemon holds it or asked for it within its TTL: every running daemon asks every
    /// half second, so `Held` names a daemon that uses this Redis.
    pub(crate) async fn take_sched_lease_for_restore(
        &self,
        holder: &str,
        ttl: Duration,
    ) -> Result<LeaseState, StoreError> {
        self.take_lease("restore", holder, ttl).await
    }

    /// Calls the lease function's `op` (`acquire` or `restore`) and reads its answer.
    async fn take_lease(&self, op: &str, holder: &str, ttl: Duration) -> Result<LeaseState, StoreError> {
        let ttl_ms = ttl.as_millis().max(1).to_string();
        let (kind, who, fencing, ms) = self.lease_call(&[op, holder, &ttl_ms], true).await?;
        match kind.as_str() {
            "mine" => Ok(LeaseState::Mine { fencing, ttl: ms }),
            "held" => Ok(LeaseState::Held { holder: who, fencing, left: ms }),
            other => Err(corrupt(format!("lease answer `{other}`"))),
        }
    }

    /// Reads Redis's clock (the lease's primary's), changing nothing: a daemon that opens, so
    /// that `Store::now` never falls back to its own wall clock.
    pub(crate) async fn read_redis_clock(&self) -> Result<(), StoreError> {
        self.lease_call(&["clock", "", "0"], false).await.map(drop)
    }

    /// Ends `holder`'s lease now, if it holds it (a clean shutdown hands the scheduling over).
    pub async fn release_sched_lease(&self, holder: &str) -> Result<(), StoreError> {
        self.lease_call(&["release", holder, "0"], true).await.map(drop)
    }

    /// Calls the lease function: its answer's kind, holder, fencing number and time. Every
    /// answer ends with Redis's clock, noted here: the scheduler's timers read it (`Store::now`).
    async fn lease_call(&self, args: &[&str], mutating: bool) -> Result<(String, String, u64, Duration), StoreError> {
        let mut reply = self.inner.eval(&self.inner.scripts.sched_lease, LEASE_KEY, args, mutating).await?;
        let answer = (reply.text()?, reply.text()?, reply.uint()?, Duration::from_millis(reply.uint()?));
        crate::pools::saw_clock(&self.inner, reply.uint()?);
        Ok(answer)
    }
}
