//! The simulation's time: one monotonic reading moved only by the simulation, and a wall clock
//! that follows it but can be made to jump (an operator, NTP), forward or back.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use allot_core::clock::TimeSource;
use allot_core::Millis;

/// The wall clock of the simulation before any jump: 2023-11-14, as the tests' manual clock.
const WALL_START: Millis = 1_700_000_000_000;

/// Clones share one time: the simulation keeps one and gives another to every store it opens
/// (the time between a crash and the next open is downtime).
#[derive(Debug, Clone, Default)]
pub struct SimClock(Arc<Readings>);

#[derive(Debug, Default)]
struct Readings {
    monotonic: AtomicU64,
    /// How far the wall clock was moved away from the monotonic one, in milliseconds.
    wall_offset: AtomicI64,
}

impl SimClock {
    pub fn new() -> SimClock {
        SimClock::default()
    }

    /// Time passes: both readings move on by `ms`.
    pub fn advance(&self, ms: u64) {
        self.0.monotonic.fetch_add(ms, Ordering::SeqCst);
    }

    /// The wall clock alone jumps by `ms` (back when negative); the monotonic one does not.
    pub fn jump_wall(&self, ms: i64) {
        self.0.wall_offset.fetch_add(ms, Ordering::SeqCst);
    }

    /// The monotonic reading: the simulation's "now".
    pub fn now(&self) -> Millis {
        self.0.monotonic.load(Ordering::SeqCst)
    }
}

impl TimeSource for SimClock {
    fn wall_ms(&self) -> Millis {
        let wall = WALL_START as i64 + self.0.monotonic.load(Ordering::SeqCst) as i64;
        (wall + self.0.wall_offset.load(Ordering::SeqCst)).max(0) as Millis
    }

    fn monotonic_ms(&self) -> Millis {
        self.now()
    }
}
