//! Scheduled backups (`[backup]`): every `every`, a snapshot of the store written into `dir` as
//! `allot snapshot save` writes one (beside it first, checked whole, then renamed), and the oldest
//! beyond `keep` removed. Each outcome is a line of the log and counted in `/metrics`
//! (`allot_backups_total`, `allot_backup_last_success_timestamp_seconds`). On Redis, where
//! several daemons may have `[backup]`, only the one that schedules applications takes them (its
//! snapshot is the one whose applications agree with the pools: `allot_store_redis::snapshot`).

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use allot_store::Store;

use super::config::BackupConfig;

const PREFIX: &str = "allot-";
const SUFFIX: &str = ".snapshot";
const PARTIAL: &str = ".partial";

/// Takes a backup every `config.every`, from the first one `every` after the start, until the
/// process ends.
pub(super) async fn run(store: Arc<dyn Store>, metrics: Arc<allot_server::Metrics>, config: BackupConfig) {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + config.every, config.every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if store.apps_home() != allot_store::AppsHome::Here {
            tracing::debug!("backup: another daemon schedules applications and takes the backups");
            continue;
        }
        let (store, taken, runtime) = (store.clone(), config.clone(), tokio::runtime::Handle::current());
        let (done, outcome) = tokio::sync::oneshot::channel();
        // On a thread of its own, lowered once the read began, as `GET /v1/snapshot` takes one.
        let started = std::thread::Builder::new().name("allot-backup".into()).spawn(move || {
            let _runtime = runtime.enter();
            let _ = done.send(back_up(store.as_ref(), &taken));
        });
        let outcome = match started {
            Ok(_) => outcome.await.unwrap_or_else(|_| Err("the backup stopped".to_owned())),
            Err(err) => Err(format!("cannot start the backup's thread: {err}")),
        };
        match outcome {
            Ok((path, revision, bytes, removed)) => {
                tracing::info!(path = %path.display(), revision, bytes, removed, "backup written");
                metrics.backed_up(Some(unix_seconds()));
            }
            Err(reason) => {
                tracing::error!(dir = %config.dir.display(), %reason, "backup failed");
                metrics.backed_up(None);
            }
        }
    }
}

/// Writes one backup; answers its path, revision and size, and how many older ones it removed.
fn back_up(store: &dyn Store, config: &BackupConfig) -> Result<(PathBuf, u64, u64, usize), String> {
    let dir = &config.dir;
    fs::create_dir_all(dir).map_err(|err| format!("cannot make {}: {err}", dir.display()))?;
    let stamp = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string().replace(':', "-");
    let path = dir.join(format!("{PREFIX}{stamp}{SUFFIX}"));
    let partial = dir.join(format!("{PREFIX}{stamp}{SUFFIX}{PARTIAL}"));
    let written = (|| {
        let file = File::create(&partial).map_err(|err| format!("cannot write {}: {err}", partial.display()))?;
        let mut out = allot_host::priority::LowerWhenLarge::new(file);
        store.snapshot(&mut out).map_err(|err| err.to_string())?;
        let out = out.into_inner();
        out.sync_all().map_err(|err| format!("cannot write {}: {err}", partial.display()))?;
        let (header, summary) = crate::cli::snapshot::seal(&partial, &path)?;
        Ok::<_, String>((header.revision, summary.bytes))
    })();
    let (revision, bytes) = written.inspect_err(|_| {
        let _ = fs::remove_file(&partial);
    })?;
    Ok((path, revision, bytes, prune(dir, config.keep)))
}

/// Removes the oldest backups beyond the newest `keep`, and what a backup cut short by a stop
/// left; answers how many backups it removed.
fn prune(dir: &Path, keep: usize) -> usize {
    let Ok(entries) = fs::read_dir(dir) else { return 0 };
    let mut backups = Vec::new();
    for name in entries.flatten().map(|entry| entry.file_name().to_string_lossy().into_owned()) {
        if name.strip_suffix(PARTIAL).is_some_and(is_backup) {
            let _ = fs::remove_file(dir.join(&name));
        } else if is_backup(&name) {
            backups.push(name);
        }
    }
    // The names hold the time they were taken, in a form that sorts as time does.
    backups.sort_unstable();
    let old = backups.len().saturating_sub(keep);
    backups[..old].iter().filter(|name| fs::remove_file(dir.join(name.as_str())).is_ok()).count()
}

/// Whether `name` is one this daemon gives its backups: `allot-` and the time it was taken
/// (RFC 3339 to the millisecond, `:` written `-`), then `.snapshot`. Another file in the
/// directory (an archive saved by hand, say) is never counted or removed.
fn is_backup(name: &str) -> bool {
    let Some(stamp) = name.strip_prefix(PREFIX).and_then(|rest| rest.strip_suffix(SUFFIX)) else { return false };
    let mut time = stamp.as_bytes().to_vec();
    for at in [13, 16] {
        match time.get_mut(at) {
            Some(byte @ b'-') => *byte = b':',
            _ => return false,
        }
    }
    stamp.len() == "2026-01-01T00-00-00.000Z".len()
        && std::str::from_utf8(&time).is_ok_and(|time| humantime::parse_rfc3339(time).is_ok())
}

fn unix_seconds() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_secs())
}

#[cfg(test)]
mod tests {
    use super::is_backup;

    #[test]
    fn only_the_daemons_own_backups_are_pruned() {
        assert!(is_backup("allot-2026-12-02T16-42-05.123Z.snapshot"));
        for name in [
            "allot-before-upgrade.snapshot",
            "allot-2026-12-02.snapshot",
            "allot-2026-12-02T16:42:05.123Z.snapshot",
            "allot-2026-12-02T16-42-05.123Z.snapshot.bak",
            "mine-2026-12-02T16-42-05.123Z.snapshot",
            "allot-2026-13-02T16-42-05.123Z.snapshot",
        ] {
            assert!(!is_backup(name), "{name}");
        }
    }
}
