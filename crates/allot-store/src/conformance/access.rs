//! The conformance checks of the access part: API tokens and bindings kept in the store, each
//! change moving the version, names unique, revocation answering what it removed.

use std::sync::Arc;

use allot_core::access::AccessError;

use crate::{ApiTokenRecord, BindingRecord, Store, StoreError};

/// Runs every check of the access part against `store` (its tokens and bindings are named
/// `conformance-...`; others may exist).
pub async fn run_access(store: Arc<dyn Store>) {
    let store = &*store;
    let token = |name: &str, hash: &str| ApiTokenRecord {
        name: format!("conformance-{name}"),
        hash: format!("sha256:{hash:0>64}"),
        user: "ada".into(),
        groups: vec!["hive".into()],
        created: 1,
        expires: Some(2_000_000_000_000),
    };
    let before = store.access_version().await.unwrap();
    store.add_api_token(token("a", "1")).await.unwrap();
    let after_add = store.access_version().await.unwrap();
    assert!(after_add > before, "a change moves the version: {before} then {after_add}");
    let again = store.add_api_token(token("a", "2")).await;
    assert!(matches!(again, Err(StoreError::Access(AccessError::TokenExists(_)))), "{again:?}");
    assert_eq!(store.access_version().await.unwrap(), after_add, "a refused change does not move it");
    store.add_api_token(token("b", "3")).await.unwrap();

    let records = store.access_records().await.unwrap();
    assert!(records.version >= after_add);
    let mine: Vec<&ApiTokenRecord> = records.tokens.iter().filter(|t| t.name.starts_with("conformance-")).collect();
    assert_eq!(mine, vec![&token("a", "1"), &token("b", "3")], "kept as given, in name order");

    let revoked = store.revoke_api_token("conformance-a").await.unwrap();
    assert_eq!(revoked, token("a", "1"), "a revocation answers what it removed");
    let missing = store.revoke_api_token("conformance-a").await;
    assert!(matches!(missing, Err(StoreError::Access(AccessError::TokenNotFound(_)))), "{missing:?}");
    let records = store.access_records().await.unwrap();
    assert!(!records.tokens.iter().any(|t| t.name == "conformance-a"));
    // A name revoked may be used again.
    store.add_api_token(token("a", "4")).await.unwrap();

    let binding = |role: &str| BindingRecord {
        name: "conformance-binding".into(),
        role: role.into(),
        users: vec!["ada".into()],
        groups: vec!["hive".into()],
    };
    let version = store.access_version().await.unwrap();
    store.put_binding(binding("reader")).await.unwrap();
    store.put_binding(binding("admin")).await.unwrap();
    assert!(store.access_version().await.unwrap() >= version + 2);
    let records = store.access_records().await.unwrap();
    let mine: Vec<&BindingRecord> = records.bindings.iter().filter(|b| b.name.starts_with("conformance-")).collect();
    assert_eq!(mine, vec![&binding("admin")], "a put replaces");
    assert_eq!(store.remove_binding("conformance-binding").await.unwrap(), binding("admin"));
    let missing = store.remove_binding("conformance-binding").await;
    assert!(matches!(missing, Err(StoreError::Access(AccessError::BindingNotFound(_)))), "{missing:?}");
    for name in ["conformance-a", "conformance-b"] {
        store.revoke_api_token(name).await.unwrap();
    }
}
