//! Label sets. Every label with a fixed set of values is an enum, so a typo cannot create a
//! new series.

use kvroute_score::Policy;
use kvroute_core::wire::{DegradedReason, TokenizationPath, UpstreamFailure};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use std::fmt::Write;

macro_rules! label_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vdoc])* $variant),+ }

        impl $name {
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }

        impl EncodeLabelValue for $name {
            fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
                encoder.write_str(self.as_str())
            }
        }
    };
}

/// The `reason` label: the contract's enum, spelled once by [`DegradedReason::label`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Reason(pub DegradedReason);

impl EncodeLabelValue for Reason {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.0.label())
    }
}

/// The `path` label: the contract's enum, spelled once by [`TokenizationPath::label`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Path(pub TokenizationPath);

impl EncodeLabelValue for Path {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.0.label())
    }
}

/// The `reason` label of upstream failures: the contract's enum, spelled once by
/// [`UpstreamFailure::label`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Failure(pub UpstreamFailure);

impl EncodeLabelValue for Failure {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.0.label())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct FailureLabels {
    pub reason: Failure,
}

label_enum!(
    /// Why a tokenization path gave no token ids (the pick then tried the next path).
    TokenizeFailure {
        /// No tokenizer for the model (not configured, or its files failed to load).
        Unavailable => "unavailable",
        /// The model's tokenizer is still loading (picks never wait for it).
        Loading => "loading",
        /// The prompt has images/audio: vLLM's placeholder tokens are not reproduced.
        Media => "media",
        /// The prompt JSON was not a chat the template accepts.
        Input => "input",
        /// The chat template failed or the feature is unsupported.
        Template => "template",
        Encode => "encode",
        /// No healthy worker with an HTTP endpoint to ask.
        NoEndpoint => "no_endpoint",
        /// A recent worker call failed; the worker path is skipped for a while.
        Backoff => "backoff",
        Timeout => "timeout",
        Connect => "connect",
        /// The worker answered a non-2xx status.
        Status => "status",
        /// The worker's answer had no `tokens` array.
        Body => "body",
        /// Nothing of a chat prompt fit the encoding budget before its first exact cut. (A
        /// prompt keyed exactly in part is not a failure: routing needs keys only as far as
        /// some worker holds them, the rest is estimated.)
        Truncated => "truncated",
        /// A text prompt longer than `tokenization.max_encode_bytes` with no exact cut within
        /// it (see `Truncated`): not encoded at all.
        TooLong => "too_long",
        /// The local encoding did not finish within `tokenization.deadline_ms`.
        Deadline => "deadline",
        /// `tokenization.max_concurrent` encodings were running already.
        Busy => "busy",
    }
);

label_enum!(
    PickOutcome {
        /// A worker was chosen with full information.
        Routed => "routed",
        /// A worker was chosen, but degraded.
        Degraded => "degraded",
        /// No worker chosen: the proxy falls back.
        Fallback => "fallback",
        /// The tenant's budget did not admit it: the proxy answers 429.
        Rejected => "rejected",
    }
);

label_enum!(
    ReportKindLabel {
        FirstToken => "first_token",
        Complete => "complete",
        Cancel => "cancel",
        Unspecified => "unspecified",
    }
);

label_enum!(
    ReportOutcomeLabel {
        Applied => "applied",
        Duplicate => "duplicate",
        /// The assignment was unknown (already freed, expired, or not ours).
        Unknown => "unknown",
        Invalid => "invalid",
    }
);

label_enum!(
    ExpiryKind {
        /// No first-token report within the first-token TTL.
        FirstToken => "first_token",
        /// No complete/cancel report within the assignment TTL.
        Complete => "complete",
    }
);

/// The `policy` label, spelled by [`Policy::as_str`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PolicyLabel(pub Policy);

impl EncodeLabelValue for PolicyLabel {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.0.as_str())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct PickLabels {
    pub policy: PolicyLabel,
    pub outcome: PickOutcome,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: Reason,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ReportLabels {
    pub kind: ReportKindLabel,
    pub outcome: ReportOutcomeLabel,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ExpiryLabels {
    pub ttl: ExpiryKind,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct TokenizationLabels {
    pub path: Path,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct TokenizeFailureLabels {
    pub path: Path,
    pub reason: TokenizeFailure,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct TenantLabels {
    pub tenant: String,
    pub outcome: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct TenantTokenLabels {
    pub tenant: String,
    pub kind: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct AffinityLabels {
    pub path: String,
    pub outcome: String,
}
