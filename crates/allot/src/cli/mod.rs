//! The CLI: every command but `allot serve` and `allot bench` talks to a daemon over HTTP through
//! `allot-client` and prints its answer, as plain text for people or, with `--json`, as the
//! daemon's JSON for scripts (`--quiet`: only the ids it names). One module per part: `quotas`
//! (`allot quota`, `token`, `session`), `pools` (`allot pool`, `alloc`), `apps` (`allot queue`,
//! `app`, `task`; how their answers print is `apps_output`), `submit_follow` (`allot app submit
//! --follow FILE`, alias `allot run FILE`, with `follow`: its progress), `watch` (`allot watch`: the change feed, a line per event). The part
//! modules do not use each other; what they share is here: the options every command takes
//! ([`Common`]), the exit codes, printing an answer ([`emit`], [`finish`]), tables and the text
//! forms of names, durations and resources.
//!
//! Exit codes (the same with `--json`): [`EXIT_OK`], [`EXIT_ERROR`], [`EXIT_USAGE`] (clap's own);
//! `token alloc` adds its own (`quotas`).

pub(crate) mod access;
pub(crate) mod apps;
mod apps_output;
mod follow;
pub(crate) mod pools;
pub(crate) mod quotas;
pub(crate) mod snapshot;
pub(crate) mod submit_follow;
pub(crate) mod watch;

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;

use allot_client::{Client, ClientError};
use serde::Serialize;

/// Exit code of success, and of an allocate that was granted.
pub(crate) const EXIT_OK: u8 = 0;
/// Exit code of a failed command: the daemon refused it (`error: <code>: <message>` on stderr) or
/// could not be reached.
pub(crate) const EXIT_ERROR: u8 = 1;
/// Exit code of a command line that makes no sense (clap uses it for its own errors too).
pub(crate) const EXIT_USAGE: u8 = 2;

/// The exit codes of every CLI command but `token alloc`.
pub(crate) const EXIT_CODES: &str = "\
Exit codes (the same with --json and --quiet):
  0  done
  1  error: the daemon refused the request (`error: <code>: <message>` on stderr) or cannot be reached
  2  usage error";

/// The daemon the CLI talks to when neither --server nor ALLOT_SERVER names one.
pub(crate) const DEFAULT_SERVER: &str = "http://127.0.0.1:7070";

/// Options of every CLI command, accepted before the command (`allot --server URL quota list`)
/// and after it (`allot quota list --server URL`); after wins.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(next_help_heading = "Common options")]
pub(crate) struct Common {
    /// The daemon's URL [env: ALLOT_SERVER] [default: http://127.0.0.1:7070].
    #[arg(long, value_name = "URL")]
    server: Option<String>,
    /// The API token to call the daemon with [env: ALLOT_TOKEN] (`allot api-token make` makes
    /// one). Prefer the environment: a command line is visible to every user of the machine.
    #[arg(long = "token", id = "api_token", value_name = "TOKEN")]
    api_token: Option<String>,
    /// A CA certificate (PEM) to trust for an https:// daemon, besides the system's
    /// [env: ALLOT_CA_CERT].
    #[arg(long, value_name = "FILE")]
    ca_cert: Option<std::path::PathBuf>,
    /// A client certificate (PEM) for a daemon that asks for one (with --client-key)
    /// [env: ALLOT_CLIENT_CERT].
    #[arg(long, value_name = "FILE")]
    client_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of --client-cert [env: ALLOT_CLIENT_KEY].
    #[arg(long, value_name = "FILE")]
    client_key: Option<std::path::PathBuf>,
    /// Print the daemon's answer as pretty JSON, for scripts (exit codes stay the same).
    #[arg(long)]
    pub(crate) json: bool,
    /// Print only the ids the answer names, one per line (namespaces, tokens, session ids, pools,
    /// alloc URIs, queues, application and task ids), for scripts; nothing when it names none.
    /// Errors still go to stderr.
    #[arg(short, long, conflicts_with = "json")]
    pub(crate) quiet: bool,
}

impl Common {
    /// Fills in what was given before the command and not after it.
    pub(crate) fn merge(&mut self, before: &Common) -> Result<(), String> {
        if self.server.is_none() {
            self.server.clone_from(&before.server);
        }
        if self.api_token.is_none() {
            self.api_token.clone_from(&before.api_token);
        }
        for (after, before) in [
            (&mut self.ca_cert, &before.ca_cert),
            (&mut self.client_cert, &before.client_cert),
            (&mut self.client_key, &before.client_key),
        ] {
            if after.is_none() {
                after.clone_from(before);
            }
        }
        self.json |= before.json;
        self.quiet |= before.quiet;
        if self.json && self.quiet {
            return Err("--json and --quiet cannot be used together".to_owned());
        }
        Ok(())
    }

    /// The output options of a command that needs no daemon (`snapshot status`, `snapshot
    /// restore`, `api-token make`): its own --json and --quiet with those given before it. An
    /// option naming a daemon given before it is a usage error: it would do nothing.
    pub(crate) fn offline(command: &str, before: &Common, json: bool, quiet: bool) -> Result<Common, String> {
        if before.names_a_daemon() {
            return Err(format!(
                "`allot {command}` needs no daemon: --server, --token, --ca-cert, --client-cert and --client-key do nothing here"
            ));
        }
        let mut common = Common { json, quiet, ..Common::default() };
        common.merge(before)?;
        Ok(common)
    }

    /// True when any option was given.
    pub(crate) fn is_given(&self) -> bool {
        self.names_a_daemon() || self.json || self.quiet
    }

    /// True when an option naming the daemon or how to reach it was given.
    fn names_a_daemon(&self) -> bool {
        self.server.is_some()
            || self.api_token.is_some()
            || self.ca_cert.is_some()
            || self.client_cert.is_some()
            || self.client_key.is_some()
    }

    /// The daemon's URL: --server, else ALLOT_SERVER (when not empty), else the default.
    pub(crate) fn server(&self) -> String {
        self.server
            .clone()
            .or_else(|| std::env::var("ALLOT_SERVER").ok().filter(|url| !url.trim().is_empty()))
            .unwrap_or_else(|| DEFAULT_SERVER.to_owned())
    }

    /// ` --server URL` when the daemon was named by the flag, for a command shown to the user to
    /// run next (the environment names it for that command too); else nothing.
    pub(crate) fn server_flag(&self) -> String {
        self.server.as_ref().map_or_else(String::new, |url| format!(" --server {url}"))
    }

    /// A file named by its flag, else by its environment variable (none when empty).
    fn path(flag: &Option<std::path::PathBuf>, env: &str) -> Option<std::path::PathBuf> {
        flag.clone().or_else(|| std::env::var_os(env).filter(|v| !v.is_empty()).map(Into::into))
    }

    /// How to reach an https:// daemon: the CA to trust, the client certificate to present.
    pub(crate) fn tls(&self) -> Result<Option<allot_client::TlsOptions>, ClientError> {
        let read = |path: std::path::PathBuf| {
            std::fs::read(&path).map_err(|e| ClientError::InvalidTls(format!("cannot read {}: {e}", path.display())))
        };
        let ca = Common::path(&self.ca_cert, "ALLOT_CA_CERT");
        let cert = Common::path(&self.client_cert, "ALLOT_CLIENT_CERT");
        let key = Common::path(&self.client_key, "ALLOT_CLIENT_KEY");
        if ca.is_none() && cert.is_none() && key.is_none() {
            return Ok(None);
        }
        let identity_pem = match (cert, key) {
            (Some(cert), Some(key)) => Some([read(cert)?, b"\n".to_vec(), read(key)?].concat()),
            (None, None) => None,
            _ => return Err(ClientError::InvalidTls("--client-cert and --client-key go together".into())),
        };
        Ok(Some(allot_client::TlsOptions { ca_cert_pem: ca.map(read).transpose()?, identity_pem }))
    }

    /// The API token: --token, else ALLOT_TOKEN (none when empty).
    pub(crate) fn token(&self) -> Option<String> {
        self.api_token.clone().or_else(|| std::env::var("ALLOT_TOKEN").ok()).filter(|token| !token.trim().is_empty())
    }
}

pub(crate) fn client(common: &Common) -> Result<Client, ClientError> {
    client_at(common, &common.server())
}

/// A client of the daemon at `server`, with `common`'s token and TLS settings.
pub(crate) fn client_at(common: &Common, server: &str) -> Result<Client, ClientError> {
    // A person at a terminal wants an answer soon; scripts that must not lose a release can
    // run the command again.
    let client = match common.tls()? {
        Some(tls) => Client::with_tls(server, &tls)?,
        None => Client::new(server)?,
    };
    let client = client.with_release_retry(std::time::Duration::from_secs(10));
    Ok(match common.token() {
        Some(token) => client.with_token(&token),
        None => client,
    })
}

/// Runs a CLI command: merges in the options given before it (`common` finds the command's own),
/// reports a clash as a usage error, else runs it and turns its outcome into the exit code.
pub(crate) async fn dispatch<C, Outcome>(
    mut command: C,
    before: &Common,
    common: impl FnOnce(&mut C) -> &mut Common,
    run: impl FnOnce(C) -> Outcome,
) -> anyhow::Result<ExitCode>
where
    Outcome: std::future::Future<Output = Result<u8, ClientError>>,
{
    let common = common(&mut command);
    if let Err(usage) = common.merge(before) {
        return Ok(usage_error(&usage));
    }
    let common = common.clone();
    Ok(finish(&common, run(command).await))
}

/// Reports a command line that makes no sense (as clap does); answers [`EXIT_USAGE`].
pub(crate) fn usage_error(message: &str) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(EXIT_USAGE)
}

/// Prints `value` as JSON, as its ids (`--quiet`) or as `human` text; answers [`EXIT_OK`].
pub(crate) fn emit<T: Serialize + Ids>(
    common: &Common,
    value: &T,
    human: impl FnOnce(&T) -> String,
) -> Result<u8, ClientError> {
    emit_ids(common, value, value.ids(), human)
}

/// [`emit`] with the ids `--quiet` prints given by the caller.
pub(crate) fn emit_ids<T: Serialize>(
    common: &Common,
    value: &T,
    ids: Vec<String>,
    human: impl FnOnce(&T) -> String,
) -> Result<u8, ClientError> {
    let text = if common.json {
        let mut text = serde_json::to_string_pretty(value).map_err(|err| ClientError::Decode(err.to_string()))?;
        text.push('\n');
        text
    } else if common.quiet {
        ids.into_iter().map(|id| id + "\n").collect()
    } else {
        human(value)
    };
    print_stdout(&text);
    Ok(EXIT_OK)
}

/// What `--quiet` prints of an answer: the ids it names, raw (names never hold control
/// characters, so one per line is unambiguous).
pub(crate) trait Ids {
    fn ids(&self) -> Vec<String>;
}

/// Implements [`Ids`] for answers: `ids!(Answer => |it| the ids of it, ...)`.
macro_rules! ids {
    ($($answer:ty => |$it:ident| $ids:expr),* $(,)?) => {$(
        impl $crate::cli::Ids for $answer {
            fn ids(&self) -> Vec<String> {
                let $it = self;
                $ids
            }
        }
    )*};
}
pub(crate) use ids;

/// Writes to stdout; a closed pipe (`allot ... | head -1`) is not an error.
fn print_stdout(text: &str) {
    let mut stdout = std::io::stdout().lock();
    if let Err(err) = stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        if err.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("error: cannot write to stdout: {err}");
        }
    }
}

/// Turns a command's outcome into the process's exit code, reporting errors on stderr.
pub(crate) fn finish(common: &Common, outcome: Result<u8, ClientError>) -> ExitCode {
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(ClientError::Api { code, message, .. }) => {
            eprintln!("error: {code}: {message}");
            ExitCode::from(EXIT_ERROR)
        }
        Err(ClientError::InvalidUrl(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(EXIT_USAGE)
        }
        Err(err @ ClientError::Http(_)) => {
            eprintln!("error: {err}");
            if matches!(&err, ClientError::Http(http) if http.is_connect()) {
                eprintln!(
                    "hint: is the daemon running at {}? Set --server or ALLOT_SERVER to reach another one.",
                    common.server()
                );
            }
            ExitCode::from(EXIT_ERROR)
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

pub(crate) fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A name as it is printed: quoted (Rust string syntax) when it is empty or holds spaces, quotes
/// or control characters, so table columns and one-line answers stay readable.
pub(crate) fn show(name: &str) -> String {
    if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control() || c == '"' || c == '\\') {
        format!("{name:?}")
    } else {
        name.to_owned()
    }
}

/// Milliseconds for people: `500ms`, `30s`, `29.5s`, `5m`, `1h2m3s`.
pub(crate) fn format_ms(ms: u64) -> String {
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    if ms < 60_000 {
        let tenths = ms % 1_000 / 100;
        return if tenths == 0 { format!("{}s", ms / 1_000) } else { format!("{}.{tenths}s", ms / 1_000) };
    }
    let secs = ms / 1_000;
    let (days, hours, minutes, seconds) = (secs / 86_400, secs / 3_600 % 24, secs / 60 % 60, secs % 60);
    let mut text = String::new();
    for (value, unit) in [(days, "d"), (hours, "h"), (minutes, "m"), (seconds, "s")] {
        if value > 0 {
            let _ = write!(text, "{value}{unit}");
        }
    }
    text
}

#[derive(Clone, Copy)]
pub(crate) enum Align {
    Left,
    Right,
}

/// A plain-text table: a header row, then one row per item, columns two spaces apart.
pub(crate) struct Table {
    columns: Vec<(&'static str, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn new(columns: &[(&'static str, Align)]) -> Table {
        Table { columns: columns.to_vec(), rows: Vec::new() }
    }

    pub(crate) fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.columns.len());
        self.rows.push(cells);
    }

    pub(crate) fn render(&self) -> String {
        let width = |text: &str| text.chars().count();
        let widths: Vec<usize> = self
            .columns
            .iter()
            .enumerate()
            .map(|(i, (header, _))| {
                self.rows.iter().map(|row| width(&row[i])).chain([width(header)]).max().unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        let header: Vec<String> = self.columns.iter().map(|(header, _)| (*header).to_owned()).collect();
        for row in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                let pad = " ".repeat(widths[i] - width(cell));
                match self.columns[i].1 {
                    Align::Left => {
                        line.push_str(cell);
                        line.push_str(&pad);
                    }
                    Align::Right => {
                        line.push_str(&pad);
                        line.push_str(cell);
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `key: value` lines with the values aligned.
pub(crate) fn key_values(pairs: &[(&str, String)]) -> String {
    let width = pairs.iter().map(|(key, _)| key.len()).max().unwrap_or(0);
    let mut out = String::new();
    for (key, value) in pairs {
        let _ = writeln!(out, "{:<width$} {value}", format!("{key}:"), width = width + 1);
    }
    out
}

/// `KEY=VALUE`, split at the first `=`.
pub(crate) fn key_value(text: &str) -> Result<(String, String), String> {
    let (key, value) = text.split_once('=').ok_or("use KEY=VALUE, e.g. zone=eu-1")?;
    Ok((key.to_owned(), value.to_owned()))
}

/// Resources from the daemon, rounded for people (`mem=22.4GiB`); text that does not parse is
/// shown as it came.
pub(crate) fn human(resources: &str) -> String {
    match resources.parse::<allot_core::Resources>() {
        Ok(parsed) => parsed.human().to_string(),
        Err(_) => resources.to_owned(),
    }
}

/// Empty resources print as `-`, others as [`human`].
pub(crate) fn or_dash(resources: &str) -> String {
    if resources.is_empty() {
        "-".to_owned()
    } else {
        human(resources)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_ms() {
        assert_eq!(format_ms(0), "0ms");
        assert_eq!(format_ms(500), "500ms");
        assert_eq!(format_ms(30_000), "30s");
        assert_eq!(format_ms(29_512), "29.5s");
        assert_eq!(format_ms(300_000), "5m");
        assert_eq!(format_ms(3_723_000), "1h2m3s");
    }

    #[test]
    fn tables_align() {
        let mut table = Table::new(&[("NAME", Align::Left), ("N", Align::Right)]);
        table.row(vec!["a".to_owned(), "10".to_owned()]);
        table.row(vec!["long-name".to_owned(), "2".to_owned()]);
        assert_eq!(table.render(), "NAME        N\na          10\nlong-name   2\n");
    }

    #[test]
    fn quotes_odd_names() {
        assert_eq!(show("t1"), "t1");
        assert_eq!(show("a/b"), "a/b");
        assert_eq!(show("my token"), "\"my token\"");
        assert_eq!(show(""), "\"\"");
    }
}
