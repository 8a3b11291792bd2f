//! Where the Redis backend connects: the `--store` address read into a [`RedisConfig`] (one
//! server, or the seed nodes of a cluster), and how many replicas must have a change.

use std::sync::Arc;
use std::time::Duration;

use allot_core::clock::{SystemTime, TimeSource};
use allot_store::ids::{IdSource, RandomIds};
use allot_store::WatchConfig;

/// How often, by default, the daemon that schedules reads the pools and quotas again while
/// something waits.
const DEFAULT_SCHED_REFRESH: Duration = Duration::from_secs(1);

/// How often, by default, a waiting allocate checks its answer without a wake-up message: a lost
/// message delays an answer by at most this.
const DEFAULT_WAKE_POLL: Duration = Duration::from_millis(250);

/// Where the Redis backend connects.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// Server URLs: one standalone server, or seed nodes of a cluster.
    pub urls: Vec<String>,
    pub cluster: bool,
    /// How many replicas must have a change before it is acknowledged (`WAIT`); 0, the
    /// default, acknowledges once the primary applied it.
    pub min_replicas: u32,
    /// How much of the change feed the shared log keeps, and each watcher's buffer.
    pub watch: WatchConfig,
    /// With `rediss://`: the CA certificates (PEM) to trust for the server's certificate instead
    /// of the system's.
    pub tls_ca: Option<Vec<u8>>,
    /// While applications wait, how often the daemon that schedules reads the pools and quotas
    /// again: what other clients free through Redis directly. Room made through a daemon (a
    /// quota raised, a pool grown) starts a cycle on a fresh reading at once anyway.
    pub sched_refresh: Duration,
    /// How often a waiting allocate checks its answer without a wake-up message (one that was
    /// lost, or published while the subscriber reconnected).
    pub wake_poll: Duration,
    /// Where the daemon reads the time it decides by (the scheduler's lease, how old its
    /// readings of Redis are, when a pool is next swept): the machine's clocks by default.
    /// Redis's own clock (`TIME`) decides leases' deadlines; this one relates them to now.
    pub time: Arc<dyn TimeSource>,
    /// Where the random ids of allocs, sessions and placeholders come from: the machine's
    /// randomness by default.
    pub ids: Arc<dyn IdSource>,
}

/// `url` with its password (`user:password@`) replaced by `***`.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let Some((credentials, host)) = rest.rsplit_once('@') else { return url.to_owned() };
    match credentials.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => format!("{scheme}://***@{host}"),
    }
}

/// A `--store` value that is not a Redis address.
#[derive(Debug, thiserror::Error)]
#[error(
    "`{0}` is not a Redis store address: use redis://HOST:PORT (one server) or \
     redis+cluster://HOST:PORT[,HOST:PORT...] (a Redis Cluster)"
)]
pub struct BadAddress(String);

impl RedisConfig {
    /// Reads `redis://HOST:PORT[/DB]` (also `rediss://`) or
    /// `redis+cluster://HOST:PORT[,HOST:PORT...]`.
    pub fn parse(address: &str) -> Result<RedisConfig, BadAddress> {
        let bad = || BadAddress(redact(address));
        if let Some(nodes) = address.strip_prefix("redis+cluster://") {
            let urls: Vec<String> =
                nodes.split(',').filter(|n| !n.trim().is_empty()).map(|n| format!("redis://{}", n.trim())).collect();
            if urls.is_empty() {
                return Err(bad());
            }
            for url in &urls {
                redis::Client::open(url.as_str()).map_err(|_| bad())?;
            }
            return Ok(RedisConfig {
                urls,
                cluster: true,
                min_replicas: 0,
                watch: WatchConfig::default(),
                tls_ca: None,
                sched_refresh: DEFAULT_SCHED_REFRESH,
                wake_poll: DEFAULT_WAKE_POLL,
                time: Arc::new(SystemTime),
                ids: Arc::new(RandomIds),
            });
        }
        if !(address.starts_with("redis://") || address.starts_with("rediss://")) {
            return Err(bad());
        }
        redis::Client::open(address).map_err(|_| bad())?;
        Ok(RedisConfig {
            urls: vec![address.to_owned()],
            cluster: false,
            min_replicas: 0,
            watch: WatchConfig::default(),
            tls_ca: None,
            sched_refresh: DEFAULT_SCHED_REFRESH,
            wake_poll: DEFAULT_WAKE_POLL,
            time: Arc::new(SystemTime),
            ids: Arc::new(RandomIds),
        })
    }

    /// Trusts the CA certificates `pem` for a `rediss://` server's certificate (instead of the
    /// system's).
    pub fn with_tls_ca(self, pem: Vec<u8>) -> RedisConfig {
        RedisConfig { tls_ca: Some(pem), ..self }
    }

    /// The URLs without their passwords, for logs.
    pub fn redacted_urls(&self) -> Vec<String> {
        self.urls.iter().map(|url| redact(url)).collect()
    }

    /// A client of `url`, over TLS with the configured CA for `rediss://`.
    pub(crate) fn client(&self, url: &str) -> redis::RedisResult<redis::Client> {
        match &self.tls_ca {
            Some(pem) if url.starts_with("rediss://") => redis::Client::build_with_tls(
                url,
                redis::TlsCertificates { client_tls: None, root_cert: Some(pem.clone()) },
            ),
            _ => redis::Client::open(url),
        }
    }

    /// Keeps the change feed as `watch` says.
    pub fn with_watch(self, watch: WatchConfig) -> RedisConfig {
        RedisConfig { watch, ..self }
    }

    /// Acknowledges a change only once `replicas` replicas have it.
    pub fn with_min_replicas(self, replicas: u32) -> RedisConfig {
        RedisConfig { min_replicas: replicas, ..self }
    }

    /// Reads the pools and quotas again every `refresh` while applications wait.
    pub fn with_sched_refresh(self, refresh: Duration) -> RedisConfig {
        RedisConfig { sched_refresh: refresh, ..self }
    }

    /// A waiting allocate checks its answer every `poll` even without a wake-up message.
    pub fn with_wake_poll(self, poll: Duration) -> RedisConfig {
        RedisConfig { wake_poll: poll, ..self }
    }

    /// Reads the time from `time` instead of the machine's clocks.
    pub fn with_time(self, time: Arc<dyn TimeSource>) -> RedisConfig {
        RedisConfig { time, ..self }
    }

    /// Draws random ids from `ids` instead of the machine's randomness.
    pub fn with_ids(self, ids: Arc<dyn IdSource>) -> RedisConfig {
        RedisConfig { ids, ..self }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_kept_out_of_what_is_logged() {
        assert_eq!(redact("rediss://allot:s3cret@10.0.0.1:6380"), "rediss://allot:***@10.0.0.1:6380");
        assert_eq!(redact("redis://:s3cret@host:1/0"), "redis://:***@host:1/0");
        assert_eq!(redact("redis://host:6379"), "redis://host:6379");
        let err = RedisConfig::parse("redis+cluster://a:s3cret@").unwrap_err().to_string();
        assert!(!err.contains("s3cret"), "{err}");
    }

    #[test]
    fn store_addresses_are_parsed() {
        let single = RedisConfig::parse("redis://127.0.0.1:6379").unwrap();
        assert_eq!((single.urls.len(), single.cluster), (1, false));
        let cluster = RedisConfig::parse("redis+cluster://127.0.0.1:7000, 127.0.0.1:7001").unwrap();
        assert_eq!(cluster.urls, vec!["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]);
        assert!(cluster.cluster);
        for bad in ["127.0.0.1:6379", "http://x", "redis+cluster://", "embedded"] {
            assert!(RedisConfig::parse(bad).is_err(), "{bad}");
        }
    }
}
