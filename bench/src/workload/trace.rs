//! Replay of traces in the Mooncake JSONL format: one request per line with `timestamp`
//! (ms from the trace start), `input_length`, `output_length` and `hash_ids`, the ids of the
//! prompt's 512-token blocks (equal ids = identical block content, chained like a prefix).
//!
//! Each hash id becomes a fixed, seeded 512-token block (or 512 words in chat mode), so two
//! requests that share leading hash ids share exactly that token prefix and the trace's
//! real prefix sharing reaches the router. `input_length` trims the last block; a length
//! beyond the listed blocks is padded with request-unique tokens. Arrivals keep the trace's
//! own timestamps, divided by a speed factor.

use super::text::{self, rng_for, Ns};
use super::{Content, PromptMode, Session, Turn, Workload};
use crate::BenchError;
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Tokens per Mooncake hash block.
pub const TRACE_BLOCK: usize = 512;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceRecord {
    /// Milliseconds; written as an integer when whole, like the published traces.
    #[serde(serialize_with = "whole_ms")]
    pub timestamp: f64,
    pub input_length: usize,
    pub output_length: u32,
    pub hash_ids: Vec<u64>,
}

fn whole_ms<S: serde::Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        s.serialize_i64(*v as i64)
    } else {
        s.serialize_f64(*v)
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct ReplaySpec {
    /// Trace time is divided by this (2.0 = twice as fast).
    pub speed: f64,
    /// Prompts longer than this are cut (keeps them inside the workers' context).
    pub max_input_tokens: usize,
    pub max_output_tokens: u32,
    pub seed: u64,
    pub mode: PromptMode,
}

pub fn parse(text: &str, path: &Path) -> Result<Vec<TraceRecord>, BenchError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let r: TraceRecord = serde_json::from_str(line)
            .map_err(|e| BenchError::Trace { path: path.to_path_buf(), line: i + 1, message: e.to_string() })?;
        if !r.timestamp.is_finite() || r.timestamp < 0.0 || r.input_length == 0 {
            let message = "timestamp must be >= 0 and input_length > 0".to_string();
            return Err(BenchError::Trace { path: path.to_path_buf(), line: i + 1, message });
        }
        out.push(r);
    }
    Ok(out)
}

pub fn load(path: &Path) -> Result<Vec<TraceRecord>, BenchError> {
    let text = std::fs::read_to_string(path).map_err(|source| BenchError::Io { path: path.to_path_buf(), source })?;
    parse(&text, path)
}

/// The prompt of one record: its hash blocks' content, trimmed or padded to `input_length`.
pub fn prompt(rec: &TraceRecord, index: u64, spec: &ReplaySpec) -> Content {
    let want = rec.input_length.min(spec.max_input_tokens);
    let blocks = rec.hash_ids.iter().map(|&h| Content::generate(spec.mode, spec.seed, Ns::TraceBlock, h, TRACE_BLOCK));
    let tail_len = want.saturating_sub(rec.hash_ids.len() * TRACE_BLOCK);
    let tail = Content::generate(spec.mode, spec.seed, Ns::TraceTail, index, tail_len);
    match spec.mode {
        PromptMode::Tokens => {
            let mut ids: Vec<u32> = blocks.chain([tail]).flat_map(|c| match c {
                Content::Tokens(t) => t,
                Content::Text(_) => Vec::new(),
            }).collect();
            ids.truncate(want);
            Content::Tokens(ids)
        }
        PromptMode::Chat => {
            let all: String = blocks.chain([tail]).map(|c| match c {
                Content::Text(s) => s,
                Content::Tokens(_) => String::new(),
            }).collect();
            Content::Text(all.split_inclusive(' ').skip(1).take(want).fold(String::from(" "), |acc, w| acc + w))
        }
    }
}

pub fn to_workload(records: &[TraceRecord], spec: &ReplaySpec) -> Result<Workload, BenchError> {
    if !(spec.speed > 0.0) {
        return Err(BenchError::Workload("trace speed must be > 0".into()));
    }
    let t0 = records.iter().map(|r| r.timestamp).fold(f64::INFINITY, f64::min);
    let sessions = records
        .iter()
        .enumerate()
        .map(|(i, r)| Session {
            id: i as u64,
            at_s: Some((r.timestamp - t0) / 1000.0 / spec.speed),
            group: r.hash_ids.first().map(|&h| h as u32),
            system: None,
            turns: vec![Turn {
                user: prompt(r, i as u64, spec),
                max_tokens: r.output_length.clamp(1, spec.max_output_tokens),
            }],
        })
        .collect();
    Ok(Workload { name: "trace".into(), mode: spec.mode, sessions })
}

/// Parameters of the synthetic sample trace shipped in bench/traces/.
#[derive(Clone, Debug)]
pub struct SynthSpec {
    pub requests: usize,
    pub rate_per_s: f64,
    /// Distinct shared roots (system prompts / documents), 2..=8 blocks each.
    pub roots: u64,
    pub seed: u64,
}

/// A Mooncake-shaped trace: each request extends one of a few shared roots (popularity
/// skewed toward low root ids), sometimes continues an earlier request's conversation (its
/// whole hash chain plus new blocks), and ends with request-unique blocks.
pub fn synthesize(spec: &SynthSpec) -> Vec<TraceRecord> {
    let mut rng = rng_for(spec.seed, Ns::Order, 0);
    let root_len = |r: u64| 2 + (r % 7) as usize;
    let mut next_id = spec.roots * 8;
    let mut t_ms = 0.0;
    let mut out: Vec<TraceRecord> = Vec::with_capacity(spec.requests);
    for _ in 0..spec.requests {
        t_ms += -(1.0 - rng.gen::<f64>()).ln() / spec.rate_per_s * 1000.0;
        let mut ids: Vec<u64> = if !out.is_empty() && rng.gen_bool(0.3) {
            out[rng.gen_range(out.len().saturating_sub(20)..out.len())].hash_ids.clone()
        } else {
            let r = ((rng.gen::<f64>().powi(2)) * spec.roots as f64) as u64;
            (0..root_len(r) as u64).map(|b| r * 8 + b).collect()
        };
        for _ in 0..rng.gen_range(1..=3) {
            ids.push(next_id);
            next_id += 1;
        }
        let input_length = (ids.len() - 1) * TRACE_BLOCK + rng.gen_range(1..=TRACE_BLOCK);
        let output_length = rng.gen_range(16..=256);
        out.push(TraceRecord { timestamp: t_ms.round(), input_length, output_length, hash_ids: ids });
    }
    out
}

/// `text::tokens` re-export for tests of block identity.
pub fn block_tokens(seed: u64, hash_id: u64) -> Vec<u32> {
    text::tokens(seed, Ns::TraceBlock, hash_id, TRACE_BLOCK)
}

#[cfg(test)]
mod tests;
