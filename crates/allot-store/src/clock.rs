//! Where a store reads the time: the machine's clocks, or, in tests, a clock moved by hand.
//!
//! The embedded store takes two readings: a monotonic one, which runs its daemon clock (leases,
//! deadlines), and the wall clock, which counts the time the daemon was down in the
//! applications' timers. Both come from one [`TimeSource`], so a test moves them together.

use std::sync::OnceLock;
use std::time::Instant;

use allot_core::Millis;

/// A source of the two readings a store takes.
pub trait TimeSource: Send + Sync + 'static {
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
