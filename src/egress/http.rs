//! The request heads the proxy understands: `CONNECT host:port` and
//! absolute-form plain HTTP (`GET http://host[:port]/path`), the latter
//! rewritten to origin form for the upstream.

use super::allowlist::parse_port;

/// Longest request head (request line and headers, with the blank line).
pub const MAX_HEAD: usize = 16 * 1024;

/// A parsed proxy request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    /// A tunnel to `host:port`.
    Connect { host: String, port: u16 },
    /// Plain HTTP to `host:port`; `head` is the request head to send
    /// upstream (origin form, `Host` from the target, no `Proxy-*`,
    /// `Connection: close`).
    Http {
        host: String,
        port: u16,
        head: Vec<u8>,
    },
}

/// Why a head was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HeadError {
    /// 400, with why.
    Bad(&'static str),
    /// 405: an origin-form request; this is a proxy, not a server.
    NotAProxyRequest,
}

/// The length of the head in `buf` (through the blank line), once there.
pub(crate) fn head_len(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

/// Headers the proxy does not forward: its own, hop-by-hop ones, and
/// `Host`, which it sets from the request target (RFC 9112 §3.2.2).
const DROPPED: [&str; 5] = [
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
];

/// Parses a head as [`head_len`] delimits it (ending in `\r\n\r\n`).
pub(crate) fn parse(head: &[u8]) -> Result<Request, HeadError> {
    let text = std::str::from_utf8(head).map_err(|_| HeadError::Bad("the head is not UTF-8"))?;
    let text = text
        .strip_suffix("\r\n\r\n")
        .ok_or(HeadError::Bad("the head does not end in a blank line"))?;
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    if text.split("\r\n").any(|l| l.contains(['\r', '\n'])) {
        return Err(HeadError::Bad("bare CR or LF in the head"));
    }
    let parts: Vec<&str> = request_line.split(' ').collect();
    let [method, target, version] = parts[..] else {
        return Err(HeadError::Bad(
            "the request line is not METHOD TARGET VERSION",
        ));
    };
    if method.is_empty() || !method.bytes().all(is_tchar) {
        return Err(HeadError::Bad("bad method"));
    }
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(HeadError::Bad("not HTTP/1.0 or HTTP/1.1"));
    }
    let mut headers: Vec<(&str, &str)> = Vec::new();
    for line in lines {
        if line.starts_with([' ', '\t']) {
            return Err(HeadError::Bad("folded header"));
        }
        let (name, value) = line.split_once(':').ok_or(HeadError::Bad("bad header"))?;
        if name.is_empty() || !name.bytes().all(is_tchar) {
            return Err(HeadError::Bad("bad header name"));
        }
        let value = value.trim_matches([' ', '\t']);
        if value.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f) {
            return Err(HeadError::Bad("control character in a header"));
        }
        headers.push((name, value));
    }

    if method == "CONNECT" {
        let (host, port) = authority(target, None)?;
        return Ok(Request::Connect { host, port });
    }
    if target.starts_with('/') {
        return Err(HeadError::NotAProxyRequest);
    }
    let lower = target.get(..8).unwrap_or(target).to_ascii_lowercase();
    if lower.starts_with("https://") {
        return Err(HeadError::Bad("https:// targets go through CONNECT"));
    }
    if !lower.starts_with("http://") {
        return Err(HeadError::Bad("the target is not http://host/path"));
    }
    let rest = &target["http://".len()..];
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (auth, path) = rest.split_at(end);
    if auth.contains('@') {
        return Err(HeadError::Bad("user info in the target"));
    }
    let (host, port) = authority(auth, Some(80))?;
    let path = path.split('#').next().unwrap_or_default();
    if path.bytes().any(|b| b <= 0x20 || b == 0x7f) {
        return Err(HeadError::Bad("bad path"));
    }
    let path = match path {
        "" => "/".to_owned(),
        p if p.starts_with('?') => format!("/{p}"),
        p => p.to_owned(),
    };
    let host_header = match (host.contains(':'), port) {
        (true, 80) => format!("[{host}]"),
        (true, _) => format!("[{host}]:{port}"),
        (false, 80) => host.clone(),
        (false, _) => format!("{host}:{port}"),
    };
    let mut out = format!("{method} {path} {version}\r\nHost: {host_header}\r\n");
    for (name, value) in headers {
        if !DROPPED.iter().any(|d| name.eq_ignore_ascii_case(d)) {
            out.push_str(name);
            out.push_str(": ");
            out.push_str(value);
            out.push_str("\r\n");
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    Ok(Request::Http {
        host,
        port,
        head: out.into_bytes(),
    })
}

/// `host:port` (or `[v6]:port`); the port may be omitted (or empty) only
/// when there is a default. The host is lowercased, not otherwise checked
/// (the allowlist does that).
fn authority(s: &str, default_port: Option<u16>) -> Result<(String, u16), HeadError> {
    let (host, port) = if let Some(bracketed) = s.strip_prefix('[') {
        let (host, after) = bracketed
            .split_once(']')
            .ok_or(HeadError::Bad("bad authority"))?;
        match after {
            "" => (host, None),
            p => (
                host,
                Some(p.strip_prefix(':').ok_or(HeadError::Bad("bad authority"))?),
            ),
        }
    } else {
        match s.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (s, None),
        }
    };
    if host.is_empty() || (host.contains(':') && !s.starts_with('[')) {
        return Err(HeadError::Bad("bad authority"));
    }
    let port = match (port, default_port) {
        (None | Some(""), Some(default)) => default,
        (None | Some(""), None) => return Err(HeadError::Bad("CONNECT needs host:port")),
        (Some(p), _) => parse_port(p).ok_or(HeadError::Bad("bad port"))?,
    };
    Ok((host.to_ascii_lowercase(), port))
}

/// RFC 9110 token characters.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(head: &str) -> (String, u16, String) {
        match parse(head.as_bytes()).unwrap() {
            Request::Http { host, port, head } => (host, port, String::from_utf8(head).unwrap()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn finds_the_end_of_the_head() {
        assert_eq!(head_len(b"GET / HTTP/1.1\r\n\r\nbody"), Some(18));
        assert_eq!(head_len(b"GET / HTTP/1.1\r\n"), None);
    }

    #[test]
    fn connect() {
        assert_eq!(
            parse(b"CONNECT Pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n"),
            Ok(Request::Connect {
                host: "pypi.org".into(),
                port: 443
            })
        );
        assert_eq!(
            parse(b"CONNECT [::1]:8443 HTTP/1.1\r\n\r\n"),
            Ok(Request::Connect {
                host: "::1".into(),
                port: 8443
            })
        );
        assert_eq!(
            parse(b"CONNECT pypi.org HTTP/1.1\r\n\r\n"),
            Err(HeadError::Bad("CONNECT needs host:port"))
        );
        assert_eq!(
            parse(b"CONNECT pypi.org:0 HTTP/1.1\r\n\r\n"),
            Err(HeadError::Bad("bad port"))
        );
        assert_eq!(
            parse(b"CONNECT ::1:443 HTTP/1.1\r\n\r\n"),
            Err(HeadError::Bad("bad authority"))
        );
    }

    #[test]
    fn absolute_form_is_rewritten_to_origin_form() {
        let (host, port, head) = http(
            "GET http://Example.test:8080/x?y=1#frag HTTP/1.1\r\n\
             Host: evil.test\r\n\
             User-Agent: t\r\n\
             Proxy-Connection: keep-alive\r\n\
             proxy-authorization: Basic Zm9v\r\n\
             Connection: keep-alive\r\n\
             Keep-Alive: 5\r\n\
             Accept:  */* \r\n\r\n",
        );
        assert_eq!((host.as_str(), port), ("example.test", 8080));
        assert_eq!(
            head,
            "GET /x?y=1 HTTP/1.1\r\nHost: example.test:8080\r\nUser-Agent: t\r\n\
             Accept: */*\r\nConnection: close\r\n\r\n"
        );
        let (_, port, head) = http("GET http://example.test HTTP/1.0\r\n\r\n");
        assert_eq!(port, 80);
        assert_eq!(
            head,
            "GET / HTTP/1.0\r\nHost: example.test\r\nConnection: close\r\n\r\n"
        );
        let (_, _, head) =
            http("POST HTTP://example.test:/?q HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
        assert_eq!(
            head,
            "POST /?q HTTP/1.1\r\nHost: example.test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn refusals() {
        let bad = |s: &str| parse(s.as_bytes()).unwrap_err();
        assert_eq!(bad("GET /x HTTP/1.1\r\n\r\n"), HeadError::NotAProxyRequest);
        for head in [
            "GET https://example.test/ HTTP/1.1\r\n\r\n",
            "GET ftp://example.test/ HTTP/1.1\r\n\r\n",
            "GET * HTTP/1.1\r\n\r\n",
            "GET http://user@example.test/ HTTP/1.1\r\n\r\n",
            "GET http:///x HTTP/1.1\r\n\r\n",
            "GET http://example.test/ HTTP/2\r\n\r\n",
            "GET  http://example.test/ HTTP/1.1\r\n\r\n",
            "GET http://example.test/ HTTP/1.1 x\r\n\r\n",
            "G(T http://example.test/ HTTP/1.1\r\n\r\n",
            "GET http://example.test/ HTTP/1.1\r\nNo colon\r\n\r\n",
            "GET http://example.test/ HTTP/1.1\r\nA: b\r\n folded\r\n\r\n",
            "GET http://example.test/ HTTP/1.1\r\nA: b\nB: c\r\n\r\n",
            "GET http://example.test/ HTTP/1.1\r\nA: b\rB: c\r\n\r\n",
            "GET http://example.test/ HTTP/1.1\r\nA b: c\r\n\r\n",
            "GET http://example.test/ HTTP/1.1\r\nA: \u{1}\r\n\r\n",
            "GET http://example.test:99999/ HTTP/1.1\r\n\r\n",
            "garbage\r\n\r\n",
            "\r\n\r\n",
        ] {
            assert!(matches!(bad(head), HeadError::Bad(_)), "{head:?}");
        }
        assert!(matches!(
            parse(b"GET http://example.test/ HTTP/1.1\r\n\xff: x\r\n\r\n"),
            Err(HeadError::Bad(_))
        ));
    }
}
