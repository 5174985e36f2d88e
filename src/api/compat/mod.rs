//! APIs compatible with Piston v2 ([`piston`]), Judge0 CE ([`judge0`]) and
//! Jobe ([`jobe`], Moodle CodeRunner's server):
//! thin adapters that turn the other product's request into an ordinary
//! [`JobSpec`], submit it through the same path as `POST /v1/jobs`
//! (`prepare`, then the one submit path, [`crate::api::v1::submit`]: an
//! atomic `Store::submit` with the queue-depth and per-key admission
//! checks), wait with the same `wait_for_end`, and turn the job's result
//! into the other product's answer. Jobs submitted here are ordinary jobs:
//! queued, limited, metered (`code_runner_jobs_total`, the rejection
//! counter) and visible in `GET /v1/jobs/{id}` to the same key.
//!
//! Each adapter answers in its original's shapes, errors included; what
//! differs from the original is written in `docs/migrating.md`.

mod cors;
mod jobe;
mod judge0;
mod piston;

pub use cors::CorsOrigins;

use std::net::SocketAddr;

use axum::Router;
use axum::extract::{ConnectInfo, Query};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};

use crate::api::ApiState;
use crate::api::http::auth::Caller;
use crate::api::http::error::ApiError;
use crate::api::http::refusals::{count_refusal, count_rejection};
use crate::api::v1::submit::{Admitted, Submission, refuse_while_draining};
use crate::job::{JobSpec, prepare};
use crate::languages::LanguageCatalog;

/// Where the compatible APIs are served (`None`: not served), and Piston's
/// keyless mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompatConfig {
    pub piston_prefix: Option<String>,
    /// A key name: Piston requests without a key from a loopback address are
    /// served as this key.
    pub piston_loopback_key: Option<String>,
    pub judge0_prefix: Option<String>,
    /// Which origins' pages may call the Judge0 API from a browser.
    pub judge0_cors: CorsOrigins,
    pub jobe_prefix: Option<String>,
    /// A key name: Jobe requests without a code-runner key are served as
    /// this key (Jobe without API keys); `None`: a key is required.
    pub jobe_key: Option<String>,
    /// Which origins' pages may call the Jobe API from a browser.
    pub jobe_cors: CorsOrigins,
    /// The most `cputime` a Jobe run may ask for (Jobe's
    /// `cputime_upper_limit_secs`), within the server's CPU maximum.
    pub jobe_max_cputime_secs: u64,
}

impl Default for CompatConfig {
    fn default() -> Self {
        Self {
            piston_prefix: Some("/api/v2".into()),
            piston_loopback_key: None,
            judge0_prefix: Some("/judge0".into()),
            judge0_cors: CorsOrigins::Any,
            jobe_prefix: Some("/jobe/index.php/restapi".into()),
            jobe_key: None,
            jobe_cors: CorsOrigins::Any,
            jobe_max_cputime_secs: 120,
        }
    }
}

/// The routes of the enabled compatible APIs, under their prefixes.
pub(super) fn router(config: &CompatConfig) -> Router<ApiState> {
    let mut router = Router::new();
    if let Some(prefix) = &config.piston_prefix {
        router = router.nest(prefix, piston::router());
    }
    if let Some(prefix) = &config.judge0_prefix {
        router = router.nest(prefix, with_cors(judge0::router(), &config.judge0_cors));
    }
    if let Some(prefix) = &config.jobe_prefix {
        router = router.nest(prefix, with_cors(jobe::router(), &config.jobe_cors));
    }
    router
}

/// `routes` answering cross-origin requests and preflights of `origins`.
fn with_cors(routes: Router<ApiState>, origins: &CorsOrigins) -> Router<ApiState> {
    match origins.layer() {
        // The 405 is set here, before the layer, so that a preflight
        // (OPTIONS, which no route takes) reaches the layer: the whole
        // API's 405 replaces only the routes' default ones.
        Some(cors) => routes
            .method_not_allowed_fallback(crate::api::http::method_not_allowed)
            .layer(cors),
        None => routes,
    }
}

/// A credential presented in the header `name` or, as Judge0 reads them,
/// in a query parameter of the same name (any case): `?X-Auth-Token=…`.
pub(super) fn named_credential(parts: &Parts, name: &str) -> Option<String> {
    if let Some(value) = parts.headers.get(name)
        && let Ok(text) = value.to_str()
    {
        return Some(text.trim().to_string());
    }
    let Query(pairs) = Query::<Vec<(String, String)>>::try_from_uri(&parts.uri).ok()?;
    pairs
        .into_iter()
        .find(|(key, _)| key.eq_ignore_ascii_case(name))
        .map(|(_, value)| value.trim().to_string())
}

/// A key presented in `header` (Judge0's `X-Auth-Token`, or the query
/// parameter of that name), or as `Authorization: Bearer <key>` or
/// `Authorization: <key>`.
fn presented_key(parts: &Parts, header: Option<&str>) -> Option<String> {
    if let Some(key) = header.and_then(|name| named_credential(parts, name)) {
        return Some(key);
    }
    let value = parts
        .headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let value = value.trim();
    Some(
        value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .unwrap_or(value)
            .trim()
            .to_string(),
    )
}

/// Whether the request came from a loopback address (only known when the
/// server was started with connection info, as `serve` does).
fn from_loopback(parts: &Parts) -> bool {
    parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .is_some_and(|ConnectInfo(peer)| peer.ip().is_loopback())
}

/// An answer that ends a request early (boxed: a `Response` is large).
struct Refusal(Box<Response>);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        *self.0
    }
}

impl From<Response> for Refusal {
    fn from(response: Response) -> Self {
        Self(Box::new(response))
    }
}

/// Why a compat request was refused before its handler ran.
enum CallerRefusal {
    /// No valid key (and not Piston's keyless loopback caller): 401 in the
    /// API's own shape.
    NoKey,
    /// Over the key's rate (the same buckets as `/v1`): 429.
    Rate(ApiError),
}

/// Who a compat request is — a configured key, or (Piston, loopback only)
/// the configured keyless caller — within its key's rate. A refused
/// `submission` counts in `submissions_rejected_total`.
/// The header a Piston or Judge0 request names its end user with (the
/// `user` of `POST /v1/jobs`; checked the same way).
pub const USER_HEADER: &str = "x-code-runner-user";

fn compat_caller(
    state: &ApiState,
    parts: &Parts,
    header: Option<&str>,
    keyless: bool,
    submission: bool,
) -> Result<Caller, CallerRefusal> {
    let caller = match presented_key(parts, header) {
        Some(key) if !key.is_empty() => state.keys().check(&key),
        _ if keyless && from_loopback(parts) => state
            .compat
            .piston_loopback_key
            .as_deref()
            .and_then(|name| state.keys().caller(name)),
        _ => None,
    };
    let refusal = match caller {
        None => CallerRefusal::NoKey,
        Some(caller) => match within_rate(state, parts, caller) {
            Ok(caller) => return Ok(caller),
            Err(error) => CallerRefusal::Rate(error),
        },
    };
    if submission {
        let reason = match &refusal {
            CallerRefusal::NoKey => "unauthorized",
            CallerRefusal::Rate(_) => "rate_limited",
        };
        count_refusal(state, reason);
    }
    Err(refusal)
}

/// `caller` within its key's rate (the same buckets as `/v1`), with the
/// end user its request names in [`USER_HEADER`].
fn within_rate(state: &ApiState, parts: &Parts, mut caller: Caller) -> Result<Caller, ApiError> {
    state.key_rate.check(Some(&caller.name))?;
    caller.end_user = parts
        .headers
        .get(USER_HEADER)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    Ok(caller)
}

/// A new job id.
fn new_job_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Submits `spec` as `caller` under the new job id `id`, like `POST /v1/jobs` does: refused while the
/// server drains, validated by `prepare` against `catalog` (the languages on
/// offer), then admitted and queued through the one submit path. Every
/// refusal is counted in `code_runner_submissions_rejected_total`.
async fn submit(
    state: &ApiState,
    caller: &Caller,
    id: String,
    spec: &JobSpec,
    catalog: &LanguageCatalog,
) -> Result<Admitted, ApiError> {
    let submitted = submit_uncounted(state, caller, id, spec, catalog).await;
    if let Err(error) = &submitted {
        count_rejection(state, error);
    }
    submitted
}

async fn submit_uncounted(
    state: &ApiState,
    caller: &Caller,
    id: String,
    spec: &JobSpec,
    catalog: &LanguageCatalog,
) -> Result<Admitted, ApiError> {
    refuse_while_draining(state)?;
    let with_user;
    let spec = match &caller.end_user {
        Some(user) if spec.user.is_none() => {
            with_user = JobSpec {
                user: Some(user.clone()),
                ..spec.clone()
            };
            &with_user
        }
        _ => spec,
    };
    let prepared = prepare(spec, catalog, &state.inner.policy)?;
    crate::api::v1::files::check_references(state, caller, spec, &prepared).await?;
    let via = spec
        .metadata
        .get("via")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    crate::api::v1::submit::submit(
        state,
        Submission {
            caller,
            id,
            spec,
            prepared,
            idempotency: None,
            carry: false,
            via: Some(via),
        },
    )
    .await
}

/// A version as `major.minor.patch`, as Piston's clients compare them: `3.11`
/// is `3.11.0`, `17` is `17.0.0`.
fn semver3(version: &str) -> String {
    let mut parts: Vec<&str> = version.split('.').take(3).collect();
    while parts.len() < 3 {
        parts.push("0");
    }
    parts.join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(uri: &str, headers: &[(&str, &str)]) -> Parts {
        let mut request = axum::http::Request::builder().uri(uri);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn keys_come_from_bearer_raw_the_named_header_or_its_query_parameter() {
        let key = |uri, headers: &[(&str, &str)], name| presented_key(&parts(uri, headers), name);
        assert_eq!(key("/", &[], None), None);
        assert_eq!(
            key("/", &[("authorization", "Bearer abc")], None).as_deref(),
            Some("abc")
        );
        assert_eq!(
            key("/", &[("authorization", "rawkey")], None).as_deref(),
            Some("rawkey")
        );
        let both = [("authorization", "rawkey"), ("x-auth-token", "judge")];
        assert_eq!(
            key("/", &both, Some("x-auth-token")).as_deref(),
            Some("judge")
        );
        // The header's name as a query parameter, percent-decoded, any case;
        // the header first.
        let name = Some("x-auth-token");
        assert_eq!(
            key("/a?X-Auth-Token=q%2Bkey&b=1", &[], name).as_deref(),
            Some("q+key")
        );
        assert_eq!(
            key("/a?x-auth-token=lower", &[], name).as_deref(),
            Some("lower")
        );
        assert_eq!(
            key("/a?X-Auth-Token=q", &both[1..], name).as_deref(),
            Some("judge")
        );
        assert_eq!(key("/a?X-Auth-Token=q", &[], None), None);
    }

    #[test]
    fn versions_get_three_parts() {
        assert_eq!(semver3("3.11"), "3.11.0");
        assert_eq!(semver3("17"), "17.0.0");
        assert_eq!(semver3("1.2.3"), "1.2.3");
    }
}
