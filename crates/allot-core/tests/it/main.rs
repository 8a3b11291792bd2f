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
