//! Where allot reads the time: the machine's clocks, or, in tests, a clock moved by hand.
//!
//! The rule: code that needs a reading of the time (a store's daemon clock, the executor's
//! timestamps and deadlines, a client's lease expiry) takes it from one [`TimeSource`] it is
//! given, never from `std::time` directly; [`SystemTime`] is the one place that reads the
//! machine's clocks. Code that only *waits* (intervals, timeouts, backoff) waits on tokio's timer,
//! which a test controls with `tokio::time::pause()`; a wait that must end at a reading of a
//! [`TimeSource`] (the `sleep` plugin's deadline) waits in steps and reads the source again.
//!
//! Two readings: a monotonic one, which runs a daemon clock (leases, deadlines), and the wall
//! clock, which counts the time a daemon was down in the applications' timers. Both come from one
//! [`TimeSource`], so a test moves them together.

use std::sync::OnceLock;
use std::time::Instant;

use crate::Millis;

/// A source of the two readings of the time.
pub trait TimeSource: std::fmt::Debug + Send + Sync + 'static {
    /// Milliseconds since the Unix epoch.
    fn wall_ms(&self) -> Millis;
    /// Milliseconds of a clock that never goes back; only differences count.
    fn monotonic_ms(&self) -> Millis;
}

/// The machine's clocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemTime;

impl TimeSource for SystemTime {
    fn wall_ms(&self) -> Millis {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    fn monotonic_ms(&self) -> Millis {
        static START: OnceLock<Instant> = OnceLock::new();
        u64::try_from(START.get_or_init(Instant::now).elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

#[cfg(feature = "testing")]
pub use manual::ManualClock;

#[cfg(feature = "testing")]
mod manual {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::{Millis, TimeSource};

    /// The wall clock of a [`ManualClock`] that has not been moved: 2023-11-14.
    const WALL_START: Millis = 1_700_000_000_000;

    /// A clock that moves only when told to. Clones share one time, so a test keeps one and
    /// gives another to the store (and to the same store reopened: the time between is downtime).
    #[derive(Debug, Clone, Default)]
    pub struct ManualClock(Arc<AtomicU64>);

    impl ManualClock {
        pub fn new() -> ManualClock {
            ManualClock::default()
        }

        /// Moves the time on by `by`.
        pub fn advance(&self, by: Duration) {
            let by = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
            self.0.fetch_add(by, Ordering::SeqCst);
        }
    }

    impl TimeSource for ManualClock {
        fn wall_ms(&self) -> Millis {
            WALL_START + self.0.load(Ordering::SeqCst)
        }

        fn monotonic_ms(&self) -> Millis {
            self.0.load(Ordering::SeqCst)
        }
    }
}
