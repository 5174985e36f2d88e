//! Job limits: what a request asks for, the server's defaults and maximums, and
//! the resolved values a sandbox is built with.
//!
//! A request above the server maximum is refused, never silently clamped.
//!
//! One macro (`limit_structs!`) writes each request form, its resolved form
//! and their `key=value` parser from one list of fields, so the three
//! cannot drift apart.

use serde::{Deserialize, Serialize};

use super::InvalidJob;

macro_rules! limit_structs {
    ($(#[$doc:meta])* $request:ident, $resolved:ident { $($field:ident),+ $(,)? }) => {
        /// Limits as a request or the catalog gives them: each one optional.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $request {
            $(#[serde(default, skip_serializing_if = "Option::is_none")] pub $field: Option<u64>,)+
        }

        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
        pub struct $resolved {
            $(pub $field: u64,)+
        }

        impl $request {
            /// The names of the fields, in declaration order.
            pub const FIELDS: &'static [&'static str] = &[$(stringify!($field)),+];

            /// Sets one field by name (for `key=value` configuration).
            pub fn set(&mut self, name: &str, value: u64) -> Result<(), String> {
                match name {
                    $(stringify!($field) => self.$field = Some(value),)+
                    other => return Err(format!(
                        "unknown limit {other:?}; known: {}", Self::FIELDS.join(", "))),
                }
                Ok(())
            }

            /// `self` with every missing value taken from `defaults`.
            pub fn with_defaults(self, defaults: $resolved) -> $resolved {
                $resolved { $($field: self.$field.unwrap_or(defaults.$field),)+ }
            }

            /// Resolves against the server: request, then `defaults`; each value
            /// must be at least 1 and at most `maximum`.
            pub fn resolve(self, prefix: &str, defaults: $resolved, maximum: $resolved)
                -> Result<$resolved, InvalidJob>
            {
                Ok($resolved { $($field: {
                    let value = self.$field.unwrap_or(defaults.$field);
                    check_limit(prefix, stringify!($field), value, maximum.$field)?
                },)+ })
            }
        }

        impl $resolved {
            /// Each value at most the one in `maximum`.
            pub fn capped_at(self, maximum: $resolved) -> $resolved {
                $resolved { $($field: self.$field.min(maximum.$field),)+ }
            }

            /// Every value of `self` that is above `maximum`, as an error.
            pub fn check_within(self, what: &str, maximum: $resolved) -> Result<(), String> {
                $(if self.$field > maximum.$field {
                    return Err(format!("{what} {} = {} is above the maximum {}",
                        stringify!($field), self.$field, maximum.$field));
                })+
                Ok(())
            }
        }
    };
}

limit_structs!(
    /// The resolved limits of a job's run stage and container.
    LimitsRequest, Limits {
        wall_ms, idle_ms, cpu_ms, memory_mb, pids, output_bytes, disk_mb, files_bytes,
    }
);

limit_structs!(
    /// The resolved limits of a compile stage. Memory, pids and disk are the
    /// container's and shared with the run stage.
    CompileLimitsRequest, CompileLimits { wall_ms, cpu_ms, output_bytes }
);

fn check_limit(prefix: &str, field: &str, value: u64, maximum: u64) -> Result<u64, InvalidJob> {
    if value == 0 {
        return Err(InvalidJob::new(
            format!("{prefix}.{field}"),
            "must be at least 1",
        ));
    }
    if value > maximum {
        return Err(InvalidJob::new(
            format!("{prefix}.{field}"),
            format!("{value} is above the server maximum of {maximum}"),
        ));
    }
    Ok(value)
}

/// The server's defaults and maximums for every limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitPolicy {
    pub defaults: Limits,
    pub maximum: Limits,
    pub compile_defaults: CompileLimits,
    pub compile_maximum: CompileLimits,
    /// Most files in one job.
    pub max_files: usize,
    /// Most bytes of stdin a non-interactive job may carry.
    pub max_stdin_bytes: usize,
}

impl LimitPolicy {
    /// The longest any job may run once its sandbox is up: the largest
    /// wall limits of a compile and a run stage together.
    pub fn longest_wall(&self) -> std::time::Duration {
        std::time::Duration::from_millis(
            self.maximum
                .wall_ms
                .saturating_add(self.compile_maximum.wall_ms),
        )
    }
}

impl Default for LimitPolicy {
    fn default() -> Self {
        Self {
            defaults: Limits {
                wall_ms: 10_000,
                idle_ms: 60_000,
                cpu_ms: 10_000,
                memory_mb: 256,
                pids: 64,
                output_bytes: 1 << 20,
                disk_mb: 64,
                files_bytes: 1 << 20,
            },
            maximum: Limits {
                wall_ms: 300_000,
                idle_ms: 600_000,
                cpu_ms: 300_000,
                memory_mb: 2048,
                pids: 512,
                output_bytes: 16 << 20,
                disk_mb: 1024,
                files_bytes: 16 << 20,
            },
            compile_defaults: CompileLimits {
                wall_ms: 20_000,
                cpu_ms: 20_000,
                output_bytes: 256 << 10,
            },
            compile_maximum: CompileLimits {
                wall_ms: 120_000,
                cpu_ms: 120_000,
                output_bytes: 4 << 20,
            },
            max_files: 64,
            max_stdin_bytes: 8 << 20,
        }
    }
}

/// Parses `key=value,key=value` into a request (for configuration values such
/// as `--max-limits wall_ms=60000,memory_mb=512`).
pub fn parse_limit_list<R: Default>(
    text: &str,
    set: impl Fn(&mut R, &str, u64) -> Result<(), String>,
) -> Result<R, String> {
    let mut request = R::default();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| format!("{item:?} is not key=value"))?;
        let value: u64 = value
            .trim()
            .parse()
            .map_err(|_| format!("{key}: {value:?} is not a whole number"))?;
        set(&mut request, key.trim(), value)?;
    }
    Ok(request)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn above_maximum_is_refused_with_the_field_name() {
        let policy = LimitPolicy::default();
        let request = LimitsRequest {
            memory_mb: Some(4096),
            ..Default::default()
        };
        let error = request
            .resolve("limits", policy.defaults, policy.maximum)
            .unwrap_err();
        assert_eq!(error.field, "limits.memory_mb");
        assert_eq!(error.message, "4096 is above the server maximum of 2048");
    }

    #[test]
    fn zero_is_refused() {
        let policy = LimitPolicy::default();
        let request = CompileLimitsRequest {
            wall_ms: Some(0),
            ..Default::default()
        };
        let error = request
            .resolve(
                "compile_limits",
                policy.compile_defaults,
                policy.compile_maximum,
            )
            .unwrap_err();
        assert_eq!(error.field, "compile_limits.wall_ms");
    }

    #[test]
    fn request_overrides_defaults() {
        let policy = LimitPolicy::default();
        let request = LimitsRequest {
            wall_ms: Some(500),
            ..Default::default()
        };
        let limits = request
            .resolve("limits", policy.defaults, policy.maximum)
            .unwrap();
        assert_eq!(limits.wall_ms, 500);
        assert_eq!(limits.memory_mb, policy.defaults.memory_mb);
    }

    #[test]
    fn limit_lists_parse_and_name_bad_keys() {
        let parsed: LimitsRequest =
            parse_limit_list("wall_ms=5, memory_mb=7", LimitsRequest::set).unwrap();
        assert_eq!(parsed.wall_ms, Some(5));
        assert_eq!(parsed.memory_mb, Some(7));
        let error = parse_limit_list::<LimitsRequest>("walls=5", LimitsRequest::set).unwrap_err();
        assert!(error.starts_with("unknown limit \"walls\""), "{error}");
        let error = parse_limit_list::<LimitsRequest>("wall_ms=x", LimitsRequest::set).unwrap_err();
        assert_eq!(error, "wall_ms: \"x\" is not a whole number");
    }
}
