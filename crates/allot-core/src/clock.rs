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

/// Where a daemon clock stands against the wall clock, kept steady, to show the daemon clock's
/// times as timestamps. Read afresh on every call, the distance moves by a millisecond either
/// way with the moment each clock happens to be read (and by more when the thread is preempted
/// between the two readings): two times of one millisecond would then be shown in either order
/// from one call to the next. It moves only when the wall clock has moved by more than
/// [`WallOffset::TOLERANCE_MS`] against the daemon clock (the machine's time was set), and only
/// by a reading taken without a pause between its two clocks.
#[derive(Debug)]
pub struct WallOffset {
    /// The wall clock less the daemon clock, in ms; [`WallOffset::UNSET`] before the first reading.
    offset: std::sync::atomic::AtomicI64,
}

impl Default for WallOffset {
    fn default() -> WallOffset {
        WallOffset { offset: std::sync::atomic::AtomicI64::new(WallOffset::UNSET) }
    }
}

impl WallOffset {
    /// How far the wall clock may stray from the kept distance before the distance follows it.
    pub const TOLERANCE_MS: i64 = 100;
    const UNSET: i64 = i64::MIN;

    /// The wall clock's time of `now` (a daemon clock's reading), given `wall`, the wall clock
    /// read beside it; `steady`: nothing paused between the two readings, so the distance they
    /// show may be kept.
    pub fn wall_of(&self, now: Millis, wall: Millis, steady: bool) -> Millis {
        use std::sync::atomic::Ordering;
        let seen = i64::try_from(wall).unwrap_or(i64::MAX).saturating_sub(i64::try_from(now).unwrap_or(i64::MAX));
        let kept = self.offset.load(Ordering::Relaxed);
        let offset = if kept == Self::UNSET || (steady && seen.abs_diff(kept) > Self::TOLERANCE_MS.unsigned_abs()) {
            self.offset.store(seen, Ordering::Relaxed);
            seen
        } else {
            kept
        };
        u64::try_from(i64::try_from(now).unwrap_or(i64::MAX).saturating_add(offset)).unwrap_or(0)
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

#[cfg(test)]
mod tests {
    use super::WallOffset;

    /// The distance is kept through readings a millisecond apart either way, and through a
    /// paused reading of any size; a steady reading that strays further (the machine's time set)
    /// moves it.
    #[test]
    fn a_wall_offset_stays_through_jitter_and_follows_a_step() {
        const WALL: u64 = 1_700_000_000_000;
        let offset = WallOffset::default();
        assert_eq!(offset.wall_of(1_000, WALL, true), WALL);
        // The same daemon millisecond, the wall read a millisecond later or earlier: the same time.
        assert_eq!(offset.wall_of(1_000, WALL + 1, true), WALL);
        assert_eq!(offset.wall_of(1_000, WALL - 1, true), WALL);
        assert_eq!(offset.wall_of(1_005, WALL + 4, true), WALL + 5);
        // Read with a pause between the clocks: not taken, however far.
        assert_eq!(offset.wall_of(1_010, WALL + 9_000, false), WALL + 10);
        // The machine's time set back by an hour: followed.
        assert_eq!(offset.wall_of(2_000, WALL - 3_600_000, true), WALL - 3_600_000);
        assert_eq!(offset.wall_of(2_001, WALL - 3_600_000, true), WALL - 3_599_999);
        // The first reading is taken even if paused.
        assert_eq!(WallOffset::default().wall_of(5, WALL, false), WALL);
    }
}
