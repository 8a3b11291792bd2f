//! allot-exec's integration tests, one binary: the executor on a real embedded store, the
//! `http` plugin against an outside service, and the plugin registry.

mod executor;
mod http_jobs;
mod plugins;
mod support;
