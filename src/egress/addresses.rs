//! The address policy: which resolved addresses an allowed host may not
//! have. An allowlisted name that resolves to a loopback, private,
//! link-local (cloud metadata) or otherwise non-public address, or to one
//! of the machine's own addresses, is refused: the allowlist grants the
//! public internet by name, never the worker's neighbourhood.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why `ip` may not be reached, or `None` for a public unicast address.
///
/// IPv4: `0/8` unspecified ("this network"; Linux connects `0.0.0.0` to
/// itself), `127/8` loopback, `10/8`, `172.16/12`, `192.168/16` private,
/// `100.64/10` carrier-grade NAT, `169.254/16` link-local, `192.0.0/24` and
/// `192.88.99/24` reserved, the documentation ranges, `198.18/15`
/// benchmarking, `224/4` multicast, `255.255.255.255` broadcast, `240/4`
/// reserved.
///
/// IPv6: `::` and `::1`; IPv4-mapped (`::ffff:0:0/96`), IPv4-translated
/// (`::ffff:0:0:0/96`), NAT64 (`64:ff9b::/96`) and 6to4 (`2002::/16`)
/// addresses take the verdict of the IPv4 address they embed; the
/// deprecated IPv4-compatible `::/96` is refused whatever it embeds, as are
/// local-use NAT64 `64:ff9b:1::/48`, discard-only `100::/64`, Teredo
/// `2001::/32` (it tunnels to an arbitrary IPv4 address), the rest of the
/// IETF block `2001::/23`, documentation `2001:db8::/32` and `3fff::/20`,
/// unique-local `fc00::/7`, link-local `fe80::/10`, site-local `fec0::/10`,
/// multicast `ff00::/8`, and anything outside global unicast `2000::/3`.
pub fn is_forbidden(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_forbidden(v4),
        IpAddr::V6(v6) => v6_forbidden(v6),
    }
}

fn v4_forbidden(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    let reason = match (a, b, c) {
        (0, _, _) => "unspecified",
        (127, _, _) => "loopback",
        (10, _, _) => "private",
        (172, 16..=31, _) => "private",
        (192, 168, _) => "private",
        (100, 64..=127, _) => "carrier-grade NAT",
        (169, 254, _) => "link-local",
        (192, 0, 0) => "reserved",
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "documentation",
        (192, 88, 99) => "reserved",
        (198, 18..=19, _) => "benchmarking",
        (224..=239, _, _) => "multicast",
        _ if ip == Ipv4Addr::BROADCAST => "broadcast",
        (240..=255, _, _) => "reserved",
        _ => return None,
    };
    Some(reason)
}

fn v6_forbidden(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    let embedded = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    if ip.is_loopback() {
        return Some("loopback");
    }
    match s {
        // ::ffff:a.b.c.d (mapped) and ::ffff:0:a.b.c.d (translated).
        [0, 0, 0, 0, 0, 0xffff, hi, lo] | [0, 0, 0, 0, 0xffff, 0, hi, lo] => {
            return v4_forbidden(embedded(hi, lo));
        }
        // ::a.b.c.d, deprecated IPv4-compatible.
        [0, 0, 0, 0, 0, 0, hi, lo] => {
            return Some(v4_forbidden(embedded(hi, lo)).unwrap_or("IPv4-compatible"));
        }
        // NAT64 well-known prefix.
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => return v4_forbidden(embedded(hi, lo)),
        [0x64, 0xff9b, 1, ..] => return Some("local-use NAT64"),
        [0x100, 0, 0, 0, ..] => return Some("discard-only"),
        [0x2001, 0, ..] => return Some("teredo"),
        [0x2001, 2, 0, ..] => return Some("benchmarking"),
        [0x2001, 0xdb8, ..] => return Some("documentation"),
        [0x2001, 0..=0x1ff, ..] => return Some("reserved"),
        // 6to4: 2002:AABB:CCDD::/48 embeds a.b.c.d.
        [0x2002, hi, lo, ..] => return v4_forbidden(embedded(hi, lo)),
        [0x3fff, 0..=0x0fff, ..] => return Some("documentation"),
        _ => {}
    }
    let reason = match s[0] {
        0xfc00..=0xfdff => "unique-local",
        0xfe80..=0xfebf => "link-local",
        0xfec0..=0xfeff => "site-local",
        0xff00..=0xffff => "multicast",
        0x2000..=0x3fff => return None,
        _ => "reserved",
    };
    Some(reason)
}

/// Whether `ip` may be connected to: not [`is_forbidden`], and not one of
/// `own` (the machine's addresses; IPv4-mapped forms compare equal to their
/// IPv4 address). With `allow_loopback` (tests only) plain loopback
/// (`127/8`, `::1`) is let through, and nothing else is.
pub fn check_address(ip: IpAddr, own: &[IpAddr], allow_loopback: bool) -> Result<(), &'static str> {
    if allow_loopback && ip.is_loopback() {
        return Ok(());
    }
    if let Some(reason) = is_forbidden(ip) {
        return Err(reason);
    }
    let ip = ip.to_canonical();
    if own.iter().any(|o| o.to_canonical() == ip) {
        return Err("own address");
    }
    Ok(())
}

/// The machine's own addresses, best effort, for [`check_address`]'s `own`:
/// the IPv4 addresses `/proc/net/fib_trie` lists as `/32 host LOCAL` and the
/// IPv6 addresses of `/proc/net/if_inet6`, both of the network namespace of
/// this process (the daemon's, which is the one the proxy connects from). A
/// file that cannot be read contributes nothing; loopback and private
/// addresses are refused anyway, so what matters here is a public address
/// of the host, whose services (bound to `0.0.0.0`) would otherwise be one
/// allowlisted name away.
pub fn own_addresses() -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = Vec::new();
    match std::fs::read_to_string("/proc/net/fib_trie") {
        Ok(text) => out.extend(parse_fib_trie(&text).into_iter().map(IpAddr::V4)),
        Err(error) => tracing::debug!(%error, "egress: reading /proc/net/fib_trie"),
    }
    match std::fs::read_to_string("/proc/net/if_inet6") {
        Ok(text) => out.extend(parse_if_inet6(&text).into_iter().map(IpAddr::V6)),
        Err(error) => tracing::debug!(%error, "egress: reading /proc/net/if_inet6"),
    }
    let mut seen = Vec::with_capacity(out.len());
    for ip in out {
        if !seen.contains(&ip) {
            seen.push(ip);
        }
    }
    seen
}

/// The addresses of `/32 host LOCAL` leaves: the line after `|-- a.b.c.d`.
fn parse_fib_trie(text: &str) -> Vec<Ipv4Addr> {
    let mut out = Vec::new();
    let mut last: Option<Ipv4Addr> = None;
    for line in text.lines() {
        let line = line.trim();
        if let Some(addr) = line.strip_prefix("|-- ") {
            last = addr.trim().parse().ok();
        } else if line.starts_with("/32 host LOCAL") {
            if let Some(ip) = last.filter(|ip| !out.contains(ip)) {
                out.push(ip);
            }
        } else if !line.starts_with('/') {
            last = None;
        }
    }
    out
}

/// The first field of each line: 32 hex digits.
fn parse_if_inet6(text: &str) -> Vec<Ipv6Addr> {
    text.lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|hex| hex.len() == 32)
        .filter_map(|hex| u128::from_str_radix(hex, 16).ok())
        .map(Ipv6Addr::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(s: &str) -> Option<&'static str> {
        is_forbidden(s.parse().unwrap())
    }

    #[test]
    fn ipv4_ranges() {
        let cases = [
            ("0.0.0.0", "unspecified"),
            ("0.1.2.3", "unspecified"),
            ("127.0.0.1", "loopback"),
            ("127.255.255.254", "loopback"),
            ("10.0.0.1", "private"),
            ("10.255.255.255", "private"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.168.1.1", "private"),
            ("100.64.0.1", "carrier-grade NAT"),
            ("100.127.255.255", "carrier-grade NAT"),
            ("169.254.169.254", "link-local"),
            ("192.0.0.8", "reserved"),
            ("192.0.2.1", "documentation"),
            ("198.51.100.7", "documentation"),
            ("203.0.113.9", "documentation"),
            ("192.88.99.1", "reserved"),
            ("198.18.0.1", "benchmarking"),
            ("198.19.255.255", "benchmarking"),
            ("224.0.0.1", "multicast"),
            ("239.255.255.250", "multicast"),
            ("240.0.0.1", "reserved"),
            ("254.1.1.1", "reserved"),
            ("255.255.255.255", "broadcast"),
        ];
        for (ip, why) in cases {
            assert_eq!(verdict(ip), Some(why), "{ip}");
        }
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "151.101.0.223",
            "172.15.255.255",
            "172.32.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "11.0.0.0",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "192.0.1.1",
            "192.169.0.1",
        ] {
            assert_eq!(verdict(ip), None, "{ip}");
        }
    }

    #[test]
    fn ipv6_ranges() {
        let cases = [
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:10.0.0.5", "private"),
            ("::ffff:169.254.169.254", "link-local"),
            ("::ffff:0:192.168.0.1", "private"),
            ("::10.0.0.1", "private"),
            ("::8.8.8.8", "IPv4-compatible"),
            ("64:ff9b::10.0.0.1", "private"),
            ("64:ff9b::127.0.0.1", "loopback"),
            ("64:ff9b::169.254.169.254", "link-local"),
            ("64:ff9b:1::8.8.8.8", "local-use NAT64"),
            ("100::1", "discard-only"),
            ("2001::1", "teredo"),
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "teredo"),
            ("2001:2::1", "benchmarking"),
            ("2001:10::1", "reserved"),
            ("2001:db8::1", "documentation"),
            ("3fff::1", "documentation"),
            ("3fff:fff::1", "documentation"),
            ("2002:0a00:0001::1", "private"),
            ("2002:7f00:0001::1", "loopback"),
            ("2002:a9fe:a9fe::1", "link-local"),
            ("fc00::1", "unique-local"),
            ("fd12:3456:789a::1", "unique-local"),
            ("fe80::1", "link-local"),
            ("febf::1", "link-local"),
            ("fec0::1", "site-local"),
            ("ff02::1", "multicast"),
            ("ff05::1:3", "multicast"),
            ("5f00::1", "reserved"),
            ("4000::1", "reserved"),
            ("1::1", "reserved"),
            ("::2:1", "unspecified"),
        ];
        for (ip, why) in cases {
            assert_eq!(verdict(ip), Some(why), "{ip}");
        }
        for ip in [
            "2606:4700::1111",
            "2606:4700::1",
            "2a00:1450:4001:80b::200e",
            "::ffff:8.8.8.8",
            "64:ff9b::8.8.8.8",
            "2002:0808:0808::1",
            "2001:200::1",
            "3fff:1000::1",
        ] {
            assert_eq!(verdict(ip), None, "{ip}");
        }
    }

    #[test]
    fn check_address_own_and_loopback() {
        let own: Vec<IpAddr> = vec![
            "8.8.4.4".parse().unwrap(),
            "2606:4700::6810:1".parse().unwrap(),
        ];
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            check_address(ip("8.8.4.4"), &own, false),
            Err("own address")
        );
        assert_eq!(
            check_address(ip("::ffff:8.8.4.4"), &own, false),
            Err("own address")
        );
        assert_eq!(
            check_address(ip("2606:4700::6810:1"), &own, false),
            Err("own address")
        );
        assert_eq!(check_address(ip("8.8.8.8"), &own, false), Ok(()));
        assert_eq!(check_address(ip("127.0.0.1"), &own, false), Err("loopback"));
        assert_eq!(check_address(ip("::1"), &own, false), Err("loopback"));
        // The test switch lets loopback through, even when it is own...
        let with_lo = vec![ip("127.0.0.1")];
        assert_eq!(check_address(ip("127.0.0.1"), &with_lo, true), Ok(()));
        assert_eq!(check_address(ip("127.0.0.2"), &own, true), Ok(()));
        assert_eq!(check_address(ip("::1"), &own, true), Ok(()));
        // ...and nothing else.
        assert_eq!(check_address(ip("10.0.0.1"), &own, true), Err("private"));
        assert_eq!(
            check_address(ip("169.254.169.254"), &own, true),
            Err("link-local")
        );
        assert_eq!(check_address(ip("fe80::1"), &own, true), Err("link-local"));
        assert_eq!(check_address(ip("0.0.0.0"), &own, true), Err("unspecified"));
        assert_eq!(
            check_address(ip("::ffff:127.0.0.1"), &own, true),
            Err("loopback")
        );
        assert_eq!(check_address(ip("8.8.4.4"), &own, true), Err("own address"));
    }

    #[test]
    fn parses_fib_trie_local_hosts() {
        let text = "\
Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
     +-- 203.0.113.0/24 2 0 2
        |-- 203.0.113.7
           /32 host LOCAL
Local:
  +-- 0.0.0.0/0 3 0 5
           |-- 127.0.0.1
              /32 host LOCAL
";
        let want: Vec<Ipv4Addr> =
            vec!["127.0.0.1".parse().unwrap(), "203.0.113.7".parse().unwrap()];
        assert_eq!(parse_fib_trie(text), want);
    }

    #[test]
    fn parses_if_inet6() {
        let text = "\
00000000000000000000000000000001 01 80 10 80       lo
fe800000000000000042acfffe110002 02 40 20 80     eth0
garbage
";
        let want: Vec<Ipv6Addr> = vec![
            "::1".parse().unwrap(),
            "fe80::42:acff:fe11:2".parse().unwrap(),
        ];
        assert_eq!(parse_if_inet6(text), want);
    }

    #[test]
    fn own_addresses_is_best_effort() {
        // Whatever this machine has; it must not panic, and has no duplicates.
        let own = own_addresses();
        let mut dedup = own.clone();
        dedup.dedup();
        assert_eq!(own.len(), dedup.len());
    }
}
