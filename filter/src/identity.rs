//! Who a request is charged to: the tenant, taken only from what the proxy verified.
//!
//! Sources, tried in the configured order; the first that names a tenant wins:
//! - `jwt`: a claim of a token Envoy's `jwt_authn` filter verified (its payload in the
//!   stream's dynamic metadata, `payload_in_metadata`); an unverified token never gets there;
//! - `mtls`: the downstream connection's client certificate (first URI SAN, first DNS SAN, or
//!   subject), which Envoy verified against its trusted CA;
//! - `api_key`: a key the client sends (`authorization: Bearer ..`, `x-api-key`), found by its
//!   SHA-256 in the configuration (which never holds a key in clear);
//! - `header`: a header set by a trusted hop, read only when the downstream peer's address is
//!   in the source's ranges; from anyone else it is stripped before any filter reads it.
//!
//! Nothing the client can choose names a tenant: a request with no verified identity gets
//! `default_tenant`, or 401 when `required`.

use crate::cidr::Cidr;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// Longest tenant the state service accepts.
pub const MAX_TENANT_LEN: usize = 128;

/// Envoy's `jwt_authn` filter writes verified payloads under this metadata namespace.
pub const JWT_AUTHN_NAMESPACE: &str = "envoy.filters.http.jwt_authn";

/// `identity` as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawIdentity {
    pub sources: Vec<RawSource>,
    pub default_tenant: Option<String>,
    pub required: bool,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum RawSource {
    Jwt {
        /// The claim naming the tenant; `a.b` reads claim `b` of object claim `a`.
        claim: String,
        /// `jwt_authn`'s provider `payload_in_metadata`.
        #[serde(default = "default_payload_key")]
        payload_in_metadata: String,
        #[serde(default = "default_jwt_namespace")]
        namespace: String,
    },
    Mtls(CertField),
    ApiKey {
        /// SHA-256 (hex, optionally `sha256:`-prefixed) of each key -> its tenant.
        keys: BTreeMap<String, String>,
        /// Headers carrying the key; default `authorization` (`Bearer`) and `x-api-key`.
        #[serde(default)]
        headers: Vec<String>,
    },
    Header {
        name: String,
        trusted_sources: Vec<String>,
    },
}

fn default_payload_key() -> String {
    "jwt_payload".into()
}

fn default_jwt_namespace() -> String {
    JWT_AUTHN_NAMESPACE.into()
}

/// Which part of the verified client certificate names the tenant.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CertField {
    UriSan,
    DnsSan,
    Subject,
}

impl CertField {
    /// Envoy's connection attribute for it.
    fn property(self) -> &'static str {
        match self {
            CertField::UriSan => "uri_san_peer_certificate",
            CertField::DnsSan => "dns_san_peer_certificate",
            CertField::Subject => "subject_peer_certificate",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    Jwt { path: Vec<String> },
    Mtls(CertField),
    ApiKey { keys: BTreeMap<[u8; 32], String>, headers: Vec<String> },
    Header { name: String, trusted: Vec<Cidr> },
}

impl Source {
    pub fn label(&self) -> &'static str {
        match self {
            Source::Jwt { .. } => "jwt",
            Source::Mtls(_) => "mtls",
            Source::ApiKey { .. } => "api_key",
            Source::Header { .. } => "header",
        }
    }
}

/// The validated identity configuration.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Identity {
    pub sources: Vec<Source>,
    pub default_tenant: Option<String>,
    pub required: bool,
}

/// Whether `name` can be a tenant: 1..=128 printable ASCII characters, no spaces.
pub fn valid_tenant(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_TENANT_LEN && name.bytes().all(|b| b.is_ascii_graphic())
}

fn bad(message: String) -> String {
    message
}

impl Identity {
    /// The error is the message `config` reports under `identity`.
    pub fn validate(raw: RawIdentity, header_name: impl Fn(&'static str, &str) -> Result<String, String>) -> Result<Identity, String> {
        let mut sources = Vec::new();
        for source in raw.sources {
            sources.push(match source {
                RawSource::Jwt { claim, payload_in_metadata, namespace } => {
                    if claim.is_empty() || claim.split('.').any(str::is_empty) {
                        return Err(bad(format!("jwt.claim {claim:?} is not a claim name")));
                    }
                    let mut path = vec!["metadata".to_string(), "filter_metadata".into(), namespace, payload_in_metadata];
                    path.extend(claim.split('.').map(str::to_string));
                    Source::Jwt { path }
                }
                RawSource::Mtls(field) => Source::Mtls(field),
                RawSource::ApiKey { keys, headers } => {
                    let mut hashed = BTreeMap::new();
                    for (digest, tenant) in keys {
                        let hex = digest.strip_prefix("sha256:").unwrap_or(&digest);
                        let parsed = parse_digest(hex).ok_or_else(|| {
                            bad("api_key.keys: each key is its SHA-256 as 64 hex digits (printf %s \"$KEY\" | sha256sum), never the key".to_string())
                        })?;
                        if !valid_tenant(&tenant) {
                            return Err(bad(format!("api_key.keys: {tenant:?} is not a tenant (1 to 128 printable characters, no spaces)")));
                        }
                        hashed.insert(parsed, tenant);
                    }
                    let headers = if headers.is_empty() {
                        vec!["authorization".into(), "x-api-key".into()]
                    } else {
                        headers.iter().map(|h| header_name("identity.api_key.headers", h)).collect::<Result<_, _>>()?
                    };
                    Source::ApiKey { keys: hashed, headers }
                }
                RawSource::Header { name, trusted_sources } => {
                    let trusted = trusted_sources
                        .iter()
                        .map(|c| Cidr::parse(c).ok_or_else(|| format!("header.trusted_sources: `{c}` is not an address or CIDR range")))
                        .collect::<Result<Vec<_>, _>>()?;
                    if trusted.is_empty() {
                        return Err(bad("header.trusted_sources: name the hops allowed to set it (a header anyone may set names no tenant)".into()));
                    }
                    Source::Header { name: header_name("identity.header.name", &name)?, trusted }
                }
            });
        }
        if let Some(t) = raw.default_tenant.as_deref().filter(|t| !valid_tenant(t)) {
            return Err(bad(format!("default_tenant {t:?} is not a tenant (1 to 128 printable characters, no spaces)")));
        }
        Ok(Identity { sources, default_tenant: raw.default_tenant, required: raw.required })
    }

    /// The trusted-hop header names, for stripping.
    pub fn header_sources(&self) -> impl Iterator<Item = (&str, &[Cidr])> {
        self.sources.iter().filter_map(|s| match s {
            Source::Header { name, trusted } => Some((name.as_str(), trusted.as_slice())),
            _ => None,
        })
    }

    /// Whether any source needs the downstream peer's address.
    pub fn needs_peer(&self) -> bool {
        self.header_sources().next().is_some()
    }
}

fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// What the host knows about a request, as identity reads it.
pub trait Facts {
    /// A host property (`connection.uri_san_peer_certificate`, dynamic metadata, ...).
    fn property(&self, path: &[&str]) -> Option<String>;
    fn header(&self, name: &str) -> Option<String>;
    /// The downstream peer's IP is in one of `ranges`.
    fn peer_in(&self, ranges: &[Cidr]) -> bool;
}

/// The request's tenant and the source that named it, or `None` when nothing verified did.
/// A value that is not a valid tenant name counts as no identity from that source.
pub fn resolve(identity: &Identity, facts: &impl Facts) -> Option<(String, &'static str)> {
    identity.sources.iter().find_map(|source| {
        let tenant = match source {
            Source::Jwt { path } => {
                let path: Vec<&str> = path.iter().map(String::as_str).collect();
                facts.property(&path)
            }
            Source::Mtls(field) => facts.property(&["connection", field.property()]),
            Source::ApiKey { keys, headers } => headers.iter().find_map(|h| {
                let value = facts.header(h)?;
                let key = match h.as_str() {
                    "authorization" => value.strip_prefix("Bearer ").or_else(|| value.strip_prefix("bearer "))?.trim(),
                    _ => value.trim(),
                };
                let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
                keys.get(&digest).cloned()
            }),
            Source::Header { name, trusted } => facts.peer_in(trusted).then(|| facts.header(name)).flatten(),
        }?;
        let tenant = tenant.trim().to_string();
        valid_tenant(&tenant).then_some((tenant, source.label()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[derive(Default)]
    struct Fake {
        properties: HashMap<String, String>,
        headers: HashMap<String, String>,
        peer: Option<std::net::IpAddr>,
    }

    impl Facts for Fake {
        fn property(&self, path: &[&str]) -> Option<String> {
            self.properties.get(&path.join("/")).cloned()
        }
        fn header(&self, name: &str) -> Option<String> {
            self.headers.get(name).cloned()
        }
        fn peer_in(&self, ranges: &[Cidr]) -> bool {
            self.peer.is_some_and(|ip| ranges.iter().any(|c| c.contains(ip)))
        }
    }

    fn identity(json: &str) -> Result<Identity, String> {
        let raw: RawIdentity = serde_json::from_str(json).map_err(|e| e.to_string())?;
        Identity::validate(raw, |_, h| Ok(h.to_ascii_lowercase()))
    }

    fn sha(key: &str) -> String {
        Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn sources_in_order_first_verified_wins() {
        let id = identity(&format!(
            r#"{{"sources":[{{"jwt":{{"claim":"org.team"}}}},{{"mtls":"uri_san"}},{{"api_key":{{"keys":{{"sha256:{}":"keyed"}}}}}},
                {{"header":{{"name":"x-tenant","trusted_sources":["10.0.0.0/8"]}}}}],"default_tenant":"public"}}"#,
            sha("sk-good")
        ))
        .unwrap();
        let mut f = Fake::default();
        assert_eq!(resolve(&id, &f), None, "nothing verified");
        f.headers.insert("x-tenant".into(), "hopped".into());
        assert_eq!(resolve(&id, &f), None, "a header from an untrusted peer names nobody");
        f.peer = Some("10.1.2.3".parse().unwrap());
        assert_eq!(resolve(&id, &f), Some(("hopped".into(), "header")));
        f.headers.insert("authorization".into(), "Bearer sk-wrong".into());
        assert_eq!(resolve(&id, &f), Some(("hopped".into(), "header")), "an unknown key is no identity");
        f.headers.insert("authorization".into(), "Bearer sk-good".into());
        assert_eq!(resolve(&id, &f), Some(("keyed".into(), "api_key")));
        f.headers.remove("authorization");
        f.headers.insert("x-api-key".into(), "sk-good".into());
        assert_eq!(resolve(&id, &f), Some(("keyed".into(), "api_key")), "the Anthropic SDK's header");
        f.properties.insert("connection/uri_san_peer_certificate".into(), "spiffe://fleet/team-m".into());
        assert_eq!(resolve(&id, &f), Some(("spiffe://fleet/team-m".into(), "mtls")));
        f.properties.insert(format!("metadata/filter_metadata/{JWT_AUTHN_NAMESPACE}/jwt_payload/org/team"), "jwt-team".into());
        assert_eq!(resolve(&id, &f), Some(("jwt-team".into(), "jwt")));
        f.properties.insert(format!("metadata/filter_metadata/{JWT_AUTHN_NAMESPACE}/jwt_payload/org/team"), "has space".into());
        assert_eq!(resolve(&id, &f), Some(("spiffe://fleet/team-m".into(), "mtls")), "not a tenant name: the next source");
        assert_eq!(id.default_tenant.as_deref(), Some("public"));
    }

    #[test]
    fn bad_identity_configs_say_why() {
        let msg = |json: &str| identity(json).unwrap_err().to_string();
        assert!(msg(r#"{"sources":[{"api_key":{"keys":{"sk-in-clear":"t"}}}]}"#).contains("SHA-256"));
        assert!(msg(r#"{"sources":[{"header":{"name":"x-tenant","trusted_sources":[]}}]}"#).contains("trusted_sources"));
        assert!(msg(r#"{"sources":[{"jwt":{"claim":""}}]}"#).contains("claim"));
        assert!(msg(r#"{"default_tenant":"a b"}"#).contains("default_tenant"));
        assert!(msg(r#"{"sources":[{"mtls":"email"}]}"#).contains("unknown variant"));
    }
}
