//! What allot asks of the machine beyond the standard library: which CPUs a thread may run on
//! ([`affinity`]: the daemon's `--pin-threads`, `allot bench compare --pin`), and real
//! `redis-server` processes on free loopback ports ([`redis`]: `allot bench redis`, `bench apps
//! --redis`, and every Redis test). Nothing here knows allot's stores or API.

pub mod affinity;
pub mod redis;
