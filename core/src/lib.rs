//! kvroute-core: everything both halves of kvroute must compute identically.
//!
//! The proxy-wasm filter (wasm32-wasip1) and the state service (native) both link this crate,
//! so block keys, request parsing and the wire messages have exactly one implementation.
//! Nothing here does I/O or reads clocks; every function is deterministic.
//!
//! - [`keys`]: kvroute's own chained block keys over token ids, and text-chunk keys.
//! - [`request`]: OpenAI / Anthropic request bodies -> a [`request::PromptRequest`].
//! - [`sensitive`]: which kinds of secrets and personal data a prompt holds (never what).
//! - [`wire`]: the pick / report protobuf messages (`proto/kvroute.proto`).

// The filter runs this crate inside Envoy's Wasm VM, where a panic traps the VM and fails
// every request on that worker thread: outside tests, no unwrap / expect / panic, and slices
// are read with `get` / iterators rather than `[i]`. (build.rs is a separate crate.)
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing))]

pub mod keys;
pub mod request;
pub mod sensitive;
pub mod targets;
mod wire_json;

/// Generated from `proto/kvroute.proto`: the filter <-> state service contract.
pub mod wire {
    include!(concat!(env!("OUT_DIR"), "/kvroute.v1.rs"));

    impl DegradedReason {
        /// The one spelling of a reason: the filter's `x-kvroute-fallback` / `x-kvroute-decision`
        /// values and the state service's `reason` metric label. `None` is "none".
        pub fn label(self) -> &'static str {
            match self {
                DegradedReason::DegradedNone => "none",
                DegradedReason::DegradedTokenizerUnavailable => "tokenizer_unavailable",
                DegradedReason::DegradedUnknownModel => "unknown_model",
                DegradedReason::DegradedNoHealthyWorker => "no_healthy_worker",
                DegradedReason::DegradedBlockSizeMismatch => "block_size_mismatch",
                DegradedReason::DegradedStateUnavailable => "state_unavailable",
                DegradedReason::DegradedResponseOwnerGone => "response_owner_gone",
                DegradedReason::DegradedResponseNotFound => "response_not_found",
                DegradedReason::DegradedUnreadBody => "unread_body",
                DegradedReason::DegradedTokenizeDeadline => "tokenize_deadline",
                DegradedReason::DegradedTokenizeBusy => "tokenize_busy",
                DegradedReason::DegradedPromptNotTokenizable => "prompt_not_tokenizable",
            }
        }
    }

    impl TokenizationPath {
        /// The one spelling of a path: `x-kvroute-decision`'s `tokenization=` and the state
        /// service's `path` metric label. Unspecified reads as "none".
        pub fn label(self) -> &'static str {
            match self {
                TokenizationPath::TokenizationExactTokenIds => "exact_token_ids",
                TokenizationPath::TokenizationLocal => "local",
                TokenizationPath::TokenizationWorker => "worker",
                TokenizationPath::TokenizationTextChunks => "text_chunks",
                TokenizationPath::TokenizationNone | TokenizationPath::TokenizationUnspecified => "none",
            }
        }
    }

    impl BudgetLimit {
        /// The one spelling of a budget limit: the filter's error messages and the state
        /// service's `outcome` label of `kvroute_tenant_requests_total` (`rejected_<label>`).
        pub fn label(self) -> &'static str {
            match self {
                BudgetLimit::BudgetTokens => "tokens",
                BudgetLimit::BudgetRequests => "requests",
                BudgetLimit::BudgetConcurrency => "concurrency",
                BudgetLimit::BudgetUnavailable => "unavailable",
                BudgetLimit::BudgetQueue => "queue",
                BudgetLimit::BudgetUnspecified => "unspecified",
            }
        }
    }

    impl UpstreamFailure {
        /// The one spelling of an upstream failure: the state service's `reason` label of
        /// `kvroute_worker_suspected_total`. Ok is "ok".
        pub fn label(self) -> &'static str {
            match self {
                UpstreamFailure::UpstreamOk => "ok",
                UpstreamFailure::UpstreamFailedOver => "failed_over",
                UpstreamFailure::UpstreamConnectFailure => "connect_failure",
                UpstreamFailure::UpstreamReset => "reset",
                UpstreamFailure::UpstreamServerError => "server_error",
            }
        }
    }
}

pub use keys::{BlockKey, KeyRoot};
