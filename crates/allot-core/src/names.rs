//! Validated names: namespaces, tokens, scopes and session ids.
//!
//! Every name that enters the core is checked once, here, so the rest of the code can rely on it:
//! not empty, at most [`MAX_NAME_BYTES`] bytes, no control characters.

use std::fmt;
use std::sync::Arc;

/// The longest name (namespace, token, project, namespace scope) in bytes.
pub const MAX_NAME_BYTES: usize = 255;
/// The separator between the segments of a namespace [Flyte `namespaceSeparator`].
pub const NAMESPACE_SEPARATOR: char = ':';

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("{what} must not be empty")]
    Empty { what: &'static str },
    #[error("{what} is {len} bytes long; the limit is {MAX_NAME_BYTES}")]
    TooLong { what: &'static str, len: usize },
    #[error("{what} must not contain control characters (found U+{code:04X})")]
    ControlCharacter { what: &'static str, code: u32 },
    #[error("{what} `{name}` has an empty segment: segments are joined by `:` and must not be empty")]
    EmptySegment { what: &'static str, name: String },
    #[error("{what} must not be `.` or `..`")]
    Dots { what: &'static str },
    #[error("{what} `{name}` must not contain `/` (it separates the pool from the alloc in `pool/alloc`)")]
    Slash { what: &'static str, name: String },
    #[error("alloc id `{text}` is not 16 hexadecimal digits")]
    BadAllocId { text: String },
    #[error("session id `{text}` is not 32 hexadecimal digits")]
    BadSessionId { text: String },
}

pub(crate) fn check(what: &'static str, name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty { what });
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(NameError::TooLong { what, len: name.len() });
    }
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return Err(NameError::ControlCharacter { what, code: c as u32 });
    }
    // `.` and `..` cannot be addressed as a URL path segment.
    if name == "." || name == ".." {
        return Err(NameError::Dots { what });
    }
    Ok(())
}

/// A `:`-separated resource path that owns a quota, e.g. `hive:cluster-a` [Flyte `ResourceNamespace`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
// Names are shared, not copied: the ledger keeps each one in several indexes.
pub struct NamespaceName(Arc<str>);

impl NamespaceName {
    pub fn new(name: &str) -> Result<NamespaceName, NameError> {
        const WHAT: &str = "namespace";
        check(WHAT, name)?;
        if name.split(NAMESPACE_SEPARATOR).any(str::is_empty) {
            return Err(NameError::EmptySegment { what: WHAT, name: name.to_owned() });
        }
        Ok(NamespaceName(Arc::from(name)))
    }

    /// Joins `segment` below this namespace with `:` [Flyte `CreateSubNamespace`].
    pub fn sub_namespace(&self, segment: &str) -> Result<NamespaceName, NameError> {
        NamespaceName::new(&format!("{}{NAMESPACE_SEPARATOR}{segment}", &*self.0))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split(NAMESPACE_SEPARATOR)
    }
}

impl fmt::Display for NamespaceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The caller's idempotency key for one allocation [Flyte `allocationToken`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Token(Arc<str>);

impl Token {
    pub fn new(token: &str) -> Result<Token, NameError> {
        check("token", token)?;
        Ok(Token(Arc::from(token)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who holds a grant: its project and its namespace scope (Flyte's project and project/domain).
///
/// Scopes match exactly, component by component: project `proj` never counts grants of `proj2`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope {
    pub project: Arc<str>,
    pub namespace: Arc<str>,
}

impl Scope {
    pub fn new(project: &str, namespace: &str) -> Result<Scope, NameError> {
        check("project", project)?;
        check("namespace scope", namespace)?;
        Ok(Scope { project: Arc::from(project), namespace: Arc::from(namespace) })
    }
}

/// A session's id: 32 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u128);

impl SessionId {
    pub fn parse(text: &str) -> Result<SessionId, NameError> {
        const WHAT: &str = "session id";
        check(WHAT, text)?;
        if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(NameError::BadSessionId { text: text.to_owned() });
        }
        let id = u128::from_str_radix(text, 16).map_err(|_| NameError::BadSessionId { text: text.to_owned() })?;
        Ok(SessionId(id))
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_are_validated() {
        assert!(NamespaceName::new("hive").is_ok());
        assert!(NamespaceName::new("hive:cluster-a").is_ok());
        assert!(NamespaceName::new("ünïcode:名前").is_ok());
        assert_eq!(NamespaceName::new(""), Err(NameError::Empty { what: "namespace" }));
        assert!(matches!(NamespaceName::new("a::b"), Err(NameError::EmptySegment { .. })));
        assert!(matches!(NamespaceName::new(":a"), Err(NameError::EmptySegment { .. })));
        assert!(matches!(NamespaceName::new("a:"), Err(NameError::EmptySegment { .. })));
        assert!(matches!(NamespaceName::new("a\nb"), Err(NameError::ControlCharacter { code: 10, .. })));
        assert!(matches!(NamespaceName::new(&"x".repeat(256)), Err(NameError::TooLong { len: 256, .. })));
        assert!(NamespaceName::new(&"x".repeat(255)).is_ok());
        assert_eq!(NamespaceName::new(".."), Err(NameError::Dots { what: "namespace" }));
        assert_eq!(Token::new("."), Err(NameError::Dots { what: "token" }));
        assert!(Token::new("a/.. b").is_ok());
    }

    #[test]
    fn sub_namespace_joins_with_colon() {
        let hive = NamespaceName::new("hive").unwrap();
        let sub = hive.sub_namespace("cluster-a").unwrap();
        assert_eq!(sub.as_str(), "hive:cluster-a");
        assert_eq!(sub.segments().collect::<Vec<_>>(), ["hive", "cluster-a"]);
        assert!(hive.sub_namespace("").is_err());
    }

    #[test]
    fn session_ids_round_trip() {
        let id = SessionId(0xabc);
        let text = id.to_string();
        assert_eq!(text.len(), 32);
        assert_eq!(SessionId::parse(&text), Ok(id));
        assert!(SessionId::parse("xyz").is_err());
        assert!(SessionId::parse(&"g".repeat(32)).is_err());
    }
}
