//! Pools: which workers a request may reach. Workers carry labels (`[[workers]] labels`); a
//! pool (`[pools.NAME] labels`) is every worker whose labels include the pool's. The proxy
//! names a request's pool from verified sources only (its route's configuration, the
//! sensitivity classifier), never from a client's header. A request of a pool is placed among
//! that pool's workers alone; when none is healthy it gets no worker (the proxy then refuses
//! it: a restricted prompt never spills to another pool). A pool is `exclusive` by default:
//! its workers take no request that names no pool.
//!
//! Seen from outside: `/v1/workers` lists each worker's pools and each pool's size; metrics
//! `kvroute_pool_workers{pool,state}` and `kvroute_pool_picks_total{pool,outcome}` (labels are
//! the configured names, so their number is bounded by the config).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `[pools.NAME]`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct PoolConfig {
    /// The labels a worker must carry (all of them, equal values) to be in the pool.
    pub labels: BTreeMap<String, String>,
    /// Its workers serve only requests of a pool they are in (default true).
    pub exclusive: Option<bool>,
}

impl PoolConfig {
    fn holds(&self, labels: &BTreeMap<String, String>) -> bool {
        self.labels.iter().all(|(k, v)| labels.get(k) == Some(v))
    }

    fn exclusive(&self) -> bool {
        self.exclusive.unwrap_or(true)
    }
}

/// Problems with `[pools]`, for the validator.
pub fn problems(pools: &BTreeMap<String, PoolConfig>) -> Vec<String> {
    pools.iter().filter(|(_, p)| p.labels.is_empty()).map(|(name, _)| format!("pools.{name}.labels is empty (it would hold every worker)")).collect()
}

/// Whether a worker with `labels` may take a request of `pool` (empty: the request names none).
/// An unknown pool admits no worker.
pub fn admits(pools: &BTreeMap<String, PoolConfig>, pool: &str, labels: &BTreeMap<String, String>) -> bool {
    if pool.is_empty() {
        return !pools.values().any(|p| p.exclusive() && p.holds(labels));
    }
    pools.get(pool).is_some_and(|p| p.holds(labels))
}

/// The pools a worker with `labels` is in, by name.
pub fn member_of<'a>(pools: &'a BTreeMap<String, PoolConfig>, labels: &BTreeMap<String, String>) -> Vec<&'a str> {
    pools.iter().filter(|(_, p)| p.holds(labels)).map(|(name, _)| name.as_str()).collect()
}

/// A request's pool as a metric label: a configured name, `none`, or `unknown` (whatever a
/// proxy sends, the label set stays the configured one).
pub fn label(pools: &BTreeMap<String, PoolConfig>, pool: &str) -> String {
    match pool {
        "" => "none".into(),
        p if pools.contains_key(p) => p.into(),
        _ => "unknown".into(),
    }
}

/// `[pools]` as `/v1/workers` shows it: each pool's labels, whether it is exclusive, and
/// how many of `workers` (each: its labels, whether it takes picks) it holds.
pub fn summary<'a>(pools: &BTreeMap<String, PoolConfig>, workers: impl Iterator<Item = (&'a BTreeMap<String, String>, bool)> + Clone) -> serde_json::Value {
    let entries = pools.iter().map(|(name, p)| {
        let members = workers.clone().filter(|(labels, _)| p.holds(labels));
        let taking = members.clone().filter(|(_, takes)| *takes).count();
        let view = serde_json::json!({ "labels": p.labels, "exclusive": p.exclusive(), "workers": members.count(), "taking_picks": taking });
        (name.clone(), view)
    });
    serde_json::Value::Object(entries.collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn a_pool_holds_the_workers_with_its_labels_and_keeps_them_for_itself() {
        let pools = BTreeMap::from([
            ("restricted".to_string(), PoolConfig { labels: labels(&[("sensitivity", "restricted")]), exclusive: None }),
            ("canary".to_string(), PoolConfig { labels: labels(&[("track", "canary")]), exclusive: Some(false) }),
        ]);
        let onprem = labels(&[("sensitivity", "restricted"), ("site", "onprem")]);
        let public = labels(&[("site", "cloud")]);
        let canary = labels(&[("track", "canary")]);
        assert!(admits(&pools, "restricted", &onprem));
        assert!(!admits(&pools, "restricted", &public) && !admits(&pools, "restricted", &canary));
        assert!(!admits(&pools, "", &onprem), "exclusive: no unpooled request reaches it");
        assert!(admits(&pools, "", &public) && admits(&pools, "", &canary), "a shared pool's workers take unpooled requests too");
        assert!(admits(&pools, "canary", &canary) && !admits(&pools, "canary", &public));
        assert!(!admits(&pools, "nosuch", &public), "an unknown pool admits nothing");
        assert!(admits(&BTreeMap::new(), "", &onprem), "no pools: every worker");
        assert_eq!(problems(&BTreeMap::from([("x".to_string(), PoolConfig::default())])).len(), 1);
        assert_eq!(member_of(&pools, &onprem), vec!["restricted"]);
        assert_eq!((label(&pools, ""), label(&pools, "canary"), label(&pools, "x")), ("none".into(), "canary".into(), "unknown".into()));
        let s = summary(&pools, [(&onprem, true), (&public, true), (&canary, false)].into_iter());
        assert_eq!((s["restricted"]["workers"].as_u64(), s["canary"]["taking_picks"].as_u64()), (Some(1), Some(0)));
    }
}
