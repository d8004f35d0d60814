//! Multi-turn sessions: each session has its own system prompt of P tokens and T turns of
//! Q-token user messages. Turn k's prompt is the whole conversation so far (system, every
//! earlier user message and answer, the new message), and it is sent only once turn k-1's
//! answer has arrived, so the prefix a router can reuse grows with every turn and lives on
//! whichever worker served the previous turn.

use super::text::Ns;
use super::{Content, PromptMode, Session, Turn, Workload};
use crate::BenchError;

#[derive(Clone, Debug, serde::Serialize)]
pub struct MultiTurnSpec {
    pub sessions: usize,
    pub turns: usize,
    pub system_tokens: usize,
    pub message_tokens: usize,
    pub output_tokens: u32,
    pub seed: u64,
    pub mode: PromptMode,
}

pub fn generate(spec: &MultiTurnSpec) -> Result<Workload, BenchError> {
    if spec.turns == 0 || spec.message_tokens == 0 {
        return Err(BenchError::Workload("multi-turn needs turns and message tokens > 0".into()));
    }
    let sessions = (0..spec.sessions as u64)
        .map(|i| Session {
            id: i,
            at_s: None,
            group: None,
            system: (spec.system_tokens > 0)
                .then(|| Content::generate(spec.mode, spec.seed, Ns::Prefix, i, spec.system_tokens)),
            turns: (0..spec.turns as u64)
                .map(|t| Turn {
                    user: Content::generate(spec.mode, spec.seed, Ns::Question, i * 1_000 + t, spec.message_tokens),
                    max_tokens: spec.output_tokens,
                })
                .collect(),
        })
        .collect();
    Ok(Workload { name: "multi_turn".into(), mode: spec.mode, sessions })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_have_turns_and_reproduce() {
        let spec = MultiTurnSpec {
            sessions: 5,
            turns: 3,
            system_tokens: 16,
            message_tokens: 8,
            output_tokens: 4,
            seed: 1,
            mode: PromptMode::Chat,
        };
        let w = generate(&spec).unwrap();
        assert_eq!(w.num_requests(), 15);
        assert_eq!(w.sessions, generate(&spec).unwrap().sessions);
        assert_ne!(w.sessions[0].system, w.sessions[1].system);
        assert_ne!(w.sessions[0].turns[0], w.sessions[0].turns[1]);
    }
}
