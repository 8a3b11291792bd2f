//! Validated names: namespaces, tokens, scopes and session ids.
//!
//! Every name that enters the core is checked once, here, so the rest of the code can rely on it.
//! One rule holds for every name (namespace, token, project, namespace scope, pool): 1 to
//! [`MAX_NAME_CHARS`] characters, no control characters, no `/`, and not `.` or `..`. A name is
//! one URL path segment: the server percent-decodes a segment exactly once, so `%2F` is a `/`
//! (refused) and a literal `%` is sent as `%25`. A namespace's `:`-separated segments must not be
//! empty. [`NAME_PATTERN`] and [`NAMESPACE_PATTERN`] are the same rules as regular expressions,
//! for the API's document.

use std::fmt;
use std::sync::Arc;

/// `value` as 16 lowercase hex digits, zero-padded (what `{:016x}` writes): the form of an
/// alloc's id and of the daemon's own request ids, written without the formatter as both are
/// made on hot paths.
pub fn hex_digits(value: u64) -> [u8; 16] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = [0u8; 16];
    for (i, digit) in text.iter_mut().enumerate() {
        *digit = DIGITS[((value >> (60 - 4 * i)) & 0xf) as usize];
    }
    text
}

/// The longest name (namespace, token, project, namespace scope, pool) in characters (Unicode
/// scalar values, as JSON Schema's `maxLength` counts them).
pub const MAX_NAME_CHARS: usize = 255;
/// A name as a regular expression (no look-around, so every client generator can use it):
/// characters other than control characters and `/`, and not `.` or `..`. The length is
/// limited apart, by [`MAX_NAME_CHARS`].
pub const NAME_PATTERN: &str = r"^(?:[^./\u0000-\u001f\u007f-\u009f]|\.[^./\u0000-\u001f\u007f-\u009f]|\.\.[^/\u0000-\u001f\u007f-\u009f])[^/\u0000-\u001f\u007f-\u009f]*$";
/// A namespace name as a regular expression: a name whose `:`-separated segments are not empty.
pub const NAMESPACE_PATTERN: &str = r"^(?:(?:[^.:/\u0000-\u001f\u007f-\u009f]|\.[^.:/\u0000-\u001f\u007f-\u009f]|\.\.[^:/\u0000-\u001f\u007f-\u009f])[^:/\u0000-\u001f\u007f-\u009f]*|[^:/\u0000-\u001f\u007f-\u009f]+(?::[^:/\u0000-\u001f\u007f-\u009f]+)+)$";
/// The separator between the segments of a namespace [Flyte `namespaceSeparator`].
pub const NAMESPACE_SEPARATOR: char = ':';

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("{what} must not be empty")]
    Empty { what: &'static str },
    #[error("{what} is {len} characters long; the limit is {MAX_NAME_CHARS}")]
    TooLong { what: &'static str, len: usize },
    #[error("{what} must not contain control characters (found U+{code:04X})")]
    ControlCharacter { what: &'static str, code: u32 },
    #[error("{what} `{name}` has an empty segment: segments are joined by `:` and must not be empty")]
    EmptySegment { what: &'static str, name: String },
    #[error("{what} must not be `.` or `..`")]
    Dots { what: &'static str },
    #[error(
        "{what} `{name}` must not contain `/`: a name is one URL path segment (and `/` separates the pool \
         from the alloc in `pool/alloc`)"
    )]
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
    let len = name.chars().count();
    if len > MAX_NAME_CHARS {
        return Err(NameError::TooLong { what, len });
    }
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return Err(NameError::ControlCharacter { what, code: c as u32 });
    }
    // `.` and `..` cannot be addressed as a URL path segment, nor can a `/` be inside one.
    if name == "." || name == ".." {
        return Err(NameError::Dots { what });
    }
    if name.contains('/') {
        return Err(NameError::Slash { what, name: name.to_owned() });
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

/// What begins the tokens of allot's own grants: a task's placement holds `@<app>:<task>` (a gang
/// placeholder `@<app>:<group>#<member>`), attempt `n` of a task's run `@<app>:<task>:<n>` in its
/// plugin's quotas. No client may allocate, release or keep alive such a token: the grant ends
/// with its task or run, and its name is never a client's.
pub const SCHEDULER_TOKEN_PREFIX: char = '@';

impl Token {
    pub fn new(token: &str) -> Result<Token, NameError> {
        check("token", token)?;
        Ok(Token(Arc::from(token)))
    }

    /// The token of the grants a task's placement (or a gang placeholder's, `what` being
    /// `<group>#<member>`) holds in each namespace it needs.
    pub fn of_placement(app: &str, what: &str) -> Result<Token, NameError> {
        let mut token = String::with_capacity(2 + app.len() + what.len());
        token.push(SCHEDULER_TOKEN_PREFIX);
        token.extend([app, ":", what]);
        Token::new(&token)
    }

    /// The token attempt `attempt` of a task's run holds in each of its plugin's quotas.
    pub fn of_run(app: &str, task: &str, attempt: u32) -> Result<Token, NameError> {
        Token::of_placement(app, &format!("{task}:{attempt}"))
    }

    /// Whether the token is one of allot's own ([`SCHEDULER_TOKEN_PREFIX`]).
    pub fn is_scheduler_held(&self) -> bool {
        self.0.starts_with(SCHEDULER_TOKEN_PREFIX)
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

/// What [`SessionId::parse`] takes, as a regular expression for the API's document.
pub const SESSION_ID_PATTERN: &str = "^[0-9a-fA-F]{32}$";

/// A session's id: 32 lowercase hex digits.
///
/// Aligned to 8 bytes, not the 16 of a `u128`: every grant's lease holds one, and a million
/// grants kept 32 bytes each of padding otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(C, packed(8))]
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
        let id = self.0;
        write!(f, "{id:032x}")
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
        assert!(NamespaceName::new(&"é".repeat(255)).is_ok(), "the limit counts characters");
        assert_eq!(NamespaceName::new(".."), Err(NameError::Dots { what: "namespace" }));
        assert!(NamespaceName::new("..:a").is_ok());
        assert_eq!(Token::new("."), Err(NameError::Dots { what: "token" }));
        assert!(Token::new("a.. b%25").is_ok());
    }

    #[test]
    fn one_rule_for_slashes_in_every_name() {
        assert!(matches!(NamespaceName::new("a/b"), Err(NameError::Slash { what: "namespace", .. })));
        assert!(matches!(Token::new("job/1"), Err(NameError::Slash { what: "token", .. })));
        assert!(matches!(Scope::new("p/q", "dev"), Err(NameError::Slash { what: "project", .. })));
        assert!(matches!(Scope::new("p", "dev/x"), Err(NameError::Slash { what: "namespace scope", .. })));
    }

    proptest::proptest! {
        /// The patterns the API's document states accept exactly the names the core accepts.
        #[test]
        fn patterns_agree_with_the_checks(
            parts in proptest::collection::vec(
                proptest::sample::select(vec![".", ":", "/", "a", "é", "%2F", "\u{1}", "\u{7f}", "\u{85}", " "]),
                0..7,
            )
        ) {
            let name = parts.concat();
            let name_re = regex::Regex::new(NAME_PATTERN).unwrap();
            let namespace_re = regex::Regex::new(NAMESPACE_PATTERN).unwrap();
            proptest::prop_assert_eq!(Token::new(&name).is_ok(), name_re.is_match(&name), "token {:?}", name);
            proptest::prop_assert_eq!(NamespaceName::new(&name).is_ok(), namespace_re.is_match(&name), "namespace {:?}", name);
        }
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
