//! Which addresses a driver may never reach (link-local, cloud metadata,
//! unspecified, broadcast, multicast), and which only where its allow-list
//! names them as literals (loopback and private), in every form.

use std::net::{IpAddr, Ipv6Addr};

use berth_config::canonical_ip;

/// Addresses a driver may never reach, whatever its allow-list says:
/// link-local ranges (where clouds serve instance metadata and credentials),
/// the unspecified address, broadcast and multicast; also in every IPv6
/// form that carries an IPv4 address ([`canonical_ip`]).
pub fn is_forbidden_ip(ip: IpAddr) -> bool {
    const EC2_V6_METADATA: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);
    match canonical_ip(ip) {
        IpAddr::V4(v4) => {
            v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.octets()[0] == 0
        }
        IpAddr::V6(v6) => {
            v6 == EC2_V6_METADATA
                || (v6.segments()[0] & 0xffc0) == 0xfe80
                || v6.is_unspecified()
                || v6.is_multicast()
        }
    }
}

/// Addresses inside a host or a private network: loopback, RFC 1918,
/// shared (100.64/10), unique-local and site-local IPv6, and their IPv4-in-
/// IPv6 forms. A driver reaches one only where its allow-list names that
/// address as a literal; a name that resolves to one is refused, so that
/// `*.example.com` cannot be pointed at berth's own host.
pub fn is_internal_ip(ip: IpAddr) -> bool {
    match canonical_ip(ip) {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            v4.is_loopback() || v4.is_private() || (o[0] == 100 && (o[1] & 0xc0) == 64)
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            v6.is_loopback() || (first & 0xfe00) == 0xfc00 || (first & 0xffc0) == 0xfec0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_classified_in_every_form() {
        let forbidden = [
            "169.254.169.254",
            "0.0.0.0",
            "0.1.2.3",
            "255.255.255.255",
            "224.0.0.1",
            "::",
            "fe80::1",
            "fd00:ec2::254",
            "ff02::1",
            "::ffff:169.254.169.254",
            // IPv4-compatible, SIIT, NAT64 and 6to4 forms of the metadata
            // address.
            "::a9fe:a9fe",
            "::ffff:0:a9fe:a9fe",
            "::ffff:0:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::a9fe:a9fe",
            "2002:a9fe:a9fe::1",
        ];
        for ip in forbidden {
            assert!(
                is_forbidden_ip(ip.parse().unwrap()),
                "{ip} must be forbidden"
            );
        }
        let internal = [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "100.64.0.1",
            "::1",
            "fd12::1",
            "fec0::1",
            "::ffff:127.0.0.1",
            "::ffff:0:127.0.0.1",
            "0:0:0:0:0:ffff:7f00:1",
            "::7f00:1",
            "64:ff9b::7f00:1",
            "2002:7f00:1::",
        ];
        for ip in internal {
            let ip: IpAddr = ip.parse().unwrap();
            assert!(
                is_internal_ip(ip) && !is_forbidden_ip(ip),
                "{ip} must be internal"
            );
        }
        for ip in ["93.184.216.34", "2606:2800:220:1::1", "64:ff9b::5db8:d822"] {
            let ip: IpAddr = ip.parse().unwrap();
            assert!(
                !is_internal_ip(ip) && !is_forbidden_ip(ip),
                "{ip} is public"
            );
        }
    }

    #[test]
    fn every_ipv6_form_of_an_ipv4_address_is_that_address() {
        let v4 = |s: &str| s.parse::<IpAddr>().unwrap();
        for (form, want) in [
            ("::ffff:127.0.0.1", "127.0.0.1"),
            ("0:0:0:0:0:ffff:7f00:1", "127.0.0.1"),
            ("::ffff:0:a9fe:a9fe", "169.254.169.254"),
            ("::10.1.2.3", "10.1.2.3"),
            ("64:ff9b::7f00:1", "127.0.0.1"),
            ("64:ff9b:1::a9fe:a9fe", "169.254.169.254"),
            ("2002:7f00:1::1", "127.0.0.1"),
            ("127.0.0.1", "127.0.0.1"),
            // Not IPv4 in another form: themselves.
            ("::1", "::1"),
            ("::", "::"),
            ("2001:db8::1", "2001:db8::1"),
            ("fd00:ec2::254", "fd00:ec2::254"),
        ] {
            assert_eq!(canonical_ip(v4(form)), v4(want), "{form}");
        }
    }
}
