//! Lists and metrics that scale: the CLI follows pages to the end, and `--metrics-namespaces`
//! selects the namespaces that have series of their own.

use std::process::Command;

use crate::support::{data_dir, Daemon, ALLOT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_lists_every_page_and_metrics_keep_to_the_selection() {
    let (_dir, data) = data_dir();
    let daemon =
        tokio::task::spawn_blocking(move || Daemon::start(&data, &["--metrics-namespaces", "team-1*"])).await.unwrap();
    let client = daemon.client();
    // More than one page of the largest size (1000); many at once, so the store group-commits.
    let mut puts = tokio::task::JoinSet::new();
    for i in 0..1_050 {
        let client = client.clone();
        puts.spawn(async move { client.put_namespace(&format!("team-{}:ns-{i:04}", i / 100), 5).await });
    }
    while let Some(put) = puts.join_next().await {
        put.unwrap().unwrap();
    }
    let url = daemon.url.clone();
    let (table, json) = tokio::task::spawn_blocking(move || {
        let run = |args: &[&str]| Command::new(ALLOT).args(args).env("ALLOT_SERVER", &url).output().unwrap();
        (run(&["quota", "list"]), run(&["quota", "list", "--json"]))
    })
    .await
    .unwrap();
    assert!(table.status.success(), "{table:?}");
    let rows = String::from_utf8_lossy(&table.stdout).lines().filter(|line| line.starts_with("team-")).count();
    assert_eq!(rows, 1_050);
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(json["namespaces"].as_array().unwrap().len(), 1_050);

    let metrics = client.metrics().await.unwrap();
    assert!(metrics.contains("allot_quotas_namespaces 1050"), "{metrics}");
    let selected = metrics.lines().filter(|line| line.starts_with("allot_quotas_quota_units{")).count();
    // `team-1*` selects team-1 and team-10 (ns-0100..0199 and ns-1000..1049).
    assert_eq!(selected, 150, "{metrics}");
}
