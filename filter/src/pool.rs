//! A request's pool: which workers it may reach, from verified sources only. The route's
//! configuration names one (`admission.pool`, per route in `admission.routes`); the
//! sensitivity classifier (`sensitivity`) moves a request whose body holds a secret or
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

use kvroute_core::sensitive::{Findings, Kind};
use serde::Deserialize;

pub const POOL_HEADER: &str = "x-kvroute-pool";

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
