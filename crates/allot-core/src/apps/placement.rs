//! Placement rules (YuniKorn's): they choose an application's queue from the queue it names,
//! its user, its user's primary group, one of its tags, or a fixed name, in order, the first
//! that gives a usable queue winning.
//!
//! A rule gives a queue name; a name not under `root.` goes under what the rule's `parent` rule
//! gives (or `root`), one segment, its dots written `_dot_` and its letters lowered (queue
//! paths are `a-z0-9_-`). The queue must then be a leaf the user may submit to; a missing one
//! is usable only when the rule may `create` it (made, with its parents, when the application
//! is admitted). A rule whose filter leaves the user out gives nothing; nor does one whose
//! queue is unusable: the next rule is tried. Every decision here is a plain function of the
//! rules, the request and what the caller says of the queues.

use std::collections::BTreeMap;
use std::fmt;

use crate::apps::queues::{QueuePath, MAX_QUEUE_PATH, ROOT};

/// Why a rule could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("placement rule `{rule}`: {reason}")]
pub struct RuleError {
    pub rule: String,
    pub reason: String,
}

/// What a rule takes the queue name from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleKind {
    /// The queue the application names.
    Provided,
    /// The application's user.
    User,
    /// The first of the user's groups.
    PrimaryGroup,
    /// The value of the application's tag of this name.
    Tag(String),
    /// This queue.
    Fixed(String),
}

impl RuleKind {
    /// The name of the kind in a configuration.
    pub fn name(&self) -> &'static str {
        match self {
            RuleKind::Provided => "provided",
            RuleKind::User => "user",
            RuleKind::PrimaryGroup => "primary_group",
            RuleKind::Tag(_) => "tag",
            RuleKind::Fixed(_) => "fixed",
        }
    }
}

/// Users and groups, each given by name or by a regular expression matching the whole name.
#[derive(Debug, Clone, Default)]
struct Names {
    names: Vec<String>,
    patterns: Vec<regex::Regex>,
}

impl Names {
    fn new(entries: &[String], rule: &str) -> Result<Names, RuleError> {
        let mut names = Names::default();
        for entry in entries {
            if entry.chars().any(|c| "^$*+?()[]{}|\\".contains(c)) {
                let pattern = regex::Regex::new(&format!("^(?:{entry})$")).map_err(|err| RuleError {
                    rule: rule.to_owned(),
                    reason: format!("the filter's `{entry}` is not a regular expression: {err}"),
                })?;
                names.patterns.push(pattern);
            } else {
                names.names.push(entry.clone());
            }
        }
        Ok(names)
    }

    fn is_empty(&self) -> bool {
        self.names.is_empty() && self.patterns.is_empty()
    }

    fn matches(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name) || self.patterns.iter().any(|p| p.is_match(name))
    }
}

/// Whom a rule applies to: with `allow`, the users listed and the members of the groups
/// listed; with `deny`, everyone else. A filter that lists no one applies to everyone.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    deny: bool,
    users: Names,
    groups: Names,
}

impl Filter {
    /// A filter of users and groups, each a name or (with any of `^$*+?()[]{}|\`) a regular
    /// expression that matches whole names.
    pub fn new(deny: bool, users: &[String], groups: &[String], rule: &str) -> Result<Filter, RuleError> {
        Ok(Filter { deny, users: Names::new(users, rule)?, groups: Names::new(groups, rule)? })
    }

    fn lets_in(&self, user: &str, groups: &[String]) -> bool {
        if self.users.is_empty() && self.groups.is_empty() {
            return true;
        }
        let listed = self.users.matches(user) || groups.iter().any(|g| self.groups.matches(g));
        listed != self.deny
    }
}

/// One placement rule.
#[derive(Debug, Clone)]
pub struct PlacementRule {
    kind: RuleKind,
    create: bool,
    parent: Option<Box<PlacementRule>>,
    filter: Filter,
}

impl PlacementRule {
    /// A rule; a `fixed` queue and a `tag` name are checked here.
    pub fn new(
        kind: RuleKind,
        create: bool,
        parent: Option<PlacementRule>,
        filter: Filter,
    ) -> Result<PlacementRule, RuleError> {
        let bad = |reason: String| RuleError { rule: kind.name().to_owned(), reason };
        match &kind {
            RuleKind::Tag(tag) if tag.is_empty() => return Err(bad("`value` names the tag; it is empty".to_owned())),
            RuleKind::Fixed(queue) => {
                let valid = match qualified(queue) {
                    true => QueuePath::new(queue).is_ok(),
                    false => QueuePath::new(&format!("{ROOT}.{queue}")).is_ok(),
                };
                if !valid {
                    return Err(bad(format!(
                        "`{queue}` is not a queue: a path under `root` of `.`-separated segments of a-z, 0-9, `_` \
                         and `-`"
                    )));
                }
            }
            _ => {}
        }
        Ok(PlacementRule { kind, create, parent: parent.map(Box::new), filter })
    }

    pub fn kind(&self) -> &RuleKind {
        &self.kind
    }

    /// The queue the rule gives for `request`, or why it gives none.
    fn queue_for(
        &self,
        request: &Request<'_>,
        queues: &dyn Fn(&QueuePath) -> Option<Spot>,
    ) -> Result<QueuePath, String> {
        if !self.filter.lets_in(request.user, request.groups) {
            return Err(format!("its filter leaves user `{}` out", request.user));
        }
        let name = match &self.kind {
            RuleKind::Provided => request.queue.ok_or("the application names no queue")?.to_owned(),
            RuleKind::User => segment(request.user).ok_or_else(|| not_a_segment("user", request.user))?,
            RuleKind::PrimaryGroup => {
                let group = request.groups.first().ok_or_else(|| format!("user `{}` has no group", request.user))?;
                segment(group).ok_or_else(|| not_a_segment("group", group))?
            }
            RuleKind::Tag(tag) => {
                let value = request.tags.get(tag).ok_or_else(|| format!("the application has no tag `{tag}`"))?;
                match qualified(value) {
                    true => value.clone(),
                    false => segment(value).ok_or_else(|| not_a_segment(&format!("tag `{tag}`'s value"), value))?,
                }
            }
            RuleKind::Fixed(queue) => queue.clone(),
        };
        let path = if qualified(&name) {
            name
        } else {
            // Under the parent rule's queue, which must exist unless that rule may create it.
            let parent = match &self.parent {
                Some(parent) => {
                    let queue = parent.queue_for(request, queues).map_err(|why| format!("its parent rule: {why}"))?;
                    if queues(&queue).is_none() && !parent.create {
                        return Err(format!("its parent rule gives queue `{queue}`, which does not exist"));
                    }
                    queue.to_string()
                }
                None => ROOT.to_owned(),
            };
            let name = match self.kind {
                RuleKind::Provided => segment(&name).ok_or_else(|| not_a_segment("queue", &name))?,
                _ => name,
            };
            format!("{parent}.{name}")
        };
        if path.len() > MAX_QUEUE_PATH {
            return Err(format!("queue `{path}` would be longer than {MAX_QUEUE_PATH} bytes"));
        }
        QueuePath::new(&path).map_err(|err| err.to_string())
    }
}

impl fmt::Display for PlacementRule {
    /// `user`, `tag namespace`, `fixed root.default`, then ` (create)` and ` under <parent>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind.name())?;
        match &self.kind {
            RuleKind::Tag(value) | RuleKind::Fixed(value) => write!(f, " {value}")?,
            _ => {}
        }
        if self.create {
            f.write_str(" (create)")?;
        }
        if let Some(parent) = &self.parent {
            write!(f, " under {parent}")?;
        }
        Ok(())
    }
}

/// A name under `root.` is taken as a whole queue path; another is one segment under a parent.
fn qualified(name: &str) -> bool {
    name == ROOT || name.starts_with("root.")
}

/// `name` as one queue path segment: lowered, dots written `_dot_` [YuniKorn `replaceDot`];
/// none when it has a character a queue path cannot.
fn segment(name: &str) -> Option<String> {
    let segment = name.to_lowercase().replace('.', "_dot_");
    let valid = !segment.is_empty()
        && segment.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    valid.then_some(segment)
}

fn not_a_segment(what: &str, name: &str) -> String {
    format!("{what} `{name}` cannot name a queue (a-z, 0-9, `_`, `-` and `.` only, letters lowered)")
}

/// What a placement knows of an application.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The queue it names, if any: a path under `root.` or one name.
    pub queue: Option<&'a str>,
    pub user: &'a str,
    /// The user's groups, the primary one first.
    pub groups: &'a [String],
    pub tags: &'a BTreeMap<String, String>,
}

/// What a placement needs to know of an existing queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spot {
    pub leaf: bool,
}

/// Where an application goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub queue: QueuePath,
    /// The rule that chose it, as written by its `Display`.
    pub rule: String,
    /// The queue is missing and the rule makes it.
    pub create: bool,
}

/// No rule gave a usable queue: each rule, and why not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no placement rule placed the application: {}", .reasons.iter().map(|(rule, why)| format!("`{rule}`: {why}")).collect::<Vec<_>>().join("; "))]
pub struct NotPlaced {
    pub reasons: Vec<(String, String)>,
}

/// The rules, in the order they are tried.
#[derive(Debug, Clone, Default)]
pub struct PlacementRules(Vec<PlacementRule>);

impl PlacementRules {
    pub fn new(rules: Vec<PlacementRule>) -> PlacementRules {
        PlacementRules(rules)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &PlacementRule> {
        self.0.iter()
    }

    /// The first rule's usable queue for `request`. `queues` says what exists; `may_submit`
    /// whether the user may submit to a queue (existing or to be made).
    pub fn place(
        &self,
        request: &Request<'_>,
        queues: &dyn Fn(&QueuePath) -> Option<Spot>,
        may_submit: &dyn Fn(&QueuePath) -> bool,
    ) -> Result<Placed, NotPlaced> {
        let mut reasons = Vec::new();
        for rule in &self.0 {
            let why = match rule.queue_for(request, queues) {
                Err(why) => why,
                Ok(queue) => match queues(&queue) {
                    Some(Spot { leaf: false }) => format!("queue `{queue}` has child queues"),
                    None if !rule.create => format!("queue `{queue}` does not exist and the rule does not create it"),
                    _ if !may_submit(&queue) => format!("user `{}` may not submit to queue `{queue}`", request.user),
                    spot => return Ok(Placed { create: spot.is_none(), queue, rule: rule.to_string() }),
                },
            };
            reasons.push((rule.to_string(), why));
        }
        Err(NotPlaced { reasons })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn q(path: &str) -> QueuePath {
        QueuePath::new(path).unwrap()
    }

    fn rule(kind: RuleKind) -> PlacementRule {
        PlacementRule::new(kind, false, None, Filter::default()).unwrap()
    }

    fn creating(kind: RuleKind, parent: Option<PlacementRule>) -> PlacementRule {
        PlacementRule::new(kind, true, parent, Filter::default()).unwrap()
    }

    struct World {
        queues: BTreeSet<&'static str>,
        parents: BTreeSet<&'static str>,
        closed: BTreeSet<&'static str>,
    }

    impl World {
        fn place(&self, rules: &[PlacementRule], request: Request<'_>) -> Result<Placed, NotPlaced> {
            let queues = |q: &QueuePath| {
                self.queues.contains(q.as_str()).then(|| Spot { leaf: !self.parents.contains(q.as_str()) })
            };
            let may = |q: &QueuePath| !self.closed.contains(q.as_str());
            PlacementRules::new(rules.to_vec()).place(&request, &queues, &may)
        }
    }

    fn world() -> World {
        World {
            queues: BTreeSet::from([
                "root",
                "root.default",
                "root.users",
                "root.users.ann",
                "root.sales",
                "root.locked",
            ]),
            parents: BTreeSet::from(["root", "root.users"]),
            closed: BTreeSet::from(["root.locked"]),
        }
    }

    fn request<'a>(
        queue: Option<&'a str>,
        user: &'a str,
        groups: &'a [String],
        tags: &'a BTreeMap<String, String>,
    ) -> Request<'a> {
        Request { queue, user, groups, tags }
    }

    #[test]
    fn the_first_rule_with_a_usable_queue_places_the_application() {
        let world = world();
        let (none, tags) = (Vec::new(), BTreeMap::new());
        let rules = [
            rule(RuleKind::Provided),
            PlacementRule::new(
                RuleKind::User,
                false,
                Some(rule(RuleKind::Fixed("root.users".into()))),
                Filter::default(),
            )
            .unwrap(),
            rule(RuleKind::Fixed("root.default".into())),
        ];
        // Named and usable: the provided rule.
        let placed = world.place(&rules, request(Some("root.sales"), "bob", &none, &tags)).unwrap();
        assert_eq!((placed.queue, placed.rule.as_str(), placed.create), (q("root.sales"), "provided", false));
        // One name is a queue under root.
        assert_eq!(world.place(&rules, request(Some("sales"), "bob", &none, &tags)).unwrap().queue, q("root.sales"));
        // Named but closed to the user: the user's queue.
        let placed = world.place(&rules, request(Some("root.locked"), "ann", &none, &tags)).unwrap();
        assert_eq!((placed.queue, placed.rule.as_str()), (q("root.users.ann"), "user under fixed root.users"));
        // Named none, no queue of the user's: the fixed fallback.
        let placed = world.place(&rules, request(None, "bob", &none, &tags)).unwrap();
        assert_eq!(placed.queue, q("root.default"));
        // Nothing usable: every rule says why.
        let err = world.place(&rules[..2], request(Some("root.users"), "bob", &none, &tags)).unwrap_err();
        assert_eq!(
            err.reasons,
            [
                ("provided".to_owned(), "queue `root.users` has child queues".to_owned()),
                (
                    "user under fixed root.users".to_owned(),
                    "queue `root.users.bob` does not exist and the rule does not create it".to_owned()
                ),
            ]
        );
    }

    #[test]
    fn create_makes_the_queue_and_names_are_made_queue_segments() {
        let world = world();
        let tags = BTreeMap::from([
            ("namespace".to_owned(), "Team.A".to_owned()),
            ("qualified".to_owned(), "root.sales".to_owned()),
        ]);
        let groups = vec!["Data.Eng".to_owned(), "ops".to_owned()];
        let users = creating(RuleKind::User, Some(rule(RuleKind::Fixed("root.users".into()))));
        let placed = world.place(&[users], request(None, "Bob.Smith", &groups, &tags)).unwrap();
        assert_eq!((placed.queue, placed.create), (q("root.users.bob_dot_smith"), true));
        assert_eq!(placed.rule, "user (create) under fixed root.users");
        let placed =
            world.place(&[creating(RuleKind::PrimaryGroup, None)], request(None, "bob", &groups, &tags)).unwrap();
        assert_eq!(placed.queue, q("root.data_dot_eng"));
        let placed = world
            .place(&[creating(RuleKind::Tag("namespace".into()), None)], request(None, "bob", &groups, &tags))
            .unwrap();
        assert_eq!(placed.queue, q("root.team_dot_a"));
        // A tag's value under root. is a whole path: the parent rule is not asked.
        let tag = creating(RuleKind::Tag("qualified".into()), Some(rule(RuleKind::Fixed("root.nope".into()))));
        assert_eq!(world.place(&[tag], request(None, "bob", &groups, &tags)).unwrap().queue, q("root.sales"));
        // A name that cannot be a segment: the rule gives nothing.
        let err =
            world.place(&[creating(RuleKind::User, None)], request(None, "ann@corp", &groups, &tags)).unwrap_err();
        assert!(err.reasons[0].1.contains("cannot name a queue"), "{err}");
        // A parent that does not exist and is not made: nothing.
        let under_missing = creating(RuleKind::User, Some(rule(RuleKind::Fixed("root.nope".into()))));
        let err = world.place(&[under_missing], request(None, "bob", &groups, &tags)).unwrap_err();
        assert!(err.reasons[0].1.contains("`root.nope`, which does not exist"), "{err}");
        // ... unless the parent rule creates it too.
        let parent = creating(RuleKind::Fixed("root.nope".into()), None);
        let both = creating(RuleKind::User, Some(parent));
        assert_eq!(world.place(&[both], request(None, "bob", &groups, &tags)).unwrap().queue, q("root.nope.bob"));
        // A queue the user may not submit to is not made either.
        let err =
            world.place(&[creating(RuleKind::Fixed("root.locked".into()), None)], request(None, "bob", &groups, &tags));
        assert!(err.unwrap_err().reasons[0].1.contains("may not submit"));
    }

    #[test]
    fn filters_let_in_or_leave_out_users_and_groups_by_name_or_expression() {
        let world = world();
        let tags = BTreeMap::new();
        let (data, none) = (vec!["data".to_owned()], Vec::new());
        let only = |deny: bool, users: &[&str], groups: &[&str]| {
            let owned = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
            let filter = Filter::new(deny, &owned(users), &owned(groups), "fixed").unwrap();
            PlacementRule::new(RuleKind::Fixed("root.sales".into()), false, None, filter).unwrap()
        };
        let placed = |rule: PlacementRule, user: &str, groups: &[String]| {
            world.place(&[rule], request(None, user, groups, &tags)).is_ok()
        };
        assert!(placed(only(false, &["ann"], &[]), "ann", &none));
        assert!(!placed(only(false, &["ann"], &[]), "bob", &none));
        assert!(placed(only(false, &[], &["data"]), "bob", &data));
        assert!(placed(only(false, &["a.*"], &[]), "alice", &none), "an expression matches whole names");
        assert!(!placed(only(false, &["a.*"], &[]), "bart", &none));
        assert!(!placed(only(true, &["ann"], &["data"]), "bob", &data), "deny leaves the listed out");
        assert!(placed(only(true, &["ann"], &["data"]), "bob", &none));
        assert!(placed(only(true, &[], &[]), "bob", &none), "a filter listing no one is no filter");
        let err = Filter::new(false, &["(".to_owned()], &[], "user").unwrap_err();
        assert!(err.to_string().contains("is not a regular expression"), "{err}");
    }

    #[test]
    fn a_fixed_queue_and_a_tag_are_checked_when_the_rule_is_made() {
        assert!(PlacementRule::new(RuleKind::Fixed("root.a.b".into()), false, None, Filter::default()).is_ok());
        assert!(PlacementRule::new(RuleKind::Fixed("a".into()), false, None, Filter::default()).is_ok());
        for bad in ["root.A", "a b", "root..a", ""] {
            assert!(PlacementRule::new(RuleKind::Fixed(bad.into()), false, None, Filter::default()).is_err(), "{bad}");
        }
        assert!(PlacementRule::new(RuleKind::Tag(String::new()), false, None, Filter::default()).is_err());
    }
}
