//! Work done in the background at the lowest priority: on Linux, `nice` 19 for one thread alone
//! (elsewhere nothing changes), so that the CPU goes to every other thread first. A snapshot
//! reads the whole store so: the calls served meanwhile keep the CPU they need (docs/
//! benchmarks.md, "A million leases").
//!
//! Invariants: only a thread started for that work is lowered, and it ends with the work (a
//! thread's priority cannot be raised again without privileges: no pooled thread is ever
//! lowered). A thread is lowered only once it holds no lock others wait on: a snapshot of the
//! embedded store checkpoints under the store's lock first, then writes its header, then reads;
//! [`LowerOnFirstWrite`] lowers it at that first write, not before (lowered while holding the
//! lock, it made the calls wait for it: 87 ms).

use std::io::{self, Write};

/// The calling thread's nice value set to 19, the lowest priority.
#[cfg(target_os = "linux")]
pub fn lower_this_thread() -> io::Result<()> {
    // SAFETY: gettid has no preconditions; setpriority with PRIO_PROCESS and a thread id changes
    // that thread alone on Linux.
    let tid = unsafe { libc::gettid() };
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
pub fn lower_this_thread() -> io::Result<()> {
    Ok(())
}

/// A writer that lowers the thread writing to it to the lowest priority at its first write.
pub struct LowerOnFirstWrite<W> {
    inner: W,
    lowered: bool,
}

impl<W> LowerOnFirstWrite<W> {
    pub fn new(inner: W) -> LowerOnFirstWrite<W> {
        LowerOnFirstWrite { inner, lowered: false }
    }

    pub fn into_inner(self) -> W {
        self.inner
    }
}

impl<W: Write> Write for LowerOnFirstWrite<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        if !self.lowered {
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
    fn only_the_writing_thread_is_lowered_and_from_its_first_write() {
        let nice = || unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) };
        let before = nice();
        let (at_start, after_write) = std::thread::spawn(move || {
            let mut out = super::LowerOnFirstWrite::new(Vec::new());
            let at_start = nice();
            out.write_all(b"header").unwrap();
            (at_start, nice())
        })
        .join()
        .unwrap();
        assert_eq!((at_start, after_write), (before, 19));
        assert_eq!(nice(), before, "the caller keeps its priority");
    }
}
