//! Who the simulated clients are: two teams under access control, as a daemon with `[auth]`
//! runs. The simulation itself (setting up, reading what the daemon holds) calls as `sim`, an
//! admin; client `c` calls as user `team{c % 2}`.
//!
//! Team 0 may use every namespace and pool; team 1 only namespace `sim:ns1` and pool
//! `sim-pool1`. Both submit to `root.sim`. So a call of team 1 on `sim:ns0` or `sim-pool0` is
//! refused (403, changing nothing), and the scheduler places none of team 1's tasks on
//! `sim-pool0` nor gives them a seat of `sim:ns0`: such a task waits (`forbidden`).

use std::collections::BTreeMap;

use allot_core::access::{hash_token, Binding, Pattern, Permission, Policy, Principal, Role};
use allot_server::{Access, Credential, OpenRoutes};

/// The simulation's own token (bound to the built-in role `admin`: everything).
pub const ADMIN_TOKEN: &str = "allot_sim-admin";

/// The team of client `client`.
pub fn team(client: u8) -> u8 {
    client % 2
}

/// The token a client calls with.
pub fn token(client: u8) -> String {
    format!("allot_sim-team{}", team(client))
}

/// The user of a team.
pub fn user(team: u8) -> String {
    format!("team{team}")
}

/// Whether a team may use namespace `ns` (by its number).
pub fn may_use_namespace(team: u8, ns: u8) -> bool {
    team == 0 || ns == 1
}

/// Whether a team may use pool `pool` (by its number).
pub fn may_use_pool(team: u8, pool: u8) -> bool {
    team == 0 || pool == 1
}

/// The daemon's access configuration, as its file would give it.
pub fn access() -> Access {
    let grants = |patterns: &[&str]| Role {
        grants: patterns.iter().map(|p| (Permission::Use, Pattern::parse(p).expect("a valid pattern"))).collect(),
    };
    let roles = BTreeMap::from([
        ("team0".to_owned(), grants(&["namespace:sim:*", "pool:sim-pool*", "queue:root.sim"])),
        ("team1".to_owned(), grants(&["namespace:sim:ns1", "pool:sim-pool1", "queue:root.sim"])),
    ]);
    let bind = |role: &str, user: &str| Binding { role: role.to_owned(), users: vec![user.to_owned()], groups: vec![] };
    let bindings = vec![bind("admin", "sim"), bind("team0", &user(0)), bind("team1", &user(1))];
    let policy = Policy::new(roles, bindings).expect("a valid policy");
    let credential = |name: &str, token: &str, user: &str| {
        Credential::new(name, &hash_token(token), Principal::new(user, Vec::<String>::new()), None)
            .expect("a valid credential")
    };
    let credentials = vec![
        credential("sim", ADMIN_TOKEN, "sim"),
        credential("team0", &token(0), &user(0)),
        credential("team1", &token(1), &user(1)),
    ];
    Access::new(policy, credentials, OpenRoutes::default()).expect("valid credentials")
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_core::access::Resource;

    /// The rules the model expects are the policy the daemon is given.
    #[test]
    fn the_models_rules_are_the_policy() {
        let policy = access().policy();
        for team in 0..2 {
            let principal = Principal::new(user(team), Vec::<String>::new());
            for n in 0..2 {
                let namespace = Resource::Namespace(format!("sim:ns{n}"));
                assert_eq!(policy.allows(&principal, Permission::Use, &namespace), may_use_namespace(team, n));
                let pool = Resource::Pool(format!("sim-pool{n}"));
                assert_eq!(policy.allows(&principal, Permission::Use, &pool), may_use_pool(team, n));
            }
            assert!(policy.allows(&principal, Permission::Use, &Resource::Queue("root.sim".into())));
        }
    }
}
