//! allot-store-redis's integration tests, one binary, each against real `redis-server`
//! processes: the shared conformance suite, the Redis functions compared with the core step by
//! step, outages and replicas, and the applications part (the scheduler's lease, its records, the
//! scheduler itself).

mod apps_lease;
mod apps_records;
mod apps_scheduler;
mod conformance;
mod differential;
mod ended_allocs;
mod outage;
mod replicas;
mod snapshot;
mod support;
