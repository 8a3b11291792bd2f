//! The OpenAPI document: utoipa's derivation from the handlers and the wire types, plus the limits
//! the server enforces (name rules, id formats, number ranges, the resources grammar) and the
//! error codes it answers, stated here from the same constants the checks use and from the error
//! codes themselves, so that the document and the server cannot drift.

use std::collections::BTreeMap;

use allot_core::pools::{ALLOC_ID_PATTERN, MAX_IDLE_MS};
use allot_core::resources::resources_pattern;
use allot_core::runs::MAX_RETRIES;
use allot_core::watch::EventKind;
use allot_core::{MAX_NAME_CHARS, MAX_TTL_MS, MAX_UNITS, NAMESPACE_PATTERN, NAME_PATTERN, SESSION_ID_PATTERN};
use serde_json::{json, Value};

use allot_core::apps::queues::{MAX_QUEUE_PATH, QUEUE_PATH_PATTERN};
use allot_core::apps::spec::{ID_PATTERN, MAX_GROUPS, MAX_MEMBERS, MAX_TIMEOUT_MS, MAX_USER_GROUPS, MIN_TIMEOUT_MS};

use crate::convert::quotas::MIN_LEASE_MS;
use crate::error::{ErrorCode, Part};
use crate::routes::access::MAX_API_TOKEN_TTL_MS;

/// An application, task or task group id.
fn id() -> Value {
    json!({"type": "string", "pattern": ID_PATTERN,
        "description": "1 to 100 of A-Z, a-z, 0-9, `.`, `_`, `-`, starting with a letter or digit"})
}

fn queue_path() -> Value {
    json!({"type": "string", "pattern": QUEUE_PATH_PATTERN, "maxLength": MAX_QUEUE_PATH,
        "description": "`root`, then `.`-separated segments of a-z, 0-9, `_`, `-`, e.g. `root.analytics.etl`"})
}

/// The queue an application names: a path, or one segment (a queue under `root`).
fn named_queue() -> Value {
    json!({"type": "string", "pattern": "^(root(\\.[a-z0-9_-]+)*|[a-z0-9_-]{1,250})$", "maxLength": MAX_QUEUE_PATH,
        "description": "a path, `root` then `.`-separated segments of a-z, 0-9, `_`, `-` (e.g. `root.analytics.etl`), \
        or one segment, a queue under `root`"})
}

fn name() -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": MAX_NAME_CHARS, "pattern": NAME_PATTERN,
        "description": "1 to 255 characters; no control characters, no `/`, not `.` or `..`"})
}

/// A resources text, e.g. `cpu=4,mem=16GiB`; `some`: at least one quantity above zero.
fn resources(some: bool) -> Value {
    json!({"pattern": resources_pattern(some), "description": format!(
        "`name=quantity` items joined by `,`, e.g. `cpu=4,mem=16GiB,gpu=1`{}. A name is a-z first, then a-z, 0-9, \
         `_`, `-`, `.` (at most 64); a quantity has up to 3 decimals and a unit (`m`, `k`/`K`, `M`, `G`, `T`, `P`, \
         `Ki`..`Pi`, optionally followed by `B`), with at most 16 digits before the point in plain units (fewer in \
         larger units). A name given twice counts once, with its largest quantity.",
        if some { "; at least one quantity above zero" } else { "" }
    )})
}

fn range(min: u64, max: u64) -> Value {
    json!({"minimum": min, "maximum": max})
}

/// A name of an API token or binding.
fn access_name() -> Value {
    json!({"type": "string", "pattern": crate::routes::access::NAME_PATTERN,
        "description": "1 to 100 of A-Z, a-z, 0-9, `.`, `_`, `-`"})
}

/// A user or group name.
fn person() -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": 255, "pattern": crate::routes::access::PERSON_PATTERN,
        "description": "1 to 255 characters, no control characters"})
}

/// The description's paragraph on errors: the body of an error answer, then every code
/// ([`ErrorCode::ALL`]) by part and by the status it is answered with.
fn error_codes() -> String {
    let parts = [
        (Part::Daemon, "Codes", ""),
        (Part::Quotas, "Token quotas", ""),
        (Part::Pools, "Pools", " An ended alloc reads as 410 Gone with its record."),
        (
            Part::Apps,
            "Applications",
            " A token namespace, task group or priority class that an application or task names and that \
             does not exist is namespace_not_found, unknown_task_group or unknown_priority_class, a 409: the \
             path's resource exists.",
        ),
        (Part::Runs, "Runs", ""),
        (
            Part::Watch,
            "Watch",
            " A watch from a revision no longer kept is revision_compacted: list again, then watch from the \
             list's Allot-Revision.",
        ),
        (
            Part::Access,
            "Identity and access",
            " A call without a known API token or client certificate is unauthenticated (401, with \
             WWW-Authenticate); one without the permission its route needs is forbidden (403), naming both.",
        ),
    ];
    let mut text = String::from("Every error answer has the body `{\"error\": {\"code\": ..., \"message\": ...}}`.");
    for (part, title, note) in parts {
        let mut by_status: BTreeMap<u16, Vec<&str>> = BTreeMap::new();
        for code in ErrorCode::ALL.iter().filter(|code| code.part() == part) {
            by_status.entry(code.status()).or_default().push(code.as_str());
        }
        let groups: Vec<String> =
            by_status.iter().map(|(status, codes)| format!("{} ({status})", codes.join(", "))).collect();
        text.push_str(&format!(" {title}: {}.{note}", groups.join("; ")));
    }
    text
}

/// Adds the server's limits to utoipa's document, and the error codes to its description (as
/// its second paragraph).
pub(crate) fn with_limits(mut doc: Value, max_wait: std::time::Duration) -> Value {
    if let Some(description) = doc["info"]["description"].as_str() {
        let (first, rest) = description.split_once("\n\n").unwrap_or((description, ""));
        doc["info"]["description"] = Value::String(format!("{first}\n\n{}\n\n{rest}", error_codes()));
    }
    let namespace = json!({"type": "string", "minLength": 1, "maxLength": MAX_NAME_CHARS,
        "pattern": NAMESPACE_PATTERN,
        "description": "`:`-separated segments, none empty, e.g. `hive:cluster-a`; \
            1 to 255 characters, no control characters, no `/`, not `.` or `..`"});
    let path_params = [
        ("namespace", namespace.clone()),
        ("token", name()),
        ("pool", name()),
        ("id", json!({"type": "string", "pattern": SESSION_ID_PATTERN, "description": "32 hexadecimal digits"})),
        ("alloc", json!({"type": "string", "pattern": ALLOC_ID_PATTERN, "description": "16 hexadecimal digits"})),
        ("queue", queue_path()),
        ("app", id()),
        ("task", id()),
        ("name", access_name()),
    ];
    if let Some(paths) = doc["paths"].as_object_mut() {
        for operation in paths.values_mut().filter_map(Value::as_object_mut).flat_map(|item| item.values_mut()) {
            // An optional body is an absent body, not a `null` one: utoipa writes `Option<T>` as
            // "null or T" and required; state it as T, not required (an empty body reads as `{}`).
            if let Some(body) = operation.get_mut("requestBody") {
                let schema = &mut body["content"]["application/json"]["schema"];
                if let Some([null, other]) = schema["oneOf"].as_array().map(Vec::as_slice) {
                    if null["type"] == "null" {
                        *schema = other.clone();
                        body["required"] = Value::Bool(false);
                    }
                }
            }
            let Some(parameters) = operation.get_mut("parameters").and_then(Value::as_array_mut) else { continue };
            for parameter in parameters.iter_mut() {
                if parameter["in"] == "path" {
                    if let Some((_, schema)) = path_params.iter().find(|(name, _)| parameter["name"] == *name) {
                        parameter["schema"] = schema.clone();
                    }
                } else if parameter["in"] == "query" && parameter["name"] == "fencing" {
                    parameter["schema"]["maximum"] = json!(MAX_UNITS);
                } else if parameter["in"] == "query" && parameter["name"] == "can" {
                    parameter["schema"] = json!({"type": "array", "maxItems": 100, "items": {"type": "string",
                        "pattern": "^(read|use|admin|impersonate):(daemon|(namespace|pool|queue):.+)$"}});
                }
            }
        }
    }
    // Each list's cursors, exactly.
    for (path, schema) in crate::page::cursor_schemas() {
        let parameters = doc["paths"][path]["get"]["parameters"].as_array_mut().expect("a list route has parameters");
        let cursor = parameters.iter_mut().find(|p| p["name"] == "cursor").expect("a list route takes a cursor");
        cursor["schema"] = schema;
    }
    let wait_ms = max_wait.as_millis() as u64;
    let priority = json!({"minimum": i32::MIN, "maximum": i32::MAX});
    let priority_class =
        json!({"pattern": format!("^[a-z0-9-]{{1,{}}}$", allot_core::apps::priority::MAX_PRIORITY_CLASS_NAME)});
    let fields = [
        ("PutNamespace", "quota", range(0, MAX_UNITS)),
        ("Allocate", "units", range(1, MAX_UNITS)),
        ("Allocate", "ttl_ms", range(MIN_LEASE_MS, MAX_TTL_MS)),
        ("Allocate", "wait_ms", range(0, wait_ms)),
        ("Allocate", "session", json!({"pattern": SESSION_ID_PATTERN})),
        ("Caps", "project", range(0, MAX_UNITS)),
        ("Caps", "namespace", range(0, MAX_UNITS)),
        ("Scope", "project", name()),
        ("Scope", "namespace", name()),
        ("OpenSession", "ttl_ms", range(MIN_LEASE_MS, MAX_TTL_MS)),
        ("Keepalive", "fencing", range(0, MAX_UNITS)),
        ("AllocKeepalive", "interval_ms", json!({"minimum": 1})),
        ("StopIfIdle", "idle_ms", range(0, MAX_IDLE_MS)),
        ("PutPool", "capacity", resources(true)),
        ("PutPool", "occupied", resources(false)),
        ("Drain", "grace_ms", range(0, MAX_TIMEOUT_MS)),
        ("Accept", "min", resources(true)),
        ("Accept", "max", resources(false)),
        ("PutQueue", "guaranteed", resources(false)),
        ("PutQueue", "max", resources(false)),
        ("PutQueue", "user_max", resources(false)),
        ("PutQueue", "max_apps", range(0, MAX_UNITS)),
        ("PutQueue", "user_max_apps", range(0, MAX_UNITS)),
        ("PutQueue", "group_max", resources(false)),
        ("PutQueue", "group_max_apps", range(0, MAX_UNITS)),
        ("PutQueue", "submit_acl", json!({"pattern": allot_core::access::ACL_PATTERN})),
        ("PutQueue", "admin_acl", json!({"pattern": allot_core::access::ACL_PATTERN})),
        ("PutQueue", "borrow_limit", resources(false)),
        ("PutQueue", "lend_limit", resources(false)),
        ("PutQueue", "priority_offset", priority.clone()),
        ("PutQueue", "preemption_delay_ms", range(0, MAX_TIMEOUT_MS)),
        ("SubmitApp", "priority", priority.clone()),
        ("SubmitApp", "priority_class", priority_class.clone()),
        ("AddTask", "priority", priority.clone()),
        ("AddTask", "priority_class", priority_class.clone()),
        ("SubmitApp", "id", id()),
        ("SubmitApp", "queue", named_queue()),
        ("SubmitApp", "user", name()),
        ("SubmitApp", "user_groups", json!({"items": person(), "maxItems": MAX_USER_GROUPS})),
        ("SubmitApp", "task_groups", json!({"maxItems": MAX_GROUPS})),
        ("TaskGroup", "name", id()),
        ("TaskGroup", "min_members", range(1, u64::from(MAX_MEMBERS))),
        ("TaskGroup", "min_resources", resources(true)),
        ("SchedulingPolicy", "placeholder_timeout_ms", range(MIN_TIMEOUT_MS, MAX_TIMEOUT_MS)),
        ("SchedulingPolicy", "reserve_timeout_ms", range(MIN_TIMEOUT_MS, MAX_TIMEOUT_MS)),
        ("SchedulingPolicy", "max_parallelism", range(1, u64::from(u32::MAX))),
        ("TokenNeed", "namespace", namespace.clone()),
        ("TokenNeed", "units", range(1, MAX_UNITS)),
        ("CreateApiToken", "name", access_name()),
        ("CreateApiToken", "user", person()),
        ("CreateApiToken", "groups", json!({"items": person()})),
        ("CreateApiToken", "ttl_ms", range(1000, MAX_API_TOKEN_TTL_MS)),
        ("PutBinding", "users", json!({"items": person()})),
        ("PutBinding", "groups", json!({"items": person()})),
        (
            "PutPool",
            "plugins",
            json!({"maxItems": 64, "items": {"type": "string", "pattern": "^(\\*|[A-Za-z0-9._-]{1,100})$"}}),
        ),
        ("PutPool", "labels", json!({"propertyNames": {"not": {"const": "allot/plugins"}}})),
        ("AddTask", "id", id()),
        ("AddTask", "resources", resources(true)),
        ("AddTask", "group", json!({"pattern": ID_PATTERN})),
        ("AddTask", "retries", range(0, u64::from(MAX_RETRIES))),
        // What the executor reads of a task's spec, checked when the task is added.
        (
            "AddTask",
            "spec",
            json!({"properties": {"retries": {"type": "integer", "minimum": 0,
            "maximum": MAX_RETRIES, "description": "new attempts after user failures (retryable ones); the \
            daemon's default when absent"}}}),
        ),
    ];
    // A priority is a number or a class, not both.
    for schema in ["SubmitApp", "AddTask"] {
        doc["components"]["schemas"][schema]["allOf"] = json!([{"not": {"required": ["priority", "priority_class"],
            "properties": {"priority": {"type": "integer"}, "priority_class": {"type": "string"}}}}]);
    }
    // A grant's lease is its own TTL or its session's, not both; caps need a scope.
    let has_caps = json!({"type": "object", "anyOf": [
        {"required": ["project"], "properties": {"project": {"type": "integer"}}},
        {"required": ["namespace"], "properties": {"namespace": {"type": "integer"}}},
    ]});
    doc["components"]["schemas"]["Allocate"]["allOf"] = json!([
        {"not": {"required": ["ttl_ms", "session"],
            "properties": {"ttl_ms": {"type": "integer"}, "session": {"type": "string"}}}},
        {"not": {"required": ["caps"], "properties": {"caps": has_caps},
            "not": {"required": ["scope"], "properties": {"scope": {"type": "object"}}}}},
    ]);
    add_links(&mut doc);
    add_watch(&mut doc);
    for (schema, field, limits) in fields {
        let property = &mut doc["components"]["schemas"][schema]["properties"][field];
        assert!(property.is_object(), "the document has no {schema}.{field}");
        for (key, value) in limits.as_object().expect("limits are objects") {
            property[key] = value.clone();
        }
    }
    add_security(&mut doc);
    doc
}

/// The routes open to every caller: no token asked (`/readyz`, `/healthz`).
pub(crate) const OPEN_PATHS: [&str; 2] = ["/healthz", "/readyz"];

/// How a caller proves who it is, when the daemon checks (`[auth]`): an API token as a bearer
/// token, or a client certificate of the configured CA (HTTPS with `--tls-client-ca`). Every
/// operation needs one of the two but the open ones; generated clients send the token.
fn add_security(doc: &mut Value) {
    doc["components"]["securitySchemes"] = json!({
        "bearer": {"type": "http", "scheme": "bearer", "description": "An API token (`allot api-token make` or \
            `POST /v1/api-tokens`): `Authorization: Bearer allot_...`. Needed when the daemon has `[auth]`."},
        "mutualTLS": {"type": "mutualTLS", "description": "A client certificate signed by the daemon's client CA \
            (`--tls-client-ca`): its subject names the user. A bearer token wins when both are given."},
    });
    doc["security"] = json!([{"bearer": []}, {"mutualTLS": []}]);
    for path in OPEN_PATHS {
        for operation in doc["paths"][path].as_object_mut().into_iter().flat_map(|item| item.values_mut()) {
            operation["security"] = json!([]);
        }
    }
}

/// OpenAPI links: where the ids a response names can be used next (an application submitted,
/// then read, completed, removed...), so that generated clients (and schemathesis's stateful
/// tests) follow real ids instead of guessing them.
fn add_links(doc: &mut Value) {
    let app = json!({"app": "$response.body#/app/id"});
    let task = json!({"app": "$request.path.app", "task": "$response.body#/task/id"});
    let queue = json!({"queue": "$request.path.queue"});
    // (Not from an accepted alloc to its routes: schemathesis counts the documented 410 of an
    // ended alloc, read after a free in the same sequence, as a valid request refused.)
    let links: [(&str, &str, &[&str], Value); 3] = [
        // Reads and reports only: a creation such as adding a task may rightly answer 404 for
        // what it names (a task group, a namespace), which would read as the application lost.
        ("/v1/apps", "post", &["get_app", "list_tasks", "complete_app", "fail_app", "remove_app"], app),
        (
            "/v1/apps/{app}/tasks",
            "post",
            &["get_task", "start_task", "complete_task", "fail_task", "remove_task"],
            task,
        ),
        ("/v1/queues/{queue}", "put", &["get_queue", "remove_queue"], queue),
    ];
    for (path, method, targets, parameters) in links {
        let responses = &mut doc["paths"][path][method]["responses"];
        assert!(responses.is_object(), "the document has no {method} {path}");
        for status in ["200", "201"] {
            let response = &mut responses[status];
            if !response.is_object() {
                continue;
            }
            for target in targets {
                response["links"][*target] = json!({"operationId": target, "parameters": parameters});
            }
        }
    }
}

/// The change feed, exactly: the kinds a watch takes, the event as a union tagged by its kind (one
/// schema per family of kinds, whose object is that family's wire type), and the revision every
/// read reflects (`Allot-Revision`) on the answers of reads.
fn add_watch(doc: &mut Value) {
    let names: Vec<&str> = EventKind::ALL.iter().map(|kind| kind.name()).collect();
    let one = format!("({})", names.iter().map(|name| name.replace('.', "\\.")).collect::<Vec<_>>().join("|"));
    let parameters = doc["paths"]["/v1/watch"]["get"]["parameters"].as_array_mut().expect("the watch takes parameters");
    for parameter in parameters.iter_mut() {
        match parameter["name"].as_str() {
            Some("kind") => parameter["schema"]["items"]["pattern"] = json!(format!("^{one}(,{one})*$")),
            Some("Last-Event-ID") => parameter["schema"] = json!({"type": "integer", "format": "int64", "minimum": 0}),
            _ => {}
        }
    }

    let schemas = &mut doc["components"]["schemas"];
    let base = schemas["WatchEvent"].clone();
    assert!(base["properties"]["kind"].is_object(), "the document has no WatchEvent");
    let family = |kind: &str| kind.split_once('.').map_or(kind.to_owned(), |(family, _)| family.to_owned());
    for name in &names {
        assert!(
            allot_api::WatchObject::FAMILIES.iter().any(|(known, _)| *known == family(name)),
            "no wire type for the object of `{name}` (allot_api::WatchObject::FAMILIES)"
        );
    }
    let (mut variants, mut mapping) = (Vec::new(), serde_json::Map::new());
    for (family_name, object) in allot_api::WatchObject::FAMILIES {
        let kinds: Vec<&str> = names.iter().copied().filter(|name| family(name) == *family_name).collect();
        let mut capitalized = family_name.to_string();
        capitalized[..1].make_ascii_uppercase();
        let variant_name = format!("Watch{capitalized}Event");
        let reference = format!("#/components/schemas/{variant_name}");
        let mut variant = base.clone();
        variant["description"] = json!(format!(
            "A change of a {family_name} (`{family_name}.*`): its object is a {object}, or null for a removal \
             that carries no last state."
        ));
        variant["properties"]["kind"]["enum"] = json!(kinds);
        variant["properties"]["object"] =
            json!({"oneOf": [{"$ref": format!("#/components/schemas/{object}")}, {"type": "null"}]});
        for kind in &kinds {
            mapping.insert((*kind).to_owned(), json!(reference));
        }
        schemas[&variant_name] = variant;
        variants.push(json!({"$ref": reference}));
    }
    let description = format!(
        "{} A union tagged by `kind`: the kind's family (its name up to the `.`) says the object's type.",
        base["description"].as_str().unwrap_or_default()
    );
    schemas["WatchEvent"] = json!({"description": description, "oneOf": variants,
        "discriminator": {"propertyName": "kind", "mapping": mapping}});

    let header = json!({"Allot-Revision": {"required": true, "schema": {"type": "integer", "format": "int64", "minimum": 0},
        "description": "The revision this answer reflects (of a watch: the one it starts after). \
            `GET /v1/watch?since=<it>` then misses no change made after the read."}});
    let Some(paths) = doc["paths"].as_object_mut() else { return };
    for (path, item) in paths.iter_mut().filter(|(path, _)| path.starts_with("/v1/")) {
        // (`get_mut`: indexing would add a `get` to every path.)
        let get = item.get_mut("get").and_then(|get| get.get_mut("responses"));
        let Some(responses) = get.and_then(Value::as_object_mut) else { continue };
        for (status, response) in responses.iter_mut() {
            // A read's answers, and an ended alloc's record (410 Gone, but an answer of the read).
            let read = status.starts_with('2') || (status == "410" && path.contains("/allocs/"));
            if read {
                response["headers"] = header.clone();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_description_lists_every_error_code_in_its_second_paragraph() {
        let doc = crate::openapi(std::time::Duration::from_secs(300));
        let description = doc["info"]["description"].as_str().unwrap();
        let paragraphs: Vec<&str> = description.split("\n\n").collect();
        assert!(paragraphs[0].starts_with("A resource manager"), "{description}");
        assert!(paragraphs[1].starts_with("Every error answer has the body"), "{description}");
        assert!(paragraphs[2].starts_with("Names "), "{description}");
        for code in ErrorCode::ALL {
            assert!(
                paragraphs[1].contains(&format!(" {}", code.as_str())),
                "{code:?} is not listed: {}",
                paragraphs[1]
            );
        }
        assert!(
            paragraphs[1].contains("Watch: revision_compacted (410); watch_unsupported (501)."),
            "{}",
            paragraphs[1]
        );
        assert!(
            paragraphs[1].contains(" namespace_not_found, grant_not_found, session_not_found (404);"),
            "{}",
            paragraphs[1]
        );
    }

    #[test]
    fn every_operation_but_the_open_ones_asks_for_a_token_or_a_client_certificate() {
        let doc = crate::openapi(std::time::Duration::from_secs(300));
        let schemes = &doc["components"]["securitySchemes"];
        assert_eq!(
            (schemes["bearer"]["type"].as_str(), schemes["bearer"]["scheme"].as_str()),
            (Some("http"), Some("bearer"))
        );
        assert_eq!(schemes["mutualTLS"]["type"], "mutualTLS");
        assert_eq!(doc["security"], json!([{"bearer": []}, {"mutualTLS": []}]));
        let mut open = 0;
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, operation) in item.as_object().unwrap() {
                match OPEN_PATHS.contains(&path.as_str()) {
                    true => {
                        assert_eq!(operation["security"], json!([]), "{method} {path} is open");
                        open += 1;
                    }
                    false => assert!(operation.get("security").is_none(), "{method} {path} needs the document's"),
                }
            }
        }
        assert_eq!(open, OPEN_PATHS.len());
    }

    #[test]
    fn the_watch_event_is_a_union_tagged_by_kind_and_reads_say_their_revision() {
        let doc = crate::openapi(std::time::Duration::from_secs(300));
        let schemas = &doc["components"]["schemas"];
        let event = &schemas["WatchEvent"];
        let mapping = event["discriminator"]["mapping"].as_object().unwrap();
        assert_eq!(event["discriminator"]["propertyName"], "kind");
        assert_eq!(mapping.len(), EventKind::ALL.len());
        for kind in EventKind::ALL {
            let reference = mapping[kind.name()].as_str().unwrap();
            let variant = &schemas[reference.strip_prefix("#/components/schemas/").unwrap()];
            assert!(variant["properties"]["kind"]["enum"].as_array().unwrap().contains(&json!(kind.name())));
            assert!(event["oneOf"].as_array().unwrap().contains(&json!({"$ref": reference})));
        }
        let grant = &schemas["WatchGrantEvent"]["properties"]["object"]["oneOf"];
        assert_eq!(grant[0]["$ref"], "#/components/schemas/Grant");
        assert_eq!(
            schemas["WatchRunEvent"]["properties"]["object"]["oneOf"][0]["$ref"],
            "#/components/schemas/TaskRun"
        );
        assert!(schemas["WatchBehind"].is_object());
        let watch = &doc["paths"]["/v1/watch"]["get"];
        assert_eq!(
            watch["responses"]["200"]["content"]["text/event-stream"]["schema"]["$ref"],
            "#/components/schemas/WatchEvent"
        );
        assert!(watch["responses"]["410"].is_object() && watch["responses"]["501"].is_object());
        let kind = watch["parameters"].as_array().unwrap().iter().find(|p| p["name"] == "kind").unwrap();
        let pattern = regex::Regex::new(kind["schema"]["items"]["pattern"].as_str().unwrap()).unwrap();
        assert!(pattern.is_match("grant.granted") && pattern.is_match("grant.granted,pool.put"));
        assert!(!pattern.is_match("grant.nope") && !pattern.is_match("grantxgranted") && !pattern.is_match(""));
        for path in ["/v1/pools", "/v1/namespaces/{namespace}", "/v1/apps/{app}/tasks", "/v1/watch"] {
            let ok = &doc["paths"][path]["get"]["responses"]["200"];
            assert_eq!(ok["headers"]["Allot-Revision"]["required"], true, "{path}");
        }
        assert!(doc["paths"]["/v1/pools/{pool}/allocs/{alloc}"]["get"]["responses"]["410"]["headers"].is_object());
        assert!(doc["paths"]["/v1/pools/{pool}"]["put"]["responses"]["200"]["headers"].is_null());
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, operation) in item.as_object().unwrap() {
                assert!(operation["responses"].is_object(), "{method} {path} has no responses");
            }
        }
    }
}
