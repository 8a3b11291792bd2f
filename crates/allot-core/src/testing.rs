//! A small deterministic random generator for tests: a failing run replays from its seed. Not
//! for anything that needs unpredictable numbers.

/// xorshift64: fast, and the same sequence for the same seed on every machine.
#[derive(Debug, Clone)]
pub struct XorShift(u64);

impl XorShift {
    /// A generator from `seed` (any value; zero is replaced, as xorshift would stay at zero).
    pub fn new(seed: u64) -> XorShift {
        XorShift(if seed == 0 { 0x9e37_79b9_7f4a_7c15 } else { seed })
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number below `n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}
