//! The change feed: every committed change as an [`Event`], in commit order, kept for a while so
//! that a watcher can resume from a revision, and pushed to every watcher at once.
//!
//! A backend gives each change a revision when it commits it (they increase in commit order, not
//! necessarily by one) and hands the events to its [`Feed`] once they are durable, in revision
//! order. A watcher ([`Feed::subscribe`]) gets every event after its start revision that its
//! filter takes, none twice and none skipped; one that falls further behind than its buffer
//! ([`WatchConfig::buffer`] events it takes) is ended with [`WatchError::Behind`] and the
//! revision to resume from: a slow watcher never holds up a commit, and the memory of all of them
//! is bounded. Watchers are grouped by filter, so an event is matched once per distinct filter
//! and wakes only the watchers it is for.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use allot_core::watch::Filter;
use allot_core::Millis;
use tokio::sync::mpsc;

pub use crate::event::{Event, EventObject};
use crate::records::events::{self, EncodedEvents};

/// Why a watch cannot go on (or start).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WatchError {
    /// The events after `since` are no longer kept: list again, then watch from the list's
    /// revision.
    #[error("the events after revision {since} are no longer kept (the oldest kept is {oldest}): list again and watch from the list's revision")]
    Compacted { since: u64, oldest: u64 },
    /// `since` is above every revision this store gave: it came from another store (the one a
    /// snapshot restored here was taken from, which went on after it). List again, then watch
    /// from the list's revision.
    #[error("revision {since} was never given by this store (its newest is {newest}): list again and watch from the list's revision")]
    Ahead { since: u64, newest: u64 },
    /// The watcher fell further behind than its buffer; resume from `resume`.
    #[error("the watcher fell behind by more than {buffer} events; resume from revision {resume}")]
    Behind { resume: u64, buffer: usize },
    /// The feed is closed: the store shut down.
    #[error("the store is shutting down")]
    Closed,
    /// This backend has no change feed.
    #[error("the {backend} store has no change feed yet")]
    Unsupported { backend: &'static str },
}

/// The change feed of a backend.
pub trait WatchStore: Send + Sync {
    /// A watcher of the changes `filter` takes after revision `since` (`None`: from now).
    fn watch(&self, filter: Filter, since: Option<u64>) -> Result<Watcher, WatchError>;
    /// The revision that what is read now reflects: a watch from it misses nothing that
    /// changes after the read.
    fn revision(&self) -> u64;
    /// How many events are kept for watchers that resume, and the oldest revision one can
    /// resume after.
    fn feed_kept(&self) -> (usize, u64);
    /// [`WatchStore::watch`] for a part of the daemon itself (its executor): it may fall
    /// behind by [`WatchConfig::inside_buffer`] events, not [`WatchConfig::buffer`].
    fn watch_inside(&self, filter: Filter, since: Option<u64>) -> Result<Watcher, WatchError>;
}

/// How much of the feed is kept, and how far a watcher may fall behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchConfig {
    /// At most this many events are kept for watchers that resume.
    pub retain_events: usize,
    /// Events older than this are dropped, however few there are.
    pub retain_for: Duration,
    /// How many events a watcher may have waiting before it is ended as too slow.
    pub buffer: usize,
    /// The same for a watcher inside the daemon ([`WatchStore::watch_inside`]: its executor),
    /// which would rather hold a burst (one commit placing tens of thousands of tasks) than be
    /// cut by it and list everything again. It holds only pointers to events the feed shares.
    pub inside_buffer: usize,
}

impl Default for WatchConfig {
    fn default() -> WatchConfig {
        WatchConfig {
            retain_events: 100_000,
            retain_for: Duration::from_secs(3600),
            buffer: 4096,
            inside_buffer: 100_000,
        }
    }
}

/// The feed of one store: the events kept, and the live watchers.
#[derive(Debug)]
pub struct Feed {
    config: WatchConfig,
    kept: Arc<Mutex<Kept>>,
}

#[derive(Debug)]
struct Kept {
    /// The kept events' records (`records::events::EventRecord`), back to back, oldest first: one
    /// buffer, so that dropping the oldest frees nothing and reads none of them (as objects they
    /// were cold in the cache by then, and dropping them was most of a publish).
    records: VecDeque<u8>,
    /// Per kept event, oldest first: what retention and resuming read without decoding it.
    events: VecDeque<KeptEvent>,
    /// The bytes dropped from the front of `records` since the start: a kept event's `end` less
    /// this is where its record ends in `records`.
    dropped_bytes: u64,
    /// Every event after this revision is kept (or none was published after it).
    compacted: u64,
    /// The last revision published.
    last: u64,
    /// The live watchers, grouped by filter: an event is matched once per distinct filter, and
    /// only the watchers it matches are handed it (and woken).
    taps: HashMap<Filter, Vec<Tap>>,
    closed: bool,
}

/// A kept event: its revision and time, and where its record ends (counted in every byte ever
/// appended to `Kept::records`; it starts where the one before it ends).
#[derive(Debug, Clone, Copy)]
struct KeptEvent {
    revision: u64,
    at: Millis,
    end: u64,
}

/// Where a live watcher's events go.
#[derive(Debug)]
struct Tap {
    tx: mpsc::Sender<Arc<Event>>,
    /// Set when its buffer was full: it is ended as behind, and given nothing more.
    behind: Arc<AtomicBool>,
}

impl Feed {
    /// A feed whose first event comes after revision `start`.
    pub fn new(config: WatchConfig, start: u64) -> Feed {
        Feed::restore(config, Vec::new(), start, start)
    }

    /// A feed that keeps `events` (in revision order, every event after `compacted`, as a store
    /// kept them across a restart) and whose next event comes after revision `start`, above them.
    pub fn restore(config: WatchConfig, events: Vec<Event>, compacted: u64, start: u64) -> Feed {
        debug_assert!(events.windows(2).all(|pair| pair[0].revision < pair[1].revision), "in revision order");
        debug_assert!(events.first().is_none_or(|first| first.revision > compacted), "after `compacted`");
        debug_assert!(events.last().is_none_or(|last| last.revision <= start) && compacted <= start);
        let mut kept = Kept {
            records: VecDeque::new(),
            events: VecDeque::new(),
            dropped_bytes: 0,
            compacted,
            last: compacted,
            taps: HashMap::new(),
            closed: false,
        };
        let encoded = EncodedEvents::encode(&events);
        for (event, record) in events.iter().zip(encoded.records()) {
            kept.keep(event, record);
        }
        kept.last = start;
        Feed { config, kept: Arc::new(Mutex::new(kept)) }
    }

    fn lock(&self) -> MutexGuard<'_, Kept> {
        lock(&self.kept)
    }

    /// Publishes events that are durable, in revision order; drops what retention no longer
    /// keeps (by count, and those older than `retain_for` before `now`). Never waits for a
    /// watcher: one whose buffer is full is ended as behind.
    pub fn publish(&self, events: impl IntoIterator<Item = Event>, now: Millis) {
        let events: Vec<Event> = events.into_iter().collect();
        let encoded = EncodedEvents::encode(&events);
        self.publish_encoded(events, &encoded, now);
    }

    /// [`Feed::publish`] of events already encoded (`encoded` holds the records of `events`, in
    /// the same order): what a store that wrote them to its log gives.
    pub fn publish_encoded(&self, events: Vec<Event>, encoded: &EncodedEvents, now: Millis) {
        debug_assert_eq!(events.len(), encoded.len(), "a record per event");
        let mut kept = self.lock();
        let kept = &mut *kept;
        for (event, record) in events.into_iter().zip(encoded.records()) {
            // Published already: a rebuild after a failed write publishes the events of records a
            // sync had taken but not answered yet, which that sync then delivers. Never twice,
            // never a revision going back.
            if event.revision <= kept.last {
                continue;
            }
            kept.keep(&event, record);
            // Shared with the watchers it is for, if any; else dropped here, still in the cache.
            let mut owned = Some(event);
            let mut shared: Option<Arc<Event>> = None;
            for (filter, taps) in &mut kept.taps {
                let current = shared.as_deref().or(owned.as_ref());
                let matches = current.is_some_and(|event| filter.matches(event.kind, &event.key));
                if matches {
                    let event = shared.get_or_insert_with(|| Arc::new(owned.take().expect("not shared yet")));
                    taps.retain(|tap| match tap.tx.try_send(event.clone()) {
                        Ok(()) => true,
                        Err(mpsc::error::TrySendError::Full(_)) => {
                            tap.behind.store(true, Ordering::Release);
                            false
                        }
                        Err(mpsc::error::TrySendError::Closed(_)) => false,
                    });
                }
            }
        }
        kept.taps.retain(|_, taps| !taps.is_empty());
        self.drop_unkept(kept, now);
    }

    /// Drops what retention no longer keeps at `now`, as a publish does: for a feed that has been
    /// idle (its stores call it each sweep or checkpoint), whose oldest events aged meanwhile.
    pub fn expire(&self, now: Millis) {
        let mut kept = self.lock();
        self.drop_unkept(&mut kept, now);
        // After a burst, the records' buffer gives back what it no longer needs.
        if kept.records.capacity() > 4 * kept.records.len() + (1 << 20) {
            let keep = 2 * kept.records.len();
            kept.records.shrink_to(keep);
        }
    }

    /// Drops the events up to `revision` (the shared log this feed mirrors no longer keeps them);
    /// a watcher resuming from before it is told to list again.
    pub fn forget_through(&self, revision: u64) {
        let mut kept = self.lock();
        while kept.events.front().is_some_and(|k| k.revision <= revision) {
            kept.drop_oldest();
        }
    }

    /// Drops the events beyond `retain_events` and those older than `retain_for` before `now`.
    fn drop_unkept(&self, kept: &mut Kept, now: Millis) {
        let horizon = now.saturating_sub(u64::try_from(self.config.retain_for.as_millis()).unwrap_or(u64::MAX));
        while kept.events.len() > self.config.retain_events || kept.events.front().is_some_and(|k| k.at < horizon) {
            kept.drop_oldest();
        }
    }

    /// Starts over after `revision`: what is kept is dropped, and every live watcher is ended as
    /// behind (resuming from before `revision` is then refused as compacted). For a feed that
    /// mirrors another whose events it could not all read.
    pub fn skip_to(&self, revision: u64) {
        let mut kept = self.lock();
        while !kept.events.is_empty() {
            kept.drop_oldest();
        }
        kept.compacted = kept.compacted.max(revision);
        kept.last = kept.last.max(revision);
        for taps in kept.taps.values() {
            for tap in taps {
                tap.behind.store(true, Ordering::Release);
            }
        }
        kept.taps.clear();
    }

    /// Ends every watcher once it has what was published (the store shuts down).
    pub fn close(&self) {
        let mut kept = self.lock();
        kept.closed = true;
        kept.taps.clear();
    }

    /// The last revision published: a list read now reflects every event up to it.
    pub fn revision(&self) -> u64 {
        self.lock().last
    }

    /// How many events are kept, and the oldest revision a watcher can start after.
    pub fn kept(&self) -> (usize, u64) {
        let kept = self.lock();
        (kept.events.len(), kept.compacted)
    }

    /// How many watchers are live.
    #[cfg(test)]
    fn watchers(&self) -> usize {
        self.lock().taps.values().map(Vec::len).sum()
    }

    /// A watcher of the events `filter` takes after revision `since` (`None`: from now).
    pub fn subscribe(&self, filter: Filter, since: Option<u64>) -> Result<Watcher, WatchError> {
        self.subscribe_with_buffer(filter, since, self.config.buffer)
    }

    /// [`Feed::subscribe`] for a watcher inside the daemon ([`WatchConfig::inside_buffer`]).
    pub fn subscribe_inside(&self, filter: Filter, since: Option<u64>) -> Result<Watcher, WatchError> {
        self.subscribe_with_buffer(filter, since, self.config.inside_buffer)
    }

    fn subscribe_with_buffer(&self, filter: Filter, since: Option<u64>, buffer: usize) -> Result<Watcher, WatchError> {
        let mut kept = self.lock();
        if kept.closed {
            return Err(WatchError::Closed);
        }
        let since = since.unwrap_or(kept.last);
        if since < kept.compacted {
            return Err(WatchError::Compacted { since, oldest: kept.compacted });
        }
        // Under the lock: the backlog and the live events meet without a gap or an overlap.
        let backlog = kept.backlog(&filter, since)?;
        let (tx, live) = mpsc::channel(buffer.max(1));
        let behind = Arc::new(AtomicBool::new(false));
        kept.taps.entry(filter).or_default().push(Tap { tx, behind: behind.clone() });
        Ok(Watcher { backlog, live, behind, start: since, last: since, buffer, feed: self.kept.clone() })
    }
}

/// One watcher: the kept events it starts with, then the live ones its filter takes.
#[derive(Debug)]
pub struct Watcher {
    backlog: Backlog,
    live: mpsc::Receiver<Arc<Event>>,
    behind: Arc<AtomicBool>,
    /// The revision it starts after: nothing at or below it is handed out (a watcher resuming on
    /// a daemon of a shared store that has not read the log that far yet gets those events live).
    start: u64,
    last: u64,
    buffer: usize,
    feed: Arc<Mutex<Kept>>,
}

fn lock(kept: &Mutex<Kept>) -> MutexGuard<'_, Kept> {
    kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Kept {
    /// Keeps `event`, whose record is `record`, as the newest.
    fn keep(&mut self, event: &Event, record: &[u8]) {
        self.last = event.revision;
        self.records.extend(record);
        let end = self.dropped_bytes + self.records.len() as u64;
        self.events.push_back(KeptEvent { revision: event.revision, at: event.at, end });
    }

    /// Drops the oldest kept event (there is one).
    fn drop_oldest(&mut self) {
        let dropped = self.events.pop_front().expect("an event is kept");
        self.records.drain(..(dropped.end - self.dropped_bytes) as usize);
        self.dropped_bytes = dropped.end;
        self.compacted = dropped.revision;
    }

    /// The record of the kept event at `index`, in one piece.
    fn record(&self, index: usize) -> std::borrow::Cow<'_, [u8]> {
        let start = match index {
            0 => self.dropped_bytes,
            _ => self.events[index - 1].end,
        };
        let (start, end) =
            ((start - self.dropped_bytes) as usize, (self.events[index].end - self.dropped_bytes) as usize);
        let (front, back) = self.records.as_slices();
        if end <= front.len() {
            std::borrow::Cow::Borrowed(&front[start..end])
        } else if start >= front.len() {
            std::borrow::Cow::Borrowed(&back[start - front.len()..end - front.len()])
        } else {
            std::borrow::Cow::Owned(self.records.range(start..end).copied().collect())
        }
    }

    /// The records of the kept events after `since` that `filter` takes (it reads a record's
    /// kind and key in place), copied: they are decoded as the watcher takes them, not under the
    /// feed's lock, which every commit waits for.
    fn backlog(&self, filter: &Filter, since: u64) -> Result<Backlog, WatchError> {
        let first = self.events.partition_point(|k| k.revision <= since);
        let mut backlog = Backlog::default();
        for index in first..self.events.len() {
            let record = self.record(index);
            match events::kind_and_key(&record).map(|(kind, key)| filter.matches(kind, key)) {
                Some(false) => {}
                Some(true) => {
                    backlog.bytes.extend_from_slice(&record);
                    backlog.ends.push_back(backlog.bytes.len());
                }
                // The feed encoded it: a record it cannot read is a bug. The watcher is told to
                // list again rather than be handed a gap.
                None => {
                    let revision = self.events[index].revision;
                    tracing::error!(revision, "a kept event does not read; watchers resuming before it list again");
                    return Err(WatchError::Compacted { since, oldest: revision });
                }
            }
        }
        Ok(backlog)
    }
}

/// The kept events a watcher starts with, as their records, decoded one at a time as it takes
/// them.
#[derive(Debug, Default)]
struct Backlog {
    bytes: Vec<u8>,
    /// Where each record not taken yet ends in `bytes`; the next starts at `taken`.
    ends: VecDeque<usize>,
    taken: usize,
}

impl Backlog {
    fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The next event, if any is left.
    fn pop(&mut self) -> Option<Result<Event, crate::records::CorruptRecord>> {
        let end = self.ends.pop_front()?;
        let record = &self.bytes[self.taken..end];
        self.taken = end;
        Some(events::decode_event(record))
    }
}

impl Watcher {
    /// Where to resume: the last revision after which this watcher has been given everything its
    /// filter takes. With nothing waiting for it, that is the feed's last revision (the events
    /// after its last one were not for it), so a narrow watcher on a busy store resumes from
    /// near the present, not from an event long dropped.
    pub fn revision(&self) -> u64 {
        let kept = lock(&self.feed);
        // Under the feed's lock no event is being handed over: an empty channel is all caught up.
        let caught_up = self.backlog.is_empty() && self.live.is_empty() && !self.behind.load(Ordering::Acquire);
        if caught_up {
            self.last.max(kept.last)
        } else {
            self.last
        }
    }

    /// The next event its filter takes after its start; waits for one.
    pub async fn next(&mut self) -> Result<Arc<Event>, WatchError> {
        loop {
            let event = self.next_any().await?;
            if event.revision > self.start {
                self.last = event.revision;
                return Ok(event);
            }
        }
    }

    /// The next event its filter takes.
    async fn next_any(&mut self) -> Result<Arc<Event>, WatchError> {
        let event = match self.backlog.pop() {
            Some(Ok(event)) => Arc::new(event),
            // The feed encoded it: a record it cannot decode is a bug. The watcher is told to
            // list again rather than be handed a gap.
            Some(Err(err)) => {
                tracing::error!(error = %err, after = self.last, "a kept event does not decode; the watcher lists again");
                return Err(WatchError::Compacted { since: self.last, oldest: self.last });
            }
            None => match self.live.recv().await {
                Some(event) => event,
                None if self.behind.load(Ordering::Acquire) => {
                    return Err(WatchError::Behind { resume: self.last, buffer: self.buffer })
                }
                None => return Err(WatchError::Closed),
            },
        };
        Ok(event)
    }
}

#[cfg(test)]
mod tests {
    use allot_core::watch::EventKind;

    use super::*;

    fn event(revision: u64, key: &str, at: Millis) -> Event {
        Event {
            revision,
            kind: EventKind::PoolRemoved,
            key: key.to_owned(),
            cause: None,
            at,
            object: EventObject::Gone,
        }
    }

    fn config(retain_events: usize, buffer: usize) -> WatchConfig {
        WatchConfig { retain_events, retain_for: Duration::from_secs(60), buffer, inside_buffer: buffer }
    }

    #[tokio::test]
    async fn a_watcher_gets_what_was_kept_then_what_comes_in_order_and_filtered() {
        let feed = Feed::new(config(100, 16), 0);
        feed.publish([event(1, "pools/a", 0), event(2, "pools/b", 0)], 0);
        let filter = Filter { kinds: vec![], prefixes: vec!["pools/a".into()] };
        let mut watcher = feed.subscribe(filter, Some(0)).unwrap();
        feed.publish([event(5, "pools/b", 0), event(7, "pools/a/allocs/1", 0)], 0);
        assert_eq!(watcher.next().await.unwrap().revision, 1);
        assert_eq!(watcher.next().await.unwrap().revision, 7);
        assert_eq!(watcher.revision(), 7);
        let mut from_now = feed.subscribe(Filter::default(), None).unwrap();
        feed.publish([event(8, "pools/c", 0)], 0);
        assert_eq!(from_now.next().await.unwrap().revision, 8);
    }

    /// Events published again (a rebuild published them, then their sync delivered them) are
    /// not kept nor sent twice.
    #[tokio::test]
    async fn events_published_twice_are_kept_and_sent_once() {
        let feed = Feed::new(config(100, 16), 0);
        let mut watcher = feed.subscribe(Filter::default(), None).unwrap();
        feed.publish([event(1, "pools/a", 0), event(2, "pools/b", 0)], 0);
        feed.publish([event(1, "pools/a", 0), event(2, "pools/b", 0), event(3, "pools/c", 0)], 0);
        let revisions = [watcher.next().await.unwrap().revision, watcher.next().await.unwrap().revision];
        assert_eq!((revisions, watcher.next().await.unwrap().revision), ([1, 2], 3));
        assert_eq!(feed.kept(), (3, 0));
    }

    /// A watcher that starts after a revision this feed has not reached (another daemon of the
    /// store was ahead) gets nothing at or below it: no event twice, no revision going back.
    #[tokio::test]
    async fn a_watcher_starting_ahead_of_the_feed_skips_what_it_already_has() {
        let feed = Feed::new(config(100, 16), 0);
        feed.publish([event(1, "pools/a", 0), event(2, "pools/a", 0)], 0);
        let mut watcher = feed.subscribe(Filter::default(), Some(4)).unwrap();
        feed.publish([event(3, "pools/a", 0), event(4, "pools/b", 0), event(5, "pools/c", 0)], 0);
        assert_eq!(watcher.next().await.unwrap().revision, 5);
        feed.publish([event(6, "pools/d", 0)], 0);
        assert_eq!(watcher.next().await.unwrap().revision, 6);
    }

    #[tokio::test]
    async fn a_revision_no_longer_kept_is_refused_with_the_oldest_kept() {
        let feed = Feed::new(config(2, 16), 0);
        feed.publish((1..=5).map(|r| event(r, "pools/a", 0)), 0);
        assert_eq!(feed.kept(), (2, 3));
        assert_eq!(
            feed.subscribe(Filter::default(), Some(2)).err(),
            Some(WatchError::Compacted { since: 2, oldest: 3 })
        );
        let mut watcher = feed.subscribe(Filter::default(), Some(3)).unwrap();
        assert_eq!(watcher.next().await.unwrap().revision, 4);
        // And by age.
        let feed = Feed::new(WatchConfig { retain_for: Duration::from_millis(10), ..config(100, 16) }, 0);
        feed.publish([event(1, "pools/a", 0), event(2, "pools/a", 5)], 5);
        feed.publish([event(3, "pools/a", 12)], 12);
        assert_eq!(feed.kept(), (2, 1));
        // And by age while nothing is published.
        feed.expire(16);
        assert_eq!(feed.kept(), (1, 2));
        feed.expire(30);
        assert_eq!(feed.kept(), (0, 3));
        assert_eq!(feed.subscribe(Filter::default(), Some(3)).map(|w| w.revision()).ok(), Some(3));
        // And as the log it mirrors keeps them.
        let feed = Feed::new(config(100, 16), 0);
        feed.publish((1..=5).map(|r| event(r, "pools/a", 0)), 0);
        feed.forget_through(3);
        assert_eq!(feed.kept(), (2, 3));
        assert_eq!(
            feed.subscribe(Filter::default(), Some(2)).err(),
            Some(WatchError::Compacted { since: 2, oldest: 3 })
        );
    }

    /// The kept records are one ring of bytes: as the oldest go and new ones come, records lie
    /// across its end; a watcher resuming from any kept revision gets each one whole, filtered.
    #[tokio::test]
    async fn kept_events_read_back_whole_wherever_they_lie_in_the_ring() {
        let feed = Feed::new(config(7, 64), 0);
        let key = |r: u64| {
            format!("pools/{}/{}", if r.is_multiple_of(3) { "a" } else { "b" }, "x".repeat((r * 7 % 40) as usize))
        };
        let mut published = Vec::new();
        for revision in 1..=200 {
            let event = event(revision, &key(revision), revision);
            published.push(event.clone());
            feed.publish([event], revision);
            let (count, oldest) = feed.kept();
            assert_eq!((count, oldest), (revision.min(7) as usize, revision.saturating_sub(7)));
            for (filter, prefix) in [(Filter::default(), "pools/"), (pools_a(), "pools/a/")] {
                for since in oldest..=revision {
                    let mut watcher = feed.subscribe(filter.clone(), Some(since)).unwrap();
                    let expected = published[since as usize..].iter().filter(|e| e.key.starts_with(prefix));
                    let expected: Vec<Event> = expected.cloned().collect();
                    // All of its backlog is there at once: the live events are published later.
                    let mut got = Vec::new();
                    while got.len() < expected.len() {
                        match watcher.backlog.pop() {
                            Some(event) => got.push(event.unwrap()),
                            None => break,
                        }
                    }
                    assert_eq!(got, expected, "after {since} at {revision}, {prefix}");
                    assert!(watcher.backlog.is_empty());
                }
            }
        }
    }

    fn pools_a() -> Filter {
        Filter { kinds: vec![], prefixes: vec!["pools/a".into()] }
    }

    #[tokio::test]
    async fn a_restored_feed_resumes_from_what_it_kept_and_goes_on_after_its_start() {
        let feed = Feed::restore(config(100, 16), vec![event(12, "pools/a", 0), event(15, "pools/b", 0)], 10, 100);
        assert_eq!((feed.kept(), feed.revision()), ((2, 10), 100));
        let mut resumed = feed.subscribe(Filter::default(), Some(12)).unwrap();
        assert_eq!(
            feed.subscribe(Filter::default(), Some(9)).err(),
            Some(WatchError::Compacted { since: 9, oldest: 10 })
        );
        feed.publish([event(101, "pools/a", 0)], 0);
        assert_eq!(resumed.next().await.unwrap().revision, 15);
        assert_eq!(resumed.next().await.unwrap().revision, 101);
    }

    #[tokio::test]
    async fn a_watcher_that_falls_behind_is_ended_with_where_to_resume_and_writers_go_on() {
        let feed = Feed::new(config(1000, 4), 0);
        let mut slow = feed.subscribe(Filter::default(), None).unwrap();
        feed.publish([event(1, "pools/a", 0)], 0);
        assert_eq!(slow.next().await.unwrap().revision, 1);
        feed.publish((2..=20).map(|r| event(r, "pools/a", 0)), 0);
        // It has what its buffer held, then it is ended with where to resume.
        for revision in 2..=5 {
            assert_eq!(slow.next().await.unwrap().revision, revision);
        }
        assert_eq!(slow.next().await.err(), Some(WatchError::Behind { resume: 5, buffer: 4 }));
        // It resumes from there, with nothing skipped.
        let mut again = feed.subscribe(Filter::default(), Some(5)).unwrap();
        for revision in 6..=20 {
            assert_eq!(again.next().await.unwrap().revision, revision);
        }
    }

    #[tokio::test]
    async fn a_narrow_watcher_is_caught_up_past_the_events_it_does_not_take() {
        let feed = Feed::new(config(100, 4), 0);
        let mut narrow = feed.subscribe(Filter { kinds: vec![], prefixes: vec!["pools/a".into()] }, None).unwrap();
        // Many events for others: they neither fill its buffer nor hold back where it resumes.
        feed.publish((1..=50).map(|r| event(r, "pools/b", 0)), 0);
        assert_eq!(narrow.revision(), 50);
        feed.publish([event(51, "pools/a", 0), event(52, "pools/b", 0)], 0);
        assert_eq!(narrow.revision(), 0, "an event waits for it: it has not caught up");
        assert_eq!(narrow.next().await.unwrap().revision, 51);
        assert_eq!(narrow.revision(), 52);
        assert_eq!(feed.watchers(), 1);
    }
}
