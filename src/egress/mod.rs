//! The egress proxy: outbound network by allowlist.
//!
//! Used by the sandbox engine (`sandbox/egress.rs`) for every job with
//! network: the job's `network.allow`, within its key's allowlist
//! (docs/egress.md). The sandbox's half is the supervisor's relay on its
//! loopback.
//!
//! A sandbox has no network. A job whose API key allows it may reach named
//! hosts through this proxy, which the worker runs for the job on a Unix
//! socket (one [`tokio::net::UnixListener`] per job, bound by the caller and
//! mounted into the sandbox). On each connection it speaks HTTP/1.1 proxy
//! protocol — `CONNECT host:port` tunnels and absolute-form plain HTTP
//! (`GET http://host/path`) — and relays to the upstream over TCP.
//!
//! # Threat model
//!
//! The job is hostile. The proxy is what stands between it and the worker's
//! network, so:
//!
//! - **What an allowed host can do.** The allowlist grants a TCP peer, not a
//!   protocol: through `CONNECT` the job may send that peer anything (TLS or
//!   not, any `Host` header, any SNI, so a shared CDN front may route on to
//!   other sites: domain fronting is the allowed host's business, not
//!   something this proxy can see into). Allow only hosts you would let the
//!   job talk to freely.
//! - **Names, not addresses.** Entries are host names (exact or `*.domain`);
//!   IP literals are refused as entries and never match a request. Without
//!   `:port` an entry allows ports 80 and 443 only ([`allowlist`]).
//! - **DNS rebinding.** Each connection resolves its host once; if *any*
//!   address of the answer is forbidden (loopback, private, link-local such
//!   as cloud metadata, CGNAT, multicast, reserved, unique-local, mapped or
//!   embedded forms of those, and the machine's own addresses —
//!   [`addresses`]) the connection is refused, so a round-robin answer
//!   cannot smuggle an internal address past the check; then it connects to
//!   the first address, pinned: never resolving again for that connection.
//!   A name whose answer changes between check and connect cannot slip
//!   through, because there is no second lookup.
//! - **Exfiltration and abuse** are bounded, not prevented: `max_bytes`
//!   (both directions, the whole job), `max_connections` (every connection
//!   the job opens, refused ones included), `max_concurrent`, and the
//!   timeouts. An allowed host can still receive up to `max_bytes` of
//!   whatever the job has.
//! - Every connection ends in one [`EgressEvent`] (host, address, verdict,
//!   bytes) for the job's record.
//!
//! Resolution uses the system resolver; search domains of
//! `/etc/resolv.conf` may therefore expand a name, but whatever it resolves
//! to still passes the address policy.
//!
//! # Use
//!
//! ```no_run
//! # async fn demo(listener: tokio::net::UnixListener) {
//! use std::sync::Arc;
//! use code_runner::egress::{Allowlist, EgressHandle, EgressPolicy};
//!
//! let allow = Allowlist::parse(&["pypi.org".into(), "*.pythonhosted.org".into()]).unwrap();
//! let (handle, mut events) = EgressHandle::start(listener, Arc::new(EgressPolicy::new(allow)));
//! // ... run the job; drain `events` into the job's record ...
//! let totals = handle.stop().await;
//! # let _ = (totals, events.try_recv());
//! # }
//! ```

pub mod addresses;
pub mod allowlist;
mod http;
mod proxy;
pub mod resolver;

#[cfg(test)]
mod tests;

use std::net::IpAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use addresses::{check_address, is_forbidden, own_addresses};
pub use allowlist::{Allowlist, AllowlistError};
pub use http::MAX_HEAD;
pub use proxy::{EgressHandle, EgressTotals, JobEgress, serve, serve_counted};
pub use resolver::{Resolver, Scripted};

/// What a job's proxy allows.
#[derive(Debug)]
pub struct EgressPolicy {
    /// The hosts (and ports) the job may reach.
    pub allow: Allowlist,
    /// Bytes relayed in both directions over the whole job. Once spent, open
    /// connections are closed and new ones refused (`429`).
    pub max_bytes: u64,
    /// Connections the job may open over its life, allowed or not (refused
    /// ones count too); past it, `429`.
    pub max_connections: u32,
    /// Connections handled at once (at least 1); further ones wait, unaccepted,
    /// in the listener's backlog.
    pub max_concurrent: u32,
    /// For resolving the host and for the TCP connect, each.
    pub connect_timeout: Duration,
    /// A relay that moves no byte either way for this long is closed. The
    /// request head must arrive within it too (and within 10 s).
    pub idle_timeout: Duration,
    /// Where addresses come from.
    pub resolver: Resolver,
    /// The machine's own addresses, refused ([`own_addresses`]).
    pub own: Vec<IpAddr>,
    /// Tests only: let loopback (`127/8`, `::1`) through. Nothing else:
    /// private, link-local and the rest stay refused.
    pub allow_loopback_for_tests: bool,
}

impl EgressPolicy {
    /// `allow` with this module's defaults: 64 MiB, 256 connections, 16 at
    /// once, 10 s to resolve or connect, 60 s idle, the system resolver and
    /// [`own_addresses`], loopback refused.
    pub fn new(allow: Allowlist) -> EgressPolicy {
        EgressPolicy {
            allow,
            max_bytes: 64 << 20,
            max_connections: 256,
            max_concurrent: 16,
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            resolver: Resolver::System,
            own: own_addresses(),
            allow_loopback_for_tests: false,
        }
    }
}

/// One connection through the proxy, reported when it ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressEvent {
    /// The requested host, lowercased (empty when the request did not parse).
    pub host: String,
    /// The requested port (0 when the request did not parse).
    pub port: u16,
    /// The address connected to, or the forbidden one that refused it.
    pub address: Option<IpAddr>,
    /// Whether the connection passed the checks and was relayed.
    pub allowed: bool,
    /// Why it was refused or ended early: one of [`reason`]; `None` for a
    /// relay that ended by either side closing.
    pub reason: Option<String>,
    /// Bytes relayed job → upstream (including a rewritten request head).
    pub bytes_up: u64,
    /// Bytes relayed upstream → job.
    pub bytes_down: u64,
}

/// The values of [`EgressEvent::reason`].
pub mod reason {
    /// The host or port is not in the allowlist (or the host is an IP).
    pub const NOT_ALLOWED: &str = "not_allowed";
    /// The host resolves to an address the policy forbids.
    pub const FORBIDDEN_ADDRESS: &str = "forbidden_address";
    /// The host did not resolve (error, timeout, or no address).
    pub const DNS_FAILED: &str = "dns_failed";
    /// The TCP connect failed.
    pub const CONNECT_FAILED: &str = "connect_failed";
    /// The TCP connect timed out.
    pub const CONNECT_TIMEOUT: &str = "connect_timeout";
    /// The job's byte allowance ran out (closing a relay or refusing a new
    /// connection).
    pub const BYTE_CAP: &str = "byte_cap";
    /// The job had opened `max_connections` already.
    pub const CONNECTION_CAP: &str = "connection_cap";
    /// The request was not a proxy request this proxy understands.
    pub const BAD_REQUEST: &str = "bad_request";
    /// The request head exceeded [`super::MAX_HEAD`].
    pub const HEAD_TOO_LARGE: &str = "head_too_large";
    /// The request head did not arrive in time.
    pub const HEAD_TIMEOUT: &str = "head_timeout";
    /// The relay moved nothing for `idle_timeout`.
    pub const IDLE_TIMEOUT: &str = "idle_timeout";
    /// A read or write failed mid-relay.
    pub const IO_ERROR: &str = "io_error";
    /// The proxy was stopped.
    pub const STOPPED: &str = "stopped";
}
