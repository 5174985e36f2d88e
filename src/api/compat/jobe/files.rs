//! Jobe's `files/{id}`: `PUT` a file's bytes (base64 in
//! `{"file_contents"}`) under an id of the client's choosing (CodeRunner
//! uses the MD5 of the content), `HEAD` to ask whether it is there.
//!
//! The bytes go to the file store as any file (by their SHA-256, on the
//! caller's key's budget, kept until unused for `CODE_RUNNER_FILE_KEEP_SECS`);
//! the id names that SHA-256 for the same time. A run's `file_list` names
//! files by these ids.

use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use sha2::{Digest, Sha256};

use super::{jobe_caller, jobe_error};
use crate::api::ApiState;
use crate::api::http::auth::Caller;
use crate::store::FilePut;

/// The longest file id taken (Jobe sets none; ids are MD5s in practice).
const MAX_ID: usize = 128;

fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_ID && id.chars().all(|c| c.is_ascii_alphanumeric())
}

/// `PUT files/{id}`: 204 once kept.
pub(super) async fn put(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let caller = match jobe_caller(&state, &parts) {
        Ok(caller) => caller,
        Err(refusal) => return refusal.into_response(),
    };
    if !valid_id(&id) {
        return jobe_error(StatusCode::NOT_FOUND, "No such resource");
    }
    let limit = state.inner.limits.file_max_bytes;
    // The base64 of the largest file, with room for the JSON around it.
    let body_limit = limit.div_ceil(3) * 4 + 4096;
    let body = match axum::body::to_bytes(body, body_limit as usize).await {
        Ok(body) => body,
        Err(_) => {
            return jobe_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("put: file {id} is larger than this server's limit of {limit} bytes"),
            );
        }
    };
    let Some(contents) = file_contents(&body) else {
        return jobe_error(
            StatusCode::BAD_REQUEST,
            "put: missing file_contents parameter",
        );
    };
    let Ok(contents) = STANDARD.decode(contents.trim()) else {
        return jobe_error(
            StatusCode::BAD_REQUEST,
            format!("put: contents of file {id} are not valid base-64"),
        );
    };
    if contents.len() as u64 > limit {
        return jobe_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("put: file {id} is larger than this server's limit of {limit} bytes"),
        );
    }
    match keep(&state, &caller, &id, &contents).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(response) => response,
    }
}

/// `file_contents` of a JSON object body, if it is a string.
fn file_contents(body: &Bytes) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    value.get("file_contents")?.as_str().map(str::to_string)
}

/// Stores `contents` for `caller` and names it `id`.
async fn keep(
    state: &ApiState,
    caller: &Caller,
    id: &str,
    contents: &[u8],
) -> Result<(), Response> {
    let digest = hex::encode(Sha256::digest(contents));
    let keep = state.inner.limits.file_keep;
    let budget = state.storage_budget(caller.max_active);
    let store = &state.inner.store;
    let failed = |error: crate::store::StoreError| {
        jobe_error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("put: failed to write file {id} to the store ({error})"),
        )
    };
    match store
        .files()
        .put(&caller.name, &digest, contents, keep, budget)
        .await
        .map_err(failed)?
    {
        FilePut::Created | FilePut::Existed => {}
        FilePut::OverBudget { held } => {
            return Err(jobe_error(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "put: file {id} was not kept: this key's jobs and files hold {held} bytes, and {} more would pass its storage budget of {budget} bytes",
                    contents.len()
                ),
            ));
        }
    }
    store
        .compat()
        .set_jobe_file(&caller.name, id, &digest, keep)
        .await
        .map_err(failed)
}

/// `HEAD files/{id}`: 204 when the caller's key has the file, 404 when not.
pub(super) async fn head(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    request: Request,
) -> Response {
    let (parts, _) = request.into_parts();
    let caller = match jobe_caller(&state, &parts) {
        Ok(caller) => caller,
        Err(refusal) => return refusal.into_response(),
    };
    if !valid_id(&id) {
        return StatusCode::NOT_FOUND.into_response();
    }
    match stored(&state, &caller, &id).await {
        Ok(Some(_)) => StatusCode::NO_CONTENT.into_response(),
        Ok(None) => StatusCode::NOT_FOUND.into_response(),
        Err(error) => jobe_error(StatusCode::SERVICE_UNAVAILABLE, error.to_string()),
    }
}

/// The SHA-256 of the file `id` names for `caller`, when both the name and
/// the file are there; a use of both.
pub(super) async fn stored(
    state: &ApiState,
    caller: &Caller,
    id: &str,
) -> Result<Option<String>, crate::store::StoreError> {
    let keep = state.inner.limits.file_keep;
    let store = &state.inner.store;
    let Some(digest) = store.compat().jobe_file(&caller.name, id, keep).await? else {
        return Ok(None);
    };
    let size = store.files().size(&caller.name, &digest, keep).await?;
    Ok(size.map(|_| digest))
}
