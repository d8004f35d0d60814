//! Assignments: the picks we made and have not heard the end of.
//!
//! A pick creates an [`Assignment`]; the proxy's reports move it along: FIRST_TOKEN records
//! the actual TTFT (for calibration and the predicted-vs-actual metric), COMPLETE and CANCEL
//! free it. Reports get lost (proxy restarts, aborted streams), so a TTL frees what nobody
//! reported: a shorter one while the first token is outstanding, a longer one after.
//!
//! Per-worker totals (in flight, waiting for a first token, their uncached tokens) are kept
//! incrementally: every pick reads them, so they must not cost a scan.
//!
//! [`speculative`] holds the short-lived credit a pick gives its worker for the request's keys.

pub mod speculative;
mod table;

pub use speculative::Speculative;
pub use table::{Assignments, Expired, Insert, Pending};

use kvroute_score::{Features, Policy};
use kvroute_kv::types::WorkerId;
use std::fmt;
use tokio::time::Instant;

/// Names one pick in later reports. Never 0.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct AssignmentId(pub u64);

impl fmt::Display for AssignmentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Assignment {
    pub id: AssignmentId,
    pub worker: WorkerId,
    pub policy: Policy,
    pub prompt_tokens: u32,
    pub uncached_tokens: u32,
    pub predicted_ttft_ms: f64,
    /// Model inputs at pick time, for calibration.
    pub features: Features,
    pub created_at: Instant,
    /// When the first-token report arrived.
    pub first_token_at: Option<Instant>,
    /// Prompt tokens the pick expects the engine to serve from cache (exact keys only: vLLM
    /// never counts a prompt's last token as cached, so at most the full blocks before it).
    /// `None` for approximate picks and for assignments replicated from another replica.
    pub predicted_cached_tokens: Option<u32>,
    /// The tenant budget the pick reserved under; the completion settles it.
    pub budget: Option<crate::tenancy::Scope>,
    /// Tokens admission reserved (0 without a budget): what a request abandoned after it was
    /// forwarded is charged when its real cost cannot be known.
    pub reserved: u64,
    /// Responses API `background`: the creation answers at once and the work goes on, so the
    /// charge is settled from the stored response when it ends.
    pub background: bool,
}

impl Assignment {
    /// The prompt's tokens the pick expected from cache.
    pub fn cached_tokens(&self) -> u32 {
        self.prompt_tokens.saturating_sub(self.uncached_tokens)
    }

    /// When the pick predicted its first token (a prediction that is not a finite duration
    /// counts as none: due at once).
    pub fn first_token_due(&self) -> Instant {
        let ttft = std::time::Duration::try_from_secs_f64(self.predicted_ttft_ms / 1000.0).unwrap_or_default();
        self.created_at + ttft
    }

    /// The part of the predicted first token that is the pick's own prefill (the rest is the
    /// queue ahead of it): its share of the prompt tokens the prediction has prefilled first.
    pub fn own_prefill(&self) -> std::time::Duration {
        let share = if self.features.tokens > 0.0 { (f64::from(self.uncached_tokens) / self.features.tokens).min(1.0) } else { 1.0 };
        std::time::Duration::try_from_secs_f64(self.predicted_ttft_ms * share / 1000.0).unwrap_or_default()
    }
}

/// What a report did.
#[derive(Clone, Debug, PartialEq)]
pub enum ReportOutcome {
    /// First token of a live assignment: the caller calibrates with it.
    FirstToken(Assignment),
    /// A repeated first-token report: ignored.
    Duplicate,
    Freed(Assignment),
    /// No such assignment (already freed, expired, or never ours).
    Unknown,
}
