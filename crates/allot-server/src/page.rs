//! Pages of lists: the `limit` and `cursor` query parameters, and opaque cursors.
//!
//! A cursor is the key the next page starts after (a name, a token, an id, an arrival number),
//! written as a tag of its list and the key's text in hex: opaque to clients, checked on the way
//! in (a cursor of another list, or anything else, is `invalid_cursor`), and never stale (the
//! store continues after the key whether or not it is still listed).

use allot_core::pool::{AllocId, PoolName};
use allot_core::{NamespaceName, SessionId, Token};
use allot_store::{PageRequest, MAX_PAGE};
use axum::http::StatusCode;
use serde::Deserialize;

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
    fn parse(text: &str) -> Option<Self>;
}

impl CursorKey for NamespaceName {
    const TAG: char = 'n';
    fn text(&self) -> String {
        self.as_str().to_owned()
    }
    fn parse(text: &str) -> Option<Self> {
        NamespaceName::new(text).ok()
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
}

/// A waiter's arrival number.
impl CursorKey for u64 {
    const TAG: char = 'w';
    fn text(&self) -> String {
        self.to_string()
    }
    fn parse(text: &str) -> Option<Self> {
        text.parse().ok()
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
}

impl CursorKey for PoolName {
    const TAG: char = 'p';
    fn text(&self) -> String {
        self.as_str().to_owned()
    }
    fn parse(text: &str) -> Option<Self> {
        PoolName::new(text).ok()
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
}

/// The cursor of the page after `next`, if there is one.
pub(crate) fn cursor<K: CursorKey>(next: Option<K>) -> Option<String> {
    let key = next?;
    let mut text = String::from(K::TAG);
    for byte in key.text().bytes() {
        text.push_str(&format!("{byte:02x}"));
    }
    Some(text)
}

fn decode<K: CursorKey>(cursor: &str) -> Result<K, ApiError> {
    let invalid = || {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_cursor",
            "the cursor is not one this list gave: pass the `next_cursor` of the page before, or no cursor for the first page",
        )
    };
    let hex = cursor.strip_prefix(K::TAG).ok_or_else(invalid)?;
    if hex.len() % 2 != 0 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(invalid());
    }
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
        .collect::<Result<_, _>>()
        .map_err(|_| invalid())?;
    let text = String::from_utf8(bytes).map_err(|_| invalid())?;
    K::parse(&text).ok_or_else(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_stay_in_their_list() {
        let name = NamespaceName::new("hive:cluster-ä").unwrap();
        let text = cursor(Some(name.clone())).unwrap();
        assert_eq!(decode::<NamespaceName>(&text).unwrap(), name);
        assert_eq!(decode::<u64>(&cursor(Some(42u64)).unwrap()).unwrap(), 42);
        assert_eq!(cursor::<Token>(None), None);
        // A pool's cursor given to the namespaces list, and cursors made up.
        let pool = cursor(Some(PoolName::new("hive").unwrap())).unwrap();
        for bad in [pool.as_str(), "n", "n0", "nzz", "nff", "", "hive"] {
            let err = decode::<NamespaceName>(bad).map(|_| ()).unwrap_err();
            assert_eq!((err.status, err.code), (StatusCode::BAD_REQUEST, "invalid_cursor"), "{bad}");
        }
    }
}
