//! Snapshots of a Redis store, and restores into one. The archive is the one every backend writes
//! (`allot_store::snapshot`): the embedded store's records, so an archive moves between the two
//! stores (docs/design.md, "Snapshots"). At length, as one thing: taking and restoring walk the
//! same slots with the same records, each table's way both ways side by side.
//!
//! **Taken slot by slot.** Each namespace, each pool, the sessions, the applications, the runs
//! and the access records live in a hash slot of their own (on a cluster, perhaps on different
//! servers), and each is read whole by one call of `lua/snapshot.lua` (the applications by the
//! scheduler's own `load`): each is as it was at one moment, no change half in. Different slots
//! are read at different moments, in this order: the change feed's revision, the namespaces
//! (with their grants), the sessions, the pools (with their allocs), the applications, the runs,
//! the access records. So:
//! - every change the feed had given a revision up to the archive's revision is in it; later
//!   ones may be, slot by slot;
//! - a grant held under a session that ended before the sessions were read is left out (it ended
//!   with its session); a session opened after its namespace was read has no grant there yet;
//! - the applications, the allocs the scheduler holds and the tokens it took agree: the snapshot
//!   is taken on the daemon that schedules (the edge sends `GET /v1/snapshot` there), which
//!   does not schedule until it is taken (quotas and pools go on meanwhile).
//!
//! **Restored** into a Redis that holds no allot state (or, told to, after removing what it holds,
//! from every primary of a cluster), from an archive checked whole first: a damaged archive writes
//! nothing. Times move onto Redis's clock (`--leases resume`: each lease has what it had left;
//! `expire`: less the time since the snapshot), fencing counters go on from the archive's, and the
//! change feed gives revisions above the archive's (by the restore's margin) and keeps nothing
//! before: a watcher resuming from an older revision is told to list again (410).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use allot_core::pools::{Labels, PoolName, HELD};
use allot_core::{NamespaceName, Resources, SessionId};
use allot_store::access::{ApiTokenRecord, BindingRecord};
use allot_store::embedded::snapshot::{LeaseTime, RestoreOptions, Restored};
use allot_store::records::access::{binding_key, token_key};
use allot_store::records::apps::{AppRecord, QueueRecord, TaskRecord};
use allot_store::records::runs::{CachedRecord, RunRow};
use allot_store::records::{
    self, resources_from, resources_record, AllocRecord, GrantRecord, LeaseRecord, NamespaceRecord, PoolRecord,
    ResourcesRecord, SessionRecord, FORMAT_VERSION,
};
use allot_store::snapshot::{
    decode_key, encode_key, SnapshotError, SnapshotHeader, SnapshotReader, SnapshotSummary, SnapshotWriter, Table,
    SNAPSHOT_FORMAT,
};
use allot_store::snapshot_rebase::{rebase, RebaseError};
use allot_store::StoreError;
use redis::Value;

use crate::apps::lease::LeaseState;
use crate::apps::records::APPS_PREFIX;
use crate::cluster::ClusterLink;
use crate::errors::redis_error;
use crate::keys::{prefix, unescape_tag};
use crate::reply::{corrupt, into_text, Reply};
use crate::store::{Inner, RedisStore};
use crate::{pools, registry};

const SESSIONS_SLOT: &str = "allot:{allot-sessions}";
const RUNS_SLOT: &str = "allot:{allot-runs}";
const ACCESS_SLOT: &str = "allot:{allot-access}";
const FEED_SLOT: &str = "allot:{allot-feed}";
/// Records written per call of a restore, and the bytes after which a call goes out sooner.
const BATCH: usize = 500;
const BATCH_BYTES: usize = 8 << 20;
/// The expiry `lua/pool.lua` gives an alloc the scheduler holds (its `HELD`).
const HELD_EXPIRY: u64 = 99_999_999_999_999;
/// How long the restore's hold of the scheduler's lease runs unless renewed (every sixth of it).
const RESTORE_LEASE_TTL: std::time::Duration = std::time::Duration::from_secs(6);
/// Set while a restore writes (what it restores, and since when): a daemon does not start on a
/// Redis that holds it, and only a restore with `--replace` goes on from it.
const RESTORING_KEY: &str = "allot:{allot-registry}:restoring";

/// Why a restore into Redis made nothing (or, for `Store`, stopped part way: see the message).
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error(transparent)]
    Record(#[from] RebaseError),
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("this Redis already holds allot's state ({what}): a restore fills an empty one (pass --replace to remove what it holds first)")]
    NotEmpty { what: String },
    #[error("`{holder}` is using this Redis (a daemon that holds or asks for the scheduler's lease, or a restore that holds it; it counts as gone {left_ms} ms from now unless it asks again): stop every daemon that uses it, then restore")]
    InUse { holder: String, left_ms: u64 },
    #[error(
        "the restore stopped part way, and this Redis holds part of the archive (restore again with --replace): {0}"
    )]
    Store(#[from] StoreError),
}

impl RedisStore {
    /// Writes an archive of everything the store holds to `out`, slot by slot (see the module's
    /// documentation), and answers what it wrote.
    pub async fn snapshot_to(&self, out: &mut dyn Write) -> Result<(SnapshotHeader, SnapshotSummary), StoreError> {
        self.live()?;
        let inner = &self.inner;
        // No scheduling meanwhile (when this daemon schedules: the edge sends the call to the
        // one that does): the applications, the allocs the scheduler holds and the tokens it
        // took are read as of one moment between its operations.
        let _paused = inner.apps.leader.lock().await;
        let revision = feed_revision(inner).await?;
        let now = call(inner, FEED_SLOT, &["now"], false).await?.uint()?;
        let header = SnapshotHeader {
            format: SNAPSHOT_FORMAT,
            records_format: FORMAT_VERSION,
            revision,
            clock_ms: now,
            taken_at_ms: now,
            backend: "redis".into(),
        };
        let mut writer = SnapshotWriter::new(BufWriter::with_capacity(1 << 20, out), &header).map_err(written)?;
        let (mut key, mut value) = (Vec::new(), Vec::new());

        // The namespaces (listed, or removed with their fencing counter kept), their grants
        // spilled until the sessions are known.
        let mut names: BTreeSet<String> =
            registry::namespaces(inner).await?.iter().map(|name| name.as_str().to_owned()).collect();
        names.extend(retired_names(inner).await?);
        let mut retired = Vec::new();
        let mut grants = Spill::new()?;
        for name in &names {
            let Ok(namespace) = NamespaceName::new(name) else { continue };
            let mut reply = call(inner, &prefix(&namespace), &["ns_dump"], false).await?;
            reply.uint()?;
            if reply.uint()? == 0 {
                let fencing = reply.text()?;
                if !fencing.is_empty() {
                    retired.push((name.clone(), number(&fencing)? + 1));
                }
                continue;
            }
            let quota = reply.uint()?;
            let fencing = reply.uint()?;
            encode_key(name.as_str(), &mut key);
            let record = NamespaceRecord { quota, next_fencing: fencing + 1 };
            writer.record(Table::Namespaces, &key, &records::encode(&record)).map_err(written)?;
            let mut these = Vec::with_capacity(reply.len() / 2);
            while !reply.is_empty() {
                let token = reply.text()?;
                let grant = crate::reply::grant(&namespace, &token, &reply.text()?)?;
                these.push((token, GrantRecord::from_grant(&grant)));
            }
            these.sort_by(|a, b| a.0.cmp(&b.0));
            for (token, record) in these {
                encode_key(&(name.as_str(), token.as_str()), &mut key);
                grants.push(&key, &records::encode(&record))?;
            }
        }
        let sessions = read_sessions(inner).await?;
        for (name, next) in retired {
            encode_key(name.as_str(), &mut key);
            encode_key(&next, &mut value);
            writer.record(Table::RetiredFencing, &key, &value).map_err(written)?;
        }
        let mut dropped = 0u64;
        grants.replay(|key, value| {
            let record: GrantRecord = records::decode("grants", "", value).map_err(corrupt)?;
            if let LeaseRecord::Session(id) = record.lease {
                if !sessions.contains_key(&id) {
                    dropped += 1;
                    return Ok(());
                }
            }
            writer.record(Table::Grants, key, value).map_err(written)
        })?;
        for (id, record) in &sessions {
            encode_key(id, &mut key);
            writer.record(Table::Sessions, &key, &records::encode(record)).map_err(written)?;
        }

        // The pools, their labels and allocs after them.
        let mut pool_names: Vec<PoolName> = registry::pools(inner).await?;
        pool_names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        let mut labels = Vec::new();
        let mut allocs = Spill::new()?;
        for pool in &pool_names {
            let mut reply = call(inner, &pools::prefix(pool), &["pool_dump"], false).await?;
            reply.uint()?;
            let hash: HashMap<String, String> = pairs(reply.value()?)?.into_iter().collect();
            let Some(capacity) = hash.get("capacity") else { continue };
            let resources = |text: &str| pools::decode(text).map(|r| resources_record(&r));
            let record = PoolRecord {
                capacity: resources(capacity)?,
                stopped: hash.get("stopped").is_some_and(|s| s == "1"),
                occupied: hash.get("occupied").map(|text| resources(text)).transpose()?,
                cordon: match hash.get("cordon_since") {
                    None => None,
                    Some(since) => Some((number(since)?, hash.get("drain_at").map(|at| number(at)).transpose()?)),
                },
            };
            encode_key(pool.as_str(), &mut key);
            writer.record(Table::Pools, &key, &records::encode(&record)).map_err(written)?;
            if let Some(json) = hash.get("labels") {
                let read: Labels = serde_json::from_str(json).map(pools::labels_of).unwrap_or_default();
                labels.push((key.clone(), records::encode(&read)));
            }
            let mut these = Vec::new();
            for (id, json) in pairs(reply.value()?)?.into_iter().chain(pairs(reply.value()?)?) {
                let record = match pools::record(pool, &id, &json)? {
                    allot_core::pools::AllocState::Live(alloc) => AllocRecord::live(&alloc),
                    allot_core::pools::AllocState::Ended(ended) => AllocRecord::ended(&ended),
                };
                let id = allot_core::pools::AllocId::parse(&id).map_err(corrupt)?;
                these.push((id.0, record));
            }
            these.sort_by_key(|(id, _)| *id);
            for (id, record) in these {
                encode_key(&(pool.as_str(), id), &mut key);
                allocs.push(&key, &records::encode(&record))?;
            }
        }
        for (key, value) in &labels {
            writer.record(Table::PoolLabels, key, value).map_err(written)?;
        }
        allocs.replay(|key, value| writer.record(Table::Allocs, key, value).map_err(written))?;

        // The applications, as the scheduler last committed them.
        let mut reply = inner.eval(&inner.scripts.apps, APPS_PREFIX, &["load"], false).await?;
        reply.text()?;
        let mut queues = BTreeMap::new();
        loop {
            let path = reply.text()?;
            if path.is_empty() {
                break;
            }
            queues.insert(path, records::encode(&json::<QueueRecord>("queues", &reply.text()?)?));
        }
        let mut apps = BTreeMap::new();
        loop {
            let id = reply.text()?;
            if id.is_empty() {
                break;
            }
            apps.insert(id, records::encode(&json::<AppRecord>("apps", &reply.text()?)?));
        }
        let mut tasks = BTreeMap::new();
        while !reply.is_empty() {
            let (app, task) = (reply.text()?, reply.text()?);
            tasks.insert((app, task), records::encode(&json::<TaskRecord>("tasks", &reply.text()?)?));
        }
        for (path, value) in &queues {
            encode_key(path.as_str(), &mut key);
            writer.record(Table::Queues, &key, value).map_err(written)?;
        }
        for (id, value) in &apps {
            encode_key(id.as_str(), &mut key);
            writer.record(Table::Apps, &key, value).map_err(written)?;
        }
        for ((app, task), value) in &tasks {
            encode_key(&(app.as_str(), task.as_str()), &mut key);
            writer.record(Table::Tasks, &key, value).map_err(written)?;
        }

        // The runs and the catalog, then the access records.
        let mut reply = call(inner, RUNS_SLOT, &["hash_dump", "runs", "catalog"], false).await?;
        let mut runs = BTreeMap::new();
        for (field, json_text) in pairs(reply.value()?)? {
            let (app, task) = field.split_once('/').ok_or_else(|| corrupt(format!("run field `{field}`")))?;
            runs.insert(
                (app.to_owned(), task.to_owned()),
                records::encode(
                    &RunRow::from_json(json_text.as_bytes()).map_err(|e| corrupt(format!("runs record: {e}")))?,
                ),
            );
        }
        let mut catalog = BTreeMap::new();
        for (name, json_text) in pairs(reply.value()?)? {
            catalog.insert(name, records::encode(&json::<CachedRecord>("catalog", &json_text)?));
        }
        for ((app, task), value) in &runs {
            encode_key(&(app.as_str(), task.as_str()), &mut key);
            writer.record(Table::Runs, &key, value).map_err(written)?;
        }
        for (name, value) in &catalog {
            encode_key(name.as_str(), &mut key);
            writer.record(Table::Catalog, &key, value).map_err(written)?;
        }
        let mut reply = call(inner, ACCESS_SLOT, &["hash_dump", "tokens", "bindings"], false).await?;
        let mut access = BTreeMap::new();
        for (name, json_text) in pairs(reply.value()?)? {
            access.insert(token_key(&name), records::encode(&json::<ApiTokenRecord>("tokens", &json_text)?));
        }
        for (name, json_text) in pairs(reply.value()?)? {
            access.insert(binding_key(&name), records::encode(&json::<BindingRecord>("bindings", &json_text)?));
        }
        for (name, value) in &access {
            encode_key(name.as_str(), &mut key);
            writer.record(Table::Access, &key, value).map_err(written)?;
        }
        let summary = writer.finish().map_err(written)?;
        tracing::info!(
            revision,
            bytes = summary.bytes,
            sha256 = %summary.sha256,
            grants_of_ended_sessions = dropped,
            "snapshot taken"
        );
        Ok((header, summary))
    }

    /// Restores the archive at `path` into this store's Redis: checked whole first, then written
    /// slot by slot (see the module's documentation). Refuses a Redis that holds allot's state,
    /// unless `replace`: then removes it first (on a cluster, from every primary). The daemons
    /// that use this Redis should be stopped meanwhile.
    pub async fn restore(
        &self,
        path: &Path,
        options: &RestoreOptions,
        replace: bool,
    ) -> Result<Restored, RestoreError> {
        self.live()?;
        let open = || File::open(path).map_err(|source| RestoreError::Read { path: path.to_owned(), source });
        // Whole, and every record reads, before anything is written (a damaged archive is told
        // as such, not by the first record it broke).
        let mut reader = SnapshotReader::new(BufReader::with_capacity(1 << 20, open()?))?;
        let mut unread = None;
        while let Some((table, key, value)) = reader.next()? {
            if let (None, Err(err)) = (&unread, rebase(table, key, value, 0)) {
                unread = Some(err);
            }
        }
        if let Some(err) = unread {
            return Err(err.into());
        }
        let header = reader.header().clone();
        // Held while the restore writes, so that no daemon schedules over a half-written state;
        // taken only if no daemon uses this Redis (every running one asks for it).
        let holder =
            format!("{}{}@{}", crate::apps::lease::RESTORE_HOLDER, std::process::id(), self.inner.ids.next_u64());
        if let LeaseState::Held { holder, left, .. } =
            self.take_sched_lease_for_restore(&holder, RESTORE_LEASE_TTL).await?
        {
            return Err(RestoreError::InUse { holder, left_ms: left.as_millis() as u64 });
        }
        let renewing = async {
            loop {
                tokio::time::sleep(RESTORE_LEASE_TTL / 6).await;
                if let Err(err) = self.acquire_sched_lease(&holder, RESTORE_LEASE_TTL).await {
                    tracing::warn!(error = %err, "cannot renew the restore's hold of the scheduler's lease");
                }
            }
        };
        let restored = tokio::select! {
            restored = self.restore_holding_the_lease(path, options, replace, header) => restored,
            never = renewing => never,
        };
        if let Err(err) = self.release_sched_lease(&holder).await {
            tracing::warn!(error = %err, "cannot let go of the scheduler's lease after the restore (it lapses by itself)");
        }
        restored
    }

    /// The restore's writes, once it holds the scheduler's lease.
    async fn restore_holding_the_lease(
        &self,
        path: &Path,
        options: &RestoreOptions,
        replace: bool,
        header: SnapshotHeader,
    ) -> Result<Restored, RestoreError> {
        let inner = &self.inner;
        let open = || File::open(path).map_err(|source| RestoreError::Read { path: path.to_owned(), source });
        let held = held_state(inner).await?;
        if let (Some(what), false) = (&held, replace) {
            return Err(RestoreError::NotEmpty { what: what.clone() });
        }
        let marker = format!("{} taken at revision {} ({})", path.display(), header.revision, header.backend);
        query(inner, redis::cmd("SET").arg(RESTORING_KEY).arg(&marker)).await?;
        if held.is_some() {
            remove_everything(inner).await?;
        }

        let now = call(inner, FEED_SLOT, &["now"], false).await?.uint()?;
        let since = options.now_ms.saturating_sub(header.taken_at_ms);
        let target = match options.leases {
            LeaseTime::Resume => now,
            LeaseTime::Expire => now.saturating_sub(since),
        };
        let shift = target as i64 - header.clock_ms as i64;

        let mut reader = SnapshotReader::new(BufReader::with_capacity(1 << 20, open()?))?;
        let mut writes = Writes::new(inner);
        // The namespaces each session holds grants in.
        let mut session_namespaces: HashMap<u128, BTreeSet<String>> = HashMap::new();
        while let Some((table, key, value)) = reader.next()? {
            let value = rebase(table, key, value, shift)?;
            let bad = |reason: &str| bad_record(table, key, reason);
            match table {
                Table::Namespaces => {
                    let name: &str = decode_key(key).ok_or_else(|| bad("not a namespace name"))?;
                    let record: NamespaceRecord = decoded(table, key, &value)?;
                    let namespace = NamespaceName::new(name).map_err(|e| bad(&e.to_string()))?;
                    registry::register(inner, "add", "namespaces", name).await?;
                    let fencing = record.next_fencing.saturating_sub(1).to_string();
                    let mut reply =
                        call(inner, &prefix(&namespace), &["ns_load", &record.quota.to_string(), &fencing], true)
                            .await?;
                    if reply.uint()? == 0 {
                        return Err(RestoreError::NotEmpty { what: format!("namespace `{name}`") });
                    }
                }
                Table::RetiredFencing => {
                    let name: &str = decode_key(key).ok_or_else(|| bad("not a namespace name"))?;
                    let next: u64 = decode_key(&value).ok_or_else(|| bad("not a fencing number"))?;
                    let namespace = NamespaceName::new(name).map_err(|e| bad(&e.to_string()))?;
                    registry::register(inner, "add", "retired", name).await?;
                    call(inner, &prefix(&namespace), &["retired_load", &next.saturating_sub(1).to_string()], true)
                        .await?;
                }
                Table::Grants => {
                    let (name, token): (&str, &str) = decode_key(key).ok_or_else(|| bad("not a grant's key"))?;
                    let record: GrantRecord = decoded(table, key, &value)?;
                    let namespace = NamespaceName::new(name).map_err(|e| bad(&e.to_string()))?;
                    if let LeaseRecord::Session(id) = record.lease {
                        session_namespaces.entry(id).or_default().insert(name.to_owned());
                    }
                    writes.push(prefix(&namespace), &["grants_load"], [token.to_owned(), grant_text(&record)]).await?;
                }
                Table::Sessions => {
                    let id: u128 = decode_key(key).ok_or_else(|| bad("not a session id"))?;
                    let record: SessionRecord = decoded(table, key, &value)?;
                    let id_text = SessionId(id).to_string();
                    let (ttl, deadline) = (record.ttl_ms.to_string(), record.deadline.to_string());
                    let namespaces = session_namespaces.remove(&id).unwrap_or_default();
                    let mut args = vec!["sessions_load", &id_text, &ttl, &deadline];
                    args.push(record.owner.as_deref().unwrap_or(""));
                    args.extend(namespaces.iter().map(String::as_str));
                    if call(inner, SESSIONS_SLOT, &args, true).await?.uint()? == 0 {
                        return Err(RestoreError::NotEmpty { what: format!("session {id_text}") });
                    }
                    for name in &namespaces {
                        let namespace = NamespaceName::new(name).map_err(|e| bad(&e.to_string()))?;
                        writes.flush().await?;
                        call(inner, &prefix(&namespace), &["session_lease", &id_text, &deadline], true).await?;
                    }
                }
                Table::Pools => {
                    let name: &str = decode_key(key).ok_or_else(|| bad("not a pool name"))?;
                    let record: PoolRecord = decoded(table, key, &value)?;
                    let pool = PoolName::new(name).map_err(|e| bad(&e.to_string()))?;
                    registry::register(inner, "add", "pools", name).await?;
                    let text = |r: ResourcesRecord| -> Result<String, RestoreError> {
                        Ok(pools::encode(&resources_from(r, "pools", name).map_err(|e| bad(&e.to_string()))?))
                    };
                    let mut fields = vec![
                        "capacity".to_owned(),
                        text(record.capacity)?,
                        "stopped".to_owned(),
                        if record.stopped { "1" } else { "0" }.to_owned(),
                    ];
                    if let Some(occupied) = record.occupied {
                        fields.extend(["occupied".to_owned(), text(occupied)?]);
                    }
                    if let Some((since, drain_at)) = record.cordon {
                        fields.extend(["cordon_since".to_owned(), since.to_string()]);
                        if let Some(at) = drain_at {
                            fields.extend(["drain_at".to_owned(), at.to_string()]);
                        }
                    }
                    let mut args = vec!["pool_load"];
                    args.extend(fields.iter().map(String::as_str));
                    if call(inner, &pools::prefix(&pool), &args, true).await?.uint()? == 0 {
                        return Err(RestoreError::NotEmpty { what: format!("pool `{name}`") });
                    }
                }
                Table::PoolLabels => {
                    let name: &str = decode_key(key).ok_or_else(|| bad("not a pool name"))?;
                    let labels: Labels = decoded(table, key, &value)?;
                    let pool = PoolName::new(name).map_err(|e| bad(&e.to_string()))?;
                    let json = serde_json::to_string(&labels).expect("labels always encode");
                    call(inner, &pools::prefix(&pool), &["hash_load", "pool", "labels", &json], true).await?;
                }
                Table::Allocs => {
                    let (name, id): (&str, u64) = decode_key(key).ok_or_else(|| bad("not an alloc's key"))?;
                    // An archive of an older allot holds allocs without metadata.
                    let record: AllocRecord =
                        records::decode_alloc("", &value).map_err(|err| bad_record(table, key, &err.reason))?;
                    let pool = PoolName::new(name).map_err(|e| bad(&e.to_string()))?;
                    let resources =
                        resources_from(record.resources.clone(), "allocs", name).map_err(|e| bad(&e.to_string()))?;
                    let id = allot_core::pools::AllocId(id).to_string();
                    writes.push(pools::prefix(&pool), &["allocs_load"], [id, alloc_json(&record, &resources)]).await?;
                }
                Table::Queues => {
                    let path: &str = decode_key(key).ok_or_else(|| bad("not a queue path"))?;
                    let record: QueueRecord = decoded(table, key, &value)?;
                    writes
                        .push(APPS_PREFIX.to_owned(), &["hash_load", "queues"], [path.to_owned(), to_json(&record)])
                        .await?;
                }
                Table::Apps => {
                    let id: &str = decode_key(key).ok_or_else(|| bad("not an application id"))?;
                    let record: AppRecord = decoded(table, key, &value)?;
                    writes
                        .push(APPS_PREFIX.to_owned(), &["hash_load", "apps"], [id.to_owned(), to_json(&record)])
                        .await?;
                }
                Table::Tasks => {
                    let (app, task): (&str, &str) = decode_key(key).ok_or_else(|| bad("not a task's key"))?;
                    let record: TaskRecord = decoded(table, key, &value)?;
                    let hash = format!("tasks:{app}");
                    writes
                        .push(APPS_PREFIX.to_owned(), &["hash_load", &hash], [task.to_owned(), to_json(&record)])
                        .await?;
                }
                Table::Runs => {
                    let (app, task): (&str, &str) = decode_key(key).ok_or_else(|| bad("not a run's key"))?;
                    let record: RunRow = decoded(table, key, &value)?;
                    let item = [app.to_owned(), task.to_owned(), record.to_json()];
                    writes.push(RUNS_SLOT.to_owned(), &["runs_load"], item).await?;
                }
                Table::Catalog => {
                    let name: &str = decode_key(key).ok_or_else(|| bad("not a cache key"))?;
                    let record: CachedRecord = decoded(table, key, &value)?;
                    let item = [name.to_owned(), to_json(&record), record.at.to_string()];
                    writes.push(RUNS_SLOT.to_owned(), &["catalog_load"], item).await?;
                }
                Table::Access => {
                    let name: &str = decode_key(key).ok_or_else(|| bad("not an access record's key"))?;
                    if let Some(token) = name.strip_prefix("token/") {
                        let record: ApiTokenRecord = decoded(table, key, &value)?;
                        let item = [token.to_owned(), to_json(&record)];
                        writes.push(ACCESS_SLOT.to_owned(), &["hash_load", "tokens"], item).await?;
                    } else if let Some(binding) = name.strip_prefix("binding/") {
                        let record: BindingRecord = decoded(table, key, &value)?;
                        let item = [binding.to_owned(), to_json(&record)];
                        writes.push(ACCESS_SLOT.to_owned(), &["hash_load", "bindings"], item).await?;
                    } else {
                        return Err(bad("neither a token's nor a binding's").into());
                    }
                }
            }
        }
        writes.flush().await?;
        // A grant held under a session the archive lacks ended with it: its lease is due now,
        // and the namespace's sweep ends it.
        for (id, namespaces) in session_namespaces {
            let id = SessionId(id).to_string();
            for name in namespaces {
                let Ok(namespace) = NamespaceName::new(&name) else { continue };
                call(inner, &prefix(&namespace), &["session_lease", &id, "0"], true).await?;
            }
        }
        call(inner, RUNS_SLOT, &["indexed", "indexed", "catalog-indexed"], true).await?;
        call(inner, ACCESS_SLOT, &["access_moved"], true).await?;
        let revision = header.revision.saturating_add(options.bump_revision);
        let revision = call(inner, FEED_SLOT, &["feed_load", &revision.to_string()], true).await?.uint()?;
        query(inner, redis::cmd("DEL").arg(RESTORING_KEY)).await?;
        let summary = reader.summary();
        tracing::info!(revision = header.revision, first_revision = revision + 1, "snapshot restored into redis");
        Ok(Restored { header, summary, first_revision: revision + 1, clock_ms: now })
    }
}

/// Writes records in calls of up to [`BATCH`], each call on one slot with one operation.
struct Writes<'a> {
    inner: &'a Inner,
    key: String,
    head: Vec<String>,
    args: Vec<String>,
    records: usize,
    bytes: usize,
}

impl<'a> Writes<'a> {
    fn new(inner: &'a Inner) -> Writes<'a> {
        Writes { inner, key: String::new(), head: Vec::new(), args: Vec::new(), records: 0, bytes: 0 }
    }

    async fn push(
        &mut self,
        key: String,
        head: &[&str],
        items: impl IntoIterator<Item = String>,
    ) -> Result<(), StoreError> {
        let full = self.records >= BATCH || self.bytes >= BATCH_BYTES;
        if full || key != self.key || self.head.iter().map(String::as_str).ne(head.iter().copied()) {
            self.flush().await?;
            self.key = key;
            self.head = head.iter().map(|h| (*h).to_owned()).collect();
        }
        for item in items {
            self.bytes += item.len();
            self.args.push(item);
        }
        self.records += 1;
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), StoreError> {
        if self.records > 0 {
            let args: Vec<&str> = self.head.iter().chain(&self.args).map(String::as_str).collect();
            call(self.inner, &self.key, &args, true).await?;
        }
        self.args.clear();
        self.records = 0;
        self.bytes = 0;
        Ok(())
    }
}

async fn call(inner: &Inner, key: &str, args: &[&str], mutating: bool) -> Result<Reply, StoreError> {
    inner.eval(&inner.scripts.snapshot, key, args, mutating).await
}

/// The last revision the change feed gave.
async fn feed_revision(inner: &Inner) -> Result<u64, StoreError> {
    let cmd = redis::cmd("HGET").arg(format!("{FEED_SLOT}:meta")).arg("rev").clone();
    match inner.conn.query(&cmd).await.map_err(|e| redis_error(e, false))? {
        Value::Nil => Ok(0),
        other => number(&into_text(other).map_err(|v| corrupt(format!("feed revision {v:?}")))?),
    }
}

/// The namespaces removed with their fencing counters kept: as listed since this version, and on
/// one server any such counter an earlier version left.
async fn retired_names(inner: &Inner) -> Result<Vec<String>, StoreError> {
    let mut names = registry::retired(inner).await?;
    if inner.conn.cluster().is_none() {
        for key in scan(inner, "allot:{*}:fencing").await? {
            if let Some(name) = key.strip_prefix("allot:").and_then(|k| k.strip_suffix(":fencing")) {
                names.extend(unescape_tag(name));
            }
        }
    }
    Ok(names)
}

/// Every key of allot's Redis that matches `pattern`: of its one server, or of every primary of
/// its cluster (each primary holds its own slots' keys, and `SCAN` reads one node).
async fn scan(inner: &Inner, pattern: &str) -> Result<Vec<String>, StoreError> {
    let Some(cluster) = inner.conn.cluster() else { return scan_node(inner, pattern, None).await };
    let primaries = cluster
        .primaries()
        .await
        .ok_or_else(|| StoreError::Unavailable("no node of the Redis Cluster answers with its slot map".into()))?;
    let mut keys = Vec::new();
    for primary in primaries {
        keys.extend(scan_node(inner, pattern, Some((&cluster, &primary))).await?);
    }
    Ok(keys)
}

/// Every key of one server that matches `pattern`: the standalone one, or a cluster's node at an
/// address.
async fn scan_node(
    inner: &Inner,
    pattern: &str,
    node: Option<(&ClusterLink, &str)>,
) -> Result<Vec<String>, StoreError> {
    let (mut cursor, mut keys) = (0u64, Vec::new());
    loop {
        let cmd = redis::cmd("SCAN").arg(cursor).arg("MATCH").arg(pattern).arg("COUNT").arg(1000).clone();
        let answer = match node {
            Some((cluster, address)) => cluster.query_node(&cmd, address).await,
            None => inner.conn.query(&cmd).await,
        };
        let mut reply = Reply::new(answer.map_err(|e| redis_error(e, false))?)?;
        cursor = number(&reply.text()?)?;
        keys.extend(Reply::new(reply.value()?)?.rest_texts()?);
        if cursor == 0 {
            return Ok(keys);
        }
    }
}

impl RedisStore {
    /// What a restore that did not finish was restoring, if one left this Redis part written.
    pub async fn unfinished_restore(&self) -> Result<Option<String>, StoreError> {
        match query(&self.inner, redis::cmd("GET").arg(RESTORING_KEY)).await? {
            Value::Nil => Ok(None),
            value => Ok(Some(into_text(value).map_err(|v| corrupt(format!("the restore's mark read as {v:?}")))?)),
        }
    }
}

async fn query(inner: &Inner, command: &redis::Cmd) -> Result<Value, StoreError> {
    inner.conn.query(command).await.map_err(|e| redis_error(e, false))
}

/// The first allot state found, named, if this Redis holds any.
async fn held_state(inner: &Inner) -> Result<Option<String>, StoreError> {
    if let Value::Int(1) = query(inner, redis::cmd("EXISTS").arg(RESTORING_KEY)).await? {
        return Ok(Some("a restore that did not finish".to_owned()));
    }
    let checks = [
        ("SCARD", "allot:{allot-registry}:namespaces", "namespaces"),
        ("SCARD", "allot:{allot-registry}:pools", "pools"),
        // A removed namespace's fencing counter: restoring over it could give its numbers again.
        ("SCARD", "allot:{allot-registry}:retired", "fencing numbers of removed namespaces"),
        ("ZCARD", "allot:{allot-sessions}:index", "sessions"),
        ("HLEN", "allot:{allot-apps}:queues", "queues"),
        ("HLEN", "allot:{allot-apps}:apps", "applications"),
        ("HLEN", "allot:{allot-runs}:runs", "runs"),
        ("HLEN", "allot:{allot-runs}:catalog", "cached outputs"),
        ("HLEN", "allot:{allot-access}:tokens", "API tokens"),
        ("HLEN", "allot:{allot-access}:bindings", "bindings"),
    ];
    for (command, key, what) in checks {
        let count = inner.conn.query(redis::cmd(command).arg(key)).await.map_err(|e| redis_error(e, false))?;
        if matches!(count, Value::Int(n) if n > 0) {
            return Ok(Some(what.to_owned()));
        }
    }
    Ok(None)
}

/// Removes every key of allot's (on a cluster, from every primary; the client splits an
/// `UNLINK` of many keys by slot), but the change feed's revision (which never goes back) and
/// the mark of the restore under way.
async fn remove_everything(inner: &Inner) -> Result<(), StoreError> {
    let [lease, daemons] = crate::apps::lease::lease_keys();
    let keep = [format!("{FEED_SLOT}:meta"), RESTORING_KEY.to_owned(), lease, daemons];
    let mut keys = scan(inner, "allot:{*").await?;
    keys.extend(scan(inner, "allot:pool:*").await?);
    keys.retain(|key| !keep.contains(key));
    for chunk in keys.chunks(BATCH) {
        inner.conn.query(redis::cmd("UNLINK").arg(chunk)).await.map_err(|e| redis_error(e, false))?;
    }
    tracing::info!(keys = keys.len(), "removed what this Redis held before the restore");
    Ok(())
}

async fn read_sessions(inner: &Inner) -> Result<BTreeMap<u128, SessionRecord>, StoreError> {
    let mut reply = call(inner, SESSIONS_SLOT, &["sessions_dump"], false).await?;
    reply.uint()?;
    let mut sessions = BTreeMap::new();
    while !reply.is_empty() {
        let id = SessionId::parse(&reply.text()?).map_err(corrupt)?;
        let (ttl_ms, deadline) = (reply.uint()?, reply.uint()?);
        let owner = Some(reply.text()?).filter(|owner| !owner.is_empty());
        sessions.insert(id.0, SessionRecord { ttl_ms, deadline, owner });
    }
    Ok(sessions)
}

/// A grant record as `lua/namespace.lua`'s `enc_grant` writes it.
fn grant_text(record: &GrantRecord) -> String {
    let (kind, ttl, deadline, session) = match record.lease {
        LeaseRecord::None => ("n", 0, 0, String::new()),
        LeaseRecord::Ttl { ttl_ms, deadline } => ("t", ttl_ms, deadline, String::new()),
        LeaseRecord::Session(id) => ("s", 0, 0, SessionId(id).to_string()),
    };
    let (project, scope) = record.scope.clone().unwrap_or_default();
    let (units, fencing, granted_at) = (record.units, record.fencing, record.granted_at);
    format!("{units}\n{fencing}\n{granted_at}\n{kind}\n{ttl}\n{deadline}\n{session}\n{project}\n{scope}")
}

/// An alloc record as `lua/pool.lua` writes it (absent fields left out: a JSON `null` reads as
/// true in Lua).
fn alloc_json(record: &AllocRecord, resources: &Resources) -> String {
    let mut object = serde_json::Map::new();
    object.insert("r".into(), pools::encode(resources).into());
    object.insert("o".into(), record.owner.clone().into());
    object.insert("l".into(), serde_json::to_value(&record.labels).expect("labels always encode"));
    object.insert("c".into(), record.created.into());
    object.insert("k".into(), record.last_keepalive.unwrap_or(0).into());
    if record.expires == HELD {
        object.insert("e".into(), HELD_EXPIRY.into());
        object.insert("h".into(), 1.into());
    } else {
        object.insert("e".into(), record.expires.into());
    }
    if let Some((at, code)) = record.ended {
        let reason = match code {
            0 => "freed",
            1 => "reclaimed",
            2 => "pool_stopped",
            _ => "pool_removed",
        };
        object.insert("ea".into(), at.into());
        object.insert("er".into(), reason.into());
    }
    if let Some(metadata) = &record.metadata {
        object.insert("m".into(), metadata.clone().into());
    }
    serde_json::Value::Object(object).to_string()
}

fn bad_record(table: Table, key: &[u8], reason: &str) -> RebaseError {
    RebaseError { table: table.name(), key: allot_store::snapshot::hex(key), reason: reason.to_owned() }
}

fn decoded<T: serde::de::DeserializeOwned>(table: Table, key: &[u8], value: &[u8]) -> Result<T, RebaseError> {
    records::decode(table.name(), "", value).map_err(|err| bad_record(table, key, &err.reason))
}

fn json<T: serde::de::DeserializeOwned>(what: &str, text: &str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| corrupt(format!("{what} record: {e}")))
}

fn to_json<T: serde::Serialize>(record: &T) -> String {
    serde_json::to_string(record).expect("records always encode")
}

fn number(text: &str) -> Result<u64, StoreError> {
    text.parse().map_err(|_| corrupt(format!("`{text}` is not a number")))
}

/// The field-value pairs of a hash read whole.
fn pairs(value: Value) -> Result<Vec<(String, String)>, StoreError> {
    let mut texts = Reply::new(value)?.rest_texts()?.into_iter();
    let mut pairs = Vec::with_capacity(texts.len() / 2);
    while let (Some(field), Some(value)) = (texts.next(), texts.next()) {
        pairs.push((field, value));
    }
    Ok(pairs)
}

fn written(err: std::io::Error) -> StoreError {
    StoreError::Unavailable(format!("cannot write the snapshot: {err}"))
}

/// Records kept aside in a temporary file until the archive reaches their table.
struct Spill {
    file: BufWriter<File>,
}

impl Spill {
    fn new() -> Result<Spill, StoreError> {
        let file =
            tempfile::tempfile().map_err(|e| StoreError::Unavailable(format!("cannot make a temporary file: {e}")))?;
        Ok(Spill { file: BufWriter::with_capacity(1 << 20, file) })
    }

    fn push(&mut self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        for field in [key, value] {
            self.file.write_all(&(field.len() as u32).to_le_bytes()).map_err(spilled)?;
            self.file.write_all(field).map_err(spilled)?;
        }
        Ok(())
    }

    fn replay(self, mut each: impl FnMut(&[u8], &[u8]) -> Result<(), StoreError>) -> Result<(), StoreError> {
        let mut file = self.file.into_inner().map_err(|e| spilled(e.into_error()))?;
        file.seek(SeekFrom::Start(0)).map_err(spilled)?;
        let mut input = BufReader::with_capacity(1 << 20, file);
        let (mut key, mut value) = (Vec::new(), Vec::new());
        loop {
            let mut length = [0u8; 4];
            match input.read_exact(&mut length) {
                Ok(()) => {}
                Err(err) if err.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(err) => return Err(spilled(err)),
            }
            key.resize(u32::from_le_bytes(length) as usize, 0);
            input.read_exact(&mut key).map_err(spilled)?;
            input.read_exact(&mut length).map_err(spilled)?;
            value.resize(u32::from_le_bytes(length) as usize, 0);
            input.read_exact(&mut value).map_err(spilled)?;
            each(&key, &value)?;
        }
    }
}

fn spilled(err: std::io::Error) -> StoreError {
    StoreError::Unavailable(format!("cannot keep records aside in a temporary file: {err}"))
}
