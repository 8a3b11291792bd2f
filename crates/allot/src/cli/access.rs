//! `allot api-token`: the API tokens a daemon with access configured authenticates calls by.

use std::process::ExitCode;

use allot_server::access::{hash_token, make_token};

#[derive(Debug, clap::Subcommand)]
pub(crate) enum ApiTokenCommand {
    /// Make a new API token, here, without a daemon: prints the token (give it to its user, once)
    /// and the `[[auth.tokens]]` entry of the daemon's configuration file, which keeps only its
    /// hash.
    #[command(after_help = "Exit codes:\n  0  made and printed\n  2  usage error")]
    Make(MakeArgs),
}

#[derive(Debug, clap::Args)]
pub(crate) struct MakeArgs {
    /// The user the token names.
    #[arg(long)]
    user: String,
    /// A group the user belongs to (repeat for several).
    #[arg(long = "group", value_name = "GROUP")]
    groups: Vec<String>,
    /// A name for the token in lists and the audit trail [default: the user].
    #[arg(long)]
    name: Option<String>,
}

pub(crate) fn run(command: ApiTokenCommand) -> ExitCode {
    match command {
        ApiTokenCommand::Make(args) => {
            if args.user.trim().is_empty() {
                return super::usage_error("--user must not be empty");
            }
            let token = make_token();
            let quoted = |text: &str| toml_string(text);
            let groups: Vec<String> = args.groups.iter().map(|g| quoted(g)).collect();
            println!("token: {token}");
            println!("hash: {}", hash_token(&token));
            println!();
            println!("# The daemon's configuration file keeps only the hash:");
            println!("[[auth.tokens]]");
            println!("name = {}", quoted(args.name.as_deref().unwrap_or(&args.user)));
            println!("user = {}", quoted(&args.user));
            println!("groups = [{}]", groups.join(", "));
            println!("hash = \"{}\"", hash_token(&token));
            ExitCode::SUCCESS
        }
    }
}

/// `text` as a TOML basic string.
fn toml_string(text: &str) -> String {
    serde_json::to_string(text).expect("a string serializes")
}
