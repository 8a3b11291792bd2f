//! [`ClientError`]: everything that can go wrong with a call to the daemon.

use std::error::Error as _;
use std::fmt;

/// Why a call to the daemon failed.
///
/// An answer that the daemon gave on purpose (a 4xx or 5xx with an error body) is an
/// [`Api`](ClientError::Api) error; its `code` is one of the stable codes listed in the API spec,
/// e.g. `namespace_not_found`. Everything else means the answer never arrived or made no sense.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The daemon refused the request: its HTTP status and error body.
    #[error("{code}: {message} (HTTP {status})")]
    Api {
        /// The HTTP status, e.g. 404.
        status: u16,
        /// The stable machine-readable code, e.g. `namespace_not_found`. An error answer without
        /// an allot error body (e.g. from a proxy in between) gets the code `unexpected_response`.
        code: String,
        /// The message for people.
        message: String,
    },
    /// The request could not be sent or its answer not received: connection refused, timeout, ...
    #[error("{}", http_chain(.0))]
    Http(reqwest::Error),
    /// The daemon answered with a success status but a body this client cannot read.
    #[error("cannot decode the daemon's answer: {0}")]
    Decode(String),
    /// The base URL or a path built from the arguments is not a usable URL.
    #[error("invalid URL: {0}")]
    InvalidUrl(String),
    /// A CA certificate or client certificate given to the client cannot be used.
    #[error("invalid TLS material: {0}")]
    InvalidTls(String),
}

impl ClientError {
    /// The HTTP status of an [`Api`](ClientError::Api) error.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The error code of an [`Api`](ClientError::Api) error, e.g. `grant_not_found`.
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// The error code of an [`Api`](ClientError::Api) error, typed: `None` for another error or a
    /// code this client does not know (a newer daemon's).
    pub fn error_code(&self) -> Option<allot_api::ErrorCode> {
        self.code().and_then(allot_api::ErrorCode::parse)
    }

    /// True when repeating the same request may succeed: the daemon could not be reached, did
    /// not answer in time, or answered 503 (its store is unavailable or it is shutting down).
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Api { status, .. } => *status == 503,
            ClientError::Http(err) => err.is_connect() || err.is_timeout() || err.is_request(),
            _ => false,
        }
    }

    /// True when the request timed out (including a long poll whose answer came too late).
    pub fn is_timeout(&self) -> bool {
        matches!(self, ClientError::Http(err) if err.is_timeout())
    }
}

impl From<reqwest::Error> for ClientError {
    fn from(err: reqwest::Error) -> ClientError {
        ClientError::Http(err)
    }
}

/// reqwest's own message is terse ("error sending request for url (...)"): the useful part, such
/// as "Connection refused", is in its sources, so the message carries the whole chain (and the
/// error has no `source()` of its own, so reporters do not print the chain twice).
fn http_chain(err: &reqwest::Error) -> String {
    let mut text = match err.url() {
        Some(url) if err.is_timeout() => format!("request to {url} timed out"),
        Some(url) if err.is_connect() => format!("cannot connect to {url}"),
        Some(url) => format!("request to {url} failed"),
        None => err.to_string(),
    };
    let mut source = err.source();
    while let Some(cause) = source {
        let part = cause.to_string();
        if !part.is_empty() && !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = cause.source();
    }
    text
}

/// Shortens a body for an error message.
pub(crate) fn snippet(body: &[u8]) -> String {
    const MAX: usize = 200;
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.chars().count() <= MAX {
        return text.to_owned();
    }
    let mut short: String = text.chars().take(MAX).collect();
    short.push_str("...");
    short
}

/// Wraps a reason in a `Decode` error that says which request it was.
pub(crate) fn decode_error(what: impl fmt::Display, reason: impl fmt::Display, body: &[u8]) -> ClientError {
    ClientError::Decode(format!("{what}: {reason}; body: {}", snippet(body)))
}
