//! The `http` plugin against an outside service of jobs: never more at once than its quota, and
//! the jobs of a removed application deleted.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_core::apps::states::TaskState;
use allot_core::apps::TaskId;
use allot_core::runs::Phase;
use allot_exec::{builtin, PluginCounters};

use crate::support::*;

/// An outside service of jobs (the `http` plugin's protocol) that counts how many jobs it runs at
/// once: a job runs from its create until it is read after its deadline, or deleted.
#[derive(Default)]
struct JobService {
    jobs: std::sync::Mutex<BTreeMap<String, (Instant, bool)>>,
    active: AtomicU32,
    most: AtomicU32,
    created: AtomicU32,
    deleted: AtomicU32,
}

async fn job_service(millis: u64) -> (Arc<JobService>, String) {
    use axum::extract::{Path, State};
    use axum::routing::{get, post};
    let service = Arc::new(JobService::default());
    let create = async move |State(s): State<Arc<JobService>>, headers: axum::http::HeaderMap| {
        let key = headers["idempotency-key"].to_str().unwrap().replace('/', "-");
        let mut jobs = s.jobs.lock().unwrap();
        if !jobs.contains_key(&key) {
            jobs.insert(key.clone(), (Instant::now() + Duration::from_millis(millis), false));
            s.created.fetch_add(1, Ordering::SeqCst);
            let now = s.active.fetch_add(1, Ordering::SeqCst) + 1;
            s.most.fetch_max(now, Ordering::SeqCst);
        }
        axum::Json(serde_json::json!({ "resource_meta": key }))
    };
    let read = async |State(s): State<Arc<JobService>>, Path(id): Path<String>| {
        let mut jobs = s.jobs.lock().unwrap();
        let (deadline, ended) = jobs.get_mut(&id).unwrap();
        if !*ended && Instant::now() >= *deadline {
            *ended = true;
            s.active.fetch_sub(1, Ordering::SeqCst);
        }
        let phase = if *ended { "succeeded" } else { "running" };
        axum::Json(serde_json::json!({ "phase": phase, "outputs": { "job": id } }))
    };
    let delete = async |State(s): State<Arc<JobService>>, Path(id): Path<String>| {
        let mut jobs = s.jobs.lock().unwrap();
        if let Some((_, ended)) = jobs.get_mut(&id) {
            if !*ended {
                *ended = true;
                s.active.fetch_sub(1, Ordering::SeqCst);
                s.deleted.fetch_add(1, Ordering::SeqCst);
            }
        }
        axum::http::StatusCode::NO_CONTENT
    };
    let app = axum::Router::new()
        .route("/jobs", post(create))
        .route("/jobs/{id}", get(read).delete(delete))
        .with_state(service.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/jobs", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (service, url)
}

/// The `http` plugin's quota configured to 3, `url` its one service.
async fn setup_with_http_quota(url: &str) -> Setup {
    let (dir, store) = new_store().await;
    let probe = Arc::new(Probe::default());
    let service = builtin::JobService { url: url.to_owned(), secret: None };
    let builtin = builtin::BuiltinConfig { http_jobs: 3, http_services: vec![service], ..Default::default() };
    let stop = start_with(store.clone(), dir.path(), probe.clone(), PluginCounters::default(), &builtin, |_| {}).await;
    Setup { _dir: dir, store, probe, stop }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_jobs_never_run_more_at_once_than_the_quota_and_leave_no_token_held() {
    let (service, url) = job_service(150).await;
    let s = setup_with_http_quota(&url).await;
    let store = &*s.store;
    let spec = serde_json::json!({ "type": "http", "url": url, "poll_seconds": 0.05 });
    let tasks: Vec<(String, serde_json::Value)> = (0..8).map(|i| (format!("j{i}"), spec.clone())).collect();
    let tasks: Vec<(&str, serde_json::Value)> = tasks.iter().map(|(t, v)| (t.as_str(), v.clone())).collect();
    let app = submit(store, "h", &tasks).await;
    for (task, _) in &tasks {
        until(task, async || state(store, &app, task).await == TaskState::Completed).await;
    }
    assert_eq!(service.created.load(Ordering::SeqCst), 8, "one job per task");
    let most = service.most.load(Ordering::SeqCst);
    assert!((1..=3).contains(&most), "the service saw {most} jobs at once; the quota is 3");
    let run = store.run(app.clone(), TaskId::new("j0").unwrap()).await.unwrap().unwrap();
    assert_eq!(run.outputs.as_deref(), Some(r#"{"job":"h-j0-1"}"#), "the job's outputs are the task's");
    let jobs = allot_core::NamespaceName::new("http:jobs").unwrap();
    assert_eq!(store.namespace(jobs).await.unwrap().granted_units, 0, "no token is left held");
    s.stop.send_replace(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_jobs_of_a_removed_application_are_deleted_and_their_tokens_released() {
    let (service, url) = job_service(60_000).await;
    let s = setup_with_http_quota(&url).await;
    let store = &*s.store;
    let spec = serde_json::json!({ "type": "http", "url": url, "poll_seconds": 0.05 });
    let tasks: Vec<(String, serde_json::Value)> = (0..6).map(|i| (format!("j{i}"), spec.clone())).collect();
    let tasks: Vec<(&str, serde_json::Value)> = tasks.iter().map(|(t, v)| (t.as_str(), v.clone())).collect();
    let app = submit(store, "k", &tasks).await;
    let jobs = allot_core::NamespaceName::new("http:jobs").unwrap();
    until("three jobs run, three tasks wait", async || {
        let mut waiting = 0;
        for (task, _) in &tasks {
            let run = store.run(app.clone(), TaskId::new(task).unwrap()).await.unwrap();
            waiting += usize::from(run.is_some_and(|r| r.phase == Phase::WaitingForResources));
        }
        service.active.load(Ordering::SeqCst) == 3 && waiting == 3
    })
    .await;
    assert_eq!(store.namespace(jobs.clone()).await.unwrap().granted_units, 3);
    store.remove_app(app.clone()).await.unwrap();
    until("the running jobs are deleted", async || service.deleted.load(Ordering::SeqCst) == 3).await;
    until("no token is held", async || store.namespace(jobs.clone()).await.unwrap().granted_units == 0).await;
    // The waiting tasks never reached the service, and nothing took their place until the
    // executor stopped.
    stopped(&s.stop).await;
    assert_eq!(service.created.load(Ordering::SeqCst), 3);
    assert_eq!(store.namespace(jobs).await.unwrap().granted_units, 0);
}

/// A service whose one job is running until `stage` says otherwise: at stage 0 with one log link
/// and its custom information, at 1 with a second link, at 2 succeeded. It says the job began at
/// `began_ms`.
async fn told_job_service(stage: Arc<AtomicU32>, began_ms: u64) -> String {
    use axum::extract::State;
    use axum::routing::{get, post};
    let create = async || axum::Json(serde_json::json!({ "resource_meta": "job-7" }));
    let read = async move |State(stage): State<Arc<AtomicU32>>| {
        let console = serde_json::json!({ "name": "console", "uri": "https://jobs.example/job-7" });
        let logs = serde_json::json!({ "name": "logs", "uri": "https://logs.example/job-7" });
        let custom = serde_json::json!({ "job_id": "job-7", "link": "https://jobs.example/job-7" });
        axum::Json(match stage.load(Ordering::SeqCst) {
            0 => serde_json::json!({
                "phase": "running", "log_links": [console], "custom_info": custom, "occurred_at_ms": began_ms,
            }),
            1 => serde_json::json!({
                "phase": "running", "log_links": [console, logs], "custom_info": custom, "occurred_at_ms": began_ms,
            }),
            _ => serde_json::json!({ "phase": "succeeded", "outputs": { "rows": 3 } }),
        })
    };
    let app = axum::Router::new()
        .route("/jobs", post(create))
        .route("/jobs/{id}", get(read).delete(async || axum::http::StatusCode::NO_CONTENT))
        .with_state(stage);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/jobs", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// Flyte's `TaskInfo` through the job protocol: when the service says the job began, its custom
/// information and its log links are in the run's events; a change of the links within the phase
/// is a new version of it, so an event of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_start_custom_info_and_links_are_in_its_run() {
    let stage = Arc::new(AtomicU32::new(0));
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let began_ms = now_ms - 3_000;
    let url = told_job_service(stage.clone(), began_ms).await;
    let s = setup_with_http_quota(&url).await;
    let store = &*s.store;
    let spec = serde_json::json!({ "type": "http", "url": url, "poll_seconds": 0.05 });
    let app = submit(store, "told", &[("t", spec)]).await;
    let task = TaskId::new("t").unwrap();
    let running = async |links: usize| {
        let run = store.run(app.clone(), task.clone()).await.unwrap();
        run.is_some_and(|r| r.events.iter().any(|e| e.phase == Phase::Running && e.logs.len() == links))
    };
    until("the job is seen running with its console", async || running(1).await).await;
    stage.store(1, Ordering::SeqCst);
    until("the job's second link is seen", async || running(2).await).await;
    stage.store(2, Ordering::SeqCst);
    until("the task completes", async || state(store, &app, "t").await == TaskState::Completed).await;

    let run = store.run(app.clone(), task).await.unwrap().unwrap();
    let running: Vec<_> = run.events.iter().filter(|e| e.phase == Phase::Running).collect();
    assert_eq!(running.len(), 2, "one event per version of the running phase: {:?}", run.events);
    assert_eq!((running[0].version, running[1].version), (0, 1));
    for event in &running {
        assert_eq!(event.occurred_at, Some(began_ms), "when the service says the job began");
        assert!(event.at >= began_ms + 3_000, "recorded when the round saw it");
        let custom: serde_json::Value = serde_json::from_str(event.custom_info.as_deref().unwrap()).unwrap();
        assert_eq!(custom["job_id"], "job-7");
    }
    assert_eq!(running[1].logs[1].uri, "https://logs.example/job-7");
    let done = run.events.iter().find(|e| e.phase == Phase::Success).unwrap();
    assert_eq!((done.occurred_at, done.custom_info.as_deref()), (None, None), "nothing said, nothing kept");
    s.stop.send_replace(true);
}

/// A task cannot send its calls anywhere but to a configured service, nor name a secret of its
/// choosing: such a task fails for good, and the service is never called.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_tasks_call_only_configured_services_with_their_own_secret() {
    let (service, url) = job_service(10).await;
    let s = setup_with_http_quota(&url).await;
    let store = &*s.store;
    let elsewhere = url.replace("/jobs", "/admin");
    let tasks = [
        ("other-path", serde_json::json!({ "type": "http", "url": elsewhere })),
        ("dot-dot", serde_json::json!({ "type": "http", "url": format!("{url}/../admin") })),
        ("metadata", serde_json::json!({ "type": "http", "url": "http://169.254.169.254/latest" })),
        ("secret", serde_json::json!({ "type": "http", "url": url, "secret": "someone-elses" })),
    ];
    let app = submit(store, "sneaky", &tasks).await;
    for (task, _) in &tasks {
        until(task, async || state(store, &app, task).await == TaskState::Failed).await;
    }
    for (task, code) in [
        ("other-path", "url_not_allowed"),
        ("dot-dot", "url_not_allowed"),
        ("metadata", "url_not_allowed"),
        ("secret", "secret_not_allowed"),
    ] {
        let run = store.run(app.clone(), TaskId::new(task).unwrap()).await.unwrap().unwrap();
        let error = run
            .events
            .iter()
            .rev()
            .find_map(|e| e.error.as_ref())
            .unwrap_or_else(|| panic!("{task}: {:?}", run.events));
        assert_eq!(error.code, code, "{task}: {error:?}");
    }
    assert_eq!(service.created.load(Ordering::SeqCst), 0, "the service was never called");
    s.stop.send_replace(true);
}
