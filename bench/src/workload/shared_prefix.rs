//! Shared-prefix groups, the coding-assistant shape: G groups, each with a long shared
//! system prompt (project context) of P tokens, and U users per group asking Q-token
//! questions with O-token answers. All G*U questions are sent once per round in a seeded
//! shuffled order, so groups interleave as they would with real users; more rounds ask new
//! questions. A router that keeps each group on the worker holding its prefix skips P of
//! every P+Q prefill tokens; a random one recomputes the prefix on every worker.

use super::text::{rng_for, Ns};
use super::{Content, PromptMode, Session, Turn, Workload};
use crate::BenchError;
use rand::seq::SliceRandom;

#[derive(Clone, Debug, serde::Serialize)]
pub struct SharedPrefixSpec {
    pub groups: u32,
    pub prefix_tokens: usize,
    pub users: u32,
    pub question_tokens: usize,
    pub output_tokens: u32,
    /// Total requests; default one round (G*U).
    pub requests: Option<usize>,
    pub seed: u64,
    pub mode: PromptMode,
}

pub fn generate(spec: &SharedPrefixSpec) -> Result<Workload, BenchError> {
    if spec.groups == 0 || spec.users == 0 || spec.question_tokens == 0 {
        return Err(BenchError::Workload("shared-prefix needs groups, users and question tokens > 0".into()));
    }
    let per_round = (spec.groups * spec.users) as usize;
    let total = spec.requests.unwrap_or(per_round);
    let mut sessions = Vec::with_capacity(total);
    let mut round = 0u64;
    while sessions.len() < total {
        let mut order: Vec<(u32, u32)> =
            (0..spec.groups).flat_map(|g| (0..spec.users).map(move |u| (g, u))).collect();
        order.shuffle(&mut rng_for(spec.seed, Ns::Order, round));
        for (g, u) in order.into_iter().take(total - sessions.len()) {
            let q_index = round * per_round as u64 + (g * spec.users + u) as u64;
            sessions.push(Session {
                id: sessions.len() as u64,
                at_s: None,
                group: Some(g),
                system: Some(Content::generate(spec.mode, spec.seed, Ns::Prefix, g as u64, spec.prefix_tokens)),
                turns: vec![Turn {
                    user: Content::generate(spec.mode, spec.seed, Ns::Question, q_index, spec.question_tokens),
                    max_tokens: spec.output_tokens,
                }],
            });
        }
        round += 1;
    }
    Ok(Workload { name: "shared_prefix".into(), mode: spec.mode, sessions })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(seed: u64) -> SharedPrefixSpec {
        SharedPrefixSpec {
            groups: 4,
            prefix_tokens: 64,
            users: 3,
            question_tokens: 8,
            output_tokens: 5,
            requests: Some(30),
            seed,
            mode: PromptMode::Tokens,
        }
    }

    #[test]
    fn seed_reproduces_and_differs() {
        let a = generate(&spec(1)).unwrap();
        let b = generate(&spec(1)).unwrap();
        let c = generate(&spec(2)).unwrap();
        assert_eq!(a.sessions, b.sessions);
        assert_ne!(a.sessions, c.sessions);
        assert_eq!(a.num_requests(), 30);
    }

    #[test]
    fn groups_share_prefix_questions_are_unique() {
        let w = generate(&spec(3)).unwrap();
        let mut questions = std::collections::HashSet::new();
        for s in &w.sessions {
            let g = s.group.unwrap();
            let other = w.sessions.iter().find(|o| o.group == Some(g)).unwrap();
            assert_eq!(s.system, other.system);
            assert!(questions.insert(format!("{:?}", s.turns[0].user)));
        }
        let g0 = w.sessions.iter().find(|s| s.group == Some(0)).unwrap();
        let g1 = w.sessions.iter().find(|s| s.group == Some(1)).unwrap();
        assert_ne!(g0.system, g1.system);
        // Every (group, user) pair appears once per round of 12.
        let first_round: std::collections::HashSet<_> = w.sessions[..12].iter().map(|s| s.group).collect();
        assert_eq!(first_round.len(), 4);
    }

    #[test]
    fn chat_mode_makes_text() {
        let mut s = spec(1);
        s.mode = PromptMode::Chat;
        let w = generate(&s).unwrap();
        assert!(matches!(w.sessions[0].system, Some(Content::Text(_))));
        assert_eq!(w.sessions[0].system.as_ref().unwrap().approx_tokens(), 64);
    }
}
