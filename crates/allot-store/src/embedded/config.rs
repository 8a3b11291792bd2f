//! How an embedded store is opened: its directory, its durability, and why opening fails.

use std::path::PathBuf;
use std::sync::Arc;

use allot_core::pools::PoolError;

use crate::clock::{SystemTime, TimeSource};
use crate::ids::{IdSource, RandomIds};
use crate::records::{CorruptRecord, FORMAT_VERSION};
use crate::watch::WatchConfig;

/// What an acknowledged change survives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Durability {
    /// Flushed to disk (fdatasync) before the answer: survives a power loss.
    #[default]
    Disk,
    /// In the operating system's page cache before the answer: survives a crash or `kill -9`
    /// of the daemon; a power loss or kernel crash may lose what was acknowledged in the last
    /// second, as the log is flushed to disk at least once a second.
    Process,
}

impl Durability {
    pub const ALL: [Durability; 2] = [Durability::Disk, Durability::Process];

    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Disk => "disk",
            Durability::Process => "process",
        }
    }
}

impl std::fmt::Display for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Durability {
    type Err = String;

    fn from_str(text: &str) -> Result<Durability, String> {
        Durability::ALL
            .into_iter()
            .find(|level| level.as_str() == text)
            .ok_or_else(|| format!("unknown durability `{text}`: expected `disk` or `process`"))
    }
}

/// Where the embedded store keeps its data, how durable an answer is, and where it reads the
/// time.
#[derive(Clone)]
pub struct EmbeddedConfig {
    pub data_dir: PathBuf,
    pub durability: Durability,
    /// The machine's clocks ([`SystemTime`]) unless a test gives a clock of its own.
    pub time: Arc<dyn TimeSource>,
    /// How much of the change feed is kept, and how far a watcher may fall behind.
    pub watch: WatchConfig,
    /// The scheduler's settings from its first cycle on (its tenancy above all: a daemon with
    /// access control places nothing its users may not use, even right after opening).
    pub sched: allot_core::apps::SchedConfig,
    /// Where the random ids of allocs, sessions and placeholders come from: the machine's
    /// randomness ([`RandomIds`]) unless a simulation gives a seeded source.
    pub ids: Arc<dyn IdSource>,
}

impl std::fmt::Debug for EmbeddedConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedConfig")
            .field("data_dir", &self.data_dir)
            .field("durability", &self.durability)
            .field("watch", &self.watch)
            .finish_non_exhaustive()
    }
}

impl EmbeddedConfig {
    /// The store in `data_dir`, at the default durability ([`Durability::Disk`]), on the
    /// machine's clocks.
    pub fn new(data_dir: impl Into<PathBuf>) -> EmbeddedConfig {
        EmbeddedConfig {
            data_dir: data_dir.into(),
            durability: Durability::default(),
            time: Arc::new(SystemTime),
            watch: WatchConfig::default(),
            sched: allot_core::apps::SchedConfig::default(),
            ids: Arc::new(RandomIds),
        }
    }

    pub fn with_durability(mut self, durability: Durability) -> EmbeddedConfig {
        self.durability = durability;
        self
    }

    /// The same, keeping the change feed as `watch` says.
    pub fn with_watch(mut self, watch: WatchConfig) -> EmbeddedConfig {
        self.watch = watch;
        self
    }

    /// The same, the scheduler set as `sched` says from its first cycle.
    pub fn with_sched(mut self, sched: allot_core::apps::SchedConfig) -> EmbeddedConfig {
        self.sched = sched;
        self
    }

    /// The same, drawing random ids from `ids`.
    pub fn with_ids(mut self, ids: Arc<dyn IdSource>) -> EmbeddedConfig {
        self.ids = ids;
        self
    }

    /// The same, reading the time from `time` (a test's [`ManualClock`](crate::clock)).
    pub fn with_time(mut self, time: Arc<dyn TimeSource>) -> EmbeddedConfig {
        self.time = time;
        self
    }
}

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot create the data directory {path}: {source}")]
    DataDir { path: PathBuf, source: std::io::Error },
    #[error("cannot open the database {path}: {reason}")]
    Database { path: PathBuf, reason: String },
    #[error("cannot read the database: {0}")]
    Read(String),
    #[error("cannot replay the write-ahead log: {0}")]
    Log(String),
    #[error(transparent)]
    Corrupt(#[from] CorruptRecord),
    #[error("the database's records do not fit together: {0}")]
    Restore(#[from] allot_core::RestoreError),
    #[error("the database's pool records do not fit together: {0}")]
    RestorePools(#[from] PoolError),
    #[error("the database was written in format {found}; this allot reads format {FORMAT_VERSION}")]
    Format { found: u64 },
}
