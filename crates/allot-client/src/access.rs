//! Identity and access: API tokens and bindings made through the API (`admin` on the daemon).

use reqwest::Method;

use crate::path::encode_segment;
use crate::*;

impl Client {
    /// `POST /v1/api-tokens`: makes a token; the answer shows it this once.
    pub async fn create_api_token(&self, token: &CreateApiToken) -> Result<CreatedApiToken, ClientError> {
        self.json(self.request(Method::POST, "/v1/api-tokens")?.json(token)).await
    }

    /// `GET /v1/api-tokens`.
    pub async fn api_tokens(&self) -> Result<ApiTokenList, ClientError> {
        self.json(self.request(Method::GET, "/v1/api-tokens")?).await
    }

    /// `DELETE /v1/api-tokens/{name}`: revokes it, on every daemon within a second.
    pub async fn revoke_api_token(&self, name: &str) -> Result<ApiToken, ClientError> {
        self.json(self.request(Method::DELETE, &format!("/v1/api-tokens/{}", encode_segment(name)))?).await
    }

    /// `PUT /v1/bindings/{name}`.
    pub async fn put_binding(&self, name: &str, binding: &PutBinding) -> Result<Binding, ClientError> {
        self.json(self.request(Method::PUT, &format!("/v1/bindings/{}", encode_segment(name)))?.json(binding)).await
    }

    /// `GET /v1/bindings`.
    pub async fn bindings(&self) -> Result<BindingList, ClientError> {
        self.json(self.request(Method::GET, "/v1/bindings")?).await
    }

    /// `DELETE /v1/bindings/{name}`.
    pub async fn remove_binding(&self, name: &str) -> Result<Binding, ClientError> {
        self.json(self.request(Method::DELETE, &format!("/v1/bindings/{}", encode_segment(name)))?).await
    }

    /// `GET /v1/whoami`: who the caller is, and which of `checks` (`use:namespace:hive:a`,
    /// `admin:pool:gpu`, `use:queue:root.a`, `read:daemon`) it may do.
    pub async fn whoami(&self, checks: &[&str]) -> Result<WhoAmI, ClientError> {
        let query: Vec<(&str, &str)> = checks.iter().map(|check| ("can", *check)).collect();
        self.json(self.request(Method::GET, "/v1/whoami")?.query(&query)).await
    }
}
