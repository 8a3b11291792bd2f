//! The shim's binary as a daemon: the lines of a file become applications, those there at start
//! and those added later; a line that is not an application is skipped, and the daemon serves
//! the API as `allot serve` does.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The binary, killed when dropped.
struct Shim(Child);

impl Drop for Shim {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_of_ones_own_turns_the_lines_of_a_file_into_applications() {
    let dir = tempfile::tempdir().unwrap();
    let lines = dir.path().join("jobs.txt");
    std::fs::write(&lines, "# id queue resources\nfirst root.lines cpu=1\n").unwrap();
    let config = dir.path().join("allot.toml");
    std::fs::write(&config, "[queues.\"root.lines\"]\n[pools]\nworker = \"cpu=4\"\n").unwrap();
    let log_path = dir.path().join("daemon.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_line-source"))
        .env("ALLOT_LINES", &lines)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(["--config", config.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("start the shim");
    let stdout = child.stdout.take().unwrap();
    let shim = Shim(child);
    // Its first line says where it listens, as `allot serve`'s does; the rest is read on.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut out = BufReader::new(stdout).lines();
        let _ = tx.send(out.next().and_then(Result::ok));
        for _ in out {}
    });
    let ready = rx.recv_timeout(Duration::from_secs(60)).ok().flatten().unwrap_or_else(|| {
        panic!("the shim did not report its address: {}", std::fs::read_to_string(&log_path).unwrap_or_default())
    });
    let url = ready.strip_prefix("allot listening on ").expect("the ready line").trim().to_owned();
    let client = allot_client::Client::new(&url).unwrap();

    // Taken in at start: there before the daemon served.
    let first = client.app("first").await.unwrap();
    assert_eq!((first.queue.as_str(), first.tasks.values().sum::<u64>()), ("root.lines", 1), "{first:?}");
    // Added later, after a line that is no application.
    let mut text = std::fs::read_to_string(&lines).unwrap();
    text.push_str("not-an-application\nsecond root.lines cpu=2\n");
    std::fs::write(&lines, text).unwrap();
    let placed = allot_host::wait::within(Duration::from_secs(20), async || {
        client.app("second").await.is_ok_and(|app| app.tasks.get("Allocated") == Some(&1))
    })
    .await;
    assert!(placed, "the added line's application was submitted and placed: {:?}", client.app("second").await);
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(log.contains("not `<id> <queue> <resources>`; skipped"), "{log}");
    assert!(log.contains("sources=[\"http\", \"lines\"]"), "the source is named in the log: {log}");
    drop(shim);
}
