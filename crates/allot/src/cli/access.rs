//! `allot api-token`: the API tokens a daemon with access configured authenticates calls by:
//! made offline for the configuration file (`make`), or made, listed and revoked through the API
//! (`create`, `list`, `revoke`, with `admin` on the daemon); `allot binding`: roles given to
//! users and groups through the API.

use std::process::ExitCode;

use allot_client::{
    ApiToken, ApiTokenList, Binding, BindingList, ClientError, CreateApiToken, CreatedApiToken, PutBinding, WhoAmI,
};
use allot_core::access::hash_token;
use allot_server::access::make_token;

use super::{client, dispatch, emit, emit_ids, ids, Common, EXIT_CODES};

#[derive(Debug, clap::Subcommand)]
pub(crate) enum ApiTokenCommand {
    /// Make a new API token, here, without a daemon: prints the token (give it to its user, once)
    /// and the `[[auth.tokens]]` entry of the daemon's configuration file, which keeps only its
    /// hash.
    #[command(after_help = "Exit codes:\n  0  made and printed\n  2  usage error")]
    Make(MakeArgs),
    /// Make a token through the API, kept in the daemon's store (as its hash): prints the token
    /// once.
    #[command(after_help = EXIT_CODES)]
    Create {
        /// Its name, for lists, revocation and the audit trail.
        name: String,
        /// The user it names.
        #[arg(long)]
        user: String,
        /// A group of the user (repeat for several).
        #[arg(long = "group", value_name = "GROUP")]
        groups: Vec<String>,
        /// How long it is accepted, e.g. `30d`, `12h` [default: until revoked].
        #[arg(long, value_name = "DURATION", value_parser = allot_bench::duration::parse)]
        ttl: Option<std::time::Duration>,
        #[command(flatten)]
        common: Common,
    },
    /// List the tokens made through the API (never the tokens themselves).
    #[command(after_help = EXIT_CODES)]
    List {
        #[command(flatten)]
        common: Common,
    },
    /// Revoke a token made through the API: refused at once on every daemon of the store, and
    /// the calls it holds open end within a second.
    #[command(after_help = EXIT_CODES)]
    Revoke {
        /// The token's name.
        name: String,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Debug, clap::Subcommand)]
pub(crate) enum BindingCommand {
    /// Give a role to users and groups (replacing the binding of that name).
    #[command(after_help = EXIT_CODES)]
    Set {
        /// The binding's name.
        name: String,
        /// A role of the daemon's configuration file, or `admin` or `reader`.
        #[arg(long)]
        role: String,
        /// A user given the role (repeatable).
        #[arg(long = "user", value_name = "USER")]
        users: Vec<String>,
        /// A group given the role (repeatable).
        #[arg(long = "group", value_name = "GROUP")]
        groups: Vec<String>,
        #[command(flatten)]
        common: Common,
    },
    /// List the bindings made through the API.
    #[command(after_help = EXIT_CODES)]
    List {
        #[command(flatten)]
        common: Common,
    },
    /// Remove a binding made through the API.
    #[command(after_help = EXIT_CODES)]
    Remove {
        /// The binding's name.
        name: String,
        #[command(flatten)]
        common: Common,
    },
}

/// `allot whoami [CHECK...]`.
#[derive(Debug, clap::Args)]
pub(crate) struct WhoamiArgs {
    /// Permissions to ask about, each `PERMISSION:RESOURCE`: `use:namespace:hive:a`,
    /// `admin:pool:gpu`, `use:queue:root.a`, `read:daemon`.
    #[arg(value_name = "CHECK")]
    checks: Vec<String>,
    #[command(flatten)]
    common: Common,
}

/// `allot whoami`: who the daemon takes the caller for, and what it may do.
pub(crate) async fn whoami(args: WhoamiArgs, before: &Common) -> anyhow::Result<ExitCode> {
    dispatch(args, before, |args| &mut args.common, run_whoami).await
}

async fn run_whoami(args: WhoamiArgs) -> Result<u8, ClientError> {
    let checks: Vec<&str> = args.checks.iter().map(String::as_str).collect();
    let me = client(&args.common)?.whoami(&checks).await?;
    emit(&args.common, &me, |me| {
        let mut text = match (&me.user, me.access) {
            (Some(user), _) if me.groups.is_empty() => format!("{user}\n"),
            (Some(user), _) => format!("{user} (groups {})\n", me.groups.join(", ")),
            (None, false) => "anyone: this daemon checks no caller (no [auth])\n".to_owned(),
            (None, true) => "no one\n".to_owned(),
        };
        for (check, may) in &me.can {
            text.push_str(&format!("{check}: {}\n", if *may { "yes" } else { "no" }));
        }
        text
    })
}

ids!(
    WhoAmI => |it| it.user.iter().cloned().collect(),
    CreatedApiToken => |it| vec![it.token.clone()],
    ApiToken => |it| vec![it.name.clone()],
    ApiTokenList => |it| it.api_tokens.iter().map(|t| t.name.clone()).collect(),
    Binding => |it| vec![it.name.clone()],
    BindingList => |it| it.bindings.iter().map(|b| b.name.clone()).collect(),
);

fn token_line(token: &ApiToken) -> String {
    let groups = if token.groups.is_empty() { String::new() } else { format!(" groups={}", token.groups.join(",")) };
    let expires = token.expires_ms.map_or_else(String::new, |ms| format!(" expires_ms={ms}"));
    format!("{}  user={}{groups}{expires}", token.name, token.user)
}

fn binding_line(binding: &Binding) -> String {
    format!(
        "{}  role={} users={} groups={}",
        binding.name,
        binding.role,
        binding.users.join(","),
        binding.groups.join(",")
    )
}

/// `allot api-token ...` through the API.
pub(crate) async fn api_token(command: ApiTokenCommand, before: &Common) -> anyhow::Result<ExitCode> {
    match command {
        ApiTokenCommand::Make(args) => Ok(make(args, before)),
        command => dispatch(command, before, token_common, run_api_token).await,
    }
}

fn token_common(command: &mut ApiTokenCommand) -> &mut Common {
    match command {
        ApiTokenCommand::Create { common, .. }
        | ApiTokenCommand::List { common }
        | ApiTokenCommand::Revoke { common, .. } => common,
        ApiTokenCommand::Make(_) => unreachable!("made offline"),
    }
}

async fn run_api_token(command: ApiTokenCommand) -> Result<u8, ClientError> {
    match command {
        ApiTokenCommand::Create { name, user, groups, ttl, common } => {
            let body = CreateApiToken { name, user, groups, ttl_ms: ttl.map(|t| t.as_millis() as u64) };
            let made = client(&common)?.create_api_token(&body).await?;
            emit(&common, &made, |made| {
                format!(
                    "token: {}\n{}\n(shown once: the daemon keeps only its hash)\n",
                    made.token,
                    token_line(&made.api_token)
                )
            })
        }
        ApiTokenCommand::List { common } => {
            let list = client(&common)?.api_tokens().await?;
            emit(&common, &list, |list| list.api_tokens.iter().map(|t| token_line(t) + "\n").collect())
        }
        ApiTokenCommand::Revoke { name, common } => {
            let revoked = client(&common)?.revoke_api_token(&name).await?;
            emit(&common, &revoked, |t| format!("revoked {}\n", token_line(t)))
        }
        ApiTokenCommand::Make(_) => unreachable!("made offline"),
    }
}

/// `allot binding ...`.
pub(crate) async fn binding(command: BindingCommand, before: &Common) -> anyhow::Result<ExitCode> {
    dispatch(command, before, binding_common, run_binding).await
}

fn binding_common(command: &mut BindingCommand) -> &mut Common {
    match command {
        BindingCommand::Set { common, .. }
        | BindingCommand::List { common }
        | BindingCommand::Remove { common, .. } => common,
    }
}

async fn run_binding(command: BindingCommand) -> Result<u8, ClientError> {
    match command {
        BindingCommand::Set { name, role, users, groups, common } => {
            let binding = client(&common)?.put_binding(&name, &PutBinding { role, users, groups }).await?;
            emit(&common, &binding, |b| binding_line(b) + "\n")
        }
        BindingCommand::List { common } => {
            let list = client(&common)?.bindings().await?;
            emit(&common, &list, |list| list.bindings.iter().map(|b| binding_line(b) + "\n").collect())
        }
        BindingCommand::Remove { name, common } => {
            let removed = client(&common)?.remove_binding(&name).await?;
            emit(&common, &removed, |b| format!("removed {}\n", binding_line(b)))
        }
    }
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
    /// Print the token, its hash and the configuration entry as JSON, for scripts.
    #[arg(long)]
    json: bool,
    /// Print only the token.
    #[arg(short, long, conflicts_with = "json")]
    quiet: bool,
}

/// What `api-token make --json` prints.
#[derive(Debug, serde::Serialize)]
struct MadeToken {
    token: String,
    hash: String,
    name: String,
    user: String,
    groups: Vec<String>,
    /// The `[[auth.tokens]]` entry for the daemon's configuration file, as TOML.
    config: String,
}

/// `allot api-token make`: a new token, made here.
fn make(args: MakeArgs, before: &Common) -> ExitCode {
    let output = match Common::offline("api-token make", before, args.json, args.quiet) {
        Ok(output) => output,
        Err(usage) => return super::usage_error(&usage),
    };
    if args.user.trim().is_empty() {
        return super::usage_error("--user must not be empty");
    }
    let token = make_token();
    let hash = hash_token(&token);
    let name = args.name.unwrap_or_else(|| args.user.clone());
    let groups: Vec<String> = args.groups.iter().map(|g| toml_string(g)).collect();
    let config = format!(
        "[[auth.tokens]]\nname = {}\nuser = {}\ngroups = [{}]\nhash = \"{hash}\"\n",
        toml_string(&name),
        toml_string(&args.user),
        groups.join(", "),
    );
    let made = MadeToken { token: token.clone(), hash, name, user: args.user, groups: args.groups, config };
    let _ = emit_ids(&output, &made, vec![token], |made| {
        format!(
            "token: {}\nhash: {}\n\n# The daemon's configuration file keeps only the hash:\n{}",
            made.token, made.hash, made.config
        )
    });
    ExitCode::SUCCESS
}

/// `text` as a TOML basic string.
fn toml_string(text: &str) -> String {
    serde_json::to_string(text).expect("a string serializes")
}
