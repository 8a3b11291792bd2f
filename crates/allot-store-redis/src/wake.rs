//! Wake-ups. A waiting allocate call is a waiter in its namespace's queue in Redis; the function
//! that grants it records the answer and publishes the waiter's id, on `allot:woken` (one Redis)
//! or on the namespace's own sharded channel (a cluster). This daemon's subscriber wakes the call,
//! which claims its answer at once; a waiting call also checks every `wake_poll`
//! ([`RedisConfig::wake_poll`](crate::RedisConfig)), so a lost message delays an answer but never
//! loses it, and a call that goes away takes its waiter out of
//! the queue ([`WaitGuard`]). The same subscriber listens on `allot:sched`, where a daemon that
//! made room (a quota or a pool put) tells the scheduler to look again, and on the change feed's
//! channels (`allot:feed`, `allot:feed:log`). Every channel's name is here: the feed publishes on
//! them, and this module imports nothing that imports it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use allot_core::{NamespaceName, QueuePlace, Token};
use allot_store::{Allocation, StoreError};
use futures_util::StreamExt;
use redis::{RedisError, Value};
use tokio::sync::Notify;

use crate::cluster;
use crate::reply::{self, corrupt};
use crate::store::Inner;

/// The channel on which scripts publish the waiters they answered.
const CHANNEL: &str = "allot:woken";
/// The channel on which a daemon says it made room that may admit a waiting application (a
/// quota or a pool put): whoever schedules reads the pools and namespaces again and runs a
/// cycle at once. A plain channel: on a cluster every node forwards it to every subscriber.
const SCHED_CHANNEL: &str = "allot:sched";
/// Where a call that found its stream empty names it (`lua/namespace.lua`).
pub(crate) const STREAM_CHANNEL: &str = "allot:feed";
/// Where a copier says the log has new events.
pub(crate) const LOG_CHANNEL: &str = "allot:feed:log";

/// Waits until `deadline` (the daemon's monotonic clock, `RedisConfig::time`, looked at on every
/// wake-up) for the answer of waiter `wid` (queued by an allocate in the namespace of prefix
/// `key`): woken by a message on the channel, or every `wake_poll`. When the wait ends, the
/// waiter leaves the queue, or its answer that came meanwhile is taken.
pub(crate) async fn wait_for(
    inner: &Arc<Inner>,
    namespace: NamespaceName,
    token: Token,
    key: String,
    wid: u64,
    deadline: allot_core::Millis,
) -> Result<Allocation, StoreError> {
    let notify = Arc::new(Notify::new());
    inner.waits.lock().unwrap_or_else(|p| p.into_inner()).insert((key.clone(), wid), notify.clone());
    inner.wait_started.notify_one();
    let mut guard = WaitGuard { inner: inner.clone(), namespace, token, key, wid, armed: true };
    let mut shutdown = inner.shutdown.subscribe();
    // The answer may have come before this call was listening.
    let mut check = true;
    loop {
        if check {
            match claim(inner, &guard.namespace, &guard.token, &guard.key, wid, None).await {
                Ok(Some(answer)) => {
                    guard.armed = false;
                    return Ok(answer);
                }
                Ok(None) => {}
                // Redis is away for now, or its primary short of replicas refused the claim:
                // keep waiting, the next check may succeed (the waiter is still queued, and an
                // answer given up here would leave its units to be granted to nobody).
                Err(StoreError::Unavailable(_) | StoreError::OutcomeUnknown(_) | StoreError::NotEnoughReplicas(_)) => {}
                Err(err) => {
                    guard.armed = false;
                    return Err(err);
                }
            }
        }
        let left = Duration::from_millis(deadline.saturating_sub(inner.time.monotonic_ms()));
        tokio::select! {
            _ = notify.notified() => check = true,
            _ = tokio::time::sleep(inner.wake_poll.min(left)) => check = true,
            _ = shutdown.wait_for(|stop| *stop) => break,
        }
        if inner.time.monotonic_ms() >= deadline {
            break;
        }
    }
    // The wait is over: leave the queue, or take the answer that came meanwhile.
    let answer = claim(inner, &guard.namespace, &guard.token, &guard.key, wid, Some("timed_out")).await;
    if answer.is_ok() {
        guard.armed = false;
    }
    answer?.ok_or_else(|| corrupt("a cancelled waiter still waits"))
}

/// Takes a waiter out of the queue if its caller goes away before an answer.
struct WaitGuard {
    inner: Arc<Inner>,
    namespace: NamespaceName,
    token: Token,
    key: String,
    wid: u64,
    armed: bool,
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        self.inner.waits.lock().unwrap_or_else(|p| p.into_inner()).remove(&(self.key.clone(), self.wid));
        if !self.armed {
            return;
        }
        let (inner, namespace, token, key, wid) =
            (self.inner.clone(), self.namespace.clone(), self.token.clone(), self.key.clone(), self.wid);
        tokio::spawn(async move {
            if let Err(err) = claim(&inner, &namespace, &token, &key, wid, Some("caller_left")).await {
                tracing::debug!(error = %err, "could not withdraw an abandoned waiter; the sweep will");
            }
        });
    }
}

/// Claims the answer of waiter `wid`; with `cancel` (why: `timed_out`, `caller_left`), takes it
/// out of the queue if it still waits. `None` while it still waits.
async fn claim(
    inner: &Inner,
    namespace: &NamespaceName,
    token: &Token,
    key: &str,
    wid: u64,
    cancel: Option<&str>,
) -> Result<Option<Allocation>, StoreError> {
    let wid_text = wid.to_string();
    let args = match cancel {
        Some(why) => [wid_text.as_str(), "1", why, token.as_str()],
        None => [wid_text.as_str(), "0", "", token.as_str()],
    };
    let mut reply = inner.eval(&inner.scripts.claim, key, &args, true).await?;
    match reply.text()?.as_str() {
        "waiting" => Ok(None),
        "granted" => {
            let grant = reply::grant_info(&mut reply, namespace, token.as_str())?;
            Ok(Some(Allocation::Granted { grant, existing: false }))
        }
        "refused" => {
            let refusal = reply::refusal(&mut reply)?;
            let place = QueuePlace { position: reply.uint()? as usize, units_ahead: reply.uint()? };
            Ok(Some(Allocation::Refused { refusal, place: Some(place) }))
        }
        "error" => Err(reply::error(namespace, Some(token), &mut reply)?),
        "gone" => Err(StoreError::Invalid(
            "a newer allocate call with the same token took over this wait, or the grant it won was \
             already released, or Redis lost the wait (a failover or restart that lost its last writes)"
                .into(),
        )),
        other => Err(corrupt(format!("claim reply `{other}`"))),
    }
}

/// Says on [`SCHED_CHANNEL`] that room was made. Best effort: a message lost is made up for by
/// the scheduler's own reading of the pools and namespaces, at most a second later.
pub(crate) async fn nudge_scheduler(inner: &Inner) {
    let publish = redis::cmd("PUBLISH").arg(SCHED_CHANNEL).arg("room").to_owned();
    if let Err(err) = inner.conn.query(&publish).await {
        tracing::debug!(error = %err, "could not tell the scheduler about new room");
    }
}

/// Listens on [`CHANNEL`] and wakes this daemon's waiting calls, and on [`SCHED_CHANNEL`] and
/// wakes its scheduler. After a reconnection every waiting call checks its answer, as messages
/// may have been missed meanwhile.
pub(crate) async fn run_subscriber(inner: Arc<Inner>, config: crate::RedisConfig) {
    loop {
        let attempt = async {
            let client = config.client(&config.urls[0])?;
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&[CHANNEL, SCHED_CHANNEL, STREAM_CHANNEL, LOG_CHANNEL]).await?;
            Ok::<_, RedisError>(pubsub)
        };
        match attempt.await {
            Ok(pubsub) => {
                wake_all(&inner);
                inner.apps.room_made();
                inner.feed.copy_all();
                let mut messages = pubsub.into_on_message();
                while let Some(message) = messages.next().await {
                    let payload = String::from_utf8_lossy(message.get_payload_bytes());
                    match message.get_channel_name() {
                        SCHED_CHANNEL => inner.apps.room_made(),
                        STREAM_CHANNEL => inner.feed.mark(&payload),
                        LOG_CHANNEL => inner.feed.log_grew(),
                        _ => wake_listed(&inner, &payload),
                    }
                }
                tracing::warn!("lost the subscription to wake-ups; reconnecting");
            }
            Err(err) => tracing::debug!(error = %err, "cannot subscribe to wake-ups yet"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// On a Redis Cluster: subscribes (`SSUBSCRIBE`) to the channel of every namespace a call of this
/// daemon waits in, on the node that serves its slot, and wakes those calls. Each message stays
/// on its slot's node, so losing any one node loses only the wake-ups of its slots until its
/// replica takes over; when the slot map changes, the subscriptions are made again on the new
/// primaries and every waiting call checks its answer. Channels stay subscribed once used (one
/// per namespace at most).
pub(crate) async fn run_sharded_subscriber(inner: Arc<Inner>, link: Arc<cluster::ClusterLink>) {
    let mut generations = link.generations();
    let mut shutdown = inner.shutdown.subscribe();
    loop {
        generations.borrow_and_update();
        let (pushes, mut received) = tokio::sync::mpsc::unbounded_channel();
        let conn = match cluster::subscriber(&link.addresses(), pushes) {
            Ok(client) => client.get_async_connection().await,
            Err(err) => Err(err),
        };
        match conn {
            Ok(mut conn) => {
                if let Err(err) = conn.subscribe(&[SCHED_CHANNEL, STREAM_CHANNEL, LOG_CHANNEL]).await {
                    tracing::debug!(error = %err, "cannot subscribe to the scheduler's channel yet");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                inner.apps.room_made();
                inner.feed.copy_all();
                let mut subscribed: std::collections::HashSet<String> = std::collections::HashSet::new();
                // The waiting calls are looked at when one starts, not at every message.
                let mut calls_started = true;
                'connected: loop {
                    let wanted: Vec<String> = if std::mem::take(&mut calls_started) {
                        let waits = inner.waits.lock().unwrap_or_else(|p| p.into_inner());
                        let prefixes: BTreeSet<&String> = waits.keys().map(|(prefix, _)| prefix).collect();
                        prefixes.into_iter().filter(|p| !subscribed.contains(*p)).cloned().collect()
                    } else {
                        Vec::new()
                    };
                    // Each call of a newly subscribed namespace checks its answer, in case the
                    // message came before the subscription (after a reconnection: all of them).
                    for prefix in wanted {
                        if let Err(err) = conn.ssubscribe(format!("{prefix}:wake")).await {
                            tracing::debug!(error = %err, %prefix, "cannot subscribe to a namespace's wake-ups yet");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            break 'connected;
                        }
                        subscribed.insert(prefix.clone());
                        wake_prefix(&inner, &prefix);
                    }
                    tokio::select! {
                        push = received.recv() => match push {
                            Some(push) if push.kind == redis::PushKind::SMessage => {
                                if let Some(Value::BulkString(payload)) = push.data.get(1) {
                                    wake_listed(&inner, &String::from_utf8_lossy(payload));
                                }
                            }
                            Some(push) if push.kind == redis::PushKind::Message => {
                                let text = |i: usize| match push.data.get(i) {
                                    Some(Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
                                    _ => String::new(),
                                };
                                match text(0).as_str() {
                                    STREAM_CHANNEL => inner.feed.mark(&text(1)),
                                    LOG_CHANNEL => inner.feed.log_grew(),
                                    _ => inner.apps.room_made(),
                                }
                            }
                            Some(_) => {}
                            None => break 'connected,
                        },
                        _ = inner.wait_started.notified() => calls_started = true,
                        _ = generations.changed() => break 'connected,
                        _ = shutdown.changed() => return,
                    }
                }
            }
            Err(err) => {
                tracing::debug!(error = %err, "cannot subscribe to wake-ups yet");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        if *inner.shutdown.borrow() {
            return;
        }
    }
}

/// Wakes the calls named by a message `<namespace prefix>\n<waiter id>,<waiter id>...`.
fn wake_listed(inner: &Inner, payload: &str) {
    let Some((key, ids)) = payload.split_once('\n') else { return };
    let waits = inner.waits.lock().unwrap_or_else(|p| p.into_inner());
    for id in ids.split(',').filter_map(|id| id.parse::<u64>().ok()) {
        if let Some(notify) = waits.get(&(key.to_owned(), id)) {
            notify.notify_one();
        }
    }
}

/// Wakes every call waiting in the namespace of `prefix`: each checks its answer.
fn wake_prefix(inner: &Inner, prefix: &str) {
    for ((key, _), notify) in inner.waits.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        if key == prefix {
            notify.notify_one();
        }
    }
}

fn wake_all(inner: &Inner) {
    for notify in inner.waits.lock().unwrap_or_else(|p| p.into_inner()).values() {
        notify.notify_one();
    }
}
