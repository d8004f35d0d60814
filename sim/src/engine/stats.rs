//! Counters and histograms the engine keeps about itself; `/metrics` renders them, so the
//! metrics agree with the engine by construction (and tests compare the two).

use super::request::TokenOut;
use serde::Serialize;

/// vLLM's `TIME_TO_FIRST_TOKEN_BUCKETS`.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's `REQUEST_LATENCY_BUCKETS` (e2e, queue, prefill).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
];

#[derive(Clone, Debug, Serialize)]
pub struct Histogram {
    pub bounds: &'static [f64],
    /// Non-cumulative count per bound; the +Inf bucket is `count - sum(counts)`.
    pub counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram { bounds, counts: vec![0; bounds.len()], sum: 0.0, count: 0 }
    }

    pub fn observe(&mut self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|b| v <= *b) {
            self.counts[i] += 1;
        }
        self.sum += v;
        self.count += 1;
    }
}

/// The scheduler's counters (prefix cache, preemptions, first scheduling) are counted as the
/// engine schedules; the output counters (prompt and generation tokens, TTFT, queue, prefill
/// and e2e times, successes) as the frontend receives outputs ([`EngineStats::record_output`]),
/// where vLLM's output processor counts them: a request aborted by its client counts the
/// tokens delivered before the abort, not those of the step in flight when it came.
#[derive(Clone, Debug, Serialize)]
pub struct EngineStats {
    /// Prompt tokens of requests that produced their first token (vLLM's
    /// `vllm:prompt_tokens`: the whole prompt, cached or not, once per request).
    pub prompt_tokens: u64,
    /// Generated tokens delivered (`vllm:generation_tokens`).
    pub generation_tokens: u64,
    /// Prompt tokens looked up in the prefix cache (vLLM counts per scheduling attempt).
    pub prefix_cache_queries: u64,
    /// Of those, tokens found cached.
    pub prefix_cache_hits: u64,
    pub preemptions: u64,
    /// Requests that finished (stop or length) with their frontend still listening.
    pub requests_finished: u64,
    /// Requests the frontend aborted before it saw them finish: the client disconnected or a
    /// background Responses request was cancelled (vLLM's `AsyncLLM.abort`; vLLM has no
    /// metric for these).
    pub requests_aborted: u64,
    /// Prompt tokens of requests at their first scheduling (not again after preemption).
    pub prompt_tokens_first_scheduled: u64,
    /// Of those, tokens hit in the GPU prefix cache.
    pub cached_tokens_first_scheduled_gpu: u64,
    /// Of those, tokens loaded from the CPU offload tier.
    pub cached_tokens_first_scheduled_cpu: u64,
    /// vLLM's connector lookups (`vllm:external_prefix_cache_queries`): tokens past the GPU
    /// hit, per admission of a request never preempted; 0 without a CPU tier.
    pub external_prefix_cache_queries: u64,
    /// Of those, tokens the CPU tier supplied (`vllm:external_prefix_cache_hits`).
    pub external_prefix_cache_hits: u64,
    pub ttft: Histogram,
    pub e2e: Histogram,
    pub queue_time: Histogram,
    pub prefill_time: Histogram,
}

impl Default for EngineStats {
    fn default() -> Self {
        EngineStats {
            prompt_tokens: 0,
            generation_tokens: 0,
            prefix_cache_queries: 0,
            prefix_cache_hits: 0,
            preemptions: 0,
            requests_finished: 0,
            requests_aborted: 0,
            prompt_tokens_first_scheduled: 0,
            cached_tokens_first_scheduled_gpu: 0,
            cached_tokens_first_scheduled_cpu: 0,
            external_prefix_cache_queries: 0,
            external_prefix_cache_hits: 0,
            ttft: Histogram::new(TTFT_BUCKETS),
            e2e: Histogram::new(LATENCY_BUCKETS),
            queue_time: Histogram::new(LATENCY_BUCKETS),
            prefill_time: Histogram::new(LATENCY_BUCKETS),
        }
    }
}

impl EngineStats {
    /// One output as vLLM's output processor counts it (`IterationStats.update_from_output`,
    /// then `update_from_finished_request`): every token is a generation token; the first
    /// also counts the prompt and the prefill timings; the last the e2e latency and a success.
    pub fn record_output(&mut self, t: &TokenOut) {
        self.generation_tokens += 1;
        if let Some(f) = &t.first {
            self.prompt_tokens += f.prompt_tokens as u64;
            self.ttft.observe(f.ttft_s);
            self.queue_time.observe(f.queue_s);
            self.prefill_time.observe(f.prefill_s);
        }
        if let Some(f) = &t.finished {
            self.e2e.observe(f.e2e_s);
            self.requests_finished += 1;
        }
    }
}
