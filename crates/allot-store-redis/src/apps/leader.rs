//! Who schedules the applications, as this daemon sees it: its name in the election, its lease
//! (term and until when it surely runs), where the scheduler is, and, while this daemon holds the
//! lease, the scheduler's state ([`Leader`]). Only the daemon's own tasks change it: the election
//! (`run_lease`) and the rounds (`run`) in `scheduler.rs`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use allot_core::apps::queues::{QueueLimits, QueuePath};
use allot_core::apps::{SchedConfig, SchedStats, Scheduler};
use allot_core::clock::TimeSource;
use allot_core::pools::Pools;
use allot_core::{Ledger, Millis};
use allot_store::AppsHome;
use tokio::sync::Notify;

use crate::apps::steps::Step;

/// The scheduler's state on the daemon that holds the lease.
pub(crate) struct Leader {
    pub(crate) fencing: u64,
    pub(crate) sched: Scheduler,
    /// The pools and namespaces as last read from Redis, with the scheduler's changes since.
    pub(crate) pools: Pools,
    pub(crate) ledger: Ledger,
    /// Ends that failed (Redis unreachable): carried in the intents and tried again.
    pub(crate) unfinished: Vec<Step>,
    /// When the mirror was last read (the daemon's monotonic clock); `None` when it must be
    /// read before the next cycle.
    pub(crate) mirror_read: Option<Millis>,
    /// When the executors' leases were last read.
    pub(crate) executors_read: Option<Millis>,
    /// The room held for preemptors as last written to the pools (`spare`); `None` until first
    /// written in this term, when every pool is written.
    pub(crate) spared: Option<std::collections::BTreeMap<allot_core::pools::PoolName, allot_core::Resources>>,
}

/// The applications part of a Redis store: who schedules, and the scheduler if it is this daemon.
pub(crate) struct Apps {
    /// This daemon's name in the lease: its base URL, a space, and a nonce.
    pub(crate) holder: Mutex<Option<String>>,
    pub(crate) leader: tokio::sync::Mutex<Option<Leader>>,
    /// This daemon's lease, as last renewed: its term, and until when it surely runs (the
    /// daemon's monotonic clock).
    pub(crate) lease: Mutex<Option<(u64, Millis)>>,
    pub(crate) home: Mutex<AppsHome>,
    pub(crate) config: Mutex<SchedConfig>,
    /// Queues of the configuration file, registered by this daemon when it schedules.
    pub(crate) seeds: Mutex<Vec<(QueuePath, QueueLimits)>>,
    pub(crate) stats: Mutex<SchedStats>,
    pub(crate) wake: Notify,
    /// Set when a daemon made room (a quota or a pool put): the mirror is read again before the
    /// next cycle, which runs at once.
    pub(crate) room_made: AtomicBool,
    /// How old the scheduler's mirror may grow while something waits (others free room and
    /// tokens too): `--redis-sched-refresh`.
    pub(crate) refresh: Duration,
    /// The daemon's clock.
    pub(crate) time: Arc<dyn TimeSource>,
}

impl Apps {
    pub(crate) fn new(refresh: Duration, time: Arc<dyn TimeSource>) -> Apps {
        Apps {
            holder: Mutex::new(None),
            leader: tokio::sync::Mutex::new(None),
            lease: Mutex::new(None),
            home: Mutex::new(AppsHome::Unknown),
            config: Mutex::new(SchedConfig::default()),
            seeds: Mutex::new(Vec::new()),
            stats: Mutex::new(SchedStats::default()),
            wake: Notify::new(),
            room_made: AtomicBool::new(false),
            refresh,
            time,
        }
    }

    /// A daemon made room that may admit a waiting application: if this daemon schedules, it
    /// reads the pools and namespaces again and runs a cycle at once.
    pub(crate) fn room_made(&self) {
        self.room_made.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }

    pub(crate) fn home(&self) -> AppsHome {
        self.home.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn stats(&self) -> SchedStats {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The term of this daemon's running lease, if it holds one.
    pub(crate) fn term(&self) -> Option<u64> {
        let lease = *self.lease.lock().unwrap_or_else(|p| p.into_inner());
        let now = self.time.monotonic_ms();
        lease.filter(|(_, until)| *until > now).map(|(fencing, _)| fencing)
    }

    /// The leader's state, if this daemon holds the lease in its term.
    pub(crate) fn current<'a>(&self, leader: &'a mut Option<Leader>) -> Option<&'a mut Leader> {
        let term = self.term();
        leader.as_mut().filter(|l| Some(l.fencing) == term)
    }

    pub(crate) fn set_home(&self, home: AppsHome) {
        *self.home.lock().unwrap_or_else(|p| p.into_inner()) = home;
    }

    pub(crate) fn holder(&self) -> Option<String> {
        self.holder.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
