//! One connection to Redis, standalone or cluster, that reconnects by itself.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, RedisError, Value};

use crate::scripts::Function;

/// How long one call may take before it is answered "outcome unknown".
pub(crate) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    /// Connects to `urls`: one URL is a standalone server, several are the seed nodes of a
    /// cluster. Fails if no server answers.
    pub(crate) async fn connect(urls: &[String], cluster: bool) -> Result<Conn, RedisError> {
        if cluster {
            let client = ClusterClientBuilder::new(urls.to_vec())
                .connection_timeout(CONNECTION_TIMEOUT)
                .response_timeout(RESPONSE_TIMEOUT)
                .retries(2)
                .build()?;
            return Ok(Conn::Cluster(client.get_async_connection().await?));
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
        Ok(Conn::Single(ConnectionManager::new_with_config(client, config).await?))
    }

    pub(crate) async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        match self {
            Conn::Single(conn) => cmd.query_async(&mut conn.clone()).await,
            Conn::Cluster(conn) => cmd.query_async(&mut conn.clone()).await,
        }
    }

    /// Loads the function library (on a cluster, on every primary); loading it again is fine.
    pub(crate) async fn load_library(&self, library: &str) -> Result<(), RedisError> {
        match self.query(redis::cmd("FUNCTION").arg("LOAD").arg(library)).await {
            Err(err) if err.to_string().contains("already exists") => Ok(()),
            res => res.map(|_| ()),
        }
    }

    /// Calls `function` with `key` (which chooses the hash slot) and `args`. A server that does
    /// not have the library yet (a new or restarted node) gets it, and the call is made again.
    pub(crate) async fn fcall(
        &self,
        library: &str,
        function: &Function,
        key: &str,
        args: &[&str],
    ) -> Result<Value, RedisError> {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(&function.name).arg(1).arg(key).arg(args);
        match self.query(&cmd).await {
            Err(err) if err.to_string().contains("Function not found") => {
                tracing::info!(function = %function.name, "loading allot's function library");
                self.load_library(library).await?;
                self.query(&cmd).await
            }
            res => res,
        }
    }
}
