//! The loopback guard: the benchmark generates real load, so it refuses to aim it anywhere
//! but this machine. Every URL the binary is given passes through [`ensure_loopback`].

use crate::BenchError;
use std::net::IpAddr;

pub fn ensure_loopback(url: &str) -> Result<(), BenchError> {
    let parsed = reqwest::Url::parse(url).map_err(|_| BenchError::NotLoopback(url.to_string()))?;
    let host = parsed.host_str().unwrap_or("").trim_start_matches('[').trim_end_matches(']');
    let ok = host.eq_ignore_ascii_case("localhost") || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if ok && matches!(parsed.scheme(), "http" | "https") {
        Ok(())
    } else {
        Err(BenchError::NotLoopback(url.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_passes() {
        for ok in ["http://127.0.0.1:10000", "http://localhost:8100/x", "http://[::1]:1", "http://127.3.4.5/"] {
            assert!(ensure_loopback(ok).is_ok(), "{ok}");
        }
        for bad in ["http://10.0.0.1:80", "http://example.com", "ftp://127.0.0.1", "nonsense", "http://0.0.0.0:1"] {
            assert!(ensure_loopback(bad).is_err(), "{bad}");
        }
    }
}
