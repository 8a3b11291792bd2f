//! allot-server in-process (`api()` with `oneshot`) over a real embedded store: every answer
//! shape, and bad input that must get a 4xx with a code and change nothing; a module per part.

mod access;
mod apps;
mod daemon;
mod placement;
mod pools;
mod protocols;
mod quotas;
mod support;
mod watch;
