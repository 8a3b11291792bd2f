//! The handlers of the runs of tasks: how a task is being run by its plugin, its logs, and its
//! wake-up; each is answered by the daemon that runs the task (asked by the one that was called).

use allot_api as api;
use allot_api::ErrorCode;
use allot_core::access::{Permission, Resource};
use allot_core::apps::states::TaskState;
use allot_core::catalog::{check_outputs, plugin_catalog_key, CatalogScope};
use allot_core::pools::AllocState;
use allot_store::{keep_first, ExecutorLease, StoreError};
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;

use super::{Answer, UNAVAILABLE};
use crate::convert::apps::{app_id, task_id};
use crate::convert::runs as convert;
use crate::error::ApiError;
use crate::extract::{JsonBody, QueryArgs, Segments};
use crate::ServerState;

/// A placed task with a type that nothing has started waits for a daemon that runs its pool: when
/// no live executor's lease names the pool (its daemon stopped since), its `waiting` says so. A
/// task without a type is run by whoever reads its alloc: nothing is said. A hint: when the
/// leases cannot be read, nothing is added.
pub(super) async fn note_unrun_pools(state: &ServerState, tasks: &mut [api::Task]) {
    let typed = |t: &api::Task| t.spec.as_ref().is_some_and(|spec| spec.get("type").is_some_and(|v| v.is_string()));
    let placed = |t: &api::Task| t.state == TaskState::Allocated.name() && t.waiting.is_none() && typed(t);
    if !tasks.iter().any(|t| placed(t) && t.placement.is_some()) {
        return;
    }
    let leases = match state.store.executors().await {
        Ok(leases) => leases,
        Err(err) => {
            tracing::debug!(error = %err, "cannot read the executors' leases");
            return;
        }
    };
    for task in tasks.iter_mut().filter(|t| placed(t)) {
        let Some(pool) = task.placement.as_ref().map(|p| p.pool.clone()) else { continue };
        if runner(&leases, &pool).is_none() {
            task.waiting = Some(convert::pool_not_run(&pool));
        }
    }
}

/// The live executor that runs `pool`, if any.
fn runner<'a>(leases: &'a [ExecutorLease], pool: &str) -> Option<&'a ExecutorLease> {
    leases.iter().find(|l| l.live && l.pools.iter().any(|p| p.as_str() == pool))
}

/// How a task is being run by its plugin (on a daemon that runs its pool), and its phase
/// timeline: one event per attempt, phase and version.
#[utoipa::path(get, path = "/v1/apps/{app}/tasks/{task}/run", tag = "apps",
    params(("app" = String, Path, description = "the application's id"), ("task" = String, Path, description = "the task's id")),
    responses((status = 200, body = api::TaskRun), (status = 400, body = api::ErrorBody, description = "invalid_argument"),
        (status = 404, body = api::ErrorBody, description = "app_not_found, task_not_found, or run_not_found (the task has not been run)"),
        (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn get_task_run(
    State(state): State<ServerState>,
    Segments((app, task)): Segments<(String, String)>,
) -> Answer<api::TaskRun> {
    let (app_id, task_id) = (app_id(&app)?, task_id(&task)?);
    match state.store.run(app_id.clone(), task_id.clone()).await? {
        Some(run) => Ok(Json(convert::task_run(&app, &task, run))),
        None => {
            // The task's own 404 if it does not exist; else where it waits.
            let info = state.store.task(app_id, task_id).await?;
            let why = match &info.task.placement {
                None => "it is not placed yet".to_owned(),
                Some(placement) => {
                    let pool = placement.pool.as_str();
                    let leases = state.store.executors().await?;
                    match runner(&leases, pool) {
                        Some(lease) => format!("it is placed on pool `{pool}`, run by {}, and starts soon", lease.node),
                        None => format!("it is {}", convert::pool_not_run(pool).message),
                    }
                }
            };
            Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "run_not_found",
                format!("task `{task}` of application `{app}` has not been run: {why}"),
            ))
        }
    }
}

/// The run of the task in an alloc the scheduler holds (its phases and, once it succeeded, its
/// outputs), while the alloc is kept: live, or ended and not yet dropped [Reflow: the results of
/// an alloc's execs]. The caller must also be allowed to read the task's application.
#[utoipa::path(get, path = "/v1/pools/{pool}/allocs/{alloc}/run", tag = "pools",
    params(("pool" = String, Path), ("alloc" = String, Path, description = "16 hex digits")),
    responses((status = 200, body = api::TaskRun), (status = 400, body = api::ErrorBody, description = "invalid_name or invalid_argument"),
        (status = 403, body = api::ErrorBody, description = "forbidden: the caller may read the pool, not the task's application"),
        (status = 404, body = api::ErrorBody, description = "alloc_not_found; task_not_found (the alloc holds no task, or a gang placeholder); app_not_found; run_not_found"),
        (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn get_alloc_run(
    State(state): State<ServerState>,
    who: crate::access::Who,
    Segments((pool, alloc)): Segments<(String, String)>,
) -> Answer<api::TaskRun> {
    use crate::convert::pools::{alloc_id, alloc_task, pool_name};
    let found = state.store.inspect_alloc(pool_name(&pool)?, alloc_id(&alloc)?).await?;
    let alloc = match found {
        AllocState::Live(alloc) => alloc,
        AllocState::Ended(ended) => ended.alloc,
    };
    let uri = format!("{}/{}", alloc.pool, alloc.id);
    let not_found = |why: String| ApiError::of(ErrorCode::TaskNotFound, format!("alloc `{uri}` {why}"));
    let Some(held) = alloc_task(&alloc) else {
        return Err(not_found("holds no task: only the allocs the scheduler holds for tasks do".to_owned()));
    };
    let Some(task) = held.task else {
        let placeholder = held.placeholder.unwrap_or_default();
        let why = format!("holds placeholder `{placeholder}` of application `{}`: no task has taken it over", held.app);
        return Err(not_found(why));
    };
    let (app_id, task_id) = (app_id(&held.app)?, task_id(&task)?);
    let info = state.store.app(app_id.clone()).await?;
    who.check(Permission::Read, Resource::Queue(info.app.spec.queue.to_string()))?;
    match state.store.run(app_id, task_id).await? {
        Some(run) => Ok(Json(convert::task_run(&held.app, &task, run))),
        None => Err(ApiError::of(
            ErrorCode::RunNotFound,
            format!("task `{task}` of application `{}` (in alloc `{uri}`) has not been run", held.app),
        )),
    }
}

/// The query of a task's logs.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct LogsQuery {
    /// The log's name: `stdout` (the default) or `stderr` for shell tasks; a plugin names its own.
    stream: Option<String>,
    /// The attempt; the current one when absent.
    #[param(minimum = 1)]
    attempt: Option<u32>,
    /// Where to start, in bytes: the `next_offset` of the piece before.
    #[param(minimum = 0)]
    offset: Option<u64>,
}

/// The most of a log one answer carries.
const LOG_PIECE: u64 = 256 * 1024;

/// A piece of a task's log, read on the daemon that runs it (logs are files on its machine, named
/// by the run's log links). Follow a log by reading again from `next_offset` until `ended`.
#[utoipa::path(get, path = "/v1/apps/{app}/tasks/{task}/logs", tag = "apps",
    params(("app" = String, Path, description = "the application's id"), ("task" = String, Path, description = "the task's id"), LogsQuery),
    responses((status = 200, body = api::TaskLogs), (status = 400, body = api::ErrorBody, description = "invalid_argument"),
        (status = 404, body = api::ErrorBody, description = "app_not_found, task_not_found, run_not_found, or logs_not_found (no such log in that attempt, or it is on the machine of another daemon)"),
        (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn get_task_logs(
    State(state): State<ServerState>,
    Segments((app, task)): Segments<(String, String)>,
    QueryArgs(query): QueryArgs<LogsQuery>,
    headers: axum::http::HeaderMap,
) -> Answer<api::TaskLogs> {
    let (app_id, task_id) = (app_id(&app)?, task_id(&task)?);
    let Some(run) = state.store.run(app_id.clone(), task_id.clone()).await? else {
        return Err(ApiError::new(StatusCode::NOT_FOUND, "run_not_found", format!("task `{task}` has not been run")));
    };
    if query.offset.is_some_and(|offset| offset > MAX_OFFSET) {
        return Err(ApiError::invalid_argument(format!("offset is at most {MAX_OFFSET} (bytes into the log)")));
    }
    // Logs are files on the machine that runs the task: another daemon's are read from it.
    if !headers.contains_key(&crate::FORWARDED) {
        if let Some(node) = runs_elsewhere(&state, &run).await? {
            return logs_from(&state, &node, &app, &task, &query, &headers).await;
        }
    }
    let stream = query.stream.unwrap_or_else(|| "stdout".to_owned());
    let attempt = query.attempt.unwrap_or(run.attempt);
    let not_found = |why: String| ApiError::new(StatusCode::NOT_FOUND, "logs_not_found", why);
    // The attempt's latest link of that name to a file.
    let path = run
        .events
        .iter()
        .rev()
        .filter(|e| e.attempt == attempt)
        .flat_map(|e| e.logs.iter())
        .find(|l| l.name == stream)
        .and_then(|l| l.uri.strip_prefix("file://"))
        .map(std::path::PathBuf::from)
        .ok_or_else(|| not_found(format!("attempt {attempt} of task `{task}` has no `{stream}` log")))?;
    // Only a file in the run's own directory on this machine is served: a link elsewhere (a
    // plugin's or a service's, a symbolic link a command made) is not read.
    let here = state.executor.as_ref().map(|executor| executor.task_dir(&app_id, &task_id));
    let path = here.and_then(|dir| confined(&dir, &path)).ok_or_else(|| {
        not_found(format!(
            "the `{stream}` log of task `{task}` is not a file this daemon keeps for it: ask the daemon that runs its \
             pool, or follow the link in the run's events"
        ))
    })?;
    let offset = query.offset.unwrap_or(0);
    let piece = read_piece(&path, offset).await.map_err(|e| {
        not_found(format!(
            "the `{stream}` log of task `{task}` is not on this daemon's machine ({e}): ask the daemon that runs its pool"
        ))
    })?;
    let ended = attempt < run.attempt || matches!(run.next(), allot_core::runs::Next::Report(_));
    let next_offset = offset + piece.len() as u64;
    Ok(Json(api::TaskLogs {
        app,
        task,
        attempt,
        stream,
        offset,
        next_offset,
        text: String::from_utf8_lossy(&piece).into_owned(),
        ended,
    }))
}

/// The daemon that runs the run's current placement, if it is another one (by the executors'
/// leases).
async fn runs_elsewhere(state: &ServerState, run: &allot_core::runs::Run) -> Result<Option<String>, ApiError> {
    let Some(pool) = run.alloc.as_deref().and_then(|alloc| alloc.split_once('/')).map(|(pool, _)| pool) else {
        return Ok(None);
    };
    let here = state.executor.as_ref().map(|e| e.node().to_owned());
    let leases = state.store.executors().await?;
    Ok(runner(&leases, pool).map(|l| l.node.clone()).filter(|node| Some(node) != here.as_ref()))
}

/// The same call, answered by the daemon at `node`.
async fn logs_from(
    state: &ServerState,
    node: &str,
    app: &str,
    task: &str,
    query: &LogsQuery,
    headers: &axum::http::HeaderMap,
) -> Answer<api::TaskLogs> {
    let unavailable = |why: String| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", why);
    let mut url = reqwest::Url::parse(node).map_err(|e| unavailable(format!("the daemon `{node}`: {e}")))?;
    url.path_segments_mut()
        .map_err(|()| unavailable(format!("the daemon `{node}` has no usable URL")))?
        .extend(["v1", "apps", app, "tasks", task, "logs"]);
    let mut request = state.forwarder.client().get(url).header(crate::FORWARDED, "1");
    // The caller's own credentials: the other daemon checks them again.
    if let Some(authorization) = headers.get(axum::http::header::AUTHORIZATION) {
        request = request.header(axum::http::header::AUTHORIZATION, authorization.clone());
    }
    if let Some(stream) = &query.stream {
        request = request.query(&[("stream", stream)]);
    }
    if let Some(attempt) = query.attempt {
        request = request.query(&[("attempt", attempt)]);
    }
    if let Some(offset) = query.offset {
        request = request.query(&[("offset", offset)]);
    }
    let answer = request
        .send()
        .await
        .map_err(|e| unavailable(format!("the daemon that runs the task ({node}) did not answer: {e}")))?;
    let status = answer.status();
    let bytes = answer.bytes().await.map_err(|e| unavailable(format!("{node}: {e}")))?;
    if status.is_success() {
        return serde_json::from_slice(&bytes).map(Json).map_err(|e| unavailable(format!("{node} answered: {e}")));
    }
    match serde_json::from_slice::<api::ErrorBody>(&bytes) {
        Ok(body) if status == StatusCode::NOT_FOUND => {
            Err(ApiError::new(StatusCode::NOT_FOUND, "logs_not_found", format!("{node}: {}", body.error.message)))
        }
        _ => Err(unavailable(format!("the daemon that runs the task ({node}) answered {status}"))),
    }
}

/// The furthest offset into a log a caller may ask for (a file cannot be longer: `i64::MAX`).
const MAX_OFFSET: u64 = i64::MAX as u64;

/// `path` if it names a file directly inside `dir` or a directory under it, once every symbolic
/// link of its directories is resolved (the file itself is opened without following one).
fn confined(dir: &std::path::Path, path: &std::path::Path) -> Option<std::path::PathBuf> {
    let dir = std::fs::canonicalize(dir).ok()?;
    let name = match path.file_name() {
        Some(name) if path.components().next_back().is_some_and(|c| matches!(c, std::path::Component::Normal(_))) => {
            name
        }
        _ => return None,
    };
    let parent = std::fs::canonicalize(path.parent()?).ok()?;
    parent.starts_with(&dir).then(|| parent.join(name))
}

/// Up to [`LOG_PIECE`] bytes of `path` from `offset`, cut before a character split at the end.
/// A symbolic link is not followed, nor anything but a regular file read.
async fn read_piece(path: &std::path::Path, offset: u64) -> std::io::Result<Vec<u8>> {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    // Not blocking on a FIFO a command put there: only a regular file is read.
    let mut file =
        tokio::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path).await?;
    if !file.metadata().await?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    file.seek(std::io::SeekFrom::Start(offset)).await?;
    let mut piece = Vec::new();
    file.take(LOG_PIECE).read_to_end(&mut piece).await?;
    if let Err(err) = std::str::from_utf8(&piece) {
        if err.error_len().is_none() && piece.len() as u64 == LOG_PIECE {
            piece.truncate(err.valid_up_to());
        }
    }
    Ok(piece)
}

/// Wakes a task's run on the daemon that runs it: its plugin's next round comes at once (an
/// outside service calls this when a job it runs for the task ends).
#[utoipa::path(post, path = "/v1/apps/{app}/tasks/{task}/wake", tag = "apps",
    params(("app" = String, Path, description = "the application's id"), ("task" = String, Path, description = "the task's id")),
    responses((status = 202, body = api::Woken), (status = 400, body = api::ErrorBody, description = "invalid_argument"),
        (status = 404, body = api::ErrorBody, description = "app_not_found or task_not_found"),
        (status = 409, body = api::ErrorBody, description = "run_not_here: the task exists, and this daemon does not run it now")))]
pub(crate) async fn wake_task(
    State(state): State<ServerState>,
    Segments((app, task)): Segments<(String, String)>,
) -> Result<(StatusCode, Json<api::Woken>), ApiError> {
    let (app_key, task_key) = (app_id(&app)?, task_id(&task)?);
    match &state.executor {
        Some(executor) if executor.wake(&app_key, &task_key) => {
            Ok((StatusCode::ACCEPTED, Json(api::Woken { app, task })))
        }
        _ => {
            // A task that does not exist is its own 404; one that exists (or that this daemon
            // cannot look up: another one schedules) is not run here.
            if let Err(err @ StoreError::Apps(_)) = state.store.task(app_key, task_key).await {
                return Err(err.into());
            }
            Err(ApiError::new(
                StatusCode::CONFLICT,
                "run_not_here",
                format!("this daemon does not run task `{task}` of application `{app}` now"),
            ))
        }
    }
}

/// Whose catalog entries the plugin of a task this daemon runs now reaches; `run_not_here`
/// otherwise (a task that does not exist is its own 404).
async fn catalog_scope(state: &ServerState, app: &str, task: &str) -> Result<CatalogScope, ApiError> {
    let (app_key, task_key) = (app_id(app)?, task_id(task)?);
    if let Some(scope) = state.executor.as_ref().and_then(|executor| executor.catalog_scope(&app_key, &task_key)) {
        return Ok(scope);
    }
    if let Err(err @ StoreError::Apps(_)) = state.store.task(app_key, task_key).await {
        return Err(err.into());
    }
    Err(ApiError::new(
        StatusCode::CONFLICT,
        "run_not_here",
        format!(
            "this daemon does not run task `{task}` of application `{app}` now: its plugin's catalog is reached \
             through the daemon that runs it (the `daemon` of the job's create), while it runs"
        ),
    ))
}

fn catalog_entry(key: String, kept: allot_store::CachedOutputs) -> Result<api::CatalogEntry, ApiError> {
    let outputs = serde_json::from_str(&kept.outputs).map_err(|e| {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", format!("catalog entry {key}: {e}"))
    })?;
    Ok(api::CatalogEntry { key, outputs, app: kept.app.to_string(), task: kept.task.to_string(), kept_at_ms: kept.at })
}

/// Looks up an entry of the catalog of the plugin that runs the task, in its application's queue
/// [Flyte `Catalog().Download`]: for an outside plugin (the kit's `catalog`), while the task runs
/// on this daemon.
#[utoipa::path(post, path = "/v1/apps/{app}/tasks/{task}/catalog/lookup", tag = "apps",
    params(("app" = String, Path, description = "the application's id"), ("task" = String, Path, description = "the task's id")),
    request_body = api::CatalogLookup,
    responses((status = 200, body = api::CatalogFound), (status = 400, body = api::ErrorBody, description = "invalid_argument, invalid_json"),
        (status = 404, body = api::ErrorBody, description = "app_not_found or task_not_found"),
        (status = 409, body = api::ErrorBody, description = "run_not_here: the task exists, and this daemon does not run it now"),
        (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn catalog_lookup(
    State(state): State<ServerState>,
    Segments((app, task)): Segments<(String, String)>,
    JsonBody(body): JsonBody<api::CatalogLookup>,
) -> Answer<api::CatalogFound> {
    let scope = catalog_scope(&state, &app, &task).await?;
    let key = plugin_catalog_key(&scope, &body.name, &body.version, &body.inputs)
        .map_err(|e| ApiError::invalid_argument(e.to_string()))?;
    let entry = match state.store.cached_outputs(&key).await? {
        Some(kept) => Some(catalog_entry(key.clone(), kept)?),
        None => None,
    };
    Ok(Json(api::CatalogFound { key, entry }))
}

/// Keeps outputs in the catalog of the plugin that runs the task, in its application's queue
/// [Flyte `Catalog().Upload`]: 201 when kept, 200 when another entry was kept under the key
/// before (it stays, and is answered).
#[utoipa::path(post, path = "/v1/apps/{app}/tasks/{task}/catalog", tag = "apps",
    params(("app" = String, Path, description = "the application's id"), ("task" = String, Path, description = "the task's id")),
    request_body = api::CatalogPut,
    responses((status = 201, body = api::CatalogKept), (status = 200, body = api::CatalogKept, description = "kept before: that entry stays"),
        (status = 400, body = api::ErrorBody, description = "invalid_argument, invalid_json"),
        (status = 404, body = api::ErrorBody, description = "app_not_found or task_not_found"),
        (status = 409, body = api::ErrorBody, description = "run_not_here: the task exists, and this daemon does not run it now"),
        (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn catalog_put(
    State(state): State<ServerState>,
    Segments((app, task)): Segments<(String, String)>,
    JsonBody(body): JsonBody<api::CatalogPut>,
) -> Result<(StatusCode, Json<api::CatalogKept>), ApiError> {
    let scope = catalog_scope(&state, &app, &task).await?;
    let invalid = |e: allot_core::catalog::CatalogError| ApiError::invalid_argument(e.to_string());
    let key = plugin_catalog_key(&scope, &body.name, &body.version, &body.inputs).map_err(invalid)?;
    let outputs = body.outputs.to_string();
    check_outputs(&scope, &outputs).map_err(invalid)?;
    let at = state.store.wall_ms();
    let entry = allot_store::CachedOutputs { outputs, app: app_id(&app)?, task: task_id(&task)?, at };
    let (kept, created) = keep_first(&*state.store, &key, entry).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(api::CatalogKept { created, entry: catalog_entry(key, kept)? })))
}
