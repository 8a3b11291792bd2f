//! The runs' series, on a daemon that runs tasks: its executor's counters and the plugins' own.

use super::*;

pub(super) fn encode_exec(encoder: &mut DescriptorEncoder<'_>, exec: &RunCounters) -> Result<(), std::fmt::Error> {
    let active = Gauge::<i64>::default();
    active.set(gauge(exec.active));
    let metric = encoder.encode_descriptor(
        "allot_runs_active",
        "Task runs this daemon's executor drives now",
        None,
        MetricType::Gauge,
    )?;
    active.encode(metric)?;
    encode_counter(encoder, "allot_runs_rounds", "Plugin rounds, since start", exec.rounds)?;
    encode_counter(encoder, "allot_runs_retries", "Failed attempts followed by another, since start", exec.retried)?;
    encode_counter(
        encoder,
        "allot_runs_held_back",
        "Times a run was held back by its application's max_parallelism, since start",
        exec.held_back,
    )?;
    encode_counter(
        encoder,
        "allot_runs_lists",
        "Lists taken of the tasks placed on this daemon's pools, since start",
        exec.lists,
    )?;
    encode_counter(
        encoder,
        "allot_runs_feed_cuts",
        "Times the change feed was cut under the executor, each followed by a list, since start",
        exec.feed_cuts,
    )?;
    let following = Gauge::<i64>::default();
    following.set(i64::from(exec.following_feed));
    let metric = encoder.encode_descriptor(
        "allot_runs_following_feed",
        "1 while the executor follows the store's change feed, 0 while it lists the tasks placed here periodically",
        None,
        MetricType::Gauge,
    )?;
    following.encode(metric)?;
    let ended = Family::<TotalResultLabels, Counter>::default();
    for (result, count) in [("succeeded", exec.succeeded), ("failed", exec.failed), ("aborted", exec.aborted)] {
        ended.get_or_create(&TotalResultLabels { result }).inc_by(count);
    }
    encode_family(encoder, "allot_runs_ended", "Task runs ended, by result, since start", &ended)?;
    let cache = Family::<TotalResultLabels, Counter>::default();
    cache.get_or_create(&TotalResultLabels { result: "hit" }).inc_by(exec.cache_hits);
    cache.get_or_create(&TotalResultLabels { result: "miss" }).inc_by(exec.cache_misses);
    encode_family(encoder, "allot_runs_cache_lookups", "Output cache lookups, by result, since start", &cache)?;
    let plugins = Family::<PluginCounterLabels, Counter>::default();
    for ((plugin, counter), value) in &exec.plugins {
        plugins.get_or_create(&PluginCounterLabels { plugin: plugin.clone(), counter: counter.clone() }).inc_by(*value);
    }
    encode_family(
        encoder,
        "allot_runs_plugin_counter",
        "Counters the plugins keep (their metrics scope), since start",
        &plugins,
    )
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct PluginCounterLabels {
    plugin: String,
    counter: String,
}
