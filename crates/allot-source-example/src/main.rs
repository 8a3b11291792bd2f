//! A source of applications of one's own, as a YuniKorn shim is: `allot serve` with one more
//! source, which turns the lines of a file into applications. Each line is
//! `<application id> <queue> <resources>` (e.g. `etl-7 root.batch cpu=2,mem=4GiB`): an
//! application with one task, `main`, of those resources (no type: whoever reads its alloc runs
//! it). Lines added later are taken in as the file grows; a line seen before submits nothing new.
//!
//! ```sh
//! ALLOT_LINES=jobs.txt cargo run -p allot-source-example -- serve --pool worker=cpu=8
//! ```
//!
//! It is `allot` in every other way: the same flags, the same API, the same CLI commands.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use allot::{AppManager, SourceContext, SourceMaker};
use async_trait::async_trait;

/// The file named by `ALLOT_LINES`, read every 200 ms.
struct LineSource {
    path: PathBuf,
    context: SourceContext,
    stop: tokio::sync::watch::Sender<bool>,
    reader: Option<tokio::task::JoinHandle<()>>,
}

#[async_trait]
impl AppManager for LineSource {
    fn name(&self) -> &'static str {
        "lines"
    }

    /// The file must exist; what it holds already is taken in before the daemon serves.
    async fn init(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(self.path.is_file(), "ALLOT_LINES: {} is not a file", self.path.display());
        take_in(&self.path, &self.context, &mut BTreeSet::new()).await;
        Ok(())
    }

    async fn start(&mut self) -> anyhow::Result<()> {
        let (path, context, mut stop) = (self.path.clone(), self.context.clone(), self.stop.subscribe());
        self.reader = Some(tokio::spawn(async move {
            let mut seen = BTreeSet::new();
            loop {
                take_in(&path, &context, &mut seen).await;
                tokio::select! {
                    _ = stop.changed() => return,
                    () = tokio::time::sleep(Duration::from_millis(200)) => {}
                }
            }
        }));
        Ok(())
    }

    async fn stop(&mut self) {
        self.stop.send_replace(true);
        if let Some(reader) = self.reader.take() {
            let _ = reader.await;
        }
    }
}

/// Submits the application of every line not seen yet (submitting one again is harmless: the
/// store answers `created: false`).
async fn take_in(path: &PathBuf, context: &SourceContext, seen: &mut BTreeSet<String>) {
    let Ok(text) = tokio::fs::read_to_string(path).await else { return };
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        if !seen.insert(line.to_owned()) {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [id, queue, resources] = fields[..] else {
            tracing::warn!(line, "not `<id> <queue> <resources>`; skipped");
            continue;
        };
        let app = serde_json::json!({"id": id, "queue": queue, "tasks": [{"id": "main", "resources": resources}]});
        let app = match serde_json::from_value(app) {
            Ok(app) => app,
            Err(err) => {
                tracing::warn!(line, error = %err, "skipped");
                continue;
            }
        };
        match context.submit(app).await {
            Ok(answer) => tracing::info!(app = id, created = answer.created, "submitted from a line"),
            Err(err) => tracing::warn!(app = id, code = err.code, error = %err.message, "refused"),
        }
    }
}

fn main() -> ExitCode {
    let path = PathBuf::from(std::env::var_os("ALLOT_LINES").unwrap_or_else(|| "lines.txt".into()));
    let lines: SourceMaker = Box::new(move |context| {
        let stop = tokio::sync::watch::channel(false).0;
        Box::new(LineSource { path, context, stop, reader: None })
    });
    allot::main_with_sources(vec![lines])
}
