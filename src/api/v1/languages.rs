//! `GET /v1/languages` (no key: the catalog is public, so an editor can
//! show it before anyone signs in): the languages on offer, each with the
//! limits a job of it gets unless it asks otherwise, and the most a job may
//! ask for.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::api::ApiState;
use crate::job::limits::{CompileLimits, Limits};

#[derive(Debug, Serialize)]
struct LanguageView<'a> {
    id: &'a str,
    name: &'a str,
    version: &'a str,
    aliases: &'a [String],
    extensions: &'a [String],
    compiled: bool,
    /// The limits a job of this language gets unless it asks otherwise.
    limits: Limits,
    /// The same for the compile stage, for compiled languages.
    #[serde(skip_serializing_if = "Option::is_none")]
    compile_limits: Option<CompileLimits>,
    /// The libraries the image carries (`[]`: none beyond the standard
    /// library).
    libraries: &'a [crate::languages::Library],
}

#[derive(Debug, Serialize)]
struct CatalogView<'a> {
    languages: Vec<LanguageView<'a>>,
    /// The most a job may ask for.
    maximum_limits: Limits,
    maximum_compile_limits: CompileLimits,
}

/// `GET /v1/languages`: the languages on offer (those the workers have
/// images of) with each one's default limits.
pub(crate) async fn languages(State(state): State<ApiState>) -> Response {
    let policy = &state.inner.policy;
    let catalog = state.offered_catalog().await;
    let languages = catalog
        .all()
        .iter()
        .map(|language| LanguageView {
            id: &language.id,
            name: &language.name,
            version: &language.version,
            aliases: &language.aliases,
            extensions: &language.extensions,
            compiled: language.compile.is_some(),
            limits: language.limits.with_defaults(policy.defaults),
            compile_limits: language.compile.as_ref().map(|_| {
                language
                    .compile_limits
                    .with_defaults(policy.compile_defaults)
            }),
            libraries: &language.libraries,
        })
        .collect();
    Json(CatalogView {
        languages,
        maximum_limits: policy.maximum,
        maximum_compile_limits: policy.compile_maximum,
    })
    .into_response()
}
