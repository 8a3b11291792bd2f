//! The access part of the embedded store: API tokens and bindings, in memory and written through
//! the same group commit as everything else. One daemon uses an embedded store, so the version
//! lives in memory: it moves with every change this process makes.

use std::collections::BTreeMap;

use super::read::Records;
use allot_core::access::AccessError;
use async_trait::async_trait;

use super::ops::{Op, Table};
use super::{durable, EmbeddedStore, OpenError};
use crate::access::{AccessRecords, AccessStore, ApiTokenRecord, BindingRecord};
use crate::records::access::{binding_key, token_key, ACCESS};
use crate::records::{decode, encode};
use crate::StoreError;

#[derive(Debug, Default)]
pub(super) struct Access {
    tokens: BTreeMap<String, ApiTokenRecord>,
    bindings: BTreeMap<String, BindingRecord>,
    pub(super) version: u64,
}

impl Access {
    pub(super) fn set_version(&mut self, version: u64) {
        self.version = version;
    }
}

pub(super) fn load(records: &Records<'_, '_>) -> Result<Access, OpenError> {
    let mut access = Access { version: 1, ..Access::default() };
    records.names(ACCESS, Table::Access, |key, value| {
        if let Some(name) = key.strip_prefix("token/") {
            access.tokens.insert(name.to_owned(), decode("access", key, value)?);
        } else if let Some(name) = key.strip_prefix("binding/") {
            access.bindings.insert(name.to_owned(), decode("access", key, value)?);
        }
        Ok(())
    })?;
    Ok(access)
}

impl EmbeddedStore {
    /// Changes the access part under the state's lock, and waits until the change is durable.
    async fn change_access<T>(
        &self,
        change: impl FnOnce(&mut Access) -> Result<(T, Op), StoreError>,
    ) -> Result<T, StoreError> {
        let (value, rx) = {
            let mut state = self.lock();
            state.usable(&self.shared)?;
            match change(&mut state.access) {
                Ok((value, op)) => {
                    state.access.version += 1;
                    (Ok(value), state.submit_ops(&self.shared, vec![op]))
                }
                // A refusal (a name taken) is answered once what it saw is durable.
                Err(err) => {
                    let now = self.shared.clock.now();
                    (Err(err), state.barrier(&self.shared, now))
                }
            }
        };
        durable(rx).await?;
        value
    }
}

#[async_trait]
impl AccessStore for EmbeddedStore {
    async fn add_api_token(&self, token: ApiTokenRecord) -> Result<(), StoreError> {
        self.change_access(|access| {
            if access.tokens.contains_key(&token.name) {
                return Err(AccessError::TokenExists(token.name.clone()).into());
            }
            if access.tokens.values().any(|t| t.hash == token.hash) {
                return Err(AccessError::Invalid("a token with this hash exists".into()).into());
            }
            let op = Op::put(Table::Access, Op::name(&token_key(&token.name)), encode(&token));
            access.tokens.insert(token.name.clone(), token);
            Ok(((), op))
        })
        .await
    }

    async fn revoke_api_token(&self, name: &str) -> Result<ApiTokenRecord, StoreError> {
        self.change_access(|access| {
            let token = access.tokens.remove(name).ok_or_else(|| AccessError::TokenNotFound(name.to_owned()))?;
            Ok((token, Op::Remove(Table::Access, Op::name(&token_key(name)))))
        })
        .await
    }

    async fn put_binding(&self, binding: BindingRecord) -> Result<(), StoreError> {
        self.change_access(|access| {
            let op = Op::put(Table::Access, Op::name(&binding_key(&binding.name)), encode(&binding));
            access.bindings.insert(binding.name.clone(), binding);
            Ok(((), op))
        })
        .await
    }

    async fn remove_binding(&self, name: &str) -> Result<BindingRecord, StoreError> {
        self.change_access(|access| {
            let binding = access.bindings.remove(name).ok_or_else(|| AccessError::BindingNotFound(name.to_owned()))?;
            Ok((binding, Op::Remove(Table::Access, Op::name(&binding_key(name)))))
        })
        .await
    }

    async fn access_records(&self) -> Result<AccessRecords, StoreError> {
        self.read_state(|state, _| {
            Ok(AccessRecords {
                version: state.access.version,
                tokens: state.access.tokens.values().cloned().collect(),
                bindings: state.access.bindings.values().cloned().collect(),
            })
        })
    }

    async fn access_version(&self) -> Result<u64, StoreError> {
        self.read_state(|state, _| Ok(state.access.version))
    }
}
