//! Application files: one application, in YAML or TOML, with the fields of the API's `SubmitApp`
//! (docs/examples/etl.yaml). Read by `allot app submit`, `allot run` and the daemon's directory
//! source; every error names the file, the place (line and column) when the parser gives it, and
//! the field.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::Path;

use allot_client::{SubmitApp, TokenNeed};
use allot_core::apps::priority::Priority;
use allot_core::apps::queues::QueuePath;
use allot_core::apps::{AppId, AppSpec, GangStyle, GroupName, SchedulingPolicy, TaskGroup, TaskId, TaskSpec};
use allot_core::{NamespaceName, Resources};

/// The format a file's name tells, if any.
pub(crate) fn format_of(path: &Path) -> Option<Format> {
    match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("yaml" | "yml") => Some(Format::Yaml),
        Some("toml") => Some(Format::Toml),
        _ => None,
    }
}

/// An application file that cannot be used; `usage` when its name tells no format.
#[derive(Debug)]
pub(crate) struct FileError {
    pub(crate) usage: bool,
    pub(crate) message: String,
}

impl FileError {
    fn invalid(message: String) -> FileError {
        FileError { usage: false, message }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    Yaml,
    Toml,
}

/// Reads an application from `file` (`-`: YAML on stdin), parses it and checks what can be
/// checked without the daemon. Every message starts with the file's name, then the line and
/// column when the parser gives them, then the field.
pub(crate) fn read_app(file: &str) -> Result<SubmitApp, FileError> {
    let (name, text, format) = if file == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|err| FileError::invalid(format!("cannot read the application from stdin: {err}")))?;
        ("<stdin>", text, Format::Yaml)
    } else {
        let extension = Path::new(file).extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
        let format = match extension.as_deref() {
            Some("yaml" | "yml") => Format::Yaml,
            Some("toml") => Format::Toml,
            _ => {
                return Err(FileError {
                    usage: true,
                    message: format!(
                        "{file}: the name tells the format: end it in .yaml, .yml or .toml, or give - to read YAML \
                         from stdin"
                    ),
                })
            }
        };
        let text = std::fs::read_to_string(file).map_err(|err| FileError::invalid(format!("{file}: {err}")))?;
        (file, text, format)
    };
    let submit = parse_app(&text, format).map_err(|err| FileError::invalid(format!("{name}:{err}")))?;
    check_app(&submit).map_err(|err| FileError::invalid(format!("{name}: {err}")))?;
    Ok(submit)
}

/// Parses an application; an error reads `LINE:COLUMN: FIELD: message` (or ` FIELD: message`
/// when the parser gives no place), to follow the file's name and a `:`.
pub(crate) fn parse_app(text: &str, format: Format) -> Result<SubmitApp, String> {
    match format {
        // serde_norway names the field itself (`tasks[2].resources: ...`) and ends the message
        // with the place, which goes to the front.
        Format::Yaml => serde_norway::from_str(text).map_err(|err| {
            let message = err.to_string();
            match err.location() {
                Some(at) => {
                    let suffix = format!(" at line {} column {}", at.line(), at.column());
                    let message = message.strip_suffix(&suffix).unwrap_or(&message);
                    format!("{}:{}: {message}", at.line(), at.column())
                }
                None => format!(" {message}"),
            }
        }),
        // toml gives the place (a byte span) and the message, serde_path_to_error the field.
        Format::Toml => serde_path_to_error::deserialize(toml::Deserializer::new(text)).map_err(|err| {
            let path = err.path().to_string();
            let inner = err.into_inner();
            let field = if path == "." { String::new() } else { format!("{path}: ") };
            // A syntax error's message has lines of its own ("invalid table header\nexpected ...").
            let message = inner.message().trim().replace('\n', "; ");
            match inner.span() {
                Some(span) => {
                    let (line, column) = line_column(text, span.start);
                    format!("{line}:{column}: {field}{message}")
                }
                None => format!(" {field}{message}"),
            }
        }),
    }
}

/// The 1-based line and column (in characters) of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (before.matches('\n').count() + 1, before[line_start..].chars().count() + 1)
}

/// The checks the daemon makes of an application by itself (ids, queue path, resources, token
/// namespaces, task groups, timeouts), each error naming its field: `tasks[2].resources: ...`.
/// A priority as asked: a number or a class (which only the daemon knows), not both.
fn both_or_one(field: &str, value: Option<i32>, class: &Option<String>) -> Result<Priority, String> {
    match (value, class) {
        (Some(_), Some(_)) => Err(format!("{field}: give a priority or a priority_class, not both")),
        _ => Ok(Priority { value, class: class.clone() }),
    }
}

pub(crate) fn check_app(submit: &SubmitApp) -> Result<(), String> {
    fn at<T, E: std::fmt::Display>(field: &str, result: Result<T, E>) -> Result<T, String> {
        result.map_err(|err| format!("{field}: {err}"))
    }
    fn needs(field: &str, needs: &[TokenNeed]) -> Result<Vec<allot_core::apps::TokenNeed>, String> {
        needs
            .iter()
            .enumerate()
            .map(|(i, need)| {
                let namespace = at(&format!("{field}[{i}].namespace"), NamespaceName::new(&need.namespace))?;
                Ok(allot_core::apps::TokenNeed { namespace, units: need.units })
            })
            .collect()
    }
    let mut groups = Vec::new();
    for (i, group) in submit.task_groups.iter().enumerate() {
        let field = format!("task_groups[{i}]");
        groups.push(TaskGroup {
            name: at(&format!("{field}.name"), GroupName::new(&group.name))?,
            min_members: group.min_members,
            min_resources: at(&format!("{field}.min_resources"), group.min_resources.parse::<Resources>())?,
            selector: group.selector.clone(),
            tokens: needs(&format!("{field}.tokens"), &group.tokens)?,
        });
    }
    let defaults = SchedulingPolicy::default();
    let spec = AppSpec {
        id: at("id", AppId::new(&submit.id))?,
        // None named: the daemon's placement rules choose one.
        queue: submit.queue.as_deref().map_or(Ok(QueuePath::root()), |q| at("queue", QueuePath::named(q)))?,
        user: submit.user.clone(),
        user_groups: submit.user_groups.clone(),
        tags: submit.tags.clone(),
        groups,
        policy: SchedulingPolicy {
            placeholder_timeout_ms: submit.policy.placeholder_timeout_ms.unwrap_or(defaults.placeholder_timeout_ms),
            gang: match submit.policy.gang.unwrap_or_default() {
                allot_client::GangStyle::Soft => GangStyle::Soft,
                allot_client::GangStyle::Hard => GangStyle::Hard,
            },
            reserve_timeout_ms: submit.policy.reserve_timeout_ms,
            max_parallelism: submit
                .policy
                .max_parallelism
                .map(|n| at("policy.max_parallelism", u32::try_from(n).map_err(|_| "more than 4294967295")))
                .transpose()?,
        },
        queue_rule: None,
        priority: both_or_one("priority", submit.priority, &submit.priority_class)?,
    };
    let spec = spec.check().map_err(|err| err.to_string())?;
    let mut ids: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, task) in submit.tasks.iter().enumerate() {
        let field = format!("tasks[{i}]");
        if let Some(first) = ids.insert(&task.id, i) {
            return Err(format!("{field}.id: `{}` is the id of tasks[{first}] already", task.id));
        }
        let run_spec =
            allot_api::spec::with_retries(task.spec.clone(), task.retries).map_err(|why| format!("{field}.{why}"))?;
        if let Some(run_spec) = &run_spec {
            allot_api::spec::retries(run_spec).map_err(|why| format!("{field}.spec.{why}"))?;
        }
        let spec_text = run_spec.as_ref().map(serde_json::Value::to_string).unwrap_or_default();
        let task_spec = TaskSpec {
            preemptable: task.preemptable.unwrap_or(true),
            id: at(&format!("{field}.id"), TaskId::new(&task.id))?,
            resources: at(&format!("{field}.resources"), task.resources.parse::<Resources>())?,
            tokens: needs(&format!("{field}.tokens"), &task.tokens)?,
            group: task.group.as_deref().map(GroupName::new).transpose().map_err(|e| format!("{field}.group: {e}"))?,
            priority: both_or_one(&format!("{field}.priority"), task.priority, &task.priority_class)?,
            selector: task.selector.clone(),
            spec: spec_text,
        };
        at(&field, task_spec.check(&spec))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ETL_YAML: &str = include_str!("../../../docs/examples/etl.yaml");
    const ETL_TOML: &str = include_str!("../../../docs/examples/etl.toml");

    #[test]
    fn the_examples_are_one_application() {
        let yaml = parse_app(ETL_YAML, Format::Yaml).unwrap();
        let toml = parse_app(ETL_TOML, Format::Toml).unwrap();
        assert_eq!(yaml, toml);
        check_app(&yaml).unwrap();
        assert!(yaml.tasks.len() >= 3 && yaml.tasks.iter().any(|t| !t.tokens.is_empty()));
    }

    #[test]
    fn parse_errors_name_the_place_and_the_field() {
        let yaml = "id: a\nqueue: root.q\ntasks:\n  - id: t1\n    resources: cpu=1\n  - id: t2\n    resources: [1]\n";
        let err = parse_app(yaml, Format::Yaml).unwrap_err();
        assert!(err.starts_with("7:16: tasks[1].resources: invalid type: sequence"), "{err}");
        let yaml = "id: a\nqueue: root.q\ntasks:\n  - id: t1\n    resorces: cpu=1\n";
        let err = parse_app(yaml, Format::Yaml).unwrap_err();
        assert!(err.starts_with("5:5: tasks[0]: unknown field `resorces`"), "{err}");
        let yaml = "id: a\nqueue: root.q\ntasks:\n  - id: t1\n";
        let err = parse_app(yaml, Format::Yaml).unwrap_err();
        assert!(err.contains("tasks[0]: missing field `resources`"), "{err}");

        let toml = "id = \"a\"\nqueue = \"root.q\"\n\n[[tasks]]\nid = \"t1\"\nresources = \"cpu=1\"\n\n[[tasks]]\n\
                    id = \"t2\"\nresources = 4\n";
        let err = parse_app(toml, Format::Toml).unwrap_err();
        assert_eq!(err, "10:13: tasks[1].resources: invalid type: integer `4`, expected a string");
        let toml = "id = \"a\"\nqueue = \"root.q\"\npolicy = { gang = \"Medium\" }\n";
        let err = parse_app(toml, Format::Toml).unwrap_err();
        assert!(err.starts_with("3:19: policy.gang: unknown variant `Medium`"), "{err}");
        let err = parse_app("id = \"a\"\n[[tasks]\n", Format::Toml).unwrap_err();
        assert_eq!(err, "2:8: invalid table header; expected `.`, `]]`");
    }

    #[test]
    fn local_checks_name_the_field() {
        let mut app = parse_app(ETL_YAML, Format::Yaml).unwrap();
        app.tasks[1].resources = "cpu=lots".to_owned();
        assert!(check_app(&app).unwrap_err().starts_with("tasks[1].resources: "));
        app.tasks[1].resources = "cpu=1".to_owned();
        app.tasks[2].id = app.tasks[0].id.clone();
        assert!(check_app(&app).unwrap_err().starts_with("tasks[2].id: "));
        app.tasks[2].id = "fine".to_owned();
        app.tasks[1].spec = Some(serde_json::json!({ "type": "shell", "command": "make", "retries": 101 }));
        let err = check_app(&app).unwrap_err();
        assert_eq!(err, "tasks[1].spec.retries must be a whole number from 0 to 100, got 101");
        app.tasks[1].spec = Some(serde_json::json!({ "type": "shell", "command": "make", "retries": 2 }));
        check_app(&app).unwrap();
        app.queue = Some("analytics.etl".to_owned());
        assert!(check_app(&app).unwrap_err().starts_with("queue: queue `analytics.etl` is not a queue path"));
        app.queue = Some("analytics".to_owned());
        check_app(&app).unwrap();
    }
}
