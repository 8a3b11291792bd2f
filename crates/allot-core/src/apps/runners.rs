//! Which pools the executors run and which task types they run there, as the executors' leases
//! say: a task with a type is placed only where a live executor runs that type.
//!
//! Not recorded: whoever schedules reads the leases again (the embedded store as its executor
//! renews its lease, the Redis scheduler every few seconds).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::pools::PoolName;

/// In an executor's task types: every type (its registry has a default plugin).
pub const EVERY_TYPE: &str = "*";

/// One executor's lease as the scheduler reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runner {
    /// The pools whose tasks it runs.
    pub pools: Vec<PoolName>,
    /// The task types its registry runs ([`EVERY_TYPE`]: every type).
    pub task_types: Vec<String>,
    /// It renews its lease.
    pub live: bool,
}

/// A set of task types, or every type.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskTypes {
    every: bool,
    named: BTreeSet<String>,
}

impl TaskTypes {
    fn add(&mut self, types: &[String]) {
        for task_type in types {
            match task_type.as_str() {
                EVERY_TYPE => self.every = true,
                named => {
                    self.named.insert(named.to_owned());
                }
            }
        }
    }

    pub fn has(&self, task_type: &str) -> bool {
        self.every || self.named.contains(task_type)
    }

    /// Every type is in it.
    pub fn is_every(&self) -> bool {
        self.every
    }
}

/// What the executors' leases say, as of the last reading.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Runners {
    /// The pools a live executor runs, with the types run there (of every executor running it);
    /// shared, as every cycle's view of the pools holds them.
    live: BTreeMap<PoolName, Arc<TaskTypes>>,
    /// Every type some executor's registry has, live or not: a stopped daemon may come back.
    known: TaskTypes,
}

impl Runners {
    pub fn from_leases<'a>(leases: impl IntoIterator<Item = &'a Runner>) -> Runners {
        let mut runners = Runners::default();
        for lease in leases {
            runners.known.add(&lease.task_types);
            if lease.live {
                for pool in &lease.pools {
                    Arc::make_mut(runners.live.entry(pool.clone()).or_default()).add(&lease.task_types);
                }
            }
        }
        runners
    }

    /// The types run on `pool` by its live executors; `None` when no live executor runs it.
    pub fn of(&self, pool: &PoolName) -> Option<&Arc<TaskTypes>> {
        self.live.get(pool)
    }

    /// Whether some executor's registry (live or not) runs tasks of `task_type`.
    pub fn knows(&self, task_type: &str) -> bool {
        self.known.has(task_type)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(pools: &[&str], types: &[&str], live: bool) -> Runner {
        Runner {
            pools: pools.iter().map(|p| PoolName::new(p).unwrap()).collect(),
            task_types: types.iter().map(|t| (*t).to_owned()).collect(),
            live,
        }
    }

    #[test]
    fn a_pool_is_run_with_the_types_of_its_live_executors() {
        let leases =
            [lease(&["a"], &["shell"], true), lease(&["a", "b"], &["sleep"], false), lease(&["c"], &["*"], true)];
        let runners = Runners::from_leases(&leases);
        let a = PoolName::new("a").unwrap();
        assert!(runners.of(&a).unwrap().has("shell"));
        assert!(!runners.of(&a).unwrap().has("sleep"), "the executor that runs `sleep` there stopped");
        assert!(runners.of(&PoolName::new("b").unwrap()).is_none());
        assert!(runners.of(&PoolName::new("c").unwrap()).unwrap().has("anything"));
        assert!(runners.knows("sleep") && runners.knows("other"), "a stopped daemon's types, and `*`, are known");
        assert!(!Runners::from_leases(&[lease(&["a"], &["shell"], false)]).knows("sleep"));
    }
}
