//! The README's five-minute start, run as written: its daemon (on a free port and a data
//! directory of its own), then its commands, in bash, from the repository's root.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::{Daemon, ALLOT};

/// The repository's root (tests run in `crates/allot`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// The `sh` blocks that follow the five-minute start's marker: the daemon's, then the commands.
fn five_minute_blocks(readme: &str) -> (String, String) {
    let (_, after) = readme.split_once("<!-- five-minute start").expect("the README marks its five-minute start");
    let mut blocks = after.split("```sh\n").skip(1).map(|b| b.split_once("```").expect("a closed block").0.to_owned());
    (blocks.next().expect("the daemon's block"), blocks.next().expect("the commands' block"))
}

#[test]
fn the_five_minute_start_runs_as_written() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let (serve, commands) = five_minute_blocks(&readme);
    // The daemon as the README starts it, where the test can have it.
    let serve = serve.split('#').next().unwrap().trim();
    let args: Vec<&str> =
        serve.strip_prefix("allot serve").expect("the first block starts the daemon").split_whitespace().collect();
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start_in(&root(), "127.0.0.1:0", &dir.path().join("data"), &args);
    let log = std::fs::read_to_string(dir.path().join("data.log")).unwrap();
    assert!(log.contains(&format!("the dashboard: {}/ui", daemon.url)), "{log}");
    // The commands, in bash, with this build's `allot` first on the PATH.
    let bin = Path::new(ALLOT).parent().unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &commands])
        .current_dir(root())
        .env("PATH", path)
        .env("ALLOT_SERVER", &daemon.url)
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the five-minute start failed ({}):\n{stdout}\n{stderr}", out.status);
    assert!(
        stdout.lines().any(|l| l.starts_with("worker ") && l.contains(&daemon.url)),
        "the pool's daemon:\n{stdout}"
    );
    assert!(stdout.contains("granted api:search token job-1 (1 unit"), "{stdout}");
    // The gang waits (the room is not there) before it runs.
    assert!(stdout.lines().any(|l| l.starts_with("state:") && l.ends_with("Reserving")), "{stdout}");
    let gang = daemon.client();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let app = rt.block_on(gang.app("gang")).unwrap();
    assert_eq!(app.state, "Completed", "{stdout}\n{stderr}");
    // The dashboard the daemon names answers.
    let page = rt.block_on(reqwest::get(format!("{}/ui", daemon.url))).unwrap();
    assert!(page.status().is_success());
}
