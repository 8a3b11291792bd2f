//! Records of the applications part:
//! - `queues`: queue path -> [`QueueRecord`]
//! - `apps`: application id -> [`AppRecord`]
//! - `tasks`: (application id, task id) -> [`TaskRecord`]
//!
//! States are stored by name, so a reordering of the enums cannot misread a file.

use std::collections::BTreeMap;

use allot_core::apps::priority::{Priority, PriorityPolicy};
use allot_core::apps::queues::{PreemptionPolicy, QueueLimits, QueuePath, SortPolicy};
use allot_core::apps::states::{AppState, TaskState};
use allot_core::apps::{
    App, AppId, AppSpec, GangStyle, GroupName, HeldTokens, Placement, Preempting, QueueRule, SchedulingPolicy, Slot,
    Task, TaskGroup, TaskId, TaskSpec, TokenNeed,
};
use allot_core::pools::{AllocId, PoolName};
use allot_core::{Millis, NamespaceName, Token};
use redb::TableDefinition;
use serde::{Deserialize, Serialize};

use super::{resources_from, resources_record, CorruptRecord, ResourcesRecord};

pub const QUEUES: TableDefinition<&str, &[u8]> = TableDefinition::new("queues");
pub const APPS: TableDefinition<&str, &[u8]> = TableDefinition::new("apps");
pub const TASKS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("tasks");

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueRecord {
    pub guaranteed: ResourcesRecord,
    pub max: Option<ResourcesRecord>,
    pub max_apps: Option<u64>,
    pub user_max_apps: Option<u64>,
    pub user_max: Option<ResourcesRecord>,
    pub sort: String,
    /// Added after the format began (see [`crate::records::decode_grown`]), as the one after it.
    pub submit_acl: Option<String>,
    pub admin_acl: Option<String>,
    pub group_max_apps: Option<u64>,
    pub group_max: Option<ResourcesRecord>,
    pub borrow_limit: Option<ResourcesRecord>,
    pub lend_limit: Option<ResourcesRecord>,
    pub priority_offset: Option<i32>,
    /// `default` or `fence`.
    pub priority_policy: Option<String>,
    /// `default`, `fence` or `disabled`.
    pub preemption: Option<String>,
    pub preemption_delay_ms: Option<u64>,
}

/// The fields [`QueueRecord`] gained since the format began.
pub const QUEUE_FIELDS_ADDED: usize = 10;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRecord {
    pub name: String,
    pub min_members: u32,
    pub min_resources: ResourcesRecord,
    pub selector: BTreeMap<String, String>,
    pub tokens: Vec<(String, u64)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementRecord {
    pub pool: String,
    pub alloc: u64,
    pub resources: ResourcesRecord,
    /// (namespace, token, units)
    pub grants: Vec<(String, String, u64)>,
    pub at: Millis,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotRecord {
    pub group: String,
    pub member: u32,
    pub placement: PlacementRecord,
    pub task: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppRecord {
    pub queue: String,
    pub user: String,
    pub tags: BTreeMap<String, String>,
    pub groups: Vec<GroupRecord>,
    pub placeholder_timeout_ms: u64,
    pub gang: String,
    pub reserve_timeout_ms: Option<u64>,
    pub state: String,
    pub seq: u64,
    pub submitted: Millis,
    pub reserved_at: Option<Millis>,
    pub slots: Vec<SlotRecord>,
    pub gang_given_up: bool,
    pub counted: bool,
    pub completing_since: Option<Millis>,
    pub reason: Option<String>,
    pub ended_at: Option<Millis>,
    /// From here on, added after the format began: a record written before one of them ends
    /// where it starts (see [`decode_app`]).
    pub max_parallelism: Option<u32>,
    /// The user's groups, the primary one first (an older record: none).
    #[serde(default)]
    pub user_groups: Vec<String>,
    /// The placement rule that chose the queue, and whether it may create it.
    pub queue_rule: Option<(String, bool)>,
    /// Its priority (an older record: 0) and the class it came from.
    pub priority: Option<i32>,
    pub priority_class: Option<String>,
    /// The pools where room is held for its gang's members (`App::held`).
    #[serde(default)]
    pub held: Vec<String>,
    /// When its gang was last taken back whole by preemption (`App::gang_preempted_at`).
    #[serde(default)]
    pub gang_preempted_at: Option<Millis>,
}

/// The fields [`AppRecord`] gained since the format began (an empty list is one zero byte, as
/// a `None` is).
pub const APP_FIELDS_ADDED: usize = 7;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRecord {
    pub resources: ResourcesRecord,
    pub tokens: Vec<(String, u64)>,
    pub group: Option<String>,
    pub priority: i32,
    pub selector: BTreeMap<String, String>,
    pub spec: String,
    pub state: String,
    pub seq: u64,
    pub added: Millis,
    pub placement: Option<PlacementRecord>,
    pub slot: Option<u32>,
    pub reason: Option<String>,
    /// Added after the format began, from here on: the priority class `priority` came from.
    pub priority_class: Option<String>,
    /// Whether it may be preempted (an older record: yes).
    pub preemptable: Option<bool>,
    pub preemptions: Option<u32>,
    pub preempted_at: Option<Millis>,
    /// (application, task, since, reason) of the task it is preempted for.
    pub preempting: Option<(String, String, Millis, String)>,
    /// The pool where room is held for it.
    pub held: Option<String>,
}

/// The fields [`TaskRecord`] gained since the format began.
pub const TASK_FIELDS_ADDED: usize = 6;

fn sort_name(sort: SortPolicy) -> &'static str {
    match sort {
        SortPolicy::Fifo => "fifo",
        SortPolicy::Fair => "fair",
        SortPolicy::Priority => "priority",
    }
}

/// Turns errors of the core's constructors into [`CorruptRecord`]s of one key.
struct Reader {
    table: &'static str,
    key: String,
}

impl Reader {
    fn err(&self, reason: impl ToString) -> CorruptRecord {
        CorruptRecord { table: self.table, key: self.key.clone(), reason: reason.to_string() }
    }

    fn resources(&self, record: ResourcesRecord) -> Result<allot_core::Resources, CorruptRecord> {
        resources_from(record, self.table, &self.key)
    }

    fn needs(&self, record: Vec<(String, u64)>) -> Result<Vec<TokenNeed>, CorruptRecord> {
        record
            .into_iter()
            .map(|(namespace, units)| {
                Ok(TokenNeed { namespace: NamespaceName::new(&namespace).map_err(|e| self.err(e))?, units })
            })
            .collect()
    }

    fn placement(&self, record: PlacementRecord) -> Result<Placement, CorruptRecord> {
        let grants = record
            .grants
            .into_iter()
            .map(|(namespace, token, units)| {
                Ok(HeldTokens {
                    namespace: NamespaceName::new(&namespace).map_err(|e| self.err(e))?,
                    token: Token::new(&token).map_err(|e| self.err(e))?,
                    units,
                })
            })
            .collect::<Result<_, CorruptRecord>>()?;
        Ok(Placement {
            pool: PoolName::new(&record.pool).map_err(|e| self.err(e))?,
            alloc: AllocId(record.alloc),
            resources: self.resources(record.resources)?,
            grants,
            at: record.at,
        })
    }

    fn state<S: Copy>(&self, all: &[S], name: impl Fn(S) -> &'static str, text: &str) -> Result<S, CorruptRecord> {
        all.iter().copied().find(|s| name(*s) == text).ok_or_else(|| self.err(format!("unknown state `{text}`")))
    }
}

fn needs_record(needs: &[TokenNeed]) -> Vec<(String, u64)> {
    needs.iter().map(|n| (n.namespace.to_string(), n.units)).collect()
}

fn placement_record(placement: &Placement) -> PlacementRecord {
    PlacementRecord {
        pool: placement.pool.to_string(),
        alloc: placement.alloc.0,
        resources: resources_record(&placement.resources),
        grants: placement.grants.iter().map(|g| (g.namespace.to_string(), g.token.to_string(), g.units)).collect(),
        at: placement.at,
    }
}

impl QueueRecord {
    pub fn of(limits: &QueueLimits) -> QueueRecord {
        QueueRecord {
            guaranteed: resources_record(&limits.guaranteed),
            max: limits.max.as_ref().map(resources_record),
            max_apps: limits.max_apps,
            user_max_apps: limits.user_max_apps,
            user_max: limits.user_max.as_ref().map(resources_record),
            sort: sort_name(limits.sort).to_owned(),
            submit_acl: limits.submit_acl.as_ref().map(|acl| acl.text().to_owned()),
            admin_acl: limits.admin_acl.as_ref().map(|acl| acl.text().to_owned()),
            group_max_apps: limits.group_max_apps,
            group_max: limits.group_max.as_ref().map(resources_record),
            borrow_limit: limits.borrow_limit.as_ref().map(resources_record),
            lend_limit: limits.lend_limit.as_ref().map(resources_record),
            priority_offset: Some(limits.priority_offset).filter(|offset| *offset != 0),
            priority_policy: Some(limits.priority_policy)
                .filter(|policy| *policy != PriorityPolicy::Default)
                .map(|policy| policy.name().to_owned()),
            preemption: Some(limits.preemption)
                .filter(|policy| *policy != PreemptionPolicy::Default)
                .map(|policy| policy.name().to_owned()),
            preemption_delay_ms: limits.preemption_delay_ms,
        }
    }

    pub fn into_queue(self, path: &str) -> Result<(QueuePath, QueueLimits), CorruptRecord> {
        let r = Reader { table: "queues", key: path.to_owned() };
        let sort = [SortPolicy::Fifo, SortPolicy::Fair, SortPolicy::Priority]
            .into_iter()
            .find(|s| sort_name(*s) == self.sort)
            .ok_or_else(|| r.err(format!("unknown sort policy `{}`", self.sort)))?;
        let limits = QueueLimits {
            guaranteed: r.resources(self.guaranteed)?,
            max: self.max.map(|m| r.resources(m)).transpose()?,
            max_apps: self.max_apps,
            user_max_apps: self.user_max_apps,
            user_max: self.user_max.map(|m| r.resources(m)).transpose()?,
            sort,
            submit_acl: self
                .submit_acl
                .map(|a| allot_core::access::Acl::parse(&a).map_err(|e| r.err(e)))
                .transpose()?,
            admin_acl: self.admin_acl.map(|a| allot_core::access::Acl::parse(&a).map_err(|e| r.err(e))).transpose()?,
            group_max_apps: self.group_max_apps,
            group_max: self.group_max.map(|m| r.resources(m)).transpose()?,
            borrow_limit: self.borrow_limit.map(|m| r.resources(m)).transpose()?,
            lend_limit: self.lend_limit.map(|m| r.resources(m)).transpose()?,
            priority_offset: self.priority_offset.unwrap_or(0),
            priority_policy: match self.priority_policy {
                None => PriorityPolicy::Default,
                Some(name) => PriorityPolicy::from_name(&name)
                    .ok_or_else(|| r.err(format!("unknown priority policy `{name}`")))?,
            },
            preemption: match self.preemption {
                None => PreemptionPolicy::Default,
                Some(name) => PreemptionPolicy::from_name(&name)
                    .ok_or_else(|| r.err(format!("unknown preemption policy `{name}`")))?,
            },
            preemption_delay_ms: self.preemption_delay_ms,
        };
        Ok((QueuePath::new(path).map_err(|e| r.err(e))?, limits))
    }
}

impl AppRecord {
    pub fn of(app: &App) -> AppRecord {
        let spec = &app.spec;
        AppRecord {
            queue: spec.queue.to_string(),
            user: spec.user.clone(),
            tags: spec.tags.clone(),
            groups: spec
                .groups
                .iter()
                .map(|g| GroupRecord {
                    name: g.name.to_string(),
                    min_members: g.min_members,
                    min_resources: resources_record(&g.min_resources),
                    selector: g.selector.clone(),
                    tokens: needs_record(&g.tokens),
                })
                .collect(),
            placeholder_timeout_ms: spec.policy.placeholder_timeout_ms,
            gang: spec.policy.gang.name().to_owned(),
            reserve_timeout_ms: spec.policy.reserve_timeout_ms,
            state: app.state.name().to_owned(),
            seq: app.seq,
            submitted: app.submitted,
            reserved_at: app.reserved_at,
            slots: app
                .slots
                .iter()
                .map(|s| SlotRecord {
                    group: s.group.to_string(),
                    member: s.member,
                    placement: placement_record(&s.placement),
                    task: s.task.as_ref().map(|t| t.to_string()),
                })
                .collect(),
            gang_given_up: app.gang_given_up,
            counted: app.counted,
            completing_since: app.completing_since,
            reason: app.reason.clone(),
            ended_at: app.ended_at,
            max_parallelism: spec.policy.max_parallelism,
            user_groups: spec.user_groups.clone(),
            queue_rule: spec.queue_rule.as_ref().map(|p| (p.rule.clone(), p.create)),
            priority: spec.priority.value,
            priority_class: spec.priority.class.clone(),
            held: app.held.iter().map(|pool| pool.to_string()).collect(),
            gang_preempted_at: app.gang_preempted_at,
        }
    }

    pub fn into_app(self, id: &str) -> Result<App, CorruptRecord> {
        let r = Reader { table: "apps", key: id.to_owned() };
        let groups = self
            .groups
            .into_iter()
            .map(|g| {
                Ok(TaskGroup {
                    name: GroupName::new(&g.name).map_err(|e| r.err(e))?,
                    min_members: g.min_members,
                    min_resources: r.resources(g.min_resources)?,
                    selector: g.selector,
                    tokens: r.needs(g.tokens)?,
                })
            })
            .collect::<Result<_, CorruptRecord>>()?;
        let gang = match self.gang.as_str() {
            "Soft" => GangStyle::Soft,
            "Hard" => GangStyle::Hard,
            other => return Err(r.err(format!("unknown gang style `{other}`"))),
        };
        let slots = self
            .slots
            .into_iter()
            .map(|s| {
                Ok(Slot {
                    group: GroupName::new(&s.group).map_err(|e| r.err(e))?,
                    member: s.member,
                    placement: r.placement(s.placement)?,
                    task: s.task.map(|t| TaskId::new(&t).map_err(|e| r.err(e))).transpose()?,
                })
            })
            .collect::<Result<_, CorruptRecord>>()?;
        Ok(App {
            spec: AppSpec {
                id: AppId::new(id).map_err(|e| r.err(e))?,
                queue: QueuePath::new(&self.queue).map_err(|e| r.err(e))?,
                user: self.user,
                user_groups: self.user_groups,
                tags: self.tags,
                groups,
                policy: SchedulingPolicy {
                    placeholder_timeout_ms: self.placeholder_timeout_ms,
                    gang,
                    reserve_timeout_ms: self.reserve_timeout_ms,
                    max_parallelism: self.max_parallelism,
                },
                queue_rule: self.queue_rule.map(|(rule, create)| QueueRule { rule, create }),
                priority: Priority { value: Some(self.priority.unwrap_or(0)), class: self.priority_class },
            },
            state: r.state(AppState::ALL, AppState::name, &self.state)?,
            seq: self.seq,
            submitted: self.submitted,
            reserved_at: self.reserved_at,
            slots,
            gang_given_up: self.gang_given_up,
            counted: self.counted,
            completing_since: self.completing_since,
            reason: self.reason,
            ended_at: self.ended_at,
            held: self.held.iter().map(|pool| PoolName::new(pool).map_err(|e| r.err(e))).collect::<Result<_, _>>()?,
            gang_preempted_at: self.gang_preempted_at,
        })
    }
}

impl TaskRecord {
    pub fn of(task: &Task) -> TaskRecord {
        let spec = &task.spec;
        TaskRecord {
            resources: resources_record(&spec.resources),
            tokens: needs_record(&spec.tokens),
            group: spec.group.as_ref().map(|g| g.to_string()),
            priority: spec.priority.value(),
            selector: spec.selector.clone(),
            spec: spec.spec.clone(),
            state: task.state.name().to_owned(),
            seq: task.seq,
            added: task.added,
            placement: task.placement.as_ref().map(placement_record),
            slot: task.slot,
            reason: task.reason.clone(),
            priority_class: spec.priority.class.clone(),
            preemptable: Some(spec.preemptable),
            preemptions: Some(task.preemptions).filter(|n| *n > 0),
            preempted_at: task.preempted_at,
            preempting: task
                .preempting
                .as_ref()
                // A pool's own preemption (drained, shrunk) has no preemptor: empty names.
                .map(|p| {
                    let (app, task) =
                        p.by.as_ref()
                            .map_or((String::new(), String::new()), |(app, task)| (app.to_string(), task.to_string()));
                    (app, task, p.at, p.reason.clone())
                }),
            held: task.held.as_ref().map(|pool| pool.to_string()),
        }
    }

    pub fn into_task(self, app: &str, id: &str) -> Result<Task, CorruptRecord> {
        let r = Reader { table: "tasks", key: format!("{app}/{id}") };
        Ok(Task {
            app: AppId::new(app).map_err(|e| r.err(e))?,
            spec: TaskSpec {
                id: TaskId::new(id).map_err(|e| r.err(e))?,
                resources: r.resources(self.resources)?,
                tokens: r.needs(self.tokens)?,
                group: self.group.map(|g| GroupName::new(&g).map_err(|e| r.err(e))).transpose()?,
                priority: Priority { value: Some(self.priority), class: self.priority_class },
                preemptable: self.preemptable.unwrap_or(true),
                selector: self.selector,
                spec: self.spec,
            },
            state: r.state(TaskState::ALL, TaskState::name, &self.state)?,
            seq: self.seq,
            added: self.added,
            placement: self.placement.map(|p| r.placement(p)).transpose()?,
            slot: self.slot,
            reason: self.reason,
            preemptions: self.preemptions.unwrap_or(0),
            preempted_at: self.preempted_at,
            preempting: self
                .preempting
                .map(|(app, task, at, reason)| {
                    Ok(Preempting {
                        by: match app.is_empty() {
                            true => None,
                            false => Some((
                                AppId::new(&app).map_err(|e| r.err(e))?,
                                TaskId::new(&task).map_err(|e| r.err(e))?,
                            )),
                        },
                        at,
                        reason,
                    })
                })
                .transpose()?,
            held: self.held.map(|pool| PoolName::new(&pool).map_err(|e| r.err(e))).transpose()?,
        })
    }
}

/// Decodes a task record, one written before the fields it gained too.
pub fn decode_task(key: &str, bytes: &[u8]) -> Result<TaskRecord, CorruptRecord> {
    super::decode_grown("tasks", key, bytes, TASK_FIELDS_ADDED)
}

/// Decodes an application record, one written before the fields it gained too.
pub fn decode_app(key: &str, bytes: &[u8]) -> Result<AppRecord, CorruptRecord> {
    super::decode_grown("apps", key, bytes, APP_FIELDS_ADDED)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A queue record written before the ACLs (its bytes end where they start) reads as a queue
    /// without them; a new one reads as written.
    #[test]
    fn a_queue_record_of_the_older_format_reads_without_acls() {
        let limits = QueueLimits {
            max_apps: Some(3),
            submit_acl: Some(allot_core::access::Acl::parse("ada ops").unwrap()),
            borrow_limit: Some("cpu=2".parse().unwrap()),
            lend_limit: Some("gpu=1".parse().unwrap()),
            priority_offset: -5,
            priority_policy: PriorityPolicy::Fence,
            ..QueueLimits::default()
        };
        let bytes = crate::records::encode(&QueueRecord::of(&limits));
        let record: QueueRecord = crate::records::decode_grown("queues", "root.q", &bytes, QUEUE_FIELDS_ADDED).unwrap();
        assert_eq!(record.into_queue("root.q").unwrap().1, limits);
        let older = crate::records::encode(&QueueRecord {
            submit_acl: None,
            admin_acl: None,
            group_max_apps: None,
            group_max: None,
            borrow_limit: None,
            lend_limit: None,
            priority_offset: None,
            priority_policy: None,
            preemption: None,
            preemption_delay_ms: None,
            ..QueueRecord::of(&limits)
        });
        let older = &older[..older.len() - QUEUE_FIELDS_ADDED];
        let record: QueueRecord = crate::records::decode_grown("queues", "root.q", older, QUEUE_FIELDS_ADDED).unwrap();
        let (_, read) = record.into_queue("root.q").unwrap();
        assert_eq!((read.max_apps, read.submit_acl, read.admin_acl), (Some(3), None, None));
        assert_eq!((read.borrow_limit, read.priority_offset, read.priority_policy), (None, 0, PriorityPolicy::Default));
    }

    /// A task record written before priority classes reads as its priority with no class.
    #[test]
    fn a_task_record_of_the_older_format_reads_without_a_class() {
        let record = TaskRecord {
            resources: Vec::new(),
            tokens: Vec::new(),
            group: None,
            priority: 9,
            selector: BTreeMap::new(),
            spec: String::new(),
            state: "Pending".into(),
            seq: 1,
            added: 2,
            placement: None,
            slot: None,
            reason: None,
            priority_class: Some("high".into()),
            preemptable: Some(false),
            preemptions: Some(2),
            preempted_at: Some(7),
            preempting: None,
            held: Some("p".into()),
        };
        let bytes = crate::records::encode(&record);
        assert_eq!(decode_task("a/t", &bytes).unwrap(), record);
        let older = crate::records::encode(&TaskRecord {
            priority_class: None,
            preemptable: None,
            preemptions: None,
            preempted_at: None,
            preempting: None,
            held: None,
            ..record.clone()
        });
        let older = &older[..older.len() - TASK_FIELDS_ADDED];
        let read = decode_task("a/t", older).unwrap().into_task("a", "t").unwrap();
        assert_eq!(read.spec.priority, Priority::of(9));
        assert!(read.spec.preemptable, "an older task may be preempted");
        assert_eq!((read.preemptions, read.held), (0, None));
    }

    /// A record written before `max_parallelism` existed (its bytes end where the field starts)
    /// reads as one without a limit; a new one reads as written.
    #[test]
    fn an_application_record_of_the_older_format_reads_without_a_parallelism() {
        let record = AppRecord {
            queue: "root.q".into(),
            user: "u".into(),
            tags: BTreeMap::new(),
            groups: Vec::new(),
            placeholder_timeout_ms: 1_000,
            gang: "Soft".into(),
            reserve_timeout_ms: None,
            state: "New".into(),
            seq: 1,
            submitted: 5,
            reserved_at: None,
            slots: Vec::new(),
            gang_given_up: false,
            counted: false,
            completing_since: None,
            reason: None,
            ended_at: None,
            max_parallelism: Some(3),
            user_groups: vec!["data".into()],
            queue_rule: Some(("user".into(), true)),
            priority: Some(7),
            priority_class: Some("high".into()),
            held: vec!["p".into(), "q".into()],
            gang_preempted_at: Some(9),
        };
        let bytes = crate::records::encode(&record);
        assert_eq!(decode_app("a", &bytes).unwrap(), record);
        // Before the gang's preemption, the held room, the priority, the placement and the
        // groups: they read as none.
        let newer = AppRecord {
            user_groups: Vec::new(),
            queue_rule: None,
            priority: None,
            priority_class: None,
            held: Vec::new(),
            gang_preempted_at: None,
            ..record.clone()
        };
        let older = crate::records::encode(&newer);
        let older = &older[..older.len() - 6];
        assert_eq!(decode_app("a", older).unwrap(), AppRecord { max_parallelism: Some(3), ..newer.clone() });
        // Before the parallelism too.
        let older = crate::records::encode(&AppRecord { max_parallelism: None, ..newer });
        let older = &older[..older.len() - APP_FIELDS_ADDED];
        assert_eq!(decode_app("a", older).unwrap().max_parallelism, None);
        assert!(decode_app("a", &older[..older.len() - 2]).is_err(), "a record cut shorter is still corrupt");
    }
}
