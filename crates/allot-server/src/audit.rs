//! The audit trail: every change (a call other than `GET` and `HEAD`) and every refusal (401,
//! 403) is one JSON line: time, principal, source address, request ids (the daemon's own, and
//! the caller's `X-Request-Id` when it sent one), action, resource (what a creation made, else
//! the path), outcome and status; each item of a batch that was refused is a line of its own.
//! Lines go to a file of their own (reopened on [`Audit::reopen`], which the daemon calls on
//! SIGHUP, for log rotation) or to the log's stream (stderr), as they are.
//!
//! Invariants: a line is written after its call is answered (within tens of milliseconds), by a
//! thread of its own (a call never waits for the disk); lines are written in the order their calls were answered on each
//! serving thread; a token never appears in a line.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::SystemTime;

use axum::http::{HeaderValue, Method};

use crate::access::Caller;

/// Where the audit trail goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditSink {
    /// The log's stream (stderr), a JSON line each, between the log's lines.
    Log,
    /// A file, appended to, reopened on SIGHUP.
    File(PathBuf),
}

/// What the serving thread hands the writer: the call and when it was answered (the line is
/// formatted by the writer).
#[derive(Debug)]
struct Answered {
    call: Call,
    at: SystemTime,
    status: u16,
    noted: Noted,
}

/// What an answer tells the audit trail beyond its path (set by the handler as a response
/// extension): what a creation made, and the items of a batch that were refused.
#[derive(Debug, Clone, Default)]
pub(crate) struct Noted {
    /// The resource made: `apps/ID in queue root.a`, `sessions/ID`, `api-tokens/NAME`.
    pub made: Option<String>,
    /// Each refused item of a batch: the resource it named.
    pub refused: Vec<String>,
}

impl Answered {
    /// Appends the call's lines (JSON objects, each with a newline) to `out`: its own, and one
    /// per refused item of a batch (status 403).
    fn write_lines(&self, out: &mut Vec<u8>) {
        self.write_line(out, self.noted.made.as_deref().unwrap_or(&self.call.path), self.status);
        for item in &self.noted.refused {
            self.write_line(out, item, 403);
        }
    }

    /// One line: `time` (RFC 3339, UTC, to the millisecond), `principal` (null for a call that
    /// named none, or without access configured), `source`, `request_id` (and
    /// `caller_request_id`), `action` (the method and the route, or the path if no route
    /// matched), `resource`, `outcome` (`ok`, `refused` for 401 and 403, `failed` for any other
    /// error) and `status`.
    fn write_line(&self, out: &mut Vec<u8>, resource: &str, status: u16) {
        let call = &self.call;
        let principal = match &call.caller {
            Some(Caller::Principal(principal)) => Some(principal.user.as_str()),
            _ => None,
        };
        let text = |out: &mut Vec<u8>, value: &str| serde_json::to_writer(&mut *out, value).expect("a string encodes");
        let _ = write!(out, "{{\"time\":\"{}\",\"principal\":", humantime::format_rfc3339_millis(self.at));
        match principal {
            Some(user) => text(out, user),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"source\":");
        match call.source {
            Some(addr) => {
                let _ = write!(out, "\"{addr}\"");
            }
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"request_id\":");
        text(out, &call.request_id);
        if let Some(given) = &call.caller_request_id {
            out.extend_from_slice(b",\"caller_request_id\":");
            text(out, given);
        }
        out.extend_from_slice(b",\"action\":");
        text(out, &format!("{} {}", call.method, call.route.as_deref().unwrap_or(&call.path)));
        out.extend_from_slice(b",\"resource\":");
        text(out, resource);
        let _ = writeln!(out, ",\"outcome\":\"{}\",\"status\":{}}}", outcome(status), status);
    }
}

/// How long the writer lets lines gather before it writes them: one wake-up and one write for
/// many calls (each wake-up costs the serving threads a system call).
const GATHER: std::time::Duration = std::time::Duration::from_millis(10);

/// Whether a call is audited: a change, or any call refused.
pub(crate) fn audited(method: &Method, status: u16) -> bool {
    !matches!(*method, Method::GET | Method::HEAD) || status == 401 || status == 403
}

pub(crate) fn outcome(status: u16) -> &'static str {
    match status {
        200..=399 => "ok",
        401 | 403 => "refused",
        _ => "failed",
    }
}

/// The audit trail's writer.
#[derive(Debug)]
pub struct Audit {
    lines: mpsc::Sender<Answered>,
    reopen: Arc<AtomicBool>,
    /// Request ids: this daemon's random base, then a count.
    base: u64,
    next_id: AtomicU64,
}

impl Audit {
    /// Starts the writer of `sink` (a file is opened now: an error here stops the daemon's start).
    pub fn start(sink: AuditSink) -> std::io::Result<Audit> {
        let (lines, incoming) = mpsc::channel::<Answered>();
        let reopen = Arc::new(AtomicBool::new(false));
        let file = match &sink {
            AuditSink::Log => None,
            AuditSink::File(path) => Some((path.clone(), open(path)?)),
        };
        let reopen_asked = reopen.clone();
        std::thread::Builder::new()
            .name("allot-audit".into())
            .spawn(move || write_lines(incoming, file, reopen_asked))?;
        Ok(Audit { lines, reopen, base: rand::random::<u64>() & 0xffff_ffff_0000_0000, next_id: AtomicU64::new(1) })
    }

    /// Reopens the file before the next line (after it was moved by log rotation).
    pub fn reopen(&self) {
        self.reopen.store(true, Ordering::Relaxed);
    }

    /// The daemon's own id of a call: unique on this daemon, hard to guess across.
    pub(crate) fn request_id(&self) -> String {
        format!("{:016x}", self.base | (self.next_id.fetch_add(1, Ordering::Relaxed) & 0xffff_ffff))
    }

    /// The caller's `X-Request-Id`, when it is one a line can carry (1 to 128 visible ASCII
    /// characters, no quote or backslash).
    pub(crate) fn caller_request_id(given: Option<&HeaderValue>) -> Option<String> {
        let given = given.and_then(|value| value.to_str().ok()).filter(|id| {
            !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
        });
        given.map(str::to_owned)
    }

    /// Records a call (the thread writes it).
    pub(crate) fn record(&self, call: Call, status: u16, noted: Noted) {
        let _ = self.lines.send(Answered { call, at: SystemTime::now(), status, noted });
    }
}

/// What is known of a call before it is answered.
#[derive(Debug)]
pub(crate) struct Call {
    pub method: Method,
    pub path: String,
    pub route: Option<std::borrow::Cow<'static, str>>,
    pub caller: Option<Caller>,
    pub source: Option<SocketAddr>,
    /// The daemon's own id.
    pub request_id: String,
    /// The caller's `X-Request-Id`, if it sent one.
    pub caller_request_id: Option<String>,
}

/// The route a call matched, set on its answer by the router (and the hot path).
#[derive(Debug, Clone)]
pub(crate) struct Route(pub std::borrow::Cow<'static, str>);

fn open(path: &PathBuf) -> std::io::Result<BufWriter<File>> {
    let file = OpenOptions::new().create(true).append(true).open(path)?;
    Ok(BufWriter::new(file))
}

fn write_lines(
    incoming: mpsc::Receiver<Answered>,
    mut file: Option<(PathBuf, BufWriter<File>)>,
    reopen: Arc<AtomicBool>,
) {
    let mut lines = Vec::with_capacity(64 << 10);
    while let Ok(first) = incoming.recv() {
        if reopen.swap(false, Ordering::Relaxed) {
            if let Some((path, writer)) = &mut file {
                let _ = writer.flush();
                match open(path) {
                    Ok(reopened) => *writer = reopened,
                    Err(err) => tracing::error!(error = %err, path = %path.display(), "cannot reopen the audit log"),
                }
            }
        }
        // Everything waiting goes in one write.
        lines.clear();
        for answered in std::iter::once(first).chain(incoming.try_iter()) {
            answered.write_lines(&mut lines);
        }
        let written = match &mut file {
            // The log's own stream: the lines as they are, between the log's.
            None => std::io::stderr().lock().write_all(&lines),
            Some((_, writer)) => writer.write_all(&lines).and_then(|()| writer.flush()),
        };
        if let Err(err) = written {
            let path = file.as_ref().map_or_else(|| "stderr".to_owned(), |(path, _)| path.display().to_string());
            tracing::error!(error = %err, path, "cannot write the audit trail");
        }
        // Not waiting on the channel meanwhile: the calls answered now send without waking it.
        std::thread::sleep(GATHER);
    }
}
