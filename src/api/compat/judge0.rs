//! Judge0 CE.
use axum::Router;

use super::super::ApiState;

pub(super) fn router() -> Router<ApiState> {
    Router::new()
}
