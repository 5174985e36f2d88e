//! `/v1/files/{sha256}`: files a key uploads once and names by their
//! SHA-256 afterwards (Jobe's and CodeRunner's support files, a judge's
//! large test data).
//!
//! - `PUT` with the raw bytes as the body: 201 when kept now, 200 when the
//!   key had it already; the body must hash to the digest of the path (a
//!   400 names both), have at most `CODE_RUNNER_FILE_MAX_MB` (413), and fit
//!   in the key's storage budget with its jobs (429 `key_storage`).
//! - `HEAD` and `GET`: the file's size, or its bytes
//!   (`application/octet-stream`); 404 when the key has no such file.
//! - `DELETE`: 204, or 404.
//!
//! A file belongs to the key that put it: another key sees 404 for it
//! and keeps a copy of its own. Every put and read renews the file's time;
//! a file unused for `CODE_RUNNER_FILE_KEEP_SECS` goes, and its bytes with
//! it from the key's budget.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::json;

use crate::api::ApiState;
use crate::api::http::auth::Caller;
use crate::api::http::error::ApiError;
use crate::job::{InvalidJob, JobSpec, PreparedJob, refs};
use crate::store::files::checked;
use crate::store::{FilePut, PutFailure, StreamError};

/// The digest of the path: 64 hex digits, taken in either case and named
/// in lower case afterwards.
fn digest(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(digest) = path.map_err(|_| ApiError::NotFound("file not found"))?;
    if !refs::is_digest(&digest) {
        return Err(ApiError::InvalidRequest {
            field: "sha256",
            message: format!(
                "{:?} is not a SHA-256: the path names a file by 64 hex digits",
                digest.chars().take(80).collect::<String>()
            ),
        });
    }
    Ok(digest.to_ascii_lowercase())
}

pub(crate) async fn put(
    State(state): State<ApiState>,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let digest = digest(path)?;
    let limits = &state.inner.limits;
    let limit = limits.file_max_bytes;
    let too_large = ApiError::FileTooLarge { limit };
    // A length over the limit is refused before a byte is read.
    let length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if length.is_some_and(|length| length > limit) {
        return Err(too_large);
    }
    let received = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&received);
    let chunks = body.into_data_stream().map(move |chunk| {
        let chunk = chunk.map_err(|e| StreamError::Read(e.to_string()))?;
        counter.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        Ok(chunk)
    });
    let content = checked(chunks, &digest, limit);
    let budget = state.storage_budget(caller.max_active);
    let put = state
        .inner
        .store
        .files()
        .put_stream(
            &caller.name,
            &digest,
            content,
            length,
            limits.file_keep,
            budget,
        )
        .await;
    let status = match put {
        Ok(FilePut::Created) => StatusCode::CREATED,
        Ok(FilePut::Existed) => StatusCode::OK,
        Ok(FilePut::OverBudget { held }) => {
            return Err(ApiError::FileStorage {
                held,
                // Refused before its bytes came, or after them.
                needed: length.unwrap_or_else(|| received.load(Ordering::Relaxed)),
                budget,
            });
        }
        Err(PutFailure::Body(StreamError::TooLarge { .. })) => return Err(too_large),
        Err(PutFailure::Body(StreamError::Digest { actual })) => {
            return Err(ApiError::InvalidRequest {
                field: "sha256",
                message: format!(
                    "the body's SHA-256 is {actual}, not {digest} as the path says: the file was not kept"
                ),
            });
        }
        Err(PutFailure::Body(StreamError::Read(message))) => {
            return Err(ApiError::MalformedBody {
                message: format!("cannot read the file: {message}").to_lowercase(),
            });
        }
        Err(PutFailure::Store(error)) => return Err(error.into()),
    };
    let size = received.load(Ordering::Relaxed);
    Ok((status, Json(json!({"sha256": digest, "size": size}))).into_response())
}

pub(crate) async fn get(
    State(state): State<ApiState>,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let digest = digest(path)?;
    // The bytes as they come from the backend: a large file is never
    // whole in this process.
    let (size, stream) = state
        .inner
        .store
        .files()
        .open(&caller.name, &digest, state.inner.limits.file_keep)
        .await?
        .ok_or(ApiError::NotFound("file not found"))?;
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            ),
            (header::CONTENT_LENGTH, HeaderValue::from(size)),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

pub(crate) async fn head(
    State(state): State<ApiState>,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let digest = digest(path)?;
    let size = state
        .inner
        .store
        .files()
        .size(&caller.name, &digest, state.inner.limits.file_keep)
        .await?
        .ok_or(ApiError::NotFound("file not found"))?;
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            ),
            (header::CONTENT_LENGTH, HeaderValue::from(size)),
        ],
        Body::empty(),
    )
        .into_response())
}

pub(crate) async fn delete(
    State(state): State<ApiState>,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let digest = digest(path)?;
    if state
        .inner
        .store
        .files()
        .delete(&caller.name, &digest)
        .await?
    {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::NotFound("file not found"))
    }
}

/// Checks the files `spec` names by reference before the job is queued:
/// every one stored for the caller's key (a 400 lists each digest that is
/// not), the job's files, with their stored sizes, within
/// `limits.files_bytes`, and its tests' input and expected output within
/// the server's stdin limit. Each is a use of the file. Whether the job names
/// any.
pub(crate) async fn check_references(
    state: &ApiState,
    caller: &Caller,
    spec: &JobSpec,
    prepared: &PreparedJob,
) -> Result<bool, ApiError> {
    let digests = refs::references(spec)?;
    if digests.is_empty() {
        return Ok(false);
    }
    let files = state.inner.store.files();
    let keep = state.inner.limits.file_keep;
    let mut sizes = std::collections::HashMap::new();
    let mut missing = Vec::new();
    for digest in digests {
        match files.size(&caller.name, &digest, keep).await? {
            Some(size) => {
                sizes.insert(digest, size);
            }
            None => missing.push(digest),
        }
    }
    if !missing.is_empty() {
        return Err(ApiError::InvalidJob(InvalidJob::new(
            "files",
            format!(
                "{} of the files named by ref {} not stored for this key: {} (PUT /v1/files/{{sha256}} first)",
                missing.len(),
                if missing.len() == 1 { "is" } else { "are" },
                missing.join(", ")
            ),
        )));
    }
    let (stored_files, stored_tests) = refs::referenced_bytes(spec, |digest| sizes[digest]);
    let inline: u64 = prepared
        .bundle
        .files
        .iter()
        .map(|f| f.content.len() as u64)
        .sum();
    let limit = prepared.limits.files_bytes;
    if inline + stored_files > limit {
        return Err(ApiError::InvalidJob(InvalidJob::new(
            "files",
            format!(
                "files total more than {limit} bytes (limits.files_bytes): {stored_files} of them stored files'"
            ),
        )));
    }
    let inline_tests: u64 = prepared
        .tests
        .iter()
        .flat_map(|t| &t.tests)
        .map(|t| (t.input.len() + t.expected.as_ref().map_or(0, Vec::len)) as u64)
        .sum();
    let limit = state.inner.policy.max_stdin_bytes as u64;
    if inline_tests + stored_tests > limit {
        return Err(ApiError::InvalidJob(InvalidJob::new(
            "tests",
            format!(
                "the tests' stdin and expected output come to more than the limit of {limit} bytes: {stored_tests} of them stored files'"
            ),
        )));
    }
    Ok(true)
}
