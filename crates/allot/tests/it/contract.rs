//! The API's contract, checked by a generated client: schemathesis reads `/openapi.json` of a
//! real daemon, generates requests that follow the document and requests that break it, and
//! checks every answer against the document (`--checks all`): schema-valid requests accepted,
//! schema-violating ones refused with a 4xx, answers shaped as documented, no 5xx. So the
//! document and the server cannot drift apart.

use std::process::Command;

use crate::support::{data_dir, Daemon};

const INSTALL: &str = "schemathesis (`st`) was not found on PATH. This test runs it against a real daemon: \
                       install it with `pip install schemathesis` (Python 3.9 or newer) and run again";

#[test]
fn schemathesis_finds_no_gap_between_the_document_and_the_server() {
    let st = std::env::var_os("PATH")
        .and_then(|path| std::env::split_paths(&path).map(|dir| dir.join("st")).find(|p| p.is_file()))
        .unwrap_or_else(|| panic!("{INSTALL}"));
    let (dir, data) = data_dir();
    // With access checked, as the document declares (`securitySchemes`): schemathesis calls with
    // an admin's token, and checks that every operation but the open ones refuses a call without
    // it (`ignored_auth`).
    let (token, entry) = crate::access::make_token("root", &[]);
    let config = dir.path().join("allot.toml");
    std::fs::write(
        &config,
        format!("[auth]\nopen_document = true\n{entry}\n[[auth.bindings]]\nrole = \"admin\"\nusers = [\"root\"]\n"),
    )
    .unwrap();
    // Long polls are bounded (and the document says so): a wait schemathesis asks for ends soon.
    let daemon = Daemon::start(&data, &["--max-wait", "1s", "--config", config.to_str().unwrap()]);
    // 410 Gone is a documented answer to a schema-valid request: reading an alloc that has
    // ended (freed, expired) gives its record with 410. schemathesis counts only its default
    // statuses as accepted, so it is named here.
    let config = data.join("schemathesis.toml");
    std::fs::write(
        &config,
        "[checks.positive_data_acceptance]\n\
         expected-statuses = [\"2XX\", \"3XX\", \"401\", \"403\", \"404\", \"409\", \"410\", \"429\", \"5XX\"]\n",
    )
    .unwrap();
    let output = Command::new(st)
        .args(["--config-file", config.to_str().unwrap(), "--no-color", "run"])
        .args([&format!("{}/openapi.json", daemon.url), "--checks", "all"])
        .args(["--header", &format!("Authorization: Bearer {token}")])
        // A watch is a stream that ends only when the daemon does: schemathesis reads an answer to
        // its end, so it would wait there until its timeout and count that as a failure. The route
        // is tested by itself (allot-server's `watch` tests, and `allot watch` in `cli`).
        .args(["--exclude-path", "/v1/watch"])
        // Thirty examples per operation: what sixty found, in half the time (about 90 s alone). One
        // worker: schemathesis on CPython 3.11 can fail inside Python with several threads.
        .args(["--max-examples", "30", "--workers", "1"])
        .env("SCHEMATHESIS_TELEMETRY", "false")
        // Its cache (`.schemathesis/`) goes to the test's temporary directory, not the tree.
        .current_dir(&data)
        .output()
        .expect("run schemathesis");
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "schemathesis found gaps between /openapi.json and the server:\n{report}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
