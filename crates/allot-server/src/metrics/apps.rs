//! The applications' series: each queue's usage and limits, and the scheduler's counters.

use super::*;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct QueueLabels {
    queue: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct QueueResourceLabels {
    queue: String,
    resource: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct QueueReasonLabels {
    queue: String,
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TimeoutLabels {
    kind: &'static str,
}

pub(super) type QueueResources = fn(&QueueView) -> Option<&Resources>;

pub(super) type QueueCount = fn(&QueueView) -> u64;

pub(super) fn encode_queues(encoder: &mut DescriptorEncoder<'_>, queues: &[QueueView]) -> Result<(), std::fmt::Error> {
    let resources: [Described<QueueResources>; 3] = [
        ("allot_apps_queue_used", "Held by the placements of the queue's applications, per resource", |v| {
            Some(&v.usage.allocated)
        }),
        ("allot_apps_queue_guaranteed", "The queue's guaranteed resources, per resource", |v| {
            Some(&v.limits.guaranteed)
        }),
        ("allot_apps_queue_max", "The queue's maximum, per resource (none: no maximum)", |v| v.limits.max.as_ref()),
    ];
    for (name, help, value) in resources {
        let family = Family::<QueueResourceLabels, FloatGauge>::default();
        for view in queues {
            for (resource, milli) in value(view).into_iter().flat_map(|r| r.iter()) {
                let labels = QueueResourceLabels { queue: view.path.to_string(), resource: resource.to_string() };
                family.get_or_create(&labels).set(milli as f64 / 1000.0);
            }
        }
        encode_family(encoder, name, help, &family)?;
    }
    let counts: [Described<QueueCount>; 4] = [
        ("allot_apps_queue_running_apps", "Applications holding placements in the queue", |v| v.usage.running_apps),
        ("allot_apps_queue_apps", "Applications in the queue that have not ended", |v| v.apps),
        ("allot_apps_queue_pending_apps", "Applications in the queue not running yet", |v| {
            v.apps.saturating_sub(v.usage.running_apps)
        }),
        ("allot_apps_queue_pending_tasks", "Tasks in the queue waiting to be placed", |v| v.pending_tasks),
    ];
    for (name, help, value) in counts {
        let family = Family::<QueueLabels, Gauge>::default();
        for view in queues {
            family.get_or_create(&QueueLabels { queue: view.path.to_string() }).set(gauge(value(view)));
        }
        encode_family(encoder, name, help, &family)?;
    }
    let waiting = Family::<QueueReasonLabels, Gauge>::default();
    for view in queues {
        for (reason, count) in &view.waiting {
            waiting.get_or_create(&QueueReasonLabels { queue: view.path.to_string(), reason }).set(gauge(*count));
        }
    }
    encode_family(
        encoder,
        "allot_apps_queue_waiting",
        "Applications and tasks waiting in the queue, by what holds them (reason: queue_limit, no_pool_matches, \
         no_room, tokens, gang_not_reserved, gang_missing_members, after_gang, forbidden)",
        &waiting,
    )
}

pub(super) fn encode_sched(encoder: &mut DescriptorEncoder<'_>, stats: &SchedStats) -> Result<(), std::fmt::Error> {
    for (name, help, value) in [
        ("allot_apps_cycles", "Scheduling cycles, since start", stats.cycles),
        ("allot_apps_placements", "Tasks placed on a pool of their own, since start", stats.placements),
        ("allot_apps_reservations", "Gangs reserved (all their placeholders), since start", stats.reservations),
        ("allot_apps_takeovers", "Tasks that took a placeholder over, since start", stats.takeovers),
        (
            "allot_apps_preemption_decisions",
            "Preemptions decided (for a task, or by a drained or shrunk pool), since start",
            stats.preemption_decisions,
        ),
        ("allot_apps_preemptions", "Tasks preempted (taken back to wait again), since start", stats.preemptions),
    ] {
        encode_counter(encoder, name, help, value)?;
    }
    let timeouts = Family::<TimeoutLabels, Counter>::default();
    timeouts.get_or_create(&TimeoutLabels { kind: "placeholder" }).inc_by(stats.placeholder_timeouts);
    timeouts.get_or_create(&TimeoutLabels { kind: "reserve" }).inc_by(stats.reserve_timeouts);
    encode_family(encoder, "allot_apps_timeouts", "Gang timeouts by kind, since start", &timeouts)
}
