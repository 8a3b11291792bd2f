//! Sessions on Redis (`lua/sessions.lua`): every session lives in the one `{allot-sessions}` slot
//! with its TTL, its deadline and the namespaces where it held grants. A grant held under a
//! session is kept in its namespace with a copy of the session's deadline: a keepalive renews
//! those copies namespace by namespace (`session_extend`), a close ends the grants there
//! (`session_end`), and each namespace's sweep ends its session grants at that deadline on its
//! own. Every answer reads the time from Redis.

use std::collections::BTreeSet;

use allot_core::{check_session_ttl, LedgerError, NamespaceName, Session, SessionId, Token};
use allot_store::{Page, PageRequest, SessionInfo, StoreError};

use crate::keys::prefix;
use crate::reply::{corrupt, Reply};
use crate::scripts::Function;
use crate::store::Inner;

/// The slot of every session.
const SESSIONS: &str = "allot:{allot-sessions}";

/// A session as its slot answers: Redis's time, its TTL and deadline, and the namespaces it
/// touched.
struct LiveSession {
    now: u64,
    ttl: u64,
    deadline: u64,
    owner: Option<String>,
    namespaces: Vec<String>,
}

/// Calls `lua/sessions.lua`.
async fn call(inner: &Inner, args: &[&str], mutating: bool) -> Result<Reply, StoreError> {
    inner.eval(&inner.scripts.sessions, SESSIONS, args, mutating).await
}

/// Ends the sessions whose deadline has passed (up to 256 a call); answers how many.
pub(crate) async fn sweep(inner: &Inner) -> Result<u64, StoreError> {
    call(inner, &["sweep", ""], true).await?.uint()
}

/// The deadline of live session `id`, noting that it holds grants in `namespace` (an allocate
/// under the session: the grant keeps a copy of the deadline).
pub(crate) async fn touch(inner: &Inner, id: SessionId, namespace: &NamespaceName) -> Result<u64, StoreError> {
    let sid = id.to_string();
    let reply = call(inner, &["touch", &sid, namespace.as_str()], true).await?;
    match session_reply(reply)? {
        Some(session) => Ok(session.deadline),
        None => Err(LedgerError::SessionNotFound(id).into()),
    }
}

pub(crate) async fn open(inner: &Inner, ttl_ms: u64, owner: Option<String>) -> Result<SessionInfo, StoreError> {
    check_session_ttl(ttl_ms)?;
    let id = SessionId(inner.ids.next_u128());
    let (sid, ttl) = (id.to_string(), ttl_ms.to_string());
    let mut reply = call(inner, &["open", &sid, &ttl, owner.as_deref().unwrap_or("")], true).await?;
    if reply.len() != 3 {
        return Err(StoreError::Unavailable("a session id was drawn twice; try again".into()));
    }
    let (now, ttl_ms, deadline) = (reply.uint()?, reply.uint()?, reply.uint()?);
    Ok(SessionInfo {
        session: Session { id, ttl_ms, deadline, grants: BTreeSet::new(), owner },
        expires_in_ms: deadline.saturating_sub(now),
    })
}

pub(crate) async fn keepalive(inner: &Inner, id: SessionId) -> Result<SessionInfo, StoreError> {
    let sid = id.to_string();
    let reply = call(inner, &["keepalive", &sid], true).await?;
    let Some(LiveSession { now, ttl, deadline, owner, namespaces }) = session_reply(reply)? else {
        return Err(LedgerError::SessionNotFound(id).into());
    };
    let deadline_text = deadline.to_string();
    fan_out(inner, &inner.scripts.session_extend, &namespaces, &[&sid, &deadline_text]).await?;
    session_info(inner, id, now, ttl, deadline, owner, &namespaces).await
}

pub(crate) async fn close(inner: &Inner, id: SessionId) -> Result<SessionInfo, StoreError> {
    let sid = id.to_string();
    let reply = call(inner, &["close", &sid], true).await?;
    let Some(LiveSession { now, ttl, deadline, owner, namespaces }) = session_reply(reply)? else {
        return Err(LedgerError::SessionNotFound(id).into());
    };
    // What the session held, before its grants end.
    let info = session_info(inner, id, now, ttl, deadline, owner, &namespaces).await?;
    let deadline_text = deadline.to_string();
    fan_out(inner, &inner.scripts.session_end, &namespaces, &[&sid, &deadline_text]).await?;
    Ok(info)
}

pub(crate) async fn list(
    inner: &Inner,
    page: PageRequest<SessionId>,
) -> Result<Page<SessionInfo, SessionId>, StoreError> {
    let mut reply = call(inner, &["list", ""], false).await?;
    let _now = reply.uint()?;
    let mut live = Vec::new();
    while !reply.is_empty() {
        live.push(SessionId::parse(&reply.text()?).map_err(corrupt)?);
        let (_ttl, _deadline, _owner) = (reply.uint()?, reply.uint()?, reply.text()?);
    }
    // The live sessions are a zset by deadline: the page is picked here, by id.
    let ids = allot_core::first_after(live.into_iter(), |id| id, page.after(), page.limit() + 1);
    let Page { items: ids, next } = Page::from_read(ids, page.limit(), |id| *id);
    let mut items = Vec::with_capacity(ids.len());
    for id in ids {
        // Read each one whole; one that ended meanwhile is left out.
        match get(inner, id).await {
            Ok(info) => items.push(info),
            Err(StoreError::Quotas(LedgerError::SessionNotFound(_))) => {}
            Err(err) => return Err(err),
        }
    }
    Ok(Page { items, next })
}

pub(crate) async fn get(inner: &Inner, id: SessionId) -> Result<SessionInfo, StoreError> {
    let sid = id.to_string();
    let reply = call(inner, &["get", &sid], false).await?;
    let Some(LiveSession { now, ttl, deadline, owner, namespaces }) = session_reply(reply)? else {
        return Err(LedgerError::SessionNotFound(id).into());
    };
    session_info(inner, id, now, ttl, deadline, owner, &namespaces).await
}

/// Reads `{now, ttl, deadline, namespaces...}` of a live session; `None` if it is not.
fn session_reply(mut reply: Reply) -> Result<Option<LiveSession>, StoreError> {
    if reply.is_empty() {
        return Ok(None);
    }
    let (now, ttl, deadline) = (reply.uint()?, reply.uint()?, reply.uint()?);
    let owner = Some(reply.text()?).filter(|owner| !owner.is_empty());
    Ok(Some(LiveSession { now, ttl, deadline, owner, namespaces: reply.rest_texts()? }))
}

/// The grants a session holds in `namespaces`.
async fn session_info(
    inner: &Inner,
    id: SessionId,
    now: u64,
    ttl: u64,
    deadline: u64,
    owner: Option<String>,
    namespaces: &[String],
) -> Result<SessionInfo, StoreError> {
    let mut grants = BTreeSet::new();
    let sid = id.to_string();
    for name in namespaces {
        let Ok(namespace) = NamespaceName::new(name) else { continue };
        let mut reply = inner.eval(&inner.scripts.session_grants, &prefix(&namespace), &[&sid], false).await?;
        for token in reply.rest_texts()? {
            grants.insert((namespace.clone(), Token::new(&token).map_err(corrupt)?));
        }
    }
    Ok(SessionInfo {
        session: Session { id, ttl_ms: ttl, deadline, grants, owner },
        expires_in_ms: deadline.saturating_sub(now),
    })
}

/// Runs a session script in each namespace the session touched, a few at a time.
async fn fan_out(inner: &Inner, lua: &Function, namespaces: &[String], args: &[&str]) -> Result<(), StoreError> {
    let keys: Vec<String> = namespaces.iter().filter_map(|n| NamespaceName::new(n).ok()).map(|n| prefix(&n)).collect();
    let mut calls = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(16) {
        calls.clear();
        for key in chunk {
            calls.push(inner.eval(lua, key, args, true));
        }
        for result in futures_util::future::join_all(calls.drain(..)).await {
            result?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use allot_store::{QuotaStore, Store};

    use super::*;

    /// Regression: the session sweep answered a bare integer, which every sweep (each 100 ms)
    /// read as a corrupt reply.
    #[tokio::test]
    async fn the_session_sweep_answers_how_many_sessions_ended() {
        let server = crate::testing::RedisServer::start();
        let (store, mut clock) = crate::testing::TestClock::open(&server, 1_700_000_000_000).await;
        store.open_session(1000, None).await.unwrap();
        assert_eq!(sweep(&store.inner).await.unwrap(), 0);
        clock.move_to(clock.now() + 1100).await;
        // The daemon's own sweeper may have ended it first: 0 or 1, but never an error.
        assert!(sweep(&store.inner).await.unwrap() <= 1);
        assert!(store.sessions(PageRequest::first(10)).await.unwrap().items.is_empty());
        store.shutdown().await;
    }
}
