//! `allot snapshot`: saved from a daemon while clients change its store, checked, restored into a
//! new data directory and served again.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use allot_client::{Allocate, Client};

use crate::access::make_token;
use crate::support::{api_call, data_dir, Daemon, ALLOT};

fn cli(args: &[&str], server: Option<&str>, token: Option<&str>) -> Output {
    let mut command = Command::new(ALLOT);
    command.args(args).env_remove("ALLOT_SERVER").env_remove("ALLOT_TOKEN");
    if let Some(server) = server {
        command.env("ALLOT_SERVER", server);
    }
    if let Some(token) = token {
        command.env("ALLOT_TOKEN", token);
    }
    command.output().unwrap()
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// Every grant of `namespace`: token -> fencing number.
async fn grants(client: &Client, namespace: &str) -> BTreeMap<String, u64> {
    client.grants(namespace).await.unwrap().grants.into_iter().map(|g| (g.token, g.fencing)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_taken_under_writes_restores_every_change_acknowledged_before_it_and_none_after() {
    save_under_writes_and_restore(None).await;
}

/// The same through a daemon on Redis: the archive, taken while a writer goes on, restores into a
/// data directory with every grant acknowledged before the save and none after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_of_redis_taken_under_writes_restores_every_change_acknowledged_before_it() {
    let redis = allot_store_redis::testing::RedisServer::start();
    save_under_writes_and_restore(Some(&redis.url())).await;
}

/// Saves the store of a daemon (embedded, or on the Redis at `redis`) while a writer allocates
/// without pause, restores the archive into a new data directory and compares every grant the
/// writer saw acknowledged.
async fn save_under_writes_and_restore(redis: Option<&str>) {
    let (dir, data) = data_dir();
    let store_args: Vec<String> = redis.map(|url| vec!["--store".to_owned(), url.to_owned()]).unwrap_or_default();
    let daemon = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = store_args.iter().map(String::as_str).collect();
        Daemon::start(&data, &args)
    })
    .await
    .unwrap();
    let client = daemon.client();
    if redis.is_some() {
        // A daemon on Redis takes snapshots once it schedules: wait for that before timing one.
        save(&daemon.url, &dir.path().join("warm-up.snapshot")).await;
    }
    client.put_namespace("hive", 1_000_000).await.unwrap();
    client.put_pool("gpu", "cpu=8,mem=16Gi").await.unwrap();
    let session = client.open_session(600_000).await.unwrap();
    let leased = Allocate { ttl_ms: Some(600_000), ..Allocate::default() };
    client.allocate("hive", "leased", &leased).await.unwrap();
    let in_session = Allocate { session: Some(session.id.clone()), ..Allocate::default() };
    client.allocate("hive", "in-session", &in_session).await.unwrap();

    // A writer allocates without pause, and releases every third grant two calls later; each
    // grant acknowledged is noted with its fencing number, in order, and whether the save had
    // started (or ended) when it was asked; each release too.
    let (save_started, save_ended) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let acknowledged = Arc::new(Mutex::new(Vec::<(String, u64, bool, bool)>::new()));
    let released = Arc::new(Mutex::new(Vec::<(String, bool, bool)>::new()));
    let writer = {
        let (client, started, ended, acknowledged, released) =
            (daemon.client(), save_started.clone(), save_ended.clone(), acknowledged.clone(), released.clone());
        tokio::spawn(async move {
            let mut i = 0u64;
            // Goes on until a few grants were acknowledged after the save ended.
            loop {
                let (before, after) = (started.load(Ordering::SeqCst), ended.load(Ordering::SeqCst));
                let token = format!("w{i:06}");
                let answer = client.allocate("hive", &token, &Allocate::default()).await.unwrap();
                let fencing = answer.grant.unwrap().fencing;
                acknowledged.lock().unwrap().push((token, fencing, before, after));
                if i >= 2 && i % 3 == 2 {
                    let (before, after) = (started.load(Ordering::SeqCst), ended.load(Ordering::SeqCst));
                    let token = format!("w{:06}", i - 2);
                    client.release("hive", &token, None).await.unwrap();
                    released.lock().unwrap().push((token, before, after));
                }
                i += 1;
                let done_after = acknowledged.lock().unwrap().iter().filter(|a| a.3).count();
                if done_after >= 20 {
                    return;
                }
            }
        })
    };
    // Some writes before the save.
    crate::support::eventually(crate::support::PATIENCE, async || acknowledged.lock().unwrap().len() >= 200).await;
    let archive = dir.path().join("hive.snapshot");
    save_started.store(true, Ordering::SeqCst);
    let saved = {
        let (archive, url) = (archive.clone(), daemon.url.clone());
        tokio::task::spawn_blocking(move || {
            cli(&["snapshot", "save", archive.to_str().unwrap(), "--json"], Some(&url), None)
        })
        .await
        .unwrap()
    };
    save_ended.store(true, Ordering::SeqCst);
    assert!(saved.status.success(), "{}", text(&saved));
    let described: serde_json::Value = serde_json::from_slice(&saved.stdout).unwrap();
    let revision = described["revision"].as_u64().unwrap();
    writer.await.unwrap();
    let original = grants(&client, "hive").await;
    assert!(!dir.path().join("hive.snapshot.partial").exists(), "the partial file is gone");

    // `status` checks it and says what it holds.
    let status = cli(&["snapshot", "status", archive.to_str().unwrap()], None, None);
    assert!(status.status.success(), "{}", text(&status));
    assert!(text(&status).contains(&format!("revision {revision}")), "{}", text(&status));
    assert!(text(&status).contains("pools 1") && text(&status).contains("sessions 1"), "{}", text(&status));
    // The CLI's output options count before the command as after it; a daemon's are refused (the
    // command needs none).
    let path = archive.to_str().unwrap();
    let json = cli(&["--json", "snapshot", "status", path], None, None);
    assert!(json.status.success(), "{}", text(&json));
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(json["revision"].as_u64(), Some(revision), "{json}");
    let quiet = cli(&["-q", "snapshot", "status", path], None, None);
    assert_eq!(String::from_utf8_lossy(&quiet.stdout), format!("{path}\n"), "{}", text(&quiet));
    let elsewhere = cli(&["--server", "http://127.0.0.1:1", "snapshot", "status", path], None, None);
    assert_eq!(elsewhere.status.code(), Some(2), "{}", text(&elsewhere));
    assert!(text(&elsewhere).contains("needs no daemon"), "{}", text(&elsewhere));

    // Restored into a new data directory, and served.
    let restored_dir = dir.path().join("restored");
    let restore = cli(
        &["--json", "snapshot", "restore", archive.to_str().unwrap(), "--data-dir", restored_dir.to_str().unwrap()],
        None,
        None,
    );
    assert!(restore.status.success(), "{}", text(&restore));
    let outcome: serde_json::Value = serde_json::from_slice(&restore.stdout).unwrap();
    let first_revision = outcome["first_revision"].as_u64().unwrap();
    assert!(first_revision > revision, "{outcome}");
    let copy = tokio::task::spawn_blocking(move || Daemon::start(&restored_dir, &[])).await.unwrap();
    let copied = copy.client();
    let restored = grants(&copied, "hive").await;
    let noted = acknowledged.lock().unwrap().clone();
    let releases: HashMap<String, (bool, bool)> =
        released.lock().unwrap().iter().map(|(token, started, ended)| (token.clone(), (*started, *ended))).collect();
    for (token, fencing, save_had_started, _) in &noted {
        match (restored.get(token), releases.get(token)) {
            (Some(_), Some((false, _))) => panic!("{token}, released before the save began, came back"),
            (Some(kept), _) => assert_eq!(kept, fencing, "{token} came back with another fencing number"),
            // Released after the save ended: it was held when the save was taken.
            (None, Some((_, true))) | (None, None) => {
                assert!(*save_had_started, "{token}, acknowledged before the save began, was lost")
            }
            (None, Some(_)) => {}
        }
    }
    assert!(releases.values().any(|(started, _)| !started), "some releases came before the save");
    for (token, _, _, save_had_ended) in &noted {
        assert!(!(*save_had_ended && restored.contains_key(token)), "{token}, acknowledged after the save, is in it");
    }
    assert!(restored.len() < original.len(), "the writes after the save are not in it");
    for token in ["leased", "in-session"] {
        assert_eq!(restored.get(token), original.get(token), "{token}");
    }
    let kept_session = copied.session(&session.id).await.unwrap();
    assert_eq!(kept_session.id, session.id);
    assert_eq!(copied.pool("gpu").await.unwrap().name, "gpu");
    // Fencing numbers go on above every one it held.
    let highest = restored.values().max().copied().unwrap();
    let next = copied.allocate("hive", "after-restore", &Allocate::default()).await.unwrap();
    assert!(next.grant.unwrap().fencing > highest);
    // A watcher of the first daemon, resuming on the restored one, lists again: from before the
    // restored daemon's first revision, or from above its newest (the first daemon went on).
    for since in [revision, first_revision - 1, u64::MAX / 2] {
        let (status, body) =
            api_call(&copy.url, None, reqwest::Method::GET, &format!("/v1/watch?since={since}"), None).await;
        assert_eq!(status, 410, "resume from {since}: {body}");
        assert_eq!(body["error"]["code"], "revision_compacted");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_archive_is_refused_and_only_admins_take_snapshots() {
    let (dir, data) = data_dir();
    let (admin, admin_entry) = make_token("root", &[]);
    let (reader, reader_entry) = make_token("auditor", &[]);
    let config = dir.path().join("allot.toml");
    std::fs::write(
        &config,
        format!(
            "[auth]\n{admin_entry}\n{reader_entry}\n[[auth.bindings]]\nrole = \"admin\"\nusers = [\"root\"]\n\
             [[auth.bindings]]\nrole = \"reader\"\nusers = [\"auditor\"]\n"
        ),
    )
    .unwrap();
    let config_arg = config.to_str().unwrap().to_owned();
    let daemon = tokio::task::spawn_blocking(move || Daemon::start(&data, &["--config", &config_arg])).await.unwrap();
    let archive = dir.path().join("all.snapshot");
    let path = archive.to_str().unwrap().to_owned();
    let url = daemon.url.clone();
    tokio::task::spawn_blocking(move || {
        let set = cli(&["quota", "set", "hive", "3"], Some(&url), Some(&admin));
        assert!(set.status.success(), "{}", text(&set));
        for (token, expected) in [(None, "unauthenticated"), (Some(reader.as_str()), "forbidden")] {
            let refused = cli(&["snapshot", "save", &path], Some(&url), token);
            assert_eq!(refused.status.code(), Some(1), "{}", text(&refused));
            assert!(text(&refused).contains(expected), "{}", text(&refused));
            assert!(!archive.exists(), "a refused save left a file");
        }
        let saved = cli(&["snapshot", "save", &path], Some(&url), Some(&admin));
        assert!(saved.status.success(), "{}", text(&saved));

        let bytes = std::fs::read(&archive).unwrap();
        let damaged = archive.with_extension("damaged");
        let mut altered = bytes.clone();
        let at = altered.len() - 40;
        altered[at] ^= 0x01;
        std::fs::write(&damaged, &altered).unwrap();
        let cut = archive.with_extension("cut");
        std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
        let target = archive.with_extension("restored");
        for (file, expected) in [(&damaged, "checksum does not match"), (&cut, "incomplete")] {
            let status = cli(&["snapshot", "status", file.to_str().unwrap()], None, None);
            assert_eq!(status.status.code(), Some(1), "{}", text(&status));
            assert!(text(&status).contains(expected), "{}", text(&status));
            let restore = cli(
                &["snapshot", "restore", file.to_str().unwrap(), "--data-dir", target.to_str().unwrap()],
                None,
                None,
            );
            assert_eq!(restore.status.code(), Some(1), "{}", text(&restore));
            assert!(text(&restore).contains(expected), "{}", text(&restore));
            assert!(!target.exists(), "a refused restore made {}", target.display());
        }
    })
    .await
    .unwrap();
}

/// The value of a metric at the daemon's `/metrics` (0 if absent).
async fn metric(url: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("{url}/metrics")).await.unwrap().text().await.unwrap();
    text.lines()
        .filter(|line| line.starts_with(name))
        .find_map(|line| line.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_backups_are_written_whole_and_the_oldest_removed() {
    let (dir, data) = data_dir();
    let backups = dir.path().join("backups");
    let config = dir.path().join("allot.toml");
    std::fs::write(&config, format!("[backup]\nevery = \"1s\"\ndir = {:?}\nkeep = 2\n", backups.to_str().unwrap()))
        .unwrap();
    let config_arg = config.to_str().unwrap().to_owned();
    let daemon = tokio::task::spawn_blocking(move || Daemon::start(&data, &["--config", &config_arg])).await.unwrap();
    daemon.client().put_namespace("hive", 3).await.unwrap();
    let url = daemon.url.clone();
    let listed = || -> Vec<PathBuf> {
        let mut names: Vec<PathBuf> = std::fs::read_dir(&backups)
            .map(|entries| entries.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        names.sort();
        names
    };
    let written = crate::support::eventually(crate::support::PATIENCE, async || {
        metric(&url, "allot_backups_total{outcome=\"ok\"}").await >= 3.0
    })
    .await;
    assert!(written, "three backups were never written: {:?}", listed());
    assert!(metric(&url, "allot_backup_last_success_timestamp_seconds").await > 1.7e9);
    let files = listed();
    // The newest two are kept (a third may be on its way).
    let whole: Vec<&PathBuf> = files.iter().filter(|f| f.extension().is_some_and(|e| e == "snapshot")).collect();
    assert!((2..=3).contains(&whole.len()), "{files:?}");
    // The newest, copied before a later backup can remove it, is whole.
    let copy = dir.path().join("newest.snapshot");
    let copied = crate::support::eventually(crate::support::PATIENCE, async || {
        let newest = listed().into_iter().rfind(|f| f.extension().is_some_and(|e| e == "snapshot"));
        newest.is_some_and(|newest| std::fs::copy(newest, &copy).is_ok())
    })
    .await;
    assert!(copied);
    let status = cli(&["snapshot", "status", copy.to_str().unwrap()], None, None);
    assert!(status.status.success() && text(&status).contains("namespaces 1"), "{}", text(&status));
    assert_eq!(metric(&url, "allot_backups_total{outcome=\"failed\"}").await, 0.0);
}

/// Every grant of `namespace`: token -> (fencing number, time left).
async fn leases(client: &Client, namespace: &str) -> BTreeMap<String, (u64, Option<u64>)> {
    let grants = client.grants(namespace).await.unwrap().grants;
    grants.into_iter().map(|g| (g.token, (g.fencing, g.expires_in_ms))).collect()
}

/// Saves the store of the daemon at `url` to `archive` with the CLI; on Redis, waits for a
/// daemon to schedule (which takes it) first.
async fn save(url: &str, archive: &std::path::Path) -> u64 {
    let (url, path) = (url.to_owned(), archive.to_owned());
    let mut last = String::new();
    let saved = crate::support::eventually(crate::support::PATIENCE, async || {
        let (url, path) = (url.clone(), path.clone());
        let output = tokio::task::spawn_blocking(move || {
            cli(&["snapshot", "save", path.to_str().unwrap(), "--json"], Some(&url), None)
        })
        .await
        .unwrap();
        last = text(&output);
        output.status.success()
    })
    .await;
    assert!(saved, "the save never succeeded: {last}");
    let described: serde_json::Value = serde_json::from_str(&last).unwrap();
    described["revision"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_moves_from_the_embedded_store_to_redis_and_back() {
    let (dir, data) = data_dir();
    let embedded = tokio::task::spawn_blocking(move || Daemon::start(&data, &[])).await.unwrap();
    let client = embedded.client();
    client.put_namespace("hive", 100).await.unwrap();
    client.put_pool("gpu", "cpu=8,mem=16Gi").await.unwrap();
    client.allocate("hive", "plain", &Allocate::default()).await.unwrap();
    let leased = Allocate { ttl_ms: Some(3_600_000), ..Allocate::default() };
    client.allocate("hive", "leased", &leased).await.unwrap();
    let session = client.open_session(3_600_000).await.unwrap();
    let in_session = Allocate { session: Some(session.id.clone()), ..Allocate::default() };
    client.allocate("hive", "in-session", &in_session).await.unwrap();
    let first = dir.path().join("first.snapshot");
    let revision = save(&embedded.url, &first).await;
    let before = leases(&client, "hive").await;
    drop(embedded);

    // Into an empty Redis, served by two daemons; a second restore is refused.
    let redis = allot_store_redis::testing::RedisServer::start();
    let url = redis.url();
    let restore = |archive: &std::path::Path, extra: &[&str]| {
        let mut args = vec!["snapshot", "restore", archive.to_str().unwrap(), "--store", url.as_str(), "--json"];
        args.extend_from_slice(extra);
        cli(&args, None, None)
    };
    let restored = restore(&first, &[]);
    assert!(restored.status.success(), "{}", text(&restored));
    let outcome: serde_json::Value = serde_json::from_slice(&restored.stdout).unwrap();
    assert!(outcome["first_revision"].as_u64().unwrap() > revision, "{outcome}");
    let refused = restore(&first, &[]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(text(&refused).contains("already holds allot's state"), "{}", text(&refused));
    let (one_dir, one) = data_dir();
    let (two_dir, two) = data_dir();
    let args = |data: PathBuf| {
        let url = url.clone();
        move || Daemon::start(&data, &["--store", url.as_str()])
    };
    let first_daemon = tokio::task::spawn_blocking(args(one)).await.unwrap();
    let second_daemon = tokio::task::spawn_blocking(args(two)).await.unwrap();
    let on_redis = leases(&second_daemon.client(), "hive").await;
    assert_eq!(on_redis.keys().collect::<Vec<_>>(), before.keys().collect::<Vec<_>>());
    for (token, (fencing, left)) in &on_redis {
        let (fencing_before, left_before) = before[token];
        assert_eq!(*fencing, fencing_before, "{token} kept its fencing number");
        match (left, left_before) {
            (Some(left), Some(before)) => {
                assert!(*left <= before && before - left < 600_000, "{token}: {left} of {before}")
            }
            (left, before) => assert_eq!(*left, before, "{token}"),
        }
    }
    assert_eq!(second_daemon.client().session(&session.id).await.unwrap().id, session.id);
    assert_eq!(first_daemon.client().pool("gpu").await.unwrap().name, "gpu");

    // Taken through either daemon (the one that schedules takes it), into a new data directory.
    let second = dir.path().join("second.snapshot");
    save(&second_daemon.url, &second).await;
    // Not into a Redis that daemons use, even told to replace what it holds.
    let in_use = restore(&first, &["--replace"]);
    assert_eq!(in_use.status.code(), Some(1), "{}", text(&in_use));
    assert!(text(&in_use).contains("is using this Redis"), "{}", text(&in_use));
    let status = cli(&["snapshot", "status", second.to_str().unwrap()], None, None);
    assert!(text(&status).contains("from the redis store"), "{}", text(&status));
    let back_dir = dir.path().join("back");
    let back =
        cli(&["snapshot", "restore", second.to_str().unwrap(), "--data-dir", back_dir.to_str().unwrap()], None, None);
    assert!(back.status.success(), "{}", text(&back));
    drop((first_daemon, second_daemon, one_dir, two_dir));
    // What a restore stopped part way leaves: no daemon serves that Redis until one finishes.
    let raw = redis::Client::open(url.as_str()).unwrap();
    let mut raw = raw.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("SET")
        .arg("allot:{allot-registry}:restoring")
        .arg("x.snapshot")
        .query_async(&mut raw)
        .await
        .unwrap();
    let (_, data) = data_dir();
    let refused = tokio::task::spawn_blocking({
        let url = url.clone();
        move || {
            Command::new(ALLOT)
                .args(["serve", "--listen", "127.0.0.1:0", "--store", url.as_str(), "--data-dir"])
                .arg(&data)
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert!(!refused.status.success());
    assert!(text(&refused).contains("a restore that did not finish (x.snapshot)"), "{}", text(&refused));
    let copy = tokio::task::spawn_blocking(move || Daemon::start(&back_dir, &[])).await.unwrap();
    let copied = leases(&copy.client(), "hive").await;
    let fencing = |grants: &BTreeMap<String, (u64, Option<u64>)>| -> Vec<(String, u64)> {
        grants.iter().map(|(token, (fencing, _))| (token.clone(), *fencing)).collect()
    };
    assert_eq!(fencing(&copied), fencing(&before), "the grants came back with their fencing numbers");
    let highest = copied.values().map(|(fencing, _)| *fencing).max().unwrap();
    let next = copy.client().allocate("hive", "after", &Allocate::default()).await.unwrap();
    assert!(next.grant.unwrap().fencing > highest);
}
