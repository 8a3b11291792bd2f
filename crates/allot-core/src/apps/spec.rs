//! What users submit: applications with task groups and a scheduling policy, and tasks
//! [YuniKorn `AddApplicationRequest`, `AddTaskRequest`], and the checks they pass by themselves.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::apps::priority::Priority;
use crate::apps::queues::{Owner, QueuePath};
use crate::names::NamespaceName;
use crate::pools::Labels;
use crate::quotas::Millis;
use crate::resources::Resources;
use crate::MAX_UNITS;

use super::SchedError;

/// What an application, task or task group id matches (as in a Kubernetes label value): it is
/// part of token names (`@<app>:<task>`), so it has no `:`.
pub const ID_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$";
/// The longest id.
pub const MAX_ID_CHARS: usize = 100;
/// YuniKorn's default placeholder timeout: 15 minutes.
pub const DEFAULT_PLACEHOLDER_TIMEOUT_MS: u64 = 15 * 60 * 1000;
/// Timeouts are between 1 s and 30 days.
pub const MIN_TIMEOUT_MS: u64 = 1000;
pub const MAX_TIMEOUT_MS: u64 = 30 * 24 * 3600 * 1000;
/// The most members a task group may ask for, and the most task groups.
pub const MAX_MEMBERS: u32 = 10_000;
pub const MAX_GROUPS: usize = 100;
/// The largest opaque task spec, in bytes.
pub const MAX_SPEC_BYTES: usize = 64 * 1024;

fn check_id(what: &'static str, text: &str) -> Result<(), SchedError> {
    let mut chars = text.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok = text.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if !first_ok || !rest_ok || text.len() > MAX_ID_CHARS {
        return Err(SchedError::Invalid(format!(
            "{what} `{text}` is not an id: 1 to {MAX_ID_CHARS} of A-Z, a-z, 0-9, `.`, `_`, `-`, starting with a \
             letter or digit"
        )));
    }
    Ok(())
}

macro_rules! id_type {
    ($(#[$meta:meta])* $name:ident, $what:literal) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Arc<str>);

        impl $name {
            pub fn new(text: &str) -> Result<$name, SchedError> {
                check_id($what, text)?;
                Ok($name(Arc::from(text)))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

id_type!(
    /// An application's id, unique in the daemon.
    AppId,
    "application id"
);
id_type!(
    /// A task's id, unique in its application.
    TaskId,
    "task id"
);
id_type!(
    /// A task group's name, unique in its application.
    GroupName,
    "task group name"
);

/// Units of a token namespace's quota that a task (or each member of a task group) holds while
/// it is placed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct TokenNeed {
    pub namespace: NamespaceName,
    pub units: u64,
}

/// Sums the needs per namespace, in namespace order: one grant per namespace per holder.
pub fn merge_needs(needs: &[TokenNeed]) -> Result<Vec<TokenNeed>, SchedError> {
    let mut merged: BTreeMap<&NamespaceName, u64> = BTreeMap::new();
    for need in needs {
        if need.units == 0 || need.units > MAX_UNITS {
            return Err(SchedError::Invalid(format!(
                "tokens of `{}`: units must be between 1 and {MAX_UNITS}, got {}",
                need.namespace, need.units
            )));
        }
        let sum = merged.entry(&need.namespace).or_default();
        *sum = sum.saturating_add(need.units);
    }
    Ok(merged.into_iter().map(|(namespace, units)| TokenNeed { namespace: namespace.clone(), units }).collect())
}

/// A task group: `min_members` tasks that start together or not at all [YuniKorn `TaskGroup`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskGroup {
    pub name: GroupName,
    pub min_members: u32,
    /// What each member's placeholder holds; a member task may ask for less, never more.
    pub min_resources: Resources,
    /// Pools a member may go to: those with every one of these labels.
    pub selector: Labels,
    /// The tokens each member's placeholder holds.
    pub tokens: Vec<TokenNeed>,
}

/// What happens when a gang's placeholders time out [YuniKorn `gangSchedulingStyle`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GangStyle {
    /// Release the unused placeholders and go on as an ordinary application.
    #[default]
    Soft,
    /// Fail the application (`ResourceReservationTimeout`).
    Hard,
}

impl GangStyle {
    pub fn name(self) -> &'static str {
        match self {
            GangStyle::Soft => "Soft",
            GangStyle::Hard => "Hard",
        }
    }
}

/// How an application's gang is scheduled [YuniKorn `SchedulingPolicyParameters`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulingPolicy {
    /// How long reserved placeholders wait for their real tasks, from the reservation.
    pub placeholder_timeout_ms: u64,
    pub gang: GangStyle,
    /// How long the application may wait, from submission, before any placeholder is reserved.
    pub reserve_timeout_ms: Option<u64>,
    /// The most of its tasks the executors run at once (a task waiting for a token does not
    /// count); no limit when absent.
    pub max_parallelism: Option<u32>,
}

impl Default for SchedulingPolicy {
    fn default() -> SchedulingPolicy {
        SchedulingPolicy {
            placeholder_timeout_ms: DEFAULT_PLACEHOLDER_TIMEOUT_MS,
            gang: GangStyle::Soft,
            reserve_timeout_ms: None,
            max_parallelism: None,
        }
    }
}

/// The most groups an application's user may be given.
pub const MAX_USER_GROUPS: usize = 100;

/// How an application's queue was chosen, when a placement rule chose it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueRule {
    /// The rule, as [`crate::apps::placement::PlacementRule`] writes it (e.g. `user (parent:
    /// fixed root.users)`).
    pub rule: String,
    /// The rule may create the queue: made (with its parents, no limits) when the application
    /// is admitted, if it is missing then.
    pub create: bool,
}

/// An application as submitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppSpec {
    pub id: AppId,
    /// A leaf queue.
    pub queue: QueuePath,
    pub user: String,
    /// The user's groups, the primary one first: per-group limits count the application
    /// against it.
    pub user_groups: Vec<String>,
    pub tags: BTreeMap<String, String>,
    pub groups: Vec<TaskGroup>,
    pub policy: SchedulingPolicy,
    /// The placement rule that chose `queue`; none when the queue was named and taken as is.
    pub queue_rule: Option<QueueRule>,
    /// As asked; once admitted, resolved (see [`crate::apps::priority`]).
    pub priority: Priority,
}

impl AppSpec {
    /// An application of `user` in `queue`: no groups, tags, gang or rule, the default policy
    /// and priority.
    pub fn new(id: AppId, queue: QueuePath, user: &str) -> AppSpec {
        AppSpec {
            id,
            queue,
            user: user.to_owned(),
            user_groups: Vec::new(),
            tags: BTreeMap::new(),
            groups: Vec::new(),
            policy: SchedulingPolicy::default(),
            queue_rule: None,
            priority: Priority::default(),
        }
    }

    /// The checks an application passes by itself; token needs are merged per namespace.
    pub fn check(mut self) -> Result<AppSpec, SchedError> {
        crate::names::check("user", &self.user).map_err(|e| SchedError::Invalid(e.to_string()))?;
        if self.user_groups.len() > MAX_USER_GROUPS {
            return Err(SchedError::Invalid(format!(
                "a user has at most {MAX_USER_GROUPS} groups here, got {}",
                self.user_groups.len()
            )));
        }
        // As a principal's groups are: 1 to 255 characters, no control characters.
        let bad = |g: &String| g.is_empty() || g.chars().count() > 255 || g.chars().any(char::is_control);
        if let Some(group) = self.user_groups.iter().find(|g| bad(g)) {
            return Err(SchedError::Invalid(format!(
                "group `{}` is not a group name: 1 to 255 characters, no control characters",
                group.escape_debug()
            )));
        }
        check_timeout("placeholder_timeout_ms", self.policy.placeholder_timeout_ms)?;
        if let Some(timeout) = self.policy.reserve_timeout_ms {
            check_timeout("reserve_timeout_ms", timeout)?;
        }
        if self.policy.max_parallelism == Some(0) {
            return Err(SchedError::Invalid("max_parallelism must be at least 1".to_owned()));
        }
        if self.groups.len() > MAX_GROUPS {
            return Err(SchedError::Invalid(format!("at most {MAX_GROUPS} task groups, got {}", self.groups.len())));
        }
        // A group listed twice with the same content is one group; with other content, an error.
        let mut unique: Vec<TaskGroup> = Vec::with_capacity(self.groups.len());
        for group in std::mem::take(&mut self.groups) {
            match unique.iter().find(|other| other.name == group.name) {
                Some(other) if *other == group => {}
                Some(_) => return Err(SchedError::GroupConflict { group: group.name }),
                None => unique.push(group),
            }
        }
        self.groups = unique;
        for index in 0..self.groups.len() {
            let group = &mut self.groups[index];
            let name = &group.name;
            if !(1..=MAX_MEMBERS).contains(&group.min_members) {
                return Err(SchedError::Invalid(format!(
                    "task group `{name}`: min_members must be between 1 and {MAX_MEMBERS}, got {}",
                    group.min_members
                )));
            }
            if group.min_resources.is_empty() {
                return Err(SchedError::Invalid(format!("task group `{name}`: min_resources must name some resource")));
            }
            group.tokens = merge_needs(&group.tokens)?;
        }
        Ok(self)
    }

    pub fn group(&self, name: &GroupName) -> Option<&TaskGroup> {
        self.groups.iter().find(|g| &g.name == name)
    }

    /// Whom access rules judge the application as: its user, with its groups.
    pub fn principal(&self) -> crate::access::Principal {
        crate::access::Principal { user: self.user.clone(), groups: self.user_groups.clone() }
    }

    /// Whom the queues' per-user and per-group limits count the application against.
    pub fn owner(&self) -> Owner<'_> {
        Owner { user: &self.user, group: self.user_groups.first().map(String::as_str) }
    }
}

fn check_timeout(what: &str, ms: u64) -> Result<(), SchedError> {
    if !(MIN_TIMEOUT_MS..=MAX_TIMEOUT_MS).contains(&ms) {
        return Err(SchedError::Invalid(format!(
            "{what} must be between {MIN_TIMEOUT_MS} and {MAX_TIMEOUT_MS} ms, got {ms}"
        )));
    }
    Ok(())
}

/// A task as submitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskSpec {
    pub id: TaskId,
    pub resources: Resources,
    pub tokens: Vec<TokenNeed>,
    pub group: Option<GroupName>,
    /// Higher first, in a queue whose sort policy is `priority`, and inside its application. As
    /// asked; once added, resolved (naming nothing, its application's).
    pub priority: Priority,
    /// Whether the scheduler may preempt it (Flyte's `interruptible`); a gang member only with its
    /// whole gang.
    pub preemptable: bool,
    pub selector: Labels,
    /// Opaque to allot: whatever the one who runs the task needs (JSON text at the API).
    pub spec: String,
}

/// Reads the `type` of a spec that is a JSON object: a string, or none (another value, or no
/// `type`); the last one given when given twice, as a parsed object keeps it. Anything but an
/// object fails.
struct TypeOfSpec;

impl<'de> serde::de::Visitor<'de> for TypeOfSpec {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Option<String>, A::Error> {
        let mut task_type = None;
        while let Some(IsType(is_type)) = map.next_key()? {
            if is_type {
                task_type = map.next_value::<serde_json::Value>()?.as_str().map(str::to_owned);
            } else {
                map.next_value::<serde::de::IgnoredAny>()?;
            }
        }
        Ok(task_type)
    }
}

/// A key of a spec: whether it is `type` (read without copying it).
struct IsType(bool);

impl<'de> serde::Deserialize<'de> for IsType {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<IsType, D::Error> {
        struct Key;
        impl serde::de::Visitor<'_> for Key {
            type Value = IsType;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }

            fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<IsType, E> {
                Ok(IsType(key == "type"))
            }
        }
        deserializer.deserialize_str(Key)
    }
}

impl TaskSpec {
    /// The task's type: the `type` of its spec (a JSON object), which names the plugin that runs
    /// it; none for a task without one (run by whoever reports it, not by an executor).
    pub fn task_type(&self) -> Option<String> {
        if self.spec.is_empty() {
            return None;
        }
        // Read as it is written, without building the whole document: every task of a
        // submission is read twice (its check and its insertion).
        let mut reader = serde_json::Deserializer::from_str(&self.spec);
        let task_type = serde::Deserializer::deserialize_map(&mut reader, TypeOfSpec).ok()?;
        reader.end().ok()?;
        task_type
    }

    /// The checks a task passes against its application; token needs are merged per namespace.
    pub fn check(mut self, app: &AppSpec) -> Result<TaskSpec, SchedError> {
        if self.resources.is_empty() {
            return Err(SchedError::Invalid(format!("task `{}`: resources must name some resource", self.id)));
        }
        if self.spec.len() > MAX_SPEC_BYTES {
            return Err(SchedError::Invalid(format!(
                "task `{}`: the spec is {} bytes; the limit is {MAX_SPEC_BYTES}",
                self.id,
                self.spec.len()
            )));
        }
        self.tokens = merge_needs(&self.tokens)?;
        let Some(name) = &self.group else { return Ok(self) };
        let group = app.group(name).ok_or_else(|| SchedError::UnknownGroup {
            app: app.id.clone(),
            task: self.id.clone(),
            group: name.clone(),
        })?;
        // A member takes a placeholder over in place: it must fit in what the placeholder holds.
        if !group.min_resources.fits(&self.resources) {
            return Err(SchedError::LargerThanGroup {
                task: self.id.clone(),
                group: name.clone(),
                what: format!("resources {} exceed the group's min_resources {}", self.resources, group.min_resources),
            });
        }
        for need in &self.tokens {
            let held = group.tokens.iter().find(|g| g.namespace == need.namespace).map_or(0, |g| g.units);
            if need.units > held {
                return Err(SchedError::LargerThanGroup {
                    task: self.id.clone(),
                    group: name.clone(),
                    what: format!(
                        "{} units of `{}` exceed the {held} each member's placeholder holds",
                        need.units, need.namespace
                    ),
                });
            }
        }
        Ok(self)
    }
}

/// The daemon-clock time `ms` after `from`, saturating.
pub(crate) fn after(from: Millis, ms: u64) -> Millis {
    from.saturating_add(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the type of a spec was before it was read in place: the whole document parsed.
    fn parsed_type(spec: &str) -> Option<String> {
        let spec: serde_json::Value = serde_json::from_str(spec).ok()?;
        spec.get("type")?.as_str().map(str::to_owned)
    }

    #[test]
    fn a_spec_type_read_in_place_is_the_parsed_documents() {
        let specs = [
            "",
            "{}",
            r#"{"type":"noop"}"#,
            r#"{ "cmd": ["a", {"type": "inner"}], "type" : "shell" }"#,
            r#"{"type":"first","type":"last"}"#,
            r#"{"type":"sh\u0065ll","t\u0079pe2":1}"#,
            r#"{"\u0074ype":"escaped key"}"#,
            r#"{"type":7}"#,
            r#"{"type":null}"#,
            r#"{"type":{"nested":"x"}}"#,
            r#"["noop"]"#,
            r#""noop""#,
            "17",
            "null",
            r#"{"type":"noop"} trailing"#,
            r#"{"type":"noop""#,
            r#"{"type":"noop",}"#,
            "not json",
        ];
        for spec in specs {
            let task = TaskSpec {
                id: TaskId::new("t").unwrap(),
                resources: Resources::default(),
                tokens: Vec::new(),
                group: None,
                priority: Priority::default(),
                preemptable: false,
                selector: Labels::default(),
                spec: spec.to_owned(),
            };
            assert_eq!(task.task_type(), parsed_type(spec), "spec {spec:?}");
        }
    }
}
