//! `[auth]` of the configuration file: the API tokens (kept as hashes), the roles and who holds
//! them, resolved into the server's `Access`; and the rule that a daemon without it listens
//! only on loopback.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use allot_core::access::{Binding, Pattern, Permission, Policy, Principal, Role};
use allot_server::{Access, Credential, OpenRoutes};
use anyhow::{bail, Context};
use serde::Deserialize;

/// `[auth]`: with it, every call needs an API token.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AuthFile {
    /// `[[auth.tokens]]`: the tokens `allot api-token make` printed, as hashes.
    #[serde(default)]
    tokens: Vec<TokenEntry>,
    /// `[auth.roles.NAME]`: permissions over resource patterns.
    #[serde(default)]
    roles: BTreeMap<String, RoleEntry>,
    /// `[[auth.bindings]]`: roles given to users and groups.
    #[serde(default)]
    bindings: Vec<BindingEntry>,
    /// Serve `/metrics` without a token (for a scraper on a trusted network).
    #[serde(default)]
    open_metrics: bool,
    /// Serve `/openapi.json` without a token.
    #[serde(default)]
    open_document: bool,
    /// The token this daemon's own calls to the other daemons carry (its executor's reports to
    /// the daemon that schedules, on Redis): a value, `env:VAR` or `file:PATH`.
    daemon_token: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    /// Tells tokens apart in lists and the audit trail [default: the user].
    name: Option<String>,
    user: String,
    #[serde(default)]
    groups: Vec<String>,
    /// `sha256:` and 64 hexadecimal digits.
    hash: String,
    /// When the token stops being accepted, RFC 3339 (`2027-01-31T00:00:00Z`).
    expires: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RoleEntry {
    #[serde(default)]
    read: Vec<String>,
    #[serde(default, rename = "use")]
    work: Vec<String>,
    #[serde(default)]
    admin: Vec<String>,
    #[serde(default)]
    impersonate: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BindingEntry {
    role: String,
    #[serde(default)]
    users: Vec<String>,
    #[serde(default)]
    groups: Vec<String>,
}

/// The daemon's access, resolved: the server's part, and the token of its own calls.
pub(super) struct Resolved {
    pub(super) access: Access,
    pub(super) daemon_token: Option<String>,
}

impl std::fmt::Debug for Resolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the daemon's token.
        f.debug_struct("Resolved").field("access", &self.access).finish_non_exhaustive()
    }
}

pub(super) fn resolve(
    file: AuthFile,
    secret: impl Fn(&str, &str) -> anyhow::Result<String>,
) -> anyhow::Result<Resolved> {
    let mut roles = BTreeMap::new();
    for (name, entry) in file.roles {
        let mut grants = Vec::new();
        for (permission, patterns) in [
            (Permission::Read, entry.read),
            (Permission::Use, entry.work),
            (Permission::Admin, entry.admin),
            (Permission::Impersonate, entry.impersonate),
        ] {
            for text in patterns {
                let pattern = Pattern::parse(&text).with_context(|| format!("[auth.roles.{name}] {permission}"))?;
                grants.push((permission, pattern));
            }
        }
        roles.insert(name, Role { grants });
    }
    let bindings =
        file.bindings.into_iter().map(|b| Binding { role: b.role, users: b.users, groups: b.groups }).collect();
    let policy = Policy::new(roles, bindings).context("[auth]")?;
    let credentials = file
        .tokens
        .into_iter()
        .map(|entry| {
            let name = entry.name.unwrap_or_else(|| entry.user.clone());
            let expires = entry
                .expires
                .map(|text| {
                    humantime::parse_rfc3339(&text)
                        .with_context(|| format!("[[auth.tokens]] `{name}`: expires `{text}` is not RFC 3339"))
                })
                .transpose()?;
            Credential::new(&name, &entry.hash, Principal::new(entry.user, entry.groups), expires)
                .context("[[auth.tokens]]")
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let open = OpenRoutes { metrics: file.open_metrics, document: file.open_document };
    let access = Access::new(policy, credentials, open).context("[[auth.tokens]]")?;
    let daemon_token = file.daemon_token.map(|text| secret("daemon_token", &text)).transpose()?;
    Ok(Resolved { access, daemon_token })
}

/// Refuses to serve a non-loopback address without access configured, unless told to.
pub(super) fn check_exposure(listen: SocketAddr, auth: bool, insecure_no_auth: bool) -> anyhow::Result<()> {
    if auth || listen.ip().is_loopback() {
        return Ok(());
    }
    if !insecure_no_auth {
        bail!(
            "refusing to listen on {listen} without authentication: anyone who reaches it could do anything. \
             Configure `[auth]` in the configuration file (API tokens and roles; `allot api-token make` makes a \
             token), listen on loopback (127.0.0.1), or pass --insecure-no-auth to serve it open anyway"
        );
    }
    tracing::warn!(
        %listen,
        "serving without authentication on a non-loopback address (--insecure-no-auth): anyone who reaches it may \
         do anything"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> anyhow::Result<Resolved> {
        let file: AuthFile = toml::from_str(text)?;
        resolve(file, |_, value| Ok(value.to_owned()))
    }

    #[test]
    fn the_auth_table_resolves_into_tokens_and_a_policy() {
        let hash = allot_core::access::hash_token("allot_x");
        let resolved = parse(&format!(
            r#"
            open_metrics = true
            daemon_token = "allot_daemon"
            [[tokens]]
            user = "ada"
            groups = ["hive"]
            hash = "{hash}"
            expires = "2099-01-01T00:00:00Z"
            [roles.hive]
            use = ["namespace:hive:*"]
            read = ["pool:*"]
            [[bindings]]
            role = "hive"
            groups = ["hive"]
            "#
        ))
        .unwrap();
        assert_eq!(resolved.daemon_token.as_deref(), Some("allot_daemon"));
        let ada = Principal::new("ada", ["hive"]);
        let policy = resolved.access.policy();
        assert!(policy.allows(&ada, Permission::Use, &allot_core::access::Resource::Namespace("hive:a".into())));
        assert!(!policy.allows(&ada, Permission::Admin, &allot_core::access::Resource::Namespace("hive:a".into())));
        assert!(!format!("{resolved:?}").contains("allot_daemon"), "the daemon's token is never printed");
    }

    #[test]
    fn a_bad_auth_table_is_refused_with_what_is_wrong() {
        let cases = [
            ("[[tokens]]\nuser = \"a\"\nhash = \"md5:00\"", "hash"),
            ("[[bindings]]\nrole = \"nope\"\nusers = [\"a\"]", "nope"),
            ("[roles.x]\nuse = [\"hive:*\"]", "hive:*"),
            ("[[tokens]]\nuser = \"a\"\nhash = \"sha256:00\"\nexpires = \"tomorrow\"", "expires"),
        ];
        for (text, says) in cases {
            let err = format!("{:#}", parse(text).err().unwrap_or_else(|| panic!("{text} is accepted")));
            assert!(err.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn without_auth_only_loopback_is_served() {
        let any: SocketAddr = "0.0.0.0:7070".parse().unwrap();
        let loopback: SocketAddr = "127.0.0.1:7070".parse().unwrap();
        assert!(check_exposure(loopback, false, false).is_ok());
        assert!(check_exposure(any, true, false).is_ok());
        assert!(check_exposure(any, false, true).is_ok());
        let err = check_exposure(any, false, false).unwrap_err().to_string();
        assert!(err.contains("--insecure-no-auth") && err.contains("[auth]"), "{err}");
    }
}
