//! The request rate limit per API key: a GCRA token bucket per key from the
//! `governor` crate, one set of buckets for every route that takes a key.
//! `/v1/jobs…` and `/v1/capacity…` are checked by [`limit`], a middleware
//! that reads the key from `Authorization`; the Piston and Judge0 APIs call
//! [`KeyRate::check`] once they know their caller, so their refusal comes
//! in their own shapes. Requests without a valid key share one bucket (they
//! are refused with 401 anyway, and a flood of them cannot starve a real
//! key). Above the rate: 429 `rate_limited` with `Retry-After`; a refused
//! submission counts in `code_runner_submissions_rejected_total`.
//!
//! The buckets are kept per key name, so their number is bounded by the
//! configured keys (plus the shared one).

use std::num::NonZeroU32;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::Clock;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use super::error::ApiError;
use crate::api::ApiState;

/// The buckets: `rate` requests per second per key, `burst` at once.
pub(crate) struct KeyRate {
    limiter: DefaultKeyedRateLimiter<Option<String>>,
    rate: u64,
    burst: u64,
}

impl std::fmt::Debug for KeyRate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyRate")
            .field("rate", &self.rate)
            .finish_non_exhaustive()
    }
}

impl KeyRate {
    pub(crate) fn new(rate: u64, burst: u32) -> Self {
        let rate = rate.max(1);
        let period = Duration::from_nanos((1_000_000_000 / rate).max(1));
        let quota = Quota::with_period(period)
            .expect("a period of at least 1 ns")
            .allow_burst(NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN));
        Self {
            limiter: RateLimiter::keyed(quota),
            rate,
            burst: u64::from(burst.max(1)),
        }
    }

    /// Takes one request from the bucket of the key named `key` (`None`: no
    /// valid key); 429 `rate_limited` when it is empty.
    pub(crate) fn check(&self, key: Option<&str>) -> Result<(), ApiError> {
        self.limiter
            .check_key(&key.map(str::to_owned))
            .map_err(|not_until| {
                let wait = not_until.wait_time_from(self.limiter.clock().now());
                ApiError::RateLimited {
                    rate: self.rate,
                    burst: self.burst,
                    wait_secs: wait.as_secs_f64().ceil() as u64,
                }
            })
    }
}

/// The middleware of the keyed `/v1` routes. A valid key's [`Caller`](super::auth::Caller) is
/// left in the request's extensions, where [`super::auth::ApiKeys::
/// authenticate`] takes it instead of checking the key again.
pub(crate) async fn limit(
    State(state): State<ApiState>,
    mut request: Request,
    next: Next,
) -> Response {
    let caller = state.keys().authenticate_headers(request.headers()).ok();
    match state
        .key_rate
        .check(caller.as_ref().map(|caller| caller.name.as_str()))
    {
        Ok(()) => {
            if let Some(caller) = caller {
                request.extensions_mut().insert(caller);
            }
            next.run(request).await
        }
        Err(error) => {
            // POST is the one submission among these routes.
            if request.method() == Method::POST {
                super::refusals::count_rejection(&state, &error);
            }
            error.into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_key_has_its_own_bucket_of_burst_requests() {
        let rate = KeyRate::new(1, 3);
        for _ in 0..3 {
            rate.check(Some("a")).unwrap();
        }
        match rate.check(Some("a")) {
            Err(ApiError::RateLimited {
                rate: 1,
                burst: 3,
                wait_secs,
            }) => assert_eq!(wait_secs, 1),
            other => panic!("{other:?}"),
        }
        rate.check(Some("b")).unwrap();
        for _ in 0..3 {
            rate.check(None).unwrap();
        }
        assert!(rate.check(None).is_err());
        assert!(rate.check(Some("b")).is_ok());
    }
}
