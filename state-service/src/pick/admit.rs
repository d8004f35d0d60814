//! Stage 4: admission, whether or not the request could be routed. A request with a tenant
//! whose budget applies is charged, before it reaches any worker, what it can cost:
//!
//! - its uncached prompt: on the chosen worker, the prediction when its prompt is keyed
//!   exactly; otherwise the whole prompt at one token per byte (no tokenizer makes more), so
//!   an estimate never lets a tenant past its budget (the completion settles the real cost);
//! - the prompts of a completions batch after the first (`extra_prompt_tokens`);
//! - its output, per sequence the limit the engine obeys for the API (vLLM clamps it to the
//!   model's context left after the prompt; no limit: all of that context, or
//!   `tenancy.default_output_tokens`), for `n` sequences per prompt;
//! - a body the proxy could not read: the largest context of any model (prompt plus output of
//!   one sequence never exceed it).
//!
//! A request that does not fit is answered with a rejection and leaves nothing behind. One
//! that reaches no worker (its stored response is gone or another tenant's: the proxy answers
//! 404) is not charged.

use super::plan::Plan;
use super::Picker;
use crate::tenancy::{Admission, Charge};
use kvroute_core::wire::{DegradedReason, PickRequest, UnreadBody};
use rand::RngCore;

/// What admission reserved, under which assignment id.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Reservation {
    /// The proxy's id (it cancels and reports by it), else one drawn here.
    pub(super) id: u64,
    pub(super) tokens: u64,
}

impl Picker {
    /// What `plan` will cost and what the budget decided.
    pub(super) async fn admit(&self, req: &PickRequest, plan: &Plan) -> (Reservation, Admission) {
        let id = match req.assignment_id {
            0 => self.selector.rng().next_u64() ^ self.fleet.replication().id_salt(),
            id => id,
        };
        let Some(tokens) = self.cost(req, plan) else { return (Reservation { id, tokens: 0 }, Admission::Unlimited) };
        let charge = Charge { tenant: &req.tenant, model: &req.model, id, tokens };
        (Reservation { id, tokens }, self.tenants.admit(&charge).await)
    }

    /// The most `plan` can cost the fleet, in tokens; `None` when it reaches no worker.
    fn cost(&self, req: &PickRequest, plan: &Plan) -> Option<u64> {
        if req.unread() != UnreadBody::UnreadNone {
            return Some(u64::from(self.config.largest_max_model_len()));
        }
        let (prompt, uncached) = match plan {
            Plan::Chosen(chosen) if chosen.prompt.exact => (chosen.prompt.prompt_tokens, chosen.uncached_tokens()),
            // Approximate keys say nothing certain of the cache: all of it may be computed.
            Plan::Chosen(_) => {
                let bound = self.prompt_bound(req, &req.model);
                (bound, bound)
            }
            Plan::Fallback(response) => match response.degraded_reason() {
                DegradedReason::DegradedResponseOwnerGone | DegradedReason::DegradedResponseNotFound => return None,
                _ => {
                    let bound = self.prompt_bound(req, &req.model);
                    (bound, bound)
                }
            },
        };
        Some(u64::from(uncached) + u64::from(req.extra_prompt_tokens) + self.output_tokens(req, prompt))
    }

    /// Output the engine may generate for `req` with a `prompt`-token prompt.
    fn output_tokens(&self, req: &PickRequest, prompt: u32) -> u64 {
        let room = self.config.max_model_len(&req.model).saturating_sub(prompt);
        let per_sequence = match req.max_tokens {
            0 => self.config.default_output_tokens.unwrap_or(room).min(room),
            limit => limit.min(room),
        };
        let sequences = u64::from(req.n.max(1)) * u64::from(req.prompts.max(1));
        u64::from(per_sequence) * sequences
    }

    /// At least the prompt's tokens when it is not keyed exactly: token ids counted, text at
    /// one token per byte, at most the model's context (a longer prompt is refused).
    fn prompt_bound(&self, req: &PickRequest, model: &str) -> u32 {
        let text = (req.prompt_text.len() + req.chat_json.len()).max(req.prompt_bytes as usize);
        let tokens = req.prompt_tokens.max(u32::try_from(text).unwrap_or(u32::MAX));
        tokens.min(self.config.max_model_len(model))
    }
}
