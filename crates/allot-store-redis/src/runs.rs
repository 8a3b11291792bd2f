//! The runs of tasks on Redis: one hash in the `{allot-runs}` slot, field `<app>/<task>`, the
//! embedded store's record JSON-encoded, and a set per application of its tasks that have a run
//! (`lua/runs.lua`). A run is written by the daemon that executes its task; the runs that ended
//! of a removed task or application are forgotten by the scheduler once its records are written.
//! The catalog of outputs kept for reuse is another hash there, field the cache key, written
//! once (`HSETNX`), with a sorted set of its keys by when they were kept, for their retention. Executors' leases: a hash of node -> pools (JSON), and a key per node that
//! lives while the executor renews it (`SET ... PX`).

use allot_core::apps::{AppChange, AppId, TaskId};
use allot_core::pools::PoolName;
use allot_core::runs::Run;
use allot_core::Millis;
use allot_store::records::runs::{CachedRecord, RunRow};
use allot_store::{CachedOutputs, ExecutorLease, RunStore, StoreError};
use async_trait::async_trait;
use redis::Value;

use crate::conn::WriteError;
use crate::errors::{call_error, redis_error};
use crate::reply::corrupt;
use crate::store::RedisStore;

/// The runs' key prefix: one hash slot.
const RUNS_PREFIX: &str = "allot:{allot-runs}";
const RUNS: &str = "allot:{allot-runs}:runs";
const CATALOG: &str = "allot:{allot-runs}:catalog";
const EXECUTORS: &str = "allot:{allot-runs}:executors";

/// An executor's lease in the executors' hash: its pools and task types. Earlier daemons kept
/// only the list of pools.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct ExecutorRecord {
    pools: Vec<String>,
    #[serde(default)]
    task_types: Option<Vec<String>>,
}

impl ExecutorRecord {
    fn decode(json: &[u8]) -> Result<ExecutorRecord, serde_json::Error> {
        match serde_json::from_slice::<Vec<String>>(json) {
            Ok(pools) => Ok(ExecutorRecord { pools, task_types: None }),
            Err(_) => serde_json::from_slice(json),
        }
    }
}

fn executor_key(node: &str) -> String {
    format!("allot:{{allot-runs}}:executor:{node}")
}

fn field(app: &AppId, task: &TaskId) -> String {
    format!("{app}/{task}")
}

pub(crate) fn decode(field: &str, json: &[u8]) -> Result<Run, StoreError> {
    let record = RunRow::from_json(json).map_err(|e| corrupt(format!("run `{field}`: {e}")))?;
    record.into_run(field).map_err(corrupt)
}

impl RedisStore {
    /// Calls `lua/runs.lua`; answers its number. A change waits for the replicas
    /// (`--redis-min-replicas`).
    async fn runs_call(&self, args: &[&str]) -> Result<u64, StoreError> {
        self.inner.eval(&self.inner.scripts.runs, RUNS_PREFIX, args, true).await?.uint()
    }

    /// Puts every run kept by a version without the sets of runs by application in its
    /// application's set (once: a flag says it was done). It does not wait for the replicas: the
    /// sets are derived from the runs, and one lost in a failover with its flag is made again at
    /// the next open.
    pub(crate) async fn index_runs(&self) -> Result<(), StoreError> {
        let added = self.inner.eval(&self.inner.scripts.runs, RUNS_PREFIX, &["index"], false).await?.uint()?;
        if added > 0 {
            tracing::info!(runs = added, "runs indexed by application");
        }
        let added = self.inner.eval(&self.inner.scripts.runs, RUNS_PREFIX, &["index_catalog"], false).await?.uint()?;
        if added > 0 {
            tracing::info!(outputs = added, "kept outputs indexed by when they were kept, for their retention");
        }
        Ok(())
    }

    /// Forgets the runs that ended of the tasks `changes` remove (an application removed, or
    /// dropped after its retention): they go with their task. A run that has not ended stays
    /// for its executor, which stops it and then removes it.
    pub(crate) async fn forget_ended_runs(&self, changes: &[AppChange]) -> Result<(), StoreError> {
        for change in changes {
            match change {
                AppChange::AppRemoved { id } => self.runs_call(&["forget_ended", id.as_str()]).await?,
                AppChange::TaskRemoved { app, task } => {
                    self.runs_call(&["forget_ended", app.as_str(), task.as_str()]).await?
                }
                _ => continue,
            };
        }
        Ok(())
    }

    /// Every field of hash `key` (`what` it holds, for errors), names as text.
    async fn hash(&self, what: &str, key: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let cmd = redis::cmd("HGETALL").arg(key).clone();
        let Value::Array(items) = self.inner.conn.query(&cmd).await.map_err(|e| redis_error(e, false))? else {
            return Err(corrupt(format!("{what}: not a list")));
        };
        let mut fields = Vec::with_capacity(items.len() / 2);
        let mut items = items.into_iter();
        while let Some(name) = items.next() {
            let (Value::BulkString(name), Some(Value::BulkString(value))) = (name, items.next()) else {
                return Err(corrupt(format!("{what}: not field and value")));
            };
            fields.push((String::from_utf8_lossy(&name).into_owned(), value));
        }
        Ok(fields)
    }
}

#[async_trait]
impl RunStore for RedisStore {
    async fn put_run(&self, app: AppId, task: TaskId, run: Run) -> Result<(), StoreError> {
        self.live()?;
        let json = RunRow::of(&run).to_json();
        self.runs_call(&["put", app.as_str(), task.as_str(), &json]).await.map(drop)
    }

    async fn run(&self, app: AppId, task: TaskId) -> Result<Option<Run>, StoreError> {
        let name = field(&app, &task);
        let cmd = redis::cmd("HGET").arg(RUNS).arg(&name).clone();
        match self.inner.conn.query(&cmd).await.map_err(|e| redis_error(e, false))? {
            Value::Nil => Ok(None),
            Value::BulkString(json) => Ok(Some(decode(&name, &json)?)),
            other => Err(corrupt(format!("run `{name}`: {other:?}"))),
        }
    }

    async fn runs(&self) -> Result<Vec<(AppId, TaskId, Run)>, StoreError> {
        let fields = self.hash("runs", RUNS).await?;
        let mut runs = Vec::with_capacity(fields.len());
        for (name, json) in &fields {
            let (app, task) = name.split_once('/').ok_or_else(|| corrupt(format!("run field `{name}`")))?;
            let app = AppId::new(app).map_err(corrupt)?;
            let task = TaskId::new(task).map_err(corrupt)?;
            runs.push((app, task, decode(name, json)?));
        }
        runs.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        Ok(runs)
    }

    async fn remove_run(&self, app: AppId, task: TaskId) -> Result<(), StoreError> {
        self.live()?;
        self.runs_call(&["remove", app.as_str(), task.as_str()]).await.map(drop)
    }

    async fn cached_outputs(&self, key: &str) -> Result<Option<CachedOutputs>, StoreError> {
        let cmd = redis::cmd("HGET").arg(CATALOG).arg(key).clone();
        match self.inner.conn.query(&cmd).await.map_err(|e| redis_error(e, false))? {
            Value::Nil => Ok(None),
            Value::BulkString(json) => {
                let record: CachedRecord =
                    serde_json::from_slice(&json).map_err(|e| corrupt(format!("catalog `{key}`: {e}")))?;
                Ok(Some(record.into_entry(key).map_err(corrupt)?))
            }
            other => Err(corrupt(format!("catalog `{key}`: {other:?}"))),
        }
    }

    async fn put_cached_outputs(&self, key: String, entry: CachedOutputs) -> Result<(), StoreError> {
        self.live()?;
        let json = serde_json::to_string(&CachedRecord::of(&entry)).expect("records always encode");
        self.runs_call(&["cache", &key, &json, &entry.at.to_string()]).await.map(drop)
    }

    async fn forget_cached_outputs(&self, kept_before: Millis, limit: usize) -> Result<usize, StoreError> {
        self.live()?;
        let forgotten = self.runs_call(&["forget_cached", &kept_before.to_string(), &limit.to_string()]).await?;
        Ok(usize::try_from(forgotten).unwrap_or(usize::MAX))
    }

    async fn renew_executor(
        &self,
        node: &str,
        pools: &[PoolName],
        task_types: &[String],
        ttl: std::time::Duration,
    ) -> Result<(), StoreError> {
        self.live()?;
        let pools_named: Vec<&str> = pools.iter().map(PoolName::as_str).collect();
        let record = ExecutorRecord {
            pools: pools_named.iter().map(|p| (*p).to_owned()).collect(),
            task_types: Some(task_types.to_vec()),
        };
        let json = serde_json::to_string(&record).expect("records encode");
        // The pools first, then the lease: a lease is never live without its pools. Pools the
        // primary applied but too few replicas had in time (`--redis-min-replicas`, a replica
        // lagging or gone) are the primary's all the same: the lease is renewed there too, or a
        // replica's outage would let it lapse and whoever schedules take this daemon's pools as
        // lost. The first error is answered.
        let pools = redis::cmd("HSET").arg(EXECUTORS).arg(node).arg(json).clone();
        let pools_written = self.inner.conn.write(&pools, EXECUTORS).await;
        if let Err(WriteError::Redis(_)) = pools_written {
            return pools_written.map(drop).map_err(|e| call_error(e, true));
        }
        let ms = ttl.as_millis().clamp(1, u128::from(u64::MAX)) as u64;
        let key = executor_key(node);
        let lease = redis::cmd("SET").arg(&key).arg(1).arg("PX").arg(ms).clone();
        let lease_written = self.inner.conn.write(&lease, &key).await;
        pools_written.map_err(|e| call_error(e, true))?;
        lease_written.map_err(|e| call_error(e, true))?;
        Ok(())
    }

    async fn executors(&self) -> Result<Vec<ExecutorLease>, StoreError> {
        let fields = self.hash("executors", EXECUTORS).await?;
        let mut leases = Vec::with_capacity(fields.len());
        for (node, json) in fields {
            let record = ExecutorRecord::decode(&json).map_err(|e| corrupt(format!("executor `{node}`: {e}")))?;
            let pools = record.pools.iter().map(|n| PoolName::new(n).map_err(corrupt)).collect::<Result<_, _>>()?;
            // A lease of a daemon older than the task types took every type.
            let task_types = record.task_types.unwrap_or_else(|| vec![allot_core::apps::EVERY_TYPE.to_owned()]);
            leases.push(ExecutorLease { node, pools, task_types, live: false });
        }
        if leases.is_empty() {
            return Ok(leases);
        }
        // One call for every lease key (they share the `{allot-runs}` slot).
        let mut cmd = redis::cmd("MGET");
        for lease in &leases {
            cmd.arg(executor_key(&lease.node));
        }
        let Value::Array(values) = self.inner.conn.query(&cmd).await.map_err(|e| redis_error(e, false))? else {
            return Err(corrupt("executor leases: not a list"));
        };
        for (lease, value) in leases.iter_mut().zip(values) {
            lease.live = !matches!(value, Value::Nil);
        }
        Ok(leases)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run kept by an earlier version, without the fields added since, reads back.
    #[test]
    fn a_run_kept_by_an_earlier_version_reads_back() {
        let mut run = allot_store::conformance::sample_run();
        let mut json: serde_json::Value = serde_json::from_str(&RunRow::of(&run).to_json()).unwrap();
        for field in ["alloc", "task_seq", "cache", "details"] {
            json.as_object_mut().unwrap().remove(field);
        }
        (run.alloc, run.task_seq, run.cache) = (None, None, None);
        let run = allot_store::conformance::without_details(run);
        assert_eq!(decode("a/t", json.to_string().as_bytes()).unwrap(), run);
    }
}
