//! One simulated vLLM server with data parallelism: `dp_size` engines (ranks), each a
//! [`Worker`] with its own KV cache, scheduler and KV-event publisher, behind one HTTP
//! endpoint — as `vllm serve --data-parallel-size N` runs them.
//!
//! Which rank serves a request is vLLM's choice, not the router's: its internal DP load
//! balancer (`DPLBAsyncMPClient.get_core_engine_for_request`) picks the engine with the
//! lowest `waiting * 4 + running`, scanning from engine 0 (the start index of a single API
//! server), so ties go to the lowest rank. vLLM reads those counts from the coordinator's
//! stats (every 100 ms) plus its own dispatches; the simulator reads the engines' exact counts,
//! which is what vLLM's counts converge to. A request may pin a rank with vLLM's
//! `X-data-parallel-rank` header (external DP load balancing).
//!
//! With `dp_size == 1` this is exactly the single-engine worker (rank 0).

use crate::engine::EngineConfig;
use crate::ids::WorkerId;
use crate::worker::Worker;
use std::sync::Arc;

/// A request asked for a rank this server does not run.
#[derive(Debug, thiserror::Error)]
#[error("data parallel rank {rank} out of range: this server runs ranks 0..{dp_size}")]
pub struct RankOutOfRange {
    pub rank: u32,
    pub dp_size: usize,
}

/// Cheap-to-clone handle on all ranks of one simulated server.
#[derive(Clone)]
pub struct DpWorker {
    ranks: Arc<[Worker]>,
}

impl DpWorker {
    /// `ranks[r]` must be rank r (its batches carry `data_parallel_rank = r`); at least one.
    pub fn new(ranks: Vec<Worker>) -> DpWorker {
        assert!(!ranks.is_empty(), "a server runs at least one engine");
        debug_assert!(ranks.iter().enumerate().all(|(r, w)| w.dp_rank as usize == r));
        DpWorker { ranks: ranks.into() }
    }

    pub fn id(&self) -> WorkerId {
        self.ranks[0].id
    }

    pub fn model(&self) -> &str {
        &self.ranks[0].model
    }

    pub fn dp_size(&self) -> usize {
        self.ranks.len()
    }

    pub fn ranks(&self) -> &[Worker] {
        &self.ranks
    }

    pub fn rank(&self, rank: u32) -> Result<&Worker, RankOutOfRange> {
        self.ranks.get(rank as usize).ok_or(RankOutOfRange { rank, dp_size: self.ranks.len() })
    }

    /// The engine configuration shared by every rank (limits, block size).
    pub fn config(&self) -> EngineConfig {
        self.ranks[0].inner.lock().engine.config().clone()
    }

    /// The rank vLLM's DP load balancer would give a new request.
    pub fn pick(&self) -> &Worker {
        let loads: Vec<RankLoad> = self
            .ranks
            .iter()
            .map(|w| {
                let inner = w.inner.lock();
                RankLoad { waiting: inner.engine.num_waiting(), running: inner.engine.num_running() }
            })
            .collect();
        &self.ranks[pick_rank(&loads)]
    }

    /// `/reset_prefix_cache` on every rank (vLLM broadcasts it); true if all of them reset.
    pub fn reset_prefix_cache(&self, reset_external: bool) -> bool {
        // Every rank resets (no short-circuit), then all must have.
        let reset: Vec<bool> = self.ranks.iter().map(|w| w.reset_prefix_cache(reset_external)).collect();
        reset.iter().all(|ok| *ok)
    }
}

/// One rank's queue lengths, as vLLM's coordinator reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RankLoad {
    pub waiting: usize,
    pub running: usize,
}

/// vLLM's rule: the first rank (from 0) with the lowest `waiting * 4 + running`.
pub fn pick_rank(loads: &[RankLoad]) -> usize {
    let score = |l: &RankLoad| l.waiting * 4 + l.running;
    // `min_by_key` keeps the first of equal minima, as vLLM's strict `<` scan does.
    loads.iter().enumerate().min_by_key(|(_, l)| score(l)).map_or(0, |(r, _)| r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(waiting: usize, running: usize) -> RankLoad {
        RankLoad { waiting, running }
    }

    #[test]
    fn lowest_weighted_load_wins_ties_go_to_the_lowest_rank() {
        assert_eq!(pick_rank(&[l(0, 0), l(0, 0)]), 0);
        assert_eq!(pick_rank(&[l(1, 0), l(0, 0)]), 1);
        // A waiting request weighs four running ones.
        assert_eq!(pick_rank(&[l(1, 0), l(0, 3)]), 1);
        assert_eq!(pick_rank(&[l(1, 0), l(0, 4)]), 0);
        assert_eq!(pick_rank(&[l(0, 2), l(0, 1), l(0, 1)]), 1);
        assert_eq!(pick_rank(&[l(0, 0)]), 0);
    }

    #[test]
    fn back_to_back_arrivals_alternate_between_idle_ranks() {
        let mut loads = vec![RankLoad::default(); 2];
        let picks: Vec<usize> = (0..4)
            .map(|_| {
                let r = pick_rank(&loads);
                loads[r].waiting += 1;
                r
            })
            .collect();
        assert_eq!(picks, [0, 1, 0, 1]);
    }
}
