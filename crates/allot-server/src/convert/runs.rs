//! Conversions of the runs of tasks between domain types and wire types.

use allot_api as api;

/// A task's run, as the API shows it.
pub(crate) fn task_run(app: &str, task: &str, run: allot_core::runs::Run) -> api::TaskRun {
    use allot_core::runs::{Ending, Stage};
    let error = |e: &allot_core::runs::ExecError| api::RunError {
        kind: e.kind.name().to_owned(),
        code: e.code.clone(),
        message: e.message.clone(),
    };
    let ending = |ending: &Ending| match ending {
        Ending::Succeeded => "succeeded".to_owned(),
        Ending::Failed(e) => format!("failed: {}", e.message),
        Ending::Aborted(reason) => format!("aborted: {reason}"),
    };
    let (stage, ended) = match &run.stage {
        Stage::Handling => ("running", None),
        Stage::Ending { .. } => ("ending", None),
        Stage::Ended(how) => ("ended", Some(ending(how))),
    };
    api::TaskRun {
        app: app.to_owned(),
        task: task.to_owned(),
        attempt: run.attempt,
        phase: run.phase.name().to_owned(),
        user_failures: run.user_failures,
        system_failures: run.system_failures,
        stage: stage.to_owned(),
        ending: ended,
        outputs: run.outputs.as_deref().and_then(|text| serde_json::from_str(text).ok()),
        cache: run.cache.as_ref().map(|c| api::RunCache {
            key: c.key.clone(),
            task_type: c.task_type.clone(),
            plugin: c.plugin.clone(),
            cache_version: c.cache_version.clone(),
            spec_digest: c.spec_digest.clone(),
            inputs_digest: c.inputs_digest.clone(),
            hit: c.hit.clone(),
        }),
        events: run
            .events
            .iter()
            .map(|e| api::RunEvent {
                attempt: e.attempt,
                phase: e.phase.name().to_owned(),
                version: e.version,
                reason: e.reason.clone(),
                at_ms: e.at,
                occurred_at_ms: e.occurred_at,
                error: e.error.as_ref().map(error),
                logs: e.logs.iter().map(|l| api::RunLog { name: l.name.clone(), uri: l.uri.clone() }).collect(),
                custom_info: e.custom_info.as_deref().and_then(|text| serde_json::from_str(text).ok()),
            })
            .collect(),
    }
}

/// Why a placed task waits when no daemon runs its pool (`pool_not_run`).
pub(crate) fn pool_not_run(pool: &str) -> api::Waiting {
    api::Waiting {
        code: "pool_not_run".to_owned(),
        message: format!("placed on pool `{pool}`, which no daemon runs (start one with --run-pool {pool})"),
    }
}
