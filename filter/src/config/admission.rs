//! `admission` as written in the plugin configuration: what a request kvroute cannot read, or
//! cannot get an answer for, is admitted as (see `crate::admission`), for every route and per
//! Envoy route name.

use serde::Deserialize;
use std::collections::BTreeMap;

/// What happens to a body the filter cannot read.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnUnread {
    /// Admitted and charged the state service's stated worst case; routed by the default
    /// upstream.
    #[default]
    Charge,
    /// Refused with 400 (unreadable) or 413 (too large) in the called API's error shape.
    Reject,
}

/// What happens to a request with a tenant when the state service cannot answer.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStateUnavailable {
    /// Routed by the default upstream, uncharged (for routes without budgets).
    #[default]
    Allow,
    /// Refused with 503 and `Retry-After`: no budgeted request goes uncharged.
    Reject,
}

/// One route's admission policy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Policy {
    pub unread_body: OnUnread,
    pub state_unavailable: OnStateUnavailable,
    /// The service class its requests are queued in when every worker is saturated (the state
    /// service's `[scheduling.classes]`); empty: the tenant's class there, else its default.
    /// The route is a verified source: a client cannot choose its class.
    pub service_class: String,
    /// The pool of workers its requests must be placed in (the state service's `[pools]`;
    /// see `crate::pool`); empty: none. Never from a client.
    pub pool: String,
}

/// `admission` as written: the policy for every route, and per Envoy route name.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Admission {
    pub unread_body: OnUnread,
    pub state_unavailable: OnStateUnavailable,
    pub service_class: String,
    pub pool: String,
    pub routes: BTreeMap<String, Policy>,
}

impl Admission {
    /// The policy of the route named `route` (Envoy's `xds.route_name`; `None` where the host
    /// does not say).
    pub fn policy(&self, route: Option<&str>) -> Policy {
        match route.and_then(|r| self.routes.get(r)) {
            Some(p) => p.clone(),
            None => Policy {
                unread_body: self.unread_body,
                state_unavailable: self.state_unavailable,
                service_class: self.service_class.clone(),
                pool: self.pool.clone(),
            },
        }
    }
}

