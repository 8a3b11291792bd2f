//! Conversions of pools, offers and allocs between wire types and domain types.

use allot_api::ErrorCode;
use allot_core::pools::{
    plugins_of, Alloc, AllocId, AllocNotes, AllocRequest, AllocState, EndReason, EndedAlloc, Offer, PoolName, PoolView,
    APP_LABEL, HELD, OFFER_ID, PLACEHOLDER_LABEL, PLUGINS_LABEL, RESERVED_LABEL_PREFIX, TASK_LABEL,
};
use allot_core::{Millis, Resources};

use allot_store::ExecutorLease;

use crate::error::ApiError;

pub(crate) fn pool_name(name: &str) -> Result<PoolName, ApiError> {
    Ok(PoolName::new(name)?)
}

pub(crate) fn alloc_id(id: &str) -> Result<AllocId, ApiError> {
    Ok(AllocId::parse(id)?)
}

pub(crate) fn resources(text: &str) -> Result<Resources, ApiError> {
    Ok(Resources::parse_api(text)?)
}

pub(crate) fn alloc_request(body: allot_api::Accept) -> Result<AllocRequest, ApiError> {
    owner_labels(body.labels.keys())?;
    Ok(AllocRequest {
        min: resources(&body.min)?,
        max: body.max.as_deref().map(resources).transpose()?,
        owner: body.owner.unwrap_or_default(),
        labels: body.labels,
        metadata: body.metadata.map(metadata_text).transpose()?.flatten(),
    })
}

/// Refuses a label an owner may not set: allot's own (`allot/...`).
fn owner_labels<'a>(mut keys: impl Iterator<Item = &'a String>) -> Result<(), ApiError> {
    match keys.find(|key| key.starts_with(RESERVED_LABEL_PREFIX)) {
        Some(key) => Err(ApiError::of(
            ErrorCode::InvalidArgument,
            format!("label `{key}` is allot's own (`{RESERVED_LABEL_PREFIX}...`): an owner cannot set or remove it"),
        )),
        None => Ok(()),
    }
}

/// An owner's metadata as stored: compact JSON text of an object; `null` is none.
fn metadata_text(value: serde_json::Value) -> Result<Option<String>, ApiError> {
    match value {
        serde_json::Value::Null => Ok(None),
        serde_json::Value::Object(_) => Ok(Some(value.to_string())),
        _ => Err(ApiError::of(ErrorCode::InvalidArgument, "an alloc's `metadata` must be a JSON object (or null)")),
    }
}

/// What `PATCH /v1/pools/{pool}/allocs/{alloc}` changes: the labels removed, then those set (a
/// label in both is set); the metadata replaced, removed (`null`) or kept (absent).
pub(crate) fn alloc_notes(body: allot_api::AnnotateAlloc) -> Result<AllocNotes, ApiError> {
    owner_labels(body.labels.keys().chain(&body.remove_labels))?;
    let mut labels: std::collections::BTreeMap<String, Option<String>> =
        body.remove_labels.into_iter().map(|key| (key, None)).collect();
    labels.extend(body.labels.into_iter().map(|(key, value)| (key, Some(value))));
    let metadata = match body.metadata {
        None => None,
        Some(value) => Some(value.map(metadata_text).transpose()?.flatten()),
    };
    Ok(AllocNotes { labels, metadata })
}

/// What an alloc the scheduler holds has in it, from the labels the scheduler gave it.
pub(crate) fn alloc_task(alloc: &Alloc) -> Option<allot_api::AllocTask> {
    if alloc.expires != HELD {
        return None;
    }
    Some(allot_api::AllocTask {
        app: alloc.labels.get(APP_LABEL)?.clone(),
        task: alloc.labels.get(TASK_LABEL).cloned(),
        placeholder: alloc.labels.get(PLACEHOLDER_LABEL).cloned(),
    })
}

/// A pool as the API answers it, with the daemons whose live executors run it (of `leases`,
/// when read).
/// A pool as the wire shows it, with times relative to `now`.
pub(crate) fn pool(mut view: PoolView, leases: Option<&[ExecutorLease]>, now: Millis) -> allot_api::Pool {
    let run_by = leases.map(|leases| {
        leases.iter().filter(|l| l.live && l.pools.contains(&view.name)).map(|l| l.node.clone()).collect()
    });
    let plugins = plugins_of(&view.labels).map(|types| types.into_iter().map(str::to_owned).collect());
    view.labels.remove(PLUGINS_LABEL);
    allot_api::Pool {
        name: view.name.to_string(),
        capacity: view.capacity.to_string(),
        allocated: view.allocated.to_string(),
        expired: view.expired.to_string(),
        allocs: view.allocs as u64,
        expired_allocs: view.expired_allocs as u64,
        stopped: view.stopped,
        occupied: view.occupied.to_string(),
        cordon: view.cordon.map(|c| allot_api::PoolCordon {
            since_ms_ago: now.saturating_sub(c.since),
            drain_in_ms: c.drain_at.map(|at| at.saturating_sub(now)),
        }),
        stats: allot_api::PoolStats {
            accepted: view.stats.accepted,
            offer_expired: view.stats.offer_expired,
            freed: view.stats.freed,
            reclaimed: view.stats.reclaimed,
        },
        labels: view.labels,
        plugins,
        run_by,
    }
}

/// A pool's `plugins` that lets it run every type its daemon has (the default).
pub(crate) const EVERY_TYPE: &str = "*";

/// The most task types a pool's `plugins` list.
const MAX_PLUGINS: usize = 64;

/// The labels a pool is given by `PUT /v1/pools/{pool}`: those of the body (or the ones it has),
/// with its `plugins` (the body's, or the ones it has) kept in [`PLUGINS_LABEL`]. A body that
/// names that label itself is refused: the list is given as `plugins`.
pub(crate) fn pool_labels(
    labels: Option<allot_core::pools::Labels>,
    plugins: Option<Vec<String>>,
    current: &allot_core::pools::Labels,
) -> Result<Option<allot_core::pools::Labels>, ApiError> {
    if labels.as_ref().is_some_and(|l| l.contains_key(PLUGINS_LABEL)) {
        return Err(ApiError::invalid_argument(format!(
            "label `{PLUGINS_LABEL}` is kept by allot: give the task types the pool runs as `plugins`"
        )));
    }
    if labels.is_none() && plugins.is_none() {
        return Ok(None);
    }
    if let Some(plugins) = &plugins {
        if plugins.len() > MAX_PLUGINS {
            return Err(ApiError::invalid_argument(format!("at most {MAX_PLUGINS} task types in `plugins`")));
        }
        let bad = |t: &&String| *t != EVERY_TYPE && !allot_core::pools::is_task_type(t);
        if let Some(bad) = plugins.iter().find(bad) {
            return Err(ApiError::invalid_argument(format!(
                "task type `{bad}` in `plugins` is not a type: 1 to 100 of A-Z, a-z, 0-9, `.`, `_`, `-` (or `*`: every type)"
            )));
        }
    }
    let mut next = labels.unwrap_or_else(|| current.clone());
    match plugins {
        // Every type again.
        Some(plugins) if plugins.iter().any(|t| t == EVERY_TYPE) => {
            next.remove(PLUGINS_LABEL);
        }
        Some(mut plugins) => {
            plugins.sort();
            plugins.dedup();
            next.insert(PLUGINS_LABEL.to_owned(), plugins.join(","));
        }
        None => {
            if let Some(kept) = current.get(PLUGINS_LABEL) {
                next.insert(PLUGINS_LABEL.to_owned(), kept.clone());
            }
        }
    }
    Ok(Some(next))
}

pub(crate) fn offer(offer: Offer) -> allot_api::Offer {
    allot_api::Offer { id: OFFER_ID.into(), pool: offer.pool.to_string(), available: offer.available.to_string() }
}

/// Who holds an alloc made for a task: it has no lease.
pub(crate) const HELD_BY_SCHEDULER: &str = "scheduler";

/// An alloc as the wire shows it, with times relative to `now`.
pub(crate) fn alloc(alloc: Alloc, ended: Option<(Millis, EndReason)>, now: Millis) -> allot_api::Alloc {
    let reason = |reason: EndReason| match reason {
        EndReason::Freed => allot_api::EndReason::Freed,
        EndReason::Reclaimed => allot_api::EndReason::Reclaimed,
        EndReason::PoolStopped => allot_api::EndReason::PoolStopped,
        EndReason::PoolRemoved => allot_api::EndReason::PoolRemoved,
    };
    let task = alloc_task(&alloc);
    allot_api::Alloc {
        uri: format!("{}/{}", alloc.pool, alloc.id),
        pool: alloc.pool.to_string(),
        id: alloc.id.to_string(),
        resources: alloc.resources.to_string(),
        owner: alloc.owner,
        labels: std::sync::Arc::unwrap_or_clone(alloc.labels),
        // Stored as the edge wrote it: JSON text of an object.
        metadata: alloc.metadata.and_then(|text| serde_json::from_str(&text).ok()),
        task,
        created_ms_ago: now.saturating_sub(alloc.created),
        last_keepalive_ms_ago: alloc.last_keepalive.map(|at| now.saturating_sub(at)),
        expires_in_ms: (alloc.expires != HELD).then(|| alloc.expires as i64 - now as i64),
        held_by: (alloc.expires == HELD).then(|| HELD_BY_SCHEDULER.to_owned()),
        ended: ended.map(|(_, why)| reason(why)),
        ended_ms_ago: ended.map(|(at, _)| now.saturating_sub(at)),
    }
}

pub(crate) fn alloc_state(state: AllocState, now: Millis) -> allot_api::Alloc {
    match state {
        AllocState::Live(live) => alloc(live, None, now),
        AllocState::Ended(ended) => ended_alloc(ended, now),
    }
}

pub(crate) fn ended_alloc(ended: EndedAlloc, now: Millis) -> allot_api::Alloc {
    alloc(ended.alloc, Some((ended.ended_at, ended.reason)), now)
}
