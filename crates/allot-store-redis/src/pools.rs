//! Leased resource pools on Redis: [`PoolStore`], where every operation is one call of the `pool`
//! function (`lua/pool.lua`) on the pool's hash slot (`allot:pool:{<pool>}`), timed by Redis's
//! clock; the allocs the scheduler holds for its tasks (no lease, fenced by its term); and the
//! sweep of every pool. The lease rules are the daemon's (`RedisStore::set_pool_rules`; Reflow's
//! by default).

use std::collections::BTreeMap;
use std::time::Duration;

use allot_core::pools::{
    check_alloc_notes, Alloc, AllocId, AllocNotes, AllocRequest, AllocState, Cordon, CordonOrder, EndReason,
    EndedAlloc, Labels, LeaseRules, Offer, PoolError, PoolName, PoolStats, PoolView, HELD,
};
use allot_core::{Millis, ResourceName, Resources};
use allot_store::{Page, PageRequest, PoolStore, StoreError};
use async_trait::async_trait;
use futures_util::{stream, StreamExt};

use crate::keys::hash_tag;
use crate::registry::{register, registry_page};
use crate::reply::{corrupt, Reply};
use crate::store::{Inner, RedisStore};
use crate::wake;

/// The key prefix of a pool: one hash slot per pool.
pub(crate) fn prefix(pool: &PoolName) -> String {
    format!("allot:pool:{}", hash_tag(pool.as_str()))
}

/// `name units frac` items joined by `,`: exact in Lua's doubles (see `lua/pool.lua`).
pub(crate) fn encode(resources: &Resources) -> String {
    let items: Vec<String> =
        resources.iter().map(|(name, milli)| format!("{} {} {}", name, milli / 1000, milli % 1000)).collect();
    items.join(",")
}

pub(crate) fn decode(text: &str) -> Result<Resources, StoreError> {
    let mut resources = Resources::new();
    for item in text.split(',').filter(|i| !i.is_empty()) {
        let mut parts = item.split(' ');
        let (Some(name), Some(units), Some(frac), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(corrupt(format!("resource item `{item}`")));
        };
        let name = ResourceName::new(name).map_err(corrupt)?;
        let units: u64 = units.parse().map_err(|_| corrupt(format!("resource item `{item}`")))?;
        let frac: u64 = frac.parse().map_err(|_| corrupt(format!("resource item `{item}`")))?;
        resources.set_milli(name, units.saturating_mul(1000).saturating_add(frac));
    }
    Ok(resources)
}

/// An alloc as `lua/pool.lua` stores it.
#[derive(serde::Deserialize)]
struct Record {
    r: String,
    o: String,
    #[serde(default, deserialize_with = "labels")]
    l: BTreeMap<String, String>,
    c: u64,
    k: u64,
    e: u64,
    #[serde(default)]
    ea: Option<u64>,
    #[serde(default)]
    er: Option<String>,
    /// 1 for an alloc the scheduler holds (no lease).
    #[serde(default)]
    h: Option<u8>,
    /// Its owner's metadata (JSON text).
    #[serde(default)]
    m: Option<String>,
}

/// Labels as Redis keeps them: cjson writes an empty table as `{}`, and a table as an object of
/// strings; anything else is none.
pub(crate) fn labels_of(value: serde_json::Value) -> BTreeMap<String, String> {
    match value {
        serde_json::Value::Object(map) => {
            map.into_iter().filter_map(|(k, v)| v.as_str().map(|v| (k, v.to_owned()))).collect()
        }
        _ => BTreeMap::new(),
    }
}

fn labels<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<BTreeMap<String, String>, D::Error> {
    use serde::Deserialize;
    Ok(labels_of(serde_json::Value::deserialize(deserializer)?))
}

fn reason(text: &str) -> Result<EndReason, StoreError> {
    match text {
        "freed" => Ok(EndReason::Freed),
        "reclaimed" => Ok(EndReason::Reclaimed),
        "pool_stopped" => Ok(EndReason::PoolStopped),
        "pool_removed" => Ok(EndReason::PoolRemoved),
        other => Err(corrupt(format!("end reason `{other}`"))),
    }
}

/// Reads an alloc record; with its end when it ended.
pub(crate) fn record(pool: &PoolName, id: &str, json: &str) -> Result<AllocState, StoreError> {
    let record: Record = serde_json::from_str(json).map_err(|e| corrupt(format!("alloc record: {e}")))?;
    let alloc = Alloc {
        pool: pool.clone(),
        id: AllocId::parse(id).map_err(corrupt)?,
        resources: decode(&record.r)?,
        owner: record.o,
        labels: std::sync::Arc::new(record.l),
        metadata: record.m,
        created: record.c,
        last_keepalive: (record.k > 0).then_some(record.k),
        expires: if record.h == Some(1) { HELD } else { record.e },
    };
    Ok(match (record.ea, record.er) {
        (Some(ended_at), Some(why)) => AllocState::Ended(EndedAlloc { alloc, ended_at, reason: reason(&why)? }),
        _ => AllocState::Live(alloc),
    })
}

fn live(state: AllocState) -> Result<Alloc, StoreError> {
    match state {
        AllocState::Live(alloc) => Ok(alloc),
        AllocState::Ended(_) => Err(corrupt("an ended alloc where a live one was expected")),
    }
}

fn ended(state: AllocState) -> Result<EndedAlloc, StoreError> {
    match state {
        AllocState::Ended(ended) => Ok(ended),
        AllocState::Live(_) => Err(corrupt("a live alloc where an ended one was expected")),
    }
}

pub(crate) fn rules(inner: &Inner) -> LeaseRules {
    *inner.pool_rules.lock().unwrap_or_else(|p| p.into_inner())
}

/// Remembers Redis's clock, so `Store::now` can relate allocs' times to now.
pub(crate) fn saw_clock(inner: &Inner, now: u64) {
    let mono = inner.time.monotonic_ms();
    let mut clock = inner.redis_clock.lock().unwrap_or_else(|p| p.into_inner());
    *clock = Some(estimate_told(*clock, now, mono));
}

/// The estimate of Redis's clock, `(told, seen)` (a time Redis told, and the daemon's monotonic
/// clock when it was read), after a reply read at `mono` told `now`. It does not step back by
/// less than [`CLOCK_STEP_FOLLOWED_MS`]: a reply read after a later one (two connections, a slow
/// thread) tells an older time, and a time told just after a change must not put that change in
/// the future. A larger step back is Redis's clock being set, and is followed.
fn estimate_told(estimate: Option<(u64, Millis)>, now: u64, mono: Millis) -> (u64, Millis) {
    match estimate {
        Some((told, seen)) => {
            let current = told + mono.saturating_sub(seen);
            if now < current && current - now < CLOCK_STEP_FOLLOWED_MS {
                (told, seen)
            } else {
                (now, mono)
            }
        }
        None => (now, mono),
    }
}

/// How far back Redis's clock must step for the estimate of it to follow.
const CLOCK_STEP_FOLLOWED_MS: u64 = 1_000;

pub(crate) fn now(inner: &Inner) -> Millis {
    match *inner.redis_clock.lock().unwrap_or_else(|p| p.into_inner()) {
        Some((told, seen)) => told + inner.time.monotonic_ms().saturating_sub(seen),
        None => inner.time.wall_ms(),
    }
}

async fn call(inner: &Inner, pool: &PoolName, args: &[&str], mutating: bool) -> Result<(String, Reply), StoreError> {
    if mutating && args.first() != Some(&"sweep") {
        // A change here may bring a deadline sooner than the pool's sweep was put off to.
        inner.pool_sweeps.lock().unwrap_or_else(|p| p.into_inner()).remove(pool);
    }
    let mut reply = inner.eval(&inner.scripts.pool, &prefix(pool), args, mutating).await?;
    let kind = reply.text()?;
    if kind == "err" {
        return Err(error(pool, args, &mut reply)?);
    }
    Ok((kind, reply))
}

fn error(pool: &PoolName, args: &[&str], reply: &mut Reply) -> Result<StoreError, StoreError> {
    let id = || AllocId::parse(args.get(1).copied().unwrap_or("")).map_err(corrupt);
    let err = match reply.text()?.as_str() {
        "pool_not_found" => PoolError::PoolNotFound(pool.clone()),
        "pool_stopped" => PoolError::PoolStopped(pool.clone()),
        "pool_cordoned" => PoolError::PoolCordoned(pool.clone()),
        "pool_in_use" => PoolError::PoolInUse { pool: pool.clone(), allocs: reply.uint()? as usize },
        "offer_expired" => PoolError::OfferExpired {
            pool: pool.clone(),
            wanted: decode(&reply.text()?)?,
            free: Box::new(decode(&reply.text()?)?),
        },
        "exceeds_capacity" => PoolError::ExceedsCapacity {
            pool: pool.clone(),
            wanted: decode(&reply.text()?)?,
            capacity: Box::new(decode(&reply.text()?)?),
        },
        "alloc_not_found" => PoolError::AllocNotFound { pool: pool.clone(), id: id()? },
        "alloc_ended" => PoolError::AllocEnded { pool: pool.clone(), id: id()?, reason: reason(&reply.text()?)? },
        "alloc_id_taken" => PoolError::AllocIdTaken { pool: pool.clone(), id: id()? },
        "deposed" => {
            return Ok(StoreError::Unavailable(format!(
                "a newer scheduler (term {}) has taken over pool `{pool}`",
                reply.uint()?
            )))
        }
        "held_by_scheduler" => PoolError::HeldByScheduler { pool: pool.clone(), id: id()?, owner: reply.text()? },
        "too_large" => {
            let _what = reply.text()?;
            PoolError::TooLarge { what: "labels", bytes: reply.uint()? as usize, max: reply.uint()? as usize }
        }
        other => return Err(corrupt(format!("pool error `{other}`"))),
    };
    Ok(StoreError::Pools(err))
}

pub(crate) fn view_of(pool: &PoolName, reply: &mut Reply) -> Result<PoolView, StoreError> {
    let capacity = decode(&reply.text()?)?;
    let allocated = decode(&reply.text()?)?;
    let expired = decode(&reply.text()?)?;
    let allocs = reply.uint()? as usize;
    let expired_allocs = reply.uint()? as usize;
    let stopped = reply.uint()? == 1;
    let stats = PoolStats {
        accepted: reply.uint()?,
        offer_expired: reply.uint()?,
        freed: reply.uint()?,
        reclaimed: reply.uint()?,
    };
    let labels = labels_of(serde_json::from_str(&reply.text()?).map_err(corrupt)?);
    // Events written before pools had them end here: nothing occupied, not cordoned.
    let mut optional = || if reply.is_empty() { Ok(String::new()) } else { reply.text() };
    let occupied = decode(&optional()?)?;
    let time = |text: String| match text.as_str() {
        "" => Ok(None),
        ms => ms.parse::<Millis>().map(Some).map_err(|_| corrupt(format!("pool time `{ms}`"))),
    };
    let since = time(optional()?)?;
    let drain_at = time(optional()?)?;
    Ok(PoolView {
        name: pool.clone(),
        capacity,
        allocated,
        expired,
        allocs,
        expired_allocs,
        stopped,
        occupied,
        cordon: since.map(|since| Cordon { since, drain_at }),
        stats,
        labels,
    })
}

/// Replaces a pool's labels.
async fn label(inner: &Inner, pool: &PoolName, labels: &Labels) -> Result<PoolView, StoreError> {
    let json = serde_json::to_string(labels).expect("labels always encode");
    let (_, mut reply) = call(inner, pool, &["label", &json], true).await?;
    view_of(pool, &mut reply)
}

/// Creates or changes a pool; with `create_only` an existing pool is left as it is (in the same
/// atomic call).
async fn put(
    inner: &Inner,
    pool: PoolName,
    capacity: Resources,
    create_only: bool,
) -> Result<(bool, PoolView), StoreError> {
    // Listed first: a pool is never in Redis without being in the registry.
    register(inner, "add", "pools", pool.as_str()).await?;
    let mut reply = inner
        .eval(
            &inner.scripts.pool,
            &prefix(&pool),
            &["put", &encode(&capacity), if create_only { "1" } else { "0" }],
            true,
        )
        .await?;
    let created = reply.int()? == 1;
    Ok((created, view_of(&pool, &mut reply)?))
}

async fn remove(inner: &Inner, pool: PoolName, force: bool) -> Result<usize, StoreError> {
    let (_, mut reply) = call(inner, &pool, &["remove", if force { "1" } else { "0" }], true).await?;
    let allocs = reply.uint()? as usize;
    register(inner, "remove", "pools", pool.as_str()).await?;
    Ok(allocs)
}

async fn view(inner: &Inner, pool: &PoolName) -> Result<PoolView, StoreError> {
    let (_, mut reply) = call(inner, pool, &["view"], false).await?;
    view_of(pool, &mut reply)
}

async fn list(inner: &Inner, page: PageRequest<PoolName>) -> Result<Page<PoolView, PoolName>, StoreError> {
    let names = registry_page(inner, "pools", page.after().map(PoolName::as_str), page.limit())
        .await?
        .iter()
        .filter_map(|name| PoolName::new(name).ok())
        .collect();
    let Page { items: names, next } = Page::from_read(names, page.limit(), PoolName::clone);
    let mut views = Vec::with_capacity(names.len());
    for chunk in names.chunks(16) {
        views.extend(futures_util::future::join_all(chunk.iter().map(|name| view(inner, name))).await);
    }
    let mut items = Vec::new();
    for view in views {
        match view {
            Ok(view) => items.push(view),
            // Listed but removed meanwhile.
            Err(StoreError::Pools(PoolError::PoolNotFound(_))) => {}
            Err(err) => return Err(err),
        }
    }
    Ok(Page { items, next })
}

async fn offer(inner: &Inner, pool: PoolName) -> Result<Option<Offer>, StoreError> {
    let (_, mut reply) = call(inner, &pool, &["offer"], false).await?;
    let available = decode(&reply.text()?)?;
    Ok((!available.is_empty()).then_some(Offer { pool, available }))
}

async fn accept(inner: &Inner, pool: PoolName, request: AllocRequest) -> Result<Alloc, StoreError> {
    accept_as(inner, pool, request).await
}

/// Accepts for a task the scheduler places, under the id it chose: the alloc has no lease
/// ([`HELD`]) until [`end_held`]. Idempotent; refused in a term older than the pool has seen.
async fn accept_held(
    inner: &Inner,
    pool: PoolName,
    request: AllocRequest,
    id: AllocId,
    fencing: u64,
) -> Result<Alloc, StoreError> {
    request.check()?;
    let (min, max) = (encode(&request.min), encode(&request.upper()));
    let labels = serde_json::to_string(&request.labels).map_err(|e| StoreError::Invalid(e.to_string()))?;
    let (id, fencing) = (id.to_string(), fencing.to_string());
    let metadata = request.metadata.as_deref().unwrap_or("");
    let args = ["accept", &id, &min, &max, &request.owner, &labels, "0", "1", &fencing, metadata];
    let (_, mut reply) = call(inner, &pool, &args, true).await?;
    let json = reply.text()?;
    saw_clock(inner, reply.uint()?);
    live(record(&pool, &id, &json)?)
}

/// Ends an alloc the scheduler holds (its task ended); one that is gone already is no error.
async fn end_held(inner: &Inner, pool: PoolName, id: AllocId, fencing: u64) -> Result<(), StoreError> {
    match call(inner, &pool, &["free", &id.to_string(), "held", &fencing.to_string()], true).await {
        Ok(_) | Err(StoreError::Pools(PoolError::PoolNotFound(_) | PoolError::AllocNotFound { .. })) => Ok(()),
        Err(err) => Err(err),
    }
}

async fn accept_as(inner: &Inner, pool: PoolName, request: AllocRequest) -> Result<Alloc, StoreError> {
    request.check()?;
    let (min, max) = (encode(&request.min), encode(&request.upper()));
    let labels = serde_json::to_string(&request.labels).map_err(|e| StoreError::Invalid(e.to_string()))?;
    let initial = rules(inner).initial_ms.to_string();
    loop {
        // Ids are drawn at random [Reflow `newID`]; a taken one is drawn again.
        let id = AllocId(inner.ids.next_u64()).to_string();
        let metadata = request.metadata.as_deref().unwrap_or("");
        let args = ["accept", &id, &min, &max, &request.owner, &labels, &initial, "0", "", metadata];
        match call(inner, &pool, &args, true).await {
            Err(StoreError::Pools(PoolError::AllocIdTaken { .. })) => continue,
            Err(err) => return Err(err),
            Ok((_, mut reply)) => {
                let json = reply.text()?;
                saw_clock(inner, reply.uint()?);
                return live(record(&pool, &id, &json)?);
            }
        }
    }
}

async fn keepalive(inner: &Inner, pool: PoolName, id: AllocId, interval_ms: u64) -> Result<(u64, Alloc), StoreError> {
    let interval = rules(inner).grant(interval_ms)?;
    let id_text = id.to_string();
    let args = ["keepalive", &id_text, &interval.to_string()];
    let (_, mut reply) = call(inner, &pool, &args, true).await?;
    let json = reply.text()?;
    saw_clock(inner, reply.uint()?);
    let granted = reply.uint()?;
    Ok((granted, live(record(&pool, &id_text, &json)?)?))
}

async fn annotate(inner: &Inner, pool: PoolName, id: AllocId, notes: AllocNotes) -> Result<Alloc, StoreError> {
    // What the change leaves is checked by the function (the labels it keeps are there only).
    let set: BTreeMap<String, String> =
        notes.labels.iter().filter_map(|(k, v)| Some((k.clone(), v.clone()?))).collect();
    check_alloc_notes(&set, notes.metadata.as_ref().and_then(Option::as_deref))?;
    let changes: serde_json::Map<String, serde_json::Value> = notes
        .labels
        .into_iter()
        .map(|(key, value)| (key, value.map_or(serde_json::Value::Bool(false), serde_json::Value::String)))
        .collect();
    let changes = serde_json::Value::Object(changes).to_string();
    let (op, text) = match &notes.metadata {
        None => ("keep", ""),
        Some(None) => ("clear", ""),
        Some(Some(text)) => ("set", text.as_str()),
    };
    let id_text = id.to_string();
    let (_, mut reply) = call(inner, &pool, &["annotate", &id_text, &changes, op, text], true).await?;
    let json = reply.text()?;
    saw_clock(inner, reply.uint()?);
    live(record(&pool, &id_text, &json)?)
}

/// Names what is in an alloc the scheduler holds, in term `fencing`; one that is gone or not
/// held is no error.
async fn label_held(
    inner: &Inner,
    pool: PoolName,
    id: AllocId,
    labels: &Labels,
    fencing: u64,
) -> Result<(), StoreError> {
    let labels = serde_json::to_string(labels).map_err(|e| StoreError::Invalid(e.to_string()))?;
    let args = ["label_held", &id.to_string(), &labels, &fencing.to_string()];
    match call(inner, &pool, &args, true).await {
        Ok(_) | Err(StoreError::Pools(PoolError::PoolNotFound(_))) => Ok(()),
        Err(err) => Err(err),
    }
}

async fn free(inner: &Inner, pool: PoolName, id: AllocId) -> Result<EndedAlloc, StoreError> {
    let id_text = id.to_string();
    let (_, mut reply) = call(inner, &pool, &["free", &id_text], true).await?;
    let json = reply.text()?;
    saw_clock(inner, reply.uint()?);
    ended(record(&pool, &id_text, &json)?)
}

async fn inspect(inner: &Inner, pool: PoolName, id: AllocId) -> Result<AllocState, StoreError> {
    let id_text = id.to_string();
    let (_, mut reply) = call(inner, &pool, &["inspect", &id_text], false).await?;
    let json = reply.text()?;
    saw_clock(inner, reply.uint()?);
    record(&pool, &id_text, &json)
}

async fn allocs(inner: &Inner, pool: PoolName, page: PageRequest<AllocId>) -> Result<Page<Alloc, AllocId>, StoreError> {
    // Live allocs are a hash: the page is picked from its keys here, then its allocs are read.
    let ids = inner.hash_keys(&format!("{}:allocs", prefix(&pool))).await?;
    let ids = ids.iter().map(|id| AllocId::parse(id).map_err(corrupt)).collect::<Result<Vec<_>, _>>()?;
    let ids = allot_core::first_after(ids.into_iter(), |id| id, page.after(), page.limit() + 1);
    let Page { items: ids, next } = Page::from_read(ids, page.limit(), |id| *id);
    let texts: Vec<String> = ids.iter().map(AllocId::to_string).collect();
    let mut args = vec!["allocs"];
    args.extend(texts.iter().map(String::as_str));
    let (_, mut reply) = call(inner, &pool, &args, false).await?;
    saw_clock(inner, reply.uint()?);
    let mut items = Vec::new();
    while !reply.is_empty() {
        let id = reply.text()?;
        let json = reply.text()?;
        items.push(live(record(&pool, &id, &json)?)?);
    }
    Ok(Page { items, next })
}

async fn stop_if_idle(inner: &Inner, pool: PoolName, idle_ms: u64) -> Result<(bool, u64), StoreError> {
    allot_core::pools::check_idle(idle_ms)?;
    let (_, mut reply) = call(inner, &pool, &["stop", &idle_ms.to_string()], true).await?;
    Ok((reply.uint()? == 1, reply.uint()?))
}

/// The longest a pool's sweep is put off when nothing it keeps falls due sooner: the bound on how
/// late a deadline another daemon brought is seen (this daemon's own changes sweep at once).
const MAX_SWEEP_PUT_OFF: Duration = Duration::from_secs(1);

/// One sweep of every pool whose next deadline has come, or that was not swept for
/// [`MAX_SWEEP_PUT_OFF`] (run by every daemon; idempotent). A pool's sweep answers when it next
/// has work, so thousands of pools whose allocs the scheduler holds (no lease) cost a call each
/// a second, not ten.
pub(crate) async fn sweep_all(inner: &Inner, names: &[PoolName]) {
    let rules = rules(inner);
    let (reclaim, retention) = (rules.reclaim_after_ms.to_string(), rules.retention_ms.to_string());
    let now = inner.time.monotonic_ms();
    let due: Vec<&PoolName> = {
        let mut sweeps = inner.pool_sweeps.lock().unwrap_or_else(|p| p.into_inner());
        if sweeps.len() > names.len() {
            let listed: std::collections::HashSet<&PoolName> = names.iter().collect();
            sweeps.retain(|name, _| listed.contains(name));
        }
        names.iter().filter(|name| sweeps.get(*name).is_none_or(|next| *next <= now)).collect()
    };
    stream::iter(due)
        .for_each_concurrent(16, |name| {
            let (reclaim, retention) = (&reclaim, &retention);
            async move {
                match call(inner, name, &["sweep", reclaim, retention], true).await {
                    Ok((_, mut reply)) => {
                        let next_in = reply.uint().and_then(|_| reply.uint()).and_then(|_| reply.int());
                        let most = MAX_SWEEP_PUT_OFF.as_millis() as u64;
                        let put_off = match next_in {
                            Ok(ms) if ms >= 0 => (ms as u64).min(most),
                            _ => most,
                        };
                        let next = inner.time.monotonic_ms() + put_off;
                        inner.pool_sweeps.lock().unwrap_or_else(|p| p.into_inner()).insert(name.clone(), next);
                    }
                    Err(err) => tracing::debug!(pool = %name, error = %err, "pool sweep failed"),
                }
            }
        })
        .await;
}

#[async_trait]
impl PoolStore for RedisStore {
    async fn put_pool(&self, name: PoolName, capacity: Resources) -> Result<(bool, PoolView), StoreError> {
        self.live()?;
        let put = put(&self.inner, name, capacity, false).await?;
        wake::nudge_scheduler(&self.inner).await;
        Ok(put)
    }

    async fn seed_pool(&self, name: PoolName, capacity: Resources) -> Result<(bool, PoolView), StoreError> {
        self.live()?;
        let put = put(&self.inner, name, capacity, true).await?;
        wake::nudge_scheduler(&self.inner).await;
        Ok(put)
    }

    async fn remove_pool(&self, name: PoolName, force: bool) -> Result<usize, StoreError> {
        self.live()?;
        remove(&self.inner, name, force).await
    }

    async fn pools(&self, page: PageRequest<PoolName>) -> Result<Page<PoolView, PoolName>, StoreError> {
        list(&self.inner, page).await
    }

    async fn pool(&self, name: PoolName) -> Result<PoolView, StoreError> {
        view(&self.inner, &name).await
    }

    async fn offer(&self, name: PoolName) -> Result<Option<Offer>, StoreError> {
        offer(&self.inner, name).await
    }

    async fn accept(&self, name: PoolName, request: AllocRequest) -> Result<Alloc, StoreError> {
        self.live()?;
        accept(&self.inner, name, request).await
    }

    async fn keepalive_alloc(&self, name: PoolName, id: AllocId, interval_ms: u64) -> Result<(u64, Alloc), StoreError> {
        self.live()?;
        keepalive(&self.inner, name, id, interval_ms).await
    }

    async fn annotate_alloc(&self, name: PoolName, id: AllocId, notes: AllocNotes) -> Result<Alloc, StoreError> {
        self.live()?;
        annotate(&self.inner, name, id, notes).await
    }

    async fn free_alloc(&self, name: PoolName, id: AllocId) -> Result<EndedAlloc, StoreError> {
        self.live()?;
        free(&self.inner, name, id).await
    }

    async fn inspect_alloc(&self, name: PoolName, id: AllocId) -> Result<AllocState, StoreError> {
        inspect(&self.inner, name, id).await
    }

    async fn allocs(&self, name: PoolName, page: PageRequest<AllocId>) -> Result<Page<Alloc, AllocId>, StoreError> {
        allocs(&self.inner, name, page).await
    }

    async fn stop_if_idle_for(&self, name: PoolName, idle_ms: u64) -> Result<(bool, u64), StoreError> {
        self.live()?;
        stop_if_idle(&self.inner, name, idle_ms).await
    }

    async fn label_pool(&self, name: PoolName, labels: Labels) -> Result<PoolView, StoreError> {
        self.live()?;
        label(&self.inner, &name, &labels).await
    }

    async fn occupy_pool(&self, name: PoolName, occupied: Resources) -> Result<PoolView, StoreError> {
        self.live()?;
        let (_, mut reply) = call(&self.inner, &name, &["occupy", &encode(&occupied)], true).await?;
        let view = view_of(&name, &mut reply)?;
        // Less room may leave tasks that no longer fit: whoever schedules looks.
        wake::nudge_scheduler(&self.inner).await;
        Ok(view)
    }

    async fn cordon_pool(&self, name: PoolName, order: CordonOrder) -> Result<PoolView, StoreError> {
        self.live()?;
        let (order, grace) = match order {
            CordonOrder::Cordon => ("cordon", 0),
            CordonOrder::Drain { grace_ms } => ("drain", grace_ms),
            CordonOrder::Uncordon => ("uncordon", 0),
        };
        let (_, mut reply) = call(&self.inner, &name, &["cordon", order, &grace.to_string()], true).await?;
        let view = view_of(&name, &mut reply)?;
        saw_clock(&self.inner, reply.uint()?);
        wake::nudge_scheduler(&self.inner).await;
        Ok(view)
    }
}

impl RedisStore {
    /// Accepts a pool's offer for a task the scheduler places, under the id it chose, in the
    /// scheduler's term `fencing`: the alloc has no lease until [`RedisStore::end_held_alloc`]; a
    /// keepalive changes nothing and a free by hand is refused.
    pub async fn accept_held_alloc(
        &self,
        pool: PoolName,
        request: AllocRequest,
        id: AllocId,
        fencing: u64,
    ) -> Result<Alloc, StoreError> {
        accept_held(&self.inner, pool, request, id, fencing).await
    }

    /// Ends an alloc the scheduler holds (its task ended), in the scheduler's term `fencing`.
    pub async fn end_held_alloc(&self, pool: PoolName, id: AllocId, fencing: u64) -> Result<(), StoreError> {
        end_held(&self.inner, pool, id, fencing).await
    }

    /// Names what is in an alloc the scheduler holds (a task that took a placeholder over), in
    /// the scheduler's term `fencing`.
    pub async fn label_held_alloc(
        &self,
        pool: PoolName,
        id: AllocId,
        labels: &Labels,
        fencing: u64,
    ) -> Result<(), StoreError> {
        label_held(&self.inner, pool, id, labels, fencing).await
    }

    /// Sets the room the scheduler holds on the pool for preemptors (none: `spared` empty), in
    /// its term `fencing`: no alloc but the scheduler's own takes it, and no offer shows it. A
    /// pool that is gone holds nothing.
    pub async fn spare_pool(&self, pool: PoolName, spared: &Resources, fencing: u64) -> Result<(), StoreError> {
        let (spared, fencing) = (encode(spared), fencing.to_string());
        match call(&self.inner, &pool, &["spare", &spared, &fencing], true).await {
            Ok(_) | Err(StoreError::Pools(PoolError::PoolNotFound(_))) => Ok(()),
            Err(err) => Err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_of_redis_clock_never_steps_back_for_a_late_reply_but_follows_a_clock_set_back() {
        let now = |(told, seen): (u64, Millis), mono: Millis| told + (mono - seen);
        let first = estimate_told(None, 100_000, 50);
        assert_eq!(now(first, 53), 100_003);
        // A reply read at 53 that told 100,001 (sent before the last one was answered): kept.
        let raced = estimate_told(Some(first), 100_001, 53);
        assert_eq!(now(raced, 53), 100_003);
        // A reply that tells a later time than the estimate moves it on (the estimate lags by
        // the flight of the reply it came from).
        let later = estimate_told(Some(raced), 100_010, 55);
        assert_eq!(now(later, 55), 100_010);
        // Redis's clock set back by a minute: followed.
        let set_back = estimate_told(Some(later), 40_010, 56);
        assert_eq!(now(set_back, 56), 40_010);
    }

    #[test]
    fn resources_travel_exactly() {
        for text in ["cpu=4,mem=16GiB", "cpu=0.5,disk=20TiB,gpu=1", "x=0.001", ""] {
            let resources: Resources = text.parse().unwrap();
            assert_eq!(decode(&encode(&resources)).unwrap(), resources, "{text}");
        }
        assert_eq!(encode(&"cpu=1.5".parse().unwrap()), "cpu 1 500");
    }
}
