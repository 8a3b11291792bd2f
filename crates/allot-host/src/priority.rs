//! Work done in the background at a low priority: on Linux, `nice` [`NICE`] for one thread alone
//! (elsewhere nothing changes), so that the CPU goes to the other threads first. A snapshot reads
//! the whole store so: the calls served meanwhile keep the CPU they need (docs/benchmarks.md, "A
//! million leases"). Not the lowest (19): on a machine whose CPUs are all busy a thread at 19
//! gets about 1.5 % of one for every busy thread at 0, and a snapshot of a few records took
//! seconds (the contract test's 60 of them ran past its 5 minutes under the whole suite); at 10,
//! about a tenth of that of a busy thread.
//!
//! Invariants: only a thread started for that work is lowered, and it ends with the work (a
//! thread's priority cannot be raised again without privileges: no pooled thread is ever
//! lowered). A thread is lowered only once it holds no lock others wait on: a snapshot of the
//! embedded store checkpoints under the store's lock first, then writes its header, then reads;
//! [`LowerWhenLarge`] lowers it after its first writes, not before (lowered while holding the
//! lock, it made the calls wait for it: 87 ms), and only once it has written [`LARGE`] bytes: a
//! small snapshot (a few records, as the contract test takes 60 of) ends at the caller's
//! priority before lowering it would matter.

use std::io::{self, Write};

/// The nice value a background thread is lowered to.
pub const NICE: i32 = 10;

/// The calling thread's nice value set to [`NICE`].
#[cfg(target_os = "linux")]
pub fn lower_this_thread() -> io::Result<()> {
    // SAFETY: gettid has no preconditions; setpriority with PRIO_PROCESS and a thread id changes
    // that thread alone on Linux.
    let tid = unsafe { libc::gettid() };
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, NICE) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
pub fn lower_this_thread() -> io::Result<()> {
    Ok(())
}

/// How much a writer passes on before [`LowerWhenLarge`] lowers its thread.
pub const LARGE: u64 = 4 << 20;

/// A writer that lowers the thread writing to it to [`NICE`] once [`LARGE`] bytes went through
/// it (never at its first writes: see the module's invariants).
pub struct LowerWhenLarge<W> {
    inner: W,
    written: u64,
    lowered: bool,
}

impl<W> LowerWhenLarge<W> {
    pub fn new(inner: W) -> LowerWhenLarge<W> {
        LowerWhenLarge { inner, written: 0, lowered: false }
    }

    pub fn into_inner(self) -> W {
        self.inner
    }
}

impl<W: Write> Write for LowerWhenLarge<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.written += bytes.len() as u64;
        if !self.lowered && self.written >= LARGE {
            self.lowered = true;
            if let Err(err) = lower_this_thread() {
                tracing::debug!(error = %err, "could not lower the thread's priority");
            }
        }
        self.inner.write(bytes)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::io::Write;

    #[test]
    fn only_the_writing_thread_is_lowered_and_once_it_wrote_much() {
        let nice = || unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) };
        let before = nice();
        let (at_start, after_write) = std::thread::spawn(move || {
            let mut out = super::LowerWhenLarge::new(Vec::new());
            out.write_all(b"header").unwrap();
            let small = nice();
            out.write_all(&vec![0; super::LARGE as usize]).unwrap();
            (small, nice())
        })
        .join()
        .unwrap();
        assert_eq!((at_start, after_write), (before, super::NICE));
        assert_eq!(nice(), before, "the caller keeps its priority");
    }
}
