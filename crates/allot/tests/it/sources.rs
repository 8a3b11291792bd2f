//! The directory source: application files in a watched directory are submitted, removed with
//! their file, taken in again at start (and removed if their file went while the daemon was
//! down); a file that is not an application is skipped, and the daemon goes on.

use std::time::Duration;

use crate::support::{data_dir, eventually, Daemon};

const APP: &str =
    "id: dir-app\nqueue: root.files\ntasks:\n  - id: t1\n    resources: cpu=1\n  - id: t2\n    resources: cpu=1\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn application_files_come_and_go_with_their_applications() {
    let (dir, data) = data_dir();
    let apps = dir.path().join("apps");
    std::fs::create_dir(&apps).unwrap();
    let config = dir.path().join("allot.toml");
    std::fs::write(&config, "[queues.\"root.files\"]\n[pools]\nworker = \"cpu=4\"\n").unwrap();
    let args = ["--config", config.to_str().unwrap(), "--apps-dir", apps.to_str().unwrap()];
    let daemon = Daemon::start(&data, &args);
    let client = daemon.client();

    // A new file submits its application; its tasks are placed.
    std::fs::write(apps.join("one.yaml"), APP).unwrap();
    let placed = eventually(Duration::from_secs(10), async || {
        client.app("dir-app").await.is_ok_and(|app| app.tasks.get("Allocated") == Some(&2))
    })
    .await;
    assert!(placed, "the file's application was submitted and placed");
    let app = client.app("dir-app").await.unwrap();
    assert!(app.tags["allot.source"].ends_with("/one.yaml"), "{:?}", app.tags);

    // A file that is not an application is skipped, and named in the log.
    std::fs::write(apps.join("bad.toml"), "id = \"x\"\nqueue = 7\n").unwrap();
    std::fs::write(apps.join("notes.txt"), "not an application").unwrap();
    let logged = eventually(Duration::from_secs(10), async || {
        std::fs::read_to_string(data.with_extension("log")).unwrap_or_default().contains("bad.toml")
    })
    .await;
    assert!(logged, "the bad file is named in the log");
    assert_eq!(client.apps().await.unwrap().apps.len(), 1);

    // A removed file removes its application, and what it held.
    std::fs::remove_file(apps.join("one.yaml")).unwrap();
    let removed = eventually(Duration::from_secs(10), async || client.app("dir-app").await.is_err()).await;
    assert!(removed, "the application went with its file");
    assert_eq!(client.pool("worker").await.unwrap().allocs, 0);

    // At start the directory is listed again; an application whose file went while the daemon
    // was down is removed.
    std::fs::write(apps.join("two.yml"), APP.replace("dir-app", "dir-app-2")).unwrap();
    assert!(eventually(Duration::from_secs(10), async || client.app("dir-app-2").await.is_ok()).await);
    let address = daemon.address();
    assert!(daemon.terminate().success());
    std::fs::remove_file(apps.join("two.yml")).unwrap();
    std::fs::write(apps.join("three.yaml"), APP.replace("dir-app", "dir-app-3")).unwrap();
    let daemon = Daemon::start_on(&address, &data, &args);
    let client = daemon.client();
    let ids: Vec<String> = client.apps().await.unwrap().apps.into_iter().map(|a| a.id).collect();
    assert_eq!(ids, ["dir-app-3"], "listed at start: the new file's application, not the removed file's");
}
