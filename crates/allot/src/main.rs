//! The `allot` binary: `allot serve` runs the daemon; every other command is the CLI, which talks
//! to a daemon over HTTP through `allot-client`; `allot bench` is the load generator.

mod bench;
mod cli;
mod cli_pools;
mod duration;
mod serve;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// allot: a resource manager for task executions.
#[derive(Debug, Parser)]
#[command(name = "allot", version, about, propagate_version = true)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon.
    Serve(serve::ServeArgs),
    /// Create, change, list and remove namespaces and their quotas.
    #[command(subcommand)]
    Quota(cli::QuotaCommand),
    /// Allocate, release, keep alive and list tokens.
    #[command(subcommand)]
    Token(cli::TokenCommand),
    /// Open, keep alive, close and list sessions.
    #[command(subcommand)]
    Session(cli::SessionCommand),
    /// Create, change, list, stop and remove leased resource pools; show their offers.
    #[command(subcommand)]
    Pool(cli_pools::PoolCommand),
    /// Accept offers, keep allocs alive, free and inspect them (`pool/alloc`).
    #[command(subcommand)]
    Alloc(cli_pools::AllocCommand),
    /// Measure a daemon under load (and compare it with a baseline server).
    Bench(bench::BenchArgs),
    /// The benchmark's baseline: an HTTP server that answers every request at once.
    #[command(hide = true)]
    BaselineServer(bench::BaselineArgs),
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Command::Serve(serve) = &args.command {
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
            Command::Serve(args) => serve::run(args).await.map(|()| ExitCode::SUCCESS),
            Command::Quota(command) => cli::quota(command).await,
            Command::Token(command) => cli::token(command).await,
            Command::Session(command) => cli::session(command).await,
            Command::Pool(command) => cli_pools::pool(command).await,
            Command::Alloc(command) => cli_pools::alloc(command).await,
            Command::Bench(args) => bench::run(args).await.map(|()| ExitCode::SUCCESS),
            Command::BaselineServer(args) => bench::baseline_server(args).await.map(|()| ExitCode::SUCCESS),
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
