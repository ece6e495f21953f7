//! Where a sink may send requests: its `allowed_hosts` entries, and the address ranges that
//! stay closed unless an entry names them.
//!
//! An entry is a host name (`api.example.com`), a subdomain pattern (`*.example.com`), an IP
//! address (`203.0.113.7`, `[2001:db8::1]`) or an address range (`10.1.0.0/16`,
//! `[fd00::/8]`), each optionally followed by `:port`. Without a port an entry means 443, and
//! 80 too when the sink may use plain `http`.
//!
//! Names are checked against name entries; the addresses a name resolves to are checked
//! again at connect time (see `http.rs`): loopback, link-local (cloud metadata), private,
//! unique-local and other special ranges are refused unless an address entry admits that
//! address and port.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One `allowed_hosts` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    target: Target,
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// A host name; `wildcard` matches its subdomains only.
    Name { host: String, wildcard: bool },
    /// An address range (a single address has the full prefix length).
    Range { addr: IpAddr, prefix: u8 },
}

impl HostPattern {
    /// Parses one entry, saying what is wrong with a bad one.
    pub fn parse(text: &str) -> Result<HostPattern, String> {
        let lower = text.trim().to_ascii_lowercase();
        if lower.contains("://") {
            return Err(format!("{text:?} must be a host name or address, optionally with :port, not a URL"));
        }
        let (host, port) = split_port(&lower).ok_or_else(|| format!("{text:?} has a bad port"))?;
        let target = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            Some(inner) => {
                parse_range(inner, true).ok_or_else(|| format!("{text:?} is not an IPv6 address or range"))?
            }
            None if host.contains('/') || host.parse::<Ipv4Addr>().is_ok() => {
                parse_range(host, false).ok_or_else(|| format!("{text:?} is not an IPv4 address or range"))?
            }
            None if host.contains(':') => {
                return Err(format!("{text:?}: write an IPv6 address in brackets, e.g. [::1]:8080"));
            }
            None => {
                let (name, wildcard) = match host.strip_prefix("*.") {
                    Some(rest) => (rest, true),
                    None => (host, false),
                };
                let label_ok = |l: &str| {
                    !l.is_empty() && l.len() <= 63 && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                };
                if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
                    return Err(format!("{text:?} is not a host name"));
                }
                Target::Name { host: name.to_string(), wildcard }
            }
        };
        Ok(HostPattern { target, port })
    }

    fn port_ok(&self, port: u16, allow_http: bool) -> bool {
        match self.port {
            Some(p) => p == port,
            None => port == 443 || (allow_http && port == 80),
        }
    }

    /// Whether a URL's host name (not an address) and port are allowed by this entry.
    pub fn allows_name(&self, host: &str, port: u16, allow_http: bool) -> bool {
        let Target::Name { host: pattern, wildcard } = &self.target else {
            return false;
        };
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let host_ok = if *wildcard {
            host.len() > pattern.len()
                && host.ends_with(pattern.as_str())
                && host[..host.len() - pattern.len()].ends_with('.')
        } else {
            host == *pattern
        };
        host_ok && self.port_ok(port, allow_http)
    }

    /// Whether this address entry holds `ip` and admits `port`: what allows a URL naming the
    /// address, or a name that resolves to a special address.
    pub fn allows_addr(&self, ip: IpAddr, port: u16, allow_http: bool) -> bool {
        self.covers(ip) && self.port_ok(port, allow_http)
    }

    fn covers(&self, ip: IpAddr) -> bool {
        let Target::Range { addr, prefix } = self.target else {
            return false;
        };
        match (addr, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => prefix_eq(&net.octets(), &ip.octets(), prefix),
            (IpAddr::V6(net), IpAddr::V6(ip)) => prefix_eq(&net.octets(), &ip.octets(), prefix),
            _ => false,
        }
    }
}

/// `host` and its port, if any: `name`, `name:443`, `1.2.3.4:80`, `[::1]:80`, `[::1]`.
fn split_port(text: &str) -> Option<(&str, Option<u16>)> {
    if text.starts_with('[') {
        let end = text.find(']')?;
        let (host, rest) = text.split_at(end + 1);
        return match rest.strip_prefix(':') {
            Some(port) => Some((host, Some(port.parse().ok()?))),
            None if rest.is_empty() => Some((host, None)),
            None => None,
        };
    }
    match text.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => Some((host, Some(port.parse().ok()?))),
        _ => Some((text, None)),
    }
}

fn parse_range(text: &str, v6: bool) -> Option<Target> {
    let (addr, prefix) = match text.split_once('/') {
        Some((a, p)) => (a, Some(p.parse::<u8>().ok()?)),
        None => (text, None),
    };
    let addr: IpAddr = if v6 { IpAddr::V6(addr.parse().ok()?) } else { IpAddr::V4(addr.parse().ok()?) };
    let max = if v6 { 128 } else { 32 };
    let prefix = prefix.unwrap_or(max);
    (prefix <= max).then_some(Target::Range { addr, prefix })
}

fn prefix_eq(a: &[u8], b: &[u8], prefix: u8) -> bool {
    let (bytes, bits) = (usize::from(prefix / 8), prefix % 8);
    a[..bytes] == b[..bytes] && (bits == 0 || (a[bytes] ^ b[bytes]) >> (8 - bits) == 0)
}

/// An IPv4 address carried inside IPv6 (`::ffff:a.b.c.d`) is judged as the IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Why `ip` is closed to sinks unless an entry names it, or `None` for an ordinary public
/// address.
pub fn special_range(ip: IpAddr) -> Option<&'static str> {
    match canonical(ip) {
        IpAddr::V4(v4) => special_v4(v4),
        IpAddr::V6(v6) => special_v6(v6),
    }
}

fn special_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match () {
        _ if ip.is_loopback() => "loopback",
        _ if ip.is_link_local() => "link-local (cloud metadata)",
        _ if ip.is_private() => "private",
        _ if ip.is_unspecified() || a == 0 => "unspecified",
        _ if a == 100 && (64..128).contains(&b) => "shared address space (carrier-grade NAT)",
        _ if a == 192 && b == 0 && c == 0 => "IETF protocol assignments",
        _ if a == 198 && (18..20).contains(&b) => "benchmarking",
        _ if ip.is_multicast() || ip.is_broadcast() || a >= 240 => "multicast or reserved",
        _ => return None,
    })
}

fn special_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    // Addresses that embed an IPv4 address reach it: judge by that one.
    let embedded = |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    Some(match () {
        _ if ip.is_loopback() => "loopback",
        _ if ip.is_unspecified() => "unspecified",
        _ if s[0] & 0xfe00 == 0xfc00 => "unique-local (private)",
        _ if s[0] & 0xffc0 == 0xfe80 || s[0] & 0xffc0 == 0xfec0 => "link-local",
        _ if s[0] & 0xff00 == 0xff00 => "multicast",
        _ if s[0] == 0x64 && s[1] == 0xff9b => return special_v4(embedded(s[6], s[7])).or(Some("NAT64")),
        _ if s[0] == 0x2002 => return special_v4(embedded(s[1], s[2])).or(None),
        _ if s[..6] == [0, 0, 0, 0, 0, 0] => "IPv4-compatible (deprecated)",
        _ if s[0] == 0x2001 && s[1] == 0x0db8 => "documentation",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn names_match_host_port_and_subdomains() {
        let exact = HostPattern::parse("console.tim.qq.com").unwrap();
        assert!(exact.allows_name("console.tim.qq.com", 443, false));
        assert!(exact.allows_name("CONSOLE.tim.qq.com.", 443, false));
        assert!(!exact.allows_name("console.tim.qq.com", 80, false), "no port means 443");
        assert!(exact.allows_name("console.tim.qq.com", 80, true), "and 80 when http is allowed");
        assert!(!exact.allows_name("console.tim.qq.com", 8443, true));
        assert!(!exact.allows_name("evil.com", 443, false));
        assert!(!exact.allows_name("xconsole.tim.qq.com", 443, false));

        let wildcard = HostPattern::parse("*.im.qcloud.com:8443").unwrap();
        assert!(wildcard.allows_name("adminapisgp.im.qcloud.com", 8443, false));
        assert!(!wildcard.allows_name("adminapisgp.im.qcloud.com", 443, false));
        assert!(!wildcard.allows_name("im.qcloud.com", 8443, false));
        assert!(!wildcard.allows_name("evilim.qcloud.com", 8443, false));
    }

    #[test]
    fn addresses_and_ranges_including_ipv6_literals() {
        let v4 = HostPattern::parse("127.0.0.1:8080").unwrap();
        assert!(v4.allows_addr(ip("127.0.0.1"), 8080, false));
        assert!(!v4.allows_addr(ip("127.0.0.1"), 8081, false));
        assert!(!v4.allows_name("127.0.0.1", 8080, false), "an address entry is not a name");

        let v6 = HostPattern::parse("[::1]:9000").unwrap();
        assert!(v6.allows_addr(ip("::1"), 9000, false));
        assert!(!v6.allows_addr(ip("::2"), 9000, false));
        assert!(HostPattern::parse("[::1]").unwrap().allows_addr(ip("::1"), 443, false));

        let range = HostPattern::parse("10.1.0.0/16").unwrap();
        assert!(range.covers(ip("10.1.200.3")));
        assert!(range.covers(ip("::ffff:10.1.2.3")), "mapped IPv4 is judged as IPv4");
        assert!(!range.covers(ip("10.2.0.1")));
        let v6_range = HostPattern::parse("[fd00::/8]:443").unwrap();
        assert!(v6_range.allows_addr(ip("fd12:3456::1"), 443, false));
        assert!(!v6_range.covers(ip("fe80::1")));
    }

    #[test]
    fn bad_entries_are_refused_with_a_reason() {
        for bad in [
            "https://example.com",
            "example.com:http",
            "",
            "::1",
            "[::1",
            "[::1]x",
            "10.0.0.0/40",
            "a..b",
            "exa mple.com",
        ] {
            assert!(HostPattern::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn special_ranges_are_named() {
        for (addr, why) in [
            ("127.0.0.1", "loopback"),
            ("::1", "loopback"),
            ("169.254.169.254", "link-local (cloud metadata)"),
            ("10.0.0.1", "private"),
            ("172.16.5.4", "private"),
            ("192.168.1.1", "private"),
            ("fd00::1", "unique-local (private)"),
            ("fe80::1", "link-local"),
            ("::ffff:127.0.0.1", "loopback"),
            ("0.0.0.0", "unspecified"),
            ("100.64.0.1", "shared address space (carrier-grade NAT)"),
            ("64:ff9b::a9fe:a9fe", "link-local (cloud metadata)"),
            ("2002:7f00:1::", "loopback"),
        ] {
            assert_eq!(special_range(ip(addr)), Some(why), "{addr}");
        }
        for public in ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946", "1.1.1.1"] {
            assert_eq!(special_range(ip(public)), None, "{public}");
        }
    }
}
