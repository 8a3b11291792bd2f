//! Why an application or task waits: the answer of the last scheduling cycle that looked at it.

use std::fmt;

use crate::apps::queues::LimitHit;
use crate::names::NamespaceName;
use crate::pools::{Labels, PoolName};
use crate::quotas::TokenShortage;
use crate::resources::Resources;

use super::spec::GroupName;

/// What holds a waiting application or task back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    /// A queue or user limit, from the leaf up.
    QueueLimit(LimitHit),
    /// No pool that takes allocs has the labels of the selector.
    NoPoolMatches { selector: Labels, cordoned: Vec<PoolName> },
    /// Pools match, none has the room now; `closest` lacks the least.
    NoRoom { wanted: Resources, closest: Option<Box<(PoolName, Resources)>> },
    /// A token namespace cannot grant what is needed now.
    Tokens(TokenShortage),
    /// The application's gang is not reserved yet (for its tasks), and why (for the application).
    GangNotReserved { member: Option<(GroupName, u32)>, cause: Option<Box<Why>> },
    /// A reserved gang still waits for this many real tasks to take its placeholders.
    GangMissing { missing: u32 },
    /// The task waits for its application's gang: it is placed once the gang runs.
    AfterGang,
    /// The application's user may not use what the task needs: a token namespace, or every pool
    /// that would match (`what` names it). It waits until the user is given `use` on it.
    Forbidden { user: String, what: String },
    /// Every pool that would match is limited to other task types (its `plugins`): no executor
    /// there runs this one.
    TypeNotRun { task_type: Option<String>, pools: String },
    /// The task has a type, and no live executor runs any pool that would match: no daemon runs
    /// them (with `--run-pool`), or their daemons stopped.
    NotRun { pools: Vec<String> },
    /// As things are now (the pools' capacity, the quotas, the executors' task types) the task
    /// can never be placed: its application fails after a grace unless they grow back.
    CanNeverFit(NeverFits),
    /// No room now (`room`, a `NoRoom`), and what preemption says: when the task may preempt,
    /// or the rule that keeps it from preempting.
    NoRoomYet { room: Box<Why>, preemption: Preemption },
    /// Tasks on `pool` are being preempted for it (`victims`, `app/task`); the room is held for
    /// it, and it is placed once they have ended, at the latest after `grace_ms`.
    Preempting { pool: PoolName, victims: Vec<String>, grace_ms: u64 },
}

/// What preemption says of a task with no room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Preemption {
    /// It may preempt in this many seconds, once it has waited its queue's delay; `whom`, when
    /// the cycle looked, whom it would take as things are (or the rule that would keep it from
    /// preempting).
    In { seconds: u64, whom: Option<String> },
    /// The rule that keeps it from preempting (`it cannot preempt: ...`).
    Cannot(String),
}

impl fmt::Display for Preemption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Preemption::In { seconds, whom } => {
                write!(f, "if no room comes, it may preempt in {seconds}s (its queue's preemption_delay)")?;
                match whom {
                    Some(whom) if whom.starts_with("it cannot") => write!(f, "; but as things are, {whom}"),
                    Some(whom) => write!(f, "; as things are, {whom}"),
                    None => Ok(()),
                }
            }
            Preemption::Cannot(rule) => f.write_str(rule),
        }
    }
}

/// Why what a task asks for can never be had as things are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NeverFits {
    /// Larger than every pool its selector matches (`pools` says which they are).
    Resources { wanted: Resources, pools: String },
    /// More units than its namespace's quota.
    Tokens { namespace: NamespaceName, units: u64, quota: u64 },
    /// No daemon's registry runs its type.
    TaskType { task_type: String },
}

impl NeverFits {
    /// The code of a submission refused for it.
    pub fn code(&self) -> &'static str {
        match self {
            NeverFits::Resources { .. } => "task_never_fits",
            NeverFits::Tokens { .. } => "tokens_exceed_quota",
            NeverFits::TaskType { .. } => "task_type_unknown",
        }
    }
}

impl fmt::Display for NeverFits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NeverFits::Resources { wanted, pools } => {
                write!(f, "it asks for {wanted}, more than the capacity of every pool {pools}")
            }
            NeverFits::Tokens { namespace, units, quota } => {
                write!(f, "it needs {units} units of token namespace `{namespace}`, whose quota is {quota}")
            }
            NeverFits::TaskType { task_type } => write!(
                f,
                "no daemon runs tasks of type `{task_type}` (no executor's plugins register it, and none has a default plugin)"
            ),
        }
    }
}

impl Why {
    /// Every code [`Why::code`] answers, for whoever reads one back (a store's kept events).
    pub const CODES: &'static [&'static str] = &[
        "queue_limit",
        "no_pool_matches",
        "no_room",
        "tokens",
        "gang_not_reserved",
        "gang_missing_members",
        "after_gang",
        "forbidden",
        "type_not_run",
        "not_run",
        "can_never_fit",
        "preempting",
    ];

    /// The code of this name, as [`Why::code`] answers it.
    pub fn code_named(name: &str) -> Option<&'static str> {
        Why::CODES.iter().copied().find(|code| *code == name)
    }

    /// A stable machine-readable code for the API and metrics.
    pub fn code(&self) -> &'static str {
        match self {
            Why::QueueLimit(_) => "queue_limit",
            Why::NoPoolMatches { .. } => "no_pool_matches",
            Why::NoRoom { .. } => "no_room",
            Why::Tokens(_) => "tokens",
            Why::GangNotReserved { .. } => "gang_not_reserved",
            Why::GangMissing { .. } => "gang_missing_members",
            Why::AfterGang => "after_gang",
            Why::Forbidden { .. } => "forbidden",
            Why::TypeNotRun { .. } => "type_not_run",
            Why::NotRun { .. } => "not_run",
            Why::CanNeverFit(_) => "can_never_fit",
            Why::NoRoomYet { room, .. } => room.code(),
            Why::Preempting { .. } => "preempting",
        }
    }
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Why::QueueLimit(hit) => write!(f, "{hit}"),
            Why::NoPoolMatches { selector, cordoned } => {
                if selector.is_empty() {
                    f.write_str("there is no pool that takes allocs")?;
                } else {
                    let labels: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    write!(f, "no pool that takes allocs has the labels {}", labels.join(","))?;
                }
                match cordoned.as_slice() {
                    [] => Ok(()),
                    pools => {
                        let names: Vec<String> = pools.iter().map(|p| format!("`{p}`")).collect();
                        write!(f, " (cordoned: {}; it waits until one is uncordoned)", names.join(", "))
                    }
                }
            }
            Why::NoRoom { wanted, closest: Some(closest) } => {
                let (pool, lacks) = &**closest;
                write!(f, "no matching pool has {wanted} free; the closest, `{pool}`, lacks {lacks}")
            }
            Why::NoRoom { wanted, closest: None } => write!(f, "no matching pool has {wanted} free"),
            Why::Tokens(shortage) => write!(f, "{shortage}"),
            Why::GangNotReserved { member, cause } => {
                f.write_str("the gang's placeholders are not reserved yet")?;
                if let Some((group, index)) = member {
                    write!(f, ": member {} of task group `{group}`", index + 1)?;
                }
                match cause {
                    Some(cause) => write!(f, ": {cause}"),
                    None => Ok(()),
                }
            }
            Why::GangMissing { missing } => {
                write!(f, "the gang is reserved and still misses {missing} real tasks to take its placeholders")
            }
            Why::AfterGang => f.write_str("its application places its gang first"),
            Why::Forbidden { user, what } => write!(f, "user `{user}` may not use {what}"),
            Why::TypeNotRun { task_type: Some(task_type), pools } => write!(
                f,
                "no daemon that runs {pools} runs tasks of type `{task_type}` (its plugins, or the pools' `plugins`, leave it out)"
            ),
            Why::TypeNotRun { task_type: None, pools } => {
                write!(f, "the task names no type (`spec.type`), and {pools} runs only the types its `plugins` list")
            }
            Why::NotRun { pools } => {
                let named: Vec<String> = pools.iter().take(3).map(|p| format!("`{p}`")).collect();
                let more = pools.len().saturating_sub(named.len());
                let which = match (pools.len(), more) {
                    (1, _) => format!("pool {}", named[0]),
                    (_, 0) => format!("pools {}", named.join(", ")),
                    _ => format!("pools {} and {more} more", named.join(", ")),
                };
                let name = if pools.len() == 1 { pools[0].as_str() } else { "NAME" };
                write!(
                    f,
                    "the task has a type, and no daemon runs {which}, which would take it: start one with \
                     --run-pool {name}"
                )
            }
            Why::CanNeverFit(never) => write!(f, "it can never fit: {never}"),
            Why::NoRoomYet { room, preemption } => write!(f, "{room}; {preemption}"),
            Why::Preempting { pool, victims, grace_ms } => {
                let named: Vec<&str> = victims.iter().take(5).map(String::as_str).collect();
                let more = match victims.len().saturating_sub(named.len()) {
                    0 => String::new(),
                    more => format!(" and {more} more"),
                };
                write!(
                    f,
                    "preempting {}{more} on pool `{pool}` for it: the room is held for it, and it is placed once \
                     they have ended (their executors end them, at the latest {}s after they were chosen)",
                    named.join(", "),
                    grace_ms / 1000
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_is_listed() {
        let every = [
            Why::NoPoolMatches { selector: Labels::new(), cordoned: Vec::new() },
            Why::NoRoom { wanted: Resources::new(), closest: None },
            Why::GangNotReserved { member: None, cause: None },
            Why::GangMissing { missing: 1 },
            Why::AfterGang,
            Why::Forbidden { user: "ada".into(), what: "namespace `x`".into() },
            Why::TypeNotRun { task_type: Some("shell".into()), pools: "any pool".into() },
            Why::NotRun { pools: vec!["p".into()] },
            Why::CanNeverFit(NeverFits::TaskType { task_type: "x".into() }),
            Why::Preempting { pool: PoolName::new("p").unwrap(), victims: vec!["a/t".into()], grace_ms: 1000 },
        ];
        for why in &every {
            assert_eq!(Why::code_named(why.code()), Some(why.code()));
        }
        // The two that carry a part's own types, by name.
        assert!(Why::code_named("queue_limit").is_some() && Why::code_named("tokens").is_some());
        assert_eq!(Why::CODES.len(), every.len() + 2);
        assert_eq!(Why::code_named("no_such_code"), None);
    }
}
