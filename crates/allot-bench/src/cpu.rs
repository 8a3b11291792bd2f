//! CPU time over a measurement. The machine's, from `/proc/stat`: how busy it was, how idle, and
//! how much time the hypervisor took away (steal); on a shared VM, steal explains most of the
//! run-to-run noise, so the benchmarks report it next to their numbers. And a server process's,
//! from `/proc/<pid>/stat`, for its CPU time per pair.

use std::time::{Duration, Instant};

use serde::Serialize;

/// The counters of the `cpu` line of `/proc/stat`, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CpuTimes {
    busy: u64,
    idle: u64,
    steal: u64,
}

/// Shares of the machine's CPU time between two readings, in percent.
#[derive(Debug, Clone, Copy, Serialize)]
pub(super) struct CpuShare {
    pub(super) busy_pct: f64,
    pub(super) idle_pct: f64,
    pub(super) steal_pct: f64,
}

impl CpuTimes {
    /// The counters now; `None` where `/proc/stat` cannot be read (not Linux).
    pub(super) fn now() -> Option<CpuTimes> {
        CpuTimes::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// Parses the first line of `/proc/stat`: `cpu user nice system idle iowait irq softirq
    /// steal guest guest_nice` (guest time is already counted in user and nice).
    fn parse(stat: &str) -> Option<CpuTimes> {
        let line = stat.lines().next()?;
        let mut fields = line.split_whitespace();
        if fields.next()? != "cpu" {
            return None;
        }
        let values: Vec<u64> = fields.take(8).map(str::parse).collect::<Result<_, _>>().ok()?;
        let [user, nice, system, idle, iowait, irq, softirq, steal] = values.try_into().ok()?;
        Some(CpuTimes { busy: user + nice + system + irq + softirq, idle: idle + iowait, steal })
    }

    /// The shares of the time from `self` to `later`; `None` when no tick passed.
    pub(super) fn share_until(&self, later: &CpuTimes) -> Option<CpuShare> {
        let busy = later.busy.checked_sub(self.busy)?;
        let idle = later.idle.checked_sub(self.idle)?;
        let steal = later.steal.checked_sub(self.steal)?;
        let total = (busy + idle + steal) as f64;
        (total > 0.0).then(|| CpuShare {
            busy_pct: 100.0 * busy as f64 / total,
            idle_pct: 100.0 * idle as f64 / total,
            steal_pct: 100.0 * steal as f64 / total,
        })
    }
}

/// The CPU time (user and system, all threads) process `pid` has used, in seconds, from
/// `/proc/<pid>/stat`.
pub(super) fn process_cpu_seconds(pid: u32) -> Option<f64> {
    stat_cpu_seconds(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The CPU time of each of process `pid`'s threads, in seconds, with the thread's name less a
/// trailing index (`allot-serve-0` and `allot-serve-1` are both `allot-serve`), from
/// `/proc/<pid>/task/<tid>/stat`. A thread that ends between two readings takes its time with
/// it: the process's own total ([`process_cpu_seconds`]) keeps it. `None` where `/proc` cannot
/// be read.
pub(super) fn thread_cpu_seconds(pid: u32) -> Option<Vec<(String, f64)>> {
    let mut threads = Vec::new();
    for thread in std::fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        // A thread that ended since the listing is skipped.
        let Ok(stat) = std::fs::read_to_string(thread.path().join("stat")) else { continue };
        threads.extend(parse_thread_stat(&stat));
    }
    Some(threads)
}

/// A thread's name (less a trailing `-<index>`) and CPU time in seconds, from its `stat` line.
fn parse_thread_stat(stat: &str) -> Option<(String, f64)> {
    let name = &stat[stat.find('(')? + 1..stat.rfind(')')?];
    let name = match name.rsplit_once('-') {
        Some((head, index)) if !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()) => head,
        _ => name,
    };
    Some((name.to_owned(), stat_cpu_seconds(stat)?))
}

/// The user and system time of a `stat` line (of a process or a thread), in seconds: fields 14
/// and 15, in clock ticks of 1/100 s (Linux's USER_HZ).
fn stat_cpu_seconds(stat: &str) -> Option<f64> {
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / 100.0)
}

/// How long the servers took to fall quiet before a target was measured.
pub(super) struct Settled {
    pub(super) waited: Duration,
    pub(super) quiet: bool,
}

impl Settled {
    pub(super) fn describe(&self) -> String {
        let ms = self.waited.as_millis();
        if self.quiet {
            format!("after {ms} ms")
        } else {
            format!("not within {ms} ms")
        }
    }
}

/// A spell of [`QUIET_SPELL`] in which no server used more than [`QUIET_TICKS`] of CPU time is
/// quiet. `/proc` counts CPU time in ticks of 10 ms.
const QUIET_SPELL: Duration = Duration::from_millis(200);
const QUIET_TICKS: f64 = 0.02;
/// The longest wait for the servers to fall quiet; a target is measured anyway after it (and
/// its line says so).
const MAX_SETTLE: Duration = Duration::from_secs(20);

/// Waits until no server works in the background any more: a spell of [`QUIET_SPELL`] in which
/// each used at most [`QUIET_TICKS`] seconds of CPU. What a server does after its load
/// (a daemon's checkpoint of the log its pairs wrote, etcd's compaction) runs on the same CPUs as
/// the next load: measured before it is done, it would be counted against the next one.
pub(super) async fn settle(pids: &[u32]) -> Settled {
    let started = Instant::now();
    let read = || pids.iter().map(|pid| process_cpu_seconds(*pid).unwrap_or(0.0)).collect::<Vec<_>>();
    let mut before = read();
    loop {
        tokio::time::sleep(QUIET_SPELL).await;
        let now = read();
        if now.iter().zip(&before).all(|(now, before)| now - before <= QUIET_TICKS + 1e-9) {
            return Settled { waited: started.elapsed(), quiet: true };
        }
        if started.elapsed() >= MAX_SETTLE {
            return Settled { waited: started.elapsed(), quiet: false };
        }
        before = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_come_from_the_cpu_line() {
        let before = CpuTimes::parse("cpu  100 0 50 800 0 0 0 50 0 0\ncpu0 1 2 3\n").unwrap();
        let after = CpuTimes::parse("cpu  160 0 70 820 10 5 5 90 0 0\n").unwrap();
        let share = before.share_until(&after).unwrap();
        // busy 90, idle 30, steal 40 of 160 ticks.
        assert!((share.busy_pct - 56.25).abs() < 1e-9);
        assert!((share.idle_pct - 18.75).abs() < 1e-9);
        assert!((share.steal_pct - 25.0).abs() < 1e-9);
        assert!(before.share_until(&before).is_none());
    }

    #[test]
    fn other_text_is_not_read_as_counters() {
        assert_eq!(CpuTimes::parse("intr 1 2 3\n"), None);
        assert_eq!(CpuTimes::parse("cpu 1 2 x 4 5 6 7 8\n"), None);
        assert_eq!(CpuTimes::parse("cpu 1 2 3\n"), None);
        assert_eq!(CpuTimes::parse(""), None);
    }

    #[test]
    fn a_thread_is_counted_under_its_name_less_its_index() {
        let stat = "4242 (allot-serve-1) S 1 2 3 4 5 6 7 8 9 10 150 25 0 0 20 0 1";
        assert_eq!(parse_thread_stat(stat), Some(("allot-serve".to_owned(), 1.75)));
        let stat = "7 (tokio-rt-worker) R 1 2 3 4 5 6 7 8 9 10 3 4 0 0";
        assert_eq!(parse_thread_stat(stat), Some(("tokio-rt-worker".to_owned(), 0.07)));
        // A name with a dash and no index, a name with a parenthesis and spaces.
        let stat = "7 (allot-log-spare) S 1 2 3 4 5 6 7 8 9 10 0 100 0 0";
        assert_eq!(parse_thread_stat(stat), Some(("allot-log-spare".to_owned(), 1.0)));
        let stat = "7 (a (b) c-) S 1 2 3 4 5 6 7 8 9 10 1 0 0 0";
        assert_eq!(parse_thread_stat(stat), Some(("a (b) c-".to_owned(), 0.01)));
        assert_eq!(parse_thread_stat("7 (x) S 1 2"), None);
    }

    #[test]
    fn this_machine_can_be_read() {
        if cfg!(target_os = "linux") {
            assert!(CpuTimes::now().is_some());
            let threads = thread_cpu_seconds(std::process::id()).unwrap();
            assert!(!threads.is_empty() && threads.iter().all(|(_, s)| *s >= 0.0), "{threads:?}");
        }
    }
}
