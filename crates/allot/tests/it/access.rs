//! Identity and access with a real daemon: tokens made by `allot api-token make`, kept in the
//! configuration file as hashes; the CLI and the client with and without them; the rule that a
//! daemon without `[auth]` listens only on loopback.

use std::process::Command;

use crate::support::*;

/// `allot api-token make`: the token, and its `[[auth.tokens]]` entry.
pub(crate) fn make_token(user: &str, groups: &[&str]) -> (String, String) {
    let mut command = Command::new(ALLOT);
    command.args(["api-token", "make", "--user", user]);
    for group in groups {
        command.args(["--group", group]);
    }
    let output = command.output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    let token = text.lines().find_map(|l| l.strip_prefix("token: ")).unwrap().to_owned();
    let entry = text.split_once("# The daemon's configuration file keeps only the hash:\n").unwrap().1.to_owned();
    assert!(!entry.contains(&token), "the entry keeps only the hash: {entry}");
    (token, entry)
}

fn cli(url: &str, token: Option<&str>, args: &[&str]) -> (bool, String, String) {
    let mut command = Command::new(ALLOT);
    command.args(args).env("ALLOT_SERVER", url).env_remove("ALLOT_TOKEN");
    if let Some(token) = token {
        command.env("ALLOT_TOKEN", token);
    }
    let output = command.output().unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn a_daemon_with_auth_serves_only_tokens_it_knows_within_their_roles() {
    let (dir, data) = data_dir();
    let (admin, admin_entry) = make_token("root", &[]);
    let (team, team_entry) = make_token("ada", &["hive"]);
    let config = dir.path().join("allot.toml");
    std::fs::write(
        &config,
        format!(
            "[auth]\nopen_metrics = true\n{admin_entry}\n{team_entry}\n\
             [auth.roles.hive]\nuse = [\"namespace:hive:*\"]\n\
             [[auth.bindings]]\nrole = \"admin\"\nusers = [\"root\"]\n\
             [[auth.bindings]]\nrole = \"hive\"\ngroups = [\"hive\"]\n"
        ),
    )
    .unwrap();
    let daemon = Daemon::start(&data, &["--config", config.to_str().unwrap()]);
    let url = daemon.url.clone();

    // The CLI with ALLOT_TOKEN, without it, and with --token.
    let (ok, _, err) = cli(&url, None, &["quota", "list"]);
    assert!(!ok && err.contains("unauthenticated"), "{err}");
    let (ok, _, err) = cli(&url, Some(&admin), &["quota", "set", "hive:a", "3"]);
    assert!(ok, "{err}");
    let (ok, _, err) = cli(&url, None, &["--token", &admin, "quota", "set", "other", "3"]);
    assert!(ok, "{err}");
    let (ok, out, err) = cli(&url, Some(&team), &["token", "alloc", "hive:a", "job-1"]);
    assert!(ok, "{out} {err}");
    let (ok, _, err) = cli(&url, Some(&team), &["token", "alloc", "other", "job-1"]);
    assert!(!ok && err.contains("forbidden") && err.contains("namespace `other`"), "{err}");
    let (ok, _, err) = cli(&url, Some(&team), &["quota", "set", "hive:a", "9"]);
    assert!(!ok && err.contains("forbidden") && err.contains("`admin`"), "{err}");
    let (ok, out, _) = cli(&url, Some(&team), &["quota", "list", "--quiet"]);
    assert!(ok && out.trim() == "hive:a", "the team sees only its namespaces: {out}");
    // Pages of one: a cursor names only what the caller may read (never `other`, which sorts
    // after `hive:a`), and the pages end.
    for (name, quota) in [("hive:b", "1"), ("gpu:secret", "1"), ("zz-hidden", "1")] {
        assert!(cli(&url, Some(&admin), &["quota", "set", name, quota]).0);
    }
    let http = reqwest::Client::new();
    let (mut seen, mut cursor) = (Vec::new(), None::<String>);
    loop {
        let mut request = http.get(format!("{url}/v1/namespaces")).bearer_auth(&team).query(&[("limit", "1")]);
        if let Some(cursor) = &cursor {
            request = request.query(&[("cursor", cursor)]);
        }
        let page: serde_json::Value = request.send().await.unwrap().json().await.unwrap();
        for namespace in page["namespaces"].as_array().unwrap() {
            seen.push(namespace["name"].as_str().unwrap().to_owned());
        }
        match page["next_cursor"].as_str() {
            Some(next) => {
                for hidden in ["other", "gpu", "zz-hidden"] {
                    assert!(!next.contains(hidden), "a cursor names `{next}`");
                }
                cursor = Some(next.to_owned());
            }
            None => break,
        }
        assert!(seen.len() <= 2, "the pages do not end: {seen:?}");
    }
    assert_eq!(seen, ["hive:a", "hive:b"]);
    let (ok, out, err) = cli(&url, Some(&team), &["whoami", "use:namespace:hive:a", "admin:daemon"]);
    assert!(ok, "{err}");
    assert_eq!(out, "ada (groups hive)\nadmin:daemon: no\nuse:namespace:hive:a: yes\n");
    let (ok, _, err) = cli(&url, Some(&team), &["whoami", "nonsense"]);
    assert!(!ok && err.contains("invalid_argument"), "{err}");

    // The client, over a real socket.
    let client = daemon.client();
    let err = client.namespace("hive:a").await.unwrap_err();
    assert_eq!(err.code(), Some("unauthenticated"), "{err}");
    let err = daemon.client().with_token("allot_not-a-token").namespace("hive:a").await.unwrap_err();
    assert_eq!(err.code(), Some("unauthenticated"), "{err}");
    assert_eq!(daemon.client().with_token(&team).namespace("hive:a").await.unwrap().granted_units, 1);
    // Open routes: health, readiness, and (as configured) the metrics; not the document.
    assert!(client.health().await.is_ok() && client.metrics().await.is_ok());
    assert_eq!(client.openapi().await.unwrap_err().code(), Some("unauthenticated"));
    let log = std::fs::read_to_string(data.with_extension("log")).unwrap();
    for token in [&admin, &team] {
        assert!(!log.contains(token.as_str()), "a token is never logged");
    }
}

#[test]
fn a_daemon_without_auth_listens_only_on_loopback_unless_told() {
    let (dir, data) = data_dir();
    let output =
        Command::new(ALLOT).args(["serve", "--listen", "0.0.0.0:0", "--data-dir"]).arg(&data).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--insecure-no-auth") && stderr.contains("[auth]"), "{stderr}");
    let daemon = Daemon::start_on("0.0.0.0:0", &data, &["--insecure-no-auth"]);
    let port = daemon.address().rsplit_once(':').unwrap().1.to_owned();
    let (ok, _, err) = cli(&format!("http://127.0.0.1:{port}"), None, &["quota", "list"]);
    assert!(ok, "{err}");
    drop(daemon);
    let log = std::fs::read_to_string(data.with_extension("log")).unwrap();
    assert!(log.contains("without authentication"), "a warning at every start: {log}");
    drop(dir);
}

#[tokio::test]
async fn every_change_and_refusal_is_one_audit_line_and_the_file_is_reopened_on_sighup() {
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
    let trail = dir.path().join("audit.jsonl");
    let daemon = Daemon::start(&data, &["--config", config.to_str().unwrap(), "--audit-log", trail.to_str().unwrap()]);
    let (ok, _, err) = cli(&daemon.url, Some(&admin), &["quota", "set", "hive", "2"]);
    assert!(ok, "{err}");
    let (ok, _, _) = cli(&daemon.url, Some(&reader), &["quota", "set", "hive", "5"]);
    assert!(!ok);
    let (ok, _, _) = cli(&daemon.url, None, &["quota", "list"]);
    assert!(!ok);
    let (ok, _, _) = cli(&daemon.url, Some(&reader), &["quota", "list"]);
    assert!(ok, "a read");
    let (ok, _, _) = cli(&daemon.url, Some(&admin), &["token", "alloc", "hive", "job-1"]);
    assert!(ok, "an allocate, through the hot path");
    let read = |path: &std::path::Path| -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
            .collect()
    };
    assert!(
        eventually(std::time::Duration::from_secs(5), async || read(&trail).len() == 4).await,
        "{:?}",
        read(&trail)
    );
    let lines = read(&trail);
    let summary: Vec<(String, String, String, u64)> = lines
        .iter()
        .map(|l| {
            (
                l["principal"].as_str().unwrap_or("-").to_owned(),
                l["action"].as_str().unwrap().to_owned(),
                l["outcome"].as_str().unwrap().to_owned(),
                l["status"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            ("root".into(), "PUT /v1/namespaces/{namespace}".into(), "ok".into(), 201),
            ("auditor".into(), "PUT /v1/namespaces/{namespace}".into(), "refused".into(), 403),
            ("-".into(), "GET /v1/namespaces".into(), "refused".into(), 401),
            ("root".into(), "PUT /v1/namespaces/{namespace}/grants/{token}".into(), "ok".into(), 200),
        ]
    );
    for line in &lines {
        assert!(line["time"].as_str().unwrap().ends_with('Z') && !line["request_id"].as_str().unwrap().is_empty());
        assert!(line["source"].as_str().unwrap().starts_with("127.0.0.1:"), "{line}");
        let text = line.to_string();
        assert!(!text.contains(&admin) && !text.contains(&reader), "no token in the trail: {text}");
    }
    assert_eq!(lines[0]["resource"], "/v1/namespaces/hive");
    let metrics = daemon.client().with_token(&reader).metrics().await.unwrap();
    for series in ["allot_audit_events_total{outcome=\"ok\"} 2", "allot_audit_events_total{outcome=\"refused\"} 2"] {
        assert!(metrics.contains(series), "{series} in {metrics}");
    }

    // Rotation: the file is moved, SIGHUP, and the next line goes to a new file.
    let rotated = dir.path().join("audit.jsonl.1");
    std::fs::rename(&trail, &rotated).unwrap();
    daemon.signal("HUP");
    let daemon_log = data.with_extension("log");
    let reopened = eventually(PATIENCE, async || {
        std::fs::read_to_string(&daemon_log).unwrap_or_default().contains("SIGHUP received")
    });
    assert!(reopened.await, "the daemon never logged the SIGHUP");
    let (ok, _, _) = cli(&daemon.url, Some(&admin), &["quota", "set", "hive", "3"]);
    assert!(ok);
    assert!(eventually(std::time::Duration::from_secs(5), async || read(&trail).len() == 1).await, "a new file");
    assert_eq!(read(&rotated).len(), 4, "the moved file keeps what it had");
}

/// A CA, and certificates it signs, written to `dir` as PEM.
struct Ca {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
    pem: String,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        let pem = cert.pem();
        Ca { cert, key, pem }
    }

    /// A certificate for `names` (or, without, for the common name and organizations given):
    /// its PEM and its key's.
    fn sign(&self, names: &[&str], common_name: &str, organizations: &[&str]) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, common_name);
        for organization in organizations {
            params.distinguished_name.push(rcgen::DnType::OrganizationName, *organization);
        }
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

#[tokio::test]
async fn https_with_client_certificates_and_a_certificate_rotated_without_dropping_connections() {
    let (dir, data) = data_dir();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let (first_ca, second_ca, clients_ca, strangers_ca) =
        (Ca::new("first"), Ca::new("second"), Ca::new("clients"), Ca::new("strangers"));
    let (cert, key) = first_ca.sign(&["127.0.0.1", "localhost"], "allot", &[]);
    let (cert_path, key_path) = (write("cert.pem", &cert), write("key.pem", &key));
    let first_pem = write("first-ca.pem", &first_ca.pem);
    let second_pem = write("second-ca.pem", &second_ca.pem);
    let clients_pem = write("clients-ca.pem", &clients_ca.pem);
    let (ada_cert, ada_key) = clients_ca.sign(&[], "ada", &["hive"]);
    let (ada_cert, ada_key) = (write("ada.pem", &ada_cert), write("ada-key.pem", &ada_key));
    let (eve_cert, eve_key) = strangers_ca.sign(&[], "ada", &["hive"]);
    let (eve_cert, eve_key) = (write("eve.pem", &eve_cert), write("eve-key.pem", &eve_key));
    let (admin, admin_entry) = make_token("root", &[]);
    let config = write(
        "allot.toml",
        &format!(
            "[auth]\n{admin_entry}\n[auth.roles.hive]\nuse = [\"namespace:hive:*\"]\n\
             [[auth.bindings]]\nrole = \"admin\"\nusers = [\"root\"]\n\
             [[auth.bindings]]\nrole = \"hive\"\ngroups = [\"hive\"]\n"
        ),
    );
    let daemon = Daemon::start(
        &data,
        &["--config", &config, "--tls-cert", &cert_path, "--tls-key", &key_path, "--tls-client-ca", &clients_pem],
    );
    assert!(daemon.url.starts_with("https://127.0.0.1:"), "{}", daemon.url);
    let url = daemon.url.clone();
    let tls_cli = |extra: &[&str], token: Option<&str>, args: &[&str]| {
        let all: Vec<&str> = extra.iter().chain(args).copied().collect();
        cli(&url, token, &all)
    };

    // The CA to trust, and a token.
    let (ok, _, err) = tls_cli(&[], Some(&admin), &["quota", "set", "hive:a", "2"]);
    assert!(!ok && err.to_lowercase().contains("certificate"), "without the CA: {err}");
    let (ok, _, err) = tls_cli(&["--ca-cert", &first_pem], Some(&admin), &["quota", "set", "hive:a", "2"]);
    assert!(ok, "{err}");
    // A client certificate names the caller: `ada` of group `hive`.
    let ada = ["--ca-cert", first_pem.as_str(), "--client-cert", ada_cert.as_str(), "--client-key", ada_key.as_str()];
    let (ok, out, err) = tls_cli(&ada, None, &["token", "alloc", "hive:a", "job-1"]);
    assert!(ok, "{out} {err}");
    let (ok, _, err) = tls_cli(&ada, None, &["quota", "set", "hive:a", "9"]);
    assert!(!ok && err.contains("forbidden") && err.contains("user `ada`"), "{err}");
    // One from another CA is answered 401, saying why.
    let eve = ["--ca-cert", first_pem.as_str(), "--client-cert", eve_cert.as_str(), "--client-key", eve_key.as_str()];
    let (ok, _, err) = tls_cli(&eve, None, &["quota", "list"]);
    assert!(!ok && err.contains("unauthenticated") && err.contains("client CA"), "{err}");

    // A client that keeps its connection open across the rotation.
    let tls = allot_client::TlsOptions { ca_cert_pem: Some(first_ca.pem.clone().into_bytes()), identity_pem: None };
    let kept = allot_client::Client::with_tls(&url, &tls).unwrap().with_token(&admin);
    assert_eq!(kept.namespace("hive:a").await.unwrap().quota, 2);
    let (ok, _, _) = tls_cli(&["--ca-cert", &second_pem], Some(&admin), &["quota", "list"]);
    assert!(!ok, "the second CA's certificate is not served yet");
    let (cert, key) = second_ca.sign(&["127.0.0.1", "localhost"], "allot", &[]);
    write("cert.pem", &cert);
    write("key.pem", &key);
    daemon.signal("HUP");
    let rotated = eventually(std::time::Duration::from_secs(5), async || {
        tls_cli(&["--ca-cert", &second_pem], Some(&admin), &["quota", "list"]).0
    })
    .await;
    assert!(rotated, "the new certificate is served after SIGHUP");
    // The open connection was not dropped: it still answers, on the old certificate.
    assert_eq!(kept.namespace("hive:a").await.unwrap().quota, 2);
}

/// Tokens made through the API are kept in the store: on Redis, one made through one daemon is
/// accepted by the other, and one revoked through the other is refused by both within a second.
#[tokio::test]
async fn tokens_made_through_one_daemon_hold_on_every_daemon_of_a_redis_until_revoked() {
    let redis = allot_store_redis::testing::RedisServer::start();
    let (dir, data) = data_dir();
    let (admin, admin_entry) = make_token("root", &[]);
    let config = dir.path().join("allot.toml");
    std::fs::write(
        &config,
        format!("[auth]\n{admin_entry}\n[[auth.bindings]]\nrole = \"admin\"\nusers = [\"root\"]\n"),
    )
    .unwrap();
    let start = |name: &str| {
        let data = data.with_extension(name);
        Daemon::start(&data, &["--store", &redis.url(), "--config", config.to_str().unwrap()])
    };
    let (first, second) = (start("first"), start("second"));
    let (ok, out, err) =
        cli(&first.url, Some(&admin), &["api-token", "create", "ci", "--user", "ci-bot", "--ttl", "1h"]);
    assert!(ok, "{err}");
    let token = out.lines().find_map(|l| l.strip_prefix("token: ")).unwrap().to_owned();
    let (ok, out, _) = cli(&second.url, Some(&admin), &["api-token", "list"]);
    assert!(ok && out.starts_with("ci  user=ci-bot"), "{out}");
    // `ci-bot` holds no role yet: known (403), not unknown (401), on both daemons.
    let accepted = eventually(std::time::Duration::from_secs(3), async || {
        let (_, _, err) = cli(&second.url, Some(&token), &["quota", "set", "ci", "1"]);
        err.contains("forbidden")
    })
    .await;
    assert!(accepted, "the second daemon knows the token");
    let (ok, _, err) =
        cli(&second.url, Some(&admin), &["binding", "set", "ci-admin", "--role", "admin", "--user", "ci-bot"]);
    assert!(ok, "{err}");
    let bound = eventually(std::time::Duration::from_secs(3), async || {
        cli(&first.url, Some(&token), &["quota", "set", "ci", "1"]).0
    })
    .await;
    assert!(bound, "the binding made through the second daemon holds on the first");
    let (ok, _, err) = cli(&second.url, Some(&admin), &["api-token", "revoke", "ci"]);
    assert!(ok, "{err}");
    // Refused on the first daemon too (how soon is a measure, printed, not a condition: the
    // README's "within a second" holds on a quiet machine).
    let revoked_at = std::time::Instant::now();
    let refused = eventually(crate::support::PATIENCE, async || {
        let (ok, _, err) = cli(&first.url, Some(&token), &["quota", "list"]);
        !ok && err.contains("unauthenticated")
    })
    .await;
    assert!(refused, "the token revoked through the second daemon is still taken by the first");
    eprintln!("the revocation reached the other daemon within {:?}", revoked_at.elapsed());
    let (ok, _, err) = cli(&first.url, Some(&admin), &["api-token", "revoke", "ci"]);
    assert!(!ok && err.contains("api_token_not_found"), "{err}");
}

/// The Redis store over TLS (`rediss://`, the server's certificate checked against a CA of our
/// own) as a Redis ACL user with a password; the password never reaches the log.
#[tokio::test]
async fn the_redis_store_over_tls_as_an_acl_user() {
    let (dir, data) = data_dir();
    let ca = Ca::new("redis-ca");
    let (cert, key) = ca.sign(&["127.0.0.1", "localhost"], "redis", &[]);
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let (cert, key, ca_pem) = (write("redis.pem", &cert), write("redis-key.pem", &key), write("ca.pem", &ca.pem));
    let (redis, tls_port) = allot_store_redis::testing::RedisServer::start_tls(&cert, &key);
    redis.cli(&["ACL", "SETUSER", "allot", "on", ">s3cret-pass", "~*", "&*", "+@all"]);
    let store = format!("rediss://allot:s3cret-pass@127.0.0.1:{tls_port}");
    let daemon = Daemon::start(&data, &["--store", &store, "--redis-ca-cert", ca_pem.to_str().unwrap()]);
    let (ok, _, err) = cli(&daemon.url, None, &["quota", "set", "tls", "2"]);
    assert!(ok, "{err}");
    let (ok, out, err) = cli(&daemon.url, None, &["token", "alloc", "tls", "job-1"]);
    assert!(ok, "{out} {err}");
    assert_eq!(redis.cli(&["--user", "allot", "--pass", "s3cret-pass", "EXISTS", "allot:{tls}:meta"]).trim().len(), 1);
    drop(daemon);
    let log = std::fs::read_to_string(data.with_extension("log")).unwrap();
    assert!(!log.contains("s3cret-pass"), "the password is not logged:\n{log}");

    // Without the CA the server's certificate is refused; a wrong password is refused.
    for (store, ca) in
        [(store.clone(), None), (format!("rediss://allot:wrong@127.0.0.1:{tls_port}"), Some(ca_pem.to_str().unwrap()))]
    {
        let (_, data) = data_dir();
        let mut command = Command::new(ALLOT);
        command.args(["serve", "--listen", "127.0.0.1:0", "--store", &store, "--data-dir"]).arg(&data);
        if let Some(ca) = ca {
            command.args(["--redis-ca-cert", ca]);
        }
        let mut child =
            command.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn().unwrap();
        // It keeps retrying: read what it says until it says why, then stop it.
        let said: std::sync::Arc<std::sync::Mutex<String>> = Default::default();
        let reader = {
            let (pipe, said) = (child.stderr.take().unwrap(), said.clone());
            std::thread::spawn(move || {
                for line in std::io::BufRead::lines(std::io::BufReader::new(pipe)).map_while(Result::ok) {
                    said.lock().unwrap().push_str(&(line + "\n"));
                }
            })
        };
        let why = eventually(PATIENCE, async || {
            let said = said.lock().unwrap();
            said.contains("cannot reach Redis") || said.contains("error")
        })
        .await;
        child.kill().unwrap();
        child.wait().unwrap();
        reader.join().unwrap();
        let stderr = said.lock().unwrap().clone();
        assert!(why, "{store}: it never said why it cannot start: {stderr}");
        assert!(!stderr.contains("s3cret-pass") && !stderr.contains("allot:wrong@"), "{stderr}");
    }
}

#[tokio::test]
async fn placement_rules_from_the_file_choose_the_queue_and_app_show_says_which_rule() {
    let (dir, data) = data_dir();
    let (admin, admin_entry) = make_token("root", &[]);
    let (ada, ada_entry) = make_token("ada", &["data", "ops"]);
    let config = dir.path().join("allot.toml");
    std::fs::write(
        &config,
        format!(
            "[queues.\"root.users\"]\ngroup_max_apps = 2\n\
             [[placement_rules]]\nname = \"provided\"\n\
             [[placement_rules]]\nname = \"user\"\ncreate = true\nparent = {{ name = \"fixed\", value = \"root.users\" }}\n\
             [placement_rules.filter]\ngroups = [\"data\"]\n\
             [auth]\n{admin_entry}\n{ada_entry}\n\
             [auth.roles.users]\nuse = [\"queue:root.users\"]\n\
             [[auth.bindings]]\nrole = \"admin\"\nusers = [\"root\"]\n\
             [[auth.bindings]]\nrole = \"users\"\ngroups = [\"data\"]\n"
        ),
    )
    .unwrap();
    let daemon = Daemon::start(&data, &["--config", config.to_str().unwrap()]);
    let url = daemon.url.clone();
    // An application file that names no queue.
    let file = dir.path().join("app.yaml");
    std::fs::write(&file, "id: report\ntasks:\n  - id: t1\n    resources: cpu=1\n").unwrap();
    let (ok, out, err) = cli(&url, Some(&ada), &["app", "submit", file.to_str().unwrap()]);
    assert!(ok, "{out} {err}");
    let (ok, out, err) = cli(&url, Some(&ada), &["app", "show", "report"]);
    assert!(ok, "{err}");
    assert!(out.contains("root.users.ada"), "{out}");
    assert!(out.contains("rule `user (create) under fixed root.users`"), "{out}");
    assert!(out.contains("data,ops"), "the groups it runs with: {out}");
    let (ok, out, _) = cli(&url, Some(&admin), &["queue", "show", "root.users"]);
    assert!(ok && out.contains("group max apps") && out.contains('2'), "{out}");
    // The JSON answer carries the rule too.
    let (ok, out, _) = cli(&url, Some(&ada), &["app", "show", "report", "--json"]);
    let shown: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(ok && shown["app"]["queue_rule"] == "user (create) under fixed root.users", "{shown}");
    // A rule in the file that cannot be one: the daemon does not start, and says which.
    std::fs::write(&config, "[[placement_rules]]\nname = \"tag\"\n").unwrap();
    let output = Command::new(ALLOT)
        .args(["serve", "--data-dir", data.to_str().unwrap(), "--config", config.to_str().unwrap()])
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("[[placement_rules]] #1: a `tag` rule needs `value`"),
        "{stderr}"
    );
}

/// Daemons of one Redis that serve HTTPS call each other over HTTPS: a daemon forwards the
/// applications part to the one that schedules, and its executor reports the tasks it ran, both
/// trusting `--peer-ca-cert` (here, the CA that signed every daemon's certificate).
#[tokio::test]
async fn daemons_of_a_redis_that_serve_https_forward_to_each_other_over_https() {
    let redis = allot_store_redis::testing::RedisServer::start();
    let (dir, data) = data_dir();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let ca = Ca::new("daemons");
    let (cert, key) = ca.sign(&["127.0.0.1", "localhost"], "allot", &[]);
    let (cert, key, ca_pem) = (write("cert.pem", &cert), write("key.pem", &key), write("ca.pem", &ca.pem));
    let start = |name: &str, pool: &str| {
        let data = data.with_extension(name);
        let tls = ["--tls-cert", &cert, "--tls-key", &key, "--peer-ca-cert", &ca_pem];
        let (pool_arg, store) = (format!("{pool}=cpu=2"), redis.url());
        let args = [&tls[..], &["--store", &store, "--pool", &pool_arg, "--run-pool", pool]].concat();
        Daemon::start(&data, &args)
    };
    let (first, second) = (start("first", "p1"), start("second", "p2"));
    let tls = allot_client::TlsOptions { ca_cert_pem: Some(ca.pem.clone().into_bytes()), identity_pem: None };
    let clients = [&first, &second].map(|d| allot_client::Client::with_tls(&d.url, &tls).unwrap());
    clients[0].put_queue("root.tls", &Default::default()).await.unwrap();
    // One of the two schedules; the other forwards: both answer, over HTTPS.
    for (i, client) in clients.iter().enumerate() {
        let pool = if i == 0 { "p2" } else { "p1" };
        let app: allot_client::SubmitApp = serde_json::from_value(serde_json::json!({
            "id": format!("tls-{i}"),
            "queue": "root.tls",
            "tasks": [{"id": "t", "resources": "cpu=1", "selector": {}, "spec": {"type": "noop"}}],
        }))
        .unwrap();
        let answer = client.submit_app(&app).await.unwrap_or_else(|err| panic!("through daemon {i}: {err}"));
        assert!(answer.created, "{pool}");
    }
    // Each task runs on whichever daemon runs its pool; the one that does not schedule reports
    // the end over HTTPS.
    for i in 0..2 {
        let done = eventually(std::time::Duration::from_secs(20), async || {
            let tasks = clients[0].tasks(&format!("tls-{i}")).await.unwrap().tasks;
            tasks.iter().all(|t| t.state == "Completed")
        })
        .await;
        let tasks = clients[0].tasks(&format!("tls-{i}")).await.unwrap().tasks;
        assert!(done, "the task of tls-{i} completed: {tasks:?}");
    }
}

#[tokio::test]
async fn the_audit_trail_names_what_was_made_each_refused_item_and_both_request_ids() {
    let (dir, data) = data_dir();
    let (admin, admin_entry) = make_token("root", &[]);
    let (ada, ada_entry) = make_token("ada", &["team-a"]);
    let config = dir.path().join("allot.toml");
    std::fs::write(
        &config,
        format!(
            "[auth]\n{admin_entry}\n{ada_entry}\n[auth.roles.a]\nuse = [\"queue:root.a\", \"namespace:a:*\"]\n\
             [[auth.bindings]]\nrole = \"admin\"\nusers = [\"root\"]\n\
             [[auth.bindings]]\nrole = \"a\"\ngroups = [\"team-a\"]\n"
        ),
    )
    .unwrap();
    let trail = dir.path().join("audit.jsonl");
    let daemon = Daemon::start(&data, &["--config", config.to_str().unwrap(), "--audit-log", trail.to_str().unwrap()]);
    let http = reqwest::Client::new();
    let call = |token: &str, method: reqwest::Method, path: &str, body: serde_json::Value| {
        http.request(method, format!("{}{path}", daemon.url)).bearer_auth(token).json(&body)
    };
    for queue in ["root.a", "root.b"] {
        let answer = call(&admin, reqwest::Method::PUT, &format!("/v1/queues/{queue}"), serde_json::json!({}));
        assert_eq!(answer.send().await.unwrap().status(), 201);
    }
    let app = |id: &str, queue: &str| serde_json::json!({"id": id, "queue": queue, "tasks": [{"id": "t1", "resources": "cpu=1"}]});
    let submitted = call(&admin, reqwest::Method::POST, "/v1/apps", app("a1", "root.a"))
        .header("X-Request-Id", "caller-1")
        .send()
        .await
        .unwrap();
    assert_eq!(submitted.status(), 201);
    assert_eq!(submitted.headers()["x-request-id"], "caller-1", "the caller's id comes back");
    let own = submitted.headers()["allot-request-id"].to_str().unwrap().to_owned();
    assert_eq!(
        call(&admin, reqwest::Method::POST, "/v1/apps", app("b1", "root.b")).send().await.unwrap().status(),
        201
    );
    let session = call(&ada, reqwest::Method::POST, "/v1/sessions", serde_json::json!({"ttl_ms": 60000}));
    let session: serde_json::Value = session.send().await.unwrap().json().await.unwrap();
    let ends = serde_json::json!({"tasks": [
        {"app": "a1", "task": "t1", "outcome": "failed"},
        {"app": "b1", "task": "t1", "outcome": "failed"},
    ]});
    let finished = call(&ada, reqwest::Method::POST, "/v1/tasks/finish", ends).send().await.unwrap();
    assert_eq!(finished.status(), 200);
    let finished: serde_json::Value = finished.json().await.unwrap();
    assert_eq!(finished["tasks"][1]["error"]["code"], "forbidden", "{finished}");
    let made = call(&admin, reqwest::Method::POST, "/v1/api-tokens", serde_json::json!({"name": "bot", "user": "bot"}));
    assert_eq!(made.send().await.unwrap().status(), 201);

    let read = || -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(&trail).unwrap_or_default();
        text.lines().map(|line| serde_json::from_str(line).unwrap()).collect()
    };
    assert!(eventually(std::time::Duration::from_secs(30), async || read().len() == 8).await, "{:?}", read());
    let lines = read();
    let line = |resource: &str| {
        lines.iter().find(|l| l["resource"] == resource).unwrap_or_else(|| panic!("no line for {resource}: {lines:?}"))
    };
    let submitted = line("apps/a1 in queue root.a");
    assert_eq!(
        (submitted["request_id"].as_str(), submitted["caller_request_id"].as_str()),
        (Some(own.as_str()), Some("caller-1"))
    );
    assert!(line("apps/b1 in queue root.b")["caller_request_id"].is_null(), "none given, none written");
    assert_eq!(line(&format!("sessions/{}", session["id"].as_str().unwrap()))["principal"], "ada");
    assert_eq!(line("api-tokens/bot")["outcome"], "ok");
    let refused = line("apps/b1/tasks/t1");
    assert_eq!(
        (refused["outcome"].as_str(), refused["status"].as_u64(), refused["principal"].as_str()),
        (Some("refused"), Some(403), Some("ada"))
    );
    assert_eq!(refused["action"], "POST /v1/tasks/finish");
    let batch = lines.iter().filter(|l| l["action"] == "POST /v1/tasks/finish").count();
    assert_eq!(batch, 2, "the batch's line, and its one refused item's: {lines:?}");
    drop(dir);
}

/// An alloc the scheduler holds leads to its task's run, and only for whoever may read the task's
/// application: a team that may read every pool reads the alloc, not another team's run through
/// it; nor may it change an alloc of a pool it may only read.
#[tokio::test]
async fn the_run_in_an_alloc_is_read_only_by_who_may_read_its_application() {
    let (dir, data) = data_dir();
    let (ada, ada_entry) = make_token("ada", &["team-a"]);
    let (bob, bob_entry) = make_token("bob", &["team-b"]);
    let config = dir.path().join("allot.toml");
    std::fs::write(
        &config,
        format!(
            "[pools]\nshared = \"cpu=2\"\n[queues.\"root.a\"]\n[auth]\n{ada_entry}\n{bob_entry}\n\
             [auth.roles.a]\nuse = [\"queue:root.a\", \"pool:shared\"]\n\
             [auth.roles.b]\nread = [\"pool:*\"]\n\
             [[auth.bindings]]\nrole = \"a\"\ngroups = [\"team-a\"]\n\
             [[auth.bindings]]\nrole = \"b\"\ngroups = [\"team-b\"]\n"
        ),
    )
    .unwrap();
    let daemon = Daemon::start(&data, &["--config", config.to_str().unwrap(), "--run-pool", "shared"]);
    let http = reqwest::Client::new();
    let call = |token: &str, method: reqwest::Method, path: &str, body: Option<serde_json::Value>| {
        let request = http.request(method, format!("{}{path}", daemon.url)).bearer_auth(token);
        match body {
            Some(body) => request.json(&body),
            None => request,
        }
    };
    let app = serde_json::json!({"id": "a1", "queue": "root.a", "tasks": [
        {"id": "t", "resources": "cpu=1", "spec": {"type": "noop", "inputs": {"secret": "a's"}}}]});
    let submitted = call(&ada, reqwest::Method::POST, "/v1/apps", Some(app)).send().await.unwrap();
    assert_eq!(submitted.status(), 201);
    // The task's alloc, once its run succeeded (it ended: the alloc is kept, answered with 410).
    let mut alloc = String::new();
    let ran = eventually(std::time::Duration::from_secs(20), async || {
        let answer = call(&ada, reqwest::Method::GET, "/v1/apps/a1/tasks/t", None).send().await.unwrap();
        let task: serde_json::Value = answer.json().await.unwrap();
        alloc = task["placement"]["alloc"].as_str().unwrap_or_default().to_owned();
        task["state"] == "Completed" && !alloc.is_empty()
    })
    .await;
    assert!(ran, "the task ran");
    let path = format!("/v1/pools/shared/allocs/{alloc}");
    let read = call(&bob, reqwest::Method::GET, &path, None).send().await.unwrap();
    assert!([200, 410].contains(&read.status().as_u16()), "team b may read the pool's allocs: {}", read.status());
    let refused = call(&bob, reqwest::Method::GET, &format!("{path}/run"), None).send().await.unwrap();
    assert_eq!(refused.status(), 403, "not another team's run");
    let body = refused.text().await.unwrap();
    assert!(body.contains("forbidden") && !body.contains("a's"), "{body}");
    let run: serde_json::Value =
        call(&ada, reqwest::Method::GET, &format!("{path}/run"), None).send().await.unwrap().json().await.unwrap();
    assert_eq!(run["outputs"], serde_json::json!({"secret": "a's"}), "{run}");
    let notes = serde_json::json!({"metadata": {"x": 1}});
    let changed = call(&bob, reqwest::Method::PATCH, &path, Some(notes)).send().await.unwrap();
    assert_eq!(changed.status(), 403, "changing an alloc needs `use` on its pool");
}

/// `allot api-token make` takes the CLI's output options, before or after it: `--json` for
/// scripts, `-q` for the token alone. An option naming a daemon is refused: it needs none.
#[test]
fn api_token_make_prints_json_or_the_token_alone() {
    let run = |args: &[&str]| Command::new(ALLOT).args(args).env_remove("ALLOT_SERVER").output().unwrap();
    for args in [
        &["--json", "api-token", "make", "--user", "ann", "--group", "ops"][..],
        &["api-token", "make", "--user", "ann", "--group", "ops", "--json"][..],
    ] {
        let made = run(args);
        assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
        let made: serde_json::Value = serde_json::from_slice(&made.stdout).unwrap();
        let token = made["token"].as_str().unwrap();
        assert_eq!(made["hash"].as_str(), Some(allot_core::access::hash_token(token).as_str()), "{made}");
        assert_eq!((made["name"].as_str(), made["user"].as_str()), (Some("ann"), Some("ann")), "{made}");
        assert_eq!(made["groups"], serde_json::json!(["ops"]), "{made}");
        let config = made["config"].as_str().unwrap();
        assert!(config.starts_with("[[auth.tokens]]\n") && !config.contains(token), "{config}");
        assert!(config.contains(&format!("hash = \"{}\"", made["hash"].as_str().unwrap())), "{config}");
    }
    let quiet = run(&["-q", "api-token", "make", "--user", "ann"]);
    let token = String::from_utf8(quiet.stdout).unwrap();
    assert!(quiet.status.success() && token.lines().count() == 1 && !token.contains(' '), "{token}");
    let elsewhere = run(&["--server", "http://127.0.0.1:1", "api-token", "make", "--user", "ann"]);
    assert_eq!(elsewhere.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&elsewhere.stderr).contains("needs no daemon"));
}
