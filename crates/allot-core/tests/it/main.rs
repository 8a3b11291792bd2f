//! allot-core's integration tests, one binary: each part's decisions, and the models each part is
//! compared with step by step.

mod apps;
mod apps_model;
mod pool_changes;
mod pool_changes_model;
mod pools;
mod preemption;
mod preemption_model;
mod priorities;
mod quotas;
mod quotas_model;
mod resources;
mod runs;
mod tenancy;

/// A property test's `default` number of cases, unless `PROPTEST_CASES` asks for more (a longer
/// run, with another `PROPTEST_RNG_SEED`: see `.cargo/config.toml`).
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}
