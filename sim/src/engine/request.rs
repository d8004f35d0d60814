//! Request state inside the engine, and what the engine reports back per step.

use super::offload::{LoadState, ReqOffload};
use crate::ids::{BlockDigest, BlockId, RequestId};
use serde::Serialize;

/// What the HTTP layer submits.
#[derive(Clone, Debug)]
pub struct NewRequest {
    pub id: RequestId,
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub ignore_eos: bool,
    pub cache_salt: Option<String>,
    /// The token ids to "sample", in order (see `answer.rs`); past its end the engine makes
    /// up filler ids.
    pub output: Vec<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    Stop,
    Length,
    Abort,
}

/// Sent once, with the last token of a request.
#[derive(Clone, Debug, PartialEq)]
pub struct Finished {
    pub reason: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
    /// Engine-clock seconds from arrival.
    pub ttft_s: f64,
    pub e2e_s: f64,
}

/// What a request's first token tells the frontend's statistics (vLLM's output processor
/// counts the prompt and the prefill timings on the request's first output).
#[derive(Clone, Debug, PartialEq)]
pub struct FirstToken {
    pub prompt_tokens: usize,
    /// Engine-clock seconds from arrival to this token.
    pub ttft_s: f64,
    /// From arrival to first scheduling.
    pub queue_s: f64,
    /// From first scheduling to this token.
    pub prefill_s: f64,
}

/// One generated token, delivered at the end of the step that produced it.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenOut {
    pub request: RequestId,
    pub token: u32,
    /// Prompt tokens served from the prefix cache (known once the first token is out).
    pub cached_tokens: usize,
    /// Set on the request's first token.
    pub first: Option<FirstToken>,
    pub finished: Option<Finished>,
}

#[derive(Debug)]
pub(crate) struct Request {
    pub id: RequestId,
    /// Prompt followed by generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    pub max_tokens: usize,
    /// Output length at which the simulated model emits EOS (None with ignore_eos).
    pub eos_at: Option<usize>,
    pub cache_salt: Option<String>,
    /// Planned output ids (`NewRequest::output`).
    pub output: Vec<u32>,
    pub hashes: Vec<BlockDigest>,
    pub blocks: Vec<BlockId>,
    pub num_computed: usize,
    /// Blocks of this request already registered in the prefix cache.
    pub num_cached_blocks: usize,
    /// Prompt tokens served from a cache (GPU hits + CPU loads) at first scheduling.
    pub cached_tokens: Option<usize>,
    pub num_preemptions: u32,
    /// CPU offload tier: this request's access state and store progress.
    pub offload: ReqOffload,
    /// Set while the request waits holding blocks for a CPU load (vLLM's
    /// `WAITING_FOR_REMOTE_KVS`, then `WAITING` in `kv_holding_waiting`).
    pub load: Option<LoadState>,
    pub arrival: f64,
    pub first_scheduled: Option<f64>,
    pub first_token: Option<f64>,
}

impl Request {
    pub fn output_len(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    pub fn finish_reason(&self) -> Option<FinishReason> {
        let out = self.output_len();
        if out >= self.max_tokens {
            Some(FinishReason::Length)
        } else if self.eos_at.is_some_and(|e| out >= e) {
            Some(FinishReason::Stop)
        } else {
            None
        }
    }
}

/// Output token `index`: the planned one, else a per-request filler id.
pub(crate) fn next_token(r: &Request) -> u32 {
    let index = r.output_len();
    r.output.get(index).copied().unwrap_or_else(|| filler_token(r.id, index))
}

/// A per-request filler token: deterministic, in a range every real vocabulary has.
pub(crate) fn filler_token(id: RequestId, index: usize) -> u32 {
    1000 + ((id.0 as u32).wrapping_mul(7919).wrapping_add(index as u32 * 31) % 20000)
}
