//! allot-server in-process (`api()` with `oneshot`) over a real embedded store.

mod api;
