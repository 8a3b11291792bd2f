//! What several tests use: a wait for a condition that other tasks make true.

/// Waits until `check` holds; fails the test after a minute (a bound for a slow machine, never a
/// measure), naming `what` was awaited.
pub(crate) async fn until(what: &str, check: impl AsyncFnMut() -> bool) {
    let patience = allot_host::wait::PATIENCE;
    assert!(allot_host::wait::within(patience, check).await, "{what}: not so after {patience:?}");
}
