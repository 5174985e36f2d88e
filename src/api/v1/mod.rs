//! The native JSON API under `/v1`:
//!
//! - [`jobs`]: `POST /v1/jobs` (optionally waiting), `GET /v1/jobs/{id}`,
//!   `DELETE /v1/jobs/{id}`, and the job view they answer with;
//! - [`history`]: `GET /v1/jobs`, the key's run history;
//! - [`usage`]: `GET /v1/usage`, the usage ledger;
//! - [`capacity`]: `PUT|GET /v1/capacity`, `DELETE /v1/capacity/{id}`, the
//!   fleet's warm capacity schedule (admin scope);
//! - [`languages`]: `GET /v1/languages`, the public catalog;
//! - [`submit`]: the one submit path of `POST /v1/jobs`, the playground and
//!   the compatible APIs: admission in one atomic store step, the store's
//!   refusals as [`ApiError`](crate::api::ApiError)s, and the wait for a
//!   job's end.
//!
//! A job's streams (`/v1/jobs/{id}/ws`, `/events`) are in
//! [`super::streams`]; the pages' routes under `/v1` (`playground`,
//! `dashboard`) in [`super::pages`].

pub(crate) mod capacity;
pub(crate) mod files;
pub(crate) mod history;
pub(crate) mod jobs;
pub(crate) mod languages;
pub(crate) mod submit;
pub(crate) mod usage;
