//! The change feed's series: the watch streams open on this daemon (`allot_watch_watchers`, kept
//! by [`Watching`] guards), and what the store's feed keeps for watchers that resume
//! (`allot_watch_events_kept`, `allot_watch_oldest_revision`, read at each scrape).

use super::*;

/// One open watch stream, counted in `allot_watch_watchers` while it lives.
#[derive(Debug)]
pub(crate) struct Watching(Gauge);

impl Watching {
    pub(super) fn new(watchers: &Gauge) -> Watching {
        watchers.inc();
        Watching(watchers.clone())
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Registers the gauge of open watch streams.
pub(super) fn register_watchers(registry: &mut Registry) -> Gauge {
    let watchers = Gauge::default();
    registry.register("allot_watch_watchers", "Watch streams open on this daemon", watchers.clone());
    watchers
}

/// What the feed keeps: `(events, the oldest revision a watch can start after)`.
pub(super) fn encode_feed(
    encoder: &mut DescriptorEncoder<'_>,
    (events, oldest): (usize, u64),
) -> Result<(), std::fmt::Error> {
    encode_gauge(
        encoder,
        "allot_watch_events_kept",
        "Events the store keeps for watchers that resume from a revision",
        gauge(events as u64),
    )?;
    encode_gauge(
        encoder,
        "allot_watch_oldest_revision",
        "The oldest revision a watch can start after (an older `since` is answered 410 revision_compacted)",
        gauge(oldest),
    )
}
