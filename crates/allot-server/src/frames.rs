//! The change feed's events as Server-Sent Events frames, encoded once for every watch stream.
//!
//! An event's frame is `id: <revision>\nevent: <kind>\ndata: <WatchEvent JSON>\n\n` (the JSON is
//! compact: it holds no line end, so one `data:` line carries it). Every watcher of an event is
//! handed the same [`Arc<Event>`] by the store's feed; [`Frames`] turns it into bytes once and
//! gives every stream a clone of the same [`Bytes`] (a reference count, no copy). With many
//! watchers of a busy key the conversion to the wire type and the JSON encoding are then done
//! once per event, not once per event per watcher.
//!
//! With one stream open, nothing is shared: its frames are written straight into its chunk, and
//! the cache is left alone (keeping a frame, then dropping it long after, cold in the cache, cost
//! more than encoding it).
//!
//! The cache is keyed by revision (the feed gives every event a revision of its own, increasing
//! in publishing order, and a daemon's state serves one store) and keeps the frames of the newest
//! revisions encoded, at most [`MAX_FRAMES`] of them and [`MAX_BYTES`] in all: live watchers are
//! within their buffer of the feed's last revision, so they find what they need; a watcher that
//! replays events older than everything kept gets them encoded anew (and kept while the cache
//! has room). A frame is encoded under the cache's lock, so an event is encoded once even when
//! streams on several serving threads ask for it at the same moment.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use allot_store::Event;
use bytes::Bytes;

use crate::convert::watch as convert;

/// The most frames kept: the default buffer of a watcher ([`allot_store::WatchConfig`]), so that
/// a watcher as far behind as its buffer allows still finds its events encoded.
pub(crate) const MAX_FRAMES: usize = 4096;
/// The most bytes of frames kept.
pub(crate) const MAX_BYTES: usize = 8 << 20;

/// The encoded frames of the newest events, shared by every watch stream of a daemon.
#[derive(Debug)]
pub(crate) struct Frames {
    cache: Mutex<Cache>,
    /// The streams open ([`Reader`]s).
    streams: AtomicUsize,
    max_frames: usize,
    max_bytes: usize,
}

#[derive(Debug, Default)]
struct Cache {
    /// `(revision, frame)`, in revision order.
    frames: VecDeque<(u64, Bytes)>,
    /// The bytes of every frame kept.
    bytes: usize,
    /// Frames encoded since the start (kept or not).
    encoded: u64,
}

impl Default for Frames {
    fn default() -> Frames {
        Frames::with_limits(MAX_FRAMES, MAX_BYTES)
    }
}

impl Frames {
    /// A cache that keeps at most `max_frames` frames and `max_bytes` bytes of them.
    pub(crate) fn with_limits(max_frames: usize, max_bytes: usize) -> Frames {
        Frames { cache: Mutex::new(Cache::default()), streams: AtomicUsize::new(0), max_frames, max_bytes }
    }

    /// A stream's handle on the frames, counted while it is open.
    pub(crate) fn reader(self: &Arc<Frames>) -> Reader {
        self.streams.fetch_add(1, Ordering::Relaxed);
        Reader(self.clone())
    }

    fn lock(&self) -> MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The frame of each of `events`, in order, appended to `out`: those kept under one lock, which
    /// is let go after each frame encoded (so that a stream replaying old events holds up the
    /// others for one encoding at a time).
    pub(crate) fn extend(&self, events: &[Arc<Event>], out: &mut Vec<Bytes>) {
        let mut cache = self.lock();
        // The events come in revision order, often one right after the other in the cache too:
        // where the next one may be.
        let mut hint = 0;
        for event in events {
            let before = cache.encoded;
            out.push(self.frame(&mut cache, event, &mut hint));
            if cache.encoded != before {
                drop(cache);
                cache = self.lock();
            }
        }
    }

    /// How many frames were encoded since the start.
    #[cfg(test)]
    pub(crate) fn encoded(&self) -> u64 {
        self.lock().encoded
    }

    /// The frame of `event`, found at `hint` or searched for, else encoded and kept; `hint`
    /// becomes the place after it.
    fn frame(&self, cache: &mut Cache, event: &Event, hint: &mut usize) -> Bytes {
        let revision = event.revision;
        let frames = &cache.frames;
        let at = match (frames.get(*hint), frames.back()) {
            (Some((kept, _)), _) if *kept == revision => Ok(*hint),
            // A live watcher asks for the newest.
            (_, Some((last, _))) if *last < revision => Err(frames.len()),
            _ => frames.binary_search_by_key(&revision, |(kept, _)| *kept),
        };
        let at = match at {
            Ok(at) => {
                *hint = at + 1;
                return frames[at].1.clone();
            }
            Err(at) => at,
        };
        let frame = encode(event);
        cache.encoded += 1;
        cache.bytes += frame.len();
        cache.frames.insert(at, (revision, frame.clone()));
        *hint = at + 1;
        // The oldest go first (possibly the one just encoded, when it is older than all the rest).
        while cache.frames.len() > self.max_frames || cache.bytes > self.max_bytes {
            let (_, dropped) = cache.frames.pop_front().expect("over a limit: not empty");
            cache.bytes -= dropped.len();
            *hint = hint.saturating_sub(1);
        }
        frame
    }
}

/// An open stream's handle on the [`Frames`] of its daemon.
#[derive(Debug)]
pub(crate) struct Reader(Arc<Frames>);

impl Reader {
    /// The frames of `events`, in order, appended to `out`: from the cache while other streams
    /// are open, else encoded straight into `out`.
    pub(crate) fn write(&self, events: &[Arc<Event>], chunk: &mut Vec<Bytes>, out: &mut Vec<u8>) {
        if self.0.streams.load(Ordering::Relaxed) > 1 {
            self.0.extend(events, chunk);
            return;
        }
        out.reserve(512 * events.len());
        for event in events {
            encode_into(event, out);
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.0.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An event's Server-Sent Events message.
pub(crate) fn encode(event: &Event) -> Bytes {
    let mut frame = Vec::with_capacity(512);
    encode_into(event, &mut frame);
    Bytes::from(frame)
}

/// An event's Server-Sent Events message, appended to `frame`.
fn encode_into(event: &Event, frame: &mut Vec<u8>) {
    frame.extend_from_slice(b"id: ");
    frame.extend_from_slice(itoa::Buffer::new().format(event.revision).as_bytes());
    frame.extend_from_slice(b"\nevent: ");
    frame.extend_from_slice(event.kind.name().as_bytes());
    frame.extend_from_slice(b"\ndata: ");
    // Writing to a Vec fails only when the JSON of a wire type cannot be made, which it always can.
    let _ = serde_json::to_writer(&mut *frame, &convert::event(event));
    frame.extend_from_slice(b"\n\n");
}

#[cfg(test)]
mod tests {
    use allot_core::watch::EventKind;
    use allot_store::EventObject;

    use super::*;

    fn event(revision: u64) -> Arc<Event> {
        Arc::new(Event {
            revision,
            kind: EventKind::PoolRemoved,
            key: format!("pools/p{revision}"),
            cause: None,
            at: 7,
            object: EventObject::Gone,
        })
    }

    fn frames(cache: &Frames, revisions: &[u64]) -> Vec<Bytes> {
        let events: Vec<Arc<Event>> = revisions.iter().map(|&r| event(r)).collect();
        let mut out = Vec::new();
        cache.extend(&events, &mut out);
        out
    }

    #[test]
    fn a_frame_is_the_event_as_one_server_sent_events_message() {
        let frame = encode(&event(42));
        let text = std::str::from_utf8(&frame).unwrap();
        let (head, data) = text.split_once("data: ").unwrap();
        assert_eq!(head, "id: 42\nevent: pool.removed\n");
        let data = data.strip_suffix("\n\n").unwrap();
        assert!(!data.contains('\n'), "{data}");
        let wire: allot_api::WatchEvent = serde_json::from_str(data).unwrap();
        assert_eq!((wire.revision, wire.kind.as_str(), wire.key.as_str()), (42, "pool.removed", "pools/p42"));
    }

    #[test]
    fn each_event_is_encoded_once_and_the_same_bytes_are_shared() {
        let cache = Frames::default();
        let first = frames(&cache, &[1, 2, 3]);
        let again = frames(&cache, &[2, 3, 4]);
        assert_eq!(cache.encoded(), 4);
        assert_eq!(first[1], again[0]);
        // The same allocation, not a copy.
        assert_eq!(first[1].as_ptr(), again[0].as_ptr());
        // Older than the newest, still kept: found by its revision.
        assert_eq!(frames(&cache, &[1])[0].as_ptr(), first[0].as_ptr());
        assert_eq!(cache.encoded(), 4);
    }

    #[test]
    fn streams_on_several_threads_at_once_share_one_encoding() {
        let cache = Frames::default();
        let revisions: Vec<u64> = (1..=200).collect();
        let (events, out) = (&revisions, &cache);
        let got: Vec<Vec<Bytes>> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..8).map(|_| scope.spawn(move || frames(out, events))).collect();
            threads.into_iter().map(|thread| thread.join().unwrap()).collect()
        });
        assert_eq!(cache.encoded(), 200);
        for frames in &got[1..] {
            assert!(frames.iter().zip(&got[0]).all(|(a, b)| a.as_ptr() == b.as_ptr()));
        }
    }

    #[test]
    fn the_newest_frames_are_kept_within_the_limits() {
        let cache = Frames::with_limits(3, usize::MAX);
        frames(&cache, &[10, 20, 30, 40]);
        assert_eq!(cache.encoded(), 4);
        // 10 was dropped: encoded again, and not kept (older than everything kept).
        frames(&cache, &[10, 20, 30, 40, 10]);
        assert_eq!(cache.encoded(), 6);
        // One in between is kept in order, and the oldest goes.
        frames(&cache, &[35]);
        frames(&cache, &[30, 35, 40]);
        assert_eq!(cache.encoded(), 7);
        frames(&cache, &[20]);
        assert_eq!(cache.encoded(), 8);

        let one = encode(&event(1)).len();
        let cache = Frames::with_limits(100, 2 * one);
        frames(&cache, &[1, 2, 3]);
        frames(&cache, &[2, 3]);
        assert_eq!(cache.encoded(), 3, "the two newest fit in the bytes");
        frames(&cache, &[1]);
        assert_eq!(cache.encoded(), 4);
    }
}
