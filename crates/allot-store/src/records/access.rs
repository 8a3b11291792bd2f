//! The access part's table: API tokens and bindings made through the API, each under a key of
//! its own (`token/NAME`, `binding/NAME`), encoded as their store types.

use redb::TableDefinition;

/// `token/NAME` → `ApiTokenRecord`, `binding/NAME` → `BindingRecord`.
pub const ACCESS: TableDefinition<&str, &[u8]> = TableDefinition::new("access");

pub fn token_key(name: &str) -> String {
    format!("token/{name}")
}

pub fn binding_key(name: &str) -> String {
    format!("binding/{name}")
}
