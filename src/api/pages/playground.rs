//! The playground's routes (the page itself is in [`super`]):
//!
//! - `GET /v1/playground` (public): what the page needs to know before
//!   anyone signs in: whether a shared playground key is configured, its
//!   `max_active`, and where the dashboard is.
//! - `POST /v1/playground/jobs` (public, only with a shared key): the same
//!   submit as `POST /v1/jobs`, made with the operator's playground key
//!   (`CODE_RUNNER_PLAYGROUND_KEY`) so a visitor needs no key of their own.
//!   The answer carries the job's attach token, which is all the page uses
//!   afterwards (the stream, its input and its `kill`); the key itself never
//!   leaves the server.
//!
//! The shared key is one of the configured API keys, with every limit of
//! one: its `max_active` caps how many playground jobs are queued or running
//! at once, and the queue's own limit still applies. It may not be an admin
//! key. Idempotency keys are refused on this route: everyone shares the key,
//! so a replayed idempotency key would hand one visitor another's job.

use axum::Json;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::api::ApiState;
use crate::api::http::auth::ApiKeys;
use crate::api::http::error::ApiError;

/// The configured key the playground submits with.
#[derive(Clone)]
pub struct PlaygroundKey {
    name: String,
    /// `Bearer <key>`, ready for the request the server makes for a visitor.
    authorization: HeaderValue,
    max_active: u64,
}

impl std::fmt::Debug for PlaygroundKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlaygroundKey")
            .field("name", &self.name)
            .field("max_active", &self.max_active)
            .finish_non_exhaustive()
    }
}

impl PlaygroundKey {
    /// The key named `name` in `api_keys` (the `CODE_RUNNER_API_KEYS` text,
    /// already parsed into `keys`). It must exist, have a `max_active` and
    /// no admin scope. Errors never repeat a key.
    pub fn from_config(name: &str, api_keys: &str, keys: &ApiKeys) -> Result<Self, String> {
        let secret = api_keys
            .split(',')
            .map(str::trim)
            .find_map(|entry| {
                let mut parts = entry.split(':');
                (parts.next() == Some(name)).then(|| parts.next())?
            })
            .ok_or_else(|| {
                format!(
                    "{name:?} is not the name of a key in CODE_RUNNER_API_KEYS (configured: {})",
                    keys.names().collect::<Vec<_>>().join(", ")
                )
            })?;
        let caller = keys
            .check(secret)
            .filter(|caller| caller.name == name)
            .ok_or_else(|| format!("key {name:?} is not a valid configured key"))?;
        if caller.admin {
            return Err(format!(
                "key {name:?} has the admin scope; the playground key is used by anyone who opens the page, so give it a key without admin"
            ));
        }
        let max_active = caller.max_active.ok_or_else(|| {
            format!(
                "key {name:?} has no max_active; the playground key needs a low one (e.g. {name}:<key>:4) so visitors cannot fill the queue"
            )
        })?;
        let authorization = HeaderValue::from_str(&format!("Bearer {secret}"))
            .map_err(|_| format!("key {name:?} cannot be sent in a header"))?;
        Ok(Self {
            name: name.to_string(),
            authorization,
            max_active,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

/// The answer of `GET /v1/playground`.
#[derive(Debug, Serialize)]
struct PlaygroundSettings<'a> {
    /// Jobs can be submitted without a key, to `/v1/playground/jobs`.
    shared_key: bool,
    /// The shared key's limit of queued + running jobs.
    max_active: Option<u64>,
    /// Where the operator dashboard is, when it is on.
    dashboard_path: Option<&'a str>,
}

/// `GET /v1/playground`.
pub(crate) async fn settings(State(state): State<ApiState>) -> Result<Response, ApiError> {
    let web = super::settings(&state)?;
    Ok(Json(PlaygroundSettings {
        shared_key: web.playground_key.is_some(),
        max_active: web.playground_key.as_ref().map(|k| k.max_active),
        dashboard_path: web.dashboard_path.as_deref(),
    })
    .into_response())
}

/// `POST /v1/playground/jobs`: `POST /v1/jobs` with the shared key.
pub(crate) async fn submit(
    State(state): State<ApiState>,
    mut request: Request,
) -> Result<Response, ApiError> {
    let key = super::settings(&state)?
        .playground_key
        .clone()
        .ok_or(ApiError::NotFound(
            "this server has no shared playground key; submit to /v1/jobs with your api key",
        ))?;
    if request.headers().contains_key("idempotency-key") {
        return Err(ApiError::InvalidRequest {
            field: "Idempotency-Key",
            message: "the shared playground key takes no idempotency keys".into(),
        });
    }
    request
        .headers_mut()
        .insert(header::AUTHORIZATION, key.authorization);
    Ok(crate::api::v1::jobs::submit(State(state), request).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: &str =
        "alice:alice-key-0123456789:3,ops:ops-key-0123456789:admin:2,open:open-key-0123456789";

    #[test]
    fn the_playground_key_is_a_limited_configured_key() {
        let keys = ApiKeys::parse(KEYS).unwrap();
        let key = PlaygroundKey::from_config("alice", KEYS, &keys).unwrap();
        assert_eq!((key.name(), key.max_active), ("alice", 3));
        assert_eq!(key.authorization, "Bearer alice-key-0123456789");
        assert!(!format!("{key:?}").contains("alice-key"));

        let error = |name| PlaygroundKey::from_config(name, KEYS, &keys).unwrap_err();
        assert_eq!(
            error("bob"),
            "\"bob\" is not the name of a key in CODE_RUNNER_API_KEYS (configured: alice, ops, open)"
        );
        assert!(
            error("ops").contains("has the admin scope"),
            "{}",
            error("ops")
        );
        assert!(
            error("open").contains("has no max_active"),
            "{}",
            error("open")
        );
        for name in ["bob", "ops", "open"] {
            assert!(!error(name).contains("-key-0123456789"));
        }
    }
}
