//! The browser pages: the playground (`/` by default) and the operator
//! dashboard (`/dashboard`), single pages embedded in the binary with their
//! bundles under `/ui/` (built from `web/` by `web/build`; the npm packages
//! they bundle are pinned in `web/package-lock.json` and their licenses are
//! served as `/ui/licenses.txt`). Nothing is loaded from anywhere else: the
//! Content-Security-Policy allows this origin only.
//!
//! The pages are public (they hold no data); what they show comes from the
//! API with a key: the playground's own routes are in
//! [`playground`], the dashboard's data in [`dashboard`].

mod dashboard;
mod playground;

use std::sync::{Arc, LazyLock};

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use sha2::{Digest, Sha256};

use crate::api::ApiState;
use crate::api::http::error::ApiError;
use crate::follow::samples::History;
pub use playground::PlaygroundKey;

/// Paths the pages may not take: the API's own routes live under them.
const RESERVED_PREFIXES: &[&str] = &[
    "/v1", "/ui", "/api", "/judge0", "/healthz", "/readyz", "/metrics",
];

/// Longest page path accepted.
const MAX_PATH_CHARS: usize = 100;

/// The browser pages this server serves, validated.
#[derive(Debug)]
pub struct WebUi {
    /// Where the playground is served; `None`: no playground (and no
    /// `/v1/playground` routes).
    pub(crate) playground_path: Option<String>,
    /// Where the dashboard is served; `None`: no dashboard (and no
    /// `/v1/dashboard`).
    pub(crate) dashboard_path: Option<String>,
    /// The configured key the playground submits with for visitors who have
    /// none.
    pub(crate) playground_key: Option<PlaygroundKey>,
    /// The dashboard's plots, sampled while the server runs.
    pub(crate) history: Arc<History>,
}

impl WebUi {
    pub fn new(
        playground_path: Option<String>,
        dashboard_path: Option<String>,
        playground_key: Option<PlaygroundKey>,
    ) -> Self {
        Self {
            playground_path,
            dashboard_path,
            playground_key,
            history: Arc::new(History::new()),
        }
    }

    /// Any page at all (the `/ui/` assets are served then).
    fn any(&self) -> bool {
        self.playground_path.is_some() || self.dashboard_path.is_some()
    }
}

/// A page path from configuration: `off` (or empty) is `None`; else an
/// absolute path of letters, digits, `-`, `_`, `.` and `/`, without `//`,
/// a trailing `/` (but `/` itself) or a reserved prefix.
pub fn page_path(text: &str) -> Result<Option<String>, String> {
    let text = text.trim();
    if text.is_empty() || text.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let valid_chars = text
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
    if !text.starts_with('/')
        || !valid_chars
        || text.contains("//")
        || text.len() > MAX_PATH_CHARS
        || (text.len() > 1 && text.ends_with('/'))
    {
        return Err(format!(
            "{text:?} is not a path like /playground (letters, digits, '-', '_', '.', '/'; \
             at most {MAX_PATH_CHARS} characters, no trailing '/') or off"
        ));
    }
    if let Some(prefix) = RESERVED_PREFIXES
        .iter()
        .find(|p| text == **p || text.starts_with(&format!("{p}/")))
    {
        return Err(format!(
            "{text:?} is under {prefix}, which the API uses; choose another path"
        ));
    }
    Ok(Some(text.to_string()))
}

/// One embedded file.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
    /// The same body gzipped, sent to a browser that accepts gzip.
    gzip: Option<&'static [u8]>,
}

/// Every embedded file, each also under `/ui/`.
const ASSETS: &[Asset] = &[
    Asset {
        name: PLAYGROUND_PAGE,
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("../../../web/dist/playground.html"),
        gzip: None,
    },
    Asset {
        name: DASHBOARD_PAGE,
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("../../../web/dist/dashboard.html"),
        gzip: None,
    },
    Asset {
        name: "playground.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../../../web/dist/playground.js"),
        gzip: Some(include_bytes!("../../../web/dist/playground.js.gz")),
    },
    Asset {
        name: "playground.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../../../web/dist/playground.css"),
        gzip: None,
    },
    Asset {
        name: "dashboard.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../../../web/dist/dashboard.js"),
        gzip: None,
    },
    Asset {
        name: "dashboard.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../../../web/dist/dashboard.css"),
        gzip: None,
    },
    Asset {
        name: "licenses.txt",
        content_type: "text/plain; charset=utf-8",
        body: include_bytes!("../../../web/dist/THIRD-PARTY-LICENSES.txt"),
        gzip: None,
    },
];

const PLAYGROUND_PAGE: &str = "playground.html";
const DASHBOARD_PAGE: &str = "dashboard.html";

/// Scripts and styles from this origin only, connections (fetch and the
/// WebSocket) to this origin only. Inline styles are allowed because the
/// editor and the terminal set element styles at run time; inline scripts
/// are not.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
    style-src 'self' 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; \
    font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The strong validator of an embedded body: a prefix of its SHA-256.
fn etag_of(body: &[u8]) -> HeaderValue {
    let digest = hex::encode(Sha256::digest(body));
    HeaderValue::from_str(&format!("\"{}\"", &digest[..32]))
        .unwrap_or_else(|_| HeaderValue::from_static("\"0\""))
}

/// The validators of each of [`ASSETS`] (plain, gzipped), computed once.
static ETAGS: LazyLock<Vec<(HeaderValue, Option<HeaderValue>)>> = LazyLock::new(|| {
    ASSETS
        .iter()
        .map(|a| (etag_of(a.body), a.gzip.map(etag_of)))
        .collect()
});

/// Whether the request's `Accept-Encoding` takes gzip.
fn accepts_gzip(request_headers: &HeaderMap) -> bool {
    request_headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| {
            let mut parts = coding.split(';').map(str::trim);
            let name = parts.next().unwrap_or("");
            let refused = parts.any(|p| p.replace(' ', "") == "q=0");
            (name.eq_ignore_ascii_case("gzip") || name == "*") && !refused
        })
}

/// An embedded file (by its index in [`ASSETS`]) with its headers, gzipped
/// when there is a gzipped copy and the browser accepts it; 304 when the
/// browser has it already.
fn embedded(request_headers: &HeaderMap, index: usize) -> Response {
    let asset = &ASSETS[index];
    let (body, tag, gzipped) = match (asset.gzip, &ETAGS[index]) {
        (Some(gzip), (_, Some(tag))) if accepts_gzip(request_headers) => (gzip, tag.clone(), true),
        (_, (tag, _)) => (asset.body, tag.clone(), false),
    };
    let fresh = request_headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| v.trim() == tag);
    let headers = [
        (
            header::CONTENT_TYPE,
            HeaderValue::from_static(asset.content_type),
        ),
        // Revalidate every time: a new binary may carry new pages.
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (header::ETAG, tag),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
    ];
    let mut response = if fresh {
        (StatusCode::NOT_MODIFIED, headers).into_response()
    } else {
        (headers, body).into_response()
    };
    if asset.gzip.is_some() {
        let headers = response.headers_mut();
        headers.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
        if gzipped {
            headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        }
    }
    response
}

fn index_of(name: &str) -> Option<usize> {
    ASSETS.iter().position(|a| a.name == name)
}

fn page(headers: &HeaderMap, name: &str) -> Response {
    match index_of(name) {
        Some(index) => embedded(headers, index),
        None => ApiError::NotFound("no such page").into_response(),
    }
}

async fn playground_page(headers: HeaderMap) -> Response {
    page(&headers, PLAYGROUND_PAGE)
}

async fn dashboard_page(headers: HeaderMap) -> Response {
    page(&headers, DASHBOARD_PAGE)
}

/// `GET /ui/{file}`.
async fn asset(Path(name): Path<String>, headers: HeaderMap) -> Response {
    page(&headers, &name)
}

/// The routes of the pages `web` enables, and of their data.
pub(crate) fn routes(web: &WebUi) -> Router<ApiState> {
    let mut router = Router::new();
    if let Some(path) = &web.playground_path {
        router = router
            .route(path, get(playground_page))
            .route("/v1/playground", get(playground::settings))
            .route("/v1/playground/jobs", post(playground::submit));
    }
    if let Some(path) = &web.dashboard_path {
        router = router
            .route(path, get(dashboard_page))
            .route("/v1/dashboard", get(dashboard::overview));
    }
    if web.any() {
        router = router.route("/ui/{file}", get(asset));
    }
    router
}

/// The pages' settings, for handlers reached only when they are on.
pub(crate) fn settings(state: &ApiState) -> Result<&WebUi, ApiError> {
    state
        .web
        .as_deref()
        .ok_or(ApiError::NotFound("no such route"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_paths_are_checked() {
        assert_eq!(page_path("/").unwrap().as_deref(), Some("/"));
        assert_eq!(
            page_path(" /playground ").unwrap().as_deref(),
            Some("/playground")
        );
        assert_eq!(
            page_path("/ops/dash-board_1.0").unwrap().as_deref(),
            Some("/ops/dash-board_1.0")
        );
        for off in ["off", "OFF", "", "  "] {
            assert_eq!(page_path(off).unwrap(), None, "{off:?}");
        }
        for bad in [
            "playground",
            "/play ground",
            "/play//ground",
            "/playground/",
            "/x?y",
            "/ü",
        ] {
            let error = page_path(bad).unwrap_err();
            assert!(
                error.contains("is not a path like /playground"),
                "{bad:?}: {error}"
            );
        }
        for reserved in [
            "/v1", "/v1/jobs", "/ui/x", "/metrics", "/healthz", "/api/v2",
        ] {
            let error = page_path(reserved).unwrap_err();
            assert!(
                error.contains("which the API uses"),
                "{reserved:?}: {error}"
            );
        }
        assert!(page_path("/v10").is_ok());
        assert!(page_path(&format!("/{}", "a".repeat(100))).is_err());
    }

    #[test]
    fn embedded_files_have_an_etag_and_answer_304() {
        let index = index_of("licenses.txt").unwrap();
        let first = embedded(&HeaderMap::new(), index);
        assert_eq!(first.status(), StatusCode::OK);
        let tag = first.headers()[header::ETAG].clone();
        assert_eq!(tag, etag_of(ASSETS[index].body));
        assert!(first.headers().get(header::CONTENT_ENCODING).is_none());
        assert!(
            first.headers()[header::CONTENT_SECURITY_POLICY]
                .to_str()
                .unwrap()
                .contains("script-src 'self'")
        );
        let mut again = HeaderMap::new();
        again.insert(header::IF_NONE_MATCH, tag);
        assert_eq!(embedded(&again, index).status(), StatusCode::NOT_MODIFIED);
        again.insert(header::IF_NONE_MATCH, HeaderValue::from_static("\"other\""));
        assert_eq!(embedded(&again, index).status(), StatusCode::OK);
    }

    #[test]
    fn the_big_bundle_goes_gzipped_to_browsers_that_take_gzip() {
        let index = index_of("playground.js").unwrap();
        let gzip = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static(value));
            embedded(&headers, index)
        };
        for accepted in ["gzip, deflate, br", "br;q=1.0, GZIP;q=0.5", "*"] {
            let response = gzip(accepted);
            assert_eq!(
                response.headers()[header::CONTENT_ENCODING],
                "gzip",
                "{accepted}"
            );
            assert_eq!(response.headers()[header::VARY], "accept-encoding");
            assert_ne!(response.headers()[header::ETAG], ETAGS[index].0);
        }
        for refused in ["br", "gzip;q=0", "identity"] {
            let response = gzip(refused);
            assert!(
                response.headers().get(header::CONTENT_ENCODING).is_none(),
                "{refused}"
            );
            assert_eq!(response.headers()[header::ETAG], ETAGS[index].0);
        }
        let plain = ASSETS[index].body;
        let packed = ASSETS[index].gzip.unwrap();
        assert_eq!(&packed[..2], [0x1f, 0x8b]);
        assert!(packed.len() * 2 < plain.len());
    }

    #[test]
    fn the_pages_load_only_what_is_embedded() {
        let text = |name| std::str::from_utf8(ASSETS[index_of(name).unwrap()].body).unwrap();
        let (playground, dashboard) = (text(PLAYGROUND_PAGE), text(DASHBOARD_PAGE));
        for (page, files) in [
            (playground, ["/ui/playground.js", "/ui/playground.css"]),
            (dashboard, ["/ui/dashboard.js", "/ui/dashboard.css"]),
        ] {
            for file in files {
                assert!(page.contains(file), "{file}");
                assert!(
                    index_of(file.trim_start_matches("/ui/")).is_some(),
                    "{file}"
                );
            }
            assert!(!page.contains("http://") && !page.contains("https://"));
        }
        let licenses = text("licenses.txt");
        for package in ["codemirror 6.0.2", "@xterm/xterm 6.0.0"] {
            assert!(licenses.contains(package), "{package}");
        }
    }
}
