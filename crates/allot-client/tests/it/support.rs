//! What several tests use: a wait for a condition that other tasks make true.

use std::time::{Duration, Instant};

/// Waits until `check` holds; fails the test after 60 s (a bound for a slow machine, never a
/// measure), naming `what` was awaited.
pub(crate) async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not so after 60 s");
        // Polls what other tasks make true; the pause only spaces the looks.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
