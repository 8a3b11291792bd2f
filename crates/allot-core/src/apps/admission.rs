//! The access rules an application passes at the door: whom it runs as, which queue it may go to
//! (roles, YuniKorn's queue ACLs up the tree, the placement rules), which token namespaces it may
//! name, and who may end it. Plain functions of the policy, the caller, the queue tree and the
//! placement rules; the server, the directory source of applications and the scheduler's
//! [`crate::access::Tenancy`] (the check at every placement) rest on the same policy.
//!
//! Invariants:
//! - the one judged is the application's user with its groups: the caller itself, or the user a
//!   caller with `impersonate` on the queue names (YuniKorn's shim submitting for its users);
//! - a caller that is the queue's admin by its roles is never held back by queue ACLs (an
//!   operator cannot lock itself out);
//! - without a caller (access not configured, or a trusted source) nothing is refused for
//!   access; the placement rules still choose a queue for an application that names none.

use crate::access::{in_queue_tree, Denied, Permission, Policy, Principal, Resource};
use crate::apps::placement::{PlacementRules, Request, Spot};
use crate::apps::queues::{QueueError, QueuePath, Queues};
use crate::apps::spec::{AppSpec, QueueRule};

/// Who calls, under which policy. The functions here take `Option<Caller>`: `None` is a trusted
/// caller (access not configured, or the directory source).
#[derive(Debug, Clone, Copy)]
pub struct Caller<'a> {
    pub principal: &'a Principal,
    pub policy: &'a Policy,
}

/// Why the door refuses an application, or a change of it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The caller or the application's user lacks a permission or is not in a queue's ACL.
    #[error("{0}")]
    Forbidden(String),
    /// Nothing places the application: no queue named and no rule, or no rule gives a usable one.
    #[error("{0}")]
    NoUsableQueue(String),
    /// The queue named has child queues, and no rule gives another.
    #[error("{0}")]
    NotALeaf(String),
    #[error(transparent)]
    Queue(#[from] QueueError),
}

impl From<Denied> for Refused {
    fn from(denied: Denied) -> Refused {
        Refused::Forbidden(denied.to_string())
    }
}

/// The queue ACL a call needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AclNeed {
    /// Submitting: the `submit_acl` or the `admin_acl` of the queue or a queue above it.
    Submit,
    /// Changing or removing the queue, or ending another user's application in it: the
    /// `admin_acl` of the queue or a queue above it.
    Admin,
}

/// Whom an application runs as: the user and groups it names, or the caller's when it names the
/// default user (`default_user`) or no groups for the caller's own user. Answers the principal
/// and whether that is someone else than the caller (which needs `impersonate`).
pub fn run_as(caller: &Principal, user: &str, groups: &[String], default_user: &str) -> (Principal, bool) {
    let user = if user == default_user { caller.user.clone() } else { user.to_owned() };
    let groups = if user == caller.user && groups.is_empty() { caller.groups.clone() } else { groups.to_vec() };
    let impersonating = user != caller.user || groups != caller.groups;
    (Principal { user, groups }, impersonating)
}

/// Why the queue ACLs on `path` and the queues above it refuse `subject` [YuniKorn's `submitacl`
/// and `adminacl`, checked up the tree]; none when they let it in, when no queue on the way has
/// an ACL of the kind (roles alone decide), or when its roles make it the queue's admin.
pub fn acl_refusal(
    queues: &Queues,
    policy: &Policy,
    subject: &Principal,
    path: &QueuePath,
    needed: AclNeed,
) -> Option<String> {
    if policy.allows(subject, Permission::Admin, &Resource::Queue(path.to_string())) {
        return None;
    }
    let mut lists = Vec::new();
    for (_, limits) in queues.iter().filter(|(queue, _)| in_queue_tree(path.as_str(), queue.as_str())) {
        if needed == AclNeed::Submit {
            lists.extend(limits.submit_acl.iter());
        }
        lists.extend(limits.admin_acl.iter());
    }
    if lists.is_empty() || lists.iter().any(|acl| acl.allows(subject)) {
        return None;
    }
    let which = if needed == AclNeed::Submit { "submit_acl or admin_acl" } else { "admin_acl" };
    Some(format!("{subject} is not in the {which} of queue `{path}` or of a queue above it"))
}

/// Why `caller` may not change or remove queue `path` (or end another user's application in
/// it): it needs `admin` on it by its roles, or `use` on it and a place in an `admin_acl` of it
/// or of a queue above it.
pub fn queue_admin_refusal(caller: Caller<'_>, queues: &Queues, path: &QueuePath) -> Option<String> {
    let resource = Resource::Queue(path.to_string());
    let Err(denied) = caller.policy.check(caller.principal, Permission::Admin, resource.clone()) else {
        return None;
    };
    let acls: Vec<_> = queues
        .iter()
        .filter(|(queue, _)| in_queue_tree(path.as_str(), queue.as_str()))
        .filter_map(|(_, limits)| limits.admin_acl.as_ref())
        .collect();
    let in_acl = acls.iter().any(|acl| acl.allows(caller.principal));
    if in_acl && caller.policy.allows(caller.principal, Permission::Use, &resource) {
        return None;
    }
    Some(denied.to_string())
}

/// Why `subject`'s application may not go to `path`, submitted by `caller`: the subject needs
/// `use` on it and a place in its ACLs; a caller that submits for someone else needs
/// `impersonate` on it. None: it may.
pub fn submit_refusal(caller: Caller<'_>, subject: &Principal, queues: &Queues, path: &QueuePath) -> Option<String> {
    let resource = Resource::Queue(path.to_string());
    if subject != caller.principal {
        if let Err(denied) = caller.policy.check(caller.principal, Permission::Impersonate, resource.clone()) {
            return Some(denied.to_string());
        }
    }
    if let Err(denied) = caller.policy.check(subject, Permission::Use, resource) {
        return Some(denied.to_string());
    }
    acl_refusal(queues, caller.policy, subject, path, AclNeed::Submit)
}

/// What a submission says of itself, as the door reads it (the user and groups already the ones
/// it runs as: [`run_as`]).
#[derive(Debug, Clone, Copy)]
pub struct Submission<'a> {
    pub app: &'a str,
    /// The queue it names, if any: a path, or one name (a queue under `root`).
    pub queue: Option<&'a str>,
    pub request: Request<'a>,
}

/// The queue an application goes to, and the placement rule that chose it (none when it named
/// one and that was taken as is).
///
/// Without rules the application names its queue, taken as is once the caller may use it (a
/// queue that does not exist is the store's to refuse). With rules, a named leaf the user may
/// use wins; otherwise the first rule that gives a usable queue.
pub fn choose_queue(
    caller: Option<Caller<'_>>,
    rules: &PlacementRules,
    queues: &Queues,
    submission: &Submission<'_>,
) -> Result<(QueuePath, Option<QueueRule>), Refused> {
    let subject = Principal { user: submission.request.user.to_owned(), groups: submission.request.groups.to_vec() };
    if let Some(caller) = caller.filter(|c| !c.policy.touches(c.principal, Permission::Use, crate::access::Kind::Queue))
    {
        return Err(Refused::Forbidden(format!(
            "{} may not do this: it needs `use` on a queue to submit to, and holds it on none",
            caller.principal
        )));
    }
    if let Some(caller) = caller.filter(|caller| *caller.principal != subject) {
        if !caller.policy.touches(caller.principal, Permission::Impersonate, crate::access::Kind::Queue) {
            return Err(Refused::Forbidden(format!(
                "{} may not submit for {subject} with groups [{}]: that needs `impersonate` on the queue",
                caller.principal,
                subject.groups.join(", ")
            )));
        }
    }
    let refusal = |path: &QueuePath| caller.and_then(|caller| submit_refusal(caller, &subject, queues, path));
    let named = submission.queue.map(QueuePath::named).transpose()?;
    let spot = |path: &QueuePath| queues.get(path).map(|_| Spot { leaf: queues.children(path).next().is_none() });
    if rules.is_empty() {
        let queue = named.ok_or_else(|| {
            Refused::NoUsableQueue(format!(
                "application `{}` names no queue (`queue`), and no placement rules are configured to choose one",
                submission.app
            ))
        })?;
        return match refusal(&queue) {
            Some(why) => Err(Refused::Forbidden(why)),
            None => Ok((queue, None)),
        };
    }
    if let Some(named) = named.as_ref().filter(|q| spot(q) == Some(Spot { leaf: true }) && refusal(q).is_none()) {
        return Ok((named.clone(), None));
    }
    let usable = |path: &QueuePath| refusal(path).is_none();
    match rules.place(&submission.request, &spot, &usable) {
        Ok(placed) => Ok((placed.queue, Some(QueueRule { rule: placed.rule, create: placed.create }))),
        // The queue it named exists and is refused to the user, and no rule helps: a refusal.
        Err(not_placed) => match named.as_ref().and_then(|q| Some((q, spot(q)?))) {
            Some((named, Spot { leaf: true })) => {
                let rules = lowered(&not_placed.to_string());
                let why = refusal(named).unwrap_or_else(|| format!("{subject} may not submit to `{named}`"));
                Err(Refused::Forbidden(format!("{why}; and {rules}")))
            }
            Some((named, Spot { leaf: false })) => Err(Refused::NotALeaf(format!(
                "queue `{named}` has child queues: applications go to leaf queues only, and {}",
                lowered(&not_placed.to_string())
            ))),
            None => Err(Refused::NoUsableQueue(format!(
                "application `{}` of user `{}`: {not_placed}",
                submission.app, subject.user
            ))),
        },
    }
}

fn lowered(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map(|c| c.to_lowercase().chain(chars).collect()).unwrap_or_default()
}

/// Refuses token needs in a namespace the application's user may not use (named in the
/// refusal). The scheduler checks again at every placement.
pub fn check_namespaces<'n>(
    caller: Option<Caller<'_>>,
    subject: &Principal,
    namespaces: impl IntoIterator<Item = &'n crate::names::NamespaceName>,
) -> Result<(), Refused> {
    let Some(caller) = caller else { return Ok(()) };
    for namespace in namespaces {
        caller.policy.check(subject, Permission::Use, Resource::Namespace(namespace.to_string()))?;
    }
    Ok(())
}

/// What a caller does to an existing application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppAction {
    /// Complete, fail or remove it, or remove one of its tasks.
    End,
    /// Add a task to it (the task runs as the application's user).
    AddTask,
}

/// Why `caller` may not do `action` to `app`: its own user may, with `use` on its queue; anyone
/// else needs `admin` on the queue (its roles, or the queue's `admin_acl` with `use`), and adding
/// a task for another user is also allowed to a caller with `impersonate` on the queue.
pub fn app_refusal(caller: Option<Caller<'_>>, queues: &Queues, app: &AppSpec, action: AppAction) -> Option<String> {
    let caller = caller?;
    let queue = Resource::Queue(app.queue.to_string());
    if caller.principal.user == app.user {
        return caller.policy.check(caller.principal, Permission::Use, queue).err().map(|d| d.to_string());
    }
    if action == AppAction::AddTask && caller.policy.allows(caller.principal, Permission::Impersonate, &queue) {
        return None;
    }
    let why = queue_admin_refusal(caller, queues, &app.queue)?;
    let what = match action {
        AppAction::End => "end",
        AppAction::AddTask => "add tasks to",
    };
    Some(format!(
        "{} may not {what} application `{}` of user `{}`: that needs `admin` on queue `{}` (or a place in its \
         admin_acl); {}",
        caller.principal,
        app.id,
        app.user,
        app.queue,
        lowered(&why)
    ))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::access::{Acl, Binding, Pattern, Role};
    use crate::apps::queues::QueueLimits;

    fn policy() -> Policy {
        let role = |grants: &[(Permission, &str)]| Role {
            grants: grants.iter().map(|(p, t)| (*p, Pattern::parse(t).unwrap())).collect(),
        };
        let roles = [
            ("a".to_owned(), role(&[(Permission::Use, "namespace:team-a:*"), (Permission::Use, "queue:root.team-a")])),
            ("b".to_owned(), role(&[(Permission::Use, "queue:root.team-b")])),
            (
                "shim".to_owned(),
                role(&[(Permission::Use, "queue:root"), (Permission::Impersonate, "queue:root.team-a")]),
            ),
        ];
        let bind = |role: &str, group: &str| Binding { role: role.into(), users: vec![], groups: vec![group.into()] };
        Policy::new(BTreeMap::from(roles), vec![bind("a", "team-a"), bind("b", "team-b"), bind("shim", "shims")])
            .unwrap()
    }

    fn queues() -> Queues {
        let mut queues = Queues::new();
        for path in ["root", "root.team-a", "root.team-b"] {
            queues.put(QueuePath::new(path).unwrap(), QueueLimits::default());
        }
        let acl = QueueLimits { submit_acl: Some(Acl::parse("carol").unwrap()), ..QueueLimits::default() };
        queues.put(QueuePath::new("root.team-b").unwrap(), acl);
        queues
    }

    fn submission<'a>(
        queue: &'a str,
        user: &'a str,
        groups: &'a [String],
        tags: &'a BTreeMap<String, String>,
    ) -> Submission<'a> {
        Submission { app: "x", queue: Some(queue), request: Request { queue: Some(queue), user, groups, tags } }
    }

    #[test]
    fn the_user_judged_is_the_one_the_application_runs_as() {
        let policy = policy();
        let (alice, shim) = (Principal::new("alice", ["team-a"]), Principal::new("k8s", ["shims"]));
        let (as_alice, impersonating) = run_as(&alice, "default", &[], "default");
        assert!(!impersonating && as_alice == alice);
        let (as_bob, impersonating) = run_as(&shim, "bob", &["team-b".to_owned()], "default");
        assert!(impersonating && as_bob.user == "bob");
        let tags = BTreeMap::new();
        let rules = PlacementRules::default();
        let caller = |principal| Some(Caller { principal, policy: &policy });
        let groups = alice.groups.clone();
        assert!(choose_queue(caller(&alice), &rules, &queues(), &submission("root.team-a", "alice", &groups, &tags))
            .is_ok());
        let refused =
            choose_queue(caller(&alice), &rules, &queues(), &submission("root.team-b", "alice", &groups, &tags));
        assert!(
            matches!(&refused, Err(Refused::Forbidden(why)) if why.contains("`use` on queue `root.team-b`")),
            "{refused:?}"
        );
        // The shim may impersonate in team-a only, and the user it names must be able to use it.
        let bob_groups = vec!["team-b".to_owned()];
        let refused =
            choose_queue(caller(&shim), &rules, &queues(), &submission("root.team-b", "bob", &bob_groups, &tags));
        assert!(matches!(&refused, Err(Refused::Forbidden(why)) if why.contains("`impersonate`")), "{refused:?}");
        let refused =
            choose_queue(caller(&shim), &rules, &queues(), &submission("root.team-a", "bob", &bob_groups, &tags));
        assert!(matches!(&refused, Err(Refused::Forbidden(why)) if why.contains("user `bob`")), "{refused:?}");
        // A queue ACL is checked against the application's user, and names it.
        let dave = Principal::new("dave", ["team-b"]);
        let refused =
            choose_queue(caller(&dave), &rules, &queues(), &submission("root.team-b", "dave", &dave.groups, &tags));
        assert!(
            matches!(&refused, Err(Refused::Forbidden(why)) if why.contains("user `dave` is not in the submit_acl"))
        );
        assert!(choose_queue(None, &rules, &queues(), &submission("root.team-b", "dave", &dave.groups, &tags)).is_ok());
    }

    #[test]
    fn namespaces_and_ending_follow_the_applications_user() {
        let policy = policy();
        let alice = Principal::new("alice", ["team-a"]);
        let caller = Some(Caller { principal: &alice, policy: &policy });
        let ns = |n: &str| crate::names::NamespaceName::new(n).unwrap();
        assert!(check_namespaces(caller, &alice, [&ns("team-a:db")]).is_ok());
        let refused = check_namespaces(caller, &alice, [&ns("team-a:db"), &ns("team-b:db")]).unwrap_err();
        assert!(refused.to_string().contains("namespace `team-b:db`"), "{refused}");
        assert!(check_namespaces(None, &alice, [&ns("team-b:db")]).is_ok());
        let app = AppSpec {
            id: crate::apps::AppId::new("job").unwrap(),
            queue: QueuePath::new("root.team-a").unwrap(),
            user: "alice".into(),
            user_groups: vec!["team-a".into()],
            tags: BTreeMap::new(),
            groups: vec![],
            policy: Default::default(),
            queue_rule: None,
            priority: Default::default(),
        };
        assert_eq!(app_refusal(caller, &queues(), &app, AppAction::End), None);
        let ann = Principal::new("ann", ["team-a"]);
        let other = Some(Caller { principal: &ann, policy: &policy });
        let why = app_refusal(other, &queues(), &app, AppAction::End).unwrap();
        assert!(why.contains("needs `admin` on queue `root.team-a`"), "{why}");
        let shim = Principal::new("k8s", ["shims"]);
        let shim = Some(Caller { principal: &shim, policy: &policy });
        assert_eq!(app_refusal(shim, &queues(), &app, AppAction::AddTask), None);
        assert!(app_refusal(shim, &queues(), &app, AppAction::End).is_some());
        let mut admin_acl = queues();
        let limits = QueueLimits { admin_acl: Some(Acl::parse("ann").unwrap()), ..QueueLimits::default() };
        admin_acl.put(QueuePath::new("root.team-a").unwrap(), limits);
        assert_eq!(app_refusal(other, &admin_acl, &app, AppAction::End), None, "the queue's admin_acl lets ann end it");
    }
}
