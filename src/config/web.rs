//! The settings of the API role's browser pages: the playground and the dashboard.

use clap::Args;

use super::ConfigError;

/// The browser pages of the API role.
#[derive(Debug, Clone, Args)]
pub struct WebSettings {
    /// Path of the browser playground (e.g. `/` or `/playground`); `off`
    /// serves none.
    #[arg(long, env = "CODE_RUNNER_PLAYGROUND_PATH", default_value = "/")]
    pub playground_path: String,

    /// Path of the operator dashboard (its data needs an admin key); `off`
    /// serves none.
    #[arg(long, env = "CODE_RUNNER_DASHBOARD_PATH", default_value = "/dashboard")]
    pub dashboard_path: String,

    /// Name of one of the configured API keys that the playground submits
    /// with for visitors who have no key; it needs a low max_active and no
    /// admin scope. Unset: visitors enter their own key.
    #[arg(long, env = "CODE_RUNNER_PLAYGROUND_KEY")]
    pub playground_key: Option<String>,
}

impl WebSettings {
    /// The pages to serve, with the playground key checked against the
    /// configured keys (`api_keys`, as configured, and parsed into `keys`).
    pub fn build(
        &self,
        api_keys: &str,
        keys: &crate::api::ApiKeys,
    ) -> Result<crate::api::WebUi, ConfigError> {
        let playground = crate::api::page_path(&self.playground_path)
            .map_err(|m| ConfigError::new("CODE_RUNNER_PLAYGROUND_PATH", m))?;
        let dashboard = crate::api::page_path(&self.dashboard_path)
            .map_err(|m| ConfigError::new("CODE_RUNNER_DASHBOARD_PATH", m))?;
        if playground.is_some() && playground == dashboard {
            return Err(ConfigError::new(
                "CODE_RUNNER_DASHBOARD_PATH",
                format!(
                    "{:?} is also the playground's path",
                    self.dashboard_path.trim()
                ),
            ));
        }
        let key = match self.playground_key.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(_) if playground.is_none() => {
                return Err(ConfigError::new(
                    "CODE_RUNNER_PLAYGROUND_KEY",
                    "is set but the playground is off (CODE_RUNNER_PLAYGROUND_PATH=off)",
                ));
            }
            Some(name) => Some(
                crate::api::PlaygroundKey::from_config(name, api_keys, keys)
                    .map_err(|m| ConfigError::new("CODE_RUNNER_PLAYGROUND_KEY", m))?,
            ),
        };
        Ok(crate::api::WebUi::new(playground, dashboard, key))
    }
}
