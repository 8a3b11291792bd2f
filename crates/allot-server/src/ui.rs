//! The web dashboard: files compiled into the binary (`ui/`: the page, its script and the two
//! modules it imports, its style; no library, nothing fetched from elsewhere), served at `/ui`. Every path under `/ui`
//! answers the page, whose script shows the one its URL names; `/` sends the browser there.
//!
//! The files are open to anyone (they hold no data): what the page shows it reads from the API
//! with the caller's token, as any client does.

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};

const PAGE: &str = include_str!("../ui/index.html");
const SCRIPT: &str = include_str!("../ui/app.js");
/// The resource text form's reader and the event stream's (`testdata/` holds their cases).
const RESOURCES: &str = include_str!("../ui/resources.js");
const SSE: &str = include_str!("../ui/sse.js");
const STYLE: &str = include_str!("../ui/style.css");

/// The page may load its own files only, and talk to this daemon only.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; \
                      connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

fn file(body: &'static str, kind: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    // Small, and changed with the binary: read again each time, answered from memory.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    response
}

/// `GET /ui` and every path under it: the page.
pub(crate) async fn page() -> Response {
    file(PAGE, "text/html; charset=utf-8")
}

/// `GET /ui/assets/{file}`: the page's scripts and style.
pub(crate) async fn asset(Path(name): Path<String>) -> Response {
    match name.as_str() {
        "app.js" => file(SCRIPT, "text/javascript; charset=utf-8"),
        "resources.js" => file(RESOURCES, "text/javascript; charset=utf-8"),
        "sse.js" => file(SSE, "text/javascript; charset=utf-8"),
        "style.css" => file(STYLE, "text/css; charset=utf-8"),
        _ => (StatusCode::NOT_FOUND, "no such file").into_response(),
    }
}

/// `GET /`: the dashboard.
pub(crate) async fn root() -> Redirect {
    Redirect::to("/ui")
}
