//! The CLI commands of token quotas: `allot quota` (namespaces and their quotas), `allot token`
//! (allocate, release, keep alive and list grants; `token alloc --wait` rides out a daemon that
//! restarts) and `allot session`. `token alloc` has exit codes of its own:
//! [`EXIT_EXHAUSTED`], [`EXIT_NAMESPACE_QUOTA_EXCEEDED`].

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use allot_client::{
    Allocate, AllocateResponse, CapLevel, CapRefusal, Caps, Client, ClientError, Grant, GrantList, Namespace,
    NamespaceList, PutNamespaceResponse, QueuePlace, RemovedNamespace, Scope, Session, SessionList, Status, WaiterList,
};

use super::{
    client, count, dispatch, emit, emit_ids, format_ms, ids, key_values, show, Align, Common, Table, EXIT_CODES,
    EXIT_OK,
};

/// Exit code of an allocate answered `Exhausted`: the namespace quota is full.
pub(crate) const EXIT_EXHAUSTED: u8 = 3;
/// Exit code of an allocate answered `NamespaceQuotaExceeded`: a project or namespace scope cap is
/// full.
pub(crate) const EXIT_NAMESPACE_QUOTA_EXCEEDED: u8 = 4;

const ALLOC_EXIT_CODES: &str = "\
Exit codes (the same with --json and --quiet):
  0  granted (also when the token was already granted)
  1  error: the daemon refused the request (`error: <code>: <message>` on stderr) or cannot be reached
  2  usage error
  3  Exhausted: the namespace quota is full (after --wait, if given)
  4  NamespaceQuotaExceeded: a project or namespace scope cap is full

With --wait, a daemon that restarts or goes away during the wait is said so on stderr, and the
wait is retried for the time left (allocate is idempotent; the place in the queue is not kept).";

#[derive(Debug, clap::Subcommand)]
pub(crate) enum QuotaCommand {
    /// List the namespaces with their quota and use (GRANTED, FREE and WAITING are units).
    #[command(after_help = EXIT_CODES)]
    List {
        #[command(flatten)]
        common: Common,
    },
    /// Show one namespace: its quota, use, waiters and next fencing number.
    #[command(after_help = EXIT_CODES)]
    Get {
        /// The namespace, e.g. `hive:cluster-a`.
        namespace: String,
        #[command(flatten)]
        common: Common,
    },
    /// Create a namespace, or change its quota.
    #[command(after_help = EXIT_CODES)]
    Set {
        /// The namespace, e.g. `hive:cluster-a`.
        namespace: String,
        /// How many units the namespace may have granted at once.
        quota: u64,
        #[command(flatten)]
        common: Common,
    },
    /// Remove a namespace.
    #[command(after_help = EXIT_CODES)]
    Rm {
        /// The namespace.
        namespace: String,
        /// Remove it even if clients hold grants or wait in it: they end with it. Grants allot
        /// holds there for tasks never end this way: those tasks end first.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        common: Common,
    },
    /// List the allocate calls waiting for room in a namespace, head of the queue first.
    #[command(after_help = EXIT_CODES)]
    Waiters {
        /// The namespace.
        namespace: String,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Debug, clap::Subcommand)]
pub(crate) enum TokenCommand {
    /// Allocate a token: ask for units of a namespace's quota.
    #[command(after_help = ALLOC_EXIT_CODES)]
    Alloc {
        /// The namespace.
        namespace: String,
        /// The token: your idempotency key for this allocation (allocating it again is a no-op).
        token: String,
        /// How many units.
        #[arg(long, value_name = "N", default_value_t = 1)]
        units: u64,
        /// The holder's project (its scope, with --scope-namespace).
        #[arg(long, value_name = "P", requires = "scope_namespace")]
        project: Option<String>,
        /// The holder's namespace scope (its scope, with --project).
        #[arg(long, value_name = "D", requires = "project")]
        scope_namespace: Option<String>,
        /// The most units the holder's project may hold in the namespace (needs a scope).
        #[arg(long, value_name = "N", requires = "project")]
        project_cap: Option<u64>,
        /// The most units the holder's namespace scope may hold in the namespace (needs a scope).
        #[arg(long, value_name = "N", requires = "project")]
        namespace_cap: Option<u64>,
        /// End the grant this long after the grant or its last keepalive, e.g. `30s`.
        #[arg(long, value_name = "DURATION", value_parser = allot_bench::duration::parse)]
        ttl: Option<Duration>,
        /// Attach the grant to this session: it lives as long as the session.
        #[arg(long, value_name = "ID")]
        session: Option<String>,
        /// Wait up to this long for room instead of answering at once, e.g. `5m`.
        #[arg(long, value_name = "DURATION", value_parser = allot_bench::duration::parse)]
        wait: Option<Duration>,
        #[command(flatten)]
        common: Common,
    },
    /// Release a token (releasing a token that is not granted is not an error).
    #[command(after_help = EXIT_CODES)]
    Release {
        /// The namespace.
        namespace: String,
        /// The token.
        token: String,
        /// Refuse unless the grant carries this fencing number.
        #[arg(long, value_name = "N")]
        fencing: Option<u64>,
        #[command(flatten)]
        common: Common,
    },
    /// Renew a grant's lease.
    #[command(after_help = EXIT_CODES)]
    Keepalive {
        /// The namespace.
        namespace: String,
        /// The token.
        token: String,
        /// Refuse unless the grant carries this fencing number.
        #[arg(long, value_name = "N")]
        fencing: Option<u64>,
        #[command(flatten)]
        common: Common,
    },
    /// List the grants of a namespace.
    #[command(after_help = EXIT_CODES)]
    List {
        /// The namespace.
        namespace: String,
        #[command(flatten)]
        common: Common,
    },
    /// Show one grant.
    #[command(after_help = EXIT_CODES)]
    Get {
        /// The namespace.
        namespace: String,
        /// The token.
        token: String,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Debug, clap::Subcommand)]
pub(crate) enum SessionCommand {
    /// Open a session; grants attached to it live while it is kept alive.
    #[command(after_help = EXIT_CODES)]
    Open {
        /// End the session this long after it is opened or last kept alive, e.g. `30s`.
        #[arg(long, value_name = "DURATION", value_parser = allot_bench::duration::parse)]
        ttl: Duration,
        #[command(flatten)]
        common: Common,
    },
    /// Renew a session's lease.
    #[command(after_help = EXIT_CODES)]
    Keepalive {
        /// The session id.
        id: String,
        #[command(flatten)]
        common: Common,
    },
    /// Close a session and release its grants.
    #[command(after_help = EXIT_CODES)]
    Close {
        /// The session id.
        id: String,
        #[command(flatten)]
        common: Common,
    },
    /// List the open sessions.
    #[command(after_help = EXIT_CODES)]
    List {
        #[command(flatten)]
        common: Common,
    },
    /// Show one session and its grants.
    #[command(after_help = EXIT_CODES)]
    Get {
        /// The session id.
        id: String,
        #[command(flatten)]
        common: Common,
    },
}

/// Runs an `allot quota` command; `before` holds the options given before the command.
pub(crate) async fn quota(command: QuotaCommand, before: &Common) -> anyhow::Result<ExitCode> {
    dispatch(
        command,
        before,
        |command| match command {
            QuotaCommand::List { common }
            | QuotaCommand::Get { common, .. }
            | QuotaCommand::Set { common, .. }
            | QuotaCommand::Rm { common, .. }
            | QuotaCommand::Waiters { common, .. } => common,
        },
        |command| async move { run_quota(&command).await },
    )
    .await
}

/// Runs an `allot token` command; `before` holds the options given before the command.
pub(crate) async fn token(command: TokenCommand, before: &Common) -> anyhow::Result<ExitCode> {
    dispatch(
        command,
        before,
        |command| match command {
            TokenCommand::Alloc { common, .. }
            | TokenCommand::Release { common, .. }
            | TokenCommand::Keepalive { common, .. }
            | TokenCommand::List { common, .. }
            | TokenCommand::Get { common, .. } => common,
        },
        |command| async move { run_token(&command).await },
    )
    .await
}

/// Runs an `allot session` command; `before` holds the options given before the command.
pub(crate) async fn session(command: SessionCommand, before: &Common) -> anyhow::Result<ExitCode> {
    dispatch(
        command,
        before,
        |command| match command {
            SessionCommand::Open { common, .. }
            | SessionCommand::Keepalive { common, .. }
            | SessionCommand::Close { common, .. }
            | SessionCommand::List { common }
            | SessionCommand::Get { common, .. } => common,
        },
        |command| async move { run_session(&command).await },
    )
    .await
}

async fn run_quota(command: &QuotaCommand) -> Result<u8, ClientError> {
    match command {
        QuotaCommand::List { common } => {
            let answer = client(common)?.namespaces().await?;
            emit(common, &answer, |list| namespace_table(&list.namespaces))
        }
        QuotaCommand::Get { namespace, common } => {
            let answer = client(common)?.namespace(namespace).await?;
            emit(common, &answer, namespace_details)
        }
        QuotaCommand::Set { namespace, quota, common } => {
            let answer = client(common)?.put_namespace(namespace, *quota).await?;
            emit(common, &answer, |answer| {
                let ns = &answer.namespace;
                if answer.created {
                    format!("created namespace {} with quota {}\n", show(&ns.name), ns.quota)
                } else {
                    format!("set quota of {} to {} ({} granted)\n", show(&ns.name), ns.quota, units(ns.granted_units))
                }
            })
        }
        QuotaCommand::Rm { namespace, force, common } => {
            let answer = client(common)?.remove_namespace(namespace, *force).await?;
            emit(common, &answer, |answer| {
                let mut line = format!("removed namespace {}", show(&answer.name));
                if answer.grants_ended > 0 {
                    let _ = write!(line, " ({} ended)", count(answer.grants_ended, "grant", "grants"));
                }
                line + "\n"
            })
        }
        QuotaCommand::Waiters { namespace, common } => {
            let answer = client(common)?.waiters(namespace).await?;
            emit(common, &answer, |list| {
                if list.waiters.is_empty() {
                    return format!("no waiters in {}\n", show(namespace));
                }
                let mut table = Table::new(&[
                    ("POSITION", Align::Right),
                    ("TOKEN", Align::Left),
                    ("UNITS", Align::Right),
                    ("UNITS AHEAD", Align::Right),
                    ("WAITED", Align::Right),
                    ("PROJECT", Align::Left),
                    ("NAMESPACE SCOPE", Align::Left),
                    ("BLOCKED BY", Align::Left),
                ]);
                for waiter in &list.waiters {
                    let (project, scope_namespace) = scope_columns(waiter.scope.as_ref());
                    table.row(vec![
                        waiter.position.to_string(),
                        show(&waiter.token),
                        waiter.units.to_string(),
                        waiter.units_ahead.to_string(),
                        format_ms(waiter.waited_ms),
                        project,
                        scope_namespace,
                        match waiter.blocked_by_cap {
                            None => "quota".to_owned(),
                            Some(level) => format!("{} cap", cap_level(level)),
                        },
                    ]);
                }
                table.render()
            })
        }
    }
}

async fn run_token(command: &TokenCommand) -> Result<u8, ClientError> {
    match command {
        TokenCommand::Alloc {
            namespace,
            token,
            units,
            project,
            scope_namespace,
            project_cap,
            namespace_cap,
            ttl,
            session,
            wait,
            common,
        } => {
            let scope = match (project, scope_namespace) {
                (Some(project), Some(namespace)) => {
                    Some(Scope { project: project.clone(), namespace: namespace.clone() })
                }
                _ => None,
            };
            let caps = (project_cap.is_some() || namespace_cap.is_some())
                .then_some(Caps { project: *project_cap, namespace: *namespace_cap });
            let request = Allocate {
                units: Some(*units),
                scope,
                caps,
                ttl_ms: ttl.map(millis),
                session: session.clone(),
                wait_ms: wait.map(millis),
            };
            let client = client(common)?;
            let answer = allocate_waiting(&client, namespace, token, &request).await?;
            // A quota of 0 is a pause, not a full namespace: said so (one more read, on refusal).
            let paused =
                answer.status == Status::Exhausted && client.namespace(namespace).await.is_ok_and(|ns| ns.quota == 0);
            emit(common, &answer, |answer| match paused {
                true => format!("exhausted: namespace {} is paused (its quota is 0)\n", show(namespace)),
                false => allocate_line(answer),
            })?;
            Ok(match answer.status {
                Status::Granted => EXIT_OK,
                Status::Exhausted => EXIT_EXHAUSTED,
                Status::NamespaceQuotaExceeded => EXIT_NAMESPACE_QUOTA_EXCEEDED,
            })
        }
        TokenCommand::Release { namespace, token, fencing, common } => {
            let answer = client(common)?.release(namespace, token, *fencing).await?;
            let ids = if answer.released { vec![token.clone()] } else { Vec::new() };
            emit_ids(common, &answer, ids, |answer| match &answer.grant {
                Some(grant) if answer.released => format!(
                    "released {} token {} ({}, fencing {})\n",
                    show(&grant.namespace),
                    show(&grant.token),
                    units(grant.units),
                    grant.fencing
                ),
                _ if answer.released => format!("released {} token {}\n", show(namespace), show(token)),
                _ => format!("{} token {} was not granted: nothing to release\n", show(namespace), show(token)),
            })
        }
        TokenCommand::Keepalive { namespace, token, fencing, common } => {
            let answer = client(common)?.keepalive_grant(namespace, token, *fencing).await?;
            emit(common, &answer, |grant| {
                format!(
                    "kept alive {} token {} (fencing {}, {})\n",
                    show(&grant.namespace),
                    show(&grant.token),
                    grant.fencing,
                    lease(grant)
                )
            })
        }
        TokenCommand::List { namespace, common } => {
            let answer = client(common)?.grants(namespace).await?;
            emit(common, &answer, |list| {
                if list.grants.is_empty() {
                    return format!("no grants in {}\n", show(namespace));
                }
                let mut table = Table::new(&[
                    ("TOKEN", Align::Left),
                    ("UNITS", Align::Right),
                    ("FENCING", Align::Right),
                    ("PROJECT", Align::Left),
                    ("NAMESPACE SCOPE", Align::Left),
                    ("TTL", Align::Right),
                    ("EXPIRES IN", Align::Right),
                    ("SESSION", Align::Left),
                ]);
                for grant in &list.grants {
                    let (project, scope_namespace) = scope_columns(grant.scope.as_ref());
                    table.row(vec![
                        show(&grant.token),
                        grant.units.to_string(),
                        grant.fencing.to_string(),
                        project,
                        scope_namespace,
                        grant.ttl_ms.map_or_else(|| "-".to_owned(), format_ms),
                        grant.expires_in_ms.map_or_else(|| "-".to_owned(), format_ms),
                        grant.session.as_deref().map_or_else(|| "-".to_owned(), show),
                    ]);
                }
                table.render()
            })
        }
        TokenCommand::Get { namespace, token, common } => {
            let answer = client(common)?.grant(namespace, token).await?;
            emit(common, &answer, grant_details)
        }
    }
}

async fn run_session(command: &SessionCommand) -> Result<u8, ClientError> {
    match command {
        SessionCommand::Open { ttl, common } => {
            let answer = client(common)?.open_session(millis(*ttl)).await?;
            emit(common, &answer, |session| {
                format!("opened session {} (ttl {})\n", show(&session.id), format_ms(session.ttl_ms))
            })
        }
        SessionCommand::Keepalive { id, common } => {
            let answer = client(common)?.keepalive_session(id).await?;
            emit(common, &answer, |session| {
                format!("kept alive session {} (expires in {})\n", show(&session.id), format_ms(session.expires_in_ms))
            })
        }
        SessionCommand::Close { id, common } => {
            let answer = client(common)?.close_session(id).await?;
            emit(common, &answer, |session| {
                format!(
                    "closed session {} ({} released)\n",
                    show(&session.id),
                    count(session.grants.len() as u64, "grant", "grants")
                )
            })
        }
        SessionCommand::List { common } => {
            let answer = client(common)?.sessions().await?;
            emit(common, &answer, |list| {
                if list.sessions.is_empty() {
                    return "no sessions\n".to_owned();
                }
                let mut table = Table::new(&[
                    ("ID", Align::Left),
                    ("TTL", Align::Right),
                    ("EXPIRES IN", Align::Right),
                    ("GRANTS", Align::Right),
                ]);
                for session in &list.sessions {
                    table.row(vec![
                        show(&session.id),
                        format_ms(session.ttl_ms),
                        format_ms(session.expires_in_ms),
                        session.grants.len().to_string(),
                    ]);
                }
                table.render()
            })
        }
        SessionCommand::Get { id, common } => {
            let answer = client(common)?.session(id).await?;
            emit(common, &answer, session_details)
        }
    }
}

// What `-q` prints for each answer: the ids it names.
ids!(
    Namespace => |it| vec![it.name.clone()],
    NamespaceList => |it| it.namespaces.iter().map(|ns| ns.name.clone()).collect(),
    PutNamespaceResponse => |it| it.namespace.ids(),
    RemovedNamespace => |it| vec![it.name.clone()],
    WaiterList => |it| it.waiters.iter().map(|waiter| waiter.token.clone()).collect(),
    Grant => |it| vec![it.token.clone()],
    GrantList => |it| it.grants.iter().map(|grant| grant.token.clone()).collect(),
    // The token when granted; nothing otherwise (the exit code says why).
    AllocateResponse => |it| it.grant.iter().map(|grant| grant.token.clone()).collect(),
    Session => |it| vec![it.id.clone()],
    SessionList => |it| it.sessions.iter().map(|session| session.id.clone()).collect(),
);

/// Allocates; with a wait, rides out a daemon that restarts or goes away meanwhile.
///
/// Once the daemon was reached, a wait is over early when the connection closes or is refused (a
/// crash or restart), the daemon answers 503, or it ends the wait before `wait_ms` with a place in
/// the queue (a daemon answers a waiter that way only when it shuts down). Then this says so on
/// stderr, once per outage, and sends the same allocate again with backoff for the time left:
/// allocate is idempotent (a grant made meanwhile is answered again), though the place in the
/// queue is lost. When the time is up, the last answer or error stands.
async fn allocate_waiting(
    client: &Client,
    namespace: &str,
    token: &str,
    request: &Allocate,
) -> Result<AllocateResponse, ClientError> {
    let Some(wait_ms) = request.wait_ms else {
        return client.allocate(namespace, token, request).await;
    };
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    let mut pause = Duration::from_millis(100);
    // Whether the daemon answered or held a request once; whether this outage was reported.
    let (mut reached, mut reported) = (false, false);
    loop {
        let left = millis(deadline.saturating_duration_since(Instant::now()));
        let sent = Instant::now();
        let outcome = client.allocate(namespace, token, &Allocate { wait_ms: Some(left), ..request.clone() }).await;
        // `went_away`: the daemon took the request and then ended it: a new outage begins.
        let (reason, refused, went_away) = match &outcome {
            // The daemon's wait starts after `sent`, so a wait that ran its course is never early.
            Ok(answer)
                if answer.status != Status::Granted
                    && answer.queue.is_some()
                    && sent.elapsed() < Duration::from_millis(left) =>
            {
                ("it ended the wait early: it is shutting down".to_owned(), false, true)
            }
            Err(err) if err.is_retryable() && !err.is_timeout() => {
                let refused = matches!(err, ClientError::Http(http) if http.is_connect());
                (err.to_string(), refused, matches!(err, ClientError::Http(_)) && !refused)
            }
            _ => return outcome,
        };
        // A daemon that was never reached is not restarting: the address may be wrong.
        if refused && !reached {
            return outcome;
        }
        reached = true;
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return outcome;
        }
        if went_away || !reported {
            eprintln!(
                "note: the daemon at {} restarted or went away while waiting ({reason}); retrying the wait for the \
                 {} left (allocate is idempotent; the place in the queue is not kept)",
                client.base_url(),
                format_ms(millis(left))
            );
            reported = true;
            pause = Duration::from_millis(100);
        }
        tokio::time::sleep(pause.min(left)).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

fn allocate_line(answer: &AllocateResponse) -> String {
    let queue = answer.queue.map(|QueuePlace { position, units_ahead }| {
        format!("position {position} in queue, {} ahead", units(units_ahead))
    });
    let mut line = match answer.status {
        Status::Granted => match &answer.grant {
            Some(grant) => format!(
                "{} {} token {} ({}, fencing {}, {})",
                if answer.existing { "already granted" } else { "granted" },
                show(&grant.namespace),
                show(&grant.token),
                units(grant.units),
                grant.fencing,
                lease(grant)
            ),
            None => "granted".to_owned(),
        },
        Status::Exhausted => match queue {
            Some(queue) => format!("exhausted: namespace quota full ({queue})"),
            None => "exhausted: namespace quota full".to_owned(),
        },
        Status::NamespaceQuotaExceeded => {
            let (head, mut details) = match &answer.cap {
                Some(CapRefusal { level, cap, held }) => (
                    format!("namespace quota exceeded: {} cap {cap} full", cap_level(*level)),
                    vec![format!("{held} held")],
                ),
                None => ("namespace quota exceeded: a cap is full".to_owned(), Vec::new()),
            };
            details.extend(queue);
            if details.is_empty() {
                head
            } else {
                format!("{head} ({})", details.join("; "))
            }
        }
    };
    line.push('\n');
    line
}

/// A namespace's free units; `paused` for a quota of 0 (nothing is granted until it is raised).
fn free_text(ns: &Namespace) -> String {
    match ns.quota {
        0 => "paused".to_owned(),
        quota => quota.saturating_sub(ns.granted_units).to_string(),
    }
}

fn namespace_table(namespaces: &[Namespace]) -> String {
    if namespaces.is_empty() {
        return "no namespaces\n".to_owned();
    }
    let mut table = Table::new(&[
        ("NAMESPACE", Align::Left),
        ("QUOTA", Align::Right),
        ("GRANTED", Align::Right),
        ("FREE", Align::Right),
        ("GRANTS", Align::Right),
        ("WAITERS", Align::Right),
        ("WAITING", Align::Right),
        ("LONGEST WAIT", Align::Right),
    ]);
    for ns in namespaces {
        table.row(vec![
            show(&ns.name),
            ns.quota.to_string(),
            ns.granted_units.to_string(),
            free_text(ns),
            ns.grants.to_string(),
            ns.waiters.to_string(),
            ns.waiting_units.to_string(),
            if ns.waiters == 0 { "-".to_owned() } else { format_ms(ns.longest_wait_ms) },
        ]);
    }
    table.render()
}

fn namespace_details(ns: &Namespace) -> String {
    key_values(&[
        ("namespace", show(&ns.name)),
        ("quota", ns.quota.to_string()),
        ("granted units", ns.granted_units.to_string()),
        ("free units", free_text(ns)),
        ("grants", ns.grants.to_string()),
        ("waiters", ns.waiters.to_string()),
        ("waiting units", ns.waiting_units.to_string()),
        ("longest wait", if ns.waiters == 0 { "-".to_owned() } else { format_ms(ns.longest_wait_ms) }),
        ("next fencing", ns.next_fencing.to_string()),
    ])
}

fn grant_details(grant: &Grant) -> String {
    let (project, scope_namespace) = scope_columns(grant.scope.as_ref());
    key_values(&[
        ("namespace", show(&grant.namespace)),
        ("token", show(&grant.token)),
        ("units", grant.units.to_string()),
        ("fencing", grant.fencing.to_string()),
        ("project", project),
        ("namespace scope", scope_namespace),
        ("ttl", grant.ttl_ms.map_or_else(|| "-".to_owned(), format_ms)),
        ("session", grant.session.as_deref().map_or_else(|| "-".to_owned(), show)),
        ("expires in", grant.expires_in_ms.map_or_else(|| "never".to_owned(), format_ms)),
        ("held by", grant.held_by.as_deref().map_or_else(|| "-".to_owned(), show)),
    ])
}

fn session_details(session: &Session) -> String {
    let mut text = key_values(&[
        ("session", show(&session.id)),
        ("ttl", format_ms(session.ttl_ms)),
        ("expires in", format_ms(session.expires_in_ms)),
        ("grants", session.grants.len().to_string()),
    ]);
    if !session.grants.is_empty() {
        let mut table = Table::new(&[("  NAMESPACE", Align::Left), ("TOKEN", Align::Left)]);
        for grant in &session.grants {
            table.row(vec![format!("  {}", show(&grant.namespace)), show(&grant.token)]);
        }
        text.push_str(&table.render());
    }
    text
}

/// "2 units, fencing 7"-style lease part: "expires in 30s", "session ID", or "no lease".
fn lease(grant: &Grant) -> String {
    let mut parts = Vec::new();
    if let Some(expires_in_ms) = grant.expires_in_ms {
        parts.push(format!("expires in {}", format_ms(expires_in_ms)));
    }
    if let Some(session) = &grant.session {
        parts.push(format!("session {}", show(session)));
    }
    if parts.is_empty() {
        "no lease".to_owned()
    } else {
        parts.join(", ")
    }
}

fn scope_columns(scope: Option<&Scope>) -> (String, String) {
    match scope {
        Some(scope) => (show(&scope.project), show(&scope.namespace)),
        None => ("-".to_owned(), "-".to_owned()),
    }
}

fn cap_level(level: CapLevel) -> &'static str {
    match level {
        CapLevel::Project => "project",
        CapLevel::Namespace => "namespace scope",
    }
}

fn units(n: u64) -> String {
    count(n, "unit", "units")
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_lines() {
        let grant = Grant {
            namespace: "hive:a".to_owned(),
            token: "t1".to_owned(),
            units: 2,
            scope: None,
            fencing: 7,
            ttl_ms: Some(30_000),
            session: None,
            expires_in_ms: Some(30_000),
            held_by: None,
        };
        let granted =
            AllocateResponse { status: Status::Granted, grant: Some(grant), existing: false, cap: None, queue: None };
        assert_eq!(allocate_line(&granted), "granted hive:a token t1 (2 units, fencing 7, expires in 30s)\n");
        let exhausted = AllocateResponse {
            status: Status::Exhausted,
            grant: None,
            existing: false,
            cap: None,
            queue: Some(QueuePlace { position: 2, units_ahead: 3 }),
        };
        assert_eq!(allocate_line(&exhausted), "exhausted: namespace quota full (position 2 in queue, 3 units ahead)\n");
        let capped = AllocateResponse {
            status: Status::NamespaceQuotaExceeded,
            grant: None,
            existing: false,
            cap: Some(CapRefusal { level: CapLevel::Project, cap: 5, held: 5 }),
            queue: None,
        };
        assert_eq!(allocate_line(&capped), "namespace quota exceeded: project cap 5 full (5 held)\n");
    }
}
