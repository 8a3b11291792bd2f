//! allot's command line as a library: `allot serve` runs the daemon; every other command is the
//! CLI, which talks to a daemon over HTTP through `allot-client`; `allot bench` is the load
//! generator, whose commands the `allot-bench` crate holds. The `allot` binary is [`main`]; a
//! shim that brings applications in from a system of its own is a binary of its own that calls
//! [`main_with_sources`] with its [`sources::AppManager`] (see the crate `allot-source-example`), and is
//! `allot` in every other way. This file parses the command line and hands each command to its
//! module:
//!
//! - `serve`: the daemon (its flags, its configuration file, starting and stopping it);
//! - `sources`: where the daemon takes applications from (the HTTP API, a directory of files);
//! - `cli`: the CLI commands, one module per part (quotas, pools, apps, run) and `watch`;
//! - `appfile`: application files (YAML or TOML), read by `allot app submit`, `allot run` and the
//!   directory source.

mod appfile;
mod cli;
mod serve;
pub mod sources;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use sources::{AppManager, SourceContext, SourceMaker};

/// allot: a resource manager for task executions.
#[derive(Debug, Parser)]
#[command(name = "allot", version, about, propagate_version = true)]
struct Args {
    /// --server, --json and --quiet of the CLI commands, given before the command.
    #[command(flatten)]
    before: cli::Common,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon.
    #[command(after_help = serve::SERVE_AFTER_HELP)]
    Serve(serve::ServeArgs),
    /// Create, change, list and remove namespaces and their quotas.
    #[command(subcommand)]
    Quota(cli::quotas::QuotaCommand),
    /// Allocate, release, keep alive and list tokens.
    #[command(subcommand)]
    Token(cli::quotas::TokenCommand),
    /// Open, keep alive, close and list sessions.
    #[command(subcommand)]
    Session(cli::quotas::SessionCommand),
    /// Create, change, list, stop and remove leased resource pools; show their offers.
    #[command(subcommand)]
    Pool(cli::pools::PoolCommand),
    /// Accept offers, keep allocs alive, free and inspect them (`pool/alloc`).
    #[command(subcommand)]
    Alloc(cli::pools::AllocCommand),
    /// Read a pool's offer by its URI (`pool/offer`).
    #[command(subcommand)]
    Offer(cli::pools::OfferCommand),
    /// Create, change, list and remove queues (`root.a.b`) and their limits.
    #[command(subcommand)]
    Queue(cli::apps::QueueCommand),
    /// Submit applications (from YAML or TOML), list, show, complete, fail and remove them.
    #[command(subcommand)]
    App(cli::apps::AppCommand),
    /// Add tasks to applications, show them, report them started, completed or failed, remove
    /// them.
    #[command(subcommand)]
    Task(cli::apps::TaskCommand),
    /// Follow every change as the daemon makes it (grants, pools, allocs, queues, applications,
    /// tasks, runs): one line per event, or one JSON object per line with --json.
    #[command(after_help = cli::watch::AFTER_HELP)]
    Watch(cli::watch::WatchArgs),
    /// The same as `allot app submit --follow FILE`: submit an application from a file and follow
    /// it to its end (progress per task group, then a summary; exits non-zero if a task did not
    /// complete).
    #[command(after_help = cli::submit_follow::after_help())]
    Run(cli::submit_follow::RunArgs),
    /// Make API tokens for a daemon with access configured (`[auth]`): for its configuration
    /// file, or through the API (create, list, revoke).
    #[command(subcommand, name = "api-token")]
    ApiToken(cli::access::ApiTokenCommand),
    /// Give roles to users and groups through the API (set, list, remove).
    #[command(subcommand)]
    Binding(cli::access::BindingCommand),
    /// Who the daemon takes you for (your token or certificate), and whether you may do what
    /// you name, e.g. `allot whoami use:namespace:hive:a admin:daemon`.
    #[command(after_help = cli::EXIT_CODES)]
    Whoami(cli::access::WhoamiArgs),
    /// Save a daemon's whole store to one archive while it serves, check an archive, restore one
    /// into a new data directory.
    #[command(subcommand)]
    Snapshot(cli::snapshot::SnapshotCommand),
    /// Measure a daemon under load (and compare it with a baseline server).
    #[command(after_help = allot_bench::BENCH_AFTER_HELP)]
    Bench(allot_bench::BenchArgs),
    /// The benchmark's baseline: an HTTP server that answers every request at once.
    #[command(hide = true)]
    BaselineServer(allot_bench::BaselineArgs),
}

/// The `allot` command line: parses the arguments and runs the command.
pub fn main() -> ExitCode {
    main_with_sources(Vec::new())
}

/// The `allot` command line, with more sources of applications for `allot serve`: each is made
/// once the daemon's store is open, and started and stopped with the built-in ones (the HTTP
/// API, the directory of application files).
pub fn main_with_sources(sources: Vec<SourceMaker>) -> ExitCode {
    let args = Args::parse();
    if args.before.is_given()
        && matches!(args.command, Command::Serve(_) | Command::Bench(_) | Command::BaselineServer(_))
    {
        return cli::usage_error(
            "--server, --json and --quiet before the command are options of the CLI commands (quota, token, \
             session, pool, alloc, queue, app, task, run, watch, api-token, binding, whoami, snapshot save); `allot serve` listens with --listen, and `allot bench` takes its options \
             after its command, e.g. `allot bench pairs --server URL --json`",
        );
    }
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Command::Serve(serve) = &args.command {
        serve::no_transparent_huge_pages();
        runtime.worker_threads(serve::worker_threads(serve));
    }
    let runtime = match runtime.enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::from(cli::EXIT_ERROR);
        }
    };
    let result = runtime.block_on(async move {
        match args.command {
            Command::Serve(args) => serve::run(args, sources).await.map(|()| ExitCode::SUCCESS),
            Command::Quota(command) => cli::quotas::quota(command, &args.before).await,
            Command::Token(command) => cli::quotas::token(command, &args.before).await,
            Command::Session(command) => cli::quotas::session(command, &args.before).await,
            Command::Pool(command) => cli::pools::pool(command, &args.before).await,
            Command::Alloc(command) => cli::pools::alloc(command, &args.before).await,
            Command::Offer(command) => cli::pools::offer(command, &args.before).await,
            Command::Queue(command) => cli::apps::queue(command, &args.before).await,
            Command::App(cli::apps::AppCommand::Submit { file, follow: true, follow_args, common }) => {
                cli::submit_follow::submit_and_follow(&file, follow_args, common, &args.before).await
            }
            Command::App(command) => cli::apps::app(command, &args.before).await,
            Command::Task(command) => cli::apps::task(command, &args.before).await,
            Command::Run(command) => {
                let (file, follow, common) = command.into_submit();
                cli::submit_follow::submit_and_follow(&file, follow, common, &args.before).await
            }
            Command::Watch(command) => cli::watch::watch(command, &args.before).await,
            Command::ApiToken(command) => cli::access::api_token(command, &args.before).await,
            Command::Binding(command) => cli::access::binding(command, &args.before).await,
            Command::Whoami(command) => cli::access::whoami(command, &args.before).await,
            Command::Snapshot(command) => cli::snapshot::snapshot(command, &args.before).await,
            Command::Bench(args) => allot_bench::run(args, bench_api).await.map(|()| ExitCode::SUCCESS),
            Command::BaselineServer(args) => allot_bench::baseline_server(args).await.map(|()| ExitCode::SUCCESS),
        }
    });
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(cli::EXIT_ERROR)
        }
    }
}

/// The daemon's API over `store`, for `allot bench`'s probe of allot's own work (the load
/// generator does not link the server: the binary hands it this).
fn bench_api(
    store: std::sync::Arc<dyn allot_store::Store>,
) -> tower::util::BoxCloneSyncService<axum::extract::Request, axum::response::Response, std::convert::Infallible> {
    tower::util::BoxCloneSyncService::new(allot_server::api(allot_server::ServerState::new(store)))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// Every command at any depth, with its path.
    fn commands(command: &clap::Command, path: String, out: &mut Vec<(String, clap::Command)>) {
        for sub in command.get_subcommands() {
            let path = format!("{path} {}", sub.get_name());
            commands(sub, path.clone(), out);
            out.push((path, sub.clone()));
        }
    }

    #[test]
    fn every_argument_has_help_and_every_command_its_exit_codes() {
        let top = Args::command();
        top.clone().debug_assert();
        let mut all = Vec::new();
        commands(&top, "allot".to_owned(), &mut all);
        all.push(("allot".to_owned(), top));
        for (path, command) in &all {
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if id != "help" && id != "version" {
                    assert!(arg.get_help().is_some(), "`{path}`: argument `{id}` has no help text");
                }
            }
            let leaf = command.get_subcommands().next().is_none();
            if leaf && !command.is_hide_set() {
                let after = command.get_after_help().map(|text| text.to_string()).unwrap_or_default();
                assert!(after.contains("Exit codes"), "`{path} --help` does not document its exit codes");
            }
        }
    }

    #[test]
    fn cli_options_go_before_or_after_the_command() {
        let parse = |line: &str| Args::try_parse_from(line.split_whitespace()).unwrap();
        let before = parse("allot --server http://a:1 -q token list hive");
        let after = parse("allot token list hive --server http://a:1 --quiet");
        for args in [before, after] {
            let Command::Token(cli::quotas::TokenCommand::List { mut common, .. }) = args.command else { panic!() };
            common.merge(&args.before).unwrap();
            assert_eq!((common.server(), common.quiet, common.json), ("http://a:1".to_owned(), true, false));
        }
        // After the command wins; --json and --quiet together are refused.
        let both = parse("allot --server http://a:1 --json quota list --server http://b:2 -q");
        let Command::Quota(cli::quotas::QuotaCommand::List { mut common }) = both.command else { panic!() };
        assert_eq!(common.merge(&both.before), Err("--json and --quiet cannot be used together".to_owned()));
        assert_eq!(common.server(), "http://b:2");
        assert!(Args::try_parse_from(["allot", "quota", "list", "--json", "-q"]).is_err());
    }
}
