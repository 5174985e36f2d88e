//! Cross-origin requests to a compatible API, as its original answers them:
//! Judge0 CE (rack-cors, `ALLOW_ORIGIN` blank) and Jobe both let a page of
//! any origin call them, preflights included. An operator may narrow that
//! to a list of origins, or turn it off.

use std::time::Duration;

use axum::http::HeaderValue;
use tower_http::cors::{AllowOrigin, Any, CorsLayer};

/// Which origins' pages may call an API from a browser.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CorsOrigins {
    /// Any origin (`*`): what Judge0 and Jobe do by default.
    #[default]
    Any,
    /// Only these origins (`https://quiz.example.edu`), each echoed back
    /// to its own page.
    List(Vec<String>),
    /// No cross-origin answers: preflights are refused as an unknown method.
    Off,
}

impl CorsOrigins {
    /// Parses a setting's value: `*`, `off`, or origins separated by commas
    /// (`scheme://host[:port]`, http or https, nothing after). The error says
    /// what is wrong with which origin.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        match text {
            "*" => return Ok(Self::Any),
            "off" => return Ok(Self::Off),
            "" => {
                return Err(
                    "is empty: give *, off, or origins like https://quiz.example.edu".into(),
                );
            }
            _ => {}
        }
        let mut origins = Vec::new();
        for origin in text.split(',').map(str::trim) {
            check_origin(origin)?;
            origins.push(origin.to_string());
        }
        Ok(Self::List(origins))
    }

    /// The layer that answers preflights and marks answers for `self`'s
    /// origins; `None` when off. Any method and any request header are
    /// allowed (as rack-cors' `methods: :any, headers: :any`); browsers may
    /// keep a preflight's answer for two hours (its default `max_age`).
    pub fn layer(&self) -> Option<CorsLayer> {
        let origin = match self {
            Self::Off => return None,
            Self::Any => AllowOrigin::any(),
            Self::List(origins) => AllowOrigin::list(
                origins
                    .iter()
                    .map(|o| HeaderValue::from_str(o).expect("checked when parsed")),
            ),
        };
        Some(
            CorsLayer::new()
                .allow_origin(origin)
                .allow_methods(Any)
                .allow_headers(Any)
                .max_age(Duration::from_secs(7200)),
        )
    }
}

/// An origin as a browser sends it: `http://` or `https://`, a host of
/// letters, digits, `-` and `.` (or a bracketed IPv6 address), an optional
/// port, nothing after.
fn check_origin(origin: &str) -> Result<(), String> {
    let rest = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"))
        .ok_or_else(|| {
            format!("{origin:?} is not an origin: it must start with http:// or https://")
        })?;
    let not_an_origin =
        || format!("{origin:?} is not an origin: scheme://host[:port], nothing after the port");
    let (host_ok, port) = match rest.strip_prefix('[') {
        Some(bracketed) => {
            let (address, tail) = bracketed.split_once(']').ok_or_else(not_an_origin)?;
            let port = match tail {
                "" => None,
                tail => Some(tail.strip_prefix(':').ok_or_else(not_an_origin)?),
            };
            (address.parse::<std::net::Ipv6Addr>().is_ok(), port)
        }
        None => {
            let (host, port) = match rest.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (rest, None),
            };
            let host_ok = !host.is_empty()
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
            (host_ok, port)
        }
    };
    let port_ok = port.is_none_or(|p| p.parse::<u16>().is_ok_and(|n| n > 0));
    if host_ok && port_ok {
        Ok(())
    } else {
        Err(not_an_origin())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_to_any_off_or_a_checked_list() {
        assert_eq!(CorsOrigins::parse("*"), Ok(CorsOrigins::Any));
        assert_eq!(CorsOrigins::parse("off"), Ok(CorsOrigins::Off));
        assert_eq!(
            CorsOrigins::parse("https://quiz.example.edu, http://localhost:8080,http://[::1]:3000"),
            Ok(CorsOrigins::List(vec![
                "https://quiz.example.edu".into(),
                "http://localhost:8080".into(),
                "http://[::1]:3000".into(),
            ]))
        );
        for (bad, message) in [
            (
                "",
                "is empty: give *, off, or origins like https://quiz.example.edu",
            ),
            (
                "quiz.example.edu",
                "\"quiz.example.edu\" is not an origin: it must start with http:// or https://",
            ),
            (
                "https://quiz.example.edu/",
                "\"https://quiz.example.edu/\" is not an origin: scheme://host[:port], nothing after the port",
            ),
            (
                "https://a.example,https://b.example:99999",
                "\"https://b.example:99999\" is not an origin: scheme://host[:port], nothing after the port",
            ),
            (
                "https://",
                "\"https://\" is not an origin: scheme://host[:port], nothing after the port",
            ),
            (
                "https://a.example,",
                "\"\" is not an origin: it must start with http:// or https://",
            ),
        ] {
            assert_eq!(CorsOrigins::parse(bad), Err(message.to_string()), "{bad:?}");
        }
    }
}
