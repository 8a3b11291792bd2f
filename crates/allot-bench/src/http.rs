//! One benchmark client's HTTP/1.1 connection, plus the parsing of server URLs and
//! percent-encoding of path segments.
//!
//! The client is a plain keep-alive connection that writes each request in one piece and parses
//! the answer with `httparse`: the load generator shares the machine with the server it measures,
//! so every microsecond it spends is taken from the server.

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::{Buf, BytesMut};
use hyper::body::Bytes;
use hyper::{Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Where a server listens: `http://host:port` and an optional path prefix.
#[derive(Debug, Clone)]
pub(super) struct Endpoint {
    /// `host:port`, for connecting and for the `Host` header.
    pub(super) authority: String,
    /// A path prefix without a trailing `/` (usually empty).
    pub(super) prefix: String,
    /// Header lines sent with every request (`authorization: Bearer ...\r\n`), or empty.
    pub(super) headers: String,
    /// `https://`: the TLS client configuration (the CA to trust comes with [`Endpoint::with_ca`]).
    pub(super) tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// `https://` was asked for.
    secure: bool,
}

impl Endpoint {
    /// Parses `http://host[:port][/prefix]`; a URL without a scheme is taken as `http://`.
    pub(super) fn parse(url: &str) -> anyhow::Result<Endpoint> {
        let url = url.trim();
        let (rest, secure) = match url.split_once("://") {
            Some(("http", rest)) => (rest, false),
            Some(("https", rest)) => (rest, true),
            Some((scheme, _)) => bail!("`{url}`: only http:// and https:// URLs are supported, not {scheme}://"),
            None => (url, false),
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
            format!("{authority}:{}", if secure { 443 } else { 80 })
        };
        let prefix = path.trim_end_matches('/').to_owned();
        Ok(Endpoint { authority, prefix, headers: String::new(), tls: None, secure })
    }

    /// The same, trusting the CA certificate `pem` for an `https://` server.
    pub(super) fn with_ca(mut self, pem: &[u8]) -> anyhow::Result<Endpoint> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_pemfile::certs(&mut &pem[..]) {
            roots.add(cert.context("a CA certificate")?).context("a CA certificate")?;
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        self.tls = Some(std::sync::Arc::new(config));
        Ok(self)
    }

    /// The same, with `token` sent as the bearer of every request.
    pub(super) fn with_token(mut self, token: &str) -> Endpoint {
        self.headers = format!("authorization: Bearer {token}\r\n");
        self
    }

    /// The endpoint's URL, for people.
    pub(super) fn url(&self) -> String {
        let scheme = if self.secure { "https" } else { "http" };
        format!("{scheme}://{}{}", self.authority, self.prefix)
    }
}

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request may take unless [`Conn::with_timeout`] says otherwise.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The most header lines an answer may have.
const MAX_HEADERS: usize = 32;
/// The largest answer head and body the client accepts: a bound against a runaway answer, above
/// the largest a benchmark asks for (`apps --one-call --tasks 100000` is answered with about 30 MB).
const MAX_ANSWER_BYTES: usize = 256 << 20;

/// One keep-alive HTTP/1.1 connection; requests on it are sent one at a time.
pub(super) struct Conn {
    endpoint: Endpoint,
    /// `None` once the connection failed or the server closed it.
    stream: Option<Stream>,
    /// The request being written, kept to reuse its memory.
    out: Vec<u8>,
    /// What was read and not yet consumed.
    input: BytesMut,
    timeout: Duration,
    /// When its last exchange ended: a connection idle for [`REOPEN_AFTER`] is opened again
    /// before its next request, as an HTTP client's pool drops idle connections (the daemon
    /// closes one idle for its `--idle-timeout`, 2 minutes by default).
    used: std::time::Instant,
}

/// How long a connection may stay idle before it is opened again for its next request.
const REOPEN_AFTER: Duration = Duration::from_secs(30);

/// A connection, plain or over TLS.
pub(super) type Stream = tokio_util::either::Either<TcpStream, Box<tokio_rustls::client::TlsStream<TcpStream>>>;

/// A connection to `endpoint` (TCP_NODELAY on), over TLS for an `https://` one.
pub(super) async fn open_stream(endpoint: &Endpoint) -> anyhow::Result<Stream> {
    let stream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&endpoint.authority)).await {
        Ok(connected) => connected.with_context(|| format!("cannot connect to {}", endpoint.url()))?,
        Err(_) => bail!("cannot connect to {} within {CONNECT_TIMEOUT:?}", endpoint.url()),
    };
    stream.set_nodelay(true)?;
    Ok(match (&endpoint.tls, endpoint.secure) {
        (Some(config), true) => {
            let host = endpoint.authority.rsplit_once(':').map_or(endpoint.authority.as_str(), |(host, _)| host);
            let name = rustls::pki_types::ServerName::try_from(host.to_owned()).context("the server's name")?;
            let connector = tokio_rustls::TlsConnector::from(config.clone());
            Stream::Right(Box::new(connector.connect(name, stream).await.context("the TLS handshake")?))
        }
        (None, true) => bail!("{}: an https:// server needs its CA (Endpoint::with_ca)", endpoint.url()),
        _ => Stream::Left(stream),
    })
}

/// The head of an answer: its status, the length of the head and how the body is framed.
struct Head {
    status: StatusCode,
    len: usize,
    body: Framing,
    close: bool,
}

enum Framing {
    Length(usize),
    Chunked,
    /// The body runs until the server closes the connection.
    UntilClose,
}

impl Conn {
    /// Opens a connection (TCP_NODELAY on).
    pub(super) async fn connect(endpoint: &Endpoint) -> anyhow::Result<Conn> {
        let stream = open_stream(endpoint).await?;
        Ok(Conn {
            endpoint: endpoint.clone(),
            stream: Some(stream),
            out: Vec::with_capacity(512),
            input: BytesMut::with_capacity(8192),
            timeout: DEFAULT_TIMEOUT,
            used: std::time::Instant::now(),
        })
    }

    pub(super) fn with_timeout(mut self, timeout: Duration) -> Conn {
        self.timeout = timeout;
        self
    }

    /// Sends one request (`path` below the endpoint's prefix; a JSON `body` if not empty) and reads
    /// the whole answer, within the connection's timeout. After a failure the connection is closed.
    pub(super) async fn request(
        &mut self,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> anyhow::Result<(StatusCode, Bytes)> {
        let timeout = self.timeout;
        if self.stream.is_some() && self.used.elapsed() >= REOPEN_AFTER {
            self.input.clear();
            self.stream = Some(open_stream(&self.endpoint).await.with_context(|| format!("{method} {path}"))?);
        }
        let answer = match tokio::time::timeout(timeout, self.exchange(&method, path, &body)).await {
            Ok(answer) => answer,
            Err(_) => Err(anyhow::anyhow!("no answer within {timeout:?}")),
        };
        self.used = std::time::Instant::now();
        answer.map_err(|err| {
            self.stream = None;
            err.context(format!("{method} {path}"))
        })
    }

    async fn exchange(&mut self, method: &Method, path: &str, body: &[u8]) -> anyhow::Result<(StatusCode, Bytes)> {
        self.out.clear();
        let _ = write!(
            self.out,
            "{method} {}{path} HTTP/1.1\r\nhost: {}\r\ncontent-length: {}\r\n",
            self.endpoint.prefix,
            self.endpoint.authority,
            body.len()
        );
        if !body.is_empty() {
            self.out.extend_from_slice(b"content-type: application/json\r\n");
        }
        self.out.extend_from_slice(self.endpoint.headers.as_bytes());
        self.out.extend_from_slice(b"\r\n");
        self.out.extend_from_slice(body);
        let stream = self.stream.as_mut().context("the connection is closed")?;
        stream.write_all(&self.out).await.context("cannot send the request")?;
        let head = loop {
            if let Some(head) = parse_head(&self.input)? {
                break head;
            }
            read_more(stream, &mut self.input).await?;
        };
        self.input.advance(head.len);
        let body = match head.body {
            Framing::Length(n) => {
                while self.input.len() < n {
                    read_more(stream, &mut self.input).await?;
                }
                self.input.split_to(n).freeze()
            }
            Framing::Chunked => read_chunked(stream, &mut self.input).await?,
            Framing::UntilClose => {
                while stream.read_buf(&mut self.input).await.context("cannot read the answer")? > 0 {
                    if self.input.len() > MAX_ANSWER_BYTES {
                        bail!("the answer is larger than {MAX_ANSWER_BYTES} bytes");
                    }
                }
                self.stream = None;
                self.input.split().freeze()
            }
        };
        if head.close {
            self.stream = None;
        }
        Ok((head.status, body))
    }
}

/// Reads what the server sent next; the server closing the connection is an error.
async fn read_more(stream: &mut Stream, input: &mut BytesMut) -> anyhow::Result<()> {
    if input.len() > MAX_ANSWER_BYTES {
        bail!("the answer is larger than {MAX_ANSWER_BYTES} bytes");
    }
    input.reserve(4096);
    if stream.read_buf(input).await.context("cannot read the answer")? == 0 {
        bail!("the server closed the connection");
    }
    Ok(())
}

/// The answer's head, if `input` holds all of it.
fn parse_head(input: &[u8]) -> anyhow::Result<Option<Head>> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut answer = httparse::Response::new(&mut headers);
    let len = match answer.parse(input).context("the server's answer is not HTTP/1.1")? {
        httparse::Status::Complete(len) => len,
        httparse::Status::Partial => return Ok(None),
    };
    let status = StatusCode::from_u16(answer.code.unwrap_or_default()).context("bad status code")?;
    let (mut length, mut chunked, mut close) = (None, false, false);
    for header in answer.headers.iter() {
        let value = std::str::from_utf8(header.value).unwrap_or_default().trim();
        if header.name.eq_ignore_ascii_case("content-length") {
            length = Some(value.parse::<usize>().context("bad content-length")?);
        } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.eq_ignore_ascii_case("chunked");
        } else if header.name.eq_ignore_ascii_case("connection") {
            close = value.eq_ignore_ascii_case("close");
        }
    }
    let no_body = status.is_informational() || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED;
    let body = match (no_body, chunked, length) {
        (true, _, _) => Framing::Length(0),
        (false, true, _) => Framing::Chunked,
        (false, false, Some(n)) if n <= MAX_ANSWER_BYTES => Framing::Length(n),
        (false, false, Some(n)) => bail!("the answer's body of {n} bytes is too large"),
        (false, false, None) => Framing::UntilClose,
    };
    Ok(Some(Head { status, len, body, close }))
}

/// Reads a chunked body (`size\r\ndata\r\n`... `0\r\n\r\n`, trailers ignored).
async fn read_chunked(stream: &mut Stream, input: &mut BytesMut) -> anyhow::Result<Bytes> {
    let mut body = BytesMut::new();
    loop {
        let (line_len, size) = loop {
            match httparse::parse_chunk_size(input).map_err(|_| anyhow::anyhow!("bad chunk size"))? {
                httparse::Status::Complete(found) => break found,
                httparse::Status::Partial => read_more(stream, input).await?,
            }
        };
        input.advance(line_len);
        let Some(size) = usize::try_from(size).ok().filter(|&size| body.len() + size <= MAX_ANSWER_BYTES) else {
            bail!("the answer is larger than {MAX_ANSWER_BYTES} bytes");
        };
        if size == 0 {
            // Trailers, if any, end with an empty line.
            while skip_line(stream, input).await? > 0 {}
            return Ok(body.freeze());
        }
        while input.len() < size + 2 {
            read_more(stream, input).await?;
        }
        body.extend_from_slice(&input[..size]);
        input.advance(size + 2);
    }
}

/// Consumes one line ending in `\r\n`; returns its length without them.
async fn skip_line(stream: &mut Stream, input: &mut BytesMut) -> anyhow::Result<usize> {
    loop {
        if let Some(at) = input.windows(2).position(|w| w == b"\r\n") {
            input.advance(at + 2);
            return Ok(at);
        }
        read_more(stream, input).await?;
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
        let e = Endpoint::parse("https://example.com").unwrap();
        assert_eq!((e.authority.as_str(), e.url()), ("example.com:443", "https://example.com:443".to_owned()));
        assert!(Endpoint::parse("ftp://example.com").is_err());
        assert!(Endpoint::parse("http:///x").is_err());
    }

    #[test]
    fn segments() {
        assert_eq!(encode_segment("bench-1.c_2~"), "bench-1.c_2~");
        assert_eq!(encode_segment("hive:a b/é"), "hive%3Aa%20b%2F%C3%A9");
    }

    /// A server on a real socket that reads each request whole and answers with the next of
    /// `answers`, split in two writes; it returns the requests it read.
    async fn serve(answers: Vec<&'static [u8]>) -> (Endpoint, tokio::task::JoinHandle<Vec<String>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = Endpoint::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut requests = Vec::new();
            let mut input = BytesMut::new();
            for answer in answers {
                let request = loop {
                    let mut headers = [httparse::EMPTY_HEADER; 16];
                    let mut parsed = httparse::Request::new(&mut headers);
                    if let httparse::Status::Complete(len) = parsed.parse(&input).unwrap() {
                        let length: usize = parsed
                            .headers
                            .iter()
                            .find(|h| h.name == "content-length")
                            .map_or(0, |h| std::str::from_utf8(h.value).unwrap().parse().unwrap());
                        if input.len() >= len + length {
                            break String::from_utf8(input.split_to(len + length).to_vec()).unwrap();
                        }
                    }
                    assert!(socket.read_buf(&mut input).await.unwrap() > 0, "the client hung up");
                };
                requests.push(request);
                let (head, tail) = answer.split_at(answer.len() / 2);
                socket.write_all(head).await.unwrap();
                // The answer in two pieces, apart in time, so the client reads it in two.
                tokio::time::sleep(Duration::from_millis(5)).await;
                socket.write_all(tail).await.unwrap();
            }
            requests
        });
        (endpoint, server)
    }

    #[tokio::test]
    async fn reads_answers_framed_by_length_and_by_chunks_on_one_connection() {
        let (endpoint, server) = serve(vec![
            b"HTTP/1.1 200 OK\r\ncontent-length: 20\r\n\r\n{\"status\":\"Granted\"}",
            b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n3;x=1\r\n:1}\r\n0\r\n\r\n",
            b"HTTP/1.1 204 No Content\r\n\r\n",
        ])
        .await;
        let mut conn = Conn::connect(&endpoint).await.unwrap();
        let body = Bytes::from_static(br#"{"units":1}"#);
        let (status, answer) = conn.request(Method::PUT, "/v1/namespaces/a/grants/t", body).await.unwrap();
        assert_eq!((status, &answer[..]), (StatusCode::OK, &br#"{"status":"Granted"}"#[..]));
        let (status, answer) = conn.request(Method::GET, "/x", Bytes::new()).await.unwrap();
        assert_eq!((status, &answer[..]), (StatusCode::NOT_FOUND, &br#"{"a":1}"#[..]));
        let (status, answer) = conn.request(Method::DELETE, "/v1/namespaces/a/grants/t", Bytes::new()).await.unwrap();
        assert_eq!((status, answer.len()), (StatusCode::NO_CONTENT, 0));
        let requests = server.await.unwrap();
        assert!(requests[0].starts_with("PUT /v1/namespaces/a/grants/t HTTP/1.1\r\n"), "{}", requests[0]);
        assert!(requests[0].contains("content-type: application/json\r\n"));
        assert!(requests[0].ends_with("\r\n\r\n{\"units\":1}"));
        assert!(requests[1].starts_with("GET /x HTTP/1.1\r\n") && !requests[1].contains("content-type"));
    }

    #[tokio::test]
    async fn a_closed_connection_is_an_error_and_stays_closed() {
        let (endpoint, server) =
            serve(vec![b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}"]).await;
        let mut conn = Conn::connect(&endpoint).await.unwrap();
        let (status, _) = conn.request(Method::GET, "/a", Bytes::new()).await.unwrap();
        assert_eq!(status, StatusCode::OK);
        server.await.unwrap();
        let err = conn.request(Method::GET, "/b", Bytes::new()).await.unwrap_err();
        assert!(format!("{err:#}").contains("the connection is closed"), "{err:#}");
    }

    #[test]
    fn refuses_answers_that_are_not_http() {
        assert!(parse_head(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 200 OK\r\ncontent-len").unwrap().is_none());
    }
}
