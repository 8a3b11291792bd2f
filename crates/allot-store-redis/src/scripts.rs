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
            /// Redis Cluster (`sharded`: on each namespace's own channel, in its slot). With
            /// `min_replicas`, each function has a twin for changes that first checks the
            /// primary has that many replicas attached, and refuses before it writes.
            pub(crate) fn new(sharded: bool, min_replicas: u32) -> Scripts {
                Scripts::build(sharded, min_replicas, CLOCK.to_owned())
            }

            /// The library for one Redis whose functions take the time from key `clock` while
            /// it is set (see `testing::TestClock`), instead of Redis's `TIME`; its changes
            /// check for `min_replicas` first, as [`Scripts::new`]'s.
            #[cfg(feature = "testing")]
            pub(crate) fn with_test_clock(key: &str, min_replicas: u32) -> Scripts {
                let clock = format!(
                    "local function now_ms()\n  local set = redis.call('GET', '{key}')\n  \
                     if set then return tonumber(set) end\n  local t = redis.call('TIME')\n  \
                     return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\nend\n"
                );
                Scripts::build(false, min_replicas, clock)
            }

            /// `clock` defines `now_ms()`, the time the functions read.
            fn build(sharded: bool, min_replicas: u32, clock: String) -> Scripts {
                let bodies: &[(&str, &str)] =
                    &[$((stringify!($name), include_str!(concat!("lua/", stringify!($name), ".lua"))),)*];
                let mut prelude = format!("local SHARDED = {sharded}\n{clock}{PRELUDE}");
                if min_replicas > 0 {
                    prelude.push_str(&format!("local MIN_REPLICAS = {min_replicas}\n{REPLICAS_CHECK}"));
                }
                let version = version(&prelude, bodies);
                let name = |op: &str| format!("allot_{version}_{op}");
                let checked = |op: &str| if min_replicas > 0 { format!("allot_{version}_{op}{CHECKED}") } else { name(op) };
                Scripts {
                    library: library(&version, &prelude, bodies, min_replicas > 0),
                    $($name: Function { name: name(stringify!($name)), checked: checked(stringify!($name)) },)*
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
    feed,
    access,
    snapshot,
);

const PRELUDE: &str = include_str!("lua/namespace.lua");
/// The daemon's clock: Redis's `TIME`. The test library's (`with_test_clock`) is only compiled
/// with the `testing` feature.
const CLOCK: &str = include_str!("lua/clock.lua");

/// One function of the library.
pub(crate) struct Function {
    pub(crate) name: String,
    /// The function for a call that changes something: with `--redis-min-replicas`, the twin
    /// that checks the replicas first; else the function itself.
    pub(crate) checked: String,
}

/// The suffix of a function's twin that checks the replicas.
const CHECKED: &str = "_checked";

/// With `--redis-min-replicas`: the refusal of a change on a primary with fewer replicas
/// attached (online, and acknowledging within 10 s, Redis's `min-replicas-max-lag`) than
/// required, made before anything is written: `ALLOT_NOREPLICAS <attached> <required> <port>`.
/// `lag` may read -1: Redis subtracts the second of the last acknowledgement (from the precise
/// clock) from `time(NULL)` (the coarse clock, a few ms behind it just after a second begins), so
/// right after `WAIT` a replica that has just acknowledged reads -1 in about 1 check in 300. A
/// negative lag is a replica acknowledging now: it counts.
const REPLICAS_CHECK: &str = r#"
local function replicas_refusal()
  local info = redis.call('INFO', 'replication')
  local good = 0
  for line in string.gmatch(info, 'slave%d+:[^\r\n]*') do
    local lag = tonumber(string.match(line, 'lag=(%-?%d+)'))
    if string.find(line, 'state=online', 1, true) and lag and lag <= 10 then good = good + 1 end
  end
  if good >= MIN_REPLICAS then return nil end
  local port = string.match(redis.call('INFO', 'server'), 'tcp_port:(%d+)') or '?'
  return redis.error_reply('ALLOT_NOREPLICAS ' .. good .. ' ' .. MIN_REPLICAS .. ' ' .. port)
end
"#;

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
const OWN_KEYS: &[&str] =
    &["session_grants", "sessions", "pool", "registry", "sched_lease", "apps", "runs", "feed", "access", "snapshot"];

fn library(version: &str, prelude: &str, bodies: &[(&str, &str)], checked: bool) -> String {
    let mut text = format!("#!lua name=allot_{version}\n{prelude}\nlocal BODIES = {{}}\n");
    for (name, body) in bodies {
        // Every call starts with no events and ends by appending its own to its slot's feed.
        let head = if OWN_KEYS.contains(name) { "KEYS, ARGV)" } else { "KEYS, args)\nbind(KEYS, args)" };
        text.push_str(&format!(
            "BODIES.{name} = function({head}\n{body}\nend\n\
             local op_{name} = function(KEYS, ARGV)\nEVENTS = {{}}\nlocal reply = BODIES.{name}(KEYS, ARGV)\n\
             flush_feed(KEYS[1])\nreturn reply\nend\n"
        ));
        text.push_str(&format!("redis.register_function('allot_{version}_{name}', op_{name})\n"));
        if checked {
            text.push_str(&format!(
                "redis.register_function('allot_{version}_{name}{CHECKED}', function(KEYS, ARGV)\n\
                 local refusal = replicas_refusal()\nif refusal then return refusal end\n\
                 return op_{name}(KEYS, ARGV)\nend)\n"
            ));
        }
    }
    text
}
