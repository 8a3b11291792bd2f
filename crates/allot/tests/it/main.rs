//! End-to-end tests: the real `allot` binary as a daemon on 127.0.0.1:0, real files on disk,
//! talked to through `allot-client`, raw TCP and the CLI.

mod access;
mod app_answers;
mod apps;
mod architecture;
mod bench;
mod cli;
mod contract;
mod crash;
mod daemon;
mod exec;
mod gangs;
mod pages;
mod pool_changes;
mod preemption;
mod python;
mod readiness;
mod readme;
mod redis;
mod redis_apps;
mod redis_exec;
mod redis_failover;
mod routes;
mod sched_crash;
mod shipped;
mod snapshot;
mod sources;
mod submit_follow;
mod support;
mod tenancy;
mod watch;
