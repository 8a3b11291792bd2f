//! What allot asks of the machine beyond the standard library: which CPUs a thread may run on
//! ([`affinity`]: the daemon's `--pin-threads`, `allot bench compare --pin`), and real
//! `redis-server` processes on free loopback ports ([`redis`]: `allot bench redis`, `bench apps
//! --redis`, and every Redis test), and [`wait`], the one loop that waits for a condition other
//! tasks or processes make true. Nothing here knows allot's stores or API.

pub mod affinity;
pub mod priority;
pub mod redis;
pub mod wait;
