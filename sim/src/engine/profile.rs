//! The step-time model: how long one scheduler step takes on the simulated GPU.
//!
//! `step = overhead + prefill_tokens * per_prefill_token + running_seqs * per_running_seq`,
//! then multiplied by the fault slowdown and the global time scale. A decode-only step of a
//! batch of B costs `overhead + B * per_running_seq`, so inter-token latency grows with the
//! batch; a request's TTFT is its queue wait plus the steps that prefill its uncached tokens.
//! See sim/README.md for how the default numbers were derived.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StepProfile {
    /// Fixed cost of any non-empty step (weight reads, launch overhead), seconds.
    pub overhead_s: f64,
    /// Cost of each prefill (prompt or recomputed) token, seconds.
    pub per_prefill_token_s: f64,
    /// Cost of each sequence in the batch (its KV reads + sampling), seconds.
    pub per_running_seq_s: f64,
    /// KV cache bytes one token occupies (all layers, K and V): what a CPU-offload transfer
    /// moves per token. Not part of the step time; the offload tier prices its copies with it.
    #[serde(default = "default_kv_bytes_per_token")]
    pub kv_bytes_per_token: u64,
}

/// 160 KiB: the profile's ~160 KB/token of FP8 KV (e.g. 80 layers x 8 KV heads x 128 dims
/// x 2 (K, V) x 1 byte), the figure the default cache size is derived from.
pub const DEFAULT_KV_BYTES_PER_TOKEN: u64 = 163_840;

fn default_kv_bytes_per_token() -> u64 {
    DEFAULT_KV_BYTES_PER_TOKEN
}

impl Default for StepProfile {
    /// One L40S (48 GB, 864 GB/s, ~362 dense FP8 TFLOPS) serving a ~27B FP8 model.
    fn default() -> Self {
        StepProfile {
            overhead_s: 0.036,
            per_prefill_token_s: 0.000_30,
            per_running_seq_s: 0.000_6,
            kv_bytes_per_token: DEFAULT_KV_BYTES_PER_TOKEN,
        }
    }
}

impl StepProfile {
    /// Unscaled duration of a step with `prefill_tokens` prompt tokens and `seqs` sequences.
    pub fn step_seconds(&self, prefill_tokens: usize, seqs: usize) -> f64 {
        if prefill_tokens == 0 && seqs == 0 {
            return 0.0;
        }
        self.overhead_s + prefill_tokens as f64 * self.per_prefill_token_s + seqs as f64 * self.per_running_seq_s
    }
}
