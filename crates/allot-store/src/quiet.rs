//! Repeats of one log line kept to a few: an outage of a minute is a line every few seconds
//! with how many were held back, not a line per failed call.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a repeated line is written.
pub const PERIOD: Duration = Duration::from_secs(5);

/// One repeated line: the first is written, then one per [`PERIOD`].
#[derive(Debug, Default)]
pub struct Quiet {
    state: Mutex<Option<(Instant, u64)>>,
}

impl Quiet {
    pub const fn new() -> Quiet {
        Quiet { state: Mutex::new(None) }
    }

    /// `Some(held back)` when the line is to be written now (with how many repeats were not
    /// written since the last one), `None` when it is held back.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match &mut *state {
            Some((last, held)) if now.duration_since(*last) < PERIOD => {
                *held += 1;
                None
            }
            Some((last, held)) => {
                let written = *held;
                (*last, *held) = (now, 0);
                Some(written)
            }
            None => {
                *state = Some((now, 0));
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_line_is_written_then_one_per_period_with_the_count_held_back() {
        let quiet = Quiet::new();
        let start = Instant::now();
        assert_eq!(quiet.admit_at(start), Some(0));
        for i in 1..100 {
            assert_eq!(quiet.admit_at(start + Duration::from_millis(i * 10)), None);
        }
        assert_eq!(quiet.admit_at(start + PERIOD), Some(99));
        assert_eq!(quiet.admit_at(start + PERIOD + Duration::from_secs(1)), None);
        assert_eq!(quiet.admit_at(start + PERIOD * 3), Some(1));
    }
}
