//! The one place policies differ: which candidate to take.

use super::{Candidate, PromptView};
use crate::score::{pick_fastest, pick_min, Policy, Scored, Timed};
use crate::state::AppState;
use rand::Rng;
use std::sync::atomic::Ordering;

/// Index into `candidates` (non-empty) of the chosen worker.
pub fn choose(state: &AppState, policy: Policy, candidates: &[Candidate], prompt: &PromptView) -> usize {
    let n = candidates.len();
    let scored: Vec<Scored> = match policy {
        Policy::Random => return state.rng.lock().gen_range(0..n),
        Policy::RoundRobin => return state.round_robin.fetch_add(1, Ordering::Relaxed) % n,
        Policy::LeastLoaded => candidates.iter().map(|c| by_load(c, c.load.outstanding() as f64)).collect(),
        Policy::ApproxPrefix => {
            // Learned routing only, never the KV index: this is the baseline of routers that
            // do not read KV events.
            let learned = state.approx.lock().matches(&prompt.keys);
            candidates.iter().map(|c| by_load(c, -f64::from(learned.get(&c.worker.id).copied().unwrap_or(0)))).collect()
        }
        Policy::Kvroute => {
            let timed: Vec<Timed> = candidates
                .iter()
                .map(|c| Timed { ttft_ms: c.prediction.ttft_ms, matched_blocks: c.matched, load: c.load.outstanding() })
                .collect();
            return pick_fastest(&timed, state.config.affinity_tolerance, &mut *state.rng.lock()).unwrap_or(0);
        }
    };
    pick_min(&scored, &mut *state.rng.lock()).unwrap_or(0)
}

fn by_load(c: &Candidate, score: f64) -> Scored {
    Scored { score, load: c.load.outstanding() }
}
