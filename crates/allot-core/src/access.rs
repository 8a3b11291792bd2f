//! Who may do what: the authenticated [`Principal`] (a user and its groups), the
//! [`Permission`]s a call needs over a [`Resource`], and the [`Policy`] that decides: roles grant
//! permissions over patterns of resources, and bindings give roles to users and groups.
//!
//! Invariants: a principal may do only what a role bound to its user or one of its groups grants
//! (nothing is allowed by default); `admin` includes `use`, and `use` includes `read`;
//! `impersonate` is granted only by itself. A decision is a plain function of the policy, the
//! principal, the permission and the resource.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use sha2::{Digest as _, Sha256};

/// What an API token starts with, so that a token in a file or a log is recognised as one.
pub const TOKEN_PREFIX: &str = "allot_";

/// The API token of a 32-byte secret (which the caller draws from the operating system's random
/// source): the prefix and the secret in hex.
pub fn token_of_secret(secret: &[u8; 32]) -> String {
    format!("{TOKEN_PREFIX}{}", hex(secret))
}

/// How a token is kept: `sha256:` and the hex of its SHA-256 hash.
pub fn hash_token(token: &str) -> String {
    format!("sha256:{}", hex(&Sha256::digest(token.as_bytes())))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Who makes a call, as authenticated: a user and the groups it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal {
    pub user: String,
    pub groups: Vec<String>,
}

impl Principal {
    pub fn new(user: impl Into<String>, groups: impl IntoIterator<Item = impl Into<String>>) -> Principal {
        Principal { user: user.into(), groups: groups.into_iter().map(Into::into).collect() }
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "user `{}`", self.user)
    }
}

/// What a call does to a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Permission {
    /// See it.
    Read,
    /// Work with it: allocate, release and keep grants alive, accept and free allocs, submit
    /// applications and report their tasks.
    Use,
    /// Change or remove it (quotas, pools, queues, `force`), and the API tokens.
    Admin,
    /// Submit applications for another user and groups (a shim submitting for its users).
    Impersonate,
}

impl Permission {
    pub const ALL: [Permission; 4] = [Permission::Read, Permission::Use, Permission::Admin, Permission::Impersonate];

    pub fn name(self) -> &'static str {
        match self {
            Permission::Read => "read",
            Permission::Use => "use",
            Permission::Admin => "admin",
            Permission::Impersonate => "impersonate",
        }
    }

    pub fn parse(text: &str) -> Option<Permission> {
        Permission::ALL.into_iter().find(|p| p.name() == text)
    }

    /// Whether holding `self` allows what `needed` allows.
    pub fn includes(self, needed: Permission) -> bool {
        if self == Permission::Impersonate || needed == Permission::Impersonate {
            return self == needed;
        }
        self >= needed
    }
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The kinds of resource a permission is held over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Namespace,
    Pool,
    Queue,
    /// The daemon itself: its metrics, its document, the change feed as a whole, the API tokens.
    Daemon,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Namespace, Kind::Pool, Kind::Queue, Kind::Daemon];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Namespace => "namespace",
            Kind::Pool => "pool",
            Kind::Queue => "queue",
            Kind::Daemon => "daemon",
        }
    }
}

/// One resource a call acts on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Resource {
    Namespace(String),
    Pool(String),
    /// A queue's path (`root.analytics.etl`).
    Queue(String),
    Daemon,
    /// Every resource of a kind whose name starts with this (the namespaces or pools a watch of a
    /// key prefix may see).
    Tree(Kind, String),
    /// Every resource of a kind: a list of them, or a watch over all of them.
    All(Kind),
}

impl Resource {
    pub fn kind(&self) -> Kind {
        match self {
            Resource::Namespace(_) => Kind::Namespace,
            Resource::Pool(_) => Kind::Pool,
            Resource::Queue(_) => Kind::Queue,
            Resource::Daemon => Kind::Daemon,
            Resource::Tree(kind, _) | Resource::All(kind) => *kind,
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Resource::Namespace(name) => write!(f, "namespace `{name}`"),
            Resource::Pool(name) => write!(f, "pool `{name}`"),
            Resource::Queue(path) => write!(f, "queue `{path}`"),
            Resource::Daemon => f.write_str("the daemon"),
            Resource::Tree(kind, prefix) => write!(f, "every {} whose name starts with `{prefix}`", kind.name()),
            Resource::All(kind) => write!(f, "every {}", kind.name()),
        }
    }
}

/// A pattern of resources, written `kind:pattern`: `namespace:hive:*` (the namespace `hive` and
/// every namespace under it), `namespace:hive:etl` (that one), `pool:gpu-*` (pools whose names
/// start with `gpu-`), `queue:root.analytics` (that queue and its subtree), `daemon`, and `*`
/// (everything, the daemon included). In a namespace or pool pattern a `*` may only end it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Pattern {
    Everything,
    Daemon,
    /// A name, or a prefix (`prefix*`).
    Name {
        kind: Kind,
        name: String,
        prefix: bool,
    },
    /// A queue and every queue under it.
    QueueTree(String),
}

/// Why a pattern was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error(
        "resource pattern `{0}` is not `namespace:NAME`, `pool:NAME`, `queue:PATH`, `daemon` or `*` (a name may \
         end in `*`)"
    )]
    Malformed(String),
    #[error("resource pattern `{0}` has a `*` that does not end it")]
    InnerWildcard(String),
}

impl Pattern {
    pub fn parse(text: &str) -> Result<Pattern, PatternError> {
        let text = text.trim();
        match text {
            "*" => return Ok(Pattern::Everything),
            "daemon" => return Ok(Pattern::Daemon),
            _ => {}
        }
        let malformed = || PatternError::Malformed(text.to_owned());
        let (kind, rest) = text.split_once(':').ok_or_else(malformed)?;
        if rest.is_empty() {
            return Err(malformed());
        }
        let kind = match kind {
            "namespace" => Kind::Namespace,
            "pool" => Kind::Pool,
            "queue" => Kind::Queue,
            _ => return Err(malformed()),
        };
        if kind == Kind::Queue {
            return match rest {
                "*" => Ok(Pattern::QueueTree("root".to_owned())),
                _ if rest.contains('*') => Err(PatternError::InnerWildcard(text.to_owned())),
                _ => Ok(Pattern::QueueTree(rest.to_owned())),
            };
        }
        let (name, prefix) = match rest.strip_suffix('*') {
            Some(name) => (name, true),
            None => (rest, false),
        };
        if name.contains('*') {
            return Err(PatternError::InnerWildcard(text.to_owned()));
        }
        Ok(Pattern::Name { kind, name: name.to_owned(), prefix })
    }

    /// Whether the pattern covers `resource`. Every resource of a kind is covered only by a
    /// pattern that covers the whole kind (`*`, `namespace:*`, `queue:root`).
    pub fn covers(&self, resource: &Resource) -> bool {
        match (self, resource) {
            (Pattern::Everything, _) => true,
            (Pattern::Daemon, Resource::Daemon) => true,
            (Pattern::Name { kind, name, prefix }, resource) if *kind == resource.kind() => match resource {
                Resource::Namespace(target) if *kind == Kind::Namespace => {
                    // `hive:*` covers `hive` itself, as a queue covers its subtree.
                    name_matches(name, *prefix, target)
                        || (*prefix && name.strip_suffix(':').is_some_and(|parent| parent == target))
                }
                Resource::Pool(target) => name_matches(name, *prefix, target),
                Resource::Tree(_, start) => *prefix && start.starts_with(name.as_str()),
                Resource::All(_) => *prefix && name.is_empty(),
                _ => false,
            },
            (Pattern::QueueTree(tree), Resource::Queue(path)) => in_queue_tree(path, tree),
            (Pattern::QueueTree(tree), Resource::All(Kind::Queue)) => tree == "root",
            _ => false,
        }
    }

    /// Whether the pattern covers at least one resource of `kind` (a list of that kind answers
    /// what the principal may see of it).
    pub fn touches(&self, kind: Kind) -> bool {
        match self {
            Pattern::Everything => true,
            Pattern::Daemon => kind == Kind::Daemon,
            Pattern::Name { kind: own, .. } => *own == kind,
            Pattern::QueueTree(_) => kind == Kind::Queue,
        }
    }
}

/// Whether queue `path` is `tree` or below it (`root.a.b` is in `root.a`; `root.ab` is not).
pub fn in_queue_tree(path: &str, tree: &str) -> bool {
    path == tree || path.strip_prefix(tree).is_some_and(|rest| rest.starts_with('.'))
}

fn name_matches(name: &str, prefix: bool, target: &str) -> bool {
    if prefix {
        target.starts_with(name)
    } else {
        target == name
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pattern::Everything => f.write_str("*"),
            Pattern::Daemon => f.write_str("daemon"),
            Pattern::Name { kind, name, prefix } => {
                write!(f, "{}:{name}{}", kind.name(), if *prefix { "*" } else { "" })
            }
            Pattern::QueueTree(tree) => write!(f, "queue:{tree}"),
        }
    }
}

/// A named set of permissions over patterns.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Role {
    pub grants: Vec<(Permission, Pattern)>,
}

impl Role {
    /// Whether the role allows `needed` over `resource`.
    pub fn allows(&self, needed: Permission, resource: &Resource) -> bool {
        self.grants.iter().any(|(held, pattern)| held.includes(needed) && pattern.covers(resource))
    }
}

/// A role given to users and groups (`*` in `users`: every authenticated principal).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Binding {
    pub role: String,
    pub users: Vec<String>,
    pub groups: Vec<String>,
}

impl Binding {
    fn binds(&self, principal: &Principal) -> bool {
        self.users.iter().any(|u| u == "*" || *u == principal.user)
            || self.groups.iter().any(|g| principal.groups.contains(g))
    }
}

/// Why a change of the tokens or bindings kept in the store was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    #[error("an API token named `{0}` exists; revoke it first, or choose another name")]
    TokenExists(String),
    #[error("no API token is named `{0}`")]
    TokenNotFound(String),
    #[error("no binding is named `{0}`")]
    BindingNotFound(String),
    #[error("{0}")]
    Invalid(String),
}

/// Why a policy was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("a binding names role `{0}`, which is not defined (built in: `admin`, `reader`)")]
    UnknownRole(String),
    #[error("role `{0}` is built in and cannot be defined again")]
    BuiltIn(String),
}

/// The roles and who holds them. Two roles are built in: `admin` (everything, impersonation
/// included) and `reader` (read everything).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    roles: BTreeMap<String, Role>,
    bindings: Vec<Binding>,
}

/// A refusal: who lacks which permission over what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{principal} may not do this: it needs `{permission}` on {resource}")]
pub struct Denied {
    pub principal: Principal,
    pub permission: Permission,
    pub resource: Resource,
}

impl Policy {
    pub fn new(roles: BTreeMap<String, Role>, bindings: Vec<Binding>) -> Result<Policy, PolicyError> {
        let mut all = Policy::built_in();
        for (name, role) in roles {
            if all.roles.contains_key(&name) {
                return Err(PolicyError::BuiltIn(name));
            }
            all.roles.insert(name, role);
        }
        if let Some(unknown) = bindings.iter().find(|b| !all.roles.contains_key(&b.role)) {
            return Err(PolicyError::UnknownRole(unknown.role.clone()));
        }
        all.bindings = bindings;
        Ok(all)
    }

    fn built_in() -> Policy {
        let admin = Role {
            grants: vec![(Permission::Admin, Pattern::Everything), (Permission::Impersonate, Pattern::Everything)],
        };
        let reader = Role { grants: vec![(Permission::Read, Pattern::Everything)] };
        Policy { roles: [("admin".to_owned(), admin), ("reader".to_owned(), reader)].into(), bindings: Vec::new() }
    }

    /// This policy with `more` bindings; those that name a role it does not have are answered
    /// apart (and left out).
    pub fn with_bindings(&self, more: Vec<Binding>) -> (Policy, Vec<Binding>) {
        let (known, unknown): (Vec<Binding>, Vec<Binding>) =
            more.into_iter().partition(|binding| self.roles.contains_key(&binding.role));
        let mut policy = self.clone();
        policy.bindings.extend(known);
        (policy, unknown)
    }

    /// Whether a role of this name exists (defined, or built in).
    pub fn has_role(&self, name: &str) -> bool {
        self.roles.contains_key(name)
    }

    /// The roles bound to `principal`.
    fn roles_of<'a>(&'a self, principal: &'a Principal) -> impl Iterator<Item = &'a Role> + 'a {
        self.bindings.iter().filter(|b| b.binds(principal)).filter_map(|b| self.roles.get(&b.role))
    }

    /// Whether `principal` may do what `permission` allows on `resource`.
    pub fn allows(&self, principal: &Principal, permission: Permission, resource: &Resource) -> bool {
        self.roles_of(principal).any(|role| role.allows(permission, resource))
    }

    /// [`Policy::allows`], as a refusal that says what was missing.
    pub fn check(&self, principal: &Principal, permission: Permission, resource: Resource) -> Result<(), Denied> {
        if self.allows(principal, permission, &resource) {
            return Ok(());
        }
        Err(Denied { principal: principal.clone(), permission, resource })
    }

    /// Whether `principal` holds `permission` over at least one resource of `kind`.
    pub fn touches(&self, principal: &Principal, permission: Permission, kind: Kind) -> bool {
        self.roles_of(principal)
            .flat_map(|role| &role.grants)
            .any(|(held, pattern)| held.includes(permission) && pattern.touches(kind))
    }
}

/// What the scheduler may give an application: anything (access control is not configured), or
/// only what its user (with its groups) may `use` under a policy. Every placement passes it, so
/// an accepted application reaches no pool or namespace its user could not reach by hand.
#[derive(Debug, Clone, Default)]
pub enum Tenancy {
    #[default]
    Open,
    Enforced(Arc<Policy>),
}

impl Tenancy {
    /// Whether `user` may have `resource` (a pool or a namespace) used for it.
    pub fn may_use(&self, user: &Principal, resource: &Resource) -> bool {
        match self {
            Tenancy::Open => true,
            Tenancy::Enforced(policy) => policy.allows(user, Permission::Use, resource),
        }
    }

    pub fn is_open(&self) -> bool {
        matches!(self, Tenancy::Open)
    }
}

/// A queue's access control list in YuniKorn's format: `*` (everyone), or users then groups,
/// each comma-separated, the two lists separated by one space (`"ada,bob ops,data"`; a leading
/// space: groups only, `" ops"`). An empty list lets no one in.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Acl {
    everyone: bool,
    users: Vec<String>,
    groups: Vec<String>,
    text: String,
}

/// An ACL as a regular expression (no look-around, for the API's document): `*`, or users then
/// groups, comma-separated, one space between the two lists.
pub const ACL_PATTERN: &str = r"^(\s*\*\s*|([^ ,*\u0000-\u001f\u007f-\u009f]+(,[^ ,*\u0000-\u001f\u007f-\u009f]+)*)?( ([^ ,*\u0000-\u001f\u007f-\u009f]+(,[^ ,*\u0000-\u001f\u007f-\u009f]+)*)?)?)$";

/// Why an ACL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ACL `{text}` is not `*` or `user1,user2 group1,group2`: {why}")]
pub struct AclError {
    pub text: String,
    pub why: &'static str,
}

impl Acl {
    pub fn parse(text: &str) -> Result<Acl, AclError> {
        let bad = |why| AclError { text: text.to_owned(), why };
        if text.trim() == "*" {
            return Ok(Acl { everyone: true, text: "*".to_owned(), ..Acl::default() });
        }
        if text.chars().any(char::is_control) {
            return Err(bad("it has control characters"));
        }
        let (users, groups) = text.split_once(' ').unwrap_or((text, ""));
        if groups.contains(' ') {
            return Err(bad("users and groups are separated by one space, names within them by commas"));
        }
        let names = |list: &str| -> Result<Vec<String>, AclError> {
            if list.is_empty() {
                return Ok(Vec::new());
            }
            let names: Vec<String> = list.split(',').map(str::to_owned).collect();
            if names.iter().any(String::is_empty) {
                return Err(bad("a name is empty (two commas, or one at an end)"));
            }
            if names.iter().any(|n| n.contains('*')) {
                return Err(bad("`*` stands alone"));
            }
            Ok(names)
        };
        Ok(Acl { everyone: false, users: names(users)?, groups: names(groups)?, text: text.to_owned() })
    }

    /// Whether the list lets `principal` in.
    pub fn allows(&self, principal: &Principal) -> bool {
        self.everyone
            || self.users.contains(&principal.user)
            || self.groups.iter().any(|g| principal.groups.contains(g))
    }

    /// The list as it was written.
    pub fn text(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for Acl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acls_read_as_yunikorn_writes_them() {
        let ada = Principal::new("ada", ["data"]);
        let bob = Principal::new("bob", ["ops"]);
        let acl = |text: &str| Acl::parse(text).unwrap();
        assert!(acl("*").allows(&ada) && acl(" * ").allows(&bob));
        assert!(acl("ada,bob").allows(&bob) && !acl("ada").allows(&bob));
        assert!(acl(" ops").allows(&bob) && !acl(" ops").allows(&ada), "a leading space: groups only");
        assert!(acl("eve data").allows(&ada) && !acl("eve data").allows(&bob));
        assert!(!acl("").allows(&ada), "an empty list lets no one in");
        for bad in ["ada bob eve", "a,* g", "a\tb", "a* g", "a g*", "a,,b", ",a", "a, g", "a g,"] {
            assert!(Acl::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(acl("ada,bob ops").to_string(), "ada,bob ops");
    }

    fn pattern(text: &str) -> Pattern {
        Pattern::parse(text).unwrap()
    }

    fn ns(name: &str) -> Resource {
        Resource::Namespace(name.to_owned())
    }

    #[test]
    fn patterns_cover_names_prefixes_and_subtrees() {
        let hive = pattern("namespace:hive:*");
        assert!(hive.covers(&ns("hive:etl")) && hive.covers(&ns("hive:etl:daily")) && hive.covers(&ns("hive")));
        assert!(!hive.covers(&ns("hivemind")) && !hive.covers(&ns("other:hive")));
        assert!(!hive.covers(&Resource::Pool("hive:etl".into())), "a pattern is of one kind");
        assert!(!hive.covers(&Resource::All(Kind::Namespace)));
        assert!(pattern("namespace:*").covers(&Resource::All(Kind::Namespace)));
        let tree = |start: &str| Resource::Tree(Kind::Namespace, start.to_owned());
        assert!(hive.covers(&tree("hive:etl")) && hive.covers(&tree("hive:")));
        assert!(!hive.covers(&tree("hive")), "`hive` starts `hive.x` too, which `hive:*` does not cover");
        assert!(!pattern("namespace:hive:etl").covers(&tree("hive:etl")), "a name does not cover what starts with it");
        let exact = pattern("pool:gpu-1");
        assert!(exact.covers(&Resource::Pool("gpu-1".into())) && !exact.covers(&Resource::Pool("gpu-10".into())));
        assert!(pattern("pool:gpu-*").covers(&Resource::Pool("gpu-10".into())));
        let tree = pattern("queue:root.analytics");
        let queue = |p: &str| Resource::Queue(p.to_owned());
        assert!(tree.covers(&queue("root.analytics")) && tree.covers(&queue("root.analytics.etl")));
        assert!(!tree.covers(&queue("root.analytics2")) && !tree.covers(&queue("root")));
        assert!(pattern("queue:root").covers(&Resource::All(Kind::Queue)));
        assert!(pattern("*").covers(&Resource::Daemon) && pattern("daemon").covers(&Resource::Daemon));
        assert!(!pattern("namespace:*").covers(&Resource::Daemon));
        for bad in ["namespace", "namespace:", "things:x", "pool:a*b", "queue:root.*", "hive:*"] {
            assert!(Pattern::parse(bad).is_err(), "{bad}");
        }
        for text in ["*", "daemon", "namespace:hive:*", "pool:gpu-1", "queue:root.a"] {
            assert_eq!(pattern(text).to_string(), text);
        }
    }

    #[test]
    fn admin_includes_use_includes_read_and_impersonate_stands_alone() {
        use Permission::*;
        assert!(Admin.includes(Use) && Admin.includes(Read) && Use.includes(Read));
        assert!(!Read.includes(Use) && !Use.includes(Admin));
        assert!(!Admin.includes(Impersonate) && !Impersonate.includes(Read) && Impersonate.includes(Impersonate));
    }

    #[test]
    fn a_principal_may_do_only_what_its_bound_roles_grant() {
        let team = Role {
            grants: vec![
                (Permission::Use, pattern("namespace:hive:*")),
                (Permission::Admin, pattern("queue:root.hive")),
                (Permission::Read, pattern("pool:*")),
            ],
        };
        let policy = Policy::new(
            [("hive".to_owned(), team)].into(),
            vec![
                Binding { role: "hive".into(), users: vec![], groups: vec!["hive-team".into()] },
                Binding { role: "reader".into(), users: vec!["auditor".into()], groups: vec![] },
                Binding { role: "admin".into(), users: vec!["root".into()], groups: vec![] },
            ],
        )
        .unwrap();
        let ada = Principal::new("ada", ["hive-team"]);
        let bob = Principal::new("bob", ["other"]);
        assert!(policy.allows(&ada, Permission::Use, &ns("hive:etl")));
        assert!(policy.allows(&ada, Permission::Read, &ns("hive:etl")));
        assert!(!policy.allows(&ada, Permission::Admin, &ns("hive:etl")));
        assert!(!policy.allows(&ada, Permission::Use, &ns("other")));
        assert!(policy.allows(&ada, Permission::Use, &Resource::Queue("root.hive.batch".into())));
        assert!(!policy.allows(&ada, Permission::Impersonate, &Resource::Queue("root.hive".into())));
        assert!(!policy.allows(&ada, Permission::Use, &Resource::Pool("gpu".into())));
        assert!(!policy.allows(&bob, Permission::Read, &ns("hive:etl")), "nothing is allowed by default");
        let denied = policy.check(&bob, Permission::Use, ns("hive:etl")).unwrap_err();
        assert_eq!(denied.to_string(), "user `bob` may not do this: it needs `use` on namespace `hive:etl`");
        let auditor = Principal::new("auditor", Vec::<String>::new());
        assert!(policy.allows(&auditor, Permission::Read, &Resource::Daemon));
        assert!(!policy.allows(&auditor, Permission::Use, &ns("x")));
        let root = Principal::new("root", Vec::<String>::new());
        assert!(policy.allows(&root, Permission::Impersonate, &Resource::Queue("root".into())));
        assert!(policy.allows(&root, Permission::Admin, &Resource::Daemon));
        assert!(policy.touches(&ada, Permission::Read, Kind::Namespace));
        assert!(!policy.touches(&ada, Permission::Read, Kind::Daemon));
        assert!(!policy.touches(&bob, Permission::Read, Kind::Namespace));
    }

    #[test]
    fn a_policy_names_only_roles_it_has() {
        let unknown = Binding { role: "nope".into(), users: vec!["a".into()], groups: vec![] };
        assert_eq!(Policy::new(BTreeMap::new(), vec![unknown]), Err(PolicyError::UnknownRole("nope".into())));
        assert_eq!(
            Policy::new([("admin".to_owned(), Role::default())].into(), vec![]),
            Err(PolicyError::BuiltIn("admin".into()))
        );
    }
}
