//! The audit trail: every change (a call other than `GET` and `HEAD`) and every refusal (401,
//! 403) is one JSON line: time, principal, source address, request id, action, resource,
//! outcome and status. Lines go to a file of their own (reopened on [`Audit::reopen`], which
//! the daemon calls on SIGHUP, for log rotation) or to the log (target `allot::audit`).
//!
//! Invariants: a line is written after its call is answered, by a thread of its own (a call never
//! waits for the disk); lines are written in the order their calls were answered on each
//! serving thread; a token never appears in a line.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write as _};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::SystemTime;

use axum::http::{HeaderValue, Method};
use serde::Serialize;

use crate::access::Caller;

/// Where the audit trail goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditSink {
    /// The log, at `info`, target `allot::audit`.
    Log,
    /// A file, appended to, reopened on SIGHUP.
    File(PathBuf),
}

/// One audited call.
#[derive(Debug, Serialize)]
pub(crate) struct Line {
    /// RFC 3339, in UTC, to the millisecond.
    pub time: String,
    /// The user, or null for a call that named none (or without access configured).
    pub principal: Option<String>,
    pub source: Option<String>,
    pub request_id: String,
    /// The method and the route (`PUT /v1/namespaces/{namespace}`), or the path if no route
    /// matched.
    pub action: String,
    /// The path the call named.
    pub resource: String,
    /// `ok`, `refused` (401, 403) or `failed` (any other error).
    pub outcome: &'static str,
    pub status: u16,
}

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
    lines: mpsc::Sender<Line>,
    reopen: Arc<AtomicBool>,
    /// Request ids: this daemon's random base, then a count.
    base: u64,
    next_id: AtomicU64,
}

impl Audit {
    /// Starts the writer of `sink` (a file is opened now: an error here stops the daemon's start).
    pub fn start(sink: AuditSink) -> std::io::Result<Audit> {
        let (lines, incoming) = mpsc::channel::<Line>();
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

    /// A request id for a call that brought none: unique on this daemon, hard to guess across.
    pub(crate) fn request_id(&self, given: Option<&HeaderValue>) -> String {
        let given = given.and_then(|value| value.to_str().ok()).filter(|id| {
            !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
        });
        match given {
            Some(id) => id.to_owned(),
            None => format!("{:016x}", self.base | (self.next_id.fetch_add(1, Ordering::Relaxed) & 0xffff_ffff)),
        }
    }

    /// Records a call (the thread writes it).
    pub(crate) fn record(&self, call: Call, status: u16) {
        let principal = match call.caller {
            Some(Caller::Principal(principal)) => Some(principal.user),
            _ => None,
        };
        let line = Line {
            time: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            principal,
            source: call.source.map(|addr| addr.to_string()),
            request_id: call.request_id,
            action: format!("{} {}", call.method, call.route.as_deref().unwrap_or(&call.path)),
            resource: call.path,
            outcome: outcome(status),
            status,
        };
        let _ = self.lines.send(line);
    }
}

/// What is known of a call before it is answered.
#[derive(Debug)]
pub(crate) struct Call {
    pub method: Method,
    pub path: String,
    pub route: Option<String>,
    pub caller: Option<Caller>,
    pub source: Option<SocketAddr>,
    pub request_id: String,
}

/// The route a call matched, set on its answer by the router (and the hot path).
#[derive(Debug, Clone)]
pub(crate) struct Route(pub String);

fn open(path: &PathBuf) -> std::io::Result<BufWriter<File>> {
    let file = OpenOptions::new().create(true).append(true).open(path)?;
    Ok(BufWriter::new(file))
}

fn write_lines(incoming: mpsc::Receiver<Line>, mut file: Option<(PathBuf, BufWriter<File>)>, reopen: Arc<AtomicBool>) {
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
        for line in std::iter::once(first).chain(incoming.try_iter()) {
            let text = serde_json::to_string(&line).expect("a line serializes");
            match &mut file {
                None => tracing::info!(target: "allot::audit", "{text}"),
                Some((path, writer)) => {
                    if let Err(err) = writer.write_all(text.as_bytes()).and_then(|()| writer.write_all(b"\n")) {
                        tracing::error!(error = %err, path = %path.display(), "cannot write the audit log");
                    }
                }
            }
        }
        if let Some((path, writer)) = &mut file {
            if let Err(err) = writer.flush() {
                tracing::error!(error = %err, path = %path.display(), "cannot write the audit log");
            }
        }
    }
}
