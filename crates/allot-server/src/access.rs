//! Identity and access at the HTTP edge: who makes a call (a bearer API token names a
//! principal), and whether it may (the permission its route needs, decided by
//! `allot_core::access::Policy`).
//!
//! At length, as one thing: authentication and the route table it is checked against (`Needs`,
//! with each route's permission and home) are the edge's one gate.
//!
//! Invariants: with access configured, every call but `/healthz` and `/readyz` (and, if so
//! configured, `/metrics` and `/openapi.json`) carries a known, unexpired token, or is answered
//! 401; every route declares the one permission it needs (`routes::router` pairs each handler
//! with it), and a route without one is refused, never served. A token is kept only as its
//! SHA-256 hash, and never logged, counted or echoed.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use allot_core::access::{Denied, Kind, Permission, Policy, Principal, Resource};
use axum::extract::{FromRequestParts as _, MatchedPath, RawPathParams, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rand::RngCore as _;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq as _;

use crate::error::{ApiError, ErrorCode};
use crate::tls::ClientCert;
use crate::ServerState;

pub use allot_core::access::{hash_token, TOKEN_PREFIX};

/// A new API token: 32 random bytes from the operating system.
pub fn make_token() -> String {
    let mut secret = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut secret);
    allot_core::access::token_of_secret(&secret)
}

/// A token's hash, parsed from its `sha256:HEX` form.
fn parse_hash(text: &str) -> Option<[u8; 32]> {
    let digits = text.strip_prefix("sha256:")?;
    if digits.len() != 64 {
        return None;
    }
    let mut hash = [0u8; 32];
    for (i, byte) in hash.iter_mut().enumerate() {
        *byte = u8::from_str_radix(digits.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(hash)
}

/// One API token as the daemon knows it: its hash, and whom it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    /// A name to tell tokens apart in lists and in the audit trail (never the token).
    pub name: String,
    pub principal: Principal,
    pub expires: Option<SystemTime>,
    hash: [u8; 32],
    /// Made through the API and kept in the store (it can be revoked while the daemon runs).
    stored: bool,
}

/// Why a credential was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    #[error("token `{0}`'s hash is not `sha256:` and 64 hexadecimal digits (`allot api-token make` prints one)")]
    BadHash(String),
    #[error("token `{0}` names no user")]
    NoUser(String),
    #[error("two tokens are named `{0}`")]
    Duplicate(String),
}

impl Credential {
    pub fn new(
        name: &str,
        hash: &str,
        principal: Principal,
        expires: Option<SystemTime>,
    ) -> Result<Credential, CredentialError> {
        let hash = parse_hash(hash).ok_or_else(|| CredentialError::BadHash(name.to_owned()))?;
        if principal.user.trim().is_empty() {
            return Err(CredentialError::NoUser(name.to_owned()));
        }
        Ok(Credential { name: name.to_owned(), principal, expires, hash, stored: false })
    }

    fn stored(self) -> Credential {
        Credential { stored: true, ..self }
    }
}

/// Which routes are open to calls without a token, besides `/healthz` and `/readyz`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenRoutes {
    pub metrics: bool,
    pub document: bool,
}

/// The daemon's access configuration: the tokens and policy of its file, and those kept in the
/// store (made through the API), read again whenever the store's version of them moves.
#[derive(Debug)]
pub struct Access {
    /// The file's roles and bindings.
    file_policy: Policy,
    /// The file's tokens by the first half of their hash; the whole hash is compared in
    /// constant time.
    file_tokens: HashMap<[u8; 16], Vec<Credential>>,
    open: OpenRoutes,
    /// With the store's tokens and bindings, as last read.
    current: RwLock<Arc<Current>>,
    /// Moves whenever `current` is read again: open streams check that their token still holds.
    changed: tokio::sync::watch::Sender<u64>,
}

/// The policy and tokens in force: the file's, and the store's.
#[derive(Debug)]
struct Current {
    /// The store's version they reflect (0: not read yet).
    version: u64,
    policy: Arc<Policy>,
    stored_tokens: HashMap<[u8; 16], Vec<Credential>>,
}

/// Tokens by the first half of their hash.
fn by_hash(credentials: Vec<Credential>) -> Result<HashMap<[u8; 16], Vec<Credential>>, CredentialError> {
    let mut tokens: HashMap<[u8; 16], Vec<Credential>> = HashMap::new();
    let mut names = std::collections::HashSet::new();
    for credential in credentials {
        if !names.insert(credential.name.clone()) {
            return Err(CredentialError::Duplicate(credential.name));
        }
        let key: [u8; 16] = credential.hash[..16].try_into().expect("16 of 32 bytes");
        tokens.entry(key).or_default().push(credential);
    }
    Ok(tokens)
}

/// The credential of a token's `hash` among `tokens`, compared in constant time.
/// The SHA-256 of a bearer token. Each thread remembers the last token it hashed (a connection
/// sends the same token on every call): a token equal to it, compared in constant time, is not
/// hashed again. Only the hash decides who a token is.
fn token_hash(token: &str) -> [u8; 32] {
    thread_local! {
        static LAST: std::cell::RefCell<(Vec<u8>, [u8; 32])> = const { std::cell::RefCell::new((Vec::new(), [0; 32])) };
    }
    LAST.with_borrow_mut(|(last, hash)| {
        let same = !last.is_empty() && same_bytes(last, token.as_bytes());
        if !same {
            *hash = Sha256::digest(token.as_bytes()).into();
            last.clear();
            last.extend_from_slice(token.as_bytes());
        }
        *hash
    })
}

/// Whether `a` and `b` hold the same bytes, in a time that depends on their lengths only; eight
/// bytes at a time (`subtle` compares slices byte by byte, each behind a barrier: as much CPU as
/// the rest of authenticating a call).
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let ((a_words, a_rest), (b_words, b_rest)) = (a.as_chunks::<8>(), b.as_chunks::<8>());
    let mut diff = 0u64;
    for (x, y) in a_words.iter().zip(b_words) {
        diff |= u64::from_ne_bytes(*x) ^ u64::from_ne_bytes(*y);
    }
    for (x, y) in a_rest.iter().zip(b_rest) {
        diff |= u64::from(x ^ y);
    }
    bool::from(std::hint::black_box(diff).ct_eq(&0))
}

fn find<'a>(tokens: &'a HashMap<[u8; 16], Vec<Credential>>, hash: &[u8; 32]) -> Option<&'a Credential> {
    let key: [u8; 16] = hash[..16].try_into().expect("16 of 32 bytes");
    tokens.get(&key).into_iter().flatten().find(|c| same_bytes(&c.hash, hash))
}

impl Access {
    pub fn new(policy: Policy, credentials: Vec<Credential>, open: OpenRoutes) -> Result<Access, CredentialError> {
        let file_tokens = by_hash(credentials)?;
        let current = Current { version: 0, policy: Arc::new(policy.clone()), stored_tokens: HashMap::new() };
        Ok(Access {
            file_policy: policy,
            file_tokens,
            open,
            current: RwLock::new(Arc::new(current)),
            changed: tokio::sync::watch::channel(0).0,
        })
    }

    /// The policy in force: the file's roles and bindings, and the store's bindings.
    pub fn policy(&self) -> Arc<Policy> {
        self.current().policy.clone()
    }

    fn current(&self) -> Arc<Current> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether a role of this name exists (a binding made through the API must name one).
    pub fn has_role(&self, name: &str) -> bool {
        self.file_policy.has_role(name)
    }

    /// Reads the store's tokens and bindings again if their version moved.
    pub async fn refresh(&self, store: &dyn allot_store::Store) -> Result<(), allot_store::StoreError> {
        let version = store.access_version().await?;
        if version == self.current().version {
            return Ok(());
        }
        let records = store.access_records().await?;
        let mut credentials = Vec::with_capacity(records.tokens.len());
        for record in records.tokens {
            let expires = record.expires.map(|ms| SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(ms));
            let principal = Principal { user: record.user, groups: record.groups };
            match Credential::new(&record.name, &record.hash, principal, expires) {
                Ok(credential) => credentials.push(credential.stored()),
                Err(err) => tracing::warn!(error = %err, "an API token kept in the store is unusable; ignored"),
            }
        }
        let stored_tokens = by_hash(credentials).unwrap_or_default();
        let bindings = records
            .bindings
            .into_iter()
            .map(|b| allot_core::access::Binding { role: b.role, users: b.users, groups: b.groups })
            .collect();
        let (policy, unknown) = self.file_policy.with_bindings(bindings);
        for binding in unknown {
            tracing::warn!(role = %binding.role, "a binding kept in the store names a role this daemon does not have; ignored");
        }
        let policy = Arc::new(policy);
        // The scheduler places by the same policy: a binding removed ends what its users may be
        // given from the next cycle on.
        store.set_tenancy(allot_core::access::Tenancy::Enforced(policy.clone()));
        let current = Current { version: records.version, policy, stored_tokens };
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(current);
        self.changed.send_replace(records.version);
        Ok(())
    }

    /// Reads the store's tokens and bindings every quarter of a second while the process runs
    /// (a token revoked through another daemon stops being accepted within a second).
    pub fn follow(self: &Arc<Access>, store: Arc<dyn allot_store::Store>) {
        let access = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut failing = false;
            loop {
                let Some(access) = access.upgrade() else { return };
                match access.refresh(store.as_ref()).await {
                    Ok(()) => failing = false,
                    Err(err) if !failing => {
                        failing = true;
                        tracing::warn!(error = %err, "cannot read the API tokens kept in the store; using the last read");
                    }
                    Err(_) => {}
                }
                drop(access);
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
        });
    }

    /// A receiver that sees every reading of the store's tokens (for streams that must end
    /// when their token is revoked).
    pub(crate) fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Whether the stored token named `name` is still accepted.
    pub(crate) fn stored_token_live(&self, name: &str) -> bool {
        let now = SystemTime::now();
        self.current()
            .stored_tokens
            .values()
            .flatten()
            .any(|c| c.name == name && c.expires.is_none_or(|expires| expires > now))
    }

    /// Who `token` is, if it is known and has not expired; and, when it can stop being accepted
    /// while a call stays open (kept in the store, or expiring), the token to follow.
    fn credential(&self, token: &str) -> Result<(Principal, Option<HeldToken>), Unauthenticated> {
        let hash = token_hash(token);
        // The store's tokens are read only for a token the file does not have.
        let current;
        let found = match find(&self.file_tokens, &hash) {
            Some(found) => found,
            None => {
                current = self.current();
                find(&current.stored_tokens, &hash).ok_or(Unauthenticated::Unknown)?
            }
        };
        if found.expires.is_some_and(|expires| expires <= SystemTime::now()) {
            return Err(Unauthenticated::Expired);
        }
        let held = (found.stored || found.expires.is_some()).then(|| HeldToken {
            name: found.name.clone(),
            stored: found.stored,
            expires: found.expires,
        });
        Ok((found.principal.clone(), held))
    }

    /// Who makes the call with `headers`.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, Unauthenticated> {
        Ok(self.authenticate_token(headers)?.0)
    }

    /// Who the call's bearer token is, and the token to follow (see [`Access::credential`]).
    fn authenticate_token(&self, headers: &HeaderMap) -> Result<(Principal, Option<HeldToken>), Unauthenticated> {
        let value = headers.get(header::AUTHORIZATION).ok_or(Unauthenticated::Missing)?;
        let value = value.to_str().map_err(|_| Unauthenticated::Malformed)?;
        let (scheme, token) = value.split_once(' ').ok_or(Unauthenticated::Malformed)?;
        if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
            return Err(Unauthenticated::Malformed);
        }
        self.credential(token.trim())
    }

    /// Whether `path` is answered without a token.
    fn is_open(&self, path: &str) -> bool {
        match path {
            "/healthz" | "/readyz" | "/" | "/ui" => true,
            _ if path.starts_with("/ui/") => true,
            "/metrics" => self.open.metrics,
            "/openapi.json" => self.open.document,
            _ => false,
        }
    }
}

/// Why a call was not authenticated. The answer never repeats the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unauthenticated {
    Missing,
    Malformed,
    Unknown,
    Expired,
    /// A client certificate not signed by the configured CA.
    BadCertificate,
    /// The token was revoked (or expired) while the call was open.
    Revoked,
}

impl Unauthenticated {
    fn message(self) -> &'static str {
        match self {
            Unauthenticated::Missing => "this call needs an API token: `Authorization: Bearer TOKEN`",
            Unauthenticated::Malformed => "the Authorization header is not `Bearer TOKEN`",
            Unauthenticated::Unknown => "the API token is not known (revoked, or never made)",
            Unauthenticated::Expired => "the API token has expired",
            Unauthenticated::Revoked => "the API token was revoked (or expired) while the call was open",
            Unauthenticated::BadCertificate => {
                "the client certificate is not valid for this daemon's client CA (--tls-client-ca)"
            }
        }
    }
}

impl IntoResponse for Unauthenticated {
    fn into_response(self) -> Response {
        let challenge = match self {
            Unauthenticated::Missing => r#"Bearer realm="allot""#,
            _ => r#"Bearer realm="allot", error="invalid_token""#,
        };
        let mut response = ApiError::of(ErrorCode::Unauthenticated, self.message()).into_response();
        response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
        response
    }
}

impl From<Unauthenticated> for ApiError {
    fn from(refused: Unauthenticated) -> ApiError {
        ApiError::of(ErrorCode::Unauthenticated, refused.message())
    }
}

impl From<Denied> for ApiError {
    fn from(denied: Denied) -> ApiError {
        ApiError::of(ErrorCode::Forbidden, denied.to_string())
    }
}

/// The principal of a call, as authenticated (set on every request; without access configured
/// it is [`Caller::Anyone`], who may do everything).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    Anyone,
    Principal(Principal),
}

impl Caller {
    /// Refuses the call unless the caller may do `permission` on `resource`.
    pub fn check(&self, access: Option<&Access>, permission: Permission, resource: Resource) -> Result<(), ApiError> {
        match (self, access) {
            (Caller::Principal(principal), Some(access)) => {
                Ok(access.policy().check(principal, permission, resource)?)
            }
            _ => Ok(()),
        }
    }

    /// Whether the caller may do `permission` on `resource` (for filtering a list).
    pub fn may(&self, access: Option<&Access>, permission: Permission, resource: &Resource) -> bool {
        match (self, access) {
            (Caller::Principal(principal), Some(access)) => access.policy().allows(principal, permission, resource),
            _ => true,
        }
    }
}

/// The caller of a handler and the daemon's access, for the checks a handler makes itself (a
/// body that names its resources, a list answering only what the caller may see).
pub(crate) struct Who {
    caller: Caller,
    access: Option<Arc<Access>>,
}

impl Who {
    /// Refuses unless the caller may do `permission` on `resource`.
    pub(crate) fn check(&self, permission: Permission, resource: Resource) -> Result<(), ApiError> {
        self.caller.check(self.access.as_deref(), permission, resource)
    }

    /// The authenticated principal (none without access configured, or on an open route).
    pub(crate) fn principal(&self) -> Option<&Principal> {
        match (&self.caller, &self.access) {
            (Caller::Principal(principal), Some(_)) => Some(principal),
            _ => None,
        }
    }

    /// Whether the caller may do `permission` on `resource`.
    pub(crate) fn may(&self, permission: Permission, resource: &Resource) -> bool {
        self.caller.may(self.access.as_deref(), permission, resource)
    }

    /// The principal and the policy in force, when calls are checked: whom the access rules of
    /// the core (`allot_core::apps::admission`) judge.
    pub(crate) fn judged(&self) -> Option<(Principal, Arc<Policy>)> {
        match (&self.caller, &self.access) {
            (Caller::Principal(principal), Some(access)) => Some((principal.clone(), access.policy())),
            _ => None,
        }
    }

    /// Whether calls are checked at all (access is configured).
    pub(crate) fn checks(&self) -> bool {
        self.access.is_some()
    }

    /// Whether the caller may see `resource` (a list keeps only those).
    pub(crate) fn may_read(&self, resource: &Resource) -> bool {
        self.caller.may(self.access.as_deref(), Permission::Read, resource)
    }
}

impl axum::extract::FromRequestParts<ServerState> for Who {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &ServerState) -> Result<Who, Response> {
        let caller = match (parts.extensions.get::<Caller>(), &state.access) {
            (Some(caller), _) => caller.clone(),
            (None, None) => Caller::Anyone,
            // Served without authentication (the router alone): refuse rather than trust.
            (None, Some(_)) => return Err(Unauthenticated::Missing.into_response()),
        };
        Ok(Who { caller, access: state.access.clone() })
    }
}

/// What a watch of `filter` may see, as resources the caller must be able to read: for each key
/// prefix, what it names (`namespaces/hive/...`: namespace `hive`; `namespaces/hive`: every
/// namespace whose name starts with `hive`; `queues/root.a`: that queue's subtree); without
/// prefixes, every resource of the kinds of its events.
pub(crate) fn watched(filter: &allot_core::watch::Filter) -> Vec<Resource> {
    use allot_core::watch::EventKind as E;
    if filter.prefixes.is_empty() {
        let all: &[E] = if filter.kinds.is_empty() { E::ALL } else { &filter.kinds };
        let mut kinds: Vec<Kind> = all
            .iter()
            .map(|kind| match kind {
                E::PoolPut | E::PoolRemoved | E::AllocMade | E::AllocRenewed | E::AllocAnnotated | E::AllocEnded => {
                    Kind::Pool
                }
                E::QueuePut
                | E::QueueRemoved
                | E::AppChanged
                | E::AppRemoved
                | E::TaskChanged
                | E::TaskRemoved
                | E::RunChanged
                | E::RunRemoved => Kind::Queue,
                _ => Kind::Namespace,
            })
            .collect();
        kinds.sort();
        kinds.dedup();
        return kinds.into_iter().map(Resource::All).collect();
    }
    filter
        .prefixes
        .iter()
        .filter_map(|prefix| {
            let prefix = prefix.trim_matches('/');
            let (part, rest) = prefix.split_once('/').unwrap_or((prefix, ""));
            let (name, deeper) = match rest.split_once('/') {
                Some((name, _)) => (name, true),
                None => (rest, false),
            };
            let kind = match part {
                "namespaces" | "sessions" if part == "sessions" || name.is_empty() => {
                    return Some(Resource::All(Kind::Namespace))
                }
                "namespaces" => Kind::Namespace,
                "pools" if name.is_empty() => return Some(Resource::All(Kind::Pool)),
                "pools" => Kind::Pool,
                "queues" if name.is_empty() => return Some(Resource::All(Kind::Queue)),
                "queues" => return Some(Resource::Queue(name.to_owned())),
                // An application's events: its queue is not in its key.
                "apps" => return Some(Resource::All(Kind::Queue)),
                "" => return Some(Resource::Daemon),
                // A prefix no key starts with: it watches nothing.
                _ => return None,
            };
            Some(match (kind, deeper) {
                (Kind::Namespace, true) => Resource::Namespace(name.to_owned()),
                (Kind::Pool, true) => Resource::Pool(name.to_owned()),
                (kind, _) => Resource::Tree(kind, name.to_owned()),
            })
        })
        .collect()
}

/// Authenticates a call before anything else serves it: sets its [`Caller`] (and the
/// [`HeldToken`] to follow, if any), or answers 401.
pub(crate) fn authenticate(state: &ServerState, request: &mut Request) -> Result<(), Unauthenticated> {
    let (caller, held) = caller_of(state, request)?;
    if let Some(held) = held {
        request.extensions_mut().insert(held);
    }
    request.extensions_mut().insert(caller);
    Ok(())
}

/// Who makes `request`, and the token to follow while it stays open (long polls and watches end
/// when it is revoked or expires); or why it is refused.
pub(crate) fn caller_of(
    state: &ServerState,
    request: &Request,
) -> Result<(Caller, Option<HeldToken>), Unauthenticated> {
    let Some(access) = state.access.as_deref() else { return Ok((Caller::Anyone, None)) };
    if access.is_open(request.uri().path()) {
        return Ok((Caller::Anyone, None));
    }
    // A token wins over a client certificate; without one, the certificate names the caller.
    match access.authenticate_token(request.headers()) {
        Err(Unauthenticated::Missing) => match client_cert(request) {
            Some(ClientCert::Verified { user, groups }) => Ok((Caller::Principal(Principal { user, groups }), None)),
            Some(ClientCert::Refused(_)) => Err(Unauthenticated::BadCertificate),
            None => Err(Unauthenticated::Missing),
        },
        found => {
            let (principal, held) = found?;
            Ok((Caller::Principal(principal), held))
        }
    }
}

/// The token a call was authenticated by, when it can stop being accepted while the call is
/// open: one kept in the store (revocable), or one with an expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeldToken {
    name: String,
    stored: bool,
    expires: Option<SystemTime>,
}

/// Why an open call (a long poll, a watch) was ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Withdrawn {
    /// Its token was revoked or expired.
    Token,
    /// Its caller lost the permission it was opened with (a binding removed).
    Access(Denied),
}

impl From<Withdrawn> for ApiError {
    fn from(withdrawn: Withdrawn) -> ApiError {
        match withdrawn {
            Withdrawn::Token => Unauthenticated::Revoked.into(),
            Withdrawn::Access(denied) => ApiError::of(
                ErrorCode::Forbidden,
                format!("the call was ended: access was withdrawn while it was open: {denied}"),
            ),
        }
    }
}

/// Ends when a call that stays open (a long poll, a watch) may no longer go on: its token is
/// revoked or expires, or `still` no longer holds for its caller under the policy in force (read
/// again whenever the store's tokens or bindings move, and when the token expires). Never ends
/// for a call that is not checked.
pub(crate) async fn withdrawn(
    access: Option<Arc<Access>>,
    caller: Option<Caller>,
    token: Option<HeldToken>,
    still: impl Fn(&Policy, &Principal) -> Result<(), Denied>,
) -> Withdrawn {
    let (Some(access), Some(Caller::Principal(principal))) = (access, caller) else {
        return std::future::pending().await;
    };
    let mut changes = access.changes();
    loop {
        if let Some(token) = &token {
            let expired = token.expires.is_some_and(|expires| expires <= SystemTime::now());
            if expired || (token.stored && !access.stored_token_live(&token.name)) {
                return Withdrawn::Token;
            }
        }
        if let Err(denied) = still(&access.policy(), &principal) {
            return Withdrawn::Access(denied);
        }
        // A revocation or a binding removed is seen as soon as it is read, an expiry when it
        // comes: no call wakes for nothing (a daemon may hold 100,000 waiters).
        let left =
            token.as_ref().and_then(|t| t.expires).map(|e| e.duration_since(SystemTime::now()).unwrap_or_default());
        tokio::select! {
            Ok(()) = changes.changed() => {}
            () = sleep_or_never(left) => {}
        }
    }
}

/// Sleeps for `left`, or forever when there is nothing to wait for.
async fn sleep_or_never(left: Option<std::time::Duration>) {
    match left {
        Some(left) => tokio::time::sleep(left).await,
        None => std::future::pending().await,
    }
}

/// What the connection's client certificate says (with mutual TLS).
fn client_cert(request: &Request) -> Option<ClientCert> {
    request.extensions().get::<axum::extract::ConnectInfo<crate::Peer>>()?.0.client.clone()
}

/// Where a route's resource comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The daemon itself.
    Daemon,
    /// The resource named by the path parameter of this kind (`namespace`, `pool`, `queue`).
    Path(Kind),
    /// The queue of the application named by the path parameter `app`.
    AppQueue,
    /// Every resource of a kind: a list (the handler answers only what the caller may see), a
    /// session (not in one namespace), or a call whose body names its resources (the handler
    /// checks each).
    Some(Kind),
    /// Resources of any kind, named by the request (a watch's filter): the handler checks each.
    Named,
    /// Resources of this kind named in the body (a submission's queue, each report's
    /// application): the handler checks each and names the one refused.
    Body(Kind),
}

/// The one permission a route needs, over which resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// `/healthz`, `/readyz`, the dashboard's files: open to everyone.
    Open,
    /// Any authenticated caller, whatever it may do (`/v1/whoami`).
    Authenticated,
    Needs(Permission, Target),
}

/// Which daemon serves a route, on a store several daemons share (Redis).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Home {
    /// Any daemon, from the shared store.
    Any,
    /// The daemon that schedules applications; the others forward the call to it, as it came,
    /// and answer what it answered.
    Scheduler,
}

/// The permission of every route, and the daemon that serves it, by method and path template:
/// what `routes::router` declares.
#[derive(Debug, Default)]
pub struct Needs(HashMap<(Method, &'static str), (Need, Home)>);

impl Needs {
    pub(crate) fn declare(&mut self, method: Method, path: &'static str, need: Need, home: Home) {
        let previous = self.0.insert((method.clone(), path), (need, home));
        assert!(previous.is_none(), "{method} {path} declares its permission twice");
    }

    fn route(&self, method: &Method, path: &str) -> Option<(Need, Home)> {
        let method = if method == Method::HEAD { &Method::GET } else { method };
        self.0.get(&(method.clone(), path)).copied()
    }

    /// What `method` on `path` needs (a `HEAD` what its `GET` needs).
    pub fn get(&self, method: &Method, path: &str) -> Option<Need> {
        self.route(method, path).map(|(need, _)| need)
    }

    /// Which daemon serves `method` on `path` (any, for a route not declared).
    pub fn home(&self, method: &Method, path: &str) -> Home {
        self.route(method, path).map_or(Home::Any, |(_, home)| home)
    }

    /// The methods `path` takes (with `HEAD` where it takes `GET`), sorted.
    pub fn methods(&self, path: &str) -> Vec<String> {
        let mut methods: Vec<String> = self.0.keys().filter(|(_, p)| *p == path).map(|(m, _)| m.to_string()).collect();
        if methods.iter().any(|m| m == "GET") {
            methods.push("HEAD".to_owned());
        }
        methods.sort();
        methods
    }

    /// Every route, with its permission.
    pub fn all(&self) -> impl Iterator<Item = (&Method, &'static str, Need)> + '_ {
        self.0.iter().map(|((method, path), (need, _))| (method, *path, *need))
    }
}

/// The resource of `kind` that a path parameter names.
pub(crate) fn resource_of(kind: Kind, name: String) -> Resource {
    match kind {
        Kind::Namespace => Resource::Namespace(name),
        Kind::Pool => Resource::Pool(name),
        Kind::Queue => Resource::Queue(name),
        Kind::Daemon => Resource::Daemon,
    }
}

/// Checks that the caller may do what the matched route needs (before its handler runs).
pub(crate) async fn authorize(
    State((state, needs)): State<(ServerState, Arc<Needs>)>,
    request: Request,
    next: Next,
) -> Response {
    let Some(access) = state.access.as_deref() else { return next.run(request).await };
    // A parameter that cannot be read (not UTF-8) names nothing here; its handler refuses it.
    let (mut parts, body) = request.into_parts();
    let params: Vec<(String, String)> = match RawPathParams::from_request_parts(&mut parts, &state).await {
        Ok(params) => params.iter().map(|(key, value)| (key.to_owned(), value.to_owned())).collect(),
        Err(_) => Vec::new(),
    };
    let request = Request::from_parts(parts, body);
    let principal = match request.extensions().get::<Caller>() {
        Some(Caller::Principal(principal)) => principal.clone(),
        Some(Caller::Anyone) => return next.run(request).await,
        // Served without authentication (the router alone): refuse rather than trust.
        None => return Unauthenticated::Missing.into_response(),
    };
    let Some(route) = request.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned()) else {
        return next.run(request).await;
    };
    let Some(need) = needs.get(request.method(), &route) else {
        // A method the route does not take (TRACE, OPTIONS...): 405, naming those it takes.
        let allowed = needs.methods(&route);
        if !allowed.is_empty() {
            let mut response = ApiError::method_not_allowed().into_response();
            if let Ok(allow) = HeaderValue::from_str(&allowed.join(",")) {
                response.headers_mut().insert(header::ALLOW, allow);
            }
            return response;
        }
        // Fail closed: a route that declares no permission is never served.
        tracing::error!(method = %request.method(), route, "a route declares no permission; refused");
        return ApiError::of(ErrorCode::Internal, format!("{} {route} declares no permission", request.method()))
            .into_response();
    };
    let Need::Needs(permission, target) = need else { return next.run(request).await };
    let param = |name: &str| params.iter().find(|(key, _)| key == name).map(|(_, value)| value.clone());
    let resource = match target {
        Target::Daemon => Some(Resource::Daemon),
        Target::Path(kind) => param(kind.name()).map(|name| resource_of(kind, name)),
        Target::AppQueue => match param("app") {
            Some(app) => match app_queue(&state, &app, request.headers()).await {
                Ok(queue) => queue,
                Err(refused) => return refused,
            },
            None => None,
        },
        Target::Some(kind) => {
            if access.policy().touches(&principal, permission, kind) {
                return next.run(request).await;
            }
            return holds_none(&principal, permission, kind).into_response();
        }
        Target::Named | Target::Body(_) => return next.run(request).await,
    };
    let allowed = match &resource {
        Some(resource) => access.policy().check(&principal, permission, resource.clone()).map_err(ApiError::from),
        // What the path names cannot be read (a bad name, an application that does not exist):
        // the handler answers it to a caller who holds the permission on some of that kind.
        None => match access.policy().touches(&principal, permission, target_kind(target)) {
            true => Ok(()),
            false => Err(holds_none(&principal, permission, target_kind(target))),
        },
    };
    match allowed {
        Ok(()) => next.run(request).await,
        Err(err) => err.into_response(),
    }
}

/// The refusal of a caller that holds `permission` on no resource of `kind`.
fn holds_none(principal: &Principal, permission: Permission, kind: Kind) -> ApiError {
    let message =
        format!("{principal} may not do this: it needs `{permission}` on some {} and holds it on none", kind.name());
    ApiError::of(ErrorCode::Forbidden, message)
}

fn target_kind(target: Target) -> Kind {
    match target {
        Target::Daemon => Kind::Daemon,
        Target::Path(kind) | Target::Some(kind) | Target::Body(kind) => kind,
        Target::AppQueue => Kind::Queue,
        Target::Named => Kind::Daemon,
    }
}

/// The queue of application `app`; none if it does not exist. Where another daemon serves the
/// applications part (on Redis: a task's logs and wake-ups are served by the daemon that runs
/// it), that daemon is asked, with the caller's credentials; a call whose application cannot be
/// told is refused, never let through.
async fn app_queue(state: &ServerState, app: &str, headers: &HeaderMap) -> Result<Option<Resource>, Response> {
    use allot_core::apps::SchedError;
    let Ok(id) = allot_core::apps::AppId::new(app) else { return Ok(None) };
    let queue = |path: &str| Some(Resource::Queue(path.to_owned()));
    let unknown = |why: String| {
        let message = format!("the queue of application `{app}` cannot be told now ({why}); retry");
        ApiError::new(axum::http::StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", message).into_response()
    };
    match state.store.app(id).await {
        Ok(info) => return Ok(queue(info.app.spec.queue.as_str())),
        Err(allot_store::StoreError::Apps(SchedError::AppNotFound(_))) => return Ok(None),
        Err(_) => {}
    }
    let allot_store::AppsHome::At(base) = state.store.apps_home() else {
        return Err(unknown("no daemon schedules applications right now".to_owned()));
    };
    let mut asked = state.forwarder.client().get(format!("{base}/v1/apps/{app}")).header(crate::FORWARDED, "1");
    if let Some(credentials) = headers.get(header::AUTHORIZATION) {
        asked = asked.header(header::AUTHORIZATION, credentials);
    }
    let answer = asked.send().await.map_err(|err| unknown(err.to_string()))?;
    match answer.status().as_u16() {
        200 => {
            let app: allot_api::App = answer.json().await.map_err(|err| unknown(err.to_string()))?;
            Ok(queue(&app.queue))
        }
        404 => Ok(None),
        // The daemon that schedules refused the caller: so is this call, as it said.
        status @ (401 | 403) => {
            let said = answer.json::<allot_api::ErrorBody>().await.map(|body| body.error.message);
            let code = if status == 401 { ErrorCode::Unauthenticated } else { ErrorCode::Forbidden };
            Err(ApiError::of(code, said.unwrap_or_else(|_| format!("refused by the daemon that schedules ({status})")))
                .into_response())
        }
        status => Err(unknown(format!("the daemon that schedules answered {status}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_bytes_tells_every_difference_in_words_and_in_the_rest() {
        let base: Vec<u8> = (0..75u8).collect();
        for len in [0, 1, 7, 8, 9, 32, 75] {
            let a = &base[..len];
            assert!(same_bytes(a, a), "{len}");
            for i in 0..len {
                let mut b = a.to_vec();
                b[i] ^= 0x80;
                assert!(!same_bytes(a, &b), "{len} {i}");
            }
        }
        assert!(!same_bytes(&base[..8], &base[..9]));
        assert!(!same_bytes(b"", b"x"));
    }

    #[test]
    fn tokens_are_kept_as_hashes_and_found_only_whole() {
        let token = make_token();
        assert!(token.starts_with(TOKEN_PREFIX) && token.len() == TOKEN_PREFIX.len() + 64);
        assert_ne!(make_token(), token);
        let hash = hash_token(&token);
        assert!(hash.starts_with("sha256:") && !hash.contains(&token[TOKEN_PREFIX.len()..]));
        let principal = Principal::new("ada", ["hive"]);
        let credential = Credential::new("ada-laptop", &hash, principal.clone(), None).unwrap();
        let expired = Credential::new(
            "old",
            &hash_token("allot_old"),
            principal.clone(),
            Some(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1)),
        )
        .unwrap();
        let access = Access::new(
            Policy::new(Default::default(), vec![]).unwrap(),
            vec![credential, expired],
            OpenRoutes::default(),
        )
        .unwrap();
        let headers = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
            headers
        };
        assert_eq!(access.authenticate(&headers(&format!("Bearer {token}"))), Ok(principal.clone()));
        assert_eq!(access.authenticate(&headers(&format!("bearer  {token} "))), Ok(principal.clone()));
        assert_eq!(access.authenticate(&HeaderMap::new()), Err(Unauthenticated::Missing));
        assert_eq!(access.authenticate(&headers(&format!("Basic {token}"))), Err(Unauthenticated::Malformed));
        assert_eq!(access.authenticate(&headers("Bearer ")), Err(Unauthenticated::Malformed));
        assert_eq!(access.authenticate(&headers(&format!("Bearer {token}x"))), Err(Unauthenticated::Unknown));
        // A token of the same length as the one this thread hashed last is hashed, not taken for it.
        let mut same_length = token.clone().into_bytes();
        *same_length.last_mut().unwrap() ^= 1;
        let same_length = String::from_utf8(same_length).unwrap();
        assert_eq!(access.authenticate(&headers(&format!("Bearer {token}"))), Ok(principal.clone()));
        assert_eq!(access.authenticate(&headers(&format!("Bearer {same_length}"))), Err(Unauthenticated::Unknown));
        assert_eq!(access.authenticate(&headers(&format!("Bearer {token}"))), Ok(principal.clone()));
        assert_eq!(access.authenticate(&headers("Bearer allot_old")), Err(Unauthenticated::Expired));
        assert!(Credential::new("x", "sha256:12", Principal::new("a", [""; 0]), None).is_err());
        assert!(Credential::new("x", &hash, Principal::new(" ", [""; 0]), None).is_err());
    }
}
