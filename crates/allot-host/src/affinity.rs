//! CPU affinity on Linux: which CPUs a thread may run on. The serving threads use it to pin
//! themselves (`--pin-threads`), and `allot bench compare --pin` to keep the servers it measures
//! and its own load generator on CPUs of their own. Elsewhere nothing is pinned and the functions
//! say so.

use std::io;

/// The CPUs the calling thread may run on, in increasing order (empty if unknown).
#[cfg(target_os = "linux")]
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is an empty set; sched_getaffinity writes at most its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Vec::new();
    }
    // SAFETY: every index is below CPU_SETSIZE, the set's capacity.
    (0..libc::CPU_SETSIZE as usize).filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) }).collect()
}

/// Lets the calling thread run on `cpu` only.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    restrict_thread(0, &[cpu])
}

/// Lets thread `tid` (0: the calling thread) run on `cpus` only. Threads it starts later inherit
/// that, and so does a program it executes. Makes no system call but `sched_setaffinity`, so it
/// may run between `fork` and `exec`.
#[cfg(target_os = "linux")]
pub fn restrict_thread(tid: libc::pid_t, cpus: &[usize]) -> io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET is given indices below CPU_SETSIZE.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        if cpu >= libc::CPU_SETSIZE as usize {
            // No allocation: this may run between `fork` and `exec`.
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    match unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Lets every thread of this process run on `cpus` only (the threads of `/proc/self/task`;
/// threads started later inherit it from the thread that starts them).
#[cfg(target_os = "linux")]
pub fn restrict_process(cpus: &[usize]) -> io::Result<()> {
    for task in std::fs::read_dir("/proc/self/task")? {
        let Ok(tid) = task?.file_name().to_string_lossy().parse::<libc::pid_t>() else { continue };
        match restrict_thread(tid, cpus) {
            // The thread ended meanwhile.
            Err(err) if err.raw_os_error() == Some(libc::ESRCH) => {}
            other => other?,
        }
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
pub fn allowed_cpus() -> Vec<usize> {
    Vec::new()
}

#[cfg(not(target_os = "linux"))]
pub fn restrict_thread(_tid: i32, _cpus: &[usize]) -> io::Result<()> {
    Err(unsupported())
}

#[cfg(not(target_os = "linux"))]
pub fn restrict_process(_cpus: &[usize]) -> io::Result<()> {
    Err(unsupported())
}

#[cfg(not(target_os = "linux"))]
fn unsupported() -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, "CPU affinity is implemented on Linux only")
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_thread_runs_on_its_cpu_only() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty(), "the process may run on some CPU");
        let last = *cpus.last().unwrap();
        let seen = std::thread::spawn(move || {
            pin_current_thread(last).unwrap();
            allowed_cpus()
        })
        .join()
        .unwrap();
        assert_eq!(seen, vec![last]);
        // The pin is the spawned thread's, not the process's.
        assert_eq!(allowed_cpus(), cpus);
    }

    #[test]
    fn another_thread_can_be_restricted_by_its_id() {
        let cpus = allowed_cpus();
        let first = cpus[0];
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tid_tx.send(unsafe { libc::gettid() }).unwrap();
            go_rx.recv().unwrap();
            allowed_cpus()
        });
        restrict_thread(tid_rx.recv().unwrap(), &[first]).unwrap();
        go_tx.send(()).unwrap();
        assert_eq!(thread.join().unwrap(), vec![first]);
        assert_eq!(allowed_cpus(), cpus, "the caller is not restricted");
        assert!(restrict_thread(0, &[libc::CPU_SETSIZE as usize]).is_err(), "a CPU past the set is refused");
    }
}
