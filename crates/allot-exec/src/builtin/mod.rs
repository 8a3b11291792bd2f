//! The plugins that come with allot.

mod job;
mod noop;
mod shell;
mod sleep;

pub use job::{JobService, JOBS_QUOTA};

use crate::plugin::PluginEntry;

/// The built-in plugins' settings (`[plugins]` in the daemon's configuration).
#[derive(Debug, Clone)]
pub struct BuiltinConfig {
    /// The quota of the `http` plugin's jobs (`http:jobs`), made at the first start.
    pub http_jobs: u64,
    /// The services an `http` task may call (`[plugins.http.services.<name>]`): its `spec.url`
    /// must be one of their URLs or under one. None configured: every http task fails
    /// (`url_not_allowed`).
    pub http_services: Vec<JobService>,
    /// Plugins served by other processes.
    pub external: Vec<ExternalPlugin>,
    /// Whom `shell` runs commands as (`[plugins.shell]`).
    pub shell: ShellConfig,
}

impl Default for BuiltinConfig {
    fn default() -> BuiltinConfig {
        BuiltinConfig { http_jobs: 10, http_services: Vec::new(), external: Vec::new(), shell: ShellConfig::default() }
    }
}

/// Whom the `shell` plugin runs commands as (`[plugins.shell]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShellConfig {
    /// An unprivileged user of this machine (`run_as`): commands run with its user and group
    /// ids, in attempt directories it owns. None: as the daemon's own user.
    pub run_as: Option<RunAs>,
    /// Commands that would run as root are refused (a daemon that checks who calls runs no
    /// caller's command as root unless its file says `allow_root = true`).
    pub refuse_root: bool,
}

/// A user of this machine, resolved from its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

impl RunAs {
    /// The user `name` of this machine.
    pub fn named(name: &str) -> Result<RunAs, String> {
        match nix::unistd::User::from_name(name) {
            Ok(Some(user)) => Ok(RunAs { name: name.to_owned(), uid: user.uid.as_raw(), gid: user.gid.as_raw() }),
            Ok(None) => Err(format!("there is no user `{name}` on this machine (`useradd --system {name}` makes one)")),
            Err(err) => Err(format!("cannot look user `{name}` up: {err}")),
        }
    }
}

/// The user id this daemon runs as.
pub fn daemon_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

impl ShellConfig {
    /// The user id commands run as.
    pub fn uid(&self) -> u32 {
        self.run_as.as_ref().map_or_else(daemon_uid, |user| user.uid)
    }

    /// What the daemon says at start of whom shell commands run as.
    pub fn describe(&self) -> String {
        let who = match &self.run_as {
            Some(user) => format!("as user `{}` (uid {})", user.name, user.uid),
            None => format!("as the daemon's own user (uid {})", self.uid()),
        };
        match self.uid() == 0 && self.refuse_root {
            true => format!(
                "shell tasks are refused: they would run as root ({who}); set [plugins.shell] run_as, or \
                 allow_root = true"
            ),
            false => format!("shell tasks run {who}"),
        }
    }
}

/// A plugin served by another process over HTTP/JSON (`[plugins.external.<id>]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalPlugin {
    pub id: String,
    pub url: String,
    /// The name of the secret (`[secrets]`) its calls carry as a bearer token, if any.
    pub secret: Option<String>,
    pub task_types: Vec<String>,
    /// With a quota, each of its jobs holds a token of `<id>:jobs` while it runs.
    pub jobs_quota: Option<u64>,
}

/// Every built-in plugin's entry, with the default settings.
pub fn entries() -> Vec<PluginEntry> {
    configured(&BuiltinConfig::default())
}

/// Every built-in plugin's entry, and one per external plugin.
pub fn configured(config: &BuiltinConfig) -> Vec<PluginEntry> {
    let mut entries = vec![
        noop::entry(),
        shell::entry(config.shell.clone()),
        sleep::entry(),
        job::http_entry(config.http_jobs, &config.http_services),
    ];
    for plugin in &config.external {
        let types: Vec<&str> = plugin.task_types.iter().map(String::as_str).collect();
        entries.push(job::external_entry(&plugin.id, &plugin.url, plugin.secret.as_deref(), &types, plugin.jobs_quota));
    }
    entries
}
