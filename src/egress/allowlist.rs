//! The egress allowlist: which host names (and ports) a job may reach.
//!
//! An entry is an exact host (`pypi.org`) or a wildcard (`*.example.com`,
//! any subdomain at any depth but not `example.com` itself), either with an
//! optional `:port`. Without a port an entry allows 80 and 443 only. Hosts
//! are compared lowercased, without a trailing dot. IP literals are refused
//! as entries: an allowlist names hosts, and what a host resolves to is the
//! address policy's business ([`super::addresses`]).

use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Most entries an allowlist may have.
pub const MAX_ENTRIES: usize = 64;
/// Longest entry, in bytes (the longest DNS name).
pub const MAX_ENTRY_LEN: usize = 253;
/// The ports an entry without `:port` allows.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// A parsed allowlist. Serialized as its entries, a list of strings in
/// canonical form (lowercased, no trailing dot).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    entries: Vec<Entry>,
}

/// One entry: a host pattern and the ports it allows.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    host: HostPattern,
    /// `None`: [`DEFAULT_PORTS`].
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    /// This host only.
    Exact(String),
    /// Any strict subdomain of this domain (stored without the `*.`).
    Wildcard(String),
}

/// Why an allowlist entry was refused. Each names the entry by its field
/// and index, e.g. `network.allow[2]: "10.0.0.1" is an IP address; name a
/// host`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllowlistError {
    #[error("{field}: {count} entries; at most {MAX_ENTRIES}")]
    TooMany { field: String, count: usize },
    #[error("{field}[{index}]: {entry:?} is longer than {MAX_ENTRY_LEN} characters")]
    TooLong {
        field: String,
        index: usize,
        entry: String,
    },
    #[error("{field}[{index}]: {entry:?} is an IP address; name a host")]
    IpAddress {
        field: String,
        index: usize,
        entry: String,
    },
    #[error("{field}[{index}]: {entry:?} is not a host name")]
    BadHost {
        field: String,
        index: usize,
        entry: String,
    },
    #[error("{field}[{index}]: {entry:?} has a bad port")]
    BadPort {
        field: String,
        index: usize,
        entry: String,
    },
}

impl AllowlistError {
    /// What the error is about: the entry (`network.allow[2]`), or the
    /// whole field for too many entries.
    pub fn field(&self) -> String {
        match self {
            AllowlistError::TooMany { field, .. } => field.clone(),
            AllowlistError::TooLong { field, index, .. }
            | AllowlistError::IpAddress { field, index, .. }
            | AllowlistError::BadHost { field, index, .. }
            | AllowlistError::BadPort { field, index, .. } => format!("{field}[{index}]"),
        }
    }

    /// The error without its [`Self::field`] (what follows it in the
    /// message).
    pub fn problem(&self) -> String {
        let message = self.to_string();
        message
            .strip_prefix(&format!("{}: ", self.field()))
            .map(str::to_string)
            .unwrap_or(message)
    }
}

impl Allowlist {
    /// Parses the entries of a job's `network.allow`.
    pub fn parse(entries: &[String]) -> Result<Allowlist, AllowlistError> {
        Self::parse_field("network.allow", entries)
    }

    /// Parses entries, naming them `field[i]` in errors (e.g. a key's
    /// `egress` setting).
    pub fn parse_field(field: &str, entries: &[String]) -> Result<Allowlist, AllowlistError> {
        if entries.len() > MAX_ENTRIES {
            return Err(AllowlistError::TooMany {
                field: field.to_owned(),
                count: entries.len(),
            });
        }
        let mut parsed: Vec<Entry> = Vec::with_capacity(entries.len());
        for (index, raw) in entries.iter().enumerate() {
            let entry = parse_entry(raw).map_err(|kind| kind.into_error(field, index, raw))?;
            if !parsed.contains(&entry) {
                parsed.push(entry);
            }
        }
        Ok(Allowlist { entries: parsed })
    }

    /// No entries: nothing is allowed.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The number of (distinct) entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The entries in canonical form.
    pub fn entries(&self) -> Vec<String> {
        self.entries.iter().map(Entry::to_string).collect()
    }

    /// Whether `host:port` is allowed. `host` is normalized as entries are
    /// (lowercased, one trailing dot stripped); a host that is not a valid
    /// name (an IP literal included) is never allowed.
    pub fn allows(&self, host: &str, port: u16) -> bool {
        let Some(host) = normalize_host(host) else {
            return false;
        };
        self.entries
            .iter()
            .any(|e| e.host.matches(&host) && e.allows_port(port))
    }

    /// Whether some entry names `host`, whatever its port (to tell "host not
    /// listed" from "port not listed" in refusals).
    pub fn lists_host(&self, host: &str) -> bool {
        let Some(host) = normalize_host(host) else {
            return false;
        };
        self.entries.iter().any(|e| e.host.matches(&host))
    }

    /// Checks that everything `self` allows, `wider` allows too: each entry
    /// of `self`, on each of its ports, is within some entry of `wider`. An
    /// exact host is within an equal host or a wildcard of a parent domain;
    /// a wildcard is within an equal wildcard or one of a parent domain. The
    /// error names the first entry that is not, e.g. `pypi.org is not in the
    /// key's egress allowlist`.
    pub fn check_subset(&self, wider: &Allowlist) -> Result<(), String> {
        for entry in &self.entries {
            let within = entry.ports().iter().all(|&port| {
                wider
                    .entries
                    .iter()
                    .any(|w| w.allows_port(port) && w.host.contains(&entry.host))
            });
            if !within {
                return Err(format!("{entry} is not in the key's egress allowlist"));
            }
        }
        Ok(())
    }
}

impl Entry {
    fn allows_port(&self, port: u16) -> bool {
        match self.port {
            Some(p) => p == port,
            None => DEFAULT_PORTS.contains(&port),
        }
    }

    fn ports(&self) -> Vec<u16> {
        match self.port {
            Some(p) => vec![p],
            None => DEFAULT_PORTS.to_vec(),
        }
    }
}

impl HostPattern {
    /// Whether the (normalized) host matches.
    fn matches(&self, host: &str) -> bool {
        match self {
            HostPattern::Exact(h) => h == host,
            HostPattern::Wildcard(domain) => is_strict_subdomain(host, domain),
        }
    }

    /// Whether every host `other` matches, `self` matches too.
    fn contains(&self, other: &HostPattern) -> bool {
        match (self, other) {
            (HostPattern::Exact(a), HostPattern::Exact(b)) => a == b,
            (HostPattern::Exact(_), HostPattern::Wildcard(_)) => false,
            (HostPattern::Wildcard(d), HostPattern::Exact(h)) => is_strict_subdomain(h, d),
            (HostPattern::Wildcard(d), HostPattern::Wildcard(e)) => {
                d == e || is_strict_subdomain(e, d)
            }
        }
    }
}

/// `host` is `something.domain`.
fn is_strict_subdomain(host: &str, domain: &str) -> bool {
    host.len() > domain.len() + 1
        && host.ends_with(domain)
        && host.as_bytes()[host.len() - domain.len() - 1] == b'.'
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            HostPattern::Exact(h) => f.write_str(h)?,
            HostPattern::Wildcard(d) => write!(f, "*.{d}")?,
        }
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Allowlist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.entries.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// What was wrong with an entry, before it is named.
enum EntryFault {
    TooLong,
    IpAddress,
    BadHost,
    BadPort,
}

impl EntryFault {
    fn into_error(self, field: &str, index: usize, entry: &str) -> AllowlistError {
        let (field, entry) = (field.to_owned(), entry.to_owned());
        match self {
            EntryFault::TooLong => AllowlistError::TooLong {
                field,
                index,
                entry,
            },
            EntryFault::IpAddress => AllowlistError::IpAddress {
                field,
                index,
                entry,
            },
            EntryFault::BadHost => AllowlistError::BadHost {
                field,
                index,
                entry,
            },
            EntryFault::BadPort => AllowlistError::BadPort {
                field,
                index,
                entry,
            },
        }
    }
}

fn parse_entry(raw: &str) -> Result<Entry, EntryFault> {
    if raw.len() > MAX_ENTRY_LEN {
        return Err(EntryFault::TooLong);
    }
    // A URL or a path, not a host.
    if raw.contains('/') {
        return Err(EntryFault::BadHost);
    }
    // Bracketed or bare IPv6 literals (`[::1]:443`, `::1`).
    if raw.starts_with('[') || raw.matches(':').count() > 1 {
        let inner = raw
            .trim_start_matches('[')
            .split(']')
            .next()
            .unwrap_or_default();
        if inner.parse::<IpAddr>().is_ok() || raw.parse::<IpAddr>().is_ok() {
            return Err(EntryFault::IpAddress);
        }
        return Err(EntryFault::BadHost);
    }
    let (host, port) = match raw.rsplit_once(':') {
        Some((host, port)) => (host, Some(parse_port(port).ok_or(EntryFault::BadPort)?)),
        None => (raw, None),
    };
    let (wildcard, name) = match host.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, host),
    };
    let name = name.to_ascii_lowercase();
    let name = name.strip_suffix('.').unwrap_or(&name);
    if looks_like_ip(name) {
        return Err(EntryFault::IpAddress);
    }
    if !is_host_name(name) {
        return Err(EntryFault::BadHost);
    }
    let host = if wildcard {
        HostPattern::Wildcard(name.to_owned())
    } else {
        HostPattern::Exact(name.to_owned())
    };
    Ok(Entry { host, port })
}

/// A decimal port 1–65535, digits only.
pub(crate) fn parse_port(s: &str) -> Option<u16> {
    if s.is_empty() || s.len() > 5 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<u16>().ok().filter(|&p| p != 0)
}

/// Lowercases, strips one trailing dot, and checks `host` is a host name
/// (not an IP literal, not a numeric form a resolver would take for one).
pub(crate) fn normalize_host(host: &str) -> Option<String> {
    let host = host.to_ascii_lowercase();
    let host = host.strip_suffix('.').unwrap_or(&host);
    (!looks_like_ip(host) && is_host_name(host)).then(|| host.to_owned())
}

/// An IP literal, or a name whose last label is numeric (`127.1`,
/// `0x7f.1`): `inet_aton`-style resolvers read those as addresses.
fn looks_like_ip(name: &str) -> bool {
    if name.parse::<IpAddr>().is_ok() {
        return true;
    }
    let last = name.rsplit('.').next().unwrap_or(name);
    let hex = last
        .strip_prefix("0x")
        .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
    hex || (!last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()))
}

/// Dot-separated labels of 1–63 letters, digits and hyphens, not starting
/// or ending with a hyphen; at most 253 bytes in all.
fn is_host_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_ENTRY_LEN
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

impl Serialize for Allowlist {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.entries.iter().map(Entry::to_string))
    }
}

impl<'de> Deserialize<'de> for Allowlist {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let entries = Vec::<String>::deserialize(deserializer)?;
        Allowlist::parse(&entries).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> Allowlist {
        let entries: Vec<String> = entries.iter().map(|s| s.to_string()).collect();
        Allowlist::parse(&entries).unwrap()
    }

    fn err(entries: &[&str]) -> String {
        let entries: Vec<String> = entries.iter().map(|s| s.to_string()).collect();
        Allowlist::parse(&entries).unwrap_err().to_string()
    }

    #[test]
    fn exact_hosts_allow_80_and_443_only() {
        let a = list(&["pypi.org"]);
        assert!(a.allows("pypi.org", 443));
        assert!(a.allows("pypi.org", 80));
        assert!(!a.allows("pypi.org", 22));
        assert!(!a.allows("pypi.org", 8443));
        assert!(!a.allows("files.pypi.org", 443));
        assert!(!a.allows("pypi.org.evil.example", 443));
        assert!(!a.allows("xpypi.org", 443));
    }

    #[test]
    fn hosts_are_normalized() {
        let a = list(&["PyPI.Org."]);
        assert_eq!(a.entries(), vec!["pypi.org"]);
        assert!(a.allows("PYPI.ORG", 443));
        assert!(a.allows("pypi.org.", 443));
        assert!(!a.allows("pypi.org..", 443));
        assert!(!a.allows("", 443));
    }

    #[test]
    fn wildcards_match_subdomains_at_any_depth_not_the_domain() {
        let a = list(&["*.example.com"]);
        assert!(a.allows("a.example.com", 443));
        assert!(a.allows("a.b.c.example.com", 80));
        assert!(!a.allows("example.com", 443));
        assert!(!a.allows("badexample.com", 443));
        assert!(!a.allows("a.example.com", 8080));
        assert!(!a.allows("a.example.com.evil", 443));
    }

    #[test]
    fn explicit_ports_allow_that_port_only() {
        let a = list(&["api.example.com:8443", "*.example.org:443"]);
        assert!(a.allows("api.example.com", 8443));
        assert!(!a.allows("api.example.com", 443));
        assert!(!a.allows("api.example.com", 80));
        assert!(a.allows("x.example.org", 443));
        assert!(!a.allows("x.example.org", 80));
        assert_eq!(
            a.entries(),
            vec!["api.example.com:8443", "*.example.org:443"]
        );
        assert!(a.lists_host("api.example.com"));
        assert!(!a.lists_host("example.org"));
    }

    #[test]
    fn ip_literals_are_never_allowed_hosts() {
        let a = list(&["*.example.com"]);
        assert!(!a.allows("10.0.0.1", 443));
        assert!(!a.allows("::1", 443));
        assert!(!a.allows("[::1]", 443));
        assert!(!a.allows("evil host.example.com", 443));
        assert!(!a.allows("a\r\n.example.com", 443));
        assert!(!a.allows("a_b.example.com", 443));
    }

    #[test]
    fn errors_name_the_entry() {
        assert_eq!(
            err(&["pypi.org", "ok.example", "10.0.0.1"]),
            r#"network.allow[2]: "10.0.0.1" is an IP address; name a host"#
        );
        assert_eq!(
            err(&["[::1]:443"]),
            r#"network.allow[0]: "[::1]:443" is an IP address; name a host"#
        );
        assert_eq!(
            err(&["fe80::1"]),
            r#"network.allow[0]: "fe80::1" is an IP address; name a host"#
        );
        assert_eq!(
            err(&["10.0.0.1:80"]),
            r#"network.allow[0]: "10.0.0.1:80" is an IP address; name a host"#
        );
        assert_eq!(
            err(&["a.example", "127.1"]),
            r#"network.allow[1]: "127.1" is an IP address; name a host"#
        );
        assert_eq!(
            err(&["0x7f.1"]),
            r#"network.allow[0]: "0x7f.1" is an IP address; name a host"#
        );
        for bad in [
            "",
            "*",
            "*.",
            "a..b",
            "-a.example",
            "a-.example",
            "a b.example",
            "a/b",
            "http://pypi.org",
            "*.*.example.com",
            "a.*.example.com",
            "ex*ample.com",
        ] {
            assert_eq!(
                err(&[bad]),
                format!("network.allow[0]: {bad:?} is not a host name"),
                "{bad}"
            );
        }
        for bad in [
            "pypi.org:",
            "pypi.org:0",
            "pypi.org:65536",
            "pypi.org:+1",
            "pypi.org:x",
        ] {
            assert_eq!(
                err(&[bad]),
                format!("network.allow[0]: {bad:?} has a bad port"),
                "{bad}"
            );
        }
        let long = format!("{}.example", "a".repeat(250));
        assert!(err(&[&long]).contains("is longer than 253 characters"));
        let label = format!("{}.example", "a".repeat(64));
        assert!(err(&[&label]).contains("is not a host name"));
        let many: Vec<String> = (0..65).map(|i| format!("h{i}.example")).collect();
        assert_eq!(
            Allowlist::parse(&many).unwrap_err().to_string(),
            "network.allow: 65 entries; at most 64"
        );
        let max: Vec<String> = (0..64).map(|i| format!("h{i}.example")).collect();
        assert_eq!(Allowlist::parse(&max).unwrap().len(), 64);
        let named = Allowlist::parse_field("key.egress", &["1.2.3.4".to_string()]).unwrap_err();
        assert!(named.to_string().starts_with("key.egress[0]: "));
    }

    #[test]
    fn empty_allows_nothing() {
        let a = list(&[]);
        assert!(a.is_empty());
        assert!(!a.allows("pypi.org", 443));
        assert!(a.check_subset(&list(&[])).is_ok());
    }

    #[test]
    fn subsets() {
        let key = list(&["pypi.org", "*.pythonhosted.org", "api.example.com:8443"]);
        assert!(list(&["pypi.org"]).check_subset(&key).is_ok());
        assert!(list(&["pypi.org:443"]).check_subset(&key).is_ok());
        assert!(list(&["files.pythonhosted.org"]).check_subset(&key).is_ok());
        assert!(list(&["*.pythonhosted.org"]).check_subset(&key).is_ok());
        assert!(
            list(&["*.cdn.pythonhosted.org:80"])
                .check_subset(&key)
                .is_ok()
        );
        assert!(list(&["api.example.com:8443"]).check_subset(&key).is_ok());
        assert!(list(&[]).check_subset(&key).is_ok());
        assert!(key.check_subset(&key).is_ok());

        assert_eq!(
            list(&["pythonhosted.org"]).check_subset(&key).unwrap_err(),
            "pythonhosted.org is not in the key's egress allowlist"
        );
        assert_eq!(
            list(&["pypi.org:8080"]).check_subset(&key).unwrap_err(),
            "pypi.org:8080 is not in the key's egress allowlist"
        );
        assert_eq!(
            list(&["api.example.com"]).check_subset(&key).unwrap_err(),
            "api.example.com is not in the key's egress allowlist"
        );
        assert_eq!(
            list(&["*.pypi.org"]).check_subset(&key).unwrap_err(),
            "*.pypi.org is not in the key's egress allowlist"
        );
        assert_eq!(
            list(&["pypi.org", "github.com", "gitlab.com"])
                .check_subset(&key)
                .unwrap_err(),
            "github.com is not in the key's egress allowlist"
        );
        // Ports of an entry may be covered by different wider entries.
        let split = list(&["pypi.org:80", "pypi.org:443"]);
        assert!(list(&["pypi.org"]).check_subset(&split).is_ok());
        assert!(
            list(&["pypi.org"])
                .check_subset(&list(&["pypi.org:443"]))
                .is_err()
        );
        assert!(
            list(&["*.example.com"])
                .check_subset(&list(&["*.example.com:443"]))
                .is_err()
        );
    }

    #[test]
    fn serde_round_trip_as_strings() {
        let a = list(&["PyPI.org", "*.example.com:443"]);
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(json, r#"["pypi.org","*.example.com:443"]"#);
        let back: Allowlist = serde_json::from_str(&json).unwrap();
        assert_eq!(back, a);
        let bad = serde_json::from_str::<Allowlist>(r#"["ok.example","10.0.0.1"]"#).unwrap_err();
        assert!(bad.to_string().contains("network.allow[1]"), "{bad}");
    }
}
