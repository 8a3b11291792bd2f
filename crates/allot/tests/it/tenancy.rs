//! Tenancy inside the scheduler, with real daemons and `[auth]`, on the embedded store and on
//! Redis (two daemons, the calls through the one that does not schedule): an accepted
//! application gets only the pools and namespaces its user may use, at its submission and again
//! at every placement as bindings change; only its own user (or a queue admin) ends it.

use std::time::Duration;

use allot_store_redis::testing::RedisServer;
use reqwest::Method;
use serde_json::{json, Value};

use crate::support::{api_call, data_dir, eventually, tokens, Daemon};

/// The callers' tokens, and the daemons' configuration with their entries.
struct Callers {
    root: String,
    alice: String,
    ann: String,
    carol: String,
    entries: String,
}

impl Callers {
    fn new() -> Callers {
        let people: [(&str, &[&str]); 4] =
            [("root", &[]), ("alice", &["team-a"]), ("ann", &["team-a"]), ("carol", &["team-c"])];
        let (made, entries) = tokens(&people);
        let [root, alice, ann, carol] = <[String; 4]>::try_from(made).expect("four tokens");
        Callers { root, alice, ann, carol, entries }
    }

    /// The README's two teams, and carol's team, which may use no pool.
    fn config(&self, store: Option<&str>) -> String {
        let store = store.map(|url| format!("store = \"{url}\"\n")).unwrap_or_default();
        format!(
            "{store}[scheduler]\ncompleting_grace = \"1s\"\n\
             [quotas]\n\"team-a:db\" = 3\n\"team-b:db\" = 3\n\
             [pools]\nteam-a-p = \"cpu=1\"\nteam-b-p = \"cpu=8\"\n\
             [queues.\"root.team-a\"]\n[queues.\"root.team-b\"]\n[queues.\"root.team-c\"]\n\
             [auth]\n{}\n\
             [auth.roles.a]\nuse = [\"namespace:team-a:*\", \"pool:team-a-*\", \"queue:root.team-a\"]\n\
             [auth.roles.b]\nuse = [\"namespace:team-b:*\", \"pool:team-b-*\", \"queue:root.team-b\"]\n\
             [auth.roles.c]\nuse = [\"queue:root.team-c\"]\n\
             [[auth.bindings]]\nrole = \"admin\"\nusers = [\"root\"]\n\
             [[auth.bindings]]\nrole = \"a\"\ngroups = [\"team-a\"]\n\
             [[auth.bindings]]\nrole = \"b\"\ngroups = [\"team-b\"]\n\
             [[auth.bindings]]\nrole = \"c\"\ngroups = [\"team-c\"]\n",
            self.entries
        )
    }
}

async fn call(url: &str, token: &str, method: Method, path: &str, body: Value) -> (u16, Value) {
    let body = (!body.is_null()).then(|| body.to_string());
    api_call(url, Some(token), method, path, body).await
}

/// Waits until task `app/task`, read as root, satisfies `check`; answers it.
async fn task_until(url: &str, root: &str, app: &str, task: &str, check: impl Fn(&Value) -> bool) -> Value {
    let path = format!("/v1/apps/{app}/tasks/{task}");
    let mut last = Value::Null;
    let seen = eventually(Duration::from_secs(30), async || {
        last = call(url, root, Method::GET, &path, Value::Null).await.1;
        check(&last)
    })
    .await;
    assert!(seen, "task {app}/{task} never got there; last: {last}");
    last
}

fn state_is(state: &'static str) -> impl Fn(&Value) -> bool {
    move |task| task["state"] == state
}

fn waits_for(code: &'static str) -> impl Fn(&Value) -> bool {
    move |task| task["state"] == "Pending" && task["waiting"]["code"] == code
}

fn app(id: &str, queue: &str, task: Value) -> Value {
    json!({"id": id, "queue": queue, "tasks": [task]})
}

/// Waits until the daemon that schedules (`scheduling`) holds alice's `use` on team b's
/// namespace as `held` says: a binding changed through any daemon is read by every daemon within
/// a quarter second, and the scheduler places by what its daemon read.
async fn scheduler_reads(scheduling: &str, alice: &str, held: bool) {
    let check = "use:namespace:team-b:db";
    let read = eventually(Duration::from_secs(30), async || {
        let (_, answer) = call(scheduling, alice, Method::GET, &format!("/v1/whoami?can={check}"), Value::Null).await;
        answer["can"][check] == held
    })
    .await;
    assert!(read, "the daemon that schedules never read the binding change");
}

/// Everything the reproduction tried, with `url` the daemon the callers talk to and
/// `scheduling` the one that schedules.
async fn an_application_gets_only_what_its_user_may_use(url: &str, scheduling: &str, callers: &Callers) {
    let (root, alice, ann, carol) = (&callers.root, &callers.alice, &callers.ann, &callers.carol);
    // The reproduction: alice's task names team-b's namespace. Refused at the door, naming it,
    // and nothing is left behind.
    let steal = app(
        "steal",
        "root.team-a",
        json!({"id": "t1", "resources": "cpu=6", "tokens": [{"namespace": "team-b:db", "units": 3}], "spec": {"type": "shell", "command": "id > proof.txt"}}),
    );
    let (status, answer) = call(url, alice, Method::POST, "/v1/apps", steal).await;
    assert_eq!(status, 403, "{answer}");
    assert_eq!(answer["error"]["code"], "forbidden", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("user `alice`") && message.contains("namespace `team-b:db`"), "{message}");
    assert_eq!(call(url, root, Method::GET, "/v1/apps/steal", Value::Null).await.0, 404);
    let (_, namespace) = call(url, root, Method::GET, "/v1/namespaces/team-b:db", Value::Null).await;
    assert_eq!(namespace["granted_units"], 0, "{namespace}");

    // Without the tokens: it is accepted, but only alice's pool is tried (team-b-p has the room).
    let big = app("big", "root.team-a", json!({"id": "t1", "resources": "cpu=6"}));
    assert_eq!(call(url, alice, Method::POST, "/v1/apps", big).await.0, 201);
    let task = task_until(url, root, "big", "t1", waits_for("no_room")).await;
    let why = task["waiting"]["message"].as_str().unwrap();
    assert!(why.contains("`team-a-p`") && !why.contains("team-b-p"), "only alice's pool is considered: {why}");
    // Carol may use no pool at all: her task says so.
    let nowhere = app("nowhere", "root.team-c", json!({"id": "t1", "resources": "cpu=1"}));
    assert_eq!(call(url, carol, Method::POST, "/v1/apps", nowhere).await.0, 201);
    let task = task_until(url, root, "nowhere", "t1", waits_for("forbidden")).await;
    assert_eq!(task["waiting"]["message"], "user `carol` may not use any pool that takes allocs", "{task}");

    // Bindings change after a submission: lent team b's role, alice's waiting task is placed there.
    let lend = json!({"role": "b", "users": ["alice"]});
    assert_eq!(call(url, root, Method::PUT, "/v1/bindings/lend", lend.clone()).await.0, 200);
    let task = task_until(url, root, "big", "t1", state_is("Allocated")).await;
    assert_eq!(task["placement"]["pool"], "team-b-p", "{task}");
    // With the role, a task that takes team b's tokens is accepted; the pools are full for now.
    let fill = app("fill", "root.team-a", json!({"id": "t1", "resources": "cpu=1"}));
    assert_eq!(call(url, alice, Method::POST, "/v1/apps", fill).await.0, 201);
    task_until(url, root, "fill", "t1", state_is("Allocated")).await;
    let borrow = app(
        "borrow",
        "root.team-a",
        json!({"id": "t1", "resources": "cpu=3", "tokens": [{"namespace": "team-b:db", "units": 1}]}),
    );
    assert_eq!(call(url, alice, Method::POST, "/v1/apps", borrow).await.0, 201);
    task_until(url, root, "borrow", "t1", waits_for("no_room")).await;
    // The role is taken back, then room is made: the task waits, and says why.
    assert_eq!(call(url, root, Method::DELETE, "/v1/bindings/lend", Value::Null).await.0, 200);
    scheduler_reads(scheduling, alice, false).await;
    assert_eq!(call(url, alice, Method::POST, "/v1/apps/big/complete", Value::Null).await.0, 200);
    let task = task_until(url, root, "borrow", "t1", waits_for("forbidden")).await;
    assert_eq!(task["waiting"]["message"], "user `alice` may not use namespace `team-b:db`", "{task}");
    let (_, namespace) = call(url, root, Method::GET, "/v1/namespaces/team-b:db", Value::Null).await;
    assert_eq!(namespace["granted_units"], 0, "{namespace}");
    // Lent again: placed.
    assert_eq!(call(url, root, Method::PUT, "/v1/bindings/lend", lend).await.0, 200);
    let task = task_until(url, root, "borrow", "t1", state_is("Allocated")).await;
    assert_eq!(task["placement"]["pool"], "team-b-p", "{task}");

    // Who may end an application: ann, of the same team, may not end alice's; alice may.
    let (status, answer) = call(url, ann, Method::POST, "/v1/apps/fill/fail", json!({})).await;
    assert_eq!(status, 403, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("user `ann` may not end application `fill` of user `alice`"), "{message}");
    assert!(message.contains("`admin` on queue `root.team-a`"), "{message}");
    assert_eq!(call(url, ann, Method::DELETE, "/v1/apps/fill/tasks/t1", Value::Null).await.0, 403);
    let task = json!({"id": "t2", "resources": "cpu=1"});
    assert_eq!(call(url, ann, Method::POST, "/v1/apps/fill/tasks", task).await.0, 403, "a task would run as alice");
    assert_eq!(call(url, alice, Method::POST, "/v1/apps/fill/fail", json!({})).await.0, 200);
    assert_eq!(call(url, root, Method::DELETE, "/v1/apps/borrow", Value::Null).await.0, 200, "an admin may");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_embedded_store_an_application_gets_only_what_its_user_may_use() {
    let (dir, data) = data_dir();
    let path = dir.path().join("allot.toml");
    let callers = Callers::new();
    std::fs::write(&path, callers.config(None)).unwrap();
    let daemon = Daemon::start(&data, &["--config", path.to_str().unwrap()]);
    let url = format!("http://{}", daemon.address());
    an_application_gets_only_what_its_user_may_use(&url, &url, &callers).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_an_application_gets_only_what_its_user_may_use_through_the_daemon_that_schedules() {
    let redis = RedisServer::start();
    let (dir, first_data) = data_dir();
    let path = dir.path().join("allot.toml");
    let callers = Callers::new();
    std::fs::write(&path, callers.config(Some(&redis.url()))).unwrap();
    let first = Daemon::start(&first_data, &["--config", path.to_str().unwrap()]);
    let first_url = format!("http://{}", first.address());
    let scheduling =
        eventually(Duration::from_secs(30), async || crate::redis_apps::scheduler(&redis) == first_url).await;
    assert!(scheduling, "the first daemon takes the scheduler's lease");
    let (_second_dir, second_data) = data_dir();
    let second = Daemon::start(&second_data, &["--config", path.to_str().unwrap()]);
    // Every call through the daemon that does not schedule: forwarded with the caller's token.
    an_application_gets_only_what_its_user_may_use(&format!("http://{}", second.address()), &first_url, &callers).await;
}

/// The config of a daemon with `[auth]` (root its admin) that runs pools `web` (noop only) and
/// `sh` (every type), with `shell` as `extra` says.
fn runner_config(callers: &Callers, shell: &str) -> String {
    format!(
        "run_pools = [\"web\", \"sh\"]\n[scheduler]\ncompleting_grace = \"1s\"\n\
         [pools.web]\ncapacity = \"cpu=2\"\nplugins = [\"noop\"]\n[pools.sh]\ncapacity = \"cpu=8\"\n\
         [queues.\"root.jobs\"]\n{shell}\n[auth]\n{}\n[[auth.bindings]]\nrole = \"admin\"\nusers = [\"root\"]\n",
        callers.entries
    )
}

/// The run of `app/t1` once it has ended (Succeeded or Failed).
async fn ended_run(url: &str, root: &str, app: &str) -> Value {
    let mut last = Value::Null;
    let ended = eventually(Duration::from_secs(60), async || {
        last = call(url, root, Method::GET, &format!("/v1/apps/{app}/tasks/t1/run"), Value::Null).await.1;
        last["stage"] == "ended"
    })
    .await;
    assert!(ended, "{app}/t1 never ended: {last}");
    last
}

/// Waits until the log of the daemon of `data` has `line`.
async fn says(data: &std::path::Path, line: &str) {
    let log = || std::fs::read_to_string(data.with_extension("log")).unwrap_or_default();
    let said = eventually(Duration::from_secs(30), async || log().contains(line)).await;
    assert!(said, "the daemon never said `{line}`: {}", log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_runs_only_the_task_types_it_lists_and_shell_commands_run_as_the_configured_user() {
    let callers = Callers::new();
    let (dir, data) = data_dir();
    let path = dir.path().join("allot.toml");
    let root_daemon = allot_exec::builtin::daemon_uid() == 0;
    std::fs::write(&path, runner_config(&callers, "[plugins.shell]\nrun_as = \"nobody\"\n")).unwrap();
    if !root_daemon {
        // Only a daemon that runs as root can run commands as another user: it says so.
        let output = std::process::Command::new(crate::support::ALLOT)
            .args(["serve", "--listen", "127.0.0.1:0", "--config", path.to_str().unwrap(), "--data-dir"])
            .arg(&data)
            .output()
            .unwrap();
        assert!(String::from_utf8_lossy(&output.stderr).contains("only a daemon running as root"), "{output:?}");
        return;
    }
    // The user runs in its attempt directory, which the data directory must let it reach.
    std::fs::create_dir_all(&data).unwrap();
    for dir in [dir.path(), data.as_path()] {
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let daemon = Daemon::start(&data, &["--config", path.to_str().unwrap()]);
    let url = format!("http://{}", daemon.address());
    says(&data, "shell tasks run as user `nobody`").await;
    let root = &callers.root;
    let (_, pool) = call(&url, root, Method::GET, "/v1/pools/web", Value::Null).await;
    assert_eq!((pool["plugins"].clone(), pool["labels"].clone()), (json!(["noop"]), json!({})), "{pool}");
    // A noop task fits `web` best; a shell task goes to `sh`, the only pool that runs it.
    let shell = json!({"id": "t1", "resources": "cpu=1", "spec": {"type": "shell", "command": "echo \"{\\\"uid\\\": $(id -u)}\" > \"$ALLOT_OUTPUTS\""}});
    let noop = json!({"id": "t1", "resources": "cpu=1", "spec": {"type": "noop"}});
    assert_eq!(call(&url, root, Method::POST, "/v1/apps", app("quiet", "root.jobs", noop)).await.0, 201);
    assert_eq!(call(&url, root, Method::POST, "/v1/apps", app("script", "root.jobs", shell)).await.0, 201);
    let run = ended_run(&url, root, "script").await;
    assert_eq!(run["phase"], "Success", "{run}");
    let nobody = allot_exec::builtin::RunAs::named("nobody").unwrap();
    assert_eq!(run["outputs"]["uid"], nobody.uid, "the command ran as `nobody`: {run}");
    let (_, placed) = call(&url, root, Method::GET, "/v1/apps/script/tasks/t1", Value::Null).await;
    assert_eq!(placed["placement"]["pool"], "sh", "{placed}");
    let (_, placed) = call(&url, root, Method::GET, "/v1/apps/quiet/tasks/t1", Value::Null).await;
    assert_eq!(placed["placement"]["pool"], "web", "{placed}");
    // The list changes through the API: `sh` runs only `http` now; a shell task waits and says why.
    let limit = json!({"capacity": "cpu=8", "plugins": ["http"]});
    assert_eq!(call(&url, root, Method::PUT, "/v1/pools/sh", limit).await.0, 200);
    let shell = json!({"id": "t1", "resources": "cpu=1", "spec": {"type": "shell", "command": "true"}});
    assert_eq!(call(&url, root, Method::POST, "/v1/apps", app("stranded", "root.jobs", shell)).await.0, 201);
    let task = task_until(&url, root, "stranded", "t1", waits_for("type_not_run")).await;
    assert!(task["waiting"]["message"].as_str().unwrap().contains("tasks of type `shell`"), "{task}");
    // A label allot keeps is refused, and changes nothing.
    let bad = json!({"capacity": "cpu=1", "labels": {"allot/plugins": "shell"}});
    let (status, answer) = call(&url, root, Method::PUT, "/v1/pools/sh", bad).await;
    assert_eq!((status, answer["error"]["code"].as_str()), (400, Some("invalid_argument")), "{answer}");
    let (_, pool) = call(&url, root, Method::GET, "/v1/pools/sh", Value::Null).await;
    assert_eq!((pool["capacity"].as_str(), pool["plugins"].clone()), (Some("cpu=8"), json!(["http"])), "{pool}");
    // Every type again: placed.
    let every = json!({"capacity": "cpu=8", "plugins": ["*"]});
    assert_eq!(call(&url, root, Method::PUT, "/v1/pools/sh", every).await.0, 200);
    task_until(&url, root, "stranded", "t1", |t| t["placement"]["pool"] == "sh").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_a_shell_command_is_not_run_as_root_unless_the_file_allows_it() {
    let callers = Callers::new();
    let root_daemon = allot_exec::builtin::daemon_uid() == 0;
    for (allow, app_id) in [(false, "refused"), (true, "allowed")] {
        let (dir, data) = data_dir();
        let path = dir.path().join("allot.toml");
        let shell = if allow { "[plugins.shell]\nallow_root = true\n" } else { "" };
        std::fs::write(&path, runner_config(&callers, shell)).unwrap();
        let daemon = Daemon::start(&data, &["--config", path.to_str().unwrap()]);
        let url = format!("http://{}", daemon.address());
        let task = json!({"id": "t1", "resources": "cpu=1", "spec": {"type": "shell", "command": "id -u"}});
        assert_eq!(call(&url, &callers.root, Method::POST, "/v1/apps", app(app_id, "root.jobs", task)).await.0, 201);
        let run = ended_run(&url, &callers.root, app_id).await;
        if root_daemon && !allow {
            assert_eq!(run["phase"], "PermanentFailure", "{run}");
            assert!(run.to_string().contains("refused_as_root"), "{run}");
            says(&data, "shell tasks are refused: they would run as root").await;
        } else {
            assert_eq!(run["phase"], "Success", "{run}");
            says(&data, "shell tasks run as the daemon's own user").await;
        }
    }
}

/// A binding removed through `change_at` ends carol's waiting allocate and watch, open at `open_at`.
async fn a_removed_binding_ends_open_calls(open_at: &str, change_at: &str, callers: &Callers) {
    let (root, carol) = (&callers.root, &callers.carol);
    let full = json!({"units": 3});
    assert_eq!(call(change_at, root, Method::PUT, "/v1/namespaces/team-b:db/grants/full", full).await.0, 200);
    let lend = json!({"role": "b", "users": ["carol"]});
    assert_eq!(call(change_at, root, Method::PUT, "/v1/bindings/lend-carol", lend).await.0, 200);
    // Open once the daemon carol calls has read the binding.
    let allowed = eventually(Duration::from_secs(30), async || {
        let check = "/v1/whoami?can=use:namespace:team-b:db";
        call(open_at, carol, Method::GET, check, Value::Null).await.1["can"]["use:namespace:team-b:db"] == true
    })
    .await;
    assert!(allowed);
    let waiting = {
        let (url, token) = (open_at.to_owned(), carol.clone());
        tokio::spawn(async move {
            let path = "/v1/namespaces/team-b:db/grants/carol-1";
            call(&url, &token, Method::PUT, path, json!({"wait_ms": 300_000})).await
        })
    };
    let watch = reqwest::Client::new()
        .get(format!("{open_at}/v1/watch?prefix=namespaces/team-b:db"))
        .bearer_auth(carol)
        .send()
        .await
        .unwrap();
    assert_eq!(watch.status(), 200);
    let watching = tokio::spawn(async move { watch.bytes().await.is_ok() });
    let queued = eventually(Duration::from_secs(30), async || {
        let (_, list) = call(change_at, root, Method::GET, "/v1/namespaces/team-b:db/waiters", Value::Null).await;
        list["waiters"].as_array().is_some_and(|w| w.len() == 1)
    })
    .await;
    assert!(queued, "carol's allocate waits");
    assert_eq!(call(change_at, root, Method::DELETE, "/v1/bindings/lend-carol", Value::Null).await.0, 200);
    let (status, answer) = tokio::time::timeout(Duration::from_secs(30), waiting).await.unwrap().unwrap();
    assert_eq!(status, 403, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("access was withdrawn"), "{answer}");
    assert!(tokio::time::timeout(Duration::from_secs(30), watching).await.unwrap().unwrap(), "the watch ended");
    let (_, namespace) = call(change_at, root, Method::GET, "/v1/namespaces/team-b:db", Value::Null).await;
    assert_eq!(namespace["granted_units"], 3, "nothing granted to carol: {namespace}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_binding_ends_open_calls_on_both_stores() {
    let callers = Callers::new();
    let (dir, data) = data_dir();
    let path = dir.path().join("allot.toml");
    std::fs::write(&path, callers.config(None)).unwrap();
    let daemon = Daemon::start(&data, &["--config", path.to_str().unwrap()]);
    let url = format!("http://{}", daemon.address());
    a_removed_binding_ends_open_calls(&url, &url, &callers).await;

    // On Redis: open on one daemon, the binding removed through another.
    let redis = RedisServer::start();
    let (redis_dir, first_data) = data_dir();
    let path = redis_dir.path().join("allot.toml");
    std::fs::write(&path, callers.config(Some(&redis.url()))).unwrap();
    let first = Daemon::start(&first_data, &["--config", path.to_str().unwrap()]);
    let (_second_dir, second_data) = data_dir();
    let second = Daemon::start(&second_data, &["--config", path.to_str().unwrap()]);
    let (first_url, second_url) = (format!("http://{}", first.address()), format!("http://{}", second.address()));
    a_removed_binding_ends_open_calls(&first_url, &second_url, &callers).await;
}
