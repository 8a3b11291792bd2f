//! Jobs on an outside HTTP service, the pattern of Flyte's web-API plugins and agents, shared by
//! two plugins:
//! - `http`: the service is the task's `spec.url`; every job holds a token of the plugin's quota
//!   `http:jobs` while it runs, so the service never sees more jobs at once than the quota;
//! - `external` plugins (one per `[plugins.external.<id>]`): a plugin served by another process,
//!   at a configured URL, for the task types it names, so plugins can be written in any
//!   language; a quota is optional.
//!
//! The protocol (HTTP/JSON, Flyte's agent protocol: create, get, delete):
//! - `POST {url}` with `{"task_type", "app", "task", "attempt", "inputs", "spec", "daemon"}` (the
//!   URL of the daemon that runs the task, for the plugin's calls back: its catalog, a wake-up) and
//!   the header
//!   `Idempotency-Key: <app>/<task>/<attempt>` (a create repeated after a crash names the same
//!   job) answers `{"resource_meta": "<job id>"}`;
//! - `GET {url}/{job id}` answers `{"phase": "pending" | "running" | "succeeded" | "failed" |
//!   "retryable", "message": "...", "outputs": {...}, "log_links": [{"name", "uri"}],
//!   "custom_info": {...}, "occurred_at_ms": <ms since the epoch>}` (Flyte's `TaskInfo`: when the
//!   phase really began, and what the front end shows of the job); a change of the log links or
//!   of the custom information within a phase is a new version of it, so an event;
//! - `DELETE {url}/{job id}` stops it (an abort); 404 is taken as already gone.
//!
//! A job is polled every `spec.poll_seconds` (default 1) without holding a thread, and woken at
//! once through `POST /v1/apps/{app}/tasks/{task}/wake` on the daemon that runs it.
//! A 4xx answer to create is a permanent user failure; no answer, or a 5xx, a system failure
//! (retried within the system budget).

use std::sync::Arc;
use std::time::Duration;

use allot_core::runs::{ExecError, LogLink, Phase, PhaseInfo, Transition};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::context::{MetricsScope, SetupContext, TaskContext, TokenStatus};
use crate::plugin::{Plugin, PluginEntry};

/// The plugin state's schema version.
const STATE_VERSION: u8 = 1;
/// The name of the quota of a plugin's jobs (`<plugin>:jobs`).
pub const JOBS_QUOTA: &str = "jobs";
/// The longest one call to the service may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a plugin's service is.
#[derive(Debug, Clone)]
enum Endpoint {
    /// The task's `spec.url`.
    FromSpec,
    /// One URL for every task (an external plugin).
    Fixed(String),
}

/// A plugin that runs jobs on a service.
struct JobPlugin {
    id: String,
    endpoint: Endpoint,
    /// Each job holds a token of the plugin's `jobs` quota while it runs.
    quota: bool,
    client: reqwest::Client,
    /// Counts `jobs_created`, `jobs_deleted`.
    metrics: MetricsScope,
}

/// `http`: the service is the task's `spec.url`; its jobs hold a token of `http:jobs` (`quota`
/// tokens: created at the first start, kept as changed since).
pub(super) fn http_entry(quota: u64) -> PluginEntry {
    PluginEntry::new("http", &["http"], false, move |setup: SetupContext| async move {
        setup.register_quota(JOBS_QUOTA, quota).await.map_err(|e| e.to_string())?;
        Ok(Arc::new(JobPlugin::new("http", Endpoint::FromSpec, true, setup.metrics())?) as Arc<dyn Plugin>)
    })
}

/// An external plugin `id` served at `url` for `task_types`; with `quota`, its jobs hold a
/// token of `<id>:jobs`.
pub(super) fn external_entry(id: &str, url: &str, task_types: &[&str], quota: Option<u64>) -> PluginEntry {
    let url = url.trim_end_matches('/').to_owned();
    let owned_id = id.to_owned();
    PluginEntry::new(id, task_types, false, move |setup: SetupContext| {
        let (id, url) = (owned_id.clone(), url.clone());
        async move {
            let parsed = reqwest::Url::parse(&url).map_err(|e| format!("url `{url}`: {e}"))?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(format!("url `{url}`: only http and https are served"));
            }
            if let Some(quota) = quota {
                setup.register_quota(JOBS_QUOTA, quota).await.map_err(|e| e.to_string())?;
            }
            let plugin = JobPlugin::new(&id, Endpoint::Fixed(url), quota.is_some(), setup.metrics())?;
            Ok(Arc::new(plugin) as Arc<dyn Plugin>)
        }
    })
}

#[derive(Debug, Serialize, Deserialize)]
struct State {
    /// The job, as the service named it.
    job: String,
    /// The version of the phase last reported: raised when what the service shows of the job
    /// (its phase, log links, custom information) changes, so that the change is an event.
    #[serde(default)]
    version: u32,
    /// SHA-256 (hex) of what the service showed at `version` (empty before it showed anything).
    #[serde(default)]
    shown: String,
}

impl State {
    fn created(job: String) -> State {
        State { job, version: 0, shown: String::new() }
    }

    /// Takes what the service shows of the job now: answers whether it is new (the version
    /// to report is then `version`).
    fn show(&mut self, status: &JobStatus) -> bool {
        let shown = serde_json::to_vec(&(&status.phase, &status.log_links, &status.custom_info)).unwrap_or_default();
        let shown = allot_core::catalog::hex_digest(&[&shown]);
        if self.shown == shown {
            return false;
        }
        if !self.shown.is_empty() {
            self.version = self.version.saturating_add(1);
        }
        self.shown = shown;
        true
    }
}

#[derive(Serialize)]
struct CreateBody<'a> {
    task_type: &'a str,
    app: &'a str,
    task: &'a str,
    attempt: u32,
    inputs: &'a serde_json::Value,
    spec: &'a serde_json::Value,
    /// The daemon that runs the task (its URL): where the plugin reaches its catalog and wakes
    /// the task.
    daemon: &'a str,
}

#[derive(Deserialize)]
struct Created {
    resource_meta: String,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum JobPhase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Retryable,
}

#[derive(Deserialize)]
struct JobStatus {
    phase: JobPhase,
    #[serde(default)]
    message: String,
    #[serde(default)]
    outputs: Option<serde_json::Value>,
    #[serde(default)]
    log_links: Vec<LinkWire>,
    /// What the front end shows of the job (an object).
    #[serde(default)]
    custom_info: Option<serde_json::Map<String, serde_json::Value>>,
    /// When the phase began, as the service knows it.
    #[serde(default)]
    occurred_at_ms: Option<u64>,
}

#[derive(Serialize, Deserialize)]
struct LinkWire {
    name: String,
    uri: String,
}

fn system(code: &str, message: impl std::fmt::Display) -> ExecError {
    ExecError::system(code, message.to_string())
}

/// `url/{segment}`, the segment percent-encoded.
fn job_url(base: &str, job: &str) -> Result<reqwest::Url, ExecError> {
    let mut url = reqwest::Url::parse(base).map_err(|e| ExecError::user("bad_spec", format!("url `{base}`: {e}")))?;
    url.path_segments_mut()
        .map_err(|()| ExecError::user("bad_spec", format!("url `{base}` cannot take a path")))?
        .pop_if_empty()
        .push(job);
    Ok(url)
}

impl JobPlugin {
    fn new(id: &str, endpoint: Endpoint, quota: bool, metrics: MetricsScope) -> Result<JobPlugin, String> {
        let client = reqwest::Client::builder().timeout(CALL_TIMEOUT).build().map_err(|e| e.to_string())?;
        Ok(JobPlugin { id: id.to_owned(), endpoint, quota, client, metrics })
    }

    fn url(&self, ctx: &TaskContext) -> Result<String, ExecError> {
        match &self.endpoint {
            Endpoint::Fixed(url) => Ok(url.clone()),
            Endpoint::FromSpec => ctx
                .spec
                .get("url")
                .and_then(|u| u.as_str())
                .map(str::to_owned)
                .ok_or_else(|| ExecError::user("bad_spec", "an http task needs a string `url`: its service's jobs")),
        }
    }

    fn authorize(
        &self,
        ctx: &TaskContext,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::RequestBuilder, ExecError> {
        match ctx.spec.get("secret").and_then(|s| s.as_str()) {
            None => Ok(request),
            Some(name) => {
                let value = ctx.secrets.get(name).ok_or_else(|| {
                    ExecError::user(
                        "unknown_secret",
                        format!("the task names secret `{name}`, which is not configured"),
                    )
                })?;
                Ok(request.bearer_auth(value))
            }
        }
    }

    async fn create(&self, ctx: &TaskContext, url: &str) -> Result<String, ExecError> {
        let body = CreateBody {
            task_type: &ctx.task_type,
            app: ctx.run.app.as_str(),
            task: ctx.run.task.as_str(),
            attempt: ctx.attempt,
            inputs: &ctx.inputs,
            spec: &ctx.spec,
            daemon: &ctx.metadata.node,
        };
        let key = format!("{}/{}/{}", ctx.run.app, ctx.run.task, ctx.attempt);
        let request = self.client.post(url).header("Idempotency-Key", key).json(&body);
        let response = self.authorize(ctx, request)?.send().await.map_err(|e| system("service_unreachable", e))?;
        let status = response.status();
        if status.is_client_error() {
            let text = response.text().await.unwrap_or_default();
            return Err(ExecError::user("job_refused", format!("the service refused the job ({status}): {text}")));
        }
        if !status.is_success() {
            return Err(system("service_failed", format!("creating the job answered {status}")));
        }
        let created: Created = response.json().await.map_err(|e| system("bad_answer", format!("create: {e}")))?;
        Ok(created.resource_meta)
    }

    async fn status(&self, ctx: &TaskContext, url: &str, job: &str) -> Result<JobStatus, ExecError> {
        let request = self.client.get(job_url(url, job)?);
        let response = self.authorize(ctx, request)?.send().await.map_err(|e| system("service_unreachable", e))?;
        let status = response.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Err(system("job_lost", format!("the service no longer knows job `{job}`")));
        }
        if !status.is_success() {
            return Err(system("service_failed", format!("reading job `{job}` answered {status}")));
        }
        response.json().await.map_err(|e| system("bad_answer", format!("get: {e}")))
    }

    /// Wakes the run after the poll interval.
    fn poll_later(ctx: &TaskContext) {
        let seconds = ctx.spec.get("poll_seconds").and_then(|p| p.as_f64()).unwrap_or(1.0).clamp(0.01, 3600.0);
        let (waker, run) = (ctx.waker(), ctx.run.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
            waker.wake(&run);
        });
    }
}

#[async_trait]
impl Plugin for JobPlugin {
    fn id(&self) -> &str {
        &self.id
    }

    async fn handle(&self, ctx: &mut TaskContext) -> Result<Transition, ExecError> {
        let url = self.url(ctx)?;
        let mut state = match ctx.state_json::<State>(STATE_VERSION) {
            Some(state) => state,
            None => {
                if self.quota {
                    let status = ctx.tokens.take(JOBS_QUOTA, 1).await?;
                    if let TokenStatus::Waiting(_) = status {
                        let reason = status.why(&format!("{}:{JOBS_QUOTA}", self.id));
                        return Ok(Transition::ephemeral(PhaseInfo::waiting_for_resources(reason)));
                    }
                }
                let job = self.create(ctx, &url).await?;
                self.metrics.inc("jobs_created");
                ctx.put_state_json(STATE_VERSION, &State::created(job.clone()));
                Self::poll_later(ctx);
                // Stored before anything else happens: a round replayed after a crash polls
                // this job instead of creating another.
                return Ok(Transition::barrier(PhaseInfo::queued(format!("job `{job}` created"))));
            }
        };
        let status = self.status(ctx, &url, &state.job).await?;
        if state.show(&status) {
            ctx.put_state_json(STATE_VERSION, &state);
        }
        let version = state.version;
        let message = if status.message.is_empty() { format!("job `{}`", state.job) } else { status.message };
        let info = match status.phase {
            JobPhase::Pending => PhaseInfo::new(Phase::Queued, version, message),
            JobPhase::Running => PhaseInfo::running(version, message),
            JobPhase::Succeeded => {
                if let Some(outputs) = status.outputs {
                    ctx.set_outputs(outputs)?;
                }
                if self.quota {
                    ctx.tokens.release(JOBS_QUOTA).await?;
                }
                PhaseInfo::success(message)
            }
            JobPhase::Failed => PhaseInfo::permanent(ExecError::user("job_failed", message)),
            JobPhase::Retryable => PhaseInfo::retryable(ExecError::user("job_failed", message)),
        };
        if !info.phase.ends_attempt() {
            Self::poll_later(ctx);
        }
        let logs = status.log_links.into_iter().map(|l| LogLink { name: l.name, uri: l.uri }).collect();
        let mut info = info.with_logs(logs);
        if let Some(custom) = status.custom_info {
            info = info.with_custom_info(serde_json::Value::Object(custom));
        }
        if let Some(at) = status.occurred_at_ms {
            info = info.occurred_at(at);
        }
        Ok(Transition::ephemeral(info))
    }

    async fn abort(&self, ctx: &mut TaskContext) -> Result<(), ExecError> {
        let Some(state) = ctx.state_json::<State>(STATE_VERSION) else {
            return Ok(());
        };
        let url = self.url(ctx)?;
        let request = self.client.delete(job_url(&url, &state.job)?);
        let response = self.authorize(ctx, request)?.send().await.map_err(|e| system("service_unreachable", e))?;
        let status = response.status();
        if status.is_success() || status == reqwest::StatusCode::NOT_FOUND {
            self.metrics.inc("jobs_deleted");
            Ok(())
        } else {
            Err(system("service_failed", format!("deleting job `{}` answered {status}", state.job)))
        }
    }

    async fn finalize(&self, _: &mut TaskContext) -> Result<(), ExecError> {
        // The tokens the attempt took are released by the executor after this, on every path.
        Ok(())
    }
}
