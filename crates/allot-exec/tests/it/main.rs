//! allot-exec's integration tests, one binary: the executor on a real embedded store (and on its
//! change feed), the `http` plugin against an outside service, and the plugin registry.

mod executor;
mod feed;
mod http_jobs;
mod plugins;
mod support;
