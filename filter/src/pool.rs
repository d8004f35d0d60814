//! A request's pool: which workers it may reach, from verified sources only, the first that
//! names one: the route's configuration (`admission.pool`, per route in `admission.routes`);
//! `pools.sources`, read like the tenant's identity sources (a verified JWT's claim, an API
//! key's entry, a trusted hop's header; a client's own header names nothing and is stripped);
//! the tenant's pool (`pools.tenants`). Then the sensitivity classifier (`sensitivity`) moves a request whose body holds a secret or
//! personal data of the configured kinds in any string (messages, tool definitions,
//! instructions, metadata) to its pool, and so does every request whose text the filter
//! cannot read while the classifier is on (token ids, an unread body): what cannot be checked
//! is treated as sensitive. The classifier runs here, in the proxy, so the
//! prompt's text is classified before it leaves it and the label binds even when the state
//! service cannot answer. What it found is counted by kind and never logged.
//!
//! A request with a pool is only ever sent to a worker the state service picked from that
//! pool. Every path that would send it by the route's default upstream instead (no answer,
//! no healthy worker in the pool, an unknown model) answers 503 in the called API's shape: a
//! restricted prompt never spills to another pool. The upstream request carries the pool in
//! `x-kvroute-pool` (set by the filter only; a client's copy is removed), for routes and logs.

use crate::identity::{resolve, Facts, Identity, RawIdentity, RawSource};
use kvroute_core::sensitive::{Findings, Kind};
use serde::Deserialize;
use std::collections::BTreeMap;

pub const POOL_HEADER: &str = "x-kvroute-pool";

/// `pools` as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawPools {
    /// Where a request's pool comes from, in order (the identity source kinds: `jwt` with the
    /// claim naming the pool, `mtls`, `api_key` with each key's pool, `header` from trusted hops).
    pub sources: Vec<RawSource>,
    /// A tenant's pool, for requests no route or source places.
    pub tenants: BTreeMap<String, String>,
}

/// The validated `pools`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pools {
    pub sources: Identity,
    tenants: BTreeMap<String, String>,
}

impl RawPools {
    pub fn validate(self, header_name: impl Fn(&'static str, &str) -> Result<String, String>) -> Result<Pools, String> {
        let sources = Identity::validate(RawIdentity { sources: self.sources, ..RawIdentity::default() }, header_name).map_err(|e| format!("sources: {e}"))?;
        if let Some((tenant, pool)) = self.tenants.iter().find(|(_, p)| !crate::identity::valid_tenant(p)) {
            return Err(format!("tenants.{tenant}: {pool:?} is not a pool name"));
        }
        Ok(Pools { sources, tenants: self.tenants })
    }
}

impl Pools {
    /// The pool of a request on a route whose own pool is `route` (empty: none), sent by
    /// `tenant`: the first of the route's, a verified source's and the tenant's.
    pub fn pool_of(&self, route: &str, facts: &impl Facts, tenant: &str) -> String {
        if !route.is_empty() {
            return route.to_string();
        }
        if let Some((pool, _)) = resolve(&self.sources, facts) {
            return pool;
        }
        self.tenants.get(tenant).cloned().unwrap_or_default()
    }
}

/// `sensitivity` as written.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawSensitivity {
    /// The pool a sensitive request goes to; empty: the classifier is off.
    pub pool: String,
    /// The kinds that make a request sensitive (`api_key`, `private_key`, `card`, `iban`,
    /// `email`, `phone`, `national_id`); empty: every kind.
    pub kinds: Vec<String>,
}

/// The classifier as configured.
#[derive(Clone, Debug, PartialEq)]
pub struct Sensitivity {
    pub pool: String,
    kinds: Findings,
}

impl RawSensitivity {
    /// `None` when off; an unknown kind is an error naming it.
    pub fn validate(&self) -> Result<Option<Sensitivity>, String> {
        if self.pool.is_empty() {
            return match self.kinds.is_empty() {
                true => Ok(None),
                false => Err("sensitivity.kinds is set but sensitivity.pool is empty".into()),
            };
        }
        let kinds = match self.kinds.is_empty() {
            true => Findings::all(),
            false => self.kinds.iter().map(|k| Kind::from_label(k).ok_or_else(|| format!("sensitivity.kinds: unknown kind {k:?}"))).collect::<Result<_, _>>()?,
        };
        Ok(Some(Sensitivity { pool: self.pool.clone(), kinds }))
    }
}

impl Sensitivity {
    /// Whether what the request's text holds (`None`: its text cannot be read) makes it
    /// sensitive.
    pub fn sensitive(&self, found: Option<Findings>) -> bool {
        found.is_none_or(|f| f.any_of(self.kinds))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cidr::Cidr;

    struct Fake {
        claim: Option<String>,
        header: Option<String>,
        trusted_peer: bool,
    }

    impl Facts for Fake {
        fn property(&self, path: &[&str]) -> Option<String> {
            (path.last() == Some(&"kvroute_pool")).then(|| self.claim.clone()).flatten()
        }
        fn header(&self, name: &str) -> Option<String> {
            (name == "x-pool").then(|| self.header.clone()).flatten()
        }
        fn peer_in(&self, _: &[Cidr]) -> bool {
            self.trusted_peer
        }
    }

    #[test]
    fn a_pool_comes_from_the_route_then_a_verified_source_then_the_tenant() {
        let raw: RawPools = serde_json::from_str(
            r#"{"sources":[{"jwt":{"claim":"kvroute_pool"}},{"header":{"name":"x-pool","trusted_sources":["10.0.0.0/8"]}}],"tenants":{"clinic":"restricted"}}"#,
        )
        .unwrap();
        let pools = raw.validate(|_, h| Ok(h.to_string())).unwrap();
        let none = Fake { claim: None, header: None, trusted_peer: false };
        assert_eq!(pools.pool_of("", &none, "someone"), "");
        assert_eq!(pools.pool_of("", &none, "clinic"), "restricted", "the tenant's pool");
        assert_eq!(pools.pool_of("canary", &none, "clinic"), "canary", "the route's comes first");
        let claimed = Fake { claim: Some("gpu-large".into()), ..none };
        assert_eq!(pools.pool_of("", &claimed, "clinic"), "gpu-large", "a verified claim before the tenant's");
        let hop = Fake { claim: None, header: Some("onprem".into()), trusted_peer: false };
        assert_eq!(pools.pool_of("", &hop, "x"), "", "a header from an untrusted peer names nothing");
        let trusted = Fake { trusted_peer: true, ..hop };
        assert_eq!(pools.pool_of("", &trusted, "x"), "onprem");
        let bad: RawPools = serde_json::from_str(r#"{"tenants":{"a":"has space"}}"#).unwrap();
        assert!(bad.validate(|_, h| Ok(h.to_string())).is_err());
    }

    #[test]
    fn configured_kinds_make_a_request_sensitive_and_unreadable_text_always_does() {
        use kvroute_core::sensitive::scan;
        let s = RawSensitivity { pool: "restricted".into(), kinds: vec!["card".into(), "api_key".into()] }.validate().unwrap().unwrap();
        assert!(s.sensitive(Some(scan("charge 4111 1111 1111 1111 please"))));
        let found = scan("mail me at jane@example.com");
        assert!(found.has(Kind::Email) && !s.sensitive(Some(found)), "email is found, but not a configured kind");
        assert!(!s.sensitive(Some(scan("what is a KV cache?"))));
        assert!(s.sensitive(None), "token ids or an unread body cannot be checked: sensitive");
        let all = RawSensitivity { pool: "p".into(), kinds: vec![] }.validate().unwrap().unwrap();
        assert!(all.sensitive(Some(scan("jane@example.com"))));
        assert_eq!(RawSensitivity::default().validate(), Ok(None));
        assert!(RawSensitivity { pool: "p".into(), kinds: vec!["tattoo".into()] }.validate().is_err());
        assert!(RawSensitivity { pool: String::new(), kinds: vec!["card".into()] }.validate().is_err());
    }
}
