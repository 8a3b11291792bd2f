//! The plugins that come with allot.

mod noop;
mod shell;
mod sleep;

use crate::plugin::PluginEntry;

/// Every built-in plugin's entry.
pub fn entries() -> Vec<PluginEntry> {
    vec![noop::entry(), shell::entry(), sleep::entry()]
}
