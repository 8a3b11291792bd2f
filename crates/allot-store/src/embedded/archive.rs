//! The change feed's kept events on disk, so that a store reopened (after a restart or a crash)
//! keeps what its feed kept: `<data dir>/events/<revision>.events`, segments each named by the
//! revision (hex) its events come after, each a sequence of frames `[length u32 LE][crc32 u32 LE]
//! [last revision u64 LE][events]`, one per log record that had events.
//!
//! Events are durable with their log record, which carries them (`wal::Events`); a checkpoint
//! copies the events of the records it writes into the database here, as they are, and syncs them
//! before the database commits, so the log's segments are removed only once their events are kept
//! here. Records whose events are here already (a checkpoint that failed after writing them) are
//! skipped by revision. So the files hold every event of every record the database holds, from
//! the first segment's name on, in revision order; at open the log's events are added the same way
//! before the feed's kept events are read back from here, bounded as the feed bounds them.
//!
//! A torn frame at the end of the newest segment (a crash during a write, before its sync: its
//! records are still in the log, and are copied again) is cut at open. A segment named past the
//! last revision before it (the tail of the one before was lost) starts the kept events afresh:
//! what came before is compacted, never handed out with a gap; a frame whose events this version
//! cannot read (a newer version's) is treated the same way. A new segment starts once the current
//! one holds [`SEGMENT_BYTES`]; one whose every event the feed has dropped is deleted, but never the
//! newest (its name says where the kept events start when it is empty).

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt as _;
use std::path::PathBuf;

use allot_core::Millis;

use super::feed::window_of;
#[cfg(test)]
use super::wal::Events;
use super::wal::{self, EventsRef};
use super::OpenError;
use crate::records::events::decode_events;
use crate::watch::{Event, Feed, WatchConfig};

/// The directory of the kept events, in the data directory.
pub const EVENTS_DIR: &str = "events";
/// A new segment starts once the current one holds this many bytes.
pub(super) const SEGMENT_BYTES: u64 = 4 << 20;
/// The revision of a frame's last event, before its events.
const LAST: usize = 8;

/// The kept events' files.
pub(super) struct Archive {
    dir: PathBuf,
    /// The segments, by the revision their events come after, in order.
    segments: Vec<u64>,
    /// The newest segment, to append to, and its length; `None` until one is started (after a
    /// failed write, a new one is).
    current: Option<(File, u64)>,
    /// The last revision kept (or, with none yet, where the kept events start); `None` while no
    /// segment exists (a store of a version before these files: see [`Archive::anchor`]).
    last: Option<u64>,
    /// The last revision written by [`Archive::put`] and not yet synced ([`Archive::sync`]).
    written: Option<u64>,
    /// The frames of a [`Archive::put`], reused: a checkpoint puts in chunks of about
    /// [`CHUNK_BYTES`], so this stays small and warm rather than a fresh allocation of a whole
    /// second's events.
    frames: Vec<u8>,
}

/// A checkpoint puts the events of its records in chunks of about this many bytes.
pub(super) const CHUNK_BYTES: usize = 256 << 10;

/// Where a segment's whole frames end, and the last revision they hold.
fn whole_frames(bytes: &[u8]) -> (usize, Option<u64>) {
    let (mut at, mut last) = (0, None);
    while let Ok(body) = wal::frame_at(bytes, at) {
        let Some(frame_last) = last_of(body) else { break };
        last = Some(frame_last);
        at += wal::HEADER + body.len();
    }
    (at, last)
}

fn last_of(body: &[u8]) -> Option<u64> {
    body.get(..LAST).map(|bytes| u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
}

/// The frame of one record's events.
fn put_frame(out: &mut Vec<u8>, events: EventsRef<'_>) {
    let last = events.last.to_le_bytes();
    let mut crc = crc32fast::Hasher::new();
    crc.update(&last);
    crc.update(events.bytes);
    out.extend_from_slice(&((LAST + events.bytes.len()) as u32).to_le_bytes());
    out.extend_from_slice(&crc.finalize().to_le_bytes());
    out.extend_from_slice(&last);
    out.extend_from_slice(events.bytes);
}

impl Archive {
    /// The files in `dir` (created if missing); a torn tail of the newest segment is cut.
    pub(super) fn open(dir: PathBuf) -> io::Result<Archive> {
        std::fs::create_dir_all(&dir)?;
        let mut segments = Vec::new();
        for entry in std::fs::read_dir(&dir)? {
            let name = entry?.file_name();
            let name = name.to_string_lossy();
            if let Some(after) = name.strip_suffix(".events").and_then(|hex| u64::from_str_radix(hex, 16).ok()) {
                segments.push(after);
            }
        }
        segments.sort_unstable();
        let mut archive = Archive { dir, segments, current: None, last: None, written: None, frames: Vec::new() };
        if let Some(&newest) = archive.segments.last() {
            let path = archive.path(newest);
            let bytes = std::fs::read(&path)?;
            let (whole, last) = whole_frames(&bytes);
            let file = OpenOptions::new().read(true).write(true).open(&path)?;
            if whole < bytes.len() {
                tracing::warn!(
                    segment = %path.display(),
                    "the kept events end in a torn frame (a crash during a write); it is cut"
                );
                file.set_len(whole as u64)?;
                file.sync_all()?;
            }
            archive.current = Some((file, whole as u64));
            archive.last = Some(last.map_or(newest, |last| last.max(newest)));
        }
        Ok(archive)
    }

    fn path(&self, after: u64) -> PathBuf {
        self.dir.join(format!("{after:016x}.events"))
    }

    /// Keeps the events of the records after where it stands (the last revision kept), synced.
    /// Before any segment exists, keeps nothing: those events come before where the kept events
    /// will start.
    #[cfg(test)]
    pub(super) fn write(&mut self, batches: &[Events]) -> io::Result<()> {
        self.put(&batches.iter().map(Events::borrowed).collect::<Vec<_>>())?;
        self.sync()
    }

    /// Writes the events of the records after the last revision written, not synced: they are
    /// kept once [`Archive::sync`] returns. On failure, what was put since the last sync is not
    /// trusted: the next put starts a new segment after the last revision kept.
    pub(super) fn put(&mut self, batches: &[EventsRef<'_>]) -> io::Result<()> {
        let Some(kept) = self.last else { return Ok(()) };
        let mut last = self.written.unwrap_or(kept);
        self.frames.clear();
        for &events in batches {
            if events.last > last {
                put_frame(&mut self.frames, events);
                last = events.last;
            }
        }
        if self.frames.is_empty() {
            return Ok(());
        }
        let frames = std::mem::take(&mut self.frames);
        let appended = self.append(&frames);
        self.frames = frames;
        self.settle(appended)?;
        self.written = Some(last);
        Ok(())
    }

    /// Makes what was put durable: it is kept from now on.
    pub(super) fn sync(&mut self) -> io::Result<()> {
        let Some(written) = self.written else { return Ok(()) };
        let synced = match &self.current {
            Some((file, _)) => file.sync_data(),
            None => Ok(()),
        };
        self.settle(synced)?;
        self.last = Some(written);
        self.written = None;
        Ok(())
    }

    /// After a failed write or sync, forgets what was put since the last sync.
    fn settle(&mut self, outcome: io::Result<()>) -> io::Result<()> {
        if outcome.is_err() {
            self.current = None;
            self.written = None;
        }
        outcome
    }

    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        if self.current.as_ref().is_none_or(|(_, len)| *len >= SEGMENT_BYTES) {
            // What the full segment holds is kept (synced) before the next one starts after it.
            if let (Some((file, _)), Some(written)) = (&self.current, self.written) {
                file.sync_data()?;
                self.last = Some(written);
                self.written = None;
            }
            self.start(self.last.expect("a segment exists once anchored"))?;
        }
        let (file, len) = self.current.as_mut().expect("started above");
        file.write_all_at(bytes, *len)?;
        *len += bytes.len() as u64;
        Ok(())
    }

    /// Starts a segment whose events come after `after`, its directory entry durable.
    fn start(&mut self, after: u64) -> io::Result<()> {
        let path = self.path(after);
        // A newest segment of the same name holds nothing after `after` that is trusted.
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path)?;
        file.sync_all()?;
        File::open(&self.dir)?.sync_all()?;
        if self.segments.last() != Some(&after) {
            self.segments.push(after);
        }
        self.current = Some((file, 0));
        Ok(())
    }

    /// The feed of a store reopened after its last durable record `seq`, with the events kept
    /// here, bounded by `config` as of `now`; and the revision it goes on after: above every
    /// revision published. (Each published event is in a durable record up to `seq`, so below
    /// its window; the events kept here count too, for a record whose events a rebuild after a
    /// failed write numbered past its own window.)
    pub(super) fn reopen_feed(&mut self, seq: u64, config: WatchConfig, now: Millis) -> Result<(Feed, u64), OpenError> {
        let start = window_of(seq + 1).max(self.last.unwrap_or(0));
        let failed = |err: io::Error| OpenError::Log(format!("cannot read the change feed's kept events: {err}"));
        self.anchor(start).map_err(failed)?;
        let (kept, compacted) = self.restore(&config, now).map_err(failed)?;
        Ok((Feed::restore(config, kept, compacted, start), start))
    }

    /// The events up to `revision` that are not kept here are lost (records written into the
    /// database without them): the kept events start afresh after it, in a segment of their own.
    pub(super) fn lost_before(&mut self, revision: u64) -> io::Result<()> {
        if self.last.is_some_and(|last| last < revision) {
            self.start(revision)?;
            self.last = Some(revision);
        }
        Ok(())
    }

    /// Makes sure a segment exists, so that the kept events start somewhere: a store without any
    /// (new, or kept by a version before these files) keeps the events after `start`, above every
    /// revision it published.
    pub(super) fn anchor(&mut self, start: u64) -> io::Result<()> {
        if self.last.is_none() {
            self.start(start)?;
            self.last = Some(start);
        }
        Ok(())
    }

    /// The events kept, as a feed keeps them (at most `retain_events`, none older than
    /// `retain_for` before `now`), and the revision every event after which is among them.
    pub(super) fn restore(&self, config: &WatchConfig, now: Millis) -> io::Result<(Vec<Event>, u64)> {
        let mut kept: VecDeque<Event> = VecDeque::new();
        let (mut compacted, mut last) = (0, 0);
        for (i, &after) in self.segments.iter().enumerate() {
            if i == 0 || after > last {
                if i > 0 {
                    tracing::warn!(after, last, "kept events were lost before a segment; the earlier ones are dropped");
                }
                kept.clear();
                (compacted, last) = (after, after);
            }
            let bytes = std::fs::read(self.path(after))?;
            let mut at = 0;
            while let Ok(body) = wal::frame_at(&bytes, at) {
                at += wal::HEADER + body.len();
                let Some(frame_last) = last_of(body) else { break };
                if frame_last <= last {
                    continue;
                }
                match decode_events(&body[LAST..]) {
                    Ok(events) => {
                        for event in events {
                            if event.revision <= last {
                                continue;
                            }
                            last = event.revision;
                            kept.push_back(event);
                            if kept.len() > config.retain_events {
                                compacted = kept.pop_front().expect("not empty").revision;
                            }
                        }
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "kept events this version cannot read; the earlier ones are dropped");
                        kept.clear();
                        (compacted, last) = (frame_last, frame_last);
                    }
                }
            }
        }
        let horizon = now.saturating_sub(u64::try_from(config.retain_for.as_millis()).unwrap_or(u64::MAX));
        while kept.front().is_some_and(|event| event.at < horizon) {
            compacted = kept.pop_front().expect("not empty").revision;
        }
        Ok((kept.into(), compacted))
    }

    /// Deletes the segments whose every event is at or before `compacted` (the feed no longer
    /// keeps them), never the newest.
    pub(super) fn trim(&mut self, compacted: u64) {
        while self.segments.len() > 1 && self.segments[1] <= compacted {
            let path = self.path(self.segments[0]);
            match std::fs::remove_file(&path) {
                Err(err) if err.kind() != io::ErrorKind::NotFound => {
                    tracing::warn!(error = %err, segment = %path.display(), "cannot delete kept events no longer kept");
                    return;
                }
                _ => drop(self.segments.remove(0)),
            }
        }
    }

    /// How many segments there are.
    #[cfg(test)]
    fn segments(&self) -> usize {
        self.segments.len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use allot_core::watch::EventKind;

    use super::*;
    use crate::records::events::encode_events;
    use crate::watch::EventObject;

    fn event(revision: u64, at: Millis) -> Event {
        Event {
            revision,
            kind: EventKind::PoolRemoved,
            key: format!("pools/p{revision}"),
            cause: None,
            at,
            object: EventObject::Gone,
        }
    }

    fn batch(revisions: impl IntoIterator<Item = u64>) -> Events {
        let events: Vec<Event> = revisions.into_iter().map(|r| event(r, r)).collect();
        Events { last: events.last().unwrap().revision, bytes: encode_events(&events) }
    }

    /// An archive in a directory of its own (kept while the first is), its events kept from 0.
    fn anchored() -> (tempfile::TempDir, PathBuf, Archive) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(EVENTS_DIR);
        let mut archive = Archive::open(path.clone()).unwrap();
        archive.anchor(0).unwrap();
        (dir, path, archive)
    }

    /// One event of half a segment's bytes.
    fn big(revision: u64) -> Events {
        let events = vec![Event { key: "k".repeat(SEGMENT_BYTES as usize / 2), ..event(revision, revision) }];
        Events { last: revision, bytes: encode_events(&events) }
    }

    fn config(retain_events: usize) -> WatchConfig {
        WatchConfig { retain_events, retain_for: Duration::from_secs(3600), ..WatchConfig::default() }
    }

    fn revisions(archive: &Archive, retain_events: usize) -> (Vec<u64>, u64) {
        let (events, compacted) = archive.restore(&config(retain_events), 100).unwrap();
        (events.iter().map(|e| e.revision).collect(), compacted)
    }

    #[test]
    fn events_written_read_back_once_in_order_bounded_as_the_feed_bounds_them() {
        let dir = tempfile::tempdir().unwrap();
        let mut archive = Archive::open(dir.path().join(EVENTS_DIR)).unwrap();
        // Nothing is kept before the start is known.
        archive.write(&[batch([1, 2])]).unwrap();
        archive.anchor(10).unwrap();
        assert_eq!(revisions(&archive, 100), (vec![], 10));
        archive.write(&[batch([11, 12]), batch([20])]).unwrap();
        // Written again (a checkpoint that failed after writing): kept once.
        archive.write(&[batch([11, 12]), batch([20]), batch([30, 31])]).unwrap();
        drop(archive);
        let mut archive = Archive::open(dir.path().join(EVENTS_DIR)).unwrap();
        archive.anchor(99).unwrap();
        assert_eq!(revisions(&archive, 100), (vec![11, 12, 20, 30, 31], 10));
        assert_eq!(revisions(&archive, 2), (vec![30, 31], 20));
        // By age: the events at 11 and 12 are older than 100 - 87.
        let by_age = WatchConfig { retain_for: Duration::from_millis(87), ..config(100) };
        let (events, compacted) = archive.restore(&by_age, 100).unwrap();
        assert_eq!((events.len(), compacted), (3, 12));
    }

    /// A checkpoint's chunks: put unsynced, across segments, then synced once; the events of
    /// records read again are kept once.
    #[test]
    fn chunks_put_across_segments_are_kept_once_synced() {
        let (_dir, path, mut archive) = anchored();
        archive.put(&[batch([1]).borrowed(), big(2).borrowed()]).unwrap();
        archive.put(&[big(3).borrowed()]).unwrap();
        // A chunk put again (the same records read twice) is kept once.
        archive.put(&[big(3).borrowed(), big(4).borrowed(), batch([5]).borrowed()]).unwrap();
        archive.sync().unwrap();
        assert_eq!(archive.segments(), 2, "a new segment once one holds SEGMENT_BYTES");
        drop(archive);
        let mut archive = Archive::open(path.clone()).unwrap();
        assert_eq!(revisions(&archive, 100).0, [1, 2, 3, 4, 5]);
        // Unsynced puts are kept only by a sync; a crash before it keeps what was synced, and the
        // records, still in the log, put their events again.
        archive.put(&[batch([6, 7]).borrowed()]).unwrap();
        archive.put(&[batch([6, 7]).borrowed(), batch([8]).borrowed()]).unwrap();
        archive.sync().unwrap();
        assert_eq!(revisions(&archive, 100).0, [1, 2, 3, 4, 5, 6, 7, 8]);
    }

    #[test]
    fn a_torn_tail_is_cut_and_written_again() {
        let (_dir, path, mut archive) = anchored();
        archive.write(&[batch([1, 2]), batch([3])]).unwrap();
        let file = path.join(format!("{:016x}.events", 0));
        let whole = std::fs::metadata(&file).unwrap().len();
        archive.write(&[batch([4, 5])]).unwrap();
        drop(archive);
        // A crash in the middle of the last write: every cut of it loses that frame only.
        let bytes = std::fs::read(&file).unwrap();
        for cut in whole as usize + 1..bytes.len() {
            std::fs::write(&file, &bytes[..cut]).unwrap();
            let mut archive = Archive::open(path.clone()).unwrap();
            assert_eq!(std::fs::metadata(&file).unwrap().len(), whole, "cut {cut}");
            assert_eq!(revisions(&archive, 100).0, [1, 2, 3], "cut {cut}");
            // Its record is still in the log: written again, after what is whole.
            archive.write(&[batch([3]), batch([4, 5])]).unwrap();
            assert_eq!(revisions(&archive, 100).0, [1, 2, 3, 4, 5], "cut {cut}");
        }
    }

    #[test]
    fn segments_rotate_and_are_deleted_once_every_event_in_them_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let mut archive = Archive::open(dir.path().join(EVENTS_DIR)).unwrap();
        archive.anchor(0).unwrap();
        for revision in 1..=6 {
            archive.write(&[big(revision)]).unwrap();
        }
        // Two frames to a segment: [0: 1 2] [2: 3 4] [4: 5 6].
        assert_eq!(archive.segments(), 3);
        assert_eq!(revisions(&archive, 100).0, [1, 2, 3, 4, 5, 6]);
        archive.trim(3);
        assert_eq!(archive.segments(), 2, "the first holds nothing after 2");
        assert_eq!(revisions(&archive, 100), (vec![3, 4, 5, 6], 2));
        archive.trim(100);
        assert_eq!(archive.segments(), 1, "the newest stays");
        assert_eq!(revisions(&archive, 100), (vec![5, 6], 4));
    }

    /// A rebuild that takes the log back to an earlier record numbers the next record's events
    /// past its own window; reopened, the store goes on above them all the same.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reopened_store_goes_on_above_every_event_it_kept() {
        use crate::prelude::*;

        let dir = tempfile::tempdir().unwrap();
        let config = crate::EmbeddedConfig::new(dir.path().to_owned());
        let store = crate::EmbeddedStore::open(&config).unwrap();
        let far = store.revision() + (5 << 20);
        let kept = [event(far, store.now())];
        store.shutdown().await;
        drop(store);
        let mut archive = Archive::open(dir.path().join(EVENTS_DIR)).unwrap();
        archive.write(&[Events { last: far, bytes: encode_events(&kept) }]).unwrap();
        drop(archive);
        let store = crate::EmbeddedStore::open(&config).unwrap();
        assert!(store.revision() >= far);
        let mut watcher = store.watch(allot_core::watch::Filter::default(), Some(far - 1)).unwrap();
        assert_eq!(watcher.next().await.unwrap().revision, far);
        store.put_namespace(allot_core::NamespaceName::new("hive").unwrap(), 1).await.unwrap();
        assert!(watcher.next().await.unwrap().revision > far, "a new event is numbered after it");
        store.shutdown().await;
    }

    /// A version before the kept events' files, run on the data directory meanwhile, wrote
    /// records into the database without keeping their events: what was kept before is not
    /// followed by them, so it is compacted, never handed out with a gap.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn events_an_older_version_did_not_keep_are_a_compaction() {
        use crate::prelude::*;
        use crate::records::{META, META_EVENTS_SEQ, META_SEQ};
        use redb::ReadableTable as _;

        let dir = tempfile::tempdir().unwrap();
        let config = crate::EmbeddedConfig::new(dir.path().to_owned());
        let store = crate::EmbeddedStore::open(&config).unwrap();
        let start = store.revision();
        store.put_namespace(allot_core::NamespaceName::new("hive").unwrap(), 1).await.unwrap();
        store.shutdown().await;
        drop(store);
        let store = crate::EmbeddedStore::open(&config).unwrap();
        assert!(store.watch(allot_core::watch::Filter::default(), Some(start)).is_ok(), "kept");
        store.shutdown().await;
        drop(store);
        // As an older version leaves it: the last record in the database, its events not kept.
        let seq = {
            let db = redb::Database::create(dir.path().join(super::super::DB_FILE)).unwrap();
            let txn = db.begin_write().unwrap();
            let seq = {
                let mut meta = txn.open_table(META).unwrap();
                let seq = meta.get(META_SEQ).unwrap().unwrap().value();
                meta.insert(META_EVENTS_SEQ, seq - 1).unwrap();
                seq
            };
            txn.commit().unwrap();
            seq
        };
        let store = crate::EmbeddedStore::open(&config).unwrap();
        let oldest = window_of(seq + 1);
        assert_eq!(store.feed_kept(), (0, oldest));
        assert_eq!(
            store.watch(allot_core::watch::Filter::default(), Some(start)).err(),
            Some(crate::WatchError::Compacted { since: start, oldest })
        );
        store.shutdown().await;
    }

    #[test]
    fn events_lost_before_a_segment_or_unreadable_are_never_handed_out_with_a_gap() {
        let (_dir, _, mut archive) = anchored();
        archive.write(&[batch([1]), batch([2])]).unwrap();
        // A segment that starts after 5: events 3 to 5 are not here.
        archive.start(5).unwrap();
        archive.write(&[batch([6])]).unwrap();
        assert_eq!(revisions(&archive, 100), (vec![6], 5));
        // A frame whose events do not decode: what comes before it is dropped with it.
        archive.write(&[Events { last: 8, bytes: vec![1, 0xff, 0xff] }, batch([9])]).unwrap();
        assert_eq!(revisions(&archive, 100), (vec![9], 8));
    }
}
