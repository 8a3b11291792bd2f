//! Work done in the background at the lowest priority: a thread of its own whose CPU time goes
//! to every other thread first (on Linux, `nice` 19 for that thread alone; elsewhere a plain
//! thread). A snapshot, which reads the whole store, runs so: the calls served meanwhile keep
//! the CPU they need (docs/benchmarks.md, "A million leases").
//!
//! Invariant: only the thread started here is lowered; it ends with its work (a thread's
//! priority cannot be raised again without privileges, so no pooled thread is ever lowered).

use std::io;
use std::thread::JoinHandle;

/// Runs `work` on a new thread named `name` at the lowest priority, and answers its handle.
pub fn spawn_lowest<T: Send + 'static>(
    name: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> io::Result<JoinHandle<T>> {
    std::thread::Builder::new().name(name.to_owned()).spawn(move || {
        if let Err(err) = lower_this_thread() {
            tracing::debug!(error = %err, "could not lower the background thread's priority");
        }
        work()
    })
}

/// The calling thread's nice value set to 19, the lowest priority.
#[cfg(target_os = "linux")]
fn lower_this_thread() -> io::Result<()> {
    // SAFETY: gettid has no preconditions; setpriority with PRIO_PROCESS and a thread id changes
    // that thread alone on Linux.
    let tid = unsafe { libc::gettid() };
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn lower_this_thread() -> io::Result<()> {
    Ok(())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    #[test]
    fn only_the_background_thread_is_lowered() {
        let nice = || unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) };
        let before = nice();
        let inside = super::spawn_lowest("test-lowest", nice).unwrap().join().unwrap();
        assert_eq!(inside, 19);
        assert_eq!(nice(), before, "the caller keeps its priority");
    }
}
