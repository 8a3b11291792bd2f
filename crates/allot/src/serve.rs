//! `allot serve`: configuration (flags > environment > TOML file > defaults), logging, the store
//! (embedded by default, or Redis), quota seeding, and the server until SIGTERM or SIGINT.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use allot_core::NamespaceName;
use allot_store::{EmbeddedConfig, EmbeddedStore, Store};
use allot_store_redis::{RedisConfig, RedisStore};
use anyhow::{bail, Context};
use serde::Deserialize;
use tracing_subscriber::EnvFilter;

/// The default listen address: loopback only.
pub(crate) const DEFAULT_LISTEN: &str = "127.0.0.1:7070";
/// The default data directory, relative to the working directory.
pub(crate) const DEFAULT_DATA_DIR: &str = "allot-data";

#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on [default: 127.0.0.1:7070].
    #[arg(long, env = "ALLOT_LISTEN")]
    listen: Option<SocketAddr>,
    /// Directory of the embedded store [default: ./allot-data].
    #[arg(long, env = "ALLOT_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Where state lives: `embedded` (the default: a durable store in --data-dir),
    /// `redis://HOST:PORT` (one Redis shared by several daemons) or
    /// `redis+cluster://HOST:PORT[,HOST:PORT...]` (a Redis Cluster).
    #[arg(long, env = "ALLOT_STORE")]
    store: Option<String>,
    /// TOML configuration file (keys: listen, data_dir, store, [quotas]).
    #[arg(long, env = "ALLOT_CONFIG")]
    config: Option<PathBuf>,
    /// Seed a namespace quota, e.g. `--quota hive:cluster-a=10`: the namespace is created with
    /// it if it does not exist yet; an existing one keeps the quota the store has. Repeatable;
    /// wins over the configuration file.
    #[arg(long = "quota", value_name = "NAMESPACE=QUOTA")]
    quotas: Vec<String>,
    /// Log format on stderr.
    #[arg(long, env = "ALLOT_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// The configuration file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    listen: Option<SocketAddr>,
    data_dir: Option<PathBuf>,
    store: Option<String>,
    /// Namespace quotas seeded at start [Flyte `ResourceRegistrar`]: created where they do not
    /// exist yet; the store is authoritative for the rest.
    #[serde(default)]
    quotas: BTreeMap<String, u64>,
}

/// The configuration, resolved.
#[derive(Debug)]
struct Config {
    listen: SocketAddr,
    data_dir: PathBuf,
    store: StoreChoice,
    quotas: Vec<(NamespaceName, u64)>,
}

#[derive(Debug)]
enum StoreChoice {
    Embedded,
    Redis(RedisConfig),
}

fn store_choice(address: Option<&str>) -> anyhow::Result<StoreChoice> {
    match address.map(str::trim) {
        None | Some("embedded") => Ok(StoreChoice::Embedded),
        Some(address) => Ok(StoreChoice::Redis(
            RedisConfig::parse(address).map_err(|err| anyhow::anyhow!("{err}, or `embedded` for the default store"))?,
        )),
    }
}

fn read_config_file(path: &Path) -> anyhow::Result<ConfigFile> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("invalid configuration file {}", path.display()))
}

fn resolve(args: &ServeArgs) -> anyhow::Result<Config> {
    let file = match &args.config {
        Some(path) => read_config_file(path)?,
        None => ConfigFile::default(),
    };
    let mut quotas = file.quotas;
    for quota in &args.quotas {
        let Some((name, value)) = quota.rsplit_once('=') else {
            bail!("--quota takes NAMESPACE=QUOTA, got `{quota}`");
        };
        let value: u64 =
            value.trim().parse().with_context(|| format!("--quota {quota}: the quota must be a whole number"))?;
        quotas.insert(name.to_owned(), value);
    }
    let quotas = quotas
        .into_iter()
        .map(|(name, quota)| Ok((NamespaceName::new(&name).with_context(|| format!("quota for `{name}`"))?, quota)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Config {
        listen: args.listen.or(file.listen).unwrap_or_else(|| DEFAULT_LISTEN.parse().expect("valid address")),
        data_dir: args.data_dir.clone().or(file.data_dir).unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR)),
        store: store_choice(args.store.as_deref().or(file.store.as_deref()))?,
        quotas,
    })
}

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(err) => {
                tracing::error!(error = %err, "cannot listen for SIGTERM");
                let _ = interrupt.await;
                return;
            }
        };
        tokio::select! {
            _ = interrupt => tracing::info!("SIGINT received"),
            _ = terminate.recv() => tracing::info!("SIGTERM received"),
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}

pub(crate) async fn run(args: ServeArgs) -> anyhow::Result<()> {
    init_logging(args.log_format);
    let config = resolve(&args)?;
    let store: Arc<dyn Store> = match &config.store {
        StoreChoice::Embedded => Arc::new(
            EmbeddedStore::open(&EmbeddedConfig { data_dir: config.data_dir.clone() })
                .with_context(|| format!("cannot open the store in {}", config.data_dir.display()))?,
        ),
        StoreChoice::Redis(redis) => Arc::new(RedisStore::open(redis).await.context("cannot open the Redis store")?),
    };
    for (name, quota) in &config.quotas {
        let (created, view) = store
            .seed_namespace(name.clone(), *quota)
            .await
            .with_context(|| format!("cannot register quota of `{name}`"))?;
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
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let address = listener.local_addr()?;
    tracing::info!(%address, data_dir = %config.data_dir.display(), backend = store.backend(), "allot serving");
    // The one line on stdout: scripts and tests read the address from it.
    println!("allot listening on http://{address}");
    allot_server::run(listener, store, shutdown_signal()).await.context("server failed")
}
