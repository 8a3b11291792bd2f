//! `allot watch`: every change the daemon makes, as it makes it, one line per event (`--json`: one
//! JSON object per line), through `Client::watch`, which reconnects and resumes by itself. Ctrl-C
//! (or a reader that goes away, `allot watch | head`) ends it cleanly.

use std::io::Write as _;
use std::process::ExitCode;

use allot_client::{ClientError, WatchEvent, WatchFilter, WatchObject};
use futures_util::StreamExt;

use super::{client, dispatch, format_ms, human, or_dash, show, Common, EXIT_OK};

/// `allot watch --help`'s epilogue: what it prints, and its exit codes.
pub(crate) const AFTER_HELP: &str = "\
Each line: the revision, the kind, the object's key, why (where a kind has several causes, in
parentheses) and what the object is now, e.g.
  3145729  grant.granted   namespaces/hive/grants/t1  units=2 fencing=1 ttl=1m
  4194305  grant.released  namespaces/hive/grants/t1  (released) units=2 fencing=1
With --json, one event per line as the daemon sends it: {\"revision\", \"kind\", \"key\", \"cause\",
\"at_ms\", \"object\"}. With --quiet, only the keys.

A watch resumes by itself, from its last revision, when the connection is cut or the daemon
restarts. To pick up where an earlier watch stopped, give --since its last revision.

Exit codes:
  0  ended by Ctrl-C, or by the reader of its output going away
  1  error: the daemon refused the watch (`error: <code>: <message>` on stderr), e.g.
     revision_compacted: the events after --since are no longer kept (the message names the
     oldest revision kept; watch again without --since, or from a later one), or it could not
     be reached for a minute
  2  usage error";

#[derive(Debug, clap::Args)]
pub(crate) struct WatchArgs {
    /// Only changes of this kind, e.g. `grant.granted` (repeat, or separate kinds with `,`; the
    /// daemon lists them all when one is unknown); default: every kind.
    #[arg(long = "kind", value_name = "KIND")]
    kinds: Vec<String>,
    /// Only changes of keys under this prefix, e.g. `namespaces/hive` (the namespace, those under
    /// it, their grants), `pools/p`, `queues/root.a`, `apps/etl` (repeat for several).
    #[arg(long = "prefix", value_name = "PREFIX")]
    prefixes: Vec<String>,
    /// Start after this revision (an earlier line's, or a list's `Allot-Revision`); default: from
    /// now.
    #[arg(long, value_name = "REV")]
    since: Option<u64>,
    #[command(flatten)]
    common: Common,
}

/// Runs `allot watch`; `before` holds the options given before the command.
pub(crate) async fn watch(args: WatchArgs, before: &Common) -> anyhow::Result<ExitCode> {
    dispatch(args, before, |args| &mut args.common, follow).await
}

async fn follow(args: WatchArgs) -> Result<u8, ClientError> {
    let client = client(&args.common)?;
    let kinds = args.kinds.iter().flat_map(|kinds| kinds.split(',')).map(str::trim);
    let filter = WatchFilter {
        kinds: kinds.filter(|kind| !kind.is_empty()).map(str::to_owned).collect(),
        prefixes: args.prefixes,
    };
    let mut events = client.watch(filter, args.since);
    let mut stop = std::pin::pin!(tokio::signal::ctrl_c());
    loop {
        let event = tokio::select! {
            _ = &mut stop => return Ok(EXIT_OK),
            event = events.next() => event,
        };
        let Some(event) = event else { return Ok(EXIT_OK) };
        let line = line(&args.common, &event?).map_err(|err| ClientError::Decode(err.to_string()))?;
        let mut stdout = std::io::stdout().lock();
        if let Err(err) = stdout.write_all(line.as_bytes()).and_then(|()| stdout.flush()) {
            // A reader that went away (`allot watch | head -3`) ends the watch.
            if err.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(EXIT_OK);
            }
            eprintln!("error: cannot write to stdout: {err}");
            return Ok(super::EXIT_ERROR);
        }
    }
}

/// How an event prints.
fn line(common: &Common, event: &WatchEvent) -> Result<String, serde_json::Error> {
    if common.json {
        return Ok(serde_json::to_string(event)? + "\n");
    }
    if common.quiet {
        return Ok(format!("{}\n", event.key));
    }
    let mut line = format!("{}  {}  {}", event.revision, event.kind, show(&event.key));
    if let Some(cause) = &event.cause {
        line += &format!("  ({cause})");
    }
    let summary = summary(&event.object);
    if !summary.is_empty() {
        line += if event.cause.is_some() { " " } else { "  " };
        line += &summary;
    }
    Ok(line + "\n")
}

/// What an event's object is now, in a few words.
fn summary(object: &WatchObject) -> String {
    let ms = |ms: Option<u64>| ms.map(format_ms);
    let words: Vec<Option<String>> = match object {
        WatchObject::Namespace(n) => vec![
            Some(format!("quota={}", n.quota)),
            Some(format!("granted={}", n.granted_units)),
            Some(format!("grants={}", n.grants)),
            (n.waiters > 0).then(|| format!("waiters={}", n.waiters)),
        ],
        WatchObject::Grant(g) => vec![
            Some(format!("units={}", g.units)),
            Some(format!("fencing={}", g.fencing)),
            ms(g.ttl_ms).map(|ttl| format!("ttl={ttl}")),
            g.session.as_ref().map(|session| format!("session={session}")),
        ],
        WatchObject::Waiter(_) => vec![],
        WatchObject::Session(s) => {
            vec![Some(format!("ttl={}", format_ms(s.ttl_ms))), Some(format!("grants={}", s.grants.len()))]
        }
        WatchObject::Pool(p) => vec![
            Some(format!("capacity={}", or_dash(&p.capacity))),
            Some(format!("allocated={}", or_dash(&p.allocated))),
            Some(format!("allocs={}", p.allocs)),
            p.stopped.then(|| "stopped".to_owned()),
        ],
        WatchObject::Alloc(a) => vec![
            Some(human(&a.resources)),
            (!a.owner.is_empty()).then(|| format!("owner={}", show(&a.owner))),
            a.held_by.as_ref().map(|holder| format!("held_by={holder}")),
        ],
        WatchObject::Queue(q) => vec![
            Some(format!("used={}", or_dash(&q.used))),
            q.max.as_deref().map(|max| format!("max={}", or_dash(max))),
            Some(format!("apps={}", q.apps)),
        ],
        WatchObject::App(a) => vec![Some(a.state.clone()), Some(format!("queue={}", a.queue))],
        WatchObject::Task(t) => vec![
            Some(t.state.clone()),
            t.placement.as_ref().map(|p| format!("on={}", p.uri)),
            t.reason.as_ref().map(|reason| format!("reason={}", show(reason))),
        ],
        WatchObject::Run(r) => vec![
            Some(format!("attempt={}", r.attempt)),
            Some(format!("phase={}", r.phase)),
            r.ending.as_ref().map(|ending| format!("ending={}", show(ending))),
        ],
        WatchObject::Gone => vec![],
        WatchObject::Other(value) => vec![Some(value.to_string())],
    };
    words.into_iter().flatten().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_says_revision_kind_key_cause_and_what_the_object_is() {
        let grant = allot_client::Grant {
            namespace: "hive".into(),
            token: "t1".into(),
            units: 2,
            scope: None,
            fencing: 1,
            ttl_ms: Some(60_000),
            session: None,
            expires_in_ms: None,
            held_by: None,
        };
        let mut event = WatchEvent {
            revision: 7,
            kind: "grant.released".into(),
            key: "namespaces/hive/grants/t1".into(),
            cause: Some("released".into()),
            at_ms: 1,
            object: WatchObject::Grant(grant),
        };
        let people = Common::default();
        assert_eq!(
            line(&people, &event).unwrap(),
            "7  grant.released  namespaces/hive/grants/t1  (released) units=2 fencing=1 ttl=1m\n"
        );
        let json = Common { json: true, ..Common::default() };
        let text = line(&json, &event).unwrap();
        assert!(text.ends_with("}\n") && text.matches('\n').count() == 1, "{text}");
        assert_eq!(serde_json::from_str::<WatchEvent>(&text).unwrap(), event);
        event.cause = None;
        event.object = WatchObject::Gone;
        assert_eq!(line(&people, &event).unwrap(), "7  grant.released  namespaces/hive/grants/t1\n");
    }
}
