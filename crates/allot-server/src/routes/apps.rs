//! The handlers of queues, applications and tasks: one per route, each a thin conversion around
//! one `AppStore` call.

use allot_api as api;
use allot_core::access::{Permission, Resource};
use allot_store::Store;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;

use super::runs::note_unrun_pools;
use super::{Answer, UNAVAILABLE};
use crate::access::Who;
use crate::audit::Noted;
use crate::convert::apps::{self as convert, app_id, queue_path, task_id, Times};
use crate::error::ApiError;
use crate::error::ErrorCode;
use crate::extract::{JsonBody, QueryArgs, Segments};
use crate::page::{cursor, visible_page, PageQuery};
use crate::ServerState;
use allot_core::apps::admission::{self, AppAction, Caller};
use allot_core::apps::placement::{PlacementRules, Request};
use allot_core::apps::queues::Queues;
use allot_core::apps::{AppId, AppOrder, AppPlace, TaskEnding};

/// Every queue, in path order.
#[utoipa::path(get, path = "/v1/queues", tag = "apps",
    responses((status = 200, body = api::QueueList), (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn list_queues(State(state): State<ServerState>, who: Who) -> Answer<api::QueueList> {
    let queues = state.store.queues().await?;
    let visible = |queue: &allot_core::apps::QueueView| who.may_read(&Resource::Queue(queue.path.to_string()));
    Ok(Json(api::QueueList { queues: queues.into_iter().filter(visible).map(convert::queue).collect() }))
}

#[utoipa::path(get, path = "/v1/queues/{queue}", tag = "apps",
    params(("queue" = String, Path, description = "e.g. `root.analytics.etl`")),
    responses((status = 200, body = api::Queue), (status = 400, body = api::ErrorBody, description = "invalid_queue"),
        (status = 404, body = api::ErrorBody, description = "queue_not_found"), (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn get_queue(
    State(state): State<ServerState>,
    Segments(path): Segments<String>,
) -> Answer<api::Queue> {
    Ok(Json(convert::queue(state.store.queue(queue_path(&path)?).await?)))
}

/// Creates a queue (and its parents) or changes its limits; a changed limit counts from the next
/// placement, and lowering one ends nothing. Limits that contradict themselves or the queues
/// around the queue are refused (`invalid_argument`, naming which), as YuniKorn refuses them: a
/// guarantee above the queue's max or a max above it, a max above a parent's, children's maxes
/// above it, or children guaranteed more than their parent.
#[utoipa::path(put, path = "/v1/queues/{queue}", tag = "apps",
    params(("queue" = String, Path, description = "e.g. `root.analytics.etl`")),
    request_body = Option<api::PutQueue>,
    responses((status = 201, body = api::PutQueueResponse, description = "created"), (status = 200, body = api::PutQueueResponse, description = "changed"),
        (status = 400, body = api::ErrorBody, description = "invalid_queue, invalid_resources, invalid_argument (also: limits that contradict themselves or the queues around it) or invalid_json"),
        (status = 409, body = api::ErrorBody, description = "queue_not_a_leaf: a queue above it holds applications"),
        (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn put_queue(
    State(state): State<ServerState>,
    who: Who,
    Segments(path): Segments<String>,
    JsonBody(body): JsonBody<api::PutQueue>,
) -> Result<(StatusCode, Json<api::PutQueueResponse>), ApiError> {
    let limits = convert::queue_limits(body)?;
    may_admin_queue(&state, &who, &path).await?;
    let (created, view) = state.store.put_queue(queue_path(&path)?, limits).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(api::PutQueueResponse { created, queue: convert::queue(view) })))
}

/// Removes a leaf queue with no live application.
#[utoipa::path(delete, path = "/v1/queues/{queue}", tag = "apps",
    params(("queue" = String, Path, description = "e.g. `root.analytics.etl`")),
    responses((status = 200, body = api::RemovedQueue), (status = 400, body = api::ErrorBody, description = "invalid_queue"),
        (status = 404, body = api::ErrorBody, description = "queue_not_found"),
        (status = 409, body = api::ErrorBody, description = "queue_in_use: it has child queues or live applications, or it is root"),
        (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn remove_queue(
    State(state): State<ServerState>,
    who: Who,
    Segments(path): Segments<String>,
) -> Answer<api::RemovedQueue> {
    may_admin_queue(&state, &who, &path).await?;
    state.store.remove_queue(queue_path(&path)?).await?;
    Ok(Json(api::RemovedQueue { path }))
}

/// The query of `GET /v1/apps`.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct AppsQuery {
    /// Items per page: 1 to 1000, 100 when absent.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u64>,
    /// Where the page starts: the `next_cursor` of the page before (it goes on in that page's
    /// order, whatever `sort` says). Absent for the first page.
    cursor: Option<String>,
    /// The order: `id` (the default), `submitted`, `ended`; `-submitted` and `-ended` the newest
    /// first. By end, the applications that have not ended come last.
    #[param(inline)]
    sort: Option<api::AppSort>,
}

/// A page of the applications, by id or in the order asked.
#[utoipa::path(get, path = "/v1/apps", tag = "apps", params(AppsQuery),
    responses((status = 200, body = api::AppList), (status = 400, body = api::ErrorBody, description = "invalid_argument (limit, sort) or invalid_cursor"),
        (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn list_apps(
    State(state): State<ServerState>,
    who: Who,
    QueryArgs(query): QueryArgs<AppsQuery>,
) -> Answer<api::AppList> {
    // A cursor goes on in its list's order; `sort` orders the first page.
    let request = PageQuery::new(query.limit, query.cursor).request::<(AppOrder, AppPlace)>()?;
    let order = request.after().map_or_else(|| convert::app_order(query.sort.unwrap_or_default()), |(order, _)| *order);
    let visible = |info: &allot_store::AppInfo| who.may_read(&Resource::Queue(info.app.spec.queue.to_string()));
    let store = &state.store;
    let read = |page| store.apps_in_order(order, page);
    let place = |info: &allot_store::AppInfo| info.app.place(order);
    let page = visible_page(request.map(|(_, place)| place), read, visible, place).await?;
    let times = Times::of(state.store.as_ref());
    Ok(Json(api::AppList {
        apps: page.items.into_iter().map(|info| convert::app(info, times)).collect(),
        next_cursor: cursor(page.next.map(|place| (order, place))),
    }))
}

/// Submits an application with the tasks it carries, all or nothing: a refusal (4xx) leaves
/// nothing behind. The same application again is answered as it is (200), with any new tasks
/// added; other content under its id is `app_conflict`.
#[utoipa::path(post, path = "/v1/apps", tag = "apps", request_body = api::SubmitApp,
    responses((status = 201, body = api::SubmitAppResponse, description = "submitted"), (status = 200, body = api::SubmitAppResponse, description = "already submitted with this content"),
        (status = 400, body = api::ErrorBody, description = "invalid_argument, invalid_queue, invalid_resources or invalid_json"),
        (status = 403, body = api::ErrorBody, description = "forbidden: the caller may not submit to the queue named and no placement rule gives another"),
        (status = 404, body = api::ErrorBody, description = "queue_not_found"),
        (status = 409, body = api::ErrorBody, description = "namespace_not_found (a token namespace the application names does not exist), unknown_task_group, app_conflict, task_conflict, task_group_conflict (a group given twice with different content), app_ended, queue_not_a_leaf, no_usable_queue (it names no queue and no placement rule gives it a usable one), gang_never_fits (no pool can ever hold a member), gang_exceeds_queue or larger_than_task_group"),
        (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn submit_app(
    State(state): State<ServerState>,
    who: Who,
    JsonBody(mut body): JsonBody<api::SubmitApp>,
) -> Result<(StatusCode, axum::Extension<Noted>, Json<api::SubmitAppResponse>), ApiError> {
    let judged = who.judged();
    let caller = judged.as_ref().map(|(principal, policy)| Caller { principal, policy });
    // The application runs as the caller, its user and groups, unless it names others (which
    // needs `impersonate`: `admission::submit_refusal`).
    if let Some(caller) = caller {
        let (user, _) = admission::run_as(caller.principal, &body.user, &body.user_groups, api::DEFAULT_USER);
        (body.user, body.user_groups) = (user.user, user.groups);
    }
    let answer = submit_as(state.store.as_ref(), caller, &state.placement, body).await?;
    let status = if answer.created { StatusCode::CREATED } else { StatusCode::OK };
    let made = format!("apps/{} in queue {}", answer.app.id, answer.app.queue);
    Ok((status, axum::Extension(Noted { made: Some(made), ..Noted::default() }), Json(answer)))
}

/// Submits an application as `POST /v1/apps` does, for a trusted source (the directory
/// source): any queue may be used, the placement rules choose one when it names none.
pub async fn submit(
    store: &dyn Store,
    rules: &PlacementRules,
    body: api::SubmitApp,
) -> Result<api::SubmitAppResponse, ApiError> {
    submit_as(store, None, rules, body).await
}

/// Submits an application for `caller` (none: trusted) to the queue the door gives it, all or
/// nothing: its queue, then the tasks it carries, in order, in one commit.
async fn submit_as(
    store: &dyn Store,
    caller: Option<Caller<'_>>,
    rules: &PlacementRules,
    body: api::SubmitApp,
) -> Result<api::SubmitAppResponse, ApiError> {
    let queues = match caller.is_some() || !rules.is_empty() {
        true => store.queue_tree().await?,
        false => Queues::new(),
    };
    let request =
        Request { queue: body.queue.as_deref(), user: &body.user, groups: &body.user_groups, tags: &body.tags };
    let submission = admission::Submission { app: &body.id, queue: body.queue.as_deref(), request };
    let (queue, rule) = admission::choose_queue(caller, rules, &queues, &submission).map_err(refused)?;
    let spec = convert::app_spec(&body, queue, rule)?;
    let tasks = body.tasks.into_iter().map(convert::task_spec).collect::<Result<Vec<_>, _>>()?;
    let needs = spec.groups.iter().flat_map(|g| &g.tokens).chain(tasks.iter().flat_map(|t| &t.tokens));
    admission::check_namespaces(caller, &spec.principal(), needs.map(|need| &need.namespace)).map_err(refused)?;
    // One commit, all or nothing: a refused task leaves no application behind, and a large
    // application is submitted at the speed of one write.
    let (info, created, added) = store.submit_app(spec, tasks).await?;
    let tasks = added.into_iter().map(|(info, _)| convert::task(info, store.now())).collect();
    Ok(api::SubmitAppResponse { created, app: convert::app(info, Times::of(store)), tasks })
}

/// A refusal of the door, as the API answers it.
fn refused(refused: admission::Refused) -> ApiError {
    use admission::Refused as R;
    match refused {
        R::Forbidden(why) => ApiError::of(ErrorCode::Forbidden, why),
        R::NoUsableQueue(why) => ApiError::of(ErrorCode::NoUsableQueue, why),
        R::NotALeaf(why) => ApiError::of(ErrorCode::QueueNotALeaf, why),
        R::Queue(err) => ApiError::from(allot_core::apps::SchedError::from(err)),
    }
}

/// Refuses `action` on application `id` unless the caller may (`admission::app_refusal`): its
/// own user may, anyone else needs `admin` on its queue. An application that does not exist is
/// left to the store to answer.
async fn may_change(state: &ServerState, who: &Who, id: &AppId, action: AppAction) -> Result<(), ApiError> {
    may_change_app(state, who, id, action).await.map(drop)
}

/// [`may_change`], answering the application's spec when the caller is checked and it exists
/// (a task added to it is then checked as its user's).
async fn may_change_app(
    state: &ServerState,
    who: &Who,
    id: &AppId,
    action: AppAction,
) -> Result<Option<allot_core::apps::AppSpec>, ApiError> {
    let Some((principal, policy)) = who.judged() else { return Ok(None) };
    let Ok(info) = state.store.app(id.clone()).await else { return Ok(None) };
    let queues = state.store.queue_tree().await?;
    let caller = Caller { principal: &principal, policy: &policy };
    match admission::app_refusal(Some(caller), &queues, &info.app.spec, action) {
        Some(why) => Err(ApiError::of(ErrorCode::Forbidden, why)),
        None => Ok(Some(info.app.spec)),
    }
}

#[utoipa::path(get, path = "/v1/apps/{app}", tag = "apps",
    params(("app" = String, Path, description = "the application's id")),
    responses((status = 200, body = api::App), (status = 400, body = api::ErrorBody, description = "invalid_argument"),
        (status = 404, body = api::ErrorBody, description = "app_not_found"), (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn get_app(State(state): State<ServerState>, Segments(id): Segments<String>) -> Answer<api::App> {
    let info = state.store.app(app_id(&id)?).await?;
    Ok(Json(convert::app(info, Times::of(state.store.as_ref()))))
}

/// Removes an application: its tasks end, and every alloc and grant it holds is released.
#[utoipa::path(delete, path = "/v1/apps/{app}", tag = "apps",
    params(("app" = String, Path, description = "the application's id")),
    responses((status = 200, body = api::App), (status = 400, body = api::ErrorBody, description = "invalid_argument"),
        (status = 404, body = api::ErrorBody, description = "app_not_found"), (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn remove_app(
    State(state): State<ServerState>,
    who: Who,
    Segments(id): Segments<String>,
) -> Answer<api::App> {
    let id = app_id(&id)?;
    may_change(&state, &who, &id, AppAction::End).await?;
    let info = state.store.remove_app(id).await?;
    Ok(Json(convert::app(info, Times::of(state.store.as_ref()))))
}

/// Reports the application complete: tasks that have not ended are killed, everything it holds
/// is released.
#[utoipa::path(post, path = "/v1/apps/{app}/complete", tag = "apps",
    params(("app" = String, Path, description = "the application's id")),
    responses((status = 200, body = api::App), (status = 400, body = api::ErrorBody, description = "invalid_argument"),
        (status = 404, body = api::ErrorBody, description = "app_not_found"), (status = 409, body = api::ErrorBody, description = "app_ended"),
        (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn complete_app(
    State(state): State<ServerState>,
    who: Who,
    Segments(id): Segments<String>,
) -> Answer<api::App> {
    let id = app_id(&id)?;
    may_change(&state, &who, &id, AppAction::End).await?;
    let info = state.store.complete_app(id).await?;
    Ok(Json(convert::app(info, Times::of(state.store.as_ref()))))
}

/// Reports the application failed: tasks not placed fail, placed ones are killed, everything it
/// holds is released.
#[utoipa::path(post, path = "/v1/apps/{app}/fail", tag = "apps",
    params(("app" = String, Path, description = "the application's id")), request_body = Option<api::Fail>,
    responses((status = 200, body = api::App), (status = 400, body = api::ErrorBody, description = "invalid_argument or invalid_json"),
        (status = 404, body = api::ErrorBody, description = "app_not_found"), (status = 409, body = api::ErrorBody, description = "app_ended"),
        (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn fail_app(
    State(state): State<ServerState>,
    who: Who,
    Segments(id): Segments<String>,
    JsonBody(body): JsonBody<api::Fail>,
) -> Answer<api::App> {
    let id = app_id(&id)?;
    may_change(&state, &who, &id, AppAction::End).await?;
    let reason = body.reason.unwrap_or_else(|| "reported failed".to_owned());
    let info = state.store.fail_app(id, reason).await?;
    Ok(Json(convert::app(info, Times::of(state.store.as_ref()))))
}

/// A page of the application's tasks, ordered by id.
#[utoipa::path(get, path = "/v1/apps/{app}/tasks", tag = "apps",
    params(("app" = String, Path, description = "the application's id"), PageQuery),
    responses((status = 200, body = api::TaskList), (status = 400, body = api::ErrorBody, description = "invalid_argument or invalid_cursor"),
        (status = 404, body = api::ErrorBody, description = "app_not_found"), (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn list_tasks(
    State(state): State<ServerState>,
    Segments(id): Segments<String>,
    QueryArgs(query): QueryArgs<PageQuery>,
) -> Answer<api::TaskList> {
    let page = state.store.tasks(app_id(&id)?, query.request()?).await?;
    let mut tasks: Vec<api::Task> = page.items.into_iter().map(|info| convert::task(info, state.store.now())).collect();
    note_unrun_pools(&state, &mut tasks).await;
    Ok(Json(api::TaskList { tasks, next_cursor: cursor(page.next) }))
}

/// Adds a task; the same task again is answered as it is (200).
#[utoipa::path(post, path = "/v1/apps/{app}/tasks", tag = "apps",
    params(("app" = String, Path, description = "the application's id")), request_body = api::AddTask,
    responses((status = 201, body = api::AddTaskResponse, description = "added"), (status = 200, body = api::AddTaskResponse, description = "already added with this content"),
        (status = 400, body = api::ErrorBody, description = "invalid_argument, invalid_resources or invalid_json"),
        (status = 404, body = api::ErrorBody, description = "app_not_found"),
        (status = 409, body = api::ErrorBody, description = "namespace_not_found (a token namespace the task names does not exist), unknown_task_group, task_conflict, app_ended or larger_than_task_group"), (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn add_task(
    State(state): State<ServerState>,
    who: Who,
    Segments(id): Segments<String>,
    JsonBody(body): JsonBody<api::AddTask>,
) -> Result<(StatusCode, Json<api::AddTaskResponse>), ApiError> {
    let spec = convert::task_spec(body)?;
    let id = app_id(&id)?;
    if let (Some(app), Some((principal, policy))) =
        (may_change_app(&state, &who, &id, AppAction::AddTask).await?, who.judged())
    {
        // The task runs as the application's user: its namespaces are that user's to use.
        let caller = Some(Caller { principal: &principal, policy: &policy });
        let namespaces = spec.tokens.iter().map(|need| &need.namespace);
        admission::check_namespaces(caller, &app.principal(), namespaces).map_err(refused)?;
    }
    let (info, created) = state.store.add_task(id, spec).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(api::AddTaskResponse { created, task: convert::task(info, state.store.now()) })))
}

/// A task: its state, where it is placed (its alloc and tokens), or why it waits.
#[utoipa::path(get, path = "/v1/apps/{app}/tasks/{task}", tag = "apps",
    params(("app" = String, Path, description = "the application's id"), ("task" = String, Path, description = "the task's id")),
    responses((status = 200, body = api::Task), (status = 400, body = api::ErrorBody, description = "invalid_argument"),
        (status = 404, body = api::ErrorBody, description = "app_not_found or task_not_found"), (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn get_task(
    State(state): State<ServerState>,
    Segments((app, task)): Segments<(String, String)>,
) -> Answer<api::Task> {
    let mut task = convert::task(state.store.task(app_id(&app)?, task_id(&task)?).await?, state.store.now());
    note_unrun_pools(&state, std::slice::from_mut(&mut task)).await;
    Ok(Json(task))
}

/// Removes a task; what it holds is released.
#[utoipa::path(delete, path = "/v1/apps/{app}/tasks/{task}", tag = "apps",
    params(("app" = String, Path, description = "the application's id"), ("task" = String, Path, description = "the task's id")),
    responses((status = 200, body = api::Task), (status = 400, body = api::ErrorBody, description = "invalid_argument"),
        (status = 404, body = api::ErrorBody, description = "app_not_found or task_not_found"), (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn remove_task(
    State(state): State<ServerState>,
    who: Who,
    Segments((app, task)): Segments<(String, String)>,
) -> Answer<api::Task> {
    let (app, task) = (app_id(&app)?, task_id(&task)?);
    may_change(&state, &who, &app, AppAction::End).await?;
    Ok(Json(convert::task(state.store.remove_task(app, task).await?, state.store.now())))
}

/// Reports an Allocated task running.
#[utoipa::path(post, path = "/v1/apps/{app}/tasks/{task}/start", tag = "apps",
    params(("app" = String, Path, description = "the application's id"), ("task" = String, Path, description = "the task's id")),
    responses((status = 200, body = api::Task), (status = 400, body = api::ErrorBody, description = "invalid_argument"),
        (status = 404, body = api::ErrorBody, description = "app_not_found or task_not_found"),
        (status = 409, body = api::ErrorBody, description = "illegal_transition: the task is not Allocated"),
        (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn start_task(
    State(state): State<ServerState>,
    Segments((app, task)): Segments<(String, String)>,
) -> Answer<api::Task> {
    Ok(Json(convert::task(state.store.start_task(app_id(&app)?, task_id(&task)?).await?, state.store.now())))
}

/// Reports a task completed: its alloc and tokens are released.
#[utoipa::path(post, path = "/v1/apps/{app}/tasks/{task}/complete", tag = "apps",
    params(("app" = String, Path, description = "the application's id"), ("task" = String, Path, description = "the task's id")),
    responses((status = 200, body = api::Task), (status = 400, body = api::ErrorBody, description = "invalid_argument"),
        (status = 404, body = api::ErrorBody, description = "app_not_found or task_not_found"),
        (status = 409, body = api::ErrorBody, description = "illegal_transition: the task is not placed"),
        (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn complete_task(
    State(state): State<ServerState>,
    Segments((app, task)): Segments<(String, String)>,
) -> Answer<api::Task> {
    Ok(Json(convert::task(state.store.finish_task(app_id(&app)?, task_id(&task)?, None).await?, state.store.now())))
}

/// Reports a task failed: what it holds is released.
#[utoipa::path(post, path = "/v1/apps/{app}/tasks/{task}/fail", tag = "apps",
    params(("app" = String, Path, description = "the application's id"), ("task" = String, Path, description = "the task's id")),
    request_body = Option<api::Fail>,
    responses((status = 200, body = api::Task), (status = 400, body = api::ErrorBody, description = "invalid_argument or invalid_json"),
        (status = 404, body = api::ErrorBody, description = "app_not_found or task_not_found"),
        (status = 409, body = api::ErrorBody, description = "illegal_transition: the task has ended"),
        (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn fail_task(
    State(state): State<ServerState>,
    Segments((app, task)): Segments<(String, String)>,
    JsonBody(body): JsonBody<api::Fail>,
) -> Answer<api::Task> {
    let reason = body.reason.unwrap_or_else(|| "reported failed".to_owned());
    Ok(Json(convert::task(
        state.store.finish_task(app_id(&app)?, task_id(&task)?, Some(reason)).await?,
        state.store.now(),
    )))
}

/// The most reports `POST /v1/tasks/finish` takes in one call.
pub(crate) const MAX_TASK_ENDS: usize = 1000;

/// Reports several tasks completed or failed in one call, committed as one change: what each holds
/// is released. Each report is answered in order, with the task or with the error its own
/// `complete` or `fail` call would have answered (a refused report changes nothing).
#[utoipa::path(post, path = "/v1/tasks/finish", tag = "apps",
    request_body = api::FinishTasks,
    responses((status = 200, body = api::FinishedTasks),
        (status = 400, body = api::ErrorBody, description = "invalid_json, or invalid_argument: more than 1,000 reports"),
        (status = 503, body = api::ErrorBody, description = UNAVAILABLE)))]
pub(crate) async fn finish_tasks(
    State(state): State<ServerState>,
    who: Who,
    JsonBody(body): JsonBody<api::FinishTasks>,
) -> Result<(axum::Extension<Noted>, Json<api::FinishedTasks>), ApiError> {
    if body.tasks.len() > MAX_TASK_ENDS {
        return Err(ApiError::of(
            ErrorCode::InvalidArgument,
            format!("{} reports in one call; at most {MAX_TASK_ENDS} are taken", body.tasks.len()),
        ));
    }
    // Reports with names that cannot be are answered without the store; the others go together.
    let mut answers: Vec<Option<Result<api::Task, ApiError>>> = Vec::with_capacity(body.tasks.len());
    let mut ends = Vec::new();
    // A batch is mostly one application's ends: each application is looked up once.
    let mut allowed: std::collections::HashMap<allot_core::apps::AppId, Result<(), ApiError>> = Default::default();
    for end in &body.tasks {
        let ids = match (app_id(&end.app), task_id(&end.task)) {
            (Ok(app), Ok(task)) => {
                if !allowed.contains_key(&app) {
                    allowed.insert(app.clone(), may_report(&state, &who, &app).await);
                }
                allowed[&app].clone().map(|()| (app, task))
            }
            (Err(err), _) | (_, Err(err)) => Err(err),
        };
        match ids {
            Ok((app, task)) => {
                let ending = match end.outcome {
                    api::TaskOutcome::Completed => TaskEnding::Completed,
                    api::TaskOutcome::Failed => {
                        TaskEnding::Failed(end.reason.clone().unwrap_or_else(|| "reported failed".to_owned()))
                    }
                    api::TaskOutcome::Preempted => TaskEnding::Preempted,
                };
                ends.push(allot_core::apps::TaskEnd { app, task, ending });
                answers.push(None);
            }
            Err(err) => answers.push(Some(Err(err))),
        }
    }
    let mut stored = state.store.finish_tasks(ends).await?.into_iter();
    let tasks: Vec<api::TaskEndAnswer> = body
        .tasks
        .into_iter()
        .zip(answers)
        .map(|(end, answer)| {
            let answer = answer.unwrap_or_else(|| {
                let stored = stored.next().expect("one answer per report");
                stored.map(|info| convert::task(info, state.store.now())).map_err(ApiError::from)
            });
            let (ended, error) = match answer {
                Ok(task) => (Some(task), None),
                Err(err) => (
                    None,
                    Some(api::ErrorDetail { code: err.code.to_owned(), message: err.message, compact_revision: None }),
                ),
            };
            api::TaskEndAnswer { app: end.app, task: end.task, ended, error }
        })
        .collect();
    // Each report refused for access is a refusal of its own in the audit trail.
    let refused: Vec<String> = tasks
        .iter()
        .filter(|answer| answer.error.as_ref().is_some_and(|e| e.code == ErrorCode::Forbidden.as_str()))
        .map(|answer| format!("apps/{}/tasks/{}", answer.app, answer.task))
        .collect();
    Ok((axum::Extension(Noted { made: None, refused }), Json(api::FinishedTasks { tasks })))
}

/// Refuses a report on `app` unless the caller may use its queue (an application that does not
/// exist is answered by the store, as `app_not_found`).
async fn may_report(state: &ServerState, who: &Who, app: &allot_core::apps::AppId) -> Result<(), ApiError> {
    if who.principal().is_none() {
        return Ok(());
    }
    match state.store.app(app.clone()).await {
        Ok(info) => who.check(Permission::Use, Resource::Queue(info.app.spec.queue.to_string())),
        Err(_) => Ok(()),
    }
}

/// Refuses a change of queue `path` unless the caller is its admin (`admission::queue_admin_refusal`:
/// by its roles, or by an `admin_acl` on the way up).
async fn may_admin_queue(state: &ServerState, who: &Who, path: &str) -> Result<(), ApiError> {
    let Some((principal, policy)) = who.judged() else { return Ok(()) };
    let path = queue_path(path)?;
    if policy.allows(&principal, Permission::Admin, &Resource::Queue(path.to_string())) {
        return Ok(());
    }
    let queues = state.store.queue_tree().await?;
    match admission::queue_admin_refusal(Caller { principal: &principal, policy: &policy }, &queues, &path) {
        Some(why) => Err(ApiError::of(ErrorCode::Forbidden, why)),
        None => Ok(()),
    }
}
