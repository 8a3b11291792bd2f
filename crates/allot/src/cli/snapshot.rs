//! `allot snapshot`: save a daemon's whole store to one archive while it serves (`save`), check an
//! archive (`status`), and make a new data directory from one (`restore`, offline). The archive's
//! layout is `allot_store::snapshot`'s.

use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use allot_client::ClientError;
use allot_store::embedded::snapshot::{restore, LeaseTime, RestoreOptions, DEFAULT_BUMP_REVISION};
use allot_store::snapshot::{verify, SnapshotHeader, SnapshotSummary};
use serde::Serialize;

use super::{client, emit_ids, finish, usage_error, Common, EXIT_ERROR, EXIT_OK};

const SAVE_AFTER_HELP: &str = "\
The archive is written beside FILE first (FILE.partial), checked whole, then renamed to FILE:
FILE is either a whole archive or left as it was. The daemon goes on serving meanwhile; the
archive holds every change up to the revision it names, and none after.

Exit codes:
  0  saved and checked
  1  error: the daemon refused (`error: <code>: <message>`: forbidden without the daemon's admin
     permission; unsupported on a store that takes no snapshots), could not be reached, or the
     archive arrived damaged or cut short (nothing is left at FILE)
  2  usage error";

const STATUS_AFTER_HELP: &str = "\
Reads the whole archive and checks its SHA-256; prints what it holds.

Exit codes:
  0  the archive is whole
  1  error: it is not an allot snapshot, it was cut short or altered, or it cannot be read
  2  usage error";

const RESTORE_AFTER_HELP: &str = "\
With --data-dir, makes a new data directory for `allot serve --data-dir DIR` (DIR must not exist,
or be empty: an empty one, a mount point say, is filled where it is); no daemon is needed. The
archive is checked whole and its records loaded as a start would load them before anything
appears in DIR: a refused archive leaves nothing behind.

With --store redis://HOST:PORT (or redis+cluster://NODE,NODE...), fills that Redis for daemons
started with the same --store. The archive is checked whole first; a Redis that holds allot's
state is refused unless --replace (what allot keeps there is removed first, from every primary of
a cluster). Stop the daemons that use that Redis while it runs. Times move onto Redis's clock as
--leases says.

The restored daemon's revisions start above the archive's by at least --bump-revision, and it
keeps no events from before: a watcher resuming from an earlier revision is told to list again
(410 revision_compacted). Fencing numbers go on above every number the archive holds.

Exit codes:
  0  restored
  1  error: the archive is damaged or of another version, DIR holds files or cannot be written,
     or the Redis holds allot's state or cannot be reached
  2  usage error";

#[derive(Debug, clap::Subcommand)]
pub(crate) enum SnapshotCommand {
    /// Save the daemon's whole store (quotas, grants, sessions, pools, allocs, queues,
    /// applications, tasks, runs, the output catalog, API tokens as hashes and bindings) to FILE,
    /// while it serves. Needs the daemon's admin permission.
    #[command(after_help = SAVE_AFTER_HELP)]
    Save {
        /// Where to write the archive.
        file: PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// Check an archive and print what it holds.
    #[command(after_help = STATUS_AFTER_HELP)]
    Status {
        /// The archive.
        file: PathBuf,
        /// Print it as JSON, for scripts.
        #[arg(long)]
        json: bool,
        /// Print only the archive's path when it is whole.
        #[arg(short, long, conflicts_with = "json")]
        quiet: bool,
    },
    /// Make a new data directory for the embedded store, or fill an empty Redis, from an archive.
    #[command(after_help = RESTORE_AFTER_HELP)]
    #[command(group(clap::ArgGroup::new("target").required(true).args(["data_dir", "store"])))]
    Restore {
        /// The archive.
        file: PathBuf,
        /// The data directory to make (it must not exist, or be empty).
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
        /// The Redis to fill instead (`redis://HOST:PORT`, `rediss://...`, or
        /// `redis+cluster://NODE,NODE...`).
        #[arg(long, value_name = "ADDRESS")]
        store: Option<String>,
        /// With --store: remove what allot keeps in that Redis first (on a cluster, on every primary).
        #[arg(long, requires = "store")]
        replace: bool,
        /// How the time since the snapshot counts: `resume` (leases, sessions and allocs go on
        /// with the time they had left when it was taken) or `expire` (what would have expired
        /// since, expires at the first start).
        #[arg(long, value_enum, default_value = "resume")]
        leases: Leases,
        /// The restored daemon's first revision is above the archive's by at least this much,
        /// so that a watcher of the daemon the snapshot came from, which went on after it, never
        /// resumes into revisions given twice.
        #[arg(long, value_name = "REVISIONS", default_value_t = DEFAULT_BUMP_REVISION)]
        bump_revision: u64,
        /// Print the outcome as JSON, for scripts.
        #[arg(long)]
        json: bool,
        /// Print only the data directory made (or the Redis filled).
        #[arg(short, long, conflicts_with = "json")]
        quiet: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Leases {
    Resume,
    Expire,
}

/// What `save`, `status` and `restore` print with `--json`.
#[derive(Debug, Serialize)]
struct Described {
    file: String,
    format: u32,
    revision: u64,
    taken_at_ms: u64,
    backend: String,
    bytes: u64,
    sha256: String,
    /// Records by table, in the archive's order.
    records: Vec<(String, u64)>,
    /// After a restore: the data directory made (or the Redis filled), and the restored
    /// daemon's first revision.
    #[serde(skip_serializing_if = "Option::is_none")]
    data_dir: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    store: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    first_revision: Option<u64>,
}

impl Described {
    fn of(file: &Path, header: &SnapshotHeader, summary: &SnapshotSummary) -> Described {
        Described {
            file: file.display().to_string(),
            format: header.format,
            revision: header.revision,
            taken_at_ms: header.taken_at_ms,
            backend: header.backend.clone(),
            bytes: summary.bytes,
            sha256: summary.sha256.clone(),
            records: summary.records.iter().map(|(table, n)| (table.name().to_owned(), *n)).collect(),
            data_dir: None,
            store: None,
            first_revision: None,
        }
    }

    fn human(&self) -> String {
        let taken = std::time::UNIX_EPOCH + std::time::Duration::from_millis(self.taken_at_ms);
        let records: Vec<String> = self.records.iter().map(|(table, n)| format!("{table} {n}")).collect();
        let records = if records.is_empty() { "none".to_owned() } else { records.join(", ") };
        let mut text = format!(
            "{}: revision {}, taken at {} from the {} store\n  records: {records}\n  {} bytes, sha256 {}\n",
            self.file,
            self.revision,
            humantime::format_rfc3339_millis(taken),
            self.backend,
            self.bytes,
            self.sha256,
        );
        if let (Some(dir), Some(first)) = (&self.data_dir, self.first_revision) {
            text.push_str(&format!(
                "restored into {dir}; its revisions start at {first}\nstart it with: allot serve --data-dir {dir}\n"
            ));
        }
        if let (Some(store), Some(first)) = (&self.store, self.first_revision) {
            text.push_str(&format!(
                "restored into {store}; its revisions start at {first}\nstart the daemons with: allot serve --store {store}\n"
            ));
        }
        text
    }
}

/// Runs `allot snapshot`; `before` holds the options given before the command.
pub(crate) async fn snapshot(command: SnapshotCommand, before: &Common) -> anyhow::Result<ExitCode> {
    match command {
        SnapshotCommand::Save { file, mut common } => {
            if let Err(usage) = common.merge(before) {
                return Ok(usage_error(&usage));
            }
            Ok(match save(file, &common).await {
                Ok(code) => ExitCode::from(code),
                Err(Failed::Client(err)) => finish(&common, Err(err)),
                Err(Failed::Here(message)) => {
                    eprintln!("error: {message}");
                    ExitCode::from(EXIT_ERROR)
                }
            })
        }
        SnapshotCommand::Status { file, json, quiet } => {
            let output = match Common::offline("snapshot status", before, json, quiet) {
                Ok(output) => output,
                Err(usage) => return Ok(usage_error(&usage)),
            };
            Ok(offline(&output, status(&file)))
        }
        SnapshotCommand::Restore { file, data_dir, store, replace, leases, bump_revision, json, quiet } => {
            let output = match Common::offline("snapshot restore", before, json, quiet) {
                Ok(output) => output,
                Err(usage) => return Ok(usage_error(&usage)),
            };
            let leases = match leases {
                Leases::Resume => LeaseTime::Resume,
                Leases::Expire => LeaseTime::Expire,
            };
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| since.as_millis() as u64);
            let options = RestoreOptions { leases, bump_revision, now_ms };
            let outcome = match (data_dir, store) {
                (Some(data_dir), _) => restore_into(&file, &data_dir, &options),
                (None, Some(address)) => restore_into_redis(&file, &address, &options, replace).await,
                (None, None) => unreachable!("clap requires one of --data-dir and --store"),
            };
            Ok(offline(&output, outcome))
        }
    }
}

/// Prints the outcome of a command that needs no daemon.
fn offline(output: &Common, outcome: anyhow::Result<Described>) -> ExitCode {
    match outcome {
        Ok(described) => {
            // What it names: the data directory made or the Redis filled, else the archive.
            let id = described
                .data_dir
                .clone()
                .or_else(|| described.store.clone())
                .unwrap_or_else(|| described.file.clone());
            let _ = emit_ids(output, &described, vec![id], Described::human);
            ExitCode::from(EXIT_OK)
        }
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

fn status(file: &Path) -> anyhow::Result<Described> {
    let (header, summary) = check(file).map_err(|err| anyhow::anyhow!("{err}"))?;
    Ok(Described::of(file, &header, &summary))
}

/// Reads the archive `file` whole, checking it.
fn check(file: &Path) -> Result<(SnapshotHeader, SnapshotSummary), String> {
    let input = File::open(file).map_err(|err| format!("cannot read {}: {err}", file.display()))?;
    verify(std::io::BufReader::with_capacity(1 << 20, input)).map_err(|err| format!("{}: {err}", file.display()))
}

/// Checks the archive written (and synced) at `partial` whole, then renames it to `file`,
/// durably: whatever is at `file` is a whole archive. `save` and scheduled backups end so.
pub(crate) fn seal(partial: &Path, file: &Path) -> Result<(SnapshotHeader, SnapshotSummary), String> {
    let checked = check(partial).map_err(|err| format!("the archive written is not whole: {err}"))?;
    fs::rename(partial, file).map_err(|err| format!("cannot write {}: {err}", file.display()))?;
    let dir = file.parent().filter(|dir| !dir.as_os_str().is_empty()).unwrap_or(Path::new("."));
    File::open(dir).and_then(|dir| dir.sync_all()).map_err(|err| format!("cannot sync {}: {err}", dir.display()))?;
    Ok(checked)
}

fn restore_into(file: &Path, data_dir: &Path, options: &RestoreOptions) -> anyhow::Result<Described> {
    let input = File::open(file).map_err(|err| anyhow::anyhow!("cannot read {}: {err}", file.display()))?;
    let restored = restore(input, data_dir, options).map_err(|err| anyhow::anyhow!("{}: {err}", file.display()))?;
    let mut described = Described::of(file, &restored.header, &restored.summary);
    described.data_dir = Some(data_dir.display().to_string());
    described.first_revision = Some(restored.first_revision);
    Ok(described)
}

/// Fills the Redis at `address` from the archive `file` (see `allot_store_redis::snapshot`).
async fn restore_into_redis(
    file: &Path,
    address: &str,
    options: &RestoreOptions,
    replace: bool,
) -> anyhow::Result<Described> {
    let config = allot_store_redis::RedisConfig::parse(address).map_err(|err| anyhow::anyhow!("{err}"))?;
    let redacted = config.redacted_urls().join(",");
    let store = tokio::time::timeout(std::time::Duration::from_secs(30), allot_store_redis::RedisStore::open(&config))
        .await
        .map_err(|_| anyhow::anyhow!("cannot reach Redis at {redacted} within 30 s"))??;
    let restored = store.restore(file, options, replace).await;
    allot_store::Store::shutdown(&store).await;
    let restored = restored.map_err(|err| anyhow::anyhow!("{}: {err}", file.display()))?;
    let mut described = Described::of(file, &restored.header, &restored.summary);
    described.store = Some(redacted);
    described.first_revision = Some(restored.first_revision);
    Ok(described)
}

/// Why `save` failed: the daemon's answer, or here (the file, an archive that arrived damaged).
enum Failed {
    Client(ClientError),
    Here(String),
}

impl From<ClientError> for Failed {
    fn from(err: ClientError) -> Failed {
        Failed::Client(err)
    }
}

async fn save(file: PathBuf, common: &Common) -> Result<u8, Failed> {
    let partial = partial_of(&file);
    let cannot =
        |what: &str, path: &Path, err: std::io::Error| Failed::Here(format!("cannot {what} {}: {err}", path.display()));
    let client = client(common)?;
    let mut stream = client.snapshot().await?;
    let written = async {
        let out = File::create(&partial).map_err(|err| cannot("write", &partial, err))?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, out);
        while let Some(chunk) = stream.chunk().await? {
            out.write_all(&chunk).map_err(|err| cannot("write", &partial, err))?;
        }
        let out = out.into_inner().map_err(|err| cannot("write", &partial, err.into_error()))?;
        out.sync_all().map_err(|err| cannot("write", &partial, err))?;
        let (header, summary) = seal(&partial, &file).map_err(Failed::Here)?;
        Ok::<_, Failed>(Described::of(&file, &header, &summary))
    }
    .await;
    match written {
        Ok(described) => Ok(emit_ids(common, &described, vec![described.file.clone()], Described::human)?),
        Err(err) => {
            let _ = fs::remove_file(&partial);
            Err(err)
        }
    }
}

/// Where `save` writes before the archive is checked: beside `file`.
fn partial_of(file: &Path) -> PathBuf {
    let mut name = file.file_name().map(|name| name.to_os_string()).unwrap_or_else(|| "snapshot".into());
    name.push(".partial");
    file.with_file_name(name)
}
