//! The CLI commands of leased resource pools: `allot pool ...` and `allot alloc ...`. Resources
//! are given in their text form, e.g. `cpu=4,mem=16GiB,gpu=1`, and shown rounded for people
//! (`mem=22.4GiB`); `--json` shows the daemon's exact text form.

use std::process::ExitCode;
use std::time::Duration;

use allot_client::{
    Accept, Alloc, AllocKeepaliveResponse, AllocList, AnnotateAlloc, ClientError, Offer, OfferList, Pool, PoolList,
    PutPoolResponse, RemovedPool,
};

use allot_client::pools::{DaemonPool, Mux, PoolCallError};
use std::sync::Arc;

use super::{
    client, client_at, count, dispatch, emit, emit_ids, format_ms, human, ids, key_values, or_dash, show, Align,
    Common, Table, EXIT_CODES, EXIT_ERROR, EXIT_USAGE,
};

/// The id of a pool's one offer.
const OFFER: &str = "1";

#[derive(Debug, clap::Subcommand)]
pub(crate) enum PoolCommand {
    /// List the pools with their capacity and use (quantities rounded; --json is exact).
    #[command(after_help = EXIT_CODES)]
    List {
        #[command(flatten)]
        common: Common,
    },
    /// Show one pool: its capacity, use, labels and the task types it runs.
    #[command(visible_alias = "get", after_help = EXIT_CODES)]
    Show {
        /// The pool, e.g. `worker-1`.
        pool: String,
        #[command(flatten)]
        common: Common,
    },
    /// Create a pool, or change its capacity (a stopped pool starts again) and its labels.
    #[command(after_help = EXIT_CODES)]
    Set {
        /// The pool, e.g. `worker-1`.
        pool: String,
        /// The resources it holds, e.g. `cpu=16,mem=64GiB,disk=1TiB,gpu=2`.
        capacity: String,
        /// A label, `KEY=VALUE`, that task and task group selectors match; repeatable. Given,
        /// the labels replace the pool's; not given, the pool keeps the labels it has.
        #[arg(long = "label", value_name = "KEY=VALUE", value_parser = super::key_value)]
        labels: Vec<(String, String)>,
        /// Remove every label of the pool.
        #[arg(long, conflicts_with = "labels")]
        clear_labels: bool,
        /// The task types its executor runs, comma-separated (e.g. `http,noop`): the scheduler
        /// places no other type there. Not given, the pool keeps its list (by default every type
        /// its daemon has).
        #[arg(long, value_name = "TYPE,...", value_delimiter = ',', conflicts_with = "every_plugin")]
        plugins: Option<Vec<String>>,
        /// Let the pool run every task type its daemon has again.
        #[arg(long)]
        every_plugin: bool,
        /// What things allot does not manage hold there, e.g. `cpu=2,mem=4GiB`: never offered,
        /// and tasks that no longer fit are preempted. `""` clears it; not given, it is kept.
        #[arg(long, value_name = "RESOURCES")]
        occupied: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Cordon a pool: it takes no new allocs and the scheduler places nothing there; what runs
    /// there runs on.
    #[command(after_help = EXIT_CODES)]
    Cordon {
        /// The pool.
        pool: String,
        #[command(flatten)]
        common: Common,
    },
    /// Drain a pool: cordon it, and preempt its tasks once the grace has passed (they are placed
    /// again elsewhere; tasks that may not be preempted and gang members run to their end).
    #[command(after_help = EXIT_CODES)]
    Drain {
        /// The pool.
        pool: String,
        /// How long its tasks may run on first, e.g. `5m` (`0s`: at once).
        #[arg(long, default_value = "30s", value_parser = allot_bench::duration::parse)]
        grace: Duration,
        #[command(flatten)]
        common: Common,
    },
    /// Uncordon a pool: it takes allocs again; a drain not carried out yet is called off.
    #[command(after_help = EXIT_CODES)]
    Uncordon {
        /// The pool.
        pool: String,
        #[command(flatten)]
        common: Common,
    },
    /// Remove a pool.
    #[command(after_help = EXIT_CODES)]
    Rm {
        /// The pool.
        pool: String,
        /// Also when it has allocs (they end with it).
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Show the pool's offer: everything free in it.
    #[command(after_help = EXIT_CODES)]
    Offers {
        /// The pool.
        pool: String,
        #[command(flatten)]
        common: Common,
    },
    /// Stop the pool if every alloc's lease has lapsed for this long (--quiet prints the pool if
    /// it stopped, nothing if not).
    #[command(after_help = EXIT_CODES)]
    StopIfIdle {
        /// The pool.
        pool: String,
        /// How long every lease must have lapsed, e.g. `10m`.
        #[arg(value_parser = allot_bench::duration::parse)]
        idle: Duration,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Debug, clap::Subcommand)]
pub(crate) enum AllocCommand {
    /// Accept a pool's offer: make an alloc of at least MIN (and up to --max); prints its
    /// `pool/alloc` URI.
    #[command(after_help = EXIT_CODES)]
    Accept {
        /// The pool whose offer to accept.
        pool: String,
        /// The least the alloc needs, e.g. `cpu=2,mem=4GiB`.
        min: String,
        /// Take up to this much when it is free, e.g. `cpu=4,mem=16GiB`.
        #[arg(long, value_name = "RESOURCES")]
        max: Option<String>,
        /// Who holds the alloc, for people reading `alloc list`.
        #[arg(long, value_name = "NAME")]
        owner: Option<String>,
        /// A label, `KEY=VALUE`; repeatable.
        #[arg(long = "label", value_name = "KEY=VALUE")]
        labels: Vec<String>,
        /// The owner's metadata: a JSON object (at most 16 KiB), e.g. `'{"job": "etl-7"}'`.
        #[arg(long, value_name = "JSON")]
        metadata: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Change the labels and metadata of a live alloc (`pool/alloc`): what runs in it, its
    /// results [Reflow: an alloc's execs]. What is not named is kept; the lease is not renewed.
    #[command(after_help = EXIT_CODES)]
    Annotate {
        /// The alloc's URI, `pool/alloc`.
        uri: String,
        /// A label to set, `KEY=VALUE`; repeatable.
        #[arg(long = "label", value_name = "KEY=VALUE")]
        labels: Vec<String>,
        /// A label to remove; repeatable.
        #[arg(long = "remove-label", value_name = "KEY")]
        remove_labels: Vec<String>,
        /// New metadata, replacing what it had: a JSON object (at most 16 KiB).
        #[arg(long, value_name = "JSON", conflicts_with = "clear_metadata")]
        metadata: Option<String>,
        /// Remove the metadata.
        #[arg(long)]
        clear_metadata: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Show the run of the task in an alloc the scheduler holds (`pool/alloc`): its phases and,
    /// once it succeeded, its outputs; while the alloc is kept.
    #[command(after_help = EXIT_CODES)]
    Run {
        /// The alloc's URI, `pool/alloc`.
        uri: String,
        #[command(flatten)]
        common: Common,
    },
    /// Show an alloc (`pool/alloc`), live or ended.
    #[command(after_help = EXIT_CODES)]
    Get {
        /// The alloc's URI, `pool/alloc`.
        uri: String,
        #[command(flatten)]
        common: Common,
    },
    /// Renew an alloc's lease.
    #[command(after_help = EXIT_CODES)]
    Keepalive {
        /// The alloc's URI, `pool/alloc`.
        uri: String,
        /// How long the lease lasts from now (at most the daemon's maximum), e.g. `2m`.
        #[arg(value_parser = allot_bench::duration::parse, default_value = "2m")]
        interval: Duration,
        #[command(flatten)]
        common: Common,
    },
    /// Free an alloc.
    #[command(after_help = EXIT_CODES)]
    Free {
        /// The alloc's URI, `pool/alloc`.
        uri: String,
        #[command(flatten)]
        common: Common,
    },
    /// List the live allocs of pools [Reflow's `Mux.Allocs`]: those named, or every pool of the
    /// daemon (`--all`) and of each `--daemon`. A pool that does not answer is reported (exit 1)
    /// after what the others listed.
    #[command(after_help = EXIT_CODES)]
    List {
        /// The pools (on the daemon of `--server`).
        pools: Vec<String>,
        /// Every pool of the daemon of `--server`.
        #[arg(long)]
        all: bool,
        /// Also every pool of this daemon (its URL); repeatable. Pool names must not repeat.
        #[arg(long = "daemon", value_name = "URL")]
        daemons: Vec<String>,
        /// How long to wait for the pools' answers.
        #[arg(long, default_value = "10s", value_parser = allot_bench::duration::parse)]
        timeout: Duration,
        #[command(flatten)]
        common: Common,
    },
}

/// `allot offer ...`: offers by their URI, `pool/offer`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum OfferCommand {
    /// Show one offer, `pool/offer` [Reflow's `Mux.Offer(uri)`]: what is free in the pool now
    /// (exit 1, `offer_not_found`, when nothing is).
    #[command(after_help = EXIT_CODES)]
    Get {
        /// The offer's URI, `pool/offer` (a pool's one offer is `1`).
        uri: String,
        #[command(flatten)]
        common: Common,
    },
}

/// Runs an `allot offer` command; `before` holds the options given before the command.
pub(crate) async fn offer(command: OfferCommand, before: &Common) -> anyhow::Result<ExitCode> {
    dispatch(
        command,
        before,
        |command| match command {
            OfferCommand::Get { common, .. } => common,
        },
        |command| async move {
            match &command {
                OfferCommand::Get { uri, common } => {
                    let Some((pool, id)) = uri.split_once('/') else {
                        return Err(ClientError::InvalidUrl(format!(
                            "`{uri}` is not an offer URI: use POOL/OFFER, e.g. worker-1/1"
                        )));
                    };
                    let answer = client(common)?.offer(pool, id).await?;
                    emit(common, &answer, |offer| format!("{}/{}: {}\n", offer.pool, offer.id, human(&offer.available)))
                }
            }
        },
    )
    .await
}

/// What `allot alloc list` found: the allocs, and the pools that did not answer.
#[derive(Debug, serde::Serialize)]
struct AllocsFound {
    allocs: Vec<Alloc>,
    failed: Vec<FailedPool>,
}

#[derive(Debug, serde::Serialize)]
struct FailedPool {
    pool: String,
    error: String,
}

/// Runs an `allot pool` command; `before` holds the options given before the command.
pub(crate) async fn pool(command: PoolCommand, before: &Common) -> anyhow::Result<ExitCode> {
    dispatch(
        command,
        before,
        |command| match command {
            PoolCommand::List { common }
            | PoolCommand::Show { common, .. }
            | PoolCommand::Set { common, .. }
            | PoolCommand::Rm { common, .. }
            | PoolCommand::Offers { common, .. }
            | PoolCommand::StopIfIdle { common, .. }
            | PoolCommand::Cordon { common, .. }
            | PoolCommand::Drain { common, .. }
            | PoolCommand::Uncordon { common, .. } => common,
        },
        |command| async move { run_pool(&command).await },
    )
    .await
}

/// Runs an `allot alloc` command; `before` holds the options given before the command.
pub(crate) async fn alloc(command: AllocCommand, before: &Common) -> anyhow::Result<ExitCode> {
    dispatch(
        command,
        before,
        |command| match command {
            AllocCommand::Accept { common, .. }
            | AllocCommand::Annotate { common, .. }
            | AllocCommand::Run { common, .. }
            | AllocCommand::Get { common, .. }
            | AllocCommand::Keepalive { common, .. }
            | AllocCommand::Free { common, .. }
            | AllocCommand::List { common, .. } => common,
        },
        |command| async move { run_alloc(&command).await },
    )
    .await
}

async fn run_pool(command: &PoolCommand) -> Result<u8, ClientError> {
    match command {
        PoolCommand::List { common } => {
            let answer = client(common)?.pools().await?;
            emit(common, &answer, |list| pool_table(&list.pools))
        }
        PoolCommand::Show { pool, common } => {
            let answer = client(common)?.pool(pool).await?;
            emit(common, &answer, pool_details)
        }
        PoolCommand::Set { pool, capacity, labels, clear_labels, plugins, every_plugin, occupied, common } => {
            let client = client(common)?;
            let plugins = if *every_plugin { Some(vec!["*".to_owned()]) } else { plugins.clone() };
            let body = allot_api::PutPool {
                capacity: capacity.clone(),
                labels: (!labels.is_empty() || *clear_labels).then(|| labels.iter().cloned().collect()),
                plugins,
                occupied: occupied.clone(),
            };
            let answer = client.put_pool_with(pool, &body).await?;
            emit(common, &answer, |answer| {
                let verb = if answer.created { "created" } else { "set" };
                let mut line =
                    format!("{verb} pool {} with capacity {}", show(&answer.pool.name), human(&answer.pool.capacity));
                if !answer.pool.labels.is_empty() {
                    line = format!("{line}, labels {}", labels_text(&answer.pool.labels));
                }
                if let Some(plugins) = &answer.pool.plugins {
                    line = format!("{line}, runs {}", plugins_text(plugins));
                }
                line + "\n"
            })
        }
        PoolCommand::Cordon { pool, common } => {
            let answer = client(common)?.cordon_pool(pool).await?;
            emit(common, &answer, |pool| format!("pool {} {}\n", show(&pool.name), state_text(pool)))
        }
        PoolCommand::Drain { pool, grace, common } => {
            let answer = client(common)?.drain_pool(pool, Some(*grace)).await?;
            emit(common, &answer, |pool| format!("pool {} {}\n", show(&pool.name), state_text(pool)))
        }
        PoolCommand::Uncordon { pool, common } => {
            let answer = client(common)?.uncordon_pool(pool).await?;
            emit(common, &answer, |pool| format!("pool {} {}\n", show(&pool.name), state_text(pool)))
        }
        PoolCommand::Rm { pool, force, common } => {
            let answer = client(common)?.remove_pool(pool, *force).await?;
            emit(common, &answer, |answer| {
                format!(
                    "removed pool {} ({} ended)\n",
                    show(&answer.name),
                    count(answer.allocs_ended, "alloc", "allocs")
                )
            })
        }
        PoolCommand::Offers { pool, common } => {
            let answer = client(common)?.offers(pool).await?;
            emit(common, &answer, |list| match list.offers.first() {
                Some(offer) => format!("{}/{}: {}\n", offer.pool, offer.id, human(&offer.available)),
                None => "no offer: nothing is free\n".to_owned(),
            })
        }
        PoolCommand::StopIfIdle { pool, idle, common } => {
            let answer = client(common)?.stop_if_idle(pool, *idle).await?;
            let ids = if answer.stopped { vec![pool.clone()] } else { Vec::new() };
            emit_ids(common, &answer, ids, |answer| {
                if answer.stopped {
                    format!("stopped pool {}\n", show(pool))
                } else {
                    format!("not idle: pool {} would be idle in {}\n", show(pool), format_ms(answer.until_idle_ms))
                }
            })
        }
    }
}

async fn run_alloc(command: &AllocCommand) -> Result<u8, ClientError> {
    match command {
        AllocCommand::Accept { pool, min, max, owner, labels, metadata, common } => {
            let request = Accept {
                min: min.clone(),
                max: max.clone(),
                owner: owner.clone(),
                labels: key_value_labels(labels)?,
                metadata: metadata.as_deref().map(json_object).transpose()?,
            };
            let answer = client(common)?.accept(pool, OFFER, &request).await?;
            emit(common, &answer, |alloc| {
                format!("accepted {}: {} (lease {})\n", alloc.uri, human(&alloc.resources), lease(alloc))
            })
        }
        AllocCommand::Get { uri, common } => {
            let (pool, id) = split_uri(uri)?;
            let answer = client(common)?.alloc(pool, id).await?;
            emit(common, &answer, alloc_details)
        }
        AllocCommand::Annotate { uri, labels, remove_labels, metadata, clear_metadata, common } => {
            let (pool, id) = split_uri(uri)?;
            let metadata = match (metadata, *clear_metadata) {
                (_, true) => Some(None),
                (Some(text), false) => Some(Some(json_object(text)?)),
                (None, false) => None,
            };
            let notes =
                AnnotateAlloc { labels: key_value_labels(labels)?, remove_labels: remove_labels.clone(), metadata };
            let answer = client(common)?.annotate_alloc(pool, id, &notes).await?;
            emit(common, &answer, alloc_details)
        }
        AllocCommand::Run { uri, common } => {
            let (pool, id) = split_uri(uri)?;
            let answer = client(common)?.alloc_run(pool, id).await?;
            emit(common, &answer, crate::cli::apps_output::run_timeline)
        }
        AllocCommand::Keepalive { uri, interval, common } => {
            let (pool, id) = split_uri(uri)?;
            let answer = client(common)?.keepalive_alloc(pool, id, *interval).await?;
            emit(common, &answer, |answer| {
                format!("kept alive {} for {}\n", answer.alloc.uri, format_ms(answer.interval_ms))
            })
        }
        AllocCommand::Free { uri, common } => {
            let (pool, id) = split_uri(uri)?;
            let answer = client(common)?.free_alloc(pool, id).await?;
            emit(common, &answer, |alloc| format!("freed {}: {}\n", alloc.uri, human(&alloc.resources)))
        }
        AllocCommand::List { pools, all, daemons, timeout, common } => {
            if pools.is_empty() && !*all && daemons.is_empty() {
                eprintln!("error: name the pools, or give --all or --daemon URL");
                return Ok(EXIT_USAGE);
            }
            let home = client(common)?;
            let mux = Mux::new();
            // A name that is no pool's, or one given twice, is a usage error; a daemon that
            // cannot list its pools is the daemon's error, as any other call's.
            let added = |err: PoolCallError| ClientError::InvalidUrl(err.to_string());
            let mut listed = pools
                .iter()
                .map(|pool| DaemonPool::new(home.clone(), pool.clone()).map_err(added))
                .collect::<Result<Vec<_>, _>>()?;
            if *all {
                listed.extend(DaemonPool::all(&home).await?);
            }
            for daemon in daemons {
                listed.extend(DaemonPool::all(&client_at(common, daemon)?).await?);
            }
            for pool in listed {
                mux.add_pool(Arc::new(pool)).map_err(added)?;
            }
            let report = mux.allocs(*timeout).await;
            let mut failed: Vec<FailedPool> =
                report.failed.iter().map(|f| FailedPool { pool: f.pool.clone(), error: f.error.to_string() }).collect();
            failed.extend(report.timed_out.iter().map(|pool| FailedPool {
                pool: pool.clone(),
                error: format!("no answer within {}", format_ms(timeout.as_millis() as u64)),
            }));
            let mut allocs = report.allocs;
            allocs.sort_by(|a, b| (&a.pool, &a.id).cmp(&(&b.pool, &b.id)));
            let found = AllocsFound { allocs, failed };
            for pool in &found.failed {
                eprintln!("error: pool {}: {}", show(&pool.pool), pool.error);
            }
            let code = emit(common, &found, |found| alloc_table(&found.allocs))?;
            Ok(if found.failed.is_empty() { code } else { EXIT_ERROR })
        }
    }
}

/// Splits `pool/alloc` at the first `/`.
fn split_uri(uri: &str) -> Result<(&str, &str), ClientError> {
    uri.split_once('/').ok_or_else(|| {
        ClientError::InvalidUrl(format!("`{uri}` is not an alloc URI: use POOL/ALLOC, e.g. worker-1/4f2a9c0d1e3b5a77"))
    })
}

fn lease(alloc: &Alloc) -> String {
    if let Some(reason) = alloc.ended {
        return format!(
            "ended: {}",
            serde_json::to_value(reason).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
        );
    }
    let Some(expires_in_ms) = alloc.expires_in_ms else {
        return format!("held by the {}", alloc.held_by.as_deref().unwrap_or("scheduler"));
    };
    if expires_in_ms >= 0 {
        format!("expires in {}", format_ms(expires_in_ms as u64))
    } else {
        format!("lapsed {} ago", format_ms(expires_in_ms.unsigned_abs()))
    }
}

/// The daemons that run a pool's tasks; when none does, says so (and, `at_length`, what follows).
fn run_by_text(pool: &Pool, at_length: bool) -> String {
    match pool.run_by.as_deref() {
        None => "-".to_owned(),
        Some([]) if at_length => {
            format!("no daemon (tasks with a type are not placed here; start one with --run-pool {})", show(&pool.name))
        }
        Some([]) => "no daemon".to_owned(),
        Some(nodes) => nodes.join(","),
    }
}

/// The task types a pool runs, as `allot pool` prints them.
fn plugins_text(plugins: &[String]) -> String {
    match plugins.is_empty() {
        true => "no task type".to_owned(),
        false => plugins.join(","),
    }
}

/// Labels as `k=v,k2=v2`; none is `-`.
fn labels_text(labels: &std::collections::BTreeMap<String, String>) -> String {
    if labels.is_empty() {
        return "-".to_owned();
    }
    labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

fn pool_table(pools: &[Pool]) -> String {
    if pools.is_empty() {
        return "no pools\n".to_owned();
    }
    let mut table = Table::new(&[
        ("POOL", Align::Left),
        ("CAPACITY", Align::Left),
        ("ALLOCATED", Align::Left),
        ("ALLOCS", Align::Right),
        ("LAPSED", Align::Right),
        ("STATE", Align::Left),
        ("RUN BY", Align::Left),
        ("LABELS", Align::Left),
    ]);
    for pool in pools {
        table.row(vec![
            show(&pool.name),
            human(&pool.capacity),
            or_dash(&pool.allocated),
            pool.allocs.to_string(),
            pool.expired_allocs.to_string(),
            state_text(pool),
            run_by_text(pool, false),
            labels_text(&pool.labels),
        ]);
    }
    table.render()
}

/// `up`, `stopped`, `cordoned`, `draining in 25s` or `drained`.
fn state_text(pool: &Pool) -> String {
    match (&pool.cordon, pool.stopped) {
        (_, true) => "stopped".to_owned(),
        (None, false) => "up".to_owned(),
        (Some(cordon), false) => match cordon.drain_in_ms {
            None => "cordoned".to_owned(),
            Some(0) => "drained".to_owned(),
            Some(ms) => format!("draining in {}", format_ms(ms)),
        },
    }
}

fn pool_details(pool: &Pool) -> String {
    key_values(&[
        ("pool", show(&pool.name)),
        ("capacity", human(&pool.capacity)),
        ("allocated", or_dash(&pool.allocated)),
        ("lapsed", or_dash(&pool.expired)),
        ("occupied", or_dash(&pool.occupied)),
        ("allocs", pool.allocs.to_string()),
        ("state", state_text(pool)),
        ("labels", labels_text(&pool.labels)),
        ("run by", run_by_text(pool, true)),
        ("runs", pool.plugins.as_deref().map_or_else(|| "every task type".to_owned(), plugins_text)),
        (
            "counters",
            format!(
                "{} accepted, {} offer expired, {} freed, {} reclaimed",
                pool.stats.accepted, pool.stats.offer_expired, pool.stats.freed, pool.stats.reclaimed
            ),
        ),
    ])
}

fn alloc_table(allocs: &[Alloc]) -> String {
    if allocs.is_empty() {
        return "no allocs\n".to_owned();
    }
    let mut table = Table::new(&[
        ("ALLOC", Align::Left),
        ("RESOURCES", Align::Left),
        ("OWNER", Align::Left),
        ("LEASE", Align::Left),
    ]);
    for alloc in allocs {
        table.row(vec![alloc.uri.clone(), human(&alloc.resources), show(&alloc.owner), lease(alloc)]);
    }
    table.render()
}

/// `--label KEY=VALUE`s as labels.
fn key_value_labels(labels: &[String]) -> Result<std::collections::BTreeMap<String, String>, ClientError> {
    labels
        .iter()
        .map(|label| match label.split_once('=') {
            Some((key, value)) => Ok((key.to_owned(), value.to_owned())),
            None => Err(ClientError::InvalidUrl(format!("--label takes KEY=VALUE, got `{label}`"))),
        })
        .collect()
}

/// `--metadata JSON`: a JSON object.
fn json_object(text: &str) -> Result<serde_json::Value, ClientError> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(value) if value.is_object() => Ok(value),
        Ok(_) => Err(ClientError::InvalidUrl(format!("--metadata takes a JSON object, got `{text}`"))),
        Err(err) => Err(ClientError::InvalidUrl(format!("--metadata is not JSON ({err}): `{text}`"))),
    }
}

fn alloc_details(alloc: &Alloc) -> String {
    let labels: Vec<String> = alloc.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let holds = alloc.task.as_ref().map(|held| match (&held.task, &held.placeholder) {
        (Some(task), _) => format!("task {task} of application {}", held.app),
        (None, placeholder) => {
            format!("placeholder {} of application {}", placeholder.as_deref().unwrap_or("?"), held.app)
        }
    });
    let mut pairs =
        vec![("alloc", alloc.uri.clone()), ("resources", human(&alloc.resources)), ("owner", show(&alloc.owner))];
    if let Some(holds) = holds {
        pairs.push(("holds", holds));
    }
    pairs.extend([
        ("labels", if labels.is_empty() { "-".to_owned() } else { labels.join(",") }),
        ("metadata", alloc.metadata.as_ref().map_or_else(|| "-".to_owned(), serde_json::Value::to_string)),
        ("created", format!("{} ago", format_ms(alloc.created_ms_ago))),
        (
            "keepalive",
            alloc.last_keepalive_ms_ago.map_or_else(|| "never".to_owned(), |ms| format!("{} ago", format_ms(ms))),
        ),
        ("lease", lease(alloc)),
    ]);
    key_values(&pairs)
}

// What `-q` prints for each answer: the ids it names.
ids!(
    Pool => |it| vec![it.name.clone()],
    PoolList => |it| it.pools.iter().map(|pool| pool.name.clone()).collect(),
    PutPoolResponse => |it| it.pool.ids(),
    RemovedPool => |it| vec![it.name.clone()],
    // Offers as `pool/offer`.
    OfferList => |it| it.offers.iter().map(|offer| format!("{}/{}", offer.pool, offer.id)).collect(),
    Alloc => |it| vec![it.uri.clone()],
    AllocList => |it| it.allocs.iter().map(|alloc| alloc.uri.clone()).collect(),
    AllocsFound => |it| it.allocs.iter().map(|alloc| alloc.uri.clone()).collect(),
    Offer => |it| vec![format!("{}/{}", it.pool, it.id)],
    AllocKeepaliveResponse => |it| it.alloc.ids(),
);
