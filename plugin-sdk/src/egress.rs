//! The egress policy: which addresses the gateway may connect to for a host that a request or
//! the control plane named (a custom host, an integration's host, a webhook or URL check).
//!
//! Hosts the operator wrote in the YAML file (provider base URLs, saved providers' hosts, the
//! JWKS URL) are trusted. Every other host, the provider table's own included (a cloud's
//! private endpoint resolves them to private addresses; `ollama` is on `localhost`), is
//! checked on the
//! address it resolved to, the one the connection then uses (so a name that resolves to a
//! public address once and to an internal one later cannot slip through): internal addresses
//! (loopback, private, link-local, shared CGNAT space, unspecified, multicast, broadcast, and
//! the IPv4-mapped and IPv4-compatible IPv6 forms of these) are refused unless the operator
//! trusts the host, with `egress.trusted_hosts` in the YAML or `GW_TRUSTED_CUSTOM_HOSTS`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::error::{ErrorKind, GatewayError};

/// The environment variable of trusted hosts: comma-separated `host` or `host:port`.
pub const TRUSTED_HOSTS_VAR: &str = "GW_TRUSTED_CUSTOM_HOSTS";

/// One trusted host: a name or address as written in URLs, with or without a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustedHost {
    /// Lower-case, IPv6 literals without brackets.
    pub host: String,
    /// `None`: every port.
    pub port: Option<u16>,
}

impl TrustedHost {
    /// Reads `host`, `host:port`, `[v6]` or `[v6]:port`. A URL, a path or an empty host is an
    /// error that says what to write.
    pub fn parse(text: &str) -> Result<TrustedHost, String> {
        let text = text.trim();
        let bad = || {
            format!(
                "{text:?} is not a host name or host:port (write api.example.com or 10.0.0.5:8000)"
            )
        };
        if text.is_empty() || text.contains('/') || text.contains('@') {
            return Err(bad());
        }
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let (v6, after) = rest.split_once(']').ok_or_else(bad)?;
            let port = match after {
                "" => None,
                p => Some(p.strip_prefix(':').ok_or_else(bad)?),
            };
            v6.parse::<Ipv6Addr>().map_err(|_| bad())?;
            (v6.to_owned(), port)
        } else if text.matches(':').count() > 1 {
            // A bare IPv6 address, without a port.
            text.parse::<Ipv6Addr>().map_err(|_| bad())?;
            (text.to_owned(), None)
        } else {
            match text.split_once(':') {
                Some((h, p)) => (h.to_owned(), Some(p)),
                None => (text.to_owned(), None),
            }
        };
        let port = port
            .map(|p| p.parse::<u16>().map_err(|_| bad()))
            .transpose()?;
        if host.is_empty() || host.chars().any(|c| c.is_whitespace()) {
            return Err(bad());
        }
        Ok(TrustedHost {
            host: host.to_ascii_lowercase(),
            port,
        })
    }

    fn matches(&self, host: &str, port: u16) -> bool {
        self.host.eq_ignore_ascii_case(host) && self.port.is_none_or(|p| p == port)
    }
}

/// The hosts an operator trusts; everything else must resolve to a public address.
#[derive(Debug, Clone, Default)]
pub struct EgressPolicy {
    trusted: Vec<TrustedHost>,
}

impl EgressPolicy {
    pub fn new(trusted: Vec<TrustedHost>) -> EgressPolicy {
        EgressPolicy { trusted }
    }

    /// Adds a trusted host (one the operator wrote in the YAML file).
    pub fn trust(&mut self, host: TrustedHost) {
        if !self.trusted.contains(&host) {
            self.trusted.push(host);
        }
    }

    pub fn trusted(&self) -> &[TrustedHost] {
        &self.trusted
    }

    /// Whether `host` is trusted on some port (for clients that resolve without a port).
    pub fn trusts_name(&self, host: &str) -> bool {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        self.trusted
            .iter()
            .any(|t| t.host.eq_ignore_ascii_case(host))
    }

    pub fn is_trusted(&self, host: &str, port: u16) -> bool {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        self.trusted.iter().any(|t| t.matches(host, port))
    }

    /// Checks the address `host` resolved to, before connecting to it: a 403 naming the host
    /// (never the address, which would make the gateway a scanner of the operator's network)
    /// when it is internal and the host is not trusted.
    pub fn check(&self, host: &str, port: u16, addr: IpAddr) -> Result<(), GatewayError> {
        if !is_internal(addr) || self.is_trusted(host, port) {
            return Ok(());
        }
        Err(GatewayError::new(
            ErrorKind::Forbidden,
            format!(
                "the upstream host {host:?} is refused: it resolves to an internal address, which the \
                 gateway reaches only for hosts its operator trusts (egress.trusted_hosts in the \
                 YAML file, or {TRUSTED_HOSTS_VAR})"
            ),
        )
        .with_code("egress_refused"))
    }
}

/// Whether an address belongs to the machine, its private networks or no one: loopback,
/// RFC 1918 and fc00::/7 private ranges, link-local (169.254/16 with cloud metadata, fe80::/10),
/// shared CGNAT space (100.64/10), unspecified and "this network" (0/8), multicast, broadcast,
/// and IPv6 forms that carry such an IPv4 address (mapped `::ffff:a.b.c.d`, compatible
/// `::a.b.c.d`, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`).
pub fn is_internal(addr: IpAddr) -> bool {
    match addr {
        IpAddr::V4(v4) => is_internal_v4(v4),
        IpAddr::V6(v6) => is_internal_v6(v6),
    }
}

fn is_internal_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_multicast()
        || ip.is_broadcast()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        // IETF protocol assignments (192.0.0/24) and benchmarking (198.18/15).
        || (a == 192 && b == 0 && ip.octets()[2] == 0)
        || (a == 198 && (18..20).contains(&b))
        // 240/4 is reserved; nothing a provider lives on.
        || a >= 240
}

fn is_internal_v6(ip: Ipv6Addr) -> bool {
    let seg = ip.segments();
    if ip.is_loopback() || ip.is_unspecified() || ip.is_multicast() {
        return true;
    }
    // fc00::/7 unique local, fe80::/10 link-local, fec0::/10 the old site-local.
    if (seg[0] & 0xfe00) == 0xfc00 || (seg[0] & 0xffc0) == 0xfe80 || (seg[0] & 0xffc0) == 0xfec0 {
        return true;
    }
    let embedded =
        |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    // ::ffff:a.b.c.d (mapped) and ::a.b.c.d (compatible).
    if seg[..5].iter().all(|&s| s == 0) && (seg[5] == 0xffff || seg[5] == 0) {
        return is_internal_v4(embedded(seg[6], seg[7]));
    }
    // SIIT ::ffff:0:a.b.c.d.
    if seg[..4].iter().all(|&s| s == 0) && seg[4] == 0xffff && seg[5] == 0 {
        return is_internal_v4(embedded(seg[6], seg[7]));
    }
    // NAT64 64:ff9b::a.b.c.d, and the local-use 64:ff9b:1::/48.
    if seg[0] == 0x64 && seg[1] == 0xff9b {
        if seg[2] == 1 {
            return true;
        }
        if seg[2..6].iter().all(|&s| s == 0) {
            return is_internal_v4(embedded(seg[6], seg[7]));
        }
    }
    // 6to4 2002:aabb:ccdd::.
    if seg[0] == 0x2002 {
        return is_internal_v4(embedded(seg[1], seg[2]));
    }
    false
}

/// Reads `GW_TRUSTED_CUSTOM_HOSTS`-style text: hosts separated by commas, blanks ignored.
pub fn parse_list(text: &str) -> Result<Vec<TrustedHost>, String> {
    text.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(TrustedHost::parse)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn internal(text: &str) -> bool {
        is_internal(text.parse().unwrap())
    }

    #[test]
    fn internal_addresses_are_recognised() {
        for ip in [
            "127.0.0.1",
            "127.255.0.9",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.254",
            "0.0.0.0",
            "0.1.2.3",
            "224.0.0.1",
            "255.255.255.255",
            "240.0.0.1",
            "::1",
            "::",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::1",
            "::ffff:0:7f00:1",
            "192.0.0.8",
            "198.18.0.1",
            "198.19.255.255",
            "2002:7f00:1::",
        ] {
            assert!(internal(ip), "{ip} is internal");
        }
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "100.63.255.255",
            "100.128.0.0",
            "172.32.0.1",
            "169.253.0.1",
            "192.0.2.1",
            "198.20.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "2002:0808:0808::",
        ] {
            assert!(!internal(ip), "{ip} is public");
        }
    }

    #[test]
    fn trusted_hosts_parse_and_match() {
        let list = parse_list(" 127.0.0.1, llm.internal:8000 ,[::1]:9000,,fd00::5").unwrap();
        let policy = EgressPolicy::new(list);
        assert!(policy.is_trusted("127.0.0.1", 1));
        assert!(policy.is_trusted("LLM.internal", 8000));
        assert!(!policy.is_trusted("llm.internal", 8001));
        assert!(policy.is_trusted("::1", 9000));
        assert!(policy.is_trusted("[::1]", 9000));
        assert!(policy.is_trusted("fd00::5", 80));
        // A trusted address does not trust other spellings of it.
        assert!(!policy.is_trusted("127.1", 80));
        for bad in ["http://x", "a/b", "h:port", "[::1", "", "u@h", "[x]:1"] {
            assert!(TrustedHost::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_refusal_names_the_host_and_how_to_trust_it_never_the_address() {
        let policy = EgressPolicy::default();
        let err = policy
            .check("metadata.test", 80, "169.254.169.254".parse().unwrap())
            .unwrap_err();
        assert_eq!(err.status().as_u16(), 403);
        assert!(err.message.contains("\"metadata.test\""), "{}", err.message);
        assert!(err.message.contains(TRUSTED_HOSTS_VAR), "{}", err.message);
        assert!(
            err.message.contains("egress.trusted_hosts"),
            "{}",
            err.message
        );
        assert!(!err.message.contains("169.254"), "{}", err.message);
        assert!(policy
            .check("api.example.com", 443, "93.184.216.34".parse().unwrap())
            .is_ok());
        let trusted = EgressPolicy::new(parse_list("metadata.test").unwrap());
        assert!(trusted
            .check("metadata.test", 80, "169.254.169.254".parse().unwrap())
            .is_ok());
    }
}
