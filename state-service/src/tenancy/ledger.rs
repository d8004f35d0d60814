//! The ledger: where a tenant's admitted requests are counted against its limits.
//!
//! One admission scope (a tenant, or a tenant × model when that budget is configured) keeps,
//! over a sliding window (60 s by default), every request it admitted with the tokens it was
//! charged, and the requests still running. A reservation is admitted only when, with it, the
//! window's tokens and requests and the running requests all stay within the limits; so over
//! any window the scope is never charged more than its budget (a sliding log, exact, unlike a
//! token bucket that lets a full bucket through on top of a minute's refill). Settling a
//! reservation replaces its charge with what the request really cost and ends its lease on a
//! concurrency slot.
//!
//! Two ledgers implement this contract: [`super::window::MemoryLedger`] (one replica: the
//! memory store, and the local fallback when Redis is away) and the Redis store's
//! (`store/redis/ledger.rs`: one Lua script per call, atomic on the shard that owns the
//! tenant, so every replica shares one budget). Both are tested against the same cases.

use serde::{Deserialize, Serialize};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// Limits of one scope over the window; `None` is unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Tokens charged per window: predicted uncached prompt tokens plus the output
    /// reservation at admission, settled to the response's usage.
    pub tokens_per_minute: Option<u64>,
    pub requests_per_minute: Option<u64>,
    pub concurrent_requests: Option<u64>,
}

impl Limits {
    pub fn is_unlimited(&self) -> bool {
        self.tokens_per_minute.is_none() && self.requests_per_minute.is_none() && self.concurrent_requests.is_none()
    }

    /// This replica's share when replicas cannot coordinate: every limit divided by
    /// `replicas` (rounded down, at least 1).
    pub fn share(&self, replicas: u64) -> Limits {
        let r = replicas.max(1);
        let f = |v: Option<u64>| v.map(|v| (v / r).max(1));
        Limits {
            tokens_per_minute: f(self.tokens_per_minute),
            requests_per_minute: f(self.requests_per_minute),
            concurrent_requests: f(self.concurrent_requests),
        }
    }
}

/// What a budget applies to: a tenant, or one model of a tenant.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope {
    pub tenant: Arc<str>,
    pub model: Option<Arc<str>>,
}

impl Scope {
    /// A stable string for store keys and logs: `tenant`, or `tenant` + U+001F + `model`
    /// (tenants and models are printable, so the two can never collide).
    pub fn key(&self) -> String {
        match &self.model {
            None => self.tenant.to_string(),
            Some(m) => format!("{}\u{1f}{m}", self.tenant),
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.model {
            None => write!(f, "{}", self.tenant),
            Some(m) => write!(f, "{} ({m})", self.tenant),
        }
    }
}

/// The limit that stopped a reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Limit {
    Tokens,
    Requests,
    Concurrency,
}

impl Limit {
    pub fn label(self) -> &'static str {
        match self {
            Limit::Tokens => "tokens",
            Limit::Requests => "requests",
            Limit::Concurrency => "concurrency",
        }
    }

    /// The ledger's wire code (the Redis script returns it).
    pub fn from_code(code: i64) -> Option<Limit> {
        match code {
            1 => Some(Limit::Tokens),
            2 => Some(Limit::Requests),
            3 => Some(Limit::Concurrency),
            _ => None,
        }
    }

    pub fn code(self) -> i64 {
        match self {
            Limit::Tokens => 1,
            Limit::Requests => 2,
            Limit::Concurrency => 3,
        }
    }
}

/// One admission request.
#[derive(Clone, Debug)]
pub struct Reserve {
    pub scope: Scope,
    /// The assignment id: what the settle names.
    pub id: u64,
    pub tokens: u64,
    pub limits: Limits,
    pub window_ms: u64,
    /// How long a concurrency slot is held without a settle (a lost report never leaks one).
    pub lease_ms: u64,
}

/// What the scope holds over the current window (after the reservation, when admitted).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub tokens: u64,
    pub requests: u64,
    pub concurrent: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Admitted(Usage),
    /// Not admitted: retry no sooner than `retry_after_ms` (for tokens and requests: when
    /// enough of the window has aged out for this request to fit; a request larger than the
    /// whole token limit gets the window).
    Rejected { limit: Limit, retry_after_ms: u64, usage: Usage },
}

/// What a finished (or cancelled) request really cost.
#[derive(Clone, Debug)]
pub struct Settle {
    pub scope: Scope,
    pub id: u64,
    /// What the request really cost.
    pub tokens: u64,
    /// What its reservation charged. When the reservation has already left the window, the
    /// tokens beyond it are charged now, in the window they happened in: a settlement never
    /// disappears because its window moved on.
    pub reserved: u64,
    pub window_ms: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("budget ledger unavailable: {0}")]
pub struct LedgerError(pub String);

pub type LedgerFuture<T> = Pin<Box<dyn Future<Output = Result<T, LedgerError>> + Send>>;

pub trait Ledger: Send + Sync + 'static {
    /// Admits `r` (recording its charge and a concurrency lease) or says which limit stops it.
    /// A runtime override of the scope's limits ([`Ledger::set_limits`]) replaces `r.limits`.
    fn reserve(&self, r: Reserve) -> LedgerFuture<Outcome>;
    /// Replaces the charge of reservation `s.id` with `s.tokens` (when it is still in the
    /// window) and ends its concurrency lease. Unknown ids are ignored.
    fn settle(&self, s: Settle) -> LedgerFuture<()>;
    /// What `scope` holds over the current window.
    fn usage(&self, scope: Scope, window_ms: u64) -> LedgerFuture<Usage>;
    /// Overrides the scope's configured limits (`None`: back to the configuration), for every
    /// replica that shares this ledger.
    fn set_limits(&self, scope: Scope, limits: Option<Limits>) -> LedgerFuture<()>;
    /// The scope's runtime override, if any.
    fn limits_override(&self, scope: Scope) -> LedgerFuture<Option<Limits>>;
    /// Every scope with a runtime override.
    fn overrides(&self) -> LedgerFuture<Vec<(Scope, Limits)>>;
}
