//! One benchmark client's HTTP/1.1 connection: a single keep-alive TCP connection driven by hyper's
//! low-level client (no pool), plus the parsing of server URLs and percent-encoding of path segments.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{bail, Context};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::{Connection, SendRequest};
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Where a server listens: `http://host:port` and an optional path prefix.
#[derive(Debug, Clone)]
pub(super) struct Endpoint {
    /// `host:port`, for connecting and for the `Host` header.
    pub(super) authority: String,
    /// A path prefix without a trailing `/` (usually empty).
    pub(super) prefix: String,
}

impl Endpoint {
    /// Parses `http://host[:port][/prefix]`; a URL without a scheme is taken as `http://`.
    pub(super) fn parse(url: &str) -> anyhow::Result<Endpoint> {
        let url = url.trim();
        let rest = match url.split_once("://") {
            Some(("http", rest)) => rest,
            Some((scheme, _)) => bail!("`{url}`: only http:// URLs are supported, not {scheme}://"),
            None => url,
        };
        let (authority, path) = match rest.find('/') {
            Some(at) => (&rest[..at], &rest[at..]),
            None => (rest, ""),
        };
        if authority.is_empty() {
            bail!("`{url}` has no host");
        }
        let authority = if authority.rsplit_once(':').is_some_and(|(_, port)| port.parse::<u16>().is_ok()) {
            authority.to_owned()
        } else {
            format!("{authority}:80")
        };
        Ok(Endpoint { authority, prefix: path.trim_end_matches('/').to_owned() })
    }

    /// The endpoint's URL, for people.
    pub(super) fn url(&self) -> String {
        format!("http://{}{}", self.authority, self.prefix)
    }
}

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request may take unless [`Conn::with_timeout`] says otherwise.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// One keep-alive HTTP/1.1 connection; requests on it are sent one at a time.
pub(super) struct Conn {
    endpoint: Endpoint,
    sender: SendRequest<Full<Bytes>>,
    /// Driven inside `send`, in the caller's task: no hand-off to another task per request.
    connection: std::pin::Pin<Box<Connection<TokioIo<TcpStream>, Full<Bytes>>>>,
    /// Set once the connection has ended; it must not be polled again.
    closed: bool,
    timeout: Duration,
}

impl Conn {
    /// Opens a connection (TCP_NODELAY on); it is driven by the requests sent on it.
    pub(super) async fn connect(endpoint: &Endpoint) -> anyhow::Result<Conn> {
        let stream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&endpoint.authority)).await {
            Ok(connected) => connected.with_context(|| format!("cannot connect to {}", endpoint.url()))?,
            Err(_) => bail!("cannot connect to {} within {CONNECT_TIMEOUT:?}", endpoint.url()),
        };
        stream.set_nodelay(true)?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .with_context(|| format!("HTTP handshake with {} failed", endpoint.url()))?;
        Ok(Conn {
            endpoint: endpoint.clone(),
            sender,
            connection: Box::pin(connection),
            closed: false,
            timeout: DEFAULT_TIMEOUT,
        })
    }

    pub(super) fn with_timeout(mut self, timeout: Duration) -> Conn {
        self.timeout = timeout;
        self
    }

    /// Sends one request (`path` below the endpoint's prefix; a JSON `body` if not empty) and reads
    /// the whole answer, within the connection's timeout.
    pub(super) async fn request(
        &mut self,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> anyhow::Result<(StatusCode, Bytes)> {
        let timeout = self.timeout;
        let what = format!("{method} {path}");
        match tokio::time::timeout(timeout, self.send(method, path, body)).await {
            Ok(answer) => answer.with_context(|| what),
            Err(_) => Err(anyhow::anyhow!("{what}: no answer within {timeout:?}")),
        }
    }

    async fn send(&mut self, method: Method, path: &str, body: Bytes) -> anyhow::Result<(StatusCode, Bytes)> {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.endpoint.prefix))
            .header(HOST, &self.endpoint.authority);
        if !body.is_empty() {
            request = request.header(CONTENT_TYPE, "application/json");
        }
        let request = request.body(Full::new(body))?;
        if self.closed {
            bail!("the connection is closed");
        }
        let sender = &mut self.sender;
        let exchange = async move {
            sender.ready().await.context("the connection is closed")?;
            let response = sender.send_request(request).await?;
            let status = response.status();
            let body = response.into_body().collect().await?.to_bytes();
            anyhow::Ok((status, body))
        };
        tokio::select! {
            answer = exchange => answer,
            ended = self.connection.as_mut() => {
                self.closed = true;
                match ended {
                    Ok(()) => Err(anyhow::anyhow!("the server closed the connection")),
                    Err(err) => Err(anyhow::Error::new(err).context("the connection failed")),
                }
            }
        }
    }
}

/// Percent-encodes one path segment: everything but RFC 3986 unreserved characters.
pub(super) fn encode_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        let e = Endpoint::parse("http://127.0.0.1:7070").unwrap();
        assert_eq!((e.authority.as_str(), e.prefix.as_str()), ("127.0.0.1:7070", ""));
        let e = Endpoint::parse("localhost:8000/").unwrap();
        assert_eq!((e.authority.as_str(), e.prefix.as_str()), ("localhost:8000", ""));
        let e = Endpoint::parse("http://example.com/allot/").unwrap();
        assert_eq!((e.authority.as_str(), e.prefix.as_str()), ("example.com:80", "/allot"));
        assert!(Endpoint::parse("https://example.com").is_err());
        assert!(Endpoint::parse("http:///x").is_err());
    }

    #[test]
    fn segments() {
        assert_eq!(encode_segment("bench-1.c_2~"), "bench-1.c_2~");
        assert_eq!(encode_segment("hive:a b/é"), "hive%3Aa%20b%2F%C3%A9");
    }
}
