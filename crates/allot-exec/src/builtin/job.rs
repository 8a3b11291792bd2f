//! Jobs on an outside HTTP service, the pattern of Flyte's web-API plugins and agents, shared by
//! two plugins:
//! - `http`: the service is the task's `spec.url`, which must be one of the services of the
//!   daemon's configuration (`[plugins.http.services.<name>]`) or under it; every job holds a
//!   token of the plugin's quota `http:jobs` while it runs, so the services never see more jobs
//!   at once than the quota;
//! - `external` plugins (one per `[plugins.external.<id>]`): a plugin served by another process,
//!   at a configured URL, for the task types it names, so plugins can be written in any
//!   language; a quota is optional.
//!
//! Invariant: a task never chooses where its calls go beyond what the configuration allows, nor
//! which secret they carry: the bearer token sent is the configured service's own secret (a
//! task's `spec.secret`, if given, must name that one).
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

/// A service of jobs the configuration names: its URL, and the secret its calls carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobService {
    /// The service's jobs URL (`http` or `https`).
    pub url: String,
    /// The name of the secret (`[secrets]`) sent to it as a bearer token, if any.
    pub secret: Option<String>,
}

/// Where a plugin's service is.
#[derive(Debug, Clone)]
enum Endpoint {
    /// The task's `spec.url`, which must be one of these services' URLs or under one.
    FromSpec(Vec<(reqwest::Url, Option<String>)>),
    /// One URL for every task (an external plugin).
    Fixed(String, Option<String>),
}

impl JobService {
    /// Whether its URL can be called: `http` or `https`, with a path.
    pub fn check(&self) -> Result<(), String> {
        service_url(&self.url).map(|_| ())
    }
}

/// A service's URL, parsed; only `http` and `https` are served.
fn service_url(url: &str) -> Result<reqwest::Url, String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("url `{url}`: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!("url `{url}`: only http and https are served"));
    }
    if parsed.cannot_be_a_base() {
        return Err(format!("url `{url}` cannot take a path"));
    }
    Ok(parsed)
}

/// At most the first 200 bytes of a task's value, for a message.
fn cut(value: &str) -> &str {
    let mut end = value.len().min(200);
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    &value[..end]
}

/// Whether `url` is `service` or under it: the same scheme, host, port and credentials, and a
/// path that is the service's or goes on from it at a `/`. Both are parsed, so `..` and
/// percent-encoded dots are resolved before the paths are compared.
fn is_under(url: &reqwest::Url, service: &reqwest::Url) -> bool {
    let base = service.path().trim_end_matches('/');
    let path = url.path();
    url.scheme() == service.scheme()
        && url.host_str() == service.host_str()
        && url.port_or_known_default() == service.port_or_known_default()
        && url.username() == service.username()
        && url.password() == service.password()
        && (path.trim_end_matches('/') == base || path.strip_prefix(base).is_some_and(|rest| rest.starts_with('/')))
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

/// `http`: the service is the task's `spec.url`, one of `services` or under it; its jobs hold a
/// token of `http:jobs` (`quota` tokens: created at the first start, kept as changed since).
pub(super) fn http_entry(quota: u64, services: &[JobService]) -> PluginEntry {
    let services = services.to_vec();
    PluginEntry::new("http", &["http"], false, move |setup: SetupContext| {
        let services = services.clone();
        async move {
            let services = services
                .iter()
                .map(|service| Ok((service_url(&service.url)?, service.secret.clone())))
                .collect::<Result<Vec<_>, String>>()?;
            setup.register_quota(JOBS_QUOTA, quota).await.map_err(|e| e.to_string())?;
            let plugin = JobPlugin::new("http", Endpoint::FromSpec(services), true, setup.metrics())?;
            Ok(Arc::new(plugin) as Arc<dyn Plugin>)
        }
    })
}

/// An external plugin `id` served at `url` for `task_types`; with `quota`, its jobs hold a
/// token of `<id>:jobs`.
pub(super) fn external_entry(
    id: &str,
    url: &str,
    secret: Option<&str>,
    task_types: &[&str],
    quota: Option<u64>,
) -> PluginEntry {
    let url = url.trim_end_matches('/').to_owned();
    let (owned_id, secret) = (id.to_owned(), secret.map(str::to_owned));
    PluginEntry::new(id, task_types, false, move |setup: SetupContext| {
        let (id, url, secret) = (owned_id.clone(), url.clone(), secret.clone());
        async move {
            service_url(&url)?;
            if let Some(quota) = quota {
                setup.register_quota(JOBS_QUOTA, quota).await.map_err(|e| e.to_string())?;
            }
            let plugin = JobPlugin::new(&id, Endpoint::Fixed(url, secret), quota.is_some(), setup.metrics())?;
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
        // No redirects: a call goes to the configured service, never where its answer points.
        let client = reqwest::Client::builder()
            .timeout(CALL_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| e.to_string())?;
        Ok(JobPlugin { id: id.to_owned(), endpoint, quota, client, metrics })
    }

    /// The task's service: its jobs URL, and the name of the secret its calls carry.
    fn service(&self, ctx: &TaskContext) -> Result<(String, Option<String>), ExecError> {
        let (url, secret) = match &self.endpoint {
            Endpoint::Fixed(url, secret) => (url.clone(), secret.clone()),
            Endpoint::FromSpec(services) => {
                let url = ctx.spec.get("url").and_then(|u| u.as_str()).ok_or_else(|| {
                    ExecError::user("bad_spec", "an http task needs a string `url`: its service's jobs")
                })?;
                let parsed = reqwest::Url::parse(url)
                    .map_err(|e| ExecError::user("bad_spec", format!("url `{}`: {e}", cut(url))))?;
                let Some((_, secret)) = services.iter().find(|(service, _)| is_under(&parsed, service)) else {
                    return Err(ExecError::user(
                        "url_not_allowed",
                        format!(
                            "url `{}` is not a service of this daemon's configuration: an http task calls only \
                             the URLs of [plugins.http.services] (or under them)",
                            cut(url)
                        ),
                    ));
                };
                (parsed.to_string(), secret.clone())
            }
        };
        match (ctx.spec.get("secret").and_then(|s| s.as_str()), &secret) {
            (Some(named), Some(configured)) if named == configured => {}
            (None, _) => {}
            (Some(named), _) => {
                return Err(ExecError::user(
                    "secret_not_allowed",
                    format!(
                        "the task names secret `{}`; its service is given only the secret its configuration \
                         names ({})",
                        cut(named),
                        secret.as_deref().map_or_else(|| "none".to_owned(), |s| format!("`{s}`"))
                    ),
                ));
            }
        }
        Ok((url, secret))
    }

    fn authorize(
        &self,
        ctx: &TaskContext,
        secret: Option<&str>,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::RequestBuilder, ExecError> {
        match secret {
            None => Ok(request),
            Some(name) => {
                let value = ctx.secrets.get(name).ok_or_else(|| {
                    ExecError::system("unknown_secret", format!("secret `{name}` is not in this daemon's [secrets]"))
                })?;
                Ok(request.bearer_auth(value))
            }
        }
    }

    async fn create(&self, ctx: &TaskContext, url: &str, secret: Option<&str>) -> Result<String, ExecError> {
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
        let response =
            self.authorize(ctx, secret, request)?.send().await.map_err(|e| system("service_unreachable", e))?;
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

    async fn status(
        &self,
        ctx: &TaskContext,
        url: &str,
        secret: Option<&str>,
        job: &str,
    ) -> Result<JobStatus, ExecError> {
        let request = self.client.get(job_url(url, job)?);
        let response =
            self.authorize(ctx, secret, request)?.send().await.map_err(|e| system("service_unreachable", e))?;
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
        let (url, secret) = self.service(ctx)?;
        let secret = secret.as_deref();
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
                let job = self.create(ctx, &url, secret).await?;
                self.metrics.inc("jobs_created");
                ctx.put_state_json(STATE_VERSION, &State::created(job.clone()));
                Self::poll_later(ctx);
                // Stored before anything else happens: a round replayed after a crash polls
                // this job instead of creating another.
                return Ok(Transition::barrier(PhaseInfo::queued(format!("job `{job}` created"))));
            }
        };
        let status = self.status(ctx, &url, secret, &state.job).await?;
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
        let (url, secret) = self.service(ctx)?;
        let request = self.client.delete(job_url(&url, &state.job)?);
        let response = self
            .authorize(ctx, secret.as_deref(), request)?
            .send()
            .await
            .map_err(|e| system("service_unreachable", e))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn under(url: &str, service: &str) -> bool {
        is_under(&reqwest::Url::parse(url).unwrap(), &service_url(service).unwrap())
    }

    #[test]
    fn a_task_url_is_allowed_only_at_or_under_a_configured_service() {
        let service = "https://jobs.example:8443/api/jobs";
        assert!(under("https://jobs.example:8443/api/jobs", service));
        assert!(under("https://jobs.example:8443/api/jobs/", service));
        assert!(under("https://jobs.example:8443/api/jobs/batch?x=1", service));
        assert!(under("https://JOBS.example:8443/api/jobs", service), "hosts compare as parsed");
        assert!(!under("https://jobs.example:8443/api/jobsx", service), "a path goes on at a `/` only");
        assert!(!under("https://jobs.example:8443/api/jobs/../admin", service), "`..` is resolved first");
        assert!(!under("https://jobs.example:8443/api/jobs/%2e%2e/admin", service), "so is an encoded one");
        assert!(!under("http://jobs.example:8443/api/jobs", service), "another scheme");
        assert!(!under("https://jobs.example/api/jobs", service), "another port");
        assert!(!under("https://jobs.example.evil:8443/api/jobs", service), "another host");
        assert!(!under("https://user:pw@jobs.example:8443/api/jobs", service), "other credentials");
        assert!(!under("http://169.254.169.254/latest/meta-data", service));
        assert!(under("http://127.0.0.1:80/x", "http://127.0.0.1/"), "the default port is the port");
    }

    #[test]
    fn a_service_must_be_http_or_https_with_a_path() {
        assert!(service_url("file:///etc/passwd").is_err());
        assert!(service_url("mailto:a@b").is_err());
        assert!(service_url("not a url").is_err());
        assert!(service_url("http://127.0.0.1:8000/jobs").is_ok());
    }
}
