//! What several tests use: a wait for a condition that other tasks make true.

/// Waits until a condition holds; fails, naming what was awaited, after a minute.
pub(crate) use allot_host::wait::until;
