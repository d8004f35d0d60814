//! Workloads: what the load generator sends, as seeded, fully materialised data.
//!
//! Everything is a [`Session`]: an optional system prompt (the shared prefix, when there is
//! one) and one or more turns. Single-request workloads are one-turn sessions; multi-turn
//! sessions send turn k+1 only after turn k's answer arrived, carrying the whole history
//! (see [`request`]). Arrival times come from the trace where there is one (`at_s`), else
//! from the runner's arrival process, so the same workload can be replayed at any rate.
//!
//! Invariant: a workload is a pure function of its spec (including the seed); the unit
//! tests pin that, because comparing policies is only fair on identical requests.

pub mod independent;
pub mod multi_turn;
pub mod production;
pub mod request;
pub mod shared_prefix;
pub mod text;
pub mod trace;

use serde::Serialize;

/// How prompts travel: token ids to `/v1/completions`, or chat text to
/// `/v1/chat/completions` (the state service tokenizes text for exact keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum PromptMode {
    Tokens,
    Chat,
}

/// A piece of prompt content in the workload's mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Content {
    Tokens(Vec<u32>),
    Text(String),
}

impl Content {
    /// Content of about `len` tokens from the (seed, ns, index) stream, in `mode`.
    pub fn generate(mode: PromptMode, seed: u64, ns: text::Ns, index: u64, len: usize) -> Content {
        match mode {
            PromptMode::Tokens => Content::Tokens(text::tokens(seed, ns, index, len)),
            PromptMode::Chat => Content::Text(text::words(seed, ns, index, len)),
        }
    }

    /// Length in tokens (token mode) or words (chat mode, ~tokens with a BPE tokenizer).
    pub fn approx_tokens(&self) -> usize {
        match self {
            Content::Tokens(t) => t.len(),
            Content::Text(s) => s.split_whitespace().count(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Turn {
    pub user: Content,
    pub max_tokens: u32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Session {
    pub id: u64,
    /// Arrival offset from the start of the run, seconds (trace replay); `None` lets the
    /// runner's arrival process decide.
    pub at_s: Option<f64>,
    /// Shared-prefix group, for reports.
    pub group: Option<u32>,
    pub system: Option<Content>,
    pub turns: Vec<Turn>,
}

#[derive(Clone, Debug)]
pub struct Workload {
    pub name: String,
    pub mode: PromptMode,
    pub sessions: Vec<Session>,
}

impl Workload {
    pub fn num_requests(&self) -> usize {
        self.sessions.iter().map(|s| s.turns.len()).sum()
    }

    /// Keep at most `max` requests (whole sessions), so a run stays bounded in count.
    pub fn truncate_requests(&mut self, max: usize) {
        let mut total = 0;
        let keep = self
            .sessions
            .iter()
            .take_while(|s| {
                total += s.turns.len();
                total <= max
            })
            .count();
        self.sessions.truncate(keep.max(1).min(self.sessions.len()));
    }

    /// True when every session carries its own arrival time (trace replay).
    pub fn is_timed(&self) -> bool {
        !self.sessions.is_empty() && self.sessions.iter().all(|s| s.at_s.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_turn(id: u64) -> Session {
        Session {
            id,
            at_s: None,
            group: None,
            system: None,
            turns: vec![Turn { user: Content::Tokens(vec![1]), max_tokens: 1 }],
        }
    }

    #[test]
    fn truncate_keeps_whole_sessions() {
        let mut w = Workload { name: "x".into(), mode: PromptMode::Tokens, sessions: (0..10).map(one_turn).collect() };
        w.truncate_requests(4);
        assert_eq!(w.num_requests(), 4);
        assert!(!w.is_timed());
    }
}
