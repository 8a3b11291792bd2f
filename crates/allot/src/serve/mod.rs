//! `allot serve`: starts the daemon from its resolved configuration (`config`, from the flags of
//! `flags`): logging, the store (embedded by default, or Redis), seeding quotas, pools and queues,
//! the executor of the tasks run here, the sources of applications, and the server until SIGTERM
//! or SIGINT.

mod auth;
mod backup;
mod config;
mod flags;

use std::sync::Arc;

use allot_store::{EmbeddedConfig, EmbeddedStore, Store};
use allot_store_redis::RedisStore;
use anyhow::Context;
use tracing_subscriber::filter::Targets;

pub(crate) use config::SERVE_AFTER_HELP;
use config::{resolve, StoreChoice};
pub(crate) use flags::{no_transparent_huge_pages, worker_threads, ServeArgs};
use flags::{serving_threads, LogFormat};

use crate::sources::{AppManager, DirectorySource, HttpApi, SourceContext, SourceMaker};

/// Logs on stderr, filtered by `RUST_LOG`: a level (`info`, the default) and `target=level`
/// items, comma-separated (e.g. `info,allot_store=debug`).
fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let (filter, bad) = match std::env::var("RUST_LOG") {
        Ok(text) if !text.trim().is_empty() => match text.parse::<Targets>() {
            Ok(filter) => (filter, None),
            Err(err) => (Targets::new().with_default(tracing::Level::INFO), Some(format!("`{text}`: {err}"))),
        },
        _ => (Targets::new().with_default(tracing::Level::INFO), None),
    };
    let ansi = std::io::stderr().is_terminal();
    let registry = tracing_subscriber::registry().with(filter);
    match format {
        LogFormat::Text => {
            registry.with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi)).init()
        }
        LogFormat::Json => registry.with(tracing_subscriber::fmt::layer().json().with_writer(std::io::stderr)).init(),
    }
    if let Some(bad) = bad {
        tracing::warn!("RUST_LOG is not a filter ({bad}); logging at info");
    }
}

/// On every SIGHUP: reopens the audit trail's file (after log rotation moved it) and reads the
/// TLS certificate and key again.
async fn reload_on_hangup(audit: Option<Arc<allot_server::Audit>>, tls: Option<Arc<allot_server::Tls>>) {
    #[cfg(unix)]
    {
        let Ok(mut hangups) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
            tracing::warn!("cannot listen for SIGHUP: the audit trail and the certificate will not be reloaded");
            return;
        };
        while hangups.recv().await.is_some() {
            if let Some(audit) = &audit {
                audit.reopen();
            }
            if let Some(tls) = &tls {
                tls.reload();
            }
            // Logged once done: a line written after it goes to the reopened file.
            tracing::info!(
                "SIGHUP received: the audit trail reopens at its next line, the TLS certificate was read again"
            );
        }
    }
    #[cfg(not(unix))]
    let _ = (audit, tls);
}

/// SIGTERM and SIGINT, listened for from the daemon's first step: a signal that arrives while
/// the daemon starts (after it printed its address, before it serves) ends it cleanly once it
/// serves, instead of killing it with the signal's default action.
struct ShutdownSignal {
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
}

impl ShutdownSignal {
    fn listen() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let listen = |kind: SignalKind, name: &str| match signal(kind) {
                Ok(signal) => Some(signal),
                Err(err) => {
                    tracing::error!(error = %err, "cannot listen for {name}");
                    None
                }
            };
            Self {
                terminate: listen(SignalKind::terminate(), "SIGTERM"),
                interrupt: listen(SignalKind::interrupt(), "SIGINT"),
            }
        }
        #[cfg(not(unix))]
        Self {}
    }

    async fn received(mut self) {
        #[cfg(unix)]
        {
            async fn next(signal: &mut Option<tokio::signal::unix::Signal>) {
                match signal {
                    Some(signal) => {
                        signal.recv().await;
                    }
                    None => std::future::pending().await,
                }
            }
            tokio::select! {
                _ = next(&mut self.interrupt) => tracing::info!("SIGINT received"),
                _ = next(&mut self.terminate) => tracing::info!("SIGTERM received"),
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

pub(crate) async fn run(args: ServeArgs, sources: Vec<SourceMaker>) -> anyhow::Result<()> {
    init_logging(args.log_format);
    let shutdown = ShutdownSignal::listen();
    let mut config = resolve(&args)?;
    match allot_server::raise_open_files_limit() {
        Ok(files) => tracing::debug!(files, "open files allowed"),
        Err(err) => tracing::warn!(error = %err, "cannot raise the open-files limit; it stays as it was"),
    }
    // Listening first: on Redis, the other daemons reach this one at its address if it schedules.
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let address = listener.local_addr()?;
    let tls = match config.tls.clone() {
        Some(files) => Some(Arc::new(allot_server::Tls::load(files).context("cannot set up HTTPS")?)),
        None => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    // The URL the other daemons reach this one at: it names this daemon in the scheduler's lease
    // and in its executor's.
    let advertise = match &args.advertise {
        Some(url) => url.trim_end_matches('/').to_owned(),
        None if address.ip().is_unspecified() => format!("{scheme}://127.0.0.1:{}", address.port()),
        None => format!("{scheme}://{address}"),
    };
    if let Some(auth) = &config.auth {
        // From the scheduler's first cycle: nothing is placed that its user may not use.
        config.sched.tenancy = allot_core::access::Tenancy::Enforced(auth.access.policy());
    }
    // Until the store is open and seeded, every call is answered 503 `starting`.
    let backend = match &config.store {
        StoreChoice::Embedded => "embedded",
        StoreChoice::Redis(_) => "redis",
    };
    let max_connections = config.max_connections.unwrap_or_else(allot_server::default_max_connections);
    let starting = allot_server::starting(listener, tls.clone(), backend, max_connections, config.idle_timeout);
    tracing::info!(%address, backend, "listening; answering 503 `starting` until the store is open");
    let store: Arc<dyn Store> = match &config.store {
        StoreChoice::Embedded => {
            let embedded = EmbeddedConfig::new(config.data_dir.clone())
                .with_durability(config.durability)
                .with_watch(config.watch)
                .with_sched(config.sched.clone());
            // Read on a thread of its own: the runtime goes on answering meanwhile.
            let store = tokio::task::spawn_blocking(move || EmbeddedStore::open(&embedded))
                .await
                .context("opening the store")?
                .with_context(|| format!("cannot open the store in {}", config.data_dir.display()))?;
            store.set_pool_rules(config.pool_rules);
            Arc::new(store)
        }
        StoreChoice::Redis(redis) => {
            // Each daemon would watch its own directory, and only the one that schedules can
            // submit: the source would follow the lease around. Not carried yet.
            anyhow::ensure!(
                config.apps_dir.is_none(),
                "--apps-dir needs the embedded store: on Redis, submit applications through the API \
                 (`allot app submit FILE` to any daemon)"
            );
            let redis = redis.clone().with_watch(config.watch);
            let store = RedisStore::open(&redis).await.context("cannot open the Redis store")?;
            if let Some(what) = store.unfinished_restore().await.context("cannot read the Redis store")? {
                anyhow::bail!(
                    "this Redis holds part of a restore that did not finish ({what}): restore again with \
                     `allot snapshot restore FILE --store URL --replace` before a daemon serves it"
                );
            }
            store.set_pool_rules(config.pool_rules);
            store.set_sched_config(config.sched.clone());
            if args.advertise.is_none() && address.ip().is_unspecified() {
                tracing::warn!(
                    %address,
                    "listening on every interface: give --advertise so that the other daemons reach this one \
                     when it schedules; using 127.0.0.1 meanwhile"
                );
            }
            store.start_scheduling(&advertise);
            Arc::new(store)
        }
    };
    for (name, quota) in &config.quotas {
        let (created, view) =
            seeded(&format!("cannot register quota of `{name}`"), || store.seed_namespace(name.clone(), *quota))
                .await?;
        if created {
            tracing::info!(namespace = %name, quota, "quota registered");
        } else if view.quota != *quota {
            tracing::warn!(
                namespace = %name,
                configured = quota,
                kept = view.quota,
                "the store already has this namespace and keeps its quota; change it with `allot quota set`"
            );
        }
    }
    for (name, capacity) in &config.pools {
        let (created, view) =
            seeded(&format!("cannot register pool `{name}`"), || store.seed_pool(name.clone(), capacity.clone()))
                .await?;
        if created {
            tracing::info!(pool = %name, capacity = %capacity, "pool registered");
        } else if view.capacity != *capacity {
            tracing::warn!(
                pool = %name,
                configured = %capacity,
                kept = %view.capacity,
                "the store already has this pool and keeps its capacity; change it with `allot pool set`"
            );
        }
    }
    for (pool, plugins) in &config.pool_plugins {
        // The file decides what runs on the pool, at every start.
        let mut labels = store.pool(pool.clone()).await.with_context(|| format!("pool `{pool}`"))?.labels;
        labels.insert(allot_core::pools::PLUGINS_LABEL.to_owned(), plugins.join(","));
        store.label_pool(pool.clone(), labels).await.with_context(|| format!("cannot set what pool `{pool}` runs"))?;
        tracing::info!(%pool, plugins = %plugins.join(","), "the pool runs only these task types");
    }
    for (path, limits) in &config.queues {
        match store.seed_queue(path.clone(), limits.clone()).await {
            Ok((true, _)) => tracing::info!(queue = %path, "queue registered"),
            Ok((false, view)) if view.limits != *limits => tracing::warn!(
                queue = %path,
                "the store already has this queue and keeps its limits; change them with `allot queue set`"
            ),
            Ok(_) => {}
            Err(err) => return Err(err).with_context(|| format!("cannot register queue `{path}`")),
        }
    }
    // From here on, connections wait to be accepted by the daemon's server (the line below tells
    // scripts that it serves).
    let listener = starting.ready().await.context("taking the listener back from the start's answers")?;
    tracing::info!(%address, data_dir = %config.data_dir.display(), backend = store.backend(), durability = store.durability(), "allot serving");
    tracing::info!("the dashboard: {advertise}/ui");
    // The one line on stdout: scripts and tests read the address from it.
    println!("allot listening on {scheme}://{address}");
    // Without --max-connections, the state's default, from the open-files limit raised above.
    let mut state = allot_server::ServerState::new(store.clone())
        .with_max_wait(config.max_wait)
        .with_idle_timeout(config.idle_timeout)
        .with_metrics(config.metrics.clone())
        .with_placement(config.placement.clone());
    if let Some(max) = config.max_connections {
        state = state.with_max_connections(max);
    }
    tracing::debug!(max_connections = state.max_connections, "connections allowed open at once");
    let mut daemon_token = None;
    if let Some(auth) = config.auth.take() {
        state = state.with_access(auth.access);
        daemon_token = auth.daemon_token;
    }
    if let Some(sink) = config.audit.clone() {
        let audit = allot_server::Audit::start(sink.clone())
            .with_context(|| format!("cannot open the audit trail {sink:?}"))?;
        state = state.with_audit(audit);
    }
    if let Some(tls) = tls {
        tls.watch_files();
        state = state.with_tls(tls);
    }
    if let Some(roots) = &config.peer_roots {
        state = state.with_peer_roots(roots).context("--peer-ca-cert (or --tls-cert): the certificates to trust")?;
    }
    tokio::spawn(reload_on_hangup(state.audit.clone(), state.tls.clone()));
    let (stop_executor, executor_stopped) = tokio::sync::watch::channel(false);
    if !config.run_pools.is_empty() {
        let executor = start_executor(&store, &config, advertise.clone(), daemon_token.clone()).await?;
        if let Err(err) = executor.take_lease().await {
            tracing::warn!(error = %err, "cannot take the executor's lease yet; it is taken again every second");
        }
        state = state.with_executor(Arc::new(RunsHere(executor.clone())));
        tokio::spawn(executor.run(executor_stopped));
    }
    if let Some(backup) = config.backup.clone() {
        tokio::spawn(backup::run(store.clone(), state.metrics.clone(), backup));
    }
    // The sources of applications: the API, and the directory of application files if one is set.
    // The sources of applications: the API, the directory of application files if one is set,
    // and those of a shim (`main_with_sources`).
    let mut http = HttpApi::new(listener, state, serving_threads(&args));
    let context = SourceContext::new(store.clone(), Arc::new(config.placement.clone()));
    let mut others: Vec<Box<dyn AppManager>> = Vec::new();
    if let Some(dir) = config.apps_dir {
        others.push(Box::new(DirectorySource::new(dir, context.clone())));
    }
    others.extend(sources.into_iter().map(|make| make(context.clone())));
    for source in &mut others {
        let name = source.name();
        source.init().await.with_context(|| format!("the source of applications `{name}`"))?;
    }
    http.init().await?;
    http.start().await?;
    for source in &mut others {
        let name = source.name();
        source.start().await.with_context(|| format!("the source of applications `{name}`"))?;
    }
    let names: Vec<&str> = std::iter::once(http.name()).chain(others.iter().map(|s| s.name())).collect();
    tracing::info!(sources = ?names, "taking applications in");
    let failed = tokio::select! {
        _ = shutdown.received() => None,
        result = http.failed() => Some(result),
    };
    stop_executor.send_replace(true);
    for source in &mut others {
        source.stop().await;
    }
    match failed {
        Some(result) => result.context("server failed"),
        None => {
            http.stop().await;
            Ok(())
        }
    }
}

/// Loads the plugins (a failing one stops the start) and makes the executor of the tasks placed
/// on `pools`.
async fn start_executor(
    store: &Arc<dyn Store>,
    config: &config::Config,
    node: String,
    token: Option<String>,
) -> anyhow::Result<Arc<allot_exec::Executor>> {
    let (pools, data_dir, plugins) = (&config.run_pools, &config.data_dir, &config.plugins);
    let peer_roots = config.peer_roots.clone();
    let (retry, times) = (config.retry, config.executor_times);
    use allot_exec::{builtin, Executor, ExecutorConfig, Registry, Secrets, SetupContext, Waker};

    // Plugins wake their tasks through the executor, which exists once they are loaded: the
    // waker forwards to it.
    let executor: Arc<std::sync::OnceLock<Arc<Executor>>> = Arc::default();
    let forward = {
        let executor = executor.clone();
        Waker::new(move |run| {
            if let Some(executor) = executor.get() {
                executor.wake(run);
            }
        })
    };
    // Whom shell commands run as, or that they are refused (as root, with [auth]).
    let shell = &plugins.builtin.shell;
    match shell.refuse_root && shell.uid() == 0 {
        true => tracing::warn!("{}", shell.describe()),
        false => tracing::info!("{}", shell.describe()),
    }
    let secrets = Secrets::new(plugins.secrets.clone());
    let counters = allot_exec::PluginCounters::default();
    let registry = Registry::load(builtin::configured(&plugins.builtin), &plugins.task_types, |id| {
        SetupContext::new(id, store.clone(), secrets.clone(), forward.clone()).with_counters(counters.clone())
    })
    .await
    .context("cannot load the task plugins")?;
    let mut config = ExecutorConfig::new(pools.iter().cloned().collect(), data_dir.join("tasks"));
    config.secrets = secrets;
    config.counters = counters;
    config.node = node;
    config.retry = retry;
    config.scan = times.scan;
    config.scan_without_feed = times.without_feed;
    config.cache_retention = times.cache_retention;
    config.token = token;
    config.peer_roots = peer_roots;
    let made = Executor::new(store.clone(), Arc::new(registry), config);
    let _ = executor.set(made.clone());
    tracing::info!(pools = ?pools, "running the tasks placed on these pools");
    Ok(made)
}

/// The executor as the HTTP edge sees it (`allot_server::RunsHere`): the server does not depend
/// on the executor; the binary joins them.
struct RunsHere(Arc<allot_exec::Executor>);

impl allot_server::RunsHere for RunsHere {
    fn node(&self) -> &str {
        self.0.node()
    }

    fn wake(&self, app: &allot_core::apps::AppId, task: &allot_core::apps::TaskId) -> bool {
        self.0.wake_driven(&allot_exec::RunKey { app: app.clone(), task: task.clone() })
    }

    fn catalog_scope(
        &self,
        app: &allot_core::apps::AppId,
        task: &allot_core::apps::TaskId,
    ) -> Option<allot_core::catalog::CatalogScope> {
        self.0.catalog_scope(&allot_exec::RunKey { app: app.clone(), task: task.clone() })
    }

    fn task_dir(&self, app: &allot_core::apps::AppId, task: &allot_core::apps::TaskId) -> std::path::PathBuf {
        self.0.task_dir(&allot_exec::RunKey { app: app.clone(), task: task.clone() })
    }

    fn counters(&self) -> allot_server::RunCounters {
        let counts = self.0.stats().counts();
        allot_server::RunCounters {
            active: self.0.active() as u64,
            rounds: counts.rounds,
            succeeded: counts.succeeded,
            failed: counts.failed,
            aborted: counts.aborted,
            retried: counts.retried,
            cache_hits: counts.cache_hits,
            cache_misses: counts.cache_misses,
            held_back: counts.held_back,
            lists: counts.lists,
            feed_cuts: counts.feed_cuts,
            following_feed: counts.following_feed,
            plugins: self.0.plugin_counters().snapshot(),
        }
    }
}

/// How long the daemon's start waits for a store that is not ready yet (a Redis still loading, a
/// shard whose replicas are not attached yet) before it gives up.
const SEED_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// Runs a call of the start's seeding (idempotent: it creates only what does not exist) again
/// while the store answers that it is not ready, for [`SEED_PATIENCE`] at most; `what` names it
/// in the error.
async fn seeded<T, Call, Answer>(what: &str, mut call: Call) -> anyhow::Result<T>
where
    Call: FnMut() -> Answer,
    Answer: std::future::Future<Output = Result<T, allot_store::StoreError>>,
{
    use allot_store::StoreError;
    let started = std::time::Instant::now();
    let mut warned = false;
    loop {
        match call().await {
            Err(
                err @ (StoreError::Unavailable(_) | StoreError::OutcomeUnknown(_) | StoreError::NotEnoughReplicas(_)),
            ) if started.elapsed() < SEED_PATIENCE => {
                if !std::mem::replace(&mut warned, true) {
                    tracing::warn!(error = %err, "{what} yet: the store is not ready; trying again for up to 30 s");
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            other => return other.with_context(|| what.to_owned()),
        }
    }
}
