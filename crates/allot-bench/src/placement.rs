//! Where the servers and the load generator run with `--pin` (`bench compare`, `bench watch`).

use anyhow::bail;
use serde::Serialize;

/// Which CPUs the servers and the load generator run on (`--pin`; `bench watch --pin` too).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(super) struct Placement {
    pub(super) servers: Vec<usize>,
    pub(super) load: Vec<usize>,
    /// What the kernel says each process may run on (`Cpus_allowed_list` of `/proc/<pid>/status`),
    /// by server name, and `load` for this process: how the pinning came out.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub(super) allowed: std::collections::BTreeMap<String, String>,
}

impl Placement {
    /// With `pin`, the CPUs this process may use split in two; an error with fewer than 2.
    pub(super) fn pinned(pin: bool) -> anyhow::Result<Option<Placement>> {
        if !pin {
            return Ok(None);
        }
        let cpus = allot_host::affinity::allowed_cpus();
        let Some(placement) = Placement::split(&cpus) else {
            bail!("--pin needs at least 2 CPUs to split between the servers and the load generator; this process may use {}", cpus.len());
        };
        Ok(Some(placement))
    }

    /// The first half of `cpus` (rounded down) for the servers, the rest for the load generator;
    /// `None` with fewer than 2 CPUs.
    fn split(cpus: &[usize]) -> Option<Placement> {
        (cpus.len() >= 2).then(|| {
            let (servers, load) = cpus.split_at(cpus.len() / 2);
            Placement { servers: servers.to_vec(), load: load.to_vec(), allowed: Default::default() }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Placement;

    fn placement(servers: &[usize], load: &[usize]) -> Placement {
        Placement { servers: servers.to_vec(), load: load.to_vec(), allowed: Default::default() }
    }

    #[test]
    fn pinning_splits_the_cpus_in_two_halves() {
        assert_eq!(Placement::split(&[0, 1]), Some(placement(&[0], &[1])));
        assert_eq!(Placement::split(&[0, 2, 5]), Some(placement(&[0], &[2, 5])));
        assert_eq!(Placement::split(&[0, 1, 2, 3]), Some(placement(&[0, 1], &[2, 3])));
        assert_eq!(Placement::split(&[3]), None, "one CPU cannot be split");
        assert_eq!(Placement::split(&[]), None);
    }
}
