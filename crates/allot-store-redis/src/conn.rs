//! One connection to Redis, standalone or cluster, that reconnects by itself.

use crate::config::RedisConfig;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, RedisError, Value};

use crate::cluster::{ClusterLink, READ_LANE};
use crate::scripts::Function;

pub(crate) use crate::timeouts::{CONNECTION_TIMEOUT, REPLICA_TIMEOUT, RESPONSE_TIMEOUT};

#[derive(Clone)]
pub(crate) struct Conn {
    /// Calls that change nothing.
    link: Link,
    /// Calls that change something: never sent twice by the client library (on a cluster a lane
    /// without retries; a standalone connection does not resend), so a failed change's error
    /// tells whether it may have been applied. With `--redis-min-replicas` its own connection,
    /// as `WAIT` holds it until the replicas answer and reads must not queue behind it.
    writes: Link,
    /// With `--redis-min-replicas`, how many replicas must have a change before it is
    /// acknowledged (`WAIT` after each change).
    min_replicas: u32,
}

#[derive(Clone)]
enum Link {
    Single(ConnectionManager),
    /// A cluster, and which of its connections ([`ClusterLink::conn`]).
    Cluster(Arc<ClusterLink>, usize),
}

/// A failed call that changes something.
#[derive(Debug)]
pub(crate) enum WriteError {
    Redis(RedisError),
    /// The primary applied the change, and fewer than the required replicas had it in time.
    Unreplicated {
        acked: i64,
        wanted: u32,
    },
}

impl From<RedisError> for WriteError {
    fn from(err: RedisError) -> WriteError {
        WriteError::Redis(err)
    }
}

impl Conn {
    /// Connects to `urls`: one URL is a standalone server, several are the seed nodes of a
    /// cluster. Fails if no server answers. Changes wait for `min_replicas` replicas.
    pub(crate) async fn connect(config: &RedisConfig) -> Result<Conn, RedisError> {
        let (urls, min_replicas) = (&config.urls, config.min_replicas);
        if config.cluster {
            let link = ClusterLink::connect(urls, 2).await?;
            let writes = Link::Cluster(link.clone(), 1);
            return Ok(Conn { link: Link::Cluster(link, READ_LANE), writes, min_replicas });
        }
        let link = Link::single(config).await?;
        let writes = match min_replicas {
            0 => link.clone(),
            _ => Link::single(config).await?,
        };
        Ok(Conn { link, writes, min_replicas })
    }

    pub(crate) async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        self.link.query(cmd).await
    }

    /// The cluster this connects to, if it is one.
    pub(crate) fn cluster(&self) -> Option<Arc<ClusterLink>> {
        match &self.link {
            Link::Cluster(link, _) => Some(link.clone()),
            Link::Single(_) => None,
        }
    }

    /// Sends a command that changes something, on `key`'s node. With a minimum of replicas, a
    /// change that was made is then followed on the same connection by `WAIT`, and answered only
    /// once they have it; one the function's check refused (too few replicas attached) answers
    /// at once.
    pub(crate) async fn write(&self, cmd: &Cmd, key: &str) -> Result<Value, WriteError> {
        let value = self.writes.query(cmd).await?;
        let wanted = self.min_replicas;
        if wanted == 0 {
            return Ok(value);
        }
        let acked = self.writes.wait(key, wanted).await?;
        if acked < i64::from(wanted) {
            return Err(WriteError::Unreplicated { acked, wanted });
        }
        Ok(value)
    }
}

impl Link {
    async fn single(config: &RedisConfig) -> Result<Link, RedisError> {
        // Nagle's algorithm stays on (redis-rs's default): with TCP_NODELAY the daemon used
        // 5-20 % more CPU per request under `allot bench pairs` for the same pairs/s, as each
        // call of the shared connection went out in a packet of its own.
        let client = config.client(&config.urls[0])?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECTION_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            // Reconnect quickly in the background; a call during an outage fails at once.
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(500));
        Ok(Link::Single(ConnectionManager::new_with_config(client, config).await?))
    }

    async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        match self {
            Link::Single(conn) => cmd.query_async(&mut conn.clone()).await,
            Link::Cluster(link, lane) => {
                let result = cmd.query_async(&mut link.conn(*lane)).await;
                link.note(&result);
                result
            }
        }
    }

    /// `WAIT` for `wanted` replicas of the writes made so far on this link's connection to
    /// `key`'s node: how many acknowledged within [`REPLICA_TIMEOUT`].
    async fn wait(&self, key: &str, wanted: u32) -> Result<i64, RedisError> {
        let mut wait = redis::cmd("WAIT");
        wait.arg(wanted).arg(REPLICA_TIMEOUT.as_millis() as u64);
        let answer = match self {
            Link::Single(conn) => wait.query_async(&mut conn.clone()).await,
            Link::Cluster(link, lane) => {
                let node = Route::with_key(key, SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(node));
                let result = link.conn(*lane).route_command(wait, routing).await;
                link.note(&result);
                result
            }
        }?;
        match answer {
            Value::Int(acked) => Ok(acked),
            other => Err(RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "WAIT did not answer a count",
                format!("{other:?}"),
            ))),
        }
    }
}

impl Conn {
    /// Loads the function library (on a cluster, on every primary); loading it again is fine.
    pub(crate) async fn load_library(&self, library: &str) -> Result<(), RedisError> {
        match self.query(redis::cmd("FUNCTION").arg("LOAD").arg(library)).await {
            Err(err) if err.to_string().contains("already exists") => Ok(()),
            res => res.map(|_| ()),
        }
    }

    /// Calls `function` with `key` (which chooses the hash slot) and `args`; a `mutating` call
    /// waits for the replicas as [`Conn::write`] does. A server that does not have the library
    /// yet (a new or restarted node) gets it, and the call is made again.
    pub(crate) async fn fcall(
        &self,
        library: &str,
        function: &Function,
        key: &str,
        args: &[&str],
        mutating: bool,
    ) -> Result<Value, WriteError> {
        let mut cmd = redis::cmd("FCALL");
        let name = if mutating { &function.checked } else { &function.name };
        cmd.arg(name).arg(1).arg(key).arg(args);
        let call = || async {
            if mutating {
                self.write(&cmd, key).await
            } else {
                Ok(self.query(&cmd).await?)
            }
        };
        match call().await {
            Err(WriteError::Redis(err)) if err.to_string().contains("Function not found") => {
                tracing::info!(function = %function.name, "loading allot's function library");
                self.load_library(library).await?;
                call().await
            }
            res => res,
        }
    }
}
