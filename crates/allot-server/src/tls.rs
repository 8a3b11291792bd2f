//! HTTPS: the daemon's certificate and key (PEM), re-read when their files change or on
//! [`Tls::reload`] (SIGHUP) without dropping a connection, and optionally client certificates
//! checked against a CA (mutual TLS), whose subject names a principal: the common name is the
//! user, the organizations its groups (as Kubernetes reads them).
//!
//! Invariants: a reload that fails keeps the configuration that worked (and says why in the
//! log); a handshake runs on a task of its own with a time limit, so a slow client delays no
//! other; a client certificate from another CA is not refused by the handshake but answered by
//! the HTTP layer (401, saying why), as a token would be.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use axum::serve::Listener;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{DistinguishedName, RootCertStore, ServerConfig, SignatureScheme};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::connection_limit::{Admitted, Slot};

/// The longest a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the certificate's files are looked at for a change.
const WATCH_EVERY: Duration = Duration::from_secs(2);

/// Where the daemon's TLS material is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Ask clients for a certificate signed by this CA (PEM).
    pub client_ca: Option<PathBuf>,
}

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("{path} holds no {what} in PEM")]
    Empty { path: PathBuf, what: &'static str },
    #[error("the TLS configuration is refused: {0}")]
    Config(String),
}

/// Who a client certificate says the caller is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientCert {
    /// Signed by the configured CA: its subject's common name and organizations.
    Verified { user: String, groups: Vec<String> },
    /// Presented, but not valid for the configured CA (the reason).
    Refused(String),
}

/// The TLS side of the server: the configuration in use, swapped whole on a reload.
#[derive(Debug)]
pub struct Tls {
    files: TlsFiles,
    config: RwLock<Arc<ServerConfig>>,
    /// Checks a client's certificate after the handshake (with a client CA).
    verifier: Option<Arc<dyn ClientCertVerifier>>,
    stamp: RwLock<Vec<Option<SystemTime>>>,
}

impl Tls {
    pub fn load(files: TlsFiles) -> Result<Tls, TlsError> {
        let (config, verifier) = build(&files)?;
        let stamp = RwLock::new(stamps(&files));
        Ok(Tls { files, config: RwLock::new(Arc::new(config)), verifier, stamp })
    }

    /// Reads the files again; on failure the configuration in use stays.
    pub fn reload(&self) {
        match build(&self.files) {
            Ok((config, _)) => {
                *self.config.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(config);
                *self.stamp.write().unwrap_or_else(|p| p.into_inner()) = stamps(&self.files);
                tracing::info!(cert = %self.files.cert.display(), "TLS certificate and key loaded again");
            }
            Err(err) => tracing::error!(error = %err, "cannot load the TLS certificate again; keeping the one in use"),
        }
    }

    /// Reloads whenever a file's modification time changes, until the process ends.
    pub fn watch_files(self: &Arc<Tls>) {
        let tls = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(WATCH_EVERY).await;
                let Some(tls) = tls.upgrade() else { return };
                let now = stamps(&tls.files);
                let changed = *tls.stamp.read().unwrap_or_else(|p| p.into_inner()) != now;
                if changed {
                    tls.reload();
                    // Even if it failed: wait for the next change.
                    *tls.stamp.write().unwrap_or_else(|p| p.into_inner()) = now;
                }
            }
        });
    }

    fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config.read().unwrap_or_else(|p| p.into_inner()).clone())
    }

    /// What the client's certificate says, if it presented one.
    fn client_cert(&self, certs: Option<&[CertificateDer<'static>]>) -> Option<ClientCert> {
        let (verifier, certs) = (self.verifier.as_ref()?, certs?);
        let (end, intermediates) = certs.split_first()?;
        if let Err(err) = verifier.verify_client_cert(end, intermediates, UnixTime::now()) {
            return Some(ClientCert::Refused(err.to_string()));
        }
        Some(match subject(end) {
            Some((user, groups)) => ClientCert::Verified { user, groups },
            None => ClientCert::Refused("the certificate's subject has no common name".to_owned()),
        })
    }
}

fn stamps(files: &TlsFiles) -> Vec<Option<SystemTime>> {
    [Some(&files.cert), Some(&files.key), files.client_ca.as_ref()]
        .into_iter()
        .flatten()
        .map(|path| std::fs::metadata(path).and_then(|m| m.modified()).ok())
        .collect()
}

fn read_pem(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { path: path.to_owned(), source })
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read_pem(path)?;
    let certs = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Read { path: path.to_owned(), source })?;
    if certs.is_empty() {
        return Err(TlsError::Empty { path: path.to_owned(), what: "certificate" });
    }
    Ok(certs)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read_pem(path)?;
    rustls_pemfile::private_key(&mut pem.as_slice())
        .map_err(|source| TlsError::Read { path: path.to_owned(), source })?
        .ok_or_else(|| TlsError::Empty { path: path.to_owned(), what: "private key" })
}

fn build(files: &TlsFiles) -> Result<(ServerConfig, Option<Arc<dyn ClientCertVerifier>>), TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let (builder, verifier) = match &files.client_ca {
        None => (builder.with_no_client_auth(), None),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates(ca)? {
                roots.add(cert).map_err(|e| TlsError::Config(format!("{}: {e}", ca.display())))?;
            }
            let strict: Arc<dyn ClientCertVerifier> =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(|e| TlsError::Config(e.to_string()))?;
            let lenient = Arc::new(Lenient(strict.clone()));
            (builder.with_client_cert_verifier(lenient), Some(strict))
        }
    };
    let mut config = builder
        .with_single_cert(certificates(&files.cert)?, private_key(&files.key)?)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((config, verifier))
}

/// The subject's common name and organizations.
fn subject(cert: &CertificateDer<'_>) -> Option<(String, Vec<String>)> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let subject = parsed.subject();
    let user = subject.iter_common_name().next()?.as_str().ok()?.to_owned();
    let groups = subject.iter_organization().filter_map(|o| o.as_str().ok().map(str::to_owned)).collect();
    Some((user, groups))
}

/// Takes any client certificate at the handshake (the signature over the handshake is still
/// checked: the client holds the certificate's key); whether the CA signed it is checked after,
/// so that a wrong one gets an HTTP answer that says so.
#[derive(Debug)]
struct Lenient(Arc<dyn ClientCertVerifier>);

impl ClientCertVerifier for Lenient {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.0.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// Where a connection comes from, set on each of its requests (`ConnectInfo<Peer>`).
#[derive(Debug, Clone)]
pub struct Peer {
    pub addr: SocketAddr,
    /// The client certificate's word on who it is (with mutual TLS).
    pub client: Option<ClientCert>,
    /// The connection's slot among those allowed open: the server takes it out of the peer and
    /// holds it while it serves the connection; a request's copy has none.
    pub(crate) slot: Option<Arc<Slot>>,
}

/// A connection, plain or over TLS.
pub type Conn = tokio_util::either::Either<TcpStream, Box<tokio_rustls::server::TlsStream<TcpStream>>>;

/// A listener of TCP connections (set to `TCP_NODELAY`), served plain or after a TLS handshake.
pub struct Accepting<L> {
    inner: L,
    tls: Option<Arc<Tls>>,
    handshaken: mpsc::UnboundedSender<(Conn, Peer)>,
    ready: mpsc::UnboundedReceiver<(Conn, Peer)>,
}

impl<L> Accepting<L> {
    pub fn new(inner: L, tls: Option<Arc<Tls>>) -> Accepting<L> {
        let (handshaken, ready) = mpsc::unbounded_channel();
        Accepting { inner, tls, handshaken, ready }
    }

    /// The listener, given back (handshakes under way are dropped with their connections).
    pub fn into_inner(self) -> L {
        self.inner
    }
}

impl<L> Listener for Accepting<L>
where
    L: Listener<Io = TcpStream>,
    L::Addr: Into<Admitted>,
{
    type Io = Conn;
    type Addr = Peer;

    async fn accept(&mut self) -> (Conn, Peer) {
        loop {
            tokio::select! {
                (stream, admitted) = self.inner.accept() => {
                    let Admitted { addr, slot } = admitted.into();
                    let slot = slot.map(Arc::new);
                    // Answers are small and each one ends a request: send them at once.
                    if let Err(err) = stream.set_nodelay(true) {
                        tracing::debug!(error = %err, "cannot set TCP_NODELAY");
                    }
                    let Some(tls) = self.tls.clone() else {
                        return (Conn::Left(stream), Peer { addr, client: None, slot });
                    };
                    let handshaken = self.handshaken.clone();
                    tokio::spawn(async move {
                        let acceptor = tls.acceptor();
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                            Ok(Ok(stream)) => {
                                let client = tls.client_cert(stream.get_ref().1.peer_certificates());
                                let _ = handshaken.send((Conn::Right(Box::new(stream)), Peer { addr, client, slot }));
                            }
                            Ok(Err(err)) => tracing::debug!(error = %err, %addr, "TLS handshake failed"),
                            Err(_) => tracing::debug!(%addr, "TLS handshake timed out"),
                        }
                    });
                }
                Some(ready) = self.ready.recv() => return ready,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Peer> {
        Ok(Peer { addr: self.inner.local_addr()?.into().addr, client: None, slot: None })
    }
}
