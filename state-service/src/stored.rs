//! Where each stored Responses API response lives.
//!
//! vLLM keeps a stored response (`store: true`) in the memory of the one server that produced
//! it: a follow-up naming it (`previous_response_id`), a `GET /v1/responses/{id}` or a cancel
//! served by any other worker answers 404. kvroute learns the owner from the proxy's reports
//! (the response id in the body's first bytes or the stream's `response.created`) and routes
//! those requests to it. The map is bounded (oldest first out) and entries expire; with the
//! Redis store every entry is also written there with the same TTL, and a replica that does not
//! know an id asks Redis before answering "unknown", so the follow-up may go through any
//! replica, also one restarted since.

use kvroute_kv::types::WorkerId;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::time::Duration;
use tokio::time::Instant;

/// `[responses]`: the response-owner map.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ResponsesConfig {
    /// Most response ids remembered on a replica (the oldest is forgotten past it).
    pub max_entries: usize,
    /// How long an owner is remembered after its response (here and in Redis).
    pub ttl_ms: u64,
    /// How long a pick or locate waits for Redis on an id this replica does not know.
    pub store_timeout_ms: u64,
    /// How long a pick or locate naming an id nobody knows yet waits for it to be learned:
    /// a client may send its follow-up the moment the response's last byte reached it, before
    /// the proxy's next report batch told where it was stored. Keep it below the filter's
    /// `affinity_timeout_ms`; an id still unknown then is routed as usual (vLLM's 404).
    pub unknown_wait_ms: u64,
}

impl Default for ResponsesConfig {
    fn default() -> Self {
        ResponsesConfig { max_entries: 200_000, ttl_ms: 6 * 3_600_000, store_timeout_ms: 20, unknown_wait_ms: 250 }
    }
}

/// The worker that stored a response, how long its conversation is (prompt + output tokens:
/// the prefix a follow-up finds cached there), and the tenant it belongs to: only that tenant
/// reaches it (another one is answered as if it did not exist).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub worker: WorkerId,
    pub tokens: u32,
    /// The verified tenant of the request that stored it (empty: a request without one).
    pub tenant: String,
}

impl Owner {
    /// `worker` U+001F `tokens` U+001F `tenant`: the value stored in Redis.
    pub fn encode(&self) -> String {
        format!("{}\u{1f}{}\u{1f}{}", self.worker, self.tokens, self.tenant)
    }

    /// A stored value; one from before tenants were kept (two fields) belongs to nobody's
    /// tenant, so only a request without one reaches it.
    pub fn decode(s: &str) -> Option<Owner> {
        let mut parts = s.splitn(3, '\u{1f}');
        let (worker, tokens) = (parts.next()?, parts.next()?);
        let tenant = parts.next().unwrap_or_default();
        Some(Owner { worker: WorkerId::new(worker), tokens: tokens.parse().ok()?, tenant: tenant.to_string() })
    }

    /// Whether a request of `tenant` may reach this response.
    pub fn visible_to(&self, tenant: &str) -> bool {
        self.tenant == tenant
    }
}

/// Longest response id accepted (vLLM's are `resp_` + 32 hex).
pub const MAX_ID_LEN: usize = 128;

/// Whether `id` can be a response id: printable ASCII, no spaces or quotes.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_ID_LEN && id.bytes().all(|b| b.is_ascii_graphic() && b != b'"')
}

struct Entry {
    owner: Owner,
    expires: Instant,
}

/// This replica's owner map.
pub struct Owners {
    config: ResponsesConfig,
    inner: Mutex<Inner>,
    /// Woken whenever an owner is learned (picks waiting for an id see it at once).
    learned: tokio::sync::Notify,
}

#[derive(Default)]
struct Inner {
    map: HashMap<String, Entry>,
    /// Ids in insertion order (an id re-learned keeps its place; expiry is by TTL anyway).
    order: VecDeque<String>,
}

impl Owners {
    pub fn new(config: ResponsesConfig) -> Owners {
        Owners { config, inner: Mutex::new(Inner::default()), learned: tokio::sync::Notify::new() }
    }

    pub fn config(&self) -> &ResponsesConfig {
        &self.config
    }

    /// Resolves at the next [`Owners::learn`] (register before checking, so none is missed).
    pub fn learned(&self) -> tokio::sync::futures::Notified<'_> {
        self.learned.notified()
    }

    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.config.ttl_ms)
    }

    /// Remembers (or updates) `id`'s owner.
    pub fn learn(&self, id: &str, owner: Owner, now: Instant) {
        {
            let mut inner = self.inner.lock();
            let expires = now + self.ttl();
            if let Some(e) = inner.map.get_mut(id) {
                *e = Entry { owner, expires };
            } else {
                inner.map.insert(id.to_string(), Entry { owner, expires });
                inner.order.push_back(id.to_string());
                while inner.map.len() > self.config.max_entries.max(1) {
                    let Some(oldest) = inner.order.pop_front() else { break };
                    inner.map.remove(&oldest);
                }
            }
        }
        self.learned.notify_waiters();
    }

    /// The owner of `id` if known and not expired.
    pub fn get(&self, id: &str, now: Instant) -> Option<Owner> {
        let mut inner = self.inner.lock();
        // Expired entries at the front go first (bounded work: they were inserted first).
        while let Some(front) = inner.order.front() {
            match inner.map.get(front) {
                Some(e) if e.expires > now => break,
                _ => {
                    if let Some(old) = inner.order.pop_front() {
                        if inner.map.get(&old).is_some_and(|e| e.expires <= now) {
                            inner.map.remove(&old);
                        }
                    }
                }
            }
        }
        inner.map.get(id).filter(|e| e.expires > now).map(|e| e.owner.clone())
    }

    pub fn len(&self) -> usize {
        self.inner.lock().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(w: &str, tokens: u32) -> Owner {
        Owner { worker: WorkerId::new(w), tokens, tenant: "team".into() }
    }

    #[tokio::test(start_paused = true)]
    async fn owners_are_bounded_and_expire() {
        let owners = Owners::new(ResponsesConfig { max_entries: 2, ttl_ms: 1_000, ..ResponsesConfig::default() });
        let now = Instant::now();
        owners.learn("resp_a", owner("w0", 10), now);
        owners.learn("resp_b", owner("w1", 20), now);
        owners.learn("resp_a", owner("w0", 30), now);
        assert_eq!(owners.get("resp_a", now), Some(owner("w0", 30)), "re-learned: updated");
        owners.learn("resp_c", owner("w2", 5), now);
        assert_eq!((owners.get("resp_a", now), owners.len()), (None, 2), "the oldest went first");
        assert_eq!(owners.get("resp_c", now + Duration::from_millis(999)), Some(owner("w2", 5)));
        assert_eq!(owners.get("resp_c", now + Duration::from_millis(1_000)), None, "expired");
        assert!(owners.is_empty());
    }

    #[test]
    fn owners_round_trip_and_ids_are_checked() {
        assert_eq!(Owner::decode(&owner("w 1", 7).encode()), Some(owner("w 1", 7)));
        assert_eq!(Owner::decode("junk"), None);
        let old = Owner::decode("w\u{1f}5").expect("a value from before tenants");
        assert!(old.visible_to("") && !old.visible_to("team"), "nobody's tenant");
        assert!(owner("w", 1).visible_to("team") && !owner("w", 1).visible_to("other"));
        assert!(valid_id("resp_0123abcd") && !valid_id("") && !valid_id("a b") && !valid_id("a\"b") && !valid_id(&"x".repeat(129)));
    }
}
