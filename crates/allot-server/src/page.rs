//! Pages of lists: the `limit` and `cursor` query parameters, and cursors.
//!
//! A cursor is the key the next page starts after (a name, a token, an id, an arrival number),
//! behind a tag of its list: `n` namespaces, `g` grants, `w` waiters, `s` sessions, `p` pools,
//! `a` allocs. Clients pass it back as given. It is checked on the way in (a cursor of another
//! list, or anything else, is `invalid_cursor`; the document states each list's cursors as a
//! pattern) and never goes stale: the store continues after the key whether or not it is still
//! listed.

use allot_core::apps::spec::ID_PATTERN;
use allot_core::apps::{AppId, AppOrder, AppPlace, TaskId};
use allot_core::pools::{AllocId, PoolName, ALLOC_ID_PATTERN};
use allot_core::{
    NamespaceName, SessionId, Token, MAX_NAME_CHARS, NAMESPACE_PATTERN, NAME_PATTERN, SESSION_ID_PATTERN,
};
use allot_store::{Page, PageRequest, StoreError, MAX_PAGE};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;

/// Items per page when `limit` is not given.
pub const DEFAULT_PAGE: usize = 100;

// The OpenAPI attributes below spell the maximum out.
const _: () = assert!(MAX_PAGE == 1000);

/// The query of every list route.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct PageQuery {
    /// Items per page: 1 to 1000, 100 when absent.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u64>,
    /// Where the page starts: the `next_cursor` of the page before. Absent for the first page.
    cursor: Option<String>,
}

impl PageQuery {
    pub(crate) fn new(limit: Option<u64>, cursor: Option<String>) -> PageQuery {
        PageQuery { limit, cursor }
    }

    /// The store's page request, or a 400 for a limit out of range or a cursor this list did not
    /// give.
    pub(crate) fn request<K: CursorKey>(&self) -> Result<PageRequest<K>, ApiError> {
        let limit = match self.limit {
            None => DEFAULT_PAGE,
            Some(limit @ 1..=1000) => limit as usize,
            Some(other) => {
                return Err(ApiError::invalid_argument(format!("limit must be between 1 and {MAX_PAGE}, got {other}")))
            }
        };
        let after = self.cursor.as_deref().map(decode).transpose()?;
        Ok(PageRequest::new(after, limit))
    }
}

/// A key a list is ordered by, as a cursor holds it.
pub(crate) trait CursorKey: Sized {
    /// Tells the cursors of each list apart.
    const TAG: char;
    fn text(&self) -> String;
    /// Exactly the texts [`CursorKey::text`] gives (`parse` takes nothing else).
    fn parse(text: &str) -> Option<Self>;
    /// The schema of the texts `parse` takes: a pattern (anchored) and a length in characters.
    fn schema() -> (String, Option<usize>);
}

/// A pattern `^...$` for the key behind `tag`.
fn tagged(tag: char, pattern: &str) -> String {
    format!("^{tag}{}", pattern.strip_prefix('^').expect("anchored pattern"))
}

impl CursorKey for NamespaceName {
    const TAG: char = 'n';
    fn text(&self) -> String {
        self.as_str().to_owned()
    }
    fn parse(text: &str) -> Option<Self> {
        NamespaceName::new(text).ok()
    }
    fn schema() -> (String, Option<usize>) {
        (tagged(Self::TAG, NAMESPACE_PATTERN), Some(MAX_NAME_CHARS + 1))
    }
}

impl CursorKey for Token {
    const TAG: char = 'g';
    fn text(&self) -> String {
        self.as_str().to_owned()
    }
    fn parse(text: &str) -> Option<Self> {
        Token::new(text).ok()
    }
    fn schema() -> (String, Option<usize>) {
        (tagged(Self::TAG, NAME_PATTERN), Some(MAX_NAME_CHARS + 1))
    }
}

/// A waiter's arrival number. Any run of digits is a place in the queue: one beyond the largest
/// number is after every waiter.
impl CursorKey for u64 {
    const TAG: char = 'w';
    fn text(&self) -> String {
        self.to_string()
    }
    fn parse(text: &str) -> Option<Self> {
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(text.parse().unwrap_or(u64::MAX))
    }
    fn schema() -> (String, Option<usize>) {
        ("^w[0-9]+$".into(), None)
    }
}

impl CursorKey for SessionId {
    const TAG: char = 's';
    fn text(&self) -> String {
        self.to_string()
    }
    fn parse(text: &str) -> Option<Self> {
        SessionId::parse(text).ok()
    }
    fn schema() -> (String, Option<usize>) {
        (tagged(Self::TAG, SESSION_ID_PATTERN), None)
    }
}

impl CursorKey for PoolName {
    const TAG: char = 'p';
    fn text(&self) -> String {
        self.as_str().to_owned()
    }
    fn parse(text: &str) -> Option<Self> {
        PoolName::new(text).ok()
    }
    fn schema() -> (String, Option<usize>) {
        (tagged(Self::TAG, NAME_PATTERN), Some(MAX_NAME_CHARS + 1))
    }
}

impl CursorKey for AllocId {
    const TAG: char = 'a';
    fn text(&self) -> String {
        self.to_string()
    }
    fn parse(text: &str) -> Option<Self> {
        AllocId::parse(text).ok()
    }
    fn schema() -> (String, Option<usize>) {
        (tagged(Self::TAG, ALLOC_ID_PATTERN), None)
    }
}

/// Where a list of applications goes on: its order and the place in it. An id (by id); `~s` and
/// the submission number (by submission; `~S` the newest first); `~e`, when it ended (`-`: not
/// yet), `~` and the submission number (by end; `~E` the latest first). An id never holds `~`.
/// A cursor carries its list's order: the pages after the first go on in it.
impl CursorKey for (AppOrder, AppPlace) {
    const TAG: char = 'x';
    fn text(&self) -> String {
        let (order, place) = self;
        let descending =
            matches!(order, AppOrder::Submitted { descending: true } | AppOrder::Ended { descending: true });
        let letter = |asc: char| if descending { asc.to_ascii_uppercase() } else { asc };
        match place {
            AppPlace::Id(id) => id.as_str().to_owned(),
            AppPlace::Submitted { seq } => format!("~{}{seq}", letter('s')),
            AppPlace::Ended { at, seq } => {
                let at = at.map_or_else(|| "-".to_owned(), |at| at.to_string());
                format!("~{}{at}~{seq}", letter('e'))
            }
        }
    }
    fn parse(text: &str) -> Option<Self> {
        let number = |text: &str| -> Option<u64> {
            (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())).then(|| text.parse().ok()).flatten()
        };
        let Some(rest) = text.strip_prefix('~') else {
            return AppId::new(text).ok().map(|id| (AppOrder::Id, AppPlace::Id(id)));
        };
        let mut chars = rest.chars();
        let kind = chars.next()?;
        let rest = chars.as_str();
        let descending = kind.is_ascii_uppercase();
        match kind.to_ascii_lowercase() {
            's' => Some((AppOrder::Submitted { descending }, AppPlace::Submitted { seq: number(rest)? })),
            'e' => {
                let (at, seq) = rest.split_once('~')?;
                let at = if at == "-" { None } else { Some(number(at)?) };
                Some((AppOrder::Ended { descending }, AppPlace::Ended { at, seq: number(seq)? }))
            }
            _ => None,
        }
    }
    fn schema() -> (String, Option<usize>) {
        let id = ID_PATTERN.strip_prefix('^').and_then(|p| p.strip_suffix('$')).expect("anchored pattern");
        (format!("^{}({id}|~[sS][0-9]{{1,19}}|~[eE]([0-9]{{1,19}}|-)~[0-9]{{1,19}})$", Self::TAG), None)
    }
}

impl CursorKey for TaskId {
    const TAG: char = 't';
    fn text(&self) -> String {
        self.as_str().to_owned()
    }
    fn parse(text: &str) -> Option<Self> {
        TaskId::new(text).ok()
    }
    fn schema() -> (String, Option<usize>) {
        (tagged(Self::TAG, ID_PATTERN), None)
    }
}

/// A page of what the caller may read: the store's pages from `request` on, of which `visible`
/// keeps some, until `request.limit()` are kept or the list ends.
///
/// Invariant: the next cursor is the key of the last item answered, never of one the caller may
/// not read (a cursor shows its key: a page of hidden items must not name them). A caller who
/// may read little of a long list costs one read of it per page.
pub(crate) async fn visible_page<T, K, F, Fut>(
    request: PageRequest<K>,
    mut read: F,
    visible: impl Fn(&T) -> bool,
    key: impl Fn(&T) -> K,
) -> Result<Page<T, K>, StoreError>
where
    F: FnMut(PageRequest<K>) -> Fut,
    Fut: std::future::Future<Output = Result<Page<T, K>, StoreError>>,
{
    let limit = request.limit();
    let mut kept = Vec::new();
    let mut request = request;
    loop {
        let page = read(request).await?;
        let mut items = page.items.into_iter();
        for item in items.by_ref() {
            if visible(&item) {
                kept.push(item);
                if kept.len() == limit {
                    break;
                }
            }
        }
        let more = items.next().is_some() || page.next.is_some();
        if kept.len() == limit || !more {
            let next = if more { kept.last().map(&key) } else { None };
            return Ok(Page { items: kept, next });
        }
        request = PageRequest::new(page.next, limit);
    }
}

/// The cursor of the page after `next`, if there is one.
pub(crate) fn cursor<K: CursorKey>(next: Option<K>) -> Option<String> {
    next.map(|key| format!("{}{}", K::TAG, key.text()))
}

fn decode<K: CursorKey>(cursor: &str) -> Result<K, ApiError> {
    cursor.strip_prefix(K::TAG).and_then(K::parse).ok_or_else(|| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_cursor",
            "the cursor is not one this list gave: pass the `next_cursor` of the page before as it is, or no \
             cursor for the first page",
        )
    })
}

/// The schema of the `cursor` parameter of each list route, for the OpenAPI document: exactly the
/// cursors the route takes.
pub(crate) fn cursor_schemas() -> [(&'static str, Value); 8] {
    fn schema<K: CursorKey>() -> Value {
        let (pattern, max_chars) = K::schema();
        let mut schema = json!({"type": "string", "pattern": pattern, "minLength": 2});
        if let Some(max) = max_chars {
            schema["maxLength"] = json!(max);
        }
        schema
    }
    [
        ("/v1/namespaces", schema::<NamespaceName>()),
        ("/v1/namespaces/{namespace}/grants", schema::<Token>()),
        ("/v1/namespaces/{namespace}/waiters", schema::<u64>()),
        ("/v1/sessions", schema::<SessionId>()),
        ("/v1/pools", schema::<PoolName>()),
        ("/v1/pools/{pool}/allocs", schema::<AllocId>()),
        ("/v1/apps", schema::<(AppOrder, AppPlace)>()),
        ("/v1/apps/{app}/tasks", schema::<TaskId>()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_stay_in_their_list() {
        let name = NamespaceName::new("hive:cluster-ä").unwrap();
        let text = cursor(Some(name.clone())).unwrap();
        assert_eq!(text, "nhive:cluster-ä");
        assert_eq!(decode::<NamespaceName>(&text).unwrap(), name);
        assert_eq!(decode::<u64>(&cursor(Some(42u64)).unwrap()).unwrap(), 42);
        assert_eq!(decode::<u64>("w99999999999999999999999").unwrap(), u64::MAX, "beyond every waiter");
        assert_eq!(cursor::<Token>(None), None);
        // A pool's cursor given to the namespaces list, and cursors made up.
        let pool = cursor(Some(PoolName::new("hive").unwrap())).unwrap();
        for bad in [pool.as_str(), "n", "na::b", "n/x", "", "hive", "w", "w+1", "w-1", "w1x"] {
            let err = match bad.starts_with('w') {
                true => decode::<u64>(bad).map(|_| ()).unwrap_err(),
                false => decode::<NamespaceName>(bad).map(|_| ()).unwrap_err(),
            };
            assert_eq!((err.status, err.code), (StatusCode::BAD_REQUEST, "invalid_cursor"), "{bad}");
        }
    }

    /// The document's pattern of each list's cursors says what `decode` takes.
    #[test]
    fn cursor_patterns_match_what_is_taken() {
        let schemas = cursor_schemas();
        let regex = |path: &str| {
            let (_, schema) = schemas.iter().find(|(p, _)| *p == path).unwrap();
            regex::Regex::new(schema["pattern"].as_str().unwrap()).unwrap()
        };
        let namespaces = regex("/v1/namespaces");
        for text in ["nhive", "nhive:cluster-a", "n名前:ü", "na::b", "n.", "n..", "na/b", "phive", "n"] {
            assert_eq!(namespaces.is_match(text), decode::<NamespaceName>(text).is_ok(), "{text}");
        }
        let grants = regex("/v1/namespaces/{namespace}/grants");
        for text in ["gjob 1", "g...", "g..", "ga:b", "g", "nx"] {
            assert_eq!(grants.is_match(text), decode::<Token>(text).is_ok(), "{text}");
        }
        let waiters = regex("/v1/namespaces/{namespace}/waiters");
        for text in ["w0", "w123", "w99999999999999999999999", "w", "w+1", "w1.0", "n1"] {
            assert_eq!(waiters.is_match(text), decode::<u64>(text).is_ok(), "{text}");
        }
        let sessions = regex("/v1/sessions");
        for text in ["s0123456789abcdef0123456789ABCDEF", "s0123", "a0123456789abcdef"] {
            assert_eq!(sessions.is_match(text), decode::<SessionId>(text).is_ok(), "{text}");
        }
        let allocs = regex("/v1/pools/{pool}/allocs");
        for text in ["a0123456789abcdef", "a0123456789abcdeg", "s0123456789abcdef"] {
            assert_eq!(allocs.is_match(text), decode::<AllocId>(text).is_ok(), "{text}");
        }
    }
}
