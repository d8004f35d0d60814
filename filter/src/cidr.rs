//! Address ranges (`trusted_sources`, identity's trusted hops).

use std::net::{IpAddr, SocketAddr};

/// An address range, `10.0.0.0/8` or `::1/128` (a bare address is one host).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    bits: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Option<Cidr> {
        let (addr, bits) = match s.split_once('/') {
            Some((a, b)) => (a.parse::<IpAddr>().ok()?, Some(b.parse::<u8>().ok()?)),
            None => (s.parse::<IpAddr>().ok()?, None),
        };
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let bits = bits.unwrap_or(max);
        (bits <= max).then_some(Cidr { addr, bits })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let mask = |bits: u8, width: u32| if bits == 0 { 0 } else { u128::MAX << (width - u32::from(bits)) };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let m = mask(self.bits, 32) as u32;
                u32::from(net) & m == u32::from(ip) & m
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let m = mask(self.bits, 128);
                u128::from(net) & m == u128::from(ip) & m
            }
            (IpAddr::V4(_), IpAddr::V6(ip)) => ip.to_ipv4_mapped().is_some_and(|v4| self.contains(IpAddr::V4(v4))),
            (IpAddr::V6(_), IpAddr::V4(_)) => false,
        }
    }
}

/// The peer's IP from a host address property (`10.0.0.1:5555`, `[::1]:5555`, or a bare IP).
pub fn peer_ip(address: &str) -> Option<IpAddr> {
    address.parse::<SocketAddr>().map(|a| a.ip()).ok().or_else(|| address.parse().ok())
}


