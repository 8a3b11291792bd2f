//! allot-store's integration tests, one binary: the embedded store against the conformance suite,
//! across restarts and crashes, and on a disk that fails.

mod embedded;
mod snapshot;
mod support;
mod watch;
