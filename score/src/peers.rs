//! The routers users would deploy instead of kvroute, as faithful to their published source
//! and defaults as kvroute's inputs allow, so one benchmark run compares them on one stack.
//! Each is a pure function of the candidates' [`PeerView`]s (and an rng for random ties).
//!
//! Where kvroute's inputs differ from the peer's, the difference is the granularity of
//! prefix matching: the peers match characters (SGLang) or 64-character blocks (llm-d) of the
//! request text; here they match kvroute's chained keys of the same request: 16-token blocks
//! for token-id prompts (64 characters is llm-d's own block for vLLM's block size 16) and
//! 256-byte text chunks for text and chat prompts. Match rates are key counts over the
//! prompt's keys.

use rand::Rng;

/// SGLang `cache_aware` (sgl-project/sglang `sgl-router/src/policies/cache_aware.rs`,
/// sglang-router 0.3.2 on PyPI) with the defaults its launcher sets
/// (`py_src/sglang_router/router_args.py`; the Rust `CacheAwareConfig::default()` differs and
/// is not what users get).
pub mod sglang {
    pub const CACHE_THRESHOLD: f64 = 0.3;
    pub const BALANCE_ABS_THRESHOLD: u32 = 64;
    pub const BALANCE_REL_THRESHOLD: f64 = 1.5;
    /// `max_tree_size`: characters per worker (2^26), here in 256-byte chunks.
    pub const MAX_TREE_CHUNKS: usize = (1 << 26) / 256;
}

/// llm-d's default scheduling profile (llm-d `guides/inference-scheduling`, scheduler
/// v0.5.0 on gateway-api-inference-extension v1.3.0: `queue-scorer` x2,
/// `kv-cache-utilization-scorer` x2, `prefix-cache-scorer` x3, `max-score-picker`).
pub mod llmd {
    pub const QUEUE_WEIGHT: f64 = 2.0;
    pub const KV_UTILIZATION_WEIGHT: f64 = 2.0;
    pub const PREFIX_WEIGHT: f64 = 3.0;
    /// `maxPrefixBlocksToMatch`, in llm-d's 64-character blocks: the prompt is cut to these
    /// before hashing (one 16-token key is one such block; a 256-byte text chunk is four).
    pub const MAX_PREFIX_BLOCKS: u32 = 256;
    /// `lruCapacityPerServer`: blocks each pod's index keeps (in 16-token keys; text-chunk
    /// keys stand for four blocks each, so that many keys remember four times the text).
    pub const LRU_CAPACITY_PER_SERVER: usize = 31_250;
    /// llm-d blocks one kvroute key stands for.
    pub fn blocks_per_key(exact: bool) -> u32 {
        if exact {
            1
        } else {
            4
        }
    }

    /// The leading keys llm-d hashes of a prompt of `keys` keys.
    pub fn keys_matched(keys: usize, exact: bool) -> usize {
        keys.min((MAX_PREFIX_BLOCKS / blocks_per_key(exact)) as usize)
    }
}

/// NVIDIA Dynamo's KV router (ai-dynamo/dynamo `lib/llm/src/kv_router/scheduler.rs` and
/// `sequence.rs`, dynamo-llm 0.7.0; `dynamo-kv-router` 1.6.1 computes the same with its
/// defaults when hits are on the GPU, and credits host-memory hits at 0.75).
pub mod dynamo {
    pub const OVERLAP_SCORE_WEIGHT: f64 = 1.0;
    /// 1.6.1's `overlap_score_credit` for blocks in host memory (the CPU tier).
    pub const HOST_CREDIT: f64 = 0.75;
}

/// What a peer policy reads of one candidate worker.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PeerView {
    /// Requests the router itself has in flight there (SGLang's load counter).
    pub router_load: u32,
    /// Scraped `vllm:num_requests_waiting` (llm-d's queue scorer).
    pub queue: u32,
    /// Scraped `vllm:kv_cache_usage_perc`, 0..1.
    pub kv_usage: f64,
    /// Leading prompt keys in this worker's learned set, and keys it holds within the run
    /// some worker holds (see [`super::prefix_sets::SetMatch`]).
    pub learned_leading: u32,
    pub learned_in_run: u32,
    /// Precise overlap from the KV index: leading blocks on the GPU, and beyond them in the
    /// CPU tier.
    pub gpu_blocks: u32,
    pub host_blocks: u32,
    /// Uncached prompt tokens of its requests without a first token yet (Dynamo's
    /// in-flight prefill), and the blocks its in-flight requests hold (Dynamo's unique active
    /// blocks; estimated from our assignments as their uncached blocks plus the largest cached
    /// prefix among them, counted once).
    pub prefill_tokens_in_flight: u64,
    pub active_blocks: u64,
    /// Of the active blocks, the shared cached prefix (the largest cached part among the
    /// in-flight requests): the request's overlap is among the active blocks only up to this.
    pub active_prefix_blocks: u64,
}

/// The request as the peers see it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Request {
    pub keys: u32,
    pub tokens: u32,
    pub block_size: u32,
}

/// SGLang: if the router's own loads are imbalanced (`max - min > 64 && max > 1.5 * min`),
/// the least loaded worker; else the best-matching worker when its match rate is above 0.3,
/// else the least loaded (0.3.2's low-match branch; 0.2.1-0.2.3 took the smallest tree).
/// Least-load ties go to the first worker (`min_by_key`); best-match ties, arbitrary in SGLang
/// (hash-map order), go to the first too.
pub fn sglang(c: &[PeerView], req: &Request) -> usize {
    let loads = c.iter().map(|v| v.router_load);
    let (max, min) = (loads.clone().max().unwrap_or(0), loads.min().unwrap_or(0));
    let imbalanced = max.saturating_sub(min) > sglang::BALANCE_ABS_THRESHOLD && f64::from(max) > f64::from(min) * sglang::BALANCE_REL_THRESHOLD;
    let least_loaded = || first_min_by(c, |v| f64::from(v.router_load));
    if imbalanced || req.keys == 0 {
        return least_loaded();
    }
    let best = first_min_by(c, |v| -f64::from(v.learned_leading));
    let rate = c.get(best).map_or(0.0, |v| f64::from(v.learned_leading) / f64::from(req.keys));
    if rate > sglang::CACHE_THRESHOLD {
        best
    } else {
        least_loaded()
    }
}

/// llm-d: `2 * queue + 2 * kv_utilization + 3 * prefix`, highest wins, ties at random. Queue:
/// `(max - q) / (max - min)`, 1 when all are equal; KV: `1 - usage`; prefix: matched blocks
/// (within the first 256) over the prompt's blocks.
pub fn llmd<R: Rng + ?Sized>(c: &[PeerView], req: &Request, rng: &mut R) -> usize {
    let (qmax, qmin) = (c.iter().map(|v| v.queue).max().unwrap_or(0), c.iter().map(|v| v.queue).min().unwrap_or(0));
    // Keys beyond the cut were never hashed (pick.rs matches and learns only the leading ones).
    let blocks = req.keys.min(llmd::MAX_PREFIX_BLOCKS);
    let score = |v: &PeerView| {
        let queue = if qmax == qmin { 1.0 } else { f64::from(qmax - v.queue) / f64::from(qmax - qmin) };
        let kv = (1.0 - v.kv_usage).clamp(0.0, 1.0);
        let prefix = if blocks == 0 { 0.0 } else { f64::from(v.learned_in_run.min(blocks)) / f64::from(blocks) };
        llmd::QUEUE_WEIGHT * queue + llmd::KV_UTILIZATION_WEIGHT * kv + llmd::PREFIX_WEIGHT * prefix
    };
    random_min_by(c, |v| -score(v), rng)
}

/// Dynamo: `logit = 1.0 * prefill_blocks + decode_blocks`, lowest wins (temperature 0), ties at
/// random. `prefill_blocks` = (the request's tokens not covered by its credited overlap + the
/// worker's in-flight prefill tokens) / block size; `decode_blocks` = the worker's active
/// blocks + the request's blocks not among them.
pub fn dynamo<R: Rng + ?Sized>(c: &[PeerView], req: &Request, rng: &mut R) -> usize {
    let bs = f64::from(req.block_size.max(1));
    let logit = |v: &PeerView| {
        let credited = f64::from(v.gpu_blocks) + dynamo::HOST_CREDIT * f64::from(v.host_blocks);
        let new_tokens = (f64::from(req.tokens) - credited * bs).max(0.0);
        let prefill = (new_tokens + v.prefill_tokens_in_flight as f64) / bs;
        // New blocks: the request's blocks not among the worker's active ones (its overlap
        // counts as active only as far as the active requests hold that prefix).
        let overlap = u64::from(v.gpu_blocks + v.host_blocks).min(v.active_prefix_blocks);
        let decode = v.active_blocks as f64 + (u64::from(req.keys).saturating_sub(overlap)) as f64;
        dynamo::OVERLAP_SCORE_WEIGHT * prefill + decode
    };
    random_min_by(c, logit, rng)
}

fn first_min_by(c: &[PeerView], f: impl Fn(&PeerView) -> f64) -> usize {
    let mut best = (0, f64::INFINITY);
    for (i, v) in c.iter().enumerate() {
        let s = f(v);
        if s < best.1 {
            best = (i, s);
        }
    }
    best.0
}

fn random_min_by<R: Rng + ?Sized>(c: &[PeerView], f: impl Fn(&PeerView) -> f64, rng: &mut R) -> usize {
    let scores: Vec<f64> = c.iter().map(f).collect();
    let best = scores.iter().copied().fold(f64::INFINITY, f64::min);
    let tied: Vec<usize> = scores.iter().enumerate().filter(|(_, s)| (**s - best).abs() <= 1e-9).map(|(i, _)| i).collect();
    match tied.len() {
        0 => 0,
        n => tied.get(rng.gen_range(0..n)).copied().unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, SeedableRng};
    use std::collections::BTreeSet;

    fn v(router_load: u32, learned_leading: u32) -> PeerView {
        PeerView { router_load, learned_leading, learned_in_run: learned_leading, ..PeerView::default() }
    }

    const REQ: Request = Request { keys: 10, tokens: 160, block_size: 16 };

    #[test]
    fn sglang_follows_the_tree_above_its_threshold_and_balances_past_its_imbalance_rule() {
        // Worker 1 matched 8 of 10 keys (0.8 > 0.3): it wins though it is busier.
        assert_eq!(sglang(&[v(10, 0), v(40, 8), v(12, 0)], &REQ), 1);
        // 3 of 10 is not above 0.3: least loaded.
        assert_eq!(sglang(&[v(10, 0), v(40, 3), v(12, 0)], &REQ), 0);
        // 100 - 20 = 80 > 64 and 100 > 1.5 * 20: imbalanced, shortest queue despite the match.
        assert_eq!(sglang(&[v(20, 0), v(100, 10), v(30, 0)], &REQ), 0);
        // 70 - 10 = 60 is not > 64: balanced, the match wins.
        assert_eq!(sglang(&[v(10, 0), v(70, 10)], &REQ), 1);
        // Relative rule: 205 - 140 = 65 > 64 but 205 < 1.5 * 140: balanced, the match wins.
        assert_eq!(sglang(&[v(140, 0), v(205, 10)], &REQ), 1);
        // Least-load ties go to the first worker.
        assert_eq!(sglang(&[v(5, 0), v(5, 0), v(5, 0)], &REQ), 0);
    }

    #[test]
    fn llmd_weighs_queue_kv_and_prefix_two_two_three() {
        let mut rng = StdRng::seed_from_u64(1);
        let p = |queue, kv_usage, prefix| PeerView { queue, kv_usage, learned_in_run: prefix, ..PeerView::default() };
        // Full prefix (3) on a worker with the longest queue (0) and half KV (1) = 4 beats an
        // idle empty worker: queue 2 + kv 2 * 0.9 = 3.8.
        assert_eq!(llmd(&[p(10, 0.5, 10), p(0, 0.1, 0)], &REQ, &mut rng), 0);
        // Half the prefix (1.5) + 0 + 1 = 2.5 loses to 2 + 1.8 = 3.8.
        assert_eq!(llmd(&[p(10, 0.5, 5), p(0, 0.1, 0)], &REQ, &mut rng), 1);
        // Equal queues all score 1; ties are broken at random.
        let seen: BTreeSet<usize> = (0..50).map(|_| llmd(&[p(3, 0.2, 0), p(3, 0.2, 0), p(3, 0.2, 0)], &REQ, &mut rng)).collect();
        assert_eq!(seen.len(), 3);
        // Only the first 256 blocks count: 256 and 1000 matched blocks score alike.
        let long = Request { keys: 1000, tokens: 16000, block_size: 16 };
        let seen: BTreeSet<usize> = (0..50).map(|_| llmd(&[p(0, 0.0, 256), p(0, 0.0, 1000)], &long, &mut rng)).collect();
        assert_eq!(seen.len(), 2);
    }

    #[test]
    fn dynamo_minimises_prefill_plus_decode_blocks() {
        let mut rng = StdRng::seed_from_u64(2);
        // The warm worker's active requests share the prefix it holds.
        let d = |gpu_blocks, prefill_tokens_in_flight, active_blocks| PeerView {
            gpu_blocks,
            prefill_tokens_in_flight,
            active_blocks,
            active_prefix_blocks: u64::from(gpu_blocks),
            ..PeerView::default()
        };
        // Overlap 8 of 10: prefill 2 + decode 20 + 2 = 24 vs cold: 10 + 10 + 10 = 30.
        assert_eq!(dynamo(&[d(8, 0, 20), d(0, 0, 10)], &REQ, &mut rng), 0);
        // Cached by requests that have finished: its blocks are not active, decode 20 + 10.
        let finished = PeerView { active_prefix_blocks: 0, ..d(8, 0, 20) };
        assert_eq!(dynamo(&[finished, d(0, 0, 10)], &REQ, &mut rng), 1);
        // The warm worker's in-flight prefill (160 tokens = 10 blocks) tips it: 34 vs 30.
        assert_eq!(dynamo(&[d(8, 160, 20), d(0, 0, 10)], &REQ, &mut rng), 1);
        // Host-memory hits count 0.75 of a GPU hit.
        let host = PeerView { host_blocks: 8, active_blocks: 20, active_prefix_blocks: 8, ..PeerView::default() };
        let gpu = PeerView { gpu_blocks: 8, active_blocks: 20, active_prefix_blocks: 8, ..PeerView::default() };
        assert_eq!(dynamo(&[host, gpu], &REQ, &mut rng), 1);
    }
}
