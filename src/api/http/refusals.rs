//! The count of refused submissions, `code_runner_submissions_rejected_total`
//! by `reason`: every reason a refusal can have, and the two ways a refusal
//! is counted (from an [`ApiError`], or by a compatible API that refuses in
//! its own words). Each route that takes a submission counts its refusals
//! once, with these.

use crate::api::ApiState;
use crate::api::http::error::ApiError;
use crate::metrics::Metrics;

/// Every `reason` of `code_runner_submissions_rejected_total`; each starts
/// at 0 so a dashboard sees the series before the first refusal.
pub const REJECTION_REASONS: &[&str] = &[
    "unauthorized",
    "invalid",
    "too_large",
    "queue_full",
    "key_limit",
    "key_storage",
    "quota_exceeded",
    "conflict",
    "malformed",
    "rate_limited",
    "user_active_limit",
    "user_rate_limit",
    "shutting_down",
    "store_unavailable",
];

/// Starts every reason's series at 0.
pub(crate) fn register(metrics: &Metrics) {
    for reason in REJECTION_REASONS {
        metrics.submissions_rejected.with_label_values(&[*reason]);
    }
}

/// Counts a refused submission by its reason (failures of our own are not
/// refusals and are not counted).
pub(crate) fn count_rejection(state: &ApiState, error: &ApiError) {
    if let Some(reason) = error.rejection_reason() {
        count_refusal(state, reason);
    }
}

/// Counts a submission refused for `reason` (a `reason` label of
/// `code_runner_submissions_rejected_total`), for the refusals a compatible
/// API makes in its own words, without an `ApiError`.
pub(crate) fn count_refusal(state: &ApiState, reason: &'static str) {
    state
        .inner
        .metrics
        .submissions_rejected
        .with_label_values(&[reason])
        .inc();
}
