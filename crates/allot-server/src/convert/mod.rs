//! Conversions between wire types (`allot_api`) and domain types (`allot_core`, `allot_store`),
//! one module per part, and `watch` (the change feed's events, by the parts' conversions). Input
//! is validated here, once, on its way in.

pub(crate) mod apps;
pub(crate) mod pools;
pub(crate) mod quotas;
pub(crate) mod runs;
pub(crate) mod watch;
