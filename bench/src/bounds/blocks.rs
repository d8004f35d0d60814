//! From a [`Workload`] to the bounds' [`BlockRequest`]s: each turn's prompt exactly as the
//! runner builds it (system, then every earlier message and answer, then the new message),
//! cut into `block_size`-token blocks with chained keys.
//!
//! Answers: a multi-turn prompt carries the previous answers, and the engines cache a
//! request's generated blocks too, so a turn's answer blocks are part of what it leaves
//! behind (uncounted accesses in the bounds). Their content is the runner's seeded
//! stand-in; the server's real answer differs but is equally unique to its conversation,
//! and since keys are chained only the structure matters. A one-turn session's answer
//! appears in no later prompt and is left out.
//!
//! Chat mode: whitespace-separated words stand in for tokens (about one token per word
//! with a BPE tokenizer, no chat template), so those figures are marked approximate.

use super::BlockRequest;
use crate::workload::text::{self, Ns};
use crate::workload::{Content, PromptMode, Workload};
use serde::{Deserialize, Serialize};

/// Whether the bounds' request order is the order the runner will send in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ordering {
    /// Single-turn sessions in their send order (trace timestamps, or the Poisson schedule,
    /// which is monotone in the session index).
    Arrival,
    /// Multi-turn sessions: when turn k+1 goes depends on turn k's latency, so the real
    /// interleaving is unknown in advance; taken session by session, turn after turn.
    Estimated,
}

const ROOT: u64 = 0x6b76_726f_7574_6521;

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Chained keys of the full blocks of `tokens`: key i names block i and every block before.
pub fn chained_keys(tokens: &[u32], block_size: usize) -> Vec<u64> {
    let bs = block_size.max(1);
    let mut parent = ROOT;
    tokens
        .chunks_exact(bs)
        .map(|block| {
            let mut h = 0xcbf2_9ce4_8422_2325u64 ^ parent;
            for &t in block {
                for b in t.to_le_bytes() {
                    h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
                }
            }
            parent = mix(h);
            parent
        })
        .collect()
}

fn word_id(w: &str) -> u32 {
    let mut h = 0x811c_9dc5u32;
    for b in w.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    h
}

fn ids(c: &Content, out: &mut Vec<u32>) {
    match c {
        Content::Tokens(t) => out.extend_from_slice(t),
        Content::Text(s) => out.extend(s.split_whitespace().map(word_id)),
    }
}

/// The workload's requests in send order; also the ordering and whether it is approximate.
pub fn block_requests(workload: &Workload, block_size: usize, seed: u64) -> (Vec<BlockRequest>, Ordering, bool) {
    let bs = block_size.max(1);
    let mut order: Vec<usize> = (0..workload.sessions.len()).collect();
    if workload.is_timed() {
        order.sort_by(|&a, &b| workload.sessions[a].at_s.unwrap_or(0.0).total_cmp(&workload.sessions[b].at_s.unwrap_or(0.0)));
    }
    let mut out = Vec::with_capacity(workload.num_requests());
    for &i in &order {
        let s = &workload.sessions[i];
        let mut stream: Vec<u32> = Vec::new();
        if let Some(sys) = &s.system {
            ids(sys, &mut stream);
        }
        // (prompt length, length through the answer the next prompt carries)
        let mut ends: Vec<(usize, usize)> = Vec::with_capacity(s.turns.len());
        for (k, t) in s.turns.iter().enumerate() {
            ids(&t.user, &mut stream);
            let prompt = stream.len();
            if k + 1 < s.turns.len() {
                let answer = text::tokens(seed, Ns::Answer, s.id * 1_000 + k as u64, t.max_tokens as usize);
                stream.extend_from_slice(&answer);
            }
            ends.push((prompt, stream.len()));
        }
        let keys = chained_keys(&stream, bs);
        for (prompt, cached) in ends {
            if prompt == 0 {
                continue;
            }
            out.push(BlockRequest { prompt_tokens: prompt, blocks: keys[..cached / bs].to_vec(), lookup: (prompt - 1) / bs });
        }
    }
    let multi = workload.sessions.iter().any(|s| s.turns.len() > 1);
    (out, if multi { Ordering::Estimated } else { Ordering::Arrival }, workload.mode == PromptMode::Chat)
}
