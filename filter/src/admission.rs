//! Admission apart from routing. Routing fails open: a request kvroute cannot route still
//! reaches a worker by the route's default upstream. Admission does not: whether a request is
//! admitted and what it is charged never depends on kvroute being able to read or route it.
//!
//! - A body the filter cannot read (not a request it understands, or larger than
//!   `max_body_bytes`) is still sent to the state service, which charges it a stated worst
//!   case (`unread_body = "charge"`, the default) and answers like any pick; or it is refused
//!   here with a 4xx in the called API's shape (`"reject"`).
//! - When the state service cannot answer at all (down, slow, overloaded), a request with a
//!   tenant is refused with a 503 and `Retry-After` where `state_unavailable = "reject"`: set
//!   it on every route whose tenants have budgets. `"allow"` (the default) routes it by the
//!   default upstream, uncharged, as an unbudgeted route should be.
//!
//! Both are set for every route, and per route by its Envoy route name (`routes`).

pub use crate::config::admission::{Admission, OnStateUnavailable, OnUnread, Policy};
use crate::decision::{FallbackReason, RequestMeta};
use kvroute_core::request::Api;
use kvroute_core::wire::{PickRequest, UnreadBody};

impl Policy {
    /// Whether a pick that got no answer leaves this request unadmitted: it has a tenant
    /// (budgets are per tenant) and its route refuses then.
    pub fn refuses_unanswered(&self, meta: &RequestMeta) -> bool {
        self.state_unavailable == OnStateUnavailable::Reject && !meta.tenant.is_empty()
    }
}

/// Whether a fallback means the state service gave no answer the request could be admitted by.
pub fn unanswered(reason: FallbackReason) -> bool {
    matches!(
        reason,
        FallbackReason::DispatchFailed
            | FallbackReason::PickUnavailable
            | FallbackReason::PickTimeout
            | FallbackReason::PickOverloaded
            | FallbackReason::PickStatus
            | FallbackReason::PickDecode
    )
}

/// The fallback reason for an unread body.
pub fn fallback_reason(unread: UnreadBody) -> FallbackReason {
    match unread {
        UnreadBody::UnreadTooLarge => FallbackReason::BodyTooLarge,
        UnreadBody::UnreadUnparsable | UnreadBody::UnreadNone => FallbackReason::Unparsable,
    }
}

/// The pick for a body the filter could not read: who sends it, to which API and how big it
/// is. No model: nothing in an unread body is believed, so the state service charges the
/// worst case of any model to the tenant's own budget.
pub fn unread_pick(meta: &RequestMeta, api: Api, unread: UnreadBody, body_bytes: usize) -> PickRequest {
    let mut pick = PickRequest {
        request_id: meta.request_id.clone(),
        endpoint: api.wire() as i32,
        tenant: meta.tenant.clone(),
        assignment_id: meta.assignment_id,
        body_bytes: u32::try_from(body_bytes).unwrap_or(u32::MAX),
        pool: meta.pool.clone(),
        ..PickRequest::default()
    };
    pick.set_unread(unread);
    pick
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_override_the_default_policy() {
        let raw = r#"{"state_unavailable":"reject","service_class":"standard","routes":{"free":{"unread_body":"reject","service_class":"batch"}}}"#;
        let a: Admission = serde_json::from_str(raw).unwrap();
        let standard = "standard".to_string();
        assert_eq!(a.policy(None), Policy { unread_body: OnUnread::Charge, state_unavailable: OnStateUnavailable::Reject, service_class: standard, pool: String::new() });
        assert_eq!(a.policy(Some("other")), a.policy(None));
        let batch = "batch".to_string();
        assert_eq!(a.policy(Some("free")), Policy { unread_body: OnUnread::Reject, state_unavailable: OnStateUnavailable::Allow, service_class: batch, pool: String::new() });
        assert!(serde_json::from_str::<Admission>(r#"{"unread":"charge"}"#).is_err(), "a typo is refused");
    }

    #[test]
    fn only_tenants_on_refusing_routes_are_refused_unanswered() {
        let refuse = Policy { state_unavailable: OnStateUnavailable::Reject, ..Policy::default() };
        let with = RequestMeta { tenant: "t".into(), ..RequestMeta::default() };
        assert!(refuse.refuses_unanswered(&with));
        assert!(!refuse.refuses_unanswered(&RequestMeta::default()), "no tenant: no budget to protect");
        assert!(!Policy::default().refuses_unanswered(&with));
        assert!(unanswered(FallbackReason::PickTimeout) && !unanswered(FallbackReason::UnknownModel));
    }
}
