//! The request rate limit per API key: tower_governor (a GCRA token bucket
//! per key, from the `governor` crate) on the routes that take an API key.
//! The key is the configured key's name; requests without a valid key share
//! one bucket (they are refused with 401 by the handler anyway, and a flood
//! of them cannot starve a real key). Above the rate: 429 `rate_limited`
//! with `Retry-After`.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use axum::response::IntoResponse;
use governor::middleware::NoOpMiddleware;
use tower_governor::GovernorError;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::KeyExtractor;

use super::auth::ApiKeys;
use super::error::ApiError;

/// The rate limiting layer's key: the API key's name, if it is one.
#[derive(Clone)]
pub(super) struct KeyName {
    keys: ApiKeys,
}

impl KeyExtractor for KeyName {
    type Key = Option<String>;

    fn extract<T>(&self, request: &Request<T>) -> Result<Self::Key, GovernorError> {
        Ok(self
            .keys
            .authenticate_headers(request.headers())
            .ok()
            .map(|caller| caller.name))
    }
}

pub(super) type Layer = tower_governor::GovernorLayer<KeyName, NoOpMiddleware, Body>;

/// The layer: `rate` requests per second per key, `burst` at once.
pub(super) fn layer(keys: ApiKeys, rate: u64, burst: u32) -> Option<Layer> {
    let period = Duration::from_nanos((1_000_000_000 / rate.max(1)).max(1));
    let config = GovernorConfigBuilder::default()
        .key_extractor(KeyName { keys })
        .period(period)
        .burst_size(burst.max(1))
        .finish()?;
    Some(
        tower_governor::GovernorLayer::new(Arc::new(config)).error_handler(move |error| {
            let wait_secs = match error {
                GovernorError::TooManyRequests { wait_time, .. } => wait_time,
                _ => 1,
            };
            ApiError::RateLimited { rate, wait_secs }.into_response()
        }),
    )
}
