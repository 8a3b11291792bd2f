//! Records of task runs (`allot_core::runs::Run`): `runs`: (application id, task id) ->
//! [`RunRow`] (a [`RunRecord`], then what its events say beyond it). Phases, kinds and stages are
//! stored by name, so a reordering of the enums cannot misread a file.

use allot_core::runs::{
    AfterAttempt, CacheLookup, Ending, ErrorKind, Event, ExecError, LogLink, Phase, PhaseInfo, PluginState, Run, Stage,
    TakenToken, Transition, TransitionKind,
};
use allot_core::{NamespaceName, Token};
use redb::TableDefinition;
use serde::{Deserialize, Serialize};

use super::CorruptRecord;

pub const RUNS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("runs");
/// Cache key -> [`CachedRecord`].
pub const CATALOG: TableDefinition<&str, &[u8]> = TableDefinition::new("catalog");

/// Outputs kept for reuse (`crate::runs::CachedOutputs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachedRecord {
    pub outputs: String,
    pub app: String,
    pub task: String,
    pub at: u64,
}

impl CachedRecord {
    pub fn of(entry: &crate::runs::CachedOutputs) -> CachedRecord {
        CachedRecord {
            outputs: entry.outputs.clone(),
            app: entry.app.to_string(),
            task: entry.task.to_string(),
            at: entry.at,
        }
    }

    pub fn into_entry(self, key: &str) -> Result<crate::runs::CachedOutputs, CorruptRecord> {
        let corrupt = |reason: String| CorruptRecord { table: "catalog", key: key.to_owned(), reason };
        Ok(crate::runs::CachedOutputs {
            outputs: self.outputs,
            app: allot_core::apps::AppId::new(&self.app).map_err(|e| corrupt(e.to_string()))?,
            task: allot_core::apps::TaskId::new(&self.task).map_err(|e| corrupt(e.to_string()))?,
            at: self.at,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorRecord {
    pub kind: String,
    pub code: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseInfoRecord {
    pub phase: String,
    pub version: u32,
    pub reason: String,
    pub logs: Vec<(String, String)>,
    pub error: Option<ErrorRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventRecord {
    pub attempt: u32,
    pub info: PhaseInfoRecord,
    pub at: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EndingRecord {
    Succeeded,
    Failed(ErrorRecord),
    Aborted(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum StageRecord {
    Handling,
    /// `then`: `None` for a new attempt.
    Ending {
        abort: bool,
        then: Option<EndingRecord>,
    },
    Ended(EndingRecord),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    pub attempt: u32,
    pub user_failures: u32,
    pub system_failures: u32,
    pub phase: String,
    pub version: u32,
    pub state: Option<(u8, Vec<u8>)>,
    pub round: u64,
    /// (round, barrier?, phase info) of the recorded transition.
    pub barrier: Option<(u64, bool, PhaseInfoRecord)>,
    pub events: Vec<EventRecord>,
    pub stage: StageRecord,
    pub tokens: Vec<(String, String)>,
    pub started: u64,
    pub outputs: Option<String>,
    /// Added after the format began (see [`crate::records::decode_grown`]), as the two after it.
    #[serde(default)]
    pub alloc: Option<String>,
    #[serde(default)]
    pub task_seq: Option<u64>,
    #[serde(default)]
    pub cache: Option<CacheRecord>,
}

/// The fields [`RunRow`] gained after the format began (three of its [`RunRecord`], then its
/// `details`): a record written before ends where they start.
pub const RUN_FIELDS_ADDED: usize = 4;

/// A run as kept since its events say when they occurred and carry custom information: its
/// [`RunRecord`] (as the feed's events written before hold it), then those details, `None` when
/// no event has any (the bytes are then a [`RunRecord`] and one zero).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRow {
    pub run: RunRecord,
    pub details: Option<RunDetailsRecord>,
}

/// What a run's events say beyond [`EventRecord`]: one entry per event, in order, and one for the
/// recorded transition's phase info.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunDetailsRecord {
    pub events: Vec<EventDetailsRecord>,
    pub barrier: Option<EventDetailsRecord>,
}

/// When an event occurred (ms since the epoch) and its custom information (JSON text).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct EventDetailsRecord {
    pub occurred_at: Option<u64>,
    pub custom_info: Option<String>,
}

impl EventDetailsRecord {
    fn of(occurred_at: Option<u64>, custom_info: &Option<String>) -> EventDetailsRecord {
        EventDetailsRecord { occurred_at, custom_info: custom_info.clone() }
    }

    fn is_empty(&self) -> bool {
        self.occurred_at.is_none() && self.custom_info.is_none()
    }
}

/// A [`RunRow`] as Redis keeps it: the [`RunRecord`]'s JSON object with a `details` member when
/// there are details (what earlier versions wrote reads as without).
#[derive(Serialize)]
struct RunJsonOut<'a> {
    #[serde(flatten)]
    run: &'a RunRecord,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: &'a Option<RunDetailsRecord>,
}

#[derive(Deserialize)]
struct RunJsonIn {
    #[serde(flatten)]
    run: RunRecord,
    #[serde(default)]
    details: Option<RunDetailsRecord>,
}

impl RunRow {
    pub fn of(run: &Run) -> RunRow {
        let events: Vec<EventDetailsRecord> =
            run.events.iter().map(|e| EventDetailsRecord::of(e.occurred_at, &e.custom_info)).collect();
        let barrier = run
            .barrier
            .as_ref()
            .map(|(_, t)| EventDetailsRecord::of(t.info.occurred_at, &t.info.custom_info))
            .filter(|d| !d.is_empty());
        let details =
            (barrier.is_some() || events.iter().any(|d| !d.is_empty())).then_some(RunDetailsRecord { events, barrier });
        RunRow { run: RunRecord::of(run), details }
    }

    pub fn into_run(self, key: &str) -> Result<Run, CorruptRecord> {
        let mut run = self.run.into_run(key)?;
        let Some(details) = self.details else { return Ok(run) };
        if details.events.len() != run.events.len() {
            let reason = format!("details of {} events for {} events", details.events.len(), run.events.len());
            return Err(CorruptRecord { table: "runs", key: key.to_owned(), reason });
        }
        for (event, detail) in run.events.iter_mut().zip(details.events) {
            (event.occurred_at, event.custom_info) = (detail.occurred_at, detail.custom_info);
        }
        if let (Some((_, transition)), Some(detail)) = (run.barrier.as_mut(), details.barrier) {
            (transition.info.occurred_at, transition.info.custom_info) = (detail.occurred_at, detail.custom_info);
        }
        Ok(run)
    }

    /// Its JSON text, as Redis keeps it.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&RunJsonOut { run: &self.run, details: &self.details }).expect("records always encode")
    }

    /// Reads what [`RunRow::to_json`] wrote, or a [`RunRecord`]'s JSON of an earlier version.
    pub fn from_json(json: &[u8]) -> Result<RunRow, serde_json::Error> {
        let RunJsonIn { run, details } = serde_json::from_slice(json)?;
        Ok(RunRow { run, details })
    }
}

/// What the output cache looked up (`CacheLookup`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheRecord {
    pub key: String,
    pub task_type: String,
    pub plugin: String,
    pub cache_version: String,
    pub spec_digest: String,
    pub inputs_digest: String,
    pub hit: Option<String>,
}

impl CacheRecord {
    fn of(lookup: &CacheLookup) -> CacheRecord {
        CacheRecord {
            key: lookup.key.clone(),
            task_type: lookup.task_type.clone(),
            plugin: lookup.plugin.clone(),
            cache_version: lookup.cache_version.clone(),
            spec_digest: lookup.spec_digest.clone(),
            inputs_digest: lookup.inputs_digest.clone(),
            hit: lookup.hit.clone(),
        }
    }

    fn into_lookup(self) -> CacheLookup {
        CacheLookup {
            key: self.key,
            task_type: self.task_type,
            plugin: self.plugin,
            cache_version: self.cache_version,
            spec_digest: self.spec_digest,
            inputs_digest: self.inputs_digest,
            hit: self.hit,
        }
    }
}

fn error_record(e: &ExecError) -> ErrorRecord {
    ErrorRecord { kind: e.kind.name().to_owned(), code: e.code.clone(), message: e.message.clone() }
}

fn error_from(r: ErrorRecord) -> Result<ExecError, String> {
    let kind = match r.kind.as_str() {
        "user" => ErrorKind::User,
        "system" => ErrorKind::System,
        other => return Err(format!("error kind `{other}`")),
    };
    Ok(ExecError { kind, code: r.code, message: r.message })
}

fn phase_from(name: &str) -> Result<Phase, String> {
    Phase::parse(name).ok_or_else(|| format!("phase `{name}`"))
}

fn info_record(info: &PhaseInfo) -> PhaseInfoRecord {
    info_record_of(info.phase, info.version, &info.reason, &info.logs, info.error.as_ref())
}

/// A phase info's record from its parts (an event's, copied once).
fn info_record_of(
    phase: Phase,
    version: u32,
    reason: &str,
    logs: &[LogLink],
    error: Option<&ExecError>,
) -> PhaseInfoRecord {
    PhaseInfoRecord {
        phase: phase.name().to_owned(),
        version,
        reason: reason.to_owned(),
        logs: logs.iter().map(|l| (l.name.clone(), l.uri.clone())).collect(),
        error: error.map(error_record),
    }
}

/// The phase info of a record, without what [`RunDetailsRecord`] keeps.
fn info_from(r: PhaseInfoRecord) -> Result<PhaseInfo, String> {
    Ok(PhaseInfo {
        logs: r.logs.into_iter().map(|(name, uri)| LogLink { name, uri }).collect(),
        error: r.error.map(error_from).transpose()?,
        ..PhaseInfo::new(phase_from(&r.phase)?, r.version, r.reason)
    })
}

fn ending_record(ending: &Ending) -> EndingRecord {
    match ending {
        Ending::Succeeded => EndingRecord::Succeeded,
        Ending::Failed(e) => EndingRecord::Failed(error_record(e)),
        Ending::Aborted(reason) => EndingRecord::Aborted(reason.clone()),
    }
}

fn ending_from(r: EndingRecord) -> Result<Ending, String> {
    Ok(match r {
        EndingRecord::Succeeded => Ending::Succeeded,
        EndingRecord::Failed(e) => Ending::Failed(error_from(e)?),
        EndingRecord::Aborted(reason) => Ending::Aborted(reason),
    })
}

impl RunRecord {
    pub fn of(run: &Run) -> RunRecord {
        RunRecord {
            attempt: run.attempt,
            user_failures: run.user_failures,
            system_failures: run.system_failures,
            phase: run.phase.name().to_owned(),
            version: run.version,
            state: run.state.as_ref().map(|s| (s.version, s.bytes.clone())),
            round: run.round,
            barrier: run
                .barrier
                .as_ref()
                .map(|(round, t)| (*round, t.kind == TransitionKind::Barrier, info_record(&t.info))),
            events: run
                .events
                .iter()
                .map(|e| EventRecord {
                    attempt: e.attempt,
                    info: info_record_of(e.phase, e.version, &e.reason, &e.logs, e.error.as_ref()),
                    at: e.at,
                })
                .collect(),
            stage: match &run.stage {
                Stage::Handling => StageRecord::Handling,
                Stage::Ending { abort, then } => StageRecord::Ending {
                    abort: *abort,
                    then: match then {
                        AfterAttempt::Retry => None,
                        AfterAttempt::End(ending) => Some(ending_record(ending)),
                    },
                },
                Stage::Ended(ending) => StageRecord::Ended(ending_record(ending)),
            },
            tokens: run.tokens.iter().map(|t| (t.namespace.to_string(), t.token.to_string())).collect(),
            started: run.started,
            outputs: run.outputs.clone(),
            alloc: run.alloc.clone(),
            task_seq: run.task_seq,
            cache: run.cache.as_ref().map(CacheRecord::of),
        }
    }

    pub fn into_run(self, key: &str) -> Result<Run, CorruptRecord> {
        let corrupt = |reason: String| CorruptRecord { table: "runs", key: key.to_owned(), reason };
        let convert = || -> Result<Run, String> {
            Ok(Run {
                attempt: self.attempt,
                user_failures: self.user_failures,
                system_failures: self.system_failures,
                phase: phase_from(&self.phase)?,
                version: self.version,
                state: self.state.map(|(version, bytes)| PluginState { version, bytes }),
                round: self.round,
                barrier: self
                    .barrier
                    .map(|(round, barrier, info)| {
                        let kind = if barrier { TransitionKind::Barrier } else { TransitionKind::Ephemeral };
                        Ok::<_, String>((round, Transition { kind, info: info_from(info)? }))
                    })
                    .transpose()?,
                events: self
                    .events
                    .into_iter()
                    .map(|e| {
                        let info = info_from(e.info)?;
                        Ok(Event {
                            attempt: e.attempt,
                            phase: info.phase,
                            version: info.version,
                            reason: info.reason,
                            logs: info.logs,
                            error: info.error,
                            at: e.at,
                            occurred_at: None,
                            custom_info: None,
                        })
                    })
                    .collect::<Result<_, String>>()?,
                stage: match self.stage {
                    StageRecord::Handling => Stage::Handling,
                    StageRecord::Ending { abort, then } => Stage::Ending {
                        abort,
                        then: match then {
                            None => AfterAttempt::Retry,
                            Some(ending) => AfterAttempt::End(ending_from(ending)?),
                        },
                    },
                    StageRecord::Ended(ending) => Stage::Ended(ending_from(ending)?),
                },
                tokens: self
                    .tokens
                    .into_iter()
                    .map(|(namespace, token)| {
                        Ok(TakenToken {
                            namespace: NamespaceName::new(&namespace).map_err(|e| e.to_string())?,
                            token: Token::new(&token).map_err(|e| e.to_string())?,
                        })
                    })
                    .collect::<Result<_, String>>()?,
                started: self.started,
                outputs: self.outputs,
                alloc: self.alloc,
                task_seq: self.task_seq,
                cache: self.cache.map(CacheRecord::into_lookup),
            })
        };
        convert().map_err(corrupt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{decode_grown, encode};

    /// A run kept by an earlier version (without the fields added since) reads back, the new
    /// fields absent (Redis's JSON: `allot-store-redis`'s runs).
    #[test]
    fn a_run_kept_by_an_earlier_version_reads_back() {
        assert!(RunRow::of(&crate::conformance::sample_run()).details.is_some(), "the sample has details");
        let mut run = crate::conformance::without_details(crate::conformance::sample_run());
        run.task_seq = None;
        run.cache = None;
        let bytes = encode(&RunRow::of(&run));
        // Each `None` is one zero byte at the end: without `details`, `task_seq` and `cache`,
        // then without `alloc` too.
        for (missing, alloc) in [(1, run.alloc.clone()), (3, run.alloc.clone()), (4, None)] {
            run.alloc = alloc;
            let bytes = encode(&RunRow::of(&run));
            let older = &bytes[..bytes.len() - missing];
            let record: RunRow = decode_grown("runs", "a/t", older, RUN_FIELDS_ADDED).unwrap();
            assert_eq!(record.into_run("a/t").unwrap(), run);
        }
        assert!(!bytes.is_empty());
    }

    /// Events' details read back in both encodings, and a run's JSON of an earlier version
    /// (a flat [`RunRecord`]) reads as one without them.
    #[test]
    fn details_of_events_read_back() {
        let run = crate::conformance::sample_run();
        let row = RunRow::of(&run);
        let record: RunRow = decode_grown("runs", "a/t", &encode(&row), RUN_FIELDS_ADDED).unwrap();
        assert_eq!(record.into_run("a/t").unwrap(), run);
        assert_eq!(RunRow::from_json(row.to_json().as_bytes()).unwrap().into_run("a/t").unwrap(), run);
        let flat = serde_json::to_string(&row.run).unwrap();
        let older = RunRow::from_json(flat.as_bytes()).unwrap();
        assert_eq!(older.details, None);
        let mut details = row.details.clone().unwrap();
        details.events.pop();
        let torn = RunRow { run: row.run, details: Some(details) };
        assert!(torn.into_run("a/t").is_err(), "details must name every event");
    }
}
