//! What the proxy saw of the upstream that answered a routed request: which host it was, and
//! how it failed. A failover or a failure reported here marks the chosen worker suspect on
//! every replica, so a host property is parsed before it is believed: a value that is not an
//! address is counted and ignored, never taken for another upstream.

use kvroute_core::wire::UpstreamFailure;
use std::net::{IpAddr, SocketAddr};

/// The upstream that answered, as the host's properties name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServedBy {
    /// The host did not say (no upstream was reached, or the property is not supported).
    Unknown,
    Host(SocketAddr),
    /// The host said something that is not an address.
    Malformed,
}

/// Reads the host's answer: Envoy's `upstream.address` is `IP:port` (`[v6]:port`);
/// ngx_wasm_module's is the IP alone, its port in `upstream.port`.
pub fn served_by(address: Option<&str>, port: Option<&str>) -> ServedBy {
    let Some(address) = address.filter(|a| !a.is_empty()) else { return ServedBy::Unknown };
    if let Ok(host) = address.parse::<SocketAddr>() {
        return plausible(host);
    }
    let ip = address.parse::<IpAddr>();
    match (ip, port.map(str::parse::<u16>)) {
        (Ok(ip), Some(Ok(port))) => plausible(SocketAddr::new(ip, port)),
        _ => ServedBy::Malformed,
    }
}

/// An upstream a request was sent to has a port and a concrete address.
fn plausible(host: SocketAddr) -> ServedBy {
    if host.port() == 0 || host.ip().is_unspecified() || host.ip().is_multicast() {
        return ServedBy::Malformed;
    }
    ServedBy::Host(host)
}

/// What happened to the chosen worker (`address`, its `IP:port`; empty or a name when it is
/// not an endpoint), from what the proxy saw when the response headers came: the upstream host
/// that answered, the status, and Envoy's `response.code_details`. Returns the failure and the
/// host that answered instead (empty when it was the chosen one).
///
/// - another upstream answered: the target failed before any response header (Envoy's retry
///   policy only moves on for connect failures, refused streams and resets) and the request
///   was failed over;
/// - a 5xx the upstream sent (`via_upstream`): a server error, before the first body byte;
/// - a 5xx Envoy made because the upstream connection failed or reset before headers;
/// - any other local 5xx (no healthy upstream, overflow) is not the worker's doing.
pub fn upstream_failure(address: &str, served: ServedBy, status: Option<u32>, details: Option<&str>) -> (UpstreamFailure, String) {
    if let (Ok(chosen), ServedBy::Host(served)) = (address.parse::<SocketAddr>(), served) {
        if served != chosen {
            return (UpstreamFailure::UpstreamFailedOver, served.to_string());
        }
    }
    if status.is_none_or(|s| s < 500) {
        return (UpstreamFailure::UpstreamOk, String::new());
    }
    let details = details.unwrap_or_default();
    let failure = if details == "via_upstream" {
        UpstreamFailure::UpstreamServerError
    } else if details.contains("connection_failure") || details.contains("connect_error") {
        UpstreamFailure::UpstreamConnectFailure
    } else if details.starts_with("upstream_reset_before_response_started") {
        UpstreamFailure::UpstreamReset
    } else {
        UpstreamFailure::UpstreamOk
    };
    (failure, String::new())
}

/// A malformed value, short and printable, for a log line.
pub fn for_log(value: Option<&str>) -> String {
    value.unwrap_or_default().chars().take(64).map(|c| if c.is_ascii_graphic() { c } else { '?' }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(s: &str) -> ServedBy {
        ServedBy::Host(s.parse().unwrap())
    }

    #[test]
    fn envoy_and_nginx_name_the_upstream_their_own_way() {
        assert_eq!(served_by(Some("127.0.0.1:8101"), None), host("127.0.0.1:8101"));
        assert_eq!(served_by(Some("127.0.0.1:8101"), Some("8101")), host("127.0.0.1:8101"));
        assert_eq!(served_by(Some("[::1]:8101"), None), host("[::1]:8101"));
        assert_eq!(served_by(Some("127.0.0.1"), Some("8101")), host("127.0.0.1:8101"));
        assert_eq!(served_by(Some("::1"), Some("8101")), host("[::1]:8101"));
        assert_eq!(served_by(None, Some("8101")), ServedBy::Unknown);
        assert_eq!(served_by(Some(""), None), ServedBy::Unknown);
    }

    #[test]
    fn what_is_not_an_address_is_malformed_never_another_upstream() {
        // Read past the end of a name that is not NUL-terminated (ngx_wasm_module 3bed278).
        assert_eq!(served_by(Some("127.0.0.1"), Some("46532.1")), ServedBy::Malformed);
        assert_eq!(served_by(Some("127.0.0.1"), Some("458014580111758.0.1:45801127.0.0.1")), ServedBy::Malformed);
        assert_eq!(served_by(Some("127.0.0.1:8101\0garbage"), None), ServedBy::Malformed);
        assert_eq!(served_by(Some("127.0.0.1"), None), ServedBy::Malformed, "an IP without its port");
        assert_eq!(served_by(Some("workers"), None), ServedBy::Malformed);
        assert_eq!(served_by(Some("0.0.0.0:8101"), None), ServedBy::Malformed);
        assert_eq!(served_by(Some("127.0.0.1:0"), None), ServedBy::Malformed);
        assert_eq!(served_by(Some("127.0.0.1"), Some("70000")), ServedBy::Malformed);

        let t = "127.0.0.1:8101";
        let ok = (UpstreamFailure::UpstreamOk, String::new());
        assert_eq!(upstream_failure(t, ServedBy::Malformed, Some(200), Some("via_upstream")), ok, "no failover from garbage");
    }

    #[test]
    fn upstream_failures_are_read_from_what_the_proxy_saw() {
        let t = "127.0.0.1:8101";
        let ok = (UpstreamFailure::UpstreamOk, String::new());
        assert_eq!(upstream_failure(t, host(t), Some(200), Some("via_upstream")), ok);
        assert_eq!(upstream_failure(t, ServedBy::Unknown, Some(200), None), ok);
        assert_eq!(upstream_failure(t, host(t), Some(404), Some("via_upstream")), ok);
        assert_eq!(
            upstream_failure(t, host("127.0.0.1:8102"), Some(200), Some("via_upstream")),
            (UpstreamFailure::UpstreamFailedOver, "127.0.0.1:8102".to_string())
        );
        assert_eq!(upstream_failure(t, host(t), Some(500), Some("via_upstream")).0, UpstreamFailure::UpstreamServerError);
        let refused = "upstream_reset_before_response_started{remote_connection_failure,delayed_connect_error:_Connection_refused}";
        assert_eq!(upstream_failure(t, host(t), Some(503), Some(refused)).0, UpstreamFailure::UpstreamConnectFailure);
        assert_eq!(
            upstream_failure(t, ServedBy::Unknown, Some(503), Some("upstream_reset_before_response_started{connection_termination}")).0,
            UpstreamFailure::UpstreamReset
        );
        assert_eq!(upstream_failure(t, ServedBy::Unknown, Some(503), Some("no_healthy_upstream")), ok, "not the worker's doing");
        assert_eq!(upstream_failure("", host(t), Some(200), Some("via_upstream")), ok, "no address to compare with");
        assert_eq!(upstream_failure("workers", host(t), Some(200), Some("via_upstream")), ok, "a cluster is not a host");
    }
}
