//! Where a store draws the random ids it makes: allocs', sessions' (a session's id is the
//! capability to use it: 128 bits from a cryptographically secure generator) and the scheduler's
//! placeholders'. The machine's randomness in a daemon ([`RandomIds`]); a seeded generator in a
//! simulation, so that a seed gives one history.

use std::fmt::Debug;

/// A source of random ids.
pub trait IdSource: Debug + Send + Sync + 'static {
    fn next_u64(&self) -> u64;
    fn next_u128(&self) -> u128;
}

/// The thread's cryptographically secure generator (`rand`'s), seeded by the operating system.
#[derive(Debug, Clone, Copy, Default)]
pub struct RandomIds;

impl IdSource for RandomIds {
    fn next_u64(&self) -> u64 {
        rand::random()
    }

    fn next_u128(&self) -> u128 {
        rand::random()
    }
}

#[cfg(feature = "testing")]
pub use seeded::SeededIds;

#[cfg(feature = "testing")]
mod seeded {
    use std::sync::Mutex;

    use rand::rngs::StdRng;
    use rand::{Rng as _, SeedableRng as _};

    use super::IdSource;

    /// Ids from a generator seeded by the caller: the same seed, the same ids.
    #[derive(Debug)]
    pub struct SeededIds(Mutex<StdRng>);

    impl SeededIds {
        pub fn new(seed: u64) -> SeededIds {
            SeededIds(Mutex::new(StdRng::seed_from_u64(seed)))
        }

        fn draw<T>(&self, draw: impl FnOnce(&mut StdRng) -> T) -> T {
            draw(&mut self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
        }
    }

    impl IdSource for SeededIds {
        fn next_u64(&self) -> u64 {
            self.draw(|rng| rng.gen())
        }

        fn next_u128(&self) -> u128 {
            self.draw(|rng| rng.gen())
        }
    }
}
