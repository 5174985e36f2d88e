//! API keys: parsed from configuration, checked on every request in
//! constant time. Only SHA-256 digests of the keys are kept in memory; a
//! presented key is hashed and compared with every configured digest, with no
//! early exit, so neither which key matched nor how much of it matched shows
//! in the timing.

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use sha2::{Digest, Sha256};
use std::sync::Arc;

use super::error::ApiError;
use crate::api::ApiState;
use crate::egress::Allowlist;

/// Shortest accepted API key.
pub const MIN_KEY_CHARS: usize = 16;
/// Longest accepted key name.
const MAX_NAME_CHARS: usize = 64;

/// One configured key: its name (in logs, metrics-free, and in Redis key
/// names), the digest of the secret, and its own limit.
#[derive(Clone)]
struct ApiKey {
    name: String,
    digest: [u8; 32],
    /// Most queued + running jobs of this key; `None`: only the global limits.
    max_active: Option<u64>,
    /// The key may change fleet-wide settings (`/v1/capacity`, the dashboard).
    admin: bool,
    tenancy: Tenancy,
    /// The hosts the key's jobs may ask to reach (`CODE_RUNNER_KEY_EGRESS`).
    egress: Arc<Allowlist>,
}

/// What a key's entry says about the end users behind it and their share:
/// its weight in the fair turns, per-user limits and the daily quotas.
/// Every limit is `None` when the entry does not set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tenancy {
    /// Turns the key gets per round of the fair claim (1–100; default 1).
    pub weight: u32,
    /// Most queued + running jobs of one user of the key.
    pub max_active_per_user: Option<u64>,
    /// Most submissions of one user per minute.
    pub user_rate_per_minute: Option<u64>,
    /// CPU seconds the key's jobs may use per UTC day.
    pub cpu_seconds_per_day: Option<u64>,
    /// CPU seconds one user's jobs may use per UTC day.
    pub user_cpu_seconds_per_day: Option<u64>,
    /// Jobs one user may submit per UTC day.
    pub user_jobs_per_day: Option<u64>,
}

impl Default for Tenancy {
    fn default() -> Self {
        Self {
            weight: 1,
            max_active_per_user: None,
            user_rate_per_minute: None,
            cpu_seconds_per_day: None,
            user_cpu_seconds_per_day: None,
            user_jobs_per_day: None,
        }
    }
}

/// The most turns per round a key's `weight` may ask for.
pub const MAX_WEIGHT: u32 = 100;

/// The named options of a key entry (`option=value`), in the order the
/// documentation gives them.
pub const TENANCY_OPTIONS: [&str; 7] = [
    "max_active",
    "weight",
    "max_active_per_user",
    "user_rate_per_minute",
    "cpu_seconds_per_day",
    "user_cpu_seconds_per_day",
    "user_jobs_per_day",
];

/// Every configured API key.
#[derive(Clone)]
pub struct ApiKeys {
    keys: Vec<ApiKey>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.keys.iter().map(|k| &k.name))
            .finish()
    }
}

/// The authenticated caller of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Name of the API key used.
    pub name: String,
    pub max_active: Option<u64>,
    /// The key has the `admin` scope.
    pub admin: bool,
    pub tenancy: Tenancy,
    /// The hosts the key's jobs may ask to reach (empty: none).
    pub egress: Arc<Allowlist>,
    /// The end user a compatible API's request names in its
    /// `X-Code-Runner-User` header (`POST /v1/jobs` takes `user` in the
    /// body instead).
    pub end_user: Option<String>,
}

impl Caller {
    /// `Ok` when the caller's key has the `admin` scope, else 403.
    pub fn require_admin(&self) -> Result<(), ApiError> {
        if self.admin {
            Ok(())
        } else {
            Err(ApiError::Forbidden(
                "this needs an api key with the admin scope",
            ))
        }
    }
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Equality of two digests in constant time: every byte is looked at.
fn digests_equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let difference = a
        .iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(difference) == 0
}

fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME_CHARS).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl ApiKey {
    /// The entry at `position` of `CODE_RUNNER_API_KEYS`, `name:key[:option]...`
    /// (see [`ApiKeys::parse`]).
    fn parse(position: usize, entry: &str) -> Result<Self, String> {
        let mut parts = entry.split(':');
        let (Some(name), Some(key)) = (parts.next(), parts.next()) else {
            return Err(format!("entry {position} is not name:key[:option]..."));
        };
        if !valid_name(name) {
            return Err(format!(
                "entry {position}: the name must be 1-{MAX_NAME_CHARS} letters, digits, '_' or '-'"
            ));
        }
        if key.chars().count() < MIN_KEY_CHARS {
            return Err(format!(
                "key {name:?}: the key must be at least {MIN_KEY_CHARS} characters"
            ));
        }
        if !key.chars().all(|c| c.is_ascii_graphic()) {
            return Err(format!(
                "key {name:?}: the key must be visible ASCII characters only"
            ));
        }
        let mut parsed = Self {
            name: name.to_string(),
            digest: digest(key),
            max_active: None,
            admin: false,
            tenancy: Tenancy::default(),
            egress: Arc::default(),
        };
        let mut seen: Vec<&str> = Vec::new();
        for option in parts {
            let (option_name, value) = split_option(name, option)?;
            if seen.contains(&option_name) {
                return Err(format!("key {name:?}: option {option_name} is given twice"));
            }
            seen.push(option_name);
            parsed.set_option(option_name, value)?;
        }
        Ok(parsed)
    }

    /// Sets option `option` of the entry to `value` (empty for `admin`).
    fn set_option(&mut self, option: &str, value: &str) -> Result<(), String> {
        let name = &self.name;
        if option == "admin" {
            if !value.is_empty() {
                return Err(format!("key {name:?}: admin takes no value"));
            }
            self.admin = true;
            return Ok(());
        }
        let number = match value.parse::<u64>() {
            Ok(n) if n > 0 => n,
            _ => {
                return Err(format!(
                    "key {name:?}: {option} {value:?} is not a positive integer"
                ));
            }
        };
        let tenancy = &mut self.tenancy;
        match option {
            "max_active" => self.max_active = Some(number),
            "weight" => {
                if number > u64::from(MAX_WEIGHT) {
                    return Err(format!(
                        "key {name:?}: weight {number} is above the most, {MAX_WEIGHT}"
                    ));
                }
                tenancy.weight = number as u32;
            }
            "max_active_per_user" => tenancy.max_active_per_user = Some(number),
            "user_rate_per_minute" => tenancy.user_rate_per_minute = Some(number),
            "cpu_seconds_per_day" => tenancy.cpu_seconds_per_day = Some(number),
            "user_cpu_seconds_per_day" => tenancy.user_cpu_seconds_per_day = Some(number),
            "user_jobs_per_day" => tenancy.user_jobs_per_day = Some(number),
            other => {
                return Err(format!(
                    "key {name:?}: unknown option {other:?}; the options are admin and {}=<n>",
                    TENANCY_OPTIONS.join("=, ")
                ));
            }
        }
        Ok(())
    }
}

/// An option of the entry of key `name` as `(option, value)`: `option=value`,
/// or a short form (`admin`; a bare number is `max_active`).
fn split_option<'a>(name: &str, option: &'a str) -> Result<(&'a str, &'a str), String> {
    match option.split_once('=') {
        Some((option_name, value)) => Ok((option_name, value)),
        None if option == "admin" => Ok(("admin", "")),
        None if option.bytes().all(|b| b.is_ascii_digit() || b == b'-') => {
            Ok(("max_active", option))
        }
        None => Err(format!(
            "key {name:?}: option {option:?} is not admin, a max_active number or one of {}=<n>",
            TENANCY_OPTIONS.join("=, ")
        )),
    }
}

impl ApiKeys {
    /// Parses `name:key[:option]...`, comma-separated, where each option is
    /// `admin` (the key may change fleet-wide settings) or `<option>=<n>`
    /// with a positive integer for one of [`TENANCY_OPTIONS`] (a bare number
    /// is `max_active`: most queued + running jobs of the key), each at
    /// most once. Names are 1–64 letters, digits, `_` or `-`; keys are at
    /// least 16 visible ASCII characters; names and keys are unique. Errors
    /// name the entry (by its name, or its position when the name itself is
    /// bad) and never repeat a key.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut keys: Vec<ApiKey> = Vec::new();
        let entries = text.split(',').map(str::trim).filter(|e| !e.is_empty());
        for (index, entry) in entries.enumerate() {
            let key = ApiKey::parse(index + 1, entry)?;
            if keys.iter().any(|k| k.name == key.name) {
                return Err(format!("key {:?} is configured twice", key.name));
            }
            if let Some(other) = keys.iter().find(|k| k.digest == key.digest) {
                return Err(format!(
                    "keys {:?} and {:?} have the same secret",
                    other.name, key.name
                ));
            }
            keys.push(key);
        }
        if keys.is_empty() {
            return Err("no API keys configured; set CODE_RUNNER_API_KEYS".into());
        }
        Ok(Self { keys })
    }

    /// Gives keys their egress allowlists from `CODE_RUNNER_KEY_EGRESS`:
    /// `name=host host2:8443 *.domain;name2=host`, entries of a key
    /// separated by spaces or commas, keys by `;` (a key's allowlist cannot
    /// be part of its `CODE_RUNNER_API_KEYS` entry, whose separator is
    /// `:`). Every name must be a configured key, at most once; each entry
    /// is checked as a job's `network.allow` is (a host or `*.domain`, an
    /// optional port, no IP addresses). Errors name the key and the entry.
    pub fn with_egress(mut self, text: &str) -> Result<Self, String> {
        let mut seen: Vec<&str> = Vec::new();
        for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((name, hosts)) = part.split_once('=') else {
                return Err(format!("{part:?} is not name=host[ host]..."));
            };
            let name = name.trim();
            let Some(key) = self.keys.iter_mut().find(|k| k.name == name) else {
                return Err(format!("{name:?} is not the name of a configured API key"));
            };
            if seen.contains(&name) {
                return Err(format!("key {name:?} is given twice"));
            }
            seen.push(name);
            let entries: Vec<String> = hosts
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter(|h| !h.is_empty())
                .map(str::to_string)
                .collect();
            let allow = Allowlist::parse_field(&format!("key {name:?}: egress"), &entries)
                .map_err(|error| error.to_string())?;
            key.egress = Arc::new(allow);
        }
        Ok(self)
    }

    /// The caller a presented key belongs to. Compares with every key, in
    /// constant time, whatever matches.
    pub fn check(&self, presented: &str) -> Option<Caller> {
        let presented = digest(presented);
        let mut found: Option<usize> = None;
        for (index, key) in self.keys.iter().enumerate() {
            let equal = digests_equal(&key.digest, &presented);
            // No branch on which key matched changes the work done.
            found = if equal { Some(index) } else { found };
        }
        let key = &self.keys[found?];
        Some(Caller {
            name: key.name.clone(),
            max_active: key.max_active,
            admin: key.admin,
            tenancy: key.tenancy,
            egress: Arc::clone(&key.egress),
            end_user: None,
        })
    }

    /// The caller of the key named `name` (for a setting that serves
    /// keyless requests as that key), if it is configured. Never with the
    /// admin scope: a request that presented no key is not an operator.
    pub fn caller(&self, name: &str) -> Option<Caller> {
        self.keys.iter().find(|k| k.name == name).map(|k| Caller {
            name: k.name.clone(),
            max_active: k.max_active,
            admin: false,
            tenancy: k.tenancy,
            egress: Arc::clone(&k.egress),
            end_user: None,
        })
    }

    /// A digest of the set of configured keys (not of their names or
    /// limits): the same for every replica configured with the same keys,
    /// in any order; see [`super::tokens`].
    pub fn fingerprint(&self) -> [u8; 32] {
        let mut digests: Vec<[u8; 32]> = self.keys.iter().map(|k| k.digest).collect();
        digests.sort_unstable();
        let mut hasher = Sha256::new();
        for digest in &digests {
            hasher.update(digest);
        }
        hasher.finalize().into()
    }

    /// The names of the configured keys.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|k| k.name.as_str())
    }

    /// Authenticates a request by its `Authorization: Bearer <key>` header.
    pub fn authenticate(&self, parts: &Parts) -> Result<Caller, ApiError> {
        // The rate limit's middleware already checked the key.
        if let Some(caller) = parts.extensions.get::<Caller>() {
            return Ok(caller.clone());
        }
        self.authenticate_headers(&parts.headers)
    }

    /// [`ApiKeys::authenticate`] from the headers alone.
    pub fn authenticate_headers(
        &self,
        headers: &axum::http::HeaderMap,
    ) -> Result<Caller, ApiError> {
        let value = headers
            .get(header::AUTHORIZATION)
            .ok_or(ApiError::Unauthorized("missing bearer api key"))?;
        let key = value
            .to_str()
            .ok()
            .and_then(|v| {
                let (scheme, key) = v.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
            })
            .ok_or(ApiError::Unauthorized(
                "the authorization header must be \"Bearer <api key>\"",
            ))?;
        self.check(key)
            .ok_or(ApiError::Unauthorized("invalid api key"))
    }
}

impl FromRequestParts<ApiState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, ApiError> {
        state.keys().authenticate(parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "alice-key-0123456789";
    const B: &str = "bob-key-abcdefghijkl";

    #[test]
    fn parses_names_keys_and_limits() {
        let keys = ApiKeys::parse(&format!(" alice:{A}:2 , bob:{B}:admin,")).unwrap();
        assert_eq!(keys.names().collect::<Vec<_>>(), ["alice", "bob"]);
        assert_eq!(
            keys.check(A),
            Some(Caller {
                name: "alice".into(),
                max_active: Some(2),
                admin: false,
                tenancy: Tenancy::default(),
                egress: Arc::default(),
                end_user: None,
            })
        );
        assert_eq!(
            keys.check(B),
            Some(Caller {
                name: "bob".into(),
                max_active: None,
                admin: true,
                tenancy: Tenancy::default(),
                egress: Arc::default(),
                end_user: None,
            })
        );
        let both = ApiKeys::parse(&format!("ops:{A}:admin:3")).unwrap();
        let ops = both.check(A).unwrap();
        assert_eq!((ops.max_active, ops.admin), (Some(3), true));
        assert!(ops.require_admin().is_ok());
        assert!(matches!(
            keys.check(A).unwrap().require_admin(),
            Err(ApiError::Forbidden(_))
        ));
        assert_eq!(keys.check("alice-key-012345678"), None);
        assert_eq!(keys.check(""), None);
        assert_eq!(format!("{keys:?}"), "[\"alice\", \"bob\"]");
    }

    #[test]
    fn egress_allowlists_are_given_by_key_name() {
        let keys = ApiKeys::parse(&format!("alice:{A},bob:{B}"))
            .unwrap()
            .with_egress(" alice = pypi.org *.pythonhosted.org,api.example.edu:8443 ; ")
            .unwrap();
        let alice = keys.check(A).unwrap();
        assert_eq!(
            alice.egress.entries(),
            ["pypi.org", "*.pythonhosted.org", "api.example.edu:8443"]
        );
        assert!(alice.egress.allows("files.pythonhosted.org", 443));
        assert!(!alice.egress.allows("api.example.edu", 443));
        // A key not named has none, as every key by default.
        assert!(keys.check(B).unwrap().egress.is_empty());
        assert!(keys.caller("alice").unwrap().egress.allows("pypi.org", 80));

        let parse = |text: &str| {
            ApiKeys::parse(&format!("alice:{A},bob:{B}"))
                .unwrap()
                .with_egress(text)
                .err()
        };
        assert_eq!(parse(""), None);
        assert_eq!(
            parse("carol=pypi.org").unwrap(),
            "\"carol\" is not the name of a configured API key"
        );
        assert_eq!(
            parse("pypi.org").unwrap(),
            "\"pypi.org\" is not name=host[ host]..."
        );
        assert_eq!(
            parse("alice=a.org;alice=b.org").unwrap(),
            "key \"alice\" is given twice"
        );
        assert_eq!(
            parse("bob=pypi.org 10.0.0.1").unwrap(),
            "key \"bob\": egress[1]: \"10.0.0.1\" is an IP address; name a host"
        );
        assert_eq!(
            parse("bob=pypi.org:0").unwrap(),
            "key \"bob\": egress[0]: \"pypi.org:0\" has a bad port"
        );
    }

    #[test]
    fn named_options_set_the_tenancy() {
        let keys = ApiKeys::parse(&format!(
            "school:{A}:max_active=50:weight=3:max_active_per_user=2:user_rate_per_minute=10:cpu_seconds_per_day=3600:user_cpu_seconds_per_day=60:user_jobs_per_day=100:admin"
        ))
        .unwrap();
        let school = keys.check(A).unwrap();
        assert_eq!((school.max_active, school.admin), (Some(50), true));
        assert_eq!(
            school.tenancy,
            Tenancy {
                weight: 3,
                max_active_per_user: Some(2),
                user_rate_per_minute: Some(10),
                cpu_seconds_per_day: Some(3600),
                user_cpu_seconds_per_day: Some(60),
                user_jobs_per_day: Some(100),
            }
        );
        assert_eq!(keys.caller("school").unwrap().tenancy, school.tenancy);
    }

    #[test]
    fn empty_configuration_is_an_error() {
        for text in ["", " ", ",,"] {
            assert_eq!(
                ApiKeys::parse(text).unwrap_err(),
                "no API keys configured; set CODE_RUNNER_API_KEYS"
            );
        }
    }

    #[test]
    fn errors_name_the_entry_and_never_the_key() {
        let cases = [
            (
                format!("alice:{A},bob"),
                "entry 2 is not name:key[:option]...",
            ),
            (
                format!("alice:{A}:1:2"),
                "key \"alice\": option max_active is given twice",
            ),
            (
                format!("alice:{A}:admin:admin"),
                "key \"alice\": option admin is given twice",
            ),
            (
                format!("alice:{A}:root"),
                "key \"alice\": option \"root\" is not admin, a max_active number or one of max_active=, weight=, max_active_per_user=, user_rate_per_minute=, cpu_seconds_per_day=, user_cpu_seconds_per_day=, user_jobs_per_day=<n>",
            ),
            (
                format!("alice:{A}:colour=3"),
                "key \"alice\": unknown option \"colour\"; the options are admin and max_active=, weight=, max_active_per_user=, user_rate_per_minute=, cpu_seconds_per_day=, user_cpu_seconds_per_day=, user_jobs_per_day=<n>",
            ),
            (
                format!("alice:{A}:weight=101"),
                "key \"alice\": weight 101 is above the most, 100",
            ),
            (
                format!("alice:{A}:weight=0"),
                "key \"alice\": weight \"0\" is not a positive integer",
            ),
            (
                format!("alice:{A}:max_active_per_user=2:max_active_per_user=3"),
                "key \"alice\": option max_active_per_user is given twice",
            ),
            (
                format!("alice:{A}:admin=1"),
                "key \"alice\": admin takes no value",
            ),
            (
                format!("al ice:{A}"),
                "entry 1: the name must be 1-64 letters, digits, '_' or '-'",
            ),
            (
                format!("{}:{A}", "n".repeat(65)),
                "entry 1: the name must be 1-64 letters, digits, '_' or '-'",
            ),
            (
                "alice:short-key".to_string(),
                "key \"alice\": the key must be at least 16 characters",
            ),
            (
                "alice:has a space in the key".to_string(),
                "key \"alice\": the key must be visible ASCII characters only",
            ),
            (
                format!("alice:{A}:0"),
                "key \"alice\": max_active \"0\" is not a positive integer",
            ),
            (
                format!("alice:{A}:-1"),
                "key \"alice\": max_active \"-1\" is not a positive integer",
            ),
            (
                format!("alice:{A},alice:{B}"),
                "key \"alice\" is configured twice",
            ),
            (
                format!("alice:{A},bob:{A}"),
                "keys \"alice\" and \"bob\" have the same secret",
            ),
        ];
        for (text, expected) in cases {
            let error = ApiKeys::parse(&text).unwrap_err();
            assert_eq!(error, expected, "for {text:?}");
            assert!(!error.contains(A) && !error.contains(B));
        }
    }

    #[test]
    fn bearer_header_is_required() {
        let keys = ApiKeys::parse(&format!("alice:{A}")).unwrap();
        let parts = |value: Option<&str>| {
            let mut request = axum::http::Request::builder();
            if let Some(value) = value {
                request = request.header(header::AUTHORIZATION, value);
            }
            request.body(()).unwrap().into_parts().0
        };
        assert_eq!(
            keys.authenticate(&parts(Some(&format!("Bearer {A}"))))
                .unwrap()
                .name,
            "alice"
        );
        assert_eq!(
            keys.authenticate(&parts(Some(&format!("bearer  {A} "))))
                .unwrap()
                .name,
            "alice"
        );
        for value in [None, Some(A), Some("Basic abc"), Some("Bearer nope")] {
            let error = keys.authenticate(&parts(value)).unwrap_err();
            assert!(matches!(error, ApiError::Unauthorized(_)), "{value:?}");
        }
    }

    #[test]
    fn digest_comparison() {
        let a = digest(A);
        let mut b = a;
        assert!(digests_equal(&a, &b));
        b[31] ^= 1;
        assert!(!digests_equal(&a, &b));
    }
}
