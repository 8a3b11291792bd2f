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
    fn write_lines(&self, out: &mut Vec<u8>, time: &mut TimeText) {
        self.write_line(out, time, self.noted.made.as_deref().unwrap_or(&self.call.path), self.status);
        for item in &self.noted.refused {
            self.write_line(out, time, item, 403);
        }
    }

    /// One line: `time` (RFC 3339, UTC, to the millisecond), `principal` (null for a call that
    /// named none, or without access configured), `source`, `request_id` (and
    /// `caller_request_id`), `action` (the method and the route, or the path if no route
    /// matched), `resource`, `outcome` (`ok`, `refused` for 401 and 403, `failed` for any other
    /// error) and `status`.
    fn write_line(&self, out: &mut Vec<u8>, time: &mut TimeText, resource: &str, status: u16) {
        let call = &self.call;
        let principal = match &call.caller {
            Some(Caller::Principal(principal)) => Some(principal.user.as_str()),
            _ => None,
        };
        let text = |out: &mut Vec<u8>, value: &str| serde_json::to_writer(&mut *out, value).expect("a string encodes");
        out.extend_from_slice(b"{\"time\":\"");
        time.write(out, self.at);
        out.extend_from_slice(b"\",\"principal\":");
        match principal {
            Some(user) => text(out, user),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"source\":");
        match call.source {
            Some(SocketAddr::V4(addr)) => {
                let mut number = itoa::Buffer::new();
                out.push(b'"');
                for (i, octet) in addr.ip().octets().into_iter().enumerate() {
                    if i > 0 {
                        out.push(b'.');
                    }
                    out.extend_from_slice(number.format(octet).as_bytes());
                }
                out.push(b':');
                out.extend_from_slice(number.format(addr.port()).as_bytes());
                out.push(b'"');
            }
            Some(addr) => {
                let _ = write!(out, "\"{addr}\"");
            }
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"request_id\":\"");
        out.extend_from_slice(&call.request_id.hex());
        out.push(b'"');
        if let Some(given) = &call.caller_request_id {
            // Visible ASCII without quote or backslash (see `Audit::caller_request_id`).
            out.extend_from_slice(b",\"caller_request_id\":\"");
            out.extend_from_slice(given.as_bytes());
            out.push(b'"');
        }
        out.extend_from_slice(b",\"action\":\"");
        text_within(out, call.method.as_str());
        out.push(b' ');
        text_within(out, call.route.as_deref().unwrap_or(&call.path));
        out.push(b'"');
        out.extend_from_slice(b",\"resource\":");
        text(out, resource);
        out.extend_from_slice(b",\"outcome\":\"");
        out.extend_from_slice(outcome(status).as_bytes());
        out.extend_from_slice(b"\",\"status\":");
        out.extend_from_slice(itoa::Buffer::new().format(status).as_bytes());
        out.extend_from_slice(b"}\n");
    }
}

/// Appends `value` JSON-encoded, without its quotes (to join parts in one string).
fn text_within(out: &mut Vec<u8>, value: &str) {
    let at = out.len();
    serde_json::to_writer(&mut *out, value).expect("a string encodes");
    out.pop();
    out.remove(at);
}

/// The time of a line, RFC 3339 in UTC to the millisecond: the text up to the second is kept
/// and written again while the second lasts (most lines share it).
#[derive(Default)]
struct TimeText {
    second: Option<u64>,
    /// `YYYY-MM-DDTHH:MM:SS.` of `second`.
    prefix: Vec<u8>,
}

impl TimeText {
    fn write(&mut self, out: &mut Vec<u8>, at: SystemTime) {
        let since = at.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        let second = since.as_secs();
        if self.second != Some(second) {
            self.prefix.clear();
            let whole = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(second);
            let _ = write!(self.prefix, "{}", humantime::format_rfc3339_seconds(whole));
            // `...SSZ` to `...SS.`
            self.prefix.pop();
            self.prefix.push(b'.');
            self.second = Some(second);
        }
        out.extend_from_slice(&self.prefix);
        let millis = since.subsec_millis();
        out.extend_from_slice(&[
            b'0' + (millis / 100) as u8,
            b'0' + (millis / 10 % 10) as u8,
            b'0' + (millis % 10) as u8,
        ]);
        out.push(b'Z');
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
    pub(crate) fn request_id(&self) -> RequestId {
        RequestId(self.base | (self.next_id.fetch_add(1, Ordering::Relaxed) & 0xffff_ffff))
    }

    /// The caller's `X-Request-Id`, when it is one a line can carry (1 to 128 visible ASCII
    /// characters, no quote or backslash).
    pub(crate) fn caller_request_id(given: Option<&HeaderValue>) -> Option<HeaderValue> {
        given
            .filter(|id| {
                let id = id.as_bytes();
                !id.is_empty()
                    && id.len() <= 128
                    && id.iter().all(|b| b.is_ascii_graphic() && *b != b'"' && *b != b'\\')
            })
            .cloned()
    }

    /// Records a call (the thread writes it).
    pub(crate) fn record(&self, call: Call, status: u16, noted: Noted) {
        let _ = self.lines.send(Answered { call, at: SystemTime::now(), status, noted });
    }
}

/// The daemon's own id of a call, written as 16 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RequestId(u64);

impl RequestId {
    pub(crate) fn hex(self) -> [u8; 16] {
        allot_core::names::hex_digits(self.0)
    }

    /// The id as a header's value.
    pub(crate) fn header(self) -> HeaderValue {
        HeaderValue::from_bytes(&self.hex()).expect("hex digits make a header value")
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
    pub request_id: RequestId,
    /// The caller's `X-Request-Id`, if it sent one.
    pub caller_request_id: Option<HeaderValue>,
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
    let mut time = TimeText::default();
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
            answered.write_lines(&mut lines, &mut time);
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_lines_time_is_rfc3339_to_the_millisecond_across_seconds() {
        let mut time = TimeText::default();
        for (seconds, millis) in
            [(0, 0), (1_764_563_410, 5), (1_764_563_410, 999), (1_764_563_411, 40), (1_764_563_410, 120)]
        {
            let at = SystemTime::UNIX_EPOCH + Duration::from_secs(seconds) + Duration::from_millis(millis);
            let mut out = Vec::new();
            time.write(&mut out, at);
            assert_eq!(String::from_utf8(out).unwrap(), humantime::format_rfc3339_millis(at).to_string());
        }
    }

    #[test]
    fn a_line_is_one_json_object_with_every_field() {
        let call = |source: Option<SocketAddr>, given: Option<&str>| Answered {
            call: Call {
                method: Method::PUT,
                path: "/v1/namespaces/hive/grants/a\"b".to_owned(),
                route: Some("/v1/namespaces/{namespace}/grants/{token}".into()),
                caller: Some(Caller::Principal(allot_core::access::Principal::new("ann", ["ops"]))),
                source,
                request_id: RequestId(0x01c3_3be0_0000_002a),
                caller_request_id: Audit::caller_request_id(
                    given.map(HeaderValue::from_str).transpose().unwrap().as_ref(),
                ),
            },
            at: SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_563_410_007),
            status: 403,
            noted: Noted { made: None, refused: vec!["namespaces/other".into()] },
        };
        let mut time = TimeText::default();
        let mut out = Vec::new();
        call(Some("127.0.0.1:41180".parse().unwrap()), Some("job-7")).write_lines(&mut out, &mut time);
        call(Some("[::1]:8080".parse().unwrap()), Some("has\"quote")).write_lines(&mut out, &mut time);
        let lines: Vec<serde_json::Value> =
            String::from_utf8(out).unwrap().lines().map(|line| serde_json::from_str(line).unwrap()).collect();
        assert_eq!(lines.len(), 4, "each call's line and one per refused item");
        assert_eq!(
            lines[0],
            serde_json::json!({
                "time": "2025-12-01T04:30:10.007Z",
                "principal": "ann",
                "source": "127.0.0.1:41180",
                "request_id": "01c33be00000002a",
                "caller_request_id": "job-7",
                "action": "PUT /v1/namespaces/{namespace}/grants/{token}",
                "resource": "/v1/namespaces/hive/grants/a\"b",
                "outcome": "refused",
                "status": 403,
            })
        );
        assert_eq!(lines[1]["resource"], "namespaces/other");
        assert_eq!(lines[2]["source"], "[::1]:8080");
        assert!(lines[2].get("caller_request_id").is_none(), "an id with a quote is not carried");
    }

    #[test]
    fn a_request_id_is_sixteen_hex_digits() {
        assert_eq!(&RequestId(0x0123_4567_89ab_cdef).hex(), b"0123456789abcdef");
        assert_eq!(RequestId(42).header(), "000000000000002a");
    }
}
