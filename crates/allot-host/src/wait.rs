//! Waiting for a condition that other tasks, threads or processes make true: the one polling
//! loop that the tests and the harness share, so that nothing waits for a duration instead.

use std::time::{Duration, Instant};

/// How long a test waits for a condition before it gives up: a bound for a slow, loaded
/// machine, never a measure.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// The pause between two looks at a condition (for a loop that cannot be a closure, such as a
/// spawned task's, whose future the compiler cannot prove `Send`).
pub async fn pause() {
    // Spaces the looks at a condition; the time it lasts is never what is waited for.
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// Looks at `check` until it holds or `limit` has passed; whether it held.
pub async fn within(limit: Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
    let started = Instant::now();
    loop {
        if check().await {
            return true;
        }
        if started.elapsed() >= limit {
            return false;
        }
        pause().await;
    }
}

/// Waits until `check` holds; fails (panics, naming `what` was awaited) after [`PATIENCE`]. For
/// tests and checks, where a condition that never comes is a failure.
pub async fn until(what: &str, check: impl AsyncFnMut() -> bool) {
    assert!(within(PATIENCE, check).await, "{what}: not so after {PATIENCE:?}");
}
