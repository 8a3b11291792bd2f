//! One connection to Redis, standalone or cluster, that reconnects by itself.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, RedisError, Value};

use crate::scripts::Function;

/// How long one call may take before it is answered "outcome unknown".
pub(crate) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a change waits for its replicas (`WAIT`) with `--redis-min-replicas`; within
/// [`RESPONSE_TIMEOUT`], so a late replica is told apart from a lost answer.
pub(crate) const REPLICA_TIMEOUT: Duration = Duration::from_secs(1);
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Clone)]
pub(crate) struct Conn {
    link: Link,
    /// How many replicas must have a change before it is acknowledged (0: the primary's answer).
    min_replicas: u32,
}

#[derive(Clone)]
enum Link {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
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
    pub(crate) async fn connect(urls: &[String], cluster: bool, min_replicas: u32) -> Result<Conn, RedisError> {
        let link = Link::connect(urls, cluster).await?;
        Ok(Conn { link, min_replicas })
    }

    pub(crate) async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        self.link.query(cmd).await
    }

    /// Sends a command that changes something. With a minimum of replicas, it is followed on the
    /// same connection (to the same node) by `WAIT`, and answered only once they have it.
    pub(crate) async fn write(&self, cmd: &Cmd) -> Result<Value, WriteError> {
        if self.min_replicas == 0 {
            return Ok(self.link.query(cmd).await?);
        }
        let mut pipe = redis::pipe();
        pipe.add_command(cmd.clone()).cmd("WAIT").arg(self.min_replicas).arg(REPLICA_TIMEOUT.as_millis() as u64);
        let answers: Vec<Value> = self.link.query_pipeline(&pipe).await?;
        let [value, Value::Int(acked)] = <[Value; 2]>::try_from(answers).map_err(|answers| {
            RedisError::from((redis::ErrorKind::UnexpectedReturnType, "pipeline", format!("{answers:?}")))
        })?
        else {
            return Err(
                RedisError::from((redis::ErrorKind::UnexpectedReturnType, "WAIT did not answer a count")).into()
            );
        };
        if acked < i64::from(self.min_replicas) {
            return Err(WriteError::Unreplicated { acked, wanted: self.min_replicas });
        }
        Ok(value)
    }
}

impl Link {
    async fn connect(urls: &[String], cluster: bool) -> Result<Link, RedisError> {
        if cluster {
            let client = ClusterClientBuilder::new(urls.to_vec())
                .connection_timeout(CONNECTION_TIMEOUT)
                .response_timeout(RESPONSE_TIMEOUT)
                .retries(2)
                .build()?;
            return Ok(Link::Cluster(client.get_async_connection().await?));
        }
        // Nagle's algorithm stays on (redis-rs's default): with TCP_NODELAY the daemon used
        // 5-20 % more CPU per request under `allot bench pairs` for the same pairs/s, as each
        // call of the shared connection went out in a packet of its own.
        let client = redis::Client::open(urls[0].as_str())?;
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
            Link::Cluster(conn) => cmd.query_async(&mut conn.clone()).await,
        }
    }

    async fn query_pipeline(&self, pipe: &redis::Pipeline) -> Result<Vec<Value>, RedisError> {
        match self {
            Link::Single(conn) => pipe.query_async(&mut conn.clone()).await,
            Link::Cluster(conn) => pipe.query_async(&mut conn.clone()).await,
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
        cmd.arg(&function.name).arg(1).arg(key).arg(args);
        let call = || async {
            if mutating {
                self.write(&cmd).await
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
