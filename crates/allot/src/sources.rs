//! Sources of applications [YuniKorn's `AppManager`, what its shims implement]: each has a name,
//! is initialised (checks its configuration and, like YuniKorn's `Recoverable`, lists what
//! already exists), started and stopped. Two are built in: the HTTP API, and a directory of
//! application files. A source of one's own (a shim over another system's jobs) implements
//! [`AppManager`] and is given to `allot serve` by a binary of its own that calls
//! [`crate::main_with_sources`]: the crate `allot-source-example` turns the lines of a file into
//! applications.
//!
//! Everything a source submits goes to the store (through [`SourceContext::submit`], as the
//! API's `POST /v1/apps` does): a source holds no state the store does not have, so a restart
//! loses nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use allot_core::apps::placement::PlacementRules;
use allot_core::apps::AppId;
use allot_store::{read_all, Store, StoreError};
use anyhow::Context;
use async_trait::async_trait;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A source of applications. The daemon calls [`AppManager::init`] once (a failure stops its
/// start), then [`AppManager::start`], and [`AppManager::stop`] when it shuts down; a source
/// takes applications in between, in tasks of its own, through its [`SourceContext`].
#[async_trait]
pub trait AppManager: Send {
    /// A short name for the logs, e.g. `directory`.
    fn name(&self) -> &'static str;
    /// Checks the configuration and takes in what already exists; fails the daemon's start.
    async fn init(&mut self) -> anyhow::Result<()>;
    /// Starts taking applications in, in the background: returns soon.
    async fn start(&mut self) -> anyhow::Result<()>;
    /// Stops taking applications in, and waits until it has.
    async fn stop(&mut self);
}

/// What a source is given: the daemon's store, and how it submits to it.
#[derive(Clone)]
pub struct SourceContext {
    store: Arc<dyn Store>,
    /// The placement rules, for an application that names no queue.
    rules: Arc<PlacementRules>,
}

impl SourceContext {
    pub(crate) fn new(store: Arc<dyn Store>, rules: Arc<PlacementRules>) -> SourceContext {
        SourceContext { store, rules }
    }

    /// The daemon's store (to read what exists, or remove an application its source dropped).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Submits an application as `POST /v1/apps` does, for a trusted source: any queue may be
    /// used, and the placement rules choose one when it names none. Submitting the same
    /// application again adds its new tasks (what the API answers `created: false`); a change
    /// of its own fields is refused with `app_conflict`.
    pub async fn submit(
        &self,
        app: allot_api::SubmitApp,
    ) -> Result<allot_api::SubmitAppResponse, allot_server::ApiError> {
        allot_server::submit(&*self.store, &self.rules, app).await
    }
}

/// Makes a source once the daemon's store is open ([`crate::main_with_sources`]).
pub type SourceMaker = Box<dyn FnOnce(SourceContext) -> Box<dyn AppManager> + Send>;

/// The HTTP API: `allot_server::run` on a listener, until stopped.
pub(crate) struct HttpApi {
    listener: Option<tokio::net::TcpListener>,
    state: Option<allot_server::ServerState>,
    /// Serving threads of their own (none: connections are served on the daemon's runtime).
    serving_threads: allot_server::ServingThreads,
    stop: watch::Sender<bool>,
    server: Option<JoinHandle<std::io::Result<()>>>,
}

impl HttpApi {
    pub(crate) fn new(
        listener: tokio::net::TcpListener,
        state: allot_server::ServerState,
        serving_threads: allot_server::ServingThreads,
    ) -> HttpApi {
        HttpApi {
            listener: Some(listener),
            state: Some(state),
            serving_threads,
            stop: watch::channel(false).0,
            server: None,
        }
    }

    /// Waits until the server ends by itself (it failed) and answers how.
    pub(crate) async fn failed(&mut self) -> std::io::Result<()> {
        match self.server.as_mut() {
            Some(server) => {
                let result = server.await.unwrap_or_else(|err| Err(std::io::Error::other(err)));
                self.server = None;
                result
            }
            None => std::future::pending().await,
        }
    }
}

#[async_trait]
impl AppManager for HttpApi {
    fn name(&self) -> &'static str {
        "http"
    }

    async fn init(&mut self) -> anyhow::Result<()> {
        Ok(())
    }

    async fn start(&mut self) -> anyhow::Result<()> {
        let (listener, state) = self.listener.take().zip(self.state.take()).context("the API is started once")?;
        let mut stop = self.stop.subscribe();
        let shutdown = async move {
            let _ = stop.wait_for(|stop| *stop).await;
        };
        self.server =
            Some(tokio::spawn(allot_server::run_with_threads(listener, state, shutdown, self.serving_threads)));
        Ok(())
    }

    /// Graceful: no new connections, waiters answered, in-flight requests finished, the store
    /// flushed.
    async fn stop(&mut self) {
        self.stop.send_replace(true);
        if let Some(server) = self.server.take() {
            match server.await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => tracing::error!(error = %err, "the server failed while stopping"),
                Err(err) => tracing::error!(error = %err, "the server task failed"),
            }
        }
    }
}

/// The tag a file's application carries: the file it came from, so that after a restart an
/// application whose file is gone is removed.
pub(crate) const SOURCE_TAG: &str = "allot.source";
/// How often the directory is looked at.
pub(crate) const SCAN_INTERVAL: Duration = Duration::from_secs(1);

/// A directory of application files (`.yaml`, `.yml`, `.toml`): a new file submits its
/// application, a changed one submits it again (new tasks are added; changing the application's
/// own fields is a conflict, logged), a removed one removes its application.
pub(crate) struct DirectorySource {
    dir: PathBuf,
    store: Arc<dyn Store>,
    /// The placement rules, for a file whose application names no queue.
    rules: Arc<PlacementRules>,
    stop: watch::Sender<bool>,
    scanner: Option<JoinHandle<()>>,
    seen: Option<Seen>,
}

/// What the directory held at the last scan: file name -> (modified, size, the application it
/// submitted, if it did).
type Seen = BTreeMap<String, (Option<SystemTime>, u64, Option<AppId>)>;

impl DirectorySource {
    pub(crate) fn new(dir: PathBuf, context: SourceContext) -> DirectorySource {
        let SourceContext { store, rules } = context;
        DirectorySource { dir, store, rules, stop: watch::channel(false).0, scanner: None, seen: None }
    }
}

#[async_trait]
impl AppManager for DirectorySource {
    fn name(&self) -> &'static str {
        "directory"
    }

    /// Lists the directory and submits every application in it; removes the applications of
    /// files that are gone since the daemon last ran.
    async fn init(&mut self) -> anyhow::Result<()> {
        let meta = std::fs::metadata(&self.dir)
            .with_context(|| format!("the applications directory {} cannot be read", self.dir.display()))?;
        anyhow::ensure!(meta.is_dir(), "the applications directory {} is not a directory", self.dir.display());
        let mut seen = Seen::new();
        scan(&self.dir, self.store.as_ref(), &self.rules, &mut seen).await;
        let store = self.store.as_ref();
        let apps = match read_all(|page| store.apps(page)).await {
            Ok(apps) => apps,
            Err(err) => return Err(err).context("cannot list the applications"),
        };
        let tag = source_tag(&self.dir);
        let submitted: Vec<&AppId> = seen.values().filter_map(|(.., app)| app.as_ref()).collect();
        for info in apps {
            let from_here = info.app.spec.tags.get(SOURCE_TAG).is_some_and(|t| t.starts_with(&tag));
            if from_here && !submitted.contains(&&info.app.spec.id) {
                remove(store, &info.app.spec.id, "its file is gone").await;
            }
        }
        tracing::info!(dir = %self.dir.display(), files = seen.len(), "applications directory listed");
        self.seen = Some(seen);
        Ok(())
    }

    async fn start(&mut self) -> anyhow::Result<()> {
        let (dir, store, rules) = (self.dir.clone(), self.store.clone(), self.rules.clone());
        let mut seen = self.seen.take().unwrap_or_default();
        let mut stop = self.stop.subscribe();
        self.scanner = Some(tokio::spawn(async move {
            loop {
                let stopped = tokio::select! {
                    _ = tokio::time::sleep(SCAN_INTERVAL) => false,
                    _ = stop.wait_for(|stop| *stop) => true,
                };
                if stopped {
                    return;
                }
                scan(&dir, store.as_ref(), &rules, &mut seen).await;
            }
        }));
        Ok(())
    }

    async fn stop(&mut self) {
        self.stop.send_replace(true);
        if let Some(scanner) = self.scanner.take() {
            let _ = scanner.await;
        }
    }
}

/// The value of [`SOURCE_TAG`] for the files of `dir`: `directory:<dir>/` then the file name.
fn source_tag(dir: &Path) -> String {
    format!("directory:{}/", dir.display())
}

/// Looks at the directory once: submits new and changed files, removes the applications of
/// files that are gone. A file that cannot be read or is not an application is logged (once per
/// change of the file) and skipped.
async fn scan(dir: &Path, store: &dyn Store, rules: &PlacementRules, seen: &mut Seen) {
    let mut now: BTreeMap<String, (Option<SystemTime>, u64)> = BTreeMap::new();
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            for entry in entries.flatten() {
                let path = entry.path();
                let Some(name) = path.file_name().and_then(|n| n.to_str()).map(str::to_owned) else { continue };
                if name.starts_with('.') || crate::appfile::format_of(&path).is_none() {
                    continue;
                }
                if let Some(meta) = entry.metadata().ok().filter(|m| m.is_file()) {
                    now.insert(name, (meta.modified().ok(), meta.len()));
                }
            }
        }
        Err(err) => {
            tracing::warn!(dir = %dir.display(), error = %err, "cannot read the applications directory");
            return;
        }
    }
    let gone: Vec<String> = seen.keys().filter(|name| !now.contains_key(*name)).cloned().collect();
    for name in gone {
        if let Some((.., Some(app))) = seen.remove(&name) {
            remove(store, &app, &format!("its file {name} was removed")).await;
        }
    }
    for (name, (modified, len)) in now {
        if seen.get(&name).is_some_and(|(m, l, _)| *m == modified && *l == len) {
            continue;
        }
        let app = submit_file(dir, &name, store, rules).await;
        seen.insert(name, (modified, len, app));
    }
}

/// Submits the application of one file; answers its id if the store took it.
async fn submit_file(dir: &Path, name: &str, store: &dyn Store, rules: &PlacementRules) -> Option<AppId> {
    let path = dir.join(name);
    let mut body = match crate::appfile::read_app(&path.to_string_lossy()) {
        Ok(body) => body,
        Err(err) => {
            tracing::warn!(file = %path.display(), error = %err.message, "not an application; skipped");
            return None;
        }
    };
    body.tags.insert(SOURCE_TAG.to_owned(), format!("{}{name}", source_tag(dir)));
    let id = body.id.clone();
    match allot_server::submit(store, rules, body).await {
        Ok(answer) => {
            let verb = if answer.created { "submitted" } else { "submitted again" };
            tracing::info!(file = %path.display(), app = %id, tasks = answer.tasks.len(), "{verb}");
            AppId::new(&id).ok()
        }
        Err(err) => {
            tracing::warn!(file = %path.display(), app = %id, code = err.code, error = %err.message, "refused");
            // An application the store has (a conflicting change) is still this file's.
            let id = AppId::new(&id).ok()?;
            store.app(id.clone()).await.ok().map(|_| id)
        }
    }
}

async fn remove(store: &dyn Store, app: &AppId, why: &str) {
    match store.remove_app(app.clone()).await {
        Ok(_) => tracing::info!(app = %app, "removed: {why}"),
        Err(StoreError::Apps(allot_core::apps::SchedError::AppNotFound(_))) => {}
        Err(err) => tracing::warn!(app = %app, error = %err, "cannot remove the application of a removed file"),
    }
}
