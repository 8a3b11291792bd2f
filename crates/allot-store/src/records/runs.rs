//! Records of task runs (`allot_core::runs::Run`): `runs`: (application id, task id) ->
//! [`RunRecord`]. Phases, kinds and stages are stored by name, so a reordering of the enums
//! cannot misread a file.

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

/// The fields [`RunRecord`] gained after the format began: a record written before ends where
/// they start.
pub const RUN_FIELDS_ADDED: usize = 3;

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
    PhaseInfoRecord {
        phase: info.phase.name().to_owned(),
        version: info.version,
        reason: info.reason.clone(),
        logs: info.logs.iter().map(|l| (l.name.clone(), l.uri.clone())).collect(),
        error: info.error.as_ref().map(error_record),
    }
}

fn info_from(r: PhaseInfoRecord) -> Result<PhaseInfo, String> {
    Ok(PhaseInfo {
        phase: phase_from(&r.phase)?,
        version: r.version,
        reason: r.reason,
        logs: r.logs.into_iter().map(|(name, uri)| LogLink { name, uri }).collect(),
        error: r.error.map(error_from).transpose()?,
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
                    info: info_record(&PhaseInfo {
                        phase: e.phase,
                        version: e.version,
                        reason: e.reason.clone(),
                        logs: e.logs.clone(),
                        error: e.error.clone(),
                    }),
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
        let mut run = crate::conformance::sample_run();
        run.task_seq = None;
        run.cache = None;
        let bytes = encode(&RunRecord::of(&run));
        // Each `None` is one zero byte at the end: without `task_seq` and `cache`, then without
        // `alloc` too.
        for (missing, alloc) in [(2, run.alloc.clone()), (3, None)] {
            run.alloc = alloc;
            let bytes = encode(&RunRecord::of(&run));
            let older = &bytes[..bytes.len() - missing];
            let record: RunRecord = decode_grown("runs", "a/t", older, RUN_FIELDS_ADDED).unwrap();
            assert_eq!(record.into_run("a/t").unwrap(), run);
        }
        assert!(!bytes.is_empty());
    }
}
