//! The Lua scripts, each one atomic call on one hash slot.
//!
//! Namespace scripts are the shared prelude (`lua/namespace.lua`: key layout, record formats,
//! admission) followed by one operation. They are called by SHA (`EVALSHA`) and sent whole
//! (`EVAL`) only when a server does not know them yet.

use redis::Script;

macro_rules! namespace_script {
    ($file:literal) => {
        concat!(include_str!("lua/namespace.lua"), "\n", include_str!(concat!("lua/", $file)))
    };
}

/// A script and its SHA1.
pub(crate) struct Lua {
    pub(crate) name: &'static str,
    pub(crate) code: &'static str,
    pub(crate) sha: String,
}

impl Lua {
    fn new(name: &'static str, code: &'static str) -> Lua {
        Lua { name, code, sha: Script::new(code).get_hash().to_owned() }
    }
}

pub(crate) struct Scripts {
    pub(crate) allocate: Lua,
    pub(crate) claim: Lua,
    pub(crate) release: Lua,
    pub(crate) keepalive: Lua,
    pub(crate) put_namespace: Lua,
    pub(crate) remove_namespace: Lua,
    pub(crate) view: Lua,
    pub(crate) grants: Lua,
    pub(crate) waiters: Lua,
    pub(crate) sweep: Lua,
    pub(crate) session_extend: Lua,
    pub(crate) session_end: Lua,
    pub(crate) session_grants: Lua,
    pub(crate) sessions: Lua,
}

impl Scripts {
    pub(crate) fn new() -> Scripts {
        Scripts {
            allocate: Lua::new("allocate", namespace_script!("allocate.lua")),
            claim: Lua::new("claim", namespace_script!("claim.lua")),
            release: Lua::new("release", namespace_script!("release.lua")),
            keepalive: Lua::new("keepalive", namespace_script!("keepalive.lua")),
            put_namespace: Lua::new("put_namespace", namespace_script!("put_namespace.lua")),
            remove_namespace: Lua::new("remove_namespace", namespace_script!("remove_namespace.lua")),
            view: Lua::new("view", namespace_script!("view.lua")),
            grants: Lua::new("grants", namespace_script!("grants.lua")),
            waiters: Lua::new("waiters", namespace_script!("waiters.lua")),
            sweep: Lua::new("sweep", namespace_script!("sweep.lua")),
            session_extend: Lua::new("session_extend", namespace_script!("session_extend.lua")),
            session_end: Lua::new("session_end", namespace_script!("session_end.lua")),
            session_grants: Lua::new("session_grants", include_str!("lua/session_grants.lua")),
            sessions: Lua::new("sessions", include_str!("lua/sessions.lua")),
        }
    }
}
