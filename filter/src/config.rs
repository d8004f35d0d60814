//! Plugin configuration: the JSON in the Wasm filter's `configuration`, parsed once by the root
//! context. Every field has a default except the state-service cluster, so a minimal config is
//! `{"state_cluster": "kvroute_state"}`. Unknown fields are rejected: a typo in a deployment
//! config should stop the plugin from loading (Envoy logs why) rather than silently do nothing.

pub mod admission;

use kvroute_core::request::Api;
use kvroute_core::targets;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// Where the routing decision is written.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoutingMode {
    /// A header the route's `cluster_header` reads: one Envoy cluster per worker.
    Cluster,
    /// The override-host header read by `envoy.load_balancing_policies.override_host`
    /// (or an ORIGINAL_DST cluster's `http_header_name`): one endpoint inside one cluster.
    Endpoint,
}

/// Default override-host header: the one the Gateway API inference extension uses, so a
/// cluster configured for an endpoint picker works unchanged.
pub const DEFAULT_ENDPOINT_HEADER: &str = "x-gateway-destination-endpoint";
pub const DEFAULT_CLUSTER_HEADER: &str = "x-kvroute-cluster";
/// Prefix of every header kvroute sets; client-supplied copies are always removed.
pub const OWN_HEADER_PREFIX: &str = "x-kvroute-";

/// The configuration as written (JSON). See [`Config`] for the validated form.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawConfig {
    pub state_cluster: String,
    pub state_authority: String,
    pub pick_path: String,
    pub report_path: String,
    pub locate_path: String,
    pub pick_timeout_ms: u64,
    pub affinity_timeout_ms: u64,
    pub report_timeout_ms: u64,
    pub routing_mode: RoutingMode,
    pub route_header: Option<String>,
    pub decision_header: bool,
    pub fallback_header: bool,
    pub max_body_bytes: usize,
    pub llm_paths: BTreeMap<String, String>,
    pub block_size: u32,
    pub model_block_sizes: BTreeMap<String, u32>,
    pub text_chunk_bytes: usize,
    pub report_flush_ms: u64,
    pub report_max_batch: usize,
    pub report_max_pending: usize,
    pub response_tail_bytes: usize,
    pub identity: crate::identity::RawIdentity,
    pub strip_headers: Vec<String>,
    pub fallback_endpoints: usize,
    pub first_byte_timeout_ms: u64,
    pub trusted_sources: Vec<String>,
    pub allowed_targets: Vec<String>,
    pub state_token: Option<String>,
    pub state_token_env: Option<String>,
    pub route_variable: Option<String>,
    pub stream_usage: StreamUsage,
    pub admission: admission::Admission,
    pub sensitivity: crate::pool::RawSensitivity,
    pub pools: crate::pool::RawPools,
}

/// Which streamed responses carry a usage event the filter must read.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamUsage {
    /// The ones whose request asked for it (OpenAI `stream_options.include_usage`), and every
    /// Anthropic and Responses stream: vLLM's default. Other streams are counted, not read.
    #[default]
    Requested,
    /// Every stream (vLLM with `--enable-force-include-usage`).
    Always,
}

impl Default for RawConfig {
    fn default() -> Self {
        RawConfig {
            state_cluster: String::new(),
            state_authority: "kvroute-state".into(),
            pick_path: "/v1/pick".into(),
            report_path: "/v1/report".into(),
            locate_path: "/v1/locate".into(),
            pick_timeout_ms: 50,
            affinity_timeout_ms: 400,
            report_timeout_ms: 1000,
            routing_mode: RoutingMode::Endpoint,
            route_header: None,
            decision_header: false,
            fallback_header: true,
            max_body_bytes: 4 << 20,
            llm_paths: [
                ("/v1/completions", "completions"),
                ("/v1/chat/completions", "chat_completions"),
                ("/v1/messages", "messages"),
                ("/v1/responses", "responses"),
            ]
            .into_iter()
            .map(|(p, a)| (p.to_string(), a.to_string()))
            .collect(),
            block_size: 16,
            model_block_sizes: BTreeMap::new(),
            text_chunk_bytes: kvroute_core::keys::DEFAULT_TEXT_CHUNK_BYTES,
            report_flush_ms: 100,
            report_max_batch: 512,
            report_max_pending: 20_000,
            response_tail_bytes: 16 << 10,
            identity: crate::identity::RawIdentity::default(),
            strip_headers: Vec::new(),
            fallback_endpoints: 2,
            first_byte_timeout_ms: 10_000,
            trusted_sources: Vec::new(),
            allowed_targets: Vec::new(),
            state_token: None,
            state_token_env: None,
            route_variable: None,
            stream_usage: StreamUsage::Requested,
            admission: admission::Admission::default(),
            sensitivity: crate::pool::RawSensitivity::default(),
            pools: crate::pool::RawPools::default(),
        }
    }
}

/// Shortest credential accepted for the state service (bytes): a guessable token is none.
pub const MIN_TOKEN_LEN: usize = 32;

pub use crate::cidr::{peer_ip, Cidr};

/// Validated configuration, shared (read-only) by every HTTP context of a VM.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub state_cluster: String,
    pub state_authority: String,
    pub pick_path: String,
    pub report_path: String,
    /// Where a stored Responses API response lives (`GET` / `DELETE` / cancel on it).
    pub locate_path: String,
    pub pick_timeout: Duration,
    /// Pick and locate timeout of requests naming a stored response (Responses API): the
    /// state service may wait for a report that tells where the response is stored.
    pub affinity_timeout: Duration,
    pub report_timeout: Duration,
    pub routing_mode: RoutingMode,
    /// Lower-case name of the header the decision is written to.
    pub route_header: String,
    pub decision_header: bool,
    pub fallback_header: bool,
    pub max_body_bytes: usize,
    /// Path (without query) -> API. Exact match after trimming a trailing `/`.
    pub llm_paths: BTreeMap<String, Api>,
    pub block_size: u32,
    pub model_block_sizes: BTreeMap<String, u32>,
    pub text_chunk_bytes: usize,
    pub report_flush: Duration,
    pub report_max_batch: usize,
    pub report_max_pending: usize,
    pub response_tail_bytes: usize,
    /// Where the tenant comes from (see `identity.rs`).
    pub identity: crate::identity::Identity,
    /// Lower-case extra headers removed from every client request.
    pub strip_headers: Vec<String>,
    /// Endpoint mode: how many of the pick's fallback endpoints follow the chosen one in the
    /// override-host header (`IP:Port,IP:Port,...`; a retry moves down the list). 0 for a
    /// header that takes one host (an ORIGINAL_DST cluster's `http_header_name`).
    pub fallback_endpoints: usize,
    /// A streamed request whose worker sends no response head within this is retried on the
    /// next endpoint of its list (Envoy's per-try timeout, which ends when the response
    /// begins: a started stream is never retried). vLLM sends a stream's head before its
    /// prefill, so only a frozen or stuck worker misses it. 0: off. Not applied to
    /// non-streamed requests, whose head comes with the whole answer.
    pub first_byte_timeout: Option<Duration>,
    /// Downstream peers trusted with the decision's details (`x-kvroute-decision` with
    /// worker, matched/total blocks and predicted TTFT); others get no match information.
    pub trusted_sources: Vec<Cidr>,
    /// Endpoints / clusters the filter may route to (patterns with `*`); empty: any. A pick
    /// naming anything else falls back (`target_not_allowed`).
    pub allowed_targets: Vec<String>,
    /// Sent as `authorization: Bearer ..` on pick and report calls, when set.
    pub state_token: Option<String>,
    /// NGINX (ngx_wasm_module): the decision goes into this NGINX variable (`set $NAME "";` at
    /// server level, read by `proxy_pass`) instead of a request header, so no client can forge
    /// it even with the filter absent. Hosts that route on variables have no route cache:
    /// `clear_route_cache` (an Envoy foreign function, a trap elsewhere) is never called then.
    pub route_variable: Option<String>,
    pub stream_usage: StreamUsage,
    /// What a request kvroute cannot read or cannot get an answer for is admitted as (see
    /// `admission.rs`), for every route and per route name.
    pub admission: admission::Admission,
    /// The sensitivity classifier and the pool it sends sensitive requests to (`pool.rs`);
    /// `None`: off.
    pub sensitivity: Option<crate::pool::Sensitivity>,
    /// Where a request's pool comes from besides its route (`pool.rs`).
    pub pools: crate::pool::Pools,
}

/// Why a configuration was rejected; the message is logged by `on_configure`.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("configuration is not valid JSON for kvroute: {0}")]
    Json(String),
    #[error("`state_cluster` is required (the Envoy cluster of the kvroute state service)")]
    NoCluster,
    #[error("`{0}` must be greater than zero")]
    Zero(&'static str),
    #[error("`llm_paths`: unknown API `{api}` for path `{path}` (expected completions, chat_completions, messages or responses)")]
    UnknownApi { path: String, api: String },
    #[error("`{field}`: `{value}` is not a valid header name")]
    BadHeader { field: &'static str, value: String },
    #[error("`trusted_sources`: `{0}` is not an address or CIDR range (e.g. 10.0.0.0/8)")]
    BadCidr(String),
    #[error("`allowed_targets`: `{0:?}` is not a target pattern (printable, no spaces)")]
    BadTarget(String),
    #[error("set `state_token` or `state_token_env`, not both")]
    TwoTokens,
    #[error("`state_token_env`: environment variable `{0}` is not set in the VM (list it in vm_config.environment_variables.host_env_keys)")]
    NoTokenEnv(String),
    #[error("the state token must be at least 32 printable characters")]
    WeakToken,
    #[error("`pools`: {0}")]
    Pools(String),
    #[error("`identity`: {0}")]
    Identity(String),
    #[error("`route_variable`: `{0}` is not an NGINX variable name (letters, digits, `_`)")]
    BadVariable(String),
    #[error("`sensitivity`: {0}")]
    Sensitivity(String),
}

impl Config {
    /// Parses the plugin configuration bytes. Empty bytes are rejected (no cluster).
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        let raw: RawConfig = if bytes.iter().all(u8::is_ascii_whitespace) {
            RawConfig::default()
        } else {
            serde_json::from_slice(bytes).map_err(|e| ConfigError::Json(e.to_string()))?
        };
        Config::validate(raw)
    }

    pub fn validate(raw: RawConfig) -> Result<Config, ConfigError> {
        if raw.state_cluster.is_empty() {
            return Err(ConfigError::NoCluster);
        }
        for (name, v) in [
            ("pick_timeout_ms", raw.pick_timeout_ms as usize),
            ("affinity_timeout_ms", raw.affinity_timeout_ms as usize),
            ("report_timeout_ms", raw.report_timeout_ms as usize),
            ("max_body_bytes", raw.max_body_bytes),
            ("block_size", raw.block_size as usize),
            ("report_flush_ms", raw.report_flush_ms as usize),
            ("report_max_batch", raw.report_max_batch),
        ] {
            if v == 0 {
                return Err(ConfigError::Zero(name));
            }
        }
        if raw.model_block_sizes.values().any(|b| *b == 0) {
            return Err(ConfigError::Zero("model_block_sizes"));
        }
        let mut llm_paths = BTreeMap::new();
        for (path, api) in &raw.llm_paths {
            let parsed = match api.as_str() {
                "completions" => Api::Completions,
                "chat_completions" => Api::ChatCompletions,
                "messages" => Api::Messages,
                "responses" => Api::Responses,
                _ => return Err(ConfigError::UnknownApi { path: path.clone(), api: api.clone() }),
            };
            llm_paths.insert(path.trim_end_matches('/').to_string(), parsed);
        }
        let route_header = match (&raw.route_header, raw.routing_mode) {
            (Some(h), _) => header_name("route_header", h)?,
            (None, RoutingMode::Endpoint) => DEFAULT_ENDPOINT_HEADER.into(),
            (None, RoutingMode::Cluster) => DEFAULT_CLUSTER_HEADER.into(),
        };
        let identity = crate::identity::Identity::validate(raw.identity, |f, h| header_name(f, h).map_err(|e| e.to_string())).map_err(ConfigError::Identity)?;
        if let Some(v) = raw.route_variable.as_deref().filter(|v| v.is_empty() || !v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')) {
            return Err(ConfigError::BadVariable(v.to_string()));
        }
        let strip_headers =
            raw.strip_headers.iter().map(|h| header_name("strip_headers", h)).collect::<Result<Vec<_>, _>>()?;
        let trusted_sources = raw
            .trusted_sources
            .iter()
            .map(|c| Cidr::parse(c).ok_or_else(|| ConfigError::BadCidr(c.clone())))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(p) = raw.allowed_targets.iter().find(|p| !targets::valid_pattern(p)) {
            return Err(ConfigError::BadTarget(p.clone()));
        }
        let state_token = match (&raw.state_token, &raw.state_token_env) {
            (Some(_), Some(_)) => return Err(ConfigError::TwoTokens),
            (Some(t), None) => Some(t.trim().to_string()),
            (None, Some(var)) => Some(std::env::var(var).map_err(|_| ConfigError::NoTokenEnv(var.clone()))?.trim().to_string()),
            (None, None) => None,
        };
        if let Some(t) = &state_token {
            if t.len() < MIN_TOKEN_LEN || !t.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(ConfigError::WeakToken);
            }
        }
        Ok(Config {
            state_cluster: raw.state_cluster,
            state_authority: raw.state_authority,
            pick_path: raw.pick_path,
            report_path: raw.report_path,
            locate_path: raw.locate_path,
            pick_timeout: Duration::from_millis(raw.pick_timeout_ms),
            affinity_timeout: Duration::from_millis(raw.affinity_timeout_ms.max(raw.pick_timeout_ms)),
            report_timeout: Duration::from_millis(raw.report_timeout_ms),
            routing_mode: raw.routing_mode,
            route_header,
            decision_header: raw.decision_header,
            fallback_header: raw.fallback_header,
            max_body_bytes: raw.max_body_bytes,
            llm_paths,
            block_size: raw.block_size,
            model_block_sizes: raw.model_block_sizes,
            text_chunk_bytes: raw.text_chunk_bytes,
            report_flush: Duration::from_millis(raw.report_flush_ms),
            report_max_batch: raw.report_max_batch,
            report_max_pending: raw.report_max_pending,
            response_tail_bytes: raw.response_tail_bytes,
            identity,
            strip_headers,
            fallback_endpoints: raw.fallback_endpoints,
            first_byte_timeout: (raw.first_byte_timeout_ms > 0).then(|| Duration::from_millis(raw.first_byte_timeout_ms)),
            trusted_sources,
            allowed_targets: raw.allowed_targets,
            state_token,
            route_variable: raw.route_variable,
            stream_usage: raw.stream_usage,
            sensitivity: raw.sensitivity.validate().map_err(ConfigError::Sensitivity)?,
            pools: raw.pools.validate(|f, h| header_name(f, h).map_err(|e| e.to_string())).map_err(ConfigError::Pools)?,
            admission: raw.admission,
        })
    }

    /// The API served at `path` (query and fragment ignored), or `None` for pass-through paths.
    pub fn api_for_path(&self, path: &str) -> Option<Api> {
        let path = path.split(['?', '#']).next().unwrap_or(path);
        self.llm_paths.get(path.trim_end_matches('/')).copied()
    }

    /// The stored response a request names by path: `{responses path}/{id}` (`GET`, `DELETE`)
    /// or `{responses path}/{id}/cancel` (`POST`), for a path configured as `responses`.
    pub fn response_id_for_path<'a>(&self, path: &'a str) -> Option<&'a str> {
        let path = path.split(['?', '#']).next().unwrap_or(path).trim_end_matches('/');
        self.llm_paths.iter().filter(|(_, api)| **api == Api::Responses).find_map(|(base, _)| {
            let rest = path.strip_prefix(base.as_str())?.strip_prefix('/')?;
            let id = rest.strip_suffix("/cancel").unwrap_or(rest);
            let ok = !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
            ok.then_some(id)
        })
    }

    /// Whether a downstream peer (host `source.address`) may see the decision's details.
    pub fn trusts(&self, source_address: Option<&str>) -> bool {
        source_address.and_then(peer_ip).is_some_and(|ip| self.trusted_sources.iter().any(|c| c.contains(ip)))
    }

    /// Whether the filter may route to `target`.
    pub fn allows(&self, target: &str) -> bool {
        targets::allowed(&self.allowed_targets, target)
    }

    /// The block size for `model`: its override, else the default.
    pub fn block_size_for(&self, model: &str) -> u32 {
        self.model_block_sizes.get(model).copied().unwrap_or(self.block_size)
    }
}

fn header_name(field: &'static str, value: &str) -> Result<String, ConfigError> {
    let ok = !value.is_empty()
        && !value.starts_with(':')
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.!#$%&'*+^`|~".contains(&b));
    if ok {
        Ok(value.to_ascii_lowercase())
    } else {
        Err(ConfigError::BadHeader { field, value: value.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_config_gets_defaults() {
        let c = Config::parse(br#"{"state_cluster":"kvroute_state"}"#).unwrap();
        assert_eq!(c.pick_timeout, Duration::from_millis(50));
        assert_eq!(c.routing_mode, RoutingMode::Endpoint);
        assert_eq!(c.route_header, DEFAULT_ENDPOINT_HEADER);
        assert_eq!(c.max_body_bytes, 4 << 20);
        assert_eq!(c.api_for_path("/v1/chat/completions?x=1"), Some(Api::ChatCompletions));
        assert_eq!(c.api_for_path("/v1/models"), None);
        assert_eq!(c.block_size_for("any"), 16);
    }

    #[test]
    fn stored_response_paths() {
        let c = Config::parse(br#"{"state_cluster":"s"}"#).unwrap();
        assert_eq!(c.api_for_path("/v1/responses"), Some(Api::Responses));
        assert_eq!(c.response_id_for_path("/v1/responses/resp_1a?stream=false"), Some("resp_1a"));
        assert_eq!(c.response_id_for_path("/v1/responses/resp_1a/cancel"), Some("resp_1a"));
        for other in ["/v1/responses", "/v1/responses/", "/v1/responses/a/b", "/v1/responses/a%20b", "/v1/chat/completions/x"] {
            assert_eq!(c.response_id_for_path(other), None, "{other}");
        }
    }

    #[test]
    fn cluster_mode_and_overrides() {
        let c = Config::parse(
            br#"{"state_cluster":"s","routing_mode":"cluster","model_block_sizes":{"big":32},
                 "llm_paths":{"/generate/":"completions"},"strip_headers":["X-Foo"]}"#,
        )
        .unwrap();
        assert_eq!(c.route_header, DEFAULT_CLUSTER_HEADER);
        assert_eq!(c.block_size_for("big"), 32);
        assert_eq!(c.api_for_path("/generate"), Some(Api::Completions));
        assert_eq!(c.api_for_path("/v1/completions"), None);
        assert_eq!(c.strip_headers, vec!["x-foo".to_string()]);
    }

    #[test]
    fn trust_targets_and_tokens() {
        let c = Config::parse(
            br#"{"state_cluster":"s","trusted_sources":["10.0.0.0/8","::1","192.168.1.7"],
                 "allowed_targets":["10.1.0.*:8000","vllm_*","exact:1"]}"#,
        )
        .unwrap();
        assert!(c.trusts(Some("10.3.4.5:4444")) && c.trusts(Some("[::1]:80")) && c.trusts(Some("192.168.1.7:1")));
        assert!(c.trusts(Some("[::ffff:10.0.0.1]:1")), "v4-mapped v6 peers match v4 ranges");
        assert!(!c.trusts(Some("11.0.0.1:1")) && !c.trusts(Some("192.168.1.8:1")) && !c.trusts(None) && !c.trusts(Some("junk")));
        assert!(c.allows("10.1.0.5:8000") && c.allows("vllm_gpu_0") && c.allows("exact:1"));
        assert!(!c.allows("10.1.0.5:9000") && !c.allows("evil.example:8000") && !c.allows("exact:12") && !c.allows("x_vllm_1"));
        assert!(Config::parse(br#"{"state_cluster":"s"}"#).unwrap().allows("anything:1"), "no list: any target");
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains("8.8.8.8".parse().unwrap()));

        let token = "t".repeat(32);
        let c = Config::parse(format!(r#"{{"state_cluster":"s","state_token":" {token} "}}"#).as_bytes()).unwrap();
        assert_eq!(c.state_token.as_deref(), Some(token.as_str()));
        assert_eq!(Config::parse(br#"{"state_cluster":"s","state_token":"short"}"#), Err(ConfigError::WeakToken));
        assert!(matches!(
            Config::parse(br#"{"state_cluster":"s","state_token_env":"KVROUTE_TEST_UNSET_TOKEN_VAR"}"#),
            Err(ConfigError::NoTokenEnv(_))
        ));
        assert!(matches!(Config::parse(br#"{"state_cluster":"s","trusted_sources":["10.0.0.0/33"]}"#), Err(ConfigError::BadCidr(_))));
        assert!(matches!(Config::parse(br#"{"state_cluster":"s","allowed_targets":["a b"]}"#), Err(ConfigError::BadTarget(_))));
    }

    #[test]
    fn bad_configs_say_why() {
        assert_eq!(Config::parse(b""), Err(ConfigError::NoCluster));
        assert!(matches!(Config::parse(b"{"), Err(ConfigError::Json(_))));
        assert!(matches!(Config::parse(br#"{"state_cluster":"s","typo":1}"#), Err(ConfigError::Json(_))));
        assert_eq!(Config::parse(br#"{"state_cluster":"s","block_size":0}"#), Err(ConfigError::Zero("block_size")));
        assert!(matches!(
            Config::parse(br#"{"state_cluster":"s","llm_paths":{"/x":"embeddings"}}"#),
            Err(ConfigError::UnknownApi { .. })
        ));
        assert!(matches!(
            Config::parse(br#"{"state_cluster":"s","route_header":":authority"}"#),
            Err(ConfigError::BadHeader { .. })
        ));
    }
}
