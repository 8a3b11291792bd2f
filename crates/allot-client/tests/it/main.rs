//! allot-client against a real daemon in-process (`allot_server::run` over an embedded store in a
//! temporary directory): pages of lists, the pool machinery, serving threads, the watch stream.

mod pages;
mod pools;
mod serving_threads;
mod support;
mod watch;
