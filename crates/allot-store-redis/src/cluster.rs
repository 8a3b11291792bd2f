//! A Redis Cluster connection that follows the cluster.
//!
//! The client follows `MOVED` and `ASK` answers by itself, but a primary that died answers
//! nothing: the client keeps sending its slots to the dead address, and only learns of the
//! replica promoted in its place from some later redirection. So a watcher reads the slot map
//! (`CLUSTER SLOTS`) from whichever node answers, every second, and every [`TROUBLE_POLL`] while
//! calls fail; when the primaries change (a failover, a resharding), it connects anew to the
//! map it read and swaps the connection in, so calls reach the promoted replica within one poll
//! of the promotion. The same signal tells the wake-up subscriber to subscribe again.
//!
//! A failover is logged as a few lines: calls start failing, the slot map changed (which slots
//! moved where, how long reconnecting took), calls succeed again (after how long, how many
//! failed).

use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{AsyncConnectionConfig, RedisError, Value};
use tokio::sync::watch;

use crate::timeouts::{CONNECTION_TIMEOUT, RESPONSE_TIMEOUT};

/// How often the slot map is read while calls fail.
pub(crate) const TROUBLE_POLL: Duration = Duration::from_millis(50);
/// How often it is read otherwise.
const CALM_POLL: Duration = Duration::from_secs(1);
/// How long without a failed call ends an episode of failures.
const QUIET: Duration = Duration::from_secs(5);
/// How long the watcher waits for one node's slot map.
const PROBE_TIMEOUT: Duration = Duration::from_millis(250);
/// The longest connecting to a new slot map may take before the watcher gives it up for now.
const CONNECT_LANES_TIMEOUT: Duration = Duration::from_secs(5);

/// Slot ranges and the address (`host:port`) of the primary that serves each, in slot order.
pub(crate) type SlotMap = Vec<(u16, u16, String)>;

/// Calls failing, from the first failure to the last.
struct Episode {
    first: Instant,
    last: Instant,
    failed_calls: u64,
}

pub(crate) struct ClusterLink {
    /// The connections calls are sent on, made and replaced together: more than one when some
    /// calls must not queue behind others (`WAIT` holds its connection).
    current: RwLock<Vec<ClusterConnection>>,
    seeds: Vec<String>,
    map: Mutex<SlotMap>,
    /// From a failed call until [`QUIET`] passes without one.
    trouble: Mutex<Option<Episode>>,
    /// Bumped at every new connection: the subscriber subscribes again.
    generation: watch::Sender<u64>,
}

impl ClusterLink {
    /// Makes `lanes` connections to the cluster through `seeds` (`redis://host:port`) and starts
    /// the watcher.
    pub(crate) async fn connect(seeds: &[String], lanes: usize) -> Result<Arc<ClusterLink>, RedisError> {
        let conns = connect_lanes(seeds, lanes).await?;
        let map = read_map(&mut None, &addresses(&[], seeds)).await.unwrap_or_default();
        let link = Arc::new(ClusterLink {
            current: RwLock::new(conns),
            seeds: seeds.to_vec(),
            map: Mutex::new(map),
            trouble: Mutex::new(None),
            generation: watch::channel(0).0,
        });
        tokio::spawn(watch_map(Arc::downgrade(&link)));
        Ok(link)
    }

    /// The connection `lane` to send a call on.
    pub(crate) fn conn(&self, lane: usize) -> ClusterConnection {
        self.current.read().unwrap_or_else(|p| p.into_inner())[lane].clone()
    }

    /// Changes at every new connection to the cluster.
    pub(crate) fn generations(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// The addresses to reach the cluster at: the primaries last seen, then the seeds.
    pub(crate) fn addresses(&self) -> Vec<String> {
        addresses(&self.map.lock().unwrap_or_else(|p| p.into_inner()), &self.seeds)
    }

    /// The primaries that serve the cluster's slots (`host:port`), as the slot map reads now;
    /// `None` if no node answers.
    pub(crate) async fn primaries(&self) -> Option<Vec<String>> {
        let map = read_map(&mut None, &self.addresses()).await?;
        let mut primaries: Vec<String> = map.into_iter().map(|(_, _, primary)| primary).collect();
        primaries.sort();
        primaries.dedup();
        Some(primaries)
    }

    /// Sends `cmd` to the node at `address` (`host:port`), whatever keys it names: for the calls
    /// that read one server's keyspace (`SCAN`).
    pub(crate) async fn query_node(&self, cmd: &redis::Cmd, address: &str) -> Result<Value, RedisError> {
        let (host, port) = address
            .rsplit_once(':')
            .and_then(|(host, port)| Some((host.to_owned(), port.parse().ok()?)))
            .ok_or_else(|| {
                RedisError::from((redis::ErrorKind::InvalidClientConfig, "not a node's address", address.to_owned()))
            })?;
        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
        let result = self.conn(READ_LANE).route_command(cmd.clone(), routing).await;
        self.note(&result);
        result
    }

    /// Notes how a call went: a failure that a topology change could explain makes the watcher
    /// read the slot map more often, until [`QUIET`] passes without one.
    pub(crate) fn note<T>(&self, result: &Result<T, RedisError>) {
        let Err(err) = result else { return };
        if !followable(err) {
            return;
        }
        let now = Instant::now();
        let mut trouble = self.trouble.lock().unwrap_or_else(|p| p.into_inner());
        match &mut *trouble {
            Some(episode) => {
                episode.last = now;
                episode.failed_calls += 1;
            }
            None => {
                *trouble = Some(Episode { first: now, last: now, failed_calls: 1 });
                tracing::warn!(error = %err, "Redis Cluster calls fail; reading the slot map every 50 ms until they stop");
            }
        }
    }

    /// Ends the episode of failures once [`QUIET`] passed without one; whether one goes on.
    fn settle(&self) -> bool {
        let mut trouble = self.trouble.lock().unwrap_or_else(|p| p.into_inner());
        let Some(episode) = &*trouble else { return false };
        if episode.last.elapsed() < QUIET {
            return true;
        }
        tracing::info!(
            failing_ms = episode.last.duration_since(episode.first).as_millis() as u64,
            failed_calls = episode.failed_calls,
            "Redis Cluster calls succeed again"
        );
        *trouble = None;
        false
    }
}

/// Whether a failed call may succeed elsewhere once the client follows the cluster: the node did
/// not answer, or answered that the slot moved or the cluster is down.
fn followable(err: &RedisError) -> bool {
    err.is_io_error() || err.is_timeout() || slot_not_served(err)
}

/// Whether a node answered that it does not serve the slot now, or no connection to the slot's
/// node exists: a redirection (`MOVED`, `ASK`), the cluster not ready (`CLUSTERDOWN`,
/// `TRYAGAIN`), a primary down or demoted (`MASTERDOWN`, `READONLY`). Redis ran nothing.
pub(crate) fn slot_not_served(err: &RedisError) -> bool {
    err.is_cluster_error()
        || err.kind() == redis::ErrorKind::ClusterConnectionNotFound
        || matches!(err.code(), Some("MASTERDOWN" | "READONLY"))
}

/// A client for subscriptions (RESP3): messages and other pushes go to `pushes`.
pub(crate) fn subscriber(
    seeds: &[String],
    pushes: tokio::sync::mpsc::UnboundedSender<redis::PushInfo>,
) -> Result<ClusterClient, RedisError> {
    builder(seeds).use_protocol(redis::ProtocolVersion::RESP3).push_sender(pushes).build()
}

/// A retry waits 10-100 ms (the client's default, at least 1.28 s, held a call that began
/// before a promotion for seconds after it): following the cluster is the watcher's job, a
/// retry only covers a redirection or a connection being replaced. Only calls that change
/// nothing are retried by the client ([`READ_LANE`]).
fn builder(seeds: &[String]) -> ClusterClientBuilder {
    ClusterClientBuilder::new(seeds.to_vec())
        .connection_timeout(CONNECTION_TIMEOUT)
        .response_timeout(RESPONSE_TIMEOUT)
        .retries(2)
        .min_retry_wait(10)
        .max_retry_wait(100)
}

/// The lane of calls that change nothing: the client retries them (a redirection, a connection
/// replaced). Every other lane carries changes, which the client never sends twice: after a
/// change was sent, a connection that broke would be retried on a new one, and its final error
/// ("connection refused" from a node that died) would hide that the first send may have been
/// applied. Without retries, the error a change gets is the one of its only send.
pub(crate) const READ_LANE: usize = 0;

/// `lanes` connections to the cluster through `seeds`: [`READ_LANE`], then lanes for changes.
async fn connect_lanes(seeds: &[String], lanes: usize) -> Result<Vec<ClusterConnection>, RedisError> {
    let reads = builder(seeds).build()?;
    let changes = builder(seeds).retries(0).build()?;
    let mut conns = Vec::with_capacity(lanes);
    for lane in 0..lanes {
        let client = if lane == READ_LANE { &reads } else { &changes };
        conns.push(client.get_async_connection().await?);
    }
    Ok(conns)
}

fn addresses(map: &[(u16, u16, String)], seeds: &[String]) -> Vec<String> {
    let mut addresses: Vec<String> = Vec::new();
    let primaries = map.iter().map(|(_, _, primary)| format!("redis://{primary}"));
    for address in primaries.chain(seeds.iter().cloned()) {
        if !addresses.contains(&address) {
            addresses.push(address);
        }
    }
    addresses
}

/// Reads the slot map every [`CALM_POLL`] ([`TROUBLE_POLL`] while calls fail) and connects anew
/// when the primaries changed. Ends when the link is dropped.
async fn watch_map(link: Weak<ClusterLink>) {
    let mut probe: Option<(String, MultiplexedConnection)> = None;
    let mut paused = Duration::ZERO;
    loop {
        tokio::time::sleep(TROUBLE_POLL).await;
        paused += TROUBLE_POLL;
        let Some(link) = link.upgrade() else { return };
        if !link.settle() && paused < CALM_POLL {
            continue;
        }
        paused = Duration::ZERO;
        let Some(map) = read_map(&mut probe, &link.addresses()).await else { continue };
        let old = link.map.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if map == old || map.is_empty() {
            continue;
        }
        let started = Instant::now();
        let lanes = link.current.read().unwrap_or_else(|p| p.into_inner()).len();
        // Bounded: a connect that never answers (redis-rs #1953) must not stop this loop, which
        // alone follows the map; the next poll tries again.
        let seeds = addresses(&map, &link.seeds);
        let connecting = connect_lanes(&seeds, lanes);
        let connected = match tokio::time::timeout(CONNECT_LANES_TIMEOUT, connecting).await {
            Ok(connected) => connected,
            Err(_) => {
                tracing::warn!(
                    timeout_ms = CONNECT_LANES_TIMEOUT.as_millis() as u64,
                    "connecting to the new slot map took too long; trying again"
                );
                continue;
            }
        };
        match connected {
            Ok(conns) => {
                *link.current.write().unwrap_or_else(|p| p.into_inner()) = conns;
                tracing::info!(
                    moved = %moved(&old, &map),
                    reconnected_ms = started.elapsed().as_millis() as u64,
                    "Redis Cluster slot map changed; following it"
                );
                *link.map.lock().unwrap_or_else(|p| p.into_inner()) = map;
                link.generation.send_modify(|generation| *generation += 1);
            }
            Err(err) => tracing::debug!(error = %err, "cannot connect to the new slot map yet"),
        }
    }
}

/// Which slot ranges changed primary, e.g. `0-5460 -> 127.0.0.1:7004`.
fn moved(old: &SlotMap, new: &SlotMap) -> String {
    let changed: Vec<String> = new
        .iter()
        .filter(|range| !old.contains(range))
        .map(|(first, last, primary)| format!("{first}-{last} -> {primary}"))
        .collect();
    changed.join(", ")
}

/// The slot map as the first of `addresses` that answers sees it; `None` if none does. Keeps the
/// connection that answered in `probe` for the next read.
async fn read_map(probe: &mut Option<(String, MultiplexedConnection)>, addresses: &[String]) -> Option<SlotMap> {
    let mut order: Vec<&String> = addresses.iter().collect();
    if let Some((address, _)) = probe {
        order.sort_by_key(|a| *a != address);
    }
    for address in order {
        let conn = match probe.take() {
            Some((probed, conn)) if probed == *address => conn,
            _ => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(PROBE_TIMEOUT))
                    .set_response_timeout(Some(PROBE_TIMEOUT));
                let Ok(client) = redis::Client::open(address.as_str()) else { continue };
                match client.get_multiplexed_async_connection_with_config(&config).await {
                    Ok(conn) => conn,
                    Err(_) => continue,
                }
            }
        };
        let mut conn = conn;
        let host = address.trim_start_matches("redis://").rsplit_once(':').map(|(host, _)| host.to_owned());
        match redis::cmd("CLUSTER").arg("SLOTS").query_async::<Value>(&mut conn).await {
            Ok(value) => {
                if let Some(map) = parse_slots(&value, host.as_deref().unwrap_or("127.0.0.1")) {
                    *probe = Some((address.clone(), conn));
                    return Some(map);
                }
            }
            Err(_) => continue,
        }
    }
    None
}

/// Reads a `CLUSTER SLOTS` answer: `[[first, last, [host, port, id, ...], replicas...], ...]`.
/// An empty host means the node that answered.
fn parse_slots(value: &Value, answering_host: &str) -> Option<SlotMap> {
    let Value::Array(ranges) = value else { return None };
    let mut map = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Value::Array(fields) = range else { return None };
        let (Some(Value::Int(first)), Some(Value::Int(last)), Some(Value::Array(primary))) =
            (fields.first(), fields.get(1), fields.get(2))
        else {
            return None;
        };
        let host = match primary.first() {
            Some(Value::BulkString(host)) if !host.is_empty() => String::from_utf8_lossy(host).into_owned(),
            _ => answering_host.to_owned(),
        };
        let Some(Value::Int(port)) = primary.get(1) else { return None };
        map.push((u16::try_from(*first).ok()?, u16::try_from(*last).ok()?, format!("{host}:{port}")));
    }
    map.sort();
    Some(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![Value::BulkString(host.into()), Value::Int(port), Value::BulkString(b"id".to_vec())])
    }

    #[test]
    fn slot_maps_are_read_in_slot_order_and_compared_by_primary() {
        let answer = Value::Array(vec![
            Value::Array(vec![Value::Int(5461), Value::Int(16383), node("", 7001), node("10.0.0.3", 7003)]),
            Value::Array(vec![Value::Int(0), Value::Int(5460), node("10.0.0.2", 7000)]),
        ]);
        let map = parse_slots(&answer, "10.0.0.9").unwrap();
        assert_eq!(map, vec![(0, 5460, "10.0.0.2:7000".to_owned()), (5461, 16383, "10.0.0.9:7001".to_owned())]);
        let mut failed_over = map.clone();
        failed_over[0].2 = "10.0.0.4:7004".to_owned();
        assert_eq!(moved(&map, &failed_over), "0-5460 -> 10.0.0.4:7004");
        assert_eq!(addresses(&failed_over, &["redis://10.0.0.2:7000".to_owned()]).len(), 3);
        assert!(parse_slots(&Value::Int(1), "h").is_none());
    }
}
