//! Building request paths: every caller-supplied segment (namespace, token, session id) is
//! percent-encoded, so tokens with `/`, `?`, `#`, `%`, spaces or non-ASCII text stay one segment.

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use crate::ClientError;

/// Everything but the unreserved characters of RFC 3986 (`A-Z a-z 0-9 - . _ ~`).
const NOT_UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// Percent-encodes every byte of `segment` except the unreserved characters.
pub(crate) fn encode_segment(segment: &str) -> String {
    utf8_percent_encode(segment, NOT_UNRESERVED).to_string()
}

/// Encodes `value` as one path segment, naming it `what` in errors.
///
/// An empty value would name another route, and `.` and `..` cannot be sent at all: URL parsers treat them (even percent-encoded, as `%2E`) as
/// "this folder" and "the parent folder" and drop them from the path, so the request would reach
/// another route.
pub(crate) fn segment(what: &str, value: &str) -> Result<String, ClientError> {
    if value.is_empty() {
        return Err(ClientError::InvalidUrl(format!("{what} must not be empty")));
    }
    if value == "." || value == ".." {
        return Err(ClientError::InvalidUrl(format!(
            "{what} `{value}` cannot be sent in a URL path: `.` and `..` are path navigation"
        )));
    }
    Ok(encode_segment(value))
}

pub(crate) fn namespace_path(namespace: &str) -> Result<String, ClientError> {
    Ok(format!("/v1/namespaces/{}", segment("namespace", namespace)?))
}

pub(crate) fn grant_path(namespace: &str, token: &str) -> Result<String, ClientError> {
    Ok(format!("{}/grants/{}", namespace_path(namespace)?, segment("token", token)?))
}

pub(crate) fn pool_path(pool: &str) -> Result<String, ClientError> {
    Ok(format!("/v1/pools/{}", segment("pool", pool)?))
}

pub(crate) fn alloc_path(pool: &str, alloc: &str) -> Result<String, ClientError> {
    Ok(format!("{}/allocs/{}", pool_path(pool)?, segment("alloc", alloc)?))
}

pub(crate) fn queue_path(queue: &str) -> Result<String, ClientError> {
    Ok(format!("/v1/queues/{}", segment("queue", queue)?))
}

pub(crate) fn app_path(app: &str) -> Result<String, ClientError> {
    Ok(format!("/v1/apps/{}", segment("application", app)?))
}

pub(crate) fn task_path(app: &str, task: &str) -> Result<String, ClientError> {
    Ok(format!("{}/tasks/{}", app_path(app)?, segment("task", task)?))
}

pub(crate) fn session_path(id: &str) -> Result<String, ClientError> {
    Ok(format!("/v1/sessions/{}", segment("session id", id)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_all_but_unreserved() {
        assert_eq!(encode_segment("hive:cluster-a"), "hive%3Acluster-a");
        assert_eq!(encode_segment("a/b c?d#e%f"), "a%2Fb%20c%3Fd%23e%25f");
        assert_eq!(encode_segment("Az09-._~"), "Az09-._~");
        assert_eq!(encode_segment("é"), "%C3%A9");
        assert_eq!(encode_segment("+&="), "%2B%26%3D");
    }

    #[test]
    fn refuses_dot_segments() {
        assert!(segment("token", ".").is_err());
        assert!(segment("token", "..").is_err());
        assert!(segment("token", "").is_err());
        assert_eq!(segment("token", "...").unwrap(), "...");
    }
}
