//! allot's Redis function library: the prelude `lua/namespace.lua` (key layout, record formats,
//! admission) and one function per operation, each an atomic call on one hash slot.
//!
//! The library is loaded once per server (`FUNCTION LOAD`; on a cluster, on every primary) and
//! called with `FCALL`, so the prelude runs once, not at every call. Its name and its functions'
//! names carry a hash of its text: daemons of different versions each use their own library, and
//! a server that lost it (restarted without persistence) gets it again on the first call.

use redis::Script;

/// The operations, in the order of [`Scripts`]'s fields; each is `lua/<name>.lua`.
macro_rules! operations {
    ($($name:ident),* $(,)?) => {
        /// The function of each operation.
        pub(crate) struct Scripts {
            /// The library's source, ready for `FUNCTION LOAD`.
            pub(crate) library: String,
            $(pub(crate) $name: Function,)*
        }

        impl Scripts {
            /// The library for one Redis (`sharded` false: wake-ups on one channel) or a
            /// Redis Cluster (`sharded`: on each namespace's own channel, in its slot).
            pub(crate) fn new(sharded: bool) -> Scripts {
                let bodies: &[(&str, &str)] =
                    &[$((stringify!($name), include_str!(concat!("lua/", stringify!($name), ".lua"))),)*];
                let prelude = format!("local SHARDED = {sharded}\n{PRELUDE}");
                let version = version(&prelude, bodies);
                Scripts {
                    library: library(&version, &prelude, bodies),
                    $($name: Function { name: format!("allot_{version}_{}", stringify!($name)) },)*
                }
            }
        }
    };
}

operations!(
    allocate,
    claim,
    release,
    keepalive,
    put_namespace,
    remove_namespace,
    view,
    grants,
    waiters,
    sweep,
    session_extend,
    session_end,
    session_grants,
    sessions,
    pool,
    registry,
    sched_lease,
    apps,
    sched_grant,
    runs,
);

const PRELUDE: &str = include_str!("lua/namespace.lua");

/// One function of the library.
pub(crate) struct Function {
    pub(crate) name: String,
}

/// A short hash of the library's text.
fn version(prelude: &str, bodies: &[(&str, &str)]) -> String {
    let mut text = String::from(prelude);
    for (name, body) in bodies {
        text.push_str(name);
        text.push_str(body);
    }
    Script::new(&text).get_hash()[..12].to_owned()
}

/// The functions that work on their own keys (sessions, pools): they take `KEYS` and `ARGV` as
/// they are and skip `bind`, which builds a namespace's key names.
const OWN_KEYS: &[&str] = &["session_grants", "sessions", "pool", "registry", "sched_lease", "apps", "runs"];

fn library(version: &str, prelude: &str, bodies: &[(&str, &str)]) -> String {
    let mut text = format!("#!lua name=allot_{version}\n{prelude}\n");
    for (name, body) in bodies {
        let head =
            if OWN_KEYS.contains(name) { "function(KEYS, ARGV)" } else { "function(KEYS, args)\nbind(KEYS, args)" };
        text.push_str(&format!("redis.register_function('allot_{version}_{name}', {head}\n{body}\nend)\n"));
    }
    text
}
