//! Thin, non-panicking wrappers over the proxy-wasm host calls the filter uses.
//!
//! The SDK's trait helpers (`self.set_http_request_header(..)` etc.) `unwrap()` every host
//! result, and its string getters `unwrap()` UTF-8 conversions; a panic traps the VM and takes
//! every request on that worker thread with it. So the glue calls `hostcalls` directly through
//! here: byte-level getters converted leniently, every error logged once and turned into a
//! harmless default.

use crate::config::Config;
use proxy_wasm::hostcalls as hc;
use proxy_wasm::types::{BufferType, Bytes, LogLevel, MapType, MetricType, Status};
use std::time::{Duration, UNIX_EPOCH};

pub fn log(level: LogLevel, msg: &str) {
    let _ = hc::log(level, msg);
}

fn warn_on_err<T>(what: &str, r: Result<T, Status>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(status) => {
            log(LogLevel::Warn, &format!("kvroute: host call {what} failed: {status:?}"));
            None
        }
    }
}

/// Names of all headers in a map (values are not needed for stripping).
pub fn header_names(map: MapType) -> Vec<String> {
    warn_on_err("get_map", hc::get_map_bytes(map)).unwrap_or_default().into_iter().map(|(k, _)| k).collect()
}

/// One header value, if present and UTF-8.
pub fn header(map: MapType, name: &str) -> Option<String> {
    let bytes = warn_on_err("get_map_value", hc::get_map_value_bytes(map, name)).flatten()?;
    String::from_utf8(bytes).ok()
}

/// Sets (or with `None` removes) a header.
pub fn set_header(map: MapType, name: &str, value: Option<&str>) {
    warn_on_err("set_map_value", hc::set_map_value(map, name, value));
}

pub fn remove_header(map: MapType, name: &str) {
    warn_on_err("remove_map_value", hc::remove_map_value(map, name));
}

/// A host property as text (`["upstream", "address"]`), if the host has it. Hosts without a
/// property (or without properties at all) answer `None`, never an error worth logging.
pub fn property(path: &[&str]) -> Option<String> {
    let bytes = hc::get_property(path.to_vec()).ok().flatten()?;
    String::from_utf8(bytes).ok()
}

pub fn set_property(path: &[&str], value: &str) {
    warn_on_err("set_property", hc::set_property(path.to_vec(), Some(value.as_bytes())));
}

/// Bytes `[start, start+len)` of a body buffer.
pub fn buffer(kind: BufferType, start: usize, len: usize) -> Option<Bytes> {
    warn_on_err("get_buffer", hc::get_buffer(kind, start, len)).flatten()
}

/// Host clock in milliseconds (fractional).
pub fn now_ms() -> f64 {
    hc::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0)
}

/// Answers the request from the filter (nothing goes upstream).
pub fn send_reply(reply: &crate::reply::Reply) {
    let headers: Vec<(&str, &str)> = reply.headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    warn_on_err("send_http_response", hc::send_http_response(reply.status, headers, Some(&reply.body)));
}

pub fn resume_request() {
    warn_on_err("resume_http_request", hc::resume_http_request());
}

/// POSTs `body` to `path` on the state service (its cluster and authority, with its token
/// when one is configured); returns the call token.
pub fn post(config: &Config, path: &str, body: &[u8], timeout: Duration, extra: &[(&str, &str)]) -> Result<u32, Status> {
    let bearer = config.state_token.as_ref().map(|t| format!("Bearer {t}"));
    let mut headers = vec![
        (":method", "POST"),
        (":path", path),
        (":authority", config.state_authority.as_str()),
        ("content-type", "application/x-protobuf"),
    ];
    if let Some(b) = &bearer {
        headers.push(("authorization", b.as_str()));
    }
    headers.extend_from_slice(extra);
    hc::dispatch_http_call(&config.state_cluster, headers, Some(body), Vec::new(), timeout)
}

/// Envoy re-selects the route when a filter changes request headers; the explicit foreign call
/// makes that independent of the host's header-mutation hook (absent in other hosts).
pub fn clear_route_cache() {
    if let Err(status) = hc::call_foreign_function("clear_route_cache", None) {
        log(LogLevel::Debug, &format!("kvroute: clear_route_cache unavailable: {status:?}"));
    }
}

pub fn define_metric(kind: MetricType, name: &str) -> Option<u32> {
    warn_on_err("define_metric", hc::define_metric(kind, name))
}

pub fn increment(metric: Option<u32>) {
    add(metric, 1);
}

pub fn add(metric: Option<u32>, n: u64) {
    if let (Some(id), Ok(n)) = (metric, i64::try_from(n)) {
        if n > 0 {
            let _ = hc::increment_metric(id, n);
        }
    }
}

pub fn record(metric: Option<u32>, value: u64) {
    if let Some(id) = metric {
        let _ = hc::record_metric(id, value);
    }
}
