//! The steps that carry a scheduler's outcome out into the pools and namespaces, as data: the
//! allocs and grants to make and to end, the step that undoes a make, and their encoding as the
//! intents the scheduler writes with its records (see `scheduler.rs`). A step names its pool or
//! namespace and ids as text, so intents read back by a successor are the same steps.

use allot_core::apps::Outcome;
use allot_core::pools::{AllocId, Labels, PoolChange, HELD};
use allot_core::Change;
use serde::{Deserialize, Serialize};

/// One step of carrying out an outcome in the pools and namespaces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "k", rename_all = "snake_case")]
pub(crate) enum Step {
    /// Make a held alloc.
    Accept {
        pool: String,
        id: String,
        resources: String,
        owner: String,
        /// What is in it (`allot/app`, `allot/task` or `allot/placeholder`); absent in intents
        /// written before held allocs had labels.
        #[serde(default, skip_serializing_if = "Labels::is_empty")]
        labels: Labels,
    },
    /// Name what is in a held alloc (a task took a placeholder over).
    Label { pool: String, id: String, labels: Labels },
    /// Grant a placement's tokens.
    Take { namespace: String, token: String, units: u64 },
    /// End a held alloc.
    End { pool: String, id: String },
    /// Release a placement's tokens.
    Drop { namespace: String, token: String },
}

/// The makes and the ends of an outcome.
pub(crate) fn steps(outcome: &Outcome) -> (Vec<Step>, Vec<Step>) {
    let (mut makes, mut ends) = (Vec::new(), Vec::new());
    for change in &outcome.pools {
        match change {
            PoolChange::Alloc(alloc) if alloc.expires == HELD => makes.push(Step::Accept {
                pool: alloc.pool.to_string(),
                id: alloc.id.to_string(),
                resources: alloc.resources.to_string(),
                owner: alloc.owner.clone(),
                labels: Labels::clone(&alloc.labels),
            }),
            PoolChange::AllocAnnotated(alloc) if alloc.expires == HELD => {
                let (pool, id) = (alloc.pool.to_string(), alloc.id.to_string());
                // An alloc made in the same outcome is made with its last labels: the steps of
                // one outcome run at once, so a label step could come before its make.
                let made = makes.iter_mut().find_map(|step| match step {
                    Step::Accept { pool: p, id: i, labels, .. } if *p == pool && *i == id => Some(labels),
                    _ => None,
                });
                match made {
                    Some(labels) => *labels = Labels::clone(&alloc.labels),
                    None => makes.push(Step::Label { pool, id, labels: Labels::clone(&alloc.labels) }),
                }
            }
            PoolChange::AllocEnded(ended) if ended.alloc.expires == HELD => {
                ends.push(Step::End { pool: ended.alloc.pool.to_string(), id: ended.alloc.id.to_string() })
            }
            _ => {}
        }
    }
    for change in &outcome.ledger.changes {
        match change {
            Change::Grant(grant) | Change::GrantAdded(grant) if grant.token.as_str() != OTHERS => {
                makes.push(Step::Take {
                    namespace: grant.namespace.to_string(),
                    token: grant.token.to_string(),
                    units: grant.units,
                })
            }
            Change::GrantRemoved { grant: allot_core::Grant { namespace, token, .. }, .. }
                if token.as_str() != OTHERS =>
            {
                ends.push(Step::Drop { namespace: namespace.to_string(), token: token.to_string() })
            }
            _ => {}
        }
    }
    (makes, ends)
}

/// The mirror's one grant per namespace, and one alloc per pool, for what others hold there (no
/// scheduler token has this name: theirs begin with `@`).
pub(crate) const OTHERS: &str = "others";
pub(crate) const OTHERS_ALLOC: AllocId = AllocId(0);

/// The steps as the intents of `lua/apps.lua` hold them (`""` for none).
pub(crate) fn encode_steps(steps: &[Step]) -> String {
    if steps.is_empty() {
        return String::new();
    }
    serde_json::to_string(steps).expect("steps always encode")
}

/// The step that undoes a make.
pub(crate) fn undo(step: &Step) -> Option<Step> {
    match step {
        Step::Accept { pool, id, .. } => Some(Step::End { pool: pool.clone(), id: id.clone() }),
        Step::Take { namespace, token, .. } => Some(Step::Drop { namespace: namespace.clone(), token: token.clone() }),
        _ => None,
    }
}
