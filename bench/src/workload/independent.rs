//! Independent prompts, the control: nothing is shared, so there is no cache to win and a
//! cache-aware router should do exactly as well as least-loaded (it must not be worse).

use super::text::Ns;
use super::{Content, PromptMode, Session, Turn, Workload};
use crate::BenchError;

#[derive(Clone, Debug, serde::Serialize)]
pub struct IndependentSpec {
    pub requests: usize,
    pub input_tokens: usize,
    pub output_tokens: u32,
    pub seed: u64,
    pub mode: PromptMode,
}

pub fn generate(spec: &IndependentSpec) -> Result<Workload, BenchError> {
    if spec.input_tokens == 0 {
        return Err(BenchError::Workload("independent prompts need input tokens > 0".into()));
    }
    let sessions = (0..spec.requests as u64)
        .map(|i| Session {
            id: i,
            at_s: None,
            group: None,
            system: None,
            turns: vec![Turn {
                user: Content::generate(spec.mode, spec.seed, Ns::Independent, i, spec.input_tokens),
                max_tokens: spec.output_tokens,
            }],
        })
        .collect();
    Ok(Workload { name: "independent".into(), mode: spec.mode, sessions })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_are_distinct_and_reproducible() {
        let spec = IndependentSpec { requests: 20, input_tokens: 32, output_tokens: 4, seed: 9, mode: PromptMode::Tokens };
        let a = generate(&spec).unwrap();
        assert_eq!(a.sessions, generate(&spec).unwrap().sessions);
        let firsts: std::collections::HashSet<_> = a
            .sessions
            .iter()
            .map(|s| match &s.turns[0].user {
                Content::Tokens(t) => t[..4].to_vec(),
                Content::Text(_) => unreachable!(),
            })
            .collect();
        assert_eq!(firsts.len(), 20);
    }
}
