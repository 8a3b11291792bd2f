//! Extractors whose rejections are `ApiError`s, so bad input always gets a JSON error with a code.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// A JSON request body: one JSON object. The content type is not checked (so `curl -d` works),
/// and an empty body reads as `{}`. Anything else (an array such as `[10]`, which serde would
/// otherwise read field by field into a struct, a number, a string) is refused.
pub(crate) struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", "the request body is too large")
            } else {
                ApiError::invalid_json(rejection.body_text())
            }
        })?;
        json_object(&bytes).map(JsonBody)
    }
}

/// A request body read as [`JsonBody`] reads it.
pub(crate) fn json_object<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // No body is an empty object; a body of JSON's whitespace only is no JSON document (the
    // document says the body is optional, not that it may be blank).
    if bytes.is_empty() {
        return crate::objects::from_slice(b"{}")
            .map_err(|err| ApiError::invalid_json(format!("the request body is not valid: {err}")));
    }
    let text: &[u8] = match bytes.iter().find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r')) {
        None => {
            return Err(ApiError::invalid_json(
                "the request body is only whitespace: send none, or a JSON object, e.g. {\"units\": 1}",
            ))
        }
        Some(b'{') => bytes,
        Some(_) => return Err(ApiError::invalid_json("the request body must be a JSON object, e.g. {\"quota\": 10}")),
    };
    crate::objects::from_slice(text)
        .map_err(|err| ApiError::invalid_json(format!("the request body is not valid: {err}")))
}

/// Path parameters, percent-decoded.
pub(crate) struct Segments<T>(pub T);

impl<S, T> FromRequestParts<S> for Segments<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Send,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(Segments(value)),
            Err(rejection) => Err(ApiError::new(StatusCode::BAD_REQUEST, "invalid_name", rejection.body_text())),
        }
    }
}

/// Query parameters.
pub(crate) struct QueryArgs<T>(pub T);

impl<S, T> FromRequestParts<S> for QueryArgs<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(value)) => Ok(QueryArgs(value)),
            Err(rejection) => Err(ApiError::invalid_argument(rejection.body_text())),
        }
    }
}
