//! Every route of a real daemon with `[auth]`, on the embedded store and on Redis (through the
//! daemon that does not schedule), called with no token, as a reader, as the other team, as the
//! team that owns the resources named, and as an admin: each is refused or served as the
//! permission it declares says, and a refusal names what is missing.

use std::sync::Arc;
use std::time::Duration;

use allot_core::access::{Kind, Permission};
use allot_server::access::{Need, Target};
use allot_store_redis::testing::RedisServer;
use reqwest::Method;
use serde_json::{json, Value};

use crate::support::{api_call, data_dir, eventually, tokens, Daemon};

/// The README's two teams (team a and team b), a reader and an admin.
struct Callers {
    admin: String,
    reader: String,
    team_a: String,
    team_b: String,
    entries: String,
}

impl Callers {
    fn new() -> Callers {
        let people: [(&str, &[&str]); 4] =
            [("ops", &[]), ("auditor", &[]), ("etl-bot", &["team-a"]), ("ml-bot", &["team-b"])];
        let (made, entries) = tokens(&people);
        let [admin, reader, team_a, team_b] = <[String; 4]>::try_from(made).expect("four tokens");
        Callers { admin, reader, team_a, team_b, entries }
    }

    fn config(&self, store: Option<&str>) -> String {
        let store = store.map(|url| format!("store = \"{url}\"\n")).unwrap_or_default();
        format!(
            "{store}[quotas]\n\"team-a:db\" = 5\n\"team-b:db\" = 5\n[pools]\nteam-a-p = \"cpu=4\"\nteam-b-p = \"cpu=4\"\n\
             [queues.\"root.team-a\"]\n[queues.\"root.team-b\"]\n\
             [auth]\n{}\n\
             [auth.roles.a]\nuse = [\"namespace:team-a:*\", \"pool:team-a-*\", \"queue:root.team-a\"]\nread = [\"pool:*\"]\n\
             [auth.roles.b]\nuse = [\"namespace:team-b:*\", \"pool:team-b-*\", \"queue:root.team-b\"]\nread = [\"pool:*\"]\n\
             [[auth.bindings]]\nrole = \"admin\"\nusers = [\"ops\"]\n\
             [[auth.bindings]]\nrole = \"reader\"\nusers = [\"auditor\"]\n\
             [[auth.bindings]]\nrole = \"a\"\ngroups = [\"team-a\"]\n\
             [[auth.bindings]]\nrole = \"b\"\ngroups = [\"team-b\"]\n",
            self.entries
        )
    }
}

async fn call(url: &str, token: Option<&str>, method: &Method, path: &str, body: &str) -> (u16, Value) {
    api_call(url, token, method.clone(), path, (!body.is_empty()).then(|| body.to_owned())).await
}

/// The resources named by a route's path, of team a.
struct Named {
    session: String,
}

impl Named {
    fn fill(&self, path: &str) -> String {
        path.replace("{namespace}", "team-a:db")
            .replace("{pool}", "team-a-p")
            .replace("{queue}", "root.team-a")
            .replace("{app}", "a-app")
            .replace("{token}", "t1")
            .replace("{task}", "t1")
            .replace("{id}", &self.session)
            .replace("{offer}", "0")
            .replace("{alloc}", "0123456789abcdef")
            .replace("{name}", "x")
            .replace("{file}", "app.js")
            .replace("{*page}", "namespaces/team-a:db")
    }
}

/// A body for the route: a submission names team a's queue; others take `{}`.
fn body_of(method: &Method, path: &str) -> String {
    match (method, path) {
        (&Method::POST, "/v1/apps") => json!({"id": "a-more", "queue": "root.team-a"}).to_string(),
        (&Method::PUT | &Method::POST, _) => "{}".to_owned(),
        _ => String::new(),
    }
}

fn refused(status: u16) -> bool {
    status == 401 || status == 403
}

async fn every_route_answers_each_caller_as_its_permission_says(
    url: &str,
    callers: &Callers,
    needs: &allot_server::access::Needs,
) {
    let (admin, reader) = (Some(callers.admin.as_str()), Some(callers.reader.as_str()));
    let (team_a, team_b) = (Some(callers.team_a.as_str()), Some(callers.team_b.as_str()));
    // Team a's application and session, made by team a.
    let app = json!({"id": "a-app", "queue": "root.team-a", "tasks": [{"id": "t1", "resources": "cpu=1"}]});
    let (status, answer) = call(url, team_a, &Method::POST, "/v1/apps", &app.to_string()).await;
    assert_eq!(status, 201, "{answer}");
    let (status, session) = call(url, team_a, &Method::POST, "/v1/sessions", r#"{"ttl_ms": 600000}"#).await;
    assert_eq!(status, 201, "{session}");
    let named = Named { session: session["id"].as_str().unwrap().to_owned() };

    let mut routes: Vec<_> = needs.all().collect();
    // Removals last, the deepest first: the resources the others are called on stay.
    routes.sort_by_key(|(method, path, _)| (**method == Method::DELETE, std::cmp::Reverse(path.len()), *path));
    let mut checked = 0;
    for (method, path, need) in routes {
        let uri = named.fill(path);
        let body = body_of(method, path);
        let Need::Needs(permission, target) = need else { continue };
        checked += 1;
        let what = format!("{method} {path}");
        let (status, answer) = call(url, None, method, &uri, &body).await;
        assert_eq!((status, answer["error"]["code"].as_str()), (401, Some("unauthenticated")), "{what}: {answer}");
        // The reader: only what reading allows.
        let (status, answer) = call(url, reader, method, &uri, &body).await;
        // A session is its opener's: the reader sees none but its own.
        let own_session = path.contains("{id}");
        match permission {
            Permission::Read if !own_session => assert!(!refused(status), "{what} as a reader: {status} {answer}"),
            Permission::Read => assert_eq!(status, 403, "{what} as a reader: {answer}"),
            _ => {
                assert_eq!(status, 403, "{what} as a reader: {answer}");
                let message = answer["error"]["message"].as_str().unwrap();
                assert!(message.contains(&format!("`{permission}`")), "{what}: the refusal names it: {message}");
            }
        }
        // The other team, on team a's resources (a session is its opener's).
        let named_here = matches!(target, Target::Path(_) | Target::AppQueue | Target::Body(_)) || own_session;
        let daemon_wide = matches!(target, Target::Daemon | Target::Some(Kind::Daemon));
        // Both teams read every pool (`read = ["pool:*"]`): that much of team a's, team b sees.
        let pools_read = permission == Permission::Read && target == Target::Path(Kind::Pool);
        if named_here && !daemon_wide && !pools_read {
            let (status, answer) = call(url, team_b, method, &uri, &body).await;
            assert_eq!(status, 403, "{what} by team b on team a's: {answer}");
        }
        // Team a on its own: what `use` allows (pools: reading every pool too).
        if permission != Permission::Admin && !daemon_wide && !matches!(target, Target::Named) {
            let (status, answer) = call(url, team_a, method, &uri, &body).await;
            assert!(!refused(status), "{what} by team a on its own: {status} {answer}");
        } else if permission == Permission::Admin {
            let (status, answer) = call(url, team_a, method, &uri, &body).await;
            assert_eq!(status, 403, "{what} by team a needs admin: {answer}");
        }
        let (status, answer) = call(url, admin, method, &uri, &body).await;
        assert!(!refused(status), "{what} as the admin: {status} {answer}");
    }
    assert!(checked > 40, "{checked} routes checked");
}

/// The permissions of every route, as the daemon's router declares them.
fn needs() -> Arc<allot_server::access::Needs> {
    let dir = tempfile::tempdir().unwrap();
    let store = allot_store::EmbeddedStore::open(&allot_store::EmbeddedConfig::new(dir.path())).unwrap();
    allot_server::route_needs(allot_server::ServerState::new(Arc::new(store)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_embedded_store_every_route_answers_each_caller_as_its_permission_says() {
    let callers = Callers::new();
    let (dir, data) = data_dir();
    let path = dir.path().join("allot.toml");
    std::fs::write(&path, callers.config(None)).unwrap();
    let daemon = Daemon::start(&data, &["--config", path.to_str().unwrap()]);
    every_route_answers_each_caller_as_its_permission_says(&format!("http://{}", daemon.address()), &callers, &needs())
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_every_route_answers_each_caller_as_its_permission_says() {
    let redis = RedisServer::start();
    let callers = Callers::new();
    let (dir, first_data) = data_dir();
    let path = dir.path().join("allot.toml");
    std::fs::write(&path, callers.config(Some(&redis.url()))).unwrap();
    let first = Daemon::start(&first_data, &["--config", path.to_str().unwrap()]);
    let first_url = format!("http://{}", first.address());
    let scheduling =
        eventually(Duration::from_secs(30), async || crate::redis_apps::scheduler(&redis) == first_url).await;
    assert!(scheduling, "the first daemon takes the scheduler's lease");
    let (_second_dir, second_data) = data_dir();
    let second = Daemon::start(&second_data, &["--config", path.to_str().unwrap()]);
    every_route_answers_each_caller_as_its_permission_says(&format!("http://{}", second.address()), &callers, &needs())
        .await;
}
