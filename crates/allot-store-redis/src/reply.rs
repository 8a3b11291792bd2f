//! Script replies and records, read back into domain types. A reply that does not have the
//! expected shape is a bug or a foreign writer: it becomes [`StoreError::Unavailable`] with what
//! was wrong, never a panic.

use std::collections::VecDeque;

use allot_core::{
    CapLevel, Grant, Lease, LedgerError, NamespaceName, NamespaceStats, NamespaceView, Refusal, Scope, SessionId, Token,
};
use allot_store::{GrantInfo, StoreError};
use redis::Value;

pub(crate) fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("unexpected reply from Redis: {what}"))
}

/// A string, or a number, as text; anything else (or a string that is not UTF-8) given back.
pub(crate) fn into_text(value: Value) -> Result<String, Value> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes).map_err(|err| Value::BulkString(err.into_bytes())),
        Value::SimpleString(text) => Ok(text),
        Value::Int(n) => Ok(n.to_string()),
        other => Err(other),
    }
}

/// The items of a reply array, taken from the front.
pub(crate) struct Reply(VecDeque<Value>);

impl Reply {
    pub(crate) fn new(value: Value) -> Result<Reply, StoreError> {
        match value {
            Value::Array(items) => Ok(Reply(items.into())),
            other => Err(corrupt(format!("expected an array, got {other:?}"))),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn text(&mut self) -> Result<String, StoreError> {
        match self.0.pop_front() {
            Some(value) => into_text(value).map_err(|value| corrupt(format!("expected a string, got {value:?}"))),
            None => Err(corrupt("expected a string, got nothing")),
        }
    }

    pub(crate) fn int(&mut self) -> Result<i64, StoreError> {
        match self.0.pop_front() {
            Some(Value::Int(n)) => Ok(n),
            Some(Value::BulkString(bytes)) => {
                std::str::from_utf8(&bytes).ok().and_then(|s| s.parse().ok()).ok_or_else(|| corrupt("not a number"))
            }
            other => Err(corrupt(format!("expected a number, got {other:?}"))),
        }
    }

    /// The next item as it came (an array, say).
    pub(crate) fn value(&mut self) -> Result<Value, StoreError> {
        self.0.pop_front().ok_or_else(|| corrupt("expected an item, got nothing"))
    }

    pub(crate) fn uint(&mut self) -> Result<u64, StoreError> {
        u64::try_from(self.int()?).map_err(|_| corrupt("a negative count"))
    }

    /// A time left in ms; -1 stands for none.
    pub(crate) fn expires_in(&mut self) -> Result<Option<u64>, StoreError> {
        let n = self.int()?;
        Ok(u64::try_from(n).ok())
    }

    pub(crate) fn rest_texts(&mut self) -> Result<Vec<String>, StoreError> {
        let mut texts = Vec::with_capacity(self.0.len());
        while !self.0.is_empty() {
            texts.push(self.text()?);
        }
        Ok(texts)
    }
}

/// Reads a grant record (see `lua/namespace.lua`).
pub(crate) fn grant(namespace: &NamespaceName, token: &str, record: &str) -> Result<Grant, StoreError> {
    let f: Vec<&str> = record.split('\n').collect();
    if f.len() != 9 {
        return Err(corrupt(format!("grant record with {} fields", f.len())));
    }
    let number = |i: usize| f[i].parse::<u64>().map_err(|_| corrupt(format!("grant field {i} is `{}`", f[i])));
    let lease = match f[3] {
        "n" => Lease::None,
        "t" => Lease::Ttl { ttl_ms: number(4)?, deadline: number(5)? },
        "s" => Lease::Session(SessionId::parse(f[6]).map_err(corrupt)?),
        other => return Err(corrupt(format!("lease kind `{other}`"))),
    };
    Ok(Grant {
        namespace: namespace.clone(),
        token: Token::new(token).map_err(corrupt)?,
        units: number(0)?,
        scope: scope(f[7], f[8])?,
        fencing: number(1)?,
        lease,
        granted_at: number(2)?,
    })
}

pub(crate) fn scope(project: &str, namespace: &str) -> Result<Option<Scope>, StoreError> {
    if project.is_empty() {
        return Ok(None);
    }
    Scope::new(project, namespace).map(Some).map_err(corrupt)
}

/// Reads `record, expires_in` into a grant.
pub(crate) fn grant_info(reply: &mut Reply, namespace: &NamespaceName, token: &str) -> Result<GrantInfo, StoreError> {
    let record = reply.text()?;
    let grant = grant(namespace, token, &record)?;
    Ok(GrantInfo { grant, expires_in_ms: reply.expires_in()? })
}

/// Reads the twelve numbers of `namespace_view`.
pub(crate) fn view(name: &NamespaceName, reply: &mut Reply) -> Result<NamespaceView, StoreError> {
    Ok(NamespaceView {
        name: name.clone(),
        quota: reply.uint()?,
        granted_units: reply.uint()?,
        grants: reply.uint()? as usize,
        waiters: reply.uint()? as usize,
        waiting_units: reply.uint()?,
        longest_wait_ms: reply.uint()?,
        next_fencing: reply.uint()?,
        stats: NamespaceStats {
            granted: reply.uint()?,
            exhausted: reply.uint()?,
            cap_exceeded: reply.uint()?,
            released: reply.uint()?,
            expired: reply.uint()?,
        },
    })
}

pub(crate) fn cap_level(level: &str) -> Result<Option<CapLevel>, StoreError> {
    match level {
        "project" => Ok(Some(CapLevel::Project)),
        "namespace" => Ok(Some(CapLevel::Namespace)),
        "exhausted" | "" => Ok(None),
        other => Err(corrupt(format!("refusal `{other}`"))),
    }
}

/// Reads `level, cap, held` into a refusal.
pub(crate) fn refusal(reply: &mut Reply) -> Result<Refusal, StoreError> {
    let level = cap_level(&reply.text()?)?;
    let (cap, held) = (reply.uint()?, reply.uint()?);
    Ok(match level {
        Some(level) => Refusal::CapExceeded { level, cap, held },
        None => Refusal::Exhausted,
    })
}

/// Reads the fields after `'err'` (or an answer's `'x'`) into the error they name.
pub(crate) fn error(
    namespace: &NamespaceName,
    token: Option<&Token>,
    reply: &mut Reply,
) -> Result<StoreError, StoreError> {
    let code = reply.text()?;
    let err = match code.as_str() {
        "namespace_not_found" => LedgerError::NamespaceNotFound(namespace.clone()),
        "grant_not_found" => LedgerError::GrantNotFound {
            namespace: namespace.clone(),
            token: token.cloned().ok_or_else(|| corrupt("grant_not_found without a token"))?,
        },
        "stale_fencing" => LedgerError::StaleFencing { given: reply.uint()?, current: reply.uint()? },
        "namespace_in_use" => {
            LedgerError::NamespaceInUse { namespace: namespace.clone(), grants: reply.uint()? as usize }
        }
        "held_by_scheduler" => LedgerError::NamespaceHeldByScheduler {
            namespace: namespace.clone(),
            grants: reply.uint()? as usize,
            token: Token::new(&reply.text()?).map_err(corrupt)?,
        },
        "session_not_found" | "session" => {
            LedgerError::SessionNotFound(SessionId::parse(&reply.text()?).map_err(corrupt)?)
        }
        "token_conflict" => {
            let waiting = reply.text()? == "waiting";
            let field = match reply.text()?.as_str() {
                "units" => "units",
                "scope" => "scope",
                "caps" => "caps",
                "ttl_ms" => "ttl_ms",
                "session" => "session",
                other => return Err(corrupt(format!("token_conflict on field `{other}`"))),
            };
            LedgerError::TokenConflict {
                token: token.cloned().ok_or_else(|| corrupt("token_conflict without a token"))?,
                waiting,
                field,
                held: reply.text()?,
                asked: reply.text()?,
            }
        }
        other => return Err(corrupt(format!("error code `{other}`"))),
    };
    Ok(StoreError::Quotas(err))
}
